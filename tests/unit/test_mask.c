/* SPDX-License-Identifier: MIT
 *
 * spec/mask.c: the predicate against its definition written out here,
 * and the box test and the pair count against brute force over every
 * box of small sequences, for every combination of the parts.
 */
#include <criterion/criterion.h>
#include <stdlib.h>
#include <string.h>

#include "spec/mask.h"

/* the definition (mask.h), independently */
static bool def_allows(int64_t T, bool causal, const int64_t *len, int nd, int64_t W, int64_t B,
                       int nb, const uint8_t *dense, int h, int64_t i, int64_t j)
{
    (void)T;
    if (causal && j > i)
        return false;
    if (nd > 0) {
        int64_t s = 0, di = -1, dj = -1;
        for (int d = 0; d < nd; s += len[d++]) {
            if (i >= s && i < s + len[d])
                di = d;
            if (j >= s && j < s + len[d])
                dj = d;
        }
        if (di != dj)
            return false;
    }
    if (W > 0) {
        int64_t dist = i - j;
        if (causal ? dist >= W : (dist >= W || -dist >= W))
            return false;
    }
    if (B > 0 && !dense[((int64_t)h * nb + i / B) * nb + j / B])
        return false;
    return true;
}

typedef struct cfg {
    int64_t T;
    bool causal;
    int nd;
    int64_t len[8];
    int64_t W, B;
    int nhead;
} cfg_t;

static void build(const cfg_t *c, dt_mask_t *m, uint8_t **dense, unsigned seed)
{
    dt_emsg_t em = { 0 };
    dt_mask_init(m, c->T, c->causal);
    if (c->nd > 0)
        cr_assert_eq(dt_mask_set_docs(m, c->len, c->nd, &em), 0, "%s", em.s);
    if (c->W > 0)
        cr_assert_eq(dt_mask_set_window(m, c->W, &em), 0, "%s", em.s);
    *dense = NULL;
    if (c->B > 0) {
        int64_t nb = c->T / c->B, n = c->nhead * nb * nb;
        *dense = malloc((size_t)n);
        srand(seed);
        for (int64_t e = 0; e < n; e++)
            (*dense)[e] = (uint8_t)(rand() % 3 != 0);
        cr_assert_eq(dt_mask_set_blocks_dense(m, c->B, c->nhead, *dense, &em), 0, "%s", em.s);
    }
}

static void check_cfg(const cfg_t *c, unsigned seed)
{
    dt_mask_t m;
    uint8_t *dense;
    build(c, &m, &dense, seed);
    int64_t T = c->T, nb = c->B ? T / c->B : 0;
    for (int h = 0; h < (c->B ? c->nhead : 1); h++) {
        /* the predicate, and the row interval holding every allowed key */
        for (int64_t i = 0; i < T; i++) {
            int64_t lo, hi;
            dt_mask_row(&m, i, &lo, &hi);
            cr_assert(lo <= i && i < hi, "row %lld: [%lld, %lld)", (long long)i, (long long)lo,
                      (long long)hi);
            for (int64_t j = 0; j < T; j++) {
                bool want = def_allows(T, c->causal, c->len, c->nd, c->W, c->B, (int)nb, dense,
                                       h, i, j);
                cr_assert_eq(dt_mask_allows(&m, h, i, j), want, "T=%lld (%lld, %lld) h %d",
                             (long long)T, (long long)i, (long long)j, h);
                if (want)
                    cr_assert(j >= lo && j < hi);
            }
        }
        /* every box: its class and its pair count */
        for (int64_t qlo = 0; qlo < T; qlo++)
            for (int64_t qhi = qlo; qhi < T; qhi++)
                for (int64_t klo = 0; klo < T; klo += 1 + (T > 12))
                    for (int64_t khi = klo; khi < T; khi++) {
                        int64_t n = 0, all = (qhi - qlo + 1) * (khi - klo + 1);
                        for (int64_t i = qlo; i <= qhi; i++)
                            for (int64_t j = klo; j <= khi; j++)
                                n += def_allows(T, c->causal, c->len, c->nd, c->W, c->B,
                                                (int)nb, dense, h, i, j);
                        enum dt_mask_box b = dt_mask_box(&m, h, qlo, qhi, klo, khi);
                        if (n == 0)
                            cr_assert(b == DT_MASK_EMPTY || (c->B && b == DT_MASK_PARTIAL),
                                      "box [%lld,%lld]x[%lld,%lld]: none allowed, class %d",
                                      (long long)qlo, (long long)qhi, (long long)klo,
                                      (long long)khi, b);
                        else
                            cr_assert_neq(b, DT_MASK_EMPTY, "box with %lld pairs said empty",
                                          (long long)n);
                        if (n == all)
                            cr_assert(b == DT_MASK_FULL || (c->B && b == DT_MASK_PARTIAL));
                        else
                            cr_assert_neq(b, DT_MASK_FULL);
                        if (!c->B)
                            cr_assert_eq(b, n == 0 ? DT_MASK_EMPTY
                                                   : n == all ? DT_MASK_FULL : DT_MASK_PARTIAL,
                                         "exact without blocks");
                        double p = dt_mask_pairs(&m, h, qlo, qhi + 1, klo, khi + 1);
                        cr_assert_eq(p, (double)n, "pairs [%lld,%lld)x[%lld,%lld): %g, want "
                                     "%lld", (long long)qlo, (long long)qhi + 1,
                                     (long long)klo, (long long)khi + 1, p, (long long)n);
                    }
    }
    free(dense);
    dt_mask_close(&m);
}

