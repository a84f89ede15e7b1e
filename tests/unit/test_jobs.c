/* SPDX-License-Identifier: MIT
 *
 * The coordinator's domain operations on jobs (coordinator/jobs.h) on a
 * real SQLite file, without a connection or a loop: submit (stored,
 * planned, queued; a dry run stores nothing; a spec that does not plan is
 * refused and leaves no row), visibility, list, cancel, resume and the
 * events each leaves, and the history dtctl plot draws. No live agents
 * and no Slurm (slurm = no).
 */
#include "config.h"

#include <criterion/criterion.h>
#include <errno.h>
#include <fcntl.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "common/mem.h"
#include "coordinator/jobs.h"
#include "coordinator/recovery.h"
#include "db/db.h"

#define SPEC "name = t\nkind = attn\nmodel = tiny\ntokens = 8192\nranks = 2\ngpu = cpu\n"

static char tmpdir[] = "/tmp/dt-jobs-XXXXXX";
static dt_coord_t coord;
static const dt_caller_t alice = { .uid = 1000, .gid = 1000 }, bob = { .uid = 1001, .gid = 1001 };
static int faults, ended;

static int on_fault(dt_coord_t *c, int64_t job, const dt_fault_t *f)
{
    (void)c, (void)job, (void)f;
    faults++;
    return DT_ACT_NONE;
}

static void on_ended(dt_coord_t *c, int64_t job, int cancelled)
{
    (void)c, (void)job, (void)cancelled;
    ended++;
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
    cr_assert_eq(dt_db_open(db, &coord.db, &em), 0, "%s", em.s);
    free(db);
    faults = ended = 0;
}

static void teardown(void)
{
    char cmd[128];
    dt_db_close(coord.db);
    free(coord.conf.jobs_dir);
    snprintf(cmd, sizeof(cmd), "rm -rf %s", tmpdir);
    cr_expect_eq(system(cmd), 0);
}

static int64_t submit(const dt_caller_t *who, const char *spec)
{
    dt_emsg_t em = { "" };
    dt_submitted_t s;
    int rc = dt_jobs_submit(&coord, who, spec, NULL, false, &s, &em);
    cr_assert_eq(rc, 0, "submit: %s", em.s);
    cr_assert_gt(s.id, 0);
    cr_assert_not_null(s.plan);
    cr_assert_eq(json_integer_value(json_object_get(s.plan, "ranks")), 2);
    int64_t id = s.id;
    dt_submitted_clear(&s);
    return id;
}

/* The kinds of the job's events, space-separated. */
static void kinds(int64_t job, char *buf, size_t n)
{
    dt_emsg_t em = { "" };
    json_t *evs, *e;
    size_t i;

    cr_assert_eq(dt_jobs_events(&coord, job, 0, &evs, &em), 0, "%s", em.s);
    buf[0] = '\0';
    json_array_foreach(evs, i, e) {
        size_t l = strlen(buf);
        snprintf(buf + l, n - l, "%s%s", l ? " " : "", json_string_value(json_object_get(e, "kind")));
    }
    json_decref(evs);
}

TestSuite(jobs, .init = setup, .fini = teardown);

Test(jobs, submit_stores_plans_and_queues)
{
    dt_emsg_t em = { "" };
    dt_job_t j;
    char k[256];
    int64_t id = submit(&alice, SPEC);

    cr_assert_eq(dt_jobs_get(&coord, &alice, id, &j, &em), 0, "%s", em.s);
    cr_expect_eq(j.state, DT_JOB_QUEUED);
    cr_expect_eq(j.owner, alice.uid);
    cr_expect_str_eq(j.name, "t");
    cr_expect_not_null(j.plan);
    dt_job_clear(&j);
    kinds(id, k, sizeof(k));
    cr_expect_str_eq(k, "submitted planned queued");
}

Test(jobs, a_dry_run_and_a_refusal_store_nothing)
{
    dt_emsg_t em = { "" };
    dt_submitted_t s;
    json_t *list;

    /* slurm = no: a dry run has nothing to describe */
    cr_expect_eq(dt_jobs_submit(&coord, &alice, SPEC, NULL, true, &s, &em), DT_ENOTSUP, "%s",
                 em.s);
    cr_expect(!s.refused);
    dt_submitted_clear(&s);
    /* a spec the planner refuses: refused, with its reason */
    cr_expect_lt(dt_jobs_submit(&coord, &alice, "kind = attn\ntokens = 8192\nranks = 3\n", NULL,
                                false, &s, &em), 0);
    cr_expect(s.refused, "not refused: %s", em.s);
    cr_expect_neq(em.s[0], '\0');
    dt_submitted_clear(&s);
    /* a spec that does not parse: an error, not a refusal */
    cr_expect_lt(dt_jobs_submit(&coord, &alice, "frobnicate = 3\n", NULL, false, &s, &em), 0);
    cr_expect(!s.refused);
    dt_submitted_clear(&s);
    cr_assert_eq(dt_jobs_list(&coord, &alice, &list, &em), 0, "%s", em.s);
    cr_expect_eq(json_array_size(list), 0);
    json_decref(list);
}

