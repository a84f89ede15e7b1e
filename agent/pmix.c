/* SPDX-License-Identifier: MIT
 *
 * dtagentd's embedded PMIx server, to the contract in agent/pmix.h: one
 * libpmix server per process, one namespace per generation, the host module
 * that hands libpmix's upcalls to the event loop, fences relayed through the
 * agent, failure events for the survivors of a dead rank. It is not a
 * launcher (agent/task.c spawns), not a coordinator client and holds no
 * policy: it never kills anything.
 *
 * Who runs where:
 *  - libpmix's progress thread calls the host module (up_* below). Those
 *    copy what they need into an upcall_t, append it to a queue under `mu`
 *    and uv_async_send; they touch nothing else. direct_modex answers
 *    PMIX_ERR_NOT_SUPPORTED at once (all data travel with the fences).
 *  - The loop thread drains the queue (on_async), calls the agent's ops and
 *    then the libpmix cbfunc of the upcall (libpmix's callbacks are
 *    thread-safe: they thread-shift into its own thread). Fence timeouts are
 *    a uv_timer on the loop thread. Every public function runs there.
 *  - Server calls that complete through a callback (register_nspace,
 *    setup_local_support, register_client, deregister_nspace) are made on
 *    the loop thread, which then waits on a condition variable that the
 *    callback, on libpmix's thread, signals. libpmix never waits for the
 *    loop, so this cannot deadlock; a wait longer than DT_PMIX_CB_TIMEOUT_MS
 *    is an error (the waiter is then left to the late callback).
 *  - The release function handed over with fence data, and the completion
 *    of PMIx_Notify_event, run on libpmix's thread and only free memory.
 *
 * The module's two handles are unreferenced: it never keeps the loop alive
 * by itself (the workers' handles do). The memory of a dt_pmix_t is
 * released in their close callbacks, so dt_pmix_free wants the loop to run
 * once more.
 *
 * Other users of the host: libpmix listens on TCP 127.0.0.1 and, over TCP,
 * its "native" security believes the uid a client sends. The process-wide
 * accept(2) that closes a connection whose socket belongs to another user
 * before libpmix reads a byte of it is agent/accept_gate.c, linked beside
 * this file; here, the server's directory is checked to be ours (files
 * below). PMIx_server_finalize runs on a helper thread
 * with a deadline: a libpmix that does not come back (seen: a progress
 * thread blocked in a handshake read, a finalize that locked a freed mutex
 * after a refused client) is left behind and the process must leave with
 * _exit (dt_pmix_abandoned).
 */
#include "config.h"

#include <errno.h>
#include <limits.h>
#include <pmix.h>
#include <pmix_server.h>
#include <pthread.h>
#include <signal.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "agent/pmix.h"
#include "common/clock.h"
#include "common/fileio.h"
#include "common/log.h"
#include "common/mem.h"

extern char **environ;

/* ---- upcalls and fences ------------------------------------------------ */

enum { UP_CONNECTED, UP_FINALIZED, UP_ABORT, UP_FENCE };

/* One host-module call, copied on libpmix's thread for the loop thread. */
typedef struct upcall {
    struct upcall *next;
    int kind;
    pmix_proc_t proc; /* the client, or a fence's first participant */
    int status;       /* UP_ABORT */
    char *msg;        /* UP_ABORT, may be NULL */
    char *data;       /* UP_FENCE: our copy of the local contribution */
    size_t len;
    pmix_op_cbfunc_t opcb;
    pmix_modex_cbfunc_t modexcb;
    void *cbdata;
} upcall_t;

/* A fence handed to ops->fence and not yet answered. */
typedef struct fence {
    struct fence *next;
    uint32_t seq;
    uint64_t deadline; /* uv_now() ms */
    pmix_modex_cbfunc_t cb;
    void *cbdata;
} fence_t;

struct dt_pmix {
    uv_loop_t *loop;
    int64_t fence_timeout_ms;
    dt_pmix_ops_t ops;
    void *ud;
    char *tmpdir;
    uv_async_t async;
    uv_timer_t timer;
    int nclosed;
    int finalized; /* PMIx_server_finalize done: call no cbfunc any more */

    pthread_mutex_t mu; /* guards the queue and `closed` */
    int closed;         /* the async handle is closing: queue nothing more */
    upcall_t *qhead;
    upcall_t **qtail;

    /* the current generation (active) */
    int active;
    uint32_t gen;
    char nspace[PMIX_MAX_NSLEN + 1];
    int nranks;
    int multinode;
    char *dir;                 /* tmpdir/gen.<nspace>: vader segments */
    char *self;                /* this node's name in the node map */
    unsigned char *local;      /* [nranks] hosted here */
    unsigned char *registered; /* [nranks] PMIx_server_register_client done */
    uint32_t fence_seq;
    fence_t *fences; /* arrival order, so deadlines ascend */
};

/* libpmix's server is process-wide and its host module has no user data:
 * the upcalls find the one dt_pmix_t here. Set before PMIx_server_init,
 * cleared after PMIx_server_finalize (never, when finalize was abandoned:
 * then the dt_pmix_t stays allocated for libpmix's late upcalls). */
static dt_pmix_t *the_server;

/* PMIx_server_finalize did not return in time (dt_pmix_abandoned). */
static int abandoned;

/* ---- PMIx status -> DT_E* (the one translation) ---------------------------- */

static int pmix_to_dt(pmix_status_t st)
{
    switch (st) {
    case PMIX_SUCCESS:
    case PMIX_OPERATION_SUCCEEDED:
        return 0;
    case PMIX_ERR_NOMEM:
        return DT_ENOMEM;
    case PMIX_ERR_TIMEOUT:
        return DT_ETIMEDOUT;
    case PMIX_ERR_NOT_SUPPORTED:
        return DT_ENOTSUP;
    case PMIX_ERR_BAD_PARAM:
        return DT_EINVAL;
    case PMIX_ERR_NOT_FOUND:
        return DT_ENOENT;
    case PMIX_ERR_NO_PERMISSIONS:
        return DT_EPERM;
    case PMIX_ERR_INIT:
        return DT_ESTATE;
    default:
        return DT_ECOMM;
    }
}

