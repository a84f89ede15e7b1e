/* SPDX-License-Identifier: MIT
 *
 * dtagentd's link to dtcoordd: connect (Unix socket, or TCP with a munge
 * credential), register, heartbeat, and reconnect with exponential backoff
 * whenever the link breaks, for as long as the agent runs. Messages that
 * must arrive (worker exits, shards, fences, generation ends) are queued
 * and sent again, in order, after every re-registration until the
 * coordinator has answered them; progress and heartbeats are simply dropped
 * while the link is down. Pushed messages from the coordinator go through
 * the table of handlers main.c gave (link.h); frames are read with the
 * common framed reader (common/uvframe.h).
 *
 * Not here: what the pushed messages mean (task.c, files.c, main.c), the
 * PMIx server.
 */
#include "config.h"

#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "agent/link.h"
#include "common/clock.h"
#include "common/cred.h"
#include "common/log.h"
#include "common/mem.h"
#include "common/uvframe.h"

#define BACKOFF_MIN_MS 100
#define BACKOFF_MAX_MS 5000

/* A message for the coordinator that must arrive: kept until answered
 * (fences: until FENCE_DONE) and sent again after a reconnect. */
typedef struct pending {
    uint16_t type;
    uint32_t id;             /* 0 until sent on the current connection */
    json_t *body;
    int until_done;          /* FENCE: dropped by FENCE_DONE, not by OK */
    uint32_t gen, seq;
    struct pending *next;
} pending_t;

struct dt_link {
    uv_loop_t *loop;
    dt_link_conf_t conf;
    dt_link_hooks_t hooks;
    union {
        uv_handle_t handle;
        uv_stream_t stream;
        uv_pipe_t pipe;
        uv_tcp_t tcp;
    } conn;
    uv_connect_t connect_req;
    int conn_open;           /* the handle is initialised and not closed */
    int connected, registered;
    int closed;              /* dt_link_close ran: no reconnect */
    int64_t agent_id, heartbeat_ms;
    uint32_t next_id;
    uint32_t register_id;
    dt_uvframe_t rd;
    int64_t backoff_ms;
    int64_t lost_since_ms;   /* monotonic, when the link went down */
    uv_timer_t reconnect_timer, heartbeat_timer;
    pending_t *pending;      /* reliable messages, oldest first */
};

static void connect_now(dt_link_t *l);

/* No reconnect once the link is closed or the agent is stopping. */
static int winding_down(const dt_link_t *l)
{
    return l->closed || (l->hooks.stopping && l->hooks.stopping(l->hooks.ud));
}

static void write_done(uv_write_t *w, int status)
{
    (void)status; /* a failed write shows up as a read error: reconnect there */
    free(w->data);
    free(w);
}

static void send_frame(dt_link_t *l, uint16_t type, uint32_t id, const json_t *body)
{
    uint8_t *buf;
    size_t len;

    if (!l->connected)
        return;
    if (dt_msg_encode(type, id, body, &buf, &len) < 0) {
        dt_log_error("message %s too large or malformed: dropped", dt_msg_type_name(type));
        return;
    }
    uv_write_t *w = dt_xmalloc(sizeof(*w));
    uv_buf_t b = uv_buf_init((char *)buf, (unsigned)len);
    w->data = buf;
    int rc = uv_write(w, &l->conn.stream, &b, 1, write_done);
    if (rc < 0) {
        /* the connection is failing: its read error reconnects, and what
         * must arrive is queued and sent again then */
        dt_log_debug("link to %s: %s dropped: %s", l->conf.coord, dt_msg_type_name(type),
                     uv_strerror(rc));
        free(buf);
        free(w);
    }
}

static uint32_t new_id(dt_link_t *l)
{
    if (++l->next_id == 0)
        l->next_id = 1;
    return l->next_id;
}

void dt_link_send(dt_link_t *l, uint16_t type, json_t *body)
{
    if (l->registered)
        send_frame(l, type, new_id(l), body);
    json_decref(body);
}

static void pending_send(dt_link_t *l, pending_t *p)
{
    p->id = new_id(l);
    json_object_set_new(p->body, "agent", json_integer(l->agent_id));
    send_frame(l, p->type, p->id, p->body);
}

static pending_t *pending_add(dt_link_t *l, uint16_t type, json_t *body)
{
    pending_t *p = dt_xcalloc(1, sizeof(*p)), **tail = &l->pending;
    p->type = type;
    p->body = body;
    while (*tail)
        tail = &(*tail)->next;
    *tail = p;
    return p;
}

void dt_link_send_reliable(dt_link_t *l, uint16_t type, json_t *body)
{
    pending_t *p = pending_add(l, type, body);
    if (l->registered)
        pending_send(l, p);
}

