/* SPDX-License-Identifier: MIT
 *
 * Checkpoint directories (see ckpt.h for the layout and the contract). Every
 * file is published by rename after an fsync, and every rename is followed
 * by an fsync of its directory, so what a reader finds under a step-*
 * name after a crash is what was committed. Manifests from disk are
 * untrusted: each field is checked, shard file names must be exactly the
 * canonical ones (no path can escape the directory), and verification
 * recomputes every shard's SHA-256. The training shards (dt-train-1) are
 * built and read back here too; the ranks' sequence that writes a step is
 * the engine's (engine/cmd/save.h).
 *
 * Not here: the coordinator's commit protocol, resharding, locking.
 */
#include "config.h"

#include <dirent.h>
#include <fcntl.h>
#include <float.h>
#include <inttypes.h>
#include <limits.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "ckpt.h"
#include "common/fileio.h"
#include "common/mem.h"
#include "common/text.h"
#include "json.h"

/*-- the model object -----------------------------------------------------*/

/* A metadata value or key for a message: at most 32 bytes, anything but
 * printable ASCII shown as '?' (it comes from a file). */
static const char *meta_shown(char buf[40], const char *v)
{
    size_t i;

    for (i = 0; v[i] != '\0' && i < 32; i++)
        buf[i] = (unsigned char)v[i] >= 0x20 && (unsigned char)v[i] < 0x7f ? v[i] : '?';
    if (v[i] != '\0') {
        memcpy(buf + i, "...", 3);
        i += 3;
    }
    buf[i] = '\0';
    return buf;
}

json_t *dt_ckpt_model_json(const dt_model_cfg_t *m)
{
    json_t *j = json_pack("{s:i, s:i, s:i, s:i, s:i, s:i, s:f, s:f, s:b}", "dim", m->dim,
                          "layers", m->layers, "heads", m->heads, "kv_heads", m->kv_heads,
                          "ffn", m->ffn, "vocab", m->vocab, "rope_theta", m->rope.theta,
                          "norm_eps", (double)m->norm_eps, "tied", m->tied);

    /* settings older checkpoints did not record, only when they differ
     * from what those checkpoints ran with: their manifests still match */
    if (m->head_dim > 0 && m->head_dim * m->heads != m->dim)
        json_object_set_new(j, "head_dim", json_integer(m->head_dim));
    if (m->rope.factor > 0)
        json_object_set_new(j, "rope_scaling",
                            json_pack("{s:s, s:f, s:f, s:f, s:f}", "rope_type", "llama3",
                                      "factor", m->rope.factor, "low_freq_factor",
                                      m->rope.low_freq_factor, "high_freq_factor",
                                      m->rope.high_freq_factor, "original_max_pos",
                                      m->rope.original_max_pos));
    return j;
}

/* Key `key` of the model object o (where: "model" or "model.rope_scaling")
 * as an int or a number. */
static int model_int(const json_t *o, const char *where, const char *key, int *out,
                     dt_emsg_t *em)
{
    const dt_json_at_t at = { .file = where, .err = DT_EFORMAT };
    char want[48];
    int64_t v;
    int rc;

    snprintf(want, sizeof(want), "an integer (of at most %d)", INT_MAX);
    if ((rc = dt_json_int(&at, o, key, 0, INT_MIN, INT_MAX, want, &v, em)) < 0)
        return rc;
    *out = (int)v;
    return 0;
}

static int model_num(const json_t *o, const char *where, const char *key, double *out,
                     dt_emsg_t *em)
{
    const dt_json_at_t at = { .file = where, .err = DT_EFORMAT };

    return dt_json_num(&at, o, key, 0, "a number", out, em);
}

/* Every key of o is one of known (n of them). */
static int model_keys(const json_t *o, const char *where, const char *const *known, size_t n,
                      dt_emsg_t *em)
{
    const char *key;
    json_t *v;

    json_object_foreach((json_t *)o, key, v) {
        size_t i;
        for (i = 0; i < n && strcmp(key, known[i]) != 0; i++)
            ;
        if (i == n) {
            char shown[40];
            return dt_emsg_set(em, DT_EFORMAT, "%s: unknown key '%s' (written by a newer dt?)",
                               where, meta_shown(shown, key));
        }
    }
    return 0;
}

