/* SPDX-License-Identifier: MIT
 *
 * The recovery policy (coordinator/recovery.h), one row per case. First
 * the decision: one row per fault kind and the job states that change
 * its outcome (fault and job in, action, events and reason out). Then
 * the deterministic-failure rule: a sequence of failures of one job and, after each, whether the
 * job would now fail as deterministic. The rows are the histories the
 * coordinator meets: a bug that fails at the same step every time (mid-run
 * or at start-up), a burst of external kills (one mid-run, then one at the
 * start of each new generation), the same cause at different steps or on
 * different ranks, and the job's own limits from its spec. Last the
 * re-plan on fewer slots, with and without data parallel rings.
 */
#include <criterion/criterion.h>
#include <stdio.h>
#include <string.h>

#include "common/proto.h"

#include "common/macros.h"
#include "coordinator/recovery.h"
#include "spec/spec.h"

#define END { .cause = NULL }

typedef struct row {
    const char *name;
    int64_t repeat, repeat_startup; /* the spec's keys (0: defaults 2 and 3) */
    dt_failure_t f[8];              /* ended by END */
    bool verdict[8];                /* deterministic after f[i]? */
} row_t;

static const row_t rows[] = {
    { .name = "the same exit at the same step mid-run: fails on the second",
      .f = { { -1, "exit 1", 10, false }, { -1, "exit 1", 10, false }, END },
      .verdict = { false, true } },
    { .name = "issue 14's burst: a kill mid-run, then one at each of two generation starts",
      .f = { { 2, "signal 9", 15, false }, { 3, "signal 9", 10, true },
             { 3, "signal 9", 10, true }, END },
      .verdict = { false, false, false } },
    { .name = "the same start-up failure three times: fails on the third",
      .f = { { 0, "exit 1", 10, true }, { 0, "exit 1", 10, true }, { 0, "exit 1", 10, true },
             END },
      .verdict = { false, false, true } },
    { .name = "start-up and mid-run failures at one step are counted apart",
      .f = { { 1, "signal 9", 10, true }, { 1, "signal 9", 10, false }, END },
      .verdict = { false, false } },
    { .name = "the same cause at growing steps is progress, not a loop",
      .f = { { 1, "hung", 12, false }, { 1, "hung", 25, false }, { 1, "hung", 37, false }, END },
      .verdict = { false, false, false } },
    { .name = "the same kill of two different ranks is two failures",
      .f = { { 0, "signal 9", 20, false }, { 1, "signal 9", 20, false }, END },
      .verdict = { false, false } },
    { .name = "two causes at one step are two failures",
      .f = { { 2, "signal 9", 20, false }, { 2, "signal 11", 20, false }, END },
      .verdict = { false, false } },
    { .name = "an agent lost twice at the same step with the same first rank",
      .f = { { 2, "agent lost", 30, false }, { 2, "agent lost", 30, false }, END },
      .verdict = { false, true } },
    { .name = "repeat_failures = 3 lets the second go by",
      .repeat = 3,
      .f = { { -1, "exit 1", 10, false }, { -1, "exit 1", 10, false },
             { -1, "exit 1", 10, false }, END },
      .verdict = { false, false, true } },
    { .name = "repeat_startup_failures = 1: the first start-up failure is final",
      .repeat_startup = 1,
      .f = { { 0, "exit 1", 0, true }, END },
      .verdict = { true } },
    { .name = "a failure between two others still counts",
      .f = { { -1, "exit 1", 10, false }, { 3, "signal 9", 14, false },
             { -1, "exit 1", 10, false }, END },
      .verdict = { false, false, true } },
};

