/* SPDX-License-Identifier: MIT
 *
 * Slurm jobs of dt jobs (alloc.h): submission, following, requeue and
 * cancel, with libslurm's blocking calls (slurm.c) on libuv's thread pool.
 *
 * One queue of calls, run one at a time in order: a requeue never overtakes
 * the submission before it, and slurmctld sees at most one dtcoordd call
 * at a time; a poll is one call for every job followed. Per job, a small
 * record of what the loop thread knows beyond the database: the restart
 * count of the run whose agents registered (a higher count from slurmctld
 * means Slurm requeued the job itself), a requeue or submission in
 * flight, when the dt job ended, whether it may have a Slurm job that was
 * never recorded.
 *
 * What Slurm says about a live dt job (its Slurm job ended, vanished, was
 * requeued by Slurm itself, or a requeue would pend for ever) is reported
 * through the coordinator's fault hook: the recovery policy (recovery.c)
 * decides, and calls back dt_alloc_requeue when the job is requeued.
 *
 * Not here: the batch script (batch.c), generations (run.c), every
 * recovery decision (recovery.c).
 */
#include "config.h"

#include <errno.h>
#include <inttypes.h>
#include <pwd.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "common/clock.h"
#include "common/fileio.h"
#include "common/log.h"
#include "common/mem.h"
#include "coordinator/alloc.h"
#include "coordinator/jobdir.h"
#include "coordinator/batch.h"
#include "coordinator/recovery.h"
#include "db/db.h"

#define END_GRACE_MS 60000     /* a finished dt job's batch job ends by itself within this */
#define RETRY_MAX_MS 60000     /* slurmctld unreachable: retry the submission up to this often */
#define FOUND_MAX 8            /* Slurm jobs of one name looked at before submitting again */

enum op_kind { OP_SUBMIT, OP_POLL, OP_REQUEUE, OP_CANCEL };

typedef struct op {
    uv_work_t work;
    enum op_kind kind;
    int64_t job;
    uint32_t slurm_id;
    dt_slurm_desc_t desc;   /* OP_SUBMIT */
    char *exclude;          /* OP_SUBMIT, OP_REQUEUE */
    int rc;
    dt_emsg_t em;
    /* OP_SUBMIT: look for a Slurm job of this name first (it may have been
     * submitted and not recorded); what was found instead of submitting */
    int lookup;
    uint32_t found[FOUND_MAX];
    size_t nfound;
    /* OP_POLL: n jobs in one slurm_load_jobs */
    size_t n;
    int64_t *jobs;
    uint32_t *ids;
    dt_slurm_info_t *infos;
    int *rcs;
    dt_slurm_poll_stats_t stats;
    /* OP_REQUEUE with an exclusion: the nodes left, and whether too few */
    dt_slurm_room_t room;
    int no_room;
    struct op *next;
} op_t;

typedef struct track {
    int64_t job;
    uint32_t slurm_id;      /* 0 until submitted */
    int64_t run_restart;    /* restart count of the run whose agents registered */
    int agents_seen;        /* an agent of the current run registered */
    int submitting, requeueing, querying;
    int64_t ended_ms;       /* monotonic; 0 while the dt job runs */
    int cancel_sent;
    int64_t retry_at_ms, retry_ms; /* submission retries while slurmctld is away */
    int unreachable_told;
    int lookup;             /* it may have a Slurm job dt did not record: look first */
    int gone;               /* nothing left to follow */
    struct track *next;
} track_t;

typedef struct dt_alloc {
    dt_coord_t *c;
    uv_timer_t poll;
    op_t *queue, *running;
    track_t *tracks;
    char **env;             /* slurm_env split, NULL-terminated */
    char *coord_addr, *agent, *output_dir;
    int crash_after_submit; /* DT_TEST_CRASH_AFTER_SUBMIT: tests only (dtcoordd(8)) */
    int closing;
} dt_alloc_t;

/*-- small helpers ---------------------------------------------------------------*/


static track_t *track_find(dt_alloc_t *al, int64_t job)
{
    for (track_t *t = al->tracks; t; t = t->next)
        if (t->job == job)
            return t;
    return NULL;
}

static track_t *track_get(dt_alloc_t *al, int64_t job)
{
    track_t *t = track_find(al, job);
    if (t == NULL) {
        t = dt_xcalloc(1, sizeof(*t));
        t->job = job;
        t->next = al->tracks;
        al->tracks = t;
    }
    return t;
}

static int job_get(dt_coord_t *c, int64_t job, dt_job_t *j)
{
    dt_emsg_t em = { "" };
    int rc = dt_db_job_get(c->db, job, j, &em);
    if (rc < 0)
        dt_log_error("job=%lld: %s", (long long)job, em.s);
    return rc;
}

