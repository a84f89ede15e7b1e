/* SPDX-License-Identifier: MIT
 *
 * fp16 and bf16 rounding (see half.h): integer arithmetic on the bits of a
 * binary32, round to nearest even throughout.
 */
#include "config.h"

#include <string.h>

#include "common/half.h"

static uint32_t f32_bits(float f)
{
    uint32_t x;

    memcpy(&x, &f, sizeof(x));
    return x;
}

static float bits_f32(uint32_t x)
{
    float f;

    memcpy(&f, &x, sizeof(f));
    return f;
}

/* m >> shift, rounded to nearest, ties to even (1 <= shift <= 31). */
static uint32_t shift_rne(uint32_t m, unsigned shift)
{
    uint32_t q = m >> shift;
    uint32_t rem = m & ((1u << shift) - 1);
    uint32_t half = 1u << (shift - 1);

    if (rem > half || (rem == half && (q & 1)))
        q++;
    return q;
}

uint16_t dt_f32_to_f16(float f)
{
    uint32_t x = f32_bits(f), man, exp;
    uint16_t sign = (uint16_t)((x >> 16) & 0x8000);

    x &= 0x7fffffff;
    man = x & 0x7fffff;
    exp = x >> 23;
    if (exp == 0xff) {
        if (man == 0)
            return sign | 0x7c00;
        /* Keep the top payload bits; a payload only in the low 13 bits
         * would become infinity, so set the quiet bit instead. */
        man >>= 13;
        return sign | 0x7c00 | (uint16_t)(man ? man : 0x200);
    }
    if (x >= 0x477ff000) /* 65520 and up round to infinity */
        return sign | 0x7c00;
    /* Normal in binary16 (2^-14 and up). A carry out of the rounded
     * mantissa bumps the exponent, as it should. */
    if (exp >= 113)
        return sign | (uint16_t)(((exp - 112) << 10) + shift_rne(man, 13));
    if (x <= 0x33000000) /* 2^-25 and below: zero (2^-25 ties to even 0) */
        return sign;
    /* Subnormal in binary16: (1.man) * 2^(exp-150) in units of 2^-24. A
     * result of 0x400 is the smallest normal, encoded correctly as is. */
    return sign | (uint16_t)shift_rne(man | 0x800000, 126 - exp);
}

float dt_f16_to_f32(uint16_t h)
{
    uint32_t sign = (uint32_t)(h & 0x8000) << 16;
    uint32_t exp = (h >> 10) & 0x1f;
    uint32_t man = h & 0x3ff;

    if (exp == 0x1f) /* inf or NaN; the payload moves up intact so NaN stays NaN */
        return bits_f32(sign | 0x7f800000 | (man << 13));
    if (exp != 0)
        return bits_f32(sign | ((exp + 112) << 23) | (man << 13));
    if (man == 0)
        return bits_f32(sign);
    /* Subnormal: man * 2^-24. Normalise so the leading 1 is bit 10. */
    exp = 113;
    while (!(man & 0x400)) {
        man <<= 1;
        exp--;
    }
    return bits_f32(sign | (exp << 23) | ((man & 0x3ff) << 13));
}

uint16_t dt_f32_to_bf16(float f)
{
    uint32_t x = f32_bits(f);

    if ((x & 0x7fffffffu) > 0x7f800000u)
        return (uint16_t)((x >> 16) | 0x0040u); /* NaN stays a (quiet) NaN */
    x += 0x7fffu + ((x >> 16) & 1u);            /* to nearest, ties to even */
    return (uint16_t)(x >> 16);
}

float dt_bf16_to_f32(uint16_t b)
{
    return bits_f32((uint32_t)b << 16);
}
