/* SPDX-License-Identifier: MIT
 *
 * The engine's transports. The CPU one (dt_comm_*): the ranks of one job
 * and point-to-point and collective operations between them, over Open
 * MPI. Ranks are PMIx clients: under mpirun, `srun --mpi=pmix` or
 * dtagentd, MPI_Init gets identity and wire-up from that PMIx server.
 * Started plainly (no PMIx server in the environment), the process is a
 * single rank and MPI is never initialised.
 *
 * Large buffers are split into pieces MPI's int counts can hold. Errors from
 * MPI come back as DT_ECOMM (MPI's error handler is set to return).
 * Thread: call from one thread only.
 *
 * The GPU ring (dt_ring_*, at the end): its transports, in
 * engine/comm/comm_nccl.c and ring_pmix.c, built with CUDA only; ring
 * attention (engine/attn/ring_cuda.h) is scheduled over it.
 */
#ifndef DT_COMM_H
#define DT_COMM_H

#include <stddef.h>
#include <stdint.h>

#include "common/err.h"
#include "common/macros.h"

typedef struct dt_comm dt_comm_t;
typedef struct dt_comm_op dt_comm_op_t;

/* Join the job. Returns 0 and a new communicator, or DT_ECOMM. */
int dt_comm_new(int *argc, char ***argv, dt_comm_t **out, dt_emsg_t *em);
/* Groups of the job's ranks (dp = N: the rings, and the replicas across
 * them): ranks passing the same color form one group, ordered by key.
 * Every rank must call it. *out is freed with dt_comm_free (before the
 * communicator it came from); a solo process gets a group of one.
 * DT_ECOMM. */
int dt_comm_split(dt_comm_t *c, int color, int key, dt_comm_t **out, dt_emsg_t *em);
/* Leave the job (MPI_Finalize when it was initialised), or free a group.
 * NULL is a no-op. */
void dt_comm_free(dt_comm_t *c);
/* Abort every rank of the job with this exit code (does not return). */
void dt_comm_abort(dt_comm_t *c, int code) __attribute__((noreturn));

int dt_comm_rank(const dt_comm_t *c);
int dt_comm_size(const dt_comm_t *c);
/* "mpi" when MPI was initialised, "solo" for a single plain process. */
const char *dt_comm_kind(const dt_comm_t *c);
/* 1 when threads other than the calling one may run beside communication
 * (a solo process, or MPI at MPI_THREAD_FUNNELED or above). */
int dt_comm_threads_ok(const dt_comm_t *c);

/* Start sending sbytes from sbuf to rank dst and receiving rbytes into rbuf
 * from rank src with this tag (either side may have 0 bytes and is then
 * skipped). Buffers must stay untouched until the op completes. */
DT_MUST_CHECK int dt_comm_start(dt_comm_t *c, const void *sbuf, size_t sbytes, int dst,
                                void *rbuf, size_t rbytes, int src, int tag, dt_comm_op_t **out);
/* Let MPI move data of an op in flight (call between compute tiles). NULL
 * is a no-op. Returns 1 when the op is complete, 0 when not. */
int dt_comm_test(dt_comm_op_t *op);
/* Wait for the op and free it. NULL is a no-op returning 0. */
DT_MUST_CHECK int dt_comm_wait(dt_comm_op_t *op);

/* Blocking send and receive (rank 0 collecting results). */
DT_MUST_CHECK int dt_comm_send(dt_comm_t *c, const void *buf, size_t bytes, int dst, int tag);
DT_MUST_CHECK int dt_comm_recv(dt_comm_t *c, void *buf, size_t bytes, int src, int tag);

/* Collectives. Every rank must call them in the same order; a failed one
 * leaves the ranks out of step, so its result is never dropped
 * (DT_MUST_CHECK): the caller ends the command with it. */