/* "a,b" + "c" with duplicates dropped; NULL or "" parts ignored. */
static char *list_join(const char *a, const char *b)
{
    size_t n = (a ? strlen(a) : 0) + (b ? strlen(b) : 0) + 2;
    char *out = dt_xcalloc(1, n), *tmp = dt_xstrdup(b ? b : ""), *save = NULL;
    if (a && *a)
        strcpy(out, a);
    for (char *tok = strtok_r(tmp, ",", &save); tok; tok = strtok_r(NULL, ",", &save)) {
        int dup = 0;
        char *o = dt_xstrdup(out), *s2 = NULL;
        for (char *x = strtok_r(o, ",", &s2); x && !dup; x = strtok_r(NULL, ",", &s2))
            dup = strcmp(x, tok) == 0;
        free(o);
        if (dup)
            continue;
        if (*out)
            strcat(out, ",");
        strcat(out, tok);
    }
    free(tmp);
    return out;
}

/*-- the queue of libslurm calls ------------------------------------------------*/

static void pump(dt_alloc_t *al);

static void op_work(uv_work_t *w)
{
    op_t *o = w->data;
    switch (o->kind) {
    case OP_SUBMIT:
        if (o->lookup) {
            o->rc = dt_slurm_find(o->desc.name, o->desc.uid, o->found, FOUND_MAX, &o->nfound,
                                  &o->em);
            if (o->rc < 0)
                o->rc = DT_ECOMM; /* not known whether it has one: try again later */
            if (o->rc < 0 || o->nfound > 0)
                break; /* the loop thread adopts one, or tries again */
        }
        o->rc = dt_slurm_submit(&o->desc, &o->slurm_id, &o->em);
        break;
    case OP_POLL:
        o->rc = dt_slurm_query_jobs(o->ids, o->n, o->infos, o->rcs, &o->stats, &o->em);
        break;
    case OP_REQUEUE:
        /* an exclusion that leaves too few nodes would pend for ever: look
         * first (when the look fails, the requeue says why, or goes on) */
        if (o->exclude != NULL &&
            dt_slurm_room(o->slurm_id, o->exclude, &o->room, &o->em) == 0 &&
            o->room.usable < o->room.need) {
            o->no_room = 1;
            o->rc = DT_ENOSPC;
            break;
        }
        o->rc = dt_slurm_requeue(o->slurm_id, o->exclude, &o->em);
        break;
    case OP_CANCEL: o->rc = dt_slurm_cancel(o->slurm_id, &o->em); break;
    }
}

static void op_free(op_t *o)
{
    dt_slurm_desc_clear(&o->desc);
    free(o->exclude);
    free(o->jobs);
    free(o->ids);
    free(o->infos);
    free(o->rcs);
    free(o);
}

static void on_submitted(dt_alloc_t *al, op_t *o);
static void on_polled(dt_alloc_t *al, op_t *o);
static void no_room(dt_alloc_t *al, op_t *o);

static void op_done(uv_work_t *w, int status)
{
    op_t *o = w->data;
    dt_alloc_t *al = o->work.loop->data ? ((dt_coord_t *)o->work.loop->data)->alloc : NULL;
    dt_coord_t *c = al ? al->c : NULL;
    track_t *t;

    if (al == NULL) {
        op_free(o);
        return;
    }
    al->running = NULL;
    if (status == UV_ECANCELED || al->closing) {
        op_free(o);
        pump(al);
        return;
    }
    t = track_find(al, o->job);
    switch (o->kind) {
    case OP_SUBMIT: on_submitted(al, o); break;
    case OP_POLL: on_polled(al, o); break;
    case OP_REQUEUE:
        if (t)
            t->requeueing = 0;
        if (o->no_room)
            no_room(al, o);
        else if (o->rc < 0)
            dt_coord_event(c, o->job, "slurm_error", "requeue of slurm job %u failed: %s (the next "
                  "query decides again)", o->slurm_id, o->em.s);
        break;
    case OP_CANCEL:
        if (o->rc < 0)
            dt_log_warn("job=%lld cancel of slurm job %u: %s", (long long)o->job, o->slurm_id,
                        o->em.s);
        break;
    }
    op_free(o);
    pump(al);
}

static void pump(dt_alloc_t *al)
{
    if (al->running || al->queue == NULL || al->closing)
        return;
    op_t *o = al->queue;
    al->queue = o->next;
    o->next = NULL;
    o->work.data = o;
    al->running = o;
    int rc = uv_queue_work(al->c->loop, &o->work, op_work, op_done);
    if (rc < 0) {
        dt_log_error("job=%lld: cannot queue a Slurm call: %s", (long long)o->job,
                     uv_strerror(rc));
        al->running = NULL;
        op_free(o);
    }
}

static op_t *enqueue(dt_alloc_t *al, enum op_kind kind, int64_t job, uint32_t slurm_id)
{
    op_t *o = dt_xcalloc(1, sizeof(*o)), **tail = &al->queue;
    o->kind = kind;
    o->job = job;
    o->slurm_id = slurm_id;
    while (*tail)
        tail = &(*tail)->next;
    *tail = o;
    return o;
}

/*-- submission -------------------------------------------------------------------*/

