/* SPDX-License-Identifier: MIT
 *
 * The worker's side of the channel to its dtagentd, and the PMIx failure
 * events. Under an agent the environment has DT_AGENT_FD (a connected Unix
 * stream socket) and DT_AGENT_PID; frames are those of common/proto.h (W_*
 * types, id 0, no replies). Without DT_AGENT_FD (alone, mpirun, srun) every
 * function here is a cheap no-op, so the commands call them
 * unconditionally.
 *
 * Worker -> agent: W_HELLO at start, W_PROGRESS after every step (it is
 * also the heartbeat), W_HEARTBEAT in long phases (loading, writing a
 * checkpoint), W_SHARD for each checkpoint shard written (rank 0 also for
 * the manifest), W_RESULT from rank 0 before a successful exit. Writes are
 * blocking and whole frames; a broken channel (agent gone) is reported
 * once on stderr and the worker exits with DT_EXIT_AGENT_LOST: nobody is
 * left to commit its checkpoints.
 *
 * Agent -> worker: W_CHECKPOINT and W_STOP, read without blocking by
 * dt_wlink_poll at step boundaries. The ranks then agree (the caller sums
 * the flags over the ring in the all-reduce it already does), so every rank
 * acts at the same step.
 *
 * PMIx: dt_wlink_open registers a PMIx event handler (PMIx_Init is
 * reference-counted, so this coexists with Open MPI's) for process-failure
 * codes. A failure of another process of our namespace prints
 * "dtengine: rank N failed (...); stopping" and exits the process with
 * DT_EXIT_PEER from the handler's thread: the main thread may be blocked in
 * MPI on the dead peer, and a checkpoint in progress is harmless (files are
 * written to temporary names and renamed).
 *
 * On Linux a worker under an agent also asks for SIGKILL when its parent
 * dies (PR_SET_PDEATHSIG), and exits at once if the parent is already not
 * DT_AGENT_PID: workers never outlive their agent.
 */
#ifndef DT_ENGINE_WLINK_H
#define DT_ENGINE_WLINK_H

#include <stdint.h>

#include "common/err.h"

/* Control requests seen by dt_wlink_poll (bit flags). */
enum { DT_WLINK_CHECKPOINT = 1, DT_WLINK_STOP = 2, DT_WLINK_STOP_CKPT = 4 };

/* Connect to the agent if DT_AGENT_FD is set: parent check, death signal,
 * PMIx event handler, W_HELLO. Returns 0 (also when not under an agent) or
 * a DT_E* code with a message. Call once, after MPI is initialised. */
int dt_wlink_open(int rank, dt_emsg_t *em);
/* 1 under an agent, else 0. */
int dt_wlink_active(void);
void dt_wlink_progress(int64_t step, int64_t steps, int64_t tokens, double loss, double tokens_s,
                       double acc);
void dt_wlink_heartbeat(void);
/* A checkpoint file written: dir is the step directory, path the file
 * inside it; manifest is 1 for the manifest (rank 0). */
void dt_wlink_shard(int64_t step, const char *dir, const char *path, int64_t bytes,
                    const char *sha256, int manifest);
void dt_wlink_result(int64_t steps, double loss, const char *checksum);
/* Requests that arrived since the last call (DT_WLINK_* bits; 0 when none
 * or not under an agent). Never blocks. */
int dt_wlink_poll(void);
/* Unregister the event handler and close the channel. */
void dt_wlink_close(void);

#endif /* DT_ENGINE_WLINK_H */
