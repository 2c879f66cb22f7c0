"""The MCP front door end to end with the official MCP Python SDK client (issue #17, SPEC §3.8).

Each test starts ``python -m cellblock.server.frontdoor`` as its own process (in-process
cellblock service, Docker executor, real cells) with server-memory (npm) and
mcp-server-time (PyPI) behind it, and drives it as an MCP client would, over stdio and
over streamable HTTP: list the tools, run a program that calls both servers, suspend
with ``yield_control`` and finish with ``wait``, and cancel an exec and a wait leg.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from mcp import Client, StdioServerParameters

from cellblock.client import CellblockClient, Scope
from tests.support.frontdoor import (
    CANCELLED_EXEC,
    CANCELLED_EXEC_WOULD_FINISH_S,
    CANCELLED_WAIT,
    CHECK_CANCELLED,
    EXPECTED_VALUE,
    PROGRAM,
    ROOT,
    FrontDoorEnv,
    free_port,
)

pytestmark = pytest.mark.asyncio(loop_scope="session")


def _result(call: Any) -> dict[str, Any]:
    """The model-facing JSON of a tool result; the structured copy must be the same object."""
    assert [c.type for c in call.content] == ["text"]
    data = json.loads(call.content[0].text)
    assert call.structured_content == data
    assert call.is_error is (data["status"] == "failed")
    return data


class _Progress:
    """Collects progress messages (streamed output entries) and signals a wanted one."""

    def __init__(self) -> None:
        self.messages: list[dict[str, Any]] = []
        self.seen: dict[str, asyncio.Event] = {}

    def expect(self, text: str) -> asyncio.Event:
        return self.seen.setdefault(text, asyncio.Event())

    async def __call__(self, progress: float, total: float | None, message: str | None) -> None:
        entry = json.loads(message or "null")
        self.messages.append(entry)
        if isinstance(entry, dict) and entry.get("type") == "text":
            self.expect(entry["text"]).set()


async def _cancel_after(client: Client, name: str, arguments: dict[str, Any], marker: str) -> None:
    """Starts a tool call, cancels it (notifications/cancelled) once ``marker`` streamed."""
    progress = _Progress()
    seen = progress.expect(marker)
    call = asyncio.ensure_future(client.call_tool(name, arguments, progress_callback=progress))
    done, _ = await asyncio.wait({call, asyncio.ensure_future(seen.wait())}, timeout=60, return_when=asyncio.FIRST_COMPLETED)
    assert not call.done(), f"the {name} call ended before it could be cancelled: {call.result() if call.done() else ''}"
    assert seen.is_set(), f"{marker!r} never streamed"
    call.cancel()
    with pytest.raises(asyncio.CancelledError):
        await call


async def _wait_after_abort(client: Client, run_id: str) -> dict[str, Any]:
    """``wait`` on a run whose leg was just cancelled: [W06] until the abort has landed, then the answer."""
    deadline = time.monotonic() + 20
    while True:
        again = _result(await client.call_tool("wait", {"runId": run_id}))
        if "already being resumed" not in again.get("error", "") or time.monotonic() > deadline:
            return again
        await asyncio.sleep(0.1)


async def _flow(client: Client, check_tools: Callable[[list[Any]], None]) -> dict[str, float]:
    """The issue's flow; returns the seconds each step took."""
    timings: dict[str, float] = {}
    t0 = time.monotonic()
    tools = (await client.list_tools()).tools
    assert [t.name for t in tools] == ["exec", "wait"]
    check_tools(tools)

    # Two real MCP servers, suspension with yield_control, the end with wait.
    progress = _Progress()
    t = time.monotonic()
    first = _result(await client.call_tool("exec", {"code": PROGRAM}, progress_callback=progress))
    assert first["status"] == "waiting", first
    assert first["reason"] == "yield"
    assert first["output"] == [{"type": "text", "text": "created 1 block(s)"}]
    assert progress.messages == first["output"], "each output entry streams as a progress notification"
    resumed = _result(await client.call_tool("wait", {"runId": first["runId"]}, progress_callback=progress))
    timings["exec+wait"] = time.monotonic() - t
    assert resumed["status"] == "completed", resumed
    assert resumed["value"] == EXPECTED_VALUE
    assert resumed["output"] == [{"type": "json", "value": {"step": "after wait"}}]
    assert resumed["telemetry"]["sources"] == {"host": 0, "mcp": 17, "client": 0}
    assert progress.messages[-1] == {"type": "json", "value": {"step": "after wait"}}

    # A failed run is a tool error the model can read.
    failed = _result(await client.call_tool("exec", {"code": "throw new Error('boom')"}))
    assert failed["status"] == "failed" and "boom" in failed["error"], failed

    # Cancelling an exec aborts its leg: the program never reaches its second call.
    t = time.monotonic()
    await _cancel_after(client, "exec", {"code": CANCELLED_EXEC}, "started")
    await asyncio.sleep(max(0.0, CANCELLED_EXEC_WOULD_FINISH_S - (time.monotonic() - t)))
    check = _result(await client.call_tool("exec", {"code": CHECK_CANCELLED}))
    assert check["status"] == "completed" and check["value"] == 0, check
    timings["cancel exec"] = time.monotonic() - t

    # Cancelling a wait leg aborts the run: it can never be resumed (SPEC §3.6 item 2).
    t = time.monotonic()
    parked = _result(await client.call_tool("exec", {"code": CANCELLED_WAIT}))
    assert parked["status"] == "waiting", parked
    await _cancel_after(client, "wait", {"runId": parked["runId"]}, "resumed")
    again = await _wait_after_abort(client, parked["runId"])
    assert again["status"] == "failed" and again["code"] == "aborted", again
    timings["cancel wait"] = time.monotonic() - t
    timings["flow"] = time.monotonic() - t0
    return timings


