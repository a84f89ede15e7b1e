/* SPDX-License-Identifier: MIT
 *
 * A job's goodput as its generations run: each step rank 0 finishes goes
 * into the step history with its own time and any checkpoint stall
 * before it, and a failure that ended a generation is costed once the
 * next generation has finished a step (db.h: dt_db_step_add,
 * dt_db_failure_cost; what ETTR sums: dt_db_goodput).
 *
 * A step's own time is the engine's: the tokens it did over the rate it
 * reported (data, forward, backward, update), or, when the engine reports
 * no rate (prefill), the time since the previous report. A checkpoint's
 * stall is the rest of the gap between two reports when a checkpoint
 * shard was reported between them. The failure's time is when its first
 * sign reached the coordinator (a worker's exit) or when the lost agent
 * was last heard; the decision is when the generation was aborted.
 *
 * run.c owns one per job run and calls it; it calls nothing back. Not
 * durable: a coordinator restart forgets a failure whose cost was still
 * pending (its steps are in the database).
 */
#ifndef DT_COORD_GOODPUT_H
#define DT_COORD_GOODPUT_H

#include <stdint.h>

#include "db/db.h"

typedef struct dt_goodput_run {
    int gen;              /* the generation counted, 0 before the first */
    int64_t last_step;    /* rank 0's newest step done in it (its resume step before one) */
    int64_t last_ms;      /* when that was reported (wall ms), 0 none */
    int64_t start_ms;     /* when the generation started (wall ms) */
    int ckpt;             /* a checkpoint shard was reported since */
    /* the failure whose cost waits for a step (fail_gen 0: none) */
    int fail_gen;
    char fail_what[24];
    int64_t fault_ms, decided_ms;
} dt_goodput_run_t;

/* Generation gen starts now (wall ms), from resume_step (0: the start).
 * A pending failure stays pending. */
void dt_goodput_gen_start(dt_goodput_run_t *g, int gen, int64_t resume_step, int64_t now_ms);
/* Rank 0 reported steps done `step` (tokens so far, its rate and loss,
 * NaN or 0 when not known) at now_ms: a new step is recorded, and a
 * pending failure costed (its event logged). Database errors are logged:
 * the job goes on. */
void dt_goodput_progress(dt_db_t *db, int64_t job, dt_goodput_run_t *g, int64_t step,
                         int64_t tokens, double loss, double tokens_s, int64_t now_ms);
/* A checkpoint shard of the generation was reported. */
void dt_goodput_ckpt(dt_goodput_run_t *g);
/* The generation is aborted by a failure (what: one word of [a-z_];
 * fault_ms when it happened, 0 for now) at now_ms. A failure of the
 * generation after a failed one, before its first step, costs that one
 * first (its load counted to this failure). One per generation: a second
 * abort of the same generation adds nothing. */
void dt_goodput_fault(dt_db_t *db, int64_t job, dt_goodput_run_t *g, const char *what,
                      int64_t fault_ms, int64_t now_ms);

#endif /* DT_COORD_GOODPUT_H */