static int pmix_fail(dt_emsg_t *em, pmix_status_t st, const char *what)
{
    return dt_emsg_set(em, pmix_to_dt(st), "%s: %s", what, PMIx_Error_string(st));
}

/* ---- waiting on the loop thread for a libpmix op callback ------------------ */

typedef struct waiter {
    pthread_mutex_t mu;
    pthread_cond_t cv;
    int refs; /* the waiting thread and the callback */
    int done;
    pmix_status_t status;
} waiter_t;

static waiter_t *waiter_new(void)
{
    waiter_t *w = dt_xcalloc(1, sizeof(*w));
    pthread_condattr_t ca;

    pthread_mutex_init(&w->mu, NULL);
    pthread_condattr_init(&ca);
    pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
    pthread_cond_init(&w->cv, &ca);
    pthread_condattr_destroy(&ca);
    w->refs = 2;
    return w;
}

static void waiter_unref(waiter_t *w, int n)
{
    pthread_mutex_lock(&w->mu);
    w->refs -= n;
    int left = w->refs;
    pthread_mutex_unlock(&w->mu);
    if (left == 0) {
        pthread_cond_destroy(&w->cv);
        pthread_mutex_destroy(&w->mu);
        free(w);
    }
}

/* pmix_op_cbfunc_t, on libpmix's thread */
static void waiter_cb(pmix_status_t st, void *cbdata)
{
    waiter_t *w = cbdata;

    pthread_mutex_lock(&w->mu);
    w->status = st;
    w->done = 1;
    pthread_cond_signal(&w->cv);
    pthread_mutex_unlock(&w->mu);
    waiter_unref(w, 1);
}

/* rc is what the non-blocking call returned: anything but PMIX_SUCCESS
 * means its callback will not come. Returns 0 or a DT_E* code. */
static int waiter_wait(waiter_t *w, pmix_status_t rc, const char *what, dt_emsg_t *em)
{
    struct timespec until;
    int timedout = 0;
    pmix_status_t st;

    if (rc != PMIX_SUCCESS) {
        waiter_unref(w, 2);
        return rc == PMIX_OPERATION_SUCCEEDED ? 0 : pmix_fail(em, rc, what);
    }
    dt_clock_deadline(&until, DT_PMIX_CB_TIMEOUT_MS);
    pthread_mutex_lock(&w->mu);
    while (!w->done && !timedout)
        timedout = pthread_cond_timedwait(&w->cv, &w->mu, &until) == ETIMEDOUT;
    timedout = !w->done;
    st = w->status;
    pthread_mutex_unlock(&w->mu);
    waiter_unref(w, 1);
    if (timedout)
        return dt_emsg_set(em, DT_ETIMEDOUT, "%s: libpmix did not answer in %d ms", what,
                           DT_PMIX_CB_TIMEOUT_MS);
    return st == PMIX_SUCCESS ? 0 : pmix_fail(em, st, what);
}

/* ---- the host module: libpmix's thread --------------------------------- */

static int proc_rank(const pmix_proc_t *proc)
{
    return proc->rank > (pmix_rank_t)INT_MAX ? -1 : (int)proc->rank;
}

static upcall_t *upcall_new(int kind, const pmix_proc_t *proc)
{
    upcall_t *u = dt_xcalloc(1, sizeof(*u));

    u->kind = kind;
    if (proc)
        PMIX_LOAD_PROCID(&u->proc, proc->nspace, proc->rank);
    else
        PMIX_LOAD_PROCID(&u->proc, "", PMIX_RANK_UNDEF);
    return u;
}

static void upcall_free(upcall_t *u)
{
    free(u->msg);
    free(u->data);
    free(u);
}

/* Queue u for the loop thread; PMIX_SUCCESS promises libpmix its cbfunc. */
static pmix_status_t enqueue(upcall_t *u)
{
    dt_pmix_t *p = the_server;

    if (p == NULL) {
        upcall_free(u);
        return PMIX_ERR_INIT;
    }
    pthread_mutex_lock(&p->mu);
    if (p->closed) {
        /* dt_pmix_free closed the async handle: nobody will answer */
        pthread_mutex_unlock(&p->mu);
        upcall_free(u);
        return PMIX_ERR_INIT;
    }
    *p->qtail = u;
    p->qtail = &u->next;
    /* under mu: dt_pmix_free closes the handle only after setting closed */
    uv_async_send(&p->async);
    pthread_mutex_unlock(&p->mu);
    return PMIX_SUCCESS;
}

static pmix_status_t up_connected(const pmix_proc_t *proc, void *server_object,
                                  pmix_op_cbfunc_t cbfunc, void *cbdata)
{
    upcall_t *u = upcall_new(UP_CONNECTED, proc);

    u->opcb = cbfunc;
    u->cbdata = cbdata;
    return enqueue(u);
}

static pmix_status_t up_finalized(const pmix_proc_t *proc, void *server_object,
                                  pmix_op_cbfunc_t cbfunc, void *cbdata)
{
    upcall_t *u = upcall_new(UP_FINALIZED, proc);

    u->opcb = cbfunc;
    u->cbdata = cbdata;
    return enqueue(u);
}

static pmix_status_t up_abort(const pmix_proc_t *proc, void *server_object, int status,
                              const char msg[], pmix_proc_t procs[], size_t nprocs,
                              pmix_op_cbfunc_t cbfunc, void *cbdata)
{
    upcall_t *u = upcall_new(UP_ABORT, proc);

    u->status = status;
    u->msg = msg ? dt_xstrdup(msg) : NULL;
    u->opcb = cbfunc;
    u->cbdata = cbdata;
    return enqueue(u);
}

static pmix_status_t up_fence(const pmix_proc_t procs[], size_t nprocs, const pmix_info_t info[],
                              size_t ninfo, char *data, size_t ndata, pmix_modex_cbfunc_t cbfunc,
                              void *cbdata)
{
    upcall_t *u = upcall_new(UP_FENCE, nprocs > 0 ? &procs[0] : NULL);

    /* data belongs to libpmix and is gone when we return */
    if (data && ndata > 0) {
        u->data = dt_xmalloc(ndata);
        memcpy(u->data, data, ndata);
        u->len = ndata;
    }
    u->modexcb = cbfunc;
    u->cbdata = cbdata;
    return enqueue(u);
}

