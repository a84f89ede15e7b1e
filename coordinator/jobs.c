/* SPDX-License-Identifier: MIT
 *
 * The domain operations on jobs (jobs.h). A submitted spec is parsed and
 * planned before anything is stored: a job that cannot be planned is
 * refused with the planner's reason and leaves no row. A planned job
 * waits in `queued` until agents start it: agents started by hand or by
 * `dtctl run --local`, or, with slurm = yes, the batch job alloc.c submits
 * for it.
 */
#include "config.h"

#include <math.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/clock.h"
#include "common/log.h"
#include "common/mem.h"
#include "common/text.h"
#include "coordinator/alloc.h"
#include "coordinator/auth.h"
#include "coordinator/jobdir.h"
#include "coordinator/jobs.h"
#include "plan/planner.h"
#include "coordinator/run.h"
#include "spec/spec.h"

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

void dt_submitted_clear(dt_submitted_t *s)
{
    json_decref(s->plan);
    dt_slurm_desc_clear(&s->desc);
    memset(s, 0, sizeof(*s));
}

bool dt_jobs_is_admin(const dt_coord_t *c, const dt_caller_t *who)
{
    return dt_auth_is_admin(who->uid, who->gid, c->conf.admin_group);
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
    /* shown as 0 when it cannot be counted: a display, logged */
    if (dt_db_job_counts(db, j->id, &requeues, &base, &em) < 0)
        dt_log_warn("job=%lld requeues: %s", (long long)j->id, em.s);
    json_object_set_new(o, "requeues", json_integer(requeues));
    return o;
}

int dt_jobs_get(dt_coord_t *c, const dt_caller_t *who, int64_t id, dt_job_t *j, dt_emsg_t *em)
{
    int rc;

    if ((rc = dt_db_job_get(c->db, id, j, em)) < 0) {
        if (rc == DT_ENOENT)
            dt_emsg_set(em, rc, "job %lld not found", (long long)id);
        return rc;
    }
    if (j->owner != who->uid && !dt_jobs_is_admin(c, who)) {
        dt_job_clear(j);
        return dt_emsg_set(em, DT_EPERM, "job %lld belongs to another user: permission denied",
                           (long long)id);
    }
    return 0;
}

