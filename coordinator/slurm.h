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

#include <stddef.h>
#include <stdint.h>

#include "common/err.h"

/* What dt asks of Slurm for one batch job: sbatch's options. Strings are
 * owned (dt_slurm_desc_clear frees them); NULL means Slurm's default. */
typedef struct dt_slurm_desc {
    char *name;             /* --job-name, unique to the dt job (batch.h) */
    char *script;           /* the batch script, "#!/bin/sh\n..." */
    char *partition, *account, *qos;
    char *constraint;       /* --constraint (node features) */
    char *exclude;          /* --exclude, a Slurm host list or NULL */
    uint32_t nodes;         /* --nodes (min = max): the job's nodes plus spares */
    uint32_t cpus_per_task; /* --cpus-per-task; 0: Slurm's default */
    uint32_t gpus_per_node; /* --gpus-per-node; 0: none asked */
    uint32_t cpus_per_gpu;  /* --cpus-per-gpu; 0: Slurm's default */
    uint32_t time_min;      /* --time in minutes; 0: the partition's default */
    uint32_t signal_lead_s; /* --signal=B:SIG@lead; 0: none */
    int warn_signal;        /* SIG: SIGUSR1 or SIGUSR2, with signal_lead_s */
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

/* One poll of many jobs: the state of ids[0..n) from ONE slurm_load_jobs
 * RPC. out[i] and rcs[i] are filled for each (rcs[i] 0, or DT_ENOENT when
 * slurmctld no longer knows ids[i]). The answer is kept between calls,
 * and each call asks slurmctld only for what changed since the kept one
 * (SLURM_NO_CHANGE_IN_DATA: the kept answer is still current). Returns 0,
 * or DT_ECOMM / DT_EINVAL for the call as a whole (out and rcs are then
 * untouched). *st (may be NULL) says what the call did, for the log. */
typedef struct dt_slurm_poll_stats {
    int changed;       /* slurmctld sent new records (0: nothing changed since) */
    uint32_t records;  /* job records in the kept answer (every user's jobs) */
    uint64_t rpcs;     /* RPCs to slurmctld made by this file since init */
} dt_slurm_poll_stats_t;

int dt_slurm_query_jobs(const uint32_t *ids, size_t n, dt_slurm_info_t *out, int *rcs,
                        dt_slurm_poll_stats_t *st, dt_emsg_t *em);

/* The jobs of user `uid` named `name` that have not ended (pending,
 * running, suspended, or requeued and about to pend), newest first: up to
 * `cap` ids in ids[], *n of them. One slurm_load_job_user RPC. Finds a
 * job dtcoordd submitted but did not record (it stopped in between). */
int dt_slurm_find(const char *name, uint32_t uid, uint32_t *ids, size_t cap, size_t *n,
                  dt_emsg_t *em);

/* Could job `id` still start once `exclude` (a host list) is added to the
 * nodes it may not use? *room counts the nodes of its partition(s) that
 * are not excluded, have its features, and are not DOWN, DRAIN(ING),
 * FAIL or FUTURE, against the node count it asked for. A --constraint
 * with anything but '&' or ',' between features (|, [], *, ()) is not
 * evaluated: every node counts as having it (features_checked = 0).
 * Returns 0 (compare room->usable with room->need), or an RPC's error.
 * Three RPCs: slurm_load_job, slurm_load_partitions, slurm_load_node. */
typedef struct dt_slurm_room {
    uint32_t need;           /* the job's node count */
    uint32_t usable;         /* nodes it could start on */
    uint32_t in_partition;   /* nodes of its partition(s), usable or not */
    int features_checked;
    char partition[128];     /* its partition(s), as slurmctld reports them */
    char excluded[1024];     /* the nodes it may not use, `exclude` included */
    char unusable[1024];     /* "n3 (DOWN), n4 (DRAIN)": partition nodes in a bad state */
} dt_slurm_room_t;

int dt_slurm_room(uint32_t id, const char *exclude, dt_slurm_room_t *room, dt_emsg_t *em);

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
