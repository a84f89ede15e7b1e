/* SPDX-License-Identifier: MIT
 *
 * A Hugging Face LLaMA model's config.json, read and written (see
 * hf_config.h for the keys and the contract), and the two ways a model
 * directory's JSON files are read and written whole, which the index
 * (hf.c, hf_export.c) shares. What is read is untrusted: read under a size
 * cap, parsed with duplicate keys rejected (json.h), every key dt reads
 * checked for its type and range, every feature dt does not implement
 * refused by name rather than skipped.
 *
 * Not here: the weights and the index's entries (hf.c), a whole
 * directory's export (hf_export.c), the model's own checks
 * (dt_model_cfg_check, spec/model.h).
 */
#include "config.h"

#include <inttypes.h>
#include <jansson.h>
#include <limits.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/fileio.h"
#include "common/mem.h"
#include "hf_config.h"
#include "json.h"

/*-- reading ----------------------------------------------------------------*/

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

int dt_hf_json_read(const char *path, json_t **root, dt_emsg_t *em)
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

    if ((rc = dt_hf_json_read(path, &root, em)) == 0)
        rc = config_from_json(path, root, cfg, em);
    json_decref(root);
    free(path);
    return rc;
}

int dt_hf_config_eos(const char *dir, int64_t *eos, dt_emsg_t *em)
{
    char *path = dt_xasprintf("%s/%s", dir, DT_HF_CONFIG);
    json_t *root;
    int rc;

    *eos = -1;
    if ((rc = dt_hf_json_read(path, &root, em)) == 0) {
        const json_t *v = json_object_get(root, "eos_token_id");
        if (json_is_array(v) && json_array_size(v) > 0)
            v = json_array_get(v, 0); /* a list: its first, as the seeds' and HF's generate */
        if (json_is_integer(v) && json_integer_value(v) >= 0)
            *eos = (int64_t)json_integer_value(v);
        else if (v != NULL && !json_is_null(v) && !json_is_array(v))
            rc = dt_emsg_set(em, DT_EINVAL, "%s: eos_token_id is not a token id (a whole "
                             "number >= 0, or a list of them)", path);
    }
    json_decref(root);
    free(path);
    return rc;
}

/*-- writing ----------------------------------------------------------------*/

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

int dt_hf_json_write(const char *path, json_t *doc, int prec, dt_emsg_t *em)
{
    char *text = json_dumps(doc, JSON_INDENT(2) | JSON_SORT_KEYS | JSON_REAL_PRECISION(prec));
    char *line = dt_xasprintf("%s\n", text);
    int rc = dt_file_write_atomic(path, line, strlen(line), 0644, 0, em);

    free(line);
    free(text);
    return rc;
}

int dt_hf_config_write(const char *dir, const dt_model_cfg_t *cfg, dt_dtype_t dtype, dt_emsg_t *em)
{
    char *path = dt_xasprintf("%s/%s", dir, DT_HF_CONFIG);
    int prec = 1;
    json_t *doc = config_json(cfg, dtype, &prec);
    int rc = dt_hf_json_write(path, doc, prec, em);

    json_decref(doc);
    free(path);
    return rc;
}
