/* SPDX-License-Identifier: MIT
 *
 * Tests of engine/safetensors: round trips of every dtype with metadata, the
 * exact bytes of a tiny file (computed by hand), the SHA-256 the writer
 * returns against a re-hash of the file and against a published test vector,
 * and the refusal of malformed files, each crafted byte by byte, with the
 * message the user would see. Every test works in its own directory under
 * /tmp, removed afterwards. No Python needed.
 */
#include "common/fileio.h"
#include "config.h"

#include <criterion/criterion.h>
#include <dirent.h>
#include <fcntl.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "io/safetensors.h"

/*-- fixture: one temp dir per test -----------------------------------------*/

static char tmpdir[64];

static void setup(void)
{
    snprintf(tmpdir, sizeof(tmpdir), "/tmp/test_safetensors.XXXXXX");
    cr_assert_not_null(mkdtemp(tmpdir), "mkdtemp: %s", strerror(errno));
}

static void teardown(void)
{
    if (tmpdir[0])
        dt_rmtree(tmpdir, NULL);
}

TestSuite(safetensors, .init = setup, .fini = teardown);

static const char *P(const char *name)
{
    static char bufs[4][256];
    static int i;
    char *b = bufs[i++ % 4];

    snprintf(b, sizeof(bufs[0]), "%s/%s", tmpdir, name);
    return b;
}

static void put_file(const char *path, const void *data, size_t n)
{
    FILE *f = fopen(path, "wb");

    cr_assert_not_null(f, "fopen %s: %s", path, strerror(errno));
    cr_assert_eq(fwrite(data, 1, n, f), n);
    cr_assert_eq(fclose(f), 0);
}

/* A file of: 8-byte length of header (as given, or len override), header,
 * data bytes. */
static void craft(const char *path, const char *header, uint64_t len_field, const void *data,
                  size_t ndata)
{
    size_t hl = strlen(header);
    unsigned char *buf = malloc(8 + hl + ndata + 1);

    for (int i = 0; i < 8; i++)
        buf[i] = (unsigned char)(len_field >> (8 * i));
    memcpy(buf + 8, header, hl);
    if (ndata)
        memcpy(buf + 8 + hl, data, ndata);
    put_file(path, buf, 8 + hl + ndata);
    free(buf);
}

static void craft_ok_len(const char *path, const char *header, size_t ndata)
{
    unsigned char zeros[256] = { 0 };

    cr_assert_leq(ndata, sizeof(zeros));
    craft(path, header, strlen(header), zeros, ndata);
}

/* Open must fail with err and a message containing each of the needles. */
static void expect_refusal(const char *path, int err, const char *n1, const char *n2)
{
    dt_st_reader_t *r = (dt_st_reader_t *)1;
    dt_emsg_t em = { "" };
    int rc = dt_st_open(path, &r, &em);

    cr_assert_eq(rc, err, "rc %d (%s), expected %d; message: %s", rc, dt_err_name(rc), err, em.s);
    cr_assert_null(r);
    cr_assert(strstr(em.s, path) != NULL, "message does not name the file: %s", em.s);
    cr_assert(strstr(em.s, n1) != NULL, "message lacks '%s': %s", n1, em.s);
    if (n2)
        cr_assert(strstr(em.s, n2) != NULL, "message lacks '%s': %s", n2, em.s);

    /* the same bytes parsed from memory: the same refusal */
    struct stat st;
    FILE *f;
    if (stat(path, &st) < 0 || !S_ISREG(st.st_mode) || (f = fopen(path, "rb")) == NULL)
        return;
    unsigned char *buf = malloc((size_t)st.st_size + 1);
    dt_emsg_t em2 = { "" };
    cr_assert_eq(fread(buf, 1, (size_t)st.st_size, f), (size_t)st.st_size);
    fclose(f);
    r = (dt_st_reader_t *)1;
    cr_assert_eq(dt_st_parse(path, buf, (size_t)st.st_size, &r, &em2), err, "%s", em2.s);
    cr_assert_null(r);
    cr_assert_str_eq(em2.s, em.s);
    free(buf);
}

