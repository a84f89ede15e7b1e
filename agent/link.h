/* SPDX-License-Identifier: MIT
 *
 * dtagentd's link to dtcoordd: connect, register, heartbeat, reconnect
 * with backoff, and the queue of messages that must arrive (link.c).
 * Messages the coordinator pushes are dispatched through the table of
 * handlers the link was given; replies to the link's own requests (OK,
 * ERROR) it handles itself.
 *
 * Not here: what the pushed messages mean (the handlers), the workers.
 */
#ifndef DT_AGENT_LINK_H
#define DT_AGENT_LINK_H

#include <jansson.h>
#include <stddef.h>
#include <stdint.h>
#include <uv.h>

#include "agent/gpus.h"
#include "common/msg.h"
#include "common/wire.h"

typedef struct dt_link dt_link_t;

/* Who the agent is, as REGISTER says it; strings borrowed for the link's life. */
typedef struct dt_link_conf {
    const char *coord;        /* "unix:PATH" or "HOST:PORT" */
    const char *node;
    const char *munge_socket; /* NULL: munge's default (TCP links only) */
    int64_t job;
    int slots;
    int64_t slurm_id, slurm_restart; /* 0 outside Slurm */
    const dt_gpus_t *gpus;           /* the node's GPUs, registered */
} dt_link_conf_t;

/* One row of the dispatch table: a pushed message of `type` goes to fn,
 * with the hooks' ud; the message is borrowed for the call. */
typedef struct dt_link_handler {
    uint16_t type;
    void (*fn)(void *ud, const dt_msg_t *m);
} dt_link_handler_t;

typedef struct dt_link_hooks {
    void *ud;
    const dt_link_handler_t *handlers; /* borrowed for the link's life */
    size_t nhandlers;
    /* The running generation for REGISTER: sets reg->gen and reg->ranks
     * (ranks.v allocated; the link frees it). */
    void (*status)(void *ud, dt_wire_register_t *reg);
    /* The coordinator refused the registration with this DT_E* code. */
    void (*refused)(void *ud, int code);
    /* 1 once the agent is stopping: no more reconnects. */
    int (*stopping)(void *ud);
} dt_link_hooks_t;

/* Start connecting (now, then with backoff for as long as the link
 * lives). conf and hooks are copied. */
dt_link_t *dt_link_new(uv_loop_t *loop, const dt_link_conf_t *conf, const dt_link_hooks_t *hooks);
/* Send a request now if registered, else drop it (PROGRESS, HEARTBEAT);
 * takes the body. */
void dt_link_send(dt_link_t *l, uint16_t type, json_t *body);
/* Queue a message that must arrive: sent now if registered and again after
 * every re-registration until answered; takes the body. */
void dt_link_send_reliable(dt_link_t *l, uint16_t type, json_t *body);
/* FENCE (gen, seq): as reliable, but kept until FENCE_DONE for it. */
void dt_link_send_fence(dt_link_t *l, uint32_t gen, uint32_t seq, json_t *body);
/* The coordinator's id for this agent, 0 before the first registration. */
int64_t dt_link_agent_id(const dt_link_t *l);
/* Close the connection and timers, drop the queue. The memory stays until
 * dt_link_free, after the loop has run the close callbacks. */
void dt_link_close(dt_link_t *l);
/* NULL is a no-op. */
void dt_link_free(dt_link_t *l);

#endif /* DT_AGENT_LINK_H */
