/* SPDX-License-Identifier: MIT
 *
 * bench_attn_cuda: GPU attention throughput and the cost of the one-GPU
 * ring. Prints tables and one machine-readable line per row; asserts
 * nothing. Three parts, one run:
 *
 *   baseline  cuBLASLt GEMM 8192^3 in the same dtype (bf16 or fp16 in, fp32
 *             accumulate): the machine's matrix rate, for the "%gemm"
 *             column. PyTorch's scaled_dot_product_attention is the
 *             baseline for attention itself: bench/gpu.sh runs
 *             bench/sdpa_torch.py beside this program and joins the rows.
 *   (a)       dt_attn_fwd_cuda and dt_attn_bwd_cuda over one block, B = 1,
 *             T in {4096, 16384, 65536}, D in {64, 128}, H = Hkv = 2048 / D,
 *             causal and not: milliseconds (median of --reps, after warm-up,
 *             cudaEvent timing) and TFLOP/s. FLOPs: forward 4 T^2 H D, half
 *             of it when causal; backward 2.5 times the forward. The
 *             backward timed is everything a caller runs: zeroing dq, dk,
 *             dv (the kernel adds), dt_attn_delta_cuda and dt_attn_bwd_cuda.
 *   (b)       dt_ring_local_new(R) + dt_ring_attn_fwd / _bwd for R in {1, 2,
 *             4, 8} ranks on this one GPU, causal zigzag, H = Hkv = 16, D =
 *             128, T in {16384, 65536}, against one dt_attn_fwd_cuda (and
 *             backward) over the same T, both timed on the host clock
 *             around synchronous calls; and memory per rank: the model
 *             (the caller's tensors + dt_ring_attn_bytes) beside the
 *             measured peak of cudaMemGetInfo deltas (sampled by a thread
 *             during the warm-up calls) divided by R. Then dilated
 *             attention (LongNet branches w = 2048, 8192, T with r = 1, 2,
 *             8, whose segments span ranks as R grows: sub-rings) for R in
 *             {1, 8}, against the same dense single block: what the
 *             branches save, and what their sub-rings cost.
 *
 * Lines for scripts (bench/gpu.sh):
 *   ROW fwd|bwd|fwdbwd DTYPE T=.. H=.. D=.. causal=0|1 ms=.. tflops=..
 *   RING DTYPE T=.. R=.. attn=dense|w=..:r=.. fwd_ms=.. fwd_base_ms=.. bwd_ms=.. ...
 * A row that could not run has ms=- tflops=- and error="...".
 *
 * Options: --quick (T <= 16384, 3 repetitions), --dtype bf16|fp16, --reps N
 * (default 10; 3 for rows whose first run takes over a second), --budget S
 * (seconds, default 420, 150 with --quick: (a) starts no row after 60 % of
 * it, (b) none after all of it; skipped rows are said so), --no-ring,
 * --no-attn, --nondeterministic (blocks through cuDNN: the backward on its
 * fastest engines, as the job key deterministic = no; default
 * deterministic, as jobs run).
 * Exit: 0, 1 when a row failed, 2 usage, 77 no usable device.
 */
#include "config.h"

#include <math.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <cuda_runtime_api.h>
/* cuBLASLt's header pulls in cuda_fp16.h and cuda_bf16.h, written for C++:
 * their warnings under this project's C flags are not ours to fix */
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wundef"
#pragma GCC diagnostic ignored "-Wstrict-prototypes"
#include <cublasLt.h>
#pragma GCC diagnostic pop

#include "common/clock.h"
#include "common/err.h"
#include "common/mem.h"
#include "engine/attn/attn.h"
#include "engine/attn/attn_block.h"
#include "engine/data/gen.h"
#include "spec/layout.h"
#include "engine/attn/ring_cuda.h"
#include "kernels/cuda/attn_cuda.h"
#include "kernels/cuda/cuda_err.h"
#include "kernels/cuda/layers_cuda.h"

#define MIB (1024.0 * 1024.0)

typedef struct opts {
    int quick;
    dt_dtype_t dt;
    int reps;
    double budget; /* seconds */
    int attn, ring;
    int nondet; /* --nondeterministic */
} opts_t;

/* A CUDA runtime failure outside the measured calls ends the program. */
#define BCUDA(call)                                                                        \
    do {                                                                                   \
        cudaError_t b_e_ = (call);                                                         \
        if (b_e_ != cudaSuccess) {                                                         \
            fprintf(stderr, "bench_attn_cuda: %s:%d: %s: %s\n", __FILE__, __LINE__, #call, \
                    cudaGetErrorString(b_e_));                                             \
            exit(1);                                                                       \
        }                                                                                  \
    } while (0)

static int failures;
static double t_start;

/* Machine-readable lines, kept until the end of a part so that they do not
 * break up the table; printed before any early exit. */
static char **rowbuf;
static int nrowbuf;

static __attribute__((format(printf, 1, 2))) void row_add(const char *fmt, ...)
{
    va_list ap;
    char line[1024];

    va_start(ap, fmt);
    vsnprintf(line, sizeof line, fmt, ap);
    va_end(ap);
    rowbuf = dt_xrealloc(rowbuf, (size_t)(nrowbuf + 1) * sizeof *rowbuf);
    rowbuf[nrowbuf++] = dt_xstrdup(line);
}

static void rows_flush(void)
{
    if (nrowbuf)
        printf("\n");
    for (int i = 0; i < nrowbuf; i++) {
        printf("%s\n", rowbuf[i]);
        free(rowbuf[i]);
    }
    free(rowbuf);
    rowbuf = NULL;
    nrowbuf = 0;
    fflush(stdout);
}

