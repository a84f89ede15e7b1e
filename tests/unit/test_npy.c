/* SPDX-License-Identifier: MIT
 *
 * Tests of engine/npy: round trips of float32, float16 and int64 files,
 * int32 headers (token ids), the header parsed from a file's first bytes,
 * partial reads, the float16 conversions (every bit pattern, every rounding
 * boundary), the atomic writer (out-of-order writes, abort, failed writes
 * leave no temporary file), and the refusal of malformed files, each written
 * byte by byte, with the message the user would see. Every test works in its
 * own directory under /tmp, removed afterwards. No Python needed.
 */
#include "common/fileio.h"
#include "config.h"

#include <criterion/criterion.h>
#include <dirent.h>
#include <fcntl.h>
#include <math.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <unistd.h>

#include "common/half.h"
#include "io/npy.h"

/*-- fixture: one temp dir per test -----------------------------------------*/

static char tmpdir[64];

static void setup(void)
{
    snprintf(tmpdir, sizeof(tmpdir), "/tmp/test_npy.XXXXXX");
    cr_assert_not_null(mkdtemp(tmpdir), "mkdtemp: %s", strerror(errno));
}

static void teardown(void)
{
    if (tmpdir[0])
        dt_rmtree(tmpdir, NULL);
}

TestSuite(npy, .init = setup, .fini = teardown);

/* tmpdir/name, in one of a few rotating static buffers. */
static const char *P(const char *name)
{
    static char bufs[4][256];
    static int i;
    char *b = bufs[i++ % 4];

    snprintf(b, sizeof(bufs[0]), "%s/%s", tmpdir, name);
    return b;
}

/* Names in dir (without . and ..), sorted into a "a,b" string; returns count. */
static int list_dir(const char *dir, char *out, size_t outsz)
{
    DIR *d = opendir(dir);
    struct dirent *de;
    int n = 0;

    cr_assert_not_null(d, "opendir %s: %s", dir, strerror(errno));
    out[0] = '\0';
    while ((de = readdir(d)) != NULL) {
        if (strcmp(de->d_name, ".") == 0 || strcmp(de->d_name, "..") == 0)
            continue;
        if (n++)
            strncat(out, ",", outsz - strlen(out) - 1);
        strncat(out, de->d_name, outsz - strlen(out) - 1);
    }
    closedir(d);
    return n;
}

static void write_bytes(const char *path, const void *data, size_t len)
{
    FILE *f = fopen(path, "wb");

    cr_assert_not_null(f, "fopen %s: %s", path, strerror(errno));
    cr_assert_eq(fwrite(data, 1, len, f), len);
    cr_assert_eq(fclose(f), 0);
}

static size_t read_bytes(const char *path, void *buf, size_t cap)
{
    FILE *f = fopen(path, "rb");
    size_t n;

    cr_assert_not_null(f, "fopen %s: %s", path, strerror(errno));
    n = fread(buf, 1, cap, f);
    fclose(f);
    return n;
}

/* A .npy file built by hand: magic, version major.0, the dict as given, padded
 * with spaces and '\n' to 64 bytes (when pad), then datalen bytes 0..255. */
static void write_npy(const char *path, int major, const char *dict, int pad, size_t datalen)
{
    unsigned char buf[4096];
    size_t prelen = major == 1 ? 10 : 12, dlen = strlen(dict), n = 0, hlen;

    hlen = pad ? (prelen + dlen + 1 + 63) / 64 * 64 - prelen : dlen;
    cr_assert(prelen + hlen + datalen <= sizeof(buf));
    memcpy(buf, "\x93NUMPY", 6);
    buf[6] = (unsigned char)major;
    buf[7] = 0;
    for (size_t i = 0; i < prelen - 8; i++)
        buf[8 + i] = (unsigned char)(hlen >> (8 * i));
    n = prelen;
    memcpy(buf + n, dict, dlen);
    n += dlen;
    if (pad) {
        while (n < prelen + hlen - 1)
            buf[n++] = ' ';
        buf[n++] = '\n';
    }
    for (size_t i = 0; i < datalen; i++)
        buf[n++] = (unsigned char)i;
    write_bytes(path, buf, n);
}

/* Reading the header of path fails with code and a message that names the
 * path and contains each needle. */
static void refused(const char *path, int code, const char *needle1, const char *needle2)
{
    dt_npy_info_t info;
    dt_emsg_t em = { "" };
    int rc = dt_npy_read_header(path, &info, &em);

    cr_assert_eq(rc, code, "%s: got %s (%s), expected %s", path, dt_err_name(rc), em.s,
                 dt_err_name(code));
    cr_assert_not_null(strstr(em.s, path), "message does not name the file: %s", em.s);
    cr_assert_not_null(strstr(em.s, needle1), "'%s' not in message: %s", needle1, em.s);
    if (needle2)
        cr_assert_not_null(strstr(em.s, needle2), "'%s' not in message: %s", needle2, em.s);
}

static uint32_t fbits(float f)
{
    uint32_t u;
    memcpy(&u, &f, sizeof(u));
    return u;
}

static float bitsf(uint32_t u)
{
    float f;
    memcpy(&f, &u, sizeof(f));
    return f;
}

/* Save and read back a float32 array of the given shape; values compared bit
 * for bit. Returns the header that was read. */
static dt_npy_info_t roundtrip_f32(const char *name, int ndim, const int64_t *shape)
{
    dt_npy_info_t info;
    dt_emsg_t em = { "" };
    int64_t n = 1;
    float *x, *y;

    for (int i = 0; i < ndim; i++)
        n *= shape[i];
    x = malloc((size_t)n * sizeof(float) + 1);
    y = malloc((size_t)n * sizeof(float) + 1);
    for (int64_t i = 0; i < n; i++)
        x[i] = (float)i * 0.37f - 11.0f + (i % 3 ? 1e-7f : -1e30f);
    cr_assert_eq(dt_npy_save(P(name), DT_F32, ndim, shape, x, &em), 0, "%s", em.s);
    cr_assert_eq(dt_npy_read_header(P(name), &info, &em), 0, "%s", em.s);
    cr_assert_eq(info.dtype, DT_F32);
    cr_assert_eq(info.ndim, ndim);
    for (int i = 0; i < ndim; i++)
        cr_assert_eq(info.shape[i], shape[i]);
    cr_assert_eq(info.count, n);
    cr_assert_eq(info.data_offset % 64, 0, "data at %zu", info.data_offset);
    cr_assert_eq(dt_npy_read_f32(P(name), &info, 0, n, y, &em), 0, "%s", em.s);
    for (int64_t i = 0; i < n; i++)
        cr_assert_eq(fbits(x[i]), fbits(y[i]), "element %ld: %g vs %g", (long)i, x[i], y[i]);
    free(x);
    free(y);
    return info;
}

/*-- round trips ------------------------------------------------------------*/

