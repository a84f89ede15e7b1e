/* SPDX-License-Identifier: MIT
 *
 * Running jobs on agents: the coordinator's side of generations. Placement
 * of ranks on registered agents (the rest are spares), GEN_START to each,
 * progress, the workers' exits; the agents' fence and checkpoint reports,
 * matched to the job's run here (a fence's generation checked) and
 * carried out by fence.h (the relay of cross-agent PMIx fences) and
 * commit.h (checkpoint commits). A fault (a worker that fails or hangs,
 * an agent lost or restarted, a generation that no longer fits the live
 * agents, the end of a planned stop) is reported through the
 * coordinator's fault hook; the recovery policy (recovery.h) decides and
 * acts through the primitives at the end of this header. run.c never
 * calls alloc.c: a job that ends is reported through the job_ended hook.
 *
 * The durable part (generations, ranks, checkpoints, results) is in
 * SQLite; the in-memory part (progress, fences in flight) is rebuilt after
 * a coordinator restart from what the agents send when they register
 * again.
 *
 * All functions run on the loop thread.
 */
#ifndef DT_COORD_RUN_H
#define DT_COORD_RUN_H

#include <jansson.h>
#include <stdbool.h>
#include <stdint.h>

#include "common/msg.h"
#include "common/wire.h"
#include "coordinator/conn.h"
#include "coordinator/coord.h"
#include "coordinator/recovery.h"

/* Handlers for agents' reports, decoded (common/wire.h), after
 * agent_req.c has checked the sender. */
void dt_run_registered(dt_coord_t *c, dt_live_agent_t *a, const dt_wire_register_t *reg);
void dt_run_progress(dt_coord_t *c, dt_live_agent_t *a, const dt_wire_progress_t *p);
void dt_run_worker_exit(dt_coord_t *c, dt_live_agent_t *a, const dt_wire_worker_exit_t *x);
void dt_run_shard(dt_coord_t *c, dt_live_agent_t *a, const dt_wire_shard_written_t *s);
/* MEM_CKPT: agent a holds its rank's in-memory checkpoint of a step. */
void dt_run_mem_ckpt(dt_coord_t *c, dt_live_agent_t *a, const dt_wire_mem_ckpt_t *m);
/* The job's in-memory checkpoints as the agents reported them: *step the
 * newest step every rank can resume from in memory (0 none), *coverage the
 * share of ranks whose own agent holds the newest step any rank has (0
 * none), *replicas (may be NULL) the share whose newest copy also has a
 * replica on another agent. */
void dt_run_mem_state(dt_coord_t *c, int64_t job, int64_t *step, double *coverage,
                      double *replicas);
/* recovery: the in-memory checkpoints did not verify: the next generation
 * resumes from disk. */
void dt_run_mem_forget(dt_coord_t *c, int64_t job);
/* CKPT_DONE: the agent wrote a commit marker (the step is committed, old
 * ones pruned) or could not (the step is corrupt), or removed old step
 * directories. */
void dt_run_ckpt_done(dt_coord_t *c, dt_live_agent_t *a, const dt_wire_ckpt_done_t *d);
/* FENCE, request `id` on k: replied to here. */
void dt_run_fence(dt_conn_t *k, dt_live_agent_t *a, uint32_t id, const dt_wire_fence_t *f);
void dt_run_gen_ended(dt_coord_t *c, dt_live_agent_t *a, const dt_wire_agent_ref_t *e);
void dt_run_agent_lost(dt_coord_t *c, int64_t job, int64_t agent, int64_t heard_ms);

/* dtctl: CHECKPOINT; 0 and the generation, or a DT_E* code with a message
 * (DT_ENOTSUP for an attn job, which has no checkpoints). */
int dt_run_checkpoint(dt_coord_t *c, int64_t job, int *gen, dt_emsg_t *em);
/* A planned stop: the workers checkpoint at the next step boundary and
 * exit; then (a DT_FAULT_STOPPED decides) the job is cancelled with `why`
 * and the step, or requeued when `requeue`. DT_ESTATE when no generation
 * is running; DT_ENOTSUP for a user's stop (not `requeue`) of an attn job,
 * which has no checkpoint to stop at. */
int dt_run_stop(dt_coord_t *c, int64_t job, const char *why, bool requeue, dt_emsg_t *em);
/* The job was cancelled: stop its workers and release its agents. */
void dt_run_cancelled(dt_coord_t *c, int64_t job);
/* The job's Slurm job was requeued (the job is queued again): the old
 * run's agents are told to exit and forgotten, the next run's agents
 * start the next generation from the newest committed checkpoint. */
void dt_run_requeued(dt_coord_t *c, int64_t job);
/* dtctl resume moved the job back to queued: forget its finished run. */
void dt_run_resumed(dt_coord_t *c, int64_t job);
/* SHOW: adds "gen", "ranks" and per-agent "pid"/"spare" to the reply. */
void dt_run_show(dt_coord_t *c, int64_t job, json_t *reply);

/* Periodic (with the agent sweep): generations stuck aborting. */
void dt_run_tick(dt_coord_t *c);
/* At start-up: jobs that were running get their generation back. */
int dt_run_reload(dt_coord_t *c, dt_emsg_t *em);
void dt_run_free_all(dt_coord_t *c);

/* The recovery policy's view of the job's generation (phase DT_GEN_NONE
 * when the job has no run in memory); the pointers stay the run's. */
void dt_run_view(dt_coord_t *c, int64_t job, dt_job_view_t *v);
/* Tell every agent of the generation to abort it (RANK the failed one, -1
 * none); the next generation starts when all have reported its end. */
void dt_run_abort(dt_coord_t *c, int64_t job, const char *why, int rank);
/* An aborting generation whose agents have all reported its end: record
 * that and start the next one. */
void dt_run_next(dt_coord_t *c, int64_t job);
/* Start the next generation on fewer ranks (a re-plan). */
void dt_run_replan(dt_coord_t *c, int64_t job, int ranks);
/* The job ends: its agents are told, the state recorded, the job_ended
 * hook called. */
void dt_run_end(dt_coord_t *c, int64_t job, enum dt_job_state to, const char *why);
/* An agent renames a corrupt step's directory step-N.corrupt. */
void dt_run_set_aside(dt_coord_t *c, int64_t job, int64_t step);
/* The agent's node is suspect (its GPU failed): no later generation of
 * the job places ranks on it, and a requeue excludes it. */
void dt_run_suspect(dt_coord_t *c, int64_t job, int64_t agent);

#endif /* DT_COORD_RUN_H */
