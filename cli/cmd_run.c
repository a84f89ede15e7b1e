/* SPDX-License-Identifier: MIT
 *
 * dtctl run --local: the embedded default. One command runs a job on this
 * machine with nothing else installed or running: a private dtcoordd on a
 * state directory of the user's (database, socket, logs), the job submitted
 * to it, N local dtagentd (each running M dtengine workers; K more agents as
 * hot spares), the live display of `dtctl watch`, and the result. On request
 * it injects one failure (a worker killed or stopped, an agent killed, the
 * coordinator killed and restarted) to show the job recover.
 *
 * dtctl supervises what it starts with plain fork/exec/waitpid: every child
 * in its own process group (so a terminal's Ctrl-C reaches dtctl alone, and
 * dtctl decides the order of shutdown) with SIGTERM as its parent-death
 * signal, and dtctl a child subreaper, so workers orphaned by a killed agent
 * come back to it. On every way out (the job ends, an error, SIGINT, SIGTERM
 * or SIGHUP) it cancels a job that has not ended, stops the agents (TERM,
 * then KILL), kills any orphan left, and stops the coordinator. A second
 * signal kills everything at once. The state directory stays.
 *
 * Not here: Slurm (dtctl submit), keeping the job running after dtctl exits.
 */
#include "config.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <getopt.h>
#include <limits.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/prctl.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "cli/dtctl.h"
#include "common/clock.h"
#include "common/conf.h"
#include "common/fileio.h"
#include "common/mem.h"
#include "common/path.h"
#include "common/text.h"
#include "common/proto.h"
#include "engine/spec.h"

/* The job without a SPECFILE: a tiny LLaMA-style model learns a generated
 * long-context recall task (key-value pairs planted in the sequence,
 * queried at its end) over a ring of 4 CPU ranks on 2 agents, so its
 * accuracy shows attention working across rank boundaries. */
static const char default_spec[] =
    "# dtctl run --local: the default job (dt-spec(5)). A 2-layer LLaMA-3\n"
    "# shape on the recall task, 1024 tokens over a ring of 4 CPU ranks on 2\n"
    "# agents: the pairs sit on other ranks than the queries, so recall above\n"
    "# chance (1/16) needs attention across rank boundaries. About 4 minutes\n"
    "# on 2 cores.\n"
    "name = local-recall\n"
    "kind = train\n"
    "model = custom\n"
    "dim = 128\n"
    "layers = 2\n"
    "heads = 4\n"
    "kv_heads = 2\n"
    "ffn = 384\n"
    "vocab = 512\n"
    "data = recall\n"
    "tokens = 1024\n"
    "batch = 2\n"
    "steps = 600\n"
    "seed = 1\n"
    "ranks = 4\n"
    "nodes = 2\n"
    "gpus_per_node = 2\n"
    "gpu = cpu\n"
    "ckpt_every = 100\n"
    "recall_keys = 16\n"
    "recall_values = 16\n"
    "recall_pairs = 4\n"
    "recall_queries = 4\n";

#define MAX_AGENTS 64        /* agents and spares together */
#define START_TIMEOUT_S 15.0 /* dtcoordd must answer PING within this */
#define AGENTS_STOP_S 8.0    /* agents stop their workers within this after TERM */
#define COORD_STOP_S 10.0
#define AGENTS_GONE_S 15.0   /* every agent gone and the job not over: give up */
#define RESTART_DELAY_S 1.0  /* coordinator fault: down this long */

/* Failures --inject-failure knows. */
enum inject { INJ_NONE, INJ_WORKER, INJ_HANG, INJ_AGENT, INJ_COORD };
static const char *const inject_names[] = { "none", "worker", "hang", "agent", "coordinator" };

/* A process dtctl started. */
typedef struct proc {
    char name[32]; /* "dtcoordd", "local1" */
    char *log;
    pid_t pid;
    int ended;     /* reaped; status is its wait status */
    int status;
    int expected;  /* we stopped or killed it: its end is no news */
} proc_t;

typedef struct run {
    dtctl_t *ctl;  /* the caller's (prog, json) */
    dtctl_t local; /* requests to our coordinator */
    FILE *out;     /* informational lines: stdout, or stderr with --json */
    char *dir, *conf, *sock, *pidfile;
    char *coordd, *agentd, *engine;
    proc_t coord;
    proc_t agents[MAX_AGENTS];
    int nagents, nspares, workers;
    long long job;
    int64_t interval_ms, hang_ms;
    /* the fault to inject, once */
    enum inject inject;
    long long inject_step;
    int injected;
    pid_t stopped; /* a worker we SIGSTOPped */
    double restart_at; /* the coordinator is due to start again (monotonic) */
    double agents_gone_since;
    int registered; /* agents in the latest SHOW reply */
    char state[32]; /* the job's state in the latest SHOW reply */
} run_t;

/* ---- signals -------------------------------------------------------------
 * The handler needs the process groups to kill on a second signal, so they
 * live here, in the only mutable globals of dtctl: a signal handler cannot
 * be given a context. */

static volatile sig_atomic_t got_signal; /* the first signal, 0 for none */
static volatile sig_atomic_t nsignals;
static pid_t groups[MAX_AGENTS + 64];
static volatile sig_atomic_t ngroups;

/* The parent pid in /proc/PID/stat, with system calls only. */
static long ppid_raw(const char *pid)
{
    char path[64] = "/proc/", buf[512];
    size_t n = 6;
    ssize_t len;
    int fd;

    for (const char *c = pid; *c && n < sizeof(path) - 8; c++)
        path[n++] = *c;
    memcpy(path + n, "/stat", 6);
    if ((fd = open(path, O_RDONLY | O_CLOEXEC)) < 0)
        return 0;
    len = read(fd, buf, sizeof(buf) - 1);
    close(fd);
    if (len <= 0)
        return 0;
    /* "pid (comm) S ppid ...": the last ')' ends comm */
    char *p = NULL;
    for (ssize_t i = 0; i < len; i++)
        if (buf[i] == ')')
            p = buf + i;
    if (p == NULL || p + 4 >= buf + len)
        return 0;
    long ppid = 0;
    for (p += 4; p < buf + len && *p >= '0' && *p <= '9'; p++)
        ppid = ppid * 10 + (*p - '0');
    return ppid;
}

/* SIGKILL every child of dtctl, found in /proc with system calls only, so
 * that a signal handler may call it. */