Test(recovery, deterministic_rule_row_by_row)
{
    for (size_t r = 0; r < DT_ARRAY_SIZE(rows); r++) {
        dt_fail_log_t log = { 0 };
        for (int i = 0; rows[r].f[i].cause; i++) {
            int seen = dt_recovery_note(&log, &rows[r].f[i]);
            bool det = dt_recovery_deterministic(&rows[r].f[i], seen, rows[r].repeat,
                                                 rows[r].repeat_startup);
            cr_expect_eq(det, rows[r].verdict[i], "%s: after failure %d (seen %d times): %s",
                         rows[r].name, i + 1, seen, det ? "deterministic" : "retry");
        }
    }
}

Test(recovery, the_log_is_bounded_and_keeps_counting)
{
    dt_fail_log_t log = { 0 };
    char cause[32];

    /* more distinct failures than the log holds: the oldest are forgotten */
    for (int i = 0; i < 3 * DT_FAIL_LOG_MAX; i++) {
        snprintf(cause, sizeof(cause), "exit %d", i);
        dt_failure_t f = { 0, cause, i, false };
        cr_assert_eq(dt_recovery_note(&log, &f), 1);
    }
    cr_assert_eq(log.n, DT_FAIL_LOG_MAX);
    /* the newest is still there and counts on */
    snprintf(cause, sizeof(cause), "exit %d", 3 * DT_FAIL_LOG_MAX - 1);
    dt_failure_t last = { 0, cause, 3 * DT_FAIL_LOG_MAX - 1, false };
    cr_assert_eq(dt_recovery_note(&log, &last), 2);
}

/*-- the decision, one row per fault kind ----------------------------------------*/

/* A job in the middle of generation 3 of 4 ranks, resumed at step 100,
 * one restart used of five; a row overrides what its case changes (a
 * later designated initialiser wins, which is the point here). */
#pragma GCC diagnostic ignored "-Woverride-init"
#define RUNNING                                                                          \
    .job = 7, .phase = DT_GEN_RUNNING, .gen = 3, .ranks = 4, .step = 120, .resume_step = 100, \
    .restarts = 1, .max_restarts = 5

typedef struct decide_row {
    const char *name;
    dt_fault_t f;
    dt_job_view_t v;
    int prior;              /* the same fault decided this often before */
    enum dt_action action;
    bool abort;             /* the generation is aborted first ... */
    int rank;               /* ... naming this rank (-1 none) */
    bool failure, exclude_lost, ckpt_corrupt, suspect;
    int ranks;              /* REPLAN */
    const char *ev[DT_DECISION_EVENTS]; /* event kinds, in order */
    const char *why;        /* in the reason */
} decide_row_t;

