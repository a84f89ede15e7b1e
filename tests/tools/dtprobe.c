/* SPDX-License-Identifier: MIT
 *
 * dtprobe: a protocol probe for the integration tests. It connects to a
 * coordinator (Unix socket or TCP), optionally authenticates with a real
 * munge credential (or a bogus one, or one saved in a file so that it can
 * be replayed), sends one or more request frames, or raw bytes, or a header
 * announcing an oversize payload, and prints each reply as one line:
 *
 *   OK {json}              the reply was DT_MSG_OK
 *   ERROR code=N {json}    the reply was DT_MSG_ERROR with that code
 *   CLOSED                 the peer closed the connection without a reply
 *   TIMEOUT                no reply within --timeout seconds
 *
 * Exit status: 0 all OK, 1 ERROR, 2 usage, 3 CLOSED, 4 could not connect
 * or make a credential, 5 timeout or a reply that is not a frame. With
 * several requests the probe stops at the first that is not OK (unless
 * --keep-going) and exits with that one's status.
 *
 * Hostile peers, for the coordinator's limits (tests/integration/limits.sh):
 *
 *   --flood N    send the first request N times, in large writes, and never
 *                read a reply; prints `FLOOD sent=S of N: done|closed|stalled`
 *                (stalled: no byte went out for --timeout seconds), exits 0,
 *                3 or 5 accordingly
 *   --idle N     open N more connections that never send a byte; prints
 *                `IDLE opened=K of N` once they are open
 *   --hold MS    then keep everything open (and unread) for MS ms
 *   --wait-close S  then wait up to S seconds, still without reading, until
 *                the peer has closed the connection (all N with --idle);
 *                prints `CLOSED after MS ms`, or `IDLE closed=C of K after MS
 *                ms`; exits 3 when everything was closed, 5 otherwise
 *
 * A request body may refer to an earlier reply: a top-level string value
 * "$NAME" is replaced by field NAME of the latest OK reply that has it, so
 * `REGISTER '{"job":1,"node":"n","slots":2}' HEARTBEAT '{"agent":"$agent"}'`
 * heartbeats the agent just registered, on the same connection.
 *
 * It is a test tool, not a client: no retries, no reconnects, blocking I/O.
 */
#include "config.h"

#include <errno.h>
#include <getopt.h>
#include <munge.h>
#include <netdb.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <sys/un.h>
#include <time.h>
#include <unistd.h>

#include "common/clock.h"
#include "common/mem.h"
#include "common/msg.h"

enum {
    PROBE_OK = 0,
    PROBE_ERROR = 1,
    PROBE_USAGE = 2,
    PROBE_CLOSED = 3,
    PROBE_NOCONN = 4,
    PROBE_TIMEOUT = 5,
};

typedef struct probe {
    int fd;
    uint32_t next_id;
    uint8_t *buf; /* bytes received and not yet decoded */
    size_t have, cap;
    json_t *vars; /* fields of the OK replies so far, for "$NAME" */
} probe_t;

static void usage(FILE *f)
{
    fprintf(f, "usage: dtprobe (--socket PATH | --tcp HOST:PORT) [options] [TYPE [JSON]]...\n"
               "  --socket PATH        the coordinator's Unix socket\n"
               "  --tcp HOST:PORT      the coordinator's TCP listener\n"
               "  --auth               send AUTH with a munge credential first\n"
               "  --munge-socket PATH  munged's socket (default: libmunge's)\n"
               "  --bad-auth           send AUTH with a bogus credential first\n"
               "  --cred-file FILE     with --auth: use the credential in FILE, or make one\n"
               "                       and save it there (a second run replays it)\n"
               "  --raw HEX            send these bytes (after AUTH) instead of a frame\n"
               "  --oversize           send a TYPE header announcing DT_MSG_MAX+1 bytes\n"
               "  --pause MS           wait MS milliseconds between requests\n"
               "  --hold MS            keep the connection open MS ms after the last reply\n"
               "  --timeout S          seconds to wait for each reply (default 10)\n"
               "  --keep-going         send every request even after an ERROR\n"
               "  --flood N            send the first request N times, never read a reply\n"
               "  --idle N             open N more connections that send nothing\n"
               "  --wait-close S       then wait up to S s (not reading) for the peer to close\n"
               "TYPE is a message name (SUBMIT, PING, ...) or number; JSON defaults to {}.\n"
               "Prints `OK {json}`, `ERROR code=N {json}`, `CLOSED` or `TIMEOUT` per reply;\n"
               "exits 0 (OK), 1 (ERROR), 3 (CLOSED), 5 (TIMEOUT), 4 (no connection), 2 (usage).\n");
}

