/* SPDX-License-Identifier: MIT
 *
 * Unit tests for common/spec: parsing spec text and files, the defaults a
 * spec carries (causal unless said otherwise), sizes with suffixes, setting
 * keys as flags do, the canonical text reading back to an equal spec, and
 * every refusal with the message a user would read (it names the key).
 * Nothing here needs a service.
 */
#include "config.h"

#include <criterion/criterion.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "common/mem.h"
#include "spec/model.h"
#include "spec/spec.h"
#include "spec/vocab.h"

/* Every field equal (strings by value). */
static void assert_spec_eq(const dt_spec_t *a, const dt_spec_t *b)
{
    const dt_conf_key_t *k;

    for (k = dt_spec_keys(); k->name != NULL; k++) {
        const char *fa = (const char *)a + k->offset, *fb = (const char *)b + k->offset;

        switch (k->type) {
        case DT_CONF_STRING: {
            const char *sa = *(char *const *)fa, *sb = *(char *const *)fb;
            cr_assert((sa == NULL) == (sb == NULL), "key %s: set in one spec only", k->name);
            if (sa != NULL)
                cr_assert_str_eq(sa, sb, "key %s", k->name);
            break;
        }
        case DT_CONF_BOOL:
            cr_assert_eq(*(const int *)fa, *(const int *)fb, "key %s", k->name);
            break;
        default:
            cr_assert_eq(*(const int64_t *)fa, *(const int64_t *)fb, "key %s", k->name);
        }
    }
    cr_assert_eq(a->causal_set, b->causal_set);
}

static int is_zero(const dt_spec_t *s)
{
    static const dt_spec_t zero;
    return memcmp(s, &zero, sizeof(zero)) == 0;
}

Test(spec, minimal_spec_and_defaults)
{
    dt_spec_t s;
    dt_emsg_t em = { "" };

    cr_assert_eq(dt_spec_parse("job.spec", "kind = attn\ntokens = 4096\n", &s, &em), 0, "%s", em.s);
    cr_assert_str_eq(s.kind, "attn");
    cr_assert_eq(s.tokens, 4096);
    cr_assert_eq(s.causal, 1, "causal is the default");
    cr_assert_eq(s.causal_set, 0);
    cr_assert_null(s.model);
    cr_assert_eq(s.ranks, 0);
    dt_spec_free(&s);
    cr_assert(is_zero(&s), "free leaves a zeroed spec");
}

Test(spec, causal_no_is_remembered)
{
    dt_spec_t s;
    dt_emsg_t em = { "" };

    cr_assert_eq(dt_spec_parse(NULL, "kind = attn\ntokens = 64\ncausal = no\n", &s, &em), 0);
    cr_assert_eq(s.causal, 0);
    cr_assert_eq(s.causal_set, 1);
    dt_spec_free(&s);
    cr_assert_eq(dt_spec_parse(NULL, "kind = attn\ntokens = 64\ncausal = yes\n", &s, &em), 0);
    cr_assert_eq(s.causal, 1);
    cr_assert_eq(s.causal_set, 1);
    dt_spec_free(&s);
}

Test(spec, token_sizes_are_powers_of_1024)
{
    static const struct {
        const char *text;
        int64_t tokens;
    } cases[] = {
        { "4096", 4096 },     { "64K", 65536 },      { "1M", 1048576 },
        { "1G", 1073741824 }, { "3M", 3 * 1048576 },
    };

    for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
        char *text = dt_xasprintf("kind = prefill\ntokens = %s\n", cases[i].text);
        dt_spec_t s;
        dt_emsg_t em = { "" };

        cr_assert_eq(dt_spec_parse("t", text, &s, &em), 0, "%s: %s", cases[i].text, em.s);
        cr_assert_eq(s.tokens, cases[i].tokens, "%s", cases[i].text);
        dt_spec_free(&s);
        free(text);
    }
}

static const char full_text[] = "name = \"long # context\"\n"
                                "kind = train\n"
                                "model = custom\n"
                                "dim = 2048\n"
                                "layers = 16\n"
                                "heads = 32\n"
                                "kv_heads = 8\n"
                                "ffn = 8192\n"
                                "vocab = 128256\n"
                                "rope_theta = 500000\n"
                                "head_dim = 64\n"
                                "tied = yes\n"
                                "norm_eps = 1e-6\n"
                                "rope_scaling = llama3\n"
                                "rope_factor = 8\n"
                                "rope_low_freq_factor = 1\n"
                                "rope_high_freq_factor = 4\n"
                                "rope_original_max_pos = 8192\n"
                                "init_from = /models/llama\n"
                                "tokens = 1M\n"
                                "pos_offset = 1000000\n"
                                "causal = no\n"
                                "deterministic = no\n"
                                "segments = 2048,8192,32768\n"
                                "dilations = 1,2,8\n"
                                "layout = contiguous\n"
                                "doc_mask = eot\n"
                                "eot_token = 128001\n"
                                "doc_positions = continue\n"
                                "sliding_window = 4096\n"
                                "sliding_window_layers = every:2\n"
                                "block_pattern = global:1,local:4\n"
                                "block_size = 64\n"
                                "dtype = bf16\n"
                                "precision = bf16\n"
                                "device = cuda\n"
                                "gpu = h100-sxm\n"
                                "ranks = 64\n"
                                "nodes = 8\n"
                                "gpus_per_node = 8\n"
                                "cpus_per_gpu = 12\n"
                                "host_memory = 1T\n"
                                "pcie_gbps = 25\n"
                                "spares = 2\n"
                                "time_limit = 90m\n"
                                "signal_lead = 5m\n"
                                "signal = USR1\n"
                                "partition = gpu\n"
                                "account = \"  lab \\\"x\\\" \"\n"
                                "qos = high\n"
                                "constraint = h100\n"
                                "exclude = node[1-3]\n"
                                "steps = 1000\n"
                                "seed = 7\n"
                                "batch = 4\n"
                                "dp = 2\n"
                                "shard = optimizer\n"
                                "recompute = layer\n"
                                "offload = activations,optimizer\n"
                                "ckpt_dtype = bf16\n"
                                "lr = 1e-3\n"
                                "min_lr = 0\n"
                                "warmup = 0\n"
                                "weight_decay = 0.05\n"
                                "clip = 0.5\n"
                                "adam_eps = 1e-8\n"
                                "data = /data/shards/*.bin\n"
                                "recall_keys = 16\n"
                                "recall_values = 32\n"
                                "recall_pairs = 4\n"
                                "recall_queries = 2\n"
                                "ckpt_every = 100\n"
                                "ckpt_keep = 3\n"
                                "mem_ckpt_every = 2\n"
                                "ckpt_dir = /scratch/ckpt\n"
                                "output_dir = /scratch/out\n"
                                "max_restarts = 2\n"
                                "repeat_failures = 3\n"
                                "repeat_startup_failures = 4\n";

