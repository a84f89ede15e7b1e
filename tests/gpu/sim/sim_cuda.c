/* SPDX-License-Identifier: MIT
 *
 * A host stand-in for the CUDA runtime, NCCL point-to-point and the
 * contracts of dt's CUDA kernels, so that the GPU ring (engine/attn/ring_cuda.c,
 * dilated_cuda.c, ring_call.c, engine/comm/comm_nccl.c) runs on a machine
 * without a GPU and its stream/event schedule can be checked in `make check`
 * (tests/gpu/test_ring_sched.c).
 *
 * What it is: every stream operation (kernel, async copy or memset, event
 * record, event wait, NCCL group) is queued on its stream and executed
 * later, one at a time, on the host. The scheduler picks a random stream
 * among those whose head operation may run (a wait runs only once its event
 * has completed the record it waits for), sometimes stalls a stream for a
 * while, and runs some work at random API calls, so each seed is another
 * legal interleaving. A missing cudaStreamWaitEvent lets a consumer run
 * before its producer, or a producer overwrite a buffer still being read,
 * and shows up as a wrong result. Synchronous calls (cudaFree, cudaMemcpy,
 * cudaMemset) and cudaStreamDestroy with work still queued on the calling
 * thread's streams are reported as a HAZARD and abort. NCCL communicators
 * are matched by their unique id, one rank per thread: a send and its
 * receive complete together, whichever group reaches them first, and a
 * thread that can make no progress for about 10 s aborts with "deadlock".
 * The simulator reports one device (or DT_SIM_GPUS, filtered by
 * CUDA_VISIBLE_DEVICES: see sim_devices), so the tests that use it never
 * skip.
 *
 * Built with SIM_NET (tests/gpu/dtengine-sim: the whole engine on
 * simulated GPUs) a communicator's peers are other processes of the host,
 * reached through sim_net.c: sends leave as copies when their group
 * starts and complete once written out, receives when the frame arrives,
 * a peer that closes or cannot be reached is an asynchronous NCCL error,
 * and the deadlock check is off (a peer may compute for long; the
 * engine's watchdog and PMIx notice a dead one). DT_SIM_DEVICE_FAULT
 * injects a device fault (maybe_poison); sim_layers.c stands in for the
 * layer kernels.
 *
 * What it is not: not the GPU, not CUDA's memory model, and not a test of
 * the kernels' accuracy: its kernels are the CPU reference
 * (kernels/cpu/attn_ref.c) behind the CUDA launchers' signatures and
 * argument checks. The real checks are tests/gpu/test_*_cuda on a GPU.
 * With threads (NCCL ranks) a seed does not fix the interleaving.
 *
 * Knobs, from the environment, read at each sim_seed() (to widen a search
 * by hand, e.g. SIM_STALL_PROB=2 tests/gpu/test_ring_sched):
 *   SIM_EAGER=n       run some queued work at one API call in n (8)
 *   SIM_STALL_PROB=n  stall the stream that just ran with probability 1/n,
 *                     0 never (6)
 *   SIM_STALL_LEN=n   a stall lasts up to n scheduler picks (400)
 *   SIM_POLICY=p      overrides sim_seed()'s policy: 0 random, 1 compute
 *                     streams first, 2 communication streams first
 *   SIM_TRACE=1       print each operation run, to stderr
 */
#include <math.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include <cuda_runtime_api.h>
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wundef"
#pragma GCC diagnostic ignored "-Wstrict-prototypes"
#include <nccl.h>
#pragma GCC diagnostic pop

#include "common/err.h"
#include "kernels/cpu/attn_cpu.h"
#include "kernels/cuda/attn_cuda.h"
#include "kernels/cuda/attn_cudnn.h"
#include "kernels/cuda/cuda_err.h"
#include "kernels/cuda/train_cuda.h"
#include "tests/gpu/sim/sim_cuda.h"
#ifdef SIM_NET
#include <sys/random.h>

#include "tests/gpu/sim/sim_net.h"
#endif

/* One lock for all simulator state; the host work of an operation runs
 * under it, so operations never overlap. */
static pthread_mutex_t mu = PTHREAD_MUTEX_INITIALIZER;
static unsigned seed = 1;
static long fake_clock; /* event timestamps: +1 per record, +3 per kernel */
static long ops_run, max_queue;

static int eager = 8, trace, stall_prob = 6, stall_len = 400, policy;
#ifdef SIM_NET
static const int net_mode = 1;
#else
static const int net_mode = 0;
#endif

static int rnd(int n)
{
    return n <= 1 ? 0 : (int)(rand_r(&seed) % (unsigned)n);
}

static void knob(const char *name, int *v)
{
    const char *s = getenv(name);

    if (s)
        *v = atoi(s);
}

void sim_seed(unsigned s, int p)
{
    pthread_mutex_lock(&mu);
    seed = s;
    policy = p;
    knob("SIM_EAGER", &eager);
    knob("SIM_STALL_PROB", &stall_prob);
    knob("SIM_STALL_LEN", &stall_len);
    knob("SIM_POLICY", &policy);
    knob("SIM_TRACE", &trace);
    pthread_mutex_unlock(&mu);
}

void sim_stats(long *ops, long *queue)
{
    pthread_mutex_lock(&mu);
    *ops = ops_run;
    *queue = max_queue;
    pthread_mutex_unlock(&mu);
}

/* ---- ops, streams, events ---- */

enum opkind { OP_RECORD, OP_WAIT, OP_FN, OP_XCHG };

typedef struct xfer {
    void *buf;
    size_t bytes;
    int peer;
    unsigned long seq;
    int done;
} xfer_t;

struct ncclComm;

/* Transfers of one op: a group of sends and receives, or an all-reduce's
 * (one send and one receive per peer: up to 9 ranks). */
#define MAXX 16

typedef struct op {
    enum opkind kind;
    struct op *next;
    struct CUevent_st *ev;
    unsigned long gen;
    void (*fn)(void *);
    void *arg;
    /* xchg */
    struct ncclComm *comm;
    int started;
    int nx;
    xfer_t x[MAXX]; /* sends (kind 0) then recvs */
    int issend[MAXX];
    const char *what;
} op_t;

struct CUstream_st {
    op_t *head, *tail;
    int n;
    int is_comm;
    int stall; /* skipped by the scheduler for this many picks, unless nothing else runs */
    pthread_t owner;
    int alive;
};

struct CUevent_st {
    unsigned long recorded, done;
    long t;
    int timing;
};

#define MAXS 4096
static struct CUstream_st *streams[MAXS];
static int nstreams;

static void push(struct CUstream_st *s, op_t *o)
{
    o->next = NULL;
    if (s->tail)
        s->tail->next = o;
    else
        s->head = o;
    s->tail = o;
    s->n++;
    if (s->n > max_queue)
        max_queue = s->n;
}

static void pop(struct CUstream_st *s)
{
    op_t *o = s->head;
    s->head = o->next;
    if (!s->head)
        s->tail = NULL;
    s->n--;
    free(o->arg);
    free(o);
}

/* ---- NCCL comm state ---- */

/* One rank's communicator; ranks of one ring share the key (from the
 * unique id) and match sends to receives by peer and sequence number. */
struct ncclComm {
    int rank, n;
    unsigned long key;
    unsigned long *sseq, *rseq; /* next send / receive number, per peer */
    int inprog;                 /* ncclInProgress answers still to give */
    int aborted;                /* ncclCommAbort/Destroy: its groups drop */
#ifdef SIM_NET
    sim_net_t *net; /* the peers are other processes (sim_net.h) */
#endif
};

/* find the started xchg op of comm (key, rank) holding a send to `dst` with seq */
static op_t *find_send(unsigned long key, int src, int dst, unsigned long seq, int *xi)
{
    for (int i = 0; i < nstreams; i++) {
        struct CUstream_st *s = streams[i];
        if (!s || !s->alive || !s->head)
            continue;
        op_t *o = s->head;
        if (o->kind != OP_XCHG || !o->started || o->comm->key != key || o->comm->rank != src)
            continue;
        for (int j = 0; j < o->nx; j++)
            if (o->issend[j] && o->x[j].peer == dst && o->x[j].seq == seq && !o->x[j].done) {
                *xi = j;
                return o;
            }
    }
    return NULL;
}

static int xchg_progress(op_t *o)
{
    int all = 1;
#ifdef SIM_NET
    if (o->comm->net) {
        /* a send leaves as a copy (queued: done = 2) and completes when it
         * is written out, as NCCL's completes on delivery: until then the
         * group holds the stream, so the rank keeps moving the bytes on
         * (a rank that went on to MPI with them still queued would leave
         * its peer waiting); a receive completes on arrival */
        for (int j = 0; j < o->nx; j++) {
            if (o->x[j].done == 1)
                continue;
            if (o->issend[j] && o->x[j].done == 0) {
                sim_net_send(o->comm->net, o->x[j].peer, o->x[j].seq, o->x[j].buf,
                             o->x[j].bytes);
                o->x[j].done = 2;
            }
            if (o->issend[j]) {
                sim_net_pump(o->comm->net);
                if (sim_net_sent(o->comm->net, o->x[j].peer, o->x[j].seq))
                    o->x[j].done = 1;
            } else if (sim_net_recv(o->comm->net, o->x[j].peer, o->x[j].seq, o->x[j].buf,
                                    o->x[j].bytes) == 1) {
                o->x[j].done = 1;
            }
        }
        for (int j = 0; j < o->nx; j++)
            all &= o->x[j].done == 1;
        return all;
    }
#endif
    for (int j = 0; j < o->nx; j++) {
        if (o->issend[j] || o->x[j].done)
            continue;
        int si;
        op_t *so = find_send(o->comm->key, o->x[j].peer, o->comm->rank, o->x[j].seq, &si);
        if (so) {
            if (so->x[si].bytes != o->x[j].bytes) {
                fprintf(stderr, "sim: nccl size mismatch %zu vs %zu\n", so->x[si].bytes,
                        o->x[j].bytes);
                abort();
            }
            memcpy(o->x[j].buf, so->x[si].buf, o->x[j].bytes);
            o->x[j].done = 1;
            so->x[si].done = 1;
        }
    }
    for (int j = 0; j < o->nx; j++)
        all &= o->x[j].done;
    return all;
}

