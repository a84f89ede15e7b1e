/* SPDX-License-Identifier: MIT
 *
 * The LLaMA-3 model on the GPU: the forward (dt_gmodel_*,
 * engine/model/model_cuda.c) and training (dt_gtrain_*,
 * engine/model/train_cuda.c); their shared state is
 * engine/model/model_cuda_impl.h, not part of this API.
 *
 * The forward, one device per rank, context parallel:
 * the layer sequence of engine/model/model.c (RMSNorm, Q/K/V projections,
 * RoPE with fp64 angles, the ring or dilated attention of
 * engine/attn/ring_cuda.h, output projection, residual, RMSNorm, SwiGLU
 * MLP, residual; final RMSNorm and LM head) on the kernels of
 * kernels/cuda/layers_cuda.h. What `dtengine prefill --device cuda` runs.
 *
 * Precision: the hidden state, norms, RoPE and SwiGLU are fp32; the
 * inputs of every matrix product (activations and weights) and of the
 * attention are rounded to the compute dtype (bf16 or fp16), with fp32
 * accumulation and fp32 outputs. The weights are uploaded once, rounded,
 * from the fp32 parameter array of engine/model/model.h's layout.
 *
 * Training (dt_gtrain_*): the whole step on the device as dt_model_step
 * runs it on the CPU: the embedding, every layer's forward with its
 * activations kept, the LM head and cross-entropy in row chunks with their
 * gradient, the backward of every layer (the ring's backward for the
 * attention), the embedding's gradient; fp32 master parameters, gradients
 * and AdamW moments on the device, the compute-dtype copy of the weights
 * remade after every update; gradients summed over the ring (NCCL), the
 * norm for clipping, AdamW (kernels/cuda/train_cuda.h). The caller keeps
 * the host copies (checkpoints) and does the MPI agreement.
 *
 * Not here: the prefill's embedding (the caller uploads the embedded
 * rows), its loss (the caller computes it from the logits: dt_model_xent),
 * data, checkpoints' files.
 */
#ifndef DT_ENGINE_MODEL_CUDA_H
#define DT_ENGINE_MODEL_CUDA_H

#include <stdint.h>

#include "common/err.h"
#include "engine/attn/ring_cuda.h"
#include "engine/model/model.h"
#include "engine/model/optim.h"

typedef struct dt_gmodel dt_gmodel_t;

/* A forward-only model for c local tokens on the ring's device, with the
 * compute dtype (DT_BF16 or DT_F16), the parameters P (nparams, fp32, the
 * layout lo of cfg) and this rank's positions pos (c). The ring (borrowed)
 * must have one local rank. DT_ENOMEM when the device cannot hold it. */
int dt_gmodel_new(const dt_model_cfg_t *cfg, const dt_model_layout_t *lo, int64_t c,
                  dt_dtype_t dtype, dt_ring_t *ring, const float *P, const int64_t *pos,
                  dt_gmodel_t **out, dt_emsg_t *em);
void dt_gmodel_free(dt_gmodel_t *g);

/* The hidden state (c, d) fp32 onto the device (synchronous); back with
 * dt_gmodel_hidden_copy_start and dt_gmodel_copy_wait. */
int dt_gmodel_put_hidden(dt_gmodel_t *g, const float *hidden, dt_emsg_t *em);

/* Block l on the device's hidden state, in place. Every rank of the ring
 * calls it (ring attention); attn as for dt_model_layer_fwd. */
int dt_gmodel_layer_fwd(dt_gmodel_t *g, const dt_attn_spec_t *attn, int l, dt_emsg_t *em);

/* Final RMSNorm and LM head into logits (c, V) fp32 on the host, computed
 * in row chunks so that the device holds one chunk of logits at a time. */
int dt_gmodel_head(dt_gmodel_t *g, float *logits, dt_emsg_t *em);

