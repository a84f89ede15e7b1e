/* SPDX-License-Identifier: MIT
 *
 * Tests of db/db.h against real SQLite files in a temporary directory:
 * creating and migrating (from an empty file and from schema versions 1
 * and 2), the refusals that must leave a file byte-identical (newer
 * schema, not a database, truncated, corrupt page, someone else's
 * database), every (from, to) pair of job states against the documented
 * table, events and their paging, owner filters, agents, shards and
 * checkpoints, job results, generations and their ranks (with what a
 * refused generation leaves behind: nothing), what survives close and
 * reopen or a SIGKILL, and DT_ENOENT for ids that do not exist. The files are inspected with plain
 * sqlite3 where the user would look. Nothing here needs a service.
 */
#include "config.h"

#include <criterion/criterion.h>
#include <errno.h>
#include <inttypes.h>
#include <math.h>
#include <signal.h>
#include <sqlite3.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "common/clock.h"
#include "common/err.h"
#include "common/fileio.h"
#include "common/mem.h"
#include "db/db.h"

/*-- fixture: one temp dir per test -------------------------------------------*/

static char tmpdir[64];
static char dbpath[128];

static void setup(void)
{
    snprintf(tmpdir, sizeof(tmpdir), "/tmp/test_db.XXXXXX");
    cr_assert_not_null(mkdtemp(tmpdir), "mkdtemp: %s", strerror(errno));
    snprintf(dbpath, sizeof(dbpath), "%s/dt.db", tmpdir);
}

static void teardown(void)
{
    if (tmpdir[0])
        dt_rmtree(tmpdir, NULL);
}

TestSuite(db, .init = setup, .fini = teardown);

/*-- helpers ------------------------------------------------------------------*/

#define assert_has(s, sub) \
    cr_assert(strstr((s), (sub)) != NULL, "message \"%s\" lacks \"%s\"", (s), (sub))

static const char sha_a[] = "0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef";
static const char sha_b[] = "fedcba9876543210fedcba9876543210fedcba9876543210fedcba9876543210";

static dt_db_t *open_ok(const char *path)
{
    dt_emsg_t em = { "" };
    dt_db_t *db = NULL;
    int rc = dt_db_open(path, &db, &em);

    cr_assert_eq(rc, 0, "dt_db_open(%s): %s (%s)", path, em.s, dt_err_name(rc));
    cr_assert_not_null(db);
    return db;
}

static int64_t job_new(dt_db_t *db, const char *name, uint32_t owner)
{
    dt_emsg_t em = { "" };
    int64_t id = 0;
    int rc = dt_db_job_create(db, name, owner, "kind = attn\n", &id, &em);

    cr_assert_eq(rc, 0, "job_create: %s", em.s);
    cr_assert_gt(id, 0);
    return id;
}

static enum dt_job_state job_state_of(dt_db_t *db, int64_t id)
{
    dt_emsg_t em = { "" };
    dt_job_t j;

    cr_assert_eq(dt_db_job_get(db, id, &j, &em), 0, "job_get %" PRId64 ": %s", id, em.s);
    enum dt_job_state s = j.state;
    dt_job_clear(&j);
    return s;
}

/* A whole file, to compare before and after a refusal. */
struct blob {
    unsigned char *p;
    size_t n;
};

static struct blob slurp(const char *path)
{
    struct blob b = { NULL, 0 };
    FILE *f = fopen(path, "rb");
    long n;

    cr_assert_not_null(f, "open %s: %s", path, strerror(errno));
    cr_assert_eq(fseek(f, 0, SEEK_END), 0);
    n = ftell(f);
    cr_assert_geq(n, 0);
    rewind(f);
    b.n = (size_t)n;
    b.p = dt_xmalloc(b.n + 1);
    cr_assert_eq(fread(b.p, 1, b.n, f), b.n);
    fclose(f);
    return b;
}

static void spit(const char *path, const void *p, size_t n)
{
    FILE *f = fopen(path, "wb");

    cr_assert_not_null(f, "create %s: %s", path, strerror(errno));
    cr_assert_eq(fwrite(p, 1, n, f), n);
    cr_assert_eq(fclose(f), 0);
}

static void assert_same_file(const char *path, const struct blob *before)
{
    struct blob after = slurp(path);

    cr_assert_eq(after.n, before->n, "%s changed size: %zu -> %zu bytes", path, before->n, after.n);
    cr_assert(memcmp(after.p, before->p, before->n) == 0, "%s changed", path);
    free(after.p);
}

static bool exists(const char *path)
{
    struct stat st;

    return stat(path, &st) == 0;
}

/* Plain sqlite3, as a user inspecting the file would. */
static void raw_exec(const char *path, const char *sql)
{
    sqlite3 *h = NULL;
    char *err = NULL;

    cr_assert_eq(sqlite3_open(path, &h), SQLITE_OK);
    cr_assert_eq(sqlite3_exec(h, sql, NULL, NULL, &err), SQLITE_OK, "%s: %s", sql, err ? err : "?");
    sqlite3_close(h);
}

static int64_t raw_int(const char *path, const char *sql)
{
    sqlite3 *h = NULL;
    sqlite3_stmt *st = NULL;
    int64_t v;

    cr_assert_eq(sqlite3_open(path, &h), SQLITE_OK);
    cr_assert_eq(sqlite3_prepare_v2(h, sql, -1, &st, NULL), SQLITE_OK, "%s: %s", sql,
                 sqlite3_errmsg(h));
    cr_assert_eq(sqlite3_step(st), SQLITE_ROW, "%s: %s", sql, sqlite3_errmsg(h));
    v = sqlite3_column_int64(st, 0);
    sqlite3_finalize(st);
    sqlite3_close(h);
    return v;
}

static char *raw_text(const char *path, const char *sql)
{
    sqlite3 *h = NULL;
    sqlite3_stmt *st = NULL;
    char *v;

    cr_assert_eq(sqlite3_open(path, &h), SQLITE_OK);
    cr_assert_eq(sqlite3_prepare_v2(h, sql, -1, &st, NULL), SQLITE_OK, "%s: %s", sql,
                 sqlite3_errmsg(h));
    cr_assert_eq(sqlite3_step(st), SQLITE_ROW, "%s: %s", sql, sqlite3_errmsg(h));
    v = dt_xstrdup((const char *)sqlite3_column_text(st, 0));
    sqlite3_finalize(st);
    sqlite3_close(h);
    return v;
}

/* Collected copies of walked rows (callbacks copy what they keep). */
#define MAXROWS 64

struct events {
    int n;
    int stop_after; /* return 99 after this many rows, 0 for never */
    int64_t id[MAXROWS], job[MAXROWS], at[MAXROWS];
    char *kind[MAXROWS], *state[MAXROWS], *detail[MAXROWS];
};

static int event_cb(const dt_event_t *e, void *arg)
{
    struct events *v = arg;

    cr_assert_lt(v->n, MAXROWS);
    v->id[v->n] = e->id;
    v->job[v->n] = e->job;
    v->at[v->n] = e->at_ms;
    v->kind[v->n] = dt_xstrdup(e->kind);
    v->state[v->n] = dt_xstrdup(e->state);
    v->detail[v->n] = e->detail ? dt_xstrdup(e->detail) : NULL;
    v->n++;
    return v->stop_after && v->n >= v->stop_after ? 99 : 0;
}

static void events_free(struct events *v)
{
    for (int i = 0; i < v->n; i++) {
        free(v->kind[i]);
        free(v->state[i]);
        free(v->detail[i]);
    }
    memset(v, 0, sizeof(*v));
}

static void events_of(dt_db_t *db, int64_t job, int64_t since, struct events *v)
{
    dt_emsg_t em = { "" };

    memset(v, 0, sizeof(*v));
    cr_assert_eq(dt_db_events(db, job, since, event_cb, v, &em), 0, "events: %s", em.s);
}

struct jobs {
    int n;
    int64_t id[MAXROWS];
    uint32_t owner[MAXROWS];
    char *name[MAXROWS];
};

static int job_cb(const dt_job_t *j, void *arg)
{
    struct jobs *v = arg;

    cr_assert_lt(v->n, MAXROWS);
    v->id[v->n] = j->id;
    v->owner[v->n] = j->owner;
    v->name[v->n] = dt_xstrdup(j->name);
    v->n++;
    return 0;
}

static void jobs_free(struct jobs *v)
{
    for (int i = 0; i < v->n; i++)
        free(v->name[i]);
    memset(v, 0, sizeof(*v));
}

struct agents {
    int n;
    dt_agent_t a[MAXROWS]; /* deep copies */
};

static int agent_cb(const dt_agent_t *a, void *arg)
{
    struct agents *v = arg;

    cr_assert_lt(v->n, MAXROWS);
    v->a[v->n] = *a;
    v->a[v->n].node = dt_xstrdup(a->node);
    v->a[v->n].state = dt_xstrdup(a->state);
    v->n++;
    return 0;
}

static void agents_free(struct agents *v)
{
    for (int i = 0; i < v->n; i++)
        dt_agent_clear(&v->a[i]);
    memset(v, 0, sizeof(*v));
}

struct ckpts {
    int n;
    dt_checkpoint_t c[MAXROWS]; /* deep copies */
};

static int ckpt_cb(const dt_checkpoint_t *c, void *arg)
{
    struct ckpts *v = arg;

    cr_assert_lt(v->n, MAXROWS);
    v->c[v->n] = *c;
    v->c[v->n].state = dt_xstrdup(c->state);
    v->n++;
    return 0;
}

static void ckpts_free(struct ckpts *v)
{
    for (int i = 0; i < v->n; i++)
        dt_checkpoint_clear(&v->c[i]);
    memset(v, 0, sizeof(*v));
}

static void ckpts_of(dt_db_t *db, int64_t job, struct ckpts *v)
{
    dt_emsg_t em = { "" };

    memset(v, 0, sizeof(*v));
    cr_assert_eq(dt_db_checkpoints(db, job, ckpt_cb, v, &em), 0, "checkpoints: %s", em.s);
}

struct ranks {
    int n;
    dt_rank_t r[MAXROWS]; /* deep copies */
};

static int rank_cb(const dt_rank_t *r, void *arg)
{
    struct ranks *v = arg;

    cr_assert_lt(v->n, MAXROWS);
    v->r[v->n] = *r;
    v->r[v->n].state = dt_xstrdup(r->state);
    v->n++;
    return 0;
}

static void ranks_free(struct ranks *v)
{
    for (int i = 0; i < v->n; i++)
        dt_rank_clear(&v->r[i]);
    memset(v, 0, sizeof(*v));
}

static void ranks_of(dt_db_t *db, int64_t job, int gen, struct ranks *v)
{
    dt_emsg_t em = { "" };

    memset(v, 0, sizeof(*v));
    cr_assert_eq(dt_db_gen_ranks(db, job, gen, rank_cb, v, &em), 0, "ranks: %s", em.s);
}

struct shards {
    int n;
    int stop_after;        /* return 99 after this many rows, 0 for never */
    dt_shard_t s[MAXROWS]; /* deep copies */
};

static int shard_cb(const dt_shard_t *s, void *arg)
{
    struct shards *v = arg;

    cr_assert_lt(v->n, MAXROWS);
    v->s[v->n] = *s;
    v->s[v->n].path = dt_xstrdup(s->path);
    v->s[v->n].sha256 = dt_xstrdup(s->sha256);
    v->n++;
    return v->stop_after && v->n >= v->stop_after ? 99 : 0;
}

static void shards_free(struct shards *v)
{
    for (int i = 0; i < v->n; i++)
        dt_shard_clear(&v->s[i]);
    memset(v, 0, sizeof(*v));
}

static void shards_of(dt_db_t *db, int64_t job, int64_t step, struct shards *v)
{
    dt_emsg_t em = { "" };

    memset(v, 0, sizeof(*v));
    cr_assert_eq(dt_db_shards(db, job, step, shard_cb, v, &em), 0, "shards: %s", em.s);
}

static int64_t agent_new(dt_db_t *db, int64_t job, const char *node)
{
    dt_emsg_t em = { "" };
    int64_t id = 0;

    cr_assert_eq(dt_db_agent_register(db, job, node, 4, &id, &em), 0, "agent_register: %s", em.s);
    cr_assert_gt(id, 0);
    return id;
}

static int64_t count_events(dt_db_t *db, int64_t job)
{
    struct events ev;
    int n;

    events_of(db, job, 0, &ev);
    n = ev.n;
    events_free(&ev);
    return n;
}

/*-- creating and migrating ---------------------------------------------------*/

static const char *const v2_tables[] = {
    "jobs", "events", "agents", "generations", "ranks", "checkpoints", "shards",
};

/* Columns added by version 3: table, column. */
static const char *const v3_columns[][2] = {
    { "jobs", "result" },
    { "generations", "resume_step" },
    { "ranks", "pid" },
};

