/* SPDX-License-Identifier: MIT
 *
 * CUDA building blocks of one LLaMA-3 layer: the GPU side of
 * kernels/cpu/layers_cpu.h, with the same signatures plus a stream (and a
 * cuBLASLt handle for the linear layers). The contracts are those of
 * layers_cpu.h: shapes, "WRITTEN" vs "ADDED" gradients, in-place rules.
 * Pointers are device pointers; everything is asynchronous on the stream.
 * Launchers return 0, DT_EINVAL (named in em) or DT_EDEVICE.
 *
 * Precision: RMSNorm, RoPE and SwiGLU work on fp32 tensors with fp32
 * arithmetic (RMSNorm's sums in fp32 over one row per warp); RoPE's angles
 * are formed in fp64 from host-computed double-double frequencies
 * (dt_rope_freq) and reduced mod 2 pi as dt_rope_reduce does, so position
 * 1e9 rotates as exactly as on the CPU. The linear layers run on cuBLASLt
 * with bf16/fp16 inputs and fp32 accumulation.
 */
#ifndef DT_KERNELS_CUDA_LAYERS_H
#define DT_KERNELS_CUDA_LAYERS_H

#include <stddef.h>
#include <stdint.h>

#include <cuda_runtime_api.h>

#include "common/err.h"
#include "kernels/cuda/attn_cuda.h" /* dt_dtype_t */
#include "spec/model.h"            /* dt_rope_t */

#ifdef __cplusplus
extern "C" {
#endif

/*-- casts ------------------------------------------------------------------*/

/* y (n) of dtype <- x (n) fp32, round to nearest even. */
int dt_cast_from_f32_cuda(dt_dtype_t dtype, int64_t n, const float *x, void *y, cudaStream_t st,
                          dt_emsg_t *em);
/* y (n) fp32 <- x (n) of dtype (exact). */
int dt_cast_to_f32_cuda(dt_dtype_t dtype, int64_t n, const void *x, float *y, cudaStream_t st,
                        dt_emsg_t *em);

/*-- RMSNorm -----------------------------------------------------------------*/

int dt_rmsnorm_fwd_cuda(int64_t T, int d, float eps, const float *x, const float *g, float *y,
                        float *rstd, cudaStream_t st, dt_emsg_t *em);
int dt_rmsnorm_bwd_cuda(int64_t T, int d, const float *x, const float *g, const float *rstd,
                        const float *dy, float *dx, float *dg, cudaStream_t st, dt_emsg_t *em);

/*-- RoPE (pos is a device array of T int64) --------------------------------*/

int dt_rope_fwd_cuda(int64_t T, int H, int D, const int64_t *pos, const dt_rope_t *rope,
                     float *x, cudaStream_t st, dt_emsg_t *em);
int dt_rope_bwd_cuda(int64_t T, int H, int D, const int64_t *pos, const dt_rope_t *rope,
                     float *dx, cudaStream_t st, dt_emsg_t *em);

/*-- SwiGLU ------------------------------------------------------------------*/

int dt_swiglu_fwd_cuda(int64_t T, int f, const float *a, const float *b, float *h,
                       cudaStream_t st, dt_emsg_t *em);
int dt_swiglu_bwd_cuda(int64_t T, int f, const float *a, const float *b, const float *dh,
                       float *da, float *db, cudaStream_t st, dt_emsg_t *em);

/*-- fused: one launch where the layer ran several ---------------------------
 * Each gives the bits of the unfused sequence it replaces (the same fp32
 * arithmetic in the same order, one rounding to dtype at the end), with
 * one pass over memory instead of several. dtype: DT_BF16 or DT_F16. */

/* res != NULL: x (T, d) += res first, in place (the residual add before
 * the next norm); then y (T, d) in dtype = rmsnorm(x) g rounded, rstd (T):
 * dt_add_f32_cuda, dt_rmsnorm_fwd_cuda and dt_cast_from_f32_cuda in one. */
int dt_rmsnorm_fwd_half_cuda(int64_t T, int d, float eps, float *x, const float *res,
                             const float *g, dt_dtype_t dtype, void *y, float *rstd,
                             cudaStream_t st, dt_emsg_t *em);

/* q (T, H, D) and k (T, Hkv, D) fp32 rotated by RoPE at pos (read only)
 * into qb, kb in dtype, v (T, Hkv, D) cast into vb: two dt_rope_fwd_cuda
 * and three casts in one (sin and cos of each angle taken once for the
 * heads of q and of k). */
int dt_rope_qkv_half_cuda(int64_t T, int H, int Hkv, int D, const int64_t *pos,
                          const dt_rope_t *rope, const float *q, const float *k, const float *v,
                          dt_dtype_t dtype, void *qb, void *kb, void *vb, cudaStream_t st,
                          dt_emsg_t *em);

/* h (T, f) in dtype = silu(a) b rounded: dt_swiglu_fwd_cuda and a cast in
 * one. */
int dt_swiglu_fwd_half_cuda(int64_t T, int f, const float *a, const float *b, dt_dtype_t dtype,
                            void *h, cudaStream_t st, dt_emsg_t *em);

/*-- the residual stream ------------------------------------------------------*/

/* y (n) += x (n), fp32 (x + attention, x + MLP). */
int dt_add_f32_cuda(int64_t n, const float *x, float *y, cudaStream_t st, dt_emsg_t *em);

/*-- linear layers on cuBLASLt: y = x W^T -------------------------------------*/

/* A cuBLASLt handle with its workspace (one per stream that runs linear
 * layers). */
typedef struct dt_blas dt_blas_t;
int dt_blas_new(dt_blas_t **out, dt_emsg_t *em);
void dt_blas_free(dt_blas_t *b);

/* x (T, din) and w (dout, din) of dtype (bf16 or fp16) -> y (T, dout),
 * WRITTEN, of ydtype (fp32, or the input dtype); fp32 accumulation. */
int dt_linear_fwd_cuda(dt_blas_t *b, dt_dtype_t dtype, int64_t T, int din, int dout, const void *x,
                       const void *w, dt_dtype_t ydtype, void *y, cudaStream_t st, dt_emsg_t *em);

/* dy (T, dout) of dtype -> dx (T, din) fp32 = dy W, WRITTEN (may be NULL);
 * dw (dout, din) fp32 += dy^T x, ADDED (may be NULL). */
int dt_linear_bwd_cuda(dt_blas_t *b, dt_dtype_t dtype, int64_t T, int din, int dout,
                       const void *x, const void *w, const void *dy, float *dx, float *dw,
                       cudaStream_t st, dt_emsg_t *em);

#ifdef __cplusplus
}
#endif

#endif /* DT_KERNELS_CUDA_LAYERS_H */
