/* SPDX-License-Identifier: MIT
 *
 * `dtctl export SRC --hf OUT`: the parameters of a training checkpoint as
 * a Hugging Face model directory (io/hf_export.h dt_hf_write: config.json,
 * the weights under Hugging Face's names and layout, the index when
 * sharded) that transformers loads as LlamaForCausalLM with no conversion and
 * `dtengine --init-from OUT` reads back. SRC is a checkpoint step
 * directory, a checkpoint root (its newest step that verifies) or a job id
 * (its newest committed checkpoint: the coordinator says which and where,
 * and never reads the files). dtctl reads and writes as the user who runs
 * it. Everything is checked before the first byte is written: OUT holds
 * no model, the checkpoint verifies (every shard's SHA-256), it is a
 * training checkpoint, its manifest's model parses.
 *
 * Not here: the Hugging Face format (io/hf_export.c, io/hf_config.c,
 * io/hf.c), checkpoint directories (io/ckpt.c), the AdamW moments (never
 * read: an export is the model), tokenizers.
 */
#include "config.h"

#include <dirent.h>
#include <errno.h>
#include <getopt.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/stat.h>

#include "cli/dtctl.h"
#include "common/mem.h"
#include "common/proto.h"
#include "common/wire.h"
#include "io/ckpt.h"
#include "io/hf.h"
#include "io/hf_config.h"
#include "io/hf_export.h"
#include "io/safetensors.h"
#include "spec/model.h"
#include "spec/spec.h"

/* transformers' default max_shard_size, "5GB" */
#define DEFAULT_SHARD_BYTES 5000000000LL
#define PREFILL_FORMAT "dt-prefill-1" /* engine/cmd/prefill.c's shards */

typedef struct xopts {
    const char *src, *out;
    dt_dtype_t dtype;
    int64_t shard_bytes;
} xopts_t;

static void usage(FILE *f)
{
    fprintf(f, "usage: dtctl export SRC --hf OUT [--dtype fp32|bf16|fp16] [--shard-size SIZE]\n"
               "                   [--json]\n"
               "SRC: a checkpoint step directory (with manifest.json), a checkpoint root (its\n"
               "newest step that verifies), or a job id (its newest committed checkpoint).\n"
               "Writes OUT as a Hugging Face LlamaForCausalLM directory: config.json and the\n"
               "weights in --dtype (default fp32, lossless), one model.safetensors or shards of\n"
               "at most SIZE bytes with model.safetensors.index.json (SIZE: N, NK, NM, NG in\n"
               "powers of 1000, NKiB, NMiB, NGiB in powers of 1024; default 5G; 0: one file).\n");
}

/* --shard-size: digits and a unit, as transformers' max_shard_size. */
static int parse_size(const char *s, int64_t *out, dt_emsg_t *em)
{
    static const struct {
        const char *unit;
        int64_t mul;
    } units[] = {
        { "", 1 },           { "k", 1000 },          { "kb", 1000 },
        { "m", 1000000 },    { "mb", 1000000 },      { "g", 1000000000 },
        { "gb", 1000000000 }, { "kib", 1LL << 10 },  { "mib", 1LL << 20 },
        { "gib", 1LL << 30 },
    };
    const char *p = s;
    int64_t v = 0;

    for (; *p >= '0' && *p <= '9'; p++)
        if (__builtin_mul_overflow(v, 10, &v) || __builtin_add_overflow(v, *p - '0', &v))
            break;
    if (p != s && (*p < '0' || *p > '9'))
        for (size_t i = 0; i < sizeof(units) / sizeof(units[0]); i++)
            if (strcasecmp(p, units[i].unit) == 0 && !__builtin_mul_overflow(v, units[i].mul, out))
                return 0;
    return dt_emsg_set(em, DT_EUSAGE, "--shard-size '%s': bytes as N, NK, NM, NG (powers of "
                       "1000) or NKiB, NMiB, NGiB (of 1024), at most 2^63-1; 0 for one file", s);
}

