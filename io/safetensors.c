/* SPDX-License-Identifier: MIT
 *
 * safetensors reading, validation and atomic writing (see safetensors.h for
 * the contract). The header is untrusted JSON: its length is capped before
 * allocating, jansson parses it with duplicate keys rejected, and every entry
 * is checked before the file is accepted, so later reads only bounds-check
 * against numbers already known to agree with the file size. SHA-256
 * (common/sha256.h) is fed by the same buffers that are written, so the
 * digest is of the bytes that went out.
 *
 * Not here: memory-mapping, conversions, the checkpoint layout (ckpt.c).
 */
#include "config.h"

#include <inttypes.h>
#include <jansson.h>
#include <pthread.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "common/fileio.h"
#include "common/mem.h"
#include "common/sha256.h"
#include "common/text.h"
#include "safetensors.h"

_Static_assert(__BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__,
               "safetensors data is little-endian and is copied as it lies in memory");

#define META_KEY "__metadata__"

/*-- dtypes ---------------------------------------------------------------*/

static const struct {
    const char *name;
    size_t size;
} dtypes[] = {
    [DT_F32] = { "F32", 4 }, [DT_F16] = { "F16", 2 }, [DT_BF16] = { "BF16", 2 },
    [DT_I64] = { "I64", 8 }, [DT_I32] = { "I32", 4 }, [DT_U8] = { "U8", 1 },
};
#define NDTYPES (sizeof(dtypes) / sizeof(dtypes[0]))

const char *dt_st_dtype_name(dt_dtype_t t)
{
    return (unsigned)t < NDTYPES ? dtypes[t].name : "?";
}

size_t dt_st_dtype_size(dt_dtype_t t)
{
    return (unsigned)t < NDTYPES ? dtypes[t].size : 0;
}

int dt_st_dtype_parse(const char *s, dt_dtype_t *out)
{
    for (size_t i = 0; i < NDTYPES; i++) {
        if (strcmp(s, dtypes[i].name) == 0) {
            *out = (dt_dtype_t)i;
            return 0;
        }
    }
    return DT_EDTYPE;
}

/* prod(shape) * itemsize without overflow of int64; -1 when it overflows. */
static int64_t shape_bytes(int ndim, const int64_t *shape, size_t itemsize)
{
    int64_t n = (int64_t)itemsize;

    for (int i = 0; i < ndim; i++)
        if (__builtin_mul_overflow(n, shape[i], &n))
            return -1;
    return n;
}

/*-- hashing and file helpers ---------------------------------------------*/

/*-- writer ---------------------------------------------------------------*/

/* dt_atomic_sync on a thread while the caller hashes. */
typedef struct fsync_job {
    dt_atomic_t *af;
    dt_emsg_t em;
    int rc;
} fsync_job_t;

static void *fsync_main(void *arg)
{
    fsync_job_t *j = arg;
    j->rc = dt_atomic_sync(j->af, &j->em);
    return NULL;
}

typedef struct {
    char *name;
    dt_dtype_t dtype;
    int ndim;
    int64_t shape[DT_ST_MAXDIM];
    const void *data;
    int64_t nbytes;
} wtensor_t;

typedef struct {
    char *key, *value;
} meta_t;

struct dt_st_writer {
    wtensor_t *t;
    size_t nt, capt;
    meta_t *m;
    size_t nm, capm;
    int64_t data_bytes;
};

dt_st_writer_t *dt_st_writer_new(void)
{
    return dt_xcalloc(1, sizeof(dt_st_writer_t));
}

void dt_st_writer_free(dt_st_writer_t *w)
{
    if (w == NULL)
        return;
    for (size_t i = 0; i < w->nt; i++)
        free(w->t[i].name);
    for (size_t i = 0; i < w->nm; i++) {
        free(w->m[i].key);
        free(w->m[i].value);
    }
    free(w->t);
    free(w->m);
    free(w);
}

