/* SPDX-License-Identifier: MIT
 *
 * The training data loader: a deterministic walk over one or several token
 * shards (io/tokshard.h) whose position is a plain struct, saved in
 * checkpoints and restored exactly.
 */
#ifndef DT_DATA_LOADER_H
#define DT_DATA_LOADER_H

#include <stdint.h>

#include "common/err.h"
#include "io/tokshard.h"

/*-- loader -------------------------------------------------------------------*/

/* The loader walks shards in a fixed order and hands out sequences of T + 1
 * tokens split as x = tok[0..T), y = tok[1..T]. Sequence j of a shard covers
 * tokens [j*T, j*T + T + 1) (consecutive sequences share one token, as in
 * llm.c), so a shard of n tokens holds nseq = (n - 1) / T sequences; the
 * remainder is not used. Every shard must hold at least one sequence.
 *
 * Order: shards sorted by path (strcmp, so every node agrees), sequences in
 * file order. With shuffle, each epoch permutes the shard order and, inside
 * each shard, the sequence order (Fisher-Yates driven by dt_gen_uniform
 * under `seed`, streams (epoch << 32 | shard) for sequences and
 * (epoch << 32 | 0xffffffff) for shards): the order is a function of (seed,
 * epoch, shard list, T) only, identical on every rank and after a restart.
 *
 * Data parallel: with dp_size > 1, each call to next consumes dp_size
 * consecutive sequences of that order and returns the dp_rank-th; the
 * cursor is the same on every replica. (Ring ranks of one sequence use
 * dp_size 1 and all read the same sequence.) */
typedef struct dt_loader_opts {
    int64_t T;     /* tokens per sequence (x and y each hold T) */
    int shuffle;   /* 0: file order; 1: permute every epoch */
    uint64_t seed; /* shuffle seed */
    int dp_rank;   /* 0 <= dp_rank < dp_size */
    int dp_size;   /* 0 means 1 */
    int64_t vocab; /* > 0: a token >= vocab is refused (names file and index) */
} dt_loader_opts_t;

/* Where the loader stands: the next sequence is number `seq` (in the
 * epoch's order) of the shard at position `shard` in the epoch's shard
 * order. A plain value: store it in a checkpoint and give it back to
 * set_cursor with the same shard list and options to continue exactly. */
typedef struct dt_loader_cursor {
    uint64_t epoch; /* full passes over all shards completed */
    int64_t shard;  /* position in this epoch's shard order, 0 <= shard < nshards */
    int64_t seq;    /* position in that shard's sequence order, 0 <= seq < nseq */
} dt_loader_cursor_t;

typedef struct dt_loader dt_loader_t;

/* A loader over npaths shard files (validated now, each opened and
 * closed; only the current shard is held open later) or over the files
 * matching a glob pattern. DT_ENOENT when the glob matches nothing,
 * DT_EINVAL for bad options or a shard too short for one sequence, else
 * what dt_tok_shard_new returns. The cursor starts at {0, 0, 0}. */
int dt_loader_new(const char *const *paths, int npaths, const dt_loader_opts_t *o,
                  dt_loader_t **out, dt_emsg_t *em);
int dt_loader_new_glob(const char *pattern, const dt_loader_opts_t *o, dt_loader_t **out,
                       dt_emsg_t *em);
void dt_loader_free(dt_loader_t *l);

int dt_loader_nshards(const dt_loader_t *l);
/* Total tokens in all shards; sequences per epoch (before dp_size). */
int64_t dt_loader_ntok(const dt_loader_t *l);
int64_t dt_loader_nseq(const dt_loader_t *l);

/* The next sequence into x and y (T int32 each) and advance the cursor
 * (wrapping to the next epoch after the last shard). On failure the cursor
 * does not move. */
int dt_loader_next(dt_loader_t *l, int32_t *x, int32_t *y, dt_emsg_t *em);

void dt_loader_get_cursor(const dt_loader_t *l, dt_loader_cursor_t *c);
/* DT_EINVAL (the loader unchanged) when shard or seq is out of range. */
int dt_loader_set_cursor(dt_loader_t *l, const dt_loader_cursor_t *c, dt_emsg_t *em);

#endif /* DT_DATA_LOADER_H */
