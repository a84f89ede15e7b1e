/* SPDX-License-Identifier: MIT
 *
 * Hugging Face LLaMA model directories (LlamaForCausalLM): dt's tensors
 * in them (ids, names, shapes, places in dt's flat array) and their
 * weights, read:
 *
 *     DIR/config.json                      the model's shape and settings
 *     DIR/model.safetensors                all weights in one file, or
 *     DIR/model.safetensors.index.json     {"metadata": {...},
 *                                           "weight_map": {tensor: shard}}
 *     DIR/model-00001-of-0000N.safetensors its shards
 *
 * Reading is for untrusted directories: config.json is parsed strictly
 * (hf_config.h), and dt_hf_open checks every shard header, every tensor's
 * presence, shape and dtype against the config before any weight is read,
 * so a run fails in seconds, not after its first hour. Weights are read
 * one tensor at a time with pread (no whole-file load, no mapping) and
 * converted to fp32.
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
 * on import, and the inverse on export (hf_export.h). v_proj and o_proj
 * are not.
 *
 * Not here: config.json's keys (hf_config.h), writing a directory
 * (hf_export.h), tokenizers and generation_config.json, pytorch_model.bin
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

#define DT_HF_WEIGHTS "model.safetensors"
#define DT_HF_INDEX "model.safetensors.index.json"

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
/* The shape of tensor t for the model cfg (PyTorch's, the same in both
 * layouts: the shapes above) into shape; returns its number of dimensions,
 * 0 for DT_HF_LM_HEAD of a tied model and for a t outside the enum. */
int dt_hf_shape(const dt_model_cfg_t *cfg, dt_hf_tensor_t t, int64_t shape[2]);
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

/* True when a file called name (no directory) is one of a model
 * directory's: config.json, the index or any model*.safetensors. */
bool dt_hf_is_model_file(const char *name);

/*-- reading ----------------------------------------------------------------*/

/* An open model directory: the config and every shard header, checked.
 * Holds one file descriptor per shard until dt_hf_close. */
typedef struct dt_hf dt_hf_t;

/* Open DIR: dt_hf_config_read (hf_config.h), then the weights,
 * DIR/model.safetensors if it exists (as transformers, which prefers it to
 * an index), else
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

#endif /* DT_HF_H */
