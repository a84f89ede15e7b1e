/* SPDX-License-Identifier: MIT
 *
 * Exact ring attention on GPUs, forward and backward (contract in
 * engine/attn/ring_cuda.h): the dense ring, and the entry points, which
 * run it or dilated attention (dilated_cuda.c). The schedule of
 * engine/attn/attn.c, with CUDA streams and events instead of MPI
 * requests, over the transports of comm_nccl.c.
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
 *
 * Events (enum ring_ev, the dilated sub-rings' too; "p" is a step parity,
 * "b" a K/V buffer):
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
 * Not here: dilated attention (dilated_cuda.c), the workspace plan and
 * the call's end (ring_call.c), the transports and the watchdog
 * (comm_nccl.c), the kernels (kernels/cuda), the PMIx wire-up
 * (ring_pmix.c).
 */
#include "config.h"

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/clock.h"
#include "common/log.h"
#include "common/mem.h"
#include "spec/layout.h"
#include "spec/mask.h"
#include "engine/attn/attn_block.h"
#include "engine/attn/dilated_cuda.h"
#include "engine/attn/ring_call.h"
#include "engine/attn/ring_cuda.h"
#include "engine/comm/ring_impl.h"
#include "kernels/cuda/cuda_err.h"
#include "kernels/cuda/layers_cuda.h"

/* ---- ranks and positions -------------------------------------------------------- */

static void pos_range(const call_t *x, int rank, int64_t *lo, int64_t *hi)
{
    dt_run_t runs[DT_LAYOUT_MAXRUNS];
    int n = dt_layout_runs(x->s->layout, x->s->T, x->R, rank, runs);

    *lo = runs[0].start;
    *hi = runs[n - 1].start + runs[n - 1].len - 1;
}

/* The rank local rank l sends to in the dense ring. */
static int next_rank(const call_t *x, int l)
{
    return (dt_ring_rank(x->r, l) + 1) % x->R;
}

/* No pair of rank g's queries and rank src's keys is attended: causal and
 * every key after every query, or the mask's boxes over their runs all
 * empty. */
static int skipped(const call_t *x, int g, int src)
{
    int64_t qlo, qhi, klo, khi;

    if (dt_ring_call_masked(x->s)) {
        dt_run_t qr[DT_LAYOUT_MAXRUNS], kr[DT_LAYOUT_MAXRUNS];
        int nq = dt_layout_runs(x->s->layout, x->s->T, x->R, g, qr);
        int nk = dt_layout_runs(x->s->layout, x->s->T, x->R, src, kr);
        for (int a = 0; a < nq; a++)
            for (int b = 0; b < nk; b++)
                if (dt_mask_box(x->s->mask, 0, qr[a].start, qr[a].start + qr[a].len - 1,
                                kr[b].start, kr[b].start + kr[b].len - 1) != DT_MASK_EMPTY)
                    return 0;
        return 1;
    }
    if (!x->s->causal)
        return 0;
    pos_range(x, g, &qlo, &qhi);
    pos_range(x, src, &klo, &khi);
    return klo > qhi;
}

/* ---- validation ------------------------------------------------------------- */

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
    if (s->mask != NULL && !dt_mask_is_plain(s->mask) &&
        (s->nbranch > 0 || (s->mask->block > 0 && s->mask->nhead > 1)))
        return dt_emsg_set(em, DT_ENOTSUP, "ring attention: %s on the GPU (documents, "
                           "windows and one block pattern for every head run; run this on "
                           "device = cpu)",
                           s->nbranch > 0 ? "masks with dilated branches do not run yet"
                                          : "a block pattern per head does not run yet");
    if (s->layout == DT_LAYOUT_BALANCED && r->R > 1)
        return dt_emsg_set(em, DT_ENOTSUP, "ring attention: layout balanced does not run on "
                           "the GPU (contiguous or zigzag)");
    if (s->D != 64 && s->D != 128)
        return dt_emsg_set(em, DT_ESHAPE,
                           "ring attention: head dimension D=%d (the CUDA kernels take 64 or 128)",
                           s->D);
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
            DT_CUDA_TRY(em, cudaStreamWaitEvent(
                                cs, dt_ring_sent_event(r, RING_EV_KV0 + cur, l, next_rank(x, l)), 0));
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
    if (dt_ring_call_masked(s)) {
        a->qlo = (const int64_t *)(const void *)(lr->ws + x->pl.ilo);
        a->qhi = a->qlo + x->c;
    }
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

