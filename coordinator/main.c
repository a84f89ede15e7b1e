/* SPDX-License-Identifier: MIT
 *
 * dtcoordd: the dt coordinator. Owns the SQLite database of every job,
 * plans and queues jobs, answers dtctl, tracks agents. Stateless beyond
 * that database: killed at any moment and restarted, it reloads everything
 * and agents re-register.
 *
 * main() reads top to bottom: arguments, configuration, logging,
 * daemonising (the parent waits on a status pipe), pidfile, database,
 * listeners, signals, the loop, and teardown in reverse.
 */
#include "config.h"

#include <errno.h>
#include <fcntl.h>
#include <getopt.h>
#include <signal.h>
#include <stddef.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "common/clock.h"
#include "common/fileio.h"
#include "common/log.h"
#include "common/mem.h"
#include "coordinator/conn.h"
#include "coordinator/alloc.h"
#include "coordinator/coord.h"
#include "coordinator/daemon.h"
#include "coordinator/jobdir.h"
#include "coordinator/jobs.h"
#include "coordinator/listen.h"
#include "coordinator/metrics.h"
#include "coordinator/recovery.h"
#include "coordinator/rpc.h"
#include "coordinator/run.h"
#include <sys/socket.h>

/* ---- configuration --------------------------------------------------------- */

/* listen, metrics_listen: empty (off) or what dt_listen_parse takes,
 * checked as the file is read so that the message names its line */
static int check_hostport(const char *value, dt_emsg_t *em)
{
    struct sockaddr_storage ss;

    return *value ? dt_listen_parse(value, &ss, em) : 0;
}

/* name, type, field, bounds, required, reloadable (SIGHUP), value check, help */
#define CONFC(n, t, f, lo, hi, req, rel, chk, h)                                             \
    {                                                                                        \
        .name = (n), .type = (t), .offset = offsetof(dt_coord_conf_t, f), .min = (lo),       \
        .max = (hi), .required = (req), .reloadable = (rel), .help = (h), .check = (chk)     \
    }