Test(spec, format_parses_back_to_an_equal_spec)
{
    dt_spec_t a, b, c;
    dt_emsg_t em = { "" };
    char *t1, *t2;

    cr_assert_eq(dt_spec_parse("full", full_text, &a, &em), 0, "%s", em.s);
    cr_assert_str_eq(a.name, "long # context");
    cr_assert_str_eq(a.account, "  lab \"x\" ");
    cr_assert_eq(a.time_limit_ms, 90 * 60 * 1000);
    t1 = dt_spec_format(&a);
    cr_assert_eq(dt_spec_parse("formatted", t1, &b, &em), 0, "%s\n%s", em.s, t1);
    assert_spec_eq(&a, &b);
    t2 = dt_spec_format(&b);
    cr_assert_str_eq(t1, t2, "the canonical text is a fixed point");
    /* every key of the full spec is in the text, in table order */
    const char *at = t1;
    for (const dt_conf_key_t *k = dt_spec_keys(); k->name != NULL; k++) {
        char *line = dt_xasprintf("%s = ", k->name);
        const char *hit = strstr(at, line);
        cr_assert_not_null(hit, "key %s missing or out of order in:\n%s", k->name, t1);
        at = hit;
        free(line);
    }
    /* and the canonical sizes keep their suffix */
    cr_assert_not_null(strstr(t1, "tokens = 1M\n"), "%s", t1);
    cr_assert_not_null(strstr(t1, "time_limit = 90m\n"), "%s", t1);
    cr_assert_not_null(strstr(t1, "name = \"long # context\"\n"), "%s", t1);

    /* a minimal spec formats to its two keys */
    cr_assert_eq(dt_spec_parse("min", "tokens = 1000\nkind = attn\n", &c, &em), 0);
    free(t2);
    t2 = dt_spec_format(&c);
    cr_assert_str_eq(t2, "kind = attn\ntokens = 1000\n");
    free(t1);
    free(t2);
    dt_spec_free(&a);
    dt_spec_free(&b);
    dt_spec_free(&c);
}

Test(spec, set_builds_what_parse_reads)
{
    static const char *const kv[][2] = {
        { "kind", "train" },
        { "tokens", "1M" },
        { "model", "custom" },
        { "dim", "2048" },
        { "layers", "16" },
        { "heads", "32" },
        { "kv-heads", "8" },
        { "ffn", "8192" },
        { "vocab", "128256" },
        { "rope_theta", "500000" },
        { "head_dim", "64" },
        { "tied", "yes" },
        { "norm_eps", "1e-6" },
        { "rope_scaling", "llama3" },
        { "rope_factor", "8" },
        { "rope_low_freq_factor", "1" },
        { "rope_high_freq_factor", "4" },
        { "rope_original_max_pos", "8192" },
        { "init_from", "/models/llama" },
        { "pos_offset", "1000000" },
        { "causal", "no" },
        { "deterministic", "no" },
        { "segments", "2048,8192,32768" },
        { "dilations", "1,2,8" },
        { "layout", "contiguous" },
        { "doc_mask", "eot" },
        { "eot_token", "128001" },
        { "doc_positions", "continue" },
        { "sliding_window", "4096" },
        { "sliding_window_layers", "every:2" },
        { "block_pattern", "global:1,local:4" },
        { "block_size", "64" },
        { "dtype", "bf16" },
        { "precision", "bf16" },
        { "device", "cuda" },
        { "gpu", "h100-sxm" },
        { "ranks", "64" },
        { "nodes", "8" },
        { "gpus_per_node", "8" },
        { "cpus_per_gpu", "12" },
        { "host_memory", "1T" },
        { "pcie_gbps", "25" },
        { "spares", "2" },
        { "time_limit", "90m" },
        { "signal_lead", "5m" },
        { "signal", "USR1" },
        { "partition", "gpu" },
        { "account", "  lab \"x\" " },
        { "qos", "high" },
        { "constraint", "h100" },
        { "exclude", "node[1-3]" },
        { "steps", "1000" },
        { "seed", "7" },
        { "batch", "4" },
        { "dp", "2" },
        { "shard", "optimizer" },
        { "recompute", "layer" },
        { "offload", "activations,optimizer" },
        { "ckpt_dtype", "bf16" },
        { "lr", "1e-3" },
        { "min_lr", "0" },
        { "warmup", "0" },
        { "weight_decay", "0.05" },
        { "clip", "0.5" },
        { "adam_eps", "1e-8" },
        { "data", "/data/shards/*.bin" },
        { "recall_keys", "16" },
        { "recall_values", "32" },
        { "recall_pairs", "4" },
        { "recall_queries", "2" },
        { "ckpt_every", "100" },
        { "ckpt_keep", "3" },
        { "mem_ckpt_every", "2" },
        { "ckpt_dir", "/scratch/ckpt" },
        { "output_dir", "/scratch/out" },
        { "max_restarts", "2" },
        { "repeat_failures", "3" },
        { "repeat_startup_failures", "4" },
        { "name", "long # context" },
    };
    dt_spec_t a = { 0 }, b;
    dt_emsg_t em = { "" };

    for (size_t i = 0; i < sizeof(kv) / sizeof(kv[0]); i++)
        cr_assert_eq(dt_spec_set(&a, kv[i][0], kv[i][1], &em), 0, "%s: %s", kv[i][0], em.s);
    cr_assert_eq(dt_spec_check(&a, &em), 0, "%s", em.s);
    cr_assert_eq(dt_spec_parse("full", full_text, &b, &em), 0, "%s", em.s);
    assert_spec_eq(&a, &b);
    /* a later value replaces the earlier one */
    cr_assert_eq(dt_spec_set(&a, "model", "tiny", &em), 0);
    cr_assert_str_eq(a.model, "tiny");
    dt_spec_free(&a);
    dt_spec_free(&b);
}

