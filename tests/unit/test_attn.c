/* SPDX-License-Identifier: MIT
 *
 * Tests of engine/attn/attn.h on one rank (a 'solo' communicator, no MPI):
 * dense and dilated attention, forward and backward, causal or not, GQA,
 * against the double-precision definition in tests/ref/ref.h (the multiset
 * union of the branches' keys); the refusals of dt_attn_check and
 * dt_attn_parse_branches with the message the user would see; and
 * dt_attn_flops against closed forms, hand counts and a brute-force count
 * of visible (query, key) pairs.
 *
 * Shapes: q (T, H, D), k/v (T, Hkv, D), o (T, H, D), lse (H, T); on one
 * rank c = T. Not here: several ranks and the ring (tests/integration),
 * the one-head kernels (test_kernel.c).
 */
#include "config.h"

#include <criterion/criterion.h>
#include <math.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/err.h"
#include "common/macros.h"
#include "common/mem.h"
#include "engine/attn/attn.h"
#include "engine/comm/comm.h"
#include "spec/mask.h"
#include "tests/ref/ref.h"

/* Element good iff |x - ref| <= ATOL + RTOL * |ref|: fp32 kernels against
 * a double reference. The forward's largest measured error is below 1e-6.
 * The backward gets three times that tolerance (BATOL, BRTOL): dk and dv
 * sum over the queries of a whole head group and every branch, and its
 * largest measured error is 2.7e-6 (dq, T=77, D=128, two branches). */
#define ATOL 1e-5f
#define RTOL 1e-4f
#define BATOL 3e-5f
#define BRTOL 3e-4f

#define SEED 7031u


/*-- helpers ----------------------------------------------------------------*/

static dt_comm_t *solo(void)
{
    dt_comm_t *c = NULL;
    dt_emsg_t em = { "" };
    int rc = dt_comm_new(NULL, NULL, &c, &em);

    cr_assert_eq(rc, 0, "dt_comm_new: %s (%s)", dt_err_name(rc), em.s);
    cr_assert_eq(dt_comm_size(c), 1, "one process must be one rank, got %d", dt_comm_size(c));
    cr_assert_eq(dt_comm_rank(c), 0);
    cr_assert_str_eq(dt_comm_kind(c), "solo", "launched plainly, the comm must be solo");
    return c;
}

static dt_attn_spec_t spec(int64_t T, int H, int Hkv, int D, bool causal)
{
    dt_attn_spec_t s;
    memset(&s, 0, sizeof(s));
    s.T = T;
    s.H = H;
    s.Hkv = Hkv;
    s.D = D;
    s.causal = causal;
    s.layout = DT_LAYOUT_CONTIGUOUS;
    return s;
}

static void set_branches(dt_attn_spec_t *s, int n, const int64_t (*br)[2])
{
    s->nbranch = n;
    for (int b = 0; b < n; b++) {
        s->seg[b] = br[b][0];
        s->dil[b] = br[b][1];
    }
}

static float *randn(uint64_t stream, int64_t n)
{
    float *x = dt_xaligned((size_t)n, sizeof(float));
    ref_fill(SEED, stream, n, x);
    return x;
}

/* n floats of NaN: outputs must be overwritten, not accumulated into. */
static float *nans(int64_t n)
{
    float *x = dt_xaligned((size_t)n, sizeof(float));
    for (int64_t i = 0; i < n; i++)
        x[i] = NAN;
    return x;
}

/* "T=.. H=.. Hkv=.. D=.. causal=.. branches=(w,r)(w,r)" */
static void describe(const dt_attn_spec_t *s, char *buf, size_t n)
{
    int k = snprintf(buf, n, "T=%lld H=%d Hkv=%d D=%d causal=%d%s", (long long)s->T, s->H, s->Hkv,
                     s->D, (int)s->causal, s->nbranch ? " branches=" : " dense");
    for (int b = 0; b < s->nbranch && k > 0 && (size_t)k < n; b++)
        k += snprintf(buf + k, n - (size_t)k, "(%lld,%lld)", (long long)s->seg[b],
                      (long long)s->dil[b]);
}

/* Whether some branch covers (i, h), by the rule of engine/attn/attn.h. */
static bool covered(const dt_attn_spec_t *s, int64_t i, int h)
{
    if (s->nbranch == 0)
        return true;
    for (int b = 0; b < s->nbranch; b++) {
        int64_t w = s->seg[b], r = s->dil[b], hc = (s->H + r - 1) / r;
        if ((i - (i / w) * w) % r == h / hc)
            return true;
    }
    return false;
}

/* Forward of spec on one rank vs ref_attn_fwd; returns how many (i, h) no
 * branch covers, after checking those are exactly o = 0, lse = -inf. */
static int64_t check_fwd_m(dt_comm_t *comm, const dt_attn_spec_t *s, const ref_mask_t *rm)
{
    const int64_t T = s->T, nq = T * s->H * s->D, nkv = T * s->Hkv * s->D, nl = T * s->H;
    float *q = randn(1, nq), *k = randn(2, nkv), *v = randn(3, nkv);
    float *o = nans(nq), *lse = nans(nl), *oref = nans(nq), *lref = nans(nl);
    dt_attn_stats_t st;
    dt_emsg_t em = { "" };
    char what[256], label[300];
    int64_t uncovered = 0;

    describe(s, what, sizeof(what));
    int rc = dt_attn_fwd(comm, s, q, k, v, o, lse, &st, &em);
    cr_assert_eq(rc, 0, "%s: dt_attn_fwd: %s (%s)", what, dt_err_name(rc), em.s);
    cr_assert_eq(st.bytes_sent, 0.0, "%s: one rank sent %g bytes", what, st.bytes_sent);
    ref_attn_fwd_masked(T, s->H, s->Hkv, s->D, q, k, v, s->causal, s->scale, s->nbranch, s->seg,
                        s->dil, rm, oref, lref);
    snprintf(label, sizeof(label), "%s o", what);
    cr_assert(ref_allclose(label, o, oref, nq, ATOL, RTOL), "%s: o differs from ref_attn_fwd",
              what);
    snprintf(label, sizeof(label), "%s lse", what);
    cr_assert(ref_allclose(label, lse, lref, nl, ATOL, RTOL), "%s: lse differs from ref_attn_fwd",
              what);
    for (int64_t i = 0; i < T; i++) {
        for (int h = 0; h < s->H; h++) {
            if (covered(s, i, h))
                continue;
            uncovered++;
            float l = lse[(int64_t)h * T + i];
            cr_assert(isinf(l) && l < 0, "%s: uncovered (%lld, %d) has lse %g, want -inf", what,
                      (long long)i, h, (double)l);
            for (int d = 0; d < s->D; d++)
                cr_assert_eq(o[(i * s->H + h) * s->D + d], 0.0f,
                             "%s: uncovered (%lld, %d) has o[%d] = %g, want 0", what, (long long)i,
                             h, d, (double)o[(i * s->H + h) * s->D + d]);
        }
    }
    free(lref);
    free(oref);
    free(lse);
    free(o);
    free(v);
    free(k);
    free(q);
    return uncovered;
}

