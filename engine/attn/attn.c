/* SPDX-License-Identifier: MIT
 *
 * Dense (ring) and dilated attention over the ranks of a job, forward and
 * backward, on the CPU kernels. One mechanism serves all cases: a branch
 * (w, r) cuts the sequence into segments; for each segment this rank holds
 * tokens of, the ranks holding that segment form a group; each member packs
 * its dilated K/V (per head chunk: the rows at that chunk's offset, the kv
 * heads that chunk reads) and the packs travel around the group's ring
 * while every member accumulates its queries against the pack it holds.
 * Dense attention is the branch (T, 1): one segment, every rank, the whole
 * K/V. A group of one is local computation with no communication.
 *
 * The ring is double-buffered: the next pack is in flight (MPI_Isend/Irecv,
 * progressed between kernel tiles) while the current one computes. In the
 * backward, dK/dV of a pack travel one step behind it, each member adding
 * its contribution, and arrive home after the last step.
 *
 * Segments are processed in ascending order on every rank, so a rank that
 * belongs to several groups (zigzag) never waits on a peer that is waiting
 * on it.
 */
#include "config.h"

#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "common/clock.h"
#include "common/mem.h"
#include "engine/attn/attn.h"
#include "kernels/cpu/attn_cpu.h"
#include "spec/mask.h"

#ifdef _OPENMP
#include <omp.h>
#else
#define omp_get_thread_num() 0
#endif

#define TAG_KV 101
#define TAG_GRAD 102

/* ---- groups ------------------------------------------------------------ */

/* A member's rows of one segment: per chunk, how many positions sit at that
 * chunk's offset and where its K and V sit in the member's pack. Positions
 * are kept only for this rank (pos) and made on demand for the member whose
 * pack is being computed, so memory does not grow with the rank count. */
typedef struct member {
    int rank;
    int64_t *n;     /* [nchunk] rows per chunk */
    int64_t **pos;  /* [nchunk] positions; only for my own member */
    size_t *off;    /* [nchunk] float offset of K_k; V_k follows */
    size_t floats;  /* pack size */
} member_t;

typedef struct group {
    int g, me;      /* members, my index */
    member_t *m;    /* [g] */
    int64_t a, e;   /* the segment [a, e) */
    int64_t *kpos;  /* scratch: positions of the pack being computed, maxn per chunk */
    int64_t maxn;
} group_t;

static int64_t seg_positions(const dt_attn_spec_t *s, int R, int rank, int64_t a, int64_t b,
                             int64_t r, int64_t k, int64_t *out)
{
    dt_run_t runs[DT_LAYOUT_MAXRUNS];
    int nr = dt_layout_runs(s->layout, s->T, R, rank, runs);
    int64_t n = 0;

    for (int i = 0; i < nr; i++) {
        int64_t lo = runs[i].start > a ? runs[i].start : a;
        int64_t hi = runs[i].start + runs[i].len < b ? runs[i].start + runs[i].len : b;
        if (lo >= hi)
            continue;
        int64_t first = lo + ((k - (lo - a) % r) % r + r) % r;
        for (int64_t p = first; p < hi; p += r) {
            if (out)
                out[n] = p;
            n++;
        }
    }
    return n;
}

static int rank_in_segment(const dt_attn_spec_t *s, int R, int rank, int64_t a, int64_t b)
{
    dt_run_t runs[DT_LAYOUT_MAXRUNS];
    int nr = dt_layout_runs(s->layout, s->T, R, rank, runs);
    for (int i = 0; i < nr; i++)
        if (runs[i].start < b && runs[i].start + runs[i].len > a)
            return 1;
    return 0;
}

static void member_init(member_t *m, const dt_attn_spec_t *s, const dt_attn_branch_t *br, int R, int rank,
                        int64_t a, int64_t b, int with_pos)
{
    m->rank = rank;
    m->n = dt_xcalloc((size_t)br->nchunk, sizeof(*m->n));
    m->pos = dt_xcalloc((size_t)br->nchunk, sizeof(*m->pos));
    m->off = dt_xcalloc((size_t)br->nchunk, sizeof(*m->off));
    m->floats = 0;
    for (int k = 0; k < br->nchunk; k++) {
        dt_attn_chunk_t ck = dt_attn_chunk(s, br, k);
        int64_t n = seg_positions(s, R, rank, a, b, br->r, k, NULL);
        m->n[k] = n;
        if (with_pos) {
            m->pos[k] = dt_xmallocarray((size_t)(n ? n : 1), sizeof(int64_t));
            seg_positions(s, R, rank, a, b, br->r, k, m->pos[k]);
        }
        m->off[k] = m->floats;
        m->floats += 2 * (size_t)n * (size_t)ck.nkv * (size_t)s->D;
    }
}

static void group_init(group_t *gr, const dt_attn_spec_t *s, const dt_attn_branch_t *br, int R, int me,
                       int64_t a, int64_t b)
{
    int64_t maxn = 1;

    gr->g = 0;
    gr->me = -1;
    gr->a = a;
    gr->e = b;
    gr->m = dt_xcalloc((size_t)R, sizeof(*gr->m));
    for (int q = 0; q < R; q++) {
        if (!rank_in_segment(s, R, q, a, b))
            continue;
        if (q == me)
            gr->me = gr->g;
        member_init(&gr->m[gr->g], s, br, R, q, a, b, q == me);
        for (int k = 0; k < br->nchunk; k++)
            maxn = gr->m[gr->g].n[k] > maxn ? gr->m[gr->g].n[k] : maxn;
        gr->g++;
    }
    gr->maxn = maxn;
    gr->kpos = dt_xmallocarray((size_t)(maxn * br->nchunk), sizeof(int64_t));
}

