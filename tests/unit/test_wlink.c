/* SPDX-License-Identifier: MIT
 *
 * Unit tests for engine/wlink, the worker's end of the dtagentd channel.
 * The test process plays the agent: it makes a socketpair and forks a
 * child that plays the worker, with DT_AGENT_FD set to the child's end and
 * DT_AGENT_PID to the test process (the child's parent, as under a real
 * agent). The agent side decodes what arrives with dt_msg_decode and
 * checks every field; it sends W_CHECKPOINT and W_STOP in pieces, broken
 * and hostile frames, or closes its end, and checks the worker's exit
 * status and the message on its stderr.
 *
 * There is no PMIx server here, so the worker opens the channel with
 * dt_wlink_open_channel (dt_wlink_open without PMIx); that dt_wlink_open
 * itself refuses to run under an agent without its PMIx server, and does
 * nothing at all without DT_AGENT_FD, is tested too. The PMIx event handler
 * needs a server and is exercised by the agent's integration test.
 *
 * In-memory checkpoints (engine/cmd/memckpt.c) report through the link
 * from their own thread: the worker writes copies into two memory files
 * the test made (as an agent's), and the agent's side checks each slot's
 * writing notice before its copy, the slots alternating, a slot rewritten
 * only after its copy was reported, and each file's SHA-256 and contents
 * against the report.
 */
#include "config.h"

#include <criterion/criterion.h>
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <math.h>
#include <poll.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "common/clock.h"
#include "common/mem.h"
#include "common/msg.h"
#include "common/sha256.h"
#include "engine/cmd/cmd.h"
#include "engine/cmd/memckpt.h"
#include "engine/wlink.h"

#define SHA_A "aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa"
#define SHA_B "0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef"

/* ---- the agent's side ------------------------------------------------------- */

typedef struct agent {
    pid_t pid; /* the worker */
    int fd;    /* our end of the channel; -1 once closed */
    int err;   /* the worker's stderr */
    uint8_t buf[1 << 16];
    size_t len;
} agent_t;

/* Remove PMIX_* so no PMIx server of an outer launcher is found. */
static void clear_pmix_env(void)
{
    extern char **environ;
    for (int again = 1; again;) {
        again = 0;
        for (char **e = environ; *e; e++)
            if (strncmp(*e, "PMIX_", 5) == 0) {
                char name[256];
                size_t n = strcspn(*e, "=");
                snprintf(name, sizeof(name), "%.*s", (int)n, *e);
                unsetenv(name);
                again = 1;
                break;
            }
    }
}

/* Fork a worker that opens the channel as rank RANK and runs fn. agent_pid
 * 0 means us (the right parent). full: dt_wlink_open instead of the
 * channel alone. The worker exits 0 when fn returns, 99 when the open
 * fails (its message on stderr). */
static void spawn(agent_t *a, int rank, long agent_pid, int full, void (*fn)(void))
{
    int sv[2], ep[2];
    long parent = (long)getpid();

    cr_assert_eq(socketpair(AF_UNIX, SOCK_STREAM, 0, sv), 0);
    cr_assert_eq(pipe(ep), 0);
    a->len = 0;
    a->pid = fork();
    cr_assert_neq(a->pid, -1);
    if (a->pid == 0) {
        char v[32];
        dt_emsg_t em = { "" };

        close(sv[0]);
        close(ep[0]);
        dup2(ep[1], STDERR_FILENO);
        signal(SIGPIPE, SIG_DFL); /* the worker must survive it by itself */
        clear_pmix_env();
        snprintf(v, sizeof(v), "%d", sv[1]);
        setenv("DT_AGENT_FD", v, 1);
        snprintf(v, sizeof(v), "%ld", agent_pid ? agent_pid : parent);
        setenv("DT_AGENT_PID", v, 1);
        int rc = full ? dt_wlink_open(rank, &em) : dt_wlink_open_channel(rank, &em);
        if (rc < 0) {
            fprintf(stderr, "open: %s: %s\n", dt_err_name(rc), em.s);
            _exit(99);
        }
        if (fn)
            fn();
        dt_wlink_close();
        _exit(0); /* never criterion's atexit handlers in the child */
    }
    close(sv[1]);
    close(ep[1]);
    a->fd = sv[0];
    a->err = ep[0];
}

