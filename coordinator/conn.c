/* SPDX-License-Identifier: MIT
 *
 * Peer connections: accept (within the connection limits), identify
 * (SO_PEERCRED on the Unix socket; TCP peers stay anonymous until a valid
 * AUTH frame), read frames, dispatch, reply, close.
 *
 * Flow control, one rule for every path: a request is decoded only when
 * the peer's unsent replies are within output_soft_limit (and, before
 * authentication, when none is unsent at all), and the socket is read only
 * while a request could be decoded. A peer that does not read its replies
 * therefore stops being read, its requests wait in the kernel's buffers,
 * not ours, and the sweep closes it after output_timeout. Timestamps are
 * the loop's time (uv_now).
 */
#include "config.h"

#include <poll.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/socket.h>

#include "common/log.h"
#include "common/mem.h"
#include "common/msg.h"
#include "common/uvframe.h"
#include "common/wire.h"
#include "coordinator/auth.h"
#include "coordinator/conn.h"

/* ---- limits --------------------------------------------------------------- */

static size_t queued(const dt_conn_t *k)
{
    return k->h.stream.write_queue_size + k->writes * DT_COORD_WRITE_COST;
}

/* May the next request be decoded and answered now? */
static int may_serve(const dt_conn_t *k)
{
    if (k->closing || k->auth_pending)
        return 0;
    if (queued(k) > (size_t)k->coord->conf.output_soft_limit)
        return 0;
    return k->authed || k->writes == 0; /* one request in flight before AUTH */
}

static void on_alloc(uv_handle_t *h, size_t hint, uv_buf_t *b);
static void on_read(uv_stream_t *s, ssize_t n, const uv_buf_t *b);

/* Read while a request could be served; close above the hard limit. */
static void flow(dt_conn_t *k)
{
    const dt_coord_conf_t *cf = &k->coord->conf;
    size_t q;

    if (k->closing)
        return;
    q = queued(k);
    if (q > (size_t)cf->output_hard_limit) {
        dt_log_warn("peer=%s closed: %zu bytes of replies unsent, over output_hard_limit "
                    "(%lld)", k->peer, q, (long long)cf->output_hard_limit);
        dt_conn_close(k);
        return;
    }
    if (q > (size_t)cf->output_soft_limit) {
        if (k->over_ms == 0) {
            k->over_ms = uv_now(k->coord->loop);
            dt_log_debug("peer=%s %zu bytes of replies unsent, over output_soft_limit: not "
                         "reading its requests until they drain", k->peer, q);
        }
    } else {
        k->over_ms = 0;
    }
    int want = may_serve(k);
    if (want && !k->reading) {
        if (uv_read_start(&k->h.stream, on_alloc, on_read) < 0) {
            dt_conn_close(k);
            return;
        }
        k->reading = 1;
    } else if (!want && k->reading) {
        uv_read_stop(&k->h.stream);
        k->reading = 0;
    }
}

int64_t dt_conn_cap(const dt_coord_t *c)
{
    int64_t cap = c->conf.max_connections;
    struct rlimit rl;

    if (getrlimit(RLIMIT_NOFILE, &rl) == 0 && rl.rlim_cur != RLIM_INFINITY) {
        int64_t fit = (int64_t)rl.rlim_cur - DT_COORD_FD_RESERVE - DT_COORD_ROOT_RESERVE;
        if (fit < cap)
            cap = fit;
    }
    return cap > 0 ? cap : 1;
}

/* Room for one more connection? Root on the Unix socket has a reserve. */
static int admit_open(dt_conn_t *k, dt_emsg_t *em)
{
    const dt_coord_t *c = k->coord;
    int64_t cap = dt_conn_cap(c), open = 0;

    for (const dt_conn_t *x = c->conns; x; x = x->next)
        open += x != k && !x->closing;
    if (open < cap || (k->authed && k->uid == 0 && !k->tcp && open < cap + DT_COORD_ROOT_RESERVE))
        return 0;
    return dt_emsg_set(em, DT_ECOMM, "%lld connections open (max_connections %lld): try again "
                       "later", (long long)open, (long long)cap);
}

