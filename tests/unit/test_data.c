/* SPDX-License-Identifier: MIT
 *
 * Tests of engine/data and the token files under it (io/tokshard.h): .bin
 * token shards written by the atomic writer and read back in both formats
 * (uint16 and uint32), shards written byte by byte that must be refused
 * with the message a user would see (bad magic, bad version, short header,
 * a count larger than the file, trailing data); .npy token ids (int32,
 * int64, 1-D and 2-D, told by the magic) read back, refused for every
 * dtype, order, rank and size they must not have, and for bad ids; the
 * loader's windows, order, shuffle and cursor (a restored cursor gives the
 * same batches; .npy files give the sequences their shard twins give), and
 * the generated recall task (determinism, answers that
 * match the planted pairs, the pairs on other ranks than the queries, the
 * target layout,
 * the scorer). Every test works in its own directory under /tmp.
 */
#include "common/fileio.h"
#include "config.h"

#include <criterion/criterion.h>
#include <dirent.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "engine/data/loader.h"
#include "engine/data/recall.h"
#include "io/npy.h"
#include "io/tokshard.h"
#include "spec/layout.h"
#include "engine/data/gen.h"

/*-- fixture: one temp dir per test -----------------------------------------*/

static char tmpdir[64];

static void setup(void)
{
    snprintf(tmpdir, sizeof(tmpdir), "/tmp/test_data.XXXXXX");
    cr_assert_not_null(mkdtemp(tmpdir), "mkdtemp: %s", strerror(errno));
}

static void teardown(void)
{
    if (tmpdir[0])
        dt_rmtree(tmpdir, NULL);
}

TestSuite(data, .init = setup, .fini = teardown);

/* tmpdir/name, in one of a few rotating static buffers. */
static const char *P(const char *name)
{
    static char bufs[64][256];
    static int i;
    char *b = bufs[i++ % 64];

    snprintf(b, sizeof(bufs[0]), "%s/%s", tmpdir, name);
    return b;
}

/* Entries of tmpdir other than . and .. */
static int dir_entries(void)
{
    DIR *d = opendir(tmpdir);
    struct dirent *e;
    int n = 0;

    cr_assert_not_null(d);
    while ((e = readdir(d)) != NULL)
        if (strcmp(e->d_name, ".") != 0 && strcmp(e->d_name, "..") != 0)
            n++;
    closedir(d);
    return n;
}

static int64_t file_size(const char *path)
{
    struct stat st;

    cr_assert_eq(stat(path, &st), 0, "stat %s: %s", path, strerror(errno));
    return (int64_t)st.st_size;
}

/* A raw shard: header ints h0, h1, h2 (rest zero), then nbytes of payload
 * bytes (i & 0xff); hbytes < 1024 cuts the header short. */
static void write_raw(const char *path, int32_t h0, int32_t h1, int32_t h2, size_t hbytes,
                      size_t nbytes)
{
    int32_t hdr[DT_TOK_HEADER_INTS] = { h0, h1, h2 };
    FILE *f = fopen(path, "wb");

    cr_assert_not_null(f);
    cr_assert_eq(fwrite(hdr, 1, hbytes, f), hbytes);
    for (size_t i = 0; i < nbytes; i++)
        fputc((int)(i & 0xff), f);
    cr_assert_eq(fclose(f), 0);
}

/* Open must fail with err and a message containing want. */
static void expect_refused(const char *path, int err, const char *want)
{
    dt_tok_shard_t *s = (dt_tok_shard_t *)1;
    dt_emsg_t em = { "" };
    int rc = dt_tok_shard_new(path, &s, &em);

    cr_assert_eq(rc, err, "rc %d (%s), want %d; message: %s", rc, dt_err_name(rc), err, em.s);
    cr_assert_null(s);
    cr_assert(strstr(em.s, want) != NULL, "message '%s' lacks '%s'", em.s, want);
    cr_assert(strstr(em.s, path) != NULL, "message '%s' does not name %s", em.s, path);
}

/*-- shards: round trips --------------------------------------------------------*/

Test(data, roundtrip_u16)
{
    enum { N = 70000 }; /* more than one read chunk */
    int32_t *tok = malloc(N * sizeof(*tok)), *back = malloc(N * sizeof(*back));
    const char *path = P("a.bin");
    dt_tok_shard_t *s;
    dt_emsg_t em = { "" };
    int32_t hdr[3];
    FILE *f;

    for (int i = 0; i < N; i++)
        tok[i] = (int32_t)((i * 7919u) % 65536u);
    tok[0] = 65535;
    cr_assert_eq(dt_tok_save(path, DT_TOK_U16, tok, N, &em), 0, "%s", em.s);
    cr_assert_eq(dir_entries(), 1, "temporary file left behind");
    cr_assert_eq(file_size(path), 1024 + 2 * N);
    f = fopen(path, "rb");
    cr_assert_eq(fread(hdr, sizeof(hdr[0]), 3, f), 3);
    fclose(f);
    cr_assert_eq(hdr[0], 20240520);
    cr_assert_eq(hdr[1], 1);
    cr_assert_eq(hdr[2], N);

    cr_assert_eq(dt_tok_shard_new(path, &s, &em), 0, "%s", em.s);
    cr_assert_eq(dt_tok_shard_ntok(s), N);
    cr_assert_eq(dt_tok_shard_format(s), DT_TOK_U16);
    cr_assert_str_eq(dt_tok_shard_path(s), path);
    cr_assert_eq(dt_tok_shard_read(s, 0, N, back, &em), 0, "%s", em.s);
    cr_assert_eq(memcmp(tok, back, N * sizeof(*tok)), 0);
    /* a window in the middle, and an empty one at the end */
    cr_assert_eq(dt_tok_shard_read(s, 12345, 100, back, &em), 0, "%s", em.s);
    cr_assert_eq(memcmp(tok + 12345, back, 100 * sizeof(*tok)), 0);
    cr_assert_eq(dt_tok_shard_read(s, N, 0, back, &em), 0);
    /* windows outside the shard */
    cr_assert_eq(dt_tok_shard_read(s, N - 5, 6, back, &em), DT_EINVAL);
    cr_assert(strstr(em.s, "tokens [69995, 70001) are outside [0, 70000)"), "%s", em.s);
    cr_assert_eq(dt_tok_shard_read(s, -1, 1, back, &em), DT_EINVAL);
    dt_tok_shard_free(s);
    dt_tok_shard_free(NULL);
    free(tok);
    free(back);
}

Test(data, roundtrip_u32)
{
    int32_t tok[] = { 0, 1, 65535, 65536, 128255, 128256, INT32_MAX };
    int32_t back[7];
    const char *path = P("llama.bin");
    dt_tok_shard_t *s;
    dt_emsg_t em = { "" };

    cr_assert_eq(dt_tok_save(path, DT_TOK_U32, tok, 7, &em), 0, "%s", em.s);
    cr_assert_eq(file_size(path), 1024 + 4 * 7);
    cr_assert_eq(dt_tok_shard_new(path, &s, &em), 0, "%s", em.s);
    cr_assert_eq(dt_tok_shard_format(s), DT_TOK_U32);
    cr_assert_eq(dt_tok_shard_ntok(s), 7);
    cr_assert_eq(dt_tok_shard_read(s, 0, 7, back, &em), 0, "%s", em.s);
    cr_assert_eq(memcmp(tok, back, sizeof(tok)), 0);
    dt_tok_shard_free(s);
}