static void kill_children_raw(void)
{
    struct d64 {
        uint64_t ino;
        int64_t off;
        unsigned short reclen;
        unsigned char type;
        char name[];
    };
    char buf[4096] __attribute__((aligned(8)));
    long self = (long)getpid(), got;
    int dfd = open("/proc", O_RDONLY | O_DIRECTORY | O_CLOEXEC);

    if (dfd < 0)
        return;
    while ((got = syscall(SYS_getdents64, dfd, buf, sizeof(buf))) > 0)
        for (long off = 0; off < got;) {
            struct d64 *d = (struct d64 *)(void *)(buf + off);
            long pid = 0;
            const char *c = d->name;
            off += d->reclen;
            for (; *c >= '0' && *c <= '9'; c++)
                pid = pid * 10 + (*c - '0');
            if (*c == '\0' && pid > 0 && ppid_raw(d->name) == self)
                kill((pid_t)pid, SIGKILL);
        }
    close(dfd);
}

static void on_signal(int sig)
{
    static const char msg[] = "\ndtctl run: killing everything now\n";
    struct timespec ts = { 0, 20 * 1000000L };

    if (got_signal == 0)
        got_signal = sig;
    if (++nsignals < 2)
        return;
    /* the second one: no more patience; only async-signal-safe calls. The
     * groups hold the agents and their workers; what they leave orphaned
     * comes to us (the subreaper) and is killed until no child is left. */
    if (write(STDERR_FILENO, msg, sizeof(msg) - 1) < 0) {
        /* nothing to do about it */
    }
    for (int i = 0; i < ngroups; i++)
        kill(-groups[i], SIGKILL);
    for (int round = 0; round < 100; round++) {
        kill_children_raw();
        while (waitpid(-1, NULL, WNOHANG) > 0)
            ;
        if (waitpid(-1, NULL, WNOHANG) < 0 && errno == ECHILD)
            break;
        nanosleep(&ts, NULL);
    }
    _exit(128 + sig);
}

static void add_group(pid_t pid)
{
    if (ngroups < (int)(sizeof(groups) / sizeof(groups[0]))) {
        groups[ngroups] = pid;
        ngroups = ngroups + 1;
    }
}

static void signals_install(void)
{
    struct sigaction sa;

    memset(&sa, 0, sizeof(sa));
    sa.sa_handler = on_signal; /* no SA_RESTART: sleeps and waits end early */
    sigemptyset(&sa.sa_mask);
    sigaction(SIGINT, &sa, NULL);
    sigaction(SIGTERM, &sa, NULL);
    sigaction(SIGHUP, &sa, NULL);
}

/* ---- processes ----------------------------------------------------------- */

static const char *status_str(int st, char *buf, size_t n)
{
    if (WIFEXITED(st))
        snprintf(buf, n, "exited with status %d", WEXITSTATUS(st));
    else if (WIFSIGNALED(st))
        snprintf(buf, n, "was killed by signal %d (%s)", WTERMSIG(st), strsignal(WTERMSIG(st)));
    else
        snprintf(buf, n, "ended (wait status %#x)", (unsigned)st);
    return buf;
}

static int alive(const proc_t *p)
{
    return p->pid > 0 && !p->ended;
}

/* Collect every child that ended: ours, and orphans handed to us as the
 * subreaper (reaped so they do not stay zombies). */
static void reap(run_t *r)
{
    pid_t pid;
    int st;

    while ((pid = waitpid(-1, &st, WNOHANG)) > 0) {
        proc_t *p = NULL;
        if (pid == r->coord.pid)
            p = &r->coord;
        for (int i = 0; i < r->nagents + r->nspares && p == NULL; i++)
            if (r->agents[i].pid == pid)
                p = &r->agents[i];
        if (p && !p->ended) {
            p->ended = 1;
            p->status = st;
        }
    }
}

/* Wait until none of the n processes is alive, at most secs. Returns 1
 * when they all ended. */
static int wait_gone(run_t *r, proc_t *const *ps, int n, double secs)
{
    double until = dt_clock_now() + secs;
    struct timespec ts = { 0, 20 * 1000000L };

    for (;;) {
        int left = 0;
        reap(r);
        for (int i = 0; i < n; i++)
            left += alive(ps[i]);
        if (left == 0)
            return 1;
        if (dt_clock_now() >= until)
            return 0;
        nanosleep(&ts, NULL);
    }
}

/* Start argv[0] with stdin from /dev/null and stdout and stderr appended to
 * p->log, in its own process group, with SIGTERM when dtctl dies. Returns
 * 0, or a negative dt code with a message (nothing left running). */
static int spawn(run_t *r, proc_t *p, char *const argv[], dt_emsg_t *em)
{
    int logfd, nullfd, pfd[2], err = 0;
    pid_t parent = getpid(), pid;
    ssize_t n;

    if ((logfd = open(p->log, O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0600)) < 0)
        return dt_emsg_set(em, dt_err_errno(errno), "log %s: %s", p->log, strerror(errno));
    if ((nullfd = open("/dev/null", O_RDONLY | O_CLOEXEC)) < 0 || pipe2(pfd, O_CLOEXEC) < 0) {
        int e = errno;
        close(logfd);
        if (nullfd >= 0)
            close(nullfd);
        return dt_emsg_set(em, dt_err_errno(e), "cannot start %s: %s", argv[0], strerror(e));
    }
    /* no handler of ours may run in the child between fork and exec */
    sigset_t block, old;
    sigemptyset(&block);
    sigaddset(&block, SIGINT);
    sigaddset(&block, SIGTERM);
    sigaddset(&block, SIGHUP);
    sigprocmask(SIG_BLOCK, &block, &old);
    fflush(NULL);
    if ((pid = fork()) < 0) {
        err = errno;
    } else if (pid == 0) {
        sigset_t none;
        setpgid(0, 0);
        prctl(PR_SET_PDEATHSIG, SIGTERM);
        if (getppid() != parent) /* dtctl died before the line above */
            _exit(127);
        signal(SIGINT, SIG_DFL);
        signal(SIGTERM, SIG_DFL);
        signal(SIGHUP, SIG_DFL);
        sigemptyset(&none);
        sigprocmask(SIG_SETMASK, &none, NULL);
        if (dup2(nullfd, 0) < 0 || dup2(logfd, 1) < 0 || dup2(logfd, 2) < 0)
            _exit(127);
        execv(argv[0], argv);
        err = errno;
        if (write(pfd[1], &err, sizeof(err)) < 0)
            _exit(127);
        _exit(127);
    }
    if (pid > 0) {
        setpgid(pid, pid); /* also here: whichever runs first, the group exists */
        add_group(pid);
    }
    sigprocmask(SIG_SETMASK, &old, NULL);
    close(pfd[1]);
    close(logfd);
    close(nullfd);
    if (pid < 0) {
        close(pfd[0]);
        return dt_emsg_set(em, dt_err_errno(err), "cannot start %s: fork: %s", argv[0],
                           strerror(err));
    }
    /* the pipe closes on a successful exec, or carries its errno */
    while ((n = read(pfd[0], &err, sizeof(err))) < 0 && errno == EINTR)
        ;
    close(pfd[0]);
    if (n == (ssize_t)sizeof(err)) {
        waitpid(pid, NULL, 0);
        return dt_emsg_set(em, dt_err_errno(err), "cannot run %s: %s", argv[0], strerror(err));
    }
    p->pid = pid;
    p->ended = p->status = p->expected = 0;
    return 0;
}

