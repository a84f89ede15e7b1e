/* SPDX-License-Identifier: MIT
 *
 * One peer connection of dtcoordd (Unix socket or TCP): buffered reads fed
 * to the frame decoder, requests dispatched to the RPC table, replies
 * written back. A malformed frame gets an ERROR reply and the connection is
 * closed; nothing the peer sends can make the coordinator allocate more
 * than one request (DT_COORD_REQ_MAX, 64 KiB before authentication) per
 * connection.
 */
#ifndef DT_COORD_CONN_H
#define DT_COORD_CONN_H

#include <jansson.h>
#include <stdint.h>
#include <sys/types.h>
#include <uv.h>

#include "coordinator/coord.h"

/* Largest request payload accepted, after and before authentication. */
#define DT_COORD_REQ_MAX (1u << 20)
#define DT_COORD_PREAUTH_MAX (64u << 10)

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
    char peer[64];       /* "uid=0 unix" or "127.0.0.1:5412" for logs */
    uint8_t *buf;        /* unread bytes */
    size_t len, cap;
    int closing;
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

/* Accept a new peer from a listening stream. */
void dt_conn_accept(dt_coord_t *c, uv_stream_t *server, int tcp);
/* Send a reply frame; body is consumed (NULL for {}). */
void dt_conn_reply(dt_conn_t *k, uint16_t type, uint32_t id, json_t *body);
/* Send an ERROR reply with a dt error code and message. */
void dt_conn_error(dt_conn_t *k, uint32_t id, int code, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));
/* Close (idempotent); memory is released in the close callback. */
void dt_conn_close(dt_conn_t *k);
/* Decode and dispatch what is buffered (after an AUTH completes). */
void dt_conn_process(dt_conn_t *k);
/* Stop or resume reading (while an AUTH is decoded off the loop thread). */
void dt_conn_pause(dt_conn_t *k);
void dt_conn_resume(dt_conn_t *k);

#endif /* DT_COORD_CONN_H */
