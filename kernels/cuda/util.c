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
#include <stdlib.h>
#include <string.h>

#include "common/half.h"
#include "common/mem.h"
#include "kernels/cuda/attn_cuda.h"
#include "kernels/cuda/cuda_err.h"
#include "kernels/cuda/train_cuda.h"

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

/* ---- the embedding's grouping (train_cuda.h) ---- */

static int cmp_pair(const void *a, const void *b)
{
    const int64_t x = *(const int64_t *)a, y = *(const int64_t *)b;
    return (x > y) - (x < y);
}

void dt_embed_groups(int64_t T, const int32_t *tok, int64_t *nu, int32_t *tok_out,
                     int64_t *start, int32_t *rows)
{
    /* (token, row) packed in one int64 sorts by token, then row */
    int64_t *key = dt_xmallocarray((size_t)(T > 0 ? T : 1), sizeof(int64_t));
    int64_t u = 0;

    for (int64_t t = 0; t < T; t++)
        key[t] = ((int64_t)tok[t] << 32) | t;
    qsort(key, (size_t)T, sizeof(int64_t), cmp_pair);
    for (int64_t i = 0; i < T; i++) {
        const int32_t k = (int32_t)(key[i] >> 32);
        if (i == 0 || k != tok_out[u - 1]) {
            tok_out[u] = k;
            start[u++] = i;
        }
        rows[i] = (int32_t)(key[i] & 0xffffffff);
    }
    start[u] = T;
    *nu = u;
    free(key);
}
