"""What a leg needs from the outside: its runtime stream (the one port) and its run's catalog.

A leg talks to exactly one port, :class:`LegPorts`, implemented by the API over the
Exec/Wait stream (``cellblock.server.api``). The port owns the leg's event queue: the API
puts runtime events on it (tool results, cancellation, hosted settlements) and the leg
puts its cell's events on the same queue, so one settle loop sees them in arrival order.

The catalog is not a port: it is the run's own frozen view (``Run.view``, a
:class:`CatalogPort`), kept for all of the run's legs (SPEC §3.2 item 6). The API's
``RunCatalog`` implements it over :class:`~cellblock.server.catalog.CatalogView`.
"""

from __future__ import annotations

import abc
import asyncio
from typing import TYPE_CHECKING, Any, Protocol

from cellblock.server.runs._protocol import Cancelled, CancelReason, HostedSettled, LegEvent, ResolvedCall, ToolOutcome

if TYPE_CHECKING:
    from cellblock.server.catalog import CatalogEntry
    from cellblock.server.runs._state import PendingRequest, Run

__all__ = ["CatalogPort", "LegPorts"]


class CatalogPort(Protocol):
    """The run's frozen catalog view as the leg uses it.

    Every method that answers a guest raises
    :class:`~cellblock.server.catalog.BridgeReplyError` for a refusal.
    """

    def guest_catalog(self) -> dict[str, Any]:
        """The data the cell installs: ``allTools``, ``convenience``, ``mcp``, ``apiFiles``."""

    def start_catalog_part(self) -> bytes:
        """The serialized ``Start`` catalog part of :meth:`guest_catalog` (``runs.start_catalog_part``).

        Built once per catalog version, in a worker process when it can be (SPEC §2.3).
        """

    def search(self, query: object, options: object) -> list[dict[str, Any]]:
        """Answers ``tools.search`` (SPEC §7.5)."""

    def describe_json(self, tool_id: object) -> str:
        """Answers ``tools.describe`` (SPEC §8.3 item 2) with the compact JSON of the described entry."""

    def resolve_call(self, method: str, args: list[object]) -> ResolvedCall:
        """Resolves a nested call and checks its input contract (SPEC §7.6, §8.4, §8.5 item 7)."""

    def project_result(self, method: str, call: ResolvedCall, outcome: ToolOutcome, inbox_bytes: int) -> object:
        """Turns a tool outcome into the value the guest receives (SPEC §8.4 item 2, §3.5)."""

    def count_call(self, requests: int = 1) -> None:
        """Counts ``requests`` nested call requests in the catalog session."""

    def to_state(self) -> dict[str, Any]:
        """The view and its catalog session as a JSON document for the run store (SPEC §10.7 item 2)."""

    def state_parts(self) -> list[bytes | memoryview]:
        """:meth:`to_state` as UTF-8 JSON, in parts to concatenate (written off the loop once per catalog version when it can be)."""

    def entry(self, entry_id: str) -> CatalogEntry | None:
        """The view's entry with this exact id (a stored run's resolved calls name it)."""


class LegPorts(abc.ABC):
    """The leg's one port: its runtime stream and its event queue.

    Attributes:
        run_id: The run the leg serves; set by the runner once the run exists
            (CancelRun and hosted settlements find legs by it).
        events: The leg's event queue (:data:`~cellblock.server.runs.LegEvent`).
    """

    def __init__(self) -> None:
        self.run_id = ""
        self.events: asyncio.Queue[LegEvent] = asyncio.Queue()

    # -------------------------------------------------------- runtime -> leg
    def tool_result(self, outcome: ToolOutcome) -> None:
        """Hands the leg a runtime's answer to a nested call."""
        self.events.put_nowait(outcome)

    def cancel(self, reason: CancelReason = CancelReason.CALLER) -> None:
        """Aborts the leg (SPEC §3.6)."""
        self.events.put_nowait(Cancelled(reason))

    def hosted_settled(self, bridge_id: str) -> None:
        """Tells the leg that a hosted MCP call settled ``bridge_id`` on the run."""
        self.events.put_nowait(HostedSettled(bridge_id))

    # -------------------------------------------------------- leg -> runtime
    @abc.abstractmethod
    def dispatch(self, run: Run, request: PendingRequest) -> None:
        """Sends a resolved nested call to the runtime (or a hosted MCP server)."""

    @abc.abstractmethod
    def cancel_notice(self, nested_call_id: str) -> None:
        """Tells the runtime that a dispatched call was abandoned."""

    @abc.abstractmethod
    def output(self, entry: dict[str, Any]) -> None:
        """Mirrors one accepted output entry to the runtime."""
