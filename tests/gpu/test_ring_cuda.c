/* SPDX-License-Identifier: MIT
 *
 * GPU ring attention (engine/attn/ring_cuda.h) against the CPU reference in
 * double (kernels/cpu/attn_ref.c) computed on the same bf16/fp16-rounded
 * inputs: local rings of R = 1, 2, 3, 4, 8 ranks on one device, both
 * layouts, causal and not, GQA (H = 4, Hkv = 2), D = 64 and 128, forward
 * and backward; one fp16 case; a one-rank NCCL ring bit-identical to the
 * local ring of one; abort; all-reduce; dilated specs whose segments lie on
 * one rank, and dilated specs whose segments cross rank boundaries (sub-rings
 * of the ranks holding each segment: w = T, w = 2c, segments straddling a
 * boundary, zigzag segments over both runs of a rank, slivers of one or two
 * positions, branches mixed with local ones, R = 2, 3, 4, 8), against a
 * reference assembled from per-segment, per-head-chunk dense references
 * merged by LSE; the ring still runs a dense spec afterwards. With two
 * GPUs or more, NCCL rings across them (one thread per rank and device,
 * R = 2, 4, 8 as devices allow): dense and dilated against the reference,
 * then a peer that never joins and one aborted by a failure event, which
 * must end the other ranks with DT_ECOMM, not a hang; with one GPU that
 * part says it skipped (NCCL takes one rank per GPU).
 *
 * Tolerances (inputs are rounded to the kernel's type first, so what is
 * measured is the kernels' own arithmetic: products of the rounded
 * probabilities P, fp32 everywhere else):
 *   o    |err| <= 2e-2 (bf16: P rounded to 8 bits), 4e-3 (fp16: 11 bits)
 *   lse  |err| <= 1e-3 (fp32 sums of exact products)
 *   dq, dk, dv  |err| <= tol * max|ref|, tol 3e-2 (bf16), 5e-3 (fp16):
 *        dS is rounded like P before its two products (about 8 u, the
 *        bound of tests/gpu/test_attn_cuda.c), and delta comes from the
 *        GPU's own o (fp16 bound a little above that test's 4e-3)
 *   growth: err(R = 8) <= 1.5 err(R = 1) + 1e-3 (partials stay fp32)
 *
 * Not a criterion suite: tests/gpu/gpucheck.h; exit 77 without a device.
 */
#include "config.h"

#include <math.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <cuda_runtime_api.h>

#include "common/clock.h"
#include "common/mem.h"
#include "engine/attn/attn.h"
#include "spec/layout.h"
#include "engine/attn/ring_cuda.h"
#include "kernels/cpu/attn_cpu.h"
#include "tests/gpu/gpucheck.h"

#define TOL_O_BF16 2e-2
#define TOL_O_F16 4e-3
#define TOL_LSE 1e-3
#define TOL_G_BF16 3e-2
#define TOL_G_F16 5e-3

/* ---- numbers ---------------------------------------------------------------- */

static uint64_t rng_state;

static float uniform(float lo, float hi)
{
    rng_state = rng_state * 6364136223846793005ULL + 1442695040888963407ULL;
    return lo + (hi - lo) * (float)((rng_state >> 40) * (1.0 / 16777216.0));
}

/* Random values in [lo, hi] rounded to dtype: bits for the GPU, floats for
 * the reference. */
static void fill(dt_dtype_t dt, size_t n, float lo, float hi, uint16_t *bits, float *x)
{
    for (size_t i = 0; i < n; i++) {
        float f = uniform(lo, hi);
        bits[i] = dt_half_bits(dt, f);
        x[i] = dt_half_value(dt, bits[i]);
    }
}

/* ---- a problem and its reference -------------------------------------------- */

typedef struct problem {
    dt_attn_spec_t s;
    dt_dtype_t dt;
    /* the whole sequence in position order: q, dout (T, H, D); k, v (T, Hkv, D) */
    uint16_t *q16, *k16, *v16, *do16;
    float *q, *k, *v, *dout;
    /* reference: o (T, H, D), lse (H, T), dq (T, H, D), dk and dv (T, Hkv, D) */
    float *o, *lse, *dq, *dk, *dv;
} problem_t;

static void problem_init(problem_t *p, const dt_attn_spec_t *s, dt_dtype_t dt, uint64_t seed)
{
    size_t nq = (size_t)s->T * s->H * s->D, nk = (size_t)s->T * s->Hkv * s->D;

    memset(p, 0, sizeof(*p));
    p->s = *s;
    p->dt = dt;
    rng_state = seed;
    p->q16 = dt_xmallocarray(nq, 2);
    p->do16 = dt_xmallocarray(nq, 2);
    p->k16 = dt_xmallocarray(nk, 2);
    p->v16 = dt_xmallocarray(nk, 2);
    p->q = dt_xmallocarray(nq, sizeof(float));
    p->dout = dt_xmallocarray(nq, sizeof(float));
    p->k = dt_xmallocarray(nk, sizeof(float));
    p->v = dt_xmallocarray(nk, sizeof(float));
    fill(dt, nq, -1.5f, 1.5f, p->q16, p->q);
    fill(dt, nk, -1.5f, 1.5f, p->k16, p->k);
    fill(dt, nk, -1.0f, 1.0f, p->v16, p->v);
    fill(dt, nq, -1.0f, 1.0f, p->do16, p->dout);
    p->o = dt_xcalloc(nq, sizeof(float));
    p->lse = dt_xmallocarray((size_t)s->T * s->H, sizeof(float));
    p->dq = dt_xcalloc(nq, sizeof(float));
    p->dk = dt_xcalloc(nk, sizeof(float));
    p->dv = dt_xcalloc(nk, sizeof(float));
    for (int64_t i = 0; i < s->T * s->H; i++)
        p->lse[i] = -INFINITY;
}

static void problem_free(problem_t *p)
{
    free(p->q16);
    free(p->do16);
    free(p->k16);
    free(p->v16);
    free(p->q);
    free(p->dout);
    free(p->k);
    free(p->v);
    free(p->o);
    free(p->lse);
    free(p->dq);
    free(p->dk);
    free(p->dv);
}

static float scale_of(const dt_attn_spec_t *s)
{
    return s->scale != 0.0f ? s->scale : 1.0f / sqrtf((float)s->D);
}

