/* SPDX-License-Identifier: MIT
 *
 * Attention backward on tensor cores (see attn_cuda.h for the contract), as
 * two kernels so that every gradient is reduced in a fixed order with no
 * atomics (the same inputs give the same bits):
 *
 *   dkdv: a thread block owns BN = 16 * NW keys of one kv head (16 per
 *     warp) and walks, for each query head of its GQA group, the visible
 *     query tiles of BM rows (Q, dO, lse, delta double-buffered by
 *     cp.async). Per tile and warp, with keys as rows: S^T = K Q^T, P^T =
 *     exp(S^T - lse), dV += P^T dO, dP^T = V dO^T, dS^T = P^T (dP^T - delta),
 *     dK += dS^T Q.
 *   dq: a thread block owns BM = 16 * NW query rows of one head (Q and dO
 *     in registers) and walks the visible key tiles: S = Q K^T, P, dP = dO
 *     V^T, dS = P (dP - delta), dQ += dS K.
 *
 * S and dP are recomputed in both (7 products per pair where a one-kernel
 * version with atomic dQ needs 5); that is the price of determinism.
 * Gradients are scaled by the softmax scale once, in the epilogue, and added
 * into the caller's fp32 dq, dk, dv.
 *
 * Not here: the forward (attn_fwd.cu, which also has the shared argument
 * checks and position bounds), delta (attn_aux.cu).
 */
#include "config.h"

#include "kernels/cuda/attn_tile.cuh"

using namespace dt_tile;

