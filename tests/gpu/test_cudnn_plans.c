/* SPDX-License-Identifier: MIT
 *
 * The cuDNN graphs dt builds (kernels/cuda/attn_cudnn.c), checked against
 * the real libcudnn without a GPU: for each block shape the ring issues
 * (full and causal, shifted diagonals, GQA, head sizes, bf16 and fp16,
 * strided rows, deterministic backward or not), the graph is built,
 * cuDNN's heuristics must find an engine for it, and the engine's plan
 * must compile (NVRTC) for an H100 described by its device properties
 * (tests/gpu/h100_deviceprop.json). Loading the compiled module needs a
 * device: without one the driver's stub stands in and that last step is
 * the only one left out. On a GPU node the plans finalise whole.
 *
 * What it is not: a check of the numbers (tests/gpu/test_attn_cuda
 * DT_ATTN_KERNEL=cudnn does that on a GPU). Exit 77 (skipped) when cuDNN
 * cannot be loaded.
 */
#include "config.h"

#include <dlfcn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kernels/cuda/attn_cudnn.h"

static char *slurp(const char *path)
{
    FILE *f = fopen(path, "r");
    static char buf[16384];
    size_t n;

    if (f == NULL)
        return NULL;
    n = fread(buf, 1, sizeof(buf) - 1, f);
    fclose(f);
    buf[n] = '\0';
    return buf;
}

typedef struct shape {
    int bwd;
    int64_t tq, tk;
    int h, hkv, d;
    dt_dtype_t dt;
    int64_t shift;
    int det;
    int wide; /* rows at a stride wider than the block's heads (a dilated head chunk) */
} shape_t;

