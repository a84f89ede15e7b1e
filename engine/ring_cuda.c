/* SPDX-License-Identifier: MIT
 *
 * Exact ring attention on GPUs, forward and backward (contract in
 * engine/ring_cuda.h): the schedule of engine/attn.c, with CUDA streams and
 * events instead of MPI requests, over the transports of comm_nccl.c.
 *
 * Dense forward, rank g, step t = 0 .. R-1, block of rank src = g - t:
 *   step 0 computes with the caller's own K/V (accumulate = 0), then K/V
 *   packs [K (c, Hkv, D) | V (c, Hkv, D) | positions (c) int64, zigzag
 *   causal only] rotate through two buffers kv[0], kv[1]: exchange t sends
 *   kv[t & 1] and receives kv[(t + 1) & 1] while step t computes.
 * Dense backward: the same K/V rotation; the dK/dV of each block (fp32
 *   packs [dK | dV], (2c, Hkv, D)) follow one step behind: step t computes
 *   into a zeroed pack while the previous rank's accumulation of the same
 *   block arrives, adds it, and sends the sum on; after R steps each
 *   rank's own block comes home and is copied into dk, dv. dq accumulates
 *   in place.
 * Dilated (every segment on one rank; refused otherwise): per branch,
 *   segment and head chunk, gather, one dense block, merge (forward) or
 *   scatter-add (backward); no communication.
 *
 * Events (enum ring_ev; "p" is a step parity, "b" a K/V buffer):
 *   KV[b]   kv[b] holds its block: recorded after packing (compute stream)
 *           or after the exchange that received it (comm stream).
 *   COMP[p] the compute stream is done with step p (it read kv[p]).
 *   G[p]    the gradient exchange of step p is complete.
 *   ADD[p]  the gradient pack of step p holds its sum: it may be sent, and
 *           the gradient receive buffer may be written again.
 * Waits of step t on rank l (cur = t & 1; "sent" is the event after which
 * l's send buffer has been read: l's own exchange for nccl, the next rank's
 * copy for the local transport):
 *   K/V exchange t (comm): COMP[t - 1] and sent(KV exchange t - 1) before
 *     kv[1 - cur] is overwritten; the transfer waits KV[cur] of the rank
 *     whose buffer it reads.
 *   gradient exchange t, 1 <= t <= R (comm): ADD[t - 1] of l (gin was
 *     added, gout holds its sum) and of the sender.
 *   compute t: KV[cur] (t > 0); backward: zeroing the pack waits
 *     sent(gradient exchange t - 1) (t >= 2: it was the pack sent then),
 *     the add waits G[t].
 * Host: after posting step t it waits COMP of step t - 1 (watchdog), so it
 * runs at most two steps ahead and a hang or abort is noticed per step.
 *
 * Not here: the transports and the watchdog (comm_nccl.c), the kernels
 * (kernels/cuda), the PMIx wire-up (ring_pmix.c).
 */
#include "config.h"

#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/clock.h"
#include "common/mem.h"
#include "engine/layout.h"
#include "engine/ring_impl.h"
#include "kernels/cuda/cuda_err.h"

#define WS_ALIGN ((size_t)256)

/* ---- workspace plan ------------------------------------------------------- */

/* Byte offsets into one rank's workspace. */
typedef struct plan {
    /* dense */
    size_t kv[2];  /* K/V packs, packbytes each (R > 1) */
    size_t qpos;   /* (c) int64 positions of my rows (positions travel) */
    size_t delta;  /* (H, c) fp32 rowsum(dout * o) (backward) */
    size_t g[3];   /* dK/dV packs (2c, Hkv, D) fp32: in, and two that alternate */
    /* dilated, one head chunk at a time */
    size_t qg, dog;            /* (n, nh, D) dtype: gathered q, dout */
    size_t kg, vg;             /* (n, nkv, D) dtype: gathered k, v */
    size_t o2, dq2;            /* (n, nh, D) fp32 */
    size_t dk2, dv2;           /* (n, nkv, D) fp32 */
    size_t lse2, lseg, deltag; /* (nh, n) fp32 */
    size_t total;
    size_t kvbytes;   /* K and V of one rank: 2 c Hkv D esz */
    size_t packbytes; /* kvbytes, plus c int64 positions when they travel */
    size_t gbytes;    /* dK and dV of one rank: 2 c Hkv D fp32 */
} plan_t;

static size_t carve(size_t *cur, size_t bytes)
{
    size_t off = (*cur + WS_ALIGN - 1) & ~(WS_ALIGN - 1);

    *cur = off + bytes;
    return off;
}

/* Positions travel with K/V (and kernels get position arrays) only where
 * a rank's rows are not one run: zigzag with R > 1, and only when causal
 * (without a mask positions do not matter). */
static int positions_travel(const dt_attn_spec_t *s, int R)
{
    return s->causal && s->layout == DT_LAYOUT_ZIGZAG && R > 1;
}

/* Length of one run of the layout (the rows of a rank are 1 or 2 runs). */
static int64_t run_len(const dt_attn_spec_t *s, int R)
{
    if (R == 1)
        return s->T;
    return s->layout == DT_LAYOUT_ZIGZAG ? s->T / R / 2 : s->T / R;
}

