/* SPDX-License-Identifier: MIT
 *
 * The loader (see loader.h). Its order is recomputed from (seed, epoch,
 * shard) whenever the cursor enters a new epoch or shard, so the cursor
 * alone says where it stands.
 */
#include "config.h"

#include <errno.h>
#include <glob.h>
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
#include "engine/data/loader.h"
#include "engine/data/gen.h"

/*-- loader -------------------------------------------------------------------*/

typedef struct {
    char *path;
    int64_t ntok;
    int64_t nseq;
} shard_info_t;

struct dt_loader {
    dt_loader_opts_t o;
    int nshards;
    shard_info_t *shards; /* sorted by path */
    int64_t ntok, nseq;
    dt_loader_cursor_t cur;

    /* Derived from the cursor, rebuilt when it moves to another epoch or
     * shard: the epoch's shard order, the current shard's sequence order
     * (NULL without shuffle) and its open file. */
    bool have_order;
    uint64_t order_epoch;
    int *order;
    int64_t perm_shard; /* position in order the perm and file are for, -1: none */
    int64_t *perm;
    dt_tok_shard_t *file;
    int32_t *buf; /* T + 1 tokens */
};

#define SHARD_STREAM 0xffffffffULL

/* In-place Fisher-Yates over a[0..n) driven by (seed, stream). */
static void shuffle_i64(int64_t *a, int64_t n, uint64_t seed, uint64_t stream)
{
    for (int64_t i = n - 1; i > 0; i--) {
        int64_t j = (int64_t)(dt_gen_uniform(seed, stream, (uint64_t)i) * (double)(i + 1));
        int64_t t;
        if (j > i) /* u < 1, but (double)(i + 1) may round up */
            j = i;
        t = a[i];
        a[i] = a[j];
        a[j] = t;
    }
}

static void build_order(dt_loader_t *l, uint64_t epoch)
{
    if (l->have_order && l->order_epoch == epoch)
        return;
    for (int i = 0; i < l->nshards; i++)
        l->order[i] = i;
    if (l->o.shuffle) {
        int64_t *tmp = dt_xmallocarray((size_t)l->nshards, sizeof(*tmp));
        for (int i = 0; i < l->nshards; i++)
            tmp[i] = i;
        shuffle_i64(tmp, l->nshards, l->o.seed, epoch << 32 | SHARD_STREAM);
        for (int i = 0; i < l->nshards; i++)
            l->order[i] = (int)tmp[i];
        free(tmp);
    }
    l->have_order = true;
    l->order_epoch = epoch;
    l->perm_shard = -1;
}

/* Make order, perm and file match the cursor. */
static int load_cursor(dt_loader_t *l, dt_emsg_t *em)
{
    const shard_info_t *sh;
    dt_tok_shard_t *f;
    int idx, rc;

    build_order(l, l->cur.epoch);
    if (l->perm_shard == l->cur.shard)
        return 0;
    idx = l->order[l->cur.shard];
    sh = &l->shards[idx];
    if ((rc = dt_tok_shard_new(sh->path, &f, em)) < 0)
        return rc;
    if (dt_tok_shard_ntok(f) != sh->ntok) {
        rc = dt_emsg_set(em, DT_EFORMAT,
                         "%s: has %" PRId64 " tokens now but had %" PRId64
                         " when the loader was made (the shard changed)",
                         sh->path, dt_tok_shard_ntok(f), sh->ntok);
        dt_tok_shard_free(f);
        return rc;
    }
    dt_tok_shard_free(l->file);
    l->file = f;
    free(l->perm);
    l->perm = NULL;
    if (l->o.shuffle) {
        l->perm = dt_xmallocarray((size_t)sh->nseq, sizeof(*l->perm));
        for (int64_t i = 0; i < sh->nseq; i++)
            l->perm[i] = i;
        shuffle_i64(l->perm, sh->nseq, l->o.seed, l->cur.epoch << 32 | (uint64_t)idx);
    }
    l->perm_shard = l->cur.shard;
    return 0;
}

static int cmp_str(const void *a, const void *b)
{
    return strcmp(*(char *const *)a, *(char *const *)b);
}