typedef struct cpy {
    void *dst;
    const void *src;
    size_t n;
    int staged;
    unsigned char data[];
} cpy_t;

/* Whether the head operation of s may run (1) or must wait (0); with run,
 * also run it (an NCCL group: start it, or move its transfers on). */
static int try_head(struct CUstream_st *s, int run)
{
    op_t *o = s->head;
    if (!o)
        return 0;
    switch (o->kind) {
    case OP_RECORD:
        if (run) {
            if (o->gen > o->ev->done)
                o->ev->done = o->gen;
            o->ev->t = ++fake_clock;
            pop(s);
        }
        return 1;
    case OP_WAIT:
        if (o->ev->done < o->gen)
            return 0;
        if (run)
            pop(s);
        return 1;
    case OP_FN:
        if (run) {
            o->fn(o->arg);
            fake_clock += 3;
            pop(s);
        }
        return 1;
    case OP_XCHG:
        if (o->comm->aborted) {
            if (run)
                pop(s);
            return 1;
        }
        if (!o->started) {
            if (run)
                o->started = 1;
            return 1;
        }
        if (run) {
            if (xchg_progress(o)) {
                pop(s);
                return 1;
            }
            return 0;
        }
        /* whether a started group can progress is only known by trying:
         * progress() tries it and moves on to another stream if not */
        return 1;
    }
    return 0;
}

/* Run up to max operations, each from a random runnable stream; returns how
 * many ran (0: nothing on any thread can run now). Called with mu held. */
static int progress(int max)
{
    int ran = 0;
    for (int it = 0; it < max; it++) {
        int cand[MAXS], nc = 0, stalled[MAXS], ns = 0;
        for (int i = 0; i < nstreams; i++)
            if (streams[i] && streams[i]->alive && streams[i]->head &&
                try_head(streams[i], 0)) {
                if (streams[i]->stall > 0)
                    stalled[ns++] = i;
                else
                    cand[nc++] = i;
            }
        for (int i = 0; i < nstreams; i++)
            if (streams[i] && streams[i]->stall > 0)
                streams[i]->stall--;
        if (!nc) { /* only stalled streams can run: let them */
            memcpy(cand, stalled, sizeof(int) * (size_t)ns);
            nc = ns;
        }
        if (!nc)
            break;
        /* random order; with a policy, the preferred kind of stream first */
        for (int k = 0; k < nc; k++) {
            int j = k + rnd(nc - k), t = cand[k];
            cand[k] = cand[j];
            cand[j] = t;
        }
        if (policy) { /* 1: compute streams first, 2: communication streams first */
            int pc[MAXS], np = 0;
            for (int k = 0; k < nc; k++)
                if (streams[cand[k]]->is_comm == (policy == 2))
                    pc[np++] = cand[k];
            for (int k = 0; k < nc; k++)
                if (streams[cand[k]]->is_comm != (policy == 2))
                    pc[np++] = cand[k];
            memcpy(cand, pc, sizeof(int) * (size_t)nc);
        }
        int did = 0;
        for (int k = 0; k < nc && !did; k++) {
            struct CUstream_st *s = streams[cand[k]];
            op_t *h = s->head;
            int before = s->n, xchg = h->kind == OP_XCHG, started = xchg ? h->started : 0;
            if (trace)
                fprintf(stderr, "sim: stream %d%s: %s ev=%p gen=%lu\n", cand[k],
                        s->is_comm ? " (comm)" : "", h->what, (void *)h->ev, h->gen);
            try_head(s, 1);
            /* h is freed if it was popped: look at it only if it was not */
            if (s->n != before || (xchg && h->started != started)) {
                did = 1;
                if (stall_prob && rnd(stall_prob) == 0)
                    s->stall = rnd(stall_len);
            }
        }
        if (!did)
            break;
        ran++;
        ops_run++;
    }
    return ran;
}

/* Whether a stream created by this thread has work queued. */
static int mine_pending(void)
{
    for (int i = 0; i < nstreams; i++)
        if (streams[i] && streams[i]->alive && streams[i]->head &&
            pthread_equal(streams[i]->owner, pthread_self()))
            return 1;
    return 0;
}

/* The head of every non-empty stream, to stderr, before an abort. */
static void dump(void)
{
    for (int i = 0; i < nstreams; i++) {
        struct CUstream_st *s = streams[i];
        if (!s || !s->alive || !s->head)
            continue;
        op_t *o = s->head;
        fprintf(stderr, "  stream %d: %d ops, head kind %d gen %lu evdone %lu %s\n", i, s->n,
                o->kind, o->gen, o->ev ? o->ev->done : 0, o->what ? o->what : "");
    }
}

/* Run work until this thread's streams are empty (cudaDeviceSynchronize).
 * Work of other threads runs too; what waits on them (an NCCL receive)
 * progresses when they call in, so drop the lock between attempts, and
 * abort after about 10 s without progress. */
static void drain_mine(const char *why)
{
    long idle = 0;
    while (mine_pending()) {
        if (progress(64) == 0) {
            pthread_mutex_unlock(&mu);
            usleep(50);
            pthread_mutex_lock(&mu);
            /* across processes (SIM_NET) a peer may compute for long:
             * its watchdog and PMIx, not the simulator, notice a dead one */
            if (++idle > 200000 && !net_mode) {
                fprintf(stderr, "sim: deadlock draining (%s)\n", why);
                dump();
                abort();
            }
        } else {
            idle = 0;
        }
    }
}

/* A synchronous call with this thread's streams busy: dt synchronises its
 * streams first, so this is a schedule bug (a HAZARD), not a wait. */
static void strict_idle(const char *what)
{
    if (mine_pending()) {
        fprintf(stderr, "sim: HAZARD: %s while this thread's streams have pending work\n", what);
        dump();
        abort();
    }
}

/* Every API call that touches shared state starts with ENTER (take the lock,
 * sometimes run a little queued work, as a GPU would meanwhile) and returns
 * through LEAVE (drop the lock). */
#define ENTER()                                                                \
    do {                                                                       \
        pthread_mutex_lock(&mu);                                               \
        if (rnd(eager) == 0)                                                   \
            progress(rnd(4));                                                  \
    } while (0)
#define LEAVE(x)                                                               \
    do {                                                                       \
        pthread_mutex_unlock(&mu);                                             \
        return (x);                                                            \
    } while (0)

/* ---- CUDA runtime ---- */

/* Simulated devices: DT_SIM_GPUS of them, each with a UUID
 * GPU-d7510000-0000-0000-0000-0000000000NN (NN its index, in hex),
 * DT_SIM_GPU_MEMORY bytes (default 80 GiB) and PCI address 0000:1N:00.0
 * (where sysfs says nothing: no CPUs near it). CUDA_VISIBLE_DEVICES picks
 * among them by index or UUID, as the runtime does (an entry that names
 * none ends the list), so Slurm's and dtagentd's settings work unchanged.
 * Without DT_SIM_GPUS: 64 when CUDA_VISIBLE_DEVICES is set (it decides),
 * else 1. */
static int sim_visible[64], sim_nvisible = -1;

static void sim_uuid(int i, unsigned char b[16])
{
    memset(b, 0, 16);
    b[0] = 0xd7;
    b[1] = 0x51;
    b[15] = (unsigned char)i;
}

static void sim_devices(void)
{
    const char *g = getenv("DT_SIM_GPUS"), *cvd = getenv("CUDA_VISIBLE_DEVICES");
    int total = g ? atoi(g) : cvd ? 64 : 1;

    if (sim_nvisible >= 0)
        return;
    total = total < 0 ? 0 : total > 64 ? 64 : total;
    sim_nvisible = 0;
    if (cvd == NULL) {
        for (int i = 0; i < total; i++)
            sim_visible[sim_nvisible++] = i;
        return;
    }
    char *list = strdup(cvd), *save = NULL;
    for (char *e = strtok_r(list, ",", &save); e && sim_nvisible < 64;
         e = strtok_r(NULL, ",", &save)) {
        int found = -1;
        for (int i = 0; i < total && found < 0; i++) {
            unsigned char b[16];
            char u[48];
            int o = snprintf(u, sizeof(u), "GPU-");
            sim_uuid(i, b);
            for (int k = 0; k < 16; k++) {
                o += snprintf(u + o, sizeof(u) - (size_t)o, "%02x", b[k]);
                if (k == 3 || k == 5 || k == 7 || k == 9)
                    u[o++] = '-';
            }
            u[o] = '\0';
            char *end;
            long idx = strtol(e, &end, 10);
            if ((*end == '\0' && end != e && idx == i) || strcmp(e, u) == 0)
                found = i;
        }
        if (found < 0)
            break;
        sim_visible[sim_nvisible++] = found;
    }
    free(list);
}

