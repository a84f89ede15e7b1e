/* SPDX-License-Identifier: MIT
 *
 * Training on the GPU (dt_gtrain_*, contract in engine/model/model_cuda.h):
 * the training state (the flat fp32 arrays of the model's layout:
 * parameters, gradient, moments, and their compute-dtype copy W, which the
 * layers' weight pointers (glayer_t) point into; every layer's
 * activations; the backward's scratch), the step's forward with the
 * activations kept, the LM head and loss, the backward of every layer and
 * of the embedding, the gradient's sum over the ring and its norm, AdamW,
 * and the copy of parameters and moments to the host. It builds on the
 * model's shell (engine/model/model_cuda_impl.h, model_cuda.c: streams,
 * device allocation, the copy stream) and hands dt_gmodel_free its
 * release through the tr_free hook.
 *
 * Not here: the forward-only model and prefill's layer forward and head
 * (model_cuda.c), the kernels (kernels/cuda/layers_cuda.h,
 * kernels/cuda/train_cuda.h), the MPI agreement and checkpoints (the
 * caller's).
 */
#include "config.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include <cuda_runtime_api.h>

#include "common/mem.h"
#include "engine/model/model_cuda_impl.h"
#include "engine/attn/ring_cuda.h" /* dt_ring_attn_reserve */
#include "engine/model/train_cuda.h"
#include "kernels/cpu/layers_cpu.h" /* dt_tokens_check */
#include "kernels/cuda/cuda_err.h"
#include "kernels/cuda/layers_cuda.h"
#include "kernels/cuda/train_cuda.h"

/* One layer's activations kept for the backward. */
typedef struct tact {
    float *xin, *rstd1, *o, *lse, *x2, *rstd2, *a, *b;
    void *h1b, *qb, *kb, *vb, *ob, *h2b, *gb; /* compute dtype */
} tact_t;

typedef struct gtrain {
    dt_model_layout_t lo;
    int64_t n;
    int64_t moff, mlen; /* the moments kept: [moff, moff + mlen) of n (shard = optimizer) */
    float *P, *G, *M, *V;
    void *W;
    /* the optimizer in host memory (host = 1): no P, M, V on the device;
     * Pf the fp32 parameters the device reads as such (the embedding, then
     * each layer's two norm gains, then the final norm's), pf their
     * ranges (npf of them: offset in P, in Pf, length), and stage, nstage
     * floats through which the parameters come up to be cast into W */
    int host;
    float *Pf, *stage;
    int64_t (*pf)[3];
    int npf;
    int64_t nstage;
    float *emb; /* the token embedding the forward reads (fp32) */
    tact_t *act;  /* [nact] */
    int nact;     /* layers, or 1 with recompute */
    /* recompute: every layer's input (layers, c, d) in the checkpoint
     * dtype (fp32, or bf16: ck16), on the device (saved) or, offloaded
     * (off_act), in page-locked host memory (hsaved) through two device
     * slots: a layer's input goes down on the stream ast as soon as it is
     * copied into its slot, and comes back one layer ahead of its
     * backward; ev_in[s] marks slot s filled (for the one who reads it),
     * ev_out[s] emptied (for the one who writes it next) */
    void *saved;
    int ck16, off_act;
    void *hsaved;
    void *slot[2];
    cudaStream_t ast;
    cudaEvent_t ev_in[2], ev_out[2];
    /* the head: final norm output (compute dtype), its rstd, per-row
     * losses and argmaxes, the logits' gradient in the compute dtype */
    void *hfb, *dlb;
    float *rstdf;
    double *rowloss, *part;
    int32_t *tok, *tgt, *amax;
    /* the embedding's gradient grouping, device and host */
    int32_t *etok, *erows, *h_etok, *h_erows, *h_amax;
    int64_t *estart, *h_estart;
    double *h_loss;
    /* backward scratch (da, db, dg: a tile's rows when tiled; dh, dq, dk,
     * dv: the forward scratch's h, q, k, v) */
    float *dx, *dh, *dq, *dk, *dv, *do_, *da, *db, *dg;
    void *dyb, *dob;
    /* the MLP in tiles of MLP_ROWS tokens (tiled = 1, spec/model.h): a
     * tile's gate and up products (fp32) and SwiGLU product (dtype), made
     * in the forward and again in the backward; no layer keeps a, b, gb */
    int tiled;
    float *ta, *tb;
    void *tgb;
    /* sharded (engine/model/model.h's semantics), unit by unit
     * (dt_model_unit_range: the embedding, each layer, the head):
     * sg (shard = gradients and parameters): G is this rank's slice
     * [moff, moff + mlen) of the gradient only; each unit's gradient is
     * made in gu[s] (U floats, s alternating) and reduce-scattered into G
     * on the ring's communication stream (slot 2 + s) while the next
     * unit's backward runs (gpend[s]: one in flight); a tied embedding's
     * (the head's and the embedding's) in ge, alive through the backward;
     * rs the reduce-scatter's scratch (rsn floats, dt_model_gpu_rs_floats).
     * sp (shard = parameters): P, M, V and W hold the slice only; each
     * unit's compute-dtype weights are gathered into wu[s] (U elements)
     * and its norm gains (fp32) into nu[s] (2 d) one unit ahead (slot s),
     * in the order the step uses them (wseq: the layers, the head, the
     * layers backward), and the fp32 embedding into gu[0] for the
     * forward; with the optimizer on the host Ps is the slice's fp32
     * copy the gathers read (P is then NULL). */
    int sg, sp;
    int64_t U;
    float *gu[2], *ge, *rs, *Ps, *nu[2];
    void *wu[2];
    int gslot, gpend[2];
    int64_t rsn;
    int acc; /* this sequence's gradient adds to the step's (not its first) */
} gtrain_t;

#define MLP_ROWS DT_GPU_MLP_ROWS


/* The training state's release: dt_gmodel_free's hook (tr_free). */
static void gtrain_free(dt_gmodel_t *g)
{
    gtrain_t *T = g->tr;

    for (int l = 0; T->act && l < T->nact; l++) {
        tact_t *A = &T->act[l];
        void *ps[] = { A->xin, A->rstd1, A->o, A->lse, A->x2, A->rstd2, A->a, A->b,
                       A->h1b, A->qb, A->kb, A->vb, A->ob, A->h2b, A->gb };
        for (size_t i = 0; i < sizeof(ps) / sizeof(ps[0]); i++)
            cudaFree(ps[i]);
    }
    if (T->ast)
        (void)cudaStreamSynchronize(T->ast);
    for (int s = 0; s < 2; s++) {
        if (T->ev_in[s])
            cudaEventDestroy(T->ev_in[s]);
        if (T->ev_out[s])
            cudaEventDestroy(T->ev_out[s]);
        cudaFree(T->slot[s]);
    }
    if (T->ast)
        cudaStreamDestroy(T->ast);
    if (T->hsaved)
        cudaFreeHost(T->hsaved);
    void *ps[] = { T->P, T->G, T->M, T->V, T->W, T->Pf, T->stage, T->ta, T->tb, T->tgb,
                   T->saved, T->hfb, T->dlb, T->rstdf, T->rowloss, T->part, T->tok, T->tgt,
                   T->amax, T->etok, T->erows, T->estart, T->dx, T->do_, T->da, T->db, T->dg,
                   T->dyb, T->dob, T->gu[0], T->gu[1], T->ge, T->rs, T->Ps, T->nu[0], T->nu[1],
                   T->wu[0], T->wu[1] };
    for (size_t i = 0; i < sizeof(ps) / sizeof(ps[0]); i++)
        cudaFree(ps[i]);
    free(T->act);
    free(T->pf);
    free(T->h_etok);
    free(T->h_erows);
    free(T->h_estart);
    free(T->h_amax);
    free(T->h_loss);
    dt_model_layout_close(&T->lo);
    free(T);
    g->tr = NULL;
}

