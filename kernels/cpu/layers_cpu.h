/* SPDX-License-Identifier: MIT
 *
 * CPU building blocks of one LLaMA-3 layer, forward and backward: linear,
 * embedding, RMSNorm, RoPE, SwiGLU and the cross-entropy loss. Each op has a
 * fast path (`_cpu`: matrix products through cblas_sgemm, flat loops the
 * compiler vectorises) and a plain-C reference (`_ref`: naive loops, double
 * accumulators) with the same signature; tests compare the two and check
 * every backward against finite differences of the reference forward.
 *
 * Not here: attention (attn_cpu.h), the residual add (a loop the model
 * writes inline), the optimizer (engine/model/optim.h), the layer's orchestration
 * and its activation memory (the model), GPU kernels (kernels/cuda).
 *
 * Conventions. All tensors are fp32, row-major and contiguous; T is the
 * number of rows (tokens), and every function comments its shapes. Forward
 * outputs are overwritten. Backward WRITES (overwrites) the gradients of
 * its inputs (dx, da, ...) and ADDS into the gradients of its parameters
 * (dw, dtable, dg), so that a parameter used by several calls (micro-batches)
 * accumulates. Outputs do not alias inputs unless a function says so. A
 * gradient pointer documented as "may be NULL" is skipped.
 *
 * Tokens and targets are int32 and must lie in [0, V) (targets may also be
 * DT_IGNORE); check data from files with dt_tokens_check before calling,
 * the kernels only assert. Positions are int64.
 *
 * Determinism: no kernel depends on thread timing. The fast paths are
 * bit-reproducible for a given build and BLAS thread count (OpenBLAS splits
 * sgemm over the output, not the reduction); the references always are.
 *
 * Thread: no global state; safe to call concurrently on disjoint outputs.
 */
#ifndef DT_KERNELS_CPU_LAYERS_H
#define DT_KERNELS_CPU_LAYERS_H

#include <stdint.h>

#include "common/err.h"
#include "spec/model.h" /* dt_rope_t */