static int parse(dtctl_t *ctl, int argc, char **argv, xopts_t *o, dt_emsg_t *em)
{
    static const struct option lo[] = {
        { "hf", required_argument, NULL, 'o' },
        { "dtype", required_argument, NULL, 'd' },
        { "shard-size", required_argument, NULL, 's' },
        { "json", no_argument, NULL, 'j' },
        { "help", no_argument, NULL, 'h' },
        { NULL, 0, NULL, 0 },
    };
    int c, rc;

    memset(o, 0, sizeof(*o));
    o->dtype = DT_F32;
    o->shard_bytes = DEFAULT_SHARD_BYTES;
    opterr = 0;
    optind = 0;
    while ((c = getopt_long(argc, argv, "", lo, NULL)) != -1) {
        switch (c) {
        case 'o': o->out = optarg; break;
        case 'd':
            if (strcmp(optarg, "fp32") == 0)
                o->dtype = DT_F32;
            else if (strcmp(optarg, "bf16") == 0)
                o->dtype = DT_BF16;
            else if (strcmp(optarg, "fp16") == 0)
                o->dtype = DT_F16;
            else
                return dt_emsg_set(em, DT_EUSAGE, "--dtype '%s': fp32, bf16 or fp16", optarg);
            break;
        case 's':
            if ((rc = parse_size(optarg, &o->shard_bytes, em)) < 0)
                return rc;
            break;
        case 'j': ctl->json = 1; break;
        case 'h': return 1;
        default:
            return dt_emsg_set(em, DT_EUSAGE, "unknown option or missing value '%s'",
                               argv[optind - 1]);
        }
    }
    if (optind + 1 != argc)
        return dt_emsg_set(em, DT_EUSAGE, "one SRC, please (a checkpoint directory or a job id)");
    o->src = argv[optind];
    if (o->out == NULL || o->out[0] == '\0')
        return dt_emsg_set(em, DT_EUSAGE, "--hf OUT is required: the directory to write");
    return 0;
}

/* The exit code for a failure on the user's files (dtctl(1) EXIT STATUS):
 * what no retry can mend is bad input (2); a permission is 5; a disk that
 * is full or failing, 1. */
static int exit_for(int rc)
{
    switch (rc) {
    case DT_EACCES:
    case DT_EPERM: return DTCTL_DENIED;
    case DT_ENOSPC:
    case DT_EIO:
    case DT_ENOMEM: return DTCTL_ERROR;
    default: return DTCTL_USAGE;
    }
}

/*-- the source -------------------------------------------------------------*/

static void skipped(const char *dir, int err, const char *why, void *ud)
{
    (void)dir, (void)err;
    dtctl_error(ud, "export", "skipping ", why);
}

/* The job's checkpoint root, from SHOW: the spec's ckpt_dir, else the job
 * directory's ckpt/ (as dtcoordd gives the workers, coordinator/run.c).
 * A job of another kind is refused here. An exit code. */
static int job_root(dtctl_t *ctl, long long id, char **root)
{
    dt_wire_job_ref_t ref = { .id = id };
    dt_emsg_t em = { "" };
    json_t *res = NULL;
    dt_spec_t s;
    int rc, parsed;

    *root = NULL;
    if ((rc = dtctl_request(ctl, DT_MSG_SHOW, dt_wire_show_encode(&ref), &res, &em)) < 0)
        return dtctl_fail(ctl, "export", rc, &em);
    const char *spec = json_string_value(json_object_get(res, "spec"));
    const char *dir = json_string_value(json_object_get(json_object_get(res, "job"), "dir"));
    memset(&s, 0, sizeof(s));
    parsed = spec != NULL && dt_spec_parse("job", spec, &s, &em) == 0;
    if (parsed && s.kind != NULL && strcmp(s.kind, "train") != 0) {
        fprintf(stderr, "%s export: job %lld is kind = %s: only a training job's checkpoints "
                "hold parameters (export the model it ran)\n", ctl->prog, id, s.kind);
        rc = DTCTL_USAGE;
    } else if (parsed && s.ckpt_dir != NULL) {
        *root = dt_xstrdup(s.ckpt_dir);
    } else if (dir != NULL && dir[0] != '\0') {
        *root = dt_xasprintf("%s/ckpt", dir);
    } else {
        fprintf(stderr, "%s export: job %lld: the coordinator did not say where its files are\n",
                ctl->prog, id);
        rc = DTCTL_ERROR;
    }
    if (parsed)
        dt_spec_free(&s);
    json_decref(res);
    return rc;
}