/* The parent of a process, from /proc (0 when it is gone). */
static pid_t parent_of(pid_t pid)
{
    char path[64], buf[512];
    FILE *f;
    size_t n;
    long ppid = 0;

    snprintf(path, sizeof(path), "/proc/%ld/stat", (long)pid);
    if ((f = fopen(path, "re")) == NULL)
        return 0;
    n = fread(buf, 1, sizeof(buf) - 1, f);
    fclose(f);
    buf[n] = '\0';
    /* "pid (comm) state ppid ...": comm may hold anything, even ')' */
    char *close_paren = strrchr(buf, ')');
    if (close_paren == NULL || sscanf(close_paren + 1, " %*c %ld", &ppid) != 1)
        return 0;
    return (pid_t)ppid;
}

/* Signal every child of dtctl but the coordinator: orphans of agents that
 * died, handed to us as the subreaper. Returns how many there were. */
static int signal_orphans(run_t *r, int sig)
{
    DIR *d = opendir("/proc");
    struct dirent *e;
    pid_t self = getpid();
    int n = 0;

    if (d == NULL)
        return 0;
    while ((e = readdir(d)) != NULL) {
        char *end;
        long pid = strtol(e->d_name, &end, 10);
        if (*end || pid <= 0 || (pid_t)pid == r->coord.pid || parent_of((pid_t)pid) != self)
            continue;
        int ours = 0;
        for (int i = 0; i < r->nagents + r->nspares; i++)
            ours |= alive(&r->agents[i]) && r->agents[i].pid == (pid_t)pid;
        if (!ours && kill((pid_t)pid, sig) == 0)
            n++;
    }
    closedir(d);
    return n;
}

/* Print the last lines of a log, indented, on stderr. */
static void log_tail(const char *path, int lines)
{
    char buf[4096];
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    off_t size;
    ssize_t n;

    if (fd < 0)
        return;
    size = lseek(fd, 0, SEEK_END);
    if (size > (off_t)sizeof(buf) - 1)
        lseek(fd, size - (off_t)sizeof(buf) + 1, SEEK_SET);
    else
        lseek(fd, 0, SEEK_SET);
    n = read(fd, buf, sizeof(buf) - 1);
    close(fd);
    if (n <= 0)
        return;
    buf[n] = '\0';
    char *p = buf + n;
    if (p > buf && p[-1] == '\n')
        *--p = '\0';
    for (int k = 0; p > buf && k < lines; k++)
        for (p--; p > buf && p[-1] != '\n'; p--)
            ;
    for (char *line = strtok(p, "\n"); line; line = strtok(NULL, "\n")) {
        char *e = dt_text_escape(line, DT_TEXT_KEEP_LINES); /* a log quotes others' text */
        fprintf(stderr, "    %s\n", e);
        free(e);
    }
}

/* ---- finding the programs --------------------------------------------------- */

/* $env if set; else beside dtctl (rel: paths relative to its directory,
 * the build tree's and the installed layout's); else in $PATH. */
static char *find_prog(const char *env, const char *name, const char *const *rel, int nrel,
                       dt_emsg_t *em)
{
    const char *v = getenv(env), *path = getenv("PATH");
    char *dir = dt_path_self_dir(), *p, real[PATH_MAX];

    if (v && *v) {
        free(dir);
        if (access(v, X_OK) == 0)
            return realpath(v, real) ? dt_xstrdup(real) : dt_xstrdup(v);
        dt_emsg_set(em, DT_ENOENT, "%s=%s: %s", env, v, strerror(errno));
        return NULL;
    }
    if ((p = dt_path_beside(dir, rel, (size_t)nrel, DT_PATH_REAL)) != NULL) {
        free(dir);
        return p;
    }
    for (const char *s = path ? path : ""; *s;) {
        size_t len = strcspn(s, ":");
        p = dt_xasprintf("%.*s/%s", (int)len, s, name);
        if (len > 0 && p[0] == '/' && access(p, X_OK) == 0) {
            free(dir);
            return p;
        }
        free(p);
        s += len + (s[len] == ':');
    }
    dt_emsg_set(em, DT_ENOENT, "cannot find %s: not beside dtctl (%s), not in PATH; set %s",
                name, dir ? dir : "?", env);
    free(dir);
    return NULL;
}

static int find_programs(run_t *r, dt_emsg_t *em)
{
    static const char *const coordd[] = { "../coordinator/dtcoordd", "../sbin/dtcoordd",
                                          "dtcoordd" };
    static const char *const agentd[] = { "../agent/dtagentd", "../sbin/dtagentd", "dtagentd" };
    static const char *const engine[] = { "../engine/dtengine", "dtengine", "../bin/dtengine" };

    if ((r->coordd = find_prog("DT_COORDD", "dtcoordd", coordd, 3, em)) == NULL ||
        (r->agentd = find_prog("DT_AGENTD", "dtagentd", agentd, 3, em)) == NULL ||
        (r->engine = find_prog("DT_ENGINE", "dtengine", engine, 3, em)) == NULL)
        return DT_ENOENT;
    return 0;
}

/* ---- the state directory ------------------------------------------------------ */

/* --state-dir, else $XDG_STATE_HOME/dt, else $HOME/.local/state/dt; made
 * (0700) and absolute. */
static int state_dir(run_t *r, const char *opt, dt_emsg_t *em)
{
    const char *xdg = getenv("XDG_STATE_HOME"), *home = getenv("HOME");
    char *dir, real[PATH_MAX];
    int rc;

    if (opt)
        dir = dt_xstrdup(opt);
    else if (xdg && xdg[0] == '/') /* XDG: a relative value is to be ignored */
        dir = dt_xasprintf("%s/dt", xdg);
    else if (home && *home)
        dir = dt_xasprintf("%s/.local/state/dt", home);
    else
        return dt_emsg_set(em, DT_EINVAL, "no state directory: HOME is not set; give --state-dir");
    if (strpbrk(dir, "\n\r")) {
        rc = dt_emsg_set(em, DT_EINVAL, "state directory '%s': a newline in the path", dir);
        free(dir);
        return rc;
    }
    if ((rc = dt_mkdirs(dir, 0700)) < 0 || realpath(dir, real) == NULL) {
        rc = dt_emsg_set(em, rc < 0 ? dt_err_errno(-rc) : dt_err_errno(errno),
                         "state directory %s: %s", dir, strerror(rc < 0 ? -rc : errno));
        free(dir);
        return rc;
    }
    free(dir);
    r->dir = dt_xstrdup(real);
    r->conf = dt_xasprintf("%s/dt.conf", r->dir);
    r->sock = dt_xasprintf("%s/dtcoordd.sock", r->dir);
    r->pidfile = dt_xasprintf("%s/dtcoordd.pid", r->dir);
    r->coord.log = dt_xasprintf("%s/dtcoordd.log", r->dir);
    snprintf(r->coord.name, sizeof(r->coord.name), "dtcoordd");
    if (strlen(r->sock) > 107)
        return dt_emsg_set(em, DT_EINVAL, "state directory %s: the socket path %s is longer "
                           "than a Unix socket allows (107 bytes); give a shorter --state-dir",
                           r->dir, r->sock);
    r->local.socket = r->sock;
    return 0;
}

