/* SPDX-License-Identifier: MIT
 *
 * The deterministic-failure rule (recovery.h): counting identical
 * failures and judging them. Pure: no coordinator, no database, no clock.
 */
#include "config.h"

#include <stdio.h>
#include <string.h>

#include "coordinator/recovery.h"

static bool same(const dt_fail_entry_t *e, const dt_failure_t *f)
{
    return e->rank == f->rank && e->step == f->step && e->startup == f->startup &&
           strncmp(e->cause, f->cause ? f->cause : "", sizeof(e->cause) - 1) == 0;
}

int dt_recovery_note(dt_fail_log_t *log, const dt_failure_t *f)
{
    for (int i = 0; i < log->n; i++)
        if (same(&log->v[i], f))
            return ++log->v[i].count;
    if (log->n == DT_FAIL_LOG_MAX) { /* bounded: forget the oldest */
        memmove(&log->v[0], &log->v[1], (DT_FAIL_LOG_MAX - 1) * sizeof(log->v[0]));
        log->n--;
    }
    dt_fail_entry_t *e = &log->v[log->n++];
    e->rank = f->rank;
    snprintf(e->cause, sizeof(e->cause), "%s", f->cause ? f->cause : "");
    e->step = f->step;
    e->startup = f->startup;
    e->count = 1;
    return 1;
}

bool dt_recovery_deterministic(const dt_failure_t *f, int count, int64_t repeat,
                               int64_t repeat_startup)
{
    int64_t limit = f->startup ? (repeat_startup > 0 ? repeat_startup
                                                     : DT_REPEAT_STARTUP_FAILURES_DEFAULT)
                               : (repeat > 0 ? repeat : DT_REPEAT_FAILURES_DEFAULT);
    return count >= limit;
}
