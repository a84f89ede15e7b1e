/* SPDX-License-Identifier: MIT
 *
 * A Hugging Face LLaMA model directory written from dt's fp32 tensors (see
 * hf_export.h for the contract): the tensors in the order of the model's
 * state_dict, converted to the dtype asked for and to Hugging Face's q and
 * k row order, cut into shards as transformers cuts them, the index, and
 * config.json last; on failure every file this call wrote is removed.
 *
 * Not here: config.json's keys (hf_config.c), the tensors' names and
 * shapes (hf.c), the safetensors format (safetensors.c), where the tensors
 * come from (the caller's dt_hf_get_fn: dtctl export, tests/tools/hfgen).
 */
#include "config.h"

#include <dirent.h>
#include <errno.h>
#include <inttypes.h>
#include <jansson.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "common/fileio.h"
#include "common/half.h"
#include "common/mem.h"
#include "common/text.h"
#include "hf.h"
#include "hf_config.h"
#include "hf_export.h"
#include "safetensors.h"

/* One tensor of the export, in file order. */
typedef struct {
    dt_hf_tensor_t t;
    int layer;
    int64_t bytes;
    int shard;
} wtensor_t;

/* The tensors in the order of LlamaForCausalLM's state_dict; the count. */
static size_t export_order(const dt_model_cfg_t *c, size_t esz, wtensor_t *out)
{
    static const dt_hf_tensor_t per_layer[] = {
        DT_HF_WQ, DT_HF_WK, DT_HF_WV,        DT_HF_WO,       DT_HF_W1,
        DT_HF_W3, DT_HF_W2, DT_HF_ATTN_NORM, DT_HF_MLP_NORM,
    };
    size_t n = 0;

    out[n++] = (wtensor_t){ .t = DT_HF_EMBED };
    for (int l = 0; l < c->layers; l++)
        for (size_t i = 0; i < sizeof(per_layer) / sizeof(per_layer[0]); i++)
            out[n++] = (wtensor_t){ .t = per_layer[i], .layer = l };
    out[n++] = (wtensor_t){ .t = DT_HF_FINAL_NORM };
    if (!c->tied)
        out[n++] = (wtensor_t){ .t = DT_HF_LM_HEAD };
    for (size_t i = 0; i < n; i++)
        out[i].bytes = dt_hf_numel(c, out[i].t) * (int64_t)esz;
    return n;
}

/* Shards as transformers splits: in order, a new one begun before a tensor
 * that would take a non-empty shard past max. The number of shards. */
static int assign_shards(wtensor_t *w, size_t n, int64_t max)
{
    int64_t total = 0, cur = 0;
    int shard = 0;

    for (size_t i = 0; i < n; i++)
        total += w[i].bytes;
    for (size_t i = 0; i < n; i++) {
        if (max > 0 && total > max && cur > 0 && cur + w[i].bytes > max)
            shard++, cur = 0;
        cur += w[i].bytes;
        w[i].shard = shard;
    }
    return shard + 1;
}

/* n fp32 values as dtype at dst. */
static void narrow(void *dst, const float *src, int64_t n, dt_dtype_t dtype)
{
    uint16_t *h = dst;

    if (dtype == DT_F32)
        memcpy(dst, src, (size_t)n * sizeof(float));
    else if (dtype == DT_BF16)
        for (int64_t i = 0; i < n; i++)
            h[i] = dt_f32_to_bf16(src[i]);
    else
        for (int64_t i = 0; i < n; i++)
            h[i] = dt_f32_to_f16(src[i]);
}

/* Tensor t from dt's fp32 layout to Hugging Face's, in dtype, at dst. */
static void to_hf(void *dst, const float *src, const dt_model_cfg_t *c, dt_hf_tensor_t t,
                  dt_dtype_t dtype, size_t esz)
{
    const int D = dt_model_head_dim(c);
    const int64_t cols = c->dim;

    if (t != DT_HF_WQ && t != DT_HF_WK) {
        narrow(dst, src, dt_hf_numel(c, t), dtype);
        return;
    }
    /* HF row h*D + k*D/2 + i = dt row h*D + 2i + k */
    for (int h = 0; h < (t == DT_HF_WQ ? c->heads : c->kv_heads); h++)
        for (int k = 0; k < 2; k++)
            for (int i = 0; i < D / 2; i++) {
                int64_t hf = (int64_t)h * D + k * (D / 2) + i, dt = (int64_t)h * D + 2 * i + k;

                narrow((char *)dst + hf * cols * (int64_t)esz, src + dt * cols, cols, dtype);
            }
}

