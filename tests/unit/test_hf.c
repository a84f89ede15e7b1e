/* SPDX-License-Identifier: MIT
 *
 * Tests of io/hf, io/hf_config and io/hf_export, one file for the three
 * (each direction checks the other): Hugging Face LLaMA directories
 * written by dt_hf_write and read back by dt_hf_open / dt_hf_read (fp32
 * bit for bit, bf16 and fp16 as their rounding, one file and shards with
 * an index, tied and untied, an explicit head_dim, llama3 RoPE scaling),
 * the RoPE row permutation against a file built by hand in Hugging Face's
 * layout, the fixture that transformers 5 wrote (tests/fixtures/hf_llama,
 * found through DT_SRCDIR or the source directory compiled in), and the
 * refusal of bad configs and weights, each with the message the user would
 * see; where each tensor sits in dt's flat parameter array; the files'
 * modes. Every test works in its own directory under /tmp, removed
 * afterwards. No Python needed.
 */
#include "config.h"

#include <criterion/criterion.h>
#include <dirent.h>
#include <jansson.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "common/fileio.h"
#include "common/half.h"
#include "io/hf.h"
#include "io/hf_config.h"
#include "io/hf_export.h"
#include "io/safetensors.h"

/*-- fixture: one temp dir per test -----------------------------------------*/

static char tmpdir[64];

static void setup(void)
{
    snprintf(tmpdir, sizeof(tmpdir), "/tmp/test_hf.XXXXXX");
    cr_assert_not_null(mkdtemp(tmpdir), "mkdtemp: %s", strerror(errno));
}

static void teardown(void)
{
    if (tmpdir[0])
        dt_rmtree(tmpdir, NULL);
}

TestSuite(hf, .init = setup, .fini = teardown);