#define CONF(n, t, f, lo, hi, req, rel, h) CONFC(n, t, f, lo, hi, req, rel, NULL, h)
static const dt_conf_key_t conf_keys[] = {
    CONF("state_dir", DT_CONF_STRING, state_dir, 0, 0, 1, 0,
         "directory of the database, socket and pidfile"),
    CONF("jobs_dir", DT_CONF_STRING, jobs_dir, 0, 0, 0, 0,
         "directory of the per-job directories given to the jobs' owners (default "
      "STATE_DIR/jobs)"),
    CONF("socket", DT_CONF_STRING, socket, 0, 0, 0, 0,
         "Unix socket for dtctl (default STATE_DIR/dtcoordd.sock)"),
    CONFC("listen", DT_CONF_STRING, listen, 0, 0, 0, 0, check_hostport,
          "host:port for agents and remote dtctl (munge); unset: no TCP"),
    CONFC("metrics_listen", DT_CONF_STRING, metrics_listen, 0, 0, 0, 0, check_hostport,
          "host:port of the Prometheus endpoint, GET /metrics (no authentication); unset: "
          "none"),
    CONF("admin_group", DT_CONF_STRING, admin_group, 0, 0, 0, 1,
         "group whose members may see and change every job"),
    CONF("heartbeat", DT_CONF_DURATION, heartbeat_ms, 10, 3600000, 0, 1,
         "agents' heartbeat interval (default 1s)"),
    CONF("agent_timeout", DT_CONF_DURATION, agent_timeout_ms, 100, 86400000, 0, 1,
         "an agent silent this long is lost (default 10s)"),
    CONF("log_level", DT_CONF_STRING, log_level, 0, 0, 0, 1,
         "error, warn, info or debug (default info)"),
    CONF("log_file", DT_CONF_STRING, log_file, 0, 0, 0, 0,
         "log file (default stderr with -D, STATE_DIR/dtcoordd.log otherwise)"),
    CONF("pidfile", DT_CONF_STRING, pidfile, 0, 0, 0, 0,
         "pidfile (default STATE_DIR/dtcoordd.pid)"),
    CONF("munge_socket", DT_CONF_STRING, munge_socket, 0, 0, 0, 0,
         "munged's socket (default: libmunge's)"),
    CONF("max_connections", DT_CONF_INT, max_connections, 1, 1000000, 0, 1,
         "open connections at most, root's reserve aside (default 4096)"),
    CONF("max_connections_per_user", DT_CONF_INT, max_connections_per_user, 1, 1000000, 0, 1,
         "open connections of one user other than root (default 1024)"),
    CONF("auth_timeout", DT_CONF_DURATION, auth_timeout_ms, 100, 3600000, 0, 1,
         "a TCP peer must authenticate within it (default 10s)"),
    CONF("idle_timeout", DT_CONF_DURATION, idle_timeout_ms, 100, 604800000, 0, 1,
         "a peer that sends nothing this long is closed (default 60s)"),
    CONF("output_soft_limit", DT_CONF_SIZE, output_soft_limit, 4096, (int64_t)1 << 32, 0, 1,
         "unsent replies above which a peer is not read (default 1M)"),
    CONF("output_hard_limit", DT_CONF_SIZE, output_hard_limit, (int64_t)32 << 20, (int64_t)1 << 36, 0, 1,
         "unsent replies above which a peer is closed (default 64M)"),
    CONF("output_timeout", DT_CONF_DURATION, output_timeout_ms, 100, 86400000, 0, 1,
         "a peer above output_soft_limit this long is closed (default 30s)"),
    CONF("slurm", DT_CONF_BOOL, slurm, 0, 0, 0, 0,
         "yes: submit every job to Slurm as a batch job (default no)"),
    CONF("slurm_conf", DT_CONF_STRING, slurm_conf, 0, 0, 0, 0,
         "slurm.conf (default $SLURM_CONF, else /etc/slurm/slurm.conf)"),
    CONF("slurm_agent", DT_CONF_STRING, slurm_agent, 0, 0, 0, 0,
         "dtagentd's path on the compute nodes (default SBINDIR/dtagentd)"),
    CONF("slurm_engine", DT_CONF_STRING, slurm_engine, 0, 0, 0, 0,
         "dtengine's path on the compute nodes (default: found by the agent)"),
    CONF("slurm_coord_address", DT_CONF_STRING, slurm_coord_address, 0, 0, 0, 0,
         "HOST:PORT the agents connect to (default: listen)"),
    CONF("slurm_output_dir", DT_CONF_STRING, slurm_output_dir, 0, 0, 0, 0,
         "directory of the batch jobs' output (default STATE_DIR/slurm)"),
    CONF("slurm_setup", DT_CONF_STRING, slurm_setup, 0, 0, 0, 0,
         "shell file the batch script sources before it starts the agents"),
    CONF("slurm_env", DT_CONF_STRING, slurm_env, 0, 0, 0, 0,
         "NAME=VALUE words the batch script exports"),
    CONF("slurm_poll", DT_CONF_DURATION, slurm_poll_ms, 100, 3600000, 0, 0,
         "how often slurmctld is asked about each job (default 5s)"),
    CONF("slurm_hang_timeout", DT_CONF_DURATION, slurm_hang_timeout_ms, 100, 86400000, 0, 0,
         "the agents' --hang-timeout (default theirs, 60s)"),
    CONF("slurm_signal", DT_CONF_STRING, slurm_signal, 0, 0, 0, 0,
         "Slurm's warning signal for jobs whose spec sets none: USR1 or USR2 (default USR2)"),
    { .name = NULL },
};

const dt_conf_key_t *dt_coord_conf_keys(void)
{
    return conf_keys;
}

static char *in_state(const dt_coord_conf_t *cf, const char *name)
{
    return dt_xasprintf("%s/%s", cf->state_dir, name);
}

