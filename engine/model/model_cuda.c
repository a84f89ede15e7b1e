/* SPDX-License-Identifier: MIT
 *
 * The GPU model's shell and its forward (engine/model/model_cuda.h): the
 * checks, streams and cuBLASLt handle both kinds of model share, the
 * forward-only model's weights and activations, the layer forward and the
 * LM head of `dtengine prefill --device cuda`, the copies to the host that
 * overlap compute, page-locked host memory, and dt_gmodel_free for both
 * kinds. One stream runs the layer kernels; before the attention it is
 * synchronised, since the ring runs on its own streams and returns when o
 * and lse are complete. CUDA errors are translated by the launchers and
 * DT_CUDA_*.
 *
 * Not here: training (dt_gtrain_*, engine/model/train_cuda.c, which builds
 * on the helpers of engine/model/model_cuda_impl.h defined here; this file
 * never calls it: the training state is released through the hook it
 * sets).
 */
#include "config.h"

#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <cuda_runtime_api.h>

#include "common/mem.h"
#include "engine/model/model_cuda_impl.h"
#include "kernels/cuda/cuda_err.h"
#include "kernels/cuda/layers_cuda.h"

/* Allocate n bytes on the device into *p. */
int dt_gmodel_dalloc(void *p, size_t n, dt_emsg_t *em)
{
    DT_CUDA_TRY(em, cudaMalloc((void **)p, n ? n : 1));
    return 0;
}

int dt_gmodel_dalloc_all(const dbuf_t *b, size_t nb, dt_emsg_t *em)
{
    int rc;

    for (size_t i = 0; i < nb; i++)
        if ((rc = dt_gmodel_dalloc(b[i].p, b[i].n, em)) < 0)
            return rc;
    return 0;
}

/* A model's shell: the checks both kinds make, its stream (a blocking
 * one: its kernels wait for the synchronous copies, as cudaMemcpy from
 * pageable memory returns before its DMA lands) and its cuBLASLt handle
 * (contract in engine/model/model_cuda_impl.h). */
int dt_gmodel_begin(const dt_model_cfg_t *cfg, int64_t c, dt_dtype_t dtype, dt_ring_t *ring,
                    dt_gmodel_t **out, dt_emsg_t *em)
{
    dt_gmodel_t *g;
    int rc;

    *out = NULL;
    if (dtype != DT_BF16 && dtype != DT_F16)
        return dt_emsg_set(em, DT_EINVAL, "the GPU model computes in bf16 or fp16");
    if (dt_ring_nlocal(ring) != 1)
        return dt_emsg_set(em, DT_EINVAL, "the GPU model needs one rank per process");
    g = dt_xcalloc(1, sizeof(*g));
    g->cfg = *cfg;
    g->c = c;
    g->dt = dtype;
    g->ring = ring;
    DT_CUDA_GOTO(em, rc, fail, cudaStreamCreateWithFlags(&g->st, cudaStreamDefault));
    DT_CUDA_GOTO(em, rc, fail, cudaStreamCreateWithFlags(&g->cst, cudaStreamNonBlocking));
    DT_CUDA_GOTO(em, rc, fail, cudaEventCreateWithFlags(&g->ev_mark, cudaEventDisableTiming));
    DT_CUDA_GOTO(em, rc, fail, cudaEventCreateWithFlags(&g->ev_copy, cudaEventDisableTiming));
    DT_CUDA_GOTO(em, rc, fail, cudaEventCreateWithFlags(&g->ev_ring, cudaEventDisableTiming));
    if ((rc = dt_blas_new(&g->blas, em)) < 0)
        goto fail;
    *out = g;
    return 0;
fail:
    dt_gmodel_free(g);
    return rc;
}

/* n fp32 from the host, rounded to dtype on the device, at *dst. */
static int upload_w(dt_gmodel_t *g, const float *x, int64_t n, void **dst, float *stage,
                    dt_emsg_t *em)
{
    int rc;

    if ((rc = dt_gmodel_dalloc(dst, (size_t)n * 2, em)) < 0)
        return rc;
    DT_CUDA_TRY(em, cudaMemcpyAsync(stage, x, (size_t)n * sizeof(float), cudaMemcpyHostToDevice,
                                    g->st));
    if ((rc = dt_cast_from_f32_cuda(g->dt, n, stage, *dst, g->st, em)) < 0)
        return rc;
    DT_CUDA_TRY(em, cudaStreamSynchronize(g->st));
    return 0;
}