static int spent(const opts_t *o, double frac)
{
    return dt_clock_now() - t_start > frac * o->budget;
}

/*-- random device tensors ---------------------------------------------------------*/

/* n elements of dt (fp32 when dt is DT_F32) at dev: seeded normals, tiled
 * from a pattern of 2^20 + 17 elements (timings do not depend on the
 * values; 10^8 host normals would take longer than the benchmark). */
static void fill_random(void *dev, size_t n, dt_dtype_t dt, uint64_t seed)
{
    const size_t P = ((size_t)1 << 20) + 17;
    size_t es = dt_dtype_size(dt);
    unsigned char *pat = dt_xmallocarray(P, es);
    float *normal = dt_xmallocarray(P, sizeof(float));

    dt_gen_normal(seed, 0, 0, (int64_t)P, normal);
    for (size_t i = 0; i < P; i++) {
        float f = normal[i];
        if (dt == DT_F32)
            memcpy(pat + i * 4, &f, 4);
        else {
            uint16_t b = dt_half_bits(dt, f);
            memcpy(pat + i * 2, &b, 2);
        }
    }
    for (size_t off = 0; off < n; off += P) {
        size_t m = n - off < P ? n - off : P;
        BCUDA(cudaMemcpy((char *)dev + off * es, pat, m * es, cudaMemcpyHostToDevice));
    }
    free(normal);
    free(pat);
}

static void *dalloc(size_t bytes)
{
    void *p = NULL;
    BCUDA(cudaMalloc(&p, bytes ? bytes : 16));
    return p;
}

static int cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

static double median(double *x, int n)
{
    qsort(x, (size_t)n, sizeof *x, cmp_double);
    return n % 2 ? x[n / 2] : 0.5 * (x[n / 2 - 1] + x[n / 2]);
}

/* Repetitions after a first (warm-up) run of first_ms: slow rows get 3 so
 * that one configuration cannot eat the budget. */
static int reps_for(const opts_t *o, double first_ms)
{
    return first_ms > 1000.0 && o->reps > 3 ? 3 : o->reps;
}

/*-- baseline: cuBLASLt GEMM -------------------------------------------------------*/

#define LT_TRY(call)                                                                 \
    do {                                                                             \
        cublasStatus_t lt_s_ = (call);                                               \
        if (lt_s_ != CUBLAS_STATUS_SUCCESS) {                                        \
            snprintf(why, whylen, "%s: %s", #call, cublasLtGetStatusString(lt_s_)); \
            goto out;                                                                \
        }                                                                            \
    } while (0)

/* TFLOP/s of C (n, n) = A (n, n) B (n, n), dt in and out, fp32
 * accumulation, median of reps after 3 warm-ups; NAN with why filled when
 * cuBLASLt refuses. */
static double gemm_tflops(dt_dtype_t dt, int n, int reps, cudaStream_t st, char *why,
                          size_t whylen)
{
    cublasLtHandle_t lt = NULL;
    cublasLtMatmulDesc_t op = NULL;
    cublasLtMatrixLayout_t lay = NULL;
    cublasLtMatmulPreference_t pref = NULL;
    cublasLtMatmulHeuristicResult_t heur;
    cudaDataType_t ty = dt == DT_F16 ? CUDA_R_16F : CUDA_R_16BF;
    size_t wsz = (size_t)64 << 20, nn = (size_t)n * n;
    float alpha = 1.0f, beta = 0.0f;
    void *a = dalloc(nn * 2), *b = dalloc(nn * 2), *c = dalloc(nn * 2), *ws = dalloc(wsz);
    double res = NAN, *ms = dt_xmallocarray((size_t)reps, sizeof(double));
    cudaEvent_t e0, e1;
    int nres = 0;

    snprintf(why, whylen, "?");
    fill_random(a, nn, dt, 11);
    fill_random(b, nn, dt, 12);
    BCUDA(cudaEventCreate(&e0));
    BCUDA(cudaEventCreate(&e1));
    LT_TRY(cublasLtCreate(&lt));
    LT_TRY(cublasLtMatmulDescCreate(&op, CUBLAS_COMPUTE_32F, CUDA_R_32F));
    LT_TRY(cublasLtMatrixLayoutCreate(&lay, ty, (uint64_t)n, (uint64_t)n, n));
    LT_TRY(cublasLtMatmulPreferenceCreate(&pref));
    LT_TRY(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES,
                                                &wsz, sizeof wsz));
    LT_TRY(cublasLtMatmulAlgoGetHeuristic(lt, op, lay, lay, lay, lay, pref, 1, &heur, &nres));
    if (nres < 1) {
        snprintf(why, whylen, "cublasLtMatmulAlgoGetHeuristic: no algorithm");
        goto out;
    }
    for (int i = 0; i < 3 + reps; i++) {
        BCUDA(cudaEventRecord(e0, st));
        LT_TRY(cublasLtMatmul(lt, op, &alpha, a, lay, b, lay, &beta, c, lay, c, lay, &heur.algo,
                              ws, wsz, st));
        BCUDA(cudaEventRecord(e1, st));
        BCUDA(cudaEventSynchronize(e1));
        float t;
        BCUDA(cudaEventElapsedTime(&t, e0, e1));
        if (i >= 3)
            ms[i - 3] = t;
    }
    res = 2.0 * n * (double)n * n / (median(ms, reps) * 1e-3) * 1e-12;
out:
    if (pref)
        cublasLtMatmulPreferenceDestroy(pref);
    if (lay)
        cublasLtMatrixLayoutDestroy(lay);
    if (op)
        cublasLtMatmulDescDestroy(op);
    if (lt)
        cublasLtDestroy(lt);
    BCUDA(cudaEventDestroy(e0));
    BCUDA(cudaEventDestroy(e1));
    BCUDA(cudaFree(a));
    BCUDA(cudaFree(b));
    BCUDA(cudaFree(c));
    BCUDA(cudaFree(ws));
    free(ms);
    return res;
}