Test(data, roundtrip_empty_and_overwrite)
{
    int32_t tok[] = { 5, 6, 7 };
    const char *path = P("e.bin");
    dt_tok_shard_t *s;
    dt_emsg_t em = { "" };

    cr_assert_eq(dt_tok_save(path, DT_TOK_U16, tok, 3, &em), 0, "%s", em.s);
    cr_assert_eq(dt_tok_save(path, DT_TOK_U16, tok, 0, &em), 0, "%s", em.s);
    cr_assert_eq(file_size(path), 1024);
    cr_assert_eq(dt_tok_shard_new(path, &s, &em), 0, "%s", em.s);
    cr_assert_eq(dt_tok_shard_ntok(s), 0);
    dt_tok_shard_free(s);
    cr_assert_eq(dir_entries(), 1);
}

Test(data, save_refuses_tokens_out_of_range)
{
    int32_t ok[] = { 1, 2, 3 }, big[] = { 1, 65536, 3 }, neg[] = { 1, 2, -1 };
    const char *path = P("x.bin");
    dt_emsg_t em = { "" };

    cr_assert_eq(dt_tok_save(path, DT_TOK_U16, ok, 3, &em), 0, "%s", em.s);
    cr_assert_eq(dt_tok_save(path, DT_TOK_U16, big, 3, &em), DT_EINVAL);
    cr_assert(strstr(em.s, "token 1 is 65536, outside 0..65535 of uint16 tokens"), "%s", em.s);
    cr_assert_eq(dt_tok_save(path, DT_TOK_U32, neg, 3, &em), DT_EINVAL);
    cr_assert(strstr(em.s, "token 2 is -1"), "%s", em.s);
    /* the old file is intact and nothing else was left */
    cr_assert_eq(file_size(path), 1024 + 6);
    cr_assert_eq(dir_entries(), 1);
    cr_assert_eq(dt_tok_save(P("nodir/y.bin"), DT_TOK_U16, ok, 3, &em), DT_ENOENT);
    cr_assert(strstr(em.s, "cannot create"), "%s", em.s);
}

/*-- shards: refusals -----------------------------------------------------------*/

Test(data, refuses_bad_magic)
{
    write_raw(P("m.bin"), 12345, 1, 0, 1024, 0);
    expect_refused(P("m.bin"), DT_EFORMAT,
                   "not a token shard: header[0] (magic) is 12345, expected 20240520 "
                   "(uint16 tokens) or 20240801 (uint32 tokens)");
    /* an .npy file, say */
    write_raw(P("n.bin"), 0x4d554e93, 1, 0, 1024, 10);
    expect_refused(P("n.bin"), DT_EFORMAT, "header[0] (magic)");
}

Test(data, refuses_bad_version)
{
    write_raw(P("v.bin"), 20240520, 7, 0, 1024, 0);
    expect_refused(P("v.bin"), DT_EFORMAT,
                   "header[1] (version) is 7, magic 20240520 needs version 1");
    write_raw(P("w.bin"), 20240801, 1, 0, 1024, 0);
    expect_refused(P("w.bin"), DT_EFORMAT,
                   "header[1] (version) is 1, magic 20240801 needs version 7");
}

Test(data, refuses_truncated_header)
{
    write_raw(P("h.bin"), 20240520, 1, 0, 100, 0);
    expect_refused(P("h.bin"), DT_EFORMAT,
                   "header is truncated: the file has 100 bytes, a token shard header has 1024");
    write_raw(P("z.bin"), 0, 0, 0, 0, 0);
    expect_refused(P("z.bin"), DT_EFORMAT, "the file has 0 bytes");
}

Test(data, refuses_count_larger_than_file)
{
    write_raw(P("c.bin"), 20240520, 1, 100, 1024, 50 * 2);
    expect_refused(P("c.bin"), DT_EFORMAT,
                   "header[2] (token count) is 100: 200 bytes of uint16 tokens, but the file "
                   "has 100 after the header (truncated?)");
    write_raw(P("d.bin"), 20240801, 7, 10, 1024, 39);
    expect_refused(P("d.bin"), DT_EFORMAT, "40 bytes of uint32 tokens, but the file has 39");
}

Test(data, refuses_count_not_matching_size)
{
    write_raw(P("t.bin"), 20240520, 1, 10, 1024, 21);
    expect_refused(P("t.bin"), DT_EFORMAT,
                   "header[2] (token count) is 10: 20 bytes of uint16 tokens, but the file has "
                   "21 after the header (1 bytes of trailing data)");
    /* a uint32 count on a file written with uint16 tokens */
    write_raw(P("u.bin"), 20240801, 7, 10, 1024, 40 * 2);
    expect_refused(P("u.bin"), DT_EFORMAT, "40 bytes of trailing data");
    write_raw(P("neg.bin"), 20240520, 1, -3, 1024, 0);
    expect_refused(P("neg.bin"), DT_EFORMAT, "header[2] (token count) is negative: -3");
}

Test(data, refuses_missing_and_directory)
{
    expect_refused(P("nope.bin"), DT_ENOENT, "cannot open");
    expect_refused(tmpdir, DT_EINVAL, "is a directory");
}

Test(data, refuses_u32_token_beyond_int32)
{
    uint32_t payload[3] = { 7, 0x80000000u, 9 };
    int32_t back[3];
    dt_tok_shard_t *s;
    dt_emsg_t em = { "" };
    FILE *f;

    write_raw(P("big.bin"), 20240801, 7, 3, 1024, 0);
    f = fopen(P("big.bin"), "ab");
    cr_assert_eq(fwrite(payload, 4, 3, f), 3);
    fclose(f);
    cr_assert_eq(dt_tok_shard_new(P("big.bin"), &s, &em), 0, "%s", em.s);
    cr_assert_eq(dt_tok_shard_read(s, 0, 1, back, &em), 0);
    cr_assert_eq(back[0], 7);
    cr_assert_eq(dt_tok_shard_read(s, 0, 3, back, &em), DT_EFORMAT);
    cr_assert(strstr(em.s, "token 1 is 2147483648, larger than the int32 range"), "%s", em.s);
    dt_tok_shard_free(s);
}

/*-- .npy token ids ---------------------------------------------------------------*/

/* A .npy file written by hand: header dict `dict` (padded so the data is
 * 64-byte aligned, hpad extra spaces first), then nbytes of data. */
static void write_npy_raw(const char *path, const char *dict, size_t hpad, const void *data,
                          size_t nbytes)
{
    size_t dlen = strlen(dict), total = (10 + dlen + hpad + 1 + 63) / 64 * 64;
    size_t hlen = total - 10;
    unsigned char pre[10] = { 0x93, 'N', 'U', 'M', 'P', 'Y', 1, 0 };
    FILE *f = fopen(path, "wb");

    cr_assert(hlen <= 65535);
    pre[8] = (unsigned char)(hlen & 0xff);
    pre[9] = (unsigned char)(hlen >> 8);
    cr_assert_not_null(f);
    cr_assert_eq(fwrite(pre, 1, 10, f), 10);
    cr_assert_eq(fwrite(dict, 1, dlen, f), dlen);
    for (size_t i = dlen; i < hlen - 1; i++)
        fputc(' ', f);
    fputc('\n', f);
    if (nbytes)
        cr_assert_eq(fwrite(data, 1, nbytes, f), nbytes);
    cr_assert_eq(fclose(f), 0);
}