/* Dense attention over the whole sequence, forward and backward. */
static void reference_dense(problem_t *p)
{
    const dt_attn_spec_t *s = &p->s;
    const int64_t T = s->T, H = s->H, D = s->D, g = s->H / s->Hkv;
    int64_t *pos = dt_xmallocarray((size_t)T, sizeof(int64_t));
    float *delta = dt_xmallocarray((size_t)(T * H), sizeof(float));

    for (int64_t i = 0; i < T; i++)
        pos[i] = i;
    for (int64_t h = 0; h < H; h++) {
        dt_attn_head_t a = {
            .tq = T, .tk = T, .d = (int)D,
            .q = p->q + h * D, .ldq = H * D,
            .k = p->k + (h / g) * D, .ldk = s->Hkv * D,
            .v = p->v + (h / g) * D, .ldv = s->Hkv * D,
            .qpos = s->causal ? pos : NULL, .kpos = s->causal ? pos : NULL,
            .scale = scale_of(s),
        };
        dt_attn_head_fwd_ref(&a, p->o + h * D, H * D, p->lse + h * T);
        dt_attn_delta_cpu(T, (int)D, p->dout + h * D, H * D, p->o + h * D, H * D, delta + h * T);
        dt_attn_head_grad_t gd = {
            .dout = p->dout + h * D, .lddo = H * D,
            .lse = p->lse + h * T, .delta = delta + h * T,
            .dq = p->dq + h * D, .dk = p->dk + (h / g) * D, .dv = p->dv + (h / g) * D,
        };
        dt_attn_head_bwd_ref(&a, &gd);
    }
    free(delta);
    free(pos);
}

/* Dilated attention: per branch, segment, head chunk and head, a dense
 * reference on the gathered rows, merged into (o, lse) by LSE; then the
 * backward of each such block with the final lse and delta, scattered
 * back. */
static void reference_dilated(problem_t *p)
{
    const dt_attn_spec_t *s = &p->s;
    const int64_t T = s->T, H = s->H, D = s->D, HK = s->Hkv, g = s->H / s->Hkv;
    float *delta = dt_xmallocarray((size_t)(T * H), sizeof(float));
    float *qh = dt_xmallocarray((size_t)(T * D), sizeof(float));
    float *kh = dt_xmallocarray((size_t)(T * D), sizeof(float));
    float *vh = dt_xmallocarray((size_t)(T * D), sizeof(float));
    float *doh = dt_xmallocarray((size_t)(T * D), sizeof(float));
    float *o2 = dt_xmallocarray((size_t)(T * D), sizeof(float));
    float *dqh = dt_xmallocarray((size_t)(T * D), sizeof(float));
    float *dkh = dt_xmallocarray((size_t)(T * D), sizeof(float));
    float *dvh = dt_xmallocarray((size_t)(T * D), sizeof(float));
    float *l2 = dt_xmallocarray((size_t)T, sizeof(float));
    float *lh = dt_xmallocarray((size_t)T, sizeof(float));
    float *dh = dt_xmallocarray((size_t)T, sizeof(float));
    int64_t *idx = dt_xmallocarray((size_t)T, sizeof(int64_t)), *rows = dt_xmallocarray((size_t)T, sizeof(int64_t));

    for (int64_t i = 0; i < T; i++)
        idx[i] = i;
    for (int pass = 0; pass < 2; pass++) {
        if (pass == 1)
            for (int64_t h = 0; h < H; h++)
                dt_attn_delta_cpu(T, (int)D, p->dout + h * D, H * D, p->o + h * D, H * D,
                                  delta + h * T);
        for (int b = 0; b < s->nbranch; b++) {
            dt_attn_branch_t br = dt_attn_branch(s, b);
            for (int64_t a0 = 0; a0 < T; a0 += br.w) {
                int64_t e = a0 + br.w < T ? a0 + br.w : T;
                for (int k = 0; k < br.nchunk; k++) {
                    dt_attn_chunk_t ck = dt_attn_chunk(s, &br, k);
                    int64_t n = 0;
                    for (int64_t r0 = a0 + k; r0 < e; r0 += br.r)
                        rows[n++] = r0;
                    for (int h = ck.hlo; n > 0 && h < ck.hlo + ck.nh; h++) {
                        int64_t kv = h / g;
                        for (int64_t i = 0; i < n; i++) {
                            memcpy(qh + i * D, p->q + (rows[i] * H + h) * D, D * sizeof(float));
                            memcpy(kh + i * D, p->k + (rows[i] * HK + kv) * D, D * sizeof(float));
                            memcpy(vh + i * D, p->v + (rows[i] * HK + kv) * D, D * sizeof(float));
                        }
                        dt_attn_head_t a = {
                            .tq = n, .tk = n, .d = (int)D,
                            .q = qh, .ldq = D, .k = kh, .ldk = D, .v = vh, .ldv = D,
                            .qpos = s->causal ? idx : NULL, .kpos = s->causal ? idx : NULL,
                            .scale = scale_of(s),
                        };
                        if (pass == 0) {
                            memset(o2, 0, (size_t)(n * D) * sizeof(float));
                            for (int64_t i = 0; i < n; i++)
                                l2[i] = -INFINITY;
                            dt_attn_head_fwd_ref(&a, o2, D, l2);
                            for (int64_t i = 0; i < n; i++)
                                dt_attn_merge_cpu(1, (int)D, p->o + (rows[i] * H + h) * D, D,
                                                  p->lse + h * T + rows[i], o2 + i * D, D,
                                                  l2 + i);
                            continue;
                        }
                        for (int64_t i = 0; i < n; i++) {
                            memcpy(doh + i * D, p->dout + (rows[i] * H + h) * D,
                                   D * sizeof(float));
                            lh[i] = p->lse[h * T + rows[i]];
                            dh[i] = delta[h * T + rows[i]];
                        }
                        memset(dqh, 0, (size_t)(n * D) * sizeof(float));
                        memset(dkh, 0, (size_t)(n * D) * sizeof(float));
                        memset(dvh, 0, (size_t)(n * D) * sizeof(float));
                        dt_attn_head_grad_t gd = {
                            .dout = doh, .lddo = D, .lse = lh, .delta = dh,
                            .dq = dqh, .dk = dkh, .dv = dvh,
                        };
                        dt_attn_head_bwd_ref(&a, &gd);
                        for (int64_t i = 0; i < n; i++)
                            for (int64_t c = 0; c < D; c++) {
                                p->dq[(rows[i] * H + h) * D + c] += dqh[i * D + c];
                                p->dk[(rows[i] * HK + kv) * D + c] += dkh[i * D + c];
                                p->dv[(rows[i] * HK + kv) * D + c] += dvh[i * D + c];
                            }
                    }
                }
            }
        }
    }
    free(rows);
    free(idx);
    free(dh);
    free(lh);
    free(l2);
    free(dvh);
    free(dkh);
    free(dqh);
    free(o2);
    free(doh);
    free(vh);
    free(kh);
    free(qh);
    free(delta);
}

