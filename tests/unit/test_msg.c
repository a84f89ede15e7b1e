/* SPDX-License-Identifier: MIT
 *
 * Unit tests for common/msg: every message type of proto.h round-trips
 * through encode and decode with its header in network byte order; a stream
 * of frames fed byte by byte or in random chunks comes out whole and in
 * order, the decoder answering "need more" until each frame is complete;
 * every header and payload error is refused with the message a user would
 * read, and an oversize length before any payload byte has arrived; the
 * encoder refuses a body over the limit; the getters name the missing or
 * mistyped field. Nothing here opens a socket.
 */
#include "config.h"

#include <criterion/criterion.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/mem.h"
#include "common/msg.h"

static const struct {
    uint16_t type;
    const char *name;
} types[] = {
#define ROW(name, value, dir, payload) { DT_MSG_##name, #name },
    DT_MSG_TYPES(ROW)
#undef ROW
};

#define NTYPES (sizeof(types) / sizeof(types[0]))

/* A frame with any header, valid or not: the decoder's view of the wire. */
static uint8_t *raw(uint32_t magic, uint16_t version, uint16_t type, uint32_t id,
                    const char *payload, size_t plen, size_t *n)
{
    uint8_t *f = dt_xmalloc(DT_MSG_HDR + plen);
    const uint32_t words[] = { magic, id, (uint32_t)plen };

    f[0] = (uint8_t)(words[0] >> 24);
    f[1] = (uint8_t)(words[0] >> 16);
    f[2] = (uint8_t)(words[0] >> 8);
    f[3] = (uint8_t)words[0];
    f[4] = (uint8_t)(version >> 8);
    f[5] = (uint8_t)version;
    f[6] = (uint8_t)(type >> 8);
    f[7] = (uint8_t)type;
    for (int w = 1; w < 3; w++)
        for (int b = 0; b < 4; b++)
            f[4 + 4 * w + b] = (uint8_t)(words[w] >> (24 - 8 * b));
    if (plen > 0)
        memcpy(f + DT_MSG_HDR, payload, plen);
    *n = DT_MSG_HDR + plen;
    return f;
}

/* A well-formed PING frame around an arbitrary payload. */
static uint8_t *ping(const char *payload, size_t plen, size_t *n)
{
    return raw(DT_PROTO_MAGIC, DT_PROTO_VERSION, DT_MSG_PING, 7, payload, plen, n);
}

/* buf[0..n) is refused with DT_EPROTO and exactly the message want; the
 * message is zeroed so that dt_msg_clear is safe. */
static void expect_refused(const uint8_t *buf, size_t n, const char *want)
{
    dt_msg_t m = { .type = 99, .id = 99, .body = NULL };
    dt_emsg_t em = { .s = "" };
    int rc = dt_msg_decode(buf, n, &m, &em);

    cr_assert_eq(rc, DT_EPROTO, "decode returned %d for \"%s\"", rc, want);
    cr_assert_str_eq(em.s, want);
    cr_assert_null(m.body);
    cr_assert_eq(m.type, 0);
    dt_msg_clear(&m);
}

static void expect_payload_refused(const char *payload, size_t plen, const char *want)
{
    size_t n;
    uint8_t *f = ping(payload, plen, &n);

    expect_refused(f, n, want);
    free(f);
}

#define PAYLOAD_REFUSED(lit, want) expect_payload_refused((lit), sizeof(lit) - 1, (want))

/* A body with one value of every JSON kind, distinct per i. */
static json_t *sample_body(size_t i)
{
    json_t *b = json_pack("{s:I, s:s, s:b, s:n, s:f, s:[i, s, {s:i}], s:{s:{s:s}}, s:s}", "id",
                          (json_int_t)(1000 + i), "name", types[i % NTYPES].name, "flag",
                          (int)(i & 1), "nothing", "real", 0.1 * (double)i, "list", (int)i, "two",
                          "three", 3, "nested", "a", "b", "c", "utf8",
                          "gr\xc3\xbc\xc3\x9f \xe2\x82\xac \xf0\x9f\x98\x80 \"q\" \\ \n");

    cr_assert_not_null(b);
    return b;
}

/* ---- round trips ---------------------------------------------------------- */