int dt_ckpt_model_parse(const json_t *model, dt_model_cfg_t *cfg, dt_emsg_t *em)
{
    static const char *const keys[] = { "dim", "layers", "heads", "kv_heads", "ffn", "vocab",
                                        "rope_theta", "norm_eps", "tied", "head_dim",
                                        "rope_scaling" };
    static const char *const rkeys[] = { "rope_type", "factor", "low_freq_factor",
                                         "high_freq_factor", "original_max_pos" };
    const char *const sizes[] = { "dim", "layers", "heads", "kv_heads", "ffn", "vocab" };
    int *fields[] = { &cfg->dim, &cfg->layers, &cfg->heads, &cfg->kv_heads, &cfg->ffn,
                      &cfg->vocab };
    const dt_json_at_t at = { .file = "model", .err = DT_EFORMAT };
    json_t *v, *rs;
    double eps;
    int rc;

    memset(cfg, 0, sizeof(*cfg));
    snprintf(cfg->name, sizeof(cfg->name), "custom");
    if (!json_is_object(model))
        return dt_emsg_set(em, DT_EFORMAT, "model: not a JSON object");
    if ((rc = model_keys(model, "model", keys, sizeof(keys) / sizeof(keys[0]), em)) < 0)
        return rc;
    for (size_t i = 0; i < sizeof(sizes) / sizeof(sizes[0]); i++)
        if ((rc = model_int(model, "model", sizes[i], fields[i], em)) < 0)
            return rc;
    if ((rc = model_num(model, "model", "rope_theta", &cfg->rope.theta, em)) < 0 ||
        (rc = model_num(model, "model", "norm_eps", &eps, em)) < 0)
        return rc;
    /* written as the double of a float: back to that float */
    if (!(fabs(eps) <= FLT_MAX))
        return dt_emsg_set(em, DT_EFORMAT, "model: 'norm_eps' %g is out of a float's range",
                           eps);
    cfg->norm_eps = (float)eps;
    if ((rc = dt_json_bool(&at, model, "tied", 0, "a boolean", &cfg->tied, em)) < 0)
        return rc;
    if (json_object_get(model, "head_dim") != NULL &&
        (rc = model_int(model, "model", "head_dim", &cfg->head_dim, em)) < 0)
        return rc;
    rs = json_object_get(model, "rope_scaling");
    if (rs != NULL) {
        const char *w = "model.rope_scaling";
        dt_rope_t *r = &cfg->rope;

        if (!json_is_object(rs))
            return dt_emsg_set(em, DT_EFORMAT, "%s: not a JSON object", w);
        if ((rc = model_keys(rs, w, rkeys, sizeof(rkeys) / sizeof(rkeys[0]), em)) < 0)
            return rc;
        v = json_object_get(rs, "rope_type");
        if (!json_is_string(v) || strcmp(json_string_value(v), "llama3") != 0)
            return dt_emsg_set(em, DT_EFORMAT, "%s: 'rope_type' is %s", w,
                               v ? "not \"llama3\"" : "missing");
        if ((rc = model_num(rs, w, "factor", &r->factor, em)) < 0 ||
            (rc = model_num(rs, w, "low_freq_factor", &r->low_freq_factor, em)) < 0 ||
            (rc = model_num(rs, w, "high_freq_factor", &r->high_freq_factor, em)) < 0 ||
            (rc = model_num(rs, w, "original_max_pos", &r->original_max_pos, em)) < 0)
            return rc;
        /* the writer leaves the object out without a scaling */
        if (!(r->factor > 0))
            return dt_emsg_set(em, DT_EFORMAT, "%s: 'factor' %g is not positive", w, r->factor);
    }
    return dt_model_cfg_check(cfg, em);
}

/*-- names ----------------------------------------------------------------*/

char *dt_ckpt_step_dir(const char *root, int64_t step)
{
    return dt_xasprintf("%s/step-%08" PRId64, root, step);
}

char *dt_ckpt_tmp_dir(const char *root, int64_t step)
{
    return dt_xasprintf("%s/.step-%08" PRId64 ".tmp", root, step);
}

void dt_ckpt_shard_name(int rank, int ranks, char out[64])
{
    snprintf(out, 64, "shard-%05d-of-%05d.safetensors", rank, ranks);
}

/* Parse a canonical "step-%08d" (*tmp = false) or ".step-%08d.tmp" (*tmp =
 * true) name. Returns false for anything else. */
static bool parse_step_name(const char *name, int64_t *step, bool *tmp)
{
    const char *p = name;
    char canon[64];
    int64_t v = 0;

    *tmp = name[0] == '.';
    if (*tmp)
        p++;
    if (strncmp(p, "step-", 5) != 0)
        return false;
    p += 5;
    if (*p < '0' || *p > '9')
        return false;
    for (; *p >= '0' && *p <= '9'; p++)
        if (__builtin_mul_overflow(v, 10, &v) || __builtin_add_overflow(v, *p - '0', &v))
            return false;
    snprintf(canon, sizeof(canon), *tmp ? ".step-%08" PRId64 ".tmp" : "step-%08" PRId64, v);
    if (strcmp(canon, name) != 0)
        return false;
    *step = v;
    return true;
}

static const char *base_name(const char *path)
{
    const char *s = strrchr(path, '/');

    return s ? s + 1 : path;
}

/*-- file helpers ---------------------------------------------------------*/

/* DIR/NAME replaced by len bytes, atomically (common/fileio.h), relative
 * to DIR opened once without following a link, mode 0600: a process
 * running as another user than the directory's owner cannot be made to
 * write anywhere else. */
static int write_atomic(const char *dir, const char *name, const char *data, size_t len,
                        dt_emsg_t *em)
{
    char *path = dt_xasprintf("%s/%s", dir, name);
    int rc = dt_file_write_atomic(path, data, len, 0600, DT_ATOMIC_DIRFD, em);

    free(path);
    return rc;
}

/*-- manifest -------------------------------------------------------------*/

void dt_ckpt_manifest_close(dt_ckpt_manifest_t *m)
{
    json_decref(m->model);
    json_decref(m->plan);
    json_decref(m->rng);
    free(m->shards);
    memset(m, 0, sizeof(*m));
}

/* A required non-negative integer field, and an object (a new reference). */
static int get_int(const char *path, json_t *obj, const char *key, int64_t max, int64_t *out,
                   dt_emsg_t *em)
{
    const dt_json_at_t at = { .file = path, .err = DT_EFORMAT };

    return dt_json_int(&at, obj, key, 0, 0, max, "an integer in range", out, em);
}

static int get_obj(const char *path, json_t *obj, const char *key, json_t **out, dt_emsg_t *em)
{
    const dt_json_at_t at = { .file = path, .err = DT_EFORMAT };
    json_t *v;
    int rc = dt_json_get(&at, obj, key, 0, JSON_OBJECT, "an object", &v, em);

    if (rc == 0)
        *out = json_incref(v);
    return rc;
}

