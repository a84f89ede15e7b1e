/* SPDX-License-Identifier: MIT
 *
 * bench_ring: how much of the ring's communication hides behind compute.
 * Run under a launcher (mpirun -np R bench/bench_ring). For each tokens-per-
 * rank c it measures, in the same run:
 *   comm alone:  R - 1 ring steps moving the same K/V packs with no compute
 *                (the baseline: what the transfers cost when nothing hides
 *                them),
 *   ring attn:   dense attention through the ring, split by the engine's own
 *                clocks into kernel time and time blocked in waits.
 * hidden = 1 - exposed wait per step / comm-alone time per step. Prints a
 * table on rank 0; asserts nothing.
 */
#include "config.h"

#include <cblas.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/clock.h"
#include "common/mem.h"
#include "engine/attn/attn.h"
#include "engine/data/gen.h"

/* seconds per ring step moving `bytes` to rank+1 while receiving from rank-1 */
static double comm_alone(dt_comm_t *comm, size_t bytes, int reps)
{
    int R = dt_comm_size(comm), me = dt_comm_rank(comm);
    char *a = dt_xaligned(bytes, 1), *b = dt_xaligned(bytes, 1);
    memset(a, 1, bytes);
    memset(b, 2, bytes);
    double best = 1e30;
    for (int rep = 0; rep < reps; rep++) {
        dt_comm_barrier(comm);
        double t0 = dt_clock_now();
        for (int s = 0; s < R - 1; s++) {
            dt_comm_op_t *op;
            dt_comm_start(comm, s % 2 ? b : a, bytes, (me + 1) % R, s % 2 ? a : b, bytes,
                          (me + R - 1) % R, 7, &op);
            dt_comm_wait(op);
        }
        double t[1] = { (dt_clock_now() - t0) / (R - 1) };
        dt_comm_allreduce_max_f64(comm, t, 1);
        best = t[0] < best ? t[0] : best;
    }
    free(a);
    free(b);
    return best;
}

int main(int argc, char **argv)
{
    dt_comm_t *comm;
    dt_emsg_t em;
    int H = 8, Hkv = 8, D = 64, causal = 0;
    static const int64_t cs[] = { 64, 256, 1024, 4096 };

    openblas_set_num_threads(1);
    if (dt_comm_new(&argc, &argv, &comm, &em) < 0) {
        fprintf(stderr, "bench_ring: %s\n", em.s);
        return 1;
    }
    for (int i = 1; i < argc; i++)
        if (strcmp(argv[i], "--causal") == 0)
            causal = 1;
    int R = dt_comm_size(comm), me = dt_comm_rank(comm);
    if (R < 2) {
        fprintf(stderr, "bench_ring: run under a launcher with at least 2 ranks, e.g. "
                        "mpirun -np 2 %s\n", argv[0]);
        dt_comm_free(comm);
        return 2;
    }
    if (me == 0) {
        printf("ring overlap: R=%d H=%d Hkv=%d D=%d %s layout=%s, baseline = the same K/V "
               "transfers with no compute, same run\n",
               R, H, Hkv, D, causal ? "causal" : "non-causal", causal ? "zigzag" : "contiguous");
        printf("%7s %12s | %14s | %14s %14s | %8s\n", "c", "bytes/step", "comm alone ms",
               "compute ms", "exposed ms", "hidden");
    }
    for (size_t i = 0; i < sizeof(cs) / sizeof(cs[0]); i++) {
        int64_t c = cs[i];
        dt_attn_spec_t s = { .T = c * R, .H = H, .Hkv = Hkv, .D = D, .causal = causal,
                             .layout = causal ? DT_LAYOUT_ZIGZAG : DT_LAYOUT_CONTIGUOUS };
        size_t nq = (size_t)c * H * D, nk = (size_t)c * Hkv * D;
        float *q = dt_xaligned(nq, 4), *k = dt_xaligned(nk, 4), *v = dt_xaligned(nk, 4);
        float *o = dt_xaligned(nq, 4), *lse = dt_xaligned((size_t)c * H, 4);
        dt_gen_normal(3, 1, me * (int64_t)nq, (int64_t)nq, q);
        dt_gen_normal(3, 2, me * (int64_t)nk, (int64_t)nk, k);
        dt_gen_normal(3, 3, me * (int64_t)nk, (int64_t)nk, v);
        size_t bytes = 2 * nk * sizeof(float);
        double alone = comm_alone(comm, bytes, 5);
        double best[3] = { 1e30, 0, 0 };
        for (int rep = 0; rep < 3; rep++) {
            dt_attn_stats_t st;
            dt_comm_barrier(comm);
            if (dt_attn_fwd(comm, &s, q, k, v, o, lse, &st, &em) < 0) {
                fprintf(stderr, "bench_ring: %s\n", em.s);
                dt_comm_abort(comm, 1);
            }
            /* per step, worst rank */
            double x[3] = { st.total_s, st.compute_s / st.steps, st.wait_s / (R - 1) };
            dt_comm_allreduce_max_f64(comm, x, 3);
            if (x[0] < best[0])
                memcpy(best, x, sizeof(best));
        }
        double hidden = 1.0 - best[2] / alone;
        hidden = hidden < 0 ? 0 : hidden > 1 ? 1 : hidden;
        if (me == 0)
            printf("%7lld %12zu | %14.3f | %14.3f %14.3f | %7.1f%%\n", (long long)c, bytes,
                   alone * 1e3, best[1] * 1e3, best[2] * 1e3, 100 * hidden);
        fflush(stdout);
        free(q);
        free(k);
        free(v);
        free(o);
        free(lse);
    }
    dt_comm_free(comm);
    return 0;
}
