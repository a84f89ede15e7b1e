/* SPDX-License-Identifier: MIT
 *
 * Job specifications: what a user submits (dtctl submit SPECFILE, or the
 * same keys as flags), what the coordinator stores and plans, what the
 * engine runs. The format is dt.conf's `key = value` (conf.h): unknown or
 * duplicate keys are errors naming the line. The keys are documented in
 * dt-spec(5); dt_spec_keys() is the table.
 *
 * Which keys were given is recorded (given, by the key's index in the
 * table): a key given as 0 is 0, whatever its default (seed = 0,
 * warmup = 0, steps = 0). A key not given reads as its default through
 * dt_spec_int and friends. Integer fields of keys not given are 0 and
 * strings NULL; a spec built field by field (not through dt_spec_set)
 * counts a nonzero integer as given.
 */
#ifndef DT_SPEC_H
#define DT_SPEC_H

#include <stdbool.h>
#include <stdint.h>

#include "common/conf.h"
#include "common/err.h"
#include "spec/dtype.h"
#include "spec/layout.h"
#include "spec/vocab.h"

typedef struct dt_spec {
    char *name;      /* free text, default "job" */
    char *kind;      /* attn | prefill | train (required) */
    /* model: a preset, with any explicit field overriding it */
    char *model;     /* tiny | llama3-8b | llama3-70b | custom (default tiny) */
    int64_t dim, layers, heads, kv_heads, ffn, vocab, rope_theta;
    int64_t head_dim; /* D (default dim / heads) */
    char *tied;      /* yes | no: tie the LM head to the embedding */
    char *norm_eps;  /* RMSNorm epsilon, a number in (0, 1) (default 1e-5) */
    char *rope_scaling; /* none | llama3 (default none) */
    /* llama3 scaling: factor >= 1, low < high frequency factors, the
     * context length the model was trained at; numbers as text */
    char *rope_factor, *rope_low_freq_factor, *rope_high_freq_factor;
    int64_t rope_original_max_pos;
    /* a Hugging Face model directory (config.json + safetensors): the
     * model's shape and settings (io/hf_config.h) and weights (io/hf.h) */
    char *init_from;
    int64_t pos_offset; /* the window's first position P (default 0) */
    /* sequence and attention */
    int64_t tokens;  /* sequence length T (required) */
    int causal;      /* default yes (1); 0 only when set to no: see causal_set */
    int causal_set;
    int deterministic; /* read it with dt_spec_deterministic (default yes) */
    char *segments;  /* "w1,w2,..." */
    char *dilations; /* "r1,r2,..." */
    char *layout;    /* contiguous | zigzag | balanced (default zigzag when causal) */
    /* masks (spec/mask_rules.h): documents at each eot_token, their RoPE
     * positions, a sliding window on all or every K-th layer, a block
     * pattern over blocks of block_size */
    char *doc_mask;      /* none | eot (default none) */
    int64_t eot_token;   /* given (0 a token): see given; else DT_EOT_DEFAULT */
    char *doc_positions; /* continue | reset (default continue) */
    int64_t sliding_window; /* W (0: none) */
    char *sliding_window_layers; /* all | every:K (default all) */
    char *block_pattern; /* local:W, strided:S, global:G joined by commas (NULL: none) */
    int64_t block_size;  /* B (0: 64) */
    /* compute dtype: fp32 | bf16 | fp16 (default bf16 on cuda, fp32 on cpu,
     * which computes in fp32 only); `precision` is its old name, kept */
    char *dtype, *precision;
    /* resources */
    char *device;    /* cpu | cuda (default: cuda when gpu is a GPU preset) */
    char *gpu;       /* cluster preset: h100-sxm | h200 | cpu (default: h100-sxm on
                      * cuda, else cpu) */
    int64_t ranks;   /* ranks per ring R (the job runs dp x ranks); 0: the planner chooses */
    int64_t nodes, gpus_per_node, cpus_per_gpu, spares;
    int64_t host_memory, pcie_gbps; /* per node; per GPU each way, GB/s (0: the preset's) */
    int64_t time_limit_ms;
    int64_t signal_lead_ms; /* checkpoint and requeue this long before the limit */
    char *signal;           /* Slurm's warning signal: USR1 | USR2 (NULL: dt.conf's) */
    char *partition, *account, *qos, *constraint, *exclude;
    /* training and data */
    int64_t steps, seed, batch;
    int64_t dp;      /* data parallel: dp rings of `ranks` ranks, each its own sequences
                      * (0: not given, 1) */
    char *recompute; /* none | layer: keep each layer's input only, recompute it in the
                      * backward (default none) */
    char *shard;     /* none | optimizer | gradients | parameters: the training state
                      * sharded over the ranks, each level adding to the one before
                      * (NULL: the planner picks) */
    char *offload;   /* a set of activations, optimizer (or none): what training keeps in
                      * host memory instead of the device's (default none) */
    char *ckpt_dtype; /* fp32 | bf16: the dtype of the layer inputs kept for
                       * recompute = layer (default fp32) */
    char *lr;        /* peak learning rate, a number in (0, 10] (default 3e-3) */
    /* the rest of the optimizer, numbers as text so that 0 is a value:
     * min_lr [0, 10], warmup a whole number of steps, weight_decay [0, 10],
     * clip >= 0 (0: none), adam_eps (0, 1] */
    char *min_lr, *warmup, *weight_decay, *clip, *adam_eps;
    char *data;      /* "recall" or a token shard path */
    int64_t recall_keys, recall_values, recall_pairs, recall_queries; /* 0: defaults */
    int64_t ckpt_every, ckpt_keep;
    int64_t mem_ckpt_every; /* 0 with the key given: off; not given: auto (the planner's) */
    char *ckpt_dir;
    char *output_dir; /* attn and prefill outputs (absolute; NULL: the job's output/) */
    int64_t max_restarts; /* recoveries before the job fails (0: the default, 5) */
    /* a failure seen this often (same rank, cause and step) is deterministic
     * and fails the job: mid-run, and before a generation's first step
     * (0: the defaults, 2 and 3; coordinator/recovery.h) */
    int64_t repeat_failures, repeat_startup_failures;
    /* the keys given (a bit per key, by its index in dt_spec_keys()),
     * 0 included; set by the parsers and dt_spec_set */
    uint64_t given[2];
} dt_spec_t;

