/* SPDX-License-Identifier: MIT
 *
 * SHA-256 in lowercase hex over libcrypto's EVP digests (see sha256.h).
 */
#include "config.h"

#include <openssl/evp.h>
#include <stdio.h>
#include <stdlib.h>
#include <unistd.h>

#include "common/fileio.h"
#include "common/mem.h"
#include "common/sha256.h"

#define CHUNK (1 << 20)

/* dt_sha256_t is libcrypto's context, under a name of ours. */
static EVP_MD_CTX *ctx_of(dt_sha256_t *s)
{
    return (EVP_MD_CTX *)s;
}

static void hex_digest(const unsigned char *md, char hex[DT_SHA256_HEX])
{
    static const char digits[] = "0123456789abcdef";

    for (int i = 0; i < 32; i++) {
        hex[2 * i] = digits[md[i] >> 4];
        hex[2 * i + 1] = digits[md[i] & 15];
    }
    hex[64] = '\0';
}

dt_sha256_t *dt_sha256_new(void)
{
    EVP_MD_CTX *ctx = EVP_MD_CTX_new();

    /* Both fail only on allocation failure or a broken libcrypto. */
    if (ctx == NULL || EVP_DigestInit_ex(ctx, EVP_sha256(), NULL) != 1) {
        fprintf(stderr, "dt: cannot initialise SHA-256 in libcrypto\n");
        abort();
    }
    return (dt_sha256_t *)ctx;
}

void dt_sha256_update(dt_sha256_t *s, const void *p, size_t n)
{
    if (n > 0 && EVP_DigestUpdate(ctx_of(s), p, n) != 1) {
        fprintf(stderr, "dt: SHA-256 update failed in libcrypto\n");
        abort();
    }
}

void dt_sha256_final(dt_sha256_t *s, char hex[DT_SHA256_HEX])
{
    unsigned char md[EVP_MAX_MD_SIZE];
    unsigned int len = 0;

    if (EVP_DigestFinal_ex(ctx_of(s), md, &len) != 1 || len != 32) {
        fprintf(stderr, "dt: SHA-256 final failed in libcrypto\n");
        abort();
    }
    EVP_MD_CTX_free(ctx_of(s));
    hex_digest(md, hex);
}

void dt_sha256_free(dt_sha256_t *s)
{
    EVP_MD_CTX_free(ctx_of(s));
}

void dt_sha256_hex(const void *p, size_t n, char hex[DT_SHA256_HEX])
{
    dt_sha256_t *s = dt_sha256_new();

    dt_sha256_update(s, p, n);
    dt_sha256_final(s, hex);
}

int64_t dt_sha256_fd(int fd, char hex[DT_SHA256_HEX])
{
    dt_sha256_t *s = dt_sha256_new();
    unsigned char *buf = dt_xmalloc(CHUNK);
    int64_t off = 0, got;

    while ((got = dt_pread_full(fd, buf, CHUNK, off)) > 0) {
        dt_sha256_update(s, buf, (size_t)got);
        off += got;
    }
    free(buf);
    if (got < 0) {
        dt_sha256_free(s);
        return got;
    }
    dt_sha256_final(s, hex);
    return off;
}

int dt_sha256_file(const char *path, char hex[DT_SHA256_HEX], dt_emsg_t *em)
{
    int64_t got;
    int fd;

    /* a regular file, not through a link: a device would never end, and
     * a planted link would make whoever hashes read another file */
    if ((fd = dt_open_regular_flags(path, DT_OPEN_NOFOLLOW, NULL, em)) < 0)
        return fd;
    got = dt_sha256_fd(fd, hex);
    close(fd);
    if (got < 0)
        return dt_emsg_set(em, (int)got, "%s: cannot read: %s", path, dt_strerror((int)got));
    return 0;
}
