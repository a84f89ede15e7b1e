/* SPDX-License-Identifier: MIT
 *
 * The LLaMA-3 forward and backward on the CPU layers (kernels/cpu/
 * layers_cpu.h) and the engine's distributed attention (engine/attn/attn.h).
 * Activations of every layer are kept for the backward; nothing is
 * recomputed except inside the attention kernels. The loss is normalised
 * by the number of counted targets over all ranks, so the summed gradient
 * is that of one sequence, however it is split.
 *
 * The layer-wise forward (dt_model_embed, dt_model_layer_fwd,
 * dt_model_head) runs the very statics dt_model_step's forward runs, in the
 * same order on the same kernels, so a prefill and a training step agree to
 * the bit; a forward-only model keeps one layer's activations.
 */
#include "config.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "common/mem.h"
#include "engine/data/gen.h"
#include "engine/model/model.h"
#include "io/hf.h"
#include "kernels/cpu/layers_cpu.h"

static void fill(uint64_t seed, uint64_t stream, float *p, int64_t n, float stddev)
{
    dt_gen_normal(seed, stream, 0, n, p);
    for (int64_t i = 0; i < n; i++)
        p[i] *= stddev;
}

static void ones(float *p, int64_t n)
{
    for (int64_t i = 0; i < n; i++)
        p[i] = 1.0f;
}

void dt_model_init(const dt_model_cfg_t *c, const dt_model_layout_t *lo, uint64_t seed,
                   float *params)
{
    int64_t d = c->dim, D = dt_model_head_dim(c);
    float s = 0.02f, sr = 0.02f / sqrtf(2.0f * (float)c->layers);
    uint64_t stream = 100;

    fill(seed, stream++, params + lo->tok_emb, (int64_t)c->vocab * d, s);
    for (int l = 0; l < c->layers; l++) {
        const dt_model_layer_off_t *L = &lo->layer[l];
        ones(params + L->attn_norm, d);
        fill(seed, stream++, params + L->wq, (int64_t)c->heads * D * d, s);
        fill(seed, stream++, params + L->wk, (int64_t)c->kv_heads * D * d, s);
        fill(seed, stream++, params + L->wv, (int64_t)c->kv_heads * D * d, s);
        fill(seed, stream++, params + L->wo, d * (int64_t)c->heads * D, sr);
        ones(params + L->mlp_norm, d);
        fill(seed, stream++, params + L->w1, (int64_t)c->ffn * d, s);
        fill(seed, stream++, params + L->w3, (int64_t)c->ffn * d, s);
        fill(seed, stream++, params + L->w2, d * (int64_t)c->ffn, sr);
    }
    ones(params + lo->final_norm, d);
    if (!c->tied)
        fill(seed, stream++, params + lo->lm_head, (int64_t)c->vocab * d, s);
}

int dt_model_init_hf(const dt_model_cfg_t *cfg, const dt_model_layout_t *lo, const char *dir,
                     float *params, dt_emsg_t *em)
{
    dt_hf_t *h = NULL;
    const dt_model_cfg_t *hc;
    int rc;

    if ((rc = dt_hf_open(dir, &h, em)) < 0)
        return rc;
    hc = dt_hf_cfg(h);
    if (hc->dim != cfg->dim || hc->layers != cfg->layers || hc->heads != cfg->heads ||
        hc->kv_heads != cfg->kv_heads || hc->ffn != cfg->ffn || hc->vocab != cfg->vocab ||
        dt_model_head_dim(hc) != dt_model_head_dim(cfg) || hc->tied != cfg->tied) {
        dt_hf_close(h);
        return dt_emsg_set(em, DT_EINVAL, "%s: the model's shape is not this run's (dim %d, "
                           "layers %d, heads %d, kv_heads %d, ffn %d, vocab %d)", dir,
                           cfg->dim, cfg->layers, cfg->heads, cfg->kv_heads, cfg->ffn,
                           cfg->vocab);
    }
    for (int t = 0; t < DT_HF_NTENSORS && rc == 0; t++) {
        if (t == DT_HF_LM_HEAD && cfg->tied)
            continue;
        int n = dt_hf_per_layer((dt_hf_tensor_t)t) ? cfg->layers : 1;
        for (int l = 0; l < n && rc == 0; l++)
            rc = dt_hf_read(h, (dt_hf_tensor_t)t, l,
                            params + dt_hf_offset(lo, (dt_hf_tensor_t)t, l), em);
    }
    dt_hf_close(h);
    return rc;
}