/* The next frame from the worker: 1 and *m, or 0 at end of file. Fails the
 * test after 10 s without one or on a frame that does not decode. */
static int next_frame(agent_t *a, dt_msg_t *m)
{
    dt_emsg_t em = { "" };

    for (;;) {
        int used = dt_msg_decode(a->buf, a->len, m, &em);
        cr_assert_geq(used, 0, "the worker sent a bad frame: %s", em.s);
        if (used > 0) {
            memmove(a->buf, a->buf + used, a->len - (size_t)used);
            a->len -= (size_t)used;
            cr_assert_eq(m->id, 0, "frames to the agent carry id 0");
            return 1;
        }
        struct pollfd pf = { .fd = a->fd, .events = POLLIN };
        cr_assert_eq(poll(&pf, 1, 10000), 1, "no frame from the worker within 10 s");
        ssize_t k = read(a->fd, a->buf + a->len, sizeof(a->buf) - a->len);
        cr_assert_geq(k, 0, "read: %s", strerror(errno));
        if (k == 0) {
            cr_assert_eq(a->len, 0, "end of file in the middle of a frame");
            return 0;
        }
        a->len += (size_t)k;
    }
}

static void expect_frame(agent_t *a, dt_msg_t *m, uint16_t type)
{
    cr_assert_eq(next_frame(a, m), 1, "end of file, expected %s", dt_msg_type_name(type));
    cr_assert_eq(m->type, type, "got %s, expected %s", dt_msg_type_name(m->type),
                 dt_msg_type_name(type));
}

static int64_t geti(const dt_msg_t *m, const char *f)
{
    int64_t v = 0;
    dt_emsg_t em = { "" };
    cr_assert_eq(dt_msg_get_int(m, f, &v, &em), 0, "%s: %s", dt_msg_type_name(m->type), em.s);
    return v;
}

static double getd(const dt_msg_t *m, const char *f)
{
    json_t *v = json_object_get(m->body, f);
    cr_assert(json_is_number(v), "%s: field '%s' is not a number", dt_msg_type_name(m->type), f);
    return json_number_value(v);
}

static const char *gets_(const dt_msg_t *m, const char *f)
{
    const char *v = NULL;
    dt_emsg_t em = { "" };
    cr_assert_eq(dt_msg_get_str(m, f, &v, &em), 0, "%s: %s", dt_msg_type_name(m->type), em.s);
    return v;
}

static void send_bytes(agent_t *a, const void *p, size_t n, size_t piece)
{
    const uint8_t *b = p;

    for (size_t off = 0; off < n; off += piece) {
        size_t k = n - off < piece ? n - off : piece;
        cr_assert_eq(write(a->fd, b + off, k), (ssize_t)k);
        if (piece < n)
            usleep(300);
    }
}

static void send_msg(agent_t *a, uint16_t type, uint32_t id, json_t *body, size_t piece)
{
    uint8_t *f;
    size_t n;

    cr_assert_eq(dt_msg_encode(type, id, body, &f, &n), 0);
    json_decref(body);
    send_bytes(a, f, n, piece ? piece : n);
    free(f);
}

static void hang_up(agent_t *a)
{
    if (a->fd >= 0)
        close(a->fd);
    a->fd = -1;
}

/* Wait for the worker: its exit status (128 + signal when killed), its
 * stderr in err. */
