/* SPDX-License-Identifier: MIT
 *
 * Host stand-ins for the training kernels of kernels/cuda/train_cuda.h, for
 * the simulated-device build of dtengine (tests/gpu/dtengine-sim): the
 * same signatures and argument checks, each queued on its stream
 * (sim_enqueue) and run when the simulator reaches it. The embedding and
 * the loss are the CPU kernels of kernels/cpu/layers_cpu.h row by row (the
 * loss with the GPU's contract: a scale instead of 1 / count, per-row
 * losses and argmaxes); the squared norm and AdamW repeat the device's
 * arithmetic: the same partition into DT_SUMSQ_PARTS sums (each summed here
 * in order, on the device by a tree) and AdamW's per-element double
 * formula, which is optim.c's.
 *
 * What it is not: a check of the CUDA kernels' arithmetic (the GPU's own
 * tests do that, tests/gpu/device.sh); it checks the engine that calls them.
 */
#include "config.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "common/mem.h"
#include "engine/model/optim.h" /* dt_sumsq_parts */
#include "kernels/cpu/layers_cpu.h"
#include "kernels/cuda/train_cuda.h"
#include "tests/gpu/sim/sim_cuda.h"

typedef struct ktrain {
    int op; /* 0 embed fwd, 1 embed bwd, 2 xent, 3 sumsq, 4 adamw */
    int64_t n;
    int d;
    const int32_t *tok, *rows, *y;
    const int64_t *start;
    const float *src;
    float *dst, *m, *v;
    float scale;
    double *loss;
    int32_t *amax;
    dt_adamw_k_t k;
} ktrain_t;

static void do_xent(const ktrain_t *k)
{
    const int V = k->d;

    for (int64_t t = 0; t < k->n; t++) {
        float *x = k->dst + t * V;
        int best = 0;
        for (int j = 1; j < V; j++)
            best = x[j] > x[best] ? j : best;
        if (k->amax)
            k->amax[t] = best;
        if (k->y[t] < 0) {
            memset(x, 0, (size_t)V * sizeof(float));
            k->loss[t] = 0.0;
            continue;
        }
        /* one row through the CPU loss: (softmax - onehot) / 1, times scale */
        k->loss[t] = dt_xent_cpu(1, V, x, k->y + t, x, NULL);
        for (int j = 0; j < V; j++)
            x[j] *= k->scale;
    }
}

static void do_train(void *arg)
{
    const ktrain_t *k = arg;

    switch (k->op) {
    case 0:
        for (int64_t t = 0; t < k->n; t++)
            memcpy(k->dst + t * k->d, k->src + (int64_t)k->tok[t] * k->d,
                   (size_t)k->d * sizeof(float));
        break;
    case 1:
        for (int64_t u = 0; u < k->n; u++)
            for (int j = 0; j < k->d; j++) {
                float s = 0.0f;
                for (int64_t r = k->start[u]; r < k->start[u + 1]; r++)
                    s += k->src[(int64_t)k->rows[r] * k->d + j];
                k->dst[(int64_t)k->tok[u] * k->d + j] += s;
            }
        break;
    case 2:
        do_xent(k);
        break;
    case 3: /* the kernel's order (kernels/adamw.h), as the host's */
        dt_sumsq_parts(k->n, k->src, k->loss);
        break;
    default:
        for (int64_t i = 0; i < k->n; i++)
            dt_adamw_elem(&k->k, k->src[i] * k->scale, &k->dst[i], &k->m[i], &k->v[i]);
    }
}

static int queue(const ktrain_t *k, cudaStream_t st, const char *what)
{
    ktrain_t *c = dt_xmalloc(sizeof(*c));
    *c = *k;
    sim_enqueue(st, do_train, c, what);
    return 0;
}

int dt_embed_fwd_cuda(int64_t T, int d, const int32_t *tok, const float *table, float *out,
                      cudaStream_t st, dt_emsg_t *em)
{
    if (T < 0 || d <= 0)
        return dt_emsg_set(em, DT_EINVAL, "dt_embed_fwd_cuda: T=%lld d=%d", (long long)T, d);
    if (T > 0 && (!tok || !table || !out))
        return dt_emsg_set(em, DT_EINVAL, "dt_embed_fwd_cuda: NULL tensor");
    ktrain_t k = { .op = 0, .n = T, .d = d, .tok = tok, .src = table, .dst = out };
    return T ? queue(&k, st, "embed_fwd") : 0;
}

int dt_embed_bwd_cuda(int64_t nu, int d, const int32_t *tok, const int64_t *start,
                      const int32_t *rows, const float *dout, float *dtable, cudaStream_t st,
                      dt_emsg_t *em)
{
    if (nu < 0 || d <= 0)
        return dt_emsg_set(em, DT_EINVAL, "dt_embed_bwd_cuda: nu=%lld d=%d", (long long)nu, d);
    if (nu > 0 && (!tok || !start || !rows || !dout || !dtable))
        return dt_emsg_set(em, DT_EINVAL, "dt_embed_bwd_cuda: NULL tensor");
    ktrain_t k = { .op = 1, .n = nu, .d = d, .tok = tok, .start = start, .rows = rows,
                   .src = dout, .dst = dtable };
    return nu ? queue(&k, st, "embed_bwd") : 0;
}

int dt_xent_cuda(int64_t n, int V, float *logits, const int32_t *y, float scale, double *loss,
                 int32_t *amax, cudaStream_t st, dt_emsg_t *em)
{
    if (n < 0 || V <= 0)
        return dt_emsg_set(em, DT_EINVAL, "dt_xent_cuda: n=%lld V=%d", (long long)n, V);
    if (n > 0 && (!logits || !y || !loss))
        return dt_emsg_set(em, DT_EINVAL, "dt_xent_cuda: NULL tensor");
    ktrain_t k = { .op = 2, .n = n, .d = V, .dst = logits, .y = y, .scale = scale, .loss = loss,
                   .amax = amax };
    return n ? queue(&k, st, "xent") : 0;
}

int dt_sumsq_cuda(int64_t n, const float *g, double *part, cudaStream_t st, dt_emsg_t *em)
{
    if (n < 0 || !part || (n > 0 && !g))
        return dt_emsg_set(em, DT_EINVAL, "dt_sumsq_cuda: n=%lld or a NULL tensor",
                           (long long)n);
    ktrain_t k = { .op = 3, .n = n, .src = g, .loss = part };
    return queue(&k, st, "sumsq");
}

int dt_adamw_cuda(int64_t n, float *p, const float *g, float *m, float *v, float gscale,
                  const dt_adamw_k_t *ak, cudaStream_t st, dt_emsg_t *em)
{
    if (n < 0 || (n > 0 && (!p || !g || !m || !v)))
        return dt_emsg_set(em, DT_EINVAL, "dt_adamw_cuda: n=%lld or a NULL tensor",
                           (long long)n);
    ktrain_t k = { .op = 4, .n = n, .dst = p, .src = g, .m = m, .v = v, .scale = gscale,
                   .k = *ak };
    return n ? queue(&k, st, "adamw") : 0;
}
