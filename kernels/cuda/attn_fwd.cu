/* SPDX-License-Identifier: MIT
 *
 * Attention forward on tensor cores (see attn_cuda.h for the contract),
 * flash-style: a thread block owns BM = 16 * NW query rows of one head (16
 * per warp, kept in registers as A fragments) and walks the visible key
 * tiles of BN keys, double-buffered in shared memory by cp.async (tile j + 1
 * loads while tile j computes). Per tile and warp: S = Q K^T (16 x BN, fp32),
 * mask, online softmax in the log2 domain, O += P V with P rounded to the
 * input type from registers. The running (m, l, O) lives in registers; the
 * epilogue writes O / l and lse, or merges them into the caller's running
 * state (accumulate = 1) in fp32.
 *
 * Also here: the argument checks and position bounds both directions share.
 * Not here: the backward (attn_bwd.cu), delta, merge and gathers
 * (attn_aux.cu).
 */
#include "config.h"

#include <stdlib.h>
#include <string.h>

#include "kernels/attn_kernel.h"
#include "kernels/cuda/attn_tile.cuh"
#include "kernels/cuda/wgmma.cuh"

using namespace dt_tile;

namespace {

struct fwd_params {
    const void *q, *k, *v;
    int64_t ldq, ldk, ldv;
    float *o;
    int64_t ldo;
    float *lse;
    int64_t ldlse;
    int64_t tq, tk;
    int group; /* h / hkv */
    int causal;
    const int64_t *ilo, *ihi; /* per query row, the key positions [ilo, ihi) it sees; or NULL */
    int accumulate;
    float scale_log2; /* scale * log2(e) */
    tile_pos_t qt, kt; /* query tiles of BM, key tiles of BN */
};

/* The first key tile >= j visible from queries whose positions are at most
 * qmax; ntile when none. */
__device__ __forceinline__ int64_t next_visible(const tile_pos_t &kt, int causal, int64_t j,
                                                int64_t ntile, int64_t qmax)
{
    return causal ? first_tile_le(kt, j, ntile, qmax) : j;
}

/* Every cp.async of this thread landed; with WG, visible to wgmma too. The
 * caller then synchronises the block. */
template <bool WG> __device__ __forceinline__ void tiles_landed()
{
    cp_async_wait_all();
    if constexpr (WG)
        fence_proxy_async();
}

/* WG: the products are warpgroup MMAs (sm_90a, wgmma.cuh; NW a multiple of
 * 4, BN 64 or 128), Q and K/V read from shared memory by descriptor;
 * otherwise mma.sync with Q in registers. Everything else is shared. */
template <int D, int NW, int BN, bool F16, bool WG>
__global__ void __launch_bounds__(NW * 32) fwd_kernel(const fwd_params p)
{
    typedef typename elem_of<F16>::type T;
    constexpr int BM = 16 * NW, NT = NW * 32;
    constexpr int NK = D / 16;  /* k16 chunks of the head dimension */
    constexpr int NS = BN / 8;  /* n8 tiles of scores */
    constexpr int NO = D / 8;   /* n8 tiles of the output */
    static_assert(!WG || (NW % 4 == 0 && (BN == 64 || BN == 128)), "wgmma tile shape");
    /* wgmma tiles and their column blocks on 1024-byte boundaries (the
     * descriptors' base offset is 0); the leading byte offset fits its field */
    static_assert(!WG || ((BM * D * 2) % 1024 == 0 && (BN * D * 2) % 1024 == 0 &&
                          BN * 128 < (1 << 18)),
                  "wgmma tile alignment");
    extern __shared__ __align__(128) unsigned char smem_raw[];
    /* wgmma tiles start on 1024-byte boundaries (the launch adds 1 KiB) */
    unsigned char *smem = smem_raw + (WG ? (1024 - (smem_addr(smem_raw) & 1023)) & 1023 : 0);
    T *sq = (T *)smem;     /* BM x D */
    T *sk = sq + BM * D;   /* 2 x BN x D */
    T *sv = sk + 2 * BN * D; /* 2 x BN x D */

    const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31;
    const int g = lane >> 2, t4 = lane & 3;
    const int hh = blockIdx.y, kvh = hh / p.group;
    const int64_t m0 = (int64_t)blockIdx.x * BM;
    const T *Q = (const T *)p.q + (int64_t)hh * D;
    const T *K = (const T *)p.k + (int64_t)kvh * D;
    const T *V = (const T *)p.v + (int64_t)kvh * D;
    const int64_t ntile = (p.tk + BN - 1) / BN;

    /* my two query rows and their positions */
    const int64_t row0 = m0 + warp * 16 + g, row1 = row0 + 8;
    const int64_t qp0 = row0 < p.tq ? p.qt.pos.at(row0) : INT64_MIN;
    const int64_t qp1 = row1 < p.tq ? p.qt.pos.at(row1) : INT64_MIN;
    int64_t qmin = 0, qmax = 0;
    if (p.causal)
        p.qt.range(blockIdx.x, &qmin, &qmax);
    /* a mask's intervals of my two rows (nothing visible past the end) */
    int64_t lo0 = 0, hi0 = 0, lo1 = 0, hi1 = 0;
    if (p.ilo) {
        if (row0 < p.tq)
            lo0 = __ldg(p.ilo + row0), hi0 = __ldg(p.ihi + row0);
        if (row1 < p.tq)
            lo1 = __ldg(p.ilo + row1), hi1 = __ldg(p.ihi + row1);
    }

    /* with a mask, the key tiles of the tile's interval only */
    int64_t tlo = 0, thi = 0, all[2] = { 0, 0 };
    if (p.ilo)
        rows_interval(p.ilo, p.ihi, m0, m0 + BM < p.tq ? m0 + BM : p.tq, &tlo, &thi, all);
    load_tile<D, BM, NT, WG>(sq, Q, p.ldq, m0, p.tq, tid);
    int64_t j = p.ilo ? first_tile_in(p.kt, 0, ntile, tlo, thi)
                      : next_visible(p.kt, p.causal, 0, ntile, qmax);
    if (j < ntile) {
        load_tile<D, BN, NT, WG>(sk, K, p.ldk, j * BN, p.tk, tid);
        load_tile<D, BN, NT, WG>(sv, V, p.ldv, j * BN, p.tk, tid);
    }
    cp_async_commit();
    tiles_landed<WG>();
    __syncthreads();

    uint32_t qf[WG ? 1 : NK][4];
    if constexpr (!WG) {
#pragma unroll
        for (int kk = 0; kk < NK; kk++)
            ldsm4(qf[kk], sq + a_addr<D>(warp * 16, kk * 16, lane));
    }

    float acc[NO][4];
    zero(acc);
    float mrow[2] = {-INFINITY, -INFINITY}, lrow[2] = {0.f, 0.f};
    int buf = 0;

    while (j < ntile) {
        const int64_t jn = p.ilo ? first_tile_in(p.kt, j + 1, ntile, tlo, thi)
                                 : next_visible(p.kt, p.causal, j + 1, ntile, qmax);
        tiles_landed<WG>();
        __syncthreads(); /* tile j landed; every warp is done with the other buffer */
        if (jn < ntile) {
            load_tile<D, BN, NT, WG>(sk + (buf ^ 1) * BN * D, K, p.ldk, jn * BN, p.tk, tid);
            load_tile<D, BN, NT, WG>(sv + (buf ^ 1) * BN * D, V, p.ldv, jn * BN, p.tk, tid);
        }
        cp_async_commit();

        /* S = Q K^T: 16 x BN per warp */
        const T *ks = sk + buf * BN * D, *vs = sv + buf * BN * D;
        float s[NS][4];
        if constexpr (WG) {
            /* the warpgroup's 64 rows of the Q tile against the K tile */
            const uint32_t qa = smem_addr(sq), ka = smem_addr(ks);
            wg_pin(s);
            wg_fence();
#pragma unroll
            for (int kk = 0; kk < NK; kk++)
                wgmma_ss<BN, F16>(s, wdesc_k<BM>(qa, (warp >> 2) * 64, kk), wdesc_k<BN>(ka, 0, kk),
                                  kk > 0);
            wg_commit();
            wg_wait0();
            wg_pin(s);
        } else {
            zero(s);
            mma_abt<D, NS, F16>(s, qf, ks, lane);
        }

        /* scale to the log2 domain; mask where a key is past the end or
         * in the future of its query */
        int64_t klo, khi;
        p.kt.range(j, &klo, &khi);
        const bool partial = (j + 1) * BN > p.tk;
        /* a mask's tile is cut unless every row sees all of its keys */
        const bool masked = partial || (p.ilo ? !(klo >= all[0] && khi < all[1])
                                              : p.causal && khi > qmin);
#pragma unroll
        for (int n = 0; n < NS; n++) {
#pragma unroll
            for (int e = 0; e < 4; e++) {
                float x = s[n][e] * p.scale_log2;
                if (masked) {
                    const int64_t col = j * BN + n * 8 + t4 * 2 + (e & 1);
                    bool vis = col < p.tk;
                    if (vis && p.ilo) {
                        const int64_t kp = p.kt.pos.at(col);
                        vis = (e >> 1) ? kp >= lo1 && kp < hi1 : kp >= lo0 && kp < hi0;
                    } else if (vis && p.causal) {
                        vis = p.kt.pos.at(col) <= ((e >> 1) ? qp1 : qp0);
                    }
                    if (!vis)
                        x = -INFINITY;
                }
                s[n][e] = x;
            }
        }

        /* online softmax: rows g (e = 0, 1) and g + 8 (e = 2, 3); the four
         * threads of a quad share a row */
#pragma unroll
        for (int r = 0; r < 2; r++) {
            float mx = -INFINITY;
#pragma unroll
            for (int n = 0; n < NS; n++)
                mx = fmaxf(mx, fmaxf(s[n][2 * r], s[n][2 * r + 1]));
            mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 1));
            mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 2));
            const float mnew = fmaxf(mrow[r], mx);
            const float base = mnew == -INFINITY ? 0.f : mnew;
            const float alpha = exp2f(mrow[r] - base);
            mrow[r] = mnew;
            float sum = 0.f;