static void make_plan(const dt_attn_spec_t *s, dt_dtype_t dtype, int R, int bwd, plan_t *pl)
{
    const size_t esz = dt_dtype_size(dtype), D = (size_t)s->D;
    const size_t c = (size_t)(s->T / R), hkv = (size_t)s->Hkv, H = (size_t)s->H;
    size_t cur = 0;

    memset(pl, 0, sizeof(*pl));
    pl->kvbytes = 2 * c * hkv * D * esz;
    pl->packbytes = pl->kvbytes + (positions_travel(s, R) ? c * sizeof(int64_t) : 0);
    pl->gbytes = 2 * c * hkv * D * sizeof(float);
    if (s->nbranch == 0) {
        if (R > 1) {
            pl->kv[0] = carve(&cur, pl->packbytes);
            pl->kv[1] = carve(&cur, pl->packbytes);
        }
        if (positions_travel(s, R))
            pl->qpos = carve(&cur, c * sizeof(int64_t));
        if (bwd) {
            pl->delta = carve(&cur, H * c * sizeof(float));
            if (R > 1)
                for (int i = 0; i < 3; i++)
                    pl->g[i] = carve(&cur, pl->gbytes);
        }
        pl->total = cur;
        return;
    }

    /* the largest chunk: rows of a segment on one rank, sparsified */
    size_t nq = 1, nk = 1;
    int64_t L = run_len(s, R);
    for (int b = 0; b < s->nbranch; b++) {
        dt_attn_branch_t br = dt_attn_branch(s, b);
        int64_t span = br.w < L ? br.w : L;
        size_t n = (size_t)((span + br.r - 1) / br.r);
        int nkv = 1;
        for (int k = 0; k < br.nchunk; k++) {
            dt_attn_chunk_t ck = dt_attn_chunk(s, &br, k);
            nkv = ck.nkv > nkv ? ck.nkv : nkv;
        }
        nq = n * (size_t)br.hc > nq ? n * (size_t)br.hc : nq;
        nk = n * (size_t)nkv > nk ? n * (size_t)nkv : nk;
    }
    pl->qg = carve(&cur, nq * D * esz);
    pl->kg = carve(&cur, nk * D * esz);
    pl->vg = carve(&cur, nk * D * esz);
    pl->o2 = carve(&cur, nq * D * sizeof(float));
    pl->lse2 = carve(&cur, nq * sizeof(float));
    if (bwd) {
        pl->dog = carve(&cur, nq * D * esz);
        pl->lseg = carve(&cur, nq * sizeof(float));
        pl->deltag = carve(&cur, nq * sizeof(float));
        pl->dq2 = carve(&cur, nq * D * sizeof(float));
        pl->dk2 = carve(&cur, nk * D * sizeof(float));
        pl->dv2 = carve(&cur, nk * D * sizeof(float));
        pl->delta = carve(&cur, H * c * sizeof(float));
    }
    pl->total = cur;
}

size_t dt_ring_attn_bytes(const dt_attn_spec_t *s, dt_dtype_t dtype, int R, int backward)
{
    plan_t pl;

    if (s == NULL || dt_attn_check(s, R, NULL) < 0)
        return 0;
    make_plan(s, dtype, R, backward, &pl);
    return pl.total;
}

/* ---- one call ------------------------------------------------------------------ */

typedef struct lrank {
    char *ws;            /* workspace (plan offsets) */
    int64_t *hpos;       /* (c) host positions while positions travel */
    int64_t pmin, pmax;  /* my first and last position */
    int any;             /* forward: a block has been accumulated */
    int did[2];          /* step of parity p ran a kernel: its timing pair is valid */
    float *gin;          /* backward, R > 1: the dK/dV pack received */
    float *gcur, *gout;  /* ... the one computed into, the one being sent */
    double compute_s;    /* attention kernels on this rank */
} lrank_t;

typedef struct call {
    dt_ring_t *r;
    const dt_attn_spec_t *s;
    const dt_ring_io_t *io;
    dt_dtype_t dtype;
    size_t esz;
    int R, nl, bwd;
    int travel; /* positions travel in the K/V packs */
    int64_t c;
    plan_t pl;
    lrank_t *lr;        /* [nl] */
    void **send, **recv; /* [nl] exchange arguments */
    float *hinf;        /* (c) -inf on the host (dilated forward) */
    dt_attn_stats_t st;
    char what[64];
} call_t;

static void pos_range(const call_t *x, int rank, int64_t *lo, int64_t *hi)
{
    dt_run_t runs[DT_LAYOUT_MAXRUNS];
    int n = dt_layout_runs(x->s->layout, x->s->T, x->R, rank, runs);

    *lo = runs[0].start;
    *hi = runs[n - 1].start + runs[n - 1].len - 1;
}

/* Causal and every key of rank src after every query of rank g. */
static int skipped(const call_t *x, int g, int src)
{
    int64_t qlo, qhi, klo, khi;

    if (!x->s->causal)
        return 0;
    pos_range(x, g, &qlo, &qhi);
    pos_range(x, src, &klo, &khi);
    return klo > qhi;
}

/* ---- validation ------------------------------------------------------------- */

/* Dilated branches run only where each segment lies inside one run of one
 * rank: the runs have length L, start at multiples of L, and w divides L. */
static int check_local_branches(const dt_attn_spec_t *s, int R, dt_emsg_t *em)
{
    int64_t L = run_len(s, R);

    if (L == s->T)
        return 0;
    for (int b = 0; b < s->nbranch; b++) {
        int64_t w = s->seg[b];
        if (L % w == 0)
            continue;
        int64_t a = L / w * w, e = a + w < s->T ? a + w : s->T;
        return dt_emsg_set(em, DT_ELAYOUT,
                           "dilated branch %d (w=%lld, r=%lld): the segment [%lld, %lld) crosses "
                           "the rank boundary at position %lld (%s layout, R=%d, runs of %lld "
                           "tokens); the GPU ring computes dilated branches only when every "
                           "segment lies on one rank (w dividing %lld); segments spanning ranks "
                           "are not implemented on GPUs",
                           b + 1, (long long)w, (long long)s->dil[b], (long long)a, (long long)e,
                           (long long)L, dt_layout_name(s->layout), R, (long long)L,
                           (long long)L);
    }
    return 0;
}

