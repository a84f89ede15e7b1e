/* SPDX-License-Identifier: MIT
 *
 * Peer connections: accept, identify (SO_PEERCRED on the Unix socket; TCP
 * peers stay anonymous until a valid AUTH frame), read frames, dispatch,
 * reply, close.
 */
#include "config.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>

#include "common/log.h"
#include "common/mem.h"
#include "common/msg.h"
#include "coordinator/auth.h"
#include "coordinator/conn.h"
#include "coordinator/rpc.h"

static void on_closed(uv_handle_t *h)
{
    dt_conn_t *k = h->data;
    dt_coord_t *c = k->coord;

    for (dt_conn_t **p = &c->conns; *p; p = &(*p)->next)
        if (*p == k) {
            *p = k->next;
            break;
        }
    if (k->auth_pending) { /* the thread pool still holds k: auth_done frees it */
        k->closed = 1;
        return;
    }
    free(k->buf);
    free(k);
}

void dt_conn_close(dt_conn_t *k)
{
    if (k->closing)
        return;
    k->closing = 1;
    if (k->agent) {
        dt_live_agent_t *a = dt_coord_agent_find(k->coord, k->agent);
        if (a && a->conn == k)
            a->conn = NULL; /* keeps heartbeating time; the sweep decides */
    }
    uv_close(&k->h.handle, on_closed);
}

static void on_written(uv_write_t *w, int status)
{
    free(w->data);
    free(w);
    (void)status; /* a dead peer is noticed by the read side */
}

void dt_conn_reply(dt_conn_t *k, uint16_t type, uint32_t id, json_t *body)
{
    uint8_t *frame;
    size_t len;

    if (k->closing) {
        json_decref(body);
        return;
    }
    if (dt_msg_encode(type, id, body, &frame, &len) < 0) {
        json_decref(body);
        dt_conn_error(k, id, DT_ERANGE, "reply exceeds the frame limit");
        return;
    }
    json_decref(body);
    uv_write_t *w = dt_xmalloc(sizeof(*w));
    uv_buf_t b = uv_buf_init((char *)frame, (unsigned)len);
    w->data = frame;
    if (uv_write(w, &k->h.stream, &b, 1, on_written) < 0) {
        free(frame);
        free(w);
        dt_conn_close(k);
    }
}

void dt_conn_error(dt_conn_t *k, uint32_t id, int code, const char *fmt, ...)
{
    char msg[512];
    va_list ap;

    va_start(ap, fmt);
    vsnprintf(msg, sizeof(msg), fmt, ap);
    va_end(ap);
    dt_conn_reply(k, DT_MSG_ERROR, id, json_pack("{s:i, s:s}", "code", code, "error", msg));
}

static void on_alloc(uv_handle_t *h, size_t hint, uv_buf_t *b)
{
    dt_conn_t *k = h->data;
    size_t want = 64 * 1024;

    (void)hint;
    if (k->cap - k->len < want) {
        k->cap = k->len + want;
        k->buf = dt_xrealloc(k->buf, k->cap);
    }
    *b = uv_buf_init((char *)k->buf + k->len, (unsigned)(k->cap - k->len));
}

