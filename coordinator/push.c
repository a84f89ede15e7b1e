/* SPDX-License-Identifier: MIT
 *
 * What the coordinator sends an agent unasked (push.h): a frame on the
 * live agent's connection, dropped with its body when the agent is not
 * connected, and the messages sent from more than one place (GEN_ABORT,
 * JOB_END, CKPT_PRUNE) encoded once.
 *
 * Not here: replies to an agent's requests (conn.c, the handlers), when
 * and what to send (run.c, commit.c, fence.c).
 */
#include "config.h"

#include <jansson.h>

#include "common/proto.h"
#include "common/wire.h"
#include "coordinator/conn.h"
#include "coordinator/push.h"

void dt_push_msg(dt_live_agent_t *a, uint16_t type, json_t *body)
{
    if (a && a->conn)
        dt_conn_reply(a->conn, type, 0, body);
    else
        json_decref(body);
}

void dt_push_abort(dt_live_agent_t *a, int gen, const char *why, int rank)
{
    dt_wire_gen_abort_t b = { .gen = gen, .reason = why, .rank = rank };
    dt_push_msg(a, DT_MSG_GEN_ABORT, dt_wire_gen_abort_encode(&b));
}

void dt_push_job_end(dt_live_agent_t *a, int64_t job, const char *state)
{
    dt_wire_job_end_t b = { .job = job, .state = state };
    dt_push_msg(a, DT_MSG_JOB_END, dt_wire_job_end_encode(&b));
}

void dt_push_prune(dt_live_agent_t *a, const char *root, int64_t *steps, size_t n,
                       const char *tag)
{
    dt_wire_ckpt_prune_t b = { .dir = root, .steps = { steps, n }, .set_aside = tag };
    dt_push_msg(a, DT_MSG_CKPT_PRUNE, dt_wire_ckpt_prune_encode(&b));
}
