/* SPDX-License-Identifier: MIT
 *
 * One-head attention on the CPU: the fast path in several kernels and the
 * plain reference (attn_ref.c) they are tested against.
 *
 * - The packed kernels (attn_cpu_isa.h, included below once per
 *   instruction set: AVX-512, AVX2+FMA, generic 4-lane vectors): K^T (and
 *   V^T for the backward) packed once per call, every matrix product a
 *   6-row register tile, causal diagonal tiles cut per 6-row block.
 * - The blas kernel (this file's first half): the same flash-style tiles,
 *   both matrix products per tile through cblas_sgemm, for any head size;
 *   its element-wise loops are the vector kernels' (AVX2+FMA or generic).
 *
 * dt_attn_head_fwd_cpu / _bwd_cpu pick the kernel (the end of this file).
 * Not here: multi-head layout, rings or dilation (engine/attn/attn.c).
 */
#include "config.h"

#include <cblas.h>
#include <math.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#include "common/mem.h"
#include "kernels/cpu/attn_cpu.h"
#include "spec/mask.h"

/* The blas kernel's tiles: BQ query rows by BK keys. The score tile (BQ x BK floats,
 * 128 KiB) stays in L2 between the two products. */
#ifndef BQ
#define BQ 128
#endif
#ifndef BK
#define BK 256
#endif

/* The blas kernel's element-wise loops are the vector kernels' (the end
 * of this file): the widest instance this CPU runs. */
static float row_max(const float *s, int n);
static float row_exp2_sum(float *s, int n, float m);
static void row_bwd(float *s, float *dp, int n, float lse, float delta);

/* Mask one score row of query position qp against keys kpos[0 .. n): the
 * entries a key may not be attended from become -inf (causal by position,
 * or the head's mask). */
static void mask_row(const dt_attn_head_t *a, float *row, int64_t qp, const int64_t *kpos, int n)
{
    if (a->mask == NULL) {
        for (int j = 0; j < n; j++)
            if (kpos[j] > qp)
                row[j] = -INFINITY;
        return;
    }
    int64_t lo, hi;
    dt_mask_row(a->mask, qp, &lo, &hi);
    for (int j = 0; j < n; j++)
        if (kpos[j] < lo || kpos[j] >= hi ||
            (a->mask->block > 0 && !dt_mask_allows(a->mask, a->head, qp, kpos[j])))
            row[j] = -INFINITY;
}

/* Mask the score tile (bq rows of stride ld, bk keys). */
static void mask_tile(const dt_attn_head_t *a, float *s, int ld, int bq, int bk,
                      const int64_t *qpos, const int64_t *kpos)
{
    for (int r = 0; r < bq; r++)
        mask_row(a, s + (int64_t)r * ld, qpos[r], kpos, bk);
}

/* The pairs of queries with positions in [qlo, qhi] against keys in [klo,
 * khi]: DT_MASK_EMPTY, _PARTIAL or _FULL (causal by position, or the
 * head's mask). */
static enum dt_mask_box tile_box(const dt_attn_head_t *a, int64_t qlo, int64_t qhi, int64_t klo,
                                 int64_t khi)
{
    if (a->mask)
        return dt_mask_box(a->mask, a->head, qlo, qhi, klo, khi);
    if (klo > qhi)
        return DT_MASK_EMPTY; /* every key after every query */
    return khi <= qlo ? DT_MASK_FULL : DT_MASK_PARTIAL;
}

static void minmax(const int64_t *p, int64_t n, int64_t *lo, int64_t *hi)
{
    int64_t a = p[0], b = p[0];
    for (int64_t i = 1; i < n; i++) {
        a = p[i] < a ? p[i] : a;
        b = p[i] > b ? p[i] : b;
    }
    *lo = a;
    *hi = b;
}

/* Per-key-tile position bounds, so whole tiles can be skipped or left
 * unmasked. kb has 2 * ceil(tk / BK) entries. */