static int manifest_from_json(const char *path, json_t *root, dt_ckpt_manifest_t *m, dt_emsg_t *em)
{
    json_t *v, *shards;
    int64_t ranks;
    int rc;

    if (!json_is_object(root))
        return dt_emsg_set(em, DT_EFORMAT, "%s: not a JSON object", path);
    v = json_object_get(root, "format");
    if (!json_is_string(v) || strcmp(json_string_value(v), DT_CKPT_FORMAT) != 0)
        return dt_emsg_set(em, DT_EFORMAT, "%s: 'format' is not \"%s\"", path, DT_CKPT_FORMAT);
    v = json_object_get(root, "version");
    if (!json_is_integer(v))
        return dt_emsg_set(em, DT_EFORMAT, "%s: 'version' is missing or not an integer", path);
    if (json_integer_value(v) != DT_CKPT_VERSION)
        return dt_emsg_set(em, DT_EFORMAT,
                           "%s: checkpoint format version %" JSON_INTEGER_FORMAT
                           " is not supported (this dt reads version %d)",
                           path, json_integer_value(v), DT_CKPT_VERSION);
    if ((rc = get_int(path, root, "step", INT64_MAX, &m->step, em)) < 0 ||
        (rc = get_int(path, root, "ranks", DT_CKPT_MAX_RANKS, &ranks, em)) < 0 ||
        (rc = get_int(path, root, "data_cursor", INT64_MAX, &m->data_cursor, em)) < 0 ||
        (rc = get_obj(path, root, "model", &m->model, em)) < 0 ||
        (rc = get_obj(path, root, "plan", &m->plan, em)) < 0 ||
        (rc = get_obj(path, root, "rng", &m->rng, em)) < 0)
        return rc;
    if (ranks < 1)
        return dt_emsg_set(em, DT_EFORMAT, "%s: 'ranks' is 0", path);
    m->ranks = (int)ranks;
    shards = json_object_get(root, "shards");
    if (!json_is_array(shards) || json_array_size(shards) != (size_t)ranks)
        return dt_emsg_set(em, DT_EFORMAT, "%s: 'shards' is not an array of %d records", path,
                           m->ranks);
    m->shards = dt_xcalloc((size_t)ranks, sizeof(*m->shards));
    for (int r = 0; r < m->ranks; r++) {
        json_t *s = json_array_get(shards, (size_t)r), *file, *sha;
        dt_ckpt_shard_t *sh = &m->shards[r];
        char want[64], where[32], *ctx;
        int64_t rank;

        snprintf(where, sizeof(where), "shards[%d]", r);
        if (!json_is_object(s))
            return dt_emsg_set(em, DT_EFORMAT, "%s: '%s' is not an object", path, where);
        ctx = dt_xasprintf("%s: %s", path, where);
        if ((rc = get_int(ctx, s, "rank", DT_CKPT_MAX_RANKS, &rank, em)) == 0)
            rc = get_int(ctx, s, "bytes", INT64_MAX, &sh->bytes, em);
        free(ctx);
        if (rc < 0)
            return rc;
        if (rank != r)
            return dt_emsg_set(em, DT_EFORMAT, "%s: %s has rank %" PRId64 " (expected %d)", path,
                               where, rank, r);
        sh->rank = r;
        dt_ckpt_shard_name(r, m->ranks, want);
        file = json_object_get(s, "file");
        if (!json_is_string(file) || strcmp(json_string_value(file), want) != 0)
            return dt_emsg_set(em, DT_EFORMAT, "%s: %s: 'file' is not \"%s\"", path, where, want);
        memcpy(sh->file, want, sizeof(want));
        sha = json_object_get(s, "sha256");
        if (!json_is_string(sha) || !dt_text_is_hex(json_string_value(sha), 64))
            return dt_emsg_set(em, DT_EFORMAT, "%s: %s: 'sha256' is not 64 lowercase hex digits",
                               path, where);
        memcpy(sh->sha256, json_string_value(sha), 65);
    }
    return 0;
}

int dt_ckpt_manifest_parse(const char *name, const char *text, size_t len, dt_ckpt_manifest_t *m,
                           dt_emsg_t *em)
{
    json_t *root;
    int rc;

    memset(m, 0, sizeof(*m));
    if (len > DT_CKPT_MANIFEST_MAX)
        return dt_emsg_set(em, DT_EFORMAT, "%s: larger than the limit of %d bytes", name,
                           DT_CKPT_MANIFEST_MAX);
    if ((rc = dt_json_parse(name, text, len, &root, em)) < 0)
        return rc;
    rc = manifest_from_json(name, root, m, em);
    json_decref(root);
    if (rc < 0)
        dt_ckpt_manifest_close(m);
    return rc;
}

int dt_ckpt_manifest_read(const char *dir, dt_ckpt_manifest_t *m, dt_emsg_t *em)
{
    char *path = dt_xasprintf("%s/%s", dir, DT_CKPT_MANIFEST), *text = NULL;
    size_t len = 0;
    int rc;

    memset(m, 0, sizeof(*m));
    /* a regular file, not through a link, of a bounded size: read whole */
    rc = dt_read_regular(path, DT_OPEN_NOFOLLOW, DT_CKPT_MANIFEST_MAX, &text, &len, em);
    if (rc == DT_ERANGE || rc == DT_EINVAL) {
        dt_emsg_t why = *em;
        rc = dt_emsg_set(em, DT_EFORMAT, "%s (a manifest is a regular file of at most 16 MiB)",
                         why.s);
    }
    if (rc == 0)
        rc = dt_ckpt_manifest_parse(path, text, len, m, em);
    free(text);
    free(path);
    return rc;
}

/*-- checks ---------------------------------------------------------------*/