cudaError_t cudaGetDeviceCount(int *n)
{
    sim_devices();
    *n = sim_nvisible;
    return sim_nvisible > 0 ? cudaSuccess : cudaErrorNoDevice;
}

cudaError_t cudaDriverGetVersion(int *v)
{
    *v = 13000;
    return cudaSuccess;
}

cudaError_t cudaGetDeviceProperties(struct cudaDeviceProp *p, int d)
{
    const char *m = getenv("DT_SIM_GPU_MEMORY");

    sim_devices();
    if (d < 0 || d >= sim_nvisible)
        return cudaErrorInvalidDevice;
    memset(p, 0, sizeof(*p));
    snprintf(p->name, sizeof(p->name), "dt simulated GPU (tests/gpu/sim)");
    sim_uuid(sim_visible[d], (unsigned char *)p->uuid.bytes);
    p->totalGlobalMem = m ? (size_t)strtoull(m, NULL, 10) : (size_t)80 << 30;
    p->pciBusID = 0x10 + sim_visible[d];
    p->major = 9;
    return cudaSuccess;
}

static __thread int sim_current; /* the calling thread's device, as CUDA keeps it */

cudaError_t cudaSetDevice(int d)
{
    int n;
    if (cudaGetDeviceCount(&n) != cudaSuccess || d < 0 || d >= n)
        return cudaErrorInvalidDevice;
    sim_current = d;
    return cudaSuccess;
}

cudaError_t cudaGetDevice(int *d)
{
    *d = sim_current;
    return cudaSuccess;
}

const char *cudaGetErrorString(cudaError_t e)
{
    return e == cudaSuccess                  ? "no error"
           : e == cudaErrorECCUncorrectable ? "uncorrectable ECC error encountered (simulated)"
           : e == cudaErrorMemoryAllocation ? "out of memory (simulated)"
           : e == cudaErrorNoDevice         ? "no CUDA-capable device is detected (simulated)"
           : e == cudaErrorInvalidDevice    ? "invalid device ordinal (simulated)"
                                             : "sim error";
}

const char *cudaGetErrorName(cudaError_t e)
{
    return e == cudaSuccess                  ? "cudaSuccess"
           : e == cudaErrorECCUncorrectable ? "cudaErrorECCUncorrectable"
           : e == cudaErrorMemoryAllocation ? "cudaErrorMemoryAllocation"
           : e == cudaErrorNoDevice         ? "cudaErrorNoDevice"
           : e == cudaErrorInvalidDevice    ? "cudaErrorInvalidDevice"
                                             : "cudaErrorSim";
}

/* A device fault, once: with DT_SIM_DEVICE_FAULT=RANK:FILE, the process of
 * that rank (PMIX_RANK) that first launches a kernel while FILE does not
 * exist creates FILE and from then on its device answers every query and
 * copy with cudaErrorECCUncorrectable, as a GPU with an uncorrectable
 * memory error poisons its context. Later processes of that rank (a
 * restarted generation) find FILE and run normally. */
static int poisoned;

static void maybe_poison(void)
{
    static int checked;
    const char *f = getenv("DT_SIM_DEVICE_FAULT"), *r = getenv("PMIX_RANK"), *colon;

    if (checked++ || f == NULL || r == NULL || (colon = strchr(f, ':')) == NULL ||
        atoi(f) != atoi(r))
        return;
    FILE *mark = fopen(colon + 1, "wx");
    if (mark == NULL)
        return;
    fclose(mark);
    poisoned = 1;
    fprintf(stderr, "sim: rank %s: a simulated uncorrectable ECC error on the device\n", r);
}

cudaError_t cudaGetLastError(void)
{
    return cudaSuccess;
}

cudaError_t cudaDeviceGetStreamPriorityRange(int *least, int *greatest)
{
    *least = 0;
    *greatest = -5;
    return cudaSuccess;
}

cudaError_t cudaStreamCreateWithPriority(cudaStream_t *ps, unsigned int flags, int prio)
{
    (void)flags;
    ENTER();
    struct CUstream_st *s = calloc(1, sizeof(*s));
    s->owner = pthread_self();
    s->alive = 1;
    s->is_comm = prio < 0;
    if (nstreams == MAXS)
        abort();
    streams[nstreams++] = s;
    *ps = s;
    LEAVE(cudaSuccess);
}

cudaError_t cudaStreamCreateWithFlags(cudaStream_t *ps, unsigned int flags)
{
    return cudaStreamCreateWithPriority(ps, flags, 0);
}

/* Run work until s is empty (other streams' work runs too, as it must). */
cudaError_t cudaStreamSynchronize(cudaStream_t s)
{
    long idle = 0;

    if (poisoned)
        return cudaErrorECCUncorrectable;
    ENTER();
    while (s->head) {
        if (progress(64) == 0) {
            pthread_mutex_unlock(&mu);
            usleep(50);
            pthread_mutex_lock(&mu);
            if (++idle > 200000 && !net_mode) {
                fprintf(stderr, "sim: deadlock in cudaStreamSynchronize\n");
                dump();
                abort();
            }
        } else {
            idle = 0;
        }
    }
    LEAVE(cudaSuccess);
}

cudaError_t cudaStreamDestroy(cudaStream_t s)
{
    ENTER();
    if (s->head) {
        fprintf(stderr, "sim: HAZARD: destroying a stream with pending work\n");
        abort();
    }
    s->alive = 0;
    LEAVE(cudaSuccess);
}

cudaError_t cudaStreamQuery(cudaStream_t s)
{
    ENTER();
    progress(1 + rnd(6));
    LEAVE(s->head ? cudaErrorNotReady : cudaSuccess);
}

cudaError_t cudaEventCreateWithFlags(cudaEvent_t *pe, unsigned int flags)
{
    struct CUevent_st *e = calloc(1, sizeof(*e));
    e->timing = !(flags & cudaEventDisableTiming);
    *pe = e;
    return cudaSuccess;
}

cudaError_t cudaEventDestroy(cudaEvent_t e)
{
    (void)e; /* leak: ops may still reference it in a buggy schedule */
    return cudaSuccess;
}

static void check_stream(cudaStream_t s, const char *fn)
{
    if (s == NULL || !s->alive) {
        fprintf(stderr, "sim: %s on the legacy or a dead stream\n", fn);
        abort();
    }
}

cudaError_t cudaEventRecord(cudaEvent_t e, cudaStream_t s)
{
    ENTER();
    check_stream(s, "cudaEventRecord");
    op_t *o = calloc(1, sizeof(*o));
    o->kind = OP_RECORD;
    o->ev = e;
    o->gen = ++e->recorded;
    o->what = "record";
    push(s, o);
    LEAVE(cudaSuccess);
}

cudaError_t cudaStreamWaitEvent(cudaStream_t s, cudaEvent_t e, unsigned int flags)
{
    (void)flags;
    ENTER();
    check_stream(s, "cudaStreamWaitEvent");
    op_t *o = calloc(1, sizeof(*o));
    o->kind = OP_WAIT;
    o->ev = e;
    o->gen = e->recorded; /* the most recent record at the time of the call */
    o->what = "wait";
    push(s, o);
    LEAVE(cudaSuccess);
}

/* Run work until e's last record has happened. */
cudaError_t cudaEventSynchronize(cudaEvent_t e)
{
    if (poisoned)
        return cudaErrorECCUncorrectable;
    ENTER();
    while (e->done < e->recorded) {
        if (progress(64) == 0) {
            pthread_mutex_unlock(&mu);
            usleep(50);
            pthread_mutex_lock(&mu);
        }
    }
    LEAVE(cudaSuccess);
}

cudaError_t cudaEventQuery(cudaEvent_t e)
{
    if (poisoned)
        return cudaErrorECCUncorrectable;
    ENTER();
    progress(1 + rnd(8));
    LEAVE(e->done >= e->recorded ? cudaSuccess : cudaErrorNotReady);
}

cudaError_t cudaEventElapsedTime(float *ms, cudaEvent_t a, cudaEvent_t b)
{
    ENTER();
    if (!a->timing || !b->timing || a->done < a->recorded || b->done < b->recorded ||
        !a->recorded || !b->recorded) {
        fprintf(stderr, "sim: bad cudaEventElapsedTime\n");
        abort();
    }
    *ms = (float)(b->t - a->t) * 1e-3f;
    LEAVE(cudaSuccess);
}

static void enqueue_fn(cudaStream_t s, void (*fn)(void *), void *arg, const char *what)
{
    check_stream(s, what);
    op_t *o = calloc(1, sizeof(*o));
    o->kind = OP_FN;
    o->fn = fn;
    o->arg = arg;
    o->what = what;
    push(s, o);
}

void sim_enqueue(cudaStream_t s, void (*fn)(void *), void *arg, const char *what)
{
    pthread_mutex_lock(&mu);
    enqueue_fn(s, fn, arg, what);
    pthread_mutex_unlock(&mu);
}

