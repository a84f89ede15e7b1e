/* SPDX-License-Identifier: MIT
 *
 * CUDA building blocks of one LLaMA-3 layer (layers_cuda.h): casts between
 * fp32 and bf16/fp16, RMSNorm, RoPE and SwiGLU forward and backward, and the
 * linear layers on cuBLASLt. The kernels are deliberately plain: one thread
 * per element (casts, SwiGLU), one thread per (token, pair) looping over the
 * heads (RoPE), one warp per row (RMSNorm), int64 indexing throughout. The
 * contracts, and the references the tests compare against, are those of
 * kernels/cpu/layers_cpu.h.
 *
 * Not here: attention (attn_*.cu), the embedding and the loss, the residual
 * add, the optimizer. Nothing here keeps state across calls except the
 * cuBLASLt handle and its workspace in dt_blas_t.
 */
#include "config.h"

#include <dlfcn.h>
#include <math.h>
#include <pthread.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include <cublasLt.h>
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include "common/err.h"
#include "common/mem.h"
#include "kernels/cpu/layers_cpu.h" /* dt_rope_freq */
#include "kernels/cuda/cuda_err.h"
#include "kernels/cuda/grid.cuh"
#include "kernels/cuda/layers_cuda.h"

/*-- casts --------------------------------------------------------------------*/

template <typename T> struct cvt;

template <> struct cvt<__nv_bfloat16> {
    static __device__ __forceinline__ float to(__nv_bfloat16 v)
    {
        return __bfloat162float(v);
    }
    static __device__ __forceinline__ __nv_bfloat16 from(float v)
    {
        return __float2bfloat16_rn(v);
    }
};

template <> struct cvt<__half> {
    static __device__ __forceinline__ float to(__half v)
    {
        return __half2float(v);
    }
    static __device__ __forceinline__ __half from(float v)
    {
        return __float2half_rn(v);
    }
};

template <> struct cvt<float> {
    static __device__ __forceinline__ float to(float v)
    {
        return v;
    }
    static __device__ __forceinline__ float from(float v)
    {
        return v;
    }
};

/* x (n) fp32 -> y (n) T, round to nearest even. */
template <typename T> static __global__ void cast_from_f32_kernel(int64_t n, const float *x, T *y)
{
    for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < n;
         i += (int64_t)gridDim.x * blockDim.x)
        y[i] = cvt<T>::from(x[i]);
}

/* x (n) T -> y (n) fp32, exact. */
template <typename T> static __global__ void cast_to_f32_kernel(int64_t n, const T *x, float *y)
{
    for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < n;
         i += (int64_t)gridDim.x * blockDim.x)
        y[i] = cvt<T>::to(x[i]);
}

static int cast_check(const char *fn, dt_dtype_t dtype, int64_t n, const void *x, const void *y,
                      dt_emsg_t *em)
{
    if (dtype != DT_BF16 && dtype != DT_F16 && dtype != DT_F32)
        return dt_emsg_set(em, DT_EINVAL, "%s: dtype=%d is not bf16, fp16 or fp32", fn, (int)dtype);
    if (n < 0)
        return dt_emsg_set(em, DT_EINVAL, "%s: n=%lld < 0", fn, (long long)n);
    if (n > 0 && (x == NULL || y == NULL))
        return dt_emsg_set(em, DT_EINVAL, "%s: NULL tensor with n=%lld", fn, (long long)n);
    return 0;
}

/* Both casts: to_f32 picks the direction (x and y are then of dtype and
 * fp32, else fp32 and dtype). fp32 to fp32 is a copy. */
static int cast(const char *fn, dt_dtype_t dtype, int64_t n, const void *x, void *y, int to_f32,
                cudaStream_t st, dt_emsg_t *em)
{
    int rc = cast_check(fn, dtype, n, x, y, em);

    if (rc != 0 || n == 0)
        return rc;
    if (dtype == DT_F32) {
        if (x != y)
            DT_CUDA_TRY(
                em, cudaMemcpyAsync(y, x, (size_t)n * sizeof(float), cudaMemcpyDeviceToDevice, st));
        return 0;
    }
    const unsigned grid = grid_for(n, THREADS);
    if (to_f32 && dtype == DT_BF16)
        cast_to_f32_kernel<<<grid, THREADS, 0, st>>>(n, (const __nv_bfloat16 *)x, (float *)y);
    else if (to_f32)
        cast_to_f32_kernel<<<grid, THREADS, 0, st>>>(n, (const __half *)x, (float *)y);
    else if (dtype == DT_BF16)
        cast_from_f32_kernel<<<grid, THREADS, 0, st>>>(n, (const float *)x, (__nv_bfloat16 *)y);
    else
        cast_from_f32_kernel<<<grid, THREADS, 0, st>>>(n, (const float *)x, (__half *)y);
    DT_CUDA_TRY(em, cudaGetLastError());
    return 0;
}

extern "C" int dt_cast_from_f32_cuda(dt_dtype_t dtype, int64_t n, const float *x, void *y,
                                     cudaStream_t st, dt_emsg_t *em)
{
    return cast("dt_cast_from_f32_cuda", dtype, n, x, y, 0, st, em);
}

extern "C" int dt_cast_to_f32_cuda(dt_dtype_t dtype, int64_t n, const void *x, float *y,
                                   cudaStream_t st, dt_emsg_t *em)
{
    return cast("dt_cast_to_f32_cuda", dtype, n, x, y, 1, st, em);
}

/*-- RMSNorm ------------------------------------------------------------------*/

/* x (T, d), g (d) -> y (T, d), rstd (T); one warp per row, fp32 sums. y may
 * be x: each lane reads and writes only its own columns j = lane (mod 32),
 * and reads column j before writing it. */
static __global__ void rmsnorm_fwd_kernel(int64_t T, int d, float eps, const float *x,
                                          const float *g, float *y, float *rstd)
{
    const int lane = threadIdx.x % 32;

    for (int64_t t = (int64_t)blockIdx.x * WARPS + threadIdx.x / 32; t < T;
         t += (int64_t)gridDim.x * WARPS) {
        const float *xr = x + t * d;
        float *yr = y + t * d;
        float ss = 0.0f;
        for (int j = lane; j < d; j += 32)
            ss = fmaf(xr[j], xr[j], ss);
        ss = warp_sum(ss);
        const float r = 1.0f / sqrtf(ss / (float)d + eps);
        for (int j = lane; j < d; j += 32)
            yr[j] = xr[j] * r * g[j];
        if (lane == 0)
            rstd[t] = r;
    }
}

