/* SPDX-License-Identifier: MIT
 *
 * Dilated attention on GPUs (LongNet branches, any segment length and
 * dilation), forward and backward (contract in engine/attn/ring_cuda.h,
 * entered through dt_dilated_run from ring_cuda.c):
 *
 * Per branch, every segment [a, a + w) in ascending order; the ranks
 * holding rows of it (its members, ascending) form a sub-ring of g. Each
 * member gathers its query rows per (head chunk, piece: the part in one of
 * its runs) and packs its K/V rows per chunk [K | V]; the packs travel
 * around the sub-ring exactly as the dense ring's (g steps, the dK/dV sums
 * one step behind and home after g), and every member runs its query
 * pieces against the key pieces of the pack it holds, with positions as
 * offsets in the chunk's compressed sequence. At the end (o2, lse2) merge
 * into (o, lse) by LSE, dq and dK/dV scatter-add. g = 1 is local work with
 * no exchange. Sizes of packs differ per member: the exchanges are
 * dt_ring_xchgv's, with pairwise sizes. A sub-ring of two or more ends
 * with the host waiting for its members' streams, so the next segment
 * reuses every buffer and event without further ordering; ascending
 * segments on every rank keep NCCL free of deadlock (the lowest unfinished
 * segment has all its members).
 *
 * The packs use the dense ring's events and waits (ring_cuda.c), per
 * sub-ring.
 *
 * Not here: the dense ring and the entry points (ring_cuda.c), the
 * workspace plan and the call's end (ring_call.c), the kernels (gather,
 * blocks, merge by LSE, scatter-add: kernels/cuda).
 */
#include "config.h"

#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/mem.h"
#include "spec/layout.h"
#include "engine/attn/attn_block.h"
#include "engine/attn/dilated_cuda.h"
#include "engine/attn/ring_call.h"
#include "kernels/cuda/cuda_err.h"
#include "kernels/cuda/layers_cuda.h"

/* Rows of one member of a segment for one head chunk k, one piece per run
 * of the member that the segment meets: rows row, row + r, ... (n of them)
 * of the member's tensors, holding positions a + k + r * idx, a + k +
 * r * (idx + 1), ... of the segment [a, e); idx indexes the chunk's
 * compressed sequence, which causal masking compares. */
typedef struct piece {
    int64_t row, idx, n;
} piece_t;

/* A query block of mine in a segment: a piece of chunk k, with its offsets
 * in the qg/o2/dog/dq2 (elements) and lse2/lseg/deltag (floats) regions;
 * any: a key block has been accumulated into its (o2, lse2). */
typedef struct qblk {
    int k, any;
    piece_t pc;
    size_t qoff, loff;
} qblk_t;

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

/* A member of a segment's group: its pieces per head chunk, and its K/V
 * pack: per chunk k, K (n[k], nkv, D) at element off[k], then V (n[k],
 * nkv, D), pieces in ascending position order. Its dK/dV travel in the
 * same layout in fp32. */
typedef struct gmember {
    int rank;
    piece_t *pc;  /* [nchunk][DT_LAYOUT_MAXRUNS] */
    int *npc;     /* [nchunk] pieces */
    int64_t *n;   /* [nchunk] rows */
    size_t *off;  /* [nchunk] */
    size_t elems; /* of the pack */
} gmember_t;

/* The ranks holding rows of segment [a, e) of a branch, ascending; they
 * form a ring of g. A rank whose runs meet the segment but hold no row at
 * any chunk's offset is not a member (it would exchange empty packs). */
typedef struct group {
    int b; /* branch index */
    dt_attn_branch_t br;
    int64_t a, e;
    int g;
    gmember_t *m; /* [R] */
    int *me;      /* [nl] member index of local rank l, or -1 */
    hblock_t *blk; /* [Hkv] scratch of chunk_blocks */
} group_t;