/*-- (a) one block -------------------------------------------------------------------*/

/* Forward FLOPs as the README counts them: 4 T^2 H D, halved when causal. */
static double fwd_flops(int64_t T, int H, int D, int causal)
{
    double f = 4.0 * (double)T * (double)T * H * D;
    return causal ? f / 2 : f;
}

/* Device tensors of one dense block, sized for T rows of H * D = hd. */
typedef struct block {
    int64_t T;
    void *q, *k, *v, *dout;
    float *o, *lse, *delta, *dq, *dk, *dv;
    void *ohalf;      /* o in dtype, for cuDNN's backward */
    dt_attn_blk_t blk; /* blocks through cuDNN when it is the kernel (engine/attn/attn_block.h) */
} block_t;

/* The block kernel of this run: cuDNN (DT_ATTN_KERNEL=cudnn or auto, where
 * it loads) or dt's own; said once as a KERNEL line. */
static int bench_cudnn(void)
{
    static int k = -1;
    if (k < 0) {
        char name[256];
        k = dt_attn_block_cudnn(name, sizeof(name));
        printf("KERNEL %s\n", name);
    }
    return k;
}

static void block_alloc(block_t *b, int64_t T, int hd, int H, dt_dtype_t dt, int nondet)
{
    size_t n = (size_t)T * hd, es = dt_dtype_size(dt);
    *b = (block_t){ 0 }; /* blk.cudnn 0 unless set below */
    b->T = T;
    b->q = dalloc(n * es);
    b->k = dalloc(n * es);
    b->v = dalloc(n * es);
    b->dout = dalloc(n * es);
    b->o = dalloc(n * 4);
    b->lse = dalloc((size_t)T * H * 4);
    b->delta = dalloc((size_t)T * H * 4);
    b->dq = dalloc(n * 4);
    b->dk = dalloc(n * 4);
    b->dv = dalloc(n * 4);
    fill_random(b->q, n, dt, 1);
    fill_random(b->k, n, dt, 2);
    fill_random(b->v, n, dt, 3);
    fill_random(b->dout, n, dt, 4);
    if (bench_cudnn()) {
        dt_emsg_t em = { { 0 } };
        size_t bytes = 0;
        b->blk = (dt_attn_blk_t){ .cudnn = 1, .det = !nondet };
        for (int bwd = 0; bwd < 2; bwd++) {
            size_t x = 0;
            if (dt_attn_block_bytes(&b->blk, T, T, H, H, hd / H, dt, hd, bwd, &x, &em) < 0) {
                fprintf(stderr, "bench_attn_cuda: cuDNN: %s\n", em.s);
                exit(1);
            }
            bytes = x > bytes ? x : bytes;
        }
        b->blk.ws = dalloc(bytes ? bytes : 1);
        b->blk.bytes = bytes;
        b->ohalf = dalloc(n * es);
        b->blk.ohalf = b->ohalf;
    }
}

static void block_free(block_t *b)
{
    void *p[] = { b->q, b->k, b->v, b->dout, b->o, b->lse, b->delta, b->dq, b->dk, b->dv,
                  b->ohalf, b->blk.ws };
    for (size_t i = 0; i < sizeof p / sizeof p[0]; i++)
        BCUDA(cudaFree(p[i]));
    memset(b, 0, sizeof *b);
}

static dt_attn_cuda_t block_args(const block_t *b, int H, int D, int causal, dt_dtype_t dt)
{
    return (dt_attn_cuda_t){
        .tq = b->T, .tk = b->T, .h = H, .hkv = H, .d = D, .dtype = dt,
        .q = b->q, .ldq = (int64_t)H * D, .k = b->k, .ldk = (int64_t)H * D,
        .v = b->v, .ldv = (int64_t)H * D,
        .causal = causal, .q0 = 0, .k0 = 0, .qpos = NULL, .kpos = NULL, .scale = 0.0f,
    };
}

/* One forward (dir 0) or backward (dir 1, all a caller runs) of the block,
 * enqueued on st. */