/* n fp32 from the host at *dst. */
static int upload_f32(const float *x, int64_t n, float **dst, dt_emsg_t *em)
{
    int rc;

    if ((rc = dt_gmodel_dalloc(dst, (size_t)n * sizeof(float), em)) < 0)
        return rc;
    DT_CUDA_TRY(em, cudaMemcpy(*dst, x, (size_t)n * sizeof(float), cudaMemcpyHostToDevice));
    return 0;
}

/* The weights: every matrix through one fp32 staging buffer. */
static int upload(dt_gmodel_t *g, const dt_model_layout_t *lo, const float *P, dt_emsg_t *em)
{
    const dt_model_cfg_t *cf = &g->cfg;
    const int64_t d = cf->dim, D = dt_model_head_dim(cf), qd = cf->heads * D,
                  kd = cf->kv_heads * D, f = cf->ffn, V = cf->vocab;
    float *stage = NULL;
    int rc;

    if ((rc = dt_gmodel_dalloc(&stage, (size_t)max3(V * d, f * d, qd * d) * sizeof(float),
                               em)) < 0)
        return rc;
    g->layer = dt_xcalloc((size_t)cf->layers, sizeof(*g->layer));
    for (int l = 0; l < cf->layers && rc == 0; l++) {
        const dt_model_layer_off_t *L = &lo->layer[l];
        glayer_t *G = &g->layer[l];
        if ((rc = upload_f32(P + L->attn_norm, d, &G->attn_norm, em)) < 0 ||
            (rc = upload_f32(P + L->mlp_norm, d, &G->mlp_norm, em)) < 0 ||
            (rc = upload_w(g, P + L->wq, qd * d, &G->wq, stage, em)) < 0 ||
            (rc = upload_w(g, P + L->wk, kd * d, &G->wk, stage, em)) < 0 ||
            (rc = upload_w(g, P + L->wv, kd * d, &G->wv, stage, em)) < 0 ||
            (rc = upload_w(g, P + L->wo, d * qd, &G->wo, stage, em)) < 0 ||
            (rc = upload_w(g, P + L->w1, f * d, &G->w1, stage, em)) < 0 ||
            (rc = upload_w(g, P + L->w3, f * d, &G->w3, stage, em)) < 0)
            break;
        rc = upload_w(g, P + L->w2, d * f, &G->w2, stage, em);
    }
    if (rc == 0 && (rc = upload_f32(P + lo->final_norm, d, &g->final_norm, em)) == 0)
        rc = upload_w(g, P + lo->lm_head, V * d, &g->lm_head, stage, em);
    cudaFree(stage);
    return rc;
}
int dt_gmodel_new(const dt_model_cfg_t *cfg, const dt_model_layout_t *lo, int64_t c,
                  dt_dtype_t dtype, dt_ring_t *ring, const float *P, const int64_t *pos,
                  dt_gmodel_t **out, dt_emsg_t *em)
{
    const int64_t d = cfg->dim, D = dt_model_head_dim(cfg), qd = cfg->heads * D,
                  kd = cfg->kv_heads * D, f = cfg->ffn, V = cfg->vocab;
    const size_t F = sizeof(float), half = 2;
    dt_gmodel_t *g;
    int rc;

    if ((rc = dt_gmodel_begin(cfg, c, dtype, ring, &g, em)) < 0)
        return rc;
    *out = NULL;
    if ((rc = upload(g, lo, P, em)) < 0)
        goto fail;
    if ((rc = dt_gmodel_dalloc(&g->pos, (size_t)c * sizeof(int64_t), em)) < 0)
        goto fail;
    DT_CUDA_GOTO(em, rc, fail,
                 cudaMemcpy(g->pos, pos, (size_t)c * sizeof(int64_t), cudaMemcpyHostToDevice));
    const int64_t wide = max3(d, qd, f);
    const dbuf_t bufs[] = {
        { &g->x, (size_t)(c * d) * F },   { &g->h, (size_t)(c * d) * F },
        { &g->rstd, (size_t)c * F },      { &g->q, (size_t)(c * qd) * F },
        { &g->k, (size_t)(c * kd) * F },  { &g->v, (size_t)(c * kd) * F },
        { &g->o, (size_t)(c * qd) * F },  { &g->lse, (size_t)(c * cfg->heads) * F },
        { &g->t, (size_t)(c * d) * F },   { &g->a, (size_t)(c * f) * F },
        { &g->b, (size_t)(c * f) * F },   { &g->g, (size_t)(c * f) * F },
        { &g->hb, (size_t)(c * wide) * half }, { &g->qb, (size_t)(c * qd) * half },
        { &g->kb, (size_t)(c * kd) * half }, { &g->vb, (size_t)(c * kd) * half },
        { &g->logits, (size_t)(HEAD_ROWS * V) * F },
    };
    if ((rc = dt_gmodel_dalloc_all(bufs, sizeof(bufs) / sizeof(bufs[0]), em)) < 0)
        goto fail;
    *out = g;
    return 0;
fail:
    dt_gmodel_free(g);
    return rc;
}

