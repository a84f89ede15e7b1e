/* SPDX-License-Identifier: MIT
 *
 * The dt.conf reader: `key = value` lines checked against the caller's key
 * table, and the value parsers (durations, sizes, booleans, bounded integers)
 * that command-line flags share. Parsing takes two passes: every line is
 * validated and its value converted into a scratch slot per key, and the
 * destination struct is written only once the whole text has passed, so a bad
 * file changes nothing. Input is capped (4096-byte lines, 1 MiB files) before
 * anything is copied out of it, and values echoed in messages are cut short
 * and stripped of control characters.
 *
 * Not here: includes, sections, environment expansion, reload policy (the
 * `reloadable` flag is for the daemons to act on).
 */
#include "config.h"

#include <assert.h>
#include <fcntl.h>
#include <inttypes.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <unistd.h>

#include "conf.h"
#include "mem.h"

#define LINE_MAX_BYTES 4096
#define FILE_MAX_BYTES (1024 * 1024)
#define SHOW_MAX 48 /* bytes of a key or value echoed back in a message */

#define MS_PER_S INT64_C(1000)
#define MS_PER_M (60 * MS_PER_S)
#define MS_PER_H (60 * MS_PER_M)

/* One key's parsed value, held until the whole text has passed. */
struct slot {
    unsigned line; /* where the key was set; 0 = not set */
    int64_t num;   /* INT, BOOL, DURATION, SIZE */
    char *str;     /* STRING; owned here until committed to dst */
};

/* Where we are, for messages. */
struct ctx {
    const char *name;
    unsigned line;
    dt_emsg_t *em;
};

static int is_space(char c)
{
    return c == ' ' || c == '\t' || c == '\r' || c == '\v' || c == '\f';
}

static int is_key_char(char c)
{
    return (c >= 'a' && c <= 'z') || (c >= '0' && c <= '9') || c == '_';
}

/*-- value parsers -----------------------------------------------------------*/

/* Decimal digits at *sp, at least one, advancing *sp past all of them. No
 * sign and no leading space (strtoll would take both). Returns -1 if there is
 * no digit, 1 if the number does not fit in 64 bits, else 0. */
static int digits(const char **sp, uint64_t *out)
{
    const char *s = *sp;
    uint64_t v = 0;
    int over = 0;

    if (*s < '0' || *s > '9')
        return -1;
    for (; *s >= '0' && *s <= '9'; s++) {
        unsigned d = (unsigned)(*s - '0');

        if (v > (UINT64_MAX - d) / 10)
            over = 1;
        else
            v = v * 10 + d;
    }
    *sp = s;
    *out = v;
    return over;
}

int dt_conf_parse_duration(const char *s, int64_t *ms)
{
    static const struct {
        const char *unit;
        int64_t ms;
    } units[] = {
        { "", MS_PER_S }, { "ms", 1 }, { "s", MS_PER_S }, { "m", MS_PER_M }, { "h", MS_PER_H },
    };
    uint64_t v;
    size_t i;
    int over;

    if (s == NULL)
        return DT_EINVAL;
    over = digits(&s, &v);
    if (over < 0)
        return DT_EINVAL;
    for (i = 0; i < sizeof(units) / sizeof(units[0]); i++) {
        if (strcmp(s, units[i].unit) != 0)
            continue;
        if (over || v > (uint64_t)(INT64_MAX / units[i].ms))
            return DT_ERANGE;
        *ms = (int64_t)v * units[i].ms;
        return 0;
    }
    return DT_EINVAL;
}

int dt_conf_parse_size(const char *s, int64_t *bytes)
{
    static const char prefixes[] = "KkMmGgTt";
    const char *p = NULL;
    unsigned shift = 0;
    uint64_t v;
    int over;

    if (s == NULL)
        return DT_EINVAL;
    over = digits(&s, &v);
    if (over < 0)
        return DT_EINVAL;
    if (*s != '\0')
        p = strchr(prefixes, *s);
    if (p != NULL) {
        shift = 10 * (1 + (unsigned)(p - prefixes) / 2);
        s++;
        if ((s[0] == 'i' || s[0] == 'I') && (s[1] == 'B' || s[1] == 'b'))
            s++;
    }
    if (*s == 'B' || *s == 'b')
        s++;
    if (*s != '\0')
        return DT_EINVAL;
    if (over || v > ((uint64_t)INT64_MAX >> shift))
        return DT_ERANGE;
    *bytes = (int64_t)(v << shift);
    return 0;
}

