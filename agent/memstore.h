/* SPDX-License-Identifier: MIT
 *
 * The in-memory checkpoints an agent holds for the ranks it runs
 * (dtagentd(8)): per rank two memory files (memfd_create: anonymous
 * memory the kernel keeps while a descriptor is open, not a tmpfs that
 * containers cap), which its workers inherit and write their state into
 * alternately (engine/cmd/memckpt.h), and what each holds once verified:
 * its step, size and SHA-256; and for ranks whose agent is elsewhere, two
 * files of replicas of their copies (agent/peer.h). The files outlive the workers: a recovery on
 * this agent resumes from them. They are the agent's (its user's, the
 * job's owner) and go with it, or with the job.
 *
 * Loop thread only; a descriptor handed to a thread is dup'ed first.
 */
#ifndef DT_AGENT_MEMSTORE_H
#define DT_AGENT_MEMSTORE_H

#include <stdint.h>

#include "common/err.h"
#include "common/macros.h"

typedef struct dt_memstore dt_memstore_t;

/* What a slot holds: step 0 when nothing verified. */
typedef struct dt_memcopy {
    int64_t step, bytes;
    char sha256[65];
} dt_memcopy_t;

dt_memstore_t *dt_memstore_new(int64_t job);
/* Closes every file: the memory goes back. NULL is a no-op. */
void dt_memstore_free(dt_memstore_t *m);
/* Rank's two files, made on first use. DT_ENOMEM, DT_EMFILE-like codes
 * from memfd_create with a message. */
DT_MUST_CHECK int dt_memstore_fds(dt_memstore_t *m, int rank, int fds[2], dt_emsg_t *em);
/* The slot's copy is being rewritten (nothing verified in it), or holds
 * this verified copy. Unknown ranks are ignored. */
void dt_memstore_clear(dt_memstore_t *m, int rank, int slot);
void dt_memstore_set(dt_memstore_t *m, int rank, int slot, int64_t step, int64_t bytes,
                     const char *sha256);
/* Where a replica of rank's copy (its agent elsewhere) is received: the
 * older of two replica files (made on first use), its record cleared,
 * *slot which; -1 with em when the memory cannot be had. */
int dt_memstore_replica_sink(dt_memstore_t *m, int rank, int *slot, dt_emsg_t *em);
/* That replica arrived and verified. */
void dt_memstore_replica_set(dt_memstore_t *m, int rank, int slot, int64_t step, int64_t bytes,
                             const char *sha256);
/* A verified copy of rank's step, its own or a replica: its descriptor (the
 * store's), *bytes and sha256; -1 none. */
int dt_memstore_lookup(const dt_memstore_t *m, int rank, int64_t step, int64_t *bytes,
                       char sha256[65]);
/* The slot of rank's copy of step, -1 none; *copy (may be NULL) gets it. */
int dt_memstore_find(const dt_memstore_t *m, int rank, int64_t step, dt_memcopy_t *copy);
/* Keep the own files of these ranks only (the generation's here); the
 * others' memory goes back. Replicas stay until the job ends (two a rank
 * at most). */
void dt_memstore_keep(dt_memstore_t *m, const int *ranks, int n);
/* Bytes held in verified copies, and the ranks that have files. */
int64_t dt_memstore_bytes(const dt_memstore_t *m);
int dt_memstore_ranks(const dt_memstore_t *m);

#endif /* DT_AGENT_MEMSTORE_H */
