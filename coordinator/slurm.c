/* SPDX-License-Identifier: MIT
 *
 * The libslurm edge (slurm.h), written against Slurm 22.05's <slurm/slurm.h>:
 * a dt_slurm_desc_t becomes a job_desc_msg_t the way sbatch fills one,
 * job_info_t becomes a dt_slurm_info_t, and Slurm's error numbers become
 * DT_E* codes here and nowhere else:
 *  - DT_ECOMM: slurmctld could not be reached or did not answer (the
 *    SLURM(CTLD)_COMMUNICATIONS_* and socket errors, munge failures, a
 *    controller in standby, errno-style ECONNREFUSED/ETIMEDOUT), or said
 *    to try again later (job queue full, EAGAIN): worth retrying;
 *  - DT_ENOENT: ESLURM_INVALID_JOB_ID (unknown, or purged after MinJobAge);
 *  - DT_EINVAL: anything else slurmctld refused; the message is its text.
 *
 * libslurm keeps process-wide state (its configuration, errno-like
 * slurm_get_errno per thread, plugin handles) and is not documented as
 * thread-safe, so one mutex serialises every call. Under that lock, this
 * file's only state besides libslurm's own: the last slurm_load_jobs
 * answer (a poll asks only for what changed since; slurmctld answers
 * SLURM_NO_CHANGE_IN_DATA when nothing did) and a count of the RPCs made,
 * which the poll logs at debug level.
 *
 * Not here: dt_slurm_desc_clear (batch.c, with the code that fills a desc,
 * so the unit tests link it without libslurm).
 */
#include "config.h"

#include <errno.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "common/log.h"
#include "common/mem.h"
#include "coordinator/slurm.h"

#ifdef HAVE_SLURM
#include <slurm/slurm.h>
#include <slurm/slurm_errno.h>
#endif

#ifndef HAVE_SLURM

static int no_slurm(dt_emsg_t *em)
{
    return dt_emsg_set(em, DT_ENOTSUP, "dtcoordd was built without libslurm");
}

int dt_slurm_init(const char *conf, dt_emsg_t *em)
{
    (void)conf;
    return no_slurm(em);
}

void dt_slurm_fini(void)
{
}

int dt_slurm_submit(const dt_slurm_desc_t *d, uint32_t *id, dt_emsg_t *em)
{
    (void)d;
    (void)id;
    return no_slurm(em);
}

int dt_slurm_query(uint32_t id, dt_slurm_info_t *out, dt_emsg_t *em)
{
    (void)id;
    (void)out;
    return no_slurm(em);
}

int dt_slurm_requeue(uint32_t id, const char *exclude, dt_emsg_t *em)
{
    (void)id;
    (void)exclude;
    return no_slurm(em);
}

int dt_slurm_query_jobs(const uint32_t *ids, size_t n, dt_slurm_info_t *out, int *rcs,
                        dt_slurm_poll_stats_t *st, dt_emsg_t *em)
{
    (void)ids;
    (void)n;
    (void)out;
    (void)rcs;
    (void)st;
    return no_slurm(em);
}

int dt_slurm_find(const char *name, uint32_t uid, uint32_t *ids, size_t cap, size_t *n,
                  dt_emsg_t *em)
{
    (void)name;
    (void)uid;
    (void)ids;
    (void)cap;
    *n = 0;
    return no_slurm(em);
}

int dt_slurm_room(uint32_t id, const char *exclude, dt_slurm_room_t *room, dt_emsg_t *em)
{
    (void)id;
    (void)exclude;
    (void)room;
    return no_slurm(em);
}

int dt_slurm_cancel(uint32_t id, dt_emsg_t *em)
{
    (void)id;
    return no_slurm(em);
}

#else /* HAVE_SLURM */

#define DEFAULT_CONF "/etc/slurm/slurm.conf"
/* After slurm_requeue of a running job the job is COMPLETING until its
 * epilog is done; slurmctld refuses to change its node exclusions until
 * then. Retry this long. */
#define UPDATE_RETRY_MS 15000
#define UPDATE_RETRY_STEP_MS 100

static pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;
static int initialised;
static job_info_msg_t *kept; /* the last slurm_load_jobs answer (dt_slurm_query_jobs) */
static uint64_t rpcs;        /* RPCs made, for the poll's debug log */

/* ---- errors -------------------------------------------------------------- */

