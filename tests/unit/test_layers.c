/* SPDX-License-Identifier: MIT
 *
 * Tests of the LLaMA-3 layer ops of kernels/cpu/layers_cpu.h: every fast
 * path (`_cpu`) against its reference (`_ref`), forward and backward, at
 * shapes that leave vector tails; every reference backward against central
 * finite differences of the reference forward; the write/add contract of
 * the backward (input gradients overwritten, parameter gradients added);
 * RoPE at positions 2^24 + 1 and 1e9 against a long-double computation and
 * against sin/cos of those integers to 20 digits, and RoPE followed by its
 * backward as the identity; cross-entropy with ignored targets, huge logits
 * and in place; and the token check's message.
 *
 * Not here: attention (test_kernel.c), the optimizer (test_optim.c), a
 * whole layer or model.
 */
#include "config.h"

#include <criterion/criterion.h>
#include <float.h>
#include <math.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/err.h"
#include "common/mem.h"
#include "kernels/cpu/layers_cpu.h"
#include "tests/ref/ref.h"

/* Fast vs reference: element good iff |x - ref| <= ATOL + RTOL * |ref|.
 * The fast paths accumulate in fp32 (sgemm, eight-lane partial sums) where
 * the references use double; at these sizes (reductions of at most a few
 * hundred O(1) terms) fp32 error stays below 1e-6 + 1e-5 |ref|. */
#define ATOL 1e-5f
#define RTOL 1e-4f

/* Finite differences: central, step 1e-2 on an fp32 input (the step is
 * taken as the difference of the two rounded inputs), objective in double
 * from the reference forward. Truncation error O(step^2 f''') ~ 1e-4 for
 * these smooth O(1) functions, the fp32 rounding of the forward's outputs
 * adds ~1e-5, so 2e-3 absolute plus 2e-3 relative. */
#define FD_EPS 1e-2f
#define FD_TOL 2e-3f

/* RoPE against long double: outputs are O(1) rotations; fp32 storage of
 * x, cos, sin and the result gives a few 1e-7, the brief's bound is 1e-6. */
#define ROPE_TOL 1e-6f

#define SEED 20250117u
#define LLAMA3_THETA 500000.0
static const dt_rope_t LLAMA3_ROPE = { .theta = LLAMA3_THETA };

/*-- helpers ----------------------------------------------------------------*/

static float *randn(uint64_t stream, int64_t n)
{
    float *x = dt_xaligned((size_t)(n > 0 ? n : 1), sizeof(float));
    ref_fill(SEED, stream, n, x);
    return x;
}

static float *filled(int64_t n, float v)
{
    float *x = dt_xaligned((size_t)(n > 0 ? n : 1), sizeof(float));
    for (int64_t i = 0; i < n; i++)
        x[i] = v;
    return x;
}

static float *copy(const float *x, int64_t n)
{
    float *y = dt_xaligned((size_t)(n > 0 ? n : 1), sizeof(float));
    memcpy(y, x, (size_t)n * sizeof(float));
    return y;
}

/* Tokens in [0, V) with repeats (a fixed multiplicative walk). */
static int32_t *tokens(int64_t T, int V, uint32_t salt)
{
    int32_t *tok = dt_xmallocarray((size_t)T, sizeof(int32_t));
    for (int64_t t = 0; t < T; t++)
        tok[t] = (int32_t)(((uint32_t)t * 2654435761u + salt) % (uint32_t)(V > 1 ? V - 1 : 1));
    return tok;
}

static double dot(const float *a, const float *b, int64_t n)
{
    double s = 0.0;
    for (int64_t i = 0; i < n; i++)
        s += (double)a[i] * b[i];
    return s;
}

typedef double (*objective_fn)(void *ctx);

/* Central differences of f with respect to each element of x (n), which
 * f reads through ctx; the gradient under test is grad (n). */
