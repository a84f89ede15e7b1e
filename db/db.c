/* SPDX-License-Identifier: MIT
 *
 * db.h over SQLite: opening (refusals, WAL, migrations), the statements
 * prepared once at open, and one function per state change, each a single
 * transaction that also appends its event. With the migrations in
 * db/migrate/ this is all the SQL of dt, and the only place SQLite result
 * codes are seen: they become DT_* codes here, once, with sqlite3_errmsg in
 * the message. Not here: what the states mean to the coordinator
 * (coordinator/job.c), who may see a job, or the files a checkpoint names.
 *
 * Contract details beyond db.h:
 * - List functions (jobs, events, agents, checkpoints, shards, generations,
 *   ranks) read all their rows first, then call the callback on each: a
 *   failure is reported before any callback runs, the callback may itself
 *   use the database, and the walk is one consistent snapshot. A row's strings are
 *   freed right after its callback returns; a callback copies what it
 *   keeps. The lists of a job, checkpoint or generation that does not
 *   exist fail with DT_ENOENT.
 * - restarts counts the generations aborted: it goes up by one on
 *   starting -> recovering, running -> recovering and running -> queued.
 * - Shards: the first shard of a step creates its checkpoint, partial, with
 *   one event "checkpoint_partial" ("step=N"); further shards add no event.
 *   A shard for a committed checkpoint is refused (DT_EINVAL); one for a
 *   corrupt or deleted checkpoint starts that step over as a new partial
 *   checkpoint (its old shards are dropped), since a job that resumed from
 *   an older checkpoint writes the same step again.
 * - Checkpoint states move partial -> committed | corrupt | deleted,
 *   committed -> corrupt | deleted, corrupt -> deleted; anything else is
 *   DT_EINVAL and changes nothing.
 * - Agent states are "registered", "lost" and "gone"; others are DT_EINVAL.
 * - Generations of a job are numbered 1, 2, ... with no gaps, and at most
 *   one runs at a time: the next begins only after the newest has ended.
 *   Beginning one checks every rank's agent inside the transaction, so a
 *   refused begin leaves no generation, rank or event behind. A refused
 *   begin, end or rank update writes no "refused" event (those are for job
 *   transitions).
 * - Rank states are those of rank_states[] below; rank updates write no
 *   event, since agents report progress often.
 * - A job's result must be one JSON object (SQLite's json_valid and
 *   json_type judge it); storing it again replaces it.
 * - A database opened at schema version 1 (dt_db_open_at) has no agents or
 *   checkpoints, and one at version 1 or 2 no results, generations or
 *   ranks: those functions return DT_ENOTSUP. Listing shards needs only
 *   version 2; steps, failure costs and goodput need version 7.
 * - Steps: each added step updates its generation's sums in the same
 *   transaction; its row is kept only when the step is a multiple of the
 *   job's step_stride, and a job past DT_DB_STEP_ROWS rows doubles it and
 *   drops the rows that are no longer multiples. A generation's step time
 *   at a thinned step is read at the nearest kept row below it.
 * - Goodput: a resume from step S redoes, in every earlier generation, the
 *   steps past S: walking the generations newest first, each keeps its
 *   steps up to the lowest resume step of the generations after it.
 */
#include "config.h"

#include <assert.h>
#include <errno.h>
#include <inttypes.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <sqlite3.h>

#include "common/clock.h"
#include "common/err.h"
#include "common/macros.h"
#include "common/mem.h"
#include "db/db.h"

/* dt_migrations[v - 1] takes a database from version v - 1 to v. */
#include "db/migrations.inc"


_Static_assert(DT_ARRAY_SIZE(dt_migrations) == DT_DB_VERSION,
               "one db/migrate/*.sql file per schema version");

/* PRAGMA takes no bound parameters, so each version's statement is a
 * constant: no SQL is ever formatted. */
static const char *const set_version[] = {
    NULL,
    "PRAGMA user_version = 1",
    "PRAGMA user_version = 2",
    "PRAGMA user_version = 3",
    "PRAGMA user_version = 4",
    "PRAGMA user_version = 5",
    "PRAGMA user_version = 6",
    "PRAGMA user_version = 7",
};
_Static_assert(DT_ARRAY_SIZE(set_version) == DT_DB_VERSION + 1, "one set_version per schema version");

#define BUSY_TIMEOUT_MS 5000

/*-- statements ---------------------------------------------------------------*/

/* X(name, schema version it needs, SQL). Prepared once at open when the
 * database is at that version or newer. Parameters are always bound. */
#define JOB_COLS                                                                       \
    "id, name, owner_uid, state, spec, plan, reason, slurm_id, restarts, created_ms, " \
    "updated_ms"
#define EVENT_COLS "id, job_id, at_ms, kind, state, detail"
#define AGENT_COLS "id, job_id, node, slots, state, registered_ms, last_seen_ms"
#define GEN_COLS "job_id, gen, ranks, started_ms, ended_ms, resume_step, reason"

#define STATEMENTS(X)                                                                              \
    X(BEGIN, 0, "BEGIN IMMEDIATE")                                                                 \
    X(COMMIT, 0, "COMMIT")                                                                         \
    X(ROLLBACK, 0, "ROLLBACK")                                                                     \
    X(JOB_INSERT, 1,                                                                               \
      "INSERT INTO jobs (name, owner_uid, state, spec, created_ms, updated_ms) "                   \
      "VALUES (?1, ?2, 'submitted', ?3, ?4, ?4)")                                                  \
    X(JOB_GET, 1, "SELECT " JOB_COLS " FROM jobs WHERE id = ?1")                                   \
    X(JOB_LIST, 1, "SELECT " JOB_COLS " FROM jobs WHERE ?1 IS NULL OR owner_uid = ?1 ORDER BY id") \
    X(JOB_STATE, 1, "SELECT state FROM jobs WHERE id = ?1")                                        \
    X(JOB_SET_STATE, 1,                                                                            \
      "UPDATE jobs SET state = ?2, reason = ?3, updated_ms = ?4, restarts = restarts + ?5 "        \
      "WHERE id = ?1")                                                                             \
    X(JOB_SET_PLAN, 1, "UPDATE jobs SET plan = ?2 WHERE id = ?1")                                  \
    X(EVENT_INSERT, 1,                                                                             \
      "INSERT INTO events (job_id, at_ms, kind, state, detail) VALUES (?1, ?2, ?3, ?4, ?5)")       \
    X(EVENT_LIST, 1,                                                                               \
      "SELECT " EVENT_COLS " FROM events WHERE job_id = ?1 AND id > ?2 ORDER BY id")               \
    X(AGENT_UPSERT, 2,                                                                             \
      "INSERT INTO agents (job_id, node, slots, state, registered_ms, last_seen_ms) "              \
      "VALUES (?1, ?2, ?3, 'registered', ?4, ?4) "                                                 \
      "ON CONFLICT (job_id, node) DO UPDATE SET slots = excluded.slots, "                          \
      "state = 'registered', registered_ms = excluded.registered_ms, "                             \
      "last_seen_ms = excluded.last_seen_ms RETURNING id")                                         \
    X(AGENT_GET, 2, "SELECT " AGENT_COLS " FROM agents WHERE id = ?1")                             \
    X(AGENT_LIST, 2, "SELECT " AGENT_COLS " FROM agents WHERE job_id = ?1 ORDER BY id")            \
    X(AGENT_SET_STATE, 2, "UPDATE agents SET state = ?2, last_seen_ms = ?3 WHERE id = ?1")         \
    X(CKPT_FIND, 2, "SELECT id, state FROM checkpoints WHERE job_id = ?1 AND step = ?2")           \
    X(CKPT_INSERT, 2,                                                                              \
      "INSERT INTO checkpoints (job_id, step, state, created_ms) "                                 \
      "VALUES (?1, ?2, 'partial', ?3)")                                                            \
    X(CKPT_RESTART, 2,                                                                             \
      "UPDATE checkpoints SET state = 'partial', created_ms = ?2, committed_ms = NULL "            \
      "WHERE id = ?1")                                                                             \
    X(CKPT_SET_STATE, 2,                                                                           \
      "UPDATE checkpoints SET state = ?2, "                                                        \
      "committed_ms = CASE WHEN ?2 = 'committed' THEN ?3 ELSE committed_ms END "                   \
      "WHERE id = ?1")                                                                             \
    X(CKPT_LIST, 2,                                                                                \
      "SELECT c.id, c.job_id, c.step, c.state, count(s.rank), coalesce(sum(s.bytes), 0), "         \
      "c.created_ms, c.committed_ms, NULL FROM checkpoints c "                                     \
      "LEFT JOIN shards s ON s.checkpoint_id = c.id "                                              \
      "WHERE c.job_id = ?1 GROUP BY c.id ORDER BY c.step")                                         \
    X(CKPT_LIST6, 6,                                                                               \
      "SELECT c.id, c.job_id, c.step, c.state, count(s.rank), coalesce(sum(s.bytes), 0), "         \
      "c.created_ms, c.committed_ms, c.corrupt_ms FROM checkpoints c "                             \
      "LEFT JOIN shards s ON s.checkpoint_id = c.id "                                              \
      "WHERE c.job_id = ?1 GROUP BY c.id ORDER BY c.step")                                         \
    X(CKPT_SET_CORRUPT_MS, 6, "UPDATE checkpoints SET corrupt_ms = ?2 WHERE id = ?1")              \
    X(SHARD_UPSERT, 2,                                                                             \
      "INSERT INTO shards (checkpoint_id, rank, path, bytes, sha256) "                             \
      "VALUES (?1, ?2, ?3, ?4, ?5) ON CONFLICT (checkpoint_id, rank) DO UPDATE SET "               \
      "path = excluded.path, bytes = excluded.bytes, sha256 = excluded.sha256")                    \
    X(SHARD_DROP, 2, "DELETE FROM shards WHERE checkpoint_id = ?1")                                \
    /* one row with a NULL rank for a checkpoint without shards, none for no checkpoint */         \
    X(SHARD_LIST, 2,                                                                               \
      "SELECT s.rank, s.path, s.bytes, s.sha256 FROM checkpoints c "                               \
      "LEFT JOIN shards s ON s.checkpoint_id = c.id "                                              \
      "WHERE c.job_id = ?1 AND c.step = ?2 ORDER BY s.rank")                                       \
    X(AGENT_JOB, 2, "SELECT job_id FROM agents WHERE id = ?1")                                     \
    X(JSON_TYPE, 3, "SELECT CASE WHEN json_valid(?1) THEN json_type(?1) END")                      \
    X(JOB_SET_RESULT, 3, "UPDATE jobs SET result = ?2 WHERE id = ?1")                              \
    X(JOB_RESULT, 3, "SELECT result FROM jobs WHERE id = ?1")                                      \
    X(GEN_LAST, 3,                                                                                 \
      "SELECT " GEN_COLS " FROM generations WHERE job_id = ?1 ORDER BY gen DESC LIMIT 1")          \
    X(GEN_LIST, 3, "SELECT " GEN_COLS " FROM generations WHERE job_id = ?1 ORDER BY gen")          \
    X(GEN_FIND, 2,                                                                                 \
      "SELECT ended_ms IS NOT NULL, reason FROM generations "                                      \
      "WHERE job_id = ?1 AND gen = ?2")                                                            \
    X(GEN_INSERT, 3,                                                                               \
      "INSERT INTO generations (job_id, gen, started_ms, ranks, resume_step) "                     \
      "VALUES (?1, ?2, ?3, ?4, ?5)")                                                               \
    X(GEN_END, 2,                                                                                  \
      "UPDATE generations SET ended_ms = ?3, reason = ?4 WHERE job_id = ?1 AND gen = ?2")          \
    X(RANK_INSERT, 2,                                                                              \
      "INSERT INTO ranks (job_id, gen, rank, agent_id, state, step) "                              \
      "VALUES (?1, ?2, ?3, ?4, 'starting', ?5)")                                                   \
    X(RANK_LIST, 3,                                                                                \
      "SELECT rank, agent_id, state, step, pid FROM ranks WHERE job_id = ?1 AND gen = ?2 "         \
      "ORDER BY rank")                                                                             \
    X(RANK_SET, 3,                                                                                 \
      "UPDATE ranks SET state = ?4, step = ?5, pid = ?6 "                                          \
      "WHERE job_id = ?1 AND gen = ?2 AND rank = ?3")                                              \
    X(SLURM_INSERT, 4,                                                                             \
      "INSERT INTO slurm_jobs (slurm_id, job_id, exclude, output, submitted_ms, updated_ms) "      \
      "VALUES (?1, ?2, ?3, ?4, ?5, ?5)")                                                           \
    X(SLURM_FIND, 4, "SELECT job_id FROM slurm_jobs WHERE slurm_id = ?1")                          \
    X(JOB_SET_SLURM, 4, "UPDATE jobs SET slurm_id = ?2, updated_ms = ?3 WHERE id = ?1")            \
    X(SLURM_GET, 4,                                                                                \
      "SELECT s.slurm_id, s.job_id, s.state, s.reason, s.nodes, s.exclude, s.output, "             \
      "s.restarts, s.exit_code, s.submitted_ms, s.updated_ms FROM jobs j "                         \
      "JOIN slurm_jobs s ON s.slurm_id = j.slurm_id WHERE j.id = ?1")                              \
    X(SLURM_READ, 4,                                                                               \
      "SELECT job_id, state, reason, nodes, restarts FROM slurm_jobs WHERE slurm_id = ?1")         \
    X(SLURM_SET, 4,                                                                                \
      "UPDATE slurm_jobs SET state = ?2, reason = ?3, nodes = ?4, exclude = ?5, restarts = ?6, "   \
      "exit_code = ?7, updated_ms = ?8 WHERE slurm_id = ?1")                                       \
    X(JOB_REQUEUE, 4,                                                                              \
      "UPDATE jobs SET state = 'queued', reason = ?2, updated_ms = ?3, requeues = requeues + 1, "  \
      "restarts = restarts + ?4 WHERE id = ?1")                                                    \
    X(JOB_RESUME, 4,                                                                               \
      "UPDATE jobs SET state = 'queued', reason = ?2, updated_ms = ?3, restart_base = restarts, "  \
      "slurm_id = 0 WHERE id = ?1")                                                                \
    X(JOB_COUNTS, 4, "SELECT requeues, restart_base FROM jobs WHERE id = ?1")                      \
    X(JOB_RESTART_AGAIN, 1,                                                                        \
      "UPDATE jobs SET reason = ?2, updated_ms = ?3, restarts = restarts + 1 WHERE id = ?1")      \
    X(CKPT_SET_MANIFEST, 5, "UPDATE checkpoints SET manifest = ?2 WHERE id = ?1")                \
    X(CKPT_MANIFEST, 5, "SELECT id, manifest FROM checkpoints WHERE job_id = ?1 AND step = ?2") \
    X(JOB_STRIDE, 7, "SELECT step_stride FROM jobs WHERE id = ?1")                                 \
    X(JOB_SET_STRIDE, 7, "UPDATE jobs SET step_stride = ?2 WHERE id = ?1")                         \
    X(STEP_INSERT, 7,                                                                              \
      "INSERT INTO steps (job_id, gen, step, at_ms, step_ms, work_ms, loss, tokens_s) "            \
      "VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8)")                                                   \
    X(STEP_COUNT, 7, "SELECT count(*) FROM steps WHERE job_id = ?1")                               \
    X(STEP_THIN, 7, "DELETE FROM steps WHERE job_id = ?1 AND step % ?2 != 0")                      \
    X(STEP_LIST, 7,                                                                                \
      "SELECT job_id, gen, step, at_ms, step_ms, work_ms, loss, tokens_s FROM steps "              \
      "WHERE job_id = ?1 ORDER BY gen, step")                                                      \
    X(STEP_WORK_AT, 7,                                                                             \
      "SELECT work_ms FROM steps WHERE job_id = ?1 AND gen = ?2 AND step <= ?3 "                   \
      "ORDER BY step DESC LIMIT 1")                                                                \
    X(GEN_ADD_STEP, 7,                                                                             \
      "UPDATE generations SET last_step = ?3, first_step_ms = coalesce(first_step_ms, ?4), "       \
      "last_step_ms = ?5, work_ms = work_ms + ?6, stall_ms = stall_ms + ?7 "                       \
      "WHERE job_id = ?1 AND gen = ?2")                                                            \
    X(GEN_SUMS, 7,                                                                                 \
      "SELECT gen, started_ms, ended_ms, resume_step, last_step, first_step_ms, last_step_ms, "    \
      "work_ms, stall_ms, cost IS NOT NULL, json_extract(cost, '$.detect_s'), "                    \
      "json_extract(cost, '$.restart_s'), json_extract(cost, '$.load_s') "                         \
      "FROM generations WHERE job_id = ?1 ORDER BY gen")                                           \
    X(GEN_STEPPED, 7,                                                                              \
      "SELECT ended_ms IS NOT NULL, last_step, work_ms FROM generations "                          \
      "WHERE job_id = ?1 AND gen = ?2")                                                            \
    X(GEN_SET_COST, 7, "UPDATE generations SET cost = ?3 WHERE job_id = ?1 AND gen = ?2")         \
    X(GEN_COSTS, 7,                                                                                \
      "SELECT gen, cost FROM generations WHERE job_id = ?1 AND cost IS NOT NULL ORDER BY gen")

