/* SPDX-License-Identifier: MIT
 *
 * The agent-to-agent channel for in-memory checkpoint replicas (peer.h):
 * the listener, inbound connections (AUTH, then replicas to hold or
 * fetches to answer), and outbound ones (a target's replica queue, or one
 * fetch).
 */
#include "config.h"

#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "agent/peer.h"
#include "common/clock.h"
#include "common/cred.h"
#include "common/log.h"
#include "common/mem.h"
#include "common/msg.h"
#include "common/proto.h"
#include "common/sha256.h"
#include "common/uvframe.h"
#include "common/wire.h"

#define CHUNK (1u << 20)         /* bytes read or written at a time */
#define MAX_INBOUND 64           /* connections from other agents at once */
#define FRAME_MAX (64u << 10)    /* the peer channel's frames are small */
#define RETRY_MS 5000            /* a target that failed is not tried again before */

typedef struct outcopy {
    int rank;
    int64_t step, bytes;
    int fd; /* dup'ed; -1 none */
    char sha[65];
} outcopy_t;

typedef struct conn conn_t;
struct conn {
    dt_peer_t *p;
    union {
        uv_handle_t handle;
        uv_stream_t stream;
        uv_tcp_t tcp;
        uv_pipe_t pipe;
    } h;
    int unix_sock; /* a Unix socket: the kernel says who the peer is */
    uv_connect_t creq;
    uv_shutdown_t sreq;
    int outbound;  /* we connected to addr */
    int connected; /* outbound: connected and AUTH sent */
    int authed;    /* inbound: its AUTH was taken */
    int ending;    /* closing after what was written */
    int closed;    /* conn_close ran */
    char addr[300];
    dt_uvframe_t rd;
    /* raw bytes being received: a replica, or a fetch's answer */
    int raw, raw_fd, raw_slot;
    int64_t raw_rank, raw_step, raw_bytes, raw_off;
    char raw_sha[65];
    dt_sha256_t *raw_ctx;
    uint8_t *rawbuf;
    /* sending: what is queued (the newest per rank) and the one in flight */
    outcopy_t *q;
    int nq, capq;
    int sending;
    outcopy_t cur;
    int64_t sent;
    uint8_t *sendbuf;
    /* an outbound fetch: its rank, step and where it goes */
    int fetch, fetch_rank, fetch_fd, fetch_ended;
    int64_t fetch_step;
    conn_t *next;
};

typedef struct failed {
    char addr[300];
    int64_t until_ms;
    struct failed *next;
} failed_t;

struct dt_peer {
    uv_loop_t *loop;
    int64_t job;
    uid_t uid;
    const char *munge_socket;
    dt_peer_hooks_t h;
    union {
        uv_handle_t handle;
        uv_stream_t stream;
        uv_tcp_t tcp;
        uv_pipe_t pipe;
    } srv;
    int srv_open, unix_srv;
    char *srv_path; /* the Unix socket's path, removed at close */
    char addr[300];
    conn_t *conns;
    int ninbound;
    failed_t *failed;
};

static void kick(conn_t *c);

/*-- connections ---------------------------------------------------------------*/

static void conn_unlink(conn_t *c)
{
    dt_peer_t *p = c->p;
    for (conn_t **pp = &p->conns; *pp; pp = &(*pp)->next)
        if (*pp == c) {
            *pp = c->next;
            break;
        }
}

static void copy_drop(outcopy_t *o)
{
    if (o->fd >= 0)
        close(o->fd);
    o->fd = -1;
}

static void conn_closed(uv_handle_t *h)
{
    conn_t *c = h->data;

    dt_uvframe_close(&c->rd);
    for (int i = 0; i < c->nq; i++)
        copy_drop(&c->q[i]);
    if (c->sending)
        copy_drop(&c->cur);
    if (c->raw_fd >= 0)
        close(c->raw_fd);
    if (c->fetch_fd >= 0)
        close(c->fetch_fd);
    dt_sha256_free(c->raw_ctx);
    free(c->q);
    free(c->rawbuf);
    free(c->sendbuf);
    free(c);
}

/* Close c (once): unlinked, counted out, its handle closed. */
static void conn_close(conn_t *c)
{
    if (c->closed)
        return;
    c->closed = 1;
    if (!c->outbound)
        c->p->ninbound--;
    conn_unlink(c);
    uv_close(&c->h.handle, conn_closed);
}

