/* SPDX-License-Identifier: MIT
 *
 * The CUDA edge: error translation and device discovery (cuda_err.h), and
 * the element types of the kernels (attn_cuda.h), including their host-side
 * rounding: plain bit arithmetic, independent of CUDA's own conversions, so
 * that tests can check the device casts against it. Plain C on the runtime
 * API (no device code), so the ring's schedule test links it against its
 * host simulator of the runtime (tests/gpu/sim) as well as the real one.
 */
#include "config.h"

#include <math.h>
#include <stdint.h>
#include <string.h>

#include "kernels/cuda/attn_cuda.h"
#include "kernels/cuda/cuda_err.h"

int dt_cuda_err(dt_emsg_t *em, cudaError_t e, const char *call, const char *file,
                           int line)
{
    const char *base = strrchr(file, '/');

    return dt_emsg_set(em, DT_EDEVICE, "%s:%d: %s: %s: %s", base ? base + 1 : file, line, call,
                       cudaGetErrorName(e), cudaGetErrorString(e));
}

int dt_cuda_devices(dt_emsg_t *em)
{
    int n = 0;
    cudaError_t e = cudaGetDeviceCount(&n);

    if (e != cudaSuccess) {
        (void)cudaGetLastError(); /* not sticky: clear it */
        dt_emsg_set(em, DT_EDEVICE, "cudaGetDeviceCount: %s: %s", cudaGetErrorName(e),
                    cudaGetErrorString(e));
        return 0;
    }
    if (n == 0)
        dt_emsg_set(em, DT_EDEVICE, "cudaGetDeviceCount: no device");
    return n;
}

/*-- host rounding ----------------------------------------------------------*/

static uint16_t bf16_bits(float f)
{
    uint32_t x;
    memcpy(&x, &f, sizeof x);
    if ((x & 0x7fffffffu) > 0x7f800000u)
        return (uint16_t)((x >> 16) | 0x0040u); /* NaN stays a (quiet) NaN */
    x += 0x7fffu + ((x >> 16) & 1u);            /* to nearest, ties to even */
    return (uint16_t)(x >> 16);
}

static float bf16_value(uint16_t b)
{
    uint32_t x = (uint32_t)b << 16;
    float f;
    memcpy(&f, &x, sizeof f);
    return f;
}

static uint16_t f16_bits(float f)
{
    uint32_t x, ax, sign;
    memcpy(&x, &f, sizeof x);
    sign = (x >> 16) & 0x8000u;
    ax = x & 0x7fffffffu;
    if (ax > 0x7f800000u)
        return (uint16_t)(sign | 0x7e00u); /* NaN */
    if (ax >= 0x477ff000u)
        return (uint16_t)(sign | 0x7c00u); /* >= 65520 rounds to infinity */
    if (ax < 0x38800000u) {
        /* below 2^-14: a subnormal in units of 2^-24; the scaling is exact
         * and lrintf rounds to nearest even (the default mode) */
        float a;
        memcpy(&a, &ax, sizeof a);
        return (uint16_t)(sign | (uint32_t)lrintf(a * 16777216.0f));
    }
    uint32_t h = ((((ax >> 23) - 127 + 15) << 10) | ((ax & 0x7fffffu) >> 13));
    uint32_t rest = ax & 0x1fffu;
    if (rest > 0x1000u || (rest == 0x1000u && (h & 1u)))
        h++; /* a carry into the exponent is right, also up to 65504 */
    return (uint16_t)(sign | h);
}

static float f16_value(uint16_t b)
{
    uint32_t sign = (uint32_t)(b & 0x8000u) << 16, e = (b >> 10) & 0x1fu, m = b & 0x3ffu, x;
    float f;
    if (e == 0) {
        f = ldexpf((float)m, -24);
        return sign ? -f : f;
    }
    if (e == 31)
        x = sign | 0x7f800000u | (m << 13);
    else
        x = sign | ((e - 15 + 127) << 23) | (m << 13);
    memcpy(&f, &x, sizeof f);
    return f;
}

uint16_t dt_half_bits(dt_dtype_t t, float f)
{
    return t == DT_BF16 ? bf16_bits(f) : f16_bits(f);
}

float dt_half_value(dt_dtype_t t, uint16_t h)
{
    return t == DT_BF16 ? bf16_value(h) : f16_value(h);
}
