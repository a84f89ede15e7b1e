/* SPDX-License-Identifier: MIT
 *
 * Attention masks over the positions of one sequence of T tokens: which
 * (query i, key j) pairs attention may use, 0 <= i, j < T. A pair is
 * attended if and only if every part given allows it:
 *   causal      j <= i;
 *   documents   i and j lie in the same document, the documents being
 *               consecutive runs of given lengths that sum to T;
 *   window W    causal: i - j < W; not causal: |i - j| < W (Hugging
 *               Face's sliding_window);
 *   blocks B    block_allows(h, i / B, j / B): a (T/B, T/B) pattern, one
 *               for every query head or one per head, kept as compressed
 *               rows (CSR: each query block's allowed key blocks, sorted).
 * A query row that no key is allowed to keeps o = 0, lse = -inf.
 *
 * The causal, document and window parts together allow, for query i, one
 * interval of keys [lo(i), hi(i)) (it always holds i), and lo and hi never
 * decrease as i grows: that is what makes the box test below exact for
 * them and cheap. Blocks are tested block by block.
 *
 * Every binary agrees on this definition: the planner counts the pairs
 * (dt_mask_pairs), the engine's ring skips blocks and transfers that no
 * pair needs, the CPU and GPU kernels skip tiles and cut partial ones
 * (dt_mask_box, dt_mask_row). Positions are sequence positions (int64),
 * not RoPE positions (a document's RoPE positions may restart at 0).
 */
#ifndef DT_MASK_H
#define DT_MASK_H

#include <stdbool.h>
#include <stdint.h>

#include "common/err.h"

typedef struct dt_mask {
    int64_t T;
    bool causal;
    /* documents: ndoc starts, ascending, start[0] = 0; ndoc = 0: one
     * document (none given) */
    int64_t ndoc;
    int64_t *doc_start;
    int64_t window; /* W >= 1; 0: none */
    /* blocks: B > 0 divides T, nb = T / B; nhead 1 (every head) or H;
     * head h's query block a allows cols[rowptr[h * (nb + 1) + a] ..
     * rowptr[h * (nb + 1) + a + 1]), sorted, each in [0, nb) */
    int64_t block, nb;
    int nhead;
    int64_t *rowptr; /* (nhead, nb + 1) */
    int64_t *cols;
} dt_mask_t;

/* What a box of pairs holds: none allowed, some, or all. */
enum dt_mask_box {
    DT_MASK_EMPTY = 0,
    DT_MASK_PARTIAL,
    DT_MASK_FULL,
};

/* A mask that allows every pair (causal as given) of a sequence of T. */
void dt_mask_init(dt_mask_t *m, int64_t T, bool causal);
void dt_mask_close(dt_mask_t *m);
/* A deep copy of src into dst (dst's old arrays are not freed). */
void dt_mask_copy(dt_mask_t *dst, const dt_mask_t *src);

/* True when the mask restricts nothing beyond causality. */
bool dt_mask_is_plain(const dt_mask_t *m);

/* The parts, each checked against T (DT_EINVAL naming the problem):
 * document lengths (n >= 1, each >= 1, summing to T); a window W >= 1; a
 * block pattern of block size B (B >= 1 dividing T) for nhead heads (1 or
 * H), as a dense (nhead, nb, nb) array of 0/1 bytes or as CSR (rowptr
 * (nhead, nb + 1) non-decreasing from 0, each head's rows indexing one
 * shared cols array; cols in [0, nb), ascending within a row). The
 * arrays are copied. */
int dt_mask_set_docs(dt_mask_t *m, const int64_t *len, int64_t n, dt_emsg_t *em);
int dt_mask_set_window(dt_mask_t *m, int64_t W, dt_emsg_t *em);
int dt_mask_set_blocks_dense(dt_mask_t *m, int64_t B, int nhead, const uint8_t *dense,
                             dt_emsg_t *em);
int dt_mask_set_blocks_csr(dt_mask_t *m, int64_t B, int nhead, const int64_t *rowptr,
                           int64_t nnz, const int64_t *cols, dt_emsg_t *em);

/* src's block pattern moved into dst (replacing dst's); src closed. */
void dt_mask_take_blocks(dt_mask_t *dst, dt_mask_t *src);

/* The blocks' heads agree with H query heads: nhead is 1 or H. */
int dt_mask_check_heads(const dt_mask_t *m, int H, dt_emsg_t *em);

/* The document holding position p (0 when there are none). */
int64_t dt_mask_doc(const dt_mask_t *m, int64_t p);

/* The interval [*lo, *hi) of keys that causality, documents and the
 * window allow query i (blocks aside). */
void dt_mask_row(const dt_mask_t *m, int64_t i, int64_t *lo, int64_t *hi);

/* Whether head h may attend key j from query i. */
bool dt_mask_allows(const dt_mask_t *m, int h, int64_t i, int64_t j);

/* The pairs of query head h with i in [qlo, qhi] and j in [klo, khi]
 * (inclusive; a caller's positions need only lie inside the box, so a
 * box that is EMPTY or FULL is so for any subset): EMPTY when none is
 * allowed, FULL when all are, PARTIAL otherwise (exact without blocks;
 * with blocks PARTIAL may also mean the parts disagree). */
enum dt_mask_box dt_mask_box(const dt_mask_t *m, int h, int64_t qlo, int64_t qhi, int64_t klo,
                             int64_t khi);

/* Allowed pairs of head h with i in [qlo, qhi) and j in [klo, khi)
 * (half-open), counted exactly; the whole mask is [0, T) x [0, T). */
double dt_mask_pairs(const dt_mask_t *m, int h, int64_t qlo, int64_t qhi, int64_t klo,
                     int64_t khi);

#endif /* DT_MASK_H */
