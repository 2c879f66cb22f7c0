"""LegPorts over an Exec/Wait stream and a frozen catalog view."""

from __future__ import annotations

import asyncio
import json
from typing import Any

from cellblock.server.catalog import _messages as bmsg
from cellblock.server.catalog._errors import BridgeReplyError
from cellblock.server.runs import _messages as msg
from cellblock.server.runs._ports import LegPorts, ToolOutcome
from cellblock.server.runs._state import PendingRequest, Run
from cellblock.v1 import code_mode_service_pb2 as pb
from cellblock.v1 import common_pb2

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
    """

    def __init__(self, response_type: Any, outbox: asyncio.Queue[Any], view: Any, session: Any) -> None:
        self._response_type = response_type
        self._outbox = outbox
        self.events: asyncio.Queue[tuple[str, Any]] = asyncio.Queue()
        self.view = view
        self.session = session
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
            path = args[1] if len(args) > 1 else ""
            raise BridgeReplyError(msg.p04(str(path)), "internal")
        helper = "tools.call" if method == "call" else "tools.callValue"
        tool_id = args[0] if args else None
        entry = self.view.resolve(tool_id, helper)
        tool_input = args[1] if len(args) > 1 else {}
        self.view.check_input(entry, tool_input)
        return {"entry": entry, "input": tool_input, "replaySafe": self.view.is_replay_safe_call(entry, tool_id)}

    def dispatch(self, run: Run, request: PendingRequest) -> None:
        assert request.entry is not None
        entry = request.entry["entry"]
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
            input_json=json.dumps(request.entry["input"], separators=(",", ":"), ensure_ascii=False),
        )
        self._outbox.put_nowait(self._response_type(tool_call=call))

    def project_result(self, request: PendingRequest, outcome: ToolOutcome, inbox_bytes: int) -> Any:
        assert request.entry is not None
        entry = request.entry["entry"]
        if outcome.ok_json is None:
            kind = outcome.error_kind
            if kind == "invalid_input":
                raise BridgeReplyError(outcome.error_message, "input")
            if kind == "blocked":
                raise BridgeReplyError(bmsg.b09_blocked(entry.id, outcome.error_message), "internal")
            if kind == "cancelled":
                raise BridgeReplyError(msg.b19(entry.id), "internal")
            raise BridgeReplyError(outcome.error_message or msg.b11(entry.id), "internal")
        size = len(outcome.ok_json.encode("utf-8", "surrogatepass"))
        if size > inbox_bytes:
            raise BridgeReplyError(msg.b12(entry.id, size, inbox_bytes), "internal")
        try:
            result = json.loads(outcome.ok_json)
        except ValueError:
            raise BridgeReplyError(msg.b11(entry.id), "internal") from None
        self.view.check_output(entry, result)
        if request.method == "call":
            return {"tool": entry.compact(), "result": result}
        if request.method == "callValue" and isinstance(result, dict) and "details" in result:
            return result["details"]
        return result

    def cancel_notice(self, nested_call_id: str) -> None:
        self._outbox.put_nowait(self._response_type(tool_call_cancelled=pb.ToolCallCancelled(nested_call_id=nested_call_id)))

    def output(self, entry: dict[str, Any]) -> None:
        text = json.dumps(entry, separators=(",", ":"), ensure_ascii=False)
        self._outbox.put_nowait(self._response_type(output=pb.OutputEvent(entry_json=text)))

    def count(self, kind: str) -> None:
        # search/describe are counted by the view as it answers them.
        if kind == "call" and self.view is not None:
            self.view.count_call()