/* dx (T, d) WRITTEN = r g dy - x r^3 s / d, s = sum_j dy_j g_j x_j; one
 * warp per row. */
static __global__ void rmsnorm_dx_kernel(int64_t T, int d, const float *x, const float *g,
                                         const float *rstd, const float *dy, float *dx)
{
    const int lane = threadIdx.x % 32;

    for (int64_t t = (int64_t)blockIdx.x * WARPS + threadIdx.x / 32; t < T;
         t += (int64_t)gridDim.x * WARPS) {
        const float *xr = x + t * d, *dyr = dy + t * d;
        float *dxr = dx + t * d;
        float s = 0.0f;
        for (int j = lane; j < d; j += 32)
            s = fmaf(dyr[j] * g[j], xr[j], s);
        s = warp_sum(s);
        const float r = rstd[t];
        const float c = r * r * r * s / (float)d;
        for (int j = lane; j < d; j += 32)
            dxr[j] = r * g[j] * dyr[j] - xr[j] * c;
    }
}

/* dg = sum_t dy x rstd, deterministically in two passes: the rows are cut
 * into nchunks chunks of `chunk` rows (both depend on T only), pass 1
 * writes one partial sum per (chunk, column) into part (nchunks, d), pass 2
 * adds the partials of each column in chunk order into dg. */
enum {
    DG_COLS = 32,        /* columns per block of pass 1 (threadIdx.x) */
    DG_ROWS = 8,         /* row lanes per block of pass 1 (threadIdx.y) */
    DG_MIN_ROWS = 32,    /* rows per chunk while nchunks is below the cap */
    DG_MAX_CHUNKS = 512, /* part is at most 512 * d floats */
};

/* grid (ceil(d / 32), nchunks), block (32, 8): part[c * d + j] = sum over
 * rows t of chunk c of dy[t, j] x[t, j] rstd[t]. */
static __global__ void rmsnorm_dg_partial_kernel(int64_t T, int d, int64_t chunk, const float *x,
                                                 const float *rstd, const float *dy, float *part)
{
    __shared__ float acc[DG_ROWS][DG_COLS];
    const int j = blockIdx.x * DG_COLS + threadIdx.x;
    const int64_t lo = (int64_t)blockIdx.y * chunk;
    const int64_t hi = lo + chunk < T ? lo + chunk : T;
    float s = 0.0f;

    if (j < d)
        for (int64_t t = lo + threadIdx.y; t < hi; t += DG_ROWS)
            s = fmaf(dy[t * d + j] * x[t * d + j], rstd[t], s);
    acc[threadIdx.y][threadIdx.x] = s;
    __syncthreads();
    if (threadIdx.y == 0 && j < d) {
        float sum = 0.0f;
        for (int k = 0; k < DG_ROWS; k++)
            sum += acc[k][threadIdx.x];
        part[(int64_t)blockIdx.y * d + j] = sum;
    }
}

/* dg (d) ADDED += sum over c < nchunks of part[c * d + j], in order of c. */
static __global__ void rmsnorm_dg_final_kernel(int d, int64_t nchunks, const float *part, float *dg)
{
    for (int64_t j = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; j < d;
         j += (int64_t)gridDim.x * blockDim.x) {
        float s = 0.0f;
        for (int64_t c = 0; c < nchunks; c++)
            s += part[c * d + j];
        dg[j] += s;
    }
}

static int rmsnorm_check(const char *fn, int64_t T, int d, const void *a, const void *b,
                         const void *c, const void *e, dt_emsg_t *em)
{
    if (T < 0)
        return dt_emsg_set(em, DT_EINVAL, "%s: T=%lld < 0", fn, (long long)T);
    if (d < 1)
        return dt_emsg_set(em, DT_EINVAL, "%s: d=%d < 1", fn, d);
    if (T > 0 && (a == NULL || b == NULL || c == NULL || e == NULL))
        return dt_emsg_set(em, DT_EINVAL, "%s: NULL tensor with T=%lld", fn, (long long)T);
    return 0;
}

extern "C" int dt_rmsnorm_fwd_cuda(int64_t T, int d, float eps, const float *x, const float *g,
                                   float *y, float *rstd, cudaStream_t st, dt_emsg_t *em)
{
    int rc = rmsnorm_check("dt_rmsnorm_fwd_cuda", T, d, x, g, y, rstd, em);

    if (rc != 0 || T == 0)
        return rc;
    if (!(eps >= 0.0f))
        return dt_emsg_set(em, DT_EINVAL, "dt_rmsnorm_fwd_cuda: eps=%g is not >= 0", (double)eps);
    rmsnorm_fwd_kernel<<<grid_for(T, WARPS), THREADS, 0, st>>>(T, d, eps, x, g, y, rstd);
    DT_CUDA_TRY(em, cudaGetLastError());
    return 0;
}

extern "C" int dt_rmsnorm_bwd_cuda(int64_t T, int d, const float *x, const float *g,
                                   const float *rstd, const float *dy, float *dx, float *dg,
                                   cudaStream_t st, dt_emsg_t *em)
{
    const char *fn = "dt_rmsnorm_bwd_cuda";
    int rc = rmsnorm_check(fn, T, d, x, g, rstd, dy, em);
    float *part = NULL;
    cudaError_t e;

    if (rc != 0)
        return rc;
    if (T > 0 && dx == NULL)
        return dt_emsg_set(em, DT_EINVAL, "%s: dx is NULL", fn);
    if (T == 0)
        return 0;
    rmsnorm_dx_kernel<<<grid_for(T, WARPS), THREADS, 0, st>>>(T, d, x, g, rstd, dy, dx);
    DT_CUDA_TRY(em, cudaGetLastError());
    if (dg == NULL)
        return 0;

    int64_t nchunks = (T + DG_MIN_ROWS - 1) / DG_MIN_ROWS;
    if (nchunks > DG_MAX_CHUNKS)
        nchunks = DG_MAX_CHUNKS;
    const int64_t chunk = (T + nchunks - 1) / nchunks; /* nchunks * chunk >= T */
    const dim3 grid((unsigned int)((d + DG_COLS - 1) / DG_COLS), (unsigned int)nchunks);

    DT_CUDA_TRY(em, cudaMallocAsync((void **)&part, (size_t)nchunks * d * sizeof(float), st));
    rmsnorm_dg_partial_kernel<<<grid, dim3(DG_COLS, DG_ROWS), 0, st>>>(T, d, chunk, x, rstd, dy,
                                                                       part);
    DT_CUDA_GOTO(em, rc, out, cudaGetLastError());
    rmsnorm_dg_final_kernel<<<grid_for(d, THREADS), THREADS, 0, st>>>(d, nchunks, part, dg);
    DT_CUDA_GOTO(em, rc, out, cudaGetLastError());
out:
    e = cudaFreeAsync(part, st);
    if (rc == 0 && e != cudaSuccess)
        rc = dt_cuda_err(em, e, "cudaFreeAsync(part, st)", __FILE__, __LINE__);
    return rc;
}

