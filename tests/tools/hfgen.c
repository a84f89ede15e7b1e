/* SPDX-License-Identifier: MIT
 *
 * hfgen: a Hugging Face LLaMA model directory of any shape with seeded
 * random weights, written by dt's own writer (io/hf_export.h), for tests
 * that need a model transformers could load but no network or Python can
 * make: GPU runs of a head dimension the fixture (tests/fixtures/hf_llama,
 * D = 8) does not have, sharded and bf16 directories, large shapes.
 *
 *   hfgen OUTDIR --dim N --layers N --heads N --kv-heads N --ffn N --vocab N
 *         [--head-dim D] [--tied] [--theta B] [--eps E]
 *         [--llama3 FACTOR,LOW,HIGH,ORIGINAL] [--dtype fp32|bf16|fp16]
 *         [--shard-bytes N] [--seed S]
 *
 * Weights: N(0, 0.02) for the matrices (wo and w2 N(0, 0.02 / sqrt(2 L)),
 * as dt_model_init), norm gains 1 + N(0, 0.1) so that a wrong norm is seen;
 * each tensor from its own stream of dt_gen_normal under the seed. Exit 0,
 * 1 when the write fails, 2 for bad options. Not installed.
 */
#include "config.h"

#include <getopt.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/mem.h"
#include "engine/data/gen.h"
#include "io/hf.h"
#include "io/hf_export.h"

typedef struct gen {
    const dt_model_cfg_t *cfg;
    uint64_t seed;
    float **all; /* every tensor handed out: dt_hf_write may hold them until it returns */
    int nall;
} gen_t;

static const float *tensor(void *ud, dt_hf_tensor_t t, int layer)
{
    gen_t *g = ud;
    int64_t n = dt_hf_numel(g->cfg, t);
    float *p = dt_xmallocarray((size_t)(n > 0 ? n : 1), sizeof(float));
    uint64_t stream = 1000 + (uint64_t)layer * DT_HF_NTENSORS + (uint64_t)t;
    int norm = t == DT_HF_ATTN_NORM || t == DT_HF_MLP_NORM || t == DT_HF_FINAL_NORM;
    float sd = norm ? 0.1f
                    : (t == DT_HF_WO || t == DT_HF_W2) ? 0.02f / sqrtf(2.0f * (float)g->cfg->layers)
                                                       : 0.02f;

    dt_gen_normal(g->seed, stream, 0, n, p);
    for (int64_t i = 0; i < n; i++)
        p[i] = (norm ? 1.0f : 0.0f) + sd * p[i];
    g->all = dt_xrealloc(g->all, (size_t)(g->nall + 1) * sizeof(*g->all));
    g->all[g->nall++] = p;
    return p;
}

static int usage(const char *why)
{
    if (why)
        fprintf(stderr, "hfgen: %s\n", why);
    fprintf(stderr, "usage: hfgen OUTDIR --dim N --layers N --heads N --kv-heads N --ffn N "
                    "--vocab N\n"
                    "             [--head-dim D] [--tied] [--theta B] [--eps E]\n"
                    "             [--llama3 FACTOR,LOW,HIGH,ORIGINAL] [--dtype fp32|bf16|fp16]\n"
                    "             [--shard-bytes N] [--seed S]\n");
    return 2;
}

int main(int argc, char **argv)
{
    static const struct option lo[] = {
        { "dim", 1, NULL, 1 },        { "layers", 1, NULL, 2 },     { "heads", 1, NULL, 3 },
        { "kv-heads", 1, NULL, 4 },   { "ffn", 1, NULL, 5 },        { "vocab", 1, NULL, 6 },
        { "head-dim", 1, NULL, 7 },   { "tied", 0, NULL, 8 },       { "theta", 1, NULL, 9 },
        { "eps", 1, NULL, 10 },       { "llama3", 1, NULL, 11 },    { "dtype", 1, NULL, 12 },
        { "shard-bytes", 1, NULL, 13 }, { "seed", 1, NULL, 14 },    { NULL, 0, NULL, 0 },
    };
    dt_model_cfg_t cfg = { .name = "hf", .rope = { .theta = 500000 }, .norm_eps = 1e-5f };
    int *shape[] = { &cfg.dim, &cfg.layers, &cfg.heads, &cfg.kv_heads, &cfg.ffn, &cfg.vocab,
                     &cfg.head_dim };
    dt_dtype_t dtype = DT_F32;
    long long shard = 0;
    gen_t g = { .cfg = &cfg, .seed = 1 };
    dt_emsg_t em = { "" };
    char *end;
    int c, rc;

    while ((c = getopt_long(argc, argv, "", lo, NULL)) != -1) {
        switch (c) {
        case 1: case 2: case 3: case 4: case 5: case 6: case 7:
            *shape[c - 1] = (int)strtol(optarg, &end, 10);
            if (*end != '\0' || *shape[c - 1] < 1)
                return usage("a shape option takes a positive integer");
            break;
        case 8: cfg.tied = true; break;
        case 9: cfg.rope.theta = strtod(optarg, NULL); break;
        case 10: cfg.norm_eps = strtof(optarg, NULL); break;
        case 11:
            if (sscanf(optarg, "%lf,%lf,%lf,%lf", &cfg.rope.factor, &cfg.rope.low_freq_factor,
                       &cfg.rope.high_freq_factor, &cfg.rope.original_max_pos) != 4)
                return usage("--llama3 FACTOR,LOW,HIGH,ORIGINAL");
            break;
        case 12:
            if (strcmp(optarg, "fp32") == 0)
                dtype = DT_F32;
            else if (strcmp(optarg, "bf16") == 0)
                dtype = DT_BF16;
            else if (strcmp(optarg, "fp16") == 0)
                dtype = DT_F16;
            else
                return usage("--dtype fp32, bf16 or fp16");
            break;
        case 13: shard = strtoll(optarg, NULL, 10); break;
        case 14: g.seed = strtoull(optarg, NULL, 10); break;
        default: return usage(NULL);
        }
    }
    if (optind + 1 != argc)
        return usage("one OUTDIR");
    if (cfg.head_dim > 0 && cfg.head_dim * cfg.heads == cfg.dim)
        cfg.head_dim = 0;
    rc = dt_hf_write(argv[optind], &cfg, dtype, shard, tensor, &g, &em);
    for (int i = 0; i < g.nall; i++)
        free(g.all[i]);
    free(g.all);
    if (rc < 0) {
        fprintf(stderr, "hfgen: %s\n", em.s);
        return rc == DT_EINVAL ? 2 : 1;
    }
    return 0;
}