/* Read all tokens of PATH; they must be want[0..n). */
static void expect_tokens(const char *path, enum dt_tok_format fmt, const int32_t *want,
                          int64_t n)
{
    int32_t *back = malloc((size_t)(n ? n : 1) * sizeof(*back));
    dt_tok_shard_t *s;
    dt_emsg_t em = { "" };

    cr_assert_eq(dt_tok_shard_new(path, &s, &em), 0, "%s", em.s);
    cr_assert_eq(dt_tok_shard_format(s), fmt, "format %s", dt_tok_format_name(fmt));
    cr_assert_eq(dt_tok_shard_ntok(s), n);
    cr_assert_eq(dt_tok_shard_read(s, 0, n, back, &em), 0, "%s", em.s);
    for (int64_t i = 0; i < n; i++)
        cr_assert_eq(back[i], want[i], "%s: token %lld is %d, want %d", path, (long long)i,
                     back[i], want[i]);
    dt_tok_shard_free(s);
    free(back);
}

Test(data, npy_roundtrip_int32_and_int64)
{
    enum { N = 150000 }; /* more than two read chunks */
    int32_t *tok = malloc(N * sizeof(*tok)), back[100];
    const enum dt_tok_format fmts[] = { DT_TOK_NPY_I32, DT_TOK_NPY_I64 };
    const char *names[] = { "t32.npy", "t64.npy" };
    dt_emsg_t em = { "" };

    for (int i = 0; i < N; i++)
        tok[i] = (int32_t)((i * 2654435761u) % 200000u); /* ids above 65535 too */
    tok[0] = INT32_MAX;
    tok[N - 1] = 0;
    for (int k = 0; k < 2; k++) {
        const char *path = P(names[k]);
        dt_tok_shard_t *s;
        unsigned char magic[6];
        FILE *f;

        cr_assert_eq(dt_tok_save(path, fmts[k], tok, N, &em), 0, "%s", em.s);
        f = fopen(path, "rb");
        cr_assert_eq(fread(magic, 1, 6, f), 6);
        fclose(f);
        cr_assert_eq(memcmp(magic, "\x93NUMPY", 6), 0);
        cr_assert_eq(file_size(path), 128 + (k ? 8 : 4) * (int64_t)N);
        expect_tokens(path, fmts[k], tok, N);
        /* a window across a chunk boundary, one at the end, one outside */
        cr_assert_eq(dt_tok_shard_new(path, &s, &em), 0, "%s", em.s);
        cr_assert_eq(dt_tok_shard_read(s, 65500, 100, back, &em), 0, "%s", em.s);
        cr_assert_eq(memcmp(tok + 65500, back, sizeof(back)), 0);
        cr_assert_eq(dt_tok_shard_read(s, N, 0, back, &em), 0);
        cr_assert_eq(dt_tok_shard_read(s, N - 5, 6, back, &em), DT_EINVAL);
        cr_assert(strstr(em.s, "tokens [149995, 150001) are outside [0, 150000)"), "%s", em.s);
        dt_tok_shard_free(s);
    }
    cr_assert_eq(dir_entries(), 2, "temporary file left behind");
    free(tok);
}

/* The kind is told by the magic, not the name; NumPy's own layouts (a
 * format 2.0 header, one longer than the first read) parse as well. */
Test(data, npy_recognised_by_magic_not_name)
{
    int32_t tok[] = { 3, 1, 4, 1, 5, 9, 2, 6 };
    int64_t t64[] = { 3, 1, 4, 1, 5, 9, 2, 6 };
    dt_emsg_t em = { "" };

    cr_assert_eq(dt_tok_save(P("tokens.bin"), DT_TOK_NPY_I32, tok, 8, &em), 0, "%s", em.s);
    expect_tokens(P("tokens.bin"), DT_TOK_NPY_I32, tok, 8);
    cr_assert_eq(dt_tok_save(P("tokens.npy"), DT_TOK_U16, tok, 8, &em), 0, "%s", em.s);
    expect_tokens(P("tokens.npy"), DT_TOK_U16, tok, 8);
    /* a header of 3008 bytes: more than the 1024 read first */
    write_npy_raw(P("long.npy"), "{'descr': '<i8', 'fortran_order': False, 'shape': (8,), }",
                  2900, t64, sizeof(t64));
    expect_tokens(P("long.npy"), DT_TOK_NPY_I64, tok, 8);
}

Test(data, npy_2d_is_read_in_c_order)
{
    int32_t tok[12];
    int64_t shape[2] = { 3, 4 };
    dt_emsg_t em = { "" };

    for (int i = 0; i < 12; i++)
        tok[i] = 100 + i;
    cr_assert_eq(dt_npy_save(P("m.npy"), DT_I32, 2, shape, tok, &em), 0, "%s", em.s);
    expect_tokens(P("m.npy"), DT_TOK_NPY_I32, tok, 12);
}

/* Bad ids are found when read, naming the file and the token's flat index. */
Test(data, npy_refuses_bad_ids_when_read)
{
    int32_t neg32[] = { 1, 2, -7, 4 };
    int64_t neg64[] = { 1, 2, 3, -1 }, big64[] = { 1, 2147483648LL, 3, 4 };
    int64_t huge64[] = { 0, 0, 0, INT64_MIN };
    int64_t shape[1] = { 4 };
    int32_t back[4];
    dt_tok_shard_t *s;
    dt_emsg_t em = { "" };
    const struct {
        const char *name;
        dt_dtype_t dtype;
        const void *data;
        const char *want;
    } cases[] = {
        { "n32.npy", DT_I32, neg32, "n32.npy: token 2 is -7, a negative token id" },
        { "n64.npy", DT_I64, neg64, "n64.npy: token 3 is -1, a negative token id" },
        { "b64.npy", DT_I64, big64, "b64.npy: token 1 is 2147483648, larger than the int32 range" },
        { "h64.npy", DT_I64, huge64, "token 3 is -9223372036854775808, a negative token id" },
    };

    for (size_t k = 0; k < sizeof(cases) / sizeof(cases[0]); k++) {
        cr_assert_eq(dt_npy_save(P(cases[k].name), cases[k].dtype, 1, shape, cases[k].data, &em),
                     0, "%s", em.s);
        cr_assert_eq(dt_tok_shard_new(P(cases[k].name), &s, &em), 0, "%s", em.s);
        cr_assert_eq(dt_tok_shard_read(s, 0, 1, back, &em), 0, "%s", em.s);
        cr_assert_eq(back[0], k == 3 ? 0 : 1);
        cr_assert_eq(dt_tok_shard_read(s, 0, 4, back, &em), DT_EFORMAT, "%s", cases[k].name);
        cr_assert(strstr(em.s, cases[k].want), "'%s' lacks '%s'", em.s, cases[k].want);
        cr_assert(strstr(em.s, tmpdir), "'%s' does not name the file", em.s);
        dt_tok_shard_free(s);
    }
}

