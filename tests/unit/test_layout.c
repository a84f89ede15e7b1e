/* SPDX-License-Identifier: MIT
 *
 * Unit tests of spec/layout.h: which positions each rank holds under the
 * contiguous and zigzag layouts, the refusal of splits that do not work, and
 * the layout names. Properties are checked for every rank of several
 * (T, R): the ranks' runs tile [0, T) exactly once, each rank's positions
 * rise along its local rows, dt_layout_positions agrees with the runs, and
 * zigzag rank r holds chunks r and 2R - 1 - r of c / 2.
 *
 * Not here: attention over these layouts (test_attn.c).
 */
#include "config.h"

#include <criterion/criterion.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/err.h"
#include "spec/layout.h"

struct split {
    int64_t T;
    int R;
};

/* Splits every layout accepts: T a multiple of 2R. */
static const struct split good[] = {
    { 2, 1 },  { 8, 1 },  { 8, 2 },     { 8, 4 },     { 12, 3 },
    { 24, 6 }, { 64, 8 }, { 1000, 10 }, { 2048, 16 },
};

#define NGOOD (sizeof(good) / sizeof(good[0]))

static const char *lname(enum dt_layout l)
{
    return dt_layout_name(l);
}

static int cmp_run(const void *a, const void *b)
{
    const dt_run_t *x = a, *y = b;
    return (x->start > y->start) - (x->start < y->start);
}

/* The runs of all ranks, sorted by start, must tile [0, T): each position
 * is held by exactly one rank. Works for any T (no per-position array). */
static void check_runs_tile(enum dt_layout l, int64_t T, int R)
{
    dt_run_t *all = calloc((size_t)R * DT_LAYOUT_MAXRUNS, sizeof(*all));
    int64_t c = dt_layout_local(T, R), next = 0;
    int nall = 0;

    cr_assert_not_null(all);
    cr_assert_eq(c, T / R, "%s T=%lld R=%d: local %lld, want %lld", lname(l), (long long)T, R,
                 (long long)c, (long long)(T / R));
    for (int r = 0; r < R; r++) {
        dt_run_t runs[DT_LAYOUT_MAXRUNS];
        int n = dt_layout_runs(l, T, R, r, runs);
        int64_t held = 0;

        cr_assert(n >= 1 && n <= DT_LAYOUT_MAXRUNS, "%s T=%lld R=%d r=%d: %d runs", lname(l),
                  (long long)T, R, r, n);
        for (int i = 0; i < n; i++) {
            cr_assert_gt(runs[i].len, 0, "%s T=%lld R=%d r=%d: run %d is empty", lname(l),
                         (long long)T, R, r, i);
            /* local rows rise: each run starts after the previous one ends */
            if (i > 0)
                cr_assert_geq(runs[i].start, runs[i - 1].start + runs[i - 1].len,
                              "%s T=%lld R=%d r=%d: run %d starts at %lld, before the end of "
                              "run %d",
                              lname(l), (long long)T, R, r, i, (long long)runs[i].start, i - 1);
            held += runs[i].len;
            all[nall++] = runs[i];
        }
        cr_assert_eq(held, c, "%s T=%lld R=%d r=%d: holds %lld positions, want %lld", lname(l),
                     (long long)T, R, r, (long long)held, (long long)c);
    }
    qsort(all, (size_t)nall, sizeof(*all), cmp_run);
    for (int i = 0; i < nall; i++) {
        cr_assert_eq(all[i].start, next, "%s T=%lld R=%d: position %lld is held by %s rank",
                     lname(l), (long long)T, R,
                     (long long)(all[i].start < next ? all[i].start : next),
                     all[i].start < next ? "more than one" : "no");
        next = all[i].start + all[i].len;
    }
    cr_assert_eq(next, T, "%s T=%lld R=%d: runs end at %lld", lname(l), (long long)T, R,
                 (long long)next);
    free(all);
}

/* dt_layout_positions is the concatenation of the runs, rising, and every
 * position 0..T-1 belongs to exactly one rank. */
