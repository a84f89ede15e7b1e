/* SPDX-License-Identifier: MIT
 *
 * Model shapes and settings, and the ONE table of model presets that dtctl,
 * dtcoordd (through the planner) and dtengine all resolve a job's `model`
 * through, so a preset or a default is written once (dt-spec(5) prints the
 * same table). A model is a preset with any shape key given overriding it;
 * `custom` starts from no shape (every shape key must be given), RoPE base
 * 500000 and an untied head. No weights here: engine/model/ holds those.
 */
#ifndef DT_SPEC_MODEL_H
#define DT_SPEC_MODEL_H

#include <stdbool.h>

#include "common/err.h"
#include "spec/spec.h"

typedef struct dt_model_cfg {
    char name[32]; /* the preset, or "custom" */
    int dim, layers, heads, kv_heads, ffn, vocab;
    double rope_theta;
    float norm_eps;
    bool tied; /* the LM head shares the embedding's weights */
} dt_model_cfg_t;

/* The preset NAME (tiny, llama3-8b, llama3-70b, or custom: no shape, theta
 * 500000, untied). DT_EINVAL naming the known presets otherwise. */
int dt_model_preset(const char *name, dt_model_cfg_t *out, dt_emsg_t *em);

/* The model of a job spec: its preset (tiny when `model` is not given),
 * then every shape key and setting the spec gives on top. Range checks are
 * the spec's (dt_spec_check); shape consistency is the caller's
 * (dt_model_cfg_check for the engine, the planner's own with its words). */
int dt_model_from_spec(const dt_spec_t *s, dt_model_cfg_t *out, dt_emsg_t *em);

/* Validate: positive sizes, heads divide dim, kv_heads divide heads, head
 * dim even (RoPE pairs), positive rope_theta and norm_eps. DT_EINVAL
 * naming the field. */
int dt_model_cfg_check(const dt_model_cfg_t *cfg, dt_emsg_t *em);

/* What `dtengine train --device cuda` allocates on each GPU, in bytes
 * (engine/model/model_cuda.c allocates exactly these; the planner plans
 * with them): per parameter (fp32 master, gradient and both AdamW moments,
 * and the compute-dtype copy: 16 + elem), per token per layer (the
 * activations kept for the backward), per token outside the layers (the
 * residual stream, the backward's scratch, the head's normed input and
 * the token arrays), and fixed (the LM head's chunk of logits and their
 * gradient, HEAD_ROWS rows). elem is the compute dtype's size (2). The
 * ring's buffers, cuBLASLt's workspace and the CUDA context are not in
 * it. */
#define DT_GPU_HEAD_ROWS 1024
typedef struct dt_gpu_train_bytes {
    double per_param, per_token_layer, per_token, fixed;
} dt_gpu_train_bytes_t;
dt_gpu_train_bytes_t dt_model_gpu_train_bytes(const dt_model_cfg_t *cfg, int elem);

#endif /* DT_SPEC_MODEL_H */