Test(data, npy_refusals)
{
    static const unsigned char data[64];
    const struct {
        const char *dict;
        size_t nbytes;
        int err;
        const char *want;
    } cases[] = {
        { "{'descr': '<f4', 'fortran_order': False, 'shape': (4,), }", 16, DT_EDTYPE,
          "dtype is float32; token ids need int32 ('<i4') or int64 ('<i8')" },
        { "{'descr': '<f2', 'fortran_order': False, 'shape': (4,), }", 8, DT_EDTYPE,
          "dtype is float16; token ids need int32" },
        { "{'descr': '<f8', 'fortran_order': False, 'shape': (4,), }", 32, DT_EDTYPE,
          "dtype is float64; token ids need int32" },
        { "{'descr': '|b1', 'fortran_order': False, 'shape': (4,), }", 4, DT_EDTYPE,
          "dtype is bool; token ids need int32" },
        { "{'descr': '<u2', 'fortran_order': False, 'shape': (4,), }", 8, DT_EDTYPE,
          "dtype '<u2' is not supported" },
        { "{'descr': '>i4', 'fortran_order': False, 'shape': (4,), }", 16, DT_EDTYPE,
          "'>i4' is big-endian" },
        { "{'descr': '>i8', 'fortran_order': False, 'shape': (4,), }", 32, DT_EDTYPE,
          "'>i8' is big-endian" },
        { "{'descr': '<i4', 'fortran_order': True, 'shape': (2, 2), }", 16, DT_EDTYPE,
          "Fortran order is not supported" },
        { "{'descr': '<i8', 'fortran_order': False, 'shape': (), }", 8, DT_EFORMAT,
          "0 dimensions; token ids are 1-D (n,) or 2-D (n, m)" },
        { "{'descr': '<i4', 'fortran_order': False, 'shape': (2, 2, 2), }", 32, DT_EFORMAT,
          "3 dimensions; token ids are 1-D (n,) or 2-D (n, m)" },
        { "{'descr': '<i4', 'fortran_order': False, 'shape': (10,), }", 36, DT_EFORMAT,
          "data is truncated: shape (10,) int32 needs 40 bytes" },
        { "{'descr': '<i8', 'fortran_order': False, 'shape': (4,), }", 33, DT_EFORMAT,
          "1 bytes after the data" },
        { "{'descr': '<i8', 'fortran_order': False, 'shape': (4), }", 32, DT_EFORMAT,
          "malformed header: 'shape' (4) is not a tuple" },
    };
    char name[32];

    for (size_t k = 0; k < sizeof(cases) / sizeof(cases[0]); k++) {
        snprintf(name, sizeof(name), "bad%zu.npy", k);
        write_npy_raw(P(name), cases[k].dict, 0, data, cases[k].nbytes);
        expect_refused(P(name), cases[k].err, cases[k].want);
    }
    /* the dtype messages say what token ids need */
    expect_refused(P("bad4.npy"), DT_EDTYPE, "; token ids need int32 or int64, C order");
    expect_refused(P("bad7.npy"), DT_EDTYPE, "; token ids need int32 or int64, C order");
    /* a truncated header: the magic alone, and a length past the end */
    {
        FILE *f = fopen(P("magic.npy"), "wb");
        cr_assert_eq(fwrite("\x93NUMPY\x01\x00\x76\x00{'descr'", 1, 17, f), 17);
        fclose(f);
    }
    expect_refused(P("magic.npy"), DT_EFORMAT, "header is truncated");
    {
        FILE *f = fopen(P("six.npy"), "wb");
        cr_assert_eq(fwrite("\x93NUMPY", 1, 6, f), 6);
        fclose(f);
    }
    expect_refused(P("six.npy"), DT_EFORMAT, "header is truncated");
}

/* The pure header check the fuzzer drives: what it says of a .npy image. */
Test(data, npy_parse_header_pure)
{
    int32_t tok[] = { 7, 8, 9 };
    dt_tok_info_t info;
    dt_emsg_t em = { "" };
    unsigned char img[128 + 12];
    FILE *f;

    cr_assert_eq(dt_tok_save(P("p.npy"), DT_TOK_NPY_I32, tok, 3, &em), 0, "%s", em.s);
    f = fopen(P("p.npy"), "rb");
    cr_assert_eq(fread(img, 1, sizeof(img), f), sizeof(img));
    fclose(f);
    cr_assert_eq(dt_tok_parse_header("mem", img, sizeof(img), sizeof(img), &info, &em), 0,
                 "%s", em.s);
    cr_assert_eq(info.fmt, DT_TOK_NPY_I32);
    cr_assert_eq(info.ntok, 3);
    cr_assert_eq(info.data_offset, 128);
    /* the header alone, the file size given */
    cr_assert_eq(dt_tok_parse_header("mem", img, 128, sizeof(img), &info, &em), 0, "%s", em.s);
    cr_assert_eq(dt_tok_parse_header("mem", img, 128, sizeof(img) + 4, &info, &em), DT_EFORMAT);
    cr_assert(strstr(em.s, "mem: 4 bytes after the data"), "%s", em.s);
    cr_assert_eq(info.ntok, 0);
    /* a header cut short in memory */
    cr_assert_eq(dt_tok_parse_header("mem", img, 100, sizeof(img), &info, &em), DT_EFORMAT);
    cr_assert(strstr(em.s, "mem: header is truncated"), "%s", em.s);
}

/*-- loader ---------------------------------------------------------------------*/

/* Shard i holds n tokens whose value is 1000 * i + position. */
static void make_ramp(const char *name, int i, int n)
{
    int32_t *t = malloc((size_t)n * sizeof(*t));
    dt_emsg_t em = { "" };

    for (int k = 0; k < n; k++)
        t[k] = 1000 * i + k;
    cr_assert_eq(dt_tok_save(P(name), DT_TOK_U16, t, n, &em), 0, "%s", em.s);
    free(t);
}

/* Three shards: 33 tokens (4 sequences of T = 8), 20 (2), 41 (5). */
static void make_three(void)
{
    make_ramp("s0.bin", 0, 33);
    make_ramp("s1.bin", 1, 20);
    make_ramp("s2.bin", 2, 41);
}

static dt_loader_t *loader3(int64_t T, int shuffle, uint64_t seed)
{
    /* given out of order: the loader sorts */
    const char *paths[] = { P("s2.bin"), P("s0.bin"), P("s1.bin") };
    dt_loader_opts_t o = { .T = T, .shuffle = shuffle, .seed = seed };
    dt_loader_t *l;
    dt_emsg_t em = { "" };

    cr_assert_eq(dt_loader_new(paths, 3, &o, &l, &em), 0, "%s", em.s);
    return l;
}

Test(data, loader_windows_in_order)
{
    /* shard, start token of each sequence, for two epochs */
    static const int want[][2] = { { 0, 0 }, { 0, 8 }, { 0, 16 }, { 0, 24 }, { 1, 0 }, { 1, 8 },
                                   { 2, 0 }, { 2, 8 }, { 2, 16 }, { 2, 24 }, { 2, 32 } };
    int32_t x[8], y[8];
    dt_loader_t *l;
    dt_loader_cursor_t c;
    dt_emsg_t em = { "" };

    make_three();
    l = loader3(8, 0, 0);
    cr_assert_eq(dt_loader_nshards(l), 3);
    cr_assert_eq(dt_loader_ntok(l), 33 + 20 + 41);
    cr_assert_eq(dt_loader_nseq(l), 11);
    for (int e = 0; e < 2; e++)
        for (int s = 0; s < 11; s++) {
            int base = 1000 * want[s][0] + want[s][1];
            dt_loader_get_cursor(l, &c);
            cr_assert_eq(c.epoch, (uint64_t)e);
            cr_assert_eq(dt_loader_next(l, x, y, &em), 0, "%s", em.s);
            for (int k = 0; k < 8; k++) {
                cr_assert_eq(x[k], base + k, "epoch %d seq %d x[%d] = %d", e, s, k, x[k]);
                cr_assert_eq(y[k], base + k + 1, "epoch %d seq %d y[%d] = %d", e, s, k, y[k]);
            }
        }
    dt_loader_get_cursor(l, &c);
    cr_assert_eq(c.epoch, 2);
    cr_assert_eq(c.shard, 0);
    cr_assert_eq(c.seq, 0);
    dt_loader_free(l);
    dt_loader_free(NULL);
}