static void do_cpy(void *a)
{
    cpy_t *c = a;
    memcpy(c->dst, c->staged ? (const void *)c->data : c->src, c->n);
}

cudaError_t cudaMemcpyAsync(void *dst, const void *src, size_t n, enum cudaMemcpyKind k,
                            cudaStream_t s)
{
    ENTER();
    cpy_t *c = malloc(sizeof(*c) + (k == cudaMemcpyHostToDevice ? n : 0));
    c->dst = dst;
    c->src = src;
    c->n = n;
    c->staged = k == cudaMemcpyHostToDevice; /* pageable: staged at the call */
    if (c->staged)
        memcpy(c->data, src, n);
    /* device to host runs when the stream reaches it (as into page-locked
     * memory; from pageable memory the runtime is stricter, returning
     * after it): the host may read it only after a synchronisation */
    else if (k != cudaMemcpyDeviceToDevice && k != cudaMemcpyDeviceToHost) {
        fprintf(stderr, "sim: memcpy kind %d async\n", (int)k);
        abort();
    }
    enqueue_fn(s, do_cpy, c, "memcpyAsync");
    LEAVE(cudaSuccess);
}

typedef struct mset {
    void *dst;
    int v;
    size_t n;
} mset_t;

static void do_mset(void *a)
{
    mset_t *m = a;
    memset(m->dst, m->v, m->n);
}

cudaError_t cudaMemsetAsync(void *dst, int v, size_t n, cudaStream_t s)
{
    ENTER();
    mset_t *m = malloc(sizeof(*m));
    m->dst = dst;
    m->v = v;
    m->n = n;
    enqueue_fn(s, do_mset, m, "memsetAsync");
    LEAVE(cudaSuccess);
}

/* Device memory: every allocation carries its size in front of it, and
 * the total may not pass the device's (DT_SIM_GPU_MEMORY, default 80 GiB):
 * beyond it cudaMalloc fails as the runtime does. */
static size_t allocated, peak;

/* DT_SIM_MEMSTAT set: the most device memory held at once, said at exit
 * (what the planner's memory model is checked against). */
static void memstat(void)
{
    fprintf(stderr, "sim: device memory peak %zu bytes\n", peak);
}

/* the device's size: DT_SIM_GPU_MEMORY, or 80 GiB */
static size_t device_size(void)
{
    const char *m = getenv("DT_SIM_GPU_MEMORY");

    return m ? (size_t)strtoull(m, NULL, 10) : (size_t)80 << 30;
}

cudaError_t cudaMemGetInfo(size_t *free_b, size_t *total_b)
{
    if (poisoned)
        return cudaErrorECCUncorrectable;
    pthread_mutex_lock(&mu);
    *total_b = device_size();
    *free_b = allocated < *total_b ? *total_b - allocated : 0;
    pthread_mutex_unlock(&mu);
    return cudaSuccess;
}

cudaError_t cudaMalloc(void **p, size_t n)
{
    size_t cap = device_size();
    size_t size = (n + 255) / 256 * 256 + 256;

    if (poisoned)
        return cudaErrorECCUncorrectable;
    pthread_mutex_lock(&mu);
    if (allocated + size > cap) {
        pthread_mutex_unlock(&mu);
        *p = NULL;
        return cudaErrorMemoryAllocation;
    }
    allocated += size;
    if (allocated > peak) {
        if (peak == 0 && getenv("DT_SIM_MEMSTAT"))
            atexit(memstat);
        peak = allocated;
    }
    pthread_mutex_unlock(&mu);
    unsigned char *base = aligned_alloc(256, size + 256);
    memcpy(base, &size, sizeof(size));
    *p = base + 256;
    memset(*p, 0xa5, n); /* garbage */
    return cudaSuccess;
}

cudaError_t cudaFree(void *p)
{
    ENTER();
    strict_idle("cudaFree");
    if (p) {
        unsigned char *base = (unsigned char *)p - 256;
        size_t size;
        memcpy(&size, base, sizeof(size));
        allocated -= size;
        free(base);
    }
    LEAVE(cudaSuccess);
}

/* Page-locked host memory is plain memory here, counted as the device's
 * is: with DT_SIM_MEMSTAT the most held at once is said at exit (the
 * planner's host memory per rank is checked against it). */
static size_t host_allocated, host_peak;

static void host_memstat(void)
{
    fprintf(stderr, "sim: host memory peak %zu bytes\n", host_peak);
}

cudaError_t cudaHostAlloc(void **p, size_t n, unsigned int flags)
{
    (void)flags;
    unsigned char *base = malloc((n ? n : 1) + 64);
    if (base == NULL) {
        *p = NULL;
        return cudaErrorMemoryAllocation;
    }
    memcpy(base, &n, sizeof(n));
    pthread_mutex_lock(&mu);
    host_allocated += n;
    if (host_allocated > host_peak) {
        if (host_peak == 0 && getenv("DT_SIM_MEMSTAT"))
            atexit(host_memstat);
        host_peak = host_allocated;
    }
    pthread_mutex_unlock(&mu);
    *p = base + 64;
    return cudaSuccess;
}

cudaError_t cudaFreeHost(void *p)
{
    if (p) {
        unsigned char *base = (unsigned char *)p - 64;
        size_t n;
        memcpy(&n, base, sizeof(n));
        pthread_mutex_lock(&mu);
        host_allocated -= n;
        pthread_mutex_unlock(&mu);
        free(base);
    }
    return cudaSuccess;
}

cudaError_t cudaMemcpy(void *dst, const void *src, size_t n, enum cudaMemcpyKind k)
{
    if (poisoned)
        return cudaErrorECCUncorrectable;
    (void)k;
    ENTER();
    strict_idle("cudaMemcpy");
    memcpy(dst, src, n);
    LEAVE(cudaSuccess);
}

cudaError_t cudaMemset(void *dst, int v, size_t n)
{
    ENTER();
    strict_idle("cudaMemset");
    memset(dst, v, n);
    LEAVE(cudaSuccess);
}

cudaError_t cudaDeviceSynchronize(void)
{
    ENTER();
    drain_mine("cudaDeviceSynchronize");
    LEAVE(cudaSuccess);
}

/* ---- kernels: the CPU reference behind the launchers' checks ---- */

/* Element i of x, as fp32. */
static float ld(dt_dtype_t t, const void *p, int64_t i)
{
    if (t == DT_F32)
        return ((const float *)p)[i];
    return dt_half_value(t, ((const uint16_t *)p)[i]);
}

typedef struct kfwd {
    dt_attn_cuda_t a;
    int acc;
    float *o, *lse;
    int64_t ldo, ldlse;
} kfwd_t;

static int64_t *positions(int causal, const int64_t *pos, int64_t base, int64_t n)
{
    if (!causal)
        return NULL;
    int64_t *p = malloc((size_t)(n ? n : 1) * 8);
    for (int64_t i = 0; i < n; i++)
        p[i] = pos ? pos[i] : base + i;
    return p;
}

static float *head_rows(const dt_attn_cuda_t *a, const void *x, int64_t ldx, int64_t n, int hh)
{
    float *f = malloc((size_t)(n ? n : 1) * a->d * sizeof(float));
    for (int64_t i = 0; i < n; i++)
        for (int e = 0; e < a->d; e++)
            f[i * a->d + e] = ld(a->dtype, x, i * ldx + (int64_t)hh * a->d + e);
    return f;
}

/* The kernels' argument checks: DT_EINVAL naming the call, as the real
 * launchers refuse them, before anything is queued. */
static int check_attn(const dt_attn_cuda_t *a, const char *fn, dt_emsg_t *em)
{
    if ((a->d != 64 && a->d != 128) || a->h < 1 || a->hkv < 1 || a->h % a->hkv ||
        a->ldq < (int64_t)a->h * a->d || a->ldk < (int64_t)a->hkv * a->d ||
        a->ldv < (int64_t)a->hkv * a->d || (uintptr_t)a->q % 16 || (uintptr_t)a->k % 16 ||
        (uintptr_t)a->v % 16 || (a->dtype != DT_BF16 && a->dtype != DT_F16))
        return dt_emsg_set(em, DT_EINVAL, "sim: bad args to %s (d %d, h %d/%d)", fn, a->d, a->h,
                           a->hkv);
    return 0;
}

static void do_fwd(void *arg)
{
    kfwd_t *k = arg;
    const dt_attn_cuda_t *a = &k->a;
    int g = a->h / a->hkv;
    float scale = a->scale != 0.f ? a->scale : 1.f / sqrtf((float)a->d);
    int64_t *qp = positions(a->causal || a->qlo, a->qpos, a->q0, a->tq);
    int64_t *kp = positions(a->causal || a->qlo, a->kpos, a->k0, a->tk);
    for (int hh = 0; hh < a->h; hh++) {
        float *qf = head_rows(a, a->q, a->ldq, a->tq, hh);
        float *kf = head_rows(a, a->k, a->ldk, a->tk, hh / g);
        float *vf = head_rows(a, a->v, a->ldv, a->tk, hh / g);
        if (!k->acc)
            for (int64_t i = 0; i < a->tq; i++) {
                memset(k->o + i * k->ldo + (int64_t)hh * a->d, 0, (size_t)a->d * 4);
                k->lse[hh * k->ldlse + i] = -INFINITY;
            }
        dt_attn_head_t h = { .tq = a->tq, .tk = a->tk, .d = a->d, .q = qf, .ldq = a->d,
                             .k = kf, .ldk = a->d, .v = vf, .ldv = a->d, .qpos = qp,
                             .kpos = kp, .qlo = a->qlo, .qhi = a->qhi, .scale = scale };
        dt_attn_head_fwd_ref(&h, k->o + (int64_t)hh * a->d, k->ldo, k->lse + hh * k->ldlse);
        free(qf);
        free(kf);
        free(vf);
    }
    free(qp);
    free(kp);
}

