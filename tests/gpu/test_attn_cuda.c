/* SPDX-License-Identifier: MIT
 *
 * test_attn_cuda: the CUDA attention kernels of kernels/cuda/attn_cuda.h
 * (forward, backward, delta) against the plain-C reference of
 * kernels/cpu/attn_ref.c, head by head. A plain program on tests/gpu/
 * gpucheck.h, not a criterion suite: it runs on a bare GPU node and exits
 * 77 (SKIP) where no device is usable.
 *
 * Inputs are seeded unit normals rounded on the host to bf16 or fp16
 * (round to nearest even), and the reference reads exactly those rounded
 * values widened to fp32, so what differs is only what the kernels do
 * inside (see the tolerances below). Covered: bf16 and fp16; D 64 and 128;
 * causal and not; GQA (H = 8, Hkv = 2) and MHA; tq != tk and sizes that are
 * no multiple of a tile (300 x 517, 1 x 517, 1000 x 1000, 4096 x 4096);
 * row strides larger than h * d on every tensor (padding holds NaN in the
 * inputs and a sentinel in the outputs, which must survive); positions as
 * q0/k0 and as device arrays of two runs each (zigzag-like), with queries
 * that see no key and key blocks wholly in the future; accumulate = 1 over
 * three key blocks against one call; scale = 0 and an explicit scale;
 * backward into non-zero dq/dk/dv, over one and three key blocks, and its
 * determinism (bit-identical reruns); the delta kernel; refusals of
 * unsupported arguments with DT_EINVAL and a message.
 *
 * Shapes: q (tq, h, d), k/v (tk, hkv, d), o (tq, h, d) fp32, lse (h, tq)
 * fp32, dq (tq, h, d), dk/dv (tk, hkv, d) fp32. Not here: the ring
 * (test_ring_cuda), the layers (test_layers_cuda), timings (bench/).
 *
 * Built with DT_TEST_SIM against the simulator (tests/gpu/sim: the
 * kernels' contracts on the CPU reference) it is test_attn_sim in make
 * check: blocks through cuDNN's stand-in (engine/attn/attn_block.c: the
 * pieces, the half partials, the scratch, masks handed to dt's kernels),
 * the cases at bf16 and D = 64 only (the block code is the same for every
 * dtype and width) and the long block at T = 1024 (4096 takes minutes on
 * the reference).
 */
#include "config.h"

#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <cuda_runtime_api.h>

#include "common/clock.h"
#include "common/err.h"
#include "common/mem.h"
#include "kernels/cpu/attn_cpu.h"
#include "kernels/attn_kernel.h"
#include "kernels/cuda/attn_cuda.h"
#include "engine/attn/attn_block.h"
#include "engine/data/gen.h"
#include "tests/gpu/gpucheck.h"

/*-- tolerances ----------------------------------------------------------------
 * The kernel and the reference read the same rounded inputs, so the error is
 * made inside the kernel. Scores are fp32 sums of exact products (relative
 * error ~1e-6: nothing at these tolerances). The large term: P = exp(s - m)
 * is rounded to the input dtype before the P.V product (in the backward, P
 * before P^T.dO and dS before dS.K and dS^T.Q), a relative error of at most
 * u = 2^-8 (bf16, 8 significant bits) or 2^-11 (fp16, 11 bits) per term,
 * summed in fp32.
 *   o: |err| <= u * max|v| when one key dominates; unit-normal v stays
 *      below ~4.5 over these sizes, so bf16 errs < 1.8e-2 in the worst
 *      pathological row and ~5e-3 in practice (softmax over hundreds of
 *      keys is spread out); atol 1.5e-2 (bf16) / 2e-3 (fp16). Rounding
 *      errors are independent, so the relative L2 error over a tensor is
 *      ~u / sqrt(3) (2.3e-3 bf16, 2.8e-4 fp16): bound 1.5e-2 / 2e-3, which
 *      a kernel returning zeros (relative error 1) or garbage cannot meet.
 *   lse: fp32 running max and sum, no dtype rounding: |err| ~1e-5; atol
 *      2e-3 for both.
 *   dq, dk, dv: the same rounding of P and dS; errors scale with the
 *      gradient, so atol is relative to max|reference gradient| (3e-2 bf16,
 *      4e-3 fp16, about 8 u) and the L2 bound is the same as for o.
 *   o and lse must also be large enough for the bound to mean something:
 *      max|reference| >= 4 atol is checked too, so that a kernel returning
 *      zeros fails on the element bound as well.
 * A CPU emulation of exactly this rounding (tiles of 64 keys, online
 * softmax, P and dS rounded to the dtype) stayed within 23 % of every
 * element bound and 11 % of every L2 bound over all the cases below, and
 * failed them all with o set to zero, o off by 0.02, lse off by 0.01. */
typedef struct tol {
    double atol;   /* |got - want| <= atol + rtol * |want| per element */
    double rtol;
    double l2;     /* ||got - want|| <= l2 * ||want|| over the finite values; < 0: off */
    double minmax; /* max|want| over the finite values must reach this */
} tol_t;

static tol_t tol_o(dt_dtype_t dt)
{
    return dt == DT_BF16 ? (tol_t){ 1.5e-2, 0.0, 1.5e-2, 6e-2 }
                         : (tol_t){ 2e-3, 0.0, 2e-3, 8e-3 };
}

static tol_t tol_lse(void)
{
    return (tol_t){ 2e-3, 0.0, -1.0, 8e-3 };
}

/* gmax: max|reference gradient| (without the initial values). */
static tol_t tol_grad(dt_dtype_t dt, double gmax)
{
    double a = dt == DT_BF16 ? 3e-2 : 4e-3;
    double l2 = dt == DT_BF16 ? 1.5e-2 : 2e-3;
    return (tol_t){ a * gmax, 0.0, l2, 1e-30 };
}

/* Two kernel results that each meet tol against the reference may differ
 * by twice it (accumulating over blocks rounds P relative to a different
 * running maximum than one call does). */
static tol_t tol_twice(tol_t t)
{
    return (tol_t){ 2 * t.atol, 2 * t.rtol, t.l2 < 0 ? t.l2 : 2 * t.l2, t.minmax };
}

/*-- host numerics: seeded normals, bf16 / fp16 rounding -----------------------*/

/* Element *i (then advanced) of the seeded stream of standard normals of
 * engine/data/gen.c. */
static double rnorm(uint64_t seed, int64_t *i)
{
    float f;

    dt_gen_normal(seed, 0, (*i)++, 1, &f);
    return f;
}

/* The conversions against known values (they decide what the reference
 * sees, so they are checked before anything depends on them). */
static void check_rounding(void)
{
    static const struct {
        float f;
        uint16_t bf, hf;
    } t[] = {
        { 1.0f, 0x3f80, 0x3c00 },
        { -2.5f, 0xc020, 0xc100 },
        { 1.00390625f, 0x3f80, 0x3c04 },    /* 1 + 2^-8: bf16 tie to even (down) */
        { 1.01171875f, 0x3f82, 0x3c0c },    /* 1 + 3 * 2^-8: bf16 tie to even (up) */
        { 1.00048828125f, 0x3f80, 0x3c00 }, /* 1 + 2^-11: fp16 tie to even (down) */
        { 1.00146484375f, 0x3f80, 0x3c02 }, /* 1 + 3 * 2^-11: fp16 tie to even (up) */
        { 65504.0f, 0x4780, 0x7bff },
        { 65520.0f, 0x4780, 0x7c00 },     /* fp16 overflows to infinity */
        { 5.9604645e-08f, 0x3380, 0x0001 }, /* 2^-24: smallest fp16 subnormal */
        { 6.1035156e-05f, 0x3880, 0x0400 }, /* 2^-14: smallest fp16 normal */
        { 0.1f, 0x3dcd, 0x2e66 },
    };
    int bad = 0;
    for (size_t i = 0; i < sizeof t / sizeof t[0]; i++) {
        uint16_t b = dt_half_bits(DT_BF16, t[i].f), hf = dt_half_bits(DT_F16, t[i].f);
        if (b != t[i].bf || hf != t[i].hf) {
            printf("  %.9g: bf16 0x%04x (want 0x%04x), fp16 0x%04x (want 0x%04x)\n",
                   (double)t[i].f, b, t[i].bf, hf, t[i].hf);
            bad++;
        }
        if (!bad && (dt_half_value(DT_BF16, b) != dt_half_value(DT_BF16, t[i].bf) ||
                     dt_half_value(DT_F16, hf) != dt_half_value(DT_F16, t[i].hf)))
            bad++;
    }
    /* widening then narrowing is the identity on every finite pattern */
    for (uint32_t p = 0; p < 0x10000u; p++) {
        uint16_t u = (uint16_t)p;
        if ((u & 0x7c00u) != 0x7c00u && dt_half_bits(DT_F16, dt_half_value(DT_F16, u)) != u)
            bad++;
        if ((u & 0x7f80u) != 0x7f80u && dt_half_bits(DT_BF16, dt_half_value(DT_BF16, u)) != u)
            bad++;
    }
    gc_check(bad == 0, "host fp32 -> bf16/fp16 rounding (nearest even, subnormals, overflow) "
                       "and back: %d mismatches", bad);
    if (bad)
        exit(gc_done()); /* every comparison below would be meaningless */
}

