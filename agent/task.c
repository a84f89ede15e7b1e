/* SPDX-License-Identifier: MIT
 *
 * dtagentd's workers: one generation at a time, the ranks the coordinator
 * placed here, each a dtengine process spawned with uv_spawn in the
 * generation's PMIx namespace, with a worker channel (a Unix stream
 * socketpair, the child's end as fd 3, DT_AGENT_FD=3) for progress,
 * heartbeats, checkpoint shards and results one way, checkpoint and stop
 * requests the other.
 *
 * Failure handling here is local and immediate: a worker that exits badly,
 * or is silent past the hang timeout (then killed), is reported to the
 * coordinator, and its local peers get a PMIx failure event at once; after
 * the grace period whatever is left is killed. The decision what to do next
 * (another generation, spares, fewer ranks, fail) is the coordinator's.
 *
 * Checkpoint shards a worker reports are hashed again here, on the thread
 * pool, before they are reported: the coordinator commits a checkpoint only
 * from shards an agent has read back.
 *
 * Not here: the coordinator link (reached through the hooks, hooks.h), the
 * PMIx server's internals (pmix.c), checkpoint commits and prunes (files.c).
 */
#include "config.h"

#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

#include "agent/pmix.h"
#include "agent/task.h"
#include "common/base64.h"
#include "common/clock.h"
#include "common/exitcodes.h"
#include "common/fileio.h"
#include "common/log.h"
#include "common/mem.h"
#include "common/sha256.h"
#include "common/uvframe.h"
#include "agent/memstore.h"
#include "agent/peer.h"
#include "io/ckpt.h"
#include "spec/vocab.h"

#define WATCH_MS 100

/* One worker process (one rank of the current generation). */
typedef struct dt_worker {
    struct dt_task *t;
    int rank;
    uv_process_t proc;
    uv_pipe_t chan;          /* our end of the worker channel */
    uv_pipe_t out;           /* the worker's stdout and stderr, when it has a rank log */
    int proc_open, chan_open, out_open; /* handles not yet closed */
    int log_fd;              /* LOG_DIR/rank-R.log (append), -1 without one */
    char last[256];          /* the last line of its output, for WORKER_EXIT's error */
    char line[256];          /* the line being read */
    size_t line_len;
    int exited;              /* the exit callback ran */
    int64_t status;
    int term_signal;
    int64_t pid;
    int64_t last_heard_ms;   /* monotonic: spawn, then every frame */
    int heard;               /* a frame came: the hang timeout applies from now on */
    int64_t step;
    int hung;                /* killed for silence: 1, 2 when it was stopped (SIGSTOP) */
    int stepping;            /* the first W_PROGRESS came */
    json_t *result;          /* W_RESULT (rank 0) */
    dt_uvframe_t rd;         /* the channel's unread bytes */
    int gpu;                 /* a cuda generation: its index in conf.gpus; -1 none */
    int fetching;            /* waiting for its in-memory copy from a peer before its spawn */
    int fetch_slot;
} dt_worker_t;

struct dt_task {
    uv_loop_t *loop;
    dt_task_conf_t conf;
    dt_agentd_hooks_t hooks;
    uint32_t gen;            /* 0: none */
    char *nspace;
    int nranks;
    dt_worker_t *workers;
    int nworkers;
    int aborting;            /* notified and waiting out the grace period */
    int fences_out;          /* fence relays sent to the coordinator, not answered yet */
    int ended_sent;
    char *gen_dir;
    char *log_dir;           /* GEN_START's log_dir: rank logs, the job owner's; NULL none */
    uv_timer_t watch_timer;  /* hang checks */
    uv_timer_t grace_timer;
    dt_pmix_t *pmix;
    dt_memstore_t *mem;      /* in-memory checkpoints of the ranks here (memstore.h) */
    int64_t mem_resume;      /* GEN_START's: the step the ranks resume from in memory; 0 none */
    dt_peer_t *peer;         /* the channel to other agents (replicas); NULL none */
    dt_peer_t *peer_failed;  /* one that could not listen: closed, freed with the task */
    char **replica_to;       /* [nranks] GEN_START's: where each rank's replicas go, "" none */
    char **args;             /* the workers' command line, for a spawn after a fetch */
};

static void gen_maybe_ended(dt_task_t *t);
static void replica_to_free(dt_task_t *t);

static int64_t agent_id(const dt_task_t *t)
{
    return t->hooks.agent_id(t->hooks.ud);
}

static void send_reliable(dt_task_t *t, uint16_t type, json_t *body)
{
    t->hooks.send_reliable(t->hooks.ud, type, body);
}

/*-- worker channel ----------------------------------------------------------*/

static void chan_write_done(uv_write_t *w, int status)
{
    (void)status;
    free(w->data);
    free(w);
}

static void chan_send(dt_worker_t *w, uint16_t type, json_t *body)
{
    uint8_t *buf;
    size_t len;

    if (w->chan_open && !w->exited && dt_msg_encode(type, 0, body, &buf, &len) == 0) {
        uv_write_t *req = dt_xmalloc(sizeof(*req));
        uv_buf_t b = uv_buf_init((char *)buf, (unsigned)len);
        req->data = buf;
        if (uv_write(req, (uv_stream_t *)&w->chan, &b, 1, chan_write_done) < 0) {
            free(buf);
            free(req);
        }
    }
    json_decref(body);
}

static void handle_closed(uv_handle_t *h)
{
    dt_worker_t *w = h->data;
    if (h == (uv_handle_t *)&w->chan)
        w->chan_open = 0;
    else if (h == (uv_handle_t *)&w->out)
        w->out_open = 0;
    else
        w->proc_open = 0;
    gen_maybe_ended(w->t);
}

/*-- rank logs ------------------------------------------------------------------*/

/* A worker's output goes to its rank log (LOG_DIR/rank-R.log, appended
 * over the generations, the job owner's, mode 0600) and, as before rank
 * logs existed, to the agent's own standard error (the Slurm batch output,
 * or dtctl run --local's agent log). */
/* dtengine's informational log lines ("dtengine: [rank=N ]info: ..." and
 * debug ones, common/log.h's format): what it runs on, not why it failed. */
static int informational(const char *line, size_t n)
{
    static const char prog[] = "dtengine: ";
    size_t i = sizeof(prog) - 1;

    if (n < i || memcmp(line, prog, i) != 0)
        return 0;
    if (n - i > 5 && memcmp(line + i, "rank=", 5) == 0) {
        i += 5;
        while (i < n && line[i] >= '0' && line[i] <= '9')
            i++;
        if (i < n && line[i] == ' ')
            i++;
    }
    return (n - i >= 6 && memcmp(line + i, "info: ", 6) == 0) ||
           (n - i >= 7 && memcmp(line + i, "debug: ", 7) == 0);
}

/* Keep the last non-empty line the worker wrote that says something went
 * wrong (its informational log lines aside): printable ASCII only
 * (anything else becomes '?'), so it can travel in a message and be shown
 * to users as it is. */