void dt_conn_process(dt_conn_t *k)
{
    dt_emsg_t em = { "" };

    while (!k->closing && !k->auth_pending && k->len > 0) {
        dt_msg_t m;
        size_t need;
        /* Requests are small. Refuse big frames from the header alone: a
         * JSON payload can cost ~80x its size once parsed, so the cap is
         * far below the protocol's, and tighter before authentication. */
        if (dt_msg_peek(k->buf, k->len, &need, &em) == 0 &&
            need - DT_MSG_HDR > (k->authed ? DT_COORD_REQ_MAX : DT_COORD_PREAUTH_MAX)) {
            dt_log_warn("peer=%s request of %zu bytes refused", k->peer, need - DT_MSG_HDR);
            dt_conn_error(k, 0, DT_ERANGE, "request of %zu bytes exceeds the coordinator's limit "
                          "of %u bytes%s", need - DT_MSG_HDR,
                          k->authed ? DT_COORD_REQ_MAX : DT_COORD_PREAUTH_MAX,
                          k->authed ? "" : " before authentication");
            dt_conn_close(k);
            return;
        }
        int used = dt_msg_decode(k->buf, k->len, &m, &em);
        if (used == 0)
            break;
        if (used < 0) {
            dt_log_warn("peer=%s protocol error: %s", k->peer, em.s);
            dt_conn_error(k, 0, DT_EPROTO, "protocol error: %s", em.s);
            dt_conn_close(k);
            return;
        }
        dt_rpc_dispatch(k, &m);
        dt_msg_clear(&m);
        memmove(k->buf, k->buf + used, k->len - (size_t)used);
        k->len -= (size_t)used;
    }
    /* do not keep a large buffer around between frames */
    if (k->len == 0 && k->cap > 256 * 1024) {
        free(k->buf);
        k->buf = NULL;
        k->cap = 0;
    }
}

static void on_read(uv_stream_t *s, ssize_t n, const uv_buf_t *b)
{
    dt_conn_t *k = s->data;

    (void)b;
    if (n < 0) {
        if (n != UV_EOF)
            dt_log_debug("peer=%s read failed: %s", k->peer, uv_strerror((int)n));
        dt_conn_close(k);
        return;
    }
    k->len += (size_t)n;
    dt_conn_process(k);
}

void dt_conn_pause(dt_conn_t *k)
{
    if (!k->closing)
        uv_read_stop(&k->h.stream);
}

void dt_conn_resume(dt_conn_t *k)
{
    if (!k->closing && uv_read_start(&k->h.stream, on_alloc, on_read) < 0)
        dt_conn_close(k);
}

void dt_conn_accept(dt_coord_t *c, uv_stream_t *server, int tcp)
{
    dt_conn_t *k = dt_xcalloc(1, sizeof(*k));
    int rc;

    k->coord = c;
    k->tcp = tcp;
    if (tcp)
        rc = uv_tcp_init(c->loop, &k->h.tcp);
    else
        rc = uv_pipe_init(c->loop, &k->h.pipe, 0);
    if (rc < 0) {
        free(k);
        return;
    }
    k->h.handle.data = k;
    k->next = c->conns;
    c->conns = k;
    if ((rc = uv_accept(server, &k->h.stream)) < 0) {
        dt_log_warn("accept failed: %s", uv_strerror(rc));
        dt_conn_close(k);
        return;
    }
    if (tcp) {
        struct sockaddr_storage ss;
        int len = sizeof(ss);
        char host[48] = "?";
        int port = 0;
        uv_tcp_nodelay(&k->h.tcp, 1);
        if (uv_tcp_getpeername(&k->h.tcp, (struct sockaddr *)&ss, &len) == 0) {
            if (ss.ss_family == AF_INET) {
                uv_ip4_name((struct sockaddr_in *)&ss, host, sizeof(host));
                port = ntohs(((struct sockaddr_in *)&ss)->sin_port);
            } else if (ss.ss_family == AF_INET6) {
                uv_ip6_name((struct sockaddr_in6 *)&ss, host, sizeof(host));
                port = ntohs(((struct sockaddr_in6 *)&ss)->sin6_port);
            }
        }
        snprintf(k->peer, sizeof(k->peer), "%s:%d", host, port);
    } else {
        if (dt_auth_peercred(&k->h.stream, &k->uid, &k->gid) < 0) {
            dt_log_warn("unix peer without credentials: closing");
            dt_conn_close(k);
            return;
        }
        k->authed = 1;
        snprintf(k->peer, sizeof(k->peer), "uid=%u", (unsigned)k->uid);
    }
    if ((rc = uv_read_start(&k->h.stream, on_alloc, on_read)) < 0)
        dt_conn_close(k);
}
