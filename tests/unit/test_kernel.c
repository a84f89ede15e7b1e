/* SPDX-License-Identifier: MIT
 *
 * Tests of the one-head CPU attention kernels of kernels/cpu/attn_cpu.h:
 * the tiled fast path and the plain `_ref` path against a naive dense
 * formula written here (two-pass softmax in double, from scratch, with
 * positions and strides) and against tests/ref/ref.h; the accumulate contract
 * (key blocks in any order), the LSE merge (union, huge scores, empty
 * partials), the backward against `_ref` and against central finite
 * differences of a double forward, and the delta helper.
 *
 * Shapes follow the kernel header: q (Tq, D) at ldq, k/v (Tk, D) at ldk/ldv,
 * o (Tq, D) at ldo, lse (Tq). Tiles are 96 queries x 128 keys in 6-row
 * micro-tiles (128 x 256 on the blas kernel), so the lengths used (1, 37,
 * 300, 531) cut tiles at odd places.
 *
 * Not here: multi-head layout, dilation and rings (test_attn.c).
 */
#include "config.h"

#include <criterion/criterion.h>
#include <math.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/macros.h"
#include "common/mem.h"
#include "kernels/cpu/attn_cpu.h"
#include "tests/ref/ref.h"

/* Forward tolerance: element good iff |x - ref| <= ATOL + RTOL * |ref|.
 * The kernels work in fp32 against a double reference; o is a convex
 * combination of N(0, 1) values, so fp32 rounding stays far inside. */
#define ATOL 1e-5f
#define RTOL 1e-4f

/* The backward (fast vs `_ref`, and vs the double reference) is held to
 * the same ATOL, RTOL: its gradients are sums of at most a few hundred fp32
 * products of O(1) terms, and measured errors stay within 1e-6 + 1e-5 |ref|. */

/* Finite differences: central, eps = 1e-2 in double; truncation error is
 * O(eps^2) ~ 1e-4 and the gradient under test is fp32, so 2e-3 absolute
 * plus 2e-3 relative. */
#define FD_EPS 1e-2
#define FD_TOL 2e-3f

#define SEED 20240611u

/* 6 and 40 are not multiples of every vector width: a kernel passes them
 * down (6 to blas, 40 from avx512 to avx2), so every suite covers that. */
static const int Ds[] = { 6, 16, 40, 64, 128 };
static const int64_t Ts[] = { 1, 37, 300, 531 };

/*-- helpers ----------------------------------------------------------------*/

/* Every test that runs a kernel runs once per fast-path kernel, in the
 * suites kernel_avx512, kernel_avx2, kernel_generic and kernel_blas; one
 * this build or CPU lacks is skipped, saying so. */
static void use(const char *name)
{
    if (dt_attn_cpu_kernel_set(name) < 0)
        cr_skip_test("kernel %s: not in this build or not on this CPU", name);
}

#define EVERY_KERNEL(fn)     \
    Test(kernel_avx512, fn)  \
    {                        \
        use("avx512");       \
        fn();                \
    }                        \
    Test(kernel_avx2, fn)    \
    {                        \
        use("avx2");         \
        fn();                \
    }                        \
    Test(kernel_generic, fn) \
    {                        \
        use("generic");      \
        fn();                \
    }                        \
    Test(kernel_blas, fn)    \
    {                        \
        use("blas");         \
        fn();                \
    }

/* n standard normal floats (stream picks an independent tensor). */
static float *randn(uint64_t stream, int64_t n)
{
    float *x = dt_xaligned((size_t)(n > 0 ? n : 1), sizeof(float));
    ref_fill(SEED, stream, n, x);
    return x;
}

static float *zeros(int64_t n)
{
    return dt_xcalloc((size_t)(n > 0 ? n : 1), sizeof(float));
}

static int64_t *iota(int64_t start, int64_t n)
{
    int64_t *p = dt_xmallocarray((size_t)(n > 0 ? n : 1), sizeof(int64_t));
    for (int64_t i = 0; i < n; i++)
        p[i] = start + i;
    return p;
}

/* The empty running state: o rows 0, lse -inf. */
static void state_empty(int64_t tq, int d, float *o, int64_t ldo, float *lse)
{
    for (int64_t i = 0; i < tq; i++) {
        memset(o + i * ldo, 0, (size_t)d * sizeof(float));
        lse[i] = -INFINITY;
    }
}

/* Copy n rows of d at stride ld into a new contiguous (n, d) array. */
static float *pack_rows(const float *x, int64_t ld, int64_t n, int d)
{
    float *y = dt_xaligned((size_t)(n > 0 ? n * d : 1), sizeof(float));
    for (int64_t i = 0; i < n; i++)
        memcpy(y + i * d, x + i * ld, (size_t)d * sizeof(float));
    return y;
}

static bool visible(const dt_attn_head_t *a, int64_t i, int64_t j)
{
    return a->qpos == NULL || a->kpos == NULL || a->kpos[j] <= a->qpos[i];
}

/* The naive dense formula for one head, from scratch (not accumulating):
 * two-pass softmax in double over the visible keys. o (tq, d) contiguous,
 * lse (tq); a query with no visible key gets o = 0, lse = -inf. */
static void naive_fwd(const dt_attn_head_t *a, float *o, float *lse)
{
    const int d = a->d;
    double *s = dt_xmallocarray((size_t)(a->tk > 0 ? a->tk : 1), sizeof(double));
    double *acc = dt_xmallocarray((size_t)d, sizeof(double));

    for (int64_t i = 0; i < a->tq; i++) {
        double m = -INFINITY, sum = 0.0;
        for (int64_t j = 0; j < a->tk; j++) {
            s[j] = -INFINITY;
            if (!visible(a, i, j))
                continue;
            double dot = 0.0;
            for (int c = 0; c < d; c++)
                dot += (double)a->q[i * a->ldq + c] * (double)a->k[j * a->ldk + c];
            s[j] = (double)a->scale * dot;
            m = s[j] > m ? s[j] : m;
        }
        for (int c = 0; c < d; c++)
            acc[c] = 0.0;
        if (!isinf(m)) {
            for (int64_t j = 0; j < a->tk; j++) {
                if (isinf(s[j]))
                    continue;
                double p = exp(s[j] - m);
                sum += p;
                for (int c = 0; c < d; c++)
                    acc[c] += p * (double)a->v[j * a->ldv + c];
            }
        }
        for (int c = 0; c < d; c++)
            o[i * d + c] = sum > 0.0 ? (float)(acc[c] / sum) : 0.0f;
        lse[i] = sum > 0.0 ? (float)(m + log(sum)) : -INFINITY;
    }
    free(acc);
    free(s);
}

typedef void (*fwd_fn)(const dt_attn_head_t *, float *, int64_t, float *);

/* Run the fast and the `_ref` forward from the empty state and compare o
 * and lse of each with the naive formula (computed once); label names the
 * case in any failure output. */