static int check_ptr(const void *p, int align16, int l, const char *name, dt_emsg_t *em)
{
    if (p == NULL)
        return dt_emsg_set(em, DT_EINVAL, "ring attention: io[%d].%s is NULL", l, name);
    if (align16 && (uintptr_t)p % 16 != 0)
        return dt_emsg_set(em, DT_EINVAL, "ring attention: io[%d].%s is not 16-byte aligned", l,
                           name);
    return 0;
}

static int check_call(const dt_ring_t *r, const dt_attn_spec_t *s, dt_dtype_t dtype,
                      const dt_ring_io_t *io, int bwd, dt_emsg_t *em)
{
    int rc;

    if (s == NULL || io == NULL)
        return dt_emsg_set(em, DT_EINVAL, "ring attention: no %s", s == NULL ? "spec" : "io");
    if ((rc = dt_attn_check(s, r->R, em)) < 0)
        return rc;
    if (dtype != DT_BF16 && dtype != DT_F16)
        return dt_emsg_set(em, DT_EDTYPE, "ring attention: inputs of type %s (bf16 or fp16)",
                           dt_dtype_name(dtype));
    if (s->D != 64 && s->D != 128)
        return dt_emsg_set(em, DT_ESHAPE,
                           "ring attention: head dimension D=%d (the CUDA kernels take 64 or 128)",
                           s->D);
    if (s->nbranch > 0 && (rc = check_local_branches(s, r->R, em)) < 0)
        return rc;
    for (int l = 0; l < r->nlocal; l++) {
        const dt_ring_io_t *x = &io[l];
        if ((rc = check_ptr(x->q, 1, l, "q", em)) < 0 || (rc = check_ptr(x->k, 1, l, "k", em)) < 0 ||
            (rc = check_ptr(x->v, 1, l, "v", em)) < 0 ||
            (rc = check_ptr(x->o, 0, l, "o", em)) < 0 ||
            (rc = check_ptr(x->lse, 0, l, "lse", em)) < 0)
            return rc;
        if (bwd && ((rc = check_ptr(x->dout, 1, l, "dout", em)) < 0 ||
                    (rc = check_ptr(x->dq, 0, l, "dq", em)) < 0 ||
                    (rc = check_ptr(x->dk, 0, l, "dk", em)) < 0 ||
                    (rc = check_ptr(x->dv, 0, l, "dv", em)) < 0))
            return rc;
    }
    return 0;
}

/* ---- steps shared by both directions ------------------------------------------ */

/* Exchange t of the K/V packs: send kv[t & 1], receive kv[(t + 1) & 1]. */
static int kv_exchange(call_t *x, int t, dt_emsg_t *em)
{
    dt_ring_t *r = x->r;
    int cur = t & 1;

    for (int l = 0; l < x->nl; l++) {
        cudaStream_t cs = r->p[l].comm;
        if (t > 0) {
            /* kv[1 - cur] is overwritten: step t - 1 computed on it, and
             * exchange t - 1 sent it (nccl: ordered on this stream; local:
             * the next rank's copy out of it) */
            DT_CUDA_TRY(em, cudaStreamWaitEvent(cs, r->p[l].ev[RING_EV_COMP0 + 1 - cur], 0));
            DT_CUDA_TRY(em, cudaStreamWaitEvent(cs, dt_ring_sent_event(r, RING_EV_KV0 + cur, l), 0));
        }
        x->send[l] = x->lr[l].ws + x->pl.kv[cur];
        x->recv[l] = x->lr[l].ws + x->pl.kv[1 - cur];
    }
    x->st.bytes_sent += (double)x->pl.packbytes * x->nl;
    return dt_ring_xchg(r, x->send, x->recv, x->pl.packbytes, RING_EV_KV0 + cur,
                        RING_EV_KV0 + 1 - cur, em);
}

/* Gradient exchange t (1 .. R): send the sum of step t - 1, receive the
 * previous rank's sum for the block of step t (t = R: my own block, home). */
static int grad_exchange(call_t *x, int t, dt_emsg_t *em)
{
    dt_ring_t *r = x->r;
    int q = (t - 1) & 1;

    for (int l = 0; l < x->nl; l++) {
        /* gout holds its sum and gin has been added: ADD of step t - 1 */
        DT_CUDA_TRY(em, cudaStreamWaitEvent(r->p[l].comm, r->p[l].ev[RING_EV_ADD0 + q], 0));
        x->send[l] = x->lr[l].gout;
        x->recv[l] = x->lr[l].gin;
    }
    x->st.bytes_sent += (double)x->pl.gbytes * x->nl;
    return dt_ring_xchg(r, x->send, x->recv, x->pl.gbytes, RING_EV_ADD0 + q, RING_EV_G0 + (t & 1),
                        em);
}

/* The dense block of step t on local rank l: q and o against the K/V of
 * rank g - t (the caller's own at t = 0, else the pack in kv[t & 1]). */
static void dense_block(const call_t *x, int l, int t, dt_attn_cuda_t *a)
{
    const dt_attn_spec_t *s = x->s;
    const dt_ring_io_t *io = &x->io[l];
    const lrank_t *lr = &x->lr[l];
    int g = dt_ring_rank(x->r, l), src = (g - t + x->R) % x->R;
    int64_t klo, khi;
    /* the pack exists when R > 1 (t > 0), positions when they travel */
    const char *pack = t > 0 ? lr->ws + x->pl.kv[t & 1] : NULL;
    const int64_t *qpos = x->travel ? (const int64_t *)(const void *)(lr->ws + x->pl.qpos) : NULL;

    memset(a, 0, sizeof(*a));
    a->tq = a->tk = x->c;
    a->h = s->H;
    a->hkv = s->Hkv;
    a->d = s->D;
    a->dtype = x->dtype;
    a->q = io->q;
    a->ldq = (int64_t)s->H * s->D;
    a->k = t == 0 ? io->k : (const void *)pack;
    a->v = t == 0 ? io->v : (const void *)(pack + x->pl.kvbytes / 2);
    a->ldk = a->ldv = (int64_t)s->Hkv * s->D;
    a->causal = s->causal;
    a->scale = s->scale;
    if (x->travel) {
        a->qpos = qpos;
        a->kpos = t == 0 ? qpos : (const int64_t *)(const void *)(pack + x->pl.kvbytes);
    } else {
        /* one run each: positions are offsets */
        pos_range(x, src, &klo, &khi);
        a->q0 = lr->pmin;
        a->k0 = klo;
    }
}