static void group_init(const call_t *x, int b, group_t *gr)
{
    const int nchunk = dt_attn_branch(x->s, b).nchunk;

    memset(gr, 0, sizeof(*gr));
    gr->b = b;
    gr->br = dt_attn_branch(x->s, b);
    gr->m = dt_xcalloc((size_t)x->R, sizeof(*gr->m));
    for (int q = 0; q < x->R; q++) {
        gmember_t *m = &gr->m[q];
        m->pc = dt_xcalloc((size_t)nchunk * DT_LAYOUT_MAXRUNS, sizeof(*m->pc));
        m->npc = dt_xcalloc((size_t)nchunk, sizeof(*m->npc));
        m->n = dt_xcalloc((size_t)nchunk, sizeof(*m->n));
        m->off = dt_xcalloc((size_t)nchunk, sizeof(*m->off));
    }
    gr->me = dt_xcalloc((size_t)x->nl, sizeof(*gr->me));
    gr->blk = dt_xcalloc((size_t)x->s->Hkv, sizeof(*gr->blk));
}

static void group_close(const call_t *x, group_t *gr)
{
    for (int q = 0; q < x->R; q++) {
        free(gr->m[q].pc);
        free(gr->m[q].npc);
        free(gr->m[q].n);
        free(gr->m[q].off);
    }
    free(gr->m);
    free(gr->me);
    free(gr->blk);
}

/* Rank `rank`'s rows of the segment into m; 0 when it has none. */
static int member_fill(const call_t *x, const group_t *gr, int rank, gmember_t *m)
{
    const dt_attn_spec_t *s = x->s;
    const dt_attn_branch_t *br = &gr->br;
    dt_run_t runs[DT_LAYOUT_MAXRUNS];
    int nr = dt_layout_runs(s->layout, s->T, x->R, rank, runs);
    int64_t row0 = 0; /* local row of the run's first position */
    size_t el = 0;

    m->rank = rank;
    for (int k = 0; k < br->nchunk; k++)
        m->npc[k] = 0, m->n[k] = 0;
    for (int i = 0; i < nr; i++) {
        int64_t end = runs[i].start + runs[i].len;
        int64_t lo = runs[i].start > gr->a ? runs[i].start : gr->a;
        int64_t hi = end < gr->e ? end : gr->e;
        for (int k = 0; lo < hi && k < br->nchunk; k++) {
            /* the first position >= lo at offset k of the segment */
            int64_t p0 = lo + ((gr->a + k - lo) % br->r + br->r) % br->r;
            if (p0 >= hi)
                continue;
            piece_t *pc = &m->pc[k * DT_LAYOUT_MAXRUNS + m->npc[k]++];
            pc->row = row0 + (p0 - runs[i].start);
            pc->idx = (p0 - gr->a - k) / br->r;
            pc->n = (hi - 1 - p0) / br->r + 1;
            m->n[k] += pc->n;
        }
        row0 += runs[i].len;
    }
    for (int k = 0; k < br->nchunk; k++) {
        m->off[k] = el;
        el += 2 * (size_t)m->n[k] * (size_t)dt_attn_chunk(s, br, k).nkv * (size_t)s->D;
    }
    m->elems = el;
    return el > 0;
}

/* The group of segment [a, e); the number of local ranks in it. */
static int group_fill(const call_t *x, group_t *gr, int64_t a, int64_t e)
{
    int mine = 0;

    gr->a = a;
    gr->e = e;
    gr->g = 0;
    for (int q = 0; q < x->R; q++)
        if (member_fill(x, gr, q, &gr->m[gr->g]))
            gr->g++;
    for (int l = 0; l < x->nl; l++) {
        gr->me[l] = -1;
        for (int i = 0; i < gr->g; i++)
            if (gr->m[i].rank == dt_ring_rank(x->r, l)) {
                gr->me[l] = i;
                mine++;
            }
    }
    return mine;
}

/* Member index i - t around a ring of g. */
static int member_back(int i, int t, int g)
{
    return ((i - t) % g + g) % g;
}

/* Local rank l at the start of a segment, on its compute stream: my rows
 * gathered per (chunk, piece) into query blocks, my K/V packed into kv[0]
 * (event KV0). */
