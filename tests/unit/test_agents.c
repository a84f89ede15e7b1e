/* SPDX-License-Identifier: MIT
 *
 * The coordinator's live-agent table (coordinator/coord.c): a randomised
 * run of adds and removes checked against a plain array, and a mass loss
 * of thousands of agents (what the sweep does when a rack goes away).
 */
#include "config.h"

#include <criterion/criterion.h>
#include <stdlib.h>

#include "coordinator/coord.h"

static size_t walk(const dt_coord_t *c)
{
    size_t n = 0;
    for (const dt_live_agent_t *a = c->agents; a; a = a->next) {
        cr_assert(a->next == NULL || a->next->prev == a, "list links broken at agent %lld",
                  (long long)a->id);
        n++;
    }
    return n;
}

static void clear(dt_coord_t *c)
{
    while (c->agents)
        dt_coord_agent_remove(c, c->agents->id);
    free(c->agent_tab);
}

Test(agents, random_adds_and_removes_match_an_array)
{
    dt_coord_t c = { 0 };
    static int64_t live[4096];
    int n = 0;

    srand(7);
    for (int it = 0; it < 100000; it++) {
        if (rand() % 3 < 2 || n == 0) {
            int64_t id = rand() % 20000 + 1;
            if (dt_coord_agent_find(&c, id) || n == 4096)
                continue;
            cr_assert_eq(dt_coord_agent_add(&c, id, 1)->id, id);
            live[n++] = id;
        } else {
            int k = rand() % n;
            dt_coord_agent_remove(&c, live[k]);
            cr_assert_null(dt_coord_agent_find(&c, live[k]), "agent %lld still found",
                           (long long)live[k]);
            live[k] = live[--n];
        }
        if (it % 997 == 0) {
            for (int i = 0; i < n; i++)
                cr_assert_not_null(dt_coord_agent_find(&c, live[i]), "agent %lld lost at %d",
                                   (long long)live[i], it);
            cr_assert_eq(walk(&c), (size_t)n);
            cr_assert_eq(c.nagents, (size_t)n);
        }
    }
    clear(&c);
}

Test(agents, losing_every_agent_at_once)
{
    dt_coord_t c = { 0 };

    for (int64_t id = 1; id <= 8192; id++)
        dt_coord_agent_add(&c, id, id % 7);
    cr_assert_eq(walk(&c), 8192);
    /* remove while walking, as the sweep does */
    for (dt_live_agent_t *a = c.agents, *next; a; a = next) {
        next = a->next;
        if (a->id % 2 == 0)
            dt_coord_agent_remove(&c, a->id);
    }
    cr_assert_eq(c.nagents, 4096);
    for (int64_t id = 1; id <= 8192; id++)
        cr_assert_eq(dt_coord_agent_find(&c, id) != NULL, id % 2 == 1, "agent %lld",
                     (long long)id);
    clear(&c);
    cr_assert_eq(c.nagents, 0);
}

Test(agents, removing_an_unknown_agent_changes_nothing)
{
    dt_coord_t c = { 0 };

    dt_coord_agent_remove(&c, 5); /* empty table */
    dt_coord_agent_add(&c, 1, 1);
    dt_coord_agent_remove(&c, 2);
    cr_assert_eq(c.nagents, 1);
    cr_assert_not_null(dt_coord_agent_find(&c, 1));
    clear(&c);
}