Test(db, creates_and_migrates_an_empty_file)
{
    dt_db_t *db = open_ok(dbpath);
    char sql[128];

    cr_assert_eq(dt_db_version(db), DT_DB_VERSION);
    dt_db_close(db);

    cr_assert_eq(raw_int(dbpath, "PRAGMA user_version"), DT_DB_VERSION);
    char *mode = raw_text(dbpath, "PRAGMA journal_mode");
    cr_assert_str_eq(mode, "wal");
    free(mode);
    for (size_t i = 0; i < sizeof(v2_tables) / sizeof(v2_tables[0]); i++) {
        snprintf(sql, sizeof(sql),
                 "SELECT count(*) FROM sqlite_master WHERE type = 'table' AND name = '%s'",
                 v2_tables[i]);
        cr_assert_eq(raw_int(dbpath, sql), 1, "table %s missing", v2_tables[i]);
    }
    cr_assert_eq(raw_int(dbpath, "SELECT count(*) FROM sqlite_master WHERE type = 'index' "
                                 "AND name = 'events_job_id'"),
                 1);
    for (size_t i = 0; i < sizeof(v3_columns) / sizeof(v3_columns[0]); i++) {
        snprintf(sql, sizeof(sql), "SELECT count(*) FROM pragma_table_info('%s') WHERE name = '%s'",
                 v3_columns[i][0], v3_columns[i][1]);
        cr_assert_eq(raw_int(dbpath, sql), 1, "column %s.%s missing", v3_columns[i][0],
                     v3_columns[i][1]);
    }
    char *check = raw_text(dbpath, "PRAGMA quick_check");
    cr_assert_str_eq(check, "ok");
    free(check);

    /* an existing empty file is a new database too */
    char empty[160];
    snprintf(empty, sizeof(empty), "%s/empty.db", tmpdir);
    spit(empty, "", 0);
    db = open_ok(empty);
    cr_assert_eq(dt_db_version(db), DT_DB_VERSION);
    dt_db_close(db);
}

Test(db, migrates_a_version_1_database_forward)
{
    dt_emsg_t em = { "" };
    dt_db_t *db = NULL;
    int64_t id = 0, aid = 0;
    dt_job_t j;

    cr_assert_eq(dt_db_open_at(dbpath, 1, &db, &em), 0, "%s", em.s);
    cr_assert_eq(dt_db_version(db), 1);
    cr_assert_eq(dt_db_job_create(db, "old", 1000, "kind = train\n", &id, &em), 0, "%s", em.s);
    cr_assert_eq(dt_db_job_plan(db, id, "{\"ranks\":4}", &em), 0, "%s", em.s);
    /* version 1 has no agents: refused, not crashed */
    cr_assert_eq(dt_db_agent_register(db, id, "n1", 4, &aid, &em), DT_ENOTSUP);
    assert_has(em.s, "schema version 1");
    dt_db_close(db);

    cr_assert_eq(raw_int(dbpath, "PRAGMA user_version"), 1);
    cr_assert_eq(raw_int(dbpath, "SELECT count(*) FROM sqlite_master WHERE name = 'agents'"), 0);
    /* a row written by hand at version 1 migrates too */
    raw_exec(dbpath, "INSERT INTO jobs (name, owner_uid, state, spec, created_ms, updated_ms) "
                     "VALUES ('raw', 7, 'queued', 'kind = attn', 1, 2)");

    db = open_ok(dbpath);
    cr_assert_eq(dt_db_version(db), DT_DB_VERSION);
    cr_assert_eq(dt_db_job_get(db, id, &j, &em), 0, "%s", em.s);
    cr_assert_str_eq(j.name, "old");
    cr_assert_eq(j.state, DT_JOB_PLANNED);
    cr_assert_str_eq(j.plan, "{\"ranks\":4}");
    dt_job_clear(&j);
    cr_assert_eq(dt_db_job_get(db, id + 1, &j, &em), 0, "%s", em.s);
    cr_assert_str_eq(j.name, "raw");
    cr_assert_eq(j.state, DT_JOB_QUEUED);
    cr_assert_eq(j.owner, 7);
    dt_job_clear(&j);

    struct events ev;
    events_of(db, id, 0, &ev);
    cr_assert_eq(ev.n, 2);
    cr_assert_str_eq(ev.kind[0], "submitted");
    cr_assert_str_eq(ev.kind[1], "planned");
    events_free(&ev);
    cr_assert_eq(dt_db_agent_register(db, id, "n1", 4, &aid, &em), 0, "%s", em.s);
    dt_db_close(db);
    cr_assert_eq(raw_int(dbpath, "PRAGMA user_version"), DT_DB_VERSION);
}

Test(db, a_failed_migration_rolls_back_whole)
{
    dt_emsg_t em = { "" };
    dt_db_t *db = NULL;
    char want[256];

    cr_assert_eq(dt_db_open_at(dbpath, 1, &db, &em), 0, "%s", em.s);
    dt_db_close(db);
    db = NULL;
    /* version 2 creates shards last: the tables before it must roll back */
    raw_exec(dbpath, "CREATE TABLE shards (x)");
    cr_assert_eq(dt_db_open(dbpath, &db, &em), DT_EIO, "%s", em.s);
    cr_assert_null(db);
    snprintf(want, sizeof(want), "%s: migration to schema version 2: table shards already exists",
             dbpath);
    cr_assert_str_eq(em.s, want);
    cr_assert_eq(raw_int(dbpath, "PRAGMA user_version"), 1);
    cr_assert_eq(raw_int(dbpath, "SELECT count(*) FROM sqlite_master WHERE name IN "
                                 "('agents', 'generations', 'ranks', 'checkpoints')"),
                 0);
}

Test(db, migrates_a_version_2_database_forward)
{
    dt_emsg_t em = { "" };
    dt_db_t *db = NULL;
    int64_t id = 0, aid = 0, agents[1];
    char *result = NULL;
    dt_gen_t g;
    dt_job_t j;

    cr_assert_eq(dt_db_open_at(dbpath, 2, &db, &em), 0, "%s", em.s);
    cr_assert_eq(dt_db_version(db), 2);
    cr_assert_eq(dt_db_job_create(db, "old", 1000, "kind = train\n", &id, &em), 0, "%s", em.s);
    cr_assert_eq(dt_db_job_plan(db, id, "{\"ranks\":2}", &em), 0, "%s", em.s);
    cr_assert_eq(dt_db_agent_register(db, id, "n1", 2, &aid, &em), 0, "%s", em.s);
    cr_assert_eq(dt_db_shard_add(db, id, 40, 1, "/ck/40/r1", 11, sha_b, &em), 0, "%s", em.s);
    cr_assert_eq(dt_db_shard_add(db, id, 40, 0, "/ck/40/r0", 10, sha_a, &em), 0, "%s", em.s);
    cr_assert_eq(dt_db_checkpoint_set_state(db, id, 40, "committed", &em), 0, "%s", em.s);
    /* version 2 has no results or generation tracking: refused, not crashed */
    agents[0] = aid;
    cr_assert_eq(dt_db_gen_begin(db, id, 1, 1, agents, 0, &em), DT_ENOTSUP);
    assert_has(em.s, "schema version 2");
    cr_assert_eq(dt_db_gen_end(db, id, 1, "x", &em), DT_ENOTSUP);
    cr_assert_eq(dt_db_gen_last(db, id, &g, &em), DT_ENOTSUP);
    cr_assert_eq(dt_db_rank_set(db, id, 1, 0, "running", 1, 1, &em), DT_ENOTSUP);
    cr_assert_eq(dt_db_job_set_result(db, id, "{}", &em), DT_ENOTSUP);
    cr_assert_eq(dt_db_job_result(db, id, &result, &em), DT_ENOTSUP);
    cr_assert_null(result);
    dt_db_close(db);

    cr_assert_eq(raw_int(dbpath, "PRAGMA user_version"), 2);
    /* a generation of a version 2 coordinator, written by hand */
    raw_exec(dbpath, "INSERT INTO generations (job_id, gen, started_ms, ranks) VALUES (1, 1, 5, 1);"
                     "INSERT INTO ranks (job_id, gen, rank, agent_id, state, step) "
                     "VALUES (1, 1, 0, 1, 'running', 33);");

    db = open_ok(dbpath);
    cr_assert_eq(dt_db_version(db), DT_DB_VERSION);
    cr_assert_eq(dt_db_job_get(db, id, &j, &em), 0, "%s", em.s);
    cr_assert_str_eq(j.name, "old");
    cr_assert_eq(j.state, DT_JOB_PLANNED);
    cr_assert_str_eq(j.plan, "{\"ranks\":2}");
    dt_job_clear(&j);
    cr_assert_eq(dt_db_job_result(db, id, &result, &em), 0, "%s", em.s);
    cr_assert_null(result, "no result yet");

    struct agents va = { 0 };
    cr_assert_eq(dt_db_agents(db, id, agent_cb, &va, &em), 0, "%s", em.s);
    cr_assert_eq(va.n, 1);
    cr_assert_eq(va.a[0].id, aid);
    cr_assert_str_eq(va.a[0].node, "n1");
    agents_free(&va);

    struct ckpts vc;
    ckpts_of(db, id, &vc);
    cr_assert_eq(vc.n, 1);
    cr_assert_eq(vc.c[0].step, 40);
    cr_assert_str_eq(vc.c[0].state, "committed");
    cr_assert_eq(vc.c[0].shards, 2);
    cr_assert_eq(vc.c[0].bytes, 21);
    ckpts_free(&vc);

    struct shards vs;
    shards_of(db, id, 40, &vs);
    cr_assert_eq(vs.n, 2);
    cr_assert_str_eq(vs.s[0].path, "/ck/40/r0");
    cr_assert_str_eq(vs.s[1].sha256, sha_b);
    shards_free(&vs);

    /* the old generation reads with the new columns' defaults */
    cr_assert_eq(dt_db_gen_last(db, id, &g, &em), 0, "%s", em.s);
    cr_assert_eq(g.gen, 1);
    cr_assert_eq(g.started_ms, 5);
    cr_assert_eq(g.ended_ms, 0);
    cr_assert_eq(g.resume_step, 0);
    dt_gen_clear(&g);
    struct ranks vr;
    ranks_of(db, id, 1, &vr);
    cr_assert_eq(vr.n, 1);
    cr_assert_str_eq(vr.r[0].state, "running");
    cr_assert_eq(vr.r[0].step, 33);
    cr_assert_eq(vr.r[0].pid, 0);
    ranks_free(&vr);

    struct events ev;
    events_of(db, id, 0, &ev);
    static const char *const kinds[] = { "submitted", "planned", "agent_registered",
                                         "checkpoint_partial", "checkpoint_committed" };
    cr_assert_eq(ev.n, 5);
    for (int i = 0; i < 5; i++)
        cr_assert_str_eq(ev.kind[i], kinds[i]);
    events_free(&ev);

    /* and the new functions work on it */
    cr_assert_eq(dt_db_gen_end(db, id, 1, "coordinator upgraded", &em), 0, "%s", em.s);
    cr_assert_eq(dt_db_gen_begin(db, id, 2, 1, agents, 40, &em), 0, "%s", em.s);
    dt_db_close(db);
    cr_assert_eq(raw_int(dbpath, "PRAGMA user_version"), DT_DB_VERSION);
    char *check = raw_text(dbpath, "PRAGMA quick_check");
    cr_assert_str_eq(check, "ok");
    free(check);
}

Test(db, a_failed_migration_to_3_keeps_version_2)
{
    dt_emsg_t em = { "" };
    dt_db_t *db = NULL;
    int64_t id = 0;
    char want[256];

    cr_assert_eq(dt_db_open_at(dbpath, 2, &db, &em), 0, "%s", em.s);
    cr_assert_eq(dt_db_job_create(db, "kept", 1000, "kind = attn\n", &id, &em), 0, "%s", em.s);
    dt_db_close(db);
    db = NULL;
    /* version 3 adds ranks.pid last: the columns before it must roll back */
    raw_exec(dbpath, "ALTER TABLE ranks ADD COLUMN pid INTEGER");
    cr_assert_eq(dt_db_open(dbpath, &db, &em), DT_EIO, "%s", em.s);
    cr_assert_null(db);
    snprintf(want, sizeof(want), "%s: migration to schema version 3: duplicate column name: pid",
             dbpath);
    cr_assert_str_eq(em.s, want);
    cr_assert_eq(raw_int(dbpath, "PRAGMA user_version"), 2);
    cr_assert_eq(raw_int(dbpath, "SELECT count(*) FROM pragma_table_info('jobs') "
                                 "WHERE name = 'result'"),
                 0);
    cr_assert_eq(raw_int(dbpath, "SELECT count(*) FROM pragma_table_info('generations') "
                                 "WHERE name = 'resume_step'"),
                 0);
    cr_assert_eq(raw_int(dbpath, "SELECT count(*) FROM jobs WHERE name = 'kept'"), 1);
}

Test(db, open_at_never_goes_back_and_refuses_unknown_versions)
{
    dt_emsg_t em = { "" };
    dt_db_t *db = open_ok(dbpath);

    dt_db_close(db);
    db = NULL;
    cr_assert_eq(dt_db_open_at(dbpath, 1, &db, &em), 0, "%s", em.s);
    cr_assert_eq(dt_db_version(db), DT_DB_VERSION, "migrations are forward only");
    dt_db_close(db);
    db = NULL;
    cr_assert_eq(dt_db_open_at(dbpath, DT_DB_VERSION + 1, &db, &em), DT_EINVAL);
    cr_assert_null(db);
}

/*-- refusals: nothing written ------------------------------------------------*/

