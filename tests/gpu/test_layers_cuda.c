/* SPDX-License-Identifier: MIT
 *
 * GPU test of the layer kernels (kernels/cuda/layers_cuda.h: casts,
 * RMSNorm, RoPE, SwiGLU, the cuBLASLt linear layers) and of the small
 * attention kernels of attn_aux.cu (delta, LSE merge, the dilated gathers,
 * merge and scatter). Every kernel runs on seeded random inputs and is
 * compared with the plain-C reference of kernels/cpu (layers_ref.c,
 * attn_ref.c) or with a host loop; each line states the tolerance it was
 * held to and the largest |reference|, so a kernel that writes zeros fails.
 * Covered: odd sizes, in-place calls, ADDED gradients from non-zero starts,
 * RoPE at positions near 1e9, -inf rows of the merges, argument errors.
 *
 * Not here: the fused attention forward and backward (test_attn_cuda.c),
 * the ring (test_ring_cuda.c). A plain program on gpucheck.h: without a
 * usable GPU it prints SKIP and exits 77.
 */
#include "config.h"

#include <math.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cuda_runtime_api.h>

#include "common/mem.h"
#include "kernels/cpu/attn_cpu.h"
#include "kernels/cpu/layers_cpu.h"
#include "kernels/cuda/attn_cuda.h"
#include "kernels/cuda/layers_cuda.h"
#include "tests/gpu/gpucheck.h"

static cudaStream_t st;

/*-- random inputs: splitmix64 -------------------------------------------------*/

static uint64_t rng_state = 0x243f6a8885a308d3ull;

