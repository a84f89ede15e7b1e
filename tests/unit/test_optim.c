/* SPDX-License-Identifier: MIT
 *
 * Tests of engine/model/optim.h: one AdamW step against numbers worked out by
 * hand, the bias correction of the first and second steps, weight decay
 * applied only to the ranges that ask for it, the learning-rate schedule at
 * its endpoints (step 0, end of warm-up, middle and end of the decay, past
 * the end), global-norm clipping (the norm it returns, the norm it leaves,
 * when it must not touch the gradient), bit-identical reruns, and the
 * refusals of the config checks with their messages.
 *
 * Not here: the all-reduce of gradients across ranks, a training loop.
 */
#include "config.h"

#include <criterion/criterion.h>
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "common/err.h"
#include "common/mem.h"
#include "engine/model/optim.h"
#include "tests/ref/ref.h"

/* Stored values are fp32 rounded from double arithmetic: within half an
 * ulp of fp32 (6e-8 relative), so 2e-7 relative leaves room for one more
 * rounding of an intermediate. */
#define FTOL 2e-7

#define SEED 424242u

static const dt_adamw_cfg_t CFG = { .beta1 = 0.9, .beta2 = 0.95, .eps = 1e-8, .weight_decay = 0.1 };

static void assert_near(const char *what, int i, double got, double want)
{
    cr_assert(fabs(got - want) <= FTOL * fabs(want) + 1e-12, "%s[%d] = %.9g, want %.9g", what, i,
              got, want);
}

/*-- AdamW ------------------------------------------------------------------*/

Test(optim, adamw_first_step_by_hand)
{
    /* Step 1, lr 0.01, weight decay 0.1, beta 0.9 / 0.95:
     *   m = 0.1 g, v = 0.05 g^2, mhat = g, vhat = g^2,
     *   p' = p (1 - 0.01 * 0.1) - 0.01 g / (|g| + 1e-8).
     * p = 1.0, g = 0.5:   0.999 - 0.01 * 0.5 / 0.50000001 = 0.98900000020
     * p = -2.0, g = -4.0: -1.998 + 0.01 * 4 / 4.00000001  = -1.98800000003
     * p = 0.25, g = 0.0:  0.25 * 0.999 = 0.24975 (no gradient, only decay)
     * p = 3.0, g = 1e-3:  2.997 - 0.01 * 1e-3 / (1e-3 + 1e-8) = 2.98700009999 */
    float p[4] = { 1.0f, -2.0f, 0.25f, 3.0f };
    const float g[4] = { 0.5f, -4.0f, 0.0f, 1e-3f };
    float m[4] = { 0 }, v[4] = { 0 };
    const double want_p[4] = { 0.98900000020, -1.988000000025, 0.24975, 2.98700009999 };

    dt_adamw_step(&CFG, 1, 0.01, 0.1, 4, p, g, m, v);
    for (int i = 0; i < 4; i++) {
        assert_near("p", i, p[i], want_p[i]);
        assert_near("m", i, m[i], 0.1 * g[i]);
        assert_near("v", i, v[i], 0.05 * (double)g[i] * g[i]);
    }
}

Test(optim, adamw_bias_correction)
{
    /* Without bias correction the first step would move a parameter by
     * lr * 0.1 g / (sqrt(0.05) |g|) = 0.447 lr; with it, by lr, whatever g. */
    const float g1[3] = { 1e-4f, 3.0f, -70.0f }, g2[3] = { -2e-4f, 1.0f, 10.0f };
    float p[3] = { 0 }, m[3] = { 0 }, v[3] = { 0 };
    const double lr = 1e-3;

    dt_adamw_step(&CFG, 1, lr, 0.0, 3, p, g1, m, v);
    for (int i = 0; i < 3; i++)
        assert_near("step 1 |dp|", i, fabs(p[i]), lr * fabs(g1[i]) / (fabs(g1[i]) + 1e-8));

    /* Step 2, the textbook formula: mhat = m / (1 - 0.9^2), vhat = v / (1 - 0.95^2). */
    double want[3];
    for (int i = 0; i < 3; i++) {
        double m2 = 0.9 * (0.1 * g1[i]) + 0.1 * g2[i];
        double v2 = 0.95 * (0.05 * (double)g1[i] * g1[i]) + 0.05 * (double)g2[i] * g2[i];
        double mhat = m2 / (1.0 - 0.81), vhat = v2 / (1.0 - 0.9025);
        want[i] = (double)p[i] - lr * mhat / (sqrt(vhat) + 1e-8);
    }
    dt_adamw_step(&CFG, 2, lr, 0.0, 3, p, g2, m, v);
    for (int i = 0; i < 3; i++)
        assert_near("step 2 p", i, p[i], want[i]);
}

