/* SPDX-License-Identifier: MIT
 *
 * pmixhost: agent/pmix.c driven the way dtagentd drives it (behind
 * agent/accept_gate.c, linked in as there), without a coordinator, for
 * tests/integration/pmix.sh. A libuv loop, one PMIx server,
 * G generations of R ranks of tests/tools/pmixworker spawned with uv_spawn in the
 * environment dt_pmix_worker_env builds. It plays the coordinator too: a
 * fence that reaches the host is answered with this agent's own data (with
 * one agent that is exactly what a coordinator would relay), on the next
 * loop turn. It prints what the script checks, one fact per line:
 *
 *   pmixhost: gen G rank R pid P                  spawned
 *   pmixworker: ...                               the workers' own lines
 *   pmixhost: gen G rank R exited S signal N [after X ms]
 *   pmixhost: gen G fences F                      fences that reached the host
 *   pmixhost: gen G fds N                         open fds after dt_pmix_gen_end
 *   pmixhost: gen G ok ...  |  pmixhost: gen G FAILED: why
 *   pmixhost: ok  |  pmixhost: FAILED
 *
 * --kill RANK kills that rank (SIGKILL) once every rank printed its sum,
 * calls dt_pmix_notify_failure when it is reaped, and SIGKILLs whatever is
 * left after the grace period: the survivors must have exited 4 on their
 * own. --relay turns libpmix's local-fence shortcut off, so that every fence
 * comes through the host; --drop-fence SEQ leaves that one unanswered (the
 * module must fail it after DT_PMIX_CB_TIMEOUT_MS). --nodes/--self make this
 * one agent of several (ranks in blocks, only ours spawned); with
 * --fence-dir, two pmixhost processes with the same --job are two agents of
 * one job and the directory is their coordinator: each writes its fence data
 * there and answers with every agent's. --show-env RANK prints a worker's
 * OMPI_* and PMIX_* variables; --notify-early RANK notifies RANK's failure
 * right after spawning, before any rank can have registered its handler
 * (libpmix caches the event); --refusals calls the API with bad input and
 * prints the messages. --stall gen opens a TCP connection to the server
 * that sends nothing before the workers start (libpmix reads a handshake
 * with a blocking recv on its progress thread), --stall end opens one just
 * before dt_pmix_free that sends a handshake header and then a byte every
 * 500 ms from a thread (which keeps libpmix reading); they print
 *
 *   pmixhost: stalled connection closed by the server after X ms
 *   pmixhost: dt_pmix_free returned after X ms[, finalize abandoned]
 *
 * and a host whose finalize was abandoned leaves with _exit, as dtagentd
 * does. Exit: 0 all as expected, 1 not, 2 usage, 3 the PMIx server could
 * not start here. Not a daemon, not a model of dtagentd's recovery.
 */
#include "config.h"

#include <arpa/inet.h>
#include <dirent.h>
#include <errno.h>
#include <netinet/in.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>
#include <uv.h>

#include "agent/pmix.h"
#include "common/err.h"
#include "common/fileio.h"
#include "common/log.h"
#include "common/mem.h"

#define MAX_RANKS 64
#define MAX_NODES 8

typedef struct host host_t;

typedef struct worker {
    host_t *h;
    int rank;
    long pid;
    uv_process_t proc;
    uv_pipe_t out;
    int proc_open, out_open;
    int exited, sig, grace_killed, summed, got_event;
    int64_t status;
    double event_ms, exit_ms; /* after the failure was notified */
    char buf[2048];
    size_t blen;
} worker_t;

typedef struct answer {
    uv_timer_t timer;
    host_t *h;
    uint32_t gen, seq;
    char *data;
    size_t len;
    int polls;
} answer_t;

struct host {
    uv_loop_t loop;
    dt_pmix_t *pmix;
    /* options */
    const char *tmpdir, *worker_path, *self, *fence_dir, *job;
    const char *nodes[MAX_NODES];
    int nnodes, nranks, gens, kill_rank, hold, relay, drop_fence, refusals, show_env;
    int timeout_s, grace_ms, init_only, notify_early;
    const char *stall; /* NULL, "gen" or "end" */
    struct sockaddr_in stall_sa;
    /* the stalled connection */
    int stall_fd;
    uv_poll_t stall_poll;
    int stall_open;
    uint64_t t_stall;
    /* the generation */
    uint32_t gen;
    char nspace[128];
    int node_of[MAX_RANKS];
    worker_t *w;
    int nw, sums, fences, killing, notified, ended;
    uint64_t t_notify, t_dropped;
    uv_timer_t grace, watchdog;
    int timed_out;
    double t_gone;
};

/* ---- small things -------------------------------------------------------- */

static int count_fds(void)
{
    DIR *d = opendir("/proc/self/fd");
    struct dirent *e;
    int n = 0;

    if (d == NULL)
        return -1;
    while ((e = readdir(d)) != NULL)
        if (e->d_name[0] != '.')
            n++;
    closedir(d);
    return n - 1; /* the directory's own */
}

