/* SPDX-License-Identifier: MIT
 *
 * spec/mask_rules: the mask keys' values parsed and refused, the block
 * patterns against their definition (dt-spec(5)) pair by pair, the
 * documents a sequence's end-of-text tokens make, the targets not scored
 * and the RoPE positions of doc_positions = reset.
 */
#include <criterion/criterion.h>
#include <stdlib.h>
#include <string.h>

#include "spec/mask_rules.h"

Test(mask_rules, layers_parse_and_refuse)
{
    dt_emsg_t em = { "" };
    int64_t k = 0;

    cr_assert_eq(dt_mask_parse_layers("key 'x'", "all", &k, &em), 0);
    cr_assert_eq(k, 1);
    cr_assert_eq(dt_mask_parse_layers("key 'x'", "every:3", &k, &em), 0);
    cr_assert_eq(k, 3);
    const char *bad[] = { "every:0", "every:", "every:2x", "some", "", "every:-1" };
    for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
        cr_assert_eq(dt_mask_parse_layers("key 'x'", bad[i], &k, &em), DT_EINVAL, "%s", bad[i]);
        cr_assert(strstr(em.s, "key 'x'") && strstr(em.s, "every:K"), "%s", em.s);
    }
}

Test(mask_rules, patterns_parse_and_refuse)
{
    dt_mask_rules_t r = { 0 };
    dt_emsg_t em = { "" };
    char buf[128];

    cr_assert_eq(dt_mask_parse_pattern("p", "local:4,global:1", &r, &em), 0, "%s", em.s);
    cr_assert_eq(r.local, 4);
    cr_assert_eq(r.global, 1);
    cr_assert_eq(r.stride, 0);
    r.block = 64;
    dt_mask_pattern_format(buf, sizeof(buf), &r);
    cr_assert_str_eq(buf, "global:1,local:4");
    cr_assert_eq(dt_mask_parse_pattern("p", "strided:8", &r, &em), 0);
    cr_assert(r.stride == 8 && r.local == 0 && r.global == 0);
    struct {
        const char *v, *needle;
    } bad[] = {
        { "local:4,local:2", "local given twice" },
        { "dilated:2", "unknown part 'dilated'" },
        { "local", "unknown part" },
        { "local:0", "local:0" },
        { "global:x", "global:x" },
        { "", "empty" },
        { ",", "empty" },
    };
    for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
        cr_assert_eq(dt_mask_parse_pattern("p", bad[i].v, &r, &em), DT_EINVAL, "%s", bad[i].v);
        cr_assert(strstr(em.s, bad[i].needle), "'%s': %s", bad[i].v, em.s);
    }
}

/* The pattern's definition, block by block (mask_rules.h). */
static int defined(const dt_mask_rules_t *r, int64_t a, int64_t b)
{
    int64_t d = a > b ? a - b : b - a;
    return (r->local && d < r->local) || (r->stride && (a - b) % r->stride == 0) ||
           (r->global && (a < r->global || b < r->global));
}

Test(mask_rules, block_patterns_allow_what_they_define)
{
    const char *pats[] = { "local:1", "local:3", "strided:3", "global:2", "global:1,local:2",
                           "local:2,strided:4", "global:1,local:1,strided:5" };
    const int64_t B = 4, T = 48; /* 12 blocks */
    dt_emsg_t em = { "" };

    for (size_t p = 0; p < sizeof(pats) / sizeof(pats[0]); p++)
        for (int causal = 0; causal < 2; causal++) {
            dt_mask_rules_t r = { .block = B };
            dt_mask_t m;
            cr_assert_eq(dt_mask_parse_pattern("p", pats[p], &r, &em), 0);
            cr_assert_eq(dt_mask_rules_mask(&r, T, causal, false, &m, &em), 0, "%s", em.s);
            for (int64_t i = 0; i < T; i++)
                for (int64_t j = 0; j < T; j++) {
                    int want = defined(&r, i / B, j / B) && (!causal || j <= i);
                    cr_assert_eq(dt_mask_allows(&m, 0, i, j), want, "%s causal %d: (%lld, %lld)",
                                 pats[p], causal, (long long)i, (long long)j);
                }
            dt_mask_close(&m);
        }
}

