/* SPDX-License-Identifier: MIT
 *
 * Jobs run through Slurm (dt.conf: slurm = yes): dtcoordd's side of the
 * batch job of each dt job. It submits the batch script batch.c writes
 * (a queued job without a recorded Slurm job after a restart, or after a
 * submission slurmctld may have taken unseen, is first looked up by its
 * Slurm job name and adopted if found), follows the Slurm jobs (every
 * slurm_poll, one slurm_load_jobs for all of them, recorded in SQLite
 * with an event on each change), and carries out the recovery that
 * changes the node set:
 *   - requeue with nodes excluded (run.c asks when an agent is lost and no
 *     spare is left), resuming from the newest committed checkpoint when
 *     the new agents register; when the nodes left that the job could use
 *     are fewer than it needs, the job fails at once instead (the requeue
 *     would pend for ever);
 *   - requeue after a checkpoint when Slurm's warning signal (time limit or
 *     preemption) reaches the agents, at no cost to the restart budget;
 *   - a Slurm job that ended under a running dt job: TIMEOUT, NODE_FAIL,
 *     PREEMPTED and BOOT_FAIL are requeued, CANCELLED (scancel outside dt)
 *     cancels the dt job, any other end fails it (the batch script or its
 *     agents could not run: requeueing would loop);
 *   - a requeue Slurm did itself (its own node-failure requeue, or an
 *     admin's scontrol requeue) is noticed from the restart count.
 * dtctl cancel cancels the Slurm job; a completed or failed dt job's batch
 * job ends by itself (the agents exit), and is cancelled when it has not
 * a minute later.
 *
 * libslurm blocks, so every call runs on libuv's thread pool, one at a
 * time in submission order; results come back on the loop thread. All
 * functions here run on the loop thread.
 */
#ifndef DT_COORD_ALLOC_H
#define DT_COORD_ALLOC_H

#include <stdbool.h>
#include <stdint.h>

#include "coordinator/coord.h"
#include "plan/planner.h"
#include "coordinator/slurm.h"
#include "spec/spec.h"

/* With slurm = yes: check the configuration, slurm_init, start following
 * the jobs the database has, and submit queued jobs that have no Slurm job
 * yet. DT_ECONF naming the key when the configuration cannot work (no
 * address for the agents, no slurm.conf). A no-op with slurm = no. */
int dt_alloc_init(dt_coord_t *c, dt_emsg_t *em);
/* Stop the timer; the call in flight finishes, queued ones are dropped. */
void dt_alloc_close(dt_coord_t *c);
void dt_alloc_free(dt_coord_t *c);

/* The batch job for a job (id 0 for a dry run): DT_ENOTSUP when slurm =
 * no. */
int dt_alloc_describe(dt_coord_t *c, int64_t job, const dt_spec_t *s, const dt_plan_req_t *req,
                      const dt_plan_t *plan, uint32_t owner, dt_slurm_desc_t *d, dt_emsg_t *em);
/* At submission, before the job is stored: would its batch job be
 * refused (dt_alloc_describe's checks: the warning signal, the NCCL one
 * of the job's environment, settings that cannot be quoted)? 0 when
 * slurm = no. */
int dt_alloc_check(dt_coord_t *c, const dt_spec_t *s, const dt_plan_req_t *req,
                   const dt_plan_t *plan, uint32_t owner, dt_emsg_t *em);
/* A job just queued (submitted or resumed): submit its batch job. */
void dt_alloc_submit(dt_coord_t *c, int64_t job);
/* Is the job's allocation Slurm's (it has a Slurm job, or will have)? */
bool dt_alloc_is_slurm(const dt_coord_t *c, int64_t job);
/* The node set must change: requeue the job's Slurm job with `exclude`
 * (a host list, or NULL) added to what it may not use. The dt job moves
 * to queued now (restarts + 1 when `failure`); run.c is told through
 * dt_run_requeued. DT_ESTATE when the job has no Slurm job. */
int dt_alloc_requeue(dt_coord_t *c, int64_t job, const char *exclude, bool failure,
                     const char *why, dt_emsg_t *em);
/* The dt job reached a final state: cancel its Slurm job now (cancelled)
 * or if it is still running a minute later (completed, failed). */
void dt_alloc_job_ended(dt_coord_t *c, int64_t job, int cancelled);
/* An agent registering for a Slurm job: refuse (DT_ESTATE, message) one
 * from another Slurm job or an older run of it; an agent of a newer run
 * (Slurm requeued the job itself) requeues the dt job first. */
int dt_alloc_agent(dt_coord_t *c, int64_t job, int64_t slurm_id, int64_t restart, dt_emsg_t *em);

#endif /* DT_COORD_ALLOC_H */
