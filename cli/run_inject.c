/* SPDX-License-Identifier: MIT
 *
 * Fault injection of `dtctl run --local` (cli/run_inject.h): parses
 * --inject-failure, and on each SHOW reply picks the highest rank and its
 * agent and, once the step is reached, acts through its hooks.
 */
#include "config.h"

#include <signal.h>
#include <stdlib.h>
#include <string.h>

#include "cli/run_inject.h"

#define RESTART_DELAY_S 1.0 /* coordinator fault: down this long */

static const char *const names[] = {
    [DTCTL_INJ_NONE] = "none",
    [DTCTL_INJ_WORKER] = "worker",
    [DTCTL_INJ_HANG] = "hang",
    [DTCTL_INJ_AGENT] = "agent",
    [DTCTL_INJ_COORD] = "coordinator",
};

int dtctl_inject_parse(dtctl_inject_t *inj, const char *arg, long long steps, dt_emsg_t *em)
{
    const char *at = strchr(arg, '@');
    size_t len = at ? (size_t)(at - arg) : strlen(arg);

    steps = steps > 0 ? steps : 1;
    inj->kind = DTCTL_INJ_NONE;
    for (int i = DTCTL_INJ_WORKER; i <= DTCTL_INJ_COORD; i++)
        if (strlen(names[i]) == len && strncmp(arg, names[i], len) == 0)
            inj->kind = (enum dtctl_inject_kind)i;
    if (inj->kind == DTCTL_INJ_NONE)
        return dt_emsg_set(em, DT_EUSAGE, "--inject-failure '%s': expected worker, hang, agent "
                           "or coordinator, optionally @STEP", arg);
    inj->step = steps / 2;
    if (at) {
        char *end;
        inj->step = strtoll(at + 1, &end, 10);
        if (at[1] == '\0' || *end || inj->step < 0)
            return dt_emsg_set(em, DT_EUSAGE, "--inject-failure '%s': STEP must be a "
                               "non-negative integer", arg);
    }
    if (inj->step >= steps)
        return dt_emsg_set(em, DT_EUSAGE, "--inject-failure '%s': the job has %lld steps, so "
                           "the failure must come at a step below %lld", arg, steps, steps);
    return 0;
}

/* The highest rank in a SHOW reply, and the largest step any rank reported. */
static const json_t *highest_rank(const json_t *show, long long *max_step)
{
    const json_t *ranks = json_object_get(show, "ranks"), *x, *top = NULL;
    long long best = -1;
    size_t i;

    *max_step = -1;
    json_array_foreach(ranks, i, x) {
        long long rank = (long long)json_integer_value(json_object_get(x, "rank"));
        long long step = (long long)json_integer_value(json_object_get(x, "step"));
        if (step > *max_step)
            *max_step = step;
        if (json_is_integer(json_object_get(x, "rank")) && rank > best) {
            best = rank;
            top = x;
        }
    }
    return top;
}

/* The node a rank runs on: its own "node", else its agent's. NULL when
 * the reply does not say. */
static const char *node_of(const json_t *show, const json_t *rank)
{
    const json_t *node = json_object_get(rank, "node"), *a;
    const char *name = json_is_string(node) ? json_string_value(node) : NULL;
    size_t i;

    if (name == NULL)
        json_array_foreach(json_object_get(show, "agents"), i, a)
            if (json_equal(json_object_get(a, "id"), json_object_get(rank, "agent")) &&
                json_is_string(json_object_get(a, "node")))
                name = json_string_value(json_object_get(a, "node"));
    return name;
}

void dtctl_inject_on_show(void *arg, dtctl_watch_t *w, const json_t *show)
{
    dtctl_inject_t *inj = arg;
    const dtctl_inject_hooks_t *h = &inj->hooks;
    long long step;
    const json_t *top = highest_rank(show, &step);
    long long rank;
    const char *node;
    pid_t pid;

    if (inj->kind == DTCTL_INJ_NONE || inj->done || step < inj->step || top == NULL)
        return;
    rank = (long long)json_integer_value(json_object_get(top, "rank"));
    pid = (pid_t)json_integer_value(json_object_get(top, "pid"));
    node = node_of(show, top);
    switch (inj->kind) {
    case DTCTL_INJ_WORKER:
    case DTCTL_INJ_HANG: {
        int worker = inj->kind == DTCTL_INJ_WORKER;
        if (h->kill_worker(h->arg, node, pid, worker ? SIGKILL : SIGSTOP) < 0)
            return; /* not yet known: try again at the next poll */
        dtctl_watch_note(w, "injected failure at step %lld: %s to the worker of rank %lld "
                         "(pid %ld on %s)", step, worker ? "SIGKILL" : "SIGSTOP", rank,
                         (long)pid, node);
        break;
    }
    case DTCTL_INJ_AGENT: {
        pid_t apid = h->kill_agent(h->arg, node);
        if (apid <= 0)
            return;
        dtctl_watch_note(w, "injected failure at step %lld: SIGKILL to agent %s (pid %ld), "
                         "which runs rank %lld", step, node, (long)apid, rank);
        break;
    }
    case DTCTL_INJ_COORD: {
        pid_t cpid = h->kill_coord(h->arg, RESTART_DELAY_S);
        if (cpid <= 0)
            return;
        dtctl_watch_note(w, "injected failure at step %lld: SIGKILL to dtcoordd (pid %ld); "
                         "starting it again in %.0f s", step, (long)cpid, RESTART_DELAY_S);
        break;
    }
    case DTCTL_INJ_NONE:
        break;
    }
    inj->done = 1;
}