/* Backward of spec on one rank (from the engine's own forward) vs
 * ref_attn_bwd; dq, dk, dv start as NaN, so they must be overwritten. */
static void check_bwd_m(dt_comm_t *comm, const dt_attn_spec_t *s, const ref_mask_t *rm)
{
    const int64_t T = s->T, nq = T * s->H * s->D, nkv = T * s->Hkv * s->D, nl = T * s->H;
    float *q = randn(1, nq), *k = randn(2, nkv), *v = randn(3, nkv), *dout = randn(4, nq);
    float *o = nans(nq), *lse = nans(nl);
    float *g[3] = { nans(nq), nans(nkv), nans(nkv) }, *gr[3] = { nans(nq), nans(nkv), nans(nkv) };
    const int64_t n[3] = { nq, nkv, nkv };
    static const char *nm[3] = { "dq", "dk", "dv" };
    dt_attn_stats_t st;
    dt_emsg_t em = { "" };
    char what[256], label[300];

    describe(s, what, sizeof(what));
    int rc = dt_attn_fwd(comm, s, q, k, v, o, lse, NULL, &em);
    cr_assert_eq(rc, 0, "%s: dt_attn_fwd: %s (%s)", what, dt_err_name(rc), em.s);
    rc = dt_attn_bwd(comm, s, q, k, v, o, lse, dout, g[0], g[1], g[2], &st, &em);
    cr_assert_eq(rc, 0, "%s: dt_attn_bwd: %s (%s)", what, dt_err_name(rc), em.s);
    ref_attn_bwd_masked(T, s->H, s->Hkv, s->D, q, k, v, s->causal, s->scale, s->nbranch, s->seg,
                        s->dil, rm, dout, gr[0], gr[1], gr[2]);
    for (int x = 0; x < 3; x++) {
        snprintf(label, sizeof(label), "%s %s", what, nm[x]);
        cr_assert(ref_allclose(label, g[x], gr[x], n[x], BATOL, BRTOL),
                  "%s: %s differs from ref_attn_bwd", what, nm[x]);
    }
    for (int x = 0; x < 3; x++) {
        free(gr[x]);
        free(g[x]);
    }
    free(lse);
    free(o);
    free(dout);
    free(v);
    free(k);
    free(q);
}

static int64_t check_fwd(dt_comm_t *comm, const dt_attn_spec_t *s)
{
    return check_fwd_m(comm, s, NULL);
}

static void check_bwd(dt_comm_t *comm, const dt_attn_spec_t *s)
{
    check_bwd_m(comm, s, NULL);
}

/* The message in em contains every needle (NULL-terminated list). */
static void assert_msg(const dt_emsg_t *em, const char *ctx, const char *const *needles)
{
    for (int i = 0; needles[i] != NULL; i++)
        cr_assert_not_null(strstr(em->s, needles[i]), "%s: message \"%s\" lacks \"%s\"", ctx, em->s,
                           needles[i]);
}

/*-- dense ------------------------------------------------------------------*/

struct shape {
    int64_t T;
    int H, Hkv, D;
};

/* Every D in {16, 64, 128} and T in {1, 77, 600}, GQA (H = 8, Hkv = 2) and
 * plain multi-head, causal and not. */
static const struct shape dense_shapes[] = {
    { 1, 8, 2, 16 },  { 1, 8, 2, 128 },  { 77, 8, 2, 16 },  { 77, 8, 2, 64 },  { 77, 8, 2, 128 },
    { 77, 4, 4, 64 }, { 77, 4, 1, 128 }, { 600, 8, 2, 16 }, { 600, 4, 2, 64 },
};

Test(attn, dense_fwd_matches_ref)
{
    dt_comm_t *comm = solo();

    for (size_t i = 0; i < DT_ARRAY_SIZE(dense_shapes); i++) {
        for (int causal = 0; causal < 2; causal++) {
            const struct shape *x = &dense_shapes[i];
            dt_attn_spec_t s = spec(x->T, x->H, x->Hkv, x->D, causal);
            check_fwd(comm, &s);
        }
    }
    dt_comm_free(comm);
}

/* An explicit scale, and zigzag (which on one rank is contiguous). */
Test(attn, dense_fwd_scale_and_zigzag)
{
    dt_comm_t *comm = solo();

    for (int causal = 0; causal < 2; causal++) {
        dt_attn_spec_t s = spec(77, 8, 2, 64, causal);
        s.scale = 0.3f;
        check_fwd(comm, &s);
        s.scale = 0.0f;
        s.layout = DT_LAYOUT_ZIGZAG;
        check_fwd(comm, &s);
    }
    dt_comm_free(comm);
}

Test(attn, dense_bwd_matches_ref)
{
    static const struct shape shapes[] = {
        { 1, 8, 2, 16 },
        { 77, 8, 2, 64 },
        { 77, 4, 1, 128 },
        { 300, 8, 2, 16 },
    };
    dt_comm_t *comm = solo();

    for (size_t i = 0; i < DT_ARRAY_SIZE(shapes); i++) {
        for (int causal = 0; causal < 2; causal++) {
            dt_attn_spec_t s = spec(shapes[i].T, shapes[i].H, shapes[i].Hkv, shapes[i].D, causal);
            check_bwd(comm, &s);
        }
    }
    dt_comm_free(comm);
}

