"""LegPorts over an Exec/Wait stream and a frozen catalog view."""

from __future__ import annotations

import asyncio
import contextlib
import json
import time
from collections.abc import Callable
from typing import Any

import structlog
from opentelemetry import trace

from cellblock.server import messages as msg
from cellblock.server.catalog import BridgeReplyError, compact_json
from cellblock.server.runs import LegPorts, PendingRequest, Run, ToolOutcome
from cellblock.server.runs._leg import record_tool_outcome, reply_inbox_bytes
from cellblock.v1 import code_mode_service_pb2 as pb
from cellblock.v1 import common_pb2

log = structlog.get_logger("cellblock.leg")

_METHODS = {
    "call": pb.NESTED_CALL_METHOD_CALL,
    "callValue": pb.NESTED_CALL_METHOD_CALL_VALUE,
    "namespace": pb.NESTED_CALL_METHOD_NAMESPACE,
}
_SOURCES = {"host": common_pb2.TOOL_SOURCE_HOST, "mcp": common_pb2.TOOL_SOURCE_MCP, "client": common_pb2.TOOL_SOURCE_CLIENT}


class StreamPorts(LegPorts):
    """Connects a leg to its gRPC stream.

    Args:
        response_type: ``ExecResponse`` or ``WaitResponse``.
        outbox: Queue of response messages the RPC handler yields.
        view: The run's frozen catalog view.
        session: The live catalog session whose counters grow (may be gone
            after the scope ended).
        hosted: The cellblock-hosted MCP servers (``McpHub``), or ``None``;
            namespace calls to their entries go to them instead of the runtime
            (SPEC §3.2 item 7).
        poke: ``poke(run_id, bridge_id)`` tells the leg now serving a run
            that a hosted call settled a request (no-op when none is active).
    """

    def __init__(
        self,
        response_type: Any,
        outbox: asyncio.Queue[Any],
        view: Any,
        session: Any,
        hosted: Any = None,
        poke: Callable[[str, str], None] | None = None,
    ) -> None:
        self._response_type = response_type
        self._outbox = outbox
        self.events: asyncio.Queue[tuple[str, Any]] = asyncio.Queue()
        self.view = view
        self.session = session
        self.hosted = hosted
        self._poke = poke
        #: The run this leg serves, once known (CancelRun finds legs by it).
        self.run_id = ""

    async def next_event(self) -> tuple[str, Any]:
        return await self.events.get()

    def guest_catalog(self) -> dict[str, Any]:
        return self.view.guest_catalog()

    def search(self, query: Any, options: Any) -> Any:
        return self.view.search(query, options)

    def describe(self, tool_id: Any) -> Any:
        return self.view.describe(tool_id)

    def resolve(self, method: str, args: list[Any]) -> dict[str, Any]:
        if method == "namespace":
            # SPEC §8.5 item 7: only paths in the run's namespace map, by exact catalog id.
            path = args[1] if len(args) > 1 else ""
            entry = self.view.namespace_entry(args[0] if args else None, path)
            if entry is None:
                log.error("bridge.protocol", message=msg.p04(str(path)))
                raise BridgeReplyError(msg.p04(str(path)), "internal")
            label = f"MCP.{path}"
            tool_input = args[2] if len(args) > 2 else {}
            if not isinstance(tool_input, dict):
                # The controller refuses these itself (B14); a forged request gets the same reply.
                raise BridgeReplyError(msg.b14(label), "input")
            return {"entry": entry, "input": tool_input, "replaySafe": False, "label": label}
        helper = "tools.call" if method == "call" else "tools.callValue"
        tool_id = args[0] if args else None
        entry = self.view.resolve(tool_id, helper)
        tool_input = args[1] if len(args) > 1 else {}
        self.view.check_input(entry, tool_input)
        return {"entry": entry, "input": tool_input, "replaySafe": self.view.is_replay_safe_call(entry, tool_id)}

    def dispatch(self, run: Run, request: PendingRequest) -> None:
        assert request.entry is not None
        entry = request.entry["entry"]
        if request.method == "namespace" and self.hosted is not None and self.hosted.serves(entry):
            self._dispatch_hosted(run, request)
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
            input_json=compact_json(request.entry["input"]),
        )
        self._outbox.put_nowait(self._response_type(tool_call=call))

    def _dispatch_hosted(self, run: Run, request: PendingRequest) -> None:
        """Calls a cellblock-hosted MCP server; its answer settles the request on the run.

        The answer is recorded on the run whether or not a leg is active (a
        parked run delivers it on its next wait), then the active leg, if
        any, is told (SPEC §3.4 item 3, §3.5).
        """
        assert request.entry is not None
        entry = request.entry["entry"]

        def done(outcome: ToolOutcome) -> None:
            settled = record_tool_outcome(run, self, outcome, reply_inbox_bytes(run), time.monotonic())
            if settled is not None and self._poke is not None:
                self._poke(run.run_id, settled.bridge_id)

        # The call's task starts inside its `bridge.tool_call` span, so the MCP
        # SDK's own client spans nest under the nested call that caused them.
        held = run.tool_spans.get(request.nested_call_id)
        with trace.use_span(held[0], end_on_exit=False) if held is not None else contextlib.nullcontext():
            self.hosted.start_call(
                entry,
                request.entry["input"],
                nested_call_id=request.nested_call_id,
                run_id=run.run_id,
                parent_tool_call_id=run.tool_call_id,
                on_done=done,
            )

    def project_result(self, request: PendingRequest, outcome: ToolOutcome, inbox_bytes: int) -> Any:
        assert request.entry is not None
        entry = request.entry["entry"]
        # In tool messages <id> is the guest path for namespace calls (SPEC §14).
        label = request.entry.get("label", entry.id)
        if outcome.oversized_bytes > 0:
            raise BridgeReplyError(msg.b12(label, outcome.oversized_bytes, inbox_bytes), "internal")
        if outcome.ok_json is None:
            kind = outcome.error_kind
            if kind == "invalid_input":
                raise BridgeReplyError(outcome.error_message, "input")
            if kind == "blocked":
                raise BridgeReplyError(msg.b09(label, outcome.error_message), "internal")
            if kind == "cancelled":
                raise BridgeReplyError(msg.b19(label), "internal")
            raise BridgeReplyError(outcome.error_message or msg.b11(label), "internal")
        size = len(outcome.ok_json.encode("utf-8", "surrogatepass"))
        if size > inbox_bytes:
            raise BridgeReplyError(msg.b12(label, size, inbox_bytes), "internal")
        try:
            result = json.loads(outcome.ok_json)
        except (ValueError, RecursionError):
            raise BridgeReplyError(msg.not_json(label), "internal") from None
        self.view.check_output(entry, result)
        if request.method == "call":
            return {"tool": entry.compact(), "result": result}
        if request.method == "callValue" and isinstance(result, dict) and "details" in result:
            return result["details"]
        return result

    def cancel_notice(self, nested_call_id: str) -> None:
        if self.hosted is not None and self.hosted.cancel(nested_call_id):
            return
        self._outbox.put_nowait(self._response_type(tool_call_cancelled=pb.ToolCallCancelled(nested_call_id=nested_call_id)))

    def output(self, entry: dict[str, Any]) -> None:
        text = compact_json(entry)
        self._outbox.put_nowait(self._response_type(output=pb.OutputEvent(entry_json=text)))

    def count(self, kind: str) -> None:
        # search/describe are counted by the view as it answers them.
        if kind == "call" and self.view is not None:
            self.view.count_call()
