/* SPDX-License-Identifier: MIT
 *
 * How the T tokens of a sequence are laid out over R ranks.
 *   contiguous: rank r holds positions [r c, (r + 1) c), c = T / R.
 *   zigzag:     the sequence is cut into 2R chunks of c / 2; rank r holds
 *               chunks r and 2R - 1 - r, in that order, so every rank gets
 *               the same amount of causal work.
 *   balanced:   zigzag four times over: the sequence is cut into
 *               DT_LAYOUT_PAIRS = 4 spans of 2R chunks of c / 8; rank r
 *               holds chunks r and 2R - 1 - r of every span, in position
 *               order, so that work that is not spread like causal work
 *               (documents, windows, block patterns) still reaches every
 *               rank about equally, wherever it lies in the sequence.
 *               On one rank both zigzags are contiguous.
 * A rank's tokens are a list of runs (start, len) in the order they are
 * stored locally; positions increase along the local rows.
 */
#ifndef DT_LAYOUT_H
#define DT_LAYOUT_H

#include <stdint.h>

#include "common/err.h"

enum dt_layout {
    DT_LAYOUT_CONTIGUOUS = 0,
    DT_LAYOUT_ZIGZAG,
    DT_LAYOUT_BALANCED,
};

#define DT_LAYOUT_PAIRS 4 /* balanced: zigzag spans */
#define DT_LAYOUT_MAXRUNS (2 * DT_LAYOUT_PAIRS)

typedef struct dt_run {
    int64_t start; /* first position */
    int64_t len;   /* number of positions */
} dt_run_t;

const char *dt_layout_name(enum dt_layout l);
/* "contiguous", "zigzag" or "balanced"; DT_EINVAL otherwise. */
int dt_layout_parse(const char *s, enum dt_layout *out);

/* The pieces each rank's tokens come in: 1 contiguous (and any layout on
 * one rank), 2 zigzag, 2 DT_LAYOUT_PAIRS balanced. T must be a multiple
 * of R times it. */
int dt_layout_pieces(enum dt_layout l, int R);

/* Check that T tokens split over R ranks in this layout (T a multiple of
 * R dt_layout_pieces), T >= R. DT_ELAYOUT with a message otherwise. */
int dt_layout_check(enum dt_layout l, int64_t T, int R, dt_emsg_t *em);

/* The runs of rank r (0 <= r < R), in position order but zigzag's (whose
 * second run is after the first too); returns their number (1 to
 * DT_LAYOUT_MAXRUNS). */
int dt_layout_runs(enum dt_layout l, int64_t T, int R, int r, dt_run_t runs[DT_LAYOUT_MAXRUNS]);

/* Tokens per rank, T / R. */
int64_t dt_layout_local(int64_t T, int R);

/* Fill pos (c values) with the positions of rank r's local rows. */
void dt_layout_positions(enum dt_layout l, int64_t T, int R, int r, int64_t *pos);

#endif /* DT_LAYOUT_H */
