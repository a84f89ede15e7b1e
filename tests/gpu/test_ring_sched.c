/* SPDX-License-Identifier: MIT
 *
 * The GPU ring's stream/event schedule, checked without a GPU: the real
 * engine/ring_cuda.c and engine/comm_nccl.c run against the host simulator
 * of tests/gpu/sim/sim_cuda.c, which executes their stream operations in a
 * random order that respects only the dependencies they declare. Under it
 * run the checks of tests/gpu/test_ring_cuda.c (included, its main renamed),
 * small local rings (R = 1, 2, 3, 4, 8; contiguous and zigzag; causal or
 * not; forward and backward; each ring used twice), dilated branches, and
 * NCCL rings of R = 2..4 ranks as threads, some aborted by a peer, all for
 * several seeds and scheduling policies. A missing event wait shows as a
 * FAIL (wrong result) or an abort (HAZARD, deadlock).
 *
 * This checks the order of the ring's work, not the kernels: those are the
 * CPU reference here. It never skips: the simulator reports one device.
 * Seeds and policies can be widened by hand: tests/gpu/test_ring_sched N
 * runs N seeds of the small rings (see also the SIM_* knobs in sim_cuda.c).
 */
#include <pthread.h>
#include <unistd.h>

#include "tests/gpu/sim/sim_cuda.h"

int test_main(void);
#define main test_main
#include "tests/gpu/test_ring_cuda.c"
#undef main

/* Seeds in `make check`: of test_ring_cuda's checks, and of the small
 * rings (policy seed % 3). */
#define TEST_SEEDS 2
#define SMALL_SEEDS 4

/* Dense rings of every R, both layouts, causal or not, forward and backward,
 * each ring run twice (the second run reuses its streams and events); D = 64
 * or 128 by seed. */
static void small_local(unsigned seed)
{
    static const int Rs[] = { 1, 2, 3, 4, 8 };
    dt_emsg_t em = { { 0 } };

    for (int causal = 0; causal <= 1; causal++)
        for (int lay = 0; lay < 2; lay++) {
            dt_attn_spec_t s = { .T = 96, .H = 4, .Hkv = 2, .D = seed & 1 ? 64 : 128,
                                 .causal = causal, .layout = lay ? DT_LAYOUT_ZIGZAG : DT_LAYOUT_CONTIGUOUS };
            problem_t p;
            problem_init(&p, &s, DT_BF16, seed * 7 + (unsigned)causal * 2 + (unsigned)lay);
            reference_dense(&p);
            for (size_t i = 0; i < sizeof(Rs) / sizeof(Rs[0]); i++) {
                dt_ring_t *ring = NULL;
                result_t x;
                result_init(&x, &s);
                GC_OK(dt_ring_local_new(Rs[i], 0, &ring, &em), em);
                for (int rep = 0; rep < 2; rep++) { /* reuse: events from the previous call */
                    GC_OK(run_ring(ring, &p, &s, 1, &x, &em), em);
                    errs_t e = compare(&p, &x, 1);
                    gc_check(e.o < 1e-4 && e.lse < 1e-4 && e.dq < 0.05 && e.dk < 0.05 &&
                                 e.dv < 0.05 && x.fst.steps == expected_steps(&s, Rs[i]),
                             "sim seed %u local %s %s R=%d rep %d: o %.1e lse %.1e dq %.2f dk "
                             "%.2f dv %.2f steps %d",
                             seed, dt_layout_name(s.layout), causal ? "causal" : "full", Rs[i],
                             rep, e.o, e.lse, e.dq, e.dk, e.dv, x.fst.steps);
                }
                dt_ring_free(ring);
                result_free(&x);
            }
            problem_free(&p);
        }
}

/* Dilated branches (gathers, merges and scatters between the ring steps). */
static void small_dilated(unsigned seed)
{
    struct { int R; enum dt_layout lay; int causal; const char *w, *r; } cs[] = {
        { 1, DT_LAYOUT_CONTIGUOUS, 1, "12,36,96", "1,3,4" },
        { 2, DT_LAYOUT_CONTIGUOUS, 0, "12,48", "1,3" },
        { 2, DT_LAYOUT_CONTIGUOUS, 1, "24,48", "2,3" },
        { 4, DT_LAYOUT_ZIGZAG, 1, "6,12", "2,3" },
        { 8, DT_LAYOUT_CONTIGUOUS, 1, "12", "3" },
    };
    dt_emsg_t em = { { 0 } };
    for (size_t i = 0; i < sizeof(cs) / sizeof(cs[0]); i++) {
        dt_attn_spec_t s = { .T = 96, .H = 8, .Hkv = 2, .D = 64, .causal = cs[i].causal,
                             .layout = cs[i].lay };
        GC_OK(dt_attn_parse_branches(&s, cs[i].w, cs[i].r, &em), em);
        problem_t p;
        problem_init(&p, &s, DT_BF16, seed * 31 + (unsigned)i);
        reference_dilated(&p);
        dt_ring_t *ring = NULL;
        result_t x;
        result_init(&x, &s);
        GC_OK(dt_ring_local_new(cs[i].R, 0, &ring, &em), em);
        GC_OK(run_ring(ring, &p, &s, 1, &x, &em), em);
        errs_t e = compare(&p, &x, 1);
        gc_check(e.o < 1e-4 && e.lse < 1e-4 && e.dq < 0.05 && e.dk < 0.05 && e.dv < 0.05,
                 "sim seed %u dilated w=%s r=%s R=%d: o %.1e lse %.1e dq %.2f dk %.2f dv %.2f",
                 seed, cs[i].w, cs[i].r, cs[i].R, e.o, e.lse, e.dq, e.dk, e.dv);
        dt_ring_free(ring);
        result_free(&x);
        problem_free(&p);
    }
}

