/* SPDX-License-Identifier: MIT
 *
 * The coordinator's recovery policy, all of it: every fault of a job
 * (a worker that exits, is killed or hangs; an agent lost or restarted;
 * a next generation whose ranks no longer fit the live agents; Slurm's
 * warning signal; a Slurm job that ended, vanished or was requeued under
 * a live dt job) is decided here, and carried out here through run.c
 * (generations) and alloc.c (Slurm jobs), which report faults through the
 * coordinator's hooks (coord.h) and never call each other.
 *
 * The decision itself is a pure function, dt_recovery_decide: a fault and
 * a view of the job in, an action with its events and reason out, so each
 * rule is tested row by row without a coordinator (tests/unit/test_recovery.c).
 * The policy, as dt-spec(5) and dtcoordd(8) describe it:
 *   - a worker whose GPU failed (dtengine's exit 7, DT_EXIT_DEVICE): as
 *     any failure, and its node is suspect: no later generation of this
 *     run is placed on it (a spare takes its ranks; without one, a re-plan
 *     or, under Slurm, a requeue excluding it);
 *   - a worker that fails or hangs, or an agent lost or restarted: abort
 *     the generation on every agent, start the next one from the newest
 *     committed checkpoint, counting a restart; dtengine's exit 2 (invalid
 *     input) fails the job; a resume checkpoint that does not verify is set
 *     aside and the generation starts again from the one before, uncounted;
 *   - the next generation's ranks do not fit the live agents (an agent
 *     lost, no spare left): re-plan on fewer ranks when the planner allows,
 *     else fail; under Slurm, requeue excluding the lost nodes instead;
 *   - Slurm's warning signal: checkpoint, stop and requeue (uncounted);
 *   - a Slurm job that ended under the dt job: TIMEOUT, NODE_FAIL,
 *     PREEMPTED, BOOT_FAIL requeue; CANCELLED cancels; a run that had
 *     started requeues within the restart budget; anything else fails;
 *   - a failure repeated at the same step is deterministic and fails the
 *     job (the rule below); so does a job out of restarts (max_restarts).
 *
 * The deterministic rule (dt-spec(5) repeat_failures,
 * repeat_startup_failures): a failure is the triple (rank, cause, step)
 * plus whether it came before the generation's first completed step. The
 * rank is -1 for a failure of every rank (an engine exit status the ranks
 * agree on), since which rank's report arrives first is chance. The job
 * fails as deterministic when the same failure has been seen
 * repeat_failures times (default 2) mid-run, or repeat_startup_failures
 * times (default 3) at start-up. Start-up failures are counted apart
 * because external faults cluster there: a node being drained, a killed
 * process, a burst of faults each landing on a fresh generation all fail
 * "at the resume step", and that is no evidence of a bug. A different
 * rank, cause or step is a different failure. The restart budget
 * (max_restarts) bounds everything else.
 *
 * All but the pure functions run on the loop thread.
 */
#ifndef DT_RECOVERY_H
#define DT_RECOVERY_H

#include <stdbool.h>
#include <stdint.h>

struct dt_coord;
struct dt_spec;

/* max_restarts, repeat_failures, repeat_startup_failures unset: the job
 * spec key table's defaults (dt_spec_int) */
#define DT_FAIL_LOG_MAX 64 /* distinct failures remembered per job; the oldest goes */

/* One failure of a generation. */
typedef struct dt_failure {
    int rank;          /* the failed rank (a lost agent: its first); -1 every rank */
    const char *cause; /* "exit 1", "signal 9", "hung", "agent lost", ... */
    int64_t step;      /* the generation's step when it failed */
    bool startup;      /* before any rank completed a step of the generation */
} dt_failure_t;

typedef struct dt_fail_entry {
    int rank;
    char cause[48];
    int64_t step;
    bool startup;
    int count;
} dt_fail_entry_t;

/* A job's failures so far (in memory: a coordinator restart forgets them,
 * so the rule errs towards retrying). Zero-initialised is empty. */
