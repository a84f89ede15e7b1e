/* SPDX-License-Identifier: MIT
 *
 * `dtengine prefill`: the forward pass of the LLaMA-3 model over one long
 * sequence split over the job's ranks (context parallel), one layer at a
 * time, with a checkpoint of the hidden state after every layer, so that an
 * interrupted prefill resumes at the last finished layer instead of at the
 * start. It prints the loss over the sequence's targets and its perplexity by
 * position bucket, writes the logits of the last N positions as .npy and,
 * with --out-dir, every position's negative log-likelihood (each rank its
 * own rows, with their positions) and perplexity.json.
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
 * The parameters are a Hugging Face model's (--init-from, io/hf.h) or those
 * of dt_model_init(seed), the state of `dtengine train` at step 0. The
 * sequence is a document (the first T tokens of one token file) or the
 * recall task's sequence 0, the one train sees at step 0 (so the prefill
 * loss equals train's step-0 loss). Positions start at pos_offset. Not
 * here: a KV cache for generation, batching.
 */
#include "config.h"

#include <cblas.h>
#include <errno.h>
#include <inttypes.h>
#include <jansson.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "common/clock.h"
#include "common/fileio.h"
#include "common/macros.h"
#include "common/mem.h"
#include "common/sha256.h"
#include "engine/cmd/agree.h"
#include "engine/attn/attn.h"
#include "kernels/cpu/attn_cpu.h"
#include "io/ckpt.h"
#include "engine/cmd/cmd.h"
#include "engine/cmd/save.h"
#include "engine/data/loader.h"
#include "engine/data/recall.h"
#include "io/tokshard.h"
#include "engine/model/model.h"
#include "io/nll.h"
#include "io/npy.h"
#include "io/safetensors.h"
#include "engine/wlink.h"
#include "kernels/cpu/layers_cpu.h"
#include "engine/cmd/masks.h"
#include "engine/cmd/memckpt.h"
#include "engine/cmd/options.h"
#include "spec/spec.h"
#ifdef HAVE_CUDA
#include "engine/model/model_cuda.h"
#endif

#define PREFILL_FORMAT "dt-prefill-1"
#define MEM_FORMAT "dt-prefill-memory-1"

enum { TAG_COUNT = 312, TAG_POS, TAG_ROWS };

typedef struct popts {
    dt_model_cfg_t model;
    int64_t T, last, ckpt_keep, ckpt_every, stop_after;
    int64_t pos_offset; /* the first token's position (spec key pos_offset) */
    int64_t mem_every;  /* --mem-ckpt-every: layers between in-memory copies; 0 none */
    int64_t resume_mem; /* --resume-from-memory LAYERS: the agent's copy, 0 none */
    dt_mask_rules_t masks; /* the mask keys (spec/mask_rules.h) */
    uint64_t seed;
    const char *ckpt_dir, *data, *layout, *segments, *dilations, *logits, *out_dir;
    const char *resume_from; /* a step directory, or NULL */
    int resume, causal;
    int external;  /* --ckpt-commit external: the coordinator commits and prunes */
    int print;     /* --print-settings */
    int cuda;      /* --device cuda: the layers and the head on this rank's GPU */
    dt_dtype_t dtype; /* its compute dtype: DT_BF16 or DT_F16 */
    char *logits_path; /* --out-dir's logits.npy (owned) */
    dt_spec_t spec; /* --spec FILE, whose strings the options above may point into */
} popts_t;

static void usage(FILE *f)
{
    fprintf(f, "usage: dtengine prefill [--spec FILE] [--init-from HFDIR | --model PRESET\n"
               "                        [--dim N --layers N --heads N --kv-heads N --ffn N\n"
               "                        --vocab N --head-dim D --rope-theta B --tied yes|no\n"
               "                        --norm-eps E --rope-scaling none|llama3 --rope-factor F\n"
               "                        --rope-low-freq-factor L --rope-high-freq-factor H\n"
               "                        --rope-original-max-pos N]]\n"
               "                        --seq-len T [--data recall|TOKENFILE] [--pos-offset P]\n"
               "                        [--seed S]\n"
               "                        [--layout contiguous|zigzag|balanced] [--no-causal]\n"
               "                        [--segments w1,.. --dilations r1,..]\n"
               "                        [--doc-mask none|eot [--eot-token N]\n"
               "                        [--doc-positions continue|reset]]\n"
               "                        [--sliding-window W [--sliding-window-layers all|every:K]]\n"
               "                        [--block-pattern P [--block-size B]]\n"
               "                        [--ckpt-dir DIR [--ckpt-every K] [--ckpt-keep N]\n"
               "                        [--ckpt-commit self|external]\n"
               "                        [--resume | --resume-from STEPDIR |\n"
               "                         --resume-from-memory LAYERS]]\n"
               "                        [--mem-ckpt-every K]\n"
               "                        [--logits OUT.npy | --out-dir DIR] [--last N]\n"
               "                        [--stop-after-layer K]\n"
               "                        [--device cpu|cuda [--dtype bf16|fp16]]\n"
               "                        [--print-settings]\n"
               "Every option but --spec, --resume, --resume-from, --resume-from-memory,\n"
               "--ckpt-commit, --logits, --last, --stop-after-layer and --print-settings is a\n"
               "job-spec key (dt-spec(5)),\n"
               "with its default;\n"
               "--seq-len is tokens, --out-dir output_dir.\n"
               "PRESET: tiny, llama3-8b, llama3-70b, or custom with every shape flag\n");
}

/* prefill's own options; the rest are job-spec keys and the shared ones
 * (engine/cmd/options.h) */
enum { O_LOGITS = 1, O_LAST, O_STOP_AFTER };
static const dt_cmd_opt_t own_options[] = {
    { "logits", 1, O_LOGITS },
    { "last", 1, O_LAST },
    { "stop-after-layer", 1, O_STOP_AFTER },
    { NULL, 0, 0 },
};