Test(npy, roundtrip_f32_1d_header_bytes)
{
    int64_t shape[] = { 3 };
    unsigned char buf[256];
    const char *dict = "{'descr': '<f4', 'fortran_order': False, 'shape': (3,), }";
    dt_npy_info_t info = roundtrip_f32("a.npy", 1, shape);
    size_t n = read_bytes(P("a.npy"), buf, sizeof(buf));

    /* What NumPy writes: version 1.0, 16-bit length, data at 128. */
    cr_assert_eq(n, 128 + 12);
    cr_assert_eq(info.data_offset, 128);
    cr_assert_eq(memcmp(buf, "\x93NUMPY\x01\x00", 8), 0);
    cr_assert_eq(buf[8] | buf[9] << 8, 118);
    cr_assert_eq(memcmp(buf + 10, dict, strlen(dict)), 0, "header: %.118s", (char *)buf + 10);
    for (size_t i = 10 + strlen(dict); i < 127; i++)
        cr_assert_eq(buf[i], ' ');
    cr_assert_eq(buf[127], '\n');
}

Test(npy, roundtrip_f32_3d)
{
    int64_t shape[] = { 5, 7, 11 };
    unsigned char buf[128];

    roundtrip_f32("b.npy", 3, shape);
    read_bytes(P("b.npy"), buf, sizeof(buf));
    cr_assert_not_null(memmem(buf, sizeof(buf), "'shape': (5, 7, 11), }", 22));
}

Test(npy, roundtrip_scalar_and_empty)
{
    int64_t empty[] = { 0, 5 };
    float one = 42.5f, out = 0;
    dt_npy_info_t info;
    dt_emsg_t em = { "" };
    unsigned char buf[128];

    cr_assert_eq(dt_npy_save(P("s.npy"), DT_F32, 0, NULL, &one, &em), 0, "%s", em.s);
    read_bytes(P("s.npy"), buf, sizeof(buf));
    cr_assert_not_null(memmem(buf, sizeof(buf), "'shape': (), }", 14));
    cr_assert_eq(dt_npy_read_header(P("s.npy"), &info, &em), 0, "%s", em.s);
    cr_assert_eq(info.ndim, 0);
    cr_assert_eq(info.count, 1);
    cr_assert_eq(dt_npy_read_f32(P("s.npy"), &info, 0, 1, &out, &em), 0, "%s", em.s);
    cr_assert_eq(out, 42.5f);

    roundtrip_f32("e.npy", 2, empty);
}

Test(npy, roundtrip_f16_exact_values)
{
    /* All exactly representable in binary16, including the extremes. */
    float x[] = { 0.0f, -0.0f, 1.0f, -2.0f, 0.5f, 1.5f, 3.140625f, -1024.0f, 2048.0f,
                  65504.0f, -65504.0f, 0x1p-14f, 0x1p-24f, -0x1p-24f, 0x3ffp-24f,
                  INFINITY, -INFINITY, 1.0009765625f };
    uint16_t want[] = { 0x0000, 0x8000, 0x3c00, 0xc000, 0x3800, 0x3e00, 0x4248, 0xe400,
                        0x6800, 0x7bff, 0xfbff, 0x0400, 0x0001, 0x8001, 0x03ff,
                        0x7c00, 0xfc00, 0x3c01 };
    int64_t n = sizeof(x) / sizeof(x[0]);
    float y[sizeof(x) / sizeof(x[0])];
    unsigned char buf[256];
    dt_npy_info_t info;
    dt_emsg_t em = { "" };

    cr_assert_eq(dt_npy_save(P("h.npy"), DT_F16, 1, &n, x, &em), 0, "%s", em.s);
    cr_assert_eq(read_bytes(P("h.npy"), buf, sizeof(buf)), 128 + 2 * (size_t)n);
    cr_assert_not_null(memmem(buf, 128, "{'descr': '<f2',", 16));
    for (int64_t i = 0; i < n; i++)
        cr_assert_eq(buf[128 + 2 * i] | buf[128 + 2 * i + 1] << 8, want[i],
                     "element %ld (%g): 0x%04x on disk, want 0x%04x", (long)i, x[i],
                     buf[128 + 2 * i] | buf[128 + 2 * i + 1] << 8, want[i]);
    cr_assert_eq(dt_npy_read_header(P("h.npy"), &info, &em), 0, "%s", em.s);
    cr_assert_eq(info.dtype, DT_F16);
    cr_assert_eq(dt_npy_read_f32(P("h.npy"), &info, 0, n, y, &em), 0, "%s", em.s);
    for (int64_t i = 0; i < n; i++)
        cr_assert_eq(fbits(x[i]), fbits(y[i]), "element %ld: %a vs %a", (long)i, x[i], y[i]);
}

Test(npy, roundtrip_f16_rounding)
{
    /* value written -> value read back (round to nearest, ties to even) */
    float x[] = {
        1.0f + 0x1p-11f,            /* halfway 1 and 1+2^-10: even is 1 */
        1.0f + 3 * 0x1p-11f,        /* halfway 1+2^-10 and 1+2^-9: even is 1+2^-9 */
        1.0f + 0x1p-11f + 0x1p-23f, /* just above halfway: up */
        1.0f + 0x1p-11f - 0x1p-23f, /* just below halfway: down */
        65519.0f,                   /* below the overflow threshold: 65504 */
        65520.0f,                   /* halfway 65504 and 2^16: even is infinity */
        -1e10f, 3.4e38f,            /* overflow */
        0x1p-25f,                   /* halfway 0 and the smallest subnormal: 0 */
        0x1.000002p-25f,            /* just above: smallest subnormal */
        3 * 0x1p-25f,               /* halfway subnormals 1 and 2: even is 2 */
        0x1p-14f - 0x1p-25f,        /* halfway largest subnormal and 2^-14: 2^-14 */
        1e-30f, -1e-30f,            /* underflow to signed zero */
        0.1f,                       /* 0x2e66 */
    };
    float want[] = { 1.0f, 1.0f + 0x1p-9f, 1.0f + 0x1p-10f, 1.0f, 65504.0f, INFINITY,
                     -INFINITY, INFINITY, 0.0f, 0x1p-24f, 2 * 0x1p-24f, 0x1p-14f, 0.0f, -0.0f,
                     0.0999755859375f };
    int64_t n = sizeof(x) / sizeof(x[0]);
    float y[sizeof(x) / sizeof(x[0])];
    dt_npy_info_t info;
    dt_emsg_t em = { "" };

    cr_assert_eq(dt_npy_save(P("r.npy"), DT_F16, 1, &n, x, &em), 0, "%s", em.s);
    cr_assert_eq(dt_npy_read_header(P("r.npy"), &info, &em), 0, "%s", em.s);
    cr_assert_eq(dt_npy_read_f32(P("r.npy"), &info, 0, n, y, &em), 0, "%s", em.s);
    for (int64_t i = 0; i < n; i++)
        cr_assert_eq(fbits(y[i]), fbits(want[i]), "element %ld: %a -> %a, want %a", (long)i,
                     x[i], y[i], want[i]);
    cr_assert(isnan(dt_f16_to_f32(dt_f32_to_f16(NAN))));
    cr_assert(isnan(dt_f16_to_f32(dt_f32_to_f16(bitsf(0x7f800001))))); /* low payload */
    cr_assert(isnan(dt_f16_to_f32(dt_f32_to_f16(bitsf(0xffc00000)))));
}

