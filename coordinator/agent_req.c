/* SPDX-License-Identifier: MIT
 *
 * dtagentd's request handlers (agent_req.h). Each checks the sender and
 * the fields, replies, then hands the report on: registration to jobs.c,
 * generations' reports to run.c, Slurm's warning signal to the recovery
 * policy.
 */
#include "config.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/clock.h"
#include "common/log.h"
#include "coordinator/agent_req.h"
#include "coordinator/jobs.h"
#include "coordinator/recovery.h"
#include "coordinator/run.h"

void dt_agent_register(dt_conn_t *k, const dt_msg_t *m)
{
    dt_coord_t *c = k->coord;
    dt_caller_t who = { .uid = k->uid, .gid = k->gid };
    dt_emsg_t em = { "" };
    int64_t jid, slots, slurm_id = 0, restart = 0, pid = 0;
    const char *node;
    dt_live_agent_t *a;
    int rc;

    /* the node name is stored and shown (dtctl show, watch, events) and
     * logged: printable text only, refused with the reason otherwise */
    if ((rc = dt_msg_get_int(m, "job", &jid, &em)) < 0 ||
        (rc = dt_msg_get_text(m, "node", DT_JOBS_NAME_MAX, &node, &em)) < 0 ||
        (rc = dt_msg_get_int(m, "slots", &slots, &em)) < 0) {
        if (rc == DT_EINVAL)
            dt_log_warn("peer=%s registration refused: %s", k->peer, em.s);
        dt_conn_error(k, m->id, rc, "register: %s", em.s);
        return;
    }
    if (slots < 1 || slots > 1 << 20 || *node == '\0') {
        dt_conn_error(k, m->id, DT_EINVAL, "register: bad node '%s' or slots %lld", node,
                      (long long)slots);
        return;
    }
    if ((rc = dt_msg_opt_int(m, "slurm_id", &slurm_id, &em)) < 0 ||
        (rc = dt_msg_opt_int(m, "slurm_restart", &restart, &em)) < 0) {
        dt_conn_error(k, m->id, rc, "%s", em.s);
        return;
    }
    /* the pid is shown only: a malformed one reads as unknown (0) */
    dt_emsg_t e2 = { "" };
    if (dt_msg_opt_int(m, "pid", &pid, &e2) < 0)
        pid = 0;
    if ((rc = dt_jobs_agent_register(c, &who, jid, node, (int)slots, slurm_id, restart, pid, &a,
                                     &em)) < 0) {
        dt_conn_error(k, m->id, rc, "%s", em.s);
        return;
    }
    a->conn = k;
    k->agent = a->id;
    dt_conn_reply(k, DT_MSG_OK, m->id,
                  json_pack("{s:I, s:I}", "agent", (json_int_t)a->id, "heartbeat_ms",
                            (json_int_t)c->conf.heartbeat_ms));
    dt_run_registered(c, a, m);
}

/* The live agent a message is about, which must be the one this connection
 * registered; on failure reply and return NULL. */
static dt_live_agent_t *own_agent(dt_conn_t *k, const dt_msg_t *m)
{
    dt_emsg_t em = { "" };
    int64_t aid;
    int rc;

    if ((rc = dt_msg_get_int(m, "agent", &aid, &em)) < 0) {
        dt_conn_error(k, m->id, rc, "%s", em.s);
        return NULL;
    }
    dt_live_agent_t *a = dt_coord_agent_find(k->coord, aid);
    if (a == NULL || k->agent != aid) {
        dt_conn_error(k, m->id, DT_ENOENT, "agent %lld is not registered on this connection: "
                      "register again", (long long)aid);
        return NULL;
    }
    a->last_seen_ms = dt_clock_mono_ms();
    a->conn = k;
    return a;
}

void dt_agent_heartbeat(dt_conn_t *k, const dt_msg_t *m)
{
    if (own_agent(k, m))
        dt_conn_reply(k, DT_MSG_OK, m->id, NULL);
}

void dt_agent_progress(dt_conn_t *k, const dt_msg_t *m)
{
    dt_emsg_t em = { "" };
    dt_live_agent_t *a = own_agent(k, m);
    int64_t step = 0, tokens = 0;
    json_t *loss;
    int rc;

    if (a == NULL)
        return;
    if ((rc = dt_msg_get_int(m, "step", &step, &em)) < 0 ||
        (rc = dt_msg_opt_int(m, "tokens", &tokens, &em)) < 0) {
        dt_conn_error(k, m->id, rc, "%s", em.s);
        return;
    }
    a->step = step;
    a->tokens = tokens;
    if ((loss = json_object_get(m->body, "loss")) && json_is_number(loss))
        a->loss = json_number_value(loss);
    dt_conn_reply(k, DT_MSG_OK, m->id, NULL);
    dt_run_progress(k->coord, a, m);
}

void dt_agent_worker_exit(dt_conn_t *k, const dt_msg_t *m)
{
    dt_emsg_t em = { "" };
    dt_live_agent_t *a = own_agent(k, m);
    int64_t gen = 0, rank = 0, status = 0, sig = 0;
    int rc;

    if (a == NULL)
        return;
    if ((rc = dt_msg_get_int(m, "rank", &rank, &em)) < 0 ||
        (rc = dt_msg_opt_int(m, "gen", &gen, &em)) < 0 ||
        (rc = dt_msg_opt_int(m, "status", &status, &em)) < 0 ||
        (rc = dt_msg_opt_int(m, "signal", &sig, &em)) < 0) {
        dt_conn_error(k, m->id, rc, "%s", em.s);
        return;
    }
    if ((rc = dt_jobs_worker_exit(k->coord, a, gen, rank, status, sig, &em)) < 0) {
        dt_conn_error(k, m->id, rc, "%s", em.s);
        return;
    }
    dt_conn_reply(k, DT_MSG_OK, m->id, NULL);
    dt_run_worker_exit(k->coord, a, m);
}