Test(jobs, visibility_list_and_names)
{
    dt_emsg_t em = { "" };
    dt_submitted_t s;
    dt_job_t j;
    json_t *list;
    int64_t a = submit(&alice, SPEC), b = submit(&bob, SPEC);

    cr_expect_eq(dt_jobs_get(&coord, &bob, a, &j, &em), DT_EPERM);
    cr_expect(strstr(em.s, "permission denied") != NULL, "%s", em.s);
    cr_expect_eq(dt_jobs_get(&coord, &alice, 999, &j, &em), DT_ENOENT);
    cr_expect(strstr(em.s, "job 999 not found") != NULL, "%s", em.s);
    cr_assert_eq(dt_jobs_list(&coord, &alice, &list, &em), 0, "%s", em.s);
    cr_expect_eq(json_array_size(list), 1);
    cr_expect_eq(json_integer_value(json_object_get(json_array_get(list, 0), "id")), a);
    json_decref(list);
    /* root sees all */
    dt_caller_t root = { 0, 0 };
    cr_assert_eq(dt_jobs_list(&coord, &root, &list, &em), 0, "%s", em.s);
    cr_expect_eq(json_array_size(list), 2);
    json_decref(list);
    cr_expect_eq(dt_jobs_get(&coord, &root, b, &j, &em), 0, "%s", em.s);
    dt_job_clear(&j);
    /* a name given with the request replaces the spec's */
    cr_assert_eq(dt_jobs_submit(&coord, &alice, SPEC, "renamed", false, &s, &em), 0, "%s", em.s);
    cr_assert_eq(dt_jobs_get(&coord, &alice, s.id, &j, &em), 0, "%s", em.s);
    cr_expect_str_eq(j.name, "renamed");
    dt_job_clear(&j);
    dt_submitted_clear(&s);
}

Test(jobs, cancel_then_resume)
{
    dt_emsg_t em = { "" };
    dt_job_t j;
    bool stopping;
    int64_t step = -1;
    char k[256];
    int64_t id = submit(&alice, SPEC);

    cr_assert_eq(dt_jobs_get(&coord, &alice, id, &j, &em), 0, "%s", em.s);
    /* resume wants a failed or cancelled job */
    cr_expect_eq(dt_jobs_resume(&coord, &alice, &j, &step, &em), DT_ESTATE);
    /* nothing runs: no planned stop */
    cr_expect_eq(dt_jobs_cancel(&coord, &alice, &j, NULL, true, &stopping, &em), DT_ESTATE);
    cr_expect_eq(dt_jobs_cancel(&coord, &alice, &j, "enough", false, &stopping, &em), 0, "%s",
                 em.s);
    cr_expect(!stopping);
    dt_job_clear(&j);
    cr_assert_eq(dt_jobs_get(&coord, &alice, id, &j, &em), 0, "%s", em.s);
    cr_expect_eq(j.state, DT_JOB_CANCELLED);
    cr_expect(strstr(j.reason, "cancelled by uid 1000: enough") != NULL, "%s", j.reason);
    cr_expect_eq(dt_jobs_cancel(&coord, &alice, &j, NULL, false, &stopping, &em), DT_ESTATE);
    cr_expect(strstr(em.s, "already cancelled") != NULL, "%s", em.s);
    cr_assert_eq(dt_jobs_resume(&coord, &alice, &j, &step, &em), 0, "%s", em.s);
    cr_expect_eq(step, 0);
    dt_job_clear(&j);
    cr_assert_eq(dt_jobs_get(&coord, &alice, id, &j, &em), 0, "%s", em.s);
    cr_expect_eq(j.state, DT_JOB_QUEUED);
    dt_job_clear(&j);
    kinds(id, k, sizeof(k));
    cr_expect_str_eq(k, "submitted planned queued cancelled resumed");
    /* no fault and no generation were involved */
    cr_expect_eq(faults, 0);
    /* no checkpoint was asked of a job that does not run */
    int gen;
    cr_expect_eq(dt_jobs_checkpoint(&coord, id, &gen, &em), DT_ESTATE);
}

/* HISTORY's document: the steps (a loss not reported is null), the
 * generations, each failure's cost with when its generation ended and
 * when the fault was, the checkpoints, goodput and nothing left out. */
