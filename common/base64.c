/* SPDX-License-Identifier: MIT
 *
 * base64 over EVP_EncodeBlock / EVP_DecodeBlock (see base64.h).
 */
#include "config.h"

#include <limits.h>
#include <openssl/evp.h>
#include <stdio.h>
#include <stdlib.h>

#include "common/base64.h"
#include "common/err.h"
#include "common/mem.h"

char *dt_base64_encode(const void *p, size_t n)
{
    char *s;

    if (n > (size_t)INT_MAX / 4 * 3) { /* EVP's lengths are ints: a caller bug */
        fprintf(stderr, "dt: base64 of %zu bytes: more than libcrypto takes\n", n);
        abort();
    }
    s = dt_xmalloc(4 * ((n + 2) / 3) + 1);
    EVP_EncodeBlock((unsigned char *)s, p, (int)n);
    return s;
}

int dt_base64_decode(const char *s, size_t n, unsigned char *out)
{
    int len;

    if (n == 0)
        return 0;
    if (n > (size_t)INT_MAX)
        return DT_EFORMAT;
    if ((len = EVP_DecodeBlock(out, (const unsigned char *)s, (int)n)) < 0)
        return DT_EFORMAT;
    /* EVP_DecodeBlock counts the padding as zero bytes: take them off */
    if (s[n - 1] == '=')
        len--;
    if (n >= 2 && s[n - 2] == '=')
        len--;
    return len;
}
