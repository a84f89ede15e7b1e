/* SPDX-License-Identifier: MIT
 *
 * LLaMA-3 layer ops on the CPU, the references (see layers_cpu.h for the
 * contracts): the plain loops the fast paths in layers_cpu.c and the CUDA
 * kernels are tested against, and the RoPE angle every path shares. The
 * references use double accumulators and the most direct loop that states
 * the formula; they are not meant to be fast. No BLAS here, so the GPU
 * tests link this file alone and run on a bare GPU node.
 */
#include "config.h"

#include <assert.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "common/mem.h"
#include "kernels/cpu/layers_cpu.h"

/*-- RoPE angle (shared by both paths) --------------------------------------*/

/* 2 pi = C1 + C2 + C3 (each the double nearest the remainder). C1 has its
 * last set bit at 2^-50, so k * C1 - hi is exact in an fma for |hi| >= 4. */
#define TWO_PI_C1 0x1.921fb54442d18p+2
#define TWO_PI_C2 0x1.1a62633145c07p-52
#define TWO_PI_C3 -0x1.f1976b7ed8fbcp-108
#define INV_TWO_PI 0x1.45f306dc9c883p-3

/* theta^(-2i/D), scaled as LLaMA 3.1 does when rope->factor > 0, as a
 * double-double fh + fl (fl = 0 where long double is double). The scaling
 * follows Meta's apply_scaling (and transformers' llama3 rope init): by
 * wavelength 2 pi / f against original_max_pos / high_freq_factor (shorter:
 * kept) and original_max_pos / low_freq_factor (longer: divided by factor),
 * linearly in original_max_pos / wavelength between the two. */
void dt_rope_freq(int i, int D, const dt_rope_t *rope, double *fh, double *fl)
{
    long double f = powl((long double)rope->theta, -(long double)(2 * i) / (long double)D);

    if (rope->factor > 0) {
        const long double two_pi = 6.283185307179586476925286766559L;
        long double wl = two_pi / f, orig = rope->original_max_pos;
        long double lo = rope->low_freq_factor, hi = rope->high_freq_factor;

        if (wl > orig / lo) {
            f /= rope->factor;
        } else if (!(wl < orig / hi)) {
            long double s = (orig / wl - lo) / (hi - lo);
            f = (1 - s) * f / rope->factor + s * f;
        }
    }
    *fh = (double)f;
    *fl = (double)(f - (long double)*fh);
}

/* pos * (fh + fl) reduced modulo 2 pi; see layers_cpu.h for the error. */
double dt_rope_reduce(int64_t pos, double fh, double fl)
{
    double p = (double)pos; /* exact below 2^53 */
    double hi = p * fh;
    double lo = fma(p, fh, -hi) + p * fl; /* p * f = hi + lo to ~1e-32 relative */
    double k = nearbyint(hi * INV_TWO_PI);
    double r = fma(-k, TWO_PI_C1, hi); /* exact */
    r = fma(-k, TWO_PI_C2, r);
    r = fma(-k, TWO_PI_C3, r);
    return r + lo;
}

double dt_rope_angle(int64_t pos, int i, int D, const dt_rope_t *rope)
{
    double fh, fl;

    dt_rope_freq(i, D, rope, &fh, &fl);
    return dt_rope_reduce(pos, fh, fl);
}

/* The targets that count (not DT_IGNORE); both paths divide by it. */
int64_t dt_xent_count(int64_t T, int V, const int32_t *targets)
{
    int64_t n = 0;
    for (int64_t t = 0; t < T; t++) {
        assert(targets[t] == DT_IGNORE || (targets[t] >= 0 && targets[t] < V));
        n += targets[t] != DT_IGNORE;
    }
    return n;
}

/*-- references -------------------------------------------------------------*/

void dt_linear_fwd_ref(int64_t T, int din, int dout, const float *x, const float *w, float *y)
{
    for (int64_t t = 0; t < T; t++)
        for (int o = 0; o < dout; o++) {
            double s = 0.0;
            for (int k = 0; k < din; k++)
                s += (double)x[t * din + k] * w[(int64_t)o * din + k];
            y[t * dout + o] = (float)s;
        }
}

void dt_linear_bwd_ref(int64_t T, int din, int dout, const float *x, const float *w,
                       const float *dy, float *dx, float *dw)
{
    if (dx != NULL)
        for (int64_t t = 0; t < T; t++)
            for (int k = 0; k < din; k++) {
                double s = 0.0;
                for (int o = 0; o < dout; o++)
                    s += (double)dy[t * dout + o] * w[(int64_t)o * din + k];
                dx[t * din + k] = (float)s;
            }
    if (dw != NULL)
        for (int o = 0; o < dout; o++)
            for (int k = 0; k < din; k++) {
                double s = 0.0;
                for (int64_t t = 0; t < T; t++)
                    s += (double)dy[t * dout + o] * x[t * din + k];
                dw[(int64_t)o * din + k] = (float)(dw[(int64_t)o * din + k] + s);
            }
}