static void check_fwd(const char *label, const dt_attn_head_t *a, int64_t ldo)
{
    static const fwd_fn fns[2] = { dt_attn_head_fwd_cpu, dt_attn_head_fwd_ref };
    static const char *names[2] = { "fast", "_ref" };
    float *o = zeros(a->tq * ldo), *lse = zeros(a->tq);
    float *on = zeros(a->tq * a->d), *lsen = zeros(a->tq);

    naive_fwd(a, on, lsen);
    for (int f = 0; f < 2; f++) {
        char lo[160], ll[160];
        state_empty(a->tq, a->d, o, ldo, lse);
        fns[f](a, o, ldo, lse);
        float *op = pack_rows(o, ldo, a->tq, a->d);
        snprintf(lo, sizeof(lo), "%s %s o", names[f], label);
        snprintf(ll, sizeof(ll), "%s %s lse", names[f], label);
        cr_assert(ref_allclose(lo, op, on, a->tq * a->d, ATOL, RTOL), "%s: o differs from naive",
                  lo);
        cr_assert(ref_allclose(ll, lse, lsen, a->tq, ATOL, RTOL), "%s: lse differs from naive", ll);
        free(op);
    }
    free(lsen);
    free(on);
    free(lse);
    free(o);
}

static dt_attn_head_t head(int64_t tq, int64_t tk, int d, const float *q, int64_t ldq,
                           const float *k, int64_t ldk, const float *v, int64_t ldv,
                           const int64_t *qpos, const int64_t *kpos)
{
    dt_attn_head_t a = {
        .tq = tq,
        .tk = tk,
        .d = d,
        .q = q,
        .ldq = ldq,
        .k = k,
        .ldk = ldk,
        .v = v,
        .ldv = ldv,
        .qpos = qpos,
        .kpos = kpos,
        .scale = 1.0f / sqrtf((float)d),
    };
    return a;
}

/*-- forward ----------------------------------------------------------------*/

/* Every D and T, causal and not, contiguous rows: fast and `_ref` paths. */
static void fwd_fast_and_ref_match_naive(void)
{
    for (size_t di = 0; di < DT_ARRAY_SIZE(Ds); di++) {
        for (size_t ti = 0; ti < DT_ARRAY_SIZE(Ts); ti++) {
            int d = Ds[di];
            int64_t T = Ts[ti];
            float *q = randn(1, T * d), *k = randn(2, T * d), *v = randn(3, T * d);
            int64_t *pos = iota(0, T);
            for (int causal = 0; causal < 2; causal++) {
                char label[96];
                dt_attn_head_t a =
                    head(T, T, d, q, d, k, d, v, d, causal ? pos : NULL, causal ? pos : NULL);
                snprintf(label, sizeof(label), "D=%d T=%lld causal=%d", d, (long long)T, causal);
                check_fwd(label, &a, d);
            }
            free(pos);
            free(v);
            free(k);
            free(q);
        }
    }
}
EVERY_KERNEL(fwd_fast_and_ref_match_naive)

/* Anchor the naive formula of this file to tests/ref/ref.h: the fast kernel
 * equals ref_attn_fwd with H = Hkv = 1. */
static void fwd_fast_matches_tests_ref(void)
{
    const int64_t T = 300;
    const int d = 64;
    float *q = randn(1, T * d), *k = randn(2, T * d), *v = randn(3, T * d);
    float *o = zeros(T * d), *lse = zeros(T), *oref = zeros(T * d), *lref = zeros(T);
    int64_t *pos = iota(0, T);

    for (int causal = 0; causal < 2; causal++) {
        dt_attn_head_t a =
            head(T, T, d, q, d, k, d, v, d, causal ? pos : NULL, causal ? pos : NULL);
        state_empty(T, d, o, d, lse);
        dt_attn_head_fwd_cpu(&a, o, d, lse);
        ref_attn_fwd(T, 1, 1, d, q, k, v, causal, 0.0f, 0, NULL, NULL, oref, lref);
        cr_assert(ref_allclose("o vs ref_attn_fwd", o, oref, T * d, ATOL, RTOL), "causal=%d",
                  causal);
        cr_assert(ref_allclose("lse vs ref_attn_fwd", lse, lref, T, ATOL, RTOL), "causal=%d",
                  causal);
    }
    free(pos);
    free(lref);
    free(oref);
    free(lse);
    free(o);
    free(v);
    free(k);
    free(q);
}
EVERY_KERNEL(fwd_fast_matches_tests_ref)

/* Tq != Tk, both ways, across tile boundaries (no positions: dense). */
static void fwd_tq_ne_tk(void)
{
    static const int64_t shapes[][2] = { { 37, 531 }, { 531, 37 }, { 1, 300 }, { 300, 1 } };
    const int d = 64;

    for (size_t s = 0; s < DT_ARRAY_SIZE(shapes); s++) {
        int64_t tq = shapes[s][0], tk = shapes[s][1];
        float *q = randn(4, tq * d), *k = randn(5, tk * d), *v = randn(6, tk * d);
        dt_attn_head_t a = head(tq, tk, d, q, d, k, d, v, d, NULL, NULL);
        char label[64];
        snprintf(label, sizeof(label), "Tq=%lld Tk=%lld", (long long)tq, (long long)tk);
        check_fwd(label, &a, d);
        free(v);
        free(k);
        free(q);
    }
}
EVERY_KERNEL(fwd_tq_ne_tk)

/* One head of a packed (T, 3, D) qkv tensor (ld = 3D), output into one head
 * of a (T, 2, D) tensor (ldo = 2D); the other head's rows are untouched. */
static void fwd_strided_views(void)
{
    for (size_t di = 0; di < DT_ARRAY_SIZE(Ds); di++) {
        const int d = Ds[di];
        const int64_t T = 300, tq = 37;
        float *x = randn(7, T * 3 * d);
        int64_t *pos = iota(0, T);
        for (int causal = 0; causal < 2; causal++) {
            /* queries: the last tq rows (positions T - tq ..), keys: all */
            dt_attn_head_t a = head(tq, T, d, x + (T - tq) * 3 * d, 3 * d, x + d, 3 * d, x + 2 * d,
                                    3 * d, causal ? pos + (T - tq) : NULL, causal ? pos : NULL);
            dt_attn_head_t sq = head(T, T, d, x, 3 * d, x + d, 3 * d, x + 2 * d, 3 * d,
                                     causal ? pos : NULL, causal ? pos : NULL);
            char label[64];
            snprintf(label, sizeof(label), "strided D=%d causal=%d tq=%lld", d, causal,
                     (long long)tq);
            check_fwd(label, &a, 2 * d);
            snprintf(label, sizeof(label), "strided D=%d causal=%d square", d, causal);
            check_fwd(label, &sq, 2 * d);

            /* the other head of the output is never written */
            float *o = dt_xaligned((size_t)(T * 2 * d), sizeof(float)), *lse = zeros(T);
            for (int64_t e = 0; e < T * 2 * d; e++)
                o[e] = 7.0f;
            state_empty(T, d, o + d, 2 * d, lse);
            dt_attn_head_fwd_cpu(&sq, o + d, 2 * d, lse);
            for (int64_t i = 0; i < T; i++)
                for (int c = 0; c < d; c++)
                    cr_assert_eq(o[i * 2 * d + c], 7.0f,
                                 "D=%d causal=%d: o[%lld, head 0, %d] = %g was overwritten", d,
                                 causal, (long long)i, c, (double)o[i * 2 * d + c]);
            free(lse);
            free(o);
        }
        free(pos);
        free(x);
    }
}
EVERY_KERNEL(fwd_strided_views)

