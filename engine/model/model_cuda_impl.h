/* SPDX-License-Identifier: MIT
 *
 * Inside the GPU model: struct dt_gmodel and the helpers that
 * engine/model/model_cuda.c (the model's shell, the forward, the copies to
 * the host) defines and engine/model/train_cuda.c (dt_gtrain_*) builds on.
 * Nothing here is part of the model's API (engine/model/model_cuda.h).
 * Calls go one way, train_cuda.c to model_cuda.c: dt_gmodel_free releases
 * the training state through the hook tr_free that dt_gtrain_new sets.
 *
 * Thread: a model is used by one host thread at a time.
 */
#ifndef DT_ENGINE_MODEL_CUDA_IMPL_H
#define DT_ENGINE_MODEL_CUDA_IMPL_H

#include <stddef.h>
#include <stdint.h>

#include <cuda_runtime_api.h>

#include "common/err.h"
#include "engine/model/model_cuda.h"
#include "kernels/cuda/layers_cuda.h"

/* Rows of the LM head per chunk: the device holds (HEAD_ROWS, V) logits. */
#define HEAD_ROWS DT_GPU_HEAD_ROWS

/* One layer's weights on the device: matrices in the compute dtype, the
 * norm gains fp32. */
typedef struct glayer {
    float *attn_norm, *mlp_norm;
    void *wq, *wk, *wv, *wo, *w1, *w3, *w2;
} glayer_t;

/* The model: what both kinds hold (a training model's layer weights are
 * views into its state's arrays), and tr, the training state. */
struct dt_gmodel {
    dt_model_cfg_t cfg;
    int64_t c;
    dt_dtype_t dt;
    dt_ring_t *ring;
    cudaStream_t st;
    dt_blas_t *blas;
    glayer_t *layer;
    float *final_norm;
    void *lm_head;
    int64_t *pos; /* (c) */
    /* activations of one layer */
    float *x, *h, *rstd, *q, *k, *v, *o, *lse, *t, *a, *b, *g;
    void *hb, *qb, *kb, *vb; /* dtype copies: matrix and attention inputs */
    float *logits;           /* (HEAD_ROWS, V) */
    struct gtrain *tr;       /* training state (dt_gtrain_new), or NULL */
    void (*tr_free)(dt_gmodel_t *g); /* its release, set with it: dt_gmodel_free's hook */
    /* copies to the host that overlap compute (dt_gmodel_copy_*): their
     * stream, the event marking what they copy, their completion */
    cudaStream_t cst;
    cudaEvent_t ev_mark, ev_copy;
    int copying;
    /* the attention's inputs made on st: the ring's streams wait for it, so
     * the host need not (dt_ring_io_t.ready) */
    cudaEvent_t ev_ring;
};

/* Device buffers to allocate: where the pointer goes, and bytes. */
typedef struct dbuf {
    void *p;
    size_t n;
} dbuf_t;

static inline int64_t max3(int64_t a, int64_t b, int64_t c)
{
    int64_t m = a > b ? a : b;
    return m > c ? m : c;
}

/* A model's shell for c tokens on the ring: the checks both kinds make
 * (dtype bf16 or fp16, one local rank), its streams, the copies' events
 * and its cuBLASLt handle; no weights, no buffers, no training state.
 * Free with dt_gmodel_free. */
int dt_gmodel_begin(const dt_model_cfg_t *cfg, int64_t c, dt_dtype_t dtype, dt_ring_t *ring,
                    dt_gmodel_t **out, dt_emsg_t *em);

/* n bytes on the device into *p (a pointer's address; at least 1 byte), and
 * each of nb such buffers in turn; the first failure is returned and what
 * was allocated stays for the caller's dt_gmodel_free. */
int dt_gmodel_dalloc(void *p, size_t n, dt_emsg_t *em);
int dt_gmodel_dalloc_all(const dbuf_t *b, size_t nb, dt_emsg_t *em);

/* A copy to the host on the copy stream: _begin orders it after
 * everything queued so far on the model's stream (waiting for an earlier
 * copy first), the caller queues its cudaMemcpyAsync on g->cst, _end
 * records its completion for what waits on it (dt_gmodel_copy_wait, the
 * next write into the source). */
int dt_gmodel_copy_begin(dt_gmodel_t *g, dt_emsg_t *em);
int dt_gmodel_copy_end(dt_gmodel_t *g, dt_emsg_t *em);

#endif /* DT_ENGINE_MODEL_CUDA_IMPL_H */
