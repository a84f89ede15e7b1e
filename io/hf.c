/* SPDX-License-Identifier: MIT
 *
 * The weights of a Hugging Face LLaMA model directory, opened and read (see
 * hf.h for the layout and the contract), and dt's tensor ids with their
 * Hugging Face names, shapes and places in dt's flat parameter array.
 * Everything read is untrusted: the index is read whole under a size cap
 * and parsed with duplicate keys rejected (hf_config.h dt_hf_json_read);
 * every tensor name is classified before anything else is looked up (so a
 * crafted index cannot make the checks quadratic: a name that is not one
 * of the model's fails at once); the index and the shard headers must
 * agree in both directions. Messages echo names from files through
 * dt_text_escape_buf (common/text.h), so a name cannot put control
 * characters on the user's terminal.
 *
 * Not here: config.json (hf_config.c), writing a directory (hf_export.c),
 * the safetensors format itself (safetensors.c), the model's numerics
 * (engine/model), tokenizers.
 */
#include "config.h"

#include <errno.h>
#include <inttypes.h>
#include <jansson.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "common/half.h"
#include "common/mem.h"
#include "common/text.h"
#include "hf.h"
#include "hf_config.h"
#include "safetensors.h"

/*-- tensor names and shapes ------------------------------------------------*/

/* A tensor's Hugging Face name: the whole name, or for the tensors of a
 * layer the part after "model.layers.<L>.". */
static const struct {
    const char *name;
    bool layer;
} tensors[DT_HF_NTENSORS] = {
    [DT_HF_EMBED] = { .name = "model.embed_tokens.weight", .layer = false },
    [DT_HF_ATTN_NORM] = { .name = "input_layernorm.weight", .layer = true },
    [DT_HF_WQ] = { .name = "self_attn.q_proj.weight", .layer = true },
    [DT_HF_WK] = { .name = "self_attn.k_proj.weight", .layer = true },
    [DT_HF_WV] = { .name = "self_attn.v_proj.weight", .layer = true },
    [DT_HF_WO] = { .name = "self_attn.o_proj.weight", .layer = true },
    [DT_HF_MLP_NORM] = { .name = "post_attention_layernorm.weight", .layer = true },
    [DT_HF_W1] = { .name = "mlp.gate_proj.weight", .layer = true },
    [DT_HF_W3] = { .name = "mlp.up_proj.weight", .layer = true },
    [DT_HF_W2] = { .name = "mlp.down_proj.weight", .layer = true },
    [DT_HF_FINAL_NORM] = { .name = "model.norm.weight", .layer = false },
    [DT_HF_LM_HEAD] = { .name = "lm_head.weight", .layer = false },
};

#define LAYER_PREFIX "model.layers."
#define INV_FREQ "rotary_emb.inv_freq"

bool dt_hf_per_layer(dt_hf_tensor_t t)
{
    return (unsigned)t < DT_HF_NTENSORS && tensors[t].layer;
}

int dt_hf_shape(const dt_model_cfg_t *c, dt_hf_tensor_t t, int64_t shape[2])
{
    const int64_t d = c->dim, f = c->ffn, V = c->vocab, D = dt_model_head_dim(c);

    switch (t) {
    case DT_HF_EMBED:
        shape[0] = V, shape[1] = d;
        return 2;
    case DT_HF_ATTN_NORM:
    case DT_HF_MLP_NORM:
    case DT_HF_FINAL_NORM:
        shape[0] = d;
        return 1;
    case DT_HF_WQ:
        shape[0] = c->heads * D, shape[1] = d;
        return 2;
    case DT_HF_WK:
    case DT_HF_WV:
        shape[0] = c->kv_heads * D, shape[1] = d;
        return 2;
    case DT_HF_WO:
        shape[0] = d, shape[1] = c->heads * D;
        return 2;
    case DT_HF_W1:
    case DT_HF_W3:
        shape[0] = f, shape[1] = d;
        return 2;
    case DT_HF_W2:
        shape[0] = d, shape[1] = f;
        return 2;
    case DT_HF_LM_HEAD:
        if (c->tied)
            return 0;
        shape[0] = V, shape[1] = d;
        return 2;
    default:
        return 0;
    }
}

