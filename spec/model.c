/* SPDX-License-Identifier: MIT
 *
 * The model preset table and the resolution of a spec's model keys (see
 * spec/model.h). The LLaMA 3 rows are Meta's published configurations;
 * tiny is a LLaMA-shaped model of 3.1 M parameters (head dim 32, GQA 4:1,
 * tied head) small enough to train on a few CPU cores in a demo.
 */
#include "config.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/macros.h"
#include "common/mem.h"
#include "spec/model.h"
#include "spec/spec.h"
#include "spec/vocab.h"

static const dt_model_cfg_t presets[] = {
    { .name = "tiny", .dim = 256, .layers = 4, .heads = 8, .kv_heads = 2, .ffn = 768,
      .vocab = 512, .rope = { .theta = 10000 }, .norm_eps = 1e-5f, .tied = true },
    { .name = "llama3-8b", .dim = 4096, .layers = 32, .heads = 32, .kv_heads = 8,
      .ffn = 14336, .vocab = 128256, .rope = { .theta = 500000 }, .norm_eps = 1e-5f, .tied = false },
    { .name = "llama3-70b", .dim = 8192, .layers = 80, .heads = 64, .kv_heads = 8,
      .ffn = 28672, .vocab = 128256, .rope = { .theta = 500000 }, .norm_eps = 1e-5f, .tied = false },
    /* no shape: every shape key must be given (dt_spec_check says which) */
    { .name = "custom", .rope = { .theta = 500000 }, .norm_eps = 1e-5f, .tied = false },
};

/* The presets' names, in the table's order (spec key model's values). */
const char *const dt_model_names[] = { "tiny", "llama3-8b", "llama3-70b", "custom", NULL };
_Static_assert(DT_ARRAY_SIZE(dt_model_names) == DT_ARRAY_SIZE(presets) + 1,
               "one name per preset");

int dt_model_preset(const char *name, dt_model_cfg_t *out, dt_emsg_t *em)
{
    for (size_t i = 0; i < DT_ARRAY_SIZE(presets); i++) {
        if (name != NULL && strcmp(name, presets[i].name) == 0) {
            *out = presets[i];
            return 0;
        }
    }
    char list[128];
    dt_vocab_list(list, sizeof(list), dt_model_names);
    return dt_emsg_set(em, DT_EINVAL, "unknown model '%s' (known: %s; custom needs every shape "
                       "key)", name ? name : "(null)", list);
}

int dt_model_from_spec(const dt_spec_t *s, dt_model_cfg_t *out, dt_emsg_t *em)
{
    const int64_t *key[] = { &s->dim, &s->ffn, &s->heads, &s->kv_heads, &s->layers, &s->vocab };
    int *field[] = { &out->dim, &out->ffn, &out->heads, &out->kv_heads, &out->layers, &out->vocab };
    int rc;

    if ((rc = dt_model_preset(dt_spec_word(s, "model"), out, em)) < 0)
        return rc;
    /* dt_spec_check bounds every shape key far below INT_MAX (dt-spec(5)) */
    for (size_t i = 0; i < DT_ARRAY_SIZE(key); i++)
        if (*key[i] > 0)
            *field[i] = (int)*key[i];
    if (s->head_dim > 0)
        out->head_dim = (int)s->head_dim;
    if (s->rope_theta > 0)
        out->rope.theta = (double)s->rope_theta;
    if (s->tied)
        out->tied = strcmp(s->tied, "yes") == 0;
    /* dt_spec_check has checked the numbers' text and ranges */
    if (s->norm_eps)
        out->norm_eps = strtof(s->norm_eps, NULL);
    if (s->rope_scaling && strcmp(s->rope_scaling, "none") == 0) {
        out->rope.factor = 0;
    } else if (s->rope_scaling) {
        out->rope.factor = strtod(s->rope_factor, NULL);
        out->rope.low_freq_factor = strtod(s->rope_low_freq_factor, NULL);
        out->rope.high_freq_factor = strtod(s->rope_high_freq_factor, NULL);
        out->rope.original_max_pos = (double)s->rope_original_max_pos;
    }
    return 0;
}

