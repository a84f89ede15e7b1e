/* SPDX-License-Identifier: MIT
 *
 * IEEE binary16 (fp16) and bfloat16 (bf16) to and from binary32, in plain
 * bit arithmetic: no libm, no CUDA, the same on every host, so the .npy
 * writer, the GPU uploads and the tests that check the device's own casts
 * all round through this one definition.
 *
 * float -> 16 bits rounds to nearest, ties to even; fp16 overflows to
 * infinity (65520 and up; 65504 is the largest finite), goes through the
 * subnormals (units of 2^-24) to a signed zero; a NaN stays a NaN (the top
 * payload bits are kept, the quiet bit set when none survive). 16 bits ->
 * float is exact.
 */
#ifndef DT_HALF_H
#define DT_HALF_H

#include <stdint.h>

uint16_t dt_f32_to_f16(float f);
float dt_f16_to_f32(uint16_t h);
uint16_t dt_f32_to_bf16(float f);
float dt_bf16_to_f32(uint16_t b);

#endif /* DT_HALF_H */
