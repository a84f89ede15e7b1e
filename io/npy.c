/* SPDX-License-Identifier: MIT
 *
 * NumPy .npy reading and atomic writing (see npy.h for the contract). The
 * header is an untrusted Python dict literal: it is parsed by a small strict
 * parser that accepts exactly the three keys NumPy writes, with a length cap
 * checked before anything is allocated, and the file size is checked against
 * the shape before any data is read. Data moves with pread/pwrite at element
 * offsets in bounded chunks; float16 converts on the fly. This file assumes a
 * little-endian host (every target of dt is one).
 *
 * Not here: memory-mapping, other dtypes, byte swapping.
 */
#include "config.h"

#include <fcntl.h>
#include <inttypes.h>
#include <limits.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "common/fileio.h"
#include "common/half.h"
#include "common/mem.h"
#include "common/text.h"
#include "npy.h"

_Static_assert(__BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__,
               "npy.c stores float32 and int64 as they lie in memory");

#define MAGIC "\x93NUMPY"
#define MAGIC_LEN 6
#define HEADER_MAX (1 << 20) /* refuse larger headers before allocating */
#define ALIGN 64             /* data starts at a multiple of this */
#define CHUNK_BYTES (256 * 1024)

/*-- dtypes ---------------------------------------------------------------*/

const char *dt_npy_dtype_name(dt_dtype_t t)
{
    switch (t) {
    case DT_F32:
        return "float32";
    case DT_F16:
        return "float16";
    case DT_I64:
        return "int64";
    case DT_I32:
        return "int32";
    case DT_F64:
        return "float64";
    case DT_U8:
        return "uint8";
    case DT_BOOL:
        return "bool";
    case DT_BF16: /* not a .npy type of dt's */
        break;
    }
    return "unknown";
}

size_t dt_npy_dtype_size(dt_dtype_t t)
{
    switch (t) {
    case DT_F32:
        return 4;
    case DT_F16:
        return 2;
    case DT_I64:
        return 8;
    case DT_I32:
        return 4;
    case DT_F64:
        return 8;
    case DT_U8: case DT_BOOL:
        return 1;
    case DT_BF16: /* not a .npy type of dt's */
        break;
    }
    return 0;
}

static const char *dtype_descr(dt_dtype_t t)
{
    switch (t) {
    case DT_F32:
        return "<f4";
    case DT_F16:
        return "<f2";
    case DT_I64:
        return "<i8";
    case DT_I32:
        return "<i4";
    case DT_F64:
        return "<f8";
    case DT_U8:
        return "|u1";
    case DT_BOOL:
        return "|b1";
    case DT_BF16: /* not a .npy type of dt's */
        break;
    }
    return NULL;
}

/*-- file helpers ---------------------------------------------------------*/

static uint32_t le16(const unsigned char *p)
{
    return (uint32_t)p[0] | (uint32_t)p[1] << 8;
}

static uint32_t le32(const unsigned char *p)
{
    return le16(p) | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24;
}

/* Open PATH for reading with a message on failure. */
/*-- header parsing -------------------------------------------------------*/

/* A cursor over the header text. Errors name the byte offset inside the
 * header dict so a broken file can be inspected with a hex dump. */
typedef struct {
    const char *s, *p, *e;
    const char *path;
    dt_emsg_t *em;
} cursor_t;

static void skip_ws(cursor_t *c)
{
    while (c->p < c->e && (*c->p == ' ' || *c->p == '\t' || *c->p == '\n' || *c->p == '\r'))
        c->p++;
}

/* Describe the character at the cursor for an error message. */
static const char *near(const cursor_t *c, char buf[16])
{
    unsigned char ch;

    if (c->p >= c->e)
        return "end of header";
    ch = (unsigned char)*c->p;
    if (ch >= 0x20 && ch < 0x7f)
        snprintf(buf, 16, "'%c'", ch);
    else
        snprintf(buf, 16, "byte 0x%02x", ch);
    return buf;
}

static int expected(cursor_t *c, const char *what)
{
    char buf[16];

    return dt_emsg_set(c->em, DT_EFORMAT,
                       "%s: malformed header: expected %s at offset %td, found %s", c->path,
                       what, c->p - c->s, near(c, buf));
}