Test(jobs, history_document)
{
    dt_emsg_t em = { "" };
    int64_t id = submit(&alice, SPEC), agent;
    dt_job_t j;
    json_t *h;

    cr_assert_eq(dt_jobs_get(&coord, &alice, id, &j, &em), 0, "%s", em.s);
    cr_assert_eq(dt_jobs_history(&coord, &j, &h, &em), 0, "%s", em.s);
    cr_assert_eq(json_array_size(json_object_get(h, "steps")), 0, "no step yet");
    cr_assert(json_is_null(json_object_get(json_object_get(h, "goodput"), "ettr")));
    json_decref(h);

    cr_assert_eq(dt_db_agent_register(coord.db, id, "n1", 1, &agent, &em), 0, "%s", em.s);
    cr_assert_eq(dt_db_gen_begin(coord.db, id, 1, 1, &agent, 0, &em), 0, "%s", em.s);
    int64_t at = 1700000000000;
    for (int k = 1; k <= 4; k++) {
        dt_step_row_t s = { .job = id, .gen = 1, .step = k, .at_ms = at + 100 * k,
                            .step_ms = 100, .loss = k == 2 ? NAN : 1.0 / k, .tokens_s = 500 };
        cr_assert_eq(dt_db_step_add(coord.db, &s, 0, &em), 0, "%s", em.s);
    }
    cr_assert_eq(dt_db_shard_add(coord.db, id, 2, 0, "/x", 1, "0123456789abcdef0123456789abcdef"
                                 "0123456789abcdef0123456789abcdef", &em), 0, "%s", em.s);
    cr_assert_eq(dt_db_checkpoint_set_state(coord.db, id, 2, "committed", &em), 0, "%s", em.s);
    cr_assert_eq(dt_db_gen_end(coord.db, id, 1, "rank 0 failed", &em), 0, "%s", em.s);
    cr_assert_eq(dt_db_gen_begin(coord.db, id, 2, 1, &agent, 2, &em), 0, "%s", em.s);
    dt_gen_t g;
    cr_assert_eq(dt_db_gen_last(coord.db, id, &g, &em), 0, "%s", em.s);
    int64_t started = g.started_ms;
    dt_gen_clear(&g);
    dt_step_row_t s3 = { .job = id, .gen = 2, .step = 3, .at_ms = started + 1500, .step_ms = 100,
                         .loss = 0.3, .tokens_s = NAN };
    cr_assert_eq(dt_db_step_add(coord.db, &s3, 0, &em), 0, "%s", em.s);
    dt_fail_cost_t fc = { .gen = 1, .next = 2, .what = "worker", .fault_ms = started - 700,
                          .decided_ms = started - 500 };
    cr_assert_eq(dt_db_failure_cost(coord.db, id, &fc, &em), 0, "%s", em.s);

    cr_assert_eq(dt_jobs_history(&coord, &j, &h, &em), 0, "%s", em.s);
    cr_assert_eq(json_integer_value(json_object_get(json_object_get(h, "job"), "id")), id);
    json_t *steps = json_object_get(h, "steps");
    cr_assert_eq(json_array_size(steps), 5);
    cr_assert(json_is_null(json_object_get(json_array_get(steps, 1), "loss")));
    cr_assert(json_is_null(json_object_get(json_array_get(steps, 4), "tokens_s")));
    cr_assert_eq(json_integer_value(json_object_get(json_array_get(steps, 4), "gen")), 2);
    json_t *gens = json_object_get(h, "generations");
    cr_assert_eq(json_array_size(gens), 2);
    cr_assert_eq(json_integer_value(json_object_get(json_array_get(gens, 1), "resume_step")), 2);
    cr_assert_eq(json_integer_value(json_object_get(json_array_get(gens, 1), "ended_ms")), 0);
    json_t *f = json_array_get(json_object_get(h, "failures"), 0);
    cr_assert_str_eq(json_string_value(json_object_get(f, "fault")), "worker");
    cr_assert_eq(json_integer_value(json_object_get(f, "recomputed_steps")), 2);
    cr_assert_eq(json_integer_value(json_object_get(f, "ended_ms")),
                 json_integer_value(json_object_get(json_array_get(gens, 0), "ended_ms")));
    cr_assert_eq(json_integer_value(json_object_get(f, "fault_ms")), started - 700,
                 "the next start less restart_s and detect_s");
    json_t *ck = json_array_get(json_object_get(h, "checkpoints"), 0);
    cr_assert_eq(json_integer_value(json_object_get(ck, "step")), 2);
    cr_assert_str_eq(json_string_value(json_object_get(ck, "state")), "committed");
    cr_assert_gt(json_integer_value(json_object_get(ck, "committed_ms")), 0);
    cr_assert_eq(json_integer_value(json_object_get(json_object_get(h, "goodput"), "failures")), 1);
    json_t *lo = json_object_get(h, "left_out");
    cr_assert_eq(json_integer_value(json_object_get(lo, "generations")), 0);
    cr_assert_eq(json_integer_value(json_object_get(lo, "checkpoints")), 0);
    json_decref(h);
    dt_job_clear(&j);
}
