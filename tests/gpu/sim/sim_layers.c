/* SPDX-License-Identifier: MIT
 *
 * Host stand-ins for the layer kernels of kernels/cuda/layers_cuda.h, for
 * the simulated-device build of dtengine (tests/gpu/dtengine-sim): the
 * same signatures and argument checks, each queued on its stream
 * (sim_enqueue) and run, when the simulator reaches it, as the CPU
 * kernels of kernels/cpu/layers_cpu.h on what the real kernel would read:
 * bf16/fp16 operands rounded to nearest even, fp32 elsewhere. The linear
 * layers stand in for cuBLASLt (fp32 accumulation of the rounded inputs).
 *
 * What it is not: a check of the CUDA kernels' arithmetic (sums in
 * another order; tests/gpu/test_layers_cuda does that on a GPU).
 */
#include "config.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/mem.h"
#include "kernels/cpu/layers_cpu.h"
#include "kernels/cuda/layers_cuda.h"
#include "tests/gpu/sim/sim_cuda.h"

/*-- casts -------------------------------------------------------------------*/

typedef struct kcast {
    dt_dtype_t dt;
    int64_t n;
    const void *x;
    void *y;
    int to_f32;
} kcast_t;

static void do_cast(void *arg)
{
    const kcast_t *k = arg;

    if (k->dt == DT_F32) {
        memmove(k->y, k->x, (size_t)k->n * sizeof(float));
        return;
    }
    for (int64_t i = 0; i < k->n; i++)
        if (k->to_f32)
            ((float *)k->y)[i] = dt_half_value(k->dt, ((const uint16_t *)k->x)[i]);
        else
            ((uint16_t *)k->y)[i] = dt_half_bits(k->dt, ((const float *)k->x)[i]);
}

static int cast(const char *fn, dt_dtype_t dt, int64_t n, const void *x, void *y, int to_f32,
                cudaStream_t st, dt_emsg_t *em)
{
    if (dt != DT_BF16 && dt != DT_F16 && dt != DT_F32)
        return dt_emsg_set(em, DT_EINVAL, "%s: dtype=%d is not bf16, fp16 or fp32", fn, (int)dt);
    if (n < 0)
        return dt_emsg_set(em, DT_EINVAL, "%s: n=%lld < 0", fn, (long long)n);
    if (n == 0)
        return 0;
    if (x == NULL || y == NULL)
        return dt_emsg_set(em, DT_EINVAL, "%s: NULL tensor with n=%lld", fn, (long long)n);
    kcast_t *k = dt_xmalloc(sizeof(*k));
    *k = (kcast_t){ dt, n, x, y, to_f32 };
    sim_enqueue(st, do_cast, k, "cast");
    return 0;
}

int dt_cast_from_f32_cuda(dt_dtype_t dtype, int64_t n, const float *x, void *y, cudaStream_t st,
                          dt_emsg_t *em)
{
    return cast("dt_cast_from_f32_cuda", dtype, n, x, y, 0, st, em);
}

int dt_cast_to_f32_cuda(dt_dtype_t dtype, int64_t n, const void *x, float *y, cudaStream_t st,
                        dt_emsg_t *em)
{
    return cast("dt_cast_to_f32_cuda", dtype, n, x, y, 1, st, em);
}

/*-- RMSNorm, RoPE, SwiGLU, the residual add ------------------------------------*/

typedef struct kelem {
    int op; /* 0 rmsnorm, 1 rope, 2 swiglu, 3 add */
    int64_t T;
    int a, b; /* rmsnorm d; rope H, D; swiglu f */
    float eps;
    dt_rope_t rope; /* by value: the kernel runs after the launcher returns */
    const float *x, *g;
    float *y, *z;
    const int64_t *pos;
} kelem_t;

static void do_elem(void *arg)
{
    const kelem_t *k = arg;

    switch (k->op) {
    case 0:
        dt_rmsnorm_fwd_cpu(k->T, k->a, k->eps, k->x, k->g, k->y, k->z);
        break;
    case 1:
        dt_rope_fwd_cpu(k->T, k->a, k->b, k->pos, &k->rope, k->y);
        break;
    case 2:
        dt_swiglu_fwd_cpu(k->T, k->a, k->x, k->g, k->y);
        break;
    default:
        for (int64_t i = 0; i < k->T; i++)
            k->y[i] += k->x[i];
    }
}

