/* SPDX-License-Identifier: MIT
 *
 * How the T tokens of a sequence are laid out over R ranks.
 *   contiguous: rank r holds positions [r c, (r + 1) c), c = T / R.
 *   zigzag:     the sequence is cut into 2R chunks of c / 2; rank r holds
 *               chunks r and 2R - 1 - r, in that order, so every rank gets
 *               the same amount of causal work.
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
};

#define DT_LAYOUT_MAXRUNS 2

typedef struct dt_run {
    int64_t start; /* first position */
    int64_t len;   /* number of positions */
} dt_run_t;

const char *dt_layout_name(enum dt_layout l);
/* "contiguous" or "zigzag"; DT_EINVAL otherwise. */
int dt_layout_parse(const char *s, enum dt_layout *out);

/* Check that T tokens split over R ranks in this layout (T % R == 0, or
 * T % 2R == 0 for zigzag when R > 1; zigzag on one rank is contiguous),
 * T >= R. DT_ELAYOUT with a message otherwise. */
int dt_layout_check(enum dt_layout l, int64_t T, int R, dt_emsg_t *em);

/* The runs of rank r (0 <= r < R); returns their number (1 or 2). */
int dt_layout_runs(enum dt_layout l, int64_t T, int R, int r, dt_run_t runs[DT_LAYOUT_MAXRUNS]);

/* Tokens per rank, T / R. */
int64_t dt_layout_local(int64_t T, int R);

/* Fill pos (c values) with the positions of rank r's local rows. */
void dt_layout_positions(enum dt_layout l, int64_t T, int R, int r, int64_t *pos);

#endif /* DT_LAYOUT_H */