/* bc->output_dir may point into *jobdir, which the caller frees. */
static void conf_of(dt_coord_t *c, int64_t job, uint32_t owner, dt_batch_conf_t *bc,
                    char **jobdir)
{
    dt_alloc_t *al = c->alloc;
    struct passwd *pw = getpwuid(owner);
    dt_job_t j;

    memset(bc, 0, sizeof(*bc));
    bc->coord_addr = al->coord_addr;
    bc->agent_path = al->agent;
    bc->engine_path = c->conf.slurm_engine;
    bc->munge_socket = c->conf.munge_socket;
    /* the batch output is the job owner's, written by slurmstepd as the
     * owner: in the job's directory unless the site names a shared one */
    *jobdir = al->output_dir ? NULL : dt_jobdir_path(c->conf.jobs_dir, job);
    bc->output_dir = al->output_dir ? al->output_dir : *jobdir;
    bc->setup = c->conf.slurm_setup;
    bc->env = (const char *const *)al->env;
    bc->hang_timeout_ms = c->conf.slurm_hang_timeout_ms;
    bc->signal = c->conf.slurm_signal;
    bc->uid = owner;
    bc->gid = pw ? pw->pw_gid : owner;
    /* with the id, the creation time names the Slurm job (batch.h) */
    if (job > 0 && job_get(c, job, &j) == 0) {
        bc->created_ms = j.created_ms;
        dt_job_clear(&j);
    }
}

int dt_alloc_describe(dt_coord_t *c, int64_t job, const dt_spec_t *s, const dt_plan_req_t *req,
                      const dt_plan_t *plan, uint32_t owner, dt_slurm_desc_t *d, dt_emsg_t *em)
{
    dt_batch_conf_t bc;
    char *jobdir = NULL;

    if (c->alloc == NULL)
        return dt_emsg_set(em, DT_ENOTSUP, "this dtcoordd does not submit to Slurm (slurm = no "
                           "in %s)", c->conf_path);
    conf_of(c, job, owner, &bc, &jobdir);
    int gpn = req->cluster.gpus_per_node > 0 ? req->cluster.gpus_per_node : 1;
    /* the plan's node count includes the spares; batch.c adds them back.
     * Every worker needs a slot: dp rings of the plan's ranks */
    int nodes = (plan->workers + gpn - 1) / gpn;
    int rc = dt_batch_make(job, s, nodes, gpn, NULL, &bc, d, em);
    free(jobdir);
    return rc;
}

int dt_alloc_check(dt_coord_t *c, const dt_spec_t *s, const dt_plan_req_t *req,
                   const dt_plan_t *plan, uint32_t owner, dt_emsg_t *em)
{
    dt_slurm_desc_t d;
    int rc;

    if (c->alloc == NULL)
        return 0;
    rc = dt_alloc_describe(c, 0, s, req, plan, owner, &d, em);
    dt_slurm_desc_clear(&d);
    return rc;
}

/* A queued job whose batch job cannot be made fails. Not recorded: logged;
 * the job stays queued, and the next submission (a restart) tries again. */
static void refused(dt_coord_t *c, track_t *t, const char *why)
{
    dt_emsg_t em = { "" };

    if (dt_db_job_transition(c->db, t->job, DT_JOB_FAILED, NULL, why, &em) < 0)
        dt_log_error("job=%lld -> failed: %s", (long long)t->job, em.s);
}

/* Build and queue the submission of a queued job with no Slurm job. */
static void submit(dt_alloc_t *al, track_t *t)
{
    dt_coord_t *c = al->c;
    dt_emsg_t em = { "" };
    dt_job_t j;
    dt_spec_t s = { 0 };
    dt_plan_req_t req;
    dt_plan_t plan = { 0 };

    if (t->submitting || job_get(c, t->job, &j) < 0)
        return;
    op_t *o = NULL;
    int rc;
    if ((rc = dt_spec_parse("spec", j.spec ? j.spec : "", &s, &em)) < 0 ||
        (rc = dt_plan_req_from_spec(&s, &req, &em)) < 0 ||
        (rc = dt_plan_make(&req, &plan, &em)) < 0) {
        dt_coord_event(c, t->job, "slurm_refused", "the stored job no longer plans: %s", em.s);
        refused(c, t, em.s);
        goto out;
    }
    dt_slurm_job_t old = { 0 };
    dt_emsg_t e2 = { "" };
    int had = dt_db_slurm_get(c->db, t->job, &old, &e2) == 0;
    dt_slurm_job_clear(&old);
    if (had)
        goto out; /* it has one: nothing to submit */
    /* the job's directory first: Slurm writes its output there, as the
     * owner, and the batch job starts in it */
    if ((rc = dt_jobdir_ensure(c->jobs_fd, c->conf.jobs_dir, t->job, (uid_t)j.owner, &em)) < 0 &&
        al->output_dir == NULL) {
        dt_coord_event(c, t->job, "slurm_refused", "%s", em.s);
        refused(c, t, em.s);
        goto out;
    }
    o = enqueue(al, OP_SUBMIT, t->job, 0);
    /* exclusions of the job's earlier Slurm jobs (before a resume) are not
     * carried: a resume is the user's fresh start (the spec's exclude is) */
    if ((rc = dt_alloc_describe(c, t->job, &s, &req, &plan, j.owner, &o->desc, &em)) < 0) {
        /* dequeue it again: the description is refused, nothing to send */
        for (op_t **pp = &al->queue; *pp; pp = &(*pp)->next)
            if (*pp == o) {
                *pp = o->next;
                break;
            }
        op_free(o);
        dt_coord_event(c, t->job, "slurm_refused", "%s", em.s);
        refused(c, t, em.s);
        goto out;
    }
    o->exclude = o->desc.exclude ? dt_xstrdup(o->desc.exclude) : NULL;
    o->lookup = t->lookup;
    t->submitting = 1;
    pump(al);
out:
    dt_plan_clear(&plan);
    dt_spec_free(&s);
    dt_job_clear(&j);
}