static int64_t *key_tile_bounds(const dt_attn_head_t *a)
{
    int64_t nt = (a->tk + BK - 1) / BK;
    int64_t *kb = dt_xmallocarray((size_t)(2 * nt), sizeof(*kb));
    for (int64_t t = 0; t < nt; t++) {
        int64_t j0 = t * BK, n = a->tk - j0 < BK ? a->tk - j0 : BK;
        minmax(a->kpos + j0, n, &kb[2 * t], &kb[2 * t + 1]);
    }
    return kb;
}

static void fwd_blas(const dt_attn_head_t *a, float *o, int64_t ldo, float *lse)
{
    const int d = a->d;
    const int causal = a->qpos != NULL && a->kpos != NULL;
    float *s = dt_xaligned(BQ * BK, sizeof(float));
    int64_t *kb = causal && a->tk > 0 ? key_tile_bounds(a) : NULL;
    float m[BQ], l[BQ];

    for (int64_t i0 = 0; i0 < a->tq; i0 += BQ) {
        int bq = (int)(a->tq - i0 < BQ ? a->tq - i0 : BQ);
        int64_t qlo = 0, qhi = 0;
        int any = 0;
        if (causal)
            minmax(a->qpos + i0, bq, &qlo, &qhi);

        /* the running maximum in log2 units, as the vector kernels keep it */
        for (int r = 0; r < bq; r++) {
            float x = lse[i0 + r];
            int none = isinf(x) && x < 0;
            m[r] = none ? -INFINITY : x * 1.44269504088896341f;
            l[r] = none ? 0.0f : 1.0f;
        }
        for (int64_t j0 = 0; j0 < a->tk; j0 += BK) {
            int bk = (int)(a->tk - j0 < BK ? a->tk - j0 : BK);
            int full = 1;
            if (causal) {
                int64_t t = j0 / BK;
                enum dt_mask_box bx = tile_box(a, qlo, qhi, kb[2 * t], kb[2 * t + 1]);
                if (bx == DT_MASK_EMPTY)
                    continue;
                full = bx == DT_MASK_FULL;
            }
            any = 1;
            cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, bq, bk, d, a->scale,
                        a->q + i0 * a->ldq, (int)a->ldq, a->k + j0 * a->ldk, (int)a->ldk, 0.0f,
                        s, BK);
            if (!full)
                mask_tile(a, s, BK, bq, bk, a->qpos + i0, a->kpos + j0);
            for (int r = 0; r < bq; r++) {
                float *row = s + (int64_t)r * BK;
                float mx = row_max(row, bk) * 1.44269504088896341f;
                float mn = mx > m[r] ? mx : m[r];
                float *orow = o + (i0 + r) * ldo;
                if (isinf(mn) && mn < 0) {
                    memset(row, 0, (size_t)bk * sizeof(float));
                    continue;
                }
                float alpha = l[r] > 0.0f ? exp2f(m[r] - mn) : 0.0f;
                float sum = row_exp2_sum(row, bk, mn);
                if (alpha == 0.0f)
                    memset(orow, 0, (size_t)d * sizeof(float));
                else if (alpha != 1.0f)
                    for (int c = 0; c < d; c++)
                        orow[c] *= alpha;
                l[r] = l[r] * alpha + sum;
                m[r] = mn;
            }
            cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, bq, d, bk, 1.0f, s, BK,
                        a->v + j0 * a->ldv, (int)a->ldv, 1.0f, o + i0 * ldo, (int)ldo);
            if (a->progress)
                a->progress(a->progress_arg);
        }
        if (!any)
            continue;
        for (int r = 0; r < bq; r++) {
            float *orow = o + (i0 + r) * ldo;
            if (l[r] > 0.0f) {
                float inv = 1.0f / l[r];
                for (int c = 0; c < d; c++)
                    orow[c] *= inv;
                lse[i0 + r] = m[r] * 0.693147180559945309f + logf(l[r]);
            }
        }
    }
    free(kb);
    free(s);
}

