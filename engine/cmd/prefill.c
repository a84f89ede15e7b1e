/* SPDX-License-Identifier: MIT
 *
 * `dtengine prefill`: the forward pass of the LLaMA-3 model over one long
 * sequence split over the job's ranks (context parallel), one layer at a
 * time, with a checkpoint of the hidden state after every layer, so that an
 * interrupted prefill resumes at the last finished layer instead of at the
 * start. It prints the loss over the task's targets and writes the logits of
 * the last N positions as .npy.
 *
 * Checkpoints (io/ckpt.h): DIR/step-NNNNNNNN/ where NNNNNNNN is the
 * number of finished layers; shard r holds rank r's hidden state as the
 * tensor "hidden" (c, d) float32 and its positions "positions" (c) int64,
 * with metadata "format" = "dt-prefill-1" and "layers_done". The manifest's
 * plan records the layout, sequence length and attention, its rng the seed
 * and data, so a resume refuses a checkpoint of another job. The hidden
 * state is stored bit for bit, so a resumed prefill writes exactly the
 * logits of an uninterrupted one. A resume needs the rank count and layout
 * that wrote the checkpoint (the hidden state is not resharded).
 *
 * The parameters are those of dt_model_init(seed), the state of `dtengine
 * train` at step 0, and the sequence is the one train sees at step 0, so
 * the prefill loss equals train's step-0 loss. Not here: loading trained
 * parameters, a KV cache for generation, batching.
 */
#include "config.h"

#include <errno.h>
#include <getopt.h>
#include <inttypes.h>
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "common/clock.h"
#include "common/mem.h"
#include "common/sha256.h"
#include "engine/cmd/agree.h"
#include "engine/attn/attn.h"
#include "io/ckpt.h"
#include "engine/cmd/cmd.h"
#include "engine/data/loader.h"
#include "engine/data/recall.h"
#include "io/tokshard.h"
#include "engine/model/model.h"
#include "io/npy.h"
#include "io/safetensors.h"

#define PREFILL_FORMAT "dt-prefill-1"

enum { TAG_SHARD = 311, TAG_COUNT, TAG_POS, TAG_ROWS };

typedef struct popts {
    dt_model_cfg_t model;
    int64_t T, last, ckpt_keep, stop_after;
    uint64_t seed;
    const char *ckpt_dir, *data, *layout, *segments, *dilations, *logits;
    int resume, causal;
} popts_t;

static void usage(FILE *f)
{
    fprintf(f, "usage: dtengine prefill --model PRESET [--dim N --layers N --heads N\n"
               "                        --kv-heads N --ffn N --vocab N] --data recall|SHARDS\n"
               "                        --seq-len T [--seed S] [--layout contiguous|zigzag]\n"
               "                        [--segments w1,.. --dilations r1,..] [--no-causal]\n"
               "                        [--ckpt-dir DIR [--ckpt-keep N] [--resume]]\n"
               "                        [--logits OUT.npy] [--last N] [--stop-after-layer K]\n"
               "PRESET: tiny, llama3-8b, llama3-70b, or custom with every shape flag\n");
}