/* Refuse a state directory that a coordinator holds: its pidfile is locked
 * (checked first: it cannot hang), or its socket answers. */
static int state_dir_free(run_t *r, dt_emsg_t *em)
{
    int fd = open(r->pidfile, O_RDONLY | O_CLOEXEC);
    json_t *res = NULL;
    dt_emsg_t ignored = { "" };

    if (fd >= 0) {
        if (flock(fd, LOCK_SH | LOCK_NB) < 0 && errno == EWOULDBLOCK) {
            char pid[32] = "";
            ssize_t n = read(fd, pid, sizeof(pid) - 1);
            pid[n > 0 ? n : 0] = '\0';
            pid[strcspn(pid, "\n")] = '\0';
            close(fd);
            return dt_emsg_set(em, DT_EEXIST, "a coordinator (pid %s) already runs in %s (its "
                               "pidfile %s is locked): stop it, or give another --state-dir",
                               pid[0] ? pid : "?", r->dir, r->pidfile);
        }
        close(fd);
    }
    if (dtctl_request(&r->local, DT_MSG_PING, NULL, &res, &ignored) == 0) {
        json_decref(res);
        return dt_emsg_set(em, DT_EEXIST, "a coordinator already answers on %s: stop it, or "
                           "give another --state-dir", r->sock);
    }
    return 0;
}

/* A quoted conf value: \" and \\ escaped. */
static void put_conf(FILE *f, const char *key, const char *val)
{
    fprintf(f, "%s = \"", key);
    for (const char *c = val; *c; c++) {
        if (*c == '"' || *c == '\\')
            fputc('\\', f);
        fputc(*c, f);
    }
    fputs("\"\n", f);
}

/* DIR/dt.conf, written anew on every run (atomically: common/fileio.h). */
static int write_conf(run_t *r, dt_emsg_t *em)
{
    char *text = NULL;
    size_t len = 0;
    FILE *f = open_memstream(&text, &len);
    int rc;

    if (f == NULL)
        return dt_emsg_set(em, dt_err_errno(errno), "%s: %s", r->conf, strerror(errno));
    fprintf(f, "# dt.conf(5) of `dtctl run --local`, written anew by every run\n");
    put_conf(f, "state_dir", r->dir);
    put_conf(f, "socket", r->sock);
    put_conf(f, "pidfile", r->pidfile);
    put_conf(f, "log_file", r->coord.log);
    fprintf(f, "log_level = info\n");
    /* a lost agent is noticed within seconds, not the default 10 s */
    fprintf(f, "heartbeat = 500ms\nagent_timeout = 5s\n");
    if (fclose(f) != 0) {
        free(text);
        return dt_emsg_set(em, DT_ENOMEM, "%s: %s", r->conf, strerror(ENOMEM));
    }
    rc = dt_file_write_atomic(r->conf, text, len, 0600, 0, em);
    free(text);
    return rc;
}

/* A line in a log before a process of this run writes to it. */
static void log_banner(const char *path, const char *what)
{
    FILE *f = fopen(path, "ae");
    time_t now = time(NULL);
    char when[64];

    if (f == NULL)
        return;
    strftime(when, sizeof(when), "%Y-%m-%d %H:%M:%S", localtime(&now));
    fprintf(f, "---- %s: %s, started by dtctl run --local (pid %ld)\n", when, what,
            (long)getpid());
    fclose(f);
}

/* ---- the coordinator ---------------------------------------------------------- */

static int coord_spawn(run_t *r, dt_emsg_t *em)
{
    char *argv[] = { r->coordd, (char *)"-D", (char *)"-f", r->conf, NULL };

    log_banner(r->coord.log, "dtcoordd");
    return spawn(r, &r->coord, argv, em);
}

/* Wait until the coordinator answers PING; a clear error if it exits or
 * stays silent, or (interruptible) when a signal came. */
static int coord_wait(run_t *r, int interruptible, dt_emsg_t *em)
{
    double until = dt_clock_now() + START_TIMEOUT_S;
    struct timespec ts = { 0, 50 * 1000000L };
    char st[128];

    for (;;) {
        json_t *res = NULL;
        dt_emsg_t ignored = { "" };
        if (dtctl_request(&r->local, DT_MSG_PING, NULL, &res, &ignored) == 0) {
            json_decref(res);
            return 0;
        }
        reap(r);
        if (r->coord.ended) {
            dt_emsg_set(em, DT_ECOMM, "dtcoordd %s at start-up; its log %s ends with:",
                        status_str(r->coord.status, st, sizeof(st)), r->coord.log);
            return DT_ECOMM;
        }
        if (interruptible && got_signal)
            return dt_emsg_set(em, DT_ECANCELED, "interrupted while dtcoordd was starting");
        if (dt_clock_now() >= until)
            return dt_emsg_set(em, DT_ECOMM, "dtcoordd (pid %ld) did not answer on %s within "
                               "%.0f s; its log %s ends with:", (long)r->coord.pid, r->sock,
                               START_TIMEOUT_S, r->coord.log);
        nanosleep(&ts, NULL);
    }
}

/* ---- the job -------------------------------------------------------------------- */

typedef struct opts {
    const char *spec_file, *state_dir, *steps, *inject;
    int agents, workers, spares; /* -1: not given */
    int64_t interval_ms, hang_ms;
    int local, json, print_spec;
} opts_t;

static int set_int(dt_spec_t *s, const char *key, long long v, dt_emsg_t *em)
{
    char buf[32];
    snprintf(buf, sizeof(buf), "%lld", v);
    return dt_spec_set(s, key, buf, em);
}

/* The spec: SPECFILE or the default, with the options applied, checked.
 * The agents: M workers each (--workers, else the spec's gpus_per_node,
 * else 2); N agents (--agents, else enough for the spec's ranks, else 2);
 * the ranks are N*M when --agents or --workers is given or the spec has
 * none; K spare agents (--spares, else the spec's spares over M). The spec
 * then says nodes = N+K, gpus_per_node = M, spares = K*M, so that the
 * planner places the ranks on these agents. */