/*-- float16 conversions, exhaustively --------------------------------------*/

Test(npy, f16_all_bit_patterns_roundtrip)
{
    for (uint32_t h = 0; h < 65536; h++) {
        float f = dt_f16_to_f32((uint16_t)h);
        uint16_t back = dt_f32_to_f16(f);
        int nan = (h & 0x7c00) == 0x7c00 && (h & 0x3ff);

        cr_assert_eq(isnan(f) != 0, nan, "0x%04x -> %a", h, f);
        cr_assert_eq(signbit(f) != 0, (h & 0x8000) != 0, "0x%04x -> %a", h, f);
        if (nan)
            cr_assert((back & 0x7c00) == 0x7c00 && (back & 0x3ff), "NaN 0x%04x -> 0x%04x", h,
                      back);
        else
            cr_assert_eq(back, h, "0x%04x -> %a -> 0x%04x", h, f, back);
    }
    /* The value of a few patterns, against their definition. */
    cr_assert_eq(dt_f16_to_f32(0x0001), 0x1p-24f);
    cr_assert_eq(dt_f16_to_f32(0x03ff), 1023 * 0x1p-24f);
    cr_assert_eq(dt_f16_to_f32(0x0400), 0x1p-14f);
    cr_assert_eq(dt_f16_to_f32(0x3555), 0x1.554p-2f);
    cr_assert_eq(dt_f16_to_f32(0x7bff), 65504.0f);
    cr_assert_eq(dt_f16_to_f32(0xfc00), -INFINITY);
}

Test(npy, f16_every_rounding_boundary)
{
    /* For each pair of neighbours (a, b) among the non-negative binary16
     * values, the midpoint goes to the even one, and one float32 ulp either
     * side goes to the nearer; the same mirrored for negatives. */
    for (uint32_t h = 0; h < 0x7c00; h++) {
        float a = dt_f16_to_f32((uint16_t)h);
        float b = h + 1 == 0x7c00 ? 65536.0f : dt_f16_to_f32((uint16_t)(h + 1));
        float mid = (float)(((double)a + (double)b) / 2);
        uint16_t even = (h & 1) ? (uint16_t)(h + 1) : (uint16_t)h;
        struct { float x; uint16_t want; } cases[] = {
            { a, (uint16_t)h },
            { mid, even },
            { nextafterf(mid, 0.0f), (uint16_t)h },
            { nextafterf(mid, INFINITY), (uint16_t)(h + 1) },
        };

        cr_assert_eq((double)mid, ((double)a + (double)b) / 2, "midpoint of 0x%04x inexact", h);
        for (int k = 0; k < 4; k++) {
            uint16_t got = dt_f32_to_f16(cases[k].x);
            uint16_t neg = dt_f32_to_f16(-cases[k].x);
            cr_assert_eq(got, cases[k].want, "%a -> 0x%04x, want 0x%04x", cases[k].x, got,
                         cases[k].want);
            cr_assert_eq(neg, cases[k].want | 0x8000, "%a -> 0x%04x, want 0x%04x",
                         -cases[k].x, neg, cases[k].want | 0x8000);
        }
    }
}

Test(npy, f16_matches_compiler_conversion)
{
#ifdef __FLT16_MAX__
    /* A sweep over all float32 bit patterns (every 509th) against the
     * compiler's own float -> _Float16 conversion. */
    for (uint64_t u = 0; u <= UINT32_MAX; u += 509) {
        float f = bitsf((uint32_t)u);
        _Float16 c = (_Float16)f;
        uint16_t want, got = dt_f32_to_f16(f);

        memcpy(&want, &c, sizeof(want));
        if (isnan(f))
            cr_assert((got & 0x7c00) == 0x7c00 && (got & 0x3ff), "%a -> 0x%04x", f, got);
        else
            cr_assert_eq(got, want, "%a (0x%08x) -> 0x%04x, compiler says 0x%04x", f,
                         (uint32_t)u, got, want);
    }
#else
    teardown(); /* a skipped test does not run the fini */
    tmpdir[0] = '\0';
    cr_skip_test("the compiler has no _Float16 to compare with");
#endif
}

/*-- partial reads and int64 ------------------------------------------------*/

Test(npy, partial_reads_f32)
{
    int64_t shape[] = { 10, 7 };
    float x[70], y[71];
    dt_npy_info_t info;
    dt_emsg_t em = { "" };
    struct { int64_t first, count; } r[] = { { 0, 1 }, { 13, 20 }, { 69, 1 }, { 0, 70 },
                                             { 35, 0 }, { 70, 0 } };

    for (int i = 0; i < 70; i++)
        x[i] = (float)i * 1.5f;
    cr_assert_eq(dt_npy_save(P("p.npy"), DT_F32, 2, shape, x, &em), 0, "%s", em.s);
    cr_assert_eq(dt_npy_read_header(P("p.npy"), &info, &em), 0, "%s", em.s);
    for (size_t k = 0; k < sizeof(r) / sizeof(r[0]); k++) {
        memset(y, 0xff, sizeof(y));
        cr_assert_eq(dt_npy_read_f32(P("p.npy"), &info, r[k].first, r[k].count, y, &em), 0,
                     "%s", em.s);
        for (int64_t i = 0; i < r[k].count; i++)
            cr_assert_eq(y[i], x[r[k].first + i], "[%ld, +%ld) element %ld", (long)r[k].first,
                         (long)r[k].count, (long)i);
        cr_assert_eq(fbits(y[r[k].count]), 0xffffffffu, "wrote past count");
    }

    /* Out of range: refused, naming the range. */
    cr_assert_eq(dt_npy_read_f32(P("p.npy"), &info, 60, 11, y, &em), DT_EINVAL);
    cr_assert_not_null(strstr(em.s, "[60, 71)"), "%s", em.s);
    cr_assert_eq(dt_npy_read_f32(P("p.npy"), &info, -1, 2, y, &em), DT_EINVAL);
}