static const char *P(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
static const char *P(const char *fmt, ...)
{
    static char bufs[8][512];
    static int i;
    char *b = bufs[i++ % 8], rel[256];
    va_list ap;

    va_start(ap, fmt);
    vsnprintf(rel, sizeof(rel), fmt, ap);
    va_end(ap);
    snprintf(b, sizeof(bufs[0]), "%s/%s", tmpdir, rel);
    return b;
}

static const char *fixture(const char *name)
{
    static char buf[4096];
    const char *src = getenv("DT_SRCDIR");

    if (src == NULL || src[0] == '\0')
        src = DT_TEST_SRCDIR;
    snprintf(buf, sizeof(buf), "%s/tests/fixtures/hf_llama/%s", src, name);
    return buf;
}

static bool exists(const char *path)
{
    struct stat st;

    return stat(path, &st) == 0;
}

static int count_dir(const char *dir)
{
    DIR *d = opendir(dir);
    struct dirent *de;
    int n = 0;

    cr_assert_not_null(d, "%s: %s", dir, strerror(errno));
    while ((de = readdir(d)) != NULL)
        if (strcmp(de->d_name, ".") && strcmp(de->d_name, ".."))
            n++;
    closedir(d);
    return n;
}

static char *slurp(const char *path)
{
    char *text = NULL;
    size_t len;
    dt_emsg_t em = { "" };

    cr_assert_eq(dt_read_regular(path, 0, 1 << 24, &text, &len, &em), 0, "%s", em.s);
    return text;
}

static void put_text(const char *path, const char *text)
{
    FILE *f = fopen(path, "w");

    cr_assert_not_null(f, "%s: %s", path, strerror(errno));
    cr_assert_eq(fputs(text, f) >= 0, true);
    cr_assert_eq(fclose(f), 0);
}

static void put_json(const char *path, json_t *doc)
{
    cr_assert_eq(json_dump_file(doc, path, JSON_INDENT(2)), 0, "%s", path);
}

static json_t *load_json(const char *path)
{
    json_error_t jerr;
    json_t *j = json_load_file(path, 0, &jerr);

    cr_assert_not_null(j, "%s: %s", path, jerr.text);
    return j;
}

/*-- a model in memory ------------------------------------------------------*/

#define MAXL 4

typedef struct {
    dt_model_cfg_t cfg;
    float *w[DT_HF_NTENSORS][MAXL];
    int calls[DT_HF_NTENSORS];
    dt_hf_tensor_t fail_at; /* get returns NULL for it (DT_HF_NTENSORS: never) */
} model_t;

static int nlayers_of(const dt_model_cfg_t *c, dt_hf_tensor_t t)
{
    return dt_hf_per_layer(t) ? c->layers : 1;
}

static bool is_vec(dt_hf_tensor_t t)
{
    return t == DT_HF_ATTN_NORM || t == DT_HF_MLP_NORM || t == DT_HF_FINAL_NORM;
}

/* The columns of tensor t (its length for the norms). */
static int64_t cols_of(const dt_model_cfg_t *c, dt_hf_tensor_t t)
{
    return t == DT_HF_WO   ? (int64_t)c->heads * dt_model_head_dim(c)
           : t == DT_HF_W2 ? c->ffn
                           : c->dim;
}

static dt_model_cfg_t tiny_cfg(void)
{
    dt_model_cfg_t c = {
        .name = "hf",
        .dim = 32,
        .layers = 2,
        .heads = 4,
        .kv_heads = 2,
        .ffn = 64,
        .vocab = 128,
        .rope = { .theta = 500000 },
        .norm_eps = 1e-5f,
    };
    return c;
}

static uint64_t rng_next(uint64_t *s)
{
    uint64_t x = (*s += 0x9e3779b97f4a7c15ull);
    x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
    x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
    return x ^ (x >> 31);
}

/* Seeded values in [-1, 1) with every mantissa bit used (so bf16 and fp16
 * exports really round), and a few special ones. */
static void model_init(model_t *m, const dt_model_cfg_t *cfg, uint64_t seed)
{
    memset(m, 0, sizeof(*m));
    m->cfg = *cfg;
    m->fail_at = DT_HF_NTENSORS;
    cr_assert_leq(cfg->layers, MAXL);
    for (int t = 0; t < DT_HF_NTENSORS; t++)
        for (int l = 0; l < nlayers_of(cfg, t); l++) {
            int64_t n = dt_hf_numel(cfg, t);

            if (n == 0)
                continue;
            m->w[t][l] = malloc((size_t)n * sizeof(float));
            for (int64_t i = 0; i < n; i++)
                m->w[t][l][i] =
                    (float)((double)(rng_next(&seed) >> 11) / 9007199254740992.0 * 2 - 1);
            m->w[t][l][0] = -0.0f;
            m->w[t][l][n - 1] = 3.0e-6f; /* an fp16 subnormal */
        }
}

static void model_free(model_t *m)
{
    for (int t = 0; t < DT_HF_NTENSORS; t++)
        for (int l = 0; l < MAXL; l++)
            free(m->w[t][l]);
}

static const float *model_get(void *ud, dt_hf_tensor_t t, int layer)
{
    model_t *m = ud;

    m->calls[t]++;
    return t == m->fail_at ? NULL : m->w[t][layer];
}

static void write_model(const char *dir, model_t *m, dt_dtype_t dtype, int64_t shard_bytes)
{
    dt_emsg_t em = { "" };

    cr_assert_eq(dt_hf_write(dir, &m->cfg, dtype, shard_bytes, model_get, m, &em), 0, "%s", em.s);
}

static float round_to(float x, dt_dtype_t dtype)
{
    if (dtype == DT_BF16)
        return dt_bf16_to_f32(dt_f32_to_bf16(x));
    if (dtype == DT_F16)
        return dt_f16_to_f32(dt_f32_to_f16(x));
    return x;
}

/* Every tensor of the directory read back: m's values rounded to dtype,
 * bit for bit. */
static void expect_model(const char *dir, const model_t *m, dt_dtype_t dtype)
{
    const dt_model_cfg_t *c;
    dt_emsg_t em = { "" };
    dt_hf_t *h;

    cr_assert_eq(dt_hf_open(dir, &h, &em), 0, "%s", em.s);
    c = dt_hf_cfg(h);
    cr_assert_str_eq(c->name, "hf");
    cr_assert(c->dim == m->cfg.dim && c->layers == m->cfg.layers && c->heads == m->cfg.heads &&
                  c->kv_heads == m->cfg.kv_heads && c->ffn == m->cfg.ffn &&
                  c->vocab == m->cfg.vocab && c->head_dim == m->cfg.head_dim &&
                  c->tied == m->cfg.tied && c->norm_eps == m->cfg.norm_eps &&
                  c->rope.theta == m->cfg.rope.theta && c->rope.factor == m->cfg.rope.factor &&
                  c->rope.low_freq_factor == m->cfg.rope.low_freq_factor &&
                  c->rope.high_freq_factor == m->cfg.rope.high_freq_factor &&
                  c->rope.original_max_pos == m->cfg.rope.original_max_pos,
              "config read back differs");
    for (int t = 0; t < DT_HF_NTENSORS; t++)
        for (int l = 0; l < nlayers_of(c, t); l++) {
            int64_t n = dt_hf_numel(c, t);
            float *got;
            char nb[64];

            if (n == 0)
                continue;
            dt_hf_name(t, l, nb, sizeof(nb));
            cr_assert_eq(dt_hf_dtype(h, t, l), dtype, "%s", nb);
            got = malloc((size_t)n * sizeof(float));
            cr_assert_eq(dt_hf_read(h, t, l, got, &em), 0, "%s: %s", nb, em.s);
            for (int64_t i = 0; i < n; i++) {
                float want = round_to(m->w[t][l][i], dtype);
                cr_assert(memcmp(&got[i], &want, sizeof(float)) == 0,
                          "%s[%lld]: %.9g, expected %.9g", nb, (long long)i, got[i], want);
            }
            free(got);
        }
    dt_hf_close(h);
}

/*-- round trips ------------------------------------------------------------*/

Test(hf, names_and_sizes)
{
    dt_model_cfg_t c = tiny_cfg();
    char nb[64], small[16];

    cr_assert_str_eq(dt_hf_name(DT_HF_EMBED, 5, nb, sizeof(nb)), "model.embed_tokens.weight");
    cr_assert_str_eq(dt_hf_name(DT_HF_W1, 3, nb, sizeof(nb)),
                     "model.layers.3.mlp.gate_proj.weight");
    cr_assert_str_eq(dt_hf_name(DT_HF_W3, 0, nb, sizeof(nb)), "model.layers.0.mlp.up_proj.weight");
    cr_assert_str_eq(dt_hf_name(DT_HF_W2, 1, nb, sizeof(nb)),
                     "model.layers.1.mlp.down_proj.weight");
    cr_assert_str_eq(dt_hf_name(DT_HF_MLP_NORM, 1, nb, sizeof(nb)),
                     "model.layers.1.post_attention_layernorm.weight");
    cr_assert_str_eq(dt_hf_name(DT_HF_LM_HEAD, 0, nb, sizeof(nb)), "lm_head.weight");
    cr_assert_null(dt_hf_name(DT_HF_NTENSORS, 0, nb, sizeof(nb)));
    cr_assert_null(dt_hf_name(DT_HF_WQ, 0, small, sizeof(small)));
    cr_assert(dt_hf_per_layer(DT_HF_WO) && !dt_hf_per_layer(DT_HF_FINAL_NORM));
    cr_assert_eq(dt_hf_numel(&c, DT_HF_EMBED), 128 * 32);
    cr_assert_eq(dt_hf_numel(&c, DT_HF_WQ), 32 * 32);
    cr_assert_eq(dt_hf_numel(&c, DT_HF_WK), 16 * 32);
    cr_assert_eq(dt_hf_numel(&c, DT_HF_W2), 32 * 64);
    cr_assert_eq(dt_hf_numel(&c, DT_HF_ATTN_NORM), 32);
    cr_assert_eq(dt_hf_numel(&c, DT_HF_LM_HEAD), 128 * 32);
    c.tied = true;
    cr_assert_eq(dt_hf_numel(&c, DT_HF_LM_HEAD), 0);
    c.head_dim = 16;
    cr_assert_eq(dt_hf_numel(&c, DT_HF_WO), 32 * 64);
}

Test(hf, f32_one_file_is_bit_identical)
{
    dt_model_cfg_t c = tiny_cfg();
    dt_st_reader_t *st;
    dt_emsg_t em = { "" };
    model_t m;
    char *text;

    model_init(&m, &c, 1);
    write_model(P("out"), &m, DT_F32, 0);
    cr_assert(exists(P("out/config.json")) && exists(P("out/model.safetensors")));
    cr_assert(!exists(P("out/model.safetensors.index.json")));
    cr_assert_eq(count_dir(P("out")), 2);
    for (int t = 0; t < DT_HF_NTENSORS; t++)
        cr_assert_eq(m.calls[t], nlayers_of(&c, t), "tensor %d asked %d times", t, m.calls[t]);
    expect_model(P("out"), &m, DT_F32);

    /* what transformers reads */
    text = slurp(P("out/config.json"));
    cr_assert(strstr(text, "\"architectures\": [\n    \"LlamaForCausalLM\"\n  ]"), "%s", text);
    cr_assert(strstr(text, "\"model_type\": \"llama\""), "%s", text);
    cr_assert(strstr(text, "\"rms_norm_eps\": 1e-5"), "%s", text);
    cr_assert(strstr(text, "\"rope_theta\": 500000.0"), "%s", text);
    cr_assert(strstr(text, "\"rope_scaling\": null"), "%s", text);
    cr_assert(strstr(text, "\"torch_dtype\": \"float32\""), "%s", text);
    cr_assert(strstr(text, "\"head_dim\": 8"), "%s", text);
    cr_assert(strstr(text, "\"max_position_embeddings\": 8192"), "%s", text);
    cr_assert(strstr(text, "\"tie_word_embeddings\": false"), "%s", text);
    free(text);
    cr_assert_eq(dt_st_open(P("out/model.safetensors"), &st, &em), 0, "%s", em.s);
    cr_assert_str_eq(dt_st_meta(st, "format"), "pt");
    cr_assert_eq(dt_st_count(st), 1 + 9 * 2 + 2);
    cr_assert_str_eq(dt_st_tensor(st, 0)->name, "model.embed_tokens.weight");
    cr_assert_str_eq(dt_st_tensor(st, 1)->name, "model.layers.0.self_attn.q_proj.weight");
    cr_assert_str_eq(dt_st_tensor(st, 20)->name, "lm_head.weight");
    /* q and k stored in HF's rotation order, the others as given */
    for (int t = DT_HF_WQ; t <= DT_HF_WV; t++) {
        int64_t n = dt_hf_numel(&c, t), rows = n / c.dim;
        float *raw = malloc((size_t)n * sizeof(float));
        char nb[64];

        dt_hf_name(t, 1, nb, sizeof(nb));
        cr_assert_eq(dt_st_read(st, nb, raw, (size_t)n * 4, &em), 0, "%s", em.s);
        for (int64_t r = 0; r < rows; r++) {
            int64_t h = r / 8, k = (r % 8) / 4, i = r % 4;
            int64_t src = t == DT_HF_WV ? r : h * 8 + 2 * i + k;

            cr_assert(memcmp(raw + r * c.dim, m.w[t][1] + src * c.dim, c.dim * 4) == 0,
                      "%s row %lld is not dt's row %lld", nb, (long long)r, (long long)src);
        }
        free(raw);
    }
    dt_st_close(st);
    model_free(&m);
}

Test(hf, f32_shards_with_index_are_bit_identical)
{
    dt_model_cfg_t c = tiny_cfg();
    json_t *idx, *wm;
    const char *k;
    json_t *v;
    int64_t total = 0;
    model_t m;
    int nshards;

    model_init(&m, &c, 2);
    write_model(P("out"), &m, DT_F32, 20000);
    cr_assert(!exists(P("out/model.safetensors")));
    idx = load_json(P("out/model.safetensors.index.json"));
    wm = json_object_get(idx, "weight_map");
    cr_assert_eq(json_object_size(wm), 21);
    nshards = count_dir(P("out")) - 2;
    cr_assert_geq(nshards, 3, "%d shards", nshards);
    for (int s = 1; s <= nshards; s++) {
        char name[64];
        dt_st_reader_t *st;
        dt_emsg_t em = { "" };
        int64_t bytes = 0;

        snprintf(name, sizeof(name), "model-%05d-of-%05d.safetensors", s, nshards);
        cr_assert_eq(dt_st_open(P("out/%s", name), &st, &em), 0, "%s", em.s);
        cr_assert_str_eq(dt_st_meta(st, "format"), "pt");
        for (size_t i = 0; i < dt_st_count(st); i++) {
            const dt_st_tensor_t *t = dt_st_tensor(st, i);

            cr_assert_str_eq(json_string_value(json_object_get(wm, t->name)), name);
            bytes += (int64_t)(t->end - t->begin);
        }
        cr_assert(bytes <= 20000 || dt_st_count(st) == 1, "%s holds %lld bytes", name,
                  (long long)bytes);
        total += bytes;
        dt_st_close(st);
    }
    cr_assert_eq(total, 107136);
    cr_assert_eq(
        json_integer_value(json_object_get(json_object_get(idx, "metadata"), "total_size")), total);
    json_object_foreach(wm, k, v)
        cr_assert(strncmp(json_string_value(v), "model-0000", 10) == 0, "%s", k);
    json_decref(idx);
    expect_model(P("out"), &m, DT_F32);
    model_free(&m);
}

Test(hf, bf16_and_fp16_round_to_nearest_even)
{
    dt_model_cfg_t c = tiny_cfg();
    model_t m;
    char *text;

    model_init(&m, &c, 3);
    m.w[DT_HF_WQ][0][5] = 1.00390625f; /* halfway between two bf16: to even, 1.0 */
    write_model(P("bf16"), &m, DT_BF16, 0);
    expect_model(P("bf16"), &m, DT_BF16);
    text = slurp(P("bf16/config.json"));
    cr_assert(strstr(text, "\"torch_dtype\": \"bfloat16\"") &&
                  strstr(text, "\"dtype\": \"bfloat16\""),
              "%s", text);
    free(text);
    write_model(P("f16"), &m, DT_F16, 30000); /* sharded too */
    expect_model(P("f16"), &m, DT_F16);
    cr_assert(exists(P("f16/model.safetensors.index.json")));
    {
        dt_hf_t *h;
        dt_emsg_t em = { "" };
        float q[32 * 32];

        cr_assert_eq(dt_hf_open(P("bf16"), &h, &em), 0, "%s", em.s);
        cr_assert_eq(dt_hf_read(h, DT_HF_WQ, 0, q, &em), 0, "%s", em.s);
        cr_assert_eq(q[5], 1.0f);
        dt_hf_close(h);
    }
    model_free(&m);
}

Test(hf, tied_model_has_no_head)
{
    dt_model_cfg_t c = tiny_cfg();
    dt_st_reader_t *st;
    dt_emsg_t em = { "" };
    float buf[128 * 32];
    dt_hf_t *h;
    model_t m;

    c.tied = true;
    model_init(&m, &c, 4);
    write_model(P("out"), &m, DT_F32, 0);
    cr_assert_eq(m.calls[DT_HF_LM_HEAD], 0);
    cr_assert_eq(dt_st_open(P("out/model.safetensors"), &st, &em), 0, "%s", em.s);
    cr_assert_null(dt_st_find(st, "lm_head.weight"));
    dt_st_close(st);
    expect_model(P("out"), &m, DT_F32);
    cr_assert_eq(dt_hf_open(P("out"), &h, &em), 0, "%s", em.s);
    cr_assert(dt_hf_cfg(h)->tied);
    cr_assert_eq(dt_hf_read(h, DT_HF_LM_HEAD, 0, buf, &em), DT_ENOENT);
    cr_assert(strstr(em.s, "tied"), "%s", em.s);
    cr_assert_eq(dt_hf_read(h, DT_HF_WQ, 2, buf, &em), DT_EINVAL);
    cr_assert_eq(dt_hf_read(h, DT_HF_WQ, -1, buf, &em), DT_EINVAL);
    dt_hf_close(h);
    model_free(&m);
}

Test(hf, llama3_rope_scaling_round_trip)
{
    dt_model_cfg_t c = tiny_cfg(), got;
    dt_emsg_t em = { "" };
    json_t *j, *rs;
    model_t m;

    c.rope = (dt_rope_t){ .theta = 500000,
                          .factor = 8,
                          .low_freq_factor = 1,
                          .high_freq_factor = 4,
                          .original_max_pos = 8192 };
    c.norm_eps = 1e-6f;
    model_init(&m, &c, 5);
    write_model(P("out"), &m, DT_F32, 0);
    expect_model(P("out"), &m, DT_F32);
    cr_assert_eq(dt_hf_config_read(P("out"), &got, &em), 0, "%s", em.s);
    cr_assert(got.rope.factor == 8 && got.rope.low_freq_factor == 1 &&
              got.rope.high_freq_factor == 4 && got.rope.original_max_pos == 8192 &&
              got.rope.theta == 500000 && got.norm_eps == 1e-6f);
    j = load_json(P("out/config.json"));
    rs = json_object_get(j, "rope_scaling");
    cr_assert_str_eq(json_string_value(json_object_get(rs, "rope_type")), "llama3");
    cr_assert_eq(json_real_value(json_object_get(rs, "factor")), 8.0);
    cr_assert_eq(json_integer_value(json_object_get(rs, "original_max_position_embeddings")), 8192);
    cr_assert_eq(json_integer_value(json_object_get(j, "max_position_embeddings")), 65536);
    cr_assert_eq(json_real_value(json_object_get(j, "rms_norm_eps")), 1e-6);
    json_decref(j);
    model_free(&m);
}

Test(hf, explicit_head_dim)
{
    dt_model_cfg_t c = tiny_cfg(), got;
    dt_emsg_t em = { "" };
    dt_st_reader_t *st;
    model_t m;

    c.head_dim = 16; /* 4 heads of 16 on a width of 32 */
    model_init(&m, &c, 6);
    write_model(P("out"), &m, DT_F32, 0);
    expect_model(P("out"), &m, DT_F32);
    cr_assert_eq(dt_hf_config_read(P("out"), &got, &em), 0, "%s", em.s);
    cr_assert_eq(got.head_dim, 16);
    cr_assert_eq(dt_st_open(P("out/model.safetensors"), &st, &em), 0, "%s", em.s);
    cr_assert_eq(dt_st_find(st, "model.layers.0.self_attn.q_proj.weight")->shape[0], 64);
    cr_assert_eq(dt_st_find(st, "model.layers.0.self_attn.o_proj.weight")->shape[1], 64);
    dt_st_close(st);
    model_free(&m);
}

typedef struct {
    dt_hf_t *h;
    const model_t *m;
    int bad;
} reader_arg_t;

static void *reader_main(void *p)
{
    reader_arg_t *a = p;
    const dt_model_cfg_t *c = dt_hf_cfg(a->h);

    for (int rep = 0; rep < 20; rep++)
        for (int t = 0; t < DT_HF_NTENSORS; t++)
            for (int l = 0; l < nlayers_of(c, t); l++) {
                int64_t n = dt_hf_numel(c, t);
                float *got = malloc((size_t)(n ? n : 1) * sizeof(float));
                dt_emsg_t em;

                if (n && (dt_hf_read(a->h, t, l, got, &em) != 0 ||
                          memcmp(got, a->m->w[t][l], (size_t)n * 4) != 0))
                    a->bad++;
                free(got);
            }
    return NULL;
}

Test(hf, reads_from_several_threads)
{
    dt_model_cfg_t c = tiny_cfg();
    dt_emsg_t em = { "" };
    reader_arg_t args[4];
    pthread_t th[4];
    dt_hf_t *h;
    model_t m;

    model_init(&m, &c, 7);
    write_model(P("out"), &m, DT_F32, 25000);
    cr_assert_eq(dt_hf_open(P("out"), &h, &em), 0, "%s", em.s);
    for (int i = 0; i < 4; i++) {
        args[i] = (reader_arg_t){ .h = h, .m = &m };
        cr_assert_eq(pthread_create(&th[i], NULL, reader_main, &args[i]), 0);
    }
    for (int i = 0; i < 4; i++) {
        pthread_join(th[i], NULL);
        cr_assert_eq(args[i].bad, 0, "thread %d read %d wrong tensors", i, args[i].bad);
    }
    dt_hf_close(h);
    model_free(&m);
}

/*-- export refusals --------------------------------------------------------*/

Test(hf, write_refuses_an_existing_model_and_bad_arguments)
{
    dt_model_cfg_t c = tiny_cfg(), bad;
    dt_emsg_t em = { "" };
    model_t m;

    model_init(&m, &c, 8);
    cr_assert_eq(mkdir(P("out"), 0755), 0);
    put_text(P("out/config.json"), "{}");
    cr_assert_eq(dt_hf_write(P("out"), &c, DT_F32, 0, model_get, &m, &em), DT_EEXIST);
    cr_assert(strstr(em.s, "out/config.json: already exists"), "%s", em.s);
    unlink(P("out/config.json"));
    put_text(P("out/model-00001-of-00002.safetensors"), "");
    cr_assert_eq(dt_hf_write(P("out"), &c, DT_F32, 0, model_get, &m, &em), DT_EEXIST);
    cr_assert(strstr(em.s, "model-00001-of-00002.safetensors"), "%s", em.s);
    cr_assert_eq(count_dir(P("out")), 1);
    for (int t = 0; t < DT_HF_NTENSORS; t++)
        cr_assert_eq(m.calls[t], 0, "get called before the checks");

    cr_assert_eq(dt_hf_write(P("x"), &c, DT_I32, 0, model_get, &m, &em), DT_EDTYPE);
    cr_assert(strstr(em.s, "i32"), "%s", em.s);
    bad = c;
    bad.kv_heads = 3;
    cr_assert_eq(dt_hf_write(P("x"), &bad, DT_F32, 0, model_get, &m, &em), DT_EINVAL);
    cr_assert(strstr(em.s, "kv_heads"), "%s", em.s);
    cr_assert(!exists(P("x")));

    /* the source fails midway: nothing is left, not even the directory */
    m.fail_at = DT_HF_W2;
    cr_assert_eq(dt_hf_write(P("new/sub"), &c, DT_BF16, 20000, model_get, &m, &em), DT_ECANCELED);
    cr_assert(strstr(em.s, "model.layers.0.mlp.down_proj.weight"), "%s", em.s);
    cr_assert(!exists(P("new/sub")));
    /* into an existing directory: its other files stay */
    cr_assert_eq(mkdir(P("keep"), 0755), 0);
    put_text(P("keep/README.md"), "mine");
    m.fail_at = DT_HF_LM_HEAD;
    cr_assert_eq(dt_hf_write(P("keep"), &c, DT_F32, 20000, model_get, &m, &em), DT_ECANCELED);
    cr_assert_eq(count_dir(P("keep")), 1);
    cr_assert(exists(P("keep/README.md")));
    model_free(&m);
}

/*-- the permutation, against a file built by hand ---------------------------*/

/* An HF-layout value that says where it came from: tensor, row, column. */
static float hf_value(int t, int layer, int64_t r, int64_t col)
{
    return (float)(t * 100000 + layer * 50000 + r * 128 + col);
}

/* DIR/model.safetensors for cfg, every tensor F32 of hf_value(), built with
 * the safetensors writer directly; `skip` left out, and then `extra` added
 * (dtype, ndim, shape; zeros) when not NULL. */
static void craft_weights(const char *path, const dt_model_cfg_t *c, const char *skip,
                          const char *extra, dt_dtype_t dtype, int ndim, const int64_t *shape)
{
    dt_st_writer_t *w = dt_st_writer_new();
    void *bufs[DT_HF_NTENSORS * MAXL + 1] = { 0 };
    dt_emsg_t em = { "" };
    int nb = 0;

    for (int t = 0; t < DT_HF_NTENSORS; t++)
        for (int l = 0; l < nlayers_of(c, t); l++) {
            int64_t n = dt_hf_numel(c, t), cols = cols_of(c, t), sh[2] = { n / cols, cols };
            bool vec = is_vec(t);
            float *data;
            char name[64];

            if (n == 0)
                continue;
            dt_hf_name(t, l, name, sizeof(name));
            if (skip && strcmp(name, skip) == 0)
                continue;
            data = bufs[nb++] = malloc((size_t)n * sizeof(float));
            for (int64_t i = 0; i < n; i++)
                data[i] = hf_value(t, l, i / cols, i % cols);
            cr_assert_eq(dt_st_writer_add(w, name, DT_F32, vec ? 1 : 2, vec ? &n : sh, data, &em),
                         0, "%s", em.s);
        }
    if (extra) {
        int64_t n = 1;

        for (int i = 0; i < ndim; i++)
            n *= shape[i];
        bufs[nb] = calloc((size_t)n, dt_st_dtype_size(dtype));
        cr_assert_eq(dt_st_writer_add(w, extra, dtype, ndim, shape, bufs[nb], &em), 0, "%s", em.s);
        nb++;
    }
    cr_assert_eq(dt_st_write(w, path, NULL, NULL, &em), 0, "%s", em.s);
    dt_st_writer_free(w);
    for (int i = 0; i < nb; i++)
        free(bufs[i]);
}

static json_t *base_config(void)
{
    return json_pack("{s:[s], s:s, s:i, s:i, s:i, s:i, s:i, s:i, s:i, s:f, s:f, s:b, s:b, s:s}",
                     "architectures", "LlamaForCausalLM", "model_type", "llama", "hidden_size", 32,
                     "num_hidden_layers", 2, "num_attention_heads", 4, "num_key_value_heads", 2,
                     "head_dim", 8, "intermediate_size", 64, "vocab_size", 128, "rms_norm_eps",
                     1e-5, "rope_theta", 500000.0, "tie_word_embeddings", 0, "attention_bias", 0,
                     "hidden_act", "silu");
}

/* A hand-made model directory DIR: base_config() and craft_weights(). */
static void craft_dir(const char *dir, const char *skip, const char *extra, dt_dtype_t dtype,
                      int ndim, const int64_t *shape)
{
    dt_model_cfg_t c = tiny_cfg();
    json_t *cfg = base_config();
    char path[600];

    cr_assert_eq(mkdir(dir, 0755), 0);
    snprintf(path, sizeof(path), "%s/config.json", dir);
    put_json(path, cfg);
    json_decref(cfg);
    snprintf(path, sizeof(path), "%s/model.safetensors", dir);
    craft_weights(path, &c, skip, extra, dtype, ndim, shape);
}

Test(hf, import_permutes_q_and_k_rows)
{
    dt_emsg_t em = { "" };
    const int D = 8;
    float buf[128 * 32];
    dt_hf_t *h;

    craft_dir(P("m"), NULL, NULL, DT_F32, 0, NULL);
    cr_assert_eq(dt_hf_open(P("m"), &h, &em), 0, "%s", em.s);
    for (int l = 0; l < 2; l++)
        for (int t = 0; t < DT_HF_NTENSORS; t++) {
            int64_t n = dt_hf_numel(dt_hf_cfg(h), t), cols = cols_of(dt_hf_cfg(h), t);
            bool perm = t == DT_HF_WQ || t == DT_HF_WK;

            if (!dt_hf_per_layer(t) && l > 0)
                continue;
            cr_assert_eq(dt_hf_read(h, t, l, buf, &em), 0, "%s", em.s);
            for (int64_t r = 0; r < n / cols; r++) {
                /* dt row h*D + 2i + k is HF row h*D + k*D/2 + i */
                int64_t hd = r / D, i = (r % D) / 2, k = r % 2;
                int64_t hf = perm ? hd * D + k * (D / 2) + i : r;

                for (int64_t col = 0; col < cols; col++)
                    cr_assert_eq(buf[r * cols + col],
                                 hf_value(t, dt_hf_per_layer(t) ? l : 0, hf, col),
                                 "tensor %d layer %d: dt row %lld col %lld", t, l, (long long)r,
                                 (long long)col);
            }
        }
    /* row 1 of q (dt) is HF row 4: the second of the pair (0, 4) */
    cr_assert_eq(dt_hf_read(h, DT_HF_WQ, 0, buf, &em), 0);
    cr_assert_eq(buf[1 * 32], hf_value(DT_HF_WQ, 0, 4, 0));
    cr_assert_eq(buf[2 * 32], hf_value(DT_HF_WQ, 0, 1, 0));
    cr_assert_eq(buf[9 * 32], hf_value(DT_HF_WQ, 0, 12, 0));
    dt_hf_close(h);
}

/*-- the transformers fixture -----------------------------------------------*/

static void expect_fixture_cfg(const dt_model_cfg_t *c, bool llama3)
{
    cr_assert_str_eq(c->name, "hf");
    cr_assert(c->dim == 32 && c->layers == 2 && c->heads == 4 && c->kv_heads == 2 && c->ffn == 64 &&
                  c->vocab == 128 && c->head_dim == 0 && !c->tied,
              "shape %d %d %d %d %d %d %d %d", c->dim, c->layers, c->heads, c->kv_heads, c->ffn,
              c->vocab, c->head_dim, c->tied);
    cr_assert_eq(c->rope.theta, 500000.0);
    cr_assert_eq(c->norm_eps, 1e-5f);
    if (llama3)
        cr_assert(c->rope.factor == 8 && c->rope.low_freq_factor == 1 &&
                  c->rope.high_freq_factor == 4 && c->rope.original_max_pos == 32);
    else
        cr_assert_eq(c->rope.factor, 0);
}

/* Every tensor of the fixture through dt_hf_read against the file's bytes
 * (q and k rows permuted); then exported again: the same bytes. */
static void check_fixture(const char *which, bool llama3)
{
    dt_model_cfg_t c;
    dt_st_reader_t *st, *st2;
    dt_emsg_t em = { "" };
    char path[4200], out[600];
    dt_hf_t *h;
    model_t m;

    snprintf(path, sizeof(path), "%s", fixture(which));
    if (!exists(path))
        cr_skip_test("%s is missing (tests/fixtures/hf_llama not in this tree)", path);
    cr_assert_eq(dt_hf_config_read(path, &c, &em), 0, "%s", em.s);
    expect_fixture_cfg(&c, llama3);
    cr_assert_eq(dt_hf_open(path, &h, &em), 0, "%s", em.s);
    expect_fixture_cfg(dt_hf_cfg(h), llama3);
    strcat(path, "/model.safetensors");
    cr_assert_eq(dt_st_open(path, &st, &em), 0, "%s", em.s);
    model_init(&m, &c, 0);
    for (int t = 0; t < DT_HF_NTENSORS; t++)
        for (int l = 0; l < nlayers_of(&c, t); l++) {
            int64_t n = dt_hf_numel(&c, t), rows = n / 32;
            float *raw = malloc((size_t)n * 4), *got = m.w[t][l];
            char nb[64];

            dt_hf_name(t, l, nb, sizeof(nb));
            cr_assert_eq(dt_hf_dtype(h, t, l), DT_F32);
            cr_assert_eq(dt_hf_read(h, t, l, got, &em), 0, "%s", em.s);
            cr_assert_eq(dt_st_read(st, nb, raw, (size_t)n * 4, &em), 0, "%s", em.s);
            if (t == DT_HF_WQ || t == DT_HF_WK) {
                for (int64_t r = 0; r < rows; r++) {
                    int64_t hf = r / 8 * 8 + (r % 2) * 4 + (r % 8) / 2;
                    cr_assert(memcmp(got + r * 32, raw + hf * 32, 32 * 4) == 0, "%s row %lld", nb,
                              (long long)r);
                }
            } else {
                cr_assert(memcmp(got, raw, (size_t)n * 4) == 0, "%s", nb);
            }
            free(raw);
        }
    dt_hf_close(h);

    /* back out: the same tensors, byte for byte, and the same config */
    snprintf(out, sizeof(out), "%s/%s", tmpdir, which);
    write_model(out, &m, DT_F32, 0);
    expect_model(out, &m, DT_F32);
    snprintf(out, sizeof(out), "%s/%s/model.safetensors", tmpdir, which);
    cr_assert_eq(dt_st_open(out, &st2, &em), 0, "%s", em.s);
    cr_assert_eq(dt_st_count(st2), dt_st_count(st));
    for (size_t i = 0; i < dt_st_count(st); i++) {
        const dt_st_tensor_t *a = dt_st_tensor(st, i), *b = dt_st_find(st2, a->name);
        size_t n = (size_t)(a->end - a->begin);
        char *x = malloc(n), *y = malloc(n);

        cr_assert_not_null(b, "%s", a->name);
        cr_assert_eq(b->end - b->begin, n);
        cr_assert_eq(dt_st_read(st, a->name, x, n, &em), 0);
        cr_assert_eq(dt_st_read(st2, a->name, y, n, &em), 0);
        cr_assert(memcmp(x, y, n) == 0, "%s differs after export", a->name);
        free(x);
        free(y);
    }
    dt_st_close(st2);
    dt_st_close(st);
    model_free(&m);
}

Test(hf, transformers_fixture_plain)
{
    check_fixture("plain", false);
}

Test(hf, transformers_fixture_llama3)
{
    check_fixture("llama3", true);
}

/*-- configs ----------------------------------------------------------------*/

/* config.json of base_config() with patch merged in (JSON text, may be
 * NULL) and del removed (may be NULL). */
static int read_patched(const char *patch, const char *del, dt_model_cfg_t *c, dt_emsg_t *em)
{
    json_t *cfg = base_config();

    if (patch) {
        json_error_t jerr;
        json_t *p = json_loads(patch, 0, &jerr);

        cr_assert_not_null(p, "bad test patch %s: %s", patch, jerr.text);
        json_object_update(cfg, p);
        json_decref(p);
    }
    if (del)
        json_object_del(cfg, del);
    mkdir(P("c"), 0755);
    put_json(P("c/config.json"), cfg);
    json_decref(cfg);
    return dt_hf_config_read(P("c"), c, em);
}

Test(hf, config_forms_transformers_writes)
{
    dt_model_cfg_t c;
    dt_emsg_t em = { "" };

    cr_assert_eq(read_patched(NULL, "rope_theta", &c, &em), 0, "%s", em.s);
    cr_assert_eq(c.rope.theta, 10000.0);
    cr_assert_eq(read_patched(NULL, "num_key_value_heads", &c, &em), 0, "%s", em.s);
    cr_assert_eq(c.kv_heads, 4);
    cr_assert_eq(read_patched("{\"num_key_value_heads\": null, \"head_dim\": null}", NULL, &c, &em),
                 0, "%s", em.s);
    cr_assert(c.kv_heads == 4 && c.head_dim == 0);
    cr_assert_eq(read_patched("{\"head_dim\": 16}", NULL, &c, &em), 0, "%s", em.s);
    cr_assert_eq(c.head_dim, 16);
    cr_assert_eq(
        read_patched("{\"tie_word_embeddings\": true, \"rope_scaling\": null}", NULL, &c, &em), 0,
        "%s", em.s);
    cr_assert(c.tied && c.rope.factor == 0);
    /* transformers 4.x */
    cr_assert_eq(read_patched("{\"rope_scaling\": {\"rope_type\": \"llama3\", \"factor\": 32.0, "
                              "\"low_freq_factor\": 1.0, \"high_freq_factor\": 4.0, "
                              "\"original_max_position_embeddings\": 8192}}",
                              NULL, &c, &em),
                 0, "%s", em.s);
    cr_assert(c.rope.factor == 32 && c.rope.low_freq_factor == 1 && c.rope.high_freq_factor == 4 &&
              c.rope.original_max_pos == 8192 && c.rope.theta == 500000);
    cr_assert_eq(read_patched("{\"rope_scaling\": {\"type\": \"llama3\", \"factor\": 2, "
                              "\"low_freq_factor\": 1, \"high_freq_factor\": 2, "
                              "\"original_max_position_embeddings\": 64}}",
                              NULL, &c, &em),
                 0, "%s", em.s);
    cr_assert_eq(c.rope.factor, 2);
    cr_assert_eq(read_patched("{\"rope_scaling\": {\"rope_type\": \"default\"}}", NULL, &c, &em), 0,
                 "%s", em.s);
    cr_assert_eq(c.rope.factor, 0);
    /* transformers 5, alone and beside agreeing 4.x keys */
    cr_assert_eq(read_patched("{\"rope_parameters\": {\"rope_type\": \"default\", "
                              "\"rope_theta\": 250000.0}}",
                              "rope_theta", &c, &em),
                 0, "%s", em.s);
    cr_assert_eq(c.rope.theta, 250000.0);
    cr_assert_eq(read_patched("{\"rope_parameters\": {\"rope_type\": \"llama3\", \"rope_theta\": "
                              "500000, \"factor\": 8, \"low_freq_factor\": 1, "
                              "\"high_freq_factor\": 4, \"original_max_position_embeddings\": "
                              "8192}, \"rope_scaling\": {\"rope_type\": \"llama3\", \"factor\": 8, "
                              "\"low_freq_factor\": 1, \"high_freq_factor\": 4, "
                              "\"original_max_position_embeddings\": 8192}}",
                              NULL, &c, &em),
                 0, "%s", em.s);
    cr_assert(c.rope.factor == 8 && c.rope.theta == 500000);
    /* keys dt does not use are ignored */
    cr_assert_eq(read_patched("{\"bos_token_id\": 1, \"pretraining_tp\": 1, \"use_cache\": true, "
                              "\"torch_dtype\": \"bfloat16\", \"max_position_embeddings\": 131072}",
                              NULL, &c, &em),
                 0, "%s", em.s);
}

Test(hf, config_refusals_name_file_and_key)
{
    static const struct {
        const char *patch, *del;
        int rc;
        const char *want;
    } cases[] = {
        { .del = "intermediate_size", .rc = DT_EINVAL, .want = "'intermediate_size' is missing" },
        { .del = "architectures", .rc = DT_EINVAL, .want = "'architectures' is missing" },
        { .del = "rms_norm_eps", .rc = DT_EINVAL, .want = "'rms_norm_eps' is missing" },
        { .patch = "{\"num_key_value_heads\": 3}",
          .rc = DT_EINVAL,
          .want = "'num_key_value_heads' 3 does not divide 'num_attention_heads' 4" },
        { .patch = "{\"architectures\": [\"MistralForCausalLM\"]}",
          .rc = DT_ENOTSUP,
          .want = "'architectures' is [\"MistralForCausalLM\"]" },
        { .patch = "{\"architectures\": \"LlamaForCausalLM\"}",
          .rc = DT_EINVAL,
          .want = "'architectures'" },
        { .patch = "{\"model_type\": \"mistral\"}", .rc = DT_ENOTSUP, .want = "'model_type'" },
        { .patch = "{\"attention_bias\": true}",
          .rc = DT_ENOTSUP,
          .want = "'attention_bias' is true" },
        { .patch = "{\"mlp_bias\": true}", .rc = DT_ENOTSUP, .want = "'mlp_bias' is true" },
        { .patch = "{\"attention_bias\": 0}", .rc = DT_EINVAL, .want = "'attention_bias' must be" },
        { .patch = "{\"hidden_act\": \"gelu\"}",
          .rc = DT_ENOTSUP,
          .want = "'hidden_act' is \"gelu\"" },
        { .patch = "{\"rope_scaling\": {\"rope_type\": \"yarn\", \"factor\": 4.0}}",
          .rc = DT_ENOTSUP,
          .want = "'rope_scaling.rope_type' is \"yarn\"" },
        { .patch = "{\"rope_scaling\": {\"type\": \"linear\", \"factor\": 2.0}}",
          .rc = DT_ENOTSUP,
          .want = "'rope_scaling.type' is \"linear\"" },
        { .patch = "{\"rope_scaling\": {\"type\": \"dynamic\", \"factor\": 2.0}}",
          .rc = DT_ENOTSUP,
          .want = "\"dynamic\"" },
        { .patch = "{\"rope_parameters\": {\"rope_type\": \"longrope\"}}",
          .rc = DT_ENOTSUP,
          .want = "'rope_parameters.rope_type' is \"longrope\"" },
        { .patch = "{\"rope_scaling\": {\"rope_type\": \"llama3\", \"low_freq_factor\": 1, "
                   "\"high_freq_factor\": 4, \"original_max_position_embeddings\": 8192}}",
          .rc = DT_EINVAL,
          .want = "'rope_scaling.factor' is missing" },
        { .patch = "{\"rope_scaling\": {\"rope_type\": \"llama3\", \"factor\": 8, "
                   "\"low_freq_factor\": 4, \"high_freq_factor\": 1, "
                   "\"original_max_position_embeddings\": 8192}}",
          .rc = DT_EINVAL,
          .want = "rope_low_freq_factor" },
        { .patch = "{\"rope_scaling\": {\"factor\": 8}}",
          .rc = DT_EINVAL,
          .want = "'rope_scaling.rope_type' is missing" },
        { .patch = "{\"rope_scaling\": \"llama3\"}",
          .rc = DT_EINVAL,
          .want = "'rope_scaling' must be an object" },
        { .patch = "{\"rope_parameters\": {\"rope_type\": \"default\", \"rope_theta\": 10000}}",
          .rc = DT_EINVAL,
          .want = "'rope_parameters.rope_theta' (10000) disagree" },
        { .patch = "{\"rope_parameters\": {\"rope_type\": \"default\"}, \"rope_scaling\": "
                   "{\"rope_type\": \"llama3\", \"factor\": 8, \"low_freq_factor\": 1, "
                   "\"high_freq_factor\": 4, \"original_max_position_embeddings\": 8192}}",
          .rc = DT_EINVAL,
          .want = "'rope_scaling' and 'rope_parameters' disagree" },
        { .patch = "{\"partial_rotary_factor\": 0.5}",
          .rc = DT_ENOTSUP,
          .want = "'partial_rotary_factor'" },
        { .patch = "{\"rope_theta\": -1}",
          .rc = DT_EINVAL,
          .want = "'rope_theta' must be a positive number" },
        { .patch = "{\"hidden_size\": \"32\"}",
          .rc = DT_EINVAL,
          .want = "'hidden_size' must be an integer from 1 to 2147483647, not \"32\"" },
        { .patch = "{\"hidden_size\": 32.0}", .rc = DT_EINVAL, .want = "'hidden_size' must be" },
        { .patch = "{\"vocab_size\": 0}", .rc = DT_EINVAL, .want = "'vocab_size' must be" },
        { .patch = "{\"num_attention_heads\": -4}",
          .rc = DT_EINVAL,
          .want = "'num_attention_heads' must be" },
        { .patch = "{\"num_hidden_layers\": 100000}",
          .rc = DT_EINVAL,
          .want = "'num_hidden_layers' must be an integer from 1 to 65536" },
        { .patch = "{\"num_attention_heads\": 5, \"num_key_value_heads\": 5}",
          .del = "head_dim",
          .rc = DT_EINVAL,
          .want = "'num_attention_heads' 5 does not divide 'hidden_size' 32" },
        { .patch = "{\"head_dim\": 7}", .rc = DT_EINVAL, .want = "must be even" },
        { .patch = "{\"tie_word_embeddings\": \"yes\"}",
          .rc = DT_EINVAL,
          .want = "'tie_word_embeddings' must be true or false" },
        { .patch = "{\"rms_norm_eps\": 0}", .rc = DT_EINVAL, .want = "'rms_norm_eps'" },
        { .patch = "{\"quantization_config\": {\"quant_method\": \"gptq\"}}",
          .rc = DT_ENOTSUP,
          .want = "'quantization_config'" },
    };

    for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
        dt_model_cfg_t c;
        dt_emsg_t em = { "" };
        int rc = read_patched(cases[i].patch, cases[i].del, &c, &em);

        cr_assert_eq(rc, cases[i].rc, "case %zu (%s): rc %s, expected %s: %s", i,
                     cases[i].patch ? cases[i].patch : cases[i].del, dt_err_name(rc),
                     dt_err_name(cases[i].rc), em.s);
        cr_assert(strstr(em.s, P("c/config.json")), "case %zu: no file named: %s", i, em.s);
        cr_assert(strstr(em.s, cases[i].want), "case %zu: '%s' not in: %s", i, cases[i].want, em.s);
    }
}

