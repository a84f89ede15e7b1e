/* SPDX-License-Identifier: MIT
 *
 * The job vocabulary's name tables and the engines' capabilities
 * (spec/vocab.h).
 */
#include "config.h"

#include <stdio.h>
#include <string.h>

#include "spec/vocab.h"

const char *const dt_kind_names[] = { "attn", "prefill", "train", NULL };
const char *const dt_device_names[] = { "cpu", "cuda", NULL };
const char *const dt_gpu_names[] = { "h100-sxm", "h200", "cpu", NULL };
const char *const dt_recompute_names[] = { "none", "layer", NULL };
const char *const dt_shard_names[] = { "none", "optimizer", "gradients", "parameters", NULL };
const char *const dt_layout_names[] = { "contiguous", "zigzag", "balanced", NULL };
const char *const dt_compute_dtype_names[] = { "fp32", "bf16", "fp16", NULL };
const char *const dt_offload_names[] = { "activations", "optimizer", NULL };
const char *const dt_ckpt_dtype_names[] = { "fp32", "bf16", NULL };
const char *const dt_doc_mask_names[] = { "none", "eot", NULL };
const char *const dt_doc_positions_names[] = { "continue", "reset", NULL };
static const dt_dtype_t compute_dtypes[] = { DT_F32, DT_BF16, DT_F16 };

static size_t count(const char *const *names)
{
    size_t n = 0;
    while (names[n] != NULL)
        n++;
    return n;
}

/* names[i - base] for i in range, else "?" */
static const char *name_at(const char *const *names, int i, int base)
{
    return i >= base && (size_t)(i - base) < count(names) ? names[i - base] : "?";
}

const char *dt_kind_name(enum dt_job_kind k)
{
    return name_at(dt_kind_names, (int)k, 0);
}

const char *dt_device_name(enum dt_device d)
{
    return name_at(dt_device_names, (int)d, 0);
}

const char *dt_gpu_name(enum dt_gpu_preset g)
{
    return name_at(dt_gpu_names, (int)g, 0);
}

const char *dt_recompute_name(enum dt_recompute r)
{
    return r == DT_RECOMPUTE_AUTO ? "auto" : name_at(dt_recompute_names, (int)r, 1);
}

const char *dt_shard_name(enum dt_shard_level s)
{
    return s == DT_SHARD_AUTO ? "auto" : name_at(dt_shard_names, (int)s, 1);
}

int dt_vocab_find(const char *const *names, const char *s)
{
    for (int i = 0; s != NULL && names[i] != NULL; i++)
        if (strcmp(s, names[i]) == 0)
            return i;
    return -1;
}

void dt_vocab_list(char *buf, size_t n, const char *const *names)
{
    size_t len = 0;

    if (n == 0)
        return;
    buf[0] = '\0';
    for (int i = 0; names[i] != NULL && len < n; i++) {
        const char *sep = i == 0 ? "" : names[i + 1] == NULL ? " or " : ", ";
        len += (size_t)snprintf(buf + len, n - len, "%s%s", sep, names[i]);
    }
}

int dt_vocab_parse_set(const char *what, const char *s, const char *const *names,
                       unsigned *out, dt_emsg_t *em)
{
    char list[160], word[64];
    unsigned set = 0;
    const char *p = s;

    dt_vocab_list(list, sizeof(list), names);
    if (strcmp(s, "none") == 0) {
        *out = 0;
        return 0;
    }
    for (;;) {
        size_t n = strcspn(p, ",");
        if (n == 0)
            return dt_emsg_set(em, DT_EINVAL, "%s: empty word in '%.100s' (a list of %s, or none)",
                               what, s, list);
        snprintf(word, sizeof(word), "%.*s", (int)(n < sizeof(word) ? n : sizeof(word) - 1), p);
        int i = n < sizeof(word) ? dt_vocab_find(names, word) : -1;
        if (i < 0 || i >= 32)
            return dt_emsg_set(em, DT_EINVAL,
                               "%s: unknown word '%.40s' in '%.100s' (words: %s, or none)", what,
                               word, s, list);
        if (set & (1u << i))
            return dt_emsg_set(em, DT_EINVAL, "%s: '%s' twice in '%.100s'", what, word, s);
        set |= 1u << i;
        if (p[n] == '\0')
            break;
        p += n + 1;
    }
    *out = set;
    return 0;
}

int dt_offload_parse(const char *what, const char *s, unsigned *out, dt_emsg_t *em)
{
    return dt_vocab_parse_set(what, s, dt_offload_names, out, em);
}

void dt_vocab_format_set(char *buf, size_t n, const char *const *names, unsigned set)
{
    size_t len = 0;

    if (n == 0)
        return;
    buf[0] = '\0';
    for (int i = 0; names[i] != NULL && i < 32 && len < n; i++)
        if (set & (1u << i))
            len += (size_t)snprintf(buf + len, n - len, "%s%s", len ? "," : "", names[i]);
    if (len == 0)
        snprintf(buf, n, "none");
}