static uint64_t rng_next(void)
{
    uint64_t z = (rng_state += 0x9e3779b97f4a7c15ull);

    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

/* Uniform in [0, 1). */
static double rng_unit(void)
{
    return (double)(rng_next() >> 11) * 0x1.0p-53;
}

static float rng_uniform(float lo, float hi)
{
    return (float)(lo + (hi - lo) * rng_unit());
}

/* Standard normal (Box-Muller). */
static float rng_normal(void)
{
    double u1 = 1.0 - rng_unit(); /* (0, 1] */
    double u2 = rng_unit();

    return (float)(sqrt(-2.0 * log(u1)) * cos(6.283185307179586 * u2));
}

static float *hfloats(size_t n)
{
    return dt_xmallocarray(n, sizeof(float));
}

static float *fill_uniform(size_t n, float lo, float hi)
{
    float *p = hfloats(n);

    for (size_t i = 0; i < n; i++)
        p[i] = rng_uniform(lo, hi);
    return p;
}

static float *fill_normal(size_t n, float scale)
{
    float *p = hfloats(n);

    for (size_t i = 0; i < n; i++)
        p[i] = scale * rng_normal();
    return p;
}

static float *copy_floats(const float *src, size_t n)
{
    float *p = hfloats(n);

    memcpy(p, src, n * sizeof(float));
    return p;
}

/*-- bf16 and fp16 on the host (rounding: dt_half_bits in util.c) ------------*/

static uint32_t f32_bits(float f)
{
    uint32_t u;

    memcpy(&u, &f, sizeof u);
    return u;
}

/* src (n) rounded to t: returns the encoded elements (malloc'd, 2 or 4
 * bytes each) and writes the rounded values to val (n). */
static void *encode(dt_dtype_t t, const float *src, size_t n, float *val)
{
    if (t == DT_F32) {
        memcpy(val, src, n * sizeof(float));
        return copy_floats(src, n);
    }
    uint16_t *h = dt_xmallocarray(n, sizeof(uint16_t));
    for (size_t i = 0; i < n; i++) {
        h[i] = dt_half_bits(t, src[i]);
        val[i] = dt_half_value(t, h[i]);
    }
    return h;
}

/*-- device buffers -------------------------------------------------------------*/

static void *dev_alloc(size_t bytes)
{
    void *p = NULL;

    GC_CUDA(cudaMalloc(&p, bytes ? bytes : 1));
    return p;
}

static void *dev_upload(const void *h, size_t bytes)
{
    void *p = dev_alloc(bytes);

    GC_CUDA(cudaMemcpy(p, h, bytes, cudaMemcpyHostToDevice));
    GC_CUDA(cudaDeviceSynchronize());
    return p;
}

static void dev_put(void *d, const void *h, size_t bytes)
{
    GC_CUDA(cudaDeviceSynchronize());
    GC_CUDA(cudaMemcpy(d, h, bytes, cudaMemcpyHostToDevice));
    GC_CUDA(cudaDeviceSynchronize());
}

/* Waits for the stream (surfacing any kernel fault), then copies back. */
static void dev_get(void *h, const void *d, size_t bytes)
{
    GC_CUDA(cudaStreamSynchronize(st));
    GC_CUDA(cudaMemcpy(h, d, bytes, cudaMemcpyDeviceToHost));
}

/*-- comparisons ------------------------------------------------------------------*/

/* |got - want| <= atol + rtol |want| for all n (equal infinities pass);
 * fails also when every |want| is 0, so a kernel writing zeros cannot pass.
 * Prints the largest error, the tolerance and the largest |want|, and the
 * first mismatches on failure. */
static __attribute__((format(printf, 6, 7))) void check_close(const float *got, const float *want,
                                                              size_t n, double atol, double rtol,
                                                              const char *fmt, ...)
{
    char what[256];
    va_list ap;
    size_t at, shown = 0, nonfinite = 0;
    double maxabs = 0.0, maxref = 0.0;

    va_start(ap, fmt);
    vsnprintf(what, sizeof what, fmt, ap);
    va_end(ap);
    double excess = gc_maxerr(got, want, n, rtol, &at);
    for (size_t i = 0; i < n; i++) {
        if (isfinite(want[i]))
            maxref = fmax(maxref, fabs(want[i]));
        if (isfinite(want[i]) && isfinite(got[i]))
            maxabs = fmax(maxabs, fabs((double)got[i] - want[i]));
        else if (isfinite(want[i]))
            nonfinite++;
    }
    int ok = !isnan(excess) && excess <= atol && maxref > 0.0;
    if (nonfinite > 0)
        maxabs = NAN; /* a finite reference got inf or NaN */
    if (rtol > 0.0)
        gc_check(ok, "%s: max err %.2e (%.2e beyond %.1e |ref|) <= %.1e, max |ref| %.2e", what,
                 maxabs, excess, rtol, atol, maxref);
    else
        gc_check(ok, "%s: max err %.2e <= %.1e, max |ref| %.2e", what, maxabs, atol, maxref);
    for (size_t i = 0; !ok && i < n && shown < 5; i++) {
        double g = got[i], w = want[i];
        int bad = (isinf(g) || isinf(w)) ? g != w : !(fabs(g - w) <= atol + rtol * fabs(w));
        if (bad) {
            printf("    [%zu] got %.9g want %.9g\n", i, g, w);
            shown++;
        }
    }
}

/* Byte-for-byte equality (copies, and sums the host forms identically). */
static __attribute__((format(printf, 4, 5))) void check_exact(const void *got, const void *want,
                                                              size_t bytes, const char *fmt, ...)
{
    char what[256];
    va_list ap;
    const unsigned char *g = got, *w = want;
    size_t bad = 0, first = 0;

    va_start(ap, fmt);
    vsnprintf(what, sizeof what, fmt, ap);
    va_end(ap);
    for (size_t i = 0; i < bytes; i++)
        if (g[i] != w[i] && bad++ == 0)
            first = i;
    if (bad == 0)
        gc_check(1, "%s: %zu bytes identical (exact)", what, bytes);
    else
        gc_check(0, "%s: %zu of %zu bytes differ, first at byte %zu (exact)", what, bad, bytes,
                 first);
}

/*-- casts ------------------------------------------------------------------------*/

static void test_cast_dtype(dt_dtype_t t)
{
    enum { N = 4099 };
    const char *name = dt_dtype_name(t);
    const double u = t == DT_BF16 ? 0x1.0p-8 : 0x1.0p-11; /* unit roundoff */
    const float lo = t == DT_BF16 ? 0x1.0p-126f : 0x1.0p-14f, hi = t == DT_BF16 ? 3e38f : 65504.0f;
    static const float special[] = {
        0.0f,        -0.0f,       1.0f,           -1.0f,          65504.0f,
        65519.99f,   65520.0f,    -65520.0f,      1e5f,           0x1.0p-14f,
        0x1.0p-24f,  0x1.0p-25f,  0x1.8p-25f,     3e-8f,          1e-40f,
        -1e-40f,     3.4e38f,     -3.4e38f,       INFINITY,       -INFINITY,
        1.00390625f, 1.01171875f, 1.00048828125f, 1.00146484375f, 0x1.fffffep127f,
    };
    const size_t ns = sizeof special / sizeof special[0];
    dt_emsg_t em = { { 0 } };
    float *x = hfloats(N), *back = hfloats(N);
    uint16_t *bits = dt_xmallocarray(N, sizeof(uint16_t));

    for (size_t i = 0; i < N; i++)
        x[i] = i < ns ? special[i] : rng_normal() * powf(10.0f, (float)(int)(rng_next() % 19) - 9);

    /* fp32 -> t against the host's bitwise round-to-nearest-even */
    float *dx = dev_upload(x, N * sizeof(float));
    void *dh = dev_alloc(N * sizeof(uint16_t));
    float *dback = dev_alloc(N * sizeof(float));
    GC_OK(dt_cast_from_f32_cuda(t, N, dx, dh, st, &em), em);
    dev_get(bits, dh, N * sizeof(uint16_t));
    int bad = 0, first = -1;
    for (int i = 0; i < N; i++)
        if (bits[i] != dt_half_bits(t, x[i]) && bad++ == 0)
            first = i;
    gc_check(bad == 0, "cast fp32->%s n=%d (specials, 1e-9..1e9): %d differ from host RNE (exact)",
             name, N, bad);
    if (bad)
        printf("    [%d] x %.9g got 0x%04x want 0x%04x\n", first, x[first], bits[first],
               dt_half_bits(t, x[first]));

    /* and back: exact decode, relative error <= u in the normal range */
    GC_OK(dt_cast_to_f32_cuda(t, N, dh, dback, st, &em), em);
    dev_get(back, dback, N * sizeof(float));
    double rel = 0.0;
    int nnormal = 0;
    bad = 0;
    for (int i = 0; i < N; i++) {
        float want = dt_half_value(t, bits[i]);
        if (f32_bits(back[i]) != f32_bits(want))
            bad++;
        if (fabsf(x[i]) >= lo && fabsf(x[i]) <= hi) {
            rel = fmax(rel, fabs((double)back[i] - x[i]) / fabs(x[i]));
            nnormal++;
        }
    }
    gc_check(bad == 0 && rel <= u && nnormal > N / 4,
             "cast fp32->%s->fp32 round trip: %d decode mismatches (exact), max rel err %.2e <= "
             "%.1e over %d normal-range values",
             name, bad, rel, u, nnormal);

    /* every finite 16-bit pattern: decode exactly, and re-encode to itself */
    enum { P = 65536 };
    uint16_t *pat = dt_xmallocarray(P, sizeof(uint16_t)), *pat2 = dt_xmallocarray(P, 2);
    float *val = hfloats(P), *got = hfloats(P);
    int npat = 0;
    for (int p = 0; p < P; p++) {
        float v = dt_half_value(t, (uint16_t)p);
        if (isfinite(v)) {
            pat[npat] = (uint16_t)p;
            val[npat++] = v;
        }
    }
    void *dpat = dev_upload(pat, (size_t)npat * sizeof(uint16_t));
    float *dval = dev_alloc((size_t)npat * sizeof(float));
    GC_OK(dt_cast_to_f32_cuda(t, npat, dpat, dval, st, &em), em);
    dev_get(got, dval, (size_t)npat * sizeof(float));
    check_exact(got, val, (size_t)npat * sizeof(float), "cast %s->fp32, all %d finite patterns",
                name, npat);
    GC_OK(dt_cast_from_f32_cuda(t, npat, dval, dpat, st, &em), em);
    dev_get(pat2, dpat, (size_t)npat * sizeof(uint16_t));
    check_exact(pat2, pat, (size_t)npat * sizeof(uint16_t),
                "cast fp32->%s of the %d representable values", name, npat);

    cudaFree(dval);
    cudaFree(dpat);
    cudaFree(dback);
    cudaFree(dh);
    cudaFree(dx);
    free(got);
    free(val);
    free(pat2);
    free(pat);
    free(bits);
    free(back);
    free(x);
}

static void test_casts(void)
{
    enum { N = 1001 };
    dt_emsg_t em = { { 0 } };
    float *x = fill_normal(N, 1.0f), *got = hfloats(N);

    test_cast_dtype(DT_BF16);
    test_cast_dtype(DT_F16);

    float *dx = dev_upload(x, N * sizeof(float)), *dy = dev_alloc(N * sizeof(float));
    GC_OK(dt_cast_from_f32_cuda(DT_F32, N, dx, dy, st, &em), em);
    dev_get(got, dy, N * sizeof(float));
    check_exact(got, x, N * sizeof(float), "cast fp32->fp32 n=%d is a copy", N);
    int rc = dt_cast_from_f32_cuda(DT_BF16, 0, NULL, NULL, st, &em);
    gc_check(rc == 0, "cast n=0 with NULL tensors is a no-op (rc %d)", rc);
    cudaFree(dy);
    cudaFree(dx);
    free(got);
    free(x);
}

/*-- RMSNorm ----------------------------------------------------------------------*/

/* x ~ N(0, xs^2): with xs = 1e-3, mean(x^2) = 1e-6 is below eps = 1e-5,
 * so eps must be applied where the formula says. */
static void test_rmsnorm_case(int64_t T, int d, float xs)
{
    const float eps = 1e-5f;
    const size_t n = (size_t)T * d;
    dt_emsg_t em = { { 0 } };
    float *x = fill_normal(n, xs), *g = hfloats(d), *dy = fill_normal(n, 1.0f);
    float *dg0 = fill_uniform(d, -1.0f, 1.0f);
    float *yref = hfloats(n), *rref = hfloats(T), *dxref = hfloats(n), *dgref = copy_floats(dg0, d);
    float *y = hfloats(n), *r = hfloats(T), *dxg = hfloats(n), *dxg2 = hfloats(n);
    float *dgg = hfloats(d), *dgg2 = hfloats(d);

    for (int j = 0; j < d; j++)
        g[j] = 1.0f + 0.1f * rng_normal();
    dt_rmsnorm_fwd_ref(T, d, eps, x, g, yref, rref);
    dt_rmsnorm_bwd_ref(T, d, x, g, rref, dy, dxref, dgref);

    float *dx_ = dev_upload(x, n * sizeof(float)), *dg_ = dev_upload(g, d * sizeof(float));
    float *dyv = dev_alloc(n * sizeof(float)), *drstd = dev_alloc(T * sizeof(float));

    /* forward, out of place and in place */
    GC_OK(dt_rmsnorm_fwd_cuda(T, d, eps, dx_, dg_, dyv, drstd, st, &em), em);
    dev_get(y, dyv, n * sizeof(float));
    dev_get(r, drstd, T * sizeof(float));
    check_close(y, yref, n, 1e-6, 1e-5, "rmsnorm fwd T=%lld d=%d xs=%g: y", (long long)T, d,
                (double)xs);
    check_close(r, rref, T, 0.0, 1e-5, "rmsnorm fwd T=%lld d=%d xs=%g: rstd", (long long)T, d,
                (double)xs);
    float *dinp = dev_upload(x, n * sizeof(float));
    GC_OK(dt_rmsnorm_fwd_cuda(T, d, eps, dinp, dg_, dinp, drstd, st, &em), em);
    dev_get(y, dinp, n * sizeof(float));
    check_close(y, yref, n, 1e-6, 1e-5, "rmsnorm fwd T=%lld d=%d xs=%g in place (y = x)",
                (long long)T, d, (double)xs);

    /* backward from the reference rstd, so it is tested alone */
    float *ddy = dev_upload(dy, n * sizeof(float)), *ddx = dev_alloc(n * sizeof(float));
    float *ddg = dev_upload(dg0, d * sizeof(float));
    dev_put(drstd, rref, T * sizeof(float));
    GC_OK(dt_rmsnorm_bwd_cuda(T, d, dx_, dg_, drstd, ddy, ddx, ddg, st, &em), em);
    dev_get(dxg, ddx, n * sizeof(float));
    dev_get(dgg, ddg, d * sizeof(float));
    check_close(dxg, dxref, n, 1e-5, 1e-5, "rmsnorm bwd T=%lld d=%d xs=%g: dx WRITTEN",
                (long long)T, d, (double)xs);

    /* dg: the reference rounds to fp32 after every row, so hold both to the
     * scale of what is summed: |err_j| <= 1e-5 (|dg0_j| + sum_t |dy x rstd|) */
    double worst = 0.0, maxref = 0.0;
    int nan_seen = 0;
    for (int j = 0; j < d; j++) {
        double s = fabs(dg0[j]);
        for (int64_t t = 0; t < T; t++)
            s += fabs((double)dy[t * d + j] * x[t * d + j] * rref[t]);
        double e = fabs((double)dgg[j] - dgref[j]) / s;
        nan_seen |= isnan(e);
        worst = fmax(worst, e);
        maxref = fmax(maxref, fabs(dgref[j]));
    }
    gc_check(!nan_seen && worst <= 1e-5 && maxref > 0.0,
             "rmsnorm bwd T=%lld d=%d xs=%g: dg ADDED from dg0 != 0: max |err| / (|dg0| + sum_t "
             "|dy x rstd|) %.2e <= 1e-5, max |ref| %.2e",
             (long long)T, d, (double)xs, worst, maxref);

    /* the same call again gives the same bits; dg = NULL leaves dx alone */
    dev_put(ddg, dg0, d * sizeof(float));
    GC_OK(dt_rmsnorm_bwd_cuda(T, d, dx_, dg_, drstd, ddy, ddx, ddg, st, &em), em);
    dev_get(dgg2, ddg, d * sizeof(float));
    check_exact(dgg2, dgg, d * sizeof(float), "rmsnorm bwd T=%lld d=%d xs=%g: dg deterministic",
                (long long)T, d, (double)xs);
    GC_OK(dt_rmsnorm_bwd_cuda(T, d, dx_, dg_, drstd, ddy, ddx, NULL, st, &em), em);
    dev_get(dxg2, ddx, n * sizeof(float));
    check_exact(dxg2, dxg, n * sizeof(float), "rmsnorm bwd T=%lld d=%d xs=%g: dg = NULL, same dx",
                (long long)T, d, (double)xs);

    cudaFree(ddg);
    cudaFree(ddx);
    cudaFree(ddy);
    cudaFree(dinp);
    cudaFree(drstd);
    cudaFree(dyv);
    cudaFree(dg_);
    cudaFree(dx_);
    free(dgg2);
    free(dgg);
    free(dxg2);
    free(dxg);
    free(r);
    free(y);
    free(dgref);
    free(dxref);
    free(rref);
    free(yref);
    free(dg0);
    free(dy);
    free(g);
    free(x);
}

static void test_rmsnorm(void)
{
    test_rmsnorm_case(1, 64, 1.0f);
    test_rmsnorm_case(3, 7, 1.0f);
    test_rmsnorm_case(37, 1000, 1.0f);
    test_rmsnorm_case(37, 1000, 1e-3f);
    test_rmsnorm_case(257, 4096, 1.0f);
    test_rmsnorm_case(20000, 40, 1.0f); /* more than 512 row chunks: the cap, empty chunks */
}

/*-- RoPE -------------------------------------------------------------------------*/

/* Positions: near 1e9, small, random below 2^31, and above 2^40. */
static int64_t *rope_positions(int64_t T)
{
    int64_t *pos = dt_xmallocarray((size_t)T, sizeof(int64_t));

    for (int64_t t = 0; t < T; t++)
        switch (t % 4) {
        case 0:
            pos[t] = 1000000000 + t * 7919;
            break;
        case 1:
            pos[t] = t;
            break;
        case 2:
            pos[t] = (int64_t)(rng_next() % 2147483648u);
            break;
        default:
            pos[t] = ((int64_t)1 << 40) + (int64_t)(rng_next() % 100000);
            break;
        }
    return pos;
}

static void test_rope_case(int64_t T, int H, int D, dt_rope_t rope)
{
    const dt_rope_t *r = &rope; /* the base, with LLaMA 3.1's scaling when factor > 0 */
    const size_t n = (size_t)T * H * D;
    dt_emsg_t em = { { 0 } };
    int64_t *pos = rope_positions(T);
    float *x = fill_uniform(n, -1.0f, 1.0f), *fref = copy_floats(x, n), *bref = copy_floats(x, n);
    float *got = hfloats(n);

    dt_rope_fwd_ref(T, H, D, pos, r, fref);
    dt_rope_bwd_ref(T, H, D, pos, r, bref);
    int64_t *dpos = dev_upload(pos, (size_t)T * sizeof(int64_t));
    float *dxv = dev_upload(x, n * sizeof(float));

    GC_OK(dt_rope_fwd_cuda(T, H, D, dpos, r, dxv, st, &em), em);
    dev_get(got, dxv, n * sizeof(float));
    check_close(got, fref, n, 1e-6, 0.0, "rope fwd T=%lld H=%d D=%d theta=%g scale %g pos to 2^40",
                (long long)T, H, D, rope.theta, rope.factor);
    GC_OK(dt_rope_bwd_cuda(T, H, D, dpos, r, dxv, st, &em), em);
    dev_get(got, dxv, n * sizeof(float));
    check_close(got, x, n, 1e-6, 0.0, "rope bwd(fwd(x)) = x T=%lld H=%d D=%d", (long long)T, H, D);
    dev_put(dxv, x, n * sizeof(float));
    GC_OK(dt_rope_bwd_cuda(T, H, D, dpos, r, dxv, st, &em), em);
    dev_get(got, dxv, n * sizeof(float));
    check_close(got, bref, n, 1e-6, 0.0, "rope bwd T=%lld H=%d D=%d", (long long)T, H, D);

    cudaFree(dxv);
    cudaFree(dpos);
    free(got);
    free(bref);
    free(fref);
    free(x);
    free(pos);
}

/* The rotation of x = (1, 0) in every pair is (cos a, sin a): check the
 * angle itself at positions near 1e9, where an fp32 angle is off by radians
 * (the naive error is printed, and must be large, to show the check can
 * fail). */
static void test_rope_angle(void)
{
    enum { T = 16, D = 128 };
    const dt_rope_t rope = { .theta = 500000.0 };
    const double theta = rope.theta;
    const size_t n = (size_t)T * D;
    dt_emsg_t em = { { 0 } };
    int64_t pos[T];
    float *x = hfloats(n), *got = hfloats(n), *want = hfloats(n);
    double naive = 0.0;

    for (int t = 0; t < T; t++)
        pos[t] = 1000000000 + 12345 * t;
    for (int t = 0; t < T; t++)
        for (int i = 0; i < D / 2; i++) {
            double a = dt_rope_angle(pos[t], i, D, &rope);
            float an = (float)pos[t] * powf((float)theta, -2.0f * (float)i / (float)D);
            x[t * D + 2 * i] = 1.0f;
            x[t * D + 2 * i + 1] = 0.0f;
            want[t * D + 2 * i] = (float)cos(a);
            want[t * D + 2 * i + 1] = (float)sin(a);
            naive = fmax(naive, fabs(cos((double)an) - cos(a)));
            naive = fmax(naive, fabs(sin((double)an) - sin(a)));
        }
    int64_t *dpos = dev_upload(pos, sizeof pos);
    float *dxv = dev_upload(x, n * sizeof(float));
    GC_OK(dt_rope_fwd_cuda(T, 1, D, dpos, &rope, dxv, st, &em), em);
    dev_get(got, dxv, n * sizeof(float));
    check_close(got, want, n, 1e-6, 0.0,
                "rope angle at pos ~1e9 D=%d: (cos a, sin a) vs dt_rope_angle (an fp32 angle "
                "errs by %.2f)",
                D, naive);
    gc_check(naive > 1e-3, "rope angle check discriminates: fp32 angle error %.2e > 1e-3", naive);
    cudaFree(dxv);
    cudaFree(dpos);
    free(want);
    free(got);
    free(x);
}

static void test_rope(void)
{
    /* LLaMA 3.1's scaling: every kind of pair (kept, interpolated, slowed) */
    const dt_rope_t l31 = { .theta = 500000.0, .factor = 8, .low_freq_factor = 1,
                            .high_freq_factor = 4, .original_max_pos = 8192 };

    test_rope_case(257, 3, 128, (dt_rope_t){ .theta = 500000.0 });
    test_rope_case(129, 2, 128, l31);
    test_rope_case(1, 1, 2, (dt_rope_t){ .theta = 10000.0 });
    test_rope_case(33, 2, 6, (dt_rope_t){ .theta = 10000.0 });
    test_rope_case(16, 4, 256, (dt_rope_t){ .theta = 1e6 });
    test_rope_angle();
}

/*-- SwiGLU -----------------------------------------------------------------------*/

static void test_swiglu_case(int64_t T, int f)
{
    static const float special[] = { 0.0f, 20.0f, -20.0f, 100.0f, -100.0f, -1.2785f, 1.0f };
    const size_t n = (size_t)T * f, bytes = n * sizeof(float);
    dt_emsg_t em = { { 0 } };
    float *a = fill_normal(n, 4.0f), *b = fill_normal(n, 1.0f), *dh = fill_normal(n, 1.0f);
    float *href = hfloats(n), *daref = hfloats(n), *dbref = hfloats(n), *got = hfloats(n);

    for (size_t i = 0; i < n && i < sizeof special / sizeof special[0]; i++)
        a[i] = special[i];
    dt_swiglu_fwd_ref(T, f, a, b, href);
    dt_swiglu_bwd_ref(T, f, a, b, dh, daref, dbref);
    float *da_ = dev_upload(a, bytes), *db_ = dev_upload(b, bytes), *ddh = dev_upload(dh, bytes);
    float *o1 = dev_alloc(bytes), *o2 = dev_alloc(bytes);

    GC_OK(dt_swiglu_fwd_cuda(T, f, da_, db_, o1, st, &em), em);
    dev_get(got, o1, bytes);
    check_close(got, href, n, 1e-6, 1e-5, "swiglu fwd T=%lld f=%d", (long long)T, f);
    dev_put(o1, a, bytes);
    GC_OK(dt_swiglu_fwd_cuda(T, f, o1, db_, o1, st, &em), em);
    dev_get(got, o1, bytes);
    check_close(got, href, n, 1e-6, 1e-5, "swiglu fwd T=%lld f=%d in place (h = a)", (long long)T,
                f);
    dev_put(o1, b, bytes);
    GC_OK(dt_swiglu_fwd_cuda(T, f, da_, o1, o1, st, &em), em);
    dev_get(got, o1, bytes);
    check_close(got, href, n, 1e-6, 1e-5, "swiglu fwd T=%lld f=%d in place (h = b)", (long long)T,
                f);

    GC_OK(dt_swiglu_bwd_cuda(T, f, da_, db_, ddh, o1, o2, st, &em), em);
    dev_get(got, o1, bytes);
    check_close(got, daref, n, 1e-5, 1e-5, "swiglu bwd T=%lld f=%d: da", (long long)T, f);
    dev_get(got, o2, bytes);
    check_close(got, dbref, n, 1e-5, 1e-5, "swiglu bwd T=%lld f=%d: db", (long long)T, f);
    dev_put(o1, dh, bytes);
    GC_OK(dt_swiglu_bwd_cuda(T, f, da_, db_, o1, o1, o2, st, &em), em);
    dev_get(got, o1, bytes);
    check_close(got, daref, n, 1e-5, 1e-5, "swiglu bwd T=%lld f=%d: da in place (da = dh)",
                (long long)T, f);
    dev_put(o1, dh, bytes);
    GC_OK(dt_swiglu_bwd_cuda(T, f, da_, db_, o1, o2, o1, st, &em), em);
    dev_get(got, o1, bytes);
    check_close(got, dbref, n, 1e-5, 1e-5, "swiglu bwd T=%lld f=%d: db in place (db = dh)",
                (long long)T, f);
    dev_get(got, o2, bytes);
    check_close(got, daref, n, 1e-5, 1e-5, "swiglu bwd T=%lld f=%d: da beside db = dh",
                (long long)T, f);

    cudaFree(o2);
    cudaFree(o1);
    cudaFree(ddh);
    cudaFree(db_);
    cudaFree(da_);
    free(got);
    free(dbref);
    free(daref);
    free(href);
    free(dh);
    free(b);
    free(a);
}

static void test_swiglu(void)
{
    test_swiglu_case(1, 3);
    test_swiglu_case(257, 1000);
}

/*-- the residual add ------------------------------------------------------------*/

/* y += x in fp32: one rounding per element, as the CPU's; exact. */
static void test_add(void)
{
    dt_emsg_t em = { "" };
    const size_t n = 100003;
    float *x = fill_normal(n, 1.0f), *y = fill_normal(n, 1.0f), *want = copy_floats(y, n);
    float *got = hfloats(n);

    for (size_t i = 0; i < n; i++)
        want[i] += x[i];
    float *dx = dev_upload(x, n * sizeof(float)), *dy = dev_upload(y, n * sizeof(float));
    GC_OK(dt_add_f32_cuda((int64_t)n, dx, dy, st, &em), em);
    dev_get(got, dy, n * sizeof(float));
    check_exact(got, want, n * sizeof(float), "add n=%zu", n);
    GC_OK(dt_add_f32_cuda(0, NULL, NULL, st, &em), em);
    gc_check(dt_add_f32_cuda(-1, dx, dy, st, &em) == DT_EINVAL, "add n=-1 refused: %s", em.s);
    cudaFree(dx);
    cudaFree(dy);
    free(x);
    free(y);
    free(want);
    free(got);
}

/*-- linear layers on cuBLASLt --------------------------------------------------*/

/* Inputs uniform in [-1, 1] and rounded to t on the host, so the reference
 * sees exactly the values the GPU multiplies. Products of bf16/fp16 values
 * are exact in fp32; what remains is fp32 accumulation over k terms, held
 * to atol = 1e-4 sqrt(k) (|x|, |w| <= 1). */
static void test_linear_case(dt_blas_t *bl, dt_dtype_t t, int64_t T, int din, int dout)
{
    const char *name = dt_dtype_name(t);
    const size_t nx = (size_t)T * din, nw = (size_t)dout * din, ny = (size_t)T * dout;
    const double ufmt = t == DT_BF16 ? 0x1.0p-8 : 0x1.0p-11;
    const double tol_y = 1e-4 * sqrt((double)din), tol_dx = 1e-4 * sqrt((double)dout);
    const double tol_dw = 1e-4 * sqrt((double)T) + 1e-6;
    dt_emsg_t em = { { 0 } };
    float *x0 = fill_uniform(nx, -1.0f, 1.0f), *w0 = fill_uniform(nw, -1.0f, 1.0f);
    float *dy0 = fill_uniform(ny, -1.0f, 1.0f), *dw0 = fill_uniform(nw, -1.0f, 1.0f);
    float *x = hfloats(nx), *w = hfloats(nw), *dy = hfloats(ny);
    void *hx = encode(t, x0, nx, x), *hw = encode(t, w0, nw, w), *hdy = encode(t, dy0, ny, dy);
    float *yref = hfloats(ny), *dxref = hfloats(nx), *dwref = copy_floats(dw0, nw);
    float *got = hfloats(nx > nw ? (nx > ny ? nx : ny) : (nw > ny ? nw : ny));
    uint16_t *got16 = dt_xmallocarray(ny, sizeof(uint16_t));

    dt_linear_fwd_ref(T, din, dout, x, w, yref);
    dt_linear_bwd_ref(T, din, dout, x, w, dy, dxref, dwref);
    void *dx_ = dev_upload(hx, nx * 2), *dw_ = dev_upload(hw, nw * 2),
         *ddy = dev_upload(hdy, ny * 2);
    float *dy32 = dev_alloc(ny * sizeof(float)), *dgx = dev_alloc(nx * sizeof(float));
    float *dgw = dev_upload(dw0, nw * sizeof(float));
    void *dy16 = dev_alloc(ny * 2);

    GC_OK(dt_linear_fwd_cuda(bl, t, T, din, dout, dx_, dw_, DT_F32, dy32, st, &em), em);
    dev_get(got, dy32, ny * sizeof(float));
    check_close(got, yref, ny, tol_y, 0.0, "linear fwd %s T=%lld din=%d dout=%d -> fp32 y", name,
                (long long)T, din, dout);
    GC_OK(dt_linear_fwd_cuda(bl, t, T, din, dout, dx_, dw_, t, dy16, st, &em), em);
    dev_get(got16, dy16, ny * 2);
    for (size_t i = 0; i < ny; i++)
        got[i] = dt_half_value(t, got16[i]);
    check_close(got, yref, ny, tol_y, ufmt, "linear fwd %s T=%lld din=%d dout=%d -> %s y", name,
                (long long)T, din, dout, name);

    GC_OK(dt_linear_bwd_cuda(bl, t, T, din, dout, dx_, dw_, ddy, dgx, dgw, st, &em), em);
    dev_get(got, dgx, nx * sizeof(float));
    check_close(got, dxref, nx, tol_dx, 0.0, "linear bwd %s T=%lld din=%d dout=%d: dx WRITTEN",
                name, (long long)T, din, dout);
    dev_get(got, dgw, nw * sizeof(float));
    check_close(got, dwref, nw, tol_dw, 0.0,
                "linear bwd %s T=%lld din=%d dout=%d: dw ADDED from dw0 != 0", name, (long long)T,
                din, dout);

    /* each gradient alone */
    dev_put(dgw, dw0, nw * sizeof(float));
    GC_CUDA(cudaMemset(dgx, 0, nx * sizeof(float)));
    GC_OK(dt_linear_bwd_cuda(bl, t, T, din, dout, dx_, dw_, ddy, NULL, dgw, st, &em), em);
    dev_get(got, dgw, nw * sizeof(float));
    check_close(got, dwref, nw, tol_dw, 0.0, "linear bwd %s T=%lld din=%d dout=%d: dw, dx = NULL",
                name, (long long)T, din, dout);
    GC_OK(dt_linear_bwd_cuda(bl, t, T, din, dout, dx_, dw_, ddy, dgx, NULL, st, &em), em);
    dev_get(got, dgx, nx * sizeof(float));
    check_close(got, dxref, nx, tol_dx, 0.0, "linear bwd %s T=%lld din=%d dout=%d: dx, dw = NULL",
                name, (long long)T, din, dout);

    cudaFree(dy16);
    cudaFree(dgw);
    cudaFree(dgx);
    cudaFree(dy32);
    cudaFree(ddy);
    cudaFree(dw_);
    cudaFree(dx_);
    free(got16);
    free(got);
    free(dwref);
    free(dxref);
    free(yref);
    free(hdy);
    free(hw);
    free(hx);
    free(dy);
    free(w);
    free(x);
    free(dw0);
    free(dy0);
    free(w0);
    free(x0);
}

static void test_linear(void)
{
    static const dt_dtype_t types[] = { DT_BF16, DT_F16 };
    dt_emsg_t em = { { 0 } };
    dt_blas_t *bl = NULL;

    GC_OK(dt_blas_new(&bl, &em), em);
    for (int k = 0; k < 2; k++) {
        test_linear_case(bl, types[k], 1, 64, 32);
        test_linear_case(bl, types[k], 257, 512, 384);
        test_linear_case(bl, types[k], 33, 72, 24);
        test_linear_case(bl, types[k], 7, 33, 17); /* odd everything: no 16-byte rows */
    }
    dt_blas_free(bl);
    dt_blas_free(NULL);
    gc_check(1, "dt_blas_free(NULL) is a no-op");
}

/*-- attention: delta and merge -------------------------------------------------*/

static void test_delta_case(dt_dtype_t t, int64_t n, int h, int d)
{
    const int64_t lddo = (int64_t)h * d + 8, ldo = (int64_t)h * d + 4, lddelta = n + 3;
    const size_t ndo = (size_t)n * lddo, no = (size_t)n * ldo, ndl = (size_t)h * lddelta;
    dt_emsg_t em = { { 0 } };
    float *dout0 = fill_normal(ndo, 1.0f), *dout = hfloats(ndo), *o = fill_normal(no, 1.0f);
    void *hdo = encode(t, dout0, ndo, dout);
    float *ref = hfloats(ndl), *got = hfloats(ndl);
    double scale = 0.0;

    for (size_t i = 0; i < ndl; i++)
        ref[i] = 7.0f; /* padding beyond n must stay */
    for (int hh = 0; hh < h; hh++)
        dt_attn_delta_cpu(n, d, dout + hh * d, lddo, o + hh * d, ldo, ref + hh * lddelta);
    for (int64_t i = 0; i < n; i++)
        for (int hh = 0; hh < h; hh++) {
            double s = 0.0;
            for (int e = 0; e < d; e++)
                s += fabs((double)dout[i * lddo + hh * d + e] * o[i * ldo + hh * d + e]);
            scale = fmax(scale, s);
        }
    for (size_t i = 0; i < ndl; i++)
        got[i] = 7.0f;
    void *ddo = dev_upload(hdo, ndo * dt_dtype_size(t));
    float *dov = dev_upload(o, no * sizeof(float)), *ddl = dev_upload(got, ndl * sizeof(float));
    GC_OK(dt_attn_delta_cuda(n, h, d, t, ddo, lddo, dov, ldo, ddl, lddelta, st, &em), em);
    dev_get(got, ddl, ndl * sizeof(float));
    /* fp32 sum of d products: |err| <= (d/32 + 5) u sum |dout o| < 1e-6 sum */
    check_close(got, ref, ndl, 1e-6 * scale, 0.0,
                "attn delta %s n=%lld h=%d d=%d (strided, tol 1e-6 max_row sum|dout o|)",
                dt_dtype_name(t), (long long)n, h, d);
    cudaFree(ddl);
    cudaFree(dov);
    cudaFree(ddo);
    free(got);
    free(ref);
    free(hdo);
    free(o);
    free(dout);
    free(dout0);
}

/* Row classes of the merge tests, by (row + head) % 8: 0 empty target (its
 * o NaN: it must be replaced, not blended), 1 empty partial (its o NaN: it
 * must be skipped), 2 both empty, 3 and 4 lse far from 0, else random. */
static void merge_fill(int cls, int d, float *o1, float *l1, float *o2, float *l2)
{
    switch (cls) {
    case 0:
        *l1 = -INFINITY;
        for (int e = 0; e < d; e++)
            o1[e] = NAN;
        break;
    case 1:
        *l2 = -INFINITY;
        for (int e = 0; e < d; e++)
            o2[e] = NAN;
        break;
    case 2:
        *l1 = -INFINITY;
        *l2 = -INFINITY;
        for (int e = 0; e < d; e++) {
            o1[e] = 0.0f;
            o2[e] = NAN;
        }
        break;
    case 3:
        *l1 = 1000.0f;
        *l2 = 999.5f;
        break;
    case 4:
        *l1 = -1000.0f;
        *l2 = -1003.0f;
        break;
    default:
        break;
    }
}

static void test_merge_case(int64_t n, int h, int d)
{
    const int64_t ld1 = (int64_t)h * d + 16, ld2 = (int64_t)h * d + 8, ldl1 = n + 5, ldl2 = n + 1;
    const size_t no1 = (size_t)n * ld1, no2 = (size_t)n * ld2, nl1 = (size_t)h * ldl1;
    const size_t nl2 = (size_t)h * ldl2;
    dt_emsg_t em = { { 0 } };
    float *o1 = fill_normal(no1, 1.0f), *o2 = fill_normal(no2, 1.0f);
    float *l1 = fill_uniform(nl1, -10.0f, 10.0f), *l2 = fill_uniform(nl2, -10.0f, 10.0f);

    for (int64_t i = 0; i < n; i++)
        for (int hh = 0; hh < h; hh++)
            merge_fill((int)((i + hh) % 8), d, o1 + i * ld1 + hh * d, l1 + hh * ldl1 + i,
                       o2 + i * ld2 + hh * d, l2 + hh * ldl2 + i);
    float *o1ref = copy_floats(o1, no1), *l1ref = copy_floats(l1, nl1);
    for (int hh = 0; hh < h; hh++)
        dt_attn_merge_cpu(n, d, o1ref + hh * d, ld1, l1ref + hh * ldl1, o2 + hh * d, ld2,
                          l2 + hh * ldl2);
    float *do1 = dev_upload(o1, no1 * sizeof(float)), *dl1 = dev_upload(l1, nl1 * sizeof(float));
    float *do2 = dev_upload(o2, no2 * sizeof(float)), *dl2 = dev_upload(l2, nl2 * sizeof(float));
    GC_OK(dt_attn_merge_cuda(n, h, d, do1, ld1, dl1, ldl1, do2, ld2, dl2, ldl2, st, &em), em);
    dev_get(o1, do1, no1 * sizeof(float));
    dev_get(l1, dl1, nl1 * sizeof(float));
    /* the device's expf/logf are within 2 ulp, glibc's within 1: the weights
     * may differ by ~3 ulp, ~1e-6 on a blend of N(0, 1) rows that cancels */
    check_close(o1, o1ref, no1, 1e-5, 1e-5, "attn merge n=%lld h=%d d=%d: o (-inf rows, padding)",
                (long long)n, h, d);
    check_close(l1, l1ref, nl1, 1e-6, 1e-6, "attn merge n=%lld h=%d d=%d: lse", (long long)n, h, d);
    cudaFree(dl2);
    cudaFree(do2);
    cudaFree(dl1);
    cudaFree(do1);
    free(l1ref);
    free(o1ref);
    free(l2);
    free(l1);
    free(o2);
    free(o1);
}

static void test_attn_aux(void)
{
    static const dt_dtype_t types[] = { DT_BF16, DT_F16, DT_F32 };

    for (int k = 0; k < 3; k++) {
        test_delta_case(types[k], 257, 4, 128);
        test_delta_case(types[k], 1, 1, 64);
    }
    test_delta_case(DT_BF16, 33, 3, 5);
    test_merge_case(257, 3, 64);
    test_merge_case(8, 1, 5);
}

/*-- dilated attention: gathers, merge, scatter ----------------------------------*/

/* One head chunk of a (rows, H, d) tensor: rows first + m * step, m < n,
 * heads [hlo, hlo + nh). */
enum { DL_ROWS = 64, DL_H = 6, DL_FIRST = 5, DL_STEP = 3, DL_N = 19, DL_HLO = 2, DL_NH = 3 };

static void test_gather_case(dt_dtype_t t, int d, int64_t ldx, int64_t n, int64_t first,
                             int64_t step)
{
    const size_t es = dt_dtype_size(t), nx = (size_t)DL_ROWS * ldx * es;
    const size_t row = (size_t)DL_NH * d * es, nout = (size_t)n * row;
    dt_emsg_t em = { { 0 } };
    unsigned char *x = dt_xmalloc(nx), *want = dt_xmalloc(nout), *got = dt_xmalloc(nout);

    for (size_t i = 0; i < nx; i++)
        x[i] = (unsigned char)rng_next();
    for (int64_t m = 0; m < n; m++)
        memcpy(want + m * row, x + ((first + m * step) * ldx + (int64_t)DL_HLO * d) * es, row);
    void *dxv = dev_upload(x, nx), *dout = dev_alloc(nout);
    GC_OK(dt_dilate_gather_cuda(t, n, DL_NH, d, dxv, ldx, first, step, DL_HLO, dout, st, &em), em);
    dev_get(got, dout, nout);
    check_exact(got, want, nout, "dilate gather %s n=%lld nh=%d d=%d ldx=%lld first=%lld step=%lld",
                dt_dtype_name(t), (long long)n, DL_NH, d, (long long)ldx, (long long)first,
                (long long)step);
    cudaFree(dout);
    cudaFree(dxv);
    free(got);
    free(want);
    free(x);
}

static void test_gather_rows(void)
{
    const int64_t ldl = DL_ROWS + 3;
    const size_t nl = (size_t)DL_H * ldl, nout = (size_t)DL_NH * DL_N;
    dt_emsg_t em = { { 0 } };
    float *lse = fill_uniform(nl, -5.0f, 5.0f), *want = hfloats(nout), *got = hfloats(nout);

    for (int hh = 0; hh < DL_NH; hh++)
        for (int m = 0; m < DL_N; m++)
            want[hh * DL_N + m] = lse[(DL_HLO + hh) * ldl + DL_FIRST + m * DL_STEP];
    float *dl = dev_upload(lse, nl * sizeof(float)), *dout = dev_alloc(nout * sizeof(float));
    GC_OK(
        dt_dilate_gather_rows_cuda(DL_N, DL_NH, dl, ldl, DL_FIRST, DL_STEP, DL_HLO, dout, st, &em),
        em);
    dev_get(got, dout, nout * sizeof(float));
    check_exact(got, want, nout * sizeof(float), "dilate gather rows n=%d nh=%d ldl=%lld", DL_N,
                DL_NH, (long long)ldl);
    cudaFree(dout);
    cudaFree(dl);
    free(got);
    free(want);
    free(lse);
}

static void test_dilate_merge(int d)
{
    const int64_t ldo = (int64_t)DL_H * d + 4, ldl = DL_ROWS + 2;
    const size_t no = (size_t)DL_ROWS * ldo, nl = (size_t)DL_H * ldl;
    const size_t no2 = (size_t)DL_N * DL_NH * d, nl2 = (size_t)DL_NH * DL_N;
    dt_emsg_t em = { { 0 } };
    float *o = fill_normal(no, 1.0f), *lse = fill_uniform(nl, -5.0f, 5.0f);
    float *o2 = fill_normal(no2, 1.0f), *lse2 = fill_uniform(nl2, -5.0f, 5.0f);

    for (int m = 0; m < DL_N; m++)
        for (int hh = 0; hh < DL_NH; hh++) {
            int64_t r = DL_FIRST + (int64_t)m * DL_STEP;
            merge_fill((m + hh) % 8, d, o + r * ldo + (DL_HLO + hh) * d,
                       lse + (DL_HLO + hh) * ldl + r, o2 + ((size_t)m * DL_NH + hh) * d,
                       lse2 + hh * DL_N + m);
        }
    float *oref = copy_floats(o, no), *lref = copy_floats(lse, nl);
    for (int m = 0; m < DL_N; m++)
        for (int hh = 0; hh < DL_NH; hh++) {
            int64_t r = DL_FIRST + (int64_t)m * DL_STEP;
            dt_attn_merge_cpu(1, d, oref + r * ldo + (DL_HLO + hh) * d, ldo,
                              lref + (DL_HLO + hh) * ldl + r, o2 + ((size_t)m * DL_NH + hh) * d, d,
                              lse2 + hh * DL_N + m);
        }
    float *dov = dev_upload(o, no * sizeof(float)), *dl = dev_upload(lse, nl * sizeof(float));
    float *do2 = dev_upload(o2, no2 * sizeof(float)), *dl2 = dev_upload(lse2, nl2 * sizeof(float));
    GC_OK(dt_dilate_merge_cuda(DL_N, DL_NH, d, do2, dl2, dov, ldo, dl, ldl, DL_FIRST, DL_STEP,
                               DL_HLO, st, &em),
          em);
    dev_get(o, dov, no * sizeof(float));
    dev_get(lse, dl, nl * sizeof(float));
    check_close(o, oref, no, 1e-5, 1e-5, "dilate merge n=%d nh=%d d=%d: full o (-inf rows)", DL_N,
                DL_NH, d);
    check_close(lse, lref, nl, 1e-6, 1e-6, "dilate merge n=%d nh=%d d=%d: full lse", DL_N, DL_NH,
                d);
    cudaFree(dl2);
    cudaFree(do2);
    cudaFree(dl);
    cudaFree(dov);
    free(lref);
    free(oref);
    free(lse2);
    free(o2);
    free(lse);
    free(o);
}

static void test_scatter_add(int d)
{
    const int64_t ldd = (int64_t)DL_H * d + 4;
    const size_t nd = (size_t)DL_ROWS * ldd, ng = (size_t)DL_N * DL_NH * d;
    dt_emsg_t em = { { 0 } };
    float *dst = fill_normal(nd, 1.0f), *g = fill_normal(ng, 1.0f), *want = copy_floats(dst, nd);

    for (int m = 0; m < DL_N; m++)
        for (int hh = 0; hh < DL_NH; hh++)
            for (int e = 0; e < d; e++)
                want[(DL_FIRST + (int64_t)m * DL_STEP) * ldd + (DL_HLO + hh) * d + e] +=
                    g[((size_t)m * DL_NH + hh) * d + e];
    float *dd = dev_upload(dst, nd * sizeof(float)), *dg = dev_upload(g, ng * sizeof(float));
    GC_OK(
        dt_dilate_scatter_add_cuda(DL_N, DL_NH, d, dg, dd, ldd, DL_FIRST, DL_STEP, DL_HLO, st, &em),
        em);
    dev_get(dst, dd, nd * sizeof(float));
    check_exact(dst, want, nd * sizeof(float), "dilate scatter add n=%d nh=%d d=%d ldd=%lld", DL_N,
                DL_NH, d, (long long)ldd);
    cudaFree(dg);
    cudaFree(dd);
    free(want);
    free(g);
    free(dst);
}

static void test_dilate(void)
{
    /* 16-, 2-, 8-, 4-byte copy units, then a single row */
    test_gather_case(DT_BF16, 40, DL_H * 40 + 8, DL_N, DL_FIRST, DL_STEP);
    test_gather_case(DT_F16, 3, DL_H * 3 + 1, DL_N, DL_FIRST, DL_STEP);
    test_gather_case(DT_F32, 2, DL_H * 2, DL_N, DL_FIRST, DL_STEP);
    test_gather_case(DT_F32, 3, DL_H * 3, DL_N, DL_FIRST, DL_STEP);
    test_gather_case(DT_F32, 64, DL_H * 64, 1, 7, 0);
    test_gather_rows();
    test_dilate_merge(40);
    test_dilate_merge(5);
    test_scatter_add(40);
    test_scatter_add(3);
}

/*-- argument errors ----------------------------------------------------------------*/

static void check_einval(int rc, const dt_emsg_t *em, const char *fn, const char *detail)
{
    gc_check(rc == DT_EINVAL && strstr(em->s, fn) != NULL && strstr(em->s, detail) != NULL,
             "%s rejects %s: rc %d \"%s\"", fn, detail, rc, em->s);
}

static void test_invalid(void)
{
    dt_emsg_t em = { { 0 } };
    dt_blas_t *bl = NULL;
    int rc;
    const dt_rope_t r10k = { .theta = 10000.0 };
    rc = dt_rope_fwd_cuda(1, 1, 7, NULL, &r10k, NULL, st, &em);
    check_einval(rc, &em, "dt_rope_fwd_cuda", "D=7");
    rc = dt_rope_bwd_cuda(1, 1, 258, NULL, &r10k, NULL, st, &em);
    check_einval(rc, &em, "dt_rope_bwd_cuda", "D=258");
    rc = dt_rmsnorm_fwd_cuda(4, 0, 1e-5f, NULL, NULL, NULL, NULL, st, &em);
    check_einval(rc, &em, "dt_rmsnorm_fwd_cuda", "d=0");
    rc = dt_cast_from_f32_cuda(DT_BF16, -1, NULL, NULL, st, &em);
    check_einval(rc, &em, "dt_cast_from_f32_cuda", "n=-1");
    rc = dt_swiglu_fwd_cuda(-2, 8, NULL, NULL, NULL, st, &em);
    check_einval(rc, &em, "dt_swiglu_fwd_cuda", "T=-2");
    GC_OK(dt_blas_new(&bl, &em), em);
    rc = dt_linear_fwd_cuda(bl, DT_F32, 4, 8, 8, NULL, NULL, DT_F32, NULL, st, &em);
    check_einval(rc, &em, "dt_linear_fwd_cuda", "dtype=0");
    rc = dt_linear_fwd_cuda(bl, DT_BF16, 4, 8, 8, NULL, NULL, DT_F16, NULL, st, &em);
    check_einval(rc, &em, "dt_linear_fwd_cuda", "ydtype=fp16");
    dt_blas_free(bl);
    rc = dt_attn_merge_cuda(4, 2, 64, NULL, 64, NULL, 4, NULL, 128, NULL, 4, st, &em);
    check_einval(rc, &em, "dt_attn_merge_cuda", "ld1=64");
    rc = dt_dilate_merge_cuda(2, 1, 64, NULL, NULL, NULL, 64, NULL, 16, 0, 0, 0, st, &em);
    check_einval(rc, &em, "dt_dilate_merge_cuda", "step=0");
    rc = dt_dilate_gather_cuda(DT_BF16, 2, 2, 64, NULL, 100, 0, 1, 0, NULL, st, &em);
    check_einval(rc, &em, "dt_dilate_gather_cuda", "row stride 100");
    rc = dt_rmsnorm_fwd_cuda(0, 64, 1e-5f, NULL, NULL, NULL, NULL, st, &em);
    gc_check(rc == 0, "dt_rmsnorm_fwd_cuda with T=0 is a no-op (rc %d)", rc);
}

/*-- fused launches: the bits of the unfused sequences ----------------------------
 * dt_rmsnorm_fwd_half_cuda (with and without the residual),
 * dt_rope_qkv_half_cuda and dt_swiglu_fwd_half_cuda against the launches
 * they replace, bf16 and fp16, exact (same arithmetic, one rounding). */
static void test_fused_dtype(dt_dtype_t t)
{
    const int64_t T = 300;
    const int d = 200, H = 8, Hkv = 2, D = 64, f = 500;
    const char *tn = dt_dtype_name(t);
    dt_emsg_t em = { { 0 } };
    int rc;

    /* residual + rmsnorm + cast */
    float *x = fill_normal((size_t)(T * d), 1.0f), *r = fill_normal((size_t)(T * d), 0.5f);
    float *g = fill_uniform((size_t)d, 0.5f, 1.5f);
    float *x1 = dev_upload(x, (size_t)(T * d) * 4), *x2 = dev_upload(x, (size_t)(T * d) * 4);
    float *rd = dev_upload(r, (size_t)(T * d) * 4), *gd = dev_upload(g, (size_t)d * 4);
    float *y32 = dev_alloc((size_t)(T * d) * 4), *s1 = dev_alloc((size_t)T * 4),
          *s2 = dev_alloc((size_t)T * 4);
    void *yb1 = dev_alloc((size_t)(T * d) * 2), *yb2 = dev_alloc((size_t)(T * d) * 2);
    for (int res = 0; res < 2; res++) {
        rc = (res ? dt_add_f32_cuda(T * d, rd, x1, st, &em) : 0);
        if (rc == 0)
            rc = dt_rmsnorm_fwd_cuda(T, d, 1e-5f, x1, gd, y32, s1, st, &em);
        if (rc == 0)
            rc = dt_cast_from_f32_cuda(t, T * d, y32, yb1, st, &em);
        if (rc == 0)
            rc = dt_rmsnorm_fwd_half_cuda(T, d, 1e-5f, x2, res ? rd : NULL, gd, t, yb2, s2, st,
                                          &em);
        gc_check(rc == 0, "fused rmsnorm %s: launched: %s", tn, em.s);
        uint16_t *h1 = malloc((size_t)(T * d) * 2), *h2 = malloc((size_t)(T * d) * 2);
        float *a1 = hfloats((size_t)(T * d)), *a2 = hfloats((size_t)(T * d));
        float *r1 = hfloats((size_t)T), *r2 = hfloats((size_t)T);
        dev_get(h1, yb1, (size_t)(T * d) * 2);
        dev_get(h2, yb2, (size_t)(T * d) * 2);
        dev_get(a1, x1, (size_t)(T * d) * 4);
        dev_get(a2, x2, (size_t)(T * d) * 4);
        dev_get(r1, s1, (size_t)T * 4);
        dev_get(r2, s2, (size_t)T * 4);
        char what[96];
        snprintf(what, sizeof what, "rmsnorm_fwd_half %s %s: y", tn, res ? "+ residual" : "alone");
        check_exact(h2, h1, (size_t)(T * d) * 2, "%s", what);
        snprintf(what, sizeof what, "rmsnorm_fwd_half %s %s: x and rstd", tn,
                 res ? "+ residual" : "alone");
        check_exact(a2, a1, (size_t)(T * d) * 4, "%s (x)", what);
        check_exact(r2, r1, (size_t)T * 4, "%s (rstd)", what);
        free(h1);
        free(h2);
        free(a1);
        free(a2);
        free(r1);
        free(r2);
    }

    /* RoPE of q and k + the casts of q, k, v */
    const size_t nq = (size_t)(T * H * D), nk = (size_t)(T * Hkv * D);
    int64_t *pos = rope_positions(T);
    int64_t *posd = dev_upload(pos, (size_t)T * 8);
    dt_rope_t rope = { .theta = 500000.0 };
    float *q = fill_normal(nq, 1.0f), *k = fill_normal(nk, 1.0f), *v = fill_normal(nk, 1.0f);
    float *qd = dev_upload(q, nq * 4), *kd = dev_upload(k, nk * 4), *vd = dev_upload(v, nk * 4);
    float *q1 = dev_upload(q, nq * 4), *k1 = dev_upload(k, nk * 4);
    void *qb1 = dev_alloc(nq * 2), *kb1 = dev_alloc(nk * 2), *vb1 = dev_alloc(nk * 2);
    void *qb2 = dev_alloc(nq * 2), *kb2 = dev_alloc(nk * 2), *vb2 = dev_alloc(nk * 2);
    rc = dt_rope_fwd_cuda(T, H, D, posd, &rope, q1, st, &em);
    if (rc == 0)
        rc = dt_rope_fwd_cuda(T, Hkv, D, posd, &rope, k1, st, &em);
    if (rc == 0)
        rc = dt_cast_from_f32_cuda(t, (int64_t)nq, q1, qb1, st, &em);
    if (rc == 0)
        rc = dt_cast_from_f32_cuda(t, (int64_t)nk, k1, kb1, st, &em);
    if (rc == 0)
        rc = dt_cast_from_f32_cuda(t, (int64_t)nk, vd, vb1, st, &em);
    if (rc == 0)
        rc = dt_rope_qkv_half_cuda(T, H, Hkv, D, posd, &rope, qd, kd, vd, t, qb2, kb2, vb2, st,
                                   &em);
    gc_check(rc == 0, "fused rope_qkv %s: launched: %s", tn, em.s);
    void *hq1 = malloc(nq * 2), *hq2 = malloc(nq * 2), *hk1 = malloc(nk * 2),
         *hk2 = malloc(nk * 2), *hv1 = malloc(nk * 2), *hv2 = malloc(nk * 2);
    dev_get(hq1, qb1, nq * 2);
    dev_get(hq2, qb2, nq * 2);
    dev_get(hk1, kb1, nk * 2);
    dev_get(hk2, kb2, nk * 2);
    dev_get(hv1, vb1, nk * 2);
    dev_get(hv2, vb2, nk * 2);
    check_exact(hq2, hq1, nq * 2, "rope_qkv_half %s: q (positions to 2^40)", tn);
    check_exact(hk2, hk1, nk * 2, "rope_qkv_half %s: k", tn);
    check_exact(hv2, hv1, nk * 2, "rope_qkv_half %s: v", tn);

    /* SwiGLU + cast */
    const size_t nf = (size_t)(T * f);
    float *a = fill_normal(nf, 2.0f), *b = fill_normal(nf, 1.0f);
    float *ad = dev_upload(a, nf * 4), *bd = dev_upload(b, nf * 4), *hd = dev_alloc(nf * 4);
    void *hb1 = dev_alloc(nf * 2), *hb2 = dev_alloc(nf * 2);
    rc = dt_swiglu_fwd_cuda(T, f, ad, bd, hd, st, &em);
    if (rc == 0)
        rc = dt_cast_from_f32_cuda(t, (int64_t)nf, hd, hb1, st, &em);
    if (rc == 0)
        rc = dt_swiglu_fwd_half_cuda(T, f, ad, bd, t, hb2, st, &em);
    gc_check(rc == 0, "fused swiglu %s: launched: %s", tn, em.s);
    void *hh1 = malloc(nf * 2), *hh2 = malloc(nf * 2);
    dev_get(hh1, hb1, nf * 2);
    dev_get(hh2, hb2, nf * 2);
    check_exact(hh2, hh1, nf * 2, "swiglu_fwd_half %s", tn);

    void *dev[] = { x1, x2, rd, gd, y32, s1, s2, yb1, yb2, posd, qd, kd, vd, q1, k1, qb1, kb1,
                    vb1, qb2, kb2, vb2, ad, bd, hd, hb1, hb2 };
    for (size_t i = 0; i < sizeof dev / sizeof dev[0]; i++)
        GC_CUDA(cudaFree(dev[i]));
    void *host[] = { x, r, g, pos, q, k, v, hq1, hq2, hk1, hk2, hv1, hv2, a, b, hh1, hh2 };
    for (size_t i = 0; i < sizeof host / sizeof host[0]; i++)
        free(host[i]);
}

static void test_fused(void)
{
    test_fused_dtype(DT_BF16);
    test_fused_dtype(DT_F16);
}

int main(void)
{
    gc_require_device("test_layers_cuda");
    GC_CUDA(cudaStreamCreate(&st));

    test_casts();
    test_rmsnorm();
    test_rope();
    test_swiglu();
    test_add();
    test_fused();
    test_linear();
    test_attn_aux();
    test_dilate();
    test_invalid();

    GC_CUDA(cudaStreamSynchronize(st));
    GC_CUDA(cudaStreamDestroy(st));
    return gc_done();
}
