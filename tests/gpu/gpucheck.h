/* SPDX-License-Identifier: MIT
 *
 * The GPU tests' own small harness. They are plain programs, not
 * criterion suites, so they run on a bare GPU node (CUDA driver, the NCCL
 * and cuBLASLt libraries of NVIDIA's wheels, nothing from Debian). Each
 * check prints "ok" or "FAIL" with what it compared; the program ends with
 * "N passed, N failed" (the line .ci/run counts) and exits 0 or 1. Without
 * a usable device it prints why and exits 77, which automake reports as
 * SKIP: a GPU test never passes without having run.
 */
#ifndef DT_TESTS_GPU_CHECK_H
#define DT_TESTS_GPU_CHECK_H

#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>

#include "kernels/cuda/cuda_err.h"

static int gc_passed, gc_failed;

/* Exit 77 with the reason unless a CUDA device is usable. */
static inline void gc_require_device(const char *prog)
{
    dt_emsg_t em = {{0}};

    if (dt_cuda_devices(&em) > 0)
        return;
    printf("SKIP: %s: no usable CUDA device: %s\n", prog, em.s);
    exit(77);
}

static inline __attribute__((format(printf, 2, 3))) void gc_check(int ok, const char *fmt, ...)
{
    va_list ap;

    printf("%s ", ok ? "ok  " : "FAIL");
    va_start(ap, fmt);
    vprintf(fmt, ap);
    va_end(ap);
    printf("\n");
    fflush(stdout);
    if (ok)
        gc_passed++;
    else
        gc_failed++;
}

/* A failed CUDA or dt call is a failed check and ends the program (the
 * context may be unusable). */
#define GC_OK(rc, em)                                                            \
    do {                                                                         \
        int gc_rc_ = (rc);                                                       \
        if (gc_rc_ != 0) {                                                       \
            gc_check(0, "%s:%d: %s: %s", __FILE__, __LINE__, dt_strerror(gc_rc_), \
                     (em).s);                                                    \
            exit(gc_done());                                                     \
        }                                                                        \
    } while (0)

#define GC_CUDA(call)                                                            \
    do {                                                                         \
        cudaError_t gc_e_ = (call);                                              \
        if (gc_e_ != cudaSuccess) {                                              \
            gc_check(0, "%s:%d: %s: %s", __FILE__, __LINE__, #call,              \
                     cudaGetErrorString(gc_e_));                                 \
            exit(gc_done());                                                     \
        }                                                                        \
    } while (0)

static inline int gc_done(void)
{
    printf("%d passed, %d failed\n", gc_passed, gc_failed);
    return gc_failed ? 1 : 0;
}

/* Largest finite |x[i]| over n values (0 when none is finite). */
static inline double gc_maxabs(const float *x, size_t n)
{
    double m = 0;

    for (size_t i = 0; i < n; i++)
        if (isfinite(x[i]) && fabs(x[i]) > m)
            m = fabs(x[i]);
    return m;
}

/* Largest |got - want| - rtol * |want| over n values (<= atol passes),
 * NaN where either is NaN or the infinities differ. *at gets the index. */
static inline double gc_maxerr(const float *got, const float *want, size_t n, double rtol,
                               size_t *at)
{
    double worst = 0.0;

    *at = 0;
    for (size_t i = 0; i < n; i++) {
        double g = got[i], w = want[i], e;
        if (isinf(w) || isinf(g))
            e = g == w ? 0.0 : NAN;
        else
            e = fabs(g - w) - rtol * fabs(w);
        if (isnan(e) || e > worst) {
            worst = e;
            *at = i;
            if (isnan(e))
                return e;
        }
    }
    return worst;
}

#endif /* DT_TESTS_GPU_CHECK_H */
