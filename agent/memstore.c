/* SPDX-License-Identifier: MIT
 *
 * The agent's in-memory checkpoints (memstore.h).
 */
#include "config.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "agent/memstore.h"
#include "common/mem.h"

typedef struct entry {
    int rank;
    int fd[2];             /* its own copies (the rank runs here); -1 none */
    dt_memcopy_t copy[2];
    int rfd[2];            /* replicas of its copies from its agent elsewhere; -1 none */
    dt_memcopy_t rcopy[2];
} entry_t;

struct dt_memstore {
    int64_t job;
    entry_t *e;
    int n, cap;
};

dt_memstore_t *dt_memstore_new(int64_t job)
{
    dt_memstore_t *m = dt_xcalloc(1, sizeof(*m));
    m->job = job;
    return m;
}

static void close_fds(int fd[2], dt_memcopy_t copy[2])
{
    for (int s = 0; s < 2; s++) {
        if (fd[s] >= 0)
            close(fd[s]);
        fd[s] = -1;
        memset(&copy[s], 0, sizeof(copy[s]));
    }
}

static void entry_close(entry_t *e)
{
    close_fds(e->fd, e->copy);
    close_fds(e->rfd, e->rcopy);
}

void dt_memstore_free(dt_memstore_t *m)
{
    if (m == NULL)
        return;
    for (int i = 0; i < m->n; i++)
        entry_close(&m->e[i]);
    free(m->e);
    free(m);
}

static entry_t *find(const dt_memstore_t *m, int rank)
{
    for (int i = 0; i < m->n; i++)
        if (m->e[i].rank == rank)
            return &m->e[i];
    return NULL;
}

static entry_t *get(dt_memstore_t *m, int rank)
{
    entry_t *e = find(m, rank);
    if (e != NULL)
        return e;
    if (m->n == m->cap) {
        m->cap = m->cap ? 2 * m->cap : 4;
        m->e = dt_xrealloc(m->e, (size_t)m->cap * sizeof(*m->e));
    }
    e = &m->e[m->n++];
    *e = (entry_t){ .rank = rank, .fd = { -1, -1 }, .rfd = { -1, -1 } };
    return e;
}

/* Two memory files into fd[], made where missing; kind "slot" or "replica". */
static int make_fds(const dt_memstore_t *m, int rank, const char *kind, int fd[2],
                    dt_emsg_t *em)
{
    for (int s = 0; s < 2; s++) {
        if (fd[s] >= 0)
            continue;
        char name[64];
        snprintf(name, sizeof(name), "dt-job%lld-rank%d-%s%d", (long long)m->job, rank, kind, s);
        if ((fd[s] = memfd_create(name, MFD_CLOEXEC)) < 0) {
            int err = errno;
            return dt_emsg_set(em, -err, "memfd_create %s: %s", name, strerror(err));
        }
    }
    return 0;
}

int dt_memstore_fds(dt_memstore_t *m, int rank, int fds[2], dt_emsg_t *em)
{
    entry_t *e = get(m, rank);
    int rc = make_fds(m, rank, "slot", e->fd, em);

    fds[0] = e->fd[0];
    fds[1] = e->fd[1];
    return rc;
}

int dt_memstore_replica_sink(dt_memstore_t *m, int rank, int *slot, dt_emsg_t *em)
{
    entry_t *e = get(m, rank);

    if (make_fds(m, rank, "replica", e->rfd, em) < 0)
        return -1;
    int s = e->rcopy[0].step <= e->rcopy[1].step ? 0 : 1;
    memset(&e->rcopy[s], 0, sizeof(e->rcopy[s]));
    *slot = s;
    return e->rfd[s];
}

void dt_memstore_replica_set(dt_memstore_t *m, int rank, int slot, int64_t step, int64_t bytes,
                             const char *sha256)
{
    entry_t *e = find(m, rank);
    if (e == NULL || slot < 0 || slot > 1 || e->rfd[slot] < 0)
        return;
    e->rcopy[slot].step = step;
    e->rcopy[slot].bytes = bytes;
    snprintf(e->rcopy[slot].sha256, sizeof(e->rcopy[slot].sha256), "%s", sha256);
}

int dt_memstore_lookup(const dt_memstore_t *m, int rank, int64_t step, int64_t *bytes,
                       char sha256[65])
{
    const entry_t *e = find(m, rank);
    for (int s = 0; e && step > 0 && s < 4; s++) {
        const dt_memcopy_t *c = s < 2 ? &e->copy[s] : &e->rcopy[s - 2];
        int fd = s < 2 ? e->fd[s] : e->rfd[s - 2];
        if (fd >= 0 && c->step == step) {
            *bytes = c->bytes;
            memcpy(sha256, c->sha256, 65);
            return fd;
        }
    }
    return -1;
}

void dt_memstore_clear(dt_memstore_t *m, int rank, int slot)
{
    entry_t *e = find(m, rank);
    if (e && slot >= 0 && slot < 2 && e->fd[slot] >= 0)
        memset(&e->copy[slot], 0, sizeof(e->copy[slot]));
}

void dt_memstore_set(dt_memstore_t *m, int rank, int slot, int64_t step, int64_t bytes,
                     const char *sha256)
{
    entry_t *e = find(m, rank);
    if (e == NULL || slot < 0 || slot > 1 || e->fd[slot] < 0)
        return;
    e->copy[slot].step = step;
    e->copy[slot].bytes = bytes;
    snprintf(e->copy[slot].sha256, sizeof(e->copy[slot].sha256), "%s", sha256);
}

int dt_memstore_find(const dt_memstore_t *m, int rank, int64_t step, dt_memcopy_t *copy)
{
    const entry_t *e = find(m, rank);
    for (int s = 0; e && step > 0 && s < 2; s++)
        if (e->fd[s] >= 0 && e->copy[s].step == step) {
            if (copy)
                *copy = e->copy[s];
            return s;
        }
    return -1;
}

void dt_memstore_keep(dt_memstore_t *m, const int *ranks, int n)
{
    int k = 0;
    for (int i = 0; i < m->n; i++) {
        entry_t *e = &m->e[i];
        int kept = 0;
        for (int j = 0; j < n && !kept; j++)
            kept = ranks[j] == e->rank;
        if (!kept) /* its own copies go; replicas held for it stay */
            close_fds(e->fd, e->copy);
        if (e->fd[0] >= 0 || e->rfd[0] >= 0)
            m->e[k++] = *e;
    }
    m->n = k;
}

int64_t dt_memstore_bytes(const dt_memstore_t *m)
{
    int64_t b = 0;
    for (int i = 0; i < m->n; i++)
        b += m->e[i].copy[0].bytes + m->e[i].copy[1].bytes + m->e[i].rcopy[0].bytes +
             m->e[i].rcopy[1].bytes;
    return b;
}

int dt_memstore_ranks(const dt_memstore_t *m)
{
    return m->n;
}