/* Queries at positions 1000.., keys at 600..: key j is visible to query i
 * iff j <= 400 + i, a boundary that moves through the key tiles at 256 and
 * 512. Keys at 0.. are all in the past: same as no mask. */
static void fwd_positions_offset(void)
{
    const int d = 64;
    const int64_t tq = 300, tk = 531;
    float *q = randn(8, tq * d), *k = randn(9, tk * d), *v = randn(10, tk * d);
    int64_t *qp = iota(1000, tq), *kp = iota(600, tk), *kp0 = iota(0, tk);

    dt_attn_head_t a = head(tq, tk, d, q, d, k, d, v, d, qp, kp);
    check_fwd("queries 1000.. keys 600..", &a, d);

    dt_attn_head_t past = head(tq, tk, d, q, d, k, d, v, d, qp, kp0);
    dt_attn_head_t open = head(tq, tk, d, q, d, k, d, v, d, NULL, NULL);
    float *o1 = zeros(tq * d), *l1 = zeros(tq), *o2 = zeros(tq * d), *l2 = zeros(tq);
    state_empty(tq, d, o1, d, l1);
    state_empty(tq, d, o2, d, l2);
    dt_attn_head_fwd_cpu(&past, o1, d, l1);
    dt_attn_head_fwd_cpu(&open, o2, d, l2);
    cr_assert(ref_allclose("keys all past: o vs unmasked", o1, o2, tq * d, ATOL, RTOL));
    cr_assert(ref_allclose("keys all past: lse vs unmasked", l1, l2, tq, ATOL, RTOL));

    /* one of the two position arrays NULL: not causal */
    dt_attn_head_t half = head(tq, tk, d, q, d, k, d, v, d, qp, NULL);
    check_fwd("qpos only: not causal", &half, d);
    state_empty(tq, d, o1, d, l1);
    dt_attn_head_fwd_cpu(&half, o1, d, l1);
    cr_assert(ref_allclose("qpos only: o vs unmasked", o1, o2, tq * d, ATOL, RTOL));

    free(l2);
    free(o2);
    free(l1);
    free(o1);
    free(kp0);
    free(kp);
    free(qp);
    free(v);
    free(k);
    free(q);
}
EVERY_KERNEL(fwd_positions_offset)

/* Positions need not be sorted or contiguous: a scrambled permutation of
 * even positions for keys and odd ones for queries. */
static void fwd_unsorted_positions(void)
{
    const int d = 16;
    const int64_t tq = 300, tk = 531;
    float *q = randn(11, tq * d), *k = randn(12, tk * d), *v = randn(13, tk * d);
    int64_t *qp = dt_xmallocarray((size_t)tq, sizeof(int64_t));
    int64_t *kp = dt_xmallocarray((size_t)tk, sizeof(int64_t));

    /* 7 and 13 are coprime with 300 and 531: i -> 7i mod n is a permutation */
    for (int64_t i = 0; i < tq; i++)
        qp[i] = 2 * ((7 * i) % tq) * 531 / 300 + 1;
    for (int64_t j = 0; j < tk; j++)
        kp[j] = 2 * ((13 * j) % tk);
    dt_attn_head_t a = head(tq, tk, d, q, d, k, d, v, d, qp, kp);
    check_fwd("unsorted positions", &a, d);
    free(kp);
    free(qp);
    free(v);
    free(k);
    free(q);
}
EVERY_KERNEL(fwd_unsorted_positions)

/* Keys entirely in the future of every query leave the state exactly as it
 * was: the empty state stays o = 0, lse = -inf, and a running state is not
 * rescaled. No keys at all (tk = 0) likewise. Queries that see only some
 * keys, next to queries that see none, get the naive answer. */
static void fwd_future_keys_leave_state(void)
{
    const int d = 64;
    const int64_t tq = 300, tk = 531;
    float *q = randn(14, tq * d), *k = randn(15, tk * d), *v = randn(16, tk * d);
    int64_t *qp = iota(0, tq), *kfut = iota(2000, tk), *kpast = iota(0, tk);
    float *o = zeros(tq * d), *lse = zeros(tq);
    fwd_fn fns[2] = { dt_attn_head_fwd_cpu, dt_attn_head_fwd_ref };
    const char *names[2] = { "fast", "ref" };

    for (int f = 0; f < 2; f++) {
        dt_attn_head_t fut = head(tq, tk, d, q, d, k, d, v, d, qp, kfut);
        state_empty(tq, d, o, d, lse);
        fns[f](&fut, o, d, lse);
        for (int64_t i = 0; i < tq; i++) {
            cr_assert(isinf(lse[i]) && lse[i] < 0, "%s: lse[%lld] = %g, want -inf", names[f],
                      (long long)i, (double)lse[i]);
            for (int c = 0; c < d; c++)
                cr_assert_eq(o[i * d + c], 0.0f, "%s: o[%lld, %d] = %g, want 0", names[f],
                             (long long)i, c, (double)o[i * d + c]);
        }

        /* a running state from earlier keys is kept bit for bit */
        dt_attn_head_t past = head(tq, tk, d, q, d, k, d, v, d, qp, kpast);
        state_empty(tq, d, o, d, lse);
        fns[f](&past, o, d, lse);
        float *o0 = pack_rows(o, d, tq, d), *l0 = pack_rows(lse, 1, tq, 1);
        fns[f](&fut, o, d, lse);
        cr_assert(memcmp(o, o0, (size_t)(tq * d) * sizeof(float)) == 0, "%s: future keys changed o",
                  names[f]);
        cr_assert(memcmp(lse, l0, (size_t)tq * sizeof(float)) == 0, "%s: future keys changed lse",
                  names[f]);

        /* tk = 0 */
        dt_attn_head_t none = head(tq, 0, d, q, d, k, d, v, d, qp, kpast);
        fns[f](&none, o, d, lse);
        cr_assert(memcmp(o, o0, (size_t)(tq * d) * sizeof(float)) == 0, "%s: tk=0 changed o",
                  names[f]);
        cr_assert(memcmp(lse, l0, (size_t)tq * sizeof(float)) == 0, "%s: tk=0 changed lse",
                  names[f]);
        free(l0);
        free(o0);
    }

    /* keys at 100..630: queries 0..99 see nothing, the rest see some */
    int64_t *kmid = iota(100, tk);
    dt_attn_head_t mid = head(tq, tk, d, q, d, k, d, v, d, qp, kmid);
    check_fwd("keys at 100..", &mid, d);
    state_empty(tq, d, o, d, lse);
    dt_attn_head_fwd_cpu(&mid, o, d, lse);
    for (int64_t i = 0; i < 100; i++)
        cr_assert(isinf(lse[i]) && lse[i] < 0 && o[i * d] == 0.0f,
                  "query %lld sees no key: lse %g o[0] %g", (long long)i, (double)lse[i],
                  (double)o[i * d]);
    free(kmid);
    free(lse);
    free(o);
    free(kpast);
    free(kfut);
    free(qp);
    free(v);
    free(k);
    free(q);
}
EVERY_KERNEL(fwd_future_keys_leave_state)

/* Accumulating over key blocks in any order equals one call over all keys
 * (and the naive formula): the LSE merge inside the kernel. */