Test(npy, partial_reads_f16_across_chunks)
{
    /* Larger than the reader's conversion buffer, so ranges cross chunks. */
    int64_t n = 300001;
    float *x = malloc((size_t)n * sizeof(float)), *y = malloc((size_t)n * sizeof(float));
    dt_npy_info_t info;
    dt_emsg_t em = { "" };
    struct { int64_t first, count; } r[] = { { 0, 300001 }, { 100000, 150000 },
                                             { 131071, 3 }, { 300000, 1 } };

    for (int64_t i = 0; i < n; i++)
        x[i] = (float)(i % 2048 - 1024) * 0.25f; /* exact in binary16 */
    cr_assert_eq(dt_npy_save(P("big.npy"), DT_F16, 1, &n, x, &em), 0, "%s", em.s);
    cr_assert_eq(dt_npy_read_header(P("big.npy"), &info, &em), 0, "%s", em.s);
    cr_assert_eq(info.count, n);
    for (size_t k = 0; k < sizeof(r) / sizeof(r[0]); k++) {
        cr_assert_eq(dt_npy_read_f32(P("big.npy"), &info, r[k].first, r[k].count, y, &em), 0,
                     "%s", em.s);
        for (int64_t i = 0; i < r[k].count; i++)
            cr_assert_eq(y[i], x[r[k].first + i], "[%ld, +%ld) element %ld",
                         (long)r[k].first, (long)r[k].count, (long)i);
    }
    free(x);
    free(y);
}

Test(npy, read_i64)
{
    int64_t shape[] = { 2, 3 };
    int64_t x[] = { 0, -1, INT64_MAX, INT64_MIN, (int64_t)1 << 40, 123456789 }, y[6];
    unsigned char buf[256];
    dt_npy_info_t info;
    dt_emsg_t em = { "" };
    int64_t one = 1;
    float f = 0.5f;

    cr_assert_eq(dt_npy_save(P("pos.npy"), DT_I64, 2, shape, x, &em), 0, "%s", em.s);
    read_bytes(P("pos.npy"), buf, sizeof(buf));
    cr_assert_not_null(memmem(buf, 128, "{'descr': '<i8', 'fortran_order': False, "
                                        "'shape': (2, 3), }", 59));
    cr_assert_eq(dt_npy_read_header(P("pos.npy"), &info, &em), 0, "%s", em.s);
    cr_assert_eq(info.dtype, DT_I64);
    cr_assert_eq(info.count, 6);
    cr_assert_eq(dt_npy_read_i64(P("pos.npy"), &info, y, &em), 0, "%s", em.s);
    for (int i = 0; i < 6; i++)
        cr_assert_eq(y[i], x[i]);

    /* int64 is not read as float, nor float as int64. */
    cr_assert_eq(dt_npy_read_f32(P("pos.npy"), &info, 0, 1, &f, &em), DT_EDTYPE);
    cr_assert_not_null(strstr(em.s, "int64"), "%s", em.s);
    cr_assert_eq(dt_npy_save(P("f.npy"), DT_F32, 1, &one, &f, &em), 0, "%s", em.s);
    cr_assert_eq(dt_npy_read_header(P("f.npy"), &info, &em), 0, "%s", em.s);
    cr_assert_eq(dt_npy_read_i64(P("f.npy"), &info, y, &em), DT_EDTYPE);
    cr_assert_not_null(strstr(em.s, "expected int64"), "%s", em.s);
}

/* int32 ('<i4', token ids) is written and its header parsed; its data is
 * io/tokshard.c's to read, not the float reader's. */
Test(npy, int32_header)
{
    int64_t shape[] = { 3 };
    int32_t x[] = { 0, -1, INT32_MAX };
    unsigned char buf[256];
    dt_npy_info_t info;
    dt_emsg_t em = { "" };
    float f;

    cr_assert_eq(dt_npy_save(P("ids.npy"), DT_I32, 1, shape, x, &em), 0, "%s", em.s);
    read_bytes(P("ids.npy"), buf, sizeof(buf));
    cr_assert_not_null(memmem(buf, 128, "{'descr': '<i4', 'fortran_order': False, "
                                        "'shape': (3,), }", 57));
    cr_assert_eq(memcmp(buf + 128, x, sizeof(x)), 0);
    cr_assert_eq(dt_npy_read_header(P("ids.npy"), &info, &em), 0, "%s", em.s);
    cr_assert_eq(info.dtype, DT_I32);
    cr_assert_eq(info.count, 3);
    cr_assert_eq(info.data_offset, 128);
    cr_assert_eq(dt_npy_read_f32(P("ids.npy"), &info, 0, 1, &f, &em), DT_EDTYPE);
    cr_assert_not_null(strstr(em.s, "dtype is int32"), "%s", em.s);
}

/* int32 or int64 read as int64 (document lengths), bool and uint8 as
 * bytes (block masks): a bool other than 0 or 1 is refused, and neither
 * reader takes the other's dtypes. */
Test(npy, ints_and_bytes)
{
    int64_t n3 = 3, n4 = 4, y[4];
    int32_t x32[] = { 7, -2, INT32_MAX };
    int64_t x64[] = { 1, (int64_t)1 << 40, -5, 0 };
    uint8_t b[] = { 0, 1, 1, 0 }, u[] = { 0, 1, 2, 255 }, got[4];
    unsigned char buf[256];
    dt_npy_info_t info;
    dt_emsg_t em = { "" };

    cr_assert_eq(dt_npy_save(P("i32.npy"), DT_I32, 1, &n3, x32, &em), 0, "%s", em.s);
    cr_assert_eq(dt_npy_read_header(P("i32.npy"), &info, &em), 0, "%s", em.s);
    cr_assert_eq(dt_npy_read_ints(P("i32.npy"), &info, y, &em), 0, "%s", em.s);
    for (int i = 0; i < 3; i++)
        cr_assert_eq(y[i], x32[i]);
    cr_assert_eq(dt_npy_save(P("i64.npy"), DT_I64, 1, &n4, x64, &em), 0, "%s", em.s);
    cr_assert_eq(dt_npy_read_header(P("i64.npy"), &info, &em), 0, "%s", em.s);
    cr_assert_eq(dt_npy_read_ints(P("i64.npy"), &info, y, &em), 0, "%s", em.s);
    cr_assert_eq(memcmp(y, x64, sizeof(x64)), 0);
    cr_assert_eq(dt_npy_read_bytes(P("i64.npy"), &info, got, &em), DT_EDTYPE);
    cr_assert(strstr(em.s, "dtype is int64, expected bool or uint8"), "%s", em.s);

    cr_assert_eq(dt_npy_save(P("b.npy"), DT_BOOL, 1, &n4, b, &em), 0, "%s", em.s);
    read_bytes(P("b.npy"), buf, sizeof(buf));
    cr_assert_not_null(memmem(buf, 128, "{'descr': '|b1', 'fortran_order': False, "
                                        "'shape': (4,), }", 57));
    cr_assert_eq(dt_npy_read_header(P("b.npy"), &info, &em), 0, "%s", em.s);
    cr_assert_eq(info.dtype, DT_BOOL);
    cr_assert_eq(dt_npy_read_bytes(P("b.npy"), &info, got, &em), 0, "%s", em.s);
    cr_assert_eq(memcmp(got, b, 4), 0);
    cr_assert_eq(dt_npy_read_ints(P("b.npy"), &info, y, &em), DT_EDTYPE);
    cr_assert(strstr(em.s, "dtype is bool, expected int32 or int64"), "%s", em.s);

    cr_assert_eq(dt_npy_save(P("u.npy"), DT_U8, 1, &n4, u, &em), 0, "%s", em.s);
    cr_assert_eq(dt_npy_read_header(P("u.npy"), &info, &em), 0, "%s", em.s);
    cr_assert_eq(info.dtype, DT_U8);
    cr_assert_eq(dt_npy_read_bytes(P("u.npy"), &info, got, &em), 0, "%s", em.s);
    cr_assert_eq(memcmp(got, u, 4), 0);
    /* the same bytes called bool: 2 and 255 are not booleans */
    cr_assert_eq(dt_npy_save(P("bad.npy"), DT_BOOL, 1, &n4, u, &em), 0, "%s", em.s);
    cr_assert_eq(dt_npy_read_header(P("bad.npy"), &info, &em), 0, "%s", em.s);
    cr_assert_eq(dt_npy_read_bytes(P("bad.npy"), &info, got, &em), DT_EFORMAT);
    cr_assert(strstr(em.s, "element 2 of a bool array is 2"), "%s", em.s);
}