/*-- host tensors ----------------------------------------------------------------*/

#define PAD_SENTINEL 12345.0f

/* rows x width values at row stride ld: the 16-bit elements the kernel
 * reads and the same values widened to fp32 for the reference; padding is
 * NaN in both (a kernel reading it spreads NaN into its outputs). */
typedef struct htensor {
    int64_t rows, width, ld;
    uint16_t *b;
    float *f;
} htensor_t;

static void ht_init(htensor_t *t, dt_dtype_t dt, int64_t rows, int64_t width, int64_t ld,
                    uint64_t seed)
{
    size_t n = (size_t)(rows * ld);
    int64_t s = 0;

    t->rows = rows;
    t->width = width;
    t->ld = ld;
    t->b = dt_xmallocarray(n ? n : 1, sizeof(uint16_t));
    t->f = dt_xmallocarray(n ? n : 1, sizeof(float));
    for (int64_t r = 0; r < rows; r++)
        for (int64_t c = 0; c < ld; c++) {
            size_t i = (size_t)(r * ld + c);
            if (c < width) {
                t->b[i] = dt_half_bits(dt, (float)rnorm(seed, &s));
                t->f[i] = dt_half_value(dt, t->b[i]);
            } else {
                t->b[i] = dt == DT_BF16 ? 0x7fc0 : 0x7e00;
                t->f[i] = NAN;
            }
        }
}

static void ht_free(htensor_t *t)
{
    free(t->b);
    free(t->f);
}

/* rows x width fp32 at stride ld: `fill` in the rows, the sentinel in the
 * padding. */
static float *fbuf(int64_t rows, int64_t width, int64_t ld, float fill)
{
    float *x = dt_xmallocarray((size_t)(rows * ld) + 1, sizeof(float));
    for (int64_t r = 0; r < rows; r++)
        for (int64_t c = 0; c < ld; c++)
            x[r * ld + c] = c < width ? fill : PAD_SENTINEL;
    return x;
}

/* Padding values that are no longer the sentinel. */
static int64_t pad_changed(const float *x, int64_t rows, int64_t width, int64_t ld)
{
    int64_t n = 0;
    for (int64_t r = 0; r < rows; r++)
        for (int64_t c = width; c < ld; c++)
            n += memcmp(&x[r * ld + c], &(float){ PAD_SENTINEL }, sizeof(float)) != 0;
    return n;
}

/* The rows of x (stride ld) packed into (rows, width). */
static float *unpad(const float *x, int64_t rows, int64_t width, int64_t ld)
{
    float *y = dt_xmallocarray((size_t)(rows * width) + 1, sizeof(float));
    for (int64_t r = 0; r < rows; r++)
        memcpy(y + r * width, x + r * ld, (size_t)width * sizeof(float));
    return y;
}

static double rms(const float *x, size_t n)
{
    double s = 0;
    for (size_t i = 0; i < n; i++)
        s += (double)x[i] * x[i];
    return n ? sqrt(s / (double)n) : 0.0;
}

/*-- device helpers ----------------------------------------------------------------*/

static void *dmalloc(size_t n)
{
    void *p = NULL;
    GC_CUDA(cudaMalloc(&p, n ? n : 16));
    return p;
}

static void *dput(const void *h, size_t n)
{
    void *p = dmalloc(n);
    GC_CUDA(cudaMemcpy(p, h, n, cudaMemcpyHostToDevice));
    return p;
}

/* The case running, for the message of a kernel's fault. */
static char running[200];

/* Waits for the device first: a kernel's fault surfaces here, and ends the
 * program (the context is lost) naming the case. */
static void dget(void *h, const void *d, size_t n)
{
    cudaError_t e = cudaDeviceSynchronize();
    if (e == cudaSuccess)
        e = cudaMemcpy(h, d, n, cudaMemcpyDeviceToHost);
    if (e != cudaSuccess) {
        gc_check(0, "kernels of [%s] failed on the device: %s: %s", running, cudaGetErrorName(e),
                 cudaGetErrorString(e));
        exit(gc_done());
    }
}

static void dfree(void *p)
{
    if (p)
        GC_CUDA(cudaFree(p));
}

static const void *offs(const void *p, int64_t elems, size_t es)
{
    return (const char *)p + elems * (int64_t)es;
}

/* A launcher's return: 0 goes on. DT_EDEVICE ends the program (the context
 * may be lost); any other code fails this check and the caller gives up on
 * the case. */
static int launched(int rc, const dt_emsg_t *em, const char *what, const char *tag)
{
    if (rc == 0)
        return 1;
    gc_check(0, "%s [%s]: returned %s (%d): %s", what, tag, dt_err_name(rc), rc, em->s);
    if (rc == DT_EDEVICE)
        exit(gc_done());
    return 0;
}

/*-- comparison ----------------------------------------------------------------------*/

/* Compare n packed values, laid out as (n0, w1, w2) for the messages
 * (layout names the axes), against tol; one ok/FAIL line, and the first
 * mismatches on failure. */
static void expect_close(const char *what, const char *tag, const float *got, const float *want,
                         size_t n, const char *layout, int64_t w1, int64_t w2, tol_t t)
{
    size_t at;
    double worst = gc_maxerr(got, want, n, t.rtol, &at);
    double num = 0, den = 0, wmax = gc_maxabs(want, n);

    for (size_t i = 0; i < n; i++)
        if (isfinite(want[i])) {
            double e = (double)got[i] - want[i];
            num += e * e;
            den += (double)want[i] * want[i];
        }
    double rel = den > 0 ? sqrt(num / den) : (num > 0 ? INFINITY : 0.0);
    int ok = !isnan(worst) && worst <= t.atol && (t.l2 < 0 || rel <= t.l2) && wmax >= t.minmax;
    size_t a = at / (size_t)(w1 * w2), b = at / (size_t)w2 % (size_t)w1, c = at % (size_t)w2;

    gc_check(ok,
             "%s [%s]: max(|err| - %.0e|ref|) %.3g at (%s)=(%zu,%zu,%zu) got %.6g want %.6g "
             "(atol %.3g); rel L2 %.3g (bound %.3g); max|ref| %.3g (needs >= %.3g)",
             what, tag, t.rtol, worst, layout, a, b, c, n ? (double)got[at] : 0.0,
             n ? (double)want[at] : 0.0, t.atol, rel, t.l2, wmax, t.minmax);
    if (ok)
        return;
    int shown = 0;
    for (size_t i = 0; i < n && shown < 5; i++) {
        double g = got[i], w = want[i];
        int bad = (isinf(w) || isinf(g)) ? g != w
                                          : !(fabs(g - w) <= t.atol + t.rtol * fabs(w));
        if (bad) {
            printf("    (%s)=(%zu,%zu,%zu): got %.7g want %.7g\n", layout,
                   i / (size_t)(w1 * w2), i / (size_t)w2 % (size_t)w1, i % (size_t)w2, g, w);
            shown++;
        }
    }
}

/* Bitwise equality of two buffers (determinism, unchanged state). */
static void expect_same(const char *what, const char *tag, const float *x, const float *y,
                        size_t n)
{
    size_t diff = 0, first = 0;
    for (size_t i = 0; i < n; i++)
        if (memcmp(&x[i], &y[i], sizeof(float)) != 0 && diff++ == 0)
            first = i;
    gc_check(diff == 0, "%s [%s]: %zu of %zu values differ bitwise (first at %zu: %.9g vs %.9g)",
             what, tag, diff, n, first, diff ? (double)x[first] : 0.0,
             diff ? (double)y[first] : 0.0);
}

/*-- one case: forward, backward, three key blocks -----------------------------------*/

/* Positions: pos = 0 uses q0 + i and k0 + j; pos = 1 passes device arrays
 * of two runs each: queries [q0, q0 + tq/2) then [q1, ...), keys [k0, k0 +
 * tk/2) then [k1, ...) (one rank's share of a zigzag layout against
 * another's). */
typedef struct tcase {
    const char *name;
    int64_t tq, tk;
    int h, hkv;
    int causal;
    int pos;
    int64_t q0, k0, q1, k1;
    float scale; /* 0: 1/sqrt(d) */
    /* a mask as the kernels take it, per query an interval of key
     * positions (qlo, qhi): documents of doc positions ([k doc, (k + 1)
     * doc)) and a window of win (0: none of either) */
    int64_t win, doc;
} tcase_t;