void dt_link_send_fence(dt_link_t *l, uint32_t gen, uint32_t seq, json_t *body)
{
    pending_t *p = pending_add(l, DT_MSG_FENCE, body);
    p->until_done = 1;
    p->gen = gen;
    p->seq = seq;
    if (l->registered)
        pending_send(l, p);
}

static void pending_drop(dt_link_t *l, pending_t *victim)
{
    for (pending_t **pp = &l->pending; *pp; pp = &(*pp)->next)
        if (*pp == victim) {
            *pp = victim->next;
            json_decref(victim->body);
            free(victim);
            return;
        }
}

/* FENCE_DONE arrived: the fence's request is no longer needed. */
static void fence_settled(dt_link_t *l, uint32_t gen, uint32_t seq)
{
    for (pending_t *p = l->pending; p; p = p->next)
        if (p->until_done && p->gen == gen && p->seq == seq) {
            pending_drop(l, p);
            return;
        }
}

/*-- connection lifecycle -------------------------------------------------------*/

static void reconnect_fire(uv_timer_t *t)
{
    connect_now(t->data);
}

static void conn_closed(uv_handle_t *h)
{
    dt_link_t *l = h->data;
    l->conn_open = 0;
    if (winding_down(l))
        return;
    int64_t delay = l->backoff_ms;
    /* +-20% so that a thousand agents do not come back in step */
    delay += (int64_t)(rand() % (int)(delay * 2 / 5 + 1)) - delay / 5;
    l->backoff_ms = l->backoff_ms * 2 > BACKOFF_MAX_MS ? BACKOFF_MAX_MS : l->backoff_ms * 2;
    uv_timer_start(&l->reconnect_timer, reconnect_fire, (uint64_t)delay, 0);
}

static void link_down(dt_link_t *l, const char *why)
{
    if (!l->conn_open || uv_is_closing(&l->conn.handle))
        return;
    if (l->registered)
        dt_log_warn("agent=%lld link to %s lost: %s; reconnecting", (long long)l->agent_id,
                    l->conf.coord, why);
    else
        dt_log_debug("link to %s: %s", l->conf.coord, why);
    if (l->connected || l->registered)
        l->lost_since_ms = dt_clock_mono_ms();
    l->connected = l->registered = 0;
    uv_timer_stop(&l->heartbeat_timer);
    dt_uvframe_close(&l->rd); /* what the old connection left is no frame */
    for (pending_t *p = l->pending; p; p = p->next)
        p->id = 0;
    uv_close(&l->conn.handle, conn_closed);
}

static void heartbeat_fire(uv_timer_t *t)
{
    dt_link_t *l = t->data;
    dt_wire_agent_ref_t hb = { .agent = l->agent_id };
    dt_link_send(l, DT_MSG_HEARTBEAT, dt_wire_heartbeat_encode(&hb));
}

static void send_register(dt_link_t *l)
{
    dt_wire_register_t reg = { .job = l->conf.job, .node = l->conf.node,
                               .slots = l->conf.slots, .pid = getpid() };
    l->hooks.status(l->hooks.ud, &reg);
    /* a peer channel on every interface ("*:PORT"): announced at the
     * address this agent reaches the coordinator from, which the other
     * nodes can route to; over a Unix socket, by node name */
    char peer[320];
    if (reg.peer && strncmp(reg.peer, "*:", 2) == 0) {
        struct sockaddr_storage sa;
        int len = sizeof(sa);
        char ip[INET6_ADDRSTRLEN] = "";
        if (l->conn.handle.type == UV_TCP &&
            uv_tcp_getsockname(&l->conn.tcp, (struct sockaddr *)&sa, &len) == 0) {
            if (sa.ss_family == AF_INET6)
                uv_ip6_name((struct sockaddr_in6 *)&sa, ip, sizeof(ip));
            else
                uv_ip4_name((struct sockaddr_in *)&sa, ip, sizeof(ip));
        }
        if (ip[0] && strchr(ip, ':'))
            snprintf(peer, sizeof(peer), "[%s]%s", ip, reg.peer + 1);
        else
            snprintf(peer, sizeof(peer), "%s%s", ip[0] ? ip : l->conf.node, reg.peer + 1);
        reg.peer = peer;
    }
    if (l->conf.slurm_id > 0) {
        reg.slurm_id = l->conf.slurm_id;
        reg.slurm_restart = l->conf.slurm_restart;
    }
    if (l->conf.gpus) {
        const dt_gpus_t *g = l->conf.gpus;
        reg.gpus = (dt_wire_strs_t){ (const char **)g->uuid, (size_t)g->n };
        reg.gpu_memory_bytes = g->mem_min;
        reg.gpu_why = g->n == 0 ? g->why : NULL;
    }
    json_t *body = dt_wire_register_encode(&reg);
    free(reg.ranks.v);
    l->register_id = new_id(l);
    send_frame(l, DT_MSG_REGISTER, l->register_id, body);
    json_decref(body);
}

