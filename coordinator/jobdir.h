/* SPDX-License-Identifier: MIT
 *
 * Job directories: JOBS_DIR/ID, made by the coordinator and given to the
 * job's owner, who alone writes inside it (checkpoints under ckpt/ unless
 * the spec names another ckpt_dir, rank logs under logs/, the Slurm batch
 * output). See jobdir.c for why this is the only file dtcoordd makes in a
 * place a user controls, and dtcoordd(8) SECURITY.
 */
#ifndef DT_JOBDIR_H
#define DT_JOBDIR_H

#include <stdint.h>
#include <sys/types.h>

#include "common/err.h"

/* Create JOBS_DIR if missing (mode 0711), check that it is a directory,
 * not a link, owned by dtcoordd's uid, and set its mode to 0711. Returns
 * an open descriptor of it for dt_jobdir_ensure, or a negative code. */
int dt_jobdir_open_root(const char *jobs_dir, dt_emsg_t *em);

/* "JOBS_DIR/ID"; the caller frees. */
char *dt_jobdir_path(const char *jobs_dir, int64_t job);

/* Make JOBS_DIR/ID the job owner's directory, mode 0700: created when
 * missing (relative to ROOT_FD, never following a link) and given to
 * OWNER and their primary group. An existing one must be a directory
 * owned by OWNER (or a leftover of ours, then given away). 0, or a
 * negative code naming the path: DT_EPERM when dtcoordd is not root and
 * OWNER is another user. */
int dt_jobdir_ensure(int root_fd, const char *jobs_dir, int64_t job, uid_t owner,
                     dt_emsg_t *em);

#endif /* DT_JOBDIR_H */
