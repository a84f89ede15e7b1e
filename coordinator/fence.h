/* SPDX-License-Identifier: MIT
 *
 * The relay of a generation's cross-agent PMIx fences: a list of the
 * fences in flight, which the job's run holds (run.c) and hands here with
 * the generation's agents once it has checked that the generation may
 * fence. This module calls nothing of run.c.
 *
 * All functions run on the loop thread.
 */
#ifndef DT_COORD_FENCE_H
#define DT_COORD_FENCE_H

#include <stdint.h>

#include "common/wire.h"
#include "coordinator/conn.h"

/* A fence in flight; a list of them, NULL when none. */
struct dt_fence;

/* Agent `from`'s part of fence (fm->gen, fm->seq) of the generation whose
 * n agents are `agents`, request `id` on k: OK is replied on k; a part
 * sent again (after a reconnect) is dropped; once all n agents have sent
 * theirs, FENCE_DONE with every part goes to each of them and the fence
 * leaves the list. */
void dt_fence_add(dt_conn_t *k, struct dt_fence **fences, const int64_t *agents, int n,
                  uint32_t id, int64_t from, const dt_wire_fence_t *fm);
/* Forget every fence in flight (the generation is over). */
void dt_fence_clear(struct dt_fence **fences);

#endif /* DT_COORD_FENCE_H */
