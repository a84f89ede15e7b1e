/* SPDX-License-Identifier: MIT
 *
 * Model shapes and settings, and the ONE table of model presets that dtctl,
 * dtcoordd (through the planner) and dtengine all resolve a job's `model`
 * through, so a preset or a default is written once (dt-spec(5) prints the
 * same table). A model is a preset with any shape key given overriding it;
 * `custom` starts from no shape (every shape key must be given), RoPE base
 * 500000 and an untied head. Also the offsets of every tensor in the flat
 * parameter array. No weights here: engine/model/ holds those.
 */
#ifndef DT_SPEC_MODEL_H
#define DT_SPEC_MODEL_H

#include <stdbool.h>
#include <stdint.h>

#include "common/err.h"
#include "spec/spec.h"

/* Rotary position embedding: the base, and LLaMA 3.1's frequency scaling
 * (Hugging Face's rope_scaling of rope_type "llama3"): with factor > 0, a
 * pair whose wavelength 2 pi / f exceeds original_max_pos / low_freq_factor
 * turns factor times slower, one shorter than original_max_pos /
 * high_freq_factor is unchanged, and those between are interpolated
 * (kernels/cpu/layers_ref.c dt_rope_freq). factor 0: no scaling. */
typedef struct dt_rope {
    double theta;
    double factor, low_freq_factor, high_freq_factor, original_max_pos;
} dt_rope_t;

typedef struct dt_model_cfg {
    char name[32]; /* the preset, or "custom" */
    int dim, layers, heads, kv_heads, ffn, vocab;
    int head_dim;  /* D; 0: dim / heads (dt_model_head_dim) */
    dt_rope_t rope;
    float norm_eps;
    bool tied; /* the LM head shares the embedding's weights */
} dt_model_cfg_t;

/* D, the width of one attention head: head_dim when set, else dim / heads.
 * The query projection is (heads * D, dim), which need not be dim x dim. */
static inline int dt_model_head_dim(const dt_model_cfg_t *c)
{
    return c->head_dim > 0 ? c->head_dim : c->heads > 0 ? c->dim / c->heads : 0;
}

/* The preset NAME (tiny, llama3-8b, llama3-70b, or custom: no shape, theta
 * 500000, untied). DT_EINVAL naming the known presets otherwise. */
int dt_model_preset(const char *name, dt_model_cfg_t *out, dt_emsg_t *em);
/* The presets' names, NULL-terminated, in the table's order. */
extern const char *const dt_model_names[];

/* The model of a job spec: its preset (tiny when `model` is not given),
 * then every shape key and setting the spec gives on top. Range checks are
 * the spec's (dt_spec_check); shape consistency is the caller's
 * (dt_model_cfg_check for the engine, the planner's own with its words). */
int dt_model_from_spec(const dt_spec_t *s, dt_model_cfg_t *out, dt_emsg_t *em);

/* Validate: positive sizes, heads divide dim (unless head_dim is given),
 * kv_heads divide heads, head dim even (RoPE pairs), positive rope theta and
 * norm_eps, a rope scaling with factor >= 1, 0 < low_freq_factor <
 * high_freq_factor and original_max_pos >= 1. DT_EINVAL naming the key. */
int dt_model_cfg_check(const dt_model_cfg_t *cfg, dt_emsg_t *em);

/* The flat parameter array: every parameter of the model, fp32, in one
 * fixed order (the embedding; per layer attn_norm, wq, wk, wv, wo,
 * mlp_norm, w1, w3, w2; the final norm; the LM head unless tied), so the
 * optimizer, the gradient all-reduce, checkpoints (io/ckpt.h) and the
 * Hugging Face export (io/hf_export.h) see one buffer. Pure arithmetic on the
 * shape: no weights here (engine/model/ holds those).
 * Offsets (in floats) of each tensor in the flat parameter array. */
typedef struct dt_model_layer_off {
    int64_t attn_norm, wq, wk, wv, wo, mlp_norm, w1, w3, w2;
} dt_model_layer_off_t;

