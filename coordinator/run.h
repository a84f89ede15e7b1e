/* SPDX-License-Identifier: MIT
 *
 * Running jobs on agents: the coordinator's side of generations. Placement
 * of ranks on registered agents (the rest are spares), GEN_START to each,
 * the relay of cross-agent PMIx fences, progress, checkpoint commits, and
 * the recovery policy:
 *   - a worker that fails or hangs: abort the generation on every agent,
 *     start the next one from the newest committed checkpoint that verifies,
 *     on the same agents;
 *   - an agent lost: the same, with its ranks on a spare agent if there is
 *     one, else re-planned on fewer ranks when the planner allows, else the
 *     job fails;
 *   - a failure at the same step as the previous one is deterministic: the
 *     job fails instead of looping; so does a job out of restarts
 *     (max_restarts in the spec).
 * Every decision is an event. The durable part (generations, ranks,
 * checkpoints, results) is in SQLite; the in-memory part (progress, fences
 * in flight) is rebuilt after a coordinator restart from what the agents
 * send when they register again.
 *
 * All functions run on the loop thread.
 */
#ifndef DT_COORD_RUN_H
#define DT_COORD_RUN_H

#include <jansson.h>
#include <stdint.h>

#include "common/msg.h"
#include "coordinator/conn.h"
#include "coordinator/coord.h"

/* Handlers for agents' messages (after own_agent has checked the sender). */
void dt_run_registered(dt_coord_t *c, dt_live_agent_t *a, const dt_msg_t *m);
void dt_run_progress(dt_coord_t *c, dt_live_agent_t *a, const dt_msg_t *m);
void dt_run_worker_exit(dt_coord_t *c, dt_live_agent_t *a, const dt_msg_t *m);
void dt_run_shard(dt_coord_t *c, dt_live_agent_t *a, const dt_msg_t *m);
/* CKPT_DONE {op, step, ok, error?}: the agent wrote a commit marker (the
 * step is committed, old ones pruned) or could not (the step is corrupt),
 * or removed old step directories. */
void dt_run_ckpt_done(dt_coord_t *c, dt_live_agent_t *a, const dt_msg_t *m);
void dt_run_fence(dt_conn_t *k, dt_live_agent_t *a, const dt_msg_t *m);
void dt_run_gen_ended(dt_coord_t *c, dt_live_agent_t *a, const dt_msg_t *m);
void dt_run_agent_lost(dt_coord_t *c, int64_t job, int64_t agent);

/* dtctl: CHECKPOINT; 0 and the generation, or a DT_E* code with a message. */
int dt_run_checkpoint(dt_coord_t *c, int64_t job, int *gen, dt_emsg_t *em);
/* A planned stop: the workers checkpoint at the next step boundary and
 * exit; then the job is cancelled with `why` and the step. DT_ESTATE when
 * no generation is running. */
int dt_run_stop(dt_coord_t *c, int64_t job, const char *why, dt_emsg_t *em);
/* The job was cancelled: stop its workers and release its agents. */
void dt_run_cancelled(dt_coord_t *c, int64_t job);
/* alloc.c requeued the job's Slurm job (the job is queued again): the
 * old run's agents are told to exit and forgotten, the next run's agents
 * start the next generation from the newest committed checkpoint. */
void dt_run_requeued(dt_coord_t *c, int64_t job);
/* PREEMPT from an agent (Slurm's warning signal): a running generation
 * checkpoints and stops, then the job is requeued; one that is not running
 * is requeued now. Ignored, with an event, for a job not run by Slurm. */
void dt_run_preempt(dt_coord_t *c, dt_live_agent_t *a, const dt_msg_t *m);
/* dtctl resume moved the job back to queued: forget its finished run. */
void dt_run_resumed(dt_coord_t *c, int64_t job);
/* SHOW: adds "gen", "ranks" and per-agent "pid"/"spare" to the reply. */
void dt_run_show(dt_coord_t *c, int64_t job, json_t *reply);

/* Periodic (with the agent sweep): generations stuck aborting. */
void dt_run_tick(dt_coord_t *c);
/* At start-up: jobs that were running get their generation back. */
int dt_run_reload(dt_coord_t *c, dt_emsg_t *em);
void dt_run_free_all(dt_coord_t *c);

#endif /* DT_COORD_RUN_H */