static void check_positions(enum dt_layout l, int64_t T, int R)
{
    int64_t c = dt_layout_local(T, R);
    int64_t *pos = calloc((size_t)c, sizeof(*pos));
    int *owner = malloc((size_t)T * sizeof(*owner));

    cr_assert_not_null(pos);
    cr_assert_not_null(owner);
    for (int64_t p = 0; p < T; p++)
        owner[p] = -1;
    for (int r = 0; r < R; r++) {
        dt_run_t runs[DT_LAYOUT_MAXRUNS];
        int n = dt_layout_runs(l, T, R, r, runs);
        int64_t row = 0;

        dt_layout_positions(l, T, R, r, pos);
        for (int i = 0; i < n; i++) {
            for (int64_t j = 0; j < runs[i].len; j++, row++) {
                cr_assert_eq(pos[row], runs[i].start + j,
                             "%s T=%lld R=%d r=%d: row %lld at position %lld, runs say %lld",
                             lname(l), (long long)T, R, r, (long long)row, (long long)pos[row],
                             (long long)(runs[i].start + j));
            }
        }
        for (int64_t x = 0; x < c; x++) {
            cr_assert(pos[x] >= 0 && pos[x] < T, "%s T=%lld R=%d r=%d: position %lld", lname(l),
                      (long long)T, R, r, (long long)pos[x]);
            if (x > 0)
                cr_assert_gt(pos[x], pos[x - 1], "%s T=%lld R=%d r=%d: row %lld does not rise",
                             lname(l), (long long)T, R, r, (long long)x);
            cr_assert_eq(owner[pos[x]], -1, "%s T=%lld R=%d: position %lld on ranks %d and %d",
                         lname(l), (long long)T, R, (long long)pos[x], owner[pos[x]], r);
            owner[pos[x]] = r;
        }
    }
    for (int64_t p = 0; p < T; p++)
        cr_assert_neq(owner[p], -1, "%s T=%lld R=%d: position %lld on no rank", lname(l),
                      (long long)T, R, (long long)p);
    free(owner);
    free(pos);
}

Test(layout, contiguous_runs)
{
    for (size_t i = 0; i < NGOOD; i++) {
        int64_t T = good[i].T, c = T / good[i].R;

        cr_assert_eq(dt_layout_check(DT_LAYOUT_CONTIGUOUS, T, good[i].R, NULL), 0);
        check_runs_tile(DT_LAYOUT_CONTIGUOUS, T, good[i].R);
        check_positions(DT_LAYOUT_CONTIGUOUS, T, good[i].R);
        for (int r = 0; r < good[i].R; r++) {
            dt_run_t runs[DT_LAYOUT_MAXRUNS];
            int n = dt_layout_runs(DT_LAYOUT_CONTIGUOUS, T, good[i].R, r, runs);

            cr_assert(n == 1 && runs[0].start == r * c && runs[0].len == c,
                      "contiguous T=%lld R=%d r=%d: %d runs from (%lld, %lld), want one "
                      "(%lld, %lld)",
                      (long long)T, good[i].R, r, n, (long long)runs[0].start,
                      (long long)runs[0].len, (long long)(r * c), (long long)c);
        }
    }
}

/* Rank r holds chunks r and 2R - 1 - r of h = c / 2 positions, in that
 * order. Where the two chunks touch (r = R - 1) one run of c is as good. */
Test(layout, zigzag_runs)
{
    for (size_t i = 0; i < NGOOD; i++) {
        int64_t T = good[i].T;
        int R = good[i].R;
        int64_t h = T / R / 2;

        cr_assert_eq(dt_layout_check(DT_LAYOUT_ZIGZAG, T, R, NULL), 0, "zigzag T=%lld R=%d refused",
                     (long long)T, R);
        check_runs_tile(DT_LAYOUT_ZIGZAG, T, R);
        check_positions(DT_LAYOUT_ZIGZAG, T, R);
        for (int r = 0; r < R; r++) {
            dt_run_t runs[DT_LAYOUT_MAXRUNS];
            int n = dt_layout_runs(DT_LAYOUT_ZIGZAG, T, R, r, runs);
            int64_t first = r * h, second = (int64_t)(2 * R - 1 - r) * h;

            if (n == 2)
                cr_assert(runs[0].start == first && runs[0].len == h && runs[1].start == second &&
                              runs[1].len == h,
                          "zigzag T=%lld R=%d r=%d: runs (%lld, %lld) (%lld, %lld), want "
                          "(%lld, %lld) (%lld, %lld)",
                          (long long)T, R, r, (long long)runs[0].start, (long long)runs[0].len,
                          (long long)runs[1].start, (long long)runs[1].len, (long long)first,
                          (long long)h, (long long)second, (long long)h);
            else
                cr_assert(n == 1 && second == first + h && runs[0].start == first &&
                              runs[0].len == 2 * h,
                          "zigzag T=%lld R=%d r=%d: %d runs from (%lld, %lld), want chunks "
                          "at %lld and %lld of %lld",
                          (long long)T, R, r, n, (long long)runs[0].start, (long long)runs[0].len,
                          (long long)first, (long long)second, (long long)h);
        }
    }
}