int64_t dt_hf_numel(const dt_model_cfg_t *cfg, dt_hf_tensor_t t)
{
    int64_t shape[2], n = 1;
    int nd = dt_hf_shape(cfg, t, shape);

    if (nd == 0)
        return 0;
    for (int i = 0; i < nd; i++)
        n *= shape[i];
    return n;
}

int64_t dt_hf_offset(const dt_model_layout_t *lo, dt_hf_tensor_t t, int layer)
{
    const dt_model_layer_off_t *L;

    if (dt_hf_per_layer(t) && (layer < 0 || layer >= lo->layers))
        return -1;
    L = dt_hf_per_layer(t) ? &lo->layer[layer] : NULL;
    switch (t) {
    case DT_HF_EMBED: return lo->tok_emb;
    case DT_HF_ATTN_NORM: return L->attn_norm;
    case DT_HF_WQ: return L->wq;
    case DT_HF_WK: return L->wk;
    case DT_HF_WV: return L->wv;
    case DT_HF_WO: return L->wo;
    case DT_HF_MLP_NORM: return L->mlp_norm;
    case DT_HF_W1: return L->w1;
    case DT_HF_W3: return L->w3;
    case DT_HF_W2: return L->w2;
    case DT_HF_FINAL_NORM: return lo->final_norm;
    case DT_HF_LM_HEAD: return lo->lm_head;
    default: return -1;
    }
}

const char *dt_hf_name(dt_hf_tensor_t t, int layer, char *buf, size_t n)
{
    int len;

    if ((unsigned)t >= DT_HF_NTENSORS)
        return NULL;
    if (tensors[t].layer)
        len = snprintf(buf, n, LAYER_PREFIX "%d.%s", layer, tensors[t].name);
    else
        len = snprintf(buf, n, "%s", tensors[t].name);
    return len >= 0 && (size_t)len < n ? buf : NULL;
}

/*-- opening the weights ----------------------------------------------------*/

typedef struct {
    const dt_st_reader_t *st; /* NULL: not (yet) found */
    const dt_st_tensor_t *t;
} loc_t;

struct dt_hf {
    dt_model_cfg_t cfg;
    dt_st_reader_t **st;
    size_t nst;
    loc_t *loc; /* [layers][DT_HF_NTENSORS]; the others at layer 0 */
};

static loc_t *loc_of(const dt_hf_t *h, dt_hf_tensor_t t, int layer)
{
    return &h->loc[(size_t)(tensors[t].layer ? layer : 0) * DT_HF_NTENSORS + t];
}

/* A decimal layer number at *p, canonical (no sign, no leading zero), up
 * to the next '.', which *p is left at. -1 when there is none. */
static int64_t parse_layer(const char **p)
{
    const char *s = *p;
    int64_t v = 0;

    if (*s < '0' || *s > '9' || (s[0] == '0' && s[1] >= '0' && s[1] <= '9'))
        return -1;
    for (; *s >= '0' && *s <= '9'; s++)
        if ((v = v * 10 + (*s - '0')) > INT_MAX)
            return -1;
    if (*s != '.')
        return -1;
    *p = s + 1;
    return v;
}

static bool ends_with(const char *s, const char *suffix)
{
    size_t n = strlen(s), m = strlen(suffix);

    return n >= m && strcmp(s + n - m, suffix) == 0;
}

bool dt_hf_is_model_file(const char *name)
{
    return strcmp(name, DT_HF_CONFIG) == 0 || strcmp(name, DT_HF_INDEX) == 0 ||
           (strncmp(name, "model", 5) == 0 && ends_with(name, ".safetensors"));
}

