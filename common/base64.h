/* SPDX-License-Identifier: MIT
 *
 * Standard base64 (RFC 4648, with '=' padding, no line breaks) over
 * libcrypto's EVP block coder: the PMIx fence data that agents and the
 * coordinator pass through JSON. In libdtcrypto with sha256.h.
 */
#ifndef DT_BASE64_H
#define DT_BASE64_H

#include <stddef.h>

/* The encoding of n bytes at p: a new NUL-terminated string. */
char *dt_base64_encode(const void *p, size_t n);
/* Room enough for the decoding of n base64 characters. */
#define DT_BASE64_DECODED_MAX(n) ((n) / 4 * 3 + 4)
/* The n characters at s (leading and trailing white space ignored) into
 * out, which has DT_BASE64_DECODED_MAX(n) bytes: the number of bytes
 * decoded (the padding not counted), or DT_EFORMAT when s is not base64. */
int dt_base64_decode(const char *s, size_t n, unsigned char *out);

#endif /* DT_BASE64_H */