/* Load and complete the configuration; defaults for what is unset. */
static int load_conf(const char *path, dt_coord_conf_t *cf, dt_emsg_t *em)
{
    dt_coord_conf_t n = { 0 };
    enum dt_log_level lvl;
    int rc;

    if ((rc = dt_conf_load(path, conf_keys, &n, em)) < 0)
        return rc;
    if (n.log_level && dt_log_parse_level(n.log_level, &lvl) < 0) {
        rc = dt_emsg_set(em, DT_ECONF, "%s: log_level '%s': error, warn, info or debug", path,
                         n.log_level);
        dt_conf_free(conf_keys, &n);
        return rc;
    }
    if (n.heartbeat_ms == 0)
        n.heartbeat_ms = 1000;
    if (n.agent_timeout_ms == 0)
        n.agent_timeout_ms = 10000;
    if (n.max_connections == 0)
        n.max_connections = 4096;
    if (n.max_connections_per_user == 0)
        n.max_connections_per_user = 1024;
    if (n.auth_timeout_ms == 0)
        n.auth_timeout_ms = 10000;
    if (n.idle_timeout_ms == 0)
        n.idle_timeout_ms = 60000;
    if (n.output_soft_limit == 0)
        n.output_soft_limit = 1 << 20;
    if (n.output_hard_limit == 0)
        n.output_hard_limit = (int64_t)64 << 20;
    if (n.output_timeout_ms == 0)
        n.output_timeout_ms = 30000;
    if (n.output_soft_limit >= n.output_hard_limit) {
        rc = dt_emsg_set(em, DT_ECONF, "%s: output_soft_limit (%lld bytes) must be below "
                         "output_hard_limit (%lld bytes)", path, (long long)n.output_soft_limit,
                         (long long)n.output_hard_limit);
        dt_conf_free(conf_keys, &n);
        return rc;
    }
    if (n.agent_timeout_ms <= n.heartbeat_ms) {
        rc = dt_emsg_set(em, DT_ECONF, "%s: agent_timeout (%lld ms) must exceed heartbeat "
                         "(%lld ms)", path, (long long)n.agent_timeout_ms,
                         (long long)n.heartbeat_ms);
        dt_conf_free(conf_keys, &n);
        return rc;
    }
    /* slurm = yes: the agents must have an address to connect back to,
     * and slurm_env must be NAME=VALUE words (alloc.c uses both) */
    if (n.slurm && !(n.listen && *n.listen) &&
        !(n.slurm_coord_address && *n.slurm_coord_address)) {
        rc = dt_emsg_set(em, DT_ECONF, "%s: slurm = yes needs listen (the agents on the "
                         "compute nodes connect back over TCP)", path);
        dt_conf_free(conf_keys, &n);
        return rc;
    }
    for (const char *w = n.slurm_env; w && *w;) {
        size_t len = strcspn(w, " \t");
        const char *eq = memchr(w, '=', len);
        if (len > 0 && (eq == NULL || eq == w)) {
            rc = dt_emsg_set(em, DT_ECONF, "%s: slurm_env: '%.*s' is not NAME=VALUE", path,
                             (int)len, w);
            dt_conf_free(conf_keys, &n);
            return rc;
        }
        w += len;
        w += strspn(w, " \t");
    }
    if (n.listen && n.metrics_listen && *n.listen && strcmp(n.listen, n.metrics_listen) == 0) {
        rc = dt_emsg_set(em, DT_ECONF, "%s: metrics_listen is listen's address (%s): the "
                         "metrics endpoint needs its own port", path, n.listen);
        dt_conf_free(conf_keys, &n);
        return rc;
    }
    /* the daemon runs from /: make every path absolute while we know the
     * directory it was started in */
    char **paths[] = { &n.state_dir, &n.socket, &n.log_file, &n.pidfile, &n.munge_socket,
                       &n.slurm_conf, &n.slurm_output_dir, &n.jobs_dir };
    char cwd[4096];
    for (size_t i = 0; i < sizeof(paths) / sizeof(paths[0]); i++) {
        char *p = *paths[i];
        if (p && p[0] != '/' && getcwd(cwd, sizeof(cwd)) != NULL) {
            *paths[i] = dt_xasprintf("%s/%s", cwd, p);
            free(p);
        }
    }
    if (n.socket == NULL)
        n.socket = in_state(&n, "dtcoordd.sock");
    if (n.pidfile == NULL)
        n.pidfile = in_state(&n, "dtcoordd.pid");
    if (n.jobs_dir == NULL)
        n.jobs_dir = in_state(&n, "jobs");
    *cf = n;
    return 0;
}

/* STATE_DIR: made 0711 when missing; when it is ours, its mode becomes
 * 0711 (others reach the socket in it and their job directories under the
 * default jobs_dir, but cannot list it). One that is not ours is refused:
 * whoever owns it could swap the database. */