static pmix_status_t up_dmodex(const pmix_proc_t *proc, const pmix_info_t info[], size_t ninfo,
                               pmix_modex_cbfunc_t cbfunc, void *cbdata)
{
    return PMIX_ERR_NOT_SUPPORTED;
}

static pmix_server_module_t host_module = {
    .client_connected = up_connected,
    .client_finalized = up_finalized,
    .abort = up_abort,
    .fence_nb = up_fence,
    .direct_modex = up_dmodex,
};

/* ---- the loop thread: upcalls and fences ----------------------------------- */

/* pmix_release_cbfunc_t for fence data we hand to libpmix */
static void release_free(void *cbdata)
{
    free(cbdata);
}

static void fence_fail(fence_t *f, pmix_status_t st)
{
    f->cb(st, NULL, 0, f->cbdata, NULL, NULL);
    free(f);
}

static void on_timer(uv_timer_t *t)
{
    dt_pmix_t *p = t->data;
    uint64_t now = uv_now(p->loop);

    while (p->fences && p->fences->deadline <= now) {
        fence_t *f = p->fences;
        p->fences = f->next;
        dt_log_error("gen=%u fence seq=%u not completed in %lld ms: failing it", p->gen, f->seq,
                     (long long)p->fence_timeout_ms);
        fence_fail(f, PMIX_ERR_TIMEOUT);
    }
    if (p->fences)
        uv_timer_start(&p->timer, on_timer, p->fences->deadline - now, 0);
}

static int is_current(dt_pmix_t *p, const pmix_proc_t *proc)
{
    return p->active && PMIX_CHECK_NSPACE(proc->nspace, p->nspace);
}

static void handle_fence(dt_pmix_t *p, upcall_t *u)
{
    if (!is_current(p, &u->proc)) {
        dt_log_warn("fence from nspace=%s, not the current generation's: failing it",
                    u->proc.nspace);
        u->modexcb(PMIX_ERR_NOT_FOUND, NULL, 0, u->cbdata, NULL, NULL);
        return;
    }
    fence_t *f = dt_xcalloc(1, sizeof(*f));
    fence_t **pp = &p->fences;
    uint32_t gen = p->gen;

    f->seq = ++p->fence_seq;
    f->deadline = uv_now(p->loop) + (uint64_t)p->fence_timeout_ms;
    f->cb = u->modexcb;
    f->cbdata = u->cbdata;
    while (*pp)
        pp = &(*pp)->next;
    *pp = f;
    if (!uv_is_active((uv_handle_t *)&p->timer))
        uv_timer_start(&p->timer, on_timer, (uint64_t)p->fence_timeout_ms, 0);
    dt_log_debug("gen=%u fence seq=%u bytes=%zu", gen, f->seq, u->len);
    /* either may answer at once, and f with it */
    if (p->ops.fence)
        p->ops.fence(p->ud, gen, f->seq, u->data, u->len);
    else
        dt_pmix_fence_done(p, gen, f->seq, 0, u->data, u->len);
}

static void handle(dt_pmix_t *p, upcall_t *u)
{
    int cur = is_current(p, &u->proc);
    int rank = proc_rank(&u->proc);
    pmix_status_t st = PMIX_SUCCESS;

    switch (u->kind) {
    case UP_FENCE:
        handle_fence(p, u);
        return;
    case UP_CONNECTED:
        if (!cur) {
            dt_log_warn("client %s:%d connected outside the current generation: refused",
                        u->proc.nspace, rank);
            st = PMIX_ERR_NOT_FOUND;
        } else if (p->ops.connected) {
            p->ops.connected(p->ud, p->gen, rank);
        }
        break;
    case UP_FINALIZED:
        if (cur && p->ops.finalized)
            p->ops.finalized(p->ud, p->gen, rank);
        break;
    case UP_ABORT:
        if (cur && p->ops.aborted)
            p->ops.aborted(p->ud, p->gen, rank, u->status, u->msg);
        else if (!cur)
            dt_log_warn("client %s:%d of no current generation called abort (status %d)",
                        u->proc.nspace, rank, u->status);
        break;
    }
    /* the ops may have freed us (finalize done): then libpmix is gone */
    if (u->opcb && !p->finalized)
        u->opcb(st, u->cbdata);
}

static upcall_t *dequeue(dt_pmix_t *p)
{
    pthread_mutex_lock(&p->mu);
    upcall_t *u = p->qhead;
    if (u) {
        p->qhead = u->next;
        if (p->qhead == NULL)
            p->qtail = &p->qhead;
    }
    pthread_mutex_unlock(&p->mu);
    return u;
}

static void on_async(uv_async_t *a)
{
    dt_pmix_t *p = a->data;
    upcall_t *u;

    /* one at a time: an op may end the generation or free p */
    while (!p->finalized && (u = dequeue(p)) != NULL) {
        handle(p, u);
        upcall_free(u);
    }
}

void dt_pmix_fence_done(dt_pmix_t *p, uint32_t gen, uint32_t seq, int status, const void *data,
                        size_t len)
{
    fence_t **pp, *f;

    if (p == NULL || !p->active || gen != p->gen || p->finalized) {
        dt_log_debug("fence gen=%u seq=%u: not of the current generation, ignored", gen, seq);
        return;
    }
    for (pp = &p->fences; *pp && (*pp)->seq != seq; pp = &(*pp)->next)
        ;
    if ((f = *pp) == NULL) {
        dt_log_debug("gen=%u fence seq=%u: unknown or already answered, ignored", gen, seq);
        return;
    }
    *pp = f->next;
    if (p->fences == NULL)
        uv_timer_stop(&p->timer);
    if (status != 0) {
        dt_log_warn("gen=%u fence seq=%u failed (status %d)", gen, seq, status);
        fence_fail(f, PMIX_ERROR);
        return;
    }
    char *copy = NULL;
    if (len > 0) {
        copy = dt_xmalloc(len);
        memcpy(copy, data, len);
    }
    f->cb(PMIX_SUCCESS, copy, len, f->cbdata, copy ? release_free : NULL, copy);
    free(f);
}

/* ---- files ------------------------------------------------------------------ */

