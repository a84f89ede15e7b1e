/* SPDX-License-Identifier: MIT
 *
 * The small attention kernels around the fused forward and backward
 * (attn_cuda.h): delta = rowsum(dout * o) for the backward, the LSE merge of
 * two partial results, and the gathers, merges and scatters that move the
 * rows of one dilated head chunk between the full (T, H, d) tensors and a
 * dense block. All are memory-bound and plain: one warp per (row, head)
 * where a row is reduced or shares its weights, one thread per element (or
 * per aligned 2..16-byte unit) otherwise; int64 indexing; no atomics, so
 * every result is reproducible bit for bit.
 *
 * Not here: dt_attn_fwd_cuda (attn_fwd.cu), dt_attn_bwd_cuda (attn_bwd.cu),
 * dt_dtype_size / dt_dtype_name and the CUDA error edge (util.c).
 */
#include "config.h"

#include <math.h>
#include <stdint.h>
#include <string.h>

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include "common/err.h"
#include "kernels/cuda/attn_cuda.h"
#include "kernels/cuda/cuda_err.h"
#include "kernels/cuda/grid.cuh"

/*-- element loads -----------------------------------------------------------*/

static __device__ __forceinline__ float load_f32(const float *p)
{
    return *p;
}

static __device__ __forceinline__ float load_f32(const __nv_bfloat16 *p)
{
    return __bfloat162float(*p);
}

static __device__ __forceinline__ float load_f32(const __half *p)
{
    return __half2float(*p);
}

/*-- delta --------------------------------------------------------------------*/

/* delta[hh * lddelta + i] = sum_e dout[i, hh, e] o[i, hh, e]: one warp per
 * (i, hh), pairs numbered r = i * h + hh so neighbouring warps read
 * neighbouring heads of one row. */
template <typename T>
static __global__ void delta_kernel(int64_t n, int h, int d, const T *dout, int64_t lddo,
                                    const float *o, int64_t ldo, float *delta, int64_t lddelta)
{
    const int lane = threadIdx.x % 32;
    const int64_t rows = n * h;

    for (int64_t r = (int64_t)blockIdx.x * WARPS + threadIdx.x / 32; r < rows;
         r += (int64_t)gridDim.x * WARPS) {
        const int64_t i = r / h;
        const int hh = (int)(r - i * h);
        const T *dr = dout + i * lddo + (int64_t)hh * d;
        const float *orow = o + i * ldo + (int64_t)hh * d;
        float s = 0.0f;
        for (int e = lane; e < d; e += 32)
            s = fmaf(load_f32(dr + e), orow[e], s);
        s = warp_sum(s);
        if (lane == 0)
            delta[(int64_t)hh * lddelta + i] = s;
    }
}

extern "C" int dt_attn_delta_cuda(int64_t n, int h, int d, dt_dtype_t dtype, const void *dout,
                                  int64_t lddo, const float *o, int64_t ldo, float *delta,
                                  int64_t lddelta, cudaStream_t st, dt_emsg_t *em)
{
    const char *fn = "dt_attn_delta_cuda";

    if (dtype != DT_BF16 && dtype != DT_F16 && dtype != DT_F32)
        return dt_emsg_set(em, DT_EINVAL, "%s: dtype=%d is not bf16, fp16 or fp32", fn, (int)dtype);
    if (n < 0)
        return dt_emsg_set(em, DT_EINVAL, "%s: n=%lld < 0", fn, (long long)n);
    if (h < 1 || d < 1)
        return dt_emsg_set(em, DT_EINVAL, "%s: h=%d, d=%d must be >= 1", fn, h, d);
    if (lddo < (int64_t)h * d || ldo < (int64_t)h * d)
        return dt_emsg_set(em, DT_EINVAL, "%s: lddo=%lld, ldo=%lld below h * d = %lld", fn,
                           (long long)lddo, (long long)ldo, (long long)h * d);
    if (lddelta < n)
        return dt_emsg_set(em, DT_EINVAL, "%s: lddelta=%lld < n=%lld", fn, (long long)lddelta,
                           (long long)n);
    if (n == 0)
        return 0;
    if (dout == NULL || o == NULL || delta == NULL)
        return dt_emsg_set(em, DT_EINVAL, "%s: NULL tensor with n=%lld", fn, (long long)n);

    const unsigned int grid = grid_for(n * h, WARPS);
    if (dtype == DT_BF16)
        delta_kernel<<<grid, THREADS, 0, st>>>(n, h, d, (const __nv_bfloat16 *)dout, lddo, o, ldo,
                                               delta, lddelta);
    else if (dtype == DT_F16)
        delta_kernel<<<grid, THREADS, 0, st>>>(n, h, d, (const __half *)dout, lddo, o, ldo, delta,
                                               lddelta);
    else
        delta_kernel<<<grid, THREADS, 0, st>>>(n, h, d, (const float *)dout, lddo, o, ldo, delta,
                                               lddelta);
    DT_CUDA_TRY(em, cudaGetLastError());
    return 0;
}

