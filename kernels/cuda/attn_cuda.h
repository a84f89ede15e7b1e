/* SPDX-License-Identifier: MIT
 *
 * CUDA attention kernels: the GPU side of kernels/cpu/attn_cpu.h, with the
 * same contracts extended to all heads of a block at once (one launch, not
 * one per head) and to bf16/fp16 inputs. Everything here is asynchronous on
 * the given stream; pointers are device pointers unless a comment says
 * otherwise. Launchers return 0, DT_EINVAL (a shape or head dimension the
 * kernels do not support, named in em) or DT_EDEVICE (a launch failed).
 *
 * Shapes. A block of queries q (tq, h, d) and a block of keys and values k, v
 * (tk, hkv, d), row-major with per-token row strides ldq, ldk, ldv in
 * elements (>= h * d, hkv * d): element (i, hh, e) of q is q[i * ldq + hh * d
 * + e]. Query head hh reads kv head hh / (h / hkv) (GQA; hkv divides h).
 * Outputs: o (tq, h, d) fp32 at row stride ldo; lse (h, tq) fp32 at head
 * stride ldlse (the engine's (H, c) layout). d is 64 or 128.
 *
 * Precision. Products on tensor cores from bf16 or fp16 inputs, fp32
 * accumulation, softmax in fp32 with exp2 of pre-scaled scores; the partial
 * (o, lse) stays fp32 across every block of a ring, so a ring of R blocks
 * loses nothing to rounding partials to bf16 between blocks.
 *
 * Masking: causal = 0 sees every key. With causal = 1, key j is visible to
 * query i iff kpos(j) <= qpos(i), where qpos(i) = qpos[i] when the device
 * array qpos is given, else q0 + i (and likewise for keys). Tiles wholly in
 * the future are skipped, so contiguous and zigzag blocks cost what their
 * visible pairs cost. A mask of documents and windows (spec/mask.h) comes
 * as intervals: with the device arrays qlo and qhi (tq each), key j is
 * visible to query i iff qlo[i] <= kpos(j) < qhi[i] (causality already in
 * them; causal still lets the kernels skip future tiles); the tiles a mask
 * cuts are masked element by element.
 *
 * Forward accumulates, exactly as dt_attn_head_fwd_cpu: with accumulate =
 * 1, (o, lse) on entry is a running softmax state (lse = -inf, o = 0 for "no
 * keys yet") and on return includes this block's keys; with accumulate = 0
 * the entry values are ignored and overwritten (the first block). A query
 * that sees no key keeps (or gets) o = 0, lse = -inf.
 *
 * Backward ADDS into fp32 dq, dk, dv the gradients of this key block given
 * dout, the final lse and delta = rowsum(dout * o) of the forward (see
 * dt_attn_delta_cuda); summing over blocks gives the full gradient. It is
 * deterministic: dk/dv are reduced over query tiles by one thread block per
 * key tile, dq by one thread block per query tile (no atomics), so the same
 * inputs give the same bits.
 *
 * Thread: launchers keep no state; any host thread, any stream.
 */
#ifndef DT_KERNELS_CUDA_ATTN_H
#define DT_KERNELS_CUDA_ATTN_H

#include <stddef.h>
#include <stdint.h>

#include <cuda_runtime_api.h>

#include "common/err.h"
#include "spec/dtype.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Element types on the device (spec/dtype.h): DT_BF16 and DT_F16, DT_F32
 * only where a function says so (casts, gathers). */

/* Host side, for uploads from fp32 and for tests: f rounded to nearest
 * even in t (DT_BF16 or DT_F16), as the element's bits (NaN stays NaN, an
 * fp16 overflow becomes infinity, fp16 subnormals are kept); and the exact
 * value of an element. */
uint16_t dt_half_bits(dt_dtype_t t, float f);
float dt_half_value(dt_dtype_t t, uint16_t h);

typedef struct dt_attn_cuda {
    int64_t tq, tk;
    int h, hkv, d;
    dt_dtype_t dtype; /* DT_BF16 or DT_F16, for q, k, v (and dout) */
    const void *q;    /* (tq, h, d) at row stride ldq */
    int64_t ldq;
    const void *k; /* (tk, hkv, d) at row stride ldk */
    int64_t ldk;
    const void *v; /* (tk, hkv, d) at row stride ldv */
    int64_t ldv;
    int causal;
    int64_t q0, k0;       /* positions when qpos / kpos are NULL */
    const int64_t *qpos;  /* (tq) device, or NULL */
    const int64_t *kpos;  /* (tk) device, or NULL */
    const int64_t *qlo, *qhi; /* (tq) device, or NULL: the key positions each query sees */
    float scale;          /* scores are scale * q.k; 0 means 1 / sqrt(d) */
} dt_attn_cuda_t;

/* Forward of one block: (o, lse) as above. */
int dt_attn_fwd_cuda(const dt_attn_cuda_t *a, int accumulate, float *o, int64_t ldo, float *lse,
                     int64_t ldlse, cudaStream_t st, dt_emsg_t *em);

typedef struct dt_attn_cuda_grad {
    const void *dout; /* (tq, h, d) in a->dtype at row stride lddo */
    int64_t lddo;
    const float *lse; /* (h, tq) final lse of the forward, head stride ldlse */
    int64_t ldlse;
    const float *delta; /* (h, tq) rowsum(dout * o), same head stride ldlse */
    float *dq;          /* (tq, h, d) fp32 at row stride lddq, ADDED */
    int64_t lddq;
    float *dk; /* (tk, hkv, d) fp32 at row stride lddk, ADDED */
    int64_t lddk;
    float *dv; /* (tk, hkv, d) fp32 at row stride lddv, ADDED */
    int64_t lddv;
} dt_attn_cuda_grad_t;

