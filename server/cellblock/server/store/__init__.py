"""Snapshot storage: the bytes of suspended runs, behind a small interface."""

from cellblock.server.store._snapshots import InMemorySnapshotStore, SnapshotStore

__all__ = ["InMemorySnapshotStore", "SnapshotStore"]