/* Remember that addr failed: no new connection to it for RETRY_MS. */
static void mark_failed(dt_peer_t *p, const char *addr)
{
    failed_t *f;
    for (f = p->failed; f && strcmp(f->addr, addr) != 0; f = f->next)
        ;
    if (f == NULL) {
        f = dt_xcalloc(1, sizeof(*f));
        snprintf(f->addr, sizeof(f->addr), "%s", addr);
        f->next = p->failed;
        p->failed = f;
    }
    f->until_ms = dt_clock_mono_ms() + RETRY_MS;
}

static int recently_failed(const dt_peer_t *p, const char *addr)
{
    for (const failed_t *f = p->failed; f; f = f->next)
        if (strcmp(f->addr, addr) == 0)
            return dt_clock_mono_ms() < f->until_ms;
    return 0;
}

/* Close c now; what it was doing fails with why (reported once). */
static void conn_fail(conn_t *c, const char *why)
{
    dt_peer_t *p = c->p;

    if (c->closed)
        return;
    if (c->fetch && !c->fetch_ended) {
        c->fetch_ended = 1;
        p->h.fetched(p->h.ud, c->fetch_rank, c->fetch_step, 0, 0, "", why);
    }
    if (c->outbound && !c->fetch && (c->sending || c->nq > 0)) {
        outcopy_t *o = c->sending ? &c->cur : &c->q[0];
        dt_log_warn("replica of rank %d step %" PRId64 " to %s: %s", o->rank, o->step, c->addr,
                    why);
        p->h.send_failed(p->h.ud, o->rank, o->step, why);
        mark_failed(p, c->addr);
    }
    conn_close(c);
}

static void shut_cb(uv_shutdown_t *r, int status)
{
    (void)status;
    conn_close(r->data);
}

/* Close c once what was written has gone. */
static void conn_end(conn_t *c)
{
    if (c->ending || c->closed)
        return;
    c->ending = 1;
    c->sreq.data = c;
    if (uv_shutdown(&c->sreq, &c->h.stream, shut_cb) < 0)
        conn_close(c);
}

static conn_t *conn_new(dt_peer_t *p, int outbound, int unix_sock)
{
    conn_t *c = dt_xcalloc(1, sizeof(*c));
    c->p = p;
    c->outbound = outbound;
    c->unix_sock = unix_sock;
    c->raw_fd = c->fetch_fd = -1;
    c->cur.fd = -1;
    dt_uvframe_init(&c->rd, FRAME_MAX);
    if (unix_sock)
        uv_pipe_init(p->loop, &c->h.pipe, 0);
    else
        uv_tcp_init(p->loop, &c->h.tcp);
    c->h.handle.data = c;
    c->next = p->conns;
    p->conns = c;
    return c;
}

static void write_done(uv_write_t *w, int status)
{
    (void)status; /* a failed write shows as a read error */
    free(w->data);
    free(w);
}

static void send_frame(conn_t *c, uint16_t type, json_t *body)
{
    uint8_t *buf;
    size_t len;

    if (body == NULL || dt_msg_encode(type, 0, body, &buf, &len) < 0) {
        json_decref(body);
        conn_fail(c, "cannot encode a frame");
        return;
    }
    json_decref(body);
    uv_write_t *w = dt_xmalloc(sizeof(*w));
    uv_buf_t b = uv_buf_init((char *)buf, (unsigned)len);
    w->data = buf;
    if (uv_write(w, &c->h.stream, &b, 1, write_done) < 0) {
        free(buf);
        free(w);
        conn_fail(c, "write failed");
    }
}

static void send_error(conn_t *c, int code, const char *why)
{
    dt_wire_error_t e = { .code = code, .error = why };
    send_frame(c, DT_MSG_ERROR, dt_wire_error_encode(&e));
    conn_end(c);
}

/*-- sending a copy: its header, then its bytes a chunk at a time ---------------*/

static void chunk_done(uv_write_t *w, int status);