static void group_close(group_t *gr, int nchunk)
{
    for (int i = 0; i < gr->g; i++) {
        for (int k = 0; k < nchunk; k++)
            free(gr->m[i].pos[k]);
        free(gr->m[i].pos);
        free(gr->m[i].n);
        free(gr->m[i].off);
    }
    free(gr->m);
    free(gr->kpos);
}

/* Local row index of each position of mine (positions ascend along rows). */
static int64_t local_row(const dt_attn_spec_t *s, int R, int rank, int64_t p)
{
    dt_run_t runs[DT_LAYOUT_MAXRUNS];
    int nr = dt_layout_runs(s->layout, s->T, R, rank, runs);
    int64_t off = 0;
    for (int i = 0; i < nr; i++) {
        if (p >= runs[i].start && p < runs[i].start + runs[i].len)
            return off + (p - runs[i].start);
        off += runs[i].len;
    }
    abort(); /* not reached: positions come from this rank's runs */
}

/* ---- packing ---------------------------------------------------------- */

/* rows[k][i]: local row of my i-th position in chunk k. */
typedef struct mine {
    int64_t **rows;
} mine_t;

static void mine_init(mine_t *mi, const dt_attn_spec_t *s, const dt_attn_branch_t *br, int R, int rank,
                      const member_t *m)
{
    mi->rows = dt_xcalloc((size_t)br->nchunk, sizeof(*mi->rows));
    for (int k = 0; k < br->nchunk; k++) {
        mi->rows[k] = dt_xmallocarray((size_t)(m->n[k] ? m->n[k] : 1), sizeof(int64_t));
        for (int64_t i = 0; i < m->n[k]; i++)
            mi->rows[k][i] = local_row(s, R, rank, m->pos[k][i]);
    }
}

static void mine_close(mine_t *mi, int nchunk)
{
    for (int k = 0; k < nchunk; k++)
        free(mi->rows[k]);
    free(mi->rows);
}

/* Pack K and V rows of my chunk positions into buf (member layout). */
static void pack_kv(const dt_attn_spec_t *s, const dt_attn_branch_t *br, const member_t *m,
                    const mine_t *mi, const float *k, const float *v, float *buf)
{
    const int D = s->D;
    for (int c = 0; c < br->nchunk; c++) {
        dt_attn_chunk_t ck = dt_attn_chunk(s, br, c);
        size_t rowf = (size_t)ck.nkv * D;
        float *kb = buf + m->off[c], *vb = kb + (size_t)m->n[c] * rowf;
        for (int64_t i = 0; i < m->n[c]; i++) {
            int64_t row = mi->rows[c][i];
            memcpy(kb + i * rowf, k + (row * s->Hkv + ck.kvlo) * D, rowf * sizeof(float));
            memcpy(vb + i * rowf, v + (row * s->Hkv + ck.kvlo) * D, rowf * sizeof(float));
        }
    }
}

/* Add a pack's gradient rows back into dk, dv. */
static void unpack_add_kv(const dt_attn_spec_t *s, const dt_attn_branch_t *br, const member_t *m,
                          const mine_t *mi, const float *buf, float *dk, float *dv)
{
    const int D = s->D;
    for (int c = 0; c < br->nchunk; c++) {
        dt_attn_chunk_t ck = dt_attn_chunk(s, br, c);
        size_t rowf = (size_t)ck.nkv * D;
        const float *kb = buf + m->off[c], *vb = kb + (size_t)m->n[c] * rowf;
        for (int64_t i = 0; i < m->n[c]; i++) {
            int64_t row = mi->rows[c][i];
            float *dkr = dk + (row * s->Hkv + ck.kvlo) * D, *dvr = dv + (row * s->Hkv + ck.kvlo) * D;
            for (size_t e = 0; e < rowf; e++) {
                dkr[e] += kb[i * rowf + e];
                dvr[e] += vb[i * rowf + e];
            }
        }
    }
}

/* Gather rows of a (c, H, D) tensor for chunk heads into (n, nh, D). */
static void gather_q(const float *x, const dt_attn_spec_t *s, const dt_attn_chunk_t *ck,
                     const int64_t *rows, int64_t n, float *out)
{
    size_t rowf = (size_t)ck->nh * s->D;
    for (int64_t i = 0; i < n; i++)
        memcpy(out + i * rowf, x + (rows[i] * s->H + ck->hlo) * s->D, rowf * sizeof(float));
}

static void scatter_q(float *x, const dt_attn_spec_t *s, const dt_attn_chunk_t *ck, const int64_t *rows,
                      int64_t n, const float *in, int add)
{
    size_t rowf = (size_t)ck->nh * s->D;
    for (int64_t i = 0; i < n; i++) {
        float *dst = x + (rows[i] * s->H + ck->hlo) * s->D;
        if (add)
            for (size_t e = 0; e < rowf; e++)
                dst[e] += in[i * rowf + e];
        else
            memcpy(dst, in + i * rowf, rowf * sizeof(float));
    }
}

/* (H, c) per-head vectors <-> (nh, n) */
static void gather_h(const float *x, int64_t c, const dt_attn_chunk_t *ck, const int64_t *rows, int64_t n,
                     float *out)
{
    for (int h = 0; h < ck->nh; h++)
        for (int64_t i = 0; i < n; i++)
            out[h * n + i] = x[(ck->hlo + h) * c + rows[i]];
}

static void scatter_h(float *x, int64_t c, const dt_attn_chunk_t *ck, const int64_t *rows, int64_t n,
                      const float *in)
{
    for (int h = 0; h < ck->nh; h++)
        for (int64_t i = 0; i < n; i++)
            x[(ck->hlo + h) * c + rows[i]] = in[h * n + i];
}

/* ---- the per-segment ring -------------------------------------------- */

/* My queries of one segment, per chunk, packed (or aliased when the pack
 * would be the identity: dense attention over all my rows). */
