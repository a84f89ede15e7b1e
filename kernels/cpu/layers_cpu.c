/* SPDX-License-Identifier: MIT
 *
 * LLaMA-3 layer ops on the CPU (see layers_cpu.h for the contracts): the
 * fast paths. The references they are tested against, and the RoPE angle
 * both share, are in layers_ref.c.
 *
 * Not here: attention (attn_cpu.c), anything that allocates a layer's
 * activations or decides an order of ops.
 */
#include "config.h"

#include <assert.h>
#include <cblas.h>
#include <limits.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "common/mem.h"
#include "kernels/cpu/layers_cpu.h"

int dt_tokens_check(int64_t T, int V, const int32_t *tok, int ignore_ok, dt_emsg_t *em)
{
    for (int64_t t = 0; t < T; t++) {
        if (tok[t] >= 0 && tok[t] < V)
            continue;
        if (ignore_ok && tok[t] == DT_IGNORE)
            continue;
        return dt_emsg_set(em, DT_ERANGE, "token %d at row %lld outside [0, %d)", (int)tok[t],
                           (long long)t, V);
    }
    return 0;
}

/*-- fast paths -------------------------------------------------------------*/

void dt_linear_fwd_cpu(int64_t T, int din, int dout, const float *x, const float *w, float *y)
{
    /* y (T, dout) = x (T, din) . w^T */
    assert(T <= INT_MAX); /* BLAS dimensions are int */
    if (T <= 0 || dout <= 0)
        return;
    if (din <= 0) {
        memset(y, 0, (size_t)T * (size_t)dout * sizeof(float));
        return;
    }
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, (int)T, dout, din, 1.0f, x, din, w, din,
                0.0f, y, dout);
}

void dt_linear_bwd_cpu(int64_t T, int din, int dout, const float *x, const float *w,
                       const float *dy, float *dx, float *dw)
{
    assert(T <= INT_MAX);
    if (T <= 0 || din <= 0)
        return;
    if (dx != NULL) {
        if (dout <= 0)
            memset(dx, 0, (size_t)T * (size_t)din * sizeof(float));
        else /* dx (T, din) = dy (T, dout) . w (dout, din) */
            cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, (int)T, din, dout, 1.0f, dy,
                        dout, w, din, 0.0f, dx, din);
    }
    if (dw != NULL && dout > 0) /* dw (dout, din) += dy^T (dout, T) . x (T, din) */
        cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, dout, din, (int)T, 1.0f, dy, dout, x,
                    din, 1.0f, dw, din);
}

void dt_embed_fwd_cpu(int64_t T, int V, int d, const int32_t *tok, const float *table, float *out)
{
    for (int64_t t = 0; t < T; t++) {
        assert(tok[t] >= 0 && tok[t] < V);
        memcpy(out + t * d, table + (int64_t)tok[t] * d, (size_t)d * sizeof(float));
    }
}

void dt_embed_bwd_cpu(int64_t T, int V, int d, const int32_t *tok, const float *dout, float *dtable)
{
    for (int64_t t = 0; t < T; t++) {
        assert(tok[t] >= 0 && tok[t] < V);
        float *restrict row = dtable + (int64_t)tok[t] * d;
        const float *restrict src = dout + t * d;
        for (int j = 0; j < d; j++)
            row[j] += src[j];
    }
}

void dt_rmsnorm_fwd_cpu(int64_t T, int d, float eps, const float *x, const float *g, float *y,
                        float *rstd)
{
    for (int64_t t = 0; t < T; t++) {
        const float *xr = x + t * d;
        float *yr = y + t * d;
        /* Eight float partial sums vectorise; their order is fixed. */
        float acc[8] = { 0 };
        int j = 0;
        for (; j + 8 <= d; j += 8)
            for (int l = 0; l < 8; l++)
                acc[l] += xr[j + l] * xr[j + l];
        double ss = 0.0;
        for (int l = 0; l < 8; l++)
            ss += acc[l];
        for (; j < d; j++)
            ss += (double)xr[j] * xr[j];
        float r = (float)(1.0 / sqrt(ss / d + (double)eps));
        rstd[t] = r;
        for (j = 0; j < d; j++)
            yr[j] = xr[j] * r * g[j];
    }
}

void dt_rmsnorm_bwd_cpu(int64_t T, int d, const float *x, const float *g, const float *rstd,
                        const float *dy, float *dx, float *dg)
{
    for (int64_t t = 0; t < T; t++) {
        const float *restrict xr = x + t * d;
        const float *restrict dyr = dy + t * d;
        float *restrict dxr = dx + t * d;
        const float r = rstd[t];
        float acc[8] = { 0 };
        int j = 0;
        for (; j + 8 <= d; j += 8)
            for (int l = 0; l < 8; l++)
                acc[l] += dyr[j + l] * g[j + l] * xr[j + l];
        double s = 0.0;
        for (int l = 0; l < 8; l++)
            s += acc[l];
        for (; j < d; j++)
            s += (double)dyr[j] * g[j] * xr[j];
        const float c = (float)((double)r * r * r * s / d);
        for (j = 0; j < d; j++)
            dxr[j] = r * g[j] * dyr[j] - c * xr[j];
        if (dg != NULL)
            for (j = 0; j < d; j++)
                dg[j] += dyr[j] * xr[j] * r;
    }
}