/* Floats of the staging buffer the parameters come up through (host
 * optimizer): 16 Mi (64 MiB), or the whole when smaller. */
#define STAGE_FLOATS ((int64_t)1 << 24)

int dt_gtrain_new(const dt_model_cfg_t *cfg, const dt_model_layout_t *lo, int64_t c,
                  dt_dtype_t dtype, const dt_gtrain_opts_t *opt, dt_ring_t *ring,
                  const float *P, const float *M, const float *V, int64_t moff, int64_t mlen,
                  const int64_t *pos, dt_gmodel_t **out, dt_emsg_t *em)
{
    const int recompute = opt->recompute, host_optimizer = opt->host_optimizer;
    const int64_t d = cfg->dim, D = dt_model_head_dim(cfg), qd = cfg->heads * D,
                  kd = cfg->kv_heads * D, f = cfg->ffn, Vv = cfg->vocab;
    const size_t F = sizeof(float), half = 2;
    dt_gmodel_t *g;
    gtrain_t *T;
    int rc;

    if ((rc = dt_gmodel_begin(cfg, c, dtype, ring, &g, em)) < 0)
        return rc;
    *out = NULL;
    T = g->tr = dt_xcalloc(1, sizeof(*g->tr));
    g->tr_free = gtrain_free;
    dt_model_layout_init(&T->lo, cfg);
    T->n = T->lo.nparams;
    if (moff < 0 || mlen < 0 || moff + mlen > T->n) {
        rc = dt_emsg_set(em, DT_EINVAL, "moments [%lld, +%lld) outside the %lld parameters",
                         (long long)moff, (long long)mlen, (long long)T->n);
        goto fail;
    }
    T->moff = moff;
    T->mlen = mlen;
    T->host = host_optimizer != 0;
    T->sg = opt->shard_gradients || opt->shard_parameters;
    T->sp = opt->shard_parameters != 0;
    T->U = dt_model_unit_max(cfg);
    const size_t nb = (size_t)T->n * F, mb = (size_t)mlen * F;
    if (T->sg) {
        const int R = dt_ring_size(ring);
        /* a part is at most a unit: R of them at once, or less */
        T->rsn = R == 1 ? 0 : dt_model_gpu_rs_floats(cfg, R);
        const dbuf_t sb[] = {
            { &T->gu[0], (size_t)T->U * F }, { &T->gu[1], (size_t)T->U * F },
            { &T->ge, cfg->tied ? (size_t)(Vv * d) * F : 1 },
            { &T->rs, (size_t)(T->rsn > 0 ? T->rsn : 1) * F },
        };
        if ((rc = dt_gmodel_dalloc_all(sb, sizeof(sb) / sizeof(sb[0]), em)) < 0)
            goto fail;
    }
    if (T->sp) {
        /* the slice's own arrays; the units come into wu, nu */
        const dbuf_t pb[] = {
            { &T->G, mb },
            { &T->W, (size_t)mlen * half },
            { T->host ? (void *)&T->Ps : (void *)&T->P, mb },
            { &T->M, T->host ? 1 : mb },
            { &T->V, T->host ? 1 : mb },
            { &T->wu[0], (size_t)T->U * half }, { &T->wu[1], (size_t)T->U * half },
            { &T->nu[0], (size_t)(2 * d) * F }, { &T->nu[1], (size_t)(2 * d) * F },
        };
        if ((rc = dt_gmodel_dalloc_all(pb, sizeof(pb) / sizeof(pb[0]), em)) < 0)
            goto fail;
        if (T->host) {
            if ((rc = dt_gtrain_params_set(g, P, em)) < 0)
                goto fail;
        } else {
            DT_CUDA_GOTO(em, rc, fail, cudaMemcpy(T->P, P, mb, cudaMemcpyHostToDevice));
            DT_CUDA_GOTO(em, rc, fail, cudaMemcpy(T->M, M, mb, cudaMemcpyHostToDevice));
            DT_CUDA_GOTO(em, rc, fail, cudaMemcpy(T->V, V, mb, cudaMemcpyHostToDevice));
            if ((rc = dt_cast_from_f32_cuda(dtype, mlen, T->P, T->W, g->st, em)) < 0)
                goto fail;
        }
        T->emb = T->gu[0];
    } else if (T->host) {
        /* the fp32 ranges the device reads: the embedding, the norms */
        T->npf = 2 * cfg->layers + 2;
        T->pf = dt_xcalloc((size_t)T->npf, sizeof(*T->pf));
        int64_t at = 0;
        for (int i = 0; i < T->npf; i++) {
            int l = (i - 1) / 2;
            int64_t src = i == 0                ? T->lo.tok_emb
                          : i == T->npf - 1     ? T->lo.final_norm
                          : (i - 1) % 2 == 0    ? T->lo.layer[l].attn_norm
                                                : T->lo.layer[l].mlp_norm;
            int64_t len = i == 0 ? (int64_t)Vv * d : d;
            T->pf[i][0] = src, T->pf[i][1] = at, T->pf[i][2] = len;
            at += len;
        }
        T->nstage = T->n < STAGE_FLOATS ? T->n : STAGE_FLOATS;
        const dbuf_t big[] = {
            { &T->G, T->sg ? mb : nb },
            { &T->W, (size_t)T->n * half },
            { &T->Pf, (size_t)at * F },
            { &T->stage, (size_t)T->nstage * F },
        };
        if ((rc = dt_gmodel_dalloc_all(big, sizeof(big) / sizeof(big[0]), em)) < 0 ||
            (rc = dt_gtrain_params_set(g, P, em)) < 0)
            goto fail;
        T->emb = T->Pf;
    } else {
        const dbuf_t big[] = {
            { &T->P, nb }, { &T->G, T->sg ? mb : nb }, { &T->M, mb }, { &T->V, mb },
            { &T->W, (size_t)T->n * half },
        };
        if ((rc = dt_gmodel_dalloc_all(big, sizeof(big) / sizeof(big[0]), em)) < 0)
            goto fail;
        DT_CUDA_GOTO(em, rc, fail, cudaMemcpy(T->P, P, nb, cudaMemcpyHostToDevice));
        DT_CUDA_GOTO(em, rc, fail, cudaMemcpy(T->M, M, mb, cudaMemcpyHostToDevice));
        DT_CUDA_GOTO(em, rc, fail, cudaMemcpy(T->V, V, mb, cudaMemcpyHostToDevice));
        if ((rc = dt_cast_from_f32_cuda(dtype, T->n, T->P, T->W, g->st, em)) < 0)
            goto fail;
        T->emb = T->P + T->lo.tok_emb;
    }
    /* the layers' weights: views into P or Pf (norms) and W (matrices);
     * sharded parameters: set unit by unit as they arrive (wunit_use) */
    g->layer = dt_xcalloc((size_t)cfg->layers, sizeof(*g->layer));
    for (int l = 0; l < cfg->layers && !T->sp; l++) {
        const dt_model_layer_off_t *L = &T->lo.layer[l];
        glayer_t *G = &g->layer[l];
        char *w = T->W;
        G->attn_norm = T->host ? T->Pf + T->pf[1 + 2 * l][1] : T->P + L->attn_norm;
        G->mlp_norm = T->host ? T->Pf + T->pf[2 + 2 * l][1] : T->P + L->mlp_norm;
        G->wq = w + L->wq * half, G->wk = w + L->wk * half, G->wv = w + L->wv * half;
        G->wo = w + L->wo * half, G->w1 = w + L->w1 * half, G->w3 = w + L->w3 * half;
        G->w2 = w + L->w2 * half;
    }
    if (!T->sp) {
        g->final_norm = T->host ? T->Pf + T->pf[T->npf - 1][1] : T->P + T->lo.final_norm;
        g->lm_head = (char *)T->W + T->lo.lm_head * half;
    }
    if ((rc = dt_gmodel_dalloc(&g->pos, (size_t)c * sizeof(int64_t), em)) < 0)
        goto fail;
    DT_CUDA_GOTO(em, rc, fail, cudaMemcpyAsync(g->pos, pos, (size_t)c * sizeof(int64_t),
                                               cudaMemcpyHostToDevice, g->st));
    /* recompute: the layers' inputs, and one layer's activations made
     * again before its backward */
    T->nact = recompute ? 1 : cfg->layers;
    if ((opt->offload_act || opt->ckpt_bf16) && !recompute) {
        rc = dt_emsg_set(em, DT_EINVAL, "the layer inputs' dtype and offload are recompute = "
                         "layer's (it keeps them)");
        goto fail;
    }
    T->ck16 = opt->ckpt_bf16 != 0;
    T->off_act = opt->offload_act != 0;
    const size_t row = (size_t)(c * d) * (T->ck16 ? 2 : F);
    if (recompute && !T->off_act &&
        (rc = dt_gmodel_dalloc(&T->saved, (size_t)cfg->layers * row, em)) < 0)
        goto fail;
    if (T->off_act) {
        if (cudaHostAlloc(&T->hsaved, (size_t)cfg->layers * row, cudaHostAllocDefault) !=
            cudaSuccess) {
            (void)cudaGetLastError();
            T->hsaved = NULL;
            rc = dt_emsg_set(em, DT_ENOMEM, "offload = activations: no %.2f GiB of page-locked "
                             "host memory for the layers' inputs",
                             (double)cfg->layers * (double)row / (1024.0 * 1024 * 1024));
            goto fail;
        }
        DT_CUDA_GOTO(em, rc, fail, cudaStreamCreateWithFlags(&T->ast, cudaStreamNonBlocking));
        for (int s = 0; s < 2; s++) {
            DT_CUDA_GOTO(em, rc, fail,
                         cudaEventCreateWithFlags(&T->ev_in[s], cudaEventDisableTiming));
            DT_CUDA_GOTO(em, rc, fail,
                         cudaEventCreateWithFlags(&T->ev_out[s], cudaEventDisableTiming));
            if ((rc = dt_gmodel_dalloc(&T->slot[s], row, em)) < 0)
                goto fail;
        }
    }
    T->act = dt_xcalloc((size_t)T->nact, sizeof(*T->act));
    T->tiled = dt_model_gpu_mlp_tiled(c);
    for (int l = 0; l < T->nact; l++) {
        tact_t *A = &T->act[l];
        const dbuf_t a[] = {
            { &A->xin, (size_t)(c * d) * F },  { &A->rstd1, (size_t)c * F },
            { &A->o, (size_t)(c * qd) * F },   { &A->lse, (size_t)(c * cfg->heads) * F },
            { &A->x2, (size_t)(c * d) * F },   { &A->rstd2, (size_t)c * F },
            { &A->h1b, (size_t)(c * d) * half }, { &A->qb, (size_t)(c * qd) * half },
            { &A->kb, (size_t)(c * kd) * half }, { &A->vb, (size_t)(c * kd) * half },
            { &A->ob, (size_t)(c * qd) * half }, { &A->h2b, (size_t)(c * d) * half },
            /* the MLP's, untiled only (last: left out when tiled) */
            { &A->a, (size_t)(c * f) * F },    { &A->b, (size_t)(c * f) * F },
            { &A->gb, (size_t)(c * f) * half },
        };
        size_t na = sizeof(a) / sizeof(a[0]) - (T->tiled ? 3 : 0);
        if ((rc = dt_gmodel_dalloc_all(a, na, em)) < 0)
            goto fail;
    }
    /* the MLP's rows at a time: a tile when tiled, else every token */
    const int64_t mr = T->tiled ? MLP_ROWS : c;
    if (T->tiled) {
        const dbuf_t tb[] = {
            { &T->ta, (size_t)(mr * f) * F },
            { &T->tb, (size_t)(mr * f) * F },
            { &T->tgb, (size_t)(mr * f) * half },
        };
        if ((rc = dt_gmodel_dalloc_all(tb, sizeof(tb) / sizeof(tb[0]), em)) < 0)
            goto fail;
    }
    /* dy in the dtype: (tokens, widest output) untiled; tiled the MLP's
     * (rows, ffn) beside the others' (tokens, max(d, qd)) */
    const int64_t dq = d > qd ? d : qd;
    const size_t dyb = T->tiled ? (size_t)(c * dq + mr * f) : (size_t)(c * max3(d, qd, f));
    const dbuf_t bufs[] = {
        { &g->x, (size_t)(c * d) * F },    { &g->h, (size_t)(c * d) * F },
        { &g->t, (size_t)(c * d) * F },    { &g->q, (size_t)(c * qd) * F },
        { &g->k, (size_t)(c * kd) * F },   { &g->v, (size_t)(c * kd) * F },
        { &g->g, (size_t)(mr * f) * F },   { &g->logits, (size_t)(HEAD_ROWS * Vv) * F },
        { &T->hfb, (size_t)(c * d) * half }, { &T->dlb, (size_t)(HEAD_ROWS * Vv) * half },
        { &T->rstdf, (size_t)c * F },      { &T->rowloss, (size_t)c * sizeof(double) },
        { &T->part, DT_SUMSQ_PARTS * sizeof(double) },
        { &T->tok, (size_t)c * 4 },        { &T->tgt, (size_t)c * 4 },
        { &T->amax, (size_t)c * 4 },       { &T->etok, (size_t)c * 4 },
        { &T->erows, (size_t)c * 4 },      { &T->estart, (size_t)(c + 1) * 8 },
        { &T->dx, (size_t)(c * d) * F },   { &T->do_, (size_t)(c * qd) * F },
        { &T->da, (size_t)(mr * f) * F },  { &T->db, (size_t)(mr * f) * F },
        { &T->dg, (size_t)(mr * f) * F },  { &T->dyb, dyb * half },
        { &T->dob, (size_t)(c * qd) * half },
    };
    if ((rc = dt_gmodel_dalloc_all(bufs, sizeof(bufs) / sizeof(bufs[0]), em)) < 0)
        goto fail;
    /* the backward's dh, dq, dk, dv live in the forward's h, q, k, v: a
     * layer's backward (and the head's) starts after its forward is done
     * with them, and nothing reads them across (the model's release
     * frees them once) */
    T->dh = g->h;
    T->dq = g->q;
    T->dk = g->k;
    T->dv = g->v;
    T->h_etok = dt_xmallocarray((size_t)c, sizeof(int32_t));
    T->h_erows = dt_xmallocarray((size_t)c, sizeof(int32_t));
    T->h_amax = dt_xmallocarray((size_t)c, sizeof(int32_t));
    T->h_estart = dt_xmallocarray((size_t)c + 1, sizeof(int64_t));
    T->h_loss = dt_xmallocarray((size_t)c, sizeof(double));
    DT_CUDA_GOTO(em, rc, fail, cudaStreamSynchronize(g->st));
    *out = g;
    return 0;
fail:
    dt_gmodel_free(g);
    return rc;
}

