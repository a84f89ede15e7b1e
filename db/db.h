/* SPDX-License-Identifier: MIT
 *
 * The coordinator's durable state: one SQLite file (WAL, foreign keys, busy
 * timeout), schema version in PRAGMA user_version, migrations forward only.
 * All SQL of the project lives in db/. Every state change is one
 * transaction that also appends a row to the events table. Statements are
 * prepared once at open.
 *
 * Opening refuses, without writing anything: a file that is not an SQLite
 * database or fails PRAGMA quick_check (corrupt), and a database whose
 * user_version is newer than this build knows.
 *
 * A database opened at an older version with dt_db_open_at refuses the
 * functions of later versions with DT_ENOTSUP: agents and checkpoints
 * need version 2, results, generations and ranks version 3, steps and
 * failure costs version 7.
 *
 * Every function that returns a code is DT_MUST_CHECK: a state change
 * whose failure is dropped is a lost transition, and a read that failed
 * leaves its output unset. Callers say what a failure means.
 *
 * Thread: a dt_db_t is used by one thread (the coordinator's loop).
 * Strings in returned rows are owned by the row; release with the matching
 * _clear function.
 */
#ifndef DT_DB_H
#define DT_DB_H

#include <stdbool.h>
#include <stdint.h>

#include "common/err.h"
#include "common/macros.h"
#include "spec/state.h"

#define DT_DB_VERSION 7 /* the schema version this build writes */

typedef struct dt_db dt_db_t;

/* Open or create PATH and migrate it to DT_DB_VERSION (each migration in
 * its own transaction). DT_EFORMAT for corrupt or not-a-database,
 * DT_ENOTSUP for a newer schema, DT_EIO / DT_EACCES for file errors. */
DT_MUST_CHECK int dt_db_open(const char *path, dt_db_t **out, dt_emsg_t *em);
/* Open and migrate only up to `version` (tests build old schemas). */
DT_MUST_CHECK int dt_db_open_at(const char *path, int version, dt_db_t **out, dt_emsg_t *em);
void dt_db_close(dt_db_t *db);
int dt_db_version(dt_db_t *db);

/* Group several state changes into one transaction: between begin and
 * commit every call below joins it instead of committing on its own (a
 * refused transition's "refused" event is then rolled back with the rest).
 * commit returns an error and rolls back if any call inside failed. */
DT_MUST_CHECK int dt_db_begin(dt_db_t *db, dt_emsg_t *em);
DT_MUST_CHECK int dt_db_commit(dt_db_t *db, dt_emsg_t *em);
void dt_db_rollback(dt_db_t *db);

/* ---- jobs ---------------------------------------------------------------- */

/* Job states and their transitions: spec/state.h. */

typedef struct dt_job {
    int64_t id;
    char *name;
    uint32_t owner;   /* uid */
    enum dt_job_state state;
    char *spec;       /* the spec text as submitted (canonical form) */
    char *plan;       /* JSON, or NULL before planning */
    char *reason;     /* why the last transition happened, or NULL */
    int64_t slurm_id; /* 0 when none */
    int restarts;
    int64_t created_ms, updated_ms; /* unix epoch milliseconds */
} dt_job_t;

void dt_job_clear(dt_job_t *j);

/* A new job in state submitted, with its "submitted" event. */
DT_MUST_CHECK int dt_db_job_create(dt_db_t *db, const char *name, uint32_t owner, const char *spec,
                     int64_t *id, dt_emsg_t *em);
/* DT_ENOENT when there is no such job. */
DT_MUST_CHECK int dt_db_job_get(dt_db_t *db, int64_t id, dt_job_t *out, dt_emsg_t *em);
/* Jobs in id order; all jobs when owner is -1. The callback returns 0 to
 * go on, anything else stops the walk and is returned. */
DT_MUST_CHECK int dt_db_job_list(dt_db_t *db, int64_t owner, int (*cb)(const dt_job_t *j, void *arg),
                   void *arg, dt_emsg_t *em);
/* Move a job to `to` in one transaction with an event (kind defaults to the
 * new state's name when NULL; detail becomes the job's reason). An illegal
 * transition is refused with DT_EINVAL ("job 3: illegal transition running
 * -> submitted"), logged as an event of kind "refused", and changes nothing
 * else. DT_ENOENT for no such job. */
DT_MUST_CHECK int dt_db_job_transition(dt_db_t *db, int64_t id, enum dt_job_state to, const char *kind,
                         const char *detail, dt_emsg_t *em);