static int elem(const kelem_t *k, cudaStream_t st, const char *what)
{
    kelem_t *c = dt_xmalloc(sizeof(*c));
    *c = *k;
    sim_enqueue(st, do_elem, c, what);
    return 0;
}

int dt_rmsnorm_fwd_cuda(int64_t T, int d, float eps, const float *x, const float *g, float *y,
                        float *rstd, cudaStream_t st, dt_emsg_t *em)
{
    if (T < 0 || d < 1)
        return dt_emsg_set(em, DT_EINVAL, "dt_rmsnorm_fwd_cuda: T=%lld d=%d", (long long)T, d);
    if (T > 0 && (!x || !g || !y || !rstd))
        return dt_emsg_set(em, DT_EINVAL, "dt_rmsnorm_fwd_cuda: NULL tensor");
    kelem_t k = { .op = 0, .T = T, .a = d, .eps = eps, .x = x, .g = g, .y = y, .z = rstd };
    return T ? elem(&k, st, "rmsnorm") : 0;
}

int dt_rope_fwd_cuda(int64_t T, int H, int D, const int64_t *pos, const dt_rope_t *rope, float *x,
                     cudaStream_t st, dt_emsg_t *em)
{
    if (T < 0 || H < 1 || D < 2 || D % 2 || rope == NULL || !(rope->theta > 0))
        return dt_emsg_set(em, DT_EINVAL, "dt_rope_fwd_cuda: T=%lld H=%d D=%d theta=%g",
                           (long long)T, H, D, rope ? rope->theta : 0.0);
    if (T > 0 && (!pos || !x))
        return dt_emsg_set(em, DT_EINVAL, "dt_rope_fwd_cuda: NULL tensor");
    kelem_t k = { .op = 1, .T = T, .a = H, .b = D, .rope = *rope, .pos = pos, .y = x };
    return T ? elem(&k, st, "rope") : 0;
}

int dt_swiglu_fwd_cuda(int64_t T, int f, const float *a, const float *b, float *h,
                       cudaStream_t st, dt_emsg_t *em)
{
    if (T < 0 || f < 1)
        return dt_emsg_set(em, DT_EINVAL, "dt_swiglu_fwd_cuda: T=%lld f=%d", (long long)T, f);
    if (T > 0 && (!a || !b || !h))
        return dt_emsg_set(em, DT_EINVAL, "dt_swiglu_fwd_cuda: NULL tensor");
    kelem_t k = { .op = 2, .T = T, .a = f, .x = a, .g = b, .y = h };
    return T ? elem(&k, st, "swiglu") : 0;
}

int dt_add_f32_cuda(int64_t n, const float *x, float *y, cudaStream_t st, dt_emsg_t *em)
{
    if (n < 0)
        return dt_emsg_set(em, DT_EINVAL, "dt_add_f32_cuda: n=%lld < 0", (long long)n);
    if (n > 0 && (!x || !y))
        return dt_emsg_set(em, DT_EINVAL, "dt_add_f32_cuda: NULL tensor with n=%lld",
                           (long long)n);
    kelem_t k = { .op = 3, .T = n, .x = x, .y = y };
    return n ? elem(&k, st, "add") : 0;
}

/*-- the fused launches: the unfused sequence, on the host ----------------------*/

typedef struct kfused {
    int op; /* 0 residual + rmsnorm, 1 rope of q and k + casts, 2 swiglu */
    int64_t T;
    int a, b, c; /* rmsnorm d; rope H, Hkv, D; swiglu f */
    float eps;
    dt_rope_t rope;
    dt_dtype_t dt;
    float *x;
    const float *r, *g, *q, *k, *v;
    void *y, *qb, *kb, *vb;
    float *rstd;
    const int64_t *pos;
} kfused_t;

static void round_into(dt_dtype_t dt, const float *x, int64_t n, void *y)
{
    for (int64_t i = 0; i < n; i++)
        ((uint16_t *)y)[i] = dt_half_bits(dt, x[i]);
}