/* rm -rf PATH; a failure is logged (what is left is in the agent's own
 * temp directory, and only costs space). */
static void rm_tree(const char *path)
{
    dt_emsg_t em = { "" };

    if (dt_rmtree(path, &em) < 0)
        dt_log_warn("%s", em.s);
}

/* The server's directory and every directory above it: only we (or root)
 * may change them, else another user could swap the directory the workers'
 * files go to. The directory itself must be ours; it is made 0700. */
static int dir_private(const char *path, dt_emsg_t *em)
{
    uid_t me = geteuid();
    char *real = realpath(path, NULL);
    struct stat st;
    int rc = 0;

    if (real == NULL)
        return dt_emsg_set(em, dt_err_errno(errno), "%s: %s", path, strerror(errno));
    for (char *s = real;; s++) {
        if (*s != '/' && *s != '\0')
            continue;
        char c = *s;
        *s = '\0';
        const char *dir = s == real ? "/" : real;
        if (lstat(dir, &st) < 0) {
            rc = dt_emsg_set(em, dt_err_errno(errno), "%s: %s", dir, strerror(errno));
            break;
        }
        if (st.st_uid != me && (st.st_uid != 0 || c == '\0')) {
            rc = dt_emsg_set(em, DT_EPERM,
                             "PMIx server directory %s: %s is owned by uid %u, not by uid %u", path,
                             dir, (unsigned)st.st_uid, (unsigned)me);
            break;
        }
        if ((st.st_mode & (S_IWGRP | S_IWOTH)) && !(st.st_mode & S_ISVTX) && c != '\0') {
            rc = dt_emsg_set(em, DT_EPERM,
                             "PMIx server directory %s: %s is writable by other users (mode %03o)",
                             path, dir, (unsigned)(st.st_mode & 07777));
            break;
        }
        *s = c;
        if (c == '\0')
            break;
    }
    if (rc == 0 && (st.st_mode & 077) && chmod(real, 0700) < 0)
        rc = dt_emsg_set(em, dt_err_errno(errno), "%s: chmod 0700: %s", real, strerror(errno));
    free(real);
    return rc;
}

/* ---- server ---------------------------------------------------------------- */

static void handle_closed(uv_handle_t *h)
{
    dt_pmix_t *p = h->data;

    if (++p->nclosed < 2 || p == the_server) /* abandoned: libpmix may still call */
        return;
    pthread_mutex_destroy(&p->mu);
    free(p->tmpdir);
    free(p);
}

int dt_pmix_new(uv_loop_t *loop, const char *tmpdir, const dt_pmix_ops_t *ops, void *ud,
                dt_pmix_t **out, dt_emsg_t *em)
{
    pmix_info_t info[5];
    bool no = false;
    pmix_status_t st;
    dt_pmix_t *p;
    int rc;

    *out = NULL;
    if (loop == NULL || tmpdir == NULL || tmpdir[0] == '\0')
        return dt_emsg_set(em, DT_EINVAL, "PMIx server: no loop or no directory");
    if (the_server)
        return dt_emsg_set(em, DT_ESTATE, "PMIx server: already running in this process");
    if ((rc = dt_mkdirs_checked(tmpdir, 0700, em)) < 0 || (rc = dir_private(tmpdir, em)) < 0)
        return rc;
    /* the shared-memory store deadlocked libpmix's thread on a bad
     * registration; the hash store is all a few local ranks need */
    setenv("PMIX_MCA_gds", "hash", 1);

    p = dt_xcalloc(1, sizeof(*p));
    p->loop = loop;
    p->fence_timeout_ms = DT_PMIX_FENCE_TIMEOUT_MS;
    if (ops)
        p->ops = *ops;
    p->ud = ud;
    p->tmpdir = dt_xstrdup(tmpdir);
    pthread_mutex_init(&p->mu, NULL);
    p->qtail = &p->qhead;

    PMIx_Info_load(&info[0], PMIX_SERVER_TMPDIR, tmpdir, PMIX_STRING);
    PMIx_Info_load(&info[1], PMIX_SYSTEM_TMPDIR, tmpdir, PMIX_STRING);
    PMIx_Info_load(&info[2], PMIX_SERVER_REMOTE_CONNECTIONS, &no, PMIX_BOOL);
    PMIx_Info_load(&info[3], PMIX_SERVER_SYSTEM_SUPPORT, &no, PMIX_BOOL);
    PMIx_Info_load(&info[4], PMIX_SERVER_TOOL_SUPPORT, &no, PMIX_BOOL);
    the_server = p;
    st = PMIx_server_init(&host_module, info, 5);
    for (size_t i = 0; i < 5; i++)
        PMIX_INFO_DESTRUCT(&info[i]);
    if (st != PMIX_SUCCESS) {
        the_server = NULL;
        rc = pmix_fail(em, st, "PMIx_server_init");
        pthread_mutex_destroy(&p->mu);
        free(p->tmpdir);
        free(p);
        return rc;
    }
    uv_async_init(loop, &p->async, on_async);
    uv_timer_init(loop, &p->timer);
    p->async.data = p;
    p->timer.data = p;
    uv_unref((uv_handle_t *)&p->async);
    uv_unref((uv_handle_t *)&p->timer);
    dt_log_debug("pmix server up: libpmix %s, files in %s", PMIx_Get_version(), tmpdir);
    *out = p;
    return 0;
}

/* PMIx_server_finalize on its own thread, so that the caller can stop
 * waiting. Process-wide like libpmix's server; a thread left behind keeps
 * using it. */
static struct {
    pthread_mutex_t mu;
    pthread_cond_t cv;
    int done;
    pmix_status_t st;
} fin = { .mu = PTHREAD_MUTEX_INITIALIZER };

static void *finalize_main(void *arg)
{
    pmix_status_t st = PMIx_server_finalize();

    pthread_mutex_lock(&fin.mu);
    fin.st = st;
    fin.done = 1;
    pthread_cond_signal(&fin.cv);
    pthread_mutex_unlock(&fin.mu);
    return NULL;
}

/* 0 once PMIx_server_finalize returned, DT_ETIMEDOUT when it did not
 * within ms (it is then left running), another DT_E* code when no thread
 * could be started (then it was called here). */
