/* SPDX-License-Identifier: MIT
 *
 * Who a peer is and what it may do. Unix-socket peers are identified by the
 * kernel (SO_PEERCRED); TCP peers by a munge credential decoded with
 * libmunge (munged vouches for the uid; replays and expired credentials are
 * refused). Root, and members of the configured admin group, may see and
 * change every job; others only their own.
 */
#ifndef DT_COORD_AUTH_H
#define DT_COORD_AUTH_H

#include <stdbool.h>
#include <sys/types.h>
#include <uv.h>

#include "common/err.h"

/* The Unix-socket peer's uid, gid and pid (pid may be NULL). */
int dt_auth_peercred(uv_stream_t *s, uid_t *uid, gid_t *gid, pid_t *pid);
/* Decode a munge credential (munge_socket NULL: libmunge's default).
 * DT_EACCES with munge's reason ("credential replayed", "expired", ...) or
 * DT_EIO when our munged cannot be reached. */
int dt_auth_munge(const char *cred, const char *munge_socket, uid_t *uid, gid_t *gid,
                  dt_emsg_t *em);
/* Root, or a member (primary or supplementary) of admin_group. */
bool dt_auth_is_admin(uid_t uid, gid_t gid, const char *admin_group);

#endif /* DT_COORD_AUTH_H */
