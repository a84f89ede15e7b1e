/* SPDX-License-Identifier: MIT
 *
 * The CUDA kernels of a training step that are not a layer: the token
 * embedding forward and backward, the cross-entropy loss with its gradient
 * and the row argmax, the squared norm of a gradient, and AdamW. The GPU
 * side of kernels/cpu/layers_cpu.h (embedding, loss) and
 * engine/model/optim.h (norm, AdamW), with the same arithmetic where it
 * matters for agreement with the CPU path:
 *   - the loss of a row is m + log(sum exp(x - m)) - x[y] with the sum in
 *     double, the gradient (softmax - onehot) * scale as dt_xent_cpu forms it;
 *   - AdamW works in double per element and stores fp32, exactly the
 *     formula of dt_adamw_step (the host passes the bias corrections);
 *   - every reduction has a fixed order (fixed launch shape, tree sums), so
 *     the same inputs give the same bits, run after run: no atomics. The
 *     embedding's backward adds each token's rows in increasing row order
 *     from a grouping the host makes (dt_embed_groups).
 * Pointers are device pointers unless said otherwise; launches are
 * asynchronous on the stream. Launchers return 0, DT_EINVAL (named in em)
 * or DT_EDEVICE.
 */
#ifndef DT_KERNELS_CUDA_TRAIN_H
#define DT_KERNELS_CUDA_TRAIN_H

#include <stdint.h>

#include <cuda_runtime_api.h>

#include "common/err.h"
#include "kernels/adamw.h" /* dt_adamw_k_t, the element update */

#ifdef __cplusplus
extern "C" {
#endif

/* out (T, d) fp32 = table[tok[t]] for table (V, d) fp32. The tokens must be
 * in [0, V) (the host checks them: dt_tokens_check). */
int dt_embed_fwd_cuda(int64_t T, int d, const int32_t *tok, const float *table, float *out,
                      cudaStream_t st, dt_emsg_t *em);

/* dtable (V, d) += the rows of dout (T, d), ADDED: for group u (0 <= u <
 * nu), token tok[u] gets rows[start[u] .. start[u + 1]) in that order. */
int dt_embed_bwd_cuda(int64_t nu, int d, const int32_t *tok, const int64_t *start,
                      const int32_t *rows, const float *dout, float *dtable, cudaStream_t st,
                      dt_emsg_t *em);

/* Host: the grouping dt_embed_bwd_cuda takes, for T tokens tok (host): on
 * return *nu groups, tok_out[u] the token of group u (ascending), its rows
 * rows[start[u] .. start[u + 1]) ascending. tok_out, rows (T) and start
 * (T + 1) are the caller's. */
void dt_embed_groups(int64_t T, const int32_t *tok, int64_t *nu, int32_t *tok_out,
                     int64_t *start, int32_t *rows);

/* Cross-entropy over n rows of logits (n, V) fp32, in place: row t with
 * target y[t] in [0, V) gets loss[t] = -log softmax(x)[y] (double) and its
 * logits become (softmax - onehot) * scale; a row with y[t] < 0 (ignored)
 * gets loss 0 and zeros. amax[t] (may be NULL) = the first index of the
 * row's maximum, taken before the overwrite. One block per row. */
int dt_xent_cuda(int64_t n, int V, float *logits, const int32_t *y, float scale, double *loss,
                 int32_t *amax, cudaStream_t st, dt_emsg_t *em);

/* Partial sums of g[i]^2 in double: part (DT_SUMSQ_PARTS) device doubles,
 * whose sum in index order (on the host) is the squared norm; their order
 * is kernels/adamw.h's, which dt_sumsq_parts (engine/model/optim.h)
 * follows on the host to the bit. */
int dt_sumsq_cuda(int64_t n, const float *g, double *part, cudaStream_t st, dt_emsg_t *em);

/* One AdamW update of n parameters, dt_adamw_elem (kernels/adamw.h) on
 * each with the gradient taken as (float)(g[i] * gscale) (the clipping's
 * scale; 1 for none) and the constants of dt_adamw_k_make: the bits of
 * dt_adamw_step_scaled on the host (engine/model/optim.h). */
int dt_adamw_cuda(int64_t n, float *p, const float *g, float *m, float *v, float gscale,
                  const dt_adamw_k_t *k, cudaStream_t st, dt_emsg_t *em);

/* A reduce-scatter's sum (engine/comm/comm_nccl.c, shard = gradients):
 * dst[i] = (acc ? dst[i] : 0) + the sum over r = 0 .. R-1 in rank order of
 * (r == me ? own[i] : slots[r ld + i]), from 0.0f, in fp32, for i < n: the
 * order the simulator's all-reduce sums in, the same on every rank. */
int dt_sum_slots_cuda(int64_t n, int R, int me, const float *own, const float *slots,
                      int64_t ld, float *dst, int acc, cudaStream_t st, dt_emsg_t *em);
/* Its argument check, the kernel's and the simulator's: 0 or DT_EINVAL. */
static inline int dt_sum_slots_check(int64_t n, int R, int me, const float *own,
                                     const float *slots, int64_t ld, const float *dst,
                                     dt_emsg_t *em)
{
    if (n < 0 || R < 1 || me < 0 || me >= R || ld < n ||
        (n > 0 && (!own || !dst || (R > 1 && !slots))))
        return dt_emsg_set(em, DT_EINVAL, "dt_sum_slots_cuda: n=%lld R=%d me=%d ld=%lld or a "
                           "NULL tensor", (long long)n, R, me, (long long)ld);
    return 0;
}

#ifdef __cplusplus
}
#endif

#endif /* DT_KERNELS_CUDA_TRAIN_H */