#pragma unroll
            for (int n = 0; n < NS; n++) {
                s[n][2 * r] = exp2f(s[n][2 * r] - base);
                s[n][2 * r + 1] = exp2f(s[n][2 * r + 1] - base);
                sum += s[n][2 * r] + s[n][2 * r + 1];
            }
            lrow[r] = lrow[r] * alpha + sum;
#pragma unroll
            for (int n = 0; n < NO; n++) {
                acc[n][2 * r] *= alpha;
                acc[n][2 * r + 1] *= alpha;
            }
        }

        /* O += P V */
        if constexpr (WG) {
            /* P as A fragments first: registers an issued product reads
             * must not be rewritten until it completes */
            uint32_t pa[NS / 2][4];
#pragma unroll
            for (int kc = 0; kc < NS / 2; kc++)
                c_to_a<F16, NS>(pa[kc], s, kc);
            const uint32_t va = smem_addr(vs);
            wg_pin(acc); /* the rescaling and the packing before the fence */
            wg_pin(pa);
            wg_fence();
#pragma unroll
            for (int kc = 0; kc < NS / 2; kc++)
                wgmma_rs<D, F16>(acc, pa[kc], wdesc_mn<BN>(va, kc), 1);
            wg_commit();
            wg_wait0();
            wg_pin(acc);
        } else {
            mma_ab<D, NS, F16>(acc, s, vs, lane);
        }
        buf ^= 1;
        j = jn;
    }
    cp_async_wait_all();

    /* epilogue: rows row0 (r = 0) and row1 (r = 1) */
    float lnew[2], inv[2], lold[2] = {-INFINITY, -INFINITY};