#ifdef __cplusplus
extern "C" {
#endif

/* A target that takes no part in the loss (padding, the prompt, ...). */
#define DT_IGNORE (-1)

/* 0 if every tok[t] (t < T) is in [0, V), or is DT_IGNORE when ignore_ok;
 * otherwise DT_ERANGE with "token <v> at row <t> outside [0, V)" in em. */
int dt_tokens_check(int64_t T, int V, const int32_t *tok, int ignore_ok, dt_emsg_t *em);

/*-- linear: y = x W^T (no bias; LLaMA has none) ---------------------------*/

/* x (T, din), w (dout, din) (PyTorch layout) -> y (T, dout). */
void dt_linear_fwd_cpu(int64_t T, int din, int dout, const float *x, const float *w, float *y);
void dt_linear_fwd_ref(int64_t T, int din, int dout, const float *x, const float *w, float *y);

/* dy (T, dout) -> dx (T, din) = dy W, WRITTEN (may be NULL);
 * dw (dout, din) += dy^T x, ADDED (may be NULL). */
void dt_linear_bwd_cpu(int64_t T, int din, int dout, const float *x, const float *w,
                       const float *dy, float *dx, float *dw);
void dt_linear_bwd_ref(int64_t T, int din, int dout, const float *x, const float *w,
                       const float *dy, float *dx, float *dw);

/*-- embedding: out[t] = table[tok[t]] -------------------------------------*/

/* tok (T) in [0, V), table (V, d) -> out (T, d). */
void dt_embed_fwd_cpu(int64_t T, int V, int d, const int32_t *tok, const float *table, float *out);
void dt_embed_fwd_ref(int64_t T, int V, int d, const int32_t *tok, const float *table, float *out);

/* dout (T, d) -> dtable (V, d): dtable[tok[t]] += dout[t], ADDED, rows in
 * order of t (a token repeated in the batch sums its rows in that order). */
void dt_embed_bwd_cpu(int64_t T, int V, int d, const int32_t *tok, const float *dout,
                      float *dtable);
void dt_embed_bwd_ref(int64_t T, int V, int d, const int32_t *tok, const float *dout,
                      float *dtable);

/*-- RMSNorm: y = x * rstd * g, rstd = 1 / sqrt(mean(x^2) + eps) ------------*/

/* x (T, d), g (d) -> y (T, d), rstd (T) saved for the backward. y may be x
 * (in place); the backward then needs a copy of x. */
void dt_rmsnorm_fwd_cpu(int64_t T, int d, float eps, const float *x, const float *g, float *y,
                        float *rstd);
void dt_rmsnorm_fwd_ref(int64_t T, int d, float eps, const float *x, const float *g, float *y,
                        float *rstd);

/* x (T, d), g (d), rstd (T) of the forward, dy (T, d) ->
 * dx (T, d) WRITTEN: rstd * g * dy - x * rstd^3 * sum_j(dy_j g_j x_j) / d;
 * dg (d) ADDED: += sum_t dy * x * rstd (may be NULL). */
void dt_rmsnorm_bwd_cpu(int64_t T, int d, const float *x, const float *g, const float *rstd,
                        const float *dy, float *dx, float *dg);
void dt_rmsnorm_bwd_ref(int64_t T, int d, const float *x, const float *g, const float *rstd,
                        const float *dy, float *dx, float *dg);

/*-- RoPE: rotary position embedding, in place -----------------------------*/

/* x (T, H, D) in place, D even, pos (T) int64. For each row t, head h and
 * i < D/2 the pair (x[2i], x[2i+1]) is rotated by the angle
 *     a = pos[t] * f_i, f_i = theta^(-2i/D) (llama3-scaled when rope asks):
 *                                   x0' = x0 cos a - x1 sin a,
 *                                   x1' = x0 sin a + x1 cos a
 * (the interleaved pairing of Meta's reference code; HF checkpoints pair i
 * with i + D/2 and need their q/k rows permuted on load).
 *
 * The angle is never formed in fp32. theta^(-2i/D) is computed in long
 * double and kept as a double-double f = fh + fl; pos (exact in a double
 * below 2^53) times f is formed as a double-double with fma, reduced modulo
 * 2 pi by a three-constant Cody-Waite reduction with fma (the k * C1 step is
 * exact), and the low parts are added to the reduced angle. The reduced
 * angle is within ~2e-15 rad of the angle of (pos * f) for any |pos| < 2^53
 * (fmod by the double 2 pi instead would be off by k * 2.4e-16, 4e-8 rad at
 * pos = 1e9). sin and cos of it are taken in double and rounded to fp32
 * (error <= 3e-8), so a position of 1e9 rotates as exactly as position 1.
 * Where long double is no wider than double, fl is 0 and f carries the
 * rounding of pow (relative 1e-16, 1e-7 rad at pos = 1e9). */
void dt_rope_fwd_cpu(int64_t T, int H, int D, const int64_t *pos, const dt_rope_t *rope,
                     float *x);
void dt_rope_fwd_ref(int64_t T, int H, int D, const int64_t *pos, const dt_rope_t *rope,
                     float *x);

/* Backward, dx (T, H, D) in place: the rotation by -a (the transpose of the
 * forward's rotation, hence also its inverse). */
void dt_rope_bwd_cpu(int64_t T, int H, int D, const int64_t *pos, const dt_rope_t *rope,
                     float *dx);
void dt_rope_bwd_ref(int64_t T, int H, int D, const int64_t *pos, const dt_rope_t *rope,
                     float *dx);

/* The reduced angle of pair i at position pos, in (-pi - 1e-15, pi + 1e-15]
 * (the value the rotations above use; exposed for tests and the CUDA
 * kernels, which take cos/sin tables built from it). */
double dt_rope_angle(int64_t pos, int i, int D, const dt_rope_t *rope);

/* The two halves of dt_rope_angle: theta^(-2i/D) (llama3-scaled when
 * rope->factor > 0; spec/model.h) as a double-double
 * fh + fl (formed in long double; the CUDA kernels take these from the host,
 * devices have no long double), and pos * (fh + fl) reduced modulo 2 pi. */
void dt_rope_freq(int i, int D, const dt_rope_t *rope, double *fh, double *fl);
double dt_rope_reduce(int64_t pos, double fh, double fl);

/*-- SwiGLU: h = silu(a) * b, silu(a) = a * sigmoid(a) -----------------------*/

/* a, b (T, f) -> h (T, f). h may be a or b. */
void dt_swiglu_fwd_cpu(int64_t T, int f, const float *a, const float *b, float *h);
void dt_swiglu_fwd_ref(int64_t T, int f, const float *a, const float *b, float *h);

/* a, b (T, f), dh (T, f) -> da, db (T, f), WRITTEN:
 * da = dh * b * s * (1 + a (1 - s)), db = dh * a * s, s = sigmoid(a).
 * da and db may alias dh (one of them), not a or b. */
void dt_swiglu_bwd_cpu(int64_t T, int f, const float *a, const float *b, const float *dh, float *da,
                       float *db);
void dt_swiglu_bwd_ref(int64_t T, int f, const float *a, const float *b, const float *dh, float *da,
                       float *db);

/*-- cross-entropy loss over a vocabulary ----------------------------------*/

/* How many targets count (are not DT_IGNORE). */
int64_t dt_xent_count(int64_t T, int V, const int32_t *targets);

/* logits (T, V), targets (T) in [0, V) or DT_IGNORE. Returns the mean of
 * -log softmax(logits[t])[targets[t]] over the counted (not ignored)
 * targets, accumulated in double; 0 when none counts. *count (may be NULL)
 * gets the number counted. dlogits (T, V) (may be NULL: loss only) is
 * WRITTEN with the gradient of that mean, (softmax - onehot) / count, and
 * zero rows for ignored targets; dlogits may be logits (in place). Stable
 * for any finite logits: exponents are taken relative to the row maximum. */
double dt_xent_cpu(int64_t T, int V, const float *logits, const int32_t *targets, float *dlogits,
                   int64_t *count);
double dt_xent_ref(int64_t T, int V, const float *logits, const int32_t *targets, float *dlogits,
                   int64_t *count);

#ifdef __cplusplus
}
#endif

#endif /* DT_KERNELS_CPU_LAYERS_H */
