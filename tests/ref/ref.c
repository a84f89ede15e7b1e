/* SPDX-License-Identifier: MIT
 *
 * Naive reference attention (see ref.h). For each (query position i, query
 * head h) it lists the keys i sees, as a multiset of positions, computes the
 * softmax over their scores in double, and from that the output row and,
 * for the backward, the gradient contributions. The list of keys is the
 * whole definition of dense versus dilated attention; everything after it
 * is the same plain softmax. Not fast and not meant to be: no tiling, no
 * online softmax, no BLAS, nothing shared with the code under test.
 */
#include "config.h"

#include <assert.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>

#include "common/mem.h"
#include "engine/data/gen.h"
#include "tests/ref/ref.h"

/* The problem, as passed to ref_attn_fwd / ref_attn_bwd. */
struct prob {
    int64_t T;
    int H, Hkv, D;
    const float *q; /* (T, H, D) */
    const float *k; /* (T, Hkv, D) */
    const float *v; /* (T, Hkv, D) */
    int causal;
    double scale;
    int nbranch;
    const int64_t *seg;
    const int64_t *dil;
    const ref_mask_t *mask;
    int64_t *doc; /* (T) each position's document, when the mask has them */
};

/* Scratch for one (i, h): its keys and their probabilities, O(T) each. */
struct row {
    int64_t cap;
    int64_t n;
    int64_t *key; /* (n) key positions, repeated when two branches share one */
    double *p;    /* (n) softmax probabilities */
};

static struct prob prob_make(int64_t T, int H, int Hkv, int D, const float *q, const float *k,
                             const float *v, int causal, float scale, int nbranch,
                             const int64_t *seg, const int64_t *dil, const ref_mask_t *mask)
{
    struct prob p = {
        .T = T,
        .H = H,
        .Hkv = Hkv,
        .D = D,
        .q = q,
        .k = k,
        .v = v,
        .causal = causal,
        .nbranch = nbranch,
        .seg = seg,
        .dil = dil,
        .mask = mask,
    };

    assert(T > 0 && H > 0 && Hkv > 0 && D > 0 && H % Hkv == 0);
    assert(nbranch >= 0);
    for (int b = 0; b < nbranch; b++)
        assert(seg[b] > 0 && dil[b] > 0);
    /* the default is rounded to float, as a float spec field would hold it */
    if (scale == 0.0f)
        scale = (float)(1.0 / sqrt((double)D));
    p.scale = scale;
    if (mask != NULL && mask->ndoc > 0) {
        int64_t i = 0;
        p.doc = dt_xmallocarray((size_t)T, sizeof(*p.doc));
        for (int64_t d = 0; d < mask->ndoc; d++)
            for (int64_t n = 0; n < mask->doc_len[d]; n++) {
                assert(i < T);
                p.doc[i++] = d;
            }
        assert(i == T);
    }
    return p;
}

/* the mask's parts (ref_mask_t), pair by pair */
static int masked_out(const struct prob *p, int h, int64_t i, int64_t j)
{
    const ref_mask_t *m = p->mask;
    if (m == NULL)
        return 0;
    if (m->ndoc > 0 && p->doc[i] != p->doc[j])
        return 1;
    if (m->window > 0 && (i - j >= m->window || (!p->causal && j - i >= m->window)))
        return 1;
    if (m->block > 0) {
        int64_t nb = p->T / m->block, hh = m->nhead > 1 ? h : 0;
        if (!m->blocks[(hh * nb + i / m->block) * nb + j / m->block])
            return 1;
    }
    return 0;
}

static void row_init(struct row *r, const struct prob *p)
{
    /* each branch contributes at most one key per position */
    r->cap = p->T * (p->nbranch > 0 ? p->nbranch : 1);
    r->n = 0;
    r->key = dt_xmallocarray((size_t)r->cap, sizeof(*r->key));
    r->p = dt_xmallocarray((size_t)r->cap, sizeof(*r->p));
}

static void row_close(struct row *r)
{
    free(r->key);
    free(r->p);
}

static const float *q_at(const struct prob *p, int64_t i, int h)
{
    return p->q + (i * p->H + h) * p->D;
}

static const float *kv_at(const struct prob *p, const float *x, int64_t j, int g)
{
    return x + (j * p->Hkv + g) * p->D;
}

static double dot(const float *a, const float *b, int D)
{
    double s = 0.0;
    for (int d = 0; d < D; d++)
        s += (double)a[d] * (double)b[d];
    return s;
}

/* The keys of (i, h), the whole of the masking rules:
 *   dense: every j (causal: j <= i);
 *   dilated, per branch (w, r): segment [s, end) with s = (i / w) w and
 *   end = min(s + w, T); heads in chunks of hc = ceil(H / r), h in chunk
 *   kc = h / hc; (i, h) is covered iff (i - s) mod r == kc, and then sees
 *   every j in [s, end) with (j - s) mod r == kc (causal: j <= i). */