/* Follow Slurm job `id` of the job from now on (recorded by the caller). */
static void follow(dt_alloc_t *al, track_t *t, uint32_t id)
{
    dt_coord_t *c = al->c;
    dt_job_t j;

    t->retry_ms = 0;
    t->unreachable_told = 0;
    t->lookup = 0;
    t->slurm_id = id;
    t->run_restart = 0;
    t->agents_seen = 0;
    /* a dt job cancelled while the submission was in flight */
    if (job_get(c, t->job, &j) == 0) {
        if (dt_job_state_terminal(j.state))
            dt_alloc_job_ended(c, t->job, j.state == DT_JOB_CANCELLED);
        dt_job_clear(&j);
    }
}

static void submitted_detail(const op_t *o, char *buf, size_t n)
{
    snprintf(buf, n, "%u nodes, output %s%s%s", o->desc.nodes,
             o->desc.output ? o->desc.output : "-", o->exclude ? ", excluding " : "",
             o->exclude ? o->exclude : "");
}

/* Slurm jobs named as this one's that dt did not record: dtcoordd stopped
 * between slurmctld's answer and the database. Follow the newest instead
 * of submitting another. One recorded already (DT_EEXIST) is an earlier
 * Slurm job of the job, from before a resume, still ending: not it. */
static void adopt(dt_alloc_t *al, track_t *t, op_t *o)
{
    dt_coord_t *c = al->c;
    dt_emsg_t em = { "" };
    char detail[512];

    submitted_detail(o, detail, sizeof(detail));
    for (size_t i = 0; i < o->nfound; i++) {
        int rc = dt_db_slurm_submitted(c->db, o->job, o->found[i], o->desc.output, o->exclude,
                                       detail, &em);
        if (rc == DT_EEXIST)
            continue;
        if (rc < 0) {
            dt_log_error("job=%lld: slurm job %u found but not recorded: %s", (long long)o->job,
                         o->found[i], em.s);
            t->retry_at_ms = dt_clock_mono_ms() + 1000;
            return;
        }
        dt_coord_event(c, o->job, "slurm_adopted", "slurm job %u (%s) was submitted before "
                       "dtcoordd stopped, but not recorded: following it, not submitting again",
                       o->found[i], o->desc.name);
        follow(al, t, o->found[i]);
        return;
    }
    t->lookup = 0; /* none of ours: submit */
    submit(al, t);
}

static void on_submitted(dt_alloc_t *al, op_t *o)
{
    dt_coord_t *c = al->c;
    track_t *t = track_get(al, o->job);
    dt_emsg_t em = { "" };
    char detail[512];

    t->submitting = 0;
    if (o->rc == DT_ECOMM) {
        /* slurmctld away: the job stays queued, submitted when it is back.
         * The request may have reached it: look before submitting again. */
        t->lookup = 1;
        t->retry_ms = t->retry_ms ? t->retry_ms * 2 : 1000;
        if (t->retry_ms > RETRY_MAX_MS)
            t->retry_ms = RETRY_MAX_MS;
        t->retry_at_ms = dt_clock_mono_ms() + t->retry_ms;
        if (!t->unreachable_told) {
            t->unreachable_told = 1;
            dt_coord_event(c, o->job, "slurm_unreachable", "%s: retrying", o->em.s);
        }
        return;
    }
    if (o->rc < 0) {
        /* slurmctld refused what dt asked: no requeue or retry fixes that */
        char why[sizeof(o->em.s) + 64];
        snprintf(why, sizeof(why), "Slurm refused the batch job: %s", o->em.s);
        dt_coord_event(c, o->job, "slurm_refused", "%s", o->em.s);
        if (dt_db_job_transition(c->db, o->job, DT_JOB_FAILED, NULL, why, &em) < 0)
            dt_log_error("job=%lld: %s", (long long)o->job, em.s);
        t->gone = 1;
        return;
    }
    if (o->nfound > 0) {
        adopt(al, t, o);
        return;
    }
    if (al->crash_after_submit) {
        /* the window adopt() closes, opened on purpose (tests only) */
        dt_log_error("job=%lld slurm job %u submitted; DT_TEST_CRASH_AFTER_SUBMIT is set: "
                     "dying before it is recorded", (long long)o->job, o->slurm_id);
        raise(SIGKILL);
    }
    submitted_detail(o, detail, sizeof(detail));
    t->slurm_id = o->slurm_id;
    if (dt_db_slurm_submitted(c->db, o->job, o->slurm_id, o->desc.output, o->exclude, detail,
                              &em) < 0)
        dt_log_error("job=%lld: slurm job %u submitted but not recorded: %s", (long long)o->job,
                     o->slurm_id, em.s);
    follow(al, t, o->slurm_id);
}

