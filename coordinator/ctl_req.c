/* SPDX-License-Identifier: MIT
 *
 * dtctl's request handlers (ctl_req.h): decode, call jobs.c as the peer,
 * encode the reply. Nothing here touches the database or a generation.
 */
#include "config.h"

#include <stdio.h>
#include <stdlib.h>

#include "coordinator/ctl_req.h"
#include "coordinator/jobs.h"

static dt_caller_t caller(const dt_conn_t *k)
{
    return (dt_caller_t){ .uid = k->uid, .gid = k->gid };
}

/* Load the job `id` if the peer may see it; on failure reply and return
 * < 0. */
static int load_visible(dt_conn_t *k, const dt_msg_t *m, int64_t id, dt_job_t *j)
{
    dt_caller_t who = caller(k);
    dt_emsg_t em = { "" };
    int rc;

    if ((rc = dt_jobs_get(k->coord, &who, id, j, &em)) < 0) {
        dt_conn_error(k, m->id, rc, "%s", em.s);
        return rc;
    }
    return 0;
}

/* Decode a request that names a job, and load it; on failure reply and
 * return < 0. */
static int job_request(dt_conn_t *k, const dt_msg_t *m, dt_job_t *j)
{
    const dt_wire_schema_t *s = dt_wire_schema(m->type, false);
    dt_wire_job_ref_t ref;
    dt_emsg_t em = { "" };
    int rc;

    if ((rc = dt_wire_decode(s, m->body, &ref, &em)) < 0) {
        dt_conn_error(k, m->id, rc, "%s", em.s);
        return rc;
    }
    return load_visible(k, m, ref.id, j);
}

void dt_ctl_submit(dt_conn_t *k, const dt_msg_t *m)
{
    dt_caller_t who = caller(k);
    dt_emsg_t em = { "" };
    dt_wire_submit_t req;
    dt_submitted_t s;
    int rc;

    /* a malformed dry_run reads as false, as it always has */
    if ((rc = dt_wire_submit_decode(m, &req, &em)) < 0) {
        dt_conn_error(k, m->id, rc, "%s", em.s);
        return;
    }
    rc = dt_jobs_submit(k->coord, &who, req.spec, req.name, req.dry_run, &s, &em);
    if (rc < 0 && s.refused) {
        dt_wire_error_t e = { .code = rc, .error = em.s, .refused = true };
        dt_conn_reply(k, DT_MSG_ERROR, m->id, dt_wire_error_encode(&e));
    } else if (rc < 0) {
        dt_conn_error(k, m->id, rc, "%s", em.s);
    } else if (req.dry_run) {
        const dt_slurm_desc_t *d = &s.desc;
        json_t *opts = json_pack("{s:s, s:i, s:i, s:i, s:i, s:i, s:s, s:s}", "name", d->name,
                                 "nodes", (int)d->nodes, "cpus_per_task", (int)d->cpus_per_task,
                                 "gpus_per_node", (int)d->gpus_per_node, "time_min",
                                 (int)d->time_min, "signal_lead_s", (int)d->signal_lead_s,
                                 "output", d->output ? d->output : "", "workdir",
                                 d->workdir ? d->workdir : "");
        dt_wire_submit_ok_t ok = { .plan = s.plan, .script = d->script, .slurm = opts };
        dt_conn_reply(k, DT_MSG_OK, m->id, dt_wire_submit_ok_encode(&ok));
        json_decref(opts);
    } else {
        dt_wire_submit_ok_t ok = { .id = s.id, .state = "queued", .plan = s.plan };
        dt_conn_reply(k, DT_MSG_OK, m->id, dt_wire_submit_ok_encode(&ok));
    }
    dt_submitted_clear(&s);
}

void dt_ctl_list(dt_conn_t *k, const dt_msg_t *m)
{
    dt_caller_t who = caller(k);
    dt_emsg_t em = { "" };
    json_t *jobs;
    int rc = dt_jobs_list(k->coord, &who, &jobs, &em);

    if (rc < 0)
        dt_conn_error(k, m->id, rc, "%s", em.s);
    else
        dt_conn_reply(k, DT_MSG_OK, m->id, json_pack("{s:o}", "jobs", jobs));
}

void dt_ctl_show(dt_conn_t *k, const dt_msg_t *m)
{
    dt_job_t j;

    if (job_request(k, m, &j) < 0)
        return;
    dt_conn_reply(k, DT_MSG_OK, m->id, dt_jobs_show(k->coord, &j));
    dt_job_clear(&j);
}