/* DIR must not hold a model already: config.json, the index or any
 * model*.safetensors. */
static int check_empty(const char *dir, dt_emsg_t *em)
{
    DIR *d = opendir(dir);
    struct dirent *e;
    int rc = 0;

    if (d == NULL) {
        int err = errno;
        return dt_emsg_set(em, dt_err_errno(err), "%s: cannot open: %s", dir, strerror(err));
    }
    while ((e = readdir(d)) != NULL)
        if (dt_hf_is_model_file(e->d_name)) {
            char nb[128];

            rc = dt_emsg_set(em, DT_EEXIST, "%s/%s: already exists (a model is not overwritten)",
                             dir, dt_text_escape_buf(e->d_name, nb, sizeof(nb), 0));
            break;
        }
    closedir(d);
    return rc;
}

int dt_hf_check_target(const char *dir, dt_emsg_t *em)
{
    struct stat st;

    if (stat(dir, &st) < 0 && errno == ENOENT)
        return 0;
    return check_empty(dir, em);
}

/* The files written so far, removed when the export fails. */
typedef struct {
    char **path;
    size_t n;
} written_t;

static void written_add(written_t *w, const char *path)
{
    w->path = dt_xrealloc(w->path, (w->n + 1) * sizeof(*w->path));
    w->path[w->n++] = dt_xstrdup(path);
}

static void written_free(written_t *w, bool remove)
{
    for (size_t i = 0; i < w->n; i++) {
        if (remove)
            unlink(w->path[i]);
        free(w->path[i]);
    }
    free(w->path);
}

/* One shard: the n tensors at w, to path. */
static int write_shard(const char *path, const dt_model_cfg_t *c, dt_dtype_t dtype,
                       const wtensor_t *w, size_t n, dt_hf_get_fn get, void *ud, dt_emsg_t *em)
{
    dt_st_writer_t *sw = dt_st_writer_new();
    const size_t esz = dt_st_dtype_size(dtype);
    void **bufs = dt_xcalloc(n, sizeof(*bufs));
    int rc = 0;

    for (size_t i = 0; i < n && rc == 0; i++) {
        int64_t shape[2];
        int nd = dt_hf_shape(c, w[i].t, shape);
        const float *src;
        const void *data;
        char nb[64];

        dt_hf_name(w[i].t, w[i].layer, nb, sizeof(nb));
        if ((src = get(ud, w[i].t, w[i].layer)) == NULL) {
            rc = dt_emsg_set(em, DT_ECANCELED, "%s: no data for tensor '%s' (the source gave none)",
                             path, nb);
            break;
        }
        if (dtype == DT_F32 && w[i].t != DT_HF_WQ && w[i].t != DT_HF_WK) {
            data = src;
        } else {
            bufs[i] = dt_xmalloc((size_t)w[i].bytes);
            to_hf(bufs[i], src, c, w[i].t, dtype, esz);
            data = bufs[i];
        }
        rc = dt_st_writer_add(sw, nb, dtype, nd, shape, data, em);
    }
    if (rc == 0 && (rc = dt_st_writer_meta(sw, "format", "pt", em)) == 0)
        rc = dt_st_write_mode(sw, path, 0644, NULL, NULL, em); /* shared, unlike a checkpoint */
    dt_st_writer_free(sw);
    for (size_t i = 0; i < n; i++)
        free(bufs[i]);
    free(bufs);
    return rc;
}

