/* SPDX-License-Identifier: MIT
 *
 * One-head attention on the CPU, the plain parts: the reference (plain
 * loops in double) the fast path in attn_cpu.c and the CUDA kernels are
 * tested against, and the LSE merge and delta, which are plain loops in
 * every path. No BLAS here, so the GPU tests link this file alone and run
 * on a bare GPU node.
 */
#include "config.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "common/mem.h"
#include "kernels/cpu/attn_cpu.h"
#include "spec/mask.h"

void dt_attn_merge_cpu(int64_t n, int d, float *o1, int64_t ld1, float *lse1, const float *o2,
                       int64_t ld2, const float *lse2)
{
    for (int64_t i = 0; i < n; i++) {
        float a = lse1[i], b = lse2[i];
        if (isinf(b) && b < 0)
            continue; /* nothing to add */
        float *x = o1 + i * ld1;
        const float *y = o2 + i * ld2;
        if (isinf(a) && a < 0) {
            memcpy(x, y, (size_t)d * sizeof(float));
            lse1[i] = b;
            continue;
        }
        /* weights relative to the larger lse: one is 1, the other <= 1 */
        float mx = a > b ? a : b;
        float wa = expf(a - mx), wb = expf(b - mx);
        float sum = wa + wb;
        wa /= sum;
        wb /= sum;
        for (int c = 0; c < d; c++)
            x[c] = wa * x[c] + wb * y[c];
        lse1[i] = mx + logf(sum);
    }
}

void dt_attn_delta_cpu(int64_t n, int d, const float *dout, int64_t lddo, const float *o,
                       int64_t ldo, float *delta)
{
    for (int64_t i = 0; i < n; i++) {
        double acc = 0.0;
        for (int c = 0; c < d; c++)
            acc += (double)dout[i * lddo + c] * o[i * ldo + c];
        delta[i] = (float)acc;
    }
}

/* ---- reference: the same contracts, plain loops in double ---------------- */

static int visible(const dt_attn_head_t *a, int64_t i, int64_t j)
{
    if (a->qpos == NULL || a->kpos == NULL)
        return 1;
    if (a->qlo)
        return a->kpos[j] >= a->qlo[i] && a->kpos[j] < a->qhi[i];
    if (a->mask)
        return dt_mask_allows(a->mask, a->head, a->qpos[i], a->kpos[j]);
    return a->kpos[j] <= a->qpos[i];
}

static double dot(const float *x, const float *y, int d)
{
    double acc = 0.0;
    for (int c = 0; c < d; c++)
        acc += (double)x[c] * y[c];
    return acc;
}

void dt_attn_head_fwd_ref(const dt_attn_head_t *a, float *o, int64_t ldo, float *lse)
{
    const int d = a->d;
    double *acc = dt_xcalloc((size_t)d, sizeof(double));

    for (int64_t i = 0; i < a->tq; i++) {
        const float *qi = a->q + i * a->ldq;
        double mx = -INFINITY;
        for (int64_t j = 0; j < a->tk; j++)
            if (visible(a, i, j)) {
                double sc = a->scale * dot(qi, a->k + j * a->ldk, d);
                mx = sc > mx ? sc : mx;
            }
        if (isinf(mx))
            continue; /* no visible key: the state is unchanged */
        double prev = lse[i];
        double m = prev > mx ? prev : mx;
        double sum = isinf(prev) ? 0.0 : exp(prev - m);
        for (int c = 0; c < d; c++)
            acc[c] = sum * o[i * ldo + c];
        for (int64_t j = 0; j < a->tk; j++) {
            if (!visible(a, i, j))
                continue;
            double p = exp(a->scale * dot(qi, a->k + j * a->ldk, d) - m);
            sum += p;
            for (int c = 0; c < d; c++)
                acc[c] += p * a->v[j * a->ldv + c];
        }
        for (int c = 0; c < d; c++)
            o[i * ldo + c] = (float)(acc[c] / sum);
        lse[i] = (float)(m + log(sum));
    }
    free(acc);
}

void dt_attn_head_bwd_ref(const dt_attn_head_t *a, const dt_attn_head_grad_t *g)
{
    const int d = a->d;

    for (int64_t i = 0; i < a->tq; i++) {
        const float *qi = a->q + i * a->ldq;
        const float *doi = g->dout + i * g->lddo;
        if (isinf(g->lse[i]))
            continue;
        for (int64_t j = 0; j < a->tk; j++) {
            if (!visible(a, i, j))
                continue;
            const float *kj = a->k + j * a->ldk, *vj = a->v + j * a->ldv;
            double p = exp(a->scale * dot(qi, kj, d) - g->lse[i]);
            double dpv = dot(doi, vj, d);
            double ds = p * (dpv - g->delta[i]);
            for (int c = 0; c < d; c++) {
                g->dv[j * a->ldv + c] += (float)(p * doi[c]);
                g->dq[i * a->ldq + c] += (float)(a->scale * ds * kj[c]);
                g->dk[j * a->ldk + c] += (float)(a->scale * ds * qi[c]);
            }
        }
    }
}
