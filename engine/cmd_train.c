/* SPDX-License-Identifier: MIT
 *
 * `dtengine train`: train the LLaMA-3 model with its sequence split over the
 * job's ranks (context parallel), AdamW with warm-up and cosine decay and
 * global-norm clipping, on the generated associative-recall task, with
 * checkpoints every K steps and exact resume.
 *
 * Checkpoints (engine/ckpt.h): DIR/step-NNNNNNNN/ with one safetensors
 * shard per rank and manifest.json. The flat parameter array and the two
 * AdamW moments are cut into R contiguous slices; shard r holds slice r as
 * the 1-D float32 tensors "params", "adam_m" and "adam_v", with metadata
 * "offset" and "nparams" (and "format" = "dt-train-1"). A resume reads every
 * shard's slice back, so a checkpoint written by R ranks resumes on any R'.
 * For the recall task the data cursor is the step: sequence i is a function
 * of (seed, i) alone. For token shards the loader's cursor is saved. Either
 * way a resumed run sees exactly the data the uninterrupted one would.
 *
 * Data: the generated recall task, or llm.c token shards (--data GLOB,
 * engine/data.h) read in a seeded shuffled order whose cursor is saved in
 * the manifest. A job spec (--spec FILE, dt-spec(5)) sets the same options;
 * flags override it.
 *
 * Under dtagentd (engine/wlink.h) every rank reports progress after each
 * step and each checkpoint file it wrote, and the agent's W_CHECKPOINT and
 * W_STOP are acted on at step boundaries: each rank polls its channel and
 * the requests travel in the all-reduce the step already does, so every
 * rank checkpoints or stops after the same step. With --ckpt-commit
 * external the coordinator, not the engine, decides which checkpoints are
 * good: the engine never prunes, and --resume takes only a checkpoint with
 * the coordinator's COMMITTED marker (or --resume-from names one).
 */
#include "config.h"

#include <cblas.h>
#include <getopt.h>
#include <inttypes.h>
#include <jansson.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "common/clock.h"
#include "common/fileio.h"
#include "common/mem.h"
#include "common/sha256.h"
#include "engine/attn.h"
#include "engine/ckpt.h"
#include "engine/cmd.h"
#include "engine/data.h"
#include "engine/model.h"
#include "engine/npy.h"
#include "engine/optim.h"
#include "engine/safetensors.h"
#include "engine/spec.h"
#include "engine/wlink.h"

enum { TAG_SHARD = 301 };

typedef struct topts {
    dt_model_cfg_t model;
    int64_t T, steps, ckpt_every, ckpt_keep, batch;
    uint64_t seed;
    const char *ckpt_dir, *data, *layout, *segments, *dilations, *params_out;
    const char *resume_from; /* a step directory, or NULL */
    int resume, causal;
    int external; /* --ckpt-commit external: the coordinator commits and prunes */
    double lr, min_lr, wd, clip, eps;
    int64_t warmup;
    int rkeys, rvalues, rpairs, rqueries; /* recall task sizes; 0: defaults */
    int every_from_spec;                 /* ckpt_every came from --spec */
    dt_spec_t spec; /* --spec FILE, whose strings the options above may point into */
} topts_t;

static void usage(FILE *f)
{
    fprintf(f, "usage: dtengine train [--spec FILE] --model tiny [--dim N --layers N --heads N\n"
               "                      --kv-heads N --ffn N --vocab N] --data recall|SHARDS\n"
               "                      --seq-len T --steps N\n"
               "                      [--ckpt-dir DIR --ckpt-every K [--ckpt-keep N]]\n"
               "                      [--ckpt-commit self|external] [--resume | --resume-from DIR]\n"
               "                      [--seed S] [--lr X] [--min-lr X] [--warmup N]\n"
               "                      [--weight-decay X] [--clip X] [--adam-eps X] [--layout contiguous|zigzag]\n"
               "                      [--segments w1,.. --dilations r1,..] [--no-causal]\n"
               "                      [--batch B] [--params-out FILE.npy]\n"
               "                      [--recall-keys K] [--recall-values V] [--recall-pairs P]\n"
               "                      [--recall-queries Q]\n");
}

/* Take what a job spec says about training: model, sequence, attention,
 * steps, seed, data and checkpoints. Keys that do not concern training on
 * one node (resources, Slurm options) are ignored here. */
