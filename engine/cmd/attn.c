/* SPDX-License-Identifier: MIT
 *
 * `dtengine attn`: exact attention over the job's ranks, reading Q, K, V
 * from .npy files (or generating them in place) and writing O, LSE and,
 * with --dout, the gradients. Every rank reads only its own rows; rank 0
 * writes whole outputs (other ranks send it their rows), or with --out-dir
 * every rank writes its own shard. Outputs are written atomically: on any
 * error no output file is left behind.
 *
 * Not here: the attention itself (engine/attn/attn.c).
 */
#include "config.h"

#include <cblas.h>
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <unistd.h>

#include <dirent.h>
#include <jansson.h>

#include "common/fileio.h"
#include "common/log.h"
#include "common/mem.h"
#include "common/sha256.h"
#include "engine/cmd/agree.h"
#include "engine/attn/attn.h"
#include "engine/attn/attn_gpu.h"
#include "engine/cmd/cmd.h"
#include "engine/data/gen.h"
#include "engine/wlink.h"
#include "io/npy.h"
#include "kernels/cpu/attn_cpu.h"
#include "spec/model.h"
#include "engine/cmd/options.h"
#include "io/maskfile.h"
#include "spec/mask_rules.h"
#include "spec/spec.h"

enum { TAG_OUT = 201, TAG_SHA };

/* --out-dir's manifest, written last by rank 0 */
#define ATTN_MANIFEST "attn.json"
#define ATTN_FORMAT "dt-attn-1"

/* generated tensors: the stream number of each */
enum { STREAM_Q = 1, STREAM_K = 2, STREAM_V = 3, STREAM_DOUT = 4 };

typedef struct opts {
    const char *q, *k, *v, *out, *lse, *out_dir;
    const char *dout, *dq, *dk, *dv;
    const char *segments, *dilations, *layout, *generate;
    unsigned long long seed;
    int causal, stats, threads, backward, print;
    int nondet; /* deterministic = no */
    int cuda, fp16; /* --device cuda, --dtype fp16 */
    float scale;
    dt_mask_args_t mask; /* --doc-lengths, --sliding-window, --block-mask, --mask-block */
    dt_mask_rules_t rules; /* --block-pattern, --block-size (and the window) */
    dt_spec_t spec;   /* --spec FILE: the strings above may point into it */
    char gen[128];    /* --generate's value made from the spec */
} opts_t;

static void usage(FILE *f)
{
    fprintf(f,
            "usage: dtengine attn --q Q.npy --k K.npy --v V.npy --out O.npy [--lse LSE.npy]\n"
            "                     [--no-causal] [--segments w1,w2,... --dilations r1,r2,...]\n"
            "                     [--layout contiguous|zigzag|balanced] [--scale S]\n"
            "                     [--doc-lengths L1,L2,...|LENGTHS.npy] [--sliding-window W]\n"
            "                     [--block-mask MASK.npy|ROWPTR.npy,COLS.npy --mask-block B]\n"
            "                     [--block-pattern P [--block-size B]]\n"
            "                     [--dout dO.npy --dq dQ.npy --dk dK.npy --dv dV.npy]\n"
            "                     [--backward] [--out-dir DIR] [--threads N] [--stats]\n"
            "                     [--device cpu|cuda [--dtype bf16|fp16]] [--print-settings]\n"
            "       dtengine attn --generate T,H,Hkv,D --seed S [...]\n"
            "       dtengine attn --spec JOB.spec [--out-dir DIR] [...]\n"
            "Q is (T, H, D), K and V (T, Hkv, D), float32 or float16; O is written\n"
            "(T, H, D) float32 and LSE (H, T) float32. Causal unless --no-causal (the\n"
            "job-spec default; --causal is accepted); the layout follows it. See dtengine(1).\n");
}

/* attn's own options; the rest are job-spec keys (engine/cmd/options.h) */
enum { O_Q = 1, O_K, O_V, O_OUT, O_LSE, O_DOUT, O_DQ, O_DK, O_DV, O_GEN, O_STATS, O_THREADS,
       O_SCALE, O_BACKWARD, O_DOCS, O_BLOCKS, O_BLOCK };
static const dt_cmd_opt_t own_options[] = {
    { "q", 1, O_Q },          { "k", 1, O_K },           { "v", 1, O_V },
    { "out", 1, O_OUT },      { "lse", 1, O_LSE },       { "dout", 1, O_DOUT },
    { "dq", 1, O_DQ },        { "dk", 1, O_DK },         { "dv", 1, O_DV },
    { "generate", 1, O_GEN }, { "stats", 0, O_STATS },   { "threads", 1, O_THREADS },
    { "scale", 1, O_SCALE },  { "backward", 0, O_BACKWARD },
    { "doc-lengths", 1, O_DOCS },
    { "block-mask", 1, O_BLOCKS }, { "mask-block", 1, O_BLOCK }, { NULL, 0, 0 },
};

static int own_option(int id, const char *value, void *arg, dt_emsg_t *em)
{
    opts_t *o = arg;
    const char **path[] = { [O_Q] = &o->q,       [O_K] = &o->k,     [O_V] = &o->v,
                            [O_OUT] = &o->out,   [O_LSE] = &o->lse, [O_DOUT] = &o->dout,
                            [O_DQ] = &o->dq,     [O_DK] = &o->dk,   [O_DV] = &o->dv,
                            [O_GEN] = &o->generate };
    char *end;

    switch (id) {
    case O_STATS:
        o->stats = 1;
        return 0;
    case O_BACKWARD:
        o->backward = 1;
        return 0;
    case O_THREADS:
        o->threads = (int)strtol(value, &end, 10);
        if (*value == '\0' || *end != '\0' || o->threads < 1 || o->threads > 1024)
            return dt_emsg_set(em, DT_EUSAGE, "--threads '%s' must be 1 to 1024", value);
        return 0;
    case O_SCALE:
        o->scale = strtof(value, &end);
        if (*value == '\0' || *end != '\0' || !(o->scale > 0.0f) || isinf(o->scale))
            return dt_emsg_set(em, DT_EUSAGE, "--scale '%s' must be a positive number", value);
        return 0;
    case O_DOCS:
        o->mask.doc_lengths = value;
        return 0;
    case O_BLOCKS:
        o->mask.block_mask = value;
        return 0;
    case O_BLOCK: {
        long long x = strtoll(value, &end, 10);
        if (*value == '\0' || *end != '\0' || x < 1)
            return dt_emsg_set(em, DT_EUSAGE, "--mask-block '%s' must be a positive integer",
                               value);
        o->mask.block = x;
        return 0;
    }
    default:
        *path[id] = value;
        return 0;
    }
}