static int finish(agent_t *a, char *err, size_t size)
{
    size_t n = 0;
    ssize_t k;
    int st;

    while (n + 1 < size && (k = read(a->err, err + n, size - 1 - n)) > 0)
        n += (size_t)k;
    err[n] = '\0';
    close(a->err);
    hang_up(a);
    cr_assert_eq(waitpid(a->pid, &st, 0), a->pid);
    return WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
}

static void expect_exit(agent_t *a, int code, const char *in_stderr)
{
    char err[2048];
    int got = finish(a, err, sizeof(err));

    cr_assert_eq(got, code, "worker exit %d, expected %d; stderr: %s", got, code, err);
    if (in_stderr)
        cr_assert(strstr(err, in_stderr) != NULL, "stderr lacks '%s': %s", in_stderr, err);
}

static void expect_hello(agent_t *a, int rank)
{
    dt_msg_t m;

    expect_frame(a, &m, DT_MSG_W_HELLO);
    cr_assert_eq(geti(&m, "rank"), rank);
    cr_assert_eq(geti(&m, "pid"), a->pid);
    dt_msg_clear(&m);
}

/* ---- worker bodies (run in the child) ---------------------------------------- */

static void w_report(void)
{
    dt_wlink_progress(5, 10, 1280, 2.5, 1000.0, 0.25);
    dt_wlink_progress(6, 10, 1536, NAN, INFINITY, 0.5);
    dt_wlink_heartbeat();
    dt_wlink_tick(); /* a frame just went: nothing */
    dt_wlink_shard(6, "/ck/step-00000006", "shard-00003-of-00004.safetensors", 123456, SHA_A, 0);
    dt_wlink_shard(6, "/ck/step-00000006", "manifest.json", 789, SHA_B, 1);
    const char *outs[] = { "/jobs/7/output/attn.json", "/jobs/7/output/logits.npy" };
    dt_wlink_result(10, 1.25, 0.5, SHA_B, outs, 2);
    usleep((DT_WLINK_TICK_MS + 100) * 1000);
    dt_wlink_tick(); /* silent for longer than a tick: a heartbeat */
}

/* Poll once (nothing has been sent yet), say so with a heartbeat, then
 * poll until W_STOP; exit with the flags seen (+64 if the first poll saw
 * anything). */
static void w_poll_until_stop(void)
{
    int first = dt_wlink_poll(), seen = 0;
    double t0 = dt_clock_now();

    dt_wlink_heartbeat();
    while (!(seen & DT_WLINK_STOP) && dt_clock_now() - t0 < 10) {
        seen |= dt_wlink_poll();
        usleep(200);
    }
    _exit(seen | (first ? 64 : 0));
}

/* Poll until something ends the process (exit 98 after 10 s). */
static void w_poll_forever(void)
{
    double t0 = dt_clock_now();

    while (dt_clock_now() - t0 < 10) {
        dt_wlink_poll();
        usleep(200);
    }
    _exit(98);
}

/* Heartbeats until writing fails (exit 98 after 10 s). */
static void w_write_forever(void)
{
    double t0 = dt_clock_now();

    while (dt_clock_now() - t0 < 10) {
        dt_wlink_heartbeat();
        usleep(1000);
    }
    _exit(98);
}

/* ---- tests ----------------------------------------------------------------------- */

static int count_fds(void)
{
    DIR *d = opendir("/proc/self/fd");
    int n = 0;

    cr_assert_not_null(d);
    while (readdir(d) != NULL)
        n++;
    closedir(d);
    return n;
}

