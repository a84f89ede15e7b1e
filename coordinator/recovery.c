/* SPDX-License-Identifier: MIT
 *
 * The recovery policy (recovery.h). Three parts, top to bottom: the
 * deterministic-failure rule and the decision, pure (no coordinator, no
 * database, no clock: tests/unit/test_recovery.c runs them row by row); then
 * the decision carried out, through run.c (generations) and alloc.c
 * (Slurm jobs), which report faults up through the coordinator's hooks;
 * then the sweep that finds lost agents.
 */
#include "config.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/clock.h"
#include "common/log.h"
#include "common/macros.h"
#include "common/mem.h"
#include "common/proto.h"
#include "coordinator/alloc.h"
#include "coordinator/conn.h"
#include "coordinator/coord.h"
#include "plan/planner.h"
#include "coordinator/recovery.h"
#include "coordinator/run.h"
#include "db/db.h"
#include "spec/spec.h"

/*-- the deterministic rule -------------------------------------------------------*/

static bool same(const dt_fail_entry_t *e, const dt_failure_t *f)
{
    return e->rank == f->rank && e->step == f->step && e->startup == f->startup &&
           strncmp(e->cause, f->cause ? f->cause : "", sizeof(e->cause) - 1) == 0;
}

int dt_recovery_note(dt_fail_log_t *log, const dt_failure_t *f)
{
    for (int i = 0; i < log->n; i++)
        if (same(&log->v[i], f))
            return ++log->v[i].count;
    if (log->n == DT_FAIL_LOG_MAX) { /* bounded: forget the oldest */
        memmove(&log->v[0], &log->v[1], (DT_FAIL_LOG_MAX - 1) * sizeof(log->v[0]));
        log->n--;
    }
    dt_fail_entry_t *e = &log->v[log->n++];
    e->rank = f->rank;
    snprintf(e->cause, sizeof(e->cause), "%s", f->cause ? f->cause : "");
    e->step = f->step;
    e->startup = f->startup;
    e->count = 1;
    return 1;
}

bool dt_recovery_deterministic(const dt_failure_t *f, int count, int64_t repeat,
                               int64_t repeat_startup)
{
    const dt_spec_t none = { 0 }; /* the key table's defaults */
    int64_t limit = f->startup ? (repeat_startup > 0 ? repeat_startup
                                                     : dt_spec_int(&none, "repeat_startup_failures"))
                               : (repeat > 0 ? repeat : dt_spec_int(&none, "repeat_failures"));
    return count >= limit;
}

/*-- the decision -----------------------------------------------------------------*/

const char *dt_action_name(enum dt_action a)
{
    static const char *const names[] = {
        [DT_ACT_NONE] = "none",           [DT_ACT_IGNORE] = "ignore",
        [DT_ACT_RESTART] = "restart",     [DT_ACT_RETRY] = "retry",
        [DT_ACT_REPLAN] = "replan",       [DT_ACT_REQUEUE] = "requeue",
        [DT_ACT_STOP_REQUEUE] = "stop_requeue", [DT_ACT_REQUEUED] = "requeued",
        [DT_ACT_FAIL] = "fail",           [DT_ACT_CANCEL] = "cancel",
    };
    return (size_t)a < DT_ARRAY_SIZE(names) && names[a] ? names[a] : "?";
}

