/* SPDX-License-Identifier: MIT
 *
 * Hugging Face LLaMA model directories (LlamaForCausalLM), in and out:
 *
 *     DIR/config.json                      the model's shape and settings
 *     DIR/model.safetensors                all weights in one file, or
 *     DIR/model.safetensors.index.json     {"metadata": {...},
 *                                           "weight_map": {tensor: shard}}
 *     DIR/model-00001-of-0000N.safetensors its shards
 *
 * Reading is for untrusted directories: config.json is parsed strictly
 * (every feature dt does not implement is refused, never skipped), and
 * dt_hf_open checks every shard header, every tensor's presence, shape and
 * dtype against the config before any weight is read, so a run fails in
 * seconds, not after its first hour. Weights are read one tensor at a time
 * with pread (no whole-file load, no mapping) and converted to fp32.
 *
 * Layout. dt's tensors are fp32, PyTorch layout (a linear weight is
 * (out, in), row-major), in the order and under the ids of dt_hf_tensor_t.
 * They are the Hugging Face ones but for RoPE: dt rotates the interleaved
 * pairs (2i, 2i+1) of each head (Meta's original code), Hugging Face the
 * pairs (i, i + D/2). So the rows of q_proj (H heads) and k_proj (Hkv
 * heads) are permuted, within each head of D rows:
 *
 *     dt row h*D + 2*i + k  =  HF row h*D + k*(D/2) + i     (k < 2, i < D/2)
 *
 * on import, and the inverse on export. v_proj and o_proj are not.
 *
 * Not here: tokenizers and generation_config.json, pytorch_model.bin
 * (pickle), quantised or other architectures (Mistral, Qwen, ...), biases,
 * other RoPE scalings than llama3, mapping files into memory.
 */
#ifndef DT_HF_H
#define DT_HF_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "common/err.h"
#include "spec/dtype.h"
#include "spec/model.h"

#define DT_HF_CONFIG "config.json"
#define DT_HF_WEIGHTS "model.safetensors"
#define DT_HF_INDEX "model.safetensors.index.json"
/* config.json and the index are read whole, up to this size. */
#define DT_HF_JSON_MAX (16u << 20)
/* num_hidden_layers above this is refused (the largest LLaMA has 126). */
#define DT_HF_MAX_LAYERS 65536
/* dt_hf_write's max_position_embeddings for a model without RoPE scaling
 * (LLaMA 3's context); with llama3 scaling it is original_max_pos * factor. */
#define DT_HF_MAX_POS_DEFAULT 8192

/* dt's tensors. Per layer: ATTN_NORM .. W2; the others once. */
typedef enum dt_hf_tensor {
    DT_HF_EMBED,      /* model.embed_tokens.weight                   (V, d) */
    DT_HF_ATTN_NORM,  /* model.layers.L.input_layernorm.weight       (d) */
    DT_HF_WQ,         /* model.layers.L.self_attn.q_proj.weight      (H*D, d), rows permuted */
    DT_HF_WK,         /* model.layers.L.self_attn.k_proj.weight      (Hkv*D, d), rows permuted */
    DT_HF_WV,         /* model.layers.L.self_attn.v_proj.weight      (Hkv*D, d) */
    DT_HF_WO,         /* model.layers.L.self_attn.o_proj.weight      (d, H*D) */
    DT_HF_MLP_NORM,   /* model.layers.L.post_attention_layernorm.weight (d) */
    DT_HF_W1,         /* model.layers.L.mlp.gate_proj.weight         (f, d) */
    DT_HF_W3,         /* model.layers.L.mlp.up_proj.weight           (f, d) */
    DT_HF_W2,         /* model.layers.L.mlp.down_proj.weight         (d, f) */
    DT_HF_FINAL_NORM, /* model.norm.weight                           (d) */
    DT_HF_LM_HEAD,    /* lm_head.weight (V, d); absent when tied: the embedding is the head */
    DT_HF_NTENSORS
} dt_hf_tensor_t;

/* True for the tensors of every layer (DT_HF_ATTN_NORM .. DT_HF_W2). */
bool dt_hf_per_layer(dt_hf_tensor_t t);
/* Elements of tensor t for the model cfg (the product of the shapes above);
 * 0 for DT_HF_LM_HEAD of a tied model and for a t outside the enum. */
int64_t dt_hf_numel(const dt_model_cfg_t *cfg, dt_hf_tensor_t t);
/* The Hugging Face name of tensor t of layer `layer` (ignored for the
 * others) in buf of n bytes; returns buf, or NULL for a t outside the enum
 * or a buffer too small (64 bytes always suffice). */