Test(wlink, without_agent_fd_everything_is_a_noop)
{
    dt_emsg_t em = { "" };
    int before;

    unsetenv("DT_AGENT_FD");
    setenv("DT_AGENT_PID", "1", 1); /* ignored without DT_AGENT_FD */
    before = count_fds();
    cr_assert_eq(dt_wlink_open(0, &em), 0, "%s", em.s);
    cr_assert_eq(dt_wlink_active(), 0);
    dt_wlink_progress(1, 2, 3, 4.0, 5.0, 0.5);
    dt_wlink_heartbeat();
    dt_wlink_shard(1, "/d", "f", 1, SHA_A, 0);
    dt_wlink_result(2, 1.0, 0.25, SHA_A, NULL, 0);
    dt_wlink_tick();
    cr_assert_eq(dt_wlink_poll(), 0);
    cr_assert_eq(count_fds(), before, "no descriptor opened (no PMIx, no socket)");
    dt_wlink_close();
    cr_assert_eq(dt_wlink_open_channel(0, &em), 0, "%s", em.s);
    cr_assert_eq(dt_wlink_active(), 0);
    dt_wlink_close();
}

Test(wlink, hello_progress_shard_result_arrive_with_their_fields, .timeout = 30)
{
    agent_t a;
    dt_msg_t m;
    int man = -1;
    dt_emsg_t em = { "" };

    spawn(&a, 3, 0, 0, w_report);
    expect_hello(&a, 3);

    expect_frame(&a, &m, DT_MSG_W_PROGRESS);
    cr_assert_eq(geti(&m, "rank"), 3);
    cr_assert_eq(geti(&m, "step"), 5);
    cr_assert_eq(geti(&m, "steps"), 10);
    cr_assert_eq(geti(&m, "tokens"), 1280);
    cr_assert_float_eq(getd(&m, "loss"), 2.5, 1e-12);
    cr_assert_float_eq(getd(&m, "tokens_s"), 1000.0, 1e-9);
    cr_assert_float_eq(getd(&m, "acc"), 0.25, 1e-12);
    dt_msg_clear(&m);

    expect_frame(&a, &m, DT_MSG_W_PROGRESS);
    cr_assert_eq(geti(&m, "step"), 6);
    cr_assert(json_is_null(json_object_get(m.body, "loss")), "a NaN loss goes out as null");
    cr_assert(json_is_null(json_object_get(m.body, "tokens_s")), "infinity goes out as null");
    cr_assert_float_eq(getd(&m, "acc"), 0.5, 1e-12);
    dt_msg_clear(&m);

    expect_frame(&a, &m, DT_MSG_W_HEARTBEAT);
    cr_assert_eq(geti(&m, "rank"), 3);
    dt_msg_clear(&m);

    expect_frame(&a, &m, DT_MSG_W_SHARD);
    cr_assert_eq(geti(&m, "rank"), 3);
    cr_assert_eq(geti(&m, "step"), 6);
    cr_assert_str_eq(gets_(&m, "dir"), "/ck/step-00000006");
    cr_assert_str_eq(gets_(&m, "path"), "shard-00003-of-00004.safetensors");
    cr_assert_eq(geti(&m, "bytes"), 123456);
    cr_assert_str_eq(gets_(&m, "sha256"), SHA_A);
    cr_assert_eq(dt_msg_opt_bool(&m, "manifest", &man, &em), 0, "%s", em.s);
    cr_assert_eq(man, 0);
    dt_msg_clear(&m);

    expect_frame(&a, &m, DT_MSG_W_SHARD);
    cr_assert_str_eq(gets_(&m, "path"), "manifest.json");
    cr_assert_eq(geti(&m, "bytes"), 789);
    cr_assert_str_eq(gets_(&m, "sha256"), SHA_B);
    cr_assert_eq(dt_msg_opt_bool(&m, "manifest", &man, &em), 0, "%s", em.s);
    cr_assert_eq(man, 1);
    dt_msg_clear(&m);

    expect_frame(&a, &m, DT_MSG_W_RESULT);
    cr_assert_eq(geti(&m, "rank"), 3);
    cr_assert_eq(geti(&m, "steps"), 10);
    cr_assert_float_eq(getd(&m, "loss"), 1.25, 1e-12);
    cr_assert_str_eq(gets_(&m, "checksum"), SHA_B);
    json_t *outs = json_object_get(m.body, "outputs");
    cr_assert_eq(json_array_size(outs), 2);
    cr_assert_str_eq(json_string_value(json_array_get(outs, 1)), "/jobs/7/output/logits.npy");
    dt_msg_clear(&m);

    expect_frame(&a, &m, DT_MSG_W_HEARTBEAT); /* the tick after a silence, only */
    dt_msg_clear(&m);

    cr_assert_eq(next_frame(&a, &m), 0, "end of file after dt_wlink_close");
    expect_exit(&a, 0, NULL);
}

