/* SPDX-License-Identifier: MIT
 *
 * A job's checkpoint commits: the state a job's run keeps of them
 * (run.c holds one dt_commit_t per run and hands the agents' reports
 * here), the commit once every shard agrees with the manifest, pruning,
 * setting a corrupt step aside, and the step to resume from. This module
 * calls nothing of run.c.
 *
 * The file work goes to an agent of the job: rank 0's agent in the
 * current generation when it is connected (agent_of: the generation's
 * rank table, NULL when there is none), else any connected agent of the
 * job (they all run as the job's owner and see its files).
 *
 * All functions run on the loop thread.
 */
#ifndef DT_COORD_COMMIT_H
#define DT_COORD_COMMIT_H

#include <stdint.h>

#include "common/wire.h"
#include "coordinator/coord.h"

typedef struct dt_commit {
    int64_t job;
    char *root;    /* the checkpoints' directory; NULL: none (the run says why) */
    int64_t keep;  /* committed checkpoints kept (spec ckpt_keep) */
    int64_t asked; /* the step a CKPT_COMMIT was last sent for, -1 none */
} dt_commit_t;

/* After a shard or the manifest was reported: when every rank's shard has
 * been read back by its agent and agrees with what the manifest lists,
 * ask an agent to write the commit marker; its CKPT_DONE commits the step
 * in the database (dt_commit_done). */
void dt_commit_shard(dt_coord_t *c, dt_commit_t *ck, const int64_t *agent_of, int64_t step);
/* CKPT_DONE from agent a: the commit marker written (the step is
 * committed, old ones pruned) or not (the step is corrupt, set aside), or
 * old step directories removed. */
void dt_commit_done(dt_coord_t *c, dt_commit_t *ck, const int64_t *agent_of, dt_live_agent_t *a,
                    const dt_wire_ckpt_done_t *d);
/* A step found corrupt: an agent renames its directory step-N.corrupt (kept
 * for inspection, and out of the engine's way: it writes the step again
 * when training passes it, instead of skipping a directory that carries a
 * COMMITTED marker). */
void dt_commit_set_aside(dt_coord_t *c, dt_commit_t *ck, const int64_t *agent_of, int64_t step);
/* The newest committed checkpoint (*dir NULL: start from scratch). The
 * engine verifies it as the job's owner; one that does not verify ends
 * the generation with DT_EXIT_CKPT (recovery.c) and the next one takes
 * the checkpoint before it. */
void dt_commit_resume(dt_coord_t *c, const dt_commit_t *ck, char **dir, int64_t *step);

#endif /* DT_COORD_COMMIT_H */