/* ---- working state -------------------------------------------------------- */

typedef struct acts {
    float *xin, *h1, *rstd1, *q, *k, *v, *o, *lse, *x2, *h2, *rstd2, *a, *b, *g;
} acts_t;

struct dt_model {
    dt_model_cfg_t cfg;
    dt_model_layout_t lo;
    int64_t c;
    int nact;                     /* layers, or 1 (forward only, or recompute) */
    int backward;                 /* dt_model_step may run: the backward's buffers exist */
    acts_t *act;                  /* [nact] */
    float *saved;                 /* recompute: every layer's input (layers, c, d) */
    float *xr;                    /* recompute: the layer being recomputed (c, d) */
    float *x, *xf, *hf, *rstdf, *logits;
    /* backward scratch */
    float *dx, *dh, *dt, *dq, *dk, *dv, *do_, *da, *db, *dg;
};

static float *buf(int64_t n)
{
    return dt_xcalloc((size_t)(n > 0 ? n : 1), sizeof(float));
}

/* The forward's buffers: nact layers of activations, the final norm's and
 * the logits, and the residual branch scratch (dt). */
static dt_model_t *model_alloc(const dt_model_cfg_t *cfg, int64_t c, int nact)
{
    dt_model_t *m = dt_xcalloc(1, sizeof(*m));
    int64_t d = cfg->dim, D = dt_model_head_dim(cfg), qd = (int64_t)cfg->heads * D,
            kd = (int64_t)cfg->kv_heads * D, f = cfg->ffn;

    m->cfg = *cfg;
    m->c = c;
    m->nact = nact;
    dt_model_layout_init(&m->lo, cfg);
    m->act = dt_xcalloc((size_t)nact, sizeof(*m->act));
    for (int l = 0; l < nact; l++) {
        acts_t *A = &m->act[l];
        A->xin = buf(c * d), A->h1 = buf(c * d), A->rstd1 = buf(c);
        A->q = buf(c * qd), A->k = buf(c * kd), A->v = buf(c * kd);
        A->o = buf(c * qd), A->lse = buf(c * cfg->heads);
        A->x2 = buf(c * d), A->h2 = buf(c * d), A->rstd2 = buf(c);
        A->a = buf(c * f), A->b = buf(c * f), A->g = buf(c * f);
    }
    m->x = buf(c * d), m->xf = buf(c * d), m->hf = buf(c * d), m->rstdf = buf(c);
    m->logits = buf(c * cfg->vocab);
    m->dt = buf(c * d);
    return m;
}

/* The backward's buffers (and with recompute the layers' inputs). */
static dt_model_t *model_train(const dt_model_cfg_t *cfg, int64_t c, int recompute)
{
    dt_model_t *m = model_alloc(cfg, c, recompute ? 1 : cfg->layers);
    int64_t d = cfg->dim, D = dt_model_head_dim(cfg), qd = (int64_t)cfg->heads * D,
            kd = (int64_t)cfg->kv_heads * D, f = cfg->ffn;

    m->backward = 1;
    if (recompute) {
        m->saved = buf((int64_t)cfg->layers * c * d);
        m->xr = buf(c * d);
    }
    m->dx = buf(c * d), m->dh = buf(c * d);
    m->dq = buf(c * qd), m->dk = buf(c * kd), m->dv = buf(c * kd), m->do_ = buf(c * qd);
    m->da = buf(c * f), m->db = buf(c * f), m->dg = buf(c * f);
    return m;
}

dt_model_t *dt_model_new(const dt_model_cfg_t *cfg, int64_t c)
{
    return model_train(cfg, c, 0);
}

dt_model_t *dt_model_new_recompute(const dt_model_cfg_t *cfg, int64_t c)
{
    return model_train(cfg, c, 1);
}

dt_model_t *dt_model_new_forward(const dt_model_cfg_t *cfg, int64_t c)
{
    return model_alloc(cfg, c, 1);
}

void dt_model_free(dt_model_t *m)
{
    if (m == NULL)
        return;
    for (int l = 0; l < m->nact; l++) {
        acts_t *A = &m->act[l];
        float *p[] = { A->xin, A->h1, A->rstd1, A->q, A->k, A->v, A->o,
                       A->lse, A->x2, A->h2, A->rstd2, A->a, A->b, A->g };
        for (size_t i = 0; i < sizeof(p) / sizeof(p[0]); i++)
            free(p[i]);
    }
    float *p[] = { m->x, m->xf, m->hf, m->rstdf, m->logits, m->dx, m->dh, m->dt,
                   m->dq, m->dk, m->dv, m->do_, m->da, m->db, m->dg, m->saved, m->xr };
    for (size_t i = 0; i < sizeof(p) / sizeof(p[0]); i++)
        free(p[i]);
    free(m->act);
    dt_model_layout_close(&m->lo);
    free(m);
}