#pragma unroll
    for (int r = 0; r < 2; r++) {
        float l = lrow[r];
        l += __shfl_xor_sync(0xffffffffu, l, 1);
        l += __shfl_xor_sync(0xffffffffu, l, 2);
        lnew[r] = l > 0.f ? (mrow[r] + log2f(l)) * DT_LN2 : -INFINITY;
        inv[r] = l > 0.f ? 1.f / l : 0.f;
        const int64_t row = r ? row1 : row0;
        if (p.accumulate && row < p.tq)
            lold[r] = p.lse[(int64_t)hh * p.ldlse + row];
    }
    __syncwarp(); /* every lane read the old lse before one lane writes it */
#pragma unroll
    for (int r = 0; r < 2; r++) {
        const int64_t row = r ? row1 : row0;
        if (row >= p.tq)
            continue;
        float *orow = p.o + row * p.ldo + (int64_t)hh * D + t4 * 2;
        float *lp = p.lse + (int64_t)hh * p.ldlse + row;
        float wo = 0.f, wn = inv[r], lse = lnew[r];
        if (p.accumulate) {
            if (lnew[r] == -INFINITY)
                continue; /* nothing seen: the state stays */
            if (lold[r] != -INFINITY) {
                const float mx = fmaxf(lold[r], lnew[r]);
                float a = expf(lold[r] - mx), b = expf(lnew[r] - mx);
                const float sum = a + b;
                wo = a / sum;
                wn = b / sum * inv[r];
                lse = mx + logf(sum);
            }
        }
#pragma unroll
        for (int n = 0; n < NO; n++) {
            float2 v = make_float2(acc[n][2 * r] * wn, acc[n][2 * r + 1] * wn);
            if (wo != 0.f) {
                const float2 old = *(const float2 *)(orow + n * 8);
                v.x += wo * old.x;
                v.y += wo * old.y;
            }
            *(float2 *)(orow + n * 8) = v;
        }
        if (t4 == 0)
            *lp = lse;
    }
}