static void fwd_accumulate_blocks_any_order(void)
{
    static const int orders[6][3] = { { 0, 1, 2 }, { 0, 2, 1 }, { 1, 0, 2 },
                                      { 1, 2, 0 }, { 2, 0, 1 }, { 2, 1, 0 } };
    const int d = 64;
    const int64_t tq = 300, tk = 531;
    const int64_t cut[4] = { 0, 100, 300, tk }; /* blocks [cut[b], cut[b+1]) */
    float *q = randn(17, tq * d), *k = randn(18, tk * d), *v = randn(19, tk * d);
    int64_t *qp = iota(231, tq), *kp = iota(0, tk);
    float *o1 = zeros(tq * d), *l1 = zeros(tq), *o = zeros(tq * d), *lse = zeros(tq);
    float *on = zeros(tq * d), *ln = zeros(tq);

    for (int causal = 0; causal < 2; causal++) {
        for (int f = 0; f < 2; f++) {
            fwd_fn fn = f == 0 ? dt_attn_head_fwd_cpu : dt_attn_head_fwd_ref;
            dt_attn_head_t all =
                head(tq, tk, d, q, d, k, d, v, d, causal ? qp : NULL, causal ? kp : NULL);
            state_empty(tq, d, o1, d, l1);
            fn(&all, o1, d, l1);
            naive_fwd(&all, on, ln);
            for (int r = 0; r < 6; r++) {
                state_empty(tq, d, o, d, lse);
                for (int s = 0; s < 3; s++) {
                    int b = orders[r][s];
                    int64_t j0 = cut[b], n = cut[b + 1] - cut[b];
                    dt_attn_head_t blk = head(tq, n, d, q, d, k + j0 * d, d, v + j0 * d, d,
                                              causal ? qp : NULL, causal ? kp + j0 : NULL);
                    fn(&blk, o, d, lse);
                }
                char label[96];
                snprintf(label, sizeof(label), "%s causal=%d order %d%d%d vs one call",
                         f ? "ref" : "fast", causal, orders[r][0], orders[r][1], orders[r][2]);
                cr_assert(ref_allclose(label, o, o1, tq * d, ATOL, RTOL), "%s: o", label);
                cr_assert(ref_allclose(label, lse, l1, tq, ATOL, RTOL), "%s: lse", label);
                cr_assert(ref_allclose(label, o, on, tq * d, ATOL, RTOL), "%s: o vs naive", label);
                cr_assert(ref_allclose(label, lse, ln, tq, ATOL, RTOL), "%s: lse vs naive", label);
            }
        }
    }
    free(ln);
    free(on);
    free(lse);
    free(o);
    free(l1);
    free(o1);
    free(kp);
    free(qp);
    free(v);
    free(k);
    free(q);
}
EVERY_KERNEL(fwd_accumulate_blocks_any_order)

/* The kernel calls progress between tiles: at least once per tile computed. */
static void count_calls(void *arg)
{
    (*(int *)arg)++;
}

static void fwd_calls_progress(void)
{
    const int d = 16;
    const int64_t T = 531; /* 5 query tiles x 3 key tiles */
    float *q = randn(1, T * d), *k = randn(2, T * d), *v = randn(3, T * d);
    float *o = zeros(T * d), *lse = zeros(T);
    int calls = 0;
    dt_attn_head_t a = head(T, T, d, q, d, k, d, v, d, NULL, NULL);

    a.progress = count_calls;
    a.progress_arg = &calls;
    state_empty(T, d, o, d, lse);
    dt_attn_head_fwd_cpu(&a, o, d, lse);
    cr_assert_geq(calls, 15, "progress called %d times over 15 tiles", calls);
    free(lse);
    free(o);
    free(v);
    free(k);
    free(q);
}
EVERY_KERNEL(fwd_calls_progress)


/*-- merge ------------------------------------------------------------------*/

/* Two partials over disjoint key blocks, merged (in both orders, at strides),
 * equal attention over the union. Causal with queries at 0..: the second
 * block is empty for the first 200 queries (-inf partials on either side). */
static void merge_equals_union(void)
{
    const int d = 64;
    const int64_t tq = 300, tk = 531, cut = 200;
    float *q = randn(20, tq * d), *k = randn(21, tk * d), *v = randn(22, tk * d);
    int64_t *qp = iota(0, tq), *kp = iota(0, tk);
    /* partials at stride 2d (one head of a (tq, 2, d) buffer) */
    float *oa = zeros(tq * 2 * d), *ob = zeros(tq * 2 * d), *la = zeros(tq), *lb = zeros(tq);
    float *on = zeros(tq * d), *ln = zeros(tq);

    for (int causal = 0; causal < 2; causal++) {
        dt_attn_head_t all =
            head(tq, tk, d, q, d, k, d, v, d, causal ? qp : NULL, causal ? kp : NULL);
        dt_attn_head_t A =
            head(tq, cut, d, q, d, k, d, v, d, causal ? qp : NULL, causal ? kp : NULL);
        dt_attn_head_t B = head(tq, tk - cut, d, q, d, k + cut * d, d, v + cut * d, d,
                                causal ? qp : NULL, causal ? kp + cut : NULL);
        naive_fwd(&all, on, ln);
        for (int order = 0; order < 2; order++) {
            state_empty(tq, d, oa + d, 2 * d, la);
            state_empty(tq, d, ob, 2 * d, lb);
            dt_attn_head_fwd_cpu(&A, oa + d, 2 * d, la);
            dt_attn_head_fwd_cpu(&B, ob, 2 * d, lb);
            float *o = order == 0 ? oa + d : ob, *l = order == 0 ? la : lb;
            if (order == 0)
                dt_attn_merge_cpu(tq, d, oa + d, 2 * d, la, ob, 2 * d, lb);
            else
                dt_attn_merge_cpu(tq, d, ob, 2 * d, lb, oa + d, 2 * d, la);
            float *op = pack_rows(o, 2 * d, tq, d);
            char label[64];
            snprintf(label, sizeof(label), "merge causal=%d order=%d", causal, order);
            cr_assert(ref_allclose(label, op, on, tq * d, ATOL, RTOL), "%s: o", label);
            cr_assert(ref_allclose(label, l, ln, tq, ATOL, RTOL), "%s: lse", label);
            free(op);
        }
    }
    free(ln);
    free(on);
    free(lb);
    free(la);
    free(ob);
    free(oa);
    free(kp);
    free(qp);
    free(v);
    free(k);
    free(q);
}
EVERY_KERNEL(merge_equals_union)

/* Scores of order +-1e4 (q and k scaled by 100): exp of any score would
 * overflow. Outputs stay finite; the kernel over the union, the merge of
 * two partials (both orders), the kernel accumulating the two blocks (both
 * orders) and the naive formula agree. */