/* Start token (1000 * file + position) of the next sequence, via x[0]. */
static int next_start(dt_loader_t *l, int32_t *x, int32_t *y)
{
    dt_emsg_t em = { "" };

    cr_assert_eq(dt_loader_next(l, x, y, &em), 0, "%s", em.s);
    return x[0];
}

Test(data, loader_cursor_restore)
{
    for (int shuffle = 0; shuffle < 2; shuffle++) {
        int32_t xa[8], ya[8], xb[8], yb[8];
        dt_loader_t *a, *b;
        dt_loader_cursor_t c, saved;
        dt_emsg_t em = { "" };

        make_three();
        a = loader3(8, shuffle, 42);
        for (int i = 0; i < 15; i++) /* into the second epoch */
            next_start(a, xa, ya);
        dt_loader_get_cursor(a, &saved);
        /* the cursor is a plain value: through bytes, as a checkpoint would */
        {
            unsigned char bytes[sizeof(saved)];
            memcpy(bytes, &saved, sizeof(saved));
            memcpy(&c, bytes, sizeof(c));
        }
        b = loader3(8, shuffle, 42);
        cr_assert_eq(dt_loader_set_cursor(b, &c, &em), 0, "%s", em.s);
        for (int i = 0; i < 30; i++) {
            next_start(a, xa, ya);
            next_start(b, xb, yb);
            cr_assert_eq(memcmp(xa, xb, sizeof(xa)), 0, "shuffle %d batch %d: x differs", shuffle,
                         i);
            cr_assert_eq(memcmp(ya, yb, sizeof(ya)), 0, "shuffle %d batch %d: y differs", shuffle,
                         i);
        }
        /* and back again on the same loader */
        cr_assert_eq(dt_loader_set_cursor(a, &saved, &em), 0, "%s", em.s);
        cr_assert_eq(dt_loader_set_cursor(b, &saved, &em), 0, "%s", em.s);
        for (int i = 0; i < 5; i++)
            cr_assert_eq(next_start(a, xa, ya), next_start(b, xb, yb));
        dt_loader_free(a);
        dt_loader_free(b);
    }
}

Test(data, loader_shuffle_reproducible)
{
    int32_t x[8], y[8];
    int e1[11], e1b[11], e2[11], other[11];
    dt_loader_t *a, *b, *c;
    int same_as_order = 1, same_epochs = 1, same_seed = 1;
    static const int inorder[11] = { 0, 8, 16, 24, 1000, 1008, 2000, 2008, 2016, 2024, 2032 };

    make_three();
    a = loader3(8, 1, 7);
    b = loader3(8, 1, 7);
    c = loader3(8, 1, 8);
    for (int i = 0; i < 11; i++) {
        e1[i] = next_start(a, x, y);
        e1b[i] = next_start(b, x, y);
        other[i] = next_start(c, x, y);
    }
    for (int i = 0; i < 11; i++)
        e2[i] = next_start(a, x, y);
    cr_assert_eq(memcmp(e1, e1b, sizeof(e1)), 0, "same seed, different order");
    for (int i = 0; i < 11; i++) {
        same_as_order &= e1[i] == inorder[i];
        same_epochs &= e1[i] == e2[i];
        same_seed &= e1[i] == other[i];
    }
    cr_assert(!same_as_order, "shuffle kept file order");
    cr_assert(!same_epochs, "two epochs in the same order");
    cr_assert(!same_seed, "seeds 7 and 8 give the same order");
    /* each epoch is a permutation of all 11 sequences */
    for (int i = 0; i < 11; i++) {
        int n1 = 0, n2 = 0;
        for (int j = 0; j < 11; j++) {
            n1 += e1[j] == inorder[i];
            n2 += e2[j] == inorder[i];
        }
        cr_assert(n1 == 1 && n2 == 1, "sequence %d appears %d and %d times", inorder[i], n1, n2);
    }
    dt_loader_free(a);
    dt_loader_free(b);
    dt_loader_free(c);
}

Test(data, loader_data_parallel_splits_the_order)
{
    const char *paths[] = { P("s0.bin"), P("s1.bin"), P("s2.bin") };
    int32_t x[8], y[8];
    int all[22];
    dt_loader_t *one, *r[2];
    dt_emsg_t em = { "" };

    make_three();
    one = loader3(8, 1, 3);
    for (int i = 0; i < 22; i++)
        all[i] = next_start(one, x, y);
    for (int k = 0; k < 2; k++) {
        dt_loader_opts_t o = { .T = 8, .shuffle = 1, .seed = 3, .dp_rank = k, .dp_size = 2 };
        cr_assert_eq(dt_loader_new(paths, 3, &o, &r[k], &em), 0, "%s", em.s);
    }
    for (int i = 0; i < 11; i++) {
        dt_loader_cursor_t c0, c1;
        cr_assert_eq(next_start(r[0], x, y), all[2 * i]);
        cr_assert_eq(next_start(r[1], x, y), all[2 * i + 1]);
        dt_loader_get_cursor(r[0], &c0);
        dt_loader_get_cursor(r[1], &c1);
        cr_assert(memcmp(&c0, &c1, sizeof(c0)) == 0, "replicas' cursors differ");
    }
    dt_loader_free(one);
    dt_loader_free(r[0]);
    dt_loader_free(r[1]);
}

Test(data, loader_glob)
{
    dt_loader_opts_t o = { .T = 8 };
    dt_loader_t *l;
    dt_emsg_t em = { "" };
    int32_t x[8], y[8];

    make_three();
    make_ramp("other.dat", 9, 100);
    cr_assert_eq(dt_loader_new_glob(P("s*.bin"), &o, &l, &em), 0, "%s", em.s);
    cr_assert_eq(dt_loader_nshards(l), 3);
    cr_assert_eq(dt_loader_nseq(l), 11);
    cr_assert_eq(next_start(l, x, y), 0);
    dt_loader_free(l);
    cr_assert_eq(dt_loader_new_glob(P("train_*.bin"), &o, &l, &em), DT_ENOENT);
    cr_assert_null(l);
    cr_assert(strstr(em.s, "train_*.bin: no shard matches"), "%s", em.s);
}

/* A pattern in a directory that is not there is the user's mistake, named
 * as such (DT_ENOENT: exit 2), not an unexplained "read error" (DT_EIO). */