/* ---- training -------------------------------------------------------------
 * A training model: parameters P and moments M, V (nparams, fp32, host)
 * uploaded; every layer's activations for c tokens at positions pos (c),
 * or with recompute (recompute = layer) every layer's input and one
 * layer's activations, made again from that input before the layer's
 * backward (bit-identical to keeping them: the same kernels on the same
 * input). It allocates what dt_model_gpu_train_bytes (spec/model.h)
 * counts, and the planner plans with that. DT_ENOMEM when the device
 * cannot hold it. Free with dt_gmodel_free.
 * Moments: M and V hold [moff, moff + mlen) of the parameters' (all of
 * them: 0, nparams). With less (shard = optimizer, this rank's slice of
 * engine/comm/comm.h) the GPU keeps and updates that slice's moments only
 * and dt_gtrain_adamw gathers the updated parameters from every rank:
 * bit-identical to keeping them all; 8 (nparams - mlen) bytes less. */
int dt_gtrain_new(const dt_model_cfg_t *cfg, const dt_model_layout_t *lo, int64_t c,
                  dt_dtype_t dtype, int recompute, dt_ring_t *ring, const float *P,
                  const float *M, const float *V, int64_t moff, int64_t mlen,
                  const int64_t *pos, dt_gmodel_t **out, dt_emsg_t *em);

/* One sequence forward and backward: x, y (c, host) this rank's tokens and
 * targets (DT_IGNORE = -1 ignored); the gradient of scale * (the sum of
 * this rank's token losses) is ADDED to the device gradient (zero = 1
 * clears it first). scale is 1 / (counted targets of the whole sequence,
 * over every rank, times the batch) for the mean dt_model_step takes.
 * *loss_sum = the sum of this rank's token losses (double), *hits = its
 * counted targets whose logits' argmax is the target. Every rank of the
 * ring calls it. */
int dt_gtrain_fwd_bwd(dt_gmodel_t *g, const dt_attn_spec_t *attn, const int32_t *x,
                      const int32_t *y, float scale, int zero, double *loss_sum, int64_t *hits,
                      dt_emsg_t *em);

/* Sum the gradient over the ring's ranks (ncclAllReduce), then *norm = its
 * global L2 norm (the same on every rank: the sum of squares in a fixed
 * order). Every rank calls it. */
int dt_gtrain_reduce(dt_gmodel_t *g, double *norm, dt_emsg_t *em);

/* One AdamW update (step counts from 1) with learning rate lr and weight
 * decay wd, the gradient multiplied by gscale (the clipping's scale, 1 for
 * none) as dt_grad_scale would; then the compute-dtype weights are remade. */
int dt_gtrain_adamw(dt_gmodel_t *g, const dt_adamw_cfg_t *cfg, int64_t step, double lr,
                    double wd, float gscale, dt_emsg_t *em);

/* Copies to the host that overlap compute. dt_gtrain_copy_start: the
 * parameters and moments (any may be NULL); dt_gmodel_hidden_copy_start:
 * the hidden state (c, d). Each is queued on a copy stream after
 * everything queued so far on the model's stream and returns at once; the
 * next step's (or layer's) compute overlaps it, and what would overwrite
 * the source (the next update; the next layer's first residual add) waits
 * for it on the device. dt_gmodel_copy_wait waits for the last one and
 * says how long the host waited (*stall_s, may be NULL). The host buffer
 * must stay valid and untouched until then; page-locked memory
 * (dt_gmodel_host_alloc) makes the copy truly asynchronous. */
int dt_gtrain_copy_start(dt_gmodel_t *g, float *P, float *M, float *V, dt_emsg_t *em);
int dt_gmodel_hidden_copy_start(dt_gmodel_t *g, float *hidden, dt_emsg_t *em);
int dt_gmodel_copy_wait(dt_gmodel_t *g, double *stall_s, dt_emsg_t *em);

/* n floats of page-locked host memory, zeroed (NULL when it cannot be had:
 * the caller uses malloc'd memory instead), and its release. */
float *dt_gmodel_host_alloc(int64_t n);
void dt_gmodel_host_free(float *p);

#endif /* DT_ENGINE_MODEL_CUDA_H */