/* Manifest valid and agreeing with the directory name; shards present with
 * their sizes; with hash, their SHA-256 too. */
static int check_dir(const char *dir, bool hash, dt_emsg_t *em)
{
    dt_ckpt_manifest_t m;
    int64_t step;
    bool tmp;
    int rc;

    if ((rc = dt_ckpt_manifest_read(dir, &m, em)) < 0)
        return rc;
    if (parse_step_name(base_name(dir), &step, &tmp) && step != m.step) {
        rc = dt_emsg_set(em, DT_EFORMAT, "%s: manifest says step %" PRId64, dir, m.step);
        goto out;
    }
    for (int r = 0; r < m.ranks; r++) {
        const dt_ckpt_shard_t *sh = &m.shards[r];
        char *path = dt_xasprintf("%s/%s", dir, sh->file), hex[65];
        struct stat st;

        dt_st_reader_t *sr = NULL;
        dt_emsg_t why = { "" };

        if (lstat(path, &st) < 0) {
            int e = errno;
            rc = dt_emsg_set(em, dt_err_errno(e), "%s: shard %s: %s", dir, sh->file, strerror(e));
        } else if (!S_ISREG(st.st_mode)) {
            rc = dt_emsg_set(em, DT_EFORMAT, "%s: shard %s is not a regular file%s", dir,
                             sh->file, S_ISLNK(st.st_mode) ? " (a symbolic link)" : "");
        } else if ((int64_t)st.st_size != sh->bytes) {
            rc = dt_emsg_set(em, DT_EFORMAT,
                             "%s: shard %s is %" PRId64 " bytes, the manifest says %" PRId64, dir,
                             sh->file, (int64_t)st.st_size, sh->bytes);
        } else if (hash && (rc = dt_sha256_file(path, hex, em)) == 0 &&
                   strcmp(hex, sh->sha256) != 0) {
            rc = dt_emsg_set(em, DT_EFORMAT,
                             "%s: shard %s is corrupt: sha256 %s, the manifest says %s", dir,
                             sh->file, hex, sh->sha256);
        } else if (hash && rc == 0 && (rc = dt_st_open_nofollow(path, &sr, &why)) < 0) {
            /* the bytes are the ones recorded, but not a sane shard (a
             * manifest rewritten to match a truncated or crafted file) */
            rc = dt_emsg_set(em, DT_EFORMAT, "%s: shard %s is not a valid safetensors file: %s",
                             dir, sh->file, why.s);
        }
        dt_st_close(sr);
        free(path);
        if (rc < 0)
            goto out;
    }
out:
    dt_ckpt_manifest_close(&m);
    return rc;
}

int dt_ckpt_verify(const char *dir, dt_emsg_t *em)
{
    return check_dir(dir, true, em);
}

/*-- writing a step -------------------------------------------------------*/

int dt_ckpt_begin(const char *root, int64_t step, dt_emsg_t *em)
{
    char *final = NULL, *tmp = NULL;
    struct stat st;
    int rc = 0, e;

    if (step < 0)
        return dt_emsg_set(em, DT_EINVAL, "%s: negative step %" PRId64, root, step);
    /* 0700: a checkpoint is the job owner's alone (umask or not) */
    if (mkdir(root, 0700) < 0 && errno != EEXIST) {
        e = errno;
        return dt_emsg_set(em, dt_err_errno(e), "%s: cannot create: %s", root, strerror(e));
    }
    final = dt_ckpt_step_dir(root, step);
    tmp = dt_ckpt_tmp_dir(root, step);
    if (lstat(final, &st) == 0) {
        rc =
            dt_emsg_set(em, DT_EEXIST, "%s: step %" PRId64 " is already checkpointed", final, step);
        goto out;
    }
    if ((rc = dt_rmtree(tmp, em)) < 0)
        goto out;
    if (mkdir(tmp, 0700) < 0) {
        e = errno;
        rc = dt_emsg_set(em, dt_err_errno(e), "%s: cannot create: %s", tmp, strerror(e));
        goto out;
    }
    rc = dt_fsync_dir(root, em);
out:
    free(tmp);
    free(final);
    return rc;
}

int dt_ckpt_write_shard(const char *root, int64_t step, int rank, int ranks, dt_st_writer_t *w,
                        dt_ckpt_shard_t *out, dt_emsg_t *em)
{
    char *tmp, *path;
    int rc;

    memset(out, 0, sizeof(*out));
    if (ranks < 1 || ranks > DT_CKPT_MAX_RANKS || rank < 0 || rank >= ranks)
        return dt_emsg_set(em, DT_EINVAL, "%s: rank %d of %d is out of range", root, rank, ranks);
    tmp = dt_ckpt_tmp_dir(root, step);
    out->rank = rank;
    dt_ckpt_shard_name(rank, ranks, out->file);
    path = dt_xasprintf("%s/%s", tmp, out->file);
    rc = dt_st_write(w, path, out->sha256, &out->bytes, em);
    free(path);
    free(tmp);
    return rc;
}

static json_t *obj_or_empty(json_t *o)
{
    return o ? json_incref(o) : json_object();
}

