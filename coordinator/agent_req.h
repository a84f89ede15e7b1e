/* SPDX-License-Identifier: MIT
 *
 * dtagentd's requests: REGISTER, HEARTBEAT, PROGRESS, WORKER_EXIT,
 * SHARD_WRITTEN, CKPT_DONE, FENCE, GEN_ENDED, PREEMPT. Each handler checks
 * that the message comes from the agent registered on this connection and
 * that its fields are well formed, replies, and hands the report to the
 * domain: registration (jobs.h), generations (run.h), the recovery policy
 * (recovery.h, Slurm's warning signal).
 */
#ifndef DT_COORD_AGENT_REQ_H
#define DT_COORD_AGENT_REQ_H

#include "common/msg.h"
#include "coordinator/conn.h"

void dt_agent_register(dt_conn_t *k, const dt_msg_t *m);
void dt_agent_heartbeat(dt_conn_t *k, const dt_msg_t *m);
void dt_agent_progress(dt_conn_t *k, const dt_msg_t *m);
void dt_agent_mem_ckpt(dt_conn_t *k, const dt_msg_t *m);
void dt_agent_worker_exit(dt_conn_t *k, const dt_msg_t *m);
void dt_agent_shard_written(dt_conn_t *k, const dt_msg_t *m);
void dt_agent_fence(dt_conn_t *k, const dt_msg_t *m);
void dt_agent_gen_ended(dt_conn_t *k, const dt_msg_t *m);
void dt_agent_preempt(dt_conn_t *k, const dt_msg_t *m);
void dt_agent_ckpt_done(dt_conn_t *k, const dt_msg_t *m);

#endif /* DT_COORD_AGENT_REQ_H */