Test(db, refuses_a_newer_schema_and_leaves_the_file_alone)
{
    dt_emsg_t em = { "" };
    dt_db_t *db = NULL;
    char want[256], wal[160], sql[256];
    int newer = DT_DB_VERSION + 1;

    snprintf(sql, sizeof(sql), "CREATE TABLE jobs (id INTEGER PRIMARY KEY, future TEXT);"
                               "INSERT INTO jobs (future) VALUES ('kept');"
                               "PRAGMA user_version = %d;", newer);
    raw_exec(dbpath, sql);
    struct blob before = slurp(dbpath);

    cr_assert_eq(dt_db_open(dbpath, &db, &em), DT_ENOTSUP, "%s", em.s);
    cr_assert_null(db);
    snprintf(want, sizeof(want), "%s: schema version %d is newer than this dtcoordd (%d): "
             "upgrade dt", dbpath, newer, DT_DB_VERSION);
    cr_assert_str_eq(em.s, want);
    assert_same_file(dbpath, &before);
    snprintf(wal, sizeof(wal), "%s-wal", dbpath);
    cr_assert(!exists(wal), "refusing must not switch the file to WAL");
    cr_assert_eq(raw_int(dbpath, "PRAGMA user_version"), newer);
    free(before.p);

    /* a newer dtcoordd's file is in WAL mode: still not written */
    char walpath[160];
    snprintf(walpath, sizeof(walpath), "%s/wal.db", tmpdir);
    snprintf(sql, sizeof(sql), "PRAGMA journal_mode = WAL; CREATE TABLE jobs (id INTEGER "
                               "PRIMARY KEY); PRAGMA user_version = %d;", newer);
    raw_exec(walpath, sql);
    before = slurp(walpath);
    cr_assert_eq(dt_db_open(walpath, &db, &em), DT_ENOTSUP, "%s", em.s);
    snprintf(want, sizeof(want), "schema version %d is newer", newer);
    assert_has(em.s, want);
    assert_same_file(walpath, &before);
    free(before.p);
}

static void expect_format_refusal(const char *path)
{
    dt_emsg_t em = { "" };
    dt_db_t *db = NULL;
    char want[256];
    struct blob before = slurp(path);
    int rc = dt_db_open(path, &db, &em);

    cr_assert_eq(rc, DT_EFORMAT, "%s: got %s: %s", path, dt_err_name(rc), em.s);
    cr_log_info("refused: %s", em.s);
    cr_assert_null(db);
    snprintf(want, sizeof(want), "%s: not a dt database or corrupt (", path);
    cr_assert(strncmp(em.s, want, strlen(want)) == 0, "message \"%s\"", em.s);
    cr_assert_eq(em.s[strlen(em.s) - 1], ')', "message \"%s\"", em.s);
    cr_assert_null(strchr(em.s, '\n'), "message \"%s\" is not one line", em.s);
    assert_same_file(path, &before);
    free(before.p);
}

Test(db, refuses_a_file_that_is_not_a_database)
{
    char big[8192], wal[160];

    for (size_t i = 0; i < sizeof(big); i++)
        big[i] = "this is not a database\n"[i % 23];
    spit(dbpath, big, sizeof(big));
    expect_format_refusal(dbpath);
    snprintf(wal, sizeof(wal), "%s-wal", dbpath);
    cr_assert(!exists(wal));

    spit(dbpath, "hello", 5); /* shorter than a header */
    expect_format_refusal(dbpath);
}

/* A real dt database with some rows, closed (so all in the main file). */
static void make_db(const char *path, int njobs)
{
    dt_db_t *db = open_ok(path);
    char spec[600];

    memset(spec, 'x', sizeof(spec) - 1);
    spec[sizeof(spec) - 1] = '\0';
    for (int i = 0; i < njobs; i++) {
        dt_emsg_t em = { "" };
        int64_t id;
        cr_assert_eq(dt_db_job_create(db, "j", 1000, spec, &id, &em), 0, "%s", em.s);
    }
    dt_db_close(db);
}

Test(db, refuses_a_truncated_database)
{
    make_db(dbpath, 40);
    struct blob whole = slurp(dbpath);
    cr_assert_gt(whole.n, 4 * 4096, "expected several pages, got %zu bytes", whole.n);
    cr_assert_eq(truncate(dbpath, 4096 + 1000), 0);
    free(whole.p);
    expect_format_refusal(dbpath);
}

Test(db, refuses_a_database_with_a_corrupt_page)
{
    make_db(dbpath, 40);
    struct blob b = slurp(dbpath);
    size_t page = 4096, last = b.n / page - 1;

    cr_assert_gt(last, 2);
    /* a b-tree page of the jobs table: header intact, quick_check finds it */
    memset(b.p + (last - 1) * page, 0xa5, page);
    spit(dbpath, b.p, b.n);
    free(b.p);
    expect_format_refusal(dbpath);
    dt_emsg_t em = { "" };
    dt_db_t *db = NULL;
    cr_assert_lt(dt_db_open(dbpath, &db, &em), 0); /* refused, as above */
    assert_has(em.s, "(quick_check: ");
}

Test(db, refuses_another_programs_database)
{
    raw_exec(dbpath, "CREATE TABLE photos (id INTEGER PRIMARY KEY, path TEXT);");
    expect_format_refusal(dbpath);
    dt_emsg_t em = { "" };
    dt_db_t *db = NULL;
    cr_assert_lt(dt_db_open(dbpath, &db, &em), 0); /* refused, as above */
    assert_has(em.s, "no dt schema version");
}

Test(db, cannot_open_in_a_missing_directory)
{
    dt_emsg_t em = { "" };
    dt_db_t *db = NULL;
    char path[160];

    snprintf(path, sizeof(path), "%s/no/such/dir/dt.db", tmpdir);
    cr_assert_eq(dt_db_open(path, &db, &em), DT_EIO, "%s", em.s);
    cr_assert_null(db);
    assert_has(em.s, path);
}

/*-- job states ---------------------------------------------------------------*/

Test(db, state_names_parse_back)
{
    enum dt_job_state s;

    for (int i = 0; i < DT_JOB_NSTATES; i++) {
        cr_assert_eq(dt_job_state_parse(dt_job_state_name((enum dt_job_state)i), &s), 0);
        cr_assert_eq((int)s, i);
    }
    cr_assert_str_eq(dt_job_state_name(DT_JOB_RECOVERING), "recovering");
    cr_assert_eq(dt_job_state_parse("Running", &s), DT_EINVAL);
    cr_assert_eq(dt_job_state_parse("", &s), DT_EINVAL);
    for (int i = 0; i < DT_JOB_NSTATES; i++)
        cr_assert_eq(dt_job_state_terminal((enum dt_job_state)i),
                     i == DT_JOB_COMPLETED || i == DT_JOB_FAILED || i == DT_JOB_CANCELLED);
}

/* The documented table, written out again here on purpose. */
static const char *const legal_next[DT_JOB_NSTATES] = {
    [DT_JOB_SUBMITTED] = "planned failed cancelled",
    [DT_JOB_PLANNED] = "queued failed cancelled",
    [DT_JOB_QUEUED] = "starting failed cancelled",
    [DT_JOB_STARTING] = "running recovering failed cancelled",
    [DT_JOB_RUNNING] = "recovering completed failed cancelled queued",
    [DT_JOB_RECOVERING] = "running starting queued failed cancelled",
    [DT_JOB_COMPLETED] = "",
    [DT_JOB_FAILED] = "queued",
    [DT_JOB_CANCELLED] = "queued",
};

static bool documented(enum dt_job_state from, enum dt_job_state to)
{
    char list[96], word[24];

    snprintf(list, sizeof(list), " %s ", legal_next[from]);
    snprintf(word, sizeof(word), " %s ", dt_job_state_name(to));
    return strstr(list, word) != NULL;
}

/* A legal way from submitted to each state, ended by -1. */
#define P(s) DT_JOB_##s
static const int path_to[DT_JOB_NSTATES][7] = {
    [DT_JOB_SUBMITTED] = { -1 },
    [DT_JOB_PLANNED] = { P(PLANNED), -1 },
    [DT_JOB_QUEUED] = { P(PLANNED), P(QUEUED), -1 },
    [DT_JOB_STARTING] = { P(PLANNED), P(QUEUED), P(STARTING), -1 },
    [DT_JOB_RUNNING] = { P(PLANNED), P(QUEUED), P(STARTING), P(RUNNING), -1 },
    [DT_JOB_RECOVERING] = { P(PLANNED), P(QUEUED), P(STARTING), P(RUNNING), P(RECOVERING), -1 },
    [DT_JOB_COMPLETED] = { P(PLANNED), P(QUEUED), P(STARTING), P(RUNNING), P(COMPLETED), -1 },
    [DT_JOB_FAILED] = { P(FAILED), -1 },
    [DT_JOB_CANCELLED] = { P(CANCELLED), -1 },
};
#undef P

static int64_t last_event_id(dt_db_t *db, int64_t job)
{
    struct events ev;
    int64_t id;

    events_of(db, job, 0, &ev);
    cr_assert_gt(ev.n, 0);
    id = ev.id[ev.n - 1];
    events_free(&ev);
    return id;
}

Test(db, every_transition_against_the_table)
{
    dt_db_t *db = open_ok(dbpath);
    int legal = 0;

    for (int f = 0; f < DT_JOB_NSTATES; f++) {
        for (int t = 0; t < DT_JOB_NSTATES; t++) {
            enum dt_job_state from = (enum dt_job_state)f, to = (enum dt_job_state)t;
            const char *fn = dt_job_state_name(from), *tn = dt_job_state_name(to);
            dt_emsg_t em = { "" };
            char detail[64], want[128];
            struct events ev;
            dt_job_t before, after;
            int64_t id = job_new(db, "t", 1000), since;
            bool ok = documented(from, to);

            for (int k = 0; path_to[f][k] >= 0; k++)
                cr_assert_eq(dt_db_job_transition(db, id, (enum dt_job_state)path_to[f][k], NULL,
                                                  "on the way", &em),
                             0, "path to %s: %s", fn, em.s);
            cr_assert_eq(dt_db_job_get(db, id, &before, &em), 0);
            cr_assert_eq(before.state, from);
            since = last_event_id(db, id);

            cr_assert_eq(dt_job_transition_ok(from, to), ok, "%s -> %s", fn, tn);
            snprintf(detail, sizeof(detail), "test %s to %s", fn, tn);
            int rc = dt_db_job_transition(db, id, to, NULL, detail, &em);
            cr_assert_eq(dt_db_job_get(db, id, &after, &em), 0);
            events_of(db, id, since, &ev);
            cr_assert_eq(ev.n, 1, "%s -> %s: %d events", fn, tn, ev.n);
            if (ok) {
                legal++;
                cr_assert_eq(rc, 0, "%s -> %s refused: %s", fn, tn, em.s);
                cr_assert_eq(after.state, to);
                cr_assert_str_eq(after.reason, detail);
                cr_assert_geq(after.updated_ms, before.updated_ms);
                cr_assert_str_eq(ev.kind[0], tn);
                cr_assert_str_eq(ev.state[0], tn);
                cr_assert_str_eq(ev.detail[0], detail);
            } else {
                snprintf(want, sizeof(want), "job %" PRId64 ": illegal transition %s -> %s", id, fn,
                         tn);
                cr_assert_eq(rc, DT_EINVAL, "%s -> %s allowed", fn, tn);
                cr_assert_str_eq(em.s, want);
                cr_assert_eq(after.state, from);
                cr_assert_str_eq(after.reason ? after.reason : "(null)",
                                 before.reason ? before.reason : "(null)");
                cr_assert_eq(after.updated_ms, before.updated_ms);
                cr_assert_eq(after.restarts, before.restarts);
                cr_assert_str_eq(ev.kind[0], "refused");
                cr_assert_str_eq(ev.state[0], fn);
                cr_assert_str_eq(ev.detail[0], want);
            }
            events_free(&ev);
            dt_job_clear(&before);
            dt_job_clear(&after);
        }
    }
    cr_assert_eq(legal, 25);
    dt_db_close(db);
}

Test(db, transition_kind_reason_and_restarts)
{
    dt_db_t *db = open_ok(dbpath);
    dt_emsg_t em = { "" };
    int64_t id = job_new(db, "r", 1000);
    struct events ev;
    dt_job_t j;

    static const struct {
        enum dt_job_state to;
        int restarts; /* after the move */
    } steps[] = {
        { DT_JOB_PLANNED, 0 },    { DT_JOB_QUEUED, 0 },   { DT_JOB_STARTING, 0 },
        { DT_JOB_RECOVERING, 1 }, { DT_JOB_STARTING, 1 }, { DT_JOB_RUNNING, 1 },
        { DT_JOB_RECOVERING, 2 }, { DT_JOB_RUNNING, 2 },  { DT_JOB_QUEUED, 3 },
        { DT_JOB_STARTING, 3 },   { DT_JOB_RUNNING, 3 },  { DT_JOB_COMPLETED, 3 },
    };
    for (size_t i = 0; i < sizeof(steps) / sizeof(steps[0]); i++) {
        cr_assert_eq(dt_db_job_transition(db, id, steps[i].to, NULL, NULL, &em), 0, "%s", em.s);
        cr_assert_eq(dt_db_job_get(db, id, &j, &em), 0);
        cr_assert_eq(j.restarts, steps[i].restarts, "after step %zu (%s)", i,
                     dt_job_state_name(steps[i].to));
        cr_assert_null(j.reason);
        dt_job_clear(&j);
    }

    int64_t id2 = job_new(db, "k", 1000);
    cr_assert_eq(dt_db_job_transition(db, id2, DT_JOB_CANCELLED, "user_cancel", "by uid 1000", &em),
                 0, "%s", em.s);
    cr_assert_eq(dt_db_job_transition(db, id2, DT_JOB_QUEUED, "resumed", NULL, &em), 0, "%s", em.s);
    events_of(db, id2, 0, &ev);
    cr_assert_eq(ev.n, 3);
    cr_assert_str_eq(ev.kind[1], "user_cancel");
    cr_assert_str_eq(ev.state[1], "cancelled");
    cr_assert_str_eq(ev.detail[1], "by uid 1000");
    cr_assert_str_eq(ev.kind[2], "resumed");
    cr_assert_str_eq(ev.state[2], "queued");
    cr_assert_null(ev.detail[2]);
    events_free(&ev);
    dt_db_close(db);
}