enum stmt {
#define STMT_ENUM(name, ver, sql) S_##name,
    STATEMENTS(STMT_ENUM)
#undef STMT_ENUM
        S_COUNT
};

static const struct {
    int version;
    const char *sql;
} stmt_def[S_COUNT] = {
#define STMT_DEF(name, ver, sql) [S_##name] = { (ver), sql },
    STATEMENTS(STMT_DEF)
#undef STMT_DEF
};

struct dt_db {
    sqlite3 *h;
    int outer;        /* inside dt_db_begin: calls join that transaction */
    int outer_failed; /* a call inside it failed: commit must roll back */
    char *path;  /* for messages */
    int version; /* user_version after migration */
    sqlite3_stmt *st[S_COUNT];
};

/* A transition that ends a generation of workers early. */
static bool aborts_generation(enum dt_job_state from, enum dt_job_state to)
{
    return (from == DT_JOB_STARTING || from == DT_JOB_RUNNING) &&
           (to == DT_JOB_RECOVERING || to == DT_JOB_QUEUED);
}

/*-- helpers: time, errors, binding -------------------------------------------*/

/* Stored times are wall-clock milliseconds since the epoch (dt_clock_wall_ms):
 * they are shown to users and outlive the process, so not the monotonic clock. */

/* The one translation of SQLite result codes into dt's. */
static int sq_code(sqlite3 *h, int rc)
{
    int e;

    switch (rc & 0xff) {
    case SQLITE_OK:
    case SQLITE_ROW:
    case SQLITE_DONE:
        return DT_OK;
    case SQLITE_NOTADB:
    case SQLITE_CORRUPT:
        return DT_EFORMAT;
    case SQLITE_PERM:
    case SQLITE_AUTH:
    case SQLITE_READONLY:
        return DT_EACCES;
    case SQLITE_FULL:
        return DT_ENOSPC;
    case SQLITE_NOMEM:
        return DT_ENOMEM;
    case SQLITE_BUSY: /* still locked after the busy timeout */
    case SQLITE_LOCKED:
        return DT_ETIMEDOUT;
    case SQLITE_CONSTRAINT:
    case SQLITE_TOOBIG:
    case SQLITE_MISMATCH:
    case SQLITE_RANGE:
        return DT_EINVAL;
    case SQLITE_CANTOPEN:
    case SQLITE_IOERR:
        e = h ? sqlite3_system_errno(h) : 0;
        if (e == EACCES || e == EPERM || e == EROFS)
            return DT_EACCES;
        if (e == ENOSPC || e == EDQUOT)
            return DT_ENOSPC;
        return DT_EIO;
    default:
        return DT_EIO;
    }
}

/* Fill em with "PATH: CTX: <sqlite's message>" and return the dt code. Read
 * sqlite3_errmsg before anything else touches the connection. */
static int sq_fail(dt_db_t *db, dt_emsg_t *em, int rc, const char *ctx)
{
    int e = db->h ? sqlite3_system_errno(db->h) : 0;

    if ((rc & 0xff) == SQLITE_CANTOPEN && e != 0)
        return dt_emsg_set(em, sq_code(db->h, rc), "%s: %s: %s (%s)", db->path, ctx,
                           sqlite3_errmsg(db->h), strerror(e));
    return dt_emsg_set(em, sq_code(db->h, rc), "%s: %s: %s", db->path, ctx, sqlite3_errmsg(db->h));
}

/* Binders carry the first failure in *rc, so a sequence of binds is checked
 * once, by step(). Strings are bound SQLITE_STATIC: every statement is
 * reset (bindings cleared) before the function that bound it returns. */
static void bind_i64(sqlite3_stmt *st, int i, int64_t v, int *rc)
{
    if (*rc == SQLITE_OK)
        *rc = sqlite3_bind_int64(st, i, v);
}

static void bind_str(sqlite3_stmt *st, int i, const char *s, int *rc)
{
    if (*rc == SQLITE_OK)
        *rc = s ? sqlite3_bind_text(st, i, s, -1, SQLITE_STATIC) : sqlite3_bind_null(st, i);
}

static int step(sqlite3_stmt *st, int rc)
{
    return rc == SQLITE_OK ? sqlite3_step(st) : rc;
}

static void reset(sqlite3_stmt *st)
{
    sqlite3_reset(st);
    sqlite3_clear_bindings(st);
}

/* Run a statement that returns no rows; on failure fill em. Resets it. */
static int run(dt_db_t *db, sqlite3_stmt *st, int rc, dt_emsg_t *em, const char *ctx)
{
    int err = 0;

    rc = step(st, rc);
    if (rc != SQLITE_DONE)
        err = sq_fail(db, em, rc, ctx);
    reset(st);
    return err;
}

static char *col_str(sqlite3_stmt *st, int i)
{
    const unsigned char *s = sqlite3_column_text(st, i);

    return s ? dt_xstrdup((const char *)s) : NULL;
}

/* Grow a row array by one; returns the (possibly moved) array. */
static void *grow(void *rows, size_t n, size_t *cap, size_t size)
{
    if (n < *cap)
        return rows;
    *cap = *cap ? 2 * *cap : 16;
    return dt_xrealloc(rows, *cap * size);
}

/*-- transactions -------------------------------------------------------------*/

/* BEGIN IMMEDIATE takes the write lock up front, so a transaction that
 * reads then writes never fails half way with SQLITE_BUSY. */
static int tx_begin(dt_db_t *db, dt_emsg_t *em, const char *ctx)
{
    if (db->outer)
        return 0;
    return run(db, db->st[S_BEGIN], SQLITE_OK, em, ctx);
}

static void tx_rollback(dt_db_t *db)
{
    if (db->outer) {
        db->outer_failed = 1; /* dt_db_commit rolls the whole thing back */
        return;
    }
    /* SQLite may already have rolled back (SQLITE_FULL, SQLITE_IOERR). */
    if (!sqlite3_get_autocommit(db->h))
        run(db, db->st[S_ROLLBACK], SQLITE_OK, NULL, "rollback");
}

static int tx_commit(dt_db_t *db, dt_emsg_t *em, const char *ctx)
{
    if (db->outer)
        return 0;
    int err = run(db, db->st[S_COMMIT], SQLITE_OK, em, ctx);

    if (err)
        tx_rollback(db);
    return err;
}

int dt_db_begin(dt_db_t *db, dt_emsg_t *em)
{
    int err;

    assert(!db->outer);
    if ((err = tx_begin(db, em, "begin")) != 0)
        return err;
    db->outer = 1;
    db->outer_failed = 0;
    return 0;
}

int dt_db_commit(dt_db_t *db, dt_emsg_t *em)
{
    int failed = db->outer_failed;

    assert(db->outer);
    db->outer = 0;
    db->outer_failed = 0;
    if (failed) {
        tx_rollback(db);
        return dt_emsg_set(em, DT_EIO, "transaction rolled back: a step inside it failed");
    }
    return tx_commit(db, em, "commit");
}

void dt_db_rollback(dt_db_t *db)
{
    assert(db->outer);
    db->outer = 0;
    db->outer_failed = 0;
    tx_rollback(db);
}

/*-- open, migrate, close -----------------------------------------------------*/

/* Run one query at open and read the first column of its first row, as an
 * integer and/or as text. Returns SQLite's code: SQLITE_ROW, SQLITE_DONE
 * (no row) or the error. These few open-time queries are constant SQL,
 * prepared and finalised here rather than kept. */
static int open_query(dt_db_t *db, const char *sql, int64_t *ival, char *sval, size_t ssize)
{
    sqlite3_stmt *st = NULL;
    int rc = sqlite3_prepare_v2(db->h, sql, -1, &st, NULL);

    if (rc == SQLITE_OK)
        rc = sqlite3_step(st);
    if (rc == SQLITE_ROW) {
        if (ival)
            *ival = sqlite3_column_int64(st, 0);
        if (sval) {
            const unsigned char *s = sqlite3_column_text(st, 0);
            snprintf(sval, ssize, "%s", s ? (const char *)s : "");
        }
    }
    sqlite3_finalize(st); /* leaves a failure's message on the connection */
    return rc;
}

static int is_format_error(int rc)
{
    return (rc & 0xff) == SQLITE_NOTADB || (rc & 0xff) == SQLITE_CORRUPT;
}

static int not_ours(dt_db_t *db, dt_emsg_t *em, const char *why)
{
    return dt_emsg_set(em, DT_EFORMAT, "%s: not a dt database or corrupt (%s)", db->path, why);
}

/* Everything that must be refused is found here, by reading only: the
 * journal mode is not set yet (setting WAL writes the header). */
static int check_file(dt_db_t *db, int64_t *version, dt_emsg_t *em)
{
    char text[256];
    int64_t n = 0;
    int rc;

    rc = open_query(db, "PRAGMA quick_check(1)", NULL, text, sizeof(text));
    if (is_format_error(rc))
        return not_ours(db, em, sqlite3_errmsg(db->h));
    if (rc != SQLITE_ROW)
        return sq_fail(db, em, rc, "quick_check");
    if (strcmp(text, "ok") != 0) {
        /* "*** in database main ***\nPage 12: ..." on one line */
        static const char banner[] = "*** in database main ***\n";
        const char *first = text;
        char why[300];
        if (strncmp(first, banner, sizeof(banner) - 1) == 0)
            first += sizeof(banner) - 1;
        snprintf(why, sizeof(why), "quick_check: %s", first);
        for (char *c = why; *c; c++)
            if (*c == '\n')
                *c = ' ';
        return not_ours(db, em, why);
    }
    rc = open_query(db, "PRAGMA user_version", version, NULL, 0);
    if (rc != SQLITE_ROW)
        return is_format_error(rc) ? not_ours(db, em, sqlite3_errmsg(db->h))
                                   : sq_fail(db, em, rc, "read schema version");
    if (*version > DT_DB_VERSION)
        return dt_emsg_set(em, DT_ENOTSUP,
                           "%s: schema version %" PRId64
                           " is newer than this dtcoordd (%d): upgrade dt",
                           db->path, *version, DT_DB_VERSION);
    if (*version < 0) {
        char why[64];
        snprintf(why, sizeof(why), "schema version %" PRId64, *version);
        return not_ours(db, em, why);
    }
    if (*version == 0) {
        /* Version 0 is a new, empty file; one with tables in it belongs to
         * something else and must not be migrated into. */
        rc = open_query(db, "SELECT count(*) FROM sqlite_master", &n, NULL, 0);
        if (rc != SQLITE_ROW)
            return sq_fail(db, em, rc, "read schema");
        if (n > 0)
            return not_ours(db, em, "it has tables but no dt schema version");
    }
    return 0;
}

/* WAL: readers never block the writer, and a commit is one append to the
 * -wal file. synchronous=NORMAL in WAL mode syncs at checkpoints, not at
 * every commit: a committed transaction survives the process crashing or
 * being killed (SIGKILL), since it is in the OS's file cache; only a power
 * loss or kernel crash can roll back the last commits, and never corrupts
 * the file. */