/* (min, max) of the positions of each tile; one warp per tile. */
__global__ void bounds_kernel(const int64_t *pos, int64_t n, int tile, int64_t ntile,
                              int64_t *out)
{
    const int64_t i = (int64_t)blockIdx.x * (blockDim.x / 32) + threadIdx.x / 32;
    const int lane = threadIdx.x & 31;
    if (i >= ntile)
        return;
    int64_t lo = INT64_MAX, hi = INT64_MIN;
    const int64_t a = i * tile, b = a + tile < n ? a + tile : n;
    for (int64_t r = a + lane; r < b; r += 32) {
        const int64_t x = pos[r];
        lo = x < lo ? x : lo;
        hi = x > hi ? x : hi;
    }
#pragma unroll
    for (int off = 16; off > 0; off >>= 1) {
        const long long l2 = __shfl_xor_sync(0xffffffffu, (long long)lo, off);
        const long long h2 = __shfl_xor_sync(0xffffffffu, (long long)hi, off);
        lo = l2 < lo ? l2 : lo;
        hi = h2 > hi ? h2 : hi;
    }
    if (lane == 0) {
        out[2 * i] = lo;
        out[2 * i + 1] = hi;
    }
}

template <int D, int NW, int BN, bool F16, bool WG>
int fwd_launch(const fwd_params &p, int64_t nqtile, int h, cudaStream_t st, dt_emsg_t *em)
{
    constexpr int BM = 16 * NW;
    const size_t smem = (size_t)(BM + 4 * BN) * D * 2 + (WG ? 1024 : 0);
    int rc = allow_smem(fwd_kernel<D, NW, BN, F16, WG>, smem, em);
    if (rc)
        return rc;
    dim3 grid((unsigned)nqtile, (unsigned)h);
    fwd_kernel<D, NW, BN, F16, WG><<<grid, NW * 32, smem, st>>>(p);
    DT_CUDA_TRY(em, cudaGetLastError());
    return 0;
}

/* Tile shapes. mma.sync: NW warps of 16 query rows (4 by default, 8 with
 * DT_ATTN_FWD_WARPS=8 in the environment: the same registers per thread,
 * twice the queries sharing each K/V tile, a tuning knob for the GPU
 * benchmark), 64 keys per tile. wgmma (DT_ATTN_KERNEL=wgmma, sm_90
 * only): two warpgroups of 64 rows, 128 keys per tile. */
constexpr int FWD_BN = 64;
constexpr int WG_NW = 8, WG_BN = 128;

static int fwd_warps(void)
{
    static int w; /* a benign race: every thread computes the same value */
    if (w == 0) {
        const char *e = getenv("DT_ATTN_FWD_WARPS");
        w = e != NULL && strcmp(e, "8") == 0 ? 8 : 4;
    }
    return w;
}

/* DT_ATTN_KERNEL=wgmma (kernels/attn_kernel.h) selects the sm_90 warpgroup
 * kernel; otherwise the mma.sync kernel. */
static int fwd_wgmma(void)
{
    return dt_gpu_attn_get() == DT_GPU_ATTN_WGMMA;
}

/* 1 in an image built for sm_90a (NVCC_GENCODE may leave it out: the
 * wgmma kernel would then trap and poison the context). */
__device__ int dt_wgmma_built = DT_WGMMA;

