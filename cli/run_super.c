/* SPDX-License-Identifier: MIT
 *
 * The local supervisor of `dtctl run --local` (cli/run_super.h): plain
 * fork/exec/waitpid of a private dtcoordd and local dtagentd, every child
 * in its own process group (so a terminal's Ctrl-C reaches dtctl alone,
 * and dtctl decides the order of shutdown) with SIGTERM as its
 * parent-death signal, and dtctl a child subreaper, so workers orphaned by
 * a killed agent come back to it. On every way out the teardown cancels a
 * job that has not ended, stops the agents (TERM, then KILL), kills any
 * orphan left, and stops the coordinator. A second signal kills everything
 * at once. The state directory stays.
 *
 * Not here: the spec, submitting, the display (cli/cmd_run.c), the faults
 * (cli/run_inject.c).
 */
#include "config.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
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

#include "cli/run_super.h"
#include "common/clock.h"
#include "common/fileio.h"
#include "common/mem.h"
#include "common/path.h"
#include "common/proto.h"
#include "common/text.h"
#include "common/wire.h"

#define START_TIMEOUT_S 15.0 /* dtcoordd must answer PING within this */
#define AGENTS_STOP_S 8.0    /* agents stop their workers within this after TERM */
#define COORD_STOP_S 10.0
#define AGENTS_GONE_S 15.0   /* every agent gone and the job not over: give up */

/* ---- signals -------------------------------------------------------------
 * The handler needs the process groups to kill on a second signal, so they
 * live here, in the only mutable globals of dtctl: a signal handler cannot
 * be given a context. */

static volatile sig_atomic_t got_signal; /* the first signal, 0 for none */
static volatile sig_atomic_t nsignals;
static pid_t groups[DTCTL_MAX_AGENTS + 64];
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

void dtctl_super_signals_install(void)
{
    struct sigaction sa;

    memset(&sa, 0, sizeof(sa));
    sa.sa_handler = on_signal; /* no SA_RESTART: sleeps and waits end early */
    sigemptyset(&sa.sa_mask);
    sigaction(SIGINT, &sa, NULL);
    sigaction(SIGTERM, &sa, NULL);
    sigaction(SIGHUP, &sa, NULL);
}

