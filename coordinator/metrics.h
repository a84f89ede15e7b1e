/* SPDX-License-Identifier: MIT
 *
 * dtcoordd's Prometheus endpoint (dt.conf metrics_listen, dtcoordd(8)
 * METRICS): a TCP listener that answers `GET /metrics` with the text
 * exposition format (version 0.0.4) and nothing else, over a minimal,
 * paranoid HTTP/1.x: one request per connection, its head capped at
 * DT_METRICS_HEAD_MAX bytes, Connection: close after every reply, each
 * connection closed DT_METRICS_TIMEOUT_MS after it was accepted whatever
 * it is doing, at most DT_METRICS_CONNS_MAX of them open (one more is
 * told 503 and closed).
 *
 * A scrape is three steps, each callable alone: collect (the coordinator
 * -> a snapshot of plain numbers; the SQLite reads `dtctl show` makes for
 * each live job, dt_jobs_show, and the job list an admin's `dtctl list`
 * makes), format (snapshot -> text; pure), and the HTTP exchange. What it
 * shows is numbers and enum words only, with ids as labels; the one text
 * that comes from outside, an agent's node name, is escaped as the format
 * requires. No job name, spec, path, reason or other user text.
 *
 * Bounds: live jobs (not completed, failed or cancelled) in full, at most
 * DT_METRICS_JOBS_MAX of them (those with workers first); of the ended
 * jobs, the newest DT_METRICS_ENDED_MAX, their state only; at most
 * DT_METRICS_AGENTS_MAX agents. What is left out is counted
 * (dt_coordinator_scrape_jobs_omitted, ..._agents_omitted).
 *
 * Not here: authentication (there is none: bind it where only the
 * admins' Prometheus reaches, dtcoordd(8) SECURITY), TLS, keep-alive,
 * compression. All functions run on the loop thread.
 */
#ifndef DT_COORD_METRICS_H
#define DT_COORD_METRICS_H

#include <stddef.h>
#include <stdint.h>

#include "common/err.h"
#include "coordinator/coord.h"
#include "spec/state.h"

#define DT_METRICS_HEAD_MAX 4096    /* bytes of request line and headers */
#define DT_METRICS_TIMEOUT_MS 10000 /* a connection's whole life */
#define DT_METRICS_CONNS_MAX 8      /* scrape connections open at once */
#define DT_METRICS_JOBS_MAX 1000    /* live jobs shown in full */
#define DT_METRICS_ENDED_MAX 32     /* ended jobs shown (state only), newest */
#define DT_METRICS_AGENTS_MAX 10000 /* live agents shown */

/* ---- the listener ----------------------------------------------------------- */

/* Listen on "host:port" (dt_listen_parse's forms; port 0: one the system
 * picks, logged). DT_EINVAL for a bad address, DT_EEXIST when it is in
 * use, DT_EIO otherwise, each naming metrics_listen and the value. */
int dt_metrics_listen(dt_coord_t *c, const char *hostport, dt_emsg_t *em);
/* Stop listening and close every scrape connection (idempotent; memory
 * is released in the close callbacks). */
void dt_metrics_close(dt_coord_t *c);
/* Periodic (with the agent sweep): close connections past
 * DT_METRICS_TIMEOUT_MS. */
void dt_metrics_sweep(dt_coord_t *c);

/* ---- HTTP ------------------------------------------------------------------ */

/* What to answer to the request head that buf[0..len) begins with: 0 while
 * it is incomplete and may still be valid, else the HTTP status: 200 for
 * GET /metrics (with or without a query), 404 for GET of another path,
 * 405 for another method, 400 for anything malformed (a request line
 * other than `METHOD SP /TARGET SP HTTP/1.x`, a header line without a
 * name and colon, a folded line, a control character, a bare CR), 431 for
 * a head not complete within DT_METRICS_HEAD_MAX bytes. The head ends at
 * the first empty line (CRLF CRLF, or LF LF); what follows is ignored. */
int dt_metrics_http_status(const char *buf, size_t len);

/* ---- the snapshot ----------------------------------------------------------- */

/* One job. Unknown numbers are NaN (doubles) or -1 (integers) and are not
 * shown. */
typedef struct dt_metrics_job {
    int64_t id;
    enum dt_job_state state;
    int64_t uid;           /* the owner */
    int full;              /* a live job: the fields below are set */
    int64_t gen;           /* the current generation; -1 none */
    int64_t step, steps;   /* rank 0's step and the steps planned */
    double tokens_s, loss; /* rank 0's rate (all rings) and loss */
    int64_t restarts, requeues;
    /* goodput (dt_jobs_goodput) */
    double ettr, step_s, productive_s, recomputed_s, stall_s;
    double detect_s, restart_s, load_s;
    int64_t failures;
    /* the newest committed checkpoint */
    int64_t ckpt_step, ckpt_bytes;
    double ckpt_age_s;
    /* the in-memory checkpoints (dt_run_mem_state); -1 / NaN none */
    int64_t mem_step;
    double mem_coverage, mem_replicas;
} dt_metrics_job_t;

typedef struct dt_metrics_agent {
    int64_t id, job;
    const char *node; /* borrowed (the live agent's, or the test's) */
    double heartbeat_age_s;
    int gpus, slots, suspect, connected;
} dt_metrics_agent_t;

/* Connections by kind. */
enum dt_metrics_conn_kind {
    DT_MCONN_UNIX,    /* dtctl on the Unix socket */
    DT_MCONN_TCP,     /* TCP peers that are not a registered agent (remote dtctl) */
    DT_MCONN_AGENT,   /* registered agents */
    DT_MCONN_METRICS, /* scrapes */
    DT_MCONN_NKINDS
};

typedef struct dt_metrics_snap {
    dt_metrics_job_t *jobs; /* by id */
    size_t njobs;
    dt_metrics_agent_t *agents; /* by job, then id */
    size_t nagents;
    int64_t jobs_by_state[DT_JOB_NSTATES]; /* every job in the database */
    int64_t jobs_omitted, agents_omitted;
    int64_t live_agents;
    int64_t conns[DT_MCONN_NKINDS];
    int64_t queued_bytes[DT_MCONN_NKINDS];   /* written, not yet taken by the kernel */
    int64_t queued_replies[DT_MCONN_NKINDS]; /* replies whose write has not completed */
    int64_t over_soft[DT_MCONN_NKINDS];      /* peers not read: over output_soft_limit */
    double uptime_s;
    uint64_t scrapes, scrapes_refused;
} dt_metrics_snap_t;

/* Take the snapshot at wall_ms (epoch ms: checkpoint ages) and mono_ms
 * (dt_clock_mono_ms: heartbeat ages, uptime). 0, or the database's error
 * when the job list cannot be read (s is then empty). Per-job reads that
 * fail leave those numbers unknown (logged by dt_jobs_show). */
int dt_metrics_collect(dt_coord_t *c, int64_t wall_ms, int64_t mono_ms, dt_metrics_snap_t *s,
                       dt_emsg_t *em);
void dt_metrics_snap_clear(dt_metrics_snap_t *s);

/* The exposition of s: every family once, its HELP and TYPE lines before
 * its samples, a family with no samples left out, unknown values left
 * out, label values escaped (\\ \" \n; other control characters and bytes
 * that are not UTF-8 as '?', cut at 255 bytes). Returns the text (NUL
 * terminated, the caller's to free) and its length in *len. */
char *dt_metrics_format(const dt_metrics_snap_t *s, size_t *len);

#endif /* DT_COORD_METRICS_H */