/* The wgmma kernel runs on compute capability 9.0, from an sm_90a image. */
static int check_sm90(dt_emsg_t *em)
{
    int dev = 0, major = 0, minor = 0, built = 0;

    DT_CUDA_TRY(em, cudaGetDevice(&dev));
    DT_CUDA_TRY(em, cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, dev));
    DT_CUDA_TRY(em, cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, dev));
    if (major != 9 || minor != 0)
        return dt_emsg_set(em, DT_EINVAL,
                           "dt_attn_fwd_cuda: DT_ATTN_KERNEL=wgmma needs an sm_90 GPU "
                           "(H100, H200); device %d is sm_%d%d",
                           dev, major, minor);
    DT_CUDA_TRY(em, cudaMemcpyFromSymbol(&built, dt_wgmma_built, sizeof(built)));
    if (!built)
        return dt_emsg_set(em, DT_EINVAL,
                           "dt_attn_fwd_cuda: DT_ATTN_KERNEL=wgmma: this build has no "
                           "sm_90a code (NVCC_GENCODE must include arch=compute_90a,code=sm_90a)");
    return 0;
}

template <int D, bool F16>
int fwd_dispatch(const fwd_params &p, int64_t nq, int h, int nw, bool wg, cudaStream_t st,
                 dt_emsg_t *em)
{
    if (wg)
        return fwd_launch<D, WG_NW, WG_BN, F16, true>(p, nq, h, st, em);
    return nw == 8 ? fwd_launch<D, 8, FWD_BN, F16, false>(p, nq, h, st, em)
                   : fwd_launch<D, 4, FWD_BN, F16, false>(p, nq, h, st, em);
}

} /* namespace */

namespace dt_tile {

int check_args(const dt_attn_cuda_t *a, const char *fn, dt_emsg_t *em)
{
    if (a->d != 64 && a->d != 128)
        return dt_emsg_set(em, DT_EINVAL, "%s: head dimension %d (supported: 64, 128)", fn,
                           a->d);
    if (a->dtype != DT_BF16 && a->dtype != DT_F16)
        return dt_emsg_set(em, DT_EINVAL, "%s: input type %s (supported: bf16, fp16)", fn,
                           dt_dtype_name(a->dtype));
    if (a->tq < 0 || a->tk < 0 || a->h <= 0 || a->hkv <= 0 || a->h % a->hkv != 0)
        return dt_emsg_set(em, DT_EINVAL,
                           "%s: tq=%lld tk=%lld h=%d hkv=%d (need h a multiple of hkv)", fn,
                           (long long)a->tq, (long long)a->tk, a->h, a->hkv);
    if (a->tq > (int64_t)INT32_MAX * 16 || a->tk > (int64_t)INT32_MAX * 16 || a->h > 65535)
        return dt_emsg_set(em, DT_EINVAL, "%s: tq=%lld tk=%lld h=%d exceed the launch grid", fn,
                           (long long)a->tq, (long long)a->tk, a->h);
    struct {
        const char *name;
        const void *ptr;
        int64_t ld, min;
    } t[3] = {{"q", a->q, a->ldq, (int64_t)a->h * a->d},
              {"k", a->k, a->ldk, (int64_t)a->hkv * a->d},
              {"v", a->v, a->ldv, (int64_t)a->hkv * a->d}};
    for (int i = 0; i < 3; i++) {
        if (t[i].ld < t[i].min || t[i].ld % 8 != 0)
            return dt_emsg_set(em, DT_EINVAL,
                               "%s: %s row stride %lld (need >= %lld and a multiple of 8 "
                               "elements)",
                               fn, t[i].name, (long long)t[i].ld, (long long)t[i].min);
        if ((uintptr_t)t[i].ptr % 16 != 0)
            return dt_emsg_set(em, DT_EINVAL, "%s: %s is not 16-byte aligned", fn, t[i].name);
    }
    return 0;
}

int make_bounds(const int64_t *pos, int causal, int64_t n, int tile, int64_t **out,
                cudaStream_t st, dt_emsg_t *em)
{
    *out = NULL;
    if (!causal || pos == NULL || n == 0)
        return 0;
    const int64_t ntile = (n + tile - 1) / tile;
    DT_CUDA_TRY(em, cudaMallocAsync((void **)out, (size_t)ntile * 2 * sizeof(int64_t), st));
    const int per = 8; /* warps per block */
    bounds_kernel<<<(unsigned)((ntile + per - 1) / per), per * 32, 0, st>>>(pos, n, tile, ntile,
                                                                          *out);
    cudaError_t e = cudaGetLastError();
    if (e != cudaSuccess) {
        (void)cudaFreeAsync(*out, st);
        *out = NULL;
        return dt_cuda_err(em, e, "bounds_kernel<<<>>>", __FILE__, __LINE__);
    }
    return 0;
}

int free_bounds(int64_t *b, cudaStream_t st, dt_emsg_t *em)
{
    if (b != NULL)
        DT_CUDA_TRY(em, cudaFreeAsync(b, st));
    return 0;
}

} /* namespace dt_tile */