static void keep_last_line(dt_worker_t *w, const char *p, size_t n)
{
    for (size_t i = 0; i < n; i++) {
        unsigned char ch = (unsigned char)p[i];
        if (ch == '\n') {
            if (w->line_len > 0 && !informational(w->line, w->line_len)) {
                memcpy(w->last, w->line, w->line_len);
                w->last[w->line_len] = '\0';
            }
            w->line_len = 0;
        } else if (w->line_len + 1 < sizeof(w->line)) {
            w->line[w->line_len++] = ch >= 0x20 && ch < 0x7f ? (char)ch : '?';
        }
    }
}

static void out_bytes(dt_worker_t *w, const char *p, size_t n)
{
    keep_last_line(w, p, n);
    if (w->log_fd >= 0 && dt_write_full(w->log_fd, p, n) < 0) {
        dt_log_warn("gen=%u rank=%d: writing the rank log failed: %s; it stops here",
                    w->t->gen, w->rank, strerror(errno));
        close(w->log_fd);
        w->log_fd = -1;
    }
    (void)dt_write_full(2, p, n);
}

static void out_alloc(uv_handle_t *h, size_t hint, uv_buf_t *b)
{
    (void)hint;
    b->base = dt_xmalloc(16384);
    b->len = 16384;
    (void)h;
}

static void out_close(dt_worker_t *w)
{
    if (w->log_fd >= 0) {
        close(w->log_fd);
        w->log_fd = -1;
    }
    if (w->out_open && !uv_is_closing((uv_handle_t *)&w->out))
        uv_close((uv_handle_t *)&w->out, handle_closed);
}

static void out_read(uv_stream_t *s, ssize_t n, const uv_buf_t *b)
{
    dt_worker_t *w = s->data;

    if (n > 0)
        out_bytes(w, b->base, (size_t)n);
    free(b->base);
    if (n < 0)
        out_close(w);
}

/* At the worker's exit: what it wrote is in the pipe; take it now rather
 * than wait for an EOF that a leftover child of the worker could delay. */
static void out_drain(dt_worker_t *w)
{
    uv_os_fd_t fd;
    char buf[16384];
    ssize_t n;

    if (!w->out_open || uv_is_closing((uv_handle_t *)&w->out))
        return;
    if (uv_fileno((uv_handle_t *)&w->out, &fd) == 0)
        while ((n = read(fd, buf, sizeof(buf))) > 0)
            out_bytes(w, buf, (size_t)n);
    out_close(w);
}

/* Open the rank's log and the pipe its output comes through; on failure
 * the worker inherits the agent's stdout and stderr as before (*out_fd
 * -1). */
static void rank_log_open(dt_task_t *t, dt_worker_t *w, int *out_fd)
{
    int p[2];

    *out_fd = -1;
    w->log_fd = -1;
    if (t->log_dir == NULL)
        return;
    if (mkdir(t->log_dir, 0700) < 0 && errno != EEXIST) {
        dt_log_warn("rank logs %s: %s", t->log_dir, strerror(errno));
        return;
    }
    char *path = dt_xasprintf("%s/rank-%d.log", t->log_dir, w->rank);
    w->log_fd = open(path, O_WRONLY | O_CREAT | O_APPEND | O_NOFOLLOW | O_CLOEXEC, 0600);
    if (w->log_fd < 0) {
        dt_log_warn("rank log %s: %s", path, strerror(errno));
        free(path);
        return;
    }
    free(path);
    if (pipe2(p, O_CLOEXEC) < 0) {
        dt_log_warn("rank %d output pipe: %s", w->rank, strerror(errno));
        close(w->log_fd);
        w->log_fd = -1;
        return;
    }
    char head[512];
    int n = snprintf(head, sizeof(head), "dtagentd: job=%lld gen=%u rank=%d node=%s starting\n",
                     (long long)t->conf.job, t->gen, w->rank, t->conf.node);
    (void)dt_write_full(w->log_fd, head, (size_t)n); /* a failing log says so at the next write */
    uv_pipe_init(t->loop, &w->out, 0);
    w->out.data = w;
    int rc = uv_pipe_open(&w->out, p[0]);
    if (rc < 0) {
        /* as without a rank log: the worker writes to our stdout and stderr */
        dt_log_warn("rank %d output pipe: %s", w->rank, uv_strerror(rc));
        w->out_open = 1;
        out_close(w); /* the handle, and the rank log */
        close(p[0]);
        close(p[1]);
        return;
    }
    w->out_open = 1;
    *out_fd = p[1];
}

static void chan_close(dt_worker_t *w)
{
    if (w->chan_open && !uv_is_closing((uv_handle_t *)&w->chan))
        uv_close((uv_handle_t *)&w->chan, handle_closed);
}

/* A shard read back on the thread pool. */
typedef struct verify {
    uv_work_t req;
    dt_task_t *t;
    uint32_t gen;
    int rank, manifest, ok;
    int64_t step, bytes;
    uint64_t t0, t1; /* ns: read-back start and end */
    char *dir, *path, *full, sha[65], why[256];
    char (*shards)[65]; /* the manifest's sha256 per rank */
    int nshards;
} verify_t;

/* The manifest, read back as the job's owner: the sha256 it lists for each
 * rank's shard, which the coordinator compares with the shards' own
 * reports (it does not open the job's files itself). */
static void read_manifest(verify_t *v)
{
    dt_ckpt_manifest_t man = { 0 };
    dt_emsg_t em = { "" };

    if (dt_ckpt_manifest_read(v->dir, &man, &em) < 0) {
        v->ok = 0;
        snprintf(v->why, sizeof(v->why), "%s", em.s);
        return;
    }
    v->shards = dt_xcalloc((size_t)man.ranks, sizeof(*v->shards));
    for (int i = 0; i < man.ranks; i++)
        snprintf(v->shards[i], sizeof(v->shards[i]), "%s", man.shards[i].sha256);
    v->nshards = man.ranks;
    dt_ckpt_manifest_close(&man);
}

static void verify_work(uv_work_t *req)
{
    verify_t *v = req->data;
    dt_emsg_t em = { "" };
    char hex[DT_SHA256_HEX];
    int64_t size = 0, off;
    int fd;

    v->t0 = uv_hrtime();
    fd = dt_open_regular(v->full, &size, &em);
    v->ok = 0;
    if (fd < 0) {
        snprintf(v->why, sizeof(v->why), "%s", em.s);
        return;
    }
    off = dt_sha256_fd(fd, hex);
    close(fd);
    v->t1 = uv_hrtime();
    if (off < 0)
        snprintf(v->why, sizeof(v->why), "%s: read error", v->full);
    else if (off != v->bytes)
        snprintf(v->why, sizeof(v->why), "%s: %lld bytes, the worker reported %lld", v->full,
                 (long long)off, (long long)v->bytes);
    else if (strcmp(hex, v->sha) != 0)
        snprintf(v->why, sizeof(v->why), "%s: sha256 %s, the worker reported %s", v->full, hex,
                 v->sha);
    else
        v->ok = 1;
    if (v->ok && v->manifest)
        read_manifest(v);
}

