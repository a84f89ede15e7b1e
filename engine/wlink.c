/* SPDX-License-Identifier: MIT
 *
 * The worker's end of the channel to dtagentd (engine/wlink.h): frames of
 * common/proto.h written whole and blocking with send(MSG_NOSIGNAL), so a
 * vanished agent is an EPIPE we report, never a silent SIGPIPE; frames from
 * the agent read with MSG_DONTWAIT into a buffer that keeps a partial frame
 * until the rest arrives; and the PMIx event handler that turns a peer's
 * death into a prompt exit instead of a rank blocked forever in MPI.
 *
 * The state is one static struct: there is one agent per process, and the
 * API mirrors that. The PMIx handler runs on libpmix's thread and reads only
 * fields written before it was registered.
 *
 * Not here: what the requests mean (the commands decide, at step
 * boundaries), the protocol codec (common/msg.c), the agent's side.
 */
#include "config.h"

#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <jansson.h>
#include <limits.h>
#include <math.h>
#include <pmix.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>
#ifdef __linux__
#include <sys/prctl.h>
#endif

#include "common/clock.h"
#include "common/exitcodes.h"
#include "common/mem.h"
#include "common/msg.h"
#include "common/wire.h"
#include "engine/wlink.h"

#define RBUF_MIN 4096

static struct {
    int fd; /* the channel; -1 when not under an agent */
    int rank;
    long agent;   /* DT_AGENT_PID */
    uint8_t *buf; /* bytes from the agent not yet decoded */
    size_t len, cap;
    int flags; /* DT_WLINK_* not yet returned by dt_wlink_poll */
    int pmix;  /* our PMIx_Init reference is held */
    int evreg; /* the event handler is registered */
    size_t evref;
    pmix_proc_t me;
    int64_t sent_ms; /* monotonic: the last frame sent (dt_wlink_tick) */
} wl = { .fd = -1 };

/* ---- leaving --------------------------------------------------------------- */

/* Write s to stderr with write(2) alone: usable from libpmix's thread, where
 * stdio's locks may be held by the main thread. */
static void say(const char *s)
{
    size_t n = strlen(s);

    while (n > 0) {
        ssize_t k = write(STDERR_FILENO, s, n);
        if (k < 0 && errno == EINTR)
            continue;
        if (k <= 0)
            return;
        s += k;
        n -= (size_t)k;
    }
}

/* The channel is unusable: nobody is left to commit our checkpoints or to
 * relay progress. One message, then _exit: exit() would run MPI's and
 * libpmix's atexit handlers, which may block on peers or on the server. */
static void agent_lost(const char *fmt, ...) __attribute__((format(printf, 1, 2), noreturn));
static void agent_lost(const char *fmt, ...)
{
    char msg[640];
    va_list ap;
    int n = snprintf(msg, sizeof(msg), "dtengine: rank %d: ", wl.rank);

    va_start(ap, fmt);
    vsnprintf(msg + n, sizeof(msg) - (size_t)n, fmt, ap);
    va_end(ap);
    fflush(stdout);
    say(msg);
    say("; exiting\n");
    _exit(DT_EXIT_AGENT_LOST);
}

/* ---- frames to the agent --------------------------------------------------- */

static void send_all(const uint8_t *p, size_t n, const char *what)
{
    while (n > 0) {
        ssize_t k = send(wl.fd, p, n, MSG_NOSIGNAL);
        if (k < 0) {
            int e = errno;
            if (e == EINTR)
                continue;
            if (e == EAGAIN || e == EWOULDBLOCK) { /* a non-blocking descriptor: wait */
                struct pollfd pf = { .fd = wl.fd, .events = POLLOUT };
                (void)poll(&pf, 1, -1);
                continue;
            }
            agent_lost("cannot send %s to the agent (DT_AGENT_FD=%d): %s", what, wl.fd,
                       strerror(e));
        }
        p += k;
        n -= (size_t)k;
    }
}

/* Frames go out whole from any thread (the in-memory checkpoints' hashing
 * thread reports its copies itself). */
static pthread_mutex_t send_mu = PTHREAD_MUTEX_INITIALIZER;