Test(hf, config_malformed_or_missing)
{
    dt_model_cfg_t c;
    dt_emsg_t em = { "" };

    cr_assert_eq(mkdir(P("c"), 0755), 0);
    cr_assert_eq(dt_hf_config_read(P("c"), &c, &em), DT_ENOENT);
    cr_assert(strstr(em.s, P("c/config.json")), "%s", em.s);
    put_text(P("c/config.json"), "{\n  \"hidden_size\": 32,\n  \"vocab_size\": 128,,\n}\n");
    cr_assert_eq(dt_hf_config_read(P("c"), &c, &em), DT_EFORMAT);
    cr_assert(strstr(em.s, P("c/config.json")) && strstr(em.s, "not valid JSON") &&
                  strstr(em.s, "line 3"),
              "%s", em.s);
    put_text(P("c/config.json"), "{\"hidden_size\": 32, \"hidden_size\": 64}");
    cr_assert_eq(dt_hf_config_read(P("c"), &c, &em), DT_EFORMAT);
    cr_assert(strstr(em.s, "duplicate"), "%s", em.s);
    put_text(P("c/config.json"), "[1, 2]");
    cr_assert_eq(dt_hf_config_read(P("c"), &c, &em), DT_EINVAL);
    cr_assert(strstr(em.s, "not a JSON object"), "%s", em.s);
}

