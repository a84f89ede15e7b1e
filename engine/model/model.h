/* SPDX-License-Identifier: MIT
 *
 * A LLaMA-3-style decoder on the CPU engine, context parallel: the sequence
 * is split over the job's ranks (spec/layout.h), every rank holds all
 * parameters, attention is the engine's ring or dilated attention, and the
 * parameter gradients are summed over the ranks. Token embedding; L blocks
 * of RMSNorm -> attention (RoPE with int64 positions, GQA) -> residual ->
 * RMSNorm -> SwiGLU MLP -> residual; final RMSNorm; LM head (tied to the
 * embedding or not); cross-entropy.
 *
 * Parameters live in one flat fp32 array in a fixed order (dt_model_layout_t,
 * spec/model.h) so the optimizer, the gradient all-reduce and checkpoints
 * see one buffer.
 * Shapes use the glossary: c tokens on this rank, d = dim, H heads, Hkv kv
 * heads, D = d / H, f = ffn, V = vocab.
 *
 * Not here: the optimizer (optim.h), data (engine/data/), checkpoints (io/ckpt.h).
 */
#ifndef DT_MODEL_H
#define DT_MODEL_H

#include <stdbool.h>
#include <stdint.h>

#include "common/err.h"
#include "engine/attn/attn.h"
#include "engine/comm/comm.h"
#include "spec/model.h"

/* The flat layout (dt_model_layout_t, dt_model_layout_init) is spec/model.h's:
 * checkpoints and the Hugging Face export read the same offsets. */

/* Deterministic initialisation from a seed: linear weights N(0, 0.02), the
 * residual projections (wo, w2) N(0, 0.02 / sqrt(2 L)), norm gains 1. */
void dt_model_init(const dt_model_cfg_t *cfg, const dt_model_layout_t *lo, uint64_t seed,
                   float *params);

/* The part [off, off + len) of dt_model_init's array into dst (len
 * floats), to the bit (a sharded rank initialises its slice alone). */
void dt_model_init_range(const dt_model_cfg_t *cfg, const dt_model_layout_t *lo, uint64_t seed,
                         int64_t off, int64_t len, float *dst);

/* The parameters of a Hugging Face model directory (io/hf.h) instead of
 * the seeded initialisation: every tensor read (pread, converted to fp32,
 * q and k rows permuted to dt's RoPE pairs) into its place of params. The
 * directory's config must be cfg (the run resolved it from the same file):
 * DT_EINVAL naming the directory otherwise. Errors of dt_hf_open and
 * dt_hf_read, naming the file and the tensor. */
struct dt_hf;
int dt_model_init_hf(const dt_model_cfg_t *cfg, const dt_model_layout_t *lo, const char *dir,
                     float *params, dt_emsg_t *em);

/* Per-rank working state: activations for c local tokens. */
typedef struct dt_model dt_model_t;

dt_model_t *dt_model_new(const dt_model_cfg_t *cfg, int64_t c);
void dt_model_free(dt_model_t *m);

/* One forward and backward over this rank's c tokens. attn gives T (the
 * whole sequence), causal, branches and layout; its H, Hkv, D must match the
 * model. x, y (c) are input tokens and targets (DT_IGNORE = -1 ignored), pos
 * (c) their positions. grads (nparams) is overwritten with the gradient of
 * the mean loss over every counted target of every rank, summed over the
 * ranks (identical on all of them); *loss is that mean. grads may be NULL
 * for a forward only. Every rank of comm must call it. */
int dt_model_step(dt_model_t *m, dt_comm_t *comm, const dt_attn_spec_t *attn,
                  const float *params, const int32_t *x, const int32_t *y, const int64_t *pos,
                  float *grads, double *loss, dt_emsg_t *em);

/* dt_model_new, recomputing activations (recompute = layer): the forward
 * keeps only each layer's input (c, d), and the backward runs each layer's
 * forward again from it just before that layer's backward. The same
 * kernels on the same inputs: the loss and gradients are bit-identical to
 * dt_model_new's, for one more forward's compute (its ring attention
 * included) and activations of one layer instead of all. */
dt_model_t *dt_model_new_recompute(const dt_model_cfg_t *cfg, int64_t c);

