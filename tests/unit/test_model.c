/* SPDX-License-Identifier: MIT
 *
 * The LLaMA-3 model on one rank (engine/model/model.h): its gradient against
 * central finite differences of its own loss, tied and untied heads, dense
 * and dilated attention, positions beyond 2^24, and bit-identical repeats.
 * (R ranks against one rank runs as an integration test under mpirun.)
 */
#include "config.h"

#include <criterion/criterion.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "common/mem.h"
#include "engine/model/model.h"

static const dt_model_cfg_t small = {
    .dim = 16, .layers = 2, .heads = 4, .kv_heads = 2, .ffn = 24, .vocab = 11,
    .rope = { .theta = 10000.0 }, .norm_eps = 1e-5f, .tied = false,
};

typedef struct fixture {
    dt_model_cfg_t cfg;
    dt_model_layout_t lo;
    dt_attn_spec_t attn;
    dt_comm_t *comm;
    dt_model_t *m;
    float *P, *G;
    int32_t *x, *y;
    int64_t *pos;
    int64_t T;
} fixture_t;

static void setup(fixture_t *f, const dt_model_cfg_t *cfg, int64_t T, int64_t pos0, int nb,
                  const int64_t *seg, const int64_t *dil)
{
    dt_emsg_t em = { "" };
    memset(f, 0, sizeof(*f));
    f->cfg = *cfg;
    f->T = T;
    cr_assert_eq(dt_model_cfg_check(cfg, &em), 0, "%s", em.s);
    cr_assert_eq(dt_comm_new(NULL, NULL, &f->comm, &em), 0, "%s", em.s);
    dt_model_layout_init(&f->lo, cfg);
    f->attn = (dt_attn_spec_t){ .T = T, .H = cfg->heads, .Hkv = cfg->kv_heads,
                                .D = dt_model_head_dim(cfg), .causal = true, .nbranch = nb };
    for (int b = 0; b < nb; b++) {
        f->attn.seg[b] = seg[b];
        f->attn.dil[b] = dil[b];
    }
    f->m = dt_model_new(cfg, T);
    f->P = dt_xcalloc((size_t)f->lo.nparams, sizeof(float));
    f->G = dt_xcalloc((size_t)f->lo.nparams, sizeof(float));
    /* a larger init than training uses, so every gradient is well above
     * the finite-difference noise */
    dt_model_init(cfg, &f->lo, 3, f->P);
    for (int64_t i = 0; i < f->lo.nparams; i++)
        f->P[i] *= 5.0f;
    f->x = dt_xcalloc((size_t)T, sizeof(int32_t));
    f->y = dt_xcalloc((size_t)T, sizeof(int32_t));
    f->pos = dt_xcalloc((size_t)T, sizeof(int64_t));
    for (int64_t t = 0; t < T; t++) {
        f->x[t] = (int32_t)((t * 7 + 3) % cfg->vocab);
        f->y[t] = t % 5 == 4 ? -1 : (int32_t)((t * 5 + 1) % cfg->vocab);
        f->pos[t] = pos0 + t;
    }
}

static void teardown(fixture_t *f)
{
    dt_model_free(f->m);
    dt_model_layout_close(&f->lo);
    dt_comm_free(f->comm);
    free(f->P);
    free(f->G);
    free(f->x);
    free(f->y);
    free(f->pos);
}

static double loss_at(fixture_t *f)
{
    dt_emsg_t em = { "" };
    double l = 0;
    cr_assert_eq(dt_model_step(f->m, f->comm, &f->attn, f->P, f->x, f->y, f->pos, NULL, &l, &em),
                 0, "%s", em.s);
    return l;
}

/* Central differences at n parameters spread over the whole array (every
 * tensor gets some): |g - fd| <= 2e-3 + 5e-2 |fd|, fp32 forward with a step
 * of 1e-3 (fp32 loss noise ~2e-7 / 2e-3 = 1e-4 in the difference; a step of
 * 1e-2 is too coarse for the embedding rows, whose RMSNorm is strongly
 * curved at this scale). */
