/* SPDX-License-Identifier: MIT
 *
 * Cross-agent PMIx fences of a generation (fence.h): each agent's part
 * (its workers' data) collected per fence, and once every agent of the
 * generation has sent its part, FENCE_DONE with all of them, in the order
 * they came, to each agent. In memory only: after a coordinator restart
 * the agents send their parts again.
 *
 * Not here: which generation is current and whether it may fence (run.c
 * checks that, then calls this file; this file calls nothing of it), the
 * PMIx server on the nodes (agent/pmix.c).
 */
#include "config.h"

#include <stdlib.h>
#include <string.h>

#include "common/base64.h"
#include "common/mem.h"
#include "common/proto.h"
#include "common/wire.h"
#include "coordinator/fence.h"
#include "coordinator/push.h"

typedef struct dt_fence {
    uint32_t gen, seq;
    int64_t *from; /* agents that sent theirs */
    int n;
    unsigned char *data;
    size_t len;
    struct dt_fence *next;
} fence_t;

static void b64_append(fence_t *f, const char *b64)
{
    size_t n = strlen(b64);
    f->data = dt_xrealloc(f->data, f->len + DT_BASE64_DECODED_MAX(n));
    int len = dt_base64_decode(b64, n, f->data + f->len);
    if (len < 0)
        return;
    f->len += (size_t)len;
}

void dt_fence_add(dt_conn_t *k, struct dt_fence **fences, const int64_t *agents, int n,
                  uint32_t id, int64_t from, const dt_wire_fence_t *fm)
{
    dt_coord_t *c = k->coord;
    int64_t gen = fm->gen, seq = fm->seq;

    fence_t *f = *fences;
    while (f && !(f->gen == (uint32_t)gen && f->seq == (uint32_t)seq))
        f = f->next;
    if (f == NULL) {
        f = dt_xcalloc(1, sizeof(*f));
        f->gen = (uint32_t)gen;
        f->seq = (uint32_t)seq;
        f->from = dt_xcalloc((size_t)n, sizeof(*f->from));
        f->next = *fences;
        *fences = f;
    }
    dt_conn_reply(k, DT_MSG_OK, id, NULL);
    for (int i = 0; i < f->n; i++)
        if (f->from[i] == from)
            return; /* sent again after a reconnect */
    f->from[f->n++] = from;
    b64_append(f, fm->data);
    if (f->n < n)
        return;
    char *b64 = dt_base64_encode(f->data, f->len);
    dt_wire_fence_done_t fd = { .gen = (uint32_t)gen, .seq = (uint32_t)seq, .data = b64 };
    json_t *done = dt_wire_fence_done_encode(&fd);
    for (int i = 0; i < n; i++)
        dt_push_msg(dt_coord_agent_find(c, agents[i]), DT_MSG_FENCE_DONE, json_incref(done));
    json_decref(done);
    free(b64);
    for (fence_t **pp = fences; *pp; pp = &(*pp)->next)
        if (*pp == f) {
            *pp = f->next;
            break;
        }
    free(f->from);
    free(f->data);
    free(f);
}

void dt_fence_clear(struct dt_fence **fences)
{
    while (*fences) {
        fence_t *f = *fences;
        *fences = f->next;
        free(f->from);
        free(f->data);
        free(f);
    }
}