/* A quoted string without escapes, copied into out (NUL-terminated). */
static int parse_str(cursor_t *c, char *out, size_t outsz, const char *what)
{
    char q;
    size_t n = 0;

    if (c->p >= c->e || (*c->p != '\'' && *c->p != '"'))
        return expected(c, what);
    q = *c->p++;
    while (c->p < c->e && *c->p != q) {
        unsigned char ch = (unsigned char)*c->p;
        if (ch == '\\' || ch < 0x20 || ch >= 0x7f)
            return expected(c, "a plain string character");
        if (n + 1 >= outsz)
            return dt_emsg_set(c->em, DT_EFORMAT,
                               "%s: malformed header: string at offset %td is too long",
                               c->path, c->p - c->s);
        out[n++] = *c->p++;
    }
    if (c->p >= c->e)
        return expected(c, "a closing quote");
    c->p++;
    out[n] = '\0';
    return 0;
}

static int parse_bool(cursor_t *c, bool *out)
{
    size_t left = (size_t)(c->e - c->p);

    if (left >= 4 && memcmp(c->p, "True", 4) == 0) {
        *out = true;
        c->p += 4;
    } else if (left >= 5 && memcmp(c->p, "False", 5) == 0) {
        *out = false;
        c->p += 5;
    } else {
        return expected(c, "True or False for 'fortran_order'");
    }
    return 0;
}

/* A Python tuple of non-negative ints: "()", "(3,)", "(2, 3)", "(2, 3,)".
 * "(3)" is an int in Python, not a tuple, and is refused. */
static int parse_shape(cursor_t *c, dt_npy_info_t *info)
{
    bool comma = false;

    if (c->p >= c->e || *c->p != '(') {
        char buf[16];
        return dt_emsg_set(c->em, DT_EFORMAT,
                           "%s: malformed header: 'shape' is not a tuple (found %s at offset %td)",
                           c->path, near(c, buf), c->p - c->s);
    }
    c->p++;
    info->ndim = 0;
    for (;;) {
        int64_t v = 0;

        skip_ws(c);
        if (c->p < c->e && *c->p == ')')
            break;
        if (info->ndim > 0 && !comma)
            return expected(c, "',' or ')' in 'shape'");
        if (c->p < c->e && *c->p == '-')
            return dt_emsg_set(c->em, DT_EFORMAT,
                               "%s: malformed header: negative dimension in 'shape' at offset %td",
                               c->path, c->p - c->s);
        if (c->p >= c->e || *c->p < '0' || *c->p > '9')
            return expected(c, "a dimension in 'shape'");
        while (c->p < c->e && *c->p >= '0' && *c->p <= '9') {
            int d = *c->p - '0';
            if (v > (INT64_MAX - d) / 10)
                return dt_emsg_set(c->em, DT_EFORMAT,
                                   "%s: malformed header: dimension at offset %td is too large",
                                   c->path, c->p - c->s);
            v = v * 10 + d;
            c->p++;
        }
        if (c->p < c->e && *c->p == 'L') /* Python 2 long, written by old NumPy */
            c->p++;
        if (info->ndim == DT_NPY_MAXDIM)
            return dt_emsg_set(c->em, DT_EFORMAT,
                               "%s: 'shape' has more than %d dimensions", c->path,
                               DT_NPY_MAXDIM);
        info->shape[info->ndim++] = v;
        skip_ws(c);
        comma = c->p < c->e && *c->p == ',';
        if (comma)
            c->p++;
    }
    if (info->ndim == 1 && !comma)
        return dt_emsg_set(c->em, DT_EFORMAT,
                           "%s: malformed header: 'shape' (%" PRId64
                           ") is not a tuple (a 1-D shape is written (%" PRId64 ",))",
                           c->path, info->shape[0], info->shape[0]);
    c->p++;
    return 0;
}

