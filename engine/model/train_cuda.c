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
#include "engine/model/model.h" /* dt_model_slice */
#include "engine/model/model_cuda_impl.h"
#include "engine/attn/ring_cuda.h" /* dt_ring_attn_reserve */
#include "engine/model/train_cuda.h"
#include "engine/model/optim.h" /* dt_sumsq_parts */
#include "kernels/cpu/layers_cpu.h" /* dt_tokens_check */
#include "kernels/cuda/cuda_err.h"
#include "kernels/cuda/layers_cuda.h"
#include "kernels/cuda/train_cuda.h"

/* One layer's activations kept for the backward: what the attention
 * needs whole (q, k, v in the compute dtype, its output o and lse), and
 * without recompute the layer's input (fp32; with recompute it is the
 * saved one). Everything token by token (the norms, the products, RoPE,
 * the MLP) is made again in the backward, a tile of rows at a time. */
typedef struct tact {
    float *xin, *o, *lse;
    void *qb, *kb, *vb; /* compute dtype */
} tact_t;

typedef struct gtrain {
    dt_model_layout_t lo;
    int64_t n;
    int64_t moff, mlen; /* the moments kept: [moff, moff + mlen) of n (shard = optimizer) */
    float *P, *G, *M, *V;
    void *W;
    /* the optimizer in host memory (host = 1): no P, M, V on the device;
     * Pf the fp32 parameters the device reads as such (the embedding, then
     * each layer's two norm gains, then the final norm's; with sp their
     * parts in this rank's slice), pf their ranges (npf of them: offset in
     * the host's P, in Pf, length, offset in the flat array), and stage,
     * nstage floats through which the parameters come up to be cast into
     * W */
    int host;
    float *Pf, *stage;
    int64_t (*pf)[4];
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
    /* the head: per-row losses and argmaxes, the logits' gradient in the
     * compute dtype */
    void *dlb;
    double *rowloss, *part;
    int32_t *tok, *tgt, *amax;
    /* the embedding's gradient grouping, device and host */
    int32_t *etok, *erows, *h_etok, *h_erows, *h_amax;
    int64_t *estart, *h_estart;
    double *h_loss;
    /* the token-local parts in tiles of ROWS tokens (spec/model.h): the
     * model's h, t, q, k, v, g are a tile's (normed input, product,
     * q k v, SwiGLU output), tx, tx2 a tile's layer input and attention
     * residual, trstd its norm's rstd, thb, tob its normed input and
     * attention output in the dtype, ta, tb, tgb its gate and up products
     * (fp32) and SwiGLU product (dtype), da, db, dg their gradients.
     * Whole: dx (the residual stream's gradient), dob (the attention
     * output's, dtype); the attention's dq is the layer's o (the backward
     * takes delta from o before it writes dq), dk and dv live in the
     * model's x, which the backward no longer reads */
    float *dx, *dk, *dv, *da, *db, *dg, *tx, *tx2, *trstd, *ta, *tb;
    void *dyb, *dob, *thb, *tob, *tgb;
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
     * forward; with the optimizer on the host the fp32 parts come from
     * Pf. gu[0] holds the largest unit, gu[1] (gcap[1] floats) a layer's:
     * a larger unit (the embedding, an untied head) takes slot 0.
     * gh (sg with the optimizer on the host): no G on the device; each
     * unit's part of the sum, reduce-scattered in place in its buffer,
     * goes down on the stream gst to the caller's hG (mlen floats) as soon
     * as it is made (gev[s] its copy done), or with acc into hacc[s],
     * added into hG on the host once there (hadd[s]: offset, length). */
    int sg, sp, gh;
    int64_t U, gcap[2];
    float *gu[2], *ge, *rs, *nu[2];
    void *wu[2];
    int gslot, gcur, gpend[2];
    int64_t rsn;
    float *hG, *hacc[2];
    int64_t hadd[2][2];
    cudaStream_t gst;
    cudaEvent_t gev[2];
    int acc; /* this sequence's gradient adds to the step's (not its first) */
    /* dp = N > 1: rep the replicas' ring (opt->rep), slr the ring's
     * slicing (n, R, 0), sld the replicas' (n, R N, r N): a unit's ring
     * part (within ring slice r) is reduce-scattered around the ring in
     * place in its buffer, then across the replicas (rs2, rsn2 floats,
     * that level's scratch) into this rank's slice; a gather goes the
     * other way, the replicas' level into its place in the output first */
    dt_ring_t *rep;
    dt_comm_slicing_t slr, sld;
    float *rs2;
    int64_t rsn2;
} gtrain_t;

#define ROWS DT_GPU_ROWS


