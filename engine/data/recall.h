/* SPDX-License-Identifier: MIT
 *
 * The generated associative-recall task of the demo, whose accuracy rises
 * above chance only when attention reaches across rank boundaries.
 */
#ifndef DT_DATA_RECALL_H
#define DT_DATA_RECALL_H

#include <stdint.h>

#include "common/err.h"

/*-- generated associative recall -------------------------------------------*/

/* Vocabulary, in this order (vocab = 4 + K + V + F):
 *   0 BOS, 1 SEP, 2 QUERY, 3 ANSWER
 *   keys    4 .. 4+K            (key k is token 4 + k)
 *   values  4+K .. 4+K+V        (value v is token 4 + K + v)
 *   filler  4+K+V .. 4+K+V+F    (noise between the pairs and the queries)
 *
 * A sequence of L = T + 1 tokens, a function of (seed, sequence index):
 *   [0]                 BOS
 *   [1, p0)             filler, uniform over the F filler tokens
 *   [p0, p0 + 3P)       P pairs "k v SEP", keys distinct, values uniform;
 *                       p0 = floor(4 L / 10), 40% into the sequence
 *   [p0 + 3P, L - 4Q)   filler
 *   [L - 4Q, L)         Q queries "QUERY k ANSWER v", Q distinct planted keys
 *                       in random order, v the value planted with k
 * The pairs take at most 10% of the sequence (10 * (1 + 3P) <= L), so they
 * lie in [0.4 L, 0.5 L): with the sequence over R >= 2 ranks, contiguous
 * (rank floor(0.4 R)) or zigzag (chunks floor(0.8 R) .. R - 1 of 2R, held by
 * ranks other than 0), they are on other ranks than the queries at the end
 * (the last rank, or rank 0 under zigzag), so every answer needs attention
 * across rank boundaries.
 *
 * Targets: y[i] = tok[i + 1] at the Q answer slots (x[i] == ANSWER,
 * i = T - 4Q + 4q + 3 for q = 0..Q-1, the last being T - 1), -1
 * (ignored) elsewhere; with all_targets, y = tok[1..T] everywhere. Recall
 * accuracy is measured at the answer slots only; chance is 1 / V.
 *
 * Random draws: dt_gen_uniform(seed, 4 * index + d, counter) with d = 0
 * filler (counter = position), 1 keys, 2 values, 3 query order; sequence
 * indices below 2^62. */
#define DT_RECALL_BOS 0
#define DT_RECALL_SEP 1
#define DT_RECALL_QUERY 2
#define DT_RECALL_ANSWER 3
#define DT_RECALL_NSPECIAL 4

typedef struct dt_recall_opts {
    int64_t T;       /* x and y hold T tokens; default 1024 (256 per rank on 4) */
    int n_keys;      /* K, default 128 */
    int n_values;    /* V, default 128 (chance 1/128) */
    int n_filler;    /* F, default 252 (so vocab = 512, the tiny model's) */
    int n_pairs;     /* P, default 16: 49 tokens, within 102 = 10% of 1025 */
    int n_queries;   /* Q <= P, default 8 */
    int all_targets; /* default 0: only the answer slots have targets */
    uint64_t seed;   /* default 1 */
} dt_recall_opts_t;

/* Fill o with the defaults above. */
void dt_recall_opts_default(dt_recall_opts_t *o);

/* DT_EINVAL with a message when the options cannot make a sequence. */
int dt_recall_check(const dt_recall_opts_t *o, dt_emsg_t *em);

/* 4 + K + V + F. */
int64_t dt_recall_vocab(const dt_recall_opts_t *o);

/* Position of the first planted key: floor(4 (T + 1) / 10). */
int64_t dt_recall_pairs_start(const dt_recall_opts_t *o);

/* Index into y of the answer slot of query q (0 <= q < Q). */
int64_t dt_recall_answer_pos(const dt_recall_opts_t *o, int q);

/* Sequence `index` as T + 1 tokens. Checks o first. */
int dt_recall_make(const dt_recall_opts_t *o, uint64_t index, int32_t *tok, dt_emsg_t *em);

/* Sequence `index` as x and y (T each), targets as described above. */
int dt_recall_xy(const dt_recall_opts_t *o, uint64_t index, int32_t *x, int32_t *y, dt_emsg_t *em);

/* Recall accuracy of B sequences: pred and y are (B, T) (pred the argmax
 * token at each position); counts the answer slots where pred equals y.
 * Returns correct / (B * Q) and stores the count in *correct when not
 * NULL; 0 when B is 0. */
double dt_recall_score(const dt_recall_opts_t *o, int64_t B, const int32_t *y, const int32_t *pred,
                       int64_t *correct);

#endif /* DT_DATA_RECALL_H */
