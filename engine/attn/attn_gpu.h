/* SPDX-License-Identifier: MIT
 *
 * `dtengine attn --device cuda`: the attention of engine/attn/attn.h run on this
 * rank's GPU over an NCCL ring (a one-rank local ring when the job has one
 * rank), with host fp32 tensors in and out, so the command's loading,
 * generation and writing stay what they are for the CPU path. The inputs
 * are rounded to bf16 or fp16 on the way to the device; o, lse and the
 * gradients come back fp32. Free of CUDA types: engine/cmd/attn.c includes this
 * in every build, and builds without CUDA get a clear refusal.
 */
#ifndef DT_ENGINE_ATTN_GPU_H
#define DT_ENGINE_ATTN_GPU_H

#include <stddef.h>

#include "common/err.h"
#include "engine/attn/attn.h"
#include "engine/comm/comm.h"

/* 1 when this dtengine was built with the CUDA backend. */
int dt_attn_gpu_built(void);

/* The GPU block kernel as one word: "cudnn/9.19.0", "dt" or "wgmma"
 * (engine/attn/attn_block.h; "none" without CUDA). */
void dt_attn_gpu_kernel(char *name, size_t len);

/* Forward (and backward when dout is not NULL) over the job's ranks; the
 * tensors are those of dt_attn_fwd / dt_attn_bwd. fp16: 0 for bf16, 1 for
 * fp16 on the device. fst and bst get the timings. DT_ENOTSUP without the
 * CUDA backend, DT_EDEVICE or DT_ECOMM with a message otherwise. */
int dt_attn_gpu_run(dt_comm_t *comm, const dt_attn_spec_t *s, int fp16, const float *q,
                    const float *k, const float *v, float *o, float *lse, const float *dout,
                    float *dq, float *dk, float *dv, dt_attn_stats_t *fst, dt_attn_stats_t *bst,
                    dt_emsg_t *em);

#endif /* DT_ENGINE_ATTN_GPU_H */