static const tcase_t cases[] = {
    /* name               tq    tk    h  hkv causal pos q0    k0   q1    k1    scale win doc */
    { "mha", 300, 517, 4, 4, 0, 0, 0, 0, 0, 0, 0.0f, 0, 0 },
    { "gqa-scale0.2", 300, 517, 8, 2, 0, 0, 0, 0, 0, 0, 0.2f, 0, 0 },
    { "gqa-causal-q0k0", 300, 517, 8, 2, 1, 0, 1000, 800, 0, 0, 0.0f, 0, 0 },
    { "gqa-causal-posarrays", 300, 517, 8, 2, 1, 1, 0, 100, 2000, 1900, 0.0f, 0, 0 },
    { "tq1-causal", 1, 517, 8, 2, 1, 0, 300, 0, 0, 0, 0.0f, 0, 0 },
    { "self-causal", 1000, 1000, 4, 2, 1, 0, 0, 0, 0, 0, 0.0f, 0, 0 },
    /* masks: documents and a window against zigzag-like position runs,
     * and a window not causal (its tiles skipped on both sides) */
    { "gqa-causal-docs-window", 300, 517, 8, 2, 1, 1, 0, 100, 2000, 1900, 0.0f, .win = 150,
      .doc = 256 },
    { "window-not-causal", 300, 517, 8, 2, 0, 0, 200, 0, 0, 0, 0.0f, .win = 64 },
    { "self-docs", 1000, 1000, 4, 2, 1, 0, 0, 0, 0, 0, 0.0f, .doc = 77 },
};

static int masked(const tcase_t *c)
{
    return c->win > 0 || c->doc > 0;
}

/* Query position qp's interval of keys under the case's mask. */
static void interval(const tcase_t *c, int64_t qp, int64_t *lo, int64_t *hi)
{
    *lo = c->doc ? qp - qp % c->doc : 0;
    *hi = c->doc ? *lo + c->doc : INT64_MAX;
    if (c->causal && qp + 1 < *hi)
        *hi = qp + 1;
    if (c->win && qp - c->win + 1 > *lo)
        *lo = qp - c->win + 1;
    if (c->win && !c->causal && qp + c->win < *hi)
        *hi = qp + c->win;
}

static void positions(int64_t n, int pos, int64_t a, int64_t b, int64_t *out)
{
    for (int64_t i = 0; i < n; i++)
        out[i] = !pos ? a + i : i < n / 2 ? a + i : b + (i - n / 2);
}

/* Everything of one case, host and device; strides all exceed the packed
 * width and differ from each other, so a kernel that mixes them up fails. */
typedef struct tdata {
    const tcase_t *c;
    dt_dtype_t dt;
    int d, g;
    int64_t ldq, ldk, ldv, lddo, ldo, ldlse, lddq, lddk, lddv;
    float scale; /* the effective one */
    char tag[200];
    htensor_t q, k, v, dout;
    int64_t *qpos, *kpos; /* (tq), (tk) host; the reference masks with them when causal */
    int64_t *qlo, *qhi;   /* (tq) host, a mask's intervals; NULL without one */
    int64_t *qlo_d;       /* (2 tq) device: qlo then qhi */
    /* reference: o (tq, h, d) and lse (h, tq) packed; delta (h, tq);
     * gradients from zero at the strides of q, k, v (the reference's
     * contract), then packed */
    float *o_ref, *lse_ref, *delta_ref, *dq_ref, *dk_ref, *dv_ref;
    /* device */
    void *q_d, *k_d, *v_d, *do_d;
    int64_t *qpos_d, *kpos_d;
    float *lse_d, *delta_d; /* the reference's lse and delta at head stride ldlse */
} tdata_t;

/* Head hh of the case as the CPU reference's arguments (the rounded fp32
 * values; query head hh reads kv head hh / g). */
static dt_attn_head_t ref_head(const tdata_t *t, int hh)
{
    const tcase_t *c = t->c;
    const int d = t->d;

    return (dt_attn_head_t){
        .tq = c->tq, .tk = c->tk, .d = d,
        .q = t->q.f + hh * d, .ldq = t->ldq,
        .k = t->k.f + (hh / t->g) * d, .ldk = t->ldk,
        .v = t->v.f + (hh / t->g) * d, .ldv = t->ldv,
        .qpos = c->causal || masked(c) ? t->qpos : NULL,
        .kpos = c->causal || masked(c) ? t->kpos : NULL,
        .qlo = t->qlo, .qhi = t->qhi,
        .scale = t->scale,
    };
}

static void ref_forward(tdata_t *t)
{
    const tcase_t *c = t->c;
    const int d = t->d;
    int64_t ldo = (int64_t)c->h * d;

    t->o_ref = dt_xcalloc((size_t)(c->tq * ldo) + 1, sizeof(float));
    t->lse_ref = dt_xmallocarray((size_t)(c->h * c->tq) + 1, sizeof(float));
    for (int64_t i = 0; i < c->h * c->tq; i++)
        t->lse_ref[i] = -INFINITY;
    for (int hh = 0; hh < c->h; hh++) {
        dt_attn_head_t a = ref_head(t, hh);
        dt_attn_head_fwd_ref(&a, t->o_ref + hh * d, ldo, t->lse_ref + hh * c->tq);
    }
}

static void ref_backward(tdata_t *t)
{
    const tcase_t *c = t->c;
    const int d = t->d;
    int64_t ldo = (int64_t)c->h * d;
    float *dq = dt_xcalloc((size_t)(c->tq * t->ldq) + 1, sizeof(float));
    float *dk = dt_xcalloc((size_t)(c->tk * t->ldk) + 1, sizeof(float));
    float *dv = dt_xcalloc((size_t)(c->tk * t->ldv) + 1, sizeof(float));

    t->delta_ref = dt_xmallocarray((size_t)(c->h * c->tq) + 1, sizeof(float));
    for (int hh = 0; hh < c->h; hh++)
        dt_attn_delta_cpu(c->tq, d, t->dout.f + hh * d, t->lddo, t->o_ref + hh * d, ldo,
                          t->delta_ref + hh * c->tq);
    for (int hh = 0; hh < c->h; hh++) {
        dt_attn_head_t a = ref_head(t, hh);
        dt_attn_head_grad_t gr = {
            .dout = t->dout.f + hh * d, .lddo = t->lddo,
            .lse = t->lse_ref + hh * c->tq, .delta = t->delta_ref + hh * c->tq,
            .dq = dq + hh * d, .dk = dk + (hh / t->g) * d, .dv = dv + (hh / t->g) * d,
        };
        dt_attn_head_bwd_ref(&a, &gr);
    }
    t->dq_ref = unpad(dq, c->tq, (int64_t)c->h * d, t->ldq);
    t->dk_ref = unpad(dk, c->tk, (int64_t)c->hkv * d, t->ldk);
    t->dv_ref = unpad(dv, c->tk, (int64_t)c->hkv * d, t->ldv);
    free(dq);
    free(dk);
    free(dv);
}

/* (h, tq) packed -> (h, ldlse) with the sentinel in the padding */
static float *head_strided(const float *x, int h, int64_t tq, int64_t ldlse)
{
    float *y = fbuf(h, tq, ldlse, 0.0f);
    for (int hh = 0; hh < h; hh++)
        memcpy(y + hh * ldlse, x + hh * tq, (size_t)tq * sizeof(float));
    return y;
}

static void td_init(tdata_t *t, const tcase_t *c, dt_dtype_t dt, int d, uint64_t seed)
{
    memset(t, 0, sizeof *t);
    t->c = c;
    t->dt = dt;
    t->d = d;
    t->g = c->h / c->hkv;
    t->ldq = (int64_t)c->h * d + 8;
    t->ldk = (int64_t)c->hkv * d + 16;
    t->ldv = (int64_t)c->hkv * d + 24;
    t->lddo = (int64_t)c->h * d + 40;
    t->ldo = (int64_t)c->h * d + 4;
    t->ldlse = c->tq + 3;
    t->lddq = (int64_t)c->h * d + 12;
    t->lddk = (int64_t)c->hkv * d + 20;
    t->lddv = (int64_t)c->hkv * d + 28;
    t->scale = c->scale != 0.0f ? c->scale : 1.0f / sqrtf((float)d);
    snprintf(t->tag, sizeof t->tag, "%s %s d=%d tq=%lld tk=%lld h=%d hkv=%d causal=%d %s win=%lld "
             "doc=%lld", c->name, dt_dtype_name(dt), d, (long long)c->tq, (long long)c->tk, c->h,
             c->hkv, c->causal, c->pos ? "pos=arrays" : "pos=q0/k0", (long long)c->win,
             (long long)c->doc);

    snprintf(running, sizeof running, "%s", t->tag);
    ht_init(&t->q, dt, c->tq, (int64_t)c->h * d, t->ldq, seed * 8 + 1);
    ht_init(&t->k, dt, c->tk, (int64_t)c->hkv * d, t->ldk, seed * 8 + 2);
    ht_init(&t->v, dt, c->tk, (int64_t)c->hkv * d, t->ldv, seed * 8 + 3);
    ht_init(&t->dout, dt, c->tq, (int64_t)c->h * d, t->lddo, seed * 8 + 4);
    t->qpos = dt_xmallocarray((size_t)c->tq, sizeof(int64_t));
    t->kpos = dt_xmallocarray((size_t)c->tk, sizeof(int64_t));
    positions(c->tq, c->pos, c->q0, c->q1, t->qpos);
    positions(c->tk, c->pos, c->k0, c->k1, t->kpos);
    if (masked(c)) {
        t->qlo = dt_xmallocarray(2 * (size_t)c->tq, sizeof(int64_t));
        t->qhi = t->qlo + c->tq;
        for (int64_t i = 0; i < c->tq; i++)
            interval(c, t->qpos[i], &t->qlo[i], &t->qhi[i]);
    }

    ref_forward(t);
    ref_backward(t);

    t->q_d = dput(t->q.b, (size_t)(c->tq * t->ldq) * 2);
    t->k_d = dput(t->k.b, (size_t)(c->tk * t->ldk) * 2);
    t->v_d = dput(t->v.b, (size_t)(c->tk * t->ldv) * 2);
    t->do_d = dput(t->dout.b, (size_t)(c->tq * t->lddo) * 2);
    if (c->pos) {
        t->qpos_d = dput(t->qpos, (size_t)c->tq * sizeof(int64_t));
        t->kpos_d = dput(t->kpos, (size_t)c->tk * sizeof(int64_t));
    }
    if (t->qlo)
        t->qlo_d = dput(t->qlo, 2 * (size_t)c->tq * sizeof(int64_t));
    float *l = head_strided(t->lse_ref, c->h, c->tq, t->ldlse);
    float *dl = head_strided(t->delta_ref, c->h, c->tq, t->ldlse);
    t->lse_d = dput(l, (size_t)(c->h * t->ldlse) * sizeof(float));
    t->delta_d = dput(dl, (size_t)(c->h * t->ldlse) * sizeof(float));
    free(l);
    free(dl);
}