Test(msg, type_names_come_from_the_table)
{
    cr_assert_geq(NTYPES, 15);
    for (size_t i = 0; i < NTYPES; i++)
        cr_assert_str_eq(dt_msg_type_name(types[i].type), types[i].name);
    cr_assert_str_eq(dt_msg_type_name(DT_MSG_SHARD_WRITTEN), "SHARD_WRITTEN");
    cr_assert_null(dt_msg_type_name(0));
    cr_assert_null(dt_msg_type_name(3));
    cr_assert_null(dt_msg_type_name(58));
    cr_assert_null(dt_msg_type_name(UINT16_MAX));
}

Test(msg, every_type_round_trips)
{
    for (size_t i = 0; i < NTYPES; i++) {
        json_t *body = sample_body(i);
        uint32_t id = i == 0 ? UINT32_MAX : (uint32_t)(0x01020304u * i);
        dt_msg_t m;
        dt_emsg_t em = { .s = "" };
        uint8_t *f;
        size_t n;
        int rc;

        cr_assert_eq(dt_msg_encode(types[i].type, id, body, &f, &n), 0, "%s", types[i].name);
        cr_assert_gt(n, DT_MSG_HDR);
        rc = dt_msg_decode(f, n, &m, &em);
        cr_assert_eq(rc, (int)n, "%s: decode returned %d (%s)", types[i].name, rc, em.s);
        cr_assert_eq(m.type, types[i].type);
        cr_assert_eq(m.id, id);
        cr_assert(json_equal(m.body, body), "%s: body differs after the round trip", types[i].name);
        /* Compact: no space after ':' or ','. */
        cr_assert_null(memmem(f + DT_MSG_HDR, n - DT_MSG_HDR, ": ", 2));
        cr_assert_null(memmem(f + DT_MSG_HDR, n - DT_MSG_HDR, ", ", 2));
        dt_msg_clear(&m);
        cr_assert_null(m.body);
        free(f);
        json_decref(body);
    }
}

Test(msg, header_is_in_network_byte_order)
{
    static const uint8_t want[DT_MSG_HDR] = { 'D',  'T',  'P',  '1',  0x00, 0x01, 0x00, 20,
                                              0x0a, 0x0b, 0x0c, 0x0d, 0x00, 0x00, 0x00, 8 };
    json_t *body = json_pack("{s:i}", "id", 5);
    uint8_t *f;
    size_t n;

    cr_assert_eq(dt_msg_encode(DT_MSG_SUBMIT, 0x0a0b0c0d, body, &f, &n), 0);
    cr_assert_eq(n, DT_MSG_HDR + 8);
    cr_assert_arr_eq(f, want, DT_MSG_HDR);
    cr_assert_arr_eq(f + DT_MSG_HDR, "{\"id\":5}", 8);
    free(f);
    json_decref(body);
}

Test(msg, null_body_encodes_as_empty_object)
{
    dt_msg_t m;
    uint8_t *f;
    size_t n;

    cr_assert_eq(dt_msg_encode(DT_MSG_HEARTBEAT, 1, NULL, &f, &n), 0);
    cr_assert_eq(n, DT_MSG_HDR + 2);
    cr_assert_arr_eq(f + DT_MSG_HDR, "{}", 2);
    cr_assert_eq(dt_msg_decode(f, n, &m, NULL), (int)n);
    cr_assert(json_is_object(m.body));
    cr_assert_eq(json_object_size(m.body), 0);
    dt_msg_clear(&m);
    free(f);
}

Test(msg, empty_payload_decodes_as_empty_object)
{
    dt_msg_t m;
    size_t n;
    uint8_t *f = ping(NULL, 0, &n);

    cr_assert_eq(n, DT_MSG_HDR);
    cr_assert_eq(dt_msg_decode(f, n, &m, NULL), DT_MSG_HDR);
    cr_assert_eq(m.type, DT_MSG_PING);
    cr_assert_eq(m.id, 7);
    cr_assert(json_is_object(m.body));
    cr_assert_eq(json_object_size(m.body), 0);
    dt_msg_clear(&m);
    free(f);
}

Test(msg, whitespace_around_the_object_is_allowed)
{
    dt_msg_t m;
    size_t n;
    uint8_t *f = ping(" \t\r\n{\"a\":1}\n", 12, &n);

    cr_assert_eq(dt_msg_decode(f, n, &m, NULL), (int)n);
    cr_assert_eq(json_integer_value(json_object_get(m.body, "a")), 1);
    dt_msg_clear(&m);
    free(f);
}