void dt_agent_shard_written(dt_conn_t *k, const dt_msg_t *m)
{
    dt_emsg_t em = { "" };
    dt_live_agent_t *a = own_agent(k, m);
    int64_t step, rank, bytes;
    const char *path, *sha;
    int rc;

    if (a == NULL)
        return;
    if ((rc = dt_msg_get_int(m, "step", &step, &em)) < 0 ||
        (rc = dt_msg_get_int(m, "rank", &rank, &em)) < 0 ||
        (rc = dt_msg_get_int(m, "bytes", &bytes, &em)) < 0 ||
        (rc = dt_msg_get_text(m, "path", DT_JOBS_PATH_MAX, &path, &em)) < 0 ||
        (rc = dt_msg_get_str(m, "sha256", &sha, &em)) < 0) {
        dt_conn_error(k, m->id, rc, "%s", em.s);
        return;
    }
    if (step < 0 || rank < 0 || rank > 1 << 24 || bytes < 0 || strlen(sha) != 64 ||
        strspn(sha, "0123456789abcdef") != 64) {
        dt_conn_error(k, m->id, DT_EINVAL, "shard: bad step, rank, bytes or sha256");
        return;
    }
    int manifest = 0;
    if ((rc = dt_msg_opt_bool(m, "manifest", &manifest, &em)) < 0) {
        dt_conn_error(k, m->id, rc, "%s", em.s);
        return;
    }
    /* the manifest is not a rank's shard: it lists the sha256 each rank's
     * shard must have, as the agent read it (the coordinator does not open
     * the job's files) */
    if (manifest) {
        json_t *shards = json_object_get(m->body, "shards"), *v;
        size_t i;
        if (!json_is_array(shards) || json_array_size(shards) == 0 ||
            json_array_size(shards) > 1 << 24) {
            dt_conn_error(k, m->id, DT_EPROTO, "manifest: field 'shards' must be a non-empty "
                          "array of sha256 strings");
            return;
        }
        json_array_foreach(shards, i, v) {
            const char *h = json_string_value(v);
            if (h == NULL || strlen(h) != 64 || strspn(h, "0123456789abcdef") != 64) {
                dt_conn_error(k, m->id, DT_EPROTO, "manifest: shards[%zu] is not a sha256", i);
                return;
            }
        }
        rc = dt_jobs_manifest(k->coord, a->job, step, shards, &em);
    } else {
        rc = dt_jobs_shard(k->coord, a->job, step, (int)rank, path, bytes, sha, &em);
    }
    if (rc < 0) {
        dt_conn_error(k, m->id, rc, "%s", em.s);
        return;
    }
    dt_conn_reply(k, DT_MSG_OK, m->id, NULL);
    dt_run_shard(k->coord, a, m);
}

void dt_agent_ckpt_done(dt_conn_t *k, const dt_msg_t *m)
{
    dt_emsg_t em = { "" };
    dt_live_agent_t *a = own_agent(k, m);
    const char *op;
    int64_t step;
    int ok, rc;

    if (a == NULL)
        return;
    if ((rc = dt_msg_get_str(m, "op", &op, &em)) < 0 ||
        (rc = dt_msg_get_int(m, "step", &step, &em)) < 0 ||
        (rc = dt_msg_opt_bool(m, "ok", &ok, &em)) < 0) {
        dt_conn_error(k, m->id, rc, "%s", em.s);
        return;
    }
    if ((strcmp(op, "commit") != 0 && strcmp(op, "prune") != 0) || step < 0) {
        dt_conn_error(k, m->id, DT_EPROTO, "checkpoint done: op must be commit or prune, step "
                      ">= 0");
        return;
    }
    dt_conn_reply(k, DT_MSG_OK, m->id, NULL);
    dt_run_ckpt_done(k->coord, a, m);
}

void dt_agent_fence(dt_conn_t *k, const dt_msg_t *m)
{
    dt_live_agent_t *a = own_agent(k, m);
    if (a)
        dt_run_fence(k, a, m);
}

void dt_agent_gen_ended(dt_conn_t *k, const dt_msg_t *m)
{
    dt_live_agent_t *a = own_agent(k, m);
    if (a == NULL)
        return;
    dt_conn_reply(k, DT_MSG_OK, m->id, NULL);
    dt_run_gen_ended(k->coord, a, m);
}

void dt_agent_preempt(dt_conn_t *k, const dt_msg_t *m)
{
    dt_emsg_t em = { "" };
    const char *sig = NULL;
    dt_live_agent_t *a = own_agent(k, m);
    int rc;

    if (a == NULL)
        return;
    /* the signal's name goes into an event: USR1, TERM, ... */
    if ((rc = dt_msg_opt_text(m, "signal", 16, &sig, &em)) < 0 ||
        (sig && (*sig == '\0' || sig[strspn(sig, "ABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789+")]))) {
        dt_conn_error(k, m->id, DT_EINVAL, "%s",
                      rc < 0 ? em.s : "field 'signal': a signal name such as USR1");
        return;
    }
    dt_conn_reply(k, DT_MSG_OK, m->id, NULL);
    /* a running generation checkpoints and stops, then the job is
     * requeued; ignored, with an event, for a job not run by Slurm */
    dt_fault_t f = { .kind = DT_FAULT_PREEMPT, .rank = -1, .agent = a->id, .node = a->node,
                     .signal = sig ? sig : "USR1" };
    dt_recovery_fault(k->coord, a->job, &f);
}