/*-- LSE merge ----------------------------------------------------------------*/

/* n rows of nh heads of d: the target row (m, hh) is o1 + m * o1_row + hh * d
 * with its lse at l1[m * l1_row + hh * l1_head], and likewise the partial.
 * dt_attn_merge_cuda and dt_dilate_merge_cuda differ only in these strides. */
template <typename T>
struct merge_args {
    int64_t n;
    int nh;
    int d;
    float *o1;
    int64_t o1_row;
    float *l1;
    int64_t l1_row;
    int64_t l1_head;
    const T *o2;
    int64_t o2_row;
    const float *l2;
    int64_t l2_row;
    int64_t l2_head;
    int first; /* the target is empty and not read (dt_attn_set_half_cuda) */
};

/* dt_attn_merge_cpu for each (m, hh), one warp each: an empty partial (lse2
 * = -inf) leaves the row alone, an empty target (lse1 = -inf) takes the
 * partial as it is, otherwise the rows are blended with weights relative to
 * the larger lse. Every lane reads both lse (the branches are uniform over
 * the warp); lane 0 writes lse1 after a __syncwarp, so no lane can still be
 * about to read it. */
template <typename T>
static __global__ void merge_kernel(const merge_args<T> a)
{
    const int lane = threadIdx.x % 32;
    const int64_t rows = a.n * a.nh;

    for (int64_t r = (int64_t)blockIdx.x * WARPS + threadIdx.x / 32; r < rows;
         r += (int64_t)gridDim.x * WARPS) {
        const int64_t m = r / a.nh;
        const int hh = (int)(r - m * a.nh);
        float *lp = a.l1 + m * a.l1_row + hh * a.l1_head;
        const float la = a.first ? -INFINITY : *lp;
        const float lb = a.l2[m * a.l2_row + hh * a.l2_head];
        float *x = a.o1 + m * a.o1_row + (int64_t)hh * a.d;
        const T *y = a.o2 + m * a.o2_row + (int64_t)hh * a.d;
        float lnew;

        if (isinf(lb) && lb < 0.0f) {
            if (!a.first)
                continue; /* nothing to add */
            for (int e = lane; e < a.d; e += 32) /* the empty row, written */
                x[e] = 0.0f;
            lnew = -INFINITY;
        } else if (isinf(la) && la < 0.0f) {
            for (int e = lane; e < a.d; e += 32)
                x[e] = load_f32(y + e);
            lnew = lb;
        } else {
            const float mx = la > lb ? la : lb;
            float wa = expf(la - mx), wb = expf(lb - mx);
            const float sum = wa + wb;
            wa /= sum;
            wb /= sum;
            for (int e = lane; e < a.d; e += 32)
                x[e] = wa * x[e] + wb * load_f32(y + e);
            lnew = mx + logf(sum);
        }
        __syncwarp();
        if (lane == 0)
            *lp = lnew;
    }
}

template <typename T>
static int merge_launch(const merge_args<T> *a, cudaStream_t st, dt_emsg_t *em)
{
    merge_kernel<T><<<grid_for(a->n * a->nh, WARPS), THREADS, 0, st>>>(*a);
    DT_CUDA_TRY(em, cudaGetLastError());
    return 0;
}

/* The merge of a partial o2 of T (fp32, bf16, fp16) into the fp32 state. */
template <typename T>
static int merge_partial(int64_t n, int h, int d, float *o1, int64_t ld1, float *lse1, int64_t ldl1,
                      const void *o2, int64_t ld2, const float *lse2, int64_t ldl2,
                      cudaStream_t st, dt_emsg_t *em, int first = 0)
{
    merge_args<T> a;

    memset(&a, 0, sizeof a);
    a.first = first;
    a.n = n;
    a.nh = h;
    a.d = d;
    a.o1 = o1;
    a.o1_row = ld1;
    a.l1 = lse1;
    a.l1_row = 1;
    a.l1_head = ldl1;
    a.o2 = (const T *)o2;
    a.o2_row = ld2;
    a.l2 = lse2;
    a.l2_row = 1;
    a.l2_head = ldl2;
    return merge_launch(&a, st, em);
}

