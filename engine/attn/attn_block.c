/* SPDX-License-Identifier: MIT
 *
 * One block of GPU attention through cuDNN or dt's kernels (contract in
 * engine/attn/attn_block.h): the pieces a block is cut into, the choice of
 * kernel, the scratch, and the calls.
 *
 * Not here: the graphs and plans (kernels/cuda/attn_cudnn.c), the ring
 * schedules that call these (ring_cuda.c, dilated_cuda.c).
 */
#include "config.h"

#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include "spec/attn_spec.h"
#include "kernels/attn_kernel.h"
#include "kernels/cuda/attn_cudnn.h"
#include "kernels/cuda/cuda_err.h"
#include "kernels/cuda/layers_cuda.h"
#include "engine/attn/attn_block.h"

/* ---- pieces ------------------------------------------------------------------ */

/* The truth on one (query run, key run) rectangle, in block rows: key row j
 * is visible to query row i iff j - i <= d; lo..hi is the range of j - i on
 * the rectangle and d is clamped into [lo - 1, hi] (hi: every pair
 * visible, lo - 1: none). */
typedef struct cell {
    int64_t q0, q1, k0, k1;
    int64_t lo, hi, d;
} cell_t;

static int64_t clamp(int64_t v, int64_t lo, int64_t hi)
{
    return v < lo ? lo : v > hi ? hi : v;
}

/* A rule j - i <= s agrees with the truth on c. */
static int agrees(const cell_t *c, int64_t s)
{
    return clamp(s, c->lo - 1, c->hi) == c->d;
}

typedef struct rect {
    int64_t q0, q1, k0, k1; /* block rows */
    int64_t s;              /* the rule, in block rows (DT_CUDNN_FULL: every key) */
    int cells[DT_ATTN_MAXPIECES];
    int n;
} rect_t;

/* A rule that agrees with every cell of both rectangles: the candidates are
 * their rules and "every key"; -1 when none does. */
static int common_rule(const cell_t *cell, const rect_t *x, const rect_t *y, int64_t *s)
{
    const int64_t cand[3] = { x->s, y->s, DT_CUDNN_FULL };

    for (int c = 0; c < 3; c++) {
        int ok = 1;
        for (int i = 0; i < x->n && ok; i++)
            ok = agrees(&cell[x->cells[i]], cand[c]);
        for (int i = 0; i < y->n && ok; i++)
            ok = agrees(&cell[y->cells[i]], cand[c]);
        if (ok) {
            *s = cand[c];
            return 0;
        }
    }
    return -1;
}

static void absorb(rect_t *x, const rect_t *y, int64_t s)
{
    x->q0 = x->q0 < y->q0 ? x->q0 : y->q0;
    x->q1 = x->q1 > y->q1 ? x->q1 : y->q1;
    x->k0 = x->k0 < y->k0 ? x->k0 : y->k0;
    x->k1 = x->k1 > y->k1 ? x->k1 : y->k1;
    x->s = s;
    for (int i = 0; i < y->n; i++)
        x->cells[x->n++] = y->cells[i];
}

/* A rectangle in the piece form: its own rows, the rows that see nothing
 * and the keys nothing sees trimmed. 0 if nothing is left. */
static int to_piece(const rect_t *r, dt_attn_piece_t *p)
{
    int64_t nq = r->q1 - r->q0, nk = r->k1 - r->k0, qrow = r->q0, s;

    if (r->s == DT_CUDNN_FULL) {
        *p = (dt_attn_piece_t){ qrow, nq, r->k0, nk, DT_CUDNN_FULL };
        return 1;
    }
    s = r->s + r->q0 - r->k0;
    if (s < 0) { /* rows i < -s see no key */
        qrow -= s;
        nq += s;
        s = 0;
    }
    if (nq <= 0)
        return 0;
    if (nq + s < nk)
        nk = nq + s; /* keys after the last row's last */
    *p = (dt_attn_piece_t){ qrow, nq, r->k0, nk, s >= nk - 1 ? DT_CUDNN_FULL : s };
    return 1;
}