/* A generation started while recovering failed too: the job stays
 * recovering, its restart count goes up by one, with a "recovering" event
 * (DETAIL says why). DT_EINVAL when the job is not recovering. */
DT_MUST_CHECK int dt_db_job_restart_again(dt_db_t *db, int64_t id, const char *detail, dt_emsg_t *em);
/* Store the plan and move submitted -> planned in one transaction. */
DT_MUST_CHECK int dt_db_job_plan(dt_db_t *db, int64_t id, const char *plan_json, dt_emsg_t *em);
/* Store (or replace) the result of a finished job, a JSON object such as
 * {"steps":300,"loss":0.12,"checksum":"<hex>"}, with an event
 * "result_stored" whose detail is the JSON; the job's state is not changed.
 * DT_EINVAL when result_json is not a JSON object, DT_ENOENT for no such
 * job. */
DT_MUST_CHECK int dt_db_job_set_result(dt_db_t *db, int64_t id, const char *result_json, dt_emsg_t *em);
/* The job's result: *out is the caller's to free, NULL when none has been
 * stored. DT_ENOENT for no such job (*out NULL). */
DT_MUST_CHECK int dt_db_job_result(dt_db_t *db, int64_t id, char **out, dt_emsg_t *em);

/* ---- events ------------------------------------------------------------- */

typedef struct dt_event {
    int64_t id, job, at_ms;
    char *kind;   /* "submitted", "planned", "agent_registered", ... */
    char *state;  /* the job's state after the event */
    char *detail; /* free text or JSON, may be NULL */
} dt_event_t;

void dt_event_clear(dt_event_t *e);
/* Append an event that changes no state. */
DT_MUST_CHECK int dt_db_event_add(dt_db_t *db, int64_t job, const char *kind, const char *detail,
                    dt_emsg_t *em);
/* Events of a job with id > since, in order. */
DT_MUST_CHECK int dt_db_events(dt_db_t *db, int64_t job, int64_t since,
                 int (*cb)(const dt_event_t *e, void *arg), void *arg, dt_emsg_t *em);

/* ---- agents ------------------------------------------------------------- */

typedef struct dt_agent {
    int64_t id, job;
    char *node;
    int slots;
    char *state; /* "registered", "lost", "gone" */
    int64_t registered_ms, last_seen_ms;
} dt_agent_t;

void dt_agent_clear(dt_agent_t *a);
/* Register (or re-register: same job and node keeps its id) an agent, with
 * an "agent_registered" event. */
DT_MUST_CHECK int dt_db_agent_register(dt_db_t *db, int64_t job, const char *node, int slots,
                         int64_t *agent, dt_emsg_t *em);
/* Set an agent's state and last-seen time, with an event "agent_<state>". */
DT_MUST_CHECK int dt_db_agent_set_state(dt_db_t *db, int64_t agent, const char *state, int64_t seen_ms,
                          dt_emsg_t *em);
DT_MUST_CHECK int dt_db_agent_get(dt_db_t *db, int64_t agent, dt_agent_t *out, dt_emsg_t *em);
DT_MUST_CHECK int dt_db_agents(dt_db_t *db, int64_t job, int (*cb)(const dt_agent_t *a, void *arg),
                 void *arg, dt_emsg_t *em);

/* ---- checkpoints -------------------------------------------------------- */

typedef struct dt_checkpoint {
    int64_t id, job, step;
    char *state; /* "partial", "committed", "corrupt", "deleted" */
    int shards;  /* shards recorded */
    int64_t bytes;
    int64_t created_ms, committed_ms;
    int64_t corrupt_ms; /* when last found corrupt, kept when the step is written
                         * again; 0: never (or before schema version 6) */
} dt_checkpoint_t;

void dt_checkpoint_clear(dt_checkpoint_t *c);
/* Record one rank's shard of the checkpoint at `step` (created partial on
 * the first shard). A second report of the same rank replaces the first. */
DT_MUST_CHECK int dt_db_shard_add(dt_db_t *db, int64_t job, int64_t step, int rank, const char *path,
                    int64_t bytes, const char *sha256, dt_emsg_t *em);
/* Mark a checkpoint committed (or corrupt, deleted), with an event. */
DT_MUST_CHECK int dt_db_checkpoint_set_state(dt_db_t *db, int64_t job, int64_t step, const char *state,
                               dt_emsg_t *em);