int dt_ckpt_write_manifest(const char *root, const dt_ckpt_manifest_t *m, dt_emsg_t *em)
{
    char *tmp = NULL, *text = NULL;
    json_t *doc = NULL, *shards;
    int rc = 0;

    if (m->step < 0 || m->ranks < 1 || m->ranks > DT_CKPT_MAX_RANKS || m->data_cursor < 0)
        return dt_emsg_set(em, DT_EINVAL,
                           "%s: step %" PRId64 ", ranks %d or data cursor %" PRId64 " out of range",
                           root, m->step, m->ranks, m->data_cursor);
    if (!json_is_object(m->model) || (m->plan && !json_is_object(m->plan)) ||
        (m->rng && !json_is_object(m->rng)))
        return dt_emsg_set(em, DT_EINVAL, "%s: model, plan and rng must be JSON objects", root);
    tmp = dt_ckpt_tmp_dir(root, m->step);
    shards = json_array();
    for (int r = 0; r < m->ranks; r++) {
        const dt_ckpt_shard_t *sh = &m->shards[r];
        char want[64], *path;
        struct stat st;

        dt_ckpt_shard_name(r, m->ranks, want);
        if (sh->rank != r || strcmp(sh->file, want) != 0 || sh->bytes < 0 ||
            !dt_text_is_hex(sh->sha256, 64)) {
            json_decref(shards);
            rc = dt_emsg_set(em, DT_EINVAL, "%s: shard record %d is not rank %d's (%s)", tmp, r, r,
                             want);
            goto out;
        }
        path = dt_xasprintf("%s/%s", tmp, sh->file);
        if (stat(path, &st) < 0) {
            int e = errno;
            rc = dt_emsg_set(em, dt_err_errno(e), "%s: shard %s: %s", tmp, sh->file, strerror(e));
        } else if ((int64_t)st.st_size != sh->bytes) {
            rc = dt_emsg_set(em, DT_EFORMAT,
                             "%s: shard %s is %" PRId64 " bytes, its record says %" PRId64, tmp,
                             sh->file, (int64_t)st.st_size, sh->bytes);
        }
        free(path);
        if (rc < 0) {
            json_decref(shards);
            goto out;
        }
        json_array_append_new(shards,
                              json_pack("{s:i, s:s, s:I, s:s}", "rank", r, "file", sh->file,
                                        "bytes", (json_int_t)sh->bytes, "sha256", sh->sha256));
    }
    doc = json_pack("{s:s, s:i, s:I, s:i, s:o, s:o, s:o, s:I, s:o}", "format", DT_CKPT_FORMAT,
                    "version", DT_CKPT_VERSION, "step", (json_int_t)m->step, "ranks", m->ranks,
                    "model", json_incref(m->model), "plan", obj_or_empty(m->plan), "rng",
                    obj_or_empty(m->rng), "data_cursor", (json_int_t)m->data_cursor, "shards",
                    shards);
    text = doc ? json_dumps(doc, JSON_INDENT(2) | JSON_PRESERVE_ORDER) : NULL;
    if (text == NULL) {
        rc = dt_emsg_set(em, DT_EINVAL, "%s: cannot encode the manifest (invalid UTF-8?)", tmp);
        goto out;
    }
    {
        char *nl = dt_xasprintf("%s\n", text);
        rc = write_atomic(tmp, DT_CKPT_MANIFEST, nl, strlen(nl), em);
        free(nl);
    }
out:
    free(text);
    json_decref(doc);
    free(tmp);
    return rc;
}

int dt_ckpt_commit(const char *root, int64_t step, char **out_dir, dt_emsg_t *em)
{
    char *final = dt_ckpt_step_dir(root, step), *tmp = dt_ckpt_tmp_dir(root, step);
    struct stat st;
    int rc, e;

    if (out_dir)
        *out_dir = NULL;
    if (lstat(final, &st) == 0) {
        rc =
            dt_emsg_set(em, DT_EEXIST, "%s: step %" PRId64 " is already checkpointed", final, step);
        goto out;
    }
    if ((rc = check_dir(tmp, false, em)) < 0 || (rc = dt_fsync_dir(tmp, em)) < 0)
        goto out;
    if (rename(tmp, final) < 0) {
        e = errno;
        rc = dt_emsg_set(em, dt_err_errno(e), "%s: cannot rename %s to it: %s", final, tmp,
                         strerror(e));
        goto out;
    }
    if ((rc = dt_fsync_dir(root, em)) < 0)
        goto out;
    if (out_dir) {
        *out_dir = final;
        final = NULL;
    }
out:
    free(tmp);
    free(final);
    return rc;
}

int dt_ckpt_mark_committed(const char *dir, dt_emsg_t *em)
{
    char *manifest = dt_xasprintf("%s/%s", dir, DT_CKPT_MANIFEST), hex[65], line[80];
    int rc;

    rc = dt_sha256_file(manifest, hex, em);
    free(manifest);
    if (rc < 0)
        return rc;
    snprintf(line, sizeof(line), "%s\n", hex);
    return write_atomic(dir, DT_CKPT_COMMITTED, line, strlen(line), em);
}

bool dt_ckpt_is_committed(const char *dir)
{
    char *path = dt_xasprintf("%s/%s", dir, DT_CKPT_COMMITTED);
    struct stat st;
    /* a link there is not a marker: lstat */
    bool ok = lstat(path, &st) == 0 && S_ISREG(st.st_mode);

    free(path);
    return ok;
}

/*-- finding and pruning --------------------------------------------------*/

typedef struct {
    int64_t step;
    bool tmp;
    char *name;
} entry_t;

/* Newest first; at equal steps the temp directory first. */
static int by_step_desc(const void *a, const void *b)
{
    const entry_t *x = a, *y = b;

    if (x->step != y->step)
        return x->step > y->step ? -1 : 1;
    return (int)y->tmp - (int)x->tmp;
}

/* The step-* and .step-*.tmp entries of root, newest first. *n = 0 and
 * success for a missing root. */
