/* SPDX-License-Identifier: MIT
 *
 * Launch shapes of the plain (memory-bound) kernels of attn_aux.cu and
 * layers_cuda.cu: THREADS per block, one warp per row where a row is
 * reduced (WARPS rows per block), a grid capped at MAX_BLOCKS blocks with
 * every kernel striding over the rest, and the warp sum they reduce with.
 *
 * Not here: the tensor-core kernels' tiles (attn_tile.cuh).
 */
#ifndef DT_KERNELS_CUDA_GRID_CUH
#define DT_KERNELS_CUDA_GRID_CUH

#include <stdint.h>

enum {
    THREADS = 256,        /* threads per block */
    WARPS = THREADS / 32, /* rows per block of the warp-per-row kernels */
};
static const int64_t MAX_BLOCKS = 1 << 16;

/* Blocks for `units` work items at `per_block` items per block. */
static inline unsigned int grid_for(int64_t units, int64_t per_block)
{
    int64_t b = (units + per_block - 1) / per_block;

    return (unsigned int)(b < 1 ? 1 : b > MAX_BLOCKS ? MAX_BLOCKS : b);
}

/* Sum over the 32 lanes of a warp; every lane gets the sum. All 32 lanes
 * must call it (the callers' loops are uniform across the warp). */
static __device__ __forceinline__ float warp_sum(float v)
{
    for (int o = 16; o > 0; o /= 2)
        v += __shfl_xor_sync(0xffffffffu, v, o);
    return v;
}

#endif /* DT_KERNELS_CUDA_GRID_CUH */