Test(spec, load_reads_a_file)
{
    char path[] = "/tmp/dt-spec-XXXXXX";
    int fd = mkstemp(path);
    dt_spec_t s;
    dt_emsg_t em = { "" };

    cr_assert(fd >= 0);
    cr_assert_eq(write(fd, full_text, strlen(full_text)), (ssize_t)strlen(full_text));
    close(fd);
    cr_assert_eq(dt_spec_load(path, &s, &em), 0, "%s", em.s);
    cr_assert_str_eq(s.kind, "train");
    cr_assert_eq(s.ckpt_keep, 3);
    dt_spec_free(&s);
    unlink(path);
    cr_assert_eq(dt_spec_load(path, &s, &em), DT_ENOENT);
    cr_assert_not_null(strstr(em.s, path), "%s", em.s);
    cr_assert(is_zero(&s));
}

/* Each refusal: the text, the code, words the message must contain. */
static const struct refusal {
    const char *text;
    int rc;
    const char *words[2];
} refusals[] = {
    { "tokens = 64\n", DT_ECONF, { "missing required key 'kind'", NULL } },
    { "kind = attn\n", DT_ECONF, { "missing required key 'tokens'", NULL } },
    { "kind = decode\ntokens = 64\n", DT_EINVAL, { "key 'kind'", "attn, prefill or train" } },
    { "kind = attn\ntokens = 0\n", DT_ECONF, { "key 'tokens'", "out of range" } },
    { "kind = attn\ntokens = many\n", DT_ECONF, { "key 'tokens'", "bad value" } },
    { "kind = attn\ntokens = 2048T\n", DT_ECONF, { "key 'tokens'", "out of range" } },
    { "kind = attn\ntokens = 64\nmodel = gpt2\n", DT_EINVAL, { "key 'model'", "llama3-8b" } },
    { "kind = attn\ntokens = 64\nmodel = custom\n", DT_EINVAL, { "key 'dim'", "custom" } },
    { "kind = prefill\ntokens = 64\nnorm_eps = 0\n", DT_EINVAL, { "key 'norm_eps'", "(0, 1)" } },
    { "kind = prefill\ntokens = 64\nnorm_eps = 1\n", DT_EINVAL, { "key 'norm_eps'", "(0, 1)" } },
    { "kind = prefill\ntokens = 64\nnorm_eps = tiny\n", DT_EINVAL, { "key 'norm_eps'", NULL } },
    { "kind = prefill\ntokens = 64\nrope_scaling = yarn\n", DT_EINVAL,
      { "key 'rope_scaling'", "llama3" } },
    { "kind = prefill\ntokens = 64\nrope_scaling = llama3\nrope_factor = 8\n", DT_EINVAL,
      { "rope_low_freq_factor", "llama3" } },
    { "kind = prefill\ntokens = 64\nrope_factor = 8\n", DT_EINVAL,
      { "key 'rope_factor'", "rope_scaling = llama3" } },
    { "kind = prefill\ntokens = 64\nrope_scaling = llama3\nrope_factor = 0.5\n"
      "rope_low_freq_factor = 1\nrope_high_freq_factor = 4\nrope_original_max_pos = 8192\n",
      DT_EINVAL, { "key 'rope_factor'", "at least 1" } },
    { "kind = prefill\ntokens = 64\nrope_scaling = llama3\nrope_factor = 8\n"
      "rope_low_freq_factor = 4\nrope_high_freq_factor = 1\nrope_original_max_pos = 8192\n",
      DT_EINVAL, { "rope_low_freq_factor 4", "below" } },
    { "kind = prefill\ntokens = 64\nrope_scaling = llama3\nrope_factor = 8\n"
      "rope_low_freq_factor = 1\nrope_high_freq_factor = 4\n", DT_EINVAL,
      { "rope_original_max_pos", NULL } },
    { "kind = prefill\ntokens = 64\npos_offset = -1\n", DT_ECONF, { "key 'pos_offset'", NULL } },
    { "kind = prefill\ntokens = 64\nhead_dim = 1\n", DT_ECONF, { "key 'head_dim'", NULL } },
    { "kind = attn\ntokens = 64\nmodel = custom\ndim = 64\nlayers = 1\nheads = 4\nkv_heads = 2\n"
      "ffn = 128\n",
      DT_EINVAL,
      { "key 'vocab'", "custom" } },
    { "kind = attn\ntokens = 64\ntied = maybe\n", DT_EINVAL, { "key 'tied'", "yes or no" } },
    { "kind = attn\ntokens = 64\nlayout = spiral\n", DT_EINVAL, { "key 'layout'", "zigzag" } },
    { "kind = attn\ntokens = 64\nprecision = fp8\n", DT_EINVAL, { "key 'precision'", "bf16" } },
    { "kind = attn\ntokens = 64\ngpu = a100\n", DT_EINVAL, { "key 'gpu'", "h100-sxm" } },
    { "kind = attn\ntokens = 64\nsegments = 16\n",
      DT_EINVAL,
      { "key 'segments'", "needs key 'dilations'" } },
    { "kind = attn\ntokens = 64\ndilations = 2\n",
      DT_EINVAL,
      { "key 'dilations'", "needs key 'segments'" } },
    { "kind = attn\ntokens = 64\nsegments = 16,x\ndilations = 1,2\n",
      DT_EINVAL,
      { "key 'segments'", "not a list of positive integers" } },
    { "kind = attn\ntokens = 64\nsegments = 16,32\ndilations = 1,0\n",
      DT_EINVAL,
      { "key 'dilations'", "not a list of positive integers" } },
    { "kind = attn\ntokens = 64\nsegments = 16,32\ndilations = 1\n",
      DT_EINVAL,
      { "segments has 2 values but dilations has 1", NULL } },
    { "kind = attn\ntokens = 64\nranks = 0\n", DT_ECONF, { "key 'ranks'", "out of range" } },
    { "kind = attn\ntokens = 64\ncausal = perhaps\n", DT_ECONF, { "key 'causal'", NULL } },
    { "kind = attn\ntokens = 64\nwidth = 3\n", DT_ECONF, { "unknown key 'width'", NULL } },
    { "kind = attn\ntokens = 64\nkind = train\n", DT_ECONF, { "duplicate key 'kind'", NULL } },
    { "kind = attn\ntokens = 64\ndata =\n", DT_EINVAL, { "key 'data'", "empty" } },
    { "kind = attn\ntokens = 64\ndevice = rocm\n", DT_EINVAL, { "key 'device'", "cpu or cuda" } },
    { "kind = attn\ntokens = 64\ndtype = fp8\n", DT_EINVAL, { "key 'dtype'", "bf16" } },
    { "kind = attn\ntokens = 64\ndevice = cuda\ngpu = cpu\n",
      DT_EINVAL,
      { "device = cuda with gpu = cpu", "h100-sxm" } },
    { "kind = attn\ntokens = 64\ndevice = cpu\ngpu = h200\n",
      DT_EINVAL,
      { "device = cpu with gpu = h200", "device = cuda" } },
    { "kind = attn\ntokens = 64\ndtype = bf16\n",
      DT_EINVAL,
      { "key 'dtype' = bf16", "fp32 only" } },
    { "kind = attn\ntokens = 64\ndevice = cpu\nprecision = fp16\n",
      DT_EINVAL,
      { "key 'precision' = fp16", "fp32 only" } },
    { "kind = attn\ntokens = 64\ndevice = cuda\ndtype = bf16\nprecision = fp16\n",
      DT_EINVAL,
      { "keys 'dtype' = bf16 and 'precision' = fp16 differ", NULL } },
    { "kind = attn\ntokens = 64\ncpus_per_gpu = 4\n",
      DT_EINVAL,
      { "key 'cpus_per_gpu' is for device = cuda", NULL } },
    { "kind = attn\ntokens = 64\ndevice = cuda\ncpus_per_gpu = 0\n",
      DT_ECONF,
      { "key 'cpus_per_gpu'", "out of range" } },
    { "kind = attn\ntokens = 64\noutput_dir = out/attn\n",
      DT_EINVAL,
      { "key 'output_dir' = 'out/attn'", "an absolute path" } },
};