/* Options (and --spec) into o: the attention and the device from the job
 * spec they make, with the key table's defaults (spec/spec.h: causal
 * unless --no-causal, the layout following it); a spec file of kind attn
 * also gives the generated inputs' shape from tokens and the model (H =
 * heads, Hkv = kv_heads, D = the head width) and output_dir as --out-dir. */
static int parse_opts(int argc, char **argv, opts_t *o, dt_emsg_t *em)
{
    dt_spec_t *s = &o->spec;
    int rc;

    dt_cmd_common_t c;

    memset(o, 0, sizeof(*o));
    o->threads = 1;
    if ((rc = dt_cmd_options(argc, argv, DT_KIND_ATTN, own_options, own_option, o, s, &c,
                             em)) != 0)
        return rc;
    o->print = c.print;
    o->cuda = dt_spec_device_id(s) == DT_DEVICE_CUDA;
    o->fp16 = dt_spec_dtype_id(s) == DT_F16;
    o->causal = dt_spec_causal(s);
    o->nondet = !dt_spec_deterministic(s);
    o->layout = dt_layout_name(dt_spec_layout(s));
    o->segments = s->segments;
    o->dilations = s->dilations;
    o->seed = (unsigned long long)dt_spec_int(s, "seed");
    o->out_dir = s->output_dir;
    /* the spec's mask keys: the window, and a block pattern (the rest of
     * the masks are attn's own options, files) */
    o->mask.window = s->sliding_window;
    if ((rc = dt_spec_check_masks(s, em)) < 0)
        return rc;
    dt_spec_mask_rules(s, &o->rules);
    if (dt_mask_rules_pattern(&o->rules) && o->mask.block_mask != NULL)
        return dt_emsg_set(em, DT_EUSAGE, "--block-pattern and --block-mask exclude each other "
                           "(one block mask)");
    if (s->tokens > 0 && o->generate == NULL) { /* from a --spec */
        dt_model_cfg_t m;
        if ((rc = dt_model_from_spec(s, &m, em)) < 0)
            return rc;
        snprintf(o->gen, sizeof(o->gen), "%lld,%d,%d,%d", (long long)s->tokens, m.heads,
                 m.kv_heads, dt_model_head_dim(&m));
        o->generate = o->gen;
    }
    if (o->cuda && !dt_attn_gpu_built())
        return dt_emsg_set(em, DT_EUSAGE, "--device cuda: this dtengine was built without "
                           "CUDA (configure --with-cuda)");
    if (o->generate == NULL && (o->q == NULL || o->k == NULL || o->v == NULL))
        return dt_emsg_set(em, DT_EUSAGE, "give --q, --k and --v, or --generate T,H,Hkv,D");
    if (o->generate != NULL && (o->q || o->k || o->v))
        return dt_emsg_set(em, DT_EUSAGE, "--generate makes Q, K and V: do not also give "
                           "--q, --k or --v");
    int ngrad = (o->dq != NULL) + (o->dk != NULL) + (o->dv != NULL);
    if (o->generate != NULL && o->dout != NULL)
        return dt_emsg_set(em, DT_EUSAGE, "--generate makes dO too (stream 4): do not also give "
                           "--dout; use --backward");
    if (ngrad > 0 && ngrad < 3)
        return dt_emsg_set(em, DT_EUSAGE, "--dq, --dk and --dv go together");
    if (o->dout && ngrad == 0 && o->out_dir == NULL)
        return dt_emsg_set(em, DT_EUSAGE, "--dout needs --dq, --dk and --dv (or --out-dir)");
    if (o->generate == NULL && o->dout == NULL && (ngrad > 0 || o->backward))
        return dt_emsg_set(em, DT_EUSAGE, "the backward pass needs --dout (or --generate)");
    if (o->out_dir && (o->out || o->lse || ngrad))
        return dt_emsg_set(em, DT_EUSAGE, "--out-dir writes every output: do not also give "
                           "--out, --lse, --dq, --dk or --dv");
    return 0;
}

/* ---- inputs ------------------------------------------------------------ */

typedef struct input {
    dt_attn_spec_t spec;
    dt_mask_t mask; /* spec.mask points here when a part is given */
    dt_npy_info_t qi, ki, vi, di;
    int bwd;
} input_t;

static int check_3d(const char *path, const dt_npy_info_t *i, dt_emsg_t *em)
{
    if (i->dtype != DT_F32 && i->dtype != DT_F16)
        return dt_emsg_set(em, DT_EDTYPE, "%s: dtype %s; float32 or float16 expected", path,
                           dt_npy_dtype_name(i->dtype));
    if (i->ndim != 3)
        return dt_emsg_set(em, DT_ESHAPE, "%s: %d dimensions; 3 expected (T, heads, D)", path,
                           i->ndim);
    return 0;
}

