/* SPDX-License-Identifier: MIT
 *
 * Text that people and agents supply (job and node names, reasons, error
 * texts), checked where it enters and escaped where it is shown, so that
 * nothing stored can move a terminal's cursor, clear its screen or forge a
 * line of output. Acceptable text is valid UTF-8 without control
 * characters: no C0 (U+0000..U+001F, newline and tab included), no DEL, no
 * C1 (U+0080..U+009F), and none of the invisible format characters that
 * reorder or break lines (U+061C, U+200E, U+200F, U+2028..U+202E,
 * U+2066..U+2069).
 *
 * Also the few other checks and forms of text that several modules share:
 * a hex digest checked where it enters (dt_text_is_hex), a tensor shape
 * written for a message or a file header (dt_text_shape).
 *
 * Pure functions on bytes: no locale, no terminal, no JSON. Not here: what
 * a name may otherwise look like (the caller's rules).
 */
#ifndef DT_TEXT_H
#define DT_TEXT_H

#include <stddef.h>
#include <stdint.h>

#include "common/err.h"

/* 0 when s is acceptable text of at most max bytes (max 0: no bound).
 * Otherwise DT_EINVAL with a message that names `what` and says what is
 * wrong and where, without echoing the text itself:
 *   "node: control character \x1b at byte 3 (only printable text)"
 *   "node: invalid UTF-8 at byte 7"
 *   "reason: 300 bytes, more than 256"                                */
int dt_text_check(const char *what, const char *s, size_t max, dt_emsg_t *em);

/* Flags of dt_text_escape. */
#define DT_TEXT_KEEP_LINES 1 /* newline and tab stay as they are (multi-line text) */

/* A copy of s fit for a terminal (the caller frees it): an invalid UTF-8
 * byte and a C0 control or DEL become \xHH, newline, tab and carriage
 * return \n, \t and \r (unless DT_TEXT_KEEP_LINES keeps the first two),
 * a C1 control or format character \uHHHH. Everything else, backslashes
 * included, is copied, so text that dt_text_check accepts comes back
 * unchanged. NULL gives NULL. */
char *dt_text_escape(const char *s, int flags);
/* The same for n bytes that may hold NULs (a NUL becomes \x00): output
 * read in chunks, such as a job's log. */
char *dt_text_escape_n(const char *s, size_t n, int flags);

/* The same into buf (n bytes, at least 4), for a name from a file quoted
 * in a message: when the escaped text does not fit in n - 1 bytes, as much
 * of it as fits with "..." after it, cut between characters (never inside
 * an escape or a UTF-8 sequence). Returns buf. */
const char *dt_text_escape_buf(const char *s, char *buf, size_t n, int flags);

/* 1 when dt_text_escape(s, flags) would change s. */
int dt_text_needs_escape(const char *s, int flags);

/* The length of the longest prefix of s of at most max bytes that does not
 * end inside a UTF-8 sequence, for text cut to fit ("%.*s"). */
int dt_text_fit(const char *s, size_t max);

/* The UTF-8 sequence at p (n > 0 bytes left): its length, with its code
 * point in *cp, or 0 when p does not start a valid one (a stray
 * continuation byte, an overlong form, a surrogate, past U+10FFFF, cut
 * short by n). */
size_t dt_text_utf8_next(const unsigned char *p, size_t n, uint32_t *cp);
/* 1 for the code points acceptable text leaves out (above: C0, DEL, C1
 * and the format characters), else 0. */
int dt_text_unprintable(uint32_t cp);

/* 1 when s is exactly len lowercase hex digits (a SHA-256 digest: 64),
 * else 0. */
int dt_text_is_hex(const char *s, size_t len);

/* How dt_text_shape writes a shape of dims 2 and 3, of dim 2, of none. */
typedef enum dt_text_shape_style {
    DT_SHAPE_TUPLE, /* Python's tuple, as a .npy header has it: (2, 3)  (2,)  () */
    DT_SHAPE_LIST,  /* a JSON list, as a safetensors header has it: [2, 3]  [2]  [] */
    DT_SHAPE_PAREN, /* dims in parentheses, for messages: (2, 3)  (2)  () */
} dt_text_shape_style_t;

/* The ndim dims of shape as text in buf (n bytes), cut short when they do
 * not fit (then without the closing bracket). Returns buf. */
const char *dt_text_shape(char *buf, size_t n, int ndim, const int64_t *shape,
                          dt_text_shape_style_t style);

#endif /* DT_TEXT_H */