/* Rotate every pair of x (T, H, D) by sign * angle. The cos/sin of a row
 * are shared by its H heads, so they are computed once per row. */
static void rope_apply_cpu(int64_t T, int H, int D, const int64_t *pos, const dt_rope_t *rope,
                           double sign, float *x)
{
    const int half = D / 2;
    double *fh = dt_xmallocarray((size_t)(half > 0 ? half : 1), 2 * sizeof(double));
    double *fl = fh + half;
    float *cs = dt_xmallocarray((size_t)(half > 0 ? half : 1), 2 * sizeof(float));
    float *sn = cs + half;

    assert(D % 2 == 0);
    for (int i = 0; i < half; i++)
        dt_rope_freq(i, D, rope, &fh[i], &fl[i]);
    for (int64_t t = 0; t < T; t++) {
        for (int i = 0; i < half; i++) {
            double a = sign * dt_rope_reduce(pos[t], fh[i], fl[i]);
            cs[i] = (float)cos(a);
            sn[i] = (float)sin(a);
        }
        for (int h = 0; h < H; h++) {
            float *restrict xr = x + (t * H + h) * D;
            for (int i = 0; i < half; i++) {
                float x0 = xr[2 * i], x1 = xr[2 * i + 1];
                xr[2 * i] = x0 * cs[i] - x1 * sn[i];
                xr[2 * i + 1] = x0 * sn[i] + x1 * cs[i];
            }
        }
    }
    free(cs);
    free(fh);
}

void dt_rope_fwd_cpu(int64_t T, int H, int D, const int64_t *pos, const dt_rope_t *rope,
                     float *x)
{
    rope_apply_cpu(T, H, D, pos, rope, 1.0, x);
}

void dt_rope_bwd_cpu(int64_t T, int H, int D, const int64_t *pos, const dt_rope_t *rope,
                     float *dx)
{
    rope_apply_cpu(T, H, D, pos, rope, -1.0, dx);
}

void dt_swiglu_fwd_cpu(int64_t T, int f, const float *a, const float *b, float *h)
{
    const int64_t n = T * f;
    for (int64_t i = 0; i < n; i++) {
        float s = 1.0f / (1.0f + expf(-a[i]));
        h[i] = a[i] * s * b[i];
    }
}

void dt_swiglu_bwd_cpu(int64_t T, int f, const float *a, const float *b, const float *dh, float *da,
                       float *db)
{
    const int64_t n = T * f;
    for (int64_t i = 0; i < n; i++) {
        float ai = a[i], bi = b[i], gi = dh[i];
        float s = 1.0f / (1.0f + expf(-ai));
        float silu = ai * s;
        da[i] = gi * bi * s * (1.0f + ai * (1.0f - s));
        db[i] = gi * silu;
    }
}

double dt_xent_cpu(int64_t T, int V, const float *logits, const int32_t *targets, float *dlogits,
                   int64_t *count)
{
    const int64_t n = dt_xent_count(T, V, targets);
    const float inv = n > 0 ? (float)(1.0 / (double)n) : 0.0f;
    double loss = 0.0;

    for (int64_t t = 0; t < T; t++) {
        const float *xr = logits + t * V;
        const int32_t y = targets[t];
        if (y == DT_IGNORE) {
            if (dlogits != NULL)
                memset(dlogits + t * V, 0, (size_t)V * sizeof(float));
            continue;
        }
        float m = -INFINITY;
        for (int j = 0; j < V; j++)
            m = xr[j] > m ? xr[j] : m;
        const float xy = xr[y]; /* read before an in-place dlogits overwrites it */
        double sum = 0.0;
        if (dlogits != NULL) {
            float *dr = dlogits + t * V;
            for (int j = 0; j < V; j++) {
                dr[j] = expf(xr[j] - m);
                sum += dr[j];
            }
            const float scale = (float)(1.0 / sum) * inv;
            for (int j = 0; j < V; j++)
                dr[j] *= scale;
            dr[y] -= inv;
        } else {
            for (int j = 0; j < V; j++)
                sum += expf(xr[j] - m);
        }
        loss += (double)m + log(sum) - (double)xy;
    }
    if (count != NULL)
        *count = n;
    return n > 0 ? loss / (double)n : 0.0;
}