static bool fd_check(const char *label, objective_fn f, void *ctx, float *x, int64_t n,
                     const float *grad)
{
    float *num = dt_xaligned((size_t)n, sizeof(float));
    for (int64_t i = 0; i < n; i++) {
        const float x0 = x[i], xp = x0 + FD_EPS, xm = x0 - FD_EPS;
        x[i] = xp;
        double fp = f(ctx);
        x[i] = xm;
        double fm = f(ctx);
        x[i] = x0;
        num[i] = (float)((fp - fm) / ((double)xp - (double)xm));
    }
    bool ok = ref_allclose(label, grad, num, n, FD_TOL, FD_TOL);
    free(num);
    return ok;
}

/*-- token check ------------------------------------------------------------*/

Test(layers, tokens_check_names_the_bad_token)
{
    const int32_t ok[] = { 0, 5, 9, DT_IGNORE };
    const int32_t bad[] = { 0, 5, 10, 2 };
    dt_emsg_t em = { "" };

    cr_assert_eq(dt_tokens_check(4, 10, ok, 1, &em), 0);
    cr_assert_eq(dt_tokens_check(4, 10, ok, 0, &em), DT_ERANGE, "-1 is a target, not a token");
    cr_assert_eq(dt_tokens_check(4, 10, bad, 1, &em), DT_ERANGE);
    cr_assert_str_eq(em.s, "token 10 at row 2 outside [0, 10)");
}

/*-- linear -----------------------------------------------------------------*/

Test(layers, linear_fast_matches_ref)
{
    const int64_t T = 37;
    const int din = 67, dout = 45;
    float *x = randn(1, T * din), *w = randn(2, (int64_t)dout * din), *dy = randn(3, T * dout);
    float *y1 = filled(T * dout, NAN), *y2 = filled(T * dout, NAN);
    float *dx1 = filled(T * din, NAN), *dx2 = filled(T * din, NAN);
    float *dw1 = randn(4, (int64_t)dout * din), *dw2 = copy(dw1, (int64_t)dout * din);

    dt_linear_fwd_cpu(T, din, dout, x, w, y1);
    dt_linear_fwd_ref(T, din, dout, x, w, y2);
    cr_assert(ref_allclose("linear y", y1, y2, T * dout, ATOL, RTOL));
    /* dx is written over NaN, dw is added to a nonzero start. */
    dt_linear_bwd_cpu(T, din, dout, x, w, dy, dx1, dw1);
    dt_linear_bwd_ref(T, din, dout, x, w, dy, dx2, dw2);
    cr_assert(ref_allclose("linear dx", dx1, dx2, T * din, ATOL, RTOL));
    cr_assert(ref_allclose("linear dw", dw1, dw2, (int64_t)dout * din, ATOL, RTOL));
    free(x), free(w), free(dy), free(y1), free(y2), free(dx1), free(dx2), free(dw1), free(dw2);
}

typedef struct {
    int64_t T;
    int din, dout;
    float *x, *w, *dy, *y;
} linear_ctx;

static double linear_obj(void *p)
{
    linear_ctx *c = p;
    dt_linear_fwd_ref(c->T, c->din, c->dout, c->x, c->w, c->y);
    return dot(c->dy, c->y, c->T * c->dout);
}

Test(layers, linear_bwd_matches_finite_differences)
{
    linear_ctx c = { .T = 5, .din = 8, .dout = 6 };
    c.x = randn(10, c.T * c.din), c.w = randn(11, c.dout * c.din), c.dy = randn(12, c.T * c.dout);
    c.y = filled(c.T * c.dout, 0.0f);
    float *dx = filled(c.T * c.din, NAN), *dw = filled(c.dout * c.din, 0.0f);

    dt_linear_bwd_ref(c.T, c.din, c.dout, c.x, c.w, c.dy, dx, dw);
    cr_assert(fd_check("linear dx fd", linear_obj, &c, c.x, c.T * c.din, dx));
    cr_assert(fd_check("linear dw fd", linear_obj, &c, c.w, c.dout * c.din, dw));
    free(c.x), free(c.w), free(c.dy), free(c.y), free(dx), free(dw);
}

/*-- embedding --------------------------------------------------------------*/