static int seg_setup(call_t *x, const group_t *gr, int l, dt_emsg_t *em)
{
    const dt_attn_spec_t *s = x->s;
    const dt_ring_io_t *io = &x->io[l];
    const gmember_t *m = &gr->m[gr->me[l]];
    const plan_t *pl = &x->pl;
    lrank_t *lr = &x->lr[l];
    char *ws = lr->ws, *pack = ws + pl->kv[0];
    cudaStream_t cs = x->r->p[l].compute;
    const int D = s->D;
    const int64_t ldq = (int64_t)s->H * D, ldk = (int64_t)s->Hkv * D, r = gr->br.r;
    const float *delta = (const float *)(const void *)(ws + pl->delta);
    size_t qoff = 0, loff = 0;
    int rc;

    lr->nqb = 0;
    for (int k = 0; k < gr->br.nchunk; k++) {
        dt_attn_chunk_t ck = dt_attn_chunk(s, &gr->br, k);
        size_t krow = 0, kvrow = (size_t)ck.nkv * D;
        for (int p = 0; p < m->npc[k]; p++) {
            const piece_t *pc = &m->pc[k * DT_LAYOUT_MAXRUNS + p];
            qblk_t *qb = &lr->qb[lr->nqb++];
            char *kd = pack + (m->off[k] + krow * kvrow) * x->esz;
            char *vd = pack + (m->off[k] + ((size_t)m->n[k] + krow) * kvrow) * x->esz;
            *qb = (qblk_t){ .k = k, .any = 0, .pc = *pc, .qoff = qoff, .loff = loff };
            if ((rc = dt_dilate_gather_cuda(x->dtype, pc->n, ck.nh, D, io->q, ldq, pc->row, r,
                                            ck.hlo, ws + pl->qg + qoff * x->esz, cs, em)) < 0 ||
                (rc = dt_dilate_gather_cuda(x->dtype, pc->n, ck.nkv, D, io->k, ldk, pc->row, r,
                                            ck.kvlo, kd, cs, em)) < 0 ||
                (rc = dt_dilate_gather_cuda(x->dtype, pc->n, ck.nkv, D, io->v, ldk, pc->row, r,
                                            ck.kvlo, vd, cs, em)) < 0)
                return rc;
            if (x->bwd) {
                float *lseg = (float *)(void *)(ws + pl->lseg) + loff;
                float *deltag = (float *)(void *)(ws + pl->deltag) + loff;
                float *dq2 = (float *)(void *)(ws + pl->dq2) + qoff;
                if ((rc = dt_dilate_gather_cuda(x->dtype, pc->n, ck.nh, D, io->dout, ldq, pc->row,
                                                r, ck.hlo, ws + pl->dog + qoff * x->esz, cs,
                                                em)) < 0 ||
                    (lr->blk.cudnn &&
                     (rc = dt_dilate_gather_cuda(x->dtype, pc->n, ck.nh, D, ws + pl->ohalf, ldq,
                                                 pc->row, r, ck.hlo,
                                                 ws + pl->ohg + qoff * x->esz, cs, em)) < 0) ||
                    (rc = dt_dilate_gather_rows_cuda(pc->n, ck.nh, io->lse, x->c, pc->row, r,
                                                     ck.hlo, lseg, cs, em)) < 0 ||
                    (rc = dt_dilate_gather_rows_cuda(pc->n, ck.nh, delta, x->c, pc->row, r,
                                                     ck.hlo, deltag, cs, em)) < 0)
                    return rc;
                DT_CUDA_TRY(em, cudaMemsetAsync(dq2, 0, (size_t)pc->n * ck.nh * D * sizeof(float),
                                                cs));
            }
            krow += (size_t)pc->n;
            qoff += (size_t)pc->n * ck.nh * D;
            loff += (size_t)pc->n * ck.nh;
        }
    }
    DT_CUDA_TRY(em, cudaEventRecord(x->r->p[l].ev[RING_EV_KV0], cs));
    if (x->bwd) {
        lr->gin = (float *)(void *)(ws + pl->g[0]);
        lr->gcur = (float *)(void *)(ws + pl->g[1]);
        lr->gout = (float *)(void *)(ws + pl->g[2]);
    }
    return 0;
}

/* Local rank l's query blocks against the pack of member src: forward into
 * (o2, lse2); backward dq into dq2, dK/dV into gpack (src's layout). Key
 * pieces wholly after a query piece (causal) are skipped. */
