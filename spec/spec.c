/* SPDX-License-Identifier: MIT
 *
 * Job specifications: the key table over dt_spec_t, parsing (through conf.c,
 * so a spec file reads and fails exactly as dt.conf does), setting one key
 * as a command-line flag would, the checks every spec passes (values in
 * their sets, the keys that go together), and the canonical text that reads
 * back to an equal spec. The table is the documentation's source: dt-spec(5)
 * lists the same keys with the same help lines.
 *
 * Not here: what the values mean for a plan (presets, defaults that depend
 * on the cluster, divisibility): that is plan/ (request.c, cost.c). The branch
 * lists are parsed with spec/attn_spec.c's parser, so a list the engine
 * would refuse is refused here too; that makes this file need
 * engine/libdtspec.
 */
#include "config.h"

#include <inttypes.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/fileio.h"
#include "common/mem.h"
#include "spec/attn_spec.h"
#include "spec/mask_rules.h"
#include "spec/model.h"
#include "spec/spec.h"
#include "spec/vocab.h"

/* Which dtengine commands take a key as an option (dt_conf_key_t.tags):
 * one bit per kind (spec/vocab.h). */
#define A (1u << DT_KIND_ATTN)
#define P (1u << DT_KIND_PREFILL)
#define T (1u << DT_KIND_TRAIN)
#define PT (P | T)
#define APT (A | P | T)

#define KEY(n, t, f, lo, hi, req, d, tg, h)                                                   \
    {                                                                                         \
        .name = (n), .type = (t), .offset = offsetof(dt_spec_t, f), .min = (lo), .max = (hi), \
        .required = (req), .def = (d), .tags = (tg), .help = (h)                              \
    }
#define STR(n, f, req, d, tg, h) KEY(n, DT_CONF_STRING, f, 0, 0, req, d, tg, h)
#define INT(n, f, lo, hi, d, tg, h) KEY(n, DT_CONF_INT, f, lo, hi, 0, d, tg, h)

#define TOKENS_MAX (INT64_C(1) << 50) /* dt_attn_parse_branches' limit for lengths */
#define DAY_MS (INT64_C(24) * 3600 * 1000)
#define SPEC_FILE_MAX (1 << 20) /* conf.c's limit for a file */
#define PRESET "the model preset's"

/* Order is the canonical order of dt_spec_format and of dt-spec(5). The
 * defaults (.def) are the ones every binary uses: dt_spec_int, _real and
 * _word read them from here, and dt-spec(5) says each as "Default: X."
 * (tests/unit/test_spec.c compares them). */
