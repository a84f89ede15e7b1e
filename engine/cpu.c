/* SPDX-License-Identifier: MIT
 *
 * This process's CPU, as dtengine (and the benchmarks) set it up and
 * report it: the OpenBLAS core, chosen by common/cpuinfo.h and applied by
 * running the program again before anything starts, and the line that
 * says what ran (the CPU, the attention kernel, the BLAS core and who
 * chose it). Not here: the choice itself (common/cpuinfo.c) or the
 * attention kernel's (kernels/cpu/attn_cpu.c).
 */
#include "config.h"

#include <cblas.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "common/cpuinfo.h"
#include "common/log.h"
#include "engine/cpu.h"
#include "kernels/cpu/attn_cpu.h"

/* DT_BLAS_CORE_WAS: set by dt_cpu_blas_setup for the image it starts, naming the
 * core OpenBLAS had picked by itself (for the cpu line). */
#define BLAS_WAS "DT_BLAS_CORE_WAS"

/* The BLAS core (common/cpuinfo.h dt_cpu_blas_core): when OpenBLAS runs a
 * core older than this CPU's instructions, run this program again with
 * OPENBLAS_CORETYPE set, which OpenBLAS reads only as it loads. Called
 * before MPI or PMIx start and before any thread, so the new image starts
 * as this one did (same pid, arguments and environment but the two
 * variables); the choice is cpuid's alone, so every rank makes the same
 * one. A value the user set is kept; the new image sees it set and does
 * not come back here. When exec fails, one warning says what to set. */
void dt_cpu_blas_setup(char **argv)
{
    /* DT_TEST_BLAS_CORE: the tests' stand-in for an OpenBLAS that does not
     * know this CPU (dtengine(1)); the new image runs without it */
    const char *pretend = getenv("DT_TEST_BLAS_CORE");
    const char *running = pretend != NULL && *pretend ? pretend : openblas_get_corename();
    const char *want = dt_cpu_blas_core(getenv("OPENBLAS_CORETYPE"), running,
                                        dt_cpu_this()->features);

    if (want == NULL) {
        const char *was = getenv(BLAS_WAS);
        if (was != NULL && *was != '\0' &&
            dt_cpu_blas_core(NULL, running, dt_cpu_this()->features) != NULL)
            dt_log_warn("OpenBLAS kept its %s core though OPENBLAS_CORETYPE=%s (a build without "
                        "DYNAMIC_ARCH?)",
                        running, getenv("OPENBLAS_CORETYPE"));
        return;
    }
    if (setenv("OPENBLAS_CORETYPE", want, 1) == 0 && setenv(BLAS_WAS, running, 1) == 0 &&
        unsetenv("DT_TEST_BLAS_CORE") == 0) {
        fflush(NULL);
        execv("/proc/self/exe", argv);
    }
    int e = errno;
    unsetenv("OPENBLAS_CORETYPE");
    unsetenv(BLAS_WAS);
    dt_log_warn("OpenBLAS runs its %s core on this CPU (%s), slower than its %s core here, "
                "and dtengine could not start again with it (/proc/self/exe: %s): set "
                "OPENBLAS_CORETYPE=%s for dtengine",
                running, dt_cpu_describe(), want, strerror(e), want);
}

/* One line for whoever reads this rank's log: the CPU, the attention
 * kernel tried first, and the BLAS core and who chose it. */
void dt_cpu_line(void)
{
    const char *was = getenv(BLAS_WAS), *set = getenv("OPENBLAS_CORETYPE");
    char by[80];

    if (was != NULL && *was != '\0')
        snprintf(by, sizeof(by), "dtengine blas_core_was=%.40s", was);
    else
        snprintf(by, sizeof(by), "%s", set != NULL && *set != '\0' ? "user" : "openblas");
    dt_log_info("cpu attn_kernel=%s blas_core=%s blas_core_by=%s model=%s",
                dt_attn_cpu_kernel_first(), openblas_get_corename(), by, dt_cpu_describe());
}