static int set_pragmas(dt_db_t *db, dt_emsg_t *em)
{
    char mode[32];
    int64_t fk = 0;
    int rc;

    rc = open_query(db, "PRAGMA journal_mode = WAL", NULL, mode, sizeof(mode));
    if (rc != SQLITE_ROW)
        return sq_fail(db, em, rc, "set WAL journal mode");
    if (strcmp(mode, "wal") != 0)
        return dt_emsg_set(em, DT_EIO,
                           "%s: cannot use a WAL journal here (journal mode is %s): "
                           "put the database on a local filesystem",
                           db->path, mode);
    rc = sqlite3_exec(db->h, "PRAGMA synchronous = NORMAL", NULL, NULL, NULL);
    if (rc != SQLITE_OK)
        return sq_fail(db, em, rc, "set synchronous");
    rc = sqlite3_exec(db->h, "PRAGMA foreign_keys = ON", NULL, NULL, NULL);
    if (rc != SQLITE_OK)
        return sq_fail(db, em, rc, "enable foreign keys");
    rc = open_query(db, "PRAGMA foreign_keys", &fk, NULL, 0);
    if (rc != SQLITE_ROW || fk != 1)
        return dt_emsg_set(em, DT_ENOTSUP, "%s: this SQLite does not enforce foreign keys",
                           db->path);
    return 0;
}

/* Each missing version in its own transaction, so a failure leaves the
 * database at the last version that completed. The version is read again
 * under the write lock: another process may have migrated meanwhile. */
static int migrate(dt_db_t *db, int64_t from, int to, dt_emsg_t *em)
{
    char ctx[64];
    int64_t now;
    int rc, err;

    db->version = (int)from;
    for (int v = (int)from + 1; v <= to; v++) {
        snprintf(ctx, sizeof(ctx), "migration to schema version %d", v);
        rc = sqlite3_exec(db->h, "BEGIN IMMEDIATE", NULL, NULL, NULL);
        if (rc != SQLITE_OK)
            return sq_fail(db, em, rc, ctx);
        rc = open_query(db, "PRAGMA user_version", &now, NULL, 0);
        if (rc == SQLITE_ROW && now >= v) {
            rc = sqlite3_exec(db->h, "COMMIT", NULL, NULL, NULL);
            if (rc != SQLITE_OK)
                goto fail;
            db->version = (int)now;
            continue;
        }
        if (rc == SQLITE_ROW)
            rc = sqlite3_exec(db->h, dt_migrations[v - 1], NULL, NULL, NULL);
        if (rc == SQLITE_OK)
            rc = sqlite3_exec(db->h, set_version[v], NULL, NULL, NULL);
        if (rc == SQLITE_OK)
            rc = sqlite3_exec(db->h, "COMMIT", NULL, NULL, NULL);
        if (rc != SQLITE_OK)
            goto fail;
        db->version = v;
    }
    return 0;
fail:
    err = sq_fail(db, em, rc, ctx);
    if (!sqlite3_get_autocommit(db->h))
        sqlite3_exec(db->h, "ROLLBACK", NULL, NULL, NULL);
    return err;
}

static int prepare_all(dt_db_t *db, dt_emsg_t *em)
{
    char ctx[64];

    for (int i = 0; i < S_COUNT; i++) {
        if (stmt_def[i].version > db->version)
            continue;
        int rc = sqlite3_prepare_v3(db->h, stmt_def[i].sql, -1, SQLITE_PREPARE_PERSISTENT,
                                    &db->st[i], NULL);
        if (rc != SQLITE_OK) {
            snprintf(ctx, sizeof(ctx), "prepare statement %d", i);
            return sq_fail(db, em, rc, ctx);
        }
    }
    return 0;
}

int dt_db_open_at(const char *path, int version, dt_db_t **out, dt_emsg_t *em)
{
    dt_db_t *db;
    int64_t cur = 0;
    int rc, err;

    *out = NULL;
    if (version < 0 || version > DT_DB_VERSION)
        return dt_emsg_set(em, DT_EINVAL, "%s: no schema version %d (this dtcoordd knows 0 to %d)",
                           path, version, DT_DB_VERSION);
    db = dt_xcalloc(1, sizeof(*db));
    db->path = dt_xstrdup(path);
    rc = sqlite3_open_v2(path, &db->h,
                         SQLITE_OPEN_READWRITE | SQLITE_OPEN_CREATE | SQLITE_OPEN_NOMUTEX, NULL);
    if (rc != SQLITE_OK) {
        err = sq_fail(db, em, rc, "cannot open");
        goto fail;
    }
    sqlite3_extended_result_codes(db->h, 1);
    sqlite3_busy_timeout(db->h, BUSY_TIMEOUT_MS);
    if ((err = check_file(db, &cur, em)) != 0 || (err = set_pragmas(db, em)) != 0 ||
        (err = migrate(db, cur, version, em)) != 0 || (err = prepare_all(db, em)) != 0)
        goto fail;
    *out = db;
    return 0;
fail:
    dt_db_close(db);
    return err;
}

int dt_db_open(const char *path, dt_db_t **out, dt_emsg_t *em)
{
    return dt_db_open_at(path, DT_DB_VERSION, out, em);
}

void dt_db_close(dt_db_t *db)
{
    if (db == NULL)
        return;
    for (int i = 0; i < S_COUNT; i++)
        sqlite3_finalize(db->st[i]);
    /* every statement is finalised, so this closes (and, as the last
     * connection, checkpoints the WAL into the main file) */
    sqlite3_close(db->h);
    free(db->path);
    free(db);
}

int dt_db_version(dt_db_t *db)
{
    return db->version;
}

/* Agents and checkpoints arrived in version 2. */
static int need_v2(dt_db_t *db, dt_emsg_t *em)
{
    if (db->version >= 2)
        return 0;
    return dt_emsg_set(em, DT_ENOTSUP,
                       "%s: schema version %d has no agents or checkpoints (open it with "
                       "dt_db_open to migrate)",
                       db->path, db->version);
}

/* Results, and generations that know their resume step and ranks their
 * pid, arrived in version 3. */
static int need_v3(dt_db_t *db, dt_emsg_t *em)
{
    if (db->version >= 3)
        return 0;
    return dt_emsg_set(em, DT_ENOTSUP,
                       "%s: schema version %d has no job results, generations or ranks (open it "
                       "with dt_db_open to migrate)",
                       db->path, db->version);
}

/* Checkpoint manifests as the agents report them arrived in version 5. */
static int need_v5(dt_db_t *db, dt_emsg_t *em)
{
    if (db->version >= 5)
        return 0;
    return dt_emsg_set(em, DT_ENOTSUP,
                       "%s: schema version %d has no checkpoint manifests (open it with "
                       "dt_db_open to migrate)",
                       db->path, db->version);
}

/*-- shared steps of the state changes ----------------------------------------*/

static int no_job(dt_emsg_t *em, int64_t id)
{
    return dt_emsg_set(em, DT_ENOENT, "job %" PRId64 ": no such job", id);
}

/* The job's current state; DT_ENOENT when there is no such job. */
static int job_state(dt_db_t *db, int64_t id, enum dt_job_state *out, dt_emsg_t *em,
                     const char *ctx)
{
    sqlite3_stmt *st = db->st[S_JOB_STATE];
    int rc = SQLITE_OK, err = 0;

    bind_i64(st, 1, id, &rc);
    rc = step(st, rc);
    if (rc == SQLITE_DONE)
        err = no_job(em, id);
    else if (rc != SQLITE_ROW)
        err = sq_fail(db, em, rc, ctx);
    else if (dt_job_state_parse((const char *)sqlite3_column_text(st, 0), out) != 0)
        err = dt_emsg_set(em, DT_EFORMAT, "%s: job %" PRId64 ": unknown state '%s'", db->path, id,
                          (const char *)sqlite3_column_text(st, 0));
    reset(st);
    return err;
}

static int event_insert(dt_db_t *db, int64_t job, int64_t at, const char *kind,
                        enum dt_job_state state, const char *detail, dt_emsg_t *em, const char *ctx)
{
    sqlite3_stmt *st = db->st[S_EVENT_INSERT];
    int rc = SQLITE_OK;

    bind_i64(st, 1, job, &rc);
    bind_i64(st, 2, at, &rc);
    bind_str(st, 3, kind, &rc);
    bind_str(st, 4, dt_job_state_name(state), &rc);
    bind_str(st, 5, detail, &rc);
    return run(db, st, rc, em, ctx);
}

/*-- jobs ---------------------------------------------------------------------*/

void dt_job_clear(dt_job_t *j)
{
    free(j->name);
    free(j->spec);
    free(j->plan);
    free(j->reason);
    memset(j, 0, sizeof(*j));
}

static void job_read(sqlite3_stmt *st, dt_job_t *j)
{
    memset(j, 0, sizeof(*j));
    j->id = sqlite3_column_int64(st, 0);
    j->name = col_str(st, 1);
    j->owner = (uint32_t)sqlite3_column_int64(st, 2);
    /* the CHECK constraint holds state to the known names */
    if (dt_job_state_parse((const char *)sqlite3_column_text(st, 3), &j->state) != 0)
        j->state = DT_JOB_FAILED;
    j->spec = col_str(st, 4);
    j->plan = col_str(st, 5);
    j->reason = col_str(st, 6);
    j->slurm_id = sqlite3_column_int64(st, 7);
    j->restarts = sqlite3_column_int(st, 8);
    j->created_ms = sqlite3_column_int64(st, 9);
    j->updated_ms = sqlite3_column_int64(st, 10);
}

int dt_db_job_create(dt_db_t *db, const char *name, uint32_t owner, const char *spec, int64_t *id,
                     dt_emsg_t *em)
{
    sqlite3_stmt *st = db->st[S_JOB_INSERT];
    const char *ctx = "create job";
    int64_t t = dt_clock_wall_ms(), jid;
    int rc = SQLITE_OK, err;

    assert(name != NULL && spec != NULL);
    if ((err = tx_begin(db, em, ctx)) != 0)
        return err;
    bind_str(st, 1, name, &rc);
    bind_i64(st, 2, owner, &rc);
    bind_str(st, 3, spec, &rc);
    bind_i64(st, 4, t, &rc);
    if ((err = run(db, st, rc, em, ctx)) != 0)
        goto fail;
    jid = sqlite3_last_insert_rowid(db->h);
    if ((err = event_insert(db, jid, t, "submitted", DT_JOB_SUBMITTED, NULL, em, ctx)) != 0)
        goto fail;
    if ((err = tx_commit(db, em, ctx)) != 0)
        return err;
    if (id)
        *id = jid;
    return 0;
fail:
    tx_rollback(db);
    return err;
}

int dt_db_job_get(dt_db_t *db, int64_t id, dt_job_t *out, dt_emsg_t *em)
{
    sqlite3_stmt *st = db->st[S_JOB_GET];
    int rc = SQLITE_OK, err = 0;

    bind_i64(st, 1, id, &rc);
    rc = step(st, rc);
    if (rc == SQLITE_ROW)
        job_read(st, out);
    else if (rc == SQLITE_DONE)
        err = no_job(em, id);
    else
        err = sq_fail(db, em, rc, "read job");
    reset(st);
    return err;
}

int dt_db_job_list(dt_db_t *db, int64_t owner, int (*cb)(const dt_job_t *j, void *arg), void *arg,
                   dt_emsg_t *em)
{
    sqlite3_stmt *st = db->st[S_JOB_LIST];
    dt_job_t *rows = NULL;
    size_t n = 0, cap = 0;
    int rc = SQLITE_OK, ret = 0;

    if (owner >= 0)
        bind_i64(st, 1, owner, &rc); /* NULL (all owners) otherwise */
    for (rc = step(st, rc); rc == SQLITE_ROW; rc = sqlite3_step(st)) {
        rows = grow(rows, n, &cap, sizeof(*rows));
        job_read(st, &rows[n++]);
    }
    if (rc != SQLITE_DONE)
        ret = sq_fail(db, em, rc, "list jobs");
    reset(st);
    for (size_t i = 0; i < n; i++) {
        if (ret == 0)
            ret = cb(&rows[i], arg);
        dt_job_clear(&rows[i]);
    }
    free(rows);
    return ret;
}

/* The one path of every job state change: read the state, refuse an illegal
 * move (with a committed "refused" event and nothing else), or move it with
 * its event; plan_json, when not NULL, is stored in the same transaction. */
static int transition(dt_db_t *db, int64_t id, enum dt_job_state to, const char *kind,
                      const char *detail, const char *plan_json, dt_emsg_t *em)
{
    sqlite3_stmt *st = db->st[S_JOB_SET_STATE];
    enum dt_job_state from;
    int64_t t = dt_clock_wall_ms();
    char ctx[96], msg[128];
    int rc = SQLITE_OK, err;

    if (!dt_job_state_valid(to))
        return dt_emsg_set(em, DT_EINVAL, "job %" PRId64 ": no job state %d", id, (int)to);
    snprintf(ctx, sizeof(ctx), "job %" PRId64 ": %s", id, dt_job_state_name(to));
    if ((err = tx_begin(db, em, ctx)) != 0)
        return err;
    if ((err = job_state(db, id, &from, em, ctx)) != 0)
        goto fail;
    if (!dt_job_transition_ok(from, to)) {
        snprintf(msg, sizeof(msg), "job %" PRId64 ": illegal transition %s -> %s", id,
                 dt_job_state_name(from), dt_job_state_name(to));
        if ((err = event_insert(db, id, t, "refused", from, msg, em, ctx)) != 0)
            goto fail;
        if ((err = tx_commit(db, em, ctx)) != 0)
            return err;
        return dt_emsg_set(em, DT_EINVAL, "%s", msg);
    }
    bind_i64(st, 1, id, &rc);
    bind_str(st, 2, dt_job_state_name(to), &rc);
    bind_str(st, 3, detail, &rc);
    bind_i64(st, 4, t, &rc);
    bind_i64(st, 5, aborts_generation(from, to) ? 1 : 0, &rc);
    if ((err = run(db, st, rc, em, ctx)) != 0)
        goto fail;
    if (plan_json) {
        st = db->st[S_JOB_SET_PLAN];
        rc = SQLITE_OK;
        bind_i64(st, 1, id, &rc);
        bind_str(st, 2, plan_json, &rc);
        if ((err = run(db, st, rc, em, ctx)) != 0)
            goto fail;
    }
    if ((err = event_insert(db, id, t, kind ? kind : dt_job_state_name(to), to, detail, em,
                            ctx)) != 0)
        goto fail;
    return tx_commit(db, em, ctx);
fail:
    tx_rollback(db);
    return err;
}

