/* SPDX-License-Identifier: MIT
 *
 * The payload of every protocol message (proto.h) as a C struct, with one
 * encoder and one decoder that both sides use: the schema of a message is
 * its table in wire.c, not a json_pack format string at each call site.
 *
 *   json_t *dt_wire_NAME_encode(const dt_wire_NAME_t *v);
 *       A new object (never NULL). A required field is always written, and
 *       so are the optional ones the table marks F_OUT (what peers have
 *       always sent); another optional one is left out when it holds its
 *       default (an integer equal to the default, false, NULL, an empty
 *       list). A real number that is not finite goes out as null: JSON has
 *       no NaN. A string that is not valid UTF-8 goes out escaped
 *       (dt_text_escape).
 *   int dt_wire_NAME_decode(const dt_msg_t *m, dt_wire_NAME_t *out, em);
 *       Pure: fills *out from m's body and nothing else. Returns 0; or 1
 *       when a lenient field (below) was mistyped and reads as its
 *       default, em naming it (the caller logs it); or < 0 with em naming
 *       the field: DT_EPROTO for a missing or mistyped one (the
 *       dt_msg_get_* texts: "missing field 'job'", "field 'job' must be an
 *       integer"), DT_EINVAL for a value out of its range or cap, or text
 *       that dt_text_check refuses ("field 'node': control character \x1b
 *       at byte 0 (only printable text)"). A request's decoder also refuses
 *       a frame of another type. Strings and objects in *out point into m
 *       and live as long as it; lists are allocated.
 *   void dt_wire_NAME_clear(dt_wire_NAME_t *v);
 *       Frees what the decoder allocated (the lists) and zeroes *v.
 *
 * Absent optional fields take their defaults: 0, false, NULL, an empty
 * list, NaN for a real (so "not reported" stays apart from 0.0), and the
 * defaults the tables name (a rank of -1, ...). Unknown fields are
 * ignored: a newer peer may add some.
 *
 * The results of LIST, SHOW, EVENTS, CHECKPOINTS and HISTORY are documents for
 * display and for scripts (dtctl --json prints them as they are): jobs.c
 * builds them and dtctl reads the columns it shows; they have no struct
 * here. Opaque objects inside messages (a plan, a result) are typed
 * const json_t *.
 */
#ifndef DT_WIRE_H
#define DT_WIRE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include <jansson.h>

#include "common/err.h"
#include "common/macros.h"
#include "common/msg.h"

/* Caps on the text a peer sends that is stored or shown. */
#define DT_WIRE_NAME_MAX 255   /* job and node names */
#define DT_WIRE_REASON_MAX 256 /* a cancel's reason */
#define DT_WIRE_PATH_MAX 4096  /* a checkpoint file's path */
#define DT_WIRE_RANKS_MAX (1 << 24)
#define DT_WIRE_SLOTS_MAX (1 << 20)

typedef struct dt_wire_strs {
    const char **v;
    size_t n;
} dt_wire_strs_t;

typedef struct dt_wire_ints {
    int64_t *v;
    size_t n;
} dt_wire_ints_t;

/*-- replies -------------------------------------------------------------*/

/* ERROR: any request's refusal. refused: SUBMIT's spec was refused
 * (dtctl exits 3, not 1). */
typedef struct dt_wire_error {
    int64_t code;
    const char *error;
    bool refused;
} dt_wire_error_t;

/*-- any peer ------------------------------------------------------------*/

typedef struct dt_wire_auth {
    const char *cred; /* a munge credential */
} dt_wire_auth_t;

typedef struct dt_wire_auth_ok {
    int64_t uid;
} dt_wire_auth_ok_t;

typedef struct dt_wire_ping_ok {
    int64_t version;
    const char *server;
    double uptime_s;
} dt_wire_ping_ok_t;

/*-- dtctl -> dtcoordd ---------------------------------------------------*/

typedef struct dt_wire_submit {
    const char *spec;
    const char *name; /* printable, at most DT_WIRE_NAME_MAX bytes */
    bool dry_run;     /* lenient: a mistyped value reads as false */
} dt_wire_submit_t;

/* SUBMIT's result: {id, state, plan}, or for a dry run {plan, script,
 * slurm} (id 0). */
typedef struct dt_wire_submit_ok {
    int64_t id;
    const char *state;
    const json_t *plan;
    const char *script;
    const json_t *slurm;
} dt_wire_submit_ok_t;

/* SHOW, CHECKPOINTS, CHECKPOINT, RESUME and HISTORY name a job and
 * nothing else. */
typedef struct dt_wire_job_ref {
    int64_t id;
} dt_wire_job_ref_t;

