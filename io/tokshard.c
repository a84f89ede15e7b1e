/* SPDX-License-Identifier: MIT
 *
 * Token files (see tokshard.h for the contract): llm.c shards and .npy
 * arrays of token ids behind one reader. A file's header is untrusted:
 * every field is checked, and the size against the count, before a token
 * is read; a .npy header goes through io/npy.h's parser, never a second
 * one. Tokens move with pread in bounded chunks, convert to int32 and are
 * checked as they are read. This file assumes a little-endian host (every
 * target of dt is one).
 *
 * Not here: prefetching, memory-mapping, tokenisation.
 */
#include "config.h"

#include <errno.h>
#include <inttypes.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "common/fileio.h"
#include "common/mem.h"
#include "io/npy.h"
#include "io/tokshard.h"

_Static_assert(__BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__,
               "tokshard.c reads header ints and tokens as they lie in memory");

#define CHUNK_TOKENS (64 * 1024)
#define NPY_MAGIC "\x93NUMPY"
#define NPY_MAGIC_LEN 6

const char *dt_tok_format_name(enum dt_tok_format f)
{
    switch (f) {
    case DT_TOK_U16:
        return "uint16";
    case DT_TOK_U32:
        return "uint32";
    case DT_TOK_NPY_I32:
        return "npy int32";
    case DT_TOK_NPY_I64:
        return "npy int64";
    }
    return "unknown";
}

static size_t tok_size(enum dt_tok_format f)
{
    switch (f) {
    case DT_TOK_U16:
        return 2;
    case DT_TOK_U32:
    case DT_TOK_NPY_I32:
        return 4;
    case DT_TOK_NPY_I64:
        return 8;
    }
    return 0;
}

static bool is_npy(const void *head, size_t n)
{
    return n >= NPY_MAGIC_LEN && memcmp(head, NPY_MAGIC, NPY_MAGIC_LEN) == 0;
}

/*-- one shard ----------------------------------------------------------------*/

struct dt_tok_shard {
    int fd;
    dt_tok_info_t info;
    char *path;
};

void dt_tok_shard_free(dt_tok_shard_t *s)
{
    if (s == NULL)
        return;
    if (s->fd >= 0)
        close(s->fd);
    free(s->path);
    free(s);
}

/* An llm.c shard's header: n >= 1024 bytes of head, or the whole file. */
static int parse_shard(const char *name, const void *head, size_t n, int64_t file_size,
                       dt_tok_info_t *info, dt_emsg_t *em)
{
    int32_t hdr[3];
    int64_t have, need;

    if (n < DT_TOK_HEADER_BYTES || file_size < DT_TOK_HEADER_BYTES)
        return dt_emsg_set(em, DT_EFORMAT,
                           "%s: header is truncated: the file has %" PRId64
                           " bytes, a token shard header has %d",
                           name, (int64_t)n < file_size ? (int64_t)n : file_size,
                           DT_TOK_HEADER_BYTES);
    memcpy(hdr, head, sizeof(hdr)); /* head may be unaligned */
    if (hdr[0] == DT_TOK_MAGIC_U16) {
        info->fmt = DT_TOK_U16;
        if (hdr[1] != DT_TOK_VERSION_U16)
            return dt_emsg_set(em, DT_EFORMAT,
                               "%s: header[1] (version) is %" PRId32 ", magic %d needs version %d",
                               name, hdr[1], DT_TOK_MAGIC_U16, DT_TOK_VERSION_U16);
    } else if (hdr[0] == DT_TOK_MAGIC_U32) {
        info->fmt = DT_TOK_U32;
        if (hdr[1] != DT_TOK_VERSION_U32)
            return dt_emsg_set(em, DT_EFORMAT,
                               "%s: header[1] (version) is %" PRId32 ", magic %d needs version %d",
                               name, hdr[1], DT_TOK_MAGIC_U32, DT_TOK_VERSION_U32);
    } else {
        return dt_emsg_set(em, DT_EFORMAT,
                           "%s: not a token shard: header[0] (magic) is %" PRId32
                           ", expected %d (uint16 tokens) or %d (uint32 tokens), or a .npy "
                           "file of token ids",
                           name, hdr[0], DT_TOK_MAGIC_U16, DT_TOK_MAGIC_U32);
    }
    if (hdr[2] < 0)
        return dt_emsg_set(em, DT_EFORMAT, "%s: header[2] (token count) is negative: %" PRId32,
                           name, hdr[2]);
    /* at most (2^31 - 1) * 4 bytes: no overflow; have >= 0 from the test above */
    info->ntok = hdr[2];
    info->data_offset = DT_TOK_HEADER_BYTES;
    need = info->ntok * (int64_t)tok_size(info->fmt);
    have = file_size - DT_TOK_HEADER_BYTES;
    if (have < need)
        return dt_emsg_set(em, DT_EFORMAT,
                           "%s: header[2] (token count) is %" PRId64 ": %" PRId64
                           " bytes of %s tokens, but the file has %" PRId64
                           " after the header (truncated?)",
                           name, info->ntok, need, dt_tok_format_name(info->fmt), have);
    if (have != need)
        return dt_emsg_set(em, DT_EFORMAT,
                           "%s: header[2] (token count) is %" PRId64 ": %" PRId64
                           " bytes of %s tokens, but the file has %" PRId64
                           " after the header (%" PRId64 " bytes of trailing data)",
                           name, info->ntok, need, dt_tok_format_name(info->fmt), have,
                           have - need);
    return 0;
}