/*-- RoPE ---------------------------------------------------------------------*/

/* The constants of dt_rope_reduce (kernels/cpu/layers_ref.c), same values:
 * 2 pi = C1 + C2 + C3, C1 with its last set bit at 2^-50. */
#define TWO_PI_C1 0x1.921fb54442d18p+2
#define TWO_PI_C2 0x1.1a62633145c07p-52
#define TWO_PI_C3 -0x1.f1976b7ed8fbcp-108
#define INV_TWO_PI 0x1.45f306dc9c883p-3

enum { ROPE_MAX_HALF = 128 }; /* D <= 256 */

/* theta^(-2i/D) (llama3-scaled as rope asks) = fh[i] + fl[i] for i < D/2,
 * from dt_rope_freq on the host
 * (devices have no long double); passed by value as a kernel parameter. */
struct rope_freqs {
    double fh[ROPE_MAX_HALF];
    double fl[ROPE_MAX_HALF];
};

/* dt_rope_reduce, operation for operation: the explicit _rn intrinsics keep
 * the compiler from contracting the products into other fmas, so the angle
 * is the CPU's to the last bit (fma is correctly rounded on both). */
static __device__ double rope_reduce(int64_t pos, double fh, double fl)
{
    const double p = (double)pos; /* exact below 2^53 */
    const double hi = __dmul_rn(p, fh);
    const double lo = __dadd_rn(fma(p, fh, -hi), __dmul_rn(p, fl));
    const double k = rint(__dmul_rn(hi, INV_TWO_PI)); /* nearest, ties to even */
    double r = fma(-k, TWO_PI_C1, hi);                /* exact */
    r = fma(-k, TWO_PI_C2, r);
    r = fma(-k, TWO_PI_C3, r);
    return __dadd_rn(r, lo);
}

/* Work unit u of the RoPE kernels: row t and pair i (u = t half + i), and
 * the cosine and sine of the pair's angle at pos[t]. */
struct rope_at {
    int64_t t;
    int i;
    float cf, sf;
};

static __device__ __forceinline__ rope_at rope_angle(const int64_t *pos, const rope_freqs &f,
                                                     int64_t u, int half)
{
    rope_at r;
    double s, c;

    r.t = u / half;
    r.i = (int)(u - r.t * half);
    sincos(rope_reduce(pos[r.t], f.fh[r.i], f.fl[r.i]), &s, &c);
    r.cf = (float)c;
    r.sf = (float)s;
    return r;
}

/* x (T, H, D) in place; one thread per (t, i) with i < D/2: it takes sin and
 * cos of pair i's angle once and rotates that pair in every head. sign = 1
 * rotates by a (forward), -1 by -a (backward). Each element is read and
 * written by exactly one thread. */
static __global__ void rope_kernel(int64_t T, int H, int D, const int64_t *pos,
                                   const __grid_constant__ rope_freqs f, float sign, float *x)
{
    const int half = D / 2;
    const int64_t n = T * half;

    for (int64_t u = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; u < n;
         u += (int64_t)gridDim.x * blockDim.x) {
        const rope_at r = rope_angle(pos, f, u, half);
        const float cf = r.cf, sf = sign * r.sf;
        float *p = x + r.t * H * D + 2 * r.i;
        for (int h = 0; h < H; h++, p += D) {
            const float x0 = p[0], x1 = p[1];
            p[0] = x0 * cf - x1 * sf;
            p[1] = x0 * sf + x1 * cf;
        }
    }
}

static int rope_run(const char *fn, int64_t T, int H, int D, const int64_t *pos,
                    const dt_rope_t *rope, float sign, float *x, cudaStream_t st, dt_emsg_t *em)
{
    rope_freqs f;

    if (T < 0)
        return dt_emsg_set(em, DT_EINVAL, "%s: T=%lld < 0", fn, (long long)T);
    if (H < 1)
        return dt_emsg_set(em, DT_EINVAL, "%s: H=%d < 1", fn, H);
    if (D % 2 != 0)
        return dt_emsg_set(em, DT_EINVAL, "%s: D=%d is odd", fn, D);
    if (D < 2 || D > 2 * ROPE_MAX_HALF)
        return dt_emsg_set(em, DT_EINVAL, "%s: D=%d outside [2, %d]", fn, D, 2 * ROPE_MAX_HALF);
    if (rope == NULL || !(rope->theta > 0.0) || isinf(rope->theta))
        return dt_emsg_set(em, DT_EINVAL, "%s: theta=%g is not a positive number", fn,
                           rope ? rope->theta : 0.0);
    if (T > 0 && (pos == NULL || x == NULL))
        return dt_emsg_set(em, DT_EINVAL, "%s: NULL tensor with T=%lld", fn, (long long)T);
    if (T == 0)
        return 0;
    memset(&f, 0, sizeof f);
    for (int i = 0; i < D / 2; i++)
        dt_rope_freq(i, D, rope, &f.fh[i], &f.fl[i]);
    rope_kernel<<<grid_for(T * (D / 2), THREADS), THREADS, 0, st>>>(T, H, D, pos, f, sign, x);
    DT_CUDA_TRY(em, cudaGetLastError());
    return 0;
}

extern "C" int dt_rope_fwd_cuda(int64_t T, int H, int D, const int64_t *pos,
                                const dt_rope_t *rope, float *x, cudaStream_t st, dt_emsg_t *em)
{
    return rope_run("dt_rope_fwd_cuda", T, H, D, pos, rope, 1.0f, x, st, em);
}