typedef struct qside {
    int alias;
    float **q, **o, **lse;          /* forward */
    float **dout, **delta, **dq;    /* backward */
} qside_t;

typedef struct ctx {
    dt_comm_t *comm;
    const dt_attn_spec_t *s;
    dt_attn_branch_t br; /* the branch being run */
    float scale;
    int causal;
    int pos;   /* the kernels get positions: causal, or a mask */
    const dt_mask_t *mask; /* NULL, or one that restricts more than causality */
    int R;     /* ranks */
    int64_t c; /* local rows */
    dt_attn_stats_t *st;
    dt_comm_op_t *inflight[2]; /* polled between tiles */
} ctx_t;

static void (*tick)(void);

void dt_attn_set_tick(void (*fn)(void))
{
    tick = fn;
}

static void poll_ops(void *arg)
{
    ctx_t *x = arg;
    if (tick)
        tick();
    for (int i = 0; i < 2; i++)
        if (x->inflight[i])
            dt_comm_test(x->inflight[i]);
}

/* Threads for one block's heads: one unless dt_attn_set_threads asked for
 * more and the head size runs on a vector kernel (the blas kernel's
 * OpenBLAS has threads of its own). */
static int threads = 1;

void dt_attn_set_threads(int n)
{
    threads = n > 0 ? n : 1;
}

static int threads_for(const dt_attn_spec_t *s)
{
    return threads > 1 && strcmp(dt_attn_cpu_kernel(s->D), "blas") != 0 ? threads : 1;
}

/* One unit of a block's work: chunk c, heads [h0, h1) of it. */
typedef struct item {
    int c, h0, h1;
} item_t;

/* Whether any query head of a chunk attends any pair of queries at
 * positions qp (nq, ascending) and keys at kp (nk, ascending): the mask's
 * box test on each half of either side (a zigzag rank's two runs). */
static int chunk_needed(const ctx_t *x, const dt_attn_chunk_t *ck, const int64_t *qp,
                        int64_t nq, const int64_t *kp, int64_t nk)
{
    int nh = x->mask->block > 0 && x->mask->nhead > 1 ? ck->nh : 1;
    int64_t qcut[3] = { 0, nq / 2, nq }, kcut[3] = { 0, nk / 2, nk };
    for (int h = 0; h < nh; h++)
        for (int a = 0; a < 2; a++)
            for (int b = 0; b < 2; b++) {
                if (qcut[a] == qcut[a + 1] || kcut[b] == kcut[b + 1])
                    continue;
                if (dt_mask_box(x->mask, ck->hlo + h, qp[qcut[a]], qp[qcut[a + 1] - 1],
                                kp[kcut[b]], kp[kcut[b + 1] - 1]) != DT_MASK_EMPTY)
                    return 1;
            }
    return 0;
}

/* The work of one block against my queries: per chunk, the source's key
 * positions (in gr->kpos) and, unless the chunk is empty or in the
 * future, its items. Forward items are single query heads; backward items
 * are the query heads of one kv head (they add into the same dk, dv),
 * so items never write the same memory. Returns the number of items. */
static int block_items(ctx_t *x, const group_t *gr, const member_t *src, int per_kv, item_t **out)
{
    const dt_attn_spec_t *s = x->s;
    const int g = s->H / s->Hkv;
    const member_t *me = &gr->m[gr->me];
    int n = 0, cap = 0;
    item_t *it = NULL;

    for (int c = 0; c < x->br.nchunk; c++) {
        dt_attn_chunk_t ck = dt_attn_chunk(s, &x->br, c);
        int64_t nq = me->n[c], nk = src->n[c];
        if (nq == 0 || nk == 0)
            continue;
        int64_t *kpos = gr->kpos + c * gr->maxn;
        seg_positions(x->s, x->R, src->rank, gr->a, gr->e, x->br.r, c, kpos);
        if (x->mask ? !chunk_needed(x, &ck, me->pos[c], nq, kpos, nk)
                    : x->causal && kpos[0] > me->pos[c][nq - 1])
            continue; /* no pair of the block is attended: in the future, or masked */
        for (int h = 0; h < ck.nh;) {
            int e = h + 1;
            if (per_kv) /* the rest of this kv head's group */
                while (e < ck.nh && (ck.hlo + e) / g == (ck.hlo + h) / g)
                    e++;
            if (n == cap)
                it = dt_xrealloc(it, (size_t)(cap = cap ? 2 * cap : 16) * sizeof(*it));
            it[n++] = (item_t){ c, h, e };
            h = e;
        }
    }
    *out = it;
    return n;
}

/* Where a block's K and V lie (and, backward, where their gradients go):
 * a pack in the member layout (per chunk, K rows then V rows), or, for
 * dense attention on one rank (one chunk, every row mine, in order), the
 * caller's own (c, Hkv, D) tensors, so nothing is copied. */
typedef struct kvblk {
    float *buf;  /* the pack, or NULL */
    float *k, *v; /* when buf is NULL */
} kvblk_t;

/* Chunk c's K and V rows of block b from member src (krow floats each). */
static void kv_chunk(const kvblk_t *b, const member_t *src, int c, size_t krow, float **k,
                     float **v)
{
    if (b->buf == NULL) {
        *k = b->k;
        *v = b->v;
        return;
    }
    *k = b->buf + src->off[c];
    *v = *k + (size_t)src->n[c] * krow;
}