static int parse(int argc, char **argv, popts_t *o, dt_emsg_t *em)
{
    static const struct option lo[] = {
        { "model", 1, NULL, 'm' },     { "dim", 1, NULL, 1 },           { "layers", 1, NULL, 2 },
        { "heads", 1, NULL, 3 },       { "kv-heads", 1, NULL, 4 },      { "ffn", 1, NULL, 5 },
        { "vocab", 1, NULL, 6 },       { "data", 1, NULL, 'd' },        { "seq-len", 1, NULL, 'T' },
        { "seed", 1, NULL, 's' },      { "layout", 1, NULL, 'y' },      { "segments", 1, NULL, 'g' },
        { "dilations", 1, NULL, 'D' }, { "no-causal", 0, NULL, 'N' },   { "ckpt-dir", 1, NULL, 'c' },
        { "ckpt-keep", 1, NULL, 'K' }, { "resume", 0, NULL, 'r' },      { "logits", 1, NULL, 'o' },
        { "last", 1, NULL, 'l' },      { "stop-after-layer", 1, NULL, 'X' },
        { "help", 0, NULL, 'h' },      { NULL, 0, NULL, 0 },
    };
    double v;
    int c, rc;

    memset(o, 0, sizeof(*o));
    dt_model_preset("tiny", &o->model, NULL);
    o->data = "recall";
    o->layout = "zigzag";
    o->causal = 1;
    o->T = 1024;
    o->seed = 1;
    o->last = 1;
    o->ckpt_keep = 2;
    opterr = 0;
    optind = 1;
    while ((c = getopt_long(argc, argv, "", lo, NULL)) != -1) {
        rc = 0;
        switch (c) {
        case 'm': case 1: case 2: case 3: case 4: case 5: case 6:
            if ((rc = dt_cmd_model_option(c, optarg, &o->model, em)) < 0)
                return rc;
            break;
        case 'd': o->data = optarg; break;
        case 'T': rc = dt_cmd_number("seq-len", optarg, 2, 1e12, &v, em), o->T = (int64_t)v; break;
        case 's': rc = dt_cmd_number("seed", optarg, 0, 9e15, &v, em), o->seed = (uint64_t)v; break;
        case 'y': o->layout = optarg; break;
        case 'g': o->segments = optarg; break;
        case 'D': o->dilations = optarg; break;
        case 'N': o->causal = 0; break;
        case 'c': o->ckpt_dir = optarg; break;
        case 'K': rc = dt_cmd_number("ckpt-keep", optarg, 1, 1e6, &v, em), o->ckpt_keep = (int64_t)v; break;
        case 'r': o->resume = 1; break;
        case 'o': o->logits = optarg; break;
        case 'l': rc = dt_cmd_number("last", optarg, 1, 1e12, &v, em), o->last = (int64_t)v; break;
        case 'X':
            rc = dt_cmd_number("stop-after-layer", optarg, 1, 1 << 20, &v, em), o->stop_after = (int64_t)v;
            break;
        case 'h': return 1;
        default:
            return dt_emsg_set(em, DT_EUSAGE, "unknown option or missing value '%s'",
                               argv[optind - 1]);
        }
        if (rc < 0)
            return rc;
    }
    if (optind < argc)
        return dt_emsg_set(em, DT_EUSAGE, "unexpected argument '%s'", argv[optind]);
    if (o->resume && o->ckpt_dir == NULL)
        return dt_emsg_set(em, DT_EUSAGE, "--resume needs --ckpt-dir");
    if (o->stop_after > 0 && o->ckpt_dir == NULL)
        return dt_emsg_set(em, DT_EUSAGE, "--stop-after-layer needs --ckpt-dir");
    if (o->last > o->T)
        return dt_emsg_set(em, DT_EUSAGE, "--last %lld: more than the %lld positions of the "
                           "sequence", (long long)o->last, (long long)o->T);
    return 0;
}

/* ---- checkpoints ------------------------------------------------------------ */

static json_t *model_json(const dt_model_cfg_t *m)
{
    return json_pack("{s:i, s:i, s:i, s:i, s:i, s:i, s:f, s:f, s:b}", "dim", m->dim, "layers",
                     m->layers, "heads", m->heads, "kv_heads", m->kv_heads, "ffn", m->ffn,
                     "vocab", m->vocab, "rope_theta", m->rope_theta, "norm_eps",
                     (double)m->norm_eps, "tied", m->tied);
}

/* Everything besides the model and the seed that the hidden state depends
 * on. */
static json_t *plan_json(const popts_t *o)
{
    return json_pack("{s:s, s:I, s:b, s:s, s:s}", "layout", o->layout, "seq_len",
                     (json_int_t)o->T, "causal", o->causal, "segments",
                     o->segments ? o->segments : "", "dilations",
                     o->dilations ? o->dilations : "");
}

