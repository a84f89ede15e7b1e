/* SPDX-License-Identifier: MIT
 *
 * Dispatch: the table of request types, the authentication gate, AUTH and
 * PING themselves. Connections reach dt_rpc_dispatch through the
 * coordinator's dispatch hook (coord.h), which main.c sets.
 */
#include "config.h"

#include <stdio.h>
#include <stdlib.h>

#include "common/clock.h"
#include "common/log.h"
#include "common/macros.h"
#include "common/mem.h"
#include "common/wire.h"
#include "coordinator/auth.h"
#include "coordinator/agent_req.h"
#include "coordinator/ctl_req.h"
#include "coordinator/rpc.h"

/* munge_decode asks munged over a socket and waits: run it on libuv's
 * thread pool so heartbeats of thousands of agents never wait behind a
 * reconnect storm. Reading pauses until the answer is back. */
static void auth_work(uv_work_t *w)
{
    dt_conn_t *k = w->data;
    dt_emsg_t em = { "" };

    k->auth_rc = dt_auth_munge(k->auth_cred, k->coord->conf.munge_socket, &k->auth_uid,
                               &k->auth_gid, &em);
    snprintf(k->auth_err, sizeof(k->auth_err), "%s", em.s);
}

static void auth_done(uv_work_t *w, int status)
{
    dt_conn_t *k = w->data;

    free(k->auth_cred);
    k->auth_cred = NULL;
    k->auth_pending = 0;
    if (k->closed) { /* the peer went away meanwhile */
        dt_uvframe_close(&k->rd);
        free(k);
        return;
    }
    if (status < 0 && k->auth_rc == 0) {
        k->auth_rc = DT_ECANCELED;
        snprintf(k->auth_err, sizeof(k->auth_err), "authentication cancelled");
    }
    if (k->auth_rc < 0) {
        dt_log_warn("peer=%s refused: %s", k->peer, k->auth_err);
        dt_conn_error(k, k->auth_id, k->auth_rc, "%s", k->auth_err);
        dt_conn_close(k);
        return;
    }
    k->uid = k->auth_uid;
    k->gid = k->auth_gid;
    k->authed = 1;
    dt_emsg_t em = { "" };
    if (dt_conn_admit(k, &em) < 0) {
        dt_log_warn("peer=%s refused: %s", k->peer, em.s);
        dt_conn_error(k, k->auth_id, DT_ECOMM, "the coordinator refused the connection: %s",
                      em.s);
        dt_conn_close(k);
        return;
    }
    dt_log_debug("peer=%s authenticated uid=%u", k->peer, (unsigned)k->uid);
    dt_wire_auth_ok_t ok = { .uid = k->uid };
    dt_conn_reply(k, DT_MSG_OK, k->auth_id, dt_wire_auth_ok_encode(&ok));
    dt_conn_process(k); /* requests that came in behind the AUTH; then reads again */
}

static void rpc_auth(dt_conn_t *k, const dt_msg_t *m)
{
    dt_wire_auth_t req;
    dt_emsg_t em = { "" };
    int rc;

    if ((rc = dt_wire_auth_decode(m, &req, &em)) < 0) {
        dt_conn_error(k, m->id, rc, "%s", em.s);
        dt_conn_close(k);
        return;
    }
    if (!k->tcp) { /* the kernel already told us who this is */
        dt_wire_auth_ok_t ok = { .uid = k->uid };
        dt_conn_reply(k, DT_MSG_OK, m->id, dt_wire_auth_ok_encode(&ok));
        return;
    }
    k->auth_cred = dt_xstrdup(req.cred);
    k->auth_id = m->id;
    k->auth_work.data = k;
    k->auth_pending = 1;
    if ((rc = uv_queue_work(k->coord->loop, &k->auth_work, auth_work, auth_done)) < 0) {
        k->auth_pending = 0;
        free(k->auth_cred);
        k->auth_cred = NULL;
        dt_conn_error(k, m->id, DT_EIO, "cannot queue authentication: %s", uv_strerror(rc));
        dt_conn_close(k);
        return;
    }
    dt_conn_pause(k);
}

static void rpc_ping(dt_conn_t *k, const dt_msg_t *m)
{
    dt_coord_t *c = k->coord;
    dt_wire_ping_ok_t ok = { .version = DT_PROTO_VERSION, .server = "dtcoordd",
                             .uptime_s = (double)(dt_clock_mono_ms() - c->started_ms) / 1000.0 };
    dt_conn_reply(k, DT_MSG_OK, m->id, dt_wire_ping_ok_encode(&ok));
}

static const struct rpc {
    uint16_t type;
    int need_auth;
    void (*fn)(dt_conn_t *k, const dt_msg_t *m);
} table[] = {
    { DT_MSG_AUTH, 0, rpc_auth },
    { DT_MSG_PING, 0, rpc_ping },
    { DT_MSG_SUBMIT, 1, dt_ctl_submit },
    { DT_MSG_LIST, 1, dt_ctl_list },
    { DT_MSG_SHOW, 1, dt_ctl_show },
    { DT_MSG_CANCEL, 1, dt_ctl_cancel },
    { DT_MSG_EVENTS, 1, dt_ctl_events },
    { DT_MSG_CHECKPOINTS, 1, dt_ctl_checkpoints },
    { DT_MSG_REGISTER, 1, dt_agent_register },
    { DT_MSG_HEARTBEAT, 1, dt_agent_heartbeat },
    { DT_MSG_PROGRESS, 1, dt_agent_progress },
    { DT_MSG_WORKER_EXIT, 1, dt_agent_worker_exit },
    { DT_MSG_SHARD_WRITTEN, 1, dt_agent_shard_written },
    { DT_MSG_FENCE, 1, dt_agent_fence },
    { DT_MSG_GEN_ENDED, 1, dt_agent_gen_ended },
    { DT_MSG_CHECKPOINT, 1, dt_ctl_checkpoint },
    { DT_MSG_RESUME, 1, dt_ctl_resume },
    { DT_MSG_HISTORY, 1, dt_ctl_history },
    { DT_MSG_PREEMPT, 1, dt_agent_preempt },
    { DT_MSG_CKPT_DONE, 1, dt_agent_ckpt_done },
    { DT_MSG_MEM_CKPT, 1, dt_agent_mem_ckpt },
};

void dt_rpc_dispatch(dt_conn_t *k, const dt_msg_t *m)
{
    for (size_t i = 0; i < DT_ARRAY_SIZE(table); i++) {
        if (table[i].type != m->type)
            continue;
        if (table[i].need_auth && !k->authed) {
            dt_log_warn("peer=%s sent %s before authenticating: closing", k->peer,
                        dt_msg_type_name(m->type));
            dt_conn_error(k, m->id, DT_EACCES,
                          "authenticate first: send AUTH with a munge credential");
            dt_conn_close(k);
            return;
        }
        table[i].fn(k, m);
        return;
    }
    dt_conn_error(k, m->id, DT_ENOTSUP, "%s is not a request",
                  dt_msg_type_name(m->type) ? dt_msg_type_name(m->type) : "?");
}
