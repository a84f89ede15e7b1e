/* SPDX-License-Identifier: MIT
 *
 * dtagentd's link to dtcoordd: connect (Unix socket, or TCP with a munge
 * credential), register, heartbeat, and reconnect with exponential backoff
 * whenever the link breaks, for as long as the agent runs. Messages that
 * must arrive (worker exits, shards, fences, generation ends) are queued
 * and sent again, in order, after every re-registration until the
 * coordinator has answered them; progress and heartbeats are simply dropped
 * while the link is down. Pushed messages from the coordinator (id 0) are
 * handed to task.c.
 *
 * Not here: what the messages mean (task.c), the PMIx server.
 */
#include "config.h"

#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "agent/agent.h"
#include "common/cred.h"
#include "common/log.h"
#include "common/mem.h"

#define BACKOFF_MIN_MS 100
#define BACKOFF_MAX_MS 5000
#define READ_MAX (DT_MSG_MAX + DT_MSG_HDR)

static void connect_now(dt_agent_t *ag);

static void write_done(uv_write_t *w, int status)
{
    (void)status; /* a failed write shows up as a read error: reconnect there */
    free(w->data);
    free(w);
}

static void send_frame(dt_agent_t *ag, uint16_t type, uint32_t id, const json_t *body)
{
    uint8_t *buf;
    size_t len;

    if (!ag->connected)
        return;
    if (dt_msg_encode(type, id, body, &buf, &len) < 0) {
        dt_log_error("message %s too large or malformed: dropped", dt_msg_type_name(type));
        return;
    }
    uv_write_t *w = dt_xmalloc(sizeof(*w));
    uv_buf_t b = uv_buf_init((char *)buf, (unsigned)len);
    w->data = buf;
    if (uv_write(w, &ag->conn.stream, &b, 1, write_done) < 0) {
        free(buf);
        free(w);
    }
}

static uint32_t new_id(dt_agent_t *ag)
{
    if (++ag->next_id == 0)
        ag->next_id = 1;
    return ag->next_id;
}

void dt_link_send(dt_agent_t *ag, uint16_t type, json_t *body)
{
    if (ag->registered)
        send_frame(ag, type, new_id(ag), body);
    json_decref(body);
}

static void pending_send(dt_agent_t *ag, dt_pending_t *p)
{
    p->id = new_id(ag);
    json_object_set_new(p->body, "agent", json_integer(ag->agent_id));
    send_frame(ag, p->type, p->id, p->body);
}

static dt_pending_t *pending_add(dt_agent_t *ag, uint16_t type, json_t *body)
{
    dt_pending_t *p = dt_xcalloc(1, sizeof(*p)), **tail = &ag->pending;
    p->type = type;
    p->body = body;
    while (*tail)
        tail = &(*tail)->next;
    *tail = p;
    return p;
}

void dt_link_send_reliable(dt_agent_t *ag, uint16_t type, json_t *body)
{
    dt_pending_t *p = pending_add(ag, type, body);
    if (ag->registered)
        pending_send(ag, p);
}

void dt_link_send_fence(dt_agent_t *ag, uint32_t gen, uint32_t seq, json_t *body)
{
    dt_pending_t *p = pending_add(ag, DT_MSG_FENCE, body);
    p->until_done = 1;
    p->gen = gen;
    p->seq = seq;
    if (ag->registered)
        pending_send(ag, p);
}

static void pending_drop(dt_agent_t *ag, dt_pending_t *victim)
{
    for (dt_pending_t **pp = &ag->pending; *pp; pp = &(*pp)->next)
        if (*pp == victim) {
            *pp = victim->next;
            json_decref(victim->body);
            free(victim);
            return;
        }
}

/* FENCE_DONE arrived: the fence's request is no longer needed. */
static void fence_settled(dt_agent_t *ag, uint32_t gen, uint32_t seq)
{
    for (dt_pending_t *p = ag->pending; p; p = p->next)
        if (p->until_done && p->gen == gen && p->seq == seq) {
            pending_drop(ag, p);
            return;
        }
}