Test(mask_rules, window_and_pattern_compose)
{
    dt_mask_rules_t r = { .block = 4, .local = 2, .window = 3, .window_every = 2 };
    dt_mask_t win, rest;
    dt_emsg_t em = { "" };

    cr_assert_eq(dt_mask_rules_mask(&r, 32, true, true, &win, &em), 0);
    cr_assert_eq(dt_mask_rules_mask(&r, 32, true, false, &rest, &em), 0);
    for (int64_t i = 0; i < 32; i++)
        for (int64_t j = 0; j < 32; j++) {
            int blocks = i / 4 - j / 4 < 2 && j <= i;
            cr_assert_eq(dt_mask_allows(&rest, 0, i, j), blocks);
            cr_assert_eq(dt_mask_allows(&win, 0, i, j), blocks && i - j < 3);
        }
    cr_assert(dt_mask_rules_windowed(&r, 0) && !dt_mask_rules_windowed(&r, 1) &&
              dt_mask_rules_windowed(&r, 4));
    cr_assert(dt_mask_rules_alternate(&r, 2) && !dt_mask_rules_alternate(&r, 1));
    dt_mask_close(&win);
    dt_mask_close(&rest);
    /* a block that does not divide T */
    cr_assert_eq(dt_mask_rules_mask(&r, 30, true, true, &win, &em), DT_EINVAL);
    cr_assert(strstr(em.s, "block_size 4 does not divide the sequence length 30"), "%s", em.s);
    dt_mask_close(&win);
}

Test(mask_rules, documents_targets_and_positions_from_eot)
{
    /* EOT = 9: documents start at 0, 3, 4 and 8 (the first token need not be one) */
    const int32_t x[10] = { 5, 1, 2, 9, 9, 7, 7, 7, 9, 1 };
    int32_t y[10] = { 1, 2, 9, 9, 7, 7, 7, 9, 1, 9 };
    const int64_t pos[5] = { 0, 3, 4, 9, 7 };
    int64_t rope[5];
    dt_mask_rules_t r = { .docs = true, .eot = 9, .reset = true };
    dt_mask_t m;
    dt_emsg_t em = { "" };

    cr_assert_eq(dt_mask_rules_mask(&r, 10, true, true, &m, &em), 0);
    dt_mask_rules_docs(&r, x, &m);
    cr_assert_eq(m.ndoc, 4);
    const int64_t starts[4] = { 0, 3, 4, 8 };
    for (int d = 0; d < 4; d++)
        cr_assert_eq(m.doc_start[d], starts[d]);
    cr_assert(dt_mask_allows(&m, 0, 2, 0) && !dt_mask_allows(&m, 0, 3, 2) &&
              !dt_mask_allows(&m, 0, 4, 3) && dt_mask_allows(&m, 0, 7, 4));
    dt_mask_rules_targets(&r, y, 10, -1);
    const int32_t want[10] = { 1, 2, -1, -1, 7, 7, 7, -1, 1, -1 };
    cr_assert_arr_eq(y, want, sizeof(want));
    dt_mask_rules_rope(&r, &m, pos, 5, 0, rope);
    const int64_t reset[5] = { 0, 0, 0, 1, 3 };
    cr_assert_arr_eq(rope, reset, sizeof(reset));
    r.reset = false;
    dt_mask_rules_rope(&r, &m, pos, 5, 100, rope);
    const int64_t cont[5] = { 100, 103, 104, 109, 107 };
    cr_assert_arr_eq(rope, cont, sizeof(cont));
    dt_mask_close(&m);
}

Test(mask_rules, the_canonical_line_names_every_part)
{
    char buf[256];
    dt_mask_rules_t r = { .block = 64 };

    dt_mask_rules_format(buf, sizeof(buf), &r);
    cr_assert_str_eq(buf, "none");
    cr_assert(!dt_mask_rules_any(&r));
    r = (dt_mask_rules_t){ .docs = true, .eot = 50256, .reset = true, .window = 128,
                           .window_every = 2, .block = 64, .local = 4, .global = 1 };
    dt_mask_rules_format(buf, sizeof(buf), &r);
    cr_assert_str_eq(buf, "doc_mask=eot eot_token=50256 doc_positions=reset sliding_window=128 "
                          "sliding_window_layers=every:2 block_pattern=global:1,local:4 "
                          "block_size=64");
    cr_assert_str_eq(dt_mask_rules_what(&r), "doc_mask = eot");
}
