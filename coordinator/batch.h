/* SPDX-License-Identifier: MIT
 *
 * The batch job dt submits for one job: sbatch's options and the script
 * that starts one dtagentd per node with srun. A pure function of the
 * job, its plan and the coordinator's configuration, so `dtctl submit
 * --dry-run` shows exactly what would be submitted. The script carries
 * #SBATCH lines equal to the options, so it can also be given to sbatch
 * by hand.
 *
 * What the script does, and why:
 *  - `srun --ntasks-per-node=1 --kill-on-bad-exit=0`: one agent per node;
 *    an agent that dies does not take the others down (the coordinator
 *    decides what happens next).
 *  - `--signal=B:SIG@lead` (SIG the job's warning signal, USR2 unless the
 *    spec or dt.conf says USR1) reaches the batch shell only: a trap
 *    forwards SIG to srun, which forwards it to every process of the step;
 *    the agents (told SIG with --signal) tell the coordinator, which
 *    checkpoints, stops the workers and requeues; the workers ignore it.
 *    Only USR1 and USR2 can be used: srun turns TERM, INT, HUP and QUIT
 *    into a kill of the step and forwards no other signal. USR2 is the
 *    default because NCCL may be set to catch USR1
 *    (NCCL_PROXY_DUMP_SIGNAL=10, caught unconditionally by NCCL 2.12 and
 *    2.13): a job whose environment sets NCCL_PROXY_DUMP_SIGNAL to its
 *    warning signal is refused, and the script checks again after
 *    slurm_setup ran.
 *  - `--requeue` so the coordinator may requeue it; `--open-mode=append`
 *    so a requeue does not truncate the output of the runs before.
 *  - The script's exit status is the agents': 0 the dt job completed,
 *    1 it failed for good (never requeue), 75 (EX_TEMPFAIL) dt wants it
 *    run again; a site may list 75 in slurm.conf's RequeueExit.
 *
 * Not here: the submission itself (slurm.c), the policy (alloc.c).
 */
#ifndef DT_COORD_BATCH_H
#define DT_COORD_BATCH_H

#include <stdint.h>

#include "common/err.h"
#include "common/proto.h" /* DT_EXIT_REQUEUE */
#include "coordinator/slurm.h"
#include "spec/spec.h"

/* The coordinator's side (dt.conf(5) keys in brackets). */
typedef struct dt_batch_conf {
    const char *coord_addr;   /* HOST:PORT the agents connect to [slurm_coord_address] */
    const char *agent_path;   /* dtagentd on the nodes [slurm_agent] */
    const char *engine_path;  /* dtengine on the nodes, NULL: the agent finds it [slurm_engine] */
    const char *munge_socket; /* passed to the agents, NULL: libmunge's default [munge_socket] */
    const char *output_dir;   /* where dt-JOB.out goes [slurm_output_dir] */
    const char *setup;        /* a shell file the script sources first, or NULL [slurm_setup] */
    const char *const *env;   /* NAME=VALUE the script exports, NULL-terminated, or NULL [slurm_env] */
    int64_t hang_timeout_ms;  /* passed as --hang-timeout when > 0 */
    const char *signal;       /* warning signal of jobs that set none, NULL: DT_BATCH_SIGNAL [slurm_signal] */
    uint32_t uid, gid;        /* the job's owner */
    int64_t created_ms;       /* the job's creation time (jobs.created_ms): names its Slurm job */
} dt_batch_conf_t;

#define DT_BATCH_SIGNAL_LEAD_S 120 /* default --signal lead when the spec sets none */
#define DT_BATCH_SIGNAL "USR2"     /* default warning signal (see above for why) */

/* SIGUSR1 or SIGUSR2 for "USR1" or "USR2" (the spec's and Slurm's names);
 * 0 for anything else. */
int dt_batch_signal_number(const char *name);
/* "USR1" or "USR2"; "?" for another number. */
const char *dt_batch_signal_name(int sig);

/* Fill *d for dt job `job` (0 for a dry run) with spec `s`: `nodes` nodes of
 * `ranks_per_node` ranks for the plan, plus ceil(spares / ranks_per_node)
 * spare nodes. `exclude` (or NULL) is added to the spec's exclude list.
 * The job name is "dt-JOB.TAG-NAME": TAG is bc->created_ms in base 36,
 * so that the name is the dt job's alone (another coordinator's job JOB
 * was not created in the same millisecond) and the same after a restart
 * of dtcoordd, which looks a job up by it before submitting again; NAME
 * is the spec's name cut to 40 characters, characters outside
 * [A-Za-z0-9._-] replaced by '_'. --time is the spec's time_limit
 * rounded up to minutes; the signal lead is the spec's signal_lead, else
 * DT_BATCH_SIGNAL_LEAD_S, and at most half the time limit; the signal is
 * the spec's, else bc->signal, else DT_BATCH_SIGNAL; GPUs per node for a
 * GPU preset; --cpus-per-task = ranks_per_node on the cpu preset.
 * Returns 0, or DT_EINVAL naming the field (a path or address with a
 * quote or a newline, no agent path, a signal other than USR1 and USR2,
 * a signal equal to the NCCL_PROXY_DUMP_SIGNAL of the job's environment).
 * On error *d is cleared. */
int dt_batch_make(int64_t job, const dt_spec_t *s, int nodes, int ranks_per_node,
                  const char *exclude, const dt_batch_conf_t *bc, dt_slurm_desc_t *d,
                  dt_emsg_t *em);

#endif /* DT_COORD_BATCH_H */