typedef struct dt_fail_log {
    dt_fail_entry_t v[DT_FAIL_LOG_MAX];
    int n;
} dt_fail_log_t;

/* Count F in LOG; returns how often this same failure has now been seen
 * (1 the first time). */
int dt_recovery_note(dt_fail_log_t *log, const dt_failure_t *f);

/* Whether a failure seen COUNT times is deterministic, with the job's
 * limits (0: the defaults above). */
bool dt_recovery_deterministic(const dt_failure_t *f, int count, int64_t repeat,
                               int64_t repeat_startup);

/*-- faults and decisions ---------------------------------------------------------*/

/* Where a job's current generation is (run.c's phase, as the policy sees
 * it). */
enum dt_gen_phase {
    DT_GEN_NONE,     /* no run in memory for the job */
    DT_GEN_WAITING,  /* waiting for agents to register */
    DT_GEN_STARTING,
    DT_GEN_RUNNING,
    DT_GEN_ABORTING, /* waiting for the agents to report its end */
    DT_GEN_STOPPING, /* a planned stop: checkpoint, then exit */
    DT_GEN_DONE,
};

enum dt_fault_kind {
    DT_FAULT_WORKER,          /* a worker exited non-zero, was killed or hung */
    DT_FAULT_AGENT_LOST,      /* an agent of the generation went silent */
    DT_FAULT_AGENT_RESTARTED, /* an agent came back without its workers */
    DT_FAULT_SHORT,           /* the next generation does not fit the live agents */
    DT_FAULT_PREEMPT,         /* Slurm's warning signal reached an agent */
    DT_FAULT_STOPPED,         /* a planned stop ended (or a failure interrupted it) */
    DT_FAULT_STOP_TIMEOUT,    /* a planned stop did not end in time */
    /* from alloc.c; the ones above come from run.c */
    DT_FAULT_SLURM_ENDED,     /* the Slurm job ended under a live dt job */
    DT_FAULT_SLURM_LOST,      /* slurmctld no longer knows the Slurm job */
    DT_FAULT_SLURM_REQUEUED,  /* Slurm requeued the job itself */
    DT_FAULT_SLURM_NO_ROOM,   /* a requeue excluding nodes would pend for ever */
};

/* True for the kinds alloc.c reports. */
#define DT_FAULT_FROM_SLURM(k) ((k) >= DT_FAULT_SLURM_ENDED)

/* One fault as it was reported; strings are borrowed. */
typedef struct dt_fault {
    enum dt_fault_kind kind;
    /* WORKER, AGENT_LOST, AGENT_RESTARTED */
    int rank;           /* the worker's rank; an agent's first rank (-1 none) */
    int64_t agent;
    int64_t status, sig, step; /* WORKER: exit status, signal, the rank's step */
    bool hung, stopped; /* WORKER: silent past the hang timeout (stopped by a signal) */
    const char *node;   /* the agent's node */
    const char *err;    /* WORKER: the engine's words, escaped; "" or NULL none */
    const char *gpu;    /* WORKER: the UUID of its GPU (cuda); "" or NULL none */
    int slots;          /* SHORT: slots on the live agents */
    const char *signal; /* PREEMPT: USR1, ... */
    const char *detail; /* STOPPED, SLURM_NO_ROOM: the sentence that says what happened */
    /* SLURM_* */
    uint32_t slurm_id;
    const char *state;  /* Slurm's job state: TIMEOUT, CANCELLED, ... */
    const char *nodes, *output, *how;
    int exit_code, exit_signal;
    int64_t restart;    /* SLURM_REQUEUED: Slurm's restart count */
    bool agents_seen;   /* SLURM_ENDED: an agent of this run had registered */
} dt_fault_t;

