"""What a leg needs from the outside: the runtime's stream and the catalog.

:class:`LegPorts` is the seam between the leg (cells, bridge, settle loop) and
the gRPC service that owns the Exec/Wait stream and the scope's catalog.
"""

from __future__ import annotations

import abc
from dataclasses import dataclass
from typing import Any

from cellblock.server.catalog import BridgeReplyError
from cellblock.server.runs._state import PendingRequest, Run

__all__ = ["BridgeReplyError", "LegPorts", "ToolOutcome"]


@dataclass(frozen=True)
class ToolOutcome:
    """A runtime's answer to one nested call.

    Attributes:
        nested_call_id: The call answered.
        ok_json: The tool result as JSON text, when it succeeded.
        error_kind: ``invalid_input``, ``blocked``, ``failed`` or ``cancelled``
            when it did not.
        error_message: The runtime's message for a failure.
        oversized_bytes: The size in bytes of a result the runtime could not
            send because it exceeds the service's message cap (the guest gets [B12]).
    """

    nested_call_id: str
    ok_json: str | None = None
    error_kind: str = ""
    error_message: str = ""
    oversized_bytes: int = 0


class LegPorts(abc.ABC):
    """The leg's view of its runtime stream and catalog."""

    #: The run the leg serves; set by the runner when the run exists.
    run_id: str = ""

    @abc.abstractmethod
    async def next_event(self) -> tuple[str, Any]:
        """Waits for the next runtime event.

        Returns:
            ``("tool_result", ToolOutcome)`` or ``("cancel", reason)`` where
            reason is ``"caller"`` or ``"scope"``.
        """

    @abc.abstractmethod
    def guest_catalog(self) -> dict[str, Any]:
        """The catalog data the cell needs: allTools, convenience, apiFiles."""

    @abc.abstractmethod
    def search(self, query: Any, options: Any) -> Any:
        """Answers ``tools.search``. Raises BridgeReplyError."""

    @abc.abstractmethod
    def describe(self, tool_id: Any) -> Any:
        """Answers ``tools.describe``. Raises BridgeReplyError."""

    @abc.abstractmethod
    def resolve(self, method: str, args: list[Any]) -> dict[str, Any]:
        """Resolves a nested call and checks its input contract.

        Returns:
            The compact entry plus ``replaySafe`` for dispatch.

        Raises:
            BridgeReplyError: Unknown/ambiguous tool, bad id type, contract.
        """

    @abc.abstractmethod
    def dispatch(self, run: Run, request: PendingRequest) -> None:
        """Sends a nested call to the runtime (or a hosted MCP server)."""

    @abc.abstractmethod
    def project_result(self, request: PendingRequest, outcome: ToolOutcome, inbox_bytes: int) -> Any:
        """Turns a tool outcome into the value the guest receives.

        Raises:
            BridgeReplyError: Failure replies, oversized results, output
                contract violations.
        """

    @abc.abstractmethod
    def cancel_notice(self, nested_call_id: str) -> None:
        """Tells the runtime that a dispatched call was abandoned."""

    @abc.abstractmethod
    def output(self, entry: dict[str, Any]) -> None:
        """Mirrors one accepted output entry to the runtime."""

    @abc.abstractmethod
    def count(self, kind: str) -> None:
        """Increments the catalog session's ``search``/``describe``/``call`` counter."""