/* The Slurm error of the call that just failed on this thread: the return
 * value when it is an error number (slurm_load_job returns one), else
 * slurm_get_errno(). */
static int slurm_err(int rc)
{
    int e = rc > 0 ? rc : slurm_get_errno();
    return e == 0 ? SLURM_ERROR : e;
}

static int is_comm_error(int e)
{
    switch (e) {
    case SLURM_COMMUNICATIONS_CONNECTION_ERROR:
    case SLURM_COMMUNICATIONS_SEND_ERROR:
    case SLURM_COMMUNICATIONS_RECEIVE_ERROR:
    case SLURM_COMMUNICATIONS_SHUTDOWN_ERROR:
    case SLURM_COMMUNICATIONS_MISSING_SOCKET_ERROR:
    case SLURM_PROTOCOL_AUTHENTICATION_ERROR:
    case SLURMCTLD_COMMUNICATIONS_CONNECTION_ERROR:
    case SLURMCTLD_COMMUNICATIONS_SEND_ERROR:
    case SLURMCTLD_COMMUNICATIONS_RECEIVE_ERROR:
    case SLURMCTLD_COMMUNICATIONS_SHUTDOWN_ERROR:
    case SLURM_PROTOCOL_SOCKET_IMPL_ZERO_RECV_LENGTH:
    case SLURM_PROTOCOL_SOCKET_IMPL_NEGATIVE_RECV_LENGTH:
    case SLURM_PROTOCOL_SOCKET_IMPL_NOT_ALL_DATA_SENT:
    case SLURM_PROTOCOL_SOCKET_IMPL_TIMEOUT:
    case SLURM_PROTOCOL_SOCKET_ZERO_BYTES_SENT:
    case ESLURM_IN_STANDBY_MODE:
    case ESLURM_IN_STANDBY_USE_BACKUP:
    case ESLURM_AUTH_CRED_INVALID:
    case ESLURM_AUTH_FOPEN_ERROR:
    case ESLURM_AUTH_NET_ERROR:
    case ESLURM_AUTH_UNABLE_TO_SIGN:
    /* "try again later": sbatch retries these */
    case ESLURM_ERROR_ON_DESC_TO_RECORD_COPY:
    case ESLURM_NODES_BUSY:
    case EAGAIN:
    case ECONNREFUSED:
    case ECONNRESET:
    case ETIMEDOUT:
    case EHOSTUNREACH:
    case ENETUNREACH:
        return 1;
    }
    return 0;
}

/* The one translation: "CALL job=ID: slurm_strerror's text". */
static int fail(dt_emsg_t *em, int e, const char *call, uint32_t id)
{
    int code = e == ESLURM_INVALID_JOB_ID ? DT_ENOENT : is_comm_error(e) ? DT_ECOMM : DT_EINVAL;

    if (id != 0)
        return dt_emsg_set(em, code, "%s job=%u: %s", call, id, slurm_strerror(e));
    return dt_emsg_set(em, code, "%s: %s", call, slurm_strerror(e));
}

/* ---- init ---------------------------------------------------------------- */

int dt_slurm_init(const char *conf, dt_emsg_t *em)
{
    const char *path = conf;
    struct stat st;

    if (path == NULL)
        path = getenv("SLURM_CONF");
    if (path == NULL || *path == '\0')
        path = DEFAULT_CONF;
    /* libslurm calls exit() on a configuration it cannot read: look first. */
    if (stat(path, &st) != 0)
        return dt_emsg_set(em, DT_ECONF, "slurm configuration %s: %s", path, strerror(errno));
    if (!S_ISREG(st.st_mode))
        return dt_emsg_set(em, DT_ECONF, "slurm configuration %s: not a regular file", path);
    if (access(path, R_OK) != 0)
        return dt_emsg_set(em, DT_ECONF, "slurm configuration %s: %s", path, strerror(errno));

    pthread_mutex_lock(&lock);
    if (!initialised) {
        slurm_init(path);
        initialised = 1;
    }
    pthread_mutex_unlock(&lock);
    return 0;
}

void dt_slurm_fini(void)
{
    pthread_mutex_lock(&lock);
    if (kept != NULL) {
        slurm_free_job_info_msg(kept);
        kept = NULL;
    }
    if (initialised) {
        slurm_fini();
        initialised = 0;
    }
    pthread_mutex_unlock(&lock);
}

/* ---- submit -------------------------------------------------------------- */

