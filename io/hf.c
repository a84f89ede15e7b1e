/* SPDX-License-Identifier: MIT
 *
 * Hugging Face LLaMA model directories (see hf.h for the layout and the
 * contract). Everything read is untrusted: config.json and the index are
 * read whole under a size cap and parsed with duplicate keys rejected; every
 * tensor name is classified before anything else is looked up (so a crafted
 * index cannot make the checks quadratic: a name that is not one of the
 * model's fails at once); the index and the shard headers must agree in
 * both directions. Messages echo names from files through
 * dt_text_escape_buf (common/text.h), so a name cannot put control
 * characters on the user's terminal.
 *
 * Not here: the safetensors format itself (safetensors.c), the model's
 * numerics (engine/model), tokenizers.
 */
#include "config.h"

#include <dirent.h>
#include <errno.h>
#include <inttypes.h>
#include <jansson.h>
#include <limits.h>
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
#include "json.h"
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

/* The shape of tensor t (PyTorch's, the same in both layouts): its number
 * of dimensions, 0 when the model has no such tensor. */
static int shape_of(const dt_model_cfg_t *c, dt_hf_tensor_t t, int64_t shape[2])
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
    int nd = shape_of(cfg, t, shape);

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

/*-- config.json ------------------------------------------------------------*/

/* The value of key, NULL when absent or null (Python's None). */
static json_t *opt(const json_t *o, const char *key)
{
    json_t *v = json_object_get(o, key);

    return json_is_null(v) ? NULL : v;
}

/* config.json's keys for io/json.h: where prefixes each key in messages
 * ("rope_scaling."), a bad value is shown, a null is absent. */
static dt_json_at_t config_at(const char *path, const char *where)
{
    return (dt_json_at_t){
        .file = path, .prefix = where, .err = DT_EINVAL, .null_absent = true, .show = true
    };
}

/* A positive integer at most max; def when absent and def > 0, else
 * required. */
static int get_int(const char *path, const char *where, const json_t *o, const char *key, int def,
                   int64_t max, int *out, dt_emsg_t *em)
{
    dt_json_at_t a = config_at(path, where);
    int64_t v = def;
    char want[48];
    int rc;

    snprintf(want, sizeof(want), "an integer from 1 to %" PRId64, max);
    rc = dt_json_int(&a, o, key, def > 0 ? DT_JSON_OPTIONAL : 0, 1, max, want, &v, em);
    if (rc < 0)
        return rc;
    *out = (int)v;
    return 0;
}

/* A positive finite number; def when absent and def > 0, else required. */
static int get_num(const char *path, const char *where, const json_t *o, const char *key,
                   double def, double *out, dt_emsg_t *em)
{
    dt_json_at_t a = config_at(path, where);
    unsigned flags = DT_JSON_POSITIVE | (def > 0 ? DT_JSON_OPTIONAL : 0);
    double v = def;
    /* jansson reads no NaN or infinity, so a positive real is finite */
    int rc = dt_json_num(&a, o, key, flags, "a positive number", &v, em);

    if (rc < 0)
        return rc;
    *out = v;
    return 0;
}

/* A boolean, false when absent. */
static int get_bool(const char *path, const json_t *o, const char *key, bool *out, dt_emsg_t *em)
{
    dt_json_at_t a = config_at(path, "");
    bool v = false;
    int rc = dt_json_bool(&a, o, key, DT_JSON_OPTIONAL, "true or false", &v, em);

    if (rc < 0)
        return rc;
    *out = v;
    return 0;
}

/* A string that, when present, must be want (DT_ENOTSUP otherwise). */
static int want_str(const char *path, const json_t *o, const char *key, const char *want,
                    const char *why, dt_emsg_t *em)
{
    dt_json_at_t a = config_at(path, "");
    json_t *v;
    char sb[48];
    int rc = dt_json_get(&a, o, key, DT_JSON_OPTIONAL, JSON_STRING, "a string", &v, em);

    if (rc != 0)
        return rc < 0 ? rc : 0;
    if (strcmp(json_string_value(v), want) != 0)
        return dt_emsg_set(em, DT_ENOTSUP, "%s: '%s' is %s: %s", path, key,
                           dt_json_show(v, sb, sizeof(sb)), why);
    return 0;
}

