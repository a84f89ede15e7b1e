/* SPDX-License-Identifier: MIT
 *
 * The CUDA edge: error translation and device discovery (cuda_err.h), and
 * the element types of the kernels (attn_cuda.h), including their host-side
 * rounding (common/half.h: plain bit arithmetic, independent of CUDA's own
 * conversions, so that tests can check the device casts against it). Plain
 * C on the runtime API (no device code), so the ring's schedule test links
 * it against its host simulator of the runtime (tests/gpu/sim) as well as
 * the real one.
 */
#include "config.h"

#include <stdint.h>
#include <string.h>

#include "common/half.h"
#include "kernels/cuda/attn_cuda.h"
#include "kernels/cuda/cuda_err.h"

int dt_cuda_err(dt_emsg_t *em, cudaError_t e, const char *call, const char *file,
                           int line)
{
    const char *base = strrchr(file, '/');
    /* out of device memory is the job's size, not the GPU's fault: it
     * would fail the same on any node (not DT_EDEVICE, which makes the
     * node suspect: dtengine(1) exit 7) */
    int code = e == cudaErrorMemoryAllocation ? DT_ENOMEM : DT_EDEVICE;

    return dt_emsg_set(em, code, "%s:%d: %s: %s: %s", base ? base + 1 : file, line, call,
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

/*-- host rounding (common/half.c) ---------------------------------------*/

uint16_t dt_half_bits(dt_dtype_t t, float f)
{
    return t == DT_BF16 ? dt_f32_to_bf16(f) : dt_f32_to_f16(f);
}

float dt_half_value(dt_dtype_t t, uint16_t h)
{
    return t == DT_BF16 ? dt_bf16_to_f32(h) : dt_f16_to_f32(h);
}
