/* SPDX-License-Identifier: MIT
 *
 * Unit tests for io/json: the parse with its one message and duplicate
 * keys refused, and what each getter takes, leaves alone and says, in
 * both wordings (a user's file shows the bad value, dt's own says what it
 * is not), with a null as absent or as a bad value.
 */
#include "config.h"

#include <criterion/criterion.h>
#include <jansson.h>
#include <string.h>

#include "io/json.h"

static json_t *doc(const char *text)
{
    json_t *root = NULL;
    dt_emsg_t em = { "" };

    cr_assert_eq(dt_json_parse("t.json", text, strlen(text), &root, &em), 0, "%s", em.s);
    return root;
}

Test(json, parse_refuses_bad_json_and_duplicate_keys)
{
    json_t *root = (json_t *)1;
    dt_emsg_t em = { "" };

    cr_expect_eq(dt_json_parse("a.json", "{\"x\": ", 6, &root, &em), DT_EFORMAT);
    cr_expect_null(root);
    cr_expect(strncmp(em.s, "a.json: not valid JSON: ", 24) == 0, "%s", em.s);
    cr_expect(strstr(em.s, "(line 1, column ") != NULL, "%s", em.s);
    cr_expect_eq(dt_json_parse("b.json", "{\"x\": 1, \"x\": 2}", 16, &root, &em), DT_EFORMAT);
    cr_expect(strstr(em.s, "b.json: not valid JSON: duplicate object key") == em.s, "%s", em.s);
    root = doc("[1, 2]");
    cr_expect(json_is_array(root));
    json_decref(root);
}

Test(json, show_is_compact_ascii_and_cut)
{
    json_t *v = json_pack("{s:s}", "k", "é");
    char b[12];

    cr_expect_str_eq(dt_json_show(v, b, sizeof(b)), "{\"k\":\"\\u...");
    json_decref(v);
    v = json_string("é");
    cr_expect_str_eq(dt_json_show(v, b, sizeof(b)), "\"\\u00E9\"");
    json_decref(v);
    v = json_string("abcdefghijklmnop");
    cr_expect_str_eq(dt_json_show(v, b, sizeof(b)), "\"abcdefg...");
    json_decref(v);
}