/* A string jansson will accept as a JSON string (valid UTF-8, no NUL). */
static bool valid_utf8(const char *s)
{
    json_t *j = json_string(s);

    json_decref(j);
    return j != NULL;
}

int dt_st_writer_add(dt_st_writer_t *w, const char *name, dt_dtype_t dtype, int ndim,
                     const int64_t *shape, const void *data, dt_emsg_t *em)
{
    wtensor_t *t;
    int64_t nbytes;

    if (name == NULL || *name == '\0' || !valid_utf8(name))
        return dt_emsg_set(em, DT_EINVAL, "tensor name is empty or not UTF-8");
    if (strcmp(name, META_KEY) == 0)
        return dt_emsg_set(em, DT_EINVAL, "tensor name '%s' is reserved", META_KEY);
    if ((unsigned)dtype >= NDTYPES)
        return dt_emsg_set(em, DT_EDTYPE, "tensor '%s': unknown dtype %d", name, (int)dtype);
    if (ndim < 0 || ndim > DT_ST_MAXDIM)
        return dt_emsg_set(em, DT_EINVAL, "tensor '%s': %d dimensions (0 to %d supported)", name,
                           ndim, DT_ST_MAXDIM);
    for (int i = 0; i < ndim; i++)
        if (shape[i] < 0)
            return dt_emsg_set(em, DT_EINVAL, "tensor '%s': negative dimension %" PRId64, name,
                               shape[i]);
    nbytes = shape_bytes(ndim, shape, dtypes[dtype].size);
    if (nbytes < 0 || nbytes > INT64_MAX / 2 - w->data_bytes)
        return dt_emsg_set(em, DT_EINVAL, "tensor '%s': shape is too large", name);
    if (nbytes > 0 && data == NULL)
        return dt_emsg_set(em, DT_EINVAL, "tensor '%s': no data", name);
    for (size_t i = 0; i < w->nt; i++)
        if (strcmp(w->t[i].name, name) == 0)
            return dt_emsg_set(em, DT_EINVAL, "tensor '%s' added twice", name);

    if (w->nt == w->capt) {
        w->capt = w->capt ? 2 * w->capt : 16;
        w->t = dt_xrealloc(w->t, w->capt * sizeof(*w->t));
    }
    t = &w->t[w->nt++];
    memset(t, 0, sizeof(*t));
    t->name = dt_xstrdup(name);
    t->dtype = dtype;
    t->ndim = ndim;
    if (ndim > 0)
        memcpy(t->shape, shape, (size_t)ndim * sizeof(*shape));
    t->data = data;
    t->nbytes = nbytes;
    w->data_bytes += nbytes;
    return 0;
}

int dt_st_writer_meta(dt_st_writer_t *w, const char *key, const char *value, dt_emsg_t *em)
{
    if (key == NULL || value == NULL || !valid_utf8(key) || !valid_utf8(value))
        return dt_emsg_set(em, DT_EINVAL, "metadata key or value is missing or not UTF-8");
    for (size_t i = 0; i < w->nm; i++)
        if (strcmp(w->m[i].key, key) == 0)
            return dt_emsg_set(em, DT_EINVAL, "metadata key '%s' added twice", key);
    if (w->nm == w->capm) {
        w->capm = w->capm ? 2 * w->capm : 8;
        w->m = dt_xrealloc(w->m, w->capm * sizeof(*w->m));
    }
    w->m[w->nm].key = dt_xstrdup(key);
    w->m[w->nm].value = dt_xstrdup(value);
    w->nm++;
    return 0;
}

/* The header JSON, compact, in insertion order, padded with spaces to a
 * multiple of 8 bytes. Returns a malloc'd string and its length. */
