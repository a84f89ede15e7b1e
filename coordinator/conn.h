/* SPDX-License-Identifier: MIT
 *
 * One peer connection of dtcoordd (Unix socket or TCP): buffered reads fed
 * to the frame decoder, requests dispatched through the coordinator's
 * dispatch hook (coord.h; rpc.c's table), replies written back. A
 * malformed frame gets an ERROR reply and the connection is closed.
 *
 * Every peer's memory is bounded (dtcoordd(8), LIMITS): at most one request
 * buffered (DT_COORD_REQ_MAX, 1 MiB; DT_COORD_PREAUTH_MAX, 64 KiB before
 * authentication); unsent replies above output_soft_limit stop the reading
 * of its requests until they drain, and a peer above output_hard_limit,
 * or above the soft limit for output_timeout, is closed. Before AUTH a TCP
 * peer has one request in flight, DT_COORD_PREAUTH_FRAMES in all and
 * auth_timeout to authenticate; a peer silent for idle_timeout is closed
 * (registered agents are judged by their heartbeats instead). The number
 * of connections is capped (max_connections, max_connections_per_user),
 * with a reserve for root on the Unix socket so that root can always look
 * and cancel.
 */
#ifndef DT_COORD_CONN_H
#define DT_COORD_CONN_H

#include <jansson.h>
#include <stdint.h>
#include <sys/types.h>
#include <uv.h>

#include "common/uvframe.h"
#include "coordinator/coord.h"

/* Largest request payload accepted, after and before authentication. */
#define DT_COORD_REQ_MAX (1u << 20)
#define DT_COORD_PREAUTH_MAX (64u << 10)
/* Requests (AUTH and PING) a TCP peer may send before it is authenticated. */
#define DT_COORD_PREAUTH_FRAMES 8
/* Connections root may open on the Unix socket beyond max_connections. */
#define DT_COORD_ROOT_RESERVE 32
/* Descriptors kept for everything but peers (database, log, munge, Slurm):
 * max_connections is lowered to fit RLIMIT_NOFILE with these and root's
 * reserve aside. */
#define DT_COORD_FD_RESERVE 96
/* Bytes each unsent reply counts toward the output limits besides its own
 * size: its write request and allocations. */
#define DT_COORD_WRITE_COST 256

typedef struct dt_conn {
    union {
        uv_handle_t handle;
        uv_stream_t stream;
        uv_pipe_t pipe;
        uv_tcp_t tcp;
    } h;
    dt_coord_t *coord;
    int tcp;             /* arrived over TCP (needs AUTH) */
    int authed;          /* identity known */
    uid_t uid;
    gid_t gid;
    char peer[64];       /* "uid=0 pid=42" or "127.0.0.1:5412" for logs */
    dt_uvframe_t rd;     /* received bytes not yet decoded (no buffer when none) */
    int closing;
    int reading;         /* uv_read_start is in effect */
    size_t writes;       /* replies handed to libuv whose callback has not run */
    unsigned preauth;    /* requests decoded before authentication */
    uint64_t accepted_ms, heard_ms; /* loop time: accepted, bytes last received */
    uint64_t over_ms;    /* unsent replies above output_soft_limit since, else 0 */
    int64_t agent;       /* agent id once registered, else 0 */
    /* AUTH in flight on the thread pool: reading pauses until it is done */
    int auth_pending;
    int closed;          /* the close callback ran; free when auth returns */
    uv_work_t auth_work;
    char *auth_cred;
    uint32_t auth_id;
    int auth_rc;
    uid_t auth_uid;
    gid_t auth_gid;
    char auth_err[256];
    struct dt_conn *next;
} dt_conn_t;

/* Accept a new peer from a listening stream; one over the limits is told
 * why (an ERROR frame with DT_ECOMM) and closed. */
void dt_conn_accept(dt_coord_t *c, uv_stream_t *server, int tcp);
/* May this peer, whose uid is now known, stay open under
 * max_connections_per_user (root: always)? 0, or DT_ECOMM with the reason
 * in em. */
int dt_conn_admit(dt_conn_t *k, dt_emsg_t *em);
/* Periodic: close peers past auth_timeout, idle_timeout or output_timeout
 * and peers that went away while their reading was paused; log the
 * connections refused since the last sweep. */
void dt_conn_sweep(dt_coord_t *c);
/* The limit on open connections now in force: max_connections, lowered
 * to what RLIMIT_NOFILE leaves (at least 1). */
int64_t dt_conn_cap(const dt_coord_t *c);
/* Send a reply frame; body is consumed (NULL for {}). */
void dt_conn_reply(dt_conn_t *k, uint16_t type, uint32_t id, json_t *body);
/* Send an ERROR reply with a dt error code and message. */
void dt_conn_error(dt_conn_t *k, uint32_t id, int code, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));
/* Close (idempotent); memory is released in the close callback. */
void dt_conn_close(dt_conn_t *k);
/* Decode and dispatch what is buffered (after an AUTH completes), as far
 * as the limits allow. */
void dt_conn_process(dt_conn_t *k);
/* Stop reading while an AUTH is decoded off the loop thread (set
 * k->auth_pending first); dt_conn_process reads again once it is done. */
void dt_conn_pause(dt_conn_t *k);

#endif /* DT_COORD_CONN_H */