extern "C" int dt_rope_bwd_cuda(int64_t T, int H, int D, const int64_t *pos,
                                const dt_rope_t *rope, float *dx, cudaStream_t st, dt_emsg_t *em)
{
    return rope_run("dt_rope_bwd_cuda", T, H, D, pos, rope, -1.0f, dx, st, em);
}

/*-- SwiGLU -------------------------------------------------------------------*/

/* a, b (n) -> h (n) = silu(a) b in T (fp32, or rounded once to bf16/fp16:
 * dt_swiglu_fwd_half_cuda); h may be a or b when fp32 (each thread reads
 * its element before writing it). */
template <typename T>
static __global__ void swiglu_fwd_kernel(int64_t n, const float *a, const float *b, T *h)
{
    for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < n;
         i += (int64_t)gridDim.x * blockDim.x) {
        const float ai = a[i], bi = b[i];
        const float s = 1.0f / (1.0f + expf(-ai));
        h[i] = cvt<T>::from(ai * s * bi);
    }
}

/* a, b, dh (n) -> da = dh b s (1 + a (1 - s)), db = dh a s; da or db may be
 * dh. 1 - s is taken as sigmoid(-a), which neither cancels for large a nor
 * turns into inf * 0 for very negative a. */
static __global__ void swiglu_bwd_kernel(int64_t n, const float *a, const float *b, const float *dh,
                                         float *da, float *db)
{
    for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < n;
         i += (int64_t)gridDim.x * blockDim.x) {
        const float ai = a[i], bi = b[i], gi = dh[i];
        const float s = 1.0f / (1.0f + expf(-ai));
        const float sm = 1.0f / (1.0f + expf(ai));
        da[i] = gi * bi * s * (1.0f + ai * sm);
        db[i] = gi * ai * s;
    }
}

static int swiglu_check(const char *fn, int64_t T, int f, dt_emsg_t *em)
{
    if (T < 0)
        return dt_emsg_set(em, DT_EINVAL, "%s: T=%lld < 0", fn, (long long)T);
    if (f < 1)
        return dt_emsg_set(em, DT_EINVAL, "%s: f=%d < 1", fn, f);
    return 0;
}

/* Both forwards: h of dtype (DT_F32: dt_swiglu_fwd_cuda). */
static int swiglu_fwd_run(const char *fn, int64_t T, int f, const float *a, const float *b,
                          dt_dtype_t dtype, void *h, cudaStream_t st, dt_emsg_t *em)
{
    int rc = swiglu_check(fn, T, f, em);

    if (rc != 0 || T == 0)
        return rc;
    if (a == NULL || b == NULL || h == NULL)
        return dt_emsg_set(em, DT_EINVAL, "%s: NULL tensor with T=%lld", fn, (long long)T);
    const int64_t n = T * f;
    const unsigned grid = grid_for(n, THREADS);
    if (dtype == DT_F32)
        swiglu_fwd_kernel<<<grid, THREADS, 0, st>>>(n, a, b, (float *)h);
    else if (dtype == DT_BF16)
        swiglu_fwd_kernel<<<grid, THREADS, 0, st>>>(n, a, b, (__nv_bfloat16 *)h);
    else if (dtype == DT_F16)
        swiglu_fwd_kernel<<<grid, THREADS, 0, st>>>(n, a, b, (__half *)h);
    else
        return dt_emsg_set(em, DT_EINVAL, "%s: dtype must be bf16 or fp16", fn);
    DT_CUDA_TRY(em, cudaGetLastError());
    return 0;
}

extern "C" int dt_swiglu_fwd_cuda(int64_t T, int f, const float *a, const float *b, float *h,
                                  cudaStream_t st, dt_emsg_t *em)
{
    return swiglu_fwd_run("dt_swiglu_fwd_cuda", T, f, a, b, DT_F32, h, st, em);
}

extern "C" int dt_swiglu_bwd_cuda(int64_t T, int f, const float *a, const float *b, const float *dh,
                                  float *da, float *db, cudaStream_t st, dt_emsg_t *em)
{
    const char *fn = "dt_swiglu_bwd_cuda";
    int rc = swiglu_check(fn, T, f, em);

    if (rc != 0 || T == 0)
        return rc;
    if (a == NULL || b == NULL || dh == NULL || da == NULL || db == NULL)
        return dt_emsg_set(em, DT_EINVAL, "%s: NULL tensor with T=%lld", fn, (long long)T);
    if (da == db)
        return dt_emsg_set(em, DT_EINVAL, "%s: da and db are the same buffer", fn);
    const int64_t n = T * f;
    swiglu_bwd_kernel<<<grid_for(n, THREADS), THREADS, 0, st>>>(n, a, b, dh, da, db);
    DT_CUDA_TRY(em, cudaGetLastError());
    return 0;
}

/*-- fused launches (layers_cuda.h): the bits of the sequences they replace ------*/

/* rmsnorm_fwd_kernel with the residual added first and y rounded to T. */
template <typename T>
static __global__ void rmsnorm_half_kernel(int64_t rows, int d, float eps, float *x,
                                           const float *res, const float *g, T *y, float *rstd)
{
    const int lane = threadIdx.x % 32;

    for (int64_t t = (int64_t)blockIdx.x * WARPS + threadIdx.x / 32; t < rows;
         t += (int64_t)gridDim.x * WARPS) {
        float *xr = x + t * d;
        T *yr = y + t * d;
        float ss = 0.0f;
        if (res != NULL)
            for (int j = lane; j < d; j += 32)
                xr[j] += res[t * d + j]; /* each lane its own columns, before reading them */
        for (int j = lane; j < d; j += 32)
            ss = fmaf(xr[j], xr[j], ss);
        ss = warp_sum(ss);
        const float r = 1.0f / sqrtf(ss / (float)d + eps);
        for (int j = lane; j < d; j += 32)
            yr[j] = cvt<T>::from(xr[j] * r * g[j]);
        if (lane == 0)
            rstd[t] = r;
    }
}