/*-- weights refused --------------------------------------------------------*/

static void expect_open_fails(const char *dir, int err, const char *n1, const char *n2)
{
    dt_hf_t *h = (dt_hf_t *)1;
    dt_emsg_t em = { "" };
    int rc = dt_hf_open(dir, &h, &em);

    cr_assert_eq(rc, err, "rc %s, expected %s: %s", dt_err_name(rc), dt_err_name(err), em.s);
    cr_assert_null(h);
    cr_assert(strstr(em.s, n1), "'%s' not in: %s", n1, em.s);
    if (n2)
        cr_assert(strstr(em.s, n2), "'%s' not in: %s", n2, em.s);
}

Test(hf, tensor_missing_wrong_shape_or_dtype)
{
    int64_t s16x32[] = { 16, 32 }, s32x32[] = { 32, 32 }, s32[] = { 32 }, s1[] = { 4 };

    craft_dir(P("missing"), "model.layers.1.mlp.up_proj.weight", NULL, DT_F32, 0, NULL);
    expect_open_fails(P("missing"), DT_EFORMAT, P("missing/model.safetensors"),
                      "no tensor 'model.layers.1.mlp.up_proj.weight'");
    craft_dir(P("nohead"), "lm_head.weight", NULL, DT_F32, 0, NULL);
    expect_open_fails(P("nohead"), DT_EFORMAT, "no tensor 'lm_head.weight' (the model is not tied)",
                      NULL);
    craft_dir(P("shape"), "model.layers.0.self_attn.q_proj.weight",
              "model.layers.0.self_attn.q_proj.weight", DT_F32, 2, s16x32);
    expect_open_fails(P("shape"), DT_ESHAPE, P("shape/model.safetensors"),
                      "tensor 'model.layers.0.self_attn.q_proj.weight' has shape (16, 32), "
                      "config.json makes it (32, 32)");
    craft_dir(P("vec"), "model.norm.weight", "model.norm.weight", DT_F32, 2, s32x32);
    expect_open_fails(P("vec"), DT_ESHAPE, "'model.norm.weight' has shape (32, 32)", NULL);
    craft_dir(P("i32"), "model.layers.1.mlp.down_proj.weight",
              "model.layers.1.mlp.down_proj.weight", DT_I32, 2, (int64_t[]){ 32, 64 });
    expect_open_fails(P("i32"), DT_EDTYPE, P("i32/model.safetensors"),
                      "tensor 'model.layers.1.mlp.down_proj.weight' has dtype I32");
    craft_dir(P("bias"), NULL, "model.layers.0.self_attn.q_proj.bias", DT_F32, 1, s32);
    expect_open_fails(P("bias"), DT_ENOTSUP, P("bias/model.safetensors"),
                      "tensor 'model.layers.0.self_attn.q_proj.bias': biases are not supported");
    craft_dir(P("unknown"), NULL, "model.layers.0.self_attn.q_norm.weight", DT_F32, 1, s1);
    expect_open_fails(P("unknown"), DT_ENOTSUP, P("unknown/model.safetensors"),
                      "unknown tensor 'model.layers.0.self_attn.q_norm.weight'");
    craft_dir(P("weird"), NULL, "model.layers.00.mlp.up_proj.weight", DT_F32, 1, s1);
    expect_open_fails(P("weird"), DT_ENOTSUP, "unknown tensor 'model.layers.00.mlp.up_proj", NULL);
    craft_dir(P("ctl"), NULL, "evil\x1b[2Jname", DT_F32, 1, s1);
    expect_open_fails(P("ctl"), DT_ENOTSUP, "unknown tensor 'evil\\x1b[2Jname'", NULL);
    /* escaped as all shown text is (common/text.h): printable UTF-8 as it is */
    craft_dir(P("utf8"), NULL, "mod\xc3\xa8le.poids\r", DT_F32, 1, s1);
    expect_open_fails(P("utf8"), DT_ENOTSUP, "unknown tensor 'mod\xc3\xa8le.poids\\r'", NULL);
    craft_dir(P("layer"), NULL, "model.layers.2.mlp.up_proj.weight", DT_F32, 1, s1);
    expect_open_fails(P("layer"), DT_EFORMAT,
                      "tensor 'model.layers.2.mlp.up_proj.weight' is of layer 2, but config.json "
                      "has 2 layers",
                      NULL);
}