static void verify_done(uv_work_t *req, int status)
{
    verify_t *v = req->data;
    dt_task_t *t = v->t;

    if (status == 0 && v->ok)
        dt_log_info("gen=%u rank=%d step=%lld %s verified: %lld bytes in %.1f ms", v->gen,
                    v->rank, (long long)v->step, v->manifest ? "manifest" : "shard",
                    (long long)v->bytes, (double)(v->t1 - v->t0) / 1e6);
    if (status == 0 && v->ok && !t->hooks.stopping(t->hooks.ud)) {
        const char **shas = dt_xcalloc((size_t)v->nshards + 1, sizeof(*shas));
        for (int i = 0; v->manifest && i < v->nshards; i++)
            shas[i] = v->shards[i];
        dt_wire_shard_written_t sw = {
            .agent = agent_id(t), .gen = v->gen, .step = v->step, .rank = v->rank,
            .path = v->full, .bytes = v->bytes, .sha256 = v->sha, .dir = v->dir,
            .manifest = v->manifest, .shards = { shas, v->manifest ? (size_t)v->nshards : 0 },
        };
        send_reliable(t, DT_MSG_SHARD_WRITTEN, dt_wire_shard_written_encode(&sw));
        free(shas);
    } else if (status == 0 && !v->ok)
        dt_log_error("gen=%u rank=%d step=%lld checkpoint file does not verify: %s", v->gen,
                     v->rank, (long long)v->step, v->why);
    free(v->dir);
    free(v->path);
    free(v->full);
    free(v->shards);
    free(v);
}

static void on_shard(dt_worker_t *w, const dt_msg_t *m)
{
    dt_task_t *t = w->t;
    dt_emsg_t em = { "" };
    dt_wire_w_shard_t sh;

    if (dt_wire_w_shard_decode(m, &sh, &em) < 0 || strchr(sh.path, '/') != NULL) {
        dt_log_error("gen=%u rank=%d: bad W_SHARD: %s", t->gen, w->rank,
                     em.s[0] ? em.s : "the file name has a '/'");
        return;
    }
    const char *dir = sh.dir, *path = sh.path, *sha = sh.sha256;
    int64_t step = sh.step, bytes = sh.bytes;
    int manifest = sh.manifest;
    verify_t *v = dt_xcalloc(1, sizeof(*v));
    v->req.data = v;
    v->t = t;
    v->gen = t->gen;
    v->rank = w->rank;
    v->manifest = manifest;
    v->step = step;
    v->bytes = bytes;
    v->dir = dt_xstrdup(dir);
    v->path = dt_xstrdup(path);
    v->full = dt_xasprintf("%s/%s", dir, path);
    snprintf(v->sha, sizeof(v->sha), "%s", sha);
    if (uv_queue_work(t->loop, &v->req, verify_work, verify_done) < 0)
        verify_done(&v->req, UV_ECANCELED);
}

/* W_MEMCKPT: a slot about to be overwritten is forgotten; a copy written
 * is kept as the worker reports it (its hash made on the worker's own
 * thread from the memory file, off the step), offered to the coordinator,
 * and sent as a replica to the agent the coordinator named. It is not read
 * again here: the worker that resumes from it checks it against the hash
 * before use (a mismatch is a resume from disk), the replica's holder
 * hashes what it receives. */
static void on_memckpt(dt_worker_t *w, const dt_msg_t *m)
{
    dt_task_t *t = w->t;
    dt_emsg_t em = { "" };
    dt_wire_w_memckpt_t mc;
    int fds[2];

    if (dt_wire_w_memckpt_decode(m, &mc, &em) == 0 && !mc.writing &&
        (mc.sha256 == NULL || mc.bytes <= 0))
        snprintf(em.s, sizeof(em.s), "a copy of step %lld without its bytes or sha256",
                 (long long)mc.step);
    if (em.s[0] != '\0' || dt_memstore_fds(t->mem, w->rank, fds, &em) < 0) {
        dt_log_error("gen=%u rank=%d: bad W_MEMCKPT: %s", t->gen, w->rank, em.s);
        return;
    }
    int slot = (int)mc.slot;
    dt_memstore_clear(t->mem, w->rank, slot);
    if (mc.writing)
        return;
    dt_memstore_set(t->mem, w->rank, slot, mc.step, mc.bytes, mc.sha256);
    dt_wire_mem_ckpt_t r = { .agent = agent_id(t), .gen = t->gen, .rank = w->rank,
                             .step = mc.step, .bytes = mc.bytes, .sha256 = mc.sha256 };
    /* not queued while the coordinator is away: the next one says more */
    t->hooks.send(t->hooks.ud, DT_MSG_MEM_CKPT, dt_wire_mem_ckpt_encode(&r));
    const char *to = t->replica_to && w->rank < t->nranks ? t->replica_to[w->rank] : NULL;
    if (to && to[0])
        dt_peer_send(t->peer, to, w->rank, mc.step, fds[slot], mc.bytes, mc.sha256);
}

static void on_worker_frame(dt_worker_t *w, const dt_msg_t *m)
{
    dt_task_t *t = w->t;

    w->last_heard_ms = dt_clock_mono_ms();
    w->heard = 1;
    dt_emsg_t em = { "" };
    switch (m->type) {
    case DT_MSG_W_HELLO: {
        dt_wire_w_hello_t h;
        if (dt_wire_w_hello_decode(m, &h, &em) < 0) {
            dt_log_warn("gen=%u rank=%d: bad W_HELLO: %s", t->gen, w->rank, em.s);
            break;
        }
        if (h.pid > 0)
            w->pid = h.pid;
        dt_log_info("gen=%u rank=%d pid=%lld hello", t->gen, w->rank, (long long)w->pid);
        break;
    }
    case DT_MSG_W_PROGRESS: {
        dt_wire_w_progress_t wp;
        if (dt_wire_w_progress_decode(m, &wp, &em) < 0) {
            dt_log_warn("gen=%u rank=%d: bad W_PROGRESS: %s", t->gen, w->rank, em.s);
            break;
        }
        w->step = wp.step;
        if (!w->stepping) {
            w->stepping = 1;
            dt_log_info("gen=%u rank=%d running: step %lld", t->gen, w->rank,
                        (long long)w->step);
        }
        dt_wire_progress_t p = { .agent = agent_id(t), .gen = t->gen, .rank = w->rank,
                                 .pid = w->pid, .step = wp.step, .steps = wp.steps,
                                 .tokens = wp.tokens, .loss = wp.loss,
                                 .tokens_s = wp.tokens_s, .acc = wp.acc };
        t->hooks.send(t->hooks.ud, DT_MSG_PROGRESS, dt_wire_progress_encode(&p));
        break;
    }
    case DT_MSG_W_HEARTBEAT: break;
    case DT_MSG_W_SHARD: on_shard(w, m); break;
    case DT_MSG_W_MEMCKPT: on_memckpt(w, m); break;
    case DT_MSG_W_RESULT: {
        /* rank 0's summary: the coordinator stores it as the job's result */
        dt_wire_w_result_t res;
        if (dt_wire_w_result_decode(m, &res, &em) < 0) {
            dt_log_warn("gen=%u rank=%d: bad W_RESULT: %s", t->gen, w->rank, em.s);
            break;
        }
        json_decref(w->result);
        w->result = dt_wire_w_result_encode(&res);
        dt_wire_w_result_clear(&res); /* the outputs list */
        break;
    }
    default:
        dt_log_warn("gen=%u rank=%d sent %s on the worker channel: ignored", t->gen, w->rank,
                    dt_msg_type_name(m->type));
    }
}

