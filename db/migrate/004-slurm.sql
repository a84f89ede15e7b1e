-- SPDX-License-Identifier: MIT
--
-- Schema version 4: the Slurm side of a job. Each batch job dt submits
-- for a job is one row of slurm_jobs, kept after the job ends (a resumed
-- job gets a new Slurm job; jobs.slurm_id names the current one), with
-- what slurmctld last said about it. Run by db/db.c in one transaction
-- with PRAGMA user_version = 4, after version 3. Forward only: version 3
-- rows are kept as they were (their jobs never had a Slurm job).
-- Not here: what dt does about a Slurm state (coordinator/alloc.c).

CREATE TABLE slurm_jobs (
    slurm_id     INTEGER PRIMARY KEY CHECK (slurm_id > 0),
    job_id       INTEGER NOT NULL REFERENCES jobs (id),
    -- Slurm's state name (PENDING, RUNNING, COMPLETED, TIMEOUT, ...), or
    -- SUBMITTED until slurmctld has first been asked
    state        TEXT NOT NULL DEFAULT 'SUBMITTED',
    reason       TEXT NOT NULL DEFAULT '',   -- pending or end reason
    nodes        TEXT NOT NULL DEFAULT '',   -- allocated nodes, a host list
    exclude      TEXT NOT NULL DEFAULT '',   -- nodes the job may not use
    restarts     INTEGER NOT NULL DEFAULT 0 CHECK (restarts >= 0), -- Slurm's restart_cnt
    exit_code    INTEGER NOT NULL DEFAULT -1, -- the batch script's, -1 unknown
    output       TEXT NOT NULL DEFAULT '',   -- the batch job's output file
    submitted_ms INTEGER NOT NULL,
    updated_ms   INTEGER NOT NULL
);
CREATE INDEX slurm_jobs_by_job ON slurm_jobs (job_id, slurm_id);

-- Requeues of the job's Slurm jobs, whoever asked for them (dt after a
-- lost node or a time-limit checkpoint, or Slurm itself).
ALTER TABLE jobs ADD COLUMN requeues INTEGER NOT NULL DEFAULT 0 CHECK (requeues >= 0);

-- restarts at the last `dtctl resume`: the restart budget (max_restarts)
-- counts the restarts since then.
ALTER TABLE jobs ADD COLUMN restart_base INTEGER NOT NULL DEFAULT 0
    CHECK (restart_base >= 0);