/* Host side of the end of step t: wait for it (watchdog), collect its
 * kernel time. */
static int step_done(call_t *x, int t, dt_emsg_t *em)
{
    dt_ring_t *r = x->r;
    int slot = RING_EV_COMP0 + (t & 1), rc;

    snprintf(x->what, sizeof(x->what), "%s step %d of %d", x->bwd ? "backward" : "forward",
             t + 1, x->R);
    if ((rc = dt_ring_wait(r, &slot, 1, x->what, em)) < 0)
        return rc;
    for (int l = 0; l < x->nl; l++) {
        float ms = 0;
        if (!x->lr[l].did[t & 1])
            continue;
        DT_CUDA_TRY(em, cudaEventElapsedTime(&ms, r->p[l].ev[RING_EV_TSTART0 + (t & 1)],
                                             r->p[l].ev[RING_EV_TSTOP0 + (t & 1)]));
        x->lr[l].compute_s += ms * 1e-3;
    }
    return 0;
}

/* End of the call: every stream idle; statistics. last: the step whose
 * timing pair is still unread (-1: none; the dilated path times the whole
 * compute span as compute). */
static int finish(call_t *x, int last, dt_emsg_t *em)
{
    static const int slots[] = { RING_EV_DONE, RING_EV_CDONE };
    dt_ring_t *r = x->r;
    int rc;

    for (int l = 0; l < x->nl; l++) {
        DT_CUDA_TRY(em, cudaEventRecord(r->p[l].ev[RING_EV_TEND], r->p[l].compute));
        DT_CUDA_TRY(em, cudaEventRecord(r->p[l].ev[RING_EV_DONE], r->p[l].compute));
        DT_CUDA_TRY(em, cudaEventRecord(r->p[l].ev[RING_EV_CDONE], r->p[l].comm));
    }
    snprintf(x->what, sizeof(x->what), "end of the %s", x->bwd ? "backward" : "forward");
    if ((rc = dt_ring_wait(r, slots, 2, x->what, em)) < 0)
        return rc;
    for (int l = 0; l < x->nl; l++) {
        lrank_t *lr = &x->lr[l];
        float ms = 0;
        if (last >= 0 && lr->did[last & 1]) {
            DT_CUDA_TRY(em, cudaEventElapsedTime(&ms, r->p[l].ev[RING_EV_TSTART0 + (last & 1)],
                                                 r->p[l].ev[RING_EV_TSTOP0 + (last & 1)]));
            lr->compute_s += ms * 1e-3;
        }
        DT_CUDA_TRY(em, cudaEventElapsedTime(&ms, r->p[l].ev[RING_EV_TBEGIN],
                                             r->p[l].ev[RING_EV_TEND]));
        double span = ms * 1e-3;
        if (last < 0)
            lr->compute_s = span;
        x->st.compute_s += lr->compute_s;
        x->st.wait_s += span > lr->compute_s ? span - lr->compute_s : 0.0;
    }
    return 0;
}

/* ---- dense ring ---------------------------------------------------------------- */

/* Per rank, on its compute stream: positions, the first pack, and (backward)
 * delta and zeroed gradients. */
static int dense_setup(call_t *x, int l, dt_emsg_t *em)
{
    const dt_attn_spec_t *s = x->s;
    const dt_ring_io_t *io = &x->io[l];
    ring_peer_t *p = &x->r->p[l];
    lrank_t *lr = &x->lr[l];
    cudaStream_t cs = p->compute;
    int g = dt_ring_rank(x->r, l), rc;
    const size_t half = x->pl.kvbytes / 2, cbytes = (size_t)x->c * sizeof(int64_t);
    const int64_t ldq = (int64_t)s->H * s->D;

    pos_range(x, g, &lr->pmin, &lr->pmax);
    if (x->travel) {
        lr->hpos = dt_xmallocarray((size_t)x->c, sizeof(int64_t));
        dt_layout_positions(s->layout, s->T, x->R, g, lr->hpos);
        DT_CUDA_TRY(em, cudaMemcpyAsync(lr->ws + x->pl.qpos, lr->hpos, cbytes,
                                        cudaMemcpyHostToDevice, cs));
    }
    if (x->R > 1) {
        char *pack = lr->ws + x->pl.kv[0];
        DT_CUDA_TRY(em, cudaMemcpyAsync(pack, io->k, half, cudaMemcpyDeviceToDevice, cs));
        DT_CUDA_TRY(em, cudaMemcpyAsync(pack + half, io->v, half, cudaMemcpyDeviceToDevice, cs));
        if (x->travel)
            DT_CUDA_TRY(em, cudaMemcpyAsync(pack + x->pl.kvbytes, lr->ws + x->pl.qpos, cbytes,
                                            cudaMemcpyDeviceToDevice, cs));
    }
    DT_CUDA_TRY(em, cudaEventRecord(p->ev[RING_EV_KV0], cs));
    if (x->bwd) {
        float *delta = (float *)(void *)(lr->ws + x->pl.delta);
        if ((rc = dt_attn_delta_cuda(x->c, s->H, s->D, x->dtype, io->dout, ldq, io->o, ldq, delta,
                                     x->c, cs, em)) < 0)
            return rc;
        DT_CUDA_TRY(em, cudaMemsetAsync(io->dq, 0, (size_t)x->c * ldq * sizeof(float), cs));
        if (x->R == 1) {
            size_t kvf = (size_t)x->c * s->Hkv * s->D * sizeof(float);
            DT_CUDA_TRY(em, cudaMemsetAsync(io->dk, 0, kvf, cs));
            DT_CUDA_TRY(em, cudaMemsetAsync(io->dv, 0, kvf, cs));
        } else {
            lr->gin = (float *)(void *)(lr->ws + x->pl.g[0]);
            lr->gcur = (float *)(void *)(lr->ws + x->pl.g[1]);
            lr->gout = (float *)(void *)(lr->ws + x->pl.g[2]);
        }
    }
    DT_CUDA_TRY(em, cudaEventRecord(p->ev[RING_EV_TBEGIN], cs));
    return 0;
}