static const decide_row_t decide_rows[] = {
    /* worker exit */
    { .name = "a worker killed: retryable, the generation restarts",
      .f = { .kind = DT_FAULT_WORKER, .rank = 2, .sig = 9, .step = 120, .node = "n1" },
      .v = { RUNNING }, .action = DT_ACT_RESTART, .abort = true, .rank = 2,
      .ev = { "worker_failed" }, .why = "rank 2 on n1 killed by signal 9 at step 120" },
    { .name = "an exit status the ranks agree on: the failure is every rank's",
      .f = { .kind = DT_FAULT_WORKER, .rank = 3, .status = 1, .step = 120, .node = "n2",
             .err = "loss is NaN" },
      .v = { RUNNING }, .action = DT_ACT_RESTART, .abort = true, .rank = -1,
      .ev = { "worker_failed" }, .why = "rank 3 on n2 exited with status 1 at step 120: loss is NaN" },
    { .name = "the same agreed exit at the same step again: deterministic",
      .f = { .kind = DT_FAULT_WORKER, .rank = 3, .status = 1, .step = 120, .node = "n2" },
      .v = { RUNNING }, .prior = 1, .action = DT_ACT_FAIL, .abort = true, .rank = -1,
      .ev = { "worker_failed", "deterministic_failure" },
      .why = "deterministic failure: exit 1 on every rank, twice at step 120" },
    { .name = "a hung worker: its rank, restarted",
      .f = { .kind = DT_FAULT_WORKER, .rank = 1, .hung = true, .step = 118, .node = "n1" },
      .v = { RUNNING }, .action = DT_ACT_RESTART, .abort = true, .rank = 1,
      .ev = { "worker_hung" }, .why = "rank 1 on n1 silent past the hang timeout at step 118" },
    { .name = "dtengine's exit 2: invalid input fails the job at once",
      .f = { .kind = DT_FAULT_WORKER, .rank = 0, .status = 2, .step = 100, .node = "n1" },
      .v = { RUNNING }, .action = DT_ACT_FAIL, .rank = -1, .ev = { "worker_failed" },
      .why = "invalid job: rank 0 on n1 exited with status 2" },
    { .name = "a corrupt resume checkpoint: set aside, retried uncounted",
      .f = { .kind = DT_FAULT_WORKER, .rank = 0, .status = DT_EXIT_CKPT, .step = 100,
             .node = "n1" },
      .v = { RUNNING }, .action = DT_ACT_RETRY, .rank = -1, .ckpt_corrupt = true,
      .ev = { "worker_failed", "checkpoint_skipped" },
      .why = "the resume checkpoint does not verify" },
    { .name = "a worker whose GPU failed: restart, its node suspect",
      .f = { .kind = DT_FAULT_WORKER, .rank = 1, .agent = 21, .status = DT_EXIT_DEVICE,
             .step = 120, .node = "g2", .err = "CUDA error: an illegal memory access" },
      .v = { RUNNING }, .action = DT_ACT_RESTART, .abort = true, .rank = 1, .suspect = true,
      .ev = { "worker_failed", "device_fault" },
      .why = "rank 1 on g2 exited with status 7 at step 120: CUDA error" },
    { .name = "a GPU that failed while the generation aborts: no action, its node suspect",
      .f = { .kind = DT_FAULT_WORKER, .rank = 3, .agent = 22, .status = DT_EXIT_DEVICE,
             .step = 121, .node = "g3" },
      .v = { RUNNING, .phase = DT_GEN_ABORTING }, .action = DT_ACT_NONE, .rank = -1,
      .suspect = true, .ev = { "worker_failed", "device_fault" } },
    { .name = "a worker failure with the restart budget used up",
      .f = { .kind = DT_FAULT_WORKER, .rank = 2, .sig = 9, .step = 120, .node = "n1" },
      .v = { RUNNING, .restarts = 7, .restart_base = 2 }, .action = DT_ACT_FAIL, .abort = true,
      .rank = 2, .ev = { "worker_failed" }, .why = "restart budget of 5 used up" },
    /* agents */
    { .name = "an agent lost (a spare or the same slots remain): restart",
      .f = { .kind = DT_FAULT_AGENT_LOST, .rank = 2, .agent = 12, .node = "n3" },
      .v = { RUNNING }, .action = DT_ACT_RESTART, .abort = true, .rank = 2,
      .ev = { "agent_lost" }, .why = "agent 12 lost with its ranks" },
    { .name = "an agent lost during a planned stop: recorded, the stop decides",
      .f = { .kind = DT_FAULT_AGENT_LOST, .rank = 0, .agent = 12 },
      .v = { RUNNING, .phase = DT_GEN_STOPPING }, .action = DT_ACT_NONE, .rank = -1,
      .ev = { "agent_lost" } },
    { .name = "an agent came back without its workers: restart",
      .f = { .kind = DT_FAULT_AGENT_RESTARTED, .rank = 0, .agent = 11, .node = "n1" },
      .v = { RUNNING }, .action = DT_ACT_RESTART, .abort = true, .rank = 0,
      .ev = { "agent_restarted" }, .why = "agent 11 (n1) came back without its workers" },
    { .name = "no spare left, no Slurm: re-planned on fewer ranks",
      .f = { .kind = DT_FAULT_SHORT, .rank = -1, .slots = 3 },
      .v = { RUNNING, .phase = DT_GEN_ABORTING, .replan_ranks = 2 }, .action = DT_ACT_REPLAN,
      .rank = -1, .ranks = 2, .ev = { "replanned" } },
    { .name = "no spare left, dp = 2 rings of 4: re-planned on 2 rings of 2",
      .f = { .kind = DT_FAULT_SHORT, .rank = -1, .slots = 6 },
      .v = { RUNNING, .ranks = 8, .dp = 2, .phase = DT_GEN_ABORTING, .replan_ranks = 4 },
      .action = DT_ACT_REPLAN, .rank = -1, .ranks = 4, .ev = { "replanned" } },
    { .name = "no spare left, no plan on fewer ranks fits: fails",
      .f = { .kind = DT_FAULT_SHORT, .rank = -1, .slots = 1 },
      .v = { RUNNING, .phase = DT_GEN_ABORTING }, .action = DT_ACT_FAIL, .rank = -1,
      .ev = { "replan_failed" }, .why = "4 ranks needed, 1 slots on live agents" },
    { .name = "no spare left under Slurm: requeued excluding the lost nodes",
      .f = { .kind = DT_FAULT_SHORT, .rank = -1, .slots = 2 },
      .v = { RUNNING, .phase = DT_GEN_ABORTING, .slurm = true }, .action = DT_ACT_REQUEUE,
      .rank = -1, .failure = true, .exclude_lost = true,
      .why = "4 ranks need 4 slots, 2 on live agents" },
    /* Slurm's warning signal and planned stops */
    { .name = "Slurm's warning signal without Slurm: ignored",
      .f = { .kind = DT_FAULT_PREEMPT, .rank = -1, .agent = 11, .node = "n1", .signal = "USR2" },
      .v = { RUNNING }, .action = DT_ACT_IGNORE, .rank = -1, .ev = { "signal_ignored" } },
    { .name = "Slurm's warning signal while running: checkpoint, stop, requeue",
      .f = { .kind = DT_FAULT_PREEMPT, .rank = -1, .agent = 11, .node = "n1", .signal = "USR2" },
      .v = { RUNNING, .slurm = true }, .action = DT_ACT_STOP_REQUEUE, .rank = -1,
      .ev = { "preempt_requested" }, .why = "SIGUSR2 from Slurm on n1" },
    { .name = "Slurm's warning signal while starting: requeued now, uncounted",
      .f = { .kind = DT_FAULT_PREEMPT, .rank = -1, .agent = 11, .node = "n1", .signal = "USR1" },
      .v = { RUNNING, .phase = DT_GEN_STARTING, .slurm = true }, .action = DT_ACT_REQUEUE,
      .rank = -1, .exclude_lost = true, .ev = { "preempt_requested" } },
    { .name = "Slurm's warning signal again while stopping: the first decided",
      .f = { .kind = DT_FAULT_PREEMPT, .rank = -1, .agent = 12, .signal = "USR1" },
      .v = { RUNNING, .phase = DT_GEN_STOPPING, .slurm = true }, .action = DT_ACT_NONE,
      .rank = -1 },
    { .name = "a preemption stop ended: requeued, uncounted",
      .f = { .kind = DT_FAULT_STOPPED, .rank = 0, .detail = "SIGUSR2; stopped after a checkpoint" },
      .v = { RUNNING, .phase = DT_GEN_STOPPING, .slurm = true, .stop_requeue = true },
      .action = DT_ACT_REQUEUE, .rank = -1, .exclude_lost = true,
      .why = "stopped after a checkpoint" },
    { .name = "dtctl cancel --checkpoint ended: cancelled",
      .f = { .kind = DT_FAULT_STOPPED, .rank = 0, .detail = "cancelled by uid 0; stopped" },
      .v = { RUNNING, .phase = DT_GEN_STOPPING }, .action = DT_ACT_CANCEL, .rank = -1,
      .why = "cancelled by uid 0; stopped" },
    { .name = "a planned stop that never ends: cancelled",
      .f = { .kind = DT_FAULT_STOP_TIMEOUT, .rank = -1 },
      .v = { RUNNING, .phase = DT_GEN_STOPPING }, .action = DT_ACT_CANCEL, .rank = -1,
      .why = "did not finish in time" },
    /* Slurm states */
    { .name = "Slurm: preempted, requeued at no cost to the budget",
      .f = { .kind = DT_FAULT_SLURM_ENDED, .rank = -1, .slurm_id = 41, .state = "PREEMPTED",
             .nodes = "n[1-2]", .agents_seen = true },
      .v = { RUNNING, .slurm = true }, .action = DT_ACT_REQUEUE, .rank = -1,
      .why = "slurm job 41 ended PREEMPTED on n[1-2]" },
    { .name = "Slurm: time limit, requeued as a failure",
      .f = { .kind = DT_FAULT_SLURM_ENDED, .rank = -1, .slurm_id = 41, .state = "TIMEOUT",
             .nodes = "", .agents_seen = true },
      .v = { RUNNING, .slurm = true }, .action = DT_ACT_REQUEUE, .rank = -1, .failure = true,
      .why = "is signal_lead long enough?" },
    { .name = "Slurm: node failure, requeued as a failure",
      .f = { .kind = DT_FAULT_SLURM_ENDED, .rank = -1, .slurm_id = 41, .state = "NODE_FAIL",
             .nodes = "n2" },
      .v = { RUNNING, .slurm = true }, .action = DT_ACT_REQUEUE, .rank = -1, .failure = true,
      .why = "ended NODE_FAIL on n2" },
    { .name = "Slurm: cancelled outside dt, the job is cancelled",
      .f = { .kind = DT_FAULT_SLURM_ENDED, .rank = -1, .slurm_id = 41, .state = "CANCELLED" },
      .v = { RUNNING, .slurm = true }, .action = DT_ACT_CANCEL, .rank = -1,
      .ev = { "slurm_cancelled" }, .why = "slurm job 41 was cancelled outside dt" },
    { .name = "Slurm: the batch job died under the running job, within the budget",
      .f = { .kind = DT_FAULT_SLURM_ENDED, .rank = -1, .slurm_id = 41, .state = "FAILED",
             .exit_code = 1, .agents_seen = true },
      .v = { RUNNING, .slurm = true }, .action = DT_ACT_REQUEUE, .rank = -1, .failure = true,
      .why = "under the running job" },
    { .name = "Slurm: the batch job died under the running job, budget used up",
      .f = { .kind = DT_FAULT_SLURM_ENDED, .rank = -1, .slurm_id = 41, .state = "FAILED",
             .exit_code = 1, .agents_seen = true },
      .v = { RUNNING, .slurm = true, .restarts = 5 }, .action = DT_ACT_FAIL, .rank = -1,
      .ev = { "slurm_ended" }, .why = "restart budget used up" },
    { .name = "Slurm: the batch job ended before any agent came: fails, pointing at its output",
      .f = { .kind = DT_FAULT_SLURM_ENDED, .rank = -1, .slurm_id = 41, .state = "FAILED",
             .exit_code = 127, .output = "/jobs/7/slurm-41.out" },
      .v = { RUNNING, .phase = DT_GEN_NONE, .slurm = true }, .action = DT_ACT_FAIL, .rank = -1,
      .ev = { "slurm_ended" }, .why = "see /jobs/7/slurm-41.out" },
    { .name = "Slurm: the Slurm job vanished from slurmctld",
      .f = { .kind = DT_FAULT_SLURM_LOST, .rank = -1, .slurm_id = 41 },
      .v = { RUNNING, .slurm = true }, .action = DT_ACT_FAIL, .rank = -1,
      .ev = { "slurm_lost" }, .why = "unknown to slurmctld" },
    { .name = "Slurm requeued the job itself: recorded, the run forgotten",
      .f = { .kind = DT_FAULT_SLURM_REQUEUED, .rank = -1, .slurm_id = 41, .restart = 2,
             .how = "restart count" },
      .v = { RUNNING, .slurm = true }, .action = DT_ACT_REQUEUED, .rank = -1,
      .why = "requeued by Slurm (restart count, restart 2)" },
    { .name = "Slurm: a requeue excluding nodes would pend for ever: fails",
      .f = { .kind = DT_FAULT_SLURM_NO_ROOM, .rank = -1, .slurm_id = 41,
             .detail = "slurm job 41 needs 2 nodes" },
      .v = { RUNNING, .slurm = true }, .action = DT_ACT_FAIL, .rank = -1,
      .ev = { "slurm_no_nodes" }, .why = "needs 2 nodes" },
    { .name = "Slurm: no room, but the job already ended: the event only",
      .f = { .kind = DT_FAULT_SLURM_NO_ROOM, .rank = -1, .slurm_id = 41,
             .detail = "slurm job 41 needs 2 nodes" },
      .v = { RUNNING, .slurm = true, .terminal = true }, .action = DT_ACT_IGNORE, .rank = -1,
      .ev = { "slurm_no_nodes" } },
};