/* Rank r holds chunks r and 2R - 1 - r of every span of 2R chunks of h =
 * c / 8, the four spans in order; on one rank the whole sequence. */
Test(layout, balanced_runs)
{
    static const struct split b[] = { { 8, 1 }, { 16, 2 }, { 48, 3 }, { 64, 8 }, { 8000, 10 } };

    for (size_t i = 0; i < sizeof(b) / sizeof(b[0]); i++) {
        int64_t T = b[i].T, h = T / b[i].R / 8;
        int R = b[i].R;

        cr_assert_eq(dt_layout_check(DT_LAYOUT_BALANCED, T, R, NULL), 0, "T=%lld R=%d",
                     (long long)T, R);
        check_runs_tile(DT_LAYOUT_BALANCED, T, R);
        check_positions(DT_LAYOUT_BALANCED, T, R);
        for (int r = 0; r < R && R > 1; r++) {
            dt_run_t runs[DT_LAYOUT_MAXRUNS];
            cr_assert_eq(dt_layout_runs(DT_LAYOUT_BALANCED, T, R, r, runs), 8);
            for (int p = 0; p < 4; p++) {
                cr_assert_eq(runs[2 * p].start, (2 * R * p + r) * h);
                cr_assert_eq(runs[2 * p + 1].start, (2 * R * p + 2 * R - 1 - r) * h);
                cr_assert(runs[2 * p].len == h && runs[2 * p + 1].len == h);
            }
        }
    }
    dt_run_t one[DT_LAYOUT_MAXRUNS];
    cr_assert_eq(dt_layout_runs(DT_LAYOUT_BALANCED, 40, 1, 0, one), 1);
    cr_assert(one[0].start == 0 && one[0].len == 40);
    dt_emsg_t em = { "" };
    cr_assert_eq(dt_layout_check(DT_LAYOUT_BALANCED, 40, 2, &em), DT_ELAYOUT);
    cr_assert_not_null(strstr(em.s, "balanced layout needs T divisible by 8R: T=40, 8R=16"),
                       "%s", em.s);
    enum dt_layout l;
    cr_assert(dt_layout_parse("balanced", &l) == 0 && l == DT_LAYOUT_BALANCED);
    cr_assert_str_eq(dt_layout_name(DT_LAYOUT_BALANCED), "balanced");
    cr_assert_eq(dt_layout_pieces(DT_LAYOUT_BALANCED, 4), 8);
    cr_assert_eq(dt_layout_pieces(DT_LAYOUT_BALANCED, 1), 1);
}

/* What zigzag is for: the causal (query, key) pairs, sum of (p + 1) over a
 * rank's positions, are the same on every rank. */
Test(layout, zigzag_balances_causal_work)
{
    const int64_t T = 96;
    const int R = 4;
    int64_t pos[24], want = -1;

    cr_assert_eq(dt_layout_local(T, R), 24);
    for (int r = 0; r < R; r++) {
        int64_t pairs = 0;

        dt_layout_positions(DT_LAYOUT_ZIGZAG, T, R, r, pos);
        for (int x = 0; x < 24; x++)
            pairs += pos[x] + 1;
        if (r == 0)
            want = pairs;
        cr_assert_eq(pairs, want, "zigzag T=96 R=4: rank %d has %lld causal pairs, rank 0 %lld", r,
                     (long long)pairs, (long long)want);
    }
}

/* Positions are int64: a sequence far beyond 2^32 tokens still tiles. */
Test(layout, runs_beyond_32_bits)
{
    const int64_t T = (int64_t)3 << 40;

    cr_assert_eq(dt_layout_check(DT_LAYOUT_CONTIGUOUS, T, 3, NULL), 0);
    cr_assert_eq(dt_layout_check(DT_LAYOUT_ZIGZAG, T, 3, NULL), 0);
    check_runs_tile(DT_LAYOUT_CONTIGUOUS, T, 3);
    check_runs_tile(DT_LAYOUT_ZIGZAG, T, 3);
    check_runs_tile(DT_LAYOUT_ZIGZAG, (int64_t)1 << 40, 1024);
}

/* s contains n as a whole number (not as part of a longer one). */
static bool has_number(const char *s, long long n)
{
    char want[32];
    size_t len = (size_t)snprintf(want, sizeof(want), "%lld", n);

    for (const char *p = strstr(s, want); p != NULL; p = strstr(p + 1, want)) {
        bool before = p > s && p[-1] >= '0' && p[-1] <= '9';
        bool after = p[len] >= '0' && p[len] <= '9';
        if (!before && !after)
            return true;
    }
    return false;
}