extern "C" int dt_rmsnorm_fwd_half_cuda(int64_t T, int d, float eps, float *x, const float *res,
                                        const float *g, dt_dtype_t dtype, void *y, float *rstd,
                                        cudaStream_t st, dt_emsg_t *em)
{
    const char *fn = "dt_rmsnorm_fwd_half_cuda";
    int rc = rmsnorm_check(fn, T, d, x, g, y, rstd, em);

    if (rc != 0 || T == 0)
        return rc;
    if (!(eps >= 0.0f))
        return dt_emsg_set(em, DT_EINVAL, "%s: eps=%g is not >= 0", fn, (double)eps);
    if (dtype == DT_BF16)
        rmsnorm_half_kernel<<<grid_for(T, WARPS), THREADS, 0, st>>>(T, d, eps, x, res, g,
                                                                    (__nv_bfloat16 *)y, rstd);
    else if (dtype == DT_F16)
        rmsnorm_half_kernel<<<grid_for(T, WARPS), THREADS, 0, st>>>(T, d, eps, x, res, g,
                                                                    (__half *)y, rstd);
    else
        return dt_emsg_set(em, DT_EINVAL, "%s: dtype must be bf16 or fp16", fn);
    DT_CUDA_TRY(em, cudaGetLastError());
    return 0;
}

/* rope_kernel (forward) over the heads of q and of k from one sincos, the
 * results rounded into qb, kb; then v cast, one thread per element. */
template <typename T>
static __global__ void rope_qkv_kernel(int64_t rows, int H, int Hkv, int D, const int64_t *pos,
                                       const __grid_constant__ rope_freqs f, const float *q,
                                       const float *k, const float *v, T *qb, T *kb, T *vb)
{
    const int half = D / 2;
    const int64_t n = rows * half, nv = rows * Hkv * D;

    for (int64_t u = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; u < n;
         u += (int64_t)gridDim.x * blockDim.x) {
        const rope_at r = rope_angle(pos, f, u, half);
        const float cf = r.cf, sf = r.sf;
        const int64_t t = r.t;
        const int i = r.i;
        for (int x = 0; x < 2; x++) {
            const int nh = x ? Hkv : H;
            const float *p = (x ? k : q) + t * nh * D + 2 * i;
            T *o = (x ? kb : qb) + t * nh * D + 2 * i;
            for (int h = 0; h < nh; h++, p += D, o += D) {
                const float x0 = p[0], x1 = p[1];
                o[0] = cvt<T>::from(x0 * cf - x1 * sf);
                o[1] = cvt<T>::from(x0 * sf + x1 * cf);
            }
        }
    }
    for (int64_t e = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; e < nv;
         e += (int64_t)gridDim.x * blockDim.x)
        vb[e] = cvt<T>::from(v[e]);
}

extern "C" int dt_rope_qkv_half_cuda(int64_t T, int H, int Hkv, int D, const int64_t *pos,
                                     const dt_rope_t *rope, const float *q, const float *k,
                                     const float *v, dt_dtype_t dtype, void *qb, void *kb,
                                     void *vb, cudaStream_t st, dt_emsg_t *em)
{
    const char *fn = "dt_rope_qkv_half_cuda";
    rope_freqs f;

    if (T < 0 || H < 1 || Hkv < 1 || D % 2 != 0 || D < 2 || D > 2 * ROPE_MAX_HALF)
        return dt_emsg_set(em, DT_EINVAL, "%s: T=%lld H=%d Hkv=%d D=%d", fn, (long long)T, H,
                           Hkv, D);
    if (rope == NULL || !(rope->theta > 0.0) || isinf(rope->theta))
        return dt_emsg_set(em, DT_EINVAL, "%s: theta=%g is not a positive number", fn,
                           rope ? rope->theta : 0.0);
    if (dtype != DT_BF16 && dtype != DT_F16)
        return dt_emsg_set(em, DT_EINVAL, "%s: dtype must be bf16 or fp16", fn);
    if (T == 0)
        return 0;
    if (!pos || !q || !k || !v || !qb || !kb || !vb)
        return dt_emsg_set(em, DT_EINVAL, "%s: NULL tensor with T=%lld", fn, (long long)T);
    memset(&f, 0, sizeof f);
    for (int i = 0; i < D / 2; i++)
        dt_rope_freq(i, D, rope, &f.fh[i], &f.fl[i]);
    const int64_t units = T * (D / 2) > T * Hkv * D ? T * (D / 2) : T * Hkv * D;
    if (dtype == DT_BF16)
        rope_qkv_kernel<<<grid_for(units, THREADS), THREADS, 0, st>>>(
            T, H, Hkv, D, pos, f, q, k, v, (__nv_bfloat16 *)qb, (__nv_bfloat16 *)kb,
            (__nv_bfloat16 *)vb);
    else
        rope_qkv_kernel<<<grid_for(units, THREADS), THREADS, 0, st>>>(
            T, H, Hkv, D, pos, f, q, k, v, (__half *)qb, (__half *)kb, (__half *)vb);
    DT_CUDA_TRY(em, cudaGetLastError());
    return 0;
}

extern "C" int dt_swiglu_fwd_half_cuda(int64_t T, int f, const float *a, const float *b,
                                       dt_dtype_t dtype, void *h, cudaStream_t st, dt_emsg_t *em)
{
    if (dtype == DT_F32)
        return dt_emsg_set(em, DT_EINVAL, "dt_swiglu_fwd_half_cuda: dtype must be bf16 or fp16");
    return swiglu_fwd_run("dt_swiglu_fwd_half_cuda", T, f, a, b, dtype, h, st, em);
}

/*-- the residual stream ----------------------------------------------------------*/

/* y (n) += x (n), fp32. */
static __global__ void add_f32_kernel(int64_t n, const float *x, float *y)
{
    for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < n;
         i += (int64_t)gridDim.x * blockDim.x)
        y[i] += x[i];
}

extern "C" int dt_add_f32_cuda(int64_t n, const float *x, float *y, cudaStream_t st,
                               dt_emsg_t *em)
{
    if (n < 0)
        return dt_emsg_set(em, DT_EINVAL, "dt_add_f32_cuda: n=%lld < 0", (long long)n);
    if (n == 0)
        return 0;
    if (x == NULL || y == NULL)
        return dt_emsg_set(em, DT_EINVAL, "dt_add_f32_cuda: NULL tensor with n=%lld",
                           (long long)n);
    add_f32_kernel<<<grid_for(n, THREADS), THREADS, 0, st>>>(n, x, y);
    DT_CUDA_TRY(em, cudaGetLastError());
    return 0;
}