const float *dt_model_logits(const dt_model_t *m)
{
    return m->logits;
}

static void add(float *y, const float *x, int64_t n)
{
    for (int64_t i = 0; i < n; i++)
        y[i] += x[i];
}

/* ---- forward ------------------------------------------------------------- */

static int check_attn(const dt_model_t *m, const dt_attn_spec_t *attn, dt_emsg_t *em)
{
    const dt_model_cfg_t *cf = &m->cfg;
    const int64_t D = dt_model_head_dim(cf), H = cf->heads, Hkv = cf->kv_heads;

    if (attn->H != H || attn->Hkv != Hkv || attn->D != D)
        return dt_emsg_set(em, DT_ESHAPE, "attention (H=%d, Hkv=%d, D=%d) does not match the "
                           "model (H=%lld, Hkv=%lld, D=%lld)", attn->H, attn->Hkv, attn->D,
                           (long long)H, (long long)Hkv, (long long)D);
    return 0;
}

/* Block l on x (c, d) in place, its activations into A. */
static int layer_fwd(dt_model_t *m, dt_comm_t *comm, const dt_attn_spec_t *attn, const float *P,
                     int l, acts_t *A, const int64_t *pos, float *x, dt_emsg_t *em)
{
    const dt_model_cfg_t *cf = &m->cfg;
    const dt_model_layer_off_t *L = &m->lo.layer[l];
    const int64_t c = m->c, d = cf->dim, D = dt_model_head_dim(cf), H = cf->heads,
                  Hkv = cf->kv_heads, qd = H * D, kd = Hkv * D, f = cf->ffn;
    int rc;

    memcpy(A->xin, x, (size_t)(c * d) * sizeof(float));
    dt_rmsnorm_fwd_cpu(c, cf->dim, cf->norm_eps, x, P + L->attn_norm, A->h1, A->rstd1);
    dt_linear_fwd_cpu(c, cf->dim, (int)qd, A->h1, P + L->wq, A->q);
    dt_linear_fwd_cpu(c, cf->dim, (int)kd, A->h1, P + L->wk, A->k);
    dt_linear_fwd_cpu(c, cf->dim, (int)kd, A->h1, P + L->wv, A->v);
    dt_rope_fwd_cpu(c, (int)H, (int)D, pos, &cf->rope, A->q);
    dt_rope_fwd_cpu(c, (int)Hkv, (int)D, pos, &cf->rope, A->k);
    if ((rc = dt_attn_fwd(comm, attn, A->q, A->k, A->v, A->o, A->lse, NULL, em)) < 0)
        return rc;
    dt_linear_fwd_cpu(c, (int)qd, cf->dim, A->o, P + L->wo, m->dt);
    add(x, m->dt, c * d);
    memcpy(A->x2, x, (size_t)(c * d) * sizeof(float));
    dt_rmsnorm_fwd_cpu(c, cf->dim, cf->norm_eps, x, P + L->mlp_norm, A->h2, A->rstd2);
    dt_linear_fwd_cpu(c, cf->dim, (int)f, A->h2, P + L->w1, A->a);
    dt_linear_fwd_cpu(c, cf->dim, (int)f, A->h2, P + L->w3, A->b);
    dt_swiglu_fwd_cpu(c, (int)f, A->a, A->b, A->g);
    dt_linear_fwd_cpu(c, (int)f, cf->dim, A->g, P + L->w2, m->dt);
    add(x, m->dt, c * d);
    return 0;
}

/* Final norm and LM head of x (c, d) into m->logits (c, V). */
static void head_fwd(dt_model_t *m, const float *P, const float *x)
{
    const dt_model_cfg_t *cf = &m->cfg;
    const int64_t c = m->c, d = cf->dim;

    memcpy(m->xf, x, (size_t)(c * d) * sizeof(float));
    dt_rmsnorm_fwd_cpu(c, cf->dim, cf->norm_eps, m->xf, P + m->lo.final_norm, m->hf, m->rstdf);
    dt_linear_fwd_cpu(c, cf->dim, cf->vocab, m->hf, P + m->lo.lm_head, m->logits);
}

