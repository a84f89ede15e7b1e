/* SPDX-License-Identifier: MIT
 *
 * Unit tests for common/uvframe: a real libuv pipe over a socketpair, the
 * test writing to the other end. Whole frames come out as they were sent;
 * frames written a byte at a time come out once each is complete, and not
 * before; two frames in one read come out in order from that read; a
 * header announcing more than the reader's cap is refused from the header
 * alone, before the buffer grows; a stream that ends in the middle of a
 * frame reports the end and delivers nothing partial; a malformed header is
 * DT_EPROTO with the decoder's message; a callback that stops leaves the
 * rest buffered; an idle reader holds no buffer.
 */
#include "config.h"

#include <criterion/criterion.h>
#include <fcntl.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "common/uvframe.h"

#define MAXF 8

typedef struct rig {
    uv_loop_t loop;
    uv_pipe_t pipe;
    int peer;                 /* the test's end: write(2) here */
    dt_uvframe_t f;
    int reads, frames, stop_after, ended;
    int rc;                   /* dt_uvframe_read's last answer */
    size_t max_cap;           /* the largest buffer the reader held */
    uint16_t type[MAXF];
    uint32_t id[MAXF];
    dt_emsg_t em;
} rig_t;

static void on_alloc(uv_handle_t *h, size_t hint, uv_buf_t *b)
{
    rig_t *r = h->data;
    (void)hint;
    dt_uvframe_alloc(&r->f, b);
    if (r->f.cap > r->max_cap)
        r->max_cap = r->f.cap;
}

static int on_frame(void *ud, dt_msg_t *m)
{
    rig_t *r = ud;
    if (r->frames < MAXF) {
        r->type[r->frames] = m->type;
        r->id[r->frames] = m->id;
    }
    r->frames++;
    return r->stop_after && r->frames >= r->stop_after ? 1 : 0;
}

static void on_read(uv_stream_t *s, ssize_t n, const uv_buf_t *b)
{
    rig_t *r = s->data;
    (void)b;
    /* n == 0 (EAGAIN) too: the room alloc gave is freed when nothing is buffered */
    r->rc = dt_uvframe_read(&r->f, n, on_frame, r, &r->em);
    if (n == 0)
        return;
    r->reads++;
    if (n < 0 || r->rc != 0) {
        r->ended = 1;
        uv_read_stop(s);
    }
}

static void rig_init(rig_t *r, size_t max)
{
    int sv[2];

    memset(r, 0, sizeof(*r));
    cr_assert_eq(socketpair(AF_UNIX, SOCK_STREAM, 0, sv), 0);
    cr_assert_eq(uv_loop_init(&r->loop), 0);
    cr_assert_eq(uv_pipe_init(&r->loop, &r->pipe, 0), 0);
    cr_assert_eq(uv_pipe_open(&r->pipe, sv[0]), 0);
    r->pipe.data = r;
    r->peer = sv[1];
    dt_uvframe_init(&r->f, max);
    cr_assert_eq(uv_read_start((uv_stream_t *)&r->pipe, on_alloc, on_read), 0);
}

static void rig_close(rig_t *r)
{
    if (r->peer >= 0)
        close(r->peer);
    uv_close((uv_handle_t *)&r->pipe, NULL);
    uv_run(&r->loop, UV_RUN_DEFAULT);
    cr_assert_eq(uv_loop_close(&r->loop), 0);
    dt_uvframe_close(&r->f);
}

/* Write n bytes to the peer end and run the loop until they were read. */
static void pump(rig_t *r, const void *p, size_t n)
{
    int before = r->reads;
    cr_assert_eq(write(r->peer, p, n), (ssize_t)n);
    while (r->reads == before && !r->ended)
        uv_run(&r->loop, UV_RUN_ONCE);
}

static uint8_t *frame(uint16_t type, uint32_t id, const char *json, size_t *n)
{
    json_t *body = json ? json_loads(json, 0, NULL) : NULL;
    uint8_t *out = NULL;
    cr_assert_eq(dt_msg_encode(type, id, body, &out, n), 0);
    json_decref(body);
    return out;
}

