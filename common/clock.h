/* SPDX-License-Identifier: MIT
 *
 * Clocks, one definition each. Monotonic time (CLOCK_MONOTONIC, from an
 * arbitrary origin, never stepped) for measurements, timeouts and
 * deadlines: seconds as a double, or whole milliseconds; and wall-clock
 * milliseconds since the epoch (CLOCK_REALTIME) for what is stored or
 * shown as a date.
 */
#ifndef DT_CLOCK_H
#define DT_CLOCK_H

#include <stdint.h>
#include <time.h>

/* Monotonic seconds. */
double dt_clock_now(void);
/* Monotonic milliseconds (the same clock as uv_hrtime() / 1000000). */
int64_t dt_clock_mono_ms(void);
/* Monotonic nanoseconds. */
int64_t dt_clock_mono_ns(void);
/* Wall-clock milliseconds since the epoch. */
int64_t dt_clock_wall_ms(void);
/* The monotonic time ms milliseconds from now, for pthread_cond_timedwait
 * on a condition variable whose clock is CLOCK_MONOTONIC. */
void dt_clock_deadline(struct timespec *ts, int64_t ms);

#endif /* DT_CLOCK_H */
