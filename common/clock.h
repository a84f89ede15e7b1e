/* SPDX-License-Identifier: MIT
 *
 * Monotonic time for measurements and timeouts: seconds as a double from an
 * arbitrary origin (CLOCK_MONOTONIC). Not wall-clock time.
 */
#ifndef DT_CLOCK_H
#define DT_CLOCK_H

double dt_clock_now(void);

#endif /* DT_CLOCK_H */
