/* SPDX-License-Identifier: MIT
 *
 * The coordinator's listening sockets: the Unix socket for local dtctl
 * (mode 0666; the kernel tells who connects) and the optional TCP listener
 * for agents and remote dtctl (munge-authenticated).
 */
#ifndef DT_COORD_LISTEN_H
#define DT_COORD_LISTEN_H

#include <sys/socket.h>

#include "common/err.h"
#include "coordinator/coord.h"

/* A live socket at the path (another coordinator answering) is DT_EEXIST;
 * a stale one is removed. */
int dt_listen_unix(dt_coord_t *c, const char *path, dt_emsg_t *em);
/* Parse "host:port", "[v6]:port" or ":port" (all IPv4 interfaces); the
 * host is an IP address, not a name. DT_EINVAL naming the problem and
 * quoting the value, not the key ("'x:y': bad port (0 to 65535)"). */
int dt_listen_parse(const char *hostport, struct sockaddr_storage *ss, dt_emsg_t *em);
/* Listen on a parsed "host:port". */
int dt_listen_tcp(dt_coord_t *c, const char *hostport, dt_emsg_t *em);

#endif /* DT_COORD_LISTEN_H */