/* The header from the first bytes of a file whose size is given: what a
 * reader that does not load the file passes (io/tokshard.c). */
Test(npy, parse_head_and_header_len)
{
    int64_t shape[] = { 4 };
    int64_t x[] = { 1, 2, 3, 4 };
    unsigned char buf[128 + 32];
    dt_npy_info_t info;
    dt_emsg_t em = { "" };
    size_t len = 1;

    cr_assert_eq(dt_npy_save(P("h.npy"), DT_I64, 1, shape, x, &em), 0, "%s", em.s);
    cr_assert_eq(read_bytes(P("h.npy"), buf, sizeof(buf)), sizeof(buf));
    cr_assert_eq(dt_npy_header_len("mem", buf, 12, sizeof(buf), &len, &em), 0, "%s", em.s);
    cr_assert_eq(len, 128);
    cr_assert_eq(dt_npy_parse_head("mem", buf, 128, sizeof(buf), &info, &em), 0, "%s", em.s);
    cr_assert_eq(info.count, 4);
    cr_assert_eq(info.data_offset, 128);
    /* the size is checked against the shape, the bytes past it ignored */
    cr_assert_eq(dt_npy_parse_head("mem", buf, 128, sizeof(buf) - 8, &info, &em), DT_EFORMAT);
    cr_assert(strstr(em.s, "mem: data is truncated"), "%s", em.s);
    cr_assert_eq(info.count, 0);
    cr_assert_eq(dt_npy_parse_head("mem", buf, sizeof(buf), 100, &info, &em), DT_EFORMAT);
    cr_assert(strstr(em.s, "header is truncated (header needs 128 bytes, file has 100)"), "%s",
              em.s);
    /* a head that stops inside the header */
    cr_assert_eq(dt_npy_parse_head("mem", buf, 64, sizeof(buf), &info, &em), DT_EFORMAT);
    cr_assert(strstr(em.s, "mem: header is truncated (it needs 128 bytes, 64 were read)"), "%s",
              em.s);
    /* not a .npy file, or a length past the end */
    cr_assert_eq(dt_npy_header_len("mem", "\x93NUMPZ\x01\x00\x76\x00", 10, 1000, &len, &em),
                 DT_EFORMAT);
    cr_assert(strstr(em.s, "bad magic"), "%s", em.s);
    cr_assert_eq(len, 0);
    cr_assert_eq(dt_npy_header_len("mem", buf, 12, 50, &len, &em), DT_EFORMAT);
    cr_assert(strstr(em.s, "header needs 128 bytes, file has 50"), "%s", em.s);
}

Test(npy, dtype_names)
{
    cr_assert_str_eq(dt_npy_dtype_name(DT_F32), "float32");
    cr_assert_str_eq(dt_npy_dtype_name(DT_F16), "float16");
    cr_assert_str_eq(dt_npy_dtype_name(DT_I32), "int32");
    cr_assert_str_eq(dt_npy_dtype_name(DT_I64), "int64");
    cr_assert_str_eq(dt_npy_dtype_name(DT_U8), "uint8");
    cr_assert_str_eq(dt_npy_dtype_name(DT_BOOL), "bool");
    cr_assert_eq(dt_npy_dtype_size(DT_F32), 4);
    cr_assert_eq(dt_npy_dtype_size(DT_F16), 2);
    cr_assert_eq(dt_npy_dtype_size(DT_I32), 4);
    cr_assert_eq(dt_npy_dtype_size(DT_I64), 8);
}

/*-- the atomic writer ------------------------------------------------------*/

Test(npy, pwrite_out_of_order)
{
    int64_t shape[] = { 4, 25 };
    float x[100], y[100];
    dt_npy_writer_t *w;
    dt_npy_info_t info;
    dt_emsg_t em = { "" };
    char names[256];

    for (int i = 0; i < 100; i++)
        x[i] = (float)i + 0.5f;
    for (int d = 0; d < 2; d++) {
        dt_dtype_t t = d ? DT_F16 : DT_F32;
        const char *name = d ? "o16.npy" : "o32.npy";

        cr_assert_eq(dt_npy_writer_open(P(name), t, 2, shape, &w, &em), 0, "%s", em.s);
        /* Not visible until commit. */
        cr_assert_eq(access(P(name), F_OK), -1);
        cr_assert_eq(dt_npy_writer_pwrite(w, 75, 25, x + 75, &em), 0, "%s", em.s);
        cr_assert_eq(dt_npy_writer_pwrite(w, 0, 25, x, &em), 0, "%s", em.s);
        cr_assert_eq(dt_npy_writer_pwrite(w, 60, 15, x + 60, &em), 0, "%s", em.s);
        cr_assert_eq(dt_npy_writer_pwrite(w, 50, 10, x + 50, &em), 0, "%s", em.s);
        /* [25, 50) never written: reads as zeros. */
        cr_assert_eq(dt_npy_writer_commit(w, &em), 0, "%s", em.s);
        cr_assert_eq(dt_npy_read_header(P(name), &info, &em), 0, "%s", em.s);
        cr_assert_eq(info.dtype, t);
        cr_assert_eq(dt_npy_read_f32(P(name), &info, 0, 100, y, &em), 0, "%s", em.s);
        for (int i = 0; i < 100; i++)
            cr_assert_eq(y[i], i >= 25 && i < 50 ? 0.0f : x[i], "%s element %d: %g", name, i,
                         y[i]);
    }
    cr_assert_eq(list_dir(tmpdir, names, sizeof(names)), 2, "files: %s", names);
}