/* Parse the dict text of a header into info (dtype, ndim, shape, count). */
static int parse_dict(const char *path, const char *text, size_t len, dt_npy_info_t *info,
                      dt_emsg_t *em)
{
    cursor_t c = { text, text, text + len, path, em };
    char descr[32] = "", key[32];
    bool fortran = false, have_descr = false, have_fortran = false, have_shape = false;
    int rc;

    skip_ws(&c);
    if (c.p >= c.e || *c.p != '{')
        return expected(&c, "'{'");
    c.p++;
    for (;;) {
        const char *kp;

        skip_ws(&c);
        if (c.p < c.e && *c.p == '}')
            break;
        kp = c.p;
        if ((rc = parse_str(&c, key, sizeof(key), "a quoted key or '}'")) < 0)
            return rc;
        skip_ws(&c);
        if (c.p >= c.e || *c.p != ':')
            return expected(&c, "':'");
        c.p++;
        skip_ws(&c);
        if (strcmp(key, "descr") == 0 && !have_descr) {
            if (c.p < c.e && *c.p == '[')
                return dt_emsg_set(em, DT_EDTYPE,
                                   "%s: structured dtypes are not supported "
                                   "(float32, float16, int32 or int64)",
                                   path);
            if ((rc = parse_str(&c, descr, sizeof(descr), "a dtype string for 'descr'")) < 0)
                return rc;
            have_descr = true;
        } else if (strcmp(key, "fortran_order") == 0 && !have_fortran) {
            if ((rc = parse_bool(&c, &fortran)) < 0)
                return rc;
            have_fortran = true;
        } else if (strcmp(key, "shape") == 0 && !have_shape) {
            if ((rc = parse_shape(&c, info)) < 0)
                return rc;
            have_shape = true;
        } else if (strcmp(key, "descr") == 0 || strcmp(key, "fortran_order") == 0 ||
                   strcmp(key, "shape") == 0) {
            return dt_emsg_set(em, DT_EFORMAT,
                               "%s: malformed header: duplicate key '%s' at offset %td", path,
                               key, kp - c.s);
        } else {
            return dt_emsg_set(em, DT_EFORMAT,
                               "%s: malformed header: unexpected key '%s' at offset %td", path,
                               key, kp - c.s);
        }
        skip_ws(&c);
        if (c.p < c.e && *c.p == ',') {
            c.p++;
            continue;
        }
        if (c.p < c.e && *c.p == '}')
            break;
        return expected(&c, "',' or '}'");
    }
    c.p++;
    skip_ws(&c);
    if (c.p != c.e)
        return expected(&c, "only padding after the dict");
    if (!have_descr || !have_fortran || !have_shape)
        return dt_emsg_set(em, DT_EFORMAT, "%s: malformed header: no '%s' key", path,
                           !have_descr ? "descr" : !have_fortran ? "fortran_order" : "shape");

    /* The header is well formed; now what it describes must be supported. */
    if (strcmp(descr, "<f4") == 0)
        info->dtype = DT_F32;
    else if (strcmp(descr, "<f2") == 0)
        info->dtype = DT_F16;
    else if (strcmp(descr, "<i8") == 0)
        info->dtype = DT_I64;
    else if (strcmp(descr, "<i4") == 0)
        info->dtype = DT_I32;
    else if (strcmp(descr, "<f8") == 0)
        info->dtype = DT_F64;
    else if (strcmp(descr, "|u1") == 0)
        info->dtype = DT_U8;
    else if (strcmp(descr, "|b1") == 0)
        info->dtype = DT_BOOL;
    else if (descr[0] == '>')
        return dt_emsg_set(em, DT_EDTYPE,
                           "%s: dtype '%s' is big-endian, only little-endian is supported",
                           path, descr);
    else
        return dt_emsg_set(em, DT_EDTYPE,
                           "%s: dtype '%s' is not supported (float32, float16, float64, int32, "
                           "int64, uint8 or bool)",
                           path, descr);
    if (fortran)
        return dt_emsg_set(em, DT_EDTYPE,
                           "%s: Fortran order is not supported (C order only)", path);
    return 0;
}

/* count = product of shape, checked so that count * itemsize bytes after
 * data_offset fit in an off_t; err is the code for a shape too large. */
static int shape_count(const char *path, int ndim, const int64_t *shape, size_t itemsize,
                       int64_t data_offset, int err, int64_t *count, dt_emsg_t *em)
{
    int64_t n = 1, limit = (INT64_MAX - data_offset) / (int64_t)itemsize;
    bool zero = false;

    for (int i = 0; i < ndim; i++) {
        if (shape[i] < 0)
            return dt_emsg_set(em, DT_EINVAL, "%s: negative dimension %" PRId64, path,
                               shape[i]);
        if (shape[i] == 0)
            zero = true;
        else if (n > limit / shape[i])
            return dt_emsg_set(em, err, "%s: shape is too large for a file", path);
        else
            n *= shape[i];
    }
    *count = zero ? 0 : n;
    return 0;
}