int dt_db_job_transition(dt_db_t *db, int64_t id, enum dt_job_state to, const char *kind,
                         const char *detail, dt_emsg_t *em)
{
    return transition(db, id, to, kind, detail, NULL, em);
}

int dt_db_job_restart_again(dt_db_t *db, int64_t id, const char *detail, dt_emsg_t *em)
{
    sqlite3_stmt *st = db->st[S_JOB_RESTART_AGAIN];
    enum dt_job_state s;
    int64_t t = dt_clock_wall_ms();
    char ctx[96];
    int rc = SQLITE_OK, err;

    snprintf(ctx, sizeof(ctx), "job %" PRId64 ": another restart", id);
    if ((err = tx_begin(db, em, ctx)) != 0)
        return err;
    if ((err = job_state(db, id, &s, em, ctx)) != 0)
        goto fail;
    if (s != DT_JOB_RECOVERING) {
        err = dt_emsg_set(em, DT_EINVAL, "job %" PRId64 ": %s, not recovering", id,
                          dt_job_state_name(s));
        goto fail;
    }
    bind_i64(st, 1, id, &rc);
    bind_str(st, 2, detail, &rc);
    bind_i64(st, 3, t, &rc);
    if ((err = run(db, st, rc, em, ctx)) != 0 ||
        (err = event_insert(db, id, t, "recovering", s, detail, em, ctx)) != 0)
        goto fail;
    return tx_commit(db, em, ctx);
fail:
    tx_rollback(db);
    return err;
}

int dt_db_job_plan(dt_db_t *db, int64_t id, const char *plan_json, dt_emsg_t *em)
{
    assert(plan_json != NULL);
    return transition(db, id, DT_JOB_PLANNED, NULL, NULL, plan_json, em);
}

/* 0 when text is one JSON object; a result arrives from the workers and
 * is shown to users, so it is checked before it is stored. */
static int check_json_object(dt_db_t *db, int64_t job, const char *text, dt_emsg_t *em)
{
    sqlite3_stmt *st = db->st[S_JSON_TYPE];
    const unsigned char *type;
    int rc = SQLITE_OK, err = 0;

    bind_str(st, 1, text, &rc);
    rc = step(st, rc);
    if (rc != SQLITE_ROW) {
        err = sq_fail(db, em, rc, "check result JSON");
    } else {
        type = sqlite3_column_text(st, 0); /* NULL when not JSON at all */
        if (type == NULL || strcmp((const char *)type, "object") != 0)
            err = dt_emsg_set(em, DT_EINVAL,
                              "job %" PRId64 ": result is not a JSON object: '%.80s'", job, text);
    }
    reset(st);
    return err;
}

int dt_db_job_set_result(dt_db_t *db, int64_t id, const char *result_json, dt_emsg_t *em)
{
    sqlite3_stmt *st = db->st[S_JOB_SET_RESULT];
    enum dt_job_state s;
    char ctx[96];
    int rc = SQLITE_OK, err;

    assert(result_json != NULL);
    if ((err = need_v3(db, em)) != 0 || (err = check_json_object(db, id, result_json, em)) != 0)
        return err;
    snprintf(ctx, sizeof(ctx), "job %" PRId64 ": store result", id);
    if ((err = tx_begin(db, em, ctx)) != 0)
        return err;
    if ((err = job_state(db, id, &s, em, ctx)) != 0)
        goto fail;
    bind_i64(st, 1, id, &rc);
    bind_str(st, 2, result_json, &rc);
    if ((err = run(db, st, rc, em, ctx)) != 0 ||
        (err = event_insert(db, id, dt_clock_wall_ms(), "result_stored", s, result_json, em, ctx)) != 0)
        goto fail;
    return tx_commit(db, em, ctx);
fail:
    tx_rollback(db);
    return err;
}

int dt_db_job_result(dt_db_t *db, int64_t id, char **out, dt_emsg_t *em)
{
    sqlite3_stmt *st = db->st[S_JOB_RESULT];
    int rc = SQLITE_OK, err;

    *out = NULL;
    if ((err = need_v3(db, em)) != 0)
        return err;
    bind_i64(st, 1, id, &rc);
    rc = step(st, rc);
    if (rc == SQLITE_ROW)
        *out = col_str(st, 0);
    else if (rc == SQLITE_DONE)
        err = no_job(em, id);
    else
        err = sq_fail(db, em, rc, "read job result");
    reset(st);
    return err;
}

/*-- events -------------------------------------------------------------------*/

void dt_event_clear(dt_event_t *e)
{
    free(e->kind);
    free(e->state);
    free(e->detail);
    memset(e, 0, sizeof(*e));
}

int dt_db_event_add(dt_db_t *db, int64_t job, const char *kind, const char *detail, dt_emsg_t *em)
{
    enum dt_job_state s;
    char ctx[96];
    int err;

    assert(kind != NULL);
    snprintf(ctx, sizeof(ctx), "job %" PRId64 ": add event", job);
    if ((err = tx_begin(db, em, ctx)) != 0)
        return err;
    if ((err = job_state(db, job, &s, em, ctx)) != 0 ||
        (err = event_insert(db, job, dt_clock_wall_ms(), kind, s, detail, em, ctx)) != 0) {
        tx_rollback(db);
        return err;
    }
    return tx_commit(db, em, ctx);
}

int dt_db_events(dt_db_t *db, int64_t job, int64_t since, int (*cb)(const dt_event_t *e, void *arg),
                 void *arg, dt_emsg_t *em)
{
    sqlite3_stmt *st = db->st[S_EVENT_LIST];
    enum dt_job_state s;
    dt_event_t *rows = NULL;
    size_t n = 0, cap = 0;
    int rc = SQLITE_OK, ret;

    if ((ret = job_state(db, job, &s, em, "list events")) != 0)
        return ret;
    bind_i64(st, 1, job, &rc);
    bind_i64(st, 2, since, &rc);
    for (rc = step(st, rc); rc == SQLITE_ROW; rc = sqlite3_step(st)) {
        rows = grow(rows, n, &cap, sizeof(*rows));
        rows[n++] = (dt_event_t){
            .id = sqlite3_column_int64(st, 0),
            .job = sqlite3_column_int64(st, 1),
            .at_ms = sqlite3_column_int64(st, 2),
            .kind = col_str(st, 3),
            .state = col_str(st, 4),
            .detail = col_str(st, 5),
        };
    }
    if (rc != SQLITE_DONE)
        ret = sq_fail(db, em, rc, "list events");
    reset(st);
    for (size_t i = 0; i < n; i++) {
        if (ret == 0)
            ret = cb(&rows[i], arg);
        dt_event_clear(&rows[i]);
    }
    free(rows);
    return ret;
}

/*-- agents -------------------------------------------------------------------*/

void dt_agent_clear(dt_agent_t *a)
{
    free(a->node);
    free(a->state);
    memset(a, 0, sizeof(*a));
}

static void agent_read(sqlite3_stmt *st, dt_agent_t *a)
{
    *a = (dt_agent_t){
        .id = sqlite3_column_int64(st, 0),
        .job = sqlite3_column_int64(st, 1),
        .node = col_str(st, 2),
        .slots = sqlite3_column_int(st, 3),
        .state = col_str(st, 4),
        .registered_ms = sqlite3_column_int64(st, 5),
        .last_seen_ms = sqlite3_column_int64(st, 6),
    };
}

static int agent_load(dt_db_t *db, int64_t agent, dt_agent_t *out, dt_emsg_t *em)
{
    sqlite3_stmt *st = db->st[S_AGENT_GET];
    int rc = SQLITE_OK, err = 0;

    bind_i64(st, 1, agent, &rc);
    rc = step(st, rc);
    if (rc == SQLITE_ROW)
        agent_read(st, out);
    else if (rc == SQLITE_DONE)
        err = dt_emsg_set(em, DT_ENOENT, "agent %" PRId64 ": no such agent", agent);
    else
        err = sq_fail(db, em, rc, "read agent");
    reset(st);
    return err;
}

int dt_db_agent_register(dt_db_t *db, int64_t job, const char *node, int slots, int64_t *agent,
                         dt_emsg_t *em)
{
    sqlite3_stmt *st = db->st[S_AGENT_UPSERT];
    enum dt_job_state s;
    int64_t t = dt_clock_wall_ms(), aid = 0;
    char ctx[96], *detail = NULL;
    int rc = SQLITE_OK, err;

    assert(node != NULL);
    if ((err = need_v2(db, em)) != 0)
        return err;
    if (*node == '\0' || slots < 0)
        return dt_emsg_set(em, DT_EINVAL, "job %" PRId64 ": agent with node '%s' and %d slots", job,
                           node, slots);
    snprintf(ctx, sizeof(ctx), "job %" PRId64 ": register agent", job);
    if ((err = tx_begin(db, em, ctx)) != 0)
        return err;
    if ((err = job_state(db, job, &s, em, ctx)) != 0)
        goto fail;
    bind_i64(st, 1, job, &rc);
    bind_str(st, 2, node, &rc);
    bind_i64(st, 3, slots, &rc);
    bind_i64(st, 4, t, &rc);
    rc = step(st, rc);
    if (rc == SQLITE_ROW) {
        aid = sqlite3_column_int64(st, 0);
        rc = sqlite3_step(st);
    }
    if (rc != SQLITE_DONE) {
        err = sq_fail(db, em, rc, ctx);
        reset(st);
        goto fail;
    }
    reset(st);
    detail = dt_xasprintf("node=%s slots=%d", node, slots);
    if ((err = event_insert(db, job, t, "agent_registered", s, detail, em, ctx)) != 0)
        goto fail;
    free(detail);
    if ((err = tx_commit(db, em, ctx)) != 0)
        return err;
    if (agent)
        *agent = aid;
    return 0;
fail:
    free(detail);
    tx_rollback(db);
    return err;
}

int dt_db_agent_set_state(dt_db_t *db, int64_t agent, const char *state, int64_t seen_ms,
                          dt_emsg_t *em)
{
    sqlite3_stmt *st = db->st[S_AGENT_SET_STATE];
    dt_agent_t a = { 0 };
    enum dt_job_state s;
    char ctx[96], kind[64], *detail = NULL;
    int rc = SQLITE_OK, err;

    assert(state != NULL);
    if ((err = need_v2(db, em)) != 0)
        return err;
    if (!dt_agent_state_known(state))
        return dt_emsg_set(em, DT_EINVAL,
                           "agent %" PRId64 ": unknown state '%s' (registered, lost or gone)",
                           agent, state);
    snprintf(ctx, sizeof(ctx), "agent %" PRId64 ": %s", agent, state);
    snprintf(kind, sizeof(kind), "agent_%s", state);
    if ((err = tx_begin(db, em, ctx)) != 0)
        return err;
    if ((err = agent_load(db, agent, &a, em)) != 0 ||
        (err = job_state(db, a.job, &s, em, ctx)) != 0)
        goto fail;
    bind_i64(st, 1, agent, &rc);
    bind_str(st, 2, state, &rc);
    bind_i64(st, 3, seen_ms, &rc);
    if ((err = run(db, st, rc, em, ctx)) != 0)
        goto fail;
    detail = dt_xasprintf("node=%s", a.node);
    if ((err = event_insert(db, a.job, dt_clock_wall_ms(), kind, s, detail, em, ctx)) != 0)
        goto fail;
    free(detail);
    dt_agent_clear(&a);
    return tx_commit(db, em, ctx);
fail:
    free(detail);
    dt_agent_clear(&a);
    tx_rollback(db);
    return err;
}

int dt_db_agent_get(dt_db_t *db, int64_t agent, dt_agent_t *out, dt_emsg_t *em)
{
    int err = need_v2(db, em);

    return err ? err : agent_load(db, agent, out, em);
}

int dt_db_agents(dt_db_t *db, int64_t job, int (*cb)(const dt_agent_t *a, void *arg), void *arg,
                 dt_emsg_t *em)
{
    sqlite3_stmt *st;
    enum dt_job_state s;
    dt_agent_t *rows = NULL;
    size_t n = 0, cap = 0;
    int rc = SQLITE_OK, ret;

    if ((ret = need_v2(db, em)) != 0 || (ret = job_state(db, job, &s, em, "list agents")) != 0)
        return ret;
    st = db->st[S_AGENT_LIST];
    bind_i64(st, 1, job, &rc);
    for (rc = step(st, rc); rc == SQLITE_ROW; rc = sqlite3_step(st)) {
        rows = grow(rows, n, &cap, sizeof(*rows));
        agent_read(st, &rows[n++]);
    }
    if (rc != SQLITE_DONE)
        ret = sq_fail(db, em, rc, "list agents");
    reset(st);
    for (size_t i = 0; i < n; i++) {
        if (ret == 0)
            ret = cb(&rows[i], arg);
        dt_agent_clear(&rows[i]);
    }
    free(rows);
    return ret;
}

/*-- checkpoints --------------------------------------------------------------*/

void dt_checkpoint_clear(dt_checkpoint_t *c)
{
    free(c->state);
    memset(c, 0, sizeof(*c));
}

/* The checkpoint of (job, step): its id and state, or *id = 0 for none. */
static int ckpt_find(dt_db_t *db, int64_t job, int64_t stepno, int64_t *id, char *state,
                     size_t ssize, dt_emsg_t *em, const char *ctx)
{
    sqlite3_stmt *st = db->st[S_CKPT_FIND];
    int rc = SQLITE_OK, err = 0;

    *id = 0;
    bind_i64(st, 1, job, &rc);
    bind_i64(st, 2, stepno, &rc);
    rc = step(st, rc);
    if (rc == SQLITE_ROW) {
        *id = sqlite3_column_int64(st, 0);
        snprintf(state, ssize, "%s", (const char *)sqlite3_column_text(st, 1));
    } else if (rc != SQLITE_DONE) {
        err = sq_fail(db, em, rc, ctx);
    }
    reset(st);
    return err;
}

/* Begin the checkpoint of `step` over: a new row, or a corrupt or deleted
 * one made partial again without its old shards. With its event. */
