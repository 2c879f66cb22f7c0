"""State shared by the services of one instance."""

from __future__ import annotations

import asyncio
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from cellblock.server.api._catalogs import RunCatalog
from cellblock.server.config import CodeModeConfig
from cellblock.server.limits import scope_share
from cellblock.server.runs import CancelReason, make_telemetry


class Admission:
    """Bounds the legs running at once, in all and per scope; refused legs get RESOURCE_EXHAUSTED (SPEC §3.1 item 2).

    One scope may hold at most :attr:`per_scope` of the slots (:func:`~cellblock.server.limits.scope_share`), so a
    quarter of them always stays for the other scopes: one tenant's burst of legs cannot
    refuse every other tenant's.

    Args:
        limit: Most concurrent legs (each holds one cell while it runs).
    """

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self.per_scope = scope_share(limit)
        self.running = 0
        self._by_scope: dict[tuple[str, str], int] = {}

    def try_acquire(self, scope: tuple[str, str]) -> str | None:
        """Takes a leg slot for ``scope`` if one is free for it.

        Returns:
            ``None`` when the slot is taken, else the refusal's message.
        """
        if self.running >= self.limit:
            return f"too many legs are running on this instance (limit {self.limit}); retry shortly"
        held = self._by_scope.get(scope, 0)
        if held >= self.per_scope:
            return f"this scope already has {held} legs running, its most on this instance (of {self.limit} legs in all); retry when one ends"
        self.running += 1
        self._by_scope[scope] = held + 1
        return None

    def release(self, scope: tuple[str, str]) -> None:
        """Returns a leg slot of ``scope``."""
        self.running = max(0, self.running - 1)
        held = self._by_scope.pop(scope, 0) - 1
        if held > 0:
            self._by_scope[scope] = held


@dataclass
class ServiceState:
    """Catalogs by scope, admission control and the active legs.

    Attributes:
        catalogs: ``(session_id, agent_run_id)`` -> catalog.
        active_legs: leg key -> ``(scope, ports, task)`` for cancellation on
            scope end, CancelRun and shutdown.
        mcp_hub: The cellblock-hosted MCP servers (``McpHub``), or ``None``.
    """

    config: CodeModeConfig
    admission: Admission
    catalogs: dict[tuple[str, str], Any] = field(default_factory=dict)
    active_legs: dict[int, tuple[tuple[str, str], Any, Any]] = field(default_factory=dict)

    async def abort_all(self, timeout: float) -> None:
        """Aborts every running leg for shutdown ([R20]) and waits until each cleaned up its cell."""
        legs = list(self.active_legs.values())
        for _scope, ports, _task in legs:
            ports.cancel(CancelReason.SHUTDOWN)
        tasks = [task for _scope, _ports, task in legs]
        if tasks:
            await asyncio.wait(tasks, timeout=timeout)

    mcp_hub: Any = None

    def hosted_tools(self) -> list[dict[str, Any]]:
        """Registration dicts of the hosted MCP servers' entries (empty without a hub)."""
        return self.mcp_hub.tools() if self.mcp_hub is not None else []

    #: This process's runs over the run store (a ``RunRegistry``), set at start.
    registry: Any = None
    #: Cells kept for their scope's next leg (``cells.ScopeCells``) under ``CELLBLOCK_CELL_REUSE=scope``.
    scope_cells: Any = None

    def poke_run(self, run_id: str, bridge_id: str) -> None:
        """Tells the legs serving ``run_id`` that ``bridge_id`` settled on the run."""
        for _scope, ports, _task in list(self.active_legs.values()):
            if ports.run_id == run_id:
                ports.hosted_settled(bridge_id)

    def settle_hosted(self, run_id: str, apply: Any) -> None:
        """Records a hosted call's outcome on the run's current state (see ``RunRegistry.deliver_hosted``)."""
        self.registry.deliver_hosted(run_id, apply, lambda bridge_id: self.poke_run(run_id, bridge_id))

    def restore_view(self, state: Mapping[str, Any], scope: tuple[str, str]) -> Any:
        """Rebuilds a stored run's catalog view; counts in the scope's live session when it is the run's."""
        catalog = self.catalogs.get(scope)
        if catalog is not None:
            return catalog.restore_view(state)
        return RunCatalog.from_state(state, self.config)

    def empty_telemetry(self) -> dict[str, Any]:
        """Telemetry of a scope without a catalog (SPEC §5.2: zeros)."""
        return make_telemetry()
