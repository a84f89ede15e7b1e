/* SPDX-License-Identifier: MIT
 *
 * dtagentd's one context, reached through loop->data and touched by the
 * loop thread only: options, the link to dtcoordd (link.c), the current
 * generation and its workers (task.c), the PMIx server (pmix.c).
 *
 * The agent is one per node per job. It registers with the coordinator,
 * heartbeats, and runs the ranks the coordinator places on it, one
 * generation at a time; it keeps them running while the coordinator is
 * away and re-registers (with the generation it runs) when it is back.
 */
#ifndef DT_AGENT_H
#define DT_AGENT_H

#include <jansson.h>
#include <stdint.h>
#include <uv.h>

#include "agent/pmix.h"
#include "common/msg.h"

struct dt_agent;

/* One worker process (one rank of the current generation). */
typedef struct dt_worker {
    struct dt_agent *ag;
    int rank;
    uv_process_t proc;
    uv_pipe_t chan;          /* our end of the worker channel */
    uv_pipe_t out;           /* the worker's stdout and stderr, when it has a rank log */
    int proc_open, chan_open, out_open; /* handles not yet closed */
    int log_fd;              /* LOG_DIR/rank-R.log (append), -1 without one */
    char last[256];          /* the last line of its output, for WORKER_EXIT's error */
    char line[256];          /* the line being read */
    size_t line_len;
    int exited;              /* the exit callback ran */
    int64_t status;
    int term_signal;
    int64_t pid;
    int64_t last_heard_ms;   /* monotonic: spawn, then every frame */
    int heard;               /* a frame came: the hang timeout applies from now on */
    int64_t step;
    int hung;                /* killed for silence: 1, 2 when it was stopped (SIGSTOP) */
    int stepping;            /* the first W_PROGRESS came */
    json_t *result;          /* W_RESULT (rank 0) */
    uint8_t *buf;            /* unread channel bytes */
    size_t len, cap;
} dt_worker_t;

/* A message for the coordinator that must arrive: kept until answered
 * (fences: until FENCE_DONE) and sent again after a reconnect. */
typedef struct dt_pending {
    uint16_t type;
    uint32_t id;             /* 0 until sent on the current connection */
    json_t *body;
    int until_done;          /* FENCE: dropped by FENCE_DONE, not by OK */
    uint32_t gen, seq;
    struct dt_pending *next;
} dt_pending_t;

typedef struct dt_agent {
    uv_loop_t *loop;
    /* options */
    const char *coord;       /* "unix:PATH" or "HOST:PORT" */
    const char *node;
    const char *state_dir;
    const char *engine;
    const char *munge_socket;
    int64_t job;
    int slots;
    int64_t hang_ms, grace_ms;
    int64_t start_ms;        /* a worker's first frame may take this long (MPI_Init) */
    /* link */
    union {
        uv_handle_t handle;
        uv_stream_t stream;
        uv_pipe_t pipe;
        uv_tcp_t tcp;
    } conn;
    uv_connect_t connect_req;
    int conn_open;           /* the handle is initialised and not closed */
    int connected, registered;
    int64_t agent_id, heartbeat_ms;
    uint32_t next_id;
    uint32_t register_id;
    uint8_t *rbuf;
    size_t rlen, rcap;
    int64_t backoff_ms;
    int64_t lost_since_ms;   /* monotonic, when the link went down */
    uv_timer_t reconnect_timer, heartbeat_timer;
    dt_pending_t *pending;   /* reliable messages, oldest first */
    /* generation */
    uint32_t gen;            /* 0: none */
    char *nspace;
    int nranks;
    dt_worker_t *workers;
    int nworkers;
    int aborting;            /* notified and waiting out the grace period */
    int ended_sent;
    char *gen_dir;
    char *log_dir;           /* GEN_START's log_dir: rank logs, the job owner's; NULL none */
    uv_timer_t watch_timer;  /* hang checks */
    uv_timer_t grace_timer;
    dt_pmix_t *pmix;
    /* lifecycle */
    uv_signal_t sig_term, sig_int;
    uv_signal_t sig_usr[2];  /* USR1, USR2: the one that is warn_signal warns */
    int warn_signal;         /* --signal: Slurm's warning signal (default SIGUSR1) */
    int64_t slurm_id, slurm_restart; /* SLURM_JOB_ID, SLURM_RESTART_COUNT; 0 outside Slurm */
    int stopping;
    int exit_code;
} dt_agent_t;

int64_t dt_agent_mono_ms(void);

/* link.c */
void dt_link_start(dt_agent_t *ag);
/* Send a request now if connected (unreliable: PROGRESS, HEARTBEAT). */
void dt_link_send(dt_agent_t *ag, uint16_t type, json_t *body);
/* Queue a reliable message (see dt_pending_t); takes the body. */
void dt_link_send_reliable(dt_agent_t *ag, uint16_t type, json_t *body);
void dt_link_send_fence(dt_agent_t *ag, uint32_t gen, uint32_t seq, json_t *body);
void dt_link_close(dt_agent_t *ag);

/* task.c: pushed messages from the coordinator */
void dt_task_gen_start(dt_agent_t *ag, const dt_msg_t *m);
void dt_task_gen_abort(dt_agent_t *ag, const dt_msg_t *m);
void dt_task_fence_done(dt_agent_t *ag, const dt_msg_t *m);
void dt_task_ckpt_request(dt_agent_t *ag, const dt_msg_t *m);
void dt_task_stop(dt_agent_t *ag, const dt_msg_t *m);
/* The running generation's state for REGISTER: {gen, ranks: [...]} or
 * {gen: 0}. */
json_t *dt_task_status(dt_agent_t *ag);
/* Kill every worker now (SIGKILL). */
void dt_task_kill_all(dt_agent_t *ag);
/* For an agent stop: SIGTERM every worker now, SIGKILL after the grace
 * period; 1 if any was running (the stop completes when their handles
 * have closed), else 0. */
int dt_task_terminate(dt_agent_t *ag);
int dt_task_init(dt_agent_t *ag, dt_emsg_t *em);
void dt_task_close(dt_agent_t *ag);

/* files.c: CKPT_COMMIT and CKPT_PRUNE from the coordinator, carried out as
 * the job's owner on the thread pool, answered with CKPT_DONE. */
void dt_files_ckpt(dt_agent_t *ag, const dt_msg_t *m);

/* main.c: end the agent with this exit code once workers are gone. */
void dt_agent_stop(dt_agent_t *ag, int code);

#endif /* DT_AGENT_H */
