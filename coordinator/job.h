/* SPDX-License-Identifier: MIT
 *
 * Jobs and agents as the coordinator sees them: the handlers of dtctl's and
 * dtagentd's requests. Each state change is one database transaction with
 * its event (db/); the reply is sent only after it committed. Visibility:
 * a peer sees and changes its own jobs; root and admin_group members see
 * and change all.
 */
#ifndef DT_COORD_JOB_H
#define DT_COORD_JOB_H

#include "common/msg.h"
#include "coordinator/conn.h"

void dt_job_submit(dt_conn_t *k, const dt_msg_t *m);
void dt_job_list(dt_conn_t *k, const dt_msg_t *m);
void dt_job_show(dt_conn_t *k, const dt_msg_t *m);
void dt_job_cancel(dt_conn_t *k, const dt_msg_t *m);
void dt_job_events(dt_conn_t *k, const dt_msg_t *m);
void dt_job_checkpoints(dt_conn_t *k, const dt_msg_t *m);
void dt_job_checkpoint(dt_conn_t *k, const dt_msg_t *m);
/* A failed or cancelled job back to queued, from its newest committed
 * checkpoint, with a fresh restart budget (and a new Slurm job). */
void dt_job_resume(dt_conn_t *k, const dt_msg_t *m);

void dt_agent_register(dt_conn_t *k, const dt_msg_t *m);
void dt_agent_heartbeat(dt_conn_t *k, const dt_msg_t *m);
void dt_agent_progress(dt_conn_t *k, const dt_msg_t *m);
void dt_agent_worker_exit(dt_conn_t *k, const dt_msg_t *m);
void dt_agent_shard_written(dt_conn_t *k, const dt_msg_t *m);
void dt_agent_fence(dt_conn_t *k, const dt_msg_t *m);
void dt_agent_gen_ended(dt_conn_t *k, const dt_msg_t *m);
void dt_agent_preempt(dt_conn_t *k, const dt_msg_t *m);
void dt_agent_ckpt_done(dt_conn_t *k, const dt_msg_t *m);

/* At start-up: agents registered before a restart are expected back. */
int dt_agent_reload(dt_coord_t *c, dt_emsg_t *em);

/* Periodic: agents silent past agent_timeout are marked lost. */
void dt_agent_sweep(dt_coord_t *c);

#endif /* DT_COORD_JOB_H */