/* The head h of chunk c, against block b of member src. */
static dt_attn_head_t head_at(ctx_t *x, const group_t *gr, const qside_t *qs,
                              const member_t *src, const kvblk_t *b, int c, int h, int progress,
                              uint64_t ids)
{
    const dt_attn_spec_t *s = x->s;
    const int g = s->H / s->Hkv;
    const member_t *me = &gr->m[gr->me];
    dt_attn_chunk_t ck = dt_attn_chunk(s, &x->br, c);
    int64_t nk = src->n[c];
    size_t krow = (size_t)ck.nkv * s->D;
    float *kb, *vb;
    kv_chunk(b, src, c, krow, &kb, &vb);
    int kvh = (ck.hlo + h) / g - ck.kvlo;
    int64_t ldq = qs->alias ? (int64_t)s->H * s->D : (int64_t)ck.nh * s->D;
    dt_attn_head_t a = {
        .tq = me->n[c], .tk = nk, .d = s->D,
        .q = qs->q[c] + (size_t)h * s->D, .ldq = ldq,
        .k = kb + (size_t)kvh * s->D, .ldk = (int64_t)krow,
        .v = vb + (size_t)kvh * s->D, .ldv = (int64_t)krow,
        .qpos = x->pos ? me->pos[c] : NULL,
        .kpos = x->pos ? gr->kpos + c * gr->maxn : NULL,
        .mask = x->mask, .head = ck.hlo + h,
        .scale = x->scale, .progress = progress ? poll_ops : NULL, .progress_arg = x,
        .kv_id = ids + (uint64_t)c * (uint64_t)s->Hkv + (uint64_t)((ck.hlo + h) / g),
    };
    return a;
}

/* Compute my queries (mine: member me) against block b of member src,
 * the items spread over the threads (communication is progressed by the
 * calling thread only). */
static void compute_fwd(ctx_t *x, const group_t *gr, const qside_t *qs, const member_t *src,
                        const kvblk_t *b)
{
    const dt_attn_spec_t *s = x->s;
    const member_t *me = &gr->m[gr->me];
    double t0 = dt_clock_now();
    item_t *it;
    int n = block_items(x, gr, src, 0, &it), nt = threads_for(s);
    /* one name per (chunk, K/V head) of this block: its query heads share
     * the kernel's packed K and V */
    uint64_t ids = dt_attn_kv_ids((uint64_t)x->br.nchunk * (uint64_t)s->Hkv);

#pragma omp parallel for num_threads(nt) schedule(dynamic, 1) if (nt > 1 && n > 1)
    for (int i = 0; i < n; i++) {
        int c = it[i].c, h = it[i].h0;
        dt_attn_head_t a = head_at(x, gr, qs, src, b, c, h, omp_get_thread_num() == 0, ids);
        dt_attn_head_fwd_cpu(&a, qs->o[c] + (size_t)h * s->D, a.ldq,
                             qs->lse[c] + h * me->n[c]);
    }
    free(it);
    x->st->compute_s += dt_clock_now() - t0;
    x->st->steps++;
}

static void compute_bwd(ctx_t *x, const group_t *gr, const qside_t *qs, const member_t *src,
                        const kvblk_t *b, const kvblk_t *gb)
{
    const dt_attn_spec_t *s = x->s;
    const int g = s->H / s->Hkv;
    const member_t *me = &gr->m[gr->me];
    double t0 = dt_clock_now();
    item_t *it;
    int n = block_items(x, gr, src, 1, &it), nt = threads_for(s);
    uint64_t ids = dt_attn_kv_ids((uint64_t)x->br.nchunk * (uint64_t)s->Hkv);

#pragma omp parallel for num_threads(nt) schedule(dynamic, 1) if (nt > 1 && n > 1)
    for (int i = 0; i < n; i++) {
        int c = it[i].c;
        dt_attn_chunk_t ck = dt_attn_chunk(s, &x->br, c);
        int64_t nq = me->n[c];
        size_t krow = (size_t)ck.nkv * s->D;
        float *dkb, *dvb;
        kv_chunk(gb, src, c, krow, &dkb, &dvb);
        for (int h = it[i].h0; h < it[i].h1; h++) {
            int kvh = (ck.hlo + h) / g - ck.kvlo;
            dt_attn_head_t a = head_at(x, gr, qs, src, b, c, h, omp_get_thread_num() == 0, ids);
            dt_attn_head_grad_t gd = {
                .dout = qs->dout[c] + (size_t)h * s->D, .lddo = a.ldq,
                .lse = qs->lse[c] + h * nq, .delta = qs->delta[c] + h * nq,
                .dq = qs->dq[c] + (size_t)h * s->D,
                .dk = dkb + (size_t)kvh * s->D, .dv = dvb + (size_t)kvh * s->D,
            };
            dt_attn_head_bwd_cpu(&a, &gd);
        }
    }
    free(it);
    x->st->compute_s += dt_clock_now() - t0;
    x->st->steps++;
}

/* Wait for a transfer. With a tick set (a worker under an agent), the
 * wait polls and ticks, 0.2 ms apart: a rank waiting on a slower peer
 * (a loaded node, a longer block) keeps its heartbeats going, so the
 * wait is not taken for a hang. */
static int waitop(ctx_t *x, dt_comm_op_t **op)
{
    double t0 = dt_clock_now();
    if (tick)
        while (!dt_comm_test(*op)) {
            tick();
            nanosleep(&(struct timespec){ .tv_nsec = 200000 }, NULL);
        }
    int rc = dt_comm_wait(*op);
    *op = NULL;
    x->st->wait_s += dt_clock_now() - t0;
    return rc;
}

/* Forward ring over one group; direct: the one block of a ring of one
 * read where it lies (kvblk_t), bufs unused. */