static int count_dir(const char *dir)
{
    DIR *d = opendir(dir);
    struct dirent *de;
    int n = 0;

    cr_assert_not_null(d);
    while ((de = readdir(d)) != NULL)
        if (strcmp(de->d_name, ".") && strcmp(de->d_name, ".."))
            n++;
    closedir(d);
    return n;
}

/*-- round trips ------------------------------------------------------------*/

Test(safetensors, round_trip_all_dtypes_and_metadata)
{
    float f32[6] = { 1.5f, -2.0f, 3.25f, 0.0f, 1e-3f, 65504.0f };
    uint16_t f16[4] = { 0x3c00, 0xc000, 0x7bff, 0x0001 };
    uint16_t bf16[3] = { 0x3f80, 0xbf80, 0x7f80 };
    int64_t i64[2] = { INT64_MIN, INT64_MAX };
    int32_t i32[5] = { -1, 0, 1, INT32_MAX, INT32_MIN };
    uint8_t u8[7] = { 0, 1, 2, 3, 254, 255, 7 };
    int64_t s23[] = { 2, 3 }, s4[] = { 4 }, s3[] = { 3 }, s21[] = { 2, 1 }, s5[] = { 5 },
            s711[] = { 7, 1, 1 }, s0[] = { 0, 4 };
    dt_st_writer_t *w = dt_st_writer_new();
    dt_st_reader_t *r;
    dt_emsg_t em = { "" };
    char hex[65], hex2[65];
    int64_t bytes;
    struct stat st;

    cr_assert_eq(dt_st_writer_add(w, "model.embed.weight", DT_F32, 2, s23, f32, &em), 0, "%s",
                 em.s);
    cr_assert_eq(dt_st_writer_add(w, "h16", DT_F16, 1, s4, f16, &em), 0);
    cr_assert_eq(dt_st_writer_add(w, "b16", DT_BF16, 1, s3, bf16, &em), 0);
    cr_assert_eq(dt_st_writer_add(w, "cursor", DT_I64, 2, s21, i64, &em), 0);
    cr_assert_eq(dt_st_writer_add(w, "ints", DT_I32, 1, s5, i32, &em), 0);
    cr_assert_eq(dt_st_writer_add(w, "bytes", DT_U8, 3, s711, u8, &em), 0);
    cr_assert_eq(dt_st_writer_add(w, "empty", DT_F32, 2, s0, NULL, &em), 0);
    cr_assert_eq(dt_st_writer_add(w, "scalar", DT_F32, 0, NULL, &f32[0], &em), 0);
    cr_assert_eq(dt_st_writer_meta(w, "format", "pt", &em), 0);
    cr_assert_eq(dt_st_writer_meta(w, "dt.step", "12", &em), 0);
    cr_assert_eq(dt_st_write(w, P("m.safetensors"), hex, &bytes, &em), 0, "%s", em.s);
    dt_st_writer_free(w);

    cr_assert_eq(stat(P("m.safetensors"), &st), 0);
    cr_assert_eq((int64_t)st.st_size, bytes);
    cr_assert_eq(count_dir(tmpdir), 1, "temporary file left behind");
    cr_assert_eq(dt_sha256_file(P("m.safetensors"), hex2, &em), 0);
    cr_assert_str_eq(hex, hex2);

    cr_assert_eq(dt_st_open(P("m.safetensors"), &r, &em), 0, "%s", em.s);
    cr_assert_eq(dt_st_count(r), 8);
    cr_assert_eq(dt_st_meta_count(r), 2);
    cr_assert_str_eq(dt_st_meta(r, "format"), "pt");
    cr_assert_str_eq(dt_st_meta(r, "dt.step"), "12");
    cr_assert_null(dt_st_meta(r, "nope"));
    {
        const char *k, *v;
        dt_st_meta_at(r, 1, &k, &v);
        cr_assert_str_eq(k, "dt.step");
        cr_assert_str_eq(v, "12");
    }
    /* File order is add order. */
    cr_assert_str_eq(dt_st_tensor(r, 0)->name, "model.embed.weight");
    cr_assert_str_eq(dt_st_tensor(r, 5)->name, "bytes");
    {
        const dt_st_tensor_t *t = dt_st_find(r, "bytes");
        cr_assert_not_null(t);
        cr_assert_eq(t->dtype, DT_U8);
        cr_assert_eq(t->ndim, 3);
        cr_assert_eq(t->shape[0], 7);
        t = dt_st_find(r, "scalar");
        cr_assert_eq(t->ndim, 0);
        cr_assert_eq(t->end - t->begin, 4);
        t = dt_st_find(r, "empty");
        cr_assert_eq(t->end, t->begin);
    }
    {
        float g32[6], gs;
        uint16_t g16[4], gb16[3];
        int64_t g64[2];
        int32_t g32i[5];
        uint8_t gu8[7];

        cr_assert_eq(dt_st_read(r, "model.embed.weight", g32, sizeof(g32), &em), 0, "%s", em.s);
        cr_assert_arr_eq(g32, f32, sizeof(f32));
        cr_assert_eq(dt_st_read(r, "h16", g16, sizeof(g16), &em), 0);
        cr_assert_arr_eq(g16, f16, sizeof(f16));
        cr_assert_eq(dt_st_read(r, "b16", gb16, sizeof(gb16), &em), 0);
        cr_assert_arr_eq(gb16, bf16, sizeof(bf16));
        cr_assert_eq(dt_st_read(r, "cursor", g64, sizeof(g64), &em), 0);
        cr_assert_arr_eq(g64, i64, sizeof(i64));
        cr_assert_eq(dt_st_read(r, "ints", g32i, sizeof(g32i), &em), 0);
        cr_assert_arr_eq(g32i, i32, sizeof(i32));
        cr_assert_eq(dt_st_read(r, "bytes", gu8, sizeof(gu8), &em), 0);
        cr_assert_arr_eq(gu8, u8, sizeof(u8));
        cr_assert_eq(dt_st_read(r, "scalar", &gs, sizeof(gs), &em), 0);
        cr_assert_eq(gs, 1.5f);
        cr_assert_eq(dt_st_read(r, "empty", NULL, 0, &em), 0);

        cr_assert_eq(dt_st_read(r, "ints", g32i, 4, &em), DT_ESHAPE);
        cr_assert(strstr(em.s, "'ints' is 20 bytes") != NULL, "%s", em.s);
        cr_assert_eq(dt_st_read(r, "missing", g32i, 4, &em), DT_ENOENT);
        cr_assert(strstr(em.s, "no tensor 'missing'") != NULL, "%s", em.s);
    }
    dt_st_close(r);
}