/* One rank of an NCCL ring, run by its own thread. */
typedef struct rank_arg {
    int rank, R, abort_rank;
    double timeout;
    unsigned char id[DT_RING_ID_BYTES];
    const problem_t *p;
    const dt_attn_spec_t *s;
    result_t *x;
    int rc;
    dt_emsg_t em;
    dt_ring_t *ring;
    int created; /* atomic: the ring exists (or failed), it may be aborted */
} rank_arg_t;

static void *rank_main(void *v)
{
    rank_arg_t *a = v;

    a->rc = dt_ring_nccl_new(a->rank, a->R, a->id, 0, a->timeout, &a->ring, &a->em);
    __atomic_store_n(&a->created, 1, __ATOMIC_RELEASE);
    if (a->rc == 0)
        a->rc = run_ring(a->ring, a->p, a->s, 1, a->x, &a->em);
    return NULL;
}

/* A dense ring of R ranks over NCCL, forward and backward; with abort_rank,
 * that rank's ring is aborted soon after it is created (as a peer failure
 * would) and must end with DT_ECOMM, or 0 if it finished first, while the
 * others time out (2 s) instead of hanging. */
static void nccl_ring(unsigned seed, int R, int causal, int lay, int abort_rank)
{
    dt_attn_spec_t s = { .T = 96, .H = 4, .Hkv = 2, .D = 64, .causal = causal,
                         .layout = lay ? DT_LAYOUT_ZIGZAG : DT_LAYOUT_CONTIGUOUS };
    rank_arg_t *a = calloc((size_t)R, sizeof(*a));
    pthread_t *th = calloc((size_t)R, sizeof(*th));
    unsigned char id[DT_RING_ID_BYTES];
    dt_emsg_t em = { { 0 } };
    problem_t p;
    result_t x;

    problem_init(&p, &s, DT_BF16, seed * 13 + (unsigned)R);
    reference_dense(&p);
    result_init(&x, &s);
    GC_OK(dt_ring_nccl_id(id, &em), em);
    for (int r = 0; r < R; r++) {
        a[r].rank = r;
        a[r].R = R;
        a[r].timeout = abort_rank >= 0 ? 2.0 : 60.0;
        memcpy(a[r].id, id, sizeof(id));
        a[r].p = &p;
        a[r].s = &s;
        a[r].x = &x;
        if (pthread_create(&th[r], NULL, rank_main, &a[r]) != 0) {
            gc_check(0, "pthread_create for rank %d", r);
            exit(gc_done());
        }
    }
    if (abort_rank >= 0) {
        while (!__atomic_load_n(&a[abort_rank].created, __ATOMIC_ACQUIRE))
            usleep(100);
        usleep(200 + (seed % 7) * 300);
        if (a[abort_rank].ring)
            dt_ring_abort(a[abort_rank].ring, "peer failure event (sim)");
    }
    for (int r = 0; r < R; r++)
        pthread_join(th[r], NULL);
    if (abort_rank < 0) {
        int ok = 1;
        for (int r = 0; r < R; r++)
            if (a[r].rc) {
                ok = 0;
                printf("rank %d: %s\n", r, a[r].em.s);
            }
        errs_t e = compare(&p, &x, 1);
        gc_check(ok && e.o < 1e-4 && e.lse < 1e-4 && e.dq < 0.05 && e.dk < 0.05 && e.dv < 0.05,
                 "sim seed %u nccl R=%d %s %s: o %.1e lse %.1e dq %.2f dk %.2f dv %.2f", seed, R,
                 dt_layout_name(s.layout), causal ? "causal" : "full", e.o, e.lse, e.dq, e.dk,
                 e.dv);
    } else {
        for (int r = 0; r < R; r++)
            printf("  abort test R=%d rank %d: rc %s: %s\n", R, r, dt_err_name(a[r].rc),
                   a[r].rc ? a[r].em.s : "");
        gc_check(a[abort_rank].rc == DT_ECOMM || a[abort_rank].rc == 0,
                 "sim nccl abort: aborted rank ends with DT_ECOMM (or finished first)");
    }
    for (int r = 0; r < R; r++)
        dt_ring_free(a[r].ring);
    result_free(&x);
    problem_free(&p);
    free(a);
    free(th);
}

int main(int argc, char **argv)
{
    unsigned nseed = argc > 1 ? (unsigned)atoi(argv[1]) : SMALL_SEEDS;
    long ops, queue;

    gc_require_device("test_ring_sched"); /* the simulator's one device */

    /* test_ring_cuda's checks but check_dense (ten rings of T = 768 take
     * over a minute here; small_local runs its cases at T = 96) */
    for (unsigned seed = 1; seed <= TEST_SEEDS; seed++) {
        sim_seed(seed, 0);
        check_rest();
    }
    for (unsigned seed = 1; seed <= nseed; seed++) {
        sim_seed(seed, (int)(seed % 3));
        small_local(seed);
        small_dilated(seed);
        for (int R = 2; R <= 4; R++)
            for (int causal = 0; causal <= 1; causal++)
                for (int lay = 0; lay < 2; lay++)
                    nccl_ring(seed, R, causal, lay, -1);
    }
    sim_seed(99, 0);
    nccl_ring(1, 3, 1, 1, 1);
    nccl_ring(2, 4, 1, 0, 2);
    sim_stats(&ops, &queue);
    printf("simulated %ld stream operations, longest queue %ld\n", ops, queue);
    return gc_done();
}
