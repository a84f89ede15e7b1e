/* SPDX-License-Identifier: MIT
 *
 * The likelihood of a sequence, position by position: what `dtengine
 * prefill --out-dir DIR` writes and `dtctl nll DIR` reads. Each rank writes
 * its own rows (its tokens are not contiguous under zigzag):
 *     DIR/nll.K.npy      float32 (c): -log p(target | everything before),
 *                        NaN at a position without a target (the last one
 *                        of a document that ends there)
 *     DIR/nll_pos.K.npy  int64 (c): those rows' positions (pos_offset + t)
 * for K = 0 .. R-1, and rank 0 the summary DIR/perplexity.json: targets,
 * mean NLL and perplexity exp(mean) over the window and per position
 * bucket. Buckets are powers of two of the absolute position: bucket 0 is
 * position 0, bucket b >= 1 is [2^(b-1), 2^b) -- how long-context models
 * are judged ("does the loss keep falling at 100k, 1M tokens?").
 * Concatenated and sorted by position the shards are the sequence's
 * (dt_nll_merge, which `dtctl nll DIR --out FILE` runs).
 *
 * Not here: computing the NLL (engine/cmd/prefill.c, with the loss's own
 * kernel).
 */
#ifndef DT_IO_NLL_H
#define DT_IO_NLL_H

#include <jansson.h>
#include <stdint.h>
#include <stdio.h>

#include "common/err.h"

#define DT_NLL_BUCKETS 54 /* positions are below 2^53 */

/* Sums by bucket: sum of the NLL and number of targets. A plain value,
 * its two arrays adjacent: 2 * DT_NLL_BUCKETS doubles from sum[0], added
 * up over ranks element by element. */
typedef struct dt_nll_sums {
    double sum[DT_NLL_BUCKETS], count[DT_NLL_BUCKETS];
} dt_nll_sums_t;
_Static_assert(sizeof(dt_nll_sums_t) == 2 * DT_NLL_BUCKETS * sizeof(double),
               "dt_nll_sums_t is 2 * DT_NLL_BUCKETS doubles");

/* The bucket of position pos (>= 0). */
int dt_nll_bucket(int64_t pos);
/* Add one target's nll at position pos; NaN (no target) is skipped. */
void dt_nll_add(dt_nll_sums_t *s, int64_t pos, double nll);

/* perplexity.json's object: {"tokens", "pos_offset", "targets", "nll",
 * "ppl", "buckets": [{"from", "to", "targets", "nll", "ppl"}, ...]} with the
 * buckets that hold targets. New reference. */
json_t *dt_nll_summary(const dt_nll_sums_t *s, int64_t tokens, int64_t pos_offset);
/* The same as a table on f: a line over the window, then one per bucket. */
void dt_nll_print(FILE *f, const dt_nll_sums_t *s, int64_t tokens, int64_t pos_offset);

/* Rank K's shard files in dir (0600, atomic each). */
int dt_nll_write_shard(const char *dir, int rank, int64_t c, const float *nll,
                       const int64_t *pos, dt_emsg_t *em);
/* DIR/perplexity.json (dt_nll_summary, indented), atomic. */
int dt_nll_write_summary(const char *dir, const dt_nll_sums_t *s, int64_t tokens,
                         int64_t pos_offset, dt_emsg_t *em);

/* Every shard of dir (K = 0, 1, ... while DIR/nll.K.npy exists), checked:
 * each a 1-D float32 file beside an int64 positions file of the same
 * length, the positions together exactly first .. first + n - 1 once each.
 * *n and *first are set; with out != NULL the NLL in position order is
 * written there (float32 (n), atomic); with s != NULL the sums are
 * accumulated into it. Memory: the whole sequence's NLL and positions
 * (12 bytes a token). DT_ENOENT for no shard, DT_EFORMAT naming the file
 * for a shard that does not fit (lengths, a position twice or missing). */
int dt_nll_merge(const char *dir, const char *out, dt_nll_sums_t *s, int64_t *first,
                 int64_t *n, dt_emsg_t *em);

#endif /* DT_IO_NLL_H */
