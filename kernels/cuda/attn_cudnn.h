/* SPDX-License-Identifier: MIT
 *
 * cuDNN's fused attention as a block kernel of the GPU ring: one (query
 * rows, key rows) block, forward and backward, through cuDNN's graph
 * ("backend") API. Plain C on cudnn_graph.h: libcudnn.so.9 is opened at
 * run time (dlopen, as cuBLASLt is), never linked, so a node without
 * cuDNN runs dt's own kernels (kernels/cuda/attn_cuda.h) instead.
 *
 * Why the backend API and not cudnn-frontend: the frontend is C++ with
 * exceptions; the graphs dt needs are two fixed patterns (the "flash"
 * forward and backward that cuDNN fuses), a few dozen descriptor calls,
 * and cuDNN builds and checks them without a GPU too (a device's
 * properties as JSON, cuDNN >= 9.8), so tests/gpu/test_cudnn_plans checks
 * every graph dt builds against the real library on a machine with none.
 *
 * What a block is here. Queries q (tq, h, d), keys and values k, v (tk,
 * hkv, d), row-major at row strides ldq, ldk, ldv elements (GQA: hkv
 * divides h); positions are the rows' order: key j is visible to query i
 * iff j <= i + shift (shift >= tk - 1, or DT_CUDNN_FULL: every key;
 * shift = 0 is the causal diagonal block). The forward writes o (tq, h, d)
 * in dtype at row stride ldo and stats (h, tq) fp32 packed: the natural
 * log of each row's softmax normaliser over the scaled scores, as
 * dt_attn_fwd_cuda's lse. A row that sees no key is not allowed (the
 * caller trims such rows). The backward takes the FINAL o (dtype) and
 * lse (packed (h, tq)) of the whole ring and writes this block's dq (tq,
 * h, d), dk, dv (tk, hkv, d) in dtype (overwritten, not added).
 *
 * Workspace: each call takes ws of dt_cudnn_ws() bytes (device, 256-byte
 * aligned), owned by the caller (the ring's workspace plan); the backward's
 * fp32 accumulators live there too.
 *
 * Deterministic: with det = 1 the backward uses an engine cuDNN does not
 * mark non-deterministic (the same inputs give the same bits); det = 0 may
 * take a faster one that accumulates with atomics.
 *
 * Thread: any host thread; plans are built once per shape and cached per
 * device (a mutex guards the cache); calls are asynchronous on st.
 */
#ifndef DT_KERNELS_CUDA_ATTN_CUDNN_H
#define DT_KERNELS_CUDA_ATTN_CUDNN_H

#include <stddef.h>
#include <stdint.h>

#include <cuda_runtime_api.h>

#include "common/err.h"
#include "spec/dtype.h"

#ifdef __cplusplus
extern "C" {
#endif

#define DT_CUDNN_FULL INT64_MAX

typedef struct dt_cudnn_sdpa {
    int64_t tq, tk;
    int h, hkv, d;
    dt_dtype_t dtype;              /* DT_BF16 or DT_F16 */
    int64_t ldq, ldk, ldv, ldo;    /* row strides (elements) of q, k, v and of o, dout, dq */
    int64_t lddk;                  /* row stride of dk and dv (backward) */
    int64_t shift;                 /* key j visible to query i iff j <= i + shift */
    float scale;                   /* scores are scale * q.k; 0 means 1 / sqrt(d) */
    int det;                       /* backward: a deterministic engine only */
} dt_cudnn_sdpa_t;

/* cuDNN's version (e.g. 91900) once loaded, 0 when it cannot be (em, if
 * not NULL, says why). Loads it on the first call. */
size_t dt_cudnn_version(dt_emsg_t *em);

/* Whether cuDNN runs this block correctly on the loaded version: 0, or
 * DT_ENOTSUP with the reason in em (a shape cuDNN does not take, or one a
 * known cuDNN bug gives wrong results for: such blocks go to dt's
 * kernels). bwd: for the backward. */
int dt_cudnn_supports(const dt_cudnn_sdpa_t *a, int bwd, dt_emsg_t *em);

/* dt_cudnn_supports for cuDNN version v (kernels/cuda/cudnn_rules.c). */
int dt_cudnn_rules(const dt_cudnn_sdpa_t *a, int bwd, size_t v, dt_emsg_t *em);

/* The workspace bytes a forward (bwd = 0) or backward call of this shape
 * takes on the current device; builds and caches its plan. */
int dt_cudnn_ws(const dt_cudnn_sdpa_t *a, int bwd, size_t *bytes, dt_emsg_t *em);

/* Forward: o (tq, h, d) dtype at ldo, stats (h, tq) fp32 packed. */
int dt_cudnn_fwd(const dt_cudnn_sdpa_t *a, const void *q, const void *k, const void *v, void *o,
                 float *stats, void *ws, cudaStream_t st, dt_emsg_t *em);

/* Backward: o and dout (tq, h, d) dtype at ldo, lse (h, tq) fp32 packed
 * (the forward's final) -> dq (tq, h, d) at ldo, dk, dv (tk, hkv, d) at
 * lddk, dtype, overwritten. */
int dt_cudnn_bwd(const dt_cudnn_sdpa_t *a, const void *q, const void *k, const void *v,
                 const void *o, const void *dout, const float *lse, void *dq, void *dk, void *dv,
                 void *ws, cudaStream_t st, dt_emsg_t *em);

/* Without a GPU: build the forward or backward graph and its execution
 * plan for the device described by props_json (cuDNN's device-property
 * JSON), as dt_cudnn_ws would on that device; *bytes gets the workspace
 * and *engine (if not NULL) the engine's global index. For tests. */
int dt_cudnn_plan_offline(const dt_cudnn_sdpa_t *a, int bwd, const char *props_json,
                          size_t *bytes, int64_t *engine, dt_emsg_t *em);

#ifdef __cplusplus
}
#endif

#endif /* DT_KERNELS_CUDA_ATTN_CUDNN_H */