static int ckpt_start(dt_db_t *db, int64_t job, enum dt_job_state s, int64_t stepno, int64_t *id,
                      dt_emsg_t *em, const char *ctx)
{
    sqlite3_stmt *st;
    int64_t t = dt_clock_wall_ms();
    char detail[48];
    int rc = SQLITE_OK, err;

    if (*id == 0) {
        st = db->st[S_CKPT_INSERT];
        bind_i64(st, 1, job, &rc);
        bind_i64(st, 2, stepno, &rc);
        bind_i64(st, 3, t, &rc);
        if ((err = run(db, st, rc, em, ctx)) != 0)
            return err;
        *id = sqlite3_last_insert_rowid(db->h);
    } else {
        st = db->st[S_SHARD_DROP];
        bind_i64(st, 1, *id, &rc);
        if ((err = run(db, st, rc, em, ctx)) != 0)
            return err;
        st = db->st[S_CKPT_RESTART];
        rc = SQLITE_OK;
        bind_i64(st, 1, *id, &rc);
        bind_i64(st, 2, t, &rc);
        if ((err = run(db, st, rc, em, ctx)) != 0)
            return err;
        if (db->version >= 5) { /* the old manifest went with the old shards */
            st = db->st[S_CKPT_SET_MANIFEST];
            rc = SQLITE_OK;
            bind_i64(st, 1, *id, &rc);
            rc = rc == SQLITE_OK ? sqlite3_bind_null(st, 2) : rc;
            if ((err = run(db, st, rc, em, ctx)) != 0)
                return err;
        }
    }
    snprintf(detail, sizeof(detail), "step=%" PRId64, stepno);
    return event_insert(db, job, t, "checkpoint_partial", s, detail, em, ctx);
}

int dt_db_shard_add(dt_db_t *db, int64_t job, int64_t stepno, int rank, const char *path,
                    int64_t bytes, const char *sha256, dt_emsg_t *em)
{
    sqlite3_stmt *st = db->st[S_SHARD_UPSERT];
    enum dt_job_state s;
    int64_t cid;
    char ctx[96], state[16];
    int rc = SQLITE_OK, err;

    assert(path != NULL && sha256 != NULL);
    if ((err = need_v2(db, em)) != 0)
        return err;
    if (stepno < 0 || rank < 0 || bytes < 0 || *path == '\0' || strlen(sha256) != 64 ||
        strspn(sha256, "0123456789abcdef") != 64)
        return dt_emsg_set(em, DT_EINVAL,
                           "job %" PRId64 ": bad shard (step %" PRId64 ", rank %d, %" PRId64
                           " bytes, path '%s', sha256 '%.70s')",
                           job, stepno, rank, bytes, path, sha256);
    snprintf(ctx, sizeof(ctx), "job %" PRId64 ": shard of rank %d at step %" PRId64, job, rank,
             stepno);
    if ((err = tx_begin(db, em, ctx)) != 0)
        return err;
    if ((err = job_state(db, job, &s, em, ctx)) != 0 ||
        (err = ckpt_find(db, job, stepno, &cid, state, sizeof(state), em, ctx)) != 0)
        goto fail;
    if (cid != 0 && strcmp(state, "committed") == 0) {
        err = dt_emsg_set(em, DT_EINVAL,
                          "job %" PRId64 ": checkpoint at step %" PRId64
                          " is already committed; shard of rank %d refused",
                          job, stepno, rank);
        goto fail;
    }
    if ((cid == 0 || strcmp(state, "partial") != 0) &&
        (err = ckpt_start(db, job, s, stepno, &cid, em, ctx)) != 0)
        goto fail;
    bind_i64(st, 1, cid, &rc);
    bind_i64(st, 2, rank, &rc);
    bind_str(st, 3, path, &rc);
    bind_i64(st, 4, bytes, &rc);
    bind_str(st, 5, sha256, &rc);
    if ((err = run(db, st, rc, em, ctx)) != 0)
        goto fail;
    return tx_commit(db, em, ctx);
fail:
    tx_rollback(db);
    return err;
}

int dt_db_checkpoint_set_manifest(dt_db_t *db, int64_t job, int64_t stepno,
                                  const char *shas, dt_emsg_t *em)
{
    sqlite3_stmt *st = db->st[S_CKPT_SET_MANIFEST];
    enum dt_job_state s;
    int64_t cid;
    char ctx[96], state[16];
    int rc = SQLITE_OK, err;

    assert(shas != NULL);
    if ((err = need_v5(db, em)) != 0)
        return err;
    snprintf(ctx, sizeof(ctx), "job %" PRId64 ": manifest of the checkpoint at step %" PRId64,
             job, stepno);
    if (stepno < 0)
        return dt_emsg_set(em, DT_EINVAL, "%s: bad step", ctx);
    if ((err = tx_begin(db, em, ctx)) != 0)
        return err;
    if ((err = job_state(db, job, &s, em, ctx)) != 0 ||
        (err = ckpt_find(db, job, stepno, &cid, state, sizeof(state), em, ctx)) != 0)
        goto fail;
    if (cid != 0 && strcmp(state, "committed") == 0) {
        err = dt_emsg_set(em, DT_EINVAL, "%s: already committed", ctx);
        goto fail;
    }
    if ((cid == 0 || strcmp(state, "partial") != 0) &&
        (err = ckpt_start(db, job, s, stepno, &cid, em, ctx)) != 0)
        goto fail;
    bind_i64(st, 1, cid, &rc);
    bind_str(st, 2, shas, &rc);
    if ((err = run(db, st, rc, em, ctx)) != 0)
        goto fail;
    return tx_commit(db, em, ctx);
fail:
    tx_rollback(db);
    return err;
}

int dt_db_checkpoint_manifest(dt_db_t *db, int64_t job, int64_t stepno, char **shas,
                              dt_emsg_t *em)
{
    sqlite3_stmt *st = db->st[S_CKPT_MANIFEST];
    enum dt_job_state s;
    int rc = SQLITE_OK, err;

    *shas = NULL;
    if ((err = need_v5(db, em)) != 0 ||
        (err = job_state(db, job, &s, em, "checkpoint manifest")) != 0)
        return err;
    bind_i64(st, 1, job, &rc);
    bind_i64(st, 2, stepno, &rc);
    rc = step(st, rc);
    if (rc == SQLITE_ROW)
        *shas = col_str(st, 1);
    else if (rc == SQLITE_DONE)
        err = dt_emsg_set(em, DT_ENOENT, "job %" PRId64 ": no checkpoint at step %" PRId64, job,
                          stepno);
    else
        err = sq_fail(db, em, rc, "checkpoint manifest");
    reset(st);
    return err;
}

/* Checkpoint states a checkpoint may move to from `from`. */
static bool ckpt_move_ok(const char *from, const char *to)
{
    if (strcmp(to, "committed") == 0)
        return strcmp(from, "partial") == 0;
    if (strcmp(to, "corrupt") == 0)
        return strcmp(from, "partial") == 0 || strcmp(from, "committed") == 0;
    if (strcmp(to, "deleted") == 0)
        return strcmp(from, "deleted") != 0;
    return false; /* partial comes only from dt_db_shard_add */
}

int dt_db_checkpoint_set_state(dt_db_t *db, int64_t job, int64_t stepno, const char *state,
                               dt_emsg_t *em)
{
    sqlite3_stmt *st = db->st[S_CKPT_SET_STATE];
    enum dt_job_state s;
    int64_t cid, t = dt_clock_wall_ms();
    char ctx[96], from[16], kind[64], detail[48];
    int rc = SQLITE_OK, err;

    assert(state != NULL);
    if ((err = need_v2(db, em)) != 0)
        return err;
    if (strcmp(state, "committed") != 0 && strcmp(state, "corrupt") != 0 &&
        strcmp(state, "deleted") != 0)
        return dt_emsg_set(em, DT_EINVAL,
                           "job %" PRId64 ": checkpoint state '%s' is not committed, corrupt "
                           "or deleted",
                           job, state);
    snprintf(ctx, sizeof(ctx), "job %" PRId64 ": checkpoint at step %" PRId64, job, stepno);
    if ((err = tx_begin(db, em, ctx)) != 0)
        return err;
    if ((err = job_state(db, job, &s, em, ctx)) != 0 ||
        (err = ckpt_find(db, job, stepno, &cid, from, sizeof(from), em, ctx)) != 0)
        goto fail;
    if (cid == 0) {
        err = dt_emsg_set(em, DT_ENOENT, "job %" PRId64 ": no checkpoint at step %" PRId64, job,
                          stepno);
        goto fail;
    }
    if (!ckpt_move_ok(from, state)) {
        err = dt_emsg_set(em, DT_EINVAL,
                          "job %" PRId64 ": checkpoint at step %" PRId64
                          " is %s and cannot become %s",
                          job, stepno, from, state);
        goto fail;
    }
    bind_i64(st, 1, cid, &rc);
    bind_str(st, 2, state, &rc);
    bind_i64(st, 3, t, &rc);
    if ((err = run(db, st, rc, em, ctx)) != 0)
        goto fail;
    if (strcmp(state, "corrupt") == 0 && db->version >= 6) {
        /* kept when the step is written again (schema version 6) */
        st = db->st[S_CKPT_SET_CORRUPT_MS];
        rc = SQLITE_OK;
        bind_i64(st, 1, cid, &rc);
        bind_i64(st, 2, t, &rc);
        if ((err = run(db, st, rc, em, ctx)) != 0)
            goto fail;
    }
    snprintf(kind, sizeof(kind), "checkpoint_%s", state);
    snprintf(detail, sizeof(detail), "step=%" PRId64, stepno);
    if ((err = event_insert(db, job, t, kind, s, detail, em, ctx)) != 0)
        goto fail;
    return tx_commit(db, em, ctx);
fail:
    tx_rollback(db);
    return err;
}

int dt_db_checkpoints(dt_db_t *db, int64_t job, int (*cb)(const dt_checkpoint_t *c, void *arg),
                      void *arg, dt_emsg_t *em)
{
    sqlite3_stmt *st;
    enum dt_job_state s;
    dt_checkpoint_t *rows = NULL;
    size_t n = 0, cap = 0;
    int rc = SQLITE_OK, ret;

    if ((ret = need_v2(db, em)) != 0 || (ret = job_state(db, job, &s, em, "list checkpoints")) != 0)
        return ret;
    st = db->st[db->version >= 6 ? S_CKPT_LIST6 : S_CKPT_LIST];
    bind_i64(st, 1, job, &rc);
    for (rc = step(st, rc); rc == SQLITE_ROW; rc = sqlite3_step(st)) {
        rows = grow(rows, n, &cap, sizeof(*rows));
        rows[n++] = (dt_checkpoint_t){
            .id = sqlite3_column_int64(st, 0),
            .job = sqlite3_column_int64(st, 1),
            .step = sqlite3_column_int64(st, 2),
            .state = col_str(st, 3),
            .shards = sqlite3_column_int(st, 4),
            .bytes = sqlite3_column_int64(st, 5),
            .created_ms = sqlite3_column_int64(st, 6),
            .committed_ms = sqlite3_column_int64(st, 7), /* NULL reads as 0 */
            .corrupt_ms = sqlite3_column_int64(st, 8),
        };
    }
    if (rc != SQLITE_DONE)
        ret = sq_fail(db, em, rc, "list checkpoints");
    reset(st);
    for (size_t i = 0; i < n; i++) {
        if (ret == 0)
            ret = cb(&rows[i], arg);
        dt_checkpoint_clear(&rows[i]);
    }
    free(rows);
    return ret;
}

void dt_shard_clear(dt_shard_t *s)
{
    free(s->path);
    free(s->sha256);
    memset(s, 0, sizeof(*s));
}

int dt_db_shards(dt_db_t *db, int64_t job, int64_t stepno,
                 int (*cb)(const dt_shard_t *s, void *arg), void *arg, dt_emsg_t *em)
{
    sqlite3_stmt *st;
    enum dt_job_state s;
    dt_shard_t *rows = NULL;
    size_t n = 0, cap = 0;
    bool found = false;
    int rc = SQLITE_OK, ret;

    if ((ret = need_v2(db, em)) != 0 || (ret = job_state(db, job, &s, em, "list shards")) != 0)
        return ret;
    st = db->st[S_SHARD_LIST];
    bind_i64(st, 1, job, &rc);
    bind_i64(st, 2, stepno, &rc);
    for (rc = step(st, rc); rc == SQLITE_ROW; rc = sqlite3_step(st)) {
        found = true;
        if (sqlite3_column_type(st, 0) == SQLITE_NULL)
            continue; /* the checkpoint, without shards */
        rows = grow(rows, n, &cap, sizeof(*rows));
        rows[n++] = (dt_shard_t){
            .rank = sqlite3_column_int(st, 0),
            .path = col_str(st, 1),
            .bytes = sqlite3_column_int64(st, 2),
            .sha256 = col_str(st, 3),
        };
    }
    if (rc != SQLITE_DONE)
        ret = sq_fail(db, em, rc, "list shards");
    else if (!found)
        ret = dt_emsg_set(em, DT_ENOENT, "job %" PRId64 ": no checkpoint at step %" PRId64, job,
                          stepno);
    reset(st);
    for (size_t i = 0; i < n; i++) {
        if (ret == 0)
            ret = cb(&rows[i], arg);
        dt_shard_clear(&rows[i]);
    }
    free(rows);
    return ret;
}

/*-- generations and ranks ----------------------------------------------------*/

void dt_gen_clear(dt_gen_t *g)
{
    free(g->reason);
    memset(g, 0, sizeof(*g));
}

void dt_rank_clear(dt_rank_t *r)
{
    free(r->state);
    memset(r, 0, sizeof(*r));
}

/* The newest generation of the job (out->gen 0 for none) and whether it
 * has ended: ended_ms is NULL while it runs, read here as 0. */
static int gen_newest(dt_db_t *db, int64_t job, dt_gen_t *out, bool *ended, dt_emsg_t *em,
                      const char *ctx)
{
    sqlite3_stmt *st = db->st[S_GEN_LAST];
    int rc = SQLITE_OK, err = 0;

    *out = (dt_gen_t){ .job = job };
    *ended = false;
    bind_i64(st, 1, job, &rc);
    rc = step(st, rc);
    if (rc == SQLITE_ROW) {
        *out = (dt_gen_t){
            .job = sqlite3_column_int64(st, 0),
            .gen = sqlite3_column_int(st, 1),
            .ranks = sqlite3_column_int(st, 2),
            .started_ms = sqlite3_column_int64(st, 3),
            .ended_ms = sqlite3_column_int64(st, 4),
            .resume_step = sqlite3_column_int64(st, 5),
            .reason = col_str(st, 6),
        };
        *ended = sqlite3_column_type(st, 4) != SQLITE_NULL;
    } else if (rc != SQLITE_DONE) {
        err = sq_fail(db, em, rc, ctx);
    }
    reset(st);
    return err;
}