static int apply_spec(topts_t *o, const char *path, dt_emsg_t *em)
{
    dt_spec_t *s = &o->spec;
    int rc;

    dt_spec_free(s);
    if ((rc = dt_spec_load(path, s, em)) < 0)
        return rc;
    if (s->kind && strcmp(s->kind, "train") != 0)
        return dt_emsg_set(em, DT_EINVAL, "%s: kind = %s; dtengine train runs kind = train", path,
                           s->kind);
    if (s->model && strcmp(s->model, "tiny") != 0 && strcmp(s->model, "custom") != 0)
        return dt_emsg_set(em, DT_ENOTSUP, "%s: model = %s: dtengine train has the tiny preset "
                           "(or custom with its shape)", path, s->model);
    int64_t *shape[] = { &s->dim, &s->layers, &s->heads, &s->kv_heads, &s->ffn, &s->vocab };
    int *dst[] = { &o->model.dim, &o->model.layers, &o->model.heads, &o->model.kv_heads,
                   &o->model.ffn, &o->model.vocab };
    for (int i = 0; i < 6; i++)
        if (*shape[i] > 0)
            *dst[i] = (int)*shape[i];
    if (s->rope_theta > 0)
        o->model.rope_theta = (double)s->rope_theta;
    if (s->tied)
        o->model.tied = strcmp(s->tied, "yes") == 0;
    if (s->tokens > 0)
        o->T = s->tokens;
    if (s->causal_set)
        o->causal = s->causal;
    if (s->layout)
        o->layout = s->layout;
    if (s->segments)
        o->segments = s->segments, o->dilations = s->dilations;
    if (s->steps > 0)
        o->steps = s->steps;
    if (s->seed > 0)
        o->seed = (uint64_t)s->seed;
    if (s->data)
        o->data = s->data;
    if (s->ckpt_dir)
        o->ckpt_dir = s->ckpt_dir;
    if (s->ckpt_every > 0)
        o->ckpt_every = s->ckpt_every, o->every_from_spec = 1;
    if (s->ckpt_keep > 0)
        o->ckpt_keep = s->ckpt_keep;
    if (s->batch > 0)
        o->batch = s->batch;
    if (s->lr)
        o->lr = strtod(s->lr, NULL); /* checked by dt_spec_load */
    int64_t *task[] = { &s->recall_keys, &s->recall_values, &s->recall_pairs, &s->recall_queries };
    int *tdst[] = { &o->rkeys, &o->rvalues, &o->rpairs, &o->rqueries };
    for (int i = 0; i < 4; i++)
        if (*task[i] > 0)
            *tdst[i] = (int)*task[i];
    return 0;
}