static int seg_blocks(call_t *x, const group_t *gr, int l, int src, const char *pack,
                      float *gpack, dt_emsg_t *em)
{
    const dt_attn_spec_t *s = x->s;
    const gmember_t *km = &gr->m[src];
    const plan_t *pl = &x->pl;
    lrank_t *lr = &x->lr[l];
    char *ws = lr->ws;
    cudaStream_t cs = x->r->p[l].compute;
    const int D = s->D;
    const int64_t esz = (int64_t)x->esz;
    int rc;

    for (int q = 0; q < lr->nqb; q++) {
        qblk_t *qb = &lr->qb[q];
        dt_attn_chunk_t ck = dt_attn_chunk(s, &gr->br, qb->k);
        int nb = chunk_blocks(s, &ck, gr->blk);
        const int64_t ldq = (int64_t)ck.nh * D, ldk = (int64_t)ck.nkv * D, n = qb->pc.n;
        size_t krow = 0; /* rows of the chunk before this key piece */
        for (int p = 0; p < km->npc[qb->k]; p++) {
            const piece_t *kp = &km->pc[qb->k * DT_LAYOUT_MAXRUNS + p];
            const size_t kel = km->off[qb->k] + krow * (size_t)ldk;
            const size_t vel = km->off[qb->k] + ((size_t)km->n[qb->k] + krow) * (size_t)ldk;
            krow += (size_t)kp->n;
            if (s->causal && kp->idx > qb->pc.idx + n - 1)
                continue; /* every key after every query */
            for (int i = 0; i < nb; i++) {
                const hblock_t *hb = &gr->blk[i];
                const int64_t qo = (int64_t)qb->qoff + (int64_t)(hb->h0 - ck.hlo) * D;
                const int64_t ko = (int64_t)(hb->kv0 - ck.kvlo) * D;
                const int64_t lo = (int64_t)qb->loff + (int64_t)(hb->h0 - ck.hlo) * n;
                dt_attn_cuda_t a = {
                    .tq = n, .tk = kp->n, .h = hb->nh, .hkv = hb->nkv, .d = D, .dtype = x->dtype,
                    .q = ws + pl->qg + qo * esz, .ldq = ldq,
                    .k = pack + ((int64_t)kel + ko) * esz, .ldk = ldk,
                    .v = pack + ((int64_t)vel + ko) * esz, .ldv = ldk,
                    .causal = s->causal, .q0 = qb->pc.idx, .k0 = kp->idx,
                    .qpos = NULL, .kpos = NULL, .scale = s->scale,
                };
                if (!x->bwd) {
                    float *o2 = (float *)(void *)(ws + pl->o2), *lse2 = (float *)(void *)(ws + pl->lse2);
                    rc = dt_attn_block_fwd(&lr->blk, &a, NULL, 0, NULL, 0, qb->any, o2 + qo, ldq,
                                           lse2 + lo, n, cs, em);
                } else {
                    const float *lseg = (const float *)(const void *)(ws + pl->lseg);
                    const float *deltag = (const float *)(const void *)(ws + pl->deltag);
                    dt_attn_cuda_grad_t g = {
                        .dout = ws + pl->dog + qo * esz, .lddo = ldq,
                        .lse = lseg + lo, .ldlse = n, .delta = deltag + lo,
                        .dq = (float *)(void *)(ws + pl->dq2) + qo, .lddq = ldq,
                        .dk = gpack + kel + ko, .lddk = ldk,
                        .dv = gpack + vel + ko, .lddv = ldk,
                    };
                    lr->blk.ohalf = lr->blk.cudnn ? ws + pl->ohg + qo * esz : NULL;
                    rc = dt_attn_block_bwd(&lr->blk, &a, NULL, 0, NULL, 0, &g, cs, em);
                }
                if (rc < 0)
                    return rc;
            }
            qb->any = 1;
            x->st.steps++;
        }
    }
    return 0;
}

/* Exchange of step t of a segment's ring: K/V packs (grad 0; member i
 * sends the pack of member i - t, receives that of i - t - 1) or dK/dV sums
 * (grad 1, t = 1 .. g; i sends the sum for the block of step t - 1,
 * receives the previous member's sum for the block of step t; t = g brings
 * its own home). */