def _check_described(tools: list[Any]) -> None:
    """Without a gRPC view: the definitions still name both servers and carry SPEC §4.1's schema."""
    exec_tool, wait_tool = tools
    assert "Visible servers: memory, time." in exec_tool.description
    assert set(exec_tool.input_schema["properties"]) == {"code", "command", "language", "restartSafe"}
    assert wait_tool.input_schema["required"] == ["runId"]


async def test_stdio_flow_with_the_python_sdk(tmp_path: Path) -> None:
    door = FrontDoorEnv.make(tmp_path)
    started = time.monotonic()
    params = StdioServerParameters(command=door.command()[0], args=door.command()[1:], env=door.env, cwd=str(ROOT))
    async with Client(params, read_timeout_seconds=60) as client:
        connected = time.monotonic() - started
        protocol = client.protocol_version
        timings = await _flow(client, _check_described)
    print(f"stdio (protocol {protocol}): connect {connected:.2f}s", {k: round(v, 2) for k, v in timings.items()})
    door.assert_nothing_left()


async def test_http_flow_with_the_python_sdk_and_grpc_in_the_same_process(tmp_path: Path) -> None:
    door = FrontDoorEnv.make(tmp_path)
    port, grpc_port = free_port(), free_port()
    proc = door.start_http(port, "--also-grpc", f"127.0.0.1:{grpc_port}", log_path=tmp_path / "stderr.log")
    try:
        async with await CellblockClient.connect(f"127.0.0.1:{grpc_port}") as grpc_client:
            # The same process serves gRPC: its surface for a fresh scope is what MCP clients list.
            scope = Scope(session_id="frontdoor-grpc", agent_run_id="check")
            await grpc_client.put_catalog(scope, [])
            surface = await grpc_client.tool_surface(scope)

            def check_tools(tools: list[Any]) -> None:
                assert [(t.name, t.description, t.input_schema) for t in tools] == [(d.name, d.description, d.parameters) for d in surface.tools]

            started = time.monotonic()
            async with Client(f"http://127.0.0.1:{port}/mcp", read_timeout_seconds=60) as client:
                connected = time.monotonic() - started
                assert client.protocol_version == "2025-11-25", "the front door keeps HTTP clients on sessions"
                timings = await _flow(client, check_tools)
            # gRPC clients run on the same cells meanwhile.
            grpc_result = await grpc_client.exec(scope, tool_call_id="grpc-1", code="return (await MCP.time.getCurrentTime({timezone: 'UTC'})).isError ?? false")
            assert grpc_result.status == "completed" and grpc_result.value is False, grpc_result.raw_json
            await grpc_client.delete_catalog(scope)
        print(f"http: connect {connected:.2f}s", {k: round(v, 2) for k, v in timings.items()})
    finally:
        proc.terminate()
        assert proc.wait(timeout=60) == 0, (tmp_path / "stderr.log").read_text()[-3000:]
    log = (tmp_path / "stderr.log").read_text()
    assert '"reason": "session deleted"' in log, "closing the MCP session ends its scope"
    door.assert_nothing_left()


async def test_stateless_http_requests_are_refused_with_a_reason(tmp_path: Path) -> None:
    """A 2026-07-28 client pinned past discovery has no session to keep suspended runs in."""
    door = FrontDoorEnv.make(tmp_path)
    port = free_port()
    proc = door.start_http(port, log_path=tmp_path / "stderr.log")
    try:
        async with Client(f"http://127.0.0.1:{port}/mcp", mode="2026-07-28") as client:
            from mcp import MCPError  # noqa: PLC0415

            with pytest.raises(MCPError, match="needs a session"):
                await client.list_tools()
    finally:
        proc.terminate()
        assert proc.wait(timeout=60) == 0
    door.assert_nothing_left()
