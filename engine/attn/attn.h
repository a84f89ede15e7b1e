/* SPDX-License-Identifier: MIT
 *
 * Exact attention over a sequence split across the ranks of a job: dense
 * (ring) and dilated (LongNet), causal or not, GQA, both layouts, forward
 * and backward. Single rank is the R = 1 case of the same code.
 *
 * Tensors (local rows of this rank, in layout order, see layout.h):
 *   q (c, H, D), k and v (c, Hkv, D), o (c, H, D) fp32, lse (H, c) fp32,
 *   c = T / R. Query head h reads kv head h / (H / Hkv).
 *
 * Dense attention is one branch with segment T and dilation 1: K/V of Hkv
 * heads travel around the ring of all R ranks (double-buffered; the next
 * block moves while the current one computes), Q stays; causal blocks that
 * lie wholly in the future are skipped.
 *
 * Dilated attention (LongNet / torchscale semantics). For each branch
 * (w, r): the sequence is cut into segments of w positions; the H heads are
 * padded to a multiple of r and cut into r contiguous chunks of
 * ceil(H / r) heads; head chunk k uses, inside each segment starting at s,
 * the positions p with (p - s) mod r == k; those sparsified positions attend
 * densely to each other (causally by position when causal). Branches merge
 * by their LSE, which equals softmax attention over the multiset union of
 * the branches' keys. A (position, head) that no branch covers has o = 0
 * and lse = -inf. When T is not a multiple of w the last segment is shorter
 * (T mod w positions) and is sparsified the same way.
 *
 * Distributed dilated: a segment whose tokens all lie on one rank is
 * computed there with no communication. A segment that spans ranks forms a
 * sub-ring of exactly the ranks holding its tokens, and only their dilated
 * K/V travel (per head chunk: the rows at that chunk's offset, of the kv
 * heads the chunk reads; about c / r rows per rank per chunk). Segments need
 * not align with rank boundaries; any w, r with r dividing w works with both
 * layouts. A rank whose tokens touch several segments (zigzag) takes part
 * in each sub-ring in ascending segment order.
 */
#ifndef DT_ATTN_H
#define DT_ATTN_H

#include <stdbool.h>
#include <stdint.h>

#include "common/err.h"
#include "engine/comm/comm.h"
#include "spec/attn_spec.h"
#include "spec/layout.h"


/* Timing of the last call on this rank, for benchmarks and the summary. */
typedef struct dt_attn_stats {
    double compute_s;  /* inside the kernels */
    double wait_s;     /* blocked waiting for a ring transfer to finish */
    double total_s;    /* the whole call */
    double bytes_sent; /* ring traffic sent by this rank */
    int steps;         /* ring steps (blocks computed) */
    int pieces_cudnn;  /* GPU: block pieces cuDNN ran (engine/attn/attn_block.h) */
    int pieces_dt;     /* GPU: blocks or pieces dt's kernels ran */
} dt_attn_stats_t;

/* A hook the ring calls often (between tiles of the kernels, on the
 * calling thread), e.g. dtengine's heartbeat to its agent, so that one
 * long ring step is not taken for a hang; NULL (the default) for none.
 * Process-wide: set it once, before the first call. */
void dt_attn_set_tick(void (*fn)(void));

/* Threads per rank for the CPU kernels (default 1): a block's heads are
 * spread over n threads (OpenMP), the forward a query head at a time, the
 * backward a kv head's group at a time (so a job with one kv head runs its
 * backward on one thread). Each head's arithmetic is the same whatever n,
 * so results do not depend on it. Heads whose size only the blas kernel
 * takes run on one thread (OpenBLAS's threads instead). Process-wide: set
 * it before the first call. */
void dt_attn_set_threads(int n);

/* Forward over this rank's rows. Every rank of comm must call it with the
 * same spec. o and lse are overwritten. */
int dt_attn_fwd(dt_comm_t *comm, const dt_attn_spec_t *s, const float *q, const float *k,
                const float *v, float *o, float *lse, dt_attn_stats_t *st, dt_emsg_t *em);

/* Backward: given the forward's o and lse and dout (c, H, D), write dq
 * (c, H, D), dk and dv (c, Hkv, D). dK/dV travel with K/V and come home. */
int dt_attn_bwd(dt_comm_t *comm, const dt_attn_spec_t *s, const float *q, const float *k,
                const float *v, const float *o, const float *lse, const float *dout,
                float *dq, float *dk, float *dv, dt_attn_stats_t *st, dt_emsg_t *em);

#endif /* DT_ATTN_H */
