/* SPDX-License-Identifier: MIT
 *
 * `dtengine train`: train the LLaMA-3 model with its sequence split over the
 * job's ranks (context parallel), AdamW with warm-up and cosine decay and
 * global-norm clipping, on the generated associative-recall task, with
 * checkpoints every K steps and exact resume.
 *
 * This file is the run: options, data, resume, the agreement, the
 * schedule, checkpoints and the result, as named steps. The step's device
 * part (forward and backward, clipping, AdamW, where the state lives) is
 * a backend's behind engine/cmd/train.h: the CPU's (train_cpu.c) or, with
 * --device cuda, the GPU's (train_gpu.c), chosen once (backend()).
 *
 * Checkpoints (io/ckpt.h, which writes and reads the shards):
 * DIR/step-NNNNNNNN/ with one safetensors shard per rank and manifest.json.
 * The flat parameter array and the two AdamW moments are cut into R
 * contiguous slices; shard r holds slice r as the 1-D float32 tensors
 * "params", "adam_m" and "adam_v", with metadata "offset" and "nparams"
 * (and "format" = "dt-train-1"). A resume reads every
 * shard's slice back, so a checkpoint written by R ranks resumes on any R'.
 * For the recall task the data cursor is the step: sequence i is a function
 * of (seed, i) alone. For token shards the loader's cursor is saved. Either
 * way a resumed run sees exactly the data the uninterrupted one would.
 *
 * Data: the generated recall task, or llm.c token shards (--data GLOB,
 * io/tokshard.h, engine/data/loader.h) read in a seeded shuffled order whose cursor is saved in
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

#include <errno.h>
#include <jansson.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "common/clock.h"
#include "common/fileio.h"
#include "common/macros.h"
#include "common/mem.h"
#include "common/sha256.h"
#include "engine/cmd/agree.h"
#include "engine/attn/attn.h"
#include "io/ckpt.h"
#include "engine/cmd/cmd.h"
#include "engine/cmd/save.h"
#include "engine/cmd/train.h"
#include "engine/data/loader.h"
#include "engine/data/recall.h"
#include "io/tokshard.h"
#include "engine/model/model.h"
#include "io/npy.h"
#include "engine/model/optim.h"
#include "io/safetensors.h"
#include "engine/cmd/options.h"
#include "spec/spec.h"
#include "engine/wlink.h"

static void usage(FILE *f)
{
    fprintf(f, "usage: dtengine train [--spec FILE] [--init-from HFDIR | --model PRESET\n"
               "                      [--dim N --layers N --heads N --kv-heads N --ffn N\n"
               "                      --vocab N --head-dim D --rope-theta B --tied yes|no\n"
               "                      --norm-eps E --rope-scaling none|llama3 --rope-factor F\n"
               "                      --rope-low-freq-factor L --rope-high-freq-factor H\n"
               "                      --rope-original-max-pos N]]\n"
               "                      --seq-len T [--data recall|TOKENFILES] [--steps N]\n"
               "                      [--pos-offset P]\n"
               "                      [--ckpt-dir DIR [--ckpt-every K] [--ckpt-keep N]]\n"
               "                      [--ckpt-commit self|external]\n"
               "                      [--resume | --resume-from DIR | --resume-from-memory STEP]\n"
               "                      [--mem-ckpt-every K]\n"
               "                      [--seed S] [--lr X] [--min-lr X] [--warmup N]\n"
               "                      [--weight-decay X] [--clip X] [--adam-eps X]\n"
               "                      [--layout contiguous|zigzag|balanced] [--no-causal]\n"
               "                      [--segments w1,.. --dilations r1,..]\n"
               "                      [--doc-mask none|eot [--eot-token N]\n"
               "                      [--doc-positions continue|reset]]\n"
               "                      [--sliding-window W [--sliding-window-layers all|every:K]]\n"
               "                      [--block-pattern P [--block-size B]]\n"
               "                      [--batch B] [--recompute none|layer] [--dp N]\n"
               "                      [--shard none|optimizer|gradients|parameters]\n"
               "                      [--offload none|activations,optimizer] [--ckpt-dtype fp32|bf16]\n"
               "                      [--params-out FILE.npy]\n"
               "                      [--recall-keys K] [--recall-values V] [--recall-pairs P]\n"
               "                      [--recall-queries Q] [--device cpu|cuda [--dtype bf16|fp16]]\n"
               "                      [--print-settings]\n"
               "Every option but --spec, --resume, --resume-from, --resume-from-memory,\n"
               "--ckpt-commit, --params-out\n"
               "and --print-settings is a job-spec key (dt-spec(5)), with its default;\n"
               "--seq-len is tokens.\n"
               "PRESET: tiny, llama3-8b, llama3-70b, or custom with every shape flag\n");
}

/* train's own option; the rest are job-spec keys and the shared ones
 * (engine/cmd/options.h) */
enum { O_PARAMS_OUT = 1 };
static const dt_cmd_opt_t own_options[] = {
    { "params-out", 1, O_PARAMS_OUT },
    { NULL, 0, 0 },
};

static int own_option(int id, const char *value, void *arg, dt_emsg_t *em)
{
    dt_train_opts_t *o = arg;

    (void)em;
    if (id == O_PARAMS_OUT)
        o->params_out = value;
    return 0;
}

/* Options (and --spec) into o: every setting from the job spec they make,
 * with the key table's defaults (spec/spec.h); a spec's keys about
 * resources and Slurm are not the engine's. */