/* ---- running a ring ----------------------------------------------------------- */

/* The ring's results scattered back to position order (shapes of the
 * reference). */
typedef struct result {
    float *o, *lse, *dq, *dk, *dv;
    dt_attn_stats_t fst, bst;
} result_t;

static void result_init(result_t *x, const dt_attn_spec_t *s)
{
    size_t nq = (size_t)s->T * s->H * s->D, nk = (size_t)s->T * s->Hkv * s->D;

    memset(x, 0, sizeof(*x));
    x->o = dt_xcalloc(nq, sizeof(float));
    x->lse = dt_xcalloc((size_t)s->T * s->H, sizeof(float));
    x->dq = dt_xcalloc(nq, sizeof(float));
    x->dk = dt_xcalloc(nk, sizeof(float));
    x->dv = dt_xcalloc(nk, sizeof(float));
}

static void result_free(result_t *x)
{
    free(x->o);
    free(x->lse);
    free(x->dq);
    free(x->dk);
    free(x->dv);
}

static void *dev_upload(const void *host, size_t bytes)
{
    void *d = NULL;

    GC_CUDA(cudaMalloc(&d, bytes));
    if (host != NULL)
        GC_CUDA(cudaMemcpy(d, host, bytes, cudaMemcpyHostToDevice));
    else
        GC_CUDA(cudaMemset(d, 0xff, bytes)); /* garbage the ring must overwrite */
    return d;
}

/* Rows of rank g in layout order <- / -> the whole sequence. */
static void gather_rows(const void *full, void *part, const int64_t *pos, int64_t c, size_t row)
{
    for (int64_t i = 0; i < c; i++)
        memcpy((char *)part + (size_t)i * row, (const char *)full + (size_t)pos[i] * row, row);
}

static void scatter_rows(void *full, const void *part, const int64_t *pos, int64_t c, size_t row)
{
    for (int64_t i = 0; i < c; i++)
        memcpy((char *)full + (size_t)pos[i] * row, (const char *)part + (size_t)i * row, row);
}

/* Forward (and backward when bwd) of problem p with spec s (p's shapes,
 * s's layout and branches) on ring. Returns the first failing rc, em set. */
static int run_ring(dt_ring_t *ring, const problem_t *p, const dt_attn_spec_t *s, int bwd,
                    result_t *out, dt_emsg_t *em)
{
    const int R = dt_ring_size(ring), nl = dt_ring_nlocal(ring);
    const int64_t c = dt_layout_local(s->T, R), H = s->H, HK = s->Hkv, D = s->D;
    const size_t qrow = (size_t)(H * D), krow = (size_t)(HK * D);
    dt_ring_io_t *io = dt_xcalloc((size_t)nl, sizeof(*io));
    int64_t **pos = dt_xcalloc((size_t)nl, sizeof(*pos));
    void *hb = dt_xmalloc((size_t)c * qrow * sizeof(float));
    int rc;

    for (int l = 0; l < nl; l++) {
        int g = dt_ring_rank(ring, l);
        pos[l] = dt_xmallocarray((size_t)c, sizeof(int64_t));
        dt_layout_positions(s->layout, s->T, R, g, pos[l]);
        gather_rows(p->q16, hb, pos[l], c, qrow * 2);
        io[l].q = dev_upload(hb, (size_t)c * qrow * 2);
        gather_rows(p->k16, hb, pos[l], c, krow * 2);
        io[l].k = dev_upload(hb, (size_t)c * krow * 2);
        gather_rows(p->v16, hb, pos[l], c, krow * 2);
        io[l].v = dev_upload(hb, (size_t)c * krow * 2);
        gather_rows(p->do16, hb, pos[l], c, qrow * 2);
        io[l].dout = dev_upload(hb, (size_t)c * qrow * 2);
        io[l].o = dev_upload(NULL, (size_t)c * qrow * sizeof(float));
        io[l].lse = dev_upload(NULL, (size_t)(c * H) * sizeof(float));
        io[l].dq = dev_upload(NULL, (size_t)c * qrow * sizeof(float));
        io[l].dk = dev_upload(NULL, (size_t)c * krow * sizeof(float));
        io[l].dv = dev_upload(NULL, (size_t)c * krow * sizeof(float));
    }
    rc = dt_ring_attn_fwd(ring, s, p->dt, io, &out->fst, em);
    if (rc == 0 && bwd)
        rc = dt_ring_attn_bwd(ring, s, p->dt, io, &out->bst, em);
    for (int l = 0; l < nl && rc == 0; l++) {
        float *lse = dt_xmallocarray((size_t)(c * H), sizeof(float));
        GC_CUDA(cudaMemcpy(hb, io[l].o, (size_t)c * qrow * sizeof(float), cudaMemcpyDeviceToHost));
        scatter_rows(out->o, hb, pos[l], c, qrow * sizeof(float));
        GC_CUDA(cudaMemcpy(lse, io[l].lse, (size_t)(c * H) * sizeof(float),
                           cudaMemcpyDeviceToHost));
        for (int64_t h = 0; h < H; h++)
            for (int64_t i = 0; i < c; i++)
                out->lse[h * s->T + pos[l][i]] = lse[h * c + i];
        free(lse);
        if (!bwd)
            continue;
        GC_CUDA(cudaMemcpy(hb, io[l].dq, (size_t)c * qrow * sizeof(float), cudaMemcpyDeviceToHost));
        scatter_rows(out->dq, hb, pos[l], c, qrow * sizeof(float));
        GC_CUDA(cudaMemcpy(hb, io[l].dk, (size_t)c * krow * sizeof(float), cudaMemcpyDeviceToHost));
        scatter_rows(out->dk, hb, pos[l], c, krow * sizeof(float));
        GC_CUDA(cudaMemcpy(hb, io[l].dv, (size_t)c * krow * sizeof(float), cudaMemcpyDeviceToHost));
        scatter_rows(out->dv, hb, pos[l], c, krow * sizeof(float));
    }
    for (int l = 0; l < nl; l++) {
        void *ptrs[] = { (void *)io[l].q, (void *)io[l].k, (void *)io[l].v, (void *)io[l].dout,
                         io[l].o, io[l].lse, io[l].dq, io[l].dk, io[l].dv };
        for (size_t i = 0; i < sizeof(ptrs) / sizeof(ptrs[0]); i++)
            GC_CUDA(cudaFree(ptrs[i]));
        free(pos[l]);
    }
    free(hb);
    free(pos);
    free(io);
    return rc;
}

