/* SPDX-License-Identifier: MIT
 *
 * Unit tests for common/text: what dt_text_check refuses and the message
 * it gives (what is wrong, where, never the text itself), what
 * dt_text_escape makes of control characters, invalid UTF-8 and format
 * characters (and that printable text, in any script, comes back as it
 * was), dt_text_fit and dt_text_escape_buf cutting only between
 * characters, dt_text_is_hex and the styles of dt_text_shape.
 */
#include "config.h"

#include <criterion/criterion.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "common/text.h"

Test(text, printable_text_passes)
{
    const char *ok[] = { "node-a", "job 7: résumé", "µs × 2", "日本語", "emoji 😀", "a\\x1bb",
                         "" };
    dt_emsg_t em = { "" };

    for (size_t i = 0; i < sizeof(ok) / sizeof(ok[0]); i++) {
        cr_expect_eq(dt_text_check("name", ok[i], 0, &em), 0, "'%s': %s", ok[i], em.s);
        cr_expect_eq(dt_text_needs_escape(ok[i], 0), 0, "'%s'", ok[i]);
        char *e = dt_text_escape(ok[i], 0);
        cr_expect_str_eq(e, ok[i]);
        free(e);
    }
}

Test(text, control_characters_refused_with_position)
{
    static const struct {
        const char *s, *msg;
    } bad[] = {
        { "\x1b[2J", "node: control character \\x1b at byte 0 (only printable text)" },
        { "ab\nfake event", "node: control character \\x0a at byte 2 (only printable text)" },
        { "tab\there", "node: control character \\x09 at byte 3 (only printable text)" },
        { "del\x7f", "node: control character \\x7f at byte 3 (only printable text)" },
        { "c1\xc2\x9b" "2J", "node: control character U+009B at byte 2 (only printable text)" },
        { "bidi\xe2\x80\xae", "node: format character U+202E at byte 4 (only printable text)" },
        { "ls\xe2\x80\xa8", "node: format character U+2028 at byte 2 (only printable text)" },
        { "bad\xff", "node: invalid UTF-8 at byte 3" },
        { "over\xc0\xaf", "node: invalid UTF-8 at byte 4" },          /* overlong '/' */
        { "sur\xed\xa0\x80", "node: invalid UTF-8 at byte 3" },       /* a surrogate */
        { "big\xf4\x90\x80\x80", "node: invalid UTF-8 at byte 3" },   /* above U+10FFFF */
        { "cut\xe6\x97", "node: invalid UTF-8 at byte 3" },           /* truncated */
    };
    dt_emsg_t em = { "" };

    for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
        cr_expect_eq(dt_text_check("node", bad[i].s, 0, &em), DT_EINVAL, "case %zu", i);
        cr_expect_str_eq(em.s, bad[i].msg, "case %zu", i);
        cr_expect_eq(dt_text_needs_escape(bad[i].s, 0), 1, "case %zu", i);
    }
}

Test(text, length_bound)
{
    dt_emsg_t em = { "" };

    cr_expect_eq(dt_text_check("reason", "12345", 5, &em), 0);
    cr_expect_eq(dt_text_check("reason", "123456", 5, &em), DT_EINVAL);
    cr_expect_str_eq(em.s, "reason: 6 bytes, more than 5");
}

Test(text, escape_makes_every_byte_visible)
{
    static const struct {
        const char *in, *out;
        int flags;
    } cases[] = {
        { "\x1b[2Jx", "\\x1b[2Jx", 0 },
        { "a\nb\tc\rd", "a\\nb\\tc\\rd", 0 },
        { "a\nb\tc\rd", "a\nb\tc\\rd", DT_TEXT_KEEP_LINES },
        { "\x07\x7f", "\\x07\\x7f", 0 },
        { "\xc2\x9b" "31m", "\\u009b31m", 0 },
        { "x\xe2\x80\xaey", "x\\u202ey", 0 },
        { "\xff\xfe ok \xc3", "\\xff\\xfe ok \\xc3", 0 },
        { "é\x1b", "é\\x1b", 0 },
    };

    for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
        char *e = dt_text_escape(cases[i].in, cases[i].flags);
        cr_expect_str_eq(e, cases[i].out, "case %zu", i);
        /* the result is printable itself, whatever the flags kept */
        cr_expect_eq(dt_text_needs_escape(e, DT_TEXT_KEEP_LINES), 0, "case %zu", i);
        free(e);
    }
    cr_expect_null(dt_text_escape(NULL, 0));
}

Test(text, escape_of_every_byte_is_printable)
{
    char in[2] = { 0, 0 };

    for (int b = 1; b < 256; b++) {
        in[0] = (char)b;
        char *e = dt_text_escape(in, 0);
        cr_expect_eq(dt_text_check("x", e, 0, NULL), 0, "byte %#x -> '%s'", b, e);
        free(e);
    }
}