static void send_chunk(conn_t *c)
{
    int64_t left = c->cur.bytes - c->sent;
    size_t n = left > CHUNK ? CHUNK : (size_t)left;
    ssize_t k;

    if (n == 0) {
        /* the whole copy is out: the next one, or (an answer) the end */
        copy_drop(&c->cur);
        c->sending = 0;
        if (!c->outbound && c->nq == 0)
            return; /* the asker closes */
        kick(c);
        return;
    }
    do
        k = pread(c->cur.fd, c->sendbuf, n, (off_t)c->sent);
    while (k < 0 && errno == EINTR);
    if (k <= 0) {
        /* the memory shrank under us (the copy was rewritten): the peer
         * cannot finish this one; the stream is closed */
        conn_fail(c, k < 0 ? strerror(errno) : "the copy shrank while it was sent");
        return;
    }
    uv_write_t *w = dt_xmalloc(sizeof(*w));
    uv_buf_t b = uv_buf_init((char *)c->sendbuf, (unsigned)k);
    w->data = c;
    c->sent += k;
    if (uv_write(w, &c->h.stream, &b, 1, chunk_done) < 0) {
        free(w);
        conn_fail(c, "write failed");
    }
}

static void chunk_done(uv_write_t *w, int status)
{
    conn_t *c = w->data;
    free(w);
    if (status < 0) {
        conn_fail(c, uv_strerror(status));
        return;
    }
    if (!c->closed)
        send_chunk(c);
}

/* Start the next queued copy when nothing is in flight. */
static void kick(conn_t *c)
{
    if (c->sending || c->nq == 0 || (c->outbound && !c->connected) || c->ending)
        return;
    c->cur = c->q[0];
    memmove(&c->q[0], &c->q[1], (size_t)(c->nq - 1) * sizeof(c->q[0]));
    c->nq--;
    c->sending = 1;
    c->sent = 0;
    if (c->sendbuf == NULL)
        c->sendbuf = dt_xmalloc(CHUNK);
    dt_wire_peer_replica_t r = { .job = c->p->job, .rank = c->cur.rank, .step = c->cur.step,
                                 .bytes = c->cur.bytes, .sha256 = c->cur.sha };
    send_frame(c, DT_MSG_PEER_REPLICA, dt_wire_peer_replica_encode(&r));
    if (!c->closed)
        send_chunk(c);
}

/* Queue rank's copy on c, replacing an older one of the same rank. */
static void enqueue(conn_t *c, int rank, int64_t step, int fd, int64_t bytes, const char *sha)
{
    int dfd = dup(fd);
    if (dfd < 0) {
        dt_log_warn("replica of rank %d step %" PRId64 ": dup: %s", rank, step, strerror(errno));
        return;
    }
    outcopy_t o = { .rank = rank, .step = step, .bytes = bytes, .fd = dfd };
    snprintf(o.sha, sizeof(o.sha), "%s", sha);
    for (int i = 0; i < c->nq; i++)
        if (c->q[i].rank == rank) {
            copy_drop(&c->q[i]);
            c->q[i] = o;
            return;
        }
    if (c->nq == c->capq) {
        c->capq = c->capq ? 2 * c->capq : 4;
        c->q = dt_xrealloc(c->q, (size_t)c->capq * sizeof(*c->q));
    }
    c->q[c->nq++] = o;
}

/*-- receiving -----------------------------------------------------------------*/

/* Take up to n raw bytes of the copy being received. */
static void raw_take(conn_t *c, const uint8_t *b, size_t n)
{
    dt_peer_t *p = c->p;
    int64_t left = c->raw_bytes - c->raw_off;

    if ((int64_t)n > left)
        n = (size_t)left;
    for (size_t done = 0; done < n;) {
        ssize_t k = pwrite(c->raw_fd, b + done, n - done, (off_t)(c->raw_off + done));
        if (k < 0 && errno == EINTR)
            continue;
        if (k <= 0) {
            conn_fail(c, k < 0 ? strerror(errno) : "no room");
            return;
        }
        done += (size_t)k;
    }
    dt_sha256_update(c->raw_ctx, b, n);
    c->raw_off += (int64_t)n;
    if (c->raw_off < c->raw_bytes)
        return;
    char hex[65];
    dt_sha256_final(c->raw_ctx, hex);
    c->raw_ctx = NULL;
    int ok = strcmp(hex, c->raw_sha) == 0 && ftruncate(c->raw_fd, (off_t)c->raw_bytes) == 0;
    close(c->raw_fd);
    c->raw_fd = -1;
    c->raw = 0;
    if (c->fetch) {
        c->fetch_ended = 1;
        p->h.fetched(p->h.ud, (int)c->raw_rank, c->raw_step, ok, c->raw_bytes, hex,
                     ok ? "" : "the copy fetched does not match its SHA-256");
        conn_end(c);
        return;
    }
    if (ok)
        p->h.received(p->h.ud, (int)c->raw_rank, c->raw_slot, c->raw_step, c->raw_bytes, hex);
    else
        dt_log_warn("replica of rank %" PRId64 " step %" PRId64 " from a peer does not match "
                    "its SHA-256 (rewritten while sent): dropped", c->raw_rank, c->raw_step);
}