/*-- connection lifecycle -------------------------------------------------------*/

static void reconnect_fire(uv_timer_t *t)
{
    connect_now(t->loop->data);
}

static void conn_closed(uv_handle_t *h)
{
    dt_agent_t *ag = h->loop->data;
    ag->conn_open = 0;
    if (ag->stopping)
        return;
    int64_t delay = ag->backoff_ms;
    /* +-20% so that a thousand agents do not come back in step */
    delay += (int64_t)(rand() % (int)(delay * 2 / 5 + 1)) - delay / 5;
    ag->backoff_ms = ag->backoff_ms * 2 > BACKOFF_MAX_MS ? BACKOFF_MAX_MS : ag->backoff_ms * 2;
    uv_timer_start(&ag->reconnect_timer, reconnect_fire, (uint64_t)delay, 0);
}

static void link_down(dt_agent_t *ag, const char *why)
{
    if (!ag->conn_open || uv_is_closing(&ag->conn.handle))
        return;
    if (ag->registered)
        dt_log_warn("agent=%lld link to %s lost: %s; reconnecting", (long long)ag->agent_id,
                    ag->coord, why);
    else
        dt_log_debug("link to %s: %s", ag->coord, why);
    if (ag->connected || ag->registered)
        ag->lost_since_ms = dt_agent_mono_ms();
    ag->connected = ag->registered = 0;
    uv_timer_stop(&ag->heartbeat_timer);
    ag->rlen = 0;
    for (dt_pending_t *p = ag->pending; p; p = p->next)
        p->id = 0;
    uv_close(&ag->conn.handle, conn_closed);
}

static void heartbeat_fire(uv_timer_t *t)
{
    dt_agent_t *ag = t->loop->data;
    dt_link_send(ag, DT_MSG_HEARTBEAT, json_pack("{s:I}", "agent", (json_int_t)ag->agent_id));
}

static void send_register(dt_agent_t *ag)
{
    json_t *body = json_pack("{s:I, s:s, s:i, s:I}", "job", (json_int_t)ag->job, "node",
                             ag->node, "slots", ag->slots, "pid", (json_int_t)getpid());
    json_t *st = dt_task_status(ag);
    json_object_update(body, st);
    if (ag->slurm_id > 0) {
        json_object_set_new(body, "slurm_id", json_integer(ag->slurm_id));
        json_object_set_new(body, "slurm_restart", json_integer(ag->slurm_restart));
    }
    json_decref(st);
    ag->register_id = new_id(ag);
    send_frame(ag, DT_MSG_REGISTER, ag->register_id, body);
    json_decref(body);
}

static void on_registered(dt_agent_t *ag, const dt_msg_t *m)
{
    json_t *id = json_object_get(m->body, "agent"), *hb = json_object_get(m->body, "heartbeat_ms");

    ag->agent_id = json_integer_value(id);
    ag->heartbeat_ms = json_is_integer(hb) && json_integer_value(hb) > 0
                           ? json_integer_value(hb) : 1000;
    ag->registered = 1;
    ag->backoff_ms = BACKOFF_MIN_MS;
    if (ag->lost_since_ms)
        dt_log_info("agent=%lld node=%s registered again after %lld ms", (long long)ag->agent_id,
                    ag->node, (long long)(dt_agent_mono_ms() - ag->lost_since_ms));
    else
        dt_log_info("agent=%lld job=%lld node=%s slots=%d registered", (long long)ag->agent_id,
                    (long long)ag->job, ag->node, ag->slots);
    ag->lost_since_ms = 0;
    uv_timer_start(&ag->heartbeat_timer, heartbeat_fire, (uint64_t)ag->heartbeat_ms,
                   (uint64_t)ag->heartbeat_ms);
    for (dt_pending_t *p = ag->pending; p; p = p->next)
        pending_send(ag, p);
}