int dt_hf_write(const char *dir, const dt_model_cfg_t *cfg, dt_dtype_t dtype, int64_t shard_bytes,
                dt_hf_get_fn get, void *ud, dt_emsg_t *em)
{
    const dt_rope_t *r = &cfg->rope;
    written_t done = { 0 };
    wtensor_t *w = NULL;
    json_t *doc = NULL, *map = NULL;
    char *path = NULL;
    bool created = false;
    struct stat st;
    dt_emsg_t why;
    size_t n;
    int nshards, rc;

    if ((rc = dt_model_cfg_check(cfg, &why)) < 0)
        return dt_emsg_set(em, rc, "%s: %s", dir, why.s);
    if (!isfinite(r->theta) || !isfinite(r->factor) || !isfinite(r->low_freq_factor) ||
        !isfinite(r->high_freq_factor) || !isfinite(r->original_max_pos) ||
        !isfinite(cfg->norm_eps))
        return dt_emsg_set(em, DT_EINVAL, "%s: model: rope and norm_eps settings must be finite",
                           dir);
    if (cfg->layers > DT_HF_MAX_LAYERS)
        return dt_emsg_set(em, DT_EINVAL, "%s: %d layers, more than %d", dir, cfg->layers,
                           DT_HF_MAX_LAYERS);
    if (dtype != DT_F32 && dtype != DT_BF16 && dtype != DT_F16)
        return dt_emsg_set(em, DT_EDTYPE,
                           "%s: dtype %s: a Hugging Face model is written in fp32, bf16 or fp16",
                           dir, dt_dtype_name(dtype));
    w = dt_xmallocarray((size_t)cfg->layers * DT_HF_NTENSORS + 3, sizeof(*w));
    n = export_order(cfg, dt_st_dtype_size(dtype), w);
    if ((nshards = assign_shards(w, n, shard_bytes)) > 99999) {
        rc = dt_emsg_set(em, DT_EINVAL,
                         "%s: %d shards of at most %" PRId64 " bytes, more than 99999", dir,
                         nshards, shard_bytes);
        goto out;
    }
    if (stat(dir, &st) < 0 && errno == ENOENT) {
        if (dt_mkdirs(dir, 0755) < 0) {
            int err = errno;
            rc = dt_emsg_set(em, dt_err_errno(err), "%s: cannot create: %s", dir, strerror(err));
            goto out;
        }
        created = true;
    }
    if ((rc = check_empty(dir, em)) < 0)
        goto out;

    if (nshards > 1) {
        int64_t total = 0;

        map = json_object();
        for (size_t i = 0; i < n; i++) {
            char nb[64], file[64];

            snprintf(file, sizeof(file), "model-%05d-of-%05d.safetensors", w[i].shard + 1, nshards);
            json_object_set_new(map, dt_hf_name(w[i].t, w[i].layer, nb, sizeof(nb)),
                                json_string(file));
            total += w[i].bytes;
        }
        /* a shard's tensors are consecutive */
        for (size_t first = 0, end; first < n; first = end) {
            for (end = first; end < n && w[end].shard == w[first].shard; end++)
                ;
            path =
                dt_xasprintf("%s/model-%05d-of-%05d.safetensors", dir, w[first].shard + 1, nshards);
            /* listed before it is written: a failed write can still leave
             * it in place (safetensors.h: the directory's fsync) */
            written_add(&done, path);
            if ((rc = write_shard(path, cfg, dtype, w + first, end - first, get, ud, em)) < 0)
                goto out;
            free(path);
            path = NULL;
        }
        doc = json_pack("{s:{s:I}, s:O}", "metadata", "total_size", (json_int_t)total, "weight_map",
                        map);
        path = dt_xasprintf("%s/%s", dir, DT_HF_INDEX);
        written_add(&done, path);
        if ((rc = dt_hf_json_write(path, doc, 1, em)) < 0)
            goto out;
        json_decref(doc);
        doc = NULL;
    } else {
        path = dt_xasprintf("%s/%s", dir, DT_HF_WEIGHTS);
        written_add(&done, path);
        if ((rc = write_shard(path, cfg, dtype, w, n, get, ud, em)) < 0)
            goto out;
    }
    free(path);

    /* last: a directory without it is no model to transformers or dt */
    path = dt_xasprintf("%s/%s", dir, DT_HF_CONFIG);
    written_add(&done, path);
    rc = dt_hf_config_write(dir, cfg, dtype, em);
out:
    written_free(&done, rc < 0);
    if (rc < 0 && created)
        rmdir(dir);
    json_decref(doc);
    json_decref(map);
    free(path);
    free(w);
    return rc;
}