/* Start receiving the copy a PEER_REPLICA announces into fd (ours). */
static void raw_begin(conn_t *c, const dt_wire_peer_replica_t *r, int fd, int slot)
{
    c->raw = 1;
    c->raw_fd = fd;
    c->raw_slot = slot;
    c->raw_rank = r->rank;
    c->raw_step = r->step;
    c->raw_bytes = r->bytes;
    c->raw_off = 0;
    snprintf(c->raw_sha, sizeof(c->raw_sha), "%s", r->sha256);
    c->raw_ctx = dt_sha256_new();
    if (c->rawbuf == NULL)
        c->rawbuf = dt_xmalloc(CHUNK);
    /* bytes that came with the header */
    const uint8_t *b;
    size_t n;
    while (c->raw && (n = dt_uvframe_take(&c->rd, &b, (size_t)(c->raw_bytes - c->raw_off))) > 0)
        raw_take(c, b, n);
    dt_uvframe_taken(&c->rd);
    if (c->raw && c->raw_bytes == 0)
        raw_take(c, NULL, 0);
}

static void on_auth(conn_t *c, const dt_msg_t *m)
{
    dt_peer_t *p = c->p;
    dt_emsg_t em = { "" };
    dt_wire_auth_t a;
    uid_t uid;
    gid_t gid;
    char why[320];

    if (dt_wire_auth_decode(m, &a, &em) < 0) {
        send_error(c, DT_EPROTO, em.s);
        return;
    }
    if (dt_cred_check(a.cred, p->munge_socket, "agent", &uid, &gid, &em) < 0) {
        dt_log_warn("peer connection refused: %s", em.s);
        send_error(c, DT_EACCES, em.s);
        return;
    }
    if (uid != p->uid) {
        snprintf(why, sizeof(why), "uid %u is not this job's owner (uid %u): refused",
                 (unsigned)uid, (unsigned)p->uid);
        dt_log_warn("peer connection refused: %s", why);
        send_error(c, DT_EACCES, why);
        return;
    }
    c->authed = 1;
    /* as dtcoordd answers AUTH: who it took the sender for */
    dt_wire_auth_ok_t ok = { .uid = uid };
    send_frame(c, DT_MSG_OK, dt_wire_auth_ok_encode(&ok));
}

static void on_frame(conn_t *c, const dt_msg_t *m)
{
    dt_peer_t *p = c->p;
    dt_emsg_t em = { "" };

    if (!c->outbound && !c->authed) {
        if (m->type == DT_MSG_AUTH)
            on_auth(c, m);
        else
            send_error(c, DT_EACCES, "AUTH first");
        return;
    }
    switch (m->type) {
    case DT_MSG_PEER_REPLICA: {
        dt_wire_peer_replica_t r;
        int slot = -1, fd = -1;
        if (dt_wire_peer_replica_decode(m, &r, &em) < 0 || r.job != p->job) {
            send_error(c, DT_EPROTO, em.s[0] ? em.s : "a replica of another job");
            return;
        }
        if (c->fetch) {
            if (r.rank != c->fetch_rank || r.step != c->fetch_step) {
                conn_fail(c, "the peer answered with another copy");
                return;
            }
            fd = c->fetch_fd;
            c->fetch_fd = -1;
        } else {
            int own = p->h.sink(p->h.ud, (int)r.rank, &slot);
            if (own < 0 || (fd = dup(own)) < 0) {
                send_error(c, DT_EINVAL, "no room for that rank's replica here");
                return;
            }
        }
        raw_begin(c, &r, fd, slot);
        return;
    }
    case DT_MSG_PEER_FETCH: {
        dt_wire_peer_fetch_t f;
        int64_t bytes = 0;
        char sha[65] = "";
        int fd;
        if (c->outbound || dt_wire_peer_fetch_decode(m, &f, &em) < 0 || f.job != p->job) {
            send_error(c, DT_EPROTO, em.s[0] ? em.s : "a fetch of another job");
            return;
        }
        if ((fd = p->h.lookup(p->h.ud, (int)f.rank, f.step, &bytes, sha)) < 0) {
            char why[96];
            snprintf(why, sizeof(why), "no copy of rank %lld step %lld here", (long long)f.rank,
                     (long long)f.step);
            send_error(c, DT_ENOENT, why);
            return;
        }
        enqueue(c, (int)f.rank, f.step, fd, bytes, sha);
        kick(c);
        return;
    }
    case DT_MSG_OK:
        if (c->outbound)
            return; /* AUTH taken */
        send_error(c, DT_EPROTO, "unexpected message on the peer channel");
        return;
    case DT_MSG_ERROR: {
        dt_wire_error_t e;
        char why[300];
        snprintf(why, sizeof(why), "%s",
                 dt_wire_error_decode(m, &e, &em) == 0 ? e.error : "an error frame");
        conn_fail(c, why);
        return;
    }
    default:
        send_error(c, DT_EPROTO, "unexpected message on the peer channel");
    }
}