/* device, gpu and dtype default from one another as dt-spec(5) says. */
Test(spec, device_gpu_and_dtype_defaults)
{
    static const struct {
        const char *keys, *device, *gpu, *dtype;
    } cases[] = {
        { "", "cpu", "cpu", "fp32" },
        { "gpu = cpu\n", "cpu", "cpu", "fp32" },
        { "device = cpu\n", "cpu", "cpu", "fp32" },
        { "gpu = h100-sxm\n", "cuda", "h100-sxm", "bf16" },
        { "gpu = h200\ndtype = fp16\n", "cuda", "h200", "fp16" },
        { "device = cuda\n", "cuda", "h100-sxm", "bf16" },
        { "device = cuda\ngpu = h200\nprecision = fp16\n", "cuda", "h200", "fp16" },
        { "device = cuda\ndtype = fp32\n", "cuda", "h100-sxm", "fp32" },
        { "device = cpu\ndtype = fp32\n", "cpu", "cpu", "fp32" },
    };
    for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
        char text[256];
        dt_spec_t s;
        dt_emsg_t em = { "" };

        snprintf(text, sizeof(text), "kind = train\ntokens = 64\n%s", cases[i].keys);
        cr_assert_eq(dt_spec_parse("d", text, &s, &em), 0, "%s: %s", text, em.s);
        cr_assert_str_eq(dt_spec_device(&s), cases[i].device, "%s", text);
        cr_assert_str_eq(dt_spec_gpu(&s), cases[i].gpu, "%s", text);
        cr_assert_str_eq(dt_spec_dtype(&s), cases[i].dtype, "%s", text);
        char *f = dt_spec_format(&s);
        dt_spec_t again;
        cr_assert_eq(dt_spec_parse("f", f, &again, &em), 0, "%s", em.s);
        cr_assert_str_eq(dt_spec_device(&again), cases[i].device);
        cr_assert_str_eq(dt_spec_dtype(&again), cases[i].dtype);
        free(f);
        dt_spec_free(&again);
        dt_spec_free(&s);
    }
}

Test(spec, every_refusal_names_the_key_and_leaves_out_zeroed)
{
    for (size_t i = 0; i < sizeof(refusals) / sizeof(refusals[0]); i++) {
        const struct refusal *r = &refusals[i];
        dt_spec_t s;
        dt_emsg_t em = { "" };
        int rc;

        memset(&s, 0xa5, sizeof(s));
        rc = dt_spec_parse("bad.spec", r->text, &s, &em);
        cr_assert_eq(rc, r->rc, "case %zu: rc %d (%s), expected %d\n%s", i, rc, em.s, r->rc,
                     r->text);
        for (int w = 0; w < 2 && r->words[w]; w++)
            cr_assert_not_null(strstr(em.s, r->words[w]), "case %zu: '%s' not in '%s'", i,
                               r->words[w], em.s);
        cr_assert(is_zero(&s), "case %zu: out not zeroed", i);
    }
}