static void chan_alloc(uv_handle_t *h, size_t hint, uv_buf_t *b)
{
    dt_worker_t *w = h->data;
    (void)hint;
    dt_uvframe_alloc(&w->rd, b);
}

static int on_chan_frame(void *ud, dt_msg_t *m)
{
    on_worker_frame(ud, m);
    return 0;
}

static void chan_read(uv_stream_t *s, ssize_t n, const uv_buf_t *b)
{
    dt_worker_t *w = s->data;
    dt_emsg_t em = { "" };
    (void)b;

    int rc = dt_uvframe_read(&w->rd, n, on_chan_frame, w, &em);
    if (n < 0) {
        chan_close(w); /* EOF: the process exit follows */
    } else if (rc < 0) {
        dt_log_error("gen=%u rank=%d worker channel: %s; closing it", w->t->gen, w->rank, em.s);
        chan_close(w);
    }
}

/*-- processes ------------------------------------------------------------------*/

static int alive(const dt_worker_t *w)
{
    return w->proc_open && !w->exited;
}

static void kill_worker(dt_worker_t *w, int sig)
{
    if (alive(w))
        uv_process_kill(&w->proc, sig);
}

/* Kill every worker now (SIGKILL). */
static void kill_all(dt_task_t *t)
{
    for (int i = 0; i < t->nworkers; i++)
        kill_worker(&t->workers[i], SIGKILL);
}

static void grace_fire(uv_timer_t *timer)
{
    dt_task_t *t = timer->data;
    for (int i = 0; i < t->nworkers; i++)
        if (alive(&t->workers[i])) {
            dt_log_warn("gen=%u rank=%d still running after the grace period: killing", t->gen,
                        t->workers[i].rank);
            kill_worker(&t->workers[i], SIGKILL);
        }
}

/* Tell local survivors that `rank` failed, then kill them after the grace
 * period. Idempotent per generation. */
static void begin_abort(dt_task_t *t, int rank, const char *why)
{
    dt_emsg_t em = { "" };

    if (rank >= 0 && dt_pmix_notify_failure(t->pmix, rank, &em) < 0)
        dt_log_warn("gen=%u: notifying rank %d's failure: %s", t->gen, rank, em.s);
    if (t->aborting)
        return;
    t->aborting = 1;
    dt_log_info("gen=%u aborting: %s; grace %lld ms", t->gen, why, (long long)t->conf.grace_ms);
    uv_timer_start(&t->grace_timer, grace_fire, (uint64_t)t->conf.grace_ms, 0);
}

static void on_exit_cb(uv_process_t *p, int64_t status, int sig)
{
    dt_worker_t *w = p->data;
    dt_task_t *t = w->t;
    int failed = status != DT_EXIT_OK || sig != 0;

    w->exited = 1;
    w->status = status;
    w->term_signal = sig;
    if (w->hung)
        dt_log_warn("gen=%u rank=%d hung and killed", t->gen, w->rank);
    else if (failed)
        dt_log_info("gen=%u rank=%d pid=%lld exited status=%lld signal=%d", t->gen, w->rank,
                    (long long)w->pid, (long long)status, sig);
    else
        dt_log_debug("gen=%u rank=%d exited 0", t->gen, w->rank);
    out_drain(w); /* its last words first: they say why */
    dt_wire_worker_exit_t x = {
        .agent = agent_id(t), .gen = t->gen, .rank = w->rank, .status = status, .signal = sig,
        .hung = w->hung != 0, .stopped = w->hung == 2, .step = w->step, .result = w->result,
        .error = failed && !w->hung && sig == 0 && w->last[0] ? w->last : NULL,
        .gpu = w->gpu >= 0 && t->conf.gpus ? t->conf.gpus->uuid[w->gpu] : NULL,
    };
    send_reliable(t, DT_MSG_WORKER_EXIT, dt_wire_worker_exit_encode(&x));
    /* a worker that stopped with a peer-failure code is a consequence, not
     * a cause; anything else bad starts the local abort */
    if (failed && !t->aborting && status != DT_EXIT_PEER)
        begin_abort(t, w->rank, w->hung ? "a worker hung" : "a worker failed");
    chan_close(w);
    uv_close((uv_handle_t *)&w->proc, handle_closed);
}

/* mem: the rank's two memory files are its fds 4 and 5 (-1: none); with
 * a resume from memory, the slot holding its copy and the copy's SHA-256
 * (resume NULL: none). */
static char **build_env(dt_task_t *t, int rank, int gpu, int mem, const dt_memcopy_t *resume,
                        int resume_slot, dt_emsg_t *em)
{
    char **env = NULL;
    size_t n = 0;

    if (dt_pmix_worker_env(t->pmix, rank, &env, em) < 0)
        return NULL;
    while (env[n])
        n++;
    char **out = dt_xcalloc(n + 9, sizeof(*out));
    size_t k = 0;
    for (size_t i = 0; i < n; i++)
        if (strncmp(env[i], "DT_AGENT_", 9) != 0 &&
            (gpu < 0 || (strncmp(env[i], "CUDA_VISIBLE_DEVICES=", 21) != 0 &&
                         strncmp(env[i], "DT_CPUS=", 8) != 0)))
            out[k++] = dt_xstrdup(env[i]);
    out[k++] = dt_xstrdup("DT_AGENT_FD=3");
    if (mem)
        out[k++] = dt_xstrdup("DT_MEM_CKPT=4,5");
    if (mem && resume)
        out[k++] = dt_xasprintf("DT_MEM_RESUME=%d:%s", resume_slot, resume->sha256);
    out[k++] = dt_xasprintf("DT_AGENT_PID=%ld", (long)getpid());
    /* a cuda worker sees its own GPU only (by UUID: indices change with
     * the node's CUDA_VISIBLE_DEVICES), and runs on the CPUs near it where
     * the node says which (dtengine pins itself to DT_CPUS) */
    if (gpu >= 0) {
        const dt_gpus_t *g = t->conf.gpus;
        out[k++] = dt_xasprintf("CUDA_VISIBLE_DEVICES=%s", g->uuid[gpu]);
        if (g->cpus[gpu])
            out[k++] = dt_xasprintf("DT_CPUS=%s", g->cpus[gpu]);
    }
    if (getenv("OPENBLAS_NUM_THREADS") == NULL)
        out[k++] = dt_xstrdup("OPENBLAS_NUM_THREADS=1");
    out[k] = NULL;
    dt_pmix_env_free(env);
    return out;
}