/* What the policy knows of the job when it decides. */
typedef struct dt_job_view {
    int64_t job;
    enum dt_gen_phase phase;
    bool terminal;      /* the job is completed, failed or cancelled */
    bool recovering;    /* the job is in state recovering already */
    bool slurm;         /* its allocation is a Slurm job */
    bool stop_requeue;  /* the planned stop ends in a requeue */
    int gen, ranks;     /* the current (or next) generation and its ranks */
    int64_t step;       /* the furthest step of the generation */
    int64_t resume_step;
    bool resumed_memory; /* the generation resumed from the agents' in-memory checkpoints */
    int restarts, restart_base, max_restarts;
    int64_t repeat, repeat_startup; /* the spec's repeat_failures, repeat_startup_failures */
    const char *lost_nodes; /* nodes of agents lost in this run ("a,b"), for a requeue */
    int replan_ranks;   /* SHORT: the most ranks < ranks the planner accepts on the slots */
    int dp;             /* the spec's rings (0 or 1: one); ranks count every ring's */
    dt_fail_log_t *fails; /* the job's failures so far; noted by dt_recovery_decide */
} dt_job_view_t;

enum dt_action {
    DT_ACT_NONE,         /* nothing (the generation is not running any more) */
    DT_ACT_IGNORE,       /* the events only */
    DT_ACT_RESTART,      /* the next generation from the newest committed checkpoint; a restart */
    DT_ACT_RETRY,        /* the same, uncounted (the resume checkpoint is set aside) */
    DT_ACT_REPLAN,       /* the next generation on `ranks` ranks */
    DT_ACT_REQUEUE,      /* requeue the Slurm job; the next run resumes */
    DT_ACT_STOP_REQUEUE, /* checkpoint and stop the generation, then requeue */
    DT_ACT_REQUEUED,     /* Slurm requeued it: record that, forget the run */
    DT_ACT_FAIL,         /* the job fails with `why` */
    DT_ACT_CANCEL,       /* the job is cancelled with `why` */
};

#define DT_DECISION_EVENTS 2

typedef struct dt_decision {
    enum dt_action action;
    bool abort;        /* abort the generation first, naming `rank` (-1: none) */
    int rank;
    bool failure;      /* REQUEUE: counts against the restart budget */
    bool exclude_lost; /* REQUEUE: the lost agents' nodes are excluded */
    bool ckpt_corrupt; /* RETRY: the resume checkpoint is marked corrupt and set aside */
    bool mem_corrupt;  /* RETRY: the in-memory checkpoints are forgotten (disk next) */
    bool suspect;      /* the failed worker's node is suspect: no more ranks on it */
    int64_t suspect_agent; /* ... its agent */
    int ranks;         /* REPLAN */
    char abort_why[800]; /* the GEN_ABORT's reason when `abort` */
    int nev;           /* events, written before the action */
    struct {
        char kind[32];
        char detail[1600];
    } ev[DT_DECISION_EVENTS];
    char why[1600];    /* the reason: the state change, GEN_ABORT, the requeue */
} dt_decision_t;

const char *dt_action_name(enum dt_action a);

/* Decide what a fault means for the job. Pure but for noting the failure
 * in v->fails (when it counts for the deterministic rule). Returns
 * d->action. */
enum dt_action dt_recovery_decide(const dt_fault_t *f, const dt_job_view_t *v,
                                  dt_decision_t *d);

/* The most ranks below `ranks` that the planner accepts for the spec on
 * `slots` slots; 0 when none. ranks, slots and the result count every
 * worker: with the spec's dp = N rings, N R' for the largest R' ranks per
 * ring that plans (N R' < ranks, N R' <= slots); dp stays. */
int dt_recovery_replan(const struct dt_spec *spec, int ranks, int slots);

/*-- the policy carried out (the coordinator's hooks) ------------------------------*/

/* A fault reported by run.c or alloc.c: decide it and act. Returns the
 * action taken. */
int dt_recovery_fault(struct dt_coord *c, int64_t job, const dt_fault_t *f);
/* run.c: the job reached a final state; its Slurm job ends. */
void dt_recovery_job_ended(struct dt_coord *c, int64_t job, int cancelled);
/* Periodic: agents silent past agent_timeout are lost (recorded, then
 * the faults decided); then run.c's timers. */
void dt_recovery_sweep(struct dt_coord *c);

#endif /* DT_RECOVERY_H */