static int private_state_dir(const char *dir, dt_emsg_t *em)
{
    struct stat st;

    if (dt_mkdirs(dir, 0711) < 0 || lstat(dir, &st) < 0)
        return dt_emsg_set(em, dt_err_errno(errno), "state_dir %s: %s", dir, strerror(errno));
    if (!S_ISDIR(st.st_mode))
        return dt_emsg_set(em, DT_ECONF, "state_dir %s: not a directory", dir);
    if (st.st_uid != geteuid())
        return dt_emsg_set(em, DT_EPERM, "state_dir %s belongs to uid %u, not to dtcoordd's "
                           "uid %u", dir, (unsigned)st.st_uid, (unsigned)geteuid());
    if ((st.st_mode & 07777) != 0711 && chmod(dir, 0711) < 0)
        return dt_emsg_set(em, dt_err_errno(errno), "state_dir %s: chmod 0711: %s", dir,
                           strerror(errno));
    return 0;
}

/* The database and SQLite's -wal and -shm beside it: 0600, also when an
 * older dtcoordd made them 0644. */
static int private_db_files(const char *db, dt_emsg_t *em)
{
    static const char *const sfx[] = { "", "-wal", "-shm" };

    for (size_t i = 0; i < sizeof(sfx) / sizeof(sfx[0]); i++) {
        char *p = dt_xasprintf("%s%s", db, sfx[i]);
        struct stat st;
        int rc = 0;
        if (lstat(p, &st) == 0 && (st.st_mode & 077) != 0 && chmod(p, st.st_mode & 0700) < 0)
            rc = dt_emsg_set(em, dt_err_errno(errno), "%s: chmod: %s", p, strerror(errno));
        free(p);
        if (rc < 0)
            return rc;
    }
    return 0;
}

static void apply_log_level(const dt_coord_conf_t *cf)
{
    enum dt_log_level lvl = DT_LOG_INFO;
    if (cf->log_level)
        dt_log_parse_level(cf->log_level, &lvl);
    dt_log_set_level(lvl);
}

/* SIGHUP: re-read the file; apply what may change while running. */
static void reload(dt_coord_t *c)
{
    dt_coord_conf_t n;
    dt_emsg_t em = { "" };

    if (load_conf(c->conf_path, &n, &em) < 0) {
        dt_log_error("reload refused, keeping the running configuration: %s", em.s);
        return;
    }
    const char *fixed[][3] = {
        { "state_dir", c->conf.state_dir, n.state_dir },
        { "socket", c->conf.socket, n.socket },
        { "listen", c->conf.listen, n.listen },
        { "metrics_listen", c->conf.metrics_listen, n.metrics_listen },
        { "log_file", c->conf.log_file, n.log_file },
        { "pidfile", c->conf.pidfile, n.pidfile },
        { "munge_socket", c->conf.munge_socket, n.munge_socket },
        { "jobs_dir", c->conf.jobs_dir, n.jobs_dir },
    };
    for (size_t i = 0; i < sizeof(fixed) / sizeof(fixed[0]); i++) {
        const char *a = fixed[i][1] ? fixed[i][1] : "", *b = fixed[i][2] ? fixed[i][2] : "";
        if (strcmp(a, b) != 0)
            dt_log_warn("reload: %s changed: restart dtcoordd to apply it", fixed[i][0]);
    }
    c->conf.heartbeat_ms = n.heartbeat_ms;
    c->conf.agent_timeout_ms = n.agent_timeout_ms;
    c->conf.max_connections = n.max_connections;
    c->conf.max_connections_per_user = n.max_connections_per_user;
    c->conf.auth_timeout_ms = n.auth_timeout_ms;
    c->conf.idle_timeout_ms = n.idle_timeout_ms;
    c->conf.output_soft_limit = n.output_soft_limit;
    c->conf.output_hard_limit = n.output_hard_limit;
    c->conf.output_timeout_ms = n.output_timeout_ms;
    free(c->conf.admin_group);
    c->conf.admin_group = n.admin_group ? dt_xstrdup(n.admin_group) : NULL;
    free(c->conf.log_level);
    c->conf.log_level = n.log_level ? dt_xstrdup(n.log_level) : NULL;
    apply_log_level(&c->conf);
    dt_conf_free(conf_keys, &n);
    dt_log_info("configuration reloaded from %s", c->conf_path);
}