static int parse_generate(const char *s, dt_attn_spec_t *sp, dt_emsg_t *em)
{
    long long v[4];
    int n = 0;
    const char *p = s;
    char *end;

    while (n < 4) {
        v[n] = strtoll(p, &end, 10);
        if (end == p || v[n] <= 0)
            break;
        n++;
        if (*end != ',')
            break;
        p = end + 1;
    }
    if (n != 4 || *end != '\0' || v[1] > 1 << 16 || v[2] > 1 << 16 || v[3] > 1 << 16)
        return dt_emsg_set(em, DT_EUSAGE, "--generate '%s': expected T,H,Hkv,D positive "
                           "integers", s);
    sp->T = v[0];
    sp->H = (int)v[1];
    sp->Hkv = (int)v[2];
    sp->D = (int)v[3];
    return 0;
}

static int prepare(const opts_t *o, int R, input_t *in, dt_emsg_t *em)
{
    dt_attn_spec_t *s = &in->spec;
    int rc;

    memset(in, 0, sizeof(*in));
    s->causal = o->causal;
    s->nondet = o->nondet;
    s->scale = o->scale;
    if (dt_layout_parse(o->layout, &s->layout) < 0)
        return dt_emsg_set(em, DT_EUSAGE, "--layout '%s': contiguous, zigzag or balanced",
                           o->layout);
    if ((rc = dt_vocab_layout_runs(o->cuda ? DT_DEVICE_CUDA : DT_DEVICE_CPU, s->layout, em)) < 0)
        return rc;
    if ((rc = dt_attn_parse_branches(s, o->segments, o->dilations, em)) < 0)
        return rc;
    in->bwd = o->dout != NULL || o->dq != NULL || o->backward;
    if (o->generate) {
        if ((rc = parse_generate(o->generate, s, em)) < 0)
            return rc;
    } else {
        if ((rc = dt_npy_read_header(o->q, &in->qi, em)) < 0 ||
            (rc = dt_npy_read_header(o->k, &in->ki, em)) < 0 ||
            (rc = dt_npy_read_header(o->v, &in->vi, em)) < 0)
            return rc;
        if ((rc = check_3d(o->q, &in->qi, em)) < 0 || (rc = check_3d(o->k, &in->ki, em)) < 0 ||
            (rc = check_3d(o->v, &in->vi, em)) < 0)
            return rc;
        const int64_t *qs = in->qi.shape, *ks = in->ki.shape, *vs = in->vi.shape;
        if (ks[0] != vs[0] || ks[1] != vs[1] || ks[2] != vs[2])
            return dt_emsg_set(em, DT_ESHAPE, "%s is (%lld, %lld, %lld) but %s is (%lld, %lld, "
                               "%lld): K and V must have the same shape",
                               o->k, (long long)ks[0], (long long)ks[1], (long long)ks[2], o->v,
                               (long long)vs[0], (long long)vs[1], (long long)vs[2]);
        if (qs[0] != ks[0])
            return dt_emsg_set(em, DT_ESHAPE, "%s has T=%lld tokens but %s has %lld", o->q,
                               (long long)qs[0], o->k, (long long)ks[0]);
        if (qs[2] != ks[2])
            return dt_emsg_set(em, DT_ESHAPE, "%s has head dim D=%lld but %s has %lld", o->q,
                               (long long)qs[2], o->k, (long long)ks[2]);
        if (qs[1] > 1 << 16 || qs[2] > 1 << 16)
            return dt_emsg_set(em, DT_ESHAPE, "%s: %lld heads of dim %lld is beyond the limit "
                               "of 65536", o->q, (long long)qs[1], (long long)qs[2]);
        s->T = qs[0];
        s->H = (int)qs[1];
        s->Hkv = (int)ks[1];
        s->D = (int)qs[2];
        if (o->dout) {
            if ((rc = dt_npy_read_header(o->dout, &in->di, em)) < 0 ||
                (rc = check_3d(o->dout, &in->di, em)) < 0)
                return rc;
            if (memcmp(in->di.shape, qs, 3 * sizeof(int64_t)) != 0)
                return dt_emsg_set(em, DT_ESHAPE, "%s is (%lld, %lld, %lld); it must have Q's "
                                   "shape (%lld, %lld, %lld)",
                                   o->dout, (long long)in->di.shape[0],
                                   (long long)in->di.shape[1], (long long)in->di.shape[2],
                                   (long long)qs[0], (long long)qs[1], (long long)qs[2]);
        }
    }
    if (s->H % s->Hkv != 0)
        return dt_emsg_set(em, DT_ESHAPE, "Q has H=%d heads and K/V Hkv=%d: Hkv must divide H",
                           s->H, s->Hkv);
    if (dt_mask_args_any(&o->mask) || dt_mask_rules_pattern(&o->rules)) {
        if ((rc = dt_vocab_masks_run(o->cuda ? DT_DEVICE_CUDA : DT_DEVICE_CPU, DT_KIND_ATTN,
                                     o->mask.block_mask != NULL ||
                                         dt_mask_rules_pattern(&o->rules),
                                     s->nbranch > 0, em)) < 0)
            return rc;
        if ((rc = dt_mask_load(&in->mask, &o->mask, s->T, s->causal, s->H, em)) < 0)
            return rc;
        if (dt_mask_rules_pattern(&o->rules)) {
            dt_mask_t pm;
            if ((rc = dt_mask_rules_mask(&o->rules, s->T, s->causal, false, &pm, em)) < 0)
                return rc;
            dt_mask_take_blocks(&in->mask, &pm);
        }
        s->mask = &in->mask;
    }
    return dt_attn_check(s, R, em);
}

/* Load (or generate) this rank's rows of a (T, heads, D) tensor. */
static int load_rows(const char *path, const dt_npy_info_t *info, uint64_t seed, int stream,
                     const dt_attn_spec_t *s, int R, int rank, int heads, float *dst,
                     dt_emsg_t *em)
{
    dt_run_t runs[DT_LAYOUT_MAXRUNS];
    int nr = dt_layout_runs(s->layout, s->T, R, rank, runs), rc;
    int64_t row = (int64_t)heads * s->D;

    for (int i = 0; i < nr; i++) {
        if (path == NULL)
            dt_gen_normal(seed, (uint64_t)stream, runs[i].start * row, runs[i].len * row, dst);
        else if ((rc = dt_npy_read_f32(path, info, runs[i].start * row, runs[i].len * row, dst,
                                       em)) < 0)
            return rc;
        dst += runs[i].len * row;
    }
    return 0;
}