static int make_spec(run_t *r, const opts_t *o, dt_spec_t *s, dt_emsg_t *em)
{
    int rc;
    long long ranks;

    if (o->spec_file)
        rc = dt_spec_load(o->spec_file, s, em);
    else
        rc = dt_spec_parse("the default spec", default_spec, s, em);
    if (rc < 0)
        return rc;
    if (o->steps && (rc = dt_spec_set(s, "steps", o->steps, em)) < 0)
        return rc;
    r->workers = o->workers > 0 ? o->workers : s->gpus_per_node > 0 ? (int)s->gpus_per_node : 2;
    if (o->agents > 0)
        r->nagents = o->agents;
    else if (s->ranks > 0)
        r->nagents = (int)((s->ranks + r->workers - 1) / r->workers);
    else
        r->nagents = 2;
    ranks = o->agents > 0 || o->workers > 0 || s->ranks <= 0 ? (long long)r->nagents * r->workers
                                                               : s->ranks;
    if (o->spares >= 0)
        r->nspares = o->spares;
    else
        r->nspares = (int)((s->spares + r->workers - 1) / r->workers);
    if (r->workers > 64)
        return dt_emsg_set(em, DT_EINVAL, "%d workers per agent: at most 64", r->workers);
    if (r->nagents + r->nspares > MAX_AGENTS)
        return dt_emsg_set(em, DT_EINVAL, "%d agents and %d spares: at most %d in all",
                           r->nagents, r->nspares, MAX_AGENTS);
    if ((rc = set_int(s, "ranks", ranks, em)) < 0 ||
        (rc = set_int(s, "gpus_per_node", r->workers, em)) < 0 ||
        (rc = set_int(s, "nodes", r->nagents + r->nspares, em)) < 0)
        return rc;
    if ((s->spares > 0 || r->nspares > 0) &&
        (rc = set_int(s, "spares", (long long)r->nspares * r->workers, em)) < 0)
        return rc;
    return dt_spec_check(s, em);
}

/* KIND[@STEP] of --inject-failure, checked against the job's steps. */
static int parse_inject(run_t *r, const char *arg, const dt_spec_t *s, dt_emsg_t *em)
{
    const char *at = strchr(arg, '@');
    size_t len = at ? (size_t)(at - arg) : strlen(arg);
    long long steps = s->steps > 0 ? s->steps : 1;

    r->inject = INJ_NONE;
    for (int i = INJ_WORKER; i <= INJ_COORD; i++)
        if (strlen(inject_names[i]) == len && strncmp(arg, inject_names[i], len) == 0)
            r->inject = (enum inject)i;
    if (r->inject == INJ_NONE)
        return dt_emsg_set(em, DT_EUSAGE, "--inject-failure '%s': expected worker, hang, agent "
                           "or coordinator, optionally @STEP", arg);
    r->inject_step = steps / 2 > 0 ? steps / 2 : 1;
    if (at) {
        char *end;
        r->inject_step = strtoll(at + 1, &end, 10);
        if (at[1] == '\0' || *end || r->inject_step < 1)
            return dt_emsg_set(em, DT_EUSAGE, "--inject-failure '%s': STEP must be a positive "
                               "integer", arg);
    }
    if (r->inject_step >= steps)
        return dt_emsg_set(em, DT_EUSAGE, "--inject-failure '%s': the job has %lld steps, so "
                           "the failure must come at a step below %lld", arg, steps, steps);
    return 0;
}

/* Submit; the planner may refuse. Checkpoints go where the spec says, by
 * default into the coordinator's state directory (dtcoordd(8)). */
static int submit(run_t *r, const dt_spec_t *s, dt_emsg_t *em)
{
    json_t *res = NULL;
    char *text;
    int rc;

    text = dt_spec_format(s);
    rc = dtctl_request(&r->local, DT_MSG_SUBMIT, json_pack("{s:s}", "spec", text), &res, em);
    free(text);
    if (rc < 0)
        return rc;
    r->job = (long long)json_integer_value(json_object_get(res, "id"));
    json_decref(res);
    if (r->job <= 0)
        return dt_emsg_set(em, DT_EPROTO, "the coordinator's reply to SUBMIT has no job id");
    return 0;
}

/* Start agents [from, to): localN, N from 1. */
static int agents_start(run_t *r, int from, int to, dt_emsg_t *em)
{
    char *adir = dt_xasprintf("%s/agents", r->dir), job[32], slots[16], hang[32];
    int rc = dt_mkdirs(adir, 0700);

    if (rc < 0) {
        rc = dt_emsg_set(em, dt_err_errno(-rc), "%s: %s", adir, strerror(-rc));
        free(adir);
        return rc;
    }
    snprintf(job, sizeof(job), "%lld", r->job);
    snprintf(slots, sizeof(slots), "%d", r->workers);
    snprintf(hang, sizeof(hang), "%lldms", (long long)r->hang_ms);
    char *coord = dt_xasprintf("unix:%s", r->sock);
    for (int i = from; i < to && rc == 0; i++) {
        proc_t *p = &r->agents[i];
        snprintf(p->name, sizeof(p->name), "local%d", i + 1);
        char *sdir = dt_xasprintf("%s/%s", adir, p->name);
        char *argv[20] = { r->agentd,        (char *)"--coord", coord, (char *)"--job", job,
                           (char *)"--node", p->name,           (char *)"--slots", slots,
                           (char *)"--state-dir", sdir,         (char *)"--engine", r->engine,
                           NULL };
        if (r->hang_ms > 0) {
            argv[13] = (char *)"--hang-timeout";
            argv[14] = hang;
        }
        p->log = dt_xasprintf("%s/%s.log", adir, p->name);
        log_banner(p->log, p->name);
        rc = spawn(r, p, argv, em);
        free(sdir);
    }
    free(coord);
    free(adir);
    return rc;
}

/* Wait (at most 15 s, or until a signal or an agent's exit) until n agents
 * have registered: the coordinator places ranks on the agents that are
 * there, so spares started after this are the ones left without ranks. */
static void agents_registered(run_t *r, int n)
{
    double until = dt_clock_now() + 15.0;
    struct timespec ts = { 0, 100 * 1000000L };

    while (!got_signal && dt_clock_now() < until) {
        json_t *res = NULL;
        dt_emsg_t em = { "" };
        int gone = 0;
        if (dtctl_request(&r->local, DT_MSG_SHOW, json_pack("{s:I}", "id", (json_int_t)r->job),
                          &res, &em) == 0) {
            size_t k = json_array_size(json_object_get(res, "agents"));
            json_decref(res);
            if (k >= (size_t)n)
                return;
        }
        reap(r);
        for (int i = 0; i < n; i++)
            gone += r->agents[i].ended;
        if (gone)
            return; /* the watch says what became of it */
        nanosleep(&ts, NULL);
    }
}