static void alloc_cb(uv_handle_t *h, size_t hint, uv_buf_t *b)
{
    conn_t *c = h->data;
    (void)hint;
    if (c->raw) {
        int64_t left = c->raw_bytes - c->raw_off;
        *b = uv_buf_init((char *)c->rawbuf, left > CHUNK ? CHUNK : (unsigned)left);
    } else {
        dt_uvframe_alloc(&c->rd, b);
    }
}

static void read_cb(uv_stream_t *s, ssize_t n, const uv_buf_t *b)
{
    conn_t *c = s->data;
    dt_emsg_t em = { "" };
    dt_msg_t m;
    int rc;

    if (n < 0) {
        if (c->ending)
            return; /* shut_cb closes it */
        if (!c->outbound && !c->raw && !c->sending) {
            conn_close(c); /* the peer is done with us */
            return;
        }
        conn_fail(c, n == UV_EOF ? "the peer closed the connection" : uv_strerror((int)n));
        return;
    }
    if (c->raw) {
        raw_take(c, (const uint8_t *)b->base, (size_t)n);
        return;
    }
    dt_uvframe_add(&c->rd, (size_t)n);
    while (!c->closed && !c->raw && !c->ending &&
           (rc = dt_uvframe_next(&c->rd, &m, &em)) != 0) {
        if (rc < 0) {
            conn_fail(c, em.s);
            return;
        }
        on_frame(c, &m);
        dt_msg_clear(&m);
    }
}

/*-- the listener -----------------------------------------------------------------*/

/* A Unix socket's peer: the kernel's word for its uid. */
static int peer_uid(conn_t *c, uid_t *uid)
{
    uv_os_fd_t fd;
    struct ucred cr;
    socklen_t len = sizeof(cr);

    if (uv_fileno(&c->h.handle, &fd) < 0 || getsockopt(fd, SOL_SOCKET, SO_PEERCRED, &cr, &len) < 0)
        return -1;
    *uid = cr.uid;
    return 0;
}

static void on_connection(uv_stream_t *srv, int status)
{
    dt_peer_t *p = srv->data;

    if (status < 0)
        return;
    conn_t *c = conn_new(p, 0, p->unix_srv);
    p->ninbound++;
    if (uv_accept(srv, &c->h.stream) < 0 || p->ninbound > MAX_INBOUND ||
        uv_read_start(&c->h.stream, alloc_cb, read_cb) < 0) {
        if (p->ninbound > MAX_INBOUND)
            dt_log_warn("peer connection refused: %d open already", MAX_INBOUND);
        conn_close(c);
        return;
    }
    uid_t uid;
    if (c->unix_sock) {
        /* who it is, from the kernel: no credential is sent */
        if (peer_uid(c, &uid) < 0 || uid != p->uid) {
            char why[96];
            snprintf(why, sizeof(why), "uid %d is not this job's owner (uid %u): refused",
                     peer_uid(c, &uid) < 0 ? -1 : (int)uid, (unsigned)p->uid);
            dt_log_warn("peer connection refused: %s", why);
            send_error(c, DT_EACCES, why);
            return;
        }
        c->authed = 1;
    }
}

