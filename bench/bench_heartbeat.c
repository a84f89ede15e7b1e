/* SPDX-License-Identifier: MIT
 *
 * bench_heartbeat: a load generator for dtcoordd's agent path. It opens N
 * TCP connections (a few hundred connecting at a time), each authenticates
 * with its own munge credential (AUTH), registers as agent "bench-<i>" of
 * one job (REGISTER) and then sends HEARTBEAT at --rate Hz, the N agents'
 * phases spread uniformly over the period so the load is smooth. After a
 * 2 s warm-up it measures, for --seconds, each heartbeat's latency from
 * send to reply (CLOCK_MONOTONIC, seen from this process), and with --pid
 * the coordinator's CPU (/proc/PID/stat) and RSS (/proc/PID/status) over
 * the same window; its own CPU too, so a reader can see the generator was
 * not what saturated the machine. Prints one key=value line; asserts
 * nothing.
 *
 * Not a model of dtagentd: no workers, no progress, no reconnects.
 */
#include "config.h"

#include <errno.h>
#include <getopt.h>
#include <munge.h>
#include <netdb.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include <uv.h>

#include "common/clock.h"
#include "common/mem.h"
#include "common/msg.h"
#include "common/uvframe.h"
#include "common/wire.h"

#define WARMUP_S 2.0
#define DRAIN_S 2.0
#define INFLIGHT 32   /* heartbeats one agent may have unanswered; more are skipped */
#define FD_RESERVE 64 /* stdio, the loop's own descriptors, munge, /proc reads */
#define ID_AUTH 1u
#define ID_REGISTER 2u
#define MAX_ERRLOG 5 /* distinct failures echoed to stderr */

enum agent_state {
    A_IDLE,
    A_CONNECTING,
    A_AUTH,
    A_REGISTER,
    A_LIVE,
    A_DONE, /* closed, or closing */
};

typedef struct bench bench_t;

typedef struct agent {
    uv_tcp_t tcp;
    uv_connect_t creq;
    uv_timer_t timer;
    bench_t *b;
    int idx;
    enum agent_state state;
    int have_tcp, have_timer;
    char *cred;        /* munge credential for AUTH; freed once sent */
    int64_t id;        /* agent id from REGISTER */
    uint32_t next_req; /* next heartbeat request id */
    int64_t slot;      /* next heartbeat slot (see slot_ns) */
    dt_uvframe_t rd;   /* the coordinator's replies (common/uvframe.h) */
    unsigned inflight;
    struct {
        uint32_t id;   /* 0: free */
        int measured;  /* sent inside the measurement window */
        uint64_t sent; /* ns */
    } ring[INFLIGHT];
} agent_t;

typedef struct cpu_sample {
    uint64_t wall_ns;
    double coord_s; /* utime + stime of --pid, seconds; < 0 when unknown */
    double self_s;
} cpu_sample_t;

struct bench {
    /* options */
    struct sockaddr_storage addr;
    const char *munge_socket;
    int64_t job;
    int n;
    double seconds, rate;
    int ramp;
    double setup_timeout;
    long pid;

    uv_loop_t *loop;
    agent_t *agents;
    uv_timer_t phase_timer; /* setup deadline, warm-up end, window end, drain end */
    int have_phase_timer;
    uint64_t origin_ns, period_ns, setup_ns;
    int next_to_start, in_setup, registered, setup_errors, setup_done;
    enum { P_SETUP, P_WARMUP, P_MEASURE, P_DRAIN, P_OVER } phase;

    /* measurements */
    double *lat_ms;
    size_t nlat, caplat;
    uint64_t sent, replies, err_replies, lost, skipped, unanswered;
    cpu_sample_t c0, c1;
    int nerrlog;
};

/* ---- small helpers -------------------------------------------------------------- */

