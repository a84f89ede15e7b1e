/* SPDX-License-Identifier: MIT
 *
 * Typed payloads (wire.h): one table per message says each field's name,
 * kind, place in the struct, whether it is required or lenient, and its
 * range or cap; one encoder and one decoder walk the tables.
 */
#include "config.h"

#include <inttypes.h>
#include <math.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/mem.h"
#include "common/text.h"
#include "common/wire.h"

enum kind {
    K_INT,   /* int64_t in [lo, hi] */
    K_NUM,   /* double; null or absent: NaN */
    K_BOOL,  /* bool */
    K_STR,   /* const char *; hi > 0: at most hi bytes */
    K_TEXT,  /* const char *, dt_text_check'd: lo to hi bytes */
    K_HEX64, /* const char *: 64 lowercase hex digits (a sha256) */
    K_OBJ,   /* const json_t *: an object, passed as it is */
    K_STRS,  /* dt_wire_strs_t: lo to hi strings */
    K_HEXES, /* dt_wire_strs_t: lo to hi sha256 strings */
    K_INTS,  /* dt_wire_ints_t: lo to hi integers, each >= elo */
};

#define F_REQ 1 /* missing: an error */
#define F_LAX 2 /* mistyped or out of range: the default, noted */
#define F_OUT 4 /* optional, but always written */

typedef struct field {
    const char *name;
    uint8_t kind, flags;
    size_t off;
    int64_t lo, hi, dflt, elo;
} field_t;

struct dt_wire_schema {
    const char *name;
    uint16_t type;
    bool reply;
    size_t size;
    const field_t *fields;
    size_t nfields;
};

#define FLD(T, f, k, fl, lo, hi, d, e) { #f, (k), (fl), offsetof(T, f), (lo), (hi), (d), (e) }
#define INT(T, f, fl) FLD(T, f, K_INT, fl, INT64_MIN, INT64_MAX, 0, 0)
#define INT_R(T, f, fl, lo, hi) FLD(T, f, K_INT, fl, lo, hi, 0, 0)
#define INT_D(T, f, fl, d) FLD(T, f, K_INT, fl, INT64_MIN, INT64_MAX, d, 0)
#define NUM(T, f, fl) FLD(T, f, K_NUM, fl, 0, 0, 0, 0)
#define BOOL(T, f, fl) FLD(T, f, K_BOOL, fl, 0, 0, 0, 0)
#define STR(T, f, fl) FLD(T, f, K_STR, fl, 0, 0, 0, 0)
#define TEXT(T, f, fl, lo, hi) FLD(T, f, K_TEXT, fl, lo, hi, 0, 0)
#define HEX64(T, f, fl) FLD(T, f, K_HEX64, fl, 0, 0, 0, 0)
#define OBJ(T, f, fl) FLD(T, f, K_OBJ, fl, 0, 0, 0, 0)
#define STRS(T, f, fl, lo) FLD(T, f, K_STRS, fl, lo, DT_WIRE_RANKS_MAX, 0, 0)
#define HEXES(T, f, fl, lo) FLD(T, f, K_HEXES, fl, lo, DT_WIRE_RANKS_MAX, 0, 0)
#define INTS(T, f, fl, lo, elo) FLD(T, f, K_INTS, fl, lo, DT_WIRE_RANKS_MAX, 0, elo)

/*-- the tables -------------------------------------------------------------*/

#define T dt_wire_error_t
static const field_t f_error[] = { INT(T, code, F_REQ), STR(T, error, F_REQ),
                                   BOOL(T, refused, 0) };
#undef T
#define T dt_wire_auth_t
static const field_t f_auth[] = { STR(T, cred, F_REQ) };
#undef T
#define T dt_wire_auth_ok_t
static const field_t f_auth_ok[] = { INT(T, uid, F_REQ) };
#undef T
#define T dt_wire_ping_ok_t
static const field_t f_ping_ok[] = { INT(T, version, F_REQ), STR(T, server, F_REQ),
                                     NUM(T, uptime_s, 0) };