Test(db, plan_stores_the_plan_and_moves_to_planned)
{
    dt_db_t *db = open_ok(dbpath);
    dt_emsg_t em = { "" };
    int64_t id = job_new(db, "p", 1000);
    struct events ev;
    dt_job_t j;
    char want[96];

    cr_assert_eq(dt_db_job_get(db, id, &j, &em), 0);
    cr_assert_null(j.plan);
    cr_assert_eq(j.state, DT_JOB_SUBMITTED);
    dt_job_clear(&j);

    cr_assert_eq(dt_db_job_plan(db, id, "{\"ranks\":8}", &em), 0, "%s", em.s);
    cr_assert_eq(dt_db_job_get(db, id, &j, &em), 0);
    cr_assert_eq(j.state, DT_JOB_PLANNED);
    cr_assert_str_eq(j.plan, "{\"ranks\":8}");
    dt_job_clear(&j);

    /* planning twice is an illegal planned -> planned, and keeps the plan */
    cr_assert_eq(dt_db_job_plan(db, id, "{\"ranks\":2}", &em), DT_EINVAL);
    snprintf(want, sizeof(want), "job %" PRId64 ": illegal transition planned -> planned", id);
    cr_assert_str_eq(em.s, want);
    cr_assert_eq(dt_db_job_get(db, id, &j, &em), 0);
    cr_assert_str_eq(j.plan, "{\"ranks\":8}");
    dt_job_clear(&j);

    events_of(db, id, 0, &ev);
    cr_assert_eq(ev.n, 3);
    cr_assert_str_eq(ev.kind[1], "planned");
    cr_assert_str_eq(ev.kind[2], "refused");
    events_free(&ev);
    dt_db_close(db);
}

Test(db, job_result_round_trip)
{
    dt_db_t *db = open_ok(dbpath);
    dt_emsg_t em = { "" };
    int64_t id = job_new(db, "res", 1000);
    static const char first[] = "{\"steps\":300,\"loss\":0.12,\"checksum\":\"9f86d081\"}";
    static const char second[] = "{\"steps\":400,\"loss\":0.1}";
    char *out = NULL, want[160];
    struct events ev;

    cr_assert_eq(dt_db_job_result(db, id, &out, &em), 0, "%s", em.s);
    cr_assert_null(out);
    cr_assert_eq(dt_db_job_set_result(db, id, first, &em), 0, "%s", em.s);
    cr_assert_eq(dt_db_job_result(db, id, &out, &em), 0, "%s", em.s);
    cr_assert_str_eq(out, first);
    free(out);
    cr_assert_eq(dt_db_job_set_result(db, id, second, &em), 0, "%s", em.s);
    cr_assert_eq(dt_db_job_result(db, id, &out, &em), 0, "%s", em.s);
    cr_assert_str_eq(out, second, "storing again replaces");
    free(out);

    /* not a JSON object: refused, the stored one kept */
    static const char *const bad[] = { "", "steps=300", "{\"steps\":", "[1,2]", "42", "null" };
    for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
        cr_assert_eq(dt_db_job_set_result(db, id, bad[i], &em), DT_EINVAL, "'%s' stored", bad[i]);
        snprintf(want, sizeof(want), "job %" PRId64 ": result is not a JSON object: '%s'", id,
                 bad[i]);
        cr_assert_str_eq(em.s, want);
    }
    cr_assert_eq(dt_db_job_result(db, id, &out, &em), 0, "%s", em.s);
    cr_assert_str_eq(out, second);
    free(out);

    /* an event each, the job's state untouched */
    cr_assert_eq(job_state_of(db, id), DT_JOB_SUBMITTED);
    events_of(db, id, 0, &ev);
    cr_assert_eq(ev.n, 3);
    cr_assert_str_eq(ev.kind[1], "result_stored");
    cr_assert_str_eq(ev.state[1], "submitted");
    cr_assert_str_eq(ev.detail[1], first);
    cr_assert_str_eq(ev.kind[2], "result_stored");
    cr_assert_str_eq(ev.detail[2], second);
    events_free(&ev);
    dt_db_close(db);

    char *raw = raw_text(dbpath, "SELECT json_extract(result, '$.steps') FROM jobs");
    cr_assert_str_eq(raw, "400");
    free(raw);
}

/*-- events and lists ---------------------------------------------------------*/

Test(db, events_are_ordered_and_since_pages)
{
    dt_db_t *db = open_ok(dbpath);
    dt_emsg_t em = { "" };
    int64_t t0 = dt_clock_wall_ms();
    int64_t a = job_new(db, "a", 1000), b = job_new(db, "b", 1000);
    struct events ev;

    cr_assert_eq(dt_db_event_add(db, a, "worker_exit", "rank=3 status=1", &em), 0, "%s", em.s);
    cr_assert_eq(dt_db_event_add(db, b, "note", "other job", &em), 0, "%s", em.s);
    cr_assert_eq(dt_db_job_transition(db, a, DT_JOB_FAILED, NULL, "rank 3 exited", &em), 0);
    cr_assert_eq(dt_db_event_add(db, a, "note", NULL, &em), 0, "%s", em.s);
    int64_t t1 = dt_clock_wall_ms();

    events_of(db, a, 0, &ev);
    static const char *const kinds[] = { "submitted", "worker_exit", "failed", "note" };
    static const char *const states[] = { "submitted", "submitted", "failed", "failed" };
    cr_assert_eq(ev.n, 4);
    for (int i = 0; i < 4; i++) {
        cr_assert_str_eq(ev.kind[i], kinds[i]);
        cr_assert_str_eq(ev.state[i], states[i], "event %d", i);
        cr_assert_eq(ev.job[i], a);
        cr_assert(ev.at[i] >= t0 && ev.at[i] <= t1, "at_ms %" PRId64, ev.at[i]);
        if (i > 0) {
            cr_assert_gt(ev.id[i], ev.id[i - 1]);
            cr_assert_geq(ev.at[i], ev.at[i - 1]);
        }
    }
    cr_assert_str_eq(ev.detail[1], "rank=3 status=1");
    cr_assert_null(ev.detail[3]);
    int64_t second = ev.id[1], last = ev.id[3];
    events_free(&ev);

    events_of(db, a, second, &ev);
    cr_assert_eq(ev.n, 2);
    cr_assert_str_eq(ev.kind[0], "failed");
    cr_assert_str_eq(ev.kind[1], "note");
    events_free(&ev);
    events_of(db, a, last, &ev);
    cr_assert_eq(ev.n, 0);
    events_free(&ev);

    events_of(db, b, 0, &ev);
    cr_assert_eq(ev.n, 2);
    cr_assert_str_eq(ev.detail[1], "other job");
    events_free(&ev);

    /* a callback's non-zero return stops the walk and is returned */
    memset(&ev, 0, sizeof(ev));
    ev.stop_after = 1;
    cr_assert_eq(dt_db_events(db, a, 0, event_cb, &ev, &em), 99);
    cr_assert_eq(ev.n, 1);
    events_free(&ev);
    dt_db_close(db);
}

Test(db, job_list_filters_by_owner)
{
    dt_db_t *db = open_ok(dbpath);
    dt_emsg_t em = { "" };
    int64_t j1 = job_new(db, "one", 1000), j2 = job_new(db, "two", 2000),
            j3 = job_new(db, "three", 1000);
    struct jobs v = { 0 };

    cr_assert_eq(dt_db_job_list(db, -1, job_cb, &v, &em), 0, "%s", em.s);
    cr_assert_eq(v.n, 3);
    cr_assert_eq(v.id[0], j1);
    cr_assert_eq(v.id[1], j2);
    cr_assert_eq(v.id[2], j3);
    cr_assert_eq(v.owner[1], 2000);
    jobs_free(&v);

    cr_assert_eq(dt_db_job_list(db, 1000, job_cb, &v, &em), 0, "%s", em.s);
    cr_assert_eq(v.n, 2);
    cr_assert_eq(v.id[0], j1);
    cr_assert_str_eq(v.name[0], "one");
    cr_assert_eq(v.id[1], j3);
    cr_assert_str_eq(v.name[1], "three");
    jobs_free(&v);

    cr_assert_eq(dt_db_job_list(db, 3000, job_cb, &v, &em), 0, "%s", em.s);
    cr_assert_eq(v.n, 0);
    dt_db_close(db);
}

/*-- agents -------------------------------------------------------------------*/

Test(db, agent_reregistration_keeps_its_id)
{
    dt_db_t *db = open_ok(dbpath);
    dt_emsg_t em = { "" };
    int64_t job = job_new(db, "a", 1000), other = job_new(db, "o", 1000);
    int64_t a1 = 0, a1again = 0, a2 = 0, a3 = 0;
    struct agents v = { 0 };
    struct events ev;
    dt_agent_t a;

    cr_assert_eq(dt_db_agent_register(db, job, "node01", 4, &a1, &em), 0, "%s", em.s);
    cr_assert_eq(dt_db_agent_set_state(db, a1, "lost", 1234, &em), 0, "%s", em.s);
    cr_assert_eq(dt_db_agent_get(db, a1, &a, &em), 0, "%s", em.s);
    cr_assert_str_eq(a.state, "lost");
    cr_assert_eq(a.last_seen_ms, 1234);
    cr_assert_eq(a.job, job);
    dt_agent_clear(&a);

    cr_assert_eq(dt_db_agent_register(db, job, "node01", 8, &a1again, &em), 0, "%s", em.s);
    cr_assert_eq(a1again, a1);
    cr_assert_eq(dt_db_agent_register(db, job, "node02", 4, &a2, &em), 0, "%s", em.s);
    cr_assert_neq(a2, a1);
    cr_assert_eq(dt_db_agent_register(db, other, "node01", 4, &a3, &em), 0, "%s", em.s);
    cr_assert_neq(a3, a1, "the same node in another job is another agent");

    cr_assert_eq(dt_db_agents(db, job, agent_cb, &v, &em), 0, "%s", em.s);
    cr_assert_eq(v.n, 2);
    cr_assert_eq(v.a[0].id, a1);
    cr_assert_str_eq(v.a[0].node, "node01");
    cr_assert_eq(v.a[0].slots, 8);
    cr_assert_str_eq(v.a[0].state, "registered");
    cr_assert_gt(v.a[0].last_seen_ms, 1234);
    cr_assert_eq(v.a[1].id, a2);
    cr_assert_str_eq(v.a[1].node, "node02");
    agents_free(&v);

    cr_assert_eq(dt_db_agent_set_state(db, a2, "asleep", 1, &em), DT_EINVAL);
    assert_has(em.s, "asleep");

    events_of(db, job, 0, &ev);
    static const char *const kinds[] = { "submitted", "agent_registered", "agent_lost",
                                         "agent_registered", "agent_registered" };
    static const char *const details[] = { NULL, "node=node01 slots=4", "node=node01",
                                           "node=node01 slots=8", "node=node02 slots=4" };
    cr_assert_eq(ev.n, 5);
    for (int i = 0; i < 5; i++) {
        cr_assert_str_eq(ev.kind[i], kinds[i]);
        cr_assert_str_eq(ev.state[i], "submitted");
        if (details[i])
            cr_assert_str_eq(ev.detail[i], details[i]);
    }
    events_free(&ev);
    dt_db_close(db);
}

/*-- shards and checkpoints ---------------------------------------------------*/

