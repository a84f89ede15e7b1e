/* SPDX-License-Identifier: MIT
 *
 * dtctl's requests: SUBMIT, LIST, SHOW, CANCEL, RESUME, CHECKPOINT,
 * EVENTS, CHECKPOINTS, HISTORY. Each handler decodes the request, calls the domain
 * operation (jobs.h) as the peer, and encodes the one reply; the reply is
 * sent only after the operation's transaction committed.
 */
#ifndef DT_COORD_CTL_REQ_H
#define DT_COORD_CTL_REQ_H

#include "common/msg.h"
#include "coordinator/conn.h"

void dt_ctl_submit(dt_conn_t *k, const dt_msg_t *m);
void dt_ctl_list(dt_conn_t *k, const dt_msg_t *m);
void dt_ctl_show(dt_conn_t *k, const dt_msg_t *m);
void dt_ctl_cancel(dt_conn_t *k, const dt_msg_t *m);
void dt_ctl_events(dt_conn_t *k, const dt_msg_t *m);
void dt_ctl_checkpoints(dt_conn_t *k, const dt_msg_t *m);
void dt_ctl_checkpoint(dt_conn_t *k, const dt_msg_t *m);
void dt_ctl_resume(dt_conn_t *k, const dt_msg_t *m);
void dt_ctl_history(dt_conn_t *k, const dt_msg_t *m);

#endif /* DT_COORD_CTL_REQ_H */