static json_t *rng_json(const popts_t *o)
{
    return json_pack("{s:I, s:s}", "seed", (json_int_t)o->seed, "data", o->data);
}

/* Checkpoint "step" K = K layers done: every rank's hidden state. */
static int save(dt_comm_t *comm, const popts_t *o, int64_t done, int64_t c, const float *hidden,
                const int64_t *pos, dt_emsg_t *em)
{
    int R = dt_comm_size(comm), me = dt_comm_rank(comm), rc = 0, who;
    dt_ckpt_shard_t *recs = me == 0 ? dt_xcalloc((size_t)R, sizeof(*recs)) : NULL, mine;
    int64_t shape[2] = { c, o->model.dim };
    char buf[32];

    if (me == 0)
        rc = dt_ckpt_begin(o->ckpt_dir, done, em);
    if ((rc = dt_comm_agree(comm, rc, 0, &who)) < 0)
        goto out;
    dt_st_writer_t *w = dt_st_writer_new();
    rc = dt_st_writer_add(w, "hidden", DT_F32, 2, shape, hidden, em);
    if (rc == 0)
        rc = dt_st_writer_add(w, "positions", DT_I64, 1, &c, pos, em);
    if (rc == 0)
        rc = dt_st_writer_meta(w, "format", PREFILL_FORMAT, em);
    snprintf(buf, sizeof(buf), "%" PRId64, done);
    if (rc == 0)
        rc = dt_st_writer_meta(w, "layers_done", buf, em);
    if (rc == 0)
        rc = dt_ckpt_write_shard(o->ckpt_dir, done, me, R, w, &mine, em);
    dt_st_writer_free(w);
    if ((rc = dt_comm_agree(comm, rc, 0, &who)) < 0)
        goto out;
    if (me != 0) {
        rc = dt_comm_send(comm, &mine, sizeof(mine), 0, TAG_SHARD);
    } else {
        recs[0] = mine;
        for (int q = 1; q < R && rc == 0; q++)
            rc = dt_comm_recv(comm, &recs[q], sizeof(recs[q]), q, TAG_SHARD);
        if (rc == 0) {
            dt_ckpt_manifest_t man = { .step = done, .ranks = R, .model = model_json(&o->model),
                                       .plan = plan_json(o), .rng = rng_json(o),
                                       .data_cursor = 0, .shards = recs };
            rc = dt_ckpt_write_manifest(o->ckpt_dir, &man, em);
            if (rc == 0)
                rc = dt_ckpt_commit(o->ckpt_dir, done, NULL, em);
            if (rc == 0 && dt_ckpt_prune(o->ckpt_dir, (int)o->ckpt_keep, em) < 0)
                rc = 0; /* pruning is housekeeping: the checkpoint is safe */
            json_decref(man.model);
            json_decref(man.plan);
            json_decref(man.rng);
        }
    }
    rc = dt_comm_agree(comm, rc, 0, &who);
out:
    free(recs);
    return rc;
}

static void skipped(const char *dir, int err, const char *why, void *ud)
{
    fprintf(stderr, "dtengine prefill: skipping checkpoint %s: %s\n", dir, why);
    (void)err;
    (void)ud;
}

/* Rank 0: the newest checkpoint that verifies and belongs to this job (its
 * model, plan, seed, data and rank count); *done = its layer count, 0 when
 * there is none. Newer step directories that did not verify are renamed to
 * step-NNNNNNNN.rejected (out of the step-* namespace, kept for inspection),
 * since this run will write those steps again. */