/* A PING header announcing len payload bytes (none follow). */
static void header(uint8_t h[DT_MSG_HDR], uint32_t magic, uint32_t len)
{
    const uint32_t w[4] = { magic, (uint32_t)DT_PROTO_VERSION << 16 | DT_MSG_PING, 7, len };
    for (int i = 0; i < 4; i++)
        for (int b = 0; b < 4; b++)
            h[4 * i + b] = (uint8_t)(w[i] >> (24 - 8 * b));
}

Test(uvframe, whole_frames)
{
    rig_t r;
    size_t n;
    uint8_t *a = frame(DT_MSG_PING, 1, "{\"x\": 1}", &n);

    rig_init(&r, DT_MSG_MAX);
    pump(&r, a, n);
    cr_assert_eq(r.rc, 0);
    cr_assert_eq(r.frames, 1);
    cr_assert_eq(r.type[0], DT_MSG_PING);
    cr_assert_eq(r.id[0], 1);
    cr_assert_eq(dt_uvframe_buffered(&r.f), 0);
    cr_assert_null(r.f.buf, "an idle reader holds no buffer");
    free(a);
    rig_close(&r);
}

Test(uvframe, frames_split_byte_by_byte)
{
    rig_t r;
    size_t na, nb;
    uint8_t *a = frame(DT_MSG_PING, 1, "{\"name\": \"first\"}", &na);
    uint8_t *b = frame(DT_MSG_OK, 2, NULL, &nb);
    uint8_t *all = malloc(na + nb);

    memcpy(all, a, na);
    memcpy(all + na, b, nb);
    rig_init(&r, DT_MSG_MAX);
    for (size_t i = 0; i < na + nb; i++) {
        pump(&r, all + i, 1);
        cr_assert_eq(r.rc, 0, "byte %zu: rc %d", i, r.rc);
        int want = (i + 1 >= na) + (i + 1 >= na + nb);
        cr_assert_eq(r.frames, want, "after byte %zu: %d frames, want %d", i, r.frames, want);
    }
    cr_assert_eq(r.type[0], DT_MSG_PING);
    cr_assert_eq(r.id[0], 1);
    cr_assert_eq(r.type[1], DT_MSG_OK);
    cr_assert_eq(r.id[1], 2);
    cr_assert_null(r.f.buf);
    free(all);
    free(a);
    free(b);
    rig_close(&r);
}

Test(uvframe, two_frames_in_one_read)
{
    rig_t r;
    size_t na, nb;
    uint8_t *a = frame(DT_MSG_PING, 5, NULL, &na);
    uint8_t *b = frame(DT_MSG_PING, 6, "{\"y\": [1, 2, 3]}", &nb);
    uint8_t *all = malloc(na + nb);

    memcpy(all, a, na);
    memcpy(all + na, b, nb);
    rig_init(&r, DT_MSG_MAX);
    pump(&r, all, na + nb);
    cr_assert_eq(r.reads, 1);
    cr_assert_eq(r.frames, 2);
    cr_assert_eq(r.id[0], 5);
    cr_assert_eq(r.id[1], 6);
    cr_assert_null(r.f.buf);
    free(all);
    free(a);
    free(b);
    rig_close(&r);
}

Test(uvframe, oversize_header_refused_without_growing)
{
    rig_t r;
    uint8_t h[DT_MSG_HDR];

    rig_init(&r, 1024);
    header(h, DT_PROTO_MAGIC, 1u << 20);
    pump(&r, h, sizeof(h));
    cr_assert_eq(r.rc, DT_ERANGE);
    cr_assert_eq(r.f.refused, 1u << 20);
    cr_assert_str_eq(r.em.s, "frame of 1048576 bytes exceeds the limit of 1024 bytes");
    cr_assert_eq(r.frames, 0);
    cr_assert_leq(r.max_cap, DT_UVFRAME_CHUNK, "the buffer grew to %zu", r.max_cap);
    /* asked again (an owner that reads on), it refuses again and stays small */
    uv_buf_t b;
    dt_uvframe_alloc(&r.f, &b);
    cr_assert_leq(r.f.cap, DT_MSG_HDR + DT_UVFRAME_CHUNK);
    dt_msg_t m;
    cr_assert_eq(dt_uvframe_next(&r.f, &m, &r.em), DT_ERANGE);
    rig_close(&r);
}

