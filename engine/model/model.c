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

#include <assert.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "common/mem.h"
#include "engine/data/gen.h"
#include "engine/model/model.h"
#include "io/hf.h"
#include "kernels/cpu/layers_cpu.h"

/* The initialisation writes tensor by tensor into the part [lo, lo + len)
 * of the flat array that dst holds: each tensor's values depend on its
 * stream and index alone, so a part is the whole's, to the bit. */
typedef struct part {
    int64_t lo, len;
    float *dst;
} part_t;

/* [o, o + n) of the flat array within the part: *a (index into the
 * tensor) and *k values; 0 when none. */
static int64_t clip(const part_t *pt, int64_t o, int64_t n, int64_t *a)
{
    int64_t s = o > pt->lo ? o : pt->lo, e = o + n < pt->lo + pt->len ? o + n : pt->lo + pt->len;

    *a = s - o;
    return e > s ? e - s : 0;
}

static void fill(const part_t *pt, uint64_t seed, uint64_t stream, int64_t o, int64_t n,
                 float stddev)
{
    int64_t a, k = clip(pt, o, n, &a);
    float *p = pt->dst + (o + a - pt->lo);

    if (k == 0)
        return;
    dt_gen_normal(seed, stream, a, k, p);
    for (int64_t i = 0; i < k; i++)
        p[i] *= stddev;
}

static void ones(const part_t *pt, int64_t o, int64_t n)
{
    int64_t a, k = clip(pt, o, n, &a);
    float *p = pt->dst + (o + a - pt->lo);

    for (int64_t i = 0; i < k; i++)
        p[i] = 1.0f;
}

void dt_model_init_range(const dt_model_cfg_t *c, const dt_model_layout_t *lo, uint64_t seed,
                         int64_t off, int64_t len, float *dst)
{
    int64_t d = c->dim, D = dt_model_head_dim(c);
    float s = 0.02f, sr = 0.02f / sqrtf(2.0f * (float)c->layers);
    uint64_t stream = 100;
    const part_t pt = { off, len, dst };

    fill(&pt, seed, stream++, lo->tok_emb, (int64_t)c->vocab * d, s);
    for (int l = 0; l < c->layers; l++) {
        const dt_model_layer_off_t *L = &lo->layer[l];
        ones(&pt, L->attn_norm, d);
        fill(&pt, seed, stream++, L->wq, (int64_t)c->heads * D * d, s);
        fill(&pt, seed, stream++, L->wk, (int64_t)c->kv_heads * D * d, s);
        fill(&pt, seed, stream++, L->wv, (int64_t)c->kv_heads * D * d, s);
        fill(&pt, seed, stream++, L->wo, d * (int64_t)c->heads * D, sr);
        ones(&pt, L->mlp_norm, d);
        fill(&pt, seed, stream++, L->w1, (int64_t)c->ffn * d, s);
        fill(&pt, seed, stream++, L->w3, (int64_t)c->ffn * d, s);
        fill(&pt, seed, stream++, L->w2, d * (int64_t)c->ffn, sr);
    }
    ones(&pt, lo->final_norm, d);
    if (!c->tied)
        fill(&pt, seed, stream++, lo->lm_head, (int64_t)c->vocab * d, s);
}

void dt_model_init(const dt_model_cfg_t *c, const dt_model_layout_t *lo, uint64_t seed,
                   float *params)
{
    dt_model_init_range(c, lo, seed, 0, lo->nparams, params);
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
    /* sharded training state (dt_model_new_train) */
    int shard;                    /* DT_MODEL_SHARD_* */
    dt_comm_t *dp;                /* the replicas' group (dp = N > 1), or NULL */
    int64_t umax;                 /* the largest unit, in parameters */
    float *wbuf, *wbuf2, *wemb;   /* parameters: two units (one in use, one on its way);
                                   * a tied head's embedding */
    float *tbuf2;                 /* dp with parameters: the fetch's ring part */
    dt_comm_op_t *fetch;          /* the gather of unit fetch_u into fetch_dst, in flight */
    int fetch_u;
    float *fetch_dst;
    float *gbuf, *gemb;           /* a unit's gradient; a tied embedding's (whole backward) */
    float *tbuf;                  /* dp with sharding: a unit's ring part between levels */
};