void dt_gmodel_free(dt_gmodel_t *g)
{
    if (g == NULL)
        return;
    if (g->st)
        (void)cudaStreamSynchronize(g->st);
    if (g->cst)
        (void)cudaStreamSynchronize(g->cst);
    if (g->tr) {
        /* the layers' pointers are into the training state's arrays,
         * which its own release (train_cuda.c, through the hook) frees */
        g->tr_free(g);
        free(g->layer);
        g->layer = NULL;
        g->final_norm = NULL;
        g->lm_head = NULL;
    }
    for (int l = 0; g->layer && l < g->cfg.layers; l++) {
        glayer_t *G = &g->layer[l];
        void *ps[] = { G->attn_norm, G->mlp_norm, G->wq, G->wk, G->wv, G->wo, G->w1, G->w3, G->w2 };
        for (size_t i = 0; i < sizeof(ps) / sizeof(ps[0]); i++)
            cudaFree(ps[i]);
    }
    void *ps[] = { g->final_norm, g->lm_head, g->pos, g->x, g->h, g->rstd, g->q, g->k, g->v,
                   g->o, g->lse, g->t, g->a, g->b, g->g, g->hb, g->qb, g->kb, g->vb, g->logits };
    for (size_t i = 0; i < sizeof(ps) / sizeof(ps[0]); i++)
        cudaFree(ps[i]);
    free(g->layer);
    dt_blas_free(g->blas);
    if (g->st)
        cudaStreamDestroy(g->st);
    if (g->cst)
        cudaStreamDestroy(g->cst);
    if (g->ev_mark)
        cudaEventDestroy(g->ev_mark);
    if (g->ev_copy)
        cudaEventDestroy(g->ev_copy);
    if (g->ev_ring)
        cudaEventDestroy(g->ev_ring);
    free(g);
}

int dt_gmodel_put_hidden(dt_gmodel_t *g, const float *hidden, dt_emsg_t *em)
{
    DT_CUDA_TRY(em, cudaMemcpyAsync(g->x, hidden, (size_t)(g->c * g->cfg.dim) * sizeof(float),
                                    cudaMemcpyHostToDevice, g->st));
    DT_CUDA_TRY(em, cudaStreamSynchronize(g->st));
    return 0;
}

/* y (rows, dout) fp32 = round(x) W^T for x (rows, din) fp32: the cast into
 * hb, then the product. */
static int linear(dt_gmodel_t *g, int64_t rows, int din, int dout, const float *x,
                  const void *w, float *y, dt_emsg_t *em)
{
    int rc = dt_cast_from_f32_cuda(g->dt, rows * din, x, g->hb, g->st, em);

    return rc < 0 ? rc
                  : dt_linear_fwd_cuda(g->blas, g->dt, rows, din, dout, g->hb, w, DT_F32, y,
                                       g->st, em);
}