/* y (rows, dout) fp32 = xb W^T for xb already in the compute dtype. */
static int mm(dt_gmodel_t *g, int64_t rows, int din, int dout, const void *xb, const void *w,
              float *y, dt_emsg_t *em)
{
    return dt_linear_fwd_cuda(g->blas, g->dt, rows, din, dout, xb, w, DT_F32, y, g->st, em);
}

/* dy (rows, dout) fp32, rounded into the scratch dyb, through the linear
 * layer's backward: dx WRITTEN, dw ADDED (fp32). */
static int mm_bwd(dt_gmodel_t *g, int64_t rows, int din, int dout, const void *xb, const void *w,
                  const float *dy, float *dx, float *dw, dt_emsg_t *em)
{
    gtrain_t *T = g->tr;
    int rc = dt_cast_from_f32_cuda(g->dt, rows * dout, dy, T->dyb, g->st, em);

    return rc < 0 ? rc
                  : dt_linear_bwd_cuda(g->blas, g->dt, rows, din, dout, xb, w, T->dyb, dx, dw,
                                       g->st, em);
}

/* The tiled MLP's tile of rows [r0, r0 + n): the gate and up products of
 * the kept normed input into ta, tb, their SwiGLU product into tgb (the
 * dtype), through the fp32 scratch g->g; the forward runs it, and the
 * backward again (the same kernels on the same input: the same bits). */
