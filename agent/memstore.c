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
    int fd[2];
    dt_memcopy_t copy[2];
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

static void entry_close(entry_t *e)
{
    for (int s = 0; s < 2; s++)
        if (e->fd[s] >= 0)
            close(e->fd[s]);
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

int dt_memstore_fds(dt_memstore_t *m, int rank, int fds[2], dt_emsg_t *em)
{
    entry_t *e = find(m, rank);

    if (e == NULL) {
        entry_t ne = { .rank = rank, .fd = { -1, -1 } };
        for (int s = 0; s < 2; s++) {
            char name[64];
            snprintf(name, sizeof(name), "dt-job%lld-rank%d-slot%d", (long long)m->job, rank, s);
            if ((ne.fd[s] = memfd_create(name, MFD_CLOEXEC)) < 0) {
                int err = errno;
                entry_close(&ne);
                return dt_emsg_set(em, -err, "memfd_create %s: %s", name, strerror(err));
            }
        }
        if (m->n == m->cap) {
            m->cap = m->cap ? 2 * m->cap : 4;
            m->e = dt_xrealloc(m->e, (size_t)m->cap * sizeof(*m->e));
        }
        m->e[m->n] = ne;
        e = &m->e[m->n++];
    }
    fds[0] = e->fd[0];
    fds[1] = e->fd[1];
    return 0;
}

void dt_memstore_clear(dt_memstore_t *m, int rank, int slot)
{
    entry_t *e = find(m, rank);
    if (e && slot >= 0 && slot < 2)
        memset(&e->copy[slot], 0, sizeof(e->copy[slot]));
}

void dt_memstore_set(dt_memstore_t *m, int rank, int slot, int64_t step, int64_t bytes,
                     const char *sha256)
{
    entry_t *e = find(m, rank);
    if (e == NULL || slot < 0 || slot > 1)
        return;
    e->copy[slot].step = step;
    e->copy[slot].bytes = bytes;
    snprintf(e->copy[slot].sha256, sizeof(e->copy[slot].sha256), "%s", sha256);
}

int dt_memstore_find(const dt_memstore_t *m, int rank, int64_t step, dt_memcopy_t *copy)
{
    const entry_t *e = find(m, rank);
    for (int s = 0; e && step > 0 && s < 2; s++)
        if (e->copy[s].step == step) {
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
        int kept = 0;
        for (int j = 0; j < n && !kept; j++)
            kept = ranks[j] == m->e[i].rank;
        if (kept)
            m->e[k++] = m->e[i];
        else
            entry_close(&m->e[i]);
    }
    m->n = k;
}

int64_t dt_memstore_bytes(const dt_memstore_t *m)
{
    int64_t b = 0;
    for (int i = 0; i < m->n; i++)
        b += m->e[i].copy[0].bytes + m->e[i].copy[1].bytes;
    return b;
}

int dt_memstore_ranks(const dt_memstore_t *m)
{
    return m->n;
}