static char *build_header(const dt_st_writer_t *w, size_t *len)
{
    json_t *root = json_object();
    uint64_t off = 0;
    char *s, *out;
    size_t n, padded;

    if (w->nm > 0) {
        json_t *meta = json_object();
        for (size_t i = 0; i < w->nm; i++)
            json_object_set_new(meta, w->m[i].key, json_string(w->m[i].value));
        json_object_set_new(root, META_KEY, meta);
    }
    for (size_t i = 0; i < w->nt; i++) {
        const wtensor_t *t = &w->t[i];
        json_t *shape = json_array();

        for (int d = 0; d < t->ndim; d++)
            json_array_append_new(shape, json_integer(t->shape[d]));
        json_object_set_new(root, t->name,
                            json_pack("{s:s, s:o, s:[I,I]}", "dtype", dtypes[t->dtype].name,
                                      "shape", shape, "data_offsets", (json_int_t)off,
                                      (json_int_t)(off + (uint64_t)t->nbytes)));
        off += (uint64_t)t->nbytes;
    }
    s = json_dumps(root, JSON_COMPACT | JSON_PRESERVE_ORDER);
    json_decref(root);
    if (s == NULL) {
        fprintf(stderr, "dt: out of memory building a safetensors header\n");
        abort();
    }
    n = strlen(s);
    padded = (n + 7) / 8 * 8;
    out = dt_xmalloc(padded + 1);
    memcpy(out, s, n);
    memset(out + n, ' ', padded - n);
    out[padded] = '\0';
    free(s);
    *len = padded;
    return out;
}

int dt_st_write(dt_st_writer_t *w, const char *path, char hex[65], int64_t *bytes, dt_emsg_t *em)
{
    /* 0600: checkpoint shards hold a model's weights, the owner's alone */
    return dt_st_write_mode(w, path, 0600, hex, bytes, em);
}

int dt_st_write_mode(dt_st_writer_t *w, const char *path, mode_t mode, char hex[65],
                     int64_t *bytes, dt_emsg_t *em)
{
    dt_sha256_t *ctx = NULL;
    char *hdr = NULL, digest[65];
    unsigned char len8[8];
    size_t hlen;
    dt_atomic_t af = { .fd = -1 };
    int rc;

    hdr = build_header(w, &hlen);
    if (hlen > DT_ST_HEADER_MAX) {
        rc = dt_emsg_set(em, DT_EINVAL, "%s: header of %zu bytes exceeds the limit of %u", path,
                         hlen, DT_ST_HEADER_MAX);
        goto fail;
    }
    if ((rc = dt_atomic_open(&af, path, mode, 0, em)) < 0)
        goto fail;
    for (int i = 0; i < 8; i++)
        len8[i] = (unsigned char)(((uint64_t)hlen >> (8 * i)) & 0xff);
    if ((rc = dt_atomic_write(&af, len8, 8, em)) < 0 ||
        (rc = dt_atomic_write(&af, hdr, hlen, em)) < 0)
        goto fail;
    for (size_t i = 0; i < w->nt; i++) {
        const wtensor_t *t = &w->t[i];

        if (t->nbytes > 0 && (rc = dt_atomic_write(&af, t->data, (size_t)t->nbytes, em)) < 0)
            goto fail;
    }
    /* The bytes are in the page cache: the device writes them while this
     * thread hashes the same bytes from memory (the hash is of what was
     * written, byte for byte). Checkpoint writes ran at half the disk's
     * speed with the hash, write and fsync in sequence. */
    fsync_job_t fj = { .af = &af };
    pthread_t th;
    int threaded = pthread_create(&th, NULL, fsync_main, &fj) == 0;
    ctx = dt_sha256_new();
    dt_sha256_update(ctx, len8, 8);
    dt_sha256_update(ctx, hdr, hlen);
    for (size_t i = 0; i < w->nt; i++)
        dt_sha256_update(ctx, w->t[i].data, (size_t)w->t[i].nbytes);
    dt_sha256_final(ctx, digest);
    ctx = NULL;
    if (threaded)
        pthread_join(th, NULL);
    else
        fsync_main(&fj);
    if (fj.rc < 0) {
        rc = dt_emsg_set(em, fj.rc, "%s", fj.em.s);
        goto fail;
    }
    /* close, rename, and the directory's fsync */
    rc = dt_atomic_commit(&af, em);
    if (hex)
        memcpy(hex, digest, 65);
    if (bytes)
        *bytes = 8 + (int64_t)hlen + w->data_bytes;
    free(hdr);
    return rc;

fail:
    dt_sha256_free(ctx);
    dt_atomic_abort(&af);
    free(hdr);
    return rc;
}