Test(safetensors, exact_bytes_of_a_tiny_file)
{
    /* Header JSON, compact, in insertion order, metadata first:
     *   {"__metadata__":{"k":"v"},                              26 bytes
     *   "a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]}}   53 bytes
     * = 79 bytes, padded with one space to 80 = 0x50. Data: 1.0f = 0x3f800000,
     * 2.0f = 0x40000000, little-endian. 8 + 80 + 8 = 96 bytes in all. */
    static const char json[] = "{\"__metadata__\":{\"k\":\"v\"},"
                               "\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]}} ";
    unsigned char want[96], got[200];
    float data[2] = { 1.0f, 2.0f };
    int64_t s2[] = { 2 }, bytes;
    dt_st_writer_t *w = dt_st_writer_new();
    dt_emsg_t em = { "" };
    char hex[65];
    FILE *f;
    size_t n;

    cr_assert_eq(sizeof(json) - 1, 80);
    memcpy(want, "\x50\0\0\0\0\0\0\0", 8);
    memcpy(want + 8, json, 80);
    memcpy(want + 88, "\x00\x00\x80\x3f\x00\x00\x00\x40", 8);

    cr_assert_eq(dt_st_writer_add(w, "a", DT_F32, 1, s2, data, &em), 0);
    cr_assert_eq(dt_st_writer_meta(w, "k", "v", &em), 0);
    cr_assert_eq(dt_st_write(w, P("t.safetensors"), hex, &bytes, &em), 0, "%s", em.s);
    dt_st_writer_free(w);
    cr_assert_eq(bytes, 96);
    f = fopen(P("t.safetensors"), "rb");
    n = fread(got, 1, sizeof(got), f);
    fclose(f);
    cr_assert_eq(n, 96);
    cr_assert_arr_eq(got, want, 96);
    /* sha256 of those 96 bytes, from an independent implementation. */
    cr_assert_str_eq(hex, "8c09201c2c7701402a25eceb43c2e47200c0df1fa21741e3e9bc8210413d56b6");
}

