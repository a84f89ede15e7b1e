/* SPDX-License-Identifier: MIT
 *
 * A munge credential for the AUTH frame of a TCP connection
 * (common/proto.h): what dtctl and dtagentd send to dtcoordd, and agents to
 * one another; and its decoding, for whoever receives one. Not here: what
 * a uid may do (coordinator/auth.c, agent/peer.c).
 */
#ifndef DT_CRED_H
#define DT_CRED_H

#include <sys/types.h>

#include "common/err.h"

/* Encode an empty munge credential through munged at munge_socket (NULL:
 * libmunge's default). Returns 0 and *cred (the caller frees), or DT_ECOMM
 * with "munge: REASON (is munged running?)". */
int dt_cred_new(const char *munge_socket, char **cred, dt_emsg_t *em);

/* Decode cred through munged at munge_socket: 0 and its sender's *uid,
 * *gid; DT_EIO when our munged cannot be reached ("WHO cannot reach
 * munged: ..."), DT_EACCES for a credential munge refuses (forged,
 * expired, replayed, another realm's). */
int dt_cred_check(const char *cred, const char *munge_socket, const char *who, uid_t *uid,
                  gid_t *gid, dt_emsg_t *em);

#endif /* DT_CRED_H */