static int ring_fwd(ctx_t *x, const group_t *gr, const qside_t *qs, float *bufs[2],
                    const kvblk_t *direct)
{
    int next = gr->m[(gr->me + 1) % gr->g].rank, prev = gr->m[(gr->me + gr->g - 1) % gr->g].rank;
    int cur = 0, rc = 0;

    for (int t = 0; t < gr->g; t++) {
        const member_t *src = &gr->m[(gr->me - t + gr->g) % gr->g];
        if (t < gr->g - 1) {
            const member_t *nsrc = &gr->m[(gr->me - t - 1 + gr->g) % gr->g];
            rc = dt_comm_start(x->comm, bufs[cur], src->floats * sizeof(float), next,
                               bufs[1 - cur], nsrc->floats * sizeof(float), prev, TAG_KV,
                               &x->inflight[0]);
            if (rc < 0)
                return rc;
            x->st->bytes_sent += (double)src->floats * sizeof(float);
        }
        compute_fwd(x, gr, qs, src, direct ? direct : &(kvblk_t){ .buf = bufs[cur] });
        if (x->inflight[0] && (rc = waitop(x, &x->inflight[0])) < 0)
            return rc;
        cur = 1 - cur;
    }
    return 0;
}

/* Backward ring over one group: K/V packs rotate as in the forward; the
 * gradient pack of each block follows one step behind and comes home.
 * direct (a ring of one): K and V read, and their gradients added, where
 * the caller's tensors lie (the first and only addition into zeros, so
 * the same bits as through a pack). */
static int ring_bwd(ctx_t *x, const group_t *gr, const qside_t *qs, float *bufs[2],
                    float *gb[3], size_t gmax, float *gfinal, const kvblk_t *direct)
{
    if (direct) {
        compute_bwd(x, gr, qs, &gr->m[gr->me], direct,
                    &(kvblk_t){ .k = direct[1].k, .v = direct[1].v });
        return 0;
    }
    const member_t *me = &gr->m[gr->me];
    int next = gr->m[(gr->me + 1) % gr->g].rank, prev = gr->m[(gr->me + gr->g - 1) % gr->g].rank;
    int cur = 0, rc = 0, w;
    float *gin = gb[0], *gcur = gb[1], *gout = gb[2];
    dt_comm_op_t *grecv = NULL;

    for (int t = 0; t < gr->g; t++) {
        const member_t *src = &gr->m[(gr->me - t + gr->g) % gr->g];
        if (t < gr->g - 1) {
            const member_t *nsrc = &gr->m[(gr->me - t - 1 + gr->g) % gr->g];
            rc = dt_comm_start(x->comm, bufs[cur], src->floats * sizeof(float), next,
                               bufs[1 - cur], nsrc->floats * sizeof(float), prev, TAG_KV,
                               &x->inflight[0]);
            if (rc < 0)
                goto out;
            x->st->bytes_sent += (double)src->floats * sizeof(float);
        }
        if (t > 0 && (rc = dt_comm_start(x->comm, NULL, 0, next, gin,
                                         src->floats * sizeof(float), prev, TAG_GRAD,
                                         &grecv)) < 0)
            goto out;
        memset(gcur, 0, gmax * sizeof(float));
        compute_bwd(x, gr, qs, src, &(kvblk_t){ .buf = bufs[cur] }, &(kvblk_t){ .buf = gcur });
        if (t > 0) {
            if ((rc = waitop(x, &grecv)) < 0)
                goto out;
            for (size_t e = 0; e < src->floats; e++)
                gcur[e] += gin[e];
        }
        if (gr->g > 1) {
            if (x->inflight[1] && (rc = waitop(x, &x->inflight[1])) < 0)
                goto out;
            float *tmp = gout;
            gout = gcur;
            gcur = tmp;
            rc = dt_comm_start(x->comm, gout, src->floats * sizeof(float), next, NULL, 0, prev,
                               TAG_GRAD, &x->inflight[1]);
            if (rc < 0)
                goto out;
            x->st->bytes_sent += (double)src->floats * sizeof(float);
        } else {
            memcpy(gfinal, gcur, src->floats * sizeof(float));
        }
        if (x->inflight[0] && (rc = waitop(x, &x->inflight[0])) < 0)
            goto out;
        cur = 1 - cur;
    }
    if (gr->g > 1) {
        /* my own block's gradient, home after a full turn */
        if ((rc = dt_comm_start(x->comm, NULL, 0, next, gfinal, me->floats * sizeof(float), prev,
                                TAG_GRAD, &grecv)) < 0)
            goto out;
        if ((rc = waitop(x, &grecv)) < 0)
            goto out;
        if (x->inflight[1] && (rc = waitop(x, &x->inflight[1])) < 0)
            goto out;
    }
out:
    /* only after a failure is anything still in flight: drain it, keeping
     * the first error as the one reported */
    if (grecv && (w = dt_comm_wait(grecv)) < 0 && rc == 0)
        rc = w;
    for (int i = 0; i < 2; i++)
        if (x->inflight[i]) {
            if ((w = dt_comm_wait(x->inflight[i])) < 0 && rc == 0)
                rc = w;
            x->inflight[i] = NULL;
        }
    return rc;
}

/* ---- masked dense rings: only the blocks a pair needs -------------------- */

/* Whether rank dst's queries attend any key of rank src under the mask
 * (dense attention: a rank's positions are its layout runs). */
static int rank_needs(const ctx_t *x, int dst, int src)
{
    const dt_attn_spec_t *s = x->s;
    dt_run_t qr[DT_LAYOUT_MAXRUNS], kr[DT_LAYOUT_MAXRUNS];
    int nq = dt_layout_runs(s->layout, s->T, x->R, dst, qr);
    int nk = dt_layout_runs(s->layout, s->T, x->R, src, kr);
    int nh = x->mask->block > 0 && x->mask->nhead > 1 ? s->H : 1;
    for (int h = 0; h < nh; h++)
        for (int a = 0; a < nq; a++)
            for (int b = 0; b < nk; b++)
                if (qr[a].len > 0 && kr[b].len > 0 &&
                    dt_mask_box(x->mask, h, qr[a].start, qr[a].start + qr[a].len - 1,
                                kr[b].start, kr[b].start + kr[b].len - 1) != DT_MASK_EMPTY)
                    return 1;
    return 0;
}