/* ---- connecting ------------------------------------------------------------- */

static int connect_unix(const char *path)
{
    struct sockaddr_un sa = { .sun_family = AF_UNIX };
    int fd;

    if (strlen(path) >= sizeof(sa.sun_path)) {
        fprintf(stderr, "dtprobe: socket path %s is too long\n", path);
        return -1;
    }
    snprintf(sa.sun_path, sizeof(sa.sun_path), "%s", path);
    if ((fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0)) < 0 ||
        connect(fd, (struct sockaddr *)&sa, sizeof(sa)) < 0) {
        fprintf(stderr, "dtprobe: cannot connect to %s: %s\n", path, strerror(errno));
        if (fd >= 0)
            close(fd);
        return -1;
    }
    return fd;
}

static int connect_tcp(const char *hostport)
{
    struct addrinfo hints = { .ai_socktype = SOCK_STREAM }, *res, *ai;
    const char *colon = strrchr(hostport, ':');
    char host[256];
    int fd = -1, rc, err = 0;

    if (colon == NULL || colon == hostport || colon - hostport >= (long)sizeof(host)) {
        fprintf(stderr, "dtprobe: --tcp %s: expected HOST:PORT\n", hostport);
        return -1;
    }
    memcpy(host, hostport, (size_t)(colon - hostport));
    host[colon - hostport] = '\0';
    if ((rc = getaddrinfo(host, colon + 1, &hints, &res)) != 0) {
        fprintf(stderr, "dtprobe: --tcp %s: %s\n", hostport, gai_strerror(rc));
        return -1;
    }
    for (ai = res; ai; ai = ai->ai_next) {
        fd = socket(ai->ai_family, ai->ai_socktype | SOCK_CLOEXEC, ai->ai_protocol);
        if (fd >= 0 && connect(fd, ai->ai_addr, ai->ai_addrlen) == 0)
            break;
        err = errno;
        if (fd >= 0)
            close(fd);
        fd = -1;
    }
    freeaddrinfo(res);
    if (fd < 0)
        fprintf(stderr, "dtprobe: cannot connect to %s: %s\n", hostport, strerror(err));
    return fd;
}

/* ---- sending and receiving --------------------------------------------------- */

/* 0, or -1 when the peer is gone (the caller still tries to read a reply:
 * the peer may have answered before closing). */
static int send_all(int fd, const uint8_t *p, size_t n)
{
    while (n > 0) {
        ssize_t w = send(fd, p, n, MSG_NOSIGNAL);
        if (w < 0 && errno == EINTR)
            continue;
        if (w <= 0)
            return -1;
        p += w;
        n -= (size_t)w;
    }
    return 0;
}

/* Read until one whole frame is decoded. Returns PROBE_OK with *out
 * filled, PROBE_CLOSED, PROBE_TIMEOUT, or PROBE_TIMEOUT after printing
 * why the reply is not a frame. */
