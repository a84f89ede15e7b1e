/* SPDX-License-Identifier: MIT
 *
 * A Hugging Face LLaMA model directory's config.json (LlamaForCausalLM), in
 * and out: the model's shape and settings as dt_model_cfg_t (spec/model.h).
 * Reading is for untrusted directories: the file is parsed strictly, and
 * every feature dt does not implement is refused, never skipped. Writing
 * gives the form transformers 4.x writes, which 5 reads too.
 *
 * Also the reading and writing of any JSON file of a model directory
 * whole, which the index (model.safetensors.index.json: hf.h reads it,
 * hf_export.h writes it) shares with config.json.
 *
 * Not here: the weights and the index's entries (hf.h), a whole
 * directory's export (hf_export.h), tokenizers and generation_config.json.
 */
#ifndef DT_HF_CONFIG_H
#define DT_HF_CONFIG_H

#include <jansson.h>

#include "common/err.h"
#include "spec/dtype.h"
#include "spec/model.h"

#define DT_HF_CONFIG "config.json"
/* config.json and the index are read whole, up to this size. */
#define DT_HF_JSON_MAX (16u << 20)
/* num_hidden_layers above this is refused (the largest LLaMA has 126). */
#define DT_HF_MAX_LAYERS 65536
/* dt_hf_config_write's max_position_embeddings for a model without RoPE
 * scaling (LLaMA 3's context); with llama3 scaling it is
 * original_max_pos * factor. */
#define DT_HF_MAX_POS_DEFAULT 8192

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

/* DIR/config.json's eos_token_id (the first of a list) into *eos, -1 when
 * it has none (absent, null or an empty list); DT_EINVAL naming the file
 * when it is not a token id, else dt_hf_json_read's codes. */
int dt_hf_config_eos(const char *dir, int64_t *eos, dt_emsg_t *em);

/* The model cfg as DIR/config.json, written atomically with mode 0644 less
 * the umask, in transformers 4's form, which 5 reads too: architectures,
 * model_type "llama", the shape, head_dim, rms_norm_eps, rope_theta and
 * rope_scaling (null, or llama3's object with rope_type "llama3"),
 * tie_word_embeddings, hidden_act "silu", attention_bias and mlp_bias
 * false, torch_dtype and dtype ("float32", "bfloat16", "float16" for
 * dtype), max_position_embeddings (original_max_pos * factor with llama3
 * scaling, else DT_HF_MAX_POS_DEFAULT); no bos/eos (no tokenizer here).
 * Keys sorted, indented by two, as transformers writes; numbers in their
 * shortest exact decimal form (rms_norm_eps 1e-5). cfg is not checked
 * here: dt_hf_write checks it first. Returns 0 or the code of the failed
 * file operation, with a message naming the file. */
int dt_hf_config_write(const char *dir, const dt_model_cfg_t *cfg, dt_dtype_t dtype, dt_emsg_t *em);

/*-- a model directory's JSON files, whole ----------------------------------*/

/* The JSON file at path (a regular file; a symbolic link is followed),
 * read whole and parsed with duplicate keys refused: 0 and *root (the
 * caller's to json_decref); or dt_read_regular's codes (DT_ERANGE above
 * DT_HF_JSON_MAX bytes), DT_EFORMAT for malformed JSON, with a message
 * naming the file, and *root NULL. */
int dt_hf_json_read(const char *path, json_t **root, dt_emsg_t *em);

/* doc as indented JSON with sorted keys (as transformers writes), reals
 * with prec significant digits, and a final newline, written atomically to
 * path with mode 0644 less the umask. doc stays the caller's. Returns 0 or
 * the code of the failed write, with a message naming the file. */
int dt_hf_json_write(const char *path, json_t *doc, int prec, dt_emsg_t *em);

#endif /* DT_HF_CONFIG_H */