static void merge_huge_scores(void)
{
    const int d = 64;
    const int64_t tq = 300, tk = 531, cut = 256;
    float *q = randn(23, tq * d), *k = randn(24, tk * d), *v = randn(25, tk * d);
    float *o1 = zeros(tq * d), *l1 = zeros(tq), *oa = zeros(tq * d), *la = zeros(tq);
    float *ob = zeros(tq * d), *lb = zeros(tq), *on = zeros(tq * d), *ln = zeros(tq);
    double maxabs = 0.0;

    for (int64_t e = 0; e < tq * d; e++)
        q[e] *= 100.0f;
    for (int64_t e = 0; e < tk * d; e++)
        k[e] *= 100.0f;
    dt_attn_head_t all = head(tq, tk, d, q, d, k, d, v, d, NULL, NULL);
    dt_attn_head_t A = head(tq, cut, d, q, d, k, d, v, d, NULL, NULL);
    dt_attn_head_t B = head(tq, tk - cut, d, q, d, k + cut * d, d, v + cut * d, d, NULL, NULL);

    state_empty(tq, d, o1, d, l1);
    dt_attn_head_fwd_cpu(&all, o1, d, l1);
    naive_fwd(&all, on, ln);
    for (int64_t i = 0; i < tq; i++) {
        cr_assert(isfinite(l1[i]), "union lse[%lld] = %g", (long long)i, (double)l1[i]);
        maxabs = fabs((double)l1[i]) > maxabs ? fabs((double)l1[i]) : maxabs;
    }
    cr_assert_gt(maxabs, 5e3, "scores not huge: max |lse| = %g", maxabs);
    for (int64_t e = 0; e < tq * d; e++)
        cr_assert(isfinite(o1[e]), "union o[%lld] = %g", (long long)e, (double)o1[e]);
    cr_assert(ref_allclose("huge: union o vs naive", o1, on, tq * d, ATOL, RTOL));
    cr_assert(ref_allclose("huge: union lse vs naive", l1, ln, tq, ATOL, RTOL));

    for (int order = 0; order < 2; order++) {
        state_empty(tq, d, oa, d, la);
        state_empty(tq, d, ob, d, lb);
        dt_attn_head_fwd_cpu(&A, oa, d, la);
        dt_attn_head_fwd_cpu(&B, ob, d, lb);
        float *o = order == 0 ? oa : ob, *l = order == 0 ? la : lb;
        if (order == 0)
            dt_attn_merge_cpu(tq, d, oa, d, la, ob, d, lb);
        else
            dt_attn_merge_cpu(tq, d, ob, d, lb, oa, d, la);
        for (int64_t e = 0; e < tq * d; e++)
            cr_assert(isfinite(o[e]), "order %d: merged o[%lld] = %g", order, (long long)e,
                      (double)o[e]);
        cr_assert(ref_allclose("huge: merged o vs union", o, o1, tq * d, ATOL, RTOL), "order %d",
                  order);
        cr_assert(ref_allclose("huge: merged lse vs union", l, l1, tq, ATOL, RTOL), "order %d",
                  order);
    }

    /* the same two blocks accumulated inside the kernel, both orders */
    for (int order = 0; order < 2; order++) {
        state_empty(tq, d, oa, d, la);
        dt_attn_head_fwd_cpu(order == 0 ? &A : &B, oa, d, la);
        dt_attn_head_fwd_cpu(order == 0 ? &B : &A, oa, d, la);
        cr_assert(ref_allclose("huge: accumulated o vs union", oa, o1, tq * d, ATOL, RTOL),
                  "order %d", order);
        cr_assert(ref_allclose("huge: accumulated lse vs union", la, l1, tq, ATOL, RTOL),
                  "order %d", order);
    }

    /* by hand: equal lse of 100 (expf(100) overflows fp32) averages;
     * +-1e4 picks the larger side */
    float x[4] = { 1, 2, 3, 4 }, y[4] = { 5, 6, 7, 8 };
    float lx = 100.0f, ly = 100.0f;
    dt_attn_merge_cpu(1, 4, x, 4, &lx, y, 4, &ly);
    for (int c = 0; c < 4; c++)
        cr_assert_float_eq(x[c], (float)(c + 3), 1e-5f, "equal lse 100: o[%d] = %g, want %d", c,
                           (double)x[c], c + 3);
    cr_assert_float_eq(lx, 100.0f + logf(2.0f), 1e-4f, "equal lse 100: lse %g", (double)lx);

    float x2[4] = { 1, 2, 3, 4 }, lx2 = 1e4f, ly2 = -1e4f;
    dt_attn_merge_cpu(1, 4, x2, 4, &lx2, y, 4, &ly2);
    for (int c = 0; c < 4; c++)
        cr_assert_eq(x2[c], (float)(c + 1), "1e4 vs -1e4: o[%d] = %g", c, (double)x2[c]);
    cr_assert_eq(lx2, 1e4f, "1e4 vs -1e4: lse %g", (double)lx2);

    float x3[4] = { 1, 2, 3, 4 }, lx3 = -1e4f, ly3 = 1e4f;
    dt_attn_merge_cpu(1, 4, x3, 4, &lx3, y, 4, &ly3);
    for (int c = 0; c < 4; c++)
        cr_assert_eq(x3[c], y[c], "-1e4 vs 1e4: o[%d] = %g", c, (double)x3[c]);
    cr_assert_eq(lx3, 1e4f, "-1e4 vs 1e4: lse %g", (double)lx3);

    free(ln);
    free(on);
    free(lb);
    free(ob);
    free(la);
    free(oa);
    free(l1);
    free(o1);
    free(v);
    free(k);
    free(q);
}
EVERY_KERNEL(merge_huge_scores)

/* -inf marks an empty partial: merging one in changes nothing; merging into
 * one copies the other; two empties stay empty. Rows at strides 6 and 5. */
static void merge_neg_inf_partials(void)
{
    const int d = 4;
    float o1[3 * 6], o2[3 * 5];
    float l1[3] = { -INFINITY, 0.5f, -INFINITY };
    float l2[3] = { 1.5f, -INFINITY, -INFINITY };

    for (int i = 0; i < 3; i++) {
        for (int c = 0; c < 6; c++)
            o1[i * 6 + c] = l1[i] == -INFINITY ? 0.0f : 10.0f * (float)i + (float)c;
        for (int c = 0; c < 5; c++)
            o2[i * 5 + c] = l2[i] == -INFINITY ? 0.0f : -10.0f * (float)i - (float)c - 1.0f;
    }
    /* padding columns carry a sentinel that must survive */
    for (int i = 0; i < 3; i++) {
        o1[i * 6 + 4] = 99.0f;
        o1[i * 6 + 5] = 99.0f;
    }
    dt_attn_merge_cpu(3, d, o1, 6, l1, o2, 5, l2);

    /* row 0: left empty -> copy of right */
    cr_assert_eq(l1[0], 1.5f, "row 0 lse %g, want 1.5", (double)l1[0]);
    for (int c = 0; c < d; c++)
        cr_assert_eq(o1[c], o2[c], "row 0: o[%d] = %g, want %g", c, (double)o1[c], (double)o2[c]);
    /* row 1: right empty -> unchanged */
    cr_assert_eq(l1[1], 0.5f, "row 1 lse %g, want 0.5", (double)l1[1]);
    for (int c = 0; c < d; c++)
        cr_assert_eq(o1[6 + c], 10.0f + (float)c, "row 1: o[%d] = %g", c, (double)o1[6 + c]);
    /* row 2: both empty */
    cr_assert(isinf(l1[2]) && l1[2] < 0, "row 2 lse %g, want -inf", (double)l1[2]);
    for (int c = 0; c < d; c++)
        cr_assert_eq(o1[12 + c], 0.0f, "row 2: o[%d] = %g", c, (double)o1[12 + c]);
    for (int i = 0; i < 3; i++)
        cr_assert(o1[i * 6 + 4] == 99.0f && o1[i * 6 + 5] == 99.0f, "row %d: merge wrote past d",
                  i);
    /* the right side is read only */
    cr_assert_eq(l2[0], 1.5f);
    cr_assert(isinf(l2[1]) && isinf(l2[2]));
}
EVERY_KERNEL(merge_neg_inf_partials)