int dt_loader_new(const char *const *paths, int npaths, const dt_loader_opts_t *o,
                  dt_loader_t **out, dt_emsg_t *em)
{
    dt_loader_t *l;
    char **sorted;
    int rc = 0;

    *out = NULL;
    if (o->T < 1 || o->T > INT32_MAX - 1)
        return dt_emsg_set(em, DT_EINVAL, "loader: T = %" PRId64 " (1 to %d)", o->T, INT32_MAX - 1);
    if (o->dp_size < 0 || o->dp_rank < 0 || o->dp_rank >= (o->dp_size ? o->dp_size : 1))
        return dt_emsg_set(em, DT_EINVAL, "loader: dp_rank %d is not in [0, dp_size %d)",
                           o->dp_rank, o->dp_size);
    if (o->vocab < 0)
        return dt_emsg_set(em, DT_EINVAL, "loader: vocab %" PRId64 " is negative", o->vocab);
    if (npaths < 1)
        return dt_emsg_set(em, DT_EINVAL, "loader: no shards given");

    l = dt_xcalloc(1, sizeof(*l));
    l->o = *o;
    if (l->o.dp_size == 0)
        l->o.dp_size = 1;
    l->nshards = npaths;
    l->shards = dt_xcalloc((size_t)npaths, sizeof(*l->shards));
    l->order = dt_xmallocarray((size_t)npaths, sizeof(*l->order));
    l->perm_shard = -1;
    l->buf = dt_xmallocarray((size_t)o->T + 1, sizeof(*l->buf));

    sorted = dt_xmallocarray((size_t)npaths, sizeof(*sorted));
    for (int i = 0; i < npaths; i++)
        sorted[i] = (char *)paths[i];
    qsort(sorted, (size_t)npaths, sizeof(*sorted), cmp_str);
    for (int i = 0; i < npaths; i++) {
        shard_info_t *sh = &l->shards[i];
        dt_tok_shard_t *f;

        sh->path = dt_xstrdup(sorted[i]);
        if (i > 0 && strcmp(sorted[i], sorted[i - 1]) == 0) {
            rc = dt_emsg_set(em, DT_EINVAL, "%s: shard given twice", sorted[i]);
            break;
        }
        if ((rc = dt_tok_shard_new(sh->path, &f, em)) < 0)
            break;
        sh->ntok = dt_tok_shard_ntok(f);
        dt_tok_shard_free(f);
        sh->nseq = sh->ntok > 0 ? (sh->ntok - 1) / o->T : 0;
        if (sh->nseq < 1) {
            rc = dt_emsg_set(em, DT_EINVAL,
                             "%s: %" PRId64 " tokens, fewer than one sequence of T + 1 = %" PRId64,
                             sh->path, sh->ntok, o->T + 1);
            break;
        }
        l->ntok += sh->ntok;
        l->nseq += sh->nseq;
    }
    free(sorted);
    if (rc < 0) {
        dt_loader_free(l);
        return rc;
    }
    *out = l;
    return 0;
}

/* glob(3) reports an unreadable directory only through a callback without
 * a user pointer: the first one is kept here, per thread. */
static __thread struct {
    char path[256];
    int err;
} glob_fail;

static int glob_err(const char *epath, int eerrno)
{
    if (glob_fail.err == 0) {
        snprintf(glob_fail.path, sizeof(glob_fail.path), "%s", epath);
        glob_fail.err = eerrno;
    }
    return 1; /* stop: GLOB_ABORTED */
}

int dt_loader_new_glob(const char *pattern, const dt_loader_opts_t *o, dt_loader_t **out,
                       dt_emsg_t *em)
{
    glob_t g;
    int rc;

    *out = NULL;
    memset(&g, 0, sizeof(g));
    glob_fail.err = 0;
    rc = glob(pattern, GLOB_ERR, glob_err, &g);
    if (rc == GLOB_NOMATCH) {
        globfree(&g);
        return dt_emsg_set(em, DT_ENOENT, "%s: no shard matches", pattern);
    }
    if (rc == GLOB_ABORTED && glob_fail.err != 0) {
        int e = glob_fail.err;
        /* a directory of the pattern that is missing or closed to us is
         * the user's to fix (exit 2); anything else may pass (exit 1) */
        int code = e == ENOENT ? DT_ENOENT : e == EACCES ? DT_EACCES
                   : e == ENOTDIR ? DT_EINVAL : dt_err_errno(e);
        globfree(&g);
        return dt_emsg_set(em, code, "%s: cannot read directory %s: %s", pattern,
                           glob_fail.path, strerror(e));
    }
    if (rc != 0) {
        globfree(&g);
        return dt_emsg_set(em, rc == GLOB_NOSPACE ? DT_ENOMEM : DT_EIO,
                           "%s: cannot expand the pattern (%s)", pattern,
                           rc == GLOB_NOSPACE ? "out of memory" : "read error");
    }
    if (g.gl_pathc > INT32_MAX) {
        globfree(&g);
        return dt_emsg_set(em, DT_EINVAL, "%s: too many shards", pattern);
    }
    rc = dt_loader_new((const char *const *)g.gl_pathv, (int)g.gl_pathc, o, out, em);
    globfree(&g);
    return rc;
}