/*-- linear layers on cuBLASLt ----------------------------------------------------
 * cuBLASLt is column-major. A row-major matrix M (r, c) with row stride c is
 * the column-major matrix M^T (c x r) with leading dimension c, so every
 * row-major product below is written as its transpose:
 *
 *   forward   y (T, dout) = x W^T          <=>  y^T = W x^T
 *     D = y^T (dout x T, ld dout); A = w stored col-major (din x dout, ld din)
 *     = W^T, op T gives W; B = x stored col-major (din x T, ld din) = x^T, op N.
 *     m = dout, n = T, k = din.
 *   dx (T, din) = dy W                      <=>  dx^T = W^T dy^T
 *     D = dx^T (din x T, ld din); A = w as (din x dout, ld din) = W^T, op N;
 *     B = dy stored col-major (dout x T, ld dout) = dy^T, op N.
 *     m = din, n = T, k = dout.
 *   dw (dout, din) += dy^T x                <=>  dw^T += x^T dy
 *     D = dw^T (din x dout, ld din); A = x as (din x T, ld din) = x^T, op N;
 *     B = dy as (dout x T, ld dout) = dy^T, op T gives dy. beta = 1.
 *     m = din, n = dout, k = T.
 */

/* cuBLASLt is loaded when the first handle is made (dlopen), not linked:
 * every dtengine would otherwise map it at start (about 150 MB of resident
 * memory and 0.1 s), also the CPU ranks and the attention, which never
 * use it. The calls below go through these pointers (the macros keep their
 * names). */
static struct {
    decltype(&cublasLtCreate) Create;
    decltype(&cublasLtDestroy) Destroy;
    decltype(&cublasLtGetStatusName) GetStatusName;
    decltype(&cublasLtGetStatusString) GetStatusString;
    decltype(&cublasLtMatmul) Matmul;
    decltype(&cublasLtMatmulAlgoGetHeuristic) MatmulAlgoGetHeuristic;
    decltype(&cublasLtMatmulDescCreate) MatmulDescCreate;
    decltype(&cublasLtMatmulDescDestroy) MatmulDescDestroy;
    decltype(&cublasLtMatmulDescSetAttribute) MatmulDescSetAttribute;
    decltype(&cublasLtMatmulPreferenceCreate) MatmulPreferenceCreate;
    decltype(&cublasLtMatmulPreferenceDestroy) MatmulPreferenceDestroy;
    decltype(&cublasLtMatmulPreferenceSetAttribute) MatmulPreferenceSetAttribute;
    decltype(&cublasLtMatrixLayoutCreate) MatrixLayoutCreate;
    decltype(&cublasLtMatrixLayoutDestroy) MatrixLayoutDestroy;
} lt;
static pthread_mutex_t lt_mu = PTHREAD_MUTEX_INITIALIZER;
static int lt_loaded;

#define cublasLtCreate (*lt.Create)
#define cublasLtDestroy (*lt.Destroy)
#define cublasLtGetStatusName (*lt.GetStatusName)
#define cublasLtGetStatusString (*lt.GetStatusString)
#define cublasLtMatmul (*lt.Matmul)
#define cublasLtMatmulAlgoGetHeuristic (*lt.MatmulAlgoGetHeuristic)
#define cublasLtMatmulDescCreate (*lt.MatmulDescCreate)
#define cublasLtMatmulDescDestroy (*lt.MatmulDescDestroy)
#define cublasLtMatmulDescSetAttribute (*lt.MatmulDescSetAttribute)
#define cublasLtMatmulPreferenceCreate (*lt.MatmulPreferenceCreate)
#define cublasLtMatmulPreferenceDestroy (*lt.MatmulPreferenceDestroy)
#define cublasLtMatmulPreferenceSetAttribute (*lt.MatmulPreferenceSetAttribute)
#define cublasLtMatrixLayoutCreate (*lt.MatrixLayoutCreate)
#define cublasLtMatrixLayoutDestroy (*lt.MatrixLayoutDestroy)

/* Open libcublasLt (its soname of this CUDA major, else the unversioned
 * name) and fill every entry point. DT_ENOTSUP naming what is missing. */
static int lt_open(dt_emsg_t *em)
{
#define LT_STR2(x) #x
#define LT_STR(x) LT_STR2(x)
    static const char *const names[] = { "libcublasLt.so." LT_STR(CUBLAS_VER_MAJOR),
                                         "libcublasLt.so" };
    void *h = NULL;

    for (size_t i = 0; i < sizeof(names) / sizeof(names[0]) && h == NULL; i++)
        h = dlopen(names[i], RTLD_NOW | RTLD_LOCAL);
    if (h == NULL)
        return dt_emsg_set(em, DT_ENOTSUP, "cuBLASLt, which the linear layers need, cannot be "
                           "loaded: %s (install libcublas for CUDA %d)", dlerror(),
                           (int)CUBLAS_VER_MAJOR);
    const struct {
        void **slot;
        const char *sym;
    } syms[] = {
        { (void **)&lt.Create, "cublasLtCreate" },
        { (void **)&lt.Destroy, "cublasLtDestroy" },
        { (void **)&lt.GetStatusName, "cublasLtGetStatusName" },
        { (void **)&lt.GetStatusString, "cublasLtGetStatusString" },
        { (void **)&lt.Matmul, "cublasLtMatmul" },
        { (void **)&lt.MatmulAlgoGetHeuristic, "cublasLtMatmulAlgoGetHeuristic" },
        { (void **)&lt.MatmulDescCreate, "cublasLtMatmulDescCreate" },
        { (void **)&lt.MatmulDescDestroy, "cublasLtMatmulDescDestroy" },
        { (void **)&lt.MatmulDescSetAttribute, "cublasLtMatmulDescSetAttribute" },
        { (void **)&lt.MatmulPreferenceCreate, "cublasLtMatmulPreferenceCreate" },
        { (void **)&lt.MatmulPreferenceDestroy, "cublasLtMatmulPreferenceDestroy" },
        { (void **)&lt.MatmulPreferenceSetAttribute, "cublasLtMatmulPreferenceSetAttribute" },
        { (void **)&lt.MatrixLayoutCreate, "cublasLtMatrixLayoutCreate" },
        { (void **)&lt.MatrixLayoutDestroy, "cublasLtMatrixLayoutDestroy" },
    };
    for (size_t i = 0; i < sizeof(syms) / sizeof(syms[0]); i++)
        if ((*syms[i].slot = dlsym(h, syms[i].sym)) == NULL)
            return dt_emsg_set(em, DT_ENOTSUP, "cuBLASLt has no %s: %s", syms[i].sym,
                               dlerror());
    return 0;
}

