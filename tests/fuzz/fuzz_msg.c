/* SPDX-License-Identifier: MIT
 *
 * libFuzzer target for the frame decoder (common/msg). The input is a byte
 * stream as a peer might send it. It is decoded three ways: whole, split in
 * two at a point derived from the data (each part in an exact-size heap
 * buffer, so a read past n is a read past the allocation), and one byte at
 * a time; all three must yield the same frames and end the same way. Every
 * frame decoded is re-encoded, and the new frame must decode to the same
 * type, id and JSON (json_equal) and re-encode to the same bytes. Any
 * inconsistency aborts; every message is cleared, so a leak is a finding.
 *
 * Every frame's body also goes through every typed decoder (common/wire.h),
 * as a peer could send any body under any type: each must answer 0, 1 (a
 * lenient field read as its default) or an error naming a field, and what
 * it decoded must re-encode to a body that decodes to the same encoding
 * (decode then encode is a fixed point after one round).
 *
 * Not a test of the JSON parser itself, nor of the sockets around it. Built
 * with clang -fsanitize=fuzzer by `make fuzz`, and as a replay program over
 * the corpus (replay.c) everywhere else.
 */
#include "config.h"

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/mem.h"
#include "common/msg.h"
#include "common/wire.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

/* How one decoding of the input went: the frames' lengths, then how it
 * stopped. */
struct outcome {
    size_t nframes;
    uint64_t lens; /* a hash of the frame lengths, in order */
    size_t used;   /* bytes consumed by whole frames */
    int last;      /* 0: needs more bytes (or none are left); DT_EPROTO */
};

