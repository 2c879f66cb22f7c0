"""The leg's port over an Exec/Wait stream (:class:`~cellblock.server.runs.LegPorts`).

The port carries nested calls, cancel notices and output to the runtime, and the
runtime's answers back onto the leg's event queue. It does not wrap the catalog: the
leg reads the run's own :class:`~cellblock.server.api._catalogs.RunCatalog` (``run.view``).
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, Protocol

from opentelemetry import trace

from cellblock.server.catalog import CatalogEntry, strict_json
from cellblock.server.runs import BridgeMethod, JsonText, LegPorts, PendingRequest, Run, ToolOutcome, compact_json, record_tool_outcome
from cellblock.v1 import code_mode_service_pb2 as pb
from cellblock.v1 import common_pb2

if TYPE_CHECKING:
    from google.protobuf.message import Message

_METHODS = {
    BridgeMethod.CALL: pb.NESTED_CALL_METHOD_CALL,
    BridgeMethod.CALL_VALUE: pb.NESTED_CALL_METHOD_CALL_VALUE,
    BridgeMethod.NAMESPACE: pb.NESTED_CALL_METHOD_NAMESPACE,
}
_SOURCES = {"host": common_pb2.TOOL_SOURCE_HOST, "mcp": common_pb2.TOOL_SOURCE_MCP, "client": common_pb2.TOOL_SOURCE_CLIENT}

#: ``ExecResponse`` or ``WaitResponse`` (both carry ``tool_call``, ``tool_call_cancelled`` and ``output``).
ResponseType = Callable[..., "Message"]


class HostedServers(Protocol):
    """The cellblock-hosted MCP servers as the port uses them (``McpHub``, SPEC §3.2 item 7)."""

    def serves(self, entry: CatalogEntry) -> bool:
        """Whether ``entry`` belongs to a hosted server."""

    def start_call(
        self,
        entry: CatalogEntry,
        arguments: dict[str, Any],
        *,
        nested_call_id: str,
        run_id: str,
        parent_tool_call_id: str,
        on_done: Callable[[ToolOutcome], None],
    ) -> None:
        """Starts one call; ``on_done`` receives its outcome."""

    def cancel(self, nested_call_id: str) -> bool:
        """Cancels a running call; False when it is not a hosted call."""


class StreamPorts(LegPorts):
    """Connects a leg to its gRPC stream.

    Args:
        response_type: ``ExecResponse`` or ``WaitResponse``.
        outbox: Queue of response messages the RPC handler yields (``None`` ends it).
        hosted: The cellblock-hosted MCP servers (``McpHub``), or ``None``;
            namespace calls to their entries go to them instead of the runtime
            (SPEC §3.2 item 7).
        settle: ``settle(run_id, apply)`` records a hosted call's outcome on
            the run's current state (``apply(run)``): at once on a leg running
            here, else when a wait in this process next claims the run.
    """

    def __init__(
        self,
        response_type: ResponseType,
        outbox: asyncio.Queue[Message | None],
        hosted: HostedServers | None = None,
        settle: Callable[[str, Callable[[Run], PendingRequest | None]], None] | None = None,
    ) -> None:
        super().__init__()
        self._response_type = response_type
        self._outbox = outbox
        self.hosted = hosted
        self._settle = settle
        #: The entry of each nested call sent on this stream and not answered yet, by nested call id:
        #: a long result is checked against its output contract in the worker that reads it.
        self.sent_calls: dict[str, CatalogEntry] = {}

    def dispatch(self, run: Run, request: PendingRequest) -> None:
        assert request.call is not None
        entry = request.call.entry
        if request.method is BridgeMethod.NAMESPACE and self.hosted is not None and self.hosted.serves(entry):
            self._dispatch_hosted(self.hosted, run, request)
            return
        call = pb.ToolCall(
            nested_call_id=request.nested_call_id,
            parent_tool_call_id=run.tool_call_id,
            run_id=run.run_id,
            replay_id=run.replay_id,
            catalog_id=entry.id,
            source=_SOURCES[entry.source],
            owner=entry.owner,
            name=entry.name,
            method=_METHODS[request.method],
            input_json=tool_input.text if isinstance(tool_input := request.call.input, JsonText) else compact_json(tool_input),
        )
        self.sent_calls[call.nested_call_id] = entry
        self._outbox.put_nowait(self._response_type(tool_call=call))

    def _dispatch_hosted(self, hosted: HostedServers, run: Run, request: PendingRequest) -> None:
        """Calls a cellblock-hosted MCP server; its answer settles the request on the run.

        The answer is recorded on the run whether or not a leg is active (a
        parked run delivers it on its next wait), then the active leg, if
        any, is told (SPEC §3.4 item 3, §3.5).
        """
        assert request.call is not None
        tool_input = request.call.input
        if isinstance(tool_input, JsonText):  # the MCP client takes the decoded object
            tool_input = strict_json(tool_input.text)
        assert isinstance(tool_input, dict), "namespace calls take an object (resolve_call)"

        def done(outcome: ToolOutcome) -> None:
            def apply(current: Run) -> PendingRequest | None:
                return record_tool_outcome(current, outcome, time.monotonic())

            if self._settle is not None:
                self._settle(run.run_id, apply)
            else:
                apply(run)

        # The call's task starts inside its `bridge.tool_call` span, so the MCP
        # SDK's own client spans nest under the nested call that caused them.
        held = run.tool_spans.get(request.nested_call_id)
        with trace.use_span(held[0], end_on_exit=False) if held is not None else contextlib.nullcontext():
            hosted.start_call(
                request.call.entry,
                tool_input,
                nested_call_id=request.nested_call_id,
                run_id=run.run_id,
                parent_tool_call_id=run.tool_call_id,
                on_done=done,
            )

    def cancel_notice(self, nested_call_id: str) -> None:
        if self.hosted is not None and self.hosted.cancel(nested_call_id):
            return
        self._outbox.put_nowait(self._response_type(tool_call_cancelled=pb.ToolCallCancelled(nested_call_id=nested_call_id)))

    def output(self, entry: dict[str, Any]) -> None:
        text = compact_json(entry)
        self._outbox.put_nowait(self._response_type(output=pb.OutputEvent(entry_json=text)))