/* The fixed part of a header: magic, version, header length. pre holds
 * the first got bytes (at most 12) of a file of file_size bytes. */
static int parse_pre(const char *path, const unsigned char *pre, int64_t got, int64_t file_size,
                     size_t *prelen, int64_t *hlen, dt_emsg_t *em)
{
    if (got == 0)
        return dt_emsg_set(em, DT_EFORMAT, "%s: not a .npy file (it is empty)", path);
    if (memcmp(pre, MAGIC, got < MAGIC_LEN ? (size_t)got : MAGIC_LEN) != 0)
        return dt_emsg_set(em, DT_EFORMAT, "%s: not a .npy file (bad magic)", path);
    if (got < 8)
        return dt_emsg_set(em, DT_EFORMAT, "%s: header is truncated (file has %" PRId64 " bytes)",
                           path, got);
    if (pre[7] != 0 || pre[6] < 1 || pre[6] > 3)
        return dt_emsg_set(em, DT_EFORMAT,
                           "%s: .npy format version %u.%u is not supported (1.0, 2.0 or 3.0)",
                           path, pre[6], pre[7]);
    *prelen = pre[6] == 1 ? 10 : 12;
    if (got < (int64_t)*prelen)
        return dt_emsg_set(em, DT_EFORMAT, "%s: header is truncated (file has %" PRId64 " bytes)",
                           path, got);
    *hlen = pre[6] == 1 ? (int64_t)le16(pre + 8) : (int64_t)le32(pre + 8);
    if (*hlen > HEADER_MAX)
        return dt_emsg_set(em, DT_EFORMAT,
                           "%s: header length %" PRId64 " exceeds the limit of %d bytes", path,
                           *hlen, HEADER_MAX);
    /* both at most 2^20 + 12: no overflow */
    if (file_size < (int64_t)*prelen + *hlen)
        return dt_emsg_set(em, DT_EFORMAT,
                           "%s: header is truncated (header needs %" PRId64
                           " bytes, file has %" PRId64 ")",
                           path, (int64_t)*prelen + *hlen, file_size);
    return 0;
}

/* The dict (hlen bytes of text after prelen bytes) and what it says about
 * the data against the file's size, which must be exactly the header and
 * the data: trailing bytes are refused (a file that is not what its header
 * says, or a concatenation of two). */
static int parse_rest(const char *path, const char *text, int64_t hlen, size_t prelen,
                      int64_t file_size, dt_npy_info_t *info, dt_emsg_t *em)
{
    int64_t need, bytes;
    int rc;

    if ((rc = parse_dict(path, text, (size_t)hlen, info, em)) < 0)
        return rc;
    info->data_offset = prelen + (size_t)hlen;
    /* count * itemsize + data_offset <= INT64_MAX, checked by shape_count */
    if ((rc = shape_count(path, info->ndim, info->shape, dt_npy_dtype_size(info->dtype),
                          (int64_t)info->data_offset, DT_EFORMAT, &info->count, em)) < 0)
        return rc;
    bytes = info->count * (int64_t)dt_npy_dtype_size(info->dtype);
    need = (int64_t)info->data_offset + bytes;
    if (file_size != need) {
        char shp[256];
        dt_text_shape(shp, sizeof(shp), info->ndim, info->shape, DT_SHAPE_TUPLE);
        if (file_size < need)
            return dt_emsg_set(em, DT_EFORMAT,
                               "%s: data is truncated: shape %s %s needs %" PRId64
                               " bytes from offset %zu, the file has %" PRId64,
                               path, shp, dt_npy_dtype_name(info->dtype), bytes, info->data_offset,
                               file_size - (int64_t)info->data_offset);
        return dt_emsg_set(em, DT_EFORMAT,
                           "%s: %" PRId64 " bytes after the data: shape %s %s is %" PRId64
                           " bytes from offset %zu, the file has %" PRId64,
                           path, file_size - need, shp, dt_npy_dtype_name(info->dtype), bytes,
                           info->data_offset, file_size - (int64_t)info->data_offset);
    }
    return 0;
}

