/* SPDX-License-Identifier: MIT
 *
 * Messages the coordinator sends an agent unasked: one send that drops
 * the message when the agent is not connected, and the messages sent from
 * more than one place. Below run.c, commit.c and fence.c, which call it;
 * it calls only conn.c.
 *
 * All functions run on the loop thread.
 */
#ifndef DT_COORD_PUSH_H
#define DT_COORD_PUSH_H

#include <jansson.h>
#include <stddef.h>
#include <stdint.h>

#include "coordinator/coord.h"

/* Send type with body (consumed) to a, or drop both when a is NULL or not
 * connected. */
void dt_push_msg(dt_live_agent_t *a, uint16_t type, json_t *body);
/* GEN_ABORT of generation gen (rank: the failed one, -1 none). */
void dt_push_abort(dt_live_agent_t *a, int gen, const char *why, int rank);
void dt_push_job_end(dt_live_agent_t *a, int64_t job, const char *state);
/* CKPT_PRUNE of the n steps under root: deleted, or renamed step-N.TAG
 * when tag is not NULL. */
void dt_push_prune(dt_live_agent_t *a, const char *root, int64_t *steps, size_t n,
                   const char *tag);

#endif /* DT_COORD_PUSH_H */