/* A .npy header (io/npy.h checks it and the size against the shape), then
 * what makes it token ids: an integer dtype, 1 or 2 dimensions. */
static int parse_npy(const char *name, const void *head, size_t n, int64_t file_size,
                     dt_tok_info_t *info, dt_emsg_t *em)
{
    dt_npy_info_t ni;
    int rc = dt_npy_parse_head(name, head, n, file_size, &ni, em);

    if (rc == DT_EDTYPE && em != NULL) {
        /* npy.c lists what it reads; say what token ids need */
        dt_emsg_t why = *em;
        return dt_emsg_set(em, rc, "%s; token ids need int32 or int64, C order", why.s);
    }
    if (rc < 0)
        return rc;
    if (ni.dtype != DT_I32 && ni.dtype != DT_I64)
        return dt_emsg_set(em, DT_EDTYPE,
                           "%s: dtype is %s; token ids need int32 ('<i4') or int64 ('<i8')",
                           name, dt_npy_dtype_name(ni.dtype));
    if (ni.ndim < 1 || ni.ndim > 2)
        return dt_emsg_set(em, DT_EFORMAT,
                           "%s: %d dimensions; token ids are 1-D (n,) or 2-D (n, m), read as "
                           "n * m tokens in order",
                           name, ni.ndim);
    info->fmt = ni.dtype == DT_I32 ? DT_TOK_NPY_I32 : DT_TOK_NPY_I64;
    info->ntok = ni.count;
    info->data_offset = (int64_t)ni.data_offset;
    return 0;
}

int dt_tok_parse_header(const char *name, const void *head, size_t n, int64_t file_size,
                        dt_tok_info_t *info, dt_emsg_t *em)
{
    int rc;

    memset(info, 0, sizeof(*info));
    if (is_npy(head, n) && file_size >= NPY_MAGIC_LEN)
        rc = parse_npy(name, head, n, file_size, info, em);
    else
        rc = parse_shard(name, head, n, file_size, info, em);
    if (rc < 0)
        memset(info, 0, sizeof(*info));
    return rc;
}

int dt_tok_shard_new(const char *path, dt_tok_shard_t **out, dt_emsg_t *em)
{
    unsigned char first[DT_TOK_HEADER_BYTES];
    unsigned char *head = first;
    dt_tok_shard_t *s;
    int64_t st_size = 0;
    int64_t got;
    int rc;

    *out = NULL;
    s = dt_xcalloc(1, sizeof(*s));
    s->path = dt_xstrdup(path);
    if ((s->fd = dt_open_regular(path, &st_size, em)) < 0) {
        rc = s->fd;
        goto fail;
    }
    if ((got = dt_pread_full(s->fd, first, sizeof(first), 0)) < 0) {
        rc = dt_emsg_set(em, (int)got, "%s: cannot read: %s", path, dt_strerror((int)got));
        goto fail;
    }
    if (is_npy(first, (size_t)got)) {
        size_t len;

        /* a .npy header longer than what was read: read exactly all of it */
        if ((rc = dt_npy_header_len(path, first, (size_t)got, st_size, &len, em)) < 0)
            goto fail;
        if (len > (size_t)got) {
            head = dt_xmalloc(len);
            if ((got = dt_pread_full(s->fd, head, len, 0)) < 0) {
                rc = dt_emsg_set(em, (int)got, "%s: cannot read: %s", path,
                                 dt_strerror((int)got));
                goto fail;
            }
        }
    }
    if ((rc = dt_tok_parse_header(path, head, (size_t)got, st_size, &s->info, em)) < 0)
        goto fail;
    if (head != first)
        free(head);
    *out = s;
    return 0;
fail:
    if (head != first)
        free(head);
    dt_tok_shard_free(s);
    return rc;
}