static int mlp_tile_fwd(dt_gmodel_t *g, const glayer_t *L, const tact_t *A, int64_t r0, int64_t n,
                        dt_emsg_t *em)
{
    gtrain_t *T = g->tr;
    const int64_t d = g->cfg.dim, f = g->cfg.ffn;
    const void *hb = (const char *)A->h2b + r0 * d * 2;
    int rc;

    if ((rc = mm(g, n, (int)d, (int)f, hb, L->w1, T->ta, em)) < 0 ||
        (rc = mm(g, n, (int)d, (int)f, hb, L->w3, T->tb, em)) < 0 ||
        (rc = dt_swiglu_fwd_cuda(n, (int)f, T->ta, T->tb, g->g, g->st, em)) < 0)
        return rc;
    return dt_cast_from_f32_cuda(g->dt, n * f, g->g, T->tgb, g->st, em);
}

/* Block l forward on g->x, keeping its activations (the sequence of
 * dt_gmodel_layer_fwd). */
static int tlayer_fwd(dt_gmodel_t *g, const dt_attn_spec_t *attn, int l, dt_emsg_t *em)
{
    const dt_model_cfg_t *cf = &g->cfg;
    const int64_t c = g->c, d = cf->dim, D = dt_model_head_dim(cf), H = cf->heads,
                  Hkv = cf->kv_heads, qd = H * D, kd = Hkv * D, f = cf->ffn;
    const size_t F = sizeof(float);
    const glayer_t *L = &g->layer[l];
    tact_t *A = &g->tr->act[l % g->tr->nact];
    dt_dtype_t dt = g->dt;
    int rc;

    DT_CUDA_TRY(em, cudaMemcpyAsync(A->xin, g->x, (size_t)(c * d) * F, cudaMemcpyDeviceToDevice,
                                    g->st));
    if ((rc = dt_rmsnorm_fwd_cuda(c, (int)d, cf->norm_eps, g->x, L->attn_norm, g->h, A->rstd1,
                                  g->st, em)) < 0 ||
        (rc = dt_cast_from_f32_cuda(dt, c * d, g->h, A->h1b, g->st, em)) < 0 ||
        (rc = mm(g, c, (int)d, (int)qd, A->h1b, L->wq, g->q, em)) < 0 ||
        (rc = mm(g, c, (int)d, (int)kd, A->h1b, L->wk, g->k, em)) < 0 ||
        (rc = mm(g, c, (int)d, (int)kd, A->h1b, L->wv, g->v, em)) < 0 ||
        (rc = dt_rope_fwd_cuda(c, (int)H, (int)D, g->pos, &cf->rope, g->q, g->st, em)) < 0 ||
        (rc = dt_rope_fwd_cuda(c, (int)Hkv, (int)D, g->pos, &cf->rope, g->k, g->st, em)) < 0 ||
        (rc = dt_cast_from_f32_cuda(dt, c * qd, g->q, A->qb, g->st, em)) < 0 ||
        (rc = dt_cast_from_f32_cuda(dt, c * kd, g->k, A->kb, g->st, em)) < 0 ||
        (rc = dt_cast_from_f32_cuda(dt, c * kd, g->v, A->vb, g->st, em)) < 0)
        return rc;
    DT_CUDA_TRY(em, cudaStreamSynchronize(g->st));
    dt_ring_io_t io = { .q = A->qb, .k = A->kb, .v = A->vb, .o = A->o, .lse = A->lse };
    if ((rc = dt_ring_attn_fwd(g->ring, attn, dt, &io, NULL, em)) < 0)
        return rc;
    if ((rc = dt_cast_from_f32_cuda(dt, c * qd, A->o, A->ob, g->st, em)) < 0 ||
        (rc = mm(g, c, (int)qd, (int)d, A->ob, L->wo, g->t, em)) < 0 ||
        (rc = dt_add_f32_cuda(c * d, g->t, g->x, g->st, em)) < 0)
        return rc;
    DT_CUDA_TRY(em, cudaMemcpyAsync(A->x2, g->x, (size_t)(c * d) * F, cudaMemcpyDeviceToDevice,
                                    g->st));
    if ((rc = dt_rmsnorm_fwd_cuda(c, (int)d, cf->norm_eps, g->x, L->mlp_norm, g->h, A->rstd2,
                                  g->st, em)) < 0 ||
        (rc = dt_cast_from_f32_cuda(dt, c * d, g->h, A->h2b, g->st, em)) < 0)
        return rc;
    if (!g->tr->tiled) {
        if ((rc = mm(g, c, (int)d, (int)f, A->h2b, L->w1, A->a, em)) < 0 ||
            (rc = mm(g, c, (int)d, (int)f, A->h2b, L->w3, A->b, em)) < 0 ||
            (rc = dt_swiglu_fwd_cuda(c, (int)f, A->a, A->b, g->g, g->st, em)) < 0 ||
            (rc = dt_cast_from_f32_cuda(dt, c * f, g->g, A->gb, g->st, em)) < 0 ||
            (rc = mm(g, c, (int)f, (int)d, A->gb, L->w2, g->t, em)) < 0)
            return rc;
    } else {
        for (int64_t r0 = 0; r0 < c; r0 += MLP_ROWS) {
            const int64_t n = c - r0 < MLP_ROWS ? c - r0 : MLP_ROWS;
            if ((rc = mlp_tile_fwd(g, L, A, r0, n, em)) < 0 ||
                (rc = mm(g, n, (int)f, (int)d, g->tr->tgb, L->w2, g->t + r0 * d, em)) < 0)
                return rc;
        }
    }
    return dt_add_f32_cuda(c * d, g->t, g->x, g->st, em);
}

/* Block l backward: T->dx holds the gradient of the block's output and
 * becomes that of its input; the weights' gradients are ADDED to Gu, the
 * gradient from parameter g0 on (the whole array's: gb = 0; a unit's
 * buffer: its first parameter). */