/* 1 if a file whose name contains "vader" lies under dir */
static int find_vader(const char *dir)
{
    DIR *d = opendir(dir);
    struct dirent *e;
    int found = 0;

    if (d == NULL)
        return 0;
    while (!found && (e = readdir(d)) != NULL) {
        if (strcmp(e->d_name, ".") == 0 || strcmp(e->d_name, "..") == 0)
            continue;
        char *path = dt_xasprintf("%s/%s", dir, e->d_name);
        struct stat st;
        if (strstr(e->d_name, "vader"))
            found = 1;
        else if (lstat(path, &st) == 0 && S_ISDIR(st.st_mode))
            found = find_vader(path);
        free(path);
    }
    closedir(d);
    return found;
}

static double ms_since(uint64_t t0)
{
    return (double)(uv_hrtime() - t0) / 1e6;
}

static int parse_int(const char *opt, const char *s, int lo, int hi, int *out)
{
    char *end;
    long v;

    errno = 0;
    v = strtol(s, &end, 10);
    if (errno || end == s || *end || v < lo || v > hi) {
        fprintf(stderr, "pmixhost: %s %s: not a number from %d to %d\n", opt, s, lo, hi);
        return -1;
    }
    *out = (int)v;
    return 0;
}

/* ---- the agent's callbacks -------------------------------------------------- */

static void answer_closed(uv_handle_t *t)
{
    answer_t *a = t->data;

    free(a->data);
    free(a);
}

static char *fence_file(host_t *h, uint32_t gen, uint32_t seq, const char *node)
{
    return dt_xasprintf("%s/%s.%u.s%u.%s", h->fence_dir, h->job, gen, seq, node);
}

/* Append the contents of path to a; -1 if it is not there yet. */
static int slurp(const char *path, char **buf, size_t *len)
{
    FILE *f = fopen(path, "rb");
    char chunk[4096];
    size_t n;

    if (f == NULL)
        return -1;
    while ((n = fread(chunk, 1, sizeof(chunk), f)) > 0) {
        *buf = dt_xrealloc(*buf, *len + n);
        memcpy(*buf + *len, chunk, n);
        *len += n;
    }
    fclose(f);
    return 0;
}

/* With --fence-dir: the coordinator is a directory. Every agent writes
 * its part, and each answers with all parts once all are there, in
 * reverse node order (libpmix must not care). */
static void answer_fire(uv_timer_t *t)
{
    answer_t *a = t->data;
    host_t *h = a->h;

    if (h->fence_dir) {
        char *all = NULL;
        size_t len = 0;
        for (int i = h->nnodes - 1; i >= 0; i--) {
            char *path = fence_file(h, a->gen, a->seq, h->nodes[i]);
            int rc = slurp(path, &all, &len);
            free(path);
            if (rc < 0) {
                free(all);
                if (++a->polls < 3000)
                    return; /* the timer repeats */
                printf("pmixhost: gen %u fence seq %u: node %s never wrote its part\n", a->gen,
                       a->seq, h->nodes[i]);
                uv_close((uv_handle_t *)&a->timer, answer_closed);
                return;
            }
        }
        free(a->data);
        a->data = all;
        a->len = len;
    }
    dt_pmix_fence_done(h->pmix, a->gen, a->seq, 0, a->data, a->len);
    uv_close((uv_handle_t *)&a->timer, answer_closed);
}

static void write_part(host_t *h, uint32_t gen, uint32_t seq, const void *data, size_t len)
{
    char *path = fence_file(h, gen, seq, h->self);
    dt_emsg_t em = { "" };

    /* whole or not at all: the other hosts poll for it */
    if (dt_file_write_atomic(path, data, len, 0644, 0, &em) < 0)
        printf("pmixhost: cannot write %s\n", em.s);
    free(path);
}

static void on_fence(void *ud, uint32_t gen, uint32_t seq, const void *data, size_t len)
{
    host_t *h = ud;

    h->fences++;
    printf("pmixhost: gen %u fence seq %u bytes %zu\n", gen, seq, len);
    if (h->drop_fence == (int)seq) {
        h->t_dropped = uv_hrtime();
        return;
    }
    if (h->fence_dir)
        write_part(h, gen, seq, data, len);
    /* answer later, as a coordinator would: the data is only borrowed */
    answer_t *a = dt_xcalloc(1, sizeof(*a));
    a->h = h;
    a->gen = gen;
    a->seq = seq;
    a->len = len;
    if (len) {
        a->data = dt_xmalloc(len);
        memcpy(a->data, data, len);
    }
    uv_timer_init(&h->loop, &a->timer);
    a->timer.data = a;
    uv_timer_start(&a->timer, answer_fire, 0, h->fence_dir ? 5 : 0);
}

static void on_connected(void *ud, uint32_t gen, int rank)
{
    dt_log_debug("gen=%u rank=%d connected", gen, rank);
}

static void on_finalized(void *ud, uint32_t gen, int rank)
{
    dt_log_debug("gen=%u rank=%d finalized", gen, rank);
}

static void on_aborted(void *ud, uint32_t gen, int rank, int status, const char *msg)
{
    printf("pmixhost: gen %u rank %d called abort status %d: %s\n", gen, rank, status,
           msg ? msg : "");
}

/* ---- workers ---------------------------------------------------------------- */