Test(data, loader_glob_missing_directory)
{
    dt_loader_opts_t o = { .T = 8 };
    dt_loader_t *l;
    dt_emsg_t em = { "" };
    char want[512];

    cr_assert_eq(dt_loader_new_glob(P("nodir/s*.bin"), &o, &l, &em), DT_ENOENT, "%s", em.s);
    cr_assert_null(l);
    snprintf(want, sizeof(want), "nodir/s*.bin: cannot read directory %s: No such file or "
             "directory", P("nodir"));
    cr_assert(strstr(em.s, want), "%s", em.s);
    make_three();
    cr_assert_eq(dt_loader_new_glob(P("s0.bin/*.bin"), &o, &l, &em), DT_ENOENT, "%s", em.s);
}

Test(data, loader_refusals)
{
    const char *paths[] = { P("s0.bin"), P("s1.bin"), P("s2.bin") };
    const char *twice[] = { P("s0.bin"), P("s0.bin") };
    const char *bad[] = { P("s0.bin"), P("bad.bin") };
    dt_loader_opts_t o = { .T = 8 };
    dt_loader_t *l;
    dt_loader_cursor_t c = { 0, 1, 2 };
    dt_emsg_t em = { "" };
    int32_t x[8], y[8];

    make_three();
    write_raw(P("bad.bin"), 20240520, 2, 0, 1024, 0);
    /* a shard shorter than T + 1 tokens */
    o.T = 20;
    cr_assert_eq(dt_loader_new(paths, 3, &o, &l, &em), DT_EINVAL);
    cr_assert_null(l);
    cr_assert(strstr(em.s, "s1.bin: 20 tokens, fewer than one sequence of T + 1 = 21"), "%s", em.s);
    o.T = 8;
    cr_assert_eq(dt_loader_new(twice, 2, &o, &l, &em), DT_EINVAL);
    cr_assert(strstr(em.s, "s0.bin: shard given twice"), "%s", em.s);
    cr_assert_eq(dt_loader_new(bad, 2, &o, &l, &em), DT_EFORMAT);
    cr_assert(strstr(em.s, "bad.bin: header[1] (version) is 2"), "%s", em.s);
    cr_assert_eq(dt_loader_new(paths, 0, &o, &l, &em), DT_EINVAL);
    o.T = 0;
    cr_assert_eq(dt_loader_new(paths, 3, &o, &l, &em), DT_EINVAL);
    o.T = 8;
    o.dp_rank = 2;
    o.dp_size = 2;
    cr_assert_eq(dt_loader_new(paths, 3, &o, &l, &em), DT_EINVAL);
    cr_assert(strstr(em.s, "dp_rank 2 is not in [0, dp_size 2)"), "%s", em.s);

    /* cursor out of range: refused, the loader unchanged */
    o.dp_rank = 0;
    o.dp_size = 1;
    cr_assert_eq(dt_loader_new(paths, 3, &o, &l, &em), 0, "%s", em.s);
    cr_assert_eq(dt_loader_set_cursor(l, &c, &em), DT_EINVAL); /* s1 has 2 sequences */
    cr_assert(strstr(em.s, "sequence 2 is not in [0, 2) of"), "%s", em.s);
    c.shard = 3;
    cr_assert_eq(dt_loader_set_cursor(l, &c, &em), DT_EINVAL);
    cr_assert(strstr(em.s, "shard 3 is not in [0, 3) shards"), "%s", em.s);
    cr_assert_eq(next_start(l, x, y), 0);
    dt_loader_free(l);

    /* tokens outside the model's vocabulary: refused, the cursor stays */
    o.vocab = 1005;
    cr_assert_eq(dt_loader_new(paths, 3, &o, &l, &em), 0, "%s", em.s);
    for (int i = 0; i < 4; i++)
        next_start(l, x, y);
    cr_assert_eq(dt_loader_next(l, x, y, &em), DT_EFORMAT);
    cr_assert(strstr(em.s, "s1.bin: token 5 is 1005, outside the vocabulary of 1005"), "%s", em.s);
    dt_loader_get_cursor(l, &c);
    cr_assert(c.epoch == 0 && c.shard == 1 && c.seq == 0);
    dt_loader_free(l);
}

Test(data, loader_notices_a_changed_shard)
{
    const char *paths[] = { P("s0.bin"), P("s1.bin") };
    dt_loader_opts_t o = { .T = 8 };
    dt_loader_t *l;
    dt_emsg_t em = { "" };
    int32_t x[8], y[8];

    make_three();
    cr_assert_eq(dt_loader_new(paths, 2, &o, &l, &em), 0, "%s", em.s);
    make_ramp("s1.bin", 1, 30);
    for (int i = 0; i < 4; i++)
        next_start(l, x, y);
    cr_assert_eq(dt_loader_next(l, x, y, &em), DT_EFORMAT);
    cr_assert(strstr(em.s, "s1.bin: has 30 tokens now but had 20"), "%s", em.s);
    dt_loader_free(l);
}

/* The same tokens as an llm.c shard and as .npy int32 and int64 give the
 * same sequences, shuffled, over two epochs; a glob may mix the kinds. */
Test(data, loader_npy_matches_shard)
{
    enum { N = 1000, T = 16 };
    const enum dt_tok_format fmts[] = { DT_TOK_U16, DT_TOK_NPY_I32, DT_TOK_NPY_I64 };
    const char *dirs[] = { "bin", "i32", "i64", "mix" };
    int32_t tok[2][N], x[4][T], y[4][T];
    dt_loader_opts_t o = { .T = T, .shuffle = 1, .seed = 42, .vocab = 50257 };
    dt_loader_t *l[4];
    dt_emsg_t em = { "" };
    char name[64];

    for (int f = 0; f < 2; f++)
        for (int i = 0; i < N; i++)
            tok[f][i] = (int32_t)((i * 7919u + (unsigned)f * 31u) % 50257u);
    for (int d = 0; d < 4; d++) {
        cr_assert_eq(mkdir(P(dirs[d]), 0700), 0);
        for (int f = 0; f < 2; f++) {
            /* "mix": a.bin (uint16) and b.npy (int64): the same sorted order */
            enum dt_tok_format fmt = d < 3 ? fmts[d] : f == 0 ? DT_TOK_U16 : DT_TOK_NPY_I64;
            snprintf(name, sizeof(name), "%s/%c.%s", dirs[d], 'a' + f,
                     fmt == DT_TOK_U16 ? "bin" : "npy");
            cr_assert_eq(dt_tok_save(P(name), fmt, tok[f], N, &em), 0, "%s", em.s);
        }
        snprintf(name, sizeof(name), "%s/*", dirs[d]);
        cr_assert_eq(dt_loader_new_glob(P(name), &o, &l[d], &em), 0, "%s", em.s);
        cr_assert_eq(dt_loader_nshards(l[d]), 2);
        cr_assert_eq(dt_loader_ntok(l[d]), 2 * N);
        cr_assert_eq(dt_loader_nseq(l[d]), 2 * ((N - 1) / T));
    }
    for (int64_t step = 0; step < 2 * dt_loader_nseq(l[0]) + 3; step++) {
        for (int d = 0; d < 4; d++)
            cr_assert_eq(dt_loader_next(l[d], x[d], y[d], &em), 0, "%s", em.s);
        for (int d = 1; d < 4; d++) {
            cr_assert_eq(memcmp(x[0], x[d], sizeof(x[0])), 0, "%s: step %lld", dirs[d],
                         (long long)step);
            cr_assert_eq(memcmp(y[0], y[d], sizeof(y[0])), 0, "%s: step %lld", dirs[d],
                         (long long)step);
        }
    }
    for (int d = 0; d < 4; d++)
        dt_loader_free(l[d]);
}