int dt_model_cfg_check(const dt_model_cfg_t *c, dt_emsg_t *em)
{
    if (c->dim <= 0 || c->layers <= 0 || c->heads <= 0 || c->kv_heads <= 0 || c->ffn <= 0 ||
        c->vocab <= 0)
        return dt_emsg_set(em, DT_EINVAL, "model: dim %d, layers %d, heads %d, kv_heads %d, "
                           "ffn %d and vocab %d must all be positive", c->dim, c->layers,
                           c->heads, c->kv_heads, c->ffn, c->vocab);
    if (c->head_dim < 0)
        return dt_emsg_set(em, DT_EINVAL, "model: head_dim %d must be positive", c->head_dim);
    if (c->head_dim == 0 && c->dim % c->heads != 0)
        return dt_emsg_set(em, DT_EINVAL, "model: heads %d do not divide dim %d (or give "
                           "head_dim)", c->heads, c->dim);
    if (c->heads % c->kv_heads != 0)
        return dt_emsg_set(em, DT_EINVAL, "model: kv_heads %d do not divide heads %d",
                           c->kv_heads, c->heads);
    if (dt_model_head_dim(c) % 2 != 0)
        return dt_emsg_set(em, DT_EINVAL, "model: head dim %d must be even (RoPE pairs)",
                           dt_model_head_dim(c));
    if (!(c->rope.theta > 0) || !(c->norm_eps > 0))
        return dt_emsg_set(em, DT_EINVAL, "model: rope_theta and norm_eps must be positive");
    if (c->rope.factor != 0 &&
        !(c->rope.factor >= 1 && c->rope.low_freq_factor > 0 &&
          c->rope.low_freq_factor < c->rope.high_freq_factor && c->rope.original_max_pos >= 1))
        return dt_emsg_set(em, DT_EINVAL, "model: rope scaling llama3 needs rope_factor >= 1 "
                           "(%g), 0 < rope_low_freq_factor (%g) < rope_high_freq_factor (%g) "
                           "and rope_original_max_pos >= 1 (%g)", c->rope.factor,
                           c->rope.low_freq_factor, c->rope.high_freq_factor,
                           c->rope.original_max_pos);
    return 0;
}

void dt_model_layout_init(dt_model_layout_t *lo, const dt_model_cfg_t *c)
{
    int64_t d = c->dim, D = dt_model_head_dim(c), off = 0;

    lo->layer = dt_xcalloc((size_t)c->layers, sizeof(*lo->layer));
    lo->layers = c->layers;
    lo->tok_emb = off;
    off += (int64_t)c->vocab * d;
    for (int l = 0; l < c->layers; l++) {
        dt_model_layer_off_t *L = &lo->layer[l];
        L->attn_norm = off, off += d;
        L->wq = off, off += (int64_t)c->heads * D * d;
        L->wk = off, off += (int64_t)c->kv_heads * D * d;
        L->wv = off, off += (int64_t)c->kv_heads * D * d;
        L->wo = off, off += d * (int64_t)c->heads * D;
        L->mlp_norm = off, off += d;
        L->w1 = off, off += (int64_t)c->ffn * d;
        L->w3 = off, off += (int64_t)c->ffn * d;
        L->w2 = off, off += d * (int64_t)c->ffn;
    }
    lo->final_norm = off;
    off += d;
    if (c->tied) {
        lo->lm_head = lo->tok_emb;
    } else {
        lo->lm_head = off;
        off += (int64_t)c->vocab * d;
    }
    lo->nparams = off;
}

void dt_model_layout_close(dt_model_layout_t *lo)
{
    free(lo->layer);
    lo->layer = NULL;
    lo->layers = 0;
}