int dt_attn_fwd_cuda(const dt_attn_cuda_t *a, int accumulate, float *o, int64_t ldo, float *lse,
                     int64_t ldlse, cudaStream_t st, dt_emsg_t *em)
{
    int rc = check_attn(a, "fwd", em);
    if (rc < 0)
        return rc;
    if (ldo < (int64_t)a->h * a->d || ldlse < a->tq)
        return dt_emsg_set(em, DT_EINVAL, "sim: fwd strides (ldo %lld, ldlse %lld)",
                           (long long)ldo, (long long)ldlse);
    maybe_poison();
    ENTER();
    kfwd_t *k = malloc(sizeof(*k));
    k->a = *a;
    k->acc = accumulate;
    k->o = o;
    k->lse = lse;
    k->ldo = ldo;
    k->ldlse = ldlse;
    enqueue_fn(st, do_fwd, k, "fwd");
    LEAVE(0);
}

typedef struct kbwd {
    dt_attn_cuda_t a;
    dt_attn_cuda_grad_t g;
} kbwd_t;

static void do_bwd(void *arg)
{
    kbwd_t *k = arg;
    const dt_attn_cuda_t *a = &k->a;
    const dt_attn_cuda_grad_t *g = &k->g;
    int grp = a->h / a->hkv, d = a->d;
    float scale = a->scale != 0.f ? a->scale : 1.f / sqrtf((float)a->d);
    int64_t *qp = positions(a->causal || a->qlo, a->qpos, a->q0, a->tq);
    int64_t *kp = positions(a->causal || a->qlo, a->kpos, a->k0, a->tk);
    for (int hh = 0; hh < a->h; hh++) {
        int kvh = hh / grp;
        float *qf = head_rows(a, a->q, a->ldq, a->tq, hh);
        float *kf = head_rows(a, a->k, a->ldk, a->tk, kvh);
        float *vf = head_rows(a, a->v, a->ldv, a->tk, kvh);
        float *dof = head_rows(a, g->dout, g->lddo, a->tq, hh);
        float *dq = calloc((size_t)(a->tq + 1) * d, 4), *dk = calloc((size_t)(a->tk + 1) * d, 4),
              *dv = calloc((size_t)(a->tk + 1) * d, 4);
        dt_attn_head_t h = { .tq = a->tq, .tk = a->tk, .d = d, .q = qf, .ldq = d, .k = kf,
                             .ldk = d, .v = vf, .ldv = d, .qpos = qp, .kpos = kp,
                             .qlo = a->qlo, .qhi = a->qhi, .scale = scale };
        dt_attn_head_grad_t gd = { .dout = dof, .lddo = d, .lse = g->lse + hh * g->ldlse,
                                   .delta = g->delta + hh * g->ldlse, .dq = dq, .dk = dk,
                                   .dv = dv };
        dt_attn_head_bwd_ref(&h, &gd);
        for (int64_t i = 0; i < a->tq; i++)
            for (int e = 0; e < d; e++)
                g->dq[i * g->lddq + (int64_t)hh * d + e] += dq[i * d + e];
        for (int64_t j = 0; j < a->tk; j++)
            for (int e = 0; e < d; e++) {
                g->dk[j * g->lddk + (int64_t)kvh * d + e] += dk[j * d + e];
                g->dv[j * g->lddv + (int64_t)kvh * d + e] += dv[j * d + e];
            }
        free(qf);
        free(kf);
        free(vf);
        free(dof);
        free(dq);
        free(dk);
        free(dv);
    }
    free(qp);
    free(kp);
}

int dt_attn_bwd_cuda(const dt_attn_cuda_t *a, const dt_attn_cuda_grad_t *g, cudaStream_t st,
                     dt_emsg_t *em)
{
    int rc = check_attn(a, "bwd", em);
    if (rc < 0)
        return rc;
    if ((uintptr_t)g->dout % 16 || (uintptr_t)g->dq % 8 || (uintptr_t)g->dk % 8 ||
        (uintptr_t)g->dv % 8 || g->ldlse < a->tq)
        return dt_emsg_set(em, DT_EINVAL, "sim: bwd args (alignment or ldlse %lld)",
                           (long long)g->ldlse);
    ENTER();
    kbwd_t *k = malloc(sizeof(*k));
    k->a = *a;
    k->g = *g;
    enqueue_fn(st, do_bwd, k, "bwd");
    LEAVE(0);
}

typedef struct kdelta {
    int64_t n;
    int h, d;
    dt_dtype_t t;
    const void *dout;
    int64_t lddo;
    const float *o;
    int64_t ldo;
    float *delta;
    int64_t ldd;
} kdelta_t;

static void do_delta(void *arg)
{
    kdelta_t *k = arg;
    for (int hh = 0; hh < k->h; hh++)
        for (int64_t i = 0; i < k->n; i++) {
            double s = 0;
            for (int e = 0; e < k->d; e++)
                s += (double)ld(k->t, k->dout, i * k->lddo + (int64_t)hh * k->d + e) *
                     k->o[i * k->ldo + (int64_t)hh * k->d + e];
            k->delta[hh * k->ldd + i] = (float)s;
        }
}

int dt_attn_delta_cuda(int64_t n, int h, int d, dt_dtype_t dtype, const void *dout, int64_t lddo,
                       const float *o, int64_t ldo, float *delta, int64_t lddelta,
                       cudaStream_t st, dt_emsg_t *em)
{
    (void)em;
    ENTER();
    kdelta_t *k = malloc(sizeof(*k));
    *k = (kdelta_t){ n, h, d, dtype, dout, lddo, o, ldo, delta, lddelta };
    enqueue_fn(st, do_delta, k, "delta");
    LEAVE(0);
}

int dt_attn_merge_cuda(int64_t n, int h, int d, float *o1, int64_t ld1, float *lse1, int64_t ldl1,
                       const float *o2, int64_t ld2, const float *lse2, int64_t ldl2,
                       cudaStream_t st, dt_emsg_t *em)
{
    fprintf(stderr, "sim: merge_cuda unused\n");
    abort();
}

typedef struct kdil {
    int kind;
    dt_dtype_t t;
    int64_t n;
    int nh, d;
    const void *x;
    int64_t ldx, first, step;
    int hlo;
    void *out;
    const float *o2, *lse2;
    float *o, *lse;
    int64_t ldo, ldl;
} kdil_t;

static void do_dil(void *arg)
{
    kdil_t *k = arg;
    size_t es = dt_dtype_size(k->t);
    for (int64_t m = 0; m < k->n; m++) {
        int64_t row = k->first + m * k->step;
        switch (k->kind) {
        case 0: /* gather */
            memcpy((char *)k->out + (size_t)(m * k->nh * k->d) * es,
                   (const char *)k->x + (size_t)(row * k->ldx + (int64_t)k->hlo * k->d) * es,
                   (size_t)(k->nh * k->d) * es);
            break;
        case 1: /* gather rows */
            for (int hh = 0; hh < k->nh; hh++)
                ((float *)k->out)[hh * k->n + m] =
                    ((const float *)k->x)[(k->hlo + hh) * k->ldx + row];
            break;
        case 2: /* merge */
            for (int hh = 0; hh < k->nh; hh++)
                dt_attn_merge_cpu(1, k->d, k->o + row * k->ldo + (int64_t)(k->hlo + hh) * k->d,
                                  k->d, k->lse + (k->hlo + hh) * k->ldl + row,
                                  k->o2 + (m * k->nh + hh) * k->d, k->d,
                                  k->lse2 + hh * k->n + m);
            break;
        case 3: /* scatter add */
            for (int j = 0; j < k->nh * k->d; j++)
                k->o[row * k->ldo + (int64_t)k->hlo * k->d + j] += k->o2[m * k->nh * k->d + j];
            break;
        }
    }
}

static int dil(kdil_t *k, cudaStream_t st, const char *what)
{
    if (k->n < 0 || k->first < 0 || k->step < 1 || k->hlo < 0) {
        fprintf(stderr, "sim: bad %s\n", what);
        abort();
    }
    ENTER();
    kdil_t *c = malloc(sizeof(*c));
    *c = *k;
    enqueue_fn(st, do_dil, c, what);
    LEAVE(0);
}

int dt_dilate_gather_cuda(dt_dtype_t dtype, int64_t n, int nh, int d, const void *x, int64_t ldx,
                          int64_t first, int64_t step, int hlo, void *out, cudaStream_t st,
                          dt_emsg_t *em)
{
    (void)em;
    if (ldx < (int64_t)(hlo + nh) * d) {
        fprintf(stderr, "sim: gather ld\n");
        abort();
    }
    kdil_t k = { .kind = 0, .t = dtype, .n = n, .nh = nh, .d = d, .x = x, .ldx = ldx,
                 .first = first, .step = step, .hlo = hlo, .out = out };
    return dil(&k, st, "gather");
}