Test(safetensors, sha256_of_known_strings)
{
    char hex[65];
    dt_emsg_t em = { "" };

    put_file(P("abc"), "abc", 3);
    cr_assert_eq(dt_sha256_file(P("abc"), hex, &em), 0);
    cr_assert_str_eq(hex, "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad");
    put_file(P("empty"), "", 0);
    cr_assert_eq(dt_sha256_file(P("empty"), hex, &em), 0);
    cr_assert_str_eq(hex, "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855");
    cr_assert_eq(dt_sha256_file(P("nope"), hex, &em), DT_ENOENT);
    cr_assert(strstr(em.s, P("nope")) != NULL, "%s", em.s);
}

Test(safetensors, write_replaces_atomically_and_refuses_bad_input)
{
    int64_t s1[] = { 1 }, neg[] = { -1 };
    float x = 1;
    dt_st_writer_t *w = dt_st_writer_new();
    dt_emsg_t em = { "" };

    cr_assert_eq(dt_st_writer_add(w, "x", DT_F32, 1, s1, &x, &em), 0);
    cr_assert_eq(dt_st_writer_add(w, "x", DT_F32, 1, s1, &x, &em), DT_EINVAL);
    cr_assert(strstr(em.s, "'x' added twice") != NULL, "%s", em.s);
    cr_assert_eq(dt_st_writer_add(w, "__metadata__", DT_F32, 1, s1, &x, &em), DT_EINVAL);
    cr_assert_eq(dt_st_writer_add(w, "", DT_F32, 1, s1, &x, &em), DT_EINVAL);
    cr_assert_eq(dt_st_writer_add(w, "bad\xff", DT_F32, 1, s1, &x, &em), DT_EINVAL);
    cr_assert_eq(dt_st_writer_add(w, "n", DT_F32, 1, neg, &x, &em), DT_EINVAL);
    cr_assert_eq(dt_st_writer_add(w, "d", (dt_dtype_t)42, 1, s1, &x, &em), DT_EDTYPE);
    cr_assert_eq(dt_st_writer_meta(w, "k", "v", &em), 0);
    cr_assert_eq(dt_st_writer_meta(w, "k", "w", &em), DT_EINVAL);

    put_file(P("t.safetensors"), "old", 3);
    cr_assert_eq(dt_st_write(w, P("t.safetensors"), NULL, NULL, &em), 0, "%s", em.s);
    /* Into a missing directory: refused, nothing created. */
    cr_assert_eq(dt_st_write(w, P("no/t.safetensors"), NULL, NULL, &em), DT_ENOENT);
    cr_assert(strstr(em.s, "cannot create") != NULL, "%s", em.s);
    dt_st_writer_free(w);
    cr_assert_eq(count_dir(tmpdir), 1);
    {
        dt_st_reader_t *r;
        cr_assert_eq(dt_st_open(P("t.safetensors"), &r, &em), 0, "%s", em.s);
        cr_assert_eq(dt_st_count(r), 1);
        dt_st_close(r);
    }
}

/*-- refusals ---------------------------------------------------------------*/

#define ENTRY(name, dt, shape, b, e) \
    "\"" name "\":{\"dtype\":\"" dt "\",\"shape\":" shape ",\"data_offsets\":[" #b "," #e "]}"

Test(safetensors, refuses_header_length_beyond_file)
{
    const char *h = "{" ENTRY("a", "F32", "[2]", 0, 8) "}";
    unsigned char d[8] = { 0 };

    craft(P("x"), h, 1000, d, 8);
    expect_refusal(P("x"), DT_EFORMAT, "header length 1000 is larger than the file", NULL);
    craft(P("short"), "", 0, NULL, 0);
    put_file(P("short"), "\x05\0\0", 3);
    expect_refusal(P("short"), DT_EFORMAT, "shorter than the 8-byte header length", NULL);
}