static int tlayer_bwd(dt_gmodel_t *g, const dt_attn_spec_t *attn, int l, float *Gu, int64_t g0,
                      dt_emsg_t *em)
{
    const dt_model_cfg_t *cf = &g->cfg;
    gtrain_t *T = g->tr;
    const dt_model_layer_off_t *O = &T->lo.layer[l];
    const int64_t c = g->c, d = cf->dim, D = dt_model_head_dim(cf), H = cf->heads,
                  Hkv = cf->kv_heads, qd = H * D, kd = Hkv * D, f = cf->ffn;
    const glayer_t *L = &g->layer[l];
    const tact_t *A = &T->act[l % T->nact];
    /* the layer's offsets from gb (the unit's start) */
    const dt_model_layer_off_t O_ = {
        .attn_norm = O->attn_norm - g0, .wq = O->wq - g0, .wk = O->wk - g0, .wv = O->wv - g0,
        .wo = O->wo - g0, .mlp_norm = O->mlp_norm - g0, .w1 = O->w1 - g0, .w3 = O->w3 - g0,
        .w2 = O->w2 - g0,
    };
    float *G = Gu;
    int rc;

    O = &O_;
    /* MLP: x = x2 + W2 swiglu(W1 h2, W3 h2), h2 = norm(x2); tiled, each
     * tile's gate and up products made again first */
    for (int64_t r0 = 0; r0 < c; r0 += T->tiled ? MLP_ROWS : c) {
        const int64_t n = !T->tiled ? c : c - r0 < MLP_ROWS ? c - r0 : MLP_ROWS;
        const void *gb = A->gb, *hb = (const char *)A->h2b + r0 * d * 2;
        const float *a = A->a, *b = A->b;
        if (T->tiled) {
            if ((rc = mlp_tile_fwd(g, L, A, r0, n, em)) < 0)
                return rc;
            gb = T->tgb, a = T->ta, b = T->tb;
        }
        if ((rc = mm_bwd(g, n, (int)f, (int)d, gb, L->w2, T->dx + r0 * d, T->dg, G + O->w2,
                         em)) < 0 ||
            (rc = dt_swiglu_bwd_cuda(n, (int)f, a, b, T->dg, T->da, T->db, g->st, em)) < 0 ||
            (rc = mm_bwd(g, n, (int)d, (int)f, hb, L->w1, T->da, T->dh + r0 * d, G + O->w1,
                         em)) < 0 ||
            (rc = mm_bwd(g, n, (int)d, (int)f, hb, L->w3, T->db, g->t + r0 * d, G + O->w3,
                         em)) < 0)
            return rc;
    }
    if ((rc = dt_add_f32_cuda(c * d, g->t, T->dh, g->st, em)) < 0 ||
        (rc = dt_rmsnorm_bwd_cuda(c, (int)d, A->x2, L->mlp_norm, A->rstd2, T->dh, g->t,
                                  G + O->mlp_norm, g->st, em)) < 0 ||
        (rc = dt_add_f32_cuda(c * d, g->t, T->dx, g->st, em)) < 0)
        return rc;
    /* attention: x2 = xin + Wo attn(rope(Wq h1), rope(Wk h1), Wv h1) */
    if ((rc = mm_bwd(g, c, (int)qd, (int)d, A->ob, L->wo, T->dx, T->do_, G + O->wo, em)) < 0 ||
        (rc = dt_cast_from_f32_cuda(g->dt, c * qd, T->do_, T->dob, g->st, em)) < 0)
        return rc;
    DT_CUDA_TRY(em, cudaStreamSynchronize(g->st));
    dt_ring_io_t io = { .q = A->qb, .k = A->kb, .v = A->vb, .o = A->o, .lse = A->lse,
                        .dout = T->dob, .dq = T->dq, .dk = T->dk, .dv = T->dv };
    if ((rc = dt_ring_attn_bwd(g->ring, attn, g->dt, &io, NULL, em)) < 0)
        return rc;
    if ((rc = dt_rope_bwd_cuda(c, (int)H, (int)D, g->pos, &cf->rope, T->dq, g->st, em)) < 0 ||
        (rc = dt_rope_bwd_cuda(c, (int)Hkv, (int)D, g->pos, &cf->rope, T->dk, g->st, em)) < 0 ||
        (rc = mm_bwd(g, c, (int)d, (int)qd, A->h1b, L->wq, T->dq, T->dh, G + O->wq, em)) < 0 ||
        (rc = mm_bwd(g, c, (int)d, (int)kd, A->h1b, L->wk, T->dk, g->t, G + O->wk, em)) < 0 ||
        (rc = dt_add_f32_cuda(c * d, g->t, T->dh, g->st, em)) < 0 ||
        (rc = mm_bwd(g, c, (int)d, (int)kd, A->h1b, L->wv, T->dv, g->t, G + O->wv, em)) < 0 ||
        (rc = dt_add_f32_cuda(c * d, g->t, T->dh, g->st, em)) < 0 ||
        (rc = dt_rmsnorm_bwd_cuda(c, (int)d, A->xin, L->attn_norm, A->rstd1, T->dh, g->t,
                                  G + O->attn_norm, g->st, em)) < 0 ||
        (rc = dt_add_f32_cuda(c * d, g->t, T->dx, g->st, em)) < 0)
        return rc;
    return 0;
}

/* The final norm, the LM head and the loss in row chunks, with the
 * gradient of the loss into T->dh (that of the final norm's output), then
 * through the final norm into T->dx; the LM head's gradient ADDED to gl,
 * the final norm's to gf. */
static int thead(dt_gmodel_t *g, float scale, float *gl, float *gf, dt_emsg_t *em)
{
    const dt_model_cfg_t *cf = &g->cfg;
    gtrain_t *T = g->tr;
    const int64_t c = g->c, d = cf->dim, V = cf->vocab;
    int rc;

    if ((rc = dt_rmsnorm_fwd_cuda(c, (int)d, cf->norm_eps, g->x, g->final_norm, g->h, T->rstdf,
                                  g->st, em)) < 0 ||
        (rc = dt_cast_from_f32_cuda(g->dt, c * d, g->h, T->hfb, g->st, em)) < 0)
        return rc;
    for (int64_t r0 = 0; r0 < c; r0 += HEAD_ROWS) {
        const int64_t n = c - r0 < HEAD_ROWS ? c - r0 : HEAD_ROWS;
        const void *hb = (const char *)T->hfb + r0 * d * 2;
        if ((rc = mm(g, n, (int)d, (int)V, hb, g->lm_head, g->logits, em)) < 0 ||
            (rc = dt_xent_cuda(n, (int)V, g->logits, T->tgt + r0, scale, T->rowloss + r0,
                               T->amax + r0, g->st, em)) < 0 ||
            (rc = dt_cast_from_f32_cuda(g->dt, n * V, g->logits, T->dlb, g->st, em)) < 0 ||
            (rc = dt_linear_bwd_cuda(g->blas, g->dt, n, (int)d, (int)V, hb, g->lm_head, T->dlb,
                                     T->dh + r0 * d, gl, g->st, em)) < 0)
            return rc;
    }
    return dt_rmsnorm_bwd_cuda(c, (int)d, g->x, g->final_norm, T->rstdf, T->dh, T->dx, gf,
                               g->st, em);
}

/* ---- sharded units (shard = gradients, parameters) ----------------------- */

/* [a, b) of the flat array gathered from every rank's slice (elem bytes
 * an element; slice this rank's part of the array, from moff) into out,
 * on the ring's communication stream (range slot `slot`). */
static int gather(dt_gmodel_t *g, int64_t a, int64_t b, size_t elem, const void *slice,
                  void *out, int slot, dt_emsg_t *em)
{
    gtrain_t *T = g->tr;
    const int64_t pa = a > T->moff ? a : T->moff;
    const char *mine = (const char *)slice;

    if (pa < T->moff + T->mlen)
        mine += (size_t)(pa - T->moff) * elem;
    return dt_ring_gather_range(g->ring, T->n, a, b, elem, mine, out, slot, em);
}

/* The step's use of the weights, position k of 0 .. 2 layers: the layers
 * forward (units 1 .. L), the head (unit L + 1, forward and backward at
 * once), the layers backward (L .. 1). */
static int wseq(int L, int k)
{
    return k <= L ? k + 1 : 2 * L + 1 - k;
}

