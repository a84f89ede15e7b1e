/* SPDX-License-Identifier: MIT
 *
 * Token shards (see tokshard.h for the contract). A shard's header is
 * untrusted: every field is checked, and the size against the count, before
 * a token is read. Tokens move with pread in bounded chunks and widen to
 * int32. This file assumes a little-endian host (every target of dt is one).
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
#include "io/tokshard.h"

_Static_assert(__BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__,
               "data.c reads header ints and tokens as they lie in memory");

#define CHUNK_TOKENS (64 * 1024)

const char *dt_tok_format_name(enum dt_tok_format f)
{
    return f == DT_TOK_U16 ? "uint16" : f == DT_TOK_U32 ? "uint32" : "unknown";
}

static size_t tok_size(enum dt_tok_format f)
{
    return f == DT_TOK_U16 ? 2 : 4;
}

/*-- file helpers -------------------------------------------------------------*/

/*-- one shard ----------------------------------------------------------------*/

struct dt_tok_shard {
    int fd;
    enum dt_tok_format fmt;
    int64_t ntok;
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

int dt_tok_parse_header(const char *name, const void *head, size_t n, int64_t file_size,
                        enum dt_tok_format *fmt, int64_t *ntok, dt_emsg_t *em)
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
        *fmt = DT_TOK_U16;
        if (hdr[1] != DT_TOK_VERSION_U16)
            return dt_emsg_set(em, DT_EFORMAT,
                               "%s: header[1] (version) is %" PRId32 ", magic %d needs version %d",
                               name, hdr[1], DT_TOK_MAGIC_U16, DT_TOK_VERSION_U16);
    } else if (hdr[0] == DT_TOK_MAGIC_U32) {
        *fmt = DT_TOK_U32;
        if (hdr[1] != DT_TOK_VERSION_U32)
            return dt_emsg_set(em, DT_EFORMAT,
                               "%s: header[1] (version) is %" PRId32 ", magic %d needs version %d",
                               name, hdr[1], DT_TOK_MAGIC_U32, DT_TOK_VERSION_U32);
    } else {
        return dt_emsg_set(em, DT_EFORMAT,
                           "%s: not a token shard: header[0] (magic) is %" PRId32
                           ", expected %d (uint16 tokens) or %d (uint32 tokens)",
                           name, hdr[0], DT_TOK_MAGIC_U16, DT_TOK_MAGIC_U32);
    }
    if (hdr[2] < 0)
        return dt_emsg_set(em, DT_EFORMAT, "%s: header[2] (token count) is negative: %" PRId32,
                           name, hdr[2]);
    /* at most (2^31 - 1) * 4 bytes: no overflow; have >= 0 from the test above */
    *ntok = hdr[2];
    need = *ntok * (int64_t)tok_size(*fmt);
    have = file_size - DT_TOK_HEADER_BYTES;
    if (have < need)
        return dt_emsg_set(em, DT_EFORMAT,
                           "%s: header[2] (token count) is %" PRId64 ": %" PRId64
                           " bytes of %s tokens, but the file has %" PRId64
                           " after the header (truncated?)",
                           name, *ntok, need, dt_tok_format_name(*fmt), have);
    if (have != need)
        return dt_emsg_set(em, DT_EFORMAT,
                           "%s: header[2] (token count) is %" PRId64 ": %" PRId64
                           " bytes of %s tokens, but the file has %" PRId64
                           " after the header (%" PRId64 " bytes of trailing data)",
                           name, *ntok, need, dt_tok_format_name(*fmt), have, have - need);
    return 0;
}

int dt_tok_shard_new(const char *path, dt_tok_shard_t **out, dt_emsg_t *em)
{
    int32_t hdr[DT_TOK_HEADER_INTS];
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
    if ((got = dt_pread_full(s->fd, hdr, sizeof(hdr), 0)) < 0) {
        rc = dt_emsg_set(em, (int)got, "%s: cannot read: %s", path, dt_strerror((int)got));
        goto fail;
    }
    if ((rc = dt_tok_parse_header(path, hdr, (size_t)got, st_size, &s->fmt, &s->ntok, em)) < 0)
        goto fail;
    *out = s;
    return 0;
fail:
    dt_tok_shard_free(s);
    return rc;
}

int64_t dt_tok_shard_ntok(const dt_tok_shard_t *s)
{
    return s->ntok;
}

enum dt_tok_format dt_tok_shard_format(const dt_tok_shard_t *s)
{
    return s->fmt;
}

const char *dt_tok_shard_path(const dt_tok_shard_t *s)
{
    return s->path;
}

int dt_tok_shard_read(const dt_tok_shard_t *s, int64_t first, int64_t n, int32_t *dst,
                      dt_emsg_t *em)
{
    size_t w = tok_size(s->fmt);
    unsigned char *buf;
    int rc = 0;

    if (first < 0 || n < 0 || first > s->ntok || n > s->ntok - first)
        return dt_emsg_set(em, DT_EINVAL,
                           "%s: tokens [%" PRId64 ", %" PRId64 ") are outside [0, %" PRId64 ")",
                           s->path, first, first + n, s->ntok);
    if (n == 0)
        return 0;
    buf = dt_xmallocarray(CHUNK_TOKENS, w);
    for (int64_t i = 0; i < n && rc == 0; i += CHUNK_TOKENS) {
        int64_t m = n - i < CHUNK_TOKENS ? n - i : CHUNK_TOKENS;
        int64_t off = DT_TOK_HEADER_BYTES + (first + i) * (int64_t)w;
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
        if (s->fmt == DT_TOK_U16) {
            const uint16_t *p = (const uint16_t *)buf;
            for (int64_t j = 0; j < m; j++)
                dst[i + j] = p[j];
        } else {
            const uint32_t *p = (const uint32_t *)buf;
            for (int64_t j = 0; j < m; j++) {
                if (p[j] > INT32_MAX) {
                    rc = dt_emsg_set(em, DT_EFORMAT,
                                     "%s: token %" PRId64 " is %" PRIu32
                                     ", larger than the int32 range",
                                     s->path, first + i + j, p[j]);
                    break;
                }
                dst[i + j] = (int32_t)p[j];
            }
        }
    }
    free(buf);
    return rc;
}

/*-- atomic writer -------------------------------------------------------------*/

int dt_tok_save(const char *path, enum dt_tok_format fmt, const int32_t *tok, int64_t n,
                dt_emsg_t *em)
{
    int32_t hdr[DT_TOK_HEADER_INTS] = { 0 };
    int64_t maxtok = fmt == DT_TOK_U16 ? 65535 : INT32_MAX;
    size_t w = tok_size(fmt);
    unsigned char *buf = NULL;
    dt_atomic_t af;
    int rc = 0;

    if (fmt != DT_TOK_U16 && fmt != DT_TOK_U32)
        return dt_emsg_set(em, DT_EINVAL, "%s: unknown token format %d", path, (int)fmt);
    if (n < 0 || n > INT32_MAX)
        return dt_emsg_set(em, DT_EINVAL, "%s: %" PRId64 " tokens do not fit header[2] (0 to %d)",
                           path, n, INT32_MAX);
    for (int64_t i = 0; i < n; i++)
        if (tok[i] < 0 || tok[i] > maxtok)
            return dt_emsg_set(em, DT_EINVAL,
                               "%s: token %" PRId64 " is %" PRId32 ", outside 0..%" PRId64
                               " of %s tokens",
                               path, i, tok[i], maxtok, dt_tok_format_name(fmt));
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
