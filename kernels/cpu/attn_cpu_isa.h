/* SPDX-License-Identifier: MIT
 *
 * The packed one-head attention kernels, written once for a vector width
 * and included by attn_cpu.c once per instruction set (AVX-512, AVX2+FMA,
 * and a generic 4-lane build GCC lowers to SSE, NEON or scalar code). The
 * includer defines:
 *
 *   ISA(x)  the name x with the instance's suffix (x_avx512, ...)
 *   VL      floats per vector (16, 8, 4)
 *   NRV     vectors per micro-tile row (4 on AVX-512's 32 registers, else 2)
 *
 * and wraps the include in `#pragma GCC target` for the instruction set.
 * Nothing here is visible outside attn_cpu.c.
 *
 * One product shape serves all five matrix products of the forward and the
 * backward:  C[m x n] (=|+=) alpha * sum_k A(r, k) B[k, 0..n)  where A(r, k)
 * is read as a[r * ars + k * aks] (any strides, so A can be Q, P or P
 * transposed without a copy) and B is row-major with n a multiple of VL
 * (K^T and V^T packed once per call; V, K, Q and dO used where they lie).
 * The micro-tile keeps MR x NRV vectors of C in registers for the whole k
 * loop; one vector load of B serves MR rows, one broadcast of A serves NRV
 * vectors.
 */

#define MR 6 /* rows per micro-tile */

typedef float ISA(vf) __attribute__((vector_size(VL * 4)));
typedef int32_t ISA(vi) __attribute__((vector_size(VL * 4)));

#define VF ISA(vf)
#define VI ISA(vi)
#define VSPLAT(x) ISA(splat)(x)

/* x in every lane (one broadcast instruction at any -O level). */
static inline __attribute__((always_inline)) VF ISA(splat)(float x)
{
    return __builtin_shuffle((VF){ x }, (VI){ 0 });
}

static inline __attribute__((always_inline)) VF ISA(vload)(const float *p)
{
    VF v;
    memcpy(&v, p, sizeof(v));
    return v;
}

static inline __attribute__((always_inline)) void ISA(vstore)(float *p, VF v)
{
    memcpy(p, &v, sizeof(v));
}

/* exp(x) for x <= 0 or x = -inf, exactly 0 below -87: the range reduction
 * to 2^n 2^f, f in [-0.5, 0.5], then a degree-7 Taylor polynomial for 2^f
 * (relative error below 1e-7). With AVX-512
 * (DT_ISA_SCALEF) the rounding and the scaling by 2^n are one instruction
 * each (vrndscaleps, vscalefps): the same values, fewer operations. */