Test(recovery, decision_row_by_row)
{
    for (size_t r = 0; r < DT_ARRAY_SIZE(decide_rows); r++) {
        const decide_row_t *row = &decide_rows[r];
        dt_fail_log_t log = { 0 };
        dt_job_view_t v = row->v;
        dt_decision_t d;
        v.fails = &log;
        for (int i = 0; i < row->prior; i++)
            dt_recovery_decide(&row->f, &v, &d);
        enum dt_action a = dt_recovery_decide(&row->f, &v, &d);
        cr_expect_eq(a, row->action, "%s: action %s, want %s", row->name, dt_action_name(a),
                     dt_action_name(row->action));
        cr_expect_eq(d.action, a, "%s: d.action", row->name);
        cr_expect_eq(d.abort, row->abort, "%s: abort %d", row->name, d.abort);
        if (row->abort)
            cr_expect_eq(d.rank, row->rank, "%s: abort names rank %d, want %d", row->name,
                         d.rank, row->rank);
        cr_expect_eq(d.failure, row->failure, "%s: failure %d", row->name, d.failure);
        cr_expect_eq(d.exclude_lost, row->exclude_lost, "%s: exclude_lost %d", row->name,
                     d.exclude_lost);
        cr_expect_eq(d.ckpt_corrupt, row->ckpt_corrupt, "%s: ckpt_corrupt", row->name);
        cr_expect_eq(d.suspect, row->suspect, "%s: suspect", row->name);
        if (row->suspect)
            cr_expect_eq(d.suspect_agent, row->f.agent, "%s: suspect_agent", row->name);
        if (row->action == DT_ACT_REPLAN)
            cr_expect_eq(d.ranks, row->ranks, "%s: ranks %d", row->name, d.ranks);
        int nev = 0;
        while (nev < DT_DECISION_EVENTS && row->ev[nev])
            nev++;
        cr_expect_eq(d.nev, nev, "%s: %d events, want %d (first: %s)", row->name, d.nev, nev,
                     d.nev ? d.ev[0].kind : "-");
        for (int i = 0; i < nev && i < d.nev; i++)
            cr_expect_str_eq(d.ev[i].kind, row->ev[i], "%s: event %d", row->name, i);
        if (row->why)
            cr_expect(strstr(d.why, row->why) != NULL, "%s: reason '%s' lacks '%s'", row->name,
                      d.why, row->why);
    }
}