/* ---- comparisons ------------------------------------------------------------- */

typedef struct errs {
    double o, lse, dq, dk, dv; /* max error (o, lse absolute; grads above tolerance scale) */
} errs_t;

/* Largest |got - ref| over the tolerance tol * max|ref|: <= 1 passes. */
static double grad_err(const float *got, const float *ref, size_t n, double tol)
{
    size_t at;
    double scale = tol * gc_maxabs(ref, n);

    return gc_maxerr(got, ref, n, 0.0, &at) / (scale > 0 ? scale : 1e-30);
}

static errs_t compare(const problem_t *p, const result_t *x, int bwd)
{
    const dt_attn_spec_t *s = &p->s;
    size_t nq = (size_t)s->T * s->H * s->D, nk = (size_t)s->T * s->Hkv * s->D, at;
    double tg = p->dt == DT_F16 ? TOL_G_F16 : TOL_G_BF16;
    errs_t e = { 0 };

    e.o = gc_maxerr(x->o, p->o, nq, 0.0, &at);
    e.lse = gc_maxerr(x->lse, p->lse, (size_t)s->T * s->H, 0.0, &at);
    if (bwd) {
        e.dq = grad_err(x->dq, p->dq, nq, tg);
        e.dk = grad_err(x->dk, p->dk, nk, tg);
        e.dv = grad_err(x->dv, p->dv, nk, tg);
    }
    return e;
}

/* Checks of one ring run against the reference; returns the errors. */
static errs_t check_run(const problem_t *p, const dt_attn_spec_t *s, const result_t *x, int R,
                        int bwd, const char *label)
{
    double to = p->dt == DT_F16 ? TOL_O_F16 : TOL_O_BF16, tg = p->dt == DT_F16 ? TOL_G_F16 : TOL_G_BF16;
    errs_t e = compare(p, x, bwd);
    char what[160];

    snprintf(what, sizeof(what), "%s %s D=%d %s %s R=%d", label, dt_dtype_name(p->dt), s->D,
             dt_layout_name(s->layout), s->causal ? "causal" : "full", R);
    gc_check(e.o <= to && e.lse <= TOL_LSE,
             "forward %s: o max err %.2e (<= %.0e), lse max err %.2e (<= %.0e)", what, e.o, to,
             e.lse, TOL_LSE);
    if (bwd)
        gc_check(e.dq <= 1 && e.dk <= 1 && e.dv <= 1,
                 "backward %s: dq/dk/dv max err %.2f/%.2f/%.2f of the tolerance %.0e*max|ref|",
                 what, e.dq, e.dk, e.dv, tg);
    return e;
}

/* ---- the checks ---------------------------------------------------------------- */

static dt_attn_spec_t dense_spec(int D, int causal, enum dt_layout layout)
{
    dt_attn_spec_t s = { .T = 768, .H = 4, .Hkv = 2, .D = D, .causal = causal,
                         .nbranch = 0, .layout = layout };
    return s;
}

/* Blocks the ring computes, summed over ranks: causal contiguous skips the
 * future, zigzag never skips (every rank holds an early and a late chunk). */
static int expected_steps(const dt_attn_spec_t *s, int R)
{
    if (s->causal && s->layout == DT_LAYOUT_CONTIGUOUS)
        return R * (R + 1) / 2;
    return R * R;
}

static void check_dense(void)
{
    static const int Rs[] = { 1, 2, 3, 4, 8 };
    dt_emsg_t em = { { 0 } };

    for (int D = 64; D <= 128; D *= 2)
        for (int causal = 0; causal <= 1; causal++) {
            dt_attn_spec_t base = dense_spec(D, causal, DT_LAYOUT_CONTIGUOUS);
            problem_t p;
            problem_init(&p, &base, DT_BF16, 1000 + (uint64_t)D * 2 + (uint64_t)causal);
            reference_dense(&p);
            for (int lay = 0; lay < 2; lay++) {
                dt_attn_spec_t s = dense_spec(D, causal, lay ? DT_LAYOUT_ZIGZAG
                                                             : DT_LAYOUT_CONTIGUOUS);
                errs_t e1 = { 0 };
                for (size_t i = 0; i < sizeof(Rs) / sizeof(Rs[0]); i++) {
                    int R = Rs[i];
                    dt_ring_t *ring = NULL;
                    result_t x;
                    result_init(&x, &s);
                    GC_OK(dt_ring_local_new(R, 0, &ring, &em), em);
                    GC_OK(run_ring(ring, &p, &s, 1, &x, &em), em);
                    errs_t e = check_run(&p, &s, &x, R, 1, "dense");
                    gc_check(x.fst.steps == expected_steps(&s, R) &&
                                 x.bst.steps == expected_steps(&s, R),
                             "steps D=%d %s %s R=%d: forward %d, backward %d blocks (want %d)",
                             D, dt_layout_name(s.layout), causal ? "causal" : "full", R,
                             x.fst.steps, x.bst.steps, expected_steps(&s, R));
                    if (R == 1)
                        e1 = e;
                    if (R == 8)
                        gc_check(e.o <= 1.5 * e1.o + 1e-3 && e.lse <= 1.5 * e1.lse + 1e-3,
                                 "no growth with R, D=%d %s %s: o err %.2e at R=8 vs %.2e at "
                                 "R=1, lse %.2e vs %.2e (<= 1.5x + 1e-3)",
                                 D, dt_layout_name(s.layout), causal ? "causal" : "full", e.o,
                                 e1.o, e.lse, e1.lse);
                    dt_ring_free(ring);
                    result_free(&x);
                }
            }
            problem_free(&p);
        }
}

