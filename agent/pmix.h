/* SPDX-License-Identifier: MIT
 *
 * dtagentd's embedded PMIx server: libpmix's server API wrapped for a libuv
 * daemon. One server per agent process (PMIx_server_init once); one PMIx
 * namespace per generation of the job's workers, spanning every rank of the
 * job across all agents (node map and proc map of the whole job), of which
 * this agent hosts some. Workers are Open MPI or plain PMIx clients; their
 * fork environment comes from PMIx_server_setup_fork plus what Open MPI
 * needs (see dt_pmix_worker_env).
 *
 * Threads: libpmix calls the host module on its own progress thread. This
 * module never touches agent state from there: every upcall is handed to
 * the loop thread through a uv_async_t, and its answer (the libpmix
 * callback) is invoked from the loop thread. All functions below are
 * called on the loop thread only.
 *
 * Fences: libpmix completes node-local fences itself. A fence that has
 * participants under other agents reaches the host (fence_nb); this module
 * numbers such fences per namespace in arrival order (seq = 1, 2, ...),
 * copies the data and calls ops->fence on the loop thread. The agent relays
 * it through the coordinator and calls dt_pmix_fence_done with the
 * concatenation of every agent's data for that (gen, seq), in any agent
 * order (libpmix unpacks concatenated blobs). A fence not completed within
 * the fence timeout (dt_pmix_set_fence_timeout) is answered with an error by this module. (Seen
 * here: Open MPI 4.1.4 does not fail MPI_Init on a failed fence, it carries
 * on with the node-local data; on one node that still works, across nodes
 * the remote data are then missing. The agent's own watchdog decides.)
 * direct_modex is answered with PMIX_ERR_NOT_SUPPORTED: all data travel with
 * the fences.
 *
 * The module's two uv handles are unreferenced: it never keeps the loop
 * alive by itself (the workers' handles do).
 *
 * Other users: libpmix's listener is TCP on 127.0.0.1, which every local
 * user can reach; who may connect is decided by the process-wide accept(2)
 * of agent/accept_gate.h, which every program linking this module links
 * too. The server's directory is ours and 0700, and no directory above it
 * may be changed by another user (dt_pmix_new checks); with tool and system
 * support off libpmix writes no rendezvous file.
 *
 * Not here: spawning (agent/task.c calls uv_spawn with the environment built
 * here), who may connect (agent/accept_gate.c), the coordinator link,
 * policy.
 */
#ifndef DT_AGENT_PMIX_H
#define DT_AGENT_PMIX_H

#include <stddef.h>
#include <stdint.h>
#include <uv.h>

#include "common/err.h"
#include "common/macros.h"

#define DT_PMIX_CB_TIMEOUT_MS 10000
/* A relayed fence waits for the slowest agent's ranks to get there (MPI_Init
 * after a checkpoint load, a GPU start): the coordinator's failure handling
 * is the real watchdog, this only frees ranks nobody will answer. */
#define DT_PMIX_FENCE_TIMEOUT_MS 300000
/* How long dt_pmix_free waits for PMIx_server_finalize. */
#define DT_PMIX_FINALIZE_TIMEOUT_MS 5000

typedef struct dt_pmix dt_pmix_t;

/* Callbacks to the agent, all on the loop thread. */
typedef struct dt_pmix_ops {
    /* A fence with remote participants: relay `data` (len bytes, borrowed
     * for the call) and answer later with dt_pmix_fence_done(gen, seq).
     * NULL: each fence is answered at once with this agent's data alone
     * (a job on one agent). */
    void (*fence)(void *ud, uint32_t gen, uint32_t seq, const void *data, size_t len);
    /* A local client connected (PMIx_Init) or finalized (PMIx_Finalize). */
    void (*connected)(void *ud, uint32_t gen, int rank);
    void (*finalized)(void *ud, uint32_t gen, int rank);
    /* A client called PMIx_Abort (MPI_Abort): status and message. */
    void (*aborted)(void *ud, uint32_t gen, int rank, int status, const char *msg);
} dt_pmix_ops_t;

/* One generation's namespace: the whole job's layout. */
typedef struct dt_pmix_gen {
    uint32_t gen;         /* 1, 2, ... */
    const char *nspace;   /* unique per job and generation, e.g. "dt.12.3" */
    int nranks;           /* R: ranks of the whole job */
    int nnodes;           /* agents taking part */
    const char *const *nodes; /* [nnodes] node names, as agents registered */
    const int *node_of;   /* [nranks] index into nodes of each rank */
    const char *self;     /* this agent's node name (one of nodes) */
} dt_pmix_gen_t;

/* Initialise the PMIx server (PMIx_server_init) with its files under
 * tmpdir (created if missing, mode 0700): PMIX_SERVER_TMPDIR, the system
 * and namespace directories. tmpdir must be owned by our effective uid (it
 * is made 0700 if it was not), and every directory above it owned by us or
 * root and not writable by others unless sticky: else DT_EPERM naming the
 * directory. Sets PMIX_MCA_gds=hash in the process environment first (the
 * shared-memory store deadlocked here on a bad registration). Returns 0 or
 * a DT_E* code with a message naming the PMIx status; DT_ESTATE while
 * another dt_pmix_t lives in the process (libpmix's server is
 * process-wide). */
