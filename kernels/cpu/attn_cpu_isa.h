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
 * is read as a[r * ars + k * aks] (any strides, so A can be a score tile or
 * its transpose without a copy) and B is packed in panels of NB = NRV VL
 * columns, each panel's rows contiguous (NB floats apart). The micro-tile
 * keeps MR x NRV vectors of C in registers for the whole k loop; one vector
 * load of B serves MR rows, one broadcast of A serves NRV vectors.
 *
 * Why panels: B read where it lies is one short run of NB floats per row
 * at the tensor's row stride (H D floats: 2 or 4 KiB for 8 heads), so the
 * kk rows of a block fall into a handful of L1 sets (a 4 KiB stride maps
 * every row to the same sets) and are evicted before the next row tile
 * reuses them: each row tile read its whole B block from L2 again. That
 * cost little where one 512-bit FMA issues per cycle (AMD Zen 4) and
 * more where two do (Intel's server cores, Zen 5), the vendor gap the
 * Intel Xeon measurements showed. A panel is one contiguous run of kk NB
 * floats: every set used evenly, one prefetch stream. Packing copies
 * floats and changes no sum, so the results are the same bits as before.
 * Packed once per call: K^T and V (forward), K^T, V^T and K (backward);
 * once per query tile: Q (and dO) row by row for A, and as panels for the
 * backward's dK and dV products.
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

/* 2^t for t <= 0 or t = -inf, exactly 0 below -125 (and for NaN): t =
 * n + f with n the nearest integer and f in [-0.5, 0.5], 2^f by a degree-6
 * polynomial fitted to it (relative error below 1e-7, what fp32 holds;
 * p(0) = 1 exactly, so 2^0 is 1), times 2^n. With AVX-512 (DT_ISA_SCALEF)
 * the rounding and the scaling are one instruction each (vrndscaleps,
 * vscalefps, its mask zeroing what is below range). Callers form t with
 * the exponential's shift folded in (ISA(shift), or the forward's maximum
 * kept in log2 units): one multiply-add (and a subtraction) instead of a
 * subtraction, a multiply and a clamp. */
static inline __attribute__((always_inline)) VF ISA(vexp2)(VF t)
{
#ifdef DT_ISA_SCALEF
    __m512 fi = _mm512_roundscale_ps((__m512)t, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    VF f = t - (VF)fi;
#else
    /* -inf and NaN kept out of the integer path, zeroed at the end */
    VI low = ~(t >= VSPLAT(-125.0f));
    VF tc = (VF)(((VI)t & ~low) | ((VI)VSPLAT(-125.0f) & low));
    VF fi = (tc + VSPLAT(12582912.0f)) - VSPLAT(12582912.0f);
    VF f = tc - fi;
#endif
    VF p = VSPLAT(1.52677006553858e-4f);
    p = p * f + VSPLAT(1.33928889408708e-3f);
    p = p * f + VSPLAT(9.61872469633818e-3f);
    p = p * f + VSPLAT(5.55035024881363e-2f);
    p = p * f + VSPLAT(2.40226462483406e-1f);
    p = p * f + VSPLAT(6.93147182464600e-1f);
    p = p * f + VSPLAT(1.0f);
#ifdef DT_ISA_SCALEF
    __mmask16 keep = _mm512_cmp_ps_mask((__m512)t, _mm512_set1_ps(-125.0f), _CMP_GE_OQ);
    return (VF)_mm512_maskz_scalef_ps(keep, (__m512)p, fi);
#else
    VI n = __builtin_convertvector(fi, VI);
    VI bits = (VI)p + (n << 23);
    return (VF)(bits & ~low);
#endif
}

/* exp(x - m) = 2^(x log2 e - m log2 e): the row's shift m log2 e as two
 * floats, hi + lo, so that t = (x log2 e - hi) - lo loses nothing to the
 * rounding of m log2 e (a row maximum of 50 would otherwise put a shared
 * relative error of 3e-6 on the row's exponentials). */
typedef struct ISA(shift) {
    float hi, lo;
} ISA(shift_t);

static inline __attribute__((always_inline)) ISA(shift_t) ISA(shift)(float m)
{
    const float l2e = 1.44269504088896341f;
    float hi = m * l2e;
    return (ISA(shift_t)){ hi, __builtin_fmaf(m, l2e, -hi) };
}

/* exp(x - m) for x <= m, lane by lane (sh = ISA(shift)(m)) */
static inline __attribute__((always_inline)) VF ISA(vexp_sub)(VF x, ISA(shift_t) sh)
{
    return ISA(vexp2)((x * VSPLAT(1.44269504088896341f) - VSPLAT(sh.hi)) - VSPLAT(sh.lo));
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

#define NB (NRV * VL) /* columns of a B panel */

/* C (=|+=) alpha A B over the whole of C, B in panels (panel p at
 * bp + p pstride, its rows NB floats apart): panels outside, so one panel
 * (kk x NB floats) stays in cache across the row tiles. */
static void ISA(gemm)(int64_t m, int64_t n, int64_t kk, float alpha, const float *a, int64_t ars,
                      int64_t aks, const float *bp, int64_t pstride, float *c, int64_t ldc, int acc)
{
    for (int64_t c0 = 0; c0 < n; c0 += NB) {
        int nv = (int)((n - c0) / VL < NRV ? (n - c0) / VL : NRV);
        const float *bc = bp + (c0 / NB) * pstride;
        for (int64_t r0 = 0; r0 < m; r0 += MR) {
            int mm = (int)(m - r0 < MR ? m - r0 : MR);
            const float *ar = a + r0 * ars;
            float *cc = c + r0 * ldc + c0;
#define DT_MICRO_CASE(M, N)                                              \
    case (M)*8 + (N):                                                    \
        ISA(micro)(M, N, kk, alpha, ar, ars, aks, bc, NB, cc, ldc, acc); \
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

/* The lanes' maximum and sum, by halving (log2 VL steps, not VL): step h
 * combines lane i with lane (i + h) mod VL. The rotations are constants
 * (a table the compiler folds), not built lane by lane at run time, which
 * GCC did for every row and which cost as much as the row's exponentials. */
#define DT_ROT(h)                                                                   \
    { (0 + h) % VL,  (1 + h) % VL,  (2 + h) % VL,  (3 + h) % VL,  (4 + h) % VL,  \
      (5 + h) % VL,  (6 + h) % VL,  (7 + h) % VL,  (8 + h) % VL,  (9 + h) % VL,  \
      (10 + h) % VL, (11 + h) % VL, (12 + h) % VL, (13 + h) % VL, (14 + h) % VL, \
      (15 + h) % VL }
static const int32_t ISA(rot_tab)[4][16] = { DT_ROT(1), DT_ROT(2), DT_ROT(4), DT_ROT(8) };
#undef DT_ROT

/* x rotated down by h = 2^lg lanes */
static inline __attribute__((always_inline)) VF ISA(rot)(VF x, int lg)
{
    VI idx;
    memcpy(&idx, ISA(rot_tab)[lg], sizeof(idx));
    return __builtin_shuffle(x, idx);
}

static inline __attribute__((always_inline)) float ISA(hmax)(VF x)
{
#pragma GCC unroll 8
    for (int lg = __builtin_ctz(VL) - 1; lg >= 0; lg--)
        x = ISA(vmax)(x, ISA(rot)(x, lg));
    return x[0];
}

static inline __attribute__((always_inline)) float ISA(hsum)(VF x)
{
#pragma GCC unroll 8
    for (int lg = __builtin_ctz(VL) - 1; lg >= 0; lg--)
        x += ISA(rot)(x, lg);
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

/* s[j] = 2^(s[j] log2 e - M) for j < n, returning the sum: the forward's
 * exponentials with its running maximum kept in log2 units (M, a float),
 * so that one multiply-add forms each exponent and nothing is lost to
 * rounding the shift (M is the shift, exactly). */
static float ISA(row_exp2_sum)(float *s, int n, float M)
{
    VF acc = VSPLAT(0.0f);
    int j = 0;
    for (; j + VL <= n; j += VL) {
        VF p = ISA(vexp2)(ISA(vload)(s + j) * VSPLAT(1.44269504088896341f) - VSPLAT(M));
        ISA(vstore)(s + j, p);
        acc += p;
    }
    float sum = ISA(hsum)(acc);
    for (; j < n; j++) {
        s[j] = ISA(vexp2)(VSPLAT(s[j]) * VSPLAT(1.44269504088896341f) - VSPLAT(M))[0];
        sum += s[j];
    }
    return sum;
}

/* p = exp(s - lse) into s, ds = p (dp - delta) into dp, for j < n. */
static void ISA(row_bwd)(float *s, float *dp, int n, float lse, float delta)
{
    ISA(shift_t) sh = ISA(shift)(lse);
    int j = 0;
    for (; j + VL <= n; j += VL) {
        VF p = ISA(vexp_sub)(ISA(vload)(s + j), sh);
        ISA(vstore)(s + j, p);
        ISA(vstore)(dp + j, p * (ISA(vload)(dp + j) - VSPLAT(delta)));
    }
    for (; j < n; j++) {
        float p = ISA(vexp_sub)(VSPLAT(s[j]), sh)[0];
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

/* B = x^T for rows [j0, j0 + bk) of x (d columns): panel p holds rows
 * j0 + p NB ... (zero past bk), its row c at t[p d NB + c NB]. */
static void ISA(pack_t)(const float *x, int64_t ldx, int64_t j0, int bk, int d, float *t)
{
    for (int p = 0; p * NB < bk; p++) {
        float *tp = t + (int64_t)p * d * NB;
        int w = bk - p * NB < NB ? bk - p * NB : NB;
        for (int j = 0; j < w; j++) {
            const float *row = x + (j0 + p * NB + j) * ldx;
            for (int c = 0; c < d; c++)
                tp[(int64_t)c * NB + j] = row[c];
        }
        for (int c = 0; c < d; c++)
            for (int j = w; j < NB; j++)
                tp[(int64_t)c * NB + j] = 0.0f;
    }
}

/* Floats of one panel set of pack_n for `rows` rows of d columns. */
#define PACK_N_SIZE(rows, d) ((int64_t)(((d) + NB - 1) / NB) * NB * (rows))

/* B = x for rows [j0, j0 + n) of x (d columns): panel p holds columns
 * p NB ... (zero past d), its row j at t[p rows NB + j NB] (rows >= n:
 * the panels' height, so a tile's panels stay in place). */
static void ISA(pack_n)(const float *x, int64_t ldx, int64_t j0, int n, int rows, int d, float *t)
{
    for (int p = 0; p * NB < d; p++) {
        int w = d - p * NB < NB ? d - p * NB : NB;
        float *tp = t + (int64_t)p * rows * NB;
        for (int j = 0; j < n; j++) {
            memcpy(tp + (int64_t)j * NB, x + (j0 + j) * ldx + p * NB, (size_t)w * sizeof(float));
            memset(tp + (int64_t)j * NB + w, 0, (size_t)(NB - w) * sizeof(float));
        }
    }
}

/* Rows [i0, i0 + n) of x, d columns, side by side (stride d): an A
 * operand whose 6 rows no longer share L1 sets. */
static void ISA(pack_rows)(const float *x, int64_t ldx, int64_t i0, int n, int d, float *t)
{
    for (int i = 0; i < n; i++)
        memcpy(t + (int64_t)i * d, x + (i0 + i) * ldx, (size_t)d * sizeof(float));
}

/* Every key tile of x packed as B = x^T (scores, dP) when trans, else as
 * B = x (P V, dS K), into this thread's scratch slot: once per call, or
 * once for the calls that name the same K and V (id = the head's kv_id,
 * nonzero). Tile i at the returned pointer plus i times *tile floats. */
static float *ISA(pack_all)(const float *x, int64_t ldx, int64_t tk, int d, int trans, int slot,
                            uint64_t id, int64_t *tile)
{
    int64_t nt = (tk + BKP - 1) / BKP;
    *tile = trans ? (int64_t)BKP * d : PACK_N_SIZE(BKP, d);
    pack_tag_t tag = { id, x, ldx, tk, d, trans, NB };
    int hit = 0;
    float *t = scratch_tagged(slot, (size_t)(nt * *tile), id != 0 ? &tag : NULL, &hit);
    if (hit)
        return t;
    for (int64_t i = 0; i < nt; i++) {
        int bk = (int)(tk - i * BKP < BKP ? tk - i * BKP : BKP);
        if (trans)
            ISA(pack_t)(x, ldx, i * BKP, bk, d, t + i * *tile);
        else
            ISA(pack_n)(x, ldx, i * BKP, bk, BKP, d, t + i * *tile);
    }
    return t;
}

/* Scores of rows [r0, r0 + nr) of a query tile (its rows packed, stride
 * d) against one key tile (K^T panels), masked: s = scale q k^T for the
 * first lim columns (rounded up to VL), -inf where a key is after the
 * query and for columns lim..bk. */
static void ISA(scores)(const tile_t *tl, int r0, int nr, const float *qt, const float *ktp,
                        float *s)
{
    int lim = tl->lim[r0 / MR];
    int limp = (lim + VL - 1) / VL * VL;
    if (limp > 0)
        ISA(gemm)(nr, limp, tl->d, tl->scale, qt + (int64_t)r0 * tl->d, tl->d, 1, ktp,
                  (int64_t)tl->d * NB, s + r0 * BKP, BKP, 0);
    if (tl->full)
        return;
    for (int r = r0; r < r0 + nr; r++) {
        float *row = s + (int64_t)r * BKP;
        mask_row(tl->a, row, tl->qpos[r], tl->kpos, lim);
        for (int j = lim; j < tl->bk; j++)
            row[j] = -INFINITY;
    }
}

static void ISA(fwd)(const dt_attn_head_t *a, float *o, int64_t ldo, float *lse)
{
    const int d = a->d;
    tiles_t ts;
    int64_t ktile, vtile;
    float *kt = ISA(pack_all)(a->k, a->ldk, a->tk, d, 1, SCR_K0, a->kv_id, &ktile);
    float *vn = ISA(pack_all)(a->v, a->ldv, a->tk, d, 0, SCR_K1, a->kv_id, &vtile);
    float *qt = scratch(SCR_Q0, (size_t)BQP * d);
    float *s = scratch(SCR_S0, BQP * BKP);
    float m[BQP], l[BQP];

    tiles_init(&ts, a, MR);
    for (int64_t i0 = 0; i0 < a->tq; i0 += BQP) {
        int bq = (int)(a->tq - i0 < BQP ? a->tq - i0 : BQP);
        int any = 0;
        ISA(pack_rows)(a->q, a->ldq, i0, bq, d, qt);
        /* the running state per row: its maximum in log2 units, m (so an
         * exponential is 2^(s log2 e - m)), and the sum of exponentials l */
        for (int r = 0; r < bq; r++) {
            float x = lse[i0 + r];
            int none = isinf(x) && x < 0;
            m[r] = none ? -INFINITY : x * 1.44269504088896341f;
            l[r] = none ? 0.0f : 1.0f;
        }
        for (int64_t j0 = 0; j0 < a->tk; j0 += BKP) {
            tile_t tl;
            if (!tile_at(&ts, a, i0, bq, j0, &tl))
                continue; /* every key after every query */
            any = 1;
            const float *kti = kt + (j0 / BKP) * ktile, *vni = vn + (j0 / BKP) * vtile;
            if (tl.full)
                ISA(scores)(&tl, 0, bq, qt, kti, s);
            else
                for (int r0 = 0; r0 < bq; r0 += MR)
                    ISA(scores)(&tl, r0, bq - r0 < MR ? bq - r0 : MR, qt, kti, s);
            for (int r = 0; r < bq; r++) {
                int lim = tl.lim[r / MR];
                float *row = s + (int64_t)r * BKP;
                float mx = ISA(row_max)(row, lim) * 1.44269504088896341f;
                float mn = mx > m[r] ? mx : m[r];
                float *orow = o + (i0 + r) * ldo;
                if (isinf(mn) && mn < 0) {
                    memset(row, 0, (size_t)lim * sizeof(float));
                    continue;
                }
                float alpha = l[r] > 0.0f ? ISA(vexp2)(VSPLAT(m[r] - mn))[0] : 0.0f;
                float sum = ISA(row_exp2_sum)(row, lim, mn);
                if (alpha == 0.0f)
                    memset(orow, 0, (size_t)d * sizeof(float));
                else if (alpha != 1.0f)
                    ISA(row_scale)(orow, d, alpha);
                l[r] = l[r] * alpha + sum;
                m[r] = mn;
            }
            /* o += p v, each row block over the keys it can see */
            if (tl.full)
                ISA(gemm)(bq, d, tl.bk, 1.0f, s, BKP, 1, vni, BKP * NB, o + i0 * ldo, ldo, 1);
            else
                for (int r0 = 0; r0 < bq; r0 += MR)
                    ISA(gemm)
                    (bq - r0 < MR ? bq - r0 : MR, d, tl.lim[r0 / MR], 1.0f, s + (int64_t)r0 * BKP,
                     BKP, 1, vni, BKP * NB, o + (i0 + r0) * ldo, ldo, 1);
            if (a->progress)
                a->progress(a->progress_arg);
        }
        if (!any)
            continue;
        for (int r = 0; r < bq; r++)
            if (l[r] > 0.0f) {
                ISA(row_scale)(o + (i0 + r) * ldo, d, 1.0f / l[r]);
                lse[i0 + r] = m[r] * 0.693147180559945309f + logf(l[r]);
            }
    }
    tiles_free(&ts);
}

static void ISA(bwd)(const dt_attn_head_t *a, const dt_attn_head_grad_t *g)
{
    const int d = a->d;
    tiles_t ts;
    int64_t ktile, vtile, kntile;
    float *kt = ISA(pack_all)(a->k, a->ldk, a->tk, d, 1, SCR_K0, a->kv_id, &ktile);
    float *vt = ISA(pack_all)(a->v, a->ldv, a->tk, d, 1, SCR_K1, a->kv_id, &vtile);
    float *kn = ISA(pack_all)(a->k, a->ldk, a->tk, d, 0, SCR_K2, a->kv_id, &kntile);
    /* the query tile's Q and dO: rows (A of the scores and of dP) and
     * panels (B of dK and dV) */
    float *qt = scratch(SCR_Q0, (size_t)BQP * d);
    float *dot = scratch(SCR_Q1, (size_t)BQP * d);
    float *qn = scratch(SCR_Q2, (size_t)PACK_N_SIZE(BQP, d));
    float *don = scratch(SCR_Q3, (size_t)PACK_N_SIZE(BQP, d));
    float *s = scratch(SCR_S0, BQP * BKP);
    float *dp = scratch(SCR_S1, BQP * BKP);

    tiles_init(&ts, a, MR);
    for (int64_t i0 = 0; i0 < a->tq; i0 += BQP) {
        int bq = (int)(a->tq - i0 < BQP ? a->tq - i0 : BQP);
        int packed = 0;
        for (int64_t j0 = 0; j0 < a->tk; j0 += BKP) {
            tile_t tl;
            if (!tile_at(&ts, a, i0, bq, j0, &tl))
                continue;
            if (!packed) {
                ISA(pack_rows)(a->q, a->ldq, i0, bq, d, qt);
                ISA(pack_rows)(g->dout, g->lddo, i0, bq, d, dot);
                ISA(pack_n)(a->q, a->ldq, i0, bq, BQP, d, qn);
                ISA(pack_n)(g->dout, g->lddo, i0, bq, BQP, d, don);
                packed = 1;
            }
            int64_t t = j0 / BKP;
            const float *kti = kt + t * ktile, *vti = vt + t * vtile, *kni = kn + t * kntile;
            /* s = scale q k^T, masked; dp = dout v^T over the same columns */
            for (int r0 = 0; r0 < bq; r0 += (tl.full ? bq : MR)) {
                int nr = tl.full ? bq : (bq - r0 < MR ? bq - r0 : MR);
                int lim = tl.lim[r0 / MR];
                int limp = (lim + VL - 1) / VL * VL;
                ISA(scores)(&tl, r0, nr, qt, kti, s);
                if (limp > 0)
                    ISA(gemm)
                    (nr, limp, d, 1.0f, dot + (int64_t)r0 * d, d, 1, vti, (int64_t)d * NB,
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
            ISA(gemm)(tl.bk, d, bq, 1.0f, s, 1, BKP, don, BQP * NB, g->dv + j0 * a->ldv, a->ldv, 1);
            ISA(gemm)
            (bq, d, tl.bk, a->scale, dp, BKP, 1, kni, BKP * NB, g->dq + i0 * a->ldq, a->ldq, 1);
            ISA(gemm)
            (tl.bk, d, bq, a->scale, dp, 1, BKP, qn, BQP * NB, g->dk + j0 * a->ldk, a->ldk, 1);
            if (a->progress)
                a->progress(a->progress_arg);
        }
    }
    tiles_free(&ts);
}

#undef PACK_N_SIZE
#undef NB
#undef VSPLAT
#undef VI
#undef VF
#undef MR
