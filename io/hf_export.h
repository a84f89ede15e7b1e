/* SPDX-License-Identifier: MIT
 *
 * A Hugging Face LLaMA model directory (LlamaForCausalLM) written from
 * dt's tensors, for transformers 4.x and 5 to load: config.json
 * (hf_config.h), the weights in one file or in shards with their index
 * (the files hf.h names), in Hugging Face's names and layout: the rows of
 * q_proj and k_proj back in Hugging Face's RoPE order (hf.h "Layout", the
 * inverse of the import).
 *
 * Not here: reading a directory back (hf.h), where the tensors come from
 * (a dt_hf_get_fn: dtctl export gives a checkpoint's, tests/tools/hfgen
 * random ones), tokenizers.
 */
#ifndef DT_HF_EXPORT_H
#define DT_HF_EXPORT_H

#include <stdint.h>

#include "common/err.h"
#include "io/hf.h"
#include "spec/dtype.h"
#include "spec/model.h"

/* The source of dt_hf_write: tensor t of layer (0 for those outside the
 * layers), dt_hf_numel floats in dt's layout. The pointer must stay valid
 * and unchanged until dt_hf_write returns (it may be written straight from
 * it); NULL fails the export (DT_ECANCELED). */
typedef const float *(*dt_hf_get_fn)(void *ud, dt_hf_tensor_t t, int layer);

/* Write the model cfg as a Hugging Face directory DIR (created with its
 * parents, mode 0755, if missing) that transformers 4.x and 5 load as
 * LlamaForCausalLM:
 *   config.json: dt_hf_config_write's for dtype (hf_config.h).
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
 * before get is first called; DIR may exist but must hold no model file
 * (dt_hf_is_model_file: DT_EEXIST naming it). Every file is written
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

#endif /* DT_HF_EXPORT_H */
