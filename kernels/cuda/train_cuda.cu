/* SPDX-License-Identifier: MIT
 *
 * The training kernels that are not a layer (train_cuda.h): embedding
 * forward and backward, cross-entropy with its gradient and argmax, the
 * squared gradient norm, AdamW. Plain kernels like those of layers_cuda.cu;
 * every reduction is a fixed tree in a fixed launch shape, so results are
 * the same bits run after run (a resumed GPU run repeats the uninterrupted
 * one).
 */
#include "config.h"

#include <math.h>
#include <stdint.h>

#include <cuda_runtime.h>

#include "common/err.h"
#include "kernels/cuda/cuda_err.h"
#include "kernels/cuda/grid.cuh"
#include "kernels/cuda/train_cuda.h"

/*-- embedding ----------------------------------------------------------------*/

static __global__ void embed_fwd_kernel(int64_t T, int d, const int32_t *tok, const float *table,
                                        float *out)
{
    const int64_t n = T * d;
    for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < n;
         i += (int64_t)gridDim.x * blockDim.x) {
        const int64_t t = i / d, j = i % d;
        out[i] = table[(int64_t)tok[t] * d + j];
    }
}

extern "C" int dt_embed_fwd_cuda(int64_t T, int d, const int32_t *tok, const float *table,
                                 float *out, cudaStream_t st, dt_emsg_t *em)
{
    if (T < 0 || d <= 0)
        return dt_emsg_set(em, DT_EINVAL, "dt_embed_fwd_cuda: T=%lld d=%d", (long long)T, d);
    if (T == 0)
        return 0;
    if (!tok || !table || !out)
        return dt_emsg_set(em, DT_EINVAL, "dt_embed_fwd_cuda: NULL tensor");
    embed_fwd_kernel<<<grid_for(T * d, THREADS), THREADS, 0, st>>>(T, d, tok, table, out);
    DT_CUDA_TRY(em, cudaGetLastError());
    return 0;
}

/* One block per group, threads over the columns; the group's rows are
 * summed in order, then added to the table's row. */
static __global__ void embed_bwd_kernel(int64_t nu, int d, const int32_t *tok,
                                        const int64_t *start, const int32_t *rows,
                                        const float *dout, float *dtable)
{
    for (int64_t u = blockIdx.x; u < nu; u += gridDim.x) {
        float *dst = dtable + (int64_t)tok[u] * d;
        for (int j = threadIdx.x; j < d; j += blockDim.x) {
            float s = 0.0f;
            for (int64_t r = start[u]; r < start[u + 1]; r++)
                s += dout[(int64_t)rows[r] * d + j];
            dst[j] += s;
        }
    }
}

extern "C" int dt_embed_bwd_cuda(int64_t nu, int d, const int32_t *tok, const int64_t *start,
                                 const int32_t *rows, const float *dout, float *dtable,
                                 cudaStream_t st, dt_emsg_t *em)
{
    if (nu < 0 || d <= 0)
        return dt_emsg_set(em, DT_EINVAL, "dt_embed_bwd_cuda: nu=%lld d=%d", (long long)nu, d);
    if (nu == 0)
        return 0;
    if (!tok || !start || !rows || !dout || !dtable)
        return dt_emsg_set(em, DT_EINVAL, "dt_embed_bwd_cuda: NULL tensor");
    embed_bwd_kernel<<<grid_for(nu, 1), THREADS, 0, st>>>(nu, d, tok, start, rows, dout, dtable);
    DT_CUDA_TRY(em, cudaGetLastError());
    return 0;
}

/*-- cross-entropy ------------------------------------------------------------*/

/* Block reductions over THREADS threads through shared memory, fixed tree. */
template <typename T> static __device__ T block_sum(T v, T *sh)
{
    sh[threadIdx.x] = v;
    __syncthreads();
    for (int s = THREADS / 2; s > 0; s /= 2) {
        if ((int)threadIdx.x < s)
            sh[threadIdx.x] += sh[threadIdx.x + s];
        __syncthreads();
    }
    T r = sh[0];
    __syncthreads();
    return r;
}

/* The maximum and its first index: (v, i) beats (w, j) when v > w, or v == w
 * and i < j. */
static __device__ void block_argmax(float *v, int *i, float *shv, int *shi)
{
    shv[threadIdx.x] = *v;
    shi[threadIdx.x] = *i;
    __syncthreads();
    for (int s = THREADS / 2; s > 0; s /= 2) {
        if ((int)threadIdx.x < s) {
            const float w = shv[threadIdx.x + s];
            const int j = shi[threadIdx.x + s];
            if (w > shv[threadIdx.x] || (w == shv[threadIdx.x] && j < shi[threadIdx.x])) {
                shv[threadIdx.x] = w;
                shi[threadIdx.x] = j;
            }
        }
        __syncthreads();
    }
    *v = shv[0];
    *i = shi[0];
    __syncthreads();
}

