/* SPDX-License-Identifier: MIT
 *
 * The libslurm edge of dtcoordd: submit a batch job, read a job's state,
 * requeue it with nodes excluded, cancel it. Every call is a blocking RPC
 * to slurmctld (up to its MessageTimeout): call them from a worker thread
 * (coordinator/alloc.c runs them on libuv's thread pool), never from the
 * loop thread. They are serialised by a mutex inside, so any thread may
 * call any of them. Slurm's errors are translated here, once: the message
 * names the call, the Slurm job and slurm_strerror's text.
 *
 * Built without libslurm (configure found none, or --without-slurm), every
 * call returns DT_ENOTSUP "dtcoordd was built without libslurm".
 *
 * Not here: what dt asks of Slurm for a job (batch.c builds the
 * description), or what dt does with a state (alloc.c).
 */
#ifndef DT_COORD_SLURM_H
#define DT_COORD_SLURM_H

#include <stdint.h>

#include "common/err.h"

/* What dt asks of Slurm for one batch job: sbatch's options. Strings are
 * owned (dt_slurm_desc_clear frees them); NULL means Slurm's default. */
typedef struct dt_slurm_desc {
    char *name;             /* --job-name */
    char *script;           /* the batch script, "#!/bin/sh\n..." */
    char *partition, *account, *qos;
    char *constraint;       /* --constraint (node features) */
    char *exclude;          /* --exclude, a Slurm host list or NULL */
    uint32_t nodes;         /* --nodes (min = max): the job's nodes plus spares */
    uint32_t cpus_per_task; /* --cpus-per-task; 0: Slurm's default */
    uint32_t gpus_per_node; /* --gpus-per-node; 0: none asked */
    uint32_t time_min;      /* --time in minutes; 0: the partition's default */
    uint32_t signal_lead_s; /* --signal=B:USR1@lead; 0: none */
    char *output;           /* --output (stdout and stderr), may hold %j */
    char *workdir;          /* --chdir */
    uint32_t uid, gid;      /* submit as this user (root may submit for others) */
    char **env;             /* the job's environment, NAME=VALUE, NULL-terminated */
    /* always: --requeue, --open-mode=append, --no-kill (a node failure
     * does not end the job: dt moves its ranks to a spare or requeues) */
} dt_slurm_desc_t;

void dt_slurm_desc_clear(dt_slurm_desc_t *d);

/* A job as slurmctld reports it. */
typedef struct dt_slurm_info {
    uint32_t id;
    char state[32];        /* PENDING RUNNING SUSPENDED COMPLETED CANCELLED FAILED
                            * TIMEOUT NODE_FAIL PREEMPTED BOOT_FAIL DEADLINE
                            * OUT_OF_MEMORY; "+REQUEUED" etc. are not added */
    int final;             /* the state is one a job ends in (not PENDING,
                            * RUNNING or SUSPENDED) */
    int completing;        /* the COMPLETING flag is set */
    int requeued;          /* the REQUEUE flag is set (a requeue is under way) */
    char reason[128];      /* the pending or end reason ("Resources", "None", ...) */
    char nodes[1024];      /* the allocated nodes, a Slurm host list; "" when none */
    char exclude[1024];    /* the job's excluded nodes; "" when none */
    uint32_t restarts;     /* restart_cnt: how many times it was requeued */
    int32_t exit_code;     /* the batch script's exit status, -1 unknown */
    int32_t exit_signal;   /* the signal that ended it, 0 none */
    int64_t start_s, end_s; /* unix seconds; 0 when not yet */
    uint32_t time_min;     /* its time limit in minutes, 0 unlimited */
} dt_slurm_info_t;

/* Once, before any other call (from main): check that `conf` (NULL: the
 * SLURM_CONF environment variable, else /etc/slurm/slurm.conf) is a
 * readable file, then slurm_init() it. DT_ECONF naming the path otherwise
 * (libslurm itself exits the process on a missing config, so this must
 * come first). */
int dt_slurm_init(const char *conf, dt_emsg_t *em);
void dt_slurm_fini(void);

/* Submit; *id is the Slurm job id. DT_EINVAL for a description slurmctld
 * refuses (its message), DT_ECOMM when slurmctld cannot be reached. */
int dt_slurm_submit(const dt_slurm_desc_t *d, uint32_t *id, dt_emsg_t *em);

/* DT_ENOENT when slurmctld no longer knows the job (purged after
 * MinJobAge), DT_ECOMM when it cannot be reached. */
int dt_slurm_query(uint32_t id, dt_slurm_info_t *out, dt_emsg_t *em);

/* Requeue a running, pending or finished batch job. With `exclude` (a
 * Slurm host list) the job is requeued held, its excluded nodes become
 * the union of what it had and `exclude`, and it is released: it cannot
 * start on an excluded node in between. A job already pending is not an
 * error (only the exclusion is applied). */
int dt_slurm_requeue(uint32_t id, const char *exclude, dt_emsg_t *em);

/* scancel: SIGKILL to every step and the batch script, the job ends
 * CANCELLED. A job that already ended is not an error. */
int dt_slurm_cancel(uint32_t id, dt_emsg_t *em);

#endif /* DT_COORD_SLURM_H */