/* W_CHECKPOINT and W_STOP, sent 3 bytes at a time so the worker sees
 * partial frames, come out of dt_wlink_poll as flags. */
static void stop_case(json_t *stop_body, int want)
{
    agent_t a;
    dt_msg_t m;

    spawn(&a, 1, 0, 0, w_poll_until_stop);
    expect_hello(&a, 1);
    expect_frame(&a, &m, DT_MSG_W_HEARTBEAT); /* it has polled once, empty-handed */
    dt_msg_clear(&m);
    if (want & DT_WLINK_CHECKPOINT)
        send_msg(&a, DT_MSG_W_CHECKPOINT, 0, NULL, 3);
    send_msg(&a, DT_MSG_W_STOP, 0, stop_body, 3);
    expect_exit(&a, want, NULL);
}

Test(wlink, poll_sees_checkpoint_and_stop_with_checkpoint, .timeout = 30)
{
    stop_case(json_pack("{s:b}", "checkpoint", 1),
              DT_WLINK_CHECKPOINT | DT_WLINK_STOP | DT_WLINK_STOP_CKPT);
}

Test(wlink, poll_sees_stop_without_checkpoint, .timeout = 30)
{
    stop_case(json_object(), DT_WLINK_STOP);
    stop_case(json_pack("{s:b}", "checkpoint", 0), DT_WLINK_STOP);
}

/* A frame with any 16-byte header. */
static size_t raw(uint8_t *f, uint32_t magic, uint16_t type, uint32_t id, const char *payload)
{
    size_t n = strlen(payload);
    const uint32_t w[4] = { magic, (uint32_t)1 << 16 | type, id, (uint32_t)n };

    for (int i = 0; i < 4; i++)
        for (int b = 0; b < 4; b++)
            f[4 * i + b] = (uint8_t)(w[i] >> (24 - 8 * b));
    memcpy(f + 16, payload, n);
    return 16 + n;
}

Test(wlink, a_malformed_frame_from_the_agent_exits_agent_lost, .timeout = 60)
{
    static const struct {
        uint32_t magic;
        uint16_t type;
        uint32_t id;
        const char *payload, *why;
    } cases[] = {
        { 0x47455420, DT_MSG_W_STOP, 0, "{}", "bad magic" },
        { DT_PROTO_MAGIC, 999, 0, "{}", "unknown message type 999" },
        { DT_PROTO_MAGIC, DT_MSG_W_STOP, 0, "{\"checkpoint\": tru", "not a JSON object" },
        { DT_PROTO_MAGIC, DT_MSG_W_STOP, 0, "{\"checkpoint\": \"yes\"}", "'checkpoint'" },
        { DT_PROTO_MAGIC, DT_MSG_W_STOP, 7, "{}", "id 7" },
        { DT_PROTO_MAGIC, DT_MSG_W_PROGRESS, 0, "{}", "W_PROGRESS" },
        { DT_PROTO_MAGIC, DT_MSG_OK, 0, "{}", "OK (a worker takes only" },
    };

    for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
        agent_t a;
        uint8_t f[256];
        size_t n = raw(f, cases[i].magic, cases[i].type, cases[i].id, cases[i].payload);

        spawn(&a, 2, 0, 0, w_poll_forever);
        expect_hello(&a, 2);
        send_bytes(&a, f, n, n);
        expect_exit(&a, DT_EXIT_AGENT_LOST, cases[i].why);
        /* and the message says who and what */
        spawn(&a, 2, 0, 0, w_poll_forever);
        expect_hello(&a, 2);
        send_bytes(&a, f, n, n);
        expect_exit(&a, DT_EXIT_AGENT_LOST, "dtengine: rank 2: malformed frame from the agent");
    }
}

