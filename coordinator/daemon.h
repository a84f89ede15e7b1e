/* SPDX-License-Identifier: MIT
 *
 * Becoming a daemon the careful way: the parent forks and waits on a status
 * pipe until the child reports that start-up succeeded (exit 0) or failed
 * (the child's message is printed and the parent exits 1), so `dtcoordd`
 * without -D returns only when the service is ready or certainly not.
 * Also the pidfile, locked with flock so two daemons cannot share a state
 * directory.
 */
#ifndef DT_DAEMON_H
#define DT_DAEMON_H

#include "common/err.h"

/* Fork; returns in the child only, with *status_fd to report through. */
int dt_daemon_start(int *status_fd, dt_emsg_t *em);
/* Child: report success (msg NULL) or failure, and close the pipe. */
void dt_daemon_ready(int status_fd, const char *errmsg);
/* Create and lock the pidfile, write our pid. Returns the locked fd, or
 * DT_EEXIST naming the running daemon's pid. */
int dt_pidfile_lock(const char *path, dt_emsg_t *em);

#endif /* DT_DAEMON_H */
