/* SPDX-License-Identifier: MIT
 *
 * Dilated attention on the GPU ring (engine/attn/dilated_cuda.c): the
 * LongNet branches of a spec with nbranch > 0, for one call that the entry
 * points of engine/attn/ring_cuda.c have checked and set up
 * (engine/attn/ring_call.h). Not part of the API of
 * engine/attn/ring_cuda.h.
 */
#ifndef DT_ENGINE_DILATED_CUDA_H
#define DT_ENGINE_DILATED_CUDA_H

#include "common/err.h"
#include "engine/attn/ring_call.h"

/* Every branch of x->s, forward or backward (x->bwd), on x's planned
 * workspaces, then the call's end (dt_ring_call_finish): o and lse, or
 * dq, dk and dv, of x->io written. What it allocates in x (hinf, xf,
 * lr[l].qb) the caller frees; after a failure the caller drains the
 * ring. */
int dt_dilated_run(call_t *x, dt_emsg_t *em);

#endif /* DT_ENGINE_DILATED_CUDA_H */