static const dt_conf_key_t keys[] = {
    STR("name", name, 0, "job", 0, "free text naming the job"),
    STR("kind", kind, 1, NULL, 0, "attn, prefill or train"),
    STR("model", model, 0, "tiny", PT, "tiny, llama3-8b, llama3-70b or custom"),
    INT("dim", dim, 1, 1 << 20, PRESET, PT, "model width (overrides the preset)"),
    INT("layers", layers, 1, 100000, PRESET, PT, "transformer layers"),
    INT("heads", heads, 1, 65536, PRESET, PT, "query heads H"),
    INT("kv_heads", kv_heads, 1, 65536, PRESET, PT, "key/value heads Hkv, divides heads"),
    INT("ffn", ffn, 1, 1 << 22, PRESET, PT, "SwiGLU hidden width"),
    INT("vocab", vocab, 1, 1 << 24, PRESET, PT, "vocabulary size"),
    INT("rope_theta", rope_theta, 1, INT64_MAX, PRESET, PT, "RoPE base"),
    INT("head_dim", head_dim, 2, 65536, "dim / heads", PT, "width D of one attention head"),
    STR("tied", tied, 0, PRESET, PT, "yes or no: the LM head shares the embedding"),
    STR("norm_eps", norm_eps, 0, "1e-5", PT, "RMSNorm epsilon, a number in (0, 1)"),
    STR("rope_scaling", rope_scaling, 0, "none", PT,
        "none or llama3 (LLaMA 3.1's frequency scaling)"),
    STR("rope_factor", rope_factor, 0, NULL, PT,
        "llama3 scaling: how much slower the low frequencies turn, a number >= 1"),
    STR("rope_low_freq_factor", rope_low_freq_factor, 0, NULL, PT,
        "llama3 scaling: wavelengths above original_max_pos / this are scaled"),
    STR("rope_high_freq_factor", rope_high_freq_factor, 0, NULL, PT,
        "llama3 scaling: wavelengths below original_max_pos / this are kept"),
    INT("rope_original_max_pos", rope_original_max_pos, 1, INT64_C(1) << 40, NULL, PT,
        "llama3 scaling: the context length the model was trained at"),
    STR("init_from", init_from, 0, NULL, PT,
        "a Hugging Face LLaMA directory (config.json, safetensors): shape, settings and "
        "weights"),
    KEY("tokens", DT_CONF_SIZE, tokens, 1, TOKENS_MAX, 1, NULL, PT,
        "sequence length T; K, M, G, T suffixes are powers of 1024"),
    INT("pos_offset", pos_offset, 0, INT64_C(1) << 52, "0", PT,
        "position of the first token, for a window of a longer sequence"),
    KEY("causal", DT_CONF_BOOL, causal, 0, 0, 0, "yes", APT, "causal attention"),
    KEY("deterministic", DT_CONF_BOOL, deterministic, 0, 0, 0, "yes", A | T,
        "cuda: the attention backward repeats to the bit (cuDNN's deterministic engines; "
        "no: its fastest, several times faster, not reproducible)"),
    STR("segments", segments, 0, NULL, APT, "dilated segment lengths w1,w2,... (with dilations)"),
    STR("dilations", dilations, 0, NULL, APT, "dilation rates r1,r2,... (with segments)"),
    STR("layout", layout, 0, "zigzag when causal, else contiguous", APT,
        "contiguous, zigzag or balanced (zigzag four times over, for masked work)"),
    STR("doc_mask", doc_mask, 0, "none", PT,
        "none or eot: a document starts at each eot_token; attention and scored targets stay "
        "inside documents"),
    INT("eot_token", eot_token, 0, (1 << 24) - 1,
        "config.json's eos_token_id with init_from, else 50256", PT,
        "the token that starts each document (doc_mask = eot)"),
    STR("doc_positions", doc_positions, 0, "continue", PT,
        "continue or reset: RoPE positions run on across documents, or restart at 0 in each"),
    INT("sliding_window", sliding_window, 1, TOKENS_MAX, "none", APT,
        "attend the W nearest keys only: causal i - j < W, else |i - j| < W"),
    STR("sliding_window_layers", sliding_window_layers, 0, "all", PT,
        "all or every:K: the layers with the window (every:K: layers 0, K, 2K, ...)"),
    STR("block_pattern", block_pattern, 0, "none", APT,
        "local:W, strided:S, global:G, or several joined by commas: the blocks (of "
        "block_size tokens) a query block attends"),
    INT("block_size", block_size, 1, 1 << 30, "64", APT, "tokens per block of block_pattern"),
    STR("dtype", dtype, 0, "bf16 on cuda, fp32 on cpu", APT,
        "compute dtype: bf16 or fp16 on cuda, fp32 on cpu"),
    STR("precision", precision, 0, NULL, 0, "the old name of dtype (both given: they must agree)"),
    STR("device", device, 0, "cuda when gpu is a GPU preset, else cpu", APT, "cpu or cuda"),
    STR("gpu", gpu, 0, "h100-sxm on cuda, else cpu", 0, "cluster preset: h100-sxm, h200 or cpu"),
    INT("ranks", ranks, 1, 1000000, "auto", 0, "ranks R per ring (auto: the fewest that fit)"),
    INT("nodes", nodes, 1, 1000000, "auto", 0, "nodes available (auto: as many as needed)"),
    INT("gpus_per_node", gpus_per_node, 1, 1024, "the cluster preset's", 0,
        "GPUs (or CPU ranks) per node"),
    INT("cpus_per_gpu", cpus_per_gpu, 1, 1024, "the site's", 0,
        "cuda: CPU cores Slurm gives each GPU's rank"),
    KEY("host_memory", DT_CONF_SIZE, host_memory, INT64_C(1) << 30, INT64_C(1) << 60, 0,
        "the cluster preset's", 0,
        "cuda: host memory per node for page-locked buffers (K, M, G, T: powers of 1024)"),
    INT("pcie_gbps", pcie_gbps, 1, 100000, "the cluster preset's", 0,
        "cuda: host-device bandwidth per GPU and direction, GB/s"),
    INT("spares", spares, 0, 1000000, "0", 0, "hot spare ranks held back"),
    KEY("time_limit", DT_CONF_DURATION, time_limit_ms, 1000, 366 * DAY_MS, 0,
        "the partition's", 0, "wall-clock limit such as 90m or 2h"),
    KEY("signal_lead", DT_CONF_DURATION, signal_lead_ms, 1000, DAY_MS, 0, "2m", 0,
        "Slurm signals the job this long before its time limit"),
    STR("signal", signal, 0, "dt.conf's slurm_signal, else USR2", 0,
        "Slurm's warning signal: USR1 or USR2"),
    STR("partition", partition, 0, NULL, 0, "Slurm partition"),
    STR("account", account, 0, NULL, 0, "Slurm account"),
    STR("qos", qos, 0, NULL, 0, "Slurm quality of service"),
    STR("constraint", constraint, 0, NULL, 0, "Slurm node features"),
    STR("exclude", exclude, 0, NULL, 0, "Slurm nodes not to use"),
    INT("steps", steps, 0, INT64_C(1) << 40, "1", T,
        "training steps (0: none, the initial or loaded parameters are the result)"),
    INT("seed", seed, 0, INT64_MAX, "0", APT, "random seed"),
    INT("batch", batch, 1, 1 << 20, "1", T, "sequences per training step"),
    INT("dp", dp, 1, 65536, "1", T,
        "data parallel: dp rings of `ranks` ranks, each ring its own sequences, the gradient "
        "reduced over all (train)"),
    STR("shard", shard, 0, "auto", T,
        "none, optimizer, gradients or parameters: each rank keeps 1/(dp R) of the AdamW "
        "state, then of the gradients too, then of the parameters too (auto: the planner "
        "picks the least that fits and the device runs)"),
    STR("recompute", recompute, 0, "auto", T,
        "none or layer: keep each layer's input only and recompute the layer in the "
        "backward (auto: none, or layer when nothing fits without)"),
    STR("offload", offload, 0, "none", T,
        "a list of activations and optimizer (or none): what training keeps in host memory "
        "instead of the device's"),
    STR("ckpt_dtype", ckpt_dtype, 0, "fp32", T,
        "fp32 or bf16: the dtype of the layer inputs kept for recompute = layer (fp32 exact; "
        "bf16 half the memory, rounded)"),
    STR("lr", lr, 0, "3e-3", T, "peak learning rate, a number in (0, 10]"),
    STR("min_lr", min_lr, 0, "3e-4", T,
        "the learning rate the cosine schedule ends at, a number in [0, 10]"),
    STR("warmup", warmup, 0, "steps / 10", T,
        "steps of linear warm-up to lr, a whole number >= 0"),
    STR("weight_decay", weight_decay, 0, "0.1", T,
        "AdamW's decoupled weight decay, a number in [0, 10]"),
    STR("clip", clip, 0, "1", T,
        "clip the gradient's global norm to this, a number >= 0 (0: no clipping)"),
    STR("adam_eps", adam_eps, 0, "1e-5", T, "AdamW's epsilon, a number in [1e-30, 1]"),
    STR("data", data, 0, "recall", PT,
        "recall (generated task), or token files: llm.c shards or .npy ids"),
    INT("recall_keys", recall_keys, 1, 1 << 20, "128", T, "recall task: distinct keys"),
    INT("recall_values", recall_values, 1, 1 << 20, "128", T,
        "recall task: distinct values (chance is 1/values)"),
    INT("recall_pairs", recall_pairs, 1, 1 << 20, "16, fewer when the sequence is short", T,
        "recall task: key-value pairs planted per sequence"),
    INT("recall_queries", recall_queries, 1, 1 << 20, "8", T,
        "recall task: queries at the end (at most the pairs)"),
    INT("ckpt_every", ckpt_every, 1, INT64_C(1) << 40,
        "train: the last step (one checkpoint at the end); prefill: 1", PT,
        "steps (prefill: layers) between checkpoints"),
    INT("ckpt_keep", ckpt_keep, 1, 1000000, "3", PT, "checkpoints kept"),
    INT("mem_ckpt_every", mem_ckpt_every, 0, INT64_C(1) << 40, "auto", PT,
        "under agents: steps (prefill: layers) between in-memory checkpoints, which the agents "
        "hold and a recovery resumes from before disk (0: none; auto: 1 where the planner "
        "finds the host memory, else none)"),
    STR("ckpt_dir", ckpt_dir, 0, "under agents the job's directory's ckpt/, else none", PT,
        "checkpoint directory"),
    STR("output_dir", output_dir, 0, "under agents the job's directory's output/, else none",
        A | P, "where attn and prefill write their outputs, an absolute path"),
    INT("max_restarts", max_restarts, 1, 1000000, "5", 0, "recoveries before the job fails"),
    INT("repeat_failures", repeat_failures, 1, 1000000, "2", 0,
        "the same failure (rank, cause, step) this often mid-run fails the job"),
    INT("repeat_startup_failures", repeat_startup_failures, 1, 1000000, "3", 0,
        "the same failure before a generation's first step this often fails the job"),
    { .name = NULL },
};
#undef A
#undef P
#undef T
#undef PT
#undef APT

const dt_conf_key_t *dt_spec_keys(void)
{
    return keys;
}

/*-- value sets ----------------------------------------------------------------*/

static const char *const yesno[] = { "yes", "no", NULL };
static const char *const scalings[] = { "none", "llama3", NULL };
/* Only the two srun passes on unchanged: it turns TERM, INT, HUP and QUIT
 * into a kill of the step and does not forward the others (dt-spec(5)). */
static const char *const signals[] = { "USR1", "USR2", NULL };

/* The keys whose values are words, and the words (the vocabulary's own
 * tables, spec/vocab.h, and the model presets'). A list key's value is a
 * set of its words: "none", or words joined by commas, each once
 * (dt_vocab_parse_set). */
