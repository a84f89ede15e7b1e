/* SPDX-License-Identifier: MIT
 *
 * init_from into the spec's model keys (io/hfspec.h). Each key is compared
 * as a value (a spec's "1e-5" and the config's 1e-05 agree), then written
 * back in the spec's own text form through dt_spec_set, so the spec that
 * goes to the coordinator holds the config's model exactly.
 */
#include "config.h"

#include <inttypes.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "io/hf_config.h"
#include "io/hfspec.h"

/* The shortest decimal text that reads back as the same float (norm_eps
 * is kept in fp32) or double. */
static void float_text(float v, char *buf, size_t n)
{
    for (int p = 6; p <= 9; p++) {
        snprintf(buf, n, "%.*g", p, (double)v);
        if (strtof(buf, NULL) == v)
            return;
    }
}

static void double_text(double v, char *buf, size_t n)
{
    for (int p = 6; p <= 17; p++) {
        snprintf(buf, n, "%.*g", p, v);
        if (strtod(buf, NULL) == v)
            return;
    }
}

typedef struct want {
    const char *key;     /* the spec's key */
    const char *hf;      /* config.json's key, for the message */
    char text[40];       /* the config's value as spec text */
} want_t;

/* Whether the spec's value of w->key equals w->text as a value: 1, 0, or
 * -1 when the spec does not give the key. given: the spec's value as text. */
static int same(const dt_spec_t *s, const want_t *w, char *given, size_t n)
{
    const dt_conf_key_t *k;

    for (k = dt_spec_keys(); k->name != NULL && strcmp(k->name, w->key) != 0; k++)
        ;
    if (k->name == NULL)
        abort(); /* a key of this file's table is not a spec key: a bug */
    const char *p = (const char *)s + k->offset;
    if (k->type == DT_CONF_STRING) {
        const char *v = *(char *const *)p;
        if (v == NULL)
            return -1;
        snprintf(given, n, "%s", v);
        if (strcmp(w->key, "norm_eps") == 0)
            return strtof(v, NULL) == strtof(w->text, NULL);
        if (strcmp(w->key, "tied") == 0 || strcmp(w->key, "rope_scaling") == 0)
            return strcmp(v, w->text) == 0;
        return strtod(v, NULL) == strtod(w->text, NULL);
    }
    int64_t v = *(const int64_t *)p;
    if (v == 0)
        return -1;
    snprintf(given, n, "%" PRId64, v);
    return v == strtoll(w->text, NULL, 10);
}

int dt_hf_spec_fill(dt_spec_t *s, dt_emsg_t *em)
{
    dt_model_cfg_t c;
    want_t w[16];
    int n = 0, rc;

    if (s->init_from == NULL)
        return 0;
    if ((rc = dt_hf_config_read(s->init_from, &c, em)) < 0)
        return rc;
    if (!(c.rope.theta >= 1 && c.rope.theta <= 9e15 && c.rope.theta == floor(c.rope.theta)))
        return dt_emsg_set(em, DT_ENOTSUP, "%s/config.json: rope_theta %g: dt takes a whole "
                           "number", s->init_from, c.rope.theta);
#define ADD(k, h, ...) (w[n].key = (k), w[n].hf = (h), \
                        snprintf(w[n].text, sizeof(w[n].text), __VA_ARGS__), n++)
    ADD("dim", "hidden_size", "%d", c.dim);
    ADD("layers", "num_hidden_layers", "%d", c.layers);
    ADD("heads", "num_attention_heads", "%d", c.heads);
    ADD("kv_heads", "num_key_value_heads", "%d", c.kv_heads);
    ADD("ffn", "intermediate_size", "%d", c.ffn);
    ADD("vocab", "vocab_size", "%d", c.vocab);
    ADD("head_dim", "head_dim", "%d", dt_model_head_dim(&c));
    ADD("rope_theta", "rope_theta", "%.0f", c.rope.theta);
    ADD("tied", "tie_word_embeddings", "%s", c.tied ? "yes" : "no");
    w[n].key = "norm_eps", w[n].hf = "rms_norm_eps";
    float_text(c.norm_eps, w[n].text, sizeof(w[n].text)), n++;
    ADD("rope_scaling", "rope_scaling", "%s", c.rope.factor > 0 ? "llama3" : "none");
    if (c.rope.factor > 0) {
        const char *names[] = { "rope_factor", "rope_low_freq_factor", "rope_high_freq_factor" };
        const char *hf[] = { "factor", "low_freq_factor", "high_freq_factor" };
        double v[] = { c.rope.factor, c.rope.low_freq_factor, c.rope.high_freq_factor };
        for (int i = 0; i < 3; i++) {
            w[n].key = names[i], w[n].hf = hf[i];
            double_text(v[i], w[n].text, sizeof(w[n].text)), n++;
        }
        ADD("rope_original_max_pos", "original_max_position_embeddings", "%.0f",
            c.rope.original_max_pos);
    }
#undef ADD
    /* every key the spec gives agrees, before anything is set */
    for (int i = 0; i < n; i++) {
        char given[64];
        if (same(s, &w[i], given, sizeof(given)) == 0)
            return dt_emsg_set(em, DT_EINVAL, "key '%s' = %s, but %s/config.json has %s %s",
                               w[i].key, given, s->init_from, w[i].hf, w[i].text);
    }
    if (c.rope.factor == 0 && (s->rope_factor || s->rope_low_freq_factor ||
                               s->rope_high_freq_factor || s->rope_original_max_pos))
        return dt_emsg_set(em, DT_EINVAL, "rope scaling keys given, but %s/config.json has "
                           "no rope_scaling", s->init_from);
    /* documents start at the model's own end-of-text token unless the
     * spec names one */
    int64_t eos = -1;
    if (s->doc_mask != NULL && strcmp(s->doc_mask, "eot") == 0 &&
        !dt_spec_given(s, "eot_token") && (rc = dt_hf_config_eos(s->init_from, &eos, em)) < 0)
        return rc;
    if (s->model == NULL && (rc = dt_spec_set(s, "model", "custom", em)) < 0)
        return rc;
    if (eos >= 0) {
        char text[24];
        snprintf(text, sizeof(text), "%lld", (long long)eos);
        if ((rc = dt_spec_set(s, "eot_token", text, em)) < 0)
            return rc;
    }
    for (int i = 0; i < n; i++)
        if ((rc = dt_spec_set(s, w[i].key, w[i].text, em)) < 0)
            return rc; /* the values are in range: dt_hf_config_read checked them */
    return 0;
}