static int own_option(int id, const char *value, void *arg, dt_emsg_t *em)
{
    popts_t *o = arg;
    double v;
    int rc = 0;

    switch (id) {
    case O_LOGITS:
        o->logits = value;
        break;
    case O_LAST:
        rc = dt_cmd_number("last", value, 1, 1e12, &v, em);
        o->last = (int64_t)v;
        break;
    case O_STOP_AFTER:
        rc = dt_cmd_number("stop-after-layer", value, 1, 1 << 20, &v, em);
        o->stop_after = (int64_t)v;
        break;
    }
    return rc;
}

/* Options (and --spec) into o: every setting from the job spec they make,
 * with the key table's defaults (spec/spec.h); a spec's keys about
 * resources and Slurm are not the engine's. */
static int parse(int argc, char **argv, popts_t *o, dt_emsg_t *em)
{
    dt_spec_t *s = &o->spec;
    int rc;

    dt_cmd_common_t c;

    memset(o, 0, sizeof(*o));
    o->last = 1;
    if ((rc = dt_cmd_options(argc, argv, DT_KIND_PREFILL, own_options, own_option, o, s, &c,
                             em)) != 0)
        return rc;
    o->print = c.print;
    o->resume = c.resume;
    o->resume_from = c.resume_from;
    o->resume_mem = c.resume_mem;
    o->external = c.external;
    o->mem_every = dt_spec_given(s, "mem_ckpt_every") ? s->mem_ckpt_every : 0;
    o->cuda = dt_spec_device_id(s) == DT_DEVICE_CUDA;
    o->dtype = dt_spec_dtype_id(s);
    o->T = s->tokens;
    o->causal = dt_spec_causal(s);
    o->layout = dt_layout_name(dt_spec_layout(s));
    o->segments = s->segments;
    o->dilations = s->dilations;
    o->seed = (uint64_t)dt_spec_int(s, "seed");
    o->data = dt_spec_word(s, "data");
    o->ckpt_dir = s->ckpt_dir;
    o->ckpt_every = dt_spec_ckpt_every(s);
    o->ckpt_keep = dt_spec_int(s, "ckpt_keep");
    o->out_dir = s->output_dir;
    if ((rc = dt_cmd_model_resolve(s, &o->model, em)) < 0)
        return rc;
    o->pos_offset = s->pos_offset;
    if ((rc = dt_cmd_masks_options(s, DT_KIND_PREFILL, &o->masks, em)) < 0)
        return rc;
    if (o->resume && o->ckpt_dir == NULL)
        return dt_emsg_set(em, DT_EUSAGE, "--resume needs --ckpt-dir");
    if (o->resume_from && o->ckpt_dir == NULL)
        return dt_emsg_set(em, DT_EUSAGE, "--resume-from needs --ckpt-dir (where the next "
                           "layers' checkpoints go)");
    if (o->resume && o->resume_from)
        return dt_emsg_set(em, DT_EUSAGE, "--resume and --resume-from exclude each other");
    if (o->resume_mem && (o->resume || o->resume_from))
        return dt_emsg_set(em, DT_EUSAGE, "--resume-from-memory excludes --resume and "
                           "--resume-from");
    if (o->logits && o->out_dir)
        return dt_emsg_set(em, DT_EUSAGE, "--out-dir writes DIR/logits.npy: do not also give "
                           "--logits");
    if (o->out_dir) {
        o->logits_path = dt_xasprintf("%s/logits.npy", o->out_dir);
        o->logits = o->logits_path;
    }
    if (o->stop_after > 0 && o->ckpt_dir == NULL)
        return dt_emsg_set(em, DT_EUSAGE, "--stop-after-layer needs --ckpt-dir");
    if (o->last > o->T)
        return dt_emsg_set(em, DT_EUSAGE, "--last %lld: more than the %lld positions of the "
                           "sequence", (long long)o->last, (long long)o->T);
    return 0;
}

/* ---- checkpoints ------------------------------------------------------------ */

/* Everything besides the model and the seed that the hidden state depends
 * on. */
static json_t *plan_json(const popts_t *o)
{
    json_t *j = json_pack("{s:s, s:I, s:b, s:s, s:s}", "layout", o->layout, "seq_len",
                          (json_int_t)o->T, "causal", o->causal, "segments",
                          o->segments ? o->segments : "", "dilations",
                          o->dilations ? o->dilations : "");
    /* only when set: checkpoints from before pos_offset existed match */
    dt_cmd_plan_pos_offset(j, o->pos_offset);
    dt_cmd_plan_masks(j, &o->masks);
    return j;
}

static json_t *rng_json(const popts_t *o)
{
    return json_pack("{s:I, s:s}", "seed", (json_int_t)o->seed, "data", o->data);
}

/* Checkpoint "step" K = K layers done: every rank's hidden state
 * (engine/cmd/save.h does the rest). */
static int save(dt_comm_t *comm, const popts_t *o, int64_t done, int64_t c, const float *hidden,
                const int64_t *pos, dt_emsg_t *em)
{
    int64_t shape[2] = { c, o->model.dim };
    int skipped, rc;
    char buf[32];

    dt_st_writer_t *w = dt_st_writer_new();
    snprintf(buf, sizeof(buf), "%" PRId64, done);
    rc = dt_st_writer_add(w, "hidden", DT_F32, 2, shape, hidden, em);
    if (rc == 0)
        rc = dt_st_writer_add(w, "positions", DT_I64, 1, &c, pos, em);
    if (rc == 0)
        rc = dt_st_writer_meta(w, "format", PREFILL_FORMAT, em);
    if (rc == 0)
        rc = dt_st_writer_meta(w, "layers_done", buf, em);
    /* the writer holds names and pointers: a failure here is a bug */
    if (rc < 0)
        abort();
    dt_cmd_save_t sv = { .cmd = "dtengine prefill", .root = o->ckpt_dir, .step = done,
                         .external = o->external, .keep = (int)o->ckpt_keep };
    if (dt_comm_rank(comm) == 0) {
        sv.model = dt_ckpt_model_json(&o->model);
        sv.plan = plan_json(o);
        sv.rng = rng_json(o);
    }
    rc = dt_cmd_save(comm, &sv, w, &skipped, em);
    json_decref(sv.model);
    json_decref(sv.plan);
    json_decref(sv.rng);
    dt_st_writer_free(w);
    return rc;
}

