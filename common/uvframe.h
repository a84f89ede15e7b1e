/* SPDX-License-Identifier: MIT
 *
 * The framed reader every libuv peer of the dt protocol uses (the
 * coordinator's connections, the agent's coordinator link and its worker
 * channels): it owns the buffer libuv reads into, accumulates bytes across
 * reads, and hands out whole frames decoded by the pure decoder of msg.h.
 *
 * Memory is bounded: a frame whose header announces a payload above `max`
 * is refused from the header alone (DT_ERANGE), before the buffer grows for
 * it, so a reader holds at most DT_MSG_HDR + max + DT_UVFRAME_CHUNK bytes;
 * and the buffer exists only while bytes are in it (an idle peer holds
 * none). After DT_ERANGE or DT_EPROTO the stream cannot be resynchronised:
 * the owner closes it.
 *
 * Two ways to use it. A peer that takes every frame as it comes calls
 * dt_uvframe_read from its read callback with a per-frame callback. A peer
 * with flow control of its own (dtcoordd's connections) calls
 * dt_uvframe_add there, and takes frames with dt_uvframe_next while it may.
 * Either way the owner calls dt_uvframe_alloc from its alloc callback; the
 * reader never touches the stream or handle->data, and never closes
 * anything itself. Loop thread only.
 *
 * Not here: the frame format and its checks (msg.h), writing, what frames
 * mean.
 */
#ifndef DT_UVFRAME_H
#define DT_UVFRAME_H

#include <stddef.h>
#include <stdint.h>
#include <uv.h>

#include "common/err.h"
#include "common/macros.h"
#include "common/msg.h"

/* Free room asked of the buffer for each read. */
#define DT_UVFRAME_CHUNK (64u << 10)

typedef struct dt_uvframe {
    uint8_t *buf;   /* received bytes, owned; NULL while none are buffered */
    size_t off;     /* buf[off..len) is not decoded yet */
    size_t len, cap;
    size_t max;     /* largest payload taken, at most DT_MSG_MAX; may change between frames */
    size_t refused; /* after DT_ERANGE: the payload size the refused header announced */
} dt_uvframe_t;

/* Start empty, taking payloads of at most max bytes (capped to DT_MSG_MAX). */
void dt_uvframe_init(dt_uvframe_t *f, size_t max);
/* Free the buffer; the reader is empty again (and may be used again). */
void dt_uvframe_close(dt_uvframe_t *f);
/* Bytes received and not yet taken as frames. */
size_t dt_uvframe_buffered(const dt_uvframe_t *f);

/* For uv_read_start's alloc callback: *b is room for at least
 * DT_UVFRAME_CHUNK bytes (or the rest of the frame whose header has
 * arrived, if more) after those buffered. The memory stays the reader's. */
void dt_uvframe_alloc(dt_uvframe_t *f, uv_buf_t *b);

/* For the read callback of a peer that takes frames itself: account n >= 0
 * bytes libuv read into the room dt_uvframe_alloc gave; call it for n == 0
 * (EAGAIN) too, so that an empty buffer is freed. */
void dt_uvframe_add(dt_uvframe_t *f, size_t n);

/* Take the next whole frame. Returns 1 with *m filled (the caller releases
 * it with dt_msg_clear), 0 when more bytes are needed (*m zeroed), or, with
 * a message in em: DT_ERANGE when the header announces more than max bytes
 * (f->refused says how many), DT_EPROTO when the frame is malformed
 * (dt_msg_decode's message). Errors repeat on every later call. */
DT_MUST_CHECK int dt_uvframe_next(dt_uvframe_t *f, dt_msg_t *m, dt_emsg_t *em);

/* For a stream that carries raw bytes after a frame (the agents' peer
 * channel): up to max of the bytes buffered after the frames taken, *p
 * pointing at them (valid until dt_uvframe_taken or the next call that
 * changes the buffer); they count as taken. dt_uvframe_taken frees the
 * buffer once it is all taken. */
size_t dt_uvframe_take(dt_uvframe_t *f, const uint8_t **p, size_t max);
void dt_uvframe_taken(dt_uvframe_t *f);

/* One frame for a dt_uvframe_read caller: the message is borrowed for the
 * call (cleared after it). Return 0 for the next frame, or a positive
 * value to stop here (the owner closed or paused the stream): bytes left
 * stay buffered. It may call dt_uvframe_close on the reader (reconnect), not
 * free it: free the reader in the stream's close callback. */
typedef int (*dt_uvframe_fn)(void *ud, dt_msg_t *m);

/* The whole read callback of a peer that takes every frame: nread and the
 * buffer as libuv passed them (b must come from dt_uvframe_alloc, or be
 * empty); call it for nread == 0 too (libuv's EAGAIN), so that the room
 * given is freed when nothing is buffered. Returns:
 *   0          every whole frame was handed to fn (a partial one waits);
 *   > 0        what fn returned to stop;
 *   nread < 0  as it came (UV_EOF, or a libuv error): the peer is gone,
 *              nothing is delivered; when bytes of an unfinished frame were
 *              buffered, em says how many (they stay until close);
 *   DT_ERANGE, DT_EPROTO  as dt_uvframe_next, for the first bad frame;
 *              the frames before it were delivered. */
DT_MUST_CHECK int dt_uvframe_read(dt_uvframe_t *f, ssize_t nread, dt_uvframe_fn fn, void *ud,
                                  dt_emsg_t *em);

#endif /* DT_UVFRAME_H */