/* Backward of one block: adds this block's gradients into dq, dk, dv. */
int dt_attn_bwd_cuda(const dt_attn_cuda_t *a, const dt_attn_cuda_grad_t *g, cudaStream_t st,
                     dt_emsg_t *em);

/* delta[hh * lddelta + i] = sum_e dout[i, hh, e] * o[i, hh, e] for n rows
 * and h heads; dout in dtype (row stride lddo), o fp32 (row stride ldo).
 * Summed in fp32 over d. */
int dt_attn_delta_cuda(int64_t n, int h, int d, dt_dtype_t dtype, const void *dout, int64_t lddo,
                       const float *o, int64_t ldo, float *delta, int64_t lddelta,
                       cudaStream_t st, dt_emsg_t *em);

/* Merge the partial (o2, lse2) into (o1, lse1), as dt_attn_merge_cpu, for
 * n rows and h heads: o (n, h, d) fp32 at row strides ld1/ld2, lse (h, n)
 * at head strides ldl1/ldl2. -inf marks an empty partial. */
int dt_attn_merge_cuda(int64_t n, int h, int d, float *o1, int64_t ld1, float *lse1,
                       int64_t ldl1, const float *o2, int64_t ld2, const float *lse2,
                       int64_t ldl2, cudaStream_t st, dt_emsg_t *em);

/*-- around a block kernel whose partials are in dtype (attn_cudnn.h) --------- */

/* dt_attn_merge_cuda with the partial o2 (n, h, d) in dtype (DT_BF16,
 * DT_F16) at row stride ld2. */
int dt_attn_merge_half_cuda(int64_t n, int h, int d, dt_dtype_t dtype, float *o1, int64_t ld1,
                            float *lse1, int64_t ldl1, const void *o2, int64_t ld2,
                            const float *lse2, int64_t ldl2, cudaStream_t st, dt_emsg_t *em);

/* The same into an empty state, which is not read: o1 = o2 widened, lse1 =
 * lse2 (a row whose lse2 is -inf gets o1 = 0): the first partial of rows
 * that nothing else fills, one pass instead of dt_attn_empty_cuda and a
 * merge. */
int dt_attn_set_half_cuda(int64_t n, int h, int d, dt_dtype_t dtype, float *o1, int64_t ld1,
                          float *lse1, int64_t ldl1, const void *o2, int64_t ld2,
                          const float *lse2, int64_t ldl2, cudaStream_t st, dt_emsg_t *em);

/* The empty state of n rows: o (n, h, d) = 0 at row stride ldo, lse (h, n)
 * = -inf at head stride ldlse. */
int dt_attn_empty_cuda(int64_t n, int h, int d, float *o, int64_t ldo, float *lse, int64_t ldlse,
                       cudaStream_t st, dt_emsg_t *em);

/* dst (n, width) fp32 at row stride ldd += src (n, width) in dtype at row
 * stride lds (a block's gradients into the ring's fp32 sums). */
int dt_attn_add_half_cuda(int64_t n, int64_t width, dt_dtype_t dtype, const void *src,
                          int64_t lds, float *dst, int64_t ldd, cudaStream_t st, dt_emsg_t *em);

/*-- dilated attention: gather and scatter of one head chunk -----------------
 * A branch (w, r) of dilated attention takes, for head chunk k, the rows
 * first, first + step, ..., first + (n - 1) * step of a segment (first =
 * segment start + k, step = r) and the heads [hlo, hlo + nh) of that chunk,
 * and runs dense attention on them. These move those rows between the full
 * (T, H, d) tensors and a dense (n, nh, d) block. */

/* out (n, nh, d) contiguous <- x rows first + m * step, heads [hlo, hlo +
 * nh); x (rows, H, d) at row stride ldx, elements of dtype (any, incl.
 * DT_F32). */
int dt_dilate_gather_cuda(dt_dtype_t dtype, int64_t n, int nh, int d, const void *x, int64_t ldx,
                          int64_t first, int64_t step, int hlo, void *out, cudaStream_t st,
                          dt_emsg_t *em);

/* out (nh, n) <- lse rows first + m * step of heads [hlo, hlo + nh); lse
 * (H, rows) fp32 at head stride ldl. (Gathers lse and delta for the
 * backward.) */
int dt_dilate_gather_rows_cuda(int64_t n, int nh, const float *lse, int64_t ldl, int64_t first,
                               int64_t step, int hlo, float *out, cudaStream_t st,
                               dt_emsg_t *em);

/* Merge a chunk's partial (o2 (n, nh, d) contiguous, lse2 (nh, n)) into the
 * full state (o (rows, H, d) at row stride ldo, lse (H, rows) at head stride
 * ldl) at rows first + m * step, heads [hlo, hlo + nh): branches of dilated
 * attention combine this way. */
int dt_dilate_merge_cuda(int64_t n, int nh, int d, const float *o2, const float *lse2, float *o,
                         int64_t ldo, float *lse, int64_t ldl, int64_t first, int64_t step,
                         int hlo, cudaStream_t st, dt_emsg_t *em);

/* dst rows first + m * step, heads [hlo, hlo + nh) (row stride ldd) +=
 * g (n, nh, d) contiguous, fp32: gradients of a chunk back into the full
 * tensor. */
int dt_dilate_scatter_add_cuda(int64_t n, int nh, int d, const float *g, float *dst, int64_t ldd,
                               int64_t first, int64_t step, int hlo, cudaStream_t st,
                               dt_emsg_t *em);

#ifdef __cplusplus
}
#endif

#endif /* DT_KERNELS_CUDA_ATTN_H */