static void td_free(tdata_t *t)
{
    ht_free(&t->q);
    ht_free(&t->k);
    ht_free(&t->v);
    ht_free(&t->dout);
    free(t->qpos);
    free(t->kpos);
    free(t->qlo);
    dfree(t->qlo_d);
    free(t->o_ref);
    free(t->lse_ref);
    free(t->delta_ref);
    free(t->dq_ref);
    free(t->dk_ref);
    free(t->dv_ref);
    dfree(t->q_d);
    dfree(t->k_d);
    dfree(t->v_d);
    dfree(t->do_d);
    dfree(t->qpos_d);
    dfree(t->kpos_d);
    dfree(t->lse_d);
    dfree(t->delta_d);
}

/* The launcher arguments for key rows [j0, j1) of the case. */
static dt_attn_cuda_t td_args(const tdata_t *t, int64_t j0, int64_t j1)
{
    const tcase_t *c = t->c;
    size_t es = dt_dtype_size(t->dt);
    return (dt_attn_cuda_t){
        .tq = c->tq, .tk = j1 - j0,
        .h = c->h, .hkv = c->hkv, .d = t->d,
        .dtype = t->dt,
        .q = t->q_d, .ldq = t->ldq,
        .k = offs(t->k_d, j0 * t->ldk, es), .ldk = t->ldk,
        .v = offs(t->v_d, j0 * t->ldv, es), .ldv = t->ldv,
        .causal = c->causal,
        .q0 = c->pos ? 0 : c->q0, .k0 = c->pos ? 0 : c->k0 + j0,
        .qpos = t->qpos_d, .kpos = t->kpos_d ? t->kpos_d + j0 : NULL,
        .qlo = t->qlo_d, .qhi = t->qlo_d ? t->qlo_d + c->tq : NULL,
        .scale = c->scale,
    };
}

/*-- DT_ATTN_KERNEL=cudnn: the same cases through cuDNN's blocks ------------------------
 * (engine/attn/attn_block.h): the block cut into pieces by its position
 * runs, bf16/fp16 partials merged into the fp32 state; what cuDNN does not
 * take (masks) runs on dt's kernels as before. */
static int use_cudnn;
/* the stream every kernel is queued on (a created one: the simulator of
 * tests/gpu/sim, like the engine, never uses the legacy stream) */
static cudaStream_t ts;

/* The runs of positions of query rows (keys = 0) or key rows [j0, j1). */
static int case_runs(const tcase_t *c, int keys, int64_t j0, int64_t j1, dt_run_t *r)
{
    const int64_t n = keys ? c->tk : c->tq, a = keys ? c->k0 : c->q0, b = keys ? c->k1 : c->q1;
    int k = 0;

    if (!c->pos) {
        r[0] = (dt_run_t){ .start = a + j0, .len = j1 - j0 };
        return 1;
    }
    if (j0 < n / 2)
        r[k++] = (dt_run_t){ .start = a + j0, .len = (j1 < n / 2 ? j1 : n / 2) - j0 };
    if (j1 > n / 2) {
        int64_t s = j0 > n / 2 ? j0 : n / 2;
        r[k++] = (dt_run_t){ .start = b + (s - n / 2), .len = j1 - s };
    }
    return k;
}

static dt_attn_blk_t cudnn_blk(const tdata_t *t, int bwd, const void *ohalf)
{
    dt_attn_blk_t b = { .cudnn = 1, .det = 1, .ohalf = ohalf };
#ifdef DT_TEST_SIM
    b.rows = 128; /* every block in chunks of 128 query rows, keys cut short */
#endif
    dt_emsg_t em = { { 0 } };
    size_t bytes = 0;
    int64_t rows = t->c->tq > t->c->tk ? t->c->tq : t->c->tk;

    if (!launched(dt_attn_block_bytes(&b, rows, rows, t->c->h, t->c->hkv, t->d, t->dt,
                                      bwd ? t->lddo : (int64_t)t->c->h * t->d, bwd, &bytes, &em),
                  &em, "dt_attn_block_bytes", t->tag))
        bytes = 0;
    b.bytes = bytes;
    b.ws = bytes ? dmalloc(bytes) : NULL;
    return b;
}

static int block_fwd(const tdata_t *t, const dt_attn_cuda_t *a, int64_t j0, int64_t j1, int acc,
                     float *o, float *lse, dt_emsg_t *em)
{
    if (!use_cudnn)
        return dt_attn_fwd_cuda(a, acc, o, t->ldo, lse, t->ldlse, ts, em);
    dt_run_t qr[2], kr[2];
    int nq = case_runs(t->c, 0, 0, t->c->tq, qr), nk = case_runs(t->c, 1, j0, j1, kr);
    dt_attn_blk_t b = cudnn_blk(t, 0, NULL);
    /* a keeps its position arrays beside the runs, as the ring's blocks do:
     * the pieces cuDNN takes follow the runs, those dt's kernels take (and
     * a block with masks, whole on dt's kernels) read the arrays */
    int rc = dt_attn_block_fwd(&b, a, qr, nq, kr, nk, acc, o, t->ldo, lse, t->ldlse, ts, em);
    GC_CUDA(cudaDeviceSynchronize());
    dfree(b.ws);
    return rc;
}

static int block_bwd(const tdata_t *t, const dt_attn_cuda_t *a, int64_t j0, int64_t j1,
                     const dt_attn_cuda_grad_t *g, dt_emsg_t *em)
{
    if (!use_cudnn)
        return dt_attn_bwd_cuda(a, g, ts, em);
    /* the forward's final o in dtype at dout's stride: the reference's */
    const tcase_t *c = t->c;
    const int64_t w = (int64_t)c->h * t->d;
    uint16_t *oh = calloc((size_t)(c->tq * t->lddo), sizeof(uint16_t));
    for (int64_t i = 0; i < c->tq; i++)
        for (int64_t e = 0; e < w; e++)
            oh[i * t->lddo + e] = dt_half_bits(t->dt, t->o_ref[i * w + e]);
    void *oh_d = dput(oh, (size_t)(c->tq * t->lddo) * 2);
    dt_run_t qr[2], kr[2];
    int nq = case_runs(c, 0, 0, c->tq, qr), nk = case_runs(c, 1, j0, j1, kr);
    dt_attn_blk_t b = cudnn_blk(t, 1, oh_d);
    int rc = dt_attn_block_bwd(&b, a, qr, nq, kr, nk, g, ts, em);
    GC_CUDA(cudaDeviceSynchronize());
    dfree(b.ws);
    dfree(oh_d);
    free(oh);
    return rc;
}

/* The forward over key blocks `blocks` (in that order, the first with
 * accumulate = 0 over NaN garbage); o and lse packed, host, allocated. */