#undef T
#define T dt_wire_submit_t
static const field_t f_submit[] = { STR(T, spec, F_REQ), TEXT(T, name, 0, 0, DT_WIRE_NAME_MAX),
                                    BOOL(T, dry_run, F_LAX | F_OUT) };
#undef T
#define T dt_wire_submit_ok_t
static const field_t f_submit_ok[] = { INT(T, id, 0), STR(T, state, 0), OBJ(T, plan, 0),
                                       STR(T, script, 0), OBJ(T, slurm, 0) };
#undef T
#define T dt_wire_job_ref_t
static const field_t f_job_ref[] = { INT(T, id, F_REQ) };
#undef T
#define T dt_wire_cancel_t
static const field_t f_cancel[] = { INT(T, id, F_REQ), TEXT(T, reason, 0, 0, DT_WIRE_REASON_MAX),
                                    BOOL(T, checkpoint, 0) };
#undef T
#define T dt_wire_cancel_ok_t
static const field_t f_cancel_ok[] = { INT(T, id, F_REQ), STR(T, state, F_REQ),
                                       BOOL(T, stopping, 0) };
#undef T
#define T dt_wire_events_t
static const field_t f_events[] = { INT(T, id, F_REQ), INT(T, since, F_OUT) };
#undef T
#define T dt_wire_checkpoint_ok_t
static const field_t f_checkpoint_ok[] = { INT(T, id, F_REQ), INT(T, gen, F_REQ) };
#undef T
#define T dt_wire_resume_ok_t
static const field_t f_resume_ok[] = { INT(T, id, F_REQ), STR(T, state, F_REQ),
                                       INT(T, step, F_REQ) };
#undef T
#define T dt_wire_register_t
static const field_t f_register[] = {
    INT(T, job, F_REQ),
    TEXT(T, node, F_REQ, 1, DT_WIRE_NAME_MAX),
    INT_R(T, slots, F_REQ, 1, DT_WIRE_SLOTS_MAX),
    INT(T, pid, F_LAX),
    INT(T, gen, F_LAX | F_OUT),
    INTS(T, ranks, F_LAX | F_OUT, 0, 0),
    INT(T, slurm_id, 0),
    INT(T, slurm_restart, 0),
    STRS(T, gpus, 0, 0),
    INT_R(T, gpu_memory_bytes, 0, 0, INT64_MAX),
    TEXT(T, gpu_why, F_LAX, 0, 256),
    TEXT(T, peer, F_LAX, 3, 300),
};
#undef T
#define T dt_wire_register_ok_t
static const field_t f_register_ok[] = { INT(T, agent, F_REQ), INT(T, heartbeat_ms, F_LAX) };
#undef T
#define T dt_wire_agent_ref_t
static const field_t f_agent_ref[] = { INT(T, agent, F_REQ), INT(T, gen, 0) };
#undef T
#define T dt_wire_progress_t
static const field_t f_progress[] = {
    INT(T, agent, F_REQ),   INT(T, gen, F_OUT),          INT_D(T, rank, F_OUT, -1),
    INT(T, pid, F_LAX | F_OUT), INT(T, step, F_REQ),     INT(T, steps, F_LAX | F_OUT),
    INT(T, tokens, F_OUT),  NUM(T, loss, F_LAX),
    NUM(T, tokens_s, F_LAX), NUM(T, acc, F_LAX),
};
#undef T
#define T dt_wire_worker_exit_t
static const field_t f_worker_exit[] = {
    INT(T, agent, F_REQ),
    INT(T, gen, F_OUT),
    INT(T, rank, F_REQ),
    INT(T, status, F_OUT),
    INT(T, signal, F_OUT),
    INT_D(T, step, F_LAX | F_OUT, -1),
    BOOL(T, hung, F_LAX | F_OUT),
    BOOL(T, stopped, F_LAX | F_OUT),
    STR(T, error, F_LAX),
    OBJ(T, result, F_LAX),
    TEXT(T, gpu, F_LAX, 1, 64),
};
#undef T
#define T dt_wire_shard_written_t
static const field_t f_shard_written[] = {
    INT(T, agent, F_REQ),
    INT(T, gen, F_OUT),
    INT_R(T, step, F_REQ, 0, INT64_MAX),
    INT_R(T, rank, F_REQ, 0, DT_WIRE_RANKS_MAX),
    INT_R(T, bytes, F_REQ, 0, INT64_MAX),
    TEXT(T, path, F_REQ, 0, DT_WIRE_PATH_MAX),
    HEX64(T, sha256, F_REQ),
    STR(T, dir, 0),
    BOOL(T, manifest, F_OUT),
    HEXES(T, shards, 0, 1),
};
#undef T
#define T dt_wire_fence_t
static const field_t f_fence[] = { INT(T, agent, F_REQ), INT(T, gen, F_REQ), INT(T, seq, F_REQ),
                                   STR(T, data, F_REQ) };