/* shard = parameters: unit u's weights into slot s (range slot s): its
 * compute-dtype matrices (a layer's whole range; the head's LM head, a
 * tied head's the embedding) and its fp32 norm gains. The model's stream
 * no longer reads the slot (the caller synchronised it). */
static int wunit_fetch(dt_gmodel_t *g, int u, int s, dt_emsg_t *em)
{
    gtrain_t *T = g->tr;
    const dt_model_cfg_t *cf = &g->cfg;
    const int64_t d = cf->dim;
    const float *pf = T->host ? T->Ps : T->P;
    int64_t a, b;
    int rc;

    if (u <= cf->layers) {
        const dt_model_layer_off_t *O = &T->lo.layer[u - 1];
        dt_model_unit_range(cf, &T->lo, u, &a, &b);
        if ((rc = gather(g, a, b, 2, T->W, T->wu[s], s, em)) < 0 ||
            (rc = gather(g, O->attn_norm, O->attn_norm + d, 4, pf, T->nu[s], s, em)) < 0)
            return rc;
        return gather(g, O->mlp_norm, O->mlp_norm + d, 4, pf, T->nu[s] + d, s, em);
    }
    a = T->lo.lm_head;
    b = a + (int64_t)cf->vocab * d;
    if ((rc = gather(g, a, b, 2, T->W, T->wu[s], s, em)) < 0)
        return rc;
    return gather(g, T->lo.final_norm, T->lo.final_norm + d, 4, pf, T->nu[s], s, em);
}

/* shard = parameters: the weights of position k (wseq) are there once
 * their gathers are done: the layer's (or the head's) pointers into the
 * slot; then the next position's gathers start into the other slot, which
 * the model's stream is done with once synchronised. Not sharded: nothing. */
static int wunit_use(dt_gmodel_t *g, int k, dt_emsg_t *em)
{
    gtrain_t *T = g->tr;
    const dt_model_cfg_t *cf = &g->cfg;
    const int L = cf->layers, s = k % 2, u = wseq(L, k);
    const size_t half = 2;
    int rc;

    if (!T->sp)
        return 0;
    if ((rc = dt_ring_coll_wait(g->ring, s, em)) < 0)
        return rc;
    if (u <= L) {
        const dt_model_layer_off_t *O = &T->lo.layer[u - 1];
        glayer_t *G = &g->layer[u - 1];
        char *w = T->wu[s];
        const int64_t a = O->attn_norm;
        G->attn_norm = T->nu[s];
        G->mlp_norm = T->nu[s] + cf->dim;
        G->wq = w + (O->wq - a) * half, G->wk = w + (O->wk - a) * half;
        G->wv = w + (O->wv - a) * half, G->wo = w + (O->wo - a) * half;
        G->w1 = w + (O->w1 - a) * half, G->w3 = w + (O->w3 - a) * half;
        G->w2 = w + (O->w2 - a) * half;
    } else {
        g->final_norm = T->nu[s];
        g->lm_head = T->wu[s];
    }
    if (k + 1 > 2 * L)
        return 0;
    DT_CUDA_TRY(em, cudaStreamSynchronize(g->st));
    return wunit_fetch(g, wseq(L, k + 1), (k + 1) % 2, em);
}

/* shard = gradients: where unit u's gradient is made: the next slot
 * (once its last reduce-scatter is done), zeroed; *base its first
 * parameter. */
static int gunit_begin(dt_gmodel_t *g, int u, float **buf, int64_t *base, dt_emsg_t *em)
{
    gtrain_t *T = g->tr;
    const int s = T->gslot;
    int64_t a, b;
    int rc;

    if (T->gpend[s]) {
        if ((rc = dt_ring_coll_wait(g->ring, 2 + s, em)) < 0)
            return rc;
        T->gpend[s] = 0;
    }
    dt_model_unit_range(&g->cfg, &T->lo, u, &a, &b);
    DT_CUDA_TRY(em, cudaMemsetAsync(T->gu[s], 0, (size_t)(b - a) * sizeof(float), g->st));
    *buf = T->gu[s];
    *base = a;
    return 0;
}

/* shard = gradients: unit u's gradient in buf is complete on the model's
 * stream: its sum over the ranks goes to this rank's part of G (added
 * with acc) on the communication stream, in the current slot, which then
 * turns; the next unit's backward runs meanwhile. */
static int gunit_end(dt_gmodel_t *g, int u, const float *buf, dt_emsg_t *em)
{
    gtrain_t *T = g->tr;
    const int s = T->gslot;
    int64_t a, b;
    int rc;

    if (T->gpend[s]) { /* buf is the tied embedding's: the slot's last one first */
        if ((rc = dt_ring_coll_wait(g->ring, 2 + s, em)) < 0)
            return rc;
        T->gpend[s] = 0;
    }
    dt_model_unit_range(&g->cfg, &T->lo, u, &a, &b);
    const int64_t pa = a > T->moff ? a : T->moff;
    float *mine = T->G + (pa < T->moff + T->mlen ? pa - T->moff : 0);
    DT_CUDA_TRY(em, cudaStreamSynchronize(g->st));
    if ((rc = dt_ring_reduce_scatter_range(g->ring, T->n, a, b, buf, mine, T->acc, T->rs,
                                           T->rsn, 2 + s,
                                           em)) < 0)
        return rc;
    T->gpend[s] = 1;
    T->gslot ^= 1;
    return 0;
}

/* shard = gradients: every reduce-scatter in flight done. */
static int gunit_drain(dt_gmodel_t *g, dt_emsg_t *em)
{
    gtrain_t *T = g->tr;
    int rc;

    for (int s = 0; s < 2; s++)
        if (T->gpend[s]) {
            if ((rc = dt_ring_coll_wait(g->ring, 2 + s, em)) < 0)
                return rc;
            T->gpend[s] = 0;
        }
    return 0;
}

/* Layer l's input g->x into its place in the checkpoint dtype: on the
 * device, or into slot l % 2 and down to the host on ast (once the
 * slot's last copy is done). */
static int input_save(dt_gmodel_t *g, int l, dt_emsg_t *em)
{
    gtrain_t *T = g->tr;
    const int64_t n = g->c * g->cfg.dim;
    const size_t row = (size_t)n * (T->ck16 ? 2 : sizeof(float));
    const int s = l % 2;
    void *dst = T->off_act ? T->slot[s] : (char *)T->saved + (size_t)l * row;
    int rc;

    if (T->off_act)
        DT_CUDA_TRY(em, cudaStreamWaitEvent(g->st, T->ev_out[s], 0));
    if (T->ck16) {
        if ((rc = dt_cast_from_f32_cuda(DT_BF16, n, g->x, dst, g->st, em)) < 0)
            return rc;
    } else {
        DT_CUDA_TRY(em, cudaMemcpyAsync(dst, g->x, row, cudaMemcpyDeviceToDevice, g->st));
    }
    if (!T->off_act)
        return 0;
    DT_CUDA_TRY(em, cudaEventRecord(T->ev_in[s], g->st));
    DT_CUDA_TRY(em, cudaStreamWaitEvent(T->ast, T->ev_in[s], 0));
    DT_CUDA_TRY(em, cudaMemcpyAsync((char *)T->hsaved + (size_t)l * row, T->slot[s], row,
                                    cudaMemcpyDeviceToHost, T->ast));
    DT_CUDA_TRY(em, cudaEventRecord(T->ev_out[s], T->ast));
    return 0;
}

/* Offloaded: layer l's input up from the host into slot l % 2 on ast,
 * once the model's stream has read what the slot held. */