static void check_fp16(void)
{
    dt_attn_spec_t s = dense_spec(64, 1, DT_LAYOUT_ZIGZAG);
    dt_emsg_t em = { { 0 } };
    problem_t p;
    dt_ring_t *ring = NULL;
    result_t x;

    problem_init(&p, &s, DT_F16, 77);
    reference_dense(&p);
    result_init(&x, &s);
    GC_OK(dt_ring_local_new(4, 0, &ring, &em), em);
    GC_OK(run_ring(ring, &p, &s, 1, &x, &em), em);
    check_run(&p, &s, &x, 4, 1, "dense");
    dt_ring_free(ring);
    result_free(&x);
    problem_free(&p);
}

static int same_bits(const float *a, const float *b, size_t n)
{
    return memcmp(a, b, n * sizeof(float)) == 0;
}

/* A one-rank NCCL ring is the local ring of one with another transport:
 * the same kernels in the same order, so the same bits. */
static void check_nccl_one(void)
{
    dt_attn_spec_t s = dense_spec(128, 1, DT_LAYOUT_CONTIGUOUS);
    unsigned char id[DT_RING_ID_BYTES];
    dt_emsg_t em = { { 0 } };
    dt_ring_t *loc = NULL, *nc = NULL;
    result_t a, b;
    problem_t p;
    float *buf = NULL, host[1000];
    int rc;

    problem_init(&p, &s, DT_BF16, 4242);
    result_init(&a, &s);
    result_init(&b, &s);
    GC_OK(dt_ring_local_new(1, 0, &loc, &em), em);
    GC_OK(run_ring(loc, &p, &s, 1, &a, &em), em);
    rc = dt_ring_nccl_id(id, &em);
    if (rc == 0)
        rc = dt_ring_nccl_new(0, 1, id, 0, 30.0, &nc, &em);
    gc_check(rc == 0, "nccl ring of one rank created: %s", rc == 0 ? "yes" : em.s);
    if (rc == 0) {
        size_t nq = (size_t)s.T * s.H * s.D, nk = (size_t)s.T * s.Hkv * s.D;
        gc_check(strcmp(dt_ring_kind(nc), "nccl") == 0 && dt_ring_size(nc) == 1 &&
                     dt_ring_nlocal(nc) == 1 && dt_ring_rank(nc, 0) == 0,
                 "nccl ring of one: kind %s, size %d, nlocal %d, rank %d", dt_ring_kind(nc),
                 dt_ring_size(nc), dt_ring_nlocal(nc), dt_ring_rank(nc, 0));
        rc = run_ring(nc, &p, &s, 1, &b, &em);
        gc_check(rc == 0, "nccl ring of one: forward and backward ran: %s",
                 rc == 0 ? "yes" : em.s);
        if (rc == 0)
            gc_check(same_bits(a.o, b.o, nq) && same_bits(a.lse, b.lse, (size_t)s.T * s.H) &&
                         same_bits(a.dq, b.dq, nq) && same_bits(a.dk, b.dk, nk) &&
                         same_bits(a.dv, b.dv, nk),
                     "nccl ring of one: o, lse, dq, dk, dv bit-identical to the local ring of one");
        /* all-reduce over one rank leaves the buffer as it was */
        for (int i = 0; i < 1000; i++)
            host[i] = (float)i * 0.25f;
        GC_CUDA(cudaMalloc((void **)&buf, sizeof(host)));
        GC_CUDA(cudaMemcpy(buf, host, sizeof(host), cudaMemcpyHostToDevice));
        rc = dt_ring_allreduce_sum_f32(nc, &buf, 1000, &em);
        float back[1000];
        GC_CUDA(cudaMemcpy(back, buf, sizeof(back), cudaMemcpyDeviceToHost));
        gc_check(rc == 0 && memcmp(back, host, sizeof(host)) == 0,
                 "nccl all-reduce over one rank: rc %d, buffer unchanged: %s", rc,
                 rc == 0 ? "checked" : em.s);
        GC_CUDA(cudaFree(buf));
        dt_ring_free(nc);
    }
    dt_ring_free(loc);
    result_free(&a);
    result_free(&b);
    problem_free(&p);
}

static void check_allreduce_local(void)
{
    enum { R = 4, N = 3000 };
    dt_emsg_t em = { { 0 } };
    dt_ring_t *ring = NULL;
    float *buf[R], *host = dt_xmallocarray(N, sizeof(float));
    int ok = 1, rc;

    GC_OK(dt_ring_local_new(R, 0, &ring, &em), em);
    for (int l = 0; l < R; l++) {
        for (int i = 0; i < N; i++)
            host[i] = (float)l + 0.5f * (float)i;
        GC_CUDA(cudaMalloc((void **)&buf[l], N * sizeof(float)));
        GC_CUDA(cudaMemcpy(buf[l], host, N * sizeof(float), cudaMemcpyHostToDevice));
    }
    rc = dt_ring_allreduce_sum_f32(ring, buf, N, &em);
    for (int l = 0; l < R && rc == 0; l++) {
        GC_CUDA(cudaMemcpy(host, buf[l], N * sizeof(float), cudaMemcpyDeviceToHost));
        for (int i = 0; i < N; i++)
            ok &= host[i] == 6.0f + 2.0f * (float)i; /* 0+1+2+3 + 4 * 0.5 i, exact */
    }
    gc_check(rc == 0 && ok, "local all-reduce of 4 ranks: every rank holds the exact sum (%s)",
             rc == 0 ? (ok ? "yes" : "wrong values") : em.s);
    for (int l = 0; l < R; l++)
        GC_CUDA(cudaFree(buf[l]));
    free(host);
    dt_ring_free(ring);
}