static int seg_exchange(call_t *x, const group_t *gr, int t, int grad, dt_emsg_t *em)
{
    dt_ring_t *r = x->r;
    const int g = gr->g, cur = t & 1, q = (t - 1) & 1;
    const size_t esz = grad ? sizeof(float) : x->esz;

    for (int l = 0; l < x->nl; l++) {
        int i = gr->me[l];
        x->xf[l].to = -1;
        if (i < 0)
            continue;
        lrank_t *lr = &x->lr[l];
        cudaStream_t cs = r->p[l].comm;
        int to = gr->m[(i + 1) % g].rank, sent = member_back(i, grad ? t - 1 : t, g);
        int got = member_back(i, grad ? t : t + 1, g);
        if (!grad && t > 0) {
            /* kv[1 - cur]: step t - 1 computed on it, exchange t - 1 sent it */
            DT_CUDA_TRY(em, cudaStreamWaitEvent(cs, r->p[l].ev[RING_EV_COMP0 + 1 - cur], 0));
            DT_CUDA_TRY(em, cudaStreamWaitEvent(cs, dt_ring_sent_event(r, RING_EV_KV0 + cur, l, to),
                                                0));
        }
        if (grad) /* gout holds its sum and gin has been added */
            DT_CUDA_TRY(em, cudaStreamWaitEvent(cs, r->p[l].ev[RING_EV_ADD0 + q], 0));
        x->xf[l] = (dt_ring_xfer_t){
            .to = to, .from = gr->m[member_back(i, 1, g)].rank,
            .send = grad ? (void *)lr->gout : (void *)(lr->ws + x->pl.kv[cur]),
            .recv = grad ? (void *)lr->gin : (void *)(lr->ws + x->pl.kv[1 - cur]),
            .sbytes = gr->m[sent].elems * esz, .rbytes = gr->m[got].elems * esz,
        };
        x->st.bytes_sent += (double)x->xf[l].sbytes;
    }
    if (grad)
        return dt_ring_xchgv(r, x->xf, RING_EV_ADD0 + q, RING_EV_G0 + cur, em);
    return dt_ring_xchgv(r, x->xf, RING_EV_KV0 + cur, RING_EV_KV0 + 1 - cur, em);
}

/* Step t of a segment's ring on every local member. */
static int seg_step(call_t *x, const group_t *gr, int t, dt_emsg_t *em)
{
    dt_ring_t *r = x->r;
    const int g = gr->g, cur = t & 1;
    int rc;

    if (t < g - 1 && (rc = seg_exchange(x, gr, t, 0, em)) < 0)
        return rc;
    if (x->bwd && t > 0 && (rc = seg_exchange(x, gr, t, 1, em)) < 0)
        return rc;
    for (int l = 0; l < x->nl; l++) {
        int i = gr->me[l], src;
        if (i < 0)
            continue;
        lrank_t *lr = &x->lr[l];
        cudaStream_t cs = r->p[l].compute;
        const gmember_t *sm = &gr->m[src = member_back(i, t, g)];
        if (t > 0)
            DT_CUDA_TRY(em, cudaStreamWaitEvent(cs, r->p[l].ev[RING_EV_KV0 + cur], 0));
        if (x->bwd) {
            /* gcur was sent by gradient exchange t - 1 (t >= 2) */
            if (t >= 2)
                DT_CUDA_TRY(em, cudaStreamWaitEvent(
                                    cs, dt_ring_sent_event(r, RING_EV_G0 + ((t - 1) & 1), l,
                                                           gr->m[(i + 1) % g].rank), 0));
            DT_CUDA_TRY(em, cudaMemsetAsync(lr->gcur, 0, sm->elems * sizeof(float), cs));
        }
        if ((rc = seg_blocks(x, gr, l, src, lr->ws + x->pl.kv[cur], lr->gcur, em)) < 0)
            return rc;
        DT_CUDA_TRY(em, cudaEventRecord(r->p[l].ev[RING_EV_COMP0 + cur], cs));
        if (x->bwd) {
            if (t > 0) {
                /* the previous member's sum for the same block */
                DT_CUDA_TRY(em, cudaStreamWaitEvent(cs, r->p[l].ev[RING_EV_G0 + cur], 0));
                if ((rc = dt_dilate_scatter_add_cuda((int64_t)(sm->elems / (size_t)x->s->D), 1,
                                                     x->s->D, lr->gin, lr->gcur, x->s->D, 0, 1,
                                                     0, cs, em)) < 0)
                    return rc;
            }
            DT_CUDA_TRY(em, cudaEventRecord(r->p[l].ev[RING_EV_ADD0 + cur], cs));
            float *tmp = lr->gout;
            lr->gout = lr->gcur;
            lr->gcur = tmp;
        }
    }
    if (t == 0)
        return 0;
    int slot = RING_EV_COMP0 + ((t - 1) & 1);
    snprintf(x->what, sizeof(x->what), "%s branch %d segment [%lld, %lld) step %d of %d",
             x->bwd ? "backward" : "forward", gr->b + 1, (long long)gr->a, (long long)gr->e, t,
             g);
    return dt_ring_wait(r, &slot, 1, x->what, em);
}

