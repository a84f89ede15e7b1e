/* SPDX-License-Identifier: MIT
 *
 * The generated associative-recall task (see recall.h).
 */
#include "config.h"

#include <errno.h>
#include <inttypes.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "common/fileio.h"
#include "common/mem.h"
#include "engine/data/recall.h"
#include "spec/spec.h"
#include "engine/data/gen.h"

/*-- generated associative recall -------------------------------------------*/

enum { D_FILLER = 0, D_KEYS, D_VALUES, D_QUERIES };

void dt_recall_opts_default(dt_recall_opts_t *o)
{
    memset(o, 0, sizeof(*o));
    o->T = 1024;
    /* the job-spec keys' defaults (dt-spec(5)): the key table's */
    const dt_spec_t none = { 0 };
    o->n_keys = (int)dt_spec_int(&none, "recall_keys");
    o->n_values = (int)dt_spec_int(&none, "recall_values");
    o->n_filler = 252;
    o->n_pairs = (int)dt_spec_int(&none, "recall_pairs");
    o->n_queries = (int)dt_spec_int(&none, "recall_queries");
    o->all_targets = 0;
    o->seed = 1;
}

int64_t dt_recall_vocab(const dt_recall_opts_t *o)
{
    return DT_RECALL_NSPECIAL + (int64_t)o->n_keys + o->n_values + o->n_filler;
}

int dt_recall_check(const dt_recall_opts_t *o, dt_emsg_t *em)
{
    int64_t L = o->T + 1, plant;

    if (o->T < 1 || o->T > INT32_MAX - 1)
        return dt_emsg_set(em, DT_EINVAL, "recall: T = %" PRId64 " (1 to %d)", o->T, INT32_MAX - 1);
    if (o->n_keys < 1 || o->n_values < 1 || o->n_filler < 1)
        return dt_emsg_set(em, DT_EINVAL,
                           "recall: n_keys %d, n_values %d, n_filler %d: each must be >= 1",
                           o->n_keys, o->n_values, o->n_filler);
    if (dt_recall_vocab(o) > INT32_MAX)
        return dt_emsg_set(em, DT_EINVAL, "recall: vocabulary of %" PRId64 " tokens is too large",
                           dt_recall_vocab(o));
    if (o->n_pairs < 1 || o->n_pairs > o->n_keys)
        return dt_emsg_set(em, DT_EINVAL,
                           "recall: n_pairs %d must be in [1, n_keys %d] (keys are distinct)",
                           o->n_pairs, o->n_keys);
    if (o->n_queries < 1 || o->n_queries > o->n_pairs)
        return dt_emsg_set(em, DT_EINVAL, "recall: n_queries %d must be in [1, n_pairs %d]",
                           o->n_queries, o->n_pairs);
    plant = 1 + 3 * (int64_t)o->n_pairs;
    if (10 * plant > L)
        return dt_emsg_set(em, DT_EINVAL,
                           "recall: %d pairs take %" PRId64
                           " tokens, more than 10%% (%" PRId64 ") of a %" PRId64
                           "-token sequence",
                           o->n_pairs, plant, L / 10, L);
    if (plant + 4 * (int64_t)o->n_queries > L)
        return dt_emsg_set(em, DT_EINVAL,
                           "recall: %d pairs and %d queries take %" PRId64
                           " tokens, more than the %" PRId64 " of a sequence",
                           o->n_pairs, o->n_queries, plant + 4 * (int64_t)o->n_queries, L);
    return 0;
}

int64_t dt_recall_pairs_start(const dt_recall_opts_t *o)
{
    return (4 * (o->T + 1)) / 10;
}

int64_t dt_recall_answer_pos(const dt_recall_opts_t *o, int q)
{
    return o->T - 4 * (int64_t)o->n_queries + 4 * (int64_t)q + 3;
}

/* floor(u * n) for one draw, in [0, n). */
static int draw(const dt_recall_opts_t *o, uint64_t index, int d, uint64_t counter, int n)
{
    int v = (int)(dt_gen_uniform(o->seed, 4 * index + (uint64_t)d, counter) * n);
    return v < n ? v : n - 1;
}