/* Every fault kind has a row above. */
Test(recovery, every_fault_kind_has_a_row)
{
    for (int k = DT_FAULT_WORKER; k <= DT_FAULT_SLURM_NO_ROOM; k++) {
        bool seen = false;
        for (size_t r = 0; r < DT_ARRAY_SIZE(decide_rows); r++)
            seen |= (int)decide_rows[r].f.kind == k;
        cr_expect(seen, "fault kind %d has no row", k);
    }
}

/* A failure is noted once per decision: a mid-run failure that restarts
 * twice at different steps is not deterministic. */
Test(recovery, different_steps_are_progress)
{
    dt_fail_log_t log = { 0 };
    dt_job_view_t v = { RUNNING, .fails = &log };
    dt_fault_t f = { .kind = DT_FAULT_WORKER, .rank = 1, .sig = 9, .step = 120, .node = "n1" };
    dt_decision_t d;

    cr_assert_eq(dt_recovery_decide(&f, &v, &d), DT_ACT_RESTART);
    v.step = 140;
    cr_assert_eq(dt_recovery_decide(&f, &v, &d), DT_ACT_RESTART);
    v.step = 120;
    cr_assert_eq(dt_recovery_decide(&f, &v, &d), DT_ACT_FAIL);
    cr_assert_eq(log.n, 2);
}

