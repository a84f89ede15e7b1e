/* SPDX-License-Identifier: MIT
 *
 * Request handlers for jobs (dtctl) and agents (dtagentd). A submitted spec
 * is parsed and planned before anything is stored: a job that cannot be
 * planned is refused with the planner's reason and leaves no row. A planned
 * job waits in `queued` until agents start it: agents started by hand or
 * by `dtctl run --local`, or, with slurm = yes, the batch job alloc.c
 * submits for it.
 */
#include "config.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/log.h"
#include "common/mem.h"
#include "common/text.h"
#include "spec/spec.h"
#include "coordinator/alloc.h"
#include "coordinator/auth.h"
#include "coordinator/job.h"
#include "coordinator/jobdir.h"
#include "coordinator/run.h"
#include "plan/planner.h"

/* Text that users and agents hand in, bounded where it enters (and
 * checked by dt_msg_get_text: printable UTF-8). */
#define NAME_MAX_BYTES 255   /* job and node names */
#define REASON_MAX_BYTES 256 /* a cancel's reason */
#define PATH_MAX_BYTES 4096  /* a shard's path */

/* A stored string as JSON. One that is not valid UTF-8 (a row written by
 * something else, or before names were checked) goes out escaped rather
 * than not at all: jansson refuses it, and the whole reply would fail. */
static json_t *jtext(const char *s)
{
    json_t *v = json_string(s ? s : "");

    if (v == NULL) {
        char *e = dt_text_escape(s, DT_TEXT_KEEP_LINES);
        v = json_string(e);
        free(e);
    }
    return v;
}

static int is_admin(const dt_conn_t *k)
{
    return dt_auth_is_admin(k->uid, k->gid, k->coord->conf.admin_group);
}

/* The job's current Slurm job as dtctl shows it, or JSON null. */
static json_t *slurm_json(dt_db_t *db, const dt_job_t *j)
{
    dt_slurm_job_t s;
    dt_emsg_t em = { "" };

    if (j->slurm_id == 0 || dt_db_slurm_get(db, j->id, &s, &em) < 0)
        return json_null();
    json_t *o = json_pack("{s:I, s:o, s:o, s:o, s:o, s:o, s:i, s:i, s:I}", "id",
                          (json_int_t)s.slurm_id, "state", jtext(s.state), "reason",
                          jtext(s.reason), "nodes", jtext(s.nodes), "exclude", jtext(s.exclude),
                          "output", jtext(s.output), "restarts", s.restarts, "exit_code",
                          s.exit_code, "updated_ms", (json_int_t)s.updated_ms);
    dt_slurm_job_clear(&s);
    return o;
}

static json_t *job_json(dt_db_t *db, const dt_job_t *j)
{
    json_t *o = json_pack("{s:I, s:o, s:i, s:s, s:I, s:i, s:I, s:I}", "id", (json_int_t)j->id,
                          "name", jtext(j->name), "owner", (int)j->owner, "state",
                          dt_job_state_name(j->state), "slurm_id", (json_int_t)j->slurm_id,
                          "restarts", j->restarts, "created_ms", (json_int_t)j->created_ms,
                          "updated_ms", (json_int_t)j->updated_ms);
    json_object_set_new(o, "reason", j->reason ? jtext(j->reason) : json_null());
    json_object_set_new(o, "slurm", slurm_json(db, j));
    int requeues = 0, base = 0;
    dt_emsg_t em = { "" };
    dt_db_job_counts(db, j->id, &requeues, &base, &em);
    json_object_set_new(o, "requeues", json_integer(requeues));
    return o;
}