static void on_reply(dt_agent_t *ag, const dt_msg_t *m)
{
    const char *err = json_string_value(json_object_get(m->body, "error"));

    if (m->id == ag->register_id) {
        if (m->type == DT_MSG_OK) {
            on_registered(ag, m);
            return;
        }
        int code = (int)json_integer_value(json_object_get(m->body, "code"));
        dt_log_error("job=%lld node=%s: registration refused: %s", (long long)ag->job, ag->node,
                     err ? err : "?");
        /* the job is over or not ours: nothing to wait for */
        dt_agent_stop(ag, code == DT_ESTATE ? 0 : 1);
        return;
    }
    for (dt_pending_t *p = ag->pending; p; p = p->next) {
        if (p->id != m->id || p->id == 0)
            continue;
        if (m->type == DT_MSG_ERROR) {
            dt_log_warn("coordinator refused %s: %s", dt_msg_type_name(p->type), err ? err : "?");
            pending_drop(ag, p);
        } else if (!p->until_done) {
            pending_drop(ag, p);
        }
        return;
    }
    if (m->type == DT_MSG_ERROR)
        dt_log_debug("coordinator: %s", err ? err : "error");
}

static void dispatch(dt_agent_t *ag, const dt_msg_t *m)
{
    switch (m->type) {
    case DT_MSG_OK:
    case DT_MSG_ERROR: on_reply(ag, m); break;
    case DT_MSG_GEN_START: dt_task_gen_start(ag, m); break;
    case DT_MSG_GEN_ABORT: dt_task_gen_abort(ag, m); break;
    case DT_MSG_FENCE_DONE: {
        json_t *g = json_object_get(m->body, "gen"), *s = json_object_get(m->body, "seq");
        fence_settled(ag, (uint32_t)json_integer_value(g), (uint32_t)json_integer_value(s));
        dt_task_fence_done(ag, m);
        break;
    }
    case DT_MSG_CKPT_REQUEST: dt_task_ckpt_request(ag, m); break;
    case DT_MSG_CKPT_COMMIT:
    case DT_MSG_CKPT_PRUNE: dt_files_ckpt(ag, m); break;
    case DT_MSG_STOP: dt_task_stop(ag, m); break;
    case DT_MSG_JOB_END: {
        const char *st = json_string_value(json_object_get(m->body, "state"));
        dt_log_info("job=%lld ended: %s", (long long)ag->job, st ? st : "?");
        /* the exit status is the batch script's under Slurm: dtagentd(8) */
        dt_agent_stop(ag, st && strcmp(st, "completed") == 0   ? 0
                          : st && strcmp(st, "requeued") == 0 ? DT_EXIT_REQUEUE
                                                              : 1);
        break;
    }
    default:
        dt_log_warn("coordinator sent %s, which an agent does not take: ignored",
                    dt_msg_type_name(m->type));
    }
}

static void alloc_cb(uv_handle_t *h, size_t hint, uv_buf_t *b)
{
    dt_agent_t *ag = h->loop->data;
    (void)hint;
    if (ag->rcap - ag->rlen < 65536) {
        ag->rcap = ag->rcap ? ag->rcap * 2 : 131072;
        ag->rbuf = dt_xrealloc(ag->rbuf, ag->rcap);
    }
    *b = uv_buf_init((char *)ag->rbuf + ag->rlen, (unsigned)(ag->rcap - ag->rlen));
}

static void read_cb(uv_stream_t *s, ssize_t n, const uv_buf_t *b)
{
    dt_agent_t *ag = s->loop->data;
    dt_emsg_t em = { "" };
    (void)b;

    if (n < 0) {
        link_down(ag, n == UV_EOF ? "closed by the coordinator" : uv_strerror((int)n));
        return;
    }
    ag->rlen += (size_t)n;
    size_t off = 0;
    while (ag->conn_open && !uv_is_closing(&ag->conn.handle)) {
        dt_msg_t m;
        int used = dt_msg_decode(ag->rbuf + off, ag->rlen - off, &m, &em);
        if (used < 0) {
            dt_log_error("coordinator %s: %s", ag->coord, em.s);
            link_down(ag, "malformed frame");
            return;
        }
        if (used == 0)
            break;
        off += (size_t)used;
        dispatch(ag, &m);
        dt_msg_clear(&m);
    }
    if (ag->rlen - off > READ_MAX) {
        link_down(ag, "oversized frame");
        return;
    }
    memmove(ag->rbuf, ag->rbuf + off, ag->rlen - off);
    ag->rlen -= off;
}

