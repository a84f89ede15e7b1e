/* SPDX-License-Identifier: MIT
 *
 * The deterministic-failure rule (coordinator/recovery.h), one row per
 * case: a sequence of failures of one job and, after each, whether the
 * job would now fail as deterministic. The rows are the histories the
 * coordinator meets: a bug that fails at the same step every time (mid-run
 * or at start-up), a burst of external kills (one mid-run, then one at the
 * start of each new generation), the same cause at different steps or on
 * different ranks, and the job's own limits from its spec.
 */
#include <criterion/criterion.h>
#include <stdio.h>

#include "coordinator/recovery.h"

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
    for (size_t r = 0; r < sizeof(rows) / sizeof(rows[0]); r++) {
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