Test(wlink, end_of_file_exits_agent_lost, .timeout = 30)
{
    agent_t a;
    uint8_t f[64];
    size_t n = raw(f, DT_PROTO_MAGIC, DT_MSG_W_STOP, 0, "{}");

    spawn(&a, 0, 0, 0, w_poll_forever);
    expect_hello(&a, 0);
    hang_up(&a);
    expect_exit(&a, DT_EXIT_AGENT_LOST, "the agent closed the channel");

    /* a valid frame, then the end of the stream half-way through another */
    spawn(&a, 0, 0, 0, w_poll_forever);
    expect_hello(&a, 0);
    send_bytes(&a, f, n, n);
    send_bytes(&a, f, 10, 10);
    hang_up(&a);
    expect_exit(&a, DT_EXIT_AGENT_LOST, "in the middle of a frame");
}

Test(wlink, writing_to_a_gone_agent_exits_agent_lost_not_sigpipe, .timeout = 30)
{
    agent_t a;

    spawn(&a, 4, 0, 0, w_write_forever);
    expect_hello(&a, 4);
    hang_up(&a);
    expect_exit(&a, DT_EXIT_AGENT_LOST, "cannot send W_HEARTBEAT to the agent");
}

/* Slurm's warning signal reaches every process of the agents' step; the
 * job's is USR1 or USR2 (its spec's `signal`): a worker survives both. */
static void w_user_signals(void)
{
    raise(SIGUSR1);
    raise(SIGUSR2);
}

Test(wlink, a_worker_survives_both_warning_signals, .timeout = 30)
{
    agent_t a;

    spawn(&a, 1, 0, 0, w_user_signals);
    expect_hello(&a, 1);
    expect_exit(&a, 0, NULL);
}

Test(wlink, a_parent_that_is_not_the_agent_exits_at_once, .timeout = 30)
{
    agent_t a;
    dt_msg_t m;

    spawn(&a, 0, 1, 0, w_report); /* DT_AGENT_PID=1: init, not our parent */
    cr_assert_eq(next_frame(&a, &m), 0, "no frame at all from a worker of another agent");
    expect_exit(&a, DT_EXIT_AGENT_LOST, "not the agent (DT_AGENT_PID=1)");
}

Test(wlink, a_bad_environment_is_an_error_naming_the_variable)
{
    int sv[2], file = open("/dev/null", O_RDONLY);
    char fd[16], nfile[16];
    dt_emsg_t em;
    const struct {
        const char *fd, *pid, *why;
    } cases[] = {
        { "x3", "1", "DT_AGENT_FD='x3': not a descriptor number" },
        { "", "1", "DT_AGENT_FD='': not a descriptor number" },
        { "-1", "1", "DT_AGENT_FD='-1'" },
        { "100000", "1", "DT_AGENT_FD=100000: Bad file descriptor" },
        { nfile, "1", "not a socket" },
        { fd, NULL, "DT_AGENT_FD is set but DT_AGENT_PID is not" },
        { fd, "12x", "DT_AGENT_PID='12x': not a process id" },
        { fd, "0", "DT_AGENT_PID='0'" },
    };

    cr_assert_eq(socketpair(AF_UNIX, SOCK_STREAM, 0, sv), 0);
    cr_assert_geq(file, 0);
    snprintf(fd, sizeof(fd), "%d", sv[1]);
    snprintf(nfile, sizeof(nfile), "%d", file);
    for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
        memset(&em, 0, sizeof(em));
        setenv("DT_AGENT_FD", cases[i].fd, 1);
        if (cases[i].pid)
            setenv("DT_AGENT_PID", cases[i].pid, 1);
        else
            unsetenv("DT_AGENT_PID");
        cr_assert_eq(dt_wlink_open_channel(0, &em), DT_EINVAL, "case %zu", i);
        cr_assert(strstr(em.s, cases[i].why) != NULL, "case %zu: '%s' lacks '%s'", i, em.s,
                  cases[i].why);
        cr_assert_eq(dt_wlink_active(), 0);
        memset(&em, 0, sizeof(em));
        cr_assert_eq(dt_wlink_open(0, &em), DT_EINVAL, "case %zu (dt_wlink_open)", i);
        cr_assert(strstr(em.s, cases[i].why) != NULL, "case %zu: '%s'", i, em.s);
    }
    unsetenv("DT_AGENT_FD");
    unsetenv("DT_AGENT_PID");
    close(sv[0]);
    close(sv[1]);
    close(file);
}