int dt_slurm_submit(const dt_slurm_desc_t *d, uint32_t *id, dt_emsg_t *em)
{
    submit_response_msg_t *resp = NULL;
    job_desc_msg_t jd;
    char *tres = NULL, *cpt = NULL;
    uint32_t env_n = 0;
    int rc;

    if (d->script == NULL || d->nodes == 0)
        return dt_emsg_set(em, DT_EINVAL, "slurm_submit_batch_job: no script or no nodes");
    if (d->env == NULL || d->env[0] == NULL)
        return dt_emsg_set(em, DT_EINVAL,
                           "slurm_submit_batch_job: no environment (slurmctld refuses one)");
    if (d->cpus_per_task > UINT16_MAX || d->signal_lead_s > UINT16_MAX)
        return dt_emsg_set(em, DT_EINVAL,
                           "slurm_submit_batch_job: cpus_per_task %u or signal lead %u s "
                           "over Slurm's 16-bit fields",
                           d->cpus_per_task, d->signal_lead_s);
    while (d->env[env_n] != NULL)
        env_n++;

    /* What sbatch 22.05 sets for the same options. */
    slurm_init_job_desc_msg(&jd);
    jd.name = d->name;
    jd.script = d->script;
    jd.partition = d->partition;
    jd.account = d->account;
    jd.qos = d->qos;
    jd.features = d->constraint;
    jd.exc_nodes = d->exclude;
    jd.min_nodes = d->nodes;
    jd.max_nodes = d->nodes;
    jd.num_tasks = d->nodes; /* one agent per node */
    jd.ntasks_per_node = 1;
    if (d->cpus_per_task > 0)
        jd.cpus_per_task = (uint16_t)d->cpus_per_task;
    if (d->gpus_per_node > 0) /* --gpus-per-node=N */
        jd.tres_per_node = tres = dt_xasprintf("gres:gpu:%u", d->gpus_per_node);
    if (d->gpus_per_node > 0 && d->cpus_per_gpu > 0) /* --cpus-per-gpu=C */
        jd.cpus_per_tres = cpt = dt_xasprintf("gres:gpu:%u", d->cpus_per_gpu);
    if (d->time_min > 0)
        jd.time_limit = d->time_min;
    if (d->signal_lead_s > 0) { /* --signal=B:SIG@lead */
        if (d->warn_signal != SIGUSR1 && d->warn_signal != SIGUSR2) {
            free(tres);
            free(cpt);
            return dt_emsg_set(em, DT_EINVAL,
                               "slurm_submit_batch_job: warning signal %d is not "
                               "USR1 or USR2",
                               d->warn_signal);
        }
        jd.warn_signal = (uint16_t)d->warn_signal;
        jd.warn_time = (uint16_t)d->signal_lead_s;
        jd.warn_flags = KILL_JOB_BATCH;
    }
    jd.requeue = 1;
    jd.open_mode = OPEN_MODE_APPEND;
    jd.kill_on_node_fail = 0; /* --no-kill: dt decides about a lost node */
    jd.std_out = d->output;
    jd.std_err = d->output;
    jd.work_dir = d->workdir;
    jd.environment = d->env;
    jd.env_size = env_n;
    jd.user_id = d->uid;
    jd.group_id = d->gid;

    pthread_mutex_lock(&lock);
    rpcs++;
    rc = slurm_submit_batch_job(&jd, &resp);
    if (rc != SLURM_SUCCESS) {
        rc = fail(em, slurm_err(rc), "slurm_submit_batch_job", 0);
    } else if (resp == NULL) {
        rc = dt_emsg_set(em, DT_EPROTO, "slurm_submit_batch_job: no response");
    } else if (resp->job_id == 0) {
        rc = resp->error_code != SLURM_SUCCESS
                 ? fail(em, (int)resp->error_code, "slurm_submit_batch_job", 0)
                 : dt_emsg_set(em, DT_EPROTO, "slurm_submit_batch_job: no job id in the answer");
    } else {
        /* An error_code with a job id is advice, not a refusal: the job
         * exists and waits (e.g. "Requested partition configuration not
         * available now" for more nodes than the partition has, unless
         * EnforcePartLimits is set). sbatch ignores it too. */
        if (resp->error_code != SLURM_SUCCESS)
            dt_log_warn("slurm_job=%u submitted, but slurmctld says: %s", resp->job_id,
                        slurm_strerror((int)resp->error_code));
        *id = resp->job_id;
        rc = 0;
    }
    if (resp != NULL)
        slurm_free_submit_response_response_msg(resp);
    pthread_mutex_unlock(&lock);
    free(tres);
    free(cpt);
    return rc;
}