int dt_conf_parse_bool(const char *s, int *out)
{
    static const char *const words[][2] = {
        { "yes", "no" },
        { "true", "false" },
        { "on", "off" },
        { "1", "0" },
    };
    size_t i;
    int b;

    if (s == NULL)
        return DT_EINVAL;
    for (i = 0; i < sizeof(words) / sizeof(words[0]); i++) {
        for (b = 0; b < 2; b++) {
            if (strcasecmp(s, words[i][b]) == 0) {
                *out = !b;
                return 0;
            }
        }
    }
    return DT_EINVAL;
}

/* min == max == 0 means unbounded (any int64_t). */
int dt_conf_parse_int(const char *s, int64_t min, int64_t max, int64_t *out)
{
    uint64_t v;
    int64_t x;
    int neg = 0, over;

    if (s == NULL)
        return DT_EINVAL;
    if (*s == '-' || *s == '+')
        neg = *s++ == '-';
    over = digits(&s, &v);
    if (over < 0 || *s != '\0')
        return DT_EINVAL;
    if (over || v > (uint64_t)INT64_MAX + (uint64_t)neg)
        return DT_ERANGE;
    if (!neg)
        x = (int64_t)v;
    else if (v == (uint64_t)INT64_MAX + 1)
        x = INT64_MIN;
    else
        x = -(int64_t)v;
    if ((min != 0 || max != 0) && (x < min || x > max))
        return DT_ERANGE;
    *out = x;
    return 0;
}

/*-- messages ----------------------------------------------------------------*/

static int fail(const struct ctx *c, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

/* "NAME:LINE: <message>", DT_ECONF. */
static int fail(const struct ctx *c, const char *fmt, ...)
{
    char msg[sizeof(dt_emsg_t)];
    va_list ap;

    if (c->em == NULL)
        return DT_ECONF;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof(msg), fmt, ap);
    va_end(ap);
    return dt_emsg_set(c->em, DT_ECONF, "%s:%u: %s", c->name, c->line, msg);
}

/* Text from the file as it may appear in a message: at most SHOW_MAX bytes
 * (not cutting a UTF-8 sequence), control characters as '?', "..." if cut. */
static const char *show(char buf[static SHOW_MAX + 4], const char *s, size_t n)
{
    size_t i, k = n;

    if (k > SHOW_MAX) {
        k = SHOW_MAX;
        while (k > 0 && ((unsigned char)s[k] & 0xc0) == 0x80)
            k--;
    }
    for (i = 0; i < k; i++)
        buf[i] = ((unsigned char)s[i] < 0x20 || s[i] == 0x7f) ? '?' : s[i];
    if (k < n) {
        memcpy(buf + k, "...", 3);
        k += 3;
    }
    buf[k] = '\0';
    return buf;
}

/* The largest unit that states ms exactly: "1h", "90s", "250ms". */
static void fmt_duration(char *buf, size_t n, int64_t ms)
{
    if (ms != 0 && ms % MS_PER_H == 0)
        snprintf(buf, n, "%" PRId64 "h", ms / MS_PER_H);
    else if (ms != 0 && ms % MS_PER_M == 0)
        snprintf(buf, n, "%" PRId64 "m", ms / MS_PER_M);
    else if (ms != 0 && ms % MS_PER_S == 0)
        snprintf(buf, n, "%" PRId64 "s", ms / MS_PER_S);
    else
        snprintf(buf, n, "%" PRId64 "ms", ms);
}

/* "64KiB", "3MiB", "1000B". */
static void fmt_size(char *buf, size_t n, int64_t bytes)
{
    static const char *const units[] = { "TiB", "GiB", "MiB", "KiB" };
    int i;

    for (i = 0; i < 4 && bytes != 0; i++) {
        int64_t unit = INT64_C(1) << (40 - 10 * i);

        if (bytes % unit == 0) {
            snprintf(buf, n, "%" PRId64 "%s", bytes / unit, units[i]);
            return;
        }
    }
    snprintf(buf, n, "%" PRId64 "B", bytes);
}