static int find(const popts_t *o, int R, int64_t *done, dt_emsg_t *em)
{
    char *dir = NULL;
    int64_t s = 0;
    dt_ckpt_manifest_t man = { 0 };
    json_t *want[3] = { model_json(&o->model), plan_json(o), rng_json(o) };
    int rc = dt_ckpt_latest(o->ckpt_dir, 0, skipped, NULL, &dir, &s, em);

    *done = 0;
    if (rc < 0 || dir == NULL)
        goto out;
    if ((rc = dt_ckpt_manifest_read(dir, &man, em)) < 0)
        goto out;
    if (!json_equal(want[0], man.model))
        rc = dt_emsg_set(em, DT_EINVAL, "%s: written for another model shape", dir);
    else if (!json_equal(want[1], man.plan))
        rc = dt_emsg_set(em, DT_EINVAL, "%s: written for another sequence length, layout or "
                         "attention (not a prefill checkpoint of this job)", dir);
    else if (!json_equal(want[2], man.rng))
        rc = dt_emsg_set(em, DT_EINVAL, "%s: written for another seed or data", dir);
    else if (man.ranks != R)
        rc = dt_emsg_set(em, DT_ENOTSUP, "%s: written by %d ranks; a prefill resumes on the "
                         "same number of ranks (this job has %d)", dir, man.ranks, R);
    else if (man.step < 1 || man.step > o->model.layers)
        rc = dt_emsg_set(em, DT_EFORMAT, "%s: %lld layers done, the model has %d", dir,
                         (long long)man.step, o->model.layers);
    if (rc < 0)
        goto out;
    for (int64_t k = man.step + 1; k <= o->model.layers; k++) {
        char *bad = dt_ckpt_step_dir(o->ckpt_dir, k), *to = NULL;
        struct stat st;
        /* .rejected, or .rejected.2, ... when an earlier attempt left one */
        if (lstat(bad, &st) == 0 &&
            (rc = dt_ckpt_set_aside(o->ckpt_dir, k, "rejected", &to, em)) == 0)
            fprintf(stderr, "dtengine prefill: moved %s aside to %s\n", bad, to);
        free(bad);
        free(to);
        if (rc < 0)
            goto out;
    }
    *done = man.step;
    fprintf(stderr, "dtengine prefill: resuming from %s after layer %lld of %d\n", dir,
            (long long)man.step, o->model.layers);
out:
    for (int i = 0; i < 3; i++)
        json_decref(want[i]);
    dt_ckpt_manifest_close(&man);
    free(dir);
    return rc;
}

/* Every rank: read its own shard of checkpoint `done` into hidden (c, d). */
static int load(const popts_t *o, int R, int me, int64_t done, int64_t c, const int64_t *pos,
                float *hidden, dt_emsg_t *em)
{
    char name[64];
    char *dir = dt_ckpt_step_dir(o->ckpt_dir, done);
    dt_ckpt_shard_name(me, R, name);
    char *path = dt_xasprintf("%s/%s", dir, name);
    int64_t *have = dt_xmallocarray((size_t)c, sizeof(int64_t));
    dt_st_reader_t *r = NULL;
    int rc = dt_st_open_nofollow(path, &r, em);

    if (rc == 0) {
        const char *fmt = dt_st_meta(r, "format"), *ld = dt_st_meta(r, "layers_done");
        const dt_st_tensor_t *h = dt_st_find(r, "hidden"), *p = dt_st_find(r, "positions");
        char want[32];
        snprintf(want, sizeof(want), "%lld", (long long)done);
        /* layers_done exactly as written ("3", not "3abc" or " 3") */
        if (!fmt || strcmp(fmt, PREFILL_FORMAT) != 0 || !ld || strcmp(ld, want) != 0)
            rc = dt_emsg_set(em, DT_EFORMAT, "%s: not a %s shard after %lld layers", path,
                             PREFILL_FORMAT, (long long)done);
        else if (!h || h->dtype != DT_F32 || h->ndim != 2 || h->shape[0] != c ||
                 h->shape[1] != o->model.dim || !p || p->dtype != DT_I64 || p->ndim != 1 ||
                 p->shape[0] != c)
            rc = dt_emsg_set(em, DT_ESHAPE, "%s: want hidden (%lld, %d) F32 and positions "
                             "(%lld) I64", path, (long long)c, o->model.dim, (long long)c);
        if (rc == 0)
            rc = dt_st_read(r, "positions", have, (size_t)c * sizeof(int64_t), em);
        if (rc == 0 && memcmp(have, pos, (size_t)c * sizeof(int64_t)) != 0)
            rc = dt_emsg_set(em, DT_ELAYOUT, "%s: holds other positions than rank %d's", path,
                             me);
        if (rc == 0)
            rc = dt_st_read(r, "hidden", hidden, (size_t)(c * o->model.dim) * sizeof(float), em);
    }
    dt_st_close(r);
    free(have);
    free(path);
    free(dir);
    return rc;
}