Test(layout, check_refuses_bad_splits)
{
    static const struct {
        enum dt_layout l;
        int64_t T;
        int R;
        const char *why;
    } bad[] = {
        { DT_LAYOUT_CONTIGUOUS, 10, 3, "T % R != 0" },
        { DT_LAYOUT_CONTIGUOUS, 1000, 7, "T % R != 0" },
        { DT_LAYOUT_ZIGZAG, 10, 3, "T % R != 0" },
        { DT_LAYOUT_ZIGZAG, 12, 8, "T % 2R != 0" },
        { DT_LAYOUT_ZIGZAG, 6, 2, "T % 2R != 0 though T % R == 0" },
        { DT_LAYOUT_CONTIGUOUS, 3, 4, "T < R" },
        { DT_LAYOUT_CONTIGUOUS, 0, 2, "T < R" },
        { DT_LAYOUT_ZIGZAG, 0, 2, "T < R" },
        { DT_LAYOUT_ZIGZAG, 2, 4, "T < R" },
    };

    for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
        dt_emsg_t em = { "" };
        int rc = dt_layout_check(bad[i].l, bad[i].T, bad[i].R, &em);

        cr_assert_eq(rc, DT_ELAYOUT, "%s T=%lld R=%d (%s): rc %d (%s), want DT_ELAYOUT",
                     lname(bad[i].l), (long long)bad[i].T, bad[i].R, bad[i].why, rc,
                     dt_err_name(rc));
        cr_assert(has_number(em.s, bad[i].T) &&
                      (has_number(em.s, bad[i].R) || has_number(em.s, 2LL * bad[i].R)),
                  "%s T=%lld R=%d (%s): message \"%s\" does not name T and R", lname(bad[i].l),
                  (long long)bad[i].T, bad[i].R, bad[i].why, em.s);
        /* no message buffer: the same code, no crash */
        cr_assert_eq(dt_layout_check(bad[i].l, bad[i].T, bad[i].R, NULL), DT_ELAYOUT);
    }
}

Test(layout, check_accepts_good_splits)
{
    for (size_t i = 0; i < NGOOD; i++) {
        for (int l = DT_LAYOUT_CONTIGUOUS; l <= DT_LAYOUT_ZIGZAG; l++) {
            dt_emsg_t em = { "" };
            int rc = dt_layout_check((enum dt_layout)l, good[i].T, good[i].R, &em);

            cr_assert_eq(rc, 0, "%s T=%lld R=%d: rc %d: %s", lname((enum dt_layout)l),
                         (long long)good[i].T, good[i].R, rc, em.s);
        }
    }
    /* contiguous needs only T % R == 0 */
    cr_assert_eq(dt_layout_check(DT_LAYOUT_CONTIGUOUS, 7, 7, NULL), 0);
    cr_assert_eq(dt_layout_check(DT_LAYOUT_CONTIGUOUS, 5, 1, NULL), 0);
    cr_assert_eq(dt_layout_check(DT_LAYOUT_CONTIGUOUS, 15, 5, NULL), 0);
    check_runs_tile(DT_LAYOUT_CONTIGUOUS, 15, 5);
    check_positions(DT_LAYOUT_CONTIGUOUS, 15, 5);
}

Test(layout, name_parse_round_trip)
{
    static const enum dt_layout all[] = { DT_LAYOUT_CONTIGUOUS, DT_LAYOUT_ZIGZAG };

    cr_assert_str_eq(dt_layout_name(DT_LAYOUT_CONTIGUOUS), "contiguous");
    cr_assert_str_eq(dt_layout_name(DT_LAYOUT_ZIGZAG), "zigzag");
    for (size_t i = 0; i < sizeof(all) / sizeof(all[0]); i++) {
        enum dt_layout out = all[i] == DT_LAYOUT_ZIGZAG ? DT_LAYOUT_CONTIGUOUS : DT_LAYOUT_ZIGZAG;

        cr_assert_eq(dt_layout_parse(dt_layout_name(all[i]), &out), 0, "parse \"%s\"",
                     dt_layout_name(all[i]));
        cr_assert_eq(out, all[i], "parse \"%s\" gave %d", dt_layout_name(all[i]), (int)out);
    }
}

Test(layout, parse_refuses_bad_name)
{
    static const char *const bad[] = { "diagonal", "", "zig-zag", "contiguous ", "zigzagx" };

    for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
        enum dt_layout out = DT_LAYOUT_CONTIGUOUS;
        int rc = dt_layout_parse(bad[i], &out);

        cr_assert_eq(rc, DT_EINVAL, "parse \"%s\": rc %d (%s), want DT_EINVAL", bad[i], rc,
                     dt_err_name(rc));
    }
}