Test(hf, tolerated_extras)
{
    int64_t s4[] = { 4 };
    dt_emsg_t em = { "" };
    json_t *cfg;
    dt_hf_t *h;

    /* the RoPE table of old exports */
    craft_dir(P("inv"), NULL, "model.layers.1.self_attn.rotary_emb.inv_freq", DT_F32, 1, s4);
    cr_assert_eq(dt_hf_open(P("inv"), &h, &em), 0, "%s", em.s);
    dt_hf_close(h);
    /* a tied model whose file still carries the head */
    craft_dir(P("tied"), NULL, NULL, DT_F32, 0, NULL);
    cfg = base_config();
    json_object_set_new(cfg, "tie_word_embeddings", json_true());
    put_json(P("tied/config.json"), cfg);
    json_decref(cfg);
    cr_assert_eq(dt_hf_open(P("tied"), &h, &em), 0, "%s", em.s);
    cr_assert(dt_hf_cfg(h)->tied);
    dt_hf_close(h);
}

Test(hf, truncated_file_and_no_weights)
{
    dt_model_cfg_t c = tiny_cfg();
    model_t m;

    model_init(&m, &c, 9);
    write_model(P("out"), &m, DT_F32, 0);
    cr_assert_eq(truncate(P("out/model.safetensors"), 100000), 0);
    expect_open_fails(P("out"), DT_EFORMAT, P("out/model.safetensors"), NULL);
    unlink(P("out/model.safetensors"));
    expect_open_fails(P("out"), DT_ENOENT,
                      "neither model.safetensors nor model.safetensors.index.json", NULL);
    put_text(P("out/pytorch_model.bin"), "");
    expect_open_fails(P("out"), DT_ENOENT, "pytorch_model.bin is not read", NULL);
    model_free(&m);
}