/*-- backward ---------------------------------------------------------------*/

/* Forward (fast), delta, then one backward: the gradients of one head into
 * dq, dk, dv, which hold g0 on entry (the backward adds). */
typedef void (*bwd_fn)(const dt_attn_head_t *, const dt_attn_head_grad_t *);

static void fwd_for_bwd(const dt_attn_head_t *a, const float *dout, int64_t lddo, float *o,
                        float *lse, float *delta)
{
    state_empty(a->tq, a->d, o, a->d, lse);
    dt_attn_head_fwd_cpu(a, o, a->d, lse);
    dt_attn_delta_cpu(a->tq, a->d, dout, lddo, o, a->d, delta);
}

/* Fast vs `_ref` backward over every D, a few T, causal and not, with
 * gradients accumulated onto nonzero starting values, and (contiguous,
 * Tq = Tk) against ref_attn_bwd with H = Hkv = 1 plus the starting values. */
static void bwd_fast_matches_ref(void)
{
    static const int64_t bts[] = { 1, 37, 300 };
    for (size_t di = 0; di < DT_ARRAY_SIZE(Ds); di++) {
        for (size_t ti = 0; ti < DT_ARRAY_SIZE(bts); ti++) {
            const int d = Ds[di];
            const int64_t T = bts[ti], n = T * d;
            float *q = randn(30, n), *k = randn(31, n), *v = randn(32, n), *dout = randn(33, n);
            float *g0 = randn(34, n), *o = zeros(n), *lse = zeros(T), *delta = zeros(T);
            float *gf[3], *gr[3], *gx[3];
            int64_t *pos = iota(0, T);
            for (int g = 0; g < 3; g++) {
                gf[g] = zeros(n);
                gr[g] = zeros(n);
                gx[g] = zeros(n);
            }
            for (int causal = 0; causal < 2; causal++) {
                dt_attn_head_t a =
                    head(T, T, d, q, d, k, d, v, d, causal ? pos : NULL, causal ? pos : NULL);
                fwd_for_bwd(&a, dout, d, o, lse, delta);
                for (int g = 0; g < 3; g++) {
                    memcpy(gf[g], g0, (size_t)n * sizeof(float));
                    memcpy(gr[g], g0, (size_t)n * sizeof(float));
                }
                dt_attn_head_grad_t G = { .dout = dout,
                                          .lddo = d,
                                          .lse = lse,
                                          .delta = delta,
                                          .dq = gf[0],
                                          .dk = gf[1],
                                          .dv = gf[2] };
                dt_attn_head_bwd_cpu(&a, &G);
                G.dq = gr[0];
                G.dk = gr[1];
                G.dv = gr[2];
                dt_attn_head_bwd_ref(&a, &G);
                ref_attn_bwd(T, 1, 1, d, q, k, v, causal, 0.0f, 0, NULL, NULL, dout, gx[0], gx[1],
                             gx[2]);
                for (int g = 0; g < 3; g++) {
                    static const char *nm[3] = { "dq", "dk", "dv" };
                    char label[96];
                    for (int64_t e = 0; e < n; e++)
                        gx[g][e] += g0[e];
                    snprintf(label, sizeof(label), "%s D=%d T=%lld causal=%d fast vs _ref", nm[g],
                             d, (long long)T, causal);
                    cr_assert(ref_allclose(label, gf[g], gr[g], n, ATOL, RTOL), "%s", label);
                    snprintf(label, sizeof(label), "%s D=%d T=%lld causal=%d fast vs ref_attn_bwd",
                             nm[g], d, (long long)T, causal);
                    cr_assert(ref_allclose(label, gf[g], gx[g], n, ATOL, RTOL), "%s", label);
                }
            }
            for (int g = 0; g < 3; g++) {
                free(gx[g]);
                free(gr[g]);
                free(gf[g]);
            }
            free(pos);
            free(delta);
            free(lse);
            free(o);
            free(g0);
            free(dout);
            free(v);
            free(k);
            free(q);
        }
    }
}
EVERY_KERNEL(bwd_fast_matches_ref)

/* kv_id: the calls that name the same K and V share the kernel's packed
 * copies (the query heads of a GQA group). Each result is bit for bit what
 * the same call without a kv_id gives; a fresh kv_id after K changed in
 * place, and the same kv_id over other K and V at another address, use
 * the new contents. Forward and backward, causal, T cutting tiles. */