/* Whether key `name` was given (a nonzero integer, a string or a
 * boolean set, or a value given as 0). */
bool dt_spec_given(const dt_spec_t *s, const char *name);
/* Integer key `name` back to "not given" (its default). */
void dt_spec_unset_int(dt_spec_t *s, const char *name);

/* Resolved settings (the spec must have passed dt_spec_check, or its keys
 * dt_spec_set one by one): each key's value, else its default, the one of
 * the key table (dt_conf_key_t.def), which dt-spec(5) gives. Every binary
 * asks these; none writes a default of its own.
 *   device: cuda when gpu is a GPU preset, else cpu; gpu: h100-sxm on
 *   cuda, else cpu; dtype: bf16 on cuda, fp32 on cpu; kind: train when a
 *   spec has none (dtengine's own specs); causal: yes; layout: zigzag
 *   when causal, else contiguous; warmup: steps / 10; ckpt_every: prefill
 *   1, train the last step. */
enum dt_device dt_spec_device_id(const dt_spec_t *s);
enum dt_gpu_preset dt_spec_gpu_id(const dt_spec_t *s);
dt_dtype_t dt_spec_dtype_id(const dt_spec_t *s);
enum dt_job_kind dt_spec_kind(const dt_spec_t *s);
bool dt_spec_causal(const dt_spec_t *s);
/* deterministic: yes unless the spec sets it to no (the GPU attention
 * backward on deterministic kernels, so that runs and resumes repeat to the
 * bit; no: cuDNN's fastest engines, whose dQ sums in no fixed order). */
bool dt_spec_deterministic(const dt_spec_t *s);
enum dt_layout dt_spec_layout(const dt_spec_t *s);
/* The offload set (enum dt_offload bits; 0 for none or unset). */
unsigned dt_spec_offload(const dt_spec_t *s);
/* ckpt_dtype (DT_CKPT_FP32 unset). */
enum dt_ckpt_dtype dt_spec_ckpt_dtype(const dt_spec_t *s);
int64_t dt_spec_warmup(const dt_spec_t *s);
int64_t dt_spec_ckpt_every(const dt_spec_t *s);
/* The same as names ("cuda", "h100-sxm", "bf16"). */
const char *dt_spec_device(const dt_spec_t *s);
const char *dt_spec_gpu(const dt_spec_t *s);
const char *dt_spec_dtype(const dt_spec_t *s);
/* An integer key's value (0: not given) else its table default (0 for a
 * word such as "auto" or none); a number key given as text (lr, min_lr,
 * weight_decay, clip, adam_eps, norm_eps) as a double, else its default;
 * a string key's value, else its default text (NULL for none). `key` must
 * be a key of the table. */