/* ---- split reads ------------------------------------------------------------ */

struct stream {
    uint8_t *bytes;
    size_t n;
    size_t end[3]; /* offset just past frame k */
    json_t *sent[3];
    uint16_t type[3];
};

/* Three frames of different types and sizes, one with an empty body. */
static void stream_init(struct stream *s)
{
    static const uint16_t t[3] = { DT_MSG_SUBMIT, DT_MSG_OK, DT_MSG_PROGRESS };

    s->bytes = NULL;
    s->n = 0;
    for (int k = 0; k < 3; k++) {
        uint8_t *f;
        size_t n;

        s->sent[k] = k == 1 ? json_object() : sample_body((size_t)k * 5);
        s->type[k] = t[k];
        cr_assert_eq(dt_msg_encode(t[k], (uint32_t)k + 100, s->sent[k], &f, &n), 0);
        s->bytes = dt_xrealloc(s->bytes, s->n + n);
        memcpy(s->bytes + s->n, f, n);
        s->n += n;
        s->end[k] = s->n;
        free(f);
    }
}

static void stream_close(struct stream *s)
{
    for (int k = 0; k < 3; k++)
        json_decref(s->sent[k]);
    free(s->bytes);
}

/* Deliver the stream in chunks whose sizes next_chunk() picks, the way a
 * connection would: append to a receive buffer, decode while frames are
 * complete, keep the rest. Each frame must come out in order, from the
 * chunk that completed it and not before. */
static void deliver(struct stream *s, size_t (*next_chunk)(uint64_t *), uint64_t seed)
{
    uint8_t *rx = NULL;
    size_t have = 0, got = 0, k = 0;
    uint64_t state = seed;

    while (got < s->n) {
        size_t c = next_chunk(&state);

        if (c > s->n - got)
            c = s->n - got;
        /* An exact-size buffer per arrival: a read past n is a read past
         * the allocation. */
        rx = dt_xrealloc(rx, have + c);
        memcpy(rx + have, s->bytes + got, c);
        have += c;
        got += c;
        for (;;) {
            dt_msg_t m;
            dt_emsg_t em = { .s = "" };
            int rc = dt_msg_decode(rx, have, &m, &em);

            cr_assert_geq(rc, 0, "seed %llu: %s", (unsigned long long)seed, em.s);
            if (rc == 0) {
                cr_assert(k == 3 || got < s->end[k],
                          "seed %llu: frame %zu complete at byte %zu but not decoded",
                          (unsigned long long)seed, k, got);
                break;
            }
            cr_assert_lt(k, 3);
            cr_assert_geq(got, s->end[k]);
            cr_assert_lt(got - c, s->end[k], "seed %llu: frame %zu decoded late",
                         (unsigned long long)seed, k);
            cr_assert_eq((size_t)rc, s->end[k] - (k > 0 ? s->end[k - 1] : 0));
            cr_assert_eq(m.type, s->type[k]);
            cr_assert_eq(m.id, 100 + k);
            cr_assert(json_equal(m.body, s->sent[k]), "seed %llu: frame %zu body differs",
                      (unsigned long long)seed, k);
            dt_msg_clear(&m);
            memmove(rx, rx + rc, have - (size_t)rc);
            have -= (size_t)rc;
            k++;
        }
    }
    cr_assert_eq(k, 3);
    cr_assert_eq(have, 0);
    free(rx);
}

static size_t one_byte(uint64_t *state)
{
    (void)state;
    return 1;
}

/* 1..64 bytes, xorshift64 */
static size_t random_chunk(uint64_t *state)
{
    uint64_t x = *state;

    x ^= x << 13;
    x ^= x >> 7;
    x ^= x << 17;
    *state = x;
    return 1 + (size_t)(x % 64);
}

Test(msg, stream_fed_byte_by_byte)
{
    struct stream s;

    stream_init(&s);
    deliver(&s, one_byte, 0);
    stream_close(&s);
}

Test(msg, stream_fed_in_random_chunks)
{
    struct stream s;

    stream_init(&s);
    for (uint64_t seed = 1; seed <= 200; seed++)
        deliver(&s, random_chunk, seed * 0x9e3779b97f4a7c15ull);
    stream_close(&s);
}

