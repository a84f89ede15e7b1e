/* SPDX-License-Identifier: MIT
 *
 * A model job's mask keys (mask_rules.h): their values parsed, and the
 * masks, targets and RoPE positions they make for one sequence.
 */
#include "config.h"

#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/mem.h"
#include "spec/mask_rules.h"

/* "K" at s: a whole number in [1, max], the whole of s */
static int whole(const char *s, int64_t max, int64_t *out)
{
    char *end;
    if (*s < '0' || *s > '9')
        return -1;
    long long v = strtoll(s, &end, 10);
    if (*end != '\0' || v < 1 || v > max)
        return -1;
    *out = v;
    return 0;
}

#define PART_MAX (INT64_C(1) << 40)

int dt_mask_parse_layers(const char *what, const char *v, int64_t *every, dt_emsg_t *em)
{
    if (strcmp(v, "all") == 0) {
        *every = 1;
        return 0;
    }
    if (strncmp(v, "every:", 6) == 0 && whole(v + 6, 1 << 20, every) == 0)
        return 0;
    return dt_emsg_set(em, DT_EINVAL, "%s '%s': expected all or every:K (K >= 1: layers 0, K, "
                       "2K, ... have the window)", what, v);
}

int dt_mask_parse_pattern(const char *what, const char *v, dt_mask_rules_t *r, dt_emsg_t *em)
{
    static const char *const names[] = { "local", "strided", "global" };
    int64_t *field[] = { &r->local, &r->stride, &r->global };
    char *copy = dt_xstrdup(v), *save = NULL;
    int rc = 0, n = 0;

    r->local = r->stride = r->global = 0;
    for (char *part = strtok_r(copy, ",", &save); part && rc == 0;
         part = strtok_r(NULL, ",", &save), n++) {
        char *colon = strchr(part, ':');
        int k = -1;
        if (colon != NULL) {
            *colon = '\0';
            for (int i = 0; i < 3; i++)
                if (strcmp(part, names[i]) == 0)
                    k = i;
        }
        int64_t x;
        if (k < 0)
            rc = dt_emsg_set(em, DT_EINVAL, "%s '%s': unknown part '%s' (parts: local:W, "
                             "strided:S, global:G, in blocks, joined by commas)", what, v,
                             part);
        else if (*field[k] != 0)
            rc = dt_emsg_set(em, DT_EINVAL, "%s '%s': %s given twice", what, v, names[k]);
        else if (whole(colon + 1, PART_MAX, &x) < 0)
            rc = dt_emsg_set(em, DT_EINVAL, "%s '%s': %s:%s: expected a whole number of "
                             "blocks >= 1", what, v, names[k], colon + 1);
        else
            *field[k] = x;
    }
    if (rc == 0 && n == 0)
        rc = dt_emsg_set(em, DT_EINVAL, "%s: empty (parts: local:W, strided:S, global:G)", what);
    free(copy);
    return rc;
}

bool dt_mask_rules_pattern(const dt_mask_rules_t *r)
{
    return r->block > 0 && (r->local > 0 || r->stride > 0 || r->global > 0);
}

bool dt_mask_rules_any(const dt_mask_rules_t *r)
{
    return r->docs || r->window > 0 || dt_mask_rules_pattern(r);
}

const char *dt_mask_rules_what(const dt_mask_rules_t *r)
{
    return r->docs ? "doc_mask = eot" : r->window > 0 ? "sliding_window"
           : dt_mask_rules_pattern(r)                ? "block_pattern"
                                                     : "";
}

bool dt_mask_rules_windowed(const dt_mask_rules_t *r, int64_t l)
{
    return r->window > 0 && (r->window_every <= 1 || l % r->window_every == 0);
}

bool dt_mask_rules_alternate(const dt_mask_rules_t *r, int64_t layers)
{
    return r->window > 0 && r->window_every > 1 && layers > 1;
}

void dt_mask_pattern_format(char *buf, size_t n, const dt_mask_rules_t *r)
{
    const int64_t v[] = { r->global, r->local, r->stride };
    static const char *const names[] = { "global", "local", "strided" };
    size_t o = 0;

    if (n > 0)
        buf[0] = '\0';
    for (int i = 0; i < 3; i++) {
        if (v[i] == 0)
            continue;
        int k = snprintf(buf + o, o < n ? n - o : 0, "%s%s:%" PRId64, o > 0 ? "," : "",
                         names[i], v[i]);
        o += (size_t)(k > 0 ? k : 0);
    }
    if (o == 0)
        snprintf(buf, n, "none");
}

