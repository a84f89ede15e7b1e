/* SPDX-License-Identifier: MIT
 *
 * The masks of a model run (train and prefill): the spec's mask keys
 * (spec/mask_rules.h) made into the masks of each sequence the run reads,
 * the targets and RoPE positions they imply, what checkpoints record of
 * them and --print-settings' lines. The attention itself is engine/attn's.
 */
#ifndef DT_ENGINE_CMD_MASKS_H
#define DT_ENGINE_CMD_MASKS_H

#include <jansson.h>
#include <stdbool.h>
#include <stdint.h>

#include "common/err.h"
#include "spec/attn_spec.h"
#include "spec/mask.h"
#include "spec/mask_rules.h"
#include "spec/vocab.h"

struct dt_spec;

/* A model run's masks (train and prefill; spec/mask_rules.h): the spec's
 * rules, and the masks of the sequence at hand, which the run's
 * attention spec points at (mask, and with alternating layers
 * mask_rest and mask_every). */
typedef struct dt_cmd_masks {
    dt_mask_rules_t r;
    bool any;       /* some mask beyond causality */
    dt_mask_t all;  /* every layer's (with alternation: the windowed layers') */
    dt_mask_t rest; /* with alternation: the other layers' */
} dt_cmd_masks_t;

/* The spec's mask keys for a run of `kind`: their checks
 * (dt_spec_check_masks, the engine setting keys one by one), the rules
 * into *r, and whether the spec's device runs them (dt_vocab_masks_run).
 * 0, or the error naming the key. */
int dt_cmd_masks_options(const struct dt_spec *s, enum dt_job_kind kind, dt_mask_rules_t *r,
                         dt_emsg_t *em);

/* From the spec's rules r (dt_spec_mask_rules), for sequences of T and a
 * model of `layers` layers and `vocab` tokens: the rules checked against
 * the model (eot_token in the vocabulary) and the masks built, attn
 * pointed at them when any. 0, or DT_EINVAL naming the key.
 * dt_cmd_masks_close it, also after a failure. */
int dt_cmd_masks_init(dt_cmd_masks_t *mk, const dt_mask_rules_t *r, int64_t T, bool causal,
                      int layers, int vocab, dt_attn_spec_t *attn, dt_emsg_t *em);
/* A new sequence, input tokens xs and targets ys (T each): its documents
 * into the masks; the targets not scored set to DT_IGNORE. */
void dt_cmd_masks_sequence(dt_cmd_masks_t *mk, const int32_t *xs, int32_t *ys);
/* The RoPE positions of rows at sequence positions pos (c) into rope. */
void dt_cmd_masks_rope(const dt_cmd_masks_t *mk, const int64_t *pos, int64_t c,
                       int64_t pos_offset, int64_t *rope);
void dt_cmd_masks_close(dt_cmd_masks_t *mk);
/* The masks in a checkpoint manifest's "plan" (a "masks" line,
 * dt_mask_rules_format's, when any: a manifest without it had none), and
 * checked against this run's: DT_EINVAL naming the checkpoint dir and
 * both when they differ (a resume continues the same masks). */
void dt_cmd_plan_masks(json_t *plan, const dt_mask_rules_t *r);
int dt_cmd_check_masks(const char *dir, const json_t *plan, const dt_mask_rules_t *r,
                       dt_emsg_t *em);
/* --print-settings' lines for the mask keys. */
void dt_cmd_masks_settings(const dt_mask_rules_t *r);

#endif /* DT_ENGINE_CMD_MASKS_H */