static int input_fetch(dt_gmodel_t *g, int l, dt_emsg_t *em)
{
    gtrain_t *T = g->tr;
    const size_t row = (size_t)(g->c * g->cfg.dim) * (T->ck16 ? 2 : sizeof(float));
    const int s = l % 2;

    DT_CUDA_TRY(em, cudaEventRecord(T->ev_out[s], g->st));
    DT_CUDA_TRY(em, cudaStreamWaitEvent(T->ast, T->ev_out[s], 0));
    DT_CUDA_TRY(em, cudaMemcpyAsync(T->slot[s], (char *)T->hsaved + (size_t)l * row, row,
                                    cudaMemcpyHostToDevice, T->ast));
    DT_CUDA_TRY(em, cudaEventRecord(T->ev_in[s], T->ast));
    return 0;
}

/* Layer l's kept input back into g->x (fp32), from the device or, once
 * its fetch is done, from its slot. */
static int input_restore(dt_gmodel_t *g, int l, dt_emsg_t *em)
{
    gtrain_t *T = g->tr;
    const int64_t n = g->c * g->cfg.dim;
    const size_t row = (size_t)n * (T->ck16 ? 2 : sizeof(float));
    const void *src = T->off_act ? T->slot[l % 2] : (const char *)T->saved + (size_t)l * row;

    if (T->off_act)
        DT_CUDA_TRY(em, cudaStreamWaitEvent(g->st, T->ev_in[l % 2], 0));
    if (T->ck16)
        return dt_cast_to_f32_cuda(DT_BF16, n, src, g->x, g->st, em);
    DT_CUDA_TRY(em, cudaMemcpyAsync(g->x, src, row, cudaMemcpyDeviceToDevice, g->st));
    return 0;
}

int dt_gtrain_fwd_bwd(dt_gmodel_t *g, const dt_attn_spec_t *attn, const int32_t *x,
                      const int32_t *y, float scale, int zero, double *loss_sum, int64_t *hits,
                      dt_emsg_t *em)
{
    const dt_model_cfg_t *cf = &g->cfg;
    gtrain_t *T = g->tr;
    const int64_t c = g->c, d = cf->dim;
    int rc;

    if (T == NULL)
        return dt_emsg_set(em, DT_EINVAL, "a forward-only GPU model (dt_gmodel_new) cannot "
                           "take a step");
    if (attn->H != cf->heads || attn->Hkv != cf->kv_heads || attn->D != dt_model_head_dim(cf))
        return dt_emsg_set(em, DT_ESHAPE, "attention (H=%d, Hkv=%d, D=%d) does not match the "
                           "model", attn->H, attn->Hkv, attn->D);
    if ((rc = dt_tokens_check(c, cf->vocab, x, 0, em)) < 0 ||
        (rc = dt_tokens_check(c, cf->vocab, y, 1, em)) < 0)
        return rc;
    int64_t nu;
    dt_embed_groups(c, x, &nu, T->h_etok, T->h_estart, T->h_erows);
    /* ordered on the stream (the last update may still run); from
     * pageable memory, so staged before each call returns */
    struct {
        void *dst;
        const void *src;
        size_t n;
    } up[] = {
        { T->tok, x, (size_t)c * 4 },
        { T->tgt, y, (size_t)c * 4 },
        { T->etok, T->h_etok, (size_t)nu * 4 },
        { T->erows, T->h_erows, (size_t)c * 4 },
        { T->estart, T->h_estart, (size_t)(nu + 1) * 8 },
    };
    for (size_t i = 0; i < sizeof(up) / sizeof(up[0]); i++)
        DT_CUDA_TRY(em, cudaMemcpyAsync(up[i].dst, up[i].src, up[i].n, cudaMemcpyHostToDevice,
                                        g->st));
    const int L = cf->layers;
    /* sharded, collectives overlap the attention: its workspace sized
     * first (grown once, then already big enough) */
    if (T->sg) {
        DT_CUDA_TRY(em, cudaStreamSynchronize(g->st));
        if ((rc = dt_ring_attn_reserve(g->ring, attn, g->dt, em)) < 0)
            return rc;
    }
    if (zero && !T->sg)
        DT_CUDA_TRY(em, cudaMemsetAsync(T->G, 0, (size_t)T->n * sizeof(float), g->st));
    T->acc = !zero;
    if (T->sp) {
        /* the fp32 embedding into gu[0] (free until the backward), and
         * the first layer's weights on their way */
        const int64_t a = T->lo.tok_emb, b = a + (int64_t)cf->vocab * d;
        DT_CUDA_TRY(em, cudaStreamSynchronize(g->st));
        if ((rc = gather(g, a, b, 4, T->host ? T->Ps : T->P, T->gu[0], 2, em)) < 0 ||
            (rc = wunit_fetch(g, wseq(L, 0), 0, em)) < 0 ||
            (rc = dt_ring_coll_wait(g->ring, 2, em)) < 0)
            return rc;
    }
    if ((rc = dt_embed_fwd_cuda(c, (int)d, T->tok, T->emb, g->x, g->st, em)) < 0)
        return rc;
    const int keep = T->saved != NULL || T->off_act;
    for (int l = 0; l < L; l++) {
        if (keep && (rc = input_save(g, l, em)) < 0)
            return rc;
        if ((rc = wunit_use(g, l, em)) < 0 || (rc = tlayer_fwd(g, attn, l, em)) < 0)
            return rc;
    }
    /* the head's gradient: the whole array's, or its unit's buffer (a
     * tied LM head's into the embedding's, ge, kept to the end) */
    float *gl = T->G + T->lo.lm_head, *gf = T->G + T->lo.final_norm, *gh = NULL, *Gu = T->G;
    int64_t gb = 0;
    if (T->sg) {
        if ((rc = gunit_begin(g, L + 1, &gh, &gb, em)) < 0)
            return rc;
        gf = gh;
        gl = cf->tied ? T->ge : gh + d;
        if (cf->tied)
            DT_CUDA_TRY(em, cudaMemsetAsync(T->ge, 0, (size_t)(cf->vocab * d) * sizeof(float),
                                            g->st));
    }
    if ((rc = wunit_use(g, L, em)) < 0 || (rc = thead(g, scale, gl, gf, em)) < 0 ||
        (T->sg && (rc = gunit_end(g, L + 1, gh, em)) < 0))
        return rc;
    if (T->off_act && (rc = input_fetch(g, cf->layers - 1, em)) < 0)
        return rc;
    for (int l = L - 1; l >= 0; l--) {
        /* recompute: layer l's forward again from its saved input (the
         * same kernels on the same input: the same activations to the
         * bit; with bf16 inputs, from the rounded input), on g->x, which
         * the backward no longer needs; offloaded, the next one's input
         * comes up meanwhile */
        if ((rc = wunit_use(g, 2 * L - l, em)) < 0 ||
            (T->sg && (rc = gunit_begin(g, l + 1, &Gu, &gb, em)) < 0))
            return rc;
        if (keep) {
            if ((rc = input_restore(g, l, em)) < 0 ||
                (T->off_act && l > 0 && (rc = input_fetch(g, l - 1, em)) < 0) ||
                (rc = tlayer_fwd(g, attn, l, em)) < 0)
                return rc;
        }
        if ((rc = tlayer_bwd(g, attn, l, Gu, gb, em)) < 0 ||
            (T->sg && (rc = gunit_end(g, l + 1, Gu, em)) < 0))
            return rc;
    }
    float *ge = T->G + T->lo.tok_emb;
    if (T->sg && cf->tied)
        ge = T->ge;
    else if (T->sg && (rc = gunit_begin(g, 0, &ge, &gb, em)) < 0)
        return rc;
    if ((rc = dt_embed_bwd_cuda(nu, (int)d, T->etok, T->estart, T->erows, T->dx, ge, g->st,
                                em)) < 0 ||
        (T->sg && ((rc = gunit_end(g, 0, ge, em)) < 0 || (rc = gunit_drain(g, em)) < 0)))
        return rc;
    DT_CUDA_TRY(em, cudaMemcpyAsync(T->h_loss, T->rowloss, (size_t)c * sizeof(double),
                                    cudaMemcpyDeviceToHost, g->st));
    DT_CUDA_TRY(em, cudaMemcpyAsync(T->h_amax, T->amax, (size_t)c * 4, cudaMemcpyDeviceToHost,
                                    g->st));
    DT_CUDA_TRY(em, cudaStreamSynchronize(g->st));
    double s = 0;
    int64_t h = 0;
    for (int64_t i = 0; i < c; i++)
        if (y[i] >= 0) {
            s += T->h_loss[i];
            h += T->h_amax[i] == y[i];
        }
    *loss_sum = s;
    *hits = h;
    return 0;
}