/* Step t of a masked dense ring: I receive the block of member me - t
 * when my queries need it and send mine to member me + t when its
 * queries need it; a pair that needs nothing sends nothing, and a step
 * where neither does is no step at all. Every rank decides from the same
 * mask, so the two ends of each transfer agree. */
typedef struct dstep {
    int in, out;           /* receive from src, send to dst */
    const member_t *src, *dst;
} dstep_t;

static dstep_t dstep(const ctx_t *x, const group_t *gr, int t)
{
    dstep_t d;
    d.src = &gr->m[(gr->me - t + gr->g) % gr->g];
    d.dst = &gr->m[(gr->me + t) % gr->g];
    d.in = rank_needs(x, gr->m[gr->me].rank, d.src->rank);
    d.out = rank_needs(x, d.dst->rank, gr->m[gr->me].rank);
    return d;
}

/* start the K/V transfer of step t (nothing when neither side has one) */
static int dstart_kv(ctx_t *x, const group_t *gr, const dstep_t *d, float *own, float *rbuf)
{
    const member_t *me = &gr->m[gr->me];
    if (!d->in && !d->out)
        return 0;
    if (d->out)
        x->st->bytes_sent += (double)me->floats * sizeof(float);
    return dt_comm_start(x->comm, d->out ? own : NULL, d->out ? me->floats * sizeof(float) : 0,
                         d->dst->rank, d->in ? rbuf : NULL,
                         d->in ? d->src->floats * sizeof(float) : 0, d->src->rank, TAG_KV,
                         &x->inflight[0]);
}

/* At step t: wait for its K/V (started a step before), then start step
 * t + 1's into the other receive buffer (*nx becomes that step). */
static int dnext_kv(ctx_t *x, const group_t *gr, int t, dstep_t *nx, float *own, float *rb[2])
{
    int rc;
    if (x->inflight[0] && (rc = waitop(x, &x->inflight[0])) < 0)
        return rc;
    if (t + 1 >= gr->g)
        return 0;
    *nx = dstep(x, gr, t + 1);
    return dstart_kv(x, gr, nx, own, rb[(t + 1) % 2]);
}

/* Forward: the blocks in the order of the plain ring (step t: member
 * me - t's), so the sums are the same to the bit when nothing is masked;
 * bufs[0] my pack, bufs[1] and rb the two receive buffers. */
static int ring_fwd_masked(ctx_t *x, const group_t *gr, const qside_t *qs, float *bufs[2],
                           size_t maxf)
{
    float *rb[2] = { bufs[1], dt_xaligned(maxf ? maxf : 1, sizeof(float)) };
    int rc = 0;
    dstep_t nx = dstep(x, gr, 1);
    if ((rc = dstart_kv(x, gr, &nx, bufs[0], rb[1])) < 0)
        goto out;
    compute_fwd(x, gr, qs, &gr->m[gr->me], &(kvblk_t){ .buf = bufs[0] });
    for (int t = 1; t < gr->g; t++) {
        dstep_t cur = nx;
        if ((rc = dnext_kv(x, gr, t, &nx, bufs[0], rb)) < 0)
            goto out;
        if (cur.in)
            compute_fwd(x, gr, qs, cur.src, &(kvblk_t){ .buf = rb[t % 2] });
    }
out:
    if (x->inflight[0]) {
        int w = dt_comm_wait(x->inflight[0]);
        x->inflight[0] = NULL;
        if (rc == 0)
            rc = w;
    }
    free(rb[1]);
    return rc;
}

/* Backward: the gradient of the block of member me - t goes straight back
 * to it after step t, and mine comes from member me + t; my own block's
 * gradient adds them in step order, as the plain ring does, so the sums
 * are the same to the bit when nothing is masked. gfinal gets it. */
static int ring_bwd_masked(ctx_t *x, const group_t *gr, const qside_t *qs, float *bufs[2],
                           float *gb[3], size_t gmax, float *gfinal)
{
    const member_t *me = &gr->m[gr->me];
    float *rb[2] = { bufs[1], dt_xaligned(gmax ? gmax : 1, sizeof(float)) };
    float *gin = gb[0], *gsend[2] = { gb[1], gb[2] };
    int rc = 0, w, pend_in = 0;
    dstep_t nx = dstep(x, gr, 1);

    if ((rc = dstart_kv(x, gr, &nx, bufs[0], rb[1])) < 0)
        goto out;
    memset(gfinal, 0, me->floats * sizeof(float));
    compute_bwd(x, gr, qs, me, &(kvblk_t){ .buf = bufs[0] }, &(kvblk_t){ .buf = gfinal });
    for (int t = 1; t < gr->g; t++) {
        dstep_t cur = nx;
        float *g = gsend[t % 2];
        if ((rc = dnext_kv(x, gr, t, &nx, bufs[0], rb)) < 0)
            goto out;
        if (cur.in) {
            memset(g, 0, cur.src->floats * sizeof(float));
            compute_bwd(x, gr, qs, cur.src, &(kvblk_t){ .buf = rb[t % 2] },
                        &(kvblk_t){ .buf = g });
        }
        /* step t - 1's gradient exchange done: its contribution to mine */
        if (x->inflight[1] && (rc = waitop(x, &x->inflight[1])) < 0)
            goto out;
        if (pend_in)
            for (size_t e = 0; e < me->floats; e++)
                gfinal[e] += gin[e];
        /* this step's: the block's gradient home, mine from member me + t */
        pend_in = cur.out;
        if (cur.in || cur.out) {
            if (cur.in)
                x->st->bytes_sent += (double)cur.src->floats * sizeof(float);
            rc = dt_comm_start(x->comm, cur.in ? g : NULL,
                               cur.in ? cur.src->floats * sizeof(float) : 0, cur.src->rank,
                               cur.out ? gin : NULL, cur.out ? me->floats * sizeof(float) : 0,
                               cur.dst->rank, TAG_GRAD, &x->inflight[1]);
            if (rc < 0)
                goto out;
        }
    }
    if (x->inflight[1] && (rc = waitop(x, &x->inflight[1])) < 0)
        goto out;
    if (pend_in)
        for (size_t e = 0; e < me->floats; e++)
            gfinal[e] += gin[e];
out:
    for (int i = 0; i < 2; i++)
        if (x->inflight[i]) {
            if ((w = dt_comm_wait(x->inflight[i])) < 0 && rc == 0)
                rc = w;
            x->inflight[i] = NULL;
        }
    free(rb[1]);
    return rc;
}