int dt_attn_pieces(const dt_run_t *qr, int nq, const dt_run_t *kr, int nk, int causal,
                   dt_attn_piece_t *out)
{
    cell_t cell[DT_ATTN_MAXPIECES];
    rect_t rect[DT_ATTN_MAXPIECES];
    int nr = 0, np = 0;
    int64_t qrows = 0, krows = 0;

    for (int a = 0; a < nq; a++)
        qrows += qr[a].len;
    for (int b = 0; b < nk; b++)
        krows += kr[b].len;
    if (!causal) {
        out[0] = (dt_attn_piece_t){ 0, qrows, 0, krows, DT_CUDNN_FULL };
        return qrows > 0 && krows > 0;
    }
    /* the cells, and the whole block under one rule if one fits */
    rect_t all = { .q0 = 0, .q1 = qrows, .k0 = 0, .k1 = krows, .n = 0 };
    for (int a = 0, q0 = 0; a < nq; q0 += (int)qr[a].len, a++)
        for (int b = 0, k0 = 0; b < nk; k0 += (int)kr[b].len, b++) {
            cell_t *c = &cell[a * nk + b];
            c->q0 = q0;
            c->q1 = q0 + qr[a].len;
            c->k0 = k0;
            c->k1 = k0 + kr[b].len;
            c->lo = c->k0 - (c->q1 - 1);
            c->hi = (c->k1 - 1) - c->q0;
            /* kpos(j) <= qpos(i)  <=>  j - i <= (qpos0 - q0) - (kpos0 - k0) */
            c->d = clamp((qr[a].start - c->q0) - (kr[b].start - c->k0), c->lo - 1, c->hi);
            all.cells[all.n++] = a * nk + b;
        }
    for (int i = 0; i <= all.n; i++) {
        int64_t s = i < all.n ? cell[all.cells[i]].d : DT_CUDNN_FULL;
        int ok = 1;
        if (i < all.n && (s == cell[all.cells[i]].hi || s == cell[all.cells[i]].lo - 1))
            continue; /* a whole or empty cell's clamp is no rule for the others */
        for (int j = 0; j < all.n && ok; j++)
            ok = agrees(&cell[all.cells[j]], s);
        if (ok) {
            all.s = s;
            return to_piece(&all, &out[0]);
        }
    }
    /* else a rectangle per visible cell, merged along keys, then along queries */
    for (int a = 0; a < nq; a++)
        for (int b = 0; b < nk; b++) {
            const cell_t *c = &cell[a * nk + b];
            if (c->d == c->lo - 1)
                continue; /* nothing visible */
            rect_t r = { .q0 = c->q0, .q1 = c->q1, .k0 = c->k0, .k1 = c->k1,
                         .s = c->d == c->hi ? DT_CUDNN_FULL : c->d, .n = 1 };
            r.cells[0] = a * nk + b;
            int64_t s;
            if (nr > 0 && rect[nr - 1].q0 == r.q0 && rect[nr - 1].q1 == r.q1 &&
                rect[nr - 1].k1 == r.k0 && common_rule(cell, &rect[nr - 1], &r, &s) == 0)
                absorb(&rect[nr - 1], &r, s);
            else
                rect[nr++] = r;
        }
    for (int merged = 1; merged;) {
        merged = 0;
        for (int i = 0; i < nr && !merged; i++)
            for (int j = 0; j < nr && !merged; j++) {
                int64_t s;
                if (i == j || rect[i].k0 != rect[j].k0 || rect[i].k1 != rect[j].k1 ||
                    rect[i].q1 != rect[j].q0 || common_rule(cell, &rect[i], &rect[j], &s) < 0)
                    continue;
                absorb(&rect[i], &rect[j], s);
                rect[j] = rect[--nr];
                merged = 1;
            }
    }
    for (int i = 0; i < nr; i++)
        np += to_piece(&rect[i], &out[np]);
    return np;
}