int dt_recall_make(const dt_recall_opts_t *o, uint64_t index, int32_t *tok, dt_emsg_t *em)
{
    const int K = o->n_keys, P = o->n_pairs, Q = o->n_queries;
    const int32_t key0 = DT_RECALL_NSPECIAL, val0 = key0 + K, fill0 = val0 + o->n_values;
    int64_t L = o->T + 1, plant, qs;
    int *keys, *vals, *pick;
    int rc;

    if ((rc = dt_recall_check(o, em)) < 0)
        return rc;
    plant = 1 + 3 * (int64_t)P;
    qs = L - 4 * (int64_t)Q;

    /* P distinct keys: the first P of a partial Fisher-Yates over K. */
    keys = dt_xmallocarray((size_t)K, sizeof(*keys));
    for (int i = 0; i < K; i++)
        keys[i] = i;
    for (int i = 0; i < P; i++) {
        int j = i + draw(o, index, D_KEYS, (uint64_t)i, K - i), t = keys[i];
        keys[i] = keys[j];
        keys[j] = t;
    }
    vals = dt_xmallocarray((size_t)P, sizeof(*vals));
    for (int i = 0; i < P; i++)
        vals[i] = draw(o, index, D_VALUES, (uint64_t)i, o->n_values);
    /* Q distinct pairs to ask about, in random order. */
    pick = dt_xmallocarray((size_t)P, sizeof(*pick));
    for (int i = 0; i < P; i++)
        pick[i] = i;
    for (int i = 0; i < Q; i++) {
        int j = i + draw(o, index, D_QUERIES, (uint64_t)i, P - i), t = pick[i];
        pick[i] = pick[j];
        pick[j] = t;
    }

    /* BOS, filler, the pairs from 40% of the sequence on, filler, queries */
    int64_t p0 = dt_recall_pairs_start(o);
    tok[0] = DT_RECALL_BOS;
    for (int64_t i = 1; i < qs; i++)
        tok[i] = fill0 + draw(o, index, D_FILLER, (uint64_t)i, o->n_filler);
    for (int p = 0; p < P; p++) {
        tok[p0 + 3 * p] = key0 + keys[p];
        tok[p0 + 1 + 3 * p] = val0 + vals[p];
        tok[p0 + 2 + 3 * p] = DT_RECALL_SEP;
    }
    (void)plant;
    for (int q = 0; q < Q; q++) {
        int64_t a = qs + 4 * (int64_t)q;
        tok[a] = DT_RECALL_QUERY;
        tok[a + 1] = key0 + keys[pick[q]];
        tok[a + 2] = DT_RECALL_ANSWER;
        tok[a + 3] = val0 + vals[pick[q]];
    }
    free(pick);
    free(vals);
    free(keys);
    return 0;
}

int dt_recall_xy(const dt_recall_opts_t *o, uint64_t index, int32_t *x, int32_t *y, dt_emsg_t *em)
{
    int32_t *tok;
    int rc;

    if ((rc = dt_recall_check(o, em)) < 0)
        return rc;
    tok = dt_xmallocarray((size_t)o->T + 1, sizeof(*tok));
    if ((rc = dt_recall_make(o, index, tok, em)) == 0) {
        memcpy(x, tok, (size_t)o->T * sizeof(*x));
        if (o->all_targets) {
            memcpy(y, tok + 1, (size_t)o->T * sizeof(*y));
        } else {
            for (int64_t i = 0; i < o->T; i++)
                y[i] = -1;
            for (int q = 0; q < o->n_queries; q++) {
                int64_t a = dt_recall_answer_pos(o, q);
                y[a] = tok[a + 1];
            }
        }
    }
    free(tok);
    return rc;
}

double dt_recall_score(const dt_recall_opts_t *o, int64_t B, const int32_t *y, const int32_t *pred,
                       int64_t *correct)
{
    int64_t n = 0;

    for (int64_t b = 0; b < B; b++)
        for (int q = 0; q < o->n_queries; q++) {
            int64_t i = b * o->T + dt_recall_answer_pos(o, q);
            n += pred[i] == y[i];
        }
    if (correct)
        *correct = n;
    return B > 0 ? (double)n / (double)(B * o->n_queries) : 0.0;
}