static void shared_kv_id(void)
{
    const int64_t T = 531;
    const int d = 64;
    const int64_t n = T * d;
    float *q[2] = { randn(60, n), randn(61, n) }, *k = randn(62, n), *v = randn(63, n);
    float *dout = randn(64, n), *k2 = zeros(n), *v2 = zeros(n);
    int64_t *pos = iota(0, T);
    float *o[2][2], *lse[2][2], *ref_o[3][2], *ref_l[3][2];
    for (int w = 0; w < 2; w++)
        for (int h = 0; h < 2; h++) {
            o[w][h] = zeros(n);
            lse[w][h] = zeros(T);
        }
    for (int r = 0; r < 3; r++)
        for (int h = 0; h < 2; h++) {
            ref_o[r][h] = zeros(n);
            ref_l[r][h] = zeros(T);
        }
    uint64_t id = dt_attn_kv_ids(3);
    cr_assert_neq(id, 0);
    cr_assert_gt(dt_attn_kv_ids(1), id + 2, "ids are handed out once");
    /* round 0: k, v under id; round 1: k changed in place, under id + 1;
     * round 2: other contents at another address (k2, v2), under id + 1.
     * The references (no kv_id) first, on copies holding each round's
     * contents; then the shared calls back to back, so that nothing but
     * the tag stands between a round and the last round's packs. */
    float *kmod = zeros(n);
    memcpy(kmod, k, (size_t)n * sizeof(float));
    for (int64_t i = 0; i < n; i += 7)
        kmod[i] += 0.5f;
    memcpy(k2, kmod, (size_t)n * sizeof(float));
    memcpy(v2, v, (size_t)n * sizeof(float));
    for (int64_t i = 0; i < n; i += 5)
        v2[i] -= 0.25f;
    for (int w = 0; w < 2; w++)
        for (int round = 0; round < 3; round++) {
            if (w == 1 && round == 1)
                memcpy(k, kmod, (size_t)n * sizeof(float));
            const float *kk = w == 0 ? (round == 0 ? k : round == 1 ? kmod : k2)
                                     : (round == 2 ? k2 : k);
            const float *vv = round == 2 ? v2 : v;
            for (int h = 0; h < 2; h++) {
                dt_attn_head_t a = head(T, T, d, q[h], d, kk, d, vv, d, pos, pos);
                a.kv_id = w ? id + (round > 0) : 0;
                float *oo = w ? o[1][h] : o[0][h], *ll = w ? lse[1][h] : lse[0][h];
                state_empty(T, d, oo, d, ll);
                dt_attn_head_fwd_cpu(&a, oo, d, ll);
                if (w == 0) { /* keep this round's reference */
                    memcpy(ref_o[round][h], oo, (size_t)n * sizeof(float));
                    memcpy(ref_l[round][h], ll, (size_t)T * sizeof(float));
                    continue;
                }
                cr_assert(memcmp(ref_o[round][h], oo, (size_t)n * sizeof(float)) == 0,
                          "round %d head %d: o with a shared kv_id differs", round, h);
                cr_assert(memcmp(ref_l[round][h], ll, (size_t)T * sizeof(float)) == 0,
                          "round %d head %d: lse with a shared kv_id differs", round, h);
            }
        }
    memcpy(k, kmod, (size_t)n * sizeof(float)); /* the backward's k: round 1's */
    free(kmod);
    /* and the backward, dK and dV summed over both heads as a GQA group */
    float *g[2][3];
    for (int w = 0; w < 2; w++)
        for (int j = 0; j < 3; j++)
            g[w][j] = zeros(n);
    float *oo[2], *ll[2], *delta[2];
    for (int h = 0; h < 2; h++) { /* both forwards first: the backwards then run back to back */
        dt_attn_head_t a = head(T, T, d, q[h], d, k, d, v, d, pos, pos);
        oo[h] = zeros(n);
        ll[h] = zeros(T);
        delta[h] = zeros(T);
        fwd_for_bwd(&a, dout, d, oo[h], ll[h], delta[h]);
    }
    for (int w = 0; w < 2; w++)
        for (int h = 0; h < 2; h++) {
            dt_attn_head_t a = head(T, T, d, q[h], d, k, d, v, d, pos, pos);
            a.kv_id = w ? id + 2 : 0;
            dt_attn_head_grad_t gd = { .dout = dout, .lddo = d, .lse = ll[h], .delta = delta[h],
                                       .dq = g[w][0], .dk = g[w][1], .dv = g[w][2] };
            dt_attn_head_bwd_cpu(&a, &gd);
        }
    for (int h = 0; h < 2; h++) {
        free(delta[h]);
        free(ll[h]);
        free(oo[h]);
    }
    for (int j = 0; j < 3; j++)
        cr_assert(memcmp(g[0][j], g[1][j], (size_t)n * sizeof(float)) == 0,
                  "backward gradient %d with a shared kv_id differs", j);
    for (int w = 0; w < 2; w++) {
        for (int j = 0; j < 3; j++)
            free(g[w][j]);
        for (int h = 0; h < 2; h++) {
            free(o[w][h]);
            free(lse[w][h]);
        }
    }
    for (int r = 0; r < 3; r++)
        for (int h = 0; h < 2; h++) {
            free(ref_o[r][h]);
            free(ref_l[r][h]);
        }
    free(pos);
    free(v2);
    free(k2);
    free(dout);
    free(v);
    free(k);
    free(q[1]);
    free(q[0]);
}
EVERY_KERNEL(shared_kv_id)

/* Strided views (one head of packed (T, 3, D) q/k/v, gradients at the same
 * strides), Tq != Tk with offset positions, and key blocks whose gradients
 * sum to the one-call gradient. */
static void bwd_strided_offset_blocks(void)
{
    const int d = 64;
    const int64_t tq = 300, tk = 531, cut = 256;
    float *xq = randn(40, tq * 3 * d), *xkv = randn(41, tk * 3 * d);
    float *dout = randn(42, tq * 2 * d); /* one head of (tq, 2, d) */
    float *o = zeros(tq * d), *lse = zeros(tq), *delta = zeros(tq);
    int64_t *qp = iota(1000, tq), *kp = iota(600, tk);
    float *dq[3], *dkv[3]; /* fast one call, ref, fast in two blocks */

    for (int x = 0; x < 3; x++) {
        dq[x] = zeros(tq * 3 * d);
        dkv[x] = zeros(tk * 3 * d);
    }
    /* q is head 0 of xq; k is head 1, v head 2 of xkv */
    dt_attn_head_t a = head(tq, tk, d, xq, 3 * d, xkv + d, 3 * d, xkv + 2 * d, 3 * d, qp, kp);
    state_empty(tq, d, o, d, lse);
    dt_attn_head_fwd_cpu(&a, o, d, lse);
    dt_attn_delta_cpu(tq, d, dout + d, 2 * d, o, d, delta);
    for (int x = 0; x < 2; x++) {
        dt_attn_head_grad_t G = { .dout = dout + d,
                                  .lddo = 2 * d,
                                  .lse = lse,
                                  .delta = delta,
                                  .dq = dq[x],
                                  .dk = dkv[x] + d,
                                  .dv = dkv[x] + 2 * d };
        (x == 0 ? dt_attn_head_bwd_cpu : dt_attn_head_bwd_ref)(&a, &G);
    }
    for (int b = 0; b < 2; b++) {
        int64_t j0 = b == 0 ? cut : 0, n = b == 0 ? tk - cut : cut; /* later block first */
        dt_attn_head_t blk = head(tq, n, d, xq, 3 * d, xkv + j0 * 3 * d + d, 3 * d,
                                  xkv + j0 * 3 * d + 2 * d, 3 * d, qp, kp + j0);
        dt_attn_head_grad_t G = { .dout = dout + d,
                                  .lddo = 2 * d,
                                  .lse = lse,
                                  .delta = delta,
                                  .dq = dq[2],
                                  .dk = dkv[2] + j0 * 3 * d + d,
                                  .dv = dkv[2] + j0 * 3 * d + 2 * d };
        dt_attn_head_bwd_cpu(&blk, &G);
    }
    cr_assert(ref_allclose("strided dq fast vs _ref", dq[0], dq[1], tq * 3 * d, ATOL, RTOL));
    cr_assert(ref_allclose("strided dk,dv fast vs _ref", dkv[0], dkv[1], tk * 3 * d, ATOL, RTOL));
    cr_assert(ref_allclose("blocks dq vs one call", dq[2], dq[0], tq * 3 * d, ATOL, RTOL));
    cr_assert(ref_allclose("blocks dk,dv vs one call", dkv[2], dkv[0], tk * 3 * d, ATOL, RTOL));
    /* untouched columns: dq heads 1, 2 and dkv head 0 stay 0 */
    for (int x = 0; x < 3; x++) {
        for (int64_t i = 0; i < tq; i++)
            for (int c = d; c < 3 * d; c++)
                cr_assert_eq(dq[x][i * 3 * d + c], 0.0f, "run %d wrote dq outside its head", x);
        for (int64_t j = 0; j < tk; j++)
            for (int c = 0; c < d; c++)
                cr_assert_eq(dkv[x][j * 3 * d + c], 0.0f, "run %d wrote dk outside its head", x);
    }
    for (int x = 0; x < 3; x++) {
        free(dkv[x]);
        free(dq[x]);
    }
    free(kp);
    free(qp);
    free(delta);
    free(lse);
    free(o);
    free(dout);
    free(xkv);
    free(xq);
}
EVERY_KERNEL(bwd_strided_offset_blocks)