static int by_step_desc(const void *a, const void *b)
{
    int64_t x = *(const int64_t *)a, y = *(const int64_t *)b;

    return x > y ? -1 : x < y;
}

/* Job id: its newest committed checkpoint that verifies (the newer ones
 * that do not are reported and passed over). An exit code; *out the step
 * directory. */
static int from_job(dtctl_t *ctl, long long id, char **out)
{
    dt_wire_job_ref_t ref = { .id = id };
    dt_emsg_t em = { "" };
    json_t *res = NULL, *ck;
    int64_t *steps = NULL;
    size_t n = 0, i;
    char *root = NULL;
    int rc;

    *out = NULL;
    if ((rc = job_root(ctl, id, &root)) != DTCTL_OK)
        return rc;
    if ((rc = dtctl_request(ctl, DT_MSG_CHECKPOINTS, dt_wire_checkpoints_encode(&ref), &res,
                            &em)) < 0) {
        rc = dtctl_fail(ctl, "export", rc, &em);
        goto out;
    }
    json_array_foreach(json_object_get(res, "checkpoints"), i, ck) {
        json_t *step = json_object_get(ck, "step");
        const char *state = json_string_value(json_object_get(ck, "state"));
        if (state && strcmp(state, "committed") == 0 && json_is_integer(step) &&
            json_integer_value(step) >= 0) {
            steps = dt_xrealloc(steps, (n + 1) * sizeof(*steps));
            steps[n++] = (int64_t)json_integer_value(step);
        }
    }
    if (n > 1)
        qsort(steps, n, sizeof(*steps), by_step_desc);
    rc = DTCTL_USAGE;
    if (n == 0)
        fprintf(stderr, "%s export: job %lld has no committed checkpoint (dtctl checkpoints "
                "%lld)\n", ctl->prog, id, id);
    for (i = 0; i < n; i++) {
        char *dir = dt_ckpt_step_dir(root, steps[i]);
        int v = dt_ckpt_verify(dir, &em);
        if (v == 0) {
            *out = dir;
            rc = DTCTL_OK;
            break;
        }
        free(dir);
        if (v == DT_EACCES || v == DT_EPERM) { /* no other step will read better */
            dtctl_error(ctl, "export", NULL, em.s);
            rc = DTCTL_DENIED;
            break;
        }
        dtctl_error(ctl, "export", i + 1 < n ? "skipping " : NULL, em.s);
    }
out:
    free(steps);
    free(root);
    json_decref(res);
    return rc;
}

/* A path: a step directory (it has a manifest), verified; or a root, its
 * newest step that verifies. 0 with *out, or a dt code in em. */
static int from_path(dtctl_t *ctl, const char *src, char **out, dt_emsg_t *em)
{
    char *manifest = dt_xasprintf("%s/%s", src, DT_CKPT_MANIFEST);
    struct stat st;
    int rc;

    *out = NULL;
    if (stat(src, &st) < 0) {
        int e = errno;
        rc = dt_emsg_set(em, dt_err_errno(e), "%s: %s", src, strerror(e));
    } else if (!S_ISDIR(st.st_mode)) {
        rc = dt_emsg_set(em, DT_EINVAL, "%s: not a directory (a checkpoint step directory or "
                         "root, or a job id)", src);
    } else if (lstat(manifest, &st) == 0) {
        if ((rc = dt_ckpt_verify(src, em)) == 0)
            *out = dt_xstrdup(src);
    } else if ((rc = dt_ckpt_latest(src, 0, skipped, ctl, out, NULL, em)) == 0 && *out == NULL) {
        rc = dt_emsg_set(em, DT_ENOENT, "%s: no checkpoint here (not a step directory: no %s; "
                         "not a checkpoint root: no step-* directory that verifies)", src,
                         DT_CKPT_MANIFEST);
    }
    free(manifest);
    return rc;
}