/* Under an agent the agent is the PMIx server: without one, dt_wlink_open
 * fails (DT_ECOMM, naming PMIx_Init), sends nothing, and leaves nothing
 * open. */
static void w_inactive(void)
{
    if (dt_wlink_active())
        _exit(97);
}

Test(wlink, open_under_an_agent_without_its_pmix_server_is_an_error, .timeout = 60)
{
    agent_t a;
    dt_msg_t m;

    spawn(&a, 0, 0, 1, w_inactive);
    cr_assert_eq(next_frame(&a, &m), 0, "no W_HELLO when the open failed");
    expect_exit(&a, 99, "open: DT_ECOMM: PMIx_Init failed under dtagentd");
}

/* ---- in-memory checkpoints (engine/cmd/memckpt.c) ------------------------------- */

/* The agent's two memory files, made before the fork (the worker inherits
 * them, as from a real agent), read here after the worker is gone. */
static int mem_fd[2] = { -1, -1 };
static float mem_data[4096];

/* The worker: copies of steps 3 and 4 written and hashed on the copies'
 * thread (the array changed once the caller has synced: the copy of 3 is
 * what it held before), then step 5's written in place; a copy whose slot
 * is still being written is skipped, never waited for. */
static void w_memckpt(void)
{
    dt_memckpt_t mc;
    dt_emsg_t em = { "" };
    char v[32];
    int64_t n = DT_ARRAY_SIZE(mem_data);

    snprintf(v, sizeof(v), "%d,%d", mem_fd[0], mem_fd[1]);
    setenv(DT_MEMCKPT_ENV, v, 1);
    if (dt_memckpt_init(&mc, "test", 1, &em) < 0 || !dt_memckpt_due(&mc, 3, 10) ||
        dt_memckpt_due(&mc, 10, 10)) {
        fprintf(stderr, "init: %s\n", em.s);
        _exit(98);
    }
    for (int64_t step = 3; step <= 5; step++) {
        for (int64_t i = 0; i < n; i++)
            mem_data[i] = (float)(step * 10000 + i);
        /* (a slot still being hashed skips its copy: wait, for the test) */
        for (int k = 0; !dt_memckpt_ready(&mc, step); k++) {
            if (k > 10000)
                _exit(97);
            usleep(1000);
        }
        dt_st_writer_t *w = dt_st_writer_new();
        char s[16];
        snprintf(s, sizeof(s), "%lld", (long long)step);
        if (dt_st_writer_add(w, "x", DT_F32, 1, &n, mem_data, &em) < 0 ||
            dt_st_writer_meta(w, "step", s, &em) < 0)
            _exit(96);
        if (step < 5) {
            dt_memckpt_write_async(&mc, step, w);
            dt_memckpt_sync(&mc); /* written: mem_data is ours again */
        } else {
            dt_memckpt_write(&mc, step, w);
            dt_st_writer_free(w);
        }
        mem_data[0] = -1; /* after the sync: in no copy */
    }
    dt_memckpt_close(&mc); /* every copy hashed and reported */
}

