/* SPDX-License-Identifier: MIT
 *
 * The LLaMA-3 forward on the GPU, one device per rank, context parallel:
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
 * Not here: the embedding (the caller uploads the embedded rows), the
 * loss (the caller computes it from the logits: dt_model_xent), training.
 */
#ifndef DT_ENGINE_MODEL_CUDA_H
#define DT_ENGINE_MODEL_CUDA_H

#include <stdint.h>

#include "common/err.h"
#include "engine/attn/ring_cuda.h"
#include "engine/model/model.h"

typedef struct dt_gmodel dt_gmodel_t;

/* A forward-only model for c local tokens on the ring's device, with the
 * compute dtype (DT_BF16 or DT_F16), the parameters P (nparams, fp32, the
 * layout lo of cfg) and this rank's positions pos (c). The ring (borrowed)
 * must have one local rank. DT_ENOMEM when the device cannot hold it. */
int dt_gmodel_new(const dt_model_cfg_t *cfg, const dt_model_layout_t *lo, int64_t c,
                  dt_dtype_t dtype, dt_ring_t *ring, const float *P, const int64_t *pos,
                  dt_gmodel_t **out, dt_emsg_t *em);
void dt_gmodel_free(dt_gmodel_t *g);

/* The hidden state (c, d) fp32, host <-> device (synchronous). */
int dt_gmodel_put_hidden(dt_gmodel_t *g, const float *hidden, dt_emsg_t *em);
int dt_gmodel_get_hidden(dt_gmodel_t *g, float *hidden, dt_emsg_t *em);

/* Block l on the device's hidden state, in place. Every rank of the ring
 * calls it (ring attention); attn as for dt_model_layer_fwd. */
int dt_gmodel_layer_fwd(dt_gmodel_t *g, const dt_attn_spec_t *attn, int l, dt_emsg_t *em);

/* Final RMSNorm and LM head into logits (c, V) fp32 on the host, computed
 * in row chunks so that the device holds one chunk of logits at a time. */
int dt_gmodel_head(dt_gmodel_t *g, float *logits, dt_emsg_t *em);

#endif /* DT_ENGINE_MODEL_CUDA_H */