static int block_run(const block_t *b, const dt_attn_cuda_t *a, int dir, cudaStream_t st,
                     dt_emsg_t *em)
{
    int64_t hd = (int64_t)a->h * a->d;
    dt_attn_blk_t *blk = (dt_attn_blk_t *)&b->blk;
    if (dir == 0)
        return blk->cudnn ? dt_attn_block_fwd(blk, a, NULL, 0, NULL, 0, 0, b->o, hd, b->lse, b->T,
                                              st, em)
                          : dt_attn_fwd_cuda(a, 0, b->o, hd, b->lse, b->T, st, em);
    size_t n = (size_t)b->T * (size_t)hd * 4;
    DT_CUDA_TRY(em, cudaMemsetAsync(b->dq, 0, n, st));
    DT_CUDA_TRY(em, cudaMemsetAsync(b->dk, 0, n, st));
    DT_CUDA_TRY(em, cudaMemsetAsync(b->dv, 0, n, st));
    int rc = dt_attn_delta_cuda(b->T, a->h, a->d, a->dtype, b->dout, hd, b->o, hd, b->delta, b->T,
                                st, em);
    if (rc)
        return rc;
    dt_attn_cuda_grad_t g = {
        .dout = b->dout, .lddo = hd, .lse = b->lse, .ldlse = b->T, .delta = b->delta,
        .dq = b->dq, .lddq = hd, .dk = b->dk, .lddk = hd, .dv = b->dv, .lddv = hd,
    };
    if (blk->cudnn) { /* the forward's o in dtype, as the ring makes it */
        rc = dt_cast_from_f32_cuda(a->dtype, b->T * hd, b->o, b->ohalf, st, em);
        return rc ? rc : dt_attn_block_bwd(blk, a, NULL, 0, NULL, 0, &g, st, em);
    }
    return dt_attn_bwd_cuda(a, &g, st, em);
}

/* One block_run between two events: its milliseconds. */
static int timed_once(const block_t *b, const dt_attn_cuda_t *a, int dir, cudaStream_t st,
                      cudaEvent_t e0, cudaEvent_t e1, double *ms, dt_emsg_t *em)
{
    float t;

    BCUDA(cudaEventRecord(e0, st));
    int rc = block_run(b, a, dir, st, em);
    if (rc)
        return rc;
    BCUDA(cudaEventRecord(e1, st));
    cudaError_t e = cudaEventSynchronize(e1);
    if (e != cudaSuccess)
        return dt_cuda_err(em, e, "cudaEventSynchronize (a kernel failed)", __FILE__, __LINE__);
    BCUDA(cudaEventElapsedTime(&t, e0, e1));
    *ms = t;
    return 0;
}

/* Median milliseconds of block_run by cudaEvents: a warm-up, a second one
 * when the first was fast, then reps_for() repetitions. */
static int time_events(const opts_t *o, const block_t *b, const dt_attn_cuda_t *a, int dir,
                       cudaStream_t st, double *ms_out, dt_emsg_t *em)
{
    cudaEvent_t e0, e1;
    double first = 0, t = 0, *ms = dt_xmallocarray((size_t)o->reps, sizeof(double));
    int n = 0;

    *ms_out = NAN;
    BCUDA(cudaEventCreate(&e0));
    BCUDA(cudaEventCreate(&e1));
    int rc = timed_once(b, a, dir, st, e0, e1, &first, em);
    if (rc == 0 && first < 1000.0)
        rc = timed_once(b, a, dir, st, e0, e1, &t, em);
    if (rc == 0)
        n = reps_for(o, first);
    for (int i = 0; i < n && rc == 0; i++)
        rc = timed_once(b, a, dir, st, e0, e1, &ms[i], em);
    if (rc == 0)
        *ms_out = median(ms, n);
    BCUDA(cudaEventDestroy(e0));
    BCUDA(cudaEventDestroy(e1));
    free(ms);
    return rc;
}

static const char *dirname_of(int dir)
{
    return dir == 0 ? "fwd" : dir == 1 ? "bwd" : "fwdbwd";
}

/* The machine-readable line of one (a) row. */
static void print_row(int dir, dt_dtype_t dt, int64_t T, int H, int D, int causal, double ms,
                      const char *err)
{
    double fl = fwd_flops(T, H, D, causal) * (dir == 0 ? 1.0 : dir == 1 ? 2.5 : 3.5);
    if (err == NULL && isfinite(ms))
        row_add("ROW %s %s T=%lld H=%d D=%d causal=%d ms=%.4f tflops=%.2f", dirname_of(dir),
                dt_dtype_name(dt), (long long)T, H, D, causal, ms, fl / (ms * 1e-3) * 1e-12);
    else
        row_add("ROW %s %s T=%lld H=%d D=%d causal=%d ms=- tflops=- error=\"%s\"",
                dirname_of(dir), dt_dtype_name(dt), (long long)T, H, D, causal,
                err ? err : "not run");
}