static worker_t *find_rank(host_t *h, int rank)
{
    for (int i = 0; i < h->nw; i++)
        if (h->w[i].rank == rank)
            return &h->w[i];
    return NULL;
}

static void all_done_maybe(host_t *h)
{
    for (int i = 0; i < h->nw; i++)
        if (h->w[i].proc_open || h->w[i].out_open)
            return;
    uv_timer_stop(&h->grace);
    uv_timer_stop(&h->watchdog);
}

static void kill_left(host_t *h, int mark)
{
    for (int i = 0; i < h->nw; i++) {
        worker_t *w = &h->w[i];
        if (w->proc_open && !w->exited) {
            if (mark) {
                w->grace_killed = 1;
                printf("pmixhost: gen %u rank %d still running after the grace period: killed\n",
                       h->gen, w->rank);
            }
            uv_process_kill(&w->proc, SIGKILL);
        }
    }
}

static void grace_fire(uv_timer_t *t)
{
    kill_left(t->data, 1);
}

static void watchdog_fire(uv_timer_t *t)
{
    host_t *h = t->data;

    h->timed_out = 1;
    printf("pmixhost: gen %u not done in %d s: killing all\n", h->gen, h->timeout_s);
    kill_left(h, 0);
}

/* the local part of a failure, as dtagentd does it: tell the survivors,
 * kill what is left after the grace period */
static void failure(host_t *h, int rank)
{
    dt_emsg_t em;

    if (h->notified)
        return;
    h->notified = 1;
    h->t_notify = uv_hrtime();
    if (dt_pmix_notify_failure(h->pmix, rank, &em) < 0)
        printf("pmixhost: gen %u notify failure of rank %d: %s\n", h->gen, rank, em.s);
    uv_timer_start(&h->grace, grace_fire, (uint64_t)h->grace_ms, 0);
}

static void on_line(worker_t *w, const char *line)
{
    host_t *h = w->h;
    int r, n, f;
    long long sum;
    char ring[8];

    printf("%s\n", line);
    if (sscanf(line, "pmixworker: rank %d of %d ring %7s sum %lld", &r, &n, ring, &sum) == 4) {
        if (r == w->rank && n == h->nranks && strcmp(ring, "ok") == 0 &&
            sum == (long long)n * (n + 1) / 2) {
            w->summed = 1;
            h->sums++;
        }
        if (h->kill_rank >= 0 && !h->killing && h->sums == h->nw) {
            worker_t *v = find_rank(h, h->kill_rank);
            h->killing = 1;
            if (v && v->proc_open && !v->exited) {
                printf("pmixhost: gen %u killing rank %d pid %ld\n", h->gen, v->rank, v->pid);
                uv_process_kill(&v->proc, SIGKILL);
            }
        }
    } else if (sscanf(line, "pmixworker: rank %d got failure of rank %d", &r, &f) == 2) {
        w->got_event = 1;
        w->event_ms = h->notified ? ms_since(h->t_notify) : -1;
    } else if (sscanf(line, "pmixworker: rank %d of %d initialised", &r, &n) == 2) {
        if (r == w->rank && n == h->nranks) {
            w->summed = 1;
            h->sums++;
        }
    }
}

static void alloc_cb(uv_handle_t *hd, size_t want, uv_buf_t *b)
{
    worker_t *w = hd->data;

    b->base = w->buf + w->blen;
    b->len = sizeof(w->buf) - 1 - w->blen;
}

static void out_closed(uv_handle_t *hd)
{
    worker_t *w = hd->data;

    w->out_open = 0;
    all_done_maybe(w->h);
}

static void read_cb(uv_stream_t *s, ssize_t n, const uv_buf_t *b)
{
    worker_t *w = s->data;
    char *nl;

    if (n < 0) {
        if (w->blen) {
            w->buf[w->blen] = '\0';
            on_line(w, w->buf);
            w->blen = 0;
        }
        uv_close((uv_handle_t *)s, out_closed);
        return;
    }
    w->blen += (size_t)n;
    w->buf[w->blen] = '\0';
    while ((nl = strchr(w->buf, '\n')) != NULL) {
        *nl = '\0';
        on_line(w, w->buf);
        w->blen -= (size_t)(nl + 1 - w->buf);
        memmove(w->buf, nl + 1, w->blen + 1);
    }
    if (w->blen == sizeof(w->buf) - 1) { /* a line too long: take it as is */
        on_line(w, w->buf);
        w->blen = 0;
    }
}

static void proc_closed(uv_handle_t *hd)
{
    worker_t *w = hd->data;

    w->proc_open = 0;
    all_done_maybe(w->h);
}

static void exit_cb(uv_process_t *p, int64_t status, int sig)
{
    worker_t *w = p->data;
    host_t *h = w->h;

    w->exited = 1;
    w->status = status;
    w->sig = sig;
    if (h->notified) {
        w->exit_ms = ms_since(h->t_notify);
        printf("pmixhost: gen %u rank %d exited %lld signal %d after %.1f ms\n", h->gen, w->rank,
               (long long)status, sig, w->exit_ms);
    } else {
        printf("pmixhost: gen %u rank %d exited %lld signal %d\n", h->gen, w->rank,
               (long long)status, sig);
    }
    /* a rank that failed by itself (not one that saw a peer fail) */
    if ((sig != 0 || (status != 0 && status != 4)) && !h->drop_fence)
        failure(h, w->rank);
    uv_close((uv_handle_t *)p, proc_closed);
}