static int td_forward(const tdata_t *t, const int64_t (*blocks)[2], int nblock, float **o,
                      float **lse)
{
    const tcase_t *c = t->c;
    int64_t wo = (int64_t)c->h * t->d;
    size_t no = (size_t)(c->tq * t->ldo), nl = (size_t)(c->h * t->ldlse);
    float *oh = fbuf(c->tq, wo, t->ldo, NAN), *lh = fbuf(c->h, c->tq, t->ldlse, NAN);
    float *od = dput(oh, no * sizeof(float)), *ld = dput(lh, nl * sizeof(float));
    dt_emsg_t em = { { 0 } };
    int ok = 1;

    for (int b = 0; b < nblock && ok; b++) {
        dt_attn_cuda_t a = td_args(t, blocks[b][0], blocks[b][1]);
        ok = launched(block_fwd(t, &a, blocks[b][0], blocks[b][1], b > 0, od, ld, &em), &em,
                      use_cudnn ? "dt_attn_block_fwd (cudnn)" : "dt_attn_fwd_cuda", t->tag);
    }
    if (ok) {
        dget(oh, od, no * sizeof(float));
        dget(lh, ld, nl * sizeof(float));
        int64_t bad = pad_changed(oh, c->tq, wo, t->ldo) + pad_changed(lh, c->h, c->tq, t->ldlse);
        gc_check(bad == 0, "forward padding of o (ldo %lld) and lse (ldlse %lld) untouched "
                           "[%s]: %lld values changed",
                 (long long)t->ldo, (long long)t->ldlse, t->tag, (long long)bad);
        *o = unpad(oh, c->tq, wo, t->ldo);
        *lse = unpad(lh, c->h, c->tq, t->ldlse);
    }
    dfree(od);
    dfree(ld);
    free(oh);
    free(lh);
    return ok;
}

/* Rows with no visible key must be exactly o = 0, lse = -inf. */
static void check_empty_rows(const tdata_t *t, const float *o, const float *lse)
{
    const tcase_t *c = t->c;
    int64_t rows = 0, bad = 0;
    for (int hh = 0; hh < c->h; hh++)
        for (int64_t i = 0; i < c->tq; i++) {
            if (!isinf(t->lse_ref[hh * c->tq + i]))
                continue;
            rows++;
            int rowbad = !(isinf(lse[hh * c->tq + i]) && lse[hh * c->tq + i] < 0);
            for (int e = 0; e < t->d; e++)
                rowbad |= o[(i * c->h + hh) * t->d + e] != 0.0f;
            bad += rowbad;
        }
    if (rows)
        gc_check(bad == 0, "queries that see no key get o = 0, lse = -inf [%s]: %lld of %lld "
                           "(query, head) rows wrong",
                 t->tag, (long long)bad, (long long)rows);
}

/* The backward over key blocks, into dq/dk/dv that start from `init`
 * (packed values; the padding is the sentinel); the results packed into
 * dq/dk/dv, host, allocated; raw (strided) copies into raw[3] if not NULL. */
static int td_backward(const tdata_t *t, const int64_t (*blocks)[2], int nblock,
                       float *const init[3], float *out[3], float *raw[3])
{
    const tcase_t *c = t->c;
    const int64_t rows[3] = { c->tq, c->tk, c->tk };
    const int64_t w[3] = { (int64_t)c->h * t->d, (int64_t)c->hkv * t->d, (int64_t)c->hkv * t->d };
    const int64_t ld[3] = { t->lddq, t->lddk, t->lddv };
    float *hb[3], *db[3];
    dt_emsg_t em = { { 0 } };
    int ok = 1;

    for (int x = 0; x < 3; x++) {
        hb[x] = fbuf(rows[x], w[x], ld[x], 0.0f);
        for (int64_t r = 0; r < rows[x]; r++)
            memcpy(hb[x] + r * ld[x], init[x] + r * w[x], (size_t)w[x] * sizeof(float));
        db[x] = dput(hb[x], (size_t)(rows[x] * ld[x]) * sizeof(float));
    }
    for (int b = 0; b < nblock && ok; b++) {
        int64_t j0 = blocks[b][0];
        dt_attn_cuda_t a = td_args(t, j0, blocks[b][1]);
        dt_attn_cuda_grad_t g = {
            .dout = t->do_d, .lddo = t->lddo,
            .lse = t->lse_d, .ldlse = t->ldlse, .delta = t->delta_d,
            .dq = db[0], .lddq = t->lddq,
            .dk = db[1] + j0 * t->lddk, .lddk = t->lddk,
            .dv = db[2] + j0 * t->lddv, .lddv = t->lddv,
        };
        ok = launched(block_bwd(t, &a, j0, blocks[b][1], &g, &em), &em,
                      use_cudnn ? "dt_attn_block_bwd (cudnn)" : "dt_attn_bwd_cuda", t->tag);
    }
    if (ok) {
        int64_t bad = 0;
        for (int x = 0; x < 3; x++) {
            dget(hb[x], db[x], (size_t)(rows[x] * ld[x]) * sizeof(float));
            bad += pad_changed(hb[x], rows[x], w[x], ld[x]);
            out[x] = unpad(hb[x], rows[x], w[x], ld[x]);
            if (raw) {
                raw[x] = hb[x];
                hb[x] = NULL;
            }
        }
        gc_check(bad == 0, "backward padding of dq/dk/dv (strides %lld/%lld/%lld) untouched "
                           "[%s]: %lld values changed",
                 (long long)t->lddq, (long long)t->lddk, (long long)t->lddv, t->tag,
                 (long long)bad);
    }
    for (int x = 0; x < 3; x++) {
        free(hb[x]);
        dfree(db[x]);
    }
    return ok;
}

static void run_case(const tcase_t *c, dt_dtype_t dt, int d, uint64_t seed)
{
    tdata_t t;
    tol_t to = tol_o(dt), tl = tol_lse();
    const int64_t all[1][2] = { { 0, c->tk } };
    /* three blocks, not tile multiples, run out of order */
    const int64_t b1 = c->tk * 2 / 5, b2 = c->tk * 3 / 4;
    const int64_t three[3][2] = { { b1, b2 }, { 0, b1 }, { b2, c->tk } };
    float *o = NULL, *lse = NULL, *o3 = NULL, *lse3 = NULL;
    const size_t no = (size_t)(c->tq * c->h * d), nl = (size_t)(c->h * c->tq);

    td_init(&t, c, dt, d, seed);
    if (td_forward(&t, all, 1, &o, &lse)) {
        expect_close("forward o vs reference", t.tag, o, t.o_ref, no, "i,h,e", c->h, d, to);
        expect_close("forward lse vs reference", t.tag, lse, t.lse_ref, nl, "h,i,-", c->tq, 1,
                     tl);
        check_empty_rows(&t, o, lse);
    }
    if (td_forward(&t, three, 3, &o3, &lse3)) {
        expect_close("accumulate=1 over 3 key blocks: o vs reference", t.tag, o3, t.o_ref, no,
                     "i,h,e", c->h, d, to);
        expect_close("accumulate=1 over 3 key blocks: lse vs reference", t.tag, lse3, t.lse_ref,
                     nl, "h,i,-", c->tq, 1, tl);
        check_empty_rows(&t, o3, lse3);
        if (o)
            expect_close("accumulate=1 over 3 key blocks: o vs one call (2x tolerance)", t.tag,
                         o3, o, no, "i,h,e", c->h, d, tol_twice(to));
        if (lse)
            expect_close("accumulate=1 over 3 key blocks: lse vs one call (2x tolerance)",
                         t.tag, lse3, lse, nl, "h,i,-", c->tq, 1, tol_twice(tl));
    }

    /* backward from non-zero dq/dk/dv: initial values of the gradients'
     * own size, so a kernel that writes instead of adding fails */
    const size_t n[3] = { no, (size_t)(c->tk * c->hkv * d), (size_t)(c->tk * c->hkv * d) };
    const float *ref[3] = { t.dq_ref, t.dk_ref, t.dv_ref };
    const char *names[3] = { "dq", "dk", "dv" };
    float *init[3], *want[3], *got[3] = { 0 }, *raw[3] = { 0 }, *got2[3] = { 0 },
                                *raw2[3] = { 0 }, *got3[3] = { 0 };
    int64_t s = 0;
    for (int x = 0; x < 3; x++) {
        double sz = rms(ref[x], n[x]);
        init[x] = dt_xmallocarray(n[x] + 1, sizeof(float));
        want[x] = dt_xmallocarray(n[x] + 1, sizeof(float));
        for (size_t i = 0; i < n[x]; i++) {
            init[x][i] = (float)(sz * rnorm(seed * 8 + 5, &s));
            want[x][i] = init[x][i] + ref[x][i];
        }
    }
    if (td_backward(&t, all, 1, init, got, raw)) {
        for (int x = 0; x < 3; x++) {
            char what[96];
            snprintf(what, sizeof what, "backward %s (added to non-zero) vs reference", names[x]);
            int64_t w = x == 0 ? c->h : c->hkv;
            expect_close(what, t.tag, got[x], want[x], n[x], "row,h,e", w, d,
                         tol_grad(dt, gc_maxabs(ref[x], n[x])));
        }
        if (td_backward(&t, all, 1, init, got2, raw2)) {
            const int64_t rows[3] = { c->tq, c->tk, c->tk };
            const int64_t ld[3] = { t.lddq, t.lddk, t.lddv };
            for (int x = 0; x < 3; x++) {
                char what[64];
                snprintf(what, sizeof what, "backward determinism: %s of two runs", names[x]);
                expect_same(what, t.tag, raw[x], raw2[x], (size_t)(rows[x] * ld[x]));
            }
        }
    }
    if (td_backward(&t, three, 3, init, got3, NULL))
        for (int x = 0; x < 3; x++) {
            char what[96];
            snprintf(what, sizeof what, "backward over 3 key blocks: %s vs reference", names[x]);
            int64_t w = x == 0 ? c->h : c->hkv;
            expect_close(what, t.tag, got3[x], want[x], n[x], "row,h,e", w, d,
                         tol_grad(dt, gc_maxabs(ref[x], n[x])));
        }
    for (int x = 0; x < 3; x++) {
        free(init[x]);
        free(want[x]);
        free(got[x]);
        free(raw[x]);
        free(got2[x]);
        free(raw2[x]);
        free(got3[x]);
    }
    free(o);
    free(lse);
    free(o3);
    free(lse3);
    td_free(&t);
}

