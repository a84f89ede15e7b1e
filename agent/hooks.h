/* SPDX-License-Identifier: MIT
 *
 * What dtagentd's modules may ask of the rest of the agent. main.c fills
 * one dt_agentd_hooks_t and hands it to task.c (the workers) and files.c
 * (checkpoint files): they reach the coordinator link and the agent's
 * lifecycle only through it, never by calling link.c or main.c by name.
 * Every hook runs on the loop thread.
 *
 * The agent's files call each other in one direction only: main.c calls
 * link, task, files (and task calls pmix); the others call back through
 * the hooks and handler tables they were given.
 */
#ifndef DT_AGENT_HOOKS_H
#define DT_AGENT_HOOKS_H

#include <jansson.h>
#include <stdint.h>

typedef struct dt_agentd_hooks {
    void *ud;
    /* To the coordinator now if registered, else dropped (PROGRESS);
     * takes the body. */
    void (*send)(void *ud, uint16_t type, json_t *body);
    /* A message that must arrive: kept and sent again after a reconnect
     * until the coordinator answers it; takes the body. */
    void (*send_reliable)(void *ud, uint16_t type, json_t *body);
    /* FENCE (gen, seq): kept until FENCE_DONE for it; takes the body. */
    void (*send_fence)(void *ud, uint32_t gen, uint32_t seq, json_t *body);
    /* The coordinator's id for this agent (0 before the first registration). */
    int64_t (*agent_id)(void *ud);
    /* 1 once the agent is stopping. */
    int (*stopping)(void *ud);
    /* Every handle of the workers has closed (task.c). */
    void (*workers_gone)(void *ud);
} dt_agentd_hooks_t;

#endif /* DT_AGENT_HOOKS_H */