/* All of len bytes at off of fd. */
static int pwrite_all(int fd, const void *p, size_t len, off_t off, const char *name,
                      dt_emsg_t *em)
{
    const char *c = p;

    while (len > 0) {
        ssize_t k = pwrite(fd, c, len > (1u << 30) ? (1u << 30) : len, off);
        if (k < 0 && errno == EINTR)
            continue;
        if (k <= 0)
            return dt_emsg_set(em, k < 0 ? -errno : DT_EIO, "%s: write: %s", name,
                               k < 0 ? strerror(errno) : "no progress");
        c += k;
        off += k;
        len -= (size_t)k;
    }
    return 0;
}

int dt_st_write_fd(dt_st_writer_t *w, int fd, const char *name, char hex[65], int64_t *bytes,
                   dt_emsg_t *em)
{
    size_t hlen;
    char *hdr = build_header(w, &hlen);
    unsigned char len8[8];
    off_t at = 0;
    int rc = 0;

    if (hlen > DT_ST_HEADER_MAX) {
        free(hdr);
        return dt_emsg_set(em, DT_EINVAL, "%s: header of %zu bytes exceeds the limit of %u", name,
                           hlen, DT_ST_HEADER_MAX);
    }
    for (int i = 0; i < 8; i++)
        len8[i] = (unsigned char)(((uint64_t)hlen >> (8 * i)) & 0xff);
    /* hashed as written, unless the caller hashes it later (hex NULL) */
    dt_sha256_t *ctx = hex ? dt_sha256_new() : NULL;
    if (ctx) {
        dt_sha256_update(ctx, len8, 8);
        dt_sha256_update(ctx, hdr, hlen);
    }
    if ((rc = pwrite_all(fd, len8, 8, at, name, em)) == 0)
        rc = pwrite_all(fd, hdr, hlen, at += 8, name, em);
    at += (off_t)hlen;
    for (size_t i = 0; i < w->nt && rc == 0; i++) {
        const wtensor_t *t = &w->t[i];
        if (t->nbytes > 0 && (rc = pwrite_all(fd, t->data, (size_t)t->nbytes, at, name, em)) == 0 &&
            ctx)
            dt_sha256_update(ctx, t->data, (size_t)t->nbytes);
        at += (off_t)t->nbytes;
    }
    if (rc == 0 && ftruncate(fd, at) < 0)
        rc = dt_emsg_set(em, -errno, "%s: truncate: %s", name, strerror(errno));
    char digest[65];
    if (ctx)
        dt_sha256_final(ctx, digest);
    free(hdr);
    if (rc == 0) {
        if (hex)
            memcpy(hex, digest, 65);
        if (bytes)
            *bytes = (int64_t)at;
    }
    return rc;
}

/*-- reader ---------------------------------------------------------------*/

struct dt_st_reader {
    int fd;
    char *path;
    int64_t data_start; /* 8 + N */
    dt_st_tensor_t *t;  /* sorted by (begin, end) */
    size_t nt;
    meta_t *m;
    size_t nm;
};

void dt_st_close(dt_st_reader_t *r)
{
    if (r == NULL)
        return;
    if (r->fd >= 0)
        close(r->fd);
    for (size_t i = 0; i < r->nt; i++)
        free((char *)r->t[i].name);
    for (size_t i = 0; i < r->nm; i++) {
        free(r->m[i].key);
        free(r->m[i].value);
    }
    free(r->t);
    free(r->m);
    free(r->path);
    free(r);
}