Test(db, shards_and_checkpoints)
{
    dt_db_t *db = open_ok(dbpath);
    dt_emsg_t em = { "" };
    int64_t job = job_new(db, "c", 1000);
    struct ckpts v;
    struct events ev;
    int64_t t0 = dt_clock_wall_ms();

    cr_assert_eq(dt_db_shard_add(db, job, 100, 0, "/ck/100/r0", 10, sha_a, &em), 0, "%s", em.s);
    cr_assert_eq(dt_db_shard_add(db, job, 100, 1, "/ck/100/r1", 20, sha_a, &em), 0, "%s", em.s);
    /* the same rank again replaces its shard */
    cr_assert_eq(dt_db_shard_add(db, job, 100, 1, "/ck/100/r1.b", 30, sha_b, &em), 0, "%s", em.s);
    ckpts_of(db, job, &v);
    cr_assert_eq(v.n, 1);
    cr_assert_eq(v.c[0].step, 100);
    cr_assert_eq(v.c[0].job, job);
    cr_assert_str_eq(v.c[0].state, "partial");
    cr_assert_eq(v.c[0].shards, 2);
    cr_assert_eq(v.c[0].bytes, 40);
    cr_assert_geq(v.c[0].created_ms, t0);
    cr_assert_eq(v.c[0].committed_ms, 0);
    ckpts_free(&v);
    char *p = raw_text(dbpath, "SELECT path || ' ' || bytes || ' ' || sha256 FROM shards "
                               "WHERE rank = 1");
    char want[128];
    snprintf(want, sizeof(want), "/ck/100/r1.b 30 %s", sha_b);
    cr_assert_str_eq(p, want);
    free(p);

    cr_assert_eq(dt_db_checkpoint_set_state(db, job, 100, "committed", &em), 0, "%s", em.s);
    ckpts_of(db, job, &v);
    cr_assert_str_eq(v.c[0].state, "committed");
    cr_assert_geq(v.c[0].committed_ms, v.c[0].created_ms);
    ckpts_free(&v);

    /* a committed checkpoint does not change under the coordinator */
    cr_assert_eq(dt_db_shard_add(db, job, 100, 2, "/ck/100/r2", 5, sha_a, &em), DT_EINVAL);
    assert_has(em.s, "already committed");
    cr_assert_eq(dt_db_checkpoint_set_state(db, job, 100, "committed", &em), DT_EINVAL);
    assert_has(em.s, "is committed and cannot become committed");
    cr_assert_eq(dt_db_checkpoint_set_state(db, job, 100, "partial", &em), DT_EINVAL);
    cr_assert_eq(dt_db_checkpoint_set_state(db, job, 300, "committed", &em), DT_ENOENT);
    assert_has(em.s, "no checkpoint at step 300");
    cr_assert_eq(dt_db_shard_add(db, job, 200, 0, "/ck/200/r0", 5, "not-a-sha", &em), DT_EINVAL);
    cr_assert_eq(dt_db_shard_add(db, job, 200, -1, "/ck/200/r0", 5, sha_a, &em), DT_EINVAL);

    /* step 200 goes corrupt, then is written again from scratch */
    cr_assert_eq(dt_db_shard_add(db, job, 200, 0, "/ck/200/r0", 7, sha_a, &em), 0, "%s", em.s);
    cr_assert_eq(dt_db_shard_add(db, job, 200, 1, "/ck/200/r1", 7, sha_a, &em), 0, "%s", em.s);
    cr_assert_eq(dt_db_checkpoint_set_state(db, job, 200, "corrupt", &em), 0, "%s", em.s);
    cr_assert_eq(dt_db_checkpoint_set_state(db, job, 200, "committed", &em), DT_EINVAL);
    cr_assert_eq(dt_db_shard_add(db, job, 200, 0, "/ck/200/r0", 9, sha_b, &em), 0, "%s", em.s);
    ckpts_of(db, job, &v);
    cr_assert_eq(v.n, 2);
    cr_assert_eq(v.c[0].step, 100);
    cr_assert_eq(v.c[1].step, 200);
    cr_assert_str_eq(v.c[1].state, "partial");
    cr_assert_eq(v.c[1].shards, 1);
    cr_assert_eq(v.c[1].bytes, 9);
    /* what was found is kept when the step is written again */
    cr_assert_gt(v.c[1].corrupt_ms, 0, "corrupt_ms kept by the rewrite");
    cr_assert_eq(v.c[0].corrupt_ms, 0, "step 100 was never corrupt");
    int64_t found = v.c[1].corrupt_ms;
    ckpts_free(&v);
    cr_assert_eq(dt_db_checkpoint_set_state(db, job, 100, "deleted", &em), 0, "%s", em.s);

    events_of(db, job, 0, &ev);
    static const char *const kinds[] = {
        "submitted",          "checkpoint_partial", "checkpoint_committed", "checkpoint_partial",
        "checkpoint_corrupt", "checkpoint_partial", "checkpoint_deleted"
    };
    static const char *const details[] = { NULL,       "step=100", "step=100", "step=200",
                                           "step=200", "step=200", "step=100" };
    cr_assert_eq(ev.n, 7);
    for (int i = 0; i < 7; i++) {
        cr_assert_str_eq(ev.kind[i], kinds[i], "event %d", i);
        if (details[i])
            cr_assert_str_eq(ev.detail[i], details[i]);
    }
    events_free(&ev);
    /* ... and when it is committed and pruned (deleted) in its turn */
    cr_assert_eq(dt_db_checkpoint_set_state(db, job, 200, "deleted", &em), 0, "%s", em.s);
    ckpts_of(db, job, &v);
    cr_assert_str_eq(v.c[1].state, "deleted");
    cr_assert_eq(v.c[1].corrupt_ms, found);
    ckpts_free(&v);
    dt_db_close(db);
}

Test(db, shards_list_in_rank_order)
{
    dt_db_t *db = open_ok(dbpath);
    dt_emsg_t em = { "" };
    int64_t job = job_new(db, "s", 1000), other = job_new(db, "o", 1000);
    static const int order[] = { 3, 0, 2, 1 };
    char path[64];
    struct shards v;

    for (int i = 0; i < 4; i++) {
        snprintf(path, sizeof(path), "/ck/100/r%d", order[i]);
        cr_assert_eq(dt_db_shard_add(db, job, 100, order[i], path, 100 + order[i], sha_a, &em), 0,
                     "%s", em.s);
    }
    cr_assert_eq(dt_db_shard_add(db, job, 100, 2, "/ck/100/r2.b", 7, sha_b, &em), 0, "%s", em.s);
    cr_assert_eq(dt_db_shard_add(db, job, 200, 0, "/ck/200/r0", 1, sha_a, &em), 0, "%s", em.s);
    cr_assert_eq(dt_db_shard_add(db, other, 100, 0, "/other/r0", 1, sha_b, &em), 0, "%s", em.s);

    shards_of(db, job, 100, &v);
    cr_assert_eq(v.n, 4);
    for (int r = 0; r < 4; r++) {
        cr_assert_eq(v.s[r].rank, r);
        snprintf(path, sizeof(path), "/ck/100/r%d%s", r, r == 2 ? ".b" : "");
        cr_assert_str_eq(v.s[r].path, path);
        cr_assert_eq(v.s[r].bytes, r == 2 ? 7 : 100 + r);
        cr_assert_str_eq(v.s[r].sha256, r == 2 ? sha_b : sha_a);
    }
    shards_free(&v);
    shards_of(db, other, 100, &v);
    cr_assert_eq(v.n, 1);
    cr_assert_str_eq(v.s[0].path, "/other/r0");
    shards_free(&v);

    /* listed whatever the checkpoint's state */
    cr_assert_eq(dt_db_checkpoint_set_state(db, job, 100, "deleted", &em), 0, "%s", em.s);
    shards_of(db, job, 100, &v);
    cr_assert_eq(v.n, 4);
    shards_free(&v);

    /* a callback's non-zero return stops the walk and is returned */
    memset(&v, 0, sizeof(v));
    v.stop_after = 2;
    cr_assert_eq(dt_db_shards(db, job, 100, shard_cb, &v, &em), 99);
    cr_assert_eq(v.n, 2);
    shards_free(&v);

    cr_assert_eq(dt_db_shards(db, job, 150, shard_cb, &v, &em), DT_ENOENT);
    char want[96];
    snprintf(want, sizeof(want), "job %" PRId64 ": no checkpoint at step 150", job);
    cr_assert_str_eq(em.s, want);
    cr_assert_eq(v.n, 0, "callback called for a failed walk");
    dt_db_close(db);
}

/*-- generations and ranks ----------------------------------------------------*/

Test(db, generations_begin_end_and_last)
{
    dt_db_t *db = open_ok(dbpath);
    dt_emsg_t em = { "" };
    int64_t job = job_new(db, "g", 1000);
    int64_t a1 = agent_new(db, job, "node01"), a2 = agent_new(db, job, "node02");
    int64_t t0 = dt_clock_wall_ms(), t1;
    const int64_t place1[] = { a1, a1, a2 }, place2[] = { a2, a1 };
    struct ranks vr;
    struct events ev;
    dt_gen_t g;

    cr_assert_eq(dt_db_gen_last(db, job, &g, &em), 0, "%s", em.s);
    cr_assert_eq(g.gen, 0, "no generation yet");
    cr_assert_null(g.reason);
    dt_gen_clear(&g);

    cr_assert_eq(dt_db_gen_begin(db, job, 1, 3, place1, 0, &em), 0, "%s", em.s);
    t1 = dt_clock_wall_ms();
    cr_assert_eq(dt_db_gen_last(db, job, &g, &em), 0, "%s", em.s);
    cr_assert_eq(g.job, job);
    cr_assert_eq(g.gen, 1);
    cr_assert_eq(g.ranks, 3);
    cr_assert(g.started_ms >= t0 && g.started_ms <= t1, "started_ms %" PRId64, g.started_ms);
    cr_assert_eq(g.ended_ms, 0);
    cr_assert_eq(g.resume_step, 0);
    cr_assert_null(g.reason);
    dt_gen_clear(&g);
    ranks_of(db, job, 1, &vr);
    cr_assert_eq(vr.n, 3);
    for (int r = 0; r < 3; r++) {
        cr_assert_eq(vr.r[r].rank, r);
        cr_assert_eq(vr.r[r].agent, place1[r]);
        cr_assert_str_eq(vr.r[r].state, "starting");
        cr_assert_eq(vr.r[r].step, 0);
        cr_assert_eq(vr.r[r].pid, 0);
    }
    ranks_free(&vr);

    cr_assert_eq(dt_db_gen_end(db, job, 1, "rank 2 failed", &em), 0, "%s", em.s);
    cr_assert_eq(dt_db_gen_last(db, job, &g, &em), 0, "%s", em.s);
    cr_assert_eq(g.gen, 1);
    cr_assert_geq(g.ended_ms, g.started_ms);
    cr_assert_str_eq(g.reason, "rank 2 failed");
    dt_gen_clear(&g);

    /* a recovery: fewer ranks, from the checkpoint at step 200 */
    cr_assert_eq(dt_db_gen_begin(db, job, 2, 2, place2, 200, &em), 0, "%s", em.s);
    cr_assert_eq(dt_db_gen_last(db, job, &g, &em), 0, "%s", em.s);
    cr_assert_eq(g.gen, 2);
    cr_assert_eq(g.ranks, 2);
    cr_assert_eq(g.resume_step, 200);
    cr_assert_eq(g.ended_ms, 0);
    dt_gen_clear(&g);
    ranks_of(db, job, 2, &vr);
    cr_assert_eq(vr.n, 2);
    cr_assert_eq(vr.r[0].agent, a2);
    cr_assert_eq(vr.r[1].agent, a1);
    cr_assert_eq(vr.r[0].step, 200, "ranks start at the resume step");
    cr_assert_eq(vr.r[1].step, 200);
    ranks_free(&vr);
    ranks_of(db, job, 1, &vr);
    cr_assert_eq(vr.n, 3, "the old generation's ranks are kept");
    ranks_free(&vr);

    cr_assert_eq(dt_db_job_transition(db, job, DT_JOB_CANCELLED, NULL, NULL, &em), 0, "%s", em.s);
    cr_assert_eq(dt_db_gen_end(db, job, 2, "cancelled by uid 1000", &em), 0, "%s", em.s);

    events_of(db, job, 0, &ev);
    static const char *const kinds[] = {
        "submitted",        "agent_registered",   "agent_registered", "generation_started",
        "generation_ended", "generation_started", "cancelled",        "generation_ended",
    };
    static const char *const details[] = {
        NULL,
        NULL,
        NULL,
        "gen=1 ranks=3 resume_step=0",
        "gen=1: rank 2 failed",
        "gen=2 ranks=2 resume_step=200",
        NULL,
        "gen=2: cancelled by uid 1000",
    };
    cr_assert_eq(ev.n, 8);
    for (int i = 0; i < 8; i++) {
        cr_assert_str_eq(ev.kind[i], kinds[i], "event %d", i);
        if (details[i])
            cr_assert_str_eq(ev.detail[i], details[i], "event %d", i);
        cr_assert_str_eq(ev.state[i], i < 6 ? "submitted" : "cancelled", "event %d", i);
    }
    events_free(&ev);
    dt_db_close(db);

    cr_assert_eq(raw_int(dbpath, "SELECT count(*) FROM generations"), 2);
    cr_assert_eq(raw_int(dbpath, "SELECT count(*) FROM ranks"), 5);
    cr_assert_eq(raw_int(dbpath, "SELECT count(*) FROM generations WHERE ended_ms IS NULL"), 0);
}

/* dt_db_gens: every generation, oldest first, the running one without an
 * end or a reason. */
struct gens {
    int n, gen[4], ranks[4];
    int64_t resume[4], ended[4];
    char reason[4][32];
};

static int gens_cb(const dt_gen_t *g, void *arg)
{
    struct gens *v = arg;
    cr_assert_lt(v->n, 4);
    v->gen[v->n] = g->gen;
    v->ranks[v->n] = g->ranks;
    v->resume[v->n] = g->resume_step;
    v->ended[v->n] = g->ended_ms;
    snprintf(v->reason[v->n++], sizeof(v->reason[0]), "%s", g->reason ? g->reason : "(null)");
    return 0;
}

Test(db, generations_listed)
{
    dt_db_t *db = open_ok(dbpath);
    dt_emsg_t em = { "" };
    int64_t job = job_new(db, "g", 1000), a = agent_new(db, job, "node01");
    const int64_t place[] = { a, a };
    struct gens v = { 0 };

    cr_assert_eq(dt_db_gens(db, job, gens_cb, &v, &em), 0, "%s", em.s);
    cr_assert_eq(v.n, 0);
    cr_assert_eq(dt_db_gen_begin(db, job, 1, 2, place, 0, &em), 0, "%s", em.s);
    cr_assert_eq(dt_db_gen_end(db, job, 1, "rank 1 failed", &em), 0, "%s", em.s);
    cr_assert_eq(dt_db_gen_begin(db, job, 2, 1, place, 30, &em), 0, "%s", em.s);
    cr_assert_eq(dt_db_gens(db, job, gens_cb, &v, &em), 0, "%s", em.s);
    cr_assert_eq(v.n, 2);
    cr_assert(v.gen[0] == 1 && v.ranks[0] == 2 && v.resume[0] == 0 && v.ended[0] > 0);
    cr_assert_str_eq(v.reason[0], "rank 1 failed");
    cr_assert(v.gen[1] == 2 && v.ranks[1] == 1 && v.resume[1] == 30 && v.ended[1] == 0);
    cr_assert_str_eq(v.reason[1], "(null)", "still running");
    cr_assert_eq(dt_db_gens(db, job + 1, gens_cb, &v, &em), DT_ENOENT);
    dt_db_close(db);
}