void dt_alloc_submit(dt_coord_t *c, int64_t job)
{
    if (c->alloc == NULL)
        return;
    track_t *t = track_get(c->alloc, job);
    t->gone = 0;
    t->ended_ms = 0;
    t->cancel_sent = 0;
    t->slurm_id = 0;
    submit(c->alloc, t);
}

bool dt_alloc_is_slurm(const dt_coord_t *c, int64_t job)
{
    if (c->alloc == NULL)
        return false;
    for (track_t *t = c->alloc->tracks; t; t = t->next)
        if (t->job == job)
            return true;
    return false;
}

/*-- following ----------------------------------------------------------------------*/

/* Slurm requeued the job without dt asking (its own node-failure requeue,
 * an admin's scontrol requeue): the running generation is gone. */
static void outside_requeue(dt_alloc_t *al, track_t *t, int64_t restart, const char *how)
{
    dt_fault_t f = { .kind = DT_FAULT_SLURM_REQUEUED, .rank = -1, .slurm_id = t->slurm_id,
                     .restart = restart, .how = how };

    t->run_restart = restart;
    t->agents_seen = 0;
    al->c->hooks->fault(al->c, t->job, &f);
}

/* What slurmctld said about one job (rc 0, DT_ENOENT when it no longer
 * knows it, another error with `err` when it could not be asked). */
static void on_info(dt_alloc_t *al, track_t *t, uint32_t slurm_id, int rc,
                    dt_slurm_info_t *in, const char *err)
{
    dt_coord_t *c = al->c;
    dt_emsg_t em = { "" };
    dt_job_t j;
    int changed = 0;

    if (t == NULL || t->slurm_id != slurm_id)
        return; /* a resubmission replaced it */
    if (rc == DT_ENOENT) {
        /* purged from slurmctld (MinJobAge): what we recorded is final */
        if (t->ended_ms || t->requeueing == 0) {
            dt_slurm_job_t s = { 0 };
            if (dt_db_slurm_get(c->db, t->job, &s, &em) == 0 && strcmp(s.state, "RUNNING") != 0 &&
                strcmp(s.state, "PENDING") != 0)
                t->gone = 1;
            dt_slurm_job_clear(&s);
        }
        if (!t->gone && job_get(c, t->job, &j) == 0) {
            if (!dt_job_state_terminal(j.state)) {
                dt_fault_t f = { .kind = DT_FAULT_SLURM_LOST, .rank = -1,
                                 .slurm_id = t->slurm_id };
                c->hooks->fault(c, t->job, &f);
            }
            t->gone = 1;
            dt_job_clear(&j);
        }
        return;
    }
    if (rc < 0) {
        if (!t->unreachable_told) {
            t->unreachable_told = 1;
            dt_coord_event(c, t->job, "slurm_unreachable", "query of slurm job %u: %s", t->slurm_id,
                  err);
        }
        return;
    }
    t->unreachable_told = 0;
    dt_slurm_job_t s = { .slurm_id = in->id, .job = t->job, .state = in->state,
                         .reason = in->reason, .nodes = in->nodes, .exclude = in->exclude,
                         .restarts = (int)in->restarts, .exit_code = in->exit_code };
    if (dt_db_slurm_update(c->db, &s, &changed, &em) < 0)
        dt_log_error("job=%lld slurm job %u: %s", (long long)t->job, t->slurm_id, em.s);
    if (job_get(c, t->job, &j) < 0)
        return;
    if (dt_job_state_terminal(j.state)) {
        if (in->final)
            t->gone = 1;
        else if (!t->cancel_sent && t->ended_ms &&
                 dt_clock_mono_ms() - t->ended_ms >= END_GRACE_MS) {
            t->cancel_sent = 1;
            dt_coord_event(c, t->job, "slurm_cancel", "slurm job %u still %s %d s after the job ended: "
                  "cancelling it", t->slurm_id, in->state, END_GRACE_MS / 1000);
            enqueue(al, OP_CANCEL, t->job, t->slurm_id);
            pump(al);
        }
        goto out;
    }
    if (t->requeueing)
        goto out; /* dt's own requeue is under way */
    int live = j.state == DT_JOB_STARTING || j.state == DT_JOB_RUNNING ||
               j.state == DT_JOB_RECOVERING;
    if (!in->final) {
        if (live && (int64_t)in->restarts > t->run_restart)
            outside_requeue(al, t, in->restarts, in->requeued ? "requeue flag" : "restart count");
        goto out;
    }
    if (in->requeued)
        goto out; /* ending now, pending again soon */
    /* the batch job's output, for a reason that points there */
    dt_slurm_job_t rec = { 0 };
    dt_emsg_t e2 = { "" };
    if (dt_db_slurm_get(c->db, t->job, &rec, &e2) < 0)
        dt_log_debug("job=%lld: no slurm record: %s", (long long)t->job, e2.s);
    dt_fault_t f = { .kind = DT_FAULT_SLURM_ENDED, .rank = -1, .slurm_id = t->slurm_id,
                     .state = in->state, .nodes = in->nodes, .output = rec.output,
                     .exit_code = in->exit_code, .exit_signal = in->exit_signal,
                     .agents_seen = t->agents_seen };
    int action = c->hooks->fault(c, t->job, &f);
    dt_slurm_job_clear(&rec);
    /* a requeue keeps following it; an end is final */
    if (action == DT_ACT_FAIL || action == DT_ACT_CANCEL)
        t->gone = 1;
out:
    dt_job_clear(&j);
}