static int by_offsets(const void *a, const void *b)
{
    const dt_st_tensor_t *x = a, *y = b;

    if (x->begin != y->begin)
        return x->begin < y->begin ? -1 : 1;
    if (x->end != y->end)
        return x->end < y->end ? -1 : 1;
    return 0;
}

/* A JSON integer in [0, INT64_MAX]. */
static bool get_uint(const json_t *j, int64_t *out)
{
    if (!json_is_integer(j) || json_integer_value(j) < 0)
        return false;
    *out = (int64_t)json_integer_value(j);
    return true;
}

static int parse_meta(const char *path, json_t *obj, dt_st_reader_t *r, dt_emsg_t *em)
{
    const char *key;
    json_t *v;

    if (!json_is_object(obj))
        return dt_emsg_set(em, DT_EFORMAT, "%s: '%s' is not an object", path, META_KEY);
    r->m = dt_xcalloc(json_object_size(obj) + 1, sizeof(*r->m));
    json_object_foreach(obj, key, v)
    {
        if (!json_is_string(v))
            return dt_emsg_set(em, DT_EFORMAT, "%s: metadata '%s' is not a string", path, key);
        r->m[r->nm].key = dt_xstrdup(key);
        r->m[r->nm].value = dt_xstrdup(json_string_value(v));
        r->nm++;
    }
    return 0;
}

/* Check one tensor entry and fill t (name not yet set). */
static int parse_entry(const char *path, const char *name, json_t *e, dt_st_tensor_t *t,
                       dt_emsg_t *em)
{
    json_t *dtype, *shape, *offs, *v;
    const char *key;
    int64_t b, en, nbytes;
    size_t i;
    char sbuf[200];

    if (!json_is_object(e))
        return dt_emsg_set(em, DT_EFORMAT, "%s: tensor '%s' is not an object", path, name);
    json_object_foreach(e, key, v)
    {
        if (strcmp(key, "dtype") != 0 && strcmp(key, "shape") != 0 &&
            strcmp(key, "data_offsets") != 0)
            return dt_emsg_set(em, DT_EFORMAT, "%s: tensor '%s' has unknown field '%s'", path, name,
                               key);
    }
    dtype = json_object_get(e, "dtype");
    shape = json_object_get(e, "shape");
    offs = json_object_get(e, "data_offsets");
    if (!json_is_string(dtype))
        return dt_emsg_set(em, DT_EFORMAT, "%s: tensor '%s' has no string 'dtype'", path, name);
    if (dt_st_dtype_parse(json_string_value(dtype), &t->dtype) < 0)
        return dt_emsg_set(em, DT_EDTYPE,
                           "%s: tensor '%s' has dtype '%s' (supported: F32, F16, BF16, I64, "
                           "I32, U8)",
                           path, name, json_string_value(dtype));
    if (!json_is_array(shape))
        return dt_emsg_set(em, DT_EFORMAT, "%s: tensor '%s' has no array 'shape'", path, name);
    if (json_array_size(shape) > DT_ST_MAXDIM)
        return dt_emsg_set(em, DT_EFORMAT, "%s: tensor '%s' has %zu dimensions (at most %d)", path,
                           name, json_array_size(shape), DT_ST_MAXDIM);
    t->ndim = (int)json_array_size(shape);
    json_array_foreach(shape, i, v)
    {
        if (!get_uint(v, &t->shape[i]))
            return dt_emsg_set(em, DT_EFORMAT,
                               "%s: tensor '%s': shape entry %zu is not a non-negative integer",
                               path, name, i);
    }
    if (!json_is_array(offs) || json_array_size(offs) != 2 ||
        !get_uint(json_array_get(offs, 0), &b) || !get_uint(json_array_get(offs, 1), &en))
        return dt_emsg_set(em, DT_EFORMAT,
                           "%s: tensor '%s': 'data_offsets' is not [begin, end] of "
                           "non-negative integers",
                           path, name);
    if (en < b)
        return dt_emsg_set(em, DT_EFORMAT,
                           "%s: tensor '%s': data_offsets [%" PRId64 ", %" PRId64
                           "] end before they begin",
                           path, name, b, en);
    nbytes = shape_bytes(t->ndim, t->shape, dtypes[t->dtype].size);
    if (nbytes != en - b)
        return dt_emsg_set(em, DT_EFORMAT,
                           "%s: tensor '%s': shape %s of %s is %s%" PRId64
                           " bytes but data_offsets [%" PRId64 ", %" PRId64 "] span %" PRId64,
                           path, name,
                           dt_text_shape(sbuf, sizeof(sbuf), t->ndim, t->shape, DT_SHAPE_LIST),
                           dtypes[t->dtype].name, nbytes < 0 ? "more than " : "",
                           nbytes < 0 ? INT64_MAX : nbytes, b, en, en - b);
    t->begin = (uint64_t)b;
    t->end = (uint64_t)en;
    return 0;
}