static void free_strv(char **v)
{
    if (v)
        for (char **p = v; *p; p++)
            free(*p);
    free(v);
}

static int spawn_worker(dt_task_t *t, dt_worker_t *w, char **args, dt_emsg_t *em)
{
    int sv[2], rc, fds[2] = { -1, -1 }, mem, slot = -1;
    dt_emsg_t mem_em = { "" };
    dt_memcopy_t copy;

    /* its memory for in-memory checkpoints; without it the worker runs
     * on without them (disk checkpoints stand) */
    mem = dt_memstore_fds(t->mem, w->rank, fds, &mem_em) == 0;
    if (!mem)
        dt_log_warn("gen=%u rank=%d: no memory for in-memory checkpoints: %s", t->gen, w->rank,
                    mem_em.s);
    if (mem && t->mem_resume > 0 &&
        (slot = dt_memstore_find(t->mem, w->rank, t->mem_resume, &copy)) < 0)
        /* the engine says so and exits DT_EXIT_CKPT: the coordinator
         * takes a disk checkpoint instead */
        dt_log_warn("gen=%u rank=%d: no in-memory checkpoint of step %lld here", t->gen, w->rank,
                    (long long)t->mem_resume);
    char **env = build_env(t, w->rank, w->gpu, mem, slot >= 0 ? &copy : NULL, slot, em);

    if (env == NULL)
        return DT_ECOMM;
    if (socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sv) < 0) {
        free_strv(env);
        return dt_emsg_set(em, -errno, "socketpair: %s", strerror(errno));
    }
    int out_fd;
    rank_log_open(t, w, &out_fd);
    uv_stdio_container_t stdio[6] = {
        { .flags = UV_IGNORE },
        { .flags = UV_INHERIT_FD, .data.fd = out_fd >= 0 ? out_fd : 1 },
        { .flags = UV_INHERIT_FD, .data.fd = out_fd >= 0 ? out_fd : 2 },
        { .flags = UV_INHERIT_FD, .data.fd = sv[1] },
        { .flags = mem ? UV_INHERIT_FD : UV_IGNORE, .data.fd = fds[0] },
        { .flags = mem ? UV_INHERIT_FD : UV_IGNORE, .data.fd = fds[1] },
    };
    uv_process_options_t o = {
        .exit_cb = on_exit_cb,
        .file = args[0],
        .args = args,
        .env = env,
        .cwd = t->gen_dir,
        .stdio_count = mem ? 6 : 4,
        .stdio = stdio,
    };
    w->proc.data = w;
    w->chan.data = w;
    w->last_heard_ms = dt_clock_mono_ms();
    rc = uv_spawn(t->loop, &w->proc, &o);
    close(sv[1]);
    if (out_fd >= 0)
        close(out_fd);
    free_strv(env);
    if (rc < 0) {
        close(sv[0]);
        out_close(w);
        /* libuv wants the handle closed even when the spawn failed */
        w->proc_open = 1;
        w->exited = 1;
        uv_close((uv_handle_t *)&w->proc, handle_closed);
        return dt_emsg_set(em, DT_ECOMM, "spawning %s for rank %d: %s", args[0], w->rank,
                           uv_strerror(rc));
    }
    w->proc_open = 1;
    w->pid = w->proc.pid;
    uv_pipe_init(t->loop, &w->chan, 0);
    w->chan_open = 1;
    /* without its channel the worker is told at once (EOF) rather than
     * left to the hang timeout */
    if ((rc = uv_pipe_open(&w->chan, sv[0])) < 0)
        close(sv[0]);
    if (rc < 0 || (rc = uv_read_start((uv_stream_t *)&w->chan, chan_alloc, chan_read)) < 0) {
        dt_log_error("gen=%u rank=%d worker channel: %s; closing it", t->gen, w->rank,
                     uv_strerror(rc));
        chan_close(w);
    }
    /* an unread output pipe would block the worker: closed, it fails
     * with the reason logged here */
    if (w->out_open && !uv_is_closing((uv_handle_t *)&w->out) &&
        (rc = uv_read_start((uv_stream_t *)&w->out, out_alloc, out_read)) < 0) {
        dt_log_error("gen=%u rank=%d output pipe: %s; closing it", t->gen, w->rank,
                     uv_strerror(rc));
        out_close(w);
    }
    dt_log_info("gen=%u rank=%d pid=%d started", t->gen, w->rank, w->proc.pid);
    return 0;
}

/*-- generations ---------------------------------------------------------------*/

static void send_gen_ended(dt_task_t *t, int64_t gen)
{
    dt_wire_agent_ref_t e = { .agent = agent_id(t), .gen = gen };
    send_reliable(t, DT_MSG_GEN_ENDED, dt_wire_gen_ended_encode(&e));
}

/* Rank `rank` of generation gen could not be started here (status 127):
 * reported as its failure, the coordinator decides. */
static void send_start_failed(dt_task_t *t, int64_t gen, int rank, const char *why)
{
    dt_wire_worker_exit_t x = { .agent = agent_id(t), .gen = gen, .rank = rank, .status = 127,
                                .step = -1, .error = why };
    send_reliable(t, DT_MSG_WORKER_EXIT, dt_wire_worker_exit_encode(&x));
}

static void free_workers(dt_task_t *t)
{
    for (int i = 0; i < t->nworkers; i++) {
        dt_uvframe_close(&t->workers[i].rd);
        json_decref(t->workers[i].result);
    }
    free(t->workers);
    t->workers = NULL;
    t->nworkers = 0;
}

/* Every handle of the generation closed: end the namespace, tell the
 * coordinator, and, when stopping, let the loop end. */
static void gen_maybe_ended(dt_task_t *t)
{
    for (int i = 0; i < t->nworkers; i++)
        if (t->workers[i].proc_open || t->workers[i].chan_open || t->workers[i].out_open)
            return;
    if (t->nworkers > 0 || t->gen_dir) {
        uv_timer_stop(&t->grace_timer);
        dt_pmix_gen_end(t->pmix);
        free_workers(t);
        if (!t->ended_sent && t->gen) {
            t->ended_sent = 1;
            send_gen_ended(t, t->gen);
            dt_log_info("gen=%u ended here", t->gen);
        }
        /* the generation's directory (the spec its workers read, their
         * working directory) goes with it, as dtagentd(8) says */
        dt_emsg_t em = { "" };
        if (t->gen_dir && dt_rmtree(t->gen_dir, &em) < 0)
            dt_log_warn("gen=%u: %s", t->gen, em.s);
        free(t->gen_dir);
        t->gen_dir = NULL;
    }
    t->hooks.workers_gone(t->hooks.ud);
}