/*-- dilated ----------------------------------------------------------------*/

struct dilated_case {
    struct shape sh;
    int n;
    int64_t br[6][2]; /* (w, r) */
};

/* Branch sets: T not a multiple of w; w wider than T, equal to T; r = 1
 * with w >= T (the dense path inside a dilated spec); H not a multiple of r
 * (H = 6, r = 4: chunks of 2 heads, offset 3 has no heads; H = 3, r = 2;
 * H = 3, r = 8: more chunks than heads; H = 8 with r = 3 and r = 5, whose
 * last chunk is short or missing); GQA where a chunk spans kv heads; the
 * same branch twice (its keys count twice); T = 1. */
static const struct dilated_case dilated_cases[] = {
    { { 300, 6, 2, 16 }, 1, { { 128, 4 } } },
    { { 300, 6, 2, 16 }, 4, { { 128, 4 }, { 512, 2 }, { 64, 1 }, { 300, 3 } } },
    { { 300, 3, 1, 16 }, 1, { { 128, 2 } } },
    { { 300, 3, 3, 16 }, 2, { { 128, 2 }, { 1024, 1 } } },
    { { 77, 8, 2, 64 }, 4, { { 16, 1 }, { 32, 2 }, { 64, 4 }, { 1024, 8 } } },
    { { 77, 3, 3, 16 }, 1, { { 16, 8 } } },
    { { 77, 4, 4, 128 }, 2, { { 16, 2 }, { 77, 1 } } },
    { { 77, 4, 2, 16 }, 2, { { 32, 2 }, { 32, 2 } } },
    { { 600, 8, 2, 16 }, 3, { { 128, 2 }, { 256, 4 }, { 512, 8 } } },
    { { 1, 8, 2, 16 }, 2, { { 4, 2 }, { 1, 1 } } },
    { { 300, 8, 2, 16 }, 2, { { 96, 3 }, { 40, 5 } } },
};

Test(attn, dilated_fwd_matches_ref)
{
    dt_comm_t *comm = solo();

    for (size_t i = 0; i < DT_ARRAY_SIZE(dilated_cases); i++) {
        for (int causal = 0; causal < 2; causal++) {
            const struct dilated_case *x = &dilated_cases[i];
            dt_attn_spec_t s = spec(x->sh.T, x->sh.H, x->sh.Hkv, x->sh.D, causal);
            set_branches(&s, x->n, x->br);
            check_fwd(comm, &s);
        }
    }
    dt_comm_free(comm);
}

/* H = 3, r = 2 leaves (position, head) pairs no branch covers: positions
 * at segment offset 1 for heads 0, 1 and offset 0 for head 2. They get
 * o = 0, lse = -inf (checked inside check_fwd); here, that there are as
 * many as the rule says, and that adding a branch (w, 1) covers them all. */
Test(attn, dilated_uncovered_pairs)
{
    dt_comm_t *comm = solo();

    for (int causal = 0; causal < 2; causal++) {
        dt_attn_spec_t s = spec(300, 3, 1, 16, causal);
        const int64_t one[1][2] = { { 128, 2 } }, two[2][2] = { { 128, 2 }, { 32, 1 } };
        set_branches(&s, 1, one);
        /* offsets alternate 0, 1 in each segment (128, 128, 44: all even) */
        int64_t want = 150 * 2 + 150 * 1;
        int64_t got = check_fwd(comm, &s);
        cr_assert_eq(got, want, "causal=%d: %lld uncovered (position, head) pairs, want %lld",
                     causal, (long long)got, (long long)want);
        set_branches(&s, 2, two);
        got = check_fwd(comm, &s);
        cr_assert_eq(got, 0, "causal=%d: with a (32, 1) branch %lld pairs uncovered", causal,
                     (long long)got);
    }
    dt_comm_free(comm);
}

/* The same branch twice: every key counts twice, so o is that of the single
 * branch and lse is larger by log 2. */
Test(attn, dilated_repeated_branch_counts_twice)
{
    dt_comm_t *comm = solo();
    const int64_t T = 77, nq = T * 4 * 16, nkv = T * 2 * 16, nl = T * 4;
    float *q = randn(1, nq), *k = randn(2, nkv), *v = randn(3, nkv);
    float *o1 = nans(nq), *l1 = nans(nl), *o2 = nans(nq), *l2 = nans(nl);
    const int64_t once[1][2] = { { 32, 2 } }, twice[2][2] = { { 32, 2 }, { 32, 2 } };
    dt_emsg_t em = { "" };

    for (int causal = 0; causal < 2; causal++) {
        dt_attn_spec_t s = spec(T, 4, 2, 16, causal);
        set_branches(&s, 1, once);
        cr_assert_eq(dt_attn_fwd(comm, &s, q, k, v, o1, l1, NULL, &em), 0, "%s", em.s);
        set_branches(&s, 2, twice);
        cr_assert_eq(dt_attn_fwd(comm, &s, q, k, v, o2, l2, NULL, &em), 0, "%s", em.s);
        cr_assert(ref_allclose("twice o vs once", o2, o1, nq, ATOL, RTOL), "causal=%d", causal);
        for (int64_t e = 0; e < nl; e++)
            if (!isinf(l1[e]))
                l1[e] += logf(2.0f);
        cr_assert(ref_allclose("twice lse vs once + log 2", l2, l1, nl, ATOL, RTOL), "causal=%d",
                  causal);
    }
    free(l2);
    free(o2);
    free(l1);
    free(o1);
    free(v);
    free(k);
    free(q);
    dt_comm_free(comm);
}