typedef struct dt_model_layout {
    int64_t tok_emb;           /* (V, d) */
    dt_model_layer_off_t *layer; /* [layers] */
    int layers;                /* entries of layer */
    int64_t final_norm;        /* (d) */
    int64_t lm_head;           /* (V, d); equals tok_emb when tied */
    int64_t nparams;
} dt_model_layout_t;

/* The offsets of cfg (its sizes positive: dt_model_cfg_check) into lo,
 * which holds an allocation until dt_model_layout_close. */
void dt_model_layout_init(dt_model_layout_t *lo, const dt_model_cfg_t *cfg);
void dt_model_layout_close(dt_model_layout_t *lo);

/* What `dtengine train --device cuda` allocates on each GPU, in bytes
 * (engine/model/train_cuda.c allocates exactly these; the planner plans
 * with them): per parameter (fp32 master, gradient and both AdamW moments,
 * and the compute-dtype copy: 16 + elem), per token per layer (what a
 * layer keeps for its backward: its input in fp32, q, k, v in the dtype,
 * the attention's o and lse in fp32), per token outside the layers (the
 * residual stream, its gradient, the attention output's gradient in the
 * dtype, the token arrays), and fixed (a tile of DT_GPU_ROWS rows of each
 * token-local tensor, the LM head's logits and their gradient among
 * them). elem is the compute dtype's size (2). With recompute (recompute =
 * layer) a layer keeps only its input per token (ck bytes an element, on
 * the device or in host memory) and one layer's attention activations
 * move to the per-token scratch. The ring's buffers, cuBLASLt's workspace
 * and the CUDA context are not in it. */
/* The token tile of the GPU's training step (ALST's TiledMLP, and more):
 * everything token by token (the norms, the products, RoPE, the SwiGLU,
 * the LM head and its loss) runs DT_GPU_ROWS tokens at a time, forward and
 * backward, so that no (tokens x ffn) or (tokens x vocab) tensor exists;
 * a layer keeps only what its attention needs whole (q, k, v in the
 * dtype, o, lse) and its input, and the backward makes each tile's
 * residual, norms and MLP products again from that input. */
#define DT_GPU_ROWS 1024
#define DT_GPU_HEAD_ROWS DT_GPU_ROWS
typedef struct dt_gpu_train_bytes {
    double per_param, per_token_layer, per_token, fixed;
    double host_per_token_layer; /* page-locked host memory: the offloaded layer inputs */
} dt_gpu_train_bytes_t;
/* c: the tokens per GPU (whether the MLP is tiled). With recompute: ck
 * the kept layer inputs' element size (4 fp32, 2 bf16: ckpt_dtype) and
 * offload_act whether they are in host memory (offload = activations:
 * the device then holds two of them in flight, per token). */
dt_gpu_train_bytes_t dt_model_gpu_train_bytes(const dt_model_cfg_t *cfg, int elem,
                                              int recompute, int64_t c, int ck, int offload_act);

/* Sharded training gathers and reduces the flat parameters in units: the
 * embedding (V d), each layer (attn_norm, wq, wk, wv, wo, mlp_norm, w1,
 * w3, w2), and last the final norm with the LM head (V d + d; d alone when
 * tied). The parameters of the largest unit (cfg's sizes positive). */
int64_t dt_model_unit_max(const dt_model_cfg_t *cfg);
/* The parameters of one layer's unit (the GPU's second unit buffer holds
 * that many: the larger units take the first). */
int64_t dt_model_unit_layer(const dt_model_cfg_t *cfg);

/* Unit u of the flat array (lo: cfg's layout), [*a, *b): 0 the embedding,
 * 1 + l layer l, layers + 1 the final norm and (untied) the LM head. */
void dt_model_unit_range(const dt_model_cfg_t *cfg, const dt_model_layout_t *lo, int u,
                         int64_t *a, int64_t *b);

/* The GPU's reduce-scatter of a unit's gradient (shard = gradients) takes
 * the peers' addends through a scratch of R units, or of DT_GPU_RS_BYTES
 * when smaller (a chunk at a time): its floats on R > 1 ranks. */
#define DT_GPU_RS_BYTES ((int64_t)64 << 20)
int64_t dt_model_gpu_rs_floats(const dt_model_cfg_t *cfg, int R);

#endif /* DT_SPEC_MODEL_H */