static int recv_frame(probe_t *p, dt_msg_t *out)
{
    dt_emsg_t em = { "" };

    for (;;) {
        int used = dt_msg_decode(p->buf, p->have, out, &em);
        if (used < 0) {
            fprintf(stderr, "dtprobe: the reply is not a frame: %s\n", em.s);
            printf("BADREPLY\n");
            return PROBE_TIMEOUT;
        }
        if (used > 0) {
            memmove(p->buf, p->buf + used, p->have - (size_t)used);
            p->have -= (size_t)used;
            return PROBE_OK;
        }
        if (p->cap - p->have < 65536) {
            p->cap = p->have + 65536;
            p->buf = dt_xrealloc(p->buf, p->cap);
        }
        ssize_t r = recv(p->fd, p->buf + p->have, p->cap - p->have, 0);
        if (r < 0 && errno == EINTR)
            continue;
        if (r < 0 && (errno == EAGAIN || errno == EWOULDBLOCK))
            return PROBE_TIMEOUT;
        if (r <= 0) /* EOF, or ECONNRESET when our unread bytes were dropped */
            return PROBE_CLOSED;
        p->have += (size_t)r;
    }
}

/* Wait for the reply and print it; remember the fields of an OK reply. */
static int print_reply(probe_t *p, int quiet_ok)
{
    dt_msg_t m;
    int rc = recv_frame(p, &m);
    char *text;

    if (rc == PROBE_CLOSED) {
        printf("CLOSED\n");
        return rc;
    }
    if (rc == PROBE_TIMEOUT) {
        printf("TIMEOUT\n");
        return rc;
    }
    text = json_dumps(m.body, JSON_COMPACT | JSON_PRESERVE_ORDER);
    if (m.type == DT_MSG_OK) {
        json_object_update(p->vars, m.body);
        if (!quiet_ok)
            printf("OK %s\n", text ? text : "{}");
        rc = PROBE_OK;
    } else if (m.type == DT_MSG_ERROR) {
        json_t *code = json_object_get(m.body, "code");
        printf("ERROR code=%lld %s\n",
               json_is_integer(code) ? (long long)json_integer_value(code) : 0LL,
               text ? text : "{}");
        rc = PROBE_ERROR;
    } else {
        printf("BADREPLY type=%u %s\n", (unsigned)m.type, text ? text : "{}");
        rc = PROBE_TIMEOUT;
    }
    fflush(stdout);
    free(text);
    dt_msg_clear(&m);
    return rc;
}

/* A header for any type, even a number the encoder refuses: probing those
 * is the point. */
static void put_header(uint8_t *h, uint16_t type, uint32_t id, uint32_t len)
{
    const uint32_t w[] = { DT_PROTO_MAGIC, (uint32_t)DT_PROTO_VERSION << 16 | type, id, len };
    for (int i = 0; i < 4; i++) {
        h[4 * i] = (uint8_t)(w[i] >> 24);
        h[4 * i + 1] = (uint8_t)(w[i] >> 16);
        h[4 * i + 2] = (uint8_t)(w[i] >> 8);
        h[4 * i + 3] = (uint8_t)w[i];
    }
}

static int send_frame(probe_t *p, uint16_t type, const json_t *body)
{
    uint8_t *frame;
    size_t len;
    int rc;

    if (dt_msg_type_name(type) != NULL) {
        if (dt_msg_encode(type, p->next_id++, body, &frame, &len) < 0) {
            fprintf(stderr, "dtprobe: the request exceeds the frame limit\n");
            return -1;
        }
    } else {
        char *text = json_dumps(body, JSON_COMPACT);
        size_t n = strlen(text);
        len = DT_MSG_HDR + n;
        frame = dt_xmalloc(len);
        put_header(frame, type, p->next_id++, (uint32_t)n);
        memcpy(frame + DT_MSG_HDR, text, n);
        free(text);
    }
    rc = send_all(p->fd, frame, len);
    free(frame);
    return rc;
}

/* ---- hostile peers ------------------------------------------------------------- */