void dt_ctl_cancel(dt_conn_t *k, const dt_msg_t *m)
{
    dt_caller_t who = caller(k);
    dt_emsg_t em = { "" };
    dt_wire_cancel_t req;
    bool stopping;
    dt_job_t j;
    int rc;

    if ((rc = dt_wire_cancel_decode(m, &req, &em)) < 0) {
        dt_conn_error(k, m->id, rc, "%s", em.s);
        return;
    }
    if (load_visible(k, m, req.id, &j) < 0)
        return;
    if ((rc = dt_jobs_cancel(k->coord, &who, &j, req.reason, req.checkpoint, &stopping,
                             &em)) < 0) {
        dt_conn_error(k, m->id, rc, "%s", em.s);
    } else {
        dt_wire_cancel_ok_t ok = { .id = j.id,
                                   .state = stopping ? dt_job_state_name(j.state) : "cancelled",
                                   .stopping = stopping };
        dt_conn_reply(k, DT_MSG_OK, m->id, dt_wire_cancel_ok_encode(&ok));
    }
    dt_job_clear(&j);
}

void dt_ctl_events(dt_conn_t *k, const dt_msg_t *m)
{
    dt_emsg_t em = { "" };
    dt_wire_events_t req;
    json_t *evs;
    dt_job_t j;
    int rc;

    if ((rc = dt_wire_events_decode(m, &req, &em)) < 0) {
        dt_conn_error(k, m->id, rc, "%s", em.s);
        return;
    }
    if (load_visible(k, m, req.id, &j) < 0)
        return;
    if ((rc = dt_jobs_events(k->coord, j.id, req.since, &evs, &em)) < 0)
        dt_conn_error(k, m->id, rc, "%s", em.s);
    else
        dt_conn_reply(k, DT_MSG_OK, m->id, json_pack("{s:o}", "events", evs));
    dt_job_clear(&j);
}

void dt_ctl_checkpoints(dt_conn_t *k, const dt_msg_t *m)
{
    dt_emsg_t em = { "" };
    json_t *cks;
    dt_job_t j;
    int rc;

    if (job_request(k, m, &j) < 0)
        return;
    if ((rc = dt_jobs_checkpoints(k->coord, j.id, &cks, &em)) < 0)
        dt_conn_error(k, m->id, rc, "%s", em.s);
    else
        dt_conn_reply(k, DT_MSG_OK, m->id, json_pack("{s:o}", "checkpoints", cks));
    dt_job_clear(&j);
}

void dt_ctl_checkpoint(dt_conn_t *k, const dt_msg_t *m)
{
    dt_emsg_t em = { "" };
    dt_job_t j;
    int gen = 0, rc;

    if (job_request(k, m, &j) < 0)
        return;
    if ((rc = dt_jobs_checkpoint(k->coord, j.id, &gen, &em)) < 0) {
        dt_conn_error(k, m->id, rc, "%s", em.s);
    } else {
        dt_wire_checkpoint_ok_t ok = { .id = j.id, .gen = gen };
        dt_conn_reply(k, DT_MSG_OK, m->id, dt_wire_checkpoint_ok_encode(&ok));
    }
    dt_job_clear(&j);
}

void dt_ctl_resume(dt_conn_t *k, const dt_msg_t *m)
{
    dt_caller_t who = caller(k);
    dt_emsg_t em = { "" };
    int64_t step = 0;
    dt_job_t j;
    int rc;

    if (job_request(k, m, &j) < 0)
        return;
    if ((rc = dt_jobs_resume(k->coord, &who, &j, &step, &em)) < 0) {
        dt_conn_error(k, m->id, rc, "%s", em.s);
    } else {
        dt_wire_resume_ok_t ok = { .id = j.id, .state = "queued", .step = step };
        dt_conn_reply(k, DT_MSG_OK, m->id, dt_wire_resume_ok_encode(&ok));
    }
    dt_job_clear(&j);
}

void dt_ctl_history(dt_conn_t *k, const dt_msg_t *m)
{
    dt_emsg_t em = { "" };
    json_t *h;
    dt_job_t j;
    int rc;

    if (job_request(k, m, &j) < 0)
        return;
    if ((rc = dt_jobs_history(k->coord, &j, &h, &em)) < 0)
        dt_conn_error(k, m->id, rc, "%s", em.s);
    else
        dt_conn_reply(k, DT_MSG_OK, m->id, h);
    dt_job_clear(&j);
}