/* lt_open, once per process. */
static int lt_load(dt_emsg_t *em)
{
    int rc = 0;

    pthread_mutex_lock(&lt_mu);
    if (!lt_loaded && (rc = lt_open(em)) == 0)
        lt_loaded = 1;
    pthread_mutex_unlock(&lt_mu);
    return rc;
}

struct dt_blas {
    cublasLtHandle_t lt;
    void *ws; /* device workspace of ws_size bytes */
    size_t ws_size;
};

#define DT_BLAS_WORKSPACE ((size_t)32 << 20)

static int lt_err(dt_emsg_t *em, cublasStatus_t s, const char *call, const char *file, int line)
{
    const char *base = strrchr(file, '/');

    return dt_emsg_set(em, DT_EDEVICE, "%s:%d: %s: %s: %s", base ? base + 1 : file, line, call,
                       cublasLtGetStatusName(s), cublasLtGetStatusString(s));
}

/* Set rc and jump to label when a cuBLASLt call fails. */
#define LT_GOTO(em, rc, label, call)                               \
    do {                                                           \
        cublasStatus_t lt_s_ = (call);                             \
        if (lt_s_ != CUBLAS_STATUS_SUCCESS) {                      \
            (rc) = lt_err((em), lt_s_, #call, __FILE__, __LINE__); \
            goto label;                                            \
        }                                                          \
    } while (0)

extern "C" int dt_blas_new(dt_blas_t **out, dt_emsg_t *em)
{
    dt_blas_t *b;
    int rc;

    *out = NULL;
    if ((rc = lt_load(em)) < 0)
        return rc;
    b = (dt_blas_t *)dt_xcalloc(1, sizeof(*b));
    LT_GOTO(em, rc, fail, cublasLtCreate(&b->lt));
    b->ws_size = DT_BLAS_WORKSPACE;
    DT_CUDA_GOTO(em, rc, fail, cudaMalloc(&b->ws, b->ws_size));
    *out = b;
    return 0;
fail:
    dt_blas_free(b);
    return rc;
}

extern "C" void dt_blas_free(dt_blas_t *b)
{
    if (b == NULL)
        return;
    if (b->ws != NULL)
        (void)cudaFree(b->ws);
    if (b->lt != NULL)
        (void)cublasLtDestroy(b->lt);
    free(b);
}

/* One column-major product D (m x n, ld ldd) = op(A) op(B) + beta D, fp32
 * compute and scale. A is stored (m x k) for op N, (k x m) for op T; B is
 * stored (k x n) for op N, (n x k) for op T. */
struct lt_gemm {
    int32_t ta, tb; /* cublasOperation_t, as cuBLASLt's attributes want it */
    uint64_t m, n, k;
    cudaDataType_t ab_type;
    const void *a;
    int64_t lda;
    const void *b;
    int64_t ldb;
    cudaDataType_t d_type;
    void *d;
    int64_t ldd;
    float beta;
};

/* The largest power of two <= 256 that divides the address. */
static uint32_t ptr_align(const void *p)
{
    uint32_t a = 256;

    while (a > 1 && (uintptr_t)p % a != 0)
        a /= 2;
    return a;
}

static int lt_matmul(dt_blas_t *bl, const lt_gemm *g, const char *fn, cudaStream_t st,
                     dt_emsg_t *em)
{
    cublasLtMatmulDesc_t op = NULL;
    cublasLtMatrixLayout_t la = NULL, lb = NULL, ld = NULL;
    cublasLtMatmulPreference_t pref = NULL;
    cublasLtMatmulHeuristicResult_t heur;
    const uint64_t ws = bl->ws_size;
    const uint32_t al_a = ptr_align(g->a), al_b = ptr_align(g->b), al_d = ptr_align(g->d);
    const float alpha = 1.0f;
    int found = 0, rc = 0;

    memset(&heur, 0, sizeof heur);
    LT_GOTO(em, rc, out, cublasLtMatmulDescCreate(&op, CUBLAS_COMPUTE_32F, CUDA_R_32F));
    LT_GOTO(em, rc, out,
            cublasLtMatmulDescSetAttribute(op, CUBLASLT_MATMUL_DESC_TRANSA, &g->ta, sizeof g->ta));
    LT_GOTO(em, rc, out,
            cublasLtMatmulDescSetAttribute(op, CUBLASLT_MATMUL_DESC_TRANSB, &g->tb, sizeof g->tb));
    if (g->ta == CUBLAS_OP_N)
        LT_GOTO(em, rc, out, cublasLtMatrixLayoutCreate(&la, g->ab_type, g->m, g->k, g->lda));
    else
        LT_GOTO(em, rc, out, cublasLtMatrixLayoutCreate(&la, g->ab_type, g->k, g->m, g->lda));
    if (g->tb == CUBLAS_OP_N)
        LT_GOTO(em, rc, out, cublasLtMatrixLayoutCreate(&lb, g->ab_type, g->k, g->n, g->ldb));
    else
        LT_GOTO(em, rc, out, cublasLtMatrixLayoutCreate(&lb, g->ab_type, g->n, g->k, g->ldb));
    LT_GOTO(em, rc, out, cublasLtMatrixLayoutCreate(&ld, g->d_type, g->m, g->n, g->ldd));

    LT_GOTO(em, rc, out, cublasLtMatmulPreferenceCreate(&pref));
    LT_GOTO(em, rc, out,
            cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES,
                                                 &ws, sizeof ws));
    LT_GOTO(em, rc, out,
            cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES,
                                                 &al_a, sizeof al_a));
    LT_GOTO(em, rc, out,
            cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES,
                                                 &al_b, sizeof al_b));
    LT_GOTO(em, rc, out,
            cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES,
                                                 &al_d, sizeof al_d));
    LT_GOTO(em, rc, out,
            cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES,
                                                 &al_d, sizeof al_d));
    LT_GOTO(em, rc, out,
            cublasLtMatmulAlgoGetHeuristic(bl->lt, op, la, lb, ld, ld, pref, 1, &heur, &found));
    if (found < 1) {
        rc = dt_emsg_set(em, DT_EDEVICE,
                         "%s: cublasLtMatmulAlgoGetHeuristic: no algorithm for m=%llu n=%llu "
                         "k=%llu",
                         fn, (unsigned long long)g->m, (unsigned long long)g->n,
                         (unsigned long long)g->k);
        goto out;
    }
    /* C is D: beta = 0 never reads it, beta = 1 accumulates in place. */
    LT_GOTO(em, rc, out,
            cublasLtMatmul(bl->lt, op, &alpha, g->a, la, g->b, lb, &g->beta, g->d, ld, g->d, ld,
                           &heur.algo, bl->ws, bl->ws_size, st));