static int spawn(host_t *h, worker_t *w, dt_emsg_t *em)
{
    uv_process_options_t o = { 0 };
    uv_stdio_container_t stdio[3];
    char hold[16], *args[5];
    char **env = NULL;
    int n = 0, rc;

    if ((rc = dt_pmix_worker_env(h->pmix, w->rank, &env, em)) < 0)
        return rc;
    args[n++] = (char *)h->worker_path;
    if (h->init_only) {
        args[n++] = "--init-only";
    } else if (h->hold >= 0) {
        snprintf(hold, sizeof(hold), "%d", h->hold);
        args[n++] = "--hold";
        args[n++] = hold;
    }
    args[n] = NULL;
    uv_pipe_init(&h->loop, &w->out, 0);
    w->out.data = w;
    w->out_open = 1;
    stdio[0].flags = UV_IGNORE;
    stdio[1].flags = UV_CREATE_PIPE | UV_WRITABLE_PIPE;
    stdio[1].data.stream = (uv_stream_t *)&w->out;
    stdio[2].flags = UV_INHERIT_FD;
    stdio[2].data.fd = 2;
    o.file = h->worker_path;
    o.args = args;
    o.env = env;
    o.stdio = stdio;
    o.stdio_count = 3;
    o.exit_cb = exit_cb;
    w->proc.data = w;
    rc = uv_spawn(&h->loop, &w->proc, &o);
    dt_pmix_env_free(env);
    if (rc < 0) {
        uv_close((uv_handle_t *)&w->out, out_closed);
        return dt_emsg_set(em, rc, "spawn %s: %s", h->worker_path, uv_strerror(rc));
    }
    w->proc_open = 1;
    w->pid = (long)w->proc.pid;
    printf("pmixhost: gen %u rank %d pid %ld\n", h->gen, w->rank, w->pid);
    uv_read_start((uv_stream_t *)&w->out, alloc_cb, read_cb);
    return 0;
}

static void show_env(host_t *h, int rank)
{
    char **env = NULL;
    dt_emsg_t em;

    if (dt_pmix_worker_env(h->pmix, rank, &env, &em) < 0) {
        printf("pmixhost: env of rank %d: %s\n", rank, em.s);
        return;
    }
    for (size_t i = 0; env[i]; i++)
        if (strncmp(env[i], "OMPI_", 5) == 0 || strncmp(env[i], "PMIX_", 5) == 0)
            printf("env %s\n", env[i]);
    dt_pmix_env_free(env);
}

/* ---- a connection that stalls -------------------------------------------- */

/* The server's address, from the environment a worker gets. */
static int server_addr(host_t *h, int rank, struct sockaddr_in *sa)
{
    char **env = NULL, ip[64] = "";
    unsigned port = 0;
    dt_emsg_t em;
    int found = 0;

    if (dt_pmix_worker_env(h->pmix, rank, &env, &em) < 0) {
        printf("pmixhost: env of rank %d: %s\n", rank, em.s);
        return -1;
    }
    for (size_t i = 0; env[i] && !found; i++) {
        const char *t = strncmp(env[i], "PMIX_SERVER_URI41=", 18) == 0 ? strstr(env[i], "tcp4://")
                                                                       : NULL;
        found = t && sscanf(t, "tcp4://%63[0-9.]:%u", ip, &port) == 2 && port < 65536;
    }
    dt_pmix_env_free(env);
    memset(sa, 0, sizeof(*sa));
    sa->sin_family = AF_INET;
    sa->sin_port = htons((uint16_t)port);
    if (!found || inet_pton(AF_INET, ip, &sa->sin_addr) != 1) {
        printf("pmixhost: no tcp4 PMIX_SERVER_URI41 in a worker's environment\n");
        return -1;
    }
    return 0;
}

static void stall_closed(uv_handle_t *hd)
{
    host_t *h = hd->data;

    close(h->stall_fd);
    h->stall_fd = -1;
    h->stall_open = 0;
}

static void stall_readable(uv_poll_t *p, int status, int events)
{
    host_t *h = p->data;
    char c;

    if (status == 0 && recv(h->stall_fd, &c, 1, MSG_PEEK | MSG_DONTWAIT) > 0)
        return;
    printf("pmixhost: stalled connection closed by the server after %.0f ms\n",
           ms_since(h->t_stall));
    uv_close((uv_handle_t *)p, stall_closed);
}

/* --stall end: a handshake header announcing 4096 bytes (libpmix's
 * pmix_ptl_hdr_t, host order), then a byte every 500 ms until told */
static volatile int drip_stop;

static void *drip_main(void *arg)
{
    int fd = *(int *)arg;
    struct {
        int32_t pindex;
        uint32_t tag;
        uint64_t nbytes;
    } hdr = { -1, 0, 4096 };
    char zero = 0;

    if (send(fd, &hdr, sizeof(hdr), MSG_NOSIGNAL) != (ssize_t)sizeof(hdr))
        return NULL;
    while (!drip_stop && send(fd, &zero, 1, MSG_NOSIGNAL) == 1)
        usleep(500000);
    return NULL;
}