enum { NAME_IGNORED = 0, NAME_DT = 1 };

/* What the tensor called name (listed in or stored in `where`) is: one of
 * dt's (NAME_DT, with *t and *layer), one to skip (NAME_IGNORED: the RoPE
 * table of old exports, the head of a tied model), or an error. */
static int classify(const dt_model_cfg_t *c, const char *where, const char *name, dt_hf_tensor_t *t,
                    int *layer, dt_emsg_t *em)
{
    const char *rest = name;
    char nb[128];
    int64_t l;

    if (ends_with(name, ".bias"))
        return dt_emsg_set(em, DT_ENOTSUP,
                           "%s: tensor '%s': biases are not supported (dt's LLaMA has none)", where,
                           dt_text_escape_buf(name, nb, sizeof(nb), 0));
    *layer = 0;
    if (strncmp(name, LAYER_PREFIX, strlen(LAYER_PREFIX)) != 0) {
        if (strcmp(name, "model." INV_FREQ) == 0)
            return NAME_IGNORED;
        for (int i = 0; i < DT_HF_NTENSORS; i++)
            if (!tensors[i].layer && strcmp(name, tensors[i].name) == 0) {
                *t = (dt_hf_tensor_t)i;
                return i == DT_HF_LM_HEAD && c->tied ? NAME_IGNORED : NAME_DT;
            }
        goto unknown;
    }
    rest += strlen(LAYER_PREFIX);
    if ((l = parse_layer(&rest)) < 0)
        goto unknown;
    if (strcmp(rest, "self_attn." INV_FREQ) != 0) {
        int i;

        for (i = 0; i < DT_HF_NTENSORS; i++)
            if (tensors[i].layer && strcmp(rest, tensors[i].name) == 0)
                break;
        if (i == DT_HF_NTENSORS)
            goto unknown;
        *t = (dt_hf_tensor_t)i;
    }
    if (l >= c->layers)
        return dt_emsg_set(em, DT_EFORMAT,
                           "%s: tensor '%s' is of layer %" PRId64 ", but %s has %d layers", where,
                           name, l, DT_HF_CONFIG, c->layers);
    *layer = (int)l;
    return strcmp(rest, "self_attn." INV_FREQ) == 0 ? NAME_IGNORED : NAME_DT;
unknown:
    return dt_emsg_set(em, DT_ENOTSUP,
                       "%s: unknown tensor '%s' (not one of a LlamaForCausalLM's that dt runs)",
                       where, dt_text_escape_buf(name, nb, sizeof(nb), 0));
}

/* Check tensor t of layer, as stored in st, against the config; record
 * where it is. */
static int place(dt_hf_t *h, dt_hf_tensor_t t, int layer, const dt_st_reader_t *st,
                 const dt_st_tensor_t *tt, dt_emsg_t *em)
{
    int64_t shape[2];
    int nd = dt_hf_shape(&h->cfg, t, shape);
    char s1[64], s2[64];
    bool same = tt->ndim == nd;

    if (tt->dtype != DT_F32 && tt->dtype != DT_F16 && tt->dtype != DT_BF16)
        return dt_emsg_set(em, DT_EDTYPE,
                           "%s: tensor '%s' has dtype %s (dt reads F32, F16 and BF16)",
                           dt_st_path(st), tt->name, dt_st_dtype_name(tt->dtype));
    for (int i = 0; same && i < nd; i++)
        same = tt->shape[i] == shape[i];
    if (!same)
        return dt_emsg_set(em, DT_ESHAPE, "%s: tensor '%s' has shape %s, %s makes it %s",
                           dt_st_path(st), tt->name,
                           dt_text_shape(s1, sizeof(s1), tt->ndim, tt->shape, DT_SHAPE_PAREN),
                           DT_HF_CONFIG, dt_text_shape(s2, sizeof(s2), nd, shape, DT_SHAPE_PAREN));
    *loc_of(h, t, layer) = (loc_t){ .st = st, .t = tt };
    return 0;
}