static const struct {
    const char *key;
    const char *const *set;
    bool list;
} sets[] = {
    { "kind", dt_kind_names, false },         { "model", dt_model_names, false },
    { "tied", yesno, false },                 { "layout", dt_layout_names, false },
    { "dtype", dt_compute_dtype_names, false }, { "precision", dt_compute_dtype_names, false },
    { "device", dt_device_names, false },     { "gpu", dt_gpu_names, false },
    { "signal", signals, false },             { "rope_scaling", scalings, false },
    { "recompute", dt_recompute_names, false }, { "shard", dt_shard_names, false },
    { "offload", dt_offload_names, true },
    { "ckpt_dtype", dt_ckpt_dtype_names, false },
    { "doc_mask", dt_doc_mask_names, false },   { "doc_positions", dt_doc_positions_names, false },
};

const char *const *dt_spec_key_values(const char *key)
{
    for (size_t i = 0; i < sizeof(sets) / sizeof(sets[0]); i++)
        if (strcmp(sets[i].key, key) == 0)
            return sets[i].set;
    return NULL;
}

bool dt_spec_key_is_list(const char *key)
{
    for (size_t i = 0; i < sizeof(sets) / sizeof(sets[0]); i++)
        if (strcmp(sets[i].key, key) == 0)
            return sets[i].list;
    return false;
}

static void *field(const dt_spec_t *s, const dt_conf_key_t *k)
{
    return (char *)s + k->offset;
}

static const dt_conf_key_t *find_key(const char *name)
{
    for (const dt_conf_key_t *k = keys; k->name != NULL; k++)
        if (strcmp(k->name, name) == 0)
            return k;
    return NULL;
}

#define UNGIVEN INT64_MIN /* an integer field the parser did not write */

static size_t key_index(const dt_conf_key_t *k)
{
    return (size_t)(k - keys);
}

static void mark_given(dt_spec_t *s, const dt_conf_key_t *k)
{
    size_t i = key_index(k);
    s->given[i / 64] |= UINT64_C(1) << (i % 64);
}

static bool given_bit(const dt_spec_t *s, const dt_conf_key_t *k)
{
    size_t i = key_index(k);
    return (s->given[i / 64] >> (i % 64)) & 1;
}

static bool key_given(const dt_spec_t *s, const dt_conf_key_t *k)
{
    if (given_bit(s, k))
        return true;
    switch (k->type) {
    case DT_CONF_STRING:
        return *(char **)field(s, k) != NULL;
    case DT_CONF_BOOL:
        return strcmp(k->name, "causal") == 0 && s->causal_set;
    default:
        return *(int64_t *)field(s, k) != 0;
    }
}

void dt_spec_unset_int(dt_spec_t *s, const char *name)
{
    const dt_conf_key_t *k = find_key(name);
    if (k == NULL || k->type == DT_CONF_STRING || k->type == DT_CONF_BOOL)
        abort(); /* a programmer's error */
    *(int64_t *)field(s, k) = 0;
    size_t i = key_index(k);
    s->given[i / 64] &= ~(UINT64_C(1) << (i % 64));
}

bool dt_spec_given(const dt_spec_t *s, const char *name)
{
    const dt_conf_key_t *k = find_key(name);
    return k != NULL && key_given(s, k);
}

/* Before the conf parser writes the fields: every integer and boolean
 * field marked unwritten, so that a key given as 0 is told from one not
 * given. */
static void mark_unwritten(dt_spec_t *s)
{
    for (const dt_conf_key_t *k = keys; k->name != NULL; k++)
        if (k->type == DT_CONF_BOOL)
            *(int *)field(s, k) = -1;
        else if (k->type != DT_CONF_STRING)
            *(int64_t *)field(s, k) = UNGIVEN;
}

/* After it: the keys written are given; the others back to 0 (causal to
 * its default, yes). */
static void collect_given(dt_spec_t *s)
{
    for (const dt_conf_key_t *k = keys; k->name != NULL; k++) {
        if (k->type == DT_CONF_STRING) {
            if (*(char **)field(s, k) != NULL)
                mark_given(s, k);
        } else if (k->type == DT_CONF_BOOL) {
            int *b = (int *)field(s, k);
            if (*b != -1)
                mark_given(s, k);
            if (strcmp(k->name, "causal") == 0)
                s->causal_set = *b != -1;
            if (*b == -1)
                *b = 1;
        } else {
            int64_t *x = (int64_t *)field(s, k);
            if (*x != UNGIVEN)
                mark_given(s, k);
            else
                *x = 0;
        }
    }
}

static int in_set(const char *v, const char *const *set)
{
    for (; *set != NULL; set++)
        if (strcmp(v, *set) == 0)
            return 1;
    return 0;
}

/*-- text: UTF-8 without control characters ------------------------------------*/

/* The code point of the UTF-8 sequence at p (at most n bytes) and its
 * length in *len; -1 for an invalid sequence (bad lead or continuation
 * byte, overlong form, surrogate, beyond U+10FFFF, cut short). */
static int32_t utf8_at(const unsigned char *p, size_t n, size_t *len)
{
    int32_t cp;
    size_t k;

    if (p[0] < 0x80) {
        *len = 1;
        return p[0];
    }
    if (p[0] >= 0xc2 && p[0] <= 0xdf)
        k = 2, cp = p[0] & 0x1f;
    else if (p[0] >= 0xe0 && p[0] <= 0xef)
        k = 3, cp = p[0] & 0x0f;
    else if (p[0] >= 0xf0 && p[0] <= 0xf4)
        k = 4, cp = p[0] & 0x07;
    else
        return -1;
    if (n < k)
        return -1;
    for (size_t i = 1; i < k; i++) {
        if ((p[i] & 0xc0) != 0x80)
            return -1;
        cp = cp << 6 | (p[i] & 0x3f);
    }
    if ((k == 3 && cp < 0x800) || (k == 4 && cp < 0x10000) || cp > 0x10ffff ||
        (cp >= 0xd800 && cp <= 0xdfff))
        return -1;
    *len = k;
    return cp;
}

/* C0 (tab aside), DEL and C1: what a terminal may act on. */
static int is_control(int32_t cp)
{
    return (cp < 0x20 && cp != '\t') || cp == 0x7f || (cp >= 0x80 && cp <= 0x9f);
}

/* The first fault of n bytes at s: 0 for none; otherwise 1 (a control
 * character *cp) or 2 (invalid UTF-8, first bad byte *cp), at byte *at. */
static int text_fault(const char *s, size_t n, size_t *at, int32_t *cp)
{
    const unsigned char *p = (const unsigned char *)s;
    size_t i = 0, len;

    while (i < n) {
        int32_t c = utf8_at(p + i, n - i, &len);

        *at = i;
        if (c < 0) {
            *cp = p[i];
            return 2;
        }
        if (is_control(c)) {
            *cp = c;
            return 1;
        }
        i += len;
    }
    return 0;
}

/* "control character U+001B" or "invalid UTF-8 (byte 0xff)". */
static const char *fault_str(char buf[48], int fault, int32_t cp)
{
    if (fault == 1)
        snprintf(buf, 48, "control character U+%04X", (unsigned)cp);
    else
        snprintf(buf, 48, "invalid UTF-8 (byte 0x%02x)", (unsigned)cp);
    return buf;
}

