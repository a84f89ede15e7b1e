/* SPDX-License-Identifier: MIT
 *
 * dtengine: the compute worker of dt. A plain PMIx application: under
 * mpirun, `srun --mpi=pmix` or dtagentd it is one rank of a job; started
 * alone it is a job of one rank. main() joins the job, opens the channel to
 * dtagentd when it runs under one (engine/wlink.h; nothing otherwise),
 * dispatches to the subcommand table, and leaves the job.
 */
#include "config.h"

#include <cblas.h>
#include <errno.h>
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "common/log.h"
#include "common/proto.h"
#include "common/text.h"
#include "engine/attn/attn.h"
#ifdef HAVE_CUDA
#include "engine/attn/ring_cuda.h"
#endif
#include "engine/cmd/agree.h"
#include "engine/cmd/cmd.h"
#include "engine/comm/comm.h"
#include "engine/cpu.h"
#include "engine/wlink.h"
#include "kernels/attn_kernel.h"
#include "kernels/cpu/attn_cpu.h"

static const struct command {
    const char *name;
    int (*fn)(dt_comm_t *comm, int argc, char **argv);
    const char *summary;
} commands[] = {
    { "attn", dt_cmd_attn, "exact attention (dense ring or dilated) over the job's ranks" },
    { "prefill", dt_cmd_prefill, "forward over one long sequence, checkpointed per layer" },
    { "train", dt_cmd_train, "train the LLaMA-3 model, sequence split over the ranks" },
};

/* DT_CPUS ("0-31,64-95", the kernel's cpulist format): dtagentd's CPUs
 * near this worker's GPU. Pinned to them before any thread starts; a
 * list that does not parse, or names no CPU this process may use, leaves
 * the affinity as it is, with a warning. */
static void pin_cpus(void)
{
    const char *v = getenv("DT_CPUS"), *p = v;
    cpu_set_t set;

    if (v == NULL || *v == '\0')
        return;
    CPU_ZERO(&set);
    while (*p) {
        char *end;
        long a = strtol(p, &end, 10), b = a;
        if (end == p || a < 0 || a >= CPU_SETSIZE)
            goto bad;
        p = end;
        if (*p == '-') {
            b = strtol(p + 1, &end, 10);
            if (end == p + 1 || b < a || b >= CPU_SETSIZE)
                goto bad;
            p = end;
        }
        for (long c = a; c <= b; c++)
            CPU_SET((int)c, &set);
        if (*p == ',')
            p++;
        else if (*p != '\0')
            goto bad;
    }
    if (sched_setaffinity(0, sizeof(set), &set) == 0)
        return;
    dt_log_warn("DT_CPUS=%s: %s; the affinity stays as it is", v, strerror(errno));
    return;
bad:
    dt_log_warn("DT_CPUS=%s: not a CPU list such as 0-31,64-95; the affinity stays as it is", v);
}

static void usage(FILE *f)
{
    fprintf(f, "usage: dtengine COMMAND [OPTIONS]\n\ncommands:\n");
    for (size_t i = 0; i < sizeof(commands) / sizeof(commands[0]); i++)
        fprintf(f, "  %-8s %s\n", commands[i].name, commands[i].summary);
    fprintf(f, "  %-8s %s\n", "devices", "the GPUs this process can see (joins no job)");
    fprintf(f, "\n'dtengine COMMAND --help' for a command's options; see dtengine(1).\n");
}

int main(int argc, char **argv)
{
    dt_comm_t *comm = NULL;
    dt_emsg_t em = { "" };
    int code, rc;

    dt_log_init("dtengine", DT_LOG_INFO);
    if (argc < 2 || strcmp(argv[1], "--help") == 0 || strcmp(argv[1], "-h") == 0) {
        usage(argc < 2 ? stderr : stdout);
        return argc < 2 ? DT_EXIT_INPUT : DT_EXIT_OK;
    }
    if (strcmp(argv[1], "--version") == 0) {
        printf("dtengine %s\n", PACKAGE_VERSION);
        return DT_EXIT_OK;
    }
    if (strcmp(argv[1], "devices") == 0)
        return dt_cmd_devices(argc - 1, argv + 1);
    const struct command *cmd = NULL;
    for (size_t i = 0; i < sizeof(commands) / sizeof(commands[0]); i++)
        if (strcmp(argv[1], commands[i].name) == 0)
            cmd = &commands[i];
    if (cmd == NULL) {
        fprintf(stderr, "dtengine: unknown command '%s'\n", argv[1]);
        usage(stderr);
        return DT_EXIT_INPUT;
    }

    dt_cpu_blas_setup(argv);
    pin_cpus();
    /* the attention kernels: $DT_ATTN_KERNEL names the CPU's or the GPU's
     * (kernels/attn_kernel.h), the other device's stays auto */
    const char *kern = getenv("DT_ATTN_KERNEL");
    dt_gpu_attn_t gk = DT_GPU_ATTN_AUTO;
    if (dt_gpu_attn_parse(kern, &gk) == 0) {
        dt_gpu_attn_set(gk);
        dt_attn_cpu_kernel_set("auto");
    } else if (dt_attn_cpu_kernel_set(kern) < 0) {
        char *shown = dt_text_escape(kern, 0);
        dt_log_warn("DT_ATTN_KERNEL '%s' is not one of %s, or this CPU cannot run it, nor a GPU "
                    "kernel (%s); using auto", shown, dt_attn_cpu_kernel_names(),
                    dt_gpu_attn_names());
        free(shown);
        dt_attn_cpu_kernel_set("auto");
        dt_gpu_attn_set(DT_GPU_ATTN_AUTO);
    } else {
        dt_gpu_attn_set(DT_GPU_ATTN_AUTO);
    }
    /* one BLAS thread per rank unless a command says otherwise */
    openblas_set_num_threads(1);
    if (dt_comm_new(&argc, &argv, &comm, &em) < 0) {
        fprintf(stderr, "dtengine: %s\n", em.s);
        return DT_EXIT_FAILURE;
    }
    if (dt_comm_size(comm) > 1) {
        char tag[32];
        snprintf(tag, sizeof(tag), "rank=%d", dt_comm_rank(comm));
        dt_log_set_tag(tag);
    }
    /* every rank learns whether any could not reach its agent, so none is
     * left waiting in a collective for a rank that gave up */
    rc = dt_wlink_open(dt_comm_rank(comm), &em);
    if ((rc = dt_agree_report(comm, rc, "dtengine", em.s, NULL)) < 0) {
        dt_wlink_close();
        dt_comm_free(comm);
        return dt_exit_code(rc);
    }
    /* what runs: rank 0 says it, and under an agent every rank (each has
     * its own log) */
    int help = 0;
    for (int i = 2; i < argc; i++)
        help |= strcmp(argv[i], "--help") == 0 || strcmp(argv[i], "-h") == 0 ||
                strcmp(argv[i], "--print-settings") == 0;
    if (!help && (dt_comm_rank(comm) == 0 || dt_wlink_active()))
        dt_cpu_line();
    /* a long ring step keeps the agent hearing from us */
    dt_attn_set_tick(dt_wlink_tick);
#ifdef HAVE_CUDA
    dt_ring_set_tick(dt_wlink_tick);
#endif
    code = cmd->fn(comm, argc - 1, argv + 1);
    if (code == DT_EXIT_DEVICE) {
        /* our GPU failed and we did not wait for the peers (agree.h):
         * MPI_Finalize would wait for them */
        fflush(NULL);
        dt_wlink_close();
        _exit(code);
    }
    dt_wlink_close();
    dt_comm_free(comm);
    return code;
}