DT_MUST_CHECK int dt_pmix_new(uv_loop_t *loop, const char *tmpdir, const dt_pmix_ops_t *ops,
                              void *ud, dt_pmix_t **out, dt_emsg_t *em);

/* Register a generation's namespace (PMIx_server_register_nspace with the
 * node map, proc map, job size, local peers and per-rank local/node ranks)
 * and set up local support. Blocks the loop until libpmix has answered (it
 * is fast). A previous generation still registered is deregistered first.
 * The namespace and node names must be [A-Za-z0-9._-] (not starting with
 * '.'), node names distinct, self among them (else DT_EINVAL, nothing
 * changed but the previous generation ended); nodes without ranks are left
 * out of the maps. Every rank gets PMIX_RANK, PMIX_LOCAL_RANK,
 * PMIX_NODE_RANK, PMIX_HOSTNAME and PMIX_NODEID. */
DT_MUST_CHECK int dt_pmix_gen_begin(dt_pmix_t *p, const dt_pmix_gen_t *g, dt_emsg_t *em);

/* The fork environment of local `rank` of the current generation:
 * registers the client (PMIx_server_register_client, our uid/gid) and
 * returns a NULL-terminated environ (the caller frees it with
 * dt_pmix_env_free): the agent's own environment, what
 * PMIx_server_setup_fork adds, and for Open MPI OMPI_MCA_schizo=^orte,
 * OMPI_MCA_ess=pmi, OMPI_MCA_pml=ob1, OMPI_MCA_btl=self,vader,tcp,
 * OMPI_MCA_btl_tcp_if_include=lo when the job spans several nodes,
 * OMPI_MCA_btl_vader_backing_directory in the generation's own directory.
 * Variables already set in the agent's environment are overridden.
 * PMIX_HOSTNAME is this agent's name in the node map, not gethostname().
 * Another launcher's identity is not passed on (an agent started by srun or
 * mpirun): PMIX_*, PMI_* and OMPI_* variables are dropped except PMIX_MCA_*,
 * OMPI_MCA_* and OMPI_ALLOW_RUN_AS_ROOT*, and OMPI_MCA_orte_* and
 * OMPI_MCA_ess_base_* are dropped too. DT_EINVAL for a rank not placed
 * here, DT_ESTATE without a generation. */
DT_MUST_CHECK int dt_pmix_worker_env(dt_pmix_t *p, int rank, char ***envp, dt_emsg_t *em);
void dt_pmix_env_free(char **env);

/* Answer fence (gen, seq) with the concatenated data of every agent (or a
 * non-zero status: the fence fails on every local participant with
 * PMIX_ERROR). Unknown or already answered fences are ignored. */
void dt_pmix_fence_done(dt_pmix_t *p, uint32_t gen, uint32_t seq, int status, const void *data,
                        size_t len);

/* Fail relayed fences not answered within ms (default
 * DT_PMIX_FENCE_TIMEOUT_MS; <= 0 restores it). */
void dt_pmix_set_fence_timeout(dt_pmix_t *p, int64_t ms);

/* Tell every local client of the current generation that `rank` died
 * (PMIx_Notify_event PMIX_ERR_PROC_ABORTED_BY_SIG, source the dead proc,
 * range namespace, PMIX_EVENT_AFFECTED_PROC, PMIX_EVENT_NON_DEFAULT: only
 * handlers registered for that code run, not Open MPI's default one).
 * Ranks on other agents count: the coordinator relays their deaths.
 * libpmix caches the event, so a rank that registers its handler later
 * still gets it. */
DT_MUST_CHECK int dt_pmix_notify_failure(dt_pmix_t *p, int rank, dt_emsg_t *em);

/* End the current generation: fail its pending fences, deregister its
 * clients and namespace, remove its directory (vader segments). Safe when
 * none is registered. */
void dt_pmix_gen_end(dt_pmix_t *p);

/* End the current generation, PMIx_server_finalize and free. NULL is a
 * no-op. Bounded: at most DT_PMIX_CB_TIMEOUT_MS for the generation's end
 * and DT_PMIX_FINALIZE_TIMEOUT_MS for PMIx_server_finalize, which runs on
 * a helper thread; when it does not return in time that is logged, it is
 * left running and dt_pmix_abandoned() turns 1. The memory goes in the
 * close callbacks of the module's handles: run the loop once more (when
 * abandoned, the dt_pmix_t is kept for libpmix's threads). */
void dt_pmix_free(dt_pmix_t *p);

/* 1 when a dt_pmix_free left PMIx_server_finalize running: libpmix's
 * threads may still hold its locks, so the process must leave with
 * _exit(2), without atexit handlers or library destructors. Any thread. */
int dt_pmix_abandoned(void);

#endif /* DT_AGENT_PMIX_H */