/* ---- outputs ------------------------------------------------------------- */

typedef struct outbuf {
    const char *path;
    const float *data; /* local rows */
    int heads;         /* (T, heads, D) rows, or 0 for the (H, T) lse */
} outbuf_t;

/* Rank 0: write rows [runs] of rank q (data has c rows) into w. */
static int place(dt_npy_writer_t *w, const dt_attn_spec_t *s, int R, int q, const outbuf_t *ob,
                 const float *data, dt_emsg_t *em)
{
    dt_run_t runs[DT_LAYOUT_MAXRUNS];
    int nr = dt_layout_runs(s->layout, s->T, R, q, runs), rc;
    int64_t c = dt_layout_local(s->T, R), off = 0;

    for (int i = 0; i < nr; i++) {
        if (ob->heads > 0) {
            int64_t row = (int64_t)ob->heads * s->D;
            if ((rc = dt_npy_writer_pwrite(w, runs[i].start * row, runs[i].len * row,
                                           data + off * row, em)) < 0)
                return rc;
        } else {
            for (int h = 0; h < s->H; h++)
                if ((rc = dt_npy_writer_pwrite(w, h * s->T + runs[i].start, runs[i].len,
                                               data + h * c + off, em)) < 0)
                    return rc;
        }
        off += runs[i].len;
    }
    return 0;
}

static size_t local_floats(const dt_attn_spec_t *s, int R, const outbuf_t *ob)
{
    int64_t c = dt_layout_local(s->T, R);
    return (size_t)c * (size_t)(ob->heads > 0 ? ob->heads * s->D : s->H);
}

/* Commit every writer, in order. If one fails, abort the rest and remove
 * the files already committed, so a failed run leaves none of its outputs.
 * w[i] may be NULL (skipped); every writer is consumed. */
static int commit_all(dt_npy_writer_t **w, char *const *paths, int n, dt_emsg_t *em)
{
    int rc = 0, done = 0;

    for (int i = 0; i < n; i++) {
        if (w[i] == NULL)
            continue;
        if (rc == 0) {
            rc = dt_npy_writer_commit(w[i], em);
            done = rc == 0 ? i + 1 : done;
        } else {
            dt_npy_writer_abort(w[i]);
        }
        w[i] = NULL;
    }
    if (rc < 0)
        for (int i = 0; i < done; i++)
            unlink(paths[i]);
    return rc;
}

/* Gather every output to rank 0 and write it there; rank 0 keeps receiving
 * after a failed write so no rank blocks. All ranks call this and then
 * agree on the outcome. */
static int write_gathered(dt_comm_t *comm, const dt_attn_spec_t *s, const outbuf_t *obs, int nob,
                          dt_emsg_t *em)
{
    int R = dt_comm_size(comm), me = dt_comm_rank(comm), rc = 0, crc;
    dt_npy_writer_t *w[8] = { NULL };
    float *tmp = NULL;

    for (int i = 0; i < nob; i++) {
        size_t n = local_floats(s, R, &obs[i]);
        if (me != 0) {
            if ((crc = dt_comm_send(comm, obs[i].data, n * sizeof(float), 0, TAG_OUT)) < 0)
                return dt_emsg_set(em, crc, "sending results to rank 0 failed");
            continue;
        }
        if (rc == 0) {
            int64_t shape[3] = { s->T, obs[i].heads, s->D };
            if (obs[i].heads > 0)
                rc = dt_npy_writer_open(obs[i].path, DT_F32, 3, shape, &w[i], em);
            else
                rc = dt_npy_writer_open(obs[i].path, DT_F32, 2,
                                        (int64_t[]){ s->H, s->T }, &w[i], em);
        }
        if (rc == 0)
            rc = place(w[i], s, R, 0, &obs[i], obs[i].data, em);
        tmp = dt_xrealloc(tmp, n * sizeof(float));
        for (int q = 1; q < R; q++) {
            if ((crc = dt_comm_recv(comm, tmp, n * sizeof(float), q, TAG_OUT)) < 0) {
                rc = dt_emsg_set(em, crc, "receiving results from rank %d failed", q);
                goto out;
            }
            if (rc == 0)
                rc = place(w[i], s, R, q, &obs[i], tmp, em);
        }
    }
    if (me == 0 && rc == 0) {
        char *paths[8];
        for (int i = 0; i < nob; i++)
            paths[i] = (char *)obs[i].path;
        rc = commit_all(w, paths, nob, em);
    }
out:
    for (int i = 0; i < nob; i++)
        if (w[i])
            dt_npy_writer_abort(w[i]);
    free(tmp);
    return rc;
}

