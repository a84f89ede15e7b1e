/* SPDX-License-Identifier: MIT
 *
 * Frames of the dt protocol (proto.h, msg.h): the header codec, a pure
 * decoder over whatever bytes have arrived, the encoder, and the field
 * getters handlers use. The decoder checks magic, version, type and length
 * before it allocates anything, then asks jansson for exactly one JSON object
 * of exactly len bytes: no trailing bytes, no duplicate keys, valid UTF-8, no
 * NUL in strings, nesting at most JSON_PARSER_MAX_DEPTH (2048 in jansson
 * 2.14). An empty payload is {}. Error messages quote the peer's bytes only
 * after escaping them, so a hostile frame cannot put control characters in
 * a log line.
 *
 * Not here: sockets, buffering, authentication, dispatch.
 */
#include "config.h"

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/mem.h"
#include "common/msg.h"
#include "common/text.h"

/* Payloads are parsed strictly: no JSON_DISABLE_EOF_CHECK (trailing bytes
 * are an error), no JSON_DECODE_ANY (the top level is an object or an array;
 * arrays are refused below), no JSON_ALLOW_NUL. */
#define LOAD_FLAGS JSON_REJECT_DUPLICATES
#define DUMP_FLAGS JSON_COMPACT

const char *dt_msg_type_name(uint16_t type)
{
    switch (type) {
#define DT_MSG_NAME(name, value, dir, payload) \
    case DT_MSG_##name:                        \
        return #name;
        DT_MSG_TYPES(DT_MSG_NAME)
#undef DT_MSG_NAME
    }
    return NULL;
}

static uint32_t get_u32(const uint8_t *p)
{
    return (uint32_t)p[0] << 24 | (uint32_t)p[1] << 16 | (uint32_t)p[2] << 8 | (uint32_t)p[3];
}

static uint16_t get_u16(const uint8_t *p)
{
    return (uint16_t)((unsigned)p[0] << 8 | (unsigned)p[1]);
}

static void put_u32(uint8_t *p, uint32_t v)
{
    p[0] = (uint8_t)(v >> 24);
    p[1] = (uint8_t)(v >> 16);
    p[2] = (uint8_t)(v >> 8);
    p[3] = (uint8_t)v;
}

static void put_u16(uint8_t *p, uint16_t v)
{
    p[0] = (uint8_t)(v >> 8);
    p[1] = (uint8_t)v;
}

int dt_msg_peek(const uint8_t *buf, size_t n, size_t *need, dt_emsg_t *em)
{
    uint32_t magic, len;
    uint16_t version, type;

    if (n < DT_MSG_HDR)
        return 1;
    magic = get_u32(buf);
    version = get_u16(buf + 4);
    type = get_u16(buf + 6);
    len = get_u32(buf + 12);
    if (magic != DT_PROTO_MAGIC)
        return dt_emsg_set(em, DT_EPROTO, "bad magic 0x%08x, expected 0x%08x (\"DTP1\")",
                           (unsigned)magic, (unsigned)DT_PROTO_MAGIC);
    if (version != DT_PROTO_VERSION)
        return dt_emsg_set(em, DT_EPROTO, "protocol version %u, this build speaks %d",
                           (unsigned)version, DT_PROTO_VERSION);
    if (dt_msg_type_name(type) == NULL)
        return dt_emsg_set(em, DT_EPROTO, "unknown message type %u", (unsigned)type);
    /* len is the payload: the limit is DT_MSG_MAX bytes of JSON, whatever
     * the header adds. */
    if (len > DT_MSG_MAX)
        return dt_emsg_set(em, DT_EPROTO, "frame of %u bytes exceeds the %u MiB limit",
                           (unsigned)len, (unsigned)(DT_MSG_MAX >> 20));
    *need = (size_t)DT_MSG_HDR + len;
    return 0;
}