void dt_loader_free(dt_loader_t *l)
{
    if (l == NULL)
        return;
    for (int i = 0; i < l->nshards; i++)
        free(l->shards[i].path);
    free(l->shards);
    free(l->order);
    free(l->perm);
    dt_tok_shard_free(l->file);
    free(l->buf);
    free(l);
}

int dt_loader_nshards(const dt_loader_t *l)
{
    return l->nshards;
}

int64_t dt_loader_ntok(const dt_loader_t *l)
{
    return l->ntok;
}

int64_t dt_loader_nseq(const dt_loader_t *l)
{
    return l->nseq;
}

static void advance(dt_loader_t *l)
{
    build_order(l, l->cur.epoch);
    if (++l->cur.seq < l->shards[l->order[l->cur.shard]].nseq)
        return;
    l->cur.seq = 0;
    if (++l->cur.shard < l->nshards)
        return;
    l->cur.shard = 0;
    l->cur.epoch++;
}

int dt_loader_next(dt_loader_t *l, int32_t *x, int32_t *y, dt_emsg_t *em)
{
    dt_loader_cursor_t saved = l->cur;
    int64_t T = l->o.T;
    int rc;

    for (int i = 0; i < l->o.dp_size; i++) {
        if (i == l->o.dp_rank) {
            const shard_info_t *sh;
            int64_t j, first;

            if ((rc = load_cursor(l, em)) < 0)
                goto fail;
            sh = &l->shards[l->order[l->cur.shard]];
            j = l->perm ? l->perm[l->cur.seq] : l->cur.seq;
            first = j * T;
            if ((rc = dt_tok_shard_read(l->file, first, T + 1, l->buf, em)) < 0)
                goto fail;
            if (l->o.vocab > 0) {
                for (int64_t k = 0; k <= T; k++) {
                    if (l->buf[k] >= l->o.vocab) {
                        rc = dt_emsg_set(em, DT_EFORMAT,
                                         "%s: token %" PRId64 " is %" PRId32
                                         ", outside the vocabulary of %" PRId64,
                                         sh->path, first + k, l->buf[k], l->o.vocab);
                        goto fail;
                    }
                }
            }
            memcpy(x, l->buf, (size_t)T * sizeof(*x));
            memcpy(y, l->buf + 1, (size_t)T * sizeof(*y));
        }
        advance(l);
    }
    return 0;
fail:
    l->cur = saved;
    return rc;
}

void dt_loader_get_cursor(const dt_loader_t *l, dt_loader_cursor_t *c)
{
    *c = l->cur;
}

int dt_loader_set_cursor(dt_loader_t *l, const dt_loader_cursor_t *c, dt_emsg_t *em)
{
    const shard_info_t *sh;

    if (c->shard < 0 || c->shard >= l->nshards)
        return dt_emsg_set(em, DT_EINVAL,
                           "loader cursor: shard %" PRId64 " is not in [0, %d) shards", c->shard,
                           l->nshards);
    build_order(l, c->epoch);
    sh = &l->shards[l->order[c->shard]];
    if (c->seq < 0 || c->seq >= sh->nseq)
        return dt_emsg_set(em, DT_EINVAL,
                           "loader cursor: sequence %" PRId64 " is not in [0, %" PRId64
                           ") of %s (epoch %" PRIu64 ", shard %" PRId64 ")",
                           c->seq, sh->nseq, sh->path, c->epoch, c->shard);
    if (c->epoch != l->cur.epoch || c->shard != l->cur.shard)
        l->perm_shard = -1;
    l->cur = *c;
    return 0;
}