static void part_attn(const opts_t *o, double gemm, cudaStream_t st)
{
    static const int64_t Ts[] = { 4096, 16384, 65536 };
    static const int Ds[] = { 64, 128 };
    int nT = o->quick ? 2 : 3;

    printf("\n(a) one block: dt_attn_fwd_cuda / dt_attn_bwd_cuda, %s, B=1, H=Hkv=2048/D, "
           "q0=k0=0\n", dt_dtype_name(o->dt));
    printf("    FLOPs: forward 4*T^2*H*D (half when causal), backward 2.5x forward; bwd = zero "
           "dq,dk,dv + dt_attn_delta_cuda + dt_attn_bwd_cuda\n");
    printf("    median of %d (3 for rows slower than 1 s) after warm-up, cudaEvent timing\n\n",
           o->reps);
    printf("%6s %3s %4s %6s | %9s %8s %6s | %9s %8s %6s\n", "T", "H", "D", "causal", "fwd ms",
           "TFLOP/s", "%gemm", "bwd ms", "TFLOP/s", "%gemm");
    fflush(stdout);
    for (int ti = 0; ti < nT; ti++) {
        int64_t T = Ts[ti];
        block_t b;
        int have = 0;
        for (int di = 0; di < 2; di++)
            for (int causal = 0; causal < 2; causal++) {
                int D = Ds[di], H = 2048 / D;
                double ms[2] = { NAN, NAN };
                char err[2][600] = { "", "" };
                if (spent(o, 0.6)) {
                    printf("SKIP T=%lld D=%d causal=%d: the time budget for (a) is spent "
                           "(--budget %.0f)\n", (long long)T, D, causal, o->budget);
                    for (int dir = 0; dir < 3; dir++)
                        print_row(dir, o->dt, T, H, D, causal, NAN, "skipped: time budget");
                    continue;
                }
                if (!have) {
                    block_alloc(&b, T, 2048, 32, o->dt, o->nondet);
                    have = 1;
                }
                dt_attn_cuda_t a = block_args(&b, H, D, causal, o->dt);
                for (int dir = 0; dir < 2; dir++) {
                    dt_emsg_t em = { { 0 } };
                    int rc = time_events(o, &b, &a, dir, st, &ms[dir], &em);
                    if (rc) {
                        snprintf(err[dir], sizeof err[dir], "%s: %s", dt_err_name(rc), em.s);
                        fprintf(stderr, "bench_attn_cuda: %s T=%lld D=%d causal=%d: %s\n",
                                dirname_of(dir), (long long)T, D, causal, err[dir]);
                        failures++;
                        if (rc == DT_EDEVICE) {
                            /* the context may be lost: stop here, loudly */
                            print_row(dir, o->dt, T, H, D, causal, NAN, err[dir]);
                            rows_flush();
                            exit(1);
                        }
                    }
                }
                double fl = fwd_flops(T, H, D, causal);
                double tf = fl / (ms[0] * 1e-3) * 1e-12, tb = 2.5 * fl / (ms[1] * 1e-3) * 1e-12;
                printf("%6lld %3d %4d %6s | %9.3f %8.1f %5.0f%% | %9.3f %8.1f %5.0f%%\n",
                       (long long)T, H, D, causal ? "yes" : "no", ms[0], tf, 100 * tf / gemm,
                       ms[1], tb, 100 * tb / gemm);
                print_row(0, o->dt, T, H, D, causal, ms[0], err[0][0] ? err[0] : NULL);
                print_row(1, o->dt, T, H, D, causal, ms[1], err[1][0] ? err[1] : NULL);
                print_row(2, o->dt, T, H, D, causal, ms[0] + ms[1],
                          err[0][0] ? err[0] : err[1][0] ? err[1] : NULL);
                fflush(stdout);
            }
        if (have)
            block_free(&b);
    }
    rows_flush();
}

/*-- (b) the ring on one GPU ------------------------------------------------------------*/

/* A thread that polls cudaMemGetInfo every 200 us while the calls it
 * watches run: the lowest free bytes it saw is their peak. */
typedef struct memwatch {
    pthread_t th;
    int dev;
    int stop; /* atomic */
    int running;
    size_t minfree; /* the thread's own until joined */
} memwatch_t;

static void *memwatch_main(void *arg)
{
    memwatch_t *w = arg;
    size_t f, t;

    if (cudaSetDevice(w->dev) != cudaSuccess)
        return NULL;
    while (!__atomic_load_n(&w->stop, __ATOMIC_ACQUIRE)) {
        if (cudaMemGetInfo(&f, &t) == cudaSuccess && f < w->minfree)
            w->minfree = f;
        usleep(200);
    }
    return NULL;
}

static void memwatch_start(memwatch_t *w, int dev, size_t minfree)
{
    w->dev = dev;
    w->stop = 0;
    w->minfree = minfree;
    w->running = pthread_create(&w->th, NULL, memwatch_main, w) == 0;
}

static size_t memwatch_stop(memwatch_t *w)
{
    size_t f, t;

    if (w->running) {
        __atomic_store_n(&w->stop, 1, __ATOMIC_RELEASE);
        pthread_join(w->th, NULL);
    }
    if (cudaMemGetInfo(&f, &t) == cudaSuccess && f < w->minfree)
        w->minfree = f;
    return w->minfree;
}

static size_t mem_free(void)
{
    size_t f, t;
    BCUDA(cudaDeviceSynchronize());
    BCUDA(cudaMemGetInfo(&f, &t));
    return f;
}

/* Median host milliseconds of a synchronous call: a warm-up (under a
 * memwatch when minfree is given), one more when it was fast, then
 * reps_for() repetitions; the ring's exposed wait, median, into wait_ms. */
typedef struct timed_call {
    int (*run)(void *ctx, dt_attn_stats_t *st, dt_emsg_t *em);
    void *ctx;
} timed_call_t;

static int time_host(const opts_t *o, timed_call_t c, int dev, size_t *minfree, double *ms_out,
                     double *wait_ms, dt_emsg_t *em)
{
    double *ms = dt_xmallocarray((size_t)o->reps, sizeof(double));
    double *wt = dt_xmallocarray((size_t)o->reps, sizeof(double));
    dt_attn_stats_t st;
    memwatch_t w;
    int rc, n;

    *ms_out = *wait_ms = NAN;
    (void)mem_free();
    if (minfree)
        memwatch_start(&w, dev, *minfree);
    double t0 = dt_clock_now();
    memset(&st, 0, sizeof st);
    rc = c.run(c.ctx, &st, em);
    double first = (dt_clock_now() - t0) * 1e3;
    if (minfree)
        *minfree = memwatch_stop(&w);
    if (rc)
        goto out;
    n = reps_for(o, first);
    if (first < 1000.0) {
        memset(&st, 0, sizeof st);
        if ((rc = c.run(c.ctx, &st, em)) != 0)
            goto out;
    }
    for (int i = 0; i < n; i++) {
        (void)mem_free(); /* synchronises */
        memset(&st, 0, sizeof st);
        t0 = dt_clock_now();
        if ((rc = c.run(c.ctx, &st, em)) != 0)
            goto out;
        ms[i] = (dt_clock_now() - t0) * 1e3;
        wt[i] = st.wait_s * 1e3;
    }
    *ms_out = median(ms, n);
    *wait_ms = median(wt, n);
out:
    free(ms);
    free(wt);
    return rc;
}