/*-- key blocks wholly in the future ----------------------------------------------------
 * Keys all after the last query (q0/k0 or position arrays with gaps).
 * accumulate = 0 over NaN: o = 0, lse = -inf everywhere. accumulate = 1 on
 * the state of an earlier block: that state unchanged, bit for bit. */
static void run_future(dt_dtype_t dt, int d, int pos)
{
    const int64_t tq = 300, tk = 517;
    const int h = 8, hkv = 2;
    const int64_t ldq = h * d + 8, ldk = hkv * d + 8, ldo = h * d + 4, ldlse = tq + 1;
    htensor_t q, k, v;
    char tag[128];
    dt_emsg_t em = { { 0 } };
    size_t no = (size_t)(tq * ldo), nl = (size_t)(h * ldlse);

    snprintf(tag, sizeof tag, "future block %s d=%d tq=%lld tk=%lld h=%d hkv=%d %s",
             dt_dtype_name(dt), d, (long long)tq, (long long)tk, h, hkv,
             pos ? "pos=arrays" : "pos=q0/k0");
    snprintf(running, sizeof running, "%s", tag);
    ht_init(&q, dt, tq, h * d, ldq, 901);
    ht_init(&k, dt, tk, hkv * d, ldk, 902);
    ht_init(&v, dt, tk, hkv * d, ldk, 903);
    void *qd = dput(q.b, (size_t)(tq * ldq) * 2), *kd = dput(k.b, (size_t)(tk * ldk) * 2);
    void *vd = dput(v.b, (size_t)(tk * ldk) * 2);
    int64_t *qp = dt_xmallocarray((size_t)tq, sizeof(int64_t));
    int64_t *kpast = dt_xmallocarray((size_t)tk, sizeof(int64_t));
    int64_t *kfut = dt_xmallocarray((size_t)tk, sizeof(int64_t));
    for (int64_t i = 0; i < tq; i++)
        qp[i] = 1000 + 2 * i; /* sorted, with gaps: 1000 .. 1598 */
    for (int64_t j = 0; j < tk; j++) {
        kpast[j] = j;                /* all before the first query */
        kfut[j] = 1000 + 2 * tq + j; /* all after the last query */
    }
    int64_t *qpd = dput(qp, (size_t)tq * 8), *kpastd = dput(kpast, (size_t)tk * 8);
    int64_t *kfutd = dput(kfut, (size_t)tk * 8);

    dt_attn_cuda_t a = {
        .tq = tq, .tk = tk, .h = h, .hkv = hkv, .d = d, .dtype = dt,
        .q = qd, .ldq = ldq, .k = kd, .ldk = ldk, .v = vd, .ldv = ldk,
        .causal = 1, .scale = 0.0f,
    };
    dt_attn_cuda_t past = a, fut = a;
    if (pos) {
        past.qpos = fut.qpos = qpd;
        past.kpos = kpastd;
        fut.kpos = kfutd;
    } else {
        past.q0 = fut.q0 = 600; /* queries 600 .. 899 */
        past.k0 = 0;            /* keys 0 .. 516: all visible */
        fut.k0 = 600 + tq;      /* keys 900 ..: none visible */
    }

    float *oh = fbuf(tq, h * d, ldo, NAN), *lh = fbuf(h, tq, ldlse, NAN);
    float *os = dt_xmallocarray(no, sizeof(float)), *ls = dt_xmallocarray(nl, sizeof(float));
    float *od = dput(oh, no * sizeof(float)), *ld = dput(lh, nl * sizeof(float));

    /* accumulate = 0 on garbage: every row empty */
    if (launched(dt_attn_fwd_cuda(&fut, 0, od, ldo, ld, ldlse, ts, &em), &em, "dt_attn_fwd_cuda",
                 tag)) {
        dget(oh, od, no * sizeof(float));
        dget(lh, ld, nl * sizeof(float));
        int64_t bad = 0;
        for (int64_t i = 0; i < tq; i++)
            for (int64_t e = 0; e < h * d; e++)
                bad += oh[i * ldo + e] != 0.0f;
        for (int hh = 0; hh < h; hh++)
            for (int64_t i = 0; i < tq; i++)
                bad += !(isinf(lh[hh * ldlse + i]) && lh[hh * ldlse + i] < 0);
        bad += pad_changed(oh, tq, h * d, ldo) + pad_changed(lh, h, tq, ldlse);
        gc_check(bad == 0, "accumulate=0, all keys in the future: o = 0, lse = -inf, padding "
                           "kept [%s]: %lld values wrong",
                 tag, (long long)bad);
    }
    /* accumulate = 1 after a block in the past: state unchanged */
    if (launched(dt_attn_fwd_cuda(&past, 0, od, ldo, ld, ldlse, ts, &em), &em,
                 "dt_attn_fwd_cuda", tag)) {
        dget(os, od, no * sizeof(float));
        dget(ls, ld, nl * sizeof(float));
        int64_t finite = 0;
        for (int hh = 0; hh < h; hh++)
            for (int64_t i = 0; i < tq; i++)
                finite += isfinite(ls[hh * ldlse + i]) != 0;
        gc_check(finite == h * tq, "block wholly in the past: every lse finite [%s]: %lld of "
                                   "%lld",
                 tag, (long long)finite, (long long)(h * tq));
        if (launched(dt_attn_fwd_cuda(&fut, 1, od, ldo, ld, ldlse, ts, &em), &em,
                     "dt_attn_fwd_cuda", tag)) {
            dget(oh, od, no * sizeof(float));
            dget(lh, ld, nl * sizeof(float));
            expect_same("accumulate=1, all keys in the future: o unchanged", tag, oh, os, no);
            expect_same("accumulate=1, all keys in the future: lse unchanged", tag, lh, ls, nl);
        }
    }
    free(oh);
    free(lh);
    free(os);
    free(ls);
    free(qp);
    free(kpast);
    free(kfut);
    dfree(od);
    dfree(ld);
    dfree(qd);
    dfree(kd);
    dfree(vd);
    dfree(qpd);
    dfree(kpastd);
    dfree(kfutd);
    ht_free(&q);
    ht_free(&k);
    ht_free(&v);
}

/*-- the delta kernel ------------------------------------------------------------------
 * delta = rowsum(dout * o) in fp32 over d terms: any summation order errs
 * by at most about d * 2^-24 * sum|dout * o| (the products round once
 * more), so the bound per row is d * 2^-23 * sum|terms| + 1e-6; the values
 * themselves are ~sqrt(d) ~ 10, far above it. */