/* Forward step t on every local rank. */
static int fwd_step(call_t *x, int t, dt_emsg_t *em)
{
    const dt_attn_spec_t *s = x->s;
    dt_ring_t *r = x->r;
    int cur = t & 1, rc;

    if (t < x->R - 1 && (rc = kv_exchange(x, t, em)) < 0)
        return rc;
    for (int l = 0; l < x->nl; l++) {
        ring_peer_t *p = &r->p[l];
        lrank_t *lr = &x->lr[l];
        cudaStream_t cs = p->compute;
        int g = dt_ring_rank(r, l), src = (g - t + x->R) % x->R;
        int run = !skipped(x, g, src);
        if (run) {
            dt_attn_cuda_t a;
            if (t > 0)
                DT_CUDA_TRY(em, cudaStreamWaitEvent(cs, p->ev[RING_EV_KV0 + cur], 0));
            DT_CUDA_TRY(em, cudaEventRecord(p->ev[RING_EV_TSTART0 + cur], cs));
            dense_block(x, l, t, &a);
            /* o (c, H, D) fp32, lse (H, c) fp32: the running state */
            if ((rc = dt_attn_fwd_cuda(&a, lr->any, x->io[l].o, (int64_t)s->H * s->D,
                                       x->io[l].lse, x->c, cs, em)) < 0)
                return rc;
            lr->any = 1;
            DT_CUDA_TRY(em, cudaEventRecord(p->ev[RING_EV_TSTOP0 + cur], cs));
            x->st.steps++;
        }
        lr->did[cur] = run;
        DT_CUDA_TRY(em, cudaEventRecord(p->ev[RING_EV_COMP0 + cur], cs));
    }
    return t > 0 ? step_done(x, t - 1, em) : 0;
}

/* Backward step t on every local rank. */
static int bwd_step(call_t *x, int t, dt_emsg_t *em)
{
    const dt_attn_spec_t *s = x->s;
    dt_ring_t *r = x->r;
    const int64_t ldq = (int64_t)s->H * s->D, ldk = (int64_t)s->Hkv * s->D;
    const size_t kvf = (size_t)x->c * ldk; /* floats of dK in a pack */
    int cur = t & 1, rc;

    if (t < x->R - 1 && (rc = kv_exchange(x, t, em)) < 0)
        return rc;
    if (t > 0 && (rc = grad_exchange(x, t, em)) < 0)
        return rc;
    for (int l = 0; l < x->nl; l++) {
        ring_peer_t *p = &r->p[l];
        lrank_t *lr = &x->lr[l];
        const dt_ring_io_t *io = &x->io[l];
        cudaStream_t cs = p->compute;
        int g = dt_ring_rank(r, l), src = (g - t + x->R) % x->R;
        int run = !skipped(x, g, src);
        float *dkt = io->dk, *dvt = io->dv;

        if (x->R > 1) {
            /* gcur was sent by gradient exchange t - 1 (t >= 2): that
             * transfer must have read it before it is zeroed */
            if (t >= 2)
                DT_CUDA_TRY(em, cudaStreamWaitEvent(
                                    cs, dt_ring_sent_event(r, RING_EV_G0 + ((t - 1) & 1), l), 0));
            DT_CUDA_TRY(em, cudaMemsetAsync(lr->gcur, 0, x->pl.gbytes, cs));
            dkt = lr->gcur;
            dvt = lr->gcur + kvf;
        }
        if (run) {
            dt_attn_cuda_t a;
            const float *delta = (const float *)(const void *)(lr->ws + x->pl.delta);
            dt_attn_cuda_grad_t gr = {
                .dout = io->dout, .lddo = ldq,
                .lse = io->lse, .ldlse = x->c,
                .delta = delta,
                .dq = io->dq, .lddq = ldq,
                .dk = dkt, .lddk = ldk,
                .dv = dvt, .lddv = ldk,
            };
            if (t > 0)
                DT_CUDA_TRY(em, cudaStreamWaitEvent(cs, p->ev[RING_EV_KV0 + cur], 0));
            DT_CUDA_TRY(em, cudaEventRecord(p->ev[RING_EV_TSTART0 + cur], cs));
            dense_block(x, l, t, &a);
            if ((rc = dt_attn_bwd_cuda(&a, &gr, cs, em)) < 0)
                return rc;
            DT_CUDA_TRY(em, cudaEventRecord(p->ev[RING_EV_TSTOP0 + cur], cs));
            x->st.steps++;
        }
        lr->did[cur] = run;
        DT_CUDA_TRY(em, cudaEventRecord(p->ev[RING_EV_COMP0 + cur], cs));
        if (x->R > 1) {
            if (t > 0) {
                /* the previous rank's sum for this block: (2c, Hkv, D) += */
                DT_CUDA_TRY(em, cudaStreamWaitEvent(cs, p->ev[RING_EV_G0 + cur], 0));
                if ((rc = dt_dilate_scatter_add_cuda(2 * x->c, s->Hkv, s->D, lr->gin, lr->gcur,
                                                     ldk, 0, 1, 0, cs, em)) < 0)
                    return rc;
            }
            DT_CUDA_TRY(em, cudaEventRecord(p->ev[RING_EV_ADD0 + cur], cs));
            float *tmp = lr->gout;
            lr->gout = lr->gcur;
            lr->gcur = tmp;
        }
    }
    return t > 0 ? step_done(x, t - 1, em) : 0;
}