int dt_dilate_gather_rows_cuda(int64_t n, int nh, const float *lse, int64_t ldl, int64_t first,
                               int64_t step, int hlo, float *out, cudaStream_t st, dt_emsg_t *em)
{
    (void)em;
    if (ldl <= first + (n - 1) * step) {
        fprintf(stderr, "sim: gather_rows ldl\n");
        abort();
    }
    kdil_t k = { .kind = 1, .t = DT_F32, .n = n, .nh = nh, .x = lse, .ldx = ldl,
                 .first = first, .step = step, .hlo = hlo, .out = out };
    return dil(&k, st, "gather_rows");
}

int dt_dilate_merge_cuda(int64_t n, int nh, int d, const float *o2, const float *lse2, float *o,
                         int64_t ldo, float *lse, int64_t ldl, int64_t first, int64_t step,
                         int hlo, cudaStream_t st, dt_emsg_t *em)
{
    (void)em;
    if (ldo < (int64_t)(hlo + nh) * d || ldl <= first + (n - 1) * step) {
        fprintf(stderr, "sim: merge ld\n");
        abort();
    }
    kdil_t k = { .kind = 2, .n = n, .nh = nh, .d = d, .o2 = o2, .lse2 = lse2, .o = o,
                 .lse = lse, .ldo = ldo, .ldl = ldl, .first = first, .step = step, .hlo = hlo };
    return dil(&k, st, "merge");
}

int dt_dilate_scatter_add_cuda(int64_t n, int nh, int d, const float *g, float *dst, int64_t ldd,
                               int64_t first, int64_t step, int hlo, cudaStream_t st,
                               dt_emsg_t *em)
{
    (void)em;
    if (ldd < (int64_t)(hlo + nh) * d) {
        fprintf(stderr, "sim: scatter ld\n");
        abort();
    }
    kdil_t k = { .kind = 3, .n = n, .nh = nh, .d = d, .o2 = g, .o = dst, .ldo = ldd,
                 .first = first, .step = step, .hlo = hlo };
    return dil(&k, st, "scatter_add");
}

/* ---- cuDNN's attention (kernels/cuda/attn_cudnn.h): the same contract on
 * the CPU reference. Its version is DT_SIM_CUDNN (default 91900; 0: "not
 * installed"), and it routes blocks by the real rules (cudnn_rules.c), so
 * the ring's choices for a version run here. Its output o and gradients are
 * rounded to dtype as cuDNN's are; its workspace is filled with NaN before
 * use, so a caller that reads scratch it did not write sees NaN. ---- */

size_t dt_cudnn_version(dt_emsg_t *em)
{
    const char *e = getenv("DT_SIM_CUDNN");
    size_t v = e != NULL ? (size_t)strtoul(e, NULL, 10) : 91900;

    if (v == 0 && em != NULL)
        dt_emsg_set(em, DT_ENOTSUP, "cuDNN cannot be loaded: not installed (DT_SIM_CUDNN=0)");
    return v;
}

int dt_cudnn_supports(const dt_cudnn_sdpa_t *a, int bwd, dt_emsg_t *em)
{
    size_t v = dt_cudnn_version(em);

    return v == 0 ? DT_ENOTSUP : dt_cudnn_rules(a, bwd, v, em);
}

/* what the real plans ask for, roughly: the backward's Dsum, its dQ
 * accumulator or (deterministic) dS */
static size_t sim_cudnn_ws(const dt_cudnn_sdpa_t *a, int bwd)
{
    size_t h = (size_t)a->h, q = (size_t)a->tq, k = (size_t)a->tk;

    if (!bwd)
        return 256;
    return h * q * 4 + (a->det ? h * q * ((k + 127) / 128 * 128) * 2 : h * q * (size_t)a->d * 4);
}

int dt_cudnn_ws(const dt_cudnn_sdpa_t *a, int bwd, size_t *bytes, dt_emsg_t *em)
{
    if (dt_cudnn_version(em) == 0)
        return DT_ENOTSUP;
    *bytes = sim_cudnn_ws(a, bwd);
    return 0;
}

int dt_cudnn_plan_offline(const dt_cudnn_sdpa_t *a, int bwd, const char *props_json,
                          size_t *bytes, int64_t *engine, dt_emsg_t *em)
{
    (void)a;
    (void)bwd;
    (void)props_json;
    (void)bytes;
    (void)engine;
    return dt_emsg_set(em, DT_ENOTSUP, "sim: no offline plans");
}

typedef struct kdn {
    dt_cudnn_sdpa_t a;
    int bwd;
    const void *q, *k, *v, *o, *dout;
    void *oo, *dq, *dk, *dv, *ws;
    float *stats;
    const float *lse;
} kdn_t;

static void st_half(dt_dtype_t t, void *p, int64_t i, float f)
{
    ((uint16_t *)p)[i] = dt_half_bits(t, f);
}

/* rows of one head as fp32 (n rows at stride ld of width d from column c) */
static float *rows_f(dt_dtype_t t, const void *x, int64_t pitch, int64_t n, int64_t c, int d)
{
    float *f = malloc((size_t)(n ? n : 1) * (size_t)d * sizeof(float));
    for (int64_t i = 0; i < n; i++)
        for (int e = 0; e < d; e++)
            f[i * d + e] = ld(t, x, i * pitch + c + e);
    return f;
}

static void do_cudnn(void *arg)
{
    kdn_t *k = arg;
    const dt_cudnn_sdpa_t *a = &k->a;
    const int d = a->d, grp = a->h / a->hkv;
    const float scale = a->scale != 0.f ? a->scale : 1.f / sqrtf((float)d);
    const int full = a->shift == DT_CUDNN_FULL || a->shift >= a->tk - 1;
    int64_t *qp = NULL, *kp = NULL;
    float *sums = calloc(2 * (size_t)a->tk * d, sizeof(float)); /* GQA: a kv head's dK, dV */

    if (!full) { /* key j visible iff j <= i + shift */
        qp = malloc((size_t)a->tq * 8);
        kp = malloc((size_t)a->tk * 8);
        for (int64_t i = 0; i < a->tq; i++)
            qp[i] = i + a->shift;
        for (int64_t j = 0; j < a->tk; j++)
            kp[j] = j;
    }
    for (int hh = 0; hh < a->h; hh++) {
        const int kvh = hh / grp;
        float *qf = rows_f(a->dtype, k->q, a->ldq, a->tq, (int64_t)hh * d, d);
        float *kf = rows_f(a->dtype, k->k, a->ldk, a->tk, (int64_t)kvh * d, d);
        float *vf = rows_f(a->dtype, k->v, a->ldv, a->tk, (int64_t)kvh * d, d);
        dt_attn_head_t h = { .tq = a->tq, .tk = a->tk, .d = d, .q = qf, .ldq = d, .k = kf,
                             .ldk = d, .v = vf, .ldv = d, .qpos = qp, .kpos = kp,
                             .scale = scale };
        if (!k->bwd) {
            float *o = calloc((size_t)a->tq * d, sizeof(float));
            float *l = malloc((size_t)a->tq * sizeof(float));
            for (int64_t i = 0; i < a->tq; i++)
                l[i] = -INFINITY;
            dt_attn_head_fwd_ref(&h, o, d, l);
            for (int64_t i = 0; i < a->tq; i++) {
                if (!isfinite(l[i])) {
                    fprintf(stderr, "sim: cudnn fwd: row %lld sees no key\n", (long long)i);
                    abort();
                }
                k->stats[(int64_t)hh * a->tq + i] = l[i];
                for (int e = 0; e < d; e++)
                    st_half(a->dtype, k->oo, i * a->ldo + (int64_t)hh * d + e, o[i * d + e]);
            }
            free(o);
            free(l);
        } else {
            float *of = rows_f(a->dtype, k->o, a->ldo, a->tq, (int64_t)hh * d, d);
            float *dof = rows_f(a->dtype, k->dout, a->ldo, a->tq, (int64_t)hh * d, d);
            float *delta = malloc((size_t)a->tq * sizeof(float));
            float *dq = calloc((size_t)a->tq * d, 4), *dk = calloc((size_t)a->tk * d, 4),
                  *dv = calloc((size_t)a->tk * d, 4);
            for (int64_t i = 0; i < a->tq; i++) {
                double sum = 0;
                for (int e = 0; e < d; e++)
                    sum += (double)dof[i * d + e] * of[i * d + e];
                delta[i] = (float)sum;
            }
            dt_attn_head_grad_t gd = { .dout = dof, .lddo = d, .lse = k->lse + (int64_t)hh * a->tq,
                                       .delta = delta, .dq = dq, .dk = dk, .dv = dv };
            dt_attn_head_bwd_ref(&h, &gd);
            for (int64_t i = 0; i < a->tq; i++)
                for (int e = 0; e < d; e++)
                    st_half(a->dtype, k->dq, i * a->ldo + (int64_t)hh * d + e, dq[i * d + e]);
            /* a query head's share of its kv head (GQA): summed in fp32,
             * rounded when the group is complete */
            if (hh % grp == 0)
                memset(sums, 0, 2 * (size_t)a->tk * d * sizeof(float));
            float *sk = sums, *sv = sums + (size_t)a->tk * d;
            for (int64_t j = 0; j < a->tk * d; j++) {
                sk[j] += dk[j];
                sv[j] += dv[j];
            }
            if (hh % grp == grp - 1)
                for (int64_t j = 0; j < a->tk; j++)
                    for (int e = 0; e < d; e++) {
                        st_half(a->dtype, k->dk, j * a->lddk + (int64_t)kvh * d + e, sk[j * d + e]);
                        st_half(a->dtype, k->dv, j * a->lddk + (int64_t)kvh * d + e, sv[j * d + e]);
                    }
            free(of);
            free(dof);
            free(delta);
            free(dq);
            free(dk);
            free(dv);
        }
        free(qf);
        free(kf);
        free(vf);
    }
    free(qp);
    free(kp);
    free(sums);
}