typedef struct dt_wire_cancel {
    int64_t id;
    const char *reason; /* printable, at most DT_WIRE_REASON_MAX bytes */
    bool checkpoint;    /* stop at a checkpoint first */
} dt_wire_cancel_t;

typedef struct dt_wire_cancel_ok {
    int64_t id;
    const char *state;
    bool stopping; /* a checkpoint is being written first */
} dt_wire_cancel_ok_t;

typedef struct dt_wire_events {
    int64_t id;
    int64_t since; /* events after this one */
} dt_wire_events_t;

typedef struct dt_wire_checkpoint_ok {
    int64_t id;
    int64_t gen;
} dt_wire_checkpoint_ok_t;

typedef struct dt_wire_resume_ok {
    int64_t id;
    const char *state;
    int64_t step;
} dt_wire_resume_ok_t;

/*-- dtagentd -> dtcoordd ------------------------------------------------*/

typedef struct dt_wire_register {
    int64_t job;
    const char *node; /* printable, 1 to DT_WIRE_NAME_MAX bytes */
    int64_t slots;    /* 1 to DT_WIRE_SLOTS_MAX */
    int64_t pid;      /* lenient: shown only */
    int64_t gen;      /* lenient: the generation whose workers run here, 0 none */
    dt_wire_ints_t ranks; /* lenient: their ranks */
    int64_t slurm_id, slurm_restart;
    dt_wire_strs_t gpus;     /* the node's GPUs' UUIDs (dtengine devices) */
    int64_t gpu_memory_bytes; /* the smallest one's memory */
    const char *gpu_why;     /* lenient, shown: why there are none */
    const char *peer;        /* lenient: "host:port" of its peer channel (replicas), none */
} dt_wire_register_t;

typedef struct dt_wire_register_ok {
    int64_t agent;
    int64_t heartbeat_ms; /* lenient; 0: the agent's default */
} dt_wire_register_ok_t;

/* HEARTBEAT and GEN_ENDED; also the common head of every agent report. */
typedef struct dt_wire_agent_ref {
    int64_t agent;
    int64_t gen;
} dt_wire_agent_ref_t;

typedef struct dt_wire_progress {
    int64_t agent, gen;
    int64_t rank; /* default -1 */
    int64_t pid;  /* lenient */
    int64_t step, steps, tokens;
    double loss, tokens_s, acc; /* lenient; NaN when absent or null */
} dt_wire_progress_t;

typedef struct dt_wire_worker_exit {
    int64_t agent, gen, rank;
    int64_t status, signal;
    int64_t step;        /* lenient; default -1: unknown */
    bool hung, stopped;  /* lenient */
    const char *error;   /* lenient: the worker's last words */
    const json_t *result; /* lenient: the worker's W_RESULT body */
    const char *gpu;     /* lenient: the UUID of the GPU it ran on (cuda) */
} dt_wire_worker_exit_t;

typedef struct dt_wire_shard_written {
    int64_t agent, gen;
    int64_t step, rank, bytes; /* step, bytes >= 0; rank 0 to DT_WIRE_RANKS_MAX */
    const char *path;          /* printable, at most DT_WIRE_PATH_MAX bytes */
    const char *sha256;        /* 64 lowercase hex digits */
    const char *dir;
    bool manifest;
    dt_wire_strs_t shards; /* the manifest's: each rank's sha256 */
} dt_wire_shard_written_t;

typedef struct dt_wire_fence {
    int64_t agent, gen, seq;
    const char *data; /* base64 */
} dt_wire_fence_t;

typedef struct dt_wire_preempt {
    int64_t agent;
    const char *signal; /* printable, at most 16 bytes */
} dt_wire_preempt_t;

typedef struct dt_wire_ckpt_done {
    int64_t agent;
    const char *op; /* "commit" or "prune" */
    int64_t step;   /* >= 0 */
    bool ok;
    const char *error;
} dt_wire_ckpt_done_t;

/* MEM_CKPT: the agent holds rank's in-memory checkpoint of step (its
 * shard's bytes and SHA-256, as the worker wrote them). */
typedef struct dt_wire_mem_ckpt {
    int64_t agent, gen;
    int64_t rank;  /* 0 to DT_WIRE_RANKS_MAX */
    int64_t step;  /* >= 1 */
    int64_t bytes; /* >= 0 */
    const char *sha256;
    bool replica;      /* lenient: held for another agent's rank */
    const char *error; /* lenient: the replica of step could not be sent (why) */
} dt_wire_mem_ckpt_t;

/*-- dtcoordd -> dtagentd, pushed ----------------------------------------*/