Test(safetensors, refuses_header_over_cap_before_allocating)
{
    /* Claims 2^40 bytes; the file is tiny. The cap is checked first. */
    craft(P("x"), "{}", (uint64_t)1 << 40, NULL, 0);
    expect_refusal(P("x"), DT_EFORMAT, "header length 1099511627776 exceeds the limit", NULL);
    craft(P("y"), "{}", DT_ST_HEADER_MAX + 1ull, NULL, 0);
    expect_refusal(P("y"), DT_EFORMAT, "exceeds the limit of 104857600 bytes", NULL);
}

Test(safetensors, refuses_bad_json)
{
    craft_ok_len(P("x"), "{\"a\":{\"dtype\":\"F32\",", 0);
    expect_refusal(P("x"), DT_EFORMAT, "header is not valid JSON", "line 1");
    craft_ok_len(P("y"), "[1,2]", 0);
    expect_refusal(P("y"), DT_EFORMAT, "header is not a JSON object", NULL);
    craft_ok_len(P("z"),
                 "{\"a\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,4],"
                 "\"extra\":1}}",
                 4);
    expect_refusal(P("z"), DT_EFORMAT, "tensor 'a' has unknown field 'extra'", NULL);
    craft_ok_len(P("m"), "{\"__metadata__\":{\"k\":1}}", 0);
    expect_refusal(P("m"), DT_EFORMAT, "metadata 'k' is not a string", NULL);
    craft_ok_len(P("n"), "{" ENTRY("a", "F32", "[-1]", 0, 4) "}", 4);
    expect_refusal(P("n"), DT_EFORMAT, "shape entry 0 is not a non-negative integer", NULL);
    craft_ok_len(P("o"), "{\"a\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0]}}", 4);
    expect_refusal(P("o"), DT_EFORMAT, "'data_offsets' is not [begin, end]", NULL);
}

Test(safetensors, refuses_overlapping_offsets)
{
    craft_ok_len(P("x"), "{" ENTRY("a", "F32", "[2]", 0, 8) "," ENTRY("b", "F32", "[2]", 4, 12) "}",
                 12);
    expect_refusal(P("x"), DT_EFORMAT, "tensor 'b' data_offsets [4, 12] overlap 'a'", NULL);
}

Test(safetensors, refuses_gapped_offsets)
{
    craft_ok_len(P("x"),
                 "{" ENTRY("a", "F32", "[2]", 0, 8) "," ENTRY("b", "F32", "[2]", 12, 20) "}", 20);
    expect_refusal(P("x"), DT_EFORMAT, "gap in the data: tensor 'b' begins at 12", NULL);
    craft_ok_len(P("y"), "{" ENTRY("a", "F32", "[2]", 4, 12) "}", 12);
    expect_refusal(P("y"), DT_EFORMAT, "tensor 'a' begins at 4", "ends at 0");
}

Test(safetensors, accepts_offsets_out_of_key_order)
{
    dt_st_reader_t *r;
    dt_emsg_t em = { "" };

    craft_ok_len(P("x"), "{" ENTRY("b", "I32", "[1]", 4, 8) "," ENTRY("a", "U8", "[4]", 0, 4) "}",
                 8);
    cr_assert_eq(dt_st_open(P("x"), &r, &em), 0, "%s", em.s);
    cr_assert_str_eq(dt_st_tensor(r, 0)->name, "a");
    dt_st_close(r);
}

Test(safetensors, refuses_shape_offset_mismatch)
{
    craft_ok_len(P("x"), "{" ENTRY("w", "F32", "[2, 3]", 0, 20) "}", 20);
    expect_refusal(P("x"), DT_EFORMAT,
                   "tensor 'w': shape [2, 3] of F32 is 24 bytes but data_offsets [0, 20] span 20",
                   NULL);
    craft_ok_len(P("y"), "{" ENTRY("w", "F32", "[4294967296, 4294967296]", 0, 20) "}", 20);
    expect_refusal(P("y"), DT_EFORMAT, "is more than", NULL);
}

Test(safetensors, refuses_unknown_dtype)
{
    craft_ok_len(P("x"), "{" ENTRY("w", "F64", "[1]", 0, 8) "}", 8);
    expect_refusal(P("x"), DT_EDTYPE, "tensor 'w' has dtype 'F64'", NULL);
}

