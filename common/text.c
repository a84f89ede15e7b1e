/* SPDX-License-Identifier: MIT
 *
 * Checking and escaping supplied text (text.h). One strict UTF-8 decoder
 * (no overlong forms, no surrogates, nothing above U+10FFFF), one list
 * of the code points a terminal must not receive raw and one escape of
 * each, whether into a new string or into a caller's buffer.
 */
#include "config.h"

#include <assert.h>
#include <inttypes.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/mem.h"
#include "common/text.h"

size_t dt_text_utf8_next(const unsigned char *p, size_t n, uint32_t *cp)
{
    uint32_t c = p[0], min;
    size_t len;

    if (c < 0x80) {
        *cp = c;
        return 1;
    }
    if (c >= 0xc2 && c <= 0xdf) {
        len = 2;
        c &= 0x1f;
        min = 0x80;
    } else if (c >= 0xe0 && c <= 0xef) {
        len = 3;
        c &= 0x0f;
        min = 0x800;
    } else if (c >= 0xf0 && c <= 0xf4) {
        len = 4;
        c &= 0x07;
        min = 0x10000;
    } else {
        return 0; /* a continuation byte, 0xc0, 0xc1 or 0xf5.. */
    }
    if (n < len)
        return 0;
    for (size_t i = 1; i < len; i++) {
        if ((p[i] & 0xc0) != 0x80)
            return 0;
        c = c << 6 | (p[i] & 0x3f);
    }
    if (c < min || c > 0x10ffff || (c >= 0xd800 && c <= 0xdfff))
        return 0;
    *cp = c;
    return len;
}

int dt_text_unprintable(uint32_t cp)
{
    return cp < 0x20 || cp == 0x7f || (cp >= 0x80 && cp <= 0x9f) || cp == 0x61c ||
           cp == 0x200e || cp == 0x200f || (cp >= 0x2028 && cp <= 0x202e) ||
           (cp >= 0x2066 && cp <= 0x2069);
}

int dt_text_check(const char *what, const char *s, size_t max, dt_emsg_t *em)
{
    const unsigned char *p = (const unsigned char *)s;
    size_t n = strlen(s), i = 0;

    if (max > 0 && n > max)
        return dt_emsg_set(em, DT_EINVAL, "%s: %zu bytes, more than %zu", what, n, max);
    while (i < n) {
        uint32_t cp;
        size_t len = dt_text_utf8_next(p + i, n - i, &cp);
        if (len == 0)
            return dt_emsg_set(em, DT_EINVAL, "%s: invalid UTF-8 at byte %zu", what, i);
        if (dt_text_unprintable(cp)) {
            if (cp < 0x80)
                return dt_emsg_set(em, DT_EINVAL, "%s: control character \\x%02x at byte %zu "
                                   "(only printable text)", what, cp, i);
            return dt_emsg_set(em, DT_EINVAL, "%s: %s character U+%04X at byte %zu (only "
                               "printable text)", what, cp <= 0x9f ? "control" : "format", cp, i);
        }
        i += len;
    }
    return 0;
}

static int kept(uint32_t cp, int flags)
{
    return (flags & DT_TEXT_KEEP_LINES) && (cp == '\n' || cp == '\t');
}

int dt_text_needs_escape(const char *s, int flags)
{
    const unsigned char *p = (const unsigned char *)s;
    size_t n = strlen(s), i = 0;

    while (i < n) {
        uint32_t cp;
        size_t len = dt_text_utf8_next(p + i, n - i, &cp);
        if (len == 0 || (dt_text_unprintable(cp) && !kept(cp, flags)))
            return 1;
        i += len;
    }
    return 0;
}

char *dt_text_escape(const char *s, int flags)
{
    return s ? dt_text_escape_n(s, strlen(s), flags) : NULL;
}

/* The escaped form of the character at p (n > 0 bytes left) into out: at
 * most 6 bytes and a NUL (out has room for any %x, as the compiler counts
 * it). Returns its length, and in *used the bytes of p it stands for. */
static size_t escape_one(const unsigned char *p, size_t n, int flags, char out[12], size_t *used)
{
    uint32_t cp;
    size_t len = dt_text_utf8_next(p, n, &cp);

    *used = len ? len : 1;
    if (len == 0)
        return (size_t)sprintf(out, "\\x%02x", p[0]);
    if (!dt_text_unprintable(cp) || kept(cp, flags)) {
        memcpy(out, p, len);
        return len;
    }
    if (cp == '\n')
        return (size_t)sprintf(out, "\\n");
    if (cp == '\t')
        return (size_t)sprintf(out, "\\t");
    if (cp == '\r')
        return (size_t)sprintf(out, "\\r");
    if (cp < 0x80)
        return (size_t)sprintf(out, "\\x%02x", cp);
    return (size_t)sprintf(out, "\\u%04x", cp);
}

char *dt_text_escape_n(const char *s, size_t n, int flags)
{
    const unsigned char *p = (const unsigned char *)s;
    size_t i = 0, o = 0, used;
    char *out;

    out = dt_xmallocarray(n + 1, 6); /* at most \uHHHH (6) per input byte */
    while (i < n) {
        char one[12];
        size_t len = escape_one(p + i, n - i, flags, one, &used);
        memcpy(out + o, one, len);
        o += len;
        i += used;
    }
    out[o] = '\0';
    return out;
}

const char *dt_text_escape_buf(const char *s, char *buf, size_t n, int flags)
{
    const unsigned char *p = (const unsigned char *)s;
    size_t len = strlen(s), i = 0, o = 0, cut = 0, used;

    assert(n >= 4);
    while (i < len) {
        char one[12];
        size_t k = escape_one(p + i, len - i, flags, one, &used);
        if (o + k > n - 1) {
            /* back to the last character after which "..." fits */
            memcpy(buf + cut, "...", 3);
            o = cut + 3;
            break;
        }
        memcpy(buf + o, one, k);
        o += k;
        i += used;
        if (o + 3 <= n - 1)
            cut = o;
    }
    buf[o] = '\0';
    return buf;
}

int dt_text_fit(const char *s, size_t max)
{
    size_t n = strnlen(s, max + 1);

    if (n <= max)
        return (int)n;
    /* s[max] is the first byte left out: back up while it continues a
     * sequence, so that the cut falls before that sequence's lead byte */
    while (max > 0 && ((unsigned char)s[max] & 0xc0) == 0x80)
        max--;
    return (int)max;
}

int dt_text_is_hex(const char *s, size_t len)
{
    return strlen(s) == len && strspn(s, "0123456789abcdef") == len;
}

const char *dt_text_shape(char *buf, size_t n, int ndim, const int64_t *shape,
                          dt_text_shape_style_t style)
{
    bool list = style == DT_SHAPE_LIST;
    /* Python writes a 1-tuple with a comma: (2,) */
    const char *close = list ? "]" : style == DT_SHAPE_TUPLE && ndim == 1 ? ",)" : ")";
    size_t o = (size_t)snprintf(buf, n, "%s", list ? "[" : "(");

    for (int i = 0; i < ndim && o < n; i++)
        o += (size_t)snprintf(buf + o, n - o, "%s%" PRId64, i ? ", " : "", shape[i]);
    if (o < n)
        snprintf(buf + o, n - o, "%s", close);
    return buf;
}