/* ---- the last positions' logits ---------------------------------------------- */

/* Rank 0 gathers the logits of positions [T - N, T) into out (N, V); the
 * rows may sit on any rank (with zigzag, on rank 0's second chunk). */
static int gather_last(dt_comm_t *comm, const popts_t *o, int64_t c, const int64_t *pos,
                       const float *logits, float *out)
{
    int R = dt_comm_size(comm), me = dt_comm_rank(comm), rc = 0;
    const int64_t V = o->model.vocab, first = o->T - o->last;
    int64_t n = 0;

    for (int64_t i = 0; i < c; i++)
        n += pos[i] >= first;
    int64_t *ps = dt_xmallocarray((size_t)(n > 0 ? n : 1), sizeof(int64_t));
    float *rows = dt_xaligned((size_t)(n > 0 ? n : 1) * (size_t)V, sizeof(float));
    for (int64_t i = 0, j = 0; i < c; i++)
        if (pos[i] >= first) {
            ps[j] = pos[i];
            memcpy(rows + j * V, logits + i * V, (size_t)V * sizeof(float));
            j++;
        }
    if (me != 0) {
        rc = dt_comm_send(comm, &n, sizeof(n), 0, TAG_COUNT);
        if (rc == 0 && n > 0)
            rc = dt_comm_send(comm, ps, (size_t)n * sizeof(int64_t), 0, TAG_POS);
        if (rc == 0 && n > 0)
            rc = dt_comm_send(comm, rows, (size_t)(n * V) * sizeof(float), 0, TAG_ROWS);
    } else {
        for (int q = 0; q < R && rc == 0; q++) {
            if (q > 0) {
                free(ps);
                free(rows);
                if ((rc = dt_comm_recv(comm, &n, sizeof(n), q, TAG_COUNT)) < 0)
                    break;
                ps = dt_xmallocarray((size_t)(n > 0 ? n : 1), sizeof(int64_t));
                rows = dt_xaligned((size_t)(n > 0 ? n : 1) * (size_t)V, sizeof(float));
                if (n > 0 && (rc = dt_comm_recv(comm, ps, (size_t)n * sizeof(int64_t), q,
                                                TAG_POS)) == 0)
                    rc = dt_comm_recv(comm, rows, (size_t)(n * V) * sizeof(float), q, TAG_ROWS);
            }
            for (int64_t j = 0; j < n && rc == 0; j++)
                memcpy(out + (ps[j] - first) * V, rows + j * V, (size_t)V * sizeof(float));
        }
    }
    free(ps);
    free(rows);
    return rc;
}

/* ---- the command ------------------------------------------------------------ */

/* The sequence train sees at step 0: recall sequence 0, or the first
 * sequence of the shuffled token shards. */