Test(msg, truncated_header_needs_more)
{
    dt_msg_t m;
    size_t n, need = 12345;
    uint8_t *f = ping("{}", 2, &n);

    for (size_t i = 0; i < DT_MSG_HDR; i++) {
        cr_assert_eq(dt_msg_peek(f, i, &need, NULL), 1, "%zu bytes", i);
        cr_assert_eq(need, 12345, "peek set need with %zu bytes", i);
        cr_assert_eq(dt_msg_decode(f, i, &m, NULL), 0, "%zu bytes", i);
        cr_assert_null(m.body);
    }
    cr_assert_eq(dt_msg_peek(f, DT_MSG_HDR, &need, NULL), 0);
    cr_assert_eq(need, n);
    free(f);
}

Test(msg, truncated_payload_needs_more)
{
    dt_msg_t m;
    size_t n, need;
    uint8_t *f = ping("{\"a\":[1,2,3]}", 13, &n);

    for (size_t i = DT_MSG_HDR; i < n; i++) {
        cr_assert_eq(dt_msg_peek(f, i, &need, NULL), 0);
        cr_assert_eq(need, n);
        cr_assert_eq(dt_msg_decode(f, i, &m, NULL), 0, "%zu of %zu bytes", i, n);
    }
    cr_assert_eq(dt_msg_decode(f, n, &m, NULL), (int)n);
    dt_msg_clear(&m);
    free(f);
}

Test(msg, frame_followed_by_more_bytes_uses_only_its_own)
{
    dt_msg_t m;
    size_t n;
    uint8_t *f = ping("{\"a\":1}", 7, &n);
    uint8_t *more = dt_xmalloc(n + 5);

    memcpy(more, f, n);
    memcpy(more + n, "DTP1x", 5);
    cr_assert_eq(dt_msg_decode(more, n + 5, &m, NULL), (int)n);
    dt_msg_clear(&m);
    free(more);
    free(f);
}

/* ---- header errors ------------------------------------------------------------ */

Test(msg, oversize_length_refused_from_the_header_alone)
{
    dt_msg_t m;
    dt_emsg_t em = { .s = "" };
    size_t n, need = 0;
    /* Only the 16 header bytes: nothing of the payload has arrived. */
    uint8_t *f = raw(DT_PROTO_MAGIC, 1, DT_MSG_SUBMIT, 1, NULL, 0, &n);

    f[12] = 0x01; /* len = 0x01000001 = DT_MSG_MAX + 1 */
    f[15] = 0x01;
    expect_refused(f, DT_MSG_HDR, "frame of 16777217 bytes exceeds the 16 MiB limit");
    cr_assert_eq(dt_msg_peek(f, DT_MSG_HDR, &need, &em), DT_EPROTO);
    cr_assert_str_eq(em.s, "frame of 16777217 bytes exceeds the 16 MiB limit");

    memset(f + 12, 0xff, 4);
    expect_refused(f, DT_MSG_HDR, "frame of 4294967295 bytes exceeds the 16 MiB limit");

    /* Exactly at the limit is a frame still arriving. */
    f[12] = 0x01;
    f[13] = f[14] = f[15] = 0;
    cr_assert_eq(dt_msg_decode(f, DT_MSG_HDR, &m, NULL), 0);
    cr_assert_eq(dt_msg_peek(f, DT_MSG_HDR, &need, NULL), 0);
    cr_assert_eq(need, DT_MSG_HDR + DT_MSG_MAX);
    free(f);
}

Test(msg, wrong_version_refused)
{
    size_t n;
    uint8_t *f = raw(DT_PROTO_MAGIC, 2, DT_MSG_PING, 1, "{}", 2, &n);

    expect_refused(f, n, "protocol version 2, this build speaks 1");
    expect_refused(f, DT_MSG_HDR, "protocol version 2, this build speaks 1");
    f[4] = f[5] = 0;
    expect_refused(f, n, "protocol version 0, this build speaks 1");
    f[4] = 0x01; /* 256: a little-endian peer's 1 */
    expect_refused(f, n, "protocol version 256, this build speaks 1");
    free(f);
}