void dt_embed_fwd_ref(int64_t T, int V, int d, const int32_t *tok, const float *table, float *out)
{
    for (int64_t t = 0; t < T; t++) {
        assert(tok[t] >= 0 && tok[t] < V);
        for (int j = 0; j < d; j++)
            out[t * d + j] = table[(int64_t)tok[t] * d + j];
    }
}

void dt_embed_bwd_ref(int64_t T, int V, int d, const int32_t *tok, const float *dout, float *dtable)
{
    for (int64_t t = 0; t < T; t++) {
        assert(tok[t] >= 0 && tok[t] < V);
        for (int j = 0; j < d; j++)
            dtable[(int64_t)tok[t] * d + j] += dout[t * d + j];
    }
}

void dt_rmsnorm_fwd_ref(int64_t T, int d, float eps, const float *x, const float *g, float *y,
                        float *rstd)
{
    for (int64_t t = 0; t < T; t++) {
        double ss = 0.0;
        for (int j = 0; j < d; j++)
            ss += (double)x[t * d + j] * x[t * d + j];
        double r = 1.0 / sqrt(ss / d + (double)eps);
        rstd[t] = (float)r;
        for (int j = 0; j < d; j++)
            y[t * d + j] = (float)(x[t * d + j] * r * g[j]);
    }
}

void dt_rmsnorm_bwd_ref(int64_t T, int d, const float *x, const float *g, const float *rstd,
                        const float *dy, float *dx, float *dg)
{
    for (int64_t t = 0; t < T; t++) {
        const double r = rstd[t];
        double s = 0.0;
        for (int j = 0; j < d; j++)
            s += (double)dy[t * d + j] * g[j] * x[t * d + j];
        for (int j = 0; j < d; j++) {
            double xj = x[t * d + j], dyj = dy[t * d + j];
            if (dg != NULL)
                dg[j] = (float)(dg[j] + dyj * xj * r);
            dx[t * d + j] = (float)(r * g[j] * dyj - xj * r * r * r * s / d);
        }
    }
}

static void rope_apply_ref(int64_t T, int H, int D, const int64_t *pos, const dt_rope_t *rope,
                           double sign, float *x)
{
    assert(D % 2 == 0);
    for (int64_t t = 0; t < T; t++)
        for (int h = 0; h < H; h++)
            for (int i = 0; i < D / 2; i++) {
                double a = sign * dt_rope_angle(pos[t], i, D, rope);
                float *p = x + (t * H + h) * D + 2 * i;
                double x0 = p[0], x1 = p[1];
                p[0] = (float)(x0 * cos(a) - x1 * sin(a));
                p[1] = (float)(x0 * sin(a) + x1 * cos(a));
            }
}

void dt_rope_fwd_ref(int64_t T, int H, int D, const int64_t *pos, const dt_rope_t *rope,
                     float *x)
{
    rope_apply_ref(T, H, D, pos, rope, 1.0, x);
}

void dt_rope_bwd_ref(int64_t T, int H, int D, const int64_t *pos, const dt_rope_t *rope,
                     float *dx)
{
    rope_apply_ref(T, H, D, pos, rope, -1.0, dx);
}

static double sigmoid(double a)
{
    return 1.0 / (1.0 + exp(-a));
}

void dt_swiglu_fwd_ref(int64_t T, int f, const float *a, const float *b, float *h)
{
    for (int64_t t = 0; t < T; t++)
        for (int j = 0; j < f; j++) {
            int64_t i = t * f + j;
            double ai = a[i];
            h[i] = (float)(ai * sigmoid(ai) * b[i]);
        }
}

void dt_swiglu_bwd_ref(int64_t T, int f, const float *a, const float *b, const float *dh, float *da,
                       float *db)
{
    for (int64_t t = 0; t < T; t++)
        for (int j = 0; j < f; j++) {
            int64_t i = t * f + j;
            double ai = a[i], bi = b[i], gi = dh[i];
            double s = sigmoid(ai);
            da[i] = (float)(gi * bi * (s + ai * s * (1.0 - s)));
            db[i] = (float)(gi * ai * s);
        }
}

double dt_xent_ref(int64_t T, int V, const float *logits, const int32_t *targets, float *dlogits,
                   int64_t *count)
{
    const int64_t n = dt_xent_count(T, V, targets);
    double loss = 0.0;

    for (int64_t t = 0; t < T; t++) {
        const int32_t y = targets[t];
        double m = -INFINITY, sum = 0.0;
        if (y != DT_IGNORE) {
            for (int j = 0; j < V; j++)
                m = fmax(m, logits[t * V + j]);
            for (int j = 0; j < V; j++)
                sum += exp((double)logits[t * V + j] - m);
            loss += m + log(sum) - (double)logits[t * V + y];
        }
        if (dlogits == NULL)
            continue;
        for (int j = 0; j < V; j++) { /* element j is read before it is written */
            double g = 0.0;
            if (y != DT_IGNORE)
                g = (exp((double)logits[t * V + j] - m) / sum - (j == y)) / (double)n;
            dlogits[t * V + j] = (float)g;
        }
    }
    if (count != NULL)
        *count = n;
    return n > 0 ? loss / (double)n : 0.0;
}