/* A W_MEMCKPT as it came: writing (1) or the copy (0) of step in slot,
 * the copy's sha256. */
typedef struct memframe {
    int writing, slot;
    int64_t step;
    char sha[65];
} memframe_t;

static void next_memckpt(agent_t *a, memframe_t *f)
{
    dt_msg_t m;
    dt_emsg_t em = { "" };

    expect_frame(a, &m, DT_MSG_W_MEMCKPT);
    cr_assert_eq(geti(&m, "rank"), 2);
    f->step = geti(&m, "step");
    f->slot = (int)geti(&m, "slot");
    f->writing = 0;
    f->sha[0] = '\0';
    cr_assert_eq(dt_msg_opt_bool(&m, "writing", &f->writing, &em), 0, "%s", em.s);
    if (!f->writing) {
        cr_assert_gt(geti(&m, "bytes"), (int64_t)sizeof(mem_data));
        snprintf(f->sha, sizeof(f->sha), "%s", gets_(&m, "sha256"));
    }
    dt_msg_clear(&m);
}

/* A copy in fd: its SHA-256 is the one reported, and its tensor the
 * array as it was at step. */
static void check_copy(int fd, const char *sha, int64_t step)
{
    char hex[65], path[48];
    dt_st_reader_t *r = NULL;
    dt_emsg_t em = { "" };
    static float got[DT_ARRAY_SIZE(mem_data)];

    cr_assert_gt(dt_sha256_fd(fd, hex), 0);
    cr_assert_str_eq(hex, sha, "step %lld: the copy's hash is the one reported", (long long)step);
    snprintf(path, sizeof(path), "/proc/self/fd/%d", fd);
    cr_assert_eq(dt_st_open(path, &r, &em), 0, "%s", em.s);
    cr_assert_eq(dt_st_read(r, "x", got, sizeof(got), &em), 0, "%s", em.s);
    for (size_t i = 0; i < DT_ARRAY_SIZE(got); i++)
        cr_assert_eq(got[i], (float)(step * 10000 + (int64_t)i), "step %lld, x[%zu]",
                     (long long)step, i);
    dt_st_close(r);
}

Test(wlink, memory_copies_written_and_hashed_on_their_thread_reported_in_order, .timeout = 60)
{
    agent_t a;
    memframe_t f[6];
    int at[3][2]; /* steps 3..5: the frame index of its writing notice and of its copy */

    for (int s = 0; s < 2; s++)
        cr_assert_geq(mem_fd[s] = memfd_create("test-slot", 0), 0, "%s", strerror(errno));
    spawn(&a, 2, 0, 0, w_memckpt);
    expect_hello(&a, 2);
    memset(at, -1, sizeof(at));
    for (int i = 0; i < 6; i++) {
        next_memckpt(&a, &f[i]);
        cr_assert(f[i].step >= 3 && f[i].step <= 5, "step %lld", (long long)f[i].step);
        cr_assert_eq(f[i].slot, f[i].step == 4 ? 1 : 0, "copies alternate slots");
        cr_assert_eq(at[f[i].step - 3][f[i].writing ? 0 : 1], -1, "one of each");
        at[f[i].step - 3][f[i].writing ? 0 : 1] = i;
    }
    expect_exit(&a, 0, NULL);
    for (int k = 0; k < 3; k++)
        cr_assert_lt(at[k][0], at[k][1], "step %d: announced as being written before its copy",
                     k + 3);
    cr_assert_lt(at[0][1], at[2][0], "slot 0 rewritten only once step 3's copy was reported");
    check_copy(mem_fd[1], f[at[1][1]].sha, 4);
    check_copy(mem_fd[0], f[at[2][1]].sha, 5);
    cr_assert_str_neq(f[at[0][1]].sha, f[at[2][1]].sha);
    for (int s = 0; s < 2; s++)
        close(mem_fd[s]);
}