/* ---- while the job runs: one call per poll of the watch ------------------------ */

/* The highest rank in a SHOW reply, and the largest step any rank reported. */
static const json_t *highest_rank(const json_t *show, long long *max_step)
{
    const json_t *ranks = json_object_get(show, "ranks"), *x, *top = NULL;
    long long best = -1;
    size_t i;

    *max_step = -1;
    json_array_foreach(ranks, i, x) {
        long long rank = (long long)json_integer_value(json_object_get(x, "rank"));
        long long step = (long long)json_integer_value(json_object_get(x, "step"));
        if (step > *max_step)
            *max_step = step;
        if (json_is_integer(json_object_get(x, "rank")) && rank > best) {
            best = rank;
            top = x;
        }
    }
    return top;
}

/* The agent of ours a rank runs on: by node name, else by agent id. */
static proc_t *agent_of(run_t *r, const json_t *show, const json_t *rank)
{
    const json_t *node = json_object_get(rank, "node"), *a;
    const char *name = json_is_string(node) ? json_string_value(node) : NULL;
    size_t i;

    if (name == NULL)
        json_array_foreach(json_object_get(show, "agents"), i, a)
            if (json_equal(json_object_get(a, "id"), json_object_get(rank, "agent")) &&
                json_is_string(json_object_get(a, "node")))
                name = json_string_value(json_object_get(a, "node"));
    for (int k = 0; name && k < r->nagents + r->nspares; k++)
        if (strcmp(r->agents[k].name, name) == 0)
            return &r->agents[k];
    return NULL;
}

/* The fault, once the job has reached its step. */
static void inject(run_t *r, dtctl_watch_t *w, const json_t *show)
{
    long long step;
    const json_t *top = highest_rank(show, &step);
    proc_t *ag;
    long long rank;
    pid_t pid;

    if (r->inject == INJ_NONE || r->injected || step < r->inject_step || top == NULL)
        return;
    rank = (long long)json_integer_value(json_object_get(top, "rank"));
    pid = (pid_t)json_integer_value(json_object_get(top, "pid"));
    ag = agent_of(r, show, top);
    switch (r->inject) {
    case INJ_WORKER:
    case INJ_HANG:
        /* only a process one of our agents started: a stale pid from the
         * coordinator could be anyone's by now */
        if (pid <= 0 || ag == NULL || !alive(ag) || parent_of(pid) != ag->pid)
            return; /* not yet known: try again at the next poll */
        if (kill(pid, r->inject == INJ_WORKER ? SIGKILL : SIGSTOP) < 0)
            return;
        if (r->inject == INJ_HANG)
            r->stopped = pid;
        dtctl_watch_note(w, "injected failure at step %lld: %s to the worker of rank %lld "
                         "(pid %ld on %s)", step, r->inject == INJ_WORKER ? "SIGKILL" : "SIGSTOP",
                         rank, (long)pid, ag->name);
        break;
    case INJ_AGENT:
        if (ag == NULL || !alive(ag))
            return;
        ag->expected = 1;
        kill(ag->pid, SIGKILL);
        dtctl_watch_note(w, "injected failure at step %lld: SIGKILL to agent %s (pid %ld), "
                         "which runs rank %lld", step, ag->name, (long)ag->pid, rank);
        break;
    case INJ_COORD:
        if (!alive(&r->coord))
            return;
        r->coord.expected = 1;
        kill(r->coord.pid, SIGKILL);
        waitpid(r->coord.pid, &r->coord.status, 0);
        r->coord.ended = 1;
        r->restart_at = dt_clock_now() + RESTART_DELAY_S;
        dtctl_watch_note(w, "injected failure at step %lld: SIGKILL to dtcoordd (pid %ld); "
                         "starting it again in %.0f s", step, (long)r->coord.pid,
                         RESTART_DELAY_S);
        break;
    case INJ_NONE:
        break;
    }
    r->injected = 1;
}

static int on_poll(void *arg, dtctl_watch_t *w, const json_t *show)
{
    run_t *r = arg;
    dt_emsg_t em = { "" };
    char st[128];
    int live = 0, gone = 0;

    reap(r);
    if (got_signal)
        return 128 + got_signal;
    for (int i = 0; i < r->nagents + r->nspares; i++) {
        proc_t *p = &r->agents[i];
        live += alive(p);
        gone += p->ended;
        if (p->ended && !p->expected) {
            p->expected = 1; /* said once */
            if (!(WIFEXITED(p->status) && WEXITSTATUS(p->status) == 0))
                dtctl_watch_note(w, "agent %s (pid %ld) %s; its log: %s", p->name, (long)p->pid,
                                 status_str(p->status, st, sizeof(st)), p->log);
        }
    }
    /* the workers of a dead agent are dead too, as on a lost node */
    if (gone > 0)
        signal_orphans(r, SIGKILL);
    if (r->restart_at > 0 && dt_clock_now() >= r->restart_at) {
        r->restart_at = 0;
        if (coord_spawn(r, &em) < 0) {
            dtctl_watch_note(w, "cannot restart dtcoordd: %s", em.s);
            return DTCTL_NOCOORD;
        }
        dtctl_watch_note(w, "dtcoordd started again (pid %ld)", (long)r->coord.pid);
    } else if (r->restart_at == 0 && r->coord.ended) {
        fprintf(stderr, "%s run: dtcoordd (pid %ld) %s; its log %s ends with:\n", r->ctl->prog,
                (long)r->coord.pid, status_str(r->coord.status, st, sizeof(st)), r->coord.log);
        log_tail(r->coord.log, 5);
        return DTCTL_NOCOORD;
    }
    if (show) {
        const char *state = json_string_value(json_object_get(json_object_get(show, "job"),
                                                              "state"));
        snprintf(r->state, sizeof(r->state), "%s", state ? state : "");
        r->registered = (int)json_array_size(json_object_get(show, "agents"));
        inject(r, w, show);
    }
    /* agents that are all gone cannot finish the job; give the coordinator
     * time to say how it ended (none if none ever registered), then stop
     * waiting */
    if (live > 0) {
        r->agents_gone_since = 0;
    } else if (r->agents_gone_since == 0) {
        r->agents_gone_since = dt_clock_now();
    } else if (dt_clock_now() - r->agents_gone_since > (r->registered ? AGENTS_GONE_S : 1.0)) {
        fprintf(stderr, "%s run: every agent has exited and job %lld has not ended; their logs "
                "are in %s/agents\n", r->ctl->prog, r->job, r->dir);
        return DTCTL_ERROR;
    }
    return -1;
}

