/* SPDX-License-Identifier: MIT
 *
 * Ring attention on GPUs: exact ring attention over the GPU ring of
 * engine/comm/comm.h, forward and backward, with the schedule of
 * engine/attn/attn.c: K/V (and in the backward dK/dV, one step behind)
 * move to the next rank on a communication stream while the current block
 * computes on the compute stream; CUDA events order the two (compute of
 * step s waits for the receive of step s, the send buffer of step s + 1 is
 * not overwritten before the compute of step s - 1 that read it is done).
 * The partial (o, lse) is fp32 on every rank for the whole ring.
 *
 * The ring itself (dt_ring_t: its transports, nccl or R ranks in one
 * process, the NCCL id over PMIx, abort, and the gradient collectives) is
 * engine/comm/comm.h's; this header adds the attention that runs on it.
 *
 * Tensors per local rank l (device, contiguous, layout order of
 * spec/layout.h, c = T / R rows): q (c, H, D), k and v (c, Hkv, D) of the
 * given dtype; o (c, H, D) and lse (H, c) fp32; dout (c, H, D) dtype; dq
 * (c, H, D), dk and dv (c, Hkv, D) fp32, WRITTEN.
 *
 * Supported: dense attention (nbranch 0), causal or not, GQA, contiguous
 * and zigzag layouts, any R dividing what the layout needs; dilated
 * attention (LongNet branches, any segment length and dilation): each
 * segment runs as a sub-ring of the ranks holding its rows (one rank: no
 * communication), with the dense ring's schedule; gather, blocks, merge by
 * LSE and scatter-add in kernels/cuda. The dense ring and the entry points
 * are engine/attn/ring_cuda.c, dilated attention engine/attn/dilated_cuda.c,
 * the workspace plan and a call's end engine/attn/ring_call.c.
 *
 * Thread: a ring is used by one host thread at a time (dt_ring_abort
 * excepted).
 */
#ifndef DT_ENGINE_RING_CUDA_H
#define DT_ENGINE_RING_CUDA_H

#include <stddef.h>

#include "common/err.h"
#include "engine/attn/attn.h"
#include "engine/comm/comm.h"
#include "kernels/cuda/attn_cuda.h"

typedef struct dt_ring_io {
    const void *q, *k, *v;
    float *o, *lse;
    const void *dout;
    float *dq, *dk, *dv;
    /* NULL: the inputs are complete when the call starts; else an event
     * the caller recorded on the stream that makes them (and that may still
     * read o): the ring's streams wait for it, the host does not */
    cudaEvent_t ready;
} dt_ring_io_t;

/* Forward over the ring: io[l] for each local rank. Synchronous: returns
 * when o and lse are complete. st (may be NULL) gets this process's
 * timing (for local rings, summed over its ranks: compute_s is the
 * compute streams' busy time, wait_s the exposed transfer time). */
int dt_ring_attn_fwd(dt_ring_t *r, const dt_attn_spec_t *s, dt_dtype_t dtype, dt_ring_io_t *io,
                     dt_attn_stats_t *st, dt_emsg_t *em);

/* Every local rank's workspace grown now to what a forward and a backward
 * of s take, so that no call grows it (cudaFree, which waits for the
 * device) while the caller has collectives in flight on the ring's
 * streams (the sharded GPU training state, engine/model/train_cuda.c). */
int dt_ring_attn_reserve(dt_ring_t *r, const dt_attn_spec_t *s, dt_dtype_t dtype,
                         dt_emsg_t *em);

/* Backward: io[l] has q, k, v, o, lse of the forward and dout; dq, dk, dv
 * are written. dK/dV travel with K/V, one step behind, and come home. */
int dt_ring_attn_bwd(dt_ring_t *r, const dt_attn_spec_t *s, dt_dtype_t dtype, dt_ring_io_t *io,
                     dt_attn_stats_t *st, dt_emsg_t *em);

/* Device bytes the ring allocates per rank for this spec, beyond the
 * caller's tensors (K/V double buffers, dK/dV buffers in the backward,
 * positions), for the planner and benchmarks: with dt's kernels (blocks
 * through cuDNN add their scratch, engine/attn/attn_block.h). */
size_t dt_ring_attn_bytes(const dt_attn_spec_t *s, dt_dtype_t dtype, int R, int backward);

#endif /* DT_ENGINE_RING_CUDA_H */