int main(void)
{
    const char *src = getenv("DT_SRCDIR");
    char path[4096];
    dt_emsg_t em = { 0 };
    size_t v;
    int fails = 0, n = 0;

    if ((v = dt_cudnn_version(&em)) == 0) {
        printf("SKIP: %s\n", em.s);
        return 77;
    }
    /* the runtime-compiled engines load the driver: its stub where there is none */
    if (dlopen("libcuda.so.1", RTLD_NOW | RTLD_GLOBAL) == NULL &&
        dlopen(CUDA_PREFIX "/lib64/stubs/libcuda.so", RTLD_NOW | RTLD_GLOBAL) == NULL) {
        printf("SKIP: neither a CUDA driver nor its stub (%s/lib64/stubs) to load\n",
               CUDA_PREFIX);
        return 77;
    }
    snprintf(path, sizeof(path), "%s/tests/gpu/h100_deviceprop.json", src ? src : ".");
    const char *props = slurp(path);
    if (props == NULL) {
        printf("FAIL: cannot read %s\n", path);
        return 1;
    }
    printf("cuDNN %zu\n", v);

    const shape_t shapes[] = {
        /* the dense ring's blocks: full, the causal diagonal, zigzag's halves */
        { 0, 1024, 1024, 8, 8, 128, DT_BF16, DT_CUDNN_FULL, 0, 0 },
        { 0, 1024, 1024, 8, 8, 128, DT_BF16, 0, 0, 0 },
        { 0, 512, 1024, 8, 8, 128, DT_BF16, 512, 0, 0 },
        { 0, 2048, 2048, 32, 8, 128, DT_BF16, 0, 0, 0 },
        { 0, 1024, 1024, 8, 2, 64, DT_F16, 0, 0, 0 },
        { 0, 384, 1152, 4, 4, 64, DT_BF16, DT_CUDNN_FULL, 0, 0 },
        { 0, 1000, 1000, 4, 4, 96, DT_BF16, 0, 0, 0 },
        { 0, 256, 256, 4, 4, 256, DT_BF16, 0, 0, 0 },
        { 0, 512, 512, 4, 2, 64, DT_BF16, 0, 0, 1 },
        /* backward, deterministic (the default) and not */
        { 1, 1024, 1024, 8, 8, 128, DT_BF16, DT_CUDNN_FULL, 1, 0 },
        { 1, 1024, 1024, 8, 8, 128, DT_BF16, 0, 1, 0 },
        { 1, 1024, 1024, 8, 8, 128, DT_BF16, 0, 0, 0 },
        { 1, 512, 1024, 8, 8, 128, DT_BF16, 512, 1, 0 },
        { 1, 1024, 1024, 32, 8, 128, DT_BF16, 0, 1, 0 },
        { 1, 1024, 1024, 8, 2, 64, DT_F16, 0, 1, 0 },
        { 1, 512, 16384, 32, 8, 128, DT_BF16, 15872, 1, 0 },
        { 1, 512, 512, 4, 2, 64, DT_BF16, 0, 1, 1 },
        { 1, 1024, 1024, 4, 4, 96, DT_BF16, DT_CUDNN_FULL, 0, 0 },
    };
    for (size_t i = 0; i < sizeof(shapes) / sizeof(shapes[0]); i++) {
        const shape_t *s = &shapes[i];
        const int64_t w = s->wide ? 2 : 1;
        dt_cudnn_sdpa_t a = {
            .tq = s->tq, .tk = s->tk, .h = s->h, .hkv = s->hkv, .d = s->d, .dtype = s->dt,
            .ldq = w * s->h * s->d, .ldk = w * s->hkv * s->d, .ldv = w * s->hkv * s->d,
            .ldo = w * s->h * s->d, .lddk = (int64_t)s->hkv * s->d, .shift = s->shift,
            .det = s->det,
        };
        size_t ws = 0;
        int64_t eng = -1;
        dt_emsg_t e = { 0 };
        char shift[32];
        int rc = dt_cudnn_rules(&a, s->bwd, v, &e);
        if (s->shift == DT_CUDNN_FULL)
            snprintf(shift, sizeof(shift), "full");
        else
            snprintf(shift, sizeof(shift), "shift %lld", (long long)s->shift);
        if (rc == 0)
            rc = dt_cudnn_plan_offline(&a, s->bwd, props, &ws, &eng, &e);
        n++;
        printf("%s %s tq %lld tk %lld h %d hkv %d d %d %s %s%s%s: ", rc == 0 ? "ok  " : "FAIL",
               s->bwd ? "bwd" : "fwd", (long long)s->tq, (long long)s->tk, s->h, s->hkv, s->d,
               dt_dtype_name(s->dt), shift, s->bwd ? (s->det ? " det" : " nondet") : "",
               s->wide ? " wide rows" : "");
        if (rc == 0)
            printf("engine %lld, workspace %.1f MiB\n", (long long)eng, (double)ws / 1048576.0);
        else
            printf("%s\n", e.s);
        fails += rc != 0;
    }

    /* the rules route what cuDNN gets wrong or does not take */
    dt_cudnn_sdpa_t odd = { .tq = 64, .tk = 64, .h = 1, .hkv = 1, .d = 100, .dtype = DT_BF16,
                            .ldq = 100, .ldk = 100, .ldv = 100, .ldo = 100, .lddk = 100 };
    dt_cudnn_sdpa_t k64 = { .tq = 64, .tk = 192, .h = 1, .hkv = 1, .d = 64, .dtype = DT_BF16,
                            .ldq = 64, .ldk = 64, .ldv = 64, .ldo = 64, .lddk = 64 };
    struct {
        const char *what;
        const dt_cudnn_sdpa_t *a;
        int bwd;
        size_t v;
        int want;
    } rules[] = {
        { "d 100", &odd, 0, v, DT_ENOTSUP },
        { "9.10.1", &k64, 0, 91001, DT_ENOTSUP },
        { "9.10.2", &k64, 0, 91002, 0 },
        { "bwd tk = 192 before 9.26", &k64, 1, 92500, DT_ENOTSUP },
        { "fwd tk = 192 before 9.26", &k64, 0, 92500, 0 },
        { "bwd tk = 192 on 9.26", &k64, 1, 92600, 0 },
    };
    for (size_t i = 0; i < sizeof(rules) / sizeof(rules[0]); i++) {
        dt_emsg_t e = { 0 };
        int rc = dt_cudnn_rules(rules[i].a, rules[i].bwd, rules[i].v, &e);
        n++;
        printf("%s rule %s: %s\n", rc == rules[i].want ? "ok  " : "FAIL", rules[i].what,
               rc == 0 ? "cuDNN" : e.s);
        fails += rc != rules[i].want;
    }
    printf("%d checks, %d failed\n", n, fails);
    return fails != 0;
}
