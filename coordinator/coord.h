/* SPDX-License-Identifier: MIT
 *
 * dtcoordd's one context: configuration, the database, listeners, peers and
 * the in-memory view of live agents, with the functions every coordinator
 * file may call (coord.c: events, clocks, live agents). Reached through
 * loop->data; owned and touched by the loop thread only.
 *
 * The coordinator's files call downwards only: main > metrics, rpc > ctl_req,
 * agent_req > jobs, recovery > run > commit, fence > push, alloc > conn
 * (listen > conn) > coord,
 * beside the leaves auth, daemon, jobdir, slurm, batch and the planner. A
 * lower file reaches a higher one only through the hooks below, which
 * main.c sets.
 */
#ifndef DT_COORD_H
#define DT_COORD_H

#include <stdint.h>
#include <sys/types.h>
#include <uv.h>

#include "common/conf.h"
#include "db/db.h"

typedef struct dt_coord_conf {
    char *state_dir;         /* required */
    char *jobs_dir;          /* per-job directories (jobdir.h); default STATE_DIR/jobs */
    char *socket;            /* Unix socket for dtctl; default STATE_DIR/dtcoordd.sock */
    char *listen;            /* host:port for agents and remote dtctl; none if unset */
    char *metrics_listen;    /* host:port of the Prometheus endpoint (metrics.h); none if unset */
    char *admin_group;       /* members may see and change every job */
    int64_t heartbeat_ms;    /* agents' heartbeat interval (reloadable) */
    int64_t agent_timeout_ms; /* an agent silent this long is lost (reloadable) */
    char *log_level;         /* error | warn | info | debug (reloadable) */
    char *log_file;          /* default: stderr with -D, STATE_DIR/dtcoordd.log daemonised */
    char *pidfile;           /* default STATE_DIR/dtcoordd.pid */
    char *munge_socket;      /* munged's socket; default libmunge's */
    /* Limits on peers (coordinator/conn.c, dtcoordd(8) LIMITS; reloadable) */
    int64_t max_connections;   /* open connections; root gets a reserve beyond */
    int64_t max_connections_per_user; /* of one uid other than root */
    int64_t auth_timeout_ms;   /* a TCP peer must authenticate within it */
    int64_t idle_timeout_ms;   /* a peer silent this long is closed (agents exempt) */
    int64_t output_soft_limit; /* bytes of unsent replies: stop reading above */
    int64_t output_hard_limit; /* ... close above */
    int64_t output_timeout_ms; /* ... close after this long above the soft limit */
    /* Slurm (dt.conf(5), coordinator/alloc.c) */
    int slurm;               /* submit every job to Slurm */
    char *slurm_conf;        /* slurm.conf; default $SLURM_CONF, else /etc/slurm/slurm.conf */
    char *slurm_agent;       /* dtagentd on the nodes; default SBINDIR/dtagentd */
    char *slurm_engine;      /* dtengine on the nodes; default: the agent finds it */
    char *slurm_coord_address; /* HOST:PORT agents connect to; default from listen */
    char *slurm_output_dir;  /* batch output files; default STATE_DIR/slurm */
    char *slurm_setup;       /* shell file the batch script sources first */
    char *slurm_env;         /* NAME=VALUE ... the batch script exports */
    int64_t slurm_poll_ms;   /* how often slurmctld is asked (default 5s) */
    int64_t slurm_hang_timeout_ms; /* passed to the agents (default theirs) */
    char *slurm_signal;      /* warning signal of jobs that set none: USR1 | USR2 (default USR2) */
} dt_coord_conf_t;

const dt_conf_key_t *dt_coord_conf_keys(void);

struct dt_conn;
struct dt_jobrun;
struct dt_msg;
struct dt_fault;
struct dt_coord;

/* The calls that go up the layers. */
typedef struct dt_coord_hooks {
    /* conn.c: a decoded request (rpc.c's table) */
    void (*dispatch)(struct dt_conn *k, const struct dt_msg *m);
    /* run.c, alloc.c: a fault of a job; the recovery policy decides and
     * acts (recovery.c). Returns the action taken (enum dt_action). */
    int (*fault)(struct dt_coord *c, int64_t job, const struct dt_fault *f);
    /* run.c: the job reached a final state (alloc.c ends its Slurm job) */
    void (*job_ended)(struct dt_coord *c, int64_t job, int cancelled);
} dt_coord_hooks_t;

/* A live agent: the database has the durable record, this the heartbeat. */
typedef struct dt_live_agent {
    int64_t id, job;
    int64_t last_seen_ms; /* monotonic */
    struct dt_conn *conn; /* NULL while disconnected */
    int64_t step, tokens; /* last progress */
    double loss;
    char node[256];
    int slots;
    int gpus; /* the node's GPUs, as it registered them */
    int suspect; /* a GPU of it failed (recovery): no more ranks on it */
    char peer[304]; /* "host:port" of its peer channel (replicas), "" none */
    int64_t pid;
    struct dt_live_agent *next, *prev;
} dt_live_agent_t;

typedef struct dt_coord {
    uv_loop_t *loop;
    const char *conf_path;
    const dt_coord_hooks_t *hooks;
    dt_coord_conf_t conf;
    dt_db_t *db;
    uv_pipe_t unix_srv;
    uv_tcp_t tcp_srv;
    int have_unix, have_tcp;
    uv_signal_t sig_term, sig_int, sig_hup;
    uv_timer_t sweep;
    /* metrics_listen (coordinator/metrics.c): its listener, the scrape
     * connections open and what they counted */
    uv_tcp_t metrics_srv;
    int have_metrics;
    struct dt_scrape *scrapes;
    unsigned nscrapes;
    uint64_t scrapes_total, scrapes_refused;
    struct dt_conn *conns;   /* every open connection */
    unsigned conns_refused;  /* since the last sweep: logged there, once */
    dt_live_agent_t *agents; /* live agents (list; hashed by id below) */
    dt_live_agent_t **agent_tab;
    size_t agent_cap, nagents;
    struct dt_jobrun *runs;     /* jobs with agents: coordinator/run.c */
    struct dt_alloc *alloc;     /* Slurm jobs: coordinator/alloc.c; NULL when slurm = no */
    int64_t started_ms;
    int stopping;
    int lock_fd; /* pidfile, flock'ed while running */
    int jobs_fd; /* conf.jobs_dir, open: job directories are made relative to it */
} dt_coord_t;

/* One event on the job's history (and the log), detail printf-style; a
 * database error is logged, not returned: the decision stands. */
void dt_coord_event(dt_coord_t *c, int64_t job, const char *kind, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));

/* Live agents. */
dt_live_agent_t *dt_coord_agent_find(dt_coord_t *c, int64_t id);
dt_live_agent_t *dt_coord_agent_add(dt_coord_t *c, int64_t id, int64_t job);
void dt_coord_agent_remove(dt_coord_t *c, int64_t id);

#endif /* DT_COORD_H */