/* --out-dir: every rank writes its own rows, plus their positions. */
static int write_shards(dt_comm_t *comm, const dt_attn_spec_t *s, const char *dir,
                        const outbuf_t *obs, int nob, const int64_t *pos, dt_emsg_t *em)
{
    int R = dt_comm_size(comm), me = dt_comm_rank(comm), rc = 0, who;
    int64_t c = dt_layout_local(s->T, R);
    dt_npy_writer_t *w[9] = { NULL };

    /* 0700 when made here: outputs are the job owner's alone */
    if (me == 0 && dt_mkdirs(dir, 0700) < 0)
        rc = dt_emsg_set(em, dt_err_errno(errno), "%s: cannot create directory: %s", dir,
                         strerror(errno));
    if ((rc = dt_comm_agree(comm, rc, 0, &who)) < 0)
        return me == who ? rc : dt_emsg_set(em, rc, "rank %d could not create %s", who, dir);
    char *paths[9] = { NULL };
    for (int i = 0; i <= nob && rc == 0; i++) {
        if (i == nob) {
            paths[i] = dt_xasprintf("%s/pos.%d.npy", dir, me);
            rc = dt_npy_writer_open(paths[i], DT_I64, 1, &c, &w[i], em);
            if (rc == 0)
                rc = dt_npy_writer_pwrite(w[i], 0, c, pos, em);
        } else {
            paths[i] = dt_xasprintf("%s/%s.%d.npy", dir, obs[i].path, me);
            int64_t shape[3] = { c, obs[i].heads, s->D };
            if (obs[i].heads > 0)
                rc = dt_npy_writer_open(paths[i], DT_F32, 3, shape, &w[i], em);
            else
                rc = dt_npy_writer_open(paths[i], DT_F32, 2, (int64_t[]){ s->H, c },
                                        &w[i], em);
            if (rc == 0)
                rc = dt_npy_writer_pwrite(w[i], 0, (int64_t)local_floats(s, R, &obs[i]),
                                          obs[i].data, em);
        }
    }
    /* commit only when every rank could write every shard, and keep the
     * shards only when every rank could commit them */
    int agreed = dt_comm_agree(comm, rc, 0, &who);
    if (agreed == 0) {
        rc = commit_all(w, paths, nob + 1, em);
        agreed = dt_comm_agree(comm, rc, 0, &who);
        if (agreed < 0 && rc == 0)
            for (int i = 0; i <= nob; i++)
                unlink(paths[i]);
    }
    for (int i = 0; i <= nob; i++) {
        if (w[i] != NULL)
            dt_npy_writer_abort(w[i]);
        free(paths[i]);
    }
    if (agreed < 0 && rc == 0)
        rc = dt_emsg_set(em, agreed, "rank %d failed to write its shard", who);
    return rc;
}

/* Rank 0, after the shards: remove NAME.N.npy for N >= R in dir, left by
 * an earlier run on more ranks (the manifest names this run's only). */
static void drop_stale(const char *dir, const outbuf_t *obs, int nob, int R)
{
    DIR *d = opendir(dir);
    struct dirent *e;

    while (d && (e = readdir(d)) != NULL) {
        const char *dot = strchr(e->d_name, '.');
        char *end;
        if (dot == NULL)
            continue;
        long n = strtol(dot + 1, &end, 10);
        if (end == dot + 1 || strcmp(end, ".npy") != 0 || n < R)
            continue;
        size_t len = (size_t)(dot - e->d_name);
        for (int i = 0; i <= nob; i++) {
            const char *name = i == nob ? "pos" : obs[i].path;
            if (strlen(name) == len && strncmp(e->d_name, name, len) == 0) {
                char *p = dt_xasprintf("%s/%s", dir, e->d_name);
                if (unlink(p) == 0)
                    fprintf(stderr, "dtengine attn: removed %s (an earlier run's rank)\n", p);
                free(p);
            }
        }
    }
    if (d)
        closedir(d);
}

/* --out-dir: every rank hashes its shards, rank 0 writes DIR/attn.json
 * naming them (format, shapes, layout, each tensor's files with their
 * SHA-256, in rank order) and, into hex, the manifest's own SHA-256: the
 * run's checksum. Agreed. */
static int write_manifest(dt_comm_t *comm, const dt_attn_spec_t *s, const char *dir,
                          const outbuf_t *obs, int nob, char hex[65], dt_emsg_t *em)
{
    int R = dt_comm_size(comm), me = dt_comm_rank(comm), rc = 0, who;
    size_t nf = (size_t)nob + 1;
    char(*sha)[65] = dt_xcalloc(nf * (size_t)(me == 0 ? R : 1), sizeof(*sha));

    for (size_t i = 0; i < nf && rc == 0; i++) {
        char *p = dt_xasprintf("%s/%s.%d.npy", dir, i == (size_t)nob ? "pos" : obs[i].path, me);
        rc = dt_sha256_file(p, sha[i], em);
        free(p);
    }
    if ((rc = dt_comm_agree(comm, rc, 0, &who)) < 0)
        goto out;
    if (me != 0) {
        rc = dt_comm_send(comm, sha, nf * sizeof(*sha), 0, TAG_SHA);
    } else {
        for (int q = 1; q < R && rc == 0; q++)
            rc = dt_comm_recv(comm, sha + (size_t)q * nf, nf * sizeof(*sha), q, TAG_SHA);
        if (rc < 0)
            dt_emsg_set(em, rc, "gathering the shards' SHA-256 failed");
    }
    if (rc == 0 && me == 0) {
        json_t *t = json_object();
        for (size_t i = 0; i < nf; i++) {
            const char *name = i == (size_t)nob ? "pos" : obs[i].path;
            json_t *files = json_array();
            for (int q = 0; q < R; q++) {
                char *f = dt_xasprintf("%s.%d.npy", name, q);
                json_array_append_new(files, json_pack("{s:s, s:s}", "file", f, "sha256",
                                                       sha[(size_t)q * nf + i]));
                free(f);
            }
            json_object_set_new(t, name, files);
        }
        json_t *m = json_pack("{s:s, s:I, s:i, s:i, s:i, s:i, s:s, s:b, s:o}", "format",
                              ATTN_FORMAT, "tokens", (json_int_t)s->T, "heads", s->H, "kv_heads",
                              s->Hkv, "dim", s->D, "ranks", R, "layout",
                              dt_layout_name(s->layout), "causal", s->causal, "tensors", t);
        if (s->nbranch > 0) {
            json_t *br = json_array();
            for (int b = 0; b < s->nbranch; b++)
                json_array_append_new(br, json_pack("{s:I, s:I}", "segment",
                                                    (json_int_t)s->seg[b], "dilation",
                                                    (json_int_t)s->dil[b]));
            json_object_set_new(m, "branches", br);
        }
        char *text = json_dumps(m, JSON_INDENT(1) | JSON_PRESERVE_ORDER);
        char *path = dt_xasprintf("%s/%s", dir, ATTN_MANIFEST);
        size_t len = strlen(text);
        text = dt_xrealloc(text, len + 2);
        text[len++] = '\n';
        rc = dt_file_write_atomic(path, text, len, 0600, DT_ATOMIC_DIRFD, em);
        if (rc == 0)
            dt_sha256_hex(text, len, hex);
        if (rc == 0)
            drop_stale(dir, obs, nob, R);
        free(path);
        free(text);
        json_decref(m);
    }
    rc = dt_comm_agree(comm, rc, 0, &who);
out:
    free(sha);
    return rc;
}