static int parse_header(const char *path, const char *text, size_t len, int64_t data_size,
                        dt_st_reader_t *r, dt_emsg_t *em)
{
    json_error_t jerr;
    json_t *root, *v;
    const char *key;
    uint64_t expect = 0;
    int rc = 0;

    root = json_loadb(text, len, JSON_REJECT_DUPLICATES, &jerr);
    if (root == NULL)
        return dt_emsg_set(em, DT_EFORMAT, "%s: header is not valid JSON: %s (line %d, column %d)",
                           path, jerr.text, jerr.line, jerr.column);
    if (!json_is_object(root)) {
        rc = dt_emsg_set(em, DT_EFORMAT, "%s: header is not a JSON object", path);
        goto out;
    }
    r->t = dt_xcalloc(json_object_size(root) + 1, sizeof(*r->t));
    json_object_foreach(root, key, v)
    {
        dt_st_tensor_t *t = &r->t[r->nt];

        if (strcmp(key, META_KEY) == 0) {
            if ((rc = parse_meta(path, v, r, em)) < 0)
                goto out;
            continue;
        }
        if ((rc = parse_entry(path, key, v, t, em)) < 0)
            goto out;
        t->name = dt_xstrdup(key);
        r->nt++;
    }

    /* Ranges, in offset order, must tile [0, data end) exactly. */
    qsort(r->t, r->nt, sizeof(*r->t), by_offsets);
    for (size_t i = 0; i < r->nt; i++) {
        const dt_st_tensor_t *t = &r->t[i];

        if (t->begin < expect) {
            rc = dt_emsg_set(em, DT_EFORMAT,
                             "%s: tensor '%s' data_offsets [%" PRIu64 ", %" PRIu64
                             "] overlap '%s' (which ends at %" PRIu64 ")",
                             path, t->name, t->begin, t->end, r->t[i - 1].name, expect);
            goto out;
        }
        if (t->begin > expect) {
            rc = dt_emsg_set(em, DT_EFORMAT,
                             "%s: gap in the data: tensor '%s' begins at %" PRIu64
                             " but the previous tensor ends at %" PRIu64,
                             path, t->name, t->begin, expect);
            goto out;
        }
        expect = t->end;
    }
    if (expect > (uint64_t)data_size) {
        rc = dt_emsg_set(em, DT_EFORMAT,
                         "%s: truncated: the header promises %" PRIu64
                         " data bytes but the file holds %" PRId64,
                         path, expect, data_size);
        goto out;
    }
    if (expect < (uint64_t)data_size) {
        rc = dt_emsg_set(em, DT_EFORMAT,
                         "%s: %" PRId64 " bytes after the last tensor (data ends at %" PRIu64
                         ", file holds %" PRId64 ")",
                         path, data_size - (int64_t)expect, expect, data_size);
        goto out;
    }
out:
    json_decref(root);
    return rc;
}

