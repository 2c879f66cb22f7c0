-- Snapshots in their own table, one row per run whose record names one (snapshot_size > 0),
-- written by a park and deleted with the record (or its cancellation). A claim, a release and a
-- lease renewal rewrite the run's row only: with the snapshot inline, every claim rewrote the
-- snapshot's bytes too (SQLite rewrites a whole row, overflow pages included).
CREATE TABLE cellblock_snapshots (
    run_id TEXT PRIMARY KEY,
    snapshot BLOB NOT NULL
);
INSERT INTO cellblock_snapshots (run_id, snapshot) SELECT run_id, snapshot FROM cellblock_runs WHERE snapshot IS NOT NULL;
ALTER TABLE cellblock_runs DROP COLUMN snapshot