static void run_delta(dt_dtype_t dt, int d)
{
    const int64_t n = 300;
    const int h = 8;
    const int64_t lddo = h * d + 40, ldo = h * d + 4, ldd = n + 3;
    htensor_t dout;
    char tag[96];
    dt_emsg_t em = { { 0 } };
    int64_t s = 0;

    snprintf(tag, sizeof tag, "delta %s d=%d n=%lld h=%d", dt_dtype_name(dt), d, (long long)n, h);
    snprintf(running, sizeof running, "%s", tag);
    ht_init(&dout, dt, n, h * d, lddo, 701);
    float *o = fbuf(n, h * d, ldo, 0.0f);
    for (int64_t i = 0; i < n; i++)
        for (int64_t e = 0; e < h * d; e++)
            o[i * ldo + e] = (float)rnorm(77, &s);
    float *want = dt_xmallocarray((size_t)(h * n), sizeof(float));
    for (int hh = 0; hh < h; hh++)
        dt_attn_delta_cpu(n, d, dout.f + hh * d, lddo, o + hh * d, ldo, want + hh * n);

    void *dod = dput(dout.b, (size_t)(n * lddo) * 2);
    float *od = dput(o, (size_t)(n * ldo) * sizeof(float));
    float *dh = fbuf(h, n, ldd, NAN);
    float *dd = dput(dh, (size_t)(h * ldd) * sizeof(float));
    if (launched(dt_attn_delta_cuda(n, h, d, dt, dod, lddo, od, ldo, dd, ldd, ts, &em), &em,
                 "dt_attn_delta_cuda", tag)) {
        dget(dh, dd, (size_t)(h * ldd) * sizeof(float));
        int64_t bad = 0, at = -1;
        double worst = 0, num = 0, den = 0;
        for (int hh = 0; hh < h; hh++)
            for (int64_t i = 0; i < n; i++) {
                double sabs = 0;
                for (int e = 0; e < d; e++)
                    sabs += fabs((double)dout.f[i * lddo + hh * d + e] * o[i * ldo + hh * d + e]);
                double g = dh[hh * ldd + i], w = want[hh * n + i];
                double err = fabs(g - w), bound = d * 0x1.0p-23 * sabs + 1e-6;
                num += (g - w) * (g - w);
                den += w * w;
                if (!(err <= bound)) {
                    if (bad++ == 0)
                        at = hh * n + i;
                }
                if (err / bound > worst || isnan(err))
                    worst = isnan(err) ? INFINITY : err / bound;
            }
        bad += pad_changed(dh, h, n, ldd);
        gc_check(bad == 0 && sqrt(num / den) <= 1e-5,
                 "dt_attn_delta_cuda vs dt_attn_delta_cpu [%s]: %lld wrong (first at %lld), "
                 "worst |err| / (d 2^-23 sum|dout o| + 1e-6) = %.3g (<= 1), rel L2 %.3g "
                 "(<= 1e-5), padding kept",
                 tag, (long long)bad, (long long)at, worst, sqrt(num / den));
    }
    ht_free(&dout);
    free(o);
    free(want);
    free(dh);
    dfree(dod);
    dfree(od);
    dfree(dd);
}

/*-- a long block: many tiles, sampled against the reference -------------------------
 * q, k, v (T, H, D) packed, causal self-attention (q0 = k0 = 0): the
 * forward for 70 sampled query rows; the backward (lse and delta from the
 * kernels themselves) twice, bit-identical, and for the sampled rows (dq)
 * and a range of 64 keys (dk, dv) against the reference given the same
 * lse and delta. */
static void run_long(dt_dtype_t dt, int d, int64_t T)
{
    const int h = 8, hkv = 2, g = h / hkv;
    const int64_t ldq = h * d, ldk = hkv * d;
    htensor_t q, k, v, dout;
    char tag[96];
    dt_emsg_t em = { { 0 } };
    const float scale = 1.0f / sqrtf((float)d);
    const size_t nq = (size_t)(T * ldq), nk = (size_t)(T * ldk), nl = (size_t)(h * T);

    snprintf(tag, sizeof tag, "long %s d=%d T=%lld h=%d hkv=%d causal=1", dt_dtype_name(dt), d,
             (long long)T, h, hkv);
    snprintf(running, sizeof running, "%s", tag);
    ht_init(&q, dt, T, ldq, ldq, 1001);
    ht_init(&k, dt, T, ldk, ldk, 1002);
    ht_init(&v, dt, T, ldk, ldk, 1003);
    ht_init(&dout, dt, T, ldq, ldq, 1004);
    void *qd = dput(q.b, nq * 2), *kd = dput(k.b, nk * 2), *vd = dput(v.b, nk * 2);
    void *dod = dput(dout.b, nq * 2);
    float *od = dmalloc(nq * 4), *ld = dmalloc(nl * 4), *deltad = dmalloc(nl * 4);
    float *dqd = dmalloc(nq * 4), *dkd = dmalloc(nk * 4), *dvd = dmalloc(nk * 4);
    float *o = dt_xmallocarray(nq, 4), *lse = dt_xmallocarray(nl, 4);
    float *delta = dt_xmallocarray(nl, 4);
    float *r1[3], *r2[3];
    const size_t n3[3] = { nq, nk, nk };
    for (int x = 0; x < 3; x++) {
        r1[x] = dt_xmallocarray(n3[x], 4);
        r2[x] = dt_xmallocarray(n3[x], 4);
    }
    int64_t *pos = dt_xmallocarray((size_t)T, sizeof(int64_t));
    for (int64_t i = 0; i < T; i++)
        pos[i] = i;
    float *so = NULL, *sref = NULL, *sl = NULL, *slref = NULL;

    dt_attn_cuda_t a = {
        .tq = T, .tk = T, .h = h, .hkv = hkv, .d = d, .dtype = dt,
        .q = qd, .ldq = ldq, .k = kd, .ldk = ldk, .v = vd, .ldv = ldk,
        .causal = 1, .q0 = 0, .k0 = 0, .scale = 0.0f,
    };
    if (!launched(dt_attn_fwd_cuda(&a, 0, od, ldq, ld, T, ts, &em), &em, "dt_attn_fwd_cuda", tag))
        goto out;
    if (!launched(dt_attn_delta_cuda(T, h, d, dt, dod, ldq, od, ldq, deltad, T, ts, &em), &em,
                  "dt_attn_delta_cuda", tag))
        goto out;
    dget(o, od, nq * 4);
    dget(lse, ld, nl * 4);
    dget(delta, deltad, nl * 4);

    /* sampled rows: the first, every 61st, the last three */
    int64_t rows[80];
    int nr = 0;
    for (int64_t i = 0; i < T && nr < 76; i += 61)
        rows[nr++] = i;
    for (int64_t i = T - 3; i < T; i++)
        rows[nr++] = i;
    size_t nso = (size_t)nr * (size_t)ldq, nsl = (size_t)nr * (size_t)h;
    so = dt_xcalloc(nso, 4);
    sref = dt_xcalloc(nso, 4);
    sl = dt_xmallocarray(nsl, 4);
    slref = dt_xmallocarray(nsl, 4);
    for (int r = 0; r < nr; r++)
        for (int hh = 0; hh < h; hh++) {
            int64_t i = rows[r];
            dt_attn_head_t ah = {
                .tq = 1, .tk = T, .d = d,
                .q = q.f + i * ldq + hh * d, .ldq = ldq,
                .k = k.f + (hh / g) * d, .ldk = ldk, .v = v.f + (hh / g) * d, .ldv = ldk,
                .qpos = pos + i, .kpos = pos, .scale = scale,
            };
            slref[r * h + hh] = -INFINITY;
            dt_attn_head_fwd_ref(&ah, sref + (size_t)r * ldq + hh * d, d, slref + r * h + hh);
            memcpy(so + (size_t)r * ldq + hh * d, o + i * ldq + hh * d, (size_t)d * 4);
            sl[r * h + hh] = lse[hh * T + i];
        }
    expect_close("forward o, sampled rows, vs reference", tag, so, sref, nso, "row,h,e", h, d,
                 tol_o(dt));
    expect_close("forward lse, sampled rows, vs reference", tag, sl, slref, nsl, "row,h,-", h,
                 1, tol_lse());

    /* backward from zero, twice */
    for (int run = 0; run < 2; run++) {
        dt_attn_cuda_grad_t gr = {
            .dout = dod, .lddo = ldq, .lse = ld, .ldlse = T, .delta = deltad,
            .dq = dqd, .lddq = ldq, .dk = dkd, .lddk = ldk, .dv = dvd, .lddv = ldk,
        };
        GC_CUDA(cudaMemset(dqd, 0, nq * 4));
        GC_CUDA(cudaMemset(dkd, 0, nk * 4));
        GC_CUDA(cudaMemset(dvd, 0, nk * 4));
        if (!launched(dt_attn_bwd_cuda(&a, &gr, ts, &em), &em, "dt_attn_bwd_cuda", tag))
            goto out;
        float **r = run ? r2 : r1;
        dget(r[0], dqd, nq * 4);
        dget(r[1], dkd, nk * 4);
        dget(r[2], dvd, nk * 4);
    }
    expect_same("backward determinism: dq of two runs", tag, r1[0], r2[0], nq);
    expect_same("backward determinism: dk of two runs", tag, r1[1], r2[1], nk);
    expect_same("backward determinism: dv of two runs", tag, r1[2], r2[2], nk);

    /* reference gradients: dq of the sampled rows (all keys), dk and dv of
     * keys [j0, j0 + 64) (all queries), from the kernels' lse and delta */
    {
        const int64_t j0 = T / 4 + 3, nj = 64;
        float *rdq = dt_xcalloc(nso, 4), *gdq = dt_xcalloc(nso, 4);
        float *rdk = dt_xcalloc((size_t)(nj * ldk), 4), *rdv = dt_xcalloc((size_t)(nj * ldk), 4);
        /* dq of all rows, dk and dv of all keys: written, never read */
        float *scratch = dt_xcalloc(nq, 4), *kscr = dt_xcalloc(nk, 4), *vscr = dt_xcalloc(nk, 4);
        for (int hh = 0; hh < h; hh++) {
            for (int r = 0; r < nr; r++) {
                int64_t i = rows[r];
                dt_attn_head_t ah = {
                    .tq = 1, .tk = T, .d = d,
                    .q = q.f + i * ldq + hh * d, .ldq = ldq,
                    .k = k.f + (hh / g) * d, .ldk = ldk, .v = v.f + (hh / g) * d, .ldv = ldk,
                    .qpos = pos + i, .kpos = pos, .scale = scale,
                };
                dt_attn_head_grad_t gg = {
                    .dout = dout.f + i * ldq + hh * d, .lddo = ldq,
                    .lse = lse + hh * T + i, .delta = delta + hh * T + i,
                    .dq = rdq + (size_t)r * ldq + hh * d,
                    .dk = kscr + (hh / g) * d, .dv = vscr + (hh / g) * d,
                };
                dt_attn_head_bwd_ref(&ah, &gg);
                memcpy(gdq + (size_t)r * ldq + hh * d, r1[0] + i * ldq + hh * d, (size_t)d * 4);
            }
            dt_attn_head_t ak = {
                .tq = T, .tk = nj, .d = d,
                .q = q.f + hh * d, .ldq = ldq,
                .k = k.f + j0 * ldk + (hh / g) * d, .ldk = ldk,
                .v = v.f + j0 * ldk + (hh / g) * d, .ldv = ldk,
                .qpos = pos, .kpos = pos + j0, .scale = scale,
            };
            /* per-head lse and delta are (T) contiguous at hh * T */
            dt_attn_head_grad_t gk = {
                .dout = dout.f + hh * d, .lddo = ldq,
                .lse = lse + hh * T, .delta = delta + hh * T,
                .dq = scratch + hh * d, .dk = rdk + (hh / g) * d, .dv = rdv + (hh / g) * d,
            };
            dt_attn_head_bwd_ref(&ak, &gk);
        }
        expect_close("backward dq, sampled rows, vs reference", tag, gdq, rdq, nso, "row,h,e", h,
                     d, tol_grad(dt, gc_maxabs(rdq, nso)));
        expect_close("backward dk, 64 keys, vs reference", tag, r1[1] + j0 * ldk, rdk,
                     (size_t)(nj * ldk), "key,hkv,e", hkv, d,
                     tol_grad(dt, gc_maxabs(rdk, (size_t)(nj * ldk))));
        expect_close("backward dv, 64 keys, vs reference", tag, r1[2] + j0 * ldk, rdv,
                     (size_t)(nj * ldk), "key,hkv,e", hkv, d,
                     tol_grad(dt, gc_maxabs(rdv, (size_t)(nj * ldk))));
        free(rdq);
        free(gdq);
        free(rdk);
        free(rdv);
        free(scratch);
        free(kscr);
        free(vscr);
    }
out:
    free(so);
    free(sref);
    free(sl);
    free(slref);
    for (int x = 0; x < 3; x++) {
        free(r1[x]);
        free(r2[x]);
    }
    free(o);
    free(lse);
    free(delta);
    free(pos);
    dfree(qd);
    dfree(kd);
    dfree(vd);
    dfree(dod);
    dfree(od);
    dfree(ld);
    dfree(deltad);
    dfree(dqd);
    dfree(dkd);
    dfree(dvd);
    ht_free(&q);
    ht_free(&k);
    ht_free(&v);
    ht_free(&dout);
}