/* Load a job the peer may see; on failure reply and return < 0. */
static int load_visible(dt_conn_t *k, const dt_msg_t *m, dt_job_t *j)
{
    dt_emsg_t em = { "" };
    int64_t id;
    int rc;

    if ((rc = dt_msg_get_int(m, "id", &id, &em)) < 0) {
        dt_conn_error(k, m->id, rc, "%s", em.s);
        return rc;
    }
    if ((rc = dt_db_job_get(k->coord->db, id, j, &em)) < 0) {
        if (rc == DT_ENOENT)
            dt_conn_error(k, m->id, rc, "job %lld not found", (long long)id);
        else
            dt_conn_error(k, m->id, rc, "%s", em.s);
        return rc;
    }
    if (j->owner != k->uid && !is_admin(k)) {
        dt_conn_error(k, m->id, DT_EPERM, "job %lld belongs to another user: permission denied",
                      (long long)id);
        dt_job_clear(j);
        return DT_EPERM;
    }
    return 0;
}

void dt_job_submit(dt_conn_t *k, const dt_msg_t *m)
{
    dt_coord_t *c = k->coord;
    dt_emsg_t em = { "" };
    const char *text, *name = NULL;
    dt_spec_t spec;
    dt_plan_req_t req;
    dt_plan_t plan = { 0 };
    char *canon = NULL, *plan_text = NULL;
    int64_t id = 0;
    int rc;

    if ((rc = dt_msg_get_str(m, "spec", &text, &em)) < 0 ||
        (rc = dt_msg_opt_text(m, "name", NAME_MAX_BYTES, &name, &em)) < 0) {
        dt_conn_error(k, m->id, rc, "%s", em.s);
        return;
    }
    if ((rc = dt_spec_parse("spec", text, &spec, &em)) < 0) {
        dt_conn_error(k, m->id, rc, "%s", em.s);
        return;
    }
    if (name && *name) {
        free(spec.name);
        spec.name = dt_xstrdup(name);
    }
    if ((rc = dt_plan_req_from_spec(&spec, &req, &em)) < 0 ||
        (rc = dt_plan_make(&req, &plan, &em)) < 0 ||
        (rc = dt_alloc_check(c, &spec, &req, &plan, k->uid, &em)) < 0) {
        json_t *e = json_pack("{s:i, s:s, s:b}", "code", rc, "error", em.s, "refused", 1);
        dt_log_info("uid=%u submit refused: %s", (unsigned)k->uid, em.s);
        dt_conn_reply(k, DT_MSG_ERROR, m->id, e);
        goto out;
    }
    json_t *pj = dt_plan_to_json(&req, &plan);
    int dry = 0;
    if ((rc = dt_msg_opt_bool(m, "dry_run", &dry, &em)) < 0) { /* refused, not guessed */
        json_decref(pj);
        dt_conn_error(k, m->id, rc, "%s", em.s);
        goto out;
    }
    if (dry) {
        /* what would be submitted, nothing stored */
        dt_slurm_desc_t d = { 0 };
        if ((rc = dt_alloc_describe(c, 0, &spec, &req, &plan, k->uid, &d, &em)) < 0) {
            json_decref(pj);
            dt_conn_error(k, m->id, rc, "%s", em.s);
            goto out;
        }
        json_t *opts = json_pack("{s:s, s:i, s:i, s:i, s:i, s:i, s:s, s:s}", "name", d.name,
                                 "nodes", (int)d.nodes, "cpus_per_task", (int)d.cpus_per_task,
                                 "gpus_per_node", (int)d.gpus_per_node, "time_min",
                                 (int)d.time_min, "signal_lead_s", (int)d.signal_lead_s,
                                 "output", d.output ? d.output : "", "workdir",
                                 d.workdir ? d.workdir : "");
        dt_conn_reply(k, DT_MSG_OK, m->id,
                      json_pack("{s:o, s:s, s:o}", "plan", pj, "script", d.script, "slurm",
                                opts));
        dt_slurm_desc_clear(&d);
        goto out;
    }
    plan_text = json_dumps(pj, JSON_COMPACT);
    canon = dt_spec_format(&spec);
    /* submitted, planned, queued: three events, one transaction */
    if ((rc = dt_db_begin(c->db, &em)) < 0)
        goto fail;
    if ((rc = dt_db_job_create(c->db, spec.name ? spec.name : "job", k->uid, canon, &id, &em)) < 0 ||
        (rc = dt_db_job_plan(c->db, id, plan_text, &em)) < 0 ||
        (rc = dt_db_job_transition(c->db, id, DT_JOB_QUEUED, NULL,
                                   c->alloc ? "submitting to Slurm"
                                            : "waiting for agents to register", &em)) < 0) {
        dt_db_rollback(c->db);
        goto fail;
    }
    if ((rc = dt_db_commit(c->db, &em)) < 0) {
    fail:
        json_decref(pj);
        dt_log_error("job=%lld submit failed: %s", (long long)id, em.s);
        dt_conn_error(k, m->id, rc, "%s", em.s);
        goto out;
    }
    dt_log_info("job=%lld uid=%u ranks=%d tokens=%lld submitted and queued", (long long)id,
                (unsigned)k->uid, plan.ranks, (long long)req.tokens);
    dt_conn_reply(k, DT_MSG_OK, m->id,
                  json_pack("{s:I, s:s, s:o}", "id", (json_int_t)id, "state", "queued", "plan",
                            pj));
    dt_alloc_submit(c, id);
out:
    free(canon);
    free(plan_text);
    dt_plan_clear(&plan);
    dt_spec_free(&spec);
}