/* A sharded export of the tiny model in DIR; its index as JSON (the
 * caller's) and the number of shards. */
static json_t *sharded(const char *dir, model_t *m, int *nshards)
{
    dt_model_cfg_t c = tiny_cfg();

    model_init(m, &c, 10);
    write_model(dir, m, DT_F32, 20000);
    *nshards = count_dir(dir) - 2;
    cr_assert_geq(*nshards, 3);
    return load_json(P("out/model.safetensors.index.json"));
}

static void put_index(json_t *idx)
{
    put_json(P("out/model.safetensors.index.json"), idx);
}

Test(hf, shard_missing_on_disk)
{
    model_t m;
    int n;
    json_t *idx = sharded(P("out"), &m, &n);
    char shard[64];

    snprintf(shard, sizeof(shard), "out/model-00002-of-%05d.safetensors", n);
    cr_assert_eq(unlink(P("%s", shard)), 0);
    expect_open_fails(P("out"), DT_ENOENT, P("%s", shard), "model.safetensors.index.json");
    json_decref(idx);
    model_free(&m);
}

Test(hf, tensor_missing_from_index)
{
    model_t m;
    int n;
    json_t *idx = sharded(P("out"), &m, &n);
    json_t *wm = json_object_get(idx, "weight_map");

    json_object_del(wm, "model.layers.1.self_attn.v_proj.weight");
    put_index(idx);
    expect_open_fails(P("out"), DT_EFORMAT,
                      "tensor 'model.layers.1.self_attn.v_proj.weight' is not listed in",
                      "model.safetensors.index.json");
    json_decref(idx);
    model_free(&m);
}