Test(attn, dilated_bwd_matches_ref)
{
    static const size_t pick[] = { 0, 1, 2, 3, 4, 6, 7, 9, 10 };
    dt_comm_t *comm = solo();

    for (size_t p = 0; p < DT_ARRAY_SIZE(pick); p++) {
        for (int causal = 0; causal < 2; causal++) {
            const struct dilated_case *x = &dilated_cases[pick[p]];
            dt_attn_spec_t s = spec(x->sh.T, x->sh.H, x->sh.Hkv, x->sh.D, causal);
            set_branches(&s, x->n, x->br);
            check_bwd(comm, &s);
        }
    }
    dt_comm_free(comm);
}

/*-- threads ----------------------------------------------------------------*/

/* Forward and backward of s with dt_attn_set_threads(n): o, lse, dq, dk,
 * dv concatenated into one new array. */
static float *run_threads(dt_comm_t *comm, const dt_attn_spec_t *s, int n, int64_t *len)
{
    const int64_t T = s->T, nq = T * s->H * s->D, nkv = T * s->Hkv * s->D, nl = T * s->H;
    float *q = randn(1, nq), *k = randn(2, nkv), *v = randn(3, nkv), *dout = randn(4, nq);
    float *all = nans(2 * nq + nl + 2 * nkv);
    float *o = all, *lse = o + nq, *dq = lse + nl, *dk = dq + nq, *dv = dk + nkv;
    dt_emsg_t em = { "" };
    char what[256];

    describe(s, what, sizeof(what));
    dt_attn_set_threads(n);
    int rc = dt_attn_fwd(comm, s, q, k, v, o, lse, NULL, &em);
    cr_assert_eq(rc, 0, "%s threads=%d: dt_attn_fwd: %s (%s)", what, n, dt_err_name(rc), em.s);
    rc = dt_attn_bwd(comm, s, q, k, v, o, lse, dout, dq, dk, dv, NULL, &em);
    cr_assert_eq(rc, 0, "%s threads=%d: dt_attn_bwd: %s (%s)", what, n, dt_err_name(rc), em.s);
    dt_attn_set_threads(1);
    *len = 2 * nq + nl + 2 * nkv;
    free(dout);
    free(v);
    free(k);
    free(q);
    return all;
}

/* Heads spread over 2 and 3 threads give what one thread gives, to the
 * bit: dense (GQA and one kv head, whose backward stays on one thread) and
 * every dilated case, causal and not. */
Test(attn, threads_give_the_same_bits)
{
    dt_comm_t *comm = solo();
    dt_attn_spec_t specs[DT_ARRAY_SIZE(dilated_cases) + 2];
    size_t ns = 0;

    specs[ns++] = spec(300, 8, 2, 64, false);
    specs[ns++] = spec(300, 4, 1, 32, false);
    for (size_t i = 0; i < DT_ARRAY_SIZE(dilated_cases); i++) {
        const struct dilated_case *x = &dilated_cases[i];
        specs[ns] = spec(x->sh.T, x->sh.H, x->sh.Hkv, x->sh.D, false);
        set_branches(&specs[ns++], x->n, x->br);
    }
    for (size_t i = 0; i < ns; i++)
        for (int causal = 0; causal < 2; causal++) {
            dt_attn_spec_t s = specs[i];
            char what[256];
            int64_t n1, nn;
            s.causal = causal;
            describe(&s, what, sizeof(what));
            float *one = run_threads(comm, &s, 1, &n1);
            for (int t = 2; t <= 3; t++) {
                float *many = run_threads(comm, &s, t, &nn);
                cr_assert_eq(nn, n1);
                cr_assert(memcmp(one, many, (size_t)n1 * sizeof(float)) == 0,
                          "%s: %d threads differ from one", what, t);
                free(many);
            }
            free(one);
        }
    dt_comm_free(comm);
}

/*-- dt_attn_check ----------------------------------------------------------*/

/* dt_attn_check(s, R) fails with code and a message holding the needles;
 * dt_attn_fwd on one rank refuses the same way when R is 1. */
static void refused(const dt_attn_spec_t *s, int R, int code, const char *ctx,
                    const char *const *needles)
{
    dt_emsg_t em = { "" };
    int rc = dt_attn_check(s, R, &em);

    cr_assert_eq(rc, code, "%s: got %s (%s), want %s", ctx, dt_err_name(rc), em.s,
                 dt_err_name(code));
    assert_msg(&em, ctx, needles);
    cr_assert_eq(dt_attn_check(s, R, NULL), code, "%s: NULL em changes the code", ctx);
}

Test(attn, check_accepts_good_specs)
{
    dt_emsg_t em = { "" };
    dt_attn_spec_t s = spec(600, 8, 2, 64, true);
    const int64_t br[3][2] = { { 128, 2 }, { 256, 4 }, { 1024, 8 } };

    cr_assert_eq(dt_attn_check(&s, 1, &em), 0, "%s", em.s);
    cr_assert_eq(dt_attn_check(&s, 4, &em), 0, "R=4: %s", em.s);
    set_branches(&s, 3, br);
    cr_assert_eq(dt_attn_check(&s, 1, &em), 0, "%s", em.s);
    s.layout = DT_LAYOUT_ZIGZAG;
    cr_assert_eq(dt_attn_check(&s, 3, &em), 0, "zigzag T=600 R=3: %s", em.s);
}

