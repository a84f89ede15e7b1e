/* SPDX-License-Identifier: MIT
 *
 * Per-position likelihood files and their summary (io/nll.h). The shards
 * go through io/npy.h's atomic writer; merging reads each shard whole
 * (npy.h) and places its rows by position, refusing shards that overlap
 * or leave a hole.
 */
#include "config.h"

#include <errno.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "common/fileio.h"
#include "common/mem.h"
#include "io/nll.h"
#include "io/npy.h"

int dt_nll_bucket(int64_t pos)
{
    int b = 0;

    while (pos > 0 && b < DT_NLL_BUCKETS - 1)
        pos >>= 1, b++;
    return b;
}

void dt_nll_add(dt_nll_sums_t *s, int64_t pos, double nll)
{
    if (isnan(nll))
        return;
    int b = dt_nll_bucket(pos);
    s->sum[b] += nll;
    s->count[b] += 1;
}

static int64_t bucket_from(int b)
{
    return b == 0 ? 0 : INT64_C(1) << (b - 1);
}

static void totals(const dt_nll_sums_t *s, double *sum, double *n)
{
    *sum = 0, *n = 0;
    for (int b = 0; b < DT_NLL_BUCKETS; b++)
        *sum += s->sum[b], *n += s->count[b];
}

json_t *dt_nll_summary(const dt_nll_sums_t *s, int64_t tokens, int64_t pos_offset)
{
    json_t *bs = json_array();
    double sum, n;

    for (int b = 0; b < DT_NLL_BUCKETS; b++) {
        if (s->count[b] == 0)
            continue;
        double m = s->sum[b] / s->count[b];
        json_array_append_new(bs, json_pack("{s:I, s:I, s:I, s:f, s:f}", "from",
                                            (json_int_t)bucket_from(b), "to",
                                            (json_int_t)(INT64_C(1) << b), "targets",
                                            (json_int_t)s->count[b], "nll", m, "ppl", exp(m)));
    }
    totals(s, &sum, &n);
    /* JSON has no NaN: a window without targets has null NLL and ppl */
    json_t *m = n > 0 ? json_real(sum / n) : json_null();
    json_t *p = n > 0 ? json_real(exp(sum / n)) : json_null();
    return json_pack("{s:I, s:I, s:I, s:o, s:o, s:o}", "tokens", (json_int_t)tokens,
                     "pos_offset", (json_int_t)pos_offset, "targets", (json_int_t)n, "nll", m,
                     "ppl", p, "buckets", bs);
}

void dt_nll_print(FILE *f, const dt_nll_sums_t *s, int64_t tokens, int64_t pos_offset)
{
    double sum, n;

    totals(s, &sum, &n);
    if (n == 0) {
        fprintf(f, "perplexity: no targets at positions %lld..%lld\n", (long long)pos_offset,
                (long long)(pos_offset + tokens - 1));
        return;
    }
    fprintf(f, "perplexity: %.0f targets at positions %lld..%lld: mean nll %.6f, ppl %.4f\n",
            n, (long long)pos_offset, (long long)(pos_offset + tokens - 1), sum / n,
            exp(sum / n));
    fprintf(f, "  %-27s %12s %12s %12s\n", "positions", "targets", "mean nll", "ppl");
    for (int b = 0; b < DT_NLL_BUCKETS; b++) {
        char range[64];
        if (s->count[b] == 0)
            continue;
        snprintf(range, sizeof(range), "[%lld, %lld)", (long long)bucket_from(b),
                 (long long)(INT64_C(1) << b));
        double m = s->sum[b] / s->count[b];
        fprintf(f, "  %-27s %12.0f %12.6f %12.4f\n", range, s->count[b], m, exp(m));
    }
}

int dt_nll_write_shard(const char *dir, int rank, int64_t c, const float *nll,
                       const int64_t *pos, dt_emsg_t *em)
{
    char *a = dt_xasprintf("%s/nll.%d.npy", dir, rank);
    char *b = dt_xasprintf("%s/nll_pos.%d.npy", dir, rank);
    int rc = dt_npy_save(a, DT_F32, 1, &c, nll, em);

    if (rc == 0)
        rc = dt_npy_save(b, DT_I64, 1, &c, pos, em);
    free(b);
    free(a);
    return rc;
}

int dt_nll_write_summary(const char *dir, const dt_nll_sums_t *s, int64_t tokens,
                         int64_t pos_offset, dt_emsg_t *em)
{
    json_t *j = dt_nll_summary(s, tokens, pos_offset);
    char *text = json_dumps(j, JSON_INDENT(2) | JSON_PRESERVE_ORDER);
    char *path = dt_xasprintf("%s/perplexity.json", dir);
    size_t len = strlen(text);
    int rc;

    text = dt_xrealloc(text, len + 2);
    memcpy(text + len, "\n", 2);
    rc = dt_file_write_atomic(path, text, len + 1, 0600, 0, em);
    free(path);
    free(text);
    json_decref(j);
    return rc;
}

