/* SPDX-License-Identifier: MIT
 *
 * CLOCK_MONOTONIC and CLOCK_REALTIME in the units callers use (see
 * clock.h).
 */
#include "config.h"

#include "common/clock.h"

double dt_clock_now(void)
{
    struct timespec ts;

    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static int64_t ms_of(clockid_t id)
{
    struct timespec ts;

    clock_gettime(id, &ts);
    return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

int64_t dt_clock_mono_ms(void)
{
    return ms_of(CLOCK_MONOTONIC);
}

int64_t dt_clock_mono_ns(void)
{
    struct timespec ts;

    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000000000 + ts.tv_nsec;
}

int64_t dt_clock_wall_ms(void)
{
    return ms_of(CLOCK_REALTIME);
}

void dt_clock_deadline(struct timespec *ts, int64_t ms)
{
    clock_gettime(CLOCK_MONOTONIC, ts);
    ts->tv_sec += (time_t)(ms / 1000);
    ts->tv_nsec += (long)(ms % 1000) * 1000000L;
    if (ts->tv_nsec >= 1000000000L) {
        ts->tv_sec++;
        ts->tv_nsec -= 1000000000L;
    }
}