/* the single-block baseline, synchronous like the ring */
typedef struct base_ctx {
    const block_t *b;
    dt_attn_cuda_t a;
    int dir;
    cudaStream_t st;
} base_ctx_t;

static int base_run(void *ctx, dt_attn_stats_t *st, dt_emsg_t *em)
{
    base_ctx_t *c = ctx;
    (void)st;
    int rc = block_run(c->b, &c->a, c->dir, c->st, em);
    if (rc == 0)
        DT_CUDA_TRY(em, cudaStreamSynchronize(c->st));
    return rc;
}

typedef struct ring_ctx {
    dt_ring_t *r;
    const dt_attn_spec_t *s;
    dt_dtype_t dt;
    dt_ring_io_t *io;
    int dir;
} ring_ctx_t;

static int ring_run(void *ctx, dt_attn_stats_t *st, dt_emsg_t *em)
{
    ring_ctx_t *c = ctx;
    return c->dir == 0 ? dt_ring_attn_fwd(c->r, c->s, c->dt, c->io, st, em)
                       : dt_ring_attn_bwd(c->r, c->s, c->dt, c->io, st, em);
}

static void ring_fail(const char *what, int64_t T, int R, const char *attn, int rc,
                      const dt_emsg_t *em,
                      dt_dtype_t dt)
{
    fprintf(stderr, "bench_attn_cuda: ring T=%lld R=%d: %s: %s: %s\n", (long long)T, R, what,
            dt_err_name(rc), em->s);
    printf("%6lld %2d | %s: %s failed: %s: %s\n", (long long)T, R, attn, what, dt_err_name(rc),
           em->s);
    row_add("RING %s T=%lld R=%d attn=%s fwd_ms=- bwd_ms=- error=\"%s: %s: %s\"",
            dt_dtype_name(dt), (long long)T, R, attn, what, dt_err_name(rc), em->s);
    failures++;
}

/* One R: allocate the ranks' tensors, time forward and backward, measure
 * memory, free. base_ms[2]: the single block's forward and backward; segs,
 * dils: dilated branches (NULL: dense). */
static void ring_row(const opts_t *o, int dev, int64_t T, int R, const double base_ms[2],
                     const char *segs, const char *dils)
{
    const int H = 16, D = 128;
    dt_attn_spec_t s;
    dt_emsg_t em = { { 0 } };
    dt_ring_t *r = NULL;
    dt_ring_io_t *io = NULL;
    int nloc = 0, rc;
    size_t es = dt_dtype_size(o->dt);

    memset(&s, 0, sizeof s);
    s.T = T;
    s.H = H;
    s.Hkv = H;
    s.D = D;
    s.causal = true;
    s.nbranch = 0;
    s.layout = DT_LAYOUT_ZIGZAG;
    s.scale = 0.0f;
    s.nondet = o->nondet != 0;
    char attn[128] = "dense";
    if (segs != NULL) {
        snprintf(attn, sizeof attn, "w=%s:r=%s", segs, dils);
        if ((rc = dt_attn_parse_branches(&s, segs, dils, &em)) != 0) {
            ring_fail("dt_attn_parse_branches", T, R, attn, rc, &em, o->dt);
            return;
        }
    }
    if ((rc = dt_attn_check(&s, R, &em)) != 0) {
        ring_fail("dt_attn_check", T, R, attn, rc, &em, o->dt);
        return;
    }
    size_t free0 = mem_free();
    if ((rc = dt_ring_local_new(R, dev, &r, &em)) != 0) {
        ring_fail("dt_ring_local_new", T, R, attn, rc, &em, o->dt);
        return;
    }
    nloc = dt_ring_nlocal(r);
    int64_t c = T / R;
    size_t nq = (size_t)c * H * D;
    io = dt_xcalloc((size_t)nloc, sizeof *io);
    for (int l = 0; l < nloc; l++) {
        void *q = dalloc(nq * es), *k = dalloc(nq * es), *v = dalloc(nq * es);
        void *dout = dalloc(nq * es);
        fill_random(q, nq, o->dt, 100 + 4 * (uint64_t)l);
        fill_random(k, nq, o->dt, 101 + 4 * (uint64_t)l);
        fill_random(v, nq, o->dt, 102 + 4 * (uint64_t)l);
        fill_random(dout, nq, o->dt, 103 + 4 * (uint64_t)l);
        io[l] = (dt_ring_io_t){
            .q = q, .k = k, .v = v, .o = dalloc(nq * 4), .lse = dalloc((size_t)H * c * 4),
            .dout = dout, .dq = dalloc(nq * 4), .dk = dalloc(nq * 4), .dv = dalloc(nq * 4),
        };
    }
    size_t minfree = mem_free();
    ring_ctx_t fctx = { r, &s, o->dt, io, 0 }, bctx = { r, &s, o->dt, io, 1 };
    double ms[2], wait[2];
    rc = time_host(o, (timed_call_t){ ring_run, &fctx }, dev, &minfree, &ms[0], &wait[0], &em);
    if (rc) {
        ring_fail("dt_ring_attn_fwd", T, R, attn, rc, &em, o->dt);
        goto out;
    }
    rc = time_host(o, (timed_call_t){ ring_run, &bctx }, dev, &minfree, &ms[1], &wait[1], &em);
    if (rc) {
        ring_fail("dt_ring_attn_bwd", T, R, attn, rc, &em, o->dt);
        goto out;
    }

    /* per rank: q, k, v, dout (dtype); o, dq, dk, dv (fp32); lse (fp32) */
    double tensors = (double)nq * (4 * es + 4 * 4) + (double)H * c * 4;
    double ringf = (double)dt_ring_attn_bytes(&s, o->dt, R, 0);
    double ringb = (double)dt_ring_attn_bytes(&s, o->dt, R, 1);
    double model = tensors + (ringf > ringb ? ringf : ringb);
    double measured = free0 > minfree ? (double)(free0 - minfree) / nloc : 0.0;
    printf("%6lld %2d | %9.3f %9.3f %+6.1f%% | %9.3f %9.3f %+6.1f%% | %7.2f %7.2f | %8.1f "
           "%6.1f/%-6.1f %8.1f %9.1f  %s\n",
           (long long)T, R, ms[0], base_ms[0], 100 * (ms[0] / base_ms[0] - 1), ms[1], base_ms[1],
           100 * (ms[1] / base_ms[1] - 1), wait[0], wait[1], tensors / MIB, ringf / MIB,
           ringb / MIB, model / MIB, measured / MIB, attn);
    row_add("RING %s T=%lld R=%d attn=%s fwd_ms=%.4f fwd_base_ms=%.4f bwd_ms=%.4f bwd_base_ms=%.4f "
            "fwd_wait_ms=%.4f bwd_wait_ms=%.4f tensors_mib=%.1f ring_fwd_mib=%.1f "
            "ring_bwd_mib=%.1f model_mib=%.1f measured_mib=%.1f",
            dt_dtype_name(o->dt), (long long)T, R, attn, ms[0], base_ms[0], ms[1], base_ms[1], wait[0],
            wait[1], tensors / MIB, ringf / MIB, ringb / MIB, model / MIB, measured / MIB);
    fflush(stdout);
out:
    for (int l = 0; l < nloc; l++) {
        void *p[] = { (void *)io[l].q, (void *)io[l].k, (void *)io[l].v, (void *)io[l].dout,
                      io[l].o, io[l].lse, io[l].dq, io[l].dk, io[l].dv };
        for (size_t i = 0; i < sizeof p / sizeof p[0]; i++)
            BCUDA(cudaFree(p[i]));
    }
    free(io);
    dt_ring_free(r);
    if (rc == DT_EDEVICE) {
        rows_flush();
        exit(1);
    }
}

