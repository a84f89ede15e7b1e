/* SPDX-License-Identifier: MIT
 *
 * The Prometheus endpoint (coordinator/metrics.h) without a socket: the
 * formatter on hand-made snapshots (label values escaped, HELP and TYPE
 * once per family before its samples, unknown values left out), the
 * snapshot of a coordinator over a real SQLite file (live jobs in full,
 * the newest ended jobs by state only, no job name anywhere, agents'
 * heartbeat ages, a committed checkpoint's age), and the HTTP request
 * parser (200, 404, 405, 400, 431, and "need more" for every prefix of a
 * good request). The text format itself is checked by promtool in
 * tests/integration/metrics.sh.
 */
#include "config.h"

#include <criterion/criterion.h>
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "common/clock.h"
#include "common/mem.h"
#include "coordinator/jobs.h"
#include "coordinator/metrics.h"
#include "coordinator/recovery.h"
#include "db/db.h"

#define SPEC "kind = attn\nmodel = tiny\ntokens = 8192\nranks = 2\ngpu = cpu\n"

#define assert_has(s, sub) cr_assert(strstr((s), (sub)) != NULL, "no \"%s\" in:\n%s", (sub), (s))
#define assert_lacks(s, sub) cr_assert(strstr((s), (sub)) == NULL, "\"%s\" in:\n%s", (sub), (s))

/* ---- the formatter ------------------------------------------------------------- */

/* A live job whose numbers are all unknown. */
static dt_metrics_job_t unknown_job(int64_t id)
{
    dt_metrics_job_t j = { .id = id, .state = DT_JOB_RUNNING, .uid = 1000, .full = 1 };
    j.gen = j.step = j.steps = j.restarts = j.requeues = j.failures = -1;
    j.ckpt_step = j.ckpt_bytes = -1;
    j.tokens_s = j.loss = j.ettr = j.step_s = j.productive_s = j.recomputed_s = NAN;
    j.stall_s = j.detect_s = j.restart_s = j.load_s = j.ckpt_age_s = NAN;
    return j;
}

static dt_metrics_job_t known_job(int64_t id)
{
    dt_metrics_job_t j = unknown_job(id);
    j.gen = 2, j.step = 30, j.steps = 40, j.restarts = 1, j.requeues = 0, j.failures = 1;
    j.tokens_s = 1234.5, j.loss = 2.25, j.ettr = 0.75, j.step_s = 12, j.productive_s = 9;
    j.recomputed_s = 3, j.stall_s = 0.5, j.detect_s = 0.25, j.restart_s = 1, j.load_s = 2;
    j.ckpt_step = 20, j.ckpt_bytes = 4096, j.ckpt_age_s = 7.5;
    return j;
}

static char *format(const dt_metrics_snap_t *s)
{
    size_t len;
    char *t = dt_metrics_format(s, &len);
    cr_assert_eq(strlen(t), len);
    return t;
}

/* The value of the sample written exactly as `series` (name and labels),
 * NAN when there is none. */
static double sample(const char *text, const char *series)
{
    size_t n = strlen(series);
    for (const char *p = text; (p = strstr(p, series)) != NULL; p += n)
        if ((p == text || p[-1] == '\n') && p[n] == ' ')
            return strtod(p + n + 1, NULL);
    return NAN;
}