dt_gpu_train_bytes_t dt_model_gpu_train_bytes(const dt_model_cfg_t *m, int elem, int recompute,
                                              int64_t c, int ck, int offload_act)
{
    const double F = 4, e = elem, d = m->dim, H = m->heads, D = (double)dt_model_head_dim(m),
                 qd = H * D, kd = m->kv_heads * D, f = m->ffn, V = m->vocab;
    const double wide = d > qd ? (d > f ? d : f) : (qd > f ? qd : f);
    const double rows = c < DT_GPU_ROWS ? (double)c : DT_GPU_ROWS;
    dt_gpu_train_bytes_t b;

    b.per_param = 4 * F + e;
    b.host_per_token_layer = 0;
    /* kept: what the attention needs whole (q k v in the dtype, o and
     * lse), and the layer's input (fp32) */
    const double attn = e * (qd + 2 * kd) + F * (qd + H);
    b.per_token_layer = attn + F * d;
    /* the residual stream (it holds the backward's dk and dv: as wide as
     * both), its gradient, the attention output's gradient (dtype), the
     * per-row loss (double) and the token arrays (five int32, two int64:
     * positions, grouping) */
    b.per_token = F * (d > 2 * kd ? d : 2 * kd) + F * d + e * qd + 8 + 5 * 4 + 2 * 8;
    /* a tile's rows of: the normed input, a product, q k v, the SwiGLU
     * output, the input and the attention residual, the rstd, gate and up
     * and their gradients and the product's (fp32); the normed input, the
     * attention output, the SwiGLU product and dy (dtype); the head's
     * logits (fp32) and their gradient (dtype); the norm's partial sums */
    b.fixed = rows * (F * (2 * d + qd + 2 * kd + f + 2 * d + 1 + 5 * f) +
                      e * (d + qd + f + wide)) +
              (double)DT_GPU_HEAD_ROWS * V * (F + e) + 512 * 8;
    if (recompute) {
        /* the layers' inputs, saved in the checkpoint dtype (on the
         * device, or in host memory with two in flight on the device);
         * one layer's attention activations */
        b.per_token += attn;
        b.per_token_layer = offload_act ? 0 : ck * d;
        if (offload_act) {
            b.per_token += 2.0 * ck * d;
            b.host_per_token_layer = ck * d;
        }
    }
    return b;
}

int64_t dt_model_unit_layer(const dt_model_cfg_t *c)
{
    int64_t d = c->dim, D = dt_model_head_dim(c);

    return 2 * d + 2 * (int64_t)c->heads * D * d + 2 * (int64_t)c->kv_heads * D * d +
           3 * (int64_t)c->ffn * d;
}

int64_t dt_model_unit_max(const dt_model_cfg_t *c)
{
    int64_t d = c->dim, vd = (int64_t)c->vocab * d;
    int64_t layer = dt_model_unit_layer(c);
    int64_t last = d + (c->tied ? 0 : vd), max = vd;

    if (layer > max)
        max = layer;
    return last > max ? last : max;
}

void dt_model_unit_range(const dt_model_cfg_t *c, const dt_model_layout_t *lo, int u, int64_t *a,
                         int64_t *b)
{
    const int L = c->layers;

    if (u == 0) {
        *a = lo->tok_emb;
        *b = lo->tok_emb + (int64_t)c->vocab * c->dim;
    } else if (u <= L) {
        *a = lo->layer[u - 1].attn_norm;
        *b = u < L ? lo->layer[u].attn_norm : lo->final_norm;
    } else {
        *a = lo->final_norm;
        *b = lo->nparams;
    }
}

int64_t dt_model_gpu_rs_floats(const dt_model_cfg_t *cfg, int R)
{
    int64_t all = (int64_t)R * dt_model_unit_max(cfg), cap = DT_GPU_RS_BYTES / 4;

    return all < cap ? all : cap;
}