/* The state letter of /proc/PID/stat (R, S, D, T, t, Z, ...), '?' if unknown. */
static char proc_state(int64_t pid)
{
    char path[64], buf[512];
    snprintf(path, sizeof(path), "/proc/%lld/stat", (long long)pid);
    FILE *f = fopen(path, "r");
    if (f == NULL)
        return '?';
    size_t n = fread(buf, 1, sizeof(buf) - 1, f);
    fclose(f);
    buf[n] = '\0';
    const char *rp = strrchr(buf, ')'); /* the name may hold spaces and parens */
    return rp && rp[1] == ' ' && rp[2] ? rp[2] : '?';
}

static void watch_fire(uv_timer_t *timer)
{
    dt_task_t *t = timer->data;
    int64_t now = dt_clock_mono_ms();

    for (int i = 0; i < t->nworkers; i++) {
        dt_worker_t *w = &t->workers[i];
        /* until its first frame a worker is starting (MPI_Init, its
         * communicator, a wide job's wire-up): the start timeout applies */
        int64_t limit = w->heard || t->conf.start_ms < t->conf.hang_ms ? t->conf.hang_ms
                                                                        : t->conf.start_ms;
        /* while a fence waits on the coordinator (which may be away and
         * restarting), every local rank is inside it and silent through no
         * fault of its own: its silence counts from the fence's end. A rank
         * that hangs elsewhere keeps the others' fence open, and is caught
         * by its own agent's watch. */
        if (t->fences_out > 0 && alive(w))
            w->last_heard_ms = now;
        if (!alive(w) || w->hung || t->aborting || now - w->last_heard_ms <= limit)
            continue;
        char st = proc_state(w->pid);
        dt_log_warn("gen=%u rank=%d pid=%lld silent for %lld ms (%s timeout %lld ms)%s: hung, "
                    "killing it", t->gen, w->rank, (long long)w->pid,
                    (long long)(now - w->last_heard_ms), w->heard ? "hang" : "start",
                    (long long)limit, st == 'T' || st == 't' ? ", stopped by a signal" : "");
        w->hung = st == 'T' || st == 't' ? 2 : 1;
        kill_worker(w, SIGKILL);
    }
}