static int list_steps(const char *root, entry_t **out, size_t *n, dt_emsg_t *em)
{
    DIR *d = opendir(root);
    struct dirent *de;
    entry_t *v = NULL;
    size_t cap = 0;

    *out = NULL;
    *n = 0;
    if (d == NULL) {
        int e = errno;
        if (e == ENOENT)
            return 0;
        return dt_emsg_set(em, dt_err_errno(e), "%s: cannot list: %s", root, strerror(e));
    }
    while ((de = readdir(d)) != NULL) {
        int64_t step;
        bool tmp;

        if (!parse_step_name(de->d_name, &step, &tmp))
            continue;
        if (*n == cap) {
            cap = cap ? 2 * cap : 16;
            v = dt_xrealloc(v, cap * sizeof(*v));
        }
        v[*n].step = step;
        v[*n].tmp = tmp;
        v[*n].name = dt_xstrdup(de->d_name);
        (*n)++;
    }
    closedir(d);
    if (*n > 1)
        qsort(v, *n, sizeof(*v), by_step_desc);
    *out = v;
    return 0;
}

static void free_entries(entry_t *v, size_t n)
{
    for (size_t i = 0; i < n; i++)
        free(v[i].name);
    free(v);
}

int dt_ckpt_latest(const char *root, unsigned flags, dt_ckpt_skip_fn skip, void *ud, char **out_dir,
                   int64_t *out_step, dt_emsg_t *em)
{
    entry_t *v;
    size_t n;
    int rc;

    *out_dir = NULL;
    if ((rc = list_steps(root, &v, &n, em)) < 0)
        return rc;
    for (size_t i = 0; i < n; i++) {
        char *dir = dt_xasprintf("%s/%s", root, v[i].name);
        dt_emsg_t why;

        if (v[i].tmp) {
            rc = dt_emsg_set(&why, DT_ENOENT, "%s: partial checkpoint (never committed)", dir);
        } else if ((flags & DT_CKPT_REQUIRE_COMMITTED) && !dt_ckpt_is_committed(dir)) {
            rc = dt_emsg_set(&why, DT_ENOENT, "%s: no %s marker", dir, DT_CKPT_COMMITTED);
        } else if ((rc = dt_ckpt_verify(dir, &why)) == 0) {
            *out_dir = dir;
            if (out_step)
                *out_step = v[i].step;
            break;
        }
        if (skip)
            skip(dir, rc, why.s, ud);
        free(dir);
    }
    free_entries(v, n);
    return 0;
}

int dt_ckpt_prune(const char *root, int keep, dt_emsg_t *em)
{
    entry_t *v;
    size_t n;
    int kept = 0, removed = 0, rc;
    int64_t oldest_kept = -1;

    if (keep < 1)
        return dt_emsg_set(em, DT_EINVAL, "%s: keep %d (must be at least 1)", root, keep);
    if ((rc = list_steps(root, &v, &n, em)) < 0)
        return rc;
    for (size_t i = 0; i < n && rc == 0; i++) {
        char *dir = dt_xasprintf("%s/%s", root, v[i].name), *del;

        if (kept < keep) {
            /* Still looking for the ones to keep: nothing is deleted yet. */
            if (!v[i].tmp && check_dir(dir, false, NULL) == 0) {
                kept++;
                oldest_kept = v[i].step;
            }
            free(dir);
            continue;
        }
        if (v[i].step >= oldest_kept) { /* a temp dir of the oldest kept step */
            free(dir);
            continue;
        }
        del = dt_xasprintf("%s/.%s.del.%ld", root, v[i].name, (long)getpid());
        if (rename(dir, del) < 0) {
            int e = errno;
            rc = dt_emsg_set(em, dt_err_errno(e), "%s: cannot rename for deletion: %s", dir,
                             strerror(e));
        } else if ((rc = dt_fsync_dir(root, em)) == 0 && (rc = dt_rmtree(del, em)) == 0) {
            removed++;
        }
        free(del);
        free(dir);
    }
    free_entries(v, n);
    return rc < 0 ? rc : removed;
}

/*-- setting a step aside ------------------------------------------------*/

/* rename(from, to) that never replaces what is at `to` (an empty directory
 * would be replaced silently by rename): EEXIST then. */
static int rename_noreplace(const char *from, const char *to)
{
    struct stat st;

#ifdef RENAME_NOREPLACE
    if (renameat2(AT_FDCWD, from, AT_FDCWD, to, RENAME_NOREPLACE) == 0)
        return 0;
    if (errno != EINVAL && errno != ENOSYS && errno != ENOTSUP)
        return -1;
#endif
    /* a file system without RENAME_NOREPLACE: check, then rename */
    if (lstat(to, &st) == 0) {
        errno = EEXIST;
        return -1;
    }
    return rename(from, to);
}

int dt_ckpt_supersede(const char *root, int64_t step, dt_emsg_t *warn, dt_emsg_t *em)
{
    char *dir = dt_ckpt_step_dir(root, step), *old = NULL;
    struct stat st;
    int rc = DT_CKPT_NONE;

    if (lstat(dir, &st) < 0)
        goto out;
    if (dt_ckpt_is_committed(dir)) {
        rc = DT_CKPT_KEEP;
        goto out;
    }
    old = dt_xasprintf("%s/.step-%08lld.superseded.%ld", root, (long long)step, (long)getpid());
    if (rename(dir, old) < 0) {
        int e = errno;
        rc = dt_emsg_set(em, dt_err_errno(e), "%s: cannot move the uncommitted checkpoint "
                         "aside: %s", dir, strerror(e));
        goto out;
    }
    rc = DT_CKPT_REDONE;
    (void)dt_rmtree(old, warn); /* out of step-*: left over, it harms nothing */
out:
    free(old);
    free(dir);
    return rc;
}