Test(attn, check_refuses_bad_specs)
{
    dt_attn_spec_t s;

    s = spec(600, 8, 3, 64, false);
    refused(&s, 1, DT_ESHAPE, "Hkv=3 H=8",
            (const char *const[]){ "Hkv=3", "H=8", "must divide", NULL });

    const int64_t bad_r[2][2] = { { 128, 2 }, { 100, 3 } };
    s = spec(600, 8, 2, 64, false);
    set_branches(&s, 2, bad_r);
    refused(&s, 1, DT_EINVAL, "w=100 r=3",
            (const char *const[]){ "branch 2", "w=100", "r=3", "not a multiple", NULL });

    const int64_t zero_w[1][2] = { { 0, 1 } }, neg_r[1][2] = { { 64, -2 } };
    s = spec(600, 8, 2, 64, false);
    set_branches(&s, 1, zero_w);
    refused(&s, 1, DT_EINVAL, "w=0", (const char *const[]){ "branch 1", "positive", NULL });
    set_branches(&s, 1, neg_r);
    refused(&s, 1, DT_EINVAL, "r=-2", (const char *const[]){ "branch 1", "positive", NULL });

    s = spec(600, 8, 2, 64, false);
    s.nbranch = DT_ATTN_MAXBRANCH + 1;
    refused(&s, 1, DT_EINVAL, "17 branches", (const char *const[]){ "17", "at most 16", NULL });

    /* zero (and negative) sizes, each in turn */
    s = spec(0, 8, 2, 64, false);
    refused(&s, 1, DT_ESHAPE, "T=0",
            (const char *const[]){ "T=0", "every size must be positive", NULL });
    s = spec(600, 0, 2, 64, false);
    refused(&s, 1, DT_ESHAPE, "H=0", (const char *const[]){ "H=0", "positive", NULL });
    s = spec(600, 8, 0, 64, false);
    refused(&s, 1, DT_ESHAPE, "Hkv=0", (const char *const[]){ "Hkv=0", "positive", NULL });
    s = spec(600, 8, 2, 0, false);
    refused(&s, 1, DT_ESHAPE, "D=0", (const char *const[]){ "D=0", "positive", NULL });
    s = spec(600, 8, 2, -64, false);
    refused(&s, 1, DT_ESHAPE, "D=-64", (const char *const[]){ "D=-64", "positive", NULL });

    /* layouts that do not split T over R */
    s = spec(601, 8, 2, 64, false);
    refused(&s, 4, DT_ELAYOUT, "T=601 R=4 contiguous",
            (const char *const[]){ "T=601", "R=4", "divisible", NULL });
    s = spec(600, 8, 2, 64, false);
    s.layout = DT_LAYOUT_ZIGZAG;
    refused(&s, 7, DT_ELAYOUT, "T=600 R=7 zigzag",
            (const char *const[]){ "zigzag", "T=600", "2R=14", NULL });
    s = spec(2, 8, 2, 64, false);
    refused(&s, 4, DT_ELAYOUT, "T=2 R=4", (const char *const[]){ "T=2", "R=4", NULL });
}

/* dt_attn_fwd and dt_attn_bwd refuse a bad spec with the check's code and
 * message, before touching anything. */
Test(attn, fwd_bwd_refuse_bad_spec)
{
    dt_comm_t *comm = solo();
    dt_attn_spec_t s = spec(8, 8, 3, 16, false);
    float buf[8 * 8 * 16] = { 0 }, lse[64] = { 0 };
    dt_emsg_t em = { "" };

    int rc = dt_attn_fwd(comm, &s, buf, buf, buf, buf, lse, NULL, &em);
    cr_assert_eq(rc, DT_ESHAPE, "fwd: got %s (%s)", dt_err_name(rc), em.s);
    assert_msg(&em, "fwd", (const char *const[]){ "Hkv=3", "H=8", NULL });
    em.s[0] = '\0';
    rc = dt_attn_bwd(comm, &s, buf, buf, buf, buf, lse, buf, buf, buf, buf, NULL, &em);
    cr_assert_eq(rc, DT_ESHAPE, "bwd: got %s (%s)", dt_err_name(rc), em.s);
    assert_msg(&em, "bwd", (const char *const[]){ "Hkv=3", "H=8", NULL });
    dt_comm_free(comm);
}

/*-- dt_attn_parse_branches -------------------------------------------------*/

/* Parsing fails with DT_EINVAL and the needles, and leaves the spec's
 * branches as they were. */
static void parse_refused(const char *segs, const char *dils, const char *const *needles)
{
    dt_attn_spec_t s = spec(600, 8, 2, 64, false);
    const int64_t keep[1][2] = { { 96, 3 } };
    dt_emsg_t em = { "" };
    char ctx[128];

    set_branches(&s, 1, keep);
    snprintf(ctx, sizeof(ctx), "segments \"%s\" dilations \"%s\"", segs ? segs : "(null)",
             dils ? dils : "(null)");
    int rc = dt_attn_parse_branches(&s, segs, dils, &em);
    cr_assert_eq(rc, DT_EINVAL, "%s: got %s (%s)", ctx, dt_err_name(rc), em.s);
    assert_msg(&em, ctx, needles);
    cr_assert(s.nbranch == 1 && s.seg[0] == 96 && s.dil[0] == 3,
              "%s: a refused parse changed the spec (nbranch %d)", ctx, s.nbranch);
}

Test(attn, parse_branches_accepts)
{
    dt_attn_spec_t s = spec(600, 8, 2, 64, false);
    dt_emsg_t em = { "" };

    cr_assert_eq(dt_attn_parse_branches(&s, "2048,4096,8192", "1,2,4", &em), 0, "%s", em.s);
    cr_assert_eq(s.nbranch, 3);
    cr_assert(s.seg[0] == 2048 && s.seg[1] == 4096 && s.seg[2] == 8192, "segments %lld %lld %lld",
              (long long)s.seg[0], (long long)s.seg[1], (long long)s.seg[2]);
    cr_assert(s.dil[0] == 1 && s.dil[1] == 2 && s.dil[2] == 4, "dilations %lld %lld %lld",
              (long long)s.dil[0], (long long)s.dil[1], (long long)s.dil[2]);
    cr_assert_eq(dt_attn_parse_branches(&s, "64", "8", &em), 0, "%s", em.s);
    cr_assert(s.nbranch == 1 && s.seg[0] == 64 && s.dil[0] == 8);
    /* neither given: dense */
    cr_assert_eq(dt_attn_parse_branches(&s, NULL, NULL, &em), 0, "%s", em.s);
    cr_assert_eq(s.nbranch, 0);
    /* sixteen is the most */
    cr_assert_eq(dt_attn_parse_branches(&s, "1,2,3,4,5,6,7,8,9,10,11,12,13,14,15,16",
                                        "1,1,1,1,1,1,1,1,1,1,1,1,1,1,1,1", &em),
                 0, "%s", em.s);
    cr_assert_eq(s.nbranch, 16);
    cr_assert_eq(s.seg[15], 16);
}