#undef T
#define T dt_wire_preempt_t
static const field_t f_preempt[] = { INT(T, agent, F_REQ), TEXT(T, signal, 0, 1, 16) };
#undef T
#define T dt_wire_ckpt_done_t
static const field_t f_ckpt_done[] = { INT(T, agent, F_REQ), STR(T, op, F_REQ),
                                       INT_R(T, step, F_REQ, 0, INT64_MAX), BOOL(T, ok, F_OUT),
                                       STR(T, error, 0) };
#undef T
#define T dt_wire_mem_ckpt_t
static const field_t f_mem_ckpt[] = {
    INT(T, agent, F_REQ),
    INT(T, gen, F_OUT),
    INT_R(T, rank, F_REQ, 0, DT_WIRE_RANKS_MAX),
    INT_R(T, step, F_REQ, 1, INT64_MAX),
    INT_R(T, bytes, F_REQ, 0, INT64_MAX),
    HEX64(T, sha256, F_REQ),
    BOOL(T, replica, F_LAX),
    TEXT(T, error, F_LAX, 1, 256),
};
#undef T
#define T dt_wire_gen_start_t
static const field_t f_gen_start[] = {
    INT(T, job, F_REQ),
    INT_R(T, gen, F_REQ, 1, UINT32_MAX),
    STR(T, nspace, F_REQ),
    INT_R(T, ranks, F_REQ, 1, DT_WIRE_RANKS_MAX),
    STRS(T, nodes, F_REQ, 1),
    INTS(T, procs, F_REQ, 1, 0),
    STR(T, spec, F_REQ),
    STRS(T, argv, F_REQ, 1),
    STR(T, resume, 0),
    STR(T, log_dir, 0),
    STR(T, device, 0),
    INT_R(T, mem_resume, F_LAX, 0, INT64_MAX),
    STRS(T, replica_to, F_LAX, 0),
    STRS(T, fetch, F_LAX, 0),
};
#undef T
#define T dt_wire_gen_abort_t
static const field_t f_gen_abort[] = { INT(T, gen, F_REQ), STR(T, reason, 0),
                                       INT_D(T, rank, 0, -1) };
#undef T
#define T dt_wire_fence_done_t
static const field_t f_fence_done[] = { INT(T, gen, F_REQ), INT(T, seq, F_REQ),
                                        STR(T, data, F_REQ), INT(T, status, F_OUT) };
#undef T
#define T dt_wire_gen_ref_t
static const field_t f_gen_ref[] = { INT(T, gen, F_REQ) };
#undef T
#define T dt_wire_stop_t
static const field_t f_stop[] = { INT(T, gen, F_REQ), BOOL(T, checkpoint, F_OUT) };
#undef T
#define T dt_wire_job_end_t
static const field_t f_job_end[] = { INT(T, job, F_REQ), STR(T, state, F_REQ) };
#undef T
#define T dt_wire_ckpt_commit_t
static const field_t f_ckpt_commit[] = { STR(T, dir, F_REQ),
                                         INT_R(T, step, F_REQ, 0, INT64_MAX) };
