/* SPDX-License-Identifier: MIT
 *
 * dtagentd's workers (task.c): one generation at a time, the ranks the
 * coordinator placed here, each a dtengine process with a worker channel,
 * in the generation's PMIx namespace (the PMIx server, pmix.c, is this
 * module's). Failures are handled locally and at once (report, notify
 * local peers, kill after the grace period); what happens next is the
 * coordinator's decision.
 *
 * Reaches the coordinator and the agent's lifecycle only through the hooks
 * it was given (hooks.h). Loop thread only.
 */
#ifndef DT_AGENT_TASK_H
#define DT_AGENT_TASK_H

#include <jansson.h>
#include <stdint.h>
#include <uv.h>

#include "agent/gpus.h"
#include "agent/hooks.h"
#include "common/err.h"
#include "common/macros.h"
#include "common/msg.h"
#include "common/wire.h"

typedef struct dt_task dt_task_t;

/* Strings borrowed for the module's life. */
typedef struct dt_task_conf {
    const char *node;       /* this agent's node name */
    const char *state_dir;  /* generations' directories, the PMIx server's files */
    const char *engine;     /* the dtengine program */
    int64_t job;
    int64_t hang_ms;        /* a worker silent this long after its first frame is hung */
    int64_t start_ms;       /* ... and before it (MPI_Init) */
    int64_t grace_ms;       /* between SIGTERM (or a failure) and SIGKILL */
    const dt_gpus_t *gpus;  /* the node's GPUs: a cuda generation's workers take one each */
    const char *peer_listen;  /* the peer channel's address (replicas: agent/peer.h); NULL none */
    const char *munge_socket; /* for the peer channel's credentials; NULL munge's default */
} dt_task_conf_t;

/* Start the PMIx server and the module's timers. 0, or a DT_E* code with
 * the PMIx server's message in em (then *out is NULL). conf and hooks are
 * copied. */
DT_MUST_CHECK int dt_task_new(uv_loop_t *loop, const dt_task_conf_t *conf,
                              const dt_agentd_hooks_t *hooks, dt_task_t **out, dt_emsg_t *em);

/* Pushed messages from the coordinator, decoded (common/wire.h). */
void dt_task_gen_start(dt_task_t *t, const dt_wire_gen_start_t *gs);
void dt_task_gen_abort(dt_task_t *t, const dt_wire_gen_abort_t *ga);
void dt_task_fence_done(dt_task_t *t, const dt_wire_fence_done_t *fd);
/* CKPT_REQUEST, and STOP (stop true): to every worker of generation gen. */
void dt_task_ckpt_request(dt_task_t *t, int64_t gen);
void dt_task_stop(dt_task_t *t, const dt_wire_stop_t *st);

/* The running generation's state for REGISTER: reg->gen and reg->ranks
 * (allocated: the caller frees ranks.v), gen 0 and no ranks when none
 * runs here; reg->peer the peer channel's address (borrowed), NULL none. */
void dt_task_status(const dt_task_t *t, dt_wire_register_t *reg);
/* For an agent stop: SIGTERM every worker now, SIGKILL after the grace
 * period; 1 if any was running (the hooks' workers_gone says when their
 * handles have closed), else 0. */
int dt_task_terminate(dt_task_t *t);
/* 1 while a worker's process or channel handle is not closed yet. */
int dt_task_busy(const dt_task_t *t);
/* Close the timers and the PMIx server; the memory stays until
 * dt_task_free, after the loop has run the close callbacks. */
void dt_task_close(dt_task_t *t);
/* NULL is a no-op. */
void dt_task_free(dt_task_t *t);

#endif /* DT_AGENT_TASK_H */