Test(msg, bad_magic_refused)
{
    static const char http[] = "GET / HTTP/1.1\r\nHost: x\r\n\r\n";
    size_t n;
    uint8_t *f = raw(0x31505444u, 1, DT_MSG_PING, 1, "{}", 2, &n); /* "DTP1" byte-swapped */

    expect_refused(f, n, "bad magic 0x31505444, expected 0x44545031 (\"DTP1\")");
    expect_refused((const uint8_t *)http, sizeof(http) - 1,
                   "bad magic 0x47455420, expected 0x44545031 (\"DTP1\")");
    free(f);
}

Test(msg, unknown_type_refused)
{
    static const uint16_t bad[] = { 0, 3, 12, 58, 256, UINT16_MAX };
    char want[64];

    for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
        size_t n;
        uint8_t *f = raw(DT_PROTO_MAGIC, 1, bad[i], 1, "{}", 2, &n);

        snprintf(want, sizeof(want), "unknown message type %u", (unsigned)bad[i]);
        expect_refused(f, n, want);
        free(f);
    }
}

/* ---- payload errors ------------------------------------------------------------- */

Test(msg, payload_must_be_json)
{
    PAYLOAD_REFUSED("not json",
                    "payload is not a JSON object: '[' or '{' expected near 'not' at byte 3");
    PAYLOAD_REFUSED("   ", "payload is not a JSON object: '[' or '{' expected near end of file "
                           "at byte 3");
    PAYLOAD_REFUSED("{\"a\":", "payload is not a JSON object: unexpected token near end of "
                               "file at byte 5");
    PAYLOAD_REFUSED("{\"a\":tru}",
                    "payload is not a JSON object: invalid token near 'tru' at byte 8");
}

Test(msg, payload_must_be_an_object)
{
    PAYLOAD_REFUSED("[1,2]", "payload is not a JSON object: top-level value is an array at byte 0");
    PAYLOAD_REFUSED("\"str\"",
                    "payload is not a JSON object: '[' or '{' expected near '\"str\"' at byte 5");
    PAYLOAD_REFUSED("42", "payload is not a JSON object: '[' or '{' expected near '42' at byte 2");
    PAYLOAD_REFUSED("null",
                    "payload is not a JSON object: '[' or '{' expected near 'null' at byte 4");
}

Test(msg, trailing_bytes_after_the_object_refused)
{
    PAYLOAD_REFUSED("{} x", "payload is not a JSON object: end of file expected near 'x' at "
                            "byte 4");
    PAYLOAD_REFUSED("{}{}", "payload is not a JSON object: end of file expected near '{' at "
                            "byte 3");
    /* A C string's NUL counted in len is a trailing byte too (jansson's
     * lexer reads it as the end of input, hence its wording). */
    expect_payload_refused("{}", 3,
                           "payload is not a JSON object: end of file expected near end of file "
                           "at byte 3");
}

Test(msg, invalid_utf8_refused)
{
    PAYLOAD_REFUSED("{\"a\":\"\xff\"}",
                    "payload is not a JSON object: unable to decode byte 0xff near '\"' at byte 6");
    /* overlong '/' */
    PAYLOAD_REFUSED("{\"a\":\"\xc0\xaf\"}",
                    "payload is not a JSON object: unable to decode byte 0xc0 near '\"' at byte 6");
    /* a UTF-16 surrogate */
    PAYLOAD_REFUSED("{\"a\":\"\xed\xa0\x80\"}",
                    "payload is not a JSON object: unable to decode byte 0xed near '\"' at byte 6");
    /* in a key */
    PAYLOAD_REFUSED("{\"\xfe\":1}",
                    "payload is not a JSON object: unable to decode byte 0xfe near '\"' at byte 2");
}

Test(msg, duplicate_keys_refused)
{
    PAYLOAD_REFUSED("{\"a\":1,\"a\":2}",
                    "payload is not a JSON object: duplicate object key near '\"a\"' at byte 10");
    PAYLOAD_REFUSED("{\"o\":{\"k\":1,\"k\":1}}", "payload is not a JSON object: duplicate "
                                                 "object key near '\"k\"' at byte 15");
}

Test(msg, nul_in_strings_refused)
{
    PAYLOAD_REFUSED("{\"a\":\"\\u0000\"}",
                    "payload is not a JSON object: \\u0000 is not allowed without JSON_ALLOW_NUL "
                    "near '\"\\u0000\"' at byte 13");
    PAYLOAD_REFUSED("{\"a\":\"b\0\"}",
                    "payload is not a JSON object: control character 0x0 near '\"b' at byte 7");
}

