/* SPDX-License-Identifier: MIT
 *
 * The typed payloads (common/wire.h): each struct survives encode, frame,
 * decode; a decoder refuses what it must with the field named, takes what
 * it must leniently, fills defaults, and refuses a frame of another type.
 * The reference is the struct itself and the error texts dt_msg_get_*
 * already gives (test_msg.c).
 */
#include "config.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include <criterion/criterion.h>

#include "common/msg.h"
#include "common/wire.h"

static const char SHA[] = "0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef";

/* body through a real frame of `type` (taken), decoded into m. */
static void framed(uint16_t type, json_t *body, dt_msg_t *m)
{
    dt_emsg_t em = { "" };
    uint8_t *f;
    size_t n;

    cr_assert_not_null(body);
    cr_assert_eq(dt_msg_encode(type, 7, body, &f, &n), 0);
    json_decref(body);
    cr_assert_eq(dt_msg_decode(f, n, m, &em), (int)n, "%s", em.s);
    free(f);
}

/* A frame of type with the JSON text as its body. */
static void from_text(uint16_t type, const char *text, dt_msg_t *m)
{
    json_error_t je;
    json_t *body = json_loads(text, 0, &je);
    cr_assert_not_null(body, "%s: %s", text, je.text);
    framed(type, body, m);
}

Test(wire, register_round_trip)
{
    int64_t ranks[] = { 4, 5 };
    dt_wire_register_t in = { .job = 12, .node = "node-7", .slots = 2, .pid = 4242, .gen = 3,
                              .ranks = { ranks, 2 }, .slurm_id = 99, .slurm_restart = 1 };
    dt_wire_register_t out;
    dt_emsg_t em = { "" };
    dt_msg_t m;

    framed(DT_MSG_REGISTER, dt_wire_register_encode(&in), &m);
    cr_assert_eq(dt_wire_register_decode(&m, &out, &em), 0, "%s", em.s);
    cr_assert_eq(out.job, 12);
    cr_assert_str_eq(out.node, "node-7");
    cr_assert_eq(out.slots, 2);
    cr_assert_eq(out.pid, 4242);
    cr_assert_eq(out.gen, 3);
    cr_assert_eq(out.ranks.n, 2);
    cr_assert_eq(out.ranks.v[0], 4);
    cr_assert_eq(out.ranks.v[1], 5);
    cr_assert_eq(out.slurm_id, 99);
    cr_assert_eq(out.slurm_restart, 1);
    dt_wire_register_clear(&out);
    cr_assert_null(out.ranks.v);
    dt_msg_clear(&m);
}

/* Refusals name the field, with the codes the coordinator replies with. */
static void refused(uint16_t type, const char *body, int code, const char *text)
{
    const dt_wire_schema_t *s = dt_wire_schema(type, false);
    dt_emsg_t em = { "" };
    dt_msg_t m;

    cr_assert_not_null(s);
    void *v = calloc(1, dt_wire_schema_size(s));
    from_text(type, body, &m);
    cr_assert_eq(dt_wire_decode(s, m.body, v, &em), code, "%s: %s", body, em.s);
    cr_assert_str_eq(em.s, text, "%s", body);
    dt_wire_clear(s, v);
    free(v);
    dt_msg_clear(&m);
}

