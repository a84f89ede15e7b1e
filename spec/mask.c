/* SPDX-License-Identifier: MIT
 *
 * Attention masks (mask.h): the definition, the box test the ring and the
 * kernels skip work by, and the exact pair count the planner prices.
 */
#include "config.h"

#include <stdlib.h>
#include <string.h>

#include "common/mem.h"
#include "spec/mask.h"

void dt_mask_init(dt_mask_t *m, int64_t T, bool causal)
{
    memset(m, 0, sizeof(*m));
    m->T = T;
    m->causal = causal;
}

void dt_mask_close(dt_mask_t *m)
{
    if (m == NULL)
        return;
    free(m->doc_start);
    free(m->rowptr);
    free(m->cols);
    memset(m, 0, sizeof(*m));
}

static int64_t *dup64(const int64_t *p, int64_t n)
{
    if (p == NULL)
        return NULL;
    int64_t *q = dt_xmallocarray((size_t)(n > 0 ? n : 1), sizeof(*q));
    memcpy(q, p, (size_t)n * sizeof(*q));
    return q;
}

void dt_mask_copy(dt_mask_t *dst, const dt_mask_t *src)
{
    *dst = *src;
    dst->doc_start = dup64(src->doc_start, src->ndoc);
    if (src->rowptr) {
        int64_t nr = (int64_t)src->nhead * (src->nb + 1);
        dst->rowptr = dup64(src->rowptr, nr);
        dst->cols = dup64(src->cols, src->rowptr[nr - 1]);
    }
}

bool dt_mask_is_plain(const dt_mask_t *m)
{
    return m->ndoc <= 1 && m->window == 0 && m->block == 0;
}

int dt_mask_set_docs(dt_mask_t *m, const int64_t *len, int64_t n, dt_emsg_t *em)
{
    if (n < 1)
        return dt_emsg_set(em, DT_EINVAL, "document lengths: none given");
    int64_t sum = 0;
    for (int64_t d = 0; d < n; d++) {
        if (len[d] < 1)
            return dt_emsg_set(em, DT_EINVAL, "document lengths: document %lld has length %lld "
                               "(each must be at least 1)", (long long)d, (long long)len[d]);
        if (len[d] > m->T || sum > m->T - len[d])
            return dt_emsg_set(em, DT_EINVAL, "document lengths: they sum to more than the "
                               "sequence length %lld (at document %lld)", (long long)m->T,
                               (long long)d);
        sum += len[d];
    }
    if (sum != m->T)
        return dt_emsg_set(em, DT_EINVAL, "document lengths: %lld documents sum to %lld, not to "
                           "the sequence length %lld", (long long)n, (long long)sum,
                           (long long)m->T);
    free(m->doc_start);
    m->doc_start = dt_xmallocarray((size_t)n, sizeof(*m->doc_start));
    m->ndoc = n;
    for (int64_t d = 0, s = 0; d < n; s += len[d++])
        m->doc_start[d] = s;
    return 0;
}

int dt_mask_set_window(dt_mask_t *m, int64_t W, dt_emsg_t *em)
{
    if (W < 1)
        return dt_emsg_set(em, DT_EINVAL, "sliding window %lld: must be at least 1",
                           (long long)W);
    m->window = W;
    return 0;
}

static int check_block(const dt_mask_t *m, int64_t B, int nhead, dt_emsg_t *em)
{
    if (B < 1)
        return dt_emsg_set(em, DT_EINVAL, "mask block %lld: must be at least 1", (long long)B);
    if (m->T % B != 0)
        return dt_emsg_set(em, DT_EINVAL, "mask block %lld does not divide the sequence length "
                           "%lld", (long long)B, (long long)m->T);
    if (nhead < 1)
        return dt_emsg_set(em, DT_EINVAL, "block mask: %d heads", nhead);
    return 0;
}

