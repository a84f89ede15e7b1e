/* SPDX-License-Identifier: MIT
 *
 * The LLaMA-3 model on the GPU, forward only (engine/model/model_cuda.c),
 * and the state training shares with it: training is
 * engine/model/train_cuda.h; their common state is
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

/* Copies to the host that overlap compute: dt_gmodel_hidden_copy_start
 * the hidden state (c, d), dt_gtrain_copy_start (engine/model/train_cuda.h)
 * the parameters and moments. Each is queued on a copy stream after
 * everything queued so far on the model's stream and returns at once; the
 * next step's (or layer's) compute overlaps it, and what would overwrite
 * the source (the next update; the next layer's first residual add) waits
 * for it on the device. dt_gmodel_copy_wait waits for the last one and
 * says how long the host waited (*stall_s, may be NULL). The host buffer
 * must stay valid and untouched until then; page-locked memory
 * (dt_gmodel_host_alloc) makes the copy truly asynchronous. */
int dt_gmodel_hidden_copy_start(dt_gmodel_t *g, float *hidden, dt_emsg_t *em);
int dt_gmodel_copy_wait(dt_gmodel_t *g, double *stall_s, dt_emsg_t *em);

/* n floats of page-locked host memory, zeroed (NULL when it cannot be had:
 * the caller uses malloc'd memory instead), and its release. */
float *dt_gmodel_host_alloc(int64_t n);
void dt_gmodel_host_free(float *p);

/* The current device's free and total bytes (cudaMemGetInfo; on the
 * simulator its size less what is allocated). What a run holds is the
 * drop in free bytes from before its model to after its first step: dt
 * allocates with cudaMalloc up front and frees nothing while it steps.
 * DT_EDEVICE (em says why) on a CUDA error. */
int dt_gmodel_mem_info(size_t *free_b, size_t *total_b, dt_emsg_t *em);

#endif /* DT_ENGINE_MODEL_CUDA_H */