static void on_polled(dt_alloc_t *al, op_t *o)
{
    dt_log_debug("slurm poll: %zu jobs in 1 call (slurm_load_jobs: %s; %u records; %llu "
                 "slurmctld calls since start)", o->n, o->rc < 0 ? o->em.s
                 : o->stats.changed ? "changed" : "no change", o->stats.records,
                 (unsigned long long)o->stats.rpcs);
    for (size_t i = 0; i < o->n; i++) {
        track_t *t = track_find(al, o->jobs[i]);
        if (t == NULL)
            continue;
        t->querying = 0;
        on_info(al, t, o->ids[i], o->rc < 0 ? o->rc : o->rcs[i], &o->infos[i], o->em.s);
    }
}

/* Every slurm_poll: the jobs with a Slurm job, all in one call. */
static void on_poll(uv_timer_t *tm)
{
    dt_alloc_t *al = tm->data;
    int64_t now = dt_clock_mono_ms();
    op_t *o = NULL;

    for (track_t *t = al->tracks, *next, **pp = &al->tracks; t; t = next) {
        next = t->next;
        if (t->gone && !t->submitting && !t->querying && !t->requeueing) {
            *pp = next;
            free(t);
            continue;
        }
        pp = &t->next;
        if (t->slurm_id == 0) {
            if (!t->submitting && !t->gone && t->retry_at_ms && now >= t->retry_at_ms) {
                t->retry_at_ms = 0;
                submit(al, t);
            }
            continue;
        }
        if (t->querying || t->gone)
            continue;
        if (o == NULL)
            o = enqueue(al, OP_POLL, 0, 0);
        o->jobs = dt_xrealloc(o->jobs, (o->n + 1) * sizeof(*o->jobs));
        o->ids = dt_xrealloc(o->ids, (o->n + 1) * sizeof(*o->ids));
        o->jobs[o->n] = t->job;
        o->ids[o->n] = t->slurm_id;
        o->n++;
        t->querying = 1;
    }
    if (o != NULL) {
        o->infos = dt_xcalloc(o->n, sizeof(*o->infos));
        o->rcs = dt_xcalloc(o->n, sizeof(*o->rcs));
    }
    pump(al);
}

/*-- recovery and the end ------------------------------------------------------------*/

/* A requeue excluding nodes would leave the job fewer nodes than it
 * needs: it would pend for ever. Fail it, saying which nodes are out and
 * how many it needs, and cancel its Slurm job. (Shrinking would need a
 * new plan on fewer ranks and a new node count in Slurm: not done.) */
static void no_room(dt_alloc_t *al, op_t *o)
{
    dt_coord_t *c = al->c;
    track_t *t = track_find(al, o->job);
    const dt_slurm_room_t *r = &o->room;
    dt_job_t j;
    char why[3000];

    if (t == NULL || t->slurm_id != o->slurm_id || job_get(c, o->job, &j) < 0)
        return;
    snprintf(why, sizeof(why), "slurm job %u needs %u nodes, but partition %s has only %u "
             "usable with %s excluded (%u nodes in it%s%s%s): requeued it would pend for ever",
             o->slurm_id, r->need, *r->partition ? r->partition : "(default)", r->usable,
             r->excluded, r->in_partition, *r->unusable ? "; not usable: " : "", r->unusable,
             r->features_checked ? "" : "; its constraint was not evaluated");
    dt_job_clear(&j);
    dt_fault_t f = { .kind = DT_FAULT_SLURM_NO_ROOM, .rank = -1, .slurm_id = o->slurm_id,
                     .detail = why };
    c->hooks->fault(c, o->job, &f);
    t->ended_ms = dt_clock_mono_ms();
    if (!t->cancel_sent) {
        t->cancel_sent = 1;
        enqueue(al, OP_CANCEL, o->job, o->slurm_id);
        pump(al);
    }
}