static dt_st_reader_t *add_shard(dt_hf_t *h, dt_st_reader_t *st)
{
    h->st = dt_xrealloc(h->st, (h->nst + 1) * sizeof(*h->st));
    h->st[h->nst++] = st;
    return st;
}

static int open_single(dt_hf_t *h, const char *path, dt_emsg_t *em)
{
    dt_st_reader_t *st;
    int rc;

    if ((rc = dt_st_open(path, &st, em)) < 0)
        return rc;
    add_shard(h, st);
    for (size_t i = 0; i < dt_st_count(st); i++) {
        const dt_st_tensor_t *tt = dt_st_tensor(st, i);
        dt_hf_tensor_t t;
        int layer;

        if ((rc = classify(&h->cfg, path, tt->name, &t, &layer, em)) < 0)
            return rc;
        if (rc == NAME_DT && (rc = place(h, t, layer, st, tt, em)) < 0)
            return rc;
    }
    return 0;
}

/* A shard's name from the index: a plain file name in DIR. */
static int check_shard_name(const char *index, const char *tensor, const char *file, dt_emsg_t *em)
{
    char nb[128];

    if (file[0] == '\0' || strchr(file, '/') != NULL || strcmp(file, ".") == 0 ||
        strcmp(file, "..") == 0 || strlen(file) > NAME_MAX || dt_text_check("", file, 0, NULL) < 0)
        return dt_emsg_set(em, DT_EINVAL,
                           "%s: shard '%s' of tensor '%s' is not a plain file "
                           "name in the model's directory",
                           index, dt_text_escape_buf(file, nb, sizeof(nb), 0), tensor);
    return 0;
}

/* The index and its shards: every name classified first (a crafted index
 * fails on its first foreign name), every shard opened once, then each
 * shard's tensors looked up in the weight map (a hash), and last every
 * entry of the map found in its shard. */
static int open_index(dt_hf_t *h, const char *dir, const char *path, dt_emsg_t *em)
{
    json_t *root = NULL, *wm, *v, *shard_ix = json_object(), *found = json_object();
    const char *name, *file;
    char nb[128];
    int rc;

    if ((rc = dt_hf_json_read(path, &root, em)) < 0)
        goto out;
    wm = json_object_get(root, "weight_map");
    if (!json_is_object(root) || !json_is_object(wm)) {
        rc = dt_emsg_set(em, DT_EFORMAT, "%s: 'weight_map' is missing or not an object", path);
        goto out;
    }
    json_object_foreach(wm, name, v) {
        dt_hf_tensor_t t;
        dt_st_reader_t *st;
        dt_emsg_t why;
        char *spath;
        int layer;

        if (!json_is_string(v)) {
            rc = dt_emsg_set(em, DT_EFORMAT, "%s: weight_map entry '%s' is not a file name", path,
                             dt_text_escape_buf(name, nb, sizeof(nb), 0));
            goto out;
        }
        file = json_string_value(v);
        if ((rc = classify(&h->cfg, path, name, &t, &layer, em)) < 0 ||
            (rc = check_shard_name(path, name, file, em)) < 0)
            goto out;
        if (json_object_get(shard_ix, file) != NULL)
            continue;
        spath = dt_xasprintf("%s/%s", dir, file);
        rc = dt_st_open(spath, &st, &why);
        free(spath);
        if (rc < 0) {
            rc = dt_emsg_set(em, rc, "%s (a shard %s lists for '%s')", why.s, path, name);
            goto out;
        }
        add_shard(h, st);
        json_object_set_new(shard_ix, file, json_integer((json_int_t)h->nst - 1));
    }
    /* each shard's tensors are listed under it */
    json_object_foreach(shard_ix, file, v) {
        const dt_st_reader_t *st = h->st[json_integer_value(v)];

        for (size_t i = 0; i < dt_st_count(st); i++) {
            const dt_st_tensor_t *tt = dt_st_tensor(st, i);
            json_t *m = json_object_get(wm, tt->name);
            dt_hf_tensor_t t;
            int layer;

            if (m == NULL) {
                rc = dt_emsg_set(em, DT_EFORMAT, "%s: tensor '%s' is not listed in %s",
                                 dt_st_path(st), dt_text_escape_buf(tt->name, nb, sizeof(nb), 0),
                                 path);
                goto out;
            }
            if (strcmp(json_string_value(m), file) != 0) {
                rc = dt_emsg_set(em, DT_EFORMAT,
                                 "%s: tensor '%s' is listed in %s under another shard, %s",
                                 dt_st_path(st), tt->name, path, json_string_value(m));
                goto out;
            }
            json_object_set_new(found, tt->name, json_true());
            if ((rc = classify(&h->cfg, dt_st_path(st), tt->name, &t, &layer, em)) < 0)
                goto out;
            if (rc == NAME_DT && (rc = place(h, t, layer, st, tt, em)) < 0)
                goto out;
        }
    }
    /* and every entry of the map is in its shard */
    json_object_foreach(wm, name, v) {
        if (json_object_get(found, name) == NULL) {
            rc = dt_emsg_set(em, DT_EFORMAT, "%s: lists tensor '%s' in %s, which lacks it",
                             path, name, json_string_value(v));
            goto out;
        }
    }
    rc = 0;
out:
    json_decref(found);
    json_decref(shard_ix);
    json_decref(root);
    return rc;
}