out:
    if (pref != NULL)
        (void)cublasLtMatmulPreferenceDestroy(pref);
    if (ld != NULL)
        (void)cublasLtMatrixLayoutDestroy(ld);
    if (lb != NULL)
        (void)cublasLtMatrixLayoutDestroy(lb);
    if (la != NULL)
        (void)cublasLtMatrixLayoutDestroy(la);
    if (op != NULL)
        (void)cublasLtMatmulDescDestroy(op);
    return rc;
}

static cudaDataType_t lt_type(dt_dtype_t t)
{
    return t == DT_BF16 ? CUDA_R_16BF : t == DT_F16 ? CUDA_R_16F : CUDA_R_32F;
}

static int linear_check(const char *fn, dt_blas_t *b, dt_dtype_t dtype, int64_t T, int din,
                        int dout, dt_emsg_t *em)
{
    if (b == NULL)
        return dt_emsg_set(em, DT_EINVAL, "%s: no cuBLASLt handle", fn);
    if (dtype != DT_BF16 && dtype != DT_F16)
        return dt_emsg_set(em, DT_EINVAL, "%s: dtype=%d is not bf16 or fp16", fn, (int)dtype);
    if (T < 0)
        return dt_emsg_set(em, DT_EINVAL, "%s: T=%lld < 0", fn, (long long)T);
    if (din < 1)
        return dt_emsg_set(em, DT_EINVAL, "%s: din=%d < 1", fn, din);
    if (dout < 1)
        return dt_emsg_set(em, DT_EINVAL, "%s: dout=%d < 1", fn, dout);
    return 0;
}

extern "C" int dt_linear_fwd_cuda(dt_blas_t *b, dt_dtype_t dtype, int64_t T, int din, int dout,
                                  const void *x, const void *w, dt_dtype_t ydtype, void *y,
                                  cudaStream_t st, dt_emsg_t *em)
{
    const char *fn = "dt_linear_fwd_cuda";
    int rc = linear_check(fn, b, dtype, T, din, dout, em);
    lt_gemm g;

    if (rc != 0)
        return rc;
    if (ydtype != DT_F32 && ydtype != dtype)
        return dt_emsg_set(em, DT_EINVAL, "%s: ydtype=%s is neither fp32 nor dtype=%s", fn,
                           dt_dtype_name(ydtype), dt_dtype_name(dtype));
    if (T == 0)
        return 0;
    if (x == NULL || w == NULL || y == NULL)
        return dt_emsg_set(em, DT_EINVAL, "%s: NULL tensor with T=%lld", fn, (long long)T);
    memset(&g, 0, sizeof g);
    g.ta = CUBLAS_OP_T; /* w (dout, din) row-major = W^T (din x dout) col-major */
    g.tb = CUBLAS_OP_N; /* x (T, din) row-major = x^T (din x T) col-major */
    g.m = (uint64_t)dout;
    g.n = (uint64_t)T;
    g.k = (uint64_t)din;
    g.ab_type = lt_type(dtype);
    g.a = w;
    g.lda = din;
    g.b = x;
    g.ldb = din;
    g.d_type = lt_type(ydtype);
    g.d = y; /* y (T, dout) row-major = y^T (dout x T) col-major */
    g.ldd = dout;
    g.beta = 0.0f;
    return lt_matmul(b, &g, fn, st, em);
}

extern "C" int dt_linear_bwd_cuda(dt_blas_t *b, dt_dtype_t dtype, int64_t T, int din, int dout,
                                  const void *x, const void *w, const void *dy, float *dx,
                                  float *dw, cudaStream_t st, dt_emsg_t *em)
{
    const char *fn = "dt_linear_bwd_cuda";
    int rc = linear_check(fn, b, dtype, T, din, dout, em);
    lt_gemm g;

    if (rc != 0 || T == 0 || (dx == NULL && dw == NULL))
        return rc;
    if (dy == NULL || (dx != NULL && w == NULL) || (dw != NULL && x == NULL))
        return dt_emsg_set(em, DT_EINVAL, "%s: NULL input with T=%lld", fn, (long long)T);
    if (dx != NULL) {
        memset(&g, 0, sizeof g);
        g.ta = CUBLAS_OP_N; /* w (dout, din) row-major = W^T (din x dout) col-major */
        g.tb = CUBLAS_OP_N; /* dy (T, dout) row-major = dy^T (dout x T) col-major */
        g.m = (uint64_t)din;
        g.n = (uint64_t)T;
        g.k = (uint64_t)dout;
        g.ab_type = lt_type(dtype);
        g.a = w;
        g.lda = din;
        g.b = dy;
        g.ldb = dout;
        g.d_type = CUDA_R_32F;
        g.d = dx; /* dx (T, din) row-major = dx^T (din x T) col-major */
        g.ldd = din;
        g.beta = 0.0f;
        rc = lt_matmul(b, &g, fn, st, em);
        if (rc != 0)
            return rc;
    }
    if (dw != NULL) {
        memset(&g, 0, sizeof g);
        g.ta = CUBLAS_OP_N; /* x (T, din) row-major = x^T (din x T) col-major */
        g.tb = CUBLAS_OP_T; /* dy^T (dout x T) col-major, transposed: dy (T x dout) */
        g.m = (uint64_t)din;
        g.n = (uint64_t)dout;
        g.k = (uint64_t)T;
        g.ab_type = lt_type(dtype);
        g.a = x;
        g.lda = din;
        g.b = dy;
        g.ldb = dout;
        g.d_type = CUDA_R_32F;
        g.d = dw; /* dw (dout, din) row-major = dw^T (din x dout) col-major */
        g.ldd = din;
        g.beta = 1.0f; /* ADDED */
        rc = lt_matmul(b, &g, fn, st, em);
    }
    return rc;
}