Test(spec, set_refuses_with_the_key_named)
{
    static const struct {
        const char *key, *value, *words;
        int rc;
    } cases[] = {
        { "tokens", "lots", "key 'tokens': bad value 'lots'", DT_EINVAL },
        { "tokens", "0", "key 'tokens': value '0' out of range", DT_ERANGE },
        { "ranks", "2000000", "key 'ranks'", DT_ERANGE },
        { "kv-heads", "-1", "key 'kv_heads'", DT_ERANGE },
        { "causal", "sometimes", "key 'causal': bad value", DT_EINVAL },
        { "gpu", "tpu", "key 'gpu': unknown value 'tpu'", DT_EINVAL },
        { "signal", "TERM", "key 'signal': unknown value 'TERM' (expected USR1 or USR2)",
          DT_EINVAL },
        { "name", "two\nlines", "key 'name': control character", DT_EINVAL },
        { "segments", "1,,2", "key 'segments'", DT_EINVAL },
        { "dilations", "x", "key 'dilations'", DT_EINVAL },
        { "colour", "red", "unknown spec key 'colour'", DT_EINVAL },
        { "time_limit", "forever", "key 'time_limit'", DT_EINVAL },
    };
    dt_spec_t s = { 0 };

    for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
        dt_emsg_t em = { "" };
        int rc = dt_spec_set(&s, cases[i].key, cases[i].value, &em);

        cr_assert_eq(rc, cases[i].rc, "%s=%s: rc %d (%s)", cases[i].key, cases[i].value, rc, em.s);
        cr_assert_not_null(strstr(em.s, cases[i].words), "'%s' not in '%s'", cases[i].words, em.s);
    }
    cr_assert(is_zero(&s), "failed sets change nothing");
}

Test(spec, check_wants_kind_and_tokens)
{
    dt_spec_t s = { 0 };
    dt_emsg_t em = { "" };

    cr_assert_eq(dt_spec_check(&s, &em), DT_EINVAL);
    cr_assert_not_null(strstr(em.s, "key 'kind'"), "%s", em.s);
    cr_assert_eq(dt_spec_set(&s, "kind", "prefill", &em), 0);
    cr_assert_eq(dt_spec_check(&s, &em), DT_EINVAL);
    cr_assert_not_null(strstr(em.s, "key 'tokens'"), "%s", em.s);
    cr_assert_not_null(strstr(em.s, "1024"), "the message says sizes are powers of 1024");
    cr_assert_eq(dt_spec_set(&s, "tokens", "1G", &em), 0);
    cr_assert_eq(dt_spec_check(&s, &em), 0, "%s", em.s);
    cr_assert_eq(s.causal_set, 0);
    cr_assert_eq(dt_spec_set(&s, "causal", "no", &em), 0);
    cr_assert_eq(s.causal_set, 1);
    cr_assert_eq(s.causal, 0);
    dt_spec_free(&s);
}

Test(spec, every_key_has_help)
{
    int n = 0;

    for (const dt_conf_key_t *k = dt_spec_keys(); k->name != NULL; k++, n++) {
        cr_assert_not_null(k->help, "key %s", k->name);
        cr_assert(strlen(k->help) > 4, "key %s", k->name);
    }
    cr_assert_eq(n, 79, "79 keys, one per dt_spec_t field (dt-spec(5) lists them)");
    dt_spec_free(NULL);
}

Test(spec, lr_must_be_a_positive_number)
{
    static const char *const bad[] = { "0", "-1e-3", "abc", "1e-3x", "11", "nan" };
    dt_spec_t s;
    dt_emsg_t em = { "" };

    for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
        char *t = dt_xasprintf("kind = train\ntokens = 256\nlr = %s\n", bad[i]);
        cr_assert_lt(dt_spec_parse("s", t, &s, &em), 0, "lr = %s accepted", bad[i]);
        cr_assert(strstr(em.s, "'lr'") != NULL, "%s", em.s);
        free(t);
    }
    cr_assert_eq(dt_spec_parse("s", "kind = train\ntokens = 256\nlr = 2.5e-4\n", &s, &em), 0,
                 "%s", em.s);
    cr_assert_str_eq(s.lr, "2.5e-4");
    dt_spec_free(&s);
}

/*-- files that are not text, and files that are not files ----------------------*/

/* Write n bytes to a new temporary file; its path in path. */
static void write_file(char path[32], const char *bytes, size_t n)
{
    int fd;

    strcpy(path, "/tmp/dt-spec-XXXXXX");
    fd = mkstemp(path);
    cr_assert(fd >= 0);
    cr_assert_eq(write(fd, bytes, n), (ssize_t)n);
    close(fd);
}

/* UTF-8 text, tabs and CRLF line ends are fine (called by the test of
 * refusals: what it refuses stops there). */
static void utf8_text_tabs_and_crlf_accepted(void)
{
    static const char text[] = "\xef\xbb\xbfkind = attn\r\ntokens\t= 64\r\n"
                               "name = caf\xc3\xa9 \xe6\x97\xa5\xe6\x9c\xac \xf0\x9f\x9a\x80\r\n"
                               "# \xc3\xa9t\xc3\xa9\r\n";
    char path[32];
    dt_spec_t s;
    dt_emsg_t em = { "" };

    write_file(path, text, sizeof(text) - 1);
    cr_assert_eq(dt_spec_load(path, &s, &em), 0, "%s", em.s);
    cr_assert_str_eq(s.name, "caf\xc3\xa9 \xe6\x97\xa5\xe6\x9c\xac \xf0\x9f\x9a\x80");
    dt_spec_free(&s);
    unlink(path);
}

/* A value (or a comment) with a control character (C0, DEL, C1) or bytes
 * that are not UTF-8 is refused naming the line and the key, from text and
 * from a file; the spec stays zeroed. */