typedef struct list_ctx {
    dt_db_t *db;
    json_t *jobs;
} list_ctx_t;

static int list_cb(const dt_job_t *j, void *arg)
{
    list_ctx_t *x = arg;
    json_array_append_new(x->jobs, job_json(x->db, j));
    return 0;
}

void dt_job_list(dt_conn_t *k, const dt_msg_t *m)
{
    dt_emsg_t em = { "" };
    json_t *jobs = json_array();
    list_ctx_t x = { k->coord->db, jobs };
    int rc = dt_db_job_list(k->coord->db, is_admin(k) ? -1 : (int64_t)k->uid, list_cb, &x, &em);

    if (rc < 0) {
        json_decref(jobs);
        dt_conn_error(k, m->id, rc, "%s", em.s);
        return;
    }
    dt_conn_reply(k, DT_MSG_OK, m->id, json_pack("{s:o}", "jobs", jobs));
}

static int agent_cb(const dt_agent_t *a, void *arg)
{
    json_array_append_new(arg, json_pack("{s:I, s:o, s:i, s:o, s:I, s:I}", "id",
                                         (json_int_t)a->id, "node", jtext(a->node), "slots",
                                         a->slots, "state", jtext(a->state), "registered_ms",
                                         (json_int_t)a->registered_ms, "last_seen_ms",
                                         (json_int_t)a->last_seen_ms));
    return 0;
}

void dt_job_show(dt_conn_t *k, const dt_msg_t *m)
{
    dt_emsg_t em = { "" };
    dt_job_t j;
    json_t *agents = json_array();

    if (load_visible(k, m, &j) < 0) {
        json_decref(agents);
        return;
    }
    dt_db_agents(k->coord->db, j.id, agent_cb, agents, &em);
    /* live progress from the agents of this job */
    json_t *prog = json_array();
    for (dt_live_agent_t *a = k->coord->agents; a; a = a->next)
        if (a->job == j.id && a->step > 0)
            json_array_append_new(prog, json_pack("{s:I, s:I, s:I, s:f}", "agent",
                                                  (json_int_t)a->id, "step", (json_int_t)a->step,
                                                  "tokens", (json_int_t)a->tokens, "loss",
                                                  a->loss));
    json_t *plan = j.plan ? json_loads(j.plan, 0, NULL) : NULL;
    json_t *reply = json_pack("{s:o, s:o, s:o, s:o, s:o}", "job", job_json(k->coord->db, &j),
                              "spec", jtext(j.spec), "plan", plan ? plan : json_null(), "agents",
                              agents, "progress", prog);
    /* the job's directory (its rank logs, its default checkpoints): a
     * path for dtctl, which reads it as the user */
    char *dir = dt_jobdir_path(k->coord->conf.jobs_dir, j.id);
    json_object_set_new(json_object_get(reply, "job"), "dir", json_string(dir));
    free(dir);
    dt_run_show(k->coord, j.id, reply);
    dt_conn_reply(k, DT_MSG_OK, m->id, reply);
    dt_job_clear(&j);
}