/* ---- driver ------------------------------------------------------------ */

typedef struct tensors {
    const float *q, *k, *v;
    float *o, *lse;                 /* forward: accumulators; backward: inputs */
    const float *dout;
    float *delta;                   /* (H, c) */
    float *dq, *dk, *dv;
} tensors_t;

static int run_branch(ctx_t *x, int b, const tensors_t *tn, int bwd)
{
    const dt_attn_spec_t *s = x->s;
    int R = dt_comm_size(x->comm), me = dt_comm_rank(x->comm);
    x->br = dt_attn_branch(s, b);
    const dt_attn_branch_t br = x->br;
    dt_run_t runs[DT_LAYOUT_MAXRUNS];
    int nr = dt_layout_runs(s->layout, s->T, R, me, runs);
    int64_t segs[2 * DT_LAYOUT_MAXRUNS];
    int nseg = 0, rc = 0;

    /* the segments my runs touch, ascending (runs ascend too) */
    for (int i = 0; i < nr; i++) {
        int64_t s0 = runs[i].start / br.w, s1 = (runs[i].start + runs[i].len - 1) / br.w;
        segs[nseg++] = s0;
        segs[nseg++] = s1;
    }
    for (int i = 0; i < nseg; i += 2) {
        for (int64_t sg = segs[i]; sg <= segs[i + 1]; sg++) {
            if (i > 0 && sg <= segs[i - 1])
                continue; /* already done with the previous run */
            int64_t a = sg * br.w, e = a + br.w < s->T ? a + br.w : s->T;
            group_t gr;
            mine_t mi;
            qside_t qs = { 0 };
            group_init(&gr, s, &br, R, me, a, e);
            const member_t *mm = &gr.m[gr.me];
            mine_init(&mi, s, &br, R, me, mm);
            size_t maxf = 0;
            for (int j = 0; j < gr.g; j++)
                maxf = gr.m[j].floats > maxf ? gr.m[j].floats : maxf;
            qs.alias = br.r == 1 && br.nchunk == 1 && mm->n[0] == x->c;
            /* dense attention on one rank: no pack, no ring buffers; [0]
             * K and V, [1] their gradients */
            int direct = qs.alias && gr.g == 1 && s->nbranch == 0;
            kvblk_t dkv[2] = { { .k = (float *)tn->k, .v = (float *)tn->v },
                               { .k = tn->dk, .v = tn->dv } };
            float *bufs[2] = { NULL, NULL };
            if (!direct) {
                bufs[0] = dt_xaligned(maxf ? maxf : 1, sizeof(float));
                bufs[1] = dt_xaligned(maxf ? maxf : 1, sizeof(float));
                pack_kv(s, &br, mm, &mi, tn->k, tn->v, bufs[0]);
            }

            int nc = br.nchunk;
            qs.q = dt_xcalloc((size_t)nc, sizeof(float *));
            qs.o = dt_xcalloc((size_t)nc, sizeof(float *));
            qs.lse = dt_xcalloc((size_t)nc, sizeof(float *));
            qs.dout = dt_xcalloc((size_t)nc, sizeof(float *));
            qs.delta = dt_xcalloc((size_t)nc, sizeof(float *));
            qs.dq = dt_xcalloc((size_t)nc, sizeof(float *));
            for (int c = 0; c < nc; c++) {
                dt_attn_chunk_t ck = dt_attn_chunk(s, &br, c);
                int64_t n = mm->n[c];
                if (qs.alias) {
                    qs.q[c] = (float *)tn->q;
                    qs.o[c] = tn->o;
                    qs.lse[c] = tn->lse;
                    qs.dout[c] = (float *)tn->dout;
                    qs.delta[c] = tn->delta;
                    qs.dq[c] = tn->dq;
                    continue;
                }
                size_t qf = (size_t)(n ? n : 1) * ck.nh * s->D, hf = (size_t)(n ? n : 1) * ck.nh;
                qs.q[c] = dt_xaligned(qf, sizeof(float));
                qs.o[c] = dt_xaligned(qf, sizeof(float));
                qs.lse[c] = dt_xaligned(hf, sizeof(float));
                gather_q(tn->q, s, &ck, mi.rows[c], n, qs.q[c]);
                gather_q(tn->o, s, &ck, mi.rows[c], n, qs.o[c]);
                gather_h(tn->lse, x->c, &ck, mi.rows[c], n, qs.lse[c]);
                if (bwd) {
                    qs.dout[c] = dt_xaligned(qf, sizeof(float));
                    qs.dq[c] = dt_xcalloc(qf, sizeof(float));
                    qs.delta[c] = dt_xaligned(hf, sizeof(float));
                    gather_q(tn->dout, s, &ck, mi.rows[c], n, qs.dout[c]);
                    gather_h(tn->delta, x->c, &ck, mi.rows[c], n, qs.delta[c]);
                }
            }

            /* a mask on a dense ring: only the blocks some pair needs move */
            int masked = x->mask != NULL && s->nbranch == 0 && gr.g > 1;
            if (!bwd && masked) {
                rc = ring_fwd_masked(x, &gr, &qs, bufs, maxf);
            } else if (!bwd) {
                rc = ring_fwd(x, &gr, &qs, bufs, direct ? dkv : NULL);
            } else if (direct) {
                rc = ring_bwd(x, &gr, &qs, bufs, NULL, 0, NULL, dkv);
            } else {
                float *gb[3], *gfinal = dt_xaligned(maxf ? maxf : 1, sizeof(float));
                for (int j = 0; j < 3; j++)
                    gb[j] = dt_xaligned(maxf ? maxf : 1, sizeof(float));
                rc = masked ? ring_bwd_masked(x, &gr, &qs, bufs, gb, maxf, gfinal)
                            : ring_bwd(x, &gr, &qs, bufs, gb, maxf, gfinal, NULL);
                if (rc == 0)
                    unpack_add_kv(s, &br, mm, &mi, gfinal, tn->dk, tn->dv);
                for (int j = 0; j < 3; j++)
                    free(gb[j]);
                free(gfinal);
            }

            for (int c = 0; c < nc; c++) {
                if (qs.alias)
                    continue;
                dt_attn_chunk_t ck = dt_attn_chunk(s, &br, c);
                if (rc == 0 && !bwd) {
                    scatter_q(tn->o, s, &ck, mi.rows[c], mm->n[c], qs.o[c], 0);
                    scatter_h(tn->lse, x->c, &ck, mi.rows[c], mm->n[c], qs.lse[c]);
                }
                if (rc == 0 && bwd)
                    scatter_q(tn->dq, s, &ck, mi.rows[c], mm->n[c], qs.dq[c], 1);
                free(qs.q[c]);
                free(qs.o[c]);
                free(qs.lse[c]);
                free(qs.dout[c]);
                free(qs.delta[c]);
                free(qs.dq[c]);
            }
            free(qs.q);
            free(qs.o);
            free(qs.lse);
            free(qs.dout);
            free(qs.delta);
            free(qs.dq);
            free(bufs[0]);
            free(bufs[1]);
            mine_close(&mi, br.nchunk);
            group_close(&gr, br.nchunk);
            if (rc < 0)
                return rc;
        }
    }
    return 0;
}