int dt_gmodel_layer_fwd(dt_gmodel_t *g, const dt_attn_spec_t *attn, int l, dt_emsg_t *em)
{
    const dt_model_cfg_t *cf = &g->cfg;
    const int64_t c = g->c, d = cf->dim, D = dt_model_head_dim(cf), H = cf->heads,
                  Hkv = cf->kv_heads, qd = H * D, kd = Hkv * D, f = cf->ffn;
    const glayer_t *L;
    int rc;

    if (l < 0 || l >= cf->layers)
        return dt_emsg_set(em, DT_ERANGE, "layer %d: the model has layers 0 to %d", l,
                           cf->layers - 1);
    if (attn->H != H || attn->Hkv != Hkv || attn->D != D)
        return dt_emsg_set(em, DT_ESHAPE, "attention (H=%d, Hkv=%d, D=%d) does not match the "
                           "model (H=%lld, Hkv=%lld, D=%lld)", attn->H, attn->Hkv, attn->D,
                           (long long)H, (long long)Hkv, (long long)D);
    L = &g->layer[l];
    /* attention half: x += Wo attn(rope(Wq h), rope(Wk h), Wv h), h = norm(x) */
    /* (fused launches, kernels/cuda/layers_cuda.h: the norm straight into
     * the dtype; RoPE of q and k with the three casts) */
    if ((rc = dt_rmsnorm_fwd_half_cuda(c, (int)d, cf->norm_eps, g->x, NULL, L->attn_norm, g->dt,
                                       g->hb, g->rstd, g->st, em)) < 0 ||
        (rc = dt_linear_fwd_cuda(g->blas, g->dt, c, (int)d, (int)qd, g->hb, L->wq, DT_F32, g->q,
                                 g->st, em)) < 0 ||
        (rc = dt_linear_fwd_cuda(g->blas, g->dt, c, (int)d, (int)kd, g->hb, L->wk, DT_F32, g->k,
                                 g->st, em)) < 0 ||
        (rc = dt_linear_fwd_cuda(g->blas, g->dt, c, (int)d, (int)kd, g->hb, L->wv, DT_F32, g->v,
                                 g->st, em)) < 0 ||
        (rc = dt_rope_qkv_half_cuda(c, (int)H, (int)Hkv, (int)D, g->pos, &cf->rope, g->q, g->k,
                                    g->v, g->dt, g->qb, g->kb, g->vb, g->st, em)) < 0)
        return rc;
    /* the ring runs on its own streams, after these (an event, not the host) */
    DT_CUDA_TRY(em, cudaEventRecord(g->ev_ring, g->st));
    dt_ring_io_t io = { .q = g->qb, .k = g->kb, .v = g->vb, .o = g->o, .lse = g->lse,
                        .ready = g->ev_ring };
    dt_attn_spec_t la;
    if ((rc = dt_ring_attn_fwd(g->ring, dt_attn_layer_spec(attn, l, &la), g->dt, &io, NULL,
                               em)) < 0)
        return rc;
    /* the hidden state's copy to the host (a checkpoint) reads it until
     * here: the first write into it waits for the copy */
    if (g->copying)
        DT_CUDA_TRY(em, cudaStreamWaitEvent(g->st, g->ev_copy, 0));
    if ((rc = linear(g, c, (int)qd, (int)d, g->o, L->wo, g->t, em)) < 0)
        return rc;
    /* MLP half: x += W2 (silu(W1 h) * W3 h), h = norm(x); the residual add
     * fused into the norm, SwiGLU straight into the dtype */
    if ((rc = dt_rmsnorm_fwd_half_cuda(c, (int)d, cf->norm_eps, g->x, g->t, L->mlp_norm, g->dt,
                                       g->hb, g->rstd, g->st, em)) < 0 ||
        (rc = dt_linear_fwd_cuda(g->blas, g->dt, c, (int)d, (int)f, g->hb, L->w1, DT_F32, g->a,
                                 g->st, em)) < 0 ||
        (rc = dt_linear_fwd_cuda(g->blas, g->dt, c, (int)d, (int)f, g->hb, L->w3, DT_F32, g->b,
                                 g->st, em)) < 0 ||
        (rc = dt_swiglu_fwd_half_cuda(c, (int)f, g->a, g->b, g->dt, g->hb, g->st, em)) < 0 ||
        (rc = dt_linear_fwd_cuda(g->blas, g->dt, c, (int)f, (int)d, g->hb, L->w2, DT_F32, g->t,
                                 g->st, em)) < 0 ||
        (rc = dt_add_f32_cuda(c * d, g->t, g->x, g->st, em)) < 0)
        return rc;
    DT_CUDA_TRY(em, cudaStreamSynchronize(g->st));
    return 0;
}

