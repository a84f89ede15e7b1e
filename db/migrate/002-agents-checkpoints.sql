-- SPDX-License-Identifier: MIT
--
-- Schema version 2: the agents that run a job, the generations of its
-- workers, and its checkpoints with one shard per rank. Run by db/db.c in
-- one transaction with PRAGMA user_version = 2, after version 1. Forward
-- only, like every migration. Not here: what the coordinator does with
-- these rows (coordinator/), or the files the shards name.

-- One dtagentd per node per job. An agent that registers again (after a
-- restart of its own or of the coordinator) for the same job and node
-- keeps its row and id. `state` is registered, lost (silent past the
-- timeout) or gone (left for good); db.c checks the names. `slots` is the
-- number of workers (GPUs or CPU ranks) it can run.
CREATE TABLE agents (
    id            INTEGER PRIMARY KEY,
    job_id        INTEGER NOT NULL REFERENCES jobs(id),
    node          TEXT NOT NULL,
    slots         INTEGER NOT NULL CHECK (slots >= 0),
    state         TEXT NOT NULL,
    registered_ms INTEGER NOT NULL,         -- the latest registration
    last_seen_ms  INTEGER NOT NULL,
    UNIQUE (job_id, node)
);

-- A generation is one start of a job's workers, all ranks sharing one PMIx
-- namespace: 1 for the first start, one more after each recovery. It ends
-- (ended_ms, reason) when the job completes or the generation is aborted.
-- `ranks` is R, the number of ranks it ran with (a recovery may re-plan on
-- fewer).
CREATE TABLE generations (
    job_id     INTEGER NOT NULL REFERENCES jobs(id),
    gen        INTEGER NOT NULL CHECK (gen >= 1),
    started_ms INTEGER NOT NULL,
    ended_ms   INTEGER,                     -- NULL while it runs
    ranks      INTEGER NOT NULL CHECK (ranks >= 1),
    reason     TEXT,                        -- why it ended, NULL while it runs
    PRIMARY KEY (job_id, gen)
);

-- Where each rank of a generation runs (agent_id, NULL until placed), its
-- state as its agent last reported it, and the last step it reached.
CREATE TABLE ranks (
    job_id   INTEGER NOT NULL,
    gen      INTEGER NOT NULL,
    rank     INTEGER NOT NULL CHECK (rank >= 0),
    agent_id INTEGER REFERENCES agents(id),
    state    TEXT NOT NULL,
    step     INTEGER NOT NULL DEFAULT 0,
    PRIMARY KEY (job_id, gen, rank),
    FOREIGN KEY (job_id, gen) REFERENCES generations(job_id, gen)
);

-- One checkpoint of a job per step. It is created partial when the first
-- shard is reported, becomes committed when the coordinator has every
-- shard verified and has written the commit marker, corrupt when a shard
-- fails to verify, deleted when its files are removed. committed_ms is
-- NULL until committed. Resume takes the newest committed one.
CREATE TABLE checkpoints (
    id           INTEGER PRIMARY KEY,
    job_id       INTEGER NOT NULL REFERENCES jobs(id),
    step         INTEGER NOT NULL CHECK (step >= 0),
    state        TEXT NOT NULL CHECK (state IN ('partial', 'committed', 'corrupt',
                     'deleted')),
    created_ms   INTEGER NOT NULL,
    committed_ms INTEGER,
    UNIQUE (job_id, step)
);

-- One rank's file of a checkpoint (a safetensors file), with its size and
-- the sha256 the engine computed while writing it (64 lowercase hex
-- digits), which is what verification compares against.
CREATE TABLE shards (
    checkpoint_id INTEGER NOT NULL REFERENCES checkpoints(id),
    rank          INTEGER NOT NULL CHECK (rank >= 0),
    path          TEXT NOT NULL,
    bytes         INTEGER NOT NULL CHECK (bytes >= 0),
    sha256        TEXT NOT NULL,
    PRIMARY KEY (checkpoint_id, rank)
);