void dt_hf_close(dt_hf_t *h)
{
    if (h == NULL)
        return;
    for (size_t i = 0; i < h->nst; i++)
        dt_st_close(h->st[i]);
    free(h->st);
    free(h->loc);
    free(h);
}

int dt_hf_open(const char *dir, dt_hf_t **out, dt_emsg_t *em)
{
    char *single = dt_xasprintf("%s/%s", dir, DT_HF_WEIGHTS);
    char *index = dt_xasprintf("%s/%s", dir, DT_HF_INDEX);
    const char *where = single;
    dt_hf_t *h = dt_xcalloc(1, sizeof(*h));
    struct stat st;
    int rc;

    *out = NULL;
    if ((rc = dt_hf_config_read(dir, &h->cfg, em)) < 0)
        goto fail;
    h->loc = dt_xcalloc((size_t)h->cfg.layers * DT_HF_NTENSORS, sizeof(*h->loc));
    if (stat(single, &st) == 0 || errno != ENOENT) {
        rc = open_single(h, single, em);
    } else if (stat(index, &st) == 0 || errno != ENOENT) {
        where = index;
        rc = open_index(h, dir, index, em);
    } else {
        char *bin = dt_xasprintf("%s/pytorch_model.bin", dir);
        bool pickle = access(bin, F_OK) == 0;

        free(bin);
        rc = dt_emsg_set(
            em, DT_ENOENT, "%s: neither %s nor %s is there%s", dir, DT_HF_WEIGHTS, DT_HF_INDEX,
            pickle ? " (pytorch_model.bin is not read: convert it to safetensors)" : "");
    }
    if (rc < 0)
        goto fail;
    for (int l = 0; l < h->cfg.layers; l++)
        for (int t = 0; t < DT_HF_NTENSORS; t++) {
            char nb[64];

            if ((l > 0 && !tensors[t].layer) || dt_hf_numel(&h->cfg, t) == 0 ||
                loc_of(h, t, l)->st != NULL)
                continue;
            rc = dt_emsg_set(em, DT_EFORMAT, "%s: no tensor '%s'%s", where,
                             dt_hf_name(t, l, nb, sizeof(nb)),
                             t == DT_HF_LM_HEAD ? " (the model is not tied)" : "");
            goto fail;
        }
    free(index);
    free(single);
    *out = h;
    return 0;
fail:
    dt_hf_close(h);
    free(index);
    free(single);
    return rc;
}

