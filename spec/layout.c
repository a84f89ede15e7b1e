/* SPDX-License-Identifier: MIT
 *
 * Token layouts over the ranks of a ring: which positions each rank holds.
 */
#include "config.h"

#include <string.h>

#include "spec/layout.h"

const char *dt_layout_name(enum dt_layout l)
{
    return l == DT_LAYOUT_ZIGZAG ? "zigzag" : l == DT_LAYOUT_BALANCED ? "balanced" : "contiguous";
}

int dt_layout_parse(const char *s, enum dt_layout *out)
{
    if (strcmp(s, "contiguous") == 0)
        *out = DT_LAYOUT_CONTIGUOUS;
    else if (strcmp(s, "zigzag") == 0)
        *out = DT_LAYOUT_ZIGZAG;
    else if (strcmp(s, "balanced") == 0)
        *out = DT_LAYOUT_BALANCED;
    else
        return DT_EINVAL;
    return 0;
}

int dt_layout_pieces(enum dt_layout l, int R)
{
    if (R <= 1 || l == DT_LAYOUT_CONTIGUOUS)
        return 1;
    return l == DT_LAYOUT_ZIGZAG ? 2 : 2 * DT_LAYOUT_PAIRS;
}

int dt_layout_check(enum dt_layout l, int64_t T, int R, dt_emsg_t *em)
{
    if (R < 1)
        return dt_emsg_set(em, DT_ELAYOUT, "rank count %d must be at least 1", R);
    if (T < R)
        return dt_emsg_set(em, DT_ELAYOUT,
                           "sequence length T=%lld is smaller than the rank count R=%d",
                           (long long)T, R);
    int pieces = dt_layout_pieces(l, R);
    if (pieces > 1 && T % (pieces * (int64_t)R) != 0)
        return dt_emsg_set(em, DT_ELAYOUT,
                           "%s layout needs T divisible by %dR: T=%lld, %dR=%d",
                           dt_layout_name(l), pieces, (long long)T, pieces, pieces * R);
    if (T % R != 0)
        return dt_emsg_set(em, DT_ELAYOUT,
                           "contiguous layout needs T divisible by R: T=%lld, R=%d",
                           (long long)T, R);
    return 0;
}

int64_t dt_layout_local(int64_t T, int R)
{
    return T / R;
}

int dt_layout_runs(enum dt_layout l, int64_t T, int R, int r, dt_run_t runs[DT_LAYOUT_MAXRUNS])
{
    int64_t c = T / R;

    if (l == DT_LAYOUT_ZIGZAG && R > 1) {
        int64_t h = c / 2;
        runs[0] = (dt_run_t){ (int64_t)r * h, h };
        runs[1] = (dt_run_t){ (int64_t)(2 * R - 1 - r) * h, h };
        return 2;
    }
    if (l == DT_LAYOUT_BALANCED && R > 1) {
        int64_t h = c / (2 * DT_LAYOUT_PAIRS), span = 2 * (int64_t)R * h;
        for (int p = 0; p < DT_LAYOUT_PAIRS; p++) {
            runs[2 * p] = (dt_run_t){ p * span + (int64_t)r * h, h };
            runs[2 * p + 1] = (dt_run_t){ p * span + (int64_t)(2 * R - 1 - r) * h, h };
        }
        return 2 * DT_LAYOUT_PAIRS;
    }
    runs[0] = (dt_run_t){ (int64_t)r * c, c };
    return 1;
}

void dt_layout_positions(enum dt_layout l, int64_t T, int R, int r, int64_t *pos)
{
    dt_run_t runs[DT_LAYOUT_MAXRUNS];
    int n = dt_layout_runs(l, T, R, r, runs);

    for (int i = 0; i < n; i++)
        for (int64_t j = 0; j < runs[i].len; j++)
            *pos++ = runs[i].start + j;
}
