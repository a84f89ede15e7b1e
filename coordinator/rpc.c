/* SPDX-License-Identifier: MIT
 *
 * Dispatch: the table of request types, the authentication gate, AUTH and
 * PING themselves.
 */
#include "config.h"

#include <stdio.h>

#include "common/log.h"
#include "coordinator/auth.h"
#include "coordinator/job.h"
#include "coordinator/rpc.h"

static void rpc_auth(dt_conn_t *k, const dt_msg_t *m)
{
    const char *cred;
    dt_emsg_t em = { "" };
    uid_t uid;
    gid_t gid;
    int rc;

    if ((rc = dt_msg_get_str(m, "cred", &cred, &em)) < 0) {
        dt_conn_error(k, m->id, rc, "%s", em.s);
        dt_conn_close(k);
        return;
    }
    if (!k->tcp) { /* the kernel already told us who this is */
        dt_conn_reply(k, DT_MSG_OK, m->id, json_pack("{s:i}", "uid", (int)k->uid));
        return;
    }
    if ((rc = dt_auth_munge(cred, k->coord->conf.munge_socket, &uid, &gid, &em)) < 0) {
        dt_log_warn("peer=%s refused: %s", k->peer, em.s);
        dt_conn_error(k, m->id, rc, "%s", em.s);
        dt_conn_close(k);
        return;
    }
    k->uid = uid;
    k->gid = gid;
    k->authed = 1;
    dt_log_debug("peer=%s authenticated uid=%u", k->peer, (unsigned)uid);
    dt_conn_reply(k, DT_MSG_OK, m->id, json_pack("{s:i}", "uid", (int)uid));
}

static void rpc_ping(dt_conn_t *k, const dt_msg_t *m)
{
    dt_coord_t *c = k->coord;
    dt_conn_reply(k, DT_MSG_OK, m->id,
                  json_pack("{s:i, s:s, s:f}", "version", DT_PROTO_VERSION, "server", "dtcoordd",
                            "uptime_s",
                            (double)(dt_coord_mono_ms() - c->started_ms) / 1000.0));
}

static const struct rpc {
    uint16_t type;
    int need_auth;
    void (*fn)(dt_conn_t *k, const dt_msg_t *m);
} table[] = {
    { DT_MSG_AUTH, 0, rpc_auth },
    { DT_MSG_PING, 0, rpc_ping },
    { DT_MSG_SUBMIT, 1, dt_job_submit },
    { DT_MSG_LIST, 1, dt_job_list },
    { DT_MSG_SHOW, 1, dt_job_show },
    { DT_MSG_CANCEL, 1, dt_job_cancel },
    { DT_MSG_EVENTS, 1, dt_job_events },
    { DT_MSG_CHECKPOINTS, 1, dt_job_checkpoints },
    { DT_MSG_REGISTER, 1, dt_agent_register },
    { DT_MSG_HEARTBEAT, 1, dt_agent_heartbeat },
    { DT_MSG_PROGRESS, 1, dt_agent_progress },
    { DT_MSG_WORKER_EXIT, 1, dt_agent_worker_exit },
    { DT_MSG_SHARD_WRITTEN, 1, dt_agent_shard_written },
};

void dt_rpc_dispatch(dt_conn_t *k, const dt_msg_t *m)
{
    for (size_t i = 0; i < sizeof(table) / sizeof(table[0]); i++) {
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
