/* SPDX-License-Identifier: MIT
 *
 * The pieces the flash-attention kernels (attn_fwd.cu, attn_bwd.cu) are
 * built from: warp-level tensor-core products (mma.sync m16n8k16, bf16 or
 * fp16 in, fp32 accumulate), ldmatrix loads from swizzled shared-memory
 * tiles, cp.async copies of (rows, d) tiles, positions and causal masks,
 * and the argument checks both launchers share. Works on sm_80 and later.
 *
 * Fragment layouts (PTX ISA, mma.m16n8k16; g = lane / 4, t = lane % 4):
 *   A 16x16 (row-major), 4 regs of 2 elements: (g, 2t..2t+1),
 *     (g+8, 2t..), (g, 8+2t..), (g+8, 8+2t..).
 *   B 16x8 (k x n, "col"), 2 regs: (k = 2t..2t+1, n = g), (k = 8+2t.., n = g).
 *   C 16x8 fp32, 4 floats: (g, 2t), (g, 2t+1), (g+8, 2t), (g+8, 2t+1).
 * So two adjacent n8 tiles of a C result are, packed to 16 bits, exactly the
 * A fragment of one k16 chunk: a score tile feeds the next product from
 * registers with no shared-memory round trip.
 *
 * Shared tiles hold rows of d elements (d = 64 or 128) in 16-byte chunks;
 * chunk c of row r is stored at chunk c ^ (r & 7), so the 8 row addresses
 * of one ldmatrix phase fall in 8 different bank groups.
 *
 * Not here: the kernels and their launchers.
 */
#ifndef DT_KERNELS_CUDA_ATTN_TILE_CUH
#define DT_KERNELS_CUDA_ATTN_TILE_CUH

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <math.h>
#include <stdint.h>
#include <string.h>

#include "kernels/cuda/attn_cuda.h"
#include "kernels/cuda/cuda_err.h"

namespace dt_tile {

#define DT_LOG2E 1.4426950408889634f
#define DT_LN2 0.6931471805599453f

template <bool F16> struct elem_of;
template <> struct elem_of<false> {
    typedef __nv_bfloat16 type;
};
template <> struct elem_of<true> {
    typedef __half type;
};

__device__ __forceinline__ uint32_t smem_addr(const void *p)
{
    return (uint32_t)__cvta_generic_to_shared(p);
}

/* 16 bytes global -> shared, asynchronously; zero-filled when !valid (src
 * is then not read but must be a mapped address). */
__device__ __forceinline__ void cp_async16(void *dst, const void *src, bool valid)
{
    unsigned n = valid ? 16u : 0u;
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(smem_addr(dst)),
                 "l"(src), "r"(n));
}

__device__ __forceinline__ void cp_async_commit()
{
    asm volatile("cp.async.commit_group;\n" ::);
}

__device__ __forceinline__ void cp_async_wait_all()
{
    asm volatile("cp.async.wait_group 0;\n" ::: "memory");
}

/* Four 8x8 b16 matrices; lane l gives the row address of matrix l / 8. */
__device__ __forceinline__ void ldsm4(uint32_t r[4], const void *p)
{
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(smem_addr(p)));
}

/* The same, each matrix transposed on the way. */
__device__ __forceinline__ void ldsm4t(uint32_t r[4], const void *p)
{
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0, %1, %2, %3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(smem_addr(p)));
}

/* c (16x8 fp32) += a (16x16) * b (16x8). */
template <bool F16>
__device__ __forceinline__ void mma(float c[4], const uint32_t a[4], uint32_t b0, uint32_t b1);

