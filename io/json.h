/* SPDX-License-Identifier: MIT
 *
 * The JSON of dt's file formats, read: a document parsed with duplicate
 * keys refused, and getters that check one key of an object and word what
 * is wrong with it the one way, naming the file and the key. The Hugging
 * Face config (hf_config.c) and the checkpoint manifest (ckpt.c) read
 * through it.
 *
 * Not here: the wire protocol's JSON (common/wire.h), writing JSON, what
 * a file's keys mean (the caller's).
 */
#ifndef DT_IO_JSON_H
#define DT_IO_JSON_H

#include <jansson.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "common/err.h"

/* The len bytes at text as JSON, a duplicate key refused: 0 and *root
 * (the caller's to json_decref), or DT_EFORMAT with
 * "NAME: not valid JSON: WHY (line L, column C)" and *root NULL. */
int dt_json_parse(const char *name, const char *text, size_t len, json_t **root, dt_emsg_t *em);

/* v for a message, into buf (n bytes, at least 4): compact, ASCII only,
 * cut to fit with "..." after it; "?" when it cannot be written. Returns
 * buf. */
const char *dt_json_show(const json_t *v, char *buf, size_t n);

/* Where the getters' keys are and how their messages read:
 *     "FILE: 'PREFIXKEY' is missing"
 *     "FILE: 'PREFIXKEY' must be WANT, not VALUE"      with show
 *     "FILE: 'PREFIXKEY' is not WANT"                  without
 * each with the code err. */
typedef struct dt_json_at {
    const char *file;   /* a file's path, or the object's name ("model") */
    const char *prefix; /* before each key, "rope_scaling." (NULL: nothing) */
    int err;            /* DT_EINVAL for a user's file, DT_EFORMAT for dt's own */
    bool null_absent;   /* a null value is absent (Python's None) */
    bool show;          /* a bad value is shown (dt_json_show, 47 bytes at most) */
} dt_json_at_t;

/* The getters' flags. */
#define DT_JSON_OPTIONAL 1u /* an absent key returns 1, *out unchanged, no message */
#define DT_JSON_POSITIVE 2u /* dt_json_num: above 0 */

/* Key `key` of object o (a non-object has no keys) when it is of jansson
 * type t, which `want` words ("an object"): 0 and *out (borrowed from o);
 * 1 when it is absent and optional (*out unchanged, no message); else
 * at->err with a message above. JSON_REAL takes any number (above 0 with
 * DT_JSON_POSITIVE) and JSON_TRUE either boolean. */
int dt_json_get(const dt_json_at_t *at, const json_t *o, const char *key, unsigned flags,
                json_type t, const char *want, json_t **out, dt_emsg_t *em);
/* The same for an integer from min to max ("an integer from 1 to 64"), any
 * JSON number, integer or real (jansson reads no NaN or infinity), and a
 * boolean, into *out. */
int dt_json_int(const dt_json_at_t *at, const json_t *o, const char *key, unsigned flags,
                int64_t min, int64_t max, const char *want, int64_t *out, dt_emsg_t *em);
int dt_json_num(const dt_json_at_t *at, const json_t *o, const char *key, unsigned flags,
                const char *want, double *out, dt_emsg_t *em);
int dt_json_bool(const dt_json_at_t *at, const json_t *o, const char *key, unsigned flags,
                 const char *want, bool *out, dt_emsg_t *em);

#endif /* DT_IO_JSON_H */
