/* SPDX-License-Identifier: MIT
 *
 * Token shards, the loader and the generated recall task (see data.h for the
 * contracts). A shard's header is untrusted: every field is checked, and the
 * size against the count, before a token is read. Tokens move with pread in
 * bounded chunks and widen to int32. The loader's order is recomputed from
 * (seed, epoch, shard) whenever the cursor enters a new epoch or shard, so
 * the cursor alone says where it stands. This file assumes a little-endian
 * host (every target of dt is one).
 *
 * Not here: prefetching, memory-mapping, tokenisation.
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
#include "engine/data/data.h"
#include "engine/data/gen.h"

_Static_assert(__BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__,
               "data.c reads header ints and tokens as they lie in memory");

#define CHUNK_TOKENS (64 * 1024)

const char *dt_tok_format_name(enum dt_tok_format f)
{
    return f == DT_TOK_U16 ? "uint16" : f == DT_TOK_U32 ? "uint32" : "unknown";
}

static size_t tok_size(enum dt_tok_format f)
{
    return f == DT_TOK_U16 ? 2 : 4;
}

/*-- file helpers -------------------------------------------------------------*/

/*-- one shard ----------------------------------------------------------------*/

struct dt_tok_shard {
    int fd;
    enum dt_tok_format fmt;
    int64_t ntok;
    char *path;
};

void dt_tok_shard_free(dt_tok_shard_t *s)
{
    if (s == NULL)
        return;
    if (s->fd >= 0)
        close(s->fd);
    free(s->path);
    free(s);
}

int dt_tok_parse_header(const char *name, const void *head, size_t n, int64_t file_size,
                        enum dt_tok_format *fmt, int64_t *ntok, dt_emsg_t *em)
{
    int32_t hdr[3];
    int64_t have, need;

    if (n < DT_TOK_HEADER_BYTES || file_size < DT_TOK_HEADER_BYTES)
        return dt_emsg_set(em, DT_EFORMAT,
                           "%s: header is truncated: the file has %" PRId64
                           " bytes, a token shard header has %d",
                           name, (int64_t)n < file_size ? (int64_t)n : file_size,
                           DT_TOK_HEADER_BYTES);
    memcpy(hdr, head, sizeof(hdr)); /* head may be unaligned */
    if (hdr[0] == DT_TOK_MAGIC_U16) {
        *fmt = DT_TOK_U16;
        if (hdr[1] != DT_TOK_VERSION_U16)
            return dt_emsg_set(em, DT_EFORMAT,
                               "%s: header[1] (version) is %" PRId32 ", magic %d needs version %d",
                               name, hdr[1], DT_TOK_MAGIC_U16, DT_TOK_VERSION_U16);
    } else if (hdr[0] == DT_TOK_MAGIC_U32) {
        *fmt = DT_TOK_U32;
        if (hdr[1] != DT_TOK_VERSION_U32)
            return dt_emsg_set(em, DT_EFORMAT,
                               "%s: header[1] (version) is %" PRId32 ", magic %d needs version %d",
                               name, hdr[1], DT_TOK_MAGIC_U32, DT_TOK_VERSION_U32);
    } else {
        return dt_emsg_set(em, DT_EFORMAT,
                           "%s: not a token shard: header[0] (magic) is %" PRId32
                           ", expected %d (uint16 tokens) or %d (uint32 tokens)",
                           name, hdr[0], DT_TOK_MAGIC_U16, DT_TOK_MAGIC_U32);
    }
    if (hdr[2] < 0)
        return dt_emsg_set(em, DT_EFORMAT, "%s: header[2] (token count) is negative: %" PRId32,
                           name, hdr[2]);
    /* at most (2^31 - 1) * 4 bytes: no overflow; have >= 0 from the test above */
    *ntok = hdr[2];
    need = *ntok * (int64_t)tok_size(*fmt);
    have = file_size - DT_TOK_HEADER_BYTES;
    if (have < need)
        return dt_emsg_set(em, DT_EFORMAT,
                           "%s: header[2] (token count) is %" PRId64 ": %" PRId64
                           " bytes of %s tokens, but the file has %" PRId64
                           " after the header (truncated?)",
                           name, *ntok, need, dt_tok_format_name(*fmt), have);
    if (have != need)
        return dt_emsg_set(em, DT_EFORMAT,
                           "%s: header[2] (token count) is %" PRId64 ": %" PRId64
                           " bytes of %s tokens, but the file has %" PRId64
                           " after the header (%" PRId64 " bytes of trailing data)",
                           name, *ntok, need, dt_tok_format_name(*fmt), have, have - need);
    return 0;
}

int dt_tok_shard_new(const char *path, dt_tok_shard_t **out, dt_emsg_t *em)
{
    int32_t hdr[DT_TOK_HEADER_INTS];
    dt_tok_shard_t *s;
    int64_t st_size = 0;
    int64_t got;
    int rc;

    *out = NULL;
    s = dt_xcalloc(1, sizeof(*s));
    s->path = dt_xstrdup(path);
    if ((s->fd = dt_open_regular(path, &st_size, em)) < 0) {
        rc = s->fd;
        goto fail;
    }
    if ((got = dt_pread_full(s->fd, hdr, sizeof(hdr), 0)) < 0) {
        rc = dt_emsg_set(em, (int)got, "%s: cannot read: %s", path, dt_strerror((int)got));
        goto fail;
    }
    if ((rc = dt_tok_parse_header(path, hdr, (size_t)got, st_size, &s->fmt, &s->ntok, em)) < 0)
        goto fail;
    *out = s;
    return 0;
fail:
    dt_tok_shard_free(s);
    return rc;
}