static void bwd_blas(const dt_attn_head_t *a, const dt_attn_head_grad_t *g)
{
    const int d = a->d;
    const int causal = a->qpos != NULL && a->kpos != NULL;
    float *s = dt_xaligned(BQ * BK, sizeof(float));
    float *dp = dt_xaligned(BQ * BK, sizeof(float));
    int64_t *kb = causal && a->tk > 0 ? key_tile_bounds(a) : NULL;

    for (int64_t i0 = 0; i0 < a->tq; i0 += BQ) {
        int bq = (int)(a->tq - i0 < BQ ? a->tq - i0 : BQ);
        int64_t qlo = 0, qhi = 0;
        if (causal)
            minmax(a->qpos + i0, bq, &qlo, &qhi);
        for (int64_t j0 = 0; j0 < a->tk; j0 += BK) {
            int bk = (int)(a->tk - j0 < BK ? a->tk - j0 : BK);
            int full = 1;
            if (causal) {
                int64_t t = j0 / BK;
                enum dt_mask_box bx = tile_box(a, qlo, qhi, kb[2 * t], kb[2 * t + 1]);
                if (bx == DT_MASK_EMPTY)
                    continue;
                full = bx == DT_MASK_FULL;
            }
            /* s = scale q k^T, masked */
            cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, bq, bk, d, a->scale,
                        a->q + i0 * a->ldq, (int)a->ldq, a->k + j0 * a->ldk, (int)a->ldk, 0.0f,
                        s, BK);
            if (!full)
                mask_tile(a, s, BK, bq, bk, a->qpos + i0, a->kpos + j0);
            /* dp = dout v^T */
            cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, bq, bk, d, 1.0f,
                        g->dout + i0 * g->lddo, (int)g->lddo, a->v + j0 * a->ldv, (int)a->ldv,
                        0.0f, dp, BK);
            for (int r = 0; r < bq; r++) {
                float l = g->lse[i0 + r];
                float *srow = s + (int64_t)r * BK, *dprow = dp + (int64_t)r * BK;
                if (isinf(l) && l < 0) {
                    memset(srow, 0, (size_t)bk * sizeof(float));
                    memset(dprow, 0, (size_t)bk * sizeof(float));
                    continue;
                }
                row_bwd(srow, dprow, bk, l, g->delta[i0 + r]);
            }
            /* dv += p^T dout; dq += scale ds k; dk += scale ds^T q */
            cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, bk, d, bq, 1.0f, s, BK,
                        g->dout + i0 * g->lddo, (int)g->lddo, 1.0f, g->dv + j0 * a->ldv,
                        (int)a->ldv);
            cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, bq, d, bk, a->scale, dp, BK,
                        a->k + j0 * a->ldk, (int)a->ldk, 1.0f, g->dq + i0 * a->ldq, (int)a->ldq);
            cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, bk, d, bq, a->scale, dp, BK,
                        a->q + i0 * a->ldq, (int)a->ldq, 1.0f, g->dk + j0 * a->ldk, (int)a->ldk);
            if (a->progress)
                a->progress(a->progress_arg);
        }
    }
    free(kb);
    free(dp);
    free(s);
}

/* ---- the packed kernels ------------------------------------------------ */

/* Query tiles of BQP rows against key tiles of BKP keys; the micro-tiles
 * are DT_MR rows (attn_cpu_isa.h). */
#ifndef BQP
#define BQP 96
#endif
#ifndef BKP
#define BKP 128
#endif
#define DT_MR 6
#define NRB ((BQP + DT_MR - 1) / DT_MR)

/* Per-key-tile position bounds and whether the tile's positions ascend. */
typedef struct tiles {
    int causal;
    int64_t *kb;    /* min, max per key tile */
    uint8_t *asc;   /* positions non-decreasing within the tile */
} tiles_t;

/* One (query tile, key tile) pair: full means no key lies after any query;
 * otherwise row block b (DT_MR rows) needs only the first lim[b] keys
 * (every later key is after all of its queries; the keys before are masked
 * one by one). */
typedef struct tile {
    int full, bk, d;
    float scale;
    const dt_attn_head_t *a;
    const int64_t *qpos, *kpos;
    int lim[NRB];
} tile_t;