int dt_npy_header_len(const char *name, const void *head, size_t n, int64_t file_size,
                      size_t *len, dt_emsg_t *em)
{
    size_t prelen = 0;
    int64_t hlen = 0;
    int rc;

    *len = 0;
    if (file_size < 0)
        file_size = 0;
    if (n > INT64_MAX || (int64_t)n > file_size) /* bytes past the end do not exist */
        n = (size_t)file_size;
    if ((rc = parse_pre(name, head, n < 12 ? (int64_t)n : 12, file_size, &prelen, &hlen, em)) < 0)
        return rc;
    *len = prelen + (size_t)hlen;
    return 0;
}

int dt_npy_parse_head(const char *name, const void *head, size_t n, int64_t file_size,
                      dt_npy_info_t *info, dt_emsg_t *em)
{
    const unsigned char *p = head;
    size_t prelen = 0;
    int64_t hlen = 0;
    char *text;
    int rc;

    memset(info, 0, sizeof(*info));
    if (file_size < 0)
        file_size = 0;
    if (n > INT64_MAX || (int64_t)n > file_size) /* bytes past the end do not exist */
        n = (size_t)file_size;
    if ((rc = parse_pre(name, p, n < 12 ? (int64_t)n : 12, file_size, &prelen, &hlen, em)) < 0)
        return rc;
    /* parse_pre checked that the file holds the header; the caller must
     * have passed all of it (dt_npy_header_len says how much that is) */
    if ((int64_t)n < (int64_t)prelen + hlen)
        return dt_emsg_set(em, DT_EFORMAT,
                           "%s: header is truncated (it needs %" PRId64 " bytes, %zu were read)",
                           name, (int64_t)prelen + hlen, n);
    /* a copy of exactly hlen bytes: what the file reader parses, and what
     * a fuzzer's bounds checks see */
    text = dt_xmalloc((size_t)hlen + 1);
    memcpy(text, p + prelen, (size_t)hlen);
    text[hlen] = '\0';
    rc = parse_rest(name, text, hlen, prelen, file_size, info, em);
    free(text);
    if (rc < 0)
        memset(info, 0, sizeof(*info));
    return rc;
}

int dt_npy_parse_header(const char *name, const void *file, size_t n, dt_npy_info_t *info,
                        dt_emsg_t *em)
{
    if (n > INT64_MAX) {
        memset(info, 0, sizeof(*info));
        return dt_emsg_set(em, DT_EFORMAT, "%s: too large", name);
    }
    return dt_npy_parse_head(name, file, n, (int64_t)n, info, em);
}

int dt_npy_read_header(const char *path, dt_npy_info_t *info, dt_emsg_t *em)
{
    unsigned char pre[12];
    int64_t st_size = 0;
    char *text = NULL;
    int64_t got, hlen = 0;
    size_t prelen = 0;
    int fd, rc;

    memset(info, 0, sizeof(*info));
    if ((fd = dt_open_regular(path, &st_size, em)) < 0)
        return fd;
    if ((got = dt_pread_full(fd, pre, sizeof(pre), 0)) < 0) {
        rc = dt_emsg_set(em, (int)got, "%s: cannot read: %s", path, dt_strerror((int)got));
        goto out;
    }
    if ((rc = parse_pre(path, pre, got, st_size, &prelen, &hlen, em)) < 0)
        goto out;
    text = dt_xmalloc((size_t)hlen + 1);
    if ((got = dt_pread_full(fd, text, (size_t)hlen, (int64_t)prelen)) < 0) {
        rc = dt_emsg_set(em, (int)got, "%s: cannot read: %s", path, dt_strerror((int)got));
        goto out;
    }
    if (got < hlen) {
        rc = dt_emsg_set(em, DT_EFORMAT, "%s: header is truncated", path);
        goto out;
    }
    text[hlen] = '\0';
    rc = parse_rest(path, text, hlen, prelen, st_size, info, em);
out:
    if (rc < 0)
        memset(info, 0, sizeof(*info));
    free(text);
    close(fd);
    return rc;
}

/*-- reading data ---------------------------------------------------------*/

/* Read n bytes at off into buf; a short read means the file shrank. */
static int read_data(const char *path, int fd, void *buf, size_t n, int64_t off, dt_emsg_t *em)
{
    int64_t got = dt_pread_full(fd, buf, n, off);

    if (got < 0)
        return dt_emsg_set(em, (int)got, "%s: cannot read: %s", path, dt_strerror((int)got));
    if ((size_t)got < n)
        return dt_emsg_set(em, DT_EFORMAT,
                           "%s: data is truncated: %zu bytes at offset %" PRId64
                           " but the file ends before them",
                           path, n, off);
    return 0;
}