/* ---- the kernel --------------------------------------------------------------- */

int dt_attn_block_cudnn(char *name, size_t len)
{
    dt_gpu_attn_t k = dt_gpu_attn_get();
    dt_emsg_t em = { 0 };
    size_t v;

    if (k == DT_GPU_ATTN_DT || k == DT_GPU_ATTN_WGMMA) {
        snprintf(name, len, "%s", dt_gpu_attn_name(k));
        return 0;
    }
    if ((v = dt_cudnn_version(&em)) == 0) {
        snprintf(name, len, "dt (%s%s)", k == DT_GPU_ATTN_CUDNN ? "DT_ATTN_KERNEL=cudnn, but " : "",
                 em.s);
        return 0;
    }
    snprintf(name, len, "cudnn %zu.%zu.%zu", v / 10000, v / 100 % 100, v % 100);
    return 1;
}

/* ---- scratch ------------------------------------------------------------------ */

#define ALIGN(n) (((size_t)(n) + 255) & ~(size_t)255)


static dt_cudnn_sdpa_t sdpa(const dt_attn_blk_t *b, const dt_attn_cuda_t *a, int64_t nq,
                            int64_t nk, int64_t shift, int64_t ldo)
{
    dt_cudnn_sdpa_t s = {
        .tq = nq, .tk = nk, .h = a->h, .hkv = a->hkv, .d = a->d, .dtype = a->dtype,
        .ldq = a->ldq, .ldk = a->ldk, .ldv = a->ldv, .ldo = ldo,
        .lddk = (int64_t)a->hkv * a->d, .shift = shift, .scale = a->scale, .det = b->det,
    };
    return s;
}

/* Bytes of the scratch of one call: the forward's o (dtype) and stats, or
 * the backward's packed lse, dq (dtype), dk and dv (dtype), then cuDNN's. */
static size_t own_bytes(const dt_cudnn_sdpa_t *s, int bwd)
{
    size_t esz = dt_dtype_size(s->dtype), q = (size_t)s->tq, k = (size_t)s->tk;

    if (!bwd)
        return ALIGN(q * (size_t)s->ldo * esz) + ALIGN((size_t)s->h * q * 4);
    return ALIGN((size_t)s->h * q * 4) + ALIGN(q * (size_t)s->ldo * esz) +
           2 * ALIGN(k * (size_t)s->lddk * esz);
}

/* The query rows of one call on keys nk. */
static int64_t chunk_rows(const dt_attn_blk_t *b, const dt_attn_cuda_t *a, int64_t nq,
                          int64_t nk, int bwd)
{
    if (b->rows > 0)
        return b->rows < nq ? b->rows : nq;
    return dt_attn_cudnn_rows(nq, nk, a->h, a->d, dt_dtype_size(a->dtype), bwd, b->det);
}

int dt_attn_block_bytes(const dt_attn_blk_t *b, int64_t tq, int64_t tk, int h, int hkv, int d,
                        dt_dtype_t dtype, int64_t ldo, int bwd, size_t *bytes, dt_emsg_t *em)
{
    dt_attn_cuda_t a = { .h = h, .hkv = hkv, .d = d, .dtype = dtype, .ldq = ldo,
                         .ldk = (int64_t)hkv * d, .ldv = (int64_t)hkv * d };
    int64_t nq = chunk_rows(b, &a, tq, tk, bwd);
    size_t most = 0;

    *bytes = 0;
    if (!b->cudnn || tq < 1 || tk < 1 || nq == 0)
        return 0; /* (nq 0: a deterministic backward too long for cuDNN, on dt's kernels) */
    for (int causal = 0; causal < 2; causal++) {
        dt_cudnn_sdpa_t s = sdpa(b, &a, nq, tk, causal ? 0 : DT_CUDNN_FULL, ldo);
        size_t w = 0;
        dt_emsg_t why = { 0 };
        if (dt_cudnn_supports(&s, bwd, &why) < 0)
            continue; /* those blocks go to dt's kernels */
        int rc = dt_cudnn_ws(&s, bwd, &w, em);
        if (rc < 0)
            return rc;
        w += own_bytes(&s, bwd);
        most = w > most ? w : most;
    }
    *bytes = most;
    return 0;
}

