/* SPDX-License-Identifier: MIT
 *
 * The AdamW update of one element, defined once for every place that runs
 * it: the CPU optimizer (engine/model/optim.c), the GPU's kernel
 * (kernels/cuda/train_cuda.cu), its stand-in in the simulated-device build
 * (tests/gpu/sim/sim_train.c) and the GPU engine's optimizer in host memory
 * (offload = optimizer, engine/cmd/train_gpu.c). So the four give the same
 * bits for the same inputs, which is what lets a GPU job move its optimizer
 * state to the host, or resume on another device, and stay bit-identical.
 *
 * In double, every product and sum rounded on its own: on the device by
 * __dmul_rn and __dadd_rn, which nvcc never fuses into a multiply-add
 * (it would fuse plain `a * b + c` under its default -fmad=true); on the
 * host by plain operators, which GCC does not fuse for the x86-64 baseline
 * this file is compiled for (no FMA instruction). sqrt and the division
 * are IEEE's, correctly rounded, on both.
 *
 * Plain C and CUDA: no includes beyond <math.h> and <stdint.h>.
 */
#ifndef DT_KERNELS_ADAMW_H
#define DT_KERNELS_ADAMW_H

#include <math.h>
#include <stdint.h>

#ifdef __CUDACC__
#define DT_ADAMW_FN static __host__ __device__ inline
#else
#define DT_ADAMW_FN static inline
#endif

/* The step's constants, formed on the host (dt_adamw_k_make):
 *     decay = 1 - lr wd, step_size = lr / (1 - b1^step),
 *     rbc2 = 1 / sqrt(1 - b2^step). */
typedef struct dt_adamw_k {
    double b1, b2, eps, decay, step_size, rbc2;
} dt_adamw_k_t;

static inline dt_adamw_k_t dt_adamw_k_make(double b1, double b2, double eps, double lr, double wd,
                                           int64_t step)
{
    dt_adamw_k_t k = {
        .b1 = b1,
        .b2 = b2,
        .eps = eps,
        .decay = 1.0 - lr * wd,
        .step_size = lr / (1.0 - pow(b1, (double)step)),
        .rbc2 = 1.0 / sqrt(1.0 - pow(b2, (double)step)),
    };
    return k;
}

#ifdef __CUDA_ARCH__
#define DT_ADAMW_MUL(a, b) __dmul_rn((a), (b))
#define DT_ADAMW_ADD(a, b) __dadd_rn((a), (b))
#else
#define DT_ADAMW_MUL(a, b) ((a) * (b))
#define DT_ADAMW_ADD(a, b) ((a) + (b))
#endif

/* One element: g the gradient as the update takes it (already scaled by
 * the clipping, in fp32), p, m, v updated in place:
 *     m = b1 m + (1 - b1) g;  v = b2 v + (1 - b2) g^2
 *     p = p decay - step_size m / (sqrt(v) rbc2 + eps) */
DT_ADAMW_FN void dt_adamw_elem(const dt_adamw_k_t *k, float g, float *p, float *m, float *v)
{
    const double gi = (double)g;
    const double mi = DT_ADAMW_ADD(DT_ADAMW_MUL(k->b1, (double)*m), DT_ADAMW_MUL(1.0 - k->b1, gi));
    const double vi = DT_ADAMW_ADD(DT_ADAMW_MUL(k->b2, (double)*v),
                                   DT_ADAMW_MUL(DT_ADAMW_MUL(1.0 - k->b2, gi), gi));
    const double den = DT_ADAMW_ADD(DT_ADAMW_MUL(sqrt(vi), k->rbc2), k->eps);
    *m = (float)mi;
    *v = (float)vi;
    *p = (float)DT_ADAMW_ADD(DT_ADAMW_MUL((double)*p, k->decay),
                             -(DT_ADAMW_MUL(k->step_size, mi) / den));
}

#undef DT_ADAMW_ADD
#undef DT_ADAMW_MUL

/* The squared norm's partial sums, in one order for the device's kernel
 * (dt_sumsq_cuda, kernels/cuda/train_cuda.cu) and the host's
 * (dt_sumsq_parts, engine/model/optim.c: the gradient of the optimizer in
 * host memory), so that both give the same bits: part b of
 * DT_SUMSQ_PARTS covers [b k, (b + 1) k) of the n elements, k = ceil(n /
 * DT_SUMSQ_PARTS); lane t of its DT_SUMSQ_LANES adds, in double, the
 * squares of the elements b k + t, b k + t + DT_SUMSQ_LANES, ... in that
 * order (a float's square is exact in double, so a fused multiply-add
 * rounds as the two operations do); then lane t takes lane t + h for h =
 * DT_SUMSQ_LANES / 2, / 4, ..., 1, and the part is lane 0. */
#define DT_SUMSQ_PARTS 512
#define DT_SUMSQ_LANES 256

#endif /* DT_KERNELS_ADAMW_H */
