/* SPDX-License-Identifier: MIT
 *
 * In-memory checkpoints (dtagentd(8)). Under an agent that holds memory
 * for its ranks, a rank inherits two memory files (memfds) and names them
 * in DT_MEM_CKPT=FD0,FD1; every --mem-ckpt-every steps it writes its own
 * state, exactly what it holds (a safetensors file: the command's tensors
 * and metadata), into the one not holding its newest copy. The step waits
 * only for the bytes to be written (a copy in memory); a thread of its own
 * then hashes the file and tells the agent (W_MEMCKPT: step, slot, bytes,
 * SHA-256), while the next step computes. Before a slot is rewritten the
 * agent is told to forget it (W_MEMCKPT writing). The agent keeps the copy
 * past the worker's death; a recovery started from it gives the new worker
 * the same files and DT_MEM_RESUME=SLOT:SHA256 with --resume-from-memory
 * STEP, and the worker checks the file against that SHA-256 before using
 * it.
 *
 * A copy falls due while the one before it in the same slot is still being
 * hashed (state too large for its steps): it is skipped, said once, and the
 * next one due is taken; the steps never wait for the hashing.
 *
 * A write that fails (the memory is gone, the node is out of it) turns the
 * copies off for the rest of the run with one message: disk checkpoints
 * still stand, and the job never stops for this.
 */
#ifndef DT_ENGINE_CMD_MEMCKPT_H
#define DT_ENGINE_CMD_MEMCKPT_H

#include <pthread.h>
#include <stdint.h>

#include "common/err.h"
#include "common/macros.h"
#include "io/safetensors.h"

#define DT_MEMCKPT_ENV "DT_MEM_CKPT"
#define DT_MEMCKPT_RESUME_ENV "DT_MEM_RESUME"

typedef struct dt_memckpt {
    int fd[2];          /* the agent's memory files; -1: none (copies off) */
    int newest;         /* the slot of the newest copy written or resumed from; -1 none */
    int64_t every;      /* steps between copies; 0 off */
    int resume_slot;    /* DT_MEM_RESUME's, -1 none */
    char resume_sha[65];
    const char *cmd;    /* "dtengine train": the start of messages */
    /* the hashing thread: the copies written and not yet reported */
    pthread_t thread;
    pthread_mutex_t mu;
    pthread_cond_t cv;
    int started, quit;
    int64_t queued[2];  /* per slot: the step written and waiting to be hashed, 0 none */
    int64_t bytes[2];
    dt_st_writer_t *w[2]; /* per slot: a copy still to be written (dt_memckpt_write_async) */
    int off;            /* a write failed on the thread: no more copies */
    int64_t skipped;    /* copies skipped because their slot was still being hashed */
} dt_memckpt_t;

/* From the environment: on when every > 0 and the agent gave the memory.
 * DT_EUSAGE for a malformed DT_MEM_CKPT or DT_MEM_RESUME (a bug in the
 * agent, or a hand-made environment). */
DT_MUST_CHECK int dt_memckpt_init(dt_memckpt_t *mc, const char *cmd, int64_t every,
                                  dt_emsg_t *em);
/* Whether a copy is due after `done` steps of `steps`. */
int dt_memckpt_due(dt_memckpt_t *mc, int64_t done, int64_t steps);
/* Write w as the copy of step `done`; its hash and report follow on the
 * hashing thread. A failure is printed once and turns the copies off;
 * nothing is returned. */
void dt_memckpt_write(dt_memckpt_t *mc, int64_t done, dt_st_writer_t *w);
/* The same, written on the thread too (w taken: freed there): for state
 * that stays put until dt_memckpt_sync, such as parameters and moments
 * before the next update, or a host copy of the device's before the next
 * copy into it. */
void dt_memckpt_write_async(dt_memckpt_t *mc, int64_t done, dt_st_writer_t *w);
/* Wait until no copy is still being written from the caller's memory. */
void dt_memckpt_sync(dt_memckpt_t *mc);
/* 1 when a copy due after `done` steps can be taken now; 0 when the
 * copies are off, or the slot it would take is still being written or
 * hashed (the copy is then skipped, said once): the caller need not build
 * it. */
int dt_memckpt_ready(dt_memckpt_t *mc, int64_t done);
/* The copies still being hashed reported, and the thread stopped. */
void dt_memckpt_close(dt_memckpt_t *mc);
/* The copy to resume step `step` from, checked against the SHA-256 the
 * worker that wrote it reported (DT_MEM_RESUME) and to be of `format` (its
 * metadata's "format"): *r its reader (the caller closes it). DT_ECKPT
 * when there is none, it does not match or is of another format (the
 * coordinator then takes a disk checkpoint), the message starting
 * "--resume-from-memory STEP: ". */
DT_MUST_CHECK int dt_memckpt_open_resume(dt_memckpt_t *mc, int64_t step, const char *format,
                                         dt_st_reader_t **r, dt_emsg_t *em);
/* A copy's integer metadata `key` into *v; DT_ECKPT when missing or not
 * one. */
DT_MUST_CHECK int dt_memckpt_meta_int(const dt_st_reader_t *r, const char *key, long long *v,
                                      dt_emsg_t *em);
#endif /* DT_ENGINE_CMD_MEMCKPT_H */