static void event(dt_decision_t *d, const char *kind, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

static void event(dt_decision_t *d, const char *kind, const char *fmt, ...)
{
    va_list ap;

    if (d->nev == DT_DECISION_EVENTS)
        return;
    snprintf(d->ev[d->nev].kind, sizeof(d->ev[d->nev].kind), "%s", kind);
    va_start(ap, fmt);
    vsnprintf(d->ev[d->nev].detail, sizeof(d->ev[d->nev].detail), fmt, ap);
    va_end(ap);
    d->nev++;
}

static enum dt_action act(dt_decision_t *d, enum dt_action a, const char *why)
{
    d->action = a;
    if (why != d->why)
        snprintf(d->why, sizeof(d->why), "%s", why ? why : "");
    return a;
}

/* A failure of the running generation: it is aborted everywhere; then
 * the job fails (deterministic, out of restarts) or recovers. RANK and
 * CAUSE identify the failure for the deterministic rule; WHY is the
 * sentence users read. */
static enum dt_action fail_gen(const dt_job_view_t *v, dt_decision_t *d, int rank,
                               const char *cause, const char *why)
{
    int64_t step = v->step;
    /* no rank has completed a step of this generation yet */
    dt_failure_t f = { .rank = rank, .cause = cause, .step = step,
                       .startup = step <= v->resume_step };
    dt_fail_log_t scratch = { .n = 0 };

    if (v->phase != DT_GEN_STARTING && v->phase != DT_GEN_RUNNING)
        return act(d, DT_ACT_NONE, NULL);
    d->abort = true;
    d->rank = rank;
    snprintf(d->abort_why, sizeof(d->abort_why), "%s", why);
    int seen = dt_recovery_note(v->fails ? v->fails : &scratch, &f);
    if (dt_recovery_deterministic(&f, seen, v->repeat, v->repeat_startup)) {
        char dd[900], who[32], times[32];
        if (rank >= 0)
            snprintf(who, sizeof(who), "on rank %d", rank);
        else
            snprintf(who, sizeof(who), "on every rank");
        if (seen == 2)
            snprintf(times, sizeof(times), "twice");
        else
            snprintf(times, sizeof(times), "%d times", seen);
        snprintf(dd, sizeof(dd), "deterministic failure: %s %s, %s at step %lld%s (%s)", cause,
                 who, times, (long long)step,
                 f.startup ? ", before the generation's first step" : "", why);
        event(d, "deterministic_failure", "%s", dd);
        return act(d, DT_ACT_FAIL, dd);
    }
    if (v->restarts - v->restart_base >= v->max_restarts) {
        char dd[800];
        snprintf(dd, sizeof(dd), "restart budget of %d used up (%s)", v->max_restarts, why);
        return act(d, DT_ACT_FAIL, dd);
    }
    return act(d, DT_ACT_RESTART, why);
}

/* A worker's failure: the job fails (invalid input), starts again from
 * an older checkpoint (the resume checkpoint does not verify), or the
 * generation fails. */
static enum dt_action worker(const dt_fault_t *f, const dt_job_view_t *v, dt_decision_t *d)
{
    char why[800], at[400];
    const char *err = f->err && f->err[0] ? f->err : NULL, *node = at;

    /* where: the node, and the GPU of a cuda worker */
    snprintf(at, sizeof(at), "%s%s%s%s", f->node ? f->node : "?", f->gpu && f->gpu[0] ? " (" : "",
             f->gpu && f->gpu[0] ? f->gpu : "", f->gpu && f->gpu[0] ? ")" : "");

    if (f->hung && f->stopped)
        snprintf(why, sizeof(why), "rank %d on %s hung: stopped by a signal, silent past the "
                 "hang timeout at step %lld", f->rank, node, (long long)f->step);
    else if (f->hung)
        snprintf(why, sizeof(why), "rank %d on %s silent past the hang timeout at step %lld "
                 "(the generation is stuck; the rank that stuck it may be another)",
                 f->rank, node, (long long)f->step);
    else if (f->sig)
        snprintf(why, sizeof(why), "rank %d on %s killed by signal %lld at step %lld",
                 f->rank, node, (long long)f->sig, (long long)f->step);
    else if (f->status == DT_EXIT_PEER)
        snprintf(why, sizeof(why), "rank %d on %s stopped: a peer failed", f->rank, node);
    else
        snprintf(why, sizeof(why), "rank %d on %s exited with status %lld at step %lld%s%s",
                 f->rank, node, (long long)f->status, (long long)f->step, err ? ": " : "",
                 err ? err : "");
    event(d, f->hung ? "worker_hung" : "worker_failed", "gen=%d %s", v->gen, why);
    if (f->status == DT_EXIT_INPUT && !f->sig) {
        /* dtengine's exit 2: bad options or input, which no restart fixes */
        char dd[1000];
        snprintf(dd, sizeof(dd), "invalid job: %s (dtengine exit 2; its output: dtctl logs "
                 "%lld --rank %d)", why, (long long)v->job, f->rank);
        return act(d, DT_ACT_FAIL, dd);
    }
    if (f->status == DT_EXIT_CKPT && !f->sig && v->resumed_memory) {
        /* an in-memory copy missing or bad: the same again from disk,
         * uncounted */
        event(d, "memory_checkpoint_skipped", "step=%lld: %s; resuming from disk",
              (long long)v->resume_step, why);
        d->mem_corrupt = true;
        return act(d, DT_ACT_RETRY, "the in-memory checkpoint does not verify");
    }
    if (f->status == DT_EXIT_CKPT && !f->sig && v->resume_step > 0) {
        /* the engine found the resume checkpoint bad: it is set aside and
         * the generation starts again from the one before, uncounted:
         * nothing failed but the file */
        event(d, "checkpoint_skipped", "step=%lld does not verify: %s",
              (long long)v->resume_step, why);
        d->ckpt_corrupt = true;
        return act(d, DT_ACT_RETRY, "the resume checkpoint does not verify");
    }
    char cause[48];
    if (f->status == DT_EXIT_DEVICE && !f->sig && !f->hung) {
        /* its GPU failed: restarting onto it would fail again, or worse */
        event(d, "device_fault", "gen=%d rank %d on %s: its GPU failed; %s is suspect, no "
              "later generation runs on it", v->gen, f->rank, f->node ? f->node : "?",
              f->node ? f->node : "?");
        d->suspect = true;
        d->suspect_agent = f->agent;
        return fail_gen(v, d, f->rank, "device fault", why);
    }
    if (f->hung)
        snprintf(cause, sizeof(cause), "hung");
    else if (f->sig)
        snprintf(cause, sizeof(cause), "signal %lld", (long long)f->sig);
    else if (f->status == DT_EXIT_PEER)
        snprintf(cause, sizeof(cause), "peer failed");
    else
        snprintf(cause, sizeof(cause), "exit %lld", (long long)f->status);
    /* an exit status other than PEER and AGENT_LOST is agreed by every rank
     * (dtengine(1)): which rank's report came first is chance */
    int who = !f->hung && !f->sig && f->status != DT_EXIT_PEER && f->status != DT_EXIT_AGENT_LOST
                  ? -1
                  : f->rank;
    return fail_gen(v, d, who, cause, why);
}

static bool state_is(const dt_fault_t *f, const char *name)
{
    return f->state && strcmp(f->state, name) == 0;
}

/* The Slurm job ended under the live dt job. */
static enum dt_action slurm_ended(const dt_fault_t *f, const dt_job_view_t *v,
                                  dt_decision_t *d)
{
    char why[1400];
    const char *nodes = f->nodes ? f->nodes : "";

    if (state_is(f, "CANCELLED")) {
        snprintf(why, sizeof(why), "slurm job %u was cancelled outside dt", f->slurm_id);
        event(d, "slurm_cancelled", "%s", why);
        return act(d, DT_ACT_CANCEL, why);
    }
    if (state_is(f, "TIMEOUT") || state_is(f, "NODE_FAIL") || state_is(f, "PREEMPTED") ||
        state_is(f, "BOOT_FAIL")) {
        snprintf(why, sizeof(why), "slurm job %u ended %s%s%s%s", f->slurm_id, f->state,
                 *nodes ? " on " : "", nodes,
                 state_is(f, "TIMEOUT") ? " (no checkpoint before the time limit: is "
                                          "signal_lead long enough?)" : "");
        /* preemption is not the job's fault; the rest count as failures */
        d->failure = !state_is(f, "PREEMPTED");
        return act(d, DT_ACT_REQUEUE, why);
    }
    if (f->agents_seen) {
        /* the run had started: its srun or batch shell died under it (a
         * killed srun, a node gone): a failure like a lost agent, bounded
         * by the restart budget */
        snprintf(why, sizeof(why), "slurm job %u ended %s (exit %d, signal %d) under the "
                 "running job", f->slurm_id, f->state, f->exit_code, f->exit_signal);
        if (v->restarts - v->restart_base < v->max_restarts) {
            d->failure = true;
            return act(d, DT_ACT_REQUEUE, why);
        }
        char dd[1500];
        snprintf(dd, sizeof(dd), "%s; restart budget used up", why);
        event(d, "slurm_ended", "%s", dd);
        return act(d, DT_ACT_FAIL, dd);
    }
    snprintf(why, sizeof(why), "slurm job %u ended %s (exit %d, signal %d) before the job "
             "did: the batch script or its agents could not run; see %s", f->slurm_id,
             f->state, f->exit_code, f->exit_signal,
             f->output && *f->output ? f->output : "the batch job's output");
    event(d, "slurm_ended", "%s", why);
    return act(d, DT_ACT_FAIL, why);
}

enum dt_action dt_recovery_decide(const dt_fault_t *f, const dt_job_view_t *v,
                                  dt_decision_t *d)
{
    char why[1400];

    memset(d, 0, sizeof(*d));
    d->rank = -1;
    switch (f->kind) {
    case DT_FAULT_WORKER:
        return worker(f, v, d);
    case DT_FAULT_AGENT_LOST:
        snprintf(why, sizeof(why), "agent %lld lost with its ranks", (long long)f->agent);
        event(d, "agent_lost", "gen=%d agent=%lld hosted rank %d and up", v->gen,
              (long long)f->agent, f->rank);
        return fail_gen(v, d, f->rank, "agent lost", why);
    case DT_FAULT_AGENT_RESTARTED:
        snprintf(why, sizeof(why), "agent %lld (%s) came back without its workers",
                 (long long)f->agent, f->node ? f->node : "?");
        event(d, "agent_restarted", "%s", why);
        return fail_gen(v, d, f->rank, "agent restarted", why);
    case DT_FAULT_SHORT:
        if (v->slurm) {
            /* under Slurm a node set that must change is a requeue: the
             * lost nodes are excluded, the next run's agents resume */
            snprintf(why, sizeof(why), "%d ranks need %d slots, %d on live agents", v->ranks,
                     v->ranks, f->slots);
            d->failure = true;
            d->exclude_lost = true;
            return act(d, DT_ACT_REQUEUE, why);
        }
        if (v->replan_ranks <= 0) {
            snprintf(why, sizeof(why), "%d ranks needed, %d slots on live agents, and no plan "
                     "on fewer ranks fits", v->ranks, f->slots);
            event(d, "replan_failed", "%s", why);
            return act(d, DT_ACT_FAIL, why);
        }
        if (v->dp > 1)
            event(d, "replanned", "ranks %d -> %d (dp = %d rings of %d -> %d): %d slots on live "
                  "agents", v->ranks, v->replan_ranks, v->dp, v->ranks / v->dp,
                  v->replan_ranks / v->dp, f->slots);
        else
            event(d, "replanned", "ranks %d -> %d: %d slots on live agents", v->ranks,
                  v->replan_ranks, f->slots);
        d->ranks = v->replan_ranks;
        return act(d, DT_ACT_REPLAN, NULL);
    case DT_FAULT_PREEMPT: {
        const char *sig = f->signal ? f->signal : "USR1", *node = f->node ? f->node : "?";
        if (v->phase == DT_GEN_NONE || v->phase == DT_GEN_DONE ||
            v->phase == DT_GEN_STOPPING || v->phase == DT_GEN_WAITING)
            return act(d, DT_ACT_NONE, NULL); /* every agent sends it: the first decides */
        if (!v->slurm) {
            event(d, "signal_ignored", "agent %lld (%s) got SIG%s, which only means "
                  "something under Slurm", (long long)f->agent, node, sig);
            return act(d, DT_ACT_IGNORE, NULL);
        }
        snprintf(why, sizeof(why), "SIG%s from Slurm on %s (time limit or preemption near)",
                 sig, node);
        if (v->phase == DT_GEN_RUNNING) {
            event(d, "preempt_requested", "gen=%d at step %lld: %s: checkpoint, stop, requeue",
                  v->gen, (long long)v->step, why);
            return act(d, DT_ACT_STOP_REQUEUE, why);
        }
        /* starting or recovering: nothing new to save; requeue now */
        event(d, "preempt_requested", "%s: not running, requeue from the newest committed "
              "checkpoint", why);
        d->exclude_lost = true;
        return act(d, DT_ACT_REQUEUE, why);
    }
    case DT_FAULT_STOPPED:
        if (v->stop_requeue) {
            /* resumes from the newest committed checkpoint */
            d->exclude_lost = true;
            return act(d, DT_ACT_REQUEUE, f->detail);
        }
        return act(d, DT_ACT_CANCEL, f->detail);
    case DT_FAULT_STOP_TIMEOUT:
        return act(d, DT_ACT_CANCEL, "the planned stop did not finish in time");
    case DT_FAULT_SLURM_ENDED:
        return slurm_ended(f, v, d);
    case DT_FAULT_SLURM_LOST:
        snprintf(why, sizeof(why), "slurm job %u is unknown to slurmctld (purged or lost): "
                 "its agents cannot be running", f->slurm_id);
        event(d, "slurm_lost", "%s", why);
        return act(d, DT_ACT_FAIL, why);
    case DT_FAULT_SLURM_REQUEUED:
        snprintf(why, sizeof(why), "slurm job %u was requeued by Slurm (%s, restart %lld): the "
                 "job resumes from its newest committed checkpoint", f->slurm_id,
                 f->how ? f->how : "?", (long long)f->restart);
        return act(d, DT_ACT_REQUEUED, why);
    case DT_FAULT_SLURM_NO_ROOM:
        /* shrinking would need a new plan and a new node count in Slurm:
         * not done */
        event(d, "slurm_no_nodes", "%s", f->detail ? f->detail : "");
        return act(d, v->terminal ? DT_ACT_IGNORE : DT_ACT_FAIL, f->detail);
    }
    return act(d, DT_ACT_NONE, NULL);
}

int dt_recovery_replan(const dt_spec_t *spec, int ranks, int slots)
{
    /* dp rings of R ranks each: dp stays, R shrinks (ranks and slots
     * count every ring's workers) */
    int N = spec->dp > 1 ? (int)spec->dp : 1, most = (slots < ranks - 1 ? slots : ranks - 1) / N;

    for (int R = most; R >= 1; R--) {
        dt_spec_t s = *spec;
        dt_plan_req_t req;
        dt_plan_t plan = { 0 };
        dt_emsg_t em = { "" };
        s.ranks = R;
        dt_spec_unset_int(&s, "nodes");
        dt_spec_unset_int(&s, "spares");
        /* the workers run the stored spec: unset there is none (a submit
         * that chose layer stored it), so the planner must not pick it */
        if (s.recompute == NULL)
            s.recompute = "none";
        if (s.shard == NULL)
            s.shard = "none";
        if (s.offload == NULL)
            s.offload = "none";
        if (s.ckpt_dtype == NULL)
            s.ckpt_dtype = "fp32";
        int ok = dt_plan_req_from_spec(&s, &req, &em) == 0 &&
                 dt_plan_make(&req, &plan, &em) == 0 && plan.ranks == R;
        dt_plan_clear(&plan);
        if (ok)
            return N * R;
    }
    return 0;
}

/*-- the decision carried out -----------------------------------------------------*/

/* What the policy needs to know of the job: its row, its spec's limits,
 * its allocation, and run.c's view of the generation. */
static void view_of(dt_coord_t *c, int64_t job, const dt_fault_t *f, dt_job_view_t *v,
                    dt_spec_t *spec)
{
    dt_emsg_t em = { "" };
    dt_job_t j;
    int requeues = 0;

    memset(v, 0, sizeof(*v));
    v->job = job;
    const dt_spec_t none = { 0 }; /* the key table's defaults */
    v->max_restarts = (int)dt_spec_int(&none, "max_restarts");
    if (dt_db_job_get(c->db, job, &j, &em) == 0) {
        v->terminal = dt_job_state_terminal(j.state);
        v->recovering = j.state == DT_JOB_RECOVERING;
        v->restarts = j.restarts;
        if (dt_spec_parse("spec", j.spec ? j.spec : "", spec, &em) == 0) {
            v->max_restarts = (int)dt_spec_int(spec, "max_restarts");
            v->repeat = dt_spec_int(spec, "repeat_failures");
            v->repeat_startup = dt_spec_int(spec, "repeat_startup_failures");
            v->dp = (int)dt_spec_int(spec, "dp");
        }
        dt_job_clear(&j);
    } else {
        /* the decision goes on with what run.c knows: a job it cannot
         * read is not given more restarts than the default */
        dt_log_error("job=%lld: recovery cannot read the job: %s", (long long)job, em.s);
    }
    if (dt_db_job_counts(c->db, job, &requeues, &v->restart_base, &em) < 0)
        dt_log_error("job=%lld: recovery cannot count restarts: %s", (long long)job, em.s);
    v->slurm = dt_alloc_is_slurm(c, job);
    dt_run_view(c, job, v);
    if (f->kind == DT_FAULT_SHORT && !v->slurm)
        v->replan_ranks = dt_recovery_replan(spec, v->ranks, f->slots);
}

int dt_recovery_fault(dt_coord_t *c, int64_t job, const dt_fault_t *f)
{
    dt_job_view_t v;
    dt_decision_t d;
    dt_spec_t spec = { 0 };
    dt_emsg_t em = { "" };
    bool slurm_side = DT_FAULT_FROM_SLURM(f->kind);
    int rc;

    view_of(c, job, f, &v, &spec);
    dt_recovery_decide(f, &v, &d);
    dt_log_debug("job=%lld fault %d: %s", (long long)job, (int)f->kind,
                 dt_action_name(d.action));
    for (int i = 0; i < d.nev; i++)
        dt_coord_event(c, job, d.ev[i].kind, "%s", d.ev[i].detail);
    if (d.suspect)
        dt_run_suspect(c, job, d.suspect_agent);
    if (d.abort)
        dt_run_abort(c, job, d.abort_why, d.rank);
    switch (d.action) {
    case DT_ACT_NONE:
    case DT_ACT_IGNORE:
        break;
    case DT_ACT_RESTART:
        /* a generation that failed before the job was running again is
         * one more restart too, or failures at start-up would never use
         * the budget. Not recorded: logged, and the next generation
         * starts anyway (the budget then errs towards one more try) */
        rc = v.recovering ? dt_db_job_restart_again(c->db, job, d.why, &em)
                          : dt_db_job_transition(c->db, job, DT_JOB_RECOVERING, "recovering",
                                                 d.why, &em);
        if (rc < 0)
            dt_log_error("job=%lld -> recovering: %s", (long long)job, em.s);
        dt_run_next(c, job);
        break;
    case DT_ACT_RETRY:
        if (d.mem_corrupt)
            dt_run_mem_forget(c, job);
        if (d.ckpt_corrupt) {
            /* not marked: logged; the agent still sets the directory
             * aside, so no generation resumes from it */
            if (dt_db_checkpoint_set_state(c->db, job, v.resume_step, "corrupt", &em) < 0)
                dt_log_error("job=%lld step=%lld: %s", (long long)job,
                             (long long)v.resume_step, em.s);
            dt_run_set_aside(c, job, v.resume_step);
        }
        dt_run_abort(c, job, d.why, -1);
        dt_run_next(c, job);
        break;
    case DT_ACT_REPLAN:
        dt_run_replan(c, job, d.ranks);
        break;
    case DT_ACT_REQUEUE:
        if ((rc = dt_alloc_requeue(c, job, d.exclude_lost ? v.lost_nodes : NULL, d.failure,
                                   d.why, &em)) == 0) {
            dt_run_requeued(c, job);
        } else if (slurm_side) {
            /* the next poll decides again */
            dt_log_error("job=%lld: %s", (long long)job, em.s);
        } else {
            char dd[sizeof(d.why) + sizeof(em.s) + 32];
            snprintf(dd, sizeof(dd), "%s; and the requeue failed: %s", d.why, em.s);
            dt_run_end(c, job, DT_JOB_FAILED, dd);
        }
        break;
    case DT_ACT_STOP_REQUEUE:
        if (dt_run_stop(c, job, d.why, true, &em) < 0)
            dt_log_error("job=%lld: %s", (long long)job, em.s);
        break;
    case DT_ACT_REQUEUED:
        /* not recorded: the run is kept, and the next poll or agent sees
         * the new restart count again */
        if (dt_db_job_requeue(c->db, job, true, "requeued", d.why, &em) < 0)
            dt_log_error("job=%lld: %s", (long long)job, em.s);
        else
            dt_run_requeued(c, job);
        break;
    case DT_ACT_FAIL:
    case DT_ACT_CANCEL: {
        enum dt_job_state to = d.action == DT_ACT_FAIL ? DT_JOB_FAILED : DT_JOB_CANCELLED;
        if (!slurm_side) {
            dt_run_end(c, job, to, d.why);
            break;
        }
        /* the transition not recorded: logged; the agents are told the job
         * ended all the same, since its Slurm job is gone */
        if (dt_db_job_transition(c->db, job, to, NULL, d.why, &em) < 0)
            dt_log_error("job=%lld: %s", (long long)job, em.s);
        dt_run_cancelled(c, job);
        break;
    }
    }
    dt_spec_free(&spec);
    return d.action;
}

void dt_recovery_job_ended(dt_coord_t *c, int64_t job, int cancelled)
{
    dt_alloc_job_ended(c, job, cancelled);
}

/*-- lost agents ------------------------------------------------------------------*/

void dt_recovery_sweep(dt_coord_t *c)
{
    int64_t now = dt_clock_mono_ms();
    dt_live_agent_t *a = c->agents, *next;
    dt_emsg_t em = { "" };
    int n = 0, open = 0;
    struct {
        int64_t job, agent, heard_ms;
    } *lost = NULL;

    for (; a; a = next) {
        next = a->next;
        if (now - a->last_seen_ms <= c->conf.agent_timeout_ms)
            continue;
        /* all agents lost in one sweep: one transaction (without one, each
         * update below is its own) */
        if (!open && dt_db_begin(c->db, &em) == 0)
            open = 1;
        dt_log_warn("job=%lld agent=%lld lost: silent for %lld ms", (long long)a->job,
                    (long long)a->id, (long long)(now - a->last_seen_ms));
        if (dt_db_agent_set_state(c->db, a->id, "lost", dt_clock_wall_ms(), &em) < 0)
            dt_log_error("agent=%lld: %s", (long long)a->id, em.s);
        if (a->conn)
            a->conn->agent = 0;
        lost = dt_xrealloc(lost, (size_t)(n + 1) * sizeof(*lost));
        lost[n].job = a->job;
        lost[n].agent = a->id;
        lost[n].heard_ms = dt_clock_wall_ms() - (now - a->last_seen_ms);
        dt_coord_agent_remove(c, a->id);
        n++;
    }
    if (open && dt_db_commit(c->db, &em) < 0)
        dt_log_error("recording %d lost agents failed: %s", n, em.s);
    /* recovery decisions after the lost agents are recorded */
    for (int i = 0; i < n; i++)
        dt_run_agent_lost(c, lost[i].job, lost[i].agent, lost[i].heard_ms);
    free(lost);
    dt_run_tick(c);
}
