-- SPDX-License-Identifier: MIT
--
-- Schema version 3: what the coordinator needs to run a job's generations
-- of workers and to keep what the job produced: the job's result, the
-- checkpoint step each generation started from, and each rank's process
-- id. Run by db/db.c in one transaction with PRAGMA user_version = 3,
-- after version 2. Forward only, like every migration: columns are added
-- with defaults, so every row of a version 2 database is kept as it was.
-- Not here: the rules for starting and ending generations or the names of
-- rank states (db.c), or what a result means (coordinator/).

-- The result of a finished job as JSON, one object, e.g.
-- {"steps":300,"loss":0.12,"checksum":"<hex>"}: what `dtctl` shows once
-- the job has completed. NULL until the job reports one; a job that
-- failed or was cancelled may never have one.
ALTER TABLE jobs ADD COLUMN result TEXT;

-- The checkpoint step a generation resumed from, so a recovery can be
-- told from a fresh start and the ranks' steps read against it: 0 when it
-- started from scratch. Generations written at version 2 started from 0.
ALTER TABLE generations ADD COLUMN resume_step INTEGER NOT NULL DEFAULT 0
    CHECK (resume_step >= 0);

-- The process id of the rank's worker on its agent's node, as the agent
-- last reported it, for finding and signalling a hung worker: 0 until the
-- worker has been spawned (and for ranks written at version 2).
ALTER TABLE ranks ADD COLUMN pid INTEGER NOT NULL DEFAULT 0 CHECK (pid >= 0);