const dt_model_cfg_t *dt_hf_cfg(const dt_hf_t *h)
{
    return &h->cfg;
}

dt_dtype_t dt_hf_dtype(const dt_hf_t *h, dt_hf_tensor_t t, int layer)
{
    const loc_t *l;

    if ((unsigned)t >= DT_HF_NTENSORS ||
        (tensors[t].layer && (layer < 0 || layer >= h->cfg.layers)))
        return DT_F32;
    l = loc_of(h, t, layer);
    return l->t ? l->t->dtype : DT_F32;
}

/*-- reading a tensor -------------------------------------------------------*/

/* The n 16-bit values stored in the upper half of dst's bytes widened to
 * fp32 in place. Going up from element 0, the store of element i (bytes
 * 4i..4i+3), made after its value is read, never reaches a value not yet
 * read (bytes 2n+2j, j > i), so no second buffer is needed. */
static void widen(float *dst, int64_t n, dt_dtype_t dtype)
{
    const unsigned char *src = (const unsigned char *)dst + 2 * n;

    for (int64_t i = 0; i < n; i++) {
        uint16_t v;

        memcpy(&v, src + 2 * i, sizeof(v));
        dst[i] = dtype == DT_BF16 ? dt_bf16_to_f32(v) : dt_f16_to_f32(v);
    }
}

/* The rows of each head of D rows (cols wide) of w from Hugging Face's RoPE
 * order into dt's: dt row 2i + k = HF row k*D/2 + i. tmp holds one head. */
static void rows_from_hf(float *w, int heads, int D, int64_t cols, float *tmp)
{
    const size_t row = (size_t)cols * sizeof(float);

    for (int h = 0; h < heads; h++) {
        float *head = w + (int64_t)h * D * cols;

        memcpy(tmp, head, (size_t)D * row);
        for (int i = 0; i < D / 2; i++)
            for (int k = 0; k < 2; k++)
                memcpy(head + (int64_t)(2 * i + k) * cols, tmp + (int64_t)(k * D / 2 + i) * cols,
                       row);
    }
}

int dt_hf_read(const dt_hf_t *h, dt_hf_tensor_t t, int layer, float *dst, dt_emsg_t *em)
{
    const dt_model_cfg_t *c = &h->cfg;
    const loc_t *l;
    int64_t n;
    size_t esz;
    void *raw;
    int rc;

    if ((unsigned)t >= DT_HF_NTENSORS || (tensors[t].layer && (layer < 0 || layer >= c->layers)))
        return dt_emsg_set(em, DT_EINVAL, "hf: no tensor %d of layer %d in a model of %d layers",
                           (int)t, layer, c->layers);
    l = loc_of(h, t, layer);
    if (l->st == NULL)
        return dt_emsg_set(em, DT_ENOENT,
                           "hf: the model is tied: %s is not read (the embedding is the head)",
                           tensors[t].name);
    n = dt_hf_numel(c, t);
    esz = dt_st_dtype_size(l->t->dtype);
    /* 16-bit data lands in the upper half of dst and is widened in place */
    raw = esz == sizeof(float) ? (void *)dst : (void *)((char *)dst + 2 * n);
    if ((rc = dt_st_read(l->st, l->t->name, raw, (size_t)n * esz, em)) < 0)
        return rc;
    if (esz != sizeof(float))
        widen(dst, n, l->t->dtype);
    if (t == DT_HF_WQ || t == DT_HF_WK) {
        const int D = dt_model_head_dim(c);
        float *tmp = dt_xmallocarray((size_t)D * (size_t)c->dim, sizeof(float));

        rows_from_hf(dst, t == DT_HF_WQ ? c->heads : c->kv_heads, D, c->dim, tmp);
        free(tmp);
    }
    return 0;
}
