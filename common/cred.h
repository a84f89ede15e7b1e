/* SPDX-License-Identifier: MIT
 *
 * A munge credential for the AUTH frame of a TCP connection to dtcoordd
 * (common/proto.h): what dtctl and dtagentd send. Not here: decoding and
 * checking credentials (coordinator/auth.c).
 */
#ifndef DT_CRED_H
#define DT_CRED_H

#include "common/err.h"

/* Encode an empty munge credential through munged at munge_socket (NULL:
 * libmunge's default). Returns 0 and *cred (the caller frees), or DT_ECOMM
 * with "munge: REASON (is munged running?)". */
int dt_cred_new(const char *munge_socket, char **cred, dt_emsg_t *em);

#endif /* DT_CRED_H */