Test(mask, every_part_and_combination_against_the_definition)
{
    const cfg_t cfgs[] = {
        { .T = 9, .causal = true },
        { .T = 9, .causal = false },
        { .T = 10, .causal = true, .nd = 4, .len = { 3, 1, 4, 2 } },
        { .T = 10, .causal = false, .nd = 3, .len = { 1, 8, 1 } },
        { .T = 11, .causal = true, .W = 3 },
        { .T = 11, .causal = false, .W = 2 },
        { .T = 11, .causal = true, .W = 1 },
        { .T = 12, .causal = true, .nd = 3, .len = { 5, 4, 3 }, .W = 2 },
        { .T = 12, .causal = false, .nd = 2, .len = { 7, 5 }, .W = 3 },
        { .T = 12, .causal = true, .B = 3, .nhead = 1 },
        { .T = 12, .causal = false, .B = 2, .nhead = 2 },
        { .T = 12, .causal = true, .nd = 3, .len = { 2, 6, 4 }, .W = 4, .B = 4, .nhead = 2 },
        { .T = 14, .causal = false, .nd = 2, .len = { 9, 5 }, .W = 5, .B = 7, .nhead = 1 },
    };
    for (size_t k = 0; k < sizeof(cfgs) / sizeof(cfgs[0]); k++)
        check_cfg(&cfgs[k], 7 + (unsigned)k);
}

Test(mask, pair_counts_of_long_sequences_in_closed_form)
{
    /* causal T: T (T + 1) / 2; a causal window W: the triangle then W per row */
    dt_mask_t m;
    dt_emsg_t em = { 0 };
    int64_t T = 1 << 30, W = 4096;
    dt_mask_init(&m, T, true);
    cr_assert_eq(dt_mask_pairs(&m, 0, 0, T, 0, T), (double)T * (double)(T + 1) / 2);
    cr_assert_eq(dt_mask_set_window(&m, W, &em), 0);
    cr_assert_eq(dt_mask_pairs(&m, 0, 0, T, 0, T),
                 (double)W * (double)(W + 1) / 2 + (double)(T - W) * (double)W);
    /* 1024 documents of 2^20, causal: 1024 triangles */
    int64_t len[1024];
    for (int d = 0; d < 1024; d++)
        len[d] = 1 << 20;
    dt_mask_close(&m);
    dt_mask_init(&m, T, true);
    cr_assert_eq(dt_mask_set_docs(&m, len, 1024, &em), 0);
    cr_assert_eq(dt_mask_pairs(&m, 0, 0, T, 0, T),
                 1024.0 * (double)(1 << 20) * (double)((1 << 20) + 1) / 2);
    cr_assert_eq(dt_mask_box(&m, 0, 0, (1 << 20) - 1, 1 << 20, (1 << 21) - 1), DT_MASK_EMPTY);
    dt_mask_close(&m);
}

Test(mask, bad_parts_are_refused_naming_them)
{
    dt_mask_t m;
    dt_emsg_t em = { 0 };
    dt_mask_init(&m, 16, true);
    int64_t l1[] = { 8, 7 }, l2[] = { 8, 0, 8 }, l3[] = { 9, 9 };
    cr_assert_eq(dt_mask_set_docs(&m, l1, 2, &em), DT_EINVAL);
    cr_assert(strstr(em.s, "sum to 15, not to the sequence length 16"), "%s", em.s);
    cr_assert_eq(dt_mask_set_docs(&m, l2, 3, &em), DT_EINVAL);
    cr_assert(strstr(em.s, "document 1 has length 0"), "%s", em.s);
    cr_assert_eq(dt_mask_set_docs(&m, l3, 2, &em), DT_EINVAL);
    cr_assert(strstr(em.s, "more than the sequence length 16"), "%s", em.s);
    cr_assert_eq(dt_mask_set_window(&m, 0, &em), DT_EINVAL);
    cr_assert(strstr(em.s, "sliding window 0"), "%s", em.s);
    uint8_t d[16] = { 1 };
    cr_assert_eq(dt_mask_set_blocks_dense(&m, 3, 1, d, &em), DT_EINVAL);
    cr_assert(strstr(em.s, "mask block 3 does not divide the sequence length 16"), "%s",
              em.s);
    d[5] = 2;
    cr_assert_eq(dt_mask_set_blocks_dense(&m, 4, 1, d, &em), DT_EINVAL);
    cr_assert(strstr(em.s, "element 5 is 2"), "%s", em.s);
    int64_t rp[] = { 0, 1, 1, 3, 3 }, cols[] = { 0, 2, 1 };
    cr_assert_eq(dt_mask_set_blocks_csr(&m, 4, 1, rp, 3, cols, &em), DT_EINVAL);
    cr_assert(strstr(em.s, "not strictly ascending"), "%s", em.s);
    int64_t rp2[] = { 0, 1, 1, 5, 5 };
    cr_assert_eq(dt_mask_set_blocks_csr(&m, 4, 1, rp2, 3, cols, &em), DT_EINVAL);
    cr_assert(strstr(em.s, "outside the 3 column indices"), "%s", em.s);
    int64_t cols2[] = { 0, 1, 4 };
    cr_assert_eq(dt_mask_set_blocks_csr(&m, 4, 1, rp, 3, cols2, &em), DT_EINVAL);
    cr_assert(strstr(em.s, "index 2 is 4, outside [0, 4)"), "%s", em.s);
    /* nothing was taken from the refused parts */
    cr_assert(dt_mask_is_plain(&m));
    dt_mask_close(&m);
}