extern "C" int dt_attn_merge_cuda(int64_t n, int h, int d, float *o1, int64_t ld1, float *lse1,
                                  int64_t ldl1, const float *o2, int64_t ld2, const float *lse2,
                                  int64_t ldl2, cudaStream_t st, dt_emsg_t *em)
{
    const char *fn = "dt_attn_merge_cuda";

    if (n < 0)
        return dt_emsg_set(em, DT_EINVAL, "%s: n=%lld < 0", fn, (long long)n);
    if (h < 1 || d < 1)
        return dt_emsg_set(em, DT_EINVAL, "%s: h=%d, d=%d must be >= 1", fn, h, d);
    if (ld1 < (int64_t)h * d || ld2 < (int64_t)h * d)
        return dt_emsg_set(em, DT_EINVAL, "%s: ld1=%lld, ld2=%lld below h * d = %lld", fn,
                           (long long)ld1, (long long)ld2, (long long)h * d);
    if (ldl1 < n || ldl2 < n)
        return dt_emsg_set(em, DT_EINVAL, "%s: ldl1=%lld, ldl2=%lld below n=%lld", fn,
                           (long long)ldl1, (long long)ldl2, (long long)n);
    if (n == 0)
        return 0;
    if (o1 == NULL || lse1 == NULL || o2 == NULL || lse2 == NULL)
        return dt_emsg_set(em, DT_EINVAL, "%s: NULL tensor with n=%lld", fn, (long long)n);
    return merge_partial<float>(n, h, d, o1, ld1, lse1, ldl1, o2, ld2, lse2, ldl2, st, em);
}

/*-- a block kernel's partial in dtype (kernels/cuda/attn_cudnn.h) -------------*/

/* dt_attn_merge_half_cuda and dt_attn_set_half_cuda (first). */
static int half_partial(const char *fn, int first, int64_t n, int h, int d, dt_dtype_t dtype,
                        float *o1, int64_t ld1, float *lse1, int64_t ldl1, const void *o2,
                        int64_t ld2, const float *lse2, int64_t ldl2, cudaStream_t st,
                        dt_emsg_t *em)
{
    if (n < 0 || h < 1 || d < 1 || ld1 < (int64_t)h * d || ld2 < (int64_t)h * d || ldl1 < n ||
        ldl2 < n)
        return dt_emsg_set(em, DT_EINVAL, "%s: bad shape n=%lld h=%d d=%d", fn, (long long)n,
                           h, d);
    if (dtype != DT_BF16 && dtype != DT_F16)
        return dt_emsg_set(em, DT_EINVAL, "%s: o2 must be bf16 or f16", fn);
    if (n == 0)
        return 0;
    if (dtype == DT_BF16)
        return merge_partial<__nv_bfloat16>(n, h, d, o1, ld1, lse1, ldl1, o2, ld2, lse2, ldl2, st,
                                         em, first);
    return merge_partial<__half>(n, h, d, o1, ld1, lse1, ldl1, o2, ld2, lse2, ldl2, st, em,
                                 first);
}

extern "C" int dt_attn_merge_half_cuda(int64_t n, int h, int d, dt_dtype_t dtype, float *o1,
                                       int64_t ld1, float *lse1, int64_t ldl1, const void *o2,
                                       int64_t ld2, const float *lse2, int64_t ldl2,
                                       cudaStream_t st, dt_emsg_t *em)
{
    return half_partial("dt_attn_merge_half_cuda", 0, n, h, d, dtype, o1, ld1, lse1, ldl1, o2,
                        ld2, lse2, ldl2, st, em);
}

extern "C" int dt_attn_set_half_cuda(int64_t n, int h, int d, dt_dtype_t dtype, float *o1,
                                     int64_t ld1, float *lse1, int64_t ldl1, const void *o2,
                                     int64_t ld2, const float *lse2, int64_t ldl2,
                                     cudaStream_t st, dt_emsg_t *em)
{
    return half_partial("dt_attn_set_half_cuda", 1, n, h, d, dtype, o1, ld1, lse1, ldl1, o2,
                        ld2, lse2, ldl2, st, em);
}

/* o rows = 0, lse = -inf: one thread per element of o, the first d of each
 * (row, head) also writes its lse. */
