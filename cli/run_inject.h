/* SPDX-License-Identifier: MIT
 *
 * Fault injection for `dtctl run --local --inject-failure KIND[@STEP]`:
 * once a rank of the job reports STEP, one fault (a worker killed or
 * stopped, an agent killed, the coordinator killed and started again) to
 * show the job recover. It decides when and whom from the watch's SHOW
 * replies and acts through the hooks it is given (the supervisor's, wired
 * by cli/cmd_run.c); it starts and reaps nothing itself.
 */
#ifndef DT_CLI_RUN_INJECT_H
#define DT_CLI_RUN_INJECT_H

#include <jansson.h>
#include <sys/types.h>

#include "cli/dtctl.h"
#include "common/err.h"

/* Failures --inject-failure knows. */
enum dtctl_inject_kind {
    DTCTL_INJ_NONE,
    DTCTL_INJ_WORKER, /* SIGKILL to a worker */
    DTCTL_INJ_HANG,   /* SIGSTOP to a worker: the agent's hang timeout */
    DTCTL_INJ_AGENT,  /* SIGKILL to an agent */
    DTCTL_INJ_COORD,  /* SIGKILL to dtcoordd, started again a second later */
};

/* How the injector acts; arg is passed to each. */
typedef struct dtctl_inject_hooks {
    /* Send sig to worker pid, started by the live agent named node: 0, or
     * -1 when that is not (yet) so (tried again at the next poll). */
    int (*kill_worker)(void *arg, const char *node, pid_t pid, int sig);
    /* SIGKILL the live agent named node: its pid, or 0 when none. */
    pid_t (*kill_agent)(void *arg, const char *node);
    /* SIGKILL the coordinator, to be started again after delay_s: its pid,
     * or 0 when it is not running. */
    pid_t (*kill_coord)(void *arg, double delay_s);
    void *arg;
} dtctl_inject_hooks_t;

typedef struct dtctl_inject {
    enum dtctl_inject_kind kind;
    long long step; /* when a rank has reported this step */
    int done;       /* injected: never again */
    dtctl_inject_hooks_t hooks;
} dtctl_inject_t;

/* KIND[@STEP] of --inject-failure into inj->kind and inj->step, checked
 * against the job's steps (STEP defaults to half of them). 0, or
 * DT_EUSAGE with a message. */
int dtctl_inject_parse(dtctl_inject_t *inj, const char *arg, long long steps, dt_emsg_t *em);

/* A SHOW reply of the job (borrowed; arg is the dtctl_inject_t): the
 * fault, once the job has reached its step, noted on the display. */
void dtctl_inject_on_show(void *arg, dtctl_watch_t *w, const json_t *show);

#endif /* DT_CLI_RUN_INJECT_H */