int64_t dt_spec_int(const dt_spec_t *s, const char *key);
double dt_spec_real(const dt_spec_t *s, const char *key);
const char *dt_spec_word(const dt_spec_t *s, const char *key);

/* The mask keys' own checks, part of dt_spec_check (the engine, which
 * sets its options one by one, asks them alone): their syntax, and the
 * keys they need and exclude (what a device runs is dt_vocab_masks_run's,
 * asked by the planner and the engine). 0 or DT_EINVAL naming the key. */
int dt_spec_check_masks(const dt_spec_t *s, dt_emsg_t *em);
/* The mask keys resolved (a spec that passed dt_spec_check). */
struct dt_mask_rules;
void dt_spec_mask_rules(const dt_spec_t *s, struct dt_mask_rules *r);

/* The key table (NULL-name-terminated) over dt_spec_t; tags: the bits
 * DT_SPEC_FOR(kind) of the dtengine commands that take the key as an
 * option. One key by name, or NULL. The words a key accepts
 * (NULL-terminated), or NULL when it is not a key of words. */
#define DT_SPEC_FOR(kind) (1u << (kind))
const dt_conf_key_t *dt_spec_keys(void);
const dt_conf_key_t *dt_spec_key(const char *name);
const char *const *dt_spec_key_values(const char *key);
/* Whether the key's value is a set of those words (offload): "none" or
 * words joined by commas, each once (spec/vocab.h dt_vocab_parse_set). */
bool dt_spec_key_is_list(const char *key);

/* Parse spec text (`name` is used in messages, e.g. the file name) and
 * check it: kind and tokens given, values in their sets, segments and
 * dilations together. The text must be UTF-8 without control characters
 * (C0 but tab, DEL, C1; a CR may end a line): otherwise DT_ECONF naming the
 * line, the key set on it and the column. Returns 0, or DT_ECONF / DT_EINVAL
 * with a message naming the key. On error *out is left zeroed. */
int dt_spec_parse(const char *name, const char *text, dt_spec_t *out, dt_emsg_t *em);
/* Read and parse a spec file: a regular file (a directory, FIFO or device
 * is refused with DT_EINVAL before it is read) of at most 1 MiB, whose text
 * is checked as dt_spec_parse's. */
int dt_spec_load(const char *path, dt_spec_t *out, dt_emsg_t *em);
/* Read a spec file as dt_spec_load does, into s, but with no key required
 * and without dt_spec_check: for a file that leaves keys to command-line
 * flags (dt_spec_set them, then dt_spec_check). causal and causal_set say
 * whether the file set causal (causal = 1 when it did not). On error s
 * holds no value from the file. */
int dt_spec_load_partial(const char *path, dt_spec_t *s, dt_emsg_t *em);
/* The spec key a command-line flag at argv[i] names ("--kv-heads" ->
 * "kv_heads", the caller's to free), its value, and how many arguments it
 * used (1 or 2). Accepts --key VALUE, --key=VALUE, and for boolean keys a
 * bare --key (yes) or --no-key (no); a boolean key takes the next argument
 * as its value only when that is a boolean word (--causal no), so that
 * `--causal job.spec` is a flag and a file. DT_EUSAGE when the value is missing
 * (*key then NULL). The key is not checked: dt_spec_set does. */
int dt_spec_flag(int argc, char **argv, int i, char **key, const char **value, dt_emsg_t *em);
/* Set one key from a string, as a flag would (`--tokens 1M` style values are
 * the file's: sizes accept K/M/G). Checks as dt_spec_parse does for that
 * key. */
int dt_spec_set(dt_spec_t *s, const char *key, const char *value, dt_emsg_t *em);
/* The checks of dt_spec_check that concern the model keys only (numbers
 * given as text, rope scaling complete, init_from without a preset): for
 * a spec that is not a whole job (dtengine's options). */
int dt_spec_check_model(const dt_spec_t *s, dt_emsg_t *em);
/* Check a spec built with dt_spec_set (the same checks as parse). */
int dt_spec_check(const dt_spec_t *s, dt_emsg_t *em);
/* Canonical text: one `key = value` line per set key, in table order,
 * quoted where needed; parses back to an equal spec. The caller frees it. */
char *dt_spec_format(const dt_spec_t *s);
void dt_spec_free(dt_spec_t *s);

#endif /* DT_SPEC_H */