int64_t dt_tok_shard_ntok(const dt_tok_shard_t *s)
{
    return s->ntok;
}

enum dt_tok_format dt_tok_shard_format(const dt_tok_shard_t *s)
{
    return s->fmt;
}

const char *dt_tok_shard_path(const dt_tok_shard_t *s)
{
    return s->path;
}

int dt_tok_shard_read(const dt_tok_shard_t *s, int64_t first, int64_t n, int32_t *dst,
                      dt_emsg_t *em)
{
    size_t w = tok_size(s->fmt);
    unsigned char *buf;
    int rc = 0;

    if (first < 0 || n < 0 || first > s->ntok || n > s->ntok - first)
        return dt_emsg_set(em, DT_EINVAL,
                           "%s: tokens [%" PRId64 ", %" PRId64 ") are outside [0, %" PRId64 ")",
                           s->path, first, first + n, s->ntok);
    if (n == 0)
        return 0;
    buf = dt_xmallocarray(CHUNK_TOKENS, w);
    for (int64_t i = 0; i < n && rc == 0; i += CHUNK_TOKENS) {
        int64_t m = n - i < CHUNK_TOKENS ? n - i : CHUNK_TOKENS;
        int64_t off = DT_TOK_HEADER_BYTES + (first + i) * (int64_t)w;
        int64_t got = dt_pread_full(s->fd, buf, (size_t)m * w, off);

        if (got < 0) {
            rc = dt_emsg_set(em, (int)got, "%s: cannot read: %s", s->path, dt_strerror((int)got));
            break;
        }
        if (got < m * (int64_t)w) {
            rc = dt_emsg_set(em, DT_EFORMAT,
                             "%s: tokens from %" PRId64
                             " are missing: the file shrank after it was opened",
                             s->path, first + i);
            break;
        }
        if (s->fmt == DT_TOK_U16) {
            const uint16_t *p = (const uint16_t *)buf;
            for (int64_t j = 0; j < m; j++)
                dst[i + j] = p[j];
        } else {
            const uint32_t *p = (const uint32_t *)buf;
            for (int64_t j = 0; j < m; j++) {
                if (p[j] > INT32_MAX) {
                    rc = dt_emsg_set(em, DT_EFORMAT,
                                     "%s: token %" PRId64 " is %" PRIu32
                                     ", larger than the int32 range",
                                     s->path, first + i + j, p[j]);
                    break;
                }
                dst[i + j] = (int32_t)p[j];
            }
        }
    }
    free(buf);
    return rc;
}

/*-- atomic writer -------------------------------------------------------------*/

int dt_tok_save(const char *path, enum dt_tok_format fmt, const int32_t *tok, int64_t n,
                dt_emsg_t *em)
{
    int32_t hdr[DT_TOK_HEADER_INTS] = { 0 };
    int64_t maxtok = fmt == DT_TOK_U16 ? 65535 : INT32_MAX;
    size_t w = tok_size(fmt);
    unsigned char *buf = NULL;
    dt_atomic_t af;
    int rc = 0;

    if (fmt != DT_TOK_U16 && fmt != DT_TOK_U32)
        return dt_emsg_set(em, DT_EINVAL, "%s: unknown token format %d", path, (int)fmt);
    if (n < 0 || n > INT32_MAX)
        return dt_emsg_set(em, DT_EINVAL, "%s: %" PRId64 " tokens do not fit header[2] (0 to %d)",
                           path, n, INT32_MAX);
    for (int64_t i = 0; i < n; i++)
        if (tok[i] < 0 || tok[i] > maxtok)
            return dt_emsg_set(em, DT_EINVAL,
                               "%s: token %" PRId64 " is %" PRId32 ", outside 0..%" PRId64
                               " of %s tokens",
                               path, i, tok[i], maxtok, dt_tok_format_name(fmt));
    /* 0600; a link planted at the temp name is not followed (fileio.h) */
    if ((rc = dt_atomic_open(&af, path, 0600, 0, em)) < 0)
        return rc;
    hdr[0] = fmt == DT_TOK_U16 ? DT_TOK_MAGIC_U16 : DT_TOK_MAGIC_U32;
    hdr[1] = fmt == DT_TOK_U16 ? DT_TOK_VERSION_U16 : DT_TOK_VERSION_U32;
    hdr[2] = (int32_t)n;
    rc = dt_atomic_write(&af, hdr, sizeof(hdr), em);
    buf = dt_xmallocarray(CHUNK_TOKENS, w);
    for (int64_t i = 0; i < n && rc == 0; i += CHUNK_TOKENS) {
        int64_t m = n - i < CHUNK_TOKENS ? n - i : CHUNK_TOKENS;
        for (int64_t j = 0; j < m; j++) {
            if (fmt == DT_TOK_U16)
                ((uint16_t *)buf)[j] = (uint16_t)tok[i + j];
            else
                ((uint32_t *)buf)[j] = (uint32_t)tok[i + j];
        }
        rc = dt_atomic_write(&af, buf, (size_t)m * w, em);
    }
    free(buf);
    if (rc < 0) {
        dt_atomic_abort(&af);
        return rc;
    }
    return dt_atomic_commit(&af, em);
}

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

/*-- generated associative recall -------------------------------------------*/

enum { D_FILLER = 0, D_KEYS, D_VALUES, D_QUERIES };

void dt_recall_opts_default(dt_recall_opts_t *o)
{
    memset(o, 0, sizeof(*o));
    o->T = 1024;
    o->n_keys = 128;
    o->n_values = 128;
    o->n_filler = 252;
    o->n_pairs = 16;
    o->n_queries = 8;
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
