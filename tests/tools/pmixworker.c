/* SPDX-License-Identifier: MIT
 *
 * pmixworker: the MPI rank that tests/tools/pmixhost spawns under agent/pmix.c
 * (tests/integration/pmix.sh). It does what a dtengine rank does with its
 * PMIx server and no more: MPI_Init, a PMIx handler for process-failure
 * events (PMIx_Init is reference-counted and shares Open MPI's client), a
 * ring of MPI_Sendrecv and an MPI_Allreduce whose result it prints:
 *
 *   pmixworker: rank R of N ring ok sum S        (S = N(N+1)/2)
 *
 * With --hold SECONDS it then waits in MPI_Barrier, rank 0 after sleeping
 * that long, so that the host can kill a rank while the others are blocked
 * in MPI. A failure event makes the handler print
 *
 *   pmixworker: rank R got failure of rank N after X ms
 *
 * (X counted from the end of MPI_Init) and leave with _exit(4) from
 * libpmix's thread. Exit codes: 0 done, 1 MPI or PMIx error, 2 usage,
 * 4 a peer failed. Not a benchmark and not a model of dtengine's loop.
 */
#include "config.h"

#include <mpi.h>
#include <pmix.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

static int my_rank = -1;
static pmix_proc_t me;
static struct timespec t_init;

static double ms_since(const struct timespec *t0)
{
    struct timespec t;

    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)(t.tv_sec - t0->tv_sec) * 1e3 + (double)(t.tv_nsec - t0->tv_nsec) / 1e6;
}

/* libpmix's event thread: the main thread may be blocked in MPI on the dead
 * peer, so report with one write(2) and leave from here. */
static void on_failure(size_t id, pmix_status_t status, const pmix_proc_t *source,
                       pmix_info_t info[], size_t ninfo, pmix_info_t results[], size_t nresults,
                       pmix_event_notification_cbfunc_fn_t cbfunc, void *cbdata)
{
    char line[256];
    int n;

    if (status == PMIX_ERR_LOST_CONNECTION)
        n = snprintf(line, sizeof(line), "pmixworker: rank %d lost its PMIx server after %.1f ms\n",
                     my_rank, ms_since(&t_init));
    else if (source == NULL || !PMIX_CHECK_NSPACE(source->nspace, me.nspace) ||
             source->rank == me.rank) {
        /* not about a peer of ours: let the other handlers have it */
        if (cbfunc)
            cbfunc(PMIX_SUCCESS, NULL, 0, NULL, NULL, cbdata);
        return;
    } else
        n = snprintf(line, sizeof(line),
                     "pmixworker: rank %d got failure of rank %d after %.1f ms (%s)\n", my_rank,
                     (int)source->rank, ms_since(&t_init), PMIx_Error_string(status));
    if (n > 0 && write(STDOUT_FILENO, line, (size_t)n) < 0)
        _exit(4);
    _exit(4);
}

static void usage(void)
{
    fprintf(stderr, "usage: pmixworker [--hold SECONDS | --init-only]\n");
}

int main(int argc, char **argv)
{
    pmix_status_t codes[] = { PMIX_ERR_PROC_ABORTED_BY_SIG, PMIX_ERR_PROC_ABORTED,
                              PMIX_ERR_PROC_TERM_WO_SYNC, PMIX_ERR_PROC_KILLED_BY_CMD,
                              PMIX_ERR_LOST_CONNECTION };
    int hold = -1, init_only = 0, size = 0, left, right, from = -1;
    long long sum = 0, mine;
    pmix_status_t st;

    for (int i = 1; i < argc; i++) {
        if (strcmp(argv[i], "--hold") == 0 && i + 1 < argc) {
            char *end;
            long v = strtol(argv[++i], &end, 10);
            if (*end || v < 0 || v > 3600) {
                fprintf(stderr, "pmixworker: --hold %s: not 0 to 3600 seconds\n", argv[i]);
                return 2;
            }
            hold = (int)v;
        } else if (strcmp(argv[i], "--init-only") == 0) {
            init_only = 1;
        } else {
            usage();
            return 2;
        }
    }
    setvbuf(stdout, NULL, _IOLBF, 0);

    if (MPI_Init(&argc, &argv) != MPI_SUCCESS)
        return 1;
    clock_gettime(CLOCK_MONOTONIC, &t_init);
    MPI_Comm_rank(MPI_COMM_WORLD, &my_rank);
    MPI_Comm_size(MPI_COMM_WORLD, &size);

    if ((st = PMIx_Init(&me, NULL, 0)) != PMIX_SUCCESS) {
        fprintf(stderr, "pmixworker: rank %d: PMIx_Init: %s\n", my_rank, PMIx_Error_string(st));
        MPI_Abort(MPI_COMM_WORLD, 1);
    }
    if ((int)me.rank != my_rank) {
        fprintf(stderr, "pmixworker: MPI rank %d but PMIx rank %u\n", my_rank, me.rank);
        MPI_Abort(MPI_COMM_WORLD, 1);
    }
    /* blocking registration (no cbfunc): a positive handler id or an error */
    st = PMIx_Register_event_handler(codes, sizeof(codes) / sizeof(codes[0]), NULL, 0, on_failure,
                                     NULL, NULL);
    if (st < 0) {
        fprintf(stderr, "pmixworker: rank %d: PMIx_Register_event_handler: %s\n", my_rank,
                PMIx_Error_string(st));
        MPI_Abort(MPI_COMM_WORLD, 1);
    }

    if (init_only) {
        /* one agent of several, alone: no peer to talk to, only the
         * fences of MPI_Init and MPI_Finalize */
        printf("pmixworker: rank %d of %d initialised\n", my_rank, size);
        PMIx_Finalize(NULL, 0);
        MPI_Finalize();
        return 0;
    }
    right = (my_rank + 1) % size;
    left = (my_rank + size - 1) % size;
    MPI_Sendrecv(&my_rank, 1, MPI_INT, right, 7, &from, 1, MPI_INT, left, 7, MPI_COMM_WORLD,
                 MPI_STATUS_IGNORE);
    mine = my_rank + 1;
    MPI_Allreduce(&mine, &sum, 1, MPI_LONG_LONG, MPI_SUM, MPI_COMM_WORLD);
    printf("pmixworker: rank %d of %d ring %s sum %lld\n", my_rank, size,
           from == left ? "ok" : "WRONG", sum);

    if (hold >= 0) {
        if (my_rank == 0)
            sleep((unsigned)hold);
        MPI_Barrier(MPI_COMM_WORLD);
    }
    PMIx_Finalize(NULL, 0);
    MPI_Finalize();
    return from == left && sum == (long long)size * (size + 1) / 2 ? 0 : 1;
}