Test(msg, numbers_out_of_range_refused)
{
    PAYLOAD_REFUSED("{\"a\":1e999}",
                    "payload is not a JSON object: real number overflow near '1e999' at byte 10");
    PAYLOAD_REFUSED("{\"a\":99999999999999999999}",
                    "payload is not a JSON object: too big integer near '99999999999999999999' "
                    "at byte 25");
}

/* The peer's bytes quoted by the parser are escaped: no control characters
 * or invalid UTF-8 reach a log line. */
Test(msg, error_messages_escape_the_peers_bytes)
{
    PAYLOAD_REFUSED("\xef\xbb\xbf{}", "payload is not a JSON object: '[' or '{' expected near "
                                      "'\\xef\\xbb\\xbf' at byte 3");
    PAYLOAD_REFUSED("{\"a\":1,\x1b[2J}", "payload is not a JSON object: string or '}' "
                                         "expected near '\\x1b' at byte 8");
    /* U+202E RIGHT-TO-LEFT OVERRIDE, valid UTF-8 but not for a terminal */
    PAYLOAD_REFUSED("{\xe2\x80\xae}", "payload is not a JSON object: string or '}' expected "
                                      "near '\\xe2\\x80\\xae' at byte 4");
}

/* jansson's parser stops at JSON_PARSER_MAX_DEPTH (2048) levels. */
Test(msg, nesting_depth_is_bounded)
{
    char *p = dt_xmalloc(2 * 2049 + 8);
    dt_msg_t m;
    dt_emsg_t em = { .s = "" };
    size_t plen, n;
    uint8_t *f;

    /* {"a": then depth - 1 nested arrays */
    for (size_t depth = 2048; depth <= 2049; depth++) {
        memcpy(p, "{\"a\":", 5);
        plen = 5;
        for (size_t i = 1; i < depth; i++)
            p[plen++] = '[';
        for (size_t i = 1; i < depth; i++)
            p[plen++] = ']';
        p[plen++] = '}';
        f = ping(p, plen, &n);
        if (depth == 2048) {
            cr_assert_eq(dt_msg_decode(f, n, &m, &em), (int)n, "%s", em.s);
            dt_msg_clear(&m);
        } else {
            cr_assert_eq(dt_msg_decode(f, n, &m, &em), DT_EPROTO);
            cr_assert(strstr(em.s, "maximum parsing depth reached") != NULL, "%s", em.s);
        }
        free(f);
    }
    free(p);
}

/* ---- encoding limits ------------------------------------------------------------- */

/* {"s":"xxx...x"}: 8 bytes of syntax around the string */
static json_t *body_of_size(size_t payload)
{
    char *s = dt_xmalloc(payload - 8 + 1);
    json_t *b;

    memset(s, 'x', payload - 8);
    s[payload - 8] = '\0';
    b = json_pack("{s:s}", "s", s);
    free(s);
    cr_assert_not_null(b);
    return b;
}

Test(msg, encode_refuses_a_body_over_the_limit)
{
    json_t *at = body_of_size(DT_MSG_MAX);
    json_t *over = body_of_size(DT_MSG_MAX + 1);
    uint8_t sentinel = 0;
    uint8_t *f = &sentinel;
    size_t n = 1;
    dt_msg_t m;
    dt_emsg_t em = { .s = "" };

    cr_assert_eq(dt_msg_encode(DT_MSG_OK, 1, over, &f, &n), DT_ERANGE);
    cr_assert_null(f);
    cr_assert_eq(n, 0);

    /* Exactly DT_MSG_MAX bytes of payload is allowed both ways. */
    cr_assert_eq(dt_msg_encode(DT_MSG_OK, 1, at, &f, &n), 0);
    cr_assert_eq(n, DT_MSG_HDR + DT_MSG_MAX);
    cr_assert_eq(dt_msg_decode(f, n, &m, &em), (int)n, "%s", em.s);
    cr_assert(json_equal(m.body, at));
    dt_msg_clear(&m);
    cr_assert_eq(dt_msg_decode(f, n - 1, &m, NULL), 0);
    free(f);
    json_decref(over);
    json_decref(at);
}