/* The header length from the first got (<= 8) bytes of a file of size
 * bytes, checked against the cap and the size. */
static int header_len(const char *path, const unsigned char *len8, int64_t got, int64_t size,
                      uint64_t *n, dt_emsg_t *em)
{
    *n = 0;
    if (got < 8 || size < 8)
        return dt_emsg_set(em, DT_EFORMAT,
                           "%s: not a safetensors file (%" PRId64
                           " bytes, shorter than the 8-byte header length)",
                           path, got < size ? got : size);
    for (int i = 7; i >= 0; i--)
        *n = *n << 8 | len8[i];
    if (*n > DT_ST_HEADER_MAX)
        return dt_emsg_set(em, DT_EFORMAT,
                           "%s: header length %" PRIu64 " exceeds the limit of %u bytes", path, *n,
                           DT_ST_HEADER_MAX);
    if (*n > (uint64_t)(size - 8))
        return dt_emsg_set(em, DT_EFORMAT,
                           "%s: header length %" PRIu64 " is larger than the file (%" PRId64
                           " bytes after the length)",
                           path, *n, size - 8);
    return 0;
}

static int open_reader(const char *path, unsigned flags, dt_st_reader_t **out, dt_emsg_t *em)
{
    dt_st_reader_t *r;
    int64_t st_size = 0;
    unsigned char len8[8];
    uint64_t n = 0;
    char *text = NULL;
    int64_t got, size;
    int rc;

    *out = NULL;
    r = dt_xcalloc(1, sizeof(*r));
    r->path = dt_xstrdup(path);
    if ((r->fd = dt_open_regular_flags(path, flags, &st_size, em)) < 0) {
        rc = r->fd;
        goto fail;
    }
    size = st_size;
    if ((got = dt_pread_full(r->fd, len8, 8, 0)) < 0) {
        rc = dt_emsg_set(em, (int)got, "%s: cannot read: %s", path, dt_strerror((int)got));
        goto fail;
    }
    if ((rc = header_len(path, len8, got, size, &n, em)) < 0)
        goto fail;
    r->data_start = 8 + (int64_t)n;
    text = dt_xmalloc(n + 1);
    if ((got = dt_pread_full(r->fd, text, n, 8)) < 0) {
        rc = dt_emsg_set(em, (int)got, "%s: cannot read: %s", path, dt_strerror((int)got));
        goto fail;
    }
    if ((uint64_t)got < n) {
        rc = dt_emsg_set(em, DT_EFORMAT, "%s: header is truncated", path);
        goto fail;
    }
    text[n] = '\0';
    if ((rc = parse_header(path, text, n, size - r->data_start, r, em)) < 0)
        goto fail;
    free(text);
    *out = r;
    return 0;
fail:
    free(text);
    dt_st_close(r);
    return rc;
}

int dt_st_open(const char *path, dt_st_reader_t **out, dt_emsg_t *em)
{
    return open_reader(path, 0, out, em);
}

int dt_st_open_nofollow(const char *path, dt_st_reader_t **out, dt_emsg_t *em)
{
    return open_reader(path, DT_OPEN_NOFOLLOW, out, em);
}

int dt_st_parse(const char *name, const void *file, size_t size, dt_st_reader_t **out,
                dt_emsg_t *em)
{
    const unsigned char *p = file;
    dt_st_reader_t *r;
    uint64_t n = 0;
    int rc;

    *out = NULL;
    if (size > INT64_MAX)
        return dt_emsg_set(em, DT_EFORMAT, "%s: too large", name);
    if ((rc = header_len(name, p, size < 8 ? (int64_t)size : 8, (int64_t)size, &n, em)) < 0)
        return rc;
    r = dt_xcalloc(1, sizeof(*r));
    r->fd = -1;
    r->path = dt_xstrdup(name);
    r->data_start = 8 + (int64_t)n;
    if ((rc = parse_header(name, (const char *)p + 8, n, (int64_t)size - r->data_start, r,
                           em)) < 0) {
        dt_st_close(r);
        return rc;
    }
    *out = r;
    return 0;
}