Test(npy, abort_leaves_no_file)
{
    int64_t n = 8;
    float x[8] = { 1, 2, 3, 4, 5, 6, 7, 8 };
    dt_npy_writer_t *w;
    dt_emsg_t em = { "" };
    char names[256];

    cr_assert_eq(dt_npy_writer_open(P("new.npy"), DT_F32, 1, &n, &w, &em), 0, "%s", em.s);
    cr_assert_eq(list_dir(tmpdir, names, sizeof(names)), 1, "files: %s", names);
    cr_assert_eq(names[0], '.', "temp file is hidden: %s", names);
    cr_assert_not_null(strstr(names, ".new.npy.tmp."), "temp file name: %s", names);
    cr_assert_eq(dt_npy_writer_pwrite(w, 0, 8, x, &em), 0, "%s", em.s);
    dt_npy_writer_abort(w);
    cr_assert_eq(list_dir(tmpdir, names, sizeof(names)), 0, "files left: %s", names);
    dt_npy_writer_abort(NULL);
}

Test(npy, abort_keeps_existing_target)
{
    int64_t n = 4;
    float old[4] = { 1, 2, 3, 4 }, x[4] = { 9, 9, 9, 9 };
    unsigned char before[512], after[512];
    size_t nb, na;
    dt_npy_writer_t *w;
    dt_emsg_t em = { "" };
    char names[256];

    cr_assert_eq(dt_npy_save(P("t.npy"), DT_F32, 1, &n, old, &em), 0, "%s", em.s);
    nb = read_bytes(P("t.npy"), before, sizeof(before));
    cr_assert_eq(dt_npy_writer_open(P("t.npy"), DT_F16, 1, &n, &w, &em), 0, "%s", em.s);
    cr_assert_eq(dt_npy_writer_pwrite(w, 0, 4, x, &em), 0, "%s", em.s);
    na = read_bytes(P("t.npy"), after, sizeof(after));
    cr_assert(na == nb && memcmp(before, after, nb) == 0, "target changed before commit");
    dt_npy_writer_abort(w);
    na = read_bytes(P("t.npy"), after, sizeof(after));
    cr_assert(na == nb && memcmp(before, after, nb) == 0, "target changed by abort");
    cr_assert_eq(list_dir(tmpdir, names, sizeof(names)), 1, "files: %s", names);
    cr_assert_str_eq(names, "t.npy");
}

Test(npy, commit_replaces_existing_target)
{
    int64_t n = 2, m = 3;
    float a[2] = { 1, 2 }, b[3] = { 7, 8, 9 }, y[3];
    dt_npy_info_t info;
    dt_emsg_t em = { "" };
    char names[256];

    cr_assert_eq(dt_npy_save(P("t.npy"), DT_F32, 1, &n, a, &em), 0, "%s", em.s);
    cr_assert_eq(dt_npy_save(P("t.npy"), DT_F32, 1, &m, b, &em), 0, "%s", em.s);
    cr_assert_eq(dt_npy_read_header(P("t.npy"), &info, &em), 0, "%s", em.s);
    cr_assert_eq(info.count, 3);
    cr_assert_eq(dt_npy_read_f32(P("t.npy"), &info, 0, 3, y, &em), 0, "%s", em.s);
    cr_assert(y[0] == 7 && y[1] == 8 && y[2] == 9);
    cr_assert_eq(list_dir(tmpdir, names, sizeof(names)), 1, "files: %s", names);
}

Test(npy, failed_commit_leaves_no_temp)
{
    /* The target is a non-empty directory: the rename fails. */
    int64_t n = 4;
    float x[4] = { 1, 2, 3, 4 };
    dt_npy_writer_t *w;
    dt_emsg_t em = { "" };
    char names[256];

    cr_assert_eq(mkdir(P("d.npy"), 0700), 0);
    write_bytes(P("d.npy/keep"), "k", 1);
    cr_assert_eq(dt_npy_writer_open(P("d.npy"), DT_F32, 1, &n, &w, &em), 0, "%s", em.s);
    cr_assert_eq(dt_npy_writer_pwrite(w, 0, 4, x, &em), 0, "%s", em.s);
    cr_assert_lt(dt_npy_writer_commit(w, &em), 0);
    cr_assert_not_null(strstr(em.s, P("d.npy")), "%s", em.s);
    cr_assert_not_null(strstr(em.s, "rename"), "%s", em.s);
    cr_assert_eq(list_dir(tmpdir, names, sizeof(names)), 1, "files: %s", names);
    cr_assert_str_eq(names, "d.npy");
    cr_assert_eq(list_dir(P("d.npy"), names, sizeof(names)), 1, "files: %s", names);
}

Test(npy, failed_pwrite_refuses_commit)
{
    int64_t n = 4;
    float x[8] = { 0 };
    dt_npy_writer_t *w;
    dt_emsg_t em = { "" };
    char names[256];

    cr_assert_eq(dt_npy_writer_open(P("w.npy"), DT_F32, 1, &n, &w, &em), 0, "%s", em.s);
    cr_assert_eq(dt_npy_writer_pwrite(w, 2, 3, x, &em), DT_EINVAL);
    cr_assert_not_null(strstr(em.s, "[2, 5) are outside [0, 4)"), "%s", em.s);
    cr_assert_eq(dt_npy_writer_pwrite(w, 0, 4, x, &em), 0, "%s", em.s);
    cr_assert_eq(dt_npy_writer_commit(w, &em), DT_EINVAL);
    cr_assert_not_null(strstr(em.s, "earlier write failed"), "%s", em.s);
    cr_assert_eq(list_dir(tmpdir, names, sizeof(names)), 0, "files left: %s", names);
}

Test(npy, failed_open_leaves_no_temp)
{
    /* No such directory. */
    int64_t n = 1 << 20;
    dt_npy_writer_t *w = (dt_npy_writer_t *)&n;
    dt_emsg_t em = { "" };
    struct rlimit old, lim = { 65536, 65536 };
    char names[256];

    cr_assert_eq(dt_npy_writer_open(P("nodir/x.npy"), DT_F32, 1, &n, &w, &em), DT_ENOENT);
    cr_assert_null(w);
    cr_assert_not_null(strstr(em.s, P("nodir/x.npy")), "%s", em.s);
    cr_assert_eq(list_dir(tmpdir, names, sizeof(names)), 0, "files left: %s", names);

    /* The file may not grow to its size (RLIMIT_FSIZE): the temp file was
     * created, sizing it fails, and it is removed. */
    signal(SIGXFSZ, SIG_IGN);
    cr_assert_eq(getrlimit(RLIMIT_FSIZE, &old), 0);
    cr_assert_eq(setrlimit(RLIMIT_FSIZE, &lim), 0);
    cr_assert_lt(dt_npy_writer_open(P("big.npy"), DT_F32, 1, &n, &w, &em), 0);
    setrlimit(RLIMIT_FSIZE, &old);
    cr_assert_not_null(strstr(em.s, P("big.npy")), "%s", em.s);
    cr_assert_eq(list_dir(tmpdir, names, sizeof(names)), 0, "files left: %s", names);

    /* Same through dt_npy_save. */
    cr_assert_lt(dt_npy_save(P("nodir/y.npy"), DT_F16, 1, &n, NULL, &em), 0);
    cr_assert_eq(list_dir(tmpdir, names, sizeof(names)), 0, "files left: %s", names);
}