static void part_ring(const opts_t *o, int dev, cudaStream_t st)
{
    static const int64_t Ts[] = { 16384, 65536 };
    static const int Rs[] = { 1, 2, 4, 8 };
    const int H = 16, D = 128;
    int nT = o->quick ? 1 : 2;

    printf("\n(b) ring of R ranks on this one GPU: dt_ring_local_new(R) + dt_ring_attn_fwd/bwd, "
           "%s, causal, zigzag, H=Hkv=%d, D=%d\n", dt_dtype_name(o->dt), H, D);
    printf("    baseline (base): one dt_attn_fwd_cuda over all T (bwd: zero + delta + "
           "dt_attn_bwd_cuda), same run; both timed on the host clock around synchronous "
           "calls, median\n");
    printf("    wait: the ring's exposed transfer time (dt_attn_stats_t.wait_s, summed over "
           "ranks); MiB per rank: tensors = q,k,v,dout,o,lse,dq,dk,dv of T/R rows; ring = "
           "dt_ring_attn_bytes fwd/bwd;\n    model = tensors + ring; measured = peak "
           "cudaMemGetInfo delta over ring creation, allocation and the warm-up calls, / R\n"
           "    last column: dense, or dilated branches w=segments:r=dilations (base stays "
           "the dense single block)\n\n");
    printf("%6s %2s | %9s %9s %7s | %9s %9s %7s | %7s %7s | %8s %13s %8s %9s\n", "T", "R",
           "fwd ms", "base ms", "over", "bwd ms", "base ms", "over", "wait f", "wait b",
           "tensors", "ring f/b", "model", "measured");
    fflush(stdout);
    for (int ti = 0; ti < nT; ti++) {
        int64_t T = Ts[ti];
        double base[2] = { NAN, NAN };
        if (spent(o, 1.0)) {
            printf("SKIP ring T=%lld: the time budget is spent (--budget %.0f)\n", (long long)T,
                   o->budget);
            continue;
        }
        block_t b;
        block_alloc(&b, T, H * D, H, o->dt, o->nondet);
        for (int dir = 0; dir < 2; dir++) {
            base_ctx_t bc = { &b, block_args(&b, H, D, 1, o->dt), dir, st };
            dt_emsg_t em = { { 0 } };
            double w;
            int rc = time_host(o, (timed_call_t){ base_run, &bc }, dev, NULL, &base[dir], &w,
                               &em);
            if (rc) {
                fprintf(stderr, "bench_attn_cuda: ring baseline %s T=%lld: %s: %s\n",
                        dirname_of(dir), (long long)T, dt_err_name(rc), em.s);
                failures++;
                if (rc == DT_EDEVICE) {
                    rows_flush();
                    exit(1);
                }
            }
        }
        double single = (double)T * H * D * (4 * dt_dtype_size(o->dt) + 4 * 4) +
                        (double)H * T * 4 * 2;
        printf("%6lld  - | %9s %9.3f %7s | %9s %9.3f %7s | %7s %7s | %8.1f %13s %8.1f %9s  "
               "(single block: q,k,v,dout,o,lse,delta,dq,dk,dv)\n",
               (long long)T, "", base[0], "", "", base[1], "", "", "", single / MIB, "",
               single / MIB, "");
        block_free(&b);
        for (int ri = 0; ri < 4; ri++) {
            if (spent(o, 1.0)) {
                printf("SKIP ring T=%lld R=%d: the time budget is spent (--budget %.0f)\n",
                       (long long)T, Rs[ri], o->budget);
                continue;
            }
            ring_row(o, dev, T, Rs[ri], base, NULL, NULL);
        }
        /* LongNet-style branches; the last is as long as the sequence */
        char segs[64];
        snprintf(segs, sizeof segs, "2048,8192,%lld", (long long)T);
        for (int ri = 0; ri < 4; ri += 3) {
            if (spent(o, 1.0)) {
                printf("SKIP dilated ring T=%lld R=%d: the time budget is spent (--budget "
                       "%.0f)\n", (long long)T, Rs[ri], o->budget);
                continue;
            }
            ring_row(o, dev, T, Rs[ri], base, segs, "1,2,8");
        }
    }
    rows_flush();
}