int dt_alloc_requeue(dt_coord_t *c, int64_t job, const char *exclude, bool failure,
                     const char *why, dt_emsg_t *em)
{
    dt_alloc_t *al = c->alloc;
    track_t *t = al ? track_find(al, job) : NULL;
    char detail[1400];
    int rc;

    if (t == NULL || t->slurm_id == 0)
        return dt_emsg_set(em, DT_ESTATE, "job %lld has no Slurm job to requeue", (long long)job);
    snprintf(detail, sizeof(detail), "%s; slurm job %u requeued%s%s", why, t->slurm_id,
             exclude && *exclude ? " excluding " : "", exclude && *exclude ? exclude : "");
    if ((rc = dt_db_job_requeue(c->db, job, failure, "requeued", detail, em)) < 0)
        return rc;
    /* the next run's agents register with a higher restart count */
    t->run_restart++;
    t->agents_seen = 0;
    t->requeueing = 1;
    op_t *o = enqueue(al, OP_REQUEUE, job, t->slurm_id);
    o->exclude = exclude && *exclude ? dt_xstrdup(exclude) : NULL;
    if (exclude && *exclude) {
        /* recorded now, so a later resubmission of this job keeps it */
        dt_slurm_job_t s = { 0 };
        dt_emsg_t e2 = { "" };
        int changed;
        if (dt_db_slurm_get(c->db, job, &s, &e2) == 0) {
            char *merged = list_join(s.exclude, exclude);
            free(s.exclude);
            s.exclude = merged;
            /* not recorded: logged; this requeue still excludes them, a
             * later resubmission of the job would not */
            if (dt_db_slurm_update(c->db, &s, &changed, &e2) < 0)
                dt_log_error("job=%lld: exclusion not recorded: %s", (long long)job, e2.s);
        }
        dt_slurm_job_clear(&s);
    }
    pump(al);
    return 0;
}

void dt_alloc_job_ended(dt_coord_t *c, int64_t job, int cancelled)
{
    dt_alloc_t *al = c->alloc;
    track_t *t = al ? track_find(al, job) : NULL;

    if (t == NULL)
        return;
    t->ended_ms = dt_clock_mono_ms();
    if (cancelled && t->slurm_id && !t->cancel_sent) {
        t->cancel_sent = 1;
        enqueue(al, OP_CANCEL, job, t->slurm_id);
        pump(al);
    }
}

int dt_alloc_agent(dt_coord_t *c, int64_t job, int64_t slurm_id, int64_t restart, dt_emsg_t *em)
{
    dt_alloc_t *al = c->alloc;
    track_t *t = al ? track_find(al, job) : NULL;

    if (t == NULL || slurm_id <= 0)
        return 0; /* not a Slurm job of ours, or an agent started by hand */
    if (t->slurm_id != 0 && (uint32_t)slurm_id != t->slurm_id)
        return dt_emsg_set(em, DT_ESTATE, "agent of slurm job %lld, but job %lld runs as slurm "
                           "job %u now", (long long)slurm_id, (long long)job, t->slurm_id);
    if (restart < t->run_restart)
        return dt_emsg_set(em, DT_ESTATE, "agent of an earlier run of slurm job %lld (restart "
                           "%lld, the job is at restart %lld)", (long long)slurm_id,
                           (long long)restart, (long long)t->run_restart);
    if (restart > t->run_restart) {
        dt_job_t j;
        if (job_get(c, job, &j) == 0) {
            if (j.state == DT_JOB_STARTING || j.state == DT_JOB_RUNNING ||
                j.state == DT_JOB_RECOVERING)
                outside_requeue(al, t, restart, "a new run's agent registered");
            dt_job_clear(&j);
        }
        t->run_restart = restart;
    }
    t->agents_seen = 1;
    return 0;
}

/*-- life cycle ------------------------------------------------------------------------*/

/* al and what it holds but its handle and queue: after a failed init (the
 * jobs reload may have tracked some), or once the poll timer is closed. */
static void alloc_free(dt_alloc_t *al)
{
    while (al->tracks) {
        track_t *t = al->tracks;
        al->tracks = t->next;
        free(t);
    }
    for (size_t i = 0; al->env && al->env[i]; i++)
        free(al->env[i]);
    free(al->env);
    free(al->coord_addr);
    free(al->agent);
    free(al->output_dir);
    free(al);
}

static int reload_cb(const dt_job_t *j, void *arg)
{
    dt_alloc_t *al = arg;
    dt_slurm_job_t s = { 0 };
    dt_emsg_t em = { "" };

    if (j->slurm_id != 0 && dt_db_slurm_get(al->c->db, j->id, &s, &em) == 0) {
        int final = strcmp(s.state, "PENDING") != 0 && strcmp(s.state, "RUNNING") != 0 &&
                    strcmp(s.state, "SUBMITTED") != 0 && strcmp(s.state, "SUSPENDED") != 0;
        if (!dt_job_state_terminal(j->state) || !final) {
            track_t *t = track_get(al, j->id);
            t->slurm_id = (uint32_t)j->slurm_id;
            t->run_restart = s.restarts;
            if (dt_job_state_terminal(j->state))
                t->ended_ms = dt_clock_mono_ms();
        }
    } else if (j->slurm_id == 0 && j->state == DT_JOB_QUEUED) {
        /* queued before a restart with no Slurm job recorded: dtcoordd may
         * have stopped after slurmctld took it, so look for it first */
        track_get(al, j->id)->lookup = 1;
    }
    dt_slurm_job_clear(&s);
    return 0;
}

/* HOST:PORT for the agents: slurm_coord_address, else listen with a
 * wildcard host replaced by this host's name. */