static void tiles_init(tiles_t *ts, const dt_attn_head_t *a, int mr)
{
    (void)mr;
    memset(ts, 0, sizeof(*ts));
    ts->causal = a->qpos != NULL && a->kpos != NULL;
    if (!ts->causal || a->tk == 0)
        return;
    int64_t nt = (a->tk + BKP - 1) / BKP;
    ts->kb = dt_xmallocarray((size_t)(2 * nt), sizeof(*ts->kb));
    ts->asc = dt_xmallocarray((size_t)nt, 1);
    for (int64_t t = 0; t < nt; t++) {
        int64_t j0 = t * BKP, n = a->tk - j0 < BKP ? a->tk - j0 : BKP;
        const int64_t *p = a->kpos + j0;
        minmax(p, n, &ts->kb[2 * t], &ts->kb[2 * t + 1]);
        uint8_t up = 1;
        for (int64_t j = 1; j < n && up; j++)
            up = p[j] >= p[j - 1];
        ts->asc[t] = up;
    }
}

static void tiles_free(tiles_t *ts)
{
    free(ts->kb);
    free(ts->asc);
}

/* The pair at query rows [i0, i0 + bq), keys [j0, ...): 0 when every key
 * is after every query (nothing to do). */
static int tile_at(const tiles_t *ts, const dt_attn_head_t *a, int64_t i0, int bq, int64_t j0,
                   tile_t *tl)
{
    int nb = (bq + DT_MR - 1) / DT_MR;
    tl->bk = (int)(a->tk - j0 < BKP ? a->tk - j0 : BKP);
    tl->d = a->d;
    tl->scale = a->scale;
    tl->full = 1;
    tl->a = a;
    tl->qpos = ts->causal ? a->qpos + i0 : NULL;
    tl->kpos = ts->causal ? a->kpos + j0 : NULL;
    for (int b = 0; b < nb; b++)
        tl->lim[b] = tl->bk;
    if (!ts->causal)
        return 1;
    int64_t qlo, qhi, t = j0 / BKP;
    minmax(tl->qpos, bq, &qlo, &qhi);
    enum dt_mask_box bx = tile_box(a, qlo, qhi, ts->kb[2 * t], ts->kb[2 * t + 1]);
    if (bx == DT_MASK_EMPTY)
        return 0;
    tl->full = bx == DT_MASK_FULL;
    /* a row block's keys after its last query are cut where causality
     * rules them out (a mask without it is applied key by key) */
    if (tl->full || !ts->asc[t] || (a->mask && !a->mask->causal))
        return 1;
    /* ascending keys: a row block needs the keys up to its last query */
    for (int b = 0; b < nb; b++) {
        int r0 = b * DT_MR, nr = bq - r0 < DT_MR ? bq - r0 : DT_MR;
        int64_t lo, hi;
        minmax(tl->qpos + r0, nr, &lo, &hi);
        int l = 0, h = tl->bk; /* first key after hi */
        while (l < h) {
            int mid = (l + h) / 2;
            if (tl->kpos[mid] <= hi)
                l = mid + 1;
            else
                h = mid;
        }
        tl->lim[b] = l;
    }
    return 1;
}

/* Per-thread scratch for the packed kernels' buffers (the packed K^T, V,
 * ..., the query tile's packs and the score tiles), kept from call to
 * call: a call gets its buffers without touching fresh pages, and a run of
 * calls holds one set of the largest it needed rather than what the
 * allocator keeps of many (glibc's mmap threshold rises after the first
 * free, and the heap then kept a packed copy per head). Freed when the
 * thread ends. Slots: SCR_* below. */
enum { SCR_K0, SCR_K1, SCR_K2, SCR_Q0, SCR_Q1, SCR_Q2, SCR_Q3, SCR_S0, SCR_S1, SCR_N };

/* What a slot holds when it holds a packed copy of K or V: the caller's
 * name for the content (dt_attn_head_t.kv_id, never 0 here) and the
 * packing's source and shape. A call whose tag matches uses the copy as
 * it is: the query heads of one GQA group share their K and V packs. */
typedef struct pack_tag {
    uint64_t id;
    const float *x;
    int64_t ldx, tk;
    int d, trans, nb;
} pack_tag_t;

typedef struct scratch {
    float *p[SCR_N];
    size_t n[SCR_N];
    pack_tag_t tag[SCR_N]; /* id 0: not a copy anyone may reuse */
} scratch_t;
static pthread_key_t scratch_key;
static pthread_once_t scratch_once = PTHREAD_ONCE_INIT;