/* Connect to our own server and send nothing: 0 or -1 (said why). */
static int stall(host_t *h, const struct sockaddr_in *sa)
{
    if ((h->stall_fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0)) < 0 ||
        connect(h->stall_fd, (const struct sockaddr *)sa, sizeof(*sa)) < 0) {
        printf("pmixhost: cannot connect to the server: %s\n", strerror(errno));
        if (h->stall_fd >= 0)
            close(h->stall_fd);
        h->stall_fd = -1;
        return -1;
    }
    h->t_stall = uv_hrtime();
    printf("pmixhost: stalled connection open\n");
    uv_poll_init(&h->loop, &h->stall_poll, h->stall_fd);
    h->stall_poll.data = h;
    h->stall_open = 1;
    uv_poll_start(&h->stall_poll, UV_READABLE | UV_DISCONNECT, stall_readable);
    uv_unref((uv_handle_t *)&h->stall_poll);
    return 0;
}

/* ---- one generation -------------------------------------------------------- */

/* 0 when the generation went as expected */
static int run_gen(host_t *h, uint32_t gen)
{
    dt_pmix_gen_t g = { 0 };
    dt_emsg_t em;
    char *dir;
    int self = -1, bad = 0, rc;

    h->gen = gen;
    snprintf(h->nspace, sizeof(h->nspace), "%s.%u", h->job, gen);
    for (int i = 0; i < h->nnodes; i++)
        if (strcmp(h->nodes[i], h->self) == 0)
            self = i;
    for (int r = 0; r < h->nranks; r++)
        h->node_of[r] = (int)((long)r * h->nnodes / h->nranks);
    g.gen = gen;
    g.nspace = h->nspace;
    g.nranks = h->nranks;
    g.nnodes = h->nnodes;
    g.nodes = h->nodes;
    g.node_of = h->node_of;
    g.self = h->self;
    if ((rc = dt_pmix_gen_begin(h->pmix, &g, &em)) < 0) {
        printf("pmixhost: gen %u FAILED: %s (%s)\n", gen, em.s, dt_err_name(rc));
        return -1;
    }
    if (h->show_env >= 0) {
        show_env(h, h->show_env);
        dt_pmix_gen_end(h->pmix);
        return 0;
    }
    h->nw = h->sums = h->fences = h->killing = h->notified = h->timed_out = 0;
    h->t_dropped = 0;
    h->w = dt_xcalloc(MAX_RANKS, sizeof(*h->w));
    if (h->stall && (strcmp(h->stall, "gen") == 0 || gen == (uint32_t)h->gens)) {
        /* the address now; for "gen" the connection too, before any worker */
        int first = 0;
        while (h->node_of[first] != self)
            first++;
        if (server_addr(h, first, &h->stall_sa) < 0 ||
            (strcmp(h->stall, "gen") == 0 && stall(h, &h->stall_sa) < 0))
            bad = 1;
    }
    for (int r = 0; r < h->nranks; r++) {
        if (h->node_of[r] != self)
            continue;
        worker_t *w = &h->w[h->nw++];
        w->h = h;
        w->rank = r;
        if ((rc = spawn(h, w, &em)) < 0) {
            printf("pmixhost: gen %u rank %d FAILED: %s\n", gen, r, em.s);
            h->nw--;
            bad = 1;
            break;
        }
    }
    if (bad && h->nw)
        kill_left(h, 0);
    else if (h->notify_early >= 0)
        failure(h, h->notify_early); /* before any rank could register */
    uv_timer_start(&h->watchdog, watchdog_fire, (uint64_t)h->timeout_s * 1000, 0);
    uv_run(&h->loop, UV_RUN_DEFAULT);
    h->t_gone = h->t_dropped ? ms_since(h->t_dropped) / 1e3 : 0;
    if (h->stall_open) {
        printf("pmixhost: stalled connection still open after %.0f ms\n", ms_since(h->t_stall));
        uv_close((uv_handle_t *)&h->stall_poll, stall_closed);
        uv_run(&h->loop, UV_RUN_DEFAULT);
    }
    dt_pmix_gen_end(h->pmix);
    fflush(stdout);

    printf("pmixhost: gen %u fences %d\n", gen, h->fences);
    printf("pmixhost: gen %u fds %d\n", gen, count_fds());
    dir = dt_xasprintf("%s/gen.%s", h->tmpdir, h->nspace);
    if (access(dir, F_OK) == 0 || find_vader(h->tmpdir)) {
        printf("pmixhost: gen %u FAILED: %s or a vader segment left behind\n", gen, dir);
        bad = 1;
    }
    free(dir);
    if (h->timed_out)
        bad = 1;

    int victim = h->kill_rank >= 0 ? h->kill_rank : h->notify_early;
    int survivors = 0, with_event = 0, exit4 = 0, clean = 0;
    double ev_max = 0, exit_max = 0;
    for (int i = 0; i < h->nw; i++) {
        worker_t *w = &h->w[i];
        if (w->rank == victim)
            continue;
        survivors++;
        clean += w->status == 0 && w->sig == 0 && w->summed;
        if (w->got_event) {
            with_event++;
            ev_max = w->event_ms > ev_max ? w->event_ms : ev_max;
        }
        if (w->status == 4 && w->sig == 0 && !w->grace_killed) {
            exit4++;
            exit_max = w->exit_ms > exit_max ? w->exit_ms : exit_max;
        }
    }
    if (h->drop_fence) {
        /* Open MPI carries on past a failed fence (the data of local peers
         * is still there): what counts is that the ranks were released */
        if (h->t_dropped && !h->timed_out)
            printf("pmixhost: gen %u ok: fence seq %d dropped, %d workers released, gone %.1f s "
                   "later\n",
                   gen, h->drop_fence, h->nw, h->t_gone);
        else
            bad = 1;
    } else if (h->kill_rank >= 0) {
        worker_t *v = find_rank(h, h->kill_rank);
        int killed = v && v->sig == SIGKILL;
        if (killed && with_event == survivors && exit4 == survivors && !bad)
            printf("pmixhost: gen %u ok: rank %d killed, %d of %d survivors got the event "
                   "(max %.1f ms) and exited 4 (max %.1f ms)\n",
                   gen, h->kill_rank, with_event, survivors, ev_max, exit_max);
        else {
            printf("pmixhost: gen %u FAILED: killed %d, event %d of %d, exit 4 %d of %d\n", gen,
                   killed, with_event, survivors, exit4, survivors);
            bad = 1;
        }
    } else if (h->notify_early >= 0) {
        /* the "dead" rank is alive and ignores news of itself */
        if (with_event == survivors && exit4 == survivors && !bad)
            printf("pmixhost: gen %u ok: failure of rank %d notified before MPI_Init, %d of %d "
                   "others got it on registering (max %.1f ms) and exited 4\n",
                   gen, victim, with_event, survivors, ev_max);
        else {
            printf("pmixhost: gen %u FAILED: event %d of %d, exit 4 %d of %d\n", gen, with_event,
                   survivors, exit4, survivors);
            bad = 1;
        }
    } else if (clean == survivors && !bad) {
        printf("pmixhost: gen %u ok: %d ranks here of %d, sums right, all exited 0\n", gen, clean,
               h->nranks);
    } else {
        printf("pmixhost: gen %u FAILED: %d of %d ranks clean\n", gen, clean, survivors);
        bad = 1;
    }
    free(h->w);
    h->w = NULL;
    h->nw = 0;
    fflush(stdout);
    return bad ? -1 : 0;
}