static void row_keys(const struct prob *p, int64_t i, int h, struct row *r)
{
    r->n = 0;
    if (p->nbranch == 0) {
        for (int64_t j = 0; j < p->T; j++)
            if ((!p->causal || j <= i) && !masked_out(p, h, i, j))
                r->key[r->n++] = j;
        return;
    }
    for (int b = 0; b < p->nbranch; b++) {
        int64_t w = p->seg[b], dl = p->dil[b];
        int64_t s = (i / w) * w;
        int64_t end = s + w < p->T ? s + w : p->T;
        int64_t hc = (p->H + dl - 1) / dl;
        int64_t kc = h / hc;

        if ((i - s) % dl != kc)
            continue;
        for (int64_t j = s; j < end; j++)
            if ((j - s) % dl == kc && (!p->causal || j <= i) && !masked_out(p, h, i, j))
                r->key[r->n++] = j;
    }
    assert(r->n <= r->cap);
}

/* Fill r with the keys of (i, h) and their probabilities; return the lse
 * (natural log of the sum of exp(score)), -inf when there is no key. */
static double row_softmax(const struct prob *p, int64_t i, int h, struct row *r)
{
    const float *qi = q_at(p, i, h);
    int g = h / (p->H / p->Hkv);
    double m = -INFINITY, sum = 0.0;

    row_keys(p, i, h, r);
    if (r->n == 0)
        return -INFINITY;
    for (int64_t t = 0; t < r->n; t++) {
        r->p[t] = p->scale * dot(qi, kv_at(p, p->k, r->key[t], g), p->D);
        if (r->p[t] > m)
            m = r->p[t];
    }
    for (int64_t t = 0; t < r->n; t++) {
        r->p[t] = exp(r->p[t] - m);
        sum += r->p[t];
    }
    for (int64_t t = 0; t < r->n; t++)
        r->p[t] /= sum;
    return m + log(sum);
}

void ref_attn_fwd(int64_t T, int H, int Hkv, int D, const float *q, const float *k, const float *v,
                  int causal, float scale, int nbranch, const int64_t *seg, const int64_t *dil,
                  float *o, float *lse)
{
    ref_attn_fwd_masked(T, H, Hkv, D, q, k, v, causal, scale, nbranch, seg, dil, NULL, o, lse);
}

void ref_attn_fwd_masked(int64_t T, int H, int Hkv, int D, const float *q, const float *k,
                         const float *v, int causal, float scale, int nbranch,
                         const int64_t *seg, const int64_t *dil, const ref_mask_t *mask,
                         float *o, float *lse)
{
    struct prob p = prob_make(T, H, Hkv, D, q, k, v, causal, scale, nbranch, seg, dil, mask);
    struct row r;
    double *acc = dt_xmallocarray((size_t)D, sizeof(*acc));

    row_init(&r, &p);
    for (int64_t i = 0; i < T; i++) {
        for (int h = 0; h < H; h++) {
            int g = h / (H / Hkv);
            double l = row_softmax(&p, i, h, &r);
            float *oi = o + (i * H + h) * D;

            for (int d = 0; d < D; d++)
                acc[d] = 0.0;
            for (int64_t t = 0; t < r.n; t++) {
                const float *vj = kv_at(&p, v, r.key[t], g);
                for (int d = 0; d < D; d++)
                    acc[d] += r.p[t] * vj[d];
            }
            for (int d = 0; d < D; d++)
                oi[d] = (float)acc[d];
            if (lse != NULL)
                lse[(int64_t)h * T + i] = (float)l;
        }
    }
    row_close(&r);
    free(p.doc);
    free(acc);
}

/* With P the probabilities of (i, h) over its keys, dP_j = dout_i . v_j and
 * dS_j = P_j (dP_j - sum_t P_t dP_t):
 *   dq_i += scale sum_j dS_j k_j,  dk_j += scale dS_j q_i,  dv_j += P_j dout_i.
 * A key listed twice gets both contributions, which is the gradient of the
 * multiset softmax. */
void ref_attn_bwd(int64_t T, int H, int Hkv, int D, const float *q, const float *k, const float *v,
                  int causal, float scale, int nbranch, const int64_t *seg, const int64_t *dil,
                  const float *dout, float *dq, float *dk, float *dv)
{
    ref_attn_bwd_masked(T, H, Hkv, D, q, k, v, causal, scale, nbranch, seg, dil, NULL, dout, dq,
                        dk, dv);
}