Test(hf, index_and_shards_disagree)
{
    model_t m;
    int n;
    json_t *idx = sharded(P("out"), &m, &n);
    json_t *wm = json_object_get(idx, "weight_map");
    char first[64], *where;

    /* mapped to a shard that lacks it */
    snprintf(first, sizeof(first), "model-00001-of-%05d.safetensors", n);
    where = strdup(json_string_value(json_object_get(wm, "model.norm.weight")));
    cr_assert_str_neq(where, first);
    json_object_set_new(wm, "model.norm.weight", json_string(first));
    put_index(idx);
    expect_open_fails(P("out"), DT_EFORMAT, "tensor 'model.norm.weight' is listed in", first);
    /* listed, but in no shard */
    json_object_set_new(wm, "model.norm.weight", json_string(where));
    json_object_set_new(wm, "model.layers.0.self_attn.rotary_emb.inv_freq", json_string(first));
    put_index(idx);
    expect_open_fails(P("out"), DT_EFORMAT,
                      "lists tensor 'model.layers.0.self_attn.rotary_emb.inv_freq' in", first);
    /* no weight map */
    json_object_del(idx, "weight_map");
    put_index(idx);
    expect_open_fails(P("out"), DT_EFORMAT, "'weight_map' is missing", NULL);
    /* not JSON */
    put_text(P("out/model.safetensors.index.json"), "{\"weight_map\": {");
    expect_open_fails(P("out"), DT_EFORMAT, "model.safetensors.index.json: not valid JSON", NULL);
    free(where);
    json_decref(idx);
    model_free(&m);
}

