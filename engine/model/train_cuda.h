/* SPDX-License-Identifier: MIT
 *
 * Training the LLaMA-3 model on the GPU (dt_gtrain_*,
 * engine/model/train_cuda.c), on the model of engine/model/model_cuda.h:
 * the whole step on the device as dt_model_step runs it on the CPU: the
 * embedding, every layer's forward with its activations kept, the LM head
 * and cross-entropy in row chunks with their gradient, the backward of
 * every layer (the ring's backward for the attention), the embedding's
 * gradient; fp32 master parameters, gradients and AdamW moments on the
 * device, the compute-dtype copy of the weights remade after every update;
 * gradients summed over the ring (NCCL), the norm for clipping, AdamW
 * (kernels/cuda/train_cuda.h). The caller keeps the host copies
 * (checkpoints) and does the MPI agreement.
 *
 * Not here: data, checkpoints' files (engine/cmd/train_gpu.c, io/ckpt.h).
 */
#ifndef DT_ENGINE_MODEL_TRAIN_CUDA_H
#define DT_ENGINE_MODEL_TRAIN_CUDA_H

#include "engine/model/model_cuda.h"

/* A training model: parameters P and moments M, V (nparams, fp32, host)
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
typedef struct dt_gtrain_opts {
    int recompute;      /* recompute = layer */
    int host_optimizer; /* offload = optimizer (below) */
    int offload_act;    /* offload = activations: the kept layer inputs in host memory */
    int ckpt_bf16;      /* ckpt_dtype = bf16: the kept layer inputs in bf16 */
    int shard_gradients;  /* shard = gradients (below) */
    int shard_parameters; /* shard = parameters (below; implies gradients) */
    /* sharded gradients with host_optimizer: the host's array (mlen
     * floats, page-locked for speed) the gradient's slice streams to */
    float *host_grad;
    /* dp = N > 1: the ring across the replicas (member i of N: the job's
     * ranks at this one's ring rank; NULL with dp = 1). The gradient is
     * summed around the ring, then across the replicas (the addends
     * already divided by N: the caller's loss weight); sharded state is
     * sliced R N ways (dt_model_slice), a unit's ring part reduced or
     * gathered across the replicas beside the ring's collective of it. */
    dt_ring_t *rep;
} dt_gtrain_opts_t;
int dt_gtrain_new(const dt_model_cfg_t *cfg, const dt_model_layout_t *lo, int64_t c,
                  dt_dtype_t dtype, const dt_gtrain_opts_t *opt, dt_ring_t *ring,
                  const float *P, const float *M, const float *V, int64_t moff, int64_t mlen,
                  const int64_t *pos, dt_gmodel_t **out, dt_emsg_t *em);

/* The RoPE positions of the c rows from the next sequence on (doc_positions =
 * reset: each sequence's own), copied to the device before returning. */
int dt_gtrain_set_pos(dt_gmodel_t *g, const int64_t *pos, dt_emsg_t *em);

/* shard_gradients, shard_parameters (engine/model/model.h's semantics;
 * [moff, moff + mlen) must be this rank's slice, dt_model_slice, as the
 * ring and the replicas cut it): the device holds this rank's slice of the
 * gradient only, and each unit's (dt_model_unit_range) gradient is made
 * in one of two unit buffers and reduce-scattered into the slice as soon
 * as the unit's backward is done, overlapping the next unit's (a tied
 * embedding's gradient has its own buffer through the backward).
 * With parameters P, M and V are the slice too (mlen floats, the host's
 * P as well) and so are the compute-dtype weights: each unit's weights
 * are gathered into one of two unit buffers a unit ahead of their use,
 * forward and again backward, and the fp32 embedding for the forward
 * into a gradient buffer. What they cost: dt_model_gpu_train_bytes.
 *
 * offload_act and ckpt_bf16 (with recompute only): every layer's input,
 * kept for its recompute, in bf16 (rounded to nearest even, half the
 * bytes; the recompute then starts from the rounded input) and/or in
 * page-locked host memory (layers c dim elements) instead of the
 * device's: each goes down on a copy stream as soon as the layer has
 * it, through one of two device slots, and comes back up one layer ahead
 * of its backward, overlapped with the layer before. fp32 and offloaded
 * is bit-identical to fp32 on the device. DT_ENOMEM when the host has no
 * page-locked memory for them.
 *
 * host_optimizer (offload = optimizer): the fp32 parameters and the
 * moments stay in the caller's host arrays, which are then the training
 * state itself (M and V are not read): the device keeps the gradient, the
 * compute-dtype weights and, in fp32, only what it reads so (the
 * embedding and the norm gains), 4 (n + mlen) + 4 mlen bytes fewer, less
 * those; a step's update is then the caller's:
 *   dt_gtrain_reduce as always, dt_gtrain_grad_get for this rank's slice
 *   of the summed gradient, AdamW on the host (dt_adamw_step_scaled,
 *   engine/model/optim.h: the device kernel's bits), every rank's slice
 *   gathered into P where sharded, and dt_gtrain_params_set(P).
 * dt_gtrain_adamw and dt_gtrain_copy_start refuse such a model.
 * With sharded gradients as well the device holds no gradient slice:
 * each unit's part of the sum goes down to host_grad as soon as its
 * reduce-scatter is done, overlapping the next unit's backward (a
 * sequence after the step's first is added there on the host, fp32 as
 * the device adds); dt_gtrain_reduce's norm is then the host's
 * (dt_sumsq_parts: the device kernel's bits) and dt_gtrain_grad_get a
 * copy at most (none into host_grad itself). */

/* Host optimizer: G[moff, moff + mlen) into dst (mlen floats, host; page-
 * locked for speed), complete when it returns. */
int dt_gtrain_grad_get(dt_gmodel_t *g, float *dst, dt_emsg_t *em);

/* Host optimizer: the parameters P (n floats, host) onto the device: the
 * fp32 ranges it reads and the compute-dtype weights, cast there in
 * chunks through a 64 MiB staging buffer; complete when it returns. */
int dt_gtrain_params_set(dt_gmodel_t *g, const float *P, dt_emsg_t *em);

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

/* Sum the gradient over the ring's ranks (ncclAllReduce), then *sumsq =
 * the sum of its squares (the same on every rank: a fixed order); with
 * sharded gradients (summed already, unit by unit) that of this rank's
 * slice, which the caller sums over the ranks. Every rank calls it. */
int dt_gtrain_reduce(dt_gmodel_t *g, double *sumsq, dt_emsg_t *em);

/* Whether the device holds a slice of the gradient only (shard =
 * gradients or parameters). */
int dt_gtrain_grad_sharded(const dt_gmodel_t *g);

/* One AdamW update (step counts from 1) with learning rate lr and weight
 * decay wd, the gradient multiplied by gscale (the clipping's scale, 1 for
 * none) as dt_grad_scale would; then the compute-dtype weights are remade. */
int dt_gtrain_adamw(dt_gmodel_t *g, const dt_adamw_cfg_t *cfg, int64_t step, double lr,
                    double wd, float gscale, dt_emsg_t *em);

/* The parameters and moments (any may be NULL) to the host, overlapping
 * compute, as dt_gmodel_hidden_copy_start (engine/model/model_cuda.h);
 * the next update waits for it on the device; dt_gmodel_copy_wait ends it. */
int dt_gtrain_copy_start(dt_gmodel_t *g, float *P, float *M, float *V, dt_emsg_t *em);

#endif /* DT_ENGINE_MODEL_TRAIN_CUDA_H */
