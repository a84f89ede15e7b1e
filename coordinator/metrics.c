/* SPDX-License-Identifier: MIT
 *
 * The Prometheus endpoint (metrics.h): the snapshot of the coordinator,
 * its text exposition, and the one-request HTTP server that serves it.
 *
 * The numbers come from where dtctl gets them: each live job's SHOW reply
 * (dt_jobs_show: the job row, rank 0's progress, dt_jobs_goodput), its
 * checkpoints, the live agents and the open connections. Nothing is
 * computed again here but ages (now minus a recorded time).
 *
 * A scrape connection holds one fixed buffer for the request head and,
 * once answered, its reply; the loop never waits on it: a peer that sends
 * nothing, sends slowly or reads nothing is closed by the sweep when its
 * DT_METRICS_TIMEOUT_MS are up. After the reply is written the write side
 * is shut down and what the peer still sends is read and dropped until it
 * closes, so that a close never resets a reply in flight.
 */
#include "config.h"

#include <inttypes.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>

#include "common/clock.h"
#include "common/log.h"
#include "common/mem.h"
#include "common/text.h"
#include "coordinator/conn.h"
#include "coordinator/jobs.h"
#include "coordinator/listen.h"
#include "coordinator/metrics.h"
#include "coordinator/run.h"

/* ==== the exposition ===================================================== */

/* A growing text buffer. */
typedef struct out {
    char *p;
    size_t len, cap;
} out_t;

static void grow(out_t *o, size_t more)
{
    if (o->len + more + 1 <= o->cap)
        return;
    size_t cap = o->cap ? o->cap : 4096;
    while (cap < o->len + more + 1)
        cap *= 2;
    o->p = dt_xrealloc(o->p, cap);
    o->cap = cap;
}

static void putn(out_t *o, const char *s, size_t n)
{
    grow(o, n);
    memcpy(o->p + o->len, s, n);
    o->len += n;
    o->p[o->len] = '\0';
}

static void puts_(out_t *o, const char *s)
{
    putn(o, s, strlen(s));
}

