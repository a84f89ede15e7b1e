/* SPDX-License-Identifier: MIT
 *
 * The bottom of dtcoordd: what every other coordinator file may call and
 * that calls none of them. Events on a job's history, the clocks, and the
 * table of live agents (open addressing with linear probing on the agent
 * id for lookups on every heartbeat, a doubly linked list for walks; add,
 * find and remove are O(1) on average). The durable record of each agent
 * is in the database, not here.
 *
 * Not here: the daemon's life cycle (main.c), anything that decides
 * (recovery.c) or talks to a peer (conn.c).
 */
#include "config.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>

#include "common/log.h"
#include "common/mem.h"
#include "coordinator/coord.h"

/*-- events and clocks -------------------------------------------------------------*/

void dt_coord_event(dt_coord_t *c, int64_t job, const char *kind, const char *fmt, ...)
{
    char detail[1024];
    dt_emsg_t em = { "" };
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(detail, sizeof(detail), fmt, ap);
    va_end(ap);
    if (dt_db_event_add(c->db, job, kind, detail, &em) < 0)
        dt_log_error("job=%lld event %s: %s", (long long)job, kind, em.s);
    dt_log_info("job=%lld %s: %s", (long long)job, kind, detail);
}

/*-- live agents -------------------------------------------------------------------*/

/* Open addressing on the agent id; the list keeps iteration simple. */
static size_t slot_of(const dt_coord_t *c, int64_t id)
{
    return (size_t)((uint64_t)id * 0x9e3779b97f4a7c15ULL >> 20) & (c->agent_cap - 1);
}

dt_live_agent_t *dt_coord_agent_find(dt_coord_t *c, int64_t id)
{
    if (c->agent_cap == 0)
        return NULL;
    for (size_t i = slot_of(c, id);; i = (i + 1) & (c->agent_cap - 1)) {
        dt_live_agent_t *a = c->agent_tab[i];
        if (a == NULL)
            return NULL;
        if (a->id == id)
            return a;
    }
}

static void rehash(dt_coord_t *c, size_t cap)
{
    free(c->agent_tab);
    c->agent_cap = cap;
    c->agent_tab = dt_xcalloc(cap, sizeof(*c->agent_tab));
    for (dt_live_agent_t *a = c->agents; a; a = a->next) {
        size_t i = slot_of(c, a->id);
        while (c->agent_tab[i])
            i = (i + 1) & (cap - 1);
        c->agent_tab[i] = a;
    }
}

dt_live_agent_t *dt_coord_agent_add(dt_coord_t *c, int64_t id, int64_t job)
{
    dt_live_agent_t *a = dt_xcalloc(1, sizeof(*a));
    a->id = id;
    a->job = job;
    a->next = c->agents;
    if (c->agents)
        c->agents->prev = a;
    c->agents = a;
    c->nagents++;
    if (c->nagents * 2 > c->agent_cap)
        rehash(c, c->agent_cap ? c->agent_cap * 2 : 64);
    else {
        size_t i = slot_of(c, id);
        while (c->agent_tab[i])
            i = (i + 1) & (c->agent_cap - 1);
        c->agent_tab[i] = a;
    }
    return a;
}

/* O(1) on average: backward-shift deletion keeps linear probing correct
 * without tombstones, and the list is doubly linked. Losing thousands of
 * agents at once (a rack going away) costs thousands of steps, not
 * millions. */
void dt_coord_agent_remove(dt_coord_t *c, int64_t id)
{
    size_t mask = c->agent_cap - 1, i, j;
    dt_live_agent_t *a;

    if (c->agent_cap == 0)
        return;
    for (i = slot_of(c, id);; i = (i + 1) & mask) {
        if ((a = c->agent_tab[i]) == NULL)
            return;
        if (a->id == id)
            break;
    }
    c->agent_tab[i] = NULL;
    for (j = (i + 1) & mask; c->agent_tab[j]; j = (j + 1) & mask) {
        size_t home = slot_of(c, c->agent_tab[j]->id);
        /* move j back into the hole at i unless its home lies in (i, j] */
        int between = i <= j ? (home > i && home <= j) : (home > i || home <= j);
        if (!between) {
            c->agent_tab[i] = c->agent_tab[j];
            c->agent_tab[j] = NULL;
            i = j;
        }
    }
    if (a->prev)
        a->prev->next = a->next;
    else
        c->agents = a->next;
    if (a->next)
        a->next->prev = a->prev;
    free(a);
    c->nagents--;
}