/* A value as it may appear in a message: short; control characters and
 * bytes that are not UTF-8 shown as '?'. */
static const char *shown(char buf[64], const char *v)
{
    const unsigned char *p = (const unsigned char *)v;
    size_t i = 0, o = 0, n = strlen(v), len;

    while (i < n && o < 48) {
        int32_t c = utf8_at(p + i, n - i, &len);

        if (c < 0 || is_control(c)) {
            buf[o++] = '?';
            i += c < 0 ? 1 : len;
            continue;
        }
        if (o + len > 48)
            break;
        memcpy(buf + o, p + i, len);
        o += len;
        i += len;
    }
    if (i < n) {
        memcpy(buf + o, "...", 3);
        o += 3;
    }
    buf[o] = '\0';
    return buf;
}

/* Every line of a spec's text is UTF-8 without control characters (a tab
 * is allowed, and a carriage return ending the line): anything else is
 * refused naming the file, the line, the key set on it and the column. A
 * comment is no exception: whoever prints the file prints it too. */
static int check_text(const char *name, const char *text, size_t len, dt_emsg_t *em)
{
    size_t pos = 0;
    unsigned line = 0;

    if (len >= 3 && memcmp(text, "\xef\xbb\xbf", 3) == 0) /* a byte order mark, as conf.c */
        pos = 3;
    while (pos < len) {
        const char *l = text + pos, *nl = memchr(l, '\n', len - pos);
        size_t n = nl ? (size_t)(nl - l) : len - pos, at, k = 0;
        int32_t cp;
        int fault;
        char what[48], key[40];

        pos += n + (nl != NULL);
        line++;
        if (n > 0 && l[n - 1] == '\r')
            n--;
        if ((fault = text_fault(l, n, &at, &cp)) == 0)
            continue;
        /* the key of a `key = value` line, when it is one */
        while (k < n && (l[k] == ' ' || l[k] == '\t'))
            k++;
        size_t k0 = k;
        while (k < n && k - k0 < sizeof(key) - 1 &&
               ((l[k] >= 'a' && l[k] <= 'z') || (l[k] >= '0' && l[k] <= '9') || l[k] == '_'))
            k++;
        snprintf(key, sizeof(key), "%.*s", (int)(k - k0), l + k0);
        while (k < n && (l[k] == ' ' || l[k] == '\t'))
            k++;
        fault_str(what, fault, cp);
        if (k > k0 && k < n && l[k] == '=' && at > k)
            return dt_emsg_set(em, DT_ECONF, "%s:%u: key '%s': %s at column %zu (a spec value "
                               "is UTF-8 text without control characters)", name, line, key,
                               what, at + 1);
        return dt_emsg_set(em, DT_ECONF, "%s:%u: %s at column %zu (a spec is UTF-8 text "
                           "without control characters)", name, line, what, at + 1);
    }
    return 0;
}

/*-- checks --------------------------------------------------------------------*/

/* dt_attn_parse_branches names the flags ("--segments: empty list"); a spec
 * names its keys ("key 'segments': empty list"). */
static int branch_error(int rc, const dt_emsg_t *sub, dt_emsg_t *em)
{
    static const char *const flags[] = { "segments", "dilations" };
    char msg[sizeof(sub->s)];
    size_t n = 0;

    for (int i = 0; i < 2; i++) {
        size_t len = strlen(flags[i]);
        if (strncmp(sub->s, "--", 2) == 0 && strncmp(sub->s + 2, flags[i], len) == 0 &&
            sub->s[2 + len] == ':')
            return dt_emsg_set(em, rc, "key '%s':%s", flags[i], sub->s + 3 + len);
    }
    for (const char *p = sub->s; *p != '\0' && n < sizeof(msg) - 1; p++) {
        if (p[0] == '-' && p[1] == '-') {
            p++;
            continue;
        }
        msg[n++] = *p;
    }
    msg[n] = '\0';
    return dt_emsg_set(em, rc, "keys 'segments' and 'dilations': %s", msg);
}

/* The checks of one key on its own: sets, bounds, text. */
static int check_key(const dt_spec_t *s, const dt_conf_key_t *k, dt_emsg_t *em)
{
    char list[128], sh[64];

    if (k->type == DT_CONF_STRING) {
        const char *v = *(char **)field(s, k);

        if (v == NULL)
            return 0;
        size_t at;
        int32_t cp;
        int fault = text_fault(v, strlen(v), &at, &cp);
        char what[48];

        if (fault)
            return dt_emsg_set(em, DT_EINVAL, "key '%s': %s at byte %zu of '%s'", k->name,
                               fault_str(what, fault, cp), at + 1, shown(sh, v));
        for (size_t i = 0; i < sizeof(sets) / sizeof(sets[0]); i++) {
            if (strcmp(sets[i].key, k->name) != 0)
                continue;
            if (sets[i].list) {
                char key[48];
                unsigned set;
                snprintf(key, sizeof(key), "key '%s'", k->name);
                return dt_vocab_parse_set(key, v, sets[i].set, &set, em);
            }
            if (in_set(v, sets[i].set))
                continue;
            dt_vocab_list(list, sizeof(list), sets[i].set);
            return dt_emsg_set(em, DT_EINVAL, "key '%s': unknown value '%s' (expected %s)", k->name,
                               shown(sh, v), list);
        }
        if (v[0] == '\0')
            return dt_emsg_set(em, DT_EINVAL, "key '%s': empty value (%s)", k->name, k->help);
        return 0;
    }
    if (k->type == DT_CONF_BOOL)
        return 0;
    int64_t x = *(int64_t *)field(s, k);
    /* a key given is in its bounds, 0 included (steps = 0 is out of
     * range where 0 steps are not, seed = 0 within them) */
    if ((x != 0 || key_given(s, k)) && (x < k->min || x > k->max))
        return dt_emsg_set(em, DT_ERANGE,
                           "key '%s': value %" PRId64 " out of range (%" PRId64 "..%" PRId64 ")",
                           k->name, x, k->min, k->max);
    if (x < 0)
        return dt_emsg_set(em, DT_ERANGE, "key '%s': negative value %" PRId64, k->name, x);
    return 0;
}

/*-- resolved settings: a key's value, else its default -------------------------*/

enum dt_device dt_spec_device_id(const dt_spec_t *s)
{
    enum dt_device d = DT_DEVICE_CPU;
    if (s->device != NULL)
        dt_device_parse("device", s->device, &d, NULL); /* checked by dt_spec_check */
    else if (s->gpu != NULL && strcmp(s->gpu, dt_gpu_name(DT_GPU_CPU)) != 0)
        d = DT_DEVICE_CUDA;
    return d;
}

enum dt_gpu_preset dt_spec_gpu_id(const dt_spec_t *s)
{
    enum dt_gpu_preset g = DT_GPU_CPU;
    if (s->gpu != NULL)
        dt_gpu_parse("gpu", s->gpu, &g, NULL);
    else if (dt_spec_device_id(s) == DT_DEVICE_CUDA)
        g = DT_GPU_H100_SXM;
    return g;
}

dt_dtype_t dt_spec_dtype_id(const dt_spec_t *s)
{
    const char *d = s->dtype ? s->dtype : s->precision;
    dt_dtype_t t = dt_spec_device_id(s) == DT_DEVICE_CUDA ? DT_BF16 : DT_F32;
    if (d != NULL)
        dt_compute_dtype_parse("dtype", d, &t, NULL);
    return t;
}

