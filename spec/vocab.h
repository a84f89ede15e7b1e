/* SPDX-License-Identifier: MIT
 *
 * The job vocabulary: one enum and one name table for each word a job
 * spec, the planner, the coordinator, the agents and the engine use for a
 * kind, a device, a cluster preset, a compute dtype, a layout, a shard
 * level, a recompute mode or an offload set; and the one answer to "can this engine run
 * this job" (dt_vocab_runs). Every binary names and parses these words
 * here and nowhere else; the spec key table (spec/spec.c) takes its
 * accepted values from these tables, and dt-spec(5) lists the same.
 *
 * Not here: what a preset's figures are (plan/request.c), the layouts'
 * arithmetic (spec/layout.h), the element types of files (spec/dtype.h,
 * whose compute subset is named here).
 */
#ifndef DT_SPEC_VOCAB_H
#define DT_SPEC_VOCAB_H

#include <stdbool.h>

#include "common/err.h"
#include "spec/dtype.h"
#include "spec/layout.h"

enum dt_job_kind { DT_KIND_ATTN = 0, DT_KIND_PREFILL, DT_KIND_TRAIN };

enum dt_device { DT_DEVICE_CPU = 0, DT_DEVICE_CUDA };

/* Cluster presets (spec key gpu); their figures are the planner's. */
enum dt_gpu_preset { DT_GPU_H100_SXM = 0, DT_GPU_H200, DT_GPU_CPU };

/* Activation recomputation in training (spec key recompute): AUTO (the
 * spec leaves it unset) plans without it and, when the job then fits at no
 * rank count, with it; NONE and LAYER are the user's and always honoured. */
enum dt_recompute { DT_RECOMPUTE_AUTO = 0, DT_RECOMPUTE_NONE, DT_RECOMPUTE_LAYER };

/* Sharded training state (spec key shard), each level adding to the one
 * before: OPTIMIZER the AdamW state, GRADIENTS the gradients, PARAMETERS
 * the parameters themselves (gathered one unit at a time), each rank
 * keeping a slice of about 1/W, W = R the ranks of the ring (with dp = N
 * rings, W = N R: all the job's ranks). AUTO (the spec leaves it unset,
 * train only): the planner picks the least that fits; the others are the
 * user's and always honoured. */
enum dt_shard_level {
    DT_SHARD_AUTO = 0,
    DT_SHARD_NONE,
    DT_SHARD_OPTIMIZER,
    DT_SHARD_GRADIENTS,
    DT_SHARD_PARAMETERS,
};

/* What a training job keeps in host memory instead of the device's (spec
 * key offload, a list of these words, or none): bits of a set. ACTIVATIONS
 * each layer's checkpointed input (with recompute = layer), OPTIMIZER the
 * AdamW state and its update. */
enum dt_offload { DT_OFFLOAD_ACTIVATIONS = 1u << 0, DT_OFFLOAD_OPTIMIZER = 1u << 1 };

/* The dtype of the layer inputs training keeps for recompute = layer
 * (spec key ckpt_dtype): FP32 exact (bit-identical to keeping them as
 * computed), BF16 half the bytes (rounded to nearest even; ALST's). */
enum dt_ckpt_dtype { DT_CKPT_FP32 = 0, DT_CKPT_BF16 };

/* Documents in a model job's sequences (spec key doc_mask): NONE one
 * sequence, EOT a document at each eot_token (spec/mask_rules.h). */
enum dt_doc_mask { DT_DOC_MASK_NONE = 0, DT_DOC_MASK_EOT };
/* RoPE positions in documents (spec key doc_positions): CONTINUE the
 * sequence's, RESET from 0 in each document. */
enum dt_doc_positions { DT_DOC_POS_CONTINUE = 0, DT_DOC_POS_RESET };

/* The words, in the enums' order, NULL-terminated; a value's name is
 * names[value] ("auto" for the AUTO values, which no spec spells). */
extern const char *const dt_kind_names[];     /* attn prefill train */
extern const char *const dt_device_names[];   /* cpu cuda */
extern const char *const dt_gpu_names[];      /* h100-sxm h200 cpu */
extern const char *const dt_recompute_names[]; /* none layer (from DT_RECOMPUTE_NONE) */
extern const char *const dt_shard_names[];    /* none optimizer gradients parameters (from
                                               * DT_SHARD_NONE) */
extern const char *const dt_layout_names[];   /* contiguous zigzag */
extern const char *const dt_compute_dtype_names[]; /* fp32 bf16 fp16 */
extern const char *const dt_offload_names[];  /* activations optimizer: bit i is names[i] */
extern const char *const dt_ckpt_dtype_names[]; /* fp32 bf16 */
extern const char *const dt_doc_mask_names[];   /* none eot */
extern const char *const dt_doc_positions_names[]; /* continue reset */