int dt_ckpt_set_aside(const char *root, int64_t step, const char *tag, char **out, dt_emsg_t *em)
{
    char *from = dt_ckpt_step_dir(root, step), *to = NULL;
    int rc = 0, e = 0;

    if (out)
        *out = NULL;
    for (int i = 1; i <= 1000; i++) {
        free(to);
        to = i == 1 ? dt_xasprintf("%s.%s", from, tag) : dt_xasprintf("%s.%s.%d", from, tag, i);
        if (rename_noreplace(from, to) == 0) {
            e = 0;
            break;
        }
        e = errno;
        if (e != EEXIST && e != ENOTEMPTY)
            break;
    }
    if (e == EEXIST || e == ENOTEMPTY)
        rc = dt_emsg_set(em, DT_EEXIST, "%s: cannot move it aside: %s.%s.* are all taken", from,
                         from, tag);
    else if (e != 0)
        rc = dt_emsg_set(em, dt_err_errno(e), "%s: cannot move it aside to %s: %s", from, to,
                         strerror(e));
    if (rc == 0 && (rc = dt_fsync_dir(root, em)) == 0 && out) {
        *out = to;
        to = NULL;
    }
    free(to);
    free(from);
    return rc;
}

/*-- training checkpoints (dt-train-1) ------------------------------------*/

dt_st_writer_t *dt_ckpt_train_writer_new(int64_t n, int64_t off, int64_t len, const float *P,
                                         const float *M, const float *V)
{
    dt_st_writer_t *w = dt_st_writer_new();
    dt_emsg_t em = { "" };
    char buf[32];
    int rc = 0;

    if (rc == 0)
        rc = dt_st_writer_add(w, "params", DT_F32, 1, &len, P, &em);
    if (rc == 0)
        rc = dt_st_writer_add(w, "adam_m", DT_F32, 1, &len, M, &em);
    if (rc == 0)
        rc = dt_st_writer_add(w, "adam_v", DT_F32, 1, &len, V, &em);
    if (rc == 0)
        rc = dt_st_writer_meta(w, "format", DT_CKPT_TRAIN_FORMAT, &em);
    snprintf(buf, sizeof(buf), "%" PRId64, off);
    if (rc == 0)
        rc = dt_st_writer_meta(w, "offset", buf, &em);
    snprintf(buf, sizeof(buf), "%" PRId64, n);
    if (rc == 0)
        rc = dt_st_writer_meta(w, "nparams", buf, &em);
    /* the writer holds names and pointers: a failure here is a bug */
    if (rc < 0)
        abort();
    return w;
}

/* Metadata KEY of shard PATH: a decimal integer in [0, INT64_MAX], digits
 * only (strtoll read "abc" as 0 and " 12" as 12). */
static int meta_int(const char *path, const dt_st_reader_t *r, const char *key, int64_t *out,
                    dt_emsg_t *em)
{
    const char *v = dt_st_meta(r, key);
    char sh[40];
    int64_t x = 0;

    if (v == NULL)
        return dt_emsg_set(em, DT_EFORMAT, "%s: no '%s' metadata (not a dt-train-1 shard)", path,
                           key);
    for (const char *p = v; *p != '\0'; p++)
        if (*p < '0' || *p > '9' || __builtin_mul_overflow(x, 10, &x) ||
            __builtin_add_overflow(x, *p - '0', &x)) {
            x = -1;
            break;
        }
    if (v[0] == '\0' || x < 0)
        return dt_emsg_set(em, DT_EFORMAT,
                           "%s: metadata '%s' is '%s', not a decimal integer (0 to %" PRId64 ")",
                           path, key, meta_shown(sh, v), INT64_MAX);
    *out = x;
    return 0;
}

/* "F32 [8, 1]" */
static const char *tensor_str(const dt_st_tensor_t *t, char *buf, size_t sz)
{
    size_t k = (size_t)snprintf(buf, sz, "%s ", dt_st_dtype_name(t->dtype));

    if (k < sz)
        dt_text_shape(buf + k, sz - k, t->ndim, t->shape, DT_SHAPE_LIST);
    return buf;
}

int dt_ckpt_train_slice(const char *path, const dt_st_reader_t *r, int64_t n, int64_t *off,
                        int64_t *len, dt_emsg_t *em)
{
    static const char *const moments[] = { "adam_m", "adam_v" };
    const dt_st_tensor_t *t = dt_st_find(r, "params");
    int64_t np;
    char a[160], b[160];
    int rc;

    if ((rc = meta_int(path, r, "offset", off, em)) < 0 ||
        (rc = meta_int(path, r, "nparams", &np, em)) < 0)
        return rc;
    if (np != n)
        return dt_emsg_set(em, DT_EFORMAT, "%s: nparams %" PRId64 ", this model has %" PRId64
                           " (not a checkpoint of this model)", path, np, n);
    if (t == NULL)
        return dt_emsg_set(em, DT_EFORMAT, "%s: no tensor 'params'", path);
    if (t->dtype != DT_F32 || t->ndim != 1)
        return dt_emsg_set(em, DT_EFORMAT, "%s: 'params' is %s, not a 1-D F32 tensor", path,
                           tensor_str(t, a, sizeof(a)));
    for (int i = 0; i < 2; i++) {
        const dt_st_tensor_t *m = dt_st_find(r, moments[i]);
        if (m == NULL)
            return dt_emsg_set(em, DT_EFORMAT, "%s: no tensor '%s'", path, moments[i]);
        if (m->dtype != t->dtype || m->ndim != 1 || m->shape[0] != t->shape[0])
            return dt_emsg_set(em, DT_EFORMAT, "%s: '%s' is %s, not %s as 'params'", path,
                               moments[i], tensor_str(m, a, sizeof(a)),
                               tensor_str(t, b, sizeof(b)));
    }
    *len = t->shape[0];
    /* off <= n first, so that off + len cannot overflow in the message */
    if (n < 0)
        return dt_emsg_set(em, DT_EINVAL, "%s: %" PRId64 " parameters", path, n);
    if (*off > n)
        return dt_emsg_set(em, DT_EFORMAT, "%s: offset %" PRId64 " is outside [0, %" PRId64 ")",
                           path, *off, n);
    if (*len > n - *off)
        return dt_emsg_set(em, DT_EFORMAT,
                           "%s: slice [%" PRId64 ", %" PRId64 ") is outside [0, %" PRId64 ")",
                           path, *off, *off + *len, n);
    return 0;
}