/* partial_rotary_factor, if there, must be 1: dt rotates whole heads. */
static int check_partial(const char *path, const char *where, const json_t *o, dt_emsg_t *em)
{
    json_t *v = opt(o, "partial_rotary_factor");
    char sb[48];

    if (v != NULL && !(json_is_number(v) && json_number_value(v) == 1))
        return dt_emsg_set(em, DT_ENOTSUP,
                           "%s: '%spartial_rotary_factor' is %s: dt rotates whole heads", path,
                           where, dt_json_show(v, sb, sizeof(sb)));
    return 0;
}

/* The RoPE object of rope_scaling or of rope_parameters (key): its type
 * ("default": no scaling, or "llama3" with its four numbers) into r, and
 * with has_theta (rope_parameters) its rope_theta, *has_theta telling
 * whether it had one. */
static int parse_rope(const char *path, const char *key, const json_t *o, dt_rope_t *r,
                      bool *has_theta, dt_emsg_t *em)
{
    json_t *type = opt(o, "rope_type"), *old = opt(o, "type");
    char where[32], sb[48];
    const char *name = "rope_type";
    int rc;

    snprintf(where, sizeof(where), "%s.", key);
    memset(r, 0, sizeof(*r));
    if (!json_is_object(o))
        return dt_emsg_set(em, DT_EINVAL, "%s: '%s' must be an object or null, not %s", path, key,
                           dt_json_show(o, sb, sizeof(sb)));
    if (type == NULL)
        type = old, name = "type";
    else if (old != NULL && !json_equal(type, old))
        return dt_emsg_set(em, DT_EINVAL, "%s: '%srope_type' and '%stype' disagree", path, where,
                           where);
    if (type == NULL)
        return dt_emsg_set(em, DT_EINVAL, "%s: '%srope_type' is missing", path, where);
    if (!json_is_string(type))
        return dt_emsg_set(em, DT_EINVAL, "%s: '%s%s' must be a string, not %s", path, where, name,
                           dt_json_show(type, sb, sizeof(sb)));
    if (has_theta) {
        *has_theta = opt(o, "rope_theta") != NULL;
        if (*has_theta && (rc = get_num(path, where, o, "rope_theta", 0, &r->theta, em)) < 0)
            return rc;
    }
    if ((rc = check_partial(path, where, o, em)) < 0)
        return rc;
    if (strcmp(json_string_value(type), "default") == 0)
        return 0;
    if (strcmp(json_string_value(type), "llama3") != 0)
        return dt_emsg_set(em, DT_ENOTSUP,
                           "%s: '%s%s' is %s: dt implements RoPE scaling of type llama3 only", path,
                           where, name, dt_json_show(type, sb, sizeof(sb)));
    if ((rc = get_num(path, where, o, "factor", 0, &r->factor, em)) < 0 ||
        (rc = get_num(path, where, o, "low_freq_factor", 0, &r->low_freq_factor, em)) < 0 ||
        (rc = get_num(path, where, o, "high_freq_factor", 0, &r->high_freq_factor, em)) < 0 ||
        (rc = get_num(path, where, o, "original_max_position_embeddings", 0, &r->original_max_pos,
                      em)) < 0)
        return rc;
    return 0;
}

static bool same_scaling(const dt_rope_t *a, const dt_rope_t *b)
{
    return a->factor == b->factor && a->low_freq_factor == b->low_freq_factor &&
           a->high_freq_factor == b->high_freq_factor && a->original_max_pos == b->original_max_pos;
}

/* rope_theta, rope_scaling (transformers 4) and rope_parameters
 * (transformers 5), which must agree where both say something. */
static int parse_rope_keys(const char *path, const json_t *root, dt_rope_t *out, dt_emsg_t *em)
{
    json_t *scaling = opt(root, "rope_scaling"), *params = opt(root, "rope_parameters");
    dt_rope_t s = { 0 }, p = { 0 };
    bool top_theta = opt(root, "rope_theta") != NULL, p_theta = false;
    double theta = 0;
    int rc;

    if ((rc = get_num(path, "", root, "rope_theta", 10000, &theta, em)) < 0)
        return rc;
    if (scaling && (rc = parse_rope(path, "rope_scaling", scaling, &s, NULL, em)) < 0)
        return rc;
    if (params && (rc = parse_rope(path, "rope_parameters", params, &p, &p_theta, em)) < 0)
        return rc;
    if (p_theta) {
        if (top_theta && p.theta != theta)
            return dt_emsg_set(em, DT_EINVAL,
                               "%s: 'rope_theta' (%.17g) and "
                               "'rope_parameters.rope_theta' (%.17g) disagree",
                               path, theta, p.theta);
        theta = p.theta;
    }
    if (scaling && params && !same_scaling(&s, &p))
        return dt_emsg_set(em, DT_EINVAL, "%s: 'rope_scaling' and 'rope_parameters' disagree",
                           path);
    *out = params ? p : s;
    out->theta = theta;
    return 0;
}

