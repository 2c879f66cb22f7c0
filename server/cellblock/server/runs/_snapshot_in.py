"""The snapshot a cell sends when the host parks its leg, bounded by ``maxSnapshotBytes`` (SPEC §10.4).

The host holds at most ``maxSnapshotBytes`` of a cell's snapshot: bytes beyond it are counted
(for [R14]) and dropped, never kept, and chunks the host never asked for (no ``suspend``
sent) are an invalid cell response. A cell's agent can otherwise stream snapshot chunks
without end and grow the shared service's memory until the leg's deadline.
"""

from __future__ import annotations


class SnapshotIn:
    """Collects one leg's incoming snapshot chunks.

    Args:
        limit: The run's ``maxSnapshotBytes``; bytes past it are counted, not kept.
    """

    def __init__(self, limit: int) -> None:
        self._limit = limit
        self._parts: list[bytes] = []
        #: Every byte received, kept or not.
        self.received = 0

    def add(self, data: bytes) -> None:
        """Keeps ``data`` while the snapshot is within the limit; past it, only counts it."""
        self.received += len(data)
        if self.received <= self._limit:
            self._parts.append(data)
        else:
            self._parts.clear()

    @property
    def over_limit(self) -> bool:
        """True once more than the limit arrived (the bytes were dropped)."""
        return self.received > self._limit

    def data(self) -> bytes:
        """The snapshot received (only meaningful while not over the limit)."""
        return b"".join(self._parts)