Test(layers, embed_fast_matches_ref_and_adds)
{
    const int64_t T = 29;
    const int V = 13, d = 19;
    int32_t *tok = tokens(T, V, 3);
    float *table = randn(20, (int64_t)V * d), *dout = randn(21, T * d);
    float *o1 = filled(T * d, NAN), *o2 = filled(T * d, NAN);
    float *dt1 = randn(22, (int64_t)V * d), *dt2 = copy(dt1, (int64_t)V * d);

    dt_embed_fwd_cpu(T, V, d, tok, table, o1);
    dt_embed_fwd_ref(T, V, d, tok, table, o2);
    cr_assert_eq(memcmp(o1, o2, (size_t)(T * d) * sizeof(float)), 0, "embedding is a copy");
    cr_assert_eq(memcmp(o1 + 4 * d, table + (int64_t)tok[4] * d, (size_t)d * sizeof(float)), 0);
    dt_embed_bwd_cpu(T, V, d, tok, dout, dt1);
    dt_embed_bwd_ref(T, V, d, tok, dout, dt2);
    cr_assert(ref_allclose("embed dtable", dt1, dt2, (int64_t)V * d, ATOL, RTOL));
    free(tok), free(table), free(dout), free(o1), free(o2), free(dt1), free(dt2);
}

typedef struct {
    int64_t T;
    int V, d;
    int32_t *tok;
    float *table, *dout, *out;
} embed_ctx;

static double embed_obj(void *p)
{
    embed_ctx *c = p;
    dt_embed_fwd_ref(c->T, c->V, c->d, c->tok, c->table, c->out);
    return dot(c->dout, c->out, c->T * c->d);
}

Test(layers, embed_bwd_matches_finite_differences)
{
    embed_ctx c = { .T = 5, .V = 4, .d = 8 };
    const int32_t tok[5] = { 2, 0, 2, 3, 2 }; /* row 1 unused, row 2 three times */
    c.tok = dt_xmallocarray(5, sizeof(int32_t));
    memcpy(c.tok, tok, sizeof(tok));
    c.table = randn(30, c.V * c.d), c.dout = randn(31, c.T * c.d), c.out = filled(c.T * c.d, 0);
    float *dtable = filled(c.V * c.d, 0.0f);

    dt_embed_bwd_ref(c.T, c.V, c.d, c.tok, c.dout, dtable);
    cr_assert(fd_check("embed dtable fd", embed_obj, &c, c.table, c.V * c.d, dtable));
    for (int j = 0; j < c.d; j++)
        cr_assert_eq(dtable[1 * c.d + j], 0.0f, "an unused row gets no gradient");
    free(c.tok), free(c.table), free(c.dout), free(c.out), free(dtable);
}

/*-- RMSNorm ----------------------------------------------------------------*/

Test(layers, rmsnorm_fast_matches_ref)
{
    const int64_t T = 23;
    const int d = 99; /* eight-lane body plus a tail of 3 */
    const float eps = 1e-5f;
    float *x = randn(40, T * d), *g = randn(41, d), *dy = randn(42, T * d);
    float *y1 = filled(T * d, NAN), *y2 = filled(T * d, NAN);
    float *r1 = filled(T, NAN), *r2 = filled(T, NAN);
    float *dx1 = filled(T * d, NAN), *dx2 = filled(T * d, NAN);
    float *dg1 = randn(43, d), *dg2 = copy(dg1, d);

    dt_rmsnorm_fwd_cpu(T, d, eps, x, g, y1, r1);
    dt_rmsnorm_fwd_ref(T, d, eps, x, g, y2, r2);
    cr_assert(ref_allclose("rmsnorm y", y1, y2, T * d, ATOL, RTOL));
    cr_assert(ref_allclose("rmsnorm rstd", r1, r2, T, ATOL, RTOL));
    dt_rmsnorm_bwd_cpu(T, d, x, g, r2, dy, dx1, dg1);
    dt_rmsnorm_bwd_ref(T, d, x, g, r2, dy, dx2, dg2);
    cr_assert(ref_allclose("rmsnorm dx", dx1, dx2, T * d, ATOL, RTOL));
    cr_assert(ref_allclose("rmsnorm dg", dg1, dg2, d, ATOL, RTOL));

    /* In place (y = x) gives the same numbers. */
    float *xi = copy(x, T * d);
    dt_rmsnorm_fwd_cpu(T, d, eps, xi, g, xi, r1);
    cr_assert_eq(memcmp(xi, y1, (size_t)(T * d) * sizeof(float)), 0, "in place differs");
    free(x), free(g), free(dy), free(y1), free(y2), free(r1), free(r2);
    free(dx1), free(dx2), free(dg1), free(dg2), free(xi);
}

