/* SPDX-License-Identifier: MIT
 *
 * Frames of the dt protocol (proto.h): encoding, and a pure decoder that
 * works on whatever bytes have arrived so far. The decoder allocates only
 * after the header has been checked (magic, version, known type, length at
 * most DT_MSG_MAX), and the payload must parse as one JSON object.
 *
 * Not here: sockets (conn, client), authentication, dispatch.
 */
#ifndef DT_MSG_H
#define DT_MSG_H

#include <stddef.h>
#include <stdint.h>

#include <jansson.h>

#include "common/err.h"
#include "common/macros.h"
#include "common/proto.h"

typedef struct dt_msg {
    uint16_t type;
    uint32_t id;
    json_t *body; /* a JSON object; owned by the message */
} dt_msg_t;

/* Decode one frame from buf[0..n). Returns the number of bytes the frame
 * used (> 0) and fills out (the caller releases it with dt_msg_clear), 0
 * when more bytes are needed, or DT_EPROTO with a message saying what was
 * wrong (bad magic, version, unknown type, oversize length, payload not a
 * JSON object). On DT_EPROTO the stream cannot be resynchronised: close it.
 * Never reads past n, never allocates before the header is validated.
 * *out is zeroed on every call, so dt_msg_clear on it is always safe. */
DT_MUST_CHECK int dt_msg_decode(const uint8_t *buf, size_t n, dt_msg_t *out, dt_emsg_t *em);

/* Header only: 0 and the frame's total size (header + payload) in *need
 * once DT_MSG_HDR bytes are present and valid, 1 when fewer than DT_MSG_HDR
 * bytes are present, DT_EPROTO otherwise. */
DT_MUST_CHECK int dt_msg_peek(const uint8_t *buf, size_t n, size_t *need, dt_emsg_t *em);

/* Encode a frame into a new buffer (the caller frees it); body may be NULL
 * for {}. Returns 0, DT_ERANGE when the payload exceeds DT_MSG_MAX, or
 * DT_EINVAL for a type not in the table or a body that is not an object. */
DT_MUST_CHECK int dt_msg_encode(uint16_t type, uint32_t id, const json_t *body, uint8_t **out,
                                size_t *len);

/* Release the body and zero the message. */
void dt_msg_clear(dt_msg_t *m);

/* Field access for handlers: each returns 0, or DT_EPROTO with a message
 * naming the missing or mistyped field. Results must be checked (also of
 * the optional ones: a mistyped field is the peer's error to log or refuse,
 * never to pass over in silence). */
DT_MUST_CHECK int dt_msg_get_int(const dt_msg_t *m, const char *field, int64_t *out, dt_emsg_t *em);
DT_MUST_CHECK int dt_msg_get_str(const dt_msg_t *m, const char *field, const char **out,
                                 dt_emsg_t *em);
/* Optional fields: leave *out unchanged when absent; a present field of
 * the wrong type (JSON null included) is still DT_EPROTO. */
DT_MUST_CHECK int dt_msg_opt_int(const dt_msg_t *m, const char *field, int64_t *out, dt_emsg_t *em);
DT_MUST_CHECK int dt_msg_opt_str(const dt_msg_t *m, const char *field, const char **out,
                                 dt_emsg_t *em);
DT_MUST_CHECK int dt_msg_opt_bool(const dt_msg_t *m, const char *field, int *out, dt_emsg_t *em);

/* Text that is stored or shown (names, reasons, error texts): a string
 * field that must also pass dt_text_check (printable UTF-8 of at most max
 * bytes; max 0: no bound). DT_EPROTO for a missing or mistyped field,
 * DT_EINVAL naming the field and what is wrong in it otherwise. */
DT_MUST_CHECK int dt_msg_get_text(const dt_msg_t *m, const char *field, size_t max,
                                  const char **out, dt_emsg_t *em);
DT_MUST_CHECK int dt_msg_opt_text(const dt_msg_t *m, const char *field, size_t max,
                                  const char **out, dt_emsg_t *em);

/* Replace every string in v (in objects and arrays, recursively) that
 * dt_text_escape would change by its escaped form, for text that came from
 * elsewhere and is about to be stored or shown. Strings under a key listed
 * in keep_lines (NULL-terminated; the list may be NULL) keep their newlines
 * and tabs. Object keys are left as they are. */
void dt_msg_escape_strings(json_t *v, const char *const *keep_lines);

#endif /* DT_MSG_H */