static void check_cudnn(const dt_cudnn_sdpa_t *a, int bwd, const char *fn)
{
    dt_emsg_t em = { 0 };

    if (dt_cudnn_supports(a, bwd, &em) < 0 || a->tq < 1 || a->tk < 1 ||
        a->ldq < (int64_t)a->h * a->d || a->ldo < (int64_t)a->h * a->d ||
        (bwd && a->lddk < (int64_t)a->hkv * a->d)) {
        fprintf(stderr, "sim: %s: a block cuDNN does not take: %s\n", fn, em.s);
        abort();
    }
}

/* the workspace cuDNN would use, as NaN */
static void poison_ws(const dt_cudnn_sdpa_t *a, int bwd, void *ws)
{
    size_t n = sim_cudnn_ws(a, bwd) / sizeof(float);
    for (size_t i = 0; i < n; i++)
        ((float *)ws)[i] = NAN;
}

static void do_cudnn_fwd(void *arg)
{
    kdn_t *k = arg;
    poison_ws(&k->a, 0, k->ws);
    do_cudnn(arg);
}

int dt_cudnn_fwd(const dt_cudnn_sdpa_t *a, const void *q, const void *k, const void *v, void *o,
                 float *stats, void *ws, cudaStream_t st, dt_emsg_t *em)
{
    (void)em;
    check_cudnn(a, 0, "dt_cudnn_fwd");
    maybe_poison();
    ENTER();
    kdn_t *c = calloc(1, sizeof(*c));
    *c = (kdn_t){ .a = *a, .q = q, .k = k, .v = v, .oo = o, .stats = stats, .ws = ws };
    enqueue_fn(st, do_cudnn_fwd, c, "cudnn_fwd");
    LEAVE(0);
}

static void do_cudnn_bwd(void *arg)
{
    kdn_t *k = arg;
    poison_ws(&k->a, 1, k->ws);
    do_cudnn(arg);
}

int dt_cudnn_bwd(const dt_cudnn_sdpa_t *a, const void *q, const void *k, const void *v,
                 const void *o, const void *dout, const float *lse, void *dq, void *dk, void *dv,
                 void *ws, cudaStream_t st, dt_emsg_t *em)
{
    (void)em;
    check_cudnn(a, 1, "dt_cudnn_bwd");
    ENTER();
    kdn_t *c = calloc(1, sizeof(*c));
    *c = (kdn_t){ .a = *a, .bwd = 1, .q = q, .k = k, .v = v, .o = o, .dout = dout, .dq = dq,
                  .dk = dk, .dv = dv, .ws = ws, .lse = lse };
    enqueue_fn(st, do_cudnn_bwd, c, "cudnn_bwd");
    LEAVE(0);
}

typedef struct khalf {
    int kind; /* 0 merge, 1 empty, 2 add */
    int64_t n, width;
    int h, d;
    dt_dtype_t t;
    float *o1, *lse1;
    int64_t ld1, ldl1;
    const void *o2;
    const float *lse2;
    int64_t ld2, ldl2;
} khalf_t;

static void do_half(void *arg)
{
    khalf_t *k = arg;
    float *row = malloc((size_t)(k->d > 0 ? k->d : 1) * sizeof(float));

    for (int64_t m = 0; m < k->n; m++) {
        if (k->kind == 2) {
            for (int64_t c = 0; c < k->width; c++)
                k->o1[m * k->ld1 + c] += ld(k->t, k->o2, m * k->ld2 + c);
            continue;
        }
        for (int hh = 0; hh < k->h; hh++) {
            float *x = k->o1 + m * k->ld1 + (int64_t)hh * k->d;
            if (k->kind == 1) {
                memset(x, 0, (size_t)k->d * sizeof(float));
                k->lse1[hh * k->ldl1 + m] = -INFINITY;
                continue;
            }
            if (k->kind == 3) { /* set: the target's old contents are never read */
                for (int e = 0; e < k->d; e++)
                    x[e] = NAN;
                k->lse1[hh * k->ldl1 + m] = -INFINITY;
            }
            for (int e = 0; e < k->d; e++)
                row[e] = ld(k->t, k->o2, m * k->ld2 + (int64_t)hh * k->d + e);
            dt_attn_merge_cpu(1, k->d, x, k->d, k->lse1 + hh * k->ldl1 + m, row, k->d,
                              k->lse2 + hh * k->ldl2 + m);
        }
    }
    free(row);
}

static int half_op(const khalf_t *k, cudaStream_t st, const char *what)
{
    if (k->n < 0) {
        fprintf(stderr, "sim: bad %s\n", what);
        abort();
    }
    ENTER();
    khalf_t *c = malloc(sizeof(*c));
    *c = *k;
    enqueue_fn(st, do_half, c, what);
    LEAVE(0);
}

/* merge_half (kind 0) and set_half (kind 3): the same arguments */
static int half_partial(int kind, const char *what, int64_t n, int h, int d, dt_dtype_t dtype,
                        float *o1, int64_t ld1, float *lse1, int64_t ldl1, const void *o2,
                        int64_t ld2, const float *lse2, int64_t ldl2, cudaStream_t st)
{
    if (ld1 < (int64_t)h * d || ld2 < (int64_t)h * d || ldl1 < n || ldl2 < n) {
        fprintf(stderr, "sim: %s strides\n", what);
        abort();
    }
    khalf_t k = { .kind = kind, .n = n, .h = h, .d = d, .t = dtype, .o1 = o1, .ld1 = ld1,
                  .lse1 = lse1, .ldl1 = ldl1, .o2 = o2, .ld2 = ld2, .lse2 = lse2, .ldl2 = ldl2 };
    return half_op(&k, st, what);
}

int dt_attn_merge_half_cuda(int64_t n, int h, int d, dt_dtype_t dtype, float *o1, int64_t ld1,
                            float *lse1, int64_t ldl1, const void *o2, int64_t ld2,
                            const float *lse2, int64_t ldl2, cudaStream_t st, dt_emsg_t *em)
{
    (void)em;
    return half_partial(0, "merge_half", n, h, d, dtype, o1, ld1, lse1, ldl1, o2, ld2, lse2, ldl2,
                        st);
}

int dt_attn_set_half_cuda(int64_t n, int h, int d, dt_dtype_t dtype, float *o1, int64_t ld1,
                          float *lse1, int64_t ldl1, const void *o2, int64_t ld2,
                          const float *lse2, int64_t ldl2, cudaStream_t st, dt_emsg_t *em)
{
    (void)em;
    return half_partial(3, "set_half", n, h, d, dtype, o1, ld1, lse1, ldl1, o2, ld2, lse2, ldl2,
                        st);
}

int dt_attn_empty_cuda(int64_t n, int h, int d, float *o, int64_t ldo, float *lse, int64_t ldlse,
                       cudaStream_t st, dt_emsg_t *em)
{
    (void)em;
    khalf_t k = { .kind = 1, .n = n, .h = h, .d = d, .o1 = o, .ld1 = ldo, .lse1 = lse,
                  .ldl1 = ldlse };
    return half_op(&k, st, "empty");
}

int dt_attn_add_half_cuda(int64_t n, int64_t width, dt_dtype_t dtype, const void *src,
                          int64_t lds, float *dst, int64_t ldd, cudaStream_t st, dt_emsg_t *em)
{
    (void)em;
    if (lds < width || ldd < width) {
        fprintf(stderr, "sim: add_half strides\n");
        abort();
    }
    khalf_t k = { .kind = 2, .n = n, .width = width, .t = dtype, .o1 = dst, .ld1 = ldd,
                  .o2 = src, .ld2 = lds };
    return half_op(&k, st, "add_half");
}

/* ---- NCCL ---- */

static __thread int in_group;
static __thread op_t *group_op;
static __thread struct ncclComm *group_comm;
static __thread cudaStream_t group_stream;

const char *ncclGetErrorString(ncclResult_t r)
{
    return r == ncclSuccess ? "no error" : r == ncclInProgress ? "in progress" : "sim nccl error";
}

const char *ncclGetLastError(ncclComm_t c)
{
#ifdef SIM_NET
    if (c && c->net && sim_net_error(c->net))
        return sim_net_error(c->net);
#endif
    (void)c;
    return "sim last error";
}

ncclResult_t ncclGetUniqueId(ncclUniqueId *id)
{
    static unsigned long k = 100;
    memset(id, 0, sizeof(*id));
    pthread_mutex_lock(&mu);
    unsigned long key = ++k;
    pthread_mutex_unlock(&mu);
#ifdef SIM_NET
    /* unique across the processes of the host */
    if (getrandom(&key, sizeof(key), 0) != (ssize_t)sizeof(key))
        key ^= (unsigned long)getpid() << 20 ^ (unsigned long)time(NULL);
#endif
    memcpy(id->internal, &key, sizeof(key));
    return ncclSuccess;
}