/* Sharded training state (spec key shard; shard = optimizer is the
 * trainer's alone: the model sees whole parameters and gradients).
 * The flat array is cut into R N slices (dt_model_slice): the rank at
 * ring position r of replica i (dp = N rings, i = 0 for dp = 1) keeps slice
 * r N + i, so the replicas at one ring position hold one ring slice
 * between them. The model works unit by unit: the embedding, each layer,
 * the final norm with the LM head.
 *  - GRADIENTS: dt_model_step's grads is this rank's slice only: each
 *    unit's gradient is reduce-scattered as soon as its backward is done
 *    (around the ring, then across the replicas), so no rank holds a whole
 *    gradient; params are whole.
 *  - PARAMETERS: params is this rank's slice too: each unit's weights are
 *    gathered (across the replicas, then around the ring) just before its
 *    forward and again before its backward, into one unit's buffer (a tied
 *    head keeps the embedding apart).
 * The local arithmetic is the unsharded model's, in the same order; only
 * the sums over ranks change from all-reduce to reduce-scatter (the same
 * bits on two ranks, within rounding otherwise). With dp the gradient is
 * summed around each ring, divided by N and summed across the replicas:
 * the mean of the replicas' sequences, as a batch of N would give it. */
enum { DT_MODEL_SHARD_NONE = 0, DT_MODEL_SHARD_GRADIENTS, DT_MODEL_SHARD_PARAMETERS };

/* This rank's slice [*off, *off + *len) of n parameters: ring rank r of R,
 * replica i of N. */
void dt_model_slice(int64_t n, int R, int r, int N, int i, int64_t *off, int64_t *len);

/* A model for training: recompute as dt_model_new_recompute, shard one of
 * the above, dp the replicas' group (dt_comm_split: the ranks at this
 * ring position, one per ring; NULL or a group of one for dp = 1), which
 * must outlive the model. dt_model_step's comm is then the ring. */
dt_model_t *dt_model_new_train(const dt_model_cfg_t *cfg, int64_t c, int recompute, int shard,
                               dt_comm_t *dp);

/* The longest range dt_model_gather takes: the largest unit
 * (dt_model_unit_max), in parameters. */
int64_t dt_model_gather_max(const dt_model_t *m);

/* [a, b) of the flat array (at most dt_model_gather_max long) gathered
 * from every rank's slice P (dt_model_slice) into dst (b - a floats), as
 * shard = parameters gathers a unit: for a digest or an export that no
 * rank holds whole. Every rank of the ring comm, and of the model's
 * replicas, must call it alike. DT_EINVAL for a bad range. */
int dt_model_gather(dt_model_t *m, dt_comm_t *comm, const float *P, int64_t a, int64_t b,
                    float *dst, dt_emsg_t *em);

/* The logits (c, V) of the last dt_model_step or dt_model_head (valid
 * until the next call). */
const float *dt_model_logits(const dt_model_t *m);

/* ---- layer-wise forward (prefill) -------------------------------------------
 * The forward of dt_model_step one piece at a time, on a hidden state
 * (c, d) fp32 that the caller holds (and may checkpoint between layers):
 * dt_model_embed, then dt_model_layer_fwd for l = 0 .. layers-1, then
 * dt_model_head. The same kernels run in the same order as in
 * dt_model_step, so the loss and logits are bit-identical to its forward. */

/* A model for the forward only: activations of one layer (reused by every
 * layer), the final norm and the logits (c, V); no backward buffers.
 * dt_model_step refuses it (DT_EINVAL). Free with dt_model_free. */
dt_model_t *dt_model_new_forward(const dt_model_cfg_t *cfg, int64_t c);

/* hidden (c, d) = token embeddings of x (c). DT_ERANGE for a token outside
 * [0, V). Local: no communication. */
int dt_model_embed(dt_model_t *m, const float *params, const int32_t *x, float *hidden,
                   dt_emsg_t *em);

/* Block l (0 <= l < layers) applied to hidden (c, d) in place; pos (c) the
 * positions of the rows, attn as for dt_model_step. Every rank of comm must
 * call it (ring attention). DT_ERANGE for a bad l, DT_ESHAPE for an attn
 * that does not match the model. */
int dt_model_layer_fwd(dt_model_t *m, dt_comm_t *comm, const dt_attn_spec_t *attn,
                       const float *params, int l, const int64_t *pos, float *hidden,
                       dt_emsg_t *em);

/* Final RMSNorm and LM head of hidden (c, d) into the logits (c, V)
 * (dt_model_logits); *loss = the mean cross-entropy over every counted
 * target (y (c), DT_IGNORE ignored) of every rank, as dt_model_step
 * computes it. Every rank of comm must call it (one all-reduce). */
int dt_model_head(dt_model_t *m, dt_comm_t *comm, const float *params, const float *hidden,
                  const int32_t *y, double *loss, dt_emsg_t *em);

/* *loss = the mean cross-entropy of logits (c, V) over every counted
 * target (y (c), DT_IGNORE ignored) of every rank, as dt_model_head
 * computes it from its own logits (one all-reduce; every rank calls it).
 * For logits made elsewhere (the GPU model). */
int dt_model_xent(dt_comm_t *comm, int64_t c, int V, const float *logits, const int32_t *y,
                  double *loss, dt_emsg_t *em);

#endif /* DT_MODEL_H */
