/* SPDX-License-Identifier: MIT
 *
 * bench_attn: single-rank attention throughput against the machine's own
 * OpenBLAS sgemm, measured side by side in the same run, one BLAS thread.
 * Prints a table (or CSV with --csv); asserts nothing.
 *
 * The baseline is sgemm at 2048^3 and sgemm at the two tile shapes the
 * blas kernel issues (queries x keys x D), so the table shows how far
 * attention is from OpenBLAS's matrix throughput on this machine. The
 * attention runs on the kernel dtengine would pick (printed; set
 * DT_ATTN_KERNEL to pick another), whose own products can beat OpenBLAS:
 * above 100 % is possible.
 */
#include "config.h"

#include <cblas.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/clock.h"
#include "common/cpuinfo.h"
#include "common/mem.h"
#include "engine/attn/attn.h"
#include "engine/cpu.h"
#include "engine/data/gen.h"
#include "kernels/cpu/attn_cpu.h"

/* GFLOP/s of C(m,n) = A(m,k) B(k,n)^T, repeated for at least min_s. */
static double sgemm_gflops(int m, int n, int k, double min_s)
{
    float *a = dt_xaligned((size_t)m * k, sizeof(float));
    float *b = dt_xaligned((size_t)n * k, sizeof(float));
    float *c = dt_xaligned((size_t)m * n, sizeof(float));
    dt_gen_normal(1, 1, 0, (int64_t)m * k, a);
    dt_gen_normal(1, 2, 0, (int64_t)n * k, b);
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, m, n, k, 1.0f, a, k, b, k, 0.0f, c, n);
    int it = 0;
    double t0 = dt_clock_now(), t;
    do {
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, m, n, k, 1.0f, a, k, b, k, 0.0f, c,
                    n);
        it++;
    } while ((t = dt_clock_now() - t0) < min_s);
    free(a);
    free(b);
    free(c);
    return 2.0 * m * n * (double)k * it / t * 1e-9;
}

typedef struct shape {
    int64_t T;
    int H, Hkv, D, causal;
} shape_t;

int main(int argc, char **argv)
{
    int csv = 0, quick = 0;
    dt_comm_t *comm;
    dt_emsg_t em;

    for (int i = 1; i < argc; i++) {
        if (strcmp(argv[i], "--csv") == 0)
            csv = 1;
        else if (strcmp(argv[i], "--quick") == 0)
            quick = 1;
        else {
            fprintf(stderr, "usage: bench_attn [--csv] [--quick]\n");
            return 2;
        }
    }
    dt_cpu_blas_setup(argv); /* the BLAS core dtengine would run */
    openblas_set_num_threads(1);
    if (dt_comm_new(NULL, NULL, &comm, &em) < 0) {
        fprintf(stderr, "bench_attn: %s\n", em.s);
        return 1;
    }
    double min_s = quick ? 0.2 : 1.0;
    double peak = sgemm_gflops(2048, 2048, 2048, min_s);
    double t64a = sgemm_gflops(128, 256, 64, min_s), t128a = sgemm_gflops(128, 256, 128, min_s);

    static const shape_t shapes[] = {
        { 4096, 8, 8, 64, 0 },  { 4096, 8, 8, 64, 1 },  { 4096, 8, 2, 64, 0 },
        { 4096, 8, 8, 128, 0 }, { 4096, 8, 8, 128, 1 }, { 16384, 4, 4, 128, 1 },
    };
    int nshape = quick ? 2 : (int)(sizeof(shapes) / sizeof(shapes[0]));
    if (csv)
        printf("T,H,Hkv,D,causal,fwd_gflops,fwd_pct_sgemm,bwd_gflops,bwd_pct_sgemm,sgemm_gflops\n");
    else {
        printf("machine: %s; OpenBLAS core %s\n", dt_cpu_describe(), openblas_get_corename());
        printf("baseline: OpenBLAS sgemm, 1 thread, same run\n");
        printf("  2048 x 2048 x 2048          %7.1f GFLOP/s\n", peak);
        printf("  128 x 256 x 64  (blas tile QK^T)  %7.1f GFLOP/s\n", t64a);
        printf("  128 x 256 x 128 (blas tile QK^T)  %7.1f GFLOP/s\n", t128a);
        printf("attention kernel: %s (D = 64), %s (D = 128)\n\n", dt_attn_cpu_kernel(64),
               dt_attn_cpu_kernel(128));
        printf("%7s %3s %4s %4s %6s | %10s %8s | %10s %8s\n", "T", "H", "Hkv", "D", "causal",
               "fwd GF/s", "%sgemm", "bwd GF/s", "%sgemm");
    }
    for (int i = 0; i < nshape; i++) {
        const shape_t *sh = &shapes[i];
        dt_attn_spec_t s = { .T = sh->T, .H = sh->H, .Hkv = sh->Hkv, .D = sh->D,
                             .causal = sh->causal };
        size_t nq = (size_t)s.T * s.H * s.D, nk = (size_t)s.T * s.Hkv * s.D;
        float *q = dt_xaligned(nq, 4), *k = dt_xaligned(nk, 4), *v = dt_xaligned(nk, 4);
        float *o = dt_xaligned(nq, 4), *lse = dt_xaligned((size_t)s.T * s.H, 4);
        float *dout = dt_xaligned(nq, 4), *dq = dt_xaligned(nq, 4);
        float *dk = dt_xaligned(nk, 4), *dv = dt_xaligned(nk, 4);
        dt_gen_normal(7, 1, 0, (int64_t)nq, q);
        dt_gen_normal(7, 2, 0, (int64_t)nk, k);
        dt_gen_normal(7, 3, 0, (int64_t)nk, v);
        dt_gen_normal(7, 4, 0, (int64_t)nq, dout);
        dt_attn_stats_t fst, bst;
        double fbest = INFINITY, bbest = INFINITY;
        for (int rep = 0; rep < (quick ? 1 : 3); rep++) {
            if (dt_attn_fwd(comm, &s, q, k, v, o, lse, &fst, &em) < 0 ||
                dt_attn_bwd(comm, &s, q, k, v, o, lse, dout, dq, dk, dv, &bst, &em) < 0) {
                fprintf(stderr, "bench_attn: %s\n", em.s);
                return 1;
            }
            fbest = fst.total_s < fbest ? fst.total_s : fbest;
            bbest = bst.total_s < bbest ? bst.total_s : bbest;
        }
        double fl = dt_attn_flops(&s);
        double fg = fl / fbest * 1e-9, bg = 2.5 * fl / bbest * 1e-9;
        if (csv)
            printf("%lld,%d,%d,%d,%d,%.2f,%.1f,%.2f,%.1f,%.2f\n", (long long)s.T, s.H, s.Hkv, s.D,
                   s.causal, fg, 100 * fg / peak, bg, 100 * bg / peak, peak);
        else
            printf("%7lld %3d %4d %4d %6s | %10.1f %7.0f%% | %10.1f %7.0f%%\n", (long long)s.T,
                   s.H, s.Hkv, s.D, s.causal ? "yes" : "no", fg, 100 * fg / peak, bg,
                   100 * bg / peak);
        fflush(stdout);
        free(q);
        free(k);
        free(v);
        free(o);
        free(lse);
        free(dout);
        free(dq);
        free(dk);
        free(dv);
    }
    dt_comm_free(comm);
    return 0;
}