Test(wire, refusals_name_the_field)
{
    refused(DT_MSG_REGISTER, "{\"node\": \"n\", \"slots\": 1}", DT_EPROTO, "missing field 'job'");
    refused(DT_MSG_REGISTER, "{\"job\": 1, \"node\": \"n\", \"slots\": \"2\"}", DT_EPROTO,
            "field 'slots' must be an integer");
    refused(DT_MSG_REGISTER, "{\"job\": 1, \"node\": \"n\", \"slots\": 0}", DT_EINVAL,
            "field 'slots' is 0: must be 1 to 1048576");
    refused(DT_MSG_REGISTER, "{\"job\": 1, \"node\": \"\\u001b[2J\", \"slots\": 1}", DT_EINVAL,
            "field 'node': control character \\x1b at byte 0 (only printable text)");
    refused(DT_MSG_REGISTER, "{\"job\": 1, \"node\": \"\", \"slots\": 1}", DT_EINVAL,
            "field 'node' is empty");
    refused(DT_MSG_SHARD_WRITTEN,
            "{\"agent\": 1, \"step\": 1, \"rank\": 0, \"bytes\": 1, \"path\": \"/x\", "
            "\"sha256\": \"zz\"}",
            DT_EINVAL, "field 'sha256' must be a sha256: 64 lowercase hex digits");
    refused(DT_MSG_SHARD_WRITTEN,
            "{\"agent\": 1, \"step\": -1, \"rank\": 0, \"bytes\": 1, \"path\": \"/x\", "
            "\"sha256\": \"zz\"}",
            DT_EINVAL, "field 'step' is -1: must be 0 to 9223372036854775807");
    refused(DT_MSG_CKPT_PRUNE, "{\"dir\": \"/c\", \"steps\": [1, -2]}", DT_EPROTO,
            "field 'steps': element 1 must be an integer >= 0");
    refused(DT_MSG_CKPT_PRUNE, "{\"dir\": \"/c\", \"steps\": []}", DT_EINVAL,
            "field 'steps': 0 elements, not 1 to 16777216");
    refused(DT_MSG_GEN_START,
            "{\"job\": 1, \"gen\": 0, \"nspace\": \"x\", \"ranks\": 1, \"nodes\": [\"a\"], "
            "\"procs\": [0], \"spec\": \"\", \"argv\": [\"train\"]}",
            DT_EINVAL, "field 'gen' is 0: must be 1 to 4294967295");
    refused(DT_MSG_CANCEL, "{\"id\": 3, \"reason\": \"a\\nb\"}", DT_EINVAL,
            "field 'reason': control character \\x0a at byte 1 (only printable text)");
    refused(DT_MSG_W_PROGRESS, "{\"rank\": 0, \"step\": 1, \"loss\": null, \"steps\": true}",
            DT_EPROTO, "field 'steps' must be an integer");
}

Test(wire, manifest_shards)
{
    dt_wire_shard_written_t out;
    dt_emsg_t em = { "" };
    dt_msg_t m;
    char body[512];

    snprintf(body, sizeof(body),
             "{\"agent\": 1, \"step\": 4, \"rank\": 0, \"bytes\": 9, \"path\": \"/c/m\", "
             "\"sha256\": \"%s\", \"manifest\": true, \"shards\": [\"%s\", \"%s\"]}",
             SHA, SHA, SHA);
    from_text(DT_MSG_SHARD_WRITTEN, body, &m);
    cr_assert_eq(dt_wire_shard_written_decode(&m, &out, &em), 0, "%s", em.s);
    cr_assert(out.manifest);
    cr_assert_eq(out.shards.n, 2);
    cr_assert_str_eq(out.shards.v[1], SHA);
    cr_assert_null(out.dir);
    dt_wire_shard_written_clear(&out);
    dt_msg_clear(&m);

    snprintf(body, sizeof(body),
             "{\"agent\": 1, \"step\": 4, \"rank\": 0, \"bytes\": 9, \"path\": \"/c/m\", "
             "\"sha256\": \"%s\", \"manifest\": true, \"shards\": [\"%s\", \"abc\"]}",
             SHA, SHA);
    refused(DT_MSG_SHARD_WRITTEN, body, DT_EPROTO,
            "field 'shards': element 1 is not a sha256 (64 lowercase hex digits)");
}

/* W_RESULT's outputs: absolute paths of attn and prefill outputs, at most
 * DT_WIRE_OUTPUTS_MAX, none for train. */
