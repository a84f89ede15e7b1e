/* SPDX-License-Identifier: MIT
 *
 * The GPU ring's stream/event schedule, checked without a GPU: the real
 * engine/attn/ring_cuda.c, dilated_cuda.c, ring_call.c and engine/comm/comm_nccl.c
 * run against the host simulator of tests/gpu/sim/sim_cuda.c, which
 * executes their stream operations in a random order that respects only
 * the dependencies they declare. Under it run the checks of
 * tests/gpu/test_ring_cuda.c (included, its main renamed),
 * small local rings (R = 1, 2, 3, 4, 8; contiguous and zigzag; causal or
 * not; forward and backward; each ring used twice), dilated branches
 * (segments on one rank, and segments crossing ranks: sub-rings, w = T,
 * straddling boundaries, zigzag segments over both runs of a rank, slivers
 * of one or two positions), and NCCL rings of R = 2..4 ranks as threads
 * (dense, dilated with crossing segments, some aborted by a peer, some
 * with a peer that never joins), all for several seeds and scheduling
 * policies. A missing event wait shows as a
 * FAIL (wrong result) or an abort (HAZARD, deadlock).
 *
 * This checks the order of the ring's work, not the kernels: those are the
 * CPU reference here. It never skips: the simulator reports one device.
 * Seeds and policies can be widened by hand: tests/gpu/test_ring_sched N
 * runs N seeds of the small rings (see also the SIM_* knobs in sim_cuda.c).
 */
#include "engine/attn/attn_block.h"
#include "kernels/attn_kernel.h"
#include "tests/gpu/sim/sim_cuda.h"

int test_main(void);
#define main test_main
#include "tests/gpu/test_ring_cuda.c"
#undef main

/* Seeds in `make check`: of test_ring_cuda's checks, and of the small
 * rings (policy seed % 3). */
#define TEST_SEEDS 2
#define SMALL_SEEDS 4

/* The errors a run may show: next to none through dt's kernels (the
 * simulator's are the reference itself); through cuDNN's stand-in, whose
 * partials are rounded to bf16 as cuDNN's are, the GPU tests' tolerances
 * (a wrong schedule shows as garbage or as the stand-in's NaN scratch). */
static double tol_o(void)
{
    return dt_gpu_attn_get() == DT_GPU_ATTN_DT ? 1e-4 : TOL_O_BF16;
}

static double tol_g(void)
{
    return dt_gpu_attn_get() == DT_GPU_ATTN_DT ? 0.05 : 1.0;
}

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
                    gc_check(e.o < tol_o() && e.lse < 1e-4 && e.dq < tol_g() && e.dk < tol_g() &&
                                 e.dv < tol_g() && x.fst.steps == expected_steps(&s, Rs[i]),
                             "sim seed %u local %s %s %s R=%d rep %d: o %.1e lse %.1e dq %.2f dk "
                             "%.2f dv %.2f steps %d", seed, dt_gpu_attn_name(dt_gpu_attn_get()),
                             dt_layout_name(s.layout), causal ? "causal" : "full", Rs[i],
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
        /* segments crossing ranks: sub-rings */
        { 2, DT_LAYOUT_CONTIGUOUS, 1, "96", "2" },  /* w = T */
        { 4, DT_LAYOUT_CONTIGUOUS, 0, "36", "3" },  /* straddling 24, 48; last (24) local */
        { 4, DT_LAYOUT_CONTIGUOUS, 1, "26", "2" },  /* rank 1 holds 24,25 of [0,26) */
        { 4, DT_LAYOUT_CONTIGUOUS, 1, "25", "5" },  /* rank 1 holds 24 of [0,25): offset 4,
                                                       in no head chunk (H=8: 4 chunks) */
        { 8, DT_LAYOUT_CONTIGUOUS, 1, "48", "4" },  /* 4 ranks of 12 per segment */
        { 3, DT_LAYOUT_CONTIGUOUS, 0, "12,48", "1,2" }, /* both straddle 32 and 64 */
        { 2, DT_LAYOUT_ZIGZAG, 0, "96", "2" },      /* both runs of rank 0, with a gap */
        { 3, DT_LAYOUT_ZIGZAG, 1, "96", "3" },      /* w = T, runs of 16 */
        { 4, DT_LAYOUT_ZIGZAG, 1, "24", "2" },      /* [24,48), [48,72): ranks 2,3 and 3,2 */
        { 4, DT_LAYOUT_ZIGZAG, 0, "32", "2" },      /* [32,64) covers both runs of rank 3 */
        { 8, DT_LAYOUT_ZIGZAG, 1, "6,24,96", "1,2,4" }, /* local, 4 ranks, all 8 */
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
        int rc = run_ring(ring, &p, &s, 1, &x, &em);
        if (rc != 0)
            printf("  sim seed %u dilated w=%s r=%s %s %s R=%d: rc %s: %s\n", seed, cs[i].w,
                   cs[i].r, dt_layout_name(s.layout), cs[i].causal ? "causal" : "full",
                   cs[i].R, dt_err_name(rc), em.s);
        errs_t e = compare(&p, &x, 1);
        gc_check(rc == 0 && e.o < tol_o() && e.lse < 1e-4 && e.dq < tol_g() && e.dk < tol_g() &&
                     e.dv < tol_g(),
                 "sim seed %u dilated w=%s r=%s %s %s R=%d: o %.1e lse %.1e dq %.2f dk %.2f "
                 "dv %.2f",
                 seed, cs[i].w, cs[i].r, dt_layout_name(s.layout),
                 cs[i].causal ? "causal" : "full", cs[i].R, e.o, e.lse, e.dq, e.dk, e.dv);
        dt_ring_free(ring);
        result_free(&x);
        problem_free(&p);
    }
}

