/* SPDX-License-Identifier: MIT
 *
 * CUDA runtime errors, translated once at the edge into DT_EDEVICE (the
 * GPU failed or cannot be used: dtengine exits 7 and its node becomes
 * suspect) or, for out of memory, DT_ENOMEM, with a message naming the
 * call, the file and line, and CUDA's own words:
 *     "attn_cuda.cu:412: cudaMalloc(&ws, n): cudaErrorMemoryAllocation:
 *      out of memory"
 * Usable from C (gcc) and from the .cu launchers (nvcc). Kernel launches
 * are checked with cudaGetLastError() right after the launch: errors of a
 * kernel's execution surface at the next synchronising call.
 */
#ifndef DT_KERNELS_CUDA_ERR_H
#define DT_KERNELS_CUDA_ERR_H

#include <cuda_runtime_api.h>

#include "common/err.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Fill em from a failed CUDA call and return DT_EDEVICE. */
int dt_cuda_err(dt_emsg_t *em, cudaError_t e, const char *call, const char *file, int line);

/* The number of usable devices, or 0 with the reason in em (no driver, no
 * device, a driver older than the runtime, ...). */
int dt_cuda_devices(dt_emsg_t *em);

#ifdef __cplusplus
}
#endif

/* Return DT_EDEVICE from the calling function when the call fails. */
#define DT_CUDA_TRY(em, call)                                                 \
    do {                                                                      \
        cudaError_t dt_e_ = (call);                                           \
        if (dt_e_ != cudaSuccess)                                             \
            return dt_cuda_err((em), dt_e_, #call, __FILE__, __LINE__);       \
    } while (0)

/* Set rc and jump to the cleanup label when the call fails. */
#define DT_CUDA_GOTO(em, rc, label, call)                                     \
    do {                                                                      \
        cudaError_t dt_e_ = (call);                                           \
        if (dt_e_ != cudaSuccess) {                                           \
            (rc) = dt_cuda_err((em), dt_e_, #call, __FILE__, __LINE__);       \
            goto label;                                                       \
        }                                                                     \
    } while (0)

#endif /* DT_KERNELS_CUDA_ERR_H */
