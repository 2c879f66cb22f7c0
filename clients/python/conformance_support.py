"""Shared parts of the Python conformance CLI (clients/python/conformance.py).

The scenario state (scope, recorded calls and output, the shared tool handlers of
clients/README.md) and the observation helpers that every scenario prints.
"""

from __future__ import annotations

import asyncio
import json
import os
import re
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

from cellblock.client import (
    CellblockClient,
    LimitOverrides,
    OutputEntry,
    RPCError,
    RunResult,
    Scope,
    ToolCallInfo,
    ToolRefused,
)
from cellblock.v1 import code_mode_service_pb2, common_pb2

DEFAULT_SPEC = Path(__file__).resolve().parents[1] / "conformance" / "scenarios.json"
CODES = {
    code_mode_service_pb2.ERROR_CODE_UNSPECIFIED: "",
    code_mode_service_pb2.ERROR_CODE_INVALID_INPUT: "invalid_input",
    code_mode_service_pb2.ERROR_CODE_RUNTIME_UNAVAILABLE: "runtime_unavailable",
    code_mode_service_pb2.ERROR_CODE_ABORTED: "aborted",
    code_mode_service_pb2.ERROR_CODE_TIMEOUT: "timeout",
    code_mode_service_pb2.ERROR_CODE_OUTPUT_LIMIT_EXCEEDED: "output_limit_exceeded",
    code_mode_service_pb2.ERROR_CODE_SNAPSHOT_LIMIT_EXCEEDED: "snapshot_limit_exceeded",
    code_mode_service_pb2.ERROR_CODE_INTERNAL_ERROR: "internal_error",
}
STATUSES = {
    code_mode_service_pb2.RUN_STATUS_COMPLETED: "completed",
    code_mode_service_pb2.RUN_STATUS_WAITING: "waiting",
    code_mode_service_pb2.RUN_STATUS_FAILED: "failed",
}
SOURCES = {common_pb2.TOOL_SOURCE_HOST: "host", common_pb2.TOOL_SOURCE_MCP: "mcp", common_pb2.TOOL_SOURCE_CLIENT: "client"}
METHODS = {
    code_mode_service_pb2.NESTED_CALL_METHOD_CALL: "call",
    code_mode_service_pb2.NESTED_CALL_METHOD_CALL_VALUE: "callValue",
    code_mode_service_pb2.NESTED_CALL_METHOD_NAMESPACE: "namespace",
}
Handler = Callable[[dict[str, Any], ToolCallInfo], Awaitable[Any]]


class Scenario:
    """The state of one scenario run: scope, catalog, recorded calls and output."""

    def __init__(self, client: CellblockClient, address: str, spec: dict[str, Any], name: str) -> None:
        """Prepares a scenario run in a fresh scope.

        Args:
            client: The connected client.
            address: The service address (for the scenarios that use raw stubs).
            spec: The parsed scenarios.json.
            name: The scenario name (also the agent run id).
        """
        self.client = client
        self.address = address
        self.spec = spec
        self.name = name
        self.scope = Scope(session_id=f"conf-python-{os.getpid()}", agent_run_id=name)
        self.exec_id = f"call-{name}"
        self.calls: list[dict[str, Any]] = []
        self.streamed: list[dict[str, Any]] = []
        # `slow` call i answers once gate i opens (suspend_resume).
        self.slow_gates = {1: asyncio.Event(), 2: asyncio.Event()}

    @property
    def program(self) -> str:
        """The scenario's program from scenarios.json."""
        return str(self.spec["programs"][self.name])

    async def register(self, scope: Scope | None = None) -> dict[str, Any]:
        """Registers the shared catalog in ``scope`` (default: the scenario's); returns ids and size."""
        catalog = await self.client.put_catalog(scope or self.scope, self.spec["tools"])
        return {"ids": [e.id for e in catalog.entries], "catalogSize": catalog.telemetry.catalog_size}

    def record(self, call: ToolCallInfo, tool_input: dict[str, Any]) -> None:
        """Appends the observation of one ToolCall (clients/README.md `calls`)."""
        self.calls.append({
            "catalogId": call.catalog_id,
            "source": call.source,
            "owner": call.owner,
            "name": call.name,
            "method": call.method,
            "input": tool_input,
            "n": int(call.nested_call_id.rsplit("_", 1)[-1]),
            "idsWellFormed": ids_well_formed(self.exec_id, call.nested_call_id, call.replay_id, call.run_id, call.parent_tool_call_id),
        })

    def on_output(self, entry: OutputEntry) -> None:
        """Records a streamed output entry; opens `slow` gate 2 on "after late-1"."""
        self.streamed.append({"type": "text", "text": entry.text} if entry.type == "text" else {"type": entry.type, "value": entry.value})
        if entry.type == "text" and entry.text == "after late-1":
            self.slow_gates[2].set()  # the second late result goes out on the open wait stream

    def handlers(self, **overrides: Handler) -> dict[str, Handler]:
        """The shared tool handlers (clients/README.md), recording every call."""

        async def echo(tool_input: dict[str, Any], call: ToolCallInfo) -> Any:
            return {"content": [{"type": "text", "text": "echo"}], "details": {"echo": tool_input}}

        async def boom(tool_input: dict[str, Any], call: ToolCallInfo) -> Any:
            raise RuntimeError(f"boom {tool_input.get('n')}")

        async def refuse(tool_input: dict[str, Any], call: ToolCallInfo) -> Any:
            raise ToolRefused("invalid_input", f"n must be positive, got {tool_input.get('n')}")

        async def blocked(tool_input: dict[str, Any], call: ToolCallInfo) -> Any:
            raise ToolRefused("blocked", "needs approval")

        async def cancelled(tool_input: dict[str, Any], call: ToolCallInfo) -> Any:
            raise ToolRefused("cancelled", "operator cancelled")

        async def silent(tool_input: dict[str, Any], call: ToolCallInfo) -> Any:
            raise ToolRefused("failed", "")

        async def huge(tool_input: dict[str, Any], call: ToolCallInfo) -> Any:
            return {"details": {"blob": "x" * int(tool_input.get("bytes", 0))}}

        async def slow(tool_input: dict[str, Any], call: ToolCallInfo) -> Any:
            await self.slow_gates[int(tool_input.get("i", 0))].wait()
            return {"details": {"answer": f"late-{tool_input.get('i')}"}}

        async def lookup(tool_input: dict[str, Any], call: ToolCallInfo) -> Any:
            key = tool_input.get("key")
            return {"details": {"value": 42 if key == "bad-shape" else f"v-{key}"}}

        table: dict[str, Handler] = {
            "echo": echo, "boom": boom, "refuse": refuse, "blocked": blocked, "cancelled": cancelled,
            "silent": silent, "huge": huge, "slow": slow, "lookup": lookup, **overrides,
        }

        def recording(handler: Handler) -> Handler:
            async def run(tool_input: dict[str, Any], call: ToolCallInfo) -> Any:
                self.record(call, tool_input)
                return await handler(tool_input, call)
            return run

        # `unserved` has no handler: the client answers it with its missing-handler refusal.
        return {name: recording(h) for name, h in table.items()}

    async def exec(self, handlers: dict[str, Handler]) -> RunResult:
        """Runs the scenario's program as an exec leg with its limits, recording its output."""
        given = self.spec.get("limits", {}).get(self.name)
        limits = None
        if given:
            limits = LimitOverrides(timeout_ms=given.get("timeoutMs"), max_snapshot_bytes=given.get("maxSnapshotBytes"))
        return await self.client.exec(self.scope, tool_call_id=self.exec_id, code=self.program, handlers=handlers, limits=limits, on_output=self.on_output)

    async def wait(self, run_id: str, handlers: dict[str, Handler] | None = None) -> RunResult:
        """Runs a wait leg on ``run_id``, recording its output."""
        return await self.client.wait(self.scope, tool_call_id=f"{self.exec_id}-wait", run_id=run_id, handlers=handlers or {}, on_output=self.on_output)


