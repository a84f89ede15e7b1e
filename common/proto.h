/* SPDX-License-Identifier: MIT
 *
 * The dt wire protocol: every message between dtctl, dtcoordd and dtagentd,
 * in one table, with the protocol version. A frame is a 16-byte header in
 * network byte order followed by a payload that is one JSON object (UTF-8):
 *
 *   0  magic    u32  'D' 'T' 'P' '1' (0x44545031)
 *   4  version  u16  DT_PROTO_VERSION
 *   6  type     u16  enum dt_msg_type
 *   8  id       u32  request id chosen by the sender; a reply echoes it
 *  12  len      u32  payload bytes, at most DT_MSG_MAX
 *
 * A request gets exactly one reply: DT_MSG_OK with a result object, or
 * DT_MSG_ERROR with {"code": <dt error code>, "error": "<message>"}.
 * Over TCP every request but AUTH and PING needs a preceding successful
 * DT_MSG_AUTH carrying a munge credential (anything else first closes the
 * connection); over the Unix socket the peer is identified by SO_PEERCRED.
 *
 * The payload fields of each type are listed beside it. Unknown fields are
 * ignored (a newer peer may add some); missing required fields are an error
 * naming the field.
 */
#ifndef DT_PROTO_H
#define DT_PROTO_H

#include <stdint.h>

#define DT_PROTO_MAGIC 0x44545031u /* "DTP1" */
#define DT_PROTO_VERSION 1
#define DT_MSG_HDR 16
#define DT_MSG_MAX (16u << 20) /* payload cap, checked before any allocation */

/* X(name, value, direction, payload) */
#define DT_MSG_TYPES(X)                                                              \
    /* replies */                                                                    \
    X(OK, 1, "reply", "result object (per request)")                                 \
    X(ERROR, 2, "reply", "{code, error}")                                            \
    /* any peer */                                                                   \
    X(AUTH, 10, "client", "{cred}: munge credential, first frame over TCP")          \
    X(PING, 11, "client", "{} -> {version, server, uptime_s}")                               \
    /* dtctl */                                                                      \
    X(SUBMIT, 20, "dtctl", "{spec} -> {id, state, plan}")                            \
    X(LIST, 21, "dtctl", "{} -> {jobs: [...]} (own jobs; admins all)")                                  \
    X(SHOW, 22, "dtctl", "{id} -> {job, spec, plan, agents, progress}")                              \
    X(CANCEL, 23, "dtctl", "{id, reason?} -> {id, state}")                           \
    X(EVENTS, 24, "dtctl", "{id, since?} -> {events: [...]}")                        \
    X(CHECKPOINTS, 25, "dtctl", "{id} -> {checkpoints: [...]}")                      \
    /* dtagentd */                                                                   \
    X(REGISTER, 40, "agent", "{job, node, slots} -> {agent, heartbeat_ms}")          \
    X(HEARTBEAT, 41, "agent", "{agent} -> {}")                                       \
    X(PROGRESS, 42, "agent", "{agent, gen, rank, step, tokens, loss} -> {}")         \
    X(WORKER_EXIT, 43, "agent", "{agent, gen, rank, status, signal} -> {}")          \
    X(SHARD_WRITTEN, 44, "agent", "{agent, step, rank, path, bytes, sha256} -> {}")

enum dt_msg_type {
#define DT_MSG_ENUM(name, value, dir, payload) DT_MSG_##name = (value),
    DT_MSG_TYPES(DT_MSG_ENUM)
#undef DT_MSG_ENUM
};

/* "SUBMIT" etc., or NULL for a value not in the table. */
const char *dt_msg_type_name(uint16_t type);

#endif /* DT_PROTO_H */