static void fmt_value(char *buf, size_t n, enum dt_conf_type type, int64_t v)
{
    if (type == DT_CONF_DURATION)
        fmt_duration(buf, n, v);
    else if (type == DT_CONF_SIZE)
        fmt_size(buf, n, v);
    else
        snprintf(buf, n, "%" PRId64, v);
}

static const char *expected(enum dt_conf_type type)
{
    switch (type) {
    case DT_CONF_STRING:
        return "a string";
    case DT_CONF_INT:
        return "an integer";
    case DT_CONF_BOOL:
        return "yes/no, true/false, on/off or 1/0";
    case DT_CONF_DURATION:
        return "a duration such as 250ms, 10s, 5m or 1h";
    case DT_CONF_SIZE:
        return "a size such as 512, 64K, 4M or 2G";
    }
    return "?";
}

/*-- the file ----------------------------------------------------------------*/

static int bounded(const dt_conf_key_t *k)
{
    return k->min != 0 || k->max != 0;
}

/* Convert val for key k into s; a message on failure. */
static int convert(const struct ctx *c, const dt_conf_key_t *k, const char *val, size_t vlen,
                   struct slot *s)
{
    char shown[SHOW_MAX + 4], lo[32], hi[32];
    int64_t num = 0;
    int rc = 0, b = 0;

    if (k->type == DT_CONF_STRING) {
        dt_emsg_t why = { "" };
        if (k->check != NULL && k->check(val, &why) < 0) {
            /* the reason may quote the value: no control characters */
            for (char *q = why.s; *q; q++)
                if ((unsigned char)*q < 0x20 || *q == 0x7f)
                    *q = '?';
            return fail(c, "key '%s': %s", k->name, why.s);
        }
        s->str = dt_xstrdup(val);
        return 0;
    }
    if (vlen == 0)
        return fail(c, "key '%s': empty value (expected %s)", k->name, expected(k->type));

    switch (k->type) {
    case DT_CONF_STRING:
        break;
    case DT_CONF_INT:
        rc = dt_conf_parse_int(val, k->min, k->max, &num);
        break;
    case DT_CONF_BOOL:
        rc = dt_conf_parse_bool(val, &b);
        num = b;
        break;
    case DT_CONF_DURATION:
        rc = dt_conf_parse_duration(val, &num);
        break;
    case DT_CONF_SIZE:
        rc = dt_conf_parse_size(val, &num);
        break;
    }
    if (rc == 0 && k->type != DT_CONF_INT && k->type != DT_CONF_BOOL && bounded(k) &&
        (num < k->min || num > k->max))
        rc = DT_ERANGE;

    show(shown, val, vlen);
    if (rc == DT_EINVAL && val[0] == '-' &&
        (k->type == DT_CONF_DURATION || k->type == DT_CONF_SIZE))
        return fail(c, "key '%s': negative value '%s' (expected %s)", k->name, shown,
                    expected(k->type));
    if (rc == DT_EINVAL)
        return fail(c, "key '%s': bad value '%s' (expected %s)", k->name, shown, expected(k->type));
    if (rc == DT_ERANGE && !bounded(k))
        return fail(c, "key '%s': value '%s' out of range (does not fit in 64 bits)", k->name,
                    shown);
    if (rc == DT_ERANGE) {
        fmt_value(lo, sizeof(lo), k->type, k->min);
        fmt_value(hi, sizeof(hi), k->type, k->max);
        return fail(c, "key '%s': value '%s' out of range (%s..%s)", k->name, shown, lo, hi);
    }
    s->num = num;
    return 0;
}