/* ---- calls -------------------------------------------------------------------- */

/* The block's runs, or its one run from the first position. */
static int runs_of(const dt_run_t *r, int n, int64_t first, int64_t len, dt_run_t *one,
                   const dt_run_t **out)
{
    if (r != NULL) {
        *out = r;
        return n;
    }
    one->start = first;
    one->len = len;
    *out = one;
    return 1;
}

/* Piece p of a for dt's kernels: its rows, positions kept. */
static dt_attn_cuda_t sub(const dt_attn_cuda_t *a, const dt_attn_piece_t *p)
{
    const size_t esz = dt_dtype_size(a->dtype);
    dt_attn_cuda_t b = *a;

    b.tq = p->nq;
    b.tk = p->nk;
    b.q = (const char *)a->q + (size_t)(p->qrow * a->ldq) * esz;
    b.k = (const char *)a->k + (size_t)(p->krow * a->ldk) * esz;
    b.v = (const char *)a->v + (size_t)(p->krow * a->ldv) * esz;
    b.q0 = a->q0 + p->qrow;
    b.k0 = a->k0 + p->krow;
    b.qpos = a->qpos ? a->qpos + p->qrow : NULL;
    b.kpos = a->kpos ? a->kpos + p->krow : NULL;
    return b;
}

/* Whether cuDNN runs piece s (else dt's kernels: the reason is not an error). */
static int cudnn_takes(const dt_attn_blk_t *b, const dt_cudnn_sdpa_t *s, int bwd, size_t *need,
                       dt_emsg_t *em)
{
    dt_emsg_t why = { 0 };
    size_t w = 0;

    if (dt_cudnn_supports(s, bwd, &why) < 0)
        return 0;
    int rc = dt_cudnn_ws(s, bwd, &w, em);
    if (rc == DT_ENOTSUP)
        return 0;
    if (rc < 0)
        return rc;
    *need = own_bytes(s, bwd) + w;
    return *need <= b->bytes;
}

dt_attn_piece_t dt_attn_piece_rows(const dt_attn_piece_t *w, int64_t r0, int64_t step)
{
    dt_attn_piece_t p = *w;

    p.qrow += r0;
    p.nq = w->nq - r0 < step ? w->nq - r0 : step;
    if (p.shift != DT_CUDNN_FULL) {
        p.shift += r0;
        /* causal: the keys after the last row's last are no one's, so a
         * chunk of rows takes its keys only up to there, rounded up to a
         * quarter of the piece's in multiples of 128: at most four key
         * lengths, so four cuDNN plans (each compiled once per process),
         * for most of the saving; and no key length of 64 mod 128 (cuDNN's
         * bad backward shapes, routed to dt's kernels) */
        const int64_t q = ((w->nk + 3) / 4 + 127) / 128 * 128;
        const int64_t seen = (p.nq + p.shift + q - 1) / q * q;
        if (seen < p.nk)
            p.nk = seen;
        if (p.shift >= p.nk - 1)
            p.shift = DT_CUDNN_FULL;
    }
    return p;
}

static int cut(const dt_attn_cuda_t *a, const dt_run_t *qr, int nqr, const dt_run_t *kr,
               int nkr, dt_attn_piece_t *pc)
{
    dt_run_t q1, k1;
    const dt_run_t *qs, *ks;
    int nq = runs_of(qr, nqr, a->q0, a->tq, &q1, &qs);
    int nk = runs_of(kr, nkr, a->k0, a->tk, &k1, &ks);

    return dt_attn_pieces(qs, nq, ks, nk, a->causal, pc);
}