static void check_abort(void)
{
    dt_attn_spec_t s = dense_spec(64, 1, DT_LAYOUT_CONTIGUOUS);
    unsigned char id[DT_RING_ID_BYTES];
    dt_emsg_t em = { { 0 } };
    dt_ring_t *ring = NULL;
    problem_t p;
    result_t x;
    int rc;

    problem_init(&p, &s, DT_BF16, 9);
    result_init(&x, &s);
    GC_OK(dt_ring_local_new(2, 0, &ring, &em), em);
    dt_ring_abort(ring, "test abort before the call");
    rc = run_ring(ring, &p, &s, 0, &x, &em);
    gc_check(rc == DT_ECOMM && strstr(em.s, "aborted: test abort before the call") != NULL,
             "local ring aborted before a call: rc %s, '%s'", dt_err_name(rc), em.s);
    rc = run_ring(ring, &p, &s, 0, &x, &em);
    gc_check(rc == DT_ECOMM && strstr(em.s, "aborted: test abort before the call") != NULL,
             "local ring stays dead after abort: rc %s, '%s'", dt_err_name(rc), em.s);
    dt_ring_free(ring);

    ring = NULL;
    rc = dt_ring_nccl_id(id, &em);
    if (rc == 0)
        rc = dt_ring_nccl_new(0, 1, id, 0, 30.0, &ring, &em);
    if (rc == 0) {
        dt_ring_abort(ring, "peer lost (test)");
        rc = run_ring(ring, &p, &s, 0, &x, &em);
        gc_check(rc == DT_ECOMM && strstr(em.s, "aborted: peer lost (test)") != NULL,
                 "nccl ring aborted before a call: rc %s, '%s'", dt_err_name(rc), em.s);
        dt_ring_free(ring); /* ncclCommAbort path */
    } else {
        gc_check(0, "nccl ring of one for the abort check: %s", em.s);
    }
    result_free(&x);
    problem_free(&p);
}

static void check_dilated(void)
{
    struct {
        int R;
        enum dt_layout layout;
        int causal;
        const char *segs, *dils;
    } cases[] = {
        { 1, DT_LAYOUT_CONTIGUOUS, 1, "96,288,768", "1,3,4" }, /* last segment shorter */
        { 2, DT_LAYOUT_CONTIGUOUS, 0, "96,192,384", "1,3,4" },
        { 2, DT_LAYOUT_CONTIGUOUS, 1, "96,192,384", "1,3,4" },
        { 4, DT_LAYOUT_ZIGZAG, 1, "48,96", "2,3" }, /* some (position, head) uncovered */
    };
    dt_emsg_t em = { { 0 } };

    for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
        /* H = 8, Hkv = 2: with r = 3 the chunk of heads 3..5 reads two kv
         * heads unevenly and runs as one block per kv head */
        dt_attn_spec_t s = { .T = 768, .H = 8, .Hkv = 2, .D = 64, .causal = cases[i].causal,
                             .layout = cases[i].layout };
        dt_ring_t *ring = NULL;
        problem_t p;
        result_t x;
        char label[64];
        GC_OK(dt_attn_parse_branches(&s, cases[i].segs, cases[i].dils, &em), em);
        problem_init(&p, &s, DT_BF16, 500 + i);
        reference_dilated(&p);
        result_init(&x, &s);
        GC_OK(dt_ring_local_new(cases[i].R, 0, &ring, &em), em);
        int rc = run_ring(ring, &p, &s, 1, &x, &em);
        snprintf(label, sizeof(label), "dilated w=%s r=%s", cases[i].segs, cases[i].dils);
        gc_check(rc == 0, "%s R=%d ran: %s", label, cases[i].R, rc == 0 ? "yes" : em.s);
        if (rc == 0)
            check_run(&p, &s, &x, cases[i].R, 1, label);
        dt_ring_free(ring);
        result_free(&x);
        problem_free(&p);
    }
}

/* Dilated specs whose segments cross rank boundaries: each such segment
 * runs on a sub-ring of the ranks holding its positions. H = 8, Hkv = 2,
 * D = 64 (r = 3: the chunk of heads 3..5 reads two kv heads unevenly).
 * check_rest (also under the simulator of tests/gpu/test_ring_sched.c)
 * runs the cases of T = 384; main adds those of T = 768 on a device. */
typedef struct cross_case {
    int64_t T;
    int R;
    enum dt_layout layout;
    int causal;
    const char *segs, *dils;
    const char *why;
} cross_case_t;

static const cross_case_t cross_small[] = {
    /* contiguous, c = T / R */
    { 384, 2, DT_LAYOUT_CONTIGUOUS, 1, "384", "2", "w = T over both ranks" },
    { 384, 4, DT_LAYOUT_CONTIGUOUS, 0, "192", "1", "w = 2c" },
    { 384, 4, DT_LAYOUT_CONTIGUOUS, 1, "144", "3",
      "segments straddle 96/192, last one (96) local; GQA r=3" },
    { 384, 3, DT_LAYOUT_CONTIGUOUS, 1, "192", "2", "R=3, c=128: both segments straddle" },
    { 384, 4, DT_LAYOUT_CONTIGUOUS, 1, "98", "7",
      "rank 1 holds 96,97 of [0,98) (offsets 5,6: no rows in any head chunk)" },
    { 384, 4, DT_LAYOUT_CONTIGUOUS, 0, "94", "2",
      "rank 0 holds only 94,95 of [94,188) (one row per chunk)" },
    { 384, 8, DT_LAYOUT_CONTIGUOUS, 0, "48,96,384", "1,2,4", "local, 2-rank and 8-rank branches" },
    /* zigzag, runs of c / 2 */
    { 384, 2, DT_LAYOUT_ZIGZAG, 1, "384", "2", "w = T: both runs of rank 0, with a gap" },
    { 384, 4, DT_LAYOUT_ZIGZAG, 1, "128", "2",
      "[128,256) covers both adjacent runs of rank 3 and parts of rank 2's" },
    { 384, 3, DT_LAYOUT_ZIGZAG, 0, "192", "3", "R=3, ranks 0,1,2 then 2,1,0; GQA r=3" },
    { 384, 8, DT_LAYOUT_ZIGZAG, 1, "24,96,384", "1,2,4", "local, 4-rank and 8-rank branches" },
    { 384, 4, DT_LAYOUT_ZIGZAG, 1, "50", "2", "rank 1 holds only 48,49 of [0,50)" },
};

