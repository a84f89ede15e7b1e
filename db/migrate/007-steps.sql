-- SPDX-License-Identifier: MIT
--
-- Schema version 7: a job's step history and what its failures cost, for
-- its goodput (ETTR: productive step time over wall time), the
-- failure_cost events, the metrics and `dtctl plot`. Run by db/db.c in
-- one transaction with PRAGMA user_version = 7, after version 6. Forward
-- only: generations written before version 7 have no steps and count as
-- no productive time (their jobs show no ETTR).
-- Not here: how a step's own time and a checkpoint's stall are measured
-- (coordinator/goodput.c), or how ETTR is summed over the generations
-- (db.c, dt_db_goodput).

-- One row per step a generation finished, as rank 0's agent reported it.
-- Bounded: a job keeps at most DT_DB_STEP_ROWS rows; past that its rows
-- are thinned to steps that are multiples of jobs.step_stride (doubled
-- each time), and the generations row keeps the exact sums.
CREATE TABLE steps (
    job_id   INTEGER NOT NULL,
    gen      INTEGER NOT NULL,
    step     INTEGER NOT NULL CHECK (step >= 1), -- steps done when reported
    at_ms    INTEGER NOT NULL,                   -- when it was reported (ms since the epoch)
    step_ms  REAL NOT NULL CHECK (step_ms >= 0), -- the step's own time
    work_ms  REAL NOT NULL CHECK (work_ms >= 0), -- the generation's steps' time up to this one
    loss     REAL,                               -- NULL when not known (attn, prefill)
    tokens_s REAL,                               -- NULL when not known
    PRIMARY KEY (job_id, gen, step),
    FOREIGN KEY (job_id, gen) REFERENCES generations(job_id, gen)
);

-- Rows are kept at steps that are multiples of this (1, 2, 4, ...).
ALTER TABLE jobs ADD COLUMN step_stride INTEGER NOT NULL DEFAULT 1 CHECK (step_stride >= 1);

-- A generation's sums: its newest step, when its first and newest steps
-- were reported (NULL before the first), its steps' own time and the
-- time it stood still writing checkpoints (ms).
ALTER TABLE generations ADD COLUMN last_step INTEGER NOT NULL DEFAULT 0 CHECK (last_step >= 0);
ALTER TABLE generations ADD COLUMN first_step_ms INTEGER;
ALTER TABLE generations ADD COLUMN last_step_ms INTEGER;
ALTER TABLE generations ADD COLUMN work_ms REAL NOT NULL DEFAULT 0 CHECK (work_ms >= 0);
ALTER TABLE generations ADD COLUMN stall_ms REAL NOT NULL DEFAULT 0 CHECK (stall_ms >= 0);

-- What the failure that ended a generation cost, once the next one has
-- finished its first step (NULL until then, and for a generation that did
-- not fail): the time from the failure to the decision, from the decision
-- to the next generation's start, from its start to its first step's
-- start (spawn, rendezvous, loading the state), and the steps and step
-- time done again. JSON: the failure_cost event's detail.
ALTER TABLE generations ADD COLUMN cost TEXT;