int dt_model_embed(dt_model_t *m, const float *P, const int32_t *x, float *hidden, dt_emsg_t *em)
{
    int rc = dt_tokens_check(m->c, m->cfg.vocab, x, 0, em);

    if (rc < 0)
        return rc;
    dt_embed_fwd_cpu(m->c, m->cfg.vocab, m->cfg.dim, x, P + m->lo.tok_emb, hidden);
    return 0;
}

int dt_model_layer_fwd(dt_model_t *m, dt_comm_t *comm, const dt_attn_spec_t *attn,
                       const float *P, int l, const int64_t *pos, float *hidden, dt_emsg_t *em)
{
    int rc;

    if (l < 0 || l >= m->cfg.layers)
        return dt_emsg_set(em, DT_ERANGE, "layer %d: the model has layers 0 to %d", l,
                           m->cfg.layers - 1);
    if ((rc = check_attn(m, attn, em)) < 0)
        return rc;
    return layer_fwd(m, comm, attn, P, l, &m->act[l % m->nact], pos, hidden, em);
}

int dt_model_head(dt_model_t *m, dt_comm_t *comm, const float *P, const float *hidden,
                  const int32_t *y, double *loss, dt_emsg_t *em)
{
    int rc;

    if ((rc = dt_tokens_check(m->c, m->cfg.vocab, y, 1, em)) < 0)
        return rc;
    head_fwd(m, P, hidden);
    return dt_model_xent(comm, m->c, m->cfg.vocab, m->logits, y, loss, em);
}

int dt_model_xent(dt_comm_t *comm, int64_t c, int V, const float *logits, const int32_t *y,
                  double *loss, dt_emsg_t *em)
{
    int64_t count = 0;
    int rc;

    if ((rc = dt_tokens_check(c, V, y, 1, em)) < 0)
        return rc;
    /* as dt_model_step: the local mean times the local count, summed */
    double local = dt_xent_cpu(c, V, logits, y, NULL, &count);
    double tot[2] = { local * (double)count, (double)count };
    if ((rc = dt_comm_allreduce_sum_f64(comm, tot, 2)) < 0)
        return dt_emsg_set(em, rc, "loss all-reduce failed");
    *loss = tot[1] > 0 ? tot[0] / tot[1] : 0.0;
    return 0;
}

/* ---- forward and backward ----------------------------------------------- */