DT_MUST_CHECK int dt_comm_barrier(dt_comm_t *c);
/* In-place sum of n floats over all ranks. */
DT_MUST_CHECK int dt_comm_allreduce_sum_f32(dt_comm_t *c, float *buf, size_t n);
/* In-place max/sum of n doubles over all ranks. */
DT_MUST_CHECK int dt_comm_allreduce_max_f64(dt_comm_t *c, double *buf, size_t n);
DT_MUST_CHECK int dt_comm_allreduce_sum_f64(dt_comm_t *c, double *buf, size_t n);
/* Ranges of a flat array of n floats cut into S slices, slice k the
 * elements [n k / S, n (k + 1) / S) (sharded training state: with dp = 1
 * S = R and rank r keeps slice r; with dp = N the state is in R N slices
 * and the groups of dt_comm_split see consecutive runs of them). Member j
 * of c owns slice s0 + j; its part of a range [a, b) is the range within
 * that slice. [a, b) must lie inside the members' slices. */
typedef struct dt_comm_slicing {
    int64_t n;
    int S, s0;
} dt_comm_slicing_t;
/* buf is the whole flat array (sl->n floats), this rank's slice filled
 * in: every member gets every member's slice, in place (the updated
 * parameters of shard = optimizer and gradients). */
DT_MUST_CHECK int dt_comm_allgather_slices_f32(dt_comm_t *c, const dt_comm_slicing_t *sl,
                                               float *buf);
/* mine holds this rank's part of [a, b) (possibly empty); every member gets
 * the whole range into out (b - a floats): a unit of shard = parameters
 * gathered before use. One member alone: a copy. */
DT_MUST_CHECK int dt_comm_gather_range_f32(dt_comm_t *c, const dt_comm_slicing_t *sl, int64_t a,
                                           int64_t b, const float *mine, float *out);
/* The same gather started and left in flight (an MPI nonblocking
 * all-gather): *op completes it with dt_comm_wait, and dt_comm_test moves
 * it on; mine and out stay untouched until then. Collectives must still
 * be started in the same order on every member. A member alone (or a
 * range of more pieces than an op holds) gathers at once: *op = NULL. */
DT_MUST_CHECK int dt_comm_gather_range_start(dt_comm_t *c, const dt_comm_slicing_t *sl,
                                             int64_t a, int64_t b, const float *mine,
                                             float *out, dt_comm_op_t **op);
/* in (b - a floats) is this rank's addend for [a, b); the sum over the
 * members of this rank's part is written to mine (a unit's gradient under
 * shard = gradients). MPI's reduce-scatter: with 2 members the sum is an
 * all-reduce's to the bit (one addition), with more its order may differ. */
DT_MUST_CHECK int dt_comm_reduce_scatter_range_f32(dt_comm_t *c, const dt_comm_slicing_t *sl,
                                                   int64_t a, int64_t b, const float *in,
                                                   float *mine);
/* Every rank gets rank 0's value of *code. */
DT_MUST_CHECK int dt_comm_bcast_int(dt_comm_t *c, int *code);
/* Agree on an outcome: returns the smallest rc over all ranks (0 when every
 * rank succeeded) and sets *who to the rank that should report it, so
 * exactly one rank prints an error every rank shares. A rank passes
 * relayed = 1 when its rc only repeats another rank's failure; among equal
 * codes a rank with the original failure is chosen. A transport failure
 * returns DT_ECOMM. */
DT_MUST_CHECK int dt_comm_agree(dt_comm_t *c, int rc, int relayed, int *who);

/* ---- The GPU ring ----------------------------------------------------------
 * R ranks, each on one device, that pass buffers to the next rank.
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
 * Thread: a ring is used by one host thread at a time (dt_ring_abort
 * excepted).
 */
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
 * visible devices. grp NULL: the whole job is the ring. Otherwise the
 * ring is one group of the job's ranks (dp = N: each ring of R ranks, and
 * across them the replicas at each ring rank): this process is member
 * grp->rank of grp->size, the group's member 0 is the job's rank
 * grp->leader (it makes the id), and grp->color (the same on every
 * member, different between groups made by the same call) names the id's
 * key. Every rank of the job calls it, for one group each, at once (one
 * fence). In engine/comm/ring_pmix.c, linked by dtengine only. */