static __global__ void empty_kernel(int64_t n, int h, int d, float *o, int64_t ldo, float *lse,
                                    int64_t ldl)
{
    const int64_t width = (int64_t)h * d, total = n * width;

    for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < total;
         i += (int64_t)gridDim.x * blockDim.x) {
        const int64_t m = i / width, c = i - m * width;
        o[m * ldo + c] = 0.0f;
        if (c % d == 0)
            lse[(c / d) * ldl + m] = -INFINITY;
    }
}

extern "C" int dt_attn_empty_cuda(int64_t n, int h, int d, float *o, int64_t ldo, float *lse,
                                  int64_t ldlse, cudaStream_t st, dt_emsg_t *em)
{
    if (n < 0 || h < 1 || d < 1 || ldo < (int64_t)h * d || ldlse < n)
        return dt_emsg_set(em, DT_EINVAL, "dt_attn_empty_cuda: bad shape n=%lld h=%d d=%d",
                           (long long)n, h, d);
    if (n == 0)
        return 0;
    empty_kernel<<<grid_for(n * h * d, THREADS), THREADS, 0, st>>>(n, h, d, o, ldo, lse, ldlse);
    DT_CUDA_TRY(em, cudaGetLastError());
    return 0;
}

/* dst rows (fp32, pitch ldd) += src rows (T, pitch lds), width elements each. */
template <typename T>
static __global__ void add_half_kernel(int64_t n, int64_t width, const T *src, int64_t lds,
                                       float *dst, int64_t ldd)
{
    const int64_t total = n * width;

    for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < total;
         i += (int64_t)gridDim.x * blockDim.x) {
        const int64_t m = i / width, c = i - m * width;
        dst[m * ldd + c] += load_f32(src + m * lds + c);
    }
}

extern "C" int dt_attn_add_half_cuda(int64_t n, int64_t width, dt_dtype_t dtype, const void *src,
                                     int64_t lds, float *dst, int64_t ldd, cudaStream_t st,
                                     dt_emsg_t *em)
{
    if (n < 0 || width < 1 || lds < width || ldd < width ||
        (dtype != DT_BF16 && dtype != DT_F16))
        return dt_emsg_set(em, DT_EINVAL, "dt_attn_add_half_cuda: bad shape n=%lld width=%lld",
                           (long long)n, (long long)width);
    if (n == 0)
        return 0;
    if (dtype == DT_BF16)
        add_half_kernel<<<grid_for(n * width, THREADS), THREADS, 0, st>>>(
            n, width, (const __nv_bfloat16 *)src, lds, dst, ldd);
    else
        add_half_kernel<<<grid_for(n * width, THREADS), THREADS, 0, st>>>(
            n, width, (const __half *)src, lds, dst, ldd);
    DT_CUDA_TRY(em, cudaGetLastError());
    return 0;
}

/*-- dilated attention: gather, merge, scatter of one head chunk ----------------*/

/* The checks shared by the dilated launchers: n rows first + m * step
 * (m < n) and heads [hlo, hlo + nh) of d, at row stride ld. step >= 1 keeps
 * the rows distinct (the merge and the scatter write them), ld >= (hlo + nh)
 * * d keeps the heads of one row inside the row. */
static int dilate_check(const char *fn, int64_t n, int nh, int d, int64_t ld, int64_t first,
                        int64_t step, int hlo, dt_emsg_t *em)
{
    if (n < 0)
        return dt_emsg_set(em, DT_EINVAL, "%s: n=%lld < 0", fn, (long long)n);
    if (nh < 1 || d < 1)
        return dt_emsg_set(em, DT_EINVAL, "%s: nh=%d, d=%d must be >= 1", fn, nh, d);
    if (hlo < 0)
        return dt_emsg_set(em, DT_EINVAL, "%s: hlo=%d < 0", fn, hlo);
    if (first < 0)
        return dt_emsg_set(em, DT_EINVAL, "%s: first=%lld < 0", fn, (long long)first);
    if (n > 1 && step < 1)
        return dt_emsg_set(em, DT_EINVAL, "%s: step=%lld < 1", fn, (long long)step);
    if (ld < ((int64_t)hlo + nh) * d)
        return dt_emsg_set(em, DT_EINVAL, "%s: row stride %lld below (hlo + nh) * d = %lld", fn,
                           (long long)ld, ((long long)hlo + nh) * d);
    return 0;
}

