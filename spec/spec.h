/* SPDX-License-Identifier: MIT
 *
 * Job specifications: what a user submits (dtctl submit SPECFILE, or the
 * same keys as flags), what the coordinator stores and plans, what the
 * engine runs. The format is dt.conf's `key = value` (conf.h): unknown or
 * duplicate keys are errors naming the line. The keys are documented in
 * dt-spec(5); dt_spec_keys() is the table.
 *
 * Integer fields use 0 for "not given" (then a default or the planner
 * decides); strings use NULL.
 */
#ifndef DT_SPEC_H
#define DT_SPEC_H

#include <stdint.h>

#include "common/conf.h"
#include "common/err.h"

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
     * model's shape, settings and weights (io/hf.h) */
    char *init_from;
    int64_t pos_offset; /* the window's first position P (default 0) */
    /* sequence and attention */
    int64_t tokens;  /* sequence length T (required) */
    int causal;      /* default yes (1); 0 only when set to no: see causal_set */
    int causal_set;
    char *segments;  /* "w1,w2,..." */
    char *dilations; /* "r1,r2,..." */
    char *layout;    /* contiguous | zigzag (default zigzag when causal) */
    /* compute dtype: fp32 | bf16 | fp16 (default bf16 on cuda, fp32 on cpu,
     * which computes in fp32 only); `precision` is its old name, kept */
    char *dtype, *precision;
    /* resources */
    char *device;    /* cpu | cuda (default: cuda when gpu is a GPU preset) */
    char *gpu;       /* cluster preset: h100-sxm | h200 | cpu (default: h100-sxm on
                      * cuda, else cpu) */
    int64_t ranks;   /* ranks per ring R (the job runs dp x ranks); 0: the planner chooses */
    int64_t nodes, gpus_per_node, cpus_per_gpu, spares;
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
    char *lr;        /* peak learning rate, a number in (0, 10] (default 3e-3) */
    char *data;      /* "recall" or a token shard path */
    int64_t recall_keys, recall_values, recall_pairs, recall_queries; /* 0: defaults */
    int64_t ckpt_every, ckpt_keep;
    char *ckpt_dir;
    char *output_dir; /* attn and prefill outputs (absolute; NULL: the job's output/) */
    int64_t max_restarts; /* recoveries before the job fails (0: the default, 5) */
    /* a failure seen this often (same rank, cause and step) is deterministic
     * and fails the job: mid-run, and before a generation's first step
     * (0: the defaults, 2 and 3; coordinator/recovery.h) */
    int64_t repeat_failures, repeat_startup_failures;
} dt_spec_t;

/* Resolved settings (the spec must have passed dt_spec_check): the device
 * ("cpu" or "cuda"), the cluster preset ("cpu", "h100-sxm", "h200"), and
 * the compute dtype ("fp32", "bf16" or "fp16"), each from its key or its
 * default as dt-spec(5) gives it. */
const char *dt_spec_device(const dt_spec_t *s);
const char *dt_spec_gpu(const dt_spec_t *s);
const char *dt_spec_dtype(const dt_spec_t *s);

/* The key table (NULL-name-terminated) over dt_spec_t. */
const dt_conf_key_t *dt_spec_keys(void);

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