static int check_arch(const char *path, const json_t *root, dt_emsg_t *em)
{
    json_t *a = opt(root, "architectures");
    char sb[96];
    int rc;

    if (a == NULL)
        return dt_emsg_set(em, DT_EINVAL,
                           "%s: 'architectures' is missing (dt reads [\"LlamaForCausalLM\"])",
                           path);
    if (!json_is_array(a) || json_array_size(a) != 1 || !json_is_string(json_array_get(a, 0)))
        return dt_emsg_set(em, json_is_array(a) ? DT_ENOTSUP : DT_EINVAL,
                           "%s: 'architectures' is %s: dt reads [\"LlamaForCausalLM\"]", path,
                           dt_json_show(a, sb, sizeof(sb)));
    if (strcmp(json_string_value(json_array_get(a, 0)), "LlamaForCausalLM") != 0)
        return dt_emsg_set(em, DT_ENOTSUP,
                           "%s: 'architectures' is %s: dt reads [\"LlamaForCausalLM\"] only", path,
                           dt_json_show(a, sb, sizeof(sb)));
    if ((rc = want_str(path, root, "model_type", "llama", "dt reads \"llama\" only", em)) < 0)
        return rc;
    if (opt(root, "quantization_config") != NULL)
        return dt_emsg_set(em, DT_ENOTSUP,
                           "%s: 'quantization_config': quantised models are "
                           "not supported (dt reads F32, F16 and BF16 weights)",
                           path);
    return 0;
}

/* What dt does not implement, refused rather than ignored. */
static int check_features(const char *path, const json_t *root, dt_emsg_t *em)
{
    static const char *const biases[] = { "attention_bias", "mlp_bias" };
    int rc;

    for (size_t i = 0; i < sizeof(biases) / sizeof(biases[0]); i++) {
        bool on;

        if ((rc = get_bool(path, root, biases[i], &on, em)) < 0)
            return rc;
        if (on)
            return dt_emsg_set(em, DT_ENOTSUP, "%s: '%s' is true: dt's LLaMA has no biases", path,
                               biases[i]);
    }
    if ((rc = check_partial(path, "", root, em)) < 0)
        return rc;
    return want_str(path, root, "hidden_act", "silu", "dt implements SwiGLU (silu) only", em);
}

static int parse_shape(const char *path, const json_t *root, dt_model_cfg_t *c, dt_emsg_t *em)
{
    json_t *hd = opt(root, "head_dim");
    int head_dim = 0, rc;

    if ((rc = get_int(path, "", root, "hidden_size", 0, INT_MAX, &c->dim, em)) < 0 ||
        (rc = get_int(path, "", root, "num_hidden_layers", 0, DT_HF_MAX_LAYERS, &c->layers, em)) <
            0 ||
        (rc = get_int(path, "", root, "num_attention_heads", 0, INT_MAX, &c->heads, em)) < 0 ||
        (rc = get_int(path, "", root, "num_key_value_heads", c->heads, INT_MAX, &c->kv_heads, em)) <
            0 ||
        (rc = get_int(path, "", root, "intermediate_size", 0, INT_MAX, &c->ffn, em)) < 0 ||
        (rc = get_int(path, "", root, "vocab_size", 0, INT_MAX, &c->vocab, em)) < 0)
        return rc;
    if (hd != NULL && (rc = get_int(path, "", root, "head_dim", 0, INT_MAX, &head_dim, em)) < 0)
        return rc;
    if (c->heads % c->kv_heads != 0)
        return dt_emsg_set(em, DT_EINVAL,
                           "%s: 'num_key_value_heads' %d does not divide 'num_attention_heads' %d",
                           path, c->kv_heads, c->heads);
    if (hd == NULL && c->dim % c->heads != 0)
        return dt_emsg_set(em, DT_EINVAL,
                           "%s: 'num_attention_heads' %d does not divide "
                           "'hidden_size' %d (and there is no 'head_dim')",
                           path, c->heads, c->dim);
    if (hd != NULL && (c->dim % c->heads != 0 || head_dim != c->dim / c->heads))
        c->head_dim = head_dim;
    if ((int64_t)c->heads * dt_model_head_dim(c) > INT_MAX)
        return dt_emsg_set(em, DT_EINVAL,
                           "%s: 'num_attention_heads' %d times the head dim %d is too large", path,
                           c->heads, dt_model_head_dim(c));
    return 0;
}