static int parse(int argc, char **argv, dt_train_opts_t *o, dt_emsg_t *em)
{
    dt_spec_t *s = &o->spec;
    int rc;

    dt_cmd_common_t c;

    memset(o, 0, sizeof(*o));
    if ((rc = dt_cmd_options(argc, argv, DT_KIND_TRAIN, own_options, own_option, o, s, &c,
                             em)) != 0)
        return rc;
    o->print = c.print;
    o->resume = c.resume;
    o->resume_from = c.resume_from;
    o->resume_mem = c.resume_mem;
    o->external = c.external;
    /* auto (unset) is the planner's; alone the engine writes none */
    o->mem_every = dt_spec_given(s, "mem_ckpt_every") ? s->mem_ckpt_every : 0;
    o->cuda = dt_spec_device_id(s) == DT_DEVICE_CUDA;
    o->dtype = dt_spec_dtype_id(s);
    o->T = s->tokens;
    o->steps = dt_spec_int(s, "steps");
    o->seed = (uint64_t)dt_spec_int(s, "seed");
    o->lr = dt_spec_real(s, "lr");
    o->min_lr = dt_spec_real(s, "min_lr");
    o->wd = dt_spec_real(s, "weight_decay");
    o->clip = dt_spec_real(s, "clip");
    o->eps = dt_spec_real(s, "adam_eps");
    o->warmup = dt_spec_warmup(s);
    o->causal = dt_spec_causal(s);
    o->nondet = !dt_spec_deterministic(s);
    o->layout = dt_layout_name(dt_spec_layout(s));
    o->segments = s->segments;
    o->dilations = s->dilations;
    o->data = dt_spec_word(s, "data");
    o->batch = dt_spec_int(s, "batch");
    o->dp = (int)dt_spec_int(s, "dp");
    o->recompute = s->recompute != NULL && strcmp(s->recompute, "layer") == 0;
    /* auto (unset) is the planner's to choose; alone the engine keeps
     * the whole state */
    o->shard = DT_SHARD_NONE;
    if (s->shard != NULL)
        dt_shard_parse("--shard", s->shard, &o->shard, NULL);
    o->offload = dt_spec_offload(s);
    o->ckpt_dtype = dt_spec_ckpt_dtype(s);
    /* the recall task's sizes: 0 leaves them to the task's defaults, the
     * key table's (engine/data/recall.c) */
    o->rkeys = (int)s->recall_keys;
    o->rvalues = (int)s->recall_values;
    o->rpairs = (int)s->recall_pairs;
    o->rqueries = (int)s->recall_queries;
    /* checkpoints where a directory is given: every ckpt_every steps
     * (default: one at the end) */
    o->ckpt_dir = s->ckpt_dir;
    o->ckpt_every = o->ckpt_dir != NULL ? dt_spec_ckpt_every(s) : 0;
    o->ckpt_keep = dt_spec_int(s, "ckpt_keep");
    if ((rc = dt_cmd_model_resolve(s, &o->model, em)) < 0)
        return rc;
    o->pos_offset = s->pos_offset;
    if ((rc = dt_cmd_masks_options(s, DT_KIND_TRAIN, &o->masks, em)) < 0)
        return rc;
    if (o->resume && o->ckpt_dir == NULL)
        return dt_emsg_set(em, DT_EUSAGE, "--resume needs --ckpt-dir");
    if (o->resume && o->resume_from)
        return dt_emsg_set(em, DT_EUSAGE, "--resume and --resume-from exclude each other");
    if (o->resume_mem && (o->resume || o->resume_from))
        return dt_emsg_set(em, DT_EUSAGE, "--resume-from-memory excludes --resume and "
                           "--resume-from");
    /* what this device's engine runs: the planner's and submit's answer */
    dt_emsg_t why = { "" };
    if (dt_vocab_runs(dt_spec_device_id(s), DT_KIND_TRAIN, o->shard, o->dp, &why) < 0 ||
        dt_vocab_offload_runs(dt_spec_device_id(s), DT_KIND_TRAIN, o->offload, &why) < 0)
        return dt_emsg_set(em, DT_EUSAGE, "%s", why.s);
    /* the kept layer inputs are recompute = layer's */
    if (dt_spec_device_id(s) == DT_DEVICE_CUDA && !o->recompute &&
        ((o->offload & DT_OFFLOAD_ACTIVATIONS) || o->ckpt_dtype != DT_CKPT_FP32))
        return dt_emsg_set(em, DT_EUSAGE,
                           "%s concerns the layer inputs recompute = layer keeps: give "
                           "--recompute layer",
                           o->offload & DT_OFFLOAD_ACTIVATIONS ? "offload = activations"
                                                               : "ckpt_dtype = bf16");
    return 0;
}

/* ---- checkpoints ------------------------------------------------------------ */

static json_t *cursor_json(const dt_loader_cursor_t *cur)
{
    if (cur == NULL)
        return json_null();
    return json_pack("{s:I, s:I, s:I}", "epoch", (json_int_t)cur->epoch, "shard",
                     (json_int_t)cur->shard, "seq", (json_int_t)cur->seq);
}

/* Write checkpoint STEP (all ranks): each rank's slice [off, off + len)
 * of the parameters and both moments, P, M and V pointing at its first
 * element (its shard io/ckpt.h's, the ranks' sequence engine/cmd/save.h's).
 * Sharded or not, the same files: a slice per rank, which any run reads
 * back whatever its split. */
static int save(dt_comm_t *comm, const dt_train_opts_t *o, int64_t step, int64_t n,
                int64_t off, int64_t len, const float *P, const float *M, const float *V,
                const dt_loader_cursor_t *cur, const dt_loss_scale_t *ls, dt_emsg_t *em)
{
    int me = dt_comm_rank(comm), skipped, rc;
    dt_st_writer_t *w = dt_ckpt_train_writer_new(n, off, len, P, M, V);
    dt_cmd_save_t sv = { .cmd = "dtengine train", .root = o->ckpt_dir, .step = step,
                         .external = o->external, .keep = (int)o->ckpt_keep,
                         .data_cursor = step };
    if (me == 0) {
        sv.model = dt_ckpt_model_json(&o->model);
        /* the sharding it was written under: informative (a resume reads
         * the slices whatever its own split) */
        sv.plan = json_pack("{s:s, s:I, s:I, s:s, s:I}", "layout", o->layout, "seq_len",
                            (json_int_t)o->T, "batch", (json_int_t)o->batch, "shard",
                            dt_shard_name(o->shard), "dp", (json_int_t)o->dp);
        dt_cmd_plan_pos_offset(sv.plan, o->pos_offset);
        dt_cmd_plan_masks(sv.plan, &o->masks);
        sv.rng = json_pack("{s:I, s:s, s:o}", "seed", (json_int_t)o->seed, "data", o->data,
                           "cursor", cursor_json(cur));
        if (ls != NULL)
            json_object_set_new(sv.rng, "loss_scale",
                                json_pack("{s:f, s:I}", "scale", ls->scale, "clean",
                                          (json_int_t)ls->clean));
    }
    rc = dt_cmd_save(comm, &sv, w, &skipped, em);
    json_decref(sv.model);
    json_decref(sv.plan);
    json_decref(sv.rng);
    dt_st_writer_free(w);
    return rc;
}

/* dt_ckpt_latest's report of a checkpoint --resume passed over: the ones
 * to set aside (set_aside) into ud, a dt_train_passed_t. */