/* ---- query --------------------------------------------------------------- */

static const char *state_name(uint32_t base)
{
    static const char *const names[] = {
        [JOB_PENDING] = "PENDING",     [JOB_RUNNING] = "RUNNING",     [JOB_SUSPENDED] = "SUSPENDED",
        [JOB_COMPLETE] = "COMPLETED",  [JOB_CANCELLED] = "CANCELLED", [JOB_FAILED] = "FAILED",
        [JOB_TIMEOUT] = "TIMEOUT",     [JOB_NODE_FAIL] = "NODE_FAIL", [JOB_PREEMPTED] = "PREEMPTED",
        [JOB_BOOT_FAIL] = "BOOT_FAIL", [JOB_DEADLINE] = "DEADLINE",   [JOB_OOM] = "OUT_OF_MEMORY",
    };
    return base < sizeof(names) / sizeof(names[0]) && names[base] ? names[base] : "UNKNOWN";
}

/* Slurm's own names (job_reason_string, not in 22.05's public header) for
 * the reasons a dt job meets; others print as their number. */
static void reason_name(uint16_t r, char *buf, size_t n)
{
    static const char *const names[] = {
        [WAIT_NO_REASON] = "None",
        [WAIT_PRIORITY] = "Priority",
        [WAIT_DEPENDENCY] = "Dependency",
        [WAIT_RESOURCES] = "Resources",
        [WAIT_PART_NODE_LIMIT] = "PartitionNodeLimit",
        [WAIT_PART_TIME_LIMIT] = "PartitionTimeLimit",
        [WAIT_PART_DOWN] = "PartitionDown",
        [WAIT_PART_INACTIVE] = "PartitionInactive",
        [WAIT_HELD] = "JobHeldAdmin",
        [WAIT_TIME] = "BeginTime",
        [WAIT_LICENSES] = "Licenses",
        [WAIT_ASSOC_JOB_LIMIT] = "AssociationJobLimit",
        [WAIT_ASSOC_RESOURCE_LIMIT] = "AssociationResourceLimit",
        [WAIT_ASSOC_TIME_LIMIT] = "AssociationTimeLimit",
        [WAIT_RESERVATION] = "Reservation",
        [WAIT_NODE_NOT_AVAIL] = "ReqNodeNotAvail",
        [WAIT_HELD_USER] = "JobHeldUser",
        [WAIT_FRONT_END] = "FrontEndDown",
        [FAIL_DEFER] = "SchedDefer",
        [FAIL_DOWN_PARTITION] = "PartitionDown",
        [FAIL_DOWN_NODE] = "NodeDown",
        [FAIL_BAD_CONSTRAINTS] = "BadConstraints",
        [FAIL_SYSTEM] = "SystemFailure",
        [FAIL_LAUNCH] = "JobLaunchFailure",
        [FAIL_EXIT_CODE] = "NonZeroExitCode",
        [FAIL_TIMEOUT] = "TimeLimit",
        [FAIL_INACTIVE_LIMIT] = "InactiveLimit",
        [FAIL_ACCOUNT] = "InvalidAccount",
        [FAIL_QOS] = "InvalidQOS",
        [WAIT_QOS_THRES] = "QOSUsageThreshold",
        [WAIT_QOS_JOB_LIMIT] = "QOSJobLimit",
        [WAIT_QOS_RESOURCE_LIMIT] = "QOSResourceLimit",
        [WAIT_QOS_TIME_LIMIT] = "QOSTimeLimit",
        [WAIT_CLEANING] = "Cleaning",
        [WAIT_PROLOG] = "Prolog",
        [WAIT_QOS] = "QOSNotAllowed",
        [WAIT_ACCOUNT] = "AccountNotAllowed",
        [WAIT_DEP_INVALID] = "DependencyNeverSatisfied",
        [WAIT_MAX_REQUEUE] = "JobHoldMaxRequeue",
        [FAIL_DEADLINE] = "DeadLine",
        [FAIL_OOM] = "OutOfMemory",
        [WAIT_PART_CONFIG] = "PartitionConfig",
        [WAIT_ACCOUNT_POLICY] = "AccountingPolicy",
    };
    if (r < sizeof(names) / sizeof(names[0]) && names[r] != NULL)
        snprintf(buf, n, "%s", names[r]);
    else
        snprintf(buf, n, "Reason%u", (unsigned)r);
}