/* Generation `gen` of the job: DT_ENOENT when there is none, else whether
 * it has ended and why (reason "" while it runs). */
static int gen_find(dt_db_t *db, int64_t job, int gen, bool *ended, char *reason, size_t rsize,
                    dt_emsg_t *em, const char *ctx)
{
    sqlite3_stmt *st = db->st[S_GEN_FIND];
    int rc = SQLITE_OK, err = 0;

    bind_i64(st, 1, job, &rc);
    bind_i64(st, 2, gen, &rc);
    rc = step(st, rc);
    if (rc == SQLITE_ROW) {
        const unsigned char *r = sqlite3_column_text(st, 1);
        *ended = sqlite3_column_int(st, 0) != 0;
        snprintf(reason, rsize, "%s", r ? (const char *)r : "");
    } else if (rc == SQLITE_DONE) {
        err = dt_emsg_set(em, DT_ENOENT, "job %" PRId64 ": no generation %d", job, gen);
    } else {
        err = sq_fail(db, em, rc, ctx);
    }
    reset(st);
    return err;
}

/* Place rank r of the generation on `agent`, which must be an agent of the
 * same job. */
static int rank_insert(dt_db_t *db, int64_t job, int gen, int r, int64_t agent, int64_t stepno,
                       dt_emsg_t *em, const char *ctx)
{
    sqlite3_stmt *st = db->st[S_AGENT_JOB];
    int64_t owner = 0;
    int rc = SQLITE_OK, err = 0;

    bind_i64(st, 1, agent, &rc);
    rc = step(st, rc);
    if (rc == SQLITE_ROW)
        owner = sqlite3_column_int64(st, 0);
    else if (rc == SQLITE_DONE)
        err = dt_emsg_set(em, DT_ENOENT, "job %" PRId64 " gen %d rank %d: no such agent %" PRId64,
                          job, gen, r, agent);
    else
        err = sq_fail(db, em, rc, ctx);
    reset(st);
    if (err)
        return err;
    if (owner != job)
        return dt_emsg_set(em, DT_EINVAL,
                           "job %" PRId64 " gen %d rank %d: agent %" PRId64
                           " belongs to job %" PRId64,
                           job, gen, r, agent, owner);
    st = db->st[S_RANK_INSERT];
    rc = SQLITE_OK;
    bind_i64(st, 1, job, &rc);
    bind_i64(st, 2, gen, &rc);
    bind_i64(st, 3, r, &rc);
    bind_i64(st, 4, agent, &rc);
    bind_i64(st, 5, stepno, &rc);
    return run(db, st, rc, em, ctx);
}

int dt_db_gen_begin(dt_db_t *db, int64_t job, int gen, int ranks, const int64_t *agent_of,
                    int64_t resume_step, dt_emsg_t *em)
{
    sqlite3_stmt *st = db->st[S_GEN_INSERT];
    enum dt_job_state s;
    dt_gen_t last = { 0 };
    bool ended;
    int64_t t = dt_clock_wall_ms();
    char ctx[96], detail[96];
    int rc = SQLITE_OK, err;

    assert(agent_of != NULL || ranks < 1);
    if ((err = need_v3(db, em)) != 0)
        return err;
    if (gen < 1 || ranks < 1 || resume_step < 0)
        return dt_emsg_set(em, DT_EINVAL,
                           "job %" PRId64 " gen %d: bad generation (%d ranks, resume step %" PRId64
                           ")",
                           job, gen, ranks, resume_step);
    snprintf(ctx, sizeof(ctx), "job %" PRId64 " gen %d: begin", job, gen);
    if ((err = tx_begin(db, em, ctx)) != 0)
        return err;
    if ((err = job_state(db, job, &s, em, ctx)) != 0 ||
        (err = gen_newest(db, job, &last, &ended, em, ctx)) != 0)
        goto fail;
    if (last.gen > 0 && !ended) {
        err = dt_emsg_set(em, DT_EINVAL,
                          "job %" PRId64 " gen %d: generation %d is still running (end it first)",
                          job, gen, last.gen);
        goto fail;
    }
    if (gen != last.gen + 1) {
        err = dt_emsg_set(em, DT_EINVAL,
                          "job %" PRId64 " gen %d: not the next generation (that is %d)", job, gen,
                          last.gen + 1);
        goto fail;
    }
    bind_i64(st, 1, job, &rc);
    bind_i64(st, 2, gen, &rc);
    bind_i64(st, 3, t, &rc);
    bind_i64(st, 4, ranks, &rc);
    bind_i64(st, 5, resume_step, &rc);
    if ((err = run(db, st, rc, em, ctx)) != 0)
        goto fail;
    for (int r = 0; r < ranks; r++)
        if ((err = rank_insert(db, job, gen, r, agent_of[r], resume_step, em, ctx)) != 0)
            goto fail;
    snprintf(detail, sizeof(detail), "gen=%d ranks=%d resume_step=%" PRId64, gen, ranks,
             resume_step);
    if ((err = event_insert(db, job, t, "generation_started", s, detail, em, ctx)) != 0)
        goto fail;
    dt_gen_clear(&last);
    return tx_commit(db, em, ctx);
fail:
    dt_gen_clear(&last);
    tx_rollback(db);
    return err;
}

int dt_db_gen_end(dt_db_t *db, int64_t job, int gen, const char *reason, dt_emsg_t *em)
{
    sqlite3_stmt *st = db->st[S_GEN_END];
    enum dt_job_state s;
    bool ended = false;
    int64_t t = dt_clock_wall_ms();
    char ctx[96], why[128], *detail = NULL;
    int rc = SQLITE_OK, err;

    assert(reason != NULL);
    if ((err = need_v3(db, em)) != 0)
        return err;
    snprintf(ctx, sizeof(ctx), "job %" PRId64 " gen %d: end", job, gen);
    if ((err = tx_begin(db, em, ctx)) != 0)
        return err;
    if ((err = job_state(db, job, &s, em, ctx)) != 0 ||
        (err = gen_find(db, job, gen, &ended, why, sizeof(why), em, ctx)) != 0)
        goto fail;
    if (ended) {
        err =
            dt_emsg_set(em, DT_EINVAL, "job %" PRId64 " gen %d: already ended (%s)", job, gen, why);
        goto fail;
    }
    bind_i64(st, 1, job, &rc);
    bind_i64(st, 2, gen, &rc);
    bind_i64(st, 3, t, &rc);
    bind_str(st, 4, reason, &rc);
    if ((err = run(db, st, rc, em, ctx)) != 0)
        goto fail;
    detail = dt_xasprintf("gen=%d: %s", gen, reason);
    if ((err = event_insert(db, job, t, "generation_ended", s, detail, em, ctx)) != 0)
        goto fail;
    free(detail);
    return tx_commit(db, em, ctx);
fail:
    free(detail);
    tx_rollback(db);
    return err;
}

int dt_db_gen_last(dt_db_t *db, int64_t job, dt_gen_t *out, dt_emsg_t *em)
{
    enum dt_job_state s;
    bool ended;
    int err;

    *out = (dt_gen_t){ .job = job };
    if ((err = need_v3(db, em)) != 0 ||
        (err = job_state(db, job, &s, em, "read newest generation")) != 0)
        return err;
    return gen_newest(db, job, out, &ended, em, "read newest generation");
}

int dt_db_gens(dt_db_t *db, int64_t job, int (*cb)(const dt_gen_t *g, void *arg), void *arg,
               dt_emsg_t *em)
{
    sqlite3_stmt *st;
    enum dt_job_state s;
    dt_gen_t *rows = NULL;
    size_t n = 0, cap = 0;
    int rc = SQLITE_OK, ret;

    if ((ret = need_v3(db, em)) != 0 || (ret = job_state(db, job, &s, em, "list generations")) != 0)
        return ret;
    st = db->st[S_GEN_LIST];
    bind_i64(st, 1, job, &rc);
    for (rc = step(st, rc); rc == SQLITE_ROW; rc = sqlite3_step(st)) {
        rows = grow(rows, n, &cap, sizeof(*rows));
        rows[n++] = (dt_gen_t){
            .job = sqlite3_column_int64(st, 0),
            .gen = sqlite3_column_int(st, 1),
            .ranks = sqlite3_column_int(st, 2),
            .started_ms = sqlite3_column_int64(st, 3),
            .ended_ms = sqlite3_column_int64(st, 4), /* NULL while it runs: 0 */
            .resume_step = sqlite3_column_int64(st, 5),
            .reason = col_str(st, 6),
        };
    }
    if (rc != SQLITE_DONE)
        ret = sq_fail(db, em, rc, "list generations");
    reset(st);
    for (size_t i = 0; i < n; i++) {
        if (ret == 0)
            ret = cb(&rows[i], arg);
        dt_gen_clear(&rows[i]);
    }
    free(rows);
    return ret;
}

int dt_db_gen_ranks(dt_db_t *db, int64_t job, int gen, int (*cb)(const dt_rank_t *r, void *arg),
                    void *arg, dt_emsg_t *em)
{
    sqlite3_stmt *st;
    enum dt_job_state s;
    dt_rank_t *rows = NULL;
    size_t n = 0, cap = 0;
    bool ended;
    char why[8];
    int rc = SQLITE_OK, ret;

    if ((ret = need_v3(db, em)) != 0 || (ret = job_state(db, job, &s, em, "list ranks")) != 0 ||
        (ret = gen_find(db, job, gen, &ended, why, sizeof(why), em, "list ranks")) != 0)
        return ret;
    st = db->st[S_RANK_LIST];
    bind_i64(st, 1, job, &rc);
    bind_i64(st, 2, gen, &rc);
    for (rc = step(st, rc); rc == SQLITE_ROW; rc = sqlite3_step(st)) {
        rows = grow(rows, n, &cap, sizeof(*rows));
        rows[n++] = (dt_rank_t){
            .rank = sqlite3_column_int(st, 0),
            .agent = sqlite3_column_int64(st, 1),
            .state = col_str(st, 2),
            .step = sqlite3_column_int64(st, 3),
            .pid = sqlite3_column_int64(st, 4),
        };
    }
    if (rc != SQLITE_DONE)
        ret = sq_fail(db, em, rc, "list ranks");
    reset(st);
    for (size_t i = 0; i < n; i++) {
        if (ret == 0)
            ret = cb(&rows[i], arg);
        dt_rank_clear(&rows[i]);
    }
    free(rows);
    return ret;
}

int dt_db_rank_set(dt_db_t *db, int64_t job, int gen, int rank, const char *state, int64_t stepno,
                   int64_t pid, dt_emsg_t *em)
{
    sqlite3_stmt *st = db->st[S_RANK_SET];
    enum dt_job_state s;
    bool ended;
    char ctx[96], why[8];
    int rc = SQLITE_OK, err;

    assert(state != NULL);
    if ((err = need_v3(db, em)) != 0)
        return err;
    if (!dt_rank_state_known(state))
        return dt_emsg_set(em, DT_EINVAL,
                           "job %" PRId64 " gen %d rank %d: unknown state '%s' (starting, "
                           "running, exited, failed, hung, killed or lost)",
                           job, gen, rank, state);
    if (stepno < 0 || pid < 0)
        return dt_emsg_set(em, DT_EINVAL,
                           "job %" PRId64 " gen %d rank %d: negative step %" PRId64
                           " or pid %" PRId64,
                           job, gen, rank, stepno, pid);
    snprintf(ctx, sizeof(ctx), "job %" PRId64 " gen %d rank %d: %s", job, gen, rank, state);
    if ((err = tx_begin(db, em, ctx)) != 0)
        return err;
    bind_i64(st, 1, job, &rc);
    bind_i64(st, 2, gen, &rc);
    bind_i64(st, 3, rank, &rc);
    bind_str(st, 4, state, &rc);
    bind_i64(st, 5, stepno, &rc);
    bind_i64(st, 6, pid, &rc);
    if ((err = run(db, st, rc, em, ctx)) != 0)
        goto fail;
    if (sqlite3_changes(db->h) == 0) {
        /* say which of job, generation and rank is missing */
        if ((err = job_state(db, job, &s, em, ctx)) == 0 &&
            (err = gen_find(db, job, gen, &ended, why, sizeof(why), em, ctx)) == 0)
            err = dt_emsg_set(em, DT_ENOENT, "job %" PRId64 " gen %d: no rank %d", job, gen, rank);
        goto fail;
    }
    return tx_commit(db, em, ctx);
fail:
    tx_rollback(db);
    return err;
}

/*-- Slurm jobs ---------------------------------------------------------------*/

static int need_v4(dt_db_t *db, dt_emsg_t *em)
{
    if (db->version >= 4)
        return 0;
    return dt_emsg_set(em, DT_ENOTSUP,
                       "%s: schema version %d has no Slurm jobs (open it with dt_db_open to "
                       "migrate)",
                       db->path, db->version);
}

void dt_slurm_job_clear(dt_slurm_job_t *s)
{
    free(s->state);
    free(s->reason);
    free(s->nodes);
    free(s->exclude);
    free(s->output);
    memset(s, 0, sizeof(*s));
}