static void skipped(const char *dir, int err, const char *why, void *ud)
{
    dt_train_passed_t *p = ud;
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
static int set_aside(const dt_train_opts_t *o, const dt_train_passed_t *p, dt_emsg_t *em)
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
static int load(const dt_train_opts_t *o, int64_t n, float *P, int64_t plo, int64_t pn, float *M,
                float *V, int64_t mlo, int64_t mn, dt_loader_t *loader, int64_t *step,
                dt_train_passed_t *passed, dt_loss_scale_t *ls, dt_emsg_t *em)
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
    json_t *want = dt_ckpt_model_json(&o->model);
    if (!json_equal(want, man.model)) {
        rc = dt_emsg_set(em, DT_EINVAL, "%s: written for another model shape", dir);
        json_decref(want);
        goto out;
    }
    json_decref(want);
    if ((rc = dt_cmd_check_pos_offset(dir, man.plan, o->pos_offset, em)) < 0 ||
        (rc = dt_cmd_check_masks(dir, man.plan, &o->masks, em)) < 0)
        goto out;
    /* this rank's parts (sharded: its slice), read from the shards that
     * hold them, whatever the writer's split */
    rc = dt_ckpt_read_train_range(dir, &man, n, P, plo, pn, M, V, mlo, mn, heartbeat, NULL, em);
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
    /* fp16's loss scale goes on where it was (a checkpoint without one,
     * bf16's or fp32's, starts it afresh) */
    json_t *lj = json_object_get(man.rng, "loss_scale");
    if (rc == 0 && ls != NULL && lj != NULL) {
        json_t *sj = json_object_get(lj, "scale"), *cl = json_object_get(lj, "clean");
        double sc = json_is_number(sj) ? json_number_value(sj) : 0;
        if (!(sc >= 1 && sc <= 1e38) || !json_is_integer(cl) || json_integer_value(cl) < 0) {
            rc = dt_emsg_set(em, DT_EFORMAT, "%s: the manifest's loss_scale is not a scale >= 1 "
                             "with a non-negative integer 'clean'", dir);
        } else {
            ls->scale = sc;
            ls->clean = json_integer_value(cl);
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

/* ---- the trainer ------------------------------------------------------------ */

/* The step's backend (engine/cmd/train.h): the GPU's for --device cuda
 * (which parse refuses in a build without CUDA), else the CPU's. */
static const dt_train_backend_t *backend(const dt_train_opts_t *o)
{
#ifdef HAVE_CUDA
    if (o->cuda)
        return &dt_train_gpu;
#endif
    (void)o;
    return &dt_train_cpu;
}

/* The step's dt_train_ctl_t summed over the job's ranks: packed and
 * unpacked here only. */
static int step_ctl_agree(dt_comm_t *comm, dt_train_ctl_t *ctl)
{
    double v[6] = { ctl->hits, ctl->targets, ctl->ckpt_requested, ctl->stop_requested,
                    ctl->stop_ckpt, ctl->loss };
    int rc = dt_comm_allreduce_sum_f64(comm, v, DT_ARRAY_SIZE(v));

    if (rc < 0)
        return rc;
    ctl->hits = v[0];
    ctl->targets = v[1];
    ctl->ckpt_requested = v[2] > 0;
    ctl->stop_requested = v[3] > 0;
    ctl->stop_ckpt = v[4] > 0;
    ctl->loss = v[5];
    return 0;
}

/* Size the recall task for the sequence and the model's vocabulary. */
static void size_task(dt_trainer_t *t)
{
    const dt_train_opts_t *o = &t->o;
    dt_recall_opts_t *task = &t->task;

    dt_recall_opts_default(task);
    task->T = o->T;
    task->seed = o->seed;
    /* planted pairs must fit in 10% of the sequence: the default count
     * shrinks to fit, a given one is checked */
    int pairs = (int)((o->T + 1) / 10 - 1) / 3;
    task->n_pairs = o->rpairs ? o->rpairs : pairs < task->n_pairs ? pairs : task->n_pairs;
    task->n_queries = o->rqueries ? o->rqueries
                      : task->n_pairs < task->n_queries ? task->n_pairs : task->n_queries;
    task->n_keys = o->rkeys ? o->rkeys : task->n_keys;
    task->n_values = o->rvalues ? o->rvalues : task->n_values;
    /* the filler takes the rest of the model's vocabulary */
    int64_t filler = (int64_t)o->model.vocab - DT_RECALL_NSPECIAL - task->n_keys -
                     task->n_values;
    task->n_filler = filler >= 1 ? (int)filler : 1;
}

/* Options, data and the attention spec; 1 for --help (nothing to agree:
 * every rank has the same argv), else agreed and reported. */
static int trainer_init(dt_trainer_t *t, dt_comm_t *comm, int argc, char **argv)
{
    dt_train_opts_t *o = &t->o;
    int rc;

    memset(t, 0, sizeof(*t));
    t->comm = comm;
    t->W = t->R = dt_comm_size(comm);
    t->me = t->r = dt_comm_rank(comm);
    t->N = 1;
    t->cring = comm;
    t->last_loss = NAN;
    t->passed.me = t->me;
    if ((rc = parse(argc, argv, o, &t->em)) == 1)
        return 1;
    if (rc == 0)
        rc = dt_memckpt_init(&t->mem, "dtengine train", o->mem_every, &t->em);
    if (rc == 0) {
        t->be = backend(o);
        rc = dt_model_cfg_check(&o->model, &t->em);
    }
    /* dp = N: N rings of R ranks, ring i the job's ranks [i R, (i + 1) R)
     * (consecutive ranks share a node) */
    if (rc == 0 && t->W % o->dp != 0)
        rc = dt_emsg_set(&t->em, DT_EUSAGE, "--dp %d does not divide the job's %d ranks (dp "
                         "rings of ranks / dp ranks each)", o->dp, t->W);
    if (rc == 0) {
        t->N = o->dp;
        t->R = t->W / t->N;
        t->r = t->me % t->R;
        t->i = t->me / t->R;
    }
    /* the flat array is cut into one slice per rank, whatever the units'
     * sizes: a split fails only when some rank would get nothing */
    if (rc == 0 && o->shard != DT_SHARD_NONE) {
        dt_model_layout_t lo;
        dt_model_layout_init(&lo, &o->model);
        if (lo.nparams < t->W)
            rc = dt_emsg_set(&t->em, DT_EUSAGE, "--shard %s over %d ranks: the model's %lld "
                             "parameters leave ranks without a slice", dt_shard_name(o->shard),
                             t->W, (long long)lo.nparams);
        dt_model_layout_close(&lo);
    }
    int recall = rc == 0 && strcmp(o->data, "recall") == 0;
    size_task(t);
    if (rc == 0 && !recall) {
        dt_loader_opts_t lopt = { .T = o->T, .shuffle = 1, .seed = o->seed,
                                  .vocab = o->model.vocab };
        rc = dt_loader_new_glob(o->data, &lopt, &t->loader, &t->em);
    }
    if (rc == 0 && recall && t->task.n_pairs < 1)
        rc = dt_emsg_set(&t->em, DT_EINVAL, "--seq-len %lld is too short for the recall task "
                         "(at least 40)", (long long)o->T);
    if (rc == 0 && recall && (rc = dt_recall_check(&t->task, &t->em)) == 0 &&
        dt_recall_vocab(&t->task) > o->model.vocab)
        rc = dt_emsg_set(&t->em, DT_EINVAL, "the recall task needs a vocabulary of %lld, the "
                         "model has %d", (long long)dt_recall_vocab(&t->task), o->model.vocab);
    t->attn.T = o->T;
    t->attn.H = o->model.heads;
    t->attn.Hkv = o->model.kv_heads;
    t->attn.D = dt_model_head_dim(&o->model);
    t->attn.causal = o->causal;
    t->attn.nondet = o->nondet;
    if (rc == 0 && dt_layout_parse(o->layout, &t->attn.layout) < 0)
        rc = dt_emsg_set(&t->em, DT_EUSAGE, "--layout '%s': contiguous, zigzag or balanced",
                         o->layout);
    if (rc == 0)
        rc = dt_vocab_layout_runs(o->cuda ? DT_DEVICE_CUDA : DT_DEVICE_CPU, t->attn.layout,
                                  &t->em);
    if (rc == 0)
        rc = dt_attn_parse_branches(&t->attn, o->segments, o->dilations, &t->em);
    if (rc == 0)
        rc = dt_cmd_masks_init(&t->masks, &o->masks, o->T, o->causal, o->model.layers,
                               o->model.vocab, &t->attn, &t->em);
    if (rc == 0)
        rc = dt_attn_check(&t->attn, t->R, &t->em);
    if ((rc = dt_agree_report(comm, rc, "dtengine train", t->em.s, NULL)) < 0 || t->N == 1)
        return rc;
    /* the rings, and across them the replicas at each ring rank */
    t->cring = NULL;
    rc = dt_comm_split(comm, t->i, t->r, &t->cring, &t->em);
    if (rc == 0)
        rc = dt_comm_split(comm, t->r, t->i, &t->crep, &t->em);
    return dt_agree_report(comm, rc, "dtengine train", t->em.s, NULL);
}

/* The model, its parameters at step 0 and every buffer of the run. */
static void trainer_alloc(dt_trainer_t *t)
{
    const dt_train_opts_t *o = &t->o;

    t->c = dt_layout_local(o->T, t->R);
    dt_model_layout_init(&t->lo, &o->model);
    t->n = t->lo.nparams;
    /* sharded: this rank keeps and updates the moments of its slice of
     * the parameters only (shard = optimizer), its gradient too
     * (gradients), and its parameters too (parameters) */
    t->moff = 0;
    t->mlen = t->pn = t->gn = t->n;
    if (o->shard != DT_SHARD_NONE)
        dt_model_slice(t->n, t->R, t->r, t->N, t->i, &t->moff, &t->mlen);
    if (o->shard >= DT_SHARD_GRADIENTS)
        t->gn = t->mlen;
    if (o->shard == DT_SHARD_PARAMETERS)
        t->pn = t->mlen;
    /* the backend's model and step buffers, maybe the host's P, M, V */
    t->be->alloc(t);
    if (t->P == NULL) {
        t->P = dt_xcalloc((size_t)(t->pn > 0 ? t->pn : 1), sizeof(float));
        t->M = dt_xcalloc((size_t)(t->mlen > 0 ? t->mlen : 1), sizeof(float));
        t->V = dt_xcalloc((size_t)(t->mlen > 0 ? t->mlen : 1), sizeof(float));
    }
    t->xs = dt_xmallocarray((size_t)o->T, sizeof(int32_t));
    t->ys = dt_xmallocarray((size_t)o->T, sizeof(int32_t));
    t->x = dt_xmallocarray((size_t)t->c, sizeof(int32_t));
    t->y = dt_xmallocarray((size_t)t->c, sizeof(int32_t));
    t->pos = dt_xmallocarray((size_t)t->c, sizeof(int64_t));
    t->rpos = dt_xmallocarray((size_t)t->c, sizeof(int64_t));
    dt_layout_positions(t->attn.layout, o->T, t->R, t->r, t->pos);
    for (int64_t i = 0; i < t->c; i++)
        t->rpos[i] = t->pos[i] + o->pos_offset;
    /* this rank's part only: a sharded rank never holds the whole */
    dt_model_init_range(&o->model, &t->lo, o->seed, t->pn == t->n ? 0 : t->moff, t->pn, t->P);
    t->acfg = (dt_adamw_cfg_t){ .beta1 = 0.9, .beta2 = 0.95, .eps = o->eps,
                                .weight_decay = o->wd };
    t->sched = (dt_lr_sched_t){ .max_lr = o->lr, .min_lr = o->min_lr, .warmup = o->warmup,
                                .total = o->steps };
    /* fp16 (GPU) scales its loss; bf16 and fp32 do not */
    t->scaling = o->cuda && o->dtype == DT_F16;
    t->ls = (dt_loss_scale_t){ .scale = t->scaling ? DT_LOSS_SCALE_INIT : 1.0, .clean = 0 };
}

/* ---- in-memory checkpoints (memckpt.h) ---------------------------------------- */

#define MEM_FORMAT "dt-train-memory-1"

static int trainer_save_pending(dt_trainer_t *t);

/* The model's manifest object as text, to compare a copy's with. */
static char *model_text(const dt_train_opts_t *o)
{
    json_t *m = dt_ckpt_model_json(&o->model);
    char *s = json_dumps(m, JSON_COMPACT | JSON_SORT_KEYS);
    json_decref(m);
    return s;
}

/* This rank's state after `done` steps as it holds it, P (pn floats from
 * the parameters' offset), M and V (mlen from moff), with the data cursor
 * and the loss scale: what a resume of this rank needs, nothing more.
 * Written on the copies' thread during the next step: on the host, from
 * the arrays themselves (the next update waits for that: mem_hand); on the
 * GPU, the state's copy off the device starts now (or is the disk
 * checkpoint's of this step) and goes to the thread once it is on the host,
 * before the next update (mem_hand), so the step waits for neither. */
static void mem_save(dt_trainer_t *t, int64_t done)
{
    dt_st_writer_t *w;
    dt_emsg_t em = { "" };
    char b[7][96];
    char *model = NULL;
    int rc = 0;

    if (!dt_memckpt_ready(&t->mem, done))
        return;
    if (t->be->copy_start && t->pending != done) {
        /* the host copy is free once the thread has written from it and
         * a pending disk checkpoint is written */
        dt_memckpt_sync(&t->mem);
        if ((rc = trainer_save_pending(t)) < 0 ||
            (rc = t->be->copy_start(t, t->P, t->M, t->V)) < 0) {
            fprintf(stderr, "dtengine train: step %lld: the in-memory checkpoint's copy off the "
                    "device failed: %s\n", (long long)done, t->em.s);
            return;
        }
    }
    w = dt_st_writer_new();
    model = model_text(&t->o);
    dt_loader_cursor_t cur = { 0 };
    if (t->loader)
        dt_loader_get_cursor(t->loader, &cur);
    snprintf(b[0], sizeof(b[0]), "%lld", (long long)done);
    snprintf(b[1], sizeof(b[1]), "%lld", (long long)t->n);
    snprintf(b[2], sizeof(b[2]), "%lld", (long long)(t->pn == t->n ? 0 : t->moff));
    snprintf(b[3], sizeof(b[3]), "%lld", (long long)t->moff);
    snprintf(b[4], sizeof(b[4]), "%llu,%lld,%lld", (unsigned long long)cur.epoch,
             (long long)cur.shard, (long long)cur.seq);
    snprintf(b[5], sizeof(b[5]), "%.17g", t->ls.scale);
    snprintf(b[6], sizeof(b[6]), "%lld", (long long)t->ls.clean);
    int64_t pn = t->pn, mn = t->mlen;
    if ((rc = dt_st_writer_add(w, "params", DT_F32, 1, &pn, t->P, &em)) < 0 ||
        (rc = dt_st_writer_add(w, "adam_m", DT_F32, 1, &mn, t->M, &em)) < 0 ||
        (rc = dt_st_writer_add(w, "adam_v", DT_F32, 1, &mn, t->V, &em)) < 0)
        abort(); /* names and sizes we chose: a bug */
    static const char *const keys[] = { "step", "nparams", "params_offset", "moments_offset",
                                        "cursor", "loss_scale", "loss_clean" };
    rc = dt_st_writer_meta(w, "format", MEM_FORMAT, &em);
    for (size_t i = 0; i < DT_ARRAY_SIZE(keys) && rc == 0; i++)
        rc = dt_st_writer_meta(w, keys[i], b[i], &em);
    if (rc == 0)
        rc = dt_st_writer_meta(w, "model", model ? model : "", &em);
    if (rc < 0)
        abort();
    free(model);
    if (t->be->copy_start) {
        t->mem_w = w;
        t->mem_step = done;
        return;
    }
    dt_memckpt_write_async(&t->mem, done, w);
}

/* Before an update: the in-memory copy whose state came off the device
 * during this step goes to the copies' thread (the copy waited for: done
 * by now, the step's compute covered it); and where the update changes
 * the host's P, M, V, the thread has finished reading them. */
static void mem_hand(dt_trainer_t *t)
{
    if (t->mem_w) {
        if (t->be->copy_wait(t, NULL) < 0) {
            fprintf(stderr, "dtengine train: step %lld: the in-memory checkpoint's copy off the "
                    "device failed: %s\n", (long long)t->mem_step, t->em.s);
            dt_st_writer_free(t->mem_w);
        } else {
            dt_memckpt_write_async(&t->mem, t->mem_step, t->mem_w);
        }
        t->mem_w = NULL;
    }
    if (t->be->copy_start == NULL || (t->be->updates_host && t->be->updates_host(t)))
        dt_memckpt_sync(&t->mem);
}

/* --resume-from-memory STEP: this rank's own state from the copy its agent
 * kept, checked to be this run's (the step, the model, the slices).
 * DT_ECKPT for anything wrong: the coordinator then resumes from disk. */
static int mem_load(dt_trainer_t *t)
{
    const dt_train_opts_t *o = &t->o;
    dt_st_reader_t *r = NULL;
    long long step, n, poff, moff, clean;
    char *model = model_text(o);
    dt_emsg_t em = { "" };
    int rc;

    dt_wlink_heartbeat();
    if ((rc = dt_memckpt_open_resume(&t->mem, o->resume_mem, MEM_FORMAT, &r, &t->em)) < 0)
        goto out;
    const char *mj = dt_st_meta(r, "model");
    if ((rc = dt_memckpt_meta_int(r, "step", &step, &em)) < 0 ||
        (rc = dt_memckpt_meta_int(r, "nparams", &n, &em)) < 0 ||
        (rc = dt_memckpt_meta_int(r, "params_offset", &poff, &em)) < 0 ||
        (rc = dt_memckpt_meta_int(r, "moments_offset", &moff, &em)) < 0 ||
        (rc = dt_memckpt_meta_int(r, "loss_clean", &clean, &em)) < 0)
        goto bad;
    if (step != o->resume_mem || n != t->n || poff != (t->pn == t->n ? 0 : t->moff) ||
        moff != t->moff || mj == NULL || model == NULL || strcmp(mj, model) != 0) {
        rc = dt_emsg_set(&em, DT_ECKPT, "written for another run (step %lld, %lld parameters "
                         "from %lld, moments from %lld, or another model)", step, n, poff, moff);
        goto bad;
    }
    if ((rc = dt_st_read(r, "params", t->P, (size_t)t->pn * sizeof(float), &em)) < 0 ||
        (rc = dt_st_read(r, "adam_m", t->M, (size_t)t->mlen * sizeof(float), &em)) < 0 ||
        (rc = dt_st_read(r, "adam_v", t->V, (size_t)t->mlen * sizeof(float), &em)) < 0)
        goto bad;
    const char *cs = dt_st_meta(r, "cursor"), *ls = dt_st_meta(r, "loss_scale");
    unsigned long long ce;
    long long csh, cseq;
    double sc;
    if (cs == NULL || sscanf(cs, "%llu,%lld,%lld", &ce, &csh, &cseq) != 3 || ls == NULL ||
        sscanf(ls, "%lf", &sc) != 1 || !(sc >= 1 && sc <= 1e38) || clean < 0) {
        rc = dt_emsg_set(&em, DT_ECKPT, "a bad data cursor or loss scale");
        goto bad;
    }
    if (t->loader) {
        dt_loader_cursor_t cur = { .epoch = ce, .shard = csh, .seq = cseq };
        if ((rc = dt_loader_set_cursor(t->loader, &cur, &em)) < 0)
            goto bad;
    }
    if (t->scaling)
        t->ls = (dt_loss_scale_t){ .scale = sc, .clean = clean };
    t->start = step;
    if (t->me == 0)
        fprintf(stderr, "dtengine train: resuming from the in-memory checkpoint of step %lld\n",
                step);
    goto out;
bad:
    rc = dt_emsg_set(&t->em, DT_ECKPT, "--resume-from-memory %lld: %s", (long long)o->resume_mem,
                     em.s);
out:
    dt_st_close(r);
    free(model);
    return rc;
}

/* With --resume or --resume-from, every rank loads the checkpoint; then
 * rank 0 sets aside the ones passed over. Agreed and reported; rank 0
 * prints the run's header. */
static int trainer_load_or_resume(dt_trainer_t *t)
{
    const dt_train_opts_t *o = &t->o;
    int rc = 0;

    t->passed.external = o->external;
    if (o->resume || o->resume_from)
        rc = load(o, t->n, t->P, t->pn == t->n ? 0 : t->moff, t->pn, t->M, t->V, t->moff,
                  t->mlen, t->loader, &t->start, &t->passed, t->scaling ? &t->ls : NULL,
                  &t->em);
    else if (o->resume_mem)
        rc = mem_load(t);
    /* no checkpoint to continue: the weights of init_from, every rank its
     * own copy (each reads only the tensors' byte ranges) */
    if (rc == 0 && t->start == 0 && o->spec.init_from != NULL) {
        if (t->pn == t->n) {
            rc = dt_model_init_hf(&o->model, &t->lo, o->spec.init_from, t->P, &t->em);
        } else {
            /* read whole, kept in part (the model directory's tensors are
             * whole; a rank has the whole model for a moment) */
            float *all = dt_xcalloc((size_t)t->n, sizeof(float));
            rc = dt_model_init_hf(&o->model, &t->lo, o->spec.init_from, all, &t->em);
            memcpy(t->P, all + t->moff, (size_t)t->mlen * sizeof(float));
            free(all);
        }
    }
    if ((rc = dt_agree_report(t->comm, rc, "dtengine train", t->em.s, NULL)) < 0)
        return rc;
    /* every rank has chosen and read its checkpoint: only now are the
     * ones passed over renamed */
    if (t->me == 0)
        rc = set_aside(o, &t->passed, &t->em);
    if ((rc = dt_agree_report(t->comm, rc, "dtengine train", t->em.s, NULL)) < 0)
        return rc;
    /* the backend takes the loaded state (agreed and reported) */
    if (t->be->start && (rc = t->be->start(t)) < 0)
        return rc;
    if (t->me == 0) {
        char off[64];
        dt_vocab_format_set(off, sizeof(off), dt_offload_names, o->offload);
        printf("train: model dim=%d layers=%d heads=%d/%d ffn=%d vocab=%d params=%lld "
               "tokens=%lld batch=%lld ranks=%d layout=%s steps=%lld start=%lld device=%s "
               "shard=%s dp=%d recompute=%s offload=%s ckpt_dtype=%s",
               o->model.dim, o->model.layers, o->model.heads, o->model.kv_heads, o->model.ffn,
               o->model.vocab, (long long)t->n, (long long)o->T, (long long)o->batch, t->W,
               o->layout, (long long)o->steps, (long long)t->start,
               !o->cuda ? "cpu" : o->dtype == DT_F16 ? "cuda/fp16" : "cuda/bf16",
               dt_shard_name(o->shard), t->N, o->recompute ? "layer" : "none", off,
               dt_ckpt_dtype_names[o->ckpt_dtype]);
        if (t->be->print_header)
            t->be->print_header(t);
        printf("\n");
    }
    return 0;
}

/* The B sequences of one step, forward and backward (the backend's seq):
 * the step's gradient is the mean of theirs, *loss of their losses; ctl
 * gets this rank's recall hits and counted targets. With dp = N a step
 * takes N B sequences, sequences i B .. i B + B - 1 on ring i (a batch of
 * N B sequences on one ring takes the same ones, in the same order). */
static int trainer_batch(dt_trainer_t *t, int64_t step, double *loss, dt_train_ctl_t *ctl)
{
    const dt_train_opts_t *o = &t->o;
    int rc = 0;

    *loss = 0;
    for (int64_t k = 0; k < o->batch * t->N; k++) {
        int64_t b = k - t->i * o->batch; /* this ring's b-th sequence, when in [0, B) */
        if (t->loader)
            /* every ring reads the step's N B sequences and keeps its
             * own: the cursor moves alike on every rank */
            rc = dt_loader_next(t->loader, t->xs, t->ys, &t->em);
        else if (b >= 0 && b < o->batch)
            rc = dt_recall_xy(&t->task, (uint64_t)(step * o->batch * t->N + k), t->xs, t->ys,
                              &t->em);
        if (rc < 0)
            return rc;
        if (b < 0 || b >= o->batch)
            continue;
        /* its documents: the masks, the targets scored, the positions */
        dt_cmd_masks_sequence(&t->masks, t->xs, t->ys);
        for (int64_t i = 0; i < t->c; i++) {
            t->x[i] = t->xs[t->pos[i]];
            t->y[i] = t->ys[t->pos[i]];
        }
        if (o->masks.reset)
            dt_cmd_masks_rope(&t->masks, t->pos, t->c, o->pos_offset, t->rpos);
        if ((rc = t->be->seq(t, b, loss, ctl)) < 0)
            return rc;
    }
    return 0;
}

/* The agent's requests, agreed with the step's metrics (dt_train_ctl_t). The
 * agent sends each request to every rank, and they arrive at different
 * steps: any rank's request is acted on by all at once, and a rank whose
 * copy comes later has it already done (owed). A failed all-reduce leaves
 * the ranks out of step: the run ends with it. */
static int trainer_agree_step(dt_trainer_t *t, int64_t step, dt_train_ctl_t *ctl)
{
    int req = dt_wlink_poll(), ask = (req & DT_WLINK_CHECKPOINT) != 0, rc;

    if (ask && t->owed > 0) {
        t->owed--;
        ask = 0;
    }
    ctl->ckpt_requested = ask;
    ctl->stop_requested = (req & DT_WLINK_STOP) != 0;
    ctl->stop_ckpt = (req & DT_WLINK_STOP_CKPT) != 0;
    if ((rc = step_ctl_agree(t->comm, ctl)) < 0)
        return dt_emsg_set(&t->em, rc, "step %lld: agreeing on the step's metrics and requests "
                           "failed", (long long)step);
    if (ctl->ckpt_requested && !ask)
        t->owed++;
    ctl->ckpt_requested |= ctl->stop_requested && ctl->stop_ckpt;
    return 0;
}

static int trainer_save_pending(dt_trainer_t *t);

/* One step: the batch, the agreement, clipping, AdamW, and the step's
 * line and progress report. */
static int trainer_step(dt_trainer_t *t, int64_t step, dt_train_ctl_t *ctl)
{
    const dt_train_opts_t *o = &t->o;
    double t0 = dt_clock_now(), loss;
    int rc;

    if ((rc = trainer_batch(t, step, &loss, ctl)) < 0)
        return rc;
    /* the loss in the agreement: the ranks' shares summed (loss_shared),
     * or with dp the replicas' mean, from each ring's rank 0 */
    if (t->be->loss_shared)
        ctl->loss = loss;
    else if (t->N > 1)
        ctl->loss = t->r == 0 ? loss / (double)t->N : 0.0;
    if ((rc = trainer_agree_step(t, step, ctl)) < 0)
        return rc;
    if (t->be->loss_shared || t->N > 1)
        loss = ctl->loss;
    double norm;
    float gscale = 1.0f;
    if ((rc = t->be->clip(t, step, &norm, &gscale)) < 0)
        return rc;
    /* the last checkpoint's copy off the device overlapped this step's
     * compute: save it (its writing is not the step's time: tokens/s
     * leaves it out, as it does the checkpoints written at once) */
    if (t->pending != 0) {
        double w0 = dt_clock_now();
        if ((rc = trainer_save_pending(t)) < 0)
            return rc;
        t0 += dt_clock_now() - w0;
    }
    /* fp16's loss scaling: an overflowed gradient skips the update and
     * halves the scale; a window of clean steps doubles it (the same
     * norm on every rank: the same decision) */
    int skipped = 0;
    if (t->scaling && isfinite(loss) && !isfinite(norm) && t->ls.scale > 1.0) {
        skipped = 1;
        t->ls.scale /= 2;
        t->ls.clean = 0;
    } else if (t->scaling && isfinite(norm) && ++t->ls.clean >= DT_LOSS_SCALE_WINDOW) {
        t->ls.scale *= 2;
        t->ls.clean = 0;
    }
    if (!isfinite(loss) || (!isfinite(norm) && !skipped))
        /* every rank has the same loss and norm: all stop here. A run
         * resumed from a checkpoint diverges again at the same step,
         * which the coordinator takes for a deterministic failure */
        return dt_emsg_set(&t->em, DT_EDIVERGED, "step %lld: loss %g, gradient norm %g: "
                           "training diverged (a lower --lr, or more --warmup)",
                           (long long)step, loss, norm);
    double lr = dt_lr_at(&t->sched, step);
    mem_hand(t);
    if (!skipped && (rc = t->be->update(t, step, lr, gscale)) < 0)
        return rc;
    double dt = dt_clock_now() - t0;
    double accuracy = ctl->targets > 0 ? ctl->hits / ctl->targets : 0.0;
    int64_t done = step + 1;
    if (t->me == 0) {
        /* accuracy at the counted targets: recall accuracy for the recall
         * task, next-token accuracy for token shards */
        printf("step %lld loss %.9f tokens/s %.0f %s %.3f lr %.3g norm %.4g",
               (long long)step, loss, (double)(o->T * o->batch * t->N) / dt,
               t->loader ? "acc" : "recall", accuracy, lr, norm);
        if (t->scaling) /* the scale the next step uses */
            printf(" loss_scale %.0f%s", t->ls.scale, skipped ? " skipped" : "");
        printf("\n");
        fflush(stdout);
    }
    t->last_loss = loss;
    t->acc_win[t->acc_n++ % DT_TRAIN_ACC_WINDOW] = accuracy;
    /* every ring's sequences: N B of T tokens a step */
    dt_wlink_progress(done, o->steps, done * o->T * o->batch * t->N, loss,
                      (double)(o->T * o->batch * t->N) / dt, accuracy);
    return 0;
}

/* Write the checkpoint of step done from the host's P, M, V; stall_s:
 * how long the host waited for their copy off the GPU (< 0: none made). */
static int trainer_write(dt_trainer_t *t, int64_t done, double t1, double stall_s)
{
    const dt_train_opts_t *o = &t->o;
    dt_loader_cursor_t cursor = { 0 };
    int rc;

    if (t->loader)
        dt_loader_get_cursor(t->loader, &cursor);
    /* unsharded every rank holds everything and writes its share of it;
     * sharded, the slice it keeps */
    int64_t off = t->moff, len = t->mlen;
    const float *p = t->P, *m = t->M, *v = t->V;
    if (o->shard == DT_SHARD_NONE) {
        off = t->n * t->me / t->W;
        len = t->n * (t->me + 1) / t->W - off;
        m += off, v += off;
    }
    if (t->pn == t->n)
        p += off;
    if ((rc = save(t->comm, o, done, t->n, off, len, p, m, v, t->loader ? &cursor : NULL,
                   t->scaling ? &t->ls : NULL,
                   &t->em)) < 0)
        return rc;
    /* parameters and both moments, written and fsynced by all ranks */
    if (t->me == 0) {
        printf("checkpoint step %lld bytes %lld seconds %.4f", (long long)done,
               (long long)(3 * t->n * (int64_t)sizeof(float)), dt_clock_now() - t1);
        if (stall_s >= 0)
            printf(" copy_stall %.6f", stall_s);
        printf("\n");
        fflush(stdout);
    }
    return 0;
}

/* The checkpoint whose copy off the device was started after step
 * pending: wait for the copy (the stall: normally none, the step's
 * compute covered it) and write it. Nothing pending: nothing. */
static int trainer_save_pending(dt_trainer_t *t)
{
    double t1 = dt_clock_now(), stall;
    int64_t done = t->pending;
    int rc;

    if (done == 0)
        return 0;
    t->pending = 0;
    if ((rc = t->be->copy_wait(t, &stall)) < 0)
        return rc;
    return trainer_write(t, done, t1, stall);
}

/* After step done: a checkpoint when it is due or was asked for. Where
 * the state is off the host (the GPU) its copy to the host starts now and
 * the files are written during the next step (trainer_save_pending), or
 * at once when the run ends here (now = 1: the last step, or a stop). */
static int trainer_checkpoint(dt_trainer_t *t, int64_t done, int asked, int now)
{
    const dt_train_opts_t *o = &t->o;

    if (asked && o->ckpt_dir == NULL && t->me == 0)
        fprintf(stderr, "dtengine train: step %lld: the agent asked for a checkpoint, but "
                "there is no --ckpt-dir: none written\n", (long long)done);
    if (o->ckpt_dir == NULL || (done % o->ckpt_every != 0 && !asked))
        return 0;
    if (t->be->copy_start) {
        dt_memckpt_sync(&t->mem); /* the host copy is not being read */
        int rc = t->be->copy_start(t, t->P, t->M, t->V);
        if (rc < 0)
            return rc;
        t->pending = done;
        return now ? trainer_save_pending(t) : 0;
    }
    return trainer_write(t, done, dt_clock_now(), -1);
}

/* The steps from start to --steps, or to a W_STOP; agreed and reported. */
static int trainer_run(dt_trainer_t *t)
{
    int rc = 0;

    for (int64_t step = t->start; step < t->o.steps; step++) {
        dt_train_ctl_t ctl = { 0 };
        int64_t done = step + 1;
        if ((rc = trainer_step(t, step, &ctl)) < 0 ||
            (rc = trainer_checkpoint(t, done, ctl.ckpt_requested,
                                     done == t->o.steps || ctl.stop_requested)) < 0)
            break;
        if (dt_memckpt_due(&t->mem, done, t->o.steps) && !ctl.stop_requested)
            mem_save(t, done);
        /* a stop after the last step is a finished run */
        if (ctl.stop_requested && done < t->o.steps) {
            if (t->me == 0) {
                printf("stopped at step %lld\n", (long long)done);
                fflush(stdout);
            }
            t->stopped = 1;
            break;
        }
    }
    return dt_agree_report(t->comm, rc, "dtengine train", t->em.s, NULL);
}

static int trainer_report(dt_trainer_t *t, const float *P, const char *digest);

int dt_trainer_gather(dt_trainer_t *t, float *all)
{
    int rc = 0;

    if (t->crep) {
        dt_comm_slicing_t dsl = { t->n, t->R * t->N, t->r * t->N };
        rc = dt_comm_allgather_slices_f32(t->crep, &dsl, all);
    }
    dt_comm_slicing_t rsl = { t->n, t->R, 0 };
    if (rc == 0)
        rc = dt_comm_allgather_slices_f32(t->cring, &rsl, all);
    return rc;
}

/* [a, b) of the parameters that ranks hold in slices (shard = parameters:
 * the GPU engine's) gathered over MPI: with dp the part in this ring
 * slice across the replicas first (into its place in dst), then around
 * the ring. */
static int gather_piece(dt_trainer_t *t, int64_t a, int64_t b, float *dst)
{
    const dt_comm_slicing_t sl = { t->n, t->R, 0 };
    int64_t pa = a > t->moff ? a : t->moff;
    const float *mine = t->P + (pa < t->moff + t->mlen ? pa - t->moff : 0);
    float *part = NULL;
    int rc = 0;

    if (t->crep) {
        const int64_t s0 = t->n * t->r / t->R, s1 = t->n * (t->r + 1) / t->R;
        int64_t ra = a > s0 ? a : s0, rb = b < s1 ? b : s1;
        const dt_comm_slicing_t dsl = { t->n, t->R * t->N, t->r * t->N };
        part = dt_xcalloc((size_t)(rb > ra ? rb - ra : 1), sizeof(float));
        if (rb > ra)
            rc = dt_comm_gather_range_f32(t->crep, &dsl, ra, rb, mine, part);
        mine = part;
    }
    if (rc == 0)
        rc = dt_comm_gather_range_f32(t->cring, &sl, a, b, mine, dst);
    free(part);
    return rc < 0 ? dt_emsg_set(&t->em, rc, "gathering the parameters [%lld, %lld) failed",
                                (long long)a, (long long)b)
                  : 0;
}

/* Rank 0: --params-out, the parameters' digest and the result line (for
 * the agent too). A failed --params-out is rank 0's alone. */
static int trainer_finish(dt_trainer_t *t)
{
    int rc;

    /* the trained parameters off the device (the GPU): rank 0's whole
     * copy, or with shard = parameters every rank's slice */
    dt_memckpt_sync(&t->mem);
    if (t->be->copy_start && (t->me == 0 || t->pn != t->n) &&
        ((rc = t->be->copy_start(t, t->P, NULL, NULL)) < 0 ||
         (rc = t->be->copy_wait(t, NULL)) < 0)) {
        fprintf(stderr, "dtengine train: %s\n", t->em.s);
        return rc;
    }
    if (t->pn == t->n)
        return trainer_report(t, t->P, NULL);
    /* shard = parameters: no rank holds the whole array; its digest is
     * taken a unit's length at a time as the pieces are gathered (and
     * --params-out gathers the whole on rank 0) */
    int64_t u = t->m ? dt_model_gather_max(t->m) : dt_model_unit_max(&t->o.model);
    float *piece = dt_xcalloc((size_t)u, sizeof(float)), *all = NULL;
    dt_sha256_t *h = dt_sha256_new();
    char hex[65];
    if (t->me == 0 && t->o.params_out)
        all = dt_xcalloc((size_t)t->n, sizeof(float));
    rc = 0;
    for (int64_t a = 0; a < t->n && rc == 0; a += u) {
        int64_t b = t->n - a < u ? t->n : a + u;
        if (t->m != NULL) {
            if ((rc = dt_model_gather(t->m, t->cring, t->P, a, b, piece, &t->em)) < 0)
                break;
        } else if ((rc = gather_piece(t, a, b, piece)) < 0) {
            break;
        }
        dt_sha256_update(h, piece, (size_t)(b - a) * sizeof(float));
        if (all)
            memcpy(all + a, piece, (size_t)(b - a) * sizeof(float));
    }
    dt_sha256_final(h, hex); /* frees h */
    free(piece);
    if (rc < 0) {
        if (t->me == 0)
            fprintf(stderr, "dtengine train: %s\n", t->em.s);
    } else {
        rc = trainer_report(t, all, hex);
    }
    free(all);
    return rc;
}

/* Rank 0's part of trainer_finish, with the whole parameters P (or NULL
 * without --params-out when digest, their sha256, is given). */
static int trainer_report(dt_trainer_t *t, const float *P, const char *digest)
{
    const dt_train_opts_t *o = &t->o;
    char hex[65];
    int rc;

    if (t->me != 0)
        return 0;
    if (o->params_out &&
        (rc = dt_npy_save(o->params_out, DT_F32, 1, &t->n, P, &t->em)) < 0) {
        fprintf(stderr, "dtengine train: %s\n", t->em.s);
        return rc;
    }
    if (digest)
        memcpy(hex, digest, sizeof(hex));
    else
        dt_sha256_hex(P, (size_t)t->n * sizeof(float), hex);
    /* loss last: scripts read params_sha256 where it always was */
    printf("result: steps=%lld params_sha256=%s loss=%.9f\n", (long long)o->steps, hex,
           t->last_loss);
    fflush(stdout);
    double acc_mean = 0;
    int64_t k = t->acc_n < DT_TRAIN_ACC_WINDOW ? t->acc_n : DT_TRAIN_ACC_WINDOW;
    for (int64_t i = 0; i < k; i++)
        acc_mean += t->acc_win[i] / (double)k;
    dt_wlink_result(o->steps, t->last_loss, k ? acc_mean : NAN, hex, NULL, 0);
    return 0;
}

static void trainer_close(dt_trainer_t *t)
{
    dt_st_writer_free(t->mem_w); /* a run that failed before handing it */
    dt_memckpt_close(&t->mem);
    if (t->cring != t->comm)
        dt_comm_free(t->cring);
    dt_comm_free(t->crep);
    free(t->passed.steps);
    dt_loader_free(t->loader);
    dt_spec_free(&t->o.spec);
    if (t->be)
        t->be->close(t);
    dt_model_layout_close(&t->lo);
    free(t->P);
    free(t->M);
    free(t->V);
    free(t->xs);
    free(t->ys);
    free(t->x);
    free(t->y);
    free(t->pos);
    free(t->rpos);
    dt_cmd_masks_close(&t->masks);
}

/* ---- the command ------------------------------------------------------------ */

/* --print-settings: what this run resolved, from the run's own fields */
static void print_settings(const dt_trainer_t *t)
{
    const dt_train_opts_t *o = &t->o;
    const dt_recall_opts_t *k = &t->task;
    int recall = strcmp(o->data, "recall") == 0;

    dt_cmd_setting("model", "%s", o->model.name);
    dt_cmd_setting("tokens", "%lld", (long long)o->T);
    dt_cmd_setting("pos_offset", "%lld", (long long)o->pos_offset);
    dt_cmd_setting("causal", "%s", o->causal ? "yes" : "no");
    dt_cmd_setting("deterministic", "%s", o->nondet ? "no" : "yes");
    dt_cmd_setting("segments", o->segments ? "%s" : NULL, o->segments);
    dt_cmd_setting("dilations", o->dilations ? "%s" : NULL, o->dilations);
    dt_cmd_setting("layout", "%s", o->layout);
    dt_cmd_masks_settings(&o->masks);
    dt_cmd_setting("dtype", "%s", o->cuda ? dt_dtype_name(o->dtype) : "fp32");
    dt_cmd_setting("device", "%s", o->cuda ? "cuda" : "cpu");
    dt_cmd_setting("steps", "%lld", (long long)o->steps);
    dt_cmd_setting("seed", "%llu", (unsigned long long)o->seed);
    dt_cmd_setting("batch", "%lld", (long long)o->batch);
    dt_cmd_setting("dp", "%d", o->dp);
    dt_cmd_setting("shard", "%s", dt_shard_name(o->shard));
    dt_cmd_setting("recompute", "%s", o->recompute ? "layer" : "none");
    char off[64];
    dt_vocab_format_set(off, sizeof(off), dt_offload_names, o->offload);
    dt_cmd_setting("offload", "%s", off);
    dt_cmd_setting("ckpt_dtype", "%s", dt_ckpt_dtype_names[o->ckpt_dtype]);
    dt_cmd_setting("lr", "%.9g", o->lr);
    dt_cmd_setting("min_lr", "%.9g", o->min_lr);
    dt_cmd_setting("warmup", "%lld", (long long)o->warmup);
    dt_cmd_setting("weight_decay", "%.9g", o->wd);
    dt_cmd_setting("clip", "%.9g", o->clip);
    dt_cmd_setting("adam_eps", "%.9g", o->eps);
    dt_cmd_setting("data", "%s", o->data);
    dt_cmd_setting("recall_keys", recall ? "%d" : NULL, k->n_keys);
    dt_cmd_setting("recall_values", recall ? "%d" : NULL, k->n_values);
    dt_cmd_setting("recall_pairs", recall ? "%d" : NULL, k->n_pairs);
    dt_cmd_setting("recall_queries", recall ? "%d" : NULL, k->n_queries);
    dt_cmd_setting("ckpt_every", o->ckpt_dir ? "%lld" : NULL, (long long)o->ckpt_every);
    dt_cmd_setting("ckpt_keep", "%lld", (long long)o->ckpt_keep);
    if (o->mem_every > 0)
        dt_cmd_setting("mem_ckpt_every", "%lld", (long long)o->mem_every);
    else
        dt_cmd_setting("mem_ckpt_every", "%s", "none");
    dt_cmd_setting("ckpt_dir", o->ckpt_dir ? "%s" : NULL, o->ckpt_dir);
}

int dt_cmd_train(dt_comm_t *comm, int argc, char **argv)
{
    dt_trainer_t t;
    int rc = trainer_init(&t, comm, argc, argv);

    if (rc == 1) {
        if (t.me == 0)
            usage(stdout);
        trainer_close(&t);
        return DT_EXIT_OK;
    }
    if (rc == 0 && t.o.print) {
        if (t.me == 0)
            print_settings(&t);
        trainer_close(&t);
        return DT_EXIT_OK;
    }
    if (rc == 0) {
        trainer_alloc(&t);
        rc = trainer_load_or_resume(&t);
    }
    if (rc == 0)
        rc = trainer_run(&t);
    if (rc == 0 && !t.stopped)
        rc = trainer_finish(&t);
    trainer_close(&t);
    return rc == 0 && t.stopped ? DT_EXIT_STOPPED : dt_exit_code(rc);
}
