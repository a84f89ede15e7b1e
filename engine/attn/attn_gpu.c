/* SPDX-License-Identifier: MIT
 *
 * `dtengine attn --device cuda` (see attn_gpu.h): host fp32 -> device
 * bf16/fp16, the ring of engine/attn/ring_cuda.h, device fp32 -> host. With more
 * than one rank the ring is NCCL, its unique id through PMIx
 * (dt_ring_nccl_pmix_new); alone it is a local ring of one.
 *
 * Not here: the kernels (kernels/cuda), the ring schedules (ring_cuda.c, dilated_cuda.c).
 */
#include "config.h"

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/mem.h"
#include "engine/attn/attn_gpu.h"

#ifdef HAVE_CUDA

#include <cuda_runtime_api.h>

#include "spec/layout.h"
#include "engine/attn/attn_block.h"
#include "engine/attn/ring_cuda.h"
#include "kernels/cuda/cuda_err.h"

int dt_attn_gpu_built(void)
{
    return 1;
}

void dt_attn_gpu_kernel(char *name, size_t len)
{
    char full[256];
    size_t i;

    (void)dt_attn_block_cudnn(full, sizeof(full));
    /* one word: "cudnn/9.19.0", "dt" (a fallback's reason stays in the log) */
    for (i = 0; full[i] != '\0' && full[i] != ' ' && i + 1 < len; i++)
        name[i] = full[i];
    if (strncmp(full, "cudnn ", 6) == 0)
        snprintf(name + i, len - i, "/%s", full + 6);
    else
        name[i] = '\0';
}

/* n floats to the device as bf16 or fp16 at dst. */
static int upload(const float *x, size_t n, int fp16, void *dst, dt_emsg_t *em)
{
    uint16_t *h = dt_xmallocarray(n ? n : 1, sizeof(uint16_t));
    int rc = 0;

    for (size_t i = 0; i < n; i++)
        h[i] = dt_half_bits(fp16 ? DT_F16 : DT_BF16, x[i]);
    DT_CUDA_GOTO(em, rc, out, cudaMemcpy(dst, h, n * 2, cudaMemcpyHostToDevice));
out:
    free(h);
    return rc;
}

int dt_attn_gpu_run(dt_comm_t *comm, const dt_attn_spec_t *s, int fp16, const float *q,
                    const float *k, const float *v, float *o, float *lse, const float *dout,
                    float *dq, float *dk, float *dv, dt_attn_stats_t *fst, dt_attn_stats_t *bst,
                    dt_emsg_t *em)
{
    const int R = dt_comm_size(comm);
    const int64_t c = dt_layout_local(s->T, R);
    const size_t nq = (size_t)c * s->H * s->D, nkv = (size_t)c * s->Hkv * s->D;
    const size_t nl = (size_t)c * s->H;
    dt_ring_t *ring = NULL;
    void *dq16 = NULL, *dk16 = NULL, *dv16 = NULL, *ddo16 = NULL;
    float *dO = NULL, *dL = NULL, *dQ = NULL, *dK = NULL, *dV = NULL;
    int rc;

    rc = R == 1 ? dt_ring_local_new(1, 0, &ring, em) : dt_ring_nccl_pmix_new(0, NULL, &ring, em);
    if (rc)
        return rc;
    DT_CUDA_GOTO(em, rc, out, cudaMalloc(&dq16, nq * 2));
    DT_CUDA_GOTO(em, rc, out, cudaMalloc(&dk16, nkv * 2));
    DT_CUDA_GOTO(em, rc, out, cudaMalloc(&dv16, nkv * 2));
    DT_CUDA_GOTO(em, rc, out, cudaMalloc((void **)&dO, nq * sizeof(float)));
    DT_CUDA_GOTO(em, rc, out, cudaMalloc((void **)&dL, nl * sizeof(float)));
    if ((rc = upload(q, nq, fp16, dq16, em)) || (rc = upload(k, nkv, fp16, dk16, em)) ||
        (rc = upload(v, nkv, fp16, dv16, em)))
        goto out;

    dt_ring_io_t io = { .q = dq16, .k = dk16, .v = dv16, .o = dO, .lse = dL };
    const dt_dtype_t dt = fp16 ? DT_F16 : DT_BF16;
    rc = dt_ring_attn_fwd(ring, s, dt, &io, fst, em);
    if (rc)
        goto out;
    DT_CUDA_GOTO(em, rc, out, cudaMemcpy(o, dO, nq * sizeof(float), cudaMemcpyDeviceToHost));
    DT_CUDA_GOTO(em, rc, out, cudaMemcpy(lse, dL, nl * sizeof(float), cudaMemcpyDeviceToHost));
    if (dout == NULL)
        goto out;

    DT_CUDA_GOTO(em, rc, out, cudaMalloc(&ddo16, nq * 2));
    DT_CUDA_GOTO(em, rc, out, cudaMalloc((void **)&dQ, nq * sizeof(float)));
    DT_CUDA_GOTO(em, rc, out, cudaMalloc((void **)&dK, nkv * sizeof(float)));
    DT_CUDA_GOTO(em, rc, out, cudaMalloc((void **)&dV, nkv * sizeof(float)));
    if ((rc = upload(dout, nq, fp16, ddo16, em)))
        goto out;
    io.dout = ddo16;
    io.dq = dQ;
    io.dk = dK;
    io.dv = dV;
    rc = dt_ring_attn_bwd(ring, s, dt, &io, bst, em);
    if (rc)
        goto out;
    DT_CUDA_GOTO(em, rc, out, cudaMemcpy(dq, dQ, nq * sizeof(float), cudaMemcpyDeviceToHost));
    DT_CUDA_GOTO(em, rc, out, cudaMemcpy(dk, dK, nkv * sizeof(float), cudaMemcpyDeviceToHost));
    DT_CUDA_GOTO(em, rc, out, cudaMemcpy(dv, dV, nkv * sizeof(float), cudaMemcpyDeviceToHost));
out:
    cudaFree(dq16);
    cudaFree(dk16);
    cudaFree(dv16);
    cudaFree(ddo16);
    cudaFree(dO);
    cudaFree(dL);
    cudaFree(dQ);
    cudaFree(dK);
    cudaFree(dV);
    dt_ring_free(ring);
    return rc;
}

#else /* !HAVE_CUDA */

int dt_attn_gpu_built(void)
{
    return 0;
}

void dt_attn_gpu_kernel(char *name, size_t len)
{
    snprintf(name, len, "none");
}

int dt_attn_gpu_run(dt_comm_t *comm, const dt_attn_spec_t *s, int fp16, const float *q,
                    const float *k, const float *v, float *o, float *lse, const float *dout,
                    float *dq, float *dk, float *dv, dt_attn_stats_t *fst, dt_attn_stats_t *bst,
                    dt_emsg_t *em)
{
    return dt_emsg_set(em, DT_ENOTSUP, "this dtengine was built without CUDA "
                                       "(configure --with-cuda)");
}

#endif /* HAVE_CUDA */