int dt_conn_admit(dt_conn_t *k, dt_emsg_t *em)
{
    const dt_coord_t *c = k->coord;
    int64_t mine = 0;

    if (!k->authed || k->uid == 0)
        return 0;
    for (const dt_conn_t *x = c->conns; x; x = x->next)
        mine += x != k && !x->closing && x->authed && x->uid == k->uid;
    if (mine < c->conf.max_connections_per_user)
        return 0;
    return dt_emsg_set(em, DT_ECOMM, "uid %u has %lld connections open "
                       "(max_connections_per_user %lld): try again later", (unsigned)k->uid,
                       (long long)mine, (long long)c->conf.max_connections_per_user);
}

/* A peer over the limits: tell it why, close it, count it for the sweep's
 * log line (a flood of refusals logs one line per sweep, not one each). */
static void refuse(dt_conn_t *k, const dt_emsg_t *em)
{
    dt_coord_t *c = k->coord;

    if (c->conns_refused++ == 0)
        dt_log_warn("peer=%s refused: %s", k->peer, em->s);
    else
        dt_log_debug("peer=%s refused: %s", k->peer, em->s);
    dt_conn_error(k, 0, DT_ECOMM, "the coordinator refused the connection: %s", em->s);
    dt_conn_close(k);
}

/* Did the peer hang up? For a peer that is not being read, whose EOF
 * libuv would not report. */
static int hung_up(dt_conn_t *k)
{
    uv_os_fd_t fd;
    struct pollfd p = { .events = POLLRDHUP };

    if (uv_fileno(&k->h.handle, &fd) < 0)
        return 1;
    p.fd = fd;
    return poll(&p, 1, 0) > 0 && (p.revents & (POLLRDHUP | POLLHUP | POLLERR));
}

/* Close with a reason for the peer (an ERROR frame, when it still reads)
 * and a log line naming it. */
static void expire(dt_conn_t *k, int code, const char *why, uint64_t ms)
{
    dt_log_warn("peer=%s closed: %s for %llu ms", k->peer, why, (unsigned long long)ms);
    if (code)
        dt_conn_error(k, 0, code, "closing the connection: %s for %llu ms", why,
                      (unsigned long long)ms);
    dt_conn_close(k);
}

void dt_conn_sweep(dt_coord_t *c)
{
    const dt_coord_conf_t *cf = &c->conf;
    uint64_t now = uv_now(c->loop);

    if (c->conns_refused > 1)
        dt_log_warn("%u more connections refused (max_connections %lld, "
                    "max_connections_per_user %lld)", c->conns_refused - 1,
                    (long long)dt_conn_cap(c), (long long)cf->max_connections_per_user);
    c->conns_refused = 0;
    for (dt_conn_t *k = c->conns; k; k = k->next) { /* closing unlinks later */
        if (k->closing || k->auth_pending)
            continue;
        if (k->over_ms && now - k->over_ms > (uint64_t)cf->output_timeout_ms)
            expire(k, 0, "replies unread, over output_soft_limit", now - k->over_ms);
        else if (k->over_ms && !k->reading && hung_up(k)) {
            dt_log_info("peer=%s went away with %zu bytes of replies unsent", k->peer,
                        queued(k));
            dt_conn_close(k);
        } else if (k->tcp && !k->authed && now - k->accepted_ms > (uint64_t)cf->auth_timeout_ms)
            expire(k, DT_ETIMEDOUT, "not authenticated (auth_timeout)", now - k->accepted_ms);
        else if (k->agent == 0 && k->over_ms == 0 &&
                 now - k->heard_ms > (uint64_t)cf->idle_timeout_ms)
            expire(k, DT_ETIMEDOUT, "silent (idle_timeout)", now - k->heard_ms);
    }
}

/* ---- connections ---------------------------------------------------------- */

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
    dt_uvframe_close(&k->rd);
    free(k);
}

void dt_conn_close(dt_conn_t *k)
{
    if (k->closing)
        return;
    k->closing = 1;
    k->reading = 0;
    if (k->agent) {
        dt_live_agent_t *a = dt_coord_agent_find(k->coord, k->agent);
        if (a && a->conn == k)
            a->conn = NULL; /* keeps heartbeating time; the sweep decides */
    }
    uv_close(&k->h.handle, on_closed);
}

static void on_written(uv_write_t *w, int status)
{
    dt_conn_t *k = w->handle->data;

    free(w->data);
    free(w);
    k->writes--;
    if (k->closing)
        return;
    if (status < 0) { /* the peer is gone, maybe while it was not being read */
        dt_log_info("peer=%s went away with %zu bytes of replies unsent (%s)", k->peer,
                    queued(k), uv_strerror(status));
        dt_conn_close(k);
        return;
    }
    if (dt_uvframe_buffered(&k->rd) > 0 && may_serve(k))
        dt_conn_process(k); /* requests held back while replies were unsent */
    else
        flow(k);
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
        return;
    }
    k->writes++;
    flow(k);
}