/* End of a segment on local rank l: forward, merge each query block into
 * (o, lse); backward, add dq and my block's dK/dV (home: its sum over the
 * ring) into dq, dk, dv. */
static int seg_finish(call_t *x, const group_t *gr, int l, const float *home, dt_emsg_t *em)
{
    const dt_attn_spec_t *s = x->s;
    const dt_ring_io_t *io = &x->io[l];
    const gmember_t *m = &gr->m[gr->me[l]];
    const lrank_t *lr = &x->lr[l];
    const char *ws = lr->ws;
    cudaStream_t cs = x->r->p[l].compute;
    const int D = s->D;
    const int64_t ldq = (int64_t)s->H * D, ldk = (int64_t)s->Hkv * D, r = gr->br.r;
    int rc;

    for (int q = 0; q < lr->nqb; q++) {
        const qblk_t *qb = &lr->qb[q];
        dt_attn_chunk_t ck = dt_attn_chunk(s, &gr->br, qb->k);
        if (!x->bwd) {
            const float *o2 = (const float *)(const void *)(ws + x->pl.o2) + qb->qoff;
            const float *lse2 = (const float *)(const void *)(ws + x->pl.lse2) + qb->loff;
            if (qb->any && (rc = dt_dilate_merge_cuda(qb->pc.n, ck.nh, D, o2, lse2, io->o, ldq,
                                                      io->lse, x->c, qb->pc.row, r, ck.hlo, cs,
                                                      em)) < 0)
                return rc;
            continue;
        }
        const float *dq2 = (const float *)(const void *)(ws + x->pl.dq2) + qb->qoff;
        if ((rc = dt_dilate_scatter_add_cuda(qb->pc.n, ck.nh, D, dq2, io->dq, ldq, qb->pc.row, r,
                                             ck.hlo, cs, em)) < 0)
            return rc;
    }
    if (!x->bwd)
        return 0;
    for (int k = 0; k < gr->br.nchunk; k++) {
        dt_attn_chunk_t ck = dt_attn_chunk(s, &gr->br, k);
        size_t krow = 0, kvrow = (size_t)ck.nkv * D;
        for (int p = 0; p < m->npc[k]; p++) {
            const piece_t *pc = &m->pc[k * DT_LAYOUT_MAXRUNS + p];
            const float *dk = home + m->off[k] + krow * kvrow;
            const float *dv = home + m->off[k] + ((size_t)m->n[k] + krow) * kvrow;
            if ((rc = dt_dilate_scatter_add_cuda(pc->n, ck.nkv, D, dk, io->dk, ldk, pc->row, r,
                                                 ck.kvlo, cs, em)) < 0 ||
                (rc = dt_dilate_scatter_add_cuda(pc->n, ck.nkv, D, dv, io->dv, ldk, pc->row, r,
                                                 ck.kvlo, cs, em)) < 0)
                return rc;
            krow += (size_t)pc->n;
        }
    }
    return 0;
}

/* One segment: its members' ring of g steps (g = 1: local work only). A
 * ring of two or more ends with the host waiting for every stream of its
 * local members, so the next segment may reuse every buffer and event. */
static int seg_ring(call_t *x, const group_t *gr, dt_emsg_t *em)
{
    static const int slots[] = { RING_EV_DONE, RING_EV_CDONE };
    dt_ring_t *r = x->r;
    const int g = gr->g;
    int rc;

    for (int l = 0; l < x->nl; l++)
        if (gr->me[l] >= 0 && (rc = seg_setup(x, gr, l, em)) < 0)
            return rc;
    for (int t = 0; t < g; t++)
        if ((rc = seg_step(x, gr, t, em)) < 0)
            return rc;
    if (x->bwd && g > 1 && (rc = seg_exchange(x, gr, g, 1, em)) < 0)
        return rc;
    for (int l = 0; l < x->nl; l++) {
        if (gr->me[l] < 0)
            continue;
        const float *home = x->lr[l].gout; /* g = 1: the block's own gradient */
        if (x->bwd && g > 1) {
            DT_CUDA_TRY(em, cudaStreamWaitEvent(r->p[l].compute, r->p[l].ev[RING_EV_G0 + (g & 1)],
                                                0));
            home = x->lr[l].gin;
        }
        if ((rc = seg_finish(x, gr, l, home, em)) < 0)
            return rc;
        if (g > 1) {
            DT_CUDA_TRY(em, cudaEventRecord(r->p[l].ev[RING_EV_DONE], r->p[l].compute));
            DT_CUDA_TRY(em, cudaEventRecord(r->p[l].ev[RING_EV_CDONE], r->p[l].comm));
        }
    }
    if (g == 1)
        return 0;
    snprintf(x->what, sizeof(x->what), "end of the %s branch %d segment [%lld, %lld)",
             x->bwd ? "backward" : "forward", gr->b + 1, (long long)gr->a, (long long)gr->e);
    return dt_ring_wait(r, slots, 2, x->what, em);
}

