/* SPDX-License-Identifier: MIT
 *
 * common/half: fp32 -> fp16/bf16 against known bit patterns (round to
 * nearest even, ties both ways, subnormals, overflow, inf, NaN) and the
 * exact widening back, over every 16-bit pattern.
 */
#include "config.h"

#include <criterion/criterion.h>
#include <math.h>
#include <stdint.h>
#include <string.h>

#include "common/half.h"

static float bitsf(uint32_t x)
{
    float f;

    memcpy(&f, &x, sizeof(f));
    return f;
}

static uint32_t fbits(float f)
{
    uint32_t x;

    memcpy(&x, &f, sizeof(x));
    return x;
}

typedef struct {
    uint32_t f32;  /* the input's bits */
    uint16_t f16;  /* dt_f32_to_f16 */
    uint16_t bf16; /* dt_f32_to_bf16 */
} pattern_t;

static const pattern_t patterns[] = {
    { .f32 = 0x00000000, .f16 = 0x0000, .bf16 = 0x0000 }, /* +0 */
    { .f32 = 0x80000000, .f16 = 0x8000, .bf16 = 0x8000 }, /* -0 */
    { .f32 = 0x3f800000, .f16 = 0x3c00, .bf16 = 0x3f80 }, /* 1 */
    { .f32 = 0xbf800000, .f16 = 0xbc00, .bf16 = 0xbf80 }, /* -1 */
    { .f32 = 0x3dcccccd, .f16 = 0x2e66, .bf16 = 0x3dcd }, /* 0.1 */
    { .f32 = 0x3eaaaaab, .f16 = 0x3555, .bf16 = 0x3eab }, /* 1/3 */
    /* ties: 1 + 2^-11 (fp16 half-ulp), 1 + 3 * 2^-11 */
    { .f32 = 0x3f801000, .f16 = 0x3c00, .bf16 = 0x3f80 }, /* to even: down */
    { .f32 = 0x3f803000, .f16 = 0x3c02, .bf16 = 0x3f80 }, /* to even: up */
    { .f32 = 0x3f801001, .f16 = 0x3c01, .bf16 = 0x3f80 }, /* just above a tie */
    /* bf16 ties: 1 + 2^-8, 1 + 3 * 2^-8 */
    { .f32 = 0x3f808000, .f16 = 0x3c04, .bf16 = 0x3f80 }, /* to even: down */
    { .f32 = 0x3f818000, .f16 = 0x3c0c, .bf16 = 0x3f82 }, /* to even: up */
    /* the top of fp16 */
    { .f32 = 0x477fe000, .f16 = 0x7bff, .bf16 = 0x4780 }, /* 65504, the largest */
    { .f32 = 0x477fefff, .f16 = 0x7bff, .bf16 = 0x4780 }, /* 65519.99 */
    { .f32 = 0x477ff000, .f16 = 0x7c00, .bf16 = 0x4780 }, /* 65520: overflows */
    { .f32 = 0xc77ff000, .f16 = 0xfc00, .bf16 = 0xc780 }, /* -65520 */
    { .f32 = 0x7f7fffff, .f16 = 0x7c00, .bf16 = 0x7f80 }, /* FLT_MAX: bf16 too */
    { .f32 = 0x7f800000, .f16 = 0x7c00, .bf16 = 0x7f80 }, /* +inf */
    { .f32 = 0xff800000, .f16 = 0xfc00, .bf16 = 0xff80 }, /* -inf */
    /* the bottom of fp16 */
    { .f32 = 0x38800000, .f16 = 0x0400, .bf16 = 0x3880 }, /* 2^-14, smallest normal */
    { .f32 = 0x387fc000, .f16 = 0x03ff, .bf16 = 0x3880 }, /* largest subnormal */
    { .f32 = 0x387fe000, .f16 = 0x0400, .bf16 = 0x3880 }, /* rounds up into the normals */
    { .f32 = 0x33800000, .f16 = 0x0001, .bf16 = 0x3380 }, /* 2^-24, smallest subnormal */
    { .f32 = 0x33c00000, .f16 = 0x0002, .bf16 = 0x33c0 }, /* 1.5 * 2^-24: tie, to even */
    { .f32 = 0x34200000, .f16 = 0x0002, .bf16 = 0x3420 }, /* 2.5 * 2^-24: tie, to even */
    { .f32 = 0x33000000, .f16 = 0x0000, .bf16 = 0x3300 }, /* 2^-25: tie, to even 0 */
    { .f32 = 0x33000001, .f16 = 0x0001, .bf16 = 0x3300 }, /* above 2^-25: up */
    { .f32 = 0xb3000000, .f16 = 0x8000, .bf16 = 0xb300 }, /* -2^-25: -0 */
    { .f32 = 0x00000001, .f16 = 0x0000, .bf16 = 0x0000 }, /* fp32 subnormal */
    { .f32 = 0x007fffff, .f16 = 0x0000, .bf16 = 0x0080 }, /* bf16: rounds to a normal */
};

