"""Where suspended runs' snapshots live (SPEC §10.7 items 1-2).

A snapshot is the compressed VM memory of one suspended run, keyed by run id.
The default store keeps them in service memory only: nothing is written to
disk and a restart loses them (SPEC §3.6 item 3). Another store (a disk or an
object store shared by replicas) implements the same four methods.
"""

from __future__ import annotations

import abc
import threading


class SnapshotStore(abc.ABC):
    """Stores one snapshot per run id. Implementations must be thread-safe."""

    @abc.abstractmethod
    def put(self, run_id: str, data: bytes) -> None:
        """Stores ``data`` (compressed VM memory, bytes) for ``run_id``, replacing any earlier one."""

    @abc.abstractmethod
    def get(self, run_id: str) -> bytes | None:
        """Returns the run's snapshot, or ``None`` when there is none."""

    @abc.abstractmethod
    def delete(self, run_id: str) -> None:
        """Removes the run's snapshot. Idempotent."""

    @abc.abstractmethod
    def total_bytes(self) -> int:
        """Bytes held by all stored snapshots."""


class InMemorySnapshotStore(SnapshotStore):
    """The default store: a dict in service memory."""

    def __init__(self) -> None:
        self._data: dict[str, bytes] = {}
        self._lock = threading.Lock()

    def put(self, run_id: str, data: bytes) -> None:
        with self._lock:
            self._data[run_id] = data

    def get(self, run_id: str) -> bytes | None:
        with self._lock:
            return self._data.get(run_id)

    def delete(self, run_id: str) -> None:
        with self._lock:
            self._data.pop(run_id, None)

    def total_bytes(self) -> int:
        with self._lock:
            return sum(len(v) for v in self._data.values())