Test(attn, parse_branches_refuses)
{
    parse_refused("128,256", "1,2,4",
                  (const char *const[]){ "--segments has 2 values", "--dilations has 3", NULL });
    parse_refused("128,256,512", "1", (const char *const[]){ "3 values", "has 1", NULL });
    parse_refused("", "1", (const char *const[]){ "--segments", "empty", NULL });
    parse_refused("128", "", (const char *const[]){ "--dilations", "empty", NULL });
    parse_refused("128", NULL, (const char *const[]){ "together", NULL });
    parse_refused(NULL, "1", (const char *const[]){ "together", NULL });
    parse_refused("12x", "1",
                  (const char *const[]){ "--segments", "'12x'", "positive integers", NULL });
    parse_refused("abc", "1", (const char *const[]){ "'abc'", NULL });
    parse_refused("128", "1;2", (const char *const[]){ "--dilations", "'1;2'", NULL });
    parse_refused("128,,256", "1,2", (const char *const[]){ "'128,,256'", NULL });
    parse_refused(",128", "1", (const char *const[]){ "',128'", NULL });
    parse_refused("128,", "1", (const char *const[]){ "--segments", "trailing comma", NULL });
    parse_refused("128", "2,", (const char *const[]){ "--dilations", "trailing comma", NULL });
    parse_refused("0", "1", (const char *const[]){ "--segments", "'0'", "positive", NULL });
    parse_refused("128", "-2", (const char *const[]){ "--dilations", "'-2'", "positive", NULL });
    parse_refused("128,-256", "1,2", (const char *const[]){ "'128,-256'", NULL });
    parse_refused("1,2,3,4,5,6,7,8,9,10,11,12,13,14,15,16,17", "1",
                  (const char *const[]){ "--segments", "more than 16", NULL });
}

/*-- dt_attn_flops ----------------------------------------------------------*/

/* Visible (query, key) pairs summed over heads, counted one by one from the
 * rule of engine/attn/attn.h (as tests/ref/ref.c lists keys), times 4 D. */
static double brute_flops(const dt_attn_spec_t *s)
{
    double pairs = 0.0;

    for (int64_t i = 0; i < s->T; i++) {
        for (int h = 0; h < s->H; h++) {
            if (s->nbranch == 0) {
                pairs += (double)(s->causal ? i + 1 : s->T);
                continue;
            }
            for (int b = 0; b < s->nbranch; b++) {
                int64_t w = s->seg[b], r = s->dil[b], hc = (s->H + r - 1) / r;
                int64_t a = (i / w) * w, e = a + w < s->T ? a + w : s->T;
                if ((i - a) % r != h / hc)
                    continue;
                for (int64_t j = a + h / hc; j < e; j += r)
                    pairs += !s->causal || j <= i;
            }
        }
    }
    return pairs * 4.0 * s->D;
}

Test(attn, flops_dense_closed_form)
{
    static const struct shape shapes[] = {
        { 1, 1, 1, 1 },
        { 77, 8, 2, 16 },
        { 600, 8, 2, 64 },
        { 131072, 32, 8, 128 },
    };
    for (size_t i = 0; i < DT_ARRAY_SIZE(shapes); i++) {
        const struct shape *x = &shapes[i];
        double T = (double)x->T, H = x->H, D = x->D;
        dt_attn_spec_t s = spec(x->T, x->H, x->Hkv, x->D, false);
        double got = dt_attn_flops(&s), want = 4.0 * T * T * H * D;
        cr_assert_eq(got, want, "T=%lld H=%d D=%d non-causal: %.17g, want 4 T^2 H D = %.17g",
                     (long long)x->T, x->H, x->D, got, want);
        s.causal = true;
        got = dt_attn_flops(&s);
        want = 4.0 * (T * (T + 1) / 2) * H * D;
        cr_assert_eq(got, want, "T=%lld H=%d D=%d causal: %.17g, want 4 T(T+1)/2 H D = %.17g",
                     (long long)x->T, x->H, x->D, got, want);
    }
}

/* T = 300, H = 6, D = 16, one branch (128, 4): heads in chunks of 2 ({0,1},
 * {2,3}, {4,5}; offset 3 has none). Two full segments give each head 32
 * positions; the last segment of 44 gives each chunk 11. Per head:
 * non-causal 2 * 32^2 + 11^2 = 2169 pairs, causal 2 * 528 + 66 = 1122. */
Test(attn, flops_dilated_by_hand)
{
    dt_attn_spec_t s = spec(300, 6, 2, 16, false);
    const int64_t br[1][2] = { { 128, 4 } };

    set_branches(&s, 1, br);
    cr_assert_eq(dt_attn_flops(&s), 4.0 * 16 * 6 * 2169, "non-causal: %.17g", dt_attn_flops(&s));
    s.causal = true;
    cr_assert_eq(dt_attn_flops(&s), 4.0 * 16 * 6 * 1122, "causal: %.17g", dt_attn_flops(&s));

    /* H = 3, r = 2: chunks {0, 1} and {2}; 64 positions per full segment,
     * 22 in the last: per head 2 * 64^2 + 22^2 = 8676 */
    dt_attn_spec_t s3 = spec(300, 3, 1, 16, false);
    const int64_t br3[1][2] = { { 128, 2 } };
    set_branches(&s3, 1, br3);
    cr_assert_eq(dt_attn_flops(&s3), 4.0 * 16 * 3 * 8676, "H=3 r=2: %.17g", dt_attn_flops(&s3));
}

Test(attn, flops_match_brute_force)
{
    for (size_t i = 0; i < DT_ARRAY_SIZE(dilated_cases); i++) {
        for (int causal = 0; causal < 2; causal++) {
            const struct dilated_case *x = &dilated_cases[i];
            dt_attn_spec_t s = spec(x->sh.T, x->sh.H, x->sh.Hkv, x->sh.D, causal);
            char what[256];
            set_branches(&s, x->n, x->br);
            describe(&s, what, sizeof(what));
            double got = dt_attn_flops(&s), want = brute_flops(&s);
            cr_assert_eq(got, want, "%s: flops %.17g, counted %.17g", what, got, want);
        }
    }
}