const char *dt_spec_device(const dt_spec_t *s)
{
    return dt_device_name(dt_spec_device_id(s));
}

const char *dt_spec_gpu(const dt_spec_t *s)
{
    return dt_gpu_name(dt_spec_gpu_id(s));
}

const char *dt_spec_dtype(const dt_spec_t *s)
{
    return dt_dtype_name(dt_spec_dtype_id(s));
}

enum dt_job_kind dt_spec_kind(const dt_spec_t *s)
{
    enum dt_job_kind k = DT_KIND_TRAIN;
    if (s->kind != NULL)
        dt_kind_parse("kind", s->kind, &k, NULL);
    return k;
}

bool dt_spec_causal(const dt_spec_t *s)
{
    return s->causal_set ? s->causal != 0 : true;
}

bool dt_spec_deterministic(const dt_spec_t *s)
{
    return !dt_spec_given(s, "deterministic") || s->deterministic != 0;
}

enum dt_layout dt_spec_layout(const dt_spec_t *s)
{
    enum dt_layout l = dt_spec_causal(s) ? DT_LAYOUT_ZIGZAG : DT_LAYOUT_CONTIGUOUS;
    if (s->layout != NULL)
        dt_layout_parse(s->layout, &l);
    return l;
}

const dt_conf_key_t *dt_spec_key(const char *name)
{
    return find_key(name);
}

/* The key `name` of the table, which must exist (a programmer's error
 * otherwise). */
static const dt_conf_key_t *must_key(const char *name)
{
    const dt_conf_key_t *k = find_key(name);
    if (k == NULL)
        abort();
    return k;
}

int64_t dt_spec_int(const dt_spec_t *s, const char *key)
{
    const dt_conf_key_t *k = must_key(key);
    int64_t v = *(int64_t *)field(s, k);
    if (v != 0 || key_given(s, k) || k->def == NULL)
        return v;
    return strtoll(k->def, NULL, 10); /* a word default ("auto") reads as 0 */
}

double dt_spec_real(const dt_spec_t *s, const char *key)
{
    const dt_conf_key_t *k = must_key(key);
    const char *v = *(char **)field(s, k);
    if (v == NULL)
        v = k->def;
    return v != NULL ? strtod(v, NULL) : 0.0; /* checked by dt_spec_check */
}

unsigned dt_spec_offload(const dt_spec_t *s)
{
    unsigned set = 0;
    if (s->offload != NULL)
        dt_offload_parse("offload", s->offload, &set, NULL); /* checked by dt_spec_check */
    return set;
}

enum dt_ckpt_dtype dt_spec_ckpt_dtype(const dt_spec_t *s)
{
    enum dt_ckpt_dtype d = DT_CKPT_FP32;
    if (s->ckpt_dtype != NULL)
        dt_ckpt_dtype_parse("ckpt_dtype", s->ckpt_dtype, &d, NULL); /* checked by dt_spec_check */
    return d;
}

const char *dt_spec_word(const dt_spec_t *s, const char *key)
{
    const dt_conf_key_t *k = must_key(key);
    const char *v = *(char **)field(s, k);
    return v != NULL ? v : k->def;
}

int64_t dt_spec_warmup(const dt_spec_t *s)
{
    if (s->warmup != NULL)
        return strtoll(s->warmup, NULL, 10);
    return dt_spec_int(s, "steps") / 10;
}

int64_t dt_spec_ckpt_every(const dt_spec_t *s)
{
    if (s->ckpt_every > 0)
        return s->ckpt_every;
    int64_t steps = dt_spec_int(s, "steps");
    return dt_spec_kind(s) == DT_KIND_PREFILL || steps < 1 ? 1 : steps;
}

/* device, gpu and dtype agree: a cpu job on the cpu preset computing in
 * fp32, a cuda job on a GPU preset. */
static int check_device(const dt_spec_t *s, dt_emsg_t *em)
{
    const char *gpu = dt_spec_gpu(s);
    const char *dt = s->dtype ? s->dtype : s->precision;
    bool cuda = dt_spec_device_id(s) == DT_DEVICE_CUDA;

    if (s->dtype != NULL && s->precision != NULL && strcmp(s->dtype, s->precision) != 0)
        return dt_emsg_set(em, DT_EINVAL, "keys 'dtype' = %s and 'precision' = %s differ: they "
                           "are one setting (precision is the old name)", s->dtype,
                           s->precision);
    if (cuda && strcmp(gpu, "cpu") == 0)
        return dt_emsg_set(em, DT_EINVAL, "device = cuda with gpu = cpu: name the GPUs' "
                           "preset (gpu = h100-sxm or h200), or leave gpu out for h100-sxm");
    if (!cuda && strcmp(gpu, "cpu") != 0)
        return dt_emsg_set(em, DT_EINVAL, "device = cpu with gpu = %s: a cpu job plans and "
                           "runs on the cpu preset (leave gpu out), or set device = cuda", gpu);
    if (!cuda && dt != NULL && strcmp(dt, "fp32") != 0)
        return dt_emsg_set(em, DT_EINVAL, "key '%s' = %s: device = cpu computes in fp32 only "
                           "(bf16 and fp16 are for device = cuda)",
                           s->dtype ? "dtype" : "precision", dt);
    if (!cuda && s->cpus_per_gpu != 0)
        return dt_emsg_set(em, DT_EINVAL, "key 'cpus_per_gpu' is for device = cuda (a cpu "
                           "job's node gets one CPU per rank)");
    if (!cuda && (s->host_memory != 0 || s->pcie_gbps != 0))
        return dt_emsg_set(em, DT_EINVAL, "key '%s' is for device = cuda (a cpu job's memory "
                           "is host memory)", s->host_memory != 0 ? "host_memory" : "pcie_gbps");
    return 0;
}

/* A number key given as text (NULL is "not given"): in (lo, hi], or
 * [lo, hi] when closed; (lo, 1) for hi = 1 when not closed (norm_eps). */
static int check_real(const char *key, const char *text, double lo, double hi, bool closed,
                      const char *range, dt_emsg_t *em)
{
    char *end;
    double v;

    if (text == NULL)
        return 0;
    v = strtod(text, &end);
    bool in = closed ? v >= lo && v <= hi : v > lo && v <= hi && !(hi == 1 && v == 1);
    if (end == text || *end != '\0' || !in)
        return dt_emsg_set(em, DT_EINVAL, "key '%s' = '%s': a number in %s", key, text, range);
    return 0;
}

static int check_number(const char *key, const char *text, double lo, double hi,
                        const char *range, dt_emsg_t *em)
{
    return check_real(key, text, lo, hi, false, range, em);
}

/* rope_scaling = llama3 needs its four numbers, which mean nothing
 * without it; the numbers agree with each other. */