/* The part of [off, off + len) inside [lo, lo + n) read from tensor NAME
 * (whose elements start at off) into dst (whose elements start at lo). */
static int read_part(dt_st_reader_t *r, const char *name, int64_t off, int64_t len, float *dst,
                     int64_t lo, int64_t n, dt_emsg_t *em)
{
    int64_t a = off > lo ? off : lo, b = off + len < lo + n ? off + len : lo + n;

    if (dst == NULL || b <= a)
        return 0;
    return dt_st_read_range(r, name, (uint64_t)(a - off) * sizeof(float), dst + (a - lo),
                            (size_t)(b - a) * sizeof(float), em);
}

int dt_ckpt_read_train_range(const char *dir, const dt_ckpt_manifest_t *man, int64_t n,
                             float *P, int64_t plo, int64_t pn, float *M, float *V, int64_t mlo,
                             int64_t mn, dt_ckpt_tick_fn tick, void *ud, dt_emsg_t *em)
{
    int64_t end = 0; /* where the slices so far end: the next one starts there */
    int64_t *off = NULL, *len = NULL;
    int *order = NULL;
    char *path = NULL;
    int rc = 0, k = man->ranks;

    if (n < 0)
        return dt_emsg_set(em, DT_EINVAL, "%s: %" PRId64 " parameters", dir, n);
    if ((M == NULL) != (V == NULL))
        return dt_emsg_set(em, DT_EINVAL, "%s: both moments or neither", dir);
    if (plo < 0 || pn < 0 || plo + pn > n || mlo < 0 || mn < 0 || mlo + mn > n)
        return dt_emsg_set(em, DT_EINVAL, "%s: a range outside the %" PRId64 " parameters", dir,
                           n);
    /* the slices first, from the headers: they tile [0, n), in whatever
     * order the shards list them (dp writes them out of rank order) */
    off = dt_xcalloc((size_t)(k > 0 ? k : 1), sizeof(*off));
    len = dt_xcalloc((size_t)(k > 0 ? k : 1), sizeof(*len));
    order = dt_xcalloc((size_t)(k > 0 ? k : 1), sizeof(*order));
    for (int i = 0; i < k && rc == 0; i++) {
        dt_st_reader_t *r = NULL;
        free(path);
        path = dt_xasprintf("%s/%s", dir, man->shards[i].file);
        if ((rc = dt_st_open_nofollow(path, &r, em)) < 0)
            break;
        rc = dt_ckpt_train_slice(path, r, n, &off[i], &len[i], em);
        dt_st_close(r);
        /* insertion by offset; equal offsets keep the listed order */
        int j = i;
        while (j > 0 && off[order[j - 1]] > off[i]) {
            order[j] = order[j - 1];
            j--;
        }
        order[j] = i;
    }
    for (int q = 0; q < k && rc == 0; q++) {
        int i = order[q];
        dt_st_reader_t *r = NULL;

        free(path);
        path = dt_xasprintf("%s/%s", dir, man->shards[i].file);
        if (off[i] != end) {
            rc = q == 0 ? dt_emsg_set(em, DT_EFORMAT, "%s: the first slice starts at %" PRId64
                                      ", not 0", path, off[i])
                        : dt_emsg_set(em, DT_EFORMAT,
                                      "%s: its slice starts at %" PRId64 ", the shard before it "
                                      "ends at %" PRId64 " (slices tile the parameters)",
                                      path, off[i], end);
            break;
        }
        if ((rc = dt_st_open_nofollow(path, &r, em)) < 0)
            break;
        int64_t o2, l2;
        /* the file may have changed between the passes: its header again */
        if ((rc = dt_ckpt_train_slice(path, r, n, &o2, &l2, em)) == 0 &&
            (o2 != off[i] || l2 != len[i]))
            rc = dt_emsg_set(em, DT_EFORMAT, "%s: its slice changed while it was read", path);
        if (rc == 0)
            rc = read_part(r, "params", off[i], len[i], P, plo, pn, em);
        if (rc == 0)
            rc = read_part(r, "adam_m", off[i], len[i], M, mlo, mn, em);
        if (rc == 0)
            rc = read_part(r, "adam_v", off[i], len[i], V, mlo, mn, em);
        end = off[i] + len[i];
        dt_st_close(r);
        if (tick)
            tick(ud);
    }
    if (rc == 0 && end != n)
        rc = dt_emsg_set(em, DT_EFORMAT, "%s: the shards end at %" PRId64 ", this model has %"
                         PRId64 " parameters (a slice is missing)", path ? path : dir, end, n);
    free(order);
    free(len);
    free(off);
    free(path);
    return rc;
}

int dt_ckpt_read_train(const char *dir, const dt_ckpt_manifest_t *man, int64_t n, float *P,
                       float *M, float *V, dt_ckpt_tick_fn tick, void *ud, dt_emsg_t *em)
{
    return dt_ckpt_read_train_range(dir, man, n, P, 0, n, M, V, 0, n, tick, ud, em);
}