/* The index of s in names, or DT_EINVAL naming what and the words. */
static int parse(const char *what, const char *s, const char *const *names, int *out,
                 dt_emsg_t *em)
{
    int i = dt_vocab_find(names, s);
    char list[160];

    if (i >= 0) {
        *out = i;
        return 0;
    }
    dt_vocab_list(list, sizeof(list), names);
    return dt_emsg_set(em, DT_EINVAL, "%s '%s': %s", what, s ? s : "", list);
}

int dt_kind_parse(const char *what, const char *s, enum dt_job_kind *out, dt_emsg_t *em)
{
    int i, rc = parse(what, s, dt_kind_names, &i, em);
    if (rc == 0)
        *out = (enum dt_job_kind)i;
    return rc;
}

int dt_device_parse(const char *what, const char *s, enum dt_device *out, dt_emsg_t *em)
{
    int i, rc = parse(what, s, dt_device_names, &i, em);
    if (rc == 0)
        *out = (enum dt_device)i;
    return rc;
}

int dt_gpu_parse(const char *what, const char *s, enum dt_gpu_preset *out, dt_emsg_t *em)
{
    int i, rc = parse(what, s, dt_gpu_names, &i, em);
    if (rc == 0)
        *out = (enum dt_gpu_preset)i;
    return rc;
}

int dt_recompute_parse(const char *what, const char *s, enum dt_recompute *out, dt_emsg_t *em)
{
    int i, rc = parse(what, s, dt_recompute_names, &i, em);
    if (rc == 0)
        *out = (enum dt_recompute)(i + 1);
    return rc;
}

int dt_shard_parse(const char *what, const char *s, enum dt_shard_level *out, dt_emsg_t *em)
{
    int i, rc = parse(what, s, dt_shard_names, &i, em);
    if (rc == 0)
        *out = (enum dt_shard_level)(i + 1);
    return rc;
}

int dt_ckpt_dtype_parse(const char *what, const char *s, enum dt_ckpt_dtype *out, dt_emsg_t *em)
{
    int i, rc = parse(what, s, dt_ckpt_dtype_names, &i, em);
    if (rc == 0)
        *out = (enum dt_ckpt_dtype)i;
    return rc;
}

int dt_compute_dtype_parse(const char *what, const char *s, dt_dtype_t *out, dt_emsg_t *em)
{
    int i, rc = parse(what, s, dt_compute_dtype_names, &i, em);
    if (rc == 0)
        *out = compute_dtypes[i];
    return rc;
}

bool dt_vocab_shard_runs(enum dt_device device, enum dt_shard_level shard)
{
    /* both engines run every level: the GPU's slices the gradient and
     * parameters unit by unit over NCCL (engine/model/train_cuda.c) */
    (void)device;
    (void)shard;
    return true;
}

int dt_vocab_runs(enum dt_device device, enum dt_job_kind kind, enum dt_shard_level shard,
                  int dp, dt_emsg_t *em)
{
    if (kind != DT_KIND_TRAIN && dp > 1)
        return dt_emsg_set(em, DT_ENOTSUP, "dp = %d: data parallel is for kind = train", dp);
    if (kind != DT_KIND_TRAIN)
        return 0;
    if (!dt_vocab_shard_runs(device, shard))
        return dt_emsg_set(em, DT_ENOTSUP,
                           "device %s does not run shard = %s",
                           dt_device_name(device), dt_shard_name(shard));
    return 0;
}

int dt_vocab_offload_runs(enum dt_device device, enum dt_job_kind kind, unsigned offload,
                          dt_emsg_t *em)
{
    char set[64];

    if (offload == 0)
        return 0;
    dt_vocab_format_set(set, sizeof(set), dt_offload_names, offload);
    if (kind != DT_KIND_TRAIN)
        return dt_emsg_set(em, DT_ENOTSUP, "offload = %s is for kind = train", set);
    if (device == DT_DEVICE_CPU)
        return 0;
    /* the GPU engine moves the AdamW state (optimizer,
     * engine/cmd/train_gpu.c) and the layer inputs recompute = layer keeps
     * (activations, engine/model/train_cuda.c) to the host */
    return 0;
}

int dt_vocab_masks_run(enum dt_device device, enum dt_job_kind kind, bool blocks, bool dilated,
                       dt_emsg_t *em)
{
    (void)kind; /* the same for every kind */
    (void)blocks; /* the GPU ring runs a pattern for every head (ring_cuda.c) */
    if (device == DT_DEVICE_CPU || !dilated)
        return 0;
    /* the GPU's dilated branches take no mask yet */
    return dt_emsg_set(em, DT_ENOTSUP, "masks on dilated attention run on device = cpu (the "
                       "GPU takes documents, windows and block patterns on dense attention)");
}

int dt_vocab_layout_runs(enum dt_device device, enum dt_layout layout, dt_emsg_t *em)
{
    if (device == DT_DEVICE_CUDA && layout == DT_LAYOUT_BALANCED)
        return dt_emsg_set(em, DT_ENOTSUP, "layout = balanced runs on device = cpu (the GPU "
                           "ring takes contiguous and zigzag)");
    return 0;
}