void dt_mask_rules_format(char *buf, size_t n, const dt_mask_rules_t *r)
{
    size_t o = 0;
#define PUT(...)                                                                  \
    do {                                                                          \
        int k_ = snprintf(buf + o, o < n ? n - o : 0, "%s", o > 0 ? " " : "");    \
        o += (size_t)(k_ > 0 ? k_ : 0);                                           \
        k_ = snprintf(buf + o, o < n ? n - o : 0, __VA_ARGS__);                   \
        o += (size_t)(k_ > 0 ? k_ : 0);                                           \
    } while (0)

    if (n > 0)
        buf[0] = '\0';
    if (r->docs)
        PUT("doc_mask=eot eot_token=%" PRId64 " doc_positions=%s", r->eot,
            r->reset ? "reset" : "continue");
    if (r->window > 0) {
        PUT("sliding_window=%" PRId64, r->window);
        if (r->window_every > 1)
            PUT("sliding_window_layers=every:%" PRId64, r->window_every);
    }
    if (dt_mask_rules_pattern(r)) {
        char pat[96];
        dt_mask_pattern_format(pat, sizeof(pat), r);
        PUT("block_pattern=%s block_size=%" PRId64, pat, r->block);
    }
    if (o == 0)
        PUT("none");
#undef PUT
}

/* The smallest key block >= x that block row a of the pattern allows
 * (nb when none). */
static int64_t next_block(const dt_mask_rules_t *r, int64_t a, int64_t x, int64_t nb)
{
    int64_t best = nb;

    if (r->global && (a < r->global || x < r->global))
        return x; /* a global row takes every block; a global column is x itself */
    if (r->local) {
        int64_t lo = a - r->local + 1, hi = a + r->local - 1, b = x > lo ? x : lo;
        if (b <= hi && b < best)
            best = b;
    }
    if (r->stride) {
        int64_t d = ((a - x) % r->stride + r->stride) % r->stride; /* x + d == a mod S */
        if (x + d < best)
            best = x + d;
    }
    return best;
}

int dt_mask_rules_mask(const dt_mask_rules_t *r, int64_t T, bool causal, bool windowed,
                       dt_mask_t *m, dt_emsg_t *em)
{
    int rc = 0;

    dt_mask_init(m, T, causal);
    if (windowed && r->window > 0 && (rc = dt_mask_set_window(m, r->window, em)) < 0)
        return rc;
    if (!dt_mask_rules_pattern(r))
        return 0;
    if (T % r->block != 0)
        return dt_emsg_set(em, DT_EINVAL, "block_size %lld does not divide the sequence length "
                           "%lld", (long long)r->block, (long long)T);
    int64_t nb = T / r->block, cap = 1024, nnz = 0;
    int64_t *rowptr = dt_xmallocarray((size_t)(nb + 1), sizeof(*rowptr));
    int64_t *cols = dt_xmallocarray((size_t)cap, sizeof(*cols));
    for (int64_t a = 0; a < nb; a++) {
        int64_t end = causal ? a + 1 : nb; /* causal: no pair after the row's block */
        rowptr[a] = nnz;
        for (int64_t b = next_block(r, a, 0, nb); b < end; b = next_block(r, a, b + 1, nb)) {
            if (nnz == cap)
                cols = dt_xrealloc(cols, (size_t)(cap *= 2) * sizeof(*cols));
            cols[nnz++] = b;
        }
    }
    rowptr[nb] = nnz;
    rc = dt_mask_set_blocks_csr(m, r->block, 1, rowptr, nnz, cols, em);
    free(rowptr);
    free(cols);
    return rc;
}

void dt_mask_rules_docs(const dt_mask_rules_t *r, const int32_t *x, dt_mask_t *m)
{
    if (!r->docs)
        return;
    int64_t n = 0, T = m->T;
    int64_t *len = dt_xmallocarray((size_t)(T > 0 ? T : 1), sizeof(*len));
    for (int64_t p = 0, start = 0; p <= T; p++)
        if (p == T || (p > 0 && x[p] == r->eot)) {
            len[n++] = p - start;
            start = p;
        }
    /* lengths >= 1 summing to T: nothing to refuse */
    if (dt_mask_set_docs(m, len, n, NULL) < 0)
        abort();
    free(len);
}

void dt_mask_rules_targets(const dt_mask_rules_t *r, int32_t *y, int64_t n, int32_t ignore)
{
    if (!r->docs)
        return;
    for (int64_t i = 0; i < n; i++)
        if (y[i] == r->eot)
            y[i] = ignore;
}

void dt_mask_rules_rope(const dt_mask_rules_t *r, const dt_mask_t *m, const int64_t *pos,
                        int64_t c, int64_t pos_offset, int64_t *rope)
{
    for (int64_t i = 0; i < c; i++) {
        int64_t p = pos[i];
        if (r->docs && r->reset && m != NULL && m->ndoc > 1)
            p -= m->doc_start[dt_mask_doc(m, p)];
        rope[i] = r->reset ? p : p + pos_offset;
    }
}