Test(db, generation_refusals)
{
    dt_db_t *db = open_ok(dbpath);
    dt_emsg_t em = { "" };
    int64_t job = job_new(db, "g", 1000), other = job_new(db, "o", 1000);
    int64_t a = agent_new(db, job, "node01"), b = agent_new(db, other, "node01");
    const int64_t mine[] = { a, a }, mixed[] = { a, b }, ghost[] = { a, 999 };
    int64_t before;
    char want[160];
    dt_gen_t g;

    /* not consecutive: the first is 1 */
    cr_assert_eq(dt_db_gen_begin(db, job, 2, 2, mine, 0, &em), DT_EINVAL);
    snprintf(want, sizeof(want), "job %" PRId64 " gen 2: not the next generation (that is 1)", job);
    cr_assert_str_eq(em.s, want);
    cr_assert_eq(dt_db_gen_begin(db, job, 0, 2, mine, 0, &em), DT_EINVAL);
    assert_has(em.s, "gen 0");
    cr_assert_eq(dt_db_gen_begin(db, job, 1, 0, mine, 0, &em), DT_EINVAL);
    assert_has(em.s, "0 ranks");
    cr_assert_eq(dt_db_gen_begin(db, job, 1, 2, mine, -5, &em), DT_EINVAL);
    assert_has(em.s, "resume step -5");

    cr_assert_eq(dt_db_gen_begin(db, job, 1, 2, mine, 0, &em), 0, "%s", em.s);
    before = count_events(db, job);

    /* while generation 1 runs, neither 2 nor 1 again */
    cr_assert_eq(dt_db_gen_begin(db, job, 2, 2, mine, 0, &em), DT_EINVAL);
    snprintf(want, sizeof(want),
             "job %" PRId64 " gen 2: generation 1 is still running (end it first)", job);
    cr_assert_str_eq(em.s, want);
    cr_assert_eq(dt_db_gen_begin(db, job, 1, 2, mine, 0, &em), DT_EINVAL);
    assert_has(em.s, "generation 1 is still running");

    cr_assert_eq(dt_db_gen_end(db, job, 1, "done", &em), 0, "%s", em.s);
    /* ending twice */
    cr_assert_eq(dt_db_gen_end(db, job, 1, "again", &em), DT_EINVAL);
    snprintf(want, sizeof(want), "job %" PRId64 " gen 1: already ended (done)", job);
    cr_assert_str_eq(em.s, want);
    cr_assert_eq(dt_db_gen_end(db, job, 5, "never began", &em), DT_ENOENT);
    snprintf(want, sizeof(want), "job %" PRId64 ": no generation 5", job);
    cr_assert_str_eq(em.s, want);
    /* skipping one */
    cr_assert_eq(dt_db_gen_begin(db, job, 3, 2, mine, 0, &em), DT_EINVAL);
    assert_has(em.s, "not the next generation (that is 2)");
    /* a rank on another job's agent, or on no agent */
    cr_assert_eq(dt_db_gen_begin(db, job, 2, 2, mixed, 0, &em), DT_EINVAL);
    snprintf(want, sizeof(want),
             "job %" PRId64 " gen 2 rank 1: agent %" PRId64 " belongs to job %" PRId64, job, b,
             other);
    cr_assert_str_eq(em.s, want);
    cr_assert_eq(dt_db_gen_begin(db, job, 2, 2, ghost, 0, &em), DT_ENOENT);
    snprintf(want, sizeof(want), "job %" PRId64 " gen 2 rank 1: no such agent 999", job);
    cr_assert_str_eq(em.s, want);

    /* the refusals wrote nothing: one generation, its end the only new event */
    cr_assert_eq(count_events(db, job), before + 1);
    cr_assert_eq(dt_db_gen_last(db, job, &g, &em), 0, "%s", em.s);
    cr_assert_eq(g.gen, 1);
    cr_assert_str_eq(g.reason, "done");
    dt_gen_clear(&g);
    cr_assert_eq(dt_db_gen_last(db, other, &g, &em), 0, "%s", em.s);
    cr_assert_eq(g.gen, 0, "the other job has no generation");
    dt_gen_clear(&g);
    dt_db_close(db);
    cr_assert_eq(raw_int(dbpath, "SELECT count(*) FROM generations"), 1);
    cr_assert_eq(raw_int(dbpath, "SELECT count(*) FROM ranks"), 2);
}

Test(db, a_failed_gen_begin_leaves_no_rows)
{
    dt_db_t *db = open_ok(dbpath);
    dt_emsg_t em = { "" };
    int64_t job = job_new(db, "atomic", 1000), other = job_new(db, "o", 1000);
    int64_t a = agent_new(db, job, "node01"), b = agent_new(db, other, "node02");
    /* the bad agent is the last rank: the generation and three ranks are
     * already inserted when it is found */
    const int64_t bad[] = { a, a, a, b }, good[] = { a, a, a, a };
    struct events ev;

    cr_assert_eq(dt_db_gen_begin(db, job, 1, 4, bad, 100, &em), DT_EINVAL);
    assert_has(em.s, "rank 3");
    cr_assert_eq(raw_int(dbpath, "SELECT count(*) FROM generations"), 0);
    cr_assert_eq(raw_int(dbpath, "SELECT count(*) FROM ranks"), 0);
    events_of(db, job, 0, &ev);
    cr_assert_eq(ev.n, 2, "submitted and agent_registered only");
    events_free(&ev);

    /* inside a caller's transaction the failure rolls the whole of it back */
    cr_assert_eq(dt_db_begin(db, &em), 0, "%s", em.s);
    cr_assert_eq(dt_db_event_add(db, job, "note", "inside", &em), 0, "%s", em.s);
    cr_assert_eq(dt_db_gen_begin(db, job, 1, 4, bad, 100, &em), DT_EINVAL);
    cr_assert_eq(dt_db_commit(db, &em), DT_EIO);
    cr_assert_eq(raw_int(dbpath, "SELECT count(*) FROM generations"), 0);
    cr_assert_eq(raw_int(dbpath, "SELECT count(*) FROM ranks"), 0);
    cr_assert_eq(raw_int(dbpath, "SELECT count(*) FROM events WHERE kind = 'note'"), 0);

    /* and generation 1 is still the next one */
    cr_assert_eq(dt_db_gen_begin(db, job, 1, 4, good, 100, &em), 0, "%s", em.s);
    dt_db_close(db);
    cr_assert_eq(raw_int(dbpath, "SELECT count(*) FROM ranks WHERE step = 100"), 4);
}

Test(db, rank_set_updates_one_rank)
{
    dt_db_t *db = open_ok(dbpath);
    dt_emsg_t em = { "" };
    int64_t job = job_new(db, "r", 1000), a = agent_new(db, job, "node01");
    const int64_t place[] = { a, a, a };
    static const char *const states[] = { "starting", "running", "exited", "failed",
                                          "hung",     "killed",  "lost" };
    char want[160];
    struct ranks vr;
    int64_t before;

    cr_assert_eq(dt_db_gen_begin(db, job, 1, 3, place, 0, &em), 0, "%s", em.s);
    before = count_events(db, job);
    cr_assert_eq(dt_db_rank_set(db, job, 1, 1, "running", 10, 4242, &em), 0, "%s", em.s);
    ranks_of(db, job, 1, &vr);
    cr_assert_str_eq(vr.r[1].state, "running");
    cr_assert_eq(vr.r[1].step, 10);
    cr_assert_eq(vr.r[1].pid, 4242);
    for (int r = 0; r < 3; r += 2) {
        cr_assert_str_eq(vr.r[r].state, "starting", "rank %d untouched", r);
        cr_assert_eq(vr.r[r].step, 0);
        cr_assert_eq(vr.r[r].pid, 0);
    }
    ranks_free(&vr);
    for (size_t i = 0; i < sizeof(states) / sizeof(states[0]); i++)
        cr_assert_eq(dt_db_rank_set(db, job, 1, 2, states[i], 20 + (int64_t)i, 77, &em), 0,
                     "%s: %s", states[i], em.s);
    ranks_of(db, job, 1, &vr);
    cr_assert_str_eq(vr.r[2].state, "lost");
    cr_assert_eq(vr.r[2].step, 26);
    ranks_free(&vr);

    /* refusals change nothing */
    cr_assert_eq(dt_db_rank_set(db, job, 1, 1, "zombie", 11, 4242, &em), DT_EINVAL);
    snprintf(want, sizeof(want),
             "job %" PRId64 " gen 1 rank 1: unknown state 'zombie' (starting, running, exited, "
             "failed, hung, killed or lost)",
             job);
    cr_assert_str_eq(em.s, want);
    cr_assert_eq(dt_db_rank_set(db, job, 1, 1, "Running", 11, 4242, &em), DT_EINVAL);
    cr_assert_eq(dt_db_rank_set(db, job, 1, 1, "running", -1, 4242, &em), DT_EINVAL);
    cr_assert_eq(dt_db_rank_set(db, job, 1, 1, "running", 11, -3, &em), DT_EINVAL);
    assert_has(em.s, "rank 1: negative step");
    cr_assert_eq(dt_db_rank_set(db, job, 1, 7, "running", 11, 1, &em), DT_ENOENT);
    snprintf(want, sizeof(want), "job %" PRId64 " gen 1: no rank 7", job);
    cr_assert_str_eq(em.s, want);
    cr_assert_eq(dt_db_rank_set(db, job, 9, 0, "running", 11, 1, &em), DT_ENOENT);
    snprintf(want, sizeof(want), "job %" PRId64 ": no generation 9", job);
    cr_assert_str_eq(em.s, want);
    ranks_of(db, job, 1, &vr);
    cr_assert_str_eq(vr.r[1].state, "running");
    cr_assert_eq(vr.r[1].step, 10);
    ranks_free(&vr);

    /* progress writes no events */
    cr_assert_eq(count_events(db, job), before);
    dt_db_close(db);
}

/*-- durability ---------------------------------------------------------------*/

Test(db, reopen_keeps_everything)
{
    dt_db_t *db = open_ok(dbpath);
    dt_emsg_t em = { "" };
    int64_t job = job_new(db, "durable", 4242), aid = 0;
    struct events ev;
    struct agents va = { 0 };
    struct ckpts vc;
    dt_job_t j;

    cr_assert_eq(dt_db_job_plan(db, job, "{\"ranks\":4}", &em), 0, "%s", em.s);
    cr_assert_eq(dt_db_job_transition(db, job, DT_JOB_QUEUED, NULL, "waiting", &em), 0);
    cr_assert_eq(dt_db_agent_register(db, job, "n1", 4, &aid, &em), 0, "%s", em.s);
    cr_assert_eq(dt_db_shard_add(db, job, 50, 0, "/ck/50/r0", 123, sha_a, &em), 0, "%s", em.s);
    cr_assert_eq(dt_db_checkpoint_set_state(db, job, 50, "committed", &em), 0, "%s", em.s);
    dt_db_close(db);

    db = open_ok(dbpath);
    cr_assert_eq(dt_db_job_get(db, job, &j, &em), 0, "%s", em.s);
    cr_assert_str_eq(j.name, "durable");
    cr_assert_eq(j.owner, 4242);
    cr_assert_eq(j.state, DT_JOB_QUEUED);
    cr_assert_str_eq(j.reason, "waiting");
    cr_assert_str_eq(j.plan, "{\"ranks\":4}");
    cr_assert_str_eq(j.spec, "kind = attn\n");
    cr_assert_eq(j.slurm_id, 0);
    cr_assert_gt(j.created_ms, 0);
    dt_job_clear(&j);
    events_of(db, job, 0, &ev);
    cr_assert_eq(ev.n, 6);
    events_free(&ev);
    cr_assert_eq(dt_db_agents(db, job, agent_cb, &va, &em), 0);
    cr_assert_eq(va.n, 1);
    cr_assert_eq(va.a[0].id, aid);
    agents_free(&va);
    ckpts_of(db, job, &vc);
    cr_assert_eq(vc.n, 1);
    cr_assert_str_eq(vc.c[0].state, "committed");
    cr_assert_eq(vc.c[0].bytes, 123);
    ckpts_free(&vc);
    /* new ids go on from where they were */
    cr_assert_gt(job_new(db, "next", 1), job);
    dt_db_close(db);
}

Test(db, a_killed_process_loses_no_commit)
{
    int64_t id = 0;
    int status = 0;
    pid_t pid = fork();

    cr_assert_geq(pid, 0, "fork: %s", strerror(errno));
    if (pid == 0) {
        dt_emsg_t em = { "" };
        dt_db_t *db = NULL;
        if (dt_db_open(dbpath, &db, &em) != 0 ||
            dt_db_job_create(db, "killed", 1000, "kind = attn\n", &id, &em) != 0 ||
            dt_db_job_plan(db, id, "{}", &em) != 0)
            _exit(1);
        raise(SIGKILL); /* no close, no checkpoint of the WAL */
        _exit(2);
    }
    cr_assert_eq(waitpid(pid, &status, 0), pid);
    cr_assert(WIFSIGNALED(status) && WTERMSIG(status) == SIGKILL, "child status %#x", status);

    dt_db_t *db = open_ok(dbpath);
    cr_assert_eq(job_state_of(db, 1), DT_JOB_PLANNED);
    dt_db_close(db);
}