static void skipped(const char *dir, int err, const char *why, void *ud)
{
    fprintf(stderr, "dtengine prefill: skipping checkpoint %s: %s\n", dir, why);
    (void)err;
    (void)ud;
}

/* Whether the checkpoint in dir belongs to this job (its model, plan, seed
 * and data): *done its layer count, *ranks the ranks that wrote it. */
static int match(const popts_t *o, const char *dir, int64_t *done, int *ranks, dt_emsg_t *em)
{
    dt_ckpt_manifest_t man = { 0 };
    json_t *want[3] = { dt_ckpt_model_json(&o->model), plan_json(o), rng_json(o) };
    int rc = dt_ckpt_manifest_read(dir, &man, em);

    if (rc < 0)
        goto out;
    if (!json_equal(want[0], man.model))
        rc = dt_emsg_set(em, DT_EINVAL, "%s: written for another model shape", dir);
    else if ((rc = dt_cmd_check_pos_offset(dir, man.plan, o->pos_offset, em)) < 0 ||
             (rc = dt_cmd_check_masks(dir, man.plan, &o->masks, em)) < 0)
        ;
    else if (!json_equal(want[1], man.plan))
        rc = dt_emsg_set(em, DT_EINVAL, "%s: written for another sequence length, layout or "
                         "attention (not a prefill checkpoint of this job)", dir);
    else if (!json_equal(want[2], man.rng))
        rc = dt_emsg_set(em, DT_EINVAL, "%s: written for another seed or data", dir);
    else if (man.step < 1 || man.step > o->model.layers)
        rc = dt_emsg_set(em, DT_EFORMAT, "%s: %lld layers done, the model has %d", dir,
                         (long long)man.step, o->model.layers);
    *done = man.step;
    *ranks = man.ranks;
out:
    for (int i = 0; i < 3; i++)
        json_decref(want[i]);
    dt_ckpt_manifest_close(&man);
    return rc;
}

/* Rank 0: the checkpoint to resume from. --resume-from names it (it must
 * verify and belong to this job); --resume takes the newest under
 * --ckpt-dir that verifies and belongs to this job, and renames newer step
 * directories to step-NNNNNNNN.rejected (out of the step-* namespace,
 * kept for inspection), since this run writes those steps again. *dir
 * (the caller frees), *done and the *ranks that wrote it, or NULL and 0
 * when there is none. */
static int find(const popts_t *o, char **dir, int64_t *done, int *ranks, dt_emsg_t *em)
{
    int64_t s = 0;
    int rc;

    *done = 0;
    *dir = NULL;
    if (o->resume_from) {
        /* the coordinator picked it without reading it (the files are the
         * job owner's): DT_ECKPT (exit 6) tells it to take the one before */
        if ((rc = dt_ckpt_verify(o->resume_from, em)) < 0) {
            dt_emsg_t why = *em;
            return dt_emsg_set(em, DT_ECKPT, "--resume-from: %s", why.s);
        }
        *dir = dt_xstrdup(o->resume_from);
    } else if ((rc = dt_ckpt_latest(o->ckpt_dir, o->external ? DT_CKPT_REQUIRE_COMMITTED : 0,
                                    skipped, NULL, dir, &s, em)) < 0 ||
               *dir == NULL) {
        return rc;
    }
    if ((rc = match(o, *dir, done, ranks, em)) < 0) {
        dt_emsg_t why = *em;
        return o->resume_from ? dt_emsg_set(em, DT_ECKPT, "--resume-from: %s", why.s) : rc;
    }
    for (int64_t k = *done + 1; !o->external && k <= o->model.layers; k++) {
        char *bad = dt_ckpt_step_dir(o->ckpt_dir, k), *to = NULL;
        struct stat st;
        /* .rejected, or .rejected.2, ... when an earlier attempt left one */
        if (lstat(bad, &st) == 0 &&
            (rc = dt_ckpt_set_aside(o->ckpt_dir, k, "rejected", &to, em)) == 0)
            fprintf(stderr, "dtengine prefill: moved %s aside to %s\n", bad, to);
        free(bad);
        free(to);
        if (rc < 0)
            return rc;
    }
    fprintf(stderr, "dtengine prefill: resuming from %s after layer %lld of %d (written by %d "
            "ranks)\n", *dir, (long long)*done, o->model.layers, *ranks);
    return 0;
}

/* One shard of checkpoint `done` opened and checked: the format and layer
 * count, hidden (n, dim) F32 and positions (n) I64; *n its rows. */
static int shard_open(const popts_t *o, const char *path, int64_t done, dt_st_reader_t **r,
                      int64_t *n, dt_emsg_t *em)
{
    int rc = dt_st_open_nofollow(path, r, em);
    char want[32];

    if (rc < 0)
        return rc;
    const char *fmt = dt_st_meta(*r, "format"), *ld = dt_st_meta(*r, "layers_done");
    const dt_st_tensor_t *h = dt_st_find(*r, "hidden"), *p = dt_st_find(*r, "positions");
    snprintf(want, sizeof(want), "%lld", (long long)done);
    /* layers_done exactly as written ("3", not "3abc" or " 3") */
    if (!fmt || strcmp(fmt, PREFILL_FORMAT) != 0 || !ld || strcmp(ld, want) != 0)
        return dt_emsg_set(em, DT_EFORMAT, "%s: not a %s shard after %lld layers", path,
                           PREFILL_FORMAT, (long long)done);
    if (!p || p->dtype != DT_I64 || p->ndim != 1 || !h || h->dtype != DT_F32 || h->ndim != 2 ||
        h->shape[0] != p->shape[0] || h->shape[1] != o->model.dim)
        return dt_emsg_set(em, DT_ESHAPE, "%s: want hidden (n, %d) F32 and positions (n) I64",
                           path, o->model.dim);
    *n = p->shape[0];
    return 0;
}

/* Every rank: its rows of checkpoint `done` (in dir, written by `ranks`
 * ranks) into hidden (c, d). Written by this many ranks, the rank reads its
 * own shard, whose positions must be its own; by another number (a job
 * re-planned on fewer ranks), it takes the rows of its positions from every
 * shard, whichever rank wrote them. */
