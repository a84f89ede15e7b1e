/* SPDX-License-Identifier: MIT
 *
 * Attention specs without the compute: validation, branch-list parsing,
 * branches and head chunks, and the FLOP count. Shared by the engine and
 * the planner (which links neither BLAS nor MPI).
 */
#include "config.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "spec/attn_spec.h"
#include "spec/mask.h"

/* ---- spec ------------------------------------------------------------ */

static int parse_list(const char *s, int64_t *out, int max, const char *what, dt_emsg_t *em)
{
    int n = 0;
    const char *p = s;

    if (*p == '\0')
        return dt_emsg_set(em, DT_EINVAL, "%s: empty list", what);
    while (*p) {
        char *end;
        if (n == max)
            return dt_emsg_set(em, DT_EINVAL, "%s: more than %d values", what, max);
        errno = 0;
        long long v = *p >= '0' && *p <= '9' ? strtoll(p, &end, 10) : (end = (char *)p, 0);
        if (end == p || (*end != ',' && *end != '\0') || v <= 0)
            return dt_emsg_set(em, DT_EINVAL, "%s: '%s' is not a list of positive integers",
                               what, s);
        if (errno == ERANGE || v > ((int64_t)1 << 50))
            return dt_emsg_set(em, DT_ERANGE, "%s: value in '%s' is larger than 2^50", what, s);
        out[n++] = v;
        p = *end == ',' ? end + 1 : end;
        if (*end == ',' && *p == '\0')
            return dt_emsg_set(em, DT_EINVAL, "%s: trailing comma in '%s'", what, s);
    }
    return n;
}

int dt_attn_parse_branches(dt_attn_spec_t *s, const char *segs, const char *dils, dt_emsg_t *em)
{
    int64_t w[DT_ATTN_MAXBRANCH], r[DT_ATTN_MAXBRANCH];
    int nw, nr;

    if ((segs == NULL) != (dils == NULL))
        return dt_emsg_set(em, DT_EINVAL, "--segments and --dilations must be given together");
    if (segs == NULL) {
        s->nbranch = 0;
        return 0;
    }
    if ((nw = parse_list(segs, w, DT_ATTN_MAXBRANCH, "--segments", em)) < 0)
        return nw;
    if ((nr = parse_list(dils, r, DT_ATTN_MAXBRANCH, "--dilations", em)) < 0)
        return nr;
    if (nw != nr)
        return dt_emsg_set(em, DT_EINVAL,
                           "--segments has %d values but --dilations has %d: one dilation per "
                           "segment",
                           nw, nr);
    s->nbranch = nw;
    memcpy(s->seg, w, sizeof(w[0]) * (size_t)nw);
    memcpy(s->dil, r, sizeof(r[0]) * (size_t)nw);
    return 0;
}

int dt_attn_check(const dt_attn_spec_t *s, int R, dt_emsg_t *em)
{
    int rc;

    if (s->T <= 0 || s->H <= 0 || s->Hkv <= 0 || s->D <= 0)
        return dt_emsg_set(em, DT_ESHAPE, "T=%lld H=%d Hkv=%d D=%d: every size must be positive",
                           (long long)s->T, s->H, s->Hkv, s->D);
    if (s->H % s->Hkv != 0)
        return dt_emsg_set(em, DT_ESHAPE,
                           "kv heads Hkv=%d must divide query heads H=%d (grouped-query attention)",
                           s->Hkv, s->H);
    if ((rc = dt_layout_check(s->layout, s->T, R, em)) < 0)
        return rc;
    if (s->nbranch < 0 || s->nbranch > DT_ATTN_MAXBRANCH)
        return dt_emsg_set(em, DT_EINVAL, "%d dilated branches: at most %d", s->nbranch,
                           DT_ATTN_MAXBRANCH);
    if (s->mask) {
        if (s->mask->T != s->T || s->mask->causal != s->causal)
            return dt_emsg_set(em, DT_EINVAL, "the mask is of %lld positions, %s, the attention "
                               "of %lld, %s", (long long)s->mask->T,
                               s->mask->causal ? "causal" : "not causal", (long long)s->T,
                               s->causal ? "causal" : "not causal");
        if ((rc = dt_mask_check_heads(s->mask, s->H, em)) < 0)
            return rc;
    }
    for (int b = 0; b < s->nbranch; b++) {
        if (s->seg[b] <= 0 || s->dil[b] <= 0)
            return dt_emsg_set(em, DT_EINVAL, "branch %d: segment %lld and dilation %lld must be "
                               "positive", b + 1, (long long)s->seg[b], (long long)s->dil[b]);
        if (s->seg[b] % s->dil[b] != 0)
            return dt_emsg_set(em, DT_EINVAL,
                               "branch %d: segment length w=%lld is not a multiple of its "
                               "dilation r=%lld",
                               b + 1, (long long)s->seg[b], (long long)s->dil[b]);
    }
    return 0;
}