int dt_npy_read_f32(const char *path, const dt_npy_info_t *info, int64_t first, int64_t count,
                    float *dst, dt_emsg_t *em)
{
    int64_t off;
    int fd, rc = 0;

    if (info->dtype != DT_F32 && info->dtype != DT_F16 && info->dtype != DT_F64)
        return dt_emsg_set(em, DT_EDTYPE, "%s: dtype is %s, expected float32, float16 or "
                           "float64", path, dt_npy_dtype_name(info->dtype));
    if (first < 0 || count < 0 || first > info->count || count > info->count - first)
        return dt_emsg_set(em, DT_EINVAL,
                           "%s: elements [%" PRId64 ", %" PRId64 ") are outside [0, %" PRId64
                           ")",
                           path, first, first + count, info->count);
    if (count == 0)
        return 0;
    if ((fd = dt_open_regular(path, NULL, em)) < 0)
        return fd;
    off = (int64_t)info->data_offset + first * (int64_t)dt_npy_dtype_size(info->dtype);
    if (info->dtype == DT_F32) {
        rc = read_data(path, fd, dst, (size_t)count * sizeof(float), off, em);
    } else if (info->dtype == DT_F64) {
        size_t per = CHUNK_BYTES / 8;
        double *buf = dt_xmalloc(CHUNK_BYTES);

        for (int64_t i = 0; i < count && rc == 0; i += (int64_t)per) {
            size_t n = (size_t)(count - i) < per ? (size_t)(count - i) : per;
            rc = read_data(path, fd, buf, n * 8, off + i * 8, em);
            for (size_t j = 0; j < n && rc == 0; j++)
                dst[i + (int64_t)j] = (float)buf[j]; /* little-endian host, as the file */
        }
        free(buf);
    } else {
        size_t per = CHUNK_BYTES / 2;
        unsigned char *buf = dt_xmalloc(CHUNK_BYTES);

        for (int64_t i = 0; i < count && rc == 0; i += (int64_t)per) {
            size_t n = (size_t)(count - i) < per ? (size_t)(count - i) : per;
            rc = read_data(path, fd, buf, n * 2, off + i * 2, em);
            for (size_t j = 0; j < n && rc == 0; j++)
                dst[i + (int64_t)j] = dt_f16_to_f32((uint16_t)le16(buf + 2 * j));
        }
        free(buf);
    }
    close(fd);
    return rc;
}

int dt_npy_read_i64(const char *path, const dt_npy_info_t *info, int64_t *dst, dt_emsg_t *em)
{
    int fd, rc = 0;

    if (info->dtype != DT_I64)
        return dt_emsg_set(em, DT_EDTYPE, "%s: dtype is %s, expected int64", path,
                           dt_npy_dtype_name(info->dtype));
    if (info->count == 0)
        return 0;
    if ((fd = dt_open_regular(path, NULL, em)) < 0)
        return fd;
    rc = read_data(path, fd, dst, (size_t)info->count * sizeof(int64_t),
                   (int64_t)info->data_offset, em);
    close(fd);
    return rc;
}

/* the whole data of a file, bytes long, into dst */
static int read_all(const char *path, const dt_npy_info_t *info, void *dst, size_t bytes,
                    dt_emsg_t *em)
{
    if (bytes == 0)
        return 0;
    int fd = dt_open_regular(path, NULL, em);
    if (fd < 0)
        return fd;
    int rc = read_data(path, fd, dst, bytes, (int64_t)info->data_offset, em);
    close(fd);
    return rc;
}

int dt_npy_read_ints(const char *path, const dt_npy_info_t *info, int64_t *dst, dt_emsg_t *em)
{
    if (info->dtype == DT_I64)
        return dt_npy_read_i64(path, info, dst, em);
    if (info->dtype != DT_I32)
        return dt_emsg_set(em, DT_EDTYPE, "%s: dtype is %s, expected int32 or int64", path,
                           dt_npy_dtype_name(info->dtype));
    /* read into the upper half of dst, widen forwards */
    int32_t *tmp = (int32_t *)(dst + info->count) - info->count;
    int rc = read_all(path, info, tmp, (size_t)info->count * sizeof(int32_t), em);
    if (rc < 0)
        return rc;
    for (int64_t i = 0; i < info->count; i++) {
        int32_t x;
        memcpy(&x, tmp + i, sizeof(x));
        dst[i] = x;
    }
    return 0;
}

