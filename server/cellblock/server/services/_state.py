"""State shared by the services of one instance."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from cellblock.server.config import CodeModeConfig


class Admission:
    """Bounds the legs running at once; refused legs get RESOURCE_EXHAUSTED.

    Args:
        limit: Most concurrent legs (each holds one cell while it runs).
    """

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self.running = 0

    def try_acquire(self) -> bool:
        """Takes a leg slot if one is free."""
        if self.running >= self.limit:
            return False
        self.running += 1
        return True

    def release(self) -> None:
        """Returns a leg slot."""
        self.running = max(0, self.running - 1)


@dataclass
class ServiceState:
    """Catalogs by scope, admission control and the active legs.

    Attributes:
        catalogs: ``(session_id, agent_run_id)`` -> catalog.
        active_legs: leg key -> ``(scope, ports)`` for cancellation on scope end.
    """

    config: CodeModeConfig
    admission: Admission
    catalogs: dict[tuple[str, str], Any] = field(default_factory=dict)
    active_legs: dict[int, tuple[tuple[str, str], Any]] = field(default_factory=dict)

    def empty_telemetry(self) -> dict[str, Any]:
        """Telemetry of a scope without a catalog (SPEC §5.2: zeros)."""
        return {
            "catalogSize": 0,
            "sources": {"host": 0, "mcp": 0, "client": 0},
            "searchCount": 0,
            "describeCount": 0,
            "callCount": 0,
            "counterScope": "",
            "visibleTools": ["exec", "wait"],
        }