static void scratch_free(void *arg)
{
    scratch_t *sc = arg;
    for (int i = 0; i < SCR_N; i++)
        free(sc->p[i]);
    free(sc);
}

static void scratch_key_make(void)
{
    if (pthread_key_create(&scratch_key, scratch_free) != 0)
        abort();
}

/* This thread's slot `slot`, at least n floats, 64-byte aligned. With
 * tag NULL its contents are whatever the last call left (and no longer a
 * copy to reuse). With a tag (id nonzero): *hit = 1 when the slot already
 * holds that packed copy, else 0 and the caller packs it, the slot then
 * tagged. */
static float *scratch_tagged(int slot, size_t n, const pack_tag_t *tag, int *hit)
{
    pthread_once(&scratch_once, scratch_key_make);
    scratch_t *sc = pthread_getspecific(scratch_key);
    if (sc == NULL) {
        sc = dt_xcalloc(1, sizeof(*sc));
        if (pthread_setspecific(scratch_key, sc) != 0)
            abort();
    }
    pack_tag_t *t = &sc->tag[slot];
    if (tag != NULL && sc->n[slot] >= n && t->id == tag->id && t->x == tag->x &&
        t->ldx == tag->ldx && t->tk == tag->tk && t->d == tag->d && t->trans == tag->trans &&
        t->nb == tag->nb) {
        *hit = 1;
        return sc->p[slot];
    }
    if (sc->n[slot] < n) {
        free(sc->p[slot]);
        sc->p[slot] = dt_xaligned(n, sizeof(float));
        sc->n[slot] = n;
    }
    if (tag != NULL) {
        *t = *tag;
        *hit = 0;
    } else {
        t->id = 0;
    }
    return sc->p[slot];
}

static float *scratch(int slot, size_t n)
{
    return scratch_tagged(slot, n, NULL, NULL);
}

uint64_t dt_attn_kv_ids(uint64_t n)
{
    static uint64_t next = 1;
    return __atomic_fetch_add(&next, n, __ATOMIC_RELAXED);
}

/* The vector helpers are static and always inlined, so no vector value
 * crosses a call boundary and the psABI note about wide returns is moot. */
#pragma GCC diagnostic ignored "-Wpsabi"

#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__)
#define DT_ATTN_X86 1
#include <immintrin.h>

#pragma GCC push_options
#pragma GCC target("arch=x86-64-v4")
#define ISA(x) x##_avx512
#define VL 16
#define NRV 4
#define DT_ISA_SCALEF 1
#define DT_ISA_VMAX(x, y) _mm512_max_ps((__m512)(x), (__m512)(y))
#include "kernels/cpu/attn_cpu_isa.h"
#undef DT_ISA_VMAX
#undef DT_ISA_SCALEF
#undef NRV
#undef VL
#undef ISA
#pragma GCC pop_options

#pragma GCC push_options
#pragma GCC target("arch=x86-64-v3")
#define ISA(x) x##_avx2
#define VL 8
#define NRV 2
#define DT_ISA_VMAX(x, y) _mm256_max_ps((__m256)(x), (__m256)(y))
#include "kernels/cpu/attn_cpu_isa.h"
#undef DT_ISA_VMAX
#undef NRV
#undef VL
#undef ISA
#pragma GCC pop_options
#endif

#define ISA(x) x##_generic
#define VL 4
#define NRV 2
#include "kernels/cpu/attn_cpu_isa.h"
#undef NRV
#undef VL
#undef ISA

static float row_max(const float *s, int n)
{
#ifdef DT_ATTN_X86
    if (__builtin_cpu_supports("x86-64-v3"))
        return row_max_avx2(s, n);
#endif
    return row_max_generic(s, n);
}

static float row_exp2_sum(float *s, int n, float m)
{
#ifdef DT_ATTN_X86
    if (__builtin_cpu_supports("x86-64-v3"))
        return row_exp2_sum_avx2(s, n, m);
#endif
    return row_exp2_sum_generic(s, n, m);
}