/* ---- loop ----------------------------------------------------------------------- */

static void stop(dt_coord_t *c);

static void on_signal(uv_signal_t *s, int signum)
{
    dt_coord_t *c = s->data;

    if (signum == SIGHUP) {
        reload(c);
        return;
    }
    dt_log_info("signal %d: stopping", signum);
    stop(c);
}

static void on_sweep(uv_timer_t *t)
{
    dt_recovery_sweep(t->data);
    dt_conn_sweep(t->data);
    dt_metrics_sweep(t->data);
}

/* The calls up the layers (coord.h): requests to the RPC table, faults to
 * the recovery policy. */
static const dt_coord_hooks_t hooks = {
    .dispatch = dt_rpc_dispatch,
    .fault = dt_recovery_fault,
    .job_ended = dt_recovery_job_ended,
};

static void stop(dt_coord_t *c)
{
    if (c->stopping)
        return;
    c->stopping = 1;
    dt_metrics_close(c);
    if (c->have_unix)
        uv_close((uv_handle_t *)&c->unix_srv, NULL);
    if (c->have_tcp)
        uv_close((uv_handle_t *)&c->tcp_srv, NULL);
    for (dt_conn_t *k = c->conns; k; k = k->next)
        dt_conn_close(k);
    uv_close((uv_handle_t *)&c->sweep, NULL);
    dt_alloc_close(c);
    uv_close((uv_handle_t *)&c->sig_term, NULL);
    uv_close((uv_handle_t *)&c->sig_int, NULL);
    uv_close((uv_handle_t *)&c->sig_hup, NULL);
}

static void usage(FILE *f)
{
    fprintf(f, "usage: dtcoordd [-D] [-f CONFIG] [-v] [-h]\n"
               "  -D         stay in the foreground, log to stderr\n"
               "  -f CONFIG  configuration file (default %s)\n"
               "  -v         print the version\n"
               "  -h         this help\n"
               "See dtcoordd(8) and dt.conf(5).\n",
            DT_SYSCONFDIR "/dt.conf");
}