/*-- accepted variants of the header ----------------------------------------*/

Test(npy, reads_versions_and_header_variants)
{
    struct { int major; const char *dict; int pad; } ok[] = {
        { 1, "{'descr': '<f4', 'fortran_order': False, 'shape': (2, 3), }", 1 },
        { 2, "{'descr': '<f4', 'fortran_order': False, 'shape': (2, 3), }", 1 },
        { 3, "{'descr': '<f4', 'fortran_order': False, 'shape': (2, 3), }", 1 },
        { 1, "{\"shape\": (2, 3,), \"fortran_order\": False, \"descr\": \"<f4\"}", 0 },
        { 1, "{ 'descr':'<f4','fortran_order':False,'shape':(2L, 3L) }   \n", 0 },
    };
    float y[6];

    for (size_t k = 0; k < sizeof(ok) / sizeof(ok[0]); k++) {
        dt_npy_info_t info;
        dt_emsg_t em = { "" };

        write_npy(P("v.npy"), ok[k].major, ok[k].dict, ok[k].pad, 24);
        cr_assert_eq(dt_npy_read_header(P("v.npy"), &info, &em), 0, "case %zu: %s", k, em.s);
        cr_assert_eq(info.ndim, 2);
        cr_assert(info.shape[0] == 2 && info.shape[1] == 3 && info.count == 6);
        cr_assert_eq(info.data_offset,
                     (ok[k].major == 1 ? 10 : 12) +
                         (ok[k].pad ? (ok[k].major == 1 ? 118 : 116) : strlen(ok[k].dict)));
        cr_assert_eq(dt_npy_read_f32(P("v.npy"), &info, 0, 6, y, &em), 0, "%s", em.s);
        cr_assert_eq(fbits(y[0]), 0x03020100u);
        cr_assert_eq(fbits(y[5]), 0x17161514u);
    }
}

/*-- refusals, each with the message the user sees ---------------------------*/

#define F4(shape) "{'descr': '<f4', 'fortran_order': False, 'shape': " shape ", }"

Test(npy, refuses_missing_file)
{
    refused(P("nope.npy"), DT_ENOENT, "No such file", NULL);
}

Test(npy, refuses_directory_and_fifo)
{
    cr_assert_eq(mkdir(P("dir.npy"), 0700), 0);
    refused(P("dir.npy"), DT_EINVAL, "is a directory", NULL);
    cr_assert_eq(mkfifo(P("fifo.npy"), 0600), 0); /* must not hang */
    refused(P("fifo.npy"), DT_EINVAL, "not a regular file", NULL);
}

Test(npy, refuses_fortran_order)
{
    write_npy(P("f.npy"), 1, "{'descr': '<f4', 'fortran_order': True, 'shape': (2, 3), }", 1,
              24);
    refused(P("f.npy"), DT_EDTYPE, "Fortran order is not supported", NULL);
}

/* float64 (reference values) is read, rounded to float32 */
Test(npy, reads_f8_as_f32)
{
    const double v[3] = { 1.0 / 3.0, -2.5, 1e-40 };
    int64_t n = 3;
    dt_npy_info_t info;
    dt_emsg_t em = { "" };
    float got[3];

    cr_assert_eq(dt_npy_save(P("d.npy"), DT_F64, 1, &n, v, &em), 0, "%s", em.s);
    cr_assert_eq(dt_npy_read_header(P("d.npy"), &info, &em), 0, "%s", em.s);
    cr_assert_eq(info.dtype, DT_F64);
    cr_assert_eq(info.count, 3);
    cr_assert_eq(dt_npy_read_f32(P("d.npy"), &info, 0, 3, got, &em), 0, "%s", em.s);
    for (int i = 0; i < 3; i++)
        cr_assert_eq(got[i], (float)v[i], "element %d: %a, want %a", i, got[i], (float)v[i]);
}

Test(npy, refuses_other_dtypes)
{
    write_npy(P("u.npy"), 1, "{'descr': '|i1', 'fortran_order': False, 'shape': (3,), }", 1,
              3);
    refused(P("u.npy"), DT_EDTYPE, "dtype '|i1' is not supported", "uint8 or bool");
    write_npy(P("s.npy"), 1,
              "{'descr': [('a', '<f4')], 'fortran_order': False, 'shape': (3,), }", 1, 12);
    refused(P("s.npy"), DT_EDTYPE, "structured dtypes are not supported", NULL);
}

Test(npy, refuses_big_endian)
{
    write_npy(P("be.npy"), 1, "{'descr': '>f4', 'fortran_order': False, 'shape': (3,), }", 1,
              12);
    refused(P("be.npy"), DT_EDTYPE, "'>f4' is big-endian", NULL);
}

Test(npy, refuses_bad_magic)
{
    unsigned char b[128] = "\x93NUMPZ\x01\x00\x76\x00";

    write_bytes(P("m.npy"), b, sizeof(b));
    refused(P("m.npy"), DT_EFORMAT, "not a .npy file (bad magic)", NULL);
    write_bytes(P("t.npy"), "hello, world\n", 13);
    refused(P("t.npy"), DT_EFORMAT, "bad magic", NULL);
    write_bytes(P("e.npy"), "", 0);
    refused(P("e.npy"), DT_EFORMAT, "not a .npy file (it is empty)", NULL);
    write_bytes(P("v.npy"), "\x93NUMPY\x04\x00\x10\x00{}", 12);
    refused(P("v.npy"), DT_EFORMAT, "version 4.0 is not supported", NULL);
}

Test(npy, refuses_truncated_header)
{
    unsigned char b[64] = "\x93NUMPY\x01\x00\x76\x00{'descr': '<f4', 'fortran_order': Fal";

    write_bytes(P("h.npy"), b, 10 + 37);
    refused(P("h.npy"), DT_EFORMAT, "header is truncated", "needs 128 bytes, file has 47");
    write_bytes(P("p.npy"), b, 9); /* inside the length field */
    refused(P("p.npy"), DT_EFORMAT, "header is truncated", NULL);
    write_bytes(P("q.npy"), b, 4); /* inside the magic */
    refused(P("q.npy"), DT_EFORMAT, "truncated", NULL);
}