int dt_gtrain_reduce(dt_gmodel_t *g, double *sumsq, dt_emsg_t *em)
{
    gtrain_t *T = g->tr;
    double part[DT_SUMSQ_PARTS], s = 0;
    int rc;

    DT_CUDA_TRY(em, cudaStreamSynchronize(g->st));
    /* sharded gradients were summed unit by unit (gunit_end) */
    if (!T->sg && dt_ring_size(g->ring) > 1 &&
        (rc = dt_ring_allreduce_sum_f32(g->ring, &T->G, (size_t)T->n, em)) < 0)
        return rc;
    if ((rc = dt_sumsq_cuda(T->sg ? T->mlen : T->n, T->G, T->part, g->st, em)) < 0)
        return rc;
    DT_CUDA_TRY(em, cudaMemcpyAsync(part, T->part, sizeof(part), cudaMemcpyDeviceToHost, g->st));
    DT_CUDA_TRY(em, cudaStreamSynchronize(g->st));
    for (int i = 0; i < DT_SUMSQ_PARTS; i++)
        s += part[i];
    *sumsq = s;
    return 0;
}

int dt_gtrain_grad_sharded(const dt_gmodel_t *g)
{
    return g->tr->sg;
}

int dt_gtrain_adamw(dt_gmodel_t *g, const dt_adamw_cfg_t *cfg, int64_t step, double lr,
                    double wd, float gscale, dt_emsg_t *em)
{
    gtrain_t *T = g->tr;
    /* the constants as dt_adamw_step forms them */
    const dt_adamw_k_t k = dt_adamw_k_make(cfg->beta1, cfg->beta2, cfg->eps, lr, wd, step);
    int rc;

    if (T->host)
        return dt_emsg_set(em, DT_EINVAL, "dt_gtrain_adamw: the optimizer is in host memory "
                           "(dt_gtrain_grad_get, the host's update, dt_gtrain_params_set)");
    /* a copy of the last update's values to the host must be done first */
    if (g->copying)
        DT_CUDA_TRY(em, cudaStreamWaitEvent(g->st, g->ev_copy, 0));
    /* sharded (shard = optimizer): this rank's slice is updated, then
     * every rank's slice gathered, so that every GPU holds the same
     * parameters to the bit (the update is element by element) */
    float *p = T->sp ? T->P : T->P + T->moff, *gr = T->sg ? T->G : T->G + T->moff;
    if ((rc = dt_adamw_cuda(T->mlen, p, gr, T->M, T->V, gscale, &k, g->st, em)) < 0)
        return rc;
    if (T->sp) /* the slice's compute-dtype weights; gathered unit by unit */
        return dt_cast_from_f32_cuda(g->dt, T->mlen, T->P, T->W, g->st, em);
    if (T->mlen != T->n) {
        DT_CUDA_TRY(em, cudaStreamSynchronize(g->st));
        if ((rc = dt_ring_allgather_slices_f32(g->ring, &T->P, T->n, em)) < 0)
            return rc;
    }
    return dt_cast_from_f32_cuda(g->dt, T->n, T->P, T->W, g->st, em);
}

int dt_gtrain_copy_start(dt_gmodel_t *g, float *P, float *M, float *V, dt_emsg_t *em)
{
    gtrain_t *T = g->tr;
    const size_t mb = (size_t)T->mlen * sizeof(float);
    const size_t nb = T->sp ? mb : (size_t)T->n * sizeof(float);
    int rc;

    if (T->host) /* the host's arrays are the state itself */
        return dt_emsg_set(em, DT_EINVAL, "dt_gtrain_copy_start: the optimizer is in host "
                           "memory; its arrays need no copy");
    if ((rc = dt_gmodel_copy_begin(g, em)) < 0)
        return rc;
    if (P)
        DT_CUDA_TRY(em, cudaMemcpyAsync(P, T->P, nb, cudaMemcpyDeviceToHost, g->cst));
    if (M)
        DT_CUDA_TRY(em, cudaMemcpyAsync(M, T->M, mb, cudaMemcpyDeviceToHost, g->cst));
    if (V)
        DT_CUDA_TRY(em, cudaMemcpyAsync(V, T->V, mb, cudaMemcpyDeviceToHost, g->cst));
    return dt_gmodel_copy_end(g, em);
}

int dt_gtrain_grad_get(dt_gmodel_t *g, float *dst, dt_emsg_t *em)
{
    gtrain_t *T = g->tr;

    DT_CUDA_TRY(em, cudaMemcpyAsync(dst, T->sg ? T->G : T->G + T->moff,
                                    (size_t)T->mlen * sizeof(float), cudaMemcpyDeviceToHost,
                                    g->st));
    DT_CUDA_TRY(em, cudaStreamSynchronize(g->st));
    return 0;
}

int dt_gtrain_params_set(dt_gmodel_t *g, const float *P, dt_emsg_t *em)
{
    gtrain_t *T = g->tr;
    const size_t F = sizeof(float), half = 2;
    int rc;

    if (!T->host)
        return dt_emsg_set(em, DT_EINVAL, "dt_gtrain_params_set: the optimizer is on the device");
    if (T->sp) {
        /* P is the slice: its fp32 copy, which the gathers read, and its
         * compute-dtype weights */
        DT_CUDA_TRY(em, cudaMemcpyAsync(T->Ps, P, (size_t)T->mlen * F, cudaMemcpyHostToDevice,
                                        g->st));
        if ((rc = dt_cast_from_f32_cuda(g->dt, T->mlen, T->Ps, T->W, g->st, em)) < 0)
            return rc;
        DT_CUDA_TRY(em, cudaStreamSynchronize(g->st));
        return 0;
    }
    for (int i = 0; i < T->npf; i++)
        DT_CUDA_TRY(em, cudaMemcpyAsync(T->Pf + T->pf[i][1], P + T->pf[i][0],
                                        (size_t)T->pf[i][2] * F, cudaMemcpyHostToDevice, g->st));
    /* the compute-dtype weights, cast on the device by the kernel the
     * device's own update uses (element by element: a chunk's bits are
     * the whole's); each chunk's copy waits on the stream for the last
     * cast out of the staging buffer */
    for (int64_t off = 0; off < T->n; off += T->nstage) {
        int64_t len = T->n - off < T->nstage ? T->n - off : T->nstage;
        DT_CUDA_TRY(em, cudaMemcpyAsync(T->stage, P + off, (size_t)len * F,
                                        cudaMemcpyHostToDevice, g->st));
        if ((rc = dt_cast_from_f32_cuda(g->dt, len, T->stage, (char *)T->W + off * half, g->st,
                                        em)) < 0)
            return rc;
    }
    /* P is the caller's to change again once this returns */
    DT_CUDA_TRY(em, cudaStreamSynchronize(g->st));
    return 0;
}