void dt_job_cancel(dt_conn_t *k, const dt_msg_t *m)
{
    dt_emsg_t em = { "" };
    const char *why = NULL;
    dt_job_t j;
    char detail[512];
    int rc;

    if (load_visible(k, m, &j) < 0)
        return;
    if ((rc = dt_msg_opt_text(m, "reason", REASON_MAX_BYTES, &why, &em)) < 0) {
        dt_conn_error(k, m->id, rc, "%s", em.s);
        goto out;
    }
    if (dt_job_state_terminal(j.state)) {
        dt_conn_error(k, m->id, DT_ESTATE, "job %lld is already %s", (long long)j.id,
                      dt_job_state_name(j.state));
        goto out;
    }
    snprintf(detail, sizeof(detail), "cancelled by uid %u%s%s", (unsigned)k->uid,
             why ? ": " : "", why ? why : "");
    int ckpt = 0;
    if ((rc = dt_msg_opt_bool(m, "checkpoint", &ckpt, &em)) < 0) {
        dt_conn_error(k, m->id, rc, "%s", em.s);
        goto out;
    }
    if (ckpt) {
        /* a planned stop: the job is cancelled once its workers have
         * written a checkpoint and exited */
        if ((rc = dt_run_stop(k->coord, j.id, detail, &em)) < 0) {
            dt_conn_error(k, m->id, rc, "%s", em.s);
            goto out;
        }
        dt_conn_reply(k, DT_MSG_OK, m->id,
                      json_pack("{s:I, s:s, s:b}", "id", (json_int_t)j.id, "state",
                                dt_job_state_name(j.state), "stopping", 1));
        goto out;
    }
    if ((rc = dt_db_job_transition(k->coord->db, j.id, DT_JOB_CANCELLED, NULL, detail, &em)) < 0) {
        dt_conn_error(k, m->id, rc, "%s", em.s);
        goto out;
    }
    dt_log_info("job=%lld uid=%u cancelled", (long long)j.id, (unsigned)k->uid);
    dt_run_cancelled(k->coord, j.id);
    dt_alloc_job_ended(k->coord, j.id, 1);
    dt_conn_reply(k, DT_MSG_OK, m->id,
                  json_pack("{s:I, s:s}", "id", (json_int_t)j.id, "state", "cancelled"));
out:
    dt_job_clear(&j);
}

static int event_cb(const dt_event_t *e, void *arg)
{
    json_t *o = json_pack("{s:I, s:I, s:o, s:o}", "id", (json_int_t)e->id, "at_ms",
                          (json_int_t)e->at_ms, "kind", jtext(e->kind), "state", jtext(e->state));
    json_object_set_new(o, "detail", e->detail ? jtext(e->detail) : json_null());
    json_array_append_new(arg, o);
    return 0;
}

void dt_job_events(dt_conn_t *k, const dt_msg_t *m)
{
    dt_emsg_t em = { "" };
    int64_t since = 0;
    dt_job_t j;
    int rc;

    if (load_visible(k, m, &j) < 0)
        return;
    json_t *evs = json_array();
    if ((rc = dt_msg_opt_int(m, "since", &since, &em)) < 0 ||
        (rc = dt_db_events(k->coord->db, j.id, since, event_cb, evs, &em)) < 0) {
        json_decref(evs);
        dt_conn_error(k, m->id, rc, "%s", em.s);
    } else {
        dt_conn_reply(k, DT_MSG_OK, m->id, json_pack("{s:o}", "events", evs));
    }
    dt_job_clear(&j);
}

