/* SPDX-License-Identifier: MIT
 *
 * CPU attention kernels for one head: the building block of dense, ring and
 * dilated attention. Each op has a fast path (tiled, flash-style; memory
 * O(tile) plus one packed copy of the call's K, and V in the backward, not
 * O(Tq*Tk); several kernels, see dt_attn_cpu_kernel_set) and a plain-C
 * reference with the same signature; tests compare the two.
 *
 * Shapes (one head): q (Tq, D) with row stride ldq, k and v (Tk, D) with row
 * strides ldk and ldv, o (Tq, D) with row stride ldo, lse (Tq). Strides let
 * a caller pass one head of a (T, H, D) tensor without copying (ld = H * D).
 *
 * Masking: when qpos and kpos are both non-NULL the attention is causal by
 * position: key j is visible to query i iff kpos[j] <= qpos[i]; with a
 * mask (spec/mask.h; positions then required) instead iff the mask allows
 * (qpos[i], kpos[j]) for query head `head`. Positions are int64 and need
 * not be contiguous or sorted (tiles whose keys no query may attend are
 * skipped, tiles that every pair may are not masked at all, so sorted
 * runs are fast).
 *
 * Forward accumulates: (o, lse) on entry is a running softmax state (o
 * normalised, lse the natural log of the sum of exp(score) so far, -inf for
 * "no keys yet", in which case o must be 0) and on return includes the keys
 * of this call. Accumulating over blocks of keys in any order gives softmax
 * attention over the union of those keys; this is the LSE merge done inside
 * the kernel, overflow-safe because every exponent is taken relative to the
 * running maximum. A query that sees no key keeps o = 0, lse = -inf.
 *
 * Backward adds into dq, dk, dv the gradients of this key block, given the
 * final lse of the forward and delta[i] = sum_d dout[i,d] * o[i,d] (o the
 * final output). Summing over the blocks gives the full gradient.
 *
 * Thread: calls on different threads may run at once (the kernel choice is
 * the only global state, set before); one call runs on its caller's thread
 * (the blas kernel: as many BLAS threads as the caller's BLAS setting).
 */
#ifndef DT_KERNELS_CPU_ATTN_H
#define DT_KERNELS_CPU_ATTN_H

#include <stdint.h>

struct dt_mask;

#ifdef __cplusplus
extern "C" {
#endif

typedef struct dt_attn_head {
    int64_t tq, tk;
    int d;
    const float *q; /* (tq, d) at stride ldq */
    int64_t ldq;
    const float *k; /* (tk, d) at stride ldk */
    int64_t ldk;
    const float *v; /* (tk, d) at stride ldv */
    int64_t ldv;
    const int64_t *qpos; /* (tq) or NULL */
    const int64_t *kpos; /* (tk) or NULL */
    /* NULL, or the mask over positions that replaces causality by
     * position (its own causal says whether); head: the query head, for
     * a mask with a block pattern per head */
    const struct dt_mask *mask;
    int head;
    /* NULL, or (reference only: dt_attn_head_fwd_ref and _bwd_ref, the
     * GPU kernels' contract as the simulator checks it) the key positions
     * [qlo[i], qhi[i]) that query i may attend, instead of causality and
     * mask: the interval form of causal, document and window masks
     * (spec/mask.h dt_mask_row); needs qpos and kpos */
    const int64_t *qlo, *qhi;
    float scale;         /* scores are scale * q.k */
    /* called between tiles (e.g. to progress communication); may be NULL */
    void (*progress)(void *arg);
    void *progress_arg;
    /* 0, or a name for the content of k and v that no other content ever
     * had in this process (from dt_attn_kv_ids): calls with the same kv_id may
     * share the kernel's packed copies of K and V (the query heads of one
     * GQA group), so k and v must not change between such calls */
    uint64_t kv_id;
} dt_attn_head_t;

/* n fresh kv_ids, the first returned (the others follow it): process-wide,
 * never 0, never handed out twice. */
uint64_t dt_attn_kv_ids(uint64_t n);

/* Forward: accumulate into o (tq, d) at stride ldo and lse (tq). */
void dt_attn_head_fwd_cpu(const dt_attn_head_t *a, float *o, int64_t ldo, float *lse);
void dt_attn_head_fwd_ref(const dt_attn_head_t *a, float *o, int64_t ldo, float *lse);

/* Backward: dout (tq, d) at stride lddo, lse and delta (tq) of the final
 * forward; adds into dq (tq, d) at ldq of a, dk (tk, d) at ldk, dv (tk, d) at
 * ldv (the same strides as q, k, v). */
typedef struct dt_attn_head_grad {
    const float *dout;
    int64_t lddo;
    const float *lse;
    const float *delta;
    float *dq;
    float *dk;
    float *dv;
} dt_attn_head_grad_t;

void dt_attn_head_bwd_cpu(const dt_attn_head_t *a, const dt_attn_head_grad_t *g);
void dt_attn_head_bwd_ref(const dt_attn_head_t *a, const dt_attn_head_grad_t *g);

/* The fast path has several kernels: "avx512", "avx2" (x86-64 with
 * AVX2 and FMA), "generic" (4-lane vectors, any CPU) and "blas" (the
 * tiled loops over cblas_sgemm). A vector kernel needs d to be a multiple
 * of its width (16, 8, 4); for other d the next kernel down is used, and
 * blas takes any d. dt_attn_cpu_kernel_set picks the first kernel tried
 * ("auto" or NULL: the widest this CPU runs; the first call without one
 * reads $DT_ATTN_KERNEL), -1 for a name this build lacks or a kernel this
 * CPU cannot run. Call it before any thread runs a kernel. */
int dt_attn_cpu_kernel_set(const char *name);
/* The first kernel tried (what dt_attn_cpu_kernel_set chose). */
const char *dt_attn_cpu_kernel_first(void);
/* The kernel a head of size d runs on. */
const char *dt_attn_cpu_kernel(int d);
/* The names dt_attn_cpu_kernel_set takes, comma separated. */
const char *dt_attn_cpu_kernel_names(void);

/* Merge a partial result (o2, lse2) into (o1, lse1), rows of d at strides
 * ld1 and ld2, n rows: the result is attention over the union of both key
 * sets. Overflow-safe for any finite lse; -inf marks an empty partial. */
void dt_attn_merge_cpu(int64_t n, int d, float *o1, int64_t ld1, float *lse1,
                       const float *o2, int64_t ld2, const float *lse2);

/* delta[i] = sum_d dout[i, d] * o[i, d] for n rows (strides lddo, ldo). */
void dt_attn_delta_cpu(int64_t n, int d, const float *dout, int64_t lddo,
                       const float *o, int64_t ldo, float *delta);

#ifdef __cplusplus
}
#endif

#endif /* DT_KERNELS_CPU_ATTN_H */