/* ---- block patterns: a launch per (query rows, key rows) the pattern allows -------- */

/* The local rows of rank r at positions [p0, p1), as pieces (at most one
 * per run): rows[k] = {first row, count, first position}; returns their
 * number. */
static int rows_at(const call_t *x, int r, int64_t p0, int64_t p1, int64_t rows[][3])
{
    dt_run_t runs[DT_LAYOUT_MAXRUNS];
    int n = dt_layout_runs(x->s->layout, x->s->T, x->R, r, runs), k = 0;
    int64_t off = 0;

    for (int i = 0; i < n; off += runs[i].len, i++) {
        int64_t a = runs[i].start > p0 ? runs[i].start : p0;
        int64_t b = runs[i].start + runs[i].len < p1 ? runs[i].start + runs[i].len : p1;
        if (a < b) {
            rows[k][0] = off + (a - runs[i].start);
            rows[k][1] = b - a;
            rows[k][2] = a;
            k++;
        }
    }
    return k;
}

/* a with query rows [r0, r0 + nq) and key rows [k0, k0 + nk) of the block */
static dt_attn_cuda_t sub_args(const call_t *x, const dt_attn_cuda_t *a, int64_t r0, int64_t nq,
                               int64_t k0, int64_t nk)
{
    dt_attn_cuda_t b = *a;

    b.tq = nq;
    b.tk = nk;
    b.q = (const char *)a->q + r0 * a->ldq * (int64_t)x->esz;
    b.k = (const char *)a->k + k0 * a->ldk * (int64_t)x->esz;
    b.v = (const char *)a->v + k0 * a->ldv * (int64_t)x->esz;
    b.q0 = a->q0 + r0;
    b.k0 = a->k0 + k0;
    b.qpos = a->qpos ? a->qpos + r0 : NULL;
    b.kpos = a->kpos ? a->kpos + k0 : NULL;
    b.qlo = a->qlo ? a->qlo + r0 : NULL;
    b.qhi = a->qhi ? a->qhi + r0 : NULL;
    return b;
}

/* The launches of step t of local rank l under a block pattern (every
 * head's): for each query block of the pattern my rows hold, each run of
 * the key blocks it allows that rank src holds; forward accumulates into
 * (o, lse), backward adds into dq and the block's dK/dV (g NULL:
 * forward). Positions are the sequence's, so causality and the mask's
 * intervals cut inside a launch as in the whole block. */