int dt_mask_set_blocks_dense(dt_mask_t *m, int64_t B, int nhead, const uint8_t *dense,
                             dt_emsg_t *em)
{
    int rc = check_block(m, B, nhead, em);
    if (rc < 0)
        return rc;
    int64_t nb = m->T / B, nnz = 0, nr = (int64_t)nhead * (nb + 1);
    for (int64_t e = 0; e < (int64_t)nhead * nb * nb; e++) {
        if (dense[e] > 1)
            return dt_emsg_set(em, DT_EINVAL, "block mask: element %lld is %u (0 or 1 expected)",
                               (long long)e, dense[e]);
        nnz += dense[e];
    }
    int64_t *rowptr = dt_xmallocarray((size_t)nr, sizeof(*rowptr));
    int64_t *cols = dt_xmallocarray((size_t)(nnz > 0 ? nnz : 1), sizeof(*cols));
    int64_t k = 0;
    for (int h = 0; h < nhead; h++)
        for (int64_t a = 0; a <= nb; a++) {
            rowptr[(int64_t)h * (nb + 1) + a] = k;
            if (a == nb)
                break;
            for (int64_t b = 0; b < nb; b++)
                if (dense[((int64_t)h * nb + a) * nb + b])
                    cols[k++] = b;
        }
    free(m->rowptr);
    free(m->cols);
    m->block = B;
    m->nb = nb;
    m->nhead = nhead;
    m->rowptr = rowptr;
    m->cols = cols;
    return 0;
}

int dt_mask_set_blocks_csr(dt_mask_t *m, int64_t B, int nhead, const int64_t *rowptr,
                           int64_t nnz, const int64_t *cols, dt_emsg_t *em)
{
    int rc = check_block(m, B, nhead, em);
    if (rc < 0)
        return rc;
    int64_t nb = m->T / B;
    for (int h = 0; h < nhead; h++) {
        const int64_t *rp = rowptr + (int64_t)h * (nb + 1);
        if (rp[0] < 0 || rp[nb] > nnz)
            return dt_emsg_set(em, DT_EINVAL, "block mask rows: head %d's row pointers run from "
                               "%lld to %lld, outside the %lld column indices", h,
                               (long long)rp[0], (long long)rp[nb], (long long)nnz);
        for (int64_t a = 0; a < nb; a++) {
            if (rp[a + 1] < rp[a])
                return dt_emsg_set(em, DT_EINVAL, "block mask rows: head %d row %lld: pointer "
                                   "%lld after %lld (they must not decrease)", h, (long long)a,
                                   (long long)rp[a + 1], (long long)rp[a]);
            for (int64_t e = rp[a]; e < rp[a + 1]; e++) {
                if (cols[e] < 0 || cols[e] >= nb)
                    return dt_emsg_set(em, DT_EINVAL, "block mask columns: index %lld is "
                                       "%lld, outside [0, %lld)", (long long)e,
                                       (long long)cols[e], (long long)nb);
                if (e > rp[a] && cols[e] <= cols[e - 1])
                    return dt_emsg_set(em, DT_EINVAL, "block mask columns: head %d row %lld is "
                                       "not strictly ascending at index %lld", h, (long long)a,
                                       (long long)e);
            }
        }
    }
    free(m->rowptr);
    free(m->cols);
    m->block = B;
    m->nb = nb;
    m->nhead = nhead;
    m->rowptr = dup64(rowptr, (int64_t)nhead * (nb + 1));
    m->cols = dup64(cols, nnz);
    return 0;
}

void dt_mask_take_blocks(dt_mask_t *dst, dt_mask_t *src)
{
    free(dst->rowptr);
    free(dst->cols);
    dst->block = src->block;
    dst->nb = src->nb;
    dst->nhead = src->nhead;
    dst->rowptr = src->rowptr;
    dst->cols = src->cols;
    src->rowptr = src->cols = NULL;
    dt_mask_close(src);
}

int dt_mask_check_heads(const dt_mask_t *m, int H, dt_emsg_t *em)
{
    if (m->block > 0 && m->nhead != 1 && m->nhead != H)
        return dt_emsg_set(em, DT_EINVAL, "block mask: %d heads, but the attention has %d "
                           "query heads (give 1 pattern or %d)", m->nhead, H, H);
    return 0;
}

int64_t dt_mask_doc(const dt_mask_t *m, int64_t p)
{
    if (m->ndoc <= 1)
        return 0;
    int64_t l = 0, h = m->ndoc; /* last start <= p */
    while (h - l > 1) {
        int64_t mid = l + (h - l) / 2;
        if (m->doc_start[mid] <= p)
            l = mid;
        else
            h = mid;
    }
    return l;
}