/*-- main ------------------------------------------------------------------------------*/

static int usage(void)
{
    fprintf(stderr, "usage: bench_attn_cuda [--quick] [--dtype bf16|fp16] [--reps N] "
                    "[--budget SECONDS] [--no-attn] [--no-ring] [--nondeterministic]\n");
    return 2;
}

int main(int argc, char **argv)
{
    opts_t o = { .quick = 0, .dt = DT_BF16, .reps = 0, .budget = 0, .attn = 1, .ring = 1 };
    dt_emsg_t em = { { 0 } };

    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        char *end;
        if (strcmp(a, "--quick") == 0)
            o.quick = 1;
        else if (strcmp(a, "--no-attn") == 0)
            o.attn = 0;
        else if (strcmp(a, "--no-ring") == 0)
            o.ring = 0;
        else if (strcmp(a, "--nondeterministic") == 0)
            o.nondet = 1;
        else if (strcmp(a, "--dtype") == 0 && i + 1 < argc) {
            a = argv[++i];
            if (strcmp(a, "bf16") == 0)
                o.dt = DT_BF16;
            else if (strcmp(a, "fp16") == 0)
                o.dt = DT_F16;
            else {
                fprintf(stderr, "bench_attn_cuda: --dtype %s: bf16 or fp16\n", a);
                return usage();
            }
        } else if (strcmp(a, "--reps") == 0 && i + 1 < argc) {
            long v = strtol(argv[++i], &end, 10);
            if (*end != '\0' || v < 1 || v > 1000) {
                fprintf(stderr, "bench_attn_cuda: --reps %s: a number from 1 to 1000\n", argv[i]);
                return usage();
            }
            o.reps = (int)v;
        } else if (strcmp(a, "--budget") == 0 && i + 1 < argc) {
            double v = strtod(argv[++i], &end);
            if (*end != '\0' || !(v > 0)) {
                fprintf(stderr, "bench_attn_cuda: --budget %s: seconds, > 0\n", argv[i]);
                return usage();
            }
            o.budget = v;
        } else
            return usage();
    }
    if (o.reps == 0)
        o.reps = o.quick ? 3 : 10;
    if (o.budget == 0)
        o.budget = o.quick ? 150 : 420;

    if (dt_cuda_devices(&em) <= 0) {
        printf("SKIP: bench_attn_cuda: no usable CUDA device: %s\n", em.s);
        return 77;
    }
    int dev = 0;
    struct cudaDeviceProp p;
    BCUDA(cudaSetDevice(dev));
    BCUDA(cudaFree(NULL)); /* the context, before any timing or memory reading */
    BCUDA(cudaGetDeviceProperties(&p, dev));
    t_start = dt_clock_now();
    printf("bench_attn_cuda: %s, sm_%d%d, %d SMs, %.1f GiB; %s, %d repetitions, budget %.0f s%s\n",
           p.name, p.major, p.minor, p.multiProcessorCount, (double)p.totalGlobalMem / (MIB * 1024),
           dt_dtype_name(o.dt), o.reps, o.budget, o.quick ? ", quick" : "");

    cudaStream_t st;
    BCUDA(cudaStreamCreateWithFlags(&st, cudaStreamNonBlocking));
    char why[600];
    double gemm = gemm_tflops(o.dt, 8192, o.reps, st, why, sizeof why);
    if (isfinite(gemm)) {
        printf("baseline: cuBLASLt %s GEMM 8192^3, fp32 accumulate: %.1f TFLOP/s (median of %d, "
               "same run)\n", dt_dtype_name(o.dt), gemm, o.reps);
        row_add("GEMM %s n=8192 tflops=%.2f", dt_dtype_name(o.dt), gemm);
    } else
        printf("baseline: cuBLASLt GEMM unavailable (%%gemm left out): %s\n", why);
    fflush(stdout);

    if (o.attn)
        part_attn(&o, gemm, st);
    if (o.ring)
        part_ring(&o, dev, st);
    rows_flush();
    BCUDA(cudaStreamDestroy(st));
    printf("\nbench_attn_cuda: %.1f s, %d failed row(s)\n", dt_clock_now() - t_start, failures);
    return failures ? 1 : 0;
}
