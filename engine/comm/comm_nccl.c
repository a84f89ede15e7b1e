/* SPDX-License-Identifier: MIT
 *
 * The GPU ring's transports (engine/comm/comm.h, engine/comm/ring_impl.h):
 * creating and freeing rings, the one-step exchange both schedules
 * (engine/attn/ring_cuda.c, the dense ring, and dilated_cuda.c) are built
 * from, the watchdog wait, abort, and the gradient all-reduce.
 *
 *   nccl:  one rank per process on its own device, a non-blocking NCCL
 *          communicator. An exchange is ncclGroupStart, ncclSend to the
 *          next rank, ncclRecv from the previous one (or, for the sub-rings
 *          of dilated attention, any two ranks), ncclGroupEnd on the
 *          rank's communication stream; when NCCL answers ncclInProgress
 *          the host polls ncclCommGetAsyncError until the operation is
 *          enqueued (NCCL's rule for non-blocking communicators) before it
 *          records the "received" event behind it.
 *   local: R ranks on one device in this process; the receiver copies the
 *          sending rank's send buffer into its receive buffer on its own
 *          communication stream (cudaMemcpyAsync device to device) after
 *          waiting the sender's "send buffer ready" event.
 *
 * Every wait polls CUDA events with short sleeps (50 to 200 us) and, for
 * NCCL, ncclCommGetAsyncError; an asynchronous NCCL error, timeout_s without
 * progress, or dt_ring_abort ends it: ncclCommAbort (performed by the thread
 * that uses the ring: NCCL communicators are not shared between threads
 * here), the ring is marked dead, DT_ECOMM names the cause. NCCL and CUDA
 * errors are translated here and in engine/attn's GPU ring (ring_cuda.c,
 * dilated_cuda.c, ring_call.c) only.
 *
 * Not here: the attention schedules (ring_cuda.c, dilated_cuda.c), the
 * PMIx wire-up of the unique id (ring_pmix.c).
 */
#include "config.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "common/clock.h"
#include "common/mem.h"
#include "engine/comm/ring_impl.h"
#include "kernels/cuda/cuda_err.h"
#include "kernels/cuda/train_cuda.h" /* dt_sum_slots_cuda */

_Static_assert(NCCL_UNIQUE_ID_BYTES == DT_RING_ID_BYTES, "DT_RING_ID_BYTES must match NCCL");
_Static_assert(RING_EV_COLL3 - RING_EV_COLL0 + 1 == DT_RING_COLL_SLOTS,
               "a range collective's slot is an event");

/* Most ranks one process drives in a local ring (streams and events grow
 * with it; a local ring is a test and development tool). */
#define RING_MAXLOCAL 64

/* ncclInProgress is how a non-blocking communicator says "not yet". */
#define NCCL_FAILED(res) ((res) != ncclSuccess && (res) != ncclInProgress)

/* ---- messages and death ------------------------------------------------ */

static void ring_name(const dt_ring_t *r, char *buf, size_t n)
{
    if (r->kind == RING_NCCL)
        snprintf(buf, n, "nccl ring rank %d of %d", r->rank0, r->R);
    else
        snprintf(buf, n, "local ring of %d ranks", r->R);
}

static const char *nccl_last(ncclComm_t comm)
{
    const char *s = ncclGetLastError(comm);
    return s != NULL && *s != '\0' ? s : "no detail from NCCL";
}

/* The ring can no longer be used: abort the communicator (peers blocked in
 * transfers with us get an error instead of a hang) and remember why. */
static int die(dt_ring_t *r, int rc, const dt_emsg_t *em)
{
    if (r->comm != NULL) {
        (void)ncclCommAbort(r->comm);
        r->comm = NULL;
    }
    if (!r->dead) {
        r->dead = 1;
        snprintf(r->dead_msg, sizeof(r->dead_msg), "%s", em != NULL ? em->s : dt_strerror(rc));
    }
    return rc;
}

/* "<ring>, <what>: <message>" into em, then die. */
static __attribute__((format(printf, 5, 6))) int fail(dt_ring_t *r, int rc, const char *what,
                                                      dt_emsg_t *em, const char *fmt, ...)
{
    char name[64], msg[320];
    va_list ap;

    ring_name(r, name, sizeof(name));
    va_start(ap, fmt);
    vsnprintf(msg, sizeof(msg), fmt, ap);
    va_end(ap);
    dt_emsg_set(em, rc, "%s, %s: %s", name, what, msg);
    return die(r, rc, em);
}