static int config_from_json(const char *path, const json_t *root, dt_model_cfg_t *c, dt_emsg_t *em)
{
    double eps;
    dt_emsg_t why;
    int rc;

    if (!json_is_object(root))
        return dt_emsg_set(em, DT_EINVAL, "%s: not a JSON object", path);
    memset(c, 0, sizeof(*c));
    snprintf(c->name, sizeof(c->name), "hf");
    if ((rc = check_arch(path, root, em)) < 0 || (rc = check_features(path, root, em)) < 0 ||
        (rc = parse_shape(path, root, c, em)) < 0 ||
        (rc = parse_rope_keys(path, root, &c->rope, em)) < 0 ||
        (rc = get_num(path, "", root, "rms_norm_eps", 0, &eps, em)) < 0 ||
        (rc = get_bool(path, root, "tie_word_embeddings", &c->tied, em)) < 0)
        return rc;
    c->norm_eps = (float)eps;
    if (!(c->norm_eps > 0) || isinf(c->norm_eps))
        return dt_emsg_set(em, DT_EINVAL, "%s: 'rms_norm_eps' %g is not a positive fp32 number",
                           path, eps);
    if ((rc = dt_model_cfg_check(c, &why)) < 0)
        return dt_emsg_set(em, rc, "%s: %s", path, why.s);
    return 0;
}

/* A JSON file of DIR, read whole (bounded) and parsed: *root, the caller's. */
static int load_json(const char *path, json_t **root, dt_emsg_t *em)
{
    char *text = NULL;
    size_t len = 0;
    int rc;

    *root = NULL;
    if ((rc = dt_read_regular(path, 0, DT_HF_JSON_MAX, &text, &len, em)) < 0)
        return rc;
    rc = dt_json_parse(path, text, len, root, em);
    free(text);
    return rc;
}

