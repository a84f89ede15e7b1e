/* SPDX-License-Identifier: MIT
 *
 * An attention mask (spec/mask.h) from the words and files a user gives
 * (dtengine(1)'s --doc-lengths, --sliding-window, --block-mask and
 * --mask-block; npytool ref takes the same):
 *   doc_lengths  "L1,L2,..." or a 1-D .npy of int32 or int64 lengths;
 *   window       W >= 1 (0: none);
 *   block_mask   a .npy of bool or uint8, (T/B, T/B) for every head or
 *                (H, T/B, T/B) one per query head; or, for long sequences,
 *                "ROWPTR.npy,COLS.npy": CSR, row pointers (T/B + 1) or
 *                (H, T/B + 1) and the column indices (1-D, int32 or int64,
 *                ascending within each row), every head's rows indexing
 *                the one column array;
 *   block        B, dividing T (required with block_mask, and only then).
 * Every refusal names the option (or its file) and what is wrong.
 */
#ifndef DT_MASKFILE_H
#define DT_MASKFILE_H

#include <stdbool.h>
#include <stdint.h>

#include "common/err.h"
#include "spec/mask.h"

typedef struct dt_mask_args {
    const char *doc_lengths; /* NULL: none */
    int64_t window;          /* 0: none */
    const char *block_mask;  /* NULL: none */
    int64_t block;           /* 0: none */
} dt_mask_args_t;

/* True when any part is given. */
bool dt_mask_args_any(const dt_mask_args_t *a);

/* Build m (initialised here; dt_mask_close it, also after a failure) for
 * a sequence of T positions, causal or not, with H query heads. */
int dt_mask_load(dt_mask_t *m, const dt_mask_args_t *a, int64_t T, bool causal, int H,
                 dt_emsg_t *em);

#endif /* DT_MASKFILE_H */