ncclResult_t ncclCommInitRankConfig(ncclComm_t *comm, int n, ncclUniqueId id, int rank,
                                    ncclConfig_t *cfg)
{
    if (cfg->blocking != 0) {
        fprintf(stderr, "sim: expected a non-blocking communicator\n");
        abort();
    }
    ENTER();
    struct ncclComm *c = calloc(1, sizeof(*c));
    c->rank = rank;
    c->n = n;
    memcpy(&c->key, id.internal, sizeof(c->key));
    c->sseq = calloc((size_t)n, sizeof(unsigned long));
    c->rseq = calloc((size_t)n, sizeof(unsigned long));
    c->inprog = rnd(5);
#ifdef SIM_NET
    if ((c->net = sim_net_open(c->key, rank, n)) == NULL) {
        free(c->sseq);
        free(c->rseq);
        free(c);
        LEAVE(ncclSystemError);
    }
#endif
    *comm = c;
    LEAVE(c->inprog ? ncclInProgress : ncclSuccess);
}

ncclResult_t ncclCommGetAsyncError(ncclComm_t c, ncclResult_t *st)
{
    ENTER();
#ifdef SIM_NET
    if (c->net && !c->aborted) {
        sim_net_pump(c->net);
        if (sim_net_error(c->net)) {
            *st = ncclRemoteError;
            LEAVE(ncclSuccess);
        }
    }
#endif
    if (c->inprog > 0) {
        c->inprog--;
        *st = ncclInProgress;
    } else {
        *st = ncclSuccess;
    }
    LEAVE(ncclSuccess);
}

/* nccl.h declares ncclGroupStart() and ncclGroupEnd() without (void), which
 * is no prototype: define them under -Wno-missing-prototypes. */
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wmissing-prototypes"
ncclResult_t ncclGroupStart(void)
{
    if (in_group++ == 0) {
        group_op = calloc(1, sizeof(op_t));
        group_op->kind = OP_XCHG;
        group_op->what = "nccl group";
        group_comm = NULL;
        group_stream = NULL;
    }
    return ncclSuccess;
}

static ncclResult_t add_xfer(void *buf, size_t bytes, int peer, ncclComm_t c, cudaStream_t s,
                             int send)
{
    if (!in_group || group_op->nx == MAXX || (group_comm && group_comm != c) ||
        (group_stream && group_stream != s)) {
        fprintf(stderr, "sim: nccl p2p outside a group or mixed\n");
        abort();
    }
    pthread_mutex_lock(&mu);
    group_comm = c;
    group_stream = s;
    xfer_t *x = &group_op->x[group_op->nx];
    group_op->issend[group_op->nx++] = send;
    x->buf = buf;
    x->bytes = bytes;
    x->peer = peer;
    x->seq = send ? c->sseq[peer]++ : c->rseq[peer]++;
    pthread_mutex_unlock(&mu);
    return ncclSuccess;
}

ncclResult_t ncclSend(const void *buf, size_t count, ncclDataType_t t, int peer, ncclComm_t c,
                      cudaStream_t s)
{
    if (t != ncclUint8) {
        fprintf(stderr, "sim: ncclSend of type %d, not bytes\n", (int)t);
        abort();
    }
    return add_xfer((void *)buf, count, peer, c, s, 1);
}

ncclResult_t ncclRecv(void *buf, size_t count, ncclDataType_t t, int peer, ncclComm_t c,
                      cudaStream_t s)
{
    if (t != ncclUint8) {
        fprintf(stderr, "sim: ncclRecv of type %d, not bytes\n", (int)t);
        abort();
    }
    return add_xfer(buf, count, peer, c, s, 0);
}

ncclResult_t ncclGroupEnd(void)
{
    if (--in_group > 0)
        return ncclSuccess;
    ENTER();
    op_t *o = group_op;
    group_op = NULL;
    if (o->nx == 0) {
        free(o);
        LEAVE(ncclSuccess);
    }
    check_stream(group_stream, "ncclGroupEnd");
    o->comm = group_comm;
    push(group_stream, o);
    group_comm->inprog = rnd(3);
    LEAVE(group_comm->inprog ? ncclInProgress : ncclSuccess);
}
#pragma GCC diagnostic pop

/* An all-reduce (fp32 sum) over n ranks: every rank sends its buffer to
 * every peer and receives theirs (one exchange op), then sums the n
 * buffers in rank order (one kernel), so that every rank gets the same
 * bits, as NCCL's do. */
typedef struct ared {
    const float *sb;
    float *rb;
    size_t count;
    int n, me;
    float data[]; /* n slots of count: slot r from rank r (the own one unused) */
} ared_t;

static void do_ared(void *arg)
{
    const ared_t *a = arg;

    for (size_t i = 0; i < a->count; i++) {
        float s = 0.0f;
        for (int r = 0; r < a->n; r++)
            s += r == a->me ? a->sb[i] : a->data[(size_t)r * a->count + i];
        a->rb[i] = s;
    }
}

ncclResult_t ncclAllReduce(const void *sb, void *rb, size_t count, ncclDataType_t t,
                           ncclRedOp_t op, ncclComm_t c, cudaStream_t s)
{
    if (t != ncclFloat32 || op != ncclSum || 2 * (c->n - 1) > MAXX) {
        fprintf(stderr, "sim: allreduce only sums fp32 over at most %d ranks\n", MAXX / 2 + 1);
        abort();
    }
    ENTER();
    check_stream(s, "ncclAllReduce");
    ared_t *a = malloc(sizeof(*a) + (size_t)c->n * count * sizeof(float));
    a->sb = sb;
    a->rb = rb;
    a->count = count;
    a->n = c->n;
    a->me = c->rank;
    if (c->n > 1) {
        op_t *o = calloc(1, sizeof(*o));
        o->kind = OP_XCHG;
        o->what = "allreduce exchange";
        o->comm = c;
        for (int send = 1; send >= 0; send--)
            for (int p = 0; p < c->n; p++) {
                if (p == c->rank)
                    continue;
                xfer_t *x = &o->x[o->nx];
                o->issend[o->nx++] = send;
                x->buf = send ? (void *)sb : (void *)(a->data + (size_t)p * count);
                x->bytes = count * sizeof(float);
                x->peer = p;
                x->seq = send ? c->sseq[p]++ : c->rseq[p]++;
            }
        push(s, o);
    }
    enqueue_fn(s, do_ared, a, "allreduce sum");
    c->inprog = rnd(3);
    LEAVE(c->inprog ? ncclInProgress : ncclSuccess);
}

/* The range reduce-scatter's sum (kernels/cuda/train_cuda.h), here beside
 * the all-reduce whose order it repeats: slot r of rank r, in rank order. */
typedef struct sslots {
    int64_t n, ld;
    int R, me, acc;
    const float *own, *slots;
    float *dst;
} sslots_t;

static void do_sslots(void *arg)
{
    const sslots_t *k = arg;

    for (int64_t i = 0; i < k->n; i++) {
        float s = 0.0f;
        for (int r = 0; r < k->R; r++)
            s += r == k->me ? k->own[i] : k->slots[(int64_t)r * k->ld + i];
        k->dst[i] = k->acc ? k->dst[i] + s : s;
    }
}

int dt_sum_slots_cuda(int64_t n, int R, int me, const float *own, const float *slots,
                      int64_t ld, float *dst, int acc, cudaStream_t st, dt_emsg_t *em)
{
    int rc = dt_sum_slots_check(n, R, me, own, slots, ld, dst, em);
    if (rc < 0 || n == 0)
        return rc;
    ENTER();
    sslots_t *k = malloc(sizeof(*k));
    *k = (sslots_t){ .n = n, .ld = ld, .R = R, .me = me, .acc = acc, .own = own,
                     .slots = slots, .dst = dst };
    enqueue_fn(st, do_sslots, k, "sum_slots");
    LEAVE(0);
}

ncclResult_t ncclCommFinalize(ncclComm_t c)
{
    ENTER();
    c->inprog = rnd(3);
    LEAVE(c->inprog ? ncclInProgress : ncclSuccess);
}

/* Across processes: what is queued for the peers is written out first (a
 * send's group completed when it was queued), for at most
 * SIM_NET_CONNECT_S seconds. */
static void net_end(ncclComm_t c, int flush)
{
#ifdef SIM_NET
    for (int i = 0; flush && c->net && !sim_net_flushed(c->net) && !sim_net_error(c->net) &&
                    i < SIM_NET_CONNECT_S * 1000;
         i++) {
        sim_net_pump(c->net);
        pthread_mutex_unlock(&mu);
        usleep(1000);
        pthread_mutex_lock(&mu);
    }
    sim_net_close(c->net);
    c->net = NULL;
#else
    (void)c;
    (void)flush;
#endif
}

ncclResult_t ncclCommDestroy(ncclComm_t c)
{
    ENTER();
    net_end(c, 1);
    c->aborted = 1;
    LEAVE(ncclSuccess);
}

ncclResult_t ncclCommAbort(ncclComm_t c)
{
    ENTER();
    net_end(c, 0);
    c->aborted = 1;
    LEAVE(ncclSuccess);
}
