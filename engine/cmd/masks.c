/* SPDX-License-Identifier: MIT
 *
 * A model run's masks (masks.h).
 */
#include "config.h"

#include <stdlib.h>
#include <string.h>

#include "engine/cmd/masks.h"
#include "engine/cmd/options.h"
#include "kernels/cpu/layers_cpu.h"
#include "spec/spec.h"

int dt_cmd_masks_options(const struct dt_spec *s, enum dt_job_kind kind, dt_mask_rules_t *r,
                         dt_emsg_t *em)
{
    int rc;

    if ((rc = dt_spec_check_masks(s, em)) < 0)
        return rc;
    dt_spec_mask_rules(s, r);
    if (!dt_mask_rules_any(r))
        return 0;
    return dt_vocab_masks_run(dt_spec_device_id(s), kind, dt_mask_rules_pattern(r),
                              s->segments != NULL, em);
}

int dt_cmd_masks_init(dt_cmd_masks_t *mk, const dt_mask_rules_t *r, int64_t T, bool causal,
                      int layers, int vocab, dt_attn_spec_t *attn, dt_emsg_t *em)
{
    int rc;

    memset(mk, 0, sizeof(*mk));
    dt_mask_init(&mk->all, T, causal);
    dt_mask_init(&mk->rest, T, causal);
    mk->r = *r;
    mk->any = dt_mask_rules_any(&mk->r);
    if (!mk->any)
        return 0;
    if (mk->r.docs && (mk->r.eot < 0 || mk->r.eot >= vocab))
        return dt_emsg_set(em, DT_EINVAL, "eot_token %lld is not a token of the model's "
                           "vocabulary of %d (doc_mask = eot)", (long long)mk->r.eot, vocab);
    dt_mask_close(&mk->all);
    if ((rc = dt_mask_rules_mask(&mk->r, T, causal, true, &mk->all, em)) < 0)
        return rc;
    attn->mask = &mk->all;
    if (dt_mask_rules_alternate(&mk->r, layers)) {
        dt_mask_close(&mk->rest);
        if ((rc = dt_mask_rules_mask(&mk->r, T, causal, false, &mk->rest, em)) < 0)
            return rc;
        attn->mask_rest = &mk->rest;
        attn->mask_every = mk->r.window_every;
    }
    return 0;
}

void dt_cmd_masks_sequence(dt_cmd_masks_t *mk, const int32_t *xs, int32_t *ys)
{
    if (!mk->r.docs)
        return;
    dt_mask_rules_docs(&mk->r, xs, &mk->all);
    if (mk->rest.T > 0)
        dt_mask_rules_docs(&mk->r, xs, &mk->rest);
    dt_mask_rules_targets(&mk->r, ys, mk->all.T, DT_IGNORE);
}

void dt_cmd_masks_rope(const dt_cmd_masks_t *mk, const int64_t *pos, int64_t c,
                       int64_t pos_offset, int64_t *rope)
{
    dt_mask_rules_rope(&mk->r, &mk->all, pos, c, pos_offset, rope);
}

void dt_cmd_masks_close(dt_cmd_masks_t *mk)
{
    dt_mask_close(&mk->all);
    dt_mask_close(&mk->rest);
}

void dt_cmd_plan_masks(json_t *plan, const dt_mask_rules_t *r)
{
    char line[256];

    if (!dt_mask_rules_any(r))
        return;
    dt_mask_rules_format(line, sizeof(line), r);
    json_object_set_new(plan, "masks", json_string(line));
}

int dt_cmd_check_masks(const char *dir, const json_t *plan, const dt_mask_rules_t *r,
                       dt_emsg_t *em)
{
    const json_t *v = json_object_get(plan, "masks");
    char line[256];

    if (v != NULL && !json_is_string(v))
        return dt_emsg_set(em, DT_EFORMAT, "%s: the manifest's masks is not a string", dir);
    dt_mask_rules_format(line, sizeof(line), r);
    const char *have = v ? json_string_value(v) : "none";
    if (strcmp(have, line) != 0)
        return dt_emsg_set(em, DT_EINVAL, "%s: written with masks %s, this run has %s: a "
                           "resume continues the same masks", dir, have, line);
    return 0;
}

void dt_cmd_masks_settings(const dt_mask_rules_t *r)
{
    char pat[128];

    dt_cmd_setting("doc_mask", "%s", r->docs ? "eot" : "none");
    dt_cmd_setting("eot_token", r->docs ? "%lld" : NULL, (long long)r->eot);
    dt_cmd_setting("doc_positions", "%s", r->reset ? "reset" : "continue");
    dt_cmd_setting("sliding_window", r->window ? "%lld" : NULL, (long long)r->window);
    if (r->window_every > 1)
        dt_cmd_setting("sliding_window_layers", "every:%lld", (long long)r->window_every);
    else
        dt_cmd_setting("sliding_window_layers", "%s", "all");
    dt_mask_pattern_format(pat, sizeof(pat), r);
    dt_cmd_setting("block_pattern", "%s", pat);
    dt_cmd_setting("block_size", "%lld", (long long)r->block);
}