/* The request `count` times in writes of about 1 MiB, never reading. */
static int flood(probe_t *p, uint16_t type, const json_t *body, long count)
{
    uint8_t *frame, *batch;
    size_t flen, per, off;
    long sent = 0;
    int rc = PROBE_OK;

    if (dt_msg_encode(type, p->next_id++, body, &frame, &flen) < 0) {
        fprintf(stderr, "dtprobe: the request exceeds the frame limit\n");
        return PROBE_USAGE;
    }
    per = (1u << 20) / flen + 1;
    batch = dt_xmallocarray(per, flen);
    for (size_t i = 0; i < per; i++)
        memcpy(batch + i * flen, frame, flen);
    while (sent < count && rc == PROBE_OK) {
        size_t n = (size_t)(count - sent) < per ? (size_t)(count - sent) : per;
        for (off = 0; off < n * flen;) {
            ssize_t w = send(p->fd, batch + off, n * flen - off, MSG_NOSIGNAL);
            if (w < 0 && errno == EINTR)
                continue;
            if (w < 0) {
                rc = errno == EAGAIN || errno == EWOULDBLOCK ? PROBE_TIMEOUT : PROBE_CLOSED;
                break;
            }
            off += (size_t)w;
        }
        sent += (long)(off / flen);
    }
    printf("FLOOD sent=%ld of %ld: %s\n", sent, count,
           rc == PROBE_OK ? "done" : rc == PROBE_CLOSED ? "closed" : "stalled");
    fflush(stdout);
    free(batch);
    free(frame);
    return rc;
}

/* How many of fds[0..n) the peer has closed (or reset), waiting up to
 * wait_ms for all of them; nothing is read. */
static int count_closed(const int *fds, int n, long wait_ms)
{
    struct pollfd *pf = dt_xcalloc((size_t)n, sizeof(*pf));
    long end = (long)dt_clock_mono_ms() + wait_ms;
    int closed = 0;

    for (int i = 0; i < n; i++) {
        pf[i].fd = fds[i];
        pf[i].events = POLLRDHUP;
    }
    for (;;) {
        long left = end - (long)dt_clock_mono_ms();
        int r = poll(pf, (nfds_t)n, left > 0 ? (int)(left < 100 ? left : 100) : 0);
        if (r < 0 && errno != EINTR)
            break;
        for (int i = 0; i < n; i++)
            if (pf[i].fd >= 0 && (pf[i].revents & (POLLRDHUP | POLLHUP | POLLERR))) {
                pf[i].fd = -1; /* counted; poll ignores it from now on */
                closed++;
            }
        if (closed == n || (long)dt_clock_mono_ms() >= end)
            break;
    }
    free(pf);
    return closed;
}

/* Room for many connections: the soft descriptor limit up to the hard one. */
static void raise_nofile(void)
{
    struct rlimit rl;

    if (getrlimit(RLIMIT_NOFILE, &rl) == 0 && rl.rlim_cur < rl.rlim_max) {
        rl.rlim_cur = rl.rlim_max;
        setrlimit(RLIMIT_NOFILE, &rl);
    }
}

/* ---- credentials ---------------------------------------------------------------- */

static char *read_file(const char *path)
{
    FILE *f = fopen(path, "r");
    char *s = NULL;
    size_t cap = 0;
    ssize_t n;

    if (f == NULL)
        return NULL;
    n = getline(&s, &cap, f);
    fclose(f);
    if (n <= 0) {
        free(s);
        return NULL;
    }
    s[strcspn(s, "\n")] = '\0';
    return s;
}

/* A credential: from cred_file when it holds one, else a new one from
 * munged (saved to cred_file when given). NULL after printing why. */