static int finalize_within(int64_t ms)
{
    pthread_condattr_t ca;
    pthread_t t;
    sigset_t all, old;
    struct timespec until;
    int rc;

    pthread_condattr_init(&ca);
    pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
    pthread_cond_init(&fin.cv, &ca);
    pthread_condattr_destroy(&ca);
    fin.done = 0;
    /* no signal for the helper: the loop thread takes them */
    sigfillset(&all);
    pthread_sigmask(SIG_SETMASK, &all, &old);
    rc = pthread_create(&t, NULL, finalize_main, NULL);
    pthread_sigmask(SIG_SETMASK, &old, NULL);
    if (rc != 0) {
        dt_log_warn("PMIx server: no thread for PMIx_server_finalize (%s): calling it here",
                    strerror(rc));
        PMIx_server_finalize();
        return dt_err_errno(rc);
    }
    dt_clock_deadline(&until, ms);
    pthread_mutex_lock(&fin.mu);
    while (!fin.done && pthread_cond_timedwait(&fin.cv, &fin.mu, &until) != ETIMEDOUT)
        ;
    int done = fin.done;
    pthread_mutex_unlock(&fin.mu);
    if (!done) {
        pthread_detach(t);
        return DT_ETIMEDOUT;
    }
    pthread_join(t, NULL);
    pthread_cond_destroy(&fin.cv);
    if (fin.st != PMIX_SUCCESS)
        dt_log_warn("PMIx_server_finalize: %s", PMIx_Error_string(fin.st));
    return 0;
}

void dt_pmix_free(dt_pmix_t *p)
{
    upcall_t *u;

    if (p == NULL)
        return;
    dt_pmix_gen_end(p);
    /* answer what is still queued while libpmix can take it */
    while ((u = dequeue(p)) != NULL) {
        if (u->modexcb)
            u->modexcb(PMIX_ERR_NOT_FOUND, NULL, 0, u->cbdata, NULL, NULL);
        else if (u->opcb)
            u->opcb(PMIX_SUCCESS, u->cbdata);
        upcall_free(u);
    }
    if (finalize_within(DT_PMIX_FINALIZE_TIMEOUT_MS) == DT_ETIMEDOUT) {
        dt_log_error("PMIx_server_finalize did not return in %d ms: leaving libpmix behind",
                     DT_PMIX_FINALIZE_TIMEOUT_MS);
        abandoned = 1;
    } else {
        the_server = NULL;
    }
    p->finalized = 1;
    /* a late upcall from a libpmix left behind finds p closed */
    pthread_mutex_lock(&p->mu);
    p->closed = 1;
    pthread_mutex_unlock(&p->mu);
    while ((u = dequeue(p)) != NULL)
        upcall_free(u);
    uv_timer_stop(&p->timer);
    uv_close((uv_handle_t *)&p->async, handle_closed);
    uv_close((uv_handle_t *)&p->timer, handle_closed);
}

int dt_pmix_abandoned(void)
{
    return abandoned;
}

/* ---- generations -------------------------------------------------------- */

