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

/* Load the job named by the request's "id" if the peer may see it; on
 * failure reply and return < 0. */
static int load_visible(dt_conn_t *k, const dt_msg_t *m, dt_job_t *j)
{
    dt_caller_t who = caller(k);
    dt_emsg_t em = { "" };
    int64_t id;
    int rc;

    if ((rc = dt_msg_get_int(m, "id", &id, &em)) < 0 ||
        (rc = dt_jobs_get(k->coord, &who, id, j, &em)) < 0) {
        dt_conn_error(k, m->id, rc, "%s", em.s);
        return rc;
    }
    return 0;
}

void dt_ctl_submit(dt_conn_t *k, const dt_msg_t *m)
{
    dt_caller_t who = caller(k);
    dt_emsg_t em = { "" };
    const char *text, *name = NULL;
    dt_submitted_t s;
    int dry = 0, rc;

    if ((rc = dt_msg_get_str(m, "spec", &text, &em)) < 0 ||
        (rc = dt_msg_opt_text(m, "name", DT_JOBS_NAME_MAX, &name, &em)) < 0) {
        dt_conn_error(k, m->id, rc, "%s", em.s);
        return;
    }
    /* a malformed dry_run reads as false, as it always has */
    dt_emsg_t e2 = { "" };
    if (dt_msg_opt_bool(m, "dry_run", &dry, &e2) < 0)
        dry = 0;
    rc = dt_jobs_submit(k->coord, &who, text, name, dry, &s, &em);
    if (rc < 0 && s.refused) {
        dt_conn_reply(k, DT_MSG_ERROR, m->id,
                      json_pack("{s:i, s:s, s:b}", "code", rc, "error", em.s, "refused", 1));
    } else if (rc < 0) {
        dt_conn_error(k, m->id, rc, "%s", em.s);
    } else if (dry) {
        const dt_slurm_desc_t *d = &s.desc;
        json_t *opts = json_pack("{s:s, s:i, s:i, s:i, s:i, s:i, s:s, s:s}", "name", d->name,
                                 "nodes", (int)d->nodes, "cpus_per_task", (int)d->cpus_per_task,
                                 "gpus_per_node", (int)d->gpus_per_node, "time_min",
                                 (int)d->time_min, "signal_lead_s", (int)d->signal_lead_s,
                                 "output", d->output ? d->output : "", "workdir",
                                 d->workdir ? d->workdir : "");
        dt_conn_reply(k, DT_MSG_OK, m->id,
                      json_pack("{s:O, s:s, s:o}", "plan", s.plan, "script", d->script, "slurm",
                                opts));
    } else {
        dt_conn_reply(k, DT_MSG_OK, m->id,
                      json_pack("{s:I, s:s, s:O}", "id", (json_int_t)s.id, "state", "queued",
                                "plan", s.plan));
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

    if (load_visible(k, m, &j) < 0)
        return;
    dt_conn_reply(k, DT_MSG_OK, m->id, dt_jobs_show(k->coord, &j));
    dt_job_clear(&j);
}

void dt_ctl_cancel(dt_conn_t *k, const dt_msg_t *m)
{
    dt_caller_t who = caller(k);
    dt_emsg_t em = { "" };
    const char *why = NULL;
    bool stopping;
    dt_job_t j;
    int ckpt = 0, rc;

    if (load_visible(k, m, &j) < 0)
        return;
    if ((rc = dt_msg_opt_text(m, "reason", DT_JOBS_REASON_MAX, &why, &em)) < 0 ||
        (rc = dt_msg_opt_bool(m, "checkpoint", &ckpt, &em)) < 0 ||
        (rc = dt_jobs_cancel(k->coord, &who, &j, why, ckpt, &stopping, &em)) < 0)
        dt_conn_error(k, m->id, rc, "%s", em.s);
    else if (stopping)
        dt_conn_reply(k, DT_MSG_OK, m->id,
                      json_pack("{s:I, s:s, s:b}", "id", (json_int_t)j.id, "state",
                                dt_job_state_name(j.state), "stopping", 1));
    else
        dt_conn_reply(k, DT_MSG_OK, m->id,
                      json_pack("{s:I, s:s}", "id", (json_int_t)j.id, "state", "cancelled"));
    dt_job_clear(&j);
}

void dt_ctl_events(dt_conn_t *k, const dt_msg_t *m)
{
    dt_emsg_t em = { "" };
    int64_t since = 0;
    json_t *evs;
    dt_job_t j;
    int rc;

    if (load_visible(k, m, &j) < 0)
        return;
    if ((rc = dt_msg_opt_int(m, "since", &since, &em)) < 0 ||
        (rc = dt_jobs_events(k->coord, j.id, since, &evs, &em)) < 0)
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

    if (load_visible(k, m, &j) < 0)
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

    if (load_visible(k, m, &j) < 0)
        return;
    if ((rc = dt_jobs_checkpoint(k->coord, j.id, &gen, &em)) < 0)
        dt_conn_error(k, m->id, rc, "%s", em.s);
    else
        dt_conn_reply(k, DT_MSG_OK, m->id,
                      json_pack("{s:I, s:i}", "id", (json_int_t)j.id, "gen", gen));
    dt_job_clear(&j);
}

void dt_ctl_resume(dt_conn_t *k, const dt_msg_t *m)
{
    dt_caller_t who = caller(k);
    dt_emsg_t em = { "" };
    int64_t step = 0;
    dt_job_t j;
    int rc;

    if (load_visible(k, m, &j) < 0)
        return;
    if ((rc = dt_jobs_resume(k->coord, &who, &j, &step, &em)) < 0)
        dt_conn_error(k, m->id, rc, "%s", em.s);
    else
        dt_conn_reply(k, DT_MSG_OK, m->id,
                      json_pack("{s:I, s:s, s:I}", "id", (json_int_t)j.id, "state", "queued",
                                "step", (json_int_t)step));
    dt_job_clear(&j);
}