static const cross_case_t cross_big[] = {
    { 768, 2, DT_LAYOUT_CONTIGUOUS, 1, "768", "2", "w = T" },
    { 768, 4, DT_LAYOUT_CONTIGUOUS, 1, "384", "2", "w = 2c" },
    { 768, 4, DT_LAYOUT_CONTIGUOUS, 0, "128", "2", "segments straddle 192, 576" },
    { 768, 4, DT_LAYOUT_CONTIGUOUS, 1, "288", "3", "straddling, last segment 192; GQA r=3" },
    { 768, 3, DT_LAYOUT_CONTIGUOUS, 0, "384", "3", "R=3, c=256; GQA r=3" },
    { 768, 4, DT_LAYOUT_CONTIGUOUS, 1, "195", "5",
      "rank 1 holds 192..194 of [0,195) (chunks 0,1: no rows)" },
    { 768, 4, DT_LAYOUT_CONTIGUOUS, 1, "190", "5", "rank 0 holds only 190,191 of [190,380) (chunks 2,3: no rows)" },
    { 768, 8, DT_LAYOUT_CONTIGUOUS, 1, "96,384,768", "1,2,4", "local, 4-rank, 8-rank branches" },
    { 768, 2, DT_LAYOUT_ZIGZAG, 0, "768", "2", "w = T: both runs of rank 0, with a gap" },
    { 768, 2, DT_LAYOUT_ZIGZAG, 1, "768", "4", "w = T: both runs of rank 0, with a gap" },
    { 768, 4, DT_LAYOUT_ZIGZAG, 1, "256", "2", "[256,512) covers both adjacent runs of rank 3" },
    { 768, 3, DT_LAYOUT_ZIGZAG, 1, "512", "2", "R=3, w = 2c, last segment 256" },
    { 768, 8, DT_LAYOUT_ZIGZAG, 0, "96,384,768", "1,2,4", "runs of 48: every branch crosses" },
    { 768, 4, DT_LAYOUT_ZIGZAG, 1, "100", "4", "rank 1 holds only 96..99 of [0,100)" },
};

/* Runs the cases on local rings, forward and backward, against
 * reference_dilated; the last ring then runs a dense spec (still usable). */
static void check_dilated_cross(const cross_case_t *cs, size_t n, uint64_t seed)
{
    dt_emsg_t em = { { 0 } };

    for (size_t i = 0; i < n; i++) {
        dt_attn_spec_t s = { .T = cs[i].T, .H = 8, .Hkv = 2, .D = 64, .causal = cs[i].causal,
                             .layout = cs[i].layout };
        dt_ring_t *ring = NULL;
        problem_t p;
        result_t x;
        char label[160];
        GC_OK(dt_attn_parse_branches(&s, cs[i].segs, cs[i].dils, &em), em);
        problem_init(&p, &s, DT_BF16, seed + i);
        reference_dilated(&p);
        result_init(&x, &s);
        GC_OK(dt_ring_local_new(cs[i].R, 0, &ring, &em), em);
        snprintf(label, sizeof(label), "cross-rank dilated T=%lld w=%s r=%s (%s)",
                 (long long)s.T, cs[i].segs, cs[i].dils, cs[i].why);
        int rc = run_ring(ring, &p, &s, 1, &x, &em);
        gc_check(rc == 0, "%s on %s %s R=%d ran: rc %s%s%s", label, dt_layout_name(s.layout),
                 s.causal ? "causal" : "full", cs[i].R, rc == 0 ? "0" : dt_err_name(rc),
                 rc == 0 ? "" : ", ", rc == 0 ? "" : em.s);
        if (rc == 0)
            check_run(&p, &s, &x, cs[i].R, 1, label);
        if (i + 1 == n) {
            /* the same ring, now a dense spec over the same inputs */
            dt_attn_spec_t d = s;
            problem_t pd;
            result_t xd;
            d.nbranch = 0;
            problem_init(&pd, &d, DT_BF16, seed + i);
            reference_dense(&pd);
            result_init(&xd, &d);
            rc = run_ring(ring, &pd, &d, 1, &xd, &em);
            gc_check(rc == 0, "ring of %d usable for a dense spec after cross-rank dilated: %s",
                     cs[i].R, rc == 0 ? "yes" : em.s);
            if (rc == 0)
                check_run(&pd, &d, &xd, cs[i].R, 1, "dense after cross-rank dilated");
            result_free(&xd);
            problem_free(&pd);
        }
        dt_ring_free(ring);
        result_free(&x);
        problem_free(&p);
    }
}

static void check_bytes(void)
{
    dt_attn_spec_t s = dense_spec(128, 1, DT_LAYOUT_ZIGZAG);
    size_t f = dt_ring_attn_bytes(&s, DT_BF16, 4, 0), b = dt_ring_attn_bytes(&s, DT_BF16, 4, 1);
    size_t kv = 2 * (size_t)(768 / 4) * 2 * 128 * 2; /* K and V of a rank, bf16 */

    gc_check(f >= 2 * kv && b >= f + 3 * 2 * kv,
             "workspace bytes: forward %zu >= two K/V packs %zu, backward %zu adds three fp32 "
             "dK/dV packs",
             f, 2 * kv, b);
}

/* ---- NCCL rings of threads ------------------------------------------------------ */

/* One rank of an NCCL ring run by a thread of this process: its own
 * communicator on device rank % ndev. dead: the rank creates its
 * communicator and then never joins the call, as a peer that died would. */
typedef struct rank_arg {
    int rank, R, device, dead;
    double timeout;
    unsigned char id[DT_RING_ID_BYTES];
    const problem_t *p;
    const dt_attn_spec_t *s;
    result_t *x;
    int rc;
    dt_emsg_t em;
    dt_ring_t *ring;
    int created; /* atomic: the ring exists (or failed), it may be aborted */
} rank_arg_t;

static void *rank_main(void *v)
{
    rank_arg_t *a = v;

    a->rc = dt_ring_nccl_new(a->rank, a->R, a->id, a->device, a->timeout, &a->ring, &a->em);
    __atomic_store_n(&a->created, 1, __ATOMIC_RELEASE);
    if (a->rc == 0 && !a->dead)
        a->rc = run_ring(a->ring, a->p, a->s, 1, a->x, &a->em);
    return NULL;
}

/* Forward and backward of p on an NCCL ring of R threads (rank r on device
 * r % ndev), results into x, each rank's outcome in a[R] (the caller frees
 * a[r].ring). abort_rank >= 0: that rank's ring is aborted (dt_ring_abort,
 * as a PMIx failure event would) abort_us after it exists. dead_rank >= 0:
 * that rank never joins. Every wait is bounded by timeout seconds. */