/* sum(o * dout) for one head, all in double, o from scratch; causal by index. */
static double loss_d(int64_t T, int d, const double *q, const double *k, const double *v,
                     const double *dout, int causal, double scale)
{
    double loss = 0.0;
    double *s = dt_xmallocarray((size_t)T, sizeof(double));

    for (int64_t i = 0; i < T; i++) {
        int64_t nj = causal ? i + 1 : T;
        double m = -INFINITY, sum = 0.0;
        for (int64_t j = 0; j < nj; j++) {
            double dot = 0.0;
            for (int c = 0; c < d; c++)
                dot += q[i * d + c] * k[j * d + c];
            s[j] = scale * dot;
            m = s[j] > m ? s[j] : m;
        }
        for (int64_t j = 0; j < nj; j++) {
            s[j] = exp(s[j] - m);
            sum += s[j];
        }
        for (int c = 0; c < d; c++) {
            double oc = 0.0;
            for (int64_t j = 0; j < nj; j++)
                oc += s[j] * v[j * d + c];
            loss += oc / sum * dout[i * d + c];
        }
    }
    free(s);
    return loss;
}

/* Central finite differences of the double forward, element by element of
 * q, k and v, against the fast and `_ref` backward. */
static void bwd_matches_finite_differences(void)
{
    const int64_t T = 9;
    const int d = 16, n = (int)T * d;
    float *in[3] = { randn(50, n), randn(51, n), randn(52, n) };
    float *dout = randn(53, n), *o = zeros(n), *lse = zeros(T), *delta = zeros(T);
    double *x[3], *dd = dt_xmallocarray((size_t)n, sizeof(double));
    float *fd[3], *gf[3], *gr[3];
    int64_t *pos = iota(0, T);
    const float scale = 1.0f / sqrtf((float)d);

    for (int t = 0; t < 3; t++) {
        x[t] = dt_xmallocarray((size_t)n, sizeof(double));
        fd[t] = zeros(n);
        gf[t] = zeros(n);
        gr[t] = zeros(n);
    }
    for (int e = 0; e < n; e++)
        dd[e] = dout[e];
    for (int causal = 0; causal < 2; causal++) {
        for (int t = 0; t < 3; t++)
            for (int e = 0; e < n; e++)
                x[t][e] = in[t][e];
        for (int t = 0; t < 3; t++) {
            for (int e = 0; e < n; e++) {
                double keep = x[t][e];
                x[t][e] = keep + FD_EPS;
                double up = loss_d(T, d, x[0], x[1], x[2], dd, causal, scale);
                x[t][e] = keep - FD_EPS;
                double dn = loss_d(T, d, x[0], x[1], x[2], dd, causal, scale);
                x[t][e] = keep;
                fd[t][e] = (float)((up - dn) / (2.0 * FD_EPS));
            }
            memset(gf[t], 0, (size_t)n * sizeof(float));
            memset(gr[t], 0, (size_t)n * sizeof(float));
        }
        dt_attn_head_t a =
            head(T, T, d, in[0], d, in[1], d, in[2], d, causal ? pos : NULL, causal ? pos : NULL);
        fwd_for_bwd(&a, dout, d, o, lse, delta);
        dt_attn_head_grad_t G = { .dout = dout,
                                  .lddo = d,
                                  .lse = lse,
                                  .delta = delta,
                                  .dq = gf[0],
                                  .dk = gf[1],
                                  .dv = gf[2] };
        dt_attn_head_bwd_cpu(&a, &G);
        G.dq = gr[0];
        G.dk = gr[1];
        G.dv = gr[2];
        dt_attn_head_bwd_ref(&a, &G);
        for (int t = 0; t < 3; t++) {
            static const char *nm[3] = { "dq", "dk", "dv" };
            char label[64];
            snprintf(label, sizeof(label), "fast %s vs finite diff causal=%d", nm[t], causal);
            cr_assert(ref_allclose(label, gf[t], fd[t], n, FD_TOL, FD_TOL), "%s", label);
            snprintf(label, sizeof(label), "_ref %s vs finite diff causal=%d", nm[t], causal);
            cr_assert(ref_allclose(label, gr[t], fd[t], n, FD_TOL, FD_TOL), "%s", label);
        }
    }
    for (int t = 0; t < 3; t++) {
        free(gr[t]);
        free(gf[t]);
        free(fd[t]);
        free(x[t]);
        free(in[t]);
    }
    free(pos);
    free(dd);
    free(delta);
    free(lse);
    free(o);
    free(dout);
}
EVERY_KERNEL(bwd_matches_finite_differences)

/*-- delta ------------------------------------------------------------------*/

Test(kernel, delta_matches_loop)
{
    const int64_t n = 37;
    const int d = 64;
    float *dout = randn(60, n * 3 * d), *o = randn(61, n * 2 * d);
    float *delta = zeros(n), *want = zeros(n);

    /* dout: head 2 of (n, 3, d); o: head 1 of (n, 2, d) */
    dt_attn_delta_cpu(n, d, dout + 2 * d, 3 * d, o + d, 2 * d, delta);
    for (int64_t i = 0; i < n; i++) {
        double acc = 0.0;
        for (int c = 0; c < d; c++)
            acc += (double)dout[i * 3 * d + 2 * d + c] * (double)o[i * 2 * d + d + c];
        want[i] = (float)acc;
    }
    cr_assert(ref_allclose("delta", delta, want, n, ATOL, RTOL));
    dt_attn_delta_cpu(0, d, dout, d, o, d, delta); /* n = 0 writes nothing */
    cr_assert(ref_allclose("delta after n=0", delta, want, n, 0.0f, 0.0f));
    free(want);
    free(delta);
    free(o);
    free(dout);
}

/* Which kernel a head size runs on: the chosen one when its vector width
 * divides d, else the next one down, blas for any d; unknown names are
 * refused and leave the choice alone. */
Test(kernel, choice_follows_head_size)
{
    cr_assert_eq(dt_attn_cpu_kernel_set("no-such-kernel"), -1);
    cr_assert_eq(dt_attn_cpu_kernel_set("blas"), 0);
    cr_assert_str_eq(dt_attn_cpu_kernel(64), "blas");
    cr_assert_eq(dt_attn_cpu_kernel_set("generic"), 0);
    cr_assert_str_eq(dt_attn_cpu_kernel(64), "generic");
    cr_assert_str_eq(dt_attn_cpu_kernel(6), "blas");
    if (dt_attn_cpu_kernel_set("avx512") == 0) {
        cr_assert_str_eq(dt_attn_cpu_kernel(64), "avx512");
        cr_assert_str_eq(dt_attn_cpu_kernel(80), "avx512");
        cr_assert_str_eq(dt_attn_cpu_kernel(40), "avx2");
        cr_assert_str_eq(dt_attn_cpu_kernel(12), "generic");
        cr_assert_str_eq(dt_attn_cpu_kernel(6), "blas");
    }
    cr_assert_eq(dt_attn_cpu_kernel_set("auto"), 0);
    cr_assert_neq(strstr(dt_attn_cpu_kernel_names(), "generic"), NULL);
}