int64_t dt_tok_shard_ntok(const dt_tok_shard_t *s)
{
    return s->info.ntok;
}

enum dt_tok_format dt_tok_shard_format(const dt_tok_shard_t *s)
{
    return s->info.fmt;
}

const char *dt_tok_shard_path(const dt_tok_shard_t *s)
{
    return s->path;
}

/* m tokens of format fmt in buf, the first being token number `index` of
 * the file, into dst as int32; refuse an id int32 cannot hold or a
 * negative one. */
static int convert(const dt_tok_shard_t *s, const unsigned char *buf, int64_t m, int64_t index,
                   int32_t *dst, dt_emsg_t *em)
{
    int64_t bad = -1, v = 0;

    switch (s->info.fmt) {
    case DT_TOK_U16: {
        const uint16_t *p = (const uint16_t *)buf;
        for (int64_t j = 0; j < m; j++)
            dst[j] = p[j];
        break;
    }
    case DT_TOK_U32: {
        const uint32_t *p = (const uint32_t *)buf;
        for (int64_t j = 0; j < m && bad < 0; j++) {
            if (p[j] > INT32_MAX) {
                bad = j;
                v = p[j];
            }
            dst[j] = (int32_t)p[j];
        }
        break;
    }
    case DT_TOK_NPY_I32: {
        const int32_t *p = (const int32_t *)buf;
        for (int64_t j = 0; j < m && bad < 0; j++) {
            if (p[j] < 0) {
                bad = j;
                v = p[j];
            }
            dst[j] = p[j];
        }
        break;
    }
    case DT_TOK_NPY_I64: {
        const int64_t *p = (const int64_t *)buf;
        for (int64_t j = 0; j < m && bad < 0; j++) {
            if (p[j] < 0 || p[j] > INT32_MAX) {
                bad = j;
                v = p[j];
            }
            dst[j] = (int32_t)p[j];
        }
        break;
    }
    }
    if (bad < 0)
        return 0;
    if (v < 0)
        return dt_emsg_set(em, DT_EFORMAT,
                           "%s: token %" PRId64 " is %" PRId64 ", a negative token id", s->path,
                           index + bad, v);
    return dt_emsg_set(em, DT_EFORMAT,
                       "%s: token %" PRId64 " is %" PRId64 ", larger than the int32 range",
                       s->path, index + bad, v);
}

int dt_tok_shard_read(const dt_tok_shard_t *s, int64_t first, int64_t n, int32_t *dst,
                      dt_emsg_t *em)
{
    size_t w = tok_size(s->info.fmt);
    unsigned char *buf;
    int rc = 0;

    if (first < 0 || n < 0 || first > s->info.ntok || n > s->info.ntok - first)
        return dt_emsg_set(em, DT_EINVAL,
                           "%s: tokens [%" PRId64 ", %" PRId64 ") are outside [0, %" PRId64 ")",
                           s->path, first, first + n, s->info.ntok);
    if (n == 0)
        return 0;
    /* aligned for the widest token: the conversions read it as an array */
    buf = dt_xmallocarray(CHUNK_TOKENS, sizeof(int64_t));
    for (int64_t i = 0; i < n && rc == 0; i += CHUNK_TOKENS) {
        int64_t m = n - i < CHUNK_TOKENS ? n - i : CHUNK_TOKENS;
        int64_t off = s->info.data_offset + (first + i) * (int64_t)w;
        int64_t got = dt_pread_full(s->fd, buf, (size_t)m * w, off);

        if (got < 0) {
            rc = dt_emsg_set(em, (int)got, "%s: cannot read: %s", s->path, dt_strerror((int)got));
            break;
        }
        if (got < m * (int64_t)w) {
            rc = dt_emsg_set(em, DT_EFORMAT,
                             "%s: tokens from %" PRId64
                             " are missing: the file shrank after it was opened",
                             s->path, first + i);
            break;
        }
        rc = convert(s, buf, m, first + i, dst + i, em);
    }
    free(buf);
    return rc;
}