Test(wire, w_result_outputs)
{
    const char *outs[] = { "/jobs/3/output/attn.json" };
    dt_wire_w_result_t in = { .rank = 0, .steps = 1, .loss = NAN, .acc = NAN, .checksum = SHA,
                              .outputs = { outs, 1 } }, out;
    dt_emsg_t em = { "" };
    dt_msg_t m;

    framed(DT_MSG_W_RESULT, dt_wire_w_result_encode(&in), &m);
    cr_assert_eq(dt_wire_w_result_decode(&m, &out, &em), 0, "%s", em.s);
    cr_assert_eq(out.outputs.n, 1);
    cr_assert_str_eq(out.outputs.v[0], "/jobs/3/output/attn.json");
    cr_assert(isnan(out.loss), "no loss: null on the wire, NaN again");
    dt_wire_w_result_clear(&out);
    dt_msg_clear(&m);

    from_text(DT_MSG_W_RESULT, "{\"rank\": 0, \"steps\": 5}", &m);
    cr_assert_eq(dt_wire_w_result_decode(&m, &out, &em), 0, "%s", em.s);
    cr_assert_eq(out.outputs.n, 0, "train sends none");
    dt_wire_w_result_clear(&out);
    dt_msg_clear(&m);

    char body[1024] = "{\"rank\": 0, \"outputs\": [";
    for (int i = 0; i <= DT_WIRE_OUTPUTS_MAX; i++)
        strcat(body, i ? ", \"/o\"" : "\"/o\"");
    strcat(body, "]}");
    refused(DT_MSG_W_RESULT, body, DT_EINVAL, "field 'outputs': 17 elements, not 0 to 16");
    refused(DT_MSG_W_RESULT, "{\"rank\": 0, \"outputs\": [\"/o\", 3]}", DT_EPROTO,
            "field 'outputs': element 1 must be a string");
}

/* Lenient fields read as their defaults, and the decoder says which. */
Test(wire, lenient_fields)
{
    dt_wire_worker_exit_t x;
    dt_emsg_t em = { "" };
    dt_msg_t m;

    from_text(DT_MSG_WORKER_EXIT,
              "{\"agent\": 1, \"rank\": 2, \"status\": 1, \"step\": \"7\", \"hung\": 1, "
              "\"error\": 5, \"result\": []}",
              &m);
    cr_assert_eq(dt_wire_worker_exit_decode(&m, &x, &em), 1);
    cr_assert_str_eq(em.s, "field 'step' must be an integer (read as its default)");
    cr_assert_eq(x.rank, 2);
    cr_assert_eq(x.status, 1);
    cr_assert_eq(x.step, -1);
    cr_assert_not(x.hung);
    cr_assert_null(x.error);
    cr_assert_null(x.result);
    dt_msg_clear(&m);

    /* the GPU a cuda worker ran on: printable text, else none */
    from_text(DT_MSG_WORKER_EXIT,
              "{\"agent\": 1, \"rank\": 2, \"status\": 7, "
              "\"gpu\": \"GPU-d7510000-0000-0000-0000-000000000001\"}",
              &m);
    cr_assert_eq(dt_wire_worker_exit_decode(&m, &x, &em), 0, "%s", em.s);
    cr_assert_str_eq(x.gpu, "GPU-d7510000-0000-0000-0000-000000000001");
    dt_msg_clear(&m);
    from_text(DT_MSG_WORKER_EXIT,
              "{\"agent\": 1, \"rank\": 2, \"status\": 7, \"gpu\": \"GPU-\\u001b[2J\"}", &m);
    cr_assert_eq(dt_wire_worker_exit_decode(&m, &x, &em), 1);
    cr_assert_null(x.gpu, "an escape sequence is not a GPU's name");
    dt_msg_clear(&m);

    /* a strict field still refuses, lenient ones or not */
    refused(DT_MSG_WORKER_EXIT, "{\"agent\": 1, \"rank\": 2, \"status\": \"1\", \"step\": \"7\"}",
            DT_EPROTO, "field 'status' must be an integer");
}