int dt_npy_read_bytes(const char *path, const dt_npy_info_t *info, uint8_t *dst, dt_emsg_t *em)
{
    if (info->dtype != DT_U8 && info->dtype != DT_BOOL)
        return dt_emsg_set(em, DT_EDTYPE, "%s: dtype is %s, expected bool or uint8", path,
                           dt_npy_dtype_name(info->dtype));
    int rc = read_all(path, info, dst, (size_t)info->count, em);
    if (rc < 0)
        return rc;
    for (int64_t i = 0; i < info->count && info->dtype == DT_BOOL; i++)
        if (dst[i] > 1)
            return dt_emsg_set(em, DT_EFORMAT, "%s: element %lld of a bool array is %u", path,
                               (long long)i, dst[i]);
    return 0;
}

/*-- atomic writer --------------------------------------------------------*/

struct dt_npy_writer {
    dt_atomic_t af; /* the temp file (common/fileio.h) */
    dt_dtype_t dtype;
    int64_t count;
    int64_t data_offset;
    int failed; /* first pwrite error: commit refuses to publish the file */
    char *path;
};

static void writer_free(dt_npy_writer_t *w)
{
    free(w->path);
    free(w);
}

/* Build the header: magic, version, length, dict, spaces, '\n', so that the
 * data starts at a multiple of ALIGN. Returns its length (<= sz). */
static size_t build_header(dt_dtype_t dtype, int ndim, const int64_t *shape, char *out,
                           size_t sz)
{
    char shp[256], dict[384];
    size_t dlen, prelen, total, hlen;
    int major;

    dt_text_shape(shp, sizeof(shp), ndim, shape, DT_SHAPE_TUPLE);
    dlen = (size_t)snprintf(dict, sizeof(dict),
                            "{'descr': '%s', 'fortran_order': False, 'shape': %s, }",
                            dtype_descr(dtype), shp);
    /* Version 2.0 only when the header does not fit a 16-bit length. */
    major = dlen + 1 + 10 + ALIGN > 65535 ? 2 : 1;
    prelen = major == 1 ? 10 : 12;
    total = (prelen + dlen + 1 + ALIGN - 1) / ALIGN * ALIGN;
    hlen = total - prelen;
    if (total > sz)
        return 0;
    memcpy(out, MAGIC, MAGIC_LEN);
    out[6] = (char)major;
    out[7] = 0;
    for (size_t i = 0; i < prelen - 8; i++)
        out[8 + i] = (char)((hlen >> (8 * i)) & 0xff);
    memcpy(out + prelen, dict, dlen);
    memset(out + prelen + dlen, ' ', hlen - dlen - 1);
    out[total - 1] = '\n';
    return total;
}

int dt_npy_writer_open(const char *path, dt_dtype_t dtype, int ndim, const int64_t *shape,
                       dt_npy_writer_t **out, dt_emsg_t *em)
{
    dt_npy_writer_t *w;
    char hdr[1024];
    const char *slash, *base;
    size_t hlen;
    int64_t size;
    int rc;

    *out = NULL;
    if (dtype_descr(dtype) == NULL)
        return dt_emsg_set(em, DT_EDTYPE, "%s: cannot write dtype %d", path, (int)dtype);
    if (ndim < 0 || ndim > DT_NPY_MAXDIM)
        return dt_emsg_set(em, DT_EINVAL, "%s: %d dimensions (0 to %d are supported)", path,
                           ndim, DT_NPY_MAXDIM);
    slash = strrchr(path, '/');
    base = slash ? slash + 1 : path;
    if (*base == '\0')
        return dt_emsg_set(em, DT_EINVAL, "%s: not a file name", path);
    hlen = build_header(dtype, ndim, shape, hdr, sizeof(hdr));
    if (hlen == 0)
        return dt_emsg_set(em, DT_EINVAL, "%s: header does not fit", path);

    w = dt_xcalloc(1, sizeof(*w));
    w->af.fd = -1;
    w->dtype = dtype;
    w->data_offset = (int64_t)hlen;
    w->path = dt_xstrdup(path);
    if ((rc = shape_count(path, ndim, shape, dt_npy_dtype_size(dtype), w->data_offset, DT_EINVAL,
                          &w->count, em)) < 0)
        goto fail;

    /* 0600: outputs are the job owner's alone */
    if ((rc = dt_atomic_open(&w->af, path, 0600, 0, em)) < 0)
        goto fail;
    /* Size the file now: elements never written read as zero, and a shape
     * the file system cannot hold fails here rather than halfway. */
    size = w->data_offset + w->count * (int64_t)dt_npy_dtype_size(dtype);
    if (ftruncate(w->af.fd, (off_t)size) < 0) {
        int e = errno;
        rc = dt_emsg_set(em, dt_err_errno(e), "%s: cannot size %s: %s", path, w->af.tmp,
                         strerror(e));
        goto fail;
    }
    if ((rc = dt_pwrite_full(w->af.fd, hdr, hlen, 0)) < 0) {
        rc = dt_emsg_set(em, rc, "%s: cannot write %s: %s", path, w->af.tmp, dt_strerror(rc));
        goto fail;
    }
    *out = w;
    return 0;
fail:
    dt_npy_writer_abort(w);
    return rc;
}