/* One line, [p, end), without its newline. val has room for the whole line. */
static int parse_line(const struct ctx *c, const char *p, const char *end,
                      const dt_conf_key_t *keys, struct slot *slots, char *val)
{
    char shown[SHOW_MAX + 4];
    const char *key, *key_end, *q;
    const dt_conf_key_t *k;
    size_t klen, vlen = 0, i;
    int rc;

    while (p < end && is_space(*p))
        p++;
    if (p == end || *p == '#')
        return 0;

    /* key */
    key = p;
    while (p < end && *p != '=' && *p != '#')
        p++;
    key_end = p;
    while (key_end > key && is_space(key_end[-1]))
        key_end--;
    klen = (size_t)(key_end - key);
    if (p == end || *p == '#')
        return fail(c, "missing '=' after '%s'", show(shown, key, klen));
    if (klen == 0)
        return fail(c, "empty key before '='");
    for (q = key; q < key_end; q++) {
        if (!is_key_char(*q))
            return fail(c, "invalid key name '%s' (a-z, 0-9 and _ only)", show(shown, key, klen));
    }
    for (i = 0; keys[i].name != NULL; i++) {
        if (strlen(keys[i].name) == klen && memcmp(keys[i].name, key, klen) == 0)
            break;
    }
    k = &keys[i];
    if (k->name == NULL)
        return fail(c, "unknown key '%s'", show(shown, key, klen));
    if (slots[i].line != 0)
        return fail(c, "duplicate key '%s' (first set on line %u)", k->name, slots[i].line);

    /* value: quoted with \" and \\, or bare up to a comment */
    p++;
    while (p < end && is_space(*p))
        p++;
    if (p < end && *p == '"') {
        for (p++;; p++) {
            if (p == end || (*p == '\\' && p + 1 == end))
                return fail(c, "key '%s': unterminated quote", k->name);
            if (*p == '"')
                break;
            if (*p == '\\') {
                p++;
                if (*p != '"' && *p != '\\')
                    return fail(c, "key '%s': unknown escape '\\%s' (only \\\" and \\\\)", k->name,
                                show(shown, p, 1));
            }
            val[vlen++] = *p;
        }
        for (p++; p < end && is_space(*p); p++)
            ;
        if (p < end && *p != '#')
            return fail(c, "key '%s': unexpected text after closing quote: '%s'", k->name,
                        show(shown, p, (size_t)(end - p)));
    } else {
        const char *v = p;

        for (; p < end && *p != '#'; p++) {
            if (*p == '"')
                return fail(c, "key '%s': stray '\"' in unquoted value (quote the whole value)",
                            k->name);
        }
        while (p > v && is_space(p[-1]))
            p--;
        vlen = (size_t)(p - v);
        memcpy(val, v, vlen);
    }
    val[vlen] = '\0';

    rc = convert(c, k, val, vlen, &slots[i]);
    if (rc == 0)
        slots[i].line = c->line;
    return rc;
}

static void *field(void *dst, const dt_conf_key_t *k)
{
    return (char *)dst + k->offset;
}

/* The table is the program's, not the user's: a bad one is a bug. */
static size_t check_table(const dt_conf_key_t *keys)
{
    size_t n;
    const char *q;

    for (n = 0; keys[n].name != NULL; n++) {
        assert(keys[n].name[0] != '\0');
        for (q = keys[n].name; *q != '\0'; q++)
            assert(is_key_char(*q));
        assert(keys[n].type <= DT_CONF_SIZE);
        assert(keys[n].check == NULL || keys[n].type == DT_CONF_STRING);
    }
    return n;
}