static int ckpt_cb(const dt_checkpoint_t *ck, void *arg)
{
    json_array_append_new(arg, json_pack("{s:I, s:o, s:i, s:I, s:I, s:I}", "step",
                                         (json_int_t)ck->step, "state", jtext(ck->state), "shards",
                                         ck->shards, "bytes", (json_int_t)ck->bytes,
                                         "created_ms", (json_int_t)ck->created_ms,
                                         "committed_ms", (json_int_t)ck->committed_ms));
    return 0;
}

void dt_job_checkpoints(dt_conn_t *k, const dt_msg_t *m)
{
    dt_emsg_t em = { "" };
    dt_job_t j;
    int rc;

    if (load_visible(k, m, &j) < 0)
        return;
    json_t *cks = json_array();
    if ((rc = dt_db_checkpoints(k->coord->db, j.id, ckpt_cb, cks, &em)) < 0) {
        json_decref(cks);
        dt_conn_error(k, m->id, rc, "%s", em.s);
    } else {
        dt_conn_reply(k, DT_MSG_OK, m->id, json_pack("{s:o}", "checkpoints", cks));
    }
    dt_job_clear(&j);
}

/* ---- agents ---------------------------------------------------------------- */

void dt_agent_register(dt_conn_t *k, const dt_msg_t *m)
{
    dt_coord_t *c = k->coord;
    dt_emsg_t em = { "" };
    int64_t jid, slots, aid;
    const char *node;
    dt_job_t j;
    int rc;

    /* the node name is stored and shown (dtctl show, watch, events) and
     * logged: printable text only, refused with the reason otherwise */
    if ((rc = dt_msg_get_int(m, "job", &jid, &em)) < 0 ||
        (rc = dt_msg_get_text(m, "node", NAME_MAX_BYTES, &node, &em)) < 0 ||
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
    if ((rc = dt_db_job_get(c->db, jid, &j, &em)) < 0) {
        dt_conn_error(k, m->id, rc, "job %lld: %s", (long long)jid,
                      rc == DT_ENOENT ? "not found" : em.s);
        return;
    }
    if (j.owner != k->uid && !is_admin(k)) {
        dt_conn_error(k, m->id, DT_EPERM, "job %lld belongs to another user: permission denied",
                      (long long)jid);
        goto out;
    }
    if (j.owner != k->uid) {
        /* an admin's agent would write the user's checkpoints and logs with
         * the admin's rights: a job's agents run as its owner */
        dt_conn_error(k, m->id, DT_EPERM, "job %lld belongs to uid %lld: its agents must run "
                      "as that user, not as uid %u", (long long)jid, (long long)j.owner,
                      (unsigned)k->uid);
        goto out;
    }
    if (dt_job_state_terminal(j.state)) {
        dt_conn_error(k, m->id, DT_ESTATE, "job %lld is %s", (long long)jid,
                      dt_job_state_name(j.state));
        goto out;
    }
    int64_t slurm_id = 0, restart = 0;
    if ((rc = dt_msg_opt_int(m, "slurm_id", &slurm_id, &em)) < 0 ||
        (rc = dt_msg_opt_int(m, "slurm_restart", &restart, &em)) < 0 ||
        (rc = dt_alloc_agent(c, jid, slurm_id, restart, &em)) < 0) {
        dt_log_info("job=%lld node=%s: registration refused: %s", (long long)jid, node, em.s);
        dt_conn_error(k, m->id, rc, "%s", em.s);
        goto out;
    }
    if ((rc = dt_db_agent_register(c->db, jid, node, (int)slots, &aid, &em)) < 0) {
        dt_conn_error(k, m->id, rc, "%s", em.s);
        goto out;
    }
    dt_live_agent_t *a = dt_coord_agent_find(c, aid);
    if (a == NULL)
        a = dt_coord_agent_add(c, aid, jid);
    a->conn = k;
    a->last_seen_ms = dt_coord_mono_ms();
    snprintf(a->node, sizeof(a->node), "%s", node);
    a->slots = (int)slots;
    a->pid = 0;
    if (dt_msg_opt_int(m, "pid", &a->pid, &em) < 0) /* only shown: the agent stays */
        dt_log_warn("job=%lld node=%s REGISTER: %s; pid unknown", (long long)jid, node, em.s);
    k->agent = aid;
    dt_log_info("job=%lld agent=%lld node=%s slots=%lld registered", (long long)jid,
                (long long)aid, node, (long long)slots);
    dt_conn_reply(k, DT_MSG_OK, m->id,
                  json_pack("{s:I, s:I}", "agent", (json_int_t)aid, "heartbeat_ms",
                            (json_int_t)c->conf.heartbeat_ms));
    dt_run_registered(c, a, m);
out:
    dt_job_clear(&j);
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
    a->last_seen_ms = dt_coord_mono_ms();
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
    char detail[160];
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
    snprintf(detail, sizeof(detail), "agent=%lld gen=%lld rank=%lld status=%lld signal=%lld",
             (long long)a->id, (long long)gen, (long long)rank, (long long)status,
             (long long)sig);
    if ((rc = dt_db_event_add(k->coord->db, a->job, "worker_exit", detail, &em)) < 0) {
        dt_conn_error(k, m->id, rc, "%s", em.s);
        return;
    }
    dt_log_info("job=%lld %s", (long long)a->job, detail);
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
        (rc = dt_msg_get_text(m, "path", PATH_MAX_BYTES, &path, &em)) < 0 ||
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
        char *text = json_dumps(shards, JSON_COMPACT);
        rc = dt_db_checkpoint_set_manifest(k->coord->db, a->job, step, text, &em);
        free(text);
    } else {
        rc = dt_db_shard_add(k->coord->db, a->job, step, (int)rank, path, bytes, sha, &em);
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

void dt_job_checkpoint(dt_conn_t *k, const dt_msg_t *m)
{
    dt_emsg_t em = { "" };
    dt_job_t j;
    int gen = 0, rc;

    if (load_visible(k, m, &j) < 0)
        return;
    if ((rc = dt_run_checkpoint(k->coord, j.id, &gen, &em)) < 0)
        dt_conn_error(k, m->id, rc, "%s", em.s);
    else
        dt_conn_reply(k, DT_MSG_OK, m->id,
                      json_pack("{s:I, s:i}", "id", (json_int_t)j.id, "gen", gen));
    dt_job_clear(&j);
}

void dt_agent_sweep(dt_coord_t *c)
{
    int64_t now = dt_coord_mono_ms();
    dt_live_agent_t *a = c->agents, *next;
    dt_emsg_t em = { "" };
    int n = 0, open = 0;
    struct {
        int64_t job, agent;
    } *lost = NULL;

    for (; a; a = next) {
        next = a->next;
        if (now - a->last_seen_ms <= c->conf.agent_timeout_ms)
            continue;
        /* all agents lost in one sweep: one transaction */
        if (!open && dt_db_begin(c->db, &em) == 0)
            open = 1;
        dt_log_warn("job=%lld agent=%lld lost: silent for %lld ms", (long long)a->job,
                    (long long)a->id, (long long)(now - a->last_seen_ms));
        if (dt_db_agent_set_state(c->db, a->id, "lost", dt_coord_wall_ms(), &em) < 0)
            dt_log_error("agent=%lld: %s", (long long)a->id, em.s);
        if (a->conn)
            a->conn->agent = 0;
        lost = dt_xrealloc(lost, (size_t)(n + 1) * sizeof(*lost));
        lost[n].job = a->job;
        lost[n].agent = a->id;
        dt_coord_agent_remove(c, a->id);
        n++;
    }
    if (open && dt_db_commit(c->db, &em) < 0)
        dt_log_error("recording %d lost agents failed: %s", n, em.s);
    /* recovery decisions after the lost agents are recorded */
    for (int i = 0; i < n; i++)
        dt_run_agent_lost(c, lost[i].job, lost[i].agent);
    free(lost);
    dt_run_tick(c);
}

/* Agents retry a lost link with a backoff that grows to 5 s, +-20%
 * (agent/link.c): one that saw the coordinator die may next try 6 s
 * later. */
#define RECONNECT_MAX_MS 6000

/* After a restart: every agent the database still calls registered gets a
 * live entry as if heard from RECONNECT_MAX_MS from now, so it is marked
 * lost unless it re-registers within agent_timeout after its next retry
 * (with agent_timeout alone, under 6 s, agents were lost after a restart
 * for retrying too late). */
static int reload_agent_cb(const dt_agent_t *a, void *arg)
{
    dt_coord_t *c = arg;
    if (strcmp(a->state, "registered") == 0 && dt_coord_agent_find(c, a->id) == NULL)
        dt_coord_agent_add(c, a->id, a->job)->last_seen_ms =
            dt_coord_mono_ms() + RECONNECT_MAX_MS;
    return 0;
}

static int reload_job_cb(const dt_job_t *j, void *arg)
{
    dt_coord_t *c = arg;
    dt_emsg_t em = { "" };
    if (!dt_job_state_terminal(j->state))
        dt_db_agents(c->db, j->id, reload_agent_cb, c, &em);
    return 0;
}

int dt_agent_reload(dt_coord_t *c, dt_emsg_t *em)
{
    int rc = dt_db_job_list(c->db, -1, reload_job_cb, c, em);
    if (rc == 0 && c->nagents > 0)
        dt_log_info("agents=%zu from before the restart: waiting for them to re-register",
                    c->nagents);
    return rc;
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
    dt_run_preempt(k->coord, a, m);
}

static int newest_cb(const dt_checkpoint_t *ck, void *arg)
{
    if (strcmp(ck->state, "committed") == 0 && ck->step > *(int64_t *)arg)
        *(int64_t *)arg = ck->step;
    return 0;
}

void dt_job_resume(dt_conn_t *k, const dt_msg_t *m)
{
    dt_coord_t *c = k->coord;
    dt_emsg_t em = { "" };
    char detail[300];
    int64_t step = 0;
    dt_job_t j;
    int rc;

    if (load_visible(k, m, &j) < 0)
        return;
    if (j.state != DT_JOB_FAILED && j.state != DT_JOB_CANCELLED) {
        dt_conn_error(k, m->id, DT_ESTATE, "job %lld is %s: only a failed or cancelled job "
                      "resumes", (long long)j.id, dt_job_state_name(j.state));
        goto out;
    }
    dt_db_checkpoints(c->db, j.id, newest_cb, &step, &em);
    if (step > 0)
        snprintf(detail, sizeof(detail), "resumed by uid %u from the checkpoint at step %lld",
                 (unsigned)k->uid, (long long)step);
    else
        snprintf(detail, sizeof(detail), "resumed by uid %u from the start (no committed "
                 "checkpoint)", (unsigned)k->uid);
    if ((rc = dt_db_job_resume(c->db, j.id, detail, &em)) < 0) {
        dt_conn_error(k, m->id, rc, "%s", em.s);
        goto out;
    }
    dt_run_resumed(c, j.id);
    dt_log_info("job=%lld uid=%u %s", (long long)j.id, (unsigned)k->uid, detail);
    dt_conn_reply(k, DT_MSG_OK, m->id,
                  json_pack("{s:I, s:s, s:I}", "id", (json_int_t)j.id, "state", "queued", "step",
                            (json_int_t)step));
    dt_alloc_submit(c, j.id);
out:
    dt_job_clear(&j);
}