/* ---- the command ----------------------------------------------------------- */

static double maxrss_mib(void)
{
    struct rusage ru;
    getrusage(RUSAGE_SELF, &ru);
    return (double)ru.ru_maxrss / 1024.0;
}

/* One line per rank on rank 0: timing split and memory, for benchmarks.
 * Every rank takes part in the sum; a failed one ends the command. */
static int print_stats(dt_comm_t *comm, const char *what, const dt_attn_stats_t *st,
                       dt_emsg_t *em)
{
    int R = dt_comm_size(comm), me = dt_comm_rank(comm), rc;
    double *all = dt_xcalloc((size_t)R * 8, sizeof(double));
    double *mine = all + (size_t)me * 8;

    mine[0] = st->total_s;
    mine[1] = st->compute_s;
    mine[2] = st->wait_s;
    mine[3] = st->bytes_sent;
    mine[4] = st->steps;
    mine[5] = maxrss_mib();
    mine[6] = st->pieces_cudnn;
    mine[7] = st->pieces_dt;
    if ((rc = dt_comm_allreduce_sum_f64(comm, all, (size_t)R * 8)) < 0)
        rc = dt_emsg_set(em, rc, "gathering the %s statistics of every rank failed", what);
    if (rc == 0 && me == 0)
        for (int q = 0; q < R; q++) {
            double *x = all + (size_t)q * 8;
            printf("stats: %s rank=%d total_s=%.6f compute_s=%.6f wait_s=%.6f bytes_sent=%.0f "
                   "steps=%.0f maxrss_mib=%.1f",
                   what, q, x[0], x[1], x[2], x[3], x[4], x[5]);
            if (x[6] + x[7] > 0) /* GPU: the blocks' pieces by kernel (attn_block.h) */
                printf(" pieces_cudnn=%.0f pieces_dt=%.0f", x[6], x[7]);
            printf("\n");
        }
    free(all);
    return rc;
}

/* ---- the run ------------------------------------------------------------- */

/* One run of `dtengine attn` on this rank: options, the shapes, this
 * rank's rows of every tensor and the timings. */
typedef struct attn_run {
    dt_comm_t *comm;
    int R, me;
    opts_t o;
    input_t in;
    dt_emsg_t em;
    int64_t c; /* rows of this rank */
    float *q, *k, *v, *out, *lse;
    float *dout, *dq, *dk, *dv; /* the backward pass only */
    int64_t *pos;
    dt_attn_stats_t fst, bst;
    char checksum[65]; /* --out-dir: the manifest's SHA-256 */
} attn_run_t;

/* Agree on a phase's outcome; the rank holding the original failure
 * prints it. */
static int report(attn_run_t *a, int rc)
{
    return dt_agree_report(a->comm, rc, "dtengine attn: error", a->em.s, NULL);
}

/* Options: 0, 1 for --help, or DT_EUSAGE (every rank has the same argv,
 * so nothing is agreed: rank 0 prints it). */
static int attn_options(attn_run_t *a, dt_comm_t *comm, int argc, char **argv)
{
    memset(a, 0, sizeof(*a));
    a->comm = comm;
    a->R = dt_comm_size(comm);
    a->me = dt_comm_rank(comm);
    return parse_opts(argc, argv, &a->o, &a->em);
}

/* The shapes, from the inputs' headers or --generate. */
static int attn_prepare(attn_run_t *a)
{
    openblas_set_num_threads(a->o.threads);
    if (a->o.threads > 1 && !dt_comm_threads_ok(a->comm)) {
        if (a->me == 0)
            dt_log_warn("this MPI runs no threads beside its calls (below "
                        "MPI_THREAD_FUNNELED): --threads %d applies to BLAS only",
                        a->o.threads);
        dt_attn_set_threads(1);
    } else {
        dt_attn_set_threads(a->o.threads);
    }
    return report(a, prepare(&a->o, a->R, &a->in, &a->em));
}

/* This rank's rows of Q, K, V (and dO), read or generated. */
static int attn_load(attn_run_t *a)
{
    const opts_t *o = &a->o;
    const dt_attn_spec_t *s = &a->in.spec;
    int R = a->R, me = a->me, rc;

    a->c = dt_layout_local(s->T, R);
    size_t nq = (size_t)a->c * s->H * s->D, nkv = (size_t)a->c * s->Hkv * s->D;
    a->q = dt_xaligned(nq, sizeof(float));
    a->k = dt_xaligned(nkv, sizeof(float));
    a->v = dt_xaligned(nkv, sizeof(float));
    a->out = dt_xaligned(nq, sizeof(float));
    a->lse = dt_xaligned((size_t)a->c * s->H, sizeof(float));
    rc = load_rows(o->q, &a->in.qi, o->seed, STREAM_Q, s, R, me, s->H, a->q, &a->em);
    if (rc == 0)
        rc = load_rows(o->k, &a->in.ki, o->seed, STREAM_K, s, R, me, s->Hkv, a->k, &a->em);
    if (rc == 0)
        rc = load_rows(o->v, &a->in.vi, o->seed, STREAM_V, s, R, me, s->Hkv, a->v, &a->em);
    if (rc == 0 && a->in.bwd) {
        a->dout = dt_xaligned(nq, sizeof(float));
        rc = load_rows(o->dout, &a->in.di, o->seed, STREAM_DOUT, s, R, me, s->H, a->dout,
                       &a->em);
    }
    if (a->in.bwd) {
        a->dq = dt_xaligned(nq, sizeof(float));
        a->dk = dt_xaligned(nkv, sizeof(float));
        a->dv = dt_xaligned(nkv, sizeof(float));
    }
    if ((rc = report(a, rc)) == 0)
        dt_wlink_progress(0, 1, 0, NAN, 0, NAN); /* under an agent: running */
    return rc;
}