Test(safetensors, refuses_duplicate_names)
{
    craft_ok_len(P("x"), "{" ENTRY("w", "U8", "[1]", 0, 1) "," ENTRY("w", "U8", "[1]", 1, 2) "}",
                 2);
    expect_refusal(P("x"), DT_EFORMAT, "header is not valid JSON", "duplicate");
}

Test(safetensors, refuses_truncated_and_trailing_data)
{
    craft_ok_len(P("x"), "{" ENTRY("a", "F32", "[4]", 0, 16) "}", 10);
    expect_refusal(P("x"), DT_EFORMAT, "truncated: the header promises 16 data bytes", "holds 10");
    craft_ok_len(P("y"), "{" ENTRY("a", "F32", "[1]", 0, 4) "}", 9);
    expect_refusal(P("y"), DT_EFORMAT, "5 bytes after the last tensor", NULL);
}

Test(safetensors, refuses_missing_and_non_regular_files)
{
    expect_refusal(P("nope"), DT_ENOENT, "cannot open", NULL);
    expect_refusal(tmpdir, DT_EINVAL, "is a directory", NULL);
}

/* A shard holds a model's weights: the file is the owner's alone (0600,
 * whatever the umask), and so is what dt_st_write leaves nowhere else. */
Test(safetensors, written_file_is_private)
{
    float x[2] = { 1, 2 };
    int64_t shape[1] = { 2 };
    dt_st_writer_t *w = dt_st_writer_new();
    dt_emsg_t em = { "" };
    struct stat st;
    mode_t old = umask(0);

    cr_assert_eq(dt_st_writer_add(w, "x", DT_F32, 1, shape, x, &em), 0, "%s", em.s);
    cr_assert_eq(dt_st_write(w, P("w.safetensors"), NULL, NULL, &em), 0, "%s", em.s);
    umask(old);
    dt_st_writer_free(w);
    cr_assert_eq(stat(P("w.safetensors"), &st), 0);
    cr_assert_eq(st.st_mode & 07777, 0600, "mode %o", (unsigned)(st.st_mode & 07777));
}

/* Hashing and the no-follow reader take only a regular file at the path
 * itself: a link planted there is not followed (a reader running as
 * another user would hash or read its target), a FIFO or a device is
 * refused, not read. */
Test(safetensors, hash_and_nofollow_refuse_links_fifos_devices, .timeout = 20)
{
    float x[1] = { 1 };
    int64_t shape[1] = { 1 };
    dt_st_writer_t *w = dt_st_writer_new();
    dt_st_reader_t *r = NULL;
    dt_emsg_t em = { "" };
    char hex[65];

    cr_assert_eq(dt_st_writer_add(w, "x", DT_F32, 1, shape, x, &em), 0);
    cr_assert_eq(dt_st_write(w, P("real"), NULL, NULL, &em), 0, "%s", em.s);
    dt_st_writer_free(w);
    cr_assert_eq(symlink(P("real"), P("link")), 0);
    cr_assert_eq(dt_sha256_file(P("link"), hex, &em), DT_EINVAL, "%s", em.s);
    cr_assert(strstr(em.s, "link: is a symbolic link"), "%s", em.s);
    cr_assert_eq(dt_st_open_nofollow(P("link"), &r, &em), DT_EINVAL, "%s", em.s);
    cr_assert_null(r);
    cr_assert_eq(dt_st_open(P("link"), &r, &em), 0, "%s", em.s); /* links to inputs are fine */
    dt_st_close(r);
    cr_assert_eq(dt_st_open_nofollow(P("real"), &r, &em), 0, "%s", em.s);
    dt_st_close(r);
    cr_assert_eq(mkfifo(P("fifo"), 0600), 0);
    cr_assert_eq(dt_sha256_file(P("fifo"), hex, &em), DT_EINVAL, "%s", em.s);
    cr_assert(strstr(em.s, "not a regular file"), "%s", em.s);
    cr_assert_eq(dt_sha256_file("/dev/zero", hex, &em), DT_EINVAL, "%s", em.s);
    cr_assert_eq(dt_sha256_file(P("real"), hex, &em), 0, "%s", em.s);
}