static void on_registered(dt_link_t *l, const dt_msg_t *m)
{
    dt_wire_register_ok_t ok;
    dt_emsg_t em = { "" };
    int rc = dt_wire_register_ok_decode(m, &ok, &em);

    if (rc < 0) {
        dt_log_error("coordinator %s: registration reply: %s", l->conf.coord, em.s);
        link_down(l, "malformed registration reply");
        return;
    }
    l->agent_id = ok.agent;
    l->heartbeat_ms = ok.heartbeat_ms > 0 ? ok.heartbeat_ms : 1000;
    l->registered = 1;
    l->backoff_ms = BACKOFF_MIN_MS;
    if (l->lost_since_ms)
        dt_log_info("agent=%lld node=%s registered again after %lld ms", (long long)l->agent_id,
                    l->conf.node, (long long)(dt_clock_mono_ms() - l->lost_since_ms));
    else
        dt_log_info("agent=%lld job=%lld node=%s slots=%d registered", (long long)l->agent_id,
                    (long long)l->conf.job, l->conf.node, l->conf.slots);
    l->lost_since_ms = 0;
    uv_timer_start(&l->heartbeat_timer, heartbeat_fire, (uint64_t)l->heartbeat_ms,
                   (uint64_t)l->heartbeat_ms);
    for (pending_t *p = l->pending; p; p = p->next)
        pending_send(l, p);
}

static void on_reply(dt_link_t *l, const dt_msg_t *m)
{
    dt_wire_error_t e = { .code = DT_EPROTO };
    dt_emsg_t em = { "" };
    const char *err = NULL;

    if (m->type == DT_MSG_ERROR && dt_wire_error_decode(m, &e, &em) == 0)
        err = e.error;
    else if (m->type == DT_MSG_ERROR)
        err = em.s; /* what was wrong with the refusal */
    if (m->id == l->register_id) {
        if (m->type == DT_MSG_OK) {
            on_registered(l, m);
            return;
        }
        int code = (int)e.code;
        dt_log_error("job=%lld node=%s: registration refused: %s", (long long)l->conf.job,
                     l->conf.node, err ? err : "?");
        /* the job is over or not ours: nothing to wait for */
        l->hooks.refused(l->hooks.ud, code);
        return;
    }
    for (pending_t *p = l->pending; p; p = p->next) {
        if (p->id != m->id || p->id == 0)
            continue;
        if (m->type == DT_MSG_ERROR) {
            dt_log_warn("coordinator refused %s: %s", dt_msg_type_name(p->type), err ? err : "?");
            pending_drop(l, p);
        } else if (!p->until_done) {
            pending_drop(l, p);
        }
        return;
    }
    if (m->type == DT_MSG_ERROR)
        dt_log_debug("coordinator: %s", err ? err : "error");
}

/* Replies to the link's own requests are the link's; everything else the
 * coordinator pushes goes through the handler table. */
static void dispatch(dt_link_t *l, const dt_msg_t *m)
{
    if (m->type == DT_MSG_OK || m->type == DT_MSG_ERROR) {
        on_reply(l, m);
        return;
    }
    dt_wire_fence_done_t fd;
    dt_emsg_t em = { "" };
    if (m->type == DT_MSG_FENCE_DONE && dt_wire_fence_done_decode(m, &fd, &em) == 0)
        fence_settled(l, (uint32_t)fd.gen, (uint32_t)fd.seq);
    for (size_t i = 0; i < l->hooks.nhandlers; i++)
        if (l->hooks.handlers[i].type == m->type) {
            l->hooks.handlers[i].fn(l->hooks.ud, m);
            return;
        }
    dt_log_warn("coordinator sent %s, which an agent does not take: ignored",
                dt_msg_type_name(m->type));
}

static void alloc_cb(uv_handle_t *h, size_t hint, uv_buf_t *b)
{
    dt_link_t *l = h->data;
    (void)hint;
    dt_uvframe_alloc(&l->rd, b);
}

/* Stop taking frames once a handler closed the link. */
static int on_frame(void *ud, dt_msg_t *m)
{
    dt_link_t *l = ud;
    dispatch(l, m);
    return l->conn_open && !uv_is_closing(&l->conn.handle) ? 0 : 1;
}

static void read_cb(uv_stream_t *s, ssize_t n, const uv_buf_t *b)
{
    dt_link_t *l = s->data;
    dt_emsg_t em = { "" };
    (void)b;

    int rc = dt_uvframe_read(&l->rd, n, on_frame, l, &em);
    if (n < 0)
        link_down(l, n == UV_EOF ? "closed by the coordinator" : uv_strerror((int)n));
    else if (rc == DT_ERANGE)
        link_down(l, "oversized frame");
    else if (rc < 0) {
        dt_log_error("coordinator %s: %s", l->conf.coord, em.s);
        link_down(l, "malformed frame");
    }
}