Test(metrics, label_values_are_escaped)
{
    char longname[400];
    memset(longname, 'x', sizeof(longname) - 1);
    longname[sizeof(longname) - 1] = '\0';
    dt_metrics_agent_t ag[] = {
        { .id = 1, .job = 7, .node = "a\\b\"c\nd\x01" "e\xff" "f\xc3\xa9g", .heartbeat_age_s = 1 },
        { .id = 2, .job = 7, .node = longname, .heartbeat_age_s = 1 },
        { .id = 3, .job = 7, .node = "} 1\ndt_job_state{job=\"9\"", .heartbeat_age_s = 1 },
    };
    dt_metrics_snap_t s = { .agents = ag, .nagents = 3, .live_agents = 3 };
    char *t = format(&s);

    assert_has(t, "dt_agent_slots{job=\"7\",agent=\"1\",node=\"a\\\\b\\\"c\\nd?e?f\xc3\xa9g\"} 0\n");
    /* cut at 255 bytes */
    char want[300];
    snprintf(want, sizeof(want), "agent=\"2\",node=\"%.255s\"}", longname);
    assert_has(t, want);
    snprintf(want, sizeof(want), "node=\"%.256s\"}", longname);
    assert_lacks(t, want);
    /* a node name cannot forge a line */
    assert_has(t, "node=\"} 1\\ndt_job_state{job=\\\"9\\\"\"} ");
    for (const char *p = t; *p; p++)
        cr_assert(*p == '\n' || ((unsigned char)*p >= 0x20 && *p != 0x7f), "a control byte");
    free(t);
}

Test(metrics, help_and_type_once_per_family_before_its_samples)
{
    dt_metrics_job_t jobs[] = { known_job(3), known_job(4),
                                { .id = 5, .state = DT_JOB_COMPLETED, .uid = 0 } };
    dt_metrics_agent_t ag[] = { { .id = 1, .job = 3, .node = "n1", .heartbeat_age_s = 0.5,
                                  .gpus = 8, .slots = 8 },
                                { .id = 2, .job = 4, .node = "n2", .heartbeat_age_s = 1.5,
                                  .gpus = 8, .slots = 8, .suspect = 1, .connected = 1 } };
    dt_metrics_snap_t s = { .jobs = jobs, .njobs = 3, .agents = ag, .nagents = 2 };
    char *t = format(&s), *save = NULL;
    char seen[64][80];
    int nseen = 0;
    char cur[80] = "", help[80] = "";

    for (char *line = strtok_r(t, "\n", &save); line; line = strtok_r(NULL, "\n", &save)) {
        char name[80], type[16];
        if (sscanf(line, "# HELP %79s", help) == 1)
            continue;
        if (sscanf(line, "# TYPE %79s %15s", name, type) == 2) {
            cr_assert_str_eq(help, name, "TYPE %s without its HELP line first", name);
            for (int i = 0; i < nseen; i++)
                cr_assert_str_neq(seen[i], name, "family %s declared twice", name);
            cr_assert_lt(nseen, 64);
            snprintf(seen[nseen++], sizeof(seen[0]), "%s", name);
            snprintf(cur, sizeof(cur), "%s", name);
            size_t n = strlen(name);
            int total = n > 6 && strcmp(name + n - 6, "_total") == 0;
            cr_assert_eq(total, strcmp(type, "counter") == 0, "%s is a %s", name, type);
            cr_assert(strncmp(name, "dt_", 3) == 0, "%s", name);
            continue;
        }
        cr_assert_neq(line[0], '#', "%s", line);
        size_t n = strcspn(line, "{ ");
        cr_assert(strlen(cur) == n && strncmp(line, cur, n) == 0,
                  "sample '%s' outside its family (the current one is %s)", line, cur);
    }
    cr_assert_gt(nseen, 25, "%d families", nseen);
    free(t);

    /* the values as given; the ended job only by its state */
    t = format(&s);
    cr_expect_eq(sample(t, "dt_job_step{job=\"3\"}"), 30);
    cr_expect_eq(sample(t, "dt_job_steps_planned{job=\"4\"}"), 40);
    cr_expect_eq(sample(t, "dt_job_tokens_per_second{job=\"3\"}"), 1234.5);
    cr_expect_eq(sample(t, "dt_job_loss{job=\"3\"}"), 2.25);
    cr_expect_eq(sample(t, "dt_job_ettr_ratio{job=\"3\"}"), 0.75);
    cr_expect_eq(sample(t, "dt_job_checkpoint_age_seconds{job=\"3\"}"), 7.5);
    cr_expect_eq(sample(t, "dt_job_checkpoint_stall_seconds_total{job=\"3\"}"), 0.5);
    cr_expect_eq(sample(t, "dt_job_failure_seconds_total{job=\"3\",phase=\"load\"}"), 2);
    cr_expect_eq(sample(t, "dt_job_restarts_total{job=\"4\"}"), 1);
    cr_expect_eq(sample(t, "dt_job_state{job=\"5\",state=\"completed\"}"), 1);
    cr_expect_eq(sample(t, "dt_job_info{job=\"5\",uid=\"0\"}"), 1);
    assert_lacks(t, "dt_job_step{job=\"5\"}");
    assert_lacks(t, "dt_job_restarts_total{job=\"5\"}");
    cr_expect_eq(sample(t, "dt_agent_heartbeat_age_seconds{job=\"4\",agent=\"2\",node=\"n2\"}"),
                 1.5);
    cr_expect_eq(sample(t, "dt_agent_suspect{job=\"4\",agent=\"2\",node=\"n2\"}"), 1);
    cr_expect_eq(sample(t, "dt_agent_gpus{job=\"3\",agent=\"1\",node=\"n1\"}"), 8);
    cr_expect_eq(sample(t, "dt_coordinator_jobs{state=\"running\"}"), 0);
    cr_expect_eq(sample(t, "dt_coordinator_connections{kind=\"metrics\"}"), 0);
    free(t);
}