int dtctl_super_signal(void)
{
    return got_signal;
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

static int alive(const dtctl_proc_t *p)
{
    return p->pid > 0 && !p->ended;
}

/* Collect every child that ended: ours, and orphans handed to us as the
 * subreaper (reaped so they do not stay zombies). */
static void reap(dtctl_super_t *s)
{
    pid_t pid;
    int st;

    while ((pid = waitpid(-1, &st, WNOHANG)) > 0) {
        dtctl_proc_t *p = NULL;
        if (pid == s->coord.pid)
            p = &s->coord;
        for (int i = 0; i < s->nagents + s->nspares && p == NULL; i++)
            if (s->agents[i].pid == pid)
                p = &s->agents[i];
        if (p && !p->ended) {
            p->ended = 1;
            p->status = st;
        }
    }
}

/* Wait until none of the n processes is alive, at most secs. Returns 1
 * when they all ended. */
static int wait_gone(dtctl_super_t *s, dtctl_proc_t *const *ps, int n, double secs)
{
    double until = dt_clock_now() + secs;
    struct timespec ts = { 0, 20 * 1000000L };

    for (;;) {
        int left = 0;
        reap(s);
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
static int spawn(dtctl_super_t *s, dtctl_proc_t *p, char *const argv[], dt_emsg_t *em)
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
static int signal_orphans(dtctl_super_t *s, int sig)
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
        if (*end || pid <= 0 || (pid_t)pid == s->coord.pid || parent_of((pid_t)pid) != self)
            continue;
        int ours = 0;
        for (int i = 0; i < s->nagents + s->nspares; i++)
            ours |= alive(&s->agents[i]) && s->agents[i].pid == (pid_t)pid;
        if (!ours && kill((pid_t)pid, sig) == 0)
            n++;
    }
    closedir(d);
    return n;
}

/* Print the last lines of a log, indented, on stderr. */
void dtctl_super_log_tail(const char *path, int lines)
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

int dtctl_super_find_coordd(dtctl_super_t *s, dt_emsg_t *em)
{
    static const char *const coordd[] = { "../coordinator/dtcoordd", "../sbin/dtcoordd",
                                          "dtcoordd" };

    if (s->coordd == NULL &&
        (s->coordd = find_prog("DT_COORDD", "dtcoordd", coordd, 3, em)) == NULL)
        return DT_ENOENT;
    return 0;
}

int dtctl_super_find_programs(dtctl_super_t *s, dt_emsg_t *em)
{
    static const char *const agentd[] = { "../agent/dtagentd", "../sbin/dtagentd", "dtagentd" };
    static const char *const engine[] = { "../engine/dtengine", "dtengine", "../bin/dtengine" };

    if (dtctl_super_find_coordd(s, em) < 0 ||
        (s->agentd = find_prog("DT_AGENTD", "dtagentd", agentd, 3, em)) == NULL ||
        (s->engine = find_prog("DT_ENGINE", "dtengine", engine, 3, em)) == NULL)
        return DT_ENOENT;
    return 0;
}

/* ---- the state directory ------------------------------------------------------ */

/* --state-dir, else $XDG_STATE_HOME/dt, else $HOME/.local/state/dt; made
 * (0700) unless it must exist already (existing), and absolute. */
static int make_dir(dtctl_super_t *s, const char *opt, int existing, dt_emsg_t *em)
{
    const char *xdg = getenv("XDG_STATE_HOME"), *home = getenv("HOME");
    char *dir, real[PATH_MAX];
    int rc = 0;

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
    if ((!existing && (rc = dt_mkdirs(dir, 0700)) < 0) || realpath(dir, real) == NULL) {
        rc = dt_emsg_set(em, rc < 0 ? dt_err_errno(-rc) : dt_err_errno(errno),
                         "state directory %s: %s", dir, strerror(rc < 0 ? -rc : errno));
        free(dir);
        return rc;
    }
    free(dir);
    s->dir = dt_xstrdup(real);
    s->conf = dt_xasprintf("%s/dt.conf", s->dir);
    s->sock = dt_xasprintf("%s/dtcoordd.sock", s->dir);
    s->pidfile = dt_xasprintf("%s/dtcoordd.pid", s->dir);
    s->coord.log = dt_xasprintf("%s/dtcoordd.log", s->dir);
    snprintf(s->coord.name, sizeof(s->coord.name), "dtcoordd");
    if (strlen(s->sock) > 107)
        return dt_emsg_set(em, DT_EINVAL, "state directory %s: the socket path %s is longer "
                           "than a Unix socket allows (107 bytes); give a shorter --state-dir",
                           s->dir, s->sock);
    s->local.socket = s->sock;
    return 0;
}

/* Refuse a state directory that a coordinator holds: its pidfile is locked
 * (checked first: it cannot hang), or its socket answers. */
static int state_dir_free(dtctl_super_t *s, dt_emsg_t *em)
{
    int fd = open(s->pidfile, O_RDONLY | O_CLOEXEC);
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
                               pid[0] ? pid : "?", s->dir, s->pidfile);
        }
        close(fd);
    }
    if (dtctl_request(&s->local, DT_MSG_PING, NULL, &res, &ignored) == 0) {
        json_decref(res);
        return dt_emsg_set(em, DT_EEXIST, "a coordinator already answers on %s: stop it, or "
                           "give another --state-dir", s->sock);
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
static int write_conf(dtctl_super_t *s, dt_emsg_t *em)
{
    char *text = NULL;
    size_t len = 0;
    FILE *f = open_memstream(&text, &len);
    int rc;

    if (f == NULL)
        return dt_emsg_set(em, dt_err_errno(errno), "%s: %s", s->conf, strerror(errno));
    fprintf(f, "# dt.conf(5) of `dtctl run --local`, written anew by every run\n");
    put_conf(f, "state_dir", s->dir);
    put_conf(f, "socket", s->sock);
    put_conf(f, "pidfile", s->pidfile);
    put_conf(f, "log_file", s->coord.log);
    fprintf(f, "log_level = info\n");
    /* a lost agent is noticed within seconds, not the default 10 s */
    fprintf(f, "heartbeat = 500ms\nagent_timeout = 5s\n");
    if (fclose(f) != 0) {
        free(text);
        return dt_emsg_set(em, DT_ENOMEM, "%s: %s", s->conf, strerror(ENOMEM));
    }
    rc = dt_file_write_atomic(s->conf, text, len, 0600, 0, em);
    free(text);
    return rc;
}

/* A line in a log before a process of this run writes to it. */
static void log_banner(const char *path, const char *what, const char *by)
{
    /* the owner's alone, as the rest of the state directory (a log of an
     * earlier run there too) */
    int fd = open(path, O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0600);
    FILE *f = NULL;
    time_t now = time(NULL);
    char when[64];

    if (fd >= 0 && (fchmod(fd, 0600) < 0 || (f = fdopen(fd, "a")) == NULL))
        close(fd);
    if (f == NULL)
        return;
    strftime(when, sizeof(when), "%Y-%m-%d %H:%M:%S", localtime(&now));
    fprintf(f, "---- %s: %s, started by %s (pid %ld)\n", when, what,
            by ? by : "dtctl run --local", (long)getpid());
    fclose(f);
}

int dtctl_super_state_dir(dtctl_super_t *s, const char *opt, dt_emsg_t *em)
{
    int rc;

    if ((rc = make_dir(s, opt, 0, em)) < 0 || (rc = state_dir_free(s, em)) < 0)
        return rc;
    return write_conf(s, em);
}

int dtctl_super_state_dir_again(dtctl_super_t *s, const char *dir, int *held, dt_emsg_t *em)
{
    struct stat st;
    char *db;
    int rc;

    *held = 0;
    if ((rc = make_dir(s, dir, 1, em)) < 0)
        return rc == DT_ENOENT ? DT_EUSAGE : rc;
    db = dt_xasprintf("%s/dt.db", s->dir);
    int found = stat(db, &st) == 0, e = found ? 0 : errno;
    free(db);
    if (!found || !S_ISREG(st.st_mode))
        return dt_emsg_set(em, DT_EUSAGE, "state directory %s has no database dt.db: %s", s->dir,
                           e == 0 || e == ENOENT ? "not the --state-dir of a dtctl run --local"
                                                 : strerror(e));
    if ((rc = state_dir_free(s, em)) == DT_EEXIST) {
        *held = 1; /* its coordinator answers for it: nothing to start or write */
        return 0;
    }
    if (rc < 0)
        return rc;
    return write_conf(s, em);
}

/* ---- the coordinator ---------------------------------------------------------- */

static int coord_spawn(dtctl_super_t *s, dt_emsg_t *em)
{
    char *argv[] = { s->coordd, (char *)"-D", (char *)"-f", s->conf, NULL };

    log_banner(s->coord.log, "dtcoordd", s->by);
    return spawn(s, &s->coord, argv, em);
}

/* Wait until the coordinator answers PING; a clear error if it exits or
 * stays silent, or (interruptible) when a signal came. */
static int coord_wait(dtctl_super_t *s, int interruptible, dt_emsg_t *em)
{
    double until = dt_clock_now() + START_TIMEOUT_S;
    struct timespec ts = { 0, 50 * 1000000L };
    char st[128];

    for (;;) {
        json_t *res = NULL;
        dt_emsg_t ignored = { "" };
        if (dtctl_request(&s->local, DT_MSG_PING, NULL, &res, &ignored) == 0) {
            json_decref(res);
            return 0;
        }
        reap(s);
        if (s->coord.ended) {
            dt_emsg_set(em, DT_ECOMM, "dtcoordd %s at start-up; its log %s ends with:",
                        status_str(s->coord.status, st, sizeof(st)), s->coord.log);
            return DT_ECOMM;
        }
        if (interruptible && got_signal)
            return dt_emsg_set(em, DT_ECANCELED, "interrupted while dtcoordd was starting");
        if (dt_clock_now() >= until)
            return dt_emsg_set(em, DT_ECOMM, "dtcoordd (pid %ld) did not answer on %s within "
                               "%.0f s; its log %s ends with:", (long)s->coord.pid, s->sock,
                               START_TIMEOUT_S, s->coord.log);
        nanosleep(&ts, NULL);
    }
}

int dtctl_super_coord_start(dtctl_super_t *s, dt_emsg_t *em)
{
    int rc;

    if ((rc = coord_spawn(s, em)) < 0)
        return rc;
    return coord_wait(s, 1, em);
}

pid_t dtctl_super_kill_coord(void *arg, double delay_s)
{
    dtctl_super_t *s = arg;

    if (!alive(&s->coord))
        return 0;
    s->coord.expected = 1;
    kill(s->coord.pid, SIGKILL);
    waitpid(s->coord.pid, &s->coord.status, 0);
    s->coord.ended = 1;
    s->restart_at = dt_clock_now() + delay_s;
    return s->coord.pid;
}

/* ---- the agents ------------------------------------------------------------------ */

/* Agent p's state directory, a new string. */
static char *agent_dir(const dtctl_super_t *s, const dtctl_proc_t *p)
{
    return dt_xasprintf("%s/agents/%s", s->dir, p->name);
}

int dtctl_super_agents_start(dtctl_super_t *s, int from, int to, dt_emsg_t *em)
{
    char *adir = dt_xasprintf("%s/agents", s->dir), job[32], slots[16], hang[32];
    int rc = dt_mkdirs(adir, 0700);

    if (rc < 0) {
        rc = dt_emsg_set(em, dt_err_errno(-rc), "%s: %s", adir, strerror(-rc));
        free(adir);
        return rc;
    }
    snprintf(job, sizeof(job), "%lld", s->job);
    snprintf(slots, sizeof(slots), "%d", s->workers);
    snprintf(hang, sizeof(hang), "%lldms", (long long)s->hang_ms);
    char *coord = dt_xasprintf("unix:%s", s->sock);
    for (int i = from; i < to && rc == 0; i++) {
        dtctl_proc_t *p = &s->agents[i];
        snprintf(p->name, sizeof(p->name), "local%d", i + 1);
        char *sdir = agent_dir(s, p);
        char *argv[20] = { s->agentd,        (char *)"--coord", coord, (char *)"--job", job,
                           (char *)"--node", p->name,           (char *)"--slots", slots,
                           (char *)"--state-dir", sdir,         (char *)"--engine", s->engine,
                           NULL };
        if (s->hang_ms > 0) {
            argv[13] = (char *)"--hang-timeout";
            argv[14] = hang;
        }
        p->log = dt_xasprintf("%s/%s.log", adir, p->name);
        log_banner(p->log, p->name, s->by);
        rc = spawn(s, p, argv, em);
        free(sdir);
    }
    free(coord);
    free(adir);
    return rc;
}

void dtctl_super_agents_registered(dtctl_super_t *s, int n)
{
    double until = dt_clock_now() + 15.0;
    struct timespec ts = { 0, 100 * 1000000L };

    while (!got_signal && dt_clock_now() < until) {
        json_t *res = NULL;
        dt_emsg_t em = { "" };
        int gone = 0;
        dt_wire_job_ref_t ref = { .id = s->job };
        if (dtctl_request(&s->local, DT_MSG_SHOW, dt_wire_show_encode(&ref),
                          &res, &em) == 0) {
            size_t k = json_array_size(json_object_get(res, "agents"));
            json_decref(res);
            if (k >= (size_t)n)
                return;
        }
        reap(s);
        for (int i = 0; i < n; i++)
            gone += s->agents[i].ended;
        if (gone)
            return; /* the watch says what became of it */
        nanosleep(&ts, NULL);
    }
}

/* The coordinator's last word on why it refused the job's agents (an
 * agent_refused event: a cuda job on a node without GPUs), when it said
 * one: agents that exit for that reason all exit the same way. */
static void say_refusal(dtctl_super_t *s)
{
    dt_wire_events_t req = { .id = s->job };
    dt_emsg_t ignored = { "" };
    json_t *res = NULL, *ev;
    const char *why = NULL;
    size_t i;

    if (dtctl_request(&s->local, DT_MSG_EVENTS, dt_wire_events_encode(&req), &res, &ignored) < 0)
        return;
    json_array_foreach(json_object_get(res, "events"), i, ev) {
        const char *kind = json_string_value(json_object_get(ev, "kind"));
        if (kind && strcmp(kind, "agent_refused") == 0)
            why = json_string_value(json_object_get(ev, "detail"));
    }
    if (why) {
        char *e = dt_text_escape(why, 0);
        fprintf(stderr, "%s run: the coordinator refused the agents: %s\n", s->ctl->prog, e);
        free(e);
    }
    json_decref(res);
}

/* Our live agent named node, or NULL. */
static dtctl_proc_t *agent_named(dtctl_super_t *s, const char *node)
{
    for (int k = 0; node && k < s->nagents + s->nspares; k++)
        if (strcmp(s->agents[k].name, node) == 0)
            return alive(&s->agents[k]) ? &s->agents[k] : NULL;
    return NULL;
}

int dtctl_super_kill_worker(void *arg, const char *node, pid_t pid, int sig)
{
    dtctl_super_t *s = arg;
    dtctl_proc_t *ag = agent_named(s, node);

    /* only a process one of our agents started: a stale pid from the
     * coordinator could be anyone's by now */
    if (pid <= 0 || ag == NULL || parent_of(pid) != ag->pid)
        return -1;
    if (kill(pid, sig) < 0)
        return -1;
    if (sig == SIGSTOP)
        s->stopped = pid;
    return 0;
}

pid_t dtctl_super_kill_agent(void *arg, const char *node)
{
    dtctl_super_t *s = arg;
    dtctl_proc_t *ag = agent_named(s, node);

    if (ag == NULL)
        return 0;
    ag->expected = 1;
    kill(ag->pid, SIGKILL);
    return ag->pid;
}

/* ---- while the job runs: one call per poll of the watch ------------------------ */

int dtctl_super_poll(void *arg, dtctl_watch_t *w, const json_t *show)
{
    dtctl_super_t *s = arg;
    dt_emsg_t em = { "" };
    char st[128];
    int live = 0, gone = 0;

    reap(s);
    if (got_signal)
        return 128 + got_signal;
    for (int i = 0; i < s->nagents + s->nspares; i++) {
        dtctl_proc_t *p = &s->agents[i];
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
        signal_orphans(s, SIGKILL);
    if (s->restart_at > 0 && dt_clock_now() >= s->restart_at) {
        s->restart_at = 0;
        if (coord_spawn(s, &em) < 0) {
            dtctl_watch_note(w, "cannot restart dtcoordd: %s", em.s);
            return DTCTL_NOCOORD;
        }
        dtctl_watch_note(w, "dtcoordd started again (pid %ld)", (long)s->coord.pid);
    } else if (s->restart_at == 0 && s->coord.ended) {
        fprintf(stderr, "%s run: dtcoordd (pid %ld) %s; its log %s ends with:\n", s->ctl->prog,
                (long)s->coord.pid, status_str(s->coord.status, st, sizeof(st)), s->coord.log);
        dtctl_super_log_tail(s->coord.log, 5);
        return DTCTL_NOCOORD;
    }
    if (show) {
        const char *state = json_string_value(json_object_get(json_object_get(show, "job"),
                                                              "state"));
        snprintf(s->state, sizeof(s->state), "%s", state ? state : "");
        s->registered = (int)json_array_size(json_object_get(show, "agents"));
        if (s->on_show)
            s->on_show(s->on_show_arg, w, show);
    }
    /* agents that are all gone cannot finish the job; give the coordinator
     * time to say how it ended (none if none ever registered), then stop
     * waiting */
    if (live > 0) {
        s->agents_gone_since = 0;
    } else if (s->agents_gone_since == 0) {
        s->agents_gone_since = dt_clock_now();
    } else if (dt_clock_now() - s->agents_gone_since > (s->registered ? AGENTS_GONE_S : 1.0)) {
        fprintf(stderr, "%s run: every agent has exited and job %lld has not ended; their logs "
                "are in %s/agents\n", s->ctl->prog, s->job, s->dir);
        say_refusal(s);
        return DTCTL_ERROR;
    }
    return -1;
}

/* ---- the end: nothing is left running ------------------------------------------ */

/* The worker we stopped is still a child of one of our agents, or ours. */
static int stopped_is_ours(const dtctl_super_t *s)
{
    pid_t pp = parent_of(s->stopped);
    if (pp == getpid())
        return 1;
    for (int i = 0; pp > 0 && i < s->nagents + s->nspares; i++)
        if (alive(&s->agents[i]) && s->agents[i].pid == pp)
            return 1;
    return 0;
}

void dtctl_super_teardown(dtctl_super_t *s, int ended, const char *why)
{
    dtctl_proc_t *ps[DTCTL_MAX_AGENTS];
    int n = 0;
    char st[128];

    reap(s);
    if (s->job > 0 && !ended && s->restart_at > 0) {
        /* stopped while the coordinator was down for --inject-failure: bring
         * it back for the cancel, or the job stays running in the database */
        dt_emsg_t em = { "" };
        if (coord_spawn(s, &em) < 0 || coord_wait(s, 0, &em) < 0)
            fprintf(stderr, "%s run: restarting dtcoordd to cancel job %lld: %s\n", s->ctl->prog,
                    s->job, em.s);
    }
    s->restart_at = 0;
    if (s->job > 0 && !ended && alive(&s->coord)) {
        json_t *res = NULL;
        dt_emsg_t em = { "" };
        dt_wire_cancel_t cn = { .id = s->job, .reason = why };
        json_t *body = dt_wire_cancel_encode(&cn);
        if (dtctl_request(&s->local, DT_MSG_CANCEL, body, &res, &em) == 0) {
            fprintf(s->out, "job %lld cancelled (%s)\n", s->job, why);
            snprintf(s->state, sizeof(s->state), "cancelled");
        } else
            fprintf(stderr, "%s run: cancelling job %lld: %s\n", s->ctl->prog, s->job, em.s);
        json_decref(res);
    }
    if (s->stopped > 0 && stopped_is_ours(s))
        kill(s->stopped, SIGCONT); /* a stopped worker cannot act on TERM */
    for (int i = 0; i < s->nagents + s->nspares; i++)
        if (alive(&s->agents[i]))
            ps[n++] = &s->agents[i];
    /* told that the job is over, agents exit on their own */
    if (n > 0 && !(ended && wait_gone(s, ps, n, 3.0))) {
        for (int i = 0; i < n; i++)
            if (alive(ps[i])) {
                ps[i]->expected = 1;
                kill(ps[i]->pid, SIGTERM);
            }
        if (!wait_gone(s, ps, n, AGENTS_STOP_S))
            for (int i = 0; i < n; i++)
                if (alive(ps[i])) {
                    fprintf(stderr, "%s run: agent %s (pid %ld) did not stop within %.0f s: "
                            "killing it and its workers\n", s->ctl->prog, ps[i]->name,
                            (long)ps[i]->pid, AGENTS_STOP_S);
                    kill(-ps[i]->pid, SIGKILL);
                    kill(ps[i]->pid, SIGKILL);
                }
        wait_gone(s, ps, n, 2.0);
    }
    /* workers whose agent died before them */
    for (int round = 0; round < 50 && signal_orphans(s, SIGKILL) > 0; round++) {
        struct timespec ts = { 0, 20 * 1000000L };
        nanosleep(&ts, NULL);
        reap(s);
    }
    if (alive(&s->coord)) {
        dtctl_proc_t *c = &s->coord;
        c->expected = 1;
        kill(c->pid, SIGTERM);
        if (!wait_gone(s, &c, 1, COORD_STOP_S)) {
            fprintf(stderr, "%s run: dtcoordd (pid %ld) did not stop within %.0f s: killing it\n",
                    s->ctl->prog, (long)c->pid, COORD_STOP_S);
            kill(-c->pid, SIGKILL);
            kill(c->pid, SIGKILL);
            wait_gone(s, &c, 1, 2.0);
        } else if (!(WIFEXITED(c->status) && WEXITSTATUS(c->status) == 0)) {
            fprintf(stderr, "%s run: dtcoordd %s on SIGTERM; its log: %s\n", s->ctl->prog,
                    status_str(c->status, st, sizeof(st)), c->log);
        }
    }
    signal_orphans(s, SIGKILL);
    reap(s);
    /* what agents that were killed left of their generations */
    if (s->dir != NULL)
        for (int i = 0; i < s->nagents + s->nspares; i++) {
            dt_emsg_t em = { "" };
            char *sdir = agent_dir(s, &s->agents[i]);
            if (s->agents[i].name[0] != '\0' && dt_gen_dirs_remove(sdir, NULL, &em) < 0)
                fprintf(stderr, "%s run: %s\n", s->ctl->prog, em.s);
            free(sdir);
        }
}

void dtctl_super_close(dtctl_super_t *s)
{
    for (int i = 0; i < DTCTL_MAX_AGENTS; i++)
        free(s->agents[i].log);
    free(s->coord.log);
    free(s->dir);
    free(s->conf);
    free(s->sock);
    free(s->pidfile);
    free(s->coordd);
    free(s->agentd);
    free(s->engine);
}