/* Where a piece of code finds the weights: the weight at flat offset o is
 * p[o - base] (the whole array: base 0; a gathered unit: its start). */
typedef struct wsrc {
    const float *p;
    int64_t base;
} wsrc_t;

#define W(w, o) ((w).p + ((o) - (w).base))

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
                   m->dq, m->dk, m->dv, m->do_, m->da, m->db, m->dg, m->saved, m->xr,
                   m->wbuf, m->wbuf2, m->wemb, m->gbuf, m->gemb, m->tbuf, m->tbuf2 };
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

/* Let a unit's gather in flight (shard = parameters) move on between the
 * matrix products of the unit before it: MPI progresses it inside MPI
 * calls only (the ring attention's tests do too). */
static void poke(dt_model_t *m)
{
    if (m->fetch)
        (void)dt_comm_test(m->fetch);
}

/* Block l on x (c, d) in place, its activations into A. */
static int layer_fwd(dt_model_t *m, dt_comm_t *comm, const dt_attn_spec_t *attn, wsrc_t w, int l, acts_t *A, const int64_t *pos, float *x, dt_emsg_t *em)
{
    const dt_model_cfg_t *cf = &m->cfg;
    const dt_model_layer_off_t *L = &m->lo.layer[l];
    const int64_t c = m->c, d = cf->dim, D = dt_model_head_dim(cf), H = cf->heads,
                  Hkv = cf->kv_heads, qd = H * D, kd = Hkv * D, f = cf->ffn;
    int rc;

    memcpy(A->xin, x, (size_t)(c * d) * sizeof(float));
    dt_rmsnorm_fwd_cpu(c, cf->dim, cf->norm_eps, x, W(w, L->attn_norm), A->h1, A->rstd1);
    dt_linear_fwd_cpu(c, cf->dim, (int)qd, A->h1, W(w, L->wq), A->q);
    poke(m);
    dt_linear_fwd_cpu(c, cf->dim, (int)kd, A->h1, W(w, L->wk), A->k);
    poke(m);
    dt_linear_fwd_cpu(c, cf->dim, (int)kd, A->h1, W(w, L->wv), A->v);
    poke(m);
    dt_rope_fwd_cpu(c, (int)H, (int)D, pos, &cf->rope, A->q);
    dt_rope_fwd_cpu(c, (int)Hkv, (int)D, pos, &cf->rope, A->k);
    dt_attn_spec_t la;
    if ((rc = dt_attn_fwd(comm, dt_attn_layer_spec(attn, l, &la), A->q, A->k, A->v, A->o, A->lse,
                          NULL, em)) < 0)
        return rc;
    dt_linear_fwd_cpu(c, (int)qd, cf->dim, A->o, W(w, L->wo), m->dt);
    poke(m);
    add(x, m->dt, c * d);
    memcpy(A->x2, x, (size_t)(c * d) * sizeof(float));
    dt_rmsnorm_fwd_cpu(c, cf->dim, cf->norm_eps, x, W(w, L->mlp_norm), A->h2, A->rstd2);
    dt_linear_fwd_cpu(c, cf->dim, (int)f, A->h2, W(w, L->w1), A->a);
    poke(m);
    dt_linear_fwd_cpu(c, cf->dim, (int)f, A->h2, W(w, L->w3), A->b);
    poke(m);
    dt_swiglu_fwd_cpu(c, (int)f, A->a, A->b, A->g);
    dt_linear_fwd_cpu(c, (int)f, cf->dim, A->g, W(w, L->w2), m->dt);
    poke(m);
    add(x, m->dt, c * d);
    return 0;
}

/* Final norm and LM head of x (c, d) into m->logits (c, V); the norm's
 * gain from wn, the head's matrix from wh (the same source unless the
 * head is a tied embedding gathered apart). */