/* Branch b: every segment that holds rows of a local rank, in ascending
 * order on every rank (a rank in several groups never waits on a peer
 * that waits on it: the lowest unfinished segment has all its members). */
static int dil_branch(call_t *x, int b, dt_emsg_t *em)
{
    const dt_attn_spec_t *s = x->s;
    const int64_t w = s->seg[b], nseg = (s->T + w - 1) / w;
    dt_run_t runs[DT_LAYOUT_MAXRUNS];
    int nr = 1, rc = 0;
    int64_t last = -1;
    group_t gr;

    /* one rank: the segments its runs meet; a local ring: all */
    if (x->nl == 1)
        nr = dt_layout_runs(s->layout, s->T, x->R, dt_ring_rank(x->r, 0), runs);
    else
        runs[0] = (dt_run_t){ .start = 0, .len = s->T };
    group_init(x, b, &gr);
    for (int i = 0; i < nr && rc == 0; i++) {
        int64_t j0 = runs[i].start / w, j1 = (runs[i].start + runs[i].len - 1) / w;
        for (int64_t j = j0 > last ? j0 : last + 1; j <= j1 && j < nseg && rc == 0; j++) {
            int64_t a = j * w, e = a + w < s->T ? a + w : s->T;
            if (group_fill(x, &gr, a, e) > 0)
                rc = seg_ring(x, &gr, em);
            last = j;
        }
    }
    group_close(x, &gr);
    return rc;
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
    int rc;

    if (!x->bwd) {
        if ((rc = dt_ring_call_empty(x, l, em)) < 0)
            return rc;
    } else {
        float *delta = (float *)(void *)(x->lr[l].ws + x->pl.delta);
        size_t kvf = (size_t)x->c * s->Hkv * s->D * sizeof(float);
        if ((rc = dt_attn_delta_cuda(x->c, s->H, s->D, x->dtype, io->dout, ldq, io->o, ldq, delta,
                                     x->c, cs, em)) < 0)
            return rc;
        if (x->lr[l].blk.cudnn &&
            (rc = dt_cast_from_f32_cuda(x->dtype, x->c * ldq, io->o, x->lr[l].ws + x->pl.ohalf,
                                        cs, em)) < 0)
            return rc;
        DT_CUDA_TRY(em, cudaMemsetAsync(io->dq, 0, (size_t)x->c * ldq * sizeof(float), cs));
        DT_CUDA_TRY(em, cudaMemsetAsync(io->dk, 0, kvf, cs));
        DT_CUDA_TRY(em, cudaMemsetAsync(io->dv, 0, kvf, cs));
    }
    DT_CUDA_TRY(em, cudaEventRecord(p->ev[RING_EV_TBEGIN], cs));
    return 0;
}

int dt_dilated_run(call_t *x, dt_emsg_t *em)
{
    int rc = 0;

    x->xf = dt_xcalloc((size_t)x->nl, sizeof(*x->xf));
    for (int l = 0; l < x->nl; l++)
        x->lr[l].qb = dt_xcalloc((size_t)x->s->H * DT_LAYOUT_MAXRUNS, sizeof(*x->lr[l].qb));
    for (int l = 0; l < x->nl && rc == 0; l++)
        rc = dil_setup(x, l, em);
    for (int b = 0; b < x->s->nbranch && rc == 0; b++)
        rc = dil_branch(x, b, em);
    return rc < 0 ? rc : dt_ring_call_finish(x, -1, em);
}
