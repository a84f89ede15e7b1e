/* SPDX-License-Identifier: MIT
 *
 * The GPU attention kernels' names and the process's choice
 * (kernels/attn_kernel.h).
 */
#include "config.h"

#include <stdlib.h>
#include <string.h>

#include "kernels/attn_kernel.h"

static const char *const names[] = {
    [DT_GPU_ATTN_AUTO] = "auto",
    [DT_GPU_ATTN_CUDNN] = "cudnn",
    [DT_GPU_ATTN_DT] = "dt",
    [DT_GPU_ATTN_WGMMA] = "wgmma",
};

int dt_gpu_attn_parse(const char *name, dt_gpu_attn_t *k)
{
    if (name == NULL || name[0] == '\0') {
        *k = DT_GPU_ATTN_AUTO;
        return 0;
    }
    for (size_t i = 0; i < sizeof(names) / sizeof(names[0]); i++)
        if (strcmp(name, names[i]) == 0) {
            *k = (dt_gpu_attn_t)i;
            return 0;
        }
    return -1;
}

const char *dt_gpu_attn_names(void)
{
    return "auto,cudnn,dt,wgmma";
}

const char *dt_gpu_attn_name(dt_gpu_attn_t k)
{
    return (unsigned)k < sizeof(names) / sizeof(names[0]) ? names[k] : "?";
}

/* -1: not chosen yet (a benign race: every reader computes the same) */
static int chosen = -1;

void dt_gpu_attn_set(dt_gpu_attn_t k)
{
    chosen = (int)k;
}

dt_gpu_attn_t dt_gpu_attn_get(void)
{
    if (chosen < 0) {
        dt_gpu_attn_t k;
        chosen = dt_gpu_attn_parse(getenv("DT_ATTN_KERNEL"), &k) == 0 ? (int)k
                                                                       : DT_GPU_ATTN_AUTO;
    }
    return (dt_gpu_attn_t)chosen;
}