const char *dt_kind_name(enum dt_job_kind k);
const char *dt_device_name(enum dt_device d);
const char *dt_gpu_name(enum dt_gpu_preset g);
const char *dt_recompute_name(enum dt_recompute r);
const char *dt_shard_name(enum dt_shard_level s);

/* Parse a word into its enum: 0, or DT_EINVAL naming `what` (an option or
 * key, e.g. "--shard" or "key 'shard'") and the accepted words:
 *   "--shard 'all': none, optimizer, gradients or parameters" */
int dt_kind_parse(const char *what, const char *s, enum dt_job_kind *out, dt_emsg_t *em);
int dt_device_parse(const char *what, const char *s, enum dt_device *out, dt_emsg_t *em);
int dt_gpu_parse(const char *what, const char *s, enum dt_gpu_preset *out, dt_emsg_t *em);
int dt_recompute_parse(const char *what, const char *s, enum dt_recompute *out, dt_emsg_t *em);
int dt_shard_parse(const char *what, const char *s, enum dt_shard_level *out, dt_emsg_t *em);
int dt_ckpt_dtype_parse(const char *what, const char *s, enum dt_ckpt_dtype *out, dt_emsg_t *em);
/* fp32, bf16 or fp16 into DT_F32, DT_BF16, DT_F16. */
int dt_compute_dtype_parse(const char *what, const char *s, dt_dtype_t *out, dt_emsg_t *em);

/* A list-valued key's value: "none" (the empty set) or words of names
 * (at most 32) separated by commas, each once, into the set of their bits
 * (bit i for names[i]). DT_EINVAL naming `what` and the fault:
 *   "key 'offload': unknown word 'params' in 'activations,params' (words:
 *    activations or optimizer, or none)"
 * dt_offload_parse is it for dt_offload_names. */
int dt_vocab_parse_set(const char *what, const char *s, const char *const *names,
                       unsigned *out, dt_emsg_t *em);
int dt_offload_parse(const char *what, const char *s, unsigned *out, dt_emsg_t *em);
/* A set as its canonical value, the words in the table's order joined by
 * commas ("none" for the empty set), into buf (n bytes). */
void dt_vocab_format_set(char *buf, size_t n, const char *const *names, unsigned set);

/* The index of s in a NULL-terminated word list, or -1. */
int dt_vocab_find(const char *const *names, const char *s);
/* "a, b or c" into buf (n bytes). */
void dt_vocab_list(char *buf, size_t n, const char *const *names);

/* What the engine of a device runs, asked by the planner (which then
 * chooses among these only), by the coordinator at submit and by
 * dtengine itself. A job of `kind` on `device` with the given shard level
 * (AUTO: any the device runs) and dp rings: 0, or DT_ENOTSUP with the
 * reason ("data parallel is for kind = train"). Both engines run every
 * shard level and any dp for training; the one place that would say
 * otherwise. */
int dt_vocab_runs(enum dt_device device, enum dt_job_kind kind, enum dt_shard_level shard,
                  int dp, dt_emsg_t *em);
/* The same for the offload set (enum dt_offload bits), train jobs only:
 * the CPU engine keeps everything in host memory already, so any set is
 * what it runs (and changes nothing); the GPU engine runs every set
 * (optimizer: the AdamW state and fp32 parameters in host memory;
 * activations: the layer inputs recompute = layer keeps). 0, or
 * DT_ENOTSUP with the reason (kind not train). */
int dt_vocab_offload_runs(enum dt_device device, enum dt_job_kind kind, unsigned offload,
                          dt_emsg_t *em);
/* The same for attention masks: documents, windows and block patterns
 * (blocks; one for every head: a pattern per head is the CPU engine's,
 * refused by the GPU ring itself) on dense attention run on both
 * engines; masks on dilated attention (dilated) only on the CPU engine
 * (DT_ENOTSUP with the reason). */
int dt_vocab_masks_run(enum dt_device device, enum dt_job_kind kind, bool blocks, bool dilated,
                       dt_emsg_t *em);
/* The same for a layout: the CPU engine runs every layout; the GPU ring
 * contiguous and zigzag (DT_ENOTSUP for balanced). */
int dt_vocab_layout_runs(enum dt_device device, enum dt_layout layout, dt_emsg_t *em);
/* Whether dt_vocab_runs accepts that shard level on that device (dp 1). */
bool dt_vocab_shard_runs(enum dt_device device, enum dt_shard_level shard);

#endif /* DT_SPEC_VOCAB_H */