typedef struct dt_ring_group {
    int color, rank, size, leader;
} dt_ring_group_t;
int dt_ring_nccl_pmix_new(double timeout_s, const dt_ring_group_t *grp, dt_ring_t **out,
                          dt_emsg_t *em);

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
/* buf[l] (sl->n fp32 each, for each local rank) is cut into slices as sl
 * says (dt_comm_slicing_t: member g owns slice sl->s0 + g of sl->S; with
 * dp = 1 S = R and s0 = 0, those of checkpoints; with dp = N the replicas'
 * ring at ring rank r has S = R N, s0 = r N): every rank gets every rank's
 * slice, in place (shard = optimizer: the updated parameters).
 * Synchronous; the caller has finished writing its slice (its streams
 * synchronised). */
DT_MUST_CHECK int dt_ring_allgather_slices_f32(dt_ring_t *r, float *const *buf,
                                               const dt_comm_slicing_t *sl, dt_emsg_t *em);

/* Sharded training state on the GPUs, a range [a, b) of a flat array of n
 * elements at a time (the units of shard = gradients and parameters,
 * engine/model/train_cuda.c), cut into the members' slices as sl says
 * (as above: [a, b) must lie inside the members' slices). Both
 * are queued on the ring's communication stream behind what it holds
 * already and return at once; dt_ring_coll_wait(slot) waits (a watchdog
 * wait) for the last one started with that slot (0 to DT_RING_COLL_SLOTS -
 * 1) and everything queued before it. The caller has finished what
 * writes their inputs or still reads their outputs' old contents
 * (synchronised, or queued on a stream that dt_ring_coll_after has the
 * collectives wait for), and leaves both alone until the wait. One local
 * rank (an NCCL ring, or a local ring of one); a range collective of a
 * ring of one is a copy.
 *
 * Gather: mine holds this rank's part of [a, b) (its slice's, possibly
 * empty), elem bytes an element; every rank gets the whole range into out
 * (b - a elements): the grouped sends and receives of each part to and from
 * every peer (the parts differ in length, so no ncclAllGather). mine may
 * be this rank's own place in out (a gather in place: dp's second level
 * gathers the first's result where it lies). */
#define DT_RING_COLL_SLOTS 4
DT_MUST_CHECK int dt_ring_gather_range(dt_ring_t *r, const dt_comm_slicing_t *sl, int64_t a,
                                       int64_t b,
                                       size_t elem, const void *mine, void *out, int slot,
                                       dt_emsg_t *em);
/* Reduce-scatter of fp32: in (b - a) is this rank's addend for [a, b);
 * this rank's part of the sum over the ranks, in rank order (the same bits
 * as the ring's all-reduce on the simulator; on NCCL within rounding of
 * it), is written to mine, or added to it (acc). scratch (scratch_n fp32,
 * at least R) holds the peers' addends, a chunk of scratch_n / R at a
 * time. */
DT_MUST_CHECK int dt_ring_reduce_scatter_range(dt_ring_t *r, const dt_comm_slicing_t *sl,
                                               int64_t a, int64_t b, const float *in,
                                               float *mine, int acc, float *scratch,
                                               int64_t scratch_n, int slot, dt_emsg_t *em);
DT_MUST_CHECK int dt_ring_coll_wait(dt_ring_t *r, int slot, dt_emsg_t *em);
/* The other way round: the range collectives started on r after this call
 * wait, on the device, for what the caller's CUDA stream (a cudaStream_t)
 * holds now (the kernels that write their inputs or read their outputs'
 * old contents), so the host need not synchronise first. Returns at once. */
DT_MUST_CHECK int dt_ring_coll_after(dt_ring_t *r, void *stream, dt_emsg_t *em);
/* The caller's CUDA stream (a cudaStream_t) waits, on the device, for the
 * last range collective started with that slot: what it queues next (a
 * copy of the collective's output, say) runs after it. Returns at once. */
DT_MUST_CHECK int dt_ring_coll_then(dt_ring_t *r, int slot, void *stream, dt_emsg_t *em);
/* The same for a collective of another ring: next's communication stream
 * waits for prev's last range collective of slot pslot, so that what next
 * starts after this call reads prev's result (dp's two levels: around the
 * ring, then across the replicas, or the other way round). */
DT_MUST_CHECK int dt_ring_coll_chain(dt_ring_t *prev, int pslot, dt_ring_t *next,
                                     dt_emsg_t *em);

#endif /* DT_COMM_H */