static int load(const popts_t *o, const dt_attn_spec_t *a, int R, int me, const char *dir,
                int64_t done, int ranks, int64_t c, const int64_t *pos, float *hidden,
                dt_emsg_t *em)
{
    const int64_t d = o->model.dim;
    dt_run_t runs[DT_LAYOUT_MAXRUNS];
    int nr = dt_layout_runs(a->layout, o->T, R, me, runs), rc = 0;
    int64_t got = 0;

    for (int q = ranks == R ? me : 0; q < (ranks == R ? me + 1 : ranks) && rc == 0; q++) {
        char name[64];
        dt_ckpt_shard_name(q, ranks, name);
        char *path = dt_xasprintf("%s/%s", dir, name);
        dt_st_reader_t *r = NULL;
        int64_t n = 0;
        int64_t *have = NULL;
        float *rows = NULL;
        if ((rc = shard_open(o, path, done, &r, &n, em)) == 0 && ranks == R && n != c)
            rc = dt_emsg_set(em, DT_ESHAPE, "%s: %lld rows; rank %d holds %lld", path,
                             (long long)n, me, (long long)c);
        if (rc == 0) {
            have = dt_xmallocarray((size_t)(n > 0 ? n : 1), sizeof(int64_t));
            rc = dt_st_read(r, "positions", have, (size_t)n * sizeof(int64_t), em);
        }
        if (rc == 0 && ranks == R) {
            if (memcmp(have, pos, (size_t)c * sizeof(int64_t)) != 0)
                rc = dt_emsg_set(em, DT_ELAYOUT, "%s: holds other positions than rank %d's",
                                 path, me);
            else if ((rc = dt_st_read(r, "hidden", hidden, (size_t)(c * d) * sizeof(float),
                                      em)) == 0)
                got = c;
        } else if (rc == 0) {
            rows = dt_xaligned((size_t)(n > 0 ? n : 1) * (size_t)d, sizeof(float));
            rc = dt_st_read(r, "hidden", rows, (size_t)(n * d) * sizeof(float), em);
            for (int64_t i = 0; i < n && rc == 0; i++) {
                /* the local row of position have[i], if this rank holds it */
                int64_t off = 0;
                for (int k = 0; k < nr; off += runs[k].len, k++)
                    if (have[i] >= runs[k].start && have[i] < runs[k].start + runs[k].len) {
                        memcpy(hidden + (off + have[i] - runs[k].start) * d, rows + i * d,
                               (size_t)d * sizeof(float));
                        got++;
                        break;
                    }
            }
            dt_wlink_heartbeat();
        }
        free(rows);
        free(have);
        dt_st_close(r);
        free(path);
    }
    if (rc == 0 && got != c)
        rc = dt_emsg_set(em, DT_EFORMAT, "%s: its %d shards hold %lld of rank %d's %lld "
                         "positions", dir, ranks, (long long)got, me, (long long)c);
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

/* A document: the first T tokens of one token file (io/tokshard.h: an
 * llm.c shard or a .npy array of ids) as the input, each position's target
 * the token after it; the last position's is the file's token T when there
 * is one, else none (DT_IGNORE). */
static int document(const popts_t *o, int32_t *xs, int32_t *ys, dt_emsg_t *em)
{
    dt_tok_shard_t *f = NULL;
    int64_t n, T = o->T;
    int rc;

    if ((rc = dt_tok_shard_new(o->data, &f, em)) < 0)
        return rc;
    n = dt_tok_shard_ntok(f);
    if (n < T) {
        rc = dt_emsg_set(em, DT_EINVAL, "%s: %lld tokens, fewer than the sequence length %lld "
                         "(a prefill reads the file's first T tokens)", o->data, (long long)n,
                         (long long)T);
    } else if ((rc = dt_tok_shard_read(f, 0, T, xs, em)) == 0) {
        memcpy(ys, xs + 1, (size_t)(T - 1) * sizeof(int32_t));
        ys[T - 1] = DT_IGNORE;
        if (n > T)
            rc = dt_tok_shard_read(f, T, 1, ys + T - 1, em);
    }
    for (int64_t i = 0; i < T && rc == 0; i++)
        if (xs[i] >= o->model.vocab || ys[i] >= o->model.vocab)
            rc = dt_emsg_set(em, DT_ERANGE, "%s: token %lld is %d, outside the vocabulary "
                             "of %d", o->data, (long long)(xs[i] >= o->model.vocab ? i : i + 1),
                             xs[i] >= o->model.vocab ? xs[i] : ys[i], o->model.vocab);
    dt_tok_shard_free(f);
    return rc;
}

/* The sequence: a document (a token file), or the recall task's sequence
 * 0, the one train sees at step 0. */
static int sequence(const popts_t *o, int32_t *xs, int32_t *ys, dt_emsg_t *em)
{
    dt_recall_opts_t task;
    int rc;

    if (strcmp(o->data, "recall") != 0)
        return document(o, xs, ys, em);
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
    dt_cmd_masks_t masks;     /* the sequence's masks, attn's */
    dt_model_layout_t lo;
    dt_model_t *m;
    float *P, *hidden, *last; /* last: rank 0's gathered logits (N, V) */
    float *nll;               /* (c) each row's -log p(target), NaN without one */
    dt_nll_sums_t sums;       /* by position bucket, over every rank */
    int32_t *xs, *ys, *x, *y;
    int64_t *pos;             /* (c) this rank's tokens' indices in the window */
    int64_t *rpos;            /* (c) their positions, pos + pos_offset (the likelihood's) */
    int64_t *rope;            /* (c) their RoPE positions: rpos, or with doc_positions =
                               * reset from their document's start */
    int64_t c, done;          /* tokens of this rank; layers done */
    double loss;
    int stopped;              /* the layers done at a stop (--stop-after-layer, W_STOP) */
    dt_memckpt_t mem;         /* in-memory checkpoints in the agent's memory (memckpt.h) */
#ifdef HAVE_CUDA
    /* --device cuda: the ring and the model on this rank's GPU; the host
     * keeps the hidden state only to checkpoint it, and the logits */
    dt_ring_t *ring;
    dt_gmodel_t *gm;
    float *logits; /* (c, V) */
    int pinned;      /* hidden is page-locked (dt_gmodel_host_alloc) */
    int64_t pending; /* the layers done whose hidden state is being copied; 0 none */
#endif
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
        rc = dt_memckpt_init(&p->mem, "dtengine prefill", o->mem_every, &p->em);
    if (rc == 0)
        rc = dt_model_cfg_check(&o->model, &p->em);
    if (rc == 0 && o->stop_after > o->model.layers)
        rc = dt_emsg_set(&p->em, DT_EUSAGE, "--stop-after-layer %lld: the model has %d layers",
                         (long long)o->stop_after, o->model.layers);
    p->attn.T = o->T;
    p->attn.H = o->model.heads;
    p->attn.Hkv = o->model.kv_heads;
    p->attn.D = dt_model_head_dim(&o->model);
    p->attn.causal = o->causal;
    if (rc == 0 && dt_layout_parse(o->layout, &p->attn.layout) < 0)
        rc = dt_emsg_set(&p->em, DT_EUSAGE, "--layout '%s': contiguous, zigzag or balanced",
                         o->layout);
    if (rc == 0)
        rc = dt_vocab_layout_runs(o->cuda ? DT_DEVICE_CUDA : DT_DEVICE_CPU, p->attn.layout,
                                  &p->em);
    if (rc == 0)
        rc = dt_attn_parse_branches(&p->attn, o->segments, o->dilations, &p->em);
    if (rc == 0)
        rc = dt_cmd_masks_init(&p->masks, &o->masks, o->T, o->causal, o->model.layers,
                               o->model.vocab, &p->attn, &p->em);
    if (rc == 0)
        rc = dt_attn_check(&p->attn, p->R, &p->em);
    if (rc == 0) {
        p->xs = dt_xmallocarray((size_t)o->T, sizeof(int32_t));
        p->ys = dt_xmallocarray((size_t)o->T, sizeof(int32_t));
        rc = sequence(o, p->xs, p->ys, &p->em);
    }
    /* its documents: the masks and the targets scored */
    if (rc == 0)
        dt_cmd_masks_sequence(&p->masks, p->xs, p->ys);
    /* external commits: the coordinator's earlier generations may have
     * left steps, which dt_cmd_save supersedes or keeps */
    if (rc == 0 && p->me == 0 && o->ckpt_dir && !o->resume && !o->resume_from && !o->external)
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
    /* the GPU path runs the layers and the head on the device */
    p->m = o->cuda ? NULL : dt_model_new_forward(&o->model, p->c);
    p->P = dt_xcalloc((size_t)p->lo.nparams, sizeof(float));
#ifdef HAVE_CUDA
    /* page-locked on the GPU path: its checkpoints' copies overlap compute */
    if (o->cuda && (p->hidden = dt_gmodel_host_alloc(p->c * o->model.dim)) != NULL)
        p->pinned = 1;
    else
#endif
        p->hidden = dt_xaligned((size_t)(p->c * o->model.dim), sizeof(float));
    p->x = dt_xmallocarray((size_t)p->c, sizeof(int32_t));
    p->y = dt_xmallocarray((size_t)p->c, sizeof(int32_t));
    p->pos = dt_xmallocarray((size_t)p->c, sizeof(int64_t));
    p->rpos = dt_xmallocarray((size_t)p->c, sizeof(int64_t));
    p->rope = dt_xmallocarray((size_t)p->c, sizeof(int64_t));
    dt_layout_positions(p->attn.layout, o->T, p->R, p->me, p->pos);
    for (int64_t i = 0; i < p->c; i++) {
        p->x[i] = p->xs[p->pos[i]];
        p->y[i] = p->ys[p->pos[i]];
        p->rpos[i] = p->pos[i] + o->pos_offset;
    }
    dt_cmd_masks_rope(&p->masks, p->pos, p->c, o->pos_offset, p->rope);
    dt_model_init(&o->model, &p->lo, o->seed, p->P);
}

/* ---- in-memory checkpoints (memckpt.h) ---------------------------------------- */

static int prefiller_save_pending(prefiller_t *p);

/* The manifest's model and plan objects as one text, to compare a copy's
 * with: the hidden state after a layer depends on nothing else but the
 * rows this rank holds (compared as well). */
static char *run_text(const popts_t *o)
{
    json_t *j = json_pack("{s:o, s:o, s:o}", "model", dt_ckpt_model_json(&o->model), "plan",
                          plan_json(o), "rng", rng_json(o));
    char *s = j ? json_dumps(j, JSON_COMPACT | JSON_SORT_KEYS) : NULL;
    json_decref(j);
    return s;
}

/* After `done` layers: this rank's hidden state and its rows' positions
 * into the agent's memory (the device's copied off first on the GPU). */
static void mem_save(prefiller_t *p, int64_t done)
{
    dt_st_writer_t *w = dt_st_writer_new();
    dt_emsg_t em = { "" };
    int64_t shape[2] = { p->c, p->o.model.dim };
    char *run = NULL, buf[32];

    if (!dt_memckpt_ready(&p->mem, done))
        goto out;
#ifdef HAVE_CUDA
    if (p->gm) {
        /* a checkpoint of this layer already being copied has the same
         * hidden state: wait for it (and write it); else copy it now */
        int same = p->pending == done, rc = prefiller_save_pending(p);
        if (rc == 0 && !same && (rc = dt_gmodel_hidden_copy_start(p->gm, p->hidden, &p->em)) == 0)
            rc = dt_gmodel_copy_wait(p->gm, NULL, &p->em);
        if (rc < 0) {
            fprintf(stderr, "dtengine prefill: layer %lld: the in-memory checkpoint's copy off "
                    "the device failed: %s\n", (long long)done, p->em.s);
            goto out;
        }
    }
#endif
    run = run_text(&p->o);
    snprintf(buf, sizeof(buf), "%lld", (long long)done);
    if (dt_st_writer_add(w, "hidden", DT_F32, 2, shape, p->hidden, &em) < 0 ||
        dt_st_writer_add(w, "positions", DT_I64, 1, &p->c, p->pos, &em) < 0 ||
        dt_st_writer_meta(w, "format", MEM_FORMAT, &em) < 0 ||
        dt_st_writer_meta(w, "layers_done", buf, &em) < 0 ||
        dt_st_writer_meta(w, "run", run ? run : "", &em) < 0)
        abort(); /* names and sizes we chose: a bug */
    dt_memckpt_write(&p->mem, done, w);
out:
    free(run);
    dt_st_writer_free(w);
}

/* --resume-from-memory LAYERS: this rank's hidden state from the copy its
 * agent kept, checked to be this run's (the layer, the model, plan and
 * data, the rows). DT_ECKPT for anything wrong: the coordinator then
 * resumes from disk. */
static int mem_load(prefiller_t *p)
{
    const popts_t *o = &p->o;
    dt_st_reader_t *r = NULL;
    char *run = run_text(o);
    dt_emsg_t em = { "" };
    int64_t *pos = dt_xmallocarray((size_t)(p->c > 0 ? p->c : 1), sizeof(int64_t));
    long long done;
    int rc;

    if ((rc = dt_memckpt_open_resume(&p->mem, o->resume_mem, MEM_FORMAT, &r, &p->em)) < 0)
        goto out;
    const char *rj = dt_st_meta(r, "run");
    if ((rc = dt_memckpt_meta_int(r, "layers_done", &done, &em)) < 0)
        goto bad;
    if (done != o->resume_mem || done > o->model.layers || rj == NULL || run == NULL ||
        strcmp(rj, run) != 0) {
        rc = dt_emsg_set(&em, DT_ECKPT, "written for another run (layer %lld, or another model, "
                         "plan or data)", done);
        goto bad;
    }
    if ((rc = dt_st_read(r, "hidden", p->hidden,
                         (size_t)(p->c * o->model.dim) * sizeof(float), &em)) < 0 ||
        (rc = dt_st_read(r, "positions", pos, (size_t)p->c * sizeof(int64_t), &em)) < 0)
        goto bad;
    if (p->c > 0 && memcmp(pos, p->pos, (size_t)p->c * sizeof(int64_t)) != 0) {
        rc = dt_emsg_set(&em, DT_ECKPT, "the rows of another rank or layout");
        goto bad;
    }
    p->done = done;
    if (p->me == 0)
        fprintf(stderr, "dtengine prefill: resuming from the in-memory checkpoint of layer "
                "%lld\n", done);
    goto out;
bad:
    rc = dt_emsg_set(&p->em, DT_ECKPT, "--resume-from-memory %lld: %s", (long long)o->resume_mem,
                     em.s);
out:
    dt_st_close(r);
    free(run);
    free(pos);
    return rc;
}

/* The hidden state to start from: with --resume, rank 0 picks the
 * checkpoint and every rank reads its shard; else (or when there is none)
 * the embedding. Agreed and reported; rank 0 prints the header. */
static int prefiller_load_or_resume(prefiller_t *p)
{
    const popts_t *o = &p->o;
    int rc = 0;

    /* the weights of init_from (the seeded ones otherwise, set up above) */
    if (o->spec.init_from != NULL)
        rc = dt_model_init_hf(&o->model, &p->lo, o->spec.init_from, p->P, &p->em);
    if ((rc = report(p, rc)) < 0)
        return rc;
    if (o->resume || o->resume_from) {
        char *dir = NULL;
        int ranks = 0;
        if (p->me == 0)
            rc = find(o, &dir, &p->done, &ranks, &p->em);
        free(dir);
        if ((rc = report(p, rc)) < 0)
            return rc;
        int k[2] = { (int)p->done, ranks };
        if ((rc = dt_comm_bcast_int(p->comm, &k[0])) < 0 ||
            (rc = dt_comm_bcast_int(p->comm, &k[1])) < 0) {
            dt_emsg_set(&p->em, rc, "broadcasting the resume layer failed");
        } else if ((p->done = k[0]) > 0) {
            /* every rank names the directory as rank 0 found it */
            char *sdir = o->resume_from ? dt_xstrdup(o->resume_from)
                                        : dt_ckpt_step_dir(o->ckpt_dir, p->done);
            rc = load(o, &p->attn, p->R, p->me, sdir, p->done, k[1], p->c, p->pos, p->hidden,
                      &p->em);
            free(sdir);
        }
    } else if (o->resume_mem) {
        rc = report(p, mem_load(p));
        if (rc < 0)
            return rc;
    }
    if (rc == 0 && p->done == 0 && p->m)
        rc = dt_model_embed(p->m, p->P, p->x, p->hidden, &p->em);
    else if (rc == 0 && p->done == 0 &&
             (rc = dt_tokens_check(p->c, o->model.vocab, p->x, 0, &p->em)) == 0)
        dt_embed_fwd_cpu(p->c, o->model.vocab, o->model.dim, p->x, p->P + p->lo.tok_emb,
                         p->hidden);
    if ((rc = report(p, rc)) < 0)
        return rc;
#ifdef HAVE_CUDA
    /* every rank joins the ring (its NCCL id through PMIx), then its GPU
     * takes the weights and the hidden state */
    if (o->cuda) {
        rc = p->R == 1 ? dt_ring_local_new(1, 0, &p->ring, &p->em)
                       : dt_ring_nccl_pmix_new(0, NULL, &p->ring, &p->em);
        if (rc == 0)
            rc = dt_gmodel_new(&o->model, &p->lo, p->c, o->dtype, p->ring, p->P, p->rope,
                               &p->gm, &p->em);
        if (rc == 0)
            rc = dt_gmodel_put_hidden(p->gm, p->hidden, &p->em);
        if ((rc = report(p, rc)) < 0)
            return rc;
    }
#endif
    if (p->me == 0) {
        printf("prefill: model dim=%d layers=%d heads=%d/%d ffn=%d vocab=%d params=%lld "
               "tokens=%lld ranks=%d layout=%s start_layer=%lld device=%s",
               o->model.dim, o->model.layers, o->model.heads, o->model.kv_heads, o->model.ffn,
               o->model.vocab, (long long)p->lo.nparams, (long long)o->T, p->R, o->layout,
               (long long)p->done,
               !o->cuda ? "cpu" : o->dtype == DT_F16 ? "cuda/fp16" : "cuda/bf16");
        if (!o->cuda) /* what the CPU runs (dtengine(1) OUTPUT) */
            printf(" kernel=%s blas_core=%s", dt_attn_cpu_kernel(dt_model_head_dim(&o->model)),
                   openblas_get_corename());
        printf("\n");
        fflush(stdout);
    }
    dt_wlink_progress(p->done, o->model.layers, o->T, NAN, 0, NAN); /* under an agent: running */
    return 0;
}

/* On the GPU path: wait for the copy of the hidden state started after
 * layer p->pending and write its checkpoint (rank 0 says how long the
 * host waited for the copy). Nothing pending: nothing. */
static int prefiller_save_pending(prefiller_t *p)
{
#ifdef HAVE_CUDA
    int64_t done = p->pending;
    double stall;
    int rc;

    if (done == 0)
        return 0;
    p->pending = 0;
    if ((rc = dt_gmodel_copy_wait(p->gm, &stall, &p->em)) < 0 ||
        (rc = save(p->comm, &p->o, done, p->c, p->hidden, p->pos, &p->em)) < 0)
        return rc;
    if (p->me == 0) {
        printf("checkpoint layer %lld copy_stall %.6f\n", (long long)done, stall);
        fflush(stdout);
    }
#else
    (void)p;
#endif
    return 0;
}

/* One layer forward; then the agent's requests, agreed over the ranks,
 * and with --ckpt-dir the layer's checkpoint when it is due (every
 * --ckpt-every layers), asked for, or the last before a stop. *stop: the
 * agent asked every rank to stop (not after the last layer: that is a
 * finished run). */
static int prefiller_layer(prefiller_t *p, int64_t l, int *stop)
{
    const popts_t *o = &p->o;
    double t0 = dt_clock_now();
    int64_t done = l + 1;
    int rc, req;

#ifdef HAVE_CUDA
    if (p->gm)
        rc = dt_gmodel_layer_fwd(p->gm, &p->attn, (int)l, &p->em);
    else
#endif
        rc = dt_model_layer_fwd(p->m, p->comm, &p->attn, p->P, (int)l, p->rope, p->hidden,
                                &p->em);
    if (rc < 0)
        return rc;
    double secs = dt_clock_now() - t0;
    req = dt_wlink_poll();
    double v[2] = { (req & DT_WLINK_CHECKPOINT) != 0, (req & DT_WLINK_STOP) != 0 };
    if ((rc = dt_comm_allreduce_sum_f64(p->comm, v, DT_ARRAY_SIZE(v))) < 0)
        return dt_emsg_set(&p->em, rc, "layer %lld: agreeing on the agent's requests failed",
                           (long long)done);
    *stop = v[1] > 0 && done < o->model.layers;
    int last = *stop || done == o->stop_after || done == o->model.layers;
    int save_now = o->ckpt_dir && (done % o->ckpt_every == 0 || v[0] > 0 || last);
#ifdef HAVE_CUDA
    if (p->gm) {
        /* the checkpoint is the host's copy of the device's hidden state:
         * the last one's copy overlapped this layer, so it is written now;
         * this one's is started and overlaps the next layer (written at
         * once when the run ends or stops here) */
        if ((rc = prefiller_save_pending(p)) < 0)
            return rc;
        if (save_now) {
            if ((rc = dt_gmodel_hidden_copy_start(p->gm, p->hidden, &p->em)) < 0)
                return rc;
            p->pending = done;
            if (last && (rc = prefiller_save_pending(p)) < 0)
                return rc;
        }
    } else
#endif
        if (save_now && (rc = save(p->comm, o, done, p->c, p->hidden, p->pos, &p->em)) < 0)
        return rc;
    if (!last && dt_memckpt_due(&p->mem, done, o->model.layers))
        mem_save(p, done);
    if (p->me == 0) {
        printf("layer %lld/%d seconds %.4f%s\n", (long long)done, o->model.layers, secs,
               save_now ? " checkpointed" : "");
        fflush(stdout);
    }
    dt_wlink_progress(done, o->model.layers, o->T, NAN, secs > 0 ? (double)o->T / secs : 0,
                      NAN);
    return 0;
}

/* The layers left, up to --stop-after-layer or the agent's W_STOP; agreed
 * and reported. */
static int prefiller_layers(prefiller_t *p)
{
    const popts_t *o = &p->o;
    int rc = 0, stop = 0;

    for (int64_t l = p->done; l < o->model.layers; l++) {
        if ((rc = prefiller_layer(p, l, &stop)) < 0)
            break;
        if (l + 1 == o->stop_after || stop) {
            p->stopped = (int)(l + 1);
            break;
        }
    }
    if ((rc = report(p, rc)) < 0)
        return rc;
    if (p->stopped && p->me == 0)
        fprintf(stderr, "dtengine prefill: stopped after layer %d (%s); --resume continues\n",
                p->stopped, stop ? "the agent asked" : "--stop-after-layer");
    return 0;
}

/* ---- likelihood over the sequence --------------------------------------------- */

/* Each row's negative log-likelihood of its target (the loss's own
 * kernel, one row at a time, in double), and their sums by position
 * bucket over every rank (io/nll.h; one all-reduce). */
static int nll_rows(prefiller_t *p, const float *logits)
{
    const int V = p->o.model.vocab;
    dt_nll_sums_t *s = &p->sums;
    int rc;

    memset(s, 0, sizeof(*s));
    p->nll = dt_xmallocarray((size_t)(p->c > 0 ? p->c : 1), sizeof(float));
    for (int64_t i = 0; i < p->c; i++) {
        double v = p->y[i] < 0 ? NAN : dt_xent_cpu(1, V, logits + i * V, &p->y[i], NULL, NULL);
        p->nll[i] = (float)v;
        dt_nll_add(s, p->rpos[i], v);
    }
    /* sum and count side by side: one all-reduce of both */
    if ((rc = dt_comm_allreduce_sum_f64(p->comm, s->sum, 2 * DT_NLL_BUCKETS)) < 0)
        return dt_emsg_set(&p->em, rc, "the likelihood all-reduce failed");
    return 0;
}

/* --out-dir: every rank its rows' likelihood, rank 0 the summary. */
static int write_nll(prefiller_t *p)
{
    int rc = dt_nll_write_shard(p->o.out_dir, p->me, p->c, p->nll, p->rpos, &p->em);

    if (rc == 0 && p->me == 0)
        rc = dt_nll_write_summary(p->o.out_dir, &p->sums, p->o.T, p->o.pos_offset, &p->em);
    return rc;
}

/* The head: the loss over the task's targets, then the last positions'
 * logits gathered on rank 0 and written (--logits). Each phase agreed
 * and reported. */
static int prefiller_head(prefiller_t *p)
{
    const popts_t *o = &p->o;
    int rc;

    const float *logits;
#ifdef HAVE_CUDA
    if (p->gm) {
        p->logits = dt_xaligned((size_t)(p->c * o->model.vocab), sizeof(float));
        rc = dt_gmodel_head(p->gm, p->logits, &p->em);
        /* a device failure is this rank's alone (agree.h) */
        if ((rc = report(p, rc)) < 0)
            return rc;
        rc = dt_model_xent(p->comm, p->c, o->model.vocab, p->logits, p->y, &p->loss, &p->em);
        logits = p->logits;
    } else
#endif
    {
        rc = dt_model_head(p->m, p->comm, p->P, p->hidden, p->y, &p->loss, &p->em);
        logits = dt_model_logits(p->m);
    }
    if ((rc = report(p, rc)) < 0)
        return rc;
    if ((rc = report(p, nll_rows(p, logits))) < 0)
        return rc;
    if (p->me == 0)
        p->last = dt_xaligned((size_t)(o->last * o->model.vocab), sizeof(float));
    rc = gather_last(p->comm, o, p->c, p->pos, logits, p->last);
    if ((rc = dt_agree_report(p->comm, rc, "dtengine prefill",
                              "gathering the last logits failed", NULL)) < 0)
        return rc;
    if (p->me == 0 && o->out_dir && dt_mkdirs(o->out_dir, 0700) < 0)
        rc = dt_emsg_set(&p->em, dt_err_errno(errno), "%s: cannot create directory: %s",
                         o->out_dir, strerror(errno));
    if (rc == 0 && p->me == 0 && o->logits) {
        int64_t shape[2] = { o->last, o->model.vocab };
        rc = dt_npy_save(o->logits, DT_F32, 2, shape, p->last, &p->em);
    }
    if ((rc = report(p, rc)) < 0 || o->out_dir == NULL)
        return rc;
    return report(p, write_nll(p));
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
    dt_nll_print(stdout, &p->sums, o->T, o->pos_offset);
    printf("result: tokens=%lld layers=%d last=%lld logits_sha256=%s\n", (long long)o->T,
           o->model.layers, (long long)o->last, hex);
    fflush(stdout);
    /* for the agent: the loss, the logits' digest and where they are (and
     * the perplexity summary, beside the likelihood shards) */
    char *path = o->logits ? realpath(o->logits, NULL) : NULL;
    char *ppl = NULL;
    const char *outs[2];
    int nout = 0;
    if (o->logits)
        outs[nout++] = path ? path : o->logits;
    if (o->out_dir) {
        char *f = dt_xasprintf("%s/perplexity.json", o->out_dir);
        ppl = realpath(f, NULL);
        outs[nout++] = ppl ? ppl : f;
        if (ppl)
            free(f);
        else
            ppl = f;
    }
    dt_wlink_result(o->model.layers, p->loss, NAN, hex, outs, nout);
    free(ppl);
    free(path);
}

static void prefiller_close(prefiller_t *p)
{
    dt_memckpt_close(&p->mem);
#ifdef HAVE_CUDA
    dt_gmodel_free(p->gm);
    dt_ring_free(p->ring);
    free(p->logits);
    if (p->pinned) {
        dt_gmodel_host_free(p->hidden);
        p->hidden = NULL;
    }
#endif
    dt_spec_free(&p->o.spec);
    free(p->o.logits_path);
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
    free(p->rpos);
    free(p->rope);
    free(p->nll);
    dt_cmd_masks_close(&p->masks);
}

/* ---- the command ------------------------------------------------------------ */

/* --print-settings: what this run resolved, from the run's own fields */
static void print_settings(const popts_t *o)
{
    dt_cmd_setting("model", "%s", o->model.name);
    dt_cmd_setting("tokens", "%lld", (long long)o->T);
    dt_cmd_setting("pos_offset", "%lld", (long long)o->pos_offset);
    dt_cmd_setting("causal", "%s", o->causal ? "yes" : "no");
    dt_cmd_setting("segments", o->segments ? "%s" : NULL, o->segments);
    dt_cmd_setting("dilations", o->dilations ? "%s" : NULL, o->dilations);
    dt_cmd_setting("layout", "%s", o->layout);
    dt_cmd_masks_settings(&o->masks);
    dt_cmd_setting("dtype", "%s", o->cuda ? dt_dtype_name(o->dtype) : "fp32");
    dt_cmd_setting("device", "%s", o->cuda ? "cuda" : "cpu");
    dt_cmd_setting("seed", "%llu", (unsigned long long)o->seed);
    dt_cmd_setting("data", "%s", o->data);
    dt_cmd_setting("ckpt_every", o->ckpt_dir ? "%lld" : NULL, (long long)o->ckpt_every);
    dt_cmd_setting("ckpt_keep", "%lld", (long long)o->ckpt_keep);
    if (o->mem_every > 0)
        dt_cmd_setting("mem_ckpt_every", "%lld", (long long)o->mem_every);
    else
        dt_cmd_setting("mem_ckpt_every", "%s", "none");
    dt_cmd_setting("ckpt_dir", o->ckpt_dir ? "%s" : NULL, o->ckpt_dir);
    dt_cmd_setting("output_dir", o->out_dir ? "%s" : NULL, o->out_dir);
}

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
    if (rc == 0 && p.o.print) {
        if (p.me == 0)
            print_settings(&p.o);
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
