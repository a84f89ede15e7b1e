/* SPDX-License-Identifier: MIT
 *
 * Which blocks cuDNN's attention runs correctly, by version
 * (dt_cudnn_rules of kernels/cuda/attn_cudnn.h): what it does not take
 * and the known bugs (cuDNN's and TransformerEngine's trackers), so that
 * such blocks go to dt's kernels instead of failing or giving NaN. Plain
 * C with no cuDNN call: the GPU simulator (tests/gpu/sim) routes its
 * stand-in's blocks by the same rules.
 */
#include "config.h"

#include <stddef.h>

#include "kernels/cuda/attn_cudnn.h"

int dt_cudnn_rules(const dt_cudnn_sdpa_t *a, int bwd, size_t v, dt_emsg_t *em)
{
    if (v >= 91000 && v < 91002)
        return dt_emsg_set(em, DT_ENOTSUP, "cuDNN %zu gives wrong attention results (9.10.0 "
                           "and 9.10.1; use 9.10.2 or later)", v);
    if (a->d % 8 != 0 || a->d > 256 || a->d < 8)
        return dt_emsg_set(em, DT_ENOTSUP, "cuDNN attention takes head sizes that are "
                           "multiples of 8 up to 256, not %d", a->d);
    if (a->ldq % 8 != 0 || a->ldk % 8 != 0 || a->ldv % 8 != 0 || a->ldo % 8 != 0 ||
        (bwd && a->lddk % 8 != 0))
        return dt_emsg_set(em, DT_ENOTSUP, "cuDNN attention needs row strides that are "
                           "multiples of 8 elements");
    if (bwd && v < 92600 && a->tk % 128 == 64)
        return dt_emsg_set(em, DT_ENOTSUP, "cuDNN %zu's attention backward can give NaN for "
                           "%lld keys (64 mod 128) before 9.26", v, (long long)a->tk);
    if (bwd && v >= 92600 && v < 92700 && a->tq == 1)
        return dt_emsg_set(em, DT_ENOTSUP, "cuDNN %zu's attention backward can give NaN for "
                           "one query row", v);
    return 0;
}