static int parse_text(const char *name, const char *text, size_t len, const dt_conf_key_t *keys,
                      void *dst, dt_emsg_t *em)
{
    struct ctx c = { name, 0, em };
    size_t nkeys = check_table(keys), pos = 0, i;
    struct slot *slots = NULL;
    char *val = NULL;
    int rc = 0;

    if (len > FILE_MAX_BYTES)
        return dt_emsg_set(em, DT_ECONF, "%s: larger than the limit of %d bytes (1 MiB)", name,
                           FILE_MAX_BYTES);
    slots = dt_xcalloc(nkeys + 1, sizeof(*slots));
    val = dt_xmalloc(LINE_MAX_BYTES + 1);

    /* Editors on some systems start the file with a UTF-8 byte order mark,
     * which would otherwise read as an invisible part of the first key. */
    if (len >= 3 && memcmp(text, "\xef\xbb\xbf", 3) == 0)
        pos = 3;

    while (pos < len) {
        const char *line = text + pos;
        const char *nl = memchr(line, '\n', len - pos);
        size_t n = nl != NULL ? (size_t)(nl - line) : len - pos;

        pos += n + (nl != NULL);
        c.line++;
        if (n > LINE_MAX_BYTES) {
            rc = fail(&c, "line longer than %d bytes", LINE_MAX_BYTES);
            goto out;
        }
        if (memchr(line, '\0', n) != NULL) {
            rc = fail(&c, "NUL byte in line");
            goto out;
        }
        rc = parse_line(&c, line, line + n, keys, slots, val);
        if (rc != 0)
            goto out;
    }

    for (i = 0; i < nkeys; i++) {
        if (keys[i].required && slots[i].line == 0) {
            rc = dt_emsg_set(em, DT_ECONF, "%s: missing required key '%s'%s%s%s", name,
                             keys[i].name, keys[i].help ? " (" : "",
                             keys[i].help ? keys[i].help : "", keys[i].help ? ")" : "");
            goto out;
        }
    }

    /* Everything passed: now, and only now, write dst. */
    for (i = 0; i < nkeys; i++) {
        void *f = field(dst, &keys[i]);

        if (slots[i].line == 0)
            continue;
        switch (keys[i].type) {
        case DT_CONF_STRING:
            free(*(char **)f);
            *(char **)f = slots[i].str;
            slots[i].str = NULL;
            break;
        case DT_CONF_BOOL:
            *(int *)f = (int)slots[i].num;
            break;
        case DT_CONF_INT:
        case DT_CONF_DURATION:
        case DT_CONF_SIZE:
            *(int64_t *)f = slots[i].num;
            break;
        }
    }

out:
    for (i = 0; i < nkeys; i++)
        free(slots[i].str);
    free(val);
    free(slots);
    return rc;
}

int dt_conf_parse(const char *name, const char *text, const dt_conf_key_t *keys, void *dst,
                  dt_emsg_t *em)
{
    assert(text != NULL && keys != NULL && dst != NULL);
    return parse_text(name ? name : "(string)", text, strnlen(text, FILE_MAX_BYTES + 1), keys, dst,
                      em);
}

/* An errno from open/read as a dt code and "PATH: cannot open: why". */
static int sys_fail(dt_emsg_t *em, const char *path, const char *what, int e)
{
    int rc = dt_err_errno(e);

    /* Errnos without their own code (EISDIR, ELOOP) become DT_EIO, whose
     * message would hide the cause: name the errno itself then. */
    return dt_emsg_set(em, rc, "%s: %s: %s", path, what,
                       rc != DT_EIO || e == EIO ? dt_strerror(rc) : strerror(e));
}

int dt_conf_load(const char *path, const dt_conf_key_t *keys, void *dst, dt_emsg_t *em)
{
    char *buf = NULL;
    size_t len = 0;
    ssize_t r;
    int fd, rc;

    assert(path != NULL);
    fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0)
        return sys_fail(em, path, "cannot open", errno);

    /* Read one byte past the cap so an oversized file is seen as such. */
    buf = dt_xmalloc(FILE_MAX_BYTES + 1);
    while (len <= FILE_MAX_BYTES) {
        r = read(fd, buf + len, FILE_MAX_BYTES + 1 - len);
        if (r < 0 && errno == EINTR)
            continue;
        if (r < 0) {
            rc = sys_fail(em, path, "cannot read", errno);
            goto out;
        }
        if (r == 0)
            break;
        len += (size_t)r;
    }
    rc = parse_text(path, buf, len, keys, dst, em);

out:
    free(buf);
    close(fd);
    return rc;
}

void dt_conf_free(const dt_conf_key_t *keys, void *dst)
{
    size_t i;

    for (i = 0; keys[i].name != NULL; i++) {
        if (keys[i].type == DT_CONF_STRING) {
            char **f = field(dst, &keys[i]);

            free(*f);
            *f = NULL;
        }
    }
}