/* ---- branches and head chunks ------------------------------------------ */

dt_attn_branch_t dt_attn_branch(const dt_attn_spec_t *s, int b)
{
    dt_attn_branch_t br;
    br.w = b < 0 ? s->T : s->seg[b];
    br.r = b < 0 ? 1 : s->dil[b];
    br.hc = (int)((s->H + br.r - 1) / br.r);
    int64_t n = (s->H + br.hc - 1) / br.hc;
    br.nchunk = (int)(n < br.r ? n : br.r);
    return br;
}

dt_attn_chunk_t dt_attn_chunk(const dt_attn_spec_t *s, const dt_attn_branch_t *br, int k)
{
    int g = s->H / s->Hkv;
    dt_attn_chunk_t c;
    c.hlo = k * br->hc;
    int hhi = c.hlo + br->hc < s->H ? c.hlo + br->hc : s->H;
    c.nh = hhi - c.hlo;
    c.kvlo = c.hlo / g;
    c.nkv = (hhi - 1) / g - c.kvlo + 1;
    return c;
}

/* ---- flops --------------------------------------------------------------- */

/* visible (query, key) pairs among n sparsified positions */
static double pairs(int64_t n, int causal)
{
    double m = (double)n;
    return causal ? m * (m + 1) / 2 : m * m;
}

double dt_attn_flops(const dt_attn_spec_t *s)
{
    double total = 0;
    int nb = s->nbranch == 0 ? 1 : s->nbranch;

    if (s->nbranch == 0 && s->mask && !dt_mask_is_plain(s->mask)) {
        int nh = s->mask->block > 0 ? s->mask->nhead : 1;
        for (int h = 0; h < nh; h++)
            total += dt_mask_pairs(s->mask, h, 0, s->T, 0, s->T) * 4.0 * s->D * (s->H / nh);
        return total;
    }

    for (int b = 0; b < nb; b++) {
        dt_attn_branch_t br = dt_attn_branch(s, s->nbranch == 0 ? -1 : b);
        int64_t full = s->T / br.w, rest = s->T % br.w;
        for (int k = 0; k < br.nchunk; k++) {
            dt_attn_chunk_t ck = dt_attn_chunk(s, &br, k);
            int64_t nfull = br.w / br.r; /* w is a multiple of r */
            int64_t nrest = rest > k ? (rest - k + br.r - 1) / br.r : 0;
            double p = (double)full * pairs(nfull, s->causal) + pairs(nrest, s->causal);
            total += p * 4.0 * s->D * ck.nh;
        }
    }
    return total;
}

const dt_attn_spec_t *dt_attn_layer_spec(const dt_attn_spec_t *s, int64_t l,
                                         dt_attn_spec_t *tmp)
{
    if (s->mask_every <= 1)
        return s;
    *tmp = *s;
    tmp->mask = l % s->mask_every == 0 ? s->mask : s->mask_rest;
    return tmp;
}

int64_t dt_attn_cudnn_rows(int64_t n, int64_t nk, int h, int d, size_t esz, int bwd, int det)
{
    const int64_t kpad = (nk + 127) / 128 * 128;
    int64_t rows = (int64_t)(DT_CUDNN_ROW_CHUNK_BYTES / ((size_t)h * (size_t)d * esz));

    if (bwd && det) {
        int64_t r = (int64_t)(DT_CUDNN_DET_CHUNK_BYTES / ((size_t)h * (size_t)kpad * 2));
        if (r < DT_CUDNN_DET_MIN_ROWS && r < n)
            return 0;
        rows = r < rows ? r : rows;
    }
    rows = rows / 128 * 128;
    if (rows < 128)
        rows = 128;
    return rows < n ? rows : n;
}

double dt_attn_cudnn_bytes(int64_t n, int h, int hkv, int d, size_t esz, int bwd, int det)
{
    const double H = h, Hk = hkv, D = d, E = (double)esz, N = (double)n;
    const double kpad = (double)((n + 127) / 128 * 128);
    const double R = (double)dt_attn_cudnn_rows(n, n, h, d, esz, bwd, det);

    if (bwd && R == 0) /* the backward on dt's kernels: the forward's */
        return dt_attn_cudnn_bytes(n, h, hkv, d, esz, 0, det);
    if (!bwd) /* a chunk's o (dtype) and stats */
        return R * H * D * E + R * H * 4 + 256;
    /* a chunk's packed lse and dq (dtype), the keys' dk and dv (dtype),
     * cuDNN's Dsum and its scores (deterministic) or fp32 dQ accumulator;
     * and the copy of the forward's o in dtype (the ring's dq may be o) */
    double cud = det ? R * H * kpad * 2 : R * H * D * 4;
    return R * H * 4 + R * H * D * E + 2 * N * Hk * D * E + R * H * 4 + cud + N * H * D * E;
}