static void do_fused(void *arg)
{
    const kfused_t *k = arg;

    if (k->op == 0) {
        const int64_t n = k->T * k->a;
        float *t = dt_xmallocarray((size_t)n, sizeof(float));
        if (k->r != NULL)
            for (int64_t i = 0; i < n; i++)
                k->x[i] += k->r[i];
        dt_rmsnorm_fwd_cpu(k->T, k->a, k->eps, k->x, k->g, t, k->rstd);
        round_into(k->dt, t, n, k->y);
        free(t);
    } else if (k->op == 1) {
        const int64_t nq = k->T * k->a * k->c, nk = k->T * k->b * k->c;
        float *t = dt_xmallocarray((size_t)(nq > nk ? nq : nk), sizeof(float));
        memcpy(t, k->q, (size_t)nq * sizeof(float));
        dt_rope_fwd_cpu(k->T, k->a, k->c, k->pos, &k->rope, t);
        round_into(k->dt, t, nq, k->qb);
        memcpy(t, k->k, (size_t)nk * sizeof(float));
        dt_rope_fwd_cpu(k->T, k->b, k->c, k->pos, &k->rope, t);
        round_into(k->dt, t, nk, k->kb);
        round_into(k->dt, k->v, nk, k->vb);
        free(t);
    } else {
        const int64_t n = k->T * k->a;
        float *t = dt_xmallocarray((size_t)n, sizeof(float));
        dt_swiglu_fwd_cpu(k->T, k->a, k->q, k->k, t);
        round_into(k->dt, t, n, k->y);
        free(t);
    }
}

static int fused(const kfused_t *k, cudaStream_t st, const char *what)
{
    if (k->dt != DT_BF16 && k->dt != DT_F16) {
        fprintf(stderr, "sim: %s: dtype must be bf16 or fp16\n", what);
        abort();
    }
    kfused_t *c = dt_xmalloc(sizeof(*c));
    *c = *k;
    sim_enqueue(st, do_fused, c, what);
    return 0;
}

int dt_rmsnorm_fwd_half_cuda(int64_t T, int d, float eps, float *x, const float *res,
                             const float *g, dt_dtype_t dtype, void *y, float *rstd,
                             cudaStream_t st, dt_emsg_t *em)
{
    if (T < 0 || d < 1 || (T > 0 && (!x || !g || !y || !rstd)))
        return dt_emsg_set(em, DT_EINVAL, "dt_rmsnorm_fwd_half_cuda: T=%lld d=%d", (long long)T,
                           d);
    kfused_t k = { .op = 0, .T = T, .a = d, .eps = eps, .dt = dtype, .x = x, .r = res, .g = g,
                   .y = y, .rstd = rstd };
    return T ? fused(&k, st, "rmsnorm_half") : 0;
}

int dt_rope_qkv_half_cuda(int64_t T, int H, int Hkv, int D, const int64_t *pos,
                          const dt_rope_t *rope, const float *q, const float *k, const float *v,
                          dt_dtype_t dtype, void *qb, void *kb, void *vb, cudaStream_t st,
                          dt_emsg_t *em)
{
    if (T < 0 || H < 1 || Hkv < 1 || D < 2 || D % 2 || rope == NULL || !(rope->theta > 0))
        return dt_emsg_set(em, DT_EINVAL, "dt_rope_qkv_half_cuda: T=%lld H=%d D=%d",
                           (long long)T, H, D);
    if (T > 0 && (!pos || !q || !k || !v || !qb || !kb || !vb))
        return dt_emsg_set(em, DT_EINVAL, "dt_rope_qkv_half_cuda: NULL tensor");
    kfused_t f = { .op = 1, .T = T, .a = H, .b = Hkv, .c = D, .rope = *rope, .dt = dtype,
                   .q = q, .k = k, .v = v, .qb = qb, .kb = kb, .vb = vb, .pos = pos };
    return T ? fused(&f, st, "rope_qkv_half") : 0;
}

int dt_swiglu_fwd_half_cuda(int64_t T, int f, const float *a, const float *b, dt_dtype_t dtype,
                            void *h, cudaStream_t st, dt_emsg_t *em)
{
    if (T < 0 || f < 1 || (T > 0 && (!a || !b || !h)))
        return dt_emsg_set(em, DT_EINVAL, "dt_swiglu_fwd_half_cuda: T=%lld f=%d", (long long)T,
                           f);
    kfused_t k = { .op = 2, .T = T, .a = f, .dt = dtype, .q = a, .k = b, .y = h };
    return T ? fused(&k, st, "swiglu_half") : 0;
}