/* ---- refusals ------------------------------------------------------------------ */

static int expect(int rc, int want, const dt_emsg_t *em, const char *what)
{
    if (rc == want) {
        printf("pmixhost: refused as expected (%s): %s\n", what, em->s);
        return 0;
    }
    printf("pmixhost: FAILED %s: got %s, want %s (%s)\n", what, dt_err_name(rc), dt_err_name(want),
           rc < 0 ? em->s : "accepted");
    return 1;
}

static int refusals(host_t *h)
{
    static const char *const nodes[] = { "n0", "n1" };
    static const int node_of[] = { 0, 0, 1, 1 };
    static const int bad_of[] = { 0, 2, 1, 1 };
    dt_pmix_gen_t g = { .gen = 1,
                        .nspace = "dt.refuse.1",
                        .nranks = 4,
                        .nnodes = 2,
                        .nodes = nodes,
                        .node_of = node_of,
                        .self = "n0" };
    dt_pmix_gen_t b;
    dt_pmix_t *second = NULL;
    char **env = NULL;
    dt_emsg_t em = { "" };
    int bad = 0;

    bad += expect(dt_pmix_worker_env(h->pmix, 0, &env, &em), DT_ESTATE, &em, "env, no gen");
    bad += expect(dt_pmix_notify_failure(h->pmix, 0, &em), DT_ESTATE, &em, "notify, no gen");
    b = g, b.self = "n9";
    bad += expect(dt_pmix_gen_begin(h->pmix, &b, &em), DT_EINVAL, &em, "self not a node");
    b = g, b.node_of = bad_of;
    bad += expect(dt_pmix_gen_begin(h->pmix, &b, &em), DT_EINVAL, &em, "node index");
    b = g, b.nspace = "bad space";
    bad += expect(dt_pmix_gen_begin(h->pmix, &b, &em), DT_EINVAL, &em, "namespace");
    b = g, b.nranks = 0;
    bad += expect(dt_pmix_gen_begin(h->pmix, &b, &em), DT_EINVAL, &em, "no ranks");
    b = g, b.nodes = (const char *const[]){ "n0", "n0" };
    bad += expect(dt_pmix_gen_begin(h->pmix, &b, &em), DT_EINVAL, &em, "node twice");
    b = g, b.nodes = (const char *const[]){ "n0", "n1,n2" };
    bad += expect(dt_pmix_gen_begin(h->pmix, &b, &em), DT_EINVAL, &em, "node name");
    bad += expect(dt_pmix_new(&h->loop, h->tmpdir, NULL, NULL, &second, &em), DT_ESTATE, &em,
                  "second server");

    if (dt_pmix_gen_begin(h->pmix, &g, &em) < 0) {
        printf("pmixhost: FAILED good generation: %s\n", em.s);
        return 1;
    }
    bad += expect(dt_pmix_worker_env(h->pmix, 2, &env, &em), DT_EINVAL, &em, "remote rank");
    bad += expect(dt_pmix_worker_env(h->pmix, 4, &env, &em), DT_EINVAL, &em, "rank range");
    bad += expect(dt_pmix_notify_failure(h->pmix, -1, &em), DT_EINVAL, &em, "notify range");
    if (dt_pmix_worker_env(h->pmix, 1, &env, &em) < 0) {
        printf("pmixhost: FAILED env of rank 1: %s\n", em.s);
        bad++;
    }
    dt_pmix_env_free(env);
    dt_pmix_fence_done(h->pmix, 1, 99, 0, NULL, 0); /* unknown: ignored */
    dt_pmix_fence_done(h->pmix, 7, 1, 0, NULL, 0);
    dt_pmix_gen_end(h->pmix);
    dt_pmix_gen_end(h->pmix); /* twice is fine */
    printf("pmixhost: refusals %s\n", bad ? "FAILED" : "all as expected");
    return bad ? -1 : 0;
}