Test(metrics, unknown_values_are_left_out)
{
    dt_metrics_job_t jobs[] = { unknown_job(3) };
    dt_metrics_snap_t s = { .jobs = jobs, .njobs = 1 };
    char *t = format(&s);

    cr_expect_eq(sample(t, "dt_job_state{job=\"3\",state=\"running\"}"), 1);
    /* nothing else of the job, not even the families' headers */
    assert_lacks(t, "dt_job_step");
    assert_lacks(t, "dt_job_loss");
    assert_lacks(t, "dt_job_ettr_ratio");
    assert_lacks(t, "dt_job_checkpoint");
    assert_lacks(t, "dt_job_failure");
    assert_lacks(t, "dt_agent_");
    assert_lacks(t, "NaN");
    assert_lacks(t, "nan");
    assert_lacks(t, "Inf");
    /* the coordinator's own families are always there */
    cr_expect_eq(sample(t, "dt_coordinator_scrapes_total"), 0);
    cr_expect_eq(sample(t, "dt_coordinator_scrape_jobs_omitted"), 0);
    free(t);
}

/* ---- the snapshot of a coordinator ---------------------------------------------- */

static char tmpdir[] = "/tmp/dt-metrics-XXXXXX";
static dt_coord_t coord;
static const dt_caller_t alice = { .uid = 1000, .gid = 1000 };

static int on_fault(dt_coord_t *c, int64_t job, const dt_fault_t *f)
{
    (void)c, (void)job, (void)f;
    return DT_ACT_NONE;
}

static void on_ended(dt_coord_t *c, int64_t job, int cancelled)
{
    (void)c, (void)job, (void)cancelled;
}

static const dt_coord_hooks_t hooks = { .fault = on_fault, .job_ended = on_ended };

static void setup(void)
{
    dt_emsg_t em = { "" };
    cr_assert_not_null(mkdtemp(tmpdir), "mkdtemp: %s", strerror(errno));
    char *db = dt_xasprintf("%s/dt.db", tmpdir);
    memset(&coord, 0, sizeof(coord));
    coord.hooks = &hooks;
    coord.jobs_fd = -1;
    coord.conf.jobs_dir = dt_xasprintf("%s/jobs", tmpdir);
    coord.started_ms = 1000;
    cr_assert_eq(dt_db_open(db, &coord.db, &em), 0, "%s", em.s);
    free(db);
}

