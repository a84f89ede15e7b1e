/* SPDX-License-Identifier: MIT
 *
 * Inside the GPU ring: struct dt_ring and the transport primitives that
 * the attention schedules (engine/attn/ring_cuda.c, dilated_cuda.c and
 * ring_call.c) build on. The transports
 * live in engine/comm/comm_nccl.c; nothing here is part of the ring's public
 * API (engine/comm/comm.h) or of engine/attn/ring_cuda.h.
 *
 * A ring has R ranks; this process drives nlocal of them (1 for NCCL, R for
 * the local transport), local rank l being global rank rank0 + l. Each
 * local rank has a compute stream, a communication stream, a fixed set of
 * events (enum ring_ev: the schedule names them by role, and the
 * transports record and wait them) and a workspace that grows on demand.
 * Streams are created blocking (they order after work on the legacy
 * default stream); the communication stream has the device's greatest
 * priority so transfers are not starved by attention kernels.
 *
 * Thread: one host thread uses a ring at a time; only abort_why is written
 * by other threads (dt_ring_abort).
 */
#ifndef DT_ENGINE_RING_IMPL_H
#define DT_ENGINE_RING_IMPL_H

#include <stdatomic.h>
#include <stddef.h>

#include <cuda_runtime_api.h>
/* nccl.h (and the fp16/bf16 headers it pulls in) is written for C++ and
 * old C: not clean under -Wundef and -Wstrict-prototypes */
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wundef"
#pragma GCC diagnostic ignored "-Wstrict-prototypes"
#include <nccl.h>
#pragma GCC diagnostic pop

#include "common/macros.h"
#include "engine/comm/comm.h"

enum ring_kind {
    RING_LOCAL = 0,
    RING_NCCL,
};

/* Events of one local rank. Pairs ([0], [1]) alternate by K/V buffer or
 * by step parity so that an event is never recorded again before every
 * wait on its previous record has been enqueued. */
enum ring_ev {
    RING_EV_KV0,   /* K/V buffer 0 holds its block (packed or received) */
    RING_EV_KV1,   /* ... buffer 1 */
    RING_EV_COMP0, /* compute stream done with the step of parity 0 */
    RING_EV_COMP1,
    RING_EV_G0,    /* gradient exchange of step parity 0 complete */
    RING_EV_G1,
    RING_EV_ADD0,  /* gradient of step parity 0 accumulated: ready to send,
                    * and the gradient receive buffer is free again */
    RING_EV_ADD1,
    RING_EV_DONE,  /* compute stream: end of a call */
    RING_EV_CDONE, /* communication stream: end of a call */
    RING_EV_COLL0, /* communication stream: a range collective of slot 0 done */
    RING_EV_COLL1, /* ... of slot 1, 2, 3 (DT_RING_COLL_SLOTS) */
    RING_EV_COLL2,
    RING_EV_COLL3,
    RING_EV_AFTER, /* a caller's stream: what it queued before a range
                    * collective (dt_ring_coll_after) */
    RING_EV_NSYNC, /* events above: no timing */
    /* timing events (cudaEventElapsedTime) */
    RING_EV_TBEGIN = RING_EV_NSYNC,
    RING_EV_TEND,
    RING_EV_TSTART0,
    RING_EV_TSTART1,
    RING_EV_TSTOP0,
    RING_EV_TSTOP1,
    RING_NEV
};

typedef struct ring_peer {
    cudaStream_t compute; /* attention kernels, packing, merges */
    cudaStream_t comm;    /* transfers */
    cudaEvent_t ev[RING_NEV];
    void *ws;       /* device workspace of an attention call (ring_call.h) */
    size_t wsbytes; /* its size */
} ring_peer_t;

struct dt_ring {
    enum ring_kind kind;
    int R;      /* ranks of the ring */
    int nlocal; /* ranks driven by this process */
    int rank0;  /* global rank of local rank 0 */
    int device;
    double timeout_s; /* bound on every wait without progress */
    ncclComm_t comm;  /* NCCL only; NULL once aborted */
    ring_peer_t *p;   /* [nlocal] */
    _Atomic(const char *) abort_why; /* set by dt_ring_abort, any thread */
    int dead;          /* unusable: dead_msg says why */
    char dead_msg[sizeof(dt_emsg_t)];
};

/* Default bound on a wait without progress, seconds. */
#define DT_RING_TIMEOUT_S 300.0

/* Start of every call: select the device, refuse a dead ring, and turn a
 * pending dt_ring_abort into DT_ECOMM ("aborted: <why>"), aborting the
 * communicator. */
DT_MUST_CHECK int dt_ring_enter(dt_ring_t *r, dt_emsg_t *em);

/* One ring step of one channel. For each local rank l, on l's
 * communication stream: send `bytes` of send[l] to the next rank and
 * receive `bytes` into recv[l] from the previous rank, then record
 * ev[done] of l there. Before calling, the caller has made each
 * communication stream wait for whatever must finish before recv[l] may be
 * overwritten. The transfer itself waits ev[sready] of the rank whose send
 * buffer it reads: its own (nccl) or the sending rank's (local, where the
 * receiver copies). A failure leaves the ring dead (NCCL aborted). */
DT_MUST_CHECK int dt_ring_xchg(dt_ring_t *r, void *const *send, void *const *recv, size_t bytes,
                               int sready, int done, dt_emsg_t *em);

/* The general step, for sub-rings (dilated segments held by some of the
 * ranks): local rank l sends sbytes of send to global rank `to` and
 * receives rbytes into recv from global rank `from`; to < 0: l takes no
 * part. Sizes may differ between ranks but must match pairwise (the
 * local transport checks; NCCL would hang or fail). Zero-byte sides are
 * left out. Same events and failure rules as dt_ring_xchg. xf[nlocal]. */
typedef struct dt_ring_xfer {
    int to, from;
    void *send, *recv;
    size_t sbytes, rbytes;
} dt_ring_xfer_t;

DT_MUST_CHECK int dt_ring_xchgv(dt_ring_t *r, const dt_ring_xfer_t *xf, int sready, int done,
                                dt_emsg_t *em);

/* The event after which local rank l's send buffer of the exchange that
 * recorded `done` has been read completely: l's own (nccl: the group
 * completes as a whole) or that of global rank `to`, the receiver (local:
 * the receiver copies). */
cudaEvent_t dt_ring_sent_event(const dt_ring_t *r, int done, int l, int to);

/* Watchdog wait: block until ev[slots[i]] of every local rank has
 * completed, polling with short sleeps; fail with DT_ECOMM on an NCCL
 * asynchronous error, on dt_ring_abort, or after timeout_s without the
 * events completing (the ring is then dead and the communicator aborted),
 * DT_EDEVICE on a CUDA error. `what` names the wait in messages. */
DT_MUST_CHECK int dt_ring_wait(dt_ring_t *r, const int *slots, int nslot, const char *what,
                               dt_emsg_t *em);

/* After a failure with work in flight: abort the NCCL communicator when
 * `posted` (peers may be waiting on transfers that will never come; the
 * ring is dead), then wait, bounded by timeout_s, until every stream of
 * the ring is idle so no queued work touches buffers the caller frees. */
void dt_ring_drain(dt_ring_t *r, int posted, const dt_emsg_t *why);

/* Grow local rank l's workspace to at least `bytes` (contents are lost);
 * only between calls' work (cudaFree synchronises the device). */
DT_MUST_CHECK int dt_ring_ws(dt_ring_t *r, int l, size_t bytes, void **out, dt_emsg_t *em);

#endif /* DT_ENGINE_RING_IMPL_H */