/* ---- the end: nothing is left running ------------------------------------------ */

/* The worker we stopped is still a child of one of our agents, or ours. */
static int stopped_is_ours(const run_t *r)
{
    pid_t pp = parent_of(r->stopped);
    if (pp == getpid())
        return 1;
    for (int i = 0; pp > 0 && i < r->nagents + r->nspares; i++)
        if (alive(&r->agents[i]) && r->agents[i].pid == pp)
            return 1;
    return 0;
}

static void teardown(run_t *r, int ended, const char *why)
{
    proc_t *ps[MAX_AGENTS];
    int n = 0;
    char st[128];

    reap(r);
    if (r->job > 0 && !ended && r->restart_at > 0) {
        /* stopped while the coordinator was down for --inject-failure: bring
         * it back for the cancel, or the job stays running in the database */
        dt_emsg_t em = { "" };
        if (coord_spawn(r, &em) < 0 || coord_wait(r, 0, &em) < 0)
            fprintf(stderr, "%s run: restarting dtcoordd to cancel job %lld: %s\n", r->ctl->prog,
                    r->job, em.s);
    }
    r->restart_at = 0;
    if (r->job > 0 && !ended && alive(&r->coord)) {
        json_t *res = NULL;
        dt_emsg_t em = { "" };
        json_t *body = json_pack("{s:I, s:s}", "id", (json_int_t)r->job, "reason", why);
        if (dtctl_request(&r->local, DT_MSG_CANCEL, body, &res, &em) == 0) {
            fprintf(r->out, "job %lld cancelled (%s)\n", r->job, why);
            snprintf(r->state, sizeof(r->state), "cancelled");
        } else
            fprintf(stderr, "%s run: cancelling job %lld: %s\n", r->ctl->prog, r->job, em.s);
        json_decref(res);
    }
    if (r->stopped > 0 && stopped_is_ours(r))
        kill(r->stopped, SIGCONT); /* a stopped worker cannot act on TERM */
    for (int i = 0; i < r->nagents + r->nspares; i++)
        if (alive(&r->agents[i]))
            ps[n++] = &r->agents[i];
    /* told that the job is over, agents exit on their own */
    if (n > 0 && !(ended && wait_gone(r, ps, n, 3.0))) {
        for (int i = 0; i < n; i++)
            if (alive(ps[i])) {
                ps[i]->expected = 1;
                kill(ps[i]->pid, SIGTERM);
            }
        if (!wait_gone(r, ps, n, AGENTS_STOP_S))
            for (int i = 0; i < n; i++)
                if (alive(ps[i])) {
                    fprintf(stderr, "%s run: agent %s (pid %ld) did not stop within %.0f s: "
                            "killing it and its workers\n", r->ctl->prog, ps[i]->name,
                            (long)ps[i]->pid, AGENTS_STOP_S);
                    kill(-ps[i]->pid, SIGKILL);
                    kill(ps[i]->pid, SIGKILL);
                }
        wait_gone(r, ps, n, 2.0);
    }
    /* workers whose agent died before them */
    for (int round = 0; round < 50 && signal_orphans(r, SIGKILL) > 0; round++) {
        struct timespec ts = { 0, 20 * 1000000L };
        nanosleep(&ts, NULL);
        reap(r);
    }
    if (alive(&r->coord)) {
        proc_t *c = &r->coord;
        c->expected = 1;
        kill(c->pid, SIGTERM);
        if (!wait_gone(r, &c, 1, COORD_STOP_S)) {
            fprintf(stderr, "%s run: dtcoordd (pid %ld) did not stop within %.0f s: killing it\n",
                    r->ctl->prog, (long)c->pid, COORD_STOP_S);
            kill(-c->pid, SIGKILL);
            kill(c->pid, SIGKILL);
            wait_gone(r, &c, 1, 2.0);
        } else if (!(WIFEXITED(c->status) && WEXITSTATUS(c->status) == 0)) {
            fprintf(stderr, "%s run: dtcoordd %s on SIGTERM; its log: %s\n", r->ctl->prog,
                    status_str(c->status, st, sizeof(st)), c->log);
        }
    }
    signal_orphans(r, SIGKILL);
    reap(r);
}

static void run_free(run_t *r)
{
    for (int i = 0; i < MAX_AGENTS; i++)
        free(r->agents[i].log);
    free(r->coord.log);
    free(r->dir);
    free(r->conf);
    free(r->sock);
    free(r->pidfile);
    free(r->coordd);
    free(r->agentd);
    free(r->engine);
}

/* ---- dtctl run ------------------------------------------------------------------- */

static void usage(FILE *f)
{
    fprintf(f,
            "usage: dtctl run --local [SPECFILE] [options]\n"
            "  --state-dir DIR      database, socket, logs (default $XDG_STATE_HOME/dt or\n"
            "                       ~/.local/state/dt)\n"
            "  --steps N            training steps (default: the spec's; built-in job 600)\n"
            "  --agents N           agents running ranks (default 2)\n"
            "  --workers M          workers (ranks) per agent (default 2)\n"
            "  --spares K           spare agents of M slots, without ranks (default 0)\n"
            "  --inject-failure worker|hang|agent|coordinator[@STEP]\n"
            "                       one fault when a rank reaches STEP (default steps/2)\n"
            "  --hang-timeout DUR   agents' hang timeout (default theirs; 10s with hang)\n"
            "  --interval DUR       display refresh (default 500ms)\n"
            "  --print-spec         print the job spec it would submit, and exit\n"
            "See dtctl(1).\n");
}

static int parse_count(const char *opt, const char *v, int min, int *out)
{
    int64_t n;
    if (dt_conf_parse_int(v, min, MAX_AGENTS, &n) < 0) {
        fprintf(stderr, "dtctl run: %s '%s': an integer from %d to %d\n", opt, v, min,
                MAX_AGENTS);
        return DTCTL_USAGE;
    }
    *out = (int)n;
    return 0;
}