int dt_attn_block_fwd(dt_attn_blk_t *b, const dt_attn_cuda_t *a, const dt_run_t *qr, int nqr,
                      const dt_run_t *kr, int nkr, int accumulate, float *o, int64_t ldo,
                      float *lse, int64_t ldlse, cudaStream_t st, dt_emsg_t *em)
{
    dt_attn_piece_t pc[DT_ATTN_MAXPIECES];
    const size_t esz = dt_dtype_size(a->dtype);
    int n, rc;

    if (!b->cudnn || a->qlo != NULL || (a->qpos != NULL && qr == NULL)) {
        b->pieces_dt++;
        return dt_attn_fwd_cuda(a, accumulate, o, ldo, lse, ldlse, st, em);
    }
    n = cut(a, qr, nqr, kr, nkr, pc);
    /* one piece over every row, not accumulating: each chunk's rows are
     * written once, so the first partial is set, not merged into an empty
     * state (one pass over o fewer) */
    const int first = !accumulate && n == 1 && pc[0].qrow == 0 && pc[0].nq == a->tq;
    if (!accumulate && !first &&
        (rc = dt_attn_empty_cuda(a->tq, a->h, a->d, o, ldo, lse, ldlse, st, em)) < 0)
        return rc;
    for (int i = 0; i < n; i++) {
        const dt_attn_piece_t *whole = &pc[i];
        const int64_t hd = (int64_t)a->h * a->d, step = chunk_rows(b, a, whole->nq, whole->nk, 0);
        for (int64_t r0 = 0; r0 < whole->nq; r0 += step) {
            dt_attn_piece_t pp = dt_attn_piece_rows(whole, r0, step);
            const dt_attn_piece_t *p = &pp;
            dt_cudnn_sdpa_t s = sdpa(b, a, p->nq, p->nk, p->shift, hd);
            size_t need = 0;
            int take = cudnn_takes(b, &s, 0, &need, em);
            if (take < 0)
                return take;
            if (!take) {
                dt_attn_cuda_t c = sub(a, p);
                b->pieces_dt++;
                rc = dt_attn_fwd_cuda(&c, !first, o + p->qrow * ldo, ldo, lse + p->qrow, ldlse,
                                      st, em);
                if (rc < 0)
                    return rc;
                continue;
            }
            char *oh = b->ws, *stats = oh + ALIGN((size_t)(p->nq * hd) * esz);
            char *cws = stats + ALIGN((size_t)a->h * (size_t)p->nq * 4);
            b->pieces_cudnn++;
            if ((rc = dt_cudnn_fwd(&s, (const char *)a->q + (size_t)(p->qrow * a->ldq) * esz,
                                   (const char *)a->k + (size_t)(p->krow * a->ldk) * esz,
                                   (const char *)a->v + (size_t)(p->krow * a->ldv) * esz, oh,
                                   (float *)(void *)stats, cws, st, em)) < 0 ||
                (rc = (first ? dt_attn_set_half_cuda : dt_attn_merge_half_cuda)(
                     p->nq, a->h, a->d, a->dtype, o + p->qrow * ldo, ldo, lse + p->qrow, ldlse,
                     oh, hd, (const float *)(const void *)stats, p->nq, st, em)) < 0)
                return rc;
        }
    }
    return 0;
}