static int check_rope(const dt_spec_t *s, dt_emsg_t *em)
{
    static const char *const names[] = { "rope_factor", "rope_low_freq_factor",
                                         "rope_high_freq_factor" };
    const char *vals[] = { s->rope_factor, s->rope_low_freq_factor, s->rope_high_freq_factor };
    bool llama3 = s->rope_scaling != NULL && strcmp(s->rope_scaling, "llama3") == 0;
    int rc;

    for (int i = 0; i < 3; i++) {
        if ((rc = check_number(names[i], vals[i], 0, 1e6, "(0, 1e6]", em)) < 0)
            return rc;
        if (llama3 && vals[i] == NULL)
            return dt_emsg_set(em, DT_EINVAL, "rope_scaling = llama3 needs key '%s' (and "
                               "rope_factor, rope_low_freq_factor, rope_high_freq_factor, "
                               "rope_original_max_pos)", names[i]);
        if (!llama3 && vals[i] != NULL)
            return dt_emsg_set(em, DT_EINVAL, "key '%s' is for rope_scaling = llama3", names[i]);
    }
    if (llama3 && s->rope_original_max_pos == 0)
        return dt_emsg_set(em, DT_EINVAL, "rope_scaling = llama3 needs key "
                           "'rope_original_max_pos'");
    if (!llama3 && s->rope_original_max_pos != 0)
        return dt_emsg_set(em, DT_EINVAL, "key 'rope_original_max_pos' is for rope_scaling = "
                           "llama3");
    if (llama3 && strtod(s->rope_factor, NULL) < 1)
        return dt_emsg_set(em, DT_EINVAL, "key 'rope_factor' = '%s': at least 1",
                           s->rope_factor);
    if (llama3 && !(strtod(s->rope_low_freq_factor, NULL) < strtod(s->rope_high_freq_factor,
                                                                    NULL)))
        return dt_emsg_set(em, DT_EINVAL, "rope_low_freq_factor %s must be below "
                           "rope_high_freq_factor %s", s->rope_low_freq_factor,
                           s->rope_high_freq_factor);
    return 0;
}

static int check_closed(const char *key, const char *text, double lo, double hi,
                        const char *range, dt_emsg_t *em)
{
    return check_real(key, text, lo, hi, true, range, em);
}

/* The optimizer's keys beside lr: min_lr and weight_decay in [0, 10], clip
 * >= 0, adam_eps in (0, 1], warmup a whole number of steps. */
static int check_optimizer(const dt_spec_t *s, dt_emsg_t *em)
{
    int rc;

    if ((rc = check_closed("min_lr", s->min_lr, 0, 10, "[0, 10], such as 3e-4", em)) < 0 ||
        (rc = check_closed("weight_decay", s->weight_decay, 0, 10, "[0, 10], such as 0.1",
                           em)) < 0 ||
        (rc = check_closed("clip", s->clip, 0, 1e9, "[0, 1e9] (0: no clipping)", em)) < 0 ||
        (rc = check_closed("adam_eps", s->adam_eps, 1e-30, 1, "[1e-30, 1], such as 1e-5",
                           em)) < 0)
        return rc;
    if (s->warmup != NULL) {
        char *end;
        long long w = strtoll(s->warmup, &end, 10);
        if (end == s->warmup || *end != '\0' || w < 0 || w > (1LL << 40))
            return dt_emsg_set(em, DT_EINVAL, "key 'warmup' = '%s': a whole number of steps, "
                               "0 or more", s->warmup);
    }
    return 0;
}

int dt_spec_check_model(const dt_spec_t *s, dt_emsg_t *em)
{
    int rc;

    if ((rc = check_number("norm_eps", s->norm_eps, 0, 1, "(0, 1), such as 1e-5", em)) < 0 ||
        (rc = check_rope(s, em)) < 0)
        return rc;
    if (s->init_from != NULL && s->model != NULL && strcmp(s->model, "custom") != 0)
        return dt_emsg_set(em, DT_EINVAL, "keys 'init_from' and 'model' = %s: the model is "
                           "the one in %s (leave model out)", s->model, s->init_from);
    if (s->init_from != NULL && s->init_from[0] == '\0')
        return dt_emsg_set(em, DT_EINVAL, "key 'init_from' is empty: a Hugging Face model "
                           "directory");
    return 0;
}

void dt_spec_mask_rules(const dt_spec_t *s, dt_mask_rules_t *r)
{
    memset(r, 0, sizeof(*r));
    r->docs = s->doc_mask != NULL && strcmp(s->doc_mask, "eot") == 0;
    r->eot = dt_spec_given(s, "eot_token") ? s->eot_token : DT_EOT_DEFAULT;
    r->reset = s->doc_positions != NULL && strcmp(s->doc_positions, "reset") == 0;
    r->window = s->sliding_window;
    r->window_every = 1;
    if (s->sliding_window_layers != NULL) /* checked by dt_spec_check */
        dt_mask_parse_layers("sliding_window_layers", s->sliding_window_layers,
                             &r->window_every, NULL);
    if (s->block_pattern != NULL)
        dt_mask_parse_pattern("block_pattern", s->block_pattern, r, NULL);
    r->block = dt_spec_int(s, "block_size");
}

int dt_spec_check_masks(const dt_spec_t *s, dt_emsg_t *em)
{
    dt_mask_rules_t r = { 0 };
    int rc;
    bool docs = s->doc_mask != NULL && strcmp(s->doc_mask, "eot") == 0;

    if (s->sliding_window_layers != NULL &&
        (rc = dt_mask_parse_layers("key 'sliding_window_layers'", s->sliding_window_layers,
                                   &r.window_every, em)) < 0)
        return rc;
    if (s->sliding_window_layers != NULL && s->sliding_window == 0)
        return dt_emsg_set(em, DT_EINVAL, "key 'sliding_window_layers' needs key "
                           "'sliding_window' (the window those layers have)");
    if (s->block_pattern != NULL &&
        (rc = dt_mask_parse_pattern("key 'block_pattern'", s->block_pattern, &r, em)) < 0)
        return rc;
    if (s->block_pattern == NULL && dt_spec_given(s, "block_size"))
        return dt_emsg_set(em, DT_EINVAL, "key 'block_size' needs key 'block_pattern' (the "
                           "pattern over those blocks)");
    int64_t B = dt_spec_int(s, "block_size");
    if (s->block_pattern != NULL && s->tokens % B != 0)
        return dt_emsg_set(em, DT_EINVAL, "key 'block_size' = %lld does not divide tokens = "
                           "%lld", (long long)B, (long long)s->tokens);
    if (!docs && dt_spec_given(s, "eot_token"))
        return dt_emsg_set(em, DT_EINVAL, "key 'eot_token' needs doc_mask = eot (the token "
                           "starts documents only then)");
    if (s->doc_positions != NULL && strcmp(s->doc_positions, "reset") == 0) {
        if (!docs)
            return dt_emsg_set(em, DT_EINVAL, "doc_positions = reset needs doc_mask = eot "
                               "(positions restart in each document)");
        if (s->pos_offset != 0)
            return dt_emsg_set(em, DT_EINVAL, "key 'pos_offset' = %lld with doc_positions = "
                               "reset: positions restart at 0 in each document, so the window "
                               "has no offset (leave pos_offset out)",
                               (long long)s->pos_offset);
    }
    if (docs && strcmp(dt_spec_word(s, "data"), "recall") == 0)
        return dt_emsg_set(em, DT_EINVAL, "doc_mask = eot needs token data (the recall task "
                           "has no documents: set data to token files)");
    return 0;
}