static void teardown(void)
{
    char cmd[128];
    while (coord.agents)
        dt_coord_agent_remove(&coord, coord.agents->id);
    free(coord.agent_tab);
    dt_db_close(coord.db);
    free(coord.conf.jobs_dir);
    snprintf(cmd, sizeof(cmd), "rm -rf %s", tmpdir);
    cr_expect_eq(system(cmd), 0);
}

static int64_t submit(const char *name)
{
    dt_emsg_t em = { "" };
    dt_submitted_t s;
    cr_assert_eq(dt_jobs_submit(&coord, &alice, SPEC, name, false, &s, &em), 0, "%s", em.s);
    int64_t id = s.id;
    dt_submitted_clear(&s);
    return id;
}

Test(metrics, a_scrape_shows_live_jobs_in_full_and_the_newest_ended_by_state,
     .init = setup, .fini = teardown)
{
    dt_emsg_t em = { "" };
    int64_t ended[DT_METRICS_ENDED_MAX + 5];
    size_t nended = sizeof(ended) / sizeof(ended[0]);

    int64_t live = submit("se\"cret\\ name");
    for (size_t i = 0; i < nended; i++) {
        ended[i] = submit("se\"cret\\ name");
        cr_assert_eq(dt_db_job_transition(coord.db, ended[i], DT_JOB_CANCELLED, NULL, "test", &em),
                     0, "%s", em.s);
    }
    /* a committed checkpoint of the live job */
    cr_assert_eq(dt_db_shard_add(coord.db, live, 10, 0, "rank-0.safetensors", 4096,
                                 "0000000000000000000000000000000000000000000000000000000000000000",
                                 &em), 0, "%s", em.s);
    cr_assert_eq(dt_db_checkpoint_set_state(coord.db, live, 10, "committed", &em), 0, "%s", em.s);
    /* one live agent, heard 2.5 s before the scrape */
    dt_live_agent_t *a = dt_coord_agent_add(&coord, 42, live);
    snprintf(a->node, sizeof(a->node), "node\"1");
    a->slots = 2, a->gpus = 4, a->last_seen_ms = 10000;

    dt_metrics_snap_t s;
    int64_t wall = dt_clock_wall_ms() + 5000;
    cr_assert_eq(dt_metrics_collect(&coord, wall, 12500, &s, &em), 0, "%s", em.s);
    cr_expect_eq(s.njobs, 1 + DT_METRICS_ENDED_MAX);
    cr_expect_eq(s.jobs_omitted, 5);
    cr_expect_eq(s.jobs_by_state[DT_JOB_QUEUED], 1);
    cr_expect_eq(s.jobs_by_state[DT_JOB_CANCELLED], (int64_t)nended);
    cr_expect_eq(s.nagents, 1);
    cr_expect_eq(s.uptime_s, 11.5);
    size_t len;
    char *t = dt_metrics_format(&s, &len);
    dt_metrics_snap_clear(&s);

    char series[96];
    snprintf(series, sizeof(series), "dt_job_state{job=\"%lld\",state=\"queued\"}", (long long)live);
    cr_expect_eq(sample(t, series), 1);
    snprintf(series, sizeof(series), "dt_job_restarts_total{job=\"%lld\"}", (long long)live);
    cr_expect_eq(sample(t, series), 0);
    snprintf(series, sizeof(series), "dt_job_checkpoint_step{job=\"%lld\"}", (long long)live);
    cr_expect_eq(sample(t, series), 10);
    snprintf(series, sizeof(series), "dt_job_checkpoint_bytes{job=\"%lld\"}", (long long)live);
    cr_expect_eq(sample(t, series), 4096);
    snprintf(series, sizeof(series), "dt_job_checkpoint_age_seconds{job=\"%lld\"}",
             (long long)live);
    double age = sample(t, series);
    cr_expect(age >= 4.5 && age <= 6.5, "checkpoint age %g", age);
    /* the newest ended jobs by their state, the oldest five not at all */
    for (size_t i = 0; i < nended; i++) {
        snprintf(series, sizeof(series), "dt_job_state{job=\"%lld\",state=\"cancelled\"}",
                 (long long)ended[i]);
        if (i < 5)
            cr_expect(isnan(sample(t, series)), "%s shown", series);
        else
            cr_expect_eq(sample(t, series), 1, "%s", series);
        snprintf(series, sizeof(series), "dt_job_restarts_total{job=\"%lld\"}",
                 (long long)ended[i]);
        cr_expect(isnan(sample(t, series)), "%s shown", series);
    }
    cr_expect_eq(sample(t, "dt_coordinator_scrape_jobs_omitted"), 5);
    cr_expect_eq(sample(t, "dt_coordinator_jobs{state=\"cancelled\"}"), (double)nended);
    snprintf(series, sizeof(series),
             "dt_agent_heartbeat_age_seconds{job=\"%lld\",agent=\"42\",node=\"node\\\"1\"}",
             (long long)live);
    cr_expect_eq(sample(t, series), 2.5);
    snprintf(series, sizeof(series), "dt_agent_gpus{job=\"%lld\",agent=\"42\",node=\"node\\\"1\"}",
             (long long)live);
    cr_expect_eq(sample(t, series), 4);
    cr_expect_eq(sample(t, "dt_coordinator_agents"), 1);
    /* no job name, spec or path */
    assert_lacks(t, "cret");
    assert_lacks(t, "tiny");
    assert_lacks(t, "safetensors");
    assert_lacks(t, tmpdir);
    /* bounded: a line or so per family and series */
    cr_expect_lt(len, 16384, "%zu bytes", len);
    free(t);
}