/*-- the export ---------------------------------------------------------------*/

/* The checkpoint must be a training one: shard 0's "format" metadata. */
static int check_kind(const char *dir, const dt_ckpt_manifest_t *man, dt_emsg_t *em)
{
    char *path = dt_xasprintf("%s/%s", dir, man->shards[0].file);
    dt_st_reader_t *r = NULL;
    const char *fmt;
    int rc;

    if ((rc = dt_st_open_nofollow(path, &r, em)) < 0)
        goto out;
    fmt = dt_st_meta(r, "format");
    if (fmt != NULL && strcmp(fmt, PREFILL_FORMAT) == 0)
        rc = dt_emsg_set(em, DT_EINVAL, "%s: a prefill checkpoint (its shards hold a hidden "
                         "state, not parameters): nothing to export", dir);
    else if (fmt == NULL || strcmp(fmt, DT_CKPT_TRAIN_FORMAT) != 0)
        rc = dt_emsg_set(em, DT_EFORMAT, "%s: shard %s is not a training checkpoint's (its "
                         "'format' metadata is not \"%s\")", dir, man->shards[0].file,
                         DT_CKPT_TRAIN_FORMAT);
out:
    dt_st_close(r);
    free(path);
    return rc;
}

typedef struct flat {
    const float *P;
    const dt_model_layout_t *lo;
} flat_t;

static const float *get(void *ud, dt_hf_tensor_t t, int layer)
{
    const flat_t *f = ud;
    int64_t off = dt_hf_offset(f->lo, t, layer);

    return off < 0 ? NULL : f->P + off;
}

static int by_name(const void *a, const void *b)
{
    return strcmp(*(char *const *)a, *(char *const *)b);
}

static void report(const dtctl_t *ctl, const xopts_t *o, const char *dir,
                   const dt_ckpt_manifest_t *man, const dt_model_cfg_t *cfg)
{
    const size_t esz = dt_st_dtype_size(o->dtype);
    const char *dname = o->dtype == DT_BF16 ? "bf16" : o->dtype == DT_F16 ? "fp16" : "fp32";
    int64_t bytes = 0, tensors = 0;
    DIR *d = opendir(o->out);
    struct dirent *e;
    char **names = NULL;
    size_t n = 0;
    json_t *files = json_array();

    for (int t = 0; t < DT_HF_NTENSORS; t++) {
        int64_t k = dt_hf_numel(cfg, (dt_hf_tensor_t)t);
        int per = dt_hf_per_layer((dt_hf_tensor_t)t) ? cfg->layers : 1;
        if (k > 0)
            tensors += per, bytes += per * k * (int64_t)esz;
    }
    while (d != NULL && (e = readdir(d)) != NULL)
        if (dt_hf_is_model_file(e->d_name)) {
            names = dt_xrealloc(names, (n + 1) * sizeof(*names));
            names[n++] = dt_xstrdup(e->d_name);
        }
    if (d != NULL)
        closedir(d);
    if (n > 1)
        qsort(names, n, sizeof(*names), by_name);
    if (!ctl->json)
        printf("exported %s (step %" PRId64 ", %d rank%s) to %s: %" PRId64 " tensors, %s, %"
               PRId64 " bytes of weights\n", dir, man->step, man->ranks,
               man->ranks == 1 ? "" : "s", o->out, tensors, dname, bytes);
    for (size_t i = 0; i < n; i++) {
        char *path = dt_xasprintf("%s/%s", o->out, names[i]);
        struct stat st;
        long long size = stat(path, &st) == 0 ? (long long)st.st_size : -1;
        if (ctl->json)
            json_array_append_new(files, json_pack("{s:s, s:I}", "file", path, "bytes",
                                                   (json_int_t)size));
        else
            printf("  %-48s %lld\n", path, size);
        free(path);
        free(names[i]);
    }
    free(names);
    if (ctl->json) {
        json_t *j = json_pack("{s:s, s:I, s:s, s:s, s:I, s:I, s:O, s:o}", "source", dir, "step",
                              (json_int_t)man->step, "out", o->out, "dtype", dname, "tensors",
                              (json_int_t)tensors, "bytes", (json_int_t)bytes, "model",
                              man->model, "files", files);
        dtctl_print_json(j);
        json_decref(j);
    } else {
        json_decref(files);
    }
}