static void check_grads(fixture_t *f, int n)
{
    dt_emsg_t em = { "" };
    double l;
    cr_assert_eq(dt_model_step(f->m, f->comm, &f->attn, f->P, f->x, f->y, f->pos, f->G, &l, &em),
                 0, "%s", em.s);
    cr_assert(isfinite(l) && l > 0);
    int bad = 0;
    double worst = 0;
    for (int i = 0; i < n; i++) {
        int64_t k = (int64_t)((double)i / n * (double)f->lo.nparams) + i % 7;
        if (k >= f->lo.nparams)
            k = f->lo.nparams - 1;
        float keep = f->P[k], h = 1e-3f;
        f->P[k] = keep + h;
        double lp = loss_at(f);
        f->P[k] = keep - h;
        double lm = loss_at(f);
        f->P[k] = keep;
        double fd = (lp - lm) / (2.0 * h), g = f->G[k];
        double err = fabs(g - fd);
        if (err > 2e-3 + 5e-2 * fabs(fd)) {
            if (bad++ < 5)
                cr_log_error("param %lld: grad %.6g finite difference %.6g", (long long)k, g, fd);
        }
        worst = err > worst ? err : worst;
    }
    cr_assert_eq(bad, 0, "%d of %d gradients differ from finite differences (worst %.3g)", bad, n,
                 worst);
}

Test(model, gradient_matches_finite_differences_untied)
{
    fixture_t f;
    setup(&f, &small, 12, 0, 0, NULL, NULL);
    check_grads(&f, 120);
    teardown(&f);
}

Test(model, gradient_matches_finite_differences_tied)
{
    dt_model_cfg_t c = small;
    fixture_t f;
    c.tied = true;
    setup(&f, &c, 12, 0, 0, NULL, NULL);
    cr_assert_eq(f.lo.lm_head, f.lo.tok_emb);
    check_grads(&f, 120);
    teardown(&f);
}

Test(model, gradient_with_dilated_attention_and_huge_positions)
{
    int64_t seg[] = { 4, 12 }, dil[] = { 1, 2 };
    fixture_t f;
    setup(&f, &small, 12, 1000000000LL, 2, seg, dil);
    check_grads(&f, 80);
    teardown(&f);
}

Test(model, repeated_steps_are_bit_identical)
{
    fixture_t f;
    dt_emsg_t em = { "" };
    double l1, l2;
    setup(&f, &small, 16, 0, 0, NULL, NULL);
    float *g1 = dt_xcalloc((size_t)f.lo.nparams, sizeof(float));
    cr_assert_eq(dt_model_step(f.m, f.comm, &f.attn, f.P, f.x, f.y, f.pos, g1, &l1, &em), 0);
    cr_assert_eq(dt_model_step(f.m, f.comm, &f.attn, f.P, f.x, f.y, f.pos, f.G, &l2, &em), 0);
    cr_assert_eq(memcmp(&l1, &l2, sizeof(l1)), 0);
    cr_assert_eq(memcmp(g1, f.G, (size_t)f.lo.nparams * sizeof(float)), 0);
    free(g1);
    teardown(&f);
}

Test(model, refusals_name_the_problem)
{
    dt_model_cfg_t c = small;
    dt_emsg_t em = { "" };
    c.heads = 3;
    cr_assert_eq(dt_model_cfg_check(&c, &em), DT_EINVAL);
    cr_assert(strstr(em.s, "heads 3 do not divide dim 16"), "%s", em.s);
    c = small;
    c.kv_heads = 3;
    cr_assert_eq(dt_model_cfg_check(&c, &em), DT_EINVAL);
    cr_assert(strstr(em.s, "kv_heads 3"), "%s", em.s);

    fixture_t f;
    double l;
    setup(&f, &small, 8, 0, 0, NULL, NULL);
    f.x[3] = 99;
    cr_assert_eq(dt_model_step(f.m, f.comm, &f.attn, f.P, f.x, f.y, f.pos, f.G, &l, &em), DT_ERANGE);
    cr_assert(strstr(em.s, "token 99"), "%s", em.s);
    teardown(&f);
}
