/* SPDX-License-Identifier: MIT
 *
 * The job's checkpoint files, as the job's owner (files.c): CKPT_COMMIT
 * and CKPT_PRUNE from the coordinator, carried out on the thread pool and
 * answered with CKPT_DONE through the hooks (hooks.h).
 *
 * Not here: reading shards back after a worker wrote them (task.c), the
 * checkpoint format (io/ckpt.c).
 */
#ifndef DT_AGENT_FILES_H
#define DT_AGENT_FILES_H

#include <uv.h>

#include "agent/hooks.h"
#include "common/wire.h"

/* Carry out a CKPT_COMMIT or CKPT_PRUNE, decoded (common/wire.h); one
 * with a relative dir or a set_aside tag that is not a lowercase word is
 * logged and ignored. hooks is borrowed until the answer is sent: it must
 * live as long as the loop. */
void dt_files_commit(uv_loop_t *loop, const dt_agentd_hooks_t *hooks,
                     const dt_wire_ckpt_commit_t *cm);
void dt_files_prune(uv_loop_t *loop, const dt_agentd_hooks_t *hooks,
                    const dt_wire_ckpt_prune_t *pr);

#endif /* DT_AGENT_FILES_H */
