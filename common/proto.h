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
 * Pushed messages (dtcoordd to a registered dtagentd, and both directions
 * of the worker channel between dtagentd and its dtengine workers) carry
 * id 0 and get no reply. The worker channel is a Unix stream socket the
 * agent hands each worker as the descriptor named by DT_AGENT_FD; see
 * dtagentd(8) and engine/wlink.h.
 *
 * The payload fields of each type are listed beside it, in brief; each
 * payload is a C struct in wire.h, and its table in wire.c (types, which
 * are required, ranges, caps) is the schema that every encoder and decoder
 * uses. Unknown fields are ignored (a newer peer may add some); missing
 * required fields are an error naming the field.
 */
#ifndef DT_PROTO_H
#define DT_PROTO_H

#include <stdint.h>

#define DT_PROTO_MAGIC 0x44545031u /* "DTP1" */
#define DT_PROTO_VERSION 1
#define DT_MSG_HDR 16
#define DT_MSG_MAX (16u << 20) /* payload cap, checked before any allocation */

#include "common/exitcodes.h" /* DT_EXIT_*: the statuses the coordinator acts on */

/* X(name, value, direction, payload) */
#define DT_MSG_TYPES(X)                                                              \
    /* replies */                                                                    \
    X(OK, 1, "reply", "result object (per request)")                                 \
    X(ERROR, 2, "reply", "{code, error}")                                            \
    /* any peer */                                                                   \
    X(AUTH, 10, "client", "{cred}: munge credential, first frame over TCP")          \
    X(PING, 11, "client", "{} -> {version, server, uptime_s}")                               \
    /* dtctl */                                                                      \
    X(SUBMIT, 20, "dtctl", "{spec, name?, dry_run?} -> {id, state, plan} or {plan, script, slurm}")                            \
    X(LIST, 21, "dtctl", "{} -> {jobs: [...]} (own jobs; admins all)")                                  \
    X(SHOW, 22, "dtctl", "{id} -> {job, spec, plan, agents, progress}")                              \
    X(CANCEL, 23, "dtctl", "{id, reason?, checkpoint?} -> {id, state, stopping?}")   \
    X(EVENTS, 24, "dtctl", "{id, since?} -> {events: [...]}")                        \
    X(CHECKPOINTS, 25, "dtctl", "{id} -> {checkpoints: [...]}")                      \
    /* dtagentd */                                                                   \
    X(REGISTER, 40, "agent", "{job, node, slots, pid?, gen?, slurm_id?, slurm_restart?} -> {agent, heartbeat_ms}")          \
    X(HEARTBEAT, 41, "agent", "{agent} -> {}")                                       \
    X(PROGRESS, 42, "agent", "{agent, gen, rank, step, tokens, loss} -> {}")         \
    X(WORKER_EXIT, 43, "agent", "{agent, gen, rank, status, signal} -> {}")          \
    X(SHARD_WRITTEN, 44, "agent", "{agent, gen, step, rank, path, bytes, sha256, dir, "   \
                                  "manifest?, shards?} -> {}; shards: the manifest's "  \
                                  "sha256 per rank, as the agent read it")             \
    X(FENCE, 45, "agent", "{agent, gen, seq, data (base64)} -> {}; FENCE_DONE follows")  \
    X(GEN_ENDED, 46, "agent", "{agent, gen}: no worker of gen is left here -> {}")    \
    X(CHECKPOINT, 26, "dtctl", "{id} -> {id, gen}: checkpoint at the next step")     \
    X(RESUME, 27, "dtctl", "{id} -> {id, state, step}: a failed or cancelled job again, "  \
                           "from its newest committed checkpoint")                     \
    X(HISTORY, 28, "dtctl", "{id} -> {job, steps, failures, generations, checkpoints, "    \
                            "goodput, left_out}: what dtctl plot draws (capped lists)") \
    X(PREEMPT, 47, "agent", "{agent, signal}: Slurm's warning signal arrived -> {}")     \
    X(CKPT_DONE, 48, "agent", "{agent, op, step, ok, error?}: a CKPT_COMMIT or "          \
                              "CKPT_PRUNE was carried out (ok) or failed -> {}")      \
    X(MEM_CKPT, 49, "agent", "{agent, gen, rank, step, bytes, sha256, replica?, error?}: "  \
                             "the agent holds the rank's in-memory checkpoint of step " \
                             "(its own, or a replica); error: its replica could not "   \
                             "be sent -> {}")                                          \
    /* dtcoordd -> dtagentd, pushed (id 0, no reply) */                              \
    X(GEN_START, 50, "coord", "{job, gen, nspace, ranks, nodes, procs, spec, argv, "   \
                              "resume?, mem_resume?}: run these ranks (mem_resume: "   \
                              "the step of the in-memory checkpoints they start from)") \
    X(GEN_ABORT, 51, "coord", "{gen, reason}: notify, grace, kill the workers")        \
    X(FENCE_DONE, 52, "coord", "{gen, seq, data (base64), status}")                    \
    X(CKPT_REQUEST, 53, "coord", "{gen}: ask the workers for a checkpoint")            \
    X(STOP, 54, "coord", "{gen, checkpoint}: stop the workers at a step boundary")      \
    X(JOB_END, 55, "coord", "{job, state}: the job is over (or requeued: exit 75)")       \
    X(CKPT_COMMIT, 56, "coord", "{dir, step}: write the step's COMMITTED marker, as the "  \
                                "job's owner; CKPT_DONE follows")                     \
    X(CKPT_PRUNE, 57, "coord", "{dir, steps, set_aside?}: delete these step "             \
                               "directories (or rename them step-N.TAG), as the job's " \
                               "owner; CKPT_DONE follows")                            \
    /* dtengine -> dtagentd over the worker channel (DT_AGENT_FD), id 0 */           \
    X(W_HELLO, 60, "worker", "{rank, pid}")                                            \
    X(W_PROGRESS, 61, "worker", "{rank, step, steps, tokens, loss, tokens_s, acc}")    \
    X(W_HEARTBEAT, 62, "worker", "{rank}: alive in a long phase")                      \
    X(W_SHARD, 63, "worker", "{rank, step, dir, path, bytes, sha256, manifest?}")      \
    X(W_RESULT, 64, "worker", "{rank, steps, loss, acc, checksum, outputs}: rank 0, at the end")  \
    X(W_MEMCKPT, 65, "worker", "{rank, step, slot, bytes, sha256}: an in-memory checkpoint "  \
                               "written into slot 0 or 1 of DT_MEM_CKPT")              \
    /* dtagentd <-> dtagentd, the peer channel (AUTH first), id 0 */                  \
    X(PEER_REPLICA, 80, "agent", "{job, rank, step, bytes, sha256}, then that many raw "   \
                                 "bytes: rank's in-memory checkpoint of step, to hold or " \
                                 "as PEER_FETCH's answer")                             \
    X(PEER_FETCH, 81, "agent", "{job, rank, step}: PEER_REPLICA of rank's copy of step "   \
                               "follows, or ERROR")                                   \
    /* dtagentd -> dtengine over the worker channel */                               \
    X(W_CHECKPOINT, 70, "agent", "{}: write a checkpoint at the next step boundary")  \
    X(W_STOP, 71, "agent", "{checkpoint}: stop at the next step boundary, exit 3")

enum dt_msg_type {
#define DT_MSG_ENUM(name, value, dir, payload) DT_MSG_##name = (value),
    DT_MSG_TYPES(DT_MSG_ENUM)
#undef DT_MSG_ENUM
};

/* "SUBMIT" etc., or NULL for a value not in the table. */
const char *dt_msg_type_name(uint16_t type);

#endif /* DT_PROTO_H */