static void head_fwd(dt_model_t *m, wsrc_t wn, wsrc_t wh, const float *x)
{
    const dt_model_cfg_t *cf = &m->cfg;
    const int64_t c = m->c, d = cf->dim;

    memcpy(m->xf, x, (size_t)(c * d) * sizeof(float));
    dt_rmsnorm_fwd_cpu(c, cf->dim, cf->norm_eps, m->xf, W(wn, m->lo.final_norm), m->hf,
                       m->rstdf);
    dt_linear_fwd_cpu(c, cf->dim, cf->vocab, m->hf, W(wh, m->lo.lm_head), m->logits);
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
    return layer_fwd(m, comm, attn, (wsrc_t){ P, 0 }, l, &m->act[l % m->nact], pos, hidden, em);
}

int dt_model_head(dt_model_t *m, dt_comm_t *comm, const float *P, const float *hidden,
                  const int32_t *y, double *loss, dt_emsg_t *em)
{
    int rc;

    if ((rc = dt_tokens_check(m->c, m->cfg.vocab, y, 1, em)) < 0)
        return rc;
    head_fwd(m, (wsrc_t){ P, 0 }, (wsrc_t){ P, 0 }, hidden);
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

/* ---- sharded state ------------------------------------------------------- */

/* Unit u of the flat array (spec/model.h): units are what shard =
 * parameters gathers and shard = gradients reduces, one at a time. */
static void unit_range(const dt_model_t *m, int u, int64_t *a, int64_t *b)
{
    dt_model_unit_range(&m->cfg, &m->lo, u, a, b);
}

void dt_model_slice(int64_t n, int R, int r, int N, int i, int64_t *off, int64_t *len)
{
    int64_t S = (int64_t)R * N, s = (int64_t)r * N + i;

    *off = n * s / S;
    *len = n * (s + 1) / S - *off;
}

/* This rank's place: ring rank r of R, replica i of N, its slice. */
typedef struct place {
    int R, r, N, i;
    int64_t off, len;
} place_t;

static place_t place_of(const dt_model_t *m, dt_comm_t *comm)
{
    place_t pl = { .R = dt_comm_size(comm), .r = dt_comm_rank(comm), .N = 1, .i = 0 };

    if (m->dp) {
        pl.N = dt_comm_size(m->dp);
        pl.i = dt_comm_rank(m->dp);
    }
    dt_model_slice(m->lo.nparams, pl.R, pl.r, pl.N, pl.i, &pl.off, &pl.len);
    return pl;
}

/* [*ra, *rb): [a, b) within the ring slice r (what the replicas at ring
 * rank r hold between them). */
static void ring_part(const dt_model_t *m, const place_t *pl, int64_t a, int64_t b, int64_t *ra,
                      int64_t *rb)
{
    int64_t n = m->lo.nparams, s0 = n * pl->r / pl->R, s1 = n * (pl->r + 1) / pl->R;

    *ra = a > s0 ? a : s0;
    *rb = b < s1 ? b : s1;
    if (*rb < *ra)
        *rb = *ra;
}

/* The address of flat offset a in this rank's slice S (or S itself when
 * the slice holds none of [a, ...): nothing is read there then). */
static float *in_slice(float *S, const place_t *pl, int64_t a)
{
    return a > pl->off && a < pl->off + pl->len ? S + (a - pl->off) : S;
}

/* shard = parameters: unit [a, b) gathered into dst from every rank's
 * slice P; with dp, first across the replicas (the ring slice), then
 * around the ring. */
static int gather_unit(dt_model_t *m, dt_comm_t *comm, const place_t *pl, const float *P,
                       int64_t a, int64_t b, float *dst, float *tbuf, dt_comm_op_t **op,
                       dt_emsg_t *em)
{
    const int64_t n = m->lo.nparams;
    const float *mine = in_slice((float *)P, pl, a);
    int rc = 0;

    /* with dp the replicas' level at once into tbuf (the ring part), then
     * the ring's: at once, or left in flight in *op */
    if (m->dp) {
        int64_t ra, rb;
        ring_part(m, pl, a, b, &ra, &rb);
        dt_comm_slicing_t dsl = { n, pl->R * pl->N, pl->r * pl->N };
        if (rb > ra)
            rc = dt_comm_gather_range_f32(m->dp, &dsl, ra, rb, in_slice((float *)P, pl, ra),
                                          tbuf);
        mine = tbuf;
    }
    dt_comm_slicing_t rsl = { n, pl->R, 0 };
    if (rc == 0)
        rc = op ? dt_comm_gather_range_start(comm, &rsl, a, b, mine, dst, op)
                : dt_comm_gather_range_f32(comm, &rsl, a, b, mine, dst);
    return rc < 0 ? dt_emsg_set(em, rc, "gathering parameters [%lld, %lld) failed", (long long)a,
                                (long long)b)
                  : 0;
}

/* Unit [a, b)'s gradient g (b - a, this rank's addend) summed into this
 * rank's slice G: reduce-scattered around the ring, then (dp) divided by
 * the replicas as a batch divides its sequences' and reduce-scattered
 * across them. */
static int reduce_unit(dt_model_t *m, dt_comm_t *comm, const place_t *pl, float *g, int64_t a,
                       int64_t b, float *G, dt_emsg_t *em)
{
    const int64_t n = m->lo.nparams;
    dt_comm_slicing_t rsl = { n, pl->R, 0 };
    int rc;

    if (!m->dp) {
        rc = dt_comm_reduce_scatter_range_f32(comm, &rsl, a, b, g, in_slice(G, pl, a));
    } else {
        int64_t ra, rb;
        ring_part(m, pl, a, b, &ra, &rb);
        rc = dt_comm_reduce_scatter_range_f32(comm, &rsl, a, b, g, m->tbuf);
        for (int64_t k = 0; k < rb - ra; k++)
            m->tbuf[k] /= (float)pl->N;
        dt_comm_slicing_t dsl = { n, pl->R * pl->N, pl->r * pl->N };
        if (rc == 0 && rb > ra)
            rc = dt_comm_reduce_scatter_range_f32(m->dp, &dsl, ra, rb, m->tbuf,
                                                  in_slice(G, pl, ra));
    }
    return rc < 0 ? dt_emsg_set(em, rc, "reducing the gradient of [%lld, %lld) failed",
                                (long long)a, (long long)b)
                  : 0;
}

/* The weights of unit u for this step: the whole array's (not sharded),
 * or gathered into dst. */
static int unit_w(dt_model_t *m, dt_comm_t *comm, const place_t *pl, const float *P, int u,
                  float *dst, wsrc_t *w, dt_emsg_t *em)
{
    int64_t a, b;
    int rc;

    if (m->shard != DT_MODEL_SHARD_PARAMETERS) {
        *w = (wsrc_t){ P, 0 };
        return 0;
    }
    unit_range(m, u, &a, &b);
    if ((rc = gather_unit(m, comm, pl, P, a, b, dst, m->tbuf, NULL, em)) < 0)
        return rc;
    *w = (wsrc_t){ dst, a };
    return 0;
}

/* Where unit u's gradient goes during the backward: the whole array G
 * (not sharded), or buf zeroed (sharded: reduced by unit_g_done). The
 * gradient at flat offset o is at (*g)[o - *gbase]. */
static float *unit_g(dt_model_t *m, int u, float *G, float *buf, int64_t *gbase)
{
    int64_t a, b;

    if (m->shard == DT_MODEL_SHARD_NONE) {
        *gbase = 0;
        return G;
    }
    unit_range(m, u, &a, &b);
    memset(buf, 0, (size_t)(b - a) * sizeof(float));
    *gbase = a;
    return buf;
}

static int unit_g_done(dt_model_t *m, dt_comm_t *comm, const place_t *pl, int u, float *buf,
                       float *G, dt_emsg_t *em)
{
    int64_t a, b;

    if (m->shard == DT_MODEL_SHARD_NONE)
        return 0;
    unit_range(m, u, &a, &b);
    return reduce_unit(m, comm, pl, buf, a, b, G, em);
}

/* shard = parameters, overlapped: unit u's gather into dst started
 * (across the replicas at once, the ring's left in flight) while the unit
 * before it computes; fetch_end waits for it. Other modes: nothing, and
 * fetch_end gives the whole array. One fetch at a time. */
static int fetch_begin(dt_model_t *m, dt_comm_t *comm, const place_t *pl, const float *P,
                       int u, float *dst, dt_emsg_t *em)
{
    int64_t a, b;

    if (m->shard != DT_MODEL_SHARD_PARAMETERS)
        return 0;
    unit_range(m, u, &a, &b);
    m->fetch_u = u;
    m->fetch_dst = dst;
    return gather_unit(m, comm, pl, P, a, b, dst, m->tbuf2, &m->fetch, em);
}

static int fetch_end(dt_model_t *m, const float *P, int u, wsrc_t *w, dt_emsg_t *em)
{
    int64_t a, b;
    int rc;

    if (m->shard != DT_MODEL_SHARD_PARAMETERS) {
        *w = (wsrc_t){ P, 0 };
        return 0;
    }
    assert(m->fetch_u == u);
    rc = dt_comm_wait(m->fetch);
    m->fetch = NULL;
    unit_range(m, u, &a, &b);
    *w = (wsrc_t){ m->fetch_dst, a };
    return rc < 0 ? dt_emsg_set(em, rc, "gathering parameters [%lld, %lld) failed",
                                (long long)a, (long long)b)
                  : 0;
}

/* The other unit buffer than the one w reads. */
static float *other_buf(const dt_model_t *m, wsrc_t w)
{
    return w.p == m->wbuf ? m->wbuf2 : m->wbuf;
}

int64_t dt_model_gather_max(const dt_model_t *m)
{
    return m->umax;
}

int dt_model_gather(dt_model_t *m, dt_comm_t *comm, const float *P, int64_t a, int64_t b,
                    float *dst, dt_emsg_t *em)
{
    const place_t pl = place_of(m, comm);

    if (a < 0 || b < a || b > m->lo.nparams || b - a > m->umax)
        return dt_emsg_set(em, DT_EINVAL, "gathering [%lld, %lld): not a range of at most %lld "
                           "of the %lld parameters", (long long)a, (long long)b,
                           (long long)m->umax, (long long)m->lo.nparams);
    return gather_unit(m, comm, &pl, P, a, b, dst, m->tbuf, NULL, em);
}

dt_model_t *dt_model_new_train(const dt_model_cfg_t *cfg, int64_t c, int recompute, int shard,
                               dt_comm_t *dp)
{
    dt_model_t *m = model_train(cfg, c, recompute);
    int64_t emb = (int64_t)cfg->vocab * cfg->dim;

    m->shard = shard;
    m->dp = dp != NULL && dt_comm_size(dp) > 1 ? dp : NULL;
    m->umax = dt_model_unit_max(cfg);
    if (m->dp && shard == DT_MODEL_SHARD_NONE)
        m->tbuf = buf(m->umax); /* dt_model_gather's ring part */
    if (shard == DT_MODEL_SHARD_PARAMETERS) {
        m->wbuf = buf(m->umax);
        m->wbuf2 = buf(m->umax);
        if (m->dp)
            m->tbuf2 = buf(m->umax);
        if (cfg->tied)
            m->wemb = buf(emb);
    }
    if (shard != DT_MODEL_SHARD_NONE) {
        m->gbuf = buf(m->umax);
        if (cfg->tied)
            m->gemb = buf(emb);
        if (m->dp)
            m->tbuf = buf(m->umax); /* a ring part: at most a unit */
    }
    return m;
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
    const int L = cf->layers;
    const place_t pl = place_of(m, comm);
    wsrc_t w, wh;
    int rc;

    if (!m->backward)
        return dt_emsg_set(em, DT_EINVAL, "a forward-only model (dt_model_new_forward) "
                           "cannot take a step");
    if (G == NULL && m->shard != DT_MODEL_SHARD_NONE)
        return dt_emsg_set(em, DT_EINVAL, "a sharded model's step takes a gradient");
    if ((rc = check_attn(m, attn, em)) < 0)
        return rc;
    if ((rc = dt_tokens_check(c, cf->vocab, x, 0, em)) < 0 ||
        (rc = dt_tokens_check(c, cf->vocab, y, 1, em)) < 0)
        return rc;

    /* forward; sharded parameters arrive a unit ahead: unit u + 1's gather
     * runs while unit u computes */
    if ((rc = fetch_begin(m, comm, &pl, P, 0, m->wbuf, em)) < 0 ||
        (rc = fetch_end(m, P, 0, &w, em)) < 0 ||
        (rc = fetch_begin(m, comm, &pl, P, 1, m->wbuf2, em)) < 0)
        return rc;
    dt_embed_fwd_cpu(c, cf->vocab, cf->dim, x, W(w, lo->tok_emb), m->x);
    for (int l = 0; l < L; l++) {
        /* recompute: only the layer's input is kept, its activations are
         * made again in the backward */
        if (m->saved)
            memcpy(m->saved + l * c * d, m->x, (size_t)(c * d) * sizeof(float));
        if ((rc = fetch_end(m, P, 1 + l, &w, em)) < 0 ||
            (rc = fetch_begin(m, comm, &pl, P, 2 + l, other_buf(m, w), em)) < 0 ||
            (rc = layer_fwd(m, comm, attn, w, l, &m->act[l % m->nact], pos, m->x, em)) < 0)
            return rc;
    }
    /* the head: the final norm's unit, and a tied head's embedding apart */
    if ((rc = fetch_end(m, P, L + 1, &w, em)) < 0)
        return rc;
    wh = w;
    if (cf->tied && (rc = unit_w(m, comm, &pl, P, 0, m->wemb, &wh, em)) < 0)
        return rc;
    head_fwd(m, w, wh, m->x);

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

    /* backward: each unit's gradient into g (at offset o: g[o - gb]); a
     * sharded one is reduced into this rank's slice as soon as it is done.
     * A tied embedding's gradient (from the head and the embedding) is
     * reduced last. */
    int64_t gb, geb;
    float *g, *ge;
    if (m->shard == DT_MODEL_SHARD_NONE)
        memset(G, 0, (size_t)lo->nparams * sizeof(float));
    g = unit_g(m, L + 1, G, m->gbuf, &gb);
    ge = cf->tied ? unit_g(m, 0, G, m->gemb, &geb) : g;
    if (!cf->tied)
        geb = gb;
    dt_linear_bwd_cpu(c, cf->dim, cf->vocab, m->hf, W(wh, lo->lm_head), dlogits, m->dh,
                      ge + (lo->lm_head - geb));
    free(dlogits);
    dt_rmsnorm_bwd_cpu(c, cf->dim, m->xf, W(w, lo->final_norm), m->rstdf, m->dh, m->dx,
                       g + (lo->final_norm - gb));
    /* the last layer's weights again, on their way during the head's
     * gradient reduction; then each layer's while the one above it runs
     * its backward */
    if ((rc = fetch_begin(m, comm, &pl, P, L, other_buf(m, w), em)) < 0 ||
        (rc = unit_g_done(m, comm, &pl, L + 1, m->gbuf, G, em)) < 0)
        return rc;
    for (int l = L - 1; l >= 0; l--) {
        const dt_model_layer_off_t *Lo = &lo->layer[l];
        acts_t *A = &m->act[l % m->nact];
        if ((rc = fetch_end(m, P, 1 + l, &w, em)) < 0 ||
            (l > 0 && (rc = fetch_begin(m, comm, &pl, P, l, other_buf(m, w), em)) < 0))
            return rc;
        g = unit_g(m, 1 + l, G, m->gbuf, &gb);
#define GR(o) (g + ((o) - gb))
        /* the same forward on the same input, so the same activations to
         * the bit (the ring attention is deterministic), then its backward;
         * every rank recomputes layer l here, in the same order */
        if (m->saved) {
            memcpy(m->xr, m->saved + l * c * d, (size_t)(c * d) * sizeof(float));
            if ((rc = layer_fwd(m, comm, attn, w, l, A, pos, m->xr, em)) < 0)
                return rc;
        }
        /* MLP: x = x2 + W2 swiglu(W1 h2, W3 h2), h2 = norm(x2) */
        dt_linear_bwd_cpu(c, (int)f, cf->dim, A->g, W(w, Lo->w2), m->dx, m->dg, GR(Lo->w2));
        poke(m);
        dt_swiglu_bwd_cpu(c, (int)f, A->a, A->b, m->dg, m->da, m->db);
        dt_linear_bwd_cpu(c, cf->dim, (int)f, A->h2, W(w, Lo->w1), m->da, m->dh, GR(Lo->w1));
        poke(m);
        dt_linear_bwd_cpu(c, cf->dim, (int)f, A->h2, W(w, Lo->w3), m->db, m->dt, GR(Lo->w3));
        poke(m);
        add(m->dh, m->dt, c * d);
        dt_rmsnorm_bwd_cpu(c, cf->dim, A->x2, W(w, Lo->mlp_norm), A->rstd2, m->dh, m->dt,
                           GR(Lo->mlp_norm));
        add(m->dx, m->dt, c * d);
        /* attention: x2 = xin + Wo attn(rope(Wq h1), rope(Wk h1), Wv h1) */
        dt_linear_bwd_cpu(c, (int)qd, cf->dim, A->o, W(w, Lo->wo), m->dx, m->do_, GR(Lo->wo));
        poke(m);
        dt_attn_spec_t la;
        if ((rc = dt_attn_bwd(comm, dt_attn_layer_spec(attn, l, &la), A->q, A->k, A->v, A->o,
                              A->lse, m->do_, m->dq, m->dk, m->dv, NULL, em)) < 0)
            return rc;
        dt_rope_bwd_cpu(c, (int)H, (int)D, pos, &cf->rope, m->dq);
        dt_rope_bwd_cpu(c, (int)Hkv, (int)D, pos, &cf->rope, m->dk);
        dt_linear_bwd_cpu(c, cf->dim, (int)qd, A->h1, W(w, Lo->wq), m->dq, m->dh, GR(Lo->wq));
        poke(m);
        dt_linear_bwd_cpu(c, cf->dim, (int)kd, A->h1, W(w, Lo->wk), m->dk, m->dt, GR(Lo->wk));
        poke(m);
        add(m->dh, m->dt, c * d);
        dt_linear_bwd_cpu(c, cf->dim, (int)kd, A->h1, W(w, Lo->wv), m->dv, m->dt, GR(Lo->wv));
        poke(m);
        add(m->dh, m->dt, c * d);
        dt_rmsnorm_bwd_cpu(c, cf->dim, A->xin, W(w, Lo->attn_norm), A->rstd1, m->dh, m->dt,
                           GR(Lo->attn_norm));
#undef GR
        add(m->dx, m->dt, c * d);
        if ((rc = unit_g_done(m, comm, &pl, 1 + l, m->gbuf, G, em)) < 0)
            return rc;
    }
    if (!cf->tied)
        ge = unit_g(m, 0, G, m->gbuf, &geb);
    dt_embed_bwd_cpu(c, cf->vocab, cf->dim, x, m->dx, ge + (lo->tok_emb - geb));
    if ((rc = unit_g_done(m, comm, &pl, 0, cf->tied ? m->gemb : m->gbuf, G, em)) < 0)
        return rc;
    if (m->shard != DT_MODEL_SHARD_NONE)
        return 0;

    /* each rank saw its own tokens: sum the parameter gradients around the
     * ring, then (dp) across the replicas, each divided as a batch is */
    if ((rc = dt_comm_allreduce_sum_f32(comm, G, (size_t)lo->nparams)) < 0)
        return dt_emsg_set(em, rc, "gradient all-reduce failed");
    if (m->dp) {
        for (int64_t i = 0; i < lo->nparams; i++)
            G[i] /= (float)pl.N;
        if ((rc = dt_comm_allreduce_sum_f32(m->dp, G, (size_t)lo->nparams)) < 0)
            return dt_emsg_set(em, rc, "gradient all-reduce across the replicas failed");
    }
    return 0;
}