typedef struct {
    int64_t T;
    int d;
    float eps;
    float *x, *g, *dy, *y, *rstd;
} rms_ctx;

static double rms_obj(void *p)
{
    rms_ctx *c = p;
    dt_rmsnorm_fwd_ref(c->T, c->d, c->eps, c->x, c->g, c->y, c->rstd);
    return dot(c->dy, c->y, c->T * c->d);
}

Test(layers, rmsnorm_bwd_matches_finite_differences)
{
    rms_ctx c = { .T = 5, .d = 8, .eps = 1e-5f };
    c.x = randn(50, c.T * c.d), c.g = randn(51, c.d), c.dy = randn(52, c.T * c.d);
    c.y = filled(c.T * c.d, 0), c.rstd = filled(c.T, 0);
    float *dx = filled(c.T * c.d, NAN), *dg = filled(c.d, 0.0f);

    rms_obj(&c);
    dt_rmsnorm_bwd_ref(c.T, c.d, c.x, c.g, c.rstd, c.dy, dx, dg);
    cr_assert(fd_check("rmsnorm dx fd", rms_obj, &c, c.x, c.T * c.d, dx));
    cr_assert(fd_check("rmsnorm dg fd", rms_obj, &c, c.g, c.d, dg));
    free(c.x), free(c.g), free(c.dy), free(c.y), free(c.rstd), free(dx), free(dg);
}

/*-- RoPE -------------------------------------------------------------------*/

Test(layers, rope_fast_matches_ref)
{
    const int64_t T = 17;
    const int H = 3, D = 64;
    int64_t pos[17];
    for (int64_t t = 0; t < T; t++)
        pos[t] = t * t * t * 997 + (t % 3 == 0 ? 1000000000 : 0);
    float *x1 = randn(60, T * H * D), *x2 = copy(x1, T * H * D);

    dt_rope_fwd_cpu(T, H, D, pos, &LLAMA3_ROPE, x1);
    dt_rope_fwd_ref(T, H, D, pos, &LLAMA3_ROPE, x2);
    cr_assert(ref_allclose("rope fwd", x1, x2, T * H * D, ATOL, RTOL));
    dt_rope_bwd_cpu(T, H, D, pos, &LLAMA3_ROPE, x1);
    dt_rope_bwd_ref(T, H, D, pos, &LLAMA3_ROPE, x2);
    cr_assert(ref_allclose("rope bwd", x1, x2, T * H * D, ATOL, RTOL));
    free(x1), free(x2);
}

/* The rotation of x (H, D) at position pos in long double, straight from
 * the definition: angle = pos * theta^(-2i/D) reduced by fmodl against
 * 2 pi in long double (error ~ k * 2^-62, 5e-11 rad at pos = 1e9). */
static void rope_longdouble(int H, int D, int64_t pos, double theta, const float *x, float *y)
{
    const long double two_pi = 2.0L * acosl(-1.0L);
    for (int i = 0; i < D / 2; i++) {
        long double f = powl((long double)theta, -(long double)(2 * i) / (long double)D);
        long double a = fmodl((long double)pos * f, two_pi);
        long double c = cosl(a), s = sinl(a);
        for (int h = 0; h < H; h++) {
            long double x0 = x[h * D + 2 * i], x1 = x[h * D + 2 * i + 1];
            y[h * D + 2 * i] = (float)(x0 * c - x1 * s);
            y[h * D + 2 * i + 1] = (float)(x0 * s + x1 * c);
        }
    }
}