/* One rank of an NCCL ring, run by its own thread. */
/* A dense ring of R ranks over NCCL, forward and backward; with segs and
 * dils, a dilated spec instead (H = 8), whose crossing segments run on
 * NCCL sub-rings. With abort_rank, that rank's ring is aborted soon after
 * it is created (as a peer failure would) and must end with DT_ECOMM, or 0
 * if it finished first, while the others time out (2 s) instead of
 * hanging. */
static void nccl_ring(unsigned seed, int R, int causal, int lay, int abort_rank,
                      const char *segs, const char *dils)
{
    dt_attn_spec_t s = { .T = 96, .H = segs ? 8 : 4, .Hkv = 2, .D = 64, .causal = causal,
                         .layout = lay ? DT_LAYOUT_ZIGZAG : DT_LAYOUT_CONTIGUOUS };
    rank_arg_t *a = calloc((size_t)R, sizeof(*a));
    dt_emsg_t em = { { 0 } };
    problem_t p;
    result_t x;

    if (segs)
        GC_OK(dt_attn_parse_branches(&s, segs, dils, &em), em);
    problem_init(&p, &s, DT_BF16, seed * 13 + (unsigned)R);
    if (segs)
        reference_dilated(&p);
    else
        reference_dense(&p);
    result_init(&x, &s);
    /* the simulator's one device serves every rank */
    nccl_threads(&p, &s, R, 1, abort_rank, -1, abort_rank >= 0 ? 2.0 : 60.0,
                 200 + (seed % 7) * 300, &x, a);
    if (abort_rank < 0) {
        int ok = 1;
        for (int r = 0; r < R; r++)
            if (a[r].rc) {
                ok = 0;
                printf("rank %d: %s\n", r, a[r].em.s);
            }
        errs_t e = compare(&p, &x, 1);
        gc_check(ok && e.o < tol_o() && e.lse < 1e-4 && e.dq < tol_g() && e.dk < tol_g() &&
                     e.dv < tol_g(),
                 "sim seed %u nccl R=%d %s %s%s%s%s%s: o %.1e lse %.1e dq %.2f dk %.2f dv %.2f",
                 seed, R, dt_layout_name(s.layout), causal ? "causal" : "full",
                 segs ? " dilated w=" : "", segs ? segs : "", segs ? " r=" : "",
                 dils ? dils : "", e.o, e.lse, e.dq, e.dk, e.dv);
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
}

/* A peer that creates its communicator and never joins the call (a dead
 * process): every other rank must end with DT_ECOMM when the watchdog's
 * 2 s pass without progress, dense and dilated, never hang. */
static void nccl_dead(int R, int dead, const char *segs, const char *dils)
{
    dt_attn_spec_t s = { .T = 96, .H = 8, .Hkv = 2, .D = 64, .causal = 1,
                         .layout = DT_LAYOUT_CONTIGUOUS };
    rank_arg_t *a = calloc((size_t)R, sizeof(*a));
    dt_emsg_t em = { { 0 } };
    problem_t p;
    result_t x;
    int ok = 1;

    if (segs)
        GC_OK(dt_attn_parse_branches(&s, segs, dils, &em), em);
    problem_init(&p, &s, DT_BF16, 77);
    result_init(&x, &s);
    double t0 = dt_clock_now();
    nccl_threads(&p, &s, R, 1, -1, dead, 2.0, 0, &x, a);
    double took = dt_clock_now() - t0;
    for (int r = 0; r < R; r++) {
        if (r != dead && (a[r].rc != DT_ECOMM || strstr(a[r].em.s, "no progress") == NULL))
            ok = 0;
        printf("  dead peer R=%d rank %d%s: rc %s: %s\n", R, r, r == dead ? " (dead)" : "",
               dt_err_name(a[r].rc), a[r].rc ? a[r].em.s : "");
        dt_ring_free(a[r].ring);
    }
    gc_check(ok && took < 30,
             "sim nccl R=%d %s, rank %d never joins: every other rank ends with DT_ECOMM "
             "(no progress) in %.1f s",
             R, segs ? "dilated" : "dense", dead, took);
    result_free(&x);
    problem_free(&p);
    free(a);
}

/* Dilated specs with crossing segments on NCCL rings of threads (T = 96;
 * causal alternates with the seed). */
static const struct {
    int R, lay;
    const char *w, *r;
} nccl_dil[] = {
    { 2, 0, "96", "2" },        /* w = T */
    { 2, 1, "12,96", "1,2" },   /* local; both runs of rank 0 with a gap */
    { 3, 0, "48", "3" },        /* straddling 32, 64; GQA r=3 */
    { 3, 1, "32", "2" },        /* runs of 16: ranks 0,1 / 2,2 (adjacent) / 1,0 */
    { 4, 0, "26,48", "2,4" },   /* slivers of 2 positions; two ranks per segment */
    { 4, 1, "32", "2" },        /* [32,64) covers both runs of rank 3 */
};

/* dt_attn_pieces (engine/attn/attn_block.h) against brute force: every
 * (rank, source) block of every layout, R = 1..8, causal: the pieces cover
 * exactly the visible pairs, once each, every piece row sees a key, and a
 * zigzag block is at most two pieces (one for the diagonal and the other
 * steps). */
static void check_pieces(void)
{
    static const enum dt_layout lays[] = { DT_LAYOUT_CONTIGUOUS, DT_LAYOUT_ZIGZAG,
                                           DT_LAYOUT_BALANCED };
    int bad = 0, blocks = 0, most_zz = 0;

    for (size_t li = 0; li < sizeof(lays) / sizeof(lays[0]); li++)
        for (int R = 1; R <= 8; R++) {
            const int64_t T = 64 * R * 2, c = T / R;
            unsigned char *seen = malloc((size_t)(c * c));
            for (int me = 0; me < R; me++)
                for (int src = 0; src < R; src++) {
                    dt_run_t qr[DT_LAYOUT_MAXRUNS], kr[DT_LAYOUT_MAXRUNS];
                    dt_attn_piece_t pc[DT_ATTN_MAXPIECES];
                    int64_t qp[1024], kp[1024];
                    int nq = dt_layout_runs(lays[li], T, R, me, qr);
                    int nk = dt_layout_runs(lays[li], T, R, src, kr);
                    int n = dt_attn_pieces(qr, nq, kr, nk, 1, pc), ok = 1;
                    dt_layout_positions(lays[li], T, R, me, qp);
                    dt_layout_positions(lays[li], T, R, src, kp);
                    memset(seen, 0, (size_t)(c * c));
                    for (int i = 0; i < n && ok; i++) {
                        const dt_attn_piece_t *p = &pc[i];
                        for (int64_t a = 0; a < p->nq && ok; a++) {
                            int any = 0;
                            for (int64_t b = 0; b < p->nk; b++)
                                if (p->shift == DT_CUDNN_FULL || b <= a + p->shift) {
                                    any = 1;
                                    ok = ok && seen[(p->qrow + a) * c + p->krow + b]++ == 0;
                                }
                            ok = ok && any;
                        }
                    }
                    for (int64_t a = 0; a < c && ok; a++)
                        for (int64_t b = 0; b < c && ok; b++)
                            ok = seen[a * c + b] == (kp[b] <= qp[a]);
                    if (lays[li] == DT_LAYOUT_ZIGZAG)
                        most_zz = n > most_zz ? n : most_zz;
                    bad += !ok;
                    blocks++;
                    if (!ok)
                        printf("  pieces wrong: %s R=%d rank %d source %d (%d pieces)\n",
                               dt_layout_name(lays[li]), R, me, src, n);
                }
            free(seen);
        }
    gc_check(bad == 0 && most_zz == 1,
             "attn_block pieces: %d blocks of 3 layouts, R 1..8, cover exactly the causal pairs "
             "(%d wrong); a zigzag block is %d piece(s)", blocks, bad, most_zz);
}

/* dt_attn_piece_rows against brute force: the query chunks of causal
 * pieces (diagonal, shifted, a full piece) cover exactly the piece's
 * visible pairs, once each; a chunk's keys end at or after its rows' last
 * visible key, and before the piece's, at a multiple of 128 or the
 * piece's end, in at most four lengths short of it (cuDNN plans). */
static void check_piece_rows(void)
{
    static const dt_attn_piece_t wholes[] = {
        { 0, 1000, 0, 1000, 0 },   { 0, 1000, 0, 1300, 300 }, { 7, 640, 5, 700, 64 },
        { 0, 333, 0, 2000, 1600 }, { 0, 500, 0, 500, DT_CUDNN_FULL },
    };
    static const int64_t steps[] = { 128, 256, 384 };
    int bad = 0, chunks = 0, trimmed = 0;

    for (size_t w = 0; w < sizeof(wholes) / sizeof(wholes[0]); w++)
        for (size_t si = 0; si < sizeof(steps) / sizeof(steps[0]); si++) {
            const dt_attn_piece_t *W = &wholes[w];
            unsigned char *seen = calloc((size_t)(W->nq * W->nk), 1);
            int ok = 1, nlen = 0;
            int64_t lens[64];
            for (int64_t r0 = 0; r0 < W->nq; r0 += steps[si]) {
                dt_attn_piece_t p = dt_attn_piece_rows(W, r0, steps[si]);
                int64_t last = -1;
                int known = p.nk == W->nk;
                for (int i = 0; i < nlen; i++)
                    known = known || lens[i] == p.nk;
                if (!known && nlen < 64)
                    lens[nlen++] = p.nk;
                chunks++;
                trimmed += p.nk < W->nk;
                ok = ok && p.krow == W->krow && p.qrow == W->qrow + r0 && p.nk <= W->nk &&
                     (p.nk % 128 == 0 || p.nk == W->nk);
                for (int64_t a = 0; a < p.nq && ok; a++)
                    for (int64_t b = 0; b < p.nk; b++)
                        if (p.shift == DT_CUDNN_FULL || b <= a + p.shift) {
                            ok = ok && seen[(r0 + a) * W->nk + b]++ == 0;
                            last = b > last ? b : last;
                        }
                /* the chunk's last row sees no key past its nk */
                if (W->shift != DT_CUDNN_FULL)
                    ok = ok && (r0 + p.nq - 1 + W->shift >= W->nk - 1 ? last == W->nk - 1
                                                                      : last == r0 + p.nq - 1 +
                                                                                   W->shift);
            }
            for (int64_t a = 0; a < W->nq && ok; a++)
                for (int64_t b = 0; b < W->nk && ok; b++)
                    ok = seen[a * W->nk + b] ==
                         (W->shift == DT_CUDNN_FULL || b <= a + W->shift);
            ok = ok && nlen <= 4;
            if (!ok)
                printf("  chunks wrong: piece %zu, step %lld\n", w, (long long)steps[si]);
            bad += !ok;
            free(seen);
        }
    gc_check(bad == 0 && trimmed > 0,
             "attn_block chunks of rows: %d chunks of 5 pieces cover exactly their pairs (%d "
             "wrong), %d with their keys cut short", chunks, bad, trimmed);
}

int main(int argc, char **argv)
{
    unsigned nseed = argc > 1 ? (unsigned)atoi(argv[1]) : SMALL_SEEDS;
    long ops, queue;

    gc_require_device("test_ring_sched"); /* the simulator's one device */
    check_pieces();
    check_piece_rows();
    dt_gpu_attn_set(DT_GPU_ATTN_DT);

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
                    nccl_ring(seed, R, causal, lay, -1, NULL, NULL);
        for (size_t i = 0; i < sizeof(nccl_dil) / sizeof(nccl_dil[0]); i++)
            nccl_ring(seed, nccl_dil[i].R, (int)((seed + i) & 1), nccl_dil[i].lay, -1,
                      nccl_dil[i].w, nccl_dil[i].r);
    }
    /* again with blocks through cuDNN's stand-in (kernels/cuda/attn_cudnn.h):
     * pieces, half partials, scratch (two seeds) */
    dt_gpu_attn_set(DT_GPU_ATTN_CUDNN);
    for (unsigned seed = 1; seed <= 2; seed++) {
        sim_seed(seed + 10, (int)(seed % 3));
        small_local(seed);
        small_dilated(seed);
        for (int R = 2; R <= 4; R += 2)
            nccl_ring(seed, R, 1, (int)(seed & 1), -1, NULL, NULL);
    }
    dt_gpu_attn_set(DT_GPU_ATTN_DT);
    sim_seed(99, 0);
    nccl_ring(1, 3, 1, 1, 1, NULL, NULL);
    nccl_ring(2, 4, 1, 0, 2, NULL, NULL);
    nccl_dead(3, 1, NULL, NULL);
    nccl_dead(4, 2, "26,48", "2,4");
    sim_stats(&ops, &queue);
    printf("simulated %ld stream operations, longest queue %ld\n", ops, queue);
    return gc_done();
}