static char *make_cred(const char *munge_socket, const char *cred_file)
{
    munge_ctx_t ctx;
    munge_err_t e;
    char *cred = NULL;

    if (cred_file && (cred = read_file(cred_file)) != NULL)
        return cred;
    if ((ctx = munge_ctx_create()) == NULL) {
        fprintf(stderr, "dtprobe: munge_ctx_create failed\n");
        return NULL;
    }
    if (munge_socket && munge_ctx_set(ctx, MUNGE_OPT_SOCKET, munge_socket) != EMUNGE_SUCCESS) {
        fprintf(stderr, "dtprobe: munge: bad socket %s\n", munge_socket);
        munge_ctx_destroy(ctx);
        return NULL;
    }
    e = munge_encode(&cred, ctx, NULL, 0);
    if (e != EMUNGE_SUCCESS) {
        fprintf(stderr, "dtprobe: munge_encode: %s\n",
                munge_ctx_strerror(ctx) ? munge_ctx_strerror(ctx) : munge_strerror(e));
        munge_ctx_destroy(ctx);
        return NULL;
    }
    munge_ctx_destroy(ctx);
    if (cred_file) {
        FILE *f = fopen(cred_file, "w");
        if (f == NULL || fprintf(f, "%s\n", cred) < 0 || fclose(f) != 0) {
            fprintf(stderr, "dtprobe: cannot save the credential to %s\n", cred_file);
            free(cred);
            return NULL;
        }
    }
    return cred;
}

/* ---- arguments ------------------------------------------------------------------ */