static __global__ void xent_kernel(int64_t n, int V, float *logits, const int32_t *y, float scale,
                                   double *loss, int32_t *amax)
{
    __shared__ double shd[THREADS];
    __shared__ float shv[THREADS];
    __shared__ int shi[THREADS];

    for (int64_t t = blockIdx.x; t < n; t += gridDim.x) {
        float *x = logits + t * V;
        const int32_t yt = y[t];
        float m = -INFINITY;
        int mi = V;
        for (int j = threadIdx.x; j < V; j += THREADS)
            if (mi == V || x[j] > m) {
                m = x[j];
                mi = j;
            }
        block_argmax(&m, &mi, shv, shi);
        if (threadIdx.x == 0 && amax)
            amax[t] = mi;
        if (yt < 0) {
            for (int j = threadIdx.x; j < V; j += THREADS)
                x[j] = 0.0f;
            if (threadIdx.x == 0)
                loss[t] = 0.0;
            __syncthreads();
            continue;
        }
        const float xy = x[yt];
        double s = 0.0;
        for (int j = threadIdx.x; j < V; j += THREADS)
            s += (double)expf(x[j] - m);
        s = block_sum(s, shd);
        const float k = (float)(1.0 / s) * scale;
        for (int j = threadIdx.x; j < V; j += THREADS)
            x[j] = expf(x[j] - m) * k - (j == yt ? scale : 0.0f);
        if (threadIdx.x == 0)
            loss[t] = (double)m + log(s) - (double)xy;
        __syncthreads();
    }
}

extern "C" int dt_xent_cuda(int64_t n, int V, float *logits, const int32_t *y, float scale,
                            double *loss, int32_t *amax, cudaStream_t st, dt_emsg_t *em)
{
    if (n < 0 || V <= 0)
        return dt_emsg_set(em, DT_EINVAL, "dt_xent_cuda: n=%lld V=%d", (long long)n, V);
    if (n == 0)
        return 0;
    if (!logits || !y || !loss)
        return dt_emsg_set(em, DT_EINVAL, "dt_xent_cuda: NULL tensor");
    xent_kernel<<<grid_for(n, 1), THREADS, 0, st>>>(n, V, logits, y, scale, loss, amax);
    DT_CUDA_TRY(em, cudaGetLastError());
    return 0;
}

/*-- the squared norm ------------------------------------------------------------*/

/* Block b sums the contiguous chunk b of DT_SUMSQ_PARTS chunks. */
static_assert(THREADS == DT_SUMSQ_LANES, "the norm's order (kernels/adamw.h) has one lane a thread");

static __global__ void sumsq_kernel(int64_t n, const float *g, double *part)
{
    __shared__ double sh[THREADS];
    const int64_t chunk = (n + DT_SUMSQ_PARTS - 1) / DT_SUMSQ_PARTS;
    const int64_t lo = (int64_t)blockIdx.x * chunk;
    const int64_t hi = lo + chunk < n ? lo + chunk : n;
    double s = 0.0;

    for (int64_t i = lo + threadIdx.x; i < hi; i += THREADS)
        s += (double)g[i] * g[i];
    s = block_sum(s, sh);
    if (threadIdx.x == 0)
        part[blockIdx.x] = s;
}

extern "C" int dt_sumsq_cuda(int64_t n, const float *g, double *part, cudaStream_t st,
                             dt_emsg_t *em)
{
    if (n < 0 || !part || (n > 0 && !g))
        return dt_emsg_set(em, DT_EINVAL, "dt_sumsq_cuda: n=%lld or a NULL tensor",
                           (long long)n);
    sumsq_kernel<<<DT_SUMSQ_PARTS, THREADS, 0, st>>>(n, g, part);
    DT_CUDA_TRY(em, cudaGetLastError());
    return 0;
}

/*-- AdamW ------------------------------------------------------------------------*/

static __global__ void adamw_kernel(int64_t n, float *p, const float *g, float *m, float *v,
                                    float gscale, dt_adamw_k_t k)
{
    for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < n;
         i += (int64_t)gridDim.x * blockDim.x) {
        dt_adamw_elem(&k, g[i] * gscale, &p[i], &m[i], &v[i]);
    }
}

extern "C" int dt_adamw_cuda(int64_t n, float *p, const float *g, float *m, float *v,
                             float gscale, const dt_adamw_k_t *k, cudaStream_t st, dt_emsg_t *em)
{
    if (n < 0 || (n > 0 && (!p || !g || !m || !v)))
        return dt_emsg_set(em, DT_EINVAL, "dt_adamw_cuda: n=%lld or a NULL tensor",
                           (long long)n);
    if (n == 0)
        return 0;
    adamw_kernel<<<grid_for(n, THREADS), THREADS, 0, st>>>(n, p, g, m, v, gscale, *k);
    DT_CUDA_TRY(em, cudaGetLastError());
    return 0;
}

/*-- a reduce-scatter's sum in rank order --------------------------------------------*/

static __global__ void sum_slots_kernel(int64_t n, int R, int me, const float *own,
                                        const float *slots, int64_t ld, float *dst, int acc)
{
    for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < n;
         i += (int64_t)gridDim.x * blockDim.x) {
        float s = 0.0f;
        for (int r = 0; r < R; r++)
            s = __fadd_rn(s, r == me ? own[i] : slots[(int64_t)r * ld + i]);
        dst[i] = acc ? __fadd_rn(dst[i], s) : s;
    }
}

extern "C" int dt_sum_slots_cuda(int64_t n, int R, int me, const float *own, const float *slots,
                                 int64_t ld, float *dst, int acc, cudaStream_t st, dt_emsg_t *em)
{
    int rc = dt_sum_slots_check(n, R, me, own, slots, ld, dst, em);
    if (rc < 0 || n == 0)
        return rc;
    sum_slots_kernel<<<grid_for(n, THREADS), THREADS, 0, st>>>(n, R, me, own, slots, ld, dst,
                                                                acc);
    DT_CUDA_TRY(em, cudaGetLastError());
    return 0;
}