static void errlog(bench_t *b, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

static void errlog(bench_t *b, const char *fmt, ...)
{
    va_list ap;

    if (b->nerrlog++ >= MAX_ERRLOG) {
        if (b->nerrlog == MAX_ERRLOG + 1)
            fprintf(stderr, "bench_heartbeat: (further errors not shown)\n");
        return;
    }
    fputs("bench_heartbeat: ", stderr);
    va_start(ap, fmt);
    vfprintf(stderr, fmt, ap);
    va_end(ap);
    fputc('\n', stderr);
}

/* utime + stime of a process in seconds, from /proc/PID/stat; -1 if unreadable. */
static double proc_cpu_s(long pid)
{
    char path[64], buf[1024], *p;
    FILE *f;
    size_t n;

    snprintf(path, sizeof(path), "/proc/%ld/stat", pid);
    if ((f = fopen(path, "r")) == NULL)
        return -1;
    n = fread(buf, 1, sizeof(buf) - 1, f);
    fclose(f);
    buf[n] = '\0';
    /* the command name (field 2) may hold spaces and parentheses: skip to
     * the last ')', then fields 3..13, to utime (14) and stime (15) */
    if ((p = strrchr(buf, ')')) == NULL)
        return -1;
    p++;
    for (int field = 3; field <= 13; field++) {
        p += strspn(p, " ");
        p += strcspn(p, " ");
    }
    char *end;
    unsigned long long ut = strtoull(p, &end, 10), st = strtoull(end, &end, 10);
    if (end == p)
        return -1;
    return (double)(ut + st) / (double)sysconf(_SC_CLK_TCK);
}

/* VmRSS of a process in MiB; -1 if unreadable. */
static double proc_rss_mib(long pid)
{
    char path[64], line[256];
    double mib = -1;
    FILE *f;

    snprintf(path, sizeof(path), "/proc/%ld/status", pid);
    if ((f = fopen(path, "r")) == NULL)
        return -1;
    while (fgets(line, sizeof(line), f))
        if (strncmp(line, "VmRSS:", 6) == 0) {
            mib = strtod(line + 6, NULL) / 1024.0;
            break;
        }
    fclose(f);
    return mib;
}

static double self_cpu_s(void)
{
    struct rusage ru;

    getrusage(RUSAGE_SELF, &ru);
    return (double)ru.ru_utime.tv_sec + (double)ru.ru_utime.tv_usec / 1e6 +
           (double)ru.ru_stime.tv_sec + (double)ru.ru_stime.tv_usec / 1e6;
}

static void cpu_sample(const bench_t *b, cpu_sample_t *s)
{
    s->wall_ns = (uint64_t)dt_clock_mono_ns();
    s->coord_s = b->pid > 0 ? proc_cpu_s(b->pid) : -1;
    s->self_s = self_cpu_s();
}

static int cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

/* Nearest-rank percentile of sorted v[0..n). */
static double percentile(const double *v, size_t n, double p)
{
    if (n == 0)
        return 0;
    size_t r = (size_t)(p * (double)n + 0.999999999);
    return v[r == 0 ? 0 : (r > n ? n - 1 : r - 1)];
}

/* ---- agents ------------------------------------------------------------------------ */

static void start_next(bench_t *b);
static void setup_finished(bench_t *b);
static void maybe_end_drain(bench_t *b);

static void on_agent_closed(uv_handle_t *h)
{
    (void)h; /* agents live in one array, freed after the loop */
}

static void agent_close(agent_t *a)
{
    if (a->state == A_DONE)
        return;
    a->state = A_DONE;
    if (a->have_timer)
        uv_close((uv_handle_t *)&a->timer, on_agent_closed);
    if (a->have_tcp)
        uv_close((uv_handle_t *)&a->tcp, on_agent_closed);
    free(a->cred);
    a->cred = NULL;
}

/* A setup step failed or finished: let the next agent start connecting. */
static void setup_step_done(agent_t *a, int ok)
{
    bench_t *b = a->b;

    b->in_setup--;
    if (ok)
        b->registered++;
    else
        b->setup_errors++;
    start_next(b);
    if (b->phase == P_SETUP && b->in_setup == 0 && b->next_to_start == b->n)
        setup_finished(b);
}

static void setup_failed(agent_t *a)
{
    agent_close(a);
    setup_step_done(a, 0);
}

/* The agent is gone while live: its unanswered heartbeats are lost with it. */
static void live_failed(agent_t *a)
{
    bench_t *b = a->b;

    for (int i = 0; i < INFLIGHT; i++)
        if (a->ring[i].id && a->ring[i].measured)
            b->unanswered++;
    if (b->phase == P_WARMUP || b->phase == P_MEASURE)
        b->lost++;
    a->inflight = 0;
    agent_close(a);
    maybe_end_drain(b);
}

static void on_written(uv_write_t *w, int status)
{
    (void)status; /* a dead peer shows up on the read side */
    free(w->data);
    free(w);
}

/* Encode and queue one frame; takes ownership of body. When sent is not
 * NULL it receives the time just before the write, after the encoding. */
static int agent_send(agent_t *a, uint16_t type, uint32_t id, json_t *body, uint64_t *sent)
{
    uint8_t *frame;
    size_t len;
    int rc = dt_msg_encode(type, id, body, &frame, &len);

    json_decref(body);
    if (rc < 0)
        return rc;
    uv_write_t *w = dt_xmalloc(sizeof(*w));
    uv_buf_t buf = uv_buf_init((char *)frame, (unsigned)len);
    w->data = frame;
    if (sent)
        *sent = (uint64_t)dt_clock_mono_ns();
    if ((rc = uv_write(w, (uv_stream_t *)&a->tcp, &buf, 1, on_written)) < 0) {
        free(frame);
        free(w);
    }
    return rc;
}

/* Slot k of agent i: origin + (i / N + k) periods. */
static uint64_t slot_ns(const agent_t *a, int64_t k)
{
    const bench_t *b = a->b;
    return b->origin_ns + (uint64_t)k * b->period_ns +
           (uint64_t)((double)b->period_ns * a->idx / b->n);
}

static void on_beat(uv_timer_t *t);

static void schedule(agent_t *a)
{
    uint64_t now = (uint64_t)dt_clock_mono_ns(), at;

    while ((at = slot_ns(a, a->slot)) < now)
        a->slot++;
    uv_timer_start(&a->timer, on_beat, (at - now + 999999) / 1000000, 0);
}

static void on_beat(uv_timer_t *t)
{
    agent_t *a = t->data;
    bench_t *b = a->b;

    if (a->state != A_LIVE || b->phase >= P_DRAIN)
        return;
    a->slot++;
    schedule(a);
    int measured = b->phase == P_MEASURE;
    if (a->inflight >= INFLIGHT) {
        if (measured)
            b->skipped++;
        return;
    }
    uint32_t id = a->next_req++;
    if (a->next_req == 0)
        a->next_req = ID_REGISTER + 1;
    int slot = (int)(id % INFLIGHT);
    if (a->ring[slot].id != 0) { /* an older one still there: count it lost */
        if (a->ring[slot].measured)
            b->unanswered++;
        a->inflight--;
    }
    a->ring[slot].id = id;
    a->ring[slot].measured = measured;
    a->inflight++;
    if (measured)
        b->sent++;
    dt_wire_agent_ref_t hb = { .agent = a->id };
    if (agent_send(a, DT_MSG_HEARTBEAT, id, dt_wire_heartbeat_encode(&hb),
                   &a->ring[slot].sent) < 0)
        live_failed(a);
}

static void on_reply(agent_t *a, const dt_msg_t *m)
{
    bench_t *b = a->b;
    const char *why = "";
    dt_wire_error_t e;
    dt_emsg_t em = { "" };

    if (m->type == DT_MSG_ERROR) {
        why = dt_wire_error_decode(m, &e, &em) == 0 ? e.error : "(no message)";
    } else if (m->type != DT_MSG_OK) {
        errlog(b, "agent %d: unexpected %s frame from the coordinator", a->idx,
               dt_msg_type_name(m->type));
        if (a->state == A_LIVE)
            live_failed(a);
        else
            setup_failed(a);
        return;
    }

    switch (a->state) {
    case A_AUTH:
        if (m->id != ID_AUTH || m->type == DT_MSG_ERROR) {
            errlog(b, "agent %d: AUTH refused: %s", a->idx, why);
            setup_failed(a);
            return;
        }
        a->state = A_REGISTER;
        {
            char node[32];
            snprintf(node, sizeof(node), "bench-%d", a->idx);
            dt_wire_register_t reg = { .job = b->job, .node = node, .slots = 1 };
            if (agent_send(a, DT_MSG_REGISTER, ID_REGISTER, dt_wire_register_encode(&reg),
                           NULL) < 0) {
                errlog(b, "agent %d: cannot send REGISTER", a->idx);
                setup_failed(a);
            }
        }
        return;
    case A_REGISTER: {
        dt_wire_register_ok_t ok;
        if (m->id != ID_REGISTER || m->type == DT_MSG_ERROR ||
            dt_wire_register_ok_decode(m, &ok, &em) < 0) {
            errlog(b, "agent %d: REGISTER refused: %s", a->idx,
                   m->type == DT_MSG_ERROR ? why : "reply without an agent id");
            setup_failed(a);
            return;
        }
        a->id = ok.agent;
        a->state = A_LIVE;
        a->next_req = ID_REGISTER + 1;
        uv_timer_init(b->loop, &a->timer);
        a->timer.data = a;
        a->have_timer = 1;
        schedule(a);
        setup_step_done(a, 1);
        return;
    }
    case A_LIVE: {
        int slot = (int)(m->id % INFLIGHT);
        if (a->ring[slot].id != m->id) {
            errlog(b, "agent %d: reply to request %u, which is not outstanding", a->idx,
                   (unsigned)m->id);
            live_failed(a);
            return;
        }
        uint64_t t = (uint64_t)dt_clock_mono_ns();
        if (a->ring[slot].measured) {
            if (m->type == DT_MSG_ERROR) {
                b->err_replies++;
                errlog(b, "agent %d: HEARTBEAT refused: %s", a->idx, why);
            } else {
                b->replies++;
                if (b->nlat == b->caplat) {
                    b->caplat = b->caplat ? 2 * b->caplat : 65536;
                    b->lat_ms = dt_xrealloc(b->lat_ms, b->caplat * sizeof(double));
                }
                b->lat_ms[b->nlat++] = (double)(t - a->ring[slot].sent) / 1e6;
            }
        }
        a->ring[slot].id = 0;
        a->inflight--;
        maybe_end_drain(b);
        return;
    }
    default:
        return;
    }
}

static void on_alloc(uv_handle_t *h, size_t hint, uv_buf_t *buf)
{
    agent_t *a = h->data;

    (void)hint;
    dt_uvframe_alloc(&a->rd, buf);
}

static int on_frame(void *ud, dt_msg_t *m)
{
    agent_t *a = ud;

    on_reply(a, m);
    return a->state == A_DONE; /* stop reading once this agent is done */
}

static void on_read(uv_stream_t *s, ssize_t n, const uv_buf_t *buf)
{
    agent_t *a = s->data;
    dt_emsg_t em = { "" };
    int rc;

    (void)buf;
    if (a->state == A_DONE)
        return;
    rc = dt_uvframe_read(&a->rd, n, on_frame, a, &em);
    if (rc >= 0)
        return;
    if (n < 0) {
        if (a->b->phase < P_DRAIN)
            errlog(a->b, "agent %d: connection lost: %s", a->idx, uv_strerror((int)n));
    } else {
        errlog(a->b, "agent %d: bad frame from the coordinator: %s", a->idx, em.s);
    }
    if (a->state == A_LIVE)
        live_failed(a);
    else
        setup_failed(a);
}

static void on_connect(uv_connect_t *req, int status)
{
    agent_t *a = req->data;
    int rc;

    if (a->state == A_DONE) /* the setup deadline passed meanwhile */
        return;
    if (status < 0) {
        errlog(a->b, "agent %d: connect: %s", a->idx, uv_strerror(status));
        setup_failed(a);
        return;
    }
    uv_tcp_nodelay(&a->tcp, 1);
    a->state = A_AUTH;
    if ((rc = uv_read_start((uv_stream_t *)&a->tcp, on_alloc, on_read)) < 0 ||
        (rc = agent_send(a, DT_MSG_AUTH, ID_AUTH,
                         dt_wire_auth_encode(&(dt_wire_auth_t){ .cred = a->cred }), NULL)) < 0) {
        errlog(a->b, "agent %d: cannot start AUTH: %s", a->idx, uv_strerror(rc));
        setup_failed(a);
        return;
    }
    free(a->cred);
    a->cred = NULL;
}

static void agent_start(agent_t *a)
{
    bench_t *b = a->b;
    int rc;

    b->in_setup++;
    if ((rc = uv_tcp_init(b->loop, &a->tcp)) < 0) {
        errlog(b, "agent %d: uv_tcp_init: %s", a->idx, uv_strerror(rc));
        setup_failed(a);
        return;
    }
    a->have_tcp = 1;
    a->tcp.data = a;
    a->creq.data = a;
    a->state = A_CONNECTING;
    if ((rc = uv_tcp_connect(&a->creq, &a->tcp, (struct sockaddr *)&b->addr, on_connect)) < 0) {
        errlog(b, "agent %d: connect: %s", a->idx, uv_strerror(rc));
        setup_failed(a);
    }
}

static void start_next(bench_t *b)
{
    while (b->phase == P_SETUP && b->in_setup < b->ramp && b->next_to_start < b->n)
        agent_start(&b->agents[b->next_to_start++]);
}

/* ---- phases ------------------------------------------------------------------------ */

static void on_phase(uv_timer_t *t);

static void close_all(bench_t *b)
{
    b->phase = P_OVER;
    for (int i = 0; i < b->n; i++) {
        agent_t *a = &b->agents[i];
        if (a->state == A_LIVE)
            for (int k = 0; k < INFLIGHT; k++)
                if (a->ring[k].id && a->ring[k].measured)
                    b->unanswered++;
        agent_close(a);
    }
    if (b->have_phase_timer) {
        b->have_phase_timer = 0;
        uv_close((uv_handle_t *)&b->phase_timer, NULL);
    }
}

static void maybe_end_drain(bench_t *b)
{
    if (b->phase != P_DRAIN)
        return;
    for (int i = 0; i < b->n; i++)
        if (b->agents[i].state == A_LIVE && b->agents[i].inflight > 0)
            return;
    close_all(b);
}

static void setup_finished(bench_t *b)
{
    b->setup_done = 1;
    b->setup_ns = (uint64_t)dt_clock_mono_ns() - b->origin_ns;
    fprintf(stderr, "bench_heartbeat: %d of %d agents registered in %.2f s\n", b->registered, b->n,
            (double)b->setup_ns / 1e9);
    if (b->registered == 0) {
        close_all(b);
        return;
    }
    b->phase = P_WARMUP;
    uv_timer_start(&b->phase_timer, on_phase, (uint64_t)(WARMUP_S * 1000), 0);
}

static void on_phase(uv_timer_t *t)
{
    bench_t *b = t->data;

    switch (b->phase) {
    case P_SETUP: /* the setup deadline: give up on agents still connecting */
        errlog(b, "%d agents still setting up after %.0f s: giving up on them", b->in_setup,
               b->setup_timeout);
        b->setup_errors += b->n - b->next_to_start;
        b->next_to_start = b->n;
        for (int i = 0; i < b->n; i++) {
            agent_t *a = &b->agents[i];
            if (a->state >= A_CONNECTING && a->state <= A_REGISTER)
                setup_failed(a); /* the last one calls setup_finished */
        }
        return;
    case P_WARMUP:
        cpu_sample(b, &b->c0);
        b->phase = P_MEASURE;
        uv_timer_start(t, on_phase, (uint64_t)(b->seconds * 1000), 0);
        return;
    case P_MEASURE:
        cpu_sample(b, &b->c1);
        b->phase = P_DRAIN;
        uv_timer_start(t, on_phase, (uint64_t)(DRAIN_S * 1000), 0);
        maybe_end_drain(b);
        return;
    case P_DRAIN:
        close_all(b);
        return;
    default:
        return;
    }
}

/* ---- setup before the loop ---------------------------------------------------------- */

static void usage(FILE *f)
{
    fprintf(f,
            "usage: bench_heartbeat --coord HOST:PORT --job ID --agents N --seconds S\n"
            "                       [--munge-socket PATH] [--rate HZ] [--pid COORDPID]\n"
            "                       [--ramp K] [--setup-timeout S]\n"
            "  --coord HOST:PORT    dtcoordd's TCP listener\n"
            "  --munge-socket PATH  munged's socket (default: libmunge's)\n"
            "  --job ID             the job the agents register with (must not be finished)\n"
            "  --agents N           connections, one agent each\n"
            "  --seconds S          measured window, after a %.0f s warm-up\n"
            "  --rate HZ            heartbeats per agent per second (default 1)\n"
            "  --pid COORDPID       also report this process's CPU and RSS\n"
            "  --ramp K             connections setting up at once (default 256)\n"
            "  --setup-timeout S    give up on agents not registered by then (default 120)\n"
            "Prints one line of key=value; asserts nothing.\n",
            WARMUP_S);
}

static int parse_addr(const char *hostport, struct sockaddr_storage *ss)
{
    char host[256];
    const char *colon = strrchr(hostport, ':');
    struct addrinfo hints = { .ai_socktype = SOCK_STREAM }, *res;
    size_t hl;
    int rc;

    if (colon == NULL || colon[1] == '\0' || (hl = (size_t)(colon - hostport)) >= sizeof(host)) {
        fprintf(stderr, "bench_heartbeat: --coord %s: expected HOST:PORT\n", hostport);
        return -1;
    }
    memcpy(host, hostport, hl);
    host[hl] = '\0';
    if (hl >= 2 && host[0] == '[' && host[hl - 1] == ']') {
        memmove(host, host + 1, hl - 2);
        host[hl - 2] = '\0';
    }
    if ((rc = getaddrinfo(host, colon + 1, &hints, &res)) != 0) {
        fprintf(stderr, "bench_heartbeat: --coord %s: %s\n", hostport, gai_strerror(rc));
        return -1;
    }
    memcpy(ss, res->ai_addr, res->ai_addrlen);
    freeaddrinfo(res);
    return 0;
}

/* Raise the descriptor limit to the hard limit; refuse an N that cannot fit. */
static int raise_nofile(int n)
{
    struct rlimit rl;
    rlim_t want = (rlim_t)n + FD_RESERVE;

    if (getrlimit(RLIMIT_NOFILE, &rl) < 0) {
        fprintf(stderr, "bench_heartbeat: getrlimit: %s\n", strerror(errno));
        return -1;
    }
    if (rl.rlim_cur < rl.rlim_max) {
        rlim_t old = rl.rlim_cur;
        /* an unlimited hard limit still stops at fs.nr_open */
        rl.rlim_cur = rl.rlim_max == RLIM_INFINITY ? (want > old ? want : old) : rl.rlim_max;
        if (setrlimit(RLIMIT_NOFILE, &rl) < 0) {
            fprintf(stderr, "bench_heartbeat: setrlimit(RLIMIT_NOFILE, %llu): %s\n",
                    (unsigned long long)rl.rlim_cur, strerror(errno));
            rl.rlim_cur = old;
        }
    }
    if (rl.rlim_cur < want) {
        fprintf(stderr,
                "bench_heartbeat: --agents %d needs %llu file descriptors (one per agent and "
                "%d spare) but RLIMIT_NOFILE is %llu (hard limit %llu): raise the hard limit "
                "or use at most %lld agents\n",
                n, (unsigned long long)want, FD_RESERVE, (unsigned long long)rl.rlim_cur,
                (unsigned long long)rl.rlim_max,
                (long long)rl.rlim_cur > FD_RESERVE ? (long long)rl.rlim_cur - FD_RESERVE : 0LL);
        return -1;
    }
    return 0;
}

/* One credential per connection: munged refuses a replayed one. munge_encode
 * blocks on munged, so all of them are made before the loop starts. */
static int encode_creds(bench_t *b)
{
    munge_ctx_t ctx = munge_ctx_create();
    double t0 = (double)(uint64_t)dt_clock_mono_ns();
    int rc = 0;

    if (ctx == NULL) {
        fprintf(stderr, "bench_heartbeat: munge: cannot create a context\n");
        return -1;
    }
    if (b->munge_socket &&
        munge_ctx_set(ctx, MUNGE_OPT_SOCKET, b->munge_socket) != EMUNGE_SUCCESS) {
        fprintf(stderr, "bench_heartbeat: munge: bad socket %s\n", b->munge_socket);
        rc = -1;
        goto out;
    }
    for (int i = 0; i < b->n; i++) {
        munge_err_t e = munge_encode(&b->agents[i].cred, ctx, NULL, 0);
        if (e != EMUNGE_SUCCESS) {
            const char *s = munge_ctx_strerror(ctx); /* names the socket */
            fprintf(stderr, "bench_heartbeat: munge_encode: %s\n", s ? s : munge_strerror(e));
            rc = -1;
            goto out;
        }
    }
    fprintf(stderr, "bench_heartbeat: %d munge credentials in %.2f s\n", b->n,
            ((double)(uint64_t)dt_clock_mono_ns() - t0) / 1e9);
out:
    munge_ctx_destroy(ctx);
    return rc;
}

static int parse_num(const char *opt, const char *s, double lo, double hi, double *out)
{
    char *end;

    errno = 0;
    double v = strtod(s, &end);
    if (errno || end == s || *end != '\0' || !(v >= lo && v <= hi)) {
        fprintf(stderr, "bench_heartbeat: %s '%s': expected a number in [%g, %g]\n", opt, s, lo,
                hi);
        return -1;
    }
    *out = v;
    return 0;
}

int main(int argc, char **argv)
{
    static const struct option lo[] = {
        { "coord", required_argument, NULL, 'c' },
        { "munge-socket", required_argument, NULL, 'm' },
        { "job", required_argument, NULL, 'j' },
        { "agents", required_argument, NULL, 'n' },
        { "seconds", required_argument, NULL, 's' },
        { "rate", required_argument, NULL, 'r' },
        { "pid", required_argument, NULL, 'p' },
        { "ramp", required_argument, NULL, 'R' },
        { "setup-timeout", required_argument, NULL, 'T' },
        { "help", no_argument, NULL, 'h' },
        { NULL, 0, NULL, 0 },
    };
    bench_t b = { .rate = 1, .ramp = 256, .setup_timeout = 120, .job = -1 };
    const char *coord = NULL;
    double v;
    int opt, code = 1;
    uv_loop_t loop;

    /* arguments */
    while ((opt = getopt_long(argc, argv, "h", lo, NULL)) != -1) {
        switch (opt) {
        case 'c': coord = optarg; break;
        case 'm': b.munge_socket = optarg; break;
        case 'j':
            if (parse_num("--job", optarg, 1, 9e15, &v) < 0)
                return 2;
            b.job = (int64_t)v;
            break;
        case 'n':
            if (parse_num("--agents", optarg, 1, 1 << 20, &v) < 0)
                return 2;
            b.n = (int)v;
            break;
        case 's':
            if (parse_num("--seconds", optarg, 0.1, 86400, &b.seconds) < 0)
                return 2;
            break;
        case 'r':
            if (parse_num("--rate", optarg, 0.001, 1000, &b.rate) < 0)
                return 2;
            break;
        case 'p':
            if (parse_num("--pid", optarg, 1, 4194304, &v) < 0)
                return 2;
            b.pid = (long)v;
            break;
        case 'R':
            if (parse_num("--ramp", optarg, 1, 65536, &v) < 0)
                return 2;
            b.ramp = (int)v;
            break;
        case 'T':
            if (parse_num("--setup-timeout", optarg, 1, 86400, &b.setup_timeout) < 0)
                return 2;
            break;
        case 'h': usage(stdout); return 0;
        default: usage(stderr); return 2;
        }
    }
    if (optind < argc || coord == NULL || b.job < 0 || b.n == 0 || b.seconds == 0) {
        if (optind < argc)
            fprintf(stderr, "bench_heartbeat: unexpected argument '%s'\n", argv[optind]);
        else
            fprintf(stderr, "bench_heartbeat: --coord, --job, --agents and --seconds are "
                            "required\n");
        usage(stderr);
        return 2;
    }
    if (parse_addr(coord, &b.addr) < 0 || raise_nofile(b.n) < 0)
        return 2;
    if (b.pid > 0 && proc_cpu_s(b.pid) < 0) {
        fprintf(stderr, "bench_heartbeat: --pid %ld: cannot read /proc/%ld/stat\n", b.pid, b.pid);
        return 2;
    }

    /* credentials, then the loop */
    b.agents = dt_xcalloc((size_t)b.n, sizeof(*b.agents));
    for (int i = 0; i < b.n; i++) {
        b.agents[i].b = &b;
        b.agents[i].idx = i;
        dt_uvframe_init(&b.agents[i].rd, DT_MSG_MAX);
    }
    if (encode_creds(&b) < 0)
        goto out;
    uv_loop_init(&loop);
    b.loop = &loop;
    b.period_ns = (uint64_t)(1e9 / b.rate);
    b.origin_ns = (uint64_t)dt_clock_mono_ns();
    uv_timer_init(&loop, &b.phase_timer);
    b.phase_timer.data = &b;
    b.have_phase_timer = 1;
    uv_timer_start(&b.phase_timer, on_phase, (uint64_t)(b.setup_timeout * 1000), 0);
    b.phase = P_SETUP;
    start_next(&b);
    uv_run(&loop, UV_RUN_DEFAULT);
    uv_loop_close(&loop);

    /* one line of results */
    if (b.nlat > 0)
        qsort(b.lat_ms, b.nlat, sizeof(double), cmp_double);
    double win = b.c1.wall_ns > b.c0.wall_ns ? (double)(b.c1.wall_ns - b.c0.wall_ns) / 1e9 : 0;
    char coord_cpu[32] = "-", coord_rss[32] = "-", gen_cpu[32] = "-";
    if (win > 0) {
        if (b.c0.coord_s >= 0 && b.c1.coord_s >= 0)
            snprintf(coord_cpu, sizeof(coord_cpu), "%.1f",
                     100 * (b.c1.coord_s - b.c0.coord_s) / win);
        snprintf(gen_cpu, sizeof(gen_cpu), "%.1f", 100 * (b.c1.self_s - b.c0.self_s) / win);
    }
    if (b.pid > 0) {
        double rss = proc_rss_mib(b.pid);
        if (rss >= 0)
            snprintf(coord_rss, sizeof(coord_rss), "%.1f", rss);
    }
    printf("agents=%d registered=%d setup_errors=%d setup_s=%.2f window_s=%.2f sent=%llu "
           "replies=%llu errors=%llu lost=%llu unanswered=%llu skipped=%llu p50_ms=%.3f "
           "p99_ms=%.3f max_ms=%.3f rate_hz=%.1f coord_cpu_pct=%s coord_rss_mib=%s "
           "gen_cpu_pct=%s\n",
           b.n, b.registered, b.setup_errors, (double)b.setup_ns / 1e9, win,
           (unsigned long long)b.sent, (unsigned long long)b.replies,
           (unsigned long long)(b.err_replies + b.lost + b.unanswered), (unsigned long long)b.lost,
           (unsigned long long)b.unanswered, (unsigned long long)b.skipped,
           percentile(b.lat_ms, b.nlat, 0.50), percentile(b.lat_ms, b.nlat, 0.99),
           b.nlat ? b.lat_ms[b.nlat - 1] : 0.0, win > 0 ? (double)b.replies / win : 0.0, coord_cpu,
           coord_rss, gen_cpu);
    code = b.replies > 0 ? 0 : 1;
out:
    for (int i = 0; i < b.n; i++) {
        free(b.agents[i].cred);
        dt_uvframe_close(&b.agents[i].rd);
    }
    free(b.agents);
    free(b.lat_ms);
    return code;
}