static int64_t doc_end(const dt_mask_t *m, int64_t d)
{
    return d + 1 < m->ndoc ? m->doc_start[d + 1] : m->T;
}

void dt_mask_row(const dt_mask_t *m, int64_t i, int64_t *lo, int64_t *hi)
{
    int64_t a = 0, b = m->T;
    if (m->ndoc > 1) {
        int64_t d = dt_mask_doc(m, i);
        a = m->doc_start[d];
        b = doc_end(m, d);
    }
    if (m->causal && i + 1 < b)
        b = i + 1;
    if (m->window > 0) {
        if (i - m->window + 1 > a)
            a = i - m->window + 1;
        if (!m->causal && i + m->window < b)
            b = i + m->window;
    }
    *lo = a;
    *hi = b;
}

/* head h's row a of blocks: [*c0, *c1) in cols */
static void block_row(const dt_mask_t *m, int h, int64_t a, const int64_t **c0,
                      const int64_t **c1)
{
    const int64_t *rp = m->rowptr + (int64_t)(m->nhead == 1 ? 0 : h) * (m->nb + 1);
    *c0 = m->cols + rp[a];
    *c1 = m->cols + rp[a + 1];
}

/* first element of [p, e) that is >= x */
static const int64_t *lower(const int64_t *p, const int64_t *e, int64_t x)
{
    while (p < e) {
        const int64_t *mid = p + (e - p) / 2;
        if (*mid < x)
            p = mid + 1;
        else
            e = mid;
    }
    return p;
}

static bool block_allows(const dt_mask_t *m, int h, int64_t a, int64_t b)
{
    const int64_t *c0, *c1;
    block_row(m, h, a, &c0, &c1);
    const int64_t *p = lower(c0, c1, b);
    return p < c1 && *p == b;
}

bool dt_mask_allows(const dt_mask_t *m, int h, int64_t i, int64_t j)
{
    int64_t lo, hi;
    dt_mask_row(m, i, &lo, &hi);
    if (j < lo || j >= hi)
        return false;
    return m->block == 0 || block_allows(m, h, i / m->block, j / m->block);
}

/* the box's interval part (causal, documents, window): exact, because
 * lo(i) and hi(i) never decrease */
static enum dt_mask_box span_box(const dt_mask_t *m, int64_t qlo, int64_t qhi, int64_t klo,
                                 int64_t khi)
{
    int64_t lo, hi;
    /* the first query whose interval reaches past klo */
    int64_t l = qlo, h = qhi + 1;
    while (l < h) {
        int64_t mid = l + (h - l) / 2;
        dt_mask_row(m, mid, &lo, &hi);
        if (hi > klo)
            h = mid;
        else
            l = mid + 1;
    }
    if (l > qhi)
        return DT_MASK_EMPTY;
    dt_mask_row(m, l, &lo, &hi);
    if (lo > khi)
        return DT_MASK_EMPTY;
    int64_t lo_last, hi_first;
    dt_mask_row(m, qhi, &lo_last, &hi);
    dt_mask_row(m, qlo, &lo, &hi_first);
    return lo_last <= klo && hi_first > khi ? DT_MASK_FULL : DT_MASK_PARTIAL;
}

enum dt_mask_box dt_mask_box(const dt_mask_t *m, int h, int64_t qlo, int64_t qhi, int64_t klo,
                             int64_t khi)
{
    enum dt_mask_box sb = span_box(m, qlo, qhi, klo, khi);
    if (sb == DT_MASK_EMPTY || m->block == 0)
        return sb;
    int64_t blo = klo / m->block, bhi = khi / m->block, any = 0, all = 1;
    for (int64_t a = qlo / m->block; a <= qhi / m->block; a++) {
        const int64_t *c0, *c1;
        block_row(m, h, a, &c0, &c1);
        int64_t n = lower(c0, c1, bhi + 1) - lower(c0, c1, blo);
        any |= n > 0;
        all &= n == bhi - blo + 1;
    }
    if (!any)
        return DT_MASK_EMPTY;
    return all && sb == DT_MASK_FULL ? DT_MASK_FULL : DT_MASK_PARTIAL;
}