static void fill_info(const slurm_job_info_t *j, dt_slurm_info_t *out)
{
    uint32_t base = j->job_state & JOB_STATE_BASE;
    int waiting = base == JOB_PENDING;

    memset(out, 0, sizeof(*out));
    out->id = j->job_id;
    snprintf(out->state, sizeof(out->state), "%s", state_name(base));
    out->final = base != JOB_PENDING && base != JOB_RUNNING && base != JOB_SUSPENDED;
    out->completing = (j->job_state & JOB_COMPLETING) != 0;
    out->requeued = (j->job_state & (JOB_REQUEUE | JOB_REQUEUE_HOLD | JOB_REQUEUE_FED)) != 0;
    reason_name(j->state_reason, out->reason, sizeof(out->reason));
    snprintf(out->nodes, sizeof(out->nodes), "%s", j->nodes ? j->nodes : "");
    snprintf(out->exclude, sizeof(out->exclude), "%s", j->exc_nodes ? j->exc_nodes : "");
    out->restarts = j->restart_cnt;
    out->exit_code = -1;
    /* Only a job whose script ran has a status (batch_host is where it
     * ran). A cancelled job reads CANCELLED at once, its script's status
     * only once it is gone (COMPLETING clears); other end states come with
     * theirs. */
    if (out->final && j->batch_host != NULL && *j->batch_host != '\0' &&
        !(base == JOB_CANCELLED && out->completing)) {
        int st = (int)j->exit_code;
        if (WIFSIGNALED(st))
            out->exit_signal = WTERMSIG(st);
        else if (WIFEXITED(st))
            out->exit_code = WEXITSTATUS(st);
    }
    /* start_time and end_time are expectations while the job waits */
    out->start_s = !waiting && j->start_time > 0 ? (int64_t)j->start_time : 0;
    out->end_s = out->final && j->end_time > 0 ? (int64_t)j->end_time : 0;
    out->time_min = j->time_limit == INFINITE || j->time_limit == NO_VAL ? 0 : j->time_limit;
}

/* Called with the lock held. */
static int query_locked(uint32_t id, dt_slurm_info_t *out, dt_emsg_t *em)
{
    job_info_msg_t *msg = NULL;
    int rc;

    rpcs++;
    rc = slurm_load_job(&msg, id, SHOW_ALL | SHOW_DETAIL);

    if (rc != SLURM_SUCCESS)
        return fail(em, slurm_err(rc), "slurm_load_job", id);
    rc = dt_emsg_set(em, DT_ENOENT, "slurm_load_job job=%u: not in the answer", id);
    for (uint32_t i = 0; msg != NULL && i < msg->record_count; i++) {
        if (msg->job_array[i].job_id == id) {
            fill_info(&msg->job_array[i], out);
            rc = 0;
            break;
        }
    }
    slurm_free_job_info_msg(msg);
    return rc;
}

int dt_slurm_query(uint32_t id, dt_slurm_info_t *out, dt_emsg_t *em)
{
    int rc;

    pthread_mutex_lock(&lock);
    rc = query_locked(id, out, em);
    pthread_mutex_unlock(&lock);
    return rc;
}

/* ---- one poll of many jobs ---------------------------------------------- */

static int cmp_u32(const void *a, const void *b)
{
    uint32_t x = *(const uint32_t *)a, y = *(const uint32_t *)b;
    return x < y ? -1 : x > y;
}