/* The loader's vocabulary check covers .npy ids above 65535. */
Test(data, loader_npy_vocab)
{
    int32_t tok[40];
    dt_loader_opts_t o = { .T = 8, .vocab = 100000 };
    const char *paths[] = { P("v.npy") };
    dt_loader_t *l;
    dt_emsg_t em = { "" };
    int32_t x[8], y[8];

    for (int i = 0; i < 40; i++)
        tok[i] = 99990 + i % 10;
    tok[20] = 100000;
    cr_assert_eq(dt_tok_save(P("v.npy"), DT_TOK_NPY_I64, tok, 40, &em), 0, "%s", em.s);
    cr_assert_eq(dt_loader_new(paths, 1, &o, &l, &em), 0, "%s", em.s);
    cr_assert_eq(dt_loader_next(l, x, y, &em), 0, "%s", em.s);
    cr_assert_eq(x[1], 99991);
    cr_assert_eq(dt_loader_next(l, x, y, &em), 0, "%s", em.s); /* tokens 8..16 */
    cr_assert_eq(dt_loader_next(l, x, y, &em), DT_EFORMAT);
    cr_assert(strstr(em.s, "v.npy: token 20 is 100000, outside the vocabulary of 100000"), "%s",
              em.s);
    dt_loader_free(l);
}

/*-- generated recall -----------------------------------------------------------*/

Test(data, recall_defaults_fit_the_tiny_model)
{
    dt_recall_opts_t o;

    dt_recall_opts_default(&o);
    cr_assert_eq(dt_recall_vocab(&o), 512);
    cr_assert_eq(o.T, 1024);
    cr_assert_eq(dt_recall_check(&o, NULL), 0);
    cr_assert_eq(dt_recall_answer_pos(&o, o.n_queries - 1), o.T - 1);
}

Test(data, recall_deterministic)
{
    dt_recall_opts_t o;
    int32_t a[1025], b[1025], c[1025];
    dt_emsg_t em = { "" };

    dt_recall_opts_default(&o);
    cr_assert_eq(dt_recall_make(&o, 17, a, &em), 0, "%s", em.s);
    cr_assert_eq(dt_recall_make(&o, 17, b, &em), 0, "%s", em.s);
    cr_assert_eq(memcmp(a, b, sizeof(a)), 0);
    cr_assert_eq(dt_recall_make(&o, 18, c, &em), 0, "%s", em.s);
    cr_assert_neq(memcmp(a, c, sizeof(a)), 0, "sequences 17 and 18 are equal");
    o.seed = 2;
    cr_assert_eq(dt_recall_make(&o, 17, c, &em), 0, "%s", em.s);
    cr_assert_neq(memcmp(a, c, sizeof(a)), 0, "seeds 1 and 2 give the same sequence");
}

Test(data, recall_answers_match_the_planted_pairs)
{
    dt_recall_opts_t o;
    int32_t tok[1025];
    dt_emsg_t em = { "" };

    dt_recall_opts_default(&o);
    for (uint64_t s = 0; s < 50; s++) {
        const int K = o.n_keys, V = o.n_values, Pn = o.n_pairs, Q = o.n_queries;
        const int64_t L = o.T + 1, plant = 1 + 3 * Pn, qs = L - 4 * Q;
        const int64_t p0 = dt_recall_pairs_start(&o);
        int val_of[128];

        cr_assert_eq(dt_recall_make(&o, s, tok, &em), 0, "%s", em.s);
        cr_assert_eq(tok[0], DT_RECALL_BOS);
        cr_assert(10 * plant <= L, "pairs take %ld tokens, past 10%% of %ld", (long)plant,
                  (long)L);
        cr_assert(p0 == 4 * L / 10 && p0 + 3 * Pn <= L / 2, "pairs at %ld..%ld", (long)p0,
                  (long)(p0 + 3 * Pn));
        for (int k = 0; k < K; k++)
            val_of[k] = -1;
        for (int p = 0; p < Pn; p++) {
            int k = tok[p0 + 3 * p] - 4, v = tok[p0 + 1 + 3 * p] - 4 - K;
            cr_assert(k >= 0 && k < K, "seq %lu pair %d: key token %d", (unsigned long)s, p,
                      tok[p0 + 3 * p]);
            cr_assert(v >= 0 && v < V, "seq %lu pair %d: value token %d", (unsigned long)s, p,
                      tok[p0 + 1 + 3 * p]);
            cr_assert_eq(tok[p0 + 2 + 3 * p], DT_RECALL_SEP);
            cr_assert_eq(val_of[k], -1, "key %d planted twice", k);
            val_of[k] = v;
        }
        for (int64_t i = 1; i < qs; i++)
            if (i < p0 || i >= p0 + 3 * Pn)
                cr_assert(tok[i] >= 4 + K + V && tok[i] < 512, "filler at %ld is %d", (long)i,
                          tok[i]);
        for (int q = 0; q < Q; q++) {
            const int32_t *t = tok + qs + 4 * q;
            cr_assert_eq(t[0], DT_RECALL_QUERY);
            cr_assert_eq(t[2], DT_RECALL_ANSWER);
            cr_assert_geq(t[1] - 4, 0);
            cr_assert_lt(t[1] - 4, K);
            cr_assert_neq(val_of[t[1] - 4], -1, "query %d asks an unplanted key", q);
            cr_assert_eq(t[3], 4 + K + val_of[t[1] - 4], "query %d: wrong answer", q);
            for (int r = 0; r < q; r++)
                cr_assert_neq(tok[qs + 4 * r + 1], t[1], "key asked twice");
        }
    }
}

/* The rank holding position p among R ranks of c = T / R tokens. */
static int64_t owner(enum dt_layout l, int64_t T, int64_t R, int64_t p)
{
    int64_t c = T / R;
    if (l == DT_LAYOUT_CONTIGUOUS)
        return p / c;
    int64_t chunk = p / (c / 2);
    return chunk < R ? chunk : 2 * R - 1 - chunk;
}

Test(data, recall_pairs_and_queries_sit_on_different_ranks)
{
    dt_recall_opts_t o;
    int32_t x[1024], y[1024];
    dt_emsg_t em = { "" };

    dt_recall_opts_default(&o);
    cr_assert_eq(dt_recall_xy(&o, 5, x, y, &em), 0, "%s", em.s);
    for (int lay = 0; lay < 2; lay++) {
        enum dt_layout l = lay ? DT_LAYOUT_ZIGZAG : DT_LAYOUT_CONTIGUOUS;
        for (int64_t R = 2; R <= 8; R *= 2) {
            int64_t qrank = owner(l, 1024, R, dt_recall_answer_pos(&o, 0));
            for (int q = 0; q < o.n_queries; q++)
                cr_assert_eq(owner(l, 1024, R, dt_recall_answer_pos(&o, q)), qrank);
            for (int64_t i = 0; i < 1024 - 4 * o.n_queries; i++)
                if (x[i] >= 4 && x[i] < 4 + o.n_keys + o.n_values)
                    cr_assert_neq(owner(l, 1024, R, i), qrank,
                                  "%s R=%ld: key or value at %ld on the queries' rank %ld",
                                  lay ? "zigzag" : "contiguous", (long)R, (long)i, (long)qrank);
        }
    }
}