void ref_attn_bwd_masked(int64_t T, int H, int Hkv, int D, const float *q, const float *k,
                         const float *v, int causal, float scale, int nbranch,
                         const int64_t *seg, const int64_t *dil, const ref_mask_t *mask,
                         const float *dout, float *dq, float *dk, float *dv)
{
    struct prob p = prob_make(T, H, Hkv, D, q, k, v, causal, scale, nbranch, seg, dil, mask);
    size_t nkv = (size_t)T * (size_t)Hkv * (size_t)D;
    double *dka = dt_xcalloc(nkv, sizeof(*dka)); /* (T, Hkv, D) */
    double *dva = dt_xcalloc(nkv, sizeof(*dva)); /* (T, Hkv, D) */
    double *dqa = dt_xmallocarray((size_t)D, sizeof(*dqa));
    struct row r;
    double *dp;

    row_init(&r, &p);
    dp = dt_xmallocarray((size_t)r.cap, sizeof(*dp));
    for (int64_t i = 0; i < T; i++) {
        for (int h = 0; h < H; h++) {
            int g = h / (H / Hkv);
            const float *qi = q_at(&p, i, h);
            const float *doi = dout + (i * H + h) * D;
            double delta = 0.0;

            (void)row_softmax(&p, i, h, &r);
            for (int64_t t = 0; t < r.n; t++) {
                dp[t] = dot(doi, kv_at(&p, v, r.key[t], g), D);
                delta += r.p[t] * dp[t];
            }
            for (int d = 0; d < D; d++)
                dqa[d] = 0.0;
            for (int64_t t = 0; t < r.n; t++) {
                int64_t off = (r.key[t] * Hkv + g) * D;
                const float *kj = k + off;
                double ds = r.p[t] * (dp[t] - delta);

                for (int d = 0; d < D; d++) {
                    dqa[d] += p.scale * ds * kj[d];
                    dka[off + d] += p.scale * ds * qi[d];
                    dva[off + d] += r.p[t] * doi[d];
                }
            }
            for (int d = 0; d < D; d++)
                dq[(i * H + h) * D + d] = (float)dqa[d];
        }
    }
    for (size_t x = 0; x < nkv; x++) {
        dk[x] = (float)dka[x];
        dv[x] = (float)dva[x];
    }
    free(dp);
    row_close(&r);
    free(p.doc);
    free(dqa);
    free(dva);
    free(dka);
}

void ref_fill(uint64_t seed, uint64_t stream, int64_t n, float *dst)
{
    dt_gen_normal(seed, stream, 0, n, dst);
}

/* ---- comparison ------------------------------------------------------- */

static double tol_of(float b, float atol, float rtol)
{
    return (double)atol + (double)rtol * fabs((double)b);
}

static bool is_good(float a, float b, float atol, float rtol)
{
    if (isnan(a) || isnan(b))
        return false;
    if (a == b) /* also the same infinity */
        return true;
    if (isinf(a) || isinf(b))
        return false;
    return fabs((double)a - (double)b) <= tol_of(b, atol, rtol);
}

/* |a - b| with the conventions of ref.h: 0 when equal, NaN, or +inf. */
static double abs_diff(float a, float b)
{
    if (isnan(a) || isnan(b))
        return NAN;
    if (a == b)
        return 0.0;
    if (isinf(a) || isinf(b))
        return INFINITY;
    return fabs((double)a - (double)b);
}

double ref_max_abs_err(const float *a, const float *b, int64_t n, float atol, float rtol,
                       int64_t *nbad, int64_t *first_bad)
{
    double worst = 0.0;
    bool saw_nan = false;
    int64_t bad = 0, first = -1;

    for (int64_t x = 0; x < n; x++) {
        double e = abs_diff(a[x], b[x]);

        if (isnan(e))
            saw_nan = true;
        else if (e > worst)
            worst = e;
        if (!is_good(a[x], b[x], atol, rtol)) {
            if (bad == 0)
                first = x;
            bad++;
        }
    }
    if (nbad != NULL)
        *nbad = bad;
    if (first_bad != NULL)
        *first_bad = first;
    return saw_nan ? NAN : worst;
}

double ref_max_rel_err(const float *a, const float *b, int64_t n)
{
    double worst = 0.0;
    bool saw_nan = false;

    for (int64_t x = 0; x < n; x++) {
        double e = abs_diff(a[x], b[x]);

        if (isnan(e)) {
            saw_nan = true;
            continue;
        }
        if (e == 0.0)
            continue;
        e = b[x] == 0.0f ? INFINITY : e / fabs((double)b[x]);
        if (e > worst)
            worst = e;
    }
    return saw_nan ? NAN : worst;
}

int64_t ref_print_mismatches(const char *label, const float *a, const float *b, int64_t n,
                             float atol, float rtol)
{
    int64_t bad = 0;

    for (int64_t x = 0; x < n; x++) {
        if (is_good(a[x], b[x], atol, rtol))
            continue;
        if (bad < REF_SHOWN)
            fprintf(stderr, "%s[%lld]: got %.9g want %.9g (|diff| %.3e > tol %.3e)\n", label,
                    (long long)x, (double)a[x], (double)b[x], abs_diff(a[x], b[x]),
                    tol_of(b[x], atol, rtol));
        bad++;
    }
    if (bad > REF_SHOWN)
        fprintf(stderr, "%s: ... and %lld more\n", label, (long long)(bad - REF_SHOWN));
    return bad;
}

bool ref_allclose(const char *label, const float *a, const float *b, int64_t n, float atol,
                  float rtol)
{
    int64_t bad = 0;
    double e = ref_max_abs_err(a, b, n, atol, rtol, &bad, NULL);

    if (bad == 0)
        return true;
    fprintf(stderr, "%s: max_abs_err=%.3e bad=%lld of %lld (atol %.1e rtol %.1e)\n", label, e,
            (long long)bad, (long long)n, (double)atol, (double)rtol);
    ref_print_mismatches(label, a, b, n, atol, rtol);
    return false;
}