/* Record what the step's manifest lists: SHAS is a JSON array of one
 * sha256 per rank (checked by the caller), as the job's agent read it.
 * The checkpoint is created partial if it is new (or begun again if it was
 * corrupt or deleted); a committed one is refused (DT_EINVAL). Version 5. */
DT_MUST_CHECK int dt_db_checkpoint_set_manifest(dt_db_t *db, int64_t job, int64_t step, const char *shas,
                                  dt_emsg_t *em);
/* The manifest recorded for the checkpoint at STEP: *shas is the caller's
 * (NULL when none was reported yet); DT_ENOENT for no such checkpoint. */
DT_MUST_CHECK int dt_db_checkpoint_manifest(dt_db_t *db, int64_t job, int64_t step, char **shas,
                              dt_emsg_t *em);
DT_MUST_CHECK int dt_db_checkpoints(dt_db_t *db, int64_t job,
                      int (*cb)(const dt_checkpoint_t *c, void *arg), void *arg,
                      dt_emsg_t *em);

typedef struct dt_shard {
    int rank;
    char *path;
    int64_t bytes;
    char *sha256; /* 64 lowercase hex digits */
} dt_shard_t;

void dt_shard_clear(dt_shard_t *s);
/* The shards recorded for the job's checkpoint at `step`, whatever its
 * state, in rank order (list semantics as dt_db_checkpoints). DT_ENOENT
 * when there is no such job or no checkpoint at that step. */
DT_MUST_CHECK int dt_db_shards(dt_db_t *db, int64_t job, int64_t step,
                 int (*cb)(const dt_shard_t *s, void *arg), void *arg, dt_emsg_t *em);

/* ---- generations and ranks ---------------------------------------------- */

/* A generation is one start of a job's R workers (ranks 0 .. R-1); gen 1
 * is the first start, each recovery starts the next. */
typedef struct dt_gen {
    int64_t job;
    int gen;   /* 1, 2, ...; 0 in dt_db_gen_last's answer when there is none */
    int ranks; /* R */
    int64_t started_ms, ended_ms; /* ended_ms 0 while running */
    int64_t resume_step;          /* checkpoint step it started from; 0 = from scratch */
    char *reason;                 /* why it ended, NULL while running */
} dt_gen_t;

void dt_gen_clear(dt_gen_t *g);
/* Start generation `gen` of the job on `ranks` ranks, in one transaction:
 * one generations row, one ranks row per rank (rank r on agent agent_of[r],
 * state "starting", step = resume_step, pid 0) and an event
 * "generation_started" with detail "gen=G ranks=R resume_step=S".
 * DT_EINVAL, writing nothing, when: gen is not 1 + the newest generation
 * (1 when there is none); the newest has not ended; ranks < 1 or
 * resume_step < 0; an agent_of[r] is an agent of another job. DT_ENOENT
 * for no such job or no such agent. agent_of has `ranks` entries. */
DT_MUST_CHECK int dt_db_gen_begin(dt_db_t *db, int64_t job, int gen, int ranks, const int64_t *agent_of,
                    int64_t resume_step, dt_emsg_t *em);
/* End a running generation (ended_ms now, reason) with an event
 * "generation_ended" detail "gen=G: REASON". DT_ENOENT when there is no
 * such job or generation, DT_EINVAL when it has already ended. The ranks'
 * rows are left as their agents last reported them. */
DT_MUST_CHECK int dt_db_gen_end(dt_db_t *db, int64_t job, int gen, const char *reason, dt_emsg_t *em);
/* The newest generation of the job into *out (release with dt_gen_clear);
 * out->gen == 0 when the job has none. DT_ENOENT for no such job. */
DT_MUST_CHECK int dt_db_gen_last(dt_db_t *db, int64_t job, dt_gen_t *out, dt_emsg_t *em);

/* The job's generations, oldest first (list semantics as
 * dt_db_checkpoints; ended_ms 0 and reason NULL for one still running).
 * DT_ENOENT for no such job. */
DT_MUST_CHECK int dt_db_gens(dt_db_t *db, int64_t job, int (*cb)(const dt_gen_t *g, void *arg),
                             void *arg, dt_emsg_t *em);

typedef struct dt_rank {
    int rank;
    int64_t agent; /* the agent hosting it */
    char *state;   /* starting, running, exited, failed, hung, killed or lost */
    int64_t step;  /* the last step it reached */
    int64_t pid;   /* its worker's pid on the agent's node, 0 until known */
} dt_rank_t;