static void nccl_threads(const problem_t *p, const dt_attn_spec_t *s, int R, int ndev,
                         int abort_rank, int dead_rank, double timeout, unsigned abort_us,
                         result_t *x, rank_arg_t *a)
{
    pthread_t *th = dt_xcalloc((size_t)R, sizeof(*th));
    unsigned char id[DT_RING_ID_BYTES];
    dt_emsg_t em = { { 0 } };

    GC_OK(dt_ring_nccl_id(id, &em), em);
    for (int r = 0; r < R; r++) {
        a[r] = (rank_arg_t){ .rank = r, .R = R, .device = r % ndev, .dead = r == dead_rank,
                             .timeout = timeout, .p = p, .s = s, .x = x };
        memcpy(a[r].id, id, sizeof(id));
        if (pthread_create(&th[r], NULL, rank_main, &a[r]) != 0) {
            gc_check(0, "pthread_create for rank %d", r);
            exit(gc_done());
        }
    }
    if (abort_rank >= 0) {
        while (!__atomic_load_n(&a[abort_rank].created, __ATOMIC_ACQUIRE))
            usleep(100);
        usleep(abort_us);
        if (a[abort_rank].ring)
            dt_ring_abort(a[abort_rank].ring, "peer failure event (test)");
    }
    for (int r = 0; r < R; r++)
        pthread_join(th[r], NULL);
    free(th);
}

/* NCCL rings across the GPUs of this node, one thread per rank: dense and
 * dilated (crossing segments on sub-rings) against the reference, then a
 * peer that never joins and one aborted by a failure event, which must end
 * every other rank with DT_ECOMM within the watchdog's bound, not hang.
 * NCCL takes one rank per GPU, so this needs two devices or more. */
static void check_nccl_gpus(void)
{
    static const struct {
        enum dt_layout lay;
        int causal;
        const char *w, *r; /* NULL: dense */
    } cases[] = {
        { DT_LAYOUT_ZIGZAG, 1, NULL, NULL },
        { DT_LAYOUT_CONTIGUOUS, 0, NULL, NULL },
        { DT_LAYOUT_CONTIGUOUS, 1, "96,384,768", "1,2,4" },
        { DT_LAYOUT_ZIGZAG, 1, "96,384,768", "1,2,4" },
    };
    dt_emsg_t em = { { 0 } };
    int ndev = dt_cuda_devices(&em);

    if (ndev < 2) {
        printf("skip NCCL rings across GPUs: %d visible device%s, NCCL takes one rank per GPU "
               "(the local ring of R ranks on one GPU covers the schedule)\n",
               ndev, ndev == 1 ? "" : "s");
        return;
    }
    for (int R = 2; R <= (ndev < 8 ? ndev : 8); R *= 2) {
        for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
            dt_attn_spec_t s = { .T = 768, .H = cases[i].w ? 8 : 4, .Hkv = 2, .D = 64,
                                 .causal = cases[i].causal, .layout = cases[i].lay };
            rank_arg_t *a = dt_xcalloc((size_t)R, sizeof(*a));
            problem_t p;
            result_t x;
            char label[96];
            int ok = 1;
            if (cases[i].w)
                GC_OK(dt_attn_parse_branches(&s, cases[i].w, cases[i].r, &em), em);
            problem_init(&p, &s, DT_BF16, 900 + (unsigned)(R * 10) + (unsigned)i);
            if (cases[i].w)
                reference_dilated(&p);
            else
                reference_dense(&p);
            result_init(&x, &s);
            nccl_threads(&p, &s, R, ndev, -1, -1, 60.0, 0, &x, a);
            for (int r = 0; r < R; r++) {
                if (a[r].rc != 0) {
                    ok = 0;
                    printf("  nccl rank %d of %d: %s: %s\n", r, R, dt_err_name(a[r].rc),
                           a[r].em.s);
                }
                dt_ring_free(a[r].ring);
            }
            snprintf(label, sizeof(label), "nccl across %d GPUs %s%s%s%s", R,
                     cases[i].w ? "dilated w=" : "dense", cases[i].w ? cases[i].w : "",
                     cases[i].w ? " r=" : "", cases[i].w ? cases[i].r : "");
            gc_check(ok, "%s: every rank ran", label);
            if (ok)
                check_run(&p, &s, &x, R, 1, label);
            result_free(&x);
            problem_free(&p);
            free(a);
        }
    }
    for (int mode = 0; mode < 2; mode++) {
        dt_attn_spec_t s = dense_spec(64, 1, DT_LAYOUT_ZIGZAG);
        rank_arg_t a[2];
        problem_t p;
        result_t x;
        problem_init(&p, &s, DT_BF16, 950);
        result_init(&x, &s);
        double t0 = dt_clock_now();
        nccl_threads(&p, &s, 2, ndev, mode == 0 ? 1 : -1, mode == 1 ? 1 : -1, 5.0, 1000, &x, a);
        double took = dt_clock_now() - t0;
        for (int r = 0; r < 2; r++)
            printf("  %s: rank %d: %s: %s\n", mode ? "dead peer" : "abort", r,
                   dt_err_name(a[r].rc), a[r].rc ? a[r].em.s : "");
        gc_check(a[0].rc == DT_ECOMM && (mode == 1 || a[1].rc == DT_ECOMM || a[1].rc == 0) &&
                     took < 60,
                 "nccl across 2 GPUs, %s: rank 0 ends with DT_ECOMM in %.1f s (watchdog 5 s), "
                 "no hang",
                 mode ? "peer 1 never joins" : "peer 1 aborted", took);
        for (int r = 0; r < 2; r++)
            dt_ring_free(a[r].ring);
        result_free(&x);
        problem_free(&p);
    }
}

/* Every check but check_dense and the T = 768 cross-rank dilated cases
 * (tests/gpu/test_ring_sched.c runs these under its host simulator of CUDA
 * and NCCL). */
static void check_rest(void)
{
    check_fp16();
    check_nccl_one();
    check_allreduce_local();
    check_abort();
    check_dilated();
    check_dilated_cross(cross_small, sizeof(cross_small) / sizeof(cross_small[0]), 600);
    check_bytes();
}

int main(void)
{
    gc_require_device("test_ring_cuda");
    check_dense();
    check_dilated_cross(cross_big, sizeof(cross_big) / sizeof(cross_big[0]), 700);
    check_nccl_gpus();
    check_rest();
    return gc_done();
}
