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

/* rm -rf PATH without following links (a link is removed, not its
 * target) or crossing into another file system. 0 also when PATH does not
 * exist; else a negative code naming the path. */
int dt_rmtree(const char *path, dt_emsg_t *em);

#endif /* DT_FILEIO_H */
