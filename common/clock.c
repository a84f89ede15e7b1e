/* SPDX-License-Identifier: MIT
 *
 * dt_clock_now: CLOCK_MONOTONIC in seconds.
 */
#include "config.h"

#include <time.h>

#include "common/clock.h"

double dt_clock_now(void)
{
    struct timespec ts;

    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}