/* ---- HTTP ------------------------------------------------------------------------ */

static int status(const char *req)
{
    return dt_metrics_http_status(req, strlen(req));
}

Test(metrics, http_get_metrics_is_200)
{
    cr_expect_eq(status("GET /metrics HTTP/1.1\r\nHost: 127.0.0.1:9\r\n\r\n"), 200);
    cr_expect_eq(status("GET /metrics HTTP/1.0\r\n\r\n"), 200);
    cr_expect_eq(status("GET /metrics?name[]=dt_job_step HTTP/1.1\r\nAccept: */*\r\n\r\n"), 200);
    cr_expect_eq(status("GET /metrics HTTP/1.1\nHost: x\n\n"), 200);
    /* what Prometheus sends */
    cr_expect_eq(status("GET /metrics HTTP/1.1\r\nHost: h:1\r\nUser-Agent: Prometheus/2.42.0\r\n"
                        "Accept: application/openmetrics-text;version=1.0.0,text/plain;"
                        "version=0.0.4;q=0.5,*/*;q=0.1\r\nAccept-Encoding: gzip\r\n"
                        "X-Prometheus-Scrape-Timeout-Seconds: 10\r\n\r\n"),
                 200);
    /* what follows the head is not looked at */
    cr_expect_eq(status("GET /metrics HTTP/1.1\r\n\r\n\x01garbage"), 200);
}

Test(metrics, http_waits_for_the_whole_head)
{
    const char *req = "GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n";
    for (size_t n = 0; n < strlen(req); n++)
        cr_expect_eq(dt_metrics_http_status(req, n), 0, "prefix of %zu bytes", n);
}

Test(metrics, http_other_paths_404_other_methods_405)
{
    cr_expect_eq(status("GET / HTTP/1.1\r\n\r\n"), 404);
    cr_expect_eq(status("GET /metricsx HTTP/1.1\r\n\r\n"), 404);
    cr_expect_eq(status("GET /metrics/ HTTP/1.1\r\n\r\n"), 404);
    cr_expect_eq(status("GET /api/v1/query HTTP/1.1\r\n\r\n"), 404);
    cr_expect_eq(status("POST /metrics HTTP/1.1\r\nContent-Length: 0\r\n\r\n"), 405);
    cr_expect_eq(status("HEAD /metrics HTTP/1.1\r\n\r\n"), 405);
    cr_expect_eq(status("get /metrics HTTP/1.1\r\n\r\n"), 405);
    cr_expect_eq(status("DELETE /x HTTP/1.1\r\n\r\n"), 405);
}