/* The training state's release: dt_gmodel_free's hook (tr_free). */
static void gtrain_free(dt_gmodel_t *g)
{
    gtrain_t *T = g->tr;

    /* a step that failed may leave collectives on the ring's stream
     * reading or writing what is freed here: they end first (a dead ring's
     * watchdog ends the wait) */
    for (int s = 0; (T->sg || T->sp) && g->ring && s < DT_RING_COLL_SLOTS; s++) {
        dt_emsg_t ignored = { 0 };
        if (dt_ring_coll_wait(g->ring, s, &ignored) < 0 ||
            (T->rep && dt_ring_coll_wait(T->rep, s, &ignored) < 0))
            break;
    }
    for (int l = 0; T->act && l < T->nact; l++) {
        tact_t *A = &T->act[l];
        void *ps[] = { A->xin, A->o, A->lse, A->qb, A->kb, A->vb };
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
    if (T->gst)
        (void)cudaStreamSynchronize(T->gst);
    for (int s = 0; s < 2; s++) {
        if (T->gev[s])
            cudaEventDestroy(T->gev[s]);
        if (T->hacc[s])
            cudaFreeHost(T->hacc[s]);
    }
    if (T->gst)
        cudaStreamDestroy(T->gst);
    void *ps[] = { T->P, T->G, T->M, T->V, T->W, T->Pf, T->stage, T->ta, T->tb, T->tgb,
                   T->saved, T->dlb, T->rowloss, T->part, T->tok, T->tgt, T->amax, T->etok,
                   T->erows, T->estart, T->dx, T->da, T->db, T->dg, T->tx,
                   T->tx2, T->trstd, T->dyb, T->dob, T->thb, T->tob, T->gu[0], T->gu[1],
                   T->ge, T->rs, T->rs2, T->nu[0], T->nu[1], T->wu[0], T->wu[1] };
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

/* The optimizer on the host: the fp32 parameters the device reads (the
 * embedding, each layer's two norm gains, the final norm's), with sp their
 * parts in this rank's slice, into T->pf; returns their floats. */
static int64_t f32_ranges(gtrain_t *T, const dt_model_cfg_t *cfg)
{
    int64_t at = 0;

    T->npf = 2 * cfg->layers + 2;
    T->pf = dt_xcalloc((size_t)T->npf, sizeof(*T->pf));
    for (int i = 0; i < T->npf; i++) {
        int l = (i - 1) / 2;
        int64_t a = i == 0                ? T->lo.tok_emb
                    : i == T->npf - 1     ? T->lo.final_norm
                    : (i - 1) % 2 == 0    ? T->lo.layer[l].attn_norm
                                          : T->lo.layer[l].mlp_norm;
        int64_t b = a + (i == 0 ? (int64_t)cfg->vocab * cfg->dim : cfg->dim);
        if (T->sp) {
            a = a > T->moff ? a : T->moff;
            b = b < T->moff + T->mlen ? b : T->moff + T->mlen;
            b = b > a ? b : a;
        }
        T->pf[i][0] = T->sp ? a - T->moff : a, T->pf[i][1] = at, T->pf[i][2] = b - a;
        T->pf[i][3] = a;
        at += b - a;
    }
    return at;
}

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
    T->gh = T->sg && T->host;
    T->U = dt_model_unit_max(cfg);
    T->gcap[0] = T->U;
    T->gcap[1] = dt_model_unit_layer(cfg);
    /* the ring's slices, and with dp the replicas' within ring slice r */
    const int Rr = dt_ring_size(ring), rr = dt_ring_rank(ring, 0);
    const int Nr = opt->rep ? dt_ring_size(opt->rep) : 1;
    T->rep = Nr > 1 ? opt->rep : NULL;
    T->slr = (dt_comm_slicing_t){ T->n, Rr, 0 };
    T->sld = (dt_comm_slicing_t){ T->n, Rr * Nr, rr * Nr };
    int64_t want_off, want_len;
    dt_model_slice(T->n, Rr, rr, Nr, T->rep ? dt_ring_rank(T->rep, 0) : 0, &want_off,
                   &want_len);
    if ((moff != 0 || mlen != T->n) && (moff != want_off || mlen != want_len)) {
        rc = dt_emsg_set(em, DT_EINVAL, "moments [%lld, +%lld): not this rank's slice "
                         "[%lld, +%lld) (ring rank %d of %d, replica of %d)", (long long)moff,
                         (long long)mlen, (long long)want_off, (long long)want_len, rr, Rr, Nr);
        goto fail;
    }
    const size_t nb = (size_t)T->n * F, mb = (size_t)mlen * F;
    if (T->gh && (T->hG = opt->host_grad) == NULL) {
        rc = dt_emsg_set(em, DT_EINVAL, "sharded gradients with the optimizer on the host "
                         "need the host's array for them (host_grad)");
        goto fail;
    }
    if (T->gh) {
        DT_CUDA_GOTO(em, rc, fail, cudaStreamCreateWithFlags(&T->gst, cudaStreamNonBlocking));
        for (int s = 0; s < 2; s++)
            DT_CUDA_GOTO(em, rc, fail,
                         cudaEventCreateWithFlags(&T->gev[s], cudaEventDisableTiming));
    }
    if (T->sg) {
        const int R = dt_ring_size(ring);
        /* a part is at most a unit: R of them at once, or less */
        T->rsn = R == 1 ? 0 : dt_model_gpu_rs_floats(cfg, R);
        T->rsn2 = T->rep ? dt_model_gpu_rs_floats(cfg, Nr) : 0;
        const dbuf_t sb[] = {
            { &T->gu[0], (size_t)T->gcap[0] * F }, { &T->gu[1], (size_t)T->gcap[1] * F },
            { &T->ge, cfg->tied ? (size_t)(Vv * d) * F : 1 },
            { &T->rs, (size_t)(T->rsn > 0 ? T->rsn : 1) * F },
            { &T->rs2, (size_t)(T->rsn2 > 0 ? T->rsn2 : 1) * F },
        };
        if ((rc = dt_gmodel_dalloc_all(sb, sizeof(sb) / sizeof(sb[0]), em)) < 0)
            goto fail;
    }
    if (T->sp) {
        /* the slice's own arrays; the units come into wu, nu */
        const int64_t nf = T->host ? f32_ranges(T, cfg) : 0;
        T->nstage = mlen < STAGE_FLOATS ? (mlen > 0 ? mlen : 1) : STAGE_FLOATS;
        const dbuf_t pb[] = {
            { &T->G, T->gh ? 1 : mb },
            { &T->W, (size_t)(mlen > 0 ? mlen : 1) * half },
            { T->host ? (void *)&T->Pf : (void *)&T->P, T->host ? (size_t)(nf + 1) * F : mb },
            { T->host ? (void *)&T->stage : (void *)&T->M,
              T->host ? (size_t)(T->nstage + 1) * F : mb },
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
        const int64_t at = f32_ranges(T, cfg);
        T->nstage = T->n < STAGE_FLOATS ? T->n : STAGE_FLOATS;
        const dbuf_t big[] = {
            { &T->G, T->gh ? 1 : T->sg ? mb : nb },
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
    for (int l = 0; l < T->nact; l++) {
        tact_t *A = &T->act[l];
        const dbuf_t a[] = {
            { &A->o, (size_t)(c * qd) * F },     { &A->lse, (size_t)(c * cfg->heads) * F },
            { &A->qb, (size_t)(c * qd) * half }, { &A->kb, (size_t)(c * kd) * half },
            { &A->vb, (size_t)(c * kd) * half },
            /* without recompute, the layer's input (last: left out) */
            { &A->xin, (size_t)(c * d) * F },
        };
        if ((rc = dt_gmodel_dalloc_all(a, sizeof(a) / sizeof(a[0]) - (recompute ? 1 : 0),
                                       em)) < 0)
            goto fail;
    }
    /* a tile's rows: ROWS, or every token when fewer */
    const int64_t mr = c < ROWS ? c : ROWS;
    /* the model's x holds the backward's dk and dv */
    const int64_t xw = d > 2 * kd ? d : 2 * kd;
    const dbuf_t bufs[] = {
        { &g->x, (size_t)(c * xw) * F },   { &T->dx, (size_t)(c * d) * F },
        { &T->dob, (size_t)(c * qd) * half },
        { &g->h, (size_t)(mr * d) * F },   { &g->t, (size_t)(mr * d) * F },
        { &g->q, (size_t)(mr * qd) * F },  { &g->k, (size_t)(mr * kd) * F },
        { &g->v, (size_t)(mr * kd) * F },  { &g->g, (size_t)(mr * f) * F },
        { &T->tx, (size_t)(mr * d) * F },  { &T->tx2, (size_t)(mr * d) * F },
        { &T->trstd, (size_t)mr * F },     { &T->ta, (size_t)(mr * f) * F },
        { &T->tb, (size_t)(mr * f) * F },  { &T->da, (size_t)(mr * f) * F },
        { &T->db, (size_t)(mr * f) * F },  { &T->dg, (size_t)(mr * f) * F },
        { &T->thb, (size_t)(mr * d) * half }, { &T->tob, (size_t)(mr * qd) * half },
        { &T->tgb, (size_t)(mr * f) * half }, { &T->dyb, (size_t)(mr * max3(d, qd, f)) * half },
        { &g->logits, (size_t)(HEAD_ROWS * Vv) * F }, { &T->dlb, (size_t)(HEAD_ROWS * Vv) * half },
        { &T->rowloss, (size_t)c * sizeof(double) },
        { &T->part, DT_SUMSQ_PARTS * sizeof(double) },
        { &T->tok, (size_t)c * 4 },        { &T->tgt, (size_t)c * 4 },
        { &T->amax, (size_t)c * 4 },       { &T->etok, (size_t)c * 4 },
        { &T->erows, (size_t)c * 4 },      { &T->estart, (size_t)(c + 1) * 8 },
    };
    if ((rc = dt_gmodel_dalloc_all(bufs, sizeof(bufs) / sizeof(bufs[0]), em)) < 0)
        goto fail;
    T->dk = g->x;
    T->dv = g->x + c * kd;
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

/* Rows [r0, r0 + n) of the c tokens, in tiles of ROWS. */
#define FOR_TILES(c, r0, n)                                                                 \
    for (int64_t r0 = 0, n = (c) < ROWS ? (c) : ROWS; r0 < (c);                             \
         r0 += n, n = (c) - r0 < ROWS ? (c) - r0 : ROWS)

/* A tile's SwiGLU (n rows): the gate and up products of the normed input
 * hb (dtype) into ta, tb, their product into tgb (the dtype, one fused
 * launch); the forward runs it, and the backward again (the
 * same kernels on the same input: the same bits). */
static int mlp_tile_fwd(dt_gmodel_t *g, const glayer_t *L, const void *hb, int64_t n,
                        dt_emsg_t *em)
{
    gtrain_t *T = g->tr;
    const int64_t d = g->cfg.dim, f = g->cfg.ffn;
    int rc;

    if ((rc = mm(g, n, (int)d, (int)f, hb, L->w1, T->ta, em)) < 0 ||
        (rc = mm(g, n, (int)d, (int)f, hb, L->w3, T->tb, em)) < 0)
        return rc;
    return dt_swiglu_fwd_half_cuda(n, (int)f, T->ta, T->tb, g->dt, T->tgb, g->st, em);
}

/* rmsnorm(x) of a tile (n rows) with gain w into T->thb (dtype), its
 * rstd into T->trstd; with res, x += res first (the residual add before
 * the norm). One fused launch. */
static int norm_tile(dt_gmodel_t *g, float *x, const float *res, const float *w, int64_t n,
                     dt_emsg_t *em)
{
    gtrain_t *T = g->tr;

    return dt_rmsnorm_fwd_half_cuda(n, (int)g->cfg.dim, g->cfg.norm_eps, x, res, w, g->dt,
                                    T->thb, T->trstd, g->st, em);
}

/* Layer l's input, rows [r0, r0 + n), fp32: kept (without recompute), or
 * saved in the checkpoint dtype on the device or in its slot (once
 * there: input_ready), cast into T->tx when bf16. */
static const float *xin_tile(dt_gmodel_t *g, int l, int64_t r0, int64_t n, dt_emsg_t *em,
                             int *rc)
{
    gtrain_t *T = g->tr;
    const int64_t d = g->cfg.dim;
    const size_t row = (size_t)(g->c * d) * (T->ck16 ? 2 : sizeof(float));
    const char *src;

    *rc = 0;
    if (T->act[l % T->nact].xin != NULL)
        return T->act[l % T->nact].xin + r0 * d;
    src = T->off_act ? (const char *)T->slot[l % 2] : (const char *)T->saved + (size_t)l * row;
    if (!T->ck16)
        return (const float *)(const void *)src + r0 * d;
    *rc = dt_cast_to_f32_cuda(DT_BF16, n * d, src + (size_t)(r0 * d) * 2, T->tx, g->st, em);
    return T->tx;
}

/* Layer l's attention inputs from its input x (rows by tiles; x NULL:
 * the saved input, xin_tile): q, k, v of each tile, RoPE'd, into the
 * kept qb, kb, vb; then the attention's o and lse. */
static int attn_in(dt_gmodel_t *g, const dt_attn_spec_t *attn, int l, const float *x,
                   dt_emsg_t *em)
{
    const dt_model_cfg_t *cf = &g->cfg;
    gtrain_t *T = g->tr;
    const int64_t c = g->c, d = cf->dim, D = dt_model_head_dim(cf), H = cf->heads,
                  Hkv = cf->kv_heads, qd = H * D, kd = Hkv * D;
    const glayer_t *L = &g->layer[l];
    tact_t *A = &T->act[l % T->nact];
    dt_dtype_t dt = g->dt;
    int rc;

    FOR_TILES(c, r0, n) {
        rc = 0;
        const float *xt = x ? x + r0 * d : xin_tile(g, l, r0, n, em, &rc);
        if (xt == NULL || rc < 0 ||
            (rc = norm_tile(g, (float *)xt, NULL, L->attn_norm, n, em)) < 0 ||
            (rc = mm(g, n, (int)d, (int)qd, T->thb, L->wq, g->q, em)) < 0 ||
            (rc = mm(g, n, (int)d, (int)kd, T->thb, L->wk, g->k, em)) < 0 ||
            (rc = mm(g, n, (int)d, (int)kd, T->thb, L->wv, g->v, em)) < 0 ||
            (rc = dt_rope_qkv_half_cuda(n, (int)H, (int)Hkv, (int)D, g->pos + r0, &cf->rope,
                                        g->q, g->k, g->v, dt, (char *)A->qb + r0 * qd * 2,
                                        (char *)A->kb + r0 * kd * 2, (char *)A->vb + r0 * kd * 2,
                                        g->st, em)) < 0)
            return rc < 0 ? rc : DT_EINVAL;
    }
    /* the ring's streams wait for these launches (an event, not the host) */
    DT_CUDA_TRY(em, cudaEventRecord(g->ev_ring, g->st));
    dt_ring_io_t io = { .q = A->qb, .k = A->kb, .v = A->vb, .o = A->o, .lse = A->lse,
                        .ready = g->ev_ring };
    dt_attn_spec_t la;
    return dt_ring_attn_fwd(g->ring, dt_attn_layer_spec(attn, l, &la), dt, &io, NULL, em);
}

/* Block l forward on g->x, keeping its activations (the sequence of
 * dt_gmodel_layer_fwd): the attention's inputs and output whole, then
 * tile by tile the output projection and the MLP, in place. */
static int tlayer_fwd(dt_gmodel_t *g, const dt_attn_spec_t *attn, int l, dt_emsg_t *em)
{
    const dt_model_cfg_t *cf = &g->cfg;
    gtrain_t *T = g->tr;
    const int64_t c = g->c, d = cf->dim, qd = cf->heads * dt_model_head_dim(cf), f = cf->ffn;
    const glayer_t *L = &g->layer[l];
    tact_t *A = &T->act[l % T->nact];
    int rc;

    if (A->xin)
        DT_CUDA_TRY(em, cudaMemcpyAsync(A->xin, g->x, (size_t)(c * d) * sizeof(float),
                                        cudaMemcpyDeviceToDevice, g->st));
    if ((rc = attn_in(g, attn, l, g->x, em)) < 0)
        return rc;
    FOR_TILES(c, r0, n) {
        float *xt = g->x + r0 * d;
        if ((rc = dt_cast_from_f32_cuda(g->dt, n * qd, A->o + r0 * qd, T->tob, g->st, em)) < 0 ||
            (rc = mm(g, n, (int)qd, (int)d, T->tob, L->wo, g->t, em)) < 0 ||
            (rc = norm_tile(g, xt, g->t, L->mlp_norm, n, em)) < 0 ||
            (rc = mlp_tile_fwd(g, L, T->thb, n, em)) < 0 ||
            (rc = mm(g, n, (int)f, (int)d, T->tgb, L->w2, g->t, em)) < 0 ||
            (rc = dt_add_f32_cuda(n * d, g->t, xt, g->st, em)) < 0)
            return rc;
    }
    return 0;
}

/* Block l backward: T->dx holds the gradient of the block's output and
 * becomes that of its input; the weights' gradients are ADDED to Gu, the
 * gradient from parameter g0 on (the whole array's: g0 = 0; a unit's
 * buffer: its first parameter). The layer's attention activations are
 * there (kept, or made again by attn_in); each tile's residual, norms
 * and MLP products are made again from its input. */
static int tlayer_bwd(dt_gmodel_t *g, const dt_attn_spec_t *attn, int l, float *Gu, int64_t g0,
                      dt_emsg_t *em)
{
    const dt_model_cfg_t *cf = &g->cfg;
    gtrain_t *T = g->tr;
    const dt_model_layer_off_t *O = &T->lo.layer[l];
    const int64_t c = g->c, d = cf->dim, D = dt_model_head_dim(cf), H = cf->heads,
                  Hkv = cf->kv_heads, qd = H * D, kd = Hkv * D, f = cf->ffn;
    const size_t F = sizeof(float);
    const glayer_t *L = &g->layer[l];
    const tact_t *A = &T->act[l % T->nact];
    float *G = Gu;
    /* the layer's offsets from g0 (the unit's start) */
    const int64_t wq = O->wq - g0, wk = O->wk - g0, wv = O->wv - g0, wo = O->wo - g0,
                  w1 = O->w1 - g0, w2 = O->w2 - g0, w3 = O->w3 - g0;
    const int64_t an = O->attn_norm - g0, mn = O->mlp_norm - g0;
    int rc;

    /* x2 = xin + Wo o, x = x2 + W2 swiglu(W1 h2, W3 h2), h2 = norm(x2):
     * the MLP's backward and the residual, then the output projection's,
     * whose input gradient goes whole to the attention */
    FOR_TILES(c, r0, n) {
        float *dxt = T->dx + r0 * d, *dh = g->h;
        const float *xt = xin_tile(g, l, r0, n, em, &rc);
        if (rc < 0)
            return rc;
        DT_CUDA_TRY(em, cudaMemcpyAsync(T->tx2, xt, (size_t)(n * d) * F,
                                        cudaMemcpyDeviceToDevice, g->st));
        if ((rc = dt_cast_from_f32_cuda(g->dt, n * qd, A->o + r0 * qd, T->tob, g->st, em)) < 0 ||
            (rc = mm(g, n, (int)qd, (int)d, T->tob, L->wo, g->t, em)) < 0 ||
            (rc = norm_tile(g, T->tx2, g->t, L->mlp_norm, n, em)) < 0 ||
            (rc = mlp_tile_fwd(g, L, T->thb, n, em)) < 0 ||
            (rc = mm_bwd(g, n, (int)f, (int)d, T->tgb, L->w2, dxt, T->dg, G + w2, em)) < 0 ||
            (rc = dt_swiglu_bwd_cuda(n, (int)f, T->ta, T->tb, T->dg, T->da, T->db, g->st,
                                     em)) < 0 ||
            (rc = mm_bwd(g, n, (int)d, (int)f, T->thb, L->w1, T->da, dh, G + w1, em)) < 0 ||
            (rc = mm_bwd(g, n, (int)d, (int)f, T->thb, L->w3, T->db, g->t, G + w3, em)) < 0 ||
            (rc = dt_add_f32_cuda(n * d, g->t, dh, g->st, em)) < 0 ||
            (rc = dt_rmsnorm_bwd_cuda(n, (int)d, T->tx2, L->mlp_norm, T->trstd, dh, g->t,
                                      G + mn, g->st, em)) < 0 ||
            (rc = dt_add_f32_cuda(n * d, g->t, dxt, g->st, em)) < 0 ||
            (rc = mm_bwd(g, n, (int)qd, (int)d, T->tob, L->wo, dxt, g->q, G + wo, em)) < 0 ||
            (rc = dt_cast_from_f32_cuda(g->dt, n * qd, g->q, (char *)T->dob + r0 * qd * 2,
                                        g->st, em)) < 0)
            return rc;
    }
    /* the attention: dq into o (read for delta first), dk, dv into x */
    DT_CUDA_TRY(em, cudaEventRecord(g->ev_ring, g->st));
    float *dq = A->o;
    dt_ring_io_t io = { .q = A->qb, .k = A->kb, .v = A->vb, .o = A->o, .lse = A->lse,
                        .dout = T->dob, .dq = dq, .dk = T->dk, .dv = T->dv,
                        .ready = g->ev_ring };
    dt_attn_spec_t la;
    if ((rc = dt_ring_attn_bwd(g->ring, dt_attn_layer_spec(attn, l, &la), g->dt, &io, NULL,
                               em)) < 0)
        return rc;
    /* q, k, v = rope(Wq h1), rope(Wk h1), Wv h1, h1 = norm(xin) */
    FOR_TILES(c, r0, n) {
        float *dxt = T->dx + r0 * d, *dh = g->h, *dqt = dq + r0 * qd, *dkt = T->dk + r0 * kd,
              *dvt = T->dv + r0 * kd;
        const float *xt = xin_tile(g, l, r0, n, em, &rc);
        if (rc < 0 ||
            (rc = dt_rope_bwd_cuda(n, (int)H, (int)D, g->pos + r0, &cf->rope, dqt, g->st,
                                   em)) < 0 ||
            (rc = dt_rope_bwd_cuda(n, (int)Hkv, (int)D, g->pos + r0, &cf->rope, dkt, g->st,
                                   em)) < 0 ||
            (rc = norm_tile(g, (float *)xt, NULL, L->attn_norm, n, em)) < 0 ||
            (rc = mm_bwd(g, n, (int)d, (int)qd, T->thb, L->wq, dqt, dh, G + wq, em)) < 0 ||
            (rc = mm_bwd(g, n, (int)d, (int)kd, T->thb, L->wk, dkt, g->t, G + wk, em)) < 0 ||
            (rc = dt_add_f32_cuda(n * d, g->t, dh, g->st, em)) < 0 ||
            (rc = mm_bwd(g, n, (int)d, (int)kd, T->thb, L->wv, dvt, g->t, G + wv, em)) < 0 ||
            (rc = dt_add_f32_cuda(n * d, g->t, dh, g->st, em)) < 0 ||
            (rc = dt_rmsnorm_bwd_cuda(n, (int)d, xt, L->attn_norm, T->trstd, dh, g->t, G + an,
                                      g->st, em)) < 0 ||
            (rc = dt_add_f32_cuda(n * d, g->t, dxt, g->st, em)) < 0)
            return rc;
    }
    return 0;
}

/* The final norm, the LM head and the loss in tiles of rows, each
 * tile's gradient through the head (into g->t) and the final norm into
 * T->dx; the LM head's gradient ADDED to gl, the final norm's to gf. */
static int thead(dt_gmodel_t *g, float scale, float *gl, float *gf, dt_emsg_t *em)
{
    const dt_model_cfg_t *cf = &g->cfg;
    gtrain_t *T = g->tr;
    const int64_t c = g->c, d = cf->dim, V = cf->vocab;
    int rc;

    FOR_TILES(c, r0, n) {
        const float *xt = g->x + r0 * d;
        if ((rc = norm_tile(g, (float *)xt, NULL, g->final_norm, n, em)) < 0 ||
            (rc = mm(g, n, (int)d, (int)V, T->thb, g->lm_head, g->logits, em)) < 0 ||
            (rc = dt_xent_cuda(n, (int)V, g->logits, T->tgt + r0, scale, T->rowloss + r0,
                               T->amax + r0, g->st, em)) < 0 ||
            (rc = dt_cast_from_f32_cuda(g->dt, n * V, g->logits, T->dlb, g->st, em)) < 0 ||
            (rc = dt_linear_bwd_cuda(g->blas, g->dt, n, (int)d, (int)V, T->thb, g->lm_head,
                                     T->dlb, g->t, gl, g->st, em)) < 0 ||
            (rc = dt_rmsnorm_bwd_cuda(n, (int)d, xt, g->final_norm, T->trstd, g->t,
                                      T->dx + r0 * d, gf, g->st, em)) < 0)
            return rc;
    }
    return 0;
}

/* ---- sharded units (shard = gradients, parameters) ----------------------- */

/* dp: [*ra, *rb), the part of [a, b) in this rank's ring slice (what the
 * replicas at its ring rank hold between them; empty: *ra == *rb). */
static void ring_part(const gtrain_t *T, int64_t a, int64_t b, int64_t *ra, int64_t *rb)
{
    const int64_t n = T->n, N = T->sld.S / T->slr.S, r = T->sld.s0 / N;
    const int64_t s0 = n * r / T->slr.S, s1 = n * (r + 1) / T->slr.S;

    *ra = a > s0 ? a : s0;
    *rb = b < s1 ? b : s1;
    if (*rb < *ra)
        *rb = *ra;
}

/* [a, b) of the flat array gathered from every rank's slice (elem bytes
 * an element) into out, on the ring's communication stream (range slot
 * `slot`): this rank's part from the compute-dtype slice W (elem 2) or
 * the fp32 parameters (elem 4: the slice P, or on the host's optimizer
 * the range of Pf that holds it). */
static int gather(dt_gmodel_t *g, int64_t a, int64_t b, size_t elem, void *out, int slot,
                  dt_emsg_t *em)
{
    gtrain_t *T = g->tr;
    const int64_t pa = a > T->moff ? a : T->moff;
    const char *mine = elem == 2 ? (const char *)T->W : T->host ? (const char *)T->Pf
                                                                : (const char *)T->P;

    if (pa < T->moff + T->mlen && (elem == 2 || !T->host))
        mine += (size_t)(pa - T->moff) * elem;
    else if (pa < T->moff + T->mlen)
        for (int i = 0; i < T->npf; i++)
            if (pa >= T->pf[i][3] && pa < T->pf[i][3] + T->pf[i][2]) {
                mine = (const char *)(T->Pf + T->pf[i][1] + (pa - T->pf[i][3]));
                break;
            }
    if (!T->rep)
        return dt_ring_gather_range(g->ring, &T->slr, a, b, elem, mine, out, slot, em);
    /* dp: the ring part across the replicas into its place in out, then
     * around the ring from there */
    int64_t ra, rb;
    int rc;
    ring_part(T, a, b, &ra, &rb);
    char *mid = (char *)out + (size_t)(ra - a) * elem;
    if ((rc = dt_ring_gather_range(T->rep, &T->sld, ra, rb, elem, mine, mid, slot, em)) < 0 ||
        (rc = dt_ring_coll_chain(T->rep, slot, g->ring, em)) < 0)
        return rc;
    return dt_ring_gather_range(g->ring, &T->slr, a, b, elem, mid, out, slot, em);
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
    int64_t a, b;
    int rc;

    if (u <= cf->layers) {
        const dt_model_layer_off_t *O = &T->lo.layer[u - 1];
        dt_model_unit_range(cf, &T->lo, u, &a, &b);
        if ((rc = gather(g, a, b, 2, T->wu[s], s, em)) < 0 ||
            (rc = gather(g, O->attn_norm, O->attn_norm + d, 4, T->nu[s], s, em)) < 0)
            return rc;
        return gather(g, O->mlp_norm, O->mlp_norm + d, 4, T->nu[s] + d, s, em);
    }
    a = T->lo.lm_head;
    b = a + (int64_t)cf->vocab * d;
    if ((rc = gather(g, a, b, 2, T->wu[s], s, em)) < 0)
        return rc;
    return gather(g, T->lo.final_norm, T->lo.final_norm + d, 4, T->nu[s], s, em);
}

/* shard = parameters: the weights of position k (wseq) are there once
 * their gathers are done: the layer's (or the head's) pointers into the
 * slot; then the next position's gathers start into the other slot,
 * waiting on the device for the model's stream to be done with it. Not
 * sharded: nothing. */
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
    /* the other slot's last reader is queued on the model's stream: the
     * gathers (dp: across the replicas first) wait for it on the device */
    if ((rc = dt_ring_coll_after(T->rep ? T->rep : g->ring, g->st, em)) < 0)
        return rc;
    return wunit_fetch(g, wseq(L, k + 1), (k + 1) % 2, em);
}

/* shard = gradients: slot s free again: its last reduce-scatter done
 * and, the gradient going to the host, its copy down done and added. */
static int gslot_retire(dt_gmodel_t *g, int s, dt_emsg_t *em)
{
    gtrain_t *T = g->tr;
    int rc;

    if (!T->gpend[s])
        return 0;
    /* with dp the replicas' level ran after the ring's */
    if ((rc = dt_ring_coll_wait(T->rep ? T->rep : g->ring, 2 + s, em)) < 0)
        return rc;
    T->gpend[s] = 0;
    if (!T->gh)
        return 0;
    DT_CUDA_TRY(em, cudaEventSynchronize(T->gev[s]));
    /* the device's acc, __fadd_rn(dst, sum), is this fp32 addition */
    dt_grad_accumulate(T->hadd[s][1], T->hG + T->hadd[s][0], T->hacc[s]);
    T->hadd[s][1] = 0;
    return 0;
}

/* shard = gradients: the slot the next unit of len floats uses (the
 * next one, or slot 0 when only it holds so many), free: T->gcur. */
static int gslot_take(dt_gmodel_t *g, int64_t len, dt_emsg_t *em)
{
    gtrain_t *T = g->tr;
    const int s = len > T->gcap[T->gslot] ? 0 : T->gslot;

    T->gcur = s;
    return gslot_retire(g, s, em);
}

/* shard = gradients: where unit u's gradient is made: a free slot,
 * zeroed; *base its first parameter. */
static int gunit_begin(dt_gmodel_t *g, int u, float **buf, int64_t *base, dt_emsg_t *em)
{
    gtrain_t *T = g->tr;
    int64_t a, b;
    int rc;

    dt_model_unit_range(&g->cfg, &T->lo, u, &a, &b);
    if ((rc = gslot_take(g, b - a, em)) < 0)
        return rc;
    DT_CUDA_TRY(em, cudaMemsetAsync(T->gu[T->gcur], 0, (size_t)(b - a) * sizeof(float), g->st));
    *buf = T->gu[T->gcur];
    *base = a;
    return 0;
}

/* shard = gradients: unit u's gradient in buf is complete on the model's
 * stream: its sum over the ranks goes to this rank's part of G (added
 * with acc) on the communication stream, in the slot taken (T->gcur);
 * the next unit's backward runs meanwhile. The gradient going to the
 * host: the sum is made in place in buf, then copied down on gst. */
static int gunit_end(dt_gmodel_t *g, int u, float *buf, dt_emsg_t *em)
{
    gtrain_t *T = g->tr;
    const int s = T->gcur;
    int64_t a, b;
    int rc;

    dt_model_unit_range(&g->cfg, &T->lo, u, &a, &b);
    const int64_t pa = a > T->moff ? a : T->moff, end = T->moff + T->mlen;
    const int64_t len = (b < end ? b : end) - pa;
    float *mine = T->gh ? buf + (pa - a) : T->G + (pa < end ? pa - T->moff : 0);
    /* buf is complete once the model's stream gets there: the
     * reduce-scatter (around the ring first) waits for it on the device */
    if ((rc = dt_ring_coll_after(g->ring, g->st, em)) < 0)
        return rc;
    if (T->rep) {
        /* dp: the ring part's sum in place, then across the replicas */
        int64_t ra, rb;
        ring_part(T, a, b, &ra, &rb);
        float *mid = buf + (ra - a);
        if ((rc = dt_ring_reduce_scatter_range(g->ring, &T->slr, a, b, buf, mid, 0, T->rs,
                                               T->rsn, 2 + s, em)) < 0 ||
            (rc = dt_ring_coll_chain(g->ring, 2 + s, T->rep, em)) < 0 ||
            (rc = dt_ring_reduce_scatter_range(T->rep, &T->sld, ra, rb, mid, mine,
                                               T->gh ? 0 : T->acc, T->rs2, T->rsn2, 2 + s,
                                               em)) < 0)
            return rc;
    } else if ((rc = dt_ring_reduce_scatter_range(g->ring, &T->slr, a, b, buf, mine,
                                                  T->gh ? 0 : T->acc, T->rs, T->rsn, 2 + s,
                                                  em)) < 0) {
        return rc;
    }
    T->gpend[s] = 1;
    T->gslot = s ^ 1;
    if (!T->gh || len <= 0)
        return 0;
    float *dst = T->hG + (pa - T->moff);
    if (T->acc) {
        if (T->hacc[s] == NULL) {
            const int64_t most = T->U < T->mlen ? T->U : T->mlen;
            if (cudaHostAlloc((void **)&T->hacc[s], (size_t)most * sizeof(float),
                              cudaHostAllocDefault) != cudaSuccess) {
                (void)cudaGetLastError();
                T->hacc[s] = NULL;
                return dt_emsg_set(em, DT_ENOMEM, "no %.2f GiB of page-locked host memory to "
                                   "add a sequence's gradient to the step's",
                                   (double)most * 4 / (1024.0 * 1024 * 1024));
            }
        }
        dst = T->hacc[s];
        T->hadd[s][0] = pa - T->moff;
        T->hadd[s][1] = len;
    }
    if ((rc = dt_ring_coll_then(T->rep ? T->rep : g->ring, 2 + s, T->gst, em)) < 0)
        return rc;
    DT_CUDA_TRY(em, cudaMemcpyAsync(dst, mine, (size_t)len * sizeof(float),
                                    cudaMemcpyDeviceToHost, T->gst));
    DT_CUDA_TRY(em, cudaEventRecord(T->gev[s], T->gst));
    return 0;
}

/* shard = gradients: every reduce-scatter (and copy down) in flight done. */
static int gunit_drain(dt_gmodel_t *g, dt_emsg_t *em)
{
    int rc;

    for (int s = 0; s < 2; s++)
        if ((rc = gslot_retire(g, s, em)) < 0)
            return rc;
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

/* Offloaded: layer l's input in its slot for what the model's stream
 * queues next (xin_tile reads it there through the layer's backward). */
static int input_ready(dt_gmodel_t *g, int l, dt_emsg_t *em)
{
    gtrain_t *T = g->tr;

    if (T->off_act)
        DT_CUDA_TRY(em, cudaStreamWaitEvent(g->st, T->ev_in[l % 2], 0));
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
        /* after the last step's update, on the device */
        if ((rc = dt_ring_coll_after(T->rep ? T->rep : g->ring, g->st, em)) < 0)
            return rc;
        if ((rc = gather(g, a, b, 4, T->gu[0], 2, em)) < 0 ||
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
        /* recompute: layer l's attention activations again from its saved
         * input (the same kernels on the same input: the same activations
         * to the bit; with bf16 inputs, from the rounded input), which the
         * backward reads in place; offloaded, the next one's input comes
         * up meanwhile */
        if ((rc = wunit_use(g, 2 * L - l, em)) < 0 ||
            (T->sg && (rc = gunit_begin(g, l + 1, &Gu, &gb, em)) < 0))
            return rc;
        if (keep) {
            if ((rc = input_ready(g, l, em)) < 0 ||
                (T->off_act && l > 0 && (rc = input_fetch(g, l - 1, em)) < 0) ||
                (rc = attn_in(g, attn, l, NULL, em)) < 0)
                return rc;
        }
        if ((rc = tlayer_bwd(g, attn, l, Gu, gb, em)) < 0 ||
            (T->sg && (rc = gunit_end(g, l + 1, Gu, em)) < 0))
            return rc;
    }
    float *ge = T->G + T->lo.tok_emb;
    if (T->sg && cf->tied) {
        ge = T->ge;
        if ((rc = gslot_take(g, 0, em)) < 0)
            return rc;
    } else if (T->sg && (rc = gunit_begin(g, 0, &ge, &gb, em)) < 0)
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
    if (T->gh) {
        /* on the host already (gunit_drain): the kernel's sums there */
        dt_sumsq_parts(T->mlen, T->hG, part);
        for (int i = 0; i < DT_SUMSQ_PARTS; i++)
            s += part[i];
        *sumsq = s;
        return 0;
    }
    /* sharded gradients were summed unit by unit (gunit_end) */
    if (!T->sg && dt_ring_size(g->ring) > 1 &&
        (rc = dt_ring_allreduce_sum_f32(g->ring, &T->G, (size_t)T->n, em)) < 0)
        return rc;
    /* dp: then across the replicas (each one's addends divided by N) */
    if (!T->sg && T->rep && (rc = dt_ring_allreduce_sum_f32(T->rep, &T->G, (size_t)T->n, em)) < 0)
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
        /* dp: across the replicas first (the ring slice), then around */
        DT_CUDA_TRY(em, cudaStreamSynchronize(g->st));
        if ((T->rep && (rc = dt_ring_allgather_slices_f32(T->rep, &T->P, &T->sld, em)) < 0) ||
            (rc = dt_ring_allgather_slices_f32(g->ring, &T->P, &T->slr, em)) < 0)
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

    if (T->gh) { /* streamed down during the backward */
        if (dst != T->hG)
            memcpy(dst, T->hG, (size_t)T->mlen * sizeof(float));
        return 0;
    }
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
    /* shard = parameters: P is the slice, and so are W and the ranges */
    const int64_t n = T->sp ? T->mlen : T->n;
    for (int i = 0; i < T->npf; i++)
        DT_CUDA_TRY(em, cudaMemcpyAsync(T->Pf + T->pf[i][1], P + T->pf[i][0],
                                        (size_t)T->pf[i][2] * F, cudaMemcpyHostToDevice, g->st));
    /* the compute-dtype weights, cast on the device by the kernel the
     * device's own update uses (element by element: a chunk's bits are
     * the whole's); each chunk's copy waits on the stream for the last
     * cast out of the staging buffer */
    for (int64_t off = 0; off < n; off += T->nstage) {
        int64_t len = n - off < T->nstage ? n - off : T->nstage;
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

int dt_gtrain_set_pos(dt_gmodel_t *g, const int64_t *pos, dt_emsg_t *em)
{
    DT_CUDA_TRY(em, cudaMemcpyAsync(g->pos, pos, (size_t)g->c * sizeof(int64_t),
                                    cudaMemcpyHostToDevice, g->st));
    DT_CUDA_TRY(em, cudaStreamSynchronize(g->st));
    return 0;
}