int dt_npy_writer_pwrite(dt_npy_writer_t *w, int64_t first, int64_t count, const void *data,
                         dt_emsg_t *em)
{
    size_t isz = dt_npy_dtype_size(w->dtype);
    int64_t off;
    int rc;

    if (first < 0 || count < 0 || first > w->count || count > w->count - first) {
        rc = dt_emsg_set(em, DT_EINVAL,
                         "%s: elements [%" PRId64 ", %" PRId64 ") are outside [0, %" PRId64 ")",
                         w->path, first, first + count, w->count);
        goto out;
    }
    off = w->data_offset + first * (int64_t)isz;
    if (w->dtype != DT_F16) {
        rc = dt_pwrite_full(w->af.fd, data, (size_t)count * isz, off);
    } else {
        /* float32 in, binary16 out, through a bounded buffer. */
        const float *src = data;
        size_t per = CHUNK_BYTES / 2;
        unsigned char *buf = dt_xmalloc(CHUNK_BYTES);

        rc = 0;
        for (int64_t i = 0; i < count && rc == 0; i += (int64_t)per) {
            size_t n = (size_t)(count - i) < per ? (size_t)(count - i) : per;
            for (size_t j = 0; j < n; j++) {
                uint16_t h = dt_f32_to_f16(src[i + (int64_t)j]);
                buf[2 * j] = (unsigned char)(h & 0xff);
                buf[2 * j + 1] = (unsigned char)(h >> 8);
            }
            rc = dt_pwrite_full(w->af.fd, buf, n * 2, off + i * 2);
        }
        free(buf);
    }
    if (rc < 0)
        rc = dt_emsg_set(em, rc, "%s: cannot write %s: %s", w->path, w->af.tmp, dt_strerror(rc));
out:
    if (rc < 0 && w->failed == 0)
        w->failed = rc;
    return rc;
}

int dt_npy_writer_commit(dt_npy_writer_t *w, dt_emsg_t *em)
{
    int rc;

    if (w->failed < 0) {
        rc = dt_emsg_set(em, w->failed, "%s: not written: an earlier write failed (%s)",
                         w->path, dt_strerror(w->failed));
        dt_npy_writer_abort(w);
        return rc;
    }
    rc = dt_atomic_commit(&w->af, em);
    writer_free(w);
    return rc;
}

void dt_npy_writer_abort(dt_npy_writer_t *w)
{
    if (w == NULL)
        return;
    dt_atomic_abort(&w->af);
    writer_free(w);
}

int dt_npy_save(const char *path, dt_dtype_t dtype, int ndim, const int64_t *shape,
                const void *data, dt_emsg_t *em)
{
    dt_npy_writer_t *w;
    int rc;

    if ((rc = dt_npy_writer_open(path, dtype, ndim, shape, &w, em)) < 0)
        return rc;
    if ((rc = dt_npy_writer_pwrite(w, 0, w->count, data, em)) < 0) {
        dt_npy_writer_abort(w);
        return rc;
    }
    return dt_npy_writer_commit(w, em);
}