Test(optim, weight_decay_only_where_asked)
{
    /* Zero gradient: the Adam part is 0 / (0 + eps) = 0, so only decay moves p. */
    enum { N = 10 };
    float p[N], p0[N], g[N] = { 0 }, m[N] = { 0 }, v[N] = { 0 };
    for (int i = 0; i < N; i++)
        p[i] = p0[i] = 1.0f + (float)i;
    const dt_param_range_t r[3] = {
        { .off = 0, .n = 4, .decay = 1 }, /* weights */
        { .off = 4, .n = 2, .decay = 0 }, /* norm gains */
        { .off = 7, .n = 3, .decay = 1 }, /* element 6 is in no range */
    };

    dt_adamw_step_ranges(&CFG, 1, 0.5, 3, r, p, g, m, v);
    for (int i = 0; i < N; i++) {
        if (i == 4 || i == 5 || i == 6)
            cr_assert_eq(p[i], p0[i], "p[%d] = %.9g must not decay", i, p[i]);
        else
            assert_near("decayed p", i, p[i], p0[i] * (1.0 - 0.5 * 0.1));
    }
}

/*-- learning-rate schedule -------------------------------------------------*/

Test(optim, schedule_endpoints)
{
    const dt_lr_sched_t s = { .max_lr = 6e-4, .min_lr = 6e-5, .warmup = 10, .total = 110 };
    cr_assert_eq(dt_lr_sched_check(&s, NULL), 0);

    cr_assert(fabs(dt_lr_at(&s, 0) - 6e-5) <= 1e-18, "step 0: %.17g", dt_lr_at(&s, 0));
    cr_assert(fabs(dt_lr_at(&s, 4) - 3e-4) <= 1e-18, "step 4: %.17g", dt_lr_at(&s, 4));
    cr_assert_eq(dt_lr_at(&s, 9), 6e-4, "end of warm-up: %.17g", dt_lr_at(&s, 9));
    cr_assert_eq(dt_lr_at(&s, 10), 6e-4, "start of decay: %.17g", dt_lr_at(&s, 10));
    cr_assert(fabs(dt_lr_at(&s, 60) - 3.3e-4) <= 1e-18, "middle: %.17g", dt_lr_at(&s, 60));
    cr_assert_eq(dt_lr_at(&s, 110), 6e-5, "end: %.17g", dt_lr_at(&s, 110));
    cr_assert_eq(dt_lr_at(&s, 111), 6e-5);
    cr_assert_eq(dt_lr_at(&s, 1000000), 6e-5);
    for (int64_t k = 10; k < 110; k++)
        cr_assert(dt_lr_at(&s, k + 1) <= dt_lr_at(&s, k), "not decreasing at %lld", (long long)k);

    const dt_lr_sched_t nw = { .max_lr = 1.0, .min_lr = 0.0, .warmup = 0, .total = 4 };
    cr_assert_eq(dt_lr_at(&nw, 0), 1.0, "no warm-up starts at max_lr");
    cr_assert(fabs(dt_lr_at(&nw, 2) - 0.5) <= 1e-15);
    cr_assert_eq(dt_lr_at(&nw, 4), 0.0);

    const dt_lr_sched_t flat = { .max_lr = 1.0, .min_lr = 0.1, .warmup = 4, .total = 4 };
    cr_assert_eq(dt_lr_at(&flat, 3), 1.0);
    cr_assert_eq(dt_lr_at(&flat, 4), 1.0);
    cr_assert_eq(dt_lr_at(&flat, 5), 0.1);
}

Test(optim, config_checks_name_the_field)
{
    dt_emsg_t em = { "" };
    dt_lr_sched_t s = { .max_lr = 1e-4, .min_lr = 1e-3, .warmup = 0, .total = 10 };
    cr_assert_eq(dt_lr_sched_check(&s, &em), DT_EINVAL);
    cr_assert_str_eq(em.s, "lr schedule: need 0 <= min_lr (0.001) <= max_lr (0.0001)");
    s.min_lr = 0.0, s.warmup = 11;
    cr_assert_eq(dt_lr_sched_check(&s, &em), DT_EINVAL);
    cr_assert_str_eq(em.s, "lr schedule: warmup = 11 not in [0, total = 10]");

    dt_adamw_cfg_t c = CFG;
    cr_assert_eq(dt_adamw_check(&c, &em), 0);
    c.beta2 = 1.0;
    cr_assert_eq(dt_adamw_check(&c, &em), DT_EINVAL);
    cr_assert_str_eq(em.s, "adamw: beta2 = 1 not in [0, 1)");
}