extern "C" int dt_attn_fwd_cuda(const dt_attn_cuda_t *a, int accumulate, float *o, int64_t ldo,
                                float *lse, int64_t ldlse, cudaStream_t st, dt_emsg_t *em)
{
    const bool wg = fwd_wgmma() != 0;
    const int nw = wg ? WG_NW : fwd_warps(), BM = 16 * nw, BN = wg ? WG_BN : FWD_BN;
    int rc = check_args(a, "dt_attn_fwd_cuda", em);
    if (rc)
        return rc;
    if (wg && (rc = check_sm90(em)) != 0)
        return rc;
    if ((uintptr_t)o % 8 != 0)
        return dt_emsg_set(em, DT_EINVAL, "dt_attn_fwd_cuda: o is not 8-byte aligned");
    if (ldo < (int64_t)a->h * a->d || ldo % 2 != 0 || ldlse < a->tq)
        return dt_emsg_set(em, DT_EINVAL,
                           "dt_attn_fwd_cuda: o row stride %lld (need >= %d, even) or lse "
                           "head stride %lld (need >= %lld)",
                           (long long)ldo, a->h * a->d, (long long)ldlse, (long long)a->tq);
    if (a->tq == 0)
        return 0;

    fwd_params p;
    p.q = a->q;
    p.k = a->k;
    p.v = a->v;
    p.ldq = a->ldq;
    p.ldk = a->ldk;
    p.ldv = a->ldv;
    p.o = o;
    p.ldo = ldo;
    p.lse = lse;
    p.ldlse = ldlse;
    p.tq = a->tq;
    p.tk = a->tk;
    p.group = a->h / a->hkv;
    p.causal = a->causal != 0;
    p.ilo = a->qlo;
    p.ihi = a->qhi;
    p.accumulate = accumulate != 0;
    p.scale_log2 = (a->scale != 0.f ? a->scale : 1.f / sqrtf((float)a->d)) * DT_LOG2E;
    p.qt.pos.p = a->qpos;
    p.qt.pos.base = a->q0;
    p.qt.n = a->tq;
    p.qt.tile = BM;
    p.kt.pos.p = a->kpos;
    p.kt.pos.base = a->k0;
    p.kt.n = a->tk;
    p.kt.tile = BN;

    int64_t *qb = NULL, *kb = NULL;
    /* tile bounds where tiles are skipped by position: causal, or a mask */
    const int bypos = p.causal || a->qlo != NULL;
    rc = make_bounds(a->qpos, bypos, a->tq, BM, &qb, st, em);
    if (rc == 0)
        rc = make_bounds(a->kpos, bypos, a->tk, BN, &kb, st, em);
    p.qt.bounds = qb;
    p.kt.bounds = kb;
    const int64_t nq = (a->tq + BM - 1) / BM;
    if (rc == 0) {
        const bool f16 = a->dtype == DT_F16;
        if (a->d == 64)
            rc = f16 ? fwd_dispatch<64, true>(p, nq, a->h, nw, wg, st, em)
                     : fwd_dispatch<64, false>(p, nq, a->h, nw, wg, st, em);
        else
            rc = f16 ? fwd_dispatch<128, true>(p, nq, a->h, nw, wg, st, em)
                     : fwd_dispatch<128, false>(p, nq, a->h, nw, wg, st, em);
    }
    int rc2 = free_bounds(qb, st, rc ? NULL : em);
    int rc3 = free_bounds(kb, st, rc || rc2 ? NULL : em);
    return rc ? rc : rc2 ? rc2 : rc3;
}