static int sequence(const popts_t *o, int32_t *xs, int32_t *ys, dt_emsg_t *em)
{
    dt_recall_opts_t task;
    dt_loader_t *loader = NULL;
    int rc;

    if (strcmp(o->data, "recall") != 0) {
        dt_loader_opts_t lopt = { .T = o->T, .shuffle = 1, .seed = o->seed,
                                  .vocab = o->model.vocab };
        if ((rc = dt_loader_new_glob(o->data, &lopt, &loader, em)) == 0)
            rc = dt_loader_next(loader, xs, ys, em);
        dt_loader_free(loader);
        return rc;
    }
    dt_recall_opts_default(&task);
    task.T = o->T;
    task.seed = o->seed;
    /* as train: planted pairs must fit in the first 10% of the sequence */
    int pairs = (int)((o->T + 1) / 10 - 1) / 3;
    task.n_pairs = pairs < task.n_pairs ? pairs : task.n_pairs;
    task.n_queries = task.n_pairs < task.n_queries ? task.n_pairs : task.n_queries;
    if (task.n_pairs < 1)
        return dt_emsg_set(em, DT_EINVAL, "--seq-len %lld is too short for the recall task "
                           "(at least 40)", (long long)o->T);
    if ((rc = dt_recall_check(&task, em)) < 0)
        return rc;
    if (dt_recall_vocab(&task) > o->model.vocab)
        return dt_emsg_set(em, DT_EINVAL, "the recall task needs a vocabulary of %lld, the "
                           "model has %d", (long long)dt_recall_vocab(&task), o->model.vocab);
    return dt_recall_xy(&task, 0, xs, ys, em);
}

/* Rank 0, without --resume: refuse a directory that already holds steps
 * this run would write (a committed step is never overwritten). */
static int fresh_dir(const popts_t *o, dt_emsg_t *em)
{
    int rc = 0;
    for (int k = 1; k <= o->model.layers && rc == 0; k++) {
        char *dir = dt_ckpt_step_dir(o->ckpt_dir, k);
        struct stat st;
        if (stat(dir, &st) == 0)
            rc = dt_emsg_set(em, DT_EINVAL, "%s exists: pass --resume to continue that "
                             "prefill, or another --ckpt-dir", dir);
        free(dir);
    }
    return rc;
}

/* ---- the prefiller ------------------------------------------------------------ */

/* One run of `dtengine prefill` on this rank: options, the sequence, the
 * model and this rank's hidden state. */
typedef struct prefiller {
    dt_comm_t *comm;
    int R, me;
    popts_t o;
    dt_emsg_t em;
    dt_attn_spec_t attn;
    dt_model_layout_t lo;
    dt_model_t *m;
    float *P, *hidden, *last; /* last: rank 0's gathered logits (N, V) */
    int32_t *xs, *ys, *x, *y;
    int64_t *pos;
    int64_t c, done;          /* tokens of this rank; layers done */
    double loss;
    int stopped;              /* --stop-after-layer reached */
} prefiller_t;

/* Agree on a phase's outcome; the rank holding the original failure
 * prints it. */
static int report(prefiller_t *p, int rc)
{
    return dt_agree_report(p->comm, rc, "dtengine prefill", p->em.s, NULL);
}

/* Options, the attention spec and the sequence; on rank 0 without
 * --resume, a check that --ckpt-dir holds no step this run would write.
 * 1 for --help (every rank has the same argv), else agreed and reported,
 * with the usage after a bad option. */
static int prefiller_init(prefiller_t *p, dt_comm_t *comm, int argc, char **argv)
{
    popts_t *o = &p->o;
    int rc, printed;

    memset(p, 0, sizeof(*p));
    p->comm = comm;
    p->R = dt_comm_size(comm);
    p->me = dt_comm_rank(comm);
    if ((rc = parse(argc, argv, o, &p->em)) == 1)
        return 1;
    if (rc == 0)
        rc = dt_model_cfg_check(&o->model, &p->em);
    if (rc == 0 && o->stop_after > o->model.layers)
        rc = dt_emsg_set(&p->em, DT_EUSAGE, "--stop-after-layer %lld: the model has %d layers",
                         (long long)o->stop_after, o->model.layers);
    p->attn.T = o->T;
    p->attn.H = o->model.heads;
    p->attn.Hkv = o->model.kv_heads;
    p->attn.D = o->model.dim / o->model.heads;
    p->attn.causal = o->causal;
    if (rc == 0 && dt_layout_parse(o->layout, &p->attn.layout) < 0)
        rc = dt_emsg_set(&p->em, DT_EUSAGE, "--layout '%s': contiguous or zigzag", o->layout);
    if (rc == 0)
        rc = dt_attn_parse_branches(&p->attn, o->segments, o->dilations, &p->em);
    if (rc == 0)
        rc = dt_attn_check(&p->attn, p->R, &p->em);
    if (rc == 0) {
        p->xs = dt_xmallocarray((size_t)o->T, sizeof(int32_t));
        p->ys = dt_xmallocarray((size_t)o->T, sizeof(int32_t));
        rc = sequence(o, p->xs, p->ys, &p->em);
    }
    if (rc == 0 && p->me == 0 && o->ckpt_dir && !o->resume)
        rc = fresh_dir(o, &p->em);
    rc = dt_agree_report(comm, rc, "dtengine prefill", p->em.s, &printed);
    if (rc == DT_EUSAGE && printed)
        usage(stderr);
    return rc;
}