static int parse_type(const char *s, uint16_t *out)
{
    char *end;

#define DT_PROBE_NAME(name, value, dir, payload) \
    if (strcasecmp(s, #name) == 0) {             \
        *out = (value);                          \
        return 0;                                \
    }
    DT_MSG_TYPES(DT_PROBE_NAME)
#undef DT_PROBE_NAME
    long v = strtol(s, &end, 0);
    if (*s == '\0' || *end != '\0' || v < 0 || v > 65535)
        return -1;
    *out = (uint16_t)v; /* unknown numbers are allowed: the point is to probe */
    return 0;
}

/* Hex digits, with spaces, colons and dashes ignored. */
static int parse_hex(const char *s, uint8_t **out, size_t *len)
{
    uint8_t *b = dt_xmalloc(strlen(s) / 2 + 1);
    size_t n = 0;
    int half = -1;

    for (; *s; s++) {
        int v;
        if (*s == ' ' || *s == ':' || *s == '-')
            continue;
        if (*s >= '0' && *s <= '9')
            v = *s - '0';
        else if (*s >= 'a' && *s <= 'f')
            v = *s - 'a' + 10;
        else if (*s >= 'A' && *s <= 'F')
            v = *s - 'A' + 10;
        else {
            free(b);
            return -1;
        }
        if (half < 0)
            half = v;
        else {
            b[n++] = (uint8_t)(half << 4 | v);
            half = -1;
        }
    }
    if (half >= 0 || n == 0) {
        free(b);
        return -1;
    }
    *out = b;
    *len = n;
    return 0;
}

/* Replace top-level "$NAME" string values by earlier replies' fields. */
static void substitute(json_t *body, const json_t *vars)
{
    const char *key;
    json_t *v;

    json_object_foreach(body, key, v) {
        if (json_is_string(v) && json_string_value(v)[0] == '$') {
            json_t *r = json_object_get(vars, json_string_value(v) + 1);
            if (r)
                json_object_set(body, key, r);
        }
    }
}

static void sleep_ms(long ms)
{
    struct timespec ts = { ms / 1000, (ms % 1000) * 1000000L };
    while (nanosleep(&ts, &ts) < 0 && errno == EINTR)
        ;
}

int main(int argc, char **argv)
{
    static const struct option lo[] = {
        { "socket", required_argument, NULL, 's' },
        { "tcp", required_argument, NULL, 't' },
        { "munge-socket", required_argument, NULL, 'm' },
        { "auth", no_argument, NULL, 'a' },
        { "bad-auth", no_argument, NULL, 'b' },
        { "cred-file", required_argument, NULL, 'c' },
        { "raw", required_argument, NULL, 'r' },
        { "oversize", no_argument, NULL, 'o' },
        { "pause", required_argument, NULL, 'p' },
        { "hold", required_argument, NULL, 'H' },
        { "timeout", required_argument, NULL, 'T' },
        { "keep-going", no_argument, NULL, 'k' },
        { "flood", required_argument, NULL, 'F' },
        { "idle", required_argument, NULL, 'I' },
        { "wait-close", required_argument, NULL, 'W' },
        { "help", no_argument, NULL, 'h' },
        { NULL, 0, NULL, 0 },
    };
    const char *sock = NULL, *tcp = NULL, *munge_socket = NULL, *cred_file = NULL, *raw = NULL;
    int auth = 0, bad_auth = 0, oversize = 0, keep_going = 0, opt, rc = PROBE_OK;
    long pause_ms = 0, hold_ms = 0, timeout_s = 10, flood_n = 0, idle_n = 0, wait_s = -1;
    int *idle_fds = NULL, nidle = 0;
    probe_t p = { .fd = -1, .next_id = 1 };

    while ((opt = getopt_long(argc, argv, "+h", lo, NULL)) != -1) {
        switch (opt) {
        case 's':
            sock = optarg;
            break;
        case 't':
            tcp = optarg;
            break;
        case 'm':
            munge_socket = optarg;
            break;
        case 'a':
            auth = 1;
            break;
        case 'b':
            bad_auth = 1;
            break;
        case 'c':
            cred_file = optarg;
            break;
        case 'r':
            raw = optarg;
            break;
        case 'o':
            oversize = 1;
            break;
        case 'p':
            pause_ms = atol(optarg);
            break;
        case 'H':
            hold_ms = atol(optarg);
            break;
        case 'T':
            timeout_s = atol(optarg);
            break;
        case 'k':
            keep_going = 1;
            break;
        case 'F':
            flood_n = atol(optarg);
            break;
        case 'I':
            idle_n = atol(optarg);
            break;
        case 'W':
            wait_s = atol(optarg);
            break;
        case 'h':
            usage(stdout);
            return PROBE_OK;
        default:
            usage(stderr);
            return PROBE_USAGE;
        }
    }
    if ((sock == NULL) == (tcp == NULL) || (auth && bad_auth) || timeout_s < 1 || pause_ms < 0 ||
        hold_ms < 0 || (raw && oversize) || flood_n < 0 || idle_n < 0 ||
        (flood_n && (idle_n || raw || oversize || optind >= argc)) ||
        (optind >= argc && raw == NULL && !oversize && !idle_n)) {
        usage(stderr);
        return PROBE_USAGE;
    }

    /* the requests: TYPE [JSON] pairs, checked before connecting */
    int nreq = 0;
    uint16_t *types = dt_xcalloc((size_t)argc, sizeof(*types));
    json_t **bodies = dt_xcalloc((size_t)argc, sizeof(*bodies));
    for (int i = optind; i < argc; i++) {
        json_error_t jerr;
        if (parse_type(argv[i], &types[nreq]) < 0) {
            fprintf(stderr, "dtprobe: '%s' is not a message type\n", argv[i]);
            rc = PROBE_USAGE;
            goto out;
        }
        if (i + 1 < argc && argv[i + 1][0] == '{') {
            bodies[nreq] = json_loads(argv[++i], 0, &jerr);
            if (!json_is_object(bodies[nreq])) {
                fprintf(stderr, "dtprobe: '%s' is not a JSON object: %s\n", argv[i], jerr.text);
                rc = PROBE_USAGE;
                goto out;
            }
        } else
            bodies[nreq] = json_object();
        nreq++;
    }
    uint8_t *rawb = NULL;
    size_t rawn = 0;
    if (raw && parse_hex(raw, &rawb, &rawn) < 0) {
        fprintf(stderr, "dtprobe: --raw '%s' is not hex bytes\n", raw);
        rc = PROBE_USAGE;
        goto out;
    }

    p.vars = json_object();
    if (idle_n > 0) {
        /* connections that never speak: the only thing this run does */
        raise_nofile();
        idle_fds = dt_xcalloc((size_t)idle_n, sizeof(*idle_fds));
        for (long i = 0; i < idle_n; i++) {
            int fd = sock ? connect_unix(sock) : connect_tcp(tcp);
            if (fd < 0)
                break;
            idle_fds[nidle++] = fd;
        }
        printf("IDLE opened=%d of %ld\n", nidle, idle_n);
        fflush(stdout);
        rc = nidle > 0 ? PROBE_OK : PROBE_NOCONN;
        if (nidle > 0 && hold_ms > 0)
            sleep_ms(hold_ms);
        if (nidle > 0 && wait_s >= 0) {
            long t0 = (long)dt_clock_mono_ms();
            int closed = count_closed(idle_fds, nidle, wait_s * 1000);
            printf("IDLE closed=%d of %d after %ld ms\n", closed, nidle,
                   (long)dt_clock_mono_ms() - t0);
            rc = closed == nidle ? PROBE_CLOSED : PROBE_TIMEOUT;
        }
        for (int i = 0; i < nidle; i++)
            close(idle_fds[i]);
        free(idle_fds);
        goto out_raw;
    }
    p.fd = sock ? connect_unix(sock) : connect_tcp(tcp);
    if (p.fd < 0) {
        rc = PROBE_NOCONN;
        goto out_raw;
    }
    struct timeval tv = { timeout_s, 0 };
    setsockopt(p.fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
    setsockopt(p.fd, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof(tv));

    /* authentication: a quiet OK, a loud failure */
    if (auth || bad_auth) {
        char *cred =
            bad_auth ? dt_xstrdup("MUNGE:bogus-credential:") : make_cred(munge_socket, cred_file);
        if (cred == NULL) {
            rc = PROBE_NOCONN;
            goto out_raw;
        }
        json_t *b = json_pack("{s:s}", "cred", cred);
        free(cred);
        send_frame(&p, DT_MSG_AUTH, b);
        json_decref(b);
        if ((rc = print_reply(&p, 1)) != PROBE_OK && !keep_going)
            goto out_raw;
    }

    /* raw bytes or an oversize header: one reply (or none) */
    if (rawb || oversize) {
        uint8_t hdr[DT_MSG_HDR];
        put_header(hdr, nreq ? types[0] : DT_MSG_PING, p.next_id++, DT_MSG_MAX + 1);
        send_all(p.fd, oversize ? hdr : rawb, oversize ? sizeof(hdr) : rawn);
        rc = print_reply(&p, 0);
        goto out_hold;
    }

    if (flood_n > 0) {
        substitute(bodies[0], p.vars);
        rc = flood(&p, types[0], bodies[0], flood_n);
        if (hold_ms > 0)
            sleep_ms(hold_ms);
        if (wait_s >= 0 && rc != PROBE_CLOSED) {
            long t0 = (long)dt_clock_mono_ms();
            if (count_closed(&p.fd, 1, wait_s * 1000) == 1) {
                printf("CLOSED after %ld ms\n", (long)dt_clock_mono_ms() - t0);
                rc = PROBE_CLOSED;
            } else {
                printf("OPEN after %ld ms\n", (long)dt_clock_mono_ms() - t0);
                rc = PROBE_TIMEOUT;
            }
        }
        goto out_raw;
    }
    for (int i = 0; i < nreq; i++) {
        if (i > 0 && pause_ms > 0)
            sleep_ms(pause_ms);
        substitute(bodies[i], p.vars);
        send_frame(&p, types[i], bodies[i]);
        int r = print_reply(&p, 0);
        if (r != PROBE_OK) {
            rc = r;
            if (!keep_going || r == PROBE_CLOSED || r == PROBE_TIMEOUT)
                break;
        }
    }
out_hold:
    if (hold_ms > 0)
        sleep_ms(hold_ms);
out_raw:
    free(rawb);
out:
    if (p.fd >= 0)
        close(p.fd);
    for (int i = 0; i < nreq; i++)
        json_decref(bodies[i]);
    free(bodies);
    free(types);
    free(p.buf);
    json_decref(p.vars);
    return rc;
}