static int pattern_block(const call_t *x, int l, int t, const dt_attn_cuda_t *a,
                         const dt_attn_cuda_grad_t *g, cudaStream_t cs, dt_emsg_t *em)
{
    const dt_attn_spec_t *s = x->s;
    const dt_mask_t *m = s->mask;
    const int64_t B = m->block, ldq = (int64_t)s->H * s->D;
    int me = dt_ring_rank(x->r, l), src = (me - t + x->R) % x->R, rc;
    int64_t qr[DT_LAYOUT_MAXRUNS][3], kr[DT_LAYOUT_MAXRUNS][3];

    for (int64_t qa = 0; qa < m->nb; qa++) {
        int nq = rows_at(x, me, qa * B, (qa + 1) * B, qr);
        if (nq == 0)
            continue;
        const int64_t *c0 = m->cols + m->rowptr[qa], *c1 = m->cols + m->rowptr[qa + 1];
        for (const int64_t *cb = c0; cb < c1;) {
            const int64_t *ce = cb + 1; /* a run of consecutive key blocks */
            while (ce < c1 && *ce == ce[-1] + 1)
                ce++;
            int nk = rows_at(x, src, *cb * B, (ce[-1] + 1) * B, kr);
            cb = ce;
            for (int i = 0; i < nq; i++)
                for (int j = 0; j < nk; j++) {
                    if (dt_mask_box(m, 0, qr[i][2], qr[i][2] + qr[i][1] - 1, kr[j][2],
                                    kr[j][2] + kr[j][1] - 1) == DT_MASK_EMPTY)
                        continue; /* causality or the intervals leave it nothing */
                    dt_attn_cuda_t b = sub_args(x, a, qr[i][0], qr[i][1], kr[j][0], kr[j][1]);
                    int64_t r0 = qr[i][0], k0 = kr[j][0];
                    if (g == NULL) {
                        rc = dt_attn_fwd_cuda(&b, 1, x->io[l].o + r0 * ldq, ldq,
                                              x->io[l].lse + r0, x->c, cs, em);
                    } else {
                        dt_attn_cuda_grad_t h = *g;
                        h.dout = (const char *)g->dout + r0 * g->lddo * (int64_t)x->esz;
                        h.lse = g->lse + r0;
                        h.delta = g->delta + r0;
                        h.dq = g->dq + r0 * g->lddq;
                        h.dk = g->dk + k0 * g->lddk;
                        h.dv = g->dv + k0 * g->lddv;
                        rc = dt_attn_bwd_cuda(&b, &h, cs, em);
                    }
                    if (rc < 0)
                        return rc;
                }
        }
    }
    return 0;
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
    if (dt_ring_call_masked(s)) {
        /* the mask as each of my rows' interval of key positions */
        int64_t *pos = dt_xmallocarray((size_t)x->c, sizeof(int64_t));
        lr->hiv = dt_xmallocarray(2 * (size_t)x->c, sizeof(int64_t));
        dt_layout_positions(s->layout, s->T, x->R, g, pos);
        for (int64_t i = 0; i < x->c; i++)
            dt_mask_row(s->mask, pos[i], &lr->hiv[i], &lr->hiv[x->c + i]);
        free(pos);
        DT_CUDA_TRY(em, cudaMemcpyAsync(lr->ws + x->pl.ilo, lr->hiv, 2 * cbytes,
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
    if (!x->bwd && x->blocks) {
        /* the pattern's launches each cover some rows: every row starts
         * empty and all of them accumulate */
        if ((rc = dt_ring_call_empty(x, l, em)) < 0)
            return rc;
        lr->any = 1;
    }
    if (x->bwd) {
        float *delta = (float *)(void *)(lr->ws + x->pl.delta);
        if ((rc = dt_attn_delta_cuda(x->c, s->H, s->D, x->dtype, io->dout, ldq, io->o, ldq, delta,
                                     x->c, cs, em)) < 0)
            return rc;
        /* cuDNN's backward reads o, in dtype: a copy, as dq may be o */
        if (lr->blk.cudnn && (rc = dt_cast_from_f32_cuda(x->dtype, x->c * ldq, io->o,
                                                         lr->ws + x->pl.ohalf, cs, em)) < 0)
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
            dt_run_t qr[DT_LAYOUT_MAXRUNS], kr[DT_LAYOUT_MAXRUNS];
            int nq = dt_layout_runs(s->layout, s->T, x->R, g, qr);
            int nk = dt_layout_runs(s->layout, s->T, x->R, src, kr);
            if (x->blocks)
                rc = pattern_block(x, l, t, &a, NULL, cs, em);
            else
                rc = dt_attn_block_fwd(&lr->blk, &a, qr, nq, kr, nk, lr->any, x->io[l].o,
                                       (int64_t)s->H * s->D, x->io[l].lse, x->c, cs, em);
            if (rc < 0)
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
                                    cs, dt_ring_sent_event(r, RING_EV_G0 + ((t - 1) & 1), l, next_rank(x, l)), 0));
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
            dt_run_t qr[DT_LAYOUT_MAXRUNS], kr[DT_LAYOUT_MAXRUNS];
            int nq = dt_layout_runs(s->layout, s->T, x->R, g, qr);
            int nk = dt_layout_runs(s->layout, s->T, x->R, src, kr);
            if ((rc = x->blocks ? pattern_block(x, l, t, &a, &gr, cs, em)
                                : dt_attn_block_bwd(&lr->blk, &a, qr, nq, kr, nk, &gr, cs,
                                                    em)) < 0)
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
    return dt_ring_call_finish(x, x->R - 1, em);
}

/* ---- entry points ------------------------------------------------------------- */

/* The block scratch of one rank: 0 unless blocks go through cuDNN. */
static int blk_bytes(const dt_attn_spec_t *s, dt_dtype_t dtype, int R, int bwd, size_t *bytes,
                     dt_emsg_t *em)
{
    static int said[2]; /* the kernel is named once per process (and once for masks) */
    char name[256];
    /* the backward through cuDNN deterministic unless the spec says
     * deterministic = no (s->nondet) */
    dt_attn_blk_t b = { .det = !s->nondet };
    int64_t rows = dt_ring_call_rows(s, R);
    int masked = dt_ring_call_masked(s);

    *bytes = 0;
    b.cudnn = dt_attn_block_cudnn(name, sizeof(name));
    if (!said[masked]) {
        said[masked] = 1;
        if (masked && b.cudnn)
            dt_log_info("gpu attn_kernel=dt (masks: their intervals run on dt's kernels)");
        else
            dt_log_info("gpu attn_kernel=%s%s", name,
                        b.cudnn && b.det ? " deterministic" : b.cudnn ? " nondeterministic" : "");
    }
    if (masked || !b.cudnn)
        return 0;
    return dt_attn_block_bytes(&b, rows, rows, s->H, s->Hkv, s->D, dtype, (int64_t)s->H * s->D,
                               bwd, bytes, em);
}

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
    x.travel = s->nbranch == 0 && dt_ring_call_travel(s, r->R);
    /* a block pattern: a launch per (query rows, key rows) it allows */
    x.blocks = dt_ring_call_masked(s) && s->mask->block > 0;
    x.c = dt_layout_local(s->T, r->R);
    size_t blk = 0;
    if ((rc = blk_bytes(s, dtype, r->R, bwd, &blk, em)) < 0)
        return rc;
    dt_ring_call_plan(s, dtype, r->R, bwd, blk, &x.pl);
    x.lr = dt_xcalloc((size_t)x.nl, sizeof(*x.lr));
    x.send = dt_xcalloc((size_t)x.nl, sizeof(*x.send));
    x.recv = dt_xcalloc((size_t)x.nl, sizeof(*x.recv));

    /* from here every rank of the ring is inside this call: a failure
     * leaves an NCCL ring dead so that no peer waits on a transfer */
    for (int l = 0; l < x.nl && rc == 0; l++) {
        void *ws = NULL;
        /* growing frees the old workspace (cudaFree waits for the device):
         * the caller's inputs first, as they are not waited for otherwise */
        if (io[l].ready != NULL && x.pl.total > r->p[l].wsbytes) {
            cudaError_t e = cudaEventSynchronize(io[l].ready);
            if (e != cudaSuccess) {
                rc = dt_cuda_err(em, e, "cudaEventSynchronize(io[l].ready)", __FILE__, __LINE__);
                break;
            }
        }
        rc = dt_ring_ws(r, l, x.pl.total, &ws, em);
        x.lr[l].ws = ws;
        x.lr[l].blk = (dt_attn_blk_t){
            .cudnn = blk > 0, .det = !s->nondet, .ws = x.lr[l].ws + x.pl.blk,
            .bytes = x.pl.blkbytes,
            .ohalf = bwd && blk > 0 && s->nbranch == 0 ? x.lr[l].ws + x.pl.ohalf : NULL,
        };
    }
    /* the caller's inputs, made on its stream: the compute streams wait */
    for (int l = 0; l < x.nl && rc == 0; l++)
        if (io[l].ready != NULL)
            DT_CUDA_GOTO(em, rc, ran, cudaStreamWaitEvent(r->p[l].compute, io[l].ready, 0));
    if (rc == 0)
        rc = s->nbranch == 0 ? dense(&x, em) : dt_dilated_run(&x, em);
ran:
    if (rc < 0)
        dt_ring_drain(r, 1, em);

    for (int l = 0; l < x.nl; l++) {
        x.st.pieces_cudnn += x.lr[l].blk.pieces_cudnn;
        x.st.pieces_dt += x.lr[l].blk.pieces_dt;
        free(x.lr[l].hpos);
        free(x.lr[l].hiv);
        free(x.lr[l].qb);
    }
    free(x.hinf);
    free(x.xf);
    free(x.recv);
    free(x.send);
    free(x.lr);
    x.st.total_s = dt_clock_now() - t0;
    if (st != NULL)
        *st = x.st;
    return rc;
}

int dt_ring_attn_reserve(dt_ring_t *r, const dt_attn_spec_t *s, dt_dtype_t dtype,
                         dt_emsg_t *em)
{
    plan_t pf, pb;
    size_t bf = 0, bb = 0;
    int rc;

    if ((rc = dt_ring_enter(r, em)) < 0)
        return rc;
    if ((rc = blk_bytes(s, dtype, r->R, 0, &bf, em)) < 0 ||
        (rc = blk_bytes(s, dtype, r->R, 1, &bb, em)) < 0)
        return rc;
    dt_ring_call_plan(s, dtype, r->R, 0, bf, &pf);
    dt_ring_call_plan(s, dtype, r->R, 1, bb, &pb);
    for (int l = 0; l < r->nlocal; l++) {
        void *ws = NULL;
        if ((rc = dt_ring_ws(r, l, pf.total > pb.total ? pf.total : pb.total, &ws, em)) < 0)
            return rc;
    }
    return 0;
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
