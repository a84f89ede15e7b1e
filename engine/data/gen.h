/* SPDX-License-Identifier: MIT
 *
 * Deterministic generated inputs: element i of tensor `stream` under `seed`
 * is a function of (seed, stream, i) alone (a counter-based generator), so
 * any rank can make exactly its own rows and the inputs do not depend on
 * the rank count or layout.
 */
#ifndef DT_GEN_H
#define DT_GEN_H

#include <stdint.h>

/* Standard normal values for flat indices [first, first + n) into dst. */
void dt_gen_normal(uint64_t seed, uint64_t stream, int64_t first, int64_t n, float *dst);

/* Uniform in [0, 1) for one index (64-bit mix of seed, stream, index). */
double dt_gen_uniform(uint64_t seed, uint64_t stream, uint64_t index);

#endif /* DT_GEN_H */