/*-- ids that do not exist ----------------------------------------------------*/

static int never_cb(const void *row)
{
    (void)row;
    cr_assert_fail("callback called for a failed walk");
    return 0;
}

static int never_event(const dt_event_t *e, void *arg)
{
    (void)arg;
    return never_cb(e);
}

static int never_agent(const dt_agent_t *a, void *arg)
{
    (void)arg;
    return never_cb(a);
}

static int never_ckpt(const dt_checkpoint_t *c, void *arg)
{
    (void)arg;
    return never_cb(c);
}

static int never_shard(const dt_shard_t *s, void *arg)
{
    (void)arg;
    return never_cb(s);
}

static int never_rank(const dt_rank_t *r, void *arg)
{
    (void)arg;
    return never_cb(r);
}

Test(db, missing_ids_are_enoent)
{
    dt_db_t *db = open_ok(dbpath);
    dt_emsg_t em = { "" };
    int64_t job = job_new(db, "real", 1000), aid = 0;
    const int64_t no = 999;
    dt_job_t j;
    dt_agent_t a;

    cr_assert_eq(dt_db_job_get(db, no, &j, &em), DT_ENOENT);
    cr_assert_str_eq(em.s, "job 999: no such job");
    cr_assert_eq(dt_db_job_transition(db, no, DT_JOB_FAILED, NULL, NULL, &em), DT_ENOENT);
    cr_assert_str_eq(em.s, "job 999: no such job");
    cr_assert_eq(dt_db_job_plan(db, no, "{}", &em), DT_ENOENT);
    cr_assert_eq(dt_db_event_add(db, no, "note", NULL, &em), DT_ENOENT);
    cr_assert_eq(dt_db_events(db, no, 0, never_event, NULL, &em), DT_ENOENT);
    cr_assert_eq(dt_db_agent_register(db, no, "n1", 1, &aid, &em), DT_ENOENT);
    cr_assert_eq(dt_db_agents(db, no, never_agent, NULL, &em), DT_ENOENT);
    cr_assert_eq(dt_db_agent_get(db, no, &a, &em), DT_ENOENT);
    cr_assert_str_eq(em.s, "agent 999: no such agent");
    cr_assert_eq(dt_db_agent_set_state(db, no, "gone", 1, &em), DT_ENOENT);
    cr_assert_eq(dt_db_shard_add(db, no, 1, 0, "/x", 1, sha_a, &em), DT_ENOENT);
    cr_assert_eq(dt_db_checkpoint_set_state(db, no, 1, "committed", &em), DT_ENOENT);
    cr_assert_eq(dt_db_checkpoints(db, no, never_ckpt, NULL, &em), DT_ENOENT);
    cr_assert_eq(dt_db_shards(db, no, 1, never_shard, NULL, &em), DT_ENOENT);
    cr_assert_str_eq(em.s, "job 999: no such job");
    cr_assert_eq(dt_db_shards(db, job, 1, never_shard, NULL, &em), DT_ENOENT);

    const int64_t place[] = { 1 };
    char *result = NULL;
    dt_gen_t g;
    cr_assert_eq(dt_db_job_set_result(db, no, "{}", &em), DT_ENOENT);
    cr_assert_str_eq(em.s, "job 999: no such job");
    cr_assert_eq(dt_db_job_result(db, no, &result, &em), DT_ENOENT);
    cr_assert_null(result);
    cr_assert_eq(dt_db_gen_begin(db, no, 1, 1, place, 0, &em), DT_ENOENT);
    cr_assert_str_eq(em.s, "job 999: no such job");
    cr_assert_eq(dt_db_gen_end(db, no, 1, "x", &em), DT_ENOENT);
    cr_assert_str_eq(em.s, "job 999: no such job");
    cr_assert_eq(dt_db_gen_last(db, no, &g, &em), DT_ENOENT);
    cr_assert_eq(dt_db_gen_ranks(db, no, 1, never_rank, NULL, &em), DT_ENOENT);
    cr_assert_eq(dt_db_gen_ranks(db, job, 1, never_rank, NULL, &em), DT_ENOENT);
    cr_assert_str_eq(em.s, "job 1: no generation 1");
    cr_assert_eq(dt_db_rank_set(db, no, 1, 0, "running", 1, 1, &em), DT_ENOENT);
    cr_assert_str_eq(em.s, "job 999: no such job");

    /* nothing was written for the missing job, and the real one is untouched */
    dt_db_close(db);
    cr_assert_eq(raw_int(dbpath, "SELECT count(*) FROM events"), 1);
    cr_assert_eq(raw_int(dbpath, "SELECT count(*) FROM agents"), 0);
    cr_assert_eq(raw_int(dbpath, "SELECT count(*) FROM checkpoints"), 0);
    cr_assert_eq(raw_int(dbpath, "SELECT count(*) FROM generations"), 0);
    cr_assert_eq(raw_int(dbpath, "SELECT count(*) FROM jobs WHERE result IS NOT NULL"), 0);
    cr_assert_eq(raw_int(dbpath, "SELECT max(id) FROM jobs"), job);
}

/*-- Slurm jobs (version 4) ---------------------------------------------------*/

static void to_state(dt_db_t *db, int64_t id, enum dt_job_state to)
{
    dt_emsg_t em = { "" };
    cr_assert_eq(dt_db_job_transition(db, id, to, NULL, NULL, &em), 0, "%s", em.s);
}

Test(db, slurm_jobs_are_recorded_followed_and_kept)
{
    dt_db_t *db = open_ok(dbpath);
    dt_emsg_t em = { "" };
    dt_slurm_job_t s;
    int changed = -1;
    int64_t id = job_new(db, "sl", 1000);

    cr_assert_eq(dt_db_slurm_get(db, id, &s, &em), DT_ENOENT);
    cr_assert_eq(dt_db_slurm_submitted(db, id, 41, "/o/dt-1.out", "n9", "3 nodes", &em), 0, "%s",
                 em.s);
    cr_assert_eq(dt_db_slurm_submitted(db, id, 41, "", "", NULL, &em), DT_EEXIST);
    cr_assert_eq(dt_db_slurm_submitted(db, id + 100, 42, "", "", NULL, &em), DT_ENOENT);
    cr_assert_eq(dt_db_slurm_get(db, id, &s, &em), 0, "%s", em.s);
    cr_assert_eq(s.slurm_id, 41);
    cr_assert_str_eq(s.state, "SUBMITTED");
    cr_assert_str_eq(s.exclude, "n9");
    cr_assert_str_eq(s.output, "/o/dt-1.out");
    cr_assert_eq(s.exit_code, -1);
    dt_slurm_job_clear(&s);

    int64_t before = count_events(db, id);
    dt_slurm_job_t u = { .slurm_id = 41, .state = "PENDING", .reason = "Resources",
                         .nodes = "", .exclude = "n9", .exit_code = -1 };
    cr_assert_eq(dt_db_slurm_update(db, &u, &changed, &em), 0, "%s", em.s);
    cr_assert_eq(changed, 1);
    cr_assert_eq(dt_db_slurm_update(db, &u, &changed, &em), 0, "%s", em.s);
    cr_assert_eq(changed, 0, "the same state again is no new event");
    u.state = "RUNNING";
    u.reason = "None";
    u.nodes = "n[1-2]";
    cr_assert_eq(dt_db_slurm_update(db, &u, &changed, &em), 0, "%s", em.s);
    cr_assert_eq(changed, 1);
    cr_assert_eq(count_events(db, id), before + 2);
    char *d = raw_text(dbpath, "SELECT detail FROM events WHERE kind = 'slurm_state' "
                               "ORDER BY id DESC LIMIT 1");
    cr_assert_str_eq(d, "slurm job 41: RUNNING on n[1-2]");
    free(d);
    u.slurm_id = 999;
    cr_assert_eq(dt_db_slurm_update(db, &u, &changed, &em), DT_ENOENT);
    dt_db_close(db);

    /* a reopened database has it all */
    db = open_ok(dbpath);
    cr_assert_eq(dt_db_slurm_get(db, id, &s, &em), 0, "%s", em.s);
    cr_assert_str_eq(s.state, "RUNNING");
    cr_assert_str_eq(s.nodes, "n[1-2]");
    dt_slurm_job_clear(&s);
    dt_job_t j;
    cr_assert_eq(dt_db_job_get(db, id, &j, &em), 0, "%s", em.s);
    cr_assert_eq(j.slurm_id, 41);
    dt_job_clear(&j);
    dt_db_close(db);
}

Test(db, requeue_counts_and_costs_a_restart_only_on_failure)
{
    dt_db_t *db = open_ok(dbpath);
    dt_emsg_t em = { "" };
    dt_job_t j;
    int rq, base;
    int64_t id = job_new(db, "rq", 1000);

    to_state(db, id, DT_JOB_PLANNED);
    to_state(db, id, DT_JOB_QUEUED);
    to_state(db, id, DT_JOB_STARTING);
    to_state(db, id, DT_JOB_RUNNING);
    cr_assert_eq(dt_db_job_requeue(db, id, false, "requeued", "time limit", &em), 0, "%s", em.s);
    cr_assert_eq(job_state_of(db, id), DT_JOB_QUEUED);
    cr_assert_eq(dt_db_job_get(db, id, &j, &em), 0, "%s", em.s);
    cr_assert_eq(j.restarts, 0, "a planned requeue costs no restart");
    cr_assert_str_eq(j.reason, "time limit");
    dt_job_clear(&j);
    to_state(db, id, DT_JOB_STARTING);
    cr_assert_eq(dt_db_job_requeue(db, id, true, "requeued", "node lost", &em), 0, "%s", em.s);
    cr_assert_eq(dt_db_job_counts(db, id, &rq, &base, &em), 0, "%s", em.s);
    cr_assert_eq(rq, 2);
    cr_assert_eq(dt_db_job_get(db, id, &j, &em), 0, "%s", em.s);
    cr_assert_eq(j.restarts, 1);
    dt_job_clear(&j);

    /* not from a finished job; a refusal leaves its event and nothing else */
    to_state(db, id, DT_JOB_CANCELLED);
    cr_assert_eq(dt_db_job_requeue(db, id, true, NULL, "x", &em), DT_EINVAL);
    assert_has(em.s, "cannot be requeued while cancelled");
    cr_assert_eq(job_state_of(db, id), DT_JOB_CANCELLED);
    dt_db_close(db);
}

Test(db, resume_reopens_a_finished_job_with_a_fresh_budget)
{
    dt_db_t *db = open_ok(dbpath);
    dt_emsg_t em = { "" };
    dt_job_t j;
    int rq, base;
    int64_t id = job_new(db, "rs", 1000);

    to_state(db, id, DT_JOB_PLANNED);
    to_state(db, id, DT_JOB_QUEUED);
    cr_assert_eq(dt_db_job_resume(db, id, "again", &em), DT_EINVAL, "a queued job is not resumed");
    to_state(db, id, DT_JOB_STARTING);
    to_state(db, id, DT_JOB_RECOVERING);
    to_state(db, id, DT_JOB_FAILED);
    cr_assert_eq(dt_db_slurm_submitted(db, id, 7, "", "", NULL, &em), 0, "%s", em.s);
    cr_assert_eq(dt_db_job_resume(db, id, "from step 100", &em), 0, "%s", em.s);
    cr_assert_eq(job_state_of(db, id), DT_JOB_QUEUED);
    cr_assert_eq(dt_db_job_counts(db, id, &rq, &base, &em), 0, "%s", em.s);
    cr_assert_eq(base, 1, "the budget counts from the restarts so far");
    cr_assert_eq(dt_db_job_get(db, id, &j, &em), 0, "%s", em.s);
    cr_assert_eq(j.slurm_id, 0, "the next submission is a new Slurm job");
    dt_job_clear(&j);
    cr_assert_eq(raw_int(dbpath, "SELECT count(*) FROM slurm_jobs WHERE slurm_id = 7"), 1,
                 "the old Slurm job's row is kept");
    dt_db_close(db);
}

/*-- version 5: manifests as the agents report them; restarts while recovering --*/

