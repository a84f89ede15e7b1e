/* SPDX-License-Identifier: MIT
 *
 * The OpenBLAS core and the cpu line of a dtengine process (engine/cpu.c).
 */
#ifndef DT_ENGINE_CPU_H
#define DT_ENGINE_CPU_H

/* When OpenBLAS runs a core older than this CPU's instructions
 * (common/cpuinfo.h dt_cpu_blas_core), execute /proc/self/exe again with
 * argv and OPENBLAS_CORETYPE set to the core to use: returns only when
 * nothing is to be done, or exec failed (then one warning says what to
 * set). Call first in main(), before MPI, PMIx or any thread starts;
 * argv must end with NULL, as main's does. Environment: OPENBLAS_CORETYPE
 * (a value set is never overridden), DT_TEST_BLAS_CORE (tests: the core
 * OpenBLAS is taken to run). */
void dt_cpu_blas_setup(char **argv);

/* Log (stderr, dt_log_info) "cpu attn_kernel=K blas_core=C
 * blas_core_by=WHO [blas_core_was=C0] model=DESCRIPTION": WHO is openblas
 * (its own choice), user (OPENBLAS_CORETYPE) or dtengine (then C0 is what
 * OpenBLAS had chosen). */
void dt_cpu_line(void);

#endif /* DT_ENGINE_CPU_H */