/* Shard k of dir read whole: *c rows of NLL and positions (the caller's). */
static int read_shard(const char *dir, int k, float **nll, int64_t **pos, int64_t *c,
                      dt_emsg_t *em)
{
    char *a = dt_xasprintf("%s/nll.%d.npy", dir, k);
    char *b = dt_xasprintf("%s/nll_pos.%d.npy", dir, k);
    dt_npy_info_t ia, ib;
    int rc;

    *nll = NULL, *pos = NULL;
    if ((rc = dt_npy_read_header(a, &ia, em)) < 0 || (rc = dt_npy_read_header(b, &ib, em)) < 0)
        goto out;
    if (ia.dtype != DT_F32 || ia.ndim != 1 || ib.dtype != DT_I64 || ib.ndim != 1 ||
        ia.count != ib.count) {
        rc = dt_emsg_set(em, DT_EFORMAT, "%s and %s: want float32 (c) and int64 (c) of one "
                         "length c", a, b);
        goto out;
    }
    *c = ia.count;
    *nll = dt_xmallocarray((size_t)(*c > 0 ? *c : 1), sizeof(float));
    *pos = dt_xmallocarray((size_t)(*c > 0 ? *c : 1), sizeof(int64_t));
    if ((rc = dt_npy_read_f32(a, &ia, 0, *c, *nll, em)) == 0)
        rc = dt_npy_read_i64(b, &ib, *pos, em);
out:
    if (rc < 0) {
        free(*nll), free(*pos);
        *nll = NULL, *pos = NULL;
    }
    free(b);
    free(a);
    return rc;
}

int dt_nll_merge(const char *dir, const char *out, dt_nll_sums_t *s, int64_t *first,
                 int64_t *n, dt_emsg_t *em)
{
    float **nll = NULL;
    int64_t **pos = NULL, *cs = NULL, total = 0, lo = INT64_MAX, hi = INT64_MIN;
    float *seq = NULL;
    unsigned char *seen = NULL;
    int K = 0, rc = 0;

    for (;; K++) {
        struct stat st;
        char *a = dt_xasprintf("%s/nll.%d.npy", dir, K);
        int there = stat(a, &st) == 0;
        free(a);
        if (!there)
            break;
        nll = dt_xrealloc(nll, (size_t)(K + 1) * sizeof(*nll));
        pos = dt_xrealloc(pos, (size_t)(K + 1) * sizeof(*pos));
        cs = dt_xrealloc(cs, (size_t)(K + 1) * sizeof(*cs));
        if ((rc = read_shard(dir, K, &nll[K], &pos[K], &cs[K], em)) < 0)
            goto out;
        total += cs[K];
        for (int64_t i = 0; i < cs[K]; i++) {
            lo = pos[K][i] < lo ? pos[K][i] : lo;
            hi = pos[K][i] > hi ? pos[K][i] : hi;
        }
    }
    if (K == 0) {
        rc = dt_emsg_set(em, DT_ENOENT, "%s: no nll.0.npy (dtengine prefill --out-dir writes "
                         "one per rank)", dir);
        goto out;
    }
    if (total == 0 || lo < 0 || hi - lo + 1 != total) {
        rc = dt_emsg_set(em, DT_EFORMAT, "%s: %d shards hold %lld rows at positions %lld.."
                         "%lld: not one window", dir, K, (long long)total, (long long)lo,
                         (long long)hi);
        goto out;
    }
    seq = dt_xmallocarray((size_t)total, sizeof(float));
    seen = dt_xcalloc((size_t)total, 1);
    for (int k = 0; k < K; k++)
        for (int64_t i = 0; i < cs[k]; i++) {
            int64_t t = pos[k][i] - lo;
            if (seen[t]) {
                rc = dt_emsg_set(em, DT_EFORMAT, "%s/nll_pos.%d.npy: position %lld is in "
                                 "another shard too", dir, k, (long long)pos[k][i]);
                goto out;
            }
            seen[t] = 1;
            seq[t] = nll[k][i];
            if (s)
                dt_nll_add(s, pos[k][i], nll[k][i]);
        }
    *first = lo;
    *n = total;
    if (out)
        rc = dt_npy_save(out, DT_F32, 1, &total, seq, em);
out:
    for (int k = 0; k < K; k++)
        if (nll && pos)
            free(nll[k]), free(pos[k]);
    free(nll);
    free(pos);
    free(cs);
    free(seq);
    free(seen);
    return rc;
}