Test(db, manifest_recorded_cleared_when_the_step_starts_over)
{
    dt_db_t *db = open_ok(dbpath);
    dt_emsg_t em = { "" };
    char *m = NULL;
    int64_t id = job_new(db, "man", 1000);

    to_state(db, id, DT_JOB_PLANNED);
    to_state(db, id, DT_JOB_QUEUED);
    to_state(db, id, DT_JOB_STARTING);
    /* the manifest may come before any shard: the checkpoint is made partial */
    cr_assert_eq(dt_db_checkpoint_set_manifest(db, id, 10, "[\"a\",\"b\"]", &em), 0, "%s", em.s);
    cr_assert_eq(dt_db_checkpoint_manifest(db, id, 10, &m, &em), 0, "%s", em.s);
    cr_assert_str_eq(m, "[\"a\",\"b\"]");
    free(m);
    cr_assert_eq(dt_db_shard_add(db, id, 10, 0, "/ck/10/r0", 10, sha_a, &em), 0, "%s", em.s);
    struct ckpts vc;
    ckpts_of(db, id, &vc);
    cr_assert_eq(vc.n, 1);
    cr_assert_str_eq(vc.c[0].state, "partial");
    cr_assert_eq(vc.c[0].shards, 1);
    ckpts_free(&vc);
    /* a step with no manifest yet reads as NULL; no checkpoint is ENOENT */
    cr_assert_eq(dt_db_shard_add(db, id, 20, 0, "/ck/20/r0", 10, sha_a, &em), 0, "%s", em.s);
    cr_assert_eq(dt_db_checkpoint_manifest(db, id, 20, &m, &em), 0, "%s", em.s);
    cr_assert_null(m);
    cr_assert_eq(dt_db_checkpoint_manifest(db, id, 30, &m, &em), DT_ENOENT);
    cr_assert_null(m);
    /* committed: a manifest for it is refused, the recorded one kept */
    cr_assert_eq(dt_db_checkpoint_set_state(db, id, 10, "committed", &em), 0, "%s", em.s);
    cr_assert_eq(dt_db_checkpoint_set_manifest(db, id, 10, "[\"x\"]", &em), DT_EINVAL);
    assert_has(em.s, "already committed");
    /* corrupt, then written again: the old manifest goes with the old shards */
    cr_assert_eq(dt_db_checkpoint_set_state(db, id, 10, "corrupt", &em), 0, "%s", em.s);
    cr_assert_eq(dt_db_shard_add(db, id, 10, 1, "/ck/10/r1", 10, sha_b, &em), 0, "%s", em.s);
    cr_assert_eq(dt_db_checkpoint_manifest(db, id, 10, &m, &em), 0, "%s", em.s);
    cr_assert_null(m, "the manifest of the step's earlier writing is forgotten");
    dt_db_close(db);
}

Test(db, a_restart_while_recovering_counts_without_a_transition)
{
    dt_db_t *db = open_ok(dbpath);
    dt_emsg_t em = { "" };
    dt_job_t j;
    int64_t id = job_new(db, "again", 1000);

    to_state(db, id, DT_JOB_PLANNED);
    to_state(db, id, DT_JOB_QUEUED);
    to_state(db, id, DT_JOB_STARTING);
    cr_assert_eq(dt_db_job_restart_again(db, id, "too early", &em), DT_EINVAL);
    assert_has(em.s, "not recovering");
    to_state(db, id, DT_JOB_RECOVERING);
    cr_assert_eq(dt_db_job_restart_again(db, id, "gen 2 failed at start-up", &em), 0, "%s", em.s);
    cr_assert_eq(dt_db_job_get(db, id, &j, &em), 0, "%s", em.s);
    cr_assert_eq(j.state, DT_JOB_RECOVERING);
    cr_assert_eq(j.restarts, 2, "one for the first abort, one for this");
    cr_assert_str_eq(j.reason, "gen 2 failed at start-up");
    dt_job_clear(&j);
    struct events ev;
    events_of(db, id, 0, &ev);
    cr_assert_str_eq(ev.kind[ev.n - 1], "recovering");
    events_free(&ev);
    dt_db_close(db);
}

/*-- steps, failure costs, goodput (version 7) -----------------------------------*/

/* Add steps [from, to] of gen: each step_ms long, reported every
 * step_ms + gap_ms from at0 (the first report at at0 + step_ms). */
static int64_t add_steps(dt_db_t *db, int64_t job, int gen, int64_t from, int64_t to, double step_ms,
                         int64_t gap_ms, int64_t at0)
{
    dt_emsg_t em = { "" };
    int64_t at = at0;

    for (int64_t k = from; k <= to; k++) {
        at += (int64_t)step_ms + gap_ms;
        dt_step_row_t s = { .job = job, .gen = gen, .step = k, .at_ms = at, .step_ms = step_ms,
                            .loss = 10.0 / (double)k, .tokens_s = 1000 };
        cr_assert_eq(dt_db_step_add(db, &s, 0, &em), 0, "step %" PRId64 ": %s", k, em.s);
    }
    return at;
}

static int step_count_cb(const dt_step_row_t *s, void *arg)
{
    int64_t *n = arg;
    cr_assert(s->step % 2 == 0 || n[1] == 1, "step %" PRId64 " kept at stride %" PRId64, s->step,
              n[1]);
    n[0]++;
    return 0;
}

Test(db, steps_failure_cost_and_goodput)
{
    dt_db_t *db = open_ok(dbpath);
    dt_emsg_t em = { "" };
    int64_t job = job_new(db, "g", 1000), a = agent_new(db, job, "node01");
    const int64_t place[] = { a };
    dt_goodput_t gp;
    struct events ev;

    cr_assert_eq(dt_db_goodput(db, job, dt_clock_wall_ms(), &gp, &em), 0, "%s", em.s);
    cr_assert_eq(gp.first_ms, 0);
    cr_assert(isnan(gp.ettr), "no ETTR before a step");

    /* gen 1: steps 1..10, 100 ms each, 10 ms between; a 50 ms
     * checkpoint stall before step 5 */
    cr_assert_eq(dt_db_gen_begin(db, job, 1, 1, place, 0, &em), 0, "%s", em.s);
    int64_t at0 = 1000000;
    int64_t at = add_steps(db, job, 1, 1, 4, 100, 10, at0);
    dt_step_row_t s5 = { .job = job, .gen = 1, .step = 5, .at_ms = at + 160, .step_ms = 100,
                         .loss = NAN, .tokens_s = NAN };
    cr_assert_eq(dt_db_step_add(db, &s5, 50, &em), 0, "%s", em.s);
    at = add_steps(db, job, 1, 6, 10, 100, 10, at + 160);
    /* refused: not past the newest, bad times, no such generation */
    dt_step_row_t bad = { .job = job, .gen = 1, .step = 10, .at_ms = at, .step_ms = 1 };
    cr_assert_eq(dt_db_step_add(db, &bad, 0, &em), DT_EINVAL);
    assert_has(em.s, "not past its newest step");
    bad.step = 11;
    bad.step_ms = -1;
    cr_assert_eq(dt_db_step_add(db, &bad, 0, &em), DT_EINVAL);
    bad.step_ms = 1;
    cr_assert_eq(dt_db_step_add(db, &bad, NAN, &em), DT_EINVAL);
    bad.gen = 3;
    cr_assert_eq(dt_db_step_add(db, &bad, 0, &em), DT_ENOENT);

    cr_assert_eq(dt_db_goodput(db, job, at, &gp, &em), 0, "%s", em.s);
    cr_assert_eq(gp.first_ms, at0 + 10, "the first step started when reported less its time");
    cr_assert_float_eq(gp.step_s, 1.0, 1e-9);
    cr_assert_float_eq(gp.productive_s, 1.0, 1e-9);
    cr_assert_float_eq(gp.stall_s, 0.05, 1e-9);
    cr_assert_float_eq(gp.wall_s, (double)(at - gp.first_ms) / 1000, 1e-9);
    cr_assert_float_eq(gp.ettr, gp.productive_s / gp.wall_s, 1e-12);
    cr_assert_lt(gp.ettr, 1.0);

    /* the failure: gen 1 ends, gen 2 resumes from step 4 and redoes 5..10 */
    int64_t fault = at + 5;
    cr_assert_eq(dt_db_gen_end(db, job, 1, "rank 0 failed", &em), 0, "%s", em.s);
    cr_assert_eq(dt_db_gen_begin(db, job, 2, 1, place, 4, &em), 0, "%s", em.s);
    dt_fail_cost_t fc = { .gen = 1, .next = 2, .what = "worker", .fault_ms = fault,
                          .decided_ms = fault + 300 };
    cr_assert_eq(dt_db_failure_cost(db, job, &fc, &em), DT_EINVAL, "no step of gen 2 yet");
    assert_has(em.s, "no step finished yet");
    dt_gen_t g;
    cr_assert_eq(dt_db_gen_last(db, job, &g, &em), 0, "%s", em.s);
    int64_t started = g.started_ms;
    dt_gen_clear(&g);
    /* its first step starts 2 s after the generation did */
    int64_t at2 = add_steps(db, job, 2, 5, 12, 100, 0, started + 2000);
    fc.what = "worker; drop";
    cr_assert_eq(dt_db_failure_cost(db, job, &fc, &em), DT_EINVAL, "a word only");
    fc.what = "worker";
    cr_assert_eq(dt_db_failure_cost(db, job, &fc, &em), 0, "%s", em.s);
    cr_assert_float_eq(fc.detect_s, 0.3, 1e-9);
    cr_assert_float_eq(fc.restart_s, (double)(started - fault - 300) / 1000, 1e-9);
    cr_assert_float_eq(fc.load_s, 2.0, 1e-9);
    cr_assert_eq(fc.resume_step, 4);
    cr_assert_eq(fc.recomputed_steps, 6);
    cr_assert_float_eq(fc.recomputed_s, 0.6, 1e-9);
    events_of(db, job, 0, &ev);
    cr_assert_str_eq(ev.kind[ev.n - 1], "failure_cost");
    char want[400];
    snprintf(want, sizeof(want),
             "{\"gen\":1,\"next\":2,\"fault\":\"worker\",\"detect_s\":0.300,"
             "\"restart_s\":%.3f,\"load_s\":2.000,\"resume_step\":4,"
             "\"recomputed_steps\":6,\"recomputed_s\":0.600}",
             fc.restart_s);
    cr_assert_str_eq(ev.detail[ev.n - 1], want);
    events_free(&ev);

    cr_assert_eq(dt_db_goodput(db, job, at2 + 1000, &gp, &em), 0, "%s", em.s);
    cr_assert_float_eq(gp.step_s, 1.8, 1e-9);
    cr_assert_float_eq(gp.productive_s, 1.2, 1e-9, "4 steps of gen 1, 8 of gen 2");
    cr_assert_float_eq(gp.recomputed_s, 0.6, 1e-9);
    cr_assert_eq(gp.failures, 1);
    cr_assert_float_eq(gp.load_s, 2.0, 1e-9);
    cr_assert_eq(gp.end_ms, at2 + 1000, "a running job counts to now");

    /* a job that ended counts to its last step */
    cr_assert_eq(dt_db_job_transition(db, job, DT_JOB_CANCELLED, NULL, NULL, &em), 0, "%s", em.s);
    cr_assert_eq(dt_db_goodput(db, job, at2 + 99999, &gp, &em), 0, "%s", em.s);
    cr_assert_eq(gp.end_ms, at2);
    dt_db_close(db);
    cr_assert_eq(raw_int(dbpath, "SELECT count(*) FROM steps"), 18);
}

Test(db, step_rows_are_thinned_and_sums_kept)
{
    dt_db_t *db = open_ok(dbpath);
    dt_emsg_t em = { "" };
    int64_t job = job_new(db, "g", 1000), a = agent_new(db, job, "node01");
    const int64_t place[] = { a };
    int64_t n = DT_DB_STEP_ROWS + 1;

    cr_assert_eq(dt_db_gen_begin(db, job, 1, 1, place, 0, &em), 0, "%s", em.s);
    cr_assert_eq(dt_db_begin(db, &em), 0, "%s", em.s);
    int64_t at = add_steps(db, job, 1, 1, n + 6, 2, 0, 0);
    cr_assert_eq(dt_db_commit(db, &em), 0, "%s", em.s);
    int64_t cnt[2] = { 0, 2 };
    cr_assert_eq(dt_db_steps(db, job, step_count_cb, cnt, &em), 0, "%s", em.s);
    cr_assert_eq(cnt[0], (n + 6) / 2, "every second step kept");
    dt_goodput_t gp;
    cr_assert_eq(dt_db_goodput(db, job, at, &gp, &em), 0, "%s", em.s);
    cr_assert_float_eq(gp.step_s, (double)(n + 6) * 0.002, 1e-9, "the sums are exact");
    /* a resume from an odd (thinned) step: the nearest row below counts */
    cr_assert_eq(dt_db_gen_end(db, job, 1, "failed", &em), 0, "%s", em.s);
    cr_assert_eq(dt_db_gen_begin(db, job, 2, 1, place, 101, &em), 0, "%s", em.s);
    add_steps(db, job, 2, 102, 103, 2, 0, at);
    cr_assert_eq(dt_db_goodput(db, job, at + 10, &gp, &em), 0, "%s", em.s);
    cr_assert_float_eq(gp.productive_s, 0.200 + 0.004, 1e-9);
    dt_db_close(db);
    cr_assert_eq(raw_int(dbpath, "SELECT step_stride FROM jobs"), 2);
}

Test(db, steps_need_version_7)
{
    dt_db_t *db;
    dt_emsg_t em = { "" };
    dt_goodput_t gp;

    cr_assert_eq(dt_db_open_at(dbpath, 6, &db, &em), 0, "%s", em.s);
    int64_t job = job_new(db, "g", 1000);
    dt_step_row_t s = { .job = job, .gen = 1, .step = 1 };
    cr_assert_eq(dt_db_step_add(db, &s, 0, &em), DT_ENOTSUP);
    assert_has(em.s, "schema version 6 has no step history");
    cr_assert_eq(dt_db_goodput(db, job, 0, &gp, &em), DT_ENOTSUP);
    dt_db_close(db);
    db = open_ok(dbpath);
    cr_assert_eq(dt_db_goodput(db, job, 0, &gp, &em), 0, "%s: version 6 jobs read as no steps",
                 em.s);
    cr_assert_eq(gp.first_ms, 0);
    dt_db_close(db);
}