/* The re-plan on fewer slots keeps the spec's dp and shrinks the ranks
 * per ring: the most workers dp R' below the generation's that fit the
 * slots and that the planner accepts (tiny over 4096 tokens, zigzag: 2 R'
 * must divide 4096, so R' = 3 is skipped). The event names the rings. */
Test(recovery, replan_keeps_the_rings)
{
    static const struct {
        int dp, ranks, slots, want;
    } cases[] = {
        { 1, 4, 3, 2 }, /* R' = 3 does not divide T as zigzag needs */
        { 1, 4, 1, 1 }, { 1, 4, 0, 0 }, { 1, 1, 1, 0 }, /* nothing below one rank */
        { 2, 8, 7, 4 }, /* 2 rings of 3 do not divide T; of 2 do */
        { 2, 8, 6, 4 }, { 2, 8, 3, 2 }, { 2, 8, 1, 0 }, /* one slot holds no two rings */
        { 2, 4, 3, 2 }, { 2, 2, 2, 0 },                 /* fewer than 2 rings of 1: none */
        { 4, 16, 12, 8 },                               /* 4 rings of 3 skipped, of 2 */
    };

    for (size_t i = 0; i < DT_ARRAY_SIZE(cases); i++) {
        dt_spec_t s;
        dt_emsg_t em = { "" };
        char text[256];
        snprintf(text, sizeof(text),
                 "kind = train\nmodel = tiny\ntokens = 4096\ngpu = cpu\nranks = %d\ndp = %d\n",
                 cases[i].ranks / cases[i].dp, cases[i].dp);
        cr_assert_eq(dt_spec_parse("s", text, &s, &em), 0, "%s", em.s);
        int got = dt_recovery_replan(&s, cases[i].ranks, cases[i].slots);
        cr_expect_eq(got, cases[i].want, "dp %d, %d workers on %d slots: %d, want %d",
                     cases[i].dp, cases[i].ranks, cases[i].slots, got, cases[i].want);
        if (got > 0)
            cr_expect_eq(got % cases[i].dp, 0, "dp %d: %d workers", cases[i].dp, got);
        dt_spec_free(&s);
    }

    dt_job_view_t v = { RUNNING, .ranks = 8, .dp = 2, .phase = DT_GEN_ABORTING,
                        .replan_ranks = 4 };
    dt_fault_t f = { .kind = DT_FAULT_SHORT, .rank = -1, .slots = 6 };
    dt_fail_log_t log = { 0 };
    dt_decision_t d;
    v.fails = &log;
    cr_assert_eq(dt_recovery_decide(&f, &v, &d), DT_ACT_REPLAN);
    cr_assert_eq(d.ranks, 4);
    cr_assert_eq(d.nev, 1);
    cr_assert_str_eq(d.ev[0].detail,
                     "ranks 8 -> 4 (dp = 2 rings of 4 -> 2): 6 slots on live agents");
}