Test(msg, encode_refuses_what_the_peer_would_refuse)
{
    json_t *arr = json_array();
    uint8_t *f;
    size_t n;

    cr_assert_eq(dt_msg_encode(3, 1, NULL, &f, &n), DT_EINVAL);
    cr_assert_null(f);
    cr_assert_eq(dt_msg_encode(DT_MSG_OK, 1, arr, &f, &n), DT_EINVAL);
    cr_assert_null(f);
    json_decref(arr);
}

/* ---- field access ------------------------------------------------------------ */

static void load(dt_msg_t *m, const char *json)
{
    size_t n;
    uint8_t *f = ping(json, strlen(json), &n);
    dt_emsg_t em = { .s = "" };

    cr_assert_eq(dt_msg_decode(f, n, m, &em), (int)n, "%s", em.s);
    free(f);
}

typedef int (*get_int_fn)(const dt_msg_t *, const char *, int64_t *, dt_emsg_t *);
typedef int (*get_str_fn)(const dt_msg_t *, const char *, const char **, dt_emsg_t *);

/* get(m, field) fails with DT_EPROTO and exactly want, leaving *out alone. */
static void int_refused(get_int_fn get, const dt_msg_t *m, const char *field, const char *want)
{
    dt_emsg_t em = { .s = "" };
    int64_t out = 17;

    cr_assert_eq(get(m, field, &out, &em), DT_EPROTO, "'%s' accepted", field);
    cr_assert_str_eq(em.s, want);
    cr_assert_eq(out, 17, "a failed getter wrote its output");
}

static void str_refused(get_str_fn get, const dt_msg_t *m, const char *field, const char *want)
{
    dt_emsg_t em = { .s = "" };
    const char *out = "unchanged";

    cr_assert_eq(get(m, field, &out, &em), DT_EPROTO, "'%s' accepted", field);
    cr_assert_str_eq(em.s, want);
    cr_assert_str_eq(out, "unchanged", "a failed getter wrote its output");
}

Test(msg, required_fields)
{
    dt_msg_t m;
    dt_emsg_t em = { .s = "" };
    int64_t i = 0;
    const char *s = NULL;

    load(&m, "{\"id\":42,\"neg\":-9007199254740993,\"name\":\"job-1\",\"real\":1.0,"
             "\"digits\":\"42\",\"none\":null,\"yes\":true}");
    cr_assert_eq(dt_msg_get_int(&m, "id", &i, &em), 0);
    cr_assert_eq(i, 42);
    cr_assert_eq(dt_msg_get_int(&m, "neg", &i, &em), 0);
    cr_assert_eq(i, INT64_C(-9007199254740993));
    cr_assert_eq(dt_msg_get_str(&m, "name", &s, &em), 0);
    cr_assert_str_eq(s, "job-1");

    int_refused(dt_msg_get_int, &m, "job", "missing field 'job'");
    int_refused(dt_msg_get_int, &m, "name", "field 'name' must be an integer");
    /* 1.0 is a real, "42" a string, null a value that is not an integer */
    int_refused(dt_msg_get_int, &m, "real", "field 'real' must be an integer");
    int_refused(dt_msg_get_int, &m, "digits", "field 'digits' must be an integer");
    int_refused(dt_msg_get_int, &m, "none", "field 'none' must be an integer");
    int_refused(dt_msg_get_int, &m, "yes", "field 'yes' must be an integer");
    str_refused(dt_msg_get_str, &m, "spec", "missing field 'spec'");
    str_refused(dt_msg_get_str, &m, "id", "field 'id' must be a string");
    str_refused(dt_msg_get_str, &m, "none", "field 'none' must be a string");
    dt_msg_clear(&m);
}