/*-- masks ------------------------------------------------------------------*/

/* A mask case: documents (lengths, 0 = none), a window (0 = none), a block
 * pattern (B = 0: none; nhead 1 or H; its bytes drawn from seed, each
 * block allowed with probability 2/3, and query block 1 of head 0 wholly
 * masked, so its rows have no key). */
struct mask_case {
    int ndoc;
    int64_t len[8];
    int64_t W, B;
    int nhead;
};

/* Both descriptions of one case: the engine's (spec/mask.h) and the
 * reference's (tests/ref), built separately from the same numbers. */
struct masks {
    dt_mask_t m;
    ref_mask_t r;
    uint8_t *blocks;
};

static void masks_make(struct masks *x, const struct mask_case *c, int64_t T, bool causal,
                       unsigned seed)
{
    dt_emsg_t em = { "" };
    memset(x, 0, sizeof(*x));
    dt_mask_init(&x->m, T, causal);
    if (c->ndoc > 0) {
        cr_assert_eq(dt_mask_set_docs(&x->m, c->len, c->ndoc, &em), 0, "%s", em.s);
        x->r.ndoc = c->ndoc;
        x->r.doc_len = c->len;
    }
    if (c->W > 0) {
        cr_assert_eq(dt_mask_set_window(&x->m, c->W, &em), 0, "%s", em.s);
        x->r.window = c->W;
    }
    if (c->B > 0) {
        int64_t nb = T / c->B, n = (int64_t)c->nhead * nb * nb;
        uint64_t z = seed * 0x9e3779b97f4a7c15ull + 1;
        x->blocks = dt_xmallocarray((size_t)n, 1);
        for (int64_t e = 0; e < n; e++) {
            z ^= z << 13, z ^= z >> 7, z ^= z << 17;
            x->blocks[e] = (uint8_t)(z % 3 != 0);
        }
        for (int64_t b = 0; b < nb && nb > 1; b++)
            x->blocks[nb + b] = 0;
        cr_assert_eq(dt_mask_set_blocks_dense(&x->m, c->B, c->nhead, x->blocks, &em), 0, "%s",
                     em.s);
        x->r.block = c->B;
        x->r.nhead = c->nhead;
        x->r.blocks = x->blocks;
    }
}

static void masks_free(struct masks *x)
{
    dt_mask_close(&x->m);
    free(x->blocks);
}

/* T = 300: several query and key tiles of every kernel; documents that
 * cross tile edges and documents of one token */
static const struct mask_case mask_cases[] = {
    { .ndoc = 5, .len = { 97, 1, 101, 1, 100 } },
    { .ndoc = 2, .len = { 299, 1 } },
    { .W = 37 },
    { .W = 1 },
    { .B = 20, .nhead = 1 },
    { .B = 30, .nhead = 4 },
    { .ndoc = 3, .len = { 120, 60, 120 }, .W = 50 },
    { .ndoc = 4, .len = { 75, 75, 75, 75 }, .W = 64, .B = 25, .nhead = 1 },
    { .ndoc = 2, .len = { 150, 150 }, .B = 50, .nhead = 4 },
};

/* Every mask alone and combined, causal and not, GQA, both kernels (D =
 * 32 and 64), forward and backward, on one rank against the reference. */
Test(attn, masks_match_ref)
{
    dt_comm_t *comm = solo();
    const int Ds[2] = { 32, 64 };
    for (size_t i = 0; i < DT_ARRAY_SIZE(mask_cases); i++)
        for (int causal = 0; causal < 2; causal++)
            for (int d = 0; d < 2; d++) {
                struct masks x;
                dt_attn_spec_t s = spec(300, 4, 2, Ds[d], causal);
                masks_make(&x, &mask_cases[i], s.T, causal, (unsigned)i);
                s.mask = &x.m;
                check_fwd_m(comm, &s, &x.r);
                if (d == 0)
                    check_bwd_m(comm, &s, &x.r);
                masks_free(&x);
            }
    dt_comm_free(comm);
}

/* Dilated attention with a mask on one rank: every branch keeps only the
 * pairs the mask allows. */
Test(attn, masks_with_dilated_branches_match_ref)
{
    dt_comm_t *comm = solo();
    const int64_t br[2][2] = { { 64, 1 }, { 128, 4 } };
    for (size_t i = 0; i < DT_ARRAY_SIZE(mask_cases); i += 3)
        for (int causal = 0; causal < 2; causal++) {
            struct masks x;
            dt_attn_spec_t s = spec(300, 4, 2, 32, causal);
            set_branches(&s, 2, br);
            masks_make(&x, &mask_cases[i], s.T, causal, (unsigned)i);
            s.mask = &x.m;
            check_fwd_m(comm, &s, &x.r);
            check_bwd_m(comm, &s, &x.r);
            masks_free(&x);
        }
    dt_comm_free(comm);
}

/* A mask that allows every pair (one document, a window as long as the
 * sequence, a block pattern of ones) gives today's results to the bit. */
Test(attn, masks_that_allow_everything_give_the_same_bits)
{
    dt_comm_t *comm = solo();
    const int64_t T = 300;
    int64_t one[1] = { T };
    uint8_t ones[36];
    memset(ones, 1, sizeof(ones));
    for (int causal = 0; causal < 2; causal++)
        for (int d = 32; d <= 64; d += 32) {
            dt_attn_spec_t s = spec(T, 4, 2, d, causal);
            int64_t n1, n2;
            float *plain = run_threads(comm, &s, 1, &n1);
            for (int part = 0; part < 3; part++) {
                dt_mask_t m;
                dt_emsg_t em = { "" };
                dt_mask_init(&m, T, causal);
                if (part == 0)
                    cr_assert_eq(dt_mask_set_docs(&m, one, 1, &em), 0);
                if (part == 1)
                    cr_assert_eq(dt_mask_set_window(&m, T, &em), 0);
                if (part == 2)
                    cr_assert_eq(dt_mask_set_blocks_dense(&m, 50, 1, ones, &em), 0);
                s.mask = &m;
                float *got = run_threads(comm, &s, 1, &n2);
                cr_assert_eq(n1, n2);
                cr_assert(memcmp(plain, got, (size_t)n1 * sizeof(float)) == 0,
                          "causal=%d D=%d part %d: not the unmasked bits", causal, d, part);
                free(got);
                s.mask = NULL;
                dt_mask_close(&m);
            }
            free(plain);
        }
    dt_comm_free(comm);
}