/* The lse side: rows first + m * step of heads [hlo, hlo + nh) must lie
 * within the head stride ldl. */
static int dilate_check_lse(const char *fn, int64_t n, int64_t ldl, int64_t first, int64_t step,
                            dt_emsg_t *em)
{
    const int64_t last = n > 0 ? first + (n - 1) * step : first;

    if (ldl <= last)
        return dt_emsg_set(em, DT_EINVAL, "%s: lse head stride %lld but row %lld is used", fn,
                           (long long)ldl, (long long)last);
    return 0;
}

/* dst (n, width) contiguous <- rows m of src at src + m * pitch, in units U
 * of 1 to 16 bytes (width and pitch counted in units). */
template <typename U>
static __global__ void gather_kernel(int64_t n, int64_t width, const U *src, int64_t pitch, U *dst)
{
    const int64_t total = n * width;

    for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < total;
         i += (int64_t)gridDim.x * blockDim.x) {
        const int64_t m = i / width;
        dst[i] = src[m * pitch + (i - m * width)];
    }
}

template <typename U>
static void gather_launch(int64_t n, int64_t row_bytes, const char *src, int64_t pitch_bytes,
                          char *dst, cudaStream_t st)
{
    const int64_t width = row_bytes / (int64_t)sizeof(U);

    gather_kernel<<<grid_for(n * width, THREADS), THREADS, 0, st>>>(
        n, width, (const U *)src, pitch_bytes / (int64_t)sizeof(U), (U *)dst);
}

extern "C" int dt_dilate_gather_cuda(dt_dtype_t dtype, int64_t n, int nh, int d, const void *x,
                                     int64_t ldx, int64_t first, int64_t step, int hlo, void *out,
                                     cudaStream_t st, dt_emsg_t *em)
{
    const char *fn = "dt_dilate_gather_cuda";
    int rc;

    if (dtype != DT_BF16 && dtype != DT_F16 && dtype != DT_F32)
        return dt_emsg_set(em, DT_EINVAL, "%s: dtype=%d is not bf16, fp16 or fp32", fn, (int)dtype);
    rc = dilate_check(fn, n, nh, d, ldx, first, step, hlo, em);
    if (rc != 0 || n == 0)
        return rc;
    if (x == NULL || out == NULL)
        return dt_emsg_set(em, DT_EINVAL, "%s: NULL %s tensor with n=%lld", fn,
                           dt_dtype_name(dtype), (long long)n);

    /* Row m of the chunk is one contiguous run of nh * d elements of x:
     * heads hlo .. hlo + nh - 1 of row first + m * step. Copy it in the
     * widest unit that the addresses, the run and the pitch all allow. */
    const int64_t es = dtype == DT_F32 ? 4 : 2;
    const char *src = (const char *)x + (first * ldx + (int64_t)hlo * d) * es;
    const int64_t row_bytes = (int64_t)nh * d * es;
    const int64_t pitch_bytes = (n > 1 ? step : 0) * ldx * es;
    const uint64_t bits = (uint64_t)(uintptr_t)src | (uint64_t)(uintptr_t)out |
                          (uint64_t)row_bytes | (uint64_t)pitch_bytes;
    if (bits % 16 == 0)
        gather_launch<uint4>(n, row_bytes, src, pitch_bytes, (char *)out, st);
    else if (bits % 8 == 0)
        gather_launch<uint2>(n, row_bytes, src, pitch_bytes, (char *)out, st);
    else if (bits % 4 == 0)
        gather_launch<uint32_t>(n, row_bytes, src, pitch_bytes, (char *)out, st);
    else if (bits % 2 == 0)
        gather_launch<uint16_t>(n, row_bytes, src, pitch_bytes, (char *)out, st);
    else
        gather_launch<uint8_t>(n, row_bytes, src, pitch_bytes, (char *)out, st);
    DT_CUDA_TRY(em, cudaGetLastError());
    return 0;
}

/* out[hh * n + m] = lse[hh * ldl + m * step] (lse already offset to head hlo,
 * row first), one thread per output. */
static __global__ void gather_rows_kernel(int64_t n, int nh, const float *lse, int64_t ldl,
                                          int64_t step, float *out)
{
    const int64_t total = n * nh;

    for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < total;
         i += (int64_t)gridDim.x * blockDim.x) {
        const int64_t hh = i / n;
        const int64_t m = i - hh * n;
        out[i] = lse[hh * ldl + m * step];
    }
}