Test(data, recall_target_layout)
{
    dt_recall_opts_t o;
    int32_t tok[1025], x[1024], y[1024];
    dt_emsg_t em = { "" };
    int answers = 0;

    dt_recall_opts_default(&o);
    cr_assert_eq(dt_recall_make(&o, 3, tok, &em), 0, "%s", em.s);
    cr_assert_eq(dt_recall_xy(&o, 3, x, y, &em), 0, "%s", em.s);
    cr_assert_eq(memcmp(x, tok, sizeof(x)), 0);
    for (int64_t i = 0; i < o.T; i++) {
        if (y[i] == -1)
            continue;
        answers++;
        cr_assert_eq(x[i], DT_RECALL_ANSWER, "target at %ld where x is %d", (long)i, x[i]);
        cr_assert_eq(y[i], tok[i + 1]);
    }
    cr_assert_eq(answers, o.n_queries);
    for (int q = 0; q < o.n_queries; q++)
        cr_assert_neq(y[dt_recall_answer_pos(&o, q)], -1);

    o.all_targets = 1;
    cr_assert_eq(dt_recall_xy(&o, 3, x, y, &em), 0, "%s", em.s);
    cr_assert_eq(memcmp(x, tok, sizeof(x)), 0);
    cr_assert_eq(memcmp(y, tok + 1, sizeof(y)), 0);
}

Test(data, recall_score)
{
    enum { B = 200 };
    dt_recall_opts_t o;
    int32_t *x, *y, *pred;
    int64_t correct, T;
    dt_emsg_t em = { "" };
    double acc;

    dt_recall_opts_default(&o);
    T = o.T;
    x = malloc(B * T * sizeof(*x));
    y = malloc(B * T * sizeof(*y));
    pred = malloc(B * T * sizeof(*pred));
    for (int b = 0; b < B; b++)
        cr_assert_eq(dt_recall_xy(&o, (uint64_t)b, x + b * T, y + b * T, &em), 0, "%s", em.s);

    /* perfect at the answer slots, garbage elsewhere: 1 */
    for (int64_t i = 0; i < B * T; i++)
        pred[i] = y[i] >= 0 ? y[i] : 0;
    acc = dt_recall_score(&o, B, y, pred, &correct);
    cr_assert_eq(correct, B * o.n_queries);
    cr_assert_float_eq(acc, 1.0, 1e-12);

    /* uniform guesses among the values: near chance, 1/128 */
    for (int64_t i = 0; i < B * T; i++)
        pred[i] = 4 + o.n_keys + (int32_t)(dt_gen_uniform(99, 0, (uint64_t)i) * o.n_values);
    acc = dt_recall_score(&o, B, y, pred, &correct);
    cr_assert(acc < 0.03, "random guesses score %.4f (chance %.4f)", acc, 1.0 / o.n_values);
    cr_assert_float_eq(acc, (double)correct / (B * o.n_queries), 1e-12);

    /* one wrong answer out of B * Q */
    for (int64_t i = 0; i < B * T; i++)
        pred[i] = y[i];
    pred[dt_recall_answer_pos(&o, 0)] = DT_RECALL_SEP;
    dt_recall_score(&o, B, y, pred, &correct);
    cr_assert_eq(correct, B * o.n_queries - 1);
    cr_assert_float_eq(dt_recall_score(&o, 0, y, pred, NULL), 0.0, 0);
    free(x);
    free(y);
    free(pred);
}

Test(data, recall_refuses_bad_options)
{
    dt_recall_opts_t o;
    int32_t tok[130];
    dt_emsg_t em = { "" };

    dt_recall_opts_default(&o);
    o.T = 128; /* 10% of 129 is 12 tokens: 3 pairs at most */
    o.n_pairs = 4;
    o.n_queries = 2;
    cr_assert_eq(dt_recall_make(&o, 0, tok, &em), DT_EINVAL);
    cr_assert(strstr(em.s, "4 pairs take 13 tokens, more than 10% (12) of a "
                           "129-token sequence"),
              "%s", em.s);
    o.n_pairs = 3;
    cr_assert_eq(dt_recall_make(&o, 0, tok, &em), 0, "%s", em.s);
    o.n_queries = 4;
    cr_assert_eq(dt_recall_check(&o, &em), DT_EINVAL);
    cr_assert(strstr(em.s, "n_queries 4 must be in [1, n_pairs 3]"), "%s", em.s);
    o.n_queries = 2;
    o.n_keys = 2;
    cr_assert_eq(dt_recall_check(&o, &em), DT_EINVAL);
    cr_assert(strstr(em.s, "n_pairs 3 must be in [1, n_keys 2]"), "%s", em.s);
    o.n_keys = 128;
    o.n_filler = 0;
    cr_assert_eq(dt_recall_check(&o, &em), DT_EINVAL);
    cr_assert(strstr(em.s, "n_filler 0"), "%s", em.s);
}

/* What dt_tok_save writes is the owner's alone (0600 whatever the umask),
 * and a link planted at its temp name is replaced, never written through. */
Test(data, save_is_private_and_does_not_follow_a_planted_link)
{
    int32_t tok[4] = { 1, 2, 3, 4 };
    char tmpname[256], victim_text[16] = "";
    dt_emsg_t em = { "" };
    struct stat st;
    mode_t old;
    FILE *f;

    f = fopen(P("victim"), "w");
    cr_assert_not_null(f);
    fputs("precious", f);
    fclose(f);
    snprintf(tmpname, sizeof(tmpname), "%s/.t.bin.tmp.%ld", tmpdir, (long)getpid());
    cr_assert_eq(symlink(P("victim"), tmpname), 0);
    old = umask(0);
    cr_assert_eq(dt_tok_save(P("t.bin"), DT_TOK_U16, tok, 4, &em), 0, "%s", em.s);
    umask(old);
    cr_assert_eq(lstat(P("t.bin"), &st), 0);
    cr_assert(S_ISREG(st.st_mode));
    cr_assert_eq(st.st_mode & 07777, 0600, "mode %o", (unsigned)(st.st_mode & 07777));
    f = fopen(P("victim"), "r");
    cr_assert_not_null(f);
    cr_assert_not_null(fgets(victim_text, sizeof(victim_text), f));
    fclose(f);
    cr_assert_str_eq(victim_text, "precious");

    /* the header checks from memory, as the fuzzer runs them */
    unsigned char img[DT_TOK_HEADER_BYTES + 8];
    dt_tok_info_t info;
    f = fopen(P("t.bin"), "rb");
    cr_assert_eq(fread(img, 1, sizeof(img), f), sizeof(img));
    fclose(f);
    cr_assert_eq(dt_tok_parse_header("m", img, sizeof(img), sizeof(img), &info, &em), 0);
    cr_assert(info.fmt == DT_TOK_U16 && info.ntok == 4 && info.data_offset == 1024);
    cr_assert_eq(dt_tok_parse_header("m", img, sizeof(img), sizeof(img) + 2, &info, &em),
                 DT_EFORMAT);
    cr_assert(strstr(em.s, "2 bytes of trailing data"), "%s", em.s);
    cr_assert_eq(dt_tok_parse_header("m", img, 100, 100, &info, &em), DT_EFORMAT);
    cr_assert(strstr(em.s, "m: header is truncated: the file has 100 bytes"), "%s", em.s);
}