int dt_gmodel_head(dt_gmodel_t *g, float *logits, dt_emsg_t *em)
{
    const dt_model_cfg_t *cf = &g->cfg;
    const int64_t c = g->c, d = cf->dim, V = cf->vocab;
    int rc;

    if ((rc = dt_rmsnorm_fwd_cuda(c, (int)d, cf->norm_eps, g->x, g->final_norm, g->h, g->rstd,
                                  g->st, em)) < 0)
        return rc;
    for (int64_t r0 = 0; r0 < c; r0 += HEAD_ROWS) {
        int64_t n = c - r0 < HEAD_ROWS ? c - r0 : HEAD_ROWS;
        if ((rc = linear(g, n, (int)d, (int)V, g->h + r0 * d, g->lm_head, g->logits, em)) < 0)
            return rc;
        DT_CUDA_TRY(em, cudaStreamSynchronize(g->st));
        DT_CUDA_TRY(em, cudaMemcpy(logits + r0 * V, g->logits, (size_t)(n * V) * sizeof(float),
                                   cudaMemcpyDeviceToHost));
    }
    return 0;
}

/* Start a copy on the copy stream after everything queued so far on the
 * model's stream (an earlier copy waited for first). */
int dt_gmodel_copy_begin(dt_gmodel_t *g, dt_emsg_t *em)
{
    int rc;

    if (g->copying && (rc = dt_gmodel_copy_wait(g, NULL, em)) < 0)
        return rc;
    DT_CUDA_TRY(em, cudaEventRecord(g->ev_mark, g->st));
    DT_CUDA_TRY(em, cudaStreamWaitEvent(g->cst, g->ev_mark, 0));
    return 0;
}

int dt_gmodel_copy_end(dt_gmodel_t *g, dt_emsg_t *em)
{
    DT_CUDA_TRY(em, cudaEventRecord(g->ev_copy, g->cst));
    g->copying = 1;
    return 0;
}

int dt_gmodel_hidden_copy_start(dt_gmodel_t *g, float *hidden, dt_emsg_t *em)
{
    int rc;

    if ((rc = dt_gmodel_copy_begin(g, em)) < 0)
        return rc;
    DT_CUDA_TRY(em, cudaMemcpyAsync(hidden, g->x, (size_t)(g->c * g->cfg.dim) * sizeof(float),
                                    cudaMemcpyDeviceToHost, g->cst));
    return dt_gmodel_copy_end(g, em);
}

int dt_gmodel_copy_wait(dt_gmodel_t *g, double *stall_s, dt_emsg_t *em)
{
    struct timespec a, b;

    clock_gettime(CLOCK_MONOTONIC, &a);
    if (g->copying) {
        g->copying = 0;
        DT_CUDA_TRY(em, cudaEventSynchronize(g->ev_copy));
    }
    clock_gettime(CLOCK_MONOTONIC, &b);
    if (stall_s)
        *stall_s = (double)(b.tv_sec - a.tv_sec) + 1e-9 * (double)(b.tv_nsec - a.tv_nsec);
    return 0;
}

int dt_gmodel_mem_info(size_t *free_b, size_t *total_b, dt_emsg_t *em)
{
    DT_CUDA_TRY(em, cudaMemGetInfo(free_b, total_b));
    return 0;
}

float *dt_gmodel_host_alloc(int64_t n)
{
    void *p = NULL;

    if (cudaHostAlloc(&p, (size_t)(n > 0 ? n : 1) * sizeof(float), cudaHostAllocDefault) !=
        cudaSuccess) {
        (void)cudaGetLastError();
        return NULL;
    }
    memset(p, 0, (size_t)(n > 0 ? n : 1) * sizeof(float));
    return p;
}

void dt_gmodel_host_free(float *p)
{
    if (p)
        cudaFreeHost(p);
}