static void rope_vs_longdouble(int64_t pos)
{
    const int H = 4, D = 128;
    float *x = randn(70, H * D), *y = filled(H * D, NAN);
    float *xf = copy(x, H * D), *xr = copy(x, H * D);
    char label[64];

    if (LDBL_MANT_DIG < 64)
        cr_skip_test("long double has %d mantissa bits; this check needs 64", LDBL_MANT_DIG);
    rope_longdouble(H, D, pos, LLAMA3_THETA, x, y);
    dt_rope_fwd_cpu(1, H, D, &pos, &LLAMA3_ROPE, xf);
    dt_rope_fwd_ref(1, H, D, &pos, &LLAMA3_ROPE, xr);
    snprintf(label, sizeof(label), "rope cpu pos=%lld", (long long)pos);
    cr_assert(ref_allclose(label, xf, y, H * D, ROPE_TOL, 0.0f));
    snprintf(label, sizeof(label), "rope ref pos=%lld", (long long)pos);
    cr_assert(ref_allclose(label, xr, y, H * D, ROPE_TOL, 0.0f));

    /* The angles themselves, every pair: sin and cos within 1e-6 (they
     * are in fact within ~1e-15). */
    const long double two_pi = 2.0L * acosl(-1.0L);
    for (int i = 0; i < D / 2; i++) {
        long double f = powl((long double)LLAMA3_THETA, -(long double)(2 * i) / (long double)D);
        long double a = fmodl((long double)pos * f, two_pi);
        double r = dt_rope_angle(pos, i, D, &LLAMA3_ROPE);
        cr_assert(fabs(sin(r) - (double)sinl(a)) <= 1e-6 && fabs(cos(r) - (double)cosl(a)) <= 1e-6,
                  "pos=%lld i=%d: angle %.17g, long double %.17Lg", (long long)pos, i, r, a);
    }
    free(x), free(y), free(xf), free(xr);
}

Test(layers, rope_exact_at_position_1e9)
{
    rope_vs_longdouble(1000000000);
}

Test(layers, rope_exact_at_position_2p24_plus_1)
{
    rope_vs_longdouble(16777217); /* not representable in fp32 */
}

Test(layers, rope_angle_of_pair_0_is_the_position)
{
    /* Pair 0 turns by exactly pos radians; sin and cos of these integers to
     * 20 digits (mpmath, 300 bits). No long double involved. */
    const struct {
        int64_t pos;
        double s, c;
    } k[] = {
        { 1000000000, 0.54584344944869956424, 0.83788718136390233439 },
        { 16777217, 0.10583256734754363973, 0.99438396391365223977 },
    };
    for (size_t j = 0; j < sizeof(k) / sizeof(k[0]); j++) {
        double r = dt_rope_angle(k[j].pos, 0, 128, &LLAMA3_ROPE);
        cr_assert(fabs(r) <= M_PI + 1e-12, "angle %.17g not reduced", r);
        cr_assert(fabs(sin(r) - k[j].s) <= 1e-12, "sin(%lld): %.17g want %.17g",
                  (long long)k[j].pos, sin(r), k[j].s);
        cr_assert(fabs(cos(r) - k[j].c) <= 1e-12, "cos(%lld): %.17g want %.17g",
                  (long long)k[j].pos, cos(r), k[j].c);
    }
}

/* LLaMA 3.1's scaling (theta 500000, factor 8, low 1, high 4, 8192
 * positions, head dim 128, as Meta's 3.1 configs give it): pairs whose
 * wavelength is under 8192 / 4 = 2048 positions keep their frequency, those
 * over 8192 turn 8 times slower, those between are interpolated. Checked
 * region by region against the unscaled frequency, the boundaries by the
 * wavelength in plain double arithmetic, and the interpolation by its
 * endpoints' continuity. */