static void putf(out_t *o, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void putf(out_t *o, const char *fmt, ...)
{
    va_list ap;
    char small[128];

    va_start(ap, fmt);
    int n = vsnprintf(small, sizeof(small), fmt, ap);
    va_end(ap);
    if (n < 0)
        return;
    if ((size_t)n < sizeof(small)) {
        putn(o, small, (size_t)n);
        return;
    }
    grow(o, (size_t)n);
    va_start(ap, fmt);
    vsnprintf(o->p + o->len, (size_t)n + 1, fmt, ap);
    va_end(ap);
    o->len += (size_t)n;
}

#define LABEL_MAX 255 /* bytes of a label value taken from outside */

/* A label value as the exposition format wants it: \\ \" and \n escaped;
 * other control characters and bytes that are not UTF-8 as '?'; at most
 * LABEL_MAX bytes of s, not cutting a character. */
static void put_label_value(out_t *o, const char *s)
{
    const unsigned char *u = (const unsigned char *)s;
    size_t n = strnlen(s, LABEL_MAX);

    for (size_t i = 0; i < n;) {
        unsigned char ch = u[i];
        if (ch == '\\' || ch == '"') {
            char e[2] = { '\\', (char)ch };
            putn(o, e, 2);
            i++;
        } else if (ch == '\n') {
            putn(o, "\\n", 2);
            i++;
        } else if (ch < 0x20 || ch == 0x7f) {
            putn(o, "?", 1);
            i++;
        } else {
            uint32_t cp;
            size_t k = dt_text_utf8_next(u + i, n - i, &cp);
            if (k == 0) {
                putn(o, "?", 1);
                i++;
            } else {
                putn(o, s + i, k);
                i += k;
            }
        }
    }
}

/* The families, in the order they are written. Names, types and units by
 * Prometheus' conventions: base units (seconds, bytes, ratios) in the
 * name, counters ending in _total. dtcoordd(8) METRICS lists them. */
enum fam {
    F_JOB_INFO,
    F_JOB_STATE,
    F_JOB_GEN,
    F_JOB_STEP,
    F_JOB_STEPS,
    F_JOB_TOKENS,
    F_JOB_LOSS,
    F_JOB_RESTARTS,
    F_JOB_REQUEUES,
    F_JOB_ETTR,
    F_JOB_STEP_S,
    F_JOB_PRODUCTIVE,
    F_JOB_RECOMPUTED,
    F_JOB_STALL,
    F_JOB_FAILURES,
    F_JOB_FAILURE_S,
    F_JOB_CKPT_AGE,
    F_JOB_CKPT_STEP,
    F_JOB_CKPT_BYTES,
    F_JOB_MEM_STEP,
    F_JOB_MEM_COVERAGE,
    F_JOB_MEM_REPLICAS,
    F_AGENT_HB,
    F_AGENT_CONNECTED,
    F_AGENT_GPUS,
    F_AGENT_SLOTS,
    F_AGENT_SUSPECT,
    F_UPTIME,
    F_AGENTS,
    F_JOBS,
    F_CONNS,
    F_QBYTES,
    F_QREPLIES,
    F_OVER_SOFT,
    F_SCRAPES,
    F_SCRAPES_REFUSED,
    F_JOBS_OMITTED,
    F_AGENTS_OMITTED,
    F_N
};

static const struct family {
    const char *name, *type, *help;
} fams[F_N] = {
    [F_JOB_INFO] = { "dt_job_info", "gauge", "A job shown: 1, with its owner's uid" },
    [F_JOB_STATE] = { "dt_job_state", "gauge", "The job's state: 1 for the state it is in" },
    [F_JOB_GEN] = { "dt_job_generation", "gauge",
                    "The job's current generation (1 + the restarts its workers had)" },
    [F_JOB_STEP] = { "dt_job_step", "gauge", "Steps rank 0 has done" },
    [F_JOB_STEPS] = { "dt_job_steps_planned", "gauge", "Steps the job runs in all" },
    [F_JOB_TOKENS] = { "dt_job_tokens_per_second", "gauge",
                       "Tokens per second of the job's last step (all rings)" },
    [F_JOB_LOSS] = { "dt_job_loss", "gauge", "Training loss of rank 0's last step" },
    [F_JOB_RESTARTS] = { "dt_job_restarts_total", "counter",
                         "Restarts after failures (new generations and requeues)" },
    [F_JOB_REQUEUES] = { "dt_job_requeues_total", "counter", "Requeues of the job's Slurm job" },
    [F_JOB_ETTR] = { "dt_job_ettr_ratio", "gauge",
                     "Effective training time ratio: productive step time over wall time "
                     "since the first step" },
    [F_JOB_STEP_S] = { "dt_job_step_seconds_total", "counter",
                       "Time spent in steps, recomputed ones included" },
    [F_JOB_PRODUCTIVE] = { "dt_job_productive_seconds", "gauge",
                           "Time of the steps kept (not redone after a failure)" },
    [F_JOB_RECOMPUTED] = { "dt_job_recomputed_seconds_total", "counter",
                           "Time of steps done again after a failure" },
    [F_JOB_STALL] = { "dt_job_checkpoint_stall_seconds_total", "counter",
                      "Time the steps stood still for checkpoints" },
    [F_JOB_FAILURES] = { "dt_job_failures_total", "counter", "Failures with a cost recorded" },
    [F_JOB_FAILURE_S] = { "dt_job_failure_seconds_total", "counter",
                          "Time failures cost, by phase: detect (fault to decision), restart "
                          "(decision to the next generation), load (its start to its first step)" },
    [F_JOB_CKPT_AGE] = { "dt_job_checkpoint_age_seconds", "gauge",
                         "Time since the newest committed checkpoint was committed" },
    [F_JOB_CKPT_STEP] = { "dt_job_checkpoint_step", "gauge",
                          "Step of the newest committed checkpoint" },
    [F_JOB_CKPT_BYTES] = { "dt_job_checkpoint_bytes", "gauge",
                           "Size of the newest committed checkpoint" },
    [F_JOB_MEM_STEP] = { "dt_job_memory_checkpoint_step", "gauge",
                         "Newest step whose in-memory checkpoint every rank's agent holds" },
    [F_JOB_MEM_COVERAGE] = { "dt_job_memory_checkpoint_coverage_ratio", "gauge",
                             "Share of the ranks whose agent holds a copy of the newest "
                             "in-memory step" },
    [F_JOB_MEM_REPLICAS] = { "dt_job_memory_replica_coverage_ratio", "gauge",
                             "Share of the ranks whose newest in-memory checkpoint also has a "
                             "replica on another agent" },
    [F_AGENT_HB] = { "dt_agent_heartbeat_age_seconds", "gauge",
                     "Time since the agent was last heard" },
    [F_AGENT_CONNECTED] = { "dt_agent_connected", "gauge", "1 while the agent is connected" },
    [F_AGENT_GPUS] = { "dt_agent_gpus", "gauge", "GPUs the agent's node registered" },
    [F_AGENT_SLOTS] = { "dt_agent_slots", "gauge", "Worker slots of the agent" },
    [F_AGENT_SUSPECT] = { "dt_agent_suspect", "gauge",
                          "1 when a GPU of the agent's node failed: no more ranks go there" },
    [F_UPTIME] = { "dt_coordinator_uptime_seconds", "gauge", "Time since dtcoordd started" },
    [F_AGENTS] = { "dt_coordinator_agents", "gauge", "Live agents, connected or not" },
    [F_JOBS] = { "dt_coordinator_jobs", "gauge", "Jobs in the database, by state" },
    [F_CONNS] = { "dt_coordinator_connections", "gauge", "Open connections, by kind" },
    [F_QBYTES] = { "dt_coordinator_output_queue_bytes", "gauge",
                   "Reply bytes written but not yet taken by the kernel, by kind" },
    [F_QREPLIES] = { "dt_coordinator_output_queue_replies", "gauge",
                     "Replies whose write has not completed, by kind" },
    [F_OVER_SOFT] = { "dt_coordinator_connections_over_soft_limit", "gauge",
                      "Peers not read because their unread replies exceed output_soft_limit" },
    [F_SCRAPES] = { "dt_coordinator_scrapes_total", "counter", "Metrics requests answered" },
    [F_SCRAPES_REFUSED] = { "dt_coordinator_scrapes_refused_total", "counter",
                            "Metrics connections refused: too many open" },
    [F_JOBS_OMITTED] = { "dt_coordinator_scrape_jobs_omitted", "gauge",
                         "Jobs left out of this scrape by its bounds" },
    [F_AGENTS_OMITTED] = { "dt_coordinator_scrape_agents_omitted", "gauge",
                           "Agents left out of this scrape by its bounds" },
};

static const char *const conn_kind[DT_MCONN_NKINDS] = {
    [DT_MCONN_UNIX] = "unix",
    [DT_MCONN_TCP] = "tcp",
    [DT_MCONN_AGENT] = "agent",
    [DT_MCONN_METRICS] = "metrics",
};

/* The writer: families in order, each one's header once before its first
 * sample. */
typedef struct wr {
    out_t o;
    int cur;    /* the family whose header was written last, -1 none */
    int labels; /* labels written in the sample being built */
} wr_t;

static void begin(wr_t *w, enum fam f)
{
    if (w->cur != (int)f) {
        w->cur = (int)f;
        putf(&w->o, "# HELP %s %s\n# TYPE %s %s\n", fams[f].name, fams[f].help, fams[f].name,
             fams[f].type);
    }
    puts_(&w->o, fams[f].name);
    w->labels = 0;
}

static void label_sep(wr_t *w)
{
    puts_(&w->o, w->labels++ ? "," : "{");
}

static void lint(wr_t *w, const char *name, int64_t v)
{
    label_sep(w);
    putf(&w->o, "%s=\"%" PRId64 "\"", name, v);
}

static void lstr(wr_t *w, const char *name, const char *v)
{
    label_sep(w);
    putf(&w->o, "%s=\"", name);
    put_label_value(&w->o, v ? v : "");
    puts_(&w->o, "\"");
}

static void end_int(wr_t *w, int64_t v)
{
    putf(&w->o, "%s %" PRId64 "\n", w->labels ? "}" : "", v);
}

static void end_real(wr_t *w, double v)
{
    /* 15 significant digits: as many as every double holds; -0 as 0 */
    putf(&w->o, "%s %.15g\n", w->labels ? "}" : "", v == 0 ? 0.0 : v);
}

/* One sample per job that knows the value: integers (unknown < 0) or
 * reals (unknown: not finite). */
static void job_int(wr_t *w, const dt_metrics_snap_t *s, enum fam f, size_t off)
{
    for (size_t i = 0; i < s->njobs; i++) {
        const dt_metrics_job_t *j = &s->jobs[i];
        int64_t v = *(const int64_t *)((const char *)j + off);
        if (!j->full || v < 0)
            continue;
        begin(w, f);
        lint(w, "job", j->id);
        end_int(w, v);
    }
}

static void job_real(wr_t *w, const dt_metrics_snap_t *s, enum fam f, size_t off)
{
    for (size_t i = 0; i < s->njobs; i++) {
        const dt_metrics_job_t *j = &s->jobs[i];
        double v = *(const double *)((const char *)j + off);
        if (!j->full || !isfinite(v))
            continue;
        begin(w, f);
        lint(w, "job", j->id);
        end_real(w, v);
    }
}

static void agent_int(wr_t *w, const dt_metrics_snap_t *s, enum fam f, size_t off)
{
    for (size_t i = 0; i < s->nagents; i++) {
        const dt_metrics_agent_t *a = &s->agents[i];
        begin(w, f);
        lint(w, "job", a->job);
        lint(w, "agent", a->id);
        lstr(w, "node", a->node);
        end_int(w, *(const int *)((const char *)a + off));
    }
}

static void by_kind(wr_t *w, enum fam f, const int64_t *v)
{
    for (int k = 0; k < DT_MCONN_NKINDS; k++) {
        begin(w, f);
        lstr(w, "kind", conn_kind[k]);
        end_int(w, v[k]);
    }
}

#define JOFF(field) offsetof(dt_metrics_job_t, field)
#define AOFF(field) offsetof(dt_metrics_agent_t, field)

char *dt_metrics_format(const dt_metrics_snap_t *s, size_t *len)
{
    wr_t w = { .cur = -1 };

    /* jobs */
    for (size_t i = 0; i < s->njobs; i++) {
        begin(&w, F_JOB_INFO);
        lint(&w, "job", s->jobs[i].id);
        lint(&w, "uid", s->jobs[i].uid);
        end_int(&w, 1);
    }
    for (size_t i = 0; i < s->njobs; i++) {
        begin(&w, F_JOB_STATE);
        lint(&w, "job", s->jobs[i].id);
        lstr(&w, "state", dt_job_state_name(s->jobs[i].state));
        end_int(&w, 1);
    }
    job_int(&w, s, F_JOB_GEN, JOFF(gen));
    job_int(&w, s, F_JOB_STEP, JOFF(step));
    job_int(&w, s, F_JOB_STEPS, JOFF(steps));
    job_real(&w, s, F_JOB_TOKENS, JOFF(tokens_s));
    job_real(&w, s, F_JOB_LOSS, JOFF(loss));
    job_int(&w, s, F_JOB_RESTARTS, JOFF(restarts));
    job_int(&w, s, F_JOB_REQUEUES, JOFF(requeues));
    job_real(&w, s, F_JOB_ETTR, JOFF(ettr));
    job_real(&w, s, F_JOB_STEP_S, JOFF(step_s));
    job_real(&w, s, F_JOB_PRODUCTIVE, JOFF(productive_s));
    job_real(&w, s, F_JOB_RECOMPUTED, JOFF(recomputed_s));
    job_real(&w, s, F_JOB_STALL, JOFF(stall_s));
    job_int(&w, s, F_JOB_FAILURES, JOFF(failures));
    for (size_t i = 0; i < s->njobs; i++) {
        const dt_metrics_job_t *j = &s->jobs[i];
        const struct {
            const char *phase;
            double v;
        } ph[] = { { "detect", j->detect_s }, { "restart", j->restart_s }, { "load", j->load_s } };
        for (size_t k = 0; j->full && k < sizeof(ph) / sizeof(ph[0]); k++) {
            if (!isfinite(ph[k].v))
                continue;
            begin(&w, F_JOB_FAILURE_S);
            lint(&w, "job", j->id);
            lstr(&w, "phase", ph[k].phase);
            end_real(&w, ph[k].v);
        }
    }
    job_real(&w, s, F_JOB_CKPT_AGE, JOFF(ckpt_age_s));
    job_int(&w, s, F_JOB_CKPT_STEP, JOFF(ckpt_step));
    job_int(&w, s, F_JOB_CKPT_BYTES, JOFF(ckpt_bytes));
    job_int(&w, s, F_JOB_MEM_STEP, JOFF(mem_step));
    job_real(&w, s, F_JOB_MEM_COVERAGE, JOFF(mem_coverage));
    job_real(&w, s, F_JOB_MEM_REPLICAS, JOFF(mem_replicas));

    /* agents */
    for (size_t i = 0; i < s->nagents; i++) {
        const dt_metrics_agent_t *a = &s->agents[i];
        if (!isfinite(a->heartbeat_age_s))
            continue;
        begin(&w, F_AGENT_HB);
        lint(&w, "job", a->job);
        lint(&w, "agent", a->id);
        lstr(&w, "node", a->node);
        end_real(&w, a->heartbeat_age_s);
    }
    agent_int(&w, s, F_AGENT_CONNECTED, AOFF(connected));
    agent_int(&w, s, F_AGENT_GPUS, AOFF(gpus));
    agent_int(&w, s, F_AGENT_SLOTS, AOFF(slots));
    agent_int(&w, s, F_AGENT_SUSPECT, AOFF(suspect));

    /* the coordinator */
    begin(&w, F_UPTIME);
    end_real(&w, s->uptime_s);
    begin(&w, F_AGENTS);
    end_int(&w, s->live_agents);
    for (int st = 0; st < DT_JOB_NSTATES; st++) {
        begin(&w, F_JOBS);
        lstr(&w, "state", dt_job_state_name((enum dt_job_state)st));
        end_int(&w, s->jobs_by_state[st]);
    }
    by_kind(&w, F_CONNS, s->conns);
    by_kind(&w, F_QBYTES, s->queued_bytes);
    by_kind(&w, F_QREPLIES, s->queued_replies);
    by_kind(&w, F_OVER_SOFT, s->over_soft);
    begin(&w, F_SCRAPES);
    end_int(&w, (int64_t)s->scrapes);
    begin(&w, F_SCRAPES_REFUSED);
    end_int(&w, (int64_t)s->scrapes_refused);
    begin(&w, F_JOBS_OMITTED);
    end_int(&w, s->jobs_omitted);
    begin(&w, F_AGENTS_OMITTED);
    end_int(&w, s->agents_omitted);

    *len = w.o.len;
    return w.o.p ? w.o.p : dt_xstrdup("");
}

/* ==== the snapshot ======================================================= */

/* A job seen in the list walk. */
typedef struct seen {
    int64_t id, uid;
    enum dt_job_state state;
} seen_t;

typedef struct walk {
    dt_metrics_snap_t *s;
    seen_t *live;
    size_t nlive, cap;
    seen_t ended[DT_METRICS_ENDED_MAX]; /* a ring: the newest ended jobs */
    size_t nended;
} walk_t;

static int walk_cb(const dt_job_t *j, void *arg)
{
    walk_t *w = arg;
    seen_t x = { .id = j->id, .uid = j->owner, .state = j->state };

    if (dt_job_state_valid(j->state))
        w->s->jobs_by_state[j->state]++;
    if (dt_job_state_terminal(j->state)) {
        w->ended[w->nended++ % DT_METRICS_ENDED_MAX] = x;
        return 0;
    }
    if (w->nlive == w->cap) {
        w->cap = w->cap ? 2 * w->cap : 64;
        w->live = dt_xrealloc(w->live, w->cap * sizeof(*w->live));
    }
    w->live[w->nlive++] = x;
    return 0;
}

/* Jobs with workers (or about to have them) before those that wait. */
static int busy(enum dt_job_state s)
{
    return s == DT_JOB_STARTING || s == DT_JOB_RUNNING || s == DT_JOB_RECOVERING;
}

static int by_busy_then_id(const void *a, const void *b)
{
    const seen_t *x = a, *y = b;
    if (busy(x->state) != busy(y->state))
        return busy(y->state) - busy(x->state);
    return (x->id > y->id) - (x->id < y->id);
}

static int by_id(const void *a, const void *b)
{
    const dt_metrics_job_t *x = a, *y = b;
    return (x->id > y->id) - (x->id < y->id);
}

static int by_job_agent(const void *a, const void *b)
{
    const dt_metrics_agent_t *x = a, *y = b;
    if (x->job != y->job)
        return (x->job > y->job) - (x->job < y->job);
    return (x->id > y->id) - (x->id < y->id);
}

static int64_t jint_or(const json_t *o, const char *k, int64_t dflt)
{
    const json_t *v = json_object_get(o, k);
    return json_is_integer(v) ? (int64_t)json_integer_value(v) : dflt;
}

/* A number of the reply (integer or real), NaN when absent or null. */
static double jnum(const json_t *o, const char *k)
{
    const json_t *v = json_object_get(o, k);
    return json_is_number(v) ? json_number_value(v) : NAN;
}

typedef struct newest {
    int64_t step, bytes, committed_ms;
} newest_t;

static int ckpt_cb(const dt_checkpoint_t *ck, void *arg)
{
    newest_t *n = arg;
    if (strcmp(ck->state, "committed") == 0 && ck->step > n->step) {
        n->step = ck->step;
        n->bytes = ck->bytes;
        n->committed_ms = ck->committed_ms;
    }
    return 0;
}

/* A live job in full, from what SHOW replies and its checkpoints. */
static void job_full(dt_coord_t *c, const seen_t *x, int64_t wall_ms, dt_metrics_job_t *m)
{
    dt_emsg_t em = { "" };
    dt_job_t j;

    m->full = 1;
    m->gen = m->step = m->steps = m->restarts = m->requeues = m->failures = -1;
    m->ckpt_step = m->ckpt_bytes = m->mem_step = -1;
    m->mem_coverage = m->mem_replicas = NAN;
    m->tokens_s = m->loss = m->ettr = m->step_s = m->productive_s = m->recomputed_s = NAN;
    m->stall_s = m->detect_s = m->restart_s = m->load_s = m->ckpt_age_s = NAN;
    if (dt_db_job_get(c->db, x->id, &j, &em) < 0) {
        dt_log_warn("job=%" PRId64 " metrics: %s", x->id, em.s);
        return;
    }
    m->state = j.state;
    json_t *show = dt_jobs_show(c, &j);
    dt_job_clear(&j);
    const json_t *job = json_object_get(show, "job");
    m->restarts = jint_or(job, "restarts", -1);
    m->requeues = jint_or(job, "requeues", -1);
    const json_t *gen = json_object_get(show, "gen");
    if (json_is_object(gen))
        m->gen = jint_or(gen, "gen", -1);
    const json_t *r0 = json_array_get(json_object_get(show, "ranks"), 0);
    if (json_is_object(r0)) {
        m->step = jint_or(r0, "step", -1);
        int64_t steps = jint_or(r0, "steps", -1);
        m->steps = steps > 0 ? steps : -1;
        double t = jnum(r0, "tokens_s");
        m->tokens_s = t > 0 ? t : NAN; /* 0: not reported (run.c) */
        m->loss = jnum(r0, "loss");
    }
    const json_t *g = json_object_get(show, "goodput");
    if (json_is_object(g)) {
        m->ettr = jnum(g, "ettr");
        m->step_s = jnum(g, "step_s");
        m->productive_s = jnum(g, "productive_s");
        m->recomputed_s = jnum(g, "recomputed_s");
        m->stall_s = jnum(g, "ckpt_stall_s");
        m->failures = jint_or(g, "failures", -1);
        m->detect_s = jnum(g, "detect_s");
        m->restart_s = jnum(g, "restart_s");
        m->load_s = jnum(g, "load_s");
    }
    json_decref(show);
    /* the in-memory checkpoints, while it has a run with them */
    int64_t ms;
    double cov, rep;
    dt_run_mem_state(c, x->id, &ms, &cov, &rep);
    if (ms > 0 || cov > 0) {
        m->mem_step = ms;
        m->mem_coverage = cov;
        m->mem_replicas = rep;
    }

    newest_t n = { 0, 0, 0 };
    if (dt_db_checkpoints(c->db, x->id, ckpt_cb, &n, &em) < 0) {
        dt_log_warn("job=%" PRId64 " metrics: checkpoints: %s", x->id, em.s);
    } else if (n.step > 0) {
        m->ckpt_step = n.step;
        m->ckpt_bytes = n.bytes;
        if (n.committed_ms > 0)
            m->ckpt_age_s =
                wall_ms > n.committed_ms ? (double)(wall_ms - n.committed_ms) / 1e3 : 0.0;
    }
}

static void conns(dt_coord_t *c, dt_metrics_snap_t *s)
{
    for (const dt_conn_t *k = c->conns; k; k = k->next) {
        if (k->closing)
            continue;
        int kind = k->agent ? DT_MCONN_AGENT : k->tcp ? DT_MCONN_TCP : DT_MCONN_UNIX;
        s->conns[kind]++;
        s->queued_bytes[kind] += (int64_t)k->h.stream.write_queue_size;
        s->queued_replies[kind] += (int64_t)k->writes;
        s->over_soft[kind] += k->over_ms != 0;
    }
}

static void scrape_conns(dt_coord_t *c, dt_metrics_snap_t *s);

int dt_metrics_collect(dt_coord_t *c, int64_t wall_ms, int64_t mono_ms, dt_metrics_snap_t *s,
                       dt_emsg_t *em)
{
    walk_t w = { .s = s };
    int rc;

    memset(s, 0, sizeof(*s));
    if ((rc = dt_db_job_list(c->db, -1, walk_cb, &w, em)) < 0) {
        free(w.live);
        memset(s, 0, sizeof(*s));
        return rc;
    }

    /* jobs: the live ones in full (busy first), the newest ended ones */
    if (w.nlive > 1) /* qsort takes no NULL, even for none */
        qsort(w.live, w.nlive, sizeof(*w.live), by_busy_then_id);
    size_t nfull = w.nlive < DT_METRICS_JOBS_MAX ? w.nlive : DT_METRICS_JOBS_MAX;
    size_t nend = w.nended < DT_METRICS_ENDED_MAX ? w.nended : DT_METRICS_ENDED_MAX;
    s->jobs_omitted = (int64_t)(w.nlive - nfull) + (int64_t)(w.nended - nend);
    s->jobs = dt_xcalloc(nfull + nend + 1, sizeof(*s->jobs));
    for (size_t i = 0; i < nfull; i++) {
        dt_metrics_job_t *m = &s->jobs[s->njobs++];
        m->id = w.live[i].id;
        m->uid = w.live[i].uid;
        m->state = w.live[i].state;
        job_full(c, &w.live[i], wall_ms, m);
    }
    for (size_t i = 0; i < nend; i++) {
        dt_metrics_job_t *m = &s->jobs[s->njobs++];
        const seen_t *x = &w.ended[(w.nended - nend + i) % DT_METRICS_ENDED_MAX];
        m->id = x->id;
        m->uid = x->uid;
        m->state = x->state;
    }
    free(w.live);
    qsort(s->jobs, s->njobs, sizeof(*s->jobs), by_id);

    /* agents */
    s->live_agents = (int64_t)c->nagents;
    size_t na = c->nagents < DT_METRICS_AGENTS_MAX ? c->nagents : DT_METRICS_AGENTS_MAX;
    s->agents = dt_xcalloc(na + 1, sizeof(*s->agents));
    for (const dt_live_agent_t *a = c->agents; a; a = a->next) {
        if (s->nagents == na) {
            s->agents_omitted++;
            continue;
        }
        dt_metrics_agent_t *m = &s->agents[s->nagents++];
        m->id = a->id;
        m->job = a->job;
        m->node = a->node;
        m->heartbeat_age_s = a->last_seen_ms > 0 && mono_ms >= a->last_seen_ms
                                 ? (double)(mono_ms - a->last_seen_ms) / 1e3
                                 : NAN;
        m->gpus = a->gpus;
        m->slots = a->slots;
        m->suspect = a->suspect != 0;
        m->connected = a->conn != NULL;
    }
    qsort(s->agents, s->nagents, sizeof(*s->agents), by_job_agent);

    /* the coordinator */
    conns(c, s);
    scrape_conns(c, s);
    s->uptime_s = mono_ms > c->started_ms ? (double)(mono_ms - c->started_ms) / 1e3 : 0.0;
    s->scrapes = c->scrapes_total;
    s->scrapes_refused = c->scrapes_refused;
    return 0;
}

void dt_metrics_snap_clear(dt_metrics_snap_t *s)
{
    free(s->jobs);
    free(s->agents);
    memset(s, 0, sizeof(*s));
}

/* ==== HTTP ================================================================ */

static int tchar(unsigned char ch)
{
    return (ch >= 'a' && ch <= 'z') || (ch >= 'A' && ch <= 'Z') || (ch >= '0' && ch <= '9') ||
           (ch != 0 && strchr("!#$%&'*+-.^_`|~", ch) != NULL);
}

/* The request line, [p, e) without its line end: 0 (well formed, *get and
 * *metrics set) or 400. */
static int request_line(const char *p, const char *e, int *get, int *metrics)
{
    const char *sp1 = memchr(p, ' ', (size_t)(e - p));
    if (sp1 == NULL || sp1 == p || sp1 - p > 16)
        return 400;
    for (const char *q = p; q < sp1; q++)
        if (!tchar((unsigned char)*q))
            return 400;
    const char *t = sp1 + 1;
    const char *sp2 = memchr(t, ' ', (size_t)(e - t));
    if (sp2 == NULL || sp2 == t || *t != '/')
        return 400;
    for (const char *q = t; q < sp2; q++)
        if ((unsigned char)*q <= 0x20 || (unsigned char)*q >= 0x7f)
            return 400;
    const char *v = sp2 + 1;
    if (e - v != 8 || memcmp(v, "HTTP/1.", 7) != 0 || v[7] < '0' || v[7] > '9')
        return 400;
    *get = sp1 - p == 3 && memcmp(p, "GET", 3) == 0;
    size_t plen = (size_t)(sp2 - t);
    const char *qm = memchr(t, '?', plen);
    if (qm)
        plen = (size_t)(qm - t);
    *metrics = plen == 8 && memcmp(t, "/metrics", 8) == 0;
    return 0;
}

/* A header line, [p, e) without its line end: 0 or 400. */
static int header_line(const char *p, const char *e)
{
    const char *q = p;
    while (q < e && tchar((unsigned char)*q))
        q++;
    return q > p && q < e && *q == ':' ? 0 : 400;
}

int dt_metrics_http_status(const char *buf, size_t len)
{
    size_t n = len < DT_METRICS_HEAD_MAX ? len : DT_METRICS_HEAD_MAX;
    int get = 0, metrics = 0, line = 0;

    /* line by line, as far as the bytes go: a bad byte or a bad line is
     * refused as soon as it is seen */
    for (size_t i = 0, start = 0; i < n; i++) {
        unsigned char ch = (unsigned char)buf[i];
        if (ch == '\r') {
            if (i + 1 < n && buf[i + 1] != '\n')
                return 400; /* a bare CR */
            continue;
        }
        if (ch != '\n') {
            if ((ch < 0x20 && ch != '\t') || ch == 0x7f)
                return 400;
            if (i == start && line > 0 && (ch == ' ' || ch == '\t'))
                return 400; /* a folded header line */
            continue;
        }
        size_t end = i > start && buf[i - 1] == '\r' ? i - 1 : i;
        if (end == start) {
            if (line == 0)
                return 400; /* an empty line before the request */
            /* the head is complete */
            if (!get)
                return 405;
            return metrics ? 200 : 404;
        }
        int rc = line == 0 ? request_line(buf + start, buf + end, &get, &metrics)
                           : header_line(buf + start, buf + end);
        if (rc)
            return rc;
        line++;
        start = i + 1;
    }
    return len >= DT_METRICS_HEAD_MAX ? 431 : 0;
}

/* ==== the server ========================================================= */

typedef struct dt_scrape {
    uv_tcp_t tcp;
    dt_coord_t *coord;
    uint64_t accepted_ms; /* loop time */
    int closing;
    int answered; /* the reply is written or being written */
    size_t len;   /* bytes of the head received */
    char head[DT_METRICS_HEAD_MAX];
    char *reply;
    size_t reply_len;
    uv_write_t wr;
    uv_shutdown_t sd;
    char peer[64];
    struct dt_scrape *next;
} dt_scrape_t;

static void scrape_conns(dt_coord_t *c, dt_metrics_snap_t *s)
{
    for (const dt_scrape_t *k = c->scrapes; k; k = k->next) {
        if (k->closing)
            continue;
        s->conns[DT_MCONN_METRICS]++;
        s->queued_bytes[DT_MCONN_METRICS] += (int64_t)k->tcp.write_queue_size;
        s->queued_replies[DT_MCONN_METRICS] += k->answered && k->reply != NULL;
    }
}

static void on_closed(uv_handle_t *h)
{
    dt_scrape_t *k = h->data;
    dt_coord_t *c = k->coord;

    for (dt_scrape_t **p = &c->scrapes; *p; p = &(*p)->next)
        if (*p == k) {
            *p = k->next;
            break;
        }
    c->nscrapes--;
    free(k->reply);
    free(k);
}

static void scrape_close(dt_scrape_t *k)
{
    if (k->closing)
        return;
    k->closing = 1;
    uv_close((uv_handle_t *)&k->tcp, on_closed);
}

static const char *reason(int status)
{
    switch (status) {
    case 200:
        return "OK";
    case 400:
        return "Bad Request";
    case 404:
        return "Not Found";
    case 405:
        return "Method Not Allowed";
    case 431:
        return "Request Header Fields Too Large";
    case 500:
        return "Internal Server Error";
    case 503:
        return "Service Unavailable";
    }
    return "Error";
}

/* The whole reply: status line, headers, body (taken, freed here). */
static char *http_reply(int status, char *body, size_t blen, size_t *len)
{
    out_t o = { 0 };

    if (body == NULL) {
        body = dt_xasprintf("%d %s: this is dtcoordd's metrics endpoint, only GET /metrics\n",
                            status, reason(status));
        blen = strlen(body);
    }
    putf(&o, "HTTP/1.1 %d %s\r\n", status, reason(status));
    puts_(&o, status == 200 ? "Content-Type: text/plain; version=0.0.4; charset=utf-8\r\n"
                            : "Content-Type: text/plain; charset=utf-8\r\n");
    if (status == 405)
        puts_(&o, "Allow: GET\r\n");
    putf(&o, "Content-Length: %zu\r\nCache-Control: no-store\r\nConnection: close\r\n\r\n", blen);
    putn(&o, body, blen);
    free(body);
    *len = o.len;
    return o.p;
}

static void on_discard_alloc(uv_handle_t *h, size_t hint, uv_buf_t *b)
{
    dt_scrape_t *k = h->data;
    (void)hint;
    *b = uv_buf_init(k->head, sizeof(k->head));
}

/* After the reply: whatever the peer still sends is dropped; its EOF (or
 * the sweep) ends the connection. */
static void on_discard(uv_stream_t *s, ssize_t n, const uv_buf_t *b)
{
    (void)b;
    if (n < 0)
        scrape_close(s->data);
}

static void on_shutdown(uv_shutdown_t *sd, int status)
{
    dt_scrape_t *k = sd->data;

    if (k->closing)
        return;
    if (status < 0 || uv_read_start((uv_stream_t *)&k->tcp, on_discard_alloc, on_discard) < 0)
        scrape_close(k);
}

static void on_written(uv_write_t *w, int status)
{
    dt_scrape_t *k = w->data;

    free(k->reply);
    k->reply = NULL;
    if (k->closing)
        return;
    if (status < 0) {
        dt_log_debug("metrics peer=%s went away: %s", k->peer, uv_strerror(status));
        scrape_close(k);
        return;
    }
    k->sd.data = k;
    if (uv_shutdown(&k->sd, (uv_stream_t *)&k->tcp, on_shutdown) < 0)
        scrape_close(k);
}

static void answer(dt_scrape_t *k, int status)
{
    dt_coord_t *c = k->coord;
    char *body = NULL;
    size_t blen = 0;

    uv_read_stop((uv_stream_t *)&k->tcp);
    k->answered = 1;
    if (status == 200) {
        dt_metrics_snap_t s;
        dt_emsg_t em = { "" };
        c->scrapes_total++;
        if (dt_metrics_collect(c, dt_clock_wall_ms(), dt_clock_mono_ms(), &s, &em) < 0) {
            dt_log_warn("metrics peer=%s: %s", k->peer, em.s);
            status = 500;
        } else {
            body = dt_metrics_format(&s, &blen);
            dt_metrics_snap_clear(&s);
        }
    }
    dt_log_debug("metrics peer=%s %d %zu bytes", k->peer, status, blen);
    k->reply = http_reply(status, body, blen, &k->reply_len);
    uv_buf_t b = uv_buf_init(k->reply, (unsigned)k->reply_len);
    k->wr.data = k;
    if (uv_write(&k->wr, (uv_stream_t *)&k->tcp, &b, 1, on_written) < 0) {
        free(k->reply);
        k->reply = NULL;
        scrape_close(k);
    }
}

static void on_alloc(uv_handle_t *h, size_t hint, uv_buf_t *b)
{
    dt_scrape_t *k = h->data;
    (void)hint;
    /* never full while reading: a full head has been answered (431) */
    *b = uv_buf_init(k->head + k->len, (unsigned)(sizeof(k->head) - k->len));
}

static void on_read(uv_stream_t *s, ssize_t n, const uv_buf_t *b)
{
    dt_scrape_t *k = s->data;

    (void)b;
    if (n < 0) { /* gone before a whole request: nothing to answer */
        scrape_close(k);
        return;
    }
    k->len += (size_t)n;
    int status = dt_metrics_http_status(k->head, k->len);
    if (status != 0)
        answer(k, status);
}

static void peer_name(dt_scrape_t *k)
{
    struct sockaddr_storage ss;
    int len = sizeof(ss);
    char host[48] = "?";
    int port = 0;

    if (uv_tcp_getpeername(&k->tcp, (struct sockaddr *)&ss, &len) == 0) {
        if (ss.ss_family == AF_INET) {
            uv_ip4_name((struct sockaddr_in *)&ss, host, sizeof(host));
            port = ntohs(((struct sockaddr_in *)&ss)->sin_port);
        } else if (ss.ss_family == AF_INET6) {
            uv_ip6_name((struct sockaddr_in6 *)&ss, host, sizeof(host));
            port = ntohs(((struct sockaddr_in6 *)&ss)->sin6_port);
        }
    }
    snprintf(k->peer, sizeof(k->peer), "%s:%d", host, port);
}

static void on_connection(uv_stream_t *srv, int status)
{
    dt_coord_t *c = srv->data;

    if (status < 0)
        return;
    dt_scrape_t *k = dt_xcalloc(1, sizeof(*k));
    k->coord = c;
    k->accepted_ms = uv_now(c->loop);
    if (uv_tcp_init(c->loop, &k->tcp) < 0) {
        free(k);
        return;
    }
    k->tcp.data = k;
    k->next = c->scrapes;
    c->scrapes = k;
    c->nscrapes++;
    if (uv_accept(srv, (uv_stream_t *)&k->tcp) < 0) {
        scrape_close(k);
        return;
    }
    peer_name(k);
    if (c->nscrapes > DT_METRICS_CONNS_MAX) {
        /* one more than the bound: told so at once (a fresh socket's
         * buffer takes this much), never read */
        size_t len;
        char *r = http_reply(503, NULL, 0, &len);
        uv_buf_t b = uv_buf_init(r, (unsigned)len);
        uv_try_write((uv_stream_t *)&k->tcp, &b, 1);
        free(r);
        c->scrapes_refused++;
        dt_log_debug("metrics peer=%s refused: %d connections open", k->peer, DT_METRICS_CONNS_MAX);
        scrape_close(k);
        return;
    }
    if (uv_read_start((uv_stream_t *)&k->tcp, on_alloc, on_read) < 0)
        scrape_close(k);
}

int dt_metrics_listen(dt_coord_t *c, const char *hostport, dt_emsg_t *em)
{
    struct sockaddr_storage ss;
    int rc;

    if ((rc = dt_listen_parse(hostport, &ss, em)) < 0) {
        char why[sizeof(em->s)];
        snprintf(why, sizeof(why), "%s", em->s);
        return dt_emsg_set(em, rc, "metrics_listen: %s", why);
    }
    if ((rc = uv_tcp_init(c->loop, &c->metrics_srv)) < 0)
        return dt_emsg_set(em, DT_EIO, "uv_tcp_init: %s", uv_strerror(rc));
    c->metrics_srv.data = c;
    c->have_metrics = 1;
    if ((rc = uv_tcp_bind(&c->metrics_srv, (struct sockaddr *)&ss, 0)) < 0 ||
        (rc = uv_listen((uv_stream_t *)&c->metrics_srv, 16, on_connection)) < 0)
        return dt_emsg_set(em, rc == UV_EADDRINUSE ? DT_EEXIST : DT_EIO, "metrics_listen = %s: %s",
                           hostport, uv_strerror(rc));
    /* the address bound, the port the system chose for port 0 */
    int len = sizeof(ss);
    char host[48] = "?";
    int port = 0;
    if (uv_tcp_getsockname(&c->metrics_srv, (struct sockaddr *)&ss, &len) == 0) {
        if (ss.ss_family == AF_INET) {
            uv_ip4_name((struct sockaddr_in *)&ss, host, sizeof(host));
            port = ntohs(((struct sockaddr_in *)&ss)->sin_port);
        } else {
            uv_ip6_name((struct sockaddr_in6 *)&ss, host, sizeof(host));
            port = ntohs(((struct sockaddr_in6 *)&ss)->sin6_port);
        }
    }
    dt_log_info("metrics listening on %s%s%s:%d (GET /metrics, no authentication)",
                ss.ss_family == AF_INET6 ? "[" : "", host, ss.ss_family == AF_INET6 ? "]" : "",
                port);
    return 0;
}

void dt_metrics_close(dt_coord_t *c)
{
    if (c->have_metrics) {
        c->have_metrics = 0;
        uv_close((uv_handle_t *)&c->metrics_srv, NULL);
    }
    for (dt_scrape_t *k = c->scrapes; k; k = k->next)
        scrape_close(k);
}

void dt_metrics_sweep(dt_coord_t *c)
{
    uint64_t now = uv_now(c->loop);

    for (dt_scrape_t *k = c->scrapes; k; k = k->next) /* closing unlinks later */
        if (!k->closing && now - k->accepted_ms >= DT_METRICS_TIMEOUT_MS) {
            dt_log_debug("metrics peer=%s closed: open for %llu ms (%s)", k->peer,
                         (unsigned long long)(now - k->accepted_ms),
                         k->answered ? "reply not taken" : "no whole request");
            scrape_close(k);
        }
}
