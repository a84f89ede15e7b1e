/* SPDX-License-Identifier: MIT
 *
 * `key = value` configuration files (dt.conf(5)): one setting per line, `#`
 * starts a comment (outside double quotes), blank lines ignored, values may
 * be double-quoted to keep leading/trailing spaces or a '#'. The caller
 * describes the keys it accepts in a table; an unknown key, a key given
 * twice, a value of the wrong type or out of range, a string its key's own
 * check refuses, or a missing required key is an error naming the file and
 * line. Parsing is all-or-nothing: on
 * error the destination struct is left as it was.
 *
 * Not here: includes, sections, environment expansion.
 */
#ifndef DT_CONF_H
#define DT_CONF_H

#include <stddef.h>
#include <stdint.h>

#include "err.h"

enum dt_conf_type {
    DT_CONF_STRING,   /* char *: NULL or heap memory on entry (a new value frees the
                       * old one); the caller frees with dt_conf_free */
    DT_CONF_INT,      /* int64_t within [min, max] */
    DT_CONF_BOOL,     /* int: yes/no, true/false, on/off, 1/0 */
    DT_CONF_DURATION, /* int64_t milliseconds: "250ms", "10s", "5m", "1h", bare = seconds */
    DT_CONF_SIZE,     /* int64_t bytes: "512", "64K", "4M", "2G", "1T" (powers of 1024) */
};

typedef struct dt_conf_key {
    const char *name;
    enum dt_conf_type type;
    size_t offset;    /* offsetof(the caller's struct, field) */
    int64_t min, max; /* INT, DURATION, SIZE: inclusive bounds; both 0 = unbounded,
                       * a lower bound alone takes max = INT64_MAX */
    int required;
    int reloadable;   /* may change on SIGHUP (informational, for the daemons) */
    const char *help; /* one line, for error messages and docs */
    /* The default as the documentation gives it: a value in the key's own
     * syntax ("1", "recall", "3e-3"), "auto" (chosen by the planner), or a
     * condition in words ("zigzag when causal, else contiguous"); NULL:
     * none (a required key, or unset meaning "not used"). The table's
     * owner resolves it (spec/spec.h dt_spec_int and friends). */
    const char *def;
    unsigned tags;    /* the table owner's (spec: the dtengine commands that take the key) */
    /* STRING keys: the value checked as the line is read, so that a bad
     * one is reported with its file and line (NULL: any text is taken).
     * Returns 0, or a negative code with the reason in em, which the
     * reader reports as "PATH:LINE: key 'K': <reason>" (DT_ECONF). */
    int (*check)(const char *value, dt_emsg_t *em);
} dt_conf_key_t;

/* Parse PATH into the struct at dst using the NULL-name-terminated key table.
 * Returns 0, DT_ENOENT/DT_EACCES/DT_EIO for an unreadable file, DT_ECONF for
 * any content error (message: "PATH:LINE: unknown key 'foo'" and the like). */
int dt_conf_load(const char *path, const dt_conf_key_t *keys, void *dst, dt_emsg_t *em);

/* The same over a string already in memory; `name` is used in messages. */
int dt_conf_parse(const char *name, const char *text, const dt_conf_key_t *keys,
                  void *dst, dt_emsg_t *em);

/* Free the STRING fields of dst named in the table and set them to NULL. */
void dt_conf_free(const dt_conf_key_t *keys, void *dst);

/* Value parsers, also used for command-line flags. Return 0 or DT_EINVAL /
 * DT_ERANGE. */
int dt_conf_parse_duration(const char *s, int64_t *ms);
int dt_conf_parse_size(const char *s, int64_t *bytes);
int dt_conf_parse_bool(const char *s, int *out);
int dt_conf_parse_int(const char *s, int64_t min, int64_t max, int64_t *out);

#endif /* DT_CONF_H */
