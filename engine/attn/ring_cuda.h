/* SPDX-License-Identifier: MIT
 *
 * Ring attention on GPUs: the transport (NCCL, or R ranks inside one
 * process on one device) and exact dense ring attention over it, forward
 * and backward, with the schedule of engine/attn/attn.c: K/V (and in the
 * backward dK/dV, one step behind) move to the next rank on a
 * communication stream while the current block computes on the compute
 * stream; CUDA events order the two (compute of step s waits for the
 * receive of step s, the send buffer of step s + 1 is not overwritten
 * before the compute of step s - 1 that read it is done). The partial
 * (o, lse) is fp32 on every rank for the whole ring.
 *
 * Transports:
 *   - nccl: one rank per process, one device per rank. A non-blocking
 *     communicator (ncclConfig_t.blocking = 0); every wait polls the CUDA
 *     events and ncclCommGetAsyncError, and gives up after timeout_s or
 *     when dt_ring_abort was called (from any thread, e.g. the handler of
 *     a PMIx failure event): ncclCommAbort, then DT_ECOMM naming the
 *     cause. A dead peer therefore ends in an error, never a hang.
 *   - local: R ranks driven by one host thread on one device, each with
 *     its own compute and communication streams; a transfer is a
 *     device-to-device copy from the previous rank's send buffer on the
 *     receiver's communication stream, ordered by the same events. It runs
 *     the same schedule as nccl and is how one GPU tests a ring of R.
 *
 * The NCCL unique id travels through PMIx: dt_ring_nccl_pmix_new (rank 0
 * ncclGetUniqueId, PMIx_Put + Commit, PMIx_Fence with data collection,
 * PMIx_Get from rank 0). It is built only into programs that link libpmix
 * (dtengine), so the GPU tests stay free of it.
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
 * LSE and scatter-add in kernels/cuda.
 *
 * Thread: a ring is used by one host thread at a time (dt_ring_abort
 * excepted).
 */
#ifndef DT_ENGINE_RING_CUDA_H
#define DT_ENGINE_RING_CUDA_H

#include <stddef.h>

#include "common/err.h"
#include "engine/attn/attn.h"
#include "kernels/cuda/attn_cuda.h"

typedef struct dt_ring dt_ring_t;

/* Bytes of an NCCL unique id (NCCL_UNIQUE_ID_BYTES). */
#define DT_RING_ID_BYTES 128

/* R in-process ranks on device `device`. */
int dt_ring_local_new(int R, int device, dt_ring_t **out, dt_emsg_t *em);

/* Rank `rank` of an NCCL ring of R processes on device `device`; id is the
 * unique id (DT_RING_ID_BYTES) that rank 0 made with dt_ring_nccl_id and
 * every rank received. timeout_s bounds every wait (0: 300 s). */
int dt_ring_nccl_id(void *id, dt_emsg_t *em);
int dt_ring_nccl_new(int rank, int R, const void *id, int device, double timeout_s,
                     dt_ring_t **out, dt_emsg_t *em);

/* The same, with rank, size and the id from the PMIx server (Open MPI's
 * mpirun, srun --mpi=pmix, dtagentd); device = local rank modulo the
 * visible devices. In engine/comm/ring_pmix.c, linked by dtengine only. */
int dt_ring_nccl_pmix_new(double timeout_s, dt_ring_t **out, dt_emsg_t *em);

/* A hook every wait of every ring calls between its polls (e.g. dtengine's
 * heartbeat to its agent, so that waiting on a slow peer is not a hang);
 * NULL for none. Process-wide: set it once, before the first ring. */
void dt_ring_set_tick(void (*fn)(void));

void dt_ring_free(dt_ring_t *r);

int dt_ring_size(const dt_ring_t *r);   /* R */
int dt_ring_nlocal(const dt_ring_t *r); /* ranks this process drives: 1 or R */
int dt_ring_rank(const dt_ring_t *r, int l); /* global rank of local rank l */
const char *dt_ring_kind(const dt_ring_t *r); /* "nccl" or "local" */

/* Make the current or next wait fail with DT_ECOMM ("aborted: <why>") and
 * abort the communicator. Any thread; why must be a static string. */
void dt_ring_abort(dt_ring_t *r, const char *why);

/* In-place sum of n fp32 over all ranks (gradients); buf[l] for each local
 * rank. Synchronous: returns when the result is on the device. */
DT_MUST_CHECK int dt_ring_allreduce_sum_f32(dt_ring_t *r, float *const *buf, size_t n, dt_emsg_t *em);
/* buf[l] (n fp32 each, for each local rank) is cut into the ranks' slices,
 * rank g's [n g / R, n (g + 1) / R) (those of checkpoints and of
 * engine/comm/comm.h): every rank gets every rank's slice, in place
 * (shard = optimizer: the updated parameters). Synchronous; the caller
 * has finished writing its slice (its streams synchronised). */
DT_MUST_CHECK int dt_ring_allgather_slices_f32(dt_ring_t *r, float *const *buf, int64_t n,
                                               dt_emsg_t *em);

typedef struct dt_ring_io {
    const void *q, *k, *v;
    float *o, *lse;
    const void *dout;
    float *dq, *dk, *dv;
} dt_ring_io_t;

/* Forward over the ring: io[l] for each local rank. Synchronous: returns
 * when o and lse are complete. st (may be NULL) gets this process's
 * timing (for local rings, summed over its ranks: compute_s is the
 * compute streams' busy time, wait_s the exposed transfer time). */
int dt_ring_attn_fwd(dt_ring_t *r, const dt_attn_spec_t *s, dt_dtype_t dtype, dt_ring_io_t *io,
                     dt_attn_stats_t *st, dt_emsg_t *em);

/* Backward: io[l] has q, k, v, o, lse of the forward and dout; dq, dk, dv
 * are written. dK/dV travel with K/V, one step behind, and come home. */
int dt_ring_attn_bwd(dt_ring_t *r, const dt_attn_spec_t *s, dt_dtype_t dtype, dt_ring_io_t *io,
                     dt_attn_stats_t *st, dt_emsg_t *em);

/* Device bytes the ring allocates per rank for this spec, beyond the
 * caller's tensors (K/V double buffers, dK/dV buffers in the backward,
 * positions), for the planner and benchmarks. */
size_t dt_ring_attn_bytes(const dt_attn_spec_t *s, dt_dtype_t dtype, int R, int backward);

#endif /* DT_ENGINE_RING_CUDA_H */