/* Send one frame of type with body (taken: released here). */
static void send_frame(uint16_t type, json_t *body)
{
    uint8_t *frame;
    size_t len;

    if (body == NULL || dt_msg_encode(type, 0, body, &frame, &len) < 0) {
        /* every body here is a small object we built: a bug, not input */
        fprintf(stderr, "dtengine: cannot encode %s for the agent\n", dt_msg_type_name(type));
        abort();
    }
    json_decref(body);
    pthread_mutex_lock(&send_mu);
    send_all(frame, len, dt_msg_type_name(type));
    wl.sent_ms = dt_clock_mono_ms();
    pthread_mutex_unlock(&send_mu);
    free(frame);
}

/* Each frame's body is the struct common/wire.h gives for it (a real that
 * is not finite goes out as null: JSON has no NaN). */
void dt_wlink_progress(int64_t step, int64_t steps, int64_t tokens, double loss, double tokens_s,
                       double acc)
{
    if (wl.fd < 0)
        return;
    dt_wire_w_progress_t p = { .rank = wl.rank, .step = step, .steps = steps, .tokens = tokens,
                               .loss = loss, .tokens_s = tokens_s, .acc = acc };
    send_frame(DT_MSG_W_PROGRESS, dt_wire_w_progress_encode(&p));
}

void dt_wlink_heartbeat(void)
{
    dt_wire_w_hello_t hb = { .rank = wl.rank };
    if (wl.fd >= 0)
        send_frame(DT_MSG_W_HEARTBEAT, dt_wire_w_heartbeat_encode(&hb));
}

void dt_wlink_tick(void)
{
    pthread_mutex_lock(&send_mu);
    int64_t sent = wl.sent_ms;
    pthread_mutex_unlock(&send_mu);
    if (wl.fd >= 0 && dt_clock_mono_ms() - sent >= DT_WLINK_TICK_MS)
        dt_wlink_heartbeat();
}

void dt_wlink_memckpt(int64_t step, int slot, int64_t bytes, const char *sha256)
{
    if (wl.fd < 0)
        return;
    dt_wire_w_memckpt_t mc = { .rank = wl.rank, .step = step, .slot = slot, .bytes = bytes,
                               .sha256 = sha256 };
    send_frame(DT_MSG_W_MEMCKPT, dt_wire_w_memckpt_encode(&mc));
}

void dt_wlink_memckpt_writing(int64_t step, int slot)
{
    if (wl.fd < 0)
        return;
    dt_wire_w_memckpt_t mc = { .rank = wl.rank, .step = step, .slot = slot, .writing = true };
    send_frame(DT_MSG_W_MEMCKPT, dt_wire_w_memckpt_encode(&mc));
}

void dt_wlink_shard(int64_t step, const char *dir, const char *path, int64_t bytes,
                    const char *sha256, int manifest)
{
    if (wl.fd < 0)
        return;
    dt_wire_w_shard_t sh = { .rank = wl.rank, .step = step, .dir = dir, .path = path,
                             .bytes = bytes, .sha256 = sha256, .manifest = manifest };
    send_frame(DT_MSG_W_SHARD, dt_wire_w_shard_encode(&sh));
}

void dt_wlink_result(int64_t steps, double loss, double acc, const char *checksum,
                     const char *const *outputs, size_t noutputs)
{
    if (wl.fd < 0)
        return;
    dt_wire_w_result_t r = { .rank = wl.rank, .steps = steps, .loss = loss, .acc = acc,
                             .checksum = checksum,
                             .outputs = { (const char **)outputs, noutputs } };
    send_frame(DT_MSG_W_RESULT, dt_wire_w_result_encode(&r));
}

/* ---- frames from the agent ------------------------------------------------- */

static void malformed(const char *why)
{
    agent_lost("malformed frame from the agent (DT_AGENT_FD=%d): %s", wl.fd, why);
}

static void take(const dt_msg_t *m)
{
    dt_emsg_t em = { "" };
    dt_wire_w_stop_t st;
    char why[128];

    if (m->id != 0) {
        snprintf(why, sizeof(why), "%s with id %" PRIu32 " (pushed frames carry 0)",
                 dt_msg_type_name(m->type), m->id);
        malformed(why);
    }
    switch (m->type) {
    case DT_MSG_W_CHECKPOINT:
        wl.flags |= DT_WLINK_CHECKPOINT;
        break;
    case DT_MSG_W_STOP:
        if (dt_wire_w_stop_decode(m, &st, &em) < 0) {
            snprintf(why, sizeof(why), "W_STOP: %s", em.s);
            malformed(why);
        }
        wl.flags |= DT_WLINK_STOP | (st.checkpoint ? DT_WLINK_STOP_CKPT : 0);
        break;
    default:
        snprintf(why, sizeof(why), "%s (a worker takes only W_CHECKPOINT and W_STOP)",
                 dt_msg_type_name(m->type));
        malformed(why);
    }
}

