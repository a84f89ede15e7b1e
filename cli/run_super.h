/* SPDX-License-Identifier: MIT
 *
 * The local supervisor of `dtctl run --local`: the state directory and its
 * dt.conf, the private dtcoordd and the local dtagentd it starts with
 * plain fork/exec/waitpid, what it does while the job runs (reap, notice
 * a dead agent or coordinator, start the coordinator again) and the
 * teardown that leaves nothing running. Every child runs in its own
 * process group with SIGTERM as its parent-death signal, and dtctl is a
 * child subreaper, so workers orphaned by a killed agent come back to it.
 *
 * `dtctl plot --state-dir` starts a coordinator alone through it on the
 * state directory of an earlier run, and stops it with the same teardown.
 *
 * Not here: the job spec, submitting and the display (cli/cmd_run.c, the
 * flow that wires this together), the faults (cli/run_inject.c, which acts
 * through the dtctl_super_kill_* functions the flow hands it).
 */
#ifndef DT_CLI_RUN_SUPER_H
#define DT_CLI_RUN_SUPER_H

#include <jansson.h>
#include <stdint.h>
#include <stdio.h>
#include <sys/types.h>

#include "cli/dtctl.h"
#include "common/err.h"

#define DTCTL_MAX_AGENTS 64 /* agents and spares together */

/* A process dtctl started. */
typedef struct dtctl_proc {
    char name[32]; /* "dtcoordd", "local1" */
    char *log;
    pid_t pid;
    int ended;     /* reaped; status is its wait status */
    int status;
    int expected;  /* we stopped or killed it: its end is no news */
} dtctl_proc_t;

/* What the supervisor holds; the caller sets ctl, local, out, the agent
 * counts, job and hang_ms (zero the rest), and frees it with
 * dtctl_super_close. */
typedef struct dtctl_super {
    dtctl_t *ctl;  /* the caller's (prog, json) */
    const char *by; /* who starts the processes, for their logs' banners
                     * (NULL: "dtctl run --local") */
    dtctl_t local; /* requests to our coordinator */
    FILE *out;     /* informational lines: stdout, or stderr with --json */
    char *dir, *conf, *sock, *pidfile;
    char *coordd, *agentd, *engine;
    dtctl_proc_t coord;
    dtctl_proc_t agents[DTCTL_MAX_AGENTS];
    int nagents, nspares, workers;
    long long job;
    int64_t hang_ms;   /* agents' --hang-timeout; 0: theirs */
    pid_t stopped;     /* a worker we SIGSTOPped */
    double restart_at; /* the coordinator is due to start again (monotonic) */
    double agents_gone_since;
    int registered; /* agents in the latest SHOW reply */
    char state[32]; /* the job's state in the latest SHOW reply */
    /* Called by dtctl_super_poll with every SHOW reply, once the processes
     * are seen to: the fault injector, or NULL. */
    void (*on_show)(void *arg, dtctl_watch_t *w, const json_t *show);
    void *on_show_arg;
} dtctl_super_t;

/* SIGINT, SIGTERM and SIGHUP: the first is noted (dtctl_super_signal), a
 * second kills everything at once. */
void dtctl_super_signals_install(void);
/* The first signal that came, 0 for none. */
int dtctl_super_signal(void);

/* dtcoordd, dtagentd and dtengine: $DT_COORDD..., beside dtctl, or in
 * $PATH. 0, or DT_ENOENT with a message. */
int dtctl_super_find_programs(dtctl_super_t *s, dt_emsg_t *em);
/* dtcoordd alone, the same way (for a coordinator without agents). */
int dtctl_super_find_coordd(dtctl_super_t *s, dt_emsg_t *em);
/* --state-dir (opt), else $XDG_STATE_HOME/dt, else ~/.local/state/dt: made
 * 0700, and refused when a coordinator holds it; then DIR/dt.conf written
 * anew. */
int dtctl_super_state_dir(dtctl_super_t *s, const char *opt, dt_emsg_t *em);
/* The state directory DIR of an earlier run, to start a coordinator on it
 * again (dtctl plot --state-dir): it must exist and hold dt.db (else
 * DT_EUSAGE saying so); DIR/dt.conf is written anew. *held is set, and
 * nothing written, when a coordinator already answers there: s->local
 * then reaches it, and there is nothing to start. */
int dtctl_super_state_dir_again(dtctl_super_t *s, const char *dir, int *held, dt_emsg_t *em);

/* Start dtcoordd and wait until it answers PING: DT_ECOMM when it exits or
 * stays silent (its log says why: dtctl_super_log_tail), DT_ECANCELED when
 * a signal came. */
int dtctl_super_coord_start(dtctl_super_t *s, dt_emsg_t *em);
/* Start agents [from, to): localN, N from 1. */
int dtctl_super_agents_start(dtctl_super_t *s, int from, int to, dt_emsg_t *em);
/* Wait (at most 15 s, or until a signal or an agent's exit) until n agents
 * have registered. */
void dtctl_super_agents_registered(dtctl_super_t *s, int n);

/* The watch's poll hook (dtctl_watch_hooks_t.poll, arg the supervisor):
 * reap, report agents that died, kill their orphaned workers, start the
 * coordinator again when due, pass the SHOW reply to on_show, and give up
 * when every agent is gone. -1 to go on, or an exit code. */
int dtctl_super_poll(void *arg, dtctl_watch_t *w, const json_t *show);

/* For the fault injector: send sig to worker pid, which the live agent
 * named node started: 0, or -1 when that is not (yet) so. A SIGSTOPped
 * worker is continued at teardown. */
int dtctl_super_kill_worker(void *arg, const char *node, pid_t pid, int sig);
/* SIGKILL the live agent named node: its pid, or 0 when there is none. */
pid_t dtctl_super_kill_agent(void *arg, const char *node);
/* SIGKILL the coordinator and start it again after delay_s (from
 * dtctl_super_poll): its pid, or 0 when it is not running. */
pid_t dtctl_super_kill_coord(void *arg, double delay_s);

/* Nothing left running: cancel the job unless it ended (why is the
 * reason), stop the agents (TERM, then KILL), kill orphans, stop the
 * coordinator. */
void dtctl_super_teardown(dtctl_super_t *s, int ended, const char *why);
void dtctl_super_close(dtctl_super_t *s);

/* The last lines of a log, indented, on stderr. */
void dtctl_super_log_tail(const char *path, int lines);

#endif /* DT_CLI_RUN_SUPER_H */