/* Read the checkpoint at dir (verified) and write it to o->out. */
static int export_dir(const dtctl_t *ctl, const xopts_t *o, const char *dir, dt_emsg_t *em)
{
    dt_ckpt_manifest_t man = { 0 };
    dt_model_layout_t lo = { 0 };
    dt_model_cfg_t cfg;
    dt_emsg_t why = { "" };
    float *P = NULL;
    flat_t f = { .P = NULL, .lo = &lo };
    int rc;

    if ((rc = dt_ckpt_manifest_read(dir, &man, em)) < 0 || (rc = check_kind(dir, &man, em)) < 0)
        goto out;
    if ((rc = dt_ckpt_model_parse(man.model, &cfg, &why)) < 0) {
        rc = dt_emsg_set(em, rc, "%s/%s: %s", dir, DT_CKPT_MANIFEST, why.s);
        goto out;
    }
    dt_model_layout_init(&lo, &cfg);
    /* not dt_xmalloc: too large a model is the user's error to be told */
    if ((uint64_t)lo.nparams > SIZE_MAX / sizeof(float) ||
        (P = malloc((size_t)lo.nparams * sizeof(float))) == NULL) {
        rc = dt_emsg_set(em, DT_ENOMEM, "%s: cannot allocate %.2f GiB for its %" PRId64
                         " parameters", dir, (double)lo.nparams * 4 / (1 << 30), lo.nparams);
        goto out;
    }
    if ((rc = dt_ckpt_read_train(dir, &man, lo.nparams, P, NULL, NULL, NULL, NULL, em)) < 0)
        goto out;
    f.P = P;
    if ((rc = dt_hf_write(o->out, &cfg, o->dtype, o->shard_bytes, get, &f, em)) == 0)
        report(ctl, o, dir, &man, &cfg);
out:
    free(P);
    dt_model_layout_close(&lo);
    dt_ckpt_manifest_close(&man);
    return rc;
}

int dtctl_export(dtctl_t *ctl, int argc, char **argv)
{
    xopts_t o;
    dt_emsg_t em = { "" };
    char *dir = NULL;
    long long id;
    int rc;

    if ((rc = parse(ctl, argc, argv, &o, &em)) != 0) {
        if (rc > 0) {
            usage(stdout);
            return DTCTL_OK;
        }
        dtctl_error(ctl, "export", NULL, em.s);
        usage(stderr);
        return DTCTL_USAGE;
    }
    /* before anything is read: a model already there is never replaced */
    if ((rc = dt_hf_check_target(o.out, &em)) < 0) {
        dtctl_error(ctl, "export", NULL, em.s);
        return exit_for(rc);
    }
    /* digits alone name a job (./12 is a directory called 12) */
    if (strchr(o.src, '/') == NULL && dtctl_parse_id(o.src, &id) == 0) {
        if ((rc = from_job(ctl, id, &dir)) != DTCTL_OK)
            return rc;
    } else if ((rc = from_path(ctl, o.src, &dir, &em)) < 0) {
        dtctl_error(ctl, "export", NULL, em.s);
        return exit_for(rc);
    }
    rc = export_dir(ctl, &o, dir, &em);
    free(dir);
    if (rc < 0) {
        dtctl_error(ctl, "export", NULL, em.s);
        return exit_for(rc);
    }
    return DTCTL_OK;
}