/* Copy jansson's error text into dst, escaping every byte that is not
 * printable ASCII: its "near '...'" part quotes the peer's bytes. */
static void sanitise(char *dst, size_t size, const char *src)
{
    static const char hex[] = "0123456789abcdef";
    size_t o = 0;

    for (; *src != '\0'; src++) {
        unsigned char c = (unsigned char)*src;

        if (c >= 0x20 && c < 0x7f) {
            if (o + 1 >= size)
                break;
            dst[o++] = (char)c;
        } else {
            if (o + 4 >= size)
                break;
            dst[o++] = '\\';
            dst[o++] = 'x';
            dst[o++] = hex[c >> 4];
            dst[o++] = hex[c & 15];
        }
    }
    dst[o] = '\0';
}

int dt_msg_decode(const uint8_t *buf, size_t n, dt_msg_t *out, dt_emsg_t *em)
{
    json_error_t jerr;
    json_t *body;
    size_t need;
    uint32_t len;
    int rc;

    memset(out, 0, sizeof(*out));
    rc = dt_msg_peek(buf, n, &need, em);
    if (rc != 0)
        return rc < 0 ? rc : 0;
    if (n < need)
        return 0;

    /* The header is valid and the whole payload is here: only now allocate. */
    len = get_u32(buf + 12);
    if (len == 0) {
        body = json_object();
    } else {
        body = json_loadb((const char *)buf + DT_MSG_HDR, len, LOAD_FLAGS, &jerr);
        if (body == NULL) {
            char text[4 * JSON_ERROR_TEXT_LENGTH];

            sanitise(text, sizeof(text), jerr.text);
            return dt_emsg_set(em, DT_EPROTO, "payload is not a JSON object: %s at byte %d", text,
                               jerr.position);
        }
        if (!json_is_object(body)) {
            json_decref(body);
            return dt_emsg_set(em, DT_EPROTO,
                               "payload is not a JSON object: top-level value is an array "
                               "at byte 0");
        }
    }
    if (body == NULL)
        abort(); /* json_object() fails only when memory is exhausted */
    out->type = get_u16(buf + 6);
    out->id = get_u32(buf + 8);
    out->body = body;
    return (int)need;
}

/* body must be NULL or an object and type must be in the table: anything
 * else is the caller's bug, refused with DT_EINVAL rather than put on the
 * wire where the peer would refuse it. */
int dt_msg_encode(uint16_t type, uint32_t id, const json_t *body, uint8_t **out, size_t *len)
{
    size_t plen;
    uint8_t *frame;

    *out = NULL;
    *len = 0;
    if (dt_msg_type_name(type) == NULL || (body != NULL && !json_is_object(body)))
        return DT_EINVAL;
    /* The first pass sizes the payload without allocating, so an over-limit
     * body costs a walk, not 16 MiB. */
    plen = body != NULL ? json_dumpb(body, NULL, 0, DUMP_FLAGS) : 2;
    if (plen == 0)
        return DT_EINVAL;
    if (plen > DT_MSG_MAX)
        return DT_ERANGE;
    frame = dt_xmalloc(DT_MSG_HDR + plen);
    put_u32(frame, DT_PROTO_MAGIC);
    put_u16(frame + 4, DT_PROTO_VERSION);
    put_u16(frame + 6, type);
    put_u32(frame + 8, id);
    put_u32(frame + 12, (uint32_t)plen);
    if (body == NULL) {
        memcpy(frame + DT_MSG_HDR, "{}", 2);
    } else if (json_dumpb(body, (char *)frame + DT_MSG_HDR, plen, DUMP_FLAGS) != plen) {
        free(frame);
        return DT_EINVAL;
    }
    *out = frame;
    *len = DT_MSG_HDR + plen;
    return 0;
}

void dt_msg_clear(dt_msg_t *m)
{
    if (m == NULL)
        return;
    json_decref(m->body);
    memset(m, 0, sizeof(*m));
}