Test(wire, defaults_and_unknown_fields)
{
    dt_wire_progress_t p;
    dt_emsg_t em = { "" };
    dt_msg_t m;

    from_text(DT_MSG_PROGRESS, "{\"agent\": 1, \"step\": 5, \"newer_field\": {\"x\": 1}}", &m);
    cr_assert_eq(dt_wire_progress_decode(&m, &p, &em), 0, "%s", em.s);
    cr_assert_eq(p.rank, -1);
    cr_assert_eq(p.gen, 0);
    cr_assert_eq(p.step, 5);
    cr_assert(isnan(p.loss) && isnan(p.tokens_s) && isnan(p.acc));
    dt_msg_clear(&m);
}

/* JSON has no NaN: a real that is not finite goes out as null and comes
 * back as NaN. */
Test(wire, non_finite_reals)
{
    dt_wire_w_progress_t in = { .rank = 1, .step = 2, .steps = 3, .tokens = 4, .loss = NAN,
                                .tokens_s = INFINITY, .acc = 0.5 }, out;
    dt_emsg_t em = { "" };
    json_t *b = dt_wire_w_progress_encode(&in);
    dt_msg_t m;

    cr_assert(json_is_null(json_object_get(b, "loss")));
    cr_assert(json_is_null(json_object_get(b, "tokens_s")));
    framed(DT_MSG_W_PROGRESS, b, &m);
    cr_assert_eq(dt_wire_w_progress_decode(&m, &out, &em), 0, "%s", em.s);
    cr_assert(isnan(out.loss) && isnan(out.tokens_s));
    cr_assert_float_eq(out.acc, 0.5, 0);
    cr_assert_eq(out.tokens, 4);
    dt_msg_clear(&m);
}

Test(wire, gen_start_lists)
{
    const char *nodes[] = { "a", "b" }, *argv[] = { "train", "--ckpt-dir", "/c" };
    int64_t procs[] = { 0, 1, 1 };
    dt_wire_gen_start_t in = { .job = 5, .gen = 2, .nspace = "dt.5.2", .ranks = 3,
                               .nodes = { nodes, 2 }, .procs = { procs, 3 },
                               .spec = "kind = train\n", .argv = { argv, 3 } }, out;
    dt_emsg_t em = { "" };
    dt_msg_t m;

    framed(DT_MSG_GEN_START, dt_wire_gen_start_encode(&in), &m);
    cr_assert_eq(dt_wire_gen_start_decode(&m, &out, &em), 0, "%s", em.s);
    cr_assert_eq(out.nodes.n, 2);
    cr_assert_str_eq(out.nodes.v[1], "b");
    cr_assert_eq(out.procs.n, 3);
    cr_assert_eq(out.procs.v[2], 1);
    cr_assert_eq(out.argv.n, 3);
    cr_assert_str_eq(out.argv.v[2], "/c");
    cr_assert_str_eq(out.spec, "kind = train\n");
    cr_assert_null(out.resume);
    cr_assert_null(json_object_get(m.body, "resume"), "an optional NULL string is left out");
    dt_wire_gen_start_clear(&out);
    dt_msg_clear(&m);
}

Test(wire, wrong_frame_type)
{
    dt_wire_register_t r;
    dt_wire_register_ok_t ok;
    dt_emsg_t em = { "" };
    dt_msg_t m;

    from_text(DT_MSG_HEARTBEAT, "{\"job\": 1, \"node\": \"n\", \"slots\": 1}", &m);
    cr_assert_eq(dt_wire_register_decode(&m, &r, &em), DT_EPROTO);
    cr_assert_str_eq(em.s, "a HEARTBEAT frame where REGISTER was expected");
    dt_msg_clear(&m);

    /* a result comes in OK; REGISTER's result is {agent, heartbeat_ms} */
    from_text(DT_MSG_OK, "{\"agent\": 8, \"heartbeat_ms\": 250}", &m);
    cr_assert_eq(dt_wire_register_ok_decode(&m, &ok, &em), 0, "%s", em.s);
    cr_assert_eq(ok.agent, 8);
    cr_assert_eq(ok.heartbeat_ms, 250);
    dt_msg_clear(&m);
}