/* The attention, forward and (asked for) backward. The barriers line the
 * ranks up so the timings measure the attention alone; a failed one
 * leaves the ranks out of step, so the run ends with it. */
static int attn_compute(attn_run_t *a)
{
    const dt_attn_spec_t *s = &a->in.spec;
    int rc;

    if ((rc = dt_comm_barrier(a->comm)) < 0) {
        dt_emsg_set(&a->em, rc, "the barrier before the forward pass failed");
    } else if (a->o.cuda) {
        rc = dt_attn_gpu_run(a->comm, s, a->o.fp16, a->q, a->k, a->v, a->out, a->lse, a->dout,
                             a->dq, a->dk, a->dv, &a->fst, &a->bst, &a->em);
    } else {
        rc = dt_attn_fwd(a->comm, s, a->q, a->k, a->v, a->out, a->lse, &a->fst, &a->em);
        if (rc == 0 && a->in.bwd) {
            if ((rc = dt_comm_barrier(a->comm)) < 0)
                dt_emsg_set(&a->em, rc, "the barrier before the backward pass failed");
            else
                rc = dt_attn_bwd(a->comm, s, a->q, a->k, a->v, a->out, a->lse, a->dout, a->dq,
                                 a->dk, a->dv, &a->bst, &a->em);
        }
    }
    if ((rc = report(a, rc)) == 0) {
        double secs = a->fst.total_s + a->bst.total_s;
        dt_wlink_progress(1, 1, s->T, NAN, secs > 0 ? (double)s->T / secs : 0, NAN);
    }
    return rc;
}

/* The outputs: every rank's shard (--out-dir) or whole files on rank 0. */
static int attn_write(attn_run_t *a)
{
    const opts_t *o = &a->o;
    const dt_attn_spec_t *s = &a->in.spec;
    outbuf_t obs[5];
    int nob = 0, rc = 0;

    if (o->out_dir) {
        obs[nob++] = (outbuf_t){ "o", a->out, s->H };
        obs[nob++] = (outbuf_t){ "lse", a->lse, 0 };
        if (a->in.bwd) {
            obs[nob++] = (outbuf_t){ "dq", a->dq, s->H };
            obs[nob++] = (outbuf_t){ "dk", a->dk, s->Hkv };
            obs[nob++] = (outbuf_t){ "dv", a->dv, s->Hkv };
        }
        a->pos = dt_xmallocarray((size_t)a->c, sizeof(*a->pos));
        dt_layout_positions(s->layout, s->T, a->R, a->me, a->pos);
        rc = write_shards(a->comm, s, o->out_dir, obs, nob, a->pos, &a->em);
        if (rc == 0)
            rc = write_manifest(a->comm, s, o->out_dir, obs, nob, a->checksum, &a->em);
    } else if (o->out || o->lse || o->dq) {
        if (o->out)
            obs[nob++] = (outbuf_t){ o->out, a->out, s->H };
        if (o->lse)
            obs[nob++] = (outbuf_t){ o->lse, a->lse, 0 };
        if (a->in.bwd && o->dq) {
            obs[nob++] = (outbuf_t){ o->dq, a->dq, s->H };
            obs[nob++] = (outbuf_t){ o->dk, a->dk, s->Hkv };
            obs[nob++] = (outbuf_t){ o->dv, a->dv, s->Hkv };
        }
        rc = write_gathered(a->comm, s, obs, nob, &a->em);
    }
    return report(a, rc);
}

/* Dense attention's work per rank: the pairs its queries attend (every
 * head), from the mask (or causality) and the layout; max over mean. */
static void print_balance(const dt_attn_spec_t *s, int R)
{
    dt_mask_t plain;
    const dt_mask_t *m = s->mask;
    double mx = 0, sum = 0;
    if (m == NULL) {
        dt_mask_init(&plain, s->T, s->causal);
        m = &plain;
    }
    int nh = m->block > 0 ? m->nhead : 1;
    printf("stats: work");
    for (int r = 0; r < R; r++) {
        dt_run_t runs[DT_LAYOUT_MAXRUNS];
        int nr = dt_layout_runs(s->layout, s->T, R, r, runs);
        double w = 0;
        for (int i = 0; i < nr; i++)
            for (int h = 0; h < nh; h++)
                w += dt_mask_pairs(m, h, runs[i].start, runs[i].start + runs[i].len, 0, s->T) *
                     (double)(s->H / nh);
        printf(" rank%d_pairs=%.0f", r, w);
        mx = w > mx ? w : mx;
        sum += w;
    }
    printf(" imbalance=%.3f\n", sum > 0 ? mx / (sum / R) : 1.0);
    if (m == &plain)
        dt_mask_close(&plain);
}

/* The mask's parts for the summary line: "none" or e.g. "docs+window". */
static const char *mask_words(const dt_attn_spec_t *s, char *buf, size_t n)
{
    const dt_mask_t *m = s->mask;
    if (m == NULL || dt_mask_is_plain(m))
        return "none";
    snprintf(buf, n, "%s%s%s%s%s", m->ndoc > 1 ? "docs" : "",
             m->ndoc > 1 && m->window ? "+" : "", m->window ? "window" : "",
             (m->ndoc > 1 || m->window) && m->block ? "+" : "", m->block ? "blocks" : "");
    return buf;
}

/* The slowest rank's times and the largest memory (all ranks take part),
 * --stats lines, and rank 0's summary line. */
