/* SPDX-License-Identifier: MIT
 *
 * Whole-buffer file I/O that survives short transfers and EINTR, and the
 * directory fsync that makes a rename durable. Errors are negative DT_*
 * codes (translated from errno here, once).
 */
#ifndef DT_FILEIO_H
#define DT_FILEIO_H

#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

#include "common/err.h"

/* Read n bytes at off: the bytes read (short only at end of file) or a
 * negative code. */
int64_t dt_pread_full(int fd, void *buf, size_t n, int64_t off);
/* Write all n bytes (at the file position, or at off). 0 or a negative code. */
int dt_write_full(int fd, const void *buf, size_t n);
int dt_pwrite_full(int fd, const void *buf, size_t n, int64_t off);
/* Open PATH read-only and check it is a regular file (O_NONBLOCK, so a
 * FIFO cannot hang the open). Returns the descriptor and, when size is not
 * NULL, the file's size; or a negative code with "PATH: cannot open: ..."
 * (DT_ENOENT, DT_EACCES, ...), or DT_EINVAL with "PATH: is a directory" or
 * "PATH: not a regular file" (an input that names the wrong thing, which no
 * retry mends). */
int dt_open_regular(const char *path, int64_t *size, dt_emsg_t *em);

/* dt_open_regular's flags. */
#define DT_OPEN_NOFOLLOW 1u /* a symbolic link as the last component is refused
                             * (DT_EINVAL, "PATH: is a symbolic link") */
int dt_open_regular_flags(const char *path, unsigned flags, int64_t *size, dt_emsg_t *em);

/* The whole of the regular file PATH (opened as dt_open_regular_flags does)
 * in a new NUL-terminated buffer: *buf (the caller frees) and *len, without
 * the NUL. A file larger than max bytes is refused before it is read
 * (DT_ERANGE, "PATH: larger than the limit of MAX bytes"), so the memory
 * used is bounded by max whatever the file says. */
int dt_read_regular(const char *path, unsigned flags, size_t max, char **buf, size_t *len,
                    dt_emsg_t *em);
/* fsync a directory (after a rename into it). File systems that cannot
 * (EINVAL, ENOTSUP) count as success. A message naming the directory. */
int dt_fsync_dir(const char *dir, dt_emsg_t *em);
/* mkdir -p: create PATH and its missing parents with MODE (existing ones
 * are left as they are). 0, or -errno (errno still set) for the first
 * directory that could not be made. */
int dt_mkdirs(const char *path, mode_t mode);
/* The same, and then PATH must be a directory (an existing file of that
 * name is not one). On failure a message: "DIR: <strerror>" for the first
 * directory that could not be made (the code from dt_err_errno), "PATH:
 * <strerror>" when PATH cannot be looked at, or DT_EINVAL with "PATH: not a
 * directory". */
int dt_mkdirs_checked(const char *path, mode_t mode, dt_emsg_t *em);

/*-- atomic replacement of a file ------------------------------------------
 *
 * A file appears complete or not at all: written to a temp file beside it
 * (DIR/.NAME.tmp.PID, created O_EXCL | O_NOFOLLOW with the caller's mode,
 * so a link planted at the temp name is refused, not followed; one left by
 * a crashed process with our pid is replaced), fsynced, closed (a deferred
 * write error counts), renamed over PATH (which replaces whatever is there,
 * a planted link included, rather than writing through it), then DIR is
 * fsynced so the rename is durable. Messages name PATH first:
 *   "PATH: cannot create TMP: ...", "PATH: cannot write TMP: ...",
 *   "PATH: cannot fsync TMP: ...", "PATH: cannot close TMP: ...",
 *   "PATH: cannot rename TMP over it: ...", "PATH: written, but DIR: ...".
 * After a failure before the rename the temp file is gone; after a failed
 * directory fsync the new file is in place (and the code is returned). */

/* dt_atomic_open's flags. DT_ATOMIC_DIRFD: open DIR once, refusing a
 * symbolic link in its place ("DIR: is a symbolic link (not followed
 * here)"), and create, rename and fsync relative to it, so a process
 * writing into a directory that another user controls cannot be sent
 * elsewhere. */
#define DT_ATOMIC_DIRFD 1u

typedef struct dt_atomic {
    int fd;     /* the temp file, open for writing: the caller writes here */
    char *path; /* the target, as given */
    char *tmp;  /* the temp file, for messages: DIR/.NAME.tmp.PID */
    /* private */
    int dfd; /* DIR, with DT_ATOMIC_DIRFD; else -1 */
    char *dir;
    char *name; /* NAME, and the temp file's name, relative to DIR */
    char *tmpname;
    int synced; /* dt_atomic_sync done */
} dt_atomic_t;

/* Start replacing PATH: af->fd is the temp file, empty, with mode MODE.
 * A PATH that ends in '/' is refused ("PATH: not a file name", DT_EINVAL).
 * On failure nothing is left open or created and *af needs no abort. */
int dt_atomic_open(dt_atomic_t *af, const char *path, mode_t mode, unsigned flags,
                   dt_emsg_t *em);
/* All n bytes at the temp file's position (a message on failure; the
 * caller still commits or aborts). */
int dt_atomic_write(dt_atomic_t *af, const void *buf, size_t n, dt_emsg_t *em);
/* fsync the temp file now (commit does it otherwise), e.g. on a thread
 * while the caller hashes what it wrote. */
int dt_atomic_sync(dt_atomic_t *af, dt_emsg_t *em);
/* fsync, close, rename over PATH, fsync DIR; *af is released either way. */
int dt_atomic_commit(dt_atomic_t *af, dt_emsg_t *em);
/* Drop the temp file and release *af (after a failed open or commit too:
 * then it does nothing). */
void dt_atomic_abort(dt_atomic_t *af);
/* The whole of PATH replaced by the n bytes at buf: open, write, commit. */
int dt_file_write_atomic(const char *path, const void *buf, size_t n, mode_t mode,
                         unsigned flags, dt_emsg_t *em);

/* rm -rf PATH without following links (a link is removed, not its
 * target) or crossing into another file system. 0 also when PATH does not
 * exist; else a negative code naming the path. */
int dt_rmtree(const char *path, dt_emsg_t *em);

/* An agent's generation directory in its state directory, STATE/gen-N
 * (dtagentd(8)): made for each generation it runs, removed when that
 * ends; one an agent that was killed left behind is removed by the next
 * agent with that state directory, or by dtctl run --local at its end. */
#define DT_GEN_DIR_FMT "%s/gen-%lld"
#define DT_GEN_DIR_PREFIX "gen-"

/* Remove every generation directory (DT_GEN_DIR_PREFIX) under state_dir;
 * *removed (when not NULL) gets their number. 0 also when state_dir does
 * not exist; else a negative code naming the path. */
int dt_gen_dirs_remove(const char *state_dir, int *removed, dt_emsg_t *em);

#endif /* DT_FILEIO_H */