Test(json, getters_in_a_users_file)
{
    const dt_json_at_t at = { .file = "c.json", .prefix = "rope.", .err = DT_EINVAL,
                              .null_absent = true, .show = true };
    json_t *o = doc("{\"n\": 7, \"big\": 70, \"s\": \"32\", \"x\": 1.5, \"z\": 0, \"b\": true,"
                    " \"nul\": null, \"o\": {}}");
    dt_emsg_t em = { "" };
    json_t *v = NULL;
    int64_t i = -1;
    double d = -1;
    bool b = false;

    cr_expect_eq(dt_json_int(&at, o, "n", 0, 1, 64, "an integer from 1 to 64", &i, &em), 0);
    cr_expect_eq(i, 7);
    cr_expect_eq(dt_json_int(&at, o, "big", 0, 1, 64, "an integer from 1 to 64", &i, &em),
                 DT_EINVAL);
    cr_expect_str_eq(em.s, "c.json: 'rope.big' must be an integer from 1 to 64, not 70");
    cr_expect_eq(dt_json_int(&at, o, "s", 0, 1, 64, "an integer", &i, &em), DT_EINVAL);
    cr_expect_str_eq(em.s, "c.json: 'rope.s' must be an integer, not \"32\"");
    cr_expect_eq(i, 7, "unchanged on failure");
    cr_expect_eq(dt_json_int(&at, o, "gone", 0, 1, 64, "an integer", &i, &em), DT_EINVAL);
    cr_expect_str_eq(em.s, "c.json: 'rope.gone' is missing");
    /* a null is absent here */
    cr_expect_eq(dt_json_int(&at, o, "nul", 0, 1, 64, "an integer", &i, &em), DT_EINVAL);
    cr_expect_str_eq(em.s, "c.json: 'rope.nul' is missing");
    cr_expect_eq(dt_json_int(&at, o, "nul", DT_JSON_OPTIONAL, 1, 64, "an integer", &i, &em), 1);
    cr_expect_eq(i, 7);

    cr_expect_eq(dt_json_num(&at, o, "x", DT_JSON_POSITIVE, "a positive number", &d, &em), 0);
    cr_expect_eq(d, 1.5);
    cr_expect_eq(dt_json_num(&at, o, "n", DT_JSON_POSITIVE, "a positive number", &d, &em), 0);
    cr_expect_eq(d, 7);
    cr_expect_eq(dt_json_num(&at, o, "z", DT_JSON_POSITIVE, "a positive number", &d, &em),
                 DT_EINVAL);
    cr_expect_str_eq(em.s, "c.json: 'rope.z' must be a positive number, not 0");
    cr_expect_eq(dt_json_num(&at, o, "z", 0, "a number", &d, &em), 0);
    cr_expect_eq(d, 0);

    cr_expect_eq(dt_json_bool(&at, o, "b", 0, "true or false", &b, &em), 0);
    cr_expect(b);
    cr_expect_eq(dt_json_bool(&at, o, "n", 0, "true or false", &b, &em), DT_EINVAL);
    cr_expect_str_eq(em.s, "c.json: 'rope.n' must be true or false, not 7");
    cr_expect_eq(dt_json_get(&at, o, "s", 0, JSON_STRING, "a string", &v, &em), 0);
    cr_expect_str_eq(json_string_value(v), "32");
    cr_expect_eq(dt_json_get(&at, o, "o", 0, JSON_OBJECT, "an object", &v, &em), 0);
    cr_expect(v == json_object_get(o, "o"), "borrowed");
    cr_expect_eq(dt_json_get(&at, o, "b", 0, JSON_OBJECT, "an object", &v, &em), DT_EINVAL);
    cr_expect_str_eq(em.s, "c.json: 'rope.b' must be an object, not true");
    cr_expect_eq(dt_json_get(&at, o, "nul", DT_JSON_OPTIONAL, JSON_OBJECT, "an object", &v, &em),
                 1);
    /* not an object: no keys */
    cr_expect_eq(dt_json_int(&at, json_object_get(o, "n"), "n", 0, 1, 64, "an integer", &i, &em),
                 DT_EINVAL);
    cr_expect_str_eq(em.s, "c.json: 'rope.n' is missing");
    json_decref(o);
}

Test(json, getters_in_dts_own_file)
{
    const dt_json_at_t at = { .file = "model", .err = DT_EFORMAT };
    json_t *o = doc("{\"n\": -3, \"nul\": null, \"x\": 2}");
    dt_emsg_t em = { "" };
    int64_t i = 0;
    double d = 0;
    bool b;

    cr_expect_eq(dt_json_int(&at, o, "n", 0, INT64_MIN, INT64_MAX, "an integer", &i, &em), 0);
    cr_expect_eq(i, -3);
    cr_expect_eq(dt_json_int(&at, o, "n", 0, 0, 10, "an integer in range", &i, &em), DT_EFORMAT);
    cr_expect_str_eq(em.s, "model: 'n' is not an integer in range");
    /* a null is there, and not what was wanted */
    cr_expect_eq(dt_json_bool(&at, o, "nul", 0, "a boolean", &b, &em), DT_EFORMAT);
    cr_expect_str_eq(em.s, "model: 'nul' is not a boolean");
    cr_expect_eq(dt_json_num(&at, o, "gone", 0, "a number", &d, &em), DT_EFORMAT);
    cr_expect_str_eq(em.s, "model: 'gone' is missing");
    cr_expect_eq(dt_json_num(&at, o, "x", 0, "a number", &d, &em), 0);
    cr_expect_eq(d, 2);
    json_decref(o);
}