Test(wire, error_reply)
{
    dt_wire_error_t in = { .code = DT_ENOSPC, .error = "does not fit", .refused = true }, out;
    dt_emsg_t em = { "" };
    dt_msg_t m;

    framed(DT_MSG_ERROR, dt_wire_error_encode(&in), &m);
    cr_assert_eq(dt_wire_error_decode(&m, &out, &em), 0, "%s", em.s);
    cr_assert_eq(out.code, DT_ENOSPC);
    cr_assert_str_eq(out.error, "does not fit");
    cr_assert(out.refused);
    dt_msg_clear(&m);

    /* a plain refusal does not say "refused" */
    in.refused = false;
    json_t *b = dt_wire_error_encode(&in);
    cr_assert_null(json_object_get(b, "refused"));
    json_decref(b);
}

/* Text that is not valid UTF-8 (a worker's last words) still goes out. */
Test(wire, invalid_utf8_is_escaped)
{
    dt_wire_worker_exit_t in = { .agent = 1, .rank = 0, .status = 1, .step = -1,
                                 .error = "bad \xff byte" };
    json_t *b = dt_wire_worker_exit_encode(&in);

    cr_assert_str_eq(json_string_value(json_object_get(b, "error")), "bad \\xff byte");
    json_decref(b);
}

/* Every schema: an empty body decodes or names a missing field, and the
 * table lookups agree with the typed names. */
Test(wire, every_schema)
{
    const dt_wire_schema_t *s;
    size_t n = 0;

    for (size_t i = 0; (s = dt_wire_schema_at(i)) != NULL; i++, n++) {
        void *v = calloc(1, dt_wire_schema_size(s));
        json_t *empty = json_object();
        dt_emsg_t em = { "" };
        int rc = dt_wire_decode(s, empty, v, &em);

        cr_assert(rc == 0 || (rc == DT_EPROTO && strncmp(em.s, "missing field '", 15) == 0),
                  "%s: %d %s", dt_wire_schema_name(s), rc, em.s);
        cr_assert_not_null(dt_msg_type_name(dt_wire_schema_type(s)), "%s",
                           dt_wire_schema_name(s));
        dt_wire_clear(s, v);
        json_decref(empty);
        free(v);
    }
    cr_assert_geq(n, 35);
    cr_assert_eq(dt_wire_schema(DT_MSG_REGISTER, true), dt_wire_schema_at(17));
    cr_assert_str_eq(dt_wire_schema_name(dt_wire_schema(DT_MSG_REGISTER, true)), "register_ok");
    cr_assert_null(dt_wire_schema(DT_MSG_LIST, true), "LIST's result is a document");
    cr_assert_null(dt_wire_schema(DT_MSG_HISTORY, true), "HISTORY's result is a document");
}

/* HISTORY names a job, as SHOW does, in a frame of its own type. */
Test(wire, history_request)
{
    dt_wire_job_ref_t ref = { .id = 42 }, got;
    dt_emsg_t em = { "" };
    dt_msg_t m;

    framed(DT_MSG_HISTORY, dt_wire_history_encode(&ref), &m);
    cr_assert_eq(dt_wire_history_decode(&m, &got, &em), 0, "%s", em.s);
    cr_assert_eq(got.id, 42);
    cr_assert_str_eq(dt_msg_type_name(m.type), "HISTORY");
    dt_msg_clear(&m);
    from_text(DT_MSG_HISTORY, "{\"id\": \"7\"}", &m);
    cr_assert_eq(dt_wire_history_decode(&m, &got, &em), DT_EPROTO);
    cr_assert_str_eq(em.s, "field 'id' must be an integer");
    dt_msg_clear(&m);
    from_text(DT_MSG_HISTORY, "{}", &m);
    cr_assert_eq(dt_wire_history_decode(&m, &got, &em), DT_EPROTO);
    cr_assert_str_eq(em.s, "missing field 'id'");
    dt_msg_clear(&m);
    from_text(DT_MSG_SHOW, "{\"id\": 7}", &m);
    cr_assert_eq(dt_wire_history_decode(&m, &got, &em), DT_EPROTO);
    cr_assert_str_eq(em.s, "a SHOW frame where HISTORY was expected");
    dt_msg_clear(&m);
}