def ids_well_formed(exec_id: str, nested_id: str, replay_id: str, run_id: str, parent_id: str) -> bool:
    """Whether a ToolCall's ids follow SPEC §3.5 items 2-3 for the run's exec id."""
    prefix = re.sub(r"[^A-Za-z0-9_-]", "_", exec_id)[:48]
    return (
        parent_id == exec_id
        and re.fullmatch(r"replay_[0-9a-f]{24}", replay_id) is not None
        and re.fullmatch(r"run_[0-9a-f]{32}", run_id) is not None
        and re.fullmatch(rf"cellblock_{re.escape(prefix)}_{replay_id[7:15]}_[1-9][0-9]*", nested_id) is not None
    )


def observe_leg(result_json: str, status: str, code: str, run_id: str, leg_count: int, calls: dict[str, int]) -> dict[str, Any]:
    """The observation of one leg's Result (clients/README.md `leg`).

    Args:
        result_json: The model-facing result; its ``runId`` and ``counterScope`` are masked.
        status: ``completed``, ``waiting`` or ``failed``.
        code: The error code of a failed result, else ``""``.
        run_id: The result's run id (only whether it is set is kept).
        leg_count: Legs of the run so far.
        calls: Bridge requests of the run by kind (``search``, ``describe``, ``call``).

    Returns:
        The JSON-ready observation.
    """
    body = json.loads(result_json)
    if "runId" in body:
        body["runId"] = "<run>"
    if isinstance(body.get("telemetry"), dict) and "counterScope" in body["telemetry"]:
        body["telemetry"]["counterScope"] = "<scope>"
    return {"result": body, "status": status, "code": code, "runIdSet": bool(run_id), "legCount": leg_count, "bridgeCalls": calls}


def leg(result: RunResult) -> dict[str, Any]:
    """The observation of a leg the client ran (`observe_leg`)."""
    calls = result.metadata.bridge_calls
    counts = {"search": calls.search, "describe": calls.describe, "call": calls.call}
    return observe_leg(result.raw_json, result.status, result.code or "", result.run_id or "", result.metadata.leg_count, counts)


async def status_of_call(call: Awaitable[Any]) -> dict[str, str]:
    """Awaits an RPC and returns its status as ``{code, message}`` (``OK`` on success)."""
    try:
        await call
    except RPCError as exc:
        return {"code": exc.status.name, "message": exc.message}
    return {"code": "OK", "message": ""}


async def leg_or_status(call: Awaitable[RunResult]) -> dict[str, Any]:
    """Awaits a leg: its observation (`leg`), or the gRPC status it was refused with as ``{code, message}``."""
    try:
        return leg(await call)
    except RPCError as exc:
        return {"code": exc.status.name, "message": exc.message}