static int run(dt_comm_t *comm, const dt_attn_spec_t *s, const tensors_t *tn, int bwd,
               dt_attn_stats_t *st, dt_emsg_t *em)
{
    int R = dt_comm_size(comm), rc = 0;
    dt_attn_stats_t local = { 0 };
    const dt_mask_t *mask = s->mask && !dt_mask_is_plain(s->mask) ? s->mask : NULL;
    ctx_t x = { .comm = comm, .s = s, .causal = s->causal, .pos = s->causal || mask != NULL,
                .mask = mask, .st = st ? st : &local };
    double t0 = dt_clock_now();

    memset(x.st, 0, sizeof(*x.st));
    x.c = dt_layout_local(s->T, R);
    x.R = R;
    x.scale = s->scale != 0.0f ? s->scale : 1.0f / sqrtf((float)s->D);
    if (s->nbranch == 0)
        rc = run_branch(&x, -1, tn, bwd);
    for (int b = 0; b < s->nbranch && rc == 0; b++)
        rc = run_branch(&x, b, tn, bwd);
    x.st->total_s = dt_clock_now() - t0;
    if (rc < 0)
        return dt_emsg_set(em, rc, "ring transfer failed: %s", dt_strerror(rc));
    return 0;
}

int dt_attn_fwd(dt_comm_t *comm, const dt_attn_spec_t *s, const float *q, const float *k,
                const float *v, float *o, float *lse, dt_attn_stats_t *st, dt_emsg_t *em)
{
    int R = dt_comm_size(comm), rc;
    tensors_t tn = { .q = q, .k = k, .v = v, .o = o, .lse = lse };

    if ((rc = dt_attn_check(s, R, em)) < 0)
        return rc;
    int64_t c = dt_layout_local(s->T, R);
    memset(o, 0, (size_t)c * s->H * s->D * sizeof(float));
    for (int64_t i = 0; i < c * s->H; i++)
        lse[i] = -INFINITY;
    return run(comm, s, &tn, 0, st, em);
}

int dt_attn_bwd(dt_comm_t *comm, const dt_attn_spec_t *s, const float *q, const float *k,
                const float *v, const float *o, const float *lse, const float *dout, float *dq,
                float *dk, float *dv, dt_attn_stats_t *st, dt_emsg_t *em)
{
    int R = dt_comm_size(comm), rc;

    if ((rc = dt_attn_check(s, R, em)) < 0)
        return rc;
    int64_t c = dt_layout_local(s->T, R);
    float *delta = dt_xaligned((size_t)c * s->H, sizeof(float));
    tensors_t tn = { .q = q, .k = k, .v = v, .o = (float *)o, .lse = (float *)lse, .dout = dout,
                     .delta = delta, .dq = dq, .dk = dk, .dv = dv };

    for (int h = 0; h < s->H; h++)
        dt_attn_delta_cpu(c, s->D, dout + (size_t)h * s->D, (int64_t)s->H * s->D,
                          o + (size_t)h * s->D, (int64_t)s->H * s->D, delta + h * c);
    memset(dq, 0, (size_t)c * s->H * s->D * sizeof(float));
    memset(dk, 0, (size_t)c * s->Hkv * s->D * sizeof(float));
    memset(dv, 0, (size_t)c * s->Hkv * s->D * sizeof(float));
    rc = run(comm, s, &tn, 1, st, em);
    free(delta);
    return rc;
}