Test(layers, rope_llama3_scaling_by_region)
{
    const dt_rope_t sc = { .theta = LLAMA3_THETA, .factor = 8, .low_freq_factor = 1,
                           .high_freq_factor = 4, .original_max_pos = 8192 };
    int kept = 0, slowed = 0, between = 0;

    for (int i = 0; i < 64; i++) {
        double fh, fl, uh, ul;
        dt_rope_freq(i, 128, &sc, &fh, &fl);
        dt_rope_freq(i, 128, &LLAMA3_ROPE, &uh, &ul);
        double f = fh + fl, u = uh + ul, wl = 2 * M_PI / u;
        if (wl < 2048) {
            cr_assert(f == u, "pair %d (wavelength %.1f): %.17g, unscaled %.17g", i, wl, f, u);
            kept++;
        } else if (wl > 8192) {
            cr_assert(fabs(f - u / 8) <= 1e-16 * u, "pair %d (wavelength %.1f): %.17g, want "
                      "%.17g", i, wl, f, u / 8);
            slowed++;
        } else {
            double s = (8192 / wl - 1) / (4 - 1);
            cr_assert(fabs(f - ((1 - s) * u / 8 + s * u)) <= 1e-15 * u && f < u && f > u / 8,
                      "pair %d (wavelength %.1f, smooth %.3f): %.17g", i, wl, s, f);
            between++;
        }
    }
    cr_assert(kept > 0 && slowed > 0 && between > 0, "regions %d %d %d", kept, slowed, between);
    /* and the rotation uses it: pair 63 at position 1e6 turns by 1e6 f */
    double fh, fl;
    dt_rope_freq(63, 128, &sc, &fh, &fl);
    double a = dt_rope_angle(1000000, 63, 128, &sc);
    double want = remainder(1e6 * (fh + fl), 2 * M_PI);
    cr_assert(fabs(a - want) <= 1e-9, "angle %.17g want %.17g", a, want);
}

Test(layers, rope_then_backward_is_identity)
{
    const int64_t T = 11;
    const int H = 2, D = 32;
    int64_t pos[11];
    for (int64_t t = 0; t < T; t++)
        pos[t] = (t << 40) + t * 12345; /* up to ~1.1e13 */
    float *x = randn(80, T * H * D), *y = copy(x, T * H * D), *z = copy(x, T * H * D);

    dt_rope_fwd_cpu(T, H, D, pos, &LLAMA3_ROPE, y);
    dt_rope_bwd_cpu(T, H, D, pos, &LLAMA3_ROPE, y);
    cr_assert(ref_allclose("rope cpu round trip", y, x, T * H * D, 1e-6f, 1e-6f));
    dt_rope_fwd_ref(T, H, D, pos, &LLAMA3_ROPE, z);
    dt_rope_bwd_ref(T, H, D, pos, &LLAMA3_ROPE, z);
    cr_assert(ref_allclose("rope ref round trip", z, x, T * H * D, 1e-6f, 1e-6f));
    free(x), free(y), free(z);
}

typedef struct {
    int64_t T;
    int H, D;
    int64_t *pos;
    float *x, *dy, *y;
} rope_ctx;

static double rope_obj(void *p)
{
    rope_ctx *c = p;
    const int64_t n = c->T * c->H * c->D;
    memcpy(c->y, c->x, (size_t)n * sizeof(float));
    dt_rope_fwd_ref(c->T, c->H, c->D, c->pos, &LLAMA3_ROPE, c->y);
    return dot(c->dy, c->y, n);
}

Test(layers, rope_bwd_matches_finite_differences)
{
    int64_t pos[5] = { 0, 1, 7, 1000, 1000000000 };
    rope_ctx c = { .T = 5, .H = 2, .D = 8, .pos = pos };
    const int64_t n = c.T * c.H * c.D;
    c.x = randn(90, n), c.dy = randn(91, n), c.y = filled(n, 0);
    float *dx = copy(c.dy, n);

    dt_rope_bwd_ref(c.T, c.H, c.D, pos, &LLAMA3_ROPE, dx);
    cr_assert(fd_check("rope dx fd", rope_obj, &c, c.x, n, dx));
    free(c.x), free(c.dy), free(c.y), free(dx);
}

/*-- SwiGLU -----------------------------------------------------------------*/

