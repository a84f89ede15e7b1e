/* SPDX-License-Identifier: MIT
 *
 * The optimizer of the engine: AdamW (decoupled weight decay, bias
 * correction) over flat fp32 parameter, gradient and moment arrays; the
 * learning-rate schedule (linear warm-up, then cosine decay to min_lr); and
 * global-norm gradient clipping. All deterministic: the same inputs give
 * bit-identical outputs (element-wise updates, one definition of an
 * element's update for the CPU and the GPU, kernels/adamw.h; reductions in
 * a fixed order with double accumulators; threads only where they cannot
 * change a bit: dt_adamw_step_scaled, dt_sumsq_parts).
 *
 * Not here: the gradient all-reduce (a distributed caller sums
 * dt_grad_sumsq over ranks itself and then calls dt_grad_scale), the
 * layout of parameters in the flat array (the model), saving m and v
 * (checkpoints).
 *
 * Thread: no global state.
 */
#ifndef DT_ENGINE_OPTIM_H
#define DT_ENGINE_OPTIM_H

#include <stdint.h>

#include "common/err.h"

/* Hyper-parameters that do not change during a run. */
typedef struct dt_adamw_cfg {
    double beta1;        /* 0.9 */
    double beta2;        /* 0.95 (LLaMA) */
    double eps;          /* 1e-8 */
    double weight_decay; /* 0.1; applied to ranges with decay set */
} dt_adamw_cfg_t;

/* One contiguous range [off, off + n) of the flat arrays; decay = 0 for
 * parameters that take no weight decay (norm gains, and embeddings when
 * the recipe says so). */
typedef struct dt_param_range {
    int64_t off;
    int64_t n;
    int decay;
} dt_param_range_t;

/* 0, or DT_EINVAL with the offending field named in em: betas in [0, 1),
 * eps > 0, weight_decay >= 0, all finite. */
int dt_adamw_check(const dt_adamw_cfg_t *cfg, dt_emsg_t *em);

/* One AdamW step on n parameters p (n), with gradient g (n) and moments
 * m, v (n) (zero before the first step), all fp32, updated in place:
 *     p -= lr * weight_decay * p                       (decoupled decay)
 *     m  = beta1 m + (1 - beta1) g
 *     v  = beta2 v + (1 - beta2) g^2
 *     p -= lr * (m / (1 - beta1^step)) / (sqrt(v / (1 - beta2^step)) + eps)
 * step counts updates from 1 (the first update is step 1). The arithmetic
 * of each element is in double, rounded to fp32 when stored. weight_decay
 * is per call (cfg->weight_decay is not read) so that a caller can pass 0
 * for a no-decay range. */
void dt_adamw_step(const dt_adamw_cfg_t *cfg, int64_t step, double lr, double weight_decay,
                   int64_t n, float *p, const float *g, float *m, float *v);

/* The same with the gradient taken as g[i] * gscale in fp32 (the
 * clipping's scale folded in, as the GPU's kernel takes it; 1 for none),
 * on the host's threads (OpenMP; element by element, so the bits do not
 * depend on their number): the GPU engine's optimizer in host memory
 * (offload = optimizer), bit-identical to the GPU's own update
 * (kernels/adamw.h). */
void dt_adamw_step_scaled(const dt_adamw_cfg_t *cfg, int64_t step, double lr,
                          double weight_decay, int64_t n, float *p, const float *g, float gscale,
                          float *m, float *v);

/* The partial sums of g[i]^2 of n floats into part (DT_SUMSQ_PARTS
 * doubles) in the order of kernels/adamw.h: the GPU's dt_sumsq_cuda to
 * the bit, on the host's threads (a part per thread: the bits do not
 * depend on their number); their sum in index order is the squared norm.
 * The GPU engine's norm when its gradient streams to host memory. */
void dt_sumsq_parts(int64_t n, const float *g, double *part);

/* dst[i] += add[i] for n floats, each an fp32 addition (the device's
 * gradient accumulation's bits), on the host's threads. */
void dt_grad_accumulate(int64_t n, float *dst, const float *add);

/* The same over nr ranges of flat arrays: ranges with decay get
 * cfg->weight_decay, the others 0. Elements outside every range are not
 * touched. */
void dt_adamw_step_ranges(const dt_adamw_cfg_t *cfg, int64_t step, double lr, int nr,
                          const dt_param_range_t *r, float *p, const float *g, float *m, float *v);

/* Learning rate schedule. step is the 0-based index of the update about to
 * be taken (update number step + 1 of dt_adamw_step):
 *     step < warmup:           max_lr * (step + 1) / warmup
 *                              (step 0 -> max_lr / warmup, step warmup-1 -> max_lr)
 *     warmup <= step <= total: min_lr + (max_lr - min_lr) (1 + cos(pi q)) / 2,
 *                              q = (step - warmup) / (total - warmup)
 *                              (step warmup -> max_lr, step total -> min_lr)
 *     step > total:            min_lr
 * A run of `total` updates ends at step total - 1, one step short of min_lr
 * (as in llm.c). warmup = 0 starts at max_lr; warmup == total never decays
 * before total. */
typedef struct dt_lr_sched {
    double max_lr;
    double min_lr;
    int64_t warmup;
    int64_t total;
} dt_lr_sched_t;

/* 0, or DT_EINVAL naming the field: 0 <= min_lr <= max_lr, finite,
 * 0 <= warmup <= total, total > 0. */
int dt_lr_sched_check(const dt_lr_sched_t *s, dt_emsg_t *em);

/* The learning rate at step (>= 0) by the rule above. */
double dt_lr_at(const dt_lr_sched_t *s, int64_t step);

/* sum of g[i]^2 over n, in double, in a fixed order (eight interleaved
 * partial sums, then the tail): the same bits for the same g. */
double dt_grad_sumsq(int64_t n, const float *g);

/* g *= s, element-wise (s rounded to fp32 once). */
void dt_grad_scale(int64_t n, float *g, double s);

/* Global-norm clipping on one array: returns norm = sqrt(dt_grad_sumsq);
 * when max_norm > 0 and norm > max_norm, scales g by max_norm / norm so that
 * its norm becomes max_norm (to fp32 rounding, relative ~1e-7). A norm
 * that is NaN or inf is returned and g is left as it is: the caller decides
 * whether to skip the step. */
double dt_grad_clip(int64_t n, float *g, double max_norm);

#endif /* DT_ENGINE_OPTIM_H */