/* Backward, R > 1: my own block's dK/dV arrive after a full turn. */
static int bwd_home(call_t *x, dt_emsg_t *em)
{
    const size_t kvbytes = x->pl.gbytes / 2, kvf = kvbytes / sizeof(float);
    int rc;

    if ((rc = grad_exchange(x, x->R, em)) < 0)
        return rc;
    for (int l = 0; l < x->nl; l++) {
        ring_peer_t *p = &x->r->p[l];
        cudaStream_t cs = p->compute;
        DT_CUDA_TRY(em, cudaStreamWaitEvent(cs, p->ev[RING_EV_G0 + (x->R & 1)], 0));
        DT_CUDA_TRY(em, cudaMemcpyAsync(x->io[l].dk, x->lr[l].gin, kvbytes,
                                        cudaMemcpyDeviceToDevice, cs));
        DT_CUDA_TRY(em, cudaMemcpyAsync(x->io[l].dv, x->lr[l].gin + kvf, kvbytes,
                                        cudaMemcpyDeviceToDevice, cs));
    }
    return 0;
}

static int dense(call_t *x, dt_emsg_t *em)
{
    int rc;

    for (int l = 0; l < x->nl; l++)
        if ((rc = dense_setup(x, l, em)) < 0)
            return rc;
    for (int t = 0; t < x->R; t++)
        if ((rc = (x->bwd ? bwd_step : fwd_step)(x, t, em)) < 0)
            return rc;
    if (x->bwd && x->R > 1 && (rc = bwd_home(x, em)) < 0)
        return rc;
    return finish(x, x->R - 1, em);
}

/* ---- dilated, every segment on one rank --------------------------------------- */

/* A head chunk runs as one dense block when its query heads map onto its
 * kv heads as the kernels' GQA rule does (query j reads kv j / (nh /
 * nkv)); otherwise one block per kv head, with the query heads reading it. */
typedef struct hblock {
    int h0, nh;   /* query heads [h0, h0 + nh) */
    int kv0, nkv; /* kv heads [kv0, kv0 + nkv) */
} hblock_t;

static int chunk_blocks(const dt_attn_spec_t *s, const dt_attn_chunk_t *ck, hblock_t *out)
{
    int g = s->H / s->Hkv, aligned = ck->nh % ck->nkv == 0;

    for (int j = 0; aligned && j < ck->nh; j++)
        aligned = (ck->hlo + j) / g - ck->kvlo == j / (ck->nh / ck->nkv);
    if (aligned) {
        out[0] = (hblock_t){ ck->hlo, ck->nh, ck->kvlo, ck->nkv };
        return 1;
    }
    for (int i = 0; i < ck->nkv; i++) {
        int kv = ck->kvlo + i, lo = kv * g, hi = (kv + 1) * g;
        lo = lo > ck->hlo ? lo : ck->hlo;
        hi = hi < ck->hlo + ck->nh ? hi : ck->hlo + ck->nh;
        out[i] = (hblock_t){ lo, hi - lo, kv, 1 };
    }
    return ck->nkv;
}

/* One head chunk of one segment on local rank l: the rows first, first +
 * step, ... (n of them) of my tensors, heads of ck. */