template <>
__device__ __forceinline__ void mma<false>(float c[4], const uint32_t a[4], uint32_t b0,
                                           uint32_t b1)
{
    asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 "
                 "{%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, {%0, %1, %2, %3};\n"
                 : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

template <>
__device__ __forceinline__ void mma<true>(float c[4], const uint32_t a[4], uint32_t b0,
                                          uint32_t b1)
{
    asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 "
                 "{%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, {%0, %1, %2, %3};\n"
                 : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

/* Two floats rounded to the input type, lo in the low half. */
template <bool F16> __device__ __forceinline__ uint32_t pack2(float lo, float hi);

template <> __device__ __forceinline__ uint32_t pack2<false>(float lo, float hi)
{
    __nv_bfloat162 v = __floats2bfloat162_rn(lo, hi);
    uint32_t u;
    memcpy(&u, &v, 4);
    return u;
}

template <> __device__ __forceinline__ uint32_t pack2<true>(float lo, float hi)
{
    __half2 v = __floats2half2_rn(lo, hi);
    uint32_t u;
    memcpy(&u, &v, 4);
    return u;
}

/* The A fragment of key chunk kc (16 columns) from a C-layout tile s of n8
 * tiles: tiles 2 kc and 2 kc + 1. */
template <bool F16, int NT8>
__device__ __forceinline__ void c_to_a(uint32_t a[4], const float (&s)[NT8][4], int kc)
{
    a[0] = pack2<F16>(s[2 * kc][0], s[2 * kc][1]);
    a[1] = pack2<F16>(s[2 * kc][2], s[2 * kc][3]);
    a[2] = pack2<F16>(s[2 * kc + 1][0], s[2 * kc + 1][1]);
    a[3] = pack2<F16>(s[2 * kc + 1][2], s[2 * kc + 1][3]);
}

/* Zero an array of C fragments. */
template <int N> __device__ __forceinline__ void zero(float (&c)[N][4])
{
#pragma unroll
    for (int n = 0; n < N; n++)
        c[n][0] = c[n][1] = c[n][2] = c[n][3] = 0.f;
}

/* Element offset of (row, col) in a swizzled tile of rows of D elements. */
template <int D> __device__ __forceinline__ int swz(int row, int col)
{
    return row * D + ((((col >> 3) ^ (row & 7))) << 3) + (col & 7);
}

/* Element offset of (row, col) in a wgmma tile of ROWS rows (wgmma.cuh):
 * column blocks of 64 elements, each [ROWS][128 bytes], chunks swizzled as
 * in swz. */
template <int ROWS> __device__ __forceinline__ int wswz(int row, int col)
{
    return (col >> 6) * ROWS * 64 + row * 64 + ((((col >> 3) & 7) ^ (row & 7)) << 3) + (col & 7);
}

/* Copy rows [r0, r0 + ROWS) of one head of a (n, heads, D) tensor (g points
 * at the head, rows ld elements apart) into a swizzled tile (WG: wgmma's
 * layout, wswz); rows >= n are zero-filled. All NT threads of the block
 * call it. */
template <int D, int ROWS, int NT, bool WG = false, typename T>
__device__ __forceinline__ void load_tile(T *s, const T *g, int64_t ld, int64_t r0, int64_t n,
                                          int tid)
{
    constexpr int CH = D / 8;
    for (int i = tid; i < ROWS * CH; i += NT) {
        int r = i / CH, c = i % CH;
        int64_t gr = r0 + r;
        bool ok = gr < n;
        cp_async16(s + (WG ? wswz<ROWS>(r, c * 8) : swz<D>(r, c * 8)),
                   g + (ok ? gr : 0) * ld + c * 8, ok);
    }
}

/* ldmatrix address of lane for the A fragment of rows [r0, r0 + 16), columns
 * [c0, c0 + 16) (also the non-transposed load of two B n8 tiles is the same
 * tile read as rows = n, see b_addr). */
template <int D> __device__ __forceinline__ int a_addr(int r0, int c0, int lane)
{
    return swz<D>(r0 + (lane & 15), c0 + (lane >> 4) * 8);
}

/* Non-transposed B: a tile stored as [n][k] (rows = n). One ldsm4 gives the
 * B fragments of n tiles [n0, n0+8) (r[0], r[1]) and [n0+8, n0+16) (r[2],
 * r[3]) for k chunk [k0, k0 + 16). */
template <int D> __device__ __forceinline__ int bn_addr(int n0, int k0, int lane)
{
    return swz<D>(n0 + (lane & 7) + (lane >> 4) * 8, k0 + ((lane >> 3) & 1) * 8);
}

/* Transposed B: a tile stored as [k][n] (rows = k). One ldsm4t gives the B
 * fragments of n tiles [n0, n0+8) (r[0], r[1]) and [n0+8, n0+16) (r[2],
 * r[3]) for k chunk [k0, k0 + 16). */
template <int D> __device__ __forceinline__ int bt_addr(int k0, int n0, int lane)
{
    return swz<D>(k0 + (lane & 7) + ((lane >> 3) & 1) * 8, n0 + (lane >> 4) * 8);
}

/* The two warp products every kernel is made of. A warp owns 16 rows.
 *
 * mma_abt: c (16 x 8 NC) += A B^T, A the warp's 16 rows of length D (af:
 * A fragments in registers), B the tile bs of 8 NC rows of D stored
 * [row][D] (scores Q K^T, dP = dO V^T, and their transposes). */
template <int D, int NC, bool F16, typename T>
__device__ __forceinline__ void mma_abt(float (&c)[NC][4], const uint32_t (&af)[D / 16][4],
                                        const T *bs, int lane)
{
#pragma unroll
    for (int kk = 0; kk < D / 16; kk++) {
#pragma unroll
        for (int nb = 0; nb < NC / 2; nb++) {
            uint32_t b[4];
            ldsm4(b, bs + bn_addr<D>(nb * 16, kk * 16, lane));
            mma<F16>(c[2 * nb], af[kk], b[0], b[1]);
            mma<F16>(c[2 * nb + 1], af[kk], b[2], b[3]);
        }
    }
}

/* The same with A read from the shared tile as (rows [r0, r0 + 16) of D),
 * one k16 chunk at a time (for kernels without registers to hold A). */
template <int D, int NC, bool F16, typename T>
__device__ __forceinline__ void mma_abt_s(float (&c)[NC][4], const T *as, int r0, const T *bs,
                                          int lane)
{
#pragma unroll
    for (int kk = 0; kk < D / 16; kk++) {
        uint32_t a[4];
        ldsm4(a, as + a_addr<D>(r0, kk * 16, lane));
#pragma unroll
        for (int nb = 0; nb < NC / 2; nb++) {
            uint32_t b[4];
            ldsm4(b, bs + bn_addr<D>(nb * 16, kk * 16, lane));
            mma<F16>(c[2 * nb], a, b[0], b[1]);
            mma<F16>(c[2 * nb + 1], a, b[2], b[3]);
        }
    }
}

/* mma_ab: c (16 x D) += P B, P the warp's 16 x 8 NS tile of C fragments
 * (rounded to the input type on the way), B the tile bs of 8 NS rows of D
 * stored [row][D] (O += P V, dQ += dS K, dV += P^T dO, dK += dS^T Q). */
template <int D, int NS, bool F16, typename T>
__device__ __forceinline__ void mma_ab(float (&c)[D / 8][4], const float (&p)[NS][4], const T *bs,
                                       int lane)
{
#pragma unroll
    for (int kc = 0; kc < NS / 2; kc++) {
        uint32_t a[4];
        c_to_a<F16, NS>(a, p, kc);
#pragma unroll
        for (int nb = 0; nb < D / 16; nb++) {
            uint32_t b[4];
            ldsm4t(b, bs + bt_addr<D>(kc * 16, nb * 16, lane));
            mma<F16>(c[2 * nb], a, b[0], b[1]);
            mma<F16>(c[2 * nb + 1], a, b[2], b[3]);
        }
    }
}

/* dst[8 n + {0, 1}] += scale * c[n][2 r + {0, 1}] for every n: adds row r
 * (0: g, 1: g + 8) of a lane's C fragments into an fp32 row; dst points at
 * the lane's first column, 2 (lane % 4), and must be 8-byte aligned. */
template <int NO>
__device__ __forceinline__ void add_row(float *dst, const float (&c)[NO][4], int r, float scale)
{
#pragma unroll
    for (int n = 0; n < NO; n++) {
        float2 v = *(float2 *)(dst + n * 8);
        v.x += scale * c[n][2 * r];
        v.y += scale * c[n][2 * r + 1];
        *(float2 *)(dst + n * 8) = v;
    }
}

/* Positions: an array when given, else base + index. */
struct pos_t {
    const int64_t *p;
    int64_t base;
    __device__ __forceinline__ int64_t at(int64_t i) const
    {
        return p ? __ldg(p + i) : base + i;
    }
};

/* Range [lo, hi] of positions of tile i (rows i*tile ..), from the bounds
 * array when positions are an array. */
struct tile_pos_t {
    pos_t pos;
    const int64_t *bounds; /* 2 per tile, or NULL when pos.p is NULL */
    int64_t n;
    int tile;
    __device__ __forceinline__ void range(int64_t i, int64_t *lo, int64_t *hi) const
    {
        if (bounds) {
            *lo = __ldg(bounds + 2 * i);
            *hi = __ldg(bounds + 2 * i + 1);
        } else {
            int64_t a = i * tile, b = a + tile < n ? a + tile : n;
            *lo = pos.base + a;
            *hi = pos.base + b - 1;
        }
    }
};

/* The first tile >= j of kt whose smallest position is at most qmax (keys a
 * query at qmax can see); ntile when none. Every lane of the warp calls it
 * with the same arguments. By offset the visible tiles are a prefix; with
 * arrays the warp tests 32 tiles per step. */
__device__ __forceinline__ int64_t first_tile_le(const tile_pos_t &kt, int64_t j, int64_t ntile,
                                                 int64_t qmax)
{
    if (kt.bounds == NULL) {
        if (qmax < kt.pos.base)
            return ntile;
        const int64_t last = (qmax - kt.pos.base) / kt.tile;
        return j <= last ? j : ntile;
    }
    const int lane = threadIdx.x & 31;
    for (int64_t b = j; b < ntile; b += 32) {
        const int64_t t = b + lane;
        const bool vis = t < ntile && __ldg(kt.bounds + 2 * t) <= qmax;
        const unsigned m = __ballot_sync(0xffffffffu, vis);
        if (m)
            return b + __ffs((int)m) - 1;
    }
    return ntile;
}

/* The first tile >= j of kt holding a position in [lo, hi) (a mask's
 * interval of keys for a query tile); ntile when none. Positions ascend
 * along the tiles, so the search stops at the first tile past hi. Every
 * thread calls it with the same arguments. */
__device__ __forceinline__ int64_t first_tile_in(const tile_pos_t &kt, int64_t j, int64_t ntile,
                                                 int64_t lo, int64_t hi)
{
    for (; j < ntile; j++) {
        int64_t a, b;
        kt.range(j, &a, &b);
        if (a >= hi)
            return ntile;
        if (b >= lo)
            return j;
    }
    return ntile;
}

/* A mask's interval of keys of query rows [r0, r1) (r1 > r0): from the
 * first row's lo to the last's hi (both ascend along the rows); with
 * common (may be NULL) the keys every row sees, [last lo, first hi)
 * (empty when lo >= hi). */
__device__ __forceinline__ void rows_interval(const int64_t *ilo, const int64_t *ihi, int64_t r0,
                                              int64_t r1, int64_t *lo, int64_t *hi,
                                              int64_t *common = nullptr)
{
    *lo = __ldg(ilo + r0);
    *hi = __ldg(ihi + r1 - 1);
    if (common) {
        common[0] = __ldg(ilo + r1 - 1);
        common[1] = __ldg(ihi + r0);
    }
}

/* The first tile >= i of qt whose largest position is at least kmin
 * (queries that can see a key at kmin); ntile when none. By offset the
 * visible tiles are a suffix (the last, shorter tile may be taken though
 * it sees nothing: its elements are masked). */
__device__ __forceinline__ int64_t first_tile_ge(const tile_pos_t &qt, int64_t i, int64_t ntile,
                                                 int64_t kmin)
{
    if (qt.bounds == NULL) {
        const int64_t x = kmin - qt.pos.base + 1 - qt.tile;
        const int64_t first = x <= 0 ? 0 : (x + qt.tile - 1) / qt.tile;
        return i >= first ? i : first < ntile ? first : ntile;
    }
    const int lane = threadIdx.x & 31;
    for (int64_t b = i; b < ntile; b += 32) {
        const int64_t t = b + lane;
        const bool vis = t < ntile && __ldg(qt.bounds + 2 * t + 1) >= kmin;
        const unsigned m = __ballot_sync(0xffffffffu, vis);
        if (m)
            return b + __ffs((int)m) - 1;
    }
    return ntile;
}

/* Host side (attn_fwd.cu): the (min, max) position of each tile of `tile`
 * rows of n, 2 int64 per tile, in stream-ordered scratch; *out = NULL when
 * not needed (not causal, or positions by offset). Free with free_bounds. */
int make_bounds(const int64_t *pos, int causal, int64_t n, int tile, int64_t **out,
                cudaStream_t st, dt_emsg_t *em);
int free_bounds(int64_t *b, cudaStream_t st, dt_emsg_t *em);

/* Host side: the checks both launchers share (shapes, d, alignment). */
int check_args(const dt_attn_cuda_t *a, const char *fn, dt_emsg_t *em);

/* Opt a kernel into more than 48 KiB of dynamic shared memory. */
template <typename K> int allow_smem(K kernel, size_t bytes, dt_emsg_t *em)
{
    DT_CUDA_TRY(em, cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                         (int)bytes));
    return 0;
}

} /* namespace dt_tile */

#endif /* DT_KERNELS_CUDA_ATTN_TILE_CUH */