#undef T
#define T dt_wire_ckpt_prune_t
static const field_t f_ckpt_prune[] = { STR(T, dir, F_REQ), INTS(T, steps, F_REQ, 1, 0),
                                        STR(T, set_aside, 0) };
#undef T
#define T dt_wire_w_hello_t
static const field_t f_w_hello[] = { INT(T, rank, F_OUT), INT(T, pid, 0) };
#undef T
#define T dt_wire_w_progress_t
static const field_t f_w_progress[] = { INT(T, rank, F_OUT),  INT(T, step, F_REQ),
                                        INT(T, steps, F_OUT), INT(T, tokens, F_OUT),
                                        NUM(T, loss, F_LAX),  NUM(T, tokens_s, F_LAX),
                                        NUM(T, acc, F_LAX) };
#undef T
#define T dt_wire_w_shard_t
static const field_t f_w_shard[] = { INT(T, rank, F_OUT),
                                     INT_R(T, step, F_REQ, 0, INT64_MAX),
                                     INT_R(T, bytes, F_REQ, 0, INT64_MAX),
                                     STR(T, dir, F_REQ),
                                     STR(T, path, F_REQ),
                                     HEX64(T, sha256, F_REQ),
                                     BOOL(T, manifest, F_OUT) };
#undef T
#define T dt_wire_w_memckpt_t
static const field_t f_w_memckpt[] = {
    INT(T, rank, F_OUT),
    INT_R(T, step, F_REQ, 1, INT64_MAX),
    INT_R(T, slot, F_REQ, 0, 1),
    INT_R(T, bytes, 0, 0, INT64_MAX),
    HEX64(T, sha256, 0),
    BOOL(T, writing, 0),
};
#undef T
#define T dt_wire_peer_replica_t
static const field_t f_peer_replica[] = {
    INT_R(T, job, F_REQ, 1, INT64_MAX),
    INT_R(T, rank, F_REQ, 0, DT_WIRE_RANKS_MAX),
    INT_R(T, step, F_REQ, 1, INT64_MAX),
    INT_R(T, bytes, F_REQ, 0, INT64_MAX),
    HEX64(T, sha256, F_REQ),
};
#undef T
#define T dt_wire_peer_fetch_t
static const field_t f_peer_fetch[] = {
    INT_R(T, job, F_REQ, 1, INT64_MAX),
    INT_R(T, rank, F_REQ, 0, DT_WIRE_RANKS_MAX),
    INT_R(T, step, F_REQ, 1, INT64_MAX),
};
#undef T
#define T dt_wire_w_result_t
static const field_t f_w_result[] = { INT(T, rank, F_OUT), INT(T, steps, F_OUT),
                                      NUM(T, loss, F_LAX), NUM(T, acc, F_LAX),
                                      STR(T, checksum, 0),
                                      FLD(T, outputs, K_STRS, 0, 0, DT_WIRE_OUTPUTS_MAX, 0, 0) };
#undef T
#define T dt_wire_w_stop_t
static const field_t f_w_stop[] = { BOOL(T, checkpoint, F_OUT) };
#undef T

/* the tables of the messages that share a struct */
#define f_show f_job_ref
#define f_checkpoints f_job_ref
#define f_checkpoint f_job_ref
#define f_resume f_job_ref
#define f_history f_job_ref
#define f_heartbeat f_agent_ref
#define f_gen_ended f_agent_ref
#define f_ckpt_request f_gen_ref
#define f_w_heartbeat f_w_hello