static int dil_chunk(call_t *x, int l, const dt_attn_chunk_t *ck, hblock_t *blk, int64_t n,
                     int64_t first, int64_t step, dt_emsg_t *em)
{
    const dt_attn_spec_t *s = x->s;
    const dt_ring_io_t *io = &x->io[l];
    const plan_t *pl = &x->pl;
    char *ws = x->lr[l].ws;
    cudaStream_t cs = x->r->p[l].compute;
    const int D = s->D, nh = ck->nh, nkv = ck->nkv;
    const int64_t ldq = (int64_t)s->H * D, ldk = (int64_t)s->Hkv * D;
    void *qg = ws + pl->qg, *kg = ws + pl->kg, *vg = ws + pl->vg, *dog = ws + pl->dog;
    float *o2 = (float *)(void *)(ws + pl->o2), *lse2 = (float *)(void *)(ws + pl->lse2);
    float *dq2 = (float *)(void *)(ws + pl->dq2), *dk2 = (float *)(void *)(ws + pl->dk2);
    float *dv2 = (float *)(void *)(ws + pl->dv2), *lseg = (float *)(void *)(ws + pl->lseg);
    float *deltag = (float *)(void *)(ws + pl->deltag);
    const float *delta = (const float *)(const void *)(ws + pl->delta);
    int nb = chunk_blocks(s, ck, blk), rc;

    /* q (n, nh, D), k and v (n, nkv, D) of this chunk, dense */
    if ((rc = dt_dilate_gather_cuda(x->dtype, n, nh, D, io->q, ldq, first, step, ck->hlo, qg, cs,
                                    em)) < 0 ||
        (rc = dt_dilate_gather_cuda(x->dtype, n, nkv, D, io->k, ldk, first, step, ck->kvlo, kg, cs,
                                    em)) < 0 ||
        (rc = dt_dilate_gather_cuda(x->dtype, n, nkv, D, io->v, ldk, first, step, ck->kvlo, vg, cs,
                                    em)) < 0)
        return rc;
    if (x->bwd) {
        if ((rc = dt_dilate_gather_cuda(x->dtype, n, nh, D, io->dout, ldq, first, step, ck->hlo,
                                        dog, cs, em)) < 0 ||
            (rc = dt_dilate_gather_rows_cuda(n, nh, io->lse, x->c, first, step, ck->hlo, lseg, cs,
                                             em)) < 0 ||
            (rc = dt_dilate_gather_rows_cuda(n, nh, delta, x->c, first, step, ck->hlo, deltag, cs,
                                             em)) < 0)
            return rc;
        DT_CUDA_TRY(em, cudaMemsetAsync(dq2, 0, (size_t)n * nh * D * sizeof(float), cs));
        DT_CUDA_TRY(em, cudaMemsetAsync(dk2, 0, (size_t)n * nkv * D * sizeof(float), cs));
        DT_CUDA_TRY(em, cudaMemsetAsync(dv2, 0, (size_t)n * nkv * D * sizeof(float), cs));
    }
    for (int i = 0; i < nb; i++) {
        const int64_t qo = (int64_t)(blk[i].h0 - ck->hlo) * D, ko = (int64_t)(blk[i].kv0 - ck->kvlo) * D;
        const int64_t lo = (int64_t)(blk[i].h0 - ck->hlo) * n;
        dt_attn_cuda_t a = {
            .tq = n, .tk = n, .h = blk[i].nh, .hkv = blk[i].nkv, .d = D, .dtype = x->dtype,
            .q = (const char *)qg + qo * (int64_t)x->esz, .ldq = (int64_t)nh * D,
            .k = (const char *)kg + ko * (int64_t)x->esz, .ldk = (int64_t)nkv * D,
            .v = (const char *)vg + ko * (int64_t)x->esz, .ldv = (int64_t)nkv * D,
            /* positions inside the compressed segment ascend with the row */
            .causal = s->causal, .q0 = 0, .k0 = 0, .qpos = NULL, .kpos = NULL,
            .scale = s->scale,
        };
        if (!x->bwd) {
            rc = dt_attn_fwd_cuda(&a, 0, o2 + qo, (int64_t)nh * D, lse2 + lo, n, cs, em);
        } else {
            dt_attn_cuda_grad_t gr = {
                .dout = (const char *)dog + qo * (int64_t)x->esz, .lddo = (int64_t)nh * D,
                .lse = lseg + lo, .ldlse = n, .delta = deltag + lo,
                .dq = dq2 + qo, .lddq = (int64_t)nh * D,
                .dk = dk2 + ko, .lddk = (int64_t)nkv * D,
                .dv = dv2 + ko, .lddv = (int64_t)nkv * D,
            };
            rc = dt_attn_bwd_cuda(&a, &gr, cs, em);
        }
        if (rc < 0)
            return rc;
    }
    x->st.steps++;
    if (!x->bwd)
        return dt_dilate_merge_cuda(n, nh, D, o2, lse2, io->o, ldq, io->lse, x->c, first, step,
                                    ck->hlo, cs, em);
    if ((rc = dt_dilate_scatter_add_cuda(n, nh, D, dq2, io->dq, ldq, first, step, ck->hlo, cs,
                                         em)) < 0 ||
        (rc = dt_dilate_scatter_add_cuda(n, nkv, D, dk2, io->dk, ldk, first, step, ck->kvlo, cs,
                                         em)) < 0)
        return rc;
    return dt_dilate_scatter_add_cuda(n, nkv, D, dv2, io->dv, ldk, first, step, ck->kvlo, cs, em);
}

/* Branch b on local rank l: every segment of my runs (each inside one run),
 * every head chunk. */
static int dil_branch(call_t *x, int l, int b, hblock_t *blk, dt_emsg_t *em)
{
    const dt_attn_spec_t *s = x->s;
    dt_attn_branch_t br = dt_attn_branch(s, b);
    dt_run_t runs[DT_LAYOUT_MAXRUNS];
    int nr = dt_layout_runs(s->layout, s->T, x->R, dt_ring_rank(x->r, l), runs), rc;
    int64_t off = 0; /* local row of the run's first position */

    for (int i = 0; i < nr; i++) {
        int64_t end = runs[i].start + runs[i].len;
        for (int64_t a = runs[i].start; a < end; a += br.w) {
            int64_t e = a + br.w < end ? a + br.w : end;
            for (int k = 0; k < br.nchunk; k++) {
                dt_attn_chunk_t ck = dt_attn_chunk(s, &br, k);
                int64_t n = e - a > k ? (e - a - k + br.r - 1) / br.r : 0;
                if (n == 0)
                    continue;
                if ((rc = dil_chunk(x, l, &ck, blk, n, off + (a - runs[i].start) + k, br.r,
                                    em)) < 0)
                    return rc;
            }
        }
        off += runs[i].len;
    }
    return 0;
}

/* Per rank: forward o = 0, lse = -inf (a (position, head) no branch covers
 * keeps them); backward delta and zeroed gradients. */
