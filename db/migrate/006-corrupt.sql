-- SPDX-License-Identifier: MIT
--
-- Schema version 6: when a checkpoint was last found corrupt. A corrupt
-- step is set aside and written again when training passes it: its row
-- becomes partial, committed and in time deleted like any other, and
-- corrupt_ms keeps what was found (dtctl checkpoints' CORRUPT column).
-- Run by db/db.c in one transaction with PRAGMA user_version = 6, after
-- version 5. Forward only: version 5 rows get NULL (never found corrupt,
-- as far as this column knows; the checkpoint_corrupt events say more).

-- When the checkpoint was last marked corrupt (ms since the epoch); NULL
-- while it never was.
ALTER TABLE checkpoints ADD COLUMN corrupt_ms INTEGER;
