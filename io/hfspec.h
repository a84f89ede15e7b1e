/* SPDX-License-Identifier: MIT
 *
 * A job spec's init_from resolved into its model keys: the Hugging Face
 * directory's config.json (io/hf_config.h) gives the shape and settings, written
 * into the spec as the keys dt-spec(5) names, so that dtctl (which fills
 * them before a job is submitted, reading the directory as the user),
 * dtcoordd (which plans with the keys and never reads the directory) and
 * dtengine (which fills them again from the same file) agree on one model.
 * Not here: the weights (io/hf.h dt_hf_read).
 */
#ifndef DT_IO_HFSPEC_H
#define DT_IO_HFSPEC_H

#include "common/err.h"
#include "spec/spec.h"

/* With s->init_from set: read its config.json, and set every model key of
 * s from it (model = custom, dim, layers, heads, kv_heads, ffn, vocab,
 * head_dim when it is not dim / heads, rope_theta, tied, norm_eps and the
 * rope scaling keys; with doc_mask = eot and no eot_token, eot_token
 * from eos_token_id when the config has one). A key s already gives must hold the config's value:
 * otherwise DT_EINVAL naming the key, its value, the file and the
 * config's key and value. What dt_hf_config_read refuses is refused with
 * its message. s is unchanged on failure. No-op without init_from. */
int dt_hf_spec_fill(dt_spec_t *s, dt_emsg_t *em);

#endif /* DT_IO_HFSPEC_H */