/* Decode every complete frame in the buffer, keep the rest, and make room
 * for the frame in progress (its length was checked by the decoder). */
static void drain(void)
{
    size_t off = 0, need;
    dt_emsg_t em = { "" };

    for (;;) {
        dt_msg_t m;
        int used = dt_msg_decode(wl.buf + off, wl.len - off, &m, &em);
        if (used < 0)
            malformed(em.s);
        if (used == 0)
            break;
        take(&m);
        dt_msg_clear(&m);
        off += (size_t)used;
    }
    if (off > 0) {
        memmove(wl.buf, wl.buf + off, wl.len - off);
        wl.len -= off;
    }
    if (dt_msg_peek(wl.buf, wl.len, &need, NULL) == 0 && need > wl.cap) {
        wl.buf = dt_xrealloc(wl.buf, need);
        wl.cap = need;
    }
}

int dt_wlink_poll(void)
{
    int f;

    if (wl.fd < 0)
        return 0;
    for (;;) {
        ssize_t k = recv(wl.fd, wl.buf + wl.len, wl.cap - wl.len, MSG_DONTWAIT);
        if (k > 0) {
            wl.len += (size_t)k;
            drain();
            continue;
        }
        if (k == 0)
            agent_lost("the agent closed the channel (DT_AGENT_FD=%d)%s", wl.fd,
                       wl.len > 0 ? " in the middle of a frame" : "");
        if (errno == EINTR)
            continue;
        if (errno == EAGAIN || errno == EWOULDBLOCK)
            break;
        agent_lost("cannot read from the agent (DT_AGENT_FD=%d): %s", wl.fd, strerror(errno));
    }
    f = wl.flags;
    wl.flags = 0;
    return f;
}

/* ---- PMIx failure events --------------------------------------------------- */

/* A process ended abnormally whatever else the event says. */
static const pmix_status_t failed_codes[] = {
    PMIX_ERR_PROC_ABORTED_BY_SIG, /* what dtagentd sends for a dead worker */
    PMIX_ERR_PROC_ABORTED,        /* older servers' name for it */
    PMIX_ERR_PROC_KILLED_BY_CMD,
    PMIX_ERR_PROC_REQUESTED_ABORT, /* MPI_Abort / PMIx_Abort */
    PMIX_ERR_PROC_TERM_WO_SYNC,    /* exited without finalising: _exit, crash */
    PMIX_ERR_PROC_SENSOR_BOUND_EXCEEDED,
    PMIX_ERR_PROC_FAILED_TO_START,
};

/* A process ended: abnormal only for exit codes dtengine does not agree on
 * between ranks (see is_failure). */
static const pmix_status_t ended_codes[] = {
    PMIX_ERR_EXIT_NONZERO_TERM,
    PMIX_EVENT_PROC_TERMINATED,
    PMIX_PROC_TERMINATED,
};

static int in(pmix_status_t s, const pmix_status_t *v, size_t n)
{
    for (size_t i = 0; i < n; i++)
        if (v[i] == s)
            return 1;
    return 0;
}

/* Every way dtengine exits with 0 to 3 is agreed by all ranks first
 * (dt_comm_agree), so a peer that exits so is doing what we are about to do:
 * taking it for a failure would turn a clean stop (3) into a restart (4).
 * Any other code (4, 5, a launcher's 127) is a peer we must not wait for.
 * Without an exit code the event cannot tell, and is ignored. */
static int is_failure(pmix_status_t status, const pmix_info_t *info, size_t ninfo)
{
    if (in(status, failed_codes, sizeof(failed_codes) / sizeof(failed_codes[0])))
        return 1;
    for (size_t i = 0; i < ninfo; i++)
        if (PMIX_CHECK_KEY(&info[i], PMIX_EXIT_CODE) && info[i].value.type == PMIX_INT)
            return info[i].value.data.integer < DT_EXIT_OK ||
                   info[i].value.data.integer > DT_EXIT_STOPPED;
    return 0;
}