namespace {

struct bwd_params {
    const void *q, *k, *v, *dout;
    int64_t ldq, ldk, ldv, lddo;
    const float *lse, *delta;
    int64_t ldlse;
    float *dq, *dk, *dv;
    int64_t lddq, lddk, lddv;
    int64_t tq, tk;
    int group;
    int causal;
    const int64_t *ilo, *ihi; /* per query row, the key positions [ilo, ihi) it sees; or NULL */
    float scale;      /* softmax scale */
    float scale_log2; /* scale * log2(e) */
    tile_pos_t qt, kt;
};

/* lse in the log2 domain for the exponent; +inf for a row that saw no key,
 * so that its P is 0 (the reference skips such rows). */
__device__ __forceinline__ float lse2_of(float lse)
{
    return lse == -INFINITY ? INFINITY : lse * DT_LOG2E;
}

/*-- dK, dV -------------------------------------------------------------------*/

/* lse (log2 domain) and delta of one query row of head hh; (+inf, 0) past
 * the end, so that such a row adds nothing. */
__device__ __forceinline__ void load_rows(const bwd_params &p, int hh, int64_t row, float *l,
                                          float *d)
{
    const bool ok = row < p.tq;
    *l = ok ? lse2_of(p.lse[(int64_t)hh * p.ldlse + row]) : INFINITY;
    *d = ok ? p.delta[(int64_t)hh * p.ldlse + row] : 0.f;
}

/* Load query tile i of head hh (BM <= NT rows): Q and dO (swizzled, by
 * cp.async), lse (log2) and delta (plain stores). */
template <int D, int BM, int NT, typename T>
__device__ __forceinline__ void load_qtile(const bwd_params &p, int hh, int64_t i, T *sq, T *sdo,
                                           float *slse, float *sdelta, int tid)
{
    const T *Q = (const T *)p.q + (int64_t)hh * D;
    const T *DO = (const T *)p.dout + (int64_t)hh * D;
    load_tile<D, BM, NT>(sq, Q, p.ldq, i * BM, p.tq, tid);
    load_tile<D, BM, NT>(sdo, DO, p.lddo, i * BM, p.tq, tid);
    if (tid < BM) {
        float l, d;
        load_rows(p, hh, i * BM + tid, &l, &d);
        slse[tid] = l;
        sdelta[tid] = d;
    }
}

/* With a mask: the first query tile >= i whose rows' interval of keys
 * meets [kmin, kmax] (the intervals ascend along the rows: the search
 * stops at the first tile past kmax); nqt when none. */
__device__ __forceinline__ int64_t first_qtile_in(const bwd_params &p, int64_t i, int64_t nqt,
                                                  int64_t kmin, int64_t kmax)
{
    for (; i < nqt; i++) {
        const int64_t r0 = i * p.qt.tile, r1 = r0 + p.qt.tile < p.tq ? r0 + p.qt.tile : p.tq;
        int64_t lo, hi;
        rows_interval(p.ilo, p.ihi, r0, r1, &lo, &hi);
        if (lo > kmax)
            return nqt;
        if (hi > kmin)
            return i;
    }
    return nqt;
}

/* The next (head, query tile) pair at or after (qh, i) whose tile is
 * visible from keys whose positions are at least kmin (with a mask: in
 * [kmin, kmax]). Returns 0 when there is none. */
__device__ __forceinline__ int next_qtile(const bwd_params &p, int64_t nqt, int64_t kmin,
                                          int64_t kmax, int *qh, int64_t *i)
{
    for (; *qh < p.group; (*qh)++, *i = 0) {
        *i = p.ilo     ? first_qtile_in(p, *i, nqt, kmin, kmax)
             : p.causal ? first_tile_ge(p.qt, *i, nqt, kmin)
                        : *i;
        if (*i < nqt)
            return 1;
    }
    return 0;
}

template <int D, int NW, int BM, bool F16>
__global__ void __launch_bounds__(NW * 32) dkdv_kernel(const bwd_params p)
{
    typedef typename elem_of<F16>::type T;
    constexpr int BN = 16 * NW, NT = NW * 32;
    constexpr int NS = BM / 8; /* n8 tiles of S^T (query columns) */
    constexpr int NO = D / 8;  /* n8 tiles of dK, dV */
    extern __shared__ __align__(128) unsigned char smem[];
    T *sk = (T *)smem;        /* BN x D */
    T *sv = sk + BN * D;      /* BN x D */
    T *sq = sv + BN * D;      /* 2 x BM x D */
    T *sdo = sq + 2 * BM * D; /* 2 x BM x D */
    float *slse = (float *)(sdo + 2 * BM * D); /* 2 x BM */
    float *sdelta = slse + 2 * BM;             /* 2 x BM */

    const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31;
    const int g = lane >> 2, t4 = lane & 3;
    const int kvh = blockIdx.y;
    const int64_t n0 = (int64_t)blockIdx.x * BN;
    const T *K = (const T *)p.k + (int64_t)kvh * D;
    const T *V = (const T *)p.v + (int64_t)kvh * D;
    const int64_t nqt = (p.tq + BM - 1) / BM;

    /* my two key rows (S^T rows) and their positions */
    const int64_t key0 = n0 + warp * 16 + g, key1 = key0 + 8;
    const int64_t kp0 = key0 < p.tk ? p.kt.pos.at(key0) : INT64_MAX;
    const int64_t kp1 = key1 < p.tk ? p.kt.pos.at(key1) : INT64_MAX;
    int64_t kmin = 0, kmax = 0;
    if (p.causal || p.ilo)
        p.kt.range(blockIdx.x, &kmin, &kmax);

    load_tile<D, BN, NT>(sk, K, p.ldk, n0, p.tk, tid);
    load_tile<D, BN, NT>(sv, V, p.ldv, n0, p.tk, tid);
    int qh = 0;
    int64_t i = 0;
    int have = next_qtile(p, nqt, kmin, kmax, &qh, &i);
    if (have)
        load_qtile<D, BM, NT>(p, blockIdx.y * p.group + qh, i, sq, sdo, slse, sdelta, tid);
    cp_async_commit();

    float dk[NO][4], dv[NO][4];
    zero(dk);
    zero(dv);
    int buf = 0;

    while (have) {
        int qhn = qh;
        int64_t in = i + 1;
        const int haven = next_qtile(p, nqt, kmin, kmax, &qhn, &in);
        cp_async_wait_all();
        __syncthreads(); /* tile (qh, i) landed (plain stores too); the other buffer is free */
        /* the next tile: Q and dO by cp.async now; its lse and delta into
         * registers now and into shared memory after this tile's products,
         * so the global loads' latency hides behind them */
        float nl = INFINITY, nd = 0.f;
        if (haven) {
            const int hn = blockIdx.y * p.group + qhn;
            const T *Qn = (const T *)p.q + (int64_t)hn * D;
            const T *DOn = (const T *)p.dout + (int64_t)hn * D;
            load_tile<D, BM, NT>(sq + (buf ^ 1) * BM * D, Qn, p.ldq, in * BM, p.tq, tid);
            load_tile<D, BM, NT>(sdo + (buf ^ 1) * BM * D, DOn, p.lddo, in * BM, p.tq, tid);
            if (tid < BM)
                load_rows(p, hn, in * BM + tid, &nl, &nd);
        }
        cp_async_commit();

        const T *qs = sq + buf * BM * D, *dos = sdo + buf * BM * D;
        const float *ls = slse + buf * BM, *ds = sdelta + buf * BM;

        /* S^T = K Q^T and dP^T = V dO^T: 16 keys x BM queries per warp */
        float s[NS][4], dp[NS][4];
        zero(s);
        zero(dp);
        mma_abt_s<D, NS, F16>(s, sk, warp * 16, qs, lane);
        mma_abt_s<D, NS, F16>(dp, sv, warp * 16, dos, lane);

        /* P^T and dS^T; element (key row g or g + 8, query column c) */
        int64_t qlo, qhi;
        p.qt.range(i, &qlo, &qhi);
        const bool masked = (p.causal && qlo < kmax) || p.ilo != nullptr;
#pragma unroll
        for (int n = 0; n < NS; n++) {
#pragma unroll
            for (int e = 0; e < 4; e++) {
                const int c = n * 8 + t4 * 2 + (e & 1);
                float x = exp2f(s[n][e] * p.scale_log2 - ls[c]);
                if (masked) {
                    const int64_t row = i * BM + c, kp = (e >> 1) ? kp1 : kp0;
                    if (row >= p.tq)
                        x = 0.f;
                    else if (p.ilo ? kp < __ldg(p.ilo + row) || kp >= __ldg(p.ihi + row)
                                   : p.qt.pos.at(row) < kp)
                        x = 0.f;
                }
                s[n][e] = x;
                dp[n][e] = x * (dp[n][e] - ds[c]);
            }
        }

        /* dV += P^T dO, dK += dS^T Q */
        mma_ab<D, NS, F16>(dv, s, dos, lane);
        mma_ab<D, NS, F16>(dk, dp, qs, lane);
        if (haven && tid < BM) {
            slse[(buf ^ 1) * BM + tid] = nl;
            sdelta[(buf ^ 1) * BM + tid] = nd;
        }
        buf ^= 1;
        have = haven;
        qh = qhn;
        i = in;
    }
    cp_async_wait_all();

#pragma unroll
    for (int r = 0; r < 2; r++) {
        const int64_t key = r ? key1 : key0;
        if (key >= p.tk)
            continue;
        add_row(p.dk + key * p.lddk + (int64_t)kvh * D + t4 * 2, dk, r, p.scale);
        add_row(p.dv + key * p.lddv + (int64_t)kvh * D + t4 * 2, dv, r, 1.f);
    }
}

/*-- dQ -----------------------------------------------------------------------*/

/* The next key tile >= j a query tile sees: with a mask its rows'
 * interval [tlo, thi), else causally up to qmax. */
__device__ __forceinline__ int64_t next_ktile(const bwd_params &p, int64_t j, int64_t ntile,
                                              int64_t qmax, int64_t tlo, int64_t thi)
{
    return p.ilo      ? first_tile_in(p.kt, j, ntile, tlo, thi)
           : p.causal ? first_tile_le(p.kt, j, ntile, qmax)
                      : j;
}

template <int D, int NW, int BN, bool F16>
__global__ void __launch_bounds__(NW * 32) dq_kernel(const bwd_params p)
{
    typedef typename elem_of<F16>::type T;
    constexpr int BM = 16 * NW, NT = NW * 32;
    constexpr int NK = D / 16;
    constexpr int NS = BN / 8;
    constexpr int NO = D / 8;
    extern __shared__ __align__(128) unsigned char smem[];
    T *sq = (T *)smem;       /* BM x D */
    T *sdo = sq + BM * D;    /* BM x D */
    T *sk = sdo + BM * D;    /* 2 x BN x D */
    T *sv = sk + 2 * BN * D; /* 2 x BN x D */

    const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31;
    const int g = lane >> 2, t4 = lane & 3;
    const int hh = blockIdx.y, kvh = hh / p.group;
    const int64_t m0 = (int64_t)blockIdx.x * BM;
    const T *Q = (const T *)p.q + (int64_t)hh * D;
    const T *DO = (const T *)p.dout + (int64_t)hh * D;
    const T *K = (const T *)p.k + (int64_t)kvh * D;
    const T *V = (const T *)p.v + (int64_t)kvh * D;
    const int64_t ntile = (p.tk + BN - 1) / BN;

    const int64_t row0 = m0 + warp * 16 + g, row1 = row0 + 8;
    const int64_t qp0 = row0 < p.tq ? p.qt.pos.at(row0) : INT64_MIN;
    const int64_t qp1 = row1 < p.tq ? p.qt.pos.at(row1) : INT64_MIN;
    float l2[2], dl[2];
    l2[0] = row0 < p.tq ? lse2_of(p.lse[(int64_t)hh * p.ldlse + row0]) : INFINITY;
    l2[1] = row1 < p.tq ? lse2_of(p.lse[(int64_t)hh * p.ldlse + row1]) : INFINITY;
    dl[0] = row0 < p.tq ? p.delta[(int64_t)hh * p.ldlse + row0] : 0.f;
    dl[1] = row1 < p.tq ? p.delta[(int64_t)hh * p.ldlse + row1] : 0.f;
    int64_t qmin = 0, qmax = 0;
    if (p.causal)
        p.qt.range(blockIdx.x, &qmin, &qmax);
    int64_t lo0 = 0, hi0 = 0, lo1 = 0, hi1 = 0; /* a mask's intervals of my rows */
    if (p.ilo) {
        if (row0 < p.tq)
            lo0 = __ldg(p.ilo + row0), hi0 = __ldg(p.ihi + row0);
        if (row1 < p.tq)
            lo1 = __ldg(p.ilo + row1), hi1 = __ldg(p.ihi + row1);
    }

    load_tile<D, BM, NT>(sq, Q, p.ldq, m0, p.tq, tid);
    load_tile<D, BM, NT>(sdo, DO, p.lddo, m0, p.tq, tid);
    int64_t tlo = 0, thi = 0, all[2] = { 0, 0 };
    if (p.ilo)
        rows_interval(p.ilo, p.ihi, m0, m0 + BM < p.tq ? m0 + BM : p.tq, &tlo, &thi, all);
    int64_t j = next_ktile(p, 0, ntile, qmax, tlo, thi);
    if (j < ntile) {
        load_tile<D, BN, NT>(sk, K, p.ldk, j * BN, p.tk, tid);
        load_tile<D, BN, NT>(sv, V, p.ldv, j * BN, p.tk, tid);
    }
    cp_async_commit();
    cp_async_wait_all();
    __syncthreads();

    uint32_t qf[NK][4], df[NK][4];
#pragma unroll
    for (int kk = 0; kk < NK; kk++) {
        ldsm4(qf[kk], sq + a_addr<D>(warp * 16, kk * 16, lane));
        ldsm4(df[kk], sdo + a_addr<D>(warp * 16, kk * 16, lane));
    }
    float acc[NO][4];
    zero(acc);
    int buf = 0;

    while (j < ntile) {
        const int64_t jn = next_ktile(p, j + 1, ntile, qmax, tlo, thi);
        cp_async_wait_all();
        __syncthreads();
        if (jn < ntile) {
            load_tile<D, BN, NT>(sk + (buf ^ 1) * BN * D, K, p.ldk, jn * BN, p.tk, tid);
            load_tile<D, BN, NT>(sv + (buf ^ 1) * BN * D, V, p.ldv, jn * BN, p.tk, tid);
        }
        cp_async_commit();

        const T *ks = sk + buf * BN * D, *vs = sv + buf * BN * D;
        float s[NS][4], dp[NS][4];
        zero(s);
        zero(dp);
        mma_abt<D, NS, F16>(s, qf, ks, lane);
        mma_abt<D, NS, F16>(dp, df, vs, lane);

        int64_t klo, khi;
        p.kt.range(j, &klo, &khi);
        const bool masked = (j + 1) * BN > p.tk || (p.ilo ? !(klo >= all[0] && khi < all[1])
                                                          : p.causal && khi > qmin);
#pragma unroll
        for (int n = 0; n < NS; n++) {
#pragma unroll
            for (int e = 0; e < 4; e++) {
                const int r = e >> 1;
                float x = exp2f(s[n][e] * p.scale_log2 - l2[r]);
                if (masked) {
                    const int64_t col = j * BN + n * 8 + t4 * 2 + (e & 1);
                    bool vis = col < p.tk;
                    if (vis && p.ilo) {
                        const int64_t kp = p.kt.pos.at(col);
                        vis = r ? kp >= lo1 && kp < hi1 : kp >= lo0 && kp < hi0;
                    } else if (vis && p.causal) {
                        vis = p.kt.pos.at(col) <= (r ? qp1 : qp0);
                    }
                    if (!vis)
                        x = 0.f;
                }
                dp[n][e] = x * (dp[n][e] - dl[r]);
            }
        }

        /* dQ += dS K */
        mma_ab<D, NS, F16>(acc, dp, ks, lane);
        buf ^= 1;
        j = jn;
    }
    cp_async_wait_all();

#pragma unroll
    for (int r = 0; r < 2; r++) {
        const int64_t row = r ? row1 : row0;
        if (row >= p.tq)
            continue;
        add_row(p.dq + row * p.lddq + (int64_t)hh * D + t4 * 2, acc, r, p.scale);
    }
}

/* Tile shapes: dkdv 4 warps of 16 keys, 64 (d = 64) or 32 (d = 128) query
 * rows per tile; dq 4 warps of 16 query rows, 64 or 32 keys per tile (the
 * smaller tiles at d = 128 keep S, dP and both accumulators in registers). */
constexpr int BWD_NW = 4;

/* dkdv with pk (keys in blocks of 16 * NW, query tiles of BT), then dq with
 * pq (queries in blocks of 16 * NW, key tiles of BT). */
template <int D, bool F16>
int bwd_launch(const bwd_params &pk, const bwd_params &pq, int h, int hkv, cudaStream_t st,
               dt_emsg_t *em)
{
    constexpr int NW = BWD_NW, BT = D == 64 ? 64 : 32, BIG = 16 * NW;
    const size_t kv_smem = (size_t)(2 * BIG + 4 * BT) * D * 2 + 4 * BT * sizeof(float);
    const size_t q_smem = (size_t)(2 * BIG + 4 * BT) * D * 2;
    int rc = allow_smem(dkdv_kernel<D, NW, BT, F16>, kv_smem, em);
    if (rc == 0)
        rc = allow_smem(dq_kernel<D, NW, BT, F16>, q_smem, em);
    if (rc)
        return rc;
    dim3 gk((unsigned)((pk.tk + BIG - 1) / BIG), (unsigned)hkv);
    dkdv_kernel<D, NW, BT, F16><<<gk, NW * 32, kv_smem, st>>>(pk);
    DT_CUDA_TRY(em, cudaGetLastError());
    dim3 gq((unsigned)((pq.tq + BIG - 1) / BIG), (unsigned)h);
    dq_kernel<D, NW, BT, F16><<<gq, NW * 32, q_smem, st>>>(pq);
    DT_CUDA_TRY(em, cudaGetLastError());
    return 0;
}

} /* namespace */