const char *dt_hf_name(dt_hf_tensor_t t, int layer, char *buf, size_t n);

/* Where tensor t of layer `layer` (ignored for the tensors outside the
 * layers) starts in dt's flat parameter array of layout lo (spec/model.h),
 * in floats; it spans dt_hf_numel floats there. DT_HF_LM_HEAD of a tied
 * model is the embedding's offset. -1 for a t outside the enum or a layer
 * outside [0, lo->layers). The one mapping between these ids and the flat
 * array: import (engine/model/model.c) and export (dtctl export) use it. */
int64_t dt_hf_offset(const dt_model_layout_t *lo, dt_hf_tensor_t t, int layer);

/*-- reading ----------------------------------------------------------------*/

/* DIR/config.json into *cfg (name "hf"). Keys read (all others, of which
 * Hugging Face configs carry many, are ignored):
 *   architectures            required, exactly ["LlamaForCausalLM"]
 *   model_type               "llama" if present
 *   hidden_size, num_hidden_layers, num_attention_heads, intermediate_size,
 *   vocab_size               required positive integers
 *   num_key_value_heads      positive integer dividing the heads (default:
 *                            the heads)
 *   head_dim                 positive integer (absent or null: hidden_size /
 *                            heads, which heads must then divide); cfg->head_dim
 *                            is set only when it differs from that
 *   rms_norm_eps             required positive number
 *   rope_theta               positive number (default 10000)
 *   rope_scaling             null, or {"rope_type" (or "type"): "default"} or
 *                            {"rope_type": "llama3", "factor",
 *                            "low_freq_factor", "high_freq_factor",
 *                            "original_max_position_embeddings"}
 *   rope_parameters          transformers 5's form of both: {"rope_type",
 *                            "rope_theta", and the llama3 keys}; when given
 *                            beside rope_theta or rope_scaling they must agree
 *   tie_word_embeddings      boolean (default false)
 *   attention_bias, mlp_bias false if present; hidden_act "silu" if present;
 *                            partial_rotary_factor 1 if present;
 *                            no quantization_config
 * null counts as absent for the optional keys. Then dt_model_cfg_check.
 * Returns 0; DT_ENOENT, DT_EACCES, DT_EIO when the file cannot be read,
 * DT_EFORMAT for malformed JSON (with jansson's line and column), DT_ENOTSUP
 * for a feature dt does not implement (another architecture, biases, an
 * activation or RoPE type other than silu and llama3), DT_EINVAL for a
 * missing key, a wrong JSON type or a bad value. Every message names the
 * file and the key. *cfg is undefined on failure. */
int dt_hf_config_read(const char *dir, dt_model_cfg_t *cfg, dt_emsg_t *em);

/* An open model directory: the config and every shard header, checked.
 * Holds one file descriptor per shard until dt_hf_close. */
typedef struct dt_hf dt_hf_t;

/* Open DIR: dt_hf_config_read, then the weights, DIR/model.safetensors if it
 * exists (as transformers, which prefers it to an index), else
 * DIR/model.safetensors.index.json and its shards (plain file names in DIR:
 * no '/', not "." or ".."). Every shard is opened and its header validated
 * (safetensors.h: a truncated file is refused here). The index and the
 * shards must agree exactly: every tensor the index lists is in the shard
 * it names, every tensor of a shard is listed under that shard. Each tensor
 * must be one of dt's (dt_hf_name) with the shape the config gives and
 * dtype F32, F16 or BF16; ignored are model.rotary_emb.inv_freq and
 * model.layers.N.self_attn.rotary_emb.inv_freq (old exports kept the RoPE
 * table) and lm_head.weight of a tied model. Every tensor dt
 * needs must be there, lm_head.weight too unless tied. Symbolic links are
 * followed (the Hugging Face cache links snapshots to blobs).
 * Returns 0 and *out (the caller's, released by dt_hf_close); or
 * dt_hf_config_read's codes, DT_ENOENT (no weights, a shard missing),
 * DT_EFORMAT (malformed index or shard, index and shards disagree, a tensor
 * missing, a layer beyond the config's), DT_ESHAPE, DT_EDTYPE, DT_ENOTSUP (a
 * bias or another tensor dt does not know), DT_EINVAL (a shard name that is
 * not a plain file name), with a message naming the file and the tensor or
 * key. *out is NULL on failure. */
int dt_hf_open(const char *dir, dt_hf_t **out, dt_emsg_t *em);
/* No-op on NULL. */
void dt_hf_close(dt_hf_t *h);
/* The model's configuration, borrowed from h. */
const dt_model_cfg_t *dt_hf_cfg(const dt_hf_t *h);
/* The dtype tensor t (of layer) is stored in (DT_F32, DT_F16 or DT_BF16);
 * DT_F32 for an absent one. */