Test(spec, control_characters_and_bad_utf8_refused_naming_line_and_key)
{
    static const struct {
        const char *line, *words;
    } cases[] = {
        { "name = a\x1b[2Jb", "key 'name': control character U+001B at column 9" },
        { "name = a\x07", "key 'name': control character U+0007" },
        { "name = a\x7f", "key 'name': control character U+007F" },
        { "name = a\xc2\x9b" "31m", "key 'name': control character U+009B" }, /* C1 CSI */
        { "name = \xc2\x85", "key 'name': control character U+0085" },            /* C1 NEL */
        { "data = /x/\xff.bin", "key 'data': invalid UTF-8 (byte 0xff) at column 11" },
        { "ckpt_dir = \xc0\xaf", "key 'ckpt_dir': invalid UTF-8 (byte 0xc0)" }, /* overlong '/' */
        { "partition = \xed\xa0\x80", "key 'partition': invalid UTF-8" },        /* surrogate */
        { "account = ab\xe2\x82", "key 'account': invalid UTF-8" },             /* cut short */
        { "tokens = 64\x1b", "key 'tokens': control character U+001B" },
        { "# a comment \x1b]0;owned\x07", "3: control character U+001B at column 13" },
        { "\x9b", "3: invalid UTF-8 (byte 0x9b) at column 1" },
    };

    for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
        char *text = dt_xasprintf("kind = attn\ntokens = 64\n%s\n", cases[i].line), path[32];
        const char *tokens_line = strncmp(cases[i].line, "tokens", 6) == 0 ? "x" : NULL;
        dt_spec_t s;
        dt_emsg_t em = { "" };

        if (tokens_line) { /* tokens on line 2 is the bad one: no duplicate */
            free(text);
            text = dt_xasprintf("kind = attn\nname = x\n%s\n", cases[i].line);
        }
        memset(&s, 0xa5, sizeof(s));
        cr_assert_eq(dt_spec_parse("bad.spec", text, &s, &em), DT_ECONF, "case %zu: %s", i, em.s);
        cr_assert(strstr(em.s, "bad.spec:3: ") == em.s, "case %zu: no line: %s", i, em.s);
        cr_assert(strstr(em.s, cases[i].words), "case %zu: '%s' not in '%s'", i, cases[i].words,
                  em.s);
        cr_assert(is_zero(&s), "case %zu: out not zeroed", i);
        for (const char *p = em.s; *p; p++) /* the message itself is safe to print */
            cr_assert((unsigned char)*p >= 0x20 && (unsigned char)*p < 0x7f, "case %zu: %s", i,
                      em.s);

        write_file(path, text, strlen(text));
        memset(&s, 0xa5, sizeof(s));
        cr_assert_eq(dt_spec_load(path, &s, &em), DT_ECONF, "case %zu: %s", i, em.s);
        cr_assert(strstr(em.s, ":3: ") && strstr(em.s, path) == em.s, "case %zu: %s", i, em.s);
        cr_assert(strstr(em.s, cases[i].words), "case %zu: %s", i, em.s);
        cr_assert(is_zero(&s), "case %zu: out not zeroed", i);
        dt_spec_t p = { 0 };
        cr_assert_eq(dt_spec_load_partial(path, &p, &em), DT_ECONF, "case %zu: %s", i, em.s);
        cr_assert(strstr(em.s, cases[i].words), "case %zu: %s", i, em.s);
        cr_assert_null(p.name);
        unlink(path);
        free(text);
    }
    utf8_text_tabs_and_crlf_accepted();
}

/* A NUL byte in a file is a control character on its line, not the end of
 * the file (which would drop the lines after it unread). */
Test(spec, nul_byte_in_a_file_refused)
{
    static const char text[] = "kind = attn\nname = a\0b\ntokens = 64\n";
    char path[32];
    dt_spec_t s;
    dt_emsg_t em = { "" };

    write_file(path, text, sizeof(text) - 1);
    cr_assert_eq(dt_spec_load(path, &s, &em), DT_ECONF, "%s", em.s);
    cr_assert(strstr(em.s, ":2: key 'name': control character U+0000"), "%s", em.s);
    unlink(path);
}

/* A flag's value is checked as a file's is (there is no line to name). */
Test(spec, set_refuses_c1_and_bad_utf8)
{
    static const char *const bad[] = { "a\xc2\x9b" "1m", "\xff", "a\xe2\x82", "a\x7f", "\x1b" };
    dt_spec_t s = { 0 };

    for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
        dt_emsg_t em = { "" };

        cr_assert_eq(dt_spec_set(&s, "name", bad[i], &em), DT_EINVAL, "case %zu", i);
        cr_assert(strstr(em.s, "key 'name': "), "%s", em.s);
        for (const char *p = em.s; *p; p++)
            cr_assert((unsigned char)*p >= 0x20 && (unsigned char)*p < 0x7f, "%s", em.s);
    }
    cr_assert(is_zero(&s));
    dt_spec_t c = { 0 };
    dt_emsg_t em = { "" };
    c.kind = dt_xstrdup("attn");
    c.tokens = 64;
    c.ckpt_dir = dt_xstrdup("/ckpt/\xc2\x85");
    cr_assert_eq(dt_spec_check(&c, &em), DT_EINVAL);
    cr_assert(strstr(em.s, "key 'ckpt_dir': control character U+0085"), "%s", em.s);
    dt_spec_free(&c);
}

/* A FIFO, a directory or a device is refused before it is read: a FIFO
 * with no writer would block the reader forever (dtctl submit, plan,
 * run --local, dtengine train --spec). */
Test(spec, fifo_and_directory_refused_without_blocking, .timeout = 20)
{
    char dir[] = "/tmp/dt-spec-XXXXXX", fifo[64];
    dt_spec_t s, p = { 0 };
    dt_emsg_t em = { "" };

    cr_assert_not_null(mkdtemp(dir));
    snprintf(fifo, sizeof(fifo), "%s/job.spec", dir);
    cr_assert_eq(mkfifo(fifo, 0600), 0);
    cr_assert_eq(dt_spec_load(fifo, &s, &em), DT_EINVAL, "%s", em.s);
    cr_assert(strstr(em.s, "job.spec: not a regular file"), "%s", em.s);
    cr_assert_eq(dt_spec_load_partial(fifo, &p, &em), DT_EINVAL, "%s", em.s);
    cr_assert_eq(dt_spec_load(dir, &s, &em), DT_EINVAL, "%s", em.s);
    cr_assert(strstr(em.s, "is a directory"), "%s", em.s);
    cr_assert_eq(dt_spec_load("/dev/zero", &s, &em), DT_EINVAL, "%s", em.s);
    unlink(fifo);
    rmdir(dir);
}

