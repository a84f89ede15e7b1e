/* SPDX-License-Identifier: MIT
 *
 * Reading the JSON of dt's file formats (json.h): one parse, one lookup of
 * a key (absent, null, optional) and one wording of what is wrong with it,
 * under getters of each type.
 */
#include "config.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "json.h"

int dt_json_parse(const char *name, const char *text, size_t len, json_t **root, dt_emsg_t *em)
{
    json_error_t jerr;

    *root = json_loadb(text, len, JSON_REJECT_DUPLICATES, &jerr);
    if (*root == NULL)
        return dt_emsg_set(em, DT_EFORMAT, "%s: not valid JSON: %s (line %d, column %d)", name,
                           jerr.text, jerr.line, jerr.column);
    return 0;
}

const char *dt_json_show(const json_t *v, char *buf, size_t n)
{
    char *s = json_dumps(v, JSON_ENCODE_ANY | JSON_COMPACT | JSON_ENSURE_ASCII);

    if (s == NULL)
        snprintf(buf, n, "?");
    else if (strlen(s) < n)
        snprintf(buf, n, "%s", s);
    else
        snprintf(buf, n, "%.*s...", (int)n - 4, s);
    free(s);
    return buf;
}

/* v at key is not what want says. */
static int bad(const dt_json_at_t *at, const char *key, const json_t *v, const char *want,
               dt_emsg_t *em)
{
    const char *prefix = at->prefix ? at->prefix : "";
    char sb[48];

    if (at->show)
        return dt_emsg_set(em, at->err, "%s: '%s%s' must be %s, not %s", at->file, prefix, key,
                           want, dt_json_show(v, sb, sizeof(sb)));
    return dt_emsg_set(em, at->err, "%s: '%s%s' is not %s", at->file, prefix, key, want);
}

int dt_json_get(const dt_json_at_t *at, const json_t *o, const char *key, unsigned flags,
                json_type t, const char *want, json_t **out, dt_emsg_t *em)
{
    json_t *v = json_object_get(o, key);
    bool ok;

    if (at->null_absent && json_is_null(v))
        v = NULL;
    if (v == NULL && (flags & DT_JSON_OPTIONAL))
        return 1;
    if (v == NULL)
        return dt_emsg_set(em, at->err, "%s: '%s%s' is missing", at->file,
                           at->prefix ? at->prefix : "", key);
    /* the two below stand for any number and either boolean */
    if (t == JSON_REAL)
        ok = json_is_number(v) && (!(flags & DT_JSON_POSITIVE) || json_number_value(v) > 0);
    else if (t == JSON_TRUE)
        ok = json_is_boolean(v);
    else
        ok = json_typeof(v) == t;
    if (!ok)
        return bad(at, key, v, want, em);
    *out = v;
    return 0;
}

int dt_json_int(const dt_json_at_t *at, const json_t *o, const char *key, unsigned flags,
                int64_t min, int64_t max, const char *want, int64_t *out, dt_emsg_t *em)
{
    json_t *v;
    int rc = dt_json_get(at, o, key, flags, JSON_INTEGER, want, &v, em);

    if (rc != 0)
        return rc;
    if (json_integer_value(v) < min || json_integer_value(v) > max)
        return bad(at, key, v, want, em);
    *out = (int64_t)json_integer_value(v);
    return 0;
}

int dt_json_num(const dt_json_at_t *at, const json_t *o, const char *key, unsigned flags,
                const char *want, double *out, dt_emsg_t *em)
{
    json_t *v;
    int rc = dt_json_get(at, o, key, flags, JSON_REAL, want, &v, em);

    if (rc == 0)
        *out = json_number_value(v);
    return rc;
}

int dt_json_bool(const dt_json_at_t *at, const json_t *o, const char *key, unsigned flags,
                 const char *want, bool *out, dt_emsg_t *em)
{
    json_t *v;
    int rc = dt_json_get(at, o, key, flags, JSON_TRUE, want, &v, em);

    if (rc == 0)
        *out = json_is_true(v);
    return rc;
}