static int dil_setup(call_t *x, int l, dt_emsg_t *em)
{
    const dt_attn_spec_t *s = x->s;
    const dt_ring_io_t *io = &x->io[l];
    ring_peer_t *p = &x->r->p[l];
    cudaStream_t cs = p->compute;
    const int64_t ldq = (int64_t)s->H * s->D;
    const size_t row = (size_t)x->c * sizeof(float);
    int rc;

    if (!x->bwd) {
        DT_CUDA_TRY(em, cudaMemsetAsync(io->o, 0, (size_t)x->c * ldq * sizeof(float), cs));
        /* lse (H, c): head 0 from the host, then doubling copies */
        DT_CUDA_TRY(em, cudaMemcpyAsync(io->lse, x->hinf, row, cudaMemcpyHostToDevice, cs));
        for (int h = 1; h < s->H;) {
            int m = h < s->H - h ? h : s->H - h;
            DT_CUDA_TRY(em, cudaMemcpyAsync(io->lse + (size_t)h * x->c, io->lse, (size_t)m * row,
                                            cudaMemcpyDeviceToDevice, cs));
            h += m;
        }
    } else {
        float *delta = (float *)(void *)(x->lr[l].ws + x->pl.delta);
        size_t kvf = (size_t)x->c * s->Hkv * s->D * sizeof(float);
        if ((rc = dt_attn_delta_cuda(x->c, s->H, s->D, x->dtype, io->dout, ldq, io->o, ldq, delta,
                                     x->c, cs, em)) < 0)
            return rc;
        DT_CUDA_TRY(em, cudaMemsetAsync(io->dq, 0, (size_t)x->c * ldq * sizeof(float), cs));
        DT_CUDA_TRY(em, cudaMemsetAsync(io->dk, 0, kvf, cs));
        DT_CUDA_TRY(em, cudaMemsetAsync(io->dv, 0, kvf, cs));
    }
    DT_CUDA_TRY(em, cudaEventRecord(p->ev[RING_EV_TBEGIN], cs));
    return 0;
}

static int dilated(call_t *x, dt_emsg_t *em)
{
    hblock_t *blk = dt_xcalloc((size_t)x->s->Hkv, sizeof(*blk));
    int rc = 0;

    if (!x->bwd) {
        x->hinf = dt_xmallocarray((size_t)x->c, sizeof(float));
        for (int64_t i = 0; i < x->c; i++)
            x->hinf[i] = -INFINITY;
    }
    for (int l = 0; l < x->nl && rc == 0; l++)
        rc = dil_setup(x, l, em);
    for (int b = 0; b < x->s->nbranch && rc == 0; b++) {
        int slot = RING_EV_COMP0 + (b & 1);
        for (int l = 0; l < x->nl && rc == 0; l++) {
            cudaError_t e;
            if ((rc = dil_branch(x, l, b, blk, em)) < 0)
                break;
            if ((e = cudaEventRecord(x->r->p[l].ev[slot], x->r->p[l].compute)) != cudaSuccess)
                rc = dt_cuda_err(em, e, "cudaEventRecord(COMP)", __FILE__, __LINE__);
        }
        /* keep the host at most one branch ahead, under the watchdog */
        if (rc == 0 && b > 0) {
            int prev = RING_EV_COMP0 + ((b - 1) & 1);
            snprintf(x->what, sizeof(x->what), "dilated branch %d of %d", b, x->s->nbranch);
            rc = dt_ring_wait(x->r, &prev, 1, x->what, em);
        }
    }
    free(blk);
    return rc < 0 ? rc : finish(x, -1, em);
}

/* ---- entry points ------------------------------------------------------------- */

static int run(dt_ring_t *r, const dt_attn_spec_t *s, dt_dtype_t dtype, dt_ring_io_t *io,
               int bwd, dt_attn_stats_t *st, dt_emsg_t *em)
{
    double t0 = dt_clock_now();
    dt_emsg_t local;
    call_t x;
    int rc;

    if (em == NULL)
        em = &local;
    if (st != NULL)
        memset(st, 0, sizeof(*st));
    if ((rc = dt_ring_enter(r, em)) < 0)
        return rc;
    if ((rc = check_call(r, s, dtype, io, bwd, em)) < 0)
        return rc;

    memset(&x, 0, sizeof(x));
    x.r = r;
    x.s = s;
    x.io = io;
    x.dtype = dtype;
    x.esz = dt_dtype_size(dtype);
    x.R = r->R;
    x.nl = r->nlocal;
    x.bwd = bwd;
    x.travel = s->nbranch == 0 && positions_travel(s, r->R);
    x.c = dt_layout_local(s->T, r->R);
    make_plan(s, dtype, r->R, bwd, &x.pl);
    x.lr = dt_xcalloc((size_t)x.nl, sizeof(*x.lr));
    x.send = dt_xcalloc((size_t)x.nl, sizeof(*x.send));
    x.recv = dt_xcalloc((size_t)x.nl, sizeof(*x.recv));

    /* from here every rank of the ring is inside this call: a failure
     * leaves an NCCL ring dead so that no peer waits on a transfer */
    for (int l = 0; l < x.nl && rc == 0; l++) {
        void *ws = NULL;
        rc = dt_ring_ws(r, l, x.pl.total, &ws, em);
        x.lr[l].ws = ws;
    }
    if (rc == 0)
        rc = s->nbranch == 0 ? dense(&x, em) : dilated(&x, em);
    if (rc < 0)
        dt_ring_drain(r, 1, em);

    for (int l = 0; l < x.nl; l++)
        free(x.lr[l].hpos);
    free(x.hinf);
    free(x.recv);
    free(x.send);
    free(x.lr);
    x.st.total_s = dt_clock_now() - t0;
    if (st != NULL)
        *st = x.st;
    return rc;
}

int dt_ring_attn_fwd(dt_ring_t *r, const dt_attn_spec_t *s, dt_dtype_t dtype, dt_ring_io_t *io,
                     dt_attn_stats_t *st, dt_emsg_t *em)
{
    return run(r, s, dtype, io, 0, st, em);
}

int dt_ring_attn_bwd(dt_ring_t *r, const dt_attn_spec_t *s, dt_dtype_t dtype, dt_ring_io_t *io,
                     dt_attn_stats_t *st, dt_emsg_t *em)
{
    return run(r, s, dtype, io, 1, st, em);
}