/*-- clipping ---------------------------------------------------------------*/

Test(optim, clip_scales_to_max_norm)
{
    const int64_t n = 1003; /* eight-lane body and a tail */
    float *g = dt_xaligned((size_t)n, sizeof(float));
    ref_fill(SEED, 1, n, g);
    float *g0 = dt_xaligned((size_t)n, sizeof(float));
    memcpy(g0, g, (size_t)n * sizeof(float));
    double naive = 0.0;
    for (int64_t i = 0; i < n; i++)
        naive += (double)g[i] * g[i];
    naive = sqrt(naive);

    /* Below the threshold: returns the norm, g untouched. */
    double norm = dt_grad_clip(n, g, 1e6);
    cr_assert(fabs(norm - naive) <= 1e-12 * naive, "norm %.17g, naive %.17g", norm, naive);
    cr_assert_eq(memcmp(g, g0, (size_t)n * sizeof(float)), 0);
    cr_assert_eq(dt_grad_clip(n, g, 0.0), norm, "max_norm 0 disables clipping");
    cr_assert_eq(memcmp(g, g0, (size_t)n * sizeof(float)), 0);

    /* Above: the new norm is max_norm to fp32 rounding, directions kept. */
    cr_assert_eq(dt_grad_clip(n, g, 1.0), norm, "returns the norm before clipping");
    double after = sqrt(dt_grad_sumsq(n, g));
    cr_assert(fabs(after - 1.0) <= 1e-6, "norm after clipping %.17g, want 1", after);
    for (int64_t i = 0; i < n; i++)
        cr_assert(fabs(g[i] - g0[i] / norm) <= 1e-7 * fabs(g0[i] / norm) + 1e-12,
                  "g[%lld] = %.9g want %.9g", (long long)i, g[i], g0[i] / norm);

    /* A NaN gradient: reported, nothing scaled. */
    memcpy(g, g0, (size_t)n * sizeof(float));
    g[17] = NAN;
    cr_assert(isnan(dt_grad_clip(n, g, 1.0)));
    cr_assert_eq(g[0], g0[0]);
    free(g), free(g0);
}

/*-- determinism ------------------------------------------------------------*/

typedef struct {
    float *p, *m, *v;
    double norms[3];
} run_state;

static run_state train3(int64_t n)
{
    run_state s = { .p = dt_xaligned((size_t)n, sizeof(float)),
                    .m = dt_xcalloc((size_t)n, sizeof(float)),
                    .v = dt_xcalloc((size_t)n, sizeof(float)) };
    float *g = dt_xaligned((size_t)n, sizeof(float));
    const dt_lr_sched_t sch = { .max_lr = 3e-4, .min_lr = 3e-5, .warmup = 1, .total = 3 };
    const dt_param_range_t r[2] = { { 0, n / 2, 1 }, { n / 2, n - n / 2, 0 } };

    ref_fill(SEED, 2, n, s.p);
    for (int k = 0; k < 3; k++) {
        ref_fill(SEED, 10 + (uint64_t)k, n, g);
        s.norms[k] = dt_grad_clip(n, g, 20.0);
        dt_adamw_step_ranges(&CFG, k + 1, dt_lr_at(&sch, k), 2, r, s.p, g, s.m, s.v);
    }
    free(g);
    return s;
}

Test(optim, deterministic_reruns)
{
    const int64_t n = 4099;
    run_state a = train3(n), b = train3(n);

    cr_assert(a.norms[0] > 20.0, "the test must clip (norm %g)", a.norms[0]);
    cr_assert_eq(memcmp(a.norms, b.norms, sizeof(a.norms)), 0);
    cr_assert_eq(memcmp(a.p, b.p, (size_t)n * sizeof(float)), 0, "p differs between runs");
    cr_assert_eq(memcmp(a.m, b.m, (size_t)n * sizeof(float)), 0, "m differs between runs");
    cr_assert_eq(memcmp(a.v, b.v, (size_t)n * sizeof(float)), 0, "v differs between runs");
    free(a.p), free(a.m), free(a.v), free(b.p), free(b.m), free(b.v);
}