int dt_slurm_query_jobs(const uint32_t *ids, size_t n, dt_slurm_info_t *out, int *rcs,
                        dt_slurm_poll_stats_t *st, dt_emsg_t *em)
{
    job_info_msg_t *fresh = NULL;
    uint32_t *sorted;
    int rc, changed = 1;

    pthread_mutex_lock(&lock);
    rpcs++;
    rc = slurm_load_jobs(kept != NULL ? kept->last_update : 0, &fresh, SHOW_ALL);
    if (rc != SLURM_SUCCESS) {
        int e = slurm_err(rc);
        if (e != SLURM_NO_CHANGE_IN_DATA || kept == NULL) {
            rc = fail(em, e, "slurm_load_jobs", 0);
            pthread_mutex_unlock(&lock);
            return rc;
        }
        changed = 0; /* what is kept is current */
    } else {
        if (kept != NULL)
            slurm_free_job_info_msg(kept);
        kept = fresh;
    }
    /* one pass over every record, each looked up among the sorted ids:
     * records x log(ids), not records x ids */
    sorted = dt_xcalloc(n ? n : 1, sizeof(*sorted));
    memcpy(sorted, ids, n * sizeof(*ids));
    qsort(sorted, n, sizeof(*sorted), cmp_u32);
    for (size_t i = 0; i < n; i++)
        rcs[i] = dt_emsg_set(em, DT_ENOENT, "slurm_load_jobs job=%u: not in the answer", ids[i]);
    for (uint32_t r = 0; r < kept->record_count; r++) {
        const slurm_job_info_t *j = &kept->job_array[r];
        if (bsearch(&j->job_id, sorted, n, sizeof(*sorted), cmp_u32) == NULL)
            continue;
        for (size_t i = 0; i < n; i++) /* ids may repeat */
            if (ids[i] == j->job_id) {
                fill_info(j, &out[i]);
                rcs[i] = 0;
            }
    }
    if (st != NULL) {
        st->changed = changed;
        st->records = kept->record_count;
        st->rpcs = rpcs;
    }
    pthread_mutex_unlock(&lock);
    free(sorted);
    return 0;
}

/* ---- a job submitted but not recorded ------------------------------------ */

int dt_slurm_find(const char *name, uint32_t uid, uint32_t *ids, size_t cap, size_t *n,
                  dt_emsg_t *em)
{
    job_info_msg_t *msg = NULL;
    int rc;

    *n = 0;
    pthread_mutex_lock(&lock);
    rpcs++;
    rc = slurm_load_job_user(&msg, uid, SHOW_ALL);
    if (rc != SLURM_SUCCESS) {
        rc = fail(em, slurm_err(rc), "slurm_load_job_user", 0);
        pthread_mutex_unlock(&lock);
        return rc;
    }
    for (uint32_t r = 0; msg != NULL && r < msg->record_count; r++) {
        const slurm_job_info_t *j = &msg->job_array[r];
        uint32_t base = j->job_state & JOB_STATE_BASE;
        int live = base == JOB_PENDING || base == JOB_RUNNING || base == JOB_SUSPENDED ||
                   (j->job_state & (JOB_REQUEUE | JOB_REQUEUE_HOLD | JOB_REQUEUE_FED)) != 0;
        if (!live || j->user_id != uid || j->name == NULL || strcmp(j->name, name) != 0)
            continue;
        /* newest first: insert in descending id order, keep the first cap */
        size_t at = *n;
        while (at > 0 && ids[at - 1] < j->job_id)
            at--;
        if (at >= cap)
            continue;
        size_t last = *n < cap ? *n : cap - 1;
        memmove(ids + at + 1, ids + at, (last - at) * sizeof(*ids));
        ids[at] = j->job_id;
        if (*n < cap)
            (*n)++;
    }
    slurm_free_job_info_msg(msg);
    pthread_mutex_unlock(&lock);
    return 0;
}

/* ---- requeue ------------------------------------------------------------- */

static void sleep_ms(int ms)
{
    struct timespec ts = { ms / 1000, (long)(ms % 1000) * 1000000L };
    nanosleep(&ts, NULL);
}

/* The union of two host lists, deduplicated and ranged by Slurm's own
 * hostlist code ("n[1-3]"); the caller frees it. */
static char *union_hosts(const char *had, const char *add)
{
    hostlist_t hl = slurm_hostlist_create(had != NULL ? had : "");
    char *s, *out;

    if (hl == NULL || slurm_hostlist_push(hl, add) == 0) {
        if (hl != NULL)
            slurm_hostlist_destroy(hl);
        /* not a host list Slurm can expand: let slurmctld judge the text */
        return had != NULL && *had != '\0' ? dt_xasprintf("%s,%s", had, add) : dt_xstrdup(add);
    }
    slurm_hostlist_uniq(hl);
    s = slurm_hostlist_ranged_string_malloc(hl);
    slurm_hostlist_destroy(hl);
    out = dt_xstrdup(s != NULL ? s : add);
    free(s);
    return out;
}

/* slurm_update_job on one field, retried while slurmctld says the job is
 * still leaving its last run. Called with the lock held. */