static void utoa(unsigned long v, char *out)
{
    char tmp[24];
    int n = 0;

    do
        tmp[n++] = (char)('0' + v % 10);
    while ((v /= 10) != 0);
    while (n > 0)
        *out++ = tmp[--n];
    *out = '\0';
}

/* libpmix's thread. The main thread may be blocked in MPI on the very peer
 * that died, so the process ends here; a checkpoint being written is
 * harmless (temporary names, renamed only when complete). */
static void on_event(size_t id, pmix_status_t status, const pmix_proc_t *source, pmix_info_t info[],
                     size_t ninfo, pmix_info_t *results, size_t nresults,
                     pmix_event_notification_cbfunc_fn_t cbfunc, void *cbdata)
{
    const pmix_proc_t *who = source;
    char digits[24];

    if (status == PMIX_ERR_LOST_CONNECTION) {
        /* the PMIx server is the agent: it is gone or has dropped us */
        say("dtengine: lost the connection to the agent's PMIx server; stopping\n");
        _exit(DT_EXIT_AGENT_LOST);
    }
    for (size_t i = 0; i < ninfo; i++)
        if (PMIX_CHECK_KEY(&info[i], PMIX_EVENT_AFFECTED_PROC) && info[i].value.type == PMIX_PROC &&
            info[i].value.data.proc != NULL)
            who = info[i].value.data.proc;
    int peer = who != NULL && strncmp(who->nspace, wl.me.nspace, PMIX_MAX_NSLEN) == 0 &&
               who->rank != wl.me.rank && PMIX_RANK_IS_VALID(who->rank);
    if (peer && is_failure(status, info, ninfo)) {
        utoa(who->rank, digits);
        say("dtengine: rank ");
        say(digits);
        say(" failed (");
        say(PMIx_Error_string(status));
        say("); stopping\n");
        _exit(DT_EXIT_PEER);
    }
    /* A peer's agreed end is handled: passed on, it would reach Open MPI's
     * default handler, which aborts the process with the event's code as
     * its exit status (PMIX_EVENT_PROC_TERMINATED: 55). */
    if (cbfunc != NULL)
        cbfunc(peer ? PMIX_EVENT_ACTION_COMPLETE : PMIX_EVENT_NO_ACTION_TAKEN, NULL, 0, NULL, NULL,
               cbdata);
}

static int pmix_open(dt_emsg_t *em)
{
    pmix_status_t codes[sizeof(failed_codes) / sizeof(failed_codes[0]) +
                        sizeof(ended_codes) / sizeof(ended_codes[0]) + 1];
    size_t n = 0;
    pmix_info_t info;
    pmix_status_t rc;

    rc = PMIx_Init(&wl.me, NULL, 0);
    if (rc != PMIX_SUCCESS)
        return dt_emsg_set(em, DT_ECOMM,
                           "PMIx_Init failed under dtagentd (DT_AGENT_PID=%ld), "
                           "which is our PMIx server: %s",
                           wl.agent, PMIx_Error_string(rc));
    wl.pmix = 1;
    for (size_t i = 0; i < sizeof(failed_codes) / sizeof(failed_codes[0]); i++)
        codes[n++] = failed_codes[i];
    for (size_t i = 0; i < sizeof(ended_codes) / sizeof(ended_codes[0]); i++)
        codes[n++] = ended_codes[i];
    codes[n++] = PMIX_ERR_LOST_CONNECTION;
    PMIX_INFO_LOAD(&info, PMIX_EVENT_HDLR_NAME, "dtengine-peer-failure", PMIX_STRING);
    /* no callback: blocking, and a non-negative status is the reference */
    rc = PMIx_Register_event_handler(codes, n, &info, 1, on_event, NULL, NULL);
    PMIX_INFO_DESTRUCT(&info);
    if (rc < 0)
        return dt_emsg_set(em, DT_ECOMM,
                           "PMIx_Register_event_handler for process failures "
                           "failed: %s",
                           PMIx_Error_string(rc));
    wl.evref = (size_t)rc;
    wl.evreg = 1;
    return 0;
}

/* ---- open and close -------------------------------------------------------- */

/* A decimal integer in [lo, hi], the whole string. */
static int parse_long(const char *s, long lo, long hi, long *out)
{
    char *end;
    long v;

    errno = 0;
    v = strtol(s, &end, 10);
    if (*s == '\0' || *end != '\0' || errno != 0 || v < lo || v > hi)
        return -1;
    *out = v;
    return 0;
}

