-- The run store (SPEC §16.1): one row per run that holds a slot, is suspended, or is a
-- cancelled run's tombstone. Times are epoch seconds of the store's clock.
CREATE TABLE cellblock_runs (
    run_id TEXT PRIMARY KEY,
    session_id TEXT NOT NULL,
    agent_run_id TEXT NOT NULL,
    state TEXT NOT NULL CHECK (state IN ('active', 'suspended', 'cancelled')),
    created_at DOUBLE PRECISION NOT NULL,
    expires_at DOUBLE PRECISION NOT NULL,
    holds_slot INTEGER NOT NULL CHECK (holds_slot IN (0, 1)),
    generation INTEGER NOT NULL,
    body BLOB NOT NULL,
    snapshot BLOB,
    snapshot_size INTEGER NOT NULL,
    snapshot_sha256 TEXT NOT NULL,
    -- 'inline': the bytes are in `snapshot` (the seam for object storage later).
    snapshot_placement TEXT NOT NULL,
    engine_build_id TEXT NOT NULL,
    lease_token TEXT,
    lease_until DOUBLE PRECISION NOT NULL,
    updated_at DOUBLE PRECISION NOT NULL
);
CREATE INDEX cellblock_runs_scope ON cellblock_runs (session_id, agent_run_id, created_at);
CREATE INDEX cellblock_runs_expiry ON cellblock_runs (state, expires_at);
CREATE INDEX cellblock_runs_slots ON cellblock_runs (holds_slot);