static int parse_opts(int argc, char **argv, opts_t *o)
{
    static const struct option lo[] = {
        { "local", no_argument, NULL, 'L' },
        { "state-dir", required_argument, NULL, 'd' },
        { "steps", required_argument, NULL, 's' },
        { "agents", required_argument, NULL, 'a' },
        { "workers", required_argument, NULL, 'w' },
        { "spares", required_argument, NULL, 'k' },
        { "inject-failure", required_argument, NULL, 'f' },
        { "hang-timeout", required_argument, NULL, 'H' },
        { "interval", required_argument, NULL, 'i' },
        { "json", no_argument, NULL, 'j' },
        { "print-spec", no_argument, NULL, 'P' },
        { "help", no_argument, NULL, 'h' },
        { NULL, 0, NULL, 0 },
    };
    int c, rc = 0;

    *o = (opts_t){ .agents = -1, .workers = -1, .spares = -1, .interval_ms = 500 };
    opterr = 0;
    while (rc == 0 && (c = getopt_long(argc, argv, "h", lo, NULL)) != -1) {
        switch (c) {
        case 'L': o->local = 1; break;
        case 'd': o->state_dir = optarg; break;
        case 's': o->steps = optarg; break;
        case 'a': rc = parse_count("--agents", optarg, 1, &o->agents); break;
        case 'w': rc = parse_count("--workers", optarg, 1, &o->workers); break;
        case 'k': rc = parse_count("--spares", optarg, 0, &o->spares); break;
        case 'f': o->inject = optarg; break;
        case 'H':
        case 'i': {
            int64_t *dst = c == 'H' ? &o->hang_ms : &o->interval_ms;
            if (dt_conf_parse_duration(optarg, dst) < 0 || *dst < 10 || *dst > 3600000) {
                fprintf(stderr, "dtctl run: %s '%s': a duration from 10ms to 1h, such as 500ms "
                        "or 10s\n", c == 'H' ? "--hang-timeout" : "--interval", optarg);
                rc = DTCTL_USAGE;
            }
            break;
        }
        case 'j': o->json = 1; break;
        case 'P': o->print_spec = 1; break;
        case 'h': usage(stdout); return -1;
        default:
            fprintf(stderr, "dtctl run: unknown option or missing value '%s'\n",
                    argv[optind - 1]);
            usage(stderr);
            return DTCTL_USAGE;
        }
    }
    if (rc)
        return rc;
    if (optind < argc)
        o->spec_file = argv[optind++];
    if (optind < argc) {
        fprintf(stderr, "dtctl run: unexpected argument '%s' (one SPECFILE at most)\n",
                argv[optind]);
        return DTCTL_USAGE;
    }
    if (!o->local) {
        fprintf(stderr, "dtctl run: only --local is supported (a private coordinator and "
                        "agents on this machine); on a cluster use dtctl submit\n");
        usage(stderr);
        return DTCTL_USAGE;
    }
    return 0;
}

int dtctl_run(dtctl_t *ctl, int argc, char **argv)
{
    run_t r = { .ctl = ctl };
    dt_spec_t spec = { 0 };
    dt_emsg_t em = { "" };
    dtctl_watch_hooks_t hooks = { .poll = on_poll, .arg = &r, .gap_s = 60 };
    opts_t o;
    int rc, code;

    /* options, spec, fault: every mistake is found before anything starts */
    if ((rc = parse_opts(argc, argv, &o)) != 0)
        return rc < 0 ? DTCTL_OK : rc;
    if (o.json)
        ctl->json = 1;
    r.out = ctl->json ? stderr : stdout;
    r.local = (dtctl_t){ .prog = ctl->prog, .json = ctl->json };
    r.interval_ms = o.interval_ms;
    r.hang_ms = o.hang_ms;
    if (make_spec(&r, &o, &spec, &em) < 0 || (o.inject && parse_inject(&r, o.inject, &spec,
                                                                       &em) < 0)) {
        fprintf(stderr, "dtctl run: %s\n", em.s);
        dt_spec_free(&spec);
        return DTCTL_USAGE;
    }
    if (o.print_spec) {
        char *text = dt_spec_format(&spec);
        fputs(text, stdout);
        free(text);
        dt_spec_free(&spec);
        return DTCTL_OK;
    }
    if (r.inject == INJ_HANG && r.hang_ms == 0)
        r.hang_ms = 10000; /* the agents' default (60 s) is a long wait */
    if (find_programs(&r, &em) < 0 || state_dir(&r, o.state_dir, &em) < 0 ||
        state_dir_free(&r, &em) < 0 || write_conf(&r, &em) < 0) {
        fprintf(stderr, "dtctl run: %s\n", em.s);
        code = DTCTL_ERROR;
        goto out;
    }

    /* from here on every way out goes through teardown */
    signals_install();
    prctl(PR_SET_CHILD_SUBREAPER, 1);
    fprintf(r.out, "state directory %s\n", r.dir);
    if ((rc = coord_spawn(&r, &em)) < 0 || (rc = coord_wait(&r, 1, &em)) < 0) {
        fprintf(stderr, "dtctl run: %s\n", em.s);
        if (rc != DT_ECANCELED)
            log_tail(r.coord.log, 5);
        code = rc == DT_ECANCELED ? 128 + got_signal : DTCTL_NOCOORD;
        goto stop;
    }
    fprintf(r.out, "dtcoordd pid %ld, socket %s\n", (long)r.coord.pid, r.sock);
    if ((rc = submit(&r, &spec, &em)) < 0) {
        code = dtctl_fail(&r.local, "run", rc, &em);
        goto stop;
    }
    fprintf(r.out, "job %lld submitted: %lld ranks on %d agent%s of %d workers, %d spare%s\n",
            r.job, (long long)spec.ranks, r.nagents, r.nagents == 1 ? "" : "s", r.workers,
            r.nspares, r.nspares == 1 ? "" : "s");
    rc = agents_start(&r, 0, r.nagents, &em);
    if (rc == 0 && r.nspares > 0) {
        agents_registered(&r, r.nagents);
        rc = agents_start(&r, r.nagents, r.nagents + r.nspares, &em);
    }
    if (rc < 0) {
        fprintf(stderr, "dtctl run: %s\n", em.s);
        code = DTCTL_ERROR;
        goto stop;
    }
    for (int i = 0; i < r.nagents + r.nspares; i++)
        fprintf(r.out, "%s %s pid %ld, log %s\n", i < r.nagents ? "agent" : "spare agent",
                r.agents[i].name, (long)r.agents[i].pid, r.agents[i].log);
    if (got_signal) {
        code = 128 + got_signal;
        goto stop;
    }
    fflush(r.out);

    /* the job, until it ends */
    code = dtctl_watch_job(&r.local, "run", r.job, r.interval_ms, &hooks);

stop:
    if (got_signal)
        fprintf(stderr, "%sdtctl run: %s: stopping (again to kill everything at once)\n",
                isatty(STDERR_FILENO) ? "\n" : "", strsignal(got_signal));
    teardown(&r, hooks.ended, got_signal ? "dtctl run interrupted" : "dtctl run stopped early");
    if (!hooks.ended && r.job > 0 && !ctl->json)
        dtctl_print_result(stdout, r.job, r.state[0] ? r.state : "unknown", NULL);
    /* on stderr: the result line stays the last of stdout, for scripts */
    fprintf(stderr, "state directory %s kept: database dt.db, logs dtcoordd.log and agents/\n",
            r.dir);
out:
    dt_spec_free(&spec);
    run_free(&r);
    return code;
}