static char *coord_address(const dt_coord_conf_t *cf)
{
    if (cf->slurm_coord_address && *cf->slurm_coord_address)
        return dt_xstrdup(cf->slurm_coord_address);
    if (cf->listen == NULL || *cf->listen == '\0')
        return NULL;
    const char *colon = strrchr(cf->listen, ':');
    if (colon == NULL)
        return NULL;
    char host[256] = "";
    size_t hl = (size_t)(colon - cf->listen);
    if (hl == 0 || (hl == 7 && strncmp(cf->listen, "0.0.0.0", 7) == 0) ||
        (hl == 4 && strncmp(cf->listen, "[::]", 4) == 0) ||
        (hl == 1 && cf->listen[0] == '*')) {
        if (gethostname(host, sizeof(host) - 1) < 0)
            return NULL;
        return dt_xasprintf("%s%s", host, colon);
    }
    return dt_xstrdup(cf->listen);
}

int dt_alloc_init(dt_coord_t *c, dt_emsg_t *em)
{
    dt_coord_conf_t *cf = &c->conf;
    dt_alloc_t *al;
    int rc;

    if (!cf->slurm)
        return 0;
    al = dt_xcalloc(1, sizeof(*al));
    al->c = c;
    al->coord_addr = coord_address(cf);
    if (al->coord_addr == NULL) {
        free(al);
        return dt_emsg_set(em, DT_ECONF, "%s: slurm = yes needs an address the agents can "
                           "reach: set listen (and slurm_coord_address if the listen host is "
                           "not it)", c->conf_path);
    }
    al->agent = dt_xstrdup(cf->slurm_agent ? cf->slurm_agent : DT_SBINDIR "/dtagentd");
    if (cf->slurm_signal && dt_batch_signal_number(cf->slurm_signal) == 0) {
        rc = dt_emsg_set(em, DT_ECONF, "%s: slurm_signal: '%s' is not USR1 or USR2 (srun "
                         "forwards no other signal to the agents unchanged)", c->conf_path,
                         cf->slurm_signal);
        goto fail;
    }
    const char *crash = getenv("DT_TEST_CRASH_AFTER_SUBMIT");
    al->crash_after_submit = crash != NULL && *crash != '\0';
    if (al->crash_after_submit)
        dt_log_warn("DT_TEST_CRASH_AFTER_SUBMIT is set: dtcoordd dies after its first "
                    "submission to Slurm (a test's fault, never for use)");
    /* unset: each job's output goes to its own directory (jobdir.h) */
    al->output_dir = cf->slurm_output_dir ? dt_xstrdup(cf->slurm_output_dir) : NULL;
    if (al->output_dir && dt_mkdirs(al->output_dir, 0755) < 0) {
        rc = dt_emsg_set(em, DT_ECONF, "%s: slurm_output_dir %s: %s", c->conf_path,
                         al->output_dir, strerror(errno));
        goto fail;
    }
    /* slurm_env: NAME=VALUE words */
    size_t n = 0;
    char *envs = dt_xstrdup(cf->slurm_env ? cf->slurm_env : ""), *save = NULL;
    al->env = dt_xcalloc(1, sizeof(char *));
    for (char *w = strtok_r(envs, " \t", &save); w; w = strtok_r(NULL, " \t", &save)) {
        const char *eq = strchr(w, '=');
        if (eq == NULL || eq == w) {
            rc = dt_emsg_set(em, DT_ECONF, "%s: slurm_env: '%s' is not NAME=VALUE", c->conf_path,
                             w);
            free(envs);
            goto fail;
        }
        al->env = dt_xrealloc(al->env, (n + 2) * sizeof(char *));
        al->env[n++] = dt_xstrdup(w);
        al->env[n] = NULL;
    }
    free(envs);
    if ((rc = dt_slurm_init(cf->slurm_conf, em)) < 0)
        goto fail;
    c->alloc = al;
    if ((rc = dt_db_job_list(c->db, -1, reload_cb, al, em)) < 0) {
        c->alloc = NULL;
        goto fail;
    }
    for (track_t *t = al->tracks; t; t = t->next)
        if (t->slurm_id == 0)
            submit(al, t);
    uv_timer_init(c->loop, &al->poll);
    al->poll.data = al;
    uint64_t every = (uint64_t)(cf->slurm_poll_ms > 0 ? cf->slurm_poll_ms : 5000);
    uv_timer_start(&al->poll, on_poll, every, every);
    dt_log_info("slurm: agents connect to %s, agent %s, output in %s, poll every %llu ms",
                al->coord_addr, al->agent, al->output_dir ? al->output_dir : "each job's directory",
                (unsigned long long)every);
    return 0;
fail:
    alloc_free(al);
    return rc;
}

void dt_alloc_close(dt_coord_t *c)
{
    dt_alloc_t *al = c->alloc;
    if (al == NULL || al->closing)
        return;
    al->closing = 1;
    uv_close((uv_handle_t *)&al->poll, NULL);
    while (al->queue) {
        op_t *o = al->queue;
        al->queue = o->next;
        op_free(o);
    }
}

void dt_alloc_free(dt_coord_t *c)
{
    dt_alloc_t *al = c->alloc;
    if (al == NULL)
        return;
    alloc_free(al);
    c->alloc = NULL;
    dt_slurm_fini();
}
