/* SPDX-License-Identifier: MIT
 *
 * Counter-based generation of test inputs: splitmix64 over (seed, stream,
 * index), Box-Muller for normals. Any slice can be made independently.
 */
#include "config.h"

#include <math.h>

#include "engine/data/gen.h"

static uint64_t mix(uint64_t z)
{
    z += 0x9e3779b97f4a7c15ULL;
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
    return z ^ (z >> 31);
}

double dt_gen_uniform(uint64_t seed, uint64_t stream, uint64_t index)
{
    uint64_t z = mix(mix(seed ^ mix(stream)) + index);
    return (double)(z >> 11) * 0x1.0p-53;
}

void dt_gen_normal(uint64_t seed, uint64_t stream, int64_t first, int64_t n, float *dst)
{
    /* each pair index gives two normals; element i uses pair i / 2 */
    for (int64_t i = 0; i < n; i++) {
        uint64_t e = (uint64_t)(first + i), pair = e / 2;
        double u1 = dt_gen_uniform(seed, stream, 2 * pair);
        double u2 = dt_gen_uniform(seed, stream, 2 * pair + 1);
        double rad = sqrt(-2.0 * log(1.0 - u1));
        double ang = 6.283185307179586476925 * u2;
        dst[i] = (float)(e % 2 == 0 ? rad * cos(ang) : rad * sin(ang));
    }
}