/* The reference's masked backward against finite differences of
 * sum(dout * o) on a small case (documents, a window and blocks). */
Test(attn, masked_ref_bwd_matches_finite_differences)
{
    const int64_t T = 12;
    const int H = 2, Hkv = 1, D = 4;
    const struct mask_case c = { .ndoc = 3, .len = { 5, 1, 6 }, .W = 4, .B = 3, .nhead = 2 };
    const int64_t nq = T * H * D, nkv = T * Hkv * D;
    float *q = randn(1, nq), *k = randn(2, nkv), *v = randn(3, nkv), *dout = randn(4, nq);
    float *g[3] = { nans(nq), nans(nkv), nans(nkv) }, *o = nans(nq);
    float *x[3] = { q, k, v };
    const int64_t n[3] = { nq, nkv, nkv };
    for (int causal = 0; causal < 2; causal++) {
        struct masks m;
        masks_make(&m, &c, T, causal, 5);
        ref_attn_bwd_masked(T, H, Hkv, D, q, k, v, causal, 0, 0, NULL, NULL, &m.r, dout, g[0],
                            g[1], g[2]);
        for (int t = 0; t < 3; t++)
            for (int64_t e = 0; e < n[t]; e++) {
                float keep = x[t][e], eps = 1e-2f;
                double f[2];
                for (int sgn = 0; sgn < 2; sgn++) {
                    x[t][e] = keep + (sgn ? -eps : eps);
                    ref_attn_fwd_masked(T, H, Hkv, D, q, k, v, causal, 0, 0, NULL, NULL, &m.r,
                                        o, NULL);
                    f[sgn] = 0;
                    for (int64_t j = 0; j < nq; j++)
                        f[sgn] += (double)dout[j] * o[j];
                }
                x[t][e] = keep;
                double fd = (f[0] - f[1]) / (2.0 * eps);
                cr_assert(fabs(fd - g[t][e]) <= 2e-3 + 2e-2 * fabs(fd),
                          "causal=%d tensor %d element %lld: gradient %g, finite difference %g",
                          causal, t, (long long)e, (double)g[t][e], fd);
            }
        masks_free(&m);
    }
    for (int t = 0; t < 3; t++)
        free(g[t]);
    free(o);
    free(dout);
    free(v);
    free(k);
    free(q);
}

/* A mask of another length or causality than the attention is refused. */
Test(attn, check_refuses_a_mask_that_does_not_fit)
{
    dt_attn_spec_t s = spec(64, 4, 2, 32, true);
    dt_mask_t m;
    dt_emsg_t em = { "" };
    dt_mask_init(&m, 32, true);
    s.mask = &m;
    cr_assert_eq(dt_attn_check(&s, 1, &em), DT_EINVAL);
    cr_assert(strstr(em.s, "the mask is of 32 positions, causal, the attention of 64"), "%s", em.s);
    dt_mask_close(&m);
    uint8_t b[3 * 4] = { 1 };
    dt_mask_init(&m, 64, true);
    cr_assert_eq(dt_mask_set_blocks_dense(&m, 32, 3, b, &em), 0);
    cr_assert_eq(dt_attn_check(&s, 1, &em), DT_EINVAL);
    cr_assert(strstr(em.s, "block mask: 3 heads, but the attention has 4 query heads"), "%s",
              em.s);
    dt_mask_close(&m);
}

/* The cuDNN blocks' chunks and scratch (spec/attn_spec.h): chunks of
 * whole tiles that bound their bytes; a deterministic backward too long
 * for 512-row chunks goes to dt's kernels (rows 0), and its scratch is the
 * forward's. */
Test(attn, cudnn_chunks_and_scratch)
{
    /* 16K rows, 32 heads of 128, bf16: o chunks of 256 MiB are 32768 rows */
    cr_assert_eq(dt_attn_cudnn_rows(16384, 16384, 32, 128, 2, 0, 1), 16384);
    /* the deterministic backward: 512 MiB of scores over 16K keys -> 512 rows */
    cr_assert_eq(dt_attn_cudnn_rows(16384, 16384, 32, 128, 2, 1, 1), 512);
    cr_assert_eq(dt_attn_cudnn_rows(16384, 16384, 32, 128, 2, 1, 0), 16384);
    /* 512K keys: 16 rows would do; too few: dt's kernels */
    cr_assert_eq(dt_attn_cudnn_rows(524288, 524288, 32, 128, 2, 1, 1), 0);
    cr_assert_eq(dt_attn_cudnn_bytes(524288, 32, 8, 128, 2, 1, 1),
                 dt_attn_cudnn_bytes(524288, 32, 8, 128, 2, 0, 1));
    /* a short block is its own chunk */
    cr_assert_eq(dt_attn_cudnn_rows(300, 300, 4, 64, 2, 1, 1), 300);
    /* chunks bound the forward's scratch at long T: 256 MiB of o, 4 MiB of stats */
    double f = dt_attn_cudnn_bytes(524288, 32, 8, 128, 2, 0, 1);
    cr_assert(f > 256.0 * 1048576 && f < 264.0 * 1048576, "forward scratch %.0f", f);
    /* the backward counts the copy of o and the keys' dK/dV */
    double b = dt_attn_cudnn_bytes(16384, 32, 8, 128, 2, 1, 1);
    cr_assert(b > 16384.0 * 32 * 128 * 2 + 2.0 * 16384 * 8 * 128 * 2 + 512.0 * 32 * 16384 * 2,
              "backward scratch %.0f", b);
}
