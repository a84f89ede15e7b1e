-- SPDX-License-Identifier: MIT
--
-- Schema version 1: jobs and the events of their lives. db/db.c runs this
-- file in one transaction (BEGIN IMMEDIATE ... PRAGMA user_version = 1;
-- COMMIT), so it holds no BEGIN or COMMIT of its own. Migrations are
-- forward only: a released file is never edited; a change is a new file.
-- Times are unix epoch milliseconds. Not here: the transition rules
-- between states (db.c, dt_job_transition_ok) and any data.

-- One row per job. A job is never deleted (its events refer to it), so its
-- id, shown to users, is never reused. `state` is where the job is in its
-- life; `reason` is the detail of the transition that put it there;
-- `restarts` counts the generations aborted (see db.c); `slurm_id` is 0
-- until the job has a Slurm allocation.
CREATE TABLE jobs (
    id         INTEGER PRIMARY KEY,
    name       TEXT NOT NULL,
    owner_uid  INTEGER NOT NULL,            -- the submitter's uid
    state      TEXT NOT NULL CHECK (state IN ('submitted', 'planned', 'queued',
                   'starting', 'running', 'recovering', 'completed', 'failed',
                   'cancelled')),
    spec       TEXT NOT NULL,               -- the spec as submitted, canonical form
    plan       TEXT,                        -- the planner's output (JSON), NULL before planning
    reason     TEXT,
    slurm_id   INTEGER NOT NULL DEFAULT 0,
    restarts   INTEGER NOT NULL DEFAULT 0 CHECK (restarts >= 0),
    created_ms INTEGER NOT NULL,
    updated_ms INTEGER NOT NULL
);

-- The history of a job, appended in the same transaction as every state
-- change, and on its own for things that change no state (a worker's exit).
-- AUTOINCREMENT keeps ids strictly increasing and never reused, so a reader
-- can page with "id > since" and miss nothing. `state` is the job's state
-- after the event; `kind` says what happened ("submitted", "planned",
-- "refused", "agent_registered", "checkpoint_committed", ...).
CREATE TABLE events (
    id     INTEGER PRIMARY KEY AUTOINCREMENT,
    job_id INTEGER NOT NULL REFERENCES jobs(id),
    at_ms  INTEGER NOT NULL,
    kind   TEXT NOT NULL,
    state  TEXT NOT NULL,
    detail TEXT                             -- free text or JSON, may be NULL
);

-- A job's events in order, for "events of job J since id S".
CREATE INDEX events_job_id ON events(job_id, id);
