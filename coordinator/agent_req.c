/* SPDX-License-Identifier: MIT
 *
 * dtagentd's request handlers (agent_req.h). Each checks the sender and
 * the fields, replies, then hands the report on: registration to jobs.c,
 * generations' reports to run.c, Slurm's warning signal to the recovery
 * policy.
 */
#include "config.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/clock.h"
#include "common/log.h"
#include "common/wire.h"
#include "coordinator/agent_req.h"
#include "coordinator/jobs.h"
#include "coordinator/recovery.h"
#include "coordinator/run.h"

void dt_agent_register(dt_conn_t *k, const dt_msg_t *m)
{
    dt_coord_t *c = k->coord;
    dt_caller_t who = { .uid = k->uid, .gid = k->gid };
    dt_emsg_t em = { "" };
    dt_wire_register_t reg;
    dt_live_agent_t *a;
    int rc;

    /* the node name is stored and shown (dtctl show, watch, events) and
     * logged: printable text only, refused with the reason otherwise */
    if ((rc = dt_wire_register_decode(m, &reg, &em)) < 0) {
        if (rc == DT_EINVAL)
            dt_log_warn("peer=%s registration refused: %s", k->peer, em.s);
        dt_conn_error(k, m->id, rc, "register: %s", em.s);
        return;
    }
    /* the pid is shown only, the generation and ranks are the agent's
     * account of its workers: malformed, they read as none */
    if (rc > 0)
        dt_log_warn("peer=%s REGISTER: %s", k->peer, em.s);
    if ((rc = dt_jobs_agent_register(c, &who, &reg, &a, &em)) < 0) {
        dt_conn_error(k, m->id, rc, "%s", em.s);
        dt_wire_register_clear(&reg);
        return;
    }
    a->conn = k;
    k->agent = a->id;
    dt_wire_register_ok_t ok = { .agent = a->id, .heartbeat_ms = c->conf.heartbeat_ms };
    dt_conn_reply(k, DT_MSG_OK, m->id, dt_wire_register_ok_encode(&ok));
    dt_run_registered(c, a, &reg);
    dt_wire_register_clear(&reg);
}

/* The live agent a report comes from, which must be the one this
 * connection registered; on failure reply and return NULL. */