/* sum over integers i in [a, b) of max(0, min(C1, i + c1) - max(C2, i + c2)) */
static double sum_clip(int64_t a, int64_t b, int64_t C1, int64_t c1, int64_t C2, int64_t c2)
{
    double s = 0;
    /* breakpoints: where i + c1 crosses C1 and i + c2 crosses C2 */
    int64_t cut[4] = { a, b, b, b };
    int n = 1;
    int64_t x1 = C1 - c1, x2 = C2 - c2;
    if (x1 > a && x1 < b)
        cut[n++] = x1;
    if (x2 > a && x2 < b)
        cut[n++] = x2;
    cut[n++] = b;
    /* sort the few cuts */
    for (int i = 1; i < n; i++)
        for (int j = i; j > 0 && cut[j] < cut[j - 1]; j--) {
            int64_t t = cut[j];
            cut[j] = cut[j - 1];
            cut[j - 1] = t;
        }
    for (int p = 0; p + 1 < n; p++) {
        int64_t u = cut[p], v = cut[p + 1];
        if (u >= v)
            continue;
        /* on [u, v) each min and max picks one side: f(i) = A + B i */
        int lo_is_i = u + c2 >= C2; /* the max is i + c2 over the piece */
        int hi_is_i = u + c1 < C1;  /* the min is i + c1 */
        int64_t A = (hi_is_i ? c1 : C1) - (lo_is_i ? c2 : C2);
        int B = hi_is_i - lo_is_i;
        /* the positive part of A + B i over [u, v) */
        if (B == 0) {
            if (A > 0)
                s += (double)A * (double)(v - u);
            continue;
        }
        int64_t pu = u, pv = v;
        if (B > 0) { /* positive for i > -A */
            if (-A + 1 > pu)
                pu = -A + 1;
        } else if (A < pv) { /* positive for i < A */
            pv = A;
        }
        if (pu >= pv)
            continue;
        double cnt = (double)(pv - pu);
        s += (double)A * cnt + (double)B * ((double)pu + (double)(pv - 1)) * cnt / 2.0;
    }
    return s;
}

/* interval-part pairs with i in [qlo, qhi), j in [klo, khi) */
static double span_pairs(const dt_mask_t *m, int64_t qlo, int64_t qhi, int64_t klo, int64_t khi)
{
    const int64_t INF = INT64_MAX / 4;
    double s = 0;
    int64_t d0 = dt_mask_doc(m, qlo), d1 = qhi > qlo ? dt_mask_doc(m, qhi - 1) : d0;
    for (int64_t d = d0; d <= d1 && qlo < qhi; d++) {
        int64_t ds = m->ndoc > 1 ? m->doc_start[d] : 0, de = m->ndoc > 1 ? doc_end(m, d) : m->T;
        int64_t a = qlo > ds ? qlo : ds, b = qhi < de ? qhi : de;
        if (a >= b)
            continue;
        /* keys j in [max(ds, klo, i + c2), min(de, khi, i + c1)) */
        int64_t C1 = de < khi ? de : khi, C2 = ds > klo ? ds : klo;
        int64_t c1 = m->causal ? 1 : (m->window > 0 ? m->window : INF);
        int64_t c2 = m->window > 0 ? 1 - m->window : -INF;
        s += sum_clip(a, b, C1, c1, C2, c2);
    }
    return s;
}

double dt_mask_pairs(const dt_mask_t *m, int h, int64_t qlo, int64_t qhi, int64_t klo,
                     int64_t khi)
{
    if (qlo >= qhi || klo >= khi)
        return 0;
    if (m->block == 0)
        return span_pairs(m, qlo, qhi, klo, khi);
    double s = 0;
    int64_t B = m->block;
    for (int64_t a = qlo / B; a * B < qhi; a++) {
        const int64_t *c0, *c1;
        block_row(m, h, a, &c0, &c1);
        int64_t i0 = a * B > qlo ? a * B : qlo, i1 = (a + 1) * B < qhi ? (a + 1) * B : qhi;
        for (const int64_t *c = lower(c0, c1, klo / B); c < c1 && *c * B < khi; c++) {
            int64_t j0 = *c * B > klo ? *c * B : klo, j1 = (*c + 1) * B < khi ? (*c + 1) * B : khi;
            s += span_pairs(m, i0, i1, j0, j1);
        }
    }
    return s;
}