/*-- atomic writers ------------------------------------------------------------*/

/* A 1-D .npy array through io/npy.h's atomic writer; int64 widened in
 * bounded chunks. */
static int save_npy(const char *path, enum dt_tok_format fmt, const int32_t *tok, int64_t n,
                    dt_emsg_t *em)
{
    int64_t shape[1] = { n };
    dt_npy_writer_t *w;
    int rc;

    if ((rc = dt_npy_writer_open(path, fmt == DT_TOK_NPY_I32 ? DT_I32 : DT_I64, 1, shape, &w,
                                 em)) < 0)
        return rc;
    if (fmt == DT_TOK_NPY_I32) {
        rc = dt_npy_writer_pwrite(w, 0, n, tok, em);
    } else {
        int64_t *buf = dt_xmallocarray(CHUNK_TOKENS, sizeof(*buf));

        for (int64_t i = 0; i < n && rc == 0; i += CHUNK_TOKENS) {
            int64_t m = n - i < CHUNK_TOKENS ? n - i : CHUNK_TOKENS;
            for (int64_t j = 0; j < m; j++)
                buf[j] = tok[i + j];
            rc = dt_npy_writer_pwrite(w, i, m, buf, em);
        }
        free(buf);
    }
    if (rc < 0) {
        dt_npy_writer_abort(w);
        return rc;
    }
    return dt_npy_writer_commit(w, em);
}

int dt_tok_save(const char *path, enum dt_tok_format fmt, const int32_t *tok, int64_t n,
                dt_emsg_t *em)
{
    int32_t hdr[DT_TOK_HEADER_INTS] = { 0 };
    int64_t maxtok = fmt == DT_TOK_U16 ? 65535 : INT32_MAX;
    bool npy = fmt == DT_TOK_NPY_I32 || fmt == DT_TOK_NPY_I64;
    size_t w = tok_size(fmt);
    unsigned char *buf = NULL;
    dt_atomic_t af;
    int rc = 0;

    if (fmt != DT_TOK_U16 && fmt != DT_TOK_U32 && !npy)
        return dt_emsg_set(em, DT_EINVAL, "%s: unknown token format %d", path, (int)fmt);
    if (n < 0)
        return dt_emsg_set(em, DT_EINVAL, "%s: a negative token count (%" PRId64 ")", path, n);
    if (!npy && n > INT32_MAX)
        return dt_emsg_set(em, DT_EINVAL, "%s: %" PRId64 " tokens do not fit header[2] (0 to %d)",
                           path, n, INT32_MAX);
    for (int64_t i = 0; i < n; i++)
        if (tok[i] < 0 || tok[i] > maxtok)
            return dt_emsg_set(em, DT_EINVAL,
                               "%s: token %" PRId64 " is %" PRId32 ", outside 0..%" PRId64
                               " of %s tokens",
                               path, i, tok[i], maxtok, dt_tok_format_name(fmt));
    if (npy)
        return save_npy(path, fmt, tok, n, em);
    /* 0600; a link planted at the temp name is not followed (fileio.h) */
    if ((rc = dt_atomic_open(&af, path, 0600, 0, em)) < 0)
        return rc;
    hdr[0] = fmt == DT_TOK_U16 ? DT_TOK_MAGIC_U16 : DT_TOK_MAGIC_U32;
    hdr[1] = fmt == DT_TOK_U16 ? DT_TOK_VERSION_U16 : DT_TOK_VERSION_U32;
    hdr[2] = (int32_t)n;
    rc = dt_atomic_write(&af, hdr, sizeof(hdr), em);
    buf = dt_xmallocarray(CHUNK_TOKENS, w);
    for (int64_t i = 0; i < n && rc == 0; i += CHUNK_TOKENS) {
        int64_t m = n - i < CHUNK_TOKENS ? n - i : CHUNK_TOKENS;
        for (int64_t j = 0; j < m; j++) {
            if (fmt == DT_TOK_U16)
                ((uint16_t *)buf)[j] = (uint16_t)tok[i + j];
            else
                ((uint32_t *)buf)[j] = (uint32_t)tok[i + j];
        }
        rc = dt_atomic_write(&af, buf, (size_t)m * w, em);
    }
    free(buf);
    if (rc < 0) {
        dt_atomic_abort(&af);
        return rc;
    }
    return dt_atomic_commit(&af, em);
}
