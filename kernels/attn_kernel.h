/* SPDX-License-Identifier: MIT
 *
 * Which attention kernel runs, on either device: one variable,
 * DT_ATTN_KERNEL, names a CPU kernel (kernels/cpu/attn_cpu.h: avx512,
 * avx2, generic, blas) or a GPU one:
 *   cudnn  cuDNN's fused attention (kernels/cuda/attn_cudnn.h), where it is
 *          installed and takes the block; dt's kernels for the rest
 *   dt     dt's own CUDA kernels (mma.sync forward and backward)
 *   wgmma  dt's kernels with the sm_90 warpgroup forward
 *   auto   (or unset) cudnn where present, else dt
 * A GPU name leaves the CPU's choice at auto and a CPU name the GPU's.
 * This is the one home of the GPU names; no CUDA here, so a CPU-only
 * dtengine knows them too.
 */
#ifndef DT_KERNELS_ATTN_KERNEL_H
#define DT_KERNELS_ATTN_KERNEL_H

#ifdef __cplusplus
extern "C" {
#endif

typedef enum dt_gpu_attn {
    DT_GPU_ATTN_AUTO = 0,
    DT_GPU_ATTN_CUDNN,
    DT_GPU_ATTN_DT,
    DT_GPU_ATTN_WGMMA,
} dt_gpu_attn_t;

/* The GPU kernel a name means: 0 and *k, or -1 if name is not a GPU
 * kernel's (NULL and "auto" are DT_GPU_ATTN_AUTO). */
int dt_gpu_attn_parse(const char *name, dt_gpu_attn_t *k);

/* The GPU kernels' names, comma separated ("auto,cudnn,dt,wgmma"). */
const char *dt_gpu_attn_names(void);

/* The process's GPU choice: set once by dtengine's main (from
 * DT_ATTN_KERNEL), read by the GPU ring; without a set, the first get
 * parses DT_ATTN_KERNEL itself (a CPU name or none: auto). */
void dt_gpu_attn_set(dt_gpu_attn_t k);
dt_gpu_attn_t dt_gpu_attn_get(void);

/* The name of a choice ("cudnn", "dt", ...). */
const char *dt_gpu_attn_name(dt_gpu_attn_t k);

#ifdef __cplusplus
}
#endif

#endif /* DT_KERNELS_ATTN_KERNEL_H */