int main(int argc, char **argv)
{
    dt_coord_t c = { .hooks = &hooks, .lock_fd = -1, .jobs_fd = -1 };
    dt_emsg_t em = { "" };
    int foreground = 0, status_fd = -1, opt, rc, code = 1, logfd = -1;
    const char *conf_path = DT_SYSCONFDIR "/dt.conf";
    char *dbpath = NULL;
    uv_loop_t loop;

    /* arguments */
    while ((opt = getopt(argc, argv, "Df:vh")) != -1) {
        switch (opt) {
        case 'D': foreground = 1; break;
        case 'f': conf_path = optarg; break;
        case 'v': printf("dtcoordd %s\n", PACKAGE_VERSION); return 0;
        case 'h': usage(stdout); return 0;
        default: usage(stderr); return 2;
        }
    }
    if (optind < argc) {
        usage(stderr);
        return 2;
    }

    /* configuration and logging */
    dt_log_init("dtcoordd", DT_LOG_INFO);
    c.conf_path = conf_path;
    if (load_conf(conf_path, &c.conf, &em) < 0) {
        fprintf(stderr, "dtcoordd: %s\n", em.s);
        return 2;
    }
    apply_log_level(&c.conf);
    /* everything the coordinator creates is its own: the database, its
     * journal, the log (dtcoordd(8) SECURITY) */
    umask(077);
    if ((rc = private_state_dir(c.conf.state_dir, &em)) < 0) {
        fprintf(stderr, "dtcoordd: %s\n", em.s);
        goto out_conf;
    }
    if (!foreground || c.conf.log_file) {
        char *lf = c.conf.log_file ? dt_xstrdup(c.conf.log_file) : in_state(&c.conf, "dtcoordd.log");
        logfd = open(lf, O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC | O_NOFOLLOW, 0600);
        if (logfd < 0 || fchmod(logfd, 0600) < 0) {
            fprintf(stderr, "dtcoordd: log_file %s: %s\n", lf, strerror(errno));
            free(lf);
            goto out_conf;
        }
        free(lf);
        dt_log_set_fd(logfd);
        dt_log_set_timestamps(1);
    }

    /* daemonise: the parent waits for our word */
    if (!foreground && dt_daemon_start(&status_fd, &em) < 0) {
        fprintf(stderr, "dtcoordd: %s\n", em.s);
        goto out_conf;
    }
    signal(SIGPIPE, SIG_IGN);
    if (!foreground && chdir("/") < 0) {
        dt_emsg_set(&em, DT_EIO, "chdir /: %s", strerror(errno));
        goto fail;
    }

    /* pidfile, database, listeners */
    if ((rc = dt_pidfile_lock(c.conf.pidfile, &em)) < 0)
        goto fail;
    c.lock_fd = rc;
    dbpath = in_state(&c.conf, "dt.db");
    if (dt_db_open(dbpath, &c.db, &em) < 0 || (rc = private_db_files(dbpath, &em)) < 0)
        goto fail;
    if ((rc = dt_jobdir_open_root(c.conf.jobs_dir, &em)) < 0)
        goto fail;
    c.jobs_fd = rc;
    uv_loop_init(&loop);
    loop.data = &c;
    c.loop = &loop;
    c.started_ms = dt_clock_mono_ms();
    uv_signal_init(&loop, &c.sig_term);
    uv_signal_init(&loop, &c.sig_int);
    uv_signal_init(&loop, &c.sig_hup);
    uv_timer_init(&loop, &c.sweep);
    c.sig_term.data = c.sig_int.data = c.sig_hup.data = c.sweep.data = &c;
    if (dt_run_reload(&c, &em) < 0)
        dt_log_warn("reloading running jobs: %s", em.s);
    if (dt_jobs_reload_agents(&c, &em) < 0)
        goto fail_loop;
    if (dt_listen_unix(&c, c.conf.socket, &em) < 0)
        goto fail_loop;
    if (c.conf.listen && *c.conf.listen && dt_listen_tcp(&c, c.conf.listen, &em) < 0)
        goto fail_loop;
    if (c.conf.metrics_listen && *c.conf.metrics_listen &&
        dt_metrics_listen(&c, c.conf.metrics_listen, &em) < 0)
        goto fail_loop;
    if (dt_alloc_init(&c, &em) < 0)
        goto fail_loop;

    /* signals and the agent sweep */
    uv_signal_start(&c.sig_term, on_signal, SIGTERM);
    uv_signal_start(&c.sig_int, on_signal, SIGINT);
    uv_signal_start(&c.sig_hup, on_signal, SIGHUP);
    uv_timer_start(&c.sweep, on_sweep, 250, 250);

    dt_log_info("started pid=%ld db=%s socket=%s listen=%s metrics_listen=%s schema=%d",
                (long)getpid(), dbpath, c.conf.socket,
                c.conf.listen && *c.conf.listen ? c.conf.listen : "-",
                c.conf.metrics_listen && *c.conf.metrics_listen ? c.conf.metrics_listen : "-",
                dt_db_version(c.db));
    dt_daemon_ready(status_fd, NULL);
    status_fd = -1;

    uv_run(&loop, UV_RUN_DEFAULT);

    /* teardown, in reverse */
    dt_log_info("stopped");
    code = 0;
    unlink(c.conf.socket);
    goto out_loop;

fail_loop:
    stop(&c);
    uv_run(&loop, UV_RUN_DEFAULT);
fail:
    dt_log_error("%s", em.s);
    if (foreground && logfd >= 0) /* the log went to a file: say it here too */
        fprintf(stderr, "dtcoordd: %s\n", em.s);
    dt_daemon_ready(status_fd, em.s);
    if (c.loop == NULL)
        goto out_db;
out_loop:
    while (c.agents)
        dt_coord_agent_remove(&c, c.agents->id);
    free(c.agent_tab);
    uv_loop_close(&loop);
    dt_run_free_all(&c);
    dt_alloc_free(&c);
out_db:
    dt_db_close(c.db);
    if (c.jobs_fd >= 0)
        close(c.jobs_fd);
    if (c.lock_fd >= 0) {
        unlink(c.conf.pidfile);
        close(c.lock_fd);
    }
    free(dbpath);
out_conf:
    dt_conf_free(conf_keys, &c.conf);
    if (logfd >= 0)
        close(logfd);
    return code;
}