typedef struct dt_wire_gen_start {
    int64_t job, gen; /* gen >= 1 */
    const char *nspace;
    int64_t ranks;        /* 1 to DT_WIRE_RANKS_MAX */
    dt_wire_strs_t nodes; /* the generation's nodes, in order */
    dt_wire_ints_t procs; /* per rank, its node's index in nodes */
    const char *spec;     /* the job spec's text */
    dt_wire_strs_t argv;  /* dtengine's arguments */
    const char *resume, *log_dir;
    const char *device; /* "cpu" (NULL reads so) or "cuda": one GPU per worker */
    int64_t mem_resume; /* lenient: the in-memory checkpoints' step the ranks resume
                         * from (their agents hold them); 0 none */
    dt_wire_strs_t replica_to; /* lenient: per rank, the peer address ("host:port") of the
                                * agent that holds its replicas; "" none */
    dt_wire_strs_t fetch;      /* lenient: per rank, the peer address to fetch its copy of
                                * mem_resume from before it starts; "" none (its own) */
} dt_wire_gen_start_t;

typedef struct dt_wire_gen_abort {
    int64_t gen;
    const char *reason;
    int64_t rank; /* the failed rank; default -1: none */
} dt_wire_gen_abort_t;

typedef struct dt_wire_fence_done {
    int64_t gen, seq;
    const char *data; /* base64 */
    int64_t status;
} dt_wire_fence_done_t;

/* CKPT_REQUEST */
typedef struct dt_wire_gen_ref {
    int64_t gen;
} dt_wire_gen_ref_t;

typedef struct dt_wire_stop {
    int64_t gen;
    bool checkpoint;
} dt_wire_stop_t;

typedef struct dt_wire_job_end {
    int64_t job;
    const char *state;
} dt_wire_job_end_t;

typedef struct dt_wire_ckpt_commit {
    const char *dir;
    int64_t step; /* >= 0 */
} dt_wire_ckpt_commit_t;

typedef struct dt_wire_ckpt_prune {
    const char *dir;
    dt_wire_ints_t steps; /* each >= 0, at least one */
    const char *set_aside; /* rename to step-N.TAG instead of deleting */
} dt_wire_ckpt_prune_t;

/*-- dtengine <-> dtagentd, the worker channel ---------------------------*/

/* W_HELLO; W_HEARTBEAT has the rank only (pid 0) */
typedef struct dt_wire_w_hello {
    int64_t rank, pid;
} dt_wire_w_hello_t;

typedef struct dt_wire_w_progress {
    int64_t rank, step, steps, tokens;
    double loss, tokens_s, acc; /* NaN when not known */
} dt_wire_w_progress_t;

typedef struct dt_wire_w_shard {
    int64_t rank, step, bytes;
    const char *dir, *path, *sha256;
    bool manifest;
} dt_wire_w_shard_t;

/* outputs: at most this many paths (the files a user reads first) */
#define DT_WIRE_OUTPUTS_MAX 16

typedef struct dt_wire_w_result {
    int64_t rank, steps;
    double loss, acc;
    const char *checksum;
    dt_wire_strs_t outputs; /* absolute paths of the job's outputs (attn, prefill) */
} dt_wire_w_result_t;

/*-- dtagentd <-> dtagentd, the peer channel -----------------------------*/

/* PEER_REPLICA: the header of `bytes` raw bytes that follow it. */
typedef struct dt_wire_peer_replica {
    int64_t job, rank, step, bytes;
    const char *sha256;
} dt_wire_peer_replica_t;

typedef struct dt_wire_peer_fetch {
    int64_t job, rank, step;
} dt_wire_peer_fetch_t;

/* W_MEMCKPT: the worker wrote its in-memory checkpoint of step into slot
 * (0 or 1) of the memory its agent gave it (DT_MEM_CKPT), of bytes with
 * sha256; with writing, it is about to overwrite slot with step's (no
 * bytes or sha256: the agent forgets what the slot held). */
typedef struct dt_wire_w_memckpt {
    int64_t rank, step, slot, bytes;
    const char *sha256;
    bool writing;
} dt_wire_w_memckpt_t;

typedef struct dt_wire_w_stop {
    bool checkpoint;
} dt_wire_w_stop_t;

/* X(name, frame type, reply?, struct) for every message that has a
 * struct: requests and pushes, then the results that are not documents. */
