"""Snapshot storage: the bytes of suspended runs, behind a small interface."""

from cellblock.server.snapshots._store import InMemorySnapshotStore, SnapshotStore

__all__ = ["InMemorySnapshotStore", "SnapshotStore"]