Test(half, known_patterns)
{
    for (size_t i = 0; i < sizeof(patterns) / sizeof(patterns[0]); i++) {
        const pattern_t *p = &patterns[i];
        float f = bitsf(p->f32);

        cr_expect_eq(dt_f32_to_f16(f), p->f16, "fp16(0x%08x) = 0x%04x, want 0x%04x", p->f32,
                     dt_f32_to_f16(f), p->f16);
        cr_expect_eq(dt_f32_to_bf16(f), p->bf16, "bf16(0x%08x) = 0x%04x, want 0x%04x", p->f32,
                     dt_f32_to_bf16(f), p->bf16);
    }
}

Test(half, nan_stays_nan)
{
    static const uint32_t nans[] = { 0x7fc00000, 0xffc00000, 0x7f800001, 0x7fbfffff,
                                     0xff800001, 0x7fffffff };

    for (size_t i = 0; i < sizeof(nans) / sizeof(nans[0]); i++) {
        uint16_t h = dt_f32_to_f16(bitsf(nans[i])), b = dt_f32_to_bf16(bitsf(nans[i]));

        cr_expect((h & 0x7c00) == 0x7c00 && (h & 0x3ff), "fp16(0x%08x) = 0x%04x", nans[i], h);
        cr_expect((b & 0x7f80) == 0x7f80 && (b & 0x7f), "bf16(0x%08x) = 0x%04x", nans[i], b);
        cr_expect_eq(h & 0x8000, (nans[i] >> 16) & 0x8000, "fp16 NaN keeps its sign");
        cr_expect_eq(b & 0x8000, (nans[i] >> 16) & 0x8000, "bf16 NaN keeps its sign");
        cr_expect(isnan(dt_f16_to_f32(h)) && isnan(dt_bf16_to_f32(b)));
    }
    cr_expect_eq(dt_f32_to_f16(bitsf(0x7fc00000)), 0x7e00); /* the canonical quiet NaN */
}

Test(half, widening)
{
    cr_expect_eq(fbits(dt_f16_to_f32(0x0001)), fbits(0x1p-24f));
    cr_expect_eq(fbits(dt_f16_to_f32(0x03ff)), fbits(1023 * 0x1p-24f));
    cr_expect_eq(fbits(dt_f16_to_f32(0x0400)), fbits(0x1p-14f));
    cr_expect_eq(fbits(dt_f16_to_f32(0x7bff)), fbits(65504.0f));
    cr_expect_eq(fbits(dt_f16_to_f32(0x8000)), 0x80000000u);
    cr_expect_eq(fbits(dt_f16_to_f32(0xfc00)), fbits(-INFINITY));
    cr_expect_eq(fbits(dt_bf16_to_f32(0x3f80)), fbits(1.0f));
    cr_expect_eq(fbits(dt_bf16_to_f32(0x0001)), 0x00010000u); /* an fp32 subnormal */
    cr_expect_eq(fbits(dt_bf16_to_f32(0xff80)), fbits(-INFINITY));
}

/* Every finite 16-bit pattern widens exactly and narrows back to itself;
 * widening is monotonic over the positive fp16 patterns. */
Test(half, round_trip_every_pattern)
{
    int bad16 = 0, badb = 0, order = 0;

    for (uint32_t p = 0; p < 0x10000; p++) {
        uint16_t u = (uint16_t)p;

        if ((u & 0x7c00) != 0x7c00 && dt_f32_to_f16(dt_f16_to_f32(u)) != u)
            bad16++;
        if ((u & 0x7f80) != 0x7f80 && dt_f32_to_bf16(dt_bf16_to_f32(u)) != u)
            badb++;
        if (p > 0 && p <= 0x7c00 && !(dt_f16_to_f32(u) > dt_f16_to_f32((uint16_t)(p - 1))))
            order++;
    }
    cr_expect_eq(bad16, 0, "%d fp16 patterns do not round-trip", bad16);
    cr_expect_eq(badb, 0, "%d bf16 patterns do not round-trip", badb);
    cr_expect_eq(order, 0, "%d fp16 patterns out of order", order);
}

/* Between two neighbouring fp16 values every float goes to the nearer one,
 * a midpoint to the even one (checked at, just below and just above each
 * midpoint of the positive normals and subnormals). */
Test(half, midpoints)
{
    int bad = 0;

    for (uint32_t h = 0; h < 0x7bff; h++) {
        double a = dt_f16_to_f32((uint16_t)h), b = dt_f16_to_f32((uint16_t)(h + 1));
        float mid = (float)((a + b) / 2); /* exact in fp32 */
        uint16_t even = (h & 1) ? (uint16_t)(h + 1) : (uint16_t)h;

        if (dt_f32_to_f16(mid) != even)
            bad++;
        if (dt_f32_to_f16(nextafterf(mid, 0.0f)) != h)
            bad++;
        if (dt_f32_to_f16(nextafterf(mid, INFINITY)) != h + 1)
            bad++;
    }
    cr_expect_eq(bad, 0, "%d midpoints rounded wrong", bad);
}