/* Names that go into comma/semicolon lists and file names. */
static int name_ok(const char *s, size_t max)
{
    size_t n = 0;

    if (s == NULL || s[0] == '\0' || s[0] == '.')
        return 0;
    for (; s[n]; n++) {
        char c = s[n];
        if (!((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') ||
              c == '.' || c == '-' || c == '_'))
            return 0;
    }
    return n <= max;
}

static int check_gen(const dt_pmix_gen_t *g, int *self, dt_emsg_t *em)
{
    if (g == NULL || g->nodes == NULL || g->node_of == NULL)
        return dt_emsg_set(em, DT_EINVAL, "generation: no layout");
    if (g->gen == 0)
        return dt_emsg_set(em, DT_EINVAL, "generation: gen must be 1 or more");
    if (!name_ok(g->nspace, PMIX_MAX_NSLEN))
        return dt_emsg_set(em, DT_EINVAL,
                           "gen=%u: namespace \"%s\" is not 1 to %d of [A-Za-z0-9._-]", g->gen,
                           g->nspace ? g->nspace : "(null)", PMIX_MAX_NSLEN);
    if (g->nranks < 1 || g->nranks > 1 << 20)
        return dt_emsg_set(em, DT_EINVAL, "gen=%u: %d ranks (1 to %d)", g->gen, g->nranks, 1 << 20);
    if (g->nnodes < 1 || g->nnodes > g->nranks)
        return dt_emsg_set(em, DT_EINVAL, "gen=%u: %d nodes for %d ranks", g->gen, g->nnodes,
                           g->nranks);
    *self = -1;
    for (int i = 0; i < g->nnodes; i++) {
        if (!name_ok(g->nodes[i], 255))
            return dt_emsg_set(em, DT_EINVAL, "gen=%u: node name \"%s\" is not [A-Za-z0-9._-]",
                               g->gen, g->nodes[i] ? g->nodes[i] : "(null)");
        for (int j = 0; j < i; j++)
            if (strcmp(g->nodes[i], g->nodes[j]) == 0)
                return dt_emsg_set(em, DT_EINVAL, "gen=%u: node %s listed twice", g->gen,
                                   g->nodes[i]);
        if (g->self && strcmp(g->nodes[i], g->self) == 0)
            *self = i;
    }
    if (*self < 0)
        return dt_emsg_set(em, DT_EINVAL, "gen=%u: this node (%s) is not among the job's nodes",
                           g->gen, g->self ? g->self : "(null)");
    for (int r = 0; r < g->nranks; r++)
        if (g->node_of[r] < 0 || g->node_of[r] >= g->nnodes)
            return dt_emsg_set(em, DT_EINVAL, "gen=%u: rank %d on node index %d of %d", g->gen, r,
                               g->node_of[r], g->nnodes);
    return 0;
}

/* Append to a growing string. */
static void cat(char **s, size_t *len, size_t *cap, const char *add)
{
    size_t n = strlen(add);

    if (*len + n + 1 > *cap) {
        *cap = (*len + n + 1) * 2;
        *s = dt_xrealloc(*s, *cap);
    }
    memcpy(*s + *len, add, n + 1);
    *len += n;
}

/* The whole job's layout as PMIx wants it: the node list (nodes with
 * ranks only, in the given order) for PMIx_generate_regex, the ranks of
 * each for PMIx_generate_ppn, this node's ranks for PMIX_LOCAL_PEERS, and
 * each rank's index on its node and node id. */
typedef struct layout {
    char *nodes, *ppn, *peers;
    int nlocal;
    int nused;
    int *nodeid;   /* [nnodes] index in the node list, or -1 */
    int *noderank; /* [nranks] */
} layout_t;

static void layout_free(layout_t *l)
{
    free(l->nodes);
    free(l->ppn);
    free(l->peers);
    free(l->nodeid);
    free(l->noderank);
}

static int layout_make(const dt_pmix_gen_t *g, int self, layout_t *l, dt_emsg_t *em)
{
    size_t nl = 0, nc = 0, pl = 0, pc = 0, ql = 0, qc = 0;
    int *count = dt_xcalloc((size_t)g->nnodes, sizeof(int));
    char num[16];

    memset(l, 0, sizeof(*l));
    l->nodeid = dt_xcalloc((size_t)g->nnodes, sizeof(int));
    l->noderank = dt_xcalloc((size_t)g->nranks, sizeof(int));
    for (int r = 0; r < g->nranks; r++)
        l->noderank[r] = count[g->node_of[r]]++;
    for (int i = 0; i < g->nnodes; i++) {
        if (count[i] > 65535) {
            int n = count[i];
            free(count);
            return dt_emsg_set(em, DT_EINVAL, "gen=%u: %d ranks on node %s (at most 65535)", g->gen,
                               n, g->nodes[i]);
        }
        l->nodeid[i] = -1;
        if (count[i] == 0)
            continue;
        l->nodeid[i] = l->nused++;
        if (l->nused > 1) {
            cat(&l->nodes, &nl, &nc, ",");
            cat(&l->ppn, &pl, &pc, ";");
        }
        cat(&l->nodes, &nl, &nc, g->nodes[i]);
        int first = 1;
        for (int r = 0; r < g->nranks; r++) {
            if (g->node_of[r] != i)
                continue;
            snprintf(num, sizeof(num), first ? "%d" : ",%d", r);
            first = 0;
            cat(&l->ppn, &pl, &pc, num);
            if (i == self)
                cat(&l->peers, &ql, &qc, num);
        }
    }
    l->nlocal = count[self];
    free(count);
    return 0;
}

/* Job-level and per-rank data of the namespace, as an info array. */
static int job_info(dt_pmix_t *p, const dt_pmix_gen_t *g, const layout_t *l, const char *dir,
                    pmix_data_array_t *out, dt_emsg_t *em)
{
    char *nodemap = NULL, *procmap = NULL;
    void *list = PMIx_Info_list_start();
    uint32_t size = (uint32_t)g->nranks, lsize = (uint32_t)l->nlocal;
    pmix_status_t st;
    int rc = 0;

    if ((st = PMIx_generate_regex(l->nodes, &nodemap)) != PMIX_SUCCESS) {
        rc = pmix_fail(em, st, "PMIx_generate_regex");
        goto out;
    }
    if ((st = PMIx_generate_ppn(l->ppn, &procmap)) != PMIX_SUCCESS) {
        rc = pmix_fail(em, st, "PMIx_generate_ppn");
        goto out;
    }
    if ((st = PMIx_Info_list_add(list, PMIX_NODE_MAP, nodemap, PMIX_REGEX)) != PMIX_SUCCESS ||
        (st = PMIx_Info_list_add(list, PMIX_PROC_MAP, procmap, PMIX_REGEX)) != PMIX_SUCCESS ||
        (st = PMIx_Info_list_add(list, PMIX_JOB_SIZE, &size, PMIX_UINT32)) != PMIX_SUCCESS ||
        (st = PMIx_Info_list_add(list, PMIX_UNIV_SIZE, &size, PMIX_UINT32)) != PMIX_SUCCESS ||
        (st = PMIx_Info_list_add(list, PMIX_MAX_PROCS, &size, PMIX_UINT32)) != PMIX_SUCCESS ||
        (st = PMIx_Info_list_add(list, PMIX_LOCAL_SIZE, &lsize, PMIX_UINT32)) != PMIX_SUCCESS ||
        (st = PMIx_Info_list_add(list, PMIX_TMPDIR, p->tmpdir, PMIX_STRING)) != PMIX_SUCCESS ||
        (st = PMIx_Info_list_add(list, PMIX_NSDIR, dir, PMIX_STRING)) != PMIX_SUCCESS ||
        (l->peers && (st = PMIx_Info_list_add(list, PMIX_LOCAL_PEERS, l->peers, PMIX_STRING)) !=
                         PMIX_SUCCESS)) {
        rc = pmix_fail(em, st, "PMIx_Info_list_add");
        goto out;
    }
    /* every rank: libpmix takes per-rank data as complete, so the local
     * and node ranks must be there or MPI_Init fails */
    for (int r = 0; r < g->nranks; r++) {
        void *rl = PMIx_Info_list_start();
        pmix_rank_t rank = (pmix_rank_t)r;
        uint16_t lr = (uint16_t)l->noderank[r];
        uint32_t nodeid = (uint32_t)l->nodeid[g->node_of[r]];
        pmix_data_array_t da;

        if ((st = PMIx_Info_list_add(rl, PMIX_RANK, &rank, PMIX_PROC_RANK)) != PMIX_SUCCESS ||
            (st = PMIx_Info_list_add(rl, PMIX_LOCAL_RANK, &lr, PMIX_UINT16)) != PMIX_SUCCESS ||
            (st = PMIx_Info_list_add(rl, PMIX_NODE_RANK, &lr, PMIX_UINT16)) != PMIX_SUCCESS ||
            (st = PMIx_Info_list_add(rl, PMIX_HOSTNAME, g->nodes[g->node_of[r]], PMIX_STRING)) !=
                PMIX_SUCCESS ||
            (st = PMIx_Info_list_add(rl, PMIX_NODEID, &nodeid, PMIX_UINT32)) != PMIX_SUCCESS ||
            (st = PMIx_Info_list_convert(rl, &da)) != PMIX_SUCCESS) {
            PMIx_Info_list_release(rl);
            rc = pmix_fail(em, st, "PMIx_Info_list_add");
            goto out;
        }
        PMIx_Info_list_release(rl);
        /* the deprecated PMIX_PROC_DATA is the same key */
        st = PMIx_Info_list_add(list, PMIX_PROC_INFO_ARRAY, &da, PMIX_DATA_ARRAY);
        PMIx_Data_array_destruct(&da);
        if (st != PMIX_SUCCESS) {
            rc = pmix_fail(em, st, "PMIx_Info_list_add");
            goto out;
        }
    }
    if ((st = PMIx_Info_list_convert(list, out)) != PMIX_SUCCESS)
        rc = pmix_fail(em, st, "PMIx_Info_list_convert");
out:
    PMIx_Info_list_release(list);
    free(procmap);
    free(nodemap);
    return rc;
}

int dt_pmix_gen_begin(dt_pmix_t *p, const dt_pmix_gen_t *g, dt_emsg_t *em)
{
    pmix_data_array_t info = { .type = PMIX_INFO };
    layout_t l;
    char *dir = NULL;
    int self = -1, rc, registered = 0;

    if (p == NULL || p->finalized)
        return dt_emsg_set(em, DT_ESTATE, "PMIx server: not running");
    if ((rc = check_gen(g, &self, em)) < 0)
        return rc;
    dt_pmix_gen_end(p);
    if ((rc = layout_make(g, self, &l, em)) < 0)
        goto out;
    dir = dt_xasprintf("%s/gen.%s", p->tmpdir, g->nspace);
    rm_tree(dir); /* left by an agent that crashed */
    if (mkdir(dir, 0700) < 0) {
        rc = dt_emsg_set(em, dt_err_errno(errno), "%s: %s", dir, strerror(errno));
        goto out;
    }
    if ((rc = job_info(p, g, &l, dir, &info, em)) < 0)
        goto out;

    waiter_t *w = waiter_new();
    pmix_status_t st =
        PMIx_server_register_nspace(g->nspace, l.nlocal, info.array, info.size, waiter_cb, w);
    if ((rc = waiter_wait(w, st, "PMIx_server_register_nspace", em)) < 0)
        goto out;
    registered = 1;
    w = waiter_new();
    st = PMIx_server_setup_local_support(g->nspace, NULL, 0, waiter_cb, w);
    if ((rc = waiter_wait(w, st, "PMIx_server_setup_local_support", em)) < 0)
        goto out;

    p->active = 1;
    p->gen = g->gen;
    snprintf(p->nspace, sizeof(p->nspace), "%s", g->nspace);
    p->nranks = g->nranks;
    p->multinode = l.nused > 1;
    p->dir = dir;
    dir = NULL;
    p->self = dt_xstrdup(g->self);
    p->local = dt_xcalloc((size_t)g->nranks, 1);
    p->registered = dt_xcalloc((size_t)g->nranks, 1);
    for (int r = 0; r < g->nranks; r++)
        p->local[r] = g->node_of[r] == self;
    p->fence_seq = 0;
    dt_log_debug("gen=%u nspace=%s ranks=%d nodes=%d here=%d registered", g->gen, g->nspace,
                 g->nranks, l.nused, l.nlocal);
out:
    if (rc < 0 && registered) {
        waiter_t *wd = waiter_new();
        dt_emsg_t ignored;
        PMIx_server_deregister_nspace(g->nspace, waiter_cb, wd);
        waiter_wait(wd, PMIX_SUCCESS, "PMIx_server_deregister_nspace", &ignored);
    }
    if (dir) {
        rm_tree(dir);
        free(dir);
    }
    if (info.array)
        PMIx_Data_array_destruct(&info);
    layout_free(&l);
    return rc;
}

void dt_pmix_gen_end(dt_pmix_t *p)
{
    dt_emsg_t em;
    fence_t *f;

    if (p == NULL || !p->active)
        return;
    while ((f = p->fences) != NULL) {
        p->fences = f->next;
        dt_log_debug("gen=%u fence seq=%u still open at the end: failing it", p->gen, f->seq);
        fence_fail(f, PMIX_ERR_LOST_CONNECTION);
    }
    uv_timer_stop(&p->timer);
    /* drops the clients of the namespace too */
    waiter_t *w = waiter_new();
    PMIx_server_deregister_nspace(p->nspace, waiter_cb, w);
    if (waiter_wait(w, PMIX_SUCCESS, "PMIx_server_deregister_nspace", &em) < 0)
        dt_log_warn("gen=%u nspace=%s: %s", p->gen, p->nspace, em.s);
    rm_tree(p->dir);
    dt_log_debug("gen=%u nspace=%s ended", p->gen, p->nspace);
    free(p->dir);
    free(p->self);
    p->self = NULL;
    free(p->local);
    free(p->registered);
    p->dir = NULL;
    p->local = p->registered = NULL;
    p->active = 0;
}

/* ---- workers ---------------------------------------------------------------- */

/* Set name=value in a malloc'd environ (libpmix's setup_fork grows the same
 * array with realloc), replacing an existing entry. */
static void env_put(char ***envp, const char *name, const char *value)
{
    char **env = *envp;
    size_t nlen = strlen(name), n = 0;

    for (; env[n]; n++)
        if (strncmp(env[n], name, nlen) == 0 && env[n][nlen] == '=') {
            free(env[n]);
            env[n] = dt_xasprintf("%s=%s", name, value);
            return;
        }
    env = dt_xrealloc(env, (n + 2) * sizeof(*env));
    env[n] = dt_xasprintf("%s=%s", name, value);
    env[n + 1] = NULL;
    *envp = env;
}

/* Another launcher's identity must not leak into our workers: an agent run
 * under srun or mpirun has PMIx and Open MPI variables naming that
 * launcher's server and rank. MCA settings are kept. */
static int env_inherit(const char *e)
{
    static const char *const drop[] = { "PMIX_", "PMI_", "OMPI_" };
    static const char *const keep[] = { "PMIX_MCA_", "OMPI_MCA_", "OMPI_ALLOW_RUN_AS_ROOT" };
    static const char *const drop_mca[] = { "OMPI_MCA_orte_", "OMPI_MCA_ess_base_" };

    for (size_t i = 0; i < sizeof(drop_mca) / sizeof(drop_mca[0]); i++)
        if (strncmp(e, drop_mca[i], strlen(drop_mca[i])) == 0)
            return 0;
    for (size_t i = 0; i < sizeof(keep) / sizeof(keep[0]); i++)
        if (strncmp(e, keep[i], strlen(keep[i])) == 0)
            return 1;
    for (size_t i = 0; i < sizeof(drop) / sizeof(drop[0]); i++)
        if (strncmp(e, drop[i], strlen(drop[i])) == 0)
            return 0;
    return 1;
}

void dt_pmix_env_free(char **env)
{
    if (env == NULL)
        return;
    for (size_t i = 0; env[i]; i++)
        free(env[i]);
    free(env);
}

int dt_pmix_worker_env(dt_pmix_t *p, int rank, char ***envp, dt_emsg_t *em)
{
    pmix_proc_t proc;
    pmix_status_t st;
    char **env = NULL;
    size_t n = 0, k = 0;
    int rc;

    *envp = NULL;
    if (p == NULL || !p->active)
        return dt_emsg_set(em, DT_ESTATE, "worker environment: no generation registered");
    if (rank < 0 || rank >= p->nranks)
        return dt_emsg_set(em, DT_EINVAL, "gen=%u: rank %d is not in 0..%d", p->gen, rank,
                           p->nranks - 1);
    if (!p->local[rank])
        return dt_emsg_set(em, DT_EINVAL, "gen=%u: rank %d is not placed on this node", p->gen,
                           rank);
    PMIX_LOAD_PROCID(&proc, p->nspace, (pmix_rank_t)rank);
    if (!p->registered[rank]) {
        waiter_t *w = waiter_new();
        st = PMIx_server_register_client(&proc, getuid(), getgid(), NULL, waiter_cb, w);
        if ((rc = waiter_wait(w, st, "PMIx_server_register_client", em)) < 0)
            return rc;
        p->registered[rank] = 1;
    }

    while (environ[n])
        n++;
    env = dt_xcalloc(n + 1, sizeof(*env));
    for (size_t i = 0; i < n; i++)
        if (env_inherit(environ[i]))
            env[k++] = dt_xstrdup(environ[i]);
    if ((st = PMIx_server_setup_fork(&proc, &env)) != PMIX_SUCCESS) {
        rc = pmix_fail(em, st, "PMIx_server_setup_fork");
        goto fail;
    }
    /* the client's host is the node map's name for it, not gethostname() */
    env_put(&env, "PMIX_HOSTNAME", p->self);
    /* without schizo=^orte Open MPI looks for mpirun, finds none and every
     * rank starts alone as rank 0 of 1 */
    env_put(&env, "OMPI_MCA_schizo", "^orte");
    env_put(&env, "OMPI_MCA_ess", "pmi");
    env_put(&env, "OMPI_MCA_pml", "ob1");
    if (p->multinode) {
        /* which interfaces is the site's choice: an OMPI_MCA_btl_tcp_if_include
         * in the agent's environment is passed on (dtctl run --local sets lo) */
        env_put(&env, "OMPI_MCA_btl", "self,vader,tcp");
    } else {
        env_put(&env, "OMPI_MCA_btl", "self,vader");
    }
    /* dead ranks leave 4 MiB segments behind: keep them where gen_end looks */
    env_put(&env, "OMPI_MCA_btl_vader_backing_directory", p->dir);
    *envp = env;
    return 0;
fail:
    dt_pmix_env_free(env);
    return rc;
}

/* ---- failures ---------------------------------------------------------------- */

/* PMIx_Notify_event's completion, on libpmix's thread */
static void notify_done(pmix_status_t st, void *cbdata)
{
    pmix_data_array_t *da = cbdata;

    PMIx_Data_array_destruct(da);
    free(da);
}

int dt_pmix_notify_failure(dt_pmix_t *p, int rank, dt_emsg_t *em)
{
    pmix_data_array_t *da;
    pmix_proc_t proc;
    pmix_status_t st;
    bool yes = true;
    void *list;

    if (p == NULL || !p->active)
        return dt_emsg_set(em, DT_ESTATE, "failure of rank %d: no generation registered", rank);
    if (rank < 0 || rank >= p->nranks)
        return dt_emsg_set(em, DT_EINVAL, "gen=%u: failure of rank %d, not in 0..%d", p->gen, rank,
                           p->nranks - 1);
    PMIX_LOAD_PROCID(&proc, p->nspace, (pmix_rank_t)rank);
    da = dt_xcalloc(1, sizeof(*da));
    list = PMIx_Info_list_start();
    /* non-default: only handlers that asked for this code run; Open MPI's
     * default handler is not one of them */
    if ((st = PMIx_Info_list_add(list, PMIX_EVENT_AFFECTED_PROC, &proc, PMIX_PROC)) !=
            PMIX_SUCCESS ||
        (st = PMIx_Info_list_add(list, PMIX_EVENT_NON_DEFAULT, &yes, PMIX_BOOL)) != PMIX_SUCCESS ||
        (st = PMIx_Info_list_convert(list, da)) != PMIX_SUCCESS) {
        PMIx_Info_list_release(list);
        free(da);
        return pmix_fail(em, st, "PMIx_Info_list_add");
    }
    PMIx_Info_list_release(list);
    /* the info stays ours until notify_done: libpmix may read it later */
    st = PMIx_Notify_event(PMIX_ERR_PROC_ABORTED_BY_SIG, &proc, PMIX_RANGE_NAMESPACE, da->array,
                           da->size, notify_done, da);
    if (st != PMIX_SUCCESS) {
        notify_done(st, da);
        if (st != PMIX_OPERATION_SUCCEEDED)
            return pmix_fail(em, st, "PMIx_Notify_event");
    }
    dt_log_debug("gen=%u rank=%d failure notified", p->gen, rank);
    return 0;
}

void dt_pmix_set_fence_timeout(dt_pmix_t *p, int64_t ms)
{
    p->fence_timeout_ms = ms > 0 ? ms : DT_PMIX_FENCE_TIMEOUT_MS;
}
