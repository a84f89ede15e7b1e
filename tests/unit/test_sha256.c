/* SPDX-License-Identifier: MIT
 *
 * common/sha256 and common/base64 against published vectors (FIPS 180-2,
 * RFC 4648), streaming in odd pieces against one shot, and the decoder's
 * answer to what is not base64.
 */
#include "config.h"

#include <criterion/criterion.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "common/base64.h"
#include "common/mem.h"
#include "common/sha256.h"

#define ABC "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad"
#define EMPTY "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855"
#define TWO_BLOCKS "248d6a61d20638b8e5c026930c3e6039a33ce45964ff2167f6ecedd419db06c1"
#define MILLION_A "cdc76e5c9914fb9281a1c7e284d73e67f1809a48a497200e046d39ccc7112cd0"

Test(sha256, vectors)
{
    char hex[DT_SHA256_HEX];

    dt_sha256_hex("abc", 3, hex);
    cr_expect_str_eq(hex, ABC);
    dt_sha256_hex("", 0, hex);
    cr_expect_str_eq(hex, EMPTY);
    dt_sha256_hex("abcdbcdecdefdefgefghfghighijhijkijkljklmklmnlmnomnopnopq", 56, hex);
    cr_expect_str_eq(hex, TWO_BLOCKS);
}

Test(sha256, streaming_in_pieces)
{
    char *a = dt_xmalloc(1000000), hex[DT_SHA256_HEX];
    dt_sha256_t *s = dt_sha256_new();
    size_t off = 0, step = 1;

    memset(a, 'a', 1000000);
    while (off < 1000000) { /* pieces of 1, 2, 3, ... bytes: no block alignment */
        size_t n = 1000000 - off < step ? 1000000 - off : step;
        dt_sha256_update(s, a + off, n);
        off += n;
        step++;
    }
    dt_sha256_final(s, hex);
    cr_expect_str_eq(hex, MILLION_A);
    dt_sha256_hex(a, 1000000, hex);
    cr_expect_str_eq(hex, MILLION_A);
    dt_sha256_free(dt_sha256_new()); /* discarded without a digest */
    dt_sha256_free(NULL);
    free(a);
}

/* a file of more than one read chunk, by descriptor and by name */
Test(sha256, file)
{
    char path[] = "/tmp/dt-test-sha256-XXXXXX", hex[DT_SHA256_HEX];
    char *a = dt_xmalloc(1000000);
    dt_emsg_t em = { "" };
    int fd = mkstemp(path);

    cr_assert(fd >= 0);
    memset(a, 'a', 1000000);
    for (int i = 0; i < 3; i++) /* 3 MB: chunks of 1 MiB and a tail */
        cr_assert_eq(write(fd, a, 1000000), 1000000);
    dt_sha256_hex("", 0, hex);
    cr_expect_eq(dt_sha256_fd(fd, hex), 3000000);
    close(fd);
    cr_expect_eq(dt_sha256_file(path, hex, &em), 0, "%s", em.s);
    char want[DT_SHA256_HEX];
    dt_sha256_t *s = dt_sha256_new();
    for (int i = 0; i < 3; i++)
        dt_sha256_update(s, a, 1000000);
    dt_sha256_final(s, want);
    cr_expect_str_eq(hex, want);
    unlink(path);
    cr_expect_eq(dt_sha256_file(path, hex, &em), DT_ENOENT);
    cr_expect(strstr(em.s, path) != NULL, "%s", em.s);
    free(a);
}

static void b64(const char *raw, const char *enc)
{
    size_t n = strlen(raw), m = strlen(enc);
    char *got = dt_base64_encode(raw, n);
    unsigned char *back = dt_xmalloc(DT_BASE64_DECODED_MAX(m));

    cr_expect_str_eq(got, enc);
    cr_expect_eq(dt_base64_decode(enc, m, back), (int)n, "%s", enc);
    cr_expect(memcmp(back, raw, n) == 0, "%s", enc);
    free(back);
    free(got);
}

Test(base64, rfc4648_vectors)
{
    b64("", "");
    b64("f", "Zg==");
    b64("fo", "Zm8=");
    b64("foo", "Zm9v");
    b64("foob", "Zm9vYg==");
    b64("fooba", "Zm9vYmE=");
    b64("foobar", "Zm9vYmFy");
}

Test(base64, binary_round_trip)
{
    unsigned char raw[256], back[DT_BASE64_DECODED_MAX(344)];

    for (int i = 0; i < 256; i++)
        raw[i] = (unsigned char)(255 - i);
    for (size_t n = 0; n <= 256; n += 17) {
        char *enc = dt_base64_encode(raw, n);
        cr_assert(strlen(enc) <= 344);
        cr_expect_eq(dt_base64_decode(enc, strlen(enc), back), (int)n);
        cr_expect(memcmp(back, raw, n) == 0);
        free(enc);
    }
}

Test(base64, refused)
{
    unsigned char out[16];

    cr_expect_eq(dt_base64_decode("Zm9", 3, out), DT_EFORMAT); /* not a multiple of 4 */
    cr_expect_eq(dt_base64_decode("Zm9*", 4, out), DT_EFORMAT);
}