static int send_auth(dt_agent_t *ag)
{
    dt_emsg_t em = { "" };
    char *cred = NULL;

    if (dt_cred_new(ag->munge_socket, &cred, &em) < 0) {
        dt_log_error("%s", em.s);
        return -1;
    }
    json_t *body = json_pack("{s:s}", "cred", cred);
    send_frame(ag, DT_MSG_AUTH, new_id(ag), body);
    json_decref(body);
    free(cred);
    return 0;
}

static void connected_cb(uv_connect_t *req, int status)
{
    dt_agent_t *ag = req->handle->loop->data;

    if (status < 0) {
        link_down(ag, uv_strerror(status));
        return;
    }
    ag->connected = 1;
    uv_read_start(&ag->conn.stream, alloc_cb, read_cb);
    /* AUTH then REGISTER back to back: the coordinator answers in order */
    if (ag->conn.handle.type == UV_TCP && send_auth(ag) < 0) {
        link_down(ag, "no munge credential");
        return;
    }
    send_register(ag);
}

static void connect_now(dt_agent_t *ag)
{
    int rc;

    if (ag->stopping || ag->conn_open)
        return;
    if (strncmp(ag->coord, "unix:", 5) == 0) {
        uv_pipe_init(ag->loop, &ag->conn.pipe, 0);
        ag->conn_open = 1;
        uv_pipe_connect(&ag->connect_req, &ag->conn.pipe, ag->coord + 5, connected_cb);
        return;
    }
    char host[256];
    const char *colon = strrchr(ag->coord, ':');
    struct sockaddr_storage sa;
    snprintf(host, sizeof(host), "%.*s", colon ? (int)(colon - ag->coord) : 0, ag->coord);
    int port = colon ? atoi(colon + 1) : 0;
    if ((rc = uv_ip4_addr(host, port, (struct sockaddr_in *)&sa)) < 0 &&
        (rc = uv_ip6_addr(host, port, (struct sockaddr_in6 *)&sa)) < 0) {
        uv_getaddrinfo_t gai;
        struct addrinfo hints = { .ai_family = AF_UNSPEC, .ai_socktype = SOCK_STREAM };
        if ((rc = uv_getaddrinfo(ag->loop, &gai, NULL, host, colon + 1, &hints)) == 0) {
            memcpy(&sa, gai.addrinfo->ai_addr, gai.addrinfo->ai_addrlen);
            uv_freeaddrinfo(gai.addrinfo);
        }
    }
    uv_tcp_init(ag->loop, &ag->conn.tcp);
    ag->conn_open = 1;
    if (rc == 0)
        rc = uv_tcp_connect(&ag->connect_req, &ag->conn.tcp, (struct sockaddr *)&sa,
                            connected_cb);
    if (rc < 0)
        link_down(ag, uv_strerror(rc));
}

void dt_link_start(dt_agent_t *ag)
{
    ag->backoff_ms = BACKOFF_MIN_MS;
    uv_timer_init(ag->loop, &ag->reconnect_timer);
    uv_timer_init(ag->loop, &ag->heartbeat_timer);
    connect_now(ag);
}

void dt_link_close(dt_agent_t *ag)
{
    uv_timer_stop(&ag->reconnect_timer);
    uv_timer_stop(&ag->heartbeat_timer);
    if (!uv_is_closing((uv_handle_t *)&ag->reconnect_timer))
        uv_close((uv_handle_t *)&ag->reconnect_timer, NULL);
    if (!uv_is_closing((uv_handle_t *)&ag->heartbeat_timer))
        uv_close((uv_handle_t *)&ag->heartbeat_timer, NULL);
    if (ag->conn_open && !uv_is_closing(&ag->conn.handle))
        uv_close(&ag->conn.handle, conn_closed);
    while (ag->pending)
        pending_drop(ag, ag->pending);
}