int dt_jobs_submit(dt_coord_t *c, const dt_caller_t *who, const char *text, const char *name,
                   bool dry, dt_submitted_t *out, dt_emsg_t *em)
{
    dt_spec_t spec;
    dt_plan_req_t req;
    dt_plan_t plan = { 0 };
    char *canon = NULL, *plan_text = NULL;
    int64_t id = 0;
    int rc;

    memset(out, 0, sizeof(*out));
    if ((rc = dt_spec_parse("spec", text, &spec, em)) < 0)
        return rc;
    if (name && *name) {
        free(spec.name);
        spec.name = dt_xstrdup(name);
    }
    if ((rc = dt_plan_req_from_spec(&spec, &req, em)) < 0 ||
        (rc = dt_plan_make(&req, &plan, em)) < 0 ||
        (rc = dt_alloc_check(c, &spec, &req, &plan, who->uid, em)) < 0) {
        out->refused = true;
        dt_log_info("uid=%u submit refused: %s", (unsigned)who->uid, em->s);
        goto out;
    }
    /* what the device's engine does not run is refused now, not when its
     * workers exit: the one answer the planner and dtengine ask too */
    if ((rc = dt_vocab_runs(req.cuda ? DT_DEVICE_CUDA : DT_DEVICE_CPU, req.kind, plan.shard,
                            plan.dp > 0 ? plan.dp : 1, em)) < 0 ||
        (rc = dt_vocab_offload_runs(req.cuda ? DT_DEVICE_CUDA : DT_DEVICE_CPU, req.kind,
                                    plan.offload, em)) < 0) {
        out->refused = true;
        dt_log_info("uid=%u submit refused: %s", (unsigned)who->uid, em->s);
        goto out;
    }
    /* the planner's layout, recompute, shard, offload and ckpt_dtype reach the workers through
     * the stored spec (the agents hand it to dtengine with --spec); a
     * user's value is already there, and a replan of the stored spec
     * decides the same */
    if (spec.layout == NULL &&
        (rc = dt_spec_set(&spec, "layout", dt_layout_name(plan.layout), em)) < 0)
        goto out;
    if (plan.recompute && spec.recompute == NULL &&
        (rc = dt_spec_set(&spec, "recompute", "layer", em)) < 0)
        goto out;
    if (plan.shard > DT_SHARD_NONE && spec.shard == NULL &&
        (rc = dt_spec_set(&spec, "shard", dt_shard_name(plan.shard), em)) < 0)
        goto out;
    if (plan.offload && spec.offload == NULL) {
        char off[64];
        dt_vocab_format_set(off, sizeof(off), dt_offload_names, plan.offload);
        if ((rc = dt_spec_set(&spec, "offload", off, em)) < 0)
            goto out;
    }
    if (plan.ckpt_dtype == DT_CKPT_BF16 && spec.ckpt_dtype == NULL &&
        (rc = dt_spec_set(&spec, "ckpt_dtype", "bf16", em)) < 0)
        goto out;
    out->plan = dt_plan_to_json(&req, &plan);
    if (dry) {
        /* what would be submitted, nothing stored */
        rc = dt_alloc_describe(c, 0, &spec, &req, &plan, who->uid, &out->desc, em);
        goto out;
    }
    plan_text = json_dumps(out->plan, JSON_COMPACT);
    canon = dt_spec_format(&spec);
    /* submitted, planned, queued: three events, one transaction */
    if ((rc = dt_db_begin(c->db, em)) < 0)
        goto fail;
    if ((rc = dt_db_job_create(c->db, dt_spec_word(&spec, "name"), who->uid, canon, &id,
                               em)) < 0 ||
        (rc = dt_db_job_plan(c->db, id, plan_text, em)) < 0 ||
        (rc = dt_db_job_transition(c->db, id, DT_JOB_QUEUED, NULL,
                                   c->alloc ? "submitting to Slurm"
                                            : "waiting for agents to register", em)) < 0) {
        dt_db_rollback(c->db);
        goto fail;
    }
    if ((rc = dt_db_commit(c->db, em)) < 0) {
    fail:
        dt_log_error("job=%lld submit failed: %s", (long long)id, em->s);
        goto out;
    }
    out->id = id;
    /* ranks: the job's, every ring's */
    if (plan.dp > 1)
        dt_log_info("job=%lld uid=%u ranks=%d dp=%d tokens=%lld submitted and queued",
                    (long long)id, (unsigned)who->uid, plan.workers, plan.dp, (long long)req.tokens);
    else
        dt_log_info("job=%lld uid=%u ranks=%d tokens=%lld submitted and queued", (long long)id,
                    (unsigned)who->uid, plan.ranks, (long long)req.tokens);
    dt_alloc_submit(c, id);
out:
    if (rc < 0 && !out->refused) {
        json_decref(out->plan);
        out->plan = NULL;
    }
    free(canon);
    free(plan_text);
    dt_plan_clear(&plan);
    dt_spec_free(&spec);
    return rc;
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

int dt_jobs_list(dt_coord_t *c, const dt_caller_t *who, json_t **out, dt_emsg_t *em)
{
    list_ctx_t x = { c->db, json_array() };
    int rc = dt_db_job_list(c->db, dt_jobs_is_admin(c, who) ? -1 : (int64_t)who->uid, list_cb,
                            &x, em);

    if (rc < 0) {
        json_decref(x.jobs);
        return rc;
    }
    *out = x.jobs;
    return 0;
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

static int cost_cb(int gen, const char *cost, void *arg)
{
    json_t *o = json_loads(cost, 0, NULL);
    if (json_is_object(o))
        json_array_append_new(arg, o);
    else
        json_decref(o);
    return 0;
}

/* A real for a reply; null when not finite (no ETTR before a step). */
static json_t *jreal(double v)
{
    return isfinite(v) ? json_real(v) : json_null();
}

json_t *dt_jobs_goodput(dt_coord_t *c, int64_t job)
{
    dt_emsg_t em = { "" };
    dt_goodput_t g;

    if (dt_db_goodput(c->db, job, dt_clock_wall_ms(), &g, &em) < 0) {
        dt_log_warn("job=%lld goodput: %s", (long long)job, em.s);
        return json_null();
    }
    json_t *costs = json_array();
    if (dt_db_failure_costs(c->db, job, cost_cb, costs, &em) < 0)
        dt_log_warn("job=%lld failure costs: %s", (long long)job, em.s);
    return json_pack("{s:o, s:I, s:f, s:f, s:f, s:f, s:f, s:i, s:f, s:f, s:f, s:o}", "ettr",
                     jreal(g.ettr), "first_step_ms", (json_int_t)g.first_ms, "wall_s", g.wall_s,
                     "step_s", g.step_s, "productive_s", g.productive_s, "recomputed_s",
                     g.recomputed_s, "ckpt_stall_s", g.stall_s, "failures", g.failures,
                     "detect_s", g.detect_s, "restart_s", g.restart_s, "load_s", g.load_s,
                     "failure_costs", costs);
}

json_t *dt_jobs_show(dt_coord_t *c, const dt_job_t *j)
{
    dt_emsg_t em = { "" };
    json_t *agents = json_array();

    /* shown without its agents when they cannot be read: a display, logged */
    if (dt_db_agents(c->db, j->id, agent_cb, agents, &em) < 0)
        dt_log_warn("job=%lld agents: %s", (long long)j->id, em.s);
    /* live progress from the agents of this job */
    json_t *prog = json_array();
    for (dt_live_agent_t *a = c->agents; a; a = a->next)
        if (a->job == j->id && a->step > 0)
            json_array_append_new(prog, json_pack("{s:I, s:I, s:I, s:f}", "agent",
                                                  (json_int_t)a->id, "step", (json_int_t)a->step,
                                                  "tokens", (json_int_t)a->tokens, "loss",
                                                  a->loss));
    json_t *plan = j->plan ? json_loads(j->plan, 0, NULL) : NULL;
    json_t *reply = json_pack("{s:o, s:o, s:o, s:o, s:o}", "job", job_json(c->db, j), "spec",
                              jtext(j->spec), "plan", plan ? plan : json_null(), "agents", agents,
                              "progress", prog);
    /* the job's directory (its rank logs, its default checkpoints): a
     * path for dtctl, which reads it as the user */
    char *dir = dt_jobdir_path(c->conf.jobs_dir, j->id);
    json_object_set_new(json_object_get(reply, "job"), "dir", json_string(dir));
    free(dir);
    json_object_set_new(reply, "goodput", dt_jobs_goodput(c, j->id));
    dt_run_show(c, j->id, reply);
    return reply;
}

/*-- history: what dtctl plot draws ------------------------------------------------*/

static int step_cb(const dt_step_row_t *s, void *arg)
{
    json_array_append_new(arg, json_pack("{s:i, s:I, s:I, s:o, s:o, s:o}", "gen", s->gen, "step",
                                         (json_int_t)s->step, "at_ms", (json_int_t)s->at_ms,
                                         "step_ms", jreal(s->step_ms), "loss", jreal(s->loss),
                                         "tokens_s", jreal(s->tokens_s)));
    return 0;
}

static int gen_cb(const dt_gen_t *g, void *arg)
{
    json_t *o = json_pack("{s:i, s:i, s:I, s:I, s:I}", "gen", g->gen, "ranks", g->ranks,
                          "started_ms", (json_int_t)g->started_ms, "ended_ms",
                          (json_int_t)g->ended_ms, "resume_step", (json_int_t)g->resume_step);
    json_object_set_new(o, "reason", g->reason ? jtext(g->reason) : json_null());
    json_array_append_new(arg, o);
    return 0;
}

static int history_ckpt_cb(const dt_checkpoint_t *ck, void *arg)
{
    json_array_append_new(arg, json_pack("{s:I, s:o, s:I}", "step", (json_int_t)ck->step,
                                         "state", jtext(ck->state), "committed_ms",
                                         (json_int_t)ck->committed_ms));
    return 0;
}

/* The generation numbered gen in gens, or NULL. */
static const json_t *gen_of(const json_t *gens, json_int_t gen)
{
    size_t i;
    const json_t *g;

    json_array_foreach(gens, i, g)
        if (json_integer_value(json_object_get(g, "gen")) == gen)
            return g;
    return NULL;
}

/* When each failure happened and its generation ended, from the
 * generations' rows: the cost has the times between, not the instants. */
static void place_failures(json_t *failures, const json_t *gens)
{
    size_t i;
    json_t *f;

    json_array_foreach(failures, i, f) {
        const json_t *g = gen_of(gens, json_integer_value(json_object_get(f, "gen")));
        const json_t *n = gen_of(gens, json_integer_value(json_object_get(f, "next")));
        json_int_t ended = g ? json_integer_value(json_object_get(g, "ended_ms")) : 0, fault = 0;
        if (n) {
            double back = json_number_value(json_object_get(f, "restart_s")) +
                          json_number_value(json_object_get(f, "detect_s"));
            fault = json_integer_value(json_object_get(n, "started_ms")) -
                    (json_int_t)llround(back * 1000.0);
        }
        json_object_set_new(f, "ended_ms", json_integer(ended));
        json_object_set_new(f, "fault_ms", json_integer(fault > 0 ? fault : ended));
    }
}

/* The newest max elements of *a (a new array in its place when some are
 * left out); returns how many were left out. */
static json_int_t keep_newest(json_t **a, size_t max)
{
    size_t n = json_array_size(*a);

    if (n <= max)
        return 0;
    json_t *kept = json_array();
    for (size_t i = n - max; i < n; i++)
        json_array_append(kept, json_array_get(*a, i));
    json_decref(*a);
    *a = kept;
    return (json_int_t)(n - max);
}

int dt_jobs_history(dt_coord_t *c, const dt_job_t *j, json_t **out, dt_emsg_t *em)
{
    json_t *steps = json_array(), *gens = json_array(), *fails = json_array(),
           *cks = json_array();
    int rc;

    *out = NULL;
    if ((rc = dt_db_steps(c->db, j->id, step_cb, steps, em)) < 0 ||
        (rc = dt_db_gens(c->db, j->id, gen_cb, gens, em)) < 0 ||
        (rc = dt_db_failure_costs(c->db, j->id, cost_cb, fails, em)) < 0 ||
        (rc = dt_db_checkpoints(c->db, j->id, history_ckpt_cb, cks, em)) < 0) {
        json_decref(steps);
        json_decref(gens);
        json_decref(fails);
        json_decref(cks);
        return rc;
    }
    place_failures(fails, gens);
    json_int_t left_gens = keep_newest(&gens, DT_JOBS_HISTORY_MAX),
               left_fails = keep_newest(&fails, DT_JOBS_HISTORY_MAX),
               left_cks = keep_newest(&cks, DT_JOBS_HISTORY_MAX);
    *out = json_pack("{s:o, s:o, s:o, s:o, s:o, s:o, s:{s:I, s:I, s:I}}", "job",
                     job_json(c->db, j), "steps", steps, "failures", fails, "generations", gens,
                     "checkpoints", cks, "goodput", dt_jobs_goodput(c, j->id), "left_out",
                     "generations", left_gens, "failures", left_fails, "checkpoints", left_cks);
    return 0;
}

int dt_jobs_cancel(dt_coord_t *c, const dt_caller_t *who, const dt_job_t *j, const char *why,
                   bool checkpoint, bool *stopping, dt_emsg_t *em)
{
    char detail[512];
    int rc;

    *stopping = false;
    if (dt_job_state_terminal(j->state))
        return dt_emsg_set(em, DT_ESTATE, "job %lld is already %s", (long long)j->id,
                           dt_job_state_name(j->state));
    snprintf(detail, sizeof(detail), "cancelled by uid %u%s%s", (unsigned)who->uid,
             why ? ": " : "", why ? why : "");
    if (checkpoint) {
        /* a planned stop: the job is cancelled once its workers have
         * written a checkpoint and exited */
        if ((rc = dt_run_stop(c, j->id, detail, false, em)) < 0)
            return rc;
        *stopping = true;
        return 0;
    }
    if ((rc = dt_db_job_transition(c->db, j->id, DT_JOB_CANCELLED, NULL, detail, em)) < 0)
        return rc;
    dt_log_info("job=%lld uid=%u cancelled", (long long)j->id, (unsigned)who->uid);
    dt_run_cancelled(c, j->id);
    dt_alloc_job_ended(c, j->id, 1);
    return 0;
}

static int newest_cb(const dt_checkpoint_t *ck, void *arg)
{
    if (strcmp(ck->state, "committed") == 0 && ck->step > *(int64_t *)arg)
        *(int64_t *)arg = ck->step;
    return 0;
}

int dt_jobs_resume(dt_coord_t *c, const dt_caller_t *who, const dt_job_t *j, int64_t *step,
                   dt_emsg_t *em)
{
    char detail[300];
    int rc;

    *step = 0;
    if (j->state != DT_JOB_FAILED && j->state != DT_JOB_CANCELLED)
        return dt_emsg_set(em, DT_ESTATE, "job %lld is %s: only a failed or cancelled job "
                           "resumes", (long long)j->id, dt_job_state_name(j->state));
    /* the checkpoints cannot be read: refused, rather than a resume that
     * says "from the start" and then resumes from a checkpoint */
    if ((rc = dt_db_checkpoints(c->db, j->id, newest_cb, step, em)) < 0)
        return rc;
    if (*step > 0)
        snprintf(detail, sizeof(detail), "resumed by uid %u from the checkpoint at step %lld",
                 (unsigned)who->uid, (long long)*step);
    else
        snprintf(detail, sizeof(detail), "resumed by uid %u from the start (no committed "
                 "checkpoint)", (unsigned)who->uid);
    if ((rc = dt_db_job_resume(c->db, j->id, detail, em)) < 0)
        return rc;
    dt_run_resumed(c, j->id);
    dt_log_info("job=%lld uid=%u %s", (long long)j->id, (unsigned)who->uid, detail);
    dt_alloc_submit(c, j->id);
    return 0;
}

int dt_jobs_checkpoint(dt_coord_t *c, int64_t job, int *gen, dt_emsg_t *em)
{
    return dt_run_checkpoint(c, job, gen, em);
}

static int event_cb(const dt_event_t *e, void *arg)
{
    json_t *o = json_pack("{s:I, s:I, s:o, s:o}", "id", (json_int_t)e->id, "at_ms",
                          (json_int_t)e->at_ms, "kind", jtext(e->kind), "state", jtext(e->state));
    json_object_set_new(o, "detail", e->detail ? jtext(e->detail) : json_null());
    json_array_append_new(arg, o);
    return 0;
}

int dt_jobs_events(dt_coord_t *c, int64_t job, int64_t since, json_t **out, dt_emsg_t *em)
{
    json_t *evs = json_array();
    int rc = dt_db_events(c->db, job, since, event_cb, evs, em);

    if (rc < 0) {
        json_decref(evs);
        return rc;
    }
    *out = evs;
    return 0;
}

static int ckpt_cb(const dt_checkpoint_t *ck, void *arg)
{
    json_array_append_new(arg, json_pack("{s:I, s:o, s:i, s:I, s:I, s:I, s:I}", "step",
                                         (json_int_t)ck->step, "state", jtext(ck->state), "shards",
                                         ck->shards, "bytes", (json_int_t)ck->bytes,
                                         "created_ms", (json_int_t)ck->created_ms,
                                         "committed_ms", (json_int_t)ck->committed_ms,
                                         "corrupt_ms", (json_int_t)ck->corrupt_ms));
    return 0;
}

int dt_jobs_checkpoints(dt_coord_t *c, int64_t job, json_t **out, dt_emsg_t *em)
{
    json_t *cks = json_array();
    int rc = dt_db_checkpoints(c->db, job, ckpt_cb, cks, em);

    if (rc < 0) {
        json_decref(cks);
        return rc;
    }
    *out = cks;
    return 0;
}

/*-- agents -------------------------------------------------------------------------*/

/* A cuda job runs one worker per GPU: an agent with fewer GPUs than slots
 * cannot run its share, and is refused saying so (with an event), rather
 * than started half. */
static int gpus_enough(dt_coord_t *c, const dt_job_t *j, const dt_wire_register_t *reg,
                       dt_emsg_t *em)
{
    dt_spec_t s;
    dt_emsg_t e2 = { "" };
    char detail[512];

    if (dt_spec_parse("job", j->spec, &s, &e2) < 0)
        return 0; /* stored by submit, so parsed once already: the start says more */
    bool cuda = dt_spec_device_id(&s) == DT_DEVICE_CUDA;
    dt_spec_free(&s);
    if (!cuda || (int64_t)reg->gpus.n >= reg->slots)
        return 0;
    snprintf(detail, sizeof(detail), "node %s: device = cuda needs a GPU per slot: %zu GPU%s "
             "for %lld slots%s%s", reg->node, reg->gpus.n, reg->gpus.n == 1 ? "" : "s",
             (long long)reg->slots, reg->gpus.n == 0 && reg->gpu_why ? ": " : "",
             reg->gpus.n == 0 && reg->gpu_why ? reg->gpu_why : "");
    if (dt_db_event_add(c->db, j->id, "agent_refused", detail, &e2) < 0)
        dt_log_warn("job=%lld agent_refused: %s", (long long)j->id, e2.s);
    dt_log_warn("job=%lld registration refused: %s", (long long)j->id, detail);
    return dt_emsg_set(em, DT_ENOSPC, "job %lld: %s", (long long)j->id, detail);
}

int dt_jobs_agent_register(dt_coord_t *c, const dt_caller_t *who, const dt_wire_register_t *reg,
                           dt_live_agent_t **out, dt_emsg_t *em)
{
    int64_t jid = reg->job, slurm_id = reg->slurm_id, restart = reg->slurm_restart;
    const char *node = reg->node;
    int slots = (int)reg->slots;
    dt_job_t j;
    int64_t aid;
    int rc;

    if ((rc = dt_db_job_get(c->db, jid, &j, em)) < 0) {
        char msg[sizeof(em->s)];
        snprintf(msg, sizeof(msg), "%s", rc == DT_ENOENT ? "not found" : em->s);
        return dt_emsg_set(em, rc, "job %lld: %s", (long long)jid, msg);
    }
    if (j.owner != who->uid && !dt_jobs_is_admin(c, who)) {
        rc = dt_emsg_set(em, DT_EPERM, "job %lld belongs to another user: permission denied",
                         (long long)jid);
        goto out;
    }
    if (j.owner != who->uid) {
        /* an admin's agent would write the user's checkpoints and logs with
         * the admin's rights: a job's agents run as its owner */
        rc = dt_emsg_set(em, DT_EPERM, "job %lld belongs to uid %lld: its agents must run "
                         "as that user, not as uid %u", (long long)jid, (long long)j.owner,
                         (unsigned)who->uid);
        goto out;
    }
    if (dt_job_state_terminal(j.state)) {
        rc = dt_emsg_set(em, DT_ESTATE, "job %lld is %s", (long long)jid,
                         dt_job_state_name(j.state));
        goto out;
    }
    if ((rc = gpus_enough(c, &j, reg, em)) < 0)
        goto out;
    if ((rc = dt_alloc_agent(c, jid, slurm_id, restart, em)) < 0) {
        dt_log_info("job=%lld node=%s: registration refused: %s", (long long)jid, node, em->s);
        goto out;
    }
    if ((rc = dt_db_agent_register(c->db, jid, node, slots, &aid, em)) < 0)
        goto out;
    dt_live_agent_t *a = dt_coord_agent_find(c, aid);
    if (a == NULL)
        a = dt_coord_agent_add(c, aid, jid);
    a->last_seen_ms = dt_clock_mono_ms();
    snprintf(a->node, sizeof(a->node), "%s", node);
    a->slots = slots;
    a->gpus = (int)reg->gpus.n;
    a->pid = reg->pid;
    /* where other agents reach it (replicas): printable, as the wire
     * decoder checked, or none */
    snprintf(a->peer, sizeof(a->peer), "%s", reg->peer ? reg->peer : "");
    dt_log_info("job=%lld agent=%lld node=%s slots=%d gpus=%zu registered", (long long)jid,
                (long long)aid, node, slots, reg->gpus.n);
    *out = a;
out:
    dt_job_clear(&j);
    return rc;
}

int dt_jobs_worker_exit(dt_coord_t *c, const dt_live_agent_t *a, int64_t gen, int64_t rank,
                        int64_t status, int64_t sig, dt_emsg_t *em)
{
    char detail[160];
    int rc;

    snprintf(detail, sizeof(detail), "agent=%lld gen=%lld rank=%lld status=%lld signal=%lld",
             (long long)a->id, (long long)gen, (long long)rank, (long long)status,
             (long long)sig);
    if ((rc = dt_db_event_add(c->db, a->job, "worker_exit", detail, em)) < 0)
        return rc;
    dt_log_info("job=%lld %s", (long long)a->job, detail);
    return 0;
}

int dt_jobs_shard(dt_coord_t *c, int64_t job, int64_t step, int rank, const char *path,
                  int64_t bytes, const char *sha256, dt_emsg_t *em)
{
    return dt_db_shard_add(c->db, job, step, rank, path, bytes, sha256, em);
}

int dt_jobs_manifest(dt_coord_t *c, int64_t job, int64_t step, const dt_wire_strs_t *shas,
                     dt_emsg_t *em)
{
    json_t *a = json_array();
    for (size_t i = 0; i < shas->n; i++)
        json_array_append_new(a, json_string(shas->v[i]));
    char *text = json_dumps(a, JSON_COMPACT);
    int rc = dt_db_checkpoint_set_manifest(c->db, job, step, text, em);

    json_decref(a);
    free(text);
    return rc;
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
            dt_clock_mono_ms() + RECONNECT_MAX_MS;
    return 0;
}

static int reload_job_cb(const dt_job_t *j, void *arg)
{
    dt_coord_t *c = arg;
    dt_emsg_t em = { "" };
    /* a job whose agents cannot be read: none are expected back; the ones
     * that come register again (logged) */
    if (!dt_job_state_terminal(j->state) &&
        dt_db_agents(c->db, j->id, reload_agent_cb, c, &em) < 0)
        dt_log_error("job=%lld agents: %s", (long long)j->id, em.s);
    return 0;
}

int dt_jobs_reload_agents(dt_coord_t *c, dt_emsg_t *em)
{
    int rc = dt_db_job_list(c->db, -1, reload_job_cb, c, em);
    if (rc == 0 && c->nagents > 0)
        dt_log_info("agents=%zu from before the restart: waiting for them to re-register",
                    c->nagents);
    return rc;
}