/*-- refusals ----------------------------------------------------------------------*/

static void expect_einval(int rc, const dt_emsg_t *em, const char *what)
{
    gc_check(rc == DT_EINVAL && em->s[0] != '\0',
             "%s: returns DT_EINVAL with a message: got %s (%d) \"%s\"", what, dt_err_name(rc),
             rc, em->s);
}

static void run_invalid(void)
{
    const int64_t t = 64;
    const int h = 8, dmax = 128;
    size_t n32 = (size_t)(t * h * dmax) * 4;
    void *q = dmalloc(n32), *k = dmalloc(n32), *v = dmalloc(n32), *dout = dmalloc(n32);
    float *o = dmalloc(n32), *lse = dmalloc((size_t)(h * t) * 4);
    float *delta = dmalloc((size_t)(h * t) * 4);
    float *dq = dmalloc(n32), *dk = dmalloc(n32), *dv = dmalloc(n32);
    GC_CUDA(cudaMemset(q, 0, n32));
    GC_CUDA(cudaMemset(k, 0, n32));
    GC_CUDA(cudaMemset(v, 0, n32));
    GC_CUDA(cudaMemset(dout, 0, n32));

    static const struct {
        const char *what;
        int d, hkv;
        dt_dtype_t dt;
    } bad[] = {
        { "d=96 (not 64 or 128), h=8, hkv=8", 96, 8, DT_BF16 },
        { "hkv=3 does not divide h=8, d=64", 64, 3, DT_BF16 },
        { "dtype fp32 (only bf16 and fp16 read), d=64", 64, 8, DT_F32 },
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        int d = bad[i].d, hkv = bad[i].hkv;
        dt_attn_cuda_t a = {
            .tq = t, .tk = t, .h = h, .hkv = hkv, .d = d, .dtype = bad[i].dt,
            .q = q, .ldq = h * d, .k = k, .ldk = hkv * d, .v = v, .ldv = hkv * d,
            .causal = 1, .scale = 0.0f,
        };
        dt_attn_cuda_grad_t g = {
            .dout = dout, .lddo = h * d, .lse = lse, .ldlse = t, .delta = delta,
            .dq = dq, .lddq = h * d, .dk = dk, .lddk = hkv * d, .dv = dv, .lddv = hkv * d,
        };
        char what[160];
        dt_emsg_t em = { { 0 } };
        snprintf(what, sizeof what, "dt_attn_fwd_cuda, %s", bad[i].what);
        expect_einval(dt_attn_fwd_cuda(&a, 0, o, h * d, lse, t, ts, &em), &em, what);
        memset(&em, 0, sizeof em);
        snprintf(what, sizeof what, "dt_attn_bwd_cuda, %s", bad[i].what);
        expect_einval(dt_attn_bwd_cuda(&a, &g, ts, &em), &em, what);
    }
    cudaError_t e = cudaDeviceSynchronize();
    if (e == cudaSuccess)
        e = cudaGetLastError();
    gc_check(e == cudaSuccess, "no CUDA error left behind by the refused calls: %s",
             cudaGetErrorString(e));
    dfree(q);
    dfree(k);
    dfree(v);
    dfree(dout);
    dfree(o);
    dfree(lse);
    dfree(delta);
    dfree(dq);
    dfree(dk);
    dfree(dv);
}

/*-- main -------------------------------------------------------------------------*/

int main(void)
{
    gc_require_device("test_attn_cuda");

    struct cudaDeviceProp p;
    int dev = 0;
    GC_CUDA(cudaGetDevice(&dev));
    GC_CUDA(cudaGetDeviceProperties(&p, dev));
    GC_CUDA(cudaStreamCreateWithFlags(&ts, cudaStreamDefault));
    printf("device %d: %s, sm_%d%d, %d SMs, %.1f GiB\n", dev, p.name, p.major, p.minor,
           p.multiProcessorCount, (double)p.totalGlobalMem / (1 << 30));
#ifdef DT_TEST_SIM
    if (getenv("DT_ATTN_KERNEL") == NULL)
        dt_gpu_attn_set(DT_GPU_ATTN_CUDNN);
#endif
    use_cudnn = dt_gpu_attn_get() == DT_GPU_ATTN_CUDNN;
    if (use_cudnn) {
        dt_emsg_t em = { { 0 } };
        size_t v = dt_cudnn_version(&em);
        gc_check(v > 0, "DT_ATTN_KERNEL=cudnn: cuDNN loads: %s", v ? "yes" : em.s);
        if (v == 0)
            return gc_done();
        printf("blocks through cuDNN %zu (dt_attn_block_*), deterministic backward\n", v);
    }
    fflush(stdout);
    double t0 = dt_clock_now();

    check_rounding();
    run_invalid();
    static const dt_dtype_t dts[2] = { DT_BF16, DT_F16 };
    static const int ds[2] = { 64, 128 };
    uint64_t seed = 1;
#ifdef DT_TEST_SIM
    const int ni = 1, nj = 1; /* bf16, D = 64 (see the top) */
#else
    const int ni = 2, nj = 2;
#endif
    for (int i = 0; i < ni; i++)
        for (int j = 0; j < nj; j++) {
            run_delta(dts[i], ds[j]);
            for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++)
                run_case(&cases[c], dts[i], ds[j], seed++);
            run_future(dts[i], ds[j], 0);
            run_future(dts[i], ds[j], 1);
            printf("-- %s d=%d done, %.1f s\n", dt_dtype_name(dts[i]), ds[j],
                   dt_clock_now() - t0);
            fflush(stdout);
        }
#ifdef DT_TEST_SIM
    run_long(DT_BF16, 64, 1024);
#else
    run_long(DT_BF16, 128, 4096);
    run_long(DT_F16, 64, 4096);
#endif
    printf("-- done, %.1f s\n", dt_clock_now() - t0);
    return gc_done();
}
