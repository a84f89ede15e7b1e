-- SPDX-License-Identifier: MIT
--
-- Schema version 5: what a checkpoint's manifest says, as the job's agent
-- read it. The coordinator no longer opens a job's files (they belong to
-- the job's owner, and the coordinator may run as root): the agent that
-- verified the step's manifest.json sends the sha256 it lists for each
-- rank's shard, and the coordinator commits the step when every rank's
-- read-back shard agrees with it. Run by db/db.c in one transaction with
-- PRAGMA user_version = 5, after version 4. Forward only: version 4 rows
-- are kept (their manifests are NULL: such a partial checkpoint is never
-- committed, an older committed one stays committed).

-- A JSON array with one string per rank, the sha256 (64 lowercase hex
-- digits) of that rank's shard according to the manifest; NULL until the
-- manifest is reported.
ALTER TABLE checkpoints ADD COLUMN manifest TEXT;