int dt_db_slurm_submitted(dt_db_t *db, int64_t job, int64_t slurm_id, const char *output,
                          const char *exclude, const char *detail, dt_emsg_t *em)
{
    sqlite3_stmt *st;
    enum dt_job_state s;
    int64_t t = dt_clock_wall_ms();
    char ctx[96], d[600];
    int rc = SQLITE_OK, err;

    if ((err = need_v4(db, em)) != 0)
        return err;
    if (slurm_id <= 0)
        return dt_emsg_set(em, DT_EINVAL, "job %" PRId64 ": Slurm job id %" PRId64 " is not "
                           "positive", job, slurm_id);
    snprintf(ctx, sizeof(ctx), "job %" PRId64 ": record Slurm job %" PRId64, job, slurm_id);
    if ((err = tx_begin(db, em, ctx)) != 0)
        return err;
    if ((err = job_state(db, job, &s, em, ctx)) != 0)
        goto fail;
    st = db->st[S_SLURM_FIND];
    bind_i64(st, 1, slurm_id, &rc);
    rc = step(st, rc);
    reset(st);
    if (rc == SQLITE_ROW) {
        err = dt_emsg_set(em, DT_EEXIST, "%s: already recorded", ctx);
        goto fail;
    } else if (rc != SQLITE_DONE) {
        err = sq_fail(db, em, rc, ctx);
        goto fail;
    }
    st = db->st[S_SLURM_INSERT];
    rc = SQLITE_OK;
    bind_i64(st, 1, slurm_id, &rc);
    bind_i64(st, 2, job, &rc);
    bind_str(st, 3, exclude ? exclude : "", &rc);
    bind_str(st, 4, output ? output : "", &rc);
    bind_i64(st, 5, t, &rc);
    if ((err = run(db, st, rc, em, ctx)) != 0)
        goto fail;
    st = db->st[S_JOB_SET_SLURM];
    rc = SQLITE_OK;
    bind_i64(st, 1, job, &rc);
    bind_i64(st, 2, slurm_id, &rc);
    bind_i64(st, 3, t, &rc);
    if ((err = run(db, st, rc, em, ctx)) != 0)
        goto fail;
    snprintf(d, sizeof(d), "slurm job %" PRId64 "%s%s", slurm_id, detail ? ": " : "",
             detail ? detail : "");
    if ((err = event_insert(db, job, t, "slurm_submitted", s, d, em, ctx)) != 0)
        goto fail;
    return tx_commit(db, em, ctx);
fail:
    tx_rollback(db);
    return err;
}

int dt_db_slurm_get(dt_db_t *db, int64_t job, dt_slurm_job_t *out, dt_emsg_t *em)
{
    sqlite3_stmt *st;
    int rc = SQLITE_OK, err = 0;

    memset(out, 0, sizeof(*out));
    if ((err = need_v4(db, em)) != 0)
        return err;
    st = db->st[S_SLURM_GET];
    bind_i64(st, 1, job, &rc);
    rc = step(st, rc);
    if (rc == SQLITE_ROW) {
        out->slurm_id = sqlite3_column_int64(st, 0);
        out->job = sqlite3_column_int64(st, 1);
        out->state = col_str(st, 2);
        out->reason = col_str(st, 3);
        out->nodes = col_str(st, 4);
        out->exclude = col_str(st, 5);
        out->output = col_str(st, 6);
        out->restarts = sqlite3_column_int(st, 7);
        out->exit_code = sqlite3_column_int(st, 8);
        out->submitted_ms = sqlite3_column_int64(st, 9);
        out->updated_ms = sqlite3_column_int64(st, 10);
    } else if (rc == SQLITE_DONE) {
        err = dt_emsg_set(em, DT_ENOENT, "job %" PRId64 ": no Slurm job", job);
    } else {
        err = sq_fail(db, em, rc, "read Slurm job");
    }
    reset(st);
    return err;
}

static int str_differs(sqlite3_stmt *st, int col, const char *s)
{
    const unsigned char *v = sqlite3_column_text(st, col);
    return strcmp(v ? (const char *)v : "", s ? s : "") != 0;
}

int dt_db_slurm_update(dt_db_t *db, const dt_slurm_job_t *s, int *changed, dt_emsg_t *em)
{
    sqlite3_stmt *st;
    enum dt_job_state js;
    int64_t t = dt_clock_wall_ms(), job = 0;
    char ctx[96], d[1600];
    int rc = SQLITE_OK, err, diff = 0;

    *changed = 0;
    if ((err = need_v4(db, em)) != 0)
        return err;
    snprintf(ctx, sizeof(ctx), "Slurm job %" PRId64 ": update", s->slurm_id);
    if ((err = tx_begin(db, em, ctx)) != 0)
        return err;
    st = db->st[S_SLURM_READ];
    bind_i64(st, 1, s->slurm_id, &rc);
    rc = step(st, rc);
    if (rc == SQLITE_ROW) {
        job = sqlite3_column_int64(st, 0);
        diff = str_differs(st, 1, s->state) || str_differs(st, 2, s->reason) ||
               str_differs(st, 3, s->nodes) || sqlite3_column_int(st, 4) != s->restarts;
    }
    reset(st);
    if (rc == SQLITE_DONE) {
        err = dt_emsg_set(em, DT_ENOENT, "Slurm job %" PRId64 ": not a job of dt's",
                          s->slurm_id);
        goto fail;
    } else if (rc != SQLITE_ROW) {
        err = sq_fail(db, em, rc, ctx);
        goto fail;
    }
    st = db->st[S_SLURM_SET];
    rc = SQLITE_OK;
    bind_i64(st, 1, s->slurm_id, &rc);
    bind_str(st, 2, s->state ? s->state : "", &rc);
    bind_str(st, 3, s->reason ? s->reason : "", &rc);
    bind_str(st, 4, s->nodes ? s->nodes : "", &rc);
    bind_str(st, 5, s->exclude ? s->exclude : "", &rc);
    bind_i64(st, 6, s->restarts, &rc);
    bind_i64(st, 7, s->exit_code, &rc);
    bind_i64(st, 8, t, &rc);
    if ((err = run(db, st, rc, em, ctx)) != 0)
        goto fail;
    if (diff) {
        if ((err = job_state(db, job, &js, em, ctx)) != 0)
            goto fail;
        int n = snprintf(d, sizeof(d), "slurm job %" PRId64 ": %s", s->slurm_id,
                         s->state ? s->state : "?");
        if (s->reason && *s->reason && strcmp(s->reason, "None") != 0 && n < (int)sizeof(d))
            n += snprintf(d + n, sizeof(d) - (size_t)n, " (%s)", s->reason);
        if (s->nodes && *s->nodes && n < (int)sizeof(d))
            n += snprintf(d + n, sizeof(d) - (size_t)n, " on %s", s->nodes);
        if (s->restarts > 0 && n < (int)sizeof(d))
            snprintf(d + n, sizeof(d) - (size_t)n, " [restart %d]", s->restarts);
        if ((err = event_insert(db, job, t, "slurm_state", js, d, em, ctx)) != 0)
            goto fail;
    }
    if ((err = tx_commit(db, em, ctx)) != 0)
        return err;
    *changed = diff;
    return 0;
fail:
    tx_rollback(db);
    return err;
}

/* A move to queued outside the transition table's own statement: requeue
 * and resume, which also update counters. */
static int to_queued(dt_db_t *db, int64_t job, enum stmt which, bool failure, const char *kind,
                     const char *detail, dt_emsg_t *em)
{
    sqlite3_stmt *st = db->st[which];
    enum dt_job_state from;
    int64_t t = dt_clock_wall_ms();
    char ctx[96], msg[160];
    int rc = SQLITE_OK, err;
    bool ok;

    if ((err = need_v4(db, em)) != 0)
        return err;
    snprintf(ctx, sizeof(ctx), "job %" PRId64 ": %s", job, kind);
    if ((err = tx_begin(db, em, ctx)) != 0)
        return err;
    if ((err = job_state(db, job, &from, em, ctx)) != 0)
        goto fail;
    if (which == S_JOB_REQUEUE)
        ok = from == DT_JOB_STARTING || from == DT_JOB_RUNNING || from == DT_JOB_RECOVERING ||
             from == DT_JOB_QUEUED;
    else
        ok = from == DT_JOB_FAILED || from == DT_JOB_CANCELLED;
    if (!ok) {
        snprintf(msg, sizeof(msg), "job %" PRId64 ": cannot be %s while %s", job,
                 which == S_JOB_REQUEUE ? "requeued" : "resumed", dt_job_state_name(from));
        if ((err = event_insert(db, job, t, "refused", from, msg, em, ctx)) != 0)
            goto fail;
        if ((err = tx_commit(db, em, ctx)) != 0)
            return err;
        return dt_emsg_set(em, DT_EINVAL, "%s", msg);
    }
    bind_i64(st, 1, job, &rc);
    bind_str(st, 2, detail, &rc);
    bind_i64(st, 3, t, &rc);
    if (which == S_JOB_REQUEUE)
        bind_i64(st, 4, failure ? 1 : 0, &rc);
    if ((err = run(db, st, rc, em, ctx)) != 0 ||
        (err = event_insert(db, job, t, kind, DT_JOB_QUEUED, detail, em, ctx)) != 0)
        goto fail;
    return tx_commit(db, em, ctx);
fail:
    tx_rollback(db);
    return err;
}

int dt_db_job_requeue(dt_db_t *db, int64_t job, bool failure, const char *kind,
                      const char *detail, dt_emsg_t *em)
{
    return to_queued(db, job, S_JOB_REQUEUE, failure, kind ? kind : "requeued", detail, em);
}

int dt_db_job_resume(dt_db_t *db, int64_t job, const char *detail, dt_emsg_t *em)
{
    return to_queued(db, job, S_JOB_RESUME, false, "resumed", detail, em);
}

int dt_db_job_counts(dt_db_t *db, int64_t job, int *requeues, int *restart_base, dt_emsg_t *em)
{
    sqlite3_stmt *st;
    int rc = SQLITE_OK, err = 0;

    *requeues = *restart_base = 0;
    if (db->version < 4)
        return 0;
    st = db->st[S_JOB_COUNTS];
    bind_i64(st, 1, job, &rc);
    rc = step(st, rc);
    if (rc == SQLITE_ROW) {
        *requeues = sqlite3_column_int(st, 0);
        *restart_base = sqlite3_column_int(st, 1);
    } else if (rc == SQLITE_DONE) {
        err = no_job(em, job);
    } else {
        err = sq_fail(db, em, rc, "read job counts");
    }
    reset(st);
    return err;
}

/*-- steps, failure costs and goodput (version 7) -----------------------------*/

static int need_v7(dt_db_t *db, dt_emsg_t *em)
{
    if (db->version >= 7)
        return 0;
    return dt_emsg_set(em, DT_ENOTSUP,
                       "%s: schema version %d has no step history (open it with dt_db_open to "
                       "migrate)",
                       db->path, db->version);
}

/* A real: NaN (not known) is bound as NULL and NULL read back as NaN. */
static void bind_real(sqlite3_stmt *st, int i, double v, int *rc)
{
    if (*rc == SQLITE_OK)
        *rc = isnan(v) ? sqlite3_bind_null(st, i) : sqlite3_bind_double(st, i, v);
}

static double col_real(sqlite3_stmt *st, int i)
{
    return sqlite3_column_type(st, i) == SQLITE_NULL ? NAN : sqlite3_column_double(st, i);
}

static int64_t col_i64(sqlite3_stmt *st, int i, int64_t none)
{
    return sqlite3_column_type(st, i) == SQLITE_NULL ? none : sqlite3_column_int64(st, i);
}

/* One generation's sums (GEN_SUMS); times ms since the epoch, -1 for NULL. */
typedef struct gen_sums {
    int gen;
    int64_t started_ms, ended_ms, resume_step, last_step, first_step_ms, last_step_ms;
    double work_ms, stall_ms;
    bool has_cost;
    double detect_s, restart_s, load_s;
} gen_sums_t;

/* Every generation of the job, oldest first (*out the caller's). */
static int gen_sums(dt_db_t *db, int64_t job, gen_sums_t **out, int *n, dt_emsg_t *em,
                    const char *ctx)
{
    sqlite3_stmt *st = db->st[S_GEN_SUMS];
    gen_sums_t *g = NULL;
    size_t k = 0, cap = 0;
    int rc = SQLITE_OK, err = 0;

    bind_i64(st, 1, job, &rc);
    for (rc = step(st, rc); rc == SQLITE_ROW; rc = sqlite3_step(st)) {
        g = grow(g, k, &cap, sizeof(*g));
        g[k++] = (gen_sums_t){
            .gen = sqlite3_column_int(st, 0),
            .started_ms = col_i64(st, 1, -1),
            .ended_ms = col_i64(st, 2, -1),
            .resume_step = sqlite3_column_int64(st, 3),
            .last_step = sqlite3_column_int64(st, 4),
            .first_step_ms = col_i64(st, 5, -1),
            .last_step_ms = col_i64(st, 6, -1),
            .work_ms = sqlite3_column_double(st, 7),
            .stall_ms = sqlite3_column_double(st, 8),
            .has_cost = sqlite3_column_int(st, 9) != 0,
            .detect_s = col_real(st, 10),
            .restart_s = col_real(st, 11),
            .load_s = col_real(st, 12),
        };
    }
    if (rc != SQLITE_DONE) {
        err = sq_fail(db, em, rc, ctx);
        free(g);
        g = NULL;
        k = 0;
    }
    reset(st);
    *out = g;
    *n = (int)k;
    return err;
}

/* The generation's steps' own time up to step `upto` (its whole time at
 * or past its newest step; at a thinned step, the nearest row below). */
static int work_at(dt_db_t *db, int64_t job, const gen_sums_t *g, int64_t upto, double *out,
                   dt_emsg_t *em, const char *ctx)
{
    sqlite3_stmt *st = db->st[S_STEP_WORK_AT];
    int rc = SQLITE_OK, err = 0;

    *out = 0;
    if (upto >= g->last_step) {
        *out = g->work_ms;
        return 0;
    }
    if (upto <= g->resume_step)
        return 0;
    bind_i64(st, 1, job, &rc);
    bind_i64(st, 2, g->gen, &rc);
    bind_i64(st, 3, upto, &rc);
    rc = step(st, rc);
    if (rc == SQLITE_ROW)
        *out = sqlite3_column_double(st, 0);
    else if (rc != SQLITE_DONE)
        err = sq_fail(db, em, rc, ctx);
    reset(st);
    return err;
}

/* The own time of the steps of generations g[0 .. n) that are kept when a
 * resume from step `cap` follows them (cap < 0: none does): newest first,
 * each keeps its steps up to the lowest resume step after it. */
static int kept_ms(dt_db_t *db, int64_t job, const gen_sums_t *g, int n, int64_t cap,
                   double *out, dt_emsg_t *em, const char *ctx)
{
    double sum = 0, w;
    int err;

    for (int i = n - 1; i >= 0; i--) {
        int64_t top = cap >= 0 && cap < g[i].last_step ? cap : g[i].last_step;
        if (top > g[i].resume_step) {
            if ((err = work_at(db, job, &g[i], top, &w, em, ctx)) != 0)
                return err;
            sum += w;
        }
        if (cap < 0 || g[i].resume_step < cap)
            cap = g[i].resume_step;
    }
    *out = sum;
    return 0;
}