static int update_locked(job_desc_msg_t *u, const char *what, dt_emsg_t *em)
{
    int e = 0;

    for (int waited = 0;; waited += UPDATE_RETRY_STEP_MS) {
        rpcs++;
        if (slurm_update_job(u) == SLURM_SUCCESS)
            return 0;
        e = slurm_err(SLURM_ERROR);
        if ((e != ESLURM_JOB_NOT_PENDING && e != ESLURM_TRANSITION_STATE_NO_UPDATE) ||
            waited >= UPDATE_RETRY_MS)
            break;
        sleep_ms(UPDATE_RETRY_STEP_MS);
    }
    return fail(em, e, what, u->job_id);
}

int dt_slurm_requeue(uint32_t id, const char *exclude, dt_emsg_t *em)
{
    int hold = exclude != NULL && *exclude != '\0';
    dt_slurm_info_t info;
    job_desc_msg_t u;
    char *merged = NULL;
    int rc, held = 0;

    pthread_mutex_lock(&lock);
    rpcs++;
    /* Held, so it cannot start again on a node we are about to exclude. */
    if (slurm_requeue(id, hold ? JOB_REQUEUE_HOLD : 0) == SLURM_SUCCESS) {
        held = hold;
    } else {
        int e = slurm_err(SLURM_ERROR);
        if (e != ESLURM_JOB_PENDING) {
            rc = fail(em, e, "slurm_requeue", id);
            goto out;
        }
        /* already pending: only the exclusion is left to apply */
    }
    rc = 0;
    if (!hold)
        goto out;

    if ((rc = query_locked(id, &info, em)) < 0)
        goto out;
    merged = union_hosts(info.exclude, exclude);
    slurm_init_job_desc_msg(&u);
    u.job_id = id;
    u.exc_nodes = merged;
    rc = update_locked(&u, "slurm_update_job(exc_nodes)", em);

out:
    if (held) {
        /* Release even when the exclusion failed: a job left held would
         * never run. scontrol release is priority = INFINITE. */
        dt_emsg_t em2;
        slurm_init_job_desc_msg(&u);
        u.job_id = id;
        u.priority = INFINITE;
        int rc2 = update_locked(&u, "slurm_update_job(release)", rc < 0 ? &em2 : em);
        if (rc == 0)
            rc = rc2;
    }
    pthread_mutex_unlock(&lock);
    free(merged);
    return rc;
}

/* ---- room left after an exclusion ----------------------------------------- */

/* Is `item` one of the words of `list` (split at any of `seps`)? */
static int has_word(const char *list, const char *seps, const char *item)
{
    size_t len = strlen(item);

    for (const char *p = list; p != NULL && *p != '\0';) {
        size_t w = strcspn(p, seps);
        if (w == len && strncmp(p, item, len) == 0)
            return 1;
        p += w;
        p += strspn(p, seps);
    }
    return 0;
}

/* Does a node with `have` (comma-separated features) satisfy the
 * constraint `want` (features joined by '&' or ',')? A feature may carry
 * a count ("gpu*2") or a list may use |, [] or (): not evaluated, 1. */
static int has_features(const char *have, const char *want, int *checked)
{
    char feat[256];

    if (want == NULL || *want == '\0')
        return 1;
    if (strpbrk(want, "|[]()*") != NULL) {
        *checked = 0;
        return 1;
    }
    for (const char *p = want; *p != '\0';) {
        size_t w = strcspn(p, "&,");
        if (w > 0 && w < sizeof(feat)) {
            memcpy(feat, p, w);
            feat[w] = '\0';
            if (!has_word(have, ",", feat))
                return 0;
        }
        p += w;
        p += strspn(p, "&,");
    }
    return 1;
}

static const char *unusable_state(uint32_t st)
{
    uint32_t base = st & NODE_STATE_BASE;

    if (st & NODE_STATE_FAIL)
        return "FAIL";
    if (st & NODE_STATE_DRAIN)
        return "DRAIN";
    if (base == NODE_STATE_DOWN)
        return "DOWN";
    if (base == NODE_STATE_FUTURE)
        return "FUTURE";
    return NULL;
}

/* Append "NODE (STATE)" to the list in buf, "..." once it is full. */
static void append_node(char *buf, size_t cap, const char *node, const char *state)
{
    size_t len = strlen(buf);

    if (len + 4 >= cap)
        return;
    int n = snprintf(buf + len, cap - len, "%s%s (%s)", len ? ", " : "", node, state);
    if (n < 0 || len + (size_t)n >= cap - 4)
        snprintf(buf + cap - 4, 4, "...");
}