int dt_attn_block_bwd(dt_attn_blk_t *b, const dt_attn_cuda_t *a, const dt_run_t *qr, int nqr,
                      const dt_run_t *kr, int nkr, const dt_attn_cuda_grad_t *g,
                      cudaStream_t st, dt_emsg_t *em)
{
    dt_attn_piece_t pc[DT_ATTN_MAXPIECES];
    const size_t esz = dt_dtype_size(a->dtype);
    int n, rc;

    if (!b->cudnn || b->ohalf == NULL || a->qlo != NULL || (a->qpos != NULL && qr == NULL)) {
        b->pieces_dt++;
        return dt_attn_bwd_cuda(a, g, st, em);
    }
    n = cut(a, qr, nqr, kr, nkr, pc);
    for (int i = 0; i < n; i++) {
        const dt_attn_piece_t *whole = &pc[i];
        const int64_t rows = chunk_rows(b, a, whole->nq, whole->nk, 1);
        const int64_t step = rows > 0 ? rows : whole->nq; /* 0: dt's kernels */
        /* query chunks bound the scratch (and cuDNN's deterministic dS) */
        for (int64_t r0 = 0; r0 < whole->nq; r0 += step) {
            dt_attn_piece_t p = dt_attn_piece_rows(whole, r0, step);
            dt_cudnn_sdpa_t s = sdpa(b, a, p.nq, p.nk, p.shift, g->lddo);
            size_t need = 0;
            int take = rows > 0 ? cudnn_takes(b, &s, 1, &need, em) : 0;
            if (take < 0)
                return take;
            if (!take) {
                dt_attn_cuda_t c = sub(a, &p);
                dt_attn_cuda_grad_t h = *g;
                h.dout = (const char *)g->dout + (size_t)(p.qrow * g->lddo) * esz;
                h.lse = g->lse + p.qrow;
                h.delta = g->delta + p.qrow;
                h.dq = g->dq + p.qrow * g->lddq;
                h.dk = g->dk + p.krow * g->lddk;
                h.dv = g->dv + p.krow * g->lddv;
                b->pieces_dt++;
                if ((rc = dt_attn_bwd_cuda(&c, &h, st, em)) < 0)
                    return rc;
                continue;
            }
            /* scratch: packed lse (h, nq), dq (nq rows at lddo), dk, dv (nk, hkv, d) */
            char *lp = b->ws, *dq = lp + ALIGN((size_t)a->h * (size_t)p.nq * 4);
            char *dk = dq + ALIGN((size_t)(p.nq * g->lddo) * esz);
            char *dv = dk + ALIGN((size_t)(p.nk * s.lddk) * esz);
            char *cws = dv + ALIGN((size_t)(p.nk * s.lddk) * esz);
            const int64_t kw = (int64_t)a->hkv * a->d;
            const void *oh = (const char *)b->ohalf + (size_t)(p.qrow * g->lddo) * esz;
            b->pieces_cudnn++;
            if ((rc = dt_dilate_gather_rows_cuda(p.nq, a->h, g->lse, g->ldlse, p.qrow, 1, 0,
                                                 (float *)(void *)lp, st, em)) < 0 ||
                (rc = dt_cudnn_bwd(&s, (const char *)a->q + (size_t)(p.qrow * a->ldq) * esz,
                                   (const char *)a->k + (size_t)(p.krow * a->ldk) * esz,
                                   (const char *)a->v + (size_t)(p.krow * a->ldv) * esz,
                                   oh,
                                   (const char *)g->dout + (size_t)(p.qrow * g->lddo) * esz,
                                   (const float *)(const void *)lp, dq, dk, dv, cws, st, em)) < 0 ||
                (rc = dt_attn_add_half_cuda(p.nq, (int64_t)a->h * a->d, a->dtype, dq, g->lddo,
                                            g->dq + p.qrow * g->lddq, g->lddq, st, em)) < 0 ||
                (rc = dt_attn_add_half_cuda(p.nk, kw, a->dtype, dk, s.lddk,
                                            g->dk + p.krow * g->lddk, g->lddk, st, em)) < 0 ||
                (rc = dt_attn_add_half_cuda(p.nk, kw, a->dtype, dv, s.lddk,
                                            g->dv + p.krow * g->lddv, g->lddv, st, em)) < 0)
                return rc;
        }
    }
    return 0;
}