static void row_bwd(float *s, float *dp, int n, float lse, float delta)
{
#ifdef DT_ATTN_X86
    if (__builtin_cpu_supports("x86-64-v3")) {
        row_bwd_avx2(s, dp, n, lse, delta);
        return;
    }
#endif
    row_bwd_generic(s, dp, n, lse, delta);
}

/* ---- choosing a kernel ------------------------------------------------- */

typedef struct kernel {
    const char *name;
    int vl; /* d must be a multiple */
    void (*fwd)(const dt_attn_head_t *, float *, int64_t, float *);
    void (*bwd)(const dt_attn_head_t *, const dt_attn_head_grad_t *);
} kernel_t;

static const kernel_t kernels[] = {
#ifdef DT_ATTN_X86
    { "avx512", 16, fwd_avx512, bwd_avx512 },
    { "avx2", 8, fwd_avx2, bwd_avx2 },
#endif
    { "generic", 4, fwd_generic, bwd_generic },
    { "blas", 1, fwd_blas, bwd_blas },
};
#define NKERNELS ((int)(sizeof(kernels) / sizeof(kernels[0])))

static int runs_here(const kernel_t *k)
{
#ifdef DT_ATTN_X86
    __builtin_cpu_init();
    if (strcmp(k->name, "avx512") == 0)
        return __builtin_cpu_supports("x86-64-v4");
    if (strcmp(k->name, "avx2") == 0)
        return __builtin_cpu_supports("x86-64-v3");
#endif
    (void)k;
    return 1;
}

/* The first kernel tried: set by dt_attn_cpu_kernel_set, else
 * $DT_ATTN_KERNEL, else the widest this CPU runs. -1: not chosen yet. */
static int first = -1;
static pthread_once_t first_once = PTHREAD_ONCE_INIT;

static void first_from_env(void)
{
    if (first < 0 && dt_attn_cpu_kernel_set(getenv("DT_ATTN_KERNEL")) < 0)
        dt_attn_cpu_kernel_set("auto");
}

int dt_attn_cpu_kernel_set(const char *name)
{
    if (name == NULL || *name == '\0' || strcmp(name, "auto") == 0) {
        for (int i = 0; i < NKERNELS; i++)
            if (runs_here(&kernels[i])) {
                first = i;
                return 0;
            }
    }
    for (int i = 0; i < NKERNELS; i++)
        if (strcmp(name, kernels[i].name) == 0) {
            if (!runs_here(&kernels[i]))
                return -1;
            first = i;
            return 0;
        }
    return -1;
}

const char *dt_attn_cpu_kernel_names(void)
{
#ifdef DT_ATTN_X86
    return "auto, avx512, avx2, generic, blas";
#else
    return "auto, generic, blas";
#endif
}

/* The kernel for head size d: the first from `first` on whose vector width
 * divides d (blas takes any d). */
static const kernel_t *pick(int d)
{
    pthread_once(&first_once, first_from_env);
    for (int i = first; i < NKERNELS; i++)
        if (d % kernels[i].vl == 0 && runs_here(&kernels[i]))
            return &kernels[i];
    return &kernels[NKERNELS - 1];
}

const char *dt_attn_cpu_kernel_first(void)
{
    pthread_once(&first_once, first_from_env);
    return kernels[first].name;
}

const char *dt_attn_cpu_kernel(int d)
{
    return pick(d)->name;
}

void dt_attn_head_fwd_cpu(const dt_attn_head_t *a, float *o, int64_t ldo, float *lse)
{
    if (a->tq <= 0 || a->tk <= 0)
        return;
    if (a->qlo) { /* intervals: the reference's (attn_cpu.h) */
        dt_attn_head_fwd_ref(a, o, ldo, lse);
        return;
    }
    pick(a->d)->fwd(a, o, ldo, lse);
}

void dt_attn_head_bwd_cpu(const dt_attn_head_t *a, const dt_attn_head_grad_t *g)
{
    if (a->tq <= 0 || a->tk <= 0)
        return;
    if (a->qlo) {
        dt_attn_head_bwd_ref(a, g);
        return;
    }
    pick(a->d)->bwd(a, g);
}