Test(metrics, http_malformed_is_400)
{
    static const char *const bad[] = {
        "GET /metrics\r\n\r\n",                       /* no version */
        "GET /metrics HTTP/2.0\r\n\r\n",              /* not 1.x */
        "GET /metrics HTTP/1.1 x\r\n\r\n",            /* more words */
        "GET  /metrics HTTP/1.1\r\n\r\n",             /* two spaces */
        "GET metrics HTTP/1.1\r\n\r\n",               /* not a path */
        "GET * HTTP/1.1\r\n\r\n",
        "GET http://h/metrics HTTP/1.1\r\n\r\n",
        "\r\nGET /metrics HTTP/1.1\r\n\r\n",          /* empty line first */
        "GET /metrics HTTP/1.1\r\nHost x\r\n\r\n",    /* header without a colon */
        "GET /metrics HTTP/1.1\r\n: x\r\n\r\n",       /* without a name */
        "GET /metrics HTTP/1.1\r\nHost : x\r\n\r\n",  /* space before the colon */
        "GET /metrics HTTP/1.1\r\nA: b\r\n c\r\n\r\n", /* folded */
        "GET /metrics HTTP/1.1\rHost: x\r\n\r\n",     /* bare CR */
        "GET /metrics HTTP/1.1\r\nA: \x01\r\n\r\n",   /* control character */
        "GET /met\x7frics HTTP/1.1\r\n\r\n",
        "GET /metrics HTTP/1.1\r\nA: b\x1b[2J\r\n\r\n",
        "VERYLONGMETHODNAMEX /metrics HTTP/1.1\r\n\r\n",
        "\x16\x03\x01\x02\x00\x01\x00\x01\xfc\x03\x03", /* a TLS ClientHello */
    };
    for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++)
        cr_expect_eq(status(bad[i]), 400, "request %zu: '%s'", i, bad[i]);
    /* a NUL is a control character too */
    cr_expect_eq(dt_metrics_http_status("GET /\0metrics HTTP/1.1\r\n\r\n", 26), 400);
    /* refused as soon as the bad byte or line is seen, not at the head's end */
    cr_expect_eq(status("\x16\x03"), 400);
    cr_expect_eq(status("GET /metrics HTTP/9.9\r\n"), 400);
}

Test(metrics, http_oversize_head_is_431)
{
    char *req = dt_xmalloc(2 * DT_METRICS_HEAD_MAX + 1);
    int n = snprintf(req, 64, "GET /metrics HTTP/1.1\r\nX-Pad: ");
    memset(req + n, 'a', 2 * DT_METRICS_HEAD_MAX - (size_t)n);
    req[2 * DT_METRICS_HEAD_MAX] = '\0';
    /* below the cap it may still end */
    cr_expect_eq(dt_metrics_http_status(req, DT_METRICS_HEAD_MAX - 1), 0);
    cr_expect_eq(dt_metrics_http_status(req, DT_METRICS_HEAD_MAX), 431);
    cr_expect_eq(dt_metrics_http_status(req, 2 * DT_METRICS_HEAD_MAX), 431);
    /* a head that ends exactly at the cap is fine */
    memcpy(req + DT_METRICS_HEAD_MAX - 4, "\r\n\r\n", 4);
    cr_expect_eq(dt_metrics_http_status(req, DT_METRICS_HEAD_MAX), 200);
    /* one that ends past it is not */
    memset(req + n, 'a', 2 * DT_METRICS_HEAD_MAX - (size_t)n);
    memcpy(req + DT_METRICS_HEAD_MAX - 2, "\r\n\r\n", 4);
    cr_expect_eq(dt_metrics_http_status(req, DT_METRICS_HEAD_MAX + 2), 431);
    free(req);
}