static dt_live_agent_t *own_agent(dt_conn_t *k, const dt_msg_t *m, int64_t aid)
{
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

/* A report that does not decode is refused with the field it names; one
 * whose lenient fields were mistyped is taken, and the reason logged. */
static bool refused(dt_conn_t *k, const dt_msg_t *m, int rc, const dt_emsg_t *em)
{
    if (rc < 0) {
        dt_conn_error(k, m->id, rc, "%s", em->s);
        return true;
    }
    if (rc > 0)
        dt_log_warn("agent=%lld %s: %s", (long long)k->agent, dt_msg_type_name(m->type), em->s);
    return false;
}

void dt_agent_heartbeat(dt_conn_t *k, const dt_msg_t *m)
{
    dt_emsg_t em = { "" };
    dt_wire_agent_ref_t hb;

    if (!refused(k, m, dt_wire_heartbeat_decode(m, &hb, &em), &em) && own_agent(k, m, hb.agent))
        dt_conn_reply(k, DT_MSG_OK, m->id, NULL);
}

void dt_agent_progress(dt_conn_t *k, const dt_msg_t *m)
{
    dt_emsg_t em = { "" };
    dt_wire_progress_t p;
    dt_live_agent_t *a;

    if (refused(k, m, dt_wire_progress_decode(m, &p, &em), &em) ||
        (a = own_agent(k, m, p.agent)) == NULL)
        return;
    a->step = p.step;
    a->tokens = p.tokens;
    if (isfinite(p.loss))
        a->loss = p.loss;
    dt_conn_reply(k, DT_MSG_OK, m->id, NULL);
    dt_run_progress(k->coord, a, &p);
}

void dt_agent_mem_ckpt(dt_conn_t *k, const dt_msg_t *m)
{
    dt_emsg_t em = { "" };
    dt_wire_mem_ckpt_t mc;
    dt_live_agent_t *a;

    if (refused(k, m, dt_wire_mem_ckpt_decode(m, &mc, &em), &em) ||
        (a = own_agent(k, m, mc.agent)) == NULL)
        return;
    dt_conn_reply(k, DT_MSG_OK, m->id, NULL);
    dt_run_mem_ckpt(k->coord, a, &mc);
}

void dt_agent_worker_exit(dt_conn_t *k, const dt_msg_t *m)
{
    dt_emsg_t em = { "" };
    dt_wire_worker_exit_t x;
    dt_live_agent_t *a;
    int rc;

    if (refused(k, m, dt_wire_worker_exit_decode(m, &x, &em), &em) ||
        (a = own_agent(k, m, x.agent)) == NULL)
        return;
    if ((rc = dt_jobs_worker_exit(k->coord, a, x.gen, x.rank, x.status, x.signal, &em)) < 0) {
        dt_conn_error(k, m->id, rc, "%s", em.s);
        return;
    }
    dt_conn_reply(k, DT_MSG_OK, m->id, NULL);
    dt_run_worker_exit(k->coord, a, &x);
}

void dt_agent_shard_written(dt_conn_t *k, const dt_msg_t *m)
{
    dt_emsg_t em = { "" };
    dt_wire_shard_written_t s;
    dt_live_agent_t *a;
    int rc;

    if (refused(k, m, dt_wire_shard_written_decode(m, &s, &em), &em))
        return;
    if ((a = own_agent(k, m, s.agent)) == NULL)
        goto out;
    /* the manifest is not a rank's shard: it lists the sha256 each rank's
     * shard must have, as the agent read it (the coordinator does not open
     * the job's files) */
    if (s.manifest && s.shards.n == 0) {
        dt_conn_error(k, m->id, DT_EPROTO, "manifest: field 'shards' must be a non-empty "
                      "array of sha256 strings");
        goto out;
    }
    if (s.manifest)
        rc = dt_jobs_manifest(k->coord, a->job, s.step, &s.shards, &em);
    else
        rc = dt_jobs_shard(k->coord, a->job, s.step, (int)s.rank, s.path, s.bytes, s.sha256, &em);
    if (rc < 0) {
        dt_conn_error(k, m->id, rc, "%s", em.s);
        goto out;
    }
    dt_conn_reply(k, DT_MSG_OK, m->id, NULL);
    dt_run_shard(k->coord, a, &s);
out:
    dt_wire_shard_written_clear(&s);
}

void dt_agent_ckpt_done(dt_conn_t *k, const dt_msg_t *m)
{
    dt_emsg_t em = { "" };
    dt_wire_ckpt_done_t d;
    dt_live_agent_t *a;

    if (refused(k, m, dt_wire_ckpt_done_decode(m, &d, &em), &em) ||
        (a = own_agent(k, m, d.agent)) == NULL)
        return;
    if (strcmp(d.op, "commit") != 0 && strcmp(d.op, "prune") != 0) {
        dt_conn_error(k, m->id, DT_EPROTO, "checkpoint done: op must be commit or prune");
        return;
    }
    dt_conn_reply(k, DT_MSG_OK, m->id, NULL);
    dt_run_ckpt_done(k->coord, a, &d);
}

void dt_agent_fence(dt_conn_t *k, const dt_msg_t *m)
{
    dt_emsg_t em = { "" };
    dt_wire_fence_t f;
    dt_live_agent_t *a;

    if (!refused(k, m, dt_wire_fence_decode(m, &f, &em), &em) &&
        (a = own_agent(k, m, f.agent)) != NULL)
        dt_run_fence(k, a, m->id, &f);
}

void dt_agent_gen_ended(dt_conn_t *k, const dt_msg_t *m)
{
    dt_emsg_t em = { "" };
    dt_wire_agent_ref_t e;
    dt_live_agent_t *a;

    if (refused(k, m, dt_wire_gen_ended_decode(m, &e, &em), &em) ||
        (a = own_agent(k, m, e.agent)) == NULL)
        return;
    dt_conn_reply(k, DT_MSG_OK, m->id, NULL);
    dt_run_gen_ended(k->coord, a, &e);
}

void dt_agent_preempt(dt_conn_t *k, const dt_msg_t *m)
{
    dt_emsg_t em = { "" };
    dt_wire_preempt_t p;
    dt_live_agent_t *a;
    int rc;

    /* the signal's name goes into an event: USR1, TERM, ... */
    if ((rc = dt_wire_preempt_decode(m, &p, &em)) < 0) {
        dt_conn_error(k, m->id, rc, "%s", em.s);
        return;
    }
    if ((a = own_agent(k, m, p.agent)) == NULL)
        return;
    if (p.signal && p.signal[strspn(p.signal, "ABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789+")]) {
        dt_conn_error(k, m->id, DT_EINVAL, "field 'signal': a signal name such as USR1");
        return;
    }
    dt_conn_reply(k, DT_MSG_OK, m->id, NULL);
    /* a running generation checkpoints and stops, then the job is
     * requeued; ignored, with an event, for a job not run by Slurm */
    dt_fault_t f = { .kind = DT_FAULT_PREEMPT, .rank = -1, .agent = a->id, .node = a->node,
                     .signal = p.signal ? p.signal : "USR1" };
    dt_recovery_fault(k->coord, a->job, &f);
}