/* ---- field access ------------------------------------------------------- */

/* The field's value, NULL when absent (or when the message has no body). */
static json_t *field(const dt_msg_t *m, const char *name)
{
    return m->body != NULL ? json_object_get(m->body, name) : NULL;
}

static int missing(const char *name, dt_emsg_t *em)
{
    return dt_emsg_set(em, DT_EPROTO, "missing field '%s'", name);
}

static int mistyped(const char *name, const char *what, dt_emsg_t *em)
{
    return dt_emsg_set(em, DT_EPROTO, "field '%s' must be %s", name, what);
}

int dt_msg_opt_int(const dt_msg_t *m, const char *name, int64_t *out, dt_emsg_t *em)
{
    json_t *v = field(m, name);

    if (v == NULL)
        return 0;
    if (!json_is_integer(v))
        return mistyped(name, "an integer", em);
    *out = (int64_t)json_integer_value(v);
    return 0;
}

int dt_msg_opt_str(const dt_msg_t *m, const char *name, const char **out, dt_emsg_t *em)
{
    json_t *v = field(m, name);

    if (v == NULL)
        return 0;
    if (!json_is_string(v))
        return mistyped(name, "a string", em);
    *out = json_string_value(v);
    return 0;
}

int dt_msg_opt_bool(const dt_msg_t *m, const char *name, int *out, dt_emsg_t *em)
{
    json_t *v = field(m, name);

    if (v == NULL)
        return 0;
    if (!json_is_boolean(v))
        return mistyped(name, "a boolean", em);
    *out = json_is_true(v);
    return 0;
}

int dt_msg_get_int(const dt_msg_t *m, const char *name, int64_t *out, dt_emsg_t *em)
{
    if (field(m, name) == NULL)
        return missing(name, em);
    return dt_msg_opt_int(m, name, out, em);
}

int dt_msg_get_str(const dt_msg_t *m, const char *name, const char **out, dt_emsg_t *em)
{
    if (field(m, name) == NULL)
        return missing(name, em);
    return dt_msg_opt_str(m, name, out, em);
}

int dt_msg_opt_text(const dt_msg_t *m, const char *name, size_t max, const char **out,
                    dt_emsg_t *em)
{
    const char *s = NULL;
    char what[80];
    int rc;

    if ((rc = dt_msg_opt_str(m, name, &s, em)) < 0 || s == NULL)
        return rc;
    snprintf(what, sizeof(what), "field '%s'", name);
    if ((rc = dt_text_check(what, s, max, em)) < 0)
        return rc;
    *out = s;
    return 0;
}

int dt_msg_get_text(const dt_msg_t *m, const char *name, size_t max, const char **out,
                    dt_emsg_t *em)
{
    if (field(m, name) == NULL)
        return missing(name, em);
    return dt_msg_opt_text(m, name, max, out, em);
}

/* One value: a string escaped in place (jansson keeps the object's slot),
 * containers walked. */
static void escape_value(json_t *v, int flags, const char *const *keep_lines)
{
    const char *key;
    json_t *x;
    size_t i;

    if (json_is_string(v)) {
        if (dt_text_needs_escape(json_string_value(v), flags)) {
            char *e = dt_text_escape(json_string_value(v), flags);
            json_string_set(v, e);
            free(e);
        }
    } else if (json_is_object(v)) {
        json_object_foreach(v, key, x) {
            int f = 0;
            for (size_t k = 0; keep_lines && keep_lines[k]; k++)
                if (strcmp(keep_lines[k], key) == 0)
                    f = DT_TEXT_KEEP_LINES;
            escape_value(x, f, keep_lines);
        }
    } else if (json_is_array(v)) {
        json_array_foreach(v, i, x)
            escape_value(x, 0, keep_lines);
    }
}

void dt_msg_escape_strings(json_t *v, const char *const *keep_lines)
{
    escape_value(v, 0, keep_lines);
}