#define DT_WIRE_MESSAGES(X)                                   \
    X(error, ERROR, 1, dt_wire_error_t)                       \
    X(auth, AUTH, 0, dt_wire_auth_t)                          \
    X(auth_ok, AUTH, 1, dt_wire_auth_ok_t)                    \
    X(ping_ok, PING, 1, dt_wire_ping_ok_t)                    \
    X(submit, SUBMIT, 0, dt_wire_submit_t)                    \
    X(submit_ok, SUBMIT, 1, dt_wire_submit_ok_t)              \
    X(show, SHOW, 0, dt_wire_job_ref_t)                       \
    X(cancel, CANCEL, 0, dt_wire_cancel_t)                    \
    X(cancel_ok, CANCEL, 1, dt_wire_cancel_ok_t)              \
    X(events, EVENTS, 0, dt_wire_events_t)                    \
    X(checkpoints, CHECKPOINTS, 0, dt_wire_job_ref_t)         \
    X(checkpoint, CHECKPOINT, 0, dt_wire_job_ref_t)           \
    X(checkpoint_ok, CHECKPOINT, 1, dt_wire_checkpoint_ok_t)  \
    X(resume, RESUME, 0, dt_wire_job_ref_t)                   \
    X(resume_ok, RESUME, 1, dt_wire_resume_ok_t)              \
    X(history, HISTORY, 0, dt_wire_job_ref_t)                 \
    X(register, REGISTER, 0, dt_wire_register_t)              \
    X(register_ok, REGISTER, 1, dt_wire_register_ok_t)        \
    X(heartbeat, HEARTBEAT, 0, dt_wire_agent_ref_t)           \
    X(progress, PROGRESS, 0, dt_wire_progress_t)              \
    X(worker_exit, WORKER_EXIT, 0, dt_wire_worker_exit_t)     \
    X(shard_written, SHARD_WRITTEN, 0, dt_wire_shard_written_t) \
    X(fence, FENCE, 0, dt_wire_fence_t)                       \
    X(gen_ended, GEN_ENDED, 0, dt_wire_agent_ref_t)           \
    X(preempt, PREEMPT, 0, dt_wire_preempt_t)                 \
    X(ckpt_done, CKPT_DONE, 0, dt_wire_ckpt_done_t)           \
    X(mem_ckpt, MEM_CKPT, 0, dt_wire_mem_ckpt_t)              \
    X(gen_start, GEN_START, 0, dt_wire_gen_start_t)           \
    X(gen_abort, GEN_ABORT, 0, dt_wire_gen_abort_t)           \
    X(fence_done, FENCE_DONE, 0, dt_wire_fence_done_t)        \
    X(ckpt_request, CKPT_REQUEST, 0, dt_wire_gen_ref_t)       \
    X(stop, STOP, 0, dt_wire_stop_t)                          \
    X(job_end, JOB_END, 0, dt_wire_job_end_t)                 \
    X(ckpt_commit, CKPT_COMMIT, 0, dt_wire_ckpt_commit_t)     \
    X(ckpt_prune, CKPT_PRUNE, 0, dt_wire_ckpt_prune_t)        \
    X(w_hello, W_HELLO, 0, dt_wire_w_hello_t)                 \
    X(w_progress, W_PROGRESS, 0, dt_wire_w_progress_t)        \
    X(w_heartbeat, W_HEARTBEAT, 0, dt_wire_w_hello_t)         \
    X(w_shard, W_SHARD, 0, dt_wire_w_shard_t)                 \
    X(w_result, W_RESULT, 0, dt_wire_w_result_t)              \
    X(w_memckpt, W_MEMCKPT, 0, dt_wire_w_memckpt_t)           \
    X(peer_replica, PEER_REPLICA, 0, dt_wire_peer_replica_t)  \
    X(peer_fetch, PEER_FETCH, 0, dt_wire_peer_fetch_t)        \
    X(w_stop, W_STOP, 0, dt_wire_w_stop_t)

#define DT_WIRE_DECLARE(name, type, reply, T)                                              \
    json_t *dt_wire_##name##_encode(const T *v);                                           \
    DT_MUST_CHECK int dt_wire_##name##_decode(const dt_msg_t *m, T *out, dt_emsg_t *em);   \
    void dt_wire_##name##_clear(T *v);
DT_WIRE_MESSAGES(DT_WIRE_DECLARE)
#undef DT_WIRE_DECLARE

/* The same, by frame type, for code that walks every message (the fuzz
 * target, the unit test): the schema of a request or push of `type`, or
 * of its result (reply true); NULL where there is none. */
typedef struct dt_wire_schema dt_wire_schema_t;
const dt_wire_schema_t *dt_wire_schema(uint16_t type, bool reply);
/* The schemas in table order: i from 0 until NULL. */
const dt_wire_schema_t *dt_wire_schema_at(size_t i);
const char *dt_wire_schema_name(const dt_wire_schema_t *s);
uint16_t dt_wire_schema_type(const dt_wire_schema_t *s);
size_t dt_wire_schema_size(const dt_wire_schema_t *s); /* of its struct */
DT_MUST_CHECK int dt_wire_decode(const dt_wire_schema_t *s, const json_t *body, void *out,
                                 dt_emsg_t *em);
json_t *dt_wire_encode(const dt_wire_schema_t *s, const void *v);
void dt_wire_clear(const dt_wire_schema_t *s, void *v);

#endif /* DT_WIRE_H */