void dt_rank_clear(dt_rank_t *r);
/* The ranks of a generation in rank order (list semantics as
 * dt_db_checkpoints). DT_ENOENT for no such job or generation. */
DT_MUST_CHECK int dt_db_gen_ranks(dt_db_t *db, int64_t job, int gen,
                    int (*cb)(const dt_rank_t *r, void *arg), void *arg, dt_emsg_t *em);
/* Set one rank's state, step and pid, with no event (progress is
 * frequent). DT_EINVAL for a state other than those of dt_rank_t or a
 * negative step or pid; DT_ENOENT for no such job, generation or rank. */
DT_MUST_CHECK int dt_db_rank_set(dt_db_t *db, int64_t job, int gen, int rank, const char *state, int64_t step,
                   int64_t pid, dt_emsg_t *em);

/* ---- steps, failure costs and goodput (schema version 7) ---------------- */

/* A job keeps at most this many step rows; past it they are thinned to
 * every second kept step (the generations keep the exact sums). */
#define DT_DB_STEP_ROWS 8192

/* One finished step of a generation, as rank 0's agent reported it. */
typedef struct dt_step_row {
    int64_t job;
    int gen;
    int64_t step;     /* steps done: 1, 2, ... (a resumed generation starts past its resume step) */
    int64_t at_ms;    /* when it was reported, ms since the epoch */
    double step_ms;   /* the step's own time */
    double work_ms;   /* the generation's steps' own time up to this one (read; ignored on add) */
    double loss;      /* NaN when not known */
    double tokens_s;  /* NaN when not known */
} dt_step_row_t;

/* Record that s->gen finished s->step, in one transaction with no event:
 * its row (unless thinned), and the generation's sums (newest step, its
 * first step's start and its newest step's report, its steps' time plus
 * step_ms, its checkpoint stall plus stall_ms). DT_EINVAL, writing nothing,
 * for a step not above the generation's newest, a negative or non-finite
 * time, or a generation that has ended; DT_ENOENT for none. */
DT_MUST_CHECK int dt_db_step_add(dt_db_t *db, const dt_step_row_t *s, double stall_ms,
                                 dt_emsg_t *em);
/* The job's step rows, by generation then step (list semantics as
 * dt_db_checkpoints). */
DT_MUST_CHECK int dt_db_steps(dt_db_t *db, int64_t job,
                              int (*cb)(const dt_step_row_t *s, void *arg), void *arg,
                              dt_emsg_t *em);

/* What one failure cost: the failure ended generation `gen`; generation
 * `next` (> gen) is the one started after it, which either finished a
 * step (until_ms 0) or failed itself first, at until_ms. Times in
 * seconds, each >= 0 (a clock that ran backwards counts 0). */
typedef struct dt_fail_cost {
    int gen, next;
    const char *what;       /* the fault, one word of [a-z_] ("worker", "agent", ...) */
    int64_t fault_ms;       /* when it happened (for a lost agent: when it was last heard) */
    int64_t decided_ms;     /* when the coordinator decided to recover */
    int64_t until_ms;       /* 0, or when next failed before its first step */
    /* filled in by dt_db_failure_cost: */
    double detect_s;        /* fault -> decision */
    double restart_s;       /* decision -> next generation started */
    double load_s;          /* its start -> its first step's start (spawn, rendezvous,
                             * state), or -> until_ms */
    int64_t resume_step;    /* where next resumed */
    int64_t recomputed_steps; /* steps done before the failure and done again */
    double recomputed_s;    /* their step time */
} dt_fail_cost_t;

/* Compute what the failure cost from the generations' rows (next must
 * have finished its first step, unless until_ms is given), and store it: gen's cost and one event
 * "failure_cost" whose detail is the same JSON object
 * ({"gen":G,"next":N,"fault":"worker","detect_s":..,"restart_s":..,
 * "load_s":..,"resume_step":S,"recomputed_steps":K,"recomputed_s":..}),
 * in one transaction. DT_EINVAL when next has no first step yet (and no
 * until_ms) or what is not a word; DT_ENOENT for no such job or generation. */
DT_MUST_CHECK int dt_db_failure_cost(dt_db_t *db, int64_t job, dt_fail_cost_t *c, dt_emsg_t *em);

/* The costs recorded, oldest generation first: each the JSON object of its
 * failure_cost event (list semantics as dt_db_checkpoints). */
DT_MUST_CHECK int dt_db_failure_costs(dt_db_t *db, int64_t job,
                                      int (*cb)(int gen, const char *cost, void *arg), void *arg,
                                      dt_emsg_t *em);

