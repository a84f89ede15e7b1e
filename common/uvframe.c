/* SPDX-License-Identifier: MIT
 *
 * The framed libuv reader (uvframe.h): one buffer per peer, grown only for
 * a frame whose header has been checked, compacted before each read, freed
 * whenever it empties.
 *
 * Not here: the decoder (msg.c), the streams themselves.
 */
#include "config.h"

#include <stdlib.h>
#include <string.h>

#include "common/mem.h"
#include "common/uvframe.h"

void dt_uvframe_init(dt_uvframe_t *f, size_t max)
{
    memset(f, 0, sizeof(*f));
    f->max = max < DT_MSG_MAX ? max : DT_MSG_MAX;
}

void dt_uvframe_close(dt_uvframe_t *f)
{
    free(f->buf);
    f->buf = NULL;
    f->off = f->len = f->cap = 0;
}

size_t dt_uvframe_buffered(const dt_uvframe_t *f)
{
    return f->len - f->off;
}

/* The frame at the front: its total size in *need when its header is here
 * and within max, else 0. */
static size_t front_need(const dt_uvframe_t *f)
{
    size_t need = 0;

    if (dt_msg_peek(f->buf + f->off, f->len - f->off, &need, NULL) != 0 ||
        need - DT_MSG_HDR > f->max)
        return 0;
    return need;
}

void dt_uvframe_alloc(dt_uvframe_t *f, uv_buf_t *b)
{
    size_t want = DT_UVFRAME_CHUNK, need;

    /* what was taken moves down once, here, not after every frame */
    if (f->off > 0) {
        memmove(f->buf, f->buf + f->off, f->len - f->off);
        f->len -= f->off;
        f->off = 0;
    }
    /* a big frame gets its room at once rather than a chunk per read */
    need = f->len > 0 ? front_need(f) : 0;
    if (need > f->len + want)
        want = need - f->len;
    if (f->cap - f->len < want) {
        f->cap = f->len + want;
        f->buf = dt_xrealloc(f->buf, f->cap);
    }
    *b = uv_buf_init((char *)f->buf + f->len, (unsigned)(f->cap - f->len));
}

void dt_uvframe_add(dt_uvframe_t *f, size_t n)
{
    f->len += n;
    if (f->len == f->off) /* nothing buffered: an idle peer holds no memory */
        dt_uvframe_close(f);
}

int dt_uvframe_next(dt_uvframe_t *f, dt_msg_t *m, dt_emsg_t *em)
{
    const uint8_t *p = f->buf + f->off;
    size_t n = f->len - f->off, need;
    int rc;

    memset(m, 0, sizeof(*m));
    if (n == 0)
        return 0;
    rc = dt_msg_peek(p, n, &need, em);
    if (rc == 1)
        return 0;
    if (rc == 0 && need - DT_MSG_HDR > f->max) {
        f->refused = need - DT_MSG_HDR;
        return dt_emsg_set(em, DT_ERANGE, "frame of %zu bytes exceeds the limit of %zu bytes",
                           f->refused, f->max);
    }
    rc = dt_msg_decode(p, n, m, em); /* also the malformed header's message */
    if (rc <= 0)
        return rc;
    f->off += (size_t)rc;
    if (f->off == f->len)
        dt_uvframe_close(f);
    return 1;
}

size_t dt_uvframe_take(dt_uvframe_t *f, const uint8_t **p, size_t max)
{
    size_t n = f->len - f->off;

    if (n > max)
        n = max;
    *p = n ? f->buf + f->off : NULL;
    f->off += n;
    return n;
}

void dt_uvframe_taken(dt_uvframe_t *f)
{
    if (f->buf != NULL && f->off == f->len)
        dt_uvframe_close(f);
}

int dt_uvframe_read(dt_uvframe_t *f, ssize_t nread, dt_uvframe_fn fn, void *ud, dt_emsg_t *em)
{
    dt_msg_t m;
    int rc;

    if (nread < 0) {
        if (dt_uvframe_buffered(f) > 0)
            dt_emsg_set(em, (int)nread, "stream ended with %zu bytes of an unfinished frame",
                        dt_uvframe_buffered(f));
        return (int)nread;
    }
    dt_uvframe_add(f, (size_t)nread);
    while ((rc = dt_uvframe_next(f, &m, em)) == 1) {
        rc = fn(ud, &m);
        dt_msg_clear(&m);
        if (rc != 0)
            return rc;
    }
    return rc;
}