Test(uvframe, big_frame_within_the_cap_is_taken)
{
    rig_t r;
    size_t n, plen = 3u << 20;
    char *json = malloc(plen + 16);

    snprintf(json, 16, "{\"s\": \"");
    memset(json + 7, 'a', plen);
    strcpy(json + 7 + plen, "\"}");
    uint8_t *a = frame(DT_MSG_PING, 9, json, &n);
    rig_init(&r, DT_MSG_MAX);
    /* more than the socket holds: write what fits, let the loop read it */
    cr_assert_eq(fcntl(r.peer, F_SETFL, O_NONBLOCK), 0);
    for (size_t off = 0; off < n || r.frames == 0;) {
        ssize_t w = off < n ? write(r.peer, a + off, n - off) : 0;
        if (w > 0)
            off += (size_t)w;
        uv_run(&r.loop, UV_RUN_NOWAIT);
    }
    cr_assert_eq(r.rc, 0);
    cr_assert_eq(r.frames, 1);
    cr_assert_eq(r.id[0], 9);
    cr_assert_leq(r.max_cap, n + DT_UVFRAME_CHUNK, "the buffer grew to %zu", r.max_cap);
    cr_assert_null(r.f.buf);
    free(a);
    free(json);
    rig_close(&r);
}

Test(uvframe, eof_mid_frame)
{
    rig_t r;
    size_t n;
    uint8_t *a = frame(DT_MSG_PING, 3, "{\"z\": \"half of it\"}", &n);

    rig_init(&r, DT_MSG_MAX);
    pump(&r, a, n / 2);
    cr_assert_eq(r.frames, 0);
    close(r.peer);
    r.peer = -1;
    while (!r.ended)
        uv_run(&r.loop, UV_RUN_ONCE);
    cr_assert_eq(r.rc, UV_EOF);
    cr_assert_eq(r.frames, 0);
    cr_assert_eq(dt_uvframe_buffered(&r.f), n / 2);
    char want[128];
    snprintf(want, sizeof(want), "stream ended with %zu bytes of an unfinished frame", n / 2);
    cr_assert_str_eq(r.em.s, want);
    free(a);
    rig_close(&r);
}

Test(uvframe, malformed_header_is_eproto)
{
    rig_t r;
    uint8_t h[DT_MSG_HDR];

    rig_init(&r, DT_MSG_MAX);
    header(h, 0x12345678, 0);
    pump(&r, h, sizeof(h));
    cr_assert_eq(r.rc, DT_EPROTO);
    cr_assert_str_eq(r.em.s, "bad magic 0x12345678, expected 0x44545031 (\"DTP1\")");
    cr_assert_eq(r.frames, 0);
    rig_close(&r);
}

Test(uvframe, callback_stops_and_the_rest_stays)
{
    rig_t r;
    size_t na, nb;
    uint8_t *a = frame(DT_MSG_PING, 1, NULL, &na);
    uint8_t *b = frame(DT_MSG_PING, 2, NULL, &nb);
    uint8_t *all = malloc(na + nb);

    memcpy(all, a, na);
    memcpy(all + na, b, nb);
    rig_init(&r, DT_MSG_MAX);
    r.stop_after = 1;
    pump(&r, all, na + nb);
    cr_assert_eq(r.rc, 1);
    cr_assert_eq(r.frames, 1);
    cr_assert_eq(dt_uvframe_buffered(&r.f), nb);
    dt_msg_t m;
    cr_assert_eq(dt_uvframe_next(&r.f, &m, &r.em), 1);
    cr_assert_eq(m.id, 2);
    dt_msg_clear(&m);
    cr_assert_eq(dt_uvframe_next(&r.f, &m, &r.em), 0);
    cr_assert_null(r.f.buf);
    free(all);
    free(a);
    free(b);
    rig_close(&r);
}