/* "HOST:PORT" (an IPv6 host in brackets) into sa. */
static int parse_addr(const char *s, struct sockaddr_storage *sa, char *host, size_t hn,
                      int *port)
{
    const char *colon = strrchr(s, ':');
    char *end;

    if (colon == NULL || colon == s)
        return DT_EINVAL;
    long v = strtol(colon + 1, &end, 10);
    if (*end != '\0' || end == colon + 1 || v < 0 || v > 65535)
        return DT_EINVAL;
    const char *h = s;
    size_t len = (size_t)(colon - s);
    if (h[0] == '[' && len >= 2 && h[len - 1] == ']') {
        h++;
        len -= 2;
    }
    if (len == 0 || len >= hn)
        return DT_EINVAL;
    memcpy(host, h, len);
    host[len] = '\0';
    *port = (int)v;
    if (uv_ip4_addr(host, *port, (struct sockaddr_in *)sa) == 0 ||
        uv_ip6_addr(host, *port, (struct sockaddr_in6 *)sa) == 0)
        return 0;
    return DT_ENOENT; /* a name: resolved by the caller */
}

int dt_peer_new(uv_loop_t *loop, int64_t job, const char *listen, const char *node,
                const char *munge_socket, const dt_peer_hooks_t *hooks, dt_peer_t **out,
                dt_emsg_t *em)
{
    struct sockaddr_storage sa;
    char host[256];
    int port, rc;

    *out = NULL;
    int unix_sock = strncmp(listen, "unix:", 5) == 0;
    if (unix_sock ? strlen(listen) < 6 || strlen(listen) > 100
                  : parse_addr(listen, &sa, host, sizeof(host), &port) != 0)
        return dt_emsg_set(em, DT_EINVAL, "--peer-listen '%.200s': not an address IP:PORT or "
                           "unix:PATH", listen);
    dt_peer_t *p = dt_xcalloc(1, sizeof(*p));
    p->loop = loop;
    p->job = job;
    p->uid = getuid();
    p->munge_socket = munge_socket;
    p->h = *hooks;
    p->unix_srv = unix_sock;
    if (unix_sock) {
        uv_pipe_init(loop, &p->srv.pipe, 0);
        p->srv_path = dt_xstrdup(listen + 5);
        unlink(p->srv_path); /* a dead agent's: this state directory is ours (agent.lock) */
    } else {
        uv_tcp_init(loop, &p->srv.tcp);
    }
    p->srv.handle.data = p;
    p->srv_open = 1;
    rc = unix_sock ? uv_pipe_bind(&p->srv.pipe, p->srv_path)
                   : uv_tcp_bind(&p->srv.tcp, (struct sockaddr *)&sa, 0);
    if (rc == 0)
        rc = uv_listen(&p->srv.stream, 64, on_connection);
    if (rc < 0) {
        dt_emsg_set(em, rc, "--peer-listen %s: %s", listen, uv_strerror(rc));
        dt_peer_close(p);
        /* closed: freed by the caller after the loop ran (dt_peer_free) */
        *out = p;
        return rc;
    }
    if (unix_sock) {
        snprintf(p->addr, sizeof(p->addr), "%s", listen);
        dt_log_info("peer channel listening on %s", listen);
        *out = p;
        return 0;
    }
    struct sockaddr_storage bound;
    int blen = sizeof(bound);
    uv_tcp_getsockname(&p->srv.tcp, (struct sockaddr *)&bound, &blen);
    int bport = ntohs(bound.ss_family == AF_INET6 ? ((struct sockaddr_in6 *)&bound)->sin6_port
                                                  : ((struct sockaddr_in *)&bound)->sin_port);
    int wild = strcmp(host, "0.0.0.0") == 0 || strcmp(host, "::") == 0;
    (void)node;
    if (wild) /* the link says which address (agent/link.c) */
        snprintf(p->addr, sizeof(p->addr), "*:%d", bport);
    else if (strchr(host, ':'))
        snprintf(p->addr, sizeof(p->addr), "[%s]:%d", host, bport);
    else
        snprintf(p->addr, sizeof(p->addr), "%s:%d", host, bport);
    dt_log_info("peer channel listening on %s (announced as %s)", listen, p->addr);
    *out = p;
    return 0;
}

const char *dt_peer_addr(const dt_peer_t *p)
{
    return p->addr;
}

/*-- outbound ---------------------------------------------------------------------*/

