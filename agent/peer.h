/* SPDX-License-Identifier: MIT
 *
 * The agent-to-agent channel (dtagentd(8)): in-memory checkpoint replicas
 * between the agents of one job. Each agent listens on TCP (--peer-listen)
 * and announces the address at registration; the coordinator tells each
 * agent where its ranks' replicas go and, in a recovery, where a rank that
 * moved fetches its copy from.
 *
 * A connection starts with AUTH (a munge credential, as to dtcoordd); the
 * listener takes it only from its own uid, the job's owner, and refuses
 * anyone else with ERROR. Then PEER_REPLICA {job, rank, step, bytes,
 * sha256} frames, each followed by that many raw bytes, which the
 * receiver writes into memory the owner gives it (sink) while hashing
 * them, and keeps only when the SHA-256 matches; or PEER_FETCH {job, rank,
 * step}, answered by PEER_REPLICA of the copy the owner finds (lookup).
 *
 * Sending never waits: each target keeps the newest copy per rank queued
 * and streams one at a time, 1 MiB at a time; a copy overwritten while it
 * is sent fails at the receiver and is dropped there; a target that cannot
 * be reached is reported (send_failed) and retried with the next copy.
 * Loop thread only.
 */
#ifndef DT_AGENT_PEER_H
#define DT_AGENT_PEER_H

#include <stdint.h>
#include <uv.h>

#include "common/err.h"
#include "common/macros.h"

typedef struct dt_peer dt_peer_t;

typedef struct dt_peer_hooks {
    void *ud;
    /* Where a replica of rank arriving from a peer is written: a
     * descriptor the owner keeps (the older of its replica slots), *slot
     * its slot; -1 to refuse (the rank is out of range). */
    int (*sink)(void *ud, int rank, int *slot);
    /* That replica arrived whole and verified. */
    void (*received)(void *ud, int rank, int slot, int64_t step, int64_t bytes,
                     const char *sha256);
    /* A copy of rank's step to answer PEER_FETCH: its descriptor (the
     * owner's), size and SHA-256, or -1 when there is none. */
    int (*lookup)(void *ud, int rank, int64_t step, int64_t *bytes, char sha256[65]);
    /* dt_peer_fetch ended: ok 1 with the copy (bytes, sha256) verified in
     * its descriptor, else 0 and why. */
    void (*fetched)(void *ud, int rank, int64_t step, int ok, int64_t bytes,
                    const char *sha256, const char *why);
    /* A replica could not be sent to its target (why). */
    void (*send_failed)(void *ud, int rank, int64_t step, const char *why);
} dt_peer_hooks_t;

/* Listen on `listen` ("HOST:PORT", port 0: any free one; or
 * "unix:PATH"). The announced address is HOST:PORT with the port bound, or
 * "*:PORT" when HOST is a wildcard (0.0.0.0 or ::): the coordinator link
 * puts in the address it reaches the coordinator from (agent/link.c).
 * DT_EINVAL for a malformed address, a negative code from libuv's bind or
 * listen, with the address in em. */
DT_MUST_CHECK int dt_peer_new(uv_loop_t *loop, int64_t job, const char *listen, const char *node,
                              const char *munge_socket, const dt_peer_hooks_t *hooks,
                              dt_peer_t **out, dt_emsg_t *em);
/* "host:port" other agents reach this one at. */
const char *dt_peer_addr(const dt_peer_t *p);
/* Send rank's copy of step (fd: the owner's; it is dup'ed) to the agent
 * at `to`, replacing an older copy of rank still queued for it. */
void dt_peer_send(dt_peer_t *p, const char *to, int rank, int64_t step, int fd, int64_t bytes,
                  const char *sha256);
/* Fetch rank's copy of step from the agent at `from` into fd (dup'ed;
 * written from offset 0 and cut to size); hooks.fetched says how it
 * ended. */
void dt_peer_fetch(dt_peer_t *p, const char *from, int rank, int64_t step, int fd);
/* Close the listener and every connection; free after the loop ran the
 * close callbacks. NULL is a no-op for both. */
void dt_peer_close(dt_peer_t *p);
void dt_peer_free(dt_peer_t *p);

#endif /* DT_AGENT_PEER_H */