Test(layers, swiglu_fast_matches_ref)
{
    const int64_t T = 13;
    const int f = 43;
    const int64_t n = T * f;
    float *a = randn(100, n), *b = randn(101, n), *dh = randn(102, n);
    a[0] = -100.0f, a[1] = 100.0f, a[2] = 0.0f; /* saturated and zero gates */
    float *h1 = filled(n, NAN), *h2 = filled(n, NAN);
    float *da1 = filled(n, NAN), *da2 = filled(n, NAN), *db1 = filled(n, NAN),
          *db2 = filled(n, NAN);

    dt_swiglu_fwd_cpu(T, f, a, b, h1);
    dt_swiglu_fwd_ref(T, f, a, b, h2);
    cr_assert(ref_allclose("swiglu h", h1, h2, n, ATOL, RTOL));
    dt_swiglu_bwd_cpu(T, f, a, b, dh, da1, db1);
    dt_swiglu_bwd_ref(T, f, a, b, dh, da2, db2);
    cr_assert(ref_allclose("swiglu da", da1, da2, n, ATOL, RTOL));
    cr_assert(ref_allclose("swiglu db", db1, db2, n, ATOL, RTOL));

    /* da written over dh (aliased) gives the same numbers. */
    float *dd = copy(dh, n);
    dt_swiglu_bwd_cpu(T, f, a, b, dd, dd, db1);
    cr_assert_eq(memcmp(dd, da1, (size_t)n * sizeof(float)), 0, "da aliasing dh differs");
    free(a), free(b), free(dh), free(h1), free(h2), free(da1), free(da2), free(db1), free(db2);
    free(dd);
}

typedef struct {
    int64_t T;
    int f;
    float *a, *b, *dh, *h;
} swiglu_ctx;

static double swiglu_obj(void *p)
{
    swiglu_ctx *c = p;
    dt_swiglu_fwd_ref(c->T, c->f, c->a, c->b, c->h);
    return dot(c->dh, c->h, c->T * c->f);
}

Test(layers, swiglu_bwd_matches_finite_differences)
{
    swiglu_ctx c = { .T = 5, .f = 8 };
    const int64_t n = c.T * c.f;
    c.a = randn(110, n), c.b = randn(111, n), c.dh = randn(112, n), c.h = filled(n, 0);
    float *da = filled(n, NAN), *db = filled(n, NAN);

    dt_swiglu_bwd_ref(c.T, c.f, c.a, c.b, c.dh, da, db);
    cr_assert(fd_check("swiglu da fd", swiglu_obj, &c, c.a, n, da));
    cr_assert(fd_check("swiglu db fd", swiglu_obj, &c, c.b, n, db));
    free(c.a), free(c.b), free(c.dh), free(c.h), free(da), free(db);
}

/*-- cross-entropy ----------------------------------------------------------*/

Test(layers, xent_fast_matches_ref)
{
    const int64_t T = 19;
    const int V = 1003;
    float *logits = randn(120, T * V);
    int32_t *tg = tokens(T, V, 11);
    tg[3] = DT_IGNORE, tg[10] = DT_IGNORE;
    float *d1 = filled(T * V, NAN), *d2 = filled(T * V, NAN);
    int64_t n1 = -1, n2 = -1;

    double l1 = dt_xent_cpu(T, V, logits, tg, d1, &n1);
    double l2 = dt_xent_ref(T, V, logits, tg, d2, &n2);
    cr_assert_eq(n1, T - 2);
    cr_assert_eq(n2, T - 2);
    cr_assert(fabs(l1 - l2) <= 1e-5 + 1e-4 * fabs(l2), "loss %.9g vs ref %.9g", l1, l2);
    cr_assert(ref_allclose("xent dlogits", d1, d2, T * V, ATOL, RTOL));
    for (int j = 0; j < V; j++)
        cr_assert(d1[3 * V + j] == 0.0f && d1[10 * V + j] == 0.0f, "ignored rows must be zero");
    /* Loss only: the same value. */
    cr_assert_eq(dt_xent_cpu(T, V, logits, tg, NULL, NULL), l1);

    /* In place (dlogits = logits): the same bits as into a buffer. */
    float *inplace = copy(logits, T * V);
    double l3 = dt_xent_cpu(T, V, inplace, tg, inplace, NULL);
    cr_assert_eq(l3, l1);
    cr_assert_eq(memcmp(inplace, d1, (size_t)(T * V) * sizeof(float)), 0, "in place differs");
    float *inplace2 = copy(logits, T * V);
    cr_assert_eq(dt_xent_ref(T, V, inplace2, tg, inplace2, NULL), l2);
    cr_assert_eq(memcmp(inplace2, d2, (size_t)(T * V) * sizeof(float)), 0, "ref in place differs");
    free(logits), free(tg), free(d1), free(d2), free(inplace), free(inplace2);
}

