/* SPDX-License-Identifier: MIT
 *
 * Unit tests for common/err: every code of the X-macro table in err.h has its
 * own message and name, unknown codes are reported rather than crashing,
 * errnos translate (unlisted ones to DT_EIO), and dt_emsg_set formats,
 * truncates within its buffer and tolerates a NULL message.
 */
#include "config.h"

#include <criterion/criterion.h>
#include <errno.h>
#include <string.h>

#include "common/err.h"

static const struct {
    int code;
    const char *name;
    const char *msg;
} table[] = {
#define ROW(name, value, msg) { DT_##name, "DT_" #name, msg },
    DT_ERRNO_MAP(ROW)
#undef ROW
};

#define NCODES (sizeof(table) / sizeof(table[0]))

Test(err, every_code_has_its_message_and_name)
{
    size_t i, j;

    cr_assert_geq(NCODES, 20);
    for (i = 0; i < NCODES; i++) {
        const char *m = dt_strerror(table[i].code);

        cr_assert_lt(table[i].code, 0, "%s is not negative", table[i].name);
        cr_assert_not_null(m);
        cr_assert_gt(strlen(m), 0, "%s has an empty message", table[i].name);
        cr_assert_str_eq(m, table[i].msg, "%s", table[i].name);
        cr_assert_str_eq(dt_err_name(table[i].code), table[i].name);
        for (j = 0; j < i; j++) {
            cr_assert_neq(table[i].code, table[j].code, "%s and %s share a value", table[i].name,
                          table[j].name);
            cr_assert_str_neq(m, dt_strerror(table[j].code), "%s and %s share a message",
                              table[i].name, table[j].name);
        }
    }
}

Test(err, codes_are_negated_errnos_where_one_fits)
{
    cr_assert_eq(DT_ENOENT, -ENOENT);
    cr_assert_eq(DT_ENOMEM, -ENOMEM);
    cr_assert_eq(DT_ERANGE, -ERANGE);
    cr_assert_lt(DT_ECONF, -4096);
    cr_assert_lt(DT_EFORMAT, -4096);
}

Test(err, success)
{
    cr_assert_str_eq(dt_strerror(0), "success");
    cr_assert_str_eq(dt_strerror(DT_OK), "success");
    cr_assert_str_eq(dt_err_name(0), "DT_OK");
}

Test(err, unknown_codes)
{
    cr_assert_str_eq(dt_strerror(-9999), "unknown error -9999");
    cr_assert_str_eq(dt_strerror(5), "unknown error 5"); /* positive: never a dt code */
    cr_assert_str_eq(dt_strerror(-2147483647 - 1), "unknown error -2147483648");
    cr_assert_str_eq(dt_err_name(-9999), "DT_E?");
    cr_assert_str_eq(dt_err_name(EIO), "DT_E?");
}

Test(err, errno_translation)
{
    cr_assert_eq(dt_err_errno(ENOENT), DT_ENOENT);
    cr_assert_eq(dt_err_errno(EACCES), DT_EACCES);
    cr_assert_eq(dt_err_errno(ENOMEM), DT_ENOMEM);
    cr_assert_eq(dt_err_errno(EIO), DT_EIO);
    cr_assert_eq(dt_err_errno(ETIMEDOUT), DT_ETIMEDOUT);
    /* errnos without an entry */
    cr_assert_eq(dt_err_errno(EXDEV), DT_EIO);
    cr_assert_eq(dt_err_errno(EISDIR), DT_EIO);
    /* dt's own codes are not errnos, even negated */
    cr_assert_eq(dt_err_errno(-DT_ECONF), DT_EIO);
}

Test(err, errno_translation_covers_the_table)
{
    size_t i;

    for (i = 0; i < NCODES; i++) {
        if (table[i].code > -4096)
            cr_assert_eq(dt_err_errno(-table[i].code), table[i].code, "%s", table[i].name);
    }
}

Test(err, emsg_null_returns_code)
{
    cr_assert_eq(dt_emsg_set(NULL, DT_EINVAL, "bad %d", 1), DT_EINVAL);
    cr_assert_eq(dt_emsg_set(NULL, DT_ECONF, "x"), DT_ECONF);
}

Test(err, emsg_formats)
{
    dt_emsg_t em = { { 0 } };

    cr_assert_eq(
        dt_emsg_set(&em, DT_ESHAPE, "%s: %d rows but %s has %d", "q.npy", 100, "k.npy", 96),
        DT_ESHAPE);
    cr_assert_str_eq(em.s, "q.npy: 100 rows but k.npy has 96");
    /* a second message replaces the first */
    dt_emsg_set(&em, DT_EINVAL, "short");
    cr_assert_str_eq(em.s, "short");
}

Test(err, emsg_truncates_within_its_buffer)
{
    struct {
        dt_emsg_t em;
        unsigned char guard[64];
    } box;
    char big[2000];
    size_t i;

    memset(&box, 0xaa, sizeof(box));
    memset(big, 'x', sizeof(big) - 1);
    big[sizeof(big) - 1] = '\0';
    cr_assert_eq(dt_emsg_set(&box.em, DT_EIO, "%s", big), DT_EIO);
    cr_assert_eq(strlen(box.em.s), sizeof(box.em.s) - 1);
    cr_assert_eq(box.em.s[sizeof(box.em.s) - 1], '\0');
    for (i = 0; i < sizeof(box.guard); i++)
        cr_assert_eq(box.guard[i], 0xaa, "byte %zu past the message was written", i);
}
