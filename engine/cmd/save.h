/* SPDX-License-Identifier: MIT
 *
 * One checkpoint step written by every rank of a command (train, prefill):
 * the io/ckpt.h sequence with the agreements between its phases, and,
 * under dtagentd, the reports that let the coordinator commit it.
 *
 * With external commits (--ckpt-commit external, under the coordinator)
 * rank 0 first settles what an earlier generation left at the step
 * (dt_ckpt_supersede: a committed step is kept and not written again, an
 * uncommitted one is removed), nothing is pruned, and after the rename
 * every rank reports its shard (W_SHARD) and rank 0 the manifest. With
 * self commits the step must be new and rank 0 prunes to `keep`.
 */
#ifndef DT_ENGINE_CMD_SAVE_H
#define DT_ENGINE_CMD_SAVE_H

#include <jansson.h>
#include <stdint.h>

#include "common/err.h"
#include "engine/comm/comm.h"
#include "io/safetensors.h"

typedef struct dt_cmd_save {
    const char *cmd;  /* "dtengine train": the start of messages */
    const char *root; /* the checkpoint directory */
    int64_t step;
    int external; /* the coordinator commits and prunes */
    int keep;     /* self commits: checkpoints kept */
    /* rank 0: the manifest's free objects (borrowed) and data cursor */
    json_t *model, *plan, *rng;
    int64_t data_cursor;
} dt_cmd_save_t;

/* Write step sv->step: w is this rank's shard (its tensors and metadata;
 * the caller frees it). *skipped = 1 when an earlier generation's
 * committed copy stands (external only). Every rank calls it; the outcome
 * is agreed (0 on every rank, or an error on every rank, the message on
 * the rank that failed or naming it). */
int dt_cmd_save(dt_comm_t *comm, const dt_cmd_save_t *sv, dt_st_writer_t *w, int *skipped,
                dt_emsg_t *em);

#endif /* DT_ENGINE_CMD_SAVE_H */