int dt_spec_check(const dt_spec_t *s, dt_emsg_t *em)
{
    static const char *const shape[] = { "dim", "layers", "heads", "kv_heads", "ffn", "vocab" };
    int rc;

    if (s->kind == NULL)
        return dt_emsg_set(em, DT_EINVAL, "key 'kind' is required (attn, prefill or train)");
    if (s->tokens <= 0)
        return dt_emsg_set(em, DT_EINVAL,
                           "key 'tokens' is required (the sequence length T; "
                           "K, M, G, T suffixes are powers of 1024: 1M = 1048576)");
    for (const dt_conf_key_t *k = keys; k->name != NULL; k++)
        if ((rc = check_key(s, k, em)) < 0)
            return rc;
    if ((rc = check_device(s, em)) < 0)
        return rc;
    if (s->model != NULL && strcmp(s->model, "custom") == 0 && s->init_from == NULL) {
        for (size_t i = 0; i < sizeof(shape) / sizeof(shape[0]); i++)
            if (*(int64_t *)field(s, find_key(shape[i])) == 0)
                return dt_emsg_set(em, DT_EINVAL,
                                   "model = custom needs key '%s' (custom "
                                   "needs dim, layers, heads, kv_heads, ffn and vocab)",
                                   shape[i]);
    }
    if (s->dp > 1 && strcmp(s->kind, "train") != 0)
        return dt_emsg_set(em, DT_EINVAL, "key 'dp' = %lld: data parallel is for kind train "
                           "(kind %s has no gradient to reduce)", (long long)s->dp, s->kind);
    if (s->output_dir != NULL && s->output_dir[0] != '/')
        return dt_emsg_set(em, DT_EINVAL, "key 'output_dir' = '%s': an absolute path is needed "
                           "(the workers run in another directory)", s->output_dir);
    if ((rc = check_number("lr", s->lr, 0, 10, "(0, 10], such as 3e-3", em)) < 0 ||
        (rc = check_optimizer(s, em)) < 0 || (rc = dt_spec_check_model(s, em)) < 0 ||
        (rc = dt_spec_check_masks(s, em)) < 0)
        return rc;
    if (s->segments != NULL || s->dilations != NULL) {
        dt_attn_spec_t a = { 0 };
        dt_emsg_t sub = { "" };

        if (s->segments == NULL || s->dilations == NULL)
            return dt_emsg_set(em, DT_EINVAL,
                               "key '%s' needs key '%s': segments and dilations "
                               "go together, one dilation per segment",
                               s->segments ? "segments" : "dilations",
                               s->segments ? "dilations" : "segments");
        if ((rc = dt_attn_parse_branches(&a, s->segments, s->dilations, &sub)) < 0)
            return branch_error(rc, &sub, em);
    }
    return 0;
}

/*-- parse, load, set ------------------------------------------------------------*/

int dt_spec_flag(int argc, char **argv, int i, char **key, const char **value, dt_emsg_t *em)
{
    const char *arg = argv[i] + 2, *eq = strchr(arg, '=');
    int neg = strncmp(arg, "no-", 3) == 0 && eq == NULL;

    *key = dt_xstrdup(neg ? arg + 3 : arg);
    if (eq)
        (*key)[eq - arg] = '\0';
    for (char *p = *key; *p; p++)
        if (*p == '-')
            *p = '_';
    const dt_conf_key_t *k = find_key(*key);
    int boolean = k != NULL && k->type == DT_CONF_BOOL;
    if (eq) {
        *value = eq + 1;
        return 1;
    }
    int next_bool; /* the next argument is a boolean word (--causal no), not a file */
    if (boolean && !neg && i + 1 < argc)
        next_bool = dt_conf_parse_bool(argv[i + 1], &(int){ 0 }) == 0;
    else
        next_bool = 0;
    if (boolean && !next_bool) {
        *value = neg ? "no" : "yes";
        return 1;
    }
    if (neg) { /* --no-x for a key that is not boolean: let the spec say so */
        free(*key);
        *key = dt_xstrdup(arg);
        for (char *p = *key; *p; p++)
            if (*p == '-')
                *p = '_';
    }
    if (i + 1 >= argc) {
        free(*key);
        *key = NULL;
        return dt_emsg_set(em, DT_EUSAGE, "%s needs a value", argv[i]);
    }
    *value = argv[i + 1];
    return 2;
}

/* A parsed spec: the keys given collected (mark_unwritten before the parse), then checked. */
static int finish(dt_spec_t *tmp, dt_spec_t *out, dt_emsg_t *em)
{
    int rc;

    collect_given(tmp);
    if ((rc = dt_spec_check(tmp, em)) < 0) {
        dt_spec_free(tmp);
        return rc;
    }
    *out = *tmp;
    return 0;
}

int dt_spec_parse(const char *name, const char *text, dt_spec_t *out, dt_emsg_t *em)
{
    dt_spec_t tmp = { 0 };
    int rc;

    memset(out, 0, sizeof(*out));
    if (name == NULL)
        name = "(string)";
    mark_unwritten(&tmp);
    if ((rc = check_text(name, text, strlen(text), em)) < 0 ||
        (rc = dt_conf_parse(name, text, keys, &tmp, em)) < 0) {
        collect_given(&tmp);
        dt_spec_free(&tmp);
        return rc;
    }
    return finish(&tmp, out, em);
}

/* PATH's text, from a regular file only (a FIFO would block the reader, a
 * device never end), checked as text: no NUL, UTF-8, no control
 * characters. */
static int read_spec(const char *path, char **text, dt_emsg_t *em)
{
    size_t len;
    int rc;

    if ((rc = dt_read_regular(path, 0, SPEC_FILE_MAX, text, &len, em)) < 0)
        return rc == DT_ERANGE ? dt_emsg_set(em, DT_ECONF, "%s: larger than the limit of %d "
                                             "bytes (1 MiB)", path, SPEC_FILE_MAX) : rc;
    if ((rc = check_text(path, *text, len, em)) < 0) {
        free(*text);
        *text = NULL;
    }
    return rc;
}

int dt_spec_load(const char *path, dt_spec_t *out, dt_emsg_t *em)
{
    dt_spec_t tmp = { 0 };
    char *text = NULL;
    int rc;

    memset(out, 0, sizeof(*out));
    mark_unwritten(&tmp);
    if ((rc = read_spec(path, &text, em)) == 0)
        rc = dt_conf_parse(path, text, keys, &tmp, em);
    free(text);
    if (rc < 0) {
        collect_given(&tmp);
        dt_spec_free(&tmp);
        return rc;
    }
    return finish(&tmp, out, em);
}

int dt_spec_load_partial(const char *path, dt_spec_t *s, dt_emsg_t *em)
{
    size_t n = 0;
    dt_conf_key_t *opt;
    char *text = NULL;
    int rc;

    while (keys[n].name != NULL)
        n++;
    opt = dt_xcalloc(n + 1, sizeof(*opt));
    memcpy(opt, keys, (n + 1) * sizeof(*opt));
    for (size_t i = 0; i < n; i++)
        opt[i].required = 0;
    mark_unwritten(s); /* untouched unless the file sets them */
    if ((rc = read_spec(path, &text, em)) == 0)
        rc = dt_conf_parse(path, text, opt, s, em);
    collect_given(s);
    free(text);
    free(opt);
    return rc;
}