/*-- linear layers: y = x W^T ------------------------------------------------*/

struct dt_blas {
    int unused;
};

int dt_blas_new(dt_blas_t **out, dt_emsg_t *em)
{
    (void)em;
    *out = dt_xcalloc(1, sizeof(**out));
    return 0;
}

void dt_blas_free(dt_blas_t *b)
{
    free(b);
}

typedef struct klin {
    dt_dtype_t dt, ydt;
    int64_t T;
    int din, dout;
    const void *x, *w;
    void *y;
} klin_t;

/* n values of dtype at p, as fp32 (a new buffer). */
static float *widen(dt_dtype_t dt, const void *p, int64_t n)
{
    float *f = dt_xmallocarray((size_t)(n ? n : 1), sizeof(float));
    for (int64_t i = 0; i < n; i++)
        f[i] = dt_half_value(dt, ((const uint16_t *)p)[i]);
    return f;
}

static void do_linear(void *arg)
{
    const klin_t *k = arg;
    float *x = widen(k->dt, k->x, k->T * k->din), *w = widen(k->dt, k->w, (int64_t)k->dout * k->din);
    float *y = k->ydt == DT_F32 ? k->y : dt_xmallocarray((size_t)(k->T * k->dout), sizeof(float));

    dt_linear_fwd_cpu(k->T, k->din, k->dout, x, w, y);
    if (k->ydt != DT_F32) {
        for (int64_t i = 0; i < k->T * k->dout; i++)
            ((uint16_t *)k->y)[i] = dt_half_bits(k->ydt, y[i]);
        free(y);
    }
    free(x);
    free(w);
}

int dt_linear_fwd_cuda(dt_blas_t *b, dt_dtype_t dtype, int64_t T, int din, int dout, const void *x,
                       const void *w, dt_dtype_t ydtype, void *y, cudaStream_t st, dt_emsg_t *em)
{
    const char *fn = "dt_linear_fwd_cuda";

    if (b == NULL)
        return dt_emsg_set(em, DT_EINVAL, "%s: no cuBLASLt handle", fn);
    if (dtype != DT_BF16 && dtype != DT_F16)
        return dt_emsg_set(em, DT_EINVAL, "%s: inputs must be bf16 or fp16", fn);
    if (ydtype != DT_F32 && ydtype != dtype)
        return dt_emsg_set(em, DT_EINVAL, "%s: output fp32 or the input dtype", fn);
    if (T < 0 || din < 1 || dout < 1)
        return dt_emsg_set(em, DT_EINVAL, "%s: T=%lld din=%d dout=%d", fn, (long long)T, din,
                           dout);
    if (T == 0)
        return 0;
    if (!x || !w || !y)
        return dt_emsg_set(em, DT_EINVAL, "%s: NULL tensor", fn);
    klin_t *k = dt_xmalloc(sizeof(*k));
    *k = (klin_t){ dtype, ydtype, T, din, dout, x, w, y };
    sim_enqueue(st, do_linear, k, "linear");
    return 0;
}

/*-- the backward of the layers ----------------------------------------------------*/

typedef struct kbwd {
    int op; /* 0 rmsnorm, 1 rope, 2 swiglu */
    int64_t T;
    int a, b;
    dt_rope_t rope; /* by value: the kernel runs after the launcher returns */
    const float *x, *g, *r, *dy;
    float *dx, *dg, *db;
    const int64_t *pos;
} kbwd_t;

static void do_bwd(void *arg)
{
    const kbwd_t *k = arg;

    switch (k->op) {
    case 0:
        dt_rmsnorm_bwd_cpu(k->T, k->a, k->x, k->g, k->r, k->dy, k->dx, k->dg);
        break;
    case 1:
        dt_rope_bwd_cpu(k->T, k->a, k->b, k->pos, &k->rope, k->dx);
        break;
    default:
        dt_swiglu_bwd_cpu(k->T, k->a, k->x, k->g, k->dy, k->dx, k->db);
    }
}

static int bwd(const kbwd_t *k, cudaStream_t st, const char *what)
{
    kbwd_t *c = dt_xmalloc(sizeof(*c));
    *c = *k;
    sim_enqueue(st, do_bwd, c, what);
    return 0;
}

