/* SPDX-License-Identifier: MIT
 *
 * Jobs as the coordinator keeps them: the domain operations behind dtctl's
 * requests (submit, list, show, cancel, resume, checkpoint, events,
 * checkpoints, history) and the agents' registration, without a
 * connection. Each takes who asks (a uid and gid) and the coordinator, and
 * returns a DT_E* code with a message or its result as plain values or
 * JSON (the shape dtctl shows). Each state change is one database transaction with its
 * event (db/); a handler replies only after it returned.
 *
 * Visibility: a caller sees and changes its own jobs; root and members of
 * admin_group see and change all.
 *
 * Not here: decoding requests and encoding replies (ctl_req.c,
 * agent_req.c), generations (run.c), Slurm (alloc.c).
 */
#ifndef DT_COORD_JOBS_H
#define DT_COORD_JOBS_H

#include <jansson.h>
#include <stdbool.h>
#include <stdint.h>
#include <sys/types.h>

#include "common/err.h"
#include "common/wire.h"
#include "coordinator/coord.h"
#include "coordinator/slurm.h"
#include "db/db.h"

/* Who asks. */
typedef struct dt_caller {
    uid_t uid;
    gid_t gid;
} dt_caller_t;

/* What a submission produced. */
typedef struct dt_submitted {
    int64_t id;          /* 0 for a dry run */
    json_t *plan;        /* the plan as dtctl shows it (owned) */
    bool refused;        /* the spec does not plan (or its batch job would be refused) */
    dt_slurm_desc_t desc; /* a dry run's batch job (cleared by dt_submitted_clear) */
} dt_submitted_t;

void dt_submitted_clear(dt_submitted_t *s);

/* Root or a member of admin_group. */
bool dt_jobs_is_admin(const dt_coord_t *c, const dt_caller_t *who);

/* Parse, plan and store a spec (name, when given, overrides the spec's);
 * the job is queued and, with slurm = yes, its batch job submitted. A
 * dry run stores nothing and describes the batch job instead. On failure
 * a negative code; out->refused when the planner (or the batch job's
 * checks) refused it. */
int dt_jobs_submit(dt_coord_t *c, const dt_caller_t *who, const char *spec_text,
                   const char *name, bool dry_run, dt_submitted_t *out, dt_emsg_t *em);

/* Load job ID if the caller may see it: DT_ENOENT, DT_EPERM. */
int dt_jobs_get(dt_coord_t *c, const dt_caller_t *who, int64_t id, dt_job_t *j,
                dt_emsg_t *em);

/* The caller's jobs (all for an admin) as a JSON array. */
int dt_jobs_list(dt_coord_t *c, const dt_caller_t *who, json_t **out, dt_emsg_t *em);

/* SHOW's reply for a job the caller may see: job, spec, plan, agents,
 * progress, goodput, and run.c's gen and ranks. */
json_t *dt_jobs_show(dt_coord_t *c, const dt_job_t *j);
/* The job's goodput as SHOW gives it (null when it cannot be read: logged):
 * {ettr (null before a step), first_step_ms, wall_s, step_s, productive_s,
 * recomputed_s, ckpt_stall_s, failures, detect_s, restart_s, load_s,
 * failure_costs: [each failure_cost event's object]}. */
json_t *dt_jobs_goodput(dt_coord_t *c, int64_t job);

/* The most of each list HISTORY includes (the newest ones); the step rows
 * are capped where they are stored (DT_DB_STEP_ROWS). */
#define DT_JOBS_HISTORY_MAX 1024

/* HISTORY's reply for a job the caller may see, what `dtctl plot` draws:
 * {job (as SHOW's), steps: [{gen, step, at_ms, step_ms, loss, tokens_s}]
 * (loss and tokens_s null when not reported), failures: [each cost object
 * of dt_db_failure_costs with ended_ms (when the failing generation ended,
 * 0 if it has not) and fault_ms (when the fault happened: the next
 * generation's start less restart_s and detect_s)], generations: [{gen,
 * ranks, started_ms, ended_ms (0 while running), resume_step, reason}],
 * checkpoints: [{step, state, committed_ms}], goodput (dt_jobs_goodput),
 * left_out: {generations, failures, checkpoints}: how many older ones the
 * caps left out}. A list that cannot be read fails the request. */
int dt_jobs_history(dt_coord_t *c, const dt_job_t *j, json_t **out, dt_emsg_t *em);

/* Cancel a job now, or (checkpoint) stop it after a checkpoint: then
 * *stopping is set and the job is cancelled when its workers exited.
 * DT_ESTATE for a job already ended or with nothing running to stop. */
int dt_jobs_cancel(dt_coord_t *c, const dt_caller_t *who, const dt_job_t *j, const char *why,
                   bool checkpoint, bool *stopping, dt_emsg_t *em);

/* A failed or cancelled job back to queued, from its newest committed
 * checkpoint (*step, 0: from the start), with a fresh restart budget (and
 * a new Slurm job). DT_ESTATE for a job in another state. */
int dt_jobs_resume(dt_coord_t *c, const dt_caller_t *who, const dt_job_t *j, int64_t *step,
                   dt_emsg_t *em);

/* Ask the running generation for a checkpoint: its number in *gen;
 * DT_ESTATE when none is running. */
int dt_jobs_checkpoint(dt_coord_t *c, int64_t job, int *gen, dt_emsg_t *em);

/* The job's events after id SINCE, and its checkpoints, as JSON arrays. */
int dt_jobs_events(dt_coord_t *c, int64_t job, int64_t since, json_t **out, dt_emsg_t *em);
int dt_jobs_checkpoints(dt_coord_t *c, int64_t job, json_t **out, dt_emsg_t *em);

/* An agent registers for job reg->job: the caller must own the job (an
 * admin's agent is refused: it would write the user's files with the
 * admin's rights), the job must not have ended, a Slurm job's agent must
 * belong to its current run, and a cuda job's agent must have a GPU per
 * slot (DT_ENOSPC otherwise, with an agent_refused event). Returns its
 * live entry (new or found again), with node, slots, gpus and pid set. */
int dt_jobs_agent_register(dt_coord_t *c, const dt_caller_t *who, const dt_wire_register_t *reg,
                           dt_live_agent_t **out, dt_emsg_t *em);

/* An agent reported a worker's exit: recorded as a worker_exit event
 * before run.c hears of it (so the history has the report even when the
 * decision fails). */
int dt_jobs_worker_exit(dt_coord_t *c, const dt_live_agent_t *a, int64_t gen, int64_t rank,
                        int64_t status, int64_t sig, dt_emsg_t *em);
/* A rank's checkpoint shard as its agent read it back, and the step's
 * manifest (the sha256 of each rank's shard, a JSON array of strings). */
int dt_jobs_shard(dt_coord_t *c, int64_t job, int64_t step, int rank, const char *path,
                  int64_t bytes, const char *sha256, dt_emsg_t *em);
int dt_jobs_manifest(dt_coord_t *c, int64_t job, int64_t step, const dt_wire_strs_t *shas,
                     dt_emsg_t *em);

/* At start-up: agents registered before a restart are expected back. */
int dt_jobs_reload_agents(dt_coord_t *c, dt_emsg_t *em);

#endif /* DT_COORD_JOBS_H */