/* The one model table (spec/model.h): a spec's model is its preset with the
 * keys given on top, custom has theta 500000 and an untied head, and the
 * table printed in dt-spec(5) is the table in the code. */
static bool same_model(const dt_model_cfg_t *a, const dt_model_cfg_t *b)
{
    return strcmp(a->name, b->name) == 0 && a->dim == b->dim && a->layers == b->layers &&
           a->heads == b->heads && a->kv_heads == b->kv_heads && a->ffn == b->ffn &&
           a->vocab == b->vocab && a->rope.theta == b->rope.theta &&
           a->norm_eps == b->norm_eps && a->tied == b->tied;
}

Test(spec, model_presets_resolve_once)
{
    static const char *const names[] = { "tiny", "llama3-8b", "llama3-70b" };
    dt_model_cfg_t m, p;
    dt_spec_t s = { 0 };
    dt_emsg_t em = { "" };

    cr_assert_eq(dt_model_from_spec(&s, &m, &em), 0, "%s", em.s);
    cr_assert_str_eq(m.name, "tiny", "no model key: tiny");
    for (size_t i = 0; i < sizeof(names) / sizeof(names[0]); i++) {
        s.model = (char *)names[i];
        cr_assert_eq(dt_model_from_spec(&s, &m, &em), 0, "%s", em.s);
        cr_assert_eq(dt_model_preset(names[i], &p, &em), 0, "%s", em.s);
        cr_assert(same_model(&m, &p), "%s: spec and preset differ", names[i]);
        cr_assert_eq(dt_model_cfg_check(&m, &em), 0, "%s: %s", names[i], em.s);
    }
    /* custom with llama3-8b's shape is llama3-8b but for its name */
    s = (dt_spec_t){ .model = "custom", .dim = 4096, .layers = 32, .heads = 32, .kv_heads = 8,
                     .ffn = 14336, .vocab = 128256 };
    cr_assert_eq(dt_model_from_spec(&s, &m, &em), 0, "%s", em.s);
    cr_assert_eq(dt_model_preset("llama3-8b", &p, &em), 0);
    strcpy(p.name, "custom");
    cr_assert(same_model(&m, &p), "custom shaped like llama3-8b: theta %g tied %d",
                 m.rope.theta, m.tied);
    /* keys over a preset */
    s = (dt_spec_t){ .model = "tiny", .layers = 1, .rope_theta = 20000, .tied = "no" };
    cr_assert_eq(dt_model_from_spec(&s, &m, &em), 0, "%s", em.s);
    cr_assert(m.layers == 1 && m.dim == 256 && m.rope.theta == 20000 && !m.tied);
    /* the settings: head_dim, norm_eps, LLaMA 3.1's rope scaling */
    s = (dt_spec_t){ .model = "tiny", .head_dim = 64, .norm_eps = "1e-6",
                     .rope_scaling = "llama3", .rope_factor = "8", .rope_low_freq_factor = "1",
                     .rope_high_freq_factor = "4", .rope_original_max_pos = 8192 };
    cr_assert_eq(dt_model_from_spec(&s, &m, &em), 0, "%s", em.s);
    cr_assert(m.head_dim == 64 && dt_model_head_dim(&m) == 64 && m.norm_eps == 1e-6f);
    cr_assert(m.rope.factor == 8 && m.rope.low_freq_factor == 1 &&
              m.rope.high_freq_factor == 4 && m.rope.original_max_pos == 8192);
    cr_assert_eq(dt_model_cfg_check(&m, &em), 0, "head_dim 64 x 8 heads over dim 256: %s",
                 em.s);
    m.head_dim = 7;
    cr_assert_eq(dt_model_cfg_check(&m, &em), DT_EINVAL);
    cr_assert(strstr(em.s, "head dim 7 must be even"), "%s", em.s);
    s = (dt_spec_t){ .model = "llama3-7b" };
    cr_assert_eq(dt_model_from_spec(&s, &m, &em), DT_EINVAL);
    cr_assert(strstr(em.s, "unknown model 'llama3-7b'"), "%s", em.s);
}

Test(spec, model_table_in_dt_spec_5_is_the_code)
{
    const char *src = getenv("DT_SRCDIR");
    char path[4096], line[256];
    int rows = 0;
    FILE *f;

    cr_assert_not_null(src, "DT_SRCDIR is not set (run through make check)");
    snprintf(path, sizeof(path), "%s/man/dt-spec.5", src);
    cr_assert_not_null(f = fopen(path, "r"), "%s", path);
    while (fgets(line, sizeof(line), f)) {
        char name[32], tied[8];
        int dim, layers, heads, kv, ffn, vocab;
        double theta;
        dt_model_cfg_t m;
        dt_emsg_t em = { "" };

        if (sscanf(line, "%31s %d %d %d %d %d %d %lf %7s", name, &dim, &layers, &heads, &kv,
                   &ffn, &vocab, &theta, tied) != 9)
            continue;
        /* the page writes llama3\-8b (a groff hyphen) */
        for (char *d = name, *q = name;; q++)
            if (*q != '\\' && (*d++ = *q) == '\0')
                break;
        cr_assert_eq(dt_model_preset(name, &m, &em), 0, "dt-spec(5) row '%s': %s", name, em.s);
        cr_assert(m.dim == dim && m.layers == layers && m.heads == heads && m.kv_heads == kv &&
                      m.ffn == ffn && m.vocab == vocab && m.rope.theta == theta &&
                      m.tied == (strcmp(tied, "yes") == 0),
                  "dt-spec(5) row '%s' differs from spec/model.c", name);
        rows++;
    }
    fclose(f);
    cr_assert_eq(rows, 3, "dt-spec(5) has %d preset rows, the code 3", rows);
}

/* A list key (offload): none or distinct words joined by commas, in any
 * order; the set it means; what is wrong named. */