static int parse(int argc, char **argv, topts_t *o, dt_emsg_t *em)
{
    static const struct option lo[] = {
        { "model", 1, NULL, 'm' },      { "dim", 1, NULL, 1 },         { "layers", 1, NULL, 2 },
        { "heads", 1, NULL, 3 },        { "kv-heads", 1, NULL, 4 },    { "ffn", 1, NULL, 5 },
        { "vocab", 1, NULL, 6 },        { "data", 1, NULL, 'd' },      { "seq-len", 1, NULL, 'T' },
        { "steps", 1, NULL, 'n' },      { "ckpt-dir", 1, NULL, 'c' },  { "ckpt-every", 1, NULL, 'k' },
        { "ckpt-keep", 1, NULL, 'K' },  { "resume", 0, NULL, 'r' },    { "seed", 1, NULL, 's' },
        { "lr", 1, NULL, 'l' },         { "min-lr", 1, NULL, 'L' },    { "warmup", 1, NULL, 'w' },
        { "weight-decay", 1, NULL, 'W' }, { "clip", 1, NULL, 'C' },    { "layout", 1, NULL, 'y' },
        { "segments", 1, NULL, 'g' },   { "dilations", 1, NULL, 'D' }, { "no-causal", 0, NULL, 'N' },
        { "params-out", 1, NULL, 'P' }, { "batch", 1, NULL, 'B' },     { "spec", 1, NULL, 'S' },     { "adam-eps", 1, NULL, 'E' },
        { "recall-keys", 1, NULL, 7 },  { "recall-values", 1, NULL, 8 }, { "recall-pairs", 1, NULL, 9 },
        { "recall-queries", 1, NULL, 10 }, { "ckpt-commit", 1, NULL, 11 },
        { "resume-from", 1, NULL, 12 },
        { "help", 0, NULL, 'h' },     { NULL, 0, NULL, 0 },
    };
    static const char *const tasknames[] = { "recall-keys", "recall-values", "recall-pairs",
                                             "recall-queries" };
    double v;
    int c, rc;

    memset(o, 0, sizeof(*o));
    dt_model_preset("tiny", &o->model, NULL);
    o->data = "recall";
    o->layout = "zigzag";
    o->causal = 1;
    o->steps = 100;
    o->T = 1024;
    o->seed = 1;
    o->lr = 3e-3;
    o->min_lr = 3e-4;
    o->wd = 0.1;
    o->clip = 1.0;
    o->eps = 1e-5; /* LLaMA 2's AdamW epsilon */
    o->warmup = -1;
    o->ckpt_keep = 3;
    o->batch = 1;
    /* a spec file first (dt-spec(5)), flags on top of it */
    for (int i = 1; i + 1 < argc; i++)
        if (strcmp(argv[i], "--spec") == 0 && (rc = apply_spec(o, argv[i + 1], em)) < 0)
            return rc;
    opterr = 0;
    optind = 1;
    while ((c = getopt_long(argc, argv, "", lo, NULL)) != -1) {
        rc = 0;
        switch (c) {
        case 'm': case 1: case 2: case 3: case 4: case 5: case 6:
            if ((rc = dt_cmd_model_option(c, optarg, &o->model, em)) < 0)
                return rc;
            break;
        case 7: case 8: case 9: case 10:
            if ((rc = dt_cmd_number(tasknames[c - 7], optarg, 1, 1 << 20, &v, em)) < 0)
                return rc;
            (&o->rkeys)[c - 7] = (int)v; /* keys, values, pairs, queries */
            break;
        case 11:
            if (strcmp(optarg, "self") != 0 && strcmp(optarg, "external") != 0)
                return dt_emsg_set(em, DT_EUSAGE, "--ckpt-commit '%s': self or external", optarg);
            o->external = strcmp(optarg, "external") == 0;
            break;
        case 12: o->resume_from = optarg; break;
        case 'd': o->data = optarg; break;
        case 'T': rc = dt_cmd_number("seq-len", optarg, 2, 1e9, &v, em), o->T = (int64_t)v; break;
        case 'n': rc = dt_cmd_number("steps", optarg, 0, 1e9, &v, em), o->steps = (int64_t)v; break;
        case 'c': o->ckpt_dir = optarg; break;
        case 'k':
            rc = dt_cmd_number("ckpt-every", optarg, 1, 1e9, &v, em);
            o->ckpt_every = (int64_t)v;
            o->every_from_spec = 0;
            break;
        case 'K': rc = dt_cmd_number("ckpt-keep", optarg, 1, 1e6, &v, em), o->ckpt_keep = (int64_t)v; break;
        case 'r': o->resume = 1; break;
        case 's': rc = dt_cmd_number("seed", optarg, 0, 9e15, &v, em), o->seed = (uint64_t)v; break;
        case 'l': rc = dt_cmd_number("lr", optarg, 0, 10, &o->lr, em); break;
        case 'L': rc = dt_cmd_number("min-lr", optarg, 0, 10, &o->min_lr, em); break;
        case 'w': rc = dt_cmd_number("warmup", optarg, 0, 1e9, &v, em), o->warmup = (int64_t)v; break;
        case 'W': rc = dt_cmd_number("weight-decay", optarg, 0, 10, &o->wd, em); break;
        case 'C': rc = dt_cmd_number("clip", optarg, 0, 1e9, &o->clip, em); break;
        case 'E': rc = dt_cmd_number("adam-eps", optarg, 1e-30, 1, &o->eps, em); break;
        case 'y': o->layout = optarg; break;
        case 'g': o->segments = optarg; break;
        case 'D': o->dilations = optarg; break;
        case 'N': o->causal = 0; break;
        case 'S': break; /* applied above */
        case 'P': o->params_out = optarg; break;
        case 'B': rc = dt_cmd_number("batch", optarg, 1, 1 << 20, &v, em), o->batch = (int64_t)v; break;
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
    /* a spec names the interval for whoever runs it; without a directory
     * (the coordinator gives one) there is nowhere to write: none */
    if (o->ckpt_dir == NULL && o->every_from_spec)
        o->ckpt_every = 0;
    if ((o->ckpt_dir == NULL) != (o->ckpt_every == 0))
        return dt_emsg_set(em, DT_EUSAGE, "--ckpt-dir and --ckpt-every go together");
    if (o->resume && o->ckpt_dir == NULL)
        return dt_emsg_set(em, DT_EUSAGE, "--resume needs --ckpt-dir");
    if (o->resume && o->resume_from)
        return dt_emsg_set(em, DT_EUSAGE, "--resume and --resume-from exclude each other");
    if (o->warmup < 0)
        o->warmup = o->steps / 10;
    return 0;
}

/* ---- checkpoints ------------------------------------------------------------ */

static void slice(int64_t n, int R, int r, int64_t *off, int64_t *len)
{
    *off = n * r / R;
    *len = n * (r + 1) / R - *off;
}

static json_t *model_json(const dt_model_cfg_t *m)
{
    return json_pack("{s:i, s:i, s:i, s:i, s:i, s:i, s:f, s:f, s:b}", "dim", m->dim, "layers",
                     m->layers, "heads", m->heads, "kv_heads", m->kv_heads, "ffn", m->ffn,
                     "vocab", m->vocab, "rope_theta", m->rope_theta, "norm_eps",
                     (double)m->norm_eps, "tied", m->tied);
}

static json_t *cursor_json(const dt_loader_cursor_t *cur)
{
    if (cur == NULL)
        return json_null();
    return json_pack("{s:I, s:I, s:I}", "epoch", (json_int_t)cur->epoch, "shard",
                     (json_int_t)cur->shard, "seq", (json_int_t)cur->seq);
}

/* --ckpt-commit external, rank 0, before step STEP is written: a step
 * directory already there is from an earlier generation of the job that
 * went past the checkpoint the coordinator resumed us from. With the
 * COMMITTED marker it is as good as the one we would write (same step,
 * same state): *skip = 1. Without, the coordinator gave up on it: it is
 * renamed out of the step-* namespace, so no reader can take it, and
 * removed. */
static int supersede(const char *root, int64_t step, int *skip, dt_emsg_t *em)
{
    char *dir = dt_ckpt_step_dir(root, step), *old = NULL;
    struct stat st;
    int rc = 0;

    *skip = 0;
    if (lstat(dir, &st) < 0)
        goto out;
    if (dt_ckpt_is_committed(dir)) {
        fprintf(stderr, "dtengine train: %s is already committed: not written again\n", dir);
        *skip = 1;
        goto out;
    }
    old = dt_xasprintf("%s/.step-%08lld.superseded.%ld", root, (long long)step, (long)getpid());
    if (rename(dir, old) < 0) {
        int e = errno;
        rc = dt_emsg_set(em, dt_err_errno(e), "%s: cannot move the uncommitted checkpoint "
                         "aside: %s", dir, strerror(e));
        goto out;
    }
    fprintf(stderr, "dtengine train: %s was never committed: writing it again\n", dir);
    dt_emsg_t sub = { "" };
    if (dt_rmtree(old, &sub) < 0)
        fprintf(stderr, "dtengine train: %s\n", sub.s);
out:
    free(old);
    free(dir);
    return rc;
}

/* The step directory's absolute path for the agent, which runs elsewhere. */
static char *abs_dir(const char *dir)
{
    char *p = realpath(dir, NULL);

    return p ? p : dt_xstrdup(dir);
}

/* Write checkpoint STEP (all ranks). Under an agent, every rank then
 * reports its shard, and rank 0 the manifest. */
static int save(dt_comm_t *comm, const topts_t *o, int64_t step, int64_t n, const float *P,
                const float *M, const float *V, const dt_loader_cursor_t *cur, dt_emsg_t *em)
{
    int R = dt_comm_size(comm), me = dt_comm_rank(comm), rc = 0, who, skip = 0;
    dt_ckpt_shard_t *recs = me == 0 ? dt_xcalloc((size_t)R, sizeof(*recs)) : NULL, mine;
    int64_t off, len, man_bytes = 0;
    char buf[32], man_sha[65] = "", *dir = NULL;

    dt_wlink_heartbeat();
    if (me == 0 && o->external)
        rc = supersede(o->ckpt_dir, step, &skip, em);
    if (me == 0 && rc == 0 && !skip)
        rc = dt_ckpt_begin(o->ckpt_dir, step, em);
    if ((rc = dt_comm_agree(comm, rc, 0, &who)) < 0 ||
        (rc = dt_comm_bcast_int(comm, &skip)) < 0 || skip)
        goto out;
    slice(n, R, me, &off, &len);
    dt_st_writer_t *w = dt_st_writer_new();
    dt_st_writer_add(w, "params", DT_ST_F32, 1, &len, P + off, em);
    dt_st_writer_add(w, "adam_m", DT_ST_F32, 1, &len, M + off, em);
    dt_st_writer_add(w, "adam_v", DT_ST_F32, 1, &len, V + off, em);
    dt_st_writer_meta(w, "format", "dt-train-1", em);
    snprintf(buf, sizeof(buf), "%" PRId64, off);
    dt_st_writer_meta(w, "offset", buf, em);
    snprintf(buf, sizeof(buf), "%" PRId64, n);
    dt_st_writer_meta(w, "nparams", buf, em);
    rc = dt_ckpt_write_shard(o->ckpt_dir, step, me, R, w, &mine, em);
    dt_st_writer_free(w);
    dt_wlink_heartbeat();
    if ((rc = dt_comm_agree(comm, rc, 0, &who)) < 0)
        goto out;
    if (me != 0) {
        rc = dt_comm_send(comm, &mine, sizeof(mine), 0, TAG_SHARD);
    } else {
        recs[0] = mine;
        for (int q = 1; q < R && rc == 0; q++)
            rc = dt_comm_recv(comm, &recs[q], sizeof(recs[q]), q, TAG_SHARD);
        if (rc == 0) {
            dt_ckpt_manifest_t man = { .step = step, .ranks = R, .model = model_json(&o->model),
                                       .plan = json_pack("{s:s, s:I, s:I}", "layout", o->layout,
                                                         "seq_len", (json_int_t)o->T, "batch",
                                                         (json_int_t)o->batch),
                                       .rng = json_pack("{s:I, s:s, s:o}", "seed",
                                                        (json_int_t)o->seed, "data", o->data,
                                                        "cursor", cursor_json(cur)),
                                       .data_cursor = step, .shards = recs };
            rc = dt_ckpt_write_manifest(o->ckpt_dir, &man, em);
            if (rc == 0)
                rc = dt_ckpt_commit(o->ckpt_dir, step, NULL, em);
            /* external: the coordinator decides what to keep */
            if (rc == 0 && !o->external && dt_ckpt_prune(o->ckpt_dir, (int)o->ckpt_keep, em) < 0)
                rc = 0; /* pruning is housekeeping: the checkpoint is safe */
            json_decref(man.model);
            json_decref(man.plan);
            json_decref(man.rng);
        }
        if (rc == 0 && dt_wlink_active()) {
            char *sdir = dt_ckpt_step_dir(o->ckpt_dir, step);
            char *path = dt_xasprintf("%s/%s", sdir, DT_CKPT_MANIFEST);
            struct stat st;
            if ((rc = dt_sha256_file(path, man_sha, em)) == 0 && stat(path, &st) == 0)
                man_bytes = (int64_t)st.st_size;
            free(path);
            free(sdir);
        }
        dt_wlink_heartbeat();
    }
    if ((rc = dt_comm_agree(comm, rc, 0, &who)) < 0 || !dt_wlink_active())
        goto out;
    /* renamed into place: only now do the files have their final names */
    char *sdir = dt_ckpt_step_dir(o->ckpt_dir, step);
    dir = abs_dir(sdir);
    free(sdir);
    dt_wlink_shard(step, dir, mine.file, mine.bytes, mine.sha256, 0);
    if (me == 0)
        dt_wlink_shard(step, dir, DT_CKPT_MANIFEST, man_bytes, man_sha, 1);
out:
    free(dir);
    free(recs);
    return rc;
}

/* What --resume passed over: with --ckpt-commit self, the step
 * directories whose content does not verify. This run will write those
 * steps again, and dt_ckpt_begin never overwrites a step directory, so
 * rank 0 sets them aside (set_aside) once every rank has loaded. */
typedef struct passed {
    int me, external;
    int64_t *steps;
    int n;
} passed_t;

static void skipped(const char *dir, int err, const char *why, void *ud)
{
    passed_t *p = ud;
    const char *base = strrchr(dir, '/');
    char *end;
    long long step;

    if (p->me == 0)
        fprintf(stderr, "dtengine train: skipping checkpoint %s: %s\n", dir, why);
    dt_wlink_heartbeat(); /* each candidate was read in full */
    base = base ? base + 1 : dir;
    /* not a temp directory, not one waiting for the coordinator's marker,
     * not one that could not be read now (DT_EIO, DT_EACCES: it may be
     * good): a step whose files are wrong or missing */
    if (p->external || strncmp(base, "step-", 5) != 0 || (err != DT_EFORMAT && err != DT_ENOENT))
        return;
    step = strtoll(base + 5, &end, 10);
    if (*end != '\0' || step < 0)
        return;
    p->steps = dt_xrealloc(p->steps, (size_t)(p->n + 1) * sizeof(*p->steps));
    p->steps[p->n++] = step;
}

/* Rank 0: move the steps --resume passed over out of the step-* namespace
 * (to step-NNNNNNNN.corrupt, .corrupt.2, ...: kept for inspection, never
 * read or pruned), so that this run, and any retry of it, can write them
 * again. */
static int set_aside(const topts_t *o, const passed_t *p, dt_emsg_t *em)
{
    int rc = 0;

    for (int i = 0; i < p->n && rc == 0; i++) {
        char *to = NULL;
        if ((rc = dt_ckpt_set_aside(o->ckpt_dir, p->steps[i], "corrupt", &to, em)) == 0)
            fprintf(stderr, "dtengine train: step %lld does not verify: moved aside to %s "
                    "(written again when training passes it)\n", (long long)p->steps[i], to);
        free(to);
    }
    return rc;
}

static void heartbeat(void *ud)
{
    (void)ud;
    dt_wlink_heartbeat(); /* each shard was read in full */
}

/* Load --resume-from's directory, or the newest valid checkpoint under
 * --ckpt-dir (with a COMMITTED marker under --ckpt-commit external);
 * *step = 0 when there is none. */
static int load(dt_comm_t *comm, const topts_t *o, int64_t n, float *P, float *M, float *V,
                dt_loader_t *loader, int64_t *step, passed_t *passed, dt_emsg_t *em)
{
    int rc;
    char *dir = NULL;
    int64_t s = 0;
    dt_ckpt_manifest_t man = { 0 };

    *step = 0;
    dt_wlink_heartbeat();
    if (o->resume_from) {
        /* the coordinator picked it without reading it (the files are the
         * job owner's): DT_ECKPT (exit 6) tells it to take the one before */
        if ((rc = dt_ckpt_verify(o->resume_from, em)) < 0) {
            dt_emsg_t why = *em;
            return dt_emsg_set(em, DT_ECKPT, "--resume-from: %s", why.s);
        }
        dir = dt_xstrdup(o->resume_from);
    } else {
        rc = dt_ckpt_latest(o->ckpt_dir, o->external ? DT_CKPT_REQUIRE_COMMITTED : 0, skipped,
                            passed, &dir, &s, em);
        if (rc < 0 || dir == NULL)
            return rc;
    }
    dt_wlink_heartbeat();
    if ((rc = dt_ckpt_manifest_read(dir, &man, em)) < 0)
        goto out;
    json_t *want = model_json(&o->model);
    if (!json_equal(want, man.model)) {
        rc = dt_emsg_set(em, DT_EINVAL, "%s: written for another model shape", dir);
        json_decref(want);
        goto out;
    }
    json_decref(want);
    rc = dt_ckpt_read_train(dir, &man, n, P, M, V, heartbeat, NULL, em);
    if (rc == 0 && loader) {
        json_t *cj = json_object_get(man.rng, "cursor");
        static const char *const fields[] = { "epoch", "shard", "seq" };
        json_int_t v[3] = { 0, 0, 0 };
        if (!json_is_object(cj))
            rc = dt_emsg_set(em, DT_EFORMAT, "%s: the manifest has no data cursor for %s", dir,
                             o->data);
        /* each a non-negative integer (json_integer_value reads anything
         * else as 0); dt_loader_set_cursor checks the ranges */
        for (int i = 0; i < 3 && rc == 0; i++) {
            json_t *f = json_object_get(cj, fields[i]);
            if (!json_is_integer(f) || (v[i] = json_integer_value(f)) < 0)
                rc = dt_emsg_set(em, DT_EFORMAT, "%s: the manifest's data cursor has no "
                                 "non-negative integer '%s'", dir, fields[i]);
        }
        if (rc == 0) {
            dt_loader_cursor_t cur = { .epoch = (uint64_t)v[0], .shard = v[1], .seq = v[2] };
            rc = dt_loader_set_cursor(loader, &cur, em);
        }
    }
    if (rc == 0) {
        *step = man.step;
        if (passed->me == 0)
            fprintf(stderr, "dtengine train: resuming from %s (written by %d ranks)\n", dir,
                    man.ranks);
    }
out:
    dt_ckpt_manifest_close(&man);
    free(dir);
    return rc;
}

/* ---- the command ------------------------------------------------------------ */

int dt_cmd_train(dt_comm_t *comm, int argc, char **argv)
{
    int R = dt_comm_size(comm), me = dt_comm_rank(comm), rc, who;
    dt_emsg_t em = { "" };
    topts_t o;
    dt_attn_spec_t attn = { 0 };
    dt_recall_opts_t task;
    dt_model_layout_t lo = { 0 };
    dt_model_t *m = NULL;
    float *P = NULL, *G = NULL, *Gb = NULL, *M = NULL, *V = NULL;
    int32_t *xs = NULL, *ys = NULL, *x = NULL, *y = NULL;
    int64_t *pos = NULL, start = 0;
    dt_loader_t *loader = NULL;
    double last_loss = NAN; /* of the last step this run took */
    /* accuracy of the last ACC_WINDOW steps, for the result (one step's is
     * a handful of answers) */
    enum { ACC_WINDOW = 50 };
    double acc_win[ACC_WINDOW];
    int64_t acc_n = 0;
    int stopped = 0;        /* W_STOP: exit DT_EXIT_STOPPED */
    passed_t passed = { .me = me };
    int owed = 0;           /* W_CHECKPOINTs already acted on before ours arrived */

    rc = parse(argc, argv, &o, &em);
    if (rc == 1) {
        if (me == 0)
            usage(stdout);
        return DT_EXIT_OK;
    }
    if (rc == 0)
        rc = dt_model_cfg_check(&o.model, &em);
    int recall = rc == 0 && strcmp(o.data, "recall") == 0;
    dt_recall_opts_default(&task);
    task.T = o.T;
    task.seed = o.seed;
    /* planted pairs must fit in 10% of the sequence: the default count
     * shrinks to fit, a given one is checked */
    int pairs = (int)((o.T + 1) / 10 - 1) / 3;
    task.n_pairs = o.rpairs ? o.rpairs : pairs < task.n_pairs ? pairs : task.n_pairs;
    task.n_queries = o.rqueries ? o.rqueries
                     : task.n_pairs < task.n_queries ? task.n_pairs : task.n_queries;
    task.n_keys = o.rkeys ? o.rkeys : task.n_keys;
    task.n_values = o.rvalues ? o.rvalues : task.n_values;
    /* the filler takes the rest of the model's vocabulary */
    int64_t filler = (int64_t)o.model.vocab - DT_RECALL_NSPECIAL - task.n_keys - task.n_values;
    task.n_filler = filler >= 1 ? (int)filler : 1;
    if (rc == 0 && !recall) {
        dt_loader_opts_t lopt = { .T = o.T, .shuffle = 1, .seed = o.seed, .vocab = o.model.vocab };
        rc = dt_loader_new_glob(o.data, &lopt, &loader, &em);
    }
    if (rc == 0 && recall && task.n_pairs < 1)
        rc = dt_emsg_set(&em, DT_EINVAL, "--seq-len %lld is too short for the recall task "
                         "(at least 40)", (long long)o.T);
    if (rc == 0 && recall && (rc = dt_recall_check(&task, &em)) == 0 &&
        dt_recall_vocab(&task) > o.model.vocab)
        rc = dt_emsg_set(&em, DT_EINVAL, "the recall task needs a vocabulary of %lld, the model "
                         "has %d", (long long)dt_recall_vocab(&task), o.model.vocab);
    attn.T = o.T;
    attn.H = o.model.heads;
    attn.Hkv = o.model.kv_heads;
    attn.D = o.model.dim / o.model.heads;
    attn.causal = o.causal;
    if (rc == 0 && dt_layout_parse(o.layout, &attn.layout) < 0)
        rc = dt_emsg_set(&em, DT_EUSAGE, "--layout '%s': contiguous or zigzag", o.layout);
    if (rc == 0)
        rc = dt_attn_parse_branches(&attn, o.segments, o.dilations, &em);
    if (rc == 0)
        rc = dt_attn_check(&attn, R, &em);
    if ((rc = dt_comm_agree(comm, rc, 0, &who)) < 0) {
        if (me == who)
            fprintf(stderr, "dtengine train: %s\n", em.s);
        dt_loader_free(loader);
        dt_spec_free(&o.spec);
        return dt_exit_code(rc);
    }

    int64_t c = dt_layout_local(o.T, R);
    dt_model_layout_init(&lo, &o.model);
    int64_t n = lo.nparams;
    m = dt_model_new(&o.model, c);
    P = dt_xcalloc((size_t)n, sizeof(float));
    G = dt_xcalloc((size_t)n, sizeof(float));
    if (o.batch > 1)
        Gb = dt_xcalloc((size_t)n, sizeof(float));
    M = dt_xcalloc((size_t)n, sizeof(float));
    V = dt_xcalloc((size_t)n, sizeof(float));
    xs = dt_xmallocarray((size_t)o.T, sizeof(int32_t));
    ys = dt_xmallocarray((size_t)o.T, sizeof(int32_t));
    x = dt_xmallocarray((size_t)c, sizeof(int32_t));
    y = dt_xmallocarray((size_t)c, sizeof(int32_t));
    pos = dt_xmallocarray((size_t)c, sizeof(int64_t));
    dt_layout_positions(attn.layout, o.T, R, me, pos);
    dt_model_init(&o.model, &lo, o.seed, P);
    rc = 0;
    passed.external = o.external;
    if (o.resume || o.resume_from)
        rc = load(comm, &o, n, P, M, V, loader, &start, &passed, &em);
    if ((rc = dt_comm_agree(comm, rc, 0, &who)) < 0) {
        if (me == who)
            fprintf(stderr, "dtengine train: %s\n", em.s);
        goto out;
    }
    /* every rank has chosen and read its checkpoint: only now are the
     * ones passed over renamed */
    if (me == 0)
        rc = set_aside(&o, &passed, &em);
    if ((rc = dt_comm_agree(comm, rc, 0, &who)) < 0) {
        if (me == who)
            fprintf(stderr, "dtengine train: %s\n", em.s);
        goto out;
    }
    if (me == 0)
        printf("train: model dim=%d layers=%d heads=%d/%d ffn=%d vocab=%d params=%lld "
               "tokens=%lld batch=%lld ranks=%d layout=%s steps=%lld start=%lld\n",
               o.model.dim, o.model.layers, o.model.heads, o.model.kv_heads, o.model.ffn,
               o.model.vocab, (long long)n, (long long)o.T, (long long)o.batch, R, o.layout,
               (long long)o.steps,
               (long long)start);

    dt_adamw_cfg_t acfg = { .beta1 = 0.9, .beta2 = 0.95, .eps = o.eps, .weight_decay = o.wd };
    dt_lr_sched_t sched = { .max_lr = o.lr, .min_lr = o.min_lr, .warmup = o.warmup,
                            .total = o.steps };
    for (int64_t step = start; step < o.steps; step++) {
        double t0 = dt_clock_now(), loss = 0;
        /* recall hits and targets, then the agent's requests on this rank */
        double acc[5] = { 0, 0, 0, 0, 0 };
        /* B sequences per step: the gradient is the mean of theirs */
        for (int64_t b = 0; b < o.batch && rc == 0; b++) {
            double lb;
            if (loader)
                rc = dt_loader_next(loader, xs, ys, &em);
            else
                rc = dt_recall_xy(&task, (uint64_t)(step * o.batch + b), xs, ys, &em);
            if (rc < 0)
                break;
            for (int64_t i = 0; i < c; i++) {
                x[i] = xs[pos[i]];
                y[i] = ys[pos[i]];
            }
            if ((rc = dt_model_step(m, comm, &attn, P, x, y, pos, o.batch > 1 ? Gb : G, &lb,
                                    &em)) < 0)
                break;
            loss += lb / (double)o.batch;
            if (o.batch > 1)
                for (int64_t i = 0; i < n; i++)
                    G[i] = (b == 0 ? 0.0f : G[i]) + Gb[i] / (float)o.batch;
            /* accuracy at this rank's counted targets, summed over ranks below */
            const float *lg = dt_model_logits(m);
            for (int64_t i = 0; i < c; i++) {
                if (y[i] < 0)
                    continue;
                const float *row = lg + i * o.model.vocab;
                int best = 0;
                for (int v = 1; v < o.model.vocab; v++)
                    best = row[v] > row[best] ? v : best;
                acc[0] += best == y[i];
                acc[1] += 1;
            }
        }
        if (rc < 0)
            break;
        /* The agent sends each request to every rank, and they arrive at
         * different steps: any rank's request is acted on by all at once,
         * and a rank whose copy comes later has it already done (owed). */
        int req = dt_wlink_poll(), ask = (req & DT_WLINK_CHECKPOINT) != 0;
        if (ask && owed > 0) {
            owed--;
            ask = 0;
        }
        acc[2] = ask;
        acc[3] = (req & DT_WLINK_STOP) != 0;
        acc[4] = (req & DT_WLINK_STOP_CKPT) != 0;
        dt_comm_allreduce_sum_f64(comm, acc, 5);
        int ckpt_asked = acc[2] > 0, stop = acc[3] > 0;
        if (ckpt_asked && !ask)
            owed++;
        ckpt_asked |= stop && acc[4] > 0;
        dt_loader_cursor_t cursor = { 0 };
        if (loader)
            dt_loader_get_cursor(loader, &cursor);
        double norm = dt_grad_clip(n, G, o.clip);
        if (!isfinite(loss) || !isfinite(norm)) {
            /* every rank has the same loss and norm: all stop here. A run
             * resumed from a checkpoint diverges again at the same step,
             * which the coordinator takes for a deterministic failure */
            rc = dt_emsg_set(&em, DT_EDIVERGED, "step %lld: loss %g, gradient norm %g: "
                             "training diverged (a lower --lr, or more --warmup)",
                             (long long)step, loss, norm);
            break;
        }
        double lr = dt_lr_at(&sched, step);
        dt_adamw_step(&acfg, step + 1, lr, o.wd, n, P, G, M, V);
        double dt = dt_clock_now() - t0, accuracy = acc[1] > 0 ? acc[0] / acc[1] : 0.0;
        int64_t done = step + 1;
        if (me == 0) {
            /* accuracy at the counted targets: recall accuracy for the recall
             * task, next-token accuracy for token shards */
            printf("step %lld loss %.9f tokens/s %.0f %s %.3f lr %.3g norm %.4g\n",
                   (long long)step, loss, (double)(o.T * o.batch) / dt, loader ? "acc" : "recall",
                   accuracy, lr, norm);
            fflush(stdout);
        }
        last_loss = loss;
        acc_win[acc_n++ % ACC_WINDOW] = accuracy;
        dt_wlink_progress(done, o.steps, done * o.T * o.batch, loss,
                          (double)(o.T * o.batch) / dt, accuracy);
        if (ckpt_asked && o.ckpt_dir == NULL && me == 0)
            fprintf(stderr, "dtengine train: step %lld: the agent asked for a checkpoint, but "
                    "there is no --ckpt-dir: none written\n", (long long)done);
        if (o.ckpt_dir && (done % o.ckpt_every == 0 || ckpt_asked)) {
            double t1 = dt_clock_now();
            if ((rc = save(comm, &o, done, n, P, M, V, loader ? &cursor : NULL, &em)) < 0)
                break;
            /* parameters and both moments, written and fsynced by all ranks */
            if (me == 0) {
                printf("checkpoint step %lld bytes %lld seconds %.4f\n", (long long)done,
                       (long long)(3 * n * (int64_t)sizeof(float)), dt_clock_now() - t1);
                fflush(stdout);
            }
        }
        /* a stop after the last step is a finished run */
        if (stop && done < o.steps) {
            if (me == 0) {
                printf("stopped at step %lld\n", (long long)done);
                fflush(stdout);
            }
            stopped = 1;
            break;
        }
    }
    if ((rc = dt_comm_agree(comm, rc, 0, &who)) < 0) {
        if (me == who)
            fprintf(stderr, "dtengine train: %s\n", em.s);
        goto out;
    }
    if (stopped)
        goto out;
    if (me == 0 && o.params_out &&
        (rc = dt_npy_save(o.params_out, DT_DTYPE_F32, 1, &n, P, &em)) < 0)
        fprintf(stderr, "dtengine train: %s\n", em.s);
    if (rc == 0 && me == 0) {
        char hex[65];
        dt_sha256_hex(P, (size_t)(n) * sizeof(float), hex);
        /* loss last: scripts read params_sha256 where it always was */
        printf("result: steps=%lld params_sha256=%s loss=%.9f\n", (long long)o.steps, hex,
               last_loss);
        fflush(stdout);
        double acc_mean = 0;
        int64_t k = acc_n < ACC_WINDOW ? acc_n : ACC_WINDOW;
        for (int64_t i = 0; i < k; i++)
            acc_mean += acc_win[i] / (double)k;
        dt_wlink_result(o.steps, last_loss, k ? acc_mean : NAN, hex);
    }
out:
    free(passed.steps);
    dt_loader_free(loader);
    dt_spec_free(&o.spec);
    dt_model_free(m);
    dt_model_layout_close(&lo);
    free(P);
    free(G);
    free(Gb);
    free(M);
    free(V);
    free(xs);
    free(ys);
    free(x);
    free(y);
    free(pos);
    return rc == 0 && stopped ? DT_EXIT_STOPPED : dt_exit_code(rc);
}