Test(npy, refuses_header_too_long)
{
    /* Version 2.0 with a 256 MiB header length: refused from the length
     * alone, before anything is allocated or read. */
    unsigned char b[4096] = "\x93NUMPY\x02\x00\x00\x00\x00\x10";

    memcpy(b + 12, F4("(3,)"), strlen(F4("(3,)")));
    write_bytes(P("l.npy"), b, sizeof(b));
    refused(P("l.npy"), DT_EFORMAT, "header length 268435456 exceeds the limit", NULL);
    b[11] = 0x80; /* 2 GiB: no sign confusion */
    write_bytes(P("l.npy"), b, sizeof(b));
    refused(P("l.npy"), DT_EFORMAT, "header length 2147483648 exceeds", NULL);
}

Test(npy, refuses_short_data)
{
    float y[10];
    dt_npy_info_t info = { .dtype = DT_F32, .ndim = 1, .shape = { 10 }, .count = 10,
                           .data_offset = 128 };
    dt_emsg_t em = { "" };

    write_npy(P("d.npy"), 1, F4("(10,)"), 1, 20);
    refused(P("d.npy"), DT_EFORMAT, "data is truncated: shape (10,) float32 needs 40 bytes",
            "the file has 20");
    write_npy(P("d2.npy"), 1, F4("(2, 2)"), 1, 15);
    refused(P("d2.npy"), DT_EFORMAT, "shape (2, 2) float32 needs 16 bytes", NULL);

    /* A file that shrank after its header was read: the reader says so. */
    cr_assert_eq(dt_npy_read_f32(P("d.npy"), &info, 0, 10, y, &em), DT_EFORMAT);
    cr_assert_not_null(strstr(em.s, "data is truncated"), "%s", em.s);
}

/* A file longer than its header and data is not what its header says (two
 * files concatenated, a writer that went wrong): refused, the excess
 * named; from a file and from memory alike. */
Test(npy, refuses_trailing_bytes)
{
    static unsigned char img[10 + 118 + 24 + 1];
    dt_npy_info_t info;
    dt_emsg_t em = { "" };

    write_npy(P("t.npy"), 1, F4("(2, 3)"), 1, 24 + 76);
    refused(P("t.npy"), DT_EFORMAT, "76 bytes after the data",
            "shape (2, 3) float32 is 24 bytes from offset 128, the file has 100");
    write_npy(P("t1.npy"), 1, F4("(2, 3)"), 1, 24 + 1);
    refused(P("t1.npy"), DT_EFORMAT, "1 bytes after the data", NULL);
    cr_assert_eq(read_bytes(P("t1.npy"), img, sizeof(img)), sizeof(img));
    cr_assert_eq(dt_npy_parse_header("mem", img, sizeof(img), &info, &em), DT_EFORMAT);
    cr_assert(strstr(em.s, "mem: 1 bytes after the data"), "%s", em.s);
    cr_assert_eq(dt_npy_parse_header("mem", img, sizeof(img) - 1, &info, &em), 0, "%s", em.s);
    cr_assert_eq(info.count, 6);
    cr_assert_eq(dt_npy_parse_header("mem", img, sizeof(img) - 2, &info, &em), DT_EFORMAT);
    cr_assert(strstr(em.s, "data is truncated"), "%s", em.s);
}

/* What dt writes is the owner's alone: 0600 whatever the umask. */
Test(npy, written_file_is_private)
{
    float x[4] = { 1, 2, 3, 4 };
    int64_t shape[1] = { 4 };
    dt_emsg_t em = { "" };
    struct stat st;
    mode_t old = umask(0);

    cr_assert_eq(dt_npy_save(P("o.npy"), DT_F32, 1, shape, x, &em), 0, "%s", em.s);
    umask(old);
    cr_assert_eq(stat(P("o.npy"), &st), 0);
    cr_assert_eq(st.st_mode & 07777, 0600, "mode %o", (unsigned)(st.st_mode & 07777));
}

Test(npy, refuses_non_tuple_shape)
{
    write_npy(P("a.npy"), 1, F4("3"), 1, 12);
    refused(P("a.npy"), DT_EFORMAT, "'shape' is not a tuple", NULL);
    write_npy(P("b.npy"), 1, F4("[3]"), 1, 12);
    refused(P("b.npy"), DT_EFORMAT, "'shape' is not a tuple", NULL);
    write_npy(P("c.npy"), 1, F4("(3)"), 1, 12);
    refused(P("c.npy"), DT_EFORMAT, "'shape' (3) is not a tuple", NULL);
    write_npy(P("d.npy"), 1, F4("'(3,)'"), 1, 12);
    refused(P("d.npy"), DT_EFORMAT, "'shape' is not a tuple", NULL);
}

Test(npy, refuses_garbage_in_dict)
{
    struct { const char *dict; const char *needle; } bad[] = {
        { "{'descr': '<f4', 'fortran_order': False, 'shape': (3,), 'x': 1, }",
          "unexpected key 'x'" },
        { "{'descr': '<f4' 'fortran_order': False, 'shape': (3,), }",
          "expected ',' or '}' at offset 16, found '''" },
        { F4("(3,)") "junk", "expected only padding after the dict" },
        { "{'descr': '<f4', 'fortran_order': False, }", "no 'shape' key" },
        { "{'descr': '<f4', 'shape': (3,), }", "no 'fortran_order' key" },
        { "{'descr': '<f4', 'descr': '<f4', 'fortran_order': False, 'shape': (3,), }",
          "duplicate key 'descr'" },
        { "{'descr': '<f4', 'fortran_order': 0, 'shape': (3,), }", "True or False" },
        { F4("(3, -1)"), "negative dimension" },
        { F4("(3,,)"), "expected a dimension" },
        { F4("(3 4)"), "expected ',' or ')'" },
        { F4("(99999999999999999999,)"), "too large" },
        { F4("(4294967296, 4294967296, 4)"), "shape is too large" },
        { F4("(1, 1, 1, 1, 1, 1, 1, 1, 1)"), "more than 8 dimensions" },
        { "{'descr': '<f4, 'fortran_order': False, 'shape': (3,), }", "malformed header" },
        { "{'descr': '<f4', 'fortran_order': False, 'shape': (3,), ", "expected a quoted key" },
        { "descr: <f4", "expected '{'" },
        { "{descr: '<f4'}", "expected a quoted key or '}' at offset 1, found 'd'" },
        { "{'descr': '<f4', 'fortran_order': False, 'sha\x01pe': (3,), }", "byte 0x01" },
        { "{'descr': '<f\\x34', 'fortran_order': False, 'shape': (3,), }",
          "expected a plain string character" },
        { "", "expected '{' at offset 54, found end of header" }, /* all padding */
    };

    for (size_t k = 0; k < sizeof(bad) / sizeof(bad[0]); k++) {
        char name[32];

        snprintf(name, sizeof(name), "g%zu.npy", k);
        write_npy(P(name), 1, bad[k].dict, 1, 64);
        refused(P(name), DT_EFORMAT, bad[k].needle, NULL);
    }
}