static const char *expected(enum dt_conf_type t)
{
    switch (t) {
    case DT_CONF_STRING:
        return "a string";
    case DT_CONF_INT:
        return "an integer";
    case DT_CONF_BOOL:
        return "yes or no";
    case DT_CONF_DURATION:
        return "a duration such as 90s, 30m or 2h";
    case DT_CONF_SIZE:
        return "a count such as 4096, 64K or 1M (powers of 1024)";
    }
    return "?";
}

int dt_spec_set(dt_spec_t *s, const char *key, const char *value, dt_emsg_t *em)
{
    char name[32], sh[64];
    const dt_conf_key_t *k;
    int64_t num = 0;
    int b = 0, rc = 0;
    size_t i;

    /* flags spell keys with '-' (--kv-heads) */
    for (i = 0; key[i] != '\0' && i < sizeof(name) - 1; i++)
        name[i] = key[i] == '-' ? '_' : key[i];
    name[i] = '\0';
    if (key[i] != '\0' || (k = find_key(name)) == NULL)
        return dt_emsg_set(em, DT_EINVAL, "unknown spec key '%s'", shown(sh, key));
    if (value == NULL)
        return dt_emsg_set(em, DT_EINVAL, "key '%s': no value", k->name);

    switch (k->type) {
    case DT_CONF_STRING: {
        dt_spec_t probe = { 0 };
        char **f = field(s, k);

        *(char **)field(&probe, k) = (char *)value;
        if ((rc = check_key(&probe, k, em)) < 0)
            return rc;
        if (strcmp(k->name, "segments") == 0 || strcmp(k->name, "dilations") == 0) {
            /* the list on its own; that they pair up is dt_spec_check's */
            dt_attn_spec_t a = { 0 };
            dt_emsg_t sub = { "" };

            if ((rc = dt_attn_parse_branches(&a, value, value, &sub)) < 0) {
                dt_emsg_t named = sub;

                if (strncmp(sub.s, "--segments", 10) == 0 && k->name[0] == 'd')
                    dt_emsg_set(&named, rc, "--dilations%s", sub.s + 10);
                return branch_error(rc, &named, em);
            }
        }
        free(*f);
        *f = dt_xstrdup(value);
        return 0;
    }
    case DT_CONF_BOOL:
        rc = dt_conf_parse_bool(value, &b);
        num = b;
        break;
    case DT_CONF_INT:
        rc = dt_conf_parse_int(value, k->min, k->max, &num);
        break;
    case DT_CONF_DURATION:
        rc = dt_conf_parse_duration(value, &num);
        break;
    case DT_CONF_SIZE:
        rc = dt_conf_parse_size(value, &num);
        break;
    }
    if (rc == 0 && k->type != DT_CONF_BOOL && (num < k->min || num > k->max))
        rc = DT_ERANGE;
    if (rc == DT_ERANGE)
        return dt_emsg_set(em, rc, "key '%s': value '%s' out of range (%" PRId64 "..%" PRId64 ")",
                           k->name, shown(sh, value), k->min, k->max);
    if (rc < 0)
        return dt_emsg_set(em, DT_EINVAL, "key '%s': bad value '%s' (expected %s)", k->name,
                           shown(sh, value), expected(k->type));
    if (k->type == DT_CONF_BOOL) {
        *(int *)field(s, k) = b;
        if (strcmp(k->name, "causal") == 0)
            s->causal_set = 1;
    } else {
        *(int64_t *)field(s, k) = num;
    }
    mark_given(s, k);
    return 0;
}

void dt_spec_free(dt_spec_t *s)
{
    if (s == NULL)
        return;
    dt_conf_free(keys, s);
    memset(s, 0, sizeof(*s));
}

/*-- format --------------------------------------------------------------------*/

typedef struct sbuf {
    char *p;
    size_t len, cap;
} sbuf_t;

static void put(sbuf_t *b, const char *s, size_t n)
{
    if (b->len + n + 1 > b->cap) {
        b->cap = (b->len + n + 1) * 2;
        b->p = dt_xrealloc(b->p, b->cap);
    }
    memcpy(b->p + b->len, s, n);
    b->len += n;
    b->p[b->len] = '\0';
}

static void puts_(sbuf_t *b, const char *s)
{
    put(b, s, strlen(s));
}

/* Bare when conf.c reads it back unchanged; quoted otherwise. */
static void put_string(sbuf_t *b, const char *v)
{
    size_t n = strlen(v);
    int quote = n == 0 || strpbrk(v, "#\"") != NULL || strchr(" \t\v\f\r", v[0]) != NULL ||
                strchr(" \t\v\f\r", v[n - 1]) != NULL;

    if (!quote) {
        put(b, v, n);
        return;
    }
    put(b, "\"", 1);
    for (; *v != '\0'; v++) {
        if (*v == '"' || *v == '\\')
            put(b, "\\", 1);
        put(b, v, 1);
    }
    put(b, "\"", 1);
}

/* Exact multiples of 1024^k keep their suffix: "1M" for 1048576. */
static void fmt_size(char *buf, size_t n, int64_t v)
{
    static const char suffix[] = "TGMK";

    for (int i = 0; i < 4; i++) {
        int64_t unit = INT64_C(1) << (40 - 10 * i);
        if (v % unit == 0) {
            snprintf(buf, n, "%" PRId64 "%c", v / unit, suffix[i]);
            return;
        }
    }
    snprintf(buf, n, "%" PRId64, v);
}

static void fmt_duration(char *buf, size_t n, int64_t ms)
{
    if (ms % (3600 * 1000) == 0)
        snprintf(buf, n, "%" PRId64 "h", ms / (3600 * 1000));
    else if (ms % (60 * 1000) == 0)
        snprintf(buf, n, "%" PRId64 "m", ms / (60 * 1000));
    else if (ms % 1000 == 0)
        snprintf(buf, n, "%" PRId64 "s", ms / 1000);
    else
        snprintf(buf, n, "%" PRId64 "ms", ms);
}

char *dt_spec_format(const dt_spec_t *s)
{
    sbuf_t b = { NULL, 0, 0 };
    char num[32];

    puts_(&b, "");
    for (const dt_conf_key_t *k = keys; k->name != NULL; k++) {
        const void *f = field(s, k);

        if (k->type == DT_CONF_STRING && *(char *const *)f == NULL)
            continue;
        if (k->type != DT_CONF_STRING && !key_given(s, k))
            continue;
        puts_(&b, k->name);
        puts_(&b, " = ");
        switch (k->type) {
        case DT_CONF_STRING:
            put_string(&b, *(char *const *)f);
            break;
        case DT_CONF_BOOL:
            puts_(&b, *(const int *)f ? "yes" : "no");
            break;
        case DT_CONF_INT:
            snprintf(num, sizeof(num), "%" PRId64, *(const int64_t *)f);
            puts_(&b, num);
            break;
        case DT_CONF_SIZE:
            fmt_size(num, sizeof(num), *(const int64_t *)f);
            puts_(&b, num);
            break;
        case DT_CONF_DURATION:
            fmt_duration(num, sizeof(num), *(const int64_t *)f);
            puts_(&b, num);
            break;
        }
        puts_(&b, "\n");
    }
    return b.p;
}