/* Everything but PMIx and W_HELLO: the variables, the descriptor, the
 * parent. 1 when not under an agent. */
static int channel(int rank, dt_emsg_t *em)
{
    const char *fds = getenv("DT_AGENT_FD"), *pids = getenv("DT_AGENT_PID");
    struct stat st;
    long fd, pid;
    int fl;

    if (wl.fd >= 0)
        return dt_emsg_set(em, DT_EINVAL, "the channel to the agent is already open");
    if (fds == NULL)
        return 1;
    if (parse_long(fds, 0, INT_MAX, &fd) < 0)
        return dt_emsg_set(em, DT_EINVAL, "DT_AGENT_FD='%.64s': not a descriptor number", fds);
    if (fstat((int)fd, &st) < 0)
        return dt_emsg_set(em, DT_EINVAL, "DT_AGENT_FD=%ld: %s", fd, strerror(errno));
    if (!S_ISSOCK(st.st_mode))
        return dt_emsg_set(em, DT_EINVAL, "DT_AGENT_FD=%ld: not a socket", fd);
    if (pids == NULL)
        return dt_emsg_set(em, DT_EINVAL, "DT_AGENT_FD is set but DT_AGENT_PID is not");
    if (parse_long(pids, 1, LONG_MAX, &pid) < 0)
        return dt_emsg_set(em, DT_EINVAL, "DT_AGENT_PID='%.64s': not a process id", pids);
    wl.rank = rank;
    /* Slurm's warning signal (USR1 or USR2, the job's `signal`) reaches
     * every process of the agents' step, workers too: the agent acts on
     * it (a checkpoint through the coordinator), a worker must not die of
     * it. Both are ignored, so the worker need not know which: NCCL, when
     * NCCL_PROXY_DUMP_SIGNAL names one, installs its handler later. */
    signal(SIGUSR1, SIG_IGN);
    signal(SIGUSR2, SIG_IGN);
#ifdef __linux__
    /* first the signal, then the check: an agent that dies in between is
     * caught by one or the other */
    if (prctl(PR_SET_PDEATHSIG, SIGKILL) < 0)
        return dt_emsg_set(em, dt_err_errno(errno), "prctl(PR_SET_PDEATHSIG): %s", strerror(errno));
#endif
    if ((long)getppid() != pid)
        agent_lost("the parent process is %ld, not the agent (DT_AGENT_PID=%ld)", (long)getppid(),
                   pid);
    /* writes block (whole frames), reads say MSG_DONTWAIT themselves */
    fl = fcntl((int)fd, F_GETFL);
    if (fl >= 0 && (fl & O_NONBLOCK))
        (void)fcntl((int)fd, F_SETFL, fl & ~O_NONBLOCK);
    (void)fcntl((int)fd, F_SETFD, FD_CLOEXEC);
    wl.fd = (int)fd;
    wl.agent = pid;
    wl.cap = RBUF_MIN;
    wl.buf = dt_xmalloc(wl.cap);
    wl.len = 0;
    wl.flags = 0;
    return 0;
}

static void hello(void)
{
    dt_wire_w_hello_t h = { .rank = wl.rank, .pid = getpid() };
    send_frame(DT_MSG_W_HELLO, dt_wire_w_hello_encode(&h));
}

int dt_wlink_open_channel(int rank, dt_emsg_t *em)
{
    int rc = channel(rank, em);

    if (rc != 0)
        return rc < 0 ? rc : 0;
    hello();
    return 0;
}

int dt_wlink_open(int rank, dt_emsg_t *em)
{
    int rc = channel(rank, em);

    if (rc != 0)
        return rc < 0 ? rc : 0;
    if ((rc = pmix_open(em)) < 0) {
        dt_wlink_close();
        return rc;
    }
    hello();
    return 0;
}

int dt_wlink_active(void)
{
    return wl.fd >= 0;
}

void dt_wlink_close(void)
{
    if (wl.evreg)
        (void)PMIx_Deregister_event_handler(wl.evref, NULL, NULL);
    if (wl.pmix)
        (void)PMIx_Finalize(NULL, 0);
    if (wl.fd >= 0)
        (void)close(wl.fd);
    free(wl.buf);
    memset(&wl, 0, sizeof(wl));
    wl.fd = -1;
}