Test(msg, optional_fields)
{
    dt_msg_t m;
    dt_emsg_t em = { .s = "" };
    int64_t i = 5;
    const char *s = "default";
    int b = -1;

    load(&m, "{\"since\":12,\"reason\":\"user\",\"all\":false,\"yes\":true,\"n\":1}");
    /* absent: unchanged */
    cr_assert_eq(dt_msg_opt_int(&m, "gen", &i, &em), 0);
    cr_assert_eq(i, 5);
    cr_assert_eq(dt_msg_opt_str(&m, "why", &s, &em), 0);
    cr_assert_str_eq(s, "default");
    cr_assert_eq(dt_msg_opt_bool(&m, "quiet", &b, &em), 0);
    cr_assert_eq(b, -1);
    /* present */
    cr_assert_eq(dt_msg_opt_int(&m, "since", &i, &em), 0);
    cr_assert_eq(i, 12);
    cr_assert_eq(dt_msg_opt_str(&m, "reason", &s, &em), 0);
    cr_assert_str_eq(s, "user");
    cr_assert_eq(dt_msg_opt_bool(&m, "all", &b, &em), 0);
    cr_assert_eq(b, 0);
    cr_assert_eq(dt_msg_opt_bool(&m, "yes", &b, &em), 0);
    cr_assert_eq(b, 1);
    /* present with the wrong type */
    int_refused(dt_msg_opt_int, &m, "reason", "field 'reason' must be an integer");
    str_refused(dt_msg_opt_str, &m, "since", "field 'since' must be a string");
    b = -1;
    cr_assert_eq(dt_msg_opt_bool(&m, "n", &b, &em), DT_EPROTO); /* 1 is not true */
    cr_assert_str_eq(em.s, "field 'n' must be a boolean");
    cr_assert_eq(b, -1);
    dt_msg_clear(&m);
}

Test(msg, clear_is_safe_on_empty_messages)
{
    dt_msg_t m = { .type = 0, .id = 0, .body = NULL };
    dt_emsg_t em = { .s = "" };
    int64_t i;

    dt_msg_clear(&m);
    dt_msg_clear(NULL);
    cr_assert_eq(dt_msg_get_int(&m, "id", &i, &em), DT_EPROTO);
    cr_assert_str_eq(em.s, "missing field 'id'");
}

Test(msg, text_fields_refuse_control_characters)
{
    dt_msg_t m;
    dt_emsg_t em = { .s = "" };
    const char *s = "unchanged";

    load(&m, "{\"node\":\"n1\",\"esc\":\"\\u001b[2J\",\"nl\":\"a\\nfake event\","
             "\"long\":\"0123456789\",\"n\":3}");
    cr_assert_eq(dt_msg_get_text(&m, "node", 255, &s, &em), 0, "%s", em.s);
    cr_assert_str_eq(s, "n1");
    s = "unchanged";
    cr_assert_eq(dt_msg_get_text(&m, "esc", 255, &s, &em), DT_EINVAL);
    cr_assert_str_eq(em.s, "field 'esc': control character \\x1b at byte 0 (only printable text)");
    cr_assert_eq(dt_msg_opt_text(&m, "nl", 255, &s, &em), DT_EINVAL);
    cr_assert_str_eq(em.s, "field 'nl': control character \\x0a at byte 1 (only printable text)");
    cr_assert_eq(dt_msg_opt_text(&m, "long", 9, &s, &em), DT_EINVAL);
    cr_assert_str_eq(em.s, "field 'long': 10 bytes, more than 9");
    cr_assert_str_eq(s, "unchanged", "a failed getter wrote its output");
    cr_assert_eq(dt_msg_get_text(&m, "why", 9, &s, &em), DT_EPROTO);
    cr_assert_str_eq(em.s, "missing field 'why'");
    cr_assert_eq(dt_msg_opt_text(&m, "why", 9, &s, &em), 0);
    cr_assert_eq(dt_msg_opt_text(&m, "n", 9, &s, &em), DT_EPROTO);
    cr_assert_str_eq(em.s, "field 'n' must be a string");
    cr_assert_str_eq(s, "unchanged");
    dt_msg_clear(&m);
}

Test(msg, escape_strings_walks_the_whole_value)
{
    static const char *const keep[] = { "spec", NULL };
    json_t *v = json_loads("{\"name\":\"\\u001b[2J\",\"ok\":\"fine\",\"n\":1,"
                           "\"spec\":\"a = 1\\nb = \\u001b\\n\","
                           "\"list\":[{\"detail\":\"x\\ny\"},\"\\u009b\"]}", 0, NULL);
    cr_assert_not_null(v);
    dt_msg_escape_strings(v, keep);
    char *s = json_dumps(v, JSON_COMPACT | JSON_SORT_KEYS);
    cr_assert_str_eq(s, "{\"list\":[{\"detail\":\"x\\\\ny\"},\"\\\\u009b\"],\"n\":1,"
                        "\"name\":\"\\\\x1b[2J\",\"ok\":\"fine\",\"spec\":\"a = 1\\nb = \\\\x1b\\n\"}");
    free(s);
    json_decref(v);
}