int dt_hf_config_read(const char *dir, dt_model_cfg_t *cfg, dt_emsg_t *em)
{
    char *path = dt_xasprintf("%s/%s", dir, DT_HF_CONFIG);
    json_t *root;
    int rc;

    if ((rc = load_json(path, &root, em)) == 0)
        rc = config_from_json(path, root, cfg, em);
    json_decref(root);
    free(path);
    return rc;
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
    int nd = shape_of(&h->cfg, t, shape);
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

    if ((rc = load_json(path, &root, em)) < 0)
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

/*-- writing ----------------------------------------------------------------*/

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
        if (strcmp(e->d_name, DT_HF_CONFIG) == 0 || strcmp(e->d_name, DT_HF_INDEX) == 0 ||
            (strncmp(e->d_name, "model", 5) == 0 && ends_with(e->d_name, ".safetensors"))) {
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

/* The shortest decimal that reads back as the float f, as a double (so
 * 1e-5f is written 1e-5, not 9.9999997473787516e-6). */
static double float_decimal(float f)
{
    char buf[32];

    for (int p = 1; p < 9; p++) {
        snprintf(buf, sizeof(buf), "%.*g", p, (double)f);
        if (strtof(buf, NULL) == f)
            return strtod(buf, NULL);
    }
    return f;
}

/* Significant digits that print v exactly (%.*g reads back as v), and no
 * fewer than its integer part has (500000.0, not 5e+05). */
static int real_digits(double v)
{
    char buf[40];
    int p;

    for (p = 1; p < 17; p++) {
        snprintf(buf, sizeof(buf), "%.*g", p, v);
        if (strtod(buf, NULL) == v)
            break;
    }
    if (fabs(v) < 1e15 && v == (double)(int64_t)v) {
        int ip = snprintf(buf, sizeof(buf), "%.0f", fabs(v));
        p = ip > p ? ip : p;
    }
    return p;
}

/* A real for the JSON document, and the digits it needs in *prec. */
static json_t *real(double v, int *prec)
{
    int p = real_digits(v);

    *prec = p > *prec ? p : *prec;
    return json_real(v);
}

/* A number that is an integer in practice (original_max_pos), as one. */
static json_t *whole(double v, int *prec)
{
    return fabs(v) < 1e15 && v == (double)(int64_t)v ? json_integer((json_int_t)v) : real(v, prec);
}

static const char *torch_dtype(dt_dtype_t dtype)
{
    return dtype == DT_BF16 ? "bfloat16" : dtype == DT_F16 ? "float16" : "float32";
}

/* config.json in transformers 4's form, which 5 reads too. *prec: the
 * digits its reals need. */
static json_t *config_json(const dt_model_cfg_t *c, dt_dtype_t dtype, int *prec)
{
    const dt_rope_t *r = &c->rope;
    json_t *o = json_object(), *scaling = json_null();
    double max_pos = DT_HF_MAX_POS_DEFAULT;

    if (r->factor > 0) {
        scaling = json_object();
        json_object_set_new(scaling, "rope_type", json_string("llama3"));
        json_object_set_new(scaling, "factor", real(r->factor, prec));
        json_object_set_new(scaling, "low_freq_factor", real(r->low_freq_factor, prec));
        json_object_set_new(scaling, "high_freq_factor", real(r->high_freq_factor, prec));
        json_object_set_new(scaling, "original_max_position_embeddings",
                            whole(r->original_max_pos, prec));
        max_pos = r->original_max_pos * r->factor;
    }
    json_object_set_new(o, "architectures", json_pack("[s]", "LlamaForCausalLM"));
    json_object_set_new(o, "model_type", json_string("llama"));
    json_object_set_new(o, "hidden_size", json_integer(c->dim));
    json_object_set_new(o, "num_hidden_layers", json_integer(c->layers));
    json_object_set_new(o, "num_attention_heads", json_integer(c->heads));
    json_object_set_new(o, "num_key_value_heads", json_integer(c->kv_heads));
    json_object_set_new(o, "head_dim", json_integer(dt_model_head_dim(c)));
    json_object_set_new(o, "intermediate_size", json_integer(c->ffn));
    json_object_set_new(o, "vocab_size", json_integer(c->vocab));
    json_object_set_new(o, "rms_norm_eps", real(float_decimal(c->norm_eps), prec));
    json_object_set_new(o, "rope_theta", real(r->theta, prec));
    json_object_set_new(o, "rope_scaling", scaling);
    json_object_set_new(o, "max_position_embeddings",
                        json_integer((json_int_t)(max_pos < 1e15 ? max_pos + 0.5 : 1e15)));
    json_object_set_new(o, "tie_word_embeddings", json_boolean(c->tied));
    json_object_set_new(o, "hidden_act", json_string("silu"));
    json_object_set_new(o, "attention_bias", json_false());
    json_object_set_new(o, "attention_dropout", real(0, prec));
    json_object_set_new(o, "mlp_bias", json_false());
    /* transformers 4 reads torch_dtype, 5 dtype */
    json_object_set_new(o, "torch_dtype", json_string(torch_dtype(dtype)));
    json_object_set_new(o, "dtype", json_string(torch_dtype(dtype)));
    return o;
}

/* doc as indented JSON with sorted keys (as transformers writes), atomically. */
static int write_json(const char *path, json_t *doc, int prec, dt_emsg_t *em)
{
    char *text = json_dumps(doc, JSON_INDENT(2) | JSON_SORT_KEYS | JSON_REAL_PRECISION(prec));
    char *line = dt_xasprintf("%s\n", text);
    int rc = dt_file_write_atomic(path, line, strlen(line), 0644, 0, em);

    free(line);
    free(text);
    return rc;
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
        int nd = shape_of(c, w[i].t, shape);
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
    int nshards, prec = 1, rc;

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
        if ((rc = write_json(path, doc, 1, em)) < 0)
            goto out;
        json_decref(doc);
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
    doc = config_json(cfg, dtype, &prec);
    rc = write_json(path, doc, prec, em);
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