dt_dtype_t dt_hf_dtype(const dt_hf_t *h, dt_hf_tensor_t t, int layer);

/* Read tensor t of layer (ignored for the tensors outside the layers) into
 * dst, dt_hf_numel(dt_hf_cfg(h), t) floats, in dt's layout (q and k rows
 * permuted), converting F16 and BF16 exactly. Only that tensor's bytes are
 * read (pread); no memory beyond dst and, for q and k, one head of D rows.
 * Safe to call from several threads at once with different dst. Returns 0;
 * DT_EINVAL for t or layer out of range, DT_ENOENT for DT_HF_LM_HEAD of a
 * tied model; DT_EFORMAT or DT_EIO when the file changed or cannot be read
 * (dst is then undefined). */
int dt_hf_read(const dt_hf_t *h, dt_hf_tensor_t t, int layer, float *dst, dt_emsg_t *em);

/*-- writing ----------------------------------------------------------------*/

/* The source of dt_hf_write: tensor t of layer (0 for those outside the
 * layers), dt_hf_numel floats in dt's layout. The pointer must stay valid
 * and unchanged until dt_hf_write returns (it may be written straight from
 * it); NULL fails the export (DT_ECANCELED). */
typedef const float *(*dt_hf_get_fn)(void *ud, dt_hf_tensor_t t, int layer);

/* Write the model cfg as a Hugging Face directory DIR (created with its
 * parents, mode 0755, if missing) that transformers 4.x and 5 load as
 * LlamaForCausalLM:
 *   config.json: architectures, model_type "llama", the shape, head_dim,
 *     rms_norm_eps, rope_theta and rope_scaling (null, or llama3's
 *     object with rope_type "llama3"), tie_word_embeddings, hidden_act
 *     "silu", attention_bias and mlp_bias false, torch_dtype and dtype
 *     ("float32", "bfloat16", "float16"), max_position_embeddings
 *     (original_max_pos * factor with llama3 scaling, else
 *     DT_HF_MAX_POS_DEFAULT); no bos/eos (no tokenizer here). Numbers are
 *     written in their shortest exact decimal form (rms_norm_eps 1e-5).
 *   weights in dtype (DT_F32, DT_BF16 or DT_F16; rounded to nearest even
 *     through common/half.h), Hugging Face names and layout (q and k rows
 *     back in HF order), in the order of the model's state_dict
 *     (embedding; per layer q k v o, gate up down, both norms; the norm;
 *     lm_head.weight only when untied), metadata {"format": "pt"}. One
 *     DIR/model.safetensors when the tensors' bytes total at most
 *     shard_bytes or shard_bytes <= 0; otherwise shards
 *     model-%05d-of-%05d.safetensors, filled in that order, a new one begun
 *     before a tensor that would take the current one past shard_bytes (a
 *     tensor larger than shard_bytes gets its own, as transformers splits),
 *     and DIR/model.safetensors.index.json {"metadata": {"total_size":
 *     bytes of all tensors}, "weight_map": {tensor: shard}}.
 * get is called once per written tensor, in file order, on the calling
 * thread; memory held beyond its tensors is one shard's converted tensors
 * (none for F32 tensors other than q and k). cfg, dtype and DIR are checked
 * before get is first called; DIR may exist but must hold no config.json,
 * index or model*.safetensors (DT_EEXIST naming it). Every file is written
 * atomically with mode 0644 less the umask (a model to share, unlike a
 * checkpoint's shards), config.json last. On failure every file this
 * call wrote is removed, and DIR too when this call created it.
 * Returns 0; DT_EINVAL (cfg fails dt_model_cfg_check, or more layers than
 * DT_HF_MAX_LAYERS or shards than 99999), DT_EDTYPE, DT_EEXIST, DT_ECANCELED
 * (get returned NULL), or the code of a failed file operation, with a
 * message naming the file. */
int dt_hf_write(const char *dir, const dt_model_cfg_t *cfg, dt_dtype_t dtype, int64_t shard_bytes,
                dt_hf_get_fn get, void *ud, dt_emsg_t *em);

/* Whether dt_hf_write may write into DIR, checked before the weights are
 * gathered: 0 when DIR does not exist or holds no config.json, index or
 * model*.safetensors; DT_EEXIST naming the file otherwise, or the code of
 * a DIR that cannot be listed. dt_hf_write checks the same again. */
int dt_hf_check_target(const char *dir, dt_emsg_t *em);

#endif /* DT_HF_H */
