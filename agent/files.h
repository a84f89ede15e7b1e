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
#include "common/msg.h"

/* Carry out a CKPT_COMMIT or CKPT_PRUNE; a message with bad fields is
 * logged and ignored. hooks is borrowed until the answer is sent: it must
 * live as long as the loop. */
void dt_files_ckpt(uv_loop_t *loop, const dt_agentd_hooks_t *hooks, const dt_msg_t *m);

#endif /* DT_AGENT_FILES_H */