/* A job's goodput, over all its generations. */
typedef struct dt_goodput {
    int64_t first_ms;     /* the first step's start; 0 before any */
    int64_t end_ms;       /* the newest step's report when the job has ended, else now_ms */
    double wall_s;        /* end_ms - first_ms */
    double step_s;        /* every step's own time, recomputed ones too */
    double productive_s;  /* the own time of the steps kept (those a resume did not redo) */
    double recomputed_s;  /* step_s - productive_s */
    double stall_s;       /* time stood still writing checkpoints */
    int failures;         /* failures with a cost recorded */
    double detect_s, restart_s, load_s; /* summed over them */
    double ettr;          /* productive_s / wall_s; NaN before the first step */
} dt_goodput_t;

/* Sum the job's goodput as of now_ms (ms since the epoch). A job with no
 * steps yet has first_ms 0 and ettr NaN. DT_ENOENT for no such job. */
DT_MUST_CHECK int dt_db_goodput(dt_db_t *db, int64_t job, int64_t now_ms, dt_goodput_t *out,
                                dt_emsg_t *em);

/* ---- Slurm jobs (schema version 4) -------------------------------------- */

/* One batch job submitted for a dt job, with what slurmctld last said. */
typedef struct dt_slurm_job {
    int64_t slurm_id, job;
    char *state;   /* PENDING, RUNNING, ...; SUBMITTED before the first query */
    char *reason;  /* "" when none */
    char *nodes;   /* allocated nodes, a Slurm host list; "" when none */
    char *exclude; /* nodes it may not use; "" when none */
    char *output;  /* its output file */
    int restarts;  /* Slurm's restart count */
    int exit_code; /* the batch script's status, -1 unknown */
    int64_t submitted_ms, updated_ms;
} dt_slurm_job_t;

void dt_slurm_job_clear(dt_slurm_job_t *s);
/* Record a submitted batch job in one transaction: its row (state
 * SUBMITTED, exclude and output as given), jobs.slurm_id, and an event
 * "slurm_submitted" with detail "slurm job N: DETAIL". DT_EEXIST when that
 * Slurm id is already recorded, DT_ENOENT for no such job; DT_ENOTSUP
 * below version 4, as every call of this section. */
DT_MUST_CHECK int dt_db_slurm_submitted(dt_db_t *db, int64_t job, int64_t slurm_id, const char *output,
                          const char *exclude, const char *detail, dt_emsg_t *em);
/* The job's current Slurm job (jobs.slurm_id). DT_ENOENT when the job has
 * none (or no such job). */
DT_MUST_CHECK int dt_db_slurm_get(dt_db_t *db, int64_t job, dt_slurm_job_t *out, dt_emsg_t *em);
/* Store what slurmctld said about s->slurm_id (state, reason, nodes,
 * exclude, restarts, exit_code). When the state, reason, nodes or
 * restart count changed, one event "slurm_state" on its dt job, detail
 * "slurm job N: STATE (REASON) on NODES [restart K]", and *changed = 1;
 * otherwise no event and *changed = 0. DT_ENOENT for an unknown Slurm id. */
DT_MUST_CHECK int dt_db_slurm_update(dt_db_t *db, const dt_slurm_job_t *s, int *changed, dt_emsg_t *em);
/* A requeue of the job's Slurm job: the job moves to queued (from
 * starting, running or recovering; already queued is allowed and only
 * counted) with an event of `kind` (default "requeued") and `detail`,
 * requeues + 1, and restarts + 1 when `failure` (a planned requeue after
 * a checkpoint costs no restart). DT_EINVAL from any other state, with a
 * "refused" event as for transitions. */
DT_MUST_CHECK int dt_db_job_requeue(dt_db_t *db, int64_t job, bool failure, const char *kind,
                      const char *detail, dt_emsg_t *em);
/* `dtctl resume`: a failed or cancelled job moves to queued with an event
 * "resumed" (detail), restart_base = restarts and slurm_id = 0 (the next
 * submission is a new Slurm job). DT_EINVAL from another state. */
DT_MUST_CHECK int dt_db_job_resume(dt_db_t *db, int64_t job, const char *detail, dt_emsg_t *em);
/* The job's requeue count and restart base (0 and 0 below version 4). */
DT_MUST_CHECK int dt_db_job_counts(dt_db_t *db, int64_t job, int *requeues, int *restart_base, dt_emsg_t *em);

#endif /* DT_DB_H */