Test(spec, list_key_offload)
{
    static const struct {
        const char *value;
        int ok;
        unsigned set;
        const char *msg;
    } cases[] = {
        { "none", 1, 0, NULL },
        { "activations", 1, DT_OFFLOAD_ACTIVATIONS, NULL },
        { "optimizer,activations", 1, DT_OFFLOAD_ACTIVATIONS | DT_OFFLOAD_OPTIMIZER, NULL },
        { "activations,optimizer", 1, DT_OFFLOAD_ACTIVATIONS | DT_OFFLOAD_OPTIMIZER, NULL },
        { "activations,params", 0, 0, "unknown word 'params' in 'activations,params'" },
        { "optimizer,optimizer", 0, 0, "'optimizer' twice" },
        { "activations,", 0, 0, "empty word in 'activations,'" },
        { ",optimizer", 0, 0, "empty word" },
        { "none,optimizer", 0, 0, "unknown word 'none'" },
        { "", 0, 0, "empty word" },
    };
    char fmt[64];

    cr_assert(dt_spec_key_is_list("offload"));
    cr_assert(!dt_spec_key_is_list("shard"));
    for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
        dt_spec_t s = { 0 };
        dt_emsg_t em = { "" };
        int rc = dt_spec_set(&s, "offload", cases[i].value, &em);
        if (!cases[i].ok) {
            cr_assert_lt(rc, 0, "offload = '%s' accepted", cases[i].value);
            cr_assert(strstr(em.s, "key 'offload'") && strstr(em.s, cases[i].msg), "'%s': %s",
                      cases[i].value, em.s);
        } else {
            cr_assert_eq(rc, 0, "'%s': %s", cases[i].value, em.s);
            cr_assert_eq(dt_spec_offload(&s), cases[i].set, "'%s'", cases[i].value);
            dt_vocab_format_set(fmt, sizeof(fmt), dt_offload_names, cases[i].set);
            unsigned back;
            cr_assert_eq(dt_offload_parse("x", fmt, &back, NULL), 0, "%s", fmt);
            cr_assert_eq(back, cases[i].set, "%s", fmt);
        }
        dt_spec_free(&s);
    }
    dt_spec_t none = { 0 }, file;
    dt_emsg_t em = { "" };
    cr_assert_eq(dt_spec_offload(&none), 0u, "unset is none");
    cr_assert_eq(dt_spec_parse("job.spec",
                               "kind = train\ntokens = 64\noffload = optimizer,activations\n",
                               &file, &em),
                 0, "%s", em.s);
    cr_assert_eq(dt_spec_offload(&file), DT_OFFLOAD_ACTIVATIONS | DT_OFFLOAD_OPTIMIZER);
    dt_spec_free(&file);
    cr_assert_lt(dt_spec_parse("job.spec", "kind = train\ntokens = 64\noffload = all\n", &file,
                               &em),
                 0);
    cr_assert(strstr(em.s, "key 'offload': unknown word 'all'"), "%s", em.s);
    dt_vocab_format_set(fmt, sizeof(fmt), dt_offload_names,
                        DT_OFFLOAD_OPTIMIZER | DT_OFFLOAD_ACTIVATIONS);
    cr_assert_str_eq(fmt, "activations,optimizer");
}

/* What each engine runs: any offload set, for train only. */
Test(spec, offload_runs)
{
    unsigned both = DT_OFFLOAD_ACTIVATIONS | DT_OFFLOAD_OPTIMIZER;
    dt_emsg_t em = { "" };

    cr_assert_eq(dt_vocab_offload_runs(DT_DEVICE_CPU, DT_KIND_TRAIN, both, &em), 0);
    cr_assert_eq(dt_vocab_offload_runs(DT_DEVICE_CUDA, DT_KIND_TRAIN, 0, &em), 0);
    cr_assert_eq(
        dt_vocab_offload_runs(DT_DEVICE_CUDA, DT_KIND_TRAIN, DT_OFFLOAD_OPTIMIZER, &em), 0);
    cr_assert_eq(dt_vocab_offload_runs(DT_DEVICE_CUDA, DT_KIND_TRAIN, both, &em), 0);
    cr_assert_eq(
        dt_vocab_offload_runs(DT_DEVICE_CUDA, DT_KIND_TRAIN, DT_OFFLOAD_ACTIVATIONS, &em), 0);
    cr_assert_eq(dt_vocab_offload_runs(DT_DEVICE_CUDA, DT_KIND_PREFILL, both, &em), DT_ENOTSUP);
    cr_assert(strstr(em.s, "kind = train"), "%s", em.s);
    cr_assert_eq(dt_vocab_offload_runs(DT_DEVICE_CPU, DT_KIND_ATTN, DT_OFFLOAD_OPTIMIZER, &em),
                 DT_ENOTSUP);
    cr_assert(strstr(em.s, "kind = train"), "%s", em.s);
}

/* ckpt_dtype: fp32 (unset) or bf16; another word is refused naming the
 * key and the words. */
Test(spec, ckpt_dtype_key)
{
    dt_spec_t s;
    dt_emsg_t em = { "" };

    cr_assert_eq(dt_spec_parse("a.spec", "kind = train\ntokens = 64\n", &s, &em), 0, "%s", em.s);
    cr_assert_eq(dt_spec_ckpt_dtype(&s), DT_CKPT_FP32, "unset is fp32");
    dt_spec_free(&s);
    cr_assert_eq(dt_spec_parse("b.spec", "kind = train\ntokens = 64\nckpt_dtype = bf16\n", &s, &em),
                 0, "%s", em.s);
    cr_assert_eq(dt_spec_ckpt_dtype(&s), DT_CKPT_BF16);
    dt_spec_free(&s);
    cr_assert_lt(dt_spec_parse("c.spec", "kind = train\ntokens = 64\nckpt_dtype = fp16\n", &s, &em),
                 0);
    cr_assert(strstr(em.s, "ckpt_dtype") && strstr(em.s, "fp32") && strstr(em.s, "bf16"), "%s",
              em.s);
}