int dt_model_step(dt_model_t *m, dt_comm_t *comm, const dt_attn_spec_t *attn,
                  const float *P, const int32_t *x, const int32_t *y, const int64_t *pos,
                  float *G, double *loss, dt_emsg_t *em)
{
    const dt_model_cfg_t *cf = &m->cfg;
    const dt_model_layout_t *lo = &m->lo;
    const int64_t c = m->c, d = cf->dim, D = dt_model_head_dim(cf), H = cf->heads,
                  Hkv = cf->kv_heads, qd = H * D, kd = Hkv * D, f = cf->ffn, V = cf->vocab;
    int rc;

    if (!m->backward)
        return dt_emsg_set(em, DT_EINVAL, "a forward-only model (dt_model_new_forward) "
                           "cannot take a step");
    if ((rc = check_attn(m, attn, em)) < 0)
        return rc;
    if ((rc = dt_tokens_check(c, cf->vocab, x, 0, em)) < 0 ||
        (rc = dt_tokens_check(c, cf->vocab, y, 1, em)) < 0)
        return rc;

    /* forward */
    dt_embed_fwd_cpu(c, cf->vocab, cf->dim, x, P + lo->tok_emb, m->x);
    for (int l = 0; l < cf->layers; l++) {
        /* recompute: only the layer's input is kept, its activations are
         * made again in the backward */
        if (m->saved)
            memcpy(m->saved + l * c * d, m->x, (size_t)(c * d) * sizeof(float));
        if ((rc = layer_fwd(m, comm, attn, P, l, &m->act[l % m->nact], pos, m->x, em)) < 0)
            return rc;
    }
    head_fwd(m, P, m->x);

    /* the loss over every rank's counted targets */
    int64_t count = 0;
    float *dlogits = G ? dt_xaligned((size_t)(c * V), sizeof(float)) : NULL;
    double local = dt_xent_cpu(c, cf->vocab, m->logits, y, dlogits, &count);
    double tot[2] = { local * (double)count, (double)count };
    if ((rc = dt_comm_allreduce_sum_f64(comm, tot, 2)) < 0) {
        free(dlogits);
        return dt_emsg_set(em, rc, "loss all-reduce failed");
    }
    *loss = tot[1] > 0 ? tot[0] / tot[1] : 0.0;
    if (G == NULL)
        return 0;
    /* xent's gradient is of the local mean: rescale to the global mean */
    float scale = tot[1] > 0 ? (float)((double)count / tot[1]) : 0.0f;
    for (int64_t i = 0; i < c * V; i++)
        dlogits[i] *= scale;

    /* backward */
    memset(G, 0, (size_t)lo->nparams * sizeof(float));
    dt_linear_bwd_cpu(c, cf->dim, cf->vocab, m->hf, P + lo->lm_head, dlogits, m->dh,
                      G + lo->lm_head);
    free(dlogits);
    dt_rmsnorm_bwd_cpu(c, cf->dim, m->xf, P + lo->final_norm, m->rstdf, m->dh, m->dx,
                       G + lo->final_norm);
    for (int l = cf->layers - 1; l >= 0; l--) {
        const dt_model_layer_off_t *L = &lo->layer[l];
        acts_t *A = &m->act[l % m->nact];
        /* the same forward on the same input, so the same activations to
         * the bit (the ring attention is deterministic), then its backward;
         * every rank recomputes layer l here, in the same order */
        if (m->saved) {
            memcpy(m->xr, m->saved + l * c * d, (size_t)(c * d) * sizeof(float));
            if ((rc = layer_fwd(m, comm, attn, P, l, A, pos, m->xr, em)) < 0)
                return rc;
        }
        /* MLP: x = x2 + W2 swiglu(W1 h2, W3 h2), h2 = norm(x2) */
        dt_linear_bwd_cpu(c, (int)f, cf->dim, A->g, P + L->w2, m->dx, m->dg, G + L->w2);
        dt_swiglu_bwd_cpu(c, (int)f, A->a, A->b, m->dg, m->da, m->db);
        dt_linear_bwd_cpu(c, cf->dim, (int)f, A->h2, P + L->w1, m->da, m->dh, G + L->w1);
        dt_linear_bwd_cpu(c, cf->dim, (int)f, A->h2, P + L->w3, m->db, m->dt, G + L->w3);
        add(m->dh, m->dt, c * d);
        dt_rmsnorm_bwd_cpu(c, cf->dim, A->x2, P + L->mlp_norm, A->rstd2, m->dh, m->dt,
                           G + L->mlp_norm);
        add(m->dx, m->dt, c * d);
        /* attention: x2 = xin + Wo attn(rope(Wq h1), rope(Wk h1), Wv h1) */
        dt_linear_bwd_cpu(c, (int)qd, cf->dim, A->o, P + L->wo, m->dx, m->do_, G + L->wo);
        if ((rc = dt_attn_bwd(comm, attn, A->q, A->k, A->v, A->o, A->lse, m->do_, m->dq, m->dk,
                              m->dv, NULL, em)) < 0)
            return rc;
        dt_rope_bwd_cpu(c, (int)H, (int)D, pos, &cf->rope, m->dq);
        dt_rope_bwd_cpu(c, (int)Hkv, (int)D, pos, &cf->rope, m->dk);
        dt_linear_bwd_cpu(c, cf->dim, (int)qd, A->h1, P + L->wq, m->dq, m->dh, G + L->wq);
        dt_linear_bwd_cpu(c, cf->dim, (int)kd, A->h1, P + L->wk, m->dk, m->dt, G + L->wk);
        add(m->dh, m->dt, c * d);
        dt_linear_bwd_cpu(c, cf->dim, (int)kd, A->h1, P + L->wv, m->dv, m->dt, G + L->wv);
        add(m->dh, m->dt, c * d);
        dt_rmsnorm_bwd_cpu(c, cf->dim, A->xin, P + L->attn_norm, A->rstd1, m->dh, m->dt,
                           G + L->attn_norm);
        add(m->dx, m->dt, c * d);
    }
    dt_embed_bwd_cpu(c, cf->vocab, cf->dim, x, m->dx, G + lo->tok_emb);

    /* each rank saw its own tokens: sum the parameter gradients */
    if ((rc = dt_comm_allreduce_sum_f32(comm, G, (size_t)lo->nparams)) < 0)
        return dt_emsg_set(em, rc, "gradient all-reduce failed");
    return 0;
}