static void connected_cb(uv_connect_t *req, int status)
{
    conn_t *c = req->data;
    dt_emsg_t em = { "" };
    char *cred = NULL;

    if (status < 0) {
        conn_fail(c, uv_strerror(status));
        return;
    }
    if (uv_read_start(&c->h.stream, alloc_cb, read_cb) < 0) {
        conn_fail(c, "cannot read");
        return;
    }
    /* over TCP who we are goes in a munge credential; over a Unix socket
     * the kernel says it */
    if (!c->unix_sock) {
        if (dt_cred_new(c->p->munge_socket, &cred, &em) < 0) {
            conn_fail(c, em.s);
            return;
        }
        dt_wire_auth_t a = { .cred = cred };
        send_frame(c, DT_MSG_AUTH, dt_wire_auth_encode(&a));
        free(cred);
    }
    if (c->closed)
        return;
    c->connected = 1;
    if (c->fetch) {
        dt_wire_peer_fetch_t f = { .job = c->p->job, .rank = c->fetch_rank,
                                   .step = c->fetch_step };
        send_frame(c, DT_MSG_PEER_FETCH, dt_wire_peer_fetch_encode(&f));
        return;
    }
    kick(c);
}

static conn_t *connect_to(dt_peer_t *p, const char *addr)
{
    struct sockaddr_storage sa;
    char host[256];
    int port, rc;

    int unix_sock = strncmp(addr, "unix:", 5) == 0;
    conn_t *c = conn_new(p, 1, unix_sock);
    snprintf(c->addr, sizeof(c->addr), "%s", addr);
    c->creq.data = c;
    if (unix_sock) {
        uv_pipe_connect(&c->creq, &c->h.pipe, addr + 5, connected_cb);
        return c;
    }
    rc = parse_addr(addr, &sa, host, sizeof(host), &port);
    if (rc == DT_ENOENT) {
        /* a node name: resolved here, once per connection */
        char ps[16];
        uv_getaddrinfo_t gai;
        struct addrinfo hints = { .ai_family = AF_UNSPEC, .ai_socktype = SOCK_STREAM };
        snprintf(ps, sizeof(ps), "%d", port);
        if ((rc = uv_getaddrinfo(p->loop, &gai, NULL, host, ps, &hints)) == 0) {
            memcpy(&sa, gai.addrinfo->ai_addr, gai.addrinfo->ai_addrlen);
            uv_freeaddrinfo(gai.addrinfo);
        }
    }
    if (rc == 0)
        rc = uv_tcp_connect(&c->creq, &c->h.tcp, (struct sockaddr *)&sa, connected_cb);
    if (rc < 0) {
        conn_close(c); /* nothing queued on it yet: no report */
        return NULL;
    }
    return c;
}

void dt_peer_send(dt_peer_t *p, const char *to, int rank, int64_t step, int fd, int64_t bytes,
                  const char *sha256)
{
    conn_t *c;

    if (p == NULL || to == NULL || to[0] == '\0')
        return;
    for (c = p->conns; c; c = c->next)
        if (c->outbound && !c->fetch && !c->ending && strcmp(c->addr, to) == 0)
            break;
    if (c == NULL) {
        if (recently_failed(p, to))
            return; /* reported when it failed; tried again later */
        if ((c = connect_to(p, to)) == NULL) {
            p->h.send_failed(p->h.ud, rank, step, "cannot connect");
            mark_failed(p, to);
            return;
        }
    }
    enqueue(c, rank, step, fd, bytes, sha256);
    kick(c);
}

void dt_peer_fetch(dt_peer_t *p, const char *from, int rank, int64_t step, int fd)
{
    conn_t *c = connect_to(p, from);

    if (c == NULL) {
        p->h.fetched(p->h.ud, rank, step, 0, 0, "", "cannot connect");
        return;
    }
    c->fetch = 1;
    c->fetch_rank = rank;
    c->fetch_step = step;
    if ((c->fetch_fd = dup(fd)) < 0)
        conn_fail(c, strerror(errno));
}

void dt_peer_close(dt_peer_t *p)
{
    if (p == NULL)
        return;
    while (p->conns) {
        conn_t *c = p->conns;
        c->fetch_ended = 1; /* no callbacks while closing */
        conn_close(c);
    }
    if (p->srv_open && !uv_is_closing(&p->srv.handle))
        uv_close(&p->srv.handle, NULL);
    if (p->srv_path) {
        unlink(p->srv_path);
        free(p->srv_path);
        p->srv_path = NULL;
    }
}

void dt_peer_free(dt_peer_t *p)
{
    if (p == NULL)
        return;
    while (p->failed) {
        failed_t *f = p->failed;
        p->failed = f->next;
        free(f);
    }
    free(p);
}