/* ---- main ---------------------------------------------------------------------- */

static void usage(void)
{
    fprintf(stderr, "usage: pmixhost --tmpdir DIR --worker PATH [--ranks R] [--gens G]\n"
                    "                [--nodes A,B,... --self A] [--relay] [--drop-fence SEQ]\n"
                    "                [--kill RANK] [--notify-early RANK] [--hold S] [--grace MS]\n"
                    "                [--timeout S]\n"
                    "                [--job NAME] [--fence-dir DIR] [--init-only]\n"
                    "                [--show-env RANK] [--refusals] [--stall gen|end] [-v]\n");
}

static int split_nodes(host_t *h, char *list)
{
    char *save = NULL;

    h->nnodes = 0;
    for (char *s = strtok_r(list, ",", &save); s; s = strtok_r(NULL, ",", &save)) {
        if (h->nnodes == MAX_NODES) {
            fprintf(stderr, "pmixhost: --nodes: more than %d nodes\n", MAX_NODES);
            return -1;
        }
        h->nodes[h->nnodes++] = s;
    }
    if (h->nnodes == 0) {
        fprintf(stderr, "pmixhost: --nodes: no node\n");
        return -1;
    }
    return 0;
}

int main(int argc, char **argv)
{
    static host_t host;
    host_t *h = &host;
    dt_pmix_ops_t ops = { on_fence, on_connected, on_finalized, on_aborted };
    char hostname[256] = "localhost", job[32];
    char *nodelist = NULL;
    dt_emsg_t em;
    int verbose = 0, bad = 0, fds1 = -1, fds2 = -1, rc;

    h->nranks = 4;
    h->gens = 1;
    h->kill_rank = -1;
    h->hold = -1;
    h->show_env = -1;
    h->notify_early = -1;
    h->timeout_s = 60;
    h->grace_ms = 3000;
    h->stall_fd = -1;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        int more = i + 1 < argc;

        rc = 0;
        if (strcmp(a, "--tmpdir") == 0 && more)
            h->tmpdir = argv[++i];
        else if (strcmp(a, "--worker") == 0 && more)
            h->worker_path = argv[++i];
        else if (strcmp(a, "--nodes") == 0 && more)
            nodelist = argv[++i];
        else if (strcmp(a, "--self") == 0 && more)
            h->self = argv[++i];
        else if (strcmp(a, "--job") == 0 && more)
            h->job = argv[++i];
        else if (strcmp(a, "--fence-dir") == 0 && more)
            h->fence_dir = argv[++i];
        else if (strcmp(a, "--ranks") == 0 && more)
            rc = parse_int(a, argv[++i], 1, MAX_RANKS, &h->nranks);
        else if (strcmp(a, "--gens") == 0 && more)
            rc = parse_int(a, argv[++i], 1, 1000, &h->gens);
        else if (strcmp(a, "--kill") == 0 && more)
            rc = parse_int(a, argv[++i], 0, MAX_RANKS - 1, &h->kill_rank);
        else if (strcmp(a, "--hold") == 0 && more)
            rc = parse_int(a, argv[++i], 0, 3600, &h->hold);
        else if (strcmp(a, "--grace") == 0 && more)
            rc = parse_int(a, argv[++i], 0, 600000, &h->grace_ms);
        else if (strcmp(a, "--timeout") == 0 && more)
            rc = parse_int(a, argv[++i], 1, 3600, &h->timeout_s);
        else if (strcmp(a, "--show-env") == 0 && more)
            rc = parse_int(a, argv[++i], 0, MAX_RANKS - 1, &h->show_env);
        else if (strcmp(a, "--notify-early") == 0 && more)
            rc = parse_int(a, argv[++i], 0, MAX_RANKS - 1, &h->notify_early);
        else if (strcmp(a, "--relay") == 0)
            h->relay = 1;
        else if (strcmp(a, "--drop-fence") == 0 && more)
            rc = parse_int(a, argv[++i], 1, 1000, &h->drop_fence);
        else if (strcmp(a, "--init-only") == 0)
            h->init_only = 1;
        else if (strcmp(a, "--stall") == 0 && more &&
                 (strcmp(argv[i + 1], "gen") == 0 || strcmp(argv[i + 1], "end") == 0))
            h->stall = argv[++i];
        else if (strcmp(a, "--refusals") == 0)
            h->refusals = 1;
        else if (strcmp(a, "-v") == 0)
            verbose = 1;
        else {
            fprintf(stderr, "pmixhost: unknown or incomplete option %s\n", a);
            usage();
            return 2;
        }
        if (rc < 0)
            return 2;
    }
    if (h->tmpdir == NULL || (h->worker_path == NULL && !h->refusals && h->show_env < 0)) {
        fprintf(stderr, "pmixhost: --tmpdir and --worker are required\n");
        usage();
        return 2;
    }
    if (h->kill_rank >= h->nranks) {
        fprintf(stderr, "pmixhost: --kill %d: only ranks 0 to %d\n", h->kill_rank, h->nranks - 1);
        return 2;
    }
    if (h->kill_rank >= 0 && h->hold < 0)
        h->hold = 30; /* survivors must be blocked in MPI when the kill comes */
    gethostname(hostname, sizeof(hostname) - 1);
    if (nodelist && split_nodes(h, nodelist) < 0)
        return 2;
    if (!nodelist) {
        h->nodes[0] = hostname;
        h->nnodes = 1;
    }
    if (h->self == NULL)
        h->self = h->nodes[0];
    if (h->job == NULL) {
        snprintf(job, sizeof(job), "dt.%ld", (long)getpid());
        h->job = job;
    }

    dt_log_init("pmixhost", verbose ? DT_LOG_DEBUG : DT_LOG_INFO);
    setvbuf(stdout, NULL, _IOLBF, 0);
    signal(SIGPIPE, SIG_IGN);
    /* every fence through the host, as if each had remote participants */
    if (h->relay)
        setenv("PMIX_MCA_pmix_server_fence_localonly_opt", "0", 1);
    uv_loop_init(&h->loop);
    uv_timer_init(&h->loop, &h->grace);
    uv_timer_init(&h->loop, &h->watchdog);
    h->grace.data = h->watchdog.data = h;
    if ((rc = dt_pmix_new(&h->loop, h->tmpdir, &ops, h, &h->pmix, &em)) == 0)
        dt_pmix_set_fence_timeout(h->pmix, 10000); /* the script waits for this one */
    if (rc < 0) {
        printf("pmixhost: cannot start the PMIx server: %s (%s)\n", em.s, dt_err_name(rc));
        return rc == DT_ECOMM || rc == DT_ENOTSUP ? 3 : 1;
    }
    printf("pmixhost: server up, fds %d\n", count_fds());

    if (h->refusals) {
        bad = refusals(h) < 0;
    } else {
        for (int g = 1; g <= h->gens; g++) {
            if (run_gen(h, (uint32_t)g) < 0)
                bad = 1;
            int fds = count_fds();
            if (g == 1)
                fds1 = fds;
            if (g == 2)
                fds2 = fds;
            if (g > 2 && fds != fds2) {
                printf("pmixhost: gen %d FAILED: %d fds open, %d after gen 2\n", g, fds, fds2);
                bad = 1;
            }
        }
        if (h->gens > 1)
            printf("pmixhost: fds after gen 1 %d, gen 2 %d, gen %d %d\n", fds1, fds2, h->gens,
                   count_fds());
    }

    pthread_t drip;
    int dripping = 0;
    if (h->stall && strcmp(h->stall, "end") == 0 && !h->refusals) {
        /* let libpmix take it and block in the handshake read */
        if (h->stall_sa.sin_port == 0 || stall(h, &h->stall_sa) < 0)
            bad = 1;
        else if (pthread_create(&drip, NULL, drip_main, &h->stall_fd) == 0)
            dripping = 1, usleep(300000);
        else
            bad = 1;
    }
    uint64_t t_free = uv_hrtime();
    dt_pmix_free(h->pmix);
    if (h->stall)
        printf("pmixhost: dt_pmix_free returned after %.0f ms%s\n", ms_since(t_free),
               dt_pmix_abandoned() ? ", finalize abandoned" : "");
    if (dripping) {
        drip_stop = 1;
        pthread_join(drip, NULL);
    }
    if (h->stall_open)
        uv_close((uv_handle_t *)&h->stall_poll, stall_closed);
    uv_close((uv_handle_t *)&h->grace, NULL);
    uv_close((uv_handle_t *)&h->watchdog, NULL);
    uv_run(&h->loop, UV_RUN_DEFAULT);
    if (uv_loop_close(&h->loop) != 0) {
        printf("pmixhost: FAILED: handles left open on the loop\n");
        bad = 1;
    }
    printf("pmixhost: %s\n", bad ? "FAILED" : "ok");
    if (dt_pmix_abandoned()) {
        /* libpmix's threads may hold its locks: as dtagentd, no exit handlers */
        fflush(NULL);
        _exit(bad ? 1 : 0);
    }
    return bad ? 1 : 0;
}