Test(text, fit_cuts_between_characters)
{
    cr_expect_eq(dt_text_fit("abcdef", 10), 6);
    cr_expect_eq(dt_text_fit("abcdef", 3), 3);
    cr_expect_eq(dt_text_fit("ab日本", 3), 2);  /* 日 is 3 bytes from byte 2 */
    cr_expect_eq(dt_text_fit("ab日本", 5), 5);
    cr_expect_eq(dt_text_fit("ab日本", 6), 5);
    cr_expect_eq(dt_text_fit("😀", 3), 0);
}

Test(text, escape_n_takes_bytes_with_nuls_and_keeps_lines)
{
    static const char in[] = "ok\n\0\x1b[2J\tlast\xe6\x97";
    char *e = dt_text_escape_n(in, sizeof(in) - 1, DT_TEXT_KEEP_LINES);

    cr_assert_str_eq(e, "ok\n\\x00\\x1b[2J\tlast\\xe6\\x97");
    free(e);
    e = dt_text_escape_n("", 0, 0);
    cr_assert_str_eq(e, "");
    free(e);
}

Test(text, escape_buf_cuts_between_characters)
{
    char b[16];

    cr_expect_str_eq(dt_text_escape_buf("evil\x1b[2Jname", b, sizeof(b), 0), "evil\\x1b[2Jname");
    /* 15 bytes fit whole; one more is cut to the last character after
     * which "..." fits */
    cr_expect_str_eq(dt_text_escape_buf("abcdefghijklmno", b, sizeof(b), 0), "abcdefghijklmno");
    cr_expect_str_eq(dt_text_escape_buf("abcdefghijklmnop", b, sizeof(b), 0), "abcdefghijkl...");
    /* never inside an escape or a UTF-8 sequence */
    cr_expect_str_eq(dt_text_escape_buf("abcdefghij\x1b\x1b", b, sizeof(b), 0), "abcdefghij...");
    cr_expect_str_eq(dt_text_escape_buf("abcdefghij日本", b, sizeof(b), 0), "abcdefghij...");
    cr_expect_str_eq(dt_text_escape_buf("a\\b é\n", b, sizeof(b), 0), "a\\b é\\n");
    cr_expect_str_eq(dt_text_escape_buf("", b, sizeof(b), 0), "");
    /* the same as dt_text_escape where it fits */
    for (int c = 1; c < 256; c++) {
        char in[2] = { (char)c, 0 }, *e = dt_text_escape(in, 0);
        cr_expect_str_eq(dt_text_escape_buf(in, b, sizeof(b), 0), e, "byte %#x", c);
        free(e);
    }
}

Test(text, is_hex_takes_exactly_len_lowercase_digits)
{
    const char *sha = "0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef";

    cr_expect_eq(dt_text_is_hex(sha, 64), 1);
    cr_expect_eq(dt_text_is_hex(sha, 63), 0);
    cr_expect_eq(dt_text_is_hex(sha + 1, 64), 0);
    cr_expect_eq(dt_text_is_hex("0123456789ABCDEF", 16), 0, "uppercase");
    cr_expect_eq(dt_text_is_hex("0123456789abcdeg", 16), 0);
    cr_expect_eq(dt_text_is_hex("", 0), 1);
}

Test(text, shape_in_each_style)
{
    const int64_t s[] = { 2, 3, 40000000000 };
    char b[64];

    cr_expect_str_eq(dt_text_shape(b, sizeof(b), 3, s, DT_SHAPE_TUPLE), "(2, 3, 40000000000)");
    cr_expect_str_eq(dt_text_shape(b, sizeof(b), 1, s, DT_SHAPE_TUPLE), "(2,)");
    cr_expect_str_eq(dt_text_shape(b, sizeof(b), 0, s, DT_SHAPE_TUPLE), "()");
    cr_expect_str_eq(dt_text_shape(b, sizeof(b), 2, s, DT_SHAPE_LIST), "[2, 3]");
    cr_expect_str_eq(dt_text_shape(b, sizeof(b), 1, s, DT_SHAPE_LIST), "[2]");
    cr_expect_str_eq(dt_text_shape(b, sizeof(b), 0, s, DT_SHAPE_LIST), "[]");
    cr_expect_str_eq(dt_text_shape(b, sizeof(b), 2, s, DT_SHAPE_PAREN), "(2, 3)");
    cr_expect_str_eq(dt_text_shape(b, sizeof(b), 1, s, DT_SHAPE_PAREN), "(2)");
    /* cut short, without the closing bracket */
    cr_expect_str_eq(dt_text_shape(b, 6, 2, s, DT_SHAPE_LIST), "[2, 3");
}