int dt_db_step_add(dt_db_t *db, const dt_step_row_t *s, double stall_ms, dt_emsg_t *em)
{
    sqlite3_stmt *st;
    enum dt_job_state js;
    char ctx[96];
    int rc = SQLITE_OK, err;
    bool ended = false;
    int64_t last = 0, stride = 1, rows = 0;
    double work = 0;

    if ((err = need_v7(db, em)) != 0)
        return err;
    if (s->step < 1 || s->at_ms < 0 || !isfinite(s->step_ms) || s->step_ms < 0 ||
        !isfinite(stall_ms) || stall_ms < 0)
        return dt_emsg_set(em, DT_EINVAL,
                           "job %" PRId64 " gen %d step %" PRId64 ": bad step (time %g ms, "
                           "stall %g ms, at %" PRId64 ")",
                           s->job, s->gen, s->step, s->step_ms, stall_ms, s->at_ms);
    snprintf(ctx, sizeof(ctx), "job %" PRId64 " gen %d step %" PRId64 ": add", s->job, s->gen,
             s->step);
    if ((err = tx_begin(db, em, ctx)) != 0)
        return err;
    if ((err = job_state(db, s->job, &js, em, ctx)) != 0)
        goto fail;
    st = db->st[S_GEN_STEPPED];
    bind_i64(st, 1, s->job, &rc);
    bind_i64(st, 2, s->gen, &rc);
    rc = step(st, rc);
    if (rc == SQLITE_ROW) {
        ended = sqlite3_column_int(st, 0) != 0;
        last = sqlite3_column_int64(st, 1);
        work = sqlite3_column_double(st, 2);
        err = 0;
    } else if (rc == SQLITE_DONE) {
        err = dt_emsg_set(em, DT_ENOENT, "job %" PRId64 ": no generation %d", s->job, s->gen);
    } else {
        err = sq_fail(db, em, rc, ctx);
    }
    reset(st);
    if (err != 0)
        goto fail;
    if (ended || s->step <= last) {
        err = dt_emsg_set(em, DT_EINVAL,
                          ended ? "job %" PRId64 " gen %d step %" PRId64 ": the generation has ended"
                                : "job %" PRId64 " gen %d step %" PRId64 ": not past its newest "
                                  "step",
                          s->job, s->gen, s->step);
        goto fail;
    }
    work += s->step_ms;
    st = db->st[S_GEN_ADD_STEP];
    rc = SQLITE_OK;
    bind_i64(st, 1, s->job, &rc);
    bind_i64(st, 2, s->gen, &rc);
    bind_i64(st, 3, s->step, &rc);
    bind_i64(st, 4, s->at_ms - (int64_t)llround(s->step_ms), &rc);
    bind_i64(st, 5, s->at_ms, &rc);
    if (rc == SQLITE_OK)
        rc = sqlite3_bind_double(st, 6, s->step_ms);
    if (rc == SQLITE_OK)
        rc = sqlite3_bind_double(st, 7, stall_ms);
    if ((err = run(db, st, rc, em, ctx)) != 0)
        goto fail;
    st = db->st[S_JOB_STRIDE];
    rc = SQLITE_OK;
    bind_i64(st, 1, s->job, &rc);
    if ((rc = step(st, rc)) == SQLITE_ROW)
        stride = sqlite3_column_int64(st, 0);
    reset(st);
    if (rc != SQLITE_ROW) {
        err = sq_fail(db, em, rc, ctx);
        goto fail;
    }
    if (s->step % stride != 0)
        return tx_commit(db, em, ctx); /* thinned: the sums have it */
    st = db->st[S_STEP_INSERT];
    rc = SQLITE_OK;
    bind_i64(st, 1, s->job, &rc);
    bind_i64(st, 2, s->gen, &rc);
    bind_i64(st, 3, s->step, &rc);
    bind_i64(st, 4, s->at_ms, &rc);
    if (rc == SQLITE_OK)
        rc = sqlite3_bind_double(st, 5, s->step_ms);
    if (rc == SQLITE_OK)
        rc = sqlite3_bind_double(st, 6, work);
    bind_real(st, 7, s->loss, &rc);
    bind_real(st, 8, s->tokens_s, &rc);
    if ((err = run(db, st, rc, em, ctx)) != 0)
        goto fail;
    st = db->st[S_STEP_COUNT];
    rc = SQLITE_OK;
    bind_i64(st, 1, s->job, &rc);
    if ((rc = step(st, rc)) == SQLITE_ROW)
        rows = sqlite3_column_int64(st, 0);
    reset(st);
    if (rc != SQLITE_ROW) {
        err = sq_fail(db, em, rc, ctx);
        goto fail;
    }
    if (rows > DT_DB_STEP_ROWS) {
        stride *= 2;
        st = db->st[S_STEP_THIN];
        rc = SQLITE_OK;
        bind_i64(st, 1, s->job, &rc);
        bind_i64(st, 2, stride, &rc);
        if ((err = run(db, st, rc, em, ctx)) != 0)
            goto fail;
        st = db->st[S_JOB_SET_STRIDE];
        rc = SQLITE_OK;
        bind_i64(st, 1, s->job, &rc);
        bind_i64(st, 2, stride, &rc);
        if ((err = run(db, st, rc, em, ctx)) != 0)
            goto fail;
    }
    return tx_commit(db, em, ctx);
fail:
    tx_rollback(db);
    return err;
}

int dt_db_steps(dt_db_t *db, int64_t job, int (*cb)(const dt_step_row_t *s, void *arg), void *arg,
                dt_emsg_t *em)
{
    sqlite3_stmt *st;
    enum dt_job_state js;
    dt_step_row_t *rows = NULL;
    size_t n = 0, cap = 0;
    int rc = SQLITE_OK, ret;

    if ((ret = need_v7(db, em)) != 0 || (ret = job_state(db, job, &js, em, "list steps")) != 0)
        return ret;
    st = db->st[S_STEP_LIST];
    bind_i64(st, 1, job, &rc);
    for (rc = step(st, rc); rc == SQLITE_ROW; rc = sqlite3_step(st)) {
        rows = grow(rows, n, &cap, sizeof(*rows));
        rows[n++] = (dt_step_row_t){
            .job = sqlite3_column_int64(st, 0),
            .gen = sqlite3_column_int(st, 1),
            .step = sqlite3_column_int64(st, 2),
            .at_ms = sqlite3_column_int64(st, 3),
            .step_ms = sqlite3_column_double(st, 4),
            .work_ms = sqlite3_column_double(st, 5),
            .loss = col_real(st, 6),
            .tokens_s = col_real(st, 7),
        };
    }
    if (rc != SQLITE_DONE)
        ret = sq_fail(db, em, rc, "list steps");
    reset(st);
    for (size_t i = 0; i < n && ret == 0; i++)
        ret = cb(&rows[i], arg);
    free(rows);
    return ret;
}

static double secs_between(int64_t from_ms, int64_t to_ms)
{
    return to_ms > from_ms ? (double)(to_ms - from_ms) / 1000.0 : 0.0;
}

/* A word of [a-z_] (it goes into JSON unquoted by anything else). */
static bool plain_word(const char *w)
{
    if (w == NULL || *w == '\0' || strlen(w) > 32)
        return false;
    for (; *w; w++)
        if (!((*w >= 'a' && *w <= 'z') || *w == '_'))
            return false;
    return true;
}

int dt_db_failure_cost(dt_db_t *db, int64_t job, dt_fail_cost_t *c, dt_emsg_t *em)
{
    enum dt_job_state js;
    gen_sums_t *g = NULL;
    int n = 0, gi = -1, ni = -1, rc = SQLITE_OK, err;
    char ctx[96], detail[512];
    double before = 0, after = 0;

    if ((err = need_v7(db, em)) != 0)
        return err;
    if (!plain_word(c->what) || c->next <= c->gen)
        return dt_emsg_set(em, DT_EINVAL, "job %" PRId64 " gen %d: bad failure cost (next %d)",
                           job, c->gen, c->next);
    snprintf(ctx, sizeof(ctx), "job %" PRId64 " gen %d: failure cost", job, c->gen);
    if ((err = tx_begin(db, em, ctx)) != 0)
        return err;
    if ((err = job_state(db, job, &js, em, ctx)) != 0 ||
        (err = gen_sums(db, job, &g, &n, em, ctx)) != 0)
        goto fail;
    for (int i = 0; i < n; i++) {
        if (g[i].gen == c->gen)
            gi = i;
        if (g[i].gen == c->next)
            ni = i;
    }
    if (gi < 0 || ni < 0) {
        err = dt_emsg_set(em, DT_ENOENT, "job %" PRId64 ": no generation %d", job,
                          gi < 0 ? c->gen : c->next);
        goto fail;
    }
    if (g[ni].first_step_ms < 0 && c->until_ms <= 0) {
        err = dt_emsg_set(em, DT_EINVAL, "job %" PRId64 " gen %d: no step finished yet", job,
                          c->next);
        goto fail;
    }
    c->detect_s = secs_between(c->fault_ms, c->decided_ms);
    c->restart_s = secs_between(c->decided_ms, g[ni].started_ms);
    c->load_s = secs_between(g[ni].started_ms,
                             g[ni].first_step_ms >= 0 ? g[ni].first_step_ms : c->until_ms);
    c->resume_step = g[ni].resume_step;
    int64_t reached = 0;
    for (int i = 0; i <= gi; i++)
        if (g[i].last_step > reached)
            reached = g[i].last_step;
    c->recomputed_steps = reached > c->resume_step ? reached - c->resume_step : 0;
    if ((err = kept_ms(db, job, g, gi + 1, -1, &before, em, ctx)) != 0 ||
        (err = kept_ms(db, job, g, gi + 1, c->resume_step, &after, em, ctx)) != 0)
        goto fail;
    c->recomputed_s = before > after ? (before - after) / 1000.0 : 0.0;
    snprintf(detail, sizeof(detail),
             "{\"gen\":%d,\"next\":%d,\"fault\":\"%s\",\"detect_s\":%.3f,\"restart_s\":%.3f,"
             "\"load_s\":%.3f,\"resume_step\":%" PRId64 ",\"recomputed_steps\":%" PRId64
             ",\"recomputed_s\":%.3f}",
             c->gen, c->next, c->what, c->detect_s, c->restart_s, c->load_s, c->resume_step,
             c->recomputed_steps, c->recomputed_s);
    sqlite3_stmt *st = db->st[S_GEN_SET_COST];
    bind_i64(st, 1, job, &rc);
    bind_i64(st, 2, c->gen, &rc);
    bind_str(st, 3, detail, &rc);
    if ((err = run(db, st, rc, em, ctx)) != 0 ||
        (err = event_insert(db, job, dt_clock_wall_ms(), "failure_cost", js, detail, em, ctx)) != 0)
        goto fail;
    free(g);
    return tx_commit(db, em, ctx);
fail:
    free(g);
    tx_rollback(db);
    return err;
}

int dt_db_goodput(dt_db_t *db, int64_t job, int64_t now_ms, dt_goodput_t *out, dt_emsg_t *em)
{
    enum dt_job_state js;
    gen_sums_t *g = NULL;
    int n = 0, err;
    double kept = 0;

    *out = (dt_goodput_t){ .end_ms = now_ms, .ettr = NAN };
    if ((err = need_v7(db, em)) != 0 || (err = job_state(db, job, &js, em, "read goodput")) != 0 ||
        (err = gen_sums(db, job, &g, &n, em, "read goodput")) != 0)
        return err;
    int64_t end = -1;
    for (int i = 0; i < n; i++) {
        if (out->first_ms == 0 && g[i].first_step_ms >= 0)
            out->first_ms = g[i].first_step_ms;
        out->step_s += g[i].work_ms / 1000.0;
        out->stall_s += g[i].stall_ms / 1000.0;
        if (g[i].has_cost) {
            out->failures++;
            out->detect_s += isnan(g[i].detect_s) ? 0 : g[i].detect_s;
            out->restart_s += isnan(g[i].restart_s) ? 0 : g[i].restart_s;
            out->load_s += isnan(g[i].load_s) ? 0 : g[i].load_s;
        }
        if (g[i].last_step_ms > end)
            end = g[i].last_step_ms;
        if (g[i].ended_ms > end)
            end = g[i].ended_ms;
    }
    /* a job that has ended stopped counting when its last generation did */
    if (dt_job_state_terminal(js) && end >= 0)
        out->end_ms = end;
    if ((err = kept_ms(db, job, g, n, -1, &kept, em, "read goodput")) != 0) {
        free(g);
        return err;
    }
    free(g);
    out->productive_s = kept / 1000.0;
    out->recomputed_s = out->step_s > out->productive_s ? out->step_s - out->productive_s : 0;
    if (out->first_ms > 0) {
        out->wall_s = secs_between(out->first_ms, out->end_ms);
        if (out->wall_s > 0)
            out->ettr = out->productive_s / out->wall_s;
    }
    return 0;
}

int dt_db_failure_costs(dt_db_t *db, int64_t job, int (*cb)(int gen, const char *cost, void *arg),
                        void *arg, dt_emsg_t *em)
{
    sqlite3_stmt *st;
    enum dt_job_state js;
    struct {
        int gen;
        char *cost;
    } *rows = NULL;
    size_t n = 0, cap = 0;
    int rc = SQLITE_OK, ret;

    if ((ret = need_v7(db, em)) != 0 ||
        (ret = job_state(db, job, &js, em, "list failure costs")) != 0)
        return ret;
    st = db->st[S_GEN_COSTS];
    bind_i64(st, 1, job, &rc);
    for (rc = step(st, rc); rc == SQLITE_ROW; rc = sqlite3_step(st)) {
        rows = grow(rows, n, &cap, sizeof(*rows));
        rows[n].gen = sqlite3_column_int(st, 0);
        rows[n++].cost = col_str(st, 1);
    }
    if (rc != SQLITE_DONE)
        ret = sq_fail(db, em, rc, "list failure costs");
    reset(st);
    for (size_t i = 0; i < n; i++) {
        if (ret == 0)
            ret = cb(rows[i].gen, rows[i].cost, arg);
        free(rows[i].cost);
    }
    free(rows);
    return ret;
}