static int write_spec(const char *path, const char *text, dt_emsg_t *em)
{
    int fd = open(path, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
    if (fd < 0)
        return dt_emsg_set(em, -errno, "%s: %s", path, strerror(errno));
    int rc = dt_write_full(fd, text, strlen(text));
    close(fd);
    return rc < 0 ? dt_emsg_set(em, rc, "%s: write failed", path) : 0;
}

void dt_task_gen_start(dt_task_t *t, const dt_wire_gen_start_t *gs)
{
    dt_emsg_t em = { "" };
    const char *nspace = gs->nspace, *spec = gs->spec;
    int64_t gen = gs->gen;
    int R = (int)gs->ranks, self = -1, rc = 0;
    char **args = NULL, *spec_path = NULL;
    const char **names = NULL;
    int *node_of = NULL;
    size_t nn = gs->nodes.n, na = gs->argv.n;

    enum dt_device device = DT_DEVICE_CPU;
    dt_emsg_t dem = { "" };

    if (gs->procs.n != (size_t)R) {
        dt_log_error("GEN_START gen=%lld: %zu entries in procs for %d ranks: ignored",
                     (long long)gen, gs->procs.n, R);
        return;
    }
    if (gs->device != NULL && dt_device_parse("device", gs->device, &device, &dem) < 0) {
        dt_log_error("GEN_START gen=%lld: %.200s: ignored", (long long)gen, dem.s);
        return;
    }
    bool cuda = device == DT_DEVICE_CUDA;
    if ((uint32_t)gen == t->gen)
        return; /* sent again after a reconnect: already running */
    if (t->nworkers > 0) {
        dt_log_error("GEN_START gen=%lld while gen=%u still has workers: killing them",
                     (long long)gen, t->gen);
        kill_all(t);
    }
    names = dt_xcalloc(nn, sizeof(*names));
    for (size_t i = 0; i < nn; i++) {
        names[i] = gs->nodes.v[i];
        if (strcmp(names[i], t->conf.node) == 0)
            self = (int)i;
    }
    node_of = dt_xcalloc((size_t)R, sizeof(*node_of));
    int mine = 0;
    for (int r = 0; r < R; r++) {
        if (gs->procs.v[r] < 0 || (size_t)gs->procs.v[r] >= nn) {
            rc = -1;
            continue;
        }
        node_of[r] = (int)gs->procs.v[r];
        mine += node_of[r] == self;
    }
    if (rc < 0 || self < 0) {
        dt_log_error("GEN_START gen=%lld: bad node map (this node %s in it: %s)", (long long)gen,
                     t->conf.node, self < 0 ? "no" : "yes");
        goto out;
    }
    replica_to_free(t);
    t->gen = (uint32_t)gen;
    t->mem_resume = gs->mem_resume;
    {
        /* the memory of ranks placed elsewhere now goes back */
        int *here = dt_xcalloc((size_t)(mine > 0 ? mine : 1), sizeof(*here)), k = 0;
        for (int r = 0; r < R; r++)
            if (node_of[r] == self)
                here[k++] = r;
        dt_memstore_keep(t->mem, here, k);
        free(here);
    }
    t->aborting = 0;
    t->fences_out = 0;
    t->ended_sent = 0;
    t->nranks = R;
    /* where each rank's replicas go (the coordinator's choice) */
    if (gs->replica_to.n == (size_t)R) {
        t->replica_to = dt_xcalloc((size_t)R, sizeof(*t->replica_to));
        for (int r = 0; r < R; r++)
            t->replica_to[r] = dt_xstrdup(gs->replica_to.v[r] ? gs->replica_to.v[r] : "");
    }
    free(t->nspace);
    t->nspace = dt_xstrdup(nspace);
    const char *logs = gs->log_dir;
    free(t->log_dir);
    t->log_dir = logs && logs[0] == '/' ? dt_xstrdup(logs) : NULL;
    t->gen_dir = dt_xasprintf(DT_GEN_DIR_FMT, t->conf.state_dir, (long long)gen);
    if (mkdir(t->gen_dir, 0700) < 0 && errno != EEXIST) {
        rc = dt_emsg_set(&em, -errno, "%s: %s", t->gen_dir, strerror(errno));
        goto fail;
    }
    spec_path = dt_xasprintf("%s/job.spec", t->gen_dir);
    if ((rc = write_spec(spec_path, spec, &em)) < 0)
        goto fail;
    dt_pmix_gen_t pg = { .gen = (uint32_t)gen, .nspace = nspace, .nranks = R,
                         .nnodes = (int)nn, .nodes = names, .node_of = node_of,
                         .self = t->conf.node };
    if ((rc = dt_pmix_gen_begin(t->pmix, &pg, &em)) < 0)
        goto fail;
    int ngpus = t->conf.gpus ? t->conf.gpus->n : 0;
    if (cuda && mine > ngpus) {
        /* the coordinator refuses such an agent at registration; this one
         * says so as its ranks' failure, none started */
        rc = dt_emsg_set(&em, DT_EDEVICE, "device = cuda: %d rank%s here for %d GPU%s%s%s", mine,
                         mine == 1 ? "" : "s", ngpus, ngpus == 1 ? "" : "s",
                         ngpus == 0 ? ": " : "", ngpus == 0 && t->conf.gpus ? t->conf.gpus->why
                                                                           : "");
        goto fail;
    }
    args = dt_xcalloc(na + 4, sizeof(*args));
    args[0] = dt_xstrdup(t->conf.engine);
    for (size_t i = 0; i < na; i++)
        args[i + 1] = dt_xstrdup(gs->argv.v[i]);
    args[na + 1] = dt_xstrdup("--spec");
    args[na + 2] = dt_xstrdup(spec_path);
    /* the task keeps them: a rank fetching its copy is spawned later */
    free_strv(t->args);
    t->args = args;
    args = NULL;
    t->workers = dt_xcalloc((size_t)mine, sizeof(*t->workers));
    dt_log_info("gen=%u nspace=%s ranks=%d here=%d starting", t->gen, nspace, R, mine);
    for (int r = 0; r < R; r++) {
        if (node_of[r] != self)
            continue;
        dt_worker_t *w = &t->workers[t->nworkers];
        w->gpu = cuda ? t->nworkers : -1;
        t->nworkers++;
        w->t = t;
        w->rank = r;
        dt_uvframe_init(&w->rd, DT_MSG_MAX);
        /* a rank that moved here resumes from the copy another agent
         * holds: fetched first, spawned when it is here (peer_fetched) */
        const char *from = gs->fetch.n == (size_t)R && gs->fetch.v[r] ? gs->fetch.v[r] : "";
        int fds[2];
        dt_emsg_t fem = { "" };
        if (t->mem_resume > 0 && from[0] && t->peer &&
            dt_memstore_fds(t->mem, r, fds, &fem) == 0) {
            w->fetching = 1;
            w->fetch_slot = 0;
            dt_memstore_clear(t->mem, r, 0);
            dt_log_info("gen=%u rank=%d: fetching its in-memory checkpoint of step %lld from %s",
                        t->gen, r, (long long)t->mem_resume, from);
            dt_peer_fetch(t->peer, from, r, t->mem_resume, fds[0]);
            continue;
        }
        if ((rc = spawn_worker(t, w, t->args, &em)) < 0) {
            dt_log_error("gen=%u: %s", t->gen, em.s);
            send_start_failed(t, t->gen, r, em.s);
            begin_abort(t, r, "a worker could not be started");
            break;
        }
    }
    if (!uv_is_active((uv_handle_t *)&t->watch_timer))
        uv_timer_start(&t->watch_timer, watch_fire, WATCH_MS, WATCH_MS);
    goto out;
fail:
    dt_log_error("gen=%lld cannot start here: %s", (long long)gen, em.s);
    for (int r = 0; r < R; r++)
        if (node_of[r] == self)
            send_start_failed(t, gen, r, em.s);
    gen_maybe_ended(t);
out:
    free_strv(args);
    free(spec_path);
    free(names);
    free(node_of);
}

void dt_task_gen_abort(dt_task_t *t, const dt_wire_gen_abort_t *ga)
{
    int any = 0;

    if ((uint32_t)ga->gen != t->gen)
        return;
    for (int i = 0; i < t->nworkers; i++)
        any |= alive(&t->workers[i]);
    if (!any) {
        /* nothing left here: say so again (the first GEN_ENDED may be the
         * one the coordinator is waiting for) */
        if (!t->nworkers)
            send_gen_ended(t, ga->gen);
        return;
    }
    begin_abort(t, ga->rank >= 0 && ga->rank < t->nranks ? (int)ga->rank : -1,
                ga->reason ? ga->reason : "aborted by the coordinator");
}

void dt_task_fence_done(dt_task_t *t, const dt_wire_fence_done_t *fd)
{
    int64_t gen = fd->gen, seq = fd->seq, status = fd->status;
    const char *data = fd->data;
    size_t n = strlen(data);
    unsigned char *raw = dt_xmalloc(DT_BASE64_DECODED_MAX(n));
    int len = dt_base64_decode(data, n, raw);

    if (len < 0) {
        dt_log_error("gen=%lld fence %lld: data is not base64", (long long)gen, (long long)seq);
        status = -1;
        len = 0;
    }
    if ((uint32_t)gen == t->gen && t->fences_out > 0)
        t->fences_out--;
    if ((uint32_t)gen == t->gen)
        dt_pmix_fence_done(t->pmix, (uint32_t)gen, (uint32_t)seq, (int)status, raw,
                           (size_t)(len > 0 ? len : 0));
    free(raw);
}

static void all_workers(dt_task_t *t, uint16_t type, json_t *body)
{
    for (int i = 0; i < t->nworkers; i++)
        chan_send(&t->workers[i], type, json_incref(body));
    json_decref(body);
}

void dt_task_ckpt_request(dt_task_t *t, int64_t gen)
{
    if ((uint32_t)gen == t->gen)
        all_workers(t, DT_MSG_W_CHECKPOINT, json_object());
}

void dt_task_stop(dt_task_t *t, const dt_wire_stop_t *st)
{
    dt_wire_w_stop_t ws = { .checkpoint = st->checkpoint };
    if ((uint32_t)st->gen == t->gen)
        all_workers(t, DT_MSG_W_STOP, dt_wire_w_stop_encode(&ws));
}

void dt_task_status(const dt_task_t *t, dt_wire_register_t *reg)
{
    reg->ranks.v = dt_xcalloc((size_t)t->nworkers + 1, sizeof(*reg->ranks.v));
    reg->ranks.n = 0;
    for (int i = 0; i < t->nworkers; i++)
        if (alive(&t->workers[i]))
            reg->ranks.v[reg->ranks.n++] = t->workers[i].rank;
    reg->gen = reg->ranks.n ? t->gen : 0;
    reg->peer = t->peer ? dt_peer_addr(t->peer) : NULL;
}

int dt_task_terminate(dt_task_t *t)
{
    int any = 0;
    for (int i = 0; i < t->nworkers; i++)
        if (alive(&t->workers[i])) {
            any = 1;
            kill_worker(&t->workers[i], SIGTERM);
        }
    if (any)
        uv_timer_start(&t->grace_timer, grace_fire, (uint64_t)t->conf.grace_ms, 0);
    return any;
}

/*-- PMIx upcalls -------------------------------------------------------------------*/

static void pm_fence(void *ud, uint32_t gen, uint32_t seq, const void *data, size_t len)
{
    dt_task_t *t = ud;
    char *b64 = dt_base64_encode(data, len);
    if (gen == t->gen)
        t->fences_out++;
    dt_wire_fence_t f = { .agent = agent_id(t), .gen = gen, .seq = seq, .data = b64 };
    t->hooks.send_fence(t->hooks.ud, gen, seq, dt_wire_fence_encode(&f));
    free(b64);
}

static void pm_connected(void *ud, uint32_t gen, int rank)
{
    (void)ud;
    dt_log_debug("gen=%u rank=%d connected to the PMIx server", gen, rank);
}

static void pm_finalized(void *ud, uint32_t gen, int rank)
{
    (void)ud;
    dt_log_debug("gen=%u rank=%d finalized", gen, rank);
}

static void pm_aborted(void *ud, uint32_t gen, int rank, int status, const char *msg)
{
    (void)ud;
    dt_log_warn("gen=%u rank=%d called abort (status %d): %s", gen, rank, status,
                msg ? msg : "");
}

/*-- the peer channel's upcalls (agent/peer.h) ---------------------------------------*/

static int peer_sink(void *ud, int rank, int *slot)
{
    dt_task_t *t = ud;
    dt_emsg_t em = { "" };

    /* replicas of this generation's ranks only: the memory stays bounded */
    if (rank < 0 || rank >= t->nranks)
        return -1;
    int fd = dt_memstore_replica_sink(t->mem, rank, slot, &em);
    if (fd < 0)
        dt_log_warn("gen=%u rank=%d: no memory for a replica: %s", t->gen, rank, em.s);
    return fd;
}

static void peer_received(void *ud, int rank, int slot, int64_t step, int64_t bytes,
                          const char *sha256)
{
    dt_task_t *t = ud;

    dt_memstore_replica_set(t->mem, rank, slot, step, bytes, sha256);
    dt_wire_mem_ckpt_t mc = { .agent = agent_id(t), .gen = t->gen, .rank = rank, .step = step,
                              .bytes = bytes, .sha256 = sha256, .replica = true };
    t->hooks.send(t->hooks.ud, DT_MSG_MEM_CKPT, dt_wire_mem_ckpt_encode(&mc));
}

static int peer_lookup(void *ud, int rank, int64_t step, int64_t *bytes, char sha256[65])
{
    dt_task_t *t = ud;
    return dt_memstore_lookup(t->mem, rank, step, bytes, sha256);
}

static void peer_fetched(void *ud, int rank, int64_t step, int ok, int64_t bytes,
                         const char *sha256, const char *why)
{
    dt_task_t *t = ud;
    dt_emsg_t em = { "" };
    dt_worker_t *w = NULL;

    for (int i = 0; i < t->nworkers; i++)
        if (t->workers[i].rank == rank && t->workers[i].fetching)
            w = &t->workers[i];
    if (w == NULL || step != t->mem_resume || t->aborting)
        return; /* its generation is over */
    w->fetching = 0;
    if (ok) {
        dt_memstore_set(t->mem, rank, w->fetch_slot, step, bytes, sha256);
        dt_log_info("gen=%u rank=%d: its in-memory checkpoint of step %lld fetched (%lld bytes)",
                    t->gen, rank, (long long)step, (long long)bytes);
    } else {
        /* started without it: it exits DT_EXIT_CKPT and the coordinator
         * takes a disk checkpoint */
        dt_log_warn("gen=%u rank=%d: fetching its in-memory checkpoint of step %lld failed: %s",
                    t->gen, rank, (long long)step, why);
    }
    if (spawn_worker(t, w, t->args, &em) < 0) {
        dt_log_error("gen=%u: %s", t->gen, em.s);
        send_start_failed(t, t->gen, rank, em.s);
        begin_abort(t, rank, "a worker could not be started");
    }
}

static void peer_send_failed(void *ud, int rank, int64_t step, const char *why)
{
    dt_task_t *t = ud;
    dt_wire_mem_ckpt_t mc = { .agent = agent_id(t), .gen = t->gen, .rank = rank, .step = step,
                              .sha256 = "0000000000000000000000000000000000000000000000000000000000000000",
                              .error = why };
    t->hooks.send(t->hooks.ud, DT_MSG_MEM_CKPT, dt_wire_mem_ckpt_encode(&mc));
}

static void replica_to_free(dt_task_t *t)
{
    if (t->replica_to)
        for (int r = 0; r < t->nranks; r++)
            free(t->replica_to[r]);
    free(t->replica_to);
    t->replica_to = NULL;
}

int dt_task_new(uv_loop_t *loop, const dt_task_conf_t *conf, const dt_agentd_hooks_t *hooks,
                dt_task_t **out, dt_emsg_t *em)
{
    static const dt_pmix_ops_t ops = {
        .fence = pm_fence,
        .connected = pm_connected,
        .finalized = pm_finalized,
        .aborted = pm_aborted,
    };
    dt_task_t *t = dt_xcalloc(1, sizeof(*t));
    char *tmp = dt_xasprintf("%s/pmix", conf->state_dir);
    int rc;

    *out = NULL;
    t->loop = loop;
    t->conf = *conf;
    t->hooks = *hooks;
    rc = dt_pmix_new(loop, tmp, &ops, t, &t->pmix, em);
    free(tmp);
    if (rc < 0) {
        free(t);
        return rc;
    }
    t->mem = dt_memstore_new(conf->job);
    if (conf->peer_listen) {
        static const dt_peer_hooks_t ph_tmpl = { 0 };
        dt_peer_hooks_t ph = ph_tmpl;
        dt_emsg_t pem = { "" };
        ph.ud = t;
        ph.sink = peer_sink;
        ph.received = peer_received;
        ph.lookup = peer_lookup;
        ph.fetched = peer_fetched;
        ph.send_failed = peer_send_failed;
        /* without it, no replicas: the copies stay here only */
        if (dt_peer_new(loop, conf->job, conf->peer_listen, conf->node, conf->munge_socket, &ph,
                        &t->peer, &pem) < 0) {
            dt_log_error("%s: no in-memory checkpoint replicas from or to this agent", pem.s);
            t->peer_failed = t->peer;
            t->peer = NULL;
        }
    }
    uv_timer_init(loop, &t->watch_timer);
    uv_timer_init(loop, &t->grace_timer);
    t->watch_timer.data = t;
    t->grace_timer.data = t;
    *out = t;
    return 0;
}

int dt_task_busy(const dt_task_t *t)
{
    for (int i = 0; i < t->nworkers; i++)
        if (t->workers[i].proc_open || t->workers[i].chan_open)
            return 1;
    return 0;
}

void dt_task_close(dt_task_t *t)
{
    uv_timer_stop(&t->watch_timer);
    uv_timer_stop(&t->grace_timer);
    if (!uv_is_closing((uv_handle_t *)&t->watch_timer))
        uv_close((uv_handle_t *)&t->watch_timer, NULL);
    if (!uv_is_closing((uv_handle_t *)&t->grace_timer))
        uv_close((uv_handle_t *)&t->grace_timer, NULL);
    dt_pmix_free(t->pmix);
    t->pmix = NULL;
    dt_peer_close(t->peer);
    free(t->nspace);
    t->nspace = NULL;
    free(t->log_dir);
    t->log_dir = NULL;
}

void dt_task_free(dt_task_t *t)
{
    if (t == NULL)
        return;
    free_workers(t);
    replica_to_free(t);
    free_strv(t->args);
    dt_peer_free(t->peer);
    dt_peer_free(t->peer_failed);
    dt_memstore_free(t->mem);
    free(t->gen_dir);
    free(t);
}
