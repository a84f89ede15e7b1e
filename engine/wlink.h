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
 * The codes: PMIX_ERR_PROC_ABORTED_BY_SIG (what dtagentd sends for a dead
 * worker), PMIX_ERR_PROC_ABORTED (older servers), _KILLED_BY_CMD,
 * _REQUESTED_ABORT, _TERM_WO_SYNC, _SENSOR_BOUND_EXCEEDED, _FAILED_TO_START
 * always mean a failure; PMIX_ERR_EXIT_NONZERO_TERM, PMIX_EVENT_PROC_TERMINATED
 * and PMIX_PROC_TERMINATED only with a PMIX_EXIT_CODE outside 0..3, since
 * dtengine's ranks agree on those exits first (a peer that exits 3 on
 * W_STOP is doing what we are about to do). Such an agreed end of a peer is
 * marked handled: passed on, Open MPI's default handler would abort the
 * process with the event's code as exit status. The affected process is
 * PMIX_EVENT_AFFECTED_PROC when the event has one, else its source.
 * PMIX_ERR_LOST_CONNECTION (the server, i.e. the agent, is gone) exits
 * DT_EXIT_AGENT_LOST.
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
 * PMIx_Init and the event handler, then W_HELLO. Returns 0 (also when not
 * under an agent, having done nothing at all) or a DT_E* code with a
 * message: DT_EINVAL for a bad DT_AGENT_FD or DT_AGENT_PID (naming the
 * variable and its value), DT_ECOMM when PMIx_Init or the registration
 * fails (the agent is our PMIx server, so that is an error). On failure
 * nothing stays open. Does not return when the parent is not
 * DT_AGENT_PID (message, exit DT_EXIT_AGENT_LOST). Call once, after MPI is
 * initialised, from the main thread. */
int dt_wlink_open(int rank, dt_emsg_t *em);
/* The channel alone, without PMIx: what dt_wlink_open does except
 * PMIx_Init and the event handler (same checks, same returns, W_HELLO
 * sent). For the unit tests, which have no PMIx server, and for a worker
 * that is not a PMIx client; dtengine itself calls dt_wlink_open. */
int dt_wlink_open_channel(int rank, dt_emsg_t *em);
/* 1 under an agent (after a successful open), else 0. */
int dt_wlink_active(void);

/* Frames to the agent. All are no-ops when not under an agent; under one
 * they block until the whole frame is written and never return on a broken
 * channel (message on stderr, exit DT_EXIT_AGENT_LOST). Doubles that are not
 * finite (a NaN loss) go out as JSON null. Strings are borrowed. Main thread
 * only. */
void dt_wlink_progress(int64_t step, int64_t steps, int64_t tokens, double loss, double tokens_s,
                       double acc);
void dt_wlink_heartbeat(void);
/* A heartbeat when no frame went to the agent for DT_WLINK_TICK_MS: cheap
 * enough (a clock read) for inner loops that may run longer than the
 * agent's hang timeout, such as one ring step of a long attention. */
enum { DT_WLINK_TICK_MS = 1000 };
void dt_wlink_tick(void);
/* A checkpoint file written: dir is the step directory (give it absolute:
 * the agent runs in another directory), path the file name inside it;
 * manifest is 1 for the manifest (rank 0). */
/* W_MEMCKPT: the in-memory checkpoint of step is in slot (0 or 1);
 * _writing: slot is being overwritten with step's (forget what it held).
 * Every frame here may be sent from any thread: each goes out whole. */
void dt_wlink_memckpt(int64_t step, int slot, int64_t bytes, const char *sha256);
void dt_wlink_memckpt_writing(int64_t step, int slot);
void dt_wlink_shard(int64_t step, const char *dir, const char *path, int64_t bytes,
                    const char *sha256, int manifest);
/* acc: the accuracy averaged over the last steps (see dtengine(1)), NaN
 * when the command has none; outputs: the absolute paths of the files a
 * user reads first (attn's manifest, prefill's logits), noutputs of them,
 * at most DT_WIRE_OUTPUTS_MAX. */
void dt_wlink_result(int64_t steps, double loss, double acc, const char *checksum,
                     const char *const *outputs, size_t noutputs);

/* Requests that arrived since the last call (DT_WLINK_* bits; 0 when none
 * or not under an agent); several of one kind read as one. W_STOP sets
 * DT_WLINK_STOP, and DT_WLINK_STOP_CKPT too when its "checkpoint" is true.
 * Never blocks; keeps a partial frame for the next call. A malformed frame,
 * a frame of another type or a nonzero id, and end of file do not return:
 * message on stderr, exit DT_EXIT_AGENT_LOST. */
int dt_wlink_poll(void);
/* Unregister the event handler, drop our PMIx_Init reference and close the
 * channel; a no-op when not open. Call before MPI is finalised. */
void dt_wlink_close(void);

#endif /* DT_ENGINE_WLINK_H */