void dt_conn_error(dt_conn_t *k, uint32_t id, int code, const char *fmt, ...)
{
    char msg[512];
    va_list ap;

    va_start(ap, fmt);
    vsnprintf(msg, sizeof(msg), fmt, ap);
    va_end(ap);
    dt_wire_error_t e = { .code = code, .error = msg };
    dt_conn_reply(k, DT_MSG_ERROR, id, dt_wire_error_encode(&e));
}

/* Requests are small. Big frames are refused from the header alone (the
 * reader's cap): a JSON payload can cost ~80x its size once parsed, so the
 * cap is far below the protocol's, and tighter before authentication. */
static void read_cap(dt_conn_t *k)
{
    k->rd.max = k->authed ? DT_COORD_REQ_MAX : DT_COORD_PREAUTH_MAX;
}

/* The reader's buffer exists only while bytes are in it: an idle peer
 * holds none. */
static void on_alloc(uv_handle_t *h, size_t hint, uv_buf_t *b)
{
    dt_conn_t *k = h->data;

    (void)hint;
    read_cap(k);
    dt_uvframe_alloc(&k->rd, b);
}

void dt_conn_process(dt_conn_t *k)
{
    dt_emsg_t em = { "" };

    while (dt_uvframe_buffered(&k->rd) > 0 && may_serve(k)) {
        dt_msg_t m;
        read_cap(k);
        int rc = dt_uvframe_next(&k->rd, &m, &em);
        if (rc == 0)
            break;
        if (rc == DT_ERANGE) {
            dt_log_warn("peer=%s request of %zu bytes refused", k->peer, k->rd.refused);
            dt_conn_error(k, 0, DT_ERANGE, "request of %zu bytes exceeds the coordinator's limit "
                          "of %u bytes%s", k->rd.refused,
                          k->authed ? DT_COORD_REQ_MAX : DT_COORD_PREAUTH_MAX,
                          k->authed ? "" : " before authentication");
            dt_conn_close(k);
            return;
        }
        if (rc < 0) {
            dt_log_warn("peer=%s protocol error: %s", k->peer, em.s);
            dt_conn_error(k, 0, DT_EPROTO, "protocol error: %s", em.s);
            dt_conn_close(k);
            return;
        }
        if (!k->authed && ++k->preauth > DT_COORD_PREAUTH_FRAMES) {
            dt_log_warn("peer=%s closed: more than %d requests before authenticating", k->peer,
                        DT_COORD_PREAUTH_FRAMES);
            dt_conn_error(k, m.id, DT_EACCES, "more than %d requests before authentication: "
                          "send AUTH with a munge credential", DT_COORD_PREAUTH_FRAMES);
            dt_msg_clear(&m);
            dt_conn_close(k);
            return;
        }
        k->coord->hooks->dispatch(k, &m);
        dt_msg_clear(&m);
    }
    if (k->closing)
        return;
    flow(k);
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
    dt_uvframe_add(&k->rd, (size_t)n); /* n == 0: nothing after all */
    if (n == 0)
        return;
    k->heard_ms = uv_now(k->coord->loop);
    dt_conn_process(k);
}

void dt_conn_pause(dt_conn_t *k)
{
    flow(k);
}

void dt_conn_accept(dt_coord_t *c, uv_stream_t *server, int tcp)
{
    dt_conn_t *k = dt_xcalloc(1, sizeof(*k));
    dt_emsg_t em = { "" };
    int rc;

    k->coord = c;
    k->tcp = tcp;
    k->accepted_ms = k->heard_ms = uv_now(c->loop);
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
        pid_t pid = 0;
        if (dt_auth_peercred(&k->h.stream, &k->uid, &k->gid, &pid) < 0) {
            dt_log_warn("unix peer without credentials: closing");
            dt_conn_close(k);
            return;
        }
        k->authed = 1;
        snprintf(k->peer, sizeof(k->peer), "uid=%u pid=%ld", (unsigned)k->uid, (long)pid);
    }
    if (admit_open(k, &em) < 0 || dt_conn_admit(k, &em) < 0) {
        refuse(k, &em);
        return;
    }
    flow(k);
}
