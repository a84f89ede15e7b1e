/* SPDX-License-Identifier: MIT
 *
 * Recovery decisions that are pure functions of what happened, so each
 * rule can be tested row by row without a coordinator: when a repeated
 * failure is deterministic (a bug or bad input that no restart gets past)
 * rather than bad luck (a killed process, a lost node, a preemption).
 *
 * The rule (dt-spec(5) repeat_failures, repeat_startup_failures): a
 * failure is the triple (rank, cause, step) plus whether it came before
 * the generation's first completed step. The rank is -1 for a failure of
 * every rank (an engine exit status the ranks agree on), since which
 * rank's report arrives first is chance. The job fails as deterministic
 * when the same failure has been seen repeat_failures times (default 2)
 * mid-run, or repeat_startup_failures times (default 3) at start-up.
 * Start-up failures are counted apart because external faults cluster
 * there: a node being drained, a killed process, a burst of faults each
 * landing on a fresh generation all fail "at the resume step", and that
 * is no evidence of a bug. A different rank, cause or step is a different
 * failure. The restart budget (max_restarts) bounds everything else.
 *
 * Not here: acting on the verdict (run.c), the Slurm side (alloc.c).
 */
#ifndef DT_RECOVERY_H
#define DT_RECOVERY_H

#include <stdbool.h>
#include <stdint.h>

#define DT_REPEAT_FAILURES_DEFAULT 2
#define DT_REPEAT_STARTUP_FAILURES_DEFAULT 3
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

#endif /* DT_RECOVERY_H */