int dt_slurm_room(uint32_t id, const char *exclude, dt_slurm_room_t *room, dt_emsg_t *em)
{
    job_info_msg_t *jm = NULL;
    node_info_msg_t *nm = NULL;
    partition_info_msg_t *pm = NULL;
    const slurm_job_info_t *j = NULL;
    hostlist_t ex = NULL, parts = NULL;
    char *merged = NULL;
    int rc;

    memset(room, 0, sizeof(*room));
    room->features_checked = 1;
    pthread_mutex_lock(&lock);
    rpcs++;
    if ((rc = slurm_load_job(&jm, id, SHOW_ALL)) != SLURM_SUCCESS) {
        rc = fail(em, slurm_err(rc), "slurm_load_job", id);
        goto out;
    }
    for (uint32_t r = 0; jm != NULL && r < jm->record_count; r++)
        if (jm->job_array[r].job_id == id)
            j = &jm->job_array[r];
    if (j == NULL) {
        rc = dt_emsg_set(em, DT_ENOENT, "slurm_load_job job=%u: not in the answer", id);
        goto out;
    }
    rpcs++;
    if ((rc = slurm_load_partitions(0, &pm, SHOW_ALL)) != SLURM_SUCCESS) {
        rc = fail(em, slurm_err(rc), "slurm_load_partitions", 0);
        goto out;
    }
    rpcs++;
    if ((rc = slurm_load_node(0, &nm, SHOW_ALL)) != SLURM_SUCCESS) {
        rc = fail(em, slurm_err(rc), "slurm_load_node", 0);
        goto out;
    }
    /* the nodes of the job's partition(s), one host list */
    parts = slurm_hostlist_create("");
    for (uint32_t r = 0; pm != NULL && parts != NULL && r < pm->record_count; r++) {
        const partition_info_t *p = &pm->partition_array[r];
        if (p->name != NULL && p->nodes != NULL && *p->nodes != '\0' &&
            has_word(j->partition, ",", p->name))
            slurm_hostlist_push(parts, p->nodes);
    }
    merged = exclude != NULL && *exclude != '\0' ? union_hosts(j->exc_nodes, exclude)
                                                 : dt_xstrdup(j->exc_nodes ? j->exc_nodes : "");
    ex = *merged != '\0' ? slurm_hostlist_create(merged) : NULL;
    room->need = j->num_nodes > 0 ? j->num_nodes : 1;
    snprintf(room->partition, sizeof(room->partition), "%s", j->partition ? j->partition : "");
    snprintf(room->excluded, sizeof(room->excluded), "%s", merged);
    for (uint32_t r = 0; nm != NULL && r < nm->record_count; r++) {
        const node_info_t *nd = &nm->node_array[r];
        if (nd->name == NULL || parts == NULL || slurm_hostlist_find(parts, nd->name) < 0)
            continue;
        room->in_partition++;
        if (ex != NULL && slurm_hostlist_find(ex, nd->name) >= 0)
            continue;
        if (!has_features(nd->features_act ? nd->features_act : nd->features, j->features,
                          &room->features_checked))
            continue;
        const char *bad = unusable_state(nd->node_state);
        if (bad != NULL) {
            append_node(room->unusable, sizeof(room->unusable), nd->name, bad);
            continue;
        }
        room->usable++;
    }
    rc = 0;
out:
    if (ex != NULL)
        slurm_hostlist_destroy(ex);
    if (parts != NULL)
        slurm_hostlist_destroy(parts);
    if (nm != NULL)
        slurm_free_node_info_msg(nm);
    if (pm != NULL)
        slurm_free_partition_info_msg(pm);
    if (jm != NULL)
        slurm_free_job_info_msg(jm);
    pthread_mutex_unlock(&lock);
    free(merged);
    return rc;
}

/* ---- cancel -------------------------------------------------------------- */

int dt_slurm_cancel(uint32_t id, dt_emsg_t *em)
{
    int rc = 0;

    pthread_mutex_lock(&lock);
    rpcs++;
    if (slurm_kill_job(id, SIGKILL, 0) != SLURM_SUCCESS) {
        int e = slurm_err(SLURM_ERROR);
        if (e != ESLURM_ALREADY_DONE)
            rc = fail(em, e, "slurm_kill_job", id);
    }
    pthread_mutex_unlock(&lock);
    return rc;
}

#endif /* HAVE_SLURM */