#define CHECK(cond)                                                                            \
    do {                                                                                       \
        if (!(cond)) {                                                                         \
            fprintf(stderr, "fuzz_msg: %s:%d: check failed: %s\n", __FILE__, __LINE__, #cond); \
            abort();                                                                           \
        }                                                                                      \
    } while (0)

/* The getters on whatever the body holds: they must not crash, and must
 * answer 0 or DT_EPROTO with a message. */
static void poke_fields(const dt_msg_t *m)
{
    static const char *const names[] = { "id", "code", "error", "all", "cred", "spec" };
    dt_emsg_t em;

    for (size_t i = 0; i < sizeof(names) / sizeof(names[0]); i++) {
        int64_t v = 0;
        const char *s = NULL;
        int b = 0, rc;

        em.s[0] = '\0';
        rc = dt_msg_get_int(m, names[i], &v, &em);
        CHECK(rc == 0 || (rc == DT_EPROTO && em.s[0] != '\0'));
        rc = dt_msg_get_str(m, names[i], &s, &em);
        CHECK(rc == 0 ? s != NULL : rc == DT_EPROTO);
        rc = dt_msg_opt_int(m, names[i], &v, &em);
        CHECK(rc == 0 || rc == DT_EPROTO);
        rc = dt_msg_opt_str(m, names[i], &s, &em);
        CHECK(rc == 0 || rc == DT_EPROTO);
        rc = dt_msg_opt_bool(m, names[i], &b, &em);
        CHECK(rc == 0 || rc == DT_EPROTO);
        CHECK(b == 0 || b == 1);
    }
}

/* Every typed decoder on m's body. */
static void poke_wire(const dt_msg_t *m)
{
    const dt_wire_schema_t *s;

    for (size_t i = 0; (s = dt_wire_schema_at(i)) != NULL; i++) {
        size_t size = dt_wire_schema_size(s);
        void *v = dt_xcalloc(1, size), *w = dt_xcalloc(1, size);
        dt_emsg_t em = { "" };
        int rc = dt_wire_decode(s, m->body, v, &em);

        CHECK(rc == 0 || rc == 1 || rc == DT_EPROTO || rc == DT_EINVAL);
        CHECK(rc == 0 || em.s[0] != '\0');
        if (rc >= 0) {
            json_t *once = dt_wire_encode(s, v);
            CHECK(json_is_object(once));
            em.s[0] = '\0';
            rc = dt_wire_decode(s, once, w, &em);
            if (rc < 0) {
                fprintf(stderr, "fuzz_msg: %s: its own encoding refused: %s\n",
                        dt_wire_schema_name(s), em.s);
                abort();
            }
            json_t *twice = dt_wire_encode(s, w);
            CHECK(json_equal(once, twice));
            json_decref(twice);
            json_decref(once);
            dt_wire_clear(s, w);
        }
        dt_wire_clear(s, v);
        free(w);
        free(v);
    }
}

/* m came out of the decoder: re-encode it and check that the new frame
 * says the same thing and is a fixed point of decode then encode. */
static void check_round_trip(const dt_msg_t *m, size_t frame_len)
{
    dt_msg_t again;
    dt_emsg_t em;
    uint8_t *f, *g;
    size_t n, n2;
    int rc;

    CHECK(dt_msg_type_name(m->type) != NULL);
    CHECK(json_is_object(m->body));
    poke_fields(m);
    poke_wire(m);

    rc = dt_msg_encode(m->type, m->id, m->body, &f, &n);
    if (rc == DT_ERANGE) {
        /* Compact output can outgrow the input ("1e5" is "100000.0"), but
         * only for a frame near the limit. */
        CHECK(frame_len > DT_MSG_MAX / 8);
        return;
    }
    CHECK(rc == 0);
    CHECK(n >= DT_MSG_HDR + 2 && n <= DT_MSG_HDR + DT_MSG_MAX);

    CHECK(dt_msg_decode(f, n - 1, &again, &em) == 0);
    CHECK(again.body == NULL);
    rc = dt_msg_decode(f, n, &again, &em);
    if (rc != (int)n) {
        fprintf(stderr, "fuzz_msg: re-encoded frame refused (%d): %s\n", rc, em.s);
        abort();
    }
    CHECK(again.type == m->type);
    CHECK(again.id == m->id);
    CHECK(json_equal(again.body, m->body));

    CHECK(dt_msg_encode(again.type, again.id, again.body, &g, &n2) == 0);
    CHECK(n2 == n && memcmp(f, g, n) == 0);
    free(g);
    dt_msg_clear(&again);
    free(f);
}

/* Decode whole frames from buf[*off..n), appending to o. Returns 1 while
 * the stream is still good (the rest may be an incomplete frame), 0 once
 * it has failed. */
static int decode_some(const uint8_t *buf, size_t n, size_t *off, struct outcome *o)
{
    for (;;) {
        dt_msg_t m;
        dt_emsg_t em;
        size_t need;
        int rc;

        em.s[0] = '\0';
        rc = dt_msg_decode(buf + *off, n - *off, &m, &em);
        if (rc < 0) {
            CHECK(rc == DT_EPROTO);
            CHECK(em.s[0] != '\0');
            CHECK(m.body == NULL);
            o->last = rc;
            return 0;
        }
        if (rc == 0) {
            CHECK(m.body == NULL);
            /* "need more" agrees with peek */
            rc = dt_msg_peek(buf + *off, n - *off, &need, NULL);
            CHECK(rc == 1 ? n - *off < DT_MSG_HDR : rc == 0 && need > n - *off);
            o->last = 0;
            return 1;
        }
        CHECK((size_t)rc <= n - *off && rc >= DT_MSG_HDR);
        CHECK(dt_msg_peek(buf + *off, n - *off, &need, NULL) == 0 && need == (size_t)rc);
        check_round_trip(&m, (size_t)rc);
        dt_msg_clear(&m);
        o->nframes++;
        o->lens = o->lens * 0x100000001b3ull + (uint64_t)rc;
        o->used += (size_t)rc;
        *off += (size_t)rc;
    }
}

static void same(const struct outcome *a, const struct outcome *b)
{
    CHECK(a->nframes == b->nframes);
    CHECK(a->lens == b->lens);
    CHECK(a->used == b->used);
    CHECK(a->last == b->last);
}

/* The input in two arrivals, k bytes then the rest, each in a buffer of
 * exactly the bytes held, as a connection's receive buffer would be. */
static void decode_split(const uint8_t *data, size_t size, size_t k, struct outcome *o)
{
    uint8_t *buf = dt_xmalloc(k > 0 ? k : 1);
    size_t off = 0, rest, n2;

    if (k > 0)
        memcpy(buf, data, k);
    if (decode_some(buf, k, &off, o)) {
        rest = k - off;
        n2 = rest + (size - k);
        memmove(buf, buf + off, rest);
        buf = dt_xrealloc(buf, n2 > 0 ? n2 : 1);
        if (size > k)
            memcpy(buf + rest, data + k, size - k);
        off = 0;
        decode_some(buf, n2, &off, o);
    }
    free(buf);
}

/* One byte at a time: each frame appears exactly when its last byte does. */
static void decode_bytewise(const uint8_t *data, size_t size, struct outcome *o)
{
    size_t off = 0;

    for (size_t have = 0; have <= size; have++) {
        size_t before = o->nframes;

        if (!decode_some(data, have, &off, o))
            return;
        /* at most one frame can complete per byte, and only on its last */
        CHECK(o->nframes - before <= 1);
        CHECK(o->nframes == before || off == have);
    }
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    struct outcome whole = { 0 }, split = { 0 }, bytewise = { 0 };
    size_t off = 0, k;

    decode_some(data, size, &off, &whole);

    /* a split point that depends on the data, anywhere in [0, size] */
    k = 0;
    for (size_t i = 0; i < size && i < 8; i++)
        k = k * 131 + data[size - 1 - i];
    k = size > 0 ? k % (size + 1) : 0;
    decode_split(data, size, k, &split);
    same(&whole, &split);

    decode_bytewise(data, size, &bytewise);
    same(&whole, &bytewise);
    return 0;
}