const char *dt_st_path(const dt_st_reader_t *r)
{
    return r->path;
}

size_t dt_st_count(const dt_st_reader_t *r)
{
    return r->nt;
}

const dt_st_tensor_t *dt_st_tensor(const dt_st_reader_t *r, size_t i)
{
    return i < r->nt ? &r->t[i] : NULL;
}

const dt_st_tensor_t *dt_st_find(const dt_st_reader_t *r, const char *name)
{
    for (size_t i = 0; i < r->nt; i++)
        if (strcmp(r->t[i].name, name) == 0)
            return &r->t[i];
    return NULL;
}

int dt_st_read(const dt_st_reader_t *r, const char *name, void *dst, size_t dst_bytes,
               dt_emsg_t *em)
{
    const dt_st_tensor_t *t = dt_st_find(r, name);
    uint64_t n;
    int64_t got;

    if (t == NULL)
        return dt_emsg_set(em, DT_ENOENT, "%s: no tensor '%s'", r->path, name);
    if (r->fd < 0)
        return dt_emsg_set(em, DT_EINVAL, "%s: a header parsed from memory has no data", r->path);
    n = t->end - t->begin;
    if (dst_bytes != n)
        return dt_emsg_set(em, DT_ESHAPE, "%s: tensor '%s' is %" PRIu64 " bytes, the buffer %zu",
                           r->path, name, n, dst_bytes);
    got = dt_pread_full(r->fd, dst, n, r->data_start + (int64_t)t->begin);
    if (got < 0)
        return dt_emsg_set(em, (int)got, "%s: cannot read tensor '%s': %s", r->path, name,
                           dt_strerror((int)got));
    if ((uint64_t)got < n)
        return dt_emsg_set(em, DT_EFORMAT, "%s: tensor '%s' is truncated (file shrank?)", r->path,
                           name);
    return 0;
}

int dt_st_read_range(const dt_st_reader_t *r, const char *name, uint64_t from, void *dst,
                     size_t bytes, dt_emsg_t *em)
{
    const dt_st_tensor_t *t = dt_st_find(r, name);
    int64_t got;

    if (t == NULL)
        return dt_emsg_set(em, DT_ENOENT, "%s: no tensor '%s'", r->path, name);
    if (r->fd < 0)
        return dt_emsg_set(em, DT_EINVAL, "%s: a header parsed from memory has no data", r->path);
    if (from > t->end - t->begin || bytes > t->end - t->begin - from)
        return dt_emsg_set(em, DT_ESHAPE, "%s: bytes [%" PRIu64 ", +%zu) are outside tensor "
                           "'%s' (%" PRIu64 " bytes)", r->path, from, bytes, name,
                           t->end - t->begin);
    got = dt_pread_full(r->fd, dst, bytes, r->data_start + (int64_t)(t->begin + from));
    if (got < 0)
        return dt_emsg_set(em, (int)got, "%s: cannot read tensor '%s': %s", r->path, name,
                           dt_strerror((int)got));
    if ((uint64_t)got < bytes)
        return dt_emsg_set(em, DT_EFORMAT, "%s: tensor '%s' is truncated (file shrank?)", r->path,
                           name);
    return 0;
}

const char *dt_st_meta(const dt_st_reader_t *r, const char *key)
{
    for (size_t i = 0; i < r->nm; i++)
        if (strcmp(r->m[i].key, key) == 0)
            return r->m[i].value;
    return NULL;
}

size_t dt_st_meta_count(const dt_st_reader_t *r)
{
    return r->nm;
}

void dt_st_meta_at(const dt_st_reader_t *r, size_t i, const char **key, const char **value)
{
    *key = i < r->nm ? r->m[i].key : NULL;
    *value = i < r->nm ? r->m[i].value : NULL;
}