extern "C" int dt_attn_bwd_cuda(const dt_attn_cuda_t *a, const dt_attn_cuda_grad_t *g,
                                cudaStream_t st, dt_emsg_t *em)
{
    int rc = check_args(a, "dt_attn_bwd_cuda", em);
    if (rc)
        return rc;
    const int64_t hd = (int64_t)a->h * a->d, kd = (int64_t)a->hkv * a->d;
    if (g->lddo < hd || g->lddo % 8 != 0 || (uintptr_t)g->dout % 16 != 0)
        return dt_emsg_set(em, DT_EINVAL,
                           "dt_attn_bwd_cuda: dout row stride %lld (need >= %lld, a multiple "
                           "of 8, 16-byte aligned)",
                           (long long)g->lddo, (long long)hd);
    if ((uintptr_t)g->dq % 8 || (uintptr_t)g->dk % 8 || (uintptr_t)g->dv % 8)
        return dt_emsg_set(em, DT_EINVAL, "dt_attn_bwd_cuda: dq, dk and dv must be 8-byte "
                                          "aligned");
    if (g->lddq < hd || g->lddk < kd || g->lddv < kd || g->lddq % 2 || g->lddk % 2 ||
        g->lddv % 2 || g->ldlse < a->tq)
        return dt_emsg_set(em, DT_EINVAL,
                           "dt_attn_bwd_cuda: gradient row strides %lld, %lld, %lld (need >= "
                           "%lld, %lld, %lld and even) or lse stride %lld (need >= %lld)",
                           (long long)g->lddq, (long long)g->lddk, (long long)g->lddv,
                           (long long)hd, (long long)kd, (long long)kd, (long long)g->ldlse,
                           (long long)a->tq);
    if (a->tq == 0 || a->tk == 0)
        return 0;

    const int BIG = 16 * BWD_NW, BT = a->d == 64 ? 64 : 32;
    bwd_params p;
    p.q = a->q;
    p.k = a->k;
    p.v = a->v;
    p.dout = g->dout;
    p.ldq = a->ldq;
    p.ldk = a->ldk;
    p.ldv = a->ldv;
    p.lddo = g->lddo;
    p.lse = g->lse;
    p.delta = g->delta;
    p.ldlse = g->ldlse;
    p.dq = g->dq;
    p.dk = g->dk;
    p.dv = g->dv;
    p.lddq = g->lddq;
    p.lddk = g->lddk;
    p.lddv = g->lddv;
    p.tq = a->tq;
    p.tk = a->tk;
    p.group = a->h / a->hkv;
    p.causal = a->causal != 0;
    p.ilo = a->qlo;
    p.ihi = a->qhi;
    p.scale = a->scale != 0.f ? a->scale : 1.f / sqrtf((float)a->d);
    p.scale_log2 = p.scale * DT_LOG2E;
    p.qt.pos.p = a->qpos;
    p.qt.pos.base = a->q0;
    p.qt.n = a->tq;
    p.kt.pos.p = a->kpos;
    p.kt.pos.base = a->k0;
    p.kt.n = a->tk;

    /* Both kernels use both tilings: the dkdv kernel blocks keys by BIG and
     * walks query tiles of BT; the dq kernel blocks queries by BIG and walks
     * key tiles of BT. So the position bounds are needed for both sizes on
     * both sides. */
    int64_t *qbig = NULL, *qsmall = NULL, *kbig = NULL, *ksmall = NULL;
    /* tile bounds where tiles are skipped by position: causal, or a mask */
    const int bypos = p.causal || a->qlo != NULL;
    rc = make_bounds(a->qpos, bypos, a->tq, BIG, &qbig, st, em);
    if (rc == 0)
        rc = make_bounds(a->kpos, bypos, a->tk, BIG, &kbig, st, em);
    if (rc == 0 && BT != BIG)
        rc = make_bounds(a->qpos, bypos, a->tq, BT, &qsmall, st, em);
    if (rc == 0 && BT != BIG)
        rc = make_bounds(a->kpos, bypos, a->tk, BT, &ksmall, st, em);
    if (rc == 0) {
        const bool f16 = a->dtype == DT_F16;
        bwd_params pk = p, pq = p;
        pk.kt.tile = BIG;
        pk.kt.bounds = kbig;
        pk.qt.tile = BT;
        pk.qt.bounds = BT == BIG ? qbig : qsmall;
        pq.qt.tile = BIG;
        pq.qt.bounds = qbig;
        pq.kt.tile = BT;
        pq.kt.bounds = BT == BIG ? kbig : ksmall;
        if (a->d == 64)
            rc = f16 ? bwd_launch<64, true>(pk, pq, a->h, a->hkv, st, em)
                     : bwd_launch<64, false>(pk, pq, a->h, a->hkv, st, em);
        else
            rc = f16 ? bwd_launch<128, true>(pk, pq, a->h, a->hkv, st, em)
                     : bwd_launch<128, false>(pk, pq, a->h, a->hkv, st, em);
    }
    dt_emsg_t *em2 = rc ? NULL : em;
    int r1 = free_bounds(qbig, st, em2);
    int r2 = free_bounds(qsmall, st, em2);
    int r3 = free_bounds(kbig, st, em2);
    int r4 = free_bounds(ksmall, st, em2);
    return rc ? rc : r1 ? r1 : r2 ? r2 : r3 ? r3 : r4;
}