/* A CUDA call of the transport failed: the ring is dead. */
#define RING_CUDA(r, em, call)                                                          \
    do {                                                                                \
        cudaError_t ring_e_ = (call);                                                   \
        if (ring_e_ != cudaSuccess)                                                     \
            return die((r), dt_cuda_err((em), ring_e_, #call, __FILE__, __LINE__), (em)); \
    } while (0)

/* ---- polling ------------------------------------------------------------ */

/* Sleep *us microseconds, then back off up to 200 us. */
static void (*tick)(void);

void dt_ring_set_tick(void (*fn)(void))
{
    tick = fn;
}

/* Between polls of a wait: a short sleep, growing, and the caller's tick. */
static void nap(unsigned *us)
{
    if (tick)
        tick();
    struct timespec ts = { 0, (long)*us * 1000L };

    nanosleep(&ts, NULL);
    if (*us < 200)
        *us *= 2;
}

/* One watchdog check while waiting since t0: 0 to go on waiting, or the
 * ring is dead and em says why. */
static int watch(dt_ring_t *r, double t0, const char *what, dt_emsg_t *em)
{
    const char *why = atomic_load(&r->abort_why);

    if (why != NULL)
        return fail(r, DT_ECOMM, what, em, "aborted: %s", why);
    if (r->comm != NULL) {
        ncclResult_t st = ncclSuccess, e = ncclCommGetAsyncError(r->comm, &st);
        if (e != ncclSuccess)
            st = e;
        if (NCCL_FAILED(st))
            return fail(r, DT_ECOMM, what, em, "NCCL: %s (%s)", ncclGetErrorString(st),
                        nccl_last(r->comm));
    }
    if (dt_clock_now() - t0 > r->timeout_s)
        return fail(r, DT_ECOMM, what, em, "no progress for %.0f s", r->timeout_s);
    return 0;
}

/* After an NCCL call answered ncclInProgress: poll until the communicator
 * is ready (the operation is enqueued), under the watchdog. */
static int settle(dt_ring_t *r, const char *what, dt_emsg_t *em)
{
    double t0 = dt_clock_now();
    unsigned us = 50;
    int rc;

    for (;;) {
        ncclResult_t st = ncclInProgress;
        if (ncclCommGetAsyncError(r->comm, &st) == ncclSuccess && st == ncclSuccess)
            return 0;
        if ((rc = watch(r, t0, what, em)) < 0)
            return rc;
        nap(&us);
    }
}

int dt_ring_wait(dt_ring_t *r, const int *slots, int nslot, const char *what, dt_emsg_t *em)
{
    double t0 = dt_clock_now();
    unsigned us = 50;
    int rc;

    for (;;) {
        int pending = 0;
        for (int l = 0; l < r->nlocal; l++)
            for (int i = 0; i < nslot; i++) {
                cudaError_t e = cudaEventQuery(r->p[l].ev[slots[i]]);
                if (e == cudaErrorNotReady)
                    pending = 1;
                else if (e != cudaSuccess)
                    return die(r, dt_cuda_err(em, e, "cudaEventQuery", __FILE__, __LINE__), em);
            }
        if (!pending)
            return 0;
        if ((rc = watch(r, t0, what, em)) < 0)
            return rc;
        nap(&us);
    }
}

void dt_ring_drain(dt_ring_t *r, int posted, const dt_emsg_t *why)
{
    double t0 = dt_clock_now();
    unsigned us = 50;
    dt_emsg_t em;

    if (r->kind == RING_NCCL && posted && r->comm != NULL) {
        dt_emsg_set(&em, DT_ECOMM, "a call failed with transfers in flight: %s",
                    why != NULL ? why->s : "unknown error");
        die(r, DT_ECOMM, &em);
    }
    for (;;) {
        int busy = 0;
        for (int l = 0; l < r->nlocal; l++) {
            cudaStream_t s[2] = { r->p[l].compute, r->p[l].comm };
            for (int i = 0; i < 2; i++)
                if (s[i] != NULL && cudaStreamQuery(s[i]) == cudaErrorNotReady)
                    busy = 1;
        }
        if (!busy)
            return;
        if (dt_clock_now() - t0 > r->timeout_s) {
            dt_emsg_set(&em, DT_ECOMM, "streams still busy %.0f s after a failure",
                        r->timeout_s);
            die(r, DT_ECOMM, &em);
            return;
        }
        nap(&us);
    }
}

/* ---- the exchange -------------------------------------------------------- */

int dt_ring_xchgv(dt_ring_t *r, const dt_ring_xfer_t *xf, int sready, int done, dt_emsg_t *em)
{
    if (r->kind == RING_LOCAL) {
        for (int l = 0; l < r->nlocal; l++) {
            if (xf[l].to < 0)
                continue;
            int from = xf[l].from - r->rank0;
            cudaStream_t cs = r->p[l].comm;
            if (from < 0 || from >= r->nlocal || xf[from].to != r->rank0 + l ||
                xf[from].sbytes != xf[l].rbytes)
                return dt_emsg_set(em, DT_EINVAL,
                                   "ring exchange: local rank %d receives %zu bytes from rank "
                                   "%d, which sends %zu bytes to rank %d",
                                   l, xf[l].rbytes, xf[l].from,
                                   from >= 0 && from < r->nlocal ? xf[from].sbytes : 0,
                                   from >= 0 && from < r->nlocal ? xf[from].to : -1);
            RING_CUDA(r, em, cudaStreamWaitEvent(cs, r->p[from].ev[sready], 0));
            if (xf[l].rbytes > 0)
                RING_CUDA(r, em, cudaMemcpyAsync(xf[l].recv, xf[from].send, xf[l].rbytes,
                                                 cudaMemcpyDeviceToDevice, cs));
            RING_CUDA(r, em, cudaEventRecord(r->p[l].ev[done], cs));
        }
        return 0;
    }

    const dt_ring_xfer_t *x = &xf[0];
    cudaStream_t cs = r->p[0].comm;
    ncclResult_t es = ncclSuccess, er = ncclSuccess, eg;
    int rc;

    if (x->to < 0)
        return 0;
    RING_CUDA(r, em, cudaStreamWaitEvent(cs, r->p[0].ev[sready], 0));
    eg = ncclGroupStart();
    if (NCCL_FAILED(eg))
        return fail(r, DT_ECOMM, "ring exchange", em, "ncclGroupStart: NCCL: %s (%s)",
                    ncclGetErrorString(eg), nccl_last(r->comm));
    if (x->sbytes > 0)
        es = ncclSend(x->send, x->sbytes, ncclUint8, x->to, r->comm, cs);
    if (x->rbytes > 0)
        er = ncclRecv(x->recv, x->rbytes, ncclUint8, x->from, r->comm, cs);
    eg = ncclGroupEnd(); /* always close the group, even after a failed call */
    if (NCCL_FAILED(es))
        return fail(r, DT_ECOMM, "ring exchange", em, "ncclSend(%zu bytes to rank %d): NCCL: %s (%s)",
                    x->sbytes, x->to, ncclGetErrorString(es), nccl_last(r->comm));
    if (NCCL_FAILED(er))
        return fail(r, DT_ECOMM, "ring exchange", em,
                    "ncclRecv(%zu bytes from rank %d): NCCL: %s (%s)", x->rbytes, x->from,
                    ncclGetErrorString(er), nccl_last(r->comm));
    if (NCCL_FAILED(eg))
        return fail(r, DT_ECOMM, "ring exchange", em, "ncclGroupEnd: NCCL: %s (%s)",
                    ncclGetErrorString(eg), nccl_last(r->comm));
    if (eg == ncclInProgress && (rc = settle(r, "ring exchange", em)) < 0)
        return rc;
    RING_CUDA(r, em, cudaEventRecord(r->p[0].ev[done], cs));
    return 0;
}

int dt_ring_xchg(dt_ring_t *r, void *const *send, void *const *recv, size_t bytes, int sready,
                 int done, dt_emsg_t *em)
{
    dt_ring_xfer_t *xf = dt_xcalloc((size_t)r->nlocal, sizeof(*xf));
    int rc;

    for (int l = 0; l < r->nlocal; l++) {
        int g = r->rank0 + l;
        xf[l] = (dt_ring_xfer_t){ .to = (g + 1) % r->R, .from = (g + r->R - 1) % r->R,
                                  .send = send[l], .recv = recv[l],
                                  .sbytes = bytes, .rbytes = bytes };
    }
    rc = dt_ring_xchgv(r, xf, sready, done, em);
    free(xf);
    return rc;
}

cudaEvent_t dt_ring_sent_event(const dt_ring_t *r, int done, int l, int to)
{
    if (r->kind == RING_NCCL)
        return r->p[l].ev[done];
    return r->p[to - r->rank0].ev[done];
}

int dt_ring_ws(dt_ring_t *r, int l, size_t bytes, void **out, dt_emsg_t *em)
{
    ring_peer_t *p = &r->p[l];

    if (bytes > p->wsbytes) {
        if (p->ws != NULL) {
            DT_CUDA_TRY(em, cudaFree(p->ws));
            p->ws = NULL;
            p->wsbytes = 0;
        }
        DT_CUDA_TRY(em, cudaMalloc(&p->ws, bytes));
        p->wsbytes = bytes;
    }
    *out = p->ws;
    return 0;
}

/* ---- life cycle ------------------------------------------------------------ */

int dt_ring_enter(dt_ring_t *r, dt_emsg_t *em)
{
    char name[64];
    const char *why;

    if (r == NULL)
        return dt_emsg_set(em, DT_EINVAL, "ring is NULL");
    ring_name(r, name, sizeof(name));
    if (r->dead)
        return dt_emsg_set(em, DT_ECOMM, "%s is unusable after an earlier failure: %s", name,
                           r->dead_msg);
    if ((why = atomic_load(&r->abort_why)) != NULL)
        return fail(r, DT_ECOMM, "before the call", em, "aborted: %s", why);
    DT_CUDA_TRY(em, cudaSetDevice(r->device));
    return 0;
}

static int peer_init(ring_peer_t *p, dt_emsg_t *em)
{
    int least = 0, greatest = 0;

    DT_CUDA_TRY(em, cudaDeviceGetStreamPriorityRange(&least, &greatest));
    DT_CUDA_TRY(em, cudaStreamCreateWithPriority(&p->compute, cudaStreamDefault, least));
    DT_CUDA_TRY(em, cudaStreamCreateWithPriority(&p->comm, cudaStreamDefault, greatest));
    for (int i = 0; i < RING_NEV; i++)
        DT_CUDA_TRY(em, cudaEventCreateWithFlags(&p->ev[i], i < RING_EV_NSYNC
                                                                ? cudaEventDisableTiming
                                                                : cudaEventDefault));
    return 0;
}

/* A ring with its streams and events; *out is NULL on failure. */
static int ring_alloc(enum ring_kind kind, int R, int nlocal, int rank0, int device,
                      double timeout_s, dt_ring_t **out, dt_emsg_t *em)
{
    dt_ring_t *r = dt_xcalloc(1, sizeof(*r));
    int rc;

    *out = NULL;
    r->kind = kind;
    r->R = R;
    r->nlocal = nlocal;
    r->rank0 = rank0;
    r->device = device;
    r->timeout_s = timeout_s > 0 ? timeout_s : DT_RING_TIMEOUT_S;
    atomic_init(&r->abort_why, NULL);
    r->p = dt_xcalloc((size_t)nlocal, sizeof(*r->p));
    for (int l = 0; l < nlocal; l++)
        if ((rc = peer_init(&r->p[l], em)) < 0) {
            dt_ring_free(r);
            return rc;
        }
    *out = r;
    return 0;
}

/* A usable device index, or DT_EDEVICE / DT_EINVAL. */
static int check_device(int device, dt_emsg_t *em)
{
    int n = dt_cuda_devices(em);

    if (n == 0)
        return DT_EDEVICE; /* em says why */
    if (device < 0 || device >= n)
        return dt_emsg_set(em, DT_EINVAL, "CUDA device %d: %d visible device%s", device, n,
                           n == 1 ? "" : "s");
    DT_CUDA_TRY(em, cudaSetDevice(device));
    return 0;
}

int dt_ring_local_new(int R, int device, dt_ring_t **out, dt_emsg_t *em)
{
    int rc;

    *out = NULL;
    if (R < 1 || R > RING_MAXLOCAL)
        return dt_emsg_set(em, DT_EINVAL, "local ring of %d ranks: between 1 and %d", R,
                           RING_MAXLOCAL);
    if ((rc = check_device(device, em)) < 0)
        return rc;
    return ring_alloc(RING_LOCAL, R, R, 0, device, 0, out, em);
}

int dt_ring_nccl_id(void *id, dt_emsg_t *em)
{
    ncclUniqueId u;
    ncclResult_t e = ncclGetUniqueId(&u);

    if (e != ncclSuccess)
        return dt_emsg_set(em, DT_ECOMM, "ncclGetUniqueId: NCCL: %s (%s)", ncclGetErrorString(e),
                           nccl_last(NULL));
    memcpy(id, u.internal, DT_RING_ID_BYTES);
    return 0;
}

int dt_ring_nccl_new(int rank, int R, const void *id, int device, double timeout_s,
                     dt_ring_t **out, dt_emsg_t *em)
{
    ncclConfig_t cfg = NCCL_CONFIG_INITIALIZER;
    ncclUniqueId u;
    ncclResult_t e;
    dt_ring_t *r;
    int rc;

    *out = NULL;
    if (R < 1 || rank < 0 || rank >= R)
        return dt_emsg_set(em, DT_EINVAL, "nccl ring: rank %d of %d ranks", rank, R);
    if (id == NULL)
        return dt_emsg_set(em, DT_EINVAL, "nccl ring rank %d: no unique id", rank);
    if (timeout_s < 0)
        return dt_emsg_set(em, DT_EINVAL, "nccl ring rank %d: timeout %g s is negative", rank,
                           timeout_s);
    if ((rc = check_device(device, em)) < 0)
        return rc;
    if ((rc = ring_alloc(RING_NCCL, R, 1, rank, device, timeout_s, &r, em)) < 0)
        return rc;

    memcpy(u.internal, id, DT_RING_ID_BYTES);
    cfg.blocking = 0;
    r->comm = NULL;
    e = ncclCommInitRankConfig(&r->comm, R, u, rank, &cfg);
    if (NCCL_FAILED(e)) {
        /* failed before a communicator existed to abort */
        dt_emsg_set(em, DT_ECOMM, "nccl ring rank %d of %d, device %d: ncclCommInitRankConfig: "
                    "NCCL: %s (%s)", rank, R, device, ncclGetErrorString(e), nccl_last(NULL));
        r->comm = NULL;
        dt_ring_free(r);
        return DT_ECOMM;
    }
    if (e == ncclInProgress && (rc = settle(r, "communicator initialisation", em)) < 0) {
        dt_ring_free(r);
        return rc;
    }
    *out = r;
    return 0;
}

void dt_ring_free(dt_ring_t *r)
{
    if (r == NULL)
        return;
    (void)cudaSetDevice(r->device);
    if (r->comm != NULL) {
        int clean = !r->dead && atomic_load(&r->abort_why) == NULL;
        if (clean) {
            /* flush, then wait (bounded) for the communicator to be quiet */
            ncclResult_t e = ncclCommFinalize(r->comm), st = e;
            double t0 = dt_clock_now();
            unsigned us = 50;
            while (st == ncclInProgress && dt_clock_now() - t0 <= r->timeout_s &&
                   atomic_load(&r->abort_why) == NULL) {
                nap(&us);
                if (ncclCommGetAsyncError(r->comm, &st) != ncclSuccess)
                    st = ncclInternalError;
            }
            clean = st == ncclSuccess;
        }
        if (clean)
            (void)ncclCommDestroy(r->comm);
        else
            (void)ncclCommAbort(r->comm);
        r->comm = NULL;
    }
    if (r->p != NULL) {
        dt_ring_drain(r, 0, NULL);
        for (int l = 0; l < r->nlocal; l++) {
            ring_peer_t *p = &r->p[l];
            for (int i = 0; i < RING_NEV; i++)
                if (p->ev[i] != NULL)
                    (void)cudaEventDestroy(p->ev[i]);
            if (p->comm != NULL)
                (void)cudaStreamDestroy(p->comm);
            if (p->compute != NULL)
                (void)cudaStreamDestroy(p->compute);
            if (p->ws != NULL)
                (void)cudaFree(p->ws);
        }
        free(r->p);
    }
    free(r);
}

int dt_ring_size(const dt_ring_t *r)
{
    return r->R;
}

int dt_ring_nlocal(const dt_ring_t *r)
{
    return r->nlocal;
}

int dt_ring_rank(const dt_ring_t *r, int l)
{
    return r->rank0 + l;
}

const char *dt_ring_kind(const dt_ring_t *r)
{
    return r->kind == RING_NCCL ? "nccl" : "local";
}

void dt_ring_abort(dt_ring_t *r, const char *why)
{
    const char *expected = NULL;

    if (r == NULL)
        return;
    /* the first reason wins; the thread using the ring aborts the
     * communicator at its next poll (within about 200 us) or next call */
    atomic_compare_exchange_strong(&r->abort_why, &expected,
                                   why != NULL ? why : "no reason given");
}

/* ---- all-reduce ------------------------------------------------------------ */

/* Local ranks share one device and no NCCL communicator: sum through the
 * host in rank order, a piece at a time. Slow, exact, deterministic; the
 * local transport exists for tests. */
static int allreduce_local(dt_ring_t *r, float *const *buf, size_t n, dt_emsg_t *em)
{
    const size_t piece = (size_t)1 << 20;
    float *acc = dt_xmallocarray(piece, sizeof(float));
    float *tmp = dt_xmallocarray(piece, sizeof(float));
    int rc = 0;

    DT_CUDA_GOTO(em, rc, out, cudaDeviceSynchronize());
    for (size_t off = 0; off < n; off += piece) {
        size_t m = n - off < piece ? n - off : piece;
        DT_CUDA_GOTO(em, rc, out, cudaMemcpy(acc, buf[0] + off, m * sizeof(float),
                                             cudaMemcpyDeviceToHost));
        for (int l = 1; l < r->nlocal; l++) {
            DT_CUDA_GOTO(em, rc, out, cudaMemcpy(tmp, buf[l] + off, m * sizeof(float),
                                                 cudaMemcpyDeviceToHost));
            for (size_t i = 0; i < m; i++)
                acc[i] += tmp[i];
        }
        for (int l = 0; l < r->nlocal; l++)
            DT_CUDA_GOTO(em, rc, out, cudaMemcpy(buf[l] + off, acc, m * sizeof(float),
                                                 cudaMemcpyHostToDevice));
    }
out:
    free(tmp);
    free(acc);
    return rc;
}

int dt_ring_allreduce_sum_f32(dt_ring_t *r, float *const *buf, size_t n, dt_emsg_t *em)
{
    static const int cdone[] = { RING_EV_CDONE };
    dt_emsg_t local;
    ncclResult_t e;
    int rc;

    if (em == NULL)
        em = &local;
    if ((rc = dt_ring_enter(r, em)) < 0)
        return rc;
    if (n == 0)
        return 0;
    if (r->kind == RING_LOCAL)
        return allreduce_local(r, buf, n, em);

    cudaStream_t cs = r->p[0].comm;
    e = ncclAllReduce(buf[0], buf[0], n, ncclFloat32, ncclSum, r->comm, cs);
    if (NCCL_FAILED(e))
        return fail(r, DT_ECOMM, "all-reduce", em, "ncclAllReduce(%zu floats): NCCL: %s (%s)", n,
                    ncclGetErrorString(e), nccl_last(r->comm));
    if (e == ncclInProgress && (rc = settle(r, "all-reduce", em)) < 0)
        return rc;
    RING_CUDA(r, em, cudaEventRecord(r->p[0].ev[RING_EV_CDONE], cs));
    return dt_ring_wait(r, cdone, 1, "all-reduce", em);
}

/* ---- all-gather of slices ----------------------------------------------------- */

/* Member g's slice of sl: [n s / S, n (s + 1) / S) with s = s0 + g
 * (engine/comm/comm.h's dt_comm_slicing_t). */
static void slice_of(const dt_comm_slicing_t *sl, int g, int64_t *off, int64_t *len)
{
    const int64_t s = (int64_t)sl->s0 + g;

    *off = sl->n * s / sl->S;
    *len = sl->n * (s + 1) / sl->S - *off;
}

/* A slicing that gives each of the ring's R members a slice. */
static int slicing_check(const dt_ring_t *r, const dt_comm_slicing_t *sl, const char *what,
                         dt_emsg_t *em)
{
    if (sl == NULL || sl->n < 0 || sl->S < 1 || sl->s0 < 0 || (int64_t)sl->s0 + r->R > sl->S)
        return dt_emsg_set(em, DT_EINVAL, "%s: slices %d .. %d of %d for a ring of %d", what,
                           sl ? sl->s0 : -1, sl ? sl->s0 + r->R - 1 : -1, sl ? sl->S : 0, r->R);
    return 0;
}

int dt_ring_allgather_slices_f32(dt_ring_t *r, float *const *buf, const dt_comm_slicing_t *sl,
                                 dt_emsg_t *em)
{
    static const int cdone[] = { RING_EV_CDONE };
    dt_emsg_t local;
    int64_t off, len;
    int rc;

    if (em == NULL)
        em = &local;
    if ((rc = dt_ring_enter(r, em)) < 0 ||
        (rc = slicing_check(r, sl, "all-gather", em)) < 0)
        return rc;
    if (sl->n <= 0 || r->R == 1)
        return 0;
    if (r->kind == RING_LOCAL) {
        /* one device: a copy from each local rank's slice to the others' */
        DT_CUDA_TRY(em, cudaDeviceSynchronize());
        for (int l = 0; l < r->nlocal; l++) {
            slice_of(sl, r->rank0 + l, &off, &len);
            for (int m = 0; m < r->nlocal; m++)
                if (m != l && len > 0)
                    DT_CUDA_TRY(em, cudaMemcpy(buf[m] + off, buf[l] + off,
                                               (size_t)len * sizeof(float),
                                               cudaMemcpyDeviceToDevice));
        }
        return 0;
    }

    /* NCCL: this rank's slice to every peer, every peer's into place, in
     * one group (the slices differ in length by one at most, so no
     * ncclAllGather of equal counts) */
    cudaStream_t cs = r->p[0].comm;
    int me = r->rank0, bad = -1;
    ncclResult_t e = ncclSuccess, eg;
    int64_t moff, mlen;

    slice_of(sl, me, &moff, &mlen);
    eg = ncclGroupStart();
    if (NCCL_FAILED(eg))
        return fail(r, DT_ECOMM, "all-gather", em, "ncclGroupStart: NCCL: %s (%s)",
                    ncclGetErrorString(eg), nccl_last(r->comm));
    for (int p = 0; p < r->R && !NCCL_FAILED(e); p++) {
        if (p == me)
            continue;
        slice_of(sl, p, &off, &len);
        if (mlen > 0)
            e = ncclSend(buf[0] + moff, (size_t)mlen * sizeof(float), ncclUint8, p, r->comm, cs);
        if (!NCCL_FAILED(e) && len > 0)
            e = ncclRecv(buf[0] + off, (size_t)len * sizeof(float), ncclUint8, p, r->comm, cs);
        bad = p;
    }
    eg = ncclGroupEnd(); /* always close the group, even after a failed call */
    if (NCCL_FAILED(e))
        return fail(r, DT_ECOMM, "all-gather", em, "slices to and from rank %d: NCCL: %s (%s)",
                    bad, ncclGetErrorString(e), nccl_last(r->comm));
    if (NCCL_FAILED(eg))
        return fail(r, DT_ECOMM, "all-gather", em, "ncclGroupEnd: NCCL: %s (%s)",
                    ncclGetErrorString(eg), nccl_last(r->comm));
    if (eg == ncclInProgress && (rc = settle(r, "all-gather", em)) < 0)
        return rc;
    RING_CUDA(r, em, cudaEventRecord(r->p[0].ev[RING_EV_CDONE], cs));
    return dt_ring_wait(r, cdone, 1, "all-gather", em);
}

/* ---- range collectives (sharded training state) ------------------------------- */

/* Member g's part [*pa, *pb) of [a, b) (empty: *pa == *pb). */
static void part_of(const dt_comm_slicing_t *sl, int g, int64_t a, int64_t b, int64_t *pa,
                    int64_t *pb)
{
    int64_t off, len;

    slice_of(sl, g, &off, &len);
    *pa = off > a ? off : a;
    *pb = off + len < b ? off + len : b;
    if (*pb < *pa)
        *pb = *pa;
}

/* The checks both range collectives make; 1 when there is nothing to send
 * (one rank: the caller copies), 0 to go on. */
static int coll_enter(dt_ring_t *r, const dt_comm_slicing_t *sl, int64_t a, int64_t b, int slot,
                      const char *what, dt_emsg_t *em)
{
    int rc;

    if ((rc = dt_ring_enter(r, em)) < 0 || (rc = slicing_check(r, sl, what, em)) < 0)
        return rc;
    if (slot < 0 || slot >= DT_RING_COLL_SLOTS || a < 0 || b < a || b > sl->n)
        return dt_emsg_set(em, DT_EINVAL, "%s: range [%lld, %lld) of %lld, slot %d", what,
                           (long long)a, (long long)b, (long long)sl->n, slot);
    if (r->nlocal != 1)
        return dt_emsg_set(em, DT_ENOTSUP, "%s: a ring of %d local ranks (one process drives "
                           "one rank here)", what, r->nlocal);
    return r->R == 1 ? 1 : 0;
}

/* A group of p2p calls: to every peer p sb[p] (sn[p] bytes), from it rb[p]
 * (rn[p]); zero-byte sides are left out. */
typedef struct p2p {
    void **sb, **rb;
    size_t *sn, *rn;
} p2p_t;

static p2p_t p2p_new(int R)
{
    p2p_t x = { dt_xcalloc((size_t)R, sizeof(void *)), dt_xcalloc((size_t)R, sizeof(void *)),
                dt_xcalloc((size_t)R, sizeof(size_t)), dt_xcalloc((size_t)R, sizeof(size_t)) };
    return x;
}

static void p2p_free(p2p_t *x)
{
    free(x->sb);
    free(x->rb);
    free(x->sn);
    free(x->rn);
}

/* One chunk's group of x's calls on the communication stream. */
static int group_p2p(dt_ring_t *r, const p2p_t *x, const char *what, dt_emsg_t *em)
{
    void *const *sb = x->sb, *const *rb = x->rb;
    const size_t *sn = x->sn, *rn = x->rn;
    cudaStream_t cs = r->p[0].comm;
    ncclResult_t e = ncclSuccess, eg;
    int bad = -1, rc;

    eg = ncclGroupStart();
    if (NCCL_FAILED(eg))
        return fail(r, DT_ECOMM, what, em, "ncclGroupStart: NCCL: %s (%s)",
                    ncclGetErrorString(eg), nccl_last(r->comm));
    for (int p = 0; p < r->R && !NCCL_FAILED(e); p++) {
        if (p == r->rank0)
            continue;
        bad = p;
        if (sn[p] > 0)
            e = ncclSend(sb[p], sn[p], ncclUint8, p, r->comm, cs);
        if (!NCCL_FAILED(e) && rn[p] > 0)
            e = ncclRecv(rb[p], rn[p], ncclUint8, p, r->comm, cs);
    }
    eg = ncclGroupEnd(); /* always close the group, even after a failed call */
    if (NCCL_FAILED(e))
        return fail(r, DT_ECOMM, what, em, "parts to and from rank %d: NCCL: %s (%s)", bad,
                    ncclGetErrorString(e), nccl_last(r->comm));
    if (NCCL_FAILED(eg))
        return fail(r, DT_ECOMM, what, em, "ncclGroupEnd: NCCL: %s (%s)",
                    ncclGetErrorString(eg), nccl_last(r->comm));
    if (eg == ncclInProgress && (rc = settle(r, what, em)) < 0)
        return rc;
    return 0;
}

int dt_ring_gather_range(dt_ring_t *r, const dt_comm_slicing_t *sl, int64_t a, int64_t b,
                         size_t elem, const void *mine, void *out, int slot, dt_emsg_t *em)
{
    static const char what[] = "range gather";
    cudaStream_t cs;
    int64_t ma, mb, pa, pb;
    int rc, one;

    if ((one = coll_enter(r, sl, a, b, slot, what, em)) < 0)
        return one;
    cs = r->p[0].comm;
    part_of(sl, r->rank0, a, b, &ma, &mb);
    /* in place: this rank's part is where it goes already */
    if (mb > ma && (const char *)out + (size_t)(ma - a) * elem != (const char *)mine)
        RING_CUDA(r, em, cudaMemcpyAsync((char *)out + (size_t)(ma - a) * elem, mine,
                                         (size_t)(mb - ma) * elem, cudaMemcpyDeviceToDevice, cs));
    if (!one && b > a) {
        p2p_t x = p2p_new(r->R);
        for (int p = 0; p < r->R; p++) {
            part_of(sl, p, a, b, &pa, &pb);
            x.sb[p] = (void *)mine;
            x.sn[p] = (size_t)(mb - ma) * elem;
            x.rb[p] = (char *)out + (size_t)(pa - a) * elem;
            x.rn[p] = (size_t)(pb - pa) * elem;
        }
        rc = group_p2p(r, &x, what, em);
        p2p_free(&x);
        if (rc < 0)
            return rc;
    }
    RING_CUDA(r, em, cudaEventRecord(r->p[0].ev[RING_EV_COLL0 + slot], cs));
    return 0;
}

int dt_ring_reduce_scatter_range(dt_ring_t *r, const dt_comm_slicing_t *sl, int64_t a,
                                 int64_t b, const float *in, float *mine, int acc, float *scratch,
                                 int64_t scratch_n, int slot, dt_emsg_t *em)
{
    static const char what[] = "range reduce-scatter";
    const size_t F = sizeof(float);
    cudaStream_t cs;
    int64_t ma, mb, pa, pb;
    int rc, one;

    if ((one = coll_enter(r, sl, a, b, slot, what, em)) < 0)
        return one;
    cs = r->p[0].comm;
    part_of(sl, r->rank0, a, b, &ma, &mb);
    const int64_t ch = scratch_n / r->R;
    if (!one && ch < 1)
        return dt_emsg_set(em, DT_EINVAL, "%s: %lld floats of scratch for %d ranks", what,
                           (long long)scratch_n, r->R);
    if (one) {
        /* a ring of one: the sum is the addend */
        if ((rc = dt_sum_slots_cuda(mb - ma, 1, 0, in + (ma - a), NULL, mb - ma, mine, acc, cs,
                                    em)) < 0)
            return rc;
        RING_CUDA(r, em, cudaEventRecord(r->p[0].ev[RING_EV_COLL0 + slot], cs));
        return 0;
    }
    /* chunk j of every part at once: this rank's addend for peer p's part
     * goes to p, the peers' addends for this rank's part come into their
     * scratch slots, then the sum; the comm stream orders the chunks (a
     * chunk's receives wait for the last chunk's sum) */
    int64_t most = 0;
    for (int p = 0; p < r->R; p++) {
        part_of(sl, p, a, b, &pa, &pb);
        most = pb - pa > most ? pb - pa : most;
    }
    p2p_t x = p2p_new(r->R);
    rc = 0;
    for (int64_t j = 0; j < most && rc == 0; j += ch) {
        int64_t mlen = mb - ma - j < ch ? mb - ma - j : ch;
        if (mlen < 0)
            mlen = 0;
        for (int p = 0; p < r->R; p++) {
            part_of(sl, p, a, b, &pa, &pb);
            int64_t len = pb - pa - j < ch ? pb - pa - j : ch;
            x.sb[p] = (void *)(in + (pa - a) + j);
            x.sn[p] = len > 0 ? (size_t)len * F : 0;
            x.rb[p] = scratch + (int64_t)p * ch;
            x.rn[p] = (size_t)mlen * F;
        }
        if ((rc = group_p2p(r, &x, what, em)) < 0)
            break;
        rc = dt_sum_slots_cuda(mlen, r->R, r->rank0, in + (ma - a) + j, scratch, ch,
                               mine + j, acc, cs, em);
    }
    p2p_free(&x);
    if (rc < 0)
        return rc;
    RING_CUDA(r, em, cudaEventRecord(r->p[0].ev[RING_EV_COLL0 + slot], cs));
    return 0;
}

int dt_ring_coll_then(dt_ring_t *r, int slot, void *stream, dt_emsg_t *em)
{
    int rc;

    if ((rc = dt_ring_enter(r, em)) < 0)
        return rc;
    if (slot < 0 || slot >= DT_RING_COLL_SLOTS || stream == NULL)
        return dt_emsg_set(em, DT_EINVAL, "range collective: slot %d, stream %p", slot, stream);
    RING_CUDA(r, em, cudaStreamWaitEvent((cudaStream_t)stream,
                                         r->p[0].ev[RING_EV_COLL0 + slot], 0));
    return 0;
}

int dt_ring_coll_after(dt_ring_t *r, void *stream, dt_emsg_t *em)
{
    int rc;

    if ((rc = dt_ring_enter(r, em)) < 0)
        return rc;
    if (stream == NULL || r->nlocal != 1)
        return dt_emsg_set(em, DT_EINVAL, "range collective: after stream %p, %d local ranks",
                           stream, r->nlocal);
    /* the wait takes the event's record as it is now: recording it again
     * for the next call leaves this one's order intact */
    RING_CUDA(r, em, cudaEventRecord(r->p[0].ev[RING_EV_AFTER], (cudaStream_t)stream));
    RING_CUDA(r, em, cudaStreamWaitEvent(r->p[0].comm, r->p[0].ev[RING_EV_AFTER], 0));
    return 0;
}

int dt_ring_coll_chain(dt_ring_t *prev, int pslot, dt_ring_t *next, dt_emsg_t *em)
{
    int rc;

    if ((rc = dt_ring_enter(next, em)) < 0)
        return rc;
    if (next->nlocal != 1)
        return dt_emsg_set(em, DT_ENOTSUP, "range collective: a chain into a ring of %d local "
                           "ranks", next->nlocal);
    return dt_ring_coll_then(prev, pslot, next->p[0].comm, em);
}

int dt_ring_coll_wait(dt_ring_t *r, int slot, dt_emsg_t *em)
{
    const int ev[] = { RING_EV_COLL0 + slot };
    int rc;

    if ((rc = dt_ring_enter(r, em)) < 0)
        return rc;
    if (slot < 0 || slot >= DT_RING_COLL_SLOTS)
        return dt_emsg_set(em, DT_EINVAL, "range collective: slot %d", slot);
    return dt_ring_wait(r, ev, 1, "range collective", em);
}
