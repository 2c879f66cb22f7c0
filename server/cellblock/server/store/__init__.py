"""The run store: suspended runs, their snapshots, slots, leases and expiry (SPEC §10.7, §16.1).

Backends: :class:`SqliteRunStore` (embedded default), :class:`PostgresRunStore`
(fleets) and :class:`MemoryRunStore` (only when named). :func:`make_run_store`
builds the one ``CELLBLOCK_STORE`` names.
"""

from cellblock.server.store._base import (
    DEFAULT_LEASE_SECONDS,
    Claim,
    ClaimStatus,
    Park,
    RecordState,
    RenewStatus,
    RunRecord,
    RunStore,
    SlotAnswer,
    SnapshotPlacement,
    StoreTimeoutError,
    StoreUnavailableError,
    snapshot_digest,
)
from cellblock.server.store._memory import MemoryRunStore
from cellblock.server.store._open import default_state_dir, default_store_url, describe_store, make_run_store
from cellblock.server.store._postgres import PostgresRunStore
from cellblock.server.store._sqlite import SqliteRunStore

__all__ = [
    "DEFAULT_LEASE_SECONDS",
    "Claim",
    "ClaimStatus",
    "MemoryRunStore",
    "Park",
    "PostgresRunStore",
    "RecordState",
    "RenewStatus",
    "RunRecord",
    "RunStore",
    "SlotAnswer",
    "SnapshotPlacement",
    "SqliteRunStore",
    "StoreTimeoutError",
    "StoreUnavailableError",
    "default_state_dir",
    "default_store_url",
    "describe_store",
    "make_run_store",
    "snapshot_digest",
]