static int attn_summary(attn_run_t *a)
{
    const dt_attn_spec_t *s = &a->in.spec;
    double t[3] = { a->fst.total_s, a->bst.total_s, maxrss_mib() };
    int rc;

    if ((rc = dt_comm_allreduce_max_f64(a->comm, t, 3)) < 0)
        dt_emsg_set(&a->em, rc, "agreeing on the timings failed");
    if (rc == 0 && a->o.stats) {
        rc = print_stats(a->comm, "fwd", &a->fst, &a->em);
        if (rc == 0 && a->in.bwd)
            rc = print_stats(a->comm, "bwd", &a->bst, &a->em);
        if (rc == 0 && a->me == 0 && s->nbranch == 0)
            print_balance(s, a->R);
    }
    if ((rc = report(a, rc)) < 0)
        return rc;
    if (a->me == 0) {
        double fl = dt_attn_flops(s);
        char mw[64];
        printf("dtengine attn: tokens=%lld ranks=%d device=%s layout=%s causal=%d heads=%d/%d "
               "dim=%d branches=%d mask=%s seconds=%.4f gflops=%.2f",
               (long long)s->T, a->R,
               a->o.cuda ? (a->o.fp16 ? "cuda/fp16" : "cuda/bf16") : "cpu",
               dt_layout_name(s->layout), s->causal, s->H, s->Hkv, s->D,
               s->nbranch, mask_words(s, mw, sizeof(mw)), t[0],
               t[0] > 0 ? fl / t[0] * 1e-9 : 0.0);
        if (a->in.bwd)
            printf(" bwd_seconds=%.4f bwd_gflops=%.2f", t[1],
                   t[1] > 0 ? 2.5 * fl / t[1] * 1e-9 : 0.0);
        printf(" maxrss_mib=%.1f", t[2]);
        if (!a->o.cuda) { /* what the CPU ran (dtengine(1) OUTPUT) */
            printf(" kernel=%s blas_core=%s", dt_attn_cpu_kernel(s->D), openblas_get_corename());
        } else { /* the GPU's, and its pieces on rank 0 (engine/attn/attn_block.h) */
            char kn[64];
            dt_attn_gpu_kernel(kn, sizeof(kn));
            printf(" kernel=%s pieces_cudnn=%d pieces_dt=%d", kn,
                   a->fst.pieces_cudnn + a->bst.pieces_cudnn, a->fst.pieces_dt + a->bst.pieces_dt);
        }
        printf("\n");
        if (a->o.out_dir)
            printf("output: %s/%s sha256=%s\n", a->o.out_dir, ATTN_MANIFEST, a->checksum);
        fflush(stdout);
        if (a->o.out_dir) {
            char *dir = realpath(a->o.out_dir, NULL);
            char *man = dt_xasprintf("%s/%s", dir ? dir : a->o.out_dir, ATTN_MANIFEST);
            const char *outs[] = { man };
            dt_wlink_result(1, NAN, NAN, a->checksum, outs, 1);
            free(man);
            free(dir);
        } else {
            dt_wlink_result(1, NAN, NAN, NULL, NULL, 0);
        }
    }
    return 0;
}

static void attn_close(attn_run_t *a)
{
    dt_spec_free(&a->o.spec);
    dt_mask_close(&a->in.mask);
    free(a->pos);
    free(a->q);
    free(a->k);
    free(a->v);
    free(a->out);
    free(a->lse);
    free(a->dout);
    free(a->dq);
    free(a->dk);
    free(a->dv);
}

/* ---- the command ----------------------------------------------------------- */

int dt_cmd_attn(dt_comm_t *comm, int argc, char **argv)
{
    attn_run_t a;
    int rc = attn_options(&a, comm, argc, argv);

    if (rc == 1) {
        if (a.me == 0)
            usage(stdout);
        attn_close(&a);
        return DT_EXIT_OK;
    }
    if (rc < 0) {
        if (a.me == 0) {
            fprintf(stderr, "dtengine attn: %s\n", a.em.s);
            if (rc == DT_EUSAGE)
                usage(stderr);
        }
        attn_close(&a);
        return rc == DT_EUSAGE ? DT_EXIT_INPUT : dt_exit_code(rc);
    }
    if (a.o.print) { /* --print-settings: what this run resolved */
        if (a.me == 0) {
            const opts_t *o = &a.o;
            dt_cmd_setting("causal", "%s", o->causal ? "yes" : "no");
            dt_cmd_setting("deterministic", "%s", o->nondet ? "no" : "yes");
            dt_cmd_setting("segments", o->segments ? "%s" : NULL, o->segments);
            dt_cmd_setting("dilations", o->dilations ? "%s" : NULL, o->dilations);
            dt_cmd_setting("layout", "%s", o->layout);
            dt_cmd_setting("sliding_window", o->mask.window ? "%lld" : NULL,
                           (long long)o->mask.window);
            char pat[96];
            dt_mask_pattern_format(pat, sizeof(pat), &o->rules);
            dt_cmd_setting("block_pattern", "%s", pat);
            dt_cmd_setting("block_size", "%lld", (long long)o->rules.block);
            dt_cmd_setting("dtype", "%s", !o->cuda ? "fp32" : o->fp16 ? "fp16" : "bf16");
            dt_cmd_setting("device", "%s", o->cuda ? "cuda" : "cpu");
            dt_cmd_setting("seed", "%llu", o->seed);
            dt_cmd_setting("output_dir", o->out_dir ? "%s" : NULL, o->out_dir);
        }
        attn_close(&a);
        return DT_EXIT_OK;
    }
    rc = attn_prepare(&a);
    if (rc == 0)
        rc = attn_load(&a);
    if (rc == 0)
        rc = attn_compute(&a);
    if (rc == 0)
        rc = attn_write(&a);
    if (rc == 0)
        rc = attn_summary(&a);
    attn_close(&a);
    return dt_exit_code(rc);
}