/* The model at dt_model_init(seed) and this rank's tokens and buffers. */
static void prefiller_alloc(prefiller_t *p)
{
    const popts_t *o = &p->o;

    p->c = dt_layout_local(o->T, p->R);
    dt_model_layout_init(&p->lo, &o->model);
    p->m = dt_model_new_forward(&o->model, p->c);
    p->P = dt_xcalloc((size_t)p->lo.nparams, sizeof(float));
    p->hidden = dt_xaligned((size_t)(p->c * o->model.dim), sizeof(float));
    p->x = dt_xmallocarray((size_t)p->c, sizeof(int32_t));
    p->y = dt_xmallocarray((size_t)p->c, sizeof(int32_t));
    p->pos = dt_xmallocarray((size_t)p->c, sizeof(int64_t));
    dt_layout_positions(p->attn.layout, o->T, p->R, p->me, p->pos);
    for (int64_t i = 0; i < p->c; i++) {
        p->x[i] = p->xs[p->pos[i]];
        p->y[i] = p->ys[p->pos[i]];
    }
    dt_model_init(&o->model, &p->lo, o->seed, p->P);
}

/* The hidden state to start from: with --resume, rank 0 picks the
 * checkpoint and every rank reads its shard; else (or when there is none)
 * the embedding. Agreed and reported; rank 0 prints the header. */
static int prefiller_load_or_resume(prefiller_t *p)
{
    const popts_t *o = &p->o;
    int rc = 0;

    if (o->resume) {
        rc = p->me == 0 ? find(o, p->R, &p->done, &p->em) : 0;
        if ((rc = report(p, rc)) < 0)
            return rc;
        int k = (int)p->done;
        if ((rc = dt_comm_bcast_int(p->comm, &k)) < 0)
            dt_emsg_set(&p->em, rc, "broadcasting the resume layer failed");
        else if ((p->done = k) > 0)
            rc = load(o, p->R, p->me, p->done, p->c, p->pos, p->hidden, &p->em);
    }
    if (rc == 0 && p->done == 0)
        rc = dt_model_embed(p->m, p->P, p->x, p->hidden, &p->em);
    if ((rc = report(p, rc)) < 0)
        return rc;
    if (p->me == 0) {
        printf("prefill: model dim=%d layers=%d heads=%d/%d ffn=%d vocab=%d params=%lld "
               "tokens=%lld ranks=%d layout=%s start_layer=%lld\n",
               o->model.dim, o->model.layers, o->model.heads, o->model.kv_heads, o->model.ffn,
               o->model.vocab, (long long)p->lo.nparams, (long long)o->T, p->R, o->layout,
               (long long)p->done);
        fflush(stdout);
    }
    return 0;
}

/* One layer forward, and its checkpoint with --ckpt-dir. */
static int prefiller_layer(prefiller_t *p, int64_t l)
{
    const popts_t *o = &p->o;
    double t0 = dt_clock_now();
    int rc;

    if ((rc = dt_model_layer_fwd(p->m, p->comm, &p->attn, p->P, (int)l, p->pos, p->hidden,
                                 &p->em)) < 0)
        return rc;
    double secs = dt_clock_now() - t0;
    if (o->ckpt_dir && (rc = save(p->comm, o, l + 1, p->c, p->hidden, p->pos, &p->em)) < 0)
        return rc;
    if (p->me == 0) {
        printf("layer %lld/%d seconds %.4f%s\n", (long long)(l + 1), o->model.layers, secs,
               o->ckpt_dir ? " checkpointed" : "");
        fflush(stdout);
    }
    return 0;
}