static int send_auth(dt_link_t *l)
{
    dt_emsg_t em = { "" };
    char *cred = NULL;

    int rc = dt_cred_new(l->conf.munge_socket, &cred, &em);
    if (rc < 0) {
        dt_log_error("%s", em.s);
        return rc;
    }
    dt_wire_auth_t a = { .cred = cred };
    json_t *body = dt_wire_auth_encode(&a);
    send_frame(l, DT_MSG_AUTH, new_id(l), body);
    json_decref(body);
    free(cred);
    return 0;
}

static void connected_cb(uv_connect_t *req, int status)
{
    dt_link_t *l = req->handle->data;
    int rc;

    if (status < 0) {
        link_down(l, uv_strerror(status));
        return;
    }
    l->connected = 1;
    if ((rc = uv_read_start(&l->conn.stream, alloc_cb, read_cb)) < 0) {
        link_down(l, uv_strerror(rc)); /* a link we cannot read is no link: retry */
        return;
    }
    /* AUTH then REGISTER back to back: the coordinator answers in order */
    if (l->conn.handle.type == UV_TCP && send_auth(l) < 0) {
        link_down(l, "no munge credential");
        return;
    }
    send_register(l);
}

static void connect_now(dt_link_t *l)
{
    int rc;

    if (winding_down(l) || l->conn_open)
        return;
    if (strncmp(l->conf.coord, "unix:", 5) == 0) {
        uv_pipe_init(l->loop, &l->conn.pipe, 0);
        l->conn.handle.data = l;
        l->conn_open = 1;
        uv_pipe_connect(&l->connect_req, &l->conn.pipe, l->conf.coord + 5, connected_cb);
        return;
    }
    char host[256];
    const char *colon = strrchr(l->conf.coord, ':');
    struct sockaddr_storage sa;
    snprintf(host, sizeof(host), "%.*s", colon ? (int)(colon - l->conf.coord) : 0, l->conf.coord);
    int port = colon ? atoi(colon + 1) : 0;
    if ((rc = uv_ip4_addr(host, port, (struct sockaddr_in *)&sa)) < 0 &&
        (rc = uv_ip6_addr(host, port, (struct sockaddr_in6 *)&sa)) < 0) {
        uv_getaddrinfo_t gai;
        struct addrinfo hints = { .ai_family = AF_UNSPEC, .ai_socktype = SOCK_STREAM };
        if ((rc = uv_getaddrinfo(l->loop, &gai, NULL, host, colon + 1, &hints)) == 0) {
            memcpy(&sa, gai.addrinfo->ai_addr, gai.addrinfo->ai_addrlen);
            uv_freeaddrinfo(gai.addrinfo);
        }
    }
    uv_tcp_init(l->loop, &l->conn.tcp);
    l->conn.handle.data = l;
    l->conn_open = 1;
    if (rc == 0)
        rc = uv_tcp_connect(&l->connect_req, &l->conn.tcp, (struct sockaddr *)&sa,
                            connected_cb);
    if (rc < 0)
        link_down(l, uv_strerror(rc));
}

dt_link_t *dt_link_new(uv_loop_t *loop, const dt_link_conf_t *conf, const dt_link_hooks_t *hooks)
{
    dt_link_t *l = dt_xcalloc(1, sizeof(*l));

    l->loop = loop;
    l->conf = *conf;
    l->hooks = *hooks;
    l->backoff_ms = BACKOFF_MIN_MS;
    dt_uvframe_init(&l->rd, DT_MSG_MAX);
    uv_timer_init(loop, &l->reconnect_timer);
    uv_timer_init(loop, &l->heartbeat_timer);
    l->reconnect_timer.data = l;
    l->heartbeat_timer.data = l;
    connect_now(l);
    return l;
}

int64_t dt_link_agent_id(const dt_link_t *l)
{
    return l->agent_id;
}

void dt_link_close(dt_link_t *l)
{
    l->closed = 1;
    uv_timer_stop(&l->reconnect_timer);
    uv_timer_stop(&l->heartbeat_timer);
    if (!uv_is_closing((uv_handle_t *)&l->reconnect_timer))
        uv_close((uv_handle_t *)&l->reconnect_timer, NULL);
    if (!uv_is_closing((uv_handle_t *)&l->heartbeat_timer))
        uv_close((uv_handle_t *)&l->heartbeat_timer, NULL);
    if (l->conn_open && !uv_is_closing(&l->conn.handle))
        uv_close(&l->conn.handle, conn_closed);
    while (l->pending)
        pending_drop(l, l->pending);
}

void dt_link_free(dt_link_t *l)
{
    if (l == NULL)
        return;
    dt_uvframe_close(&l->rd);
    free(l);
}