extern "C" int dt_dilate_gather_rows_cuda(int64_t n, int nh, const float *lse, int64_t ldl,
                                          int64_t first, int64_t step, int hlo, float *out,
                                          cudaStream_t st, dt_emsg_t *em)
{
    const char *fn = "dt_dilate_gather_rows_cuda";

    if (n < 0)
        return dt_emsg_set(em, DT_EINVAL, "%s: n=%lld < 0", fn, (long long)n);
    if (nh < 1 || hlo < 0)
        return dt_emsg_set(em, DT_EINVAL, "%s: nh=%d must be >= 1, hlo=%d >= 0", fn, nh, hlo);
    if (first < 0)
        return dt_emsg_set(em, DT_EINVAL, "%s: first=%lld < 0", fn, (long long)first);
    if (n > 1 && step < 1)
        return dt_emsg_set(em, DT_EINVAL, "%s: step=%lld < 1", fn, (long long)step);
    int rc = dilate_check_lse(fn, n, ldl, first, step, em);
    if (rc != 0 || n == 0)
        return rc;
    if (lse == NULL || out == NULL)
        return dt_emsg_set(em, DT_EINVAL, "%s: NULL tensor with n=%lld", fn, (long long)n);
    gather_rows_kernel<<<grid_for(n * nh, THREADS), THREADS, 0, st>>>(
        n, nh, lse + (int64_t)hlo * ldl + first, ldl, step, out);
    DT_CUDA_TRY(em, cudaGetLastError());
    return 0;
}

extern "C" int dt_dilate_merge_cuda(int64_t n, int nh, int d, const float *o2, const float *lse2,
                                    float *o, int64_t ldo, float *lse, int64_t ldl, int64_t first,
                                    int64_t step, int hlo, cudaStream_t st, dt_emsg_t *em)
{
    const char *fn = "dt_dilate_merge_cuda";
    int rc = dilate_check(fn, n, nh, d, ldo, first, step, hlo, em);
    merge_args<float> a;

    if (rc == 0)
        rc = dilate_check_lse(fn, n, ldl, first, step, em);
    if (rc != 0 || n == 0)
        return rc;
    if (o2 == NULL || lse2 == NULL || o == NULL || lse == NULL)
        return dt_emsg_set(em, DT_EINVAL, "%s: NULL tensor with n=%lld", fn, (long long)n);
    memset(&a, 0, sizeof a);
    a.n = n;
    a.nh = nh;
    a.d = d;
    a.o1 = o + first * ldo + (int64_t)hlo * d; /* row m at m * step * ldo */
    a.o1_row = step * ldo;
    a.l1 = lse + (int64_t)hlo * ldl + first; /* (H, rows): row m at m * step */
    a.l1_row = step;
    a.l1_head = ldl;
    a.o2 = o2; /* (n, nh, d) contiguous */
    a.o2_row = (int64_t)nh * d;
    a.l2 = lse2; /* (nh, n) */
    a.l2_row = 1;
    a.l2_head = n;
    return merge_launch(&a, st, em);
}

/* dst rows m (at dst + m * pitch, width elements each) += g (n, width)
 * contiguous; one thread per element, each element written once. */
static __global__ void scatter_add_kernel(int64_t n, int64_t width, const float *g, float *dst,
                                          int64_t pitch)
{
    const int64_t total = n * width;

    for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < total;
         i += (int64_t)gridDim.x * blockDim.x) {
        const int64_t m = i / width;
        dst[m * pitch + (i - m * width)] += g[i];
    }
}

extern "C" int dt_dilate_scatter_add_cuda(int64_t n, int nh, int d, const float *g, float *dst,
                                          int64_t ldd, int64_t first, int64_t step, int hlo,
                                          cudaStream_t st, dt_emsg_t *em)
{
    const char *fn = "dt_dilate_scatter_add_cuda";
    int rc = dilate_check(fn, n, nh, d, ldd, first, step, hlo, em);

    if (rc != 0 || n == 0)
        return rc;
    if (g == NULL || dst == NULL)
        return dt_emsg_set(em, DT_EINVAL, "%s: NULL tensor with n=%lld", fn, (long long)n);
    const int64_t width = (int64_t)nh * d;
    scatter_add_kernel<<<grid_for(n * width, THREADS), THREADS, 0, st>>>(
        n, width, g, dst + first * ldd + (int64_t)hlo * d, (n > 1 ? step : 0) * ldd);
    DT_CUDA_TRY(em, cudaGetLastError());
    return 0;
}