/* The layers left, up to --stop-after-layer; agreed and reported. */
static int prefiller_layers(prefiller_t *p)
{
    const popts_t *o = &p->o;
    int rc = 0;

    for (int64_t l = p->done; l < o->model.layers; l++) {
        if ((rc = prefiller_layer(p, l)) < 0)
            break;
        if (l + 1 == o->stop_after) {
            p->stopped = 1;
            break;
        }
    }
    if ((rc = report(p, rc)) < 0)
        return rc;
    if (p->stopped && p->me == 0)
        fprintf(stderr, "dtengine prefill: stopped after layer %lld (--stop-after-layer); "
                "--resume continues\n", (long long)o->stop_after);
    return 0;
}

/* The head: the loss over the task's targets, then the last positions'
 * logits gathered on rank 0 and written (--logits). Each phase agreed
 * and reported. */
static int prefiller_head(prefiller_t *p)
{
    const popts_t *o = &p->o;
    int rc;

    rc = dt_model_head(p->m, p->comm, p->P, p->hidden, p->y, &p->loss, &p->em);
    if ((rc = report(p, rc)) < 0)
        return rc;
    if (p->me == 0)
        p->last = dt_xaligned((size_t)(o->last * o->model.vocab), sizeof(float));
    rc = gather_last(p->comm, o, p->c, p->pos, dt_model_logits(p->m), p->last);
    if ((rc = dt_agree_report(p->comm, rc, "dtengine prefill",
                              "gathering the last logits failed", NULL)) < 0)
        return rc;
    if (p->me == 0 && o->logits) {
        int64_t shape[2] = { o->last, o->model.vocab };
        rc = dt_npy_save(o->logits, DT_F32, 2, shape, p->last, &p->em);
    }
    return report(p, rc);
}

/* Rank 0: the loss and the digest of the last logits. */
static void prefiller_finish(const prefiller_t *p)
{
    const popts_t *o = &p->o;
    char hex[65];

    if (p->me != 0)
        return;
    dt_sha256_hex(p->last, (size_t)(o->last * o->model.vocab) * sizeof(float), hex);
    printf("prefill: tokens=%lld layers=%d loss %.9f\n", (long long)o->T, o->model.layers,
           p->loss);
    printf("result: tokens=%lld layers=%d last=%lld logits_sha256=%s\n", (long long)o->T,
           o->model.layers, (long long)o->last, hex);
}

static void prefiller_close(prefiller_t *p)
{
    dt_model_free(p->m);
    dt_model_layout_close(&p->lo);
    free(p->P);
    free(p->hidden);
    free(p->last);
    free(p->xs);
    free(p->ys);
    free(p->x);
    free(p->y);
    free(p->pos);
}

/* ---- the command ------------------------------------------------------------ */

int dt_cmd_prefill(dt_comm_t *comm, int argc, char **argv)
{
    prefiller_t p;
    int rc = prefiller_init(&p, comm, argc, argv);

    if (rc == 1) {
        if (p.me == 0)
            usage(stdout);
        prefiller_close(&p);
        return DT_EXIT_OK;
    }
    if (rc == 0) {
        prefiller_alloc(&p);
        rc = prefiller_load_or_resume(&p);
    }
    if (rc == 0)
        rc = prefiller_layers(&p);
    if (rc == 0 && !p.stopped && (rc = prefiller_head(&p)) == 0)
        prefiller_finish(&p);
    prefiller_close(&p);
    if (rc < 0)
        return dt_exit_code(rc);
    return p.stopped ? DT_EXIT_STOPPED : DT_EXIT_OK;
}