static inline __attribute__((always_inline)) VF ISA(vexp)(VF x)
{
#ifdef DT_ISA_SCALEF
    __m512 t = _mm512_max_ps(_mm512_mul_ps((__m512)x, _mm512_set1_ps(1.44269504088896341f)),
                             _mm512_set1_ps(-126.0f));
    __m512 fi = _mm512_roundscale_ps(t, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    VF f = (VF)_mm512_mul_ps(_mm512_sub_ps(t, fi), _mm512_set1_ps(0.693147180559945309f));
#else
    VF t = x * VSPLAT(1.44269504088896341f);
    VI low = t < VSPLAT(-126.0f);
    t = (VF)(((VI)t & ~low) | ((VI)VSPLAT(-126.0f) & low));
    VF fi = (t + VSPLAT(12582912.0f)) - VSPLAT(12582912.0f);
    VF f = (t - fi) * VSPLAT(0.693147180559945309f);
#endif
    VF p = VSPLAT(1.0f / 5040.0f);
    p = p * f + VSPLAT(1.0f / 720.0f);
    p = p * f + VSPLAT(1.0f / 120.0f);
    p = p * f + VSPLAT(1.0f / 24.0f);
    p = p * f + VSPLAT(1.0f / 6.0f);
    p = p * f + VSPLAT(0.5f);
    p = p * f + VSPLAT(1.0f);
    p = p * f + VSPLAT(1.0f);
#ifdef DT_ISA_SCALEF
    __mmask16 keep = _mm512_cmp_ps_mask((__m512)x, _mm512_set1_ps(-87.0f), _CMP_GE_OQ);
    return (VF)_mm512_maskz_mov_ps(keep, _mm512_scalef_ps((__m512)p, fi));
#else
    VI n = __builtin_convertvector(fi, VI);
    VI bits = (VI)p + (n << 23);
    VI keep = x >= VSPLAT(-87.0f);
    return (VF)(bits & keep);
#endif
}

static inline float ISA(sexp)(float x)
{
    return ISA(vexp)(VSPLAT(x))[0];
}

/* The micro-tile: m <= MR rows, nv <= NRV vectors (constants after
 * inlining, so the accumulators live in registers). */
static inline __attribute__((always_inline)) void
ISA(micro)(const int m, const int nv, int64_t kk, float alpha, const float *a, int64_t ars,
           int64_t aks, const float *b, int64_t ldb, float *c, int64_t ldc, int acc)
{
    VF s[MR][NRV];
#pragma GCC unroll 8
    for (int r = 0; r < m; r++)
#pragma GCC unroll 8
        for (int v = 0; v < nv; v++)
            s[r][v] = VSPLAT(0.0f);
    for (int64_t k = 0; k < kk; k++) {
        const float *ak = a + k * aks, *bk = b + k * ldb;
        VF bv[NRV];
#pragma GCC unroll 8
        for (int v = 0; v < nv; v++)
            bv[v] = ISA(vload)(bk + v * VL);
#pragma GCC unroll 8
        for (int r = 0; r < m; r++) {
            VF ar = VSPLAT(ak[r * ars]);
#pragma GCC unroll 8
            for (int v = 0; v < nv; v++)
                s[r][v] += ar * bv[v];
        }
    }
#pragma GCC unroll 8
    for (int r = 0; r < m; r++)
#pragma GCC unroll 8
        for (int v = 0; v < nv; v++) {
            float *cp = c + r * ldc + v * VL;
            VF x = s[r][v] * VSPLAT(alpha);
            if (acc)
                x += ISA(vload)(cp);
            ISA(vstore)(cp, x);
        }
}

/* C (=|+=) alpha A B over the whole of C: column blocks outside, so one
 * block of B (kk x NRV VL floats) stays in cache across the row tiles. */
static void ISA(gemm)(int64_t m, int64_t n, int64_t kk, float alpha, const float *a, int64_t ars,
                      int64_t aks, const float *b, int64_t ldb, float *c, int64_t ldc, int acc)
{
    for (int64_t c0 = 0; c0 < n; c0 += NRV * VL) {
        int nv = (int)((n - c0) / VL < NRV ? (n - c0) / VL : NRV);
        for (int64_t r0 = 0; r0 < m; r0 += MR) {
            int mm = (int)(m - r0 < MR ? m - r0 : MR);
            const float *ar = a + r0 * ars;
            const float *bc = b + c0;
            float *cc = c + r0 * ldc + c0;
#define DT_MICRO_CASE(M, N)                                               \
    case (M)*8 + (N):                                                     \
        ISA(micro)(M, N, kk, alpha, ar, ars, aks, bc, ldb, cc, ldc, acc); \
        break;
#define DT_MICRO_ROW(M) DT_MICRO_CASE(M, 1) DT_MICRO_CASE(M, 2) DT_MICRO_CASE_34(M)
#if NRV > 2
#define DT_MICRO_CASE_34(M) DT_MICRO_CASE(M, 3) DT_MICRO_CASE(M, 4)
#else
#define DT_MICRO_CASE_34(M)
#endif
            switch (mm * 8 + nv) {
                DT_MICRO_ROW(1)
                DT_MICRO_ROW(2)
                DT_MICRO_ROW(3)
                DT_MICRO_ROW(4)
                DT_MICRO_ROW(5)
                DT_MICRO_ROW(6)
            default:
                abort();
            }
#undef DT_MICRO_CASE_34
#undef DT_MICRO_ROW
#undef DT_MICRO_CASE
        }
    }
}

/* Lane-wise maximum (either when equal). */
static inline __attribute__((always_inline)) VF ISA(vmax)(VF x, VF y)
{
#ifdef DT_ISA_VMAX
    return (VF)DT_ISA_VMAX(x, y); /* one instruction (vmaxps) */
#else
    return (VF)(((VI)x & (x >= y)) | ((VI)y & (x < y)));
#endif
}

/* The lanes' maximum and sum, by halving (log2 VL steps, not VL). */
static inline __attribute__((always_inline)) float ISA(hmax)(VF x)
{
#pragma GCC unroll 8
    for (int h = VL / 2; h >= 1; h /= 2) {
        VI idx;
#pragma GCC unroll 16
        for (int i = 0; i < VL; i++)
            idx[i] = (i + h) % VL;
        x = ISA(vmax)(x, __builtin_shuffle(x, idx));
    }
    return x[0];
}

static inline __attribute__((always_inline)) float ISA(hsum)(VF x)
{
#pragma GCC unroll 8
    for (int h = VL / 2; h >= 1; h /= 2) {
        VI idx;
#pragma GCC unroll 16
        for (int i = 0; i < VL; i++)
            idx[i] = (i + h) % VL;
        x += __builtin_shuffle(x, idx);
    }
    return x[0];
}

/* Row maximum of s[0..n), -inf when all are -inf (or n = 0). Two
 * accumulators, so the loop is not one chain of compares. */
static float ISA(row_max)(const float *s, int n)
{
    VF l0 = VSPLAT(-INFINITY), l1 = l0;
    int j = 0;
    for (; j + 2 * VL <= n; j += 2 * VL) {
        l0 = ISA(vmax)(l0, ISA(vload)(s + j));
        l1 = ISA(vmax)(l1, ISA(vload)(s + j + VL));
    }
    for (; j + VL <= n; j += VL)
        l0 = ISA(vmax)(l0, ISA(vload)(s + j));
    float m = ISA(hmax)(ISA(vmax)(l0, l1));
    for (; j < n; j++)
        m = s[j] > m ? s[j] : m;
    return m;
}

/* s[j] = exp(s[j] - m) for j < n, returning the sum; m finite. */
static float ISA(row_exp_sum)(float *s, int n, float m)
{
    VF acc = VSPLAT(0.0f);
    int j = 0;
    for (; j + VL <= n; j += VL) {
        VF p = ISA(vexp)(ISA(vload)(s + j) - VSPLAT(m));
        ISA(vstore)(s + j, p);
        acc += p;
    }
    float sum = ISA(hsum)(acc);
    for (; j < n; j++) {
        s[j] = ISA(sexp)(s[j] - m);
        sum += s[j];
    }
    return sum;
}

/* p = exp(s - lse) into s, ds = p (dp - delta) into dp, for j < n. */
static void ISA(row_bwd)(float *s, float *dp, int n, float lse, float delta)
{
    int j = 0;
    for (; j + VL <= n; j += VL) {
        VF p = ISA(vexp)(ISA(vload)(s + j) - VSPLAT(lse));
        ISA(vstore)(s + j, p);
        ISA(vstore)(dp + j, p * (ISA(vload)(dp + j) - VSPLAT(delta)));
    }
    for (; j < n; j++) {
        float p = ISA(sexp)(s[j] - lse);
        s[j] = p;
        dp[j] = p * (dp[j] - delta);
    }
}

/* x[0..n) *= f, n a multiple of VL. */
static void ISA(row_scale)(float *x, int n, float f)
{
    for (int j = 0; j < n; j += VL)
        ISA(vstore)(x + j, ISA(vload)(x + j) * VSPLAT(f));
}

/* Transpose rows [j0, j0 + bk) of x (stride ldx, d columns) into
 * t[d][BKP]: t[c * BKP + j] = x[(j0 + j) ldx + c], zero for bk <= j < bkp. */
static void ISA(pack_t)(const float *x, int64_t ldx, int64_t j0, int bk, int bkp, int d, float *t)
{
    for (int j = 0; j < bk; j++) {
        const float *row = x + (j0 + j) * ldx;
        for (int c = 0; c < d; c++)
            t[(int64_t)c * BKP + j] = row[c];
    }
    for (int c = 0; c < d; c++)
        for (int j = bk; j < bkp; j++)
            t[(int64_t)c * BKP + j] = 0.0f;
}

/* The key tiles' transposes, every tile packed once per call. */
static float *ISA(pack_all)(const float *x, int64_t ldx, int64_t tk, int d)
{
    int64_t nt = (tk + BKP - 1) / BKP;
    float *t = dt_xaligned((size_t)(nt * d * BKP), sizeof(float));
    for (int64_t i = 0; i < nt; i++) {
        int bk = (int)(tk - i * BKP < BKP ? tk - i * BKP : BKP);
        int bkp = (bk + VL - 1) / VL * VL;
        ISA(pack_t)(x, ldx, i * BKP, bk, bkp, d, t + i * d * BKP);
    }
    return t;
}

/* Scores of rows [r0, r0 + nr) of a query tile against one key tile,
 * masked: s = scale q k^T for the first lim columns (rounded up to VL),
 * -inf where a key is after the query and for columns lim..bk. */
static void ISA(scores)(const tile_t *tl, int r0, int nr, const float *q, int64_t ldq,
                        const float *kt, float *s)
{
    int lim = tl->lim[r0 / MR];
    int limp = (lim + VL - 1) / VL * VL;
    if (limp > 0)
        ISA(gemm)(nr, limp, tl->d, tl->scale, q + r0 * ldq, ldq, 1, kt, BKP, s + r0 * BKP, BKP, 0);
    if (tl->full)
        return;
    for (int r = r0; r < r0 + nr; r++) {
        float *row = s + (int64_t)r * BKP;
        int64_t qp = tl->qpos[r];
        for (int j = 0; j < lim; j++)
            if (tl->kpos[j] > qp)
                row[j] = -INFINITY;
        for (int j = lim; j < tl->bk; j++)
            row[j] = -INFINITY;
    }
}

static void ISA(fwd)(const dt_attn_head_t *a, float *o, int64_t ldo, float *lse)
{
    const int d = a->d;
    tiles_t ts;
    float *kt = ISA(pack_all)(a->k, a->ldk, a->tk, d);
    float *s = dt_xaligned(BQP * BKP, sizeof(float));
    float m[BQP], l[BQP];

    tiles_init(&ts, a, MR);
    for (int64_t i0 = 0; i0 < a->tq; i0 += BQP) {
        int bq = (int)(a->tq - i0 < BQP ? a->tq - i0 : BQP);
        int any = 0;
        for (int r = 0; r < bq; r++) {
            m[r] = lse[i0 + r];
            l[r] = isinf(m[r]) && m[r] < 0 ? 0.0f : 1.0f;
        }
        for (int64_t j0 = 0; j0 < a->tk; j0 += BKP) {
            tile_t tl;
            if (!tile_at(&ts, a, i0, bq, j0, &tl))
                continue; /* every key after every query */
            any = 1;
            const float *kti = kt + (j0 / BKP) * d * BKP;
            if (tl.full)
                ISA(scores)(&tl, 0, bq, a->q + i0 * a->ldq, a->ldq, kti, s);
            else
                for (int r0 = 0; r0 < bq; r0 += MR)
                    ISA(scores)
                    (&tl, r0, bq - r0 < MR ? bq - r0 : MR, a->q + i0 * a->ldq, a->ldq, kti, s);
            for (int r = 0; r < bq; r++) {
                int lim = tl.lim[r / MR];
                float *row = s + (int64_t)r * BKP;
                float mx = ISA(row_max)(row, lim);
                float mn = mx > m[r] ? mx : m[r];
                float *orow = o + (i0 + r) * ldo;
                if (isinf(mn) && mn < 0) {
                    memset(row, 0, (size_t)lim * sizeof(float));
                    continue;
                }
                float alpha = l[r] > 0.0f ? ISA(sexp)(m[r] - mn) : 0.0f;
                float sum = ISA(row_exp_sum)(row, lim, mn);
                if (alpha == 0.0f)
                    memset(orow, 0, (size_t)d * sizeof(float));
                else if (alpha != 1.0f)
                    ISA(row_scale)(orow, d, alpha);
                l[r] = l[r] * alpha + sum;
                m[r] = mn;
            }
            /* o += p v, each row block over the keys it can see */
            if (tl.full)
                ISA(gemm)
                (bq, d, tl.bk, 1.0f, s, BKP, 1, a->v + j0 * a->ldv, a->ldv, o + i0 * ldo, ldo, 1);
            else
                for (int r0 = 0; r0 < bq; r0 += MR)
                    ISA(gemm)
                    (bq - r0 < MR ? bq - r0 : MR, d, tl.lim[r0 / MR], 1.0f, s + (int64_t)r0 * BKP,
                     BKP, 1, a->v + j0 * a->ldv, a->ldv, o + (i0 + r0) * ldo, ldo, 1);
            if (a->progress)
                a->progress(a->progress_arg);
        }
        if (!any)
            continue;
        for (int r = 0; r < bq; r++)
            if (l[r] > 0.0f) {
                ISA(row_scale)(o + (i0 + r) * ldo, d, 1.0f / l[r]);
                lse[i0 + r] = m[r] + logf(l[r]);
            }
    }
    tiles_free(&ts);
    free(s);
    free(kt);
}

static void ISA(bwd)(const dt_attn_head_t *a, const dt_attn_head_grad_t *g)
{
    const int d = a->d;
    tiles_t ts;
    float *kt = ISA(pack_all)(a->k, a->ldk, a->tk, d);
    float *vt = ISA(pack_all)(a->v, a->ldv, a->tk, d);
    float *s = dt_xaligned(BQP * BKP, sizeof(float));
    float *dp = dt_xaligned(BQP * BKP, sizeof(float));

    tiles_init(&ts, a, MR);
    for (int64_t i0 = 0; i0 < a->tq; i0 += BQP) {
        int bq = (int)(a->tq - i0 < BQP ? a->tq - i0 : BQP);
        const float *qi = a->q + i0 * a->ldq, *doi = g->dout + i0 * g->lddo;
        for (int64_t j0 = 0; j0 < a->tk; j0 += BKP) {
            tile_t tl;
            if (!tile_at(&ts, a, i0, bq, j0, &tl))
                continue;
            const float *kti = kt + (j0 / BKP) * d * BKP, *vti = vt + (j0 / BKP) * d * BKP;
            /* s = scale q k^T, masked; dp = dout v^T over the same columns */
            for (int r0 = 0; r0 < bq; r0 += (tl.full ? bq : MR)) {
                int nr = tl.full ? bq : (bq - r0 < MR ? bq - r0 : MR);
                int lim = tl.lim[r0 / MR];
                int limp = (lim + VL - 1) / VL * VL;
                ISA(scores)(&tl, r0, nr, qi, a->ldq, kti, s);
                if (limp > 0)
                    ISA(gemm)
                    (nr, limp, d, 1.0f, doi + r0 * g->lddo, g->lddo, 1, vti, BKP,
                     dp + (int64_t)r0 * BKP, BKP, 0);
                for (int r = r0; r < r0 + nr; r++)
                    memset(dp + (int64_t)r * BKP + limp, 0,
                           (size_t)(tl.bk > limp ? tl.bk - limp : 0) * sizeof(float));
            }
            for (int r = 0; r < bq; r++) {
                float l = g->lse[i0 + r];
                float *srow = s + (int64_t)r * BKP, *dprow = dp + (int64_t)r * BKP;
                if (isinf(l) && l < 0) {
                    memset(srow, 0, (size_t)tl.bk * sizeof(float));
                    memset(dprow, 0, (size_t)tl.bk * sizeof(float));
                    continue;
                }
                ISA(row_bwd)(srow, dprow, tl.bk, l, g->delta[i0 + r]);
            }
            /* dv += p^T dout; dq += scale ds k; dk += scale ds^T q */
            ISA(gemm)(tl.bk, d, bq, 1.0f, s, 1, BKP, doi, g->lddo, g->dv + j0 * a->ldv, a->ldv, 1);
            ISA(gemm)
            (bq, d, tl.bk, a->scale, dp, BKP, 1, a->k + j0 * a->ldk, a->ldk, g->dq + i0 * a->ldq,
             a->ldq, 1);
            ISA(gemm)
            (tl.bk, d, bq, a->scale, dp, 1, BKP, qi, a->ldq, g->dk + j0 * a->ldk, a->ldk, 1);
            if (a->progress)
                a->progress(a->progress_arg);
        }
    }
    tiles_free(&ts);
    free(dp);
    free(s);
    free(vt);
    free(kt);
}

#undef VSPLAT
#undef VI
#undef VF
#undef MR