static const dt_wire_schema_t schemas[] = {
#define DT_WIRE_SCHEMA(name, type, reply, S)                                                  \
    { #name, DT_MSG_##type, (reply), sizeof(S), f_##name, DT_ARRAY_SIZE(f_##name) },
    DT_WIRE_MESSAGES(DT_WIRE_SCHEMA)
#undef DT_WIRE_SCHEMA
};

/*-- decoding -----------------------------------------------------------------*/

#define AT(v, f, type) ((type *)((char *)(v) + (f)->off))
#define CAT(v, f, type) ((const type *)((const char *)(v) + (f)->off))

static void set_default(const field_t *f, void *out)
{
    switch (f->kind) {
    case K_INT: *AT(out, f, int64_t) = f->dflt; break;
    case K_NUM: *AT(out, f, double) = NAN; break;
    case K_BOOL: *AT(out, f, bool) = false; break;
    case K_STR:
    case K_TEXT:
    case K_HEX64: *AT(out, f, const char *) = NULL; break;
    case K_OBJ: *AT(out, f, const json_t *) = NULL; break;
    case K_STRS:
    case K_HEXES:
        free(AT(out, f, dt_wire_strs_t)->v);
        *AT(out, f, dt_wire_strs_t) = (dt_wire_strs_t){ 0 };
        break;
    case K_INTS:
        free(AT(out, f, dt_wire_ints_t)->v);
        *AT(out, f, dt_wire_ints_t) = (dt_wire_ints_t){ 0 };
        break;
    }
}

static const char *kind_what(const field_t *f)
{
    switch (f->kind) {
    case K_INT: return "an integer";
    case K_NUM: return "a number or null";
    case K_BOOL: return "a boolean";
    case K_OBJ: return "an object";
    case K_STRS: return "an array of strings";
    case K_HEXES: return "an array of sha256 strings";
    case K_INTS: return "an array of integers";
    default: return "a string";
    }
}

/* A list: an array of lo to hi elements, each checked. */
static int decode_list(const field_t *f, const json_t *v, void *out, dt_emsg_t *em)
{
    size_t n = json_array_size(v), i;
    const json_t *x;

    if ((int64_t)n < f->lo || (int64_t)n > f->hi)
        return dt_emsg_set(em, DT_EINVAL, "field '%s': %zu elements, not %" PRId64 " to %" PRId64,
                           f->name, n, f->lo, f->hi);
    if (f->kind == K_INTS) {
        dt_wire_ints_t *l = AT(out, f, dt_wire_ints_t);
        l->v = dt_xcalloc(n ? n : 1, sizeof(*l->v));
        json_array_foreach(v, i, x) {
            if (!json_is_integer(x) || json_integer_value(x) < f->elo)
                return dt_emsg_set(em, DT_EPROTO, "field '%s': element %zu must be an integer "
                                   ">= %" PRId64, f->name, i, f->elo);
            l->v[l->n++] = (int64_t)json_integer_value(x);
        }
        return 0;
    }
    dt_wire_strs_t *l = AT(out, f, dt_wire_strs_t);
    l->v = dt_xcalloc(n ? n : 1, sizeof(*l->v));
    json_array_foreach(v, i, x) {
        const char *s = json_string_value(x);
        if (s == NULL)
            return dt_emsg_set(em, DT_EPROTO, "field '%s': element %zu must be a string",
                               f->name, i);
        if (f->kind == K_HEXES && !dt_text_is_hex(s, 64))
            return dt_emsg_set(em, DT_EPROTO, "field '%s': element %zu is not a sha256 (64 "
                               "lowercase hex digits)", f->name, i);
        l->v[l->n++] = s;
    }
    return 0;
}

/* One present field: 0, or < 0 with em set (the value may be half set:
 * the caller resets it). */
static int decode_field(const field_t *f, const json_t *v, void *out, dt_emsg_t *em)
{
    char what[80];
    int rc;

    switch (f->kind) {
    case K_INT: {
        if (!json_is_integer(v))
            break;
        int64_t x = (int64_t)json_integer_value(v);
        if (x < f->lo || x > f->hi)
            return dt_emsg_set(em, DT_EINVAL, "field '%s' is %" PRId64 ": must be %" PRId64
                               " to %" PRId64, f->name, x, f->lo, f->hi);
        *AT(out, f, int64_t) = x;
        return 0;
    }
    case K_NUM:
        if (json_is_null(v)) {
            *AT(out, f, double) = NAN;
            return 0;
        }
        if (!json_is_number(v))
            break;
        *AT(out, f, double) = json_number_value(v);
        return 0;
    case K_BOOL:
        if (!json_is_boolean(v))
            break;
        *AT(out, f, bool) = json_is_true(v);
        return 0;
    case K_STR:
    case K_TEXT:
    case K_HEX64: {
        const char *s = json_string_value(v);
        if (s == NULL)
            break;
        if (f->kind == K_TEXT) {
            snprintf(what, sizeof(what), "field '%s'", f->name);
            if ((rc = dt_text_check(what, s, (size_t)f->hi, em)) < 0)
                return rc;
            if ((int64_t)strlen(s) < f->lo)
                return dt_emsg_set(em, DT_EINVAL, "field '%s' is empty", f->name);
        }
        if (f->kind == K_HEX64 && !dt_text_is_hex(s, 64))
            return dt_emsg_set(em, DT_EINVAL, "field '%s' must be a sha256: 64 lowercase hex "
                               "digits", f->name);
        *AT(out, f, const char *) = s;
        return 0;
    }
    case K_OBJ:
        if (!json_is_object(v))
            break;
        *AT(out, f, const json_t *) = v;
        return 0;
    case K_STRS:
    case K_HEXES:
    case K_INTS:
        if (!json_is_array(v))
            break;
        return decode_list(f, v, out, em);
    }
    return dt_emsg_set(em, DT_EPROTO, "field '%s' must be %s", f->name, kind_what(f));
}

int dt_wire_decode(const dt_wire_schema_t *s, const json_t *body, void *out, dt_emsg_t *em)
{
    int noted = 0, rc;

    memset(out, 0, s->size);
    for (size_t i = 0; i < s->nfields; i++)
        set_default(&s->fields[i], out);
    for (size_t i = 0; i < s->nfields; i++) {
        const field_t *f = &s->fields[i];
        const json_t *v = json_is_object(body) ? json_object_get(body, f->name) : NULL;
        dt_emsg_t e2 = { "" };

        if (v == NULL) {
            if (f->flags & F_REQ) {
                dt_wire_clear(s, out);
                return dt_emsg_set(em, DT_EPROTO, "missing field '%s'", f->name);
            }
            continue;
        }
        if ((rc = decode_field(f, v, out, &e2)) == 0)
            continue;
        if (f->flags & F_LAX) {
            set_default(f, out);
            if (!noted++)
                dt_emsg_set(em, rc, "%s (read as its default)", e2.s);
            continue;
        }
        dt_wire_clear(s, out);
        return dt_emsg_set(em, rc, "%s", e2.s);
    }
    return noted ? 1 : 0;
}

void dt_wire_clear(const dt_wire_schema_t *s, void *v)
{
    for (size_t i = 0; i < s->nfields; i++) {
        const field_t *f = &s->fields[i];
        if (f->kind == K_INTS)
            free(AT(v, f, dt_wire_ints_t)->v);
        else if (f->kind == K_STRS || f->kind == K_HEXES)
            free(AT(v, f, dt_wire_strs_t)->v);
    }
    memset(v, 0, s->size);
}

/*-- encoding -----------------------------------------------------------------*/

/* A string as JSON: text that is not valid UTF-8 (a worker's last words
 * may hold anything) goes out escaped rather than not at all. */
static json_t *string_value(const char *s)
{
    json_t *j = json_string(s);
    if (j == NULL) {
        char *e = dt_text_escape(s, DT_TEXT_KEEP_LINES);
        j = json_string(e);
        free(e);
    }
    return j;
}

static json_t *encode_field(const field_t *f, const void *v)
{
    bool req = f->flags & (F_REQ | F_OUT);

    switch (f->kind) {
    case K_INT: {
        int64_t x = *CAT(v, f, int64_t);
        return req || x != f->dflt ? json_integer((json_int_t)x) : NULL;
    }
    case K_NUM: {
        double x = *CAT(v, f, double);
        return isfinite(x) ? json_real(x) : json_null();
    }
    case K_BOOL: {
        bool x = *CAT(v, f, bool);
        return req || x ? json_boolean(x) : NULL;
    }
    case K_STR:
    case K_TEXT:
    case K_HEX64: {
        const char *s = *CAT(v, f, const char *);
        return s ? string_value(s) : NULL;
    }
    case K_OBJ: {
        const json_t *o = *CAT(v, f, const json_t *);
        return o ? json_incref((json_t *)o) : NULL;
    }
    case K_STRS:
    case K_HEXES: {
        const dt_wire_strs_t *l = CAT(v, f, dt_wire_strs_t);
        if (!req && l->n == 0)
            return NULL;
        json_t *a = json_array();
        for (size_t i = 0; i < l->n; i++)
            json_array_append_new(a, string_value(l->v[i] ? l->v[i] : ""));
        return a;
    }
    case K_INTS: {
        const dt_wire_ints_t *l = CAT(v, f, dt_wire_ints_t);
        if (!req && l->n == 0)
            return NULL;
        json_t *a = json_array();
        for (size_t i = 0; i < l->n; i++)
            json_array_append_new(a, json_integer((json_int_t)l->v[i]));
        return a;
    }
    }
    return NULL;
}

json_t *dt_wire_encode(const dt_wire_schema_t *s, const void *v)
{
    json_t *o = json_object();

    if (o == NULL)
        abort(); /* only when memory is exhausted */
    for (size_t i = 0; i < s->nfields; i++) {
        json_t *x = encode_field(&s->fields[i], v);
        if (x)
            json_object_set_new(o, s->fields[i].name, x);
    }
    return o;
}

/*-- lookup, and the typed wrappers ---------------------------------------------*/

const dt_wire_schema_t *dt_wire_schema(uint16_t type, bool reply)
{
    for (size_t i = 0; i < DT_ARRAY_SIZE(schemas); i++)
        if (schemas[i].type == type && schemas[i].reply == reply)
            return &schemas[i];
    return NULL;
}

const dt_wire_schema_t *dt_wire_schema_at(size_t i)
{
    return i < DT_ARRAY_SIZE(schemas) ? &schemas[i] : NULL;
}

const char *dt_wire_schema_name(const dt_wire_schema_t *s)
{
    return s->name;
}

uint16_t dt_wire_schema_type(const dt_wire_schema_t *s)
{
    return s->type;
}

size_t dt_wire_schema_size(const dt_wire_schema_t *s)
{
    return s->size;
}

/* A request or push must come in a frame of its own type; a result comes
 * in OK (or, for ERROR's struct, ERROR). */
static int decode_msg(const dt_wire_schema_t *s, const dt_msg_t *m, void *out, dt_emsg_t *em)
{
    uint16_t want = s->reply && s->type != DT_MSG_ERROR ? DT_MSG_OK : s->type;

    if (m->type != want) {
        memset(out, 0, s->size);
        const char *got = dt_msg_type_name(m->type);
        return dt_emsg_set(em, DT_EPROTO, "a %s frame where %s was expected", got ? got : "?",
                           dt_msg_type_name(want));
    }
    return dt_wire_decode(s, m->body, out, em);
}

#define DT_WIRE_DEFINE(name, type, reply, S)                                                 \
    json_t *dt_wire_##name##_encode(const S *v)                                              \
    {                                                                                        \
        return dt_wire_encode(&schemas[ix_##name], v);                                       \
    }                                                                                        \
    int dt_wire_##name##_decode(const dt_msg_t *m, S *out, dt_emsg_t *em)                    \
    {                                                                                        \
        return decode_msg(&schemas[ix_##name], m, out, em);                                  \
    }                                                                                        \
    void dt_wire_##name##_clear(S *v)                                                        \
    {                                                                                        \
        dt_wire_clear(&schemas[ix_##name], v);                                               \
    }

enum {
#define DT_WIRE_INDEX(name, type, reply, S) ix_##name,
    DT_WIRE_MESSAGES(DT_WIRE_INDEX)
#undef DT_WIRE_INDEX
};

DT_WIRE_MESSAGES(DT_WIRE_DEFINE)