Test(hf, shard_path_must_stay_in_the_directory)
{
    model_t m;
    int n;
    json_t *idx = sharded(P("out"), &m, &n);
    json_t *wm = json_object_get(idx, "weight_map");
    char up[80];

    snprintf(up, sizeof(up), "../out/model-00001-of-%05d.safetensors", n);
    json_object_set_new(wm, "model.embed_tokens.weight", json_string(up));
    put_index(idx);
    expect_open_fails(P("out"), DT_EINVAL, "shard '../out/model-00001-of-",
                      "is not a plain file name");
    json_object_set_new(wm, "model.embed_tokens.weight", json_string(".."));
    put_index(idx);
    expect_open_fails(P("out"), DT_EINVAL, "shard '..' of tensor 'model.embed_tokens.weight'",
                      NULL);
    json_object_set_new(wm, "model.embed_tokens.weight", json_string("/etc/passwd"));
    put_index(idx);
    expect_open_fails(P("out"), DT_EINVAL, "shard '/etc/passwd'", NULL);
    json_decref(idx);
    model_free(&m);
}

Test(hf, bias_in_a_shard_is_refused)
{
    model_t m;
    int n;
    json_t *idx = sharded(P("out"), &m, &n);
    json_t *wm = json_object_get(idx, "weight_map");
    char first[64];

    snprintf(first, sizeof(first), "model-00001-of-%05d.safetensors", n);
    json_object_set_new(wm, "model.layers.0.self_attn.q_proj.bias", json_string(first));
    put_index(idx);
    expect_open_fails(P("out"), DT_ENOTSUP,
                      "model.safetensors.index.json: tensor "
                      "'model.layers.0.self_attn.q_proj.bias': biases are not supported",
                      NULL);
    json_decref(idx);
    model_free(&m);
}

/*-- the flat parameter array and the files' modes ----------------------------*/

/* dt_hf_offset places every tensor in dt's flat array (spec/model.h): the
 * tensors tile [0, nparams) exactly, and a tied head is the embedding. */
Test(hf, offsets_tile_the_flat_array)
{
    for (int tied = 0; tied < 2; tied++) {
        dt_model_cfg_t c = tiny_cfg();
        dt_model_layout_t lo;
        unsigned char *seen;

        c.tied = tied;
        dt_model_layout_init(&lo, &c);
        cr_assert_eq(lo.layers, c.layers);
        seen = calloc((size_t)lo.nparams, 1);
        for (int t = 0; t < DT_HF_NTENSORS; t++) {
            int n = dt_hf_per_layer((dt_hf_tensor_t)t) ? c.layers : 1;
            for (int l = 0; l < n; l++) {
                int64_t off = dt_hf_offset(&lo, (dt_hf_tensor_t)t, l),
                        k = dt_hf_numel(&c, (dt_hf_tensor_t)t);

                cr_assert_geq(off, 0, "tensor %d layer %d", t, l);
                cr_assert_leq(off + k, lo.nparams, "tensor %d layer %d", t, l);
                for (int64_t i = 0; i < k; i++)
                    cr_assert_eq(seen[off + i]++, 0, "tensor %d layer %d overlaps at %lld", t,
                                 l, (long long)(off + i));
            }
        }
        for (int64_t i = 0; i < lo.nparams; i++)
            cr_assert_eq(seen[i], 1, "tied %d: float %lld belongs to no tensor", tied,
                         (long long)i);
        cr_assert_eq(dt_hf_offset(&lo, DT_HF_LM_HEAD, 0), tied ? lo.tok_emb : lo.lm_head);
        cr_assert_eq(dt_hf_offset(&lo, DT_HF_WQ, 1), lo.layer[1].wq);
        cr_assert_eq(dt_hf_offset(&lo, DT_HF_W2, c.layers), -1);
        cr_assert_eq(dt_hf_offset(&lo, DT_HF_W2, -1), -1);
        cr_assert_eq(dt_hf_offset(&lo, DT_HF_NTENSORS, 0), -1);
        free(seen);
        dt_model_layout_close(&lo);
    }
}

/* An export is a model to share: 0644 less the umask, shards and JSON
 * alike (a checkpoint's shards stay 0600: test_ckpt). */
Test(hf, written_files_are_readable_by_others)
{
    static const char *const files[] = { "out/config.json", "out/model.safetensors.index.json",
                                         "out/model-00001-of-00003.safetensors",
                                         "out/model-00003-of-00003.safetensors" };
    dt_model_cfg_t c = tiny_cfg();
    dt_emsg_t em = { "" };
    mode_t old = umask(022);
    model_t m;

    model_init(&m, &c, 3);
    cr_assert_eq(dt_hf_check_target(P("out"), &em), 0, "%s", em.s);
    write_model(P("out"), &m, DT_BF16, 20000);
    umask(old);
    for (size_t i = 0; i < sizeof(files) / sizeof(files[0]); i++) {
        struct stat st;
        cr_assert_eq(stat(P("%s", files[i]), &st), 0, "%s: %s", files[i], strerror(errno));
        cr_assert_eq(st.st_mode & 0777, 0644, "%s: mode %o", files[i], st.st_mode & 0777);
    }
    cr_assert_eq(dt_hf_check_target(P("out"), &em), DT_EEXIST);
    cr_assert(strstr(em.s, "already exists"), "%s", em.s);
    model_free(&m);
}