int dt_rmsnorm_bwd_cuda(int64_t T, int d, const float *x, const float *g, const float *rstd,
                        const float *dy, float *dx, float *dg, cudaStream_t st, dt_emsg_t *em)
{
    if (T < 0 || d < 1)
        return dt_emsg_set(em, DT_EINVAL, "dt_rmsnorm_bwd_cuda: T=%lld d=%d", (long long)T, d);
    if (T > 0 && (!x || !g || !rstd || !dy || !dx))
        return dt_emsg_set(em, DT_EINVAL, "dt_rmsnorm_bwd_cuda: NULL tensor");
    kbwd_t k = { .op = 0, .T = T, .a = d, .x = x, .g = g, .r = rstd, .dy = dy, .dx = dx,
                 .dg = dg };
    return T ? bwd(&k, st, "rmsnorm_bwd") : 0;
}

int dt_rope_bwd_cuda(int64_t T, int H, int D, const int64_t *pos, const dt_rope_t *rope, float *dx,
                     cudaStream_t st, dt_emsg_t *em)
{
    if (T < 0 || H < 1 || D < 2 || D % 2 || rope == NULL || !(rope->theta > 0))
        return dt_emsg_set(em, DT_EINVAL, "dt_rope_bwd_cuda: T=%lld H=%d D=%d theta=%g",
                           (long long)T, H, D, rope ? rope->theta : 0.0);
    if (T > 0 && (!pos || !dx))
        return dt_emsg_set(em, DT_EINVAL, "dt_rope_bwd_cuda: NULL tensor");
    kbwd_t k = { .op = 1, .T = T, .a = H, .b = D, .rope = *rope, .pos = pos, .dx = dx };
    return T ? bwd(&k, st, "rope_bwd") : 0;
}

int dt_swiglu_bwd_cuda(int64_t T, int f, const float *a, const float *b, const float *dh,
                       float *da, float *db, cudaStream_t st, dt_emsg_t *em)
{
    if (T < 0 || f < 1)
        return dt_emsg_set(em, DT_EINVAL, "dt_swiglu_bwd_cuda: T=%lld f=%d", (long long)T, f);
    if (T > 0 && (!a || !b || !dh || !da || !db))
        return dt_emsg_set(em, DT_EINVAL, "dt_swiglu_bwd_cuda: NULL tensor");
    kbwd_t k = { .op = 2, .T = T, .a = f, .x = a, .g = b, .dy = dh, .dx = da, .db = db };
    return T ? bwd(&k, st, "swiglu_bwd") : 0;
}

typedef struct klinb {
    dt_dtype_t dt;
    int64_t T;
    int din, dout;
    const void *x, *w, *dy;
    float *dx, *dw;
} klinb_t;

static void do_linear_bwd(void *arg)
{
    const klinb_t *k = arg;
    float *x = widen(k->dt, k->x, k->T * k->din), *w = widen(k->dt, k->w, (int64_t)k->dout * k->din);
    float *dy = widen(k->dt, k->dy, k->T * k->dout);

    dt_linear_bwd_cpu(k->T, k->din, k->dout, x, w, dy, k->dx, k->dw);
    free(x);
    free(w);
    free(dy);
}

int dt_linear_bwd_cuda(dt_blas_t *b, dt_dtype_t dtype, int64_t T, int din, int dout,
                       const void *x, const void *w, const void *dy, float *dx, float *dw,
                       cudaStream_t st, dt_emsg_t *em)
{
    const char *fn = "dt_linear_bwd_cuda";

    if (b == NULL)
        return dt_emsg_set(em, DT_EINVAL, "%s: no cuBLASLt handle", fn);
    if (dtype != DT_BF16 && dtype != DT_F16)
        return dt_emsg_set(em, DT_EINVAL, "%s: inputs must be bf16 or fp16", fn);
    if (T < 0 || din < 1 || dout < 1)
        return dt_emsg_set(em, DT_EINVAL, "%s: T=%lld din=%d dout=%d", fn, (long long)T, din,
                           dout);
    if (T == 0)
        return 0;
    if (!x || !w || !dy)
        return dt_emsg_set(em, DT_EINVAL, "%s: NULL tensor", fn);
    klinb_t *k = dt_xmalloc(sizeof(*k));
    *k = (klinb_t){ dtype, T, din, dout, x, w, dy, dx, dw };
    sim_enqueue(st, do_linear_bwd, k, "linear_bwd");
    return 0;
}
