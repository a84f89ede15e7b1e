/* SPDX-License-Identifier: MIT
 *
 * AdamW, the warm-up + cosine learning-rate schedule and global-norm
 * clipping (contracts in optim.h). Element-wise updates in double; the one
 * reduction (the sum of squares) has a fixed order so that results do not
 * depend on anything but the inputs.
 *
 * Not here: communication, parameter layout, checkpointing of the moments.
 */
#include "config.h"

#include <math.h>

#include "engine/model/optim.h"
#include "kernels/adamw.h"

int dt_adamw_check(const dt_adamw_cfg_t *cfg, dt_emsg_t *em)
{
    if (!(cfg->beta1 >= 0.0 && cfg->beta1 < 1.0))
        return dt_emsg_set(em, DT_EINVAL, "adamw: beta1 = %g not in [0, 1)", cfg->beta1);
    if (!(cfg->beta2 >= 0.0 && cfg->beta2 < 1.0))
        return dt_emsg_set(em, DT_EINVAL, "adamw: beta2 = %g not in [0, 1)", cfg->beta2);
    if (!(cfg->eps > 0.0 && isfinite(cfg->eps)))
        return dt_emsg_set(em, DT_EINVAL, "adamw: eps = %g must be positive", cfg->eps);
    if (!(cfg->weight_decay >= 0.0 && isfinite(cfg->weight_decay)))
        return dt_emsg_set(em, DT_EINVAL, "adamw: weight_decay = %g must be >= 0",
                           cfg->weight_decay);
    return 0;
}

void dt_adamw_step(const dt_adamw_cfg_t *cfg, int64_t step, double lr, double weight_decay,
                   int64_t n, float *p, const float *g, float *m, float *v)
{
    const dt_adamw_k_t k =
        dt_adamw_k_make(cfg->beta1, cfg->beta2, cfg->eps, lr, weight_decay, step);

    for (int64_t i = 0; i < n; i++)
        dt_adamw_elem(&k, g[i], &p[i], &m[i], &v[i]);
}

void dt_adamw_step_scaled(const dt_adamw_cfg_t *cfg, int64_t step, double lr,
                          double weight_decay, int64_t n, float *p, const float *g, float gscale,
                          float *m, float *v)
{
    const dt_adamw_k_t k =
        dt_adamw_k_make(cfg->beta1, cfg->beta2, cfg->eps, lr, weight_decay, step);

#pragma omp parallel for schedule(static) if (n > 65536)
    for (int64_t i = 0; i < n; i++)
        dt_adamw_elem(&k, g[i] * gscale, &p[i], &m[i], &v[i]);
}

void dt_adamw_step_ranges(const dt_adamw_cfg_t *cfg, int64_t step, double lr, int nr,
                          const dt_param_range_t *r, float *p, const float *g, float *m, float *v)
{
    for (int k = 0; k < nr; k++) {
        const int64_t o = r[k].off;
        dt_adamw_step(cfg, step, lr, r[k].decay ? cfg->weight_decay : 0.0, r[k].n, p + o, g + o,
                      m + o, v + o);
    }
}

void dt_sumsq_parts(int64_t n, const float *g, double *part)
{
    const int64_t k = (n + DT_SUMSQ_PARTS - 1) / DT_SUMSQ_PARTS;

#pragma omp parallel for schedule(static) if (n > 65536)
    for (int b = 0; b < DT_SUMSQ_PARTS; b++) {
        double lane[DT_SUMSQ_LANES];
        const int64_t lo = (int64_t)b * k, hi = lo + k < n ? lo + k : n;
        for (int t = 0; t < DT_SUMSQ_LANES; t++) {
            double s = 0.0;
            for (int64_t i = lo + t; i < hi; i += DT_SUMSQ_LANES)
                s += (double)g[i] * g[i];
            lane[t] = s;
        }
        for (int h = DT_SUMSQ_LANES / 2; h > 0; h /= 2)
            for (int t = 0; t < h; t++)
                lane[t] += lane[t + h];
        part[b] = lane[0];
    }
}

void dt_grad_accumulate(int64_t n, float *dst, const float *add)
{
#pragma omp parallel for schedule(static) if (n > 65536)
    for (int64_t i = 0; i < n; i++)
        dst[i] = dst[i] + add[i];
}

int dt_lr_sched_check(const dt_lr_sched_t *s, dt_emsg_t *em)
{
    if (!(isfinite(s->max_lr) && isfinite(s->min_lr) && s->min_lr >= 0.0 && s->min_lr <= s->max_lr))
        return dt_emsg_set(em, DT_EINVAL, "lr schedule: need 0 <= min_lr (%g) <= max_lr (%g)",
                           s->min_lr, s->max_lr);
    if (s->total <= 0)
        return dt_emsg_set(em, DT_EINVAL, "lr schedule: total = %lld must be positive",
                           (long long)s->total);
    if (s->warmup < 0 || s->warmup > s->total)
        return dt_emsg_set(em, DT_EINVAL, "lr schedule: warmup = %lld not in [0, total = %lld]",
                           (long long)s->warmup, (long long)s->total);
    return 0;
}

double dt_lr_at(const dt_lr_sched_t *s, int64_t step)
{
    if (step < s->warmup)
        return s->max_lr * (double)(step + 1) / (double)s->warmup;
    if (step > s->total)
        return s->min_lr;
    if (s->total == s->warmup) /* step == total == warmup: the peak */
        return s->max_lr;
    const double q = (double)(step - s->warmup) / (double)(s->total - s->warmup);
    return s->min_lr + (s->max_lr - s->min_lr) * 0.5 * (1.0 + cos(M_PI * q));
}

double dt_grad_sumsq(int64_t n, const float *g)
{
    double acc[8] = { 0 };
    int64_t i = 0;

    for (; i + 8 <= n; i += 8)
        for (int l = 0; l < 8; l++)
            acc[l] += (double)g[i + l] * g[i + l];
    double s = ((acc[0] + acc[1]) + (acc[2] + acc[3])) + ((acc[4] + acc[5]) + (acc[6] + acc[7]));
    for (; i < n; i++)
        s += (double)g[i] * g[i];
    return s;
}

void dt_grad_scale(int64_t n, float *g, double s)
{
    const float f = (float)s;
    for (int64_t i = 0; i < n; i++)
        g[i] *= f;
}

double dt_grad_clip(int64_t n, float *g, double max_norm)
{
    const double norm = sqrt(dt_grad_sumsq(n, g));

    if (max_norm > 0.0 && isfinite(norm) && norm > max_norm)
        dt_grad_scale(n, g, max_norm / norm);
    return norm;
}