typedef struct {
    int64_t T;
    int V;
    float *logits;
    int32_t *tg;
} xent_ctx;

static double xent_obj(void *p)
{
    xent_ctx *c = p;
    return dt_xent_ref(c->T, c->V, c->logits, c->tg, NULL, NULL);
}

Test(layers, xent_bwd_matches_finite_differences)
{
    xent_ctx c = { .T = 5, .V = 8 };
    const int32_t tg[5] = { 3, DT_IGNORE, 0, 7, 3 };
    c.tg = dt_xmallocarray(5, sizeof(int32_t));
    memcpy(c.tg, tg, sizeof(tg));
    c.logits = randn(130, c.T * c.V);
    float *dl = filled(c.T * c.V, NAN);

    dt_xent_ref(c.T, c.V, c.logits, c.tg, dl, NULL);
    cr_assert(fd_check("xent dlogits fd", xent_obj, &c, c.logits, c.T * c.V, dl));
    free(c.tg), free(c.logits), free(dl);
}

Test(layers, xent_huge_logits_and_ignored_targets)
{
    const int64_t T = 4;
    const int V = 6;
    float logits[4 * 6];
    for (int i = 0; i < 4 * 6; i++)
        logits[i] = (i % 2) ? 1e4f : -1e4f;
    /* row 0: target at +1e4 (one of three maxima) -> loss log 3;
     * row 1: target at -1e4 -> loss 2e4 + log 3; row 2 ignored;
     * row 3: target at +1e4 again. */
    int32_t tg[4] = { 1, 2, DT_IGNORE, 5 };
    const double want = (log(3.0) + (2e4 + log(3.0)) + log(3.0)) / 3.0;
    float d1[4 * 6], d2[4 * 6];
    int64_t n = 0;

    double l1 = dt_xent_cpu(T, V, logits, tg, d1, &n);
    double l2 = dt_xent_ref(T, V, logits, tg, d2, NULL);
    cr_assert_eq(n, 3);
    cr_assert(isfinite(l1) && isfinite(l2), "loss %g / ref %g not finite", l1, l2);
    cr_assert(fabs(l1 - want) <= 1e-9 * want, "loss %.17g want %.17g", l1, want);
    cr_assert(fabs(l2 - want) <= 1e-9 * want, "ref loss %.17g want %.17g", l2, want);
    for (int i = 0; i < 4 * 6; i++)
        cr_assert(isfinite(d1[i]), "dlogits[%d] = %g", i, d1[i]);
    cr_assert(ref_allclose("xent huge dlogits", d1, d2, T * V, ATOL, RTOL));
    /* Row 1: (softmax - onehot) / 3, softmax = 1/3 on the three maxima. */
    cr_assert(fabs(d1[1 * V + 1] - 1.0 / 9.0) <= 1e-7 && fabs(d1[1 * V + 2] + 1.0 / 3.0) <= 1e-7);

    /* Every target ignored: loss 0, count 0, gradient 0. */
    int32_t none[4] = { DT_IGNORE, DT_IGNORE, DT_IGNORE, DT_IGNORE };
    cr_assert_eq(dt_xent_cpu(T, V, logits, none, d1, &n), 0.0);
    cr_assert_eq(n, 0);
    for (int i = 0; i < 4 * 6; i++)
        cr_assert_eq(d1[i], 0.0f);
}
