"""The MCP front door end to end with the official MCP Python SDK client (issue #17, SPEC §3.7).

Each test starts ``python -m cellblock.frontdoor`` as its own process (in-process
cellblock service, Docker executor, real cells) with server-memory (npm) and
mcp-server-time (PyPI) behind it, and drives it as an MCP client would, over stdio and
over streamable HTTP: list the tools, run a program that calls both servers, suspend
with ``yield_control`` and finish with ``wait``, and cancel an exec and a wait leg.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import shutil
import signal
import time
import warnings
from pathlib import Path
from typing import Any

import pytest
from mcp import Client, MCPDeprecationWarning, MCPError, StdioServerParameters
from mcp.client.stdio import stdio_client
from mcp_types.version import HANDSHAKE_PROTOCOL_VERSIONS

from cellblock.client import CellblockClient, Scope
from cellblock.frontdoor import FrontDoor, stdio_session
from cellblock.server.app import ServerSettings, start_service
from cellblock.server.mcp import parse_mcp_servers
from tests.support.cells import state_dir_in
from tests.support.frontdoor import (
    CANCELLED_EXEC,
    CANCELLED_EXEC_WOULD_FINISH_S,
    CANCELLED_WAIT,
    CHECK_CANCELLED,
    IMAGE,
    PROGRAM,
    ROOT,
    FrontDoorEnv,
    check_report,
    free_port,
    grpc_surface,
    model_json,
    programs_json,
)

pytestmark = pytest.mark.asyncio(loop_scope="session")


def _dump(call: Any, progress: _Progress | None = None) -> dict[str, Any]:
    data: dict[str, Any] = call.model_dump(mode="json", by_alias=True, exclude_none=True)
    if progress is not None:
        data["progress"] = list(progress.messages)
    return data


class _Progress:
    """Collects progress messages (streamed output entries) and signals a wanted one."""

    def __init__(self) -> None:
        self.messages: list[Any] = []
        self.seen: dict[str, asyncio.Event] = {}

    def expect(self, text: str) -> asyncio.Event:
        return self.seen.setdefault(text, asyncio.Event())

    async def __call__(self, progress: float, total: float | None, message: str | None) -> None:
        entry = json.loads(message or "null")
        self.messages.append(entry)
        if isinstance(entry, dict) and entry.get("type") == "text":
            self.expect(entry["text"]).set()


async def _cancel_after(client: Client, name: str, arguments: dict[str, Any], marker: str) -> dict[str, bool]:
    """Starts a tool call and cancels it (notifications/cancelled) once ``marker`` streamed."""
    progress = _Progress()
    seen = progress.expect(marker)
    call = asyncio.ensure_future(client.call_tool(name, arguments, progress_callback=progress))
    waiter = asyncio.ensure_future(seen.wait())
    await asyncio.wait({call, waiter}, timeout=60, return_when=asyncio.FIRST_COMPLETED)
    waiter.cancel()
    ended_first = call.done()
    call.cancel()
    try:
        await call
        cancelled = False
    except asyncio.CancelledError:
        cancelled = True
    return {"streamed": seen.is_set(), "cancelled": cancelled and not ended_first}


async def _wait_after_abort(client: Client, run_id: str) -> Any:
    """``wait`` on a run whose leg was just cancelled: [W06] until the abort has landed, then the answer."""
    deadline = time.monotonic() + 20
    while True:
        again = await client.call_tool("wait", {"runId": run_id})
        if "already being resumed" not in again.content[0].text or time.monotonic() > deadline:
            return again
        await asyncio.sleep(0.1)


async def python_flow(client: Client) -> dict[str, Any]:
    """The issue's flow with the Python SDK; returns the report `check_report` reads."""
    report: dict[str, Any] = {"timings": {}}
    timings = report["timings"]
    t0 = time.monotonic()
    report["tools"] = [t.model_dump(mode="json", by_alias=True, exclude_none=True, include={"name", "description", "input_schema"}) for t in (await client.list_tools()).tools]

    t = time.monotonic()
    progress = _Progress()
    report["first"] = _dump(await client.call_tool("exec", {"code": PROGRAM}, progress_callback=progress), progress)
    progress = _Progress()
    run_id = json.loads(report["first"]["content"][0]["text"]).get("runId", "")
    report["resumed"] = _dump(await client.call_tool("wait", {"runId": run_id}, progress_callback=progress), progress)
    timings["exec+wait"] = time.monotonic() - t

    report["failed"] = _dump(await client.call_tool("exec", {"code": "throw new Error('boom')"}))

    t = time.monotonic()
    report["cancelExec"] = await _cancel_after(client, "exec", {"code": CANCELLED_EXEC}, "started")
    await asyncio.sleep(max(0.0, CANCELLED_EXEC_WOULD_FINISH_S - (time.monotonic() - t)))
    report["check"] = _dump(await client.call_tool("exec", {"code": CHECK_CANCELLED}))
    timings["cancel exec"] = time.monotonic() - t

    t = time.monotonic()
    report["parked"] = _dump(await client.call_tool("exec", {"code": CANCELLED_WAIT}))
    parked_id = json.loads(report["parked"]["content"][0]["text"]).get("runId", "")
    report["cancelWait"] = await _cancel_after(client, "wait", {"runId": parked_id}, "resumed")
    report["again"] = _dump(await _wait_after_abort(client, parked_id))
    timings["cancel wait"] = time.monotonic() - t
    timings["flow"] = time.monotonic() - t0
    return report


async def _python_flow_over(target: Any) -> dict[str, Any]:
    """The flow with the client opted in to log messages (log_level on 2026-07-28, logging/setLevel before)."""
    logs: list[Any] = []

    async def on_log(params: Any) -> None:
        if params.logger == "cellblock.output":
            logs.append(params.data)

    started = time.monotonic()
    async with Client(target, read_timeout_seconds=60, logging_callback=on_log, log_level="info") as client:
        report = {"connectSeconds": time.monotonic() - started, "protocolVersion": client.protocol_version}
        if client.protocol_version in HANDSHAKE_PROTOCOL_VERSIONS:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore", MCPDeprecationWarning)
                await client.set_logging_level("info")
        report |= await python_flow(client)
    report["logs"] = logs
    return report


TS_FLOW = ROOT / "tests" / "frontdoor_ts" / "flow.mjs"


async def _ts_flow(door: FrontDoorEnv, tmp_path: Path, *target: str) -> dict[str, Any]:
    """The same flow from the official TypeScript SDK client (tests/frontdoor_ts, pinned by its lock file)."""
    node = shutil.which("node")
    assert node is not None, "Node.js is required (make setup installs it)"
    assert (ROOT / "tests/frontdoor_ts/node_modules/@modelcontextprotocol/sdk").is_dir(), "run `make npm-deps` (npm ci in tests/frontdoor_ts)"
    programs = tmp_path / "programs.json"
    programs.write_text(programs_json())
    with (tmp_path / "node-stderr.log").open("wb") as errlog:
        proc = await asyncio.create_subprocess_exec(
            node, str(TS_FLOW), "--programs", str(programs), *target, cwd=str(ROOT), env=door.env, stdout=asyncio.subprocess.PIPE, stderr=errlog
        )
        stdout, _ = await asyncio.wait_for(proc.communicate(), timeout=150)
    assert proc.returncode == 0, (tmp_path / "node-stderr.log").read_text()[-3000:]
    report: dict[str, Any] = json.loads(stdout.decode().strip().splitlines()[-1])
    return report


@pytest.mark.parametrize("sdk", ["python", "typescript"])
async def test_the_flow_over_stdio(sdk: str, tmp_path: Path) -> None:
    door = FrontDoorEnv.make(tmp_path)
    started = time.monotonic()
    if sdk == "python":
        params = StdioServerParameters(command=door.command()[0], args=door.command()[1:], env=door.env, cwd=str(ROOT))
        with (tmp_path / "stderr.log").open("w") as errlog:
            report = await _python_flow_over(stdio_client(params, errlog=errlog))
    else:
        report = await _ts_flow(door, tmp_path, "--stdio", *door.command())
    check_report(report, None)
    print(f"{sdk} stdio: {time.monotonic() - started:.2f}s (protocol {report.get('protocolVersion')})", report["timings"])
    door.assert_nothing_left()


@pytest.mark.parametrize("sdk", ["python", "typescript"])
async def test_the_flow_over_http_with_grpc_in_the_same_process(sdk: str, tmp_path: Path) -> None:
    door = FrontDoorEnv.make(tmp_path)
    with door.http(tmp_path) as (url, grpc_address):
        async with await CellblockClient.connect(grpc_address) as grpc_client:
            # The same process serves gRPC: its surface for a fresh scope is what MCP clients list.
            surface = await grpc_surface(grpc_client)
            started = time.monotonic()
            report = await (_python_flow_over(url) if sdk == "python" else _ts_flow(door, tmp_path, "--url", url))
            check_report(report, surface)
            if sdk == "python":
                assert report["protocolVersion"] == "2025-11-25", "the front door keeps HTTP clients on sessions"
            # gRPC clients run on the same cells and hosted MCP servers.
            scope = Scope(session_id="frontdoor-grpc", agent_run_id="check")
            await grpc_client.put_catalog(scope, [])
            grpc_result = await grpc_client.exec(scope, tool_call_id="grpc-1", code="return (await MCP.time.getCurrentTime({timezone: 'UTC'})).isError ?? false")
            assert grpc_result.status == "completed" and grpc_result.value is False, grpc_result.raw_json
            await grpc_client.delete_catalog(scope)
    print(f"{sdk} http: {time.monotonic() - started:.2f}s", report["timings"])


async def test_stateless_http_requests_are_refused_with_a_reason(tmp_path: Path) -> None:
    """A 2026-07-28 client pinned past discovery has no session to keep suspended runs in."""
    door = FrontDoorEnv.make(tmp_path)
    with door.http(tmp_path, also_grpc=False, sessions_end=False) as (url, _):
        async with Client(url, mode="2026-07-28") as client:
            with pytest.raises(MCPError, match="needs a session"):
                await client.list_tools()


async def test_an_idle_http_session_ends_its_scope_and_discards_its_runs(tmp_path: Path) -> None:
    door = FrontDoorEnv.make(tmp_path)
    with door.http(tmp_path, also_grpc=False, sessions_end=False, extra=("--session-idle", "1")) as (url, _):
        client = Client(url, read_timeout_seconds=60)
        await client.__aenter__()
        try:
            parked = json.loads((await client.call_tool("exec", {"code": "await yield_control(); return 1"})).content[0].text)
            assert parked["status"] == "waiting", parked
            log = tmp_path / "stderr.log"
            deadline = time.monotonic() + 30
            while '"reason": "idle"' not in log.read_text() and time.monotonic() < deadline:
                await asyncio.sleep(0.2)
            closed = [json.loads(line) for line in log.read_text().splitlines() if '"frontdoor.session_closed"' in line]
            assert [(c["reason"], c["discarded_runs"]) for c in closed] == [("idle", 1)], closed
        finally:
            # The SDK forgot the session too: closing it may fail; the scope is gone either way.
            with contextlib.suppress(Exception):
                await client.__aexit__(None, None, None)


async def test_connect_fronts_a_running_service_with_its_hosted_servers(tmp_path: Path) -> None:
    """``--connect``: the front door starts no service; the remote one's hosted MCP servers are the catalog."""
    door = FrontDoorEnv.make(tmp_path)
    servers = parse_mcp_servers(door.env["CELLBLOCK_MCP_SERVERS"])
    settings = ServerSettings(address="127.0.0.1:0", executor="docker", image=IMAGE, code_mode={"enabled": True}, socket_dir=str(door.socket_dir), state_dir=state_dir_in(str(door.socket_dir)), mcp_servers=servers, warm_pool=0)
    service = await start_service(settings)
    try:
        async with await CellblockClient.connect(service.address) as grpc_client:
            surface = await grpc_surface(grpc_client)
        env = {k: v for k, v in door.env.items() if k != "CELLBLOCK_MCP_SERVERS"}
        command = door.command("--connect", service.address)
        params = StdioServerParameters(command=command[0], args=command[1:], env=env, cwd=str(ROOT))
        with (tmp_path / "stderr.log").open("w") as errlog:
            async with Client(stdio_client(params, errlog=errlog), read_timeout_seconds=60) as client:
                listed = (await client.list_tools()).tools
                assert [t.model_dump(mode="json", by_alias=True, exclude_none=True, include={"name", "description", "input_schema"}) for t in listed] == surface
                code = "const t = await MCP.time.getCurrentTime({ timezone: 'UTC' }); const g = await MCP.memory.readGraph(); return [t.isError ?? false, g.entities ?? g.structuredContent.entities];"
                result = model_json((await client.call_tool("exec", {"code": code})).model_dump(mode="json", by_alias=True, exclude_none=True))
                assert result["status"] == "completed" and result["value"] == [False, []], result
        log = (tmp_path / "stderr.log").read_text()
        assert '"server.started"' not in log, "with --connect the front door starts no service"
        assert '"reason": "stdio closed"' in log, "the session's scope ended with the stdio connection"
    finally:
        await service.stop()
    door.assert_nothing_left()


async def test_the_mcp_callers_trace_continues_into_the_run(tmp_path: Path) -> None:
    """A ``traceparent`` in the request's ``_meta`` parents the run's spans; the result names the trace."""
    door = FrontDoorEnv.make(tmp_path)
    spans = tmp_path / "spans.jsonl"
    env = {**door.env, "CELLBLOCK_TRACES": f"jsonfile:{spans}"}
    command = door.command()
    trace_id = "4bf92f3577b34da6a3ce929d0e0e4736"
    async with Client(StdioServerParameters(command=command[0], args=command[1:], env=env, cwd=str(ROOT)), read_timeout_seconds=60) as client:
        result = await client.call_tool("exec", {"code": "return (await MCP.time.getCurrentTime({ timezone: 'UTC' })).isError ?? false"}, meta={"traceparent": f"00-{trace_id}-00f067aa0ba902b7-01"})
    assert model_json(result.model_dump(mode="json", by_alias=True, exclude_none=True))["value"] is False
    assert result.meta is not None and result.meta["cellblock/traceId"] == trace_id
    records = [json.loads(line) for line in spans.read_text().splitlines()]
    names = {r["name"] for r in records if r["trace_id"] == trace_id}
    assert {"tools/call exec", "cell.run"} <= names, names
    door.assert_nothing_left()


async def test_refusals_name_their_reason(tmp_path: Path) -> None:
    """No MCP server: no start. Code mode not engaged for the model: no tools. Other names: unknown tool."""
    door = FrontDoorEnv.make(tmp_path)
    env = {**door.env, "CELLBLOCK_MCP_SERVERS": ""}
    proc = await asyncio.create_subprocess_exec(*door.command(), env=env, cwd=str(ROOT), stdin=asyncio.subprocess.DEVNULL, stderr=asyncio.subprocess.PIPE)
    _, stderr = await asyncio.wait_for(proc.communicate(), timeout=60)
    assert proc.returncode == 1 and b"CELLBLOCK_MCP_SERVERS names no MCP server" in stderr

    servers = parse_mcp_servers(door.env["CELLBLOCK_MCP_SERVERS"])
    settings = ServerSettings(address="127.0.0.1:0", executor="docker", image=IMAGE, code_mode={"enabled": "auto"}, socket_dir=str(door.socket_dir), state_dir=state_dir_in(str(door.socket_dir)), mcp_servers=servers, warm_pool=0)
    service = await start_service(settings)
    try:
        async with await CellblockClient.connect(service.address) as cellblock:
            # In process, through the SDK's own in-memory client: no model id, "auto" never engages.
            async with Client(FrontDoor(cellblock, stdio_session).server) as client:
                with pytest.raises(MCPError, match="does not engage code mode for model id ''"):
                    await client.list_tools()
            async with Client(FrontDoor(cellblock, stdio_session, model_id="anthropic/claude-opus-5").server) as client:
                assert [t.name for t in (await client.list_tools()).tools] == ["exec", "wait"]
                with pytest.raises(MCPError, match="Unknown tool: shell"):
                    await client.call_tool("shell", {"command": "ls"})
    finally:
        await service.stop()
    door.assert_nothing_left()


async def test_sigterm_ends_a_stdio_front_door_with_its_client_still_attached(tmp_path: Path) -> None:
    """The client keeps stdin open (no EOF): SIGTERM alone ends the sessions, the service and the process."""
    door = FrontDoorEnv.make(tmp_path)
    with (tmp_path / "stderr.log").open("wb") as errlog:
        proc = await asyncio.create_subprocess_exec(*door.command(), env=door.env, cwd=str(ROOT), stdin=asyncio.subprocess.PIPE, stdout=asyncio.subprocess.PIPE, stderr=errlog)
    assert proc.stdin is not None and proc.stdout is not None

    async def rpc(message: dict[str, Any]) -> dict[str, Any] | None:
        assert proc.stdin is not None and proc.stdout is not None
        proc.stdin.write(json.dumps(message).encode() + b"\n")
        await proc.stdin.drain()
        if "id" not in message:
            return None
        while True:
            reply: dict[str, Any] = json.loads(await asyncio.wait_for(proc.stdout.readline(), timeout=60))
            if reply.get("id") == message["id"]:
                return reply

    try:
        init = await rpc({"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {"protocolVersion": "2025-11-25", "capabilities": {}, "clientInfo": {"name": "raw", "version": "0"}}})
        assert init is not None and init["result"]["serverInfo"]["name"] == "cellblock"
        await rpc({"jsonrpc": "2.0", "method": "notifications/initialized"})
        call = await rpc({"jsonrpc": "2.0", "id": 2, "method": "tools/call", "params": {"name": "exec", "arguments": {"code": "await yield_control(); return 1"}}})
        assert call is not None and json.loads(call["result"]["content"][0]["text"])["status"] == "waiting"
        started = time.monotonic()
        proc.send_signal(signal.SIGTERM)
        assert await asyncio.wait_for(proc.wait(), timeout=30) == 0
        print(f"SIGTERM to exit: {time.monotonic() - started:.2f}s")
    finally:
        if proc.returncode is None:
            proc.kill()
            await proc.wait()
    closed = [json.loads(line) for line in (tmp_path / "stderr.log").read_text().splitlines() if '"frontdoor.session_closed"' in line]
    assert [c["discarded_runs"] for c in closed] == [1], closed
    door.assert_nothing_left()


async def test_sigterm_ends_an_http_front_door_with_a_client_still_connected(tmp_path: Path) -> None:
    """An HTTP client holds its session (and its standing GET stream) open, a leg in flight: SIGTERM still ends it all."""
    door = FrontDoorEnv.make(tmp_path)
    port = free_port()
    proc = door.start_http(port, log_path=tmp_path / "stderr.log")
    client = Client(f"http://127.0.0.1:{port}/mcp", read_timeout_seconds=60)
    try:
        await client.__aenter__()
        parked = json.loads((await client.call_tool("exec", {"code": "await yield_control(); return 1"})).content[0].text)
        assert parked["status"] == "waiting", parked
        progress = _Progress()
        started_seen = progress.expect("started")
        call = asyncio.ensure_future(client.call_tool("exec", {"code": CANCELLED_EXEC}, progress_callback=progress))
        await asyncio.wait_for(started_seen.wait(), timeout=60)
        started = time.monotonic()
        proc.terminate()
        returncode = await asyncio.get_running_loop().run_in_executor(None, proc.wait, 30)
        print(f"SIGTERM to exit: {time.monotonic() - started:.2f}s")
        assert returncode == 0
        with contextlib.suppress(BaseException):
            await asyncio.wait_for(call, timeout=10)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        with contextlib.suppress(BaseException):
            await client.__aexit__(None, None, None)
    closed = [json.loads(line) for line in (tmp_path / "stderr.log").read_text().splitlines() if '"frontdoor.session_closed"' in line]
    assert [(c["reason"], c["aborted_legs"], c["discarded_runs"]) for c in closed] == [("front door stopped", 1, 1)], closed
    door.assert_nothing_left()


async def test_a_stdio_client_that_dies_mid_leg_ends_the_front_door_cleanly(tmp_path: Path) -> None:
    """Both pipes close while a leg runs (the client process died): its leg is aborted, the exit is clean."""
    door = FrontDoorEnv.make(tmp_path)
    with (tmp_path / "stderr.log").open("wb") as errlog:
        proc = await asyncio.create_subprocess_exec(*door.command(), env=door.env, cwd=str(ROOT), stdin=asyncio.subprocess.PIPE, stdout=asyncio.subprocess.PIPE, stderr=errlog)
    assert proc.stdin is not None and proc.stdout is not None
    messages = [
        {"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {"protocolVersion": "2025-11-25", "capabilities": {}, "clientInfo": {"name": "raw", "version": "0"}}},
        {"jsonrpc": "2.0", "method": "notifications/initialized"},
        {"jsonrpc": "2.0", "id": 2, "method": "tools/call", "params": {"name": "exec", "_meta": {"progressToken": 1}, "arguments": {"code": "console.log('started'); await new Promise((r) => setTimeout(r, 8000)); return 1"}}},
    ]
    try:
        proc.stdin.write(json.dumps(messages[0]).encode() + b"\n")
        assert b'"serverInfo"' in await asyncio.wait_for(proc.stdout.readline(), timeout=60)
        proc.stdin.write(b"".join(json.dumps(m).encode() + b"\n" for m in messages[1:]))
        await proc.stdin.drain()
        log = tmp_path / "stderr.log"
        while b"notifications/progress" not in await asyncio.wait_for(proc.stdout.readline(), timeout=60):
            pass
        proc.stdin.close()
        proc._transport.get_pipe_transport(1).close()  # type: ignore[attr-defined]  # the client's read end goes too
        assert await asyncio.wait_for(proc.wait(), timeout=30) == 0, log.read_text()[-3000:]
    finally:
        if proc.returncode is None:
            proc.kill()
            await proc.wait()
    text = (tmp_path / "stderr.log").read_text()
    assert "Traceback" not in text, text[-3000:]
    closed = [json.loads(line) for line in text.splitlines() if '"frontdoor.session_closed"' in line]
    # The leg ends by whichever comes first: the front door's cancelled exec call (a transport
    # cancellation ends a leg at once, SPEC §3.6 item 1), or the session's close (then it counts it).
    assert [c["reason"] for c in closed] == ["stdio closed"] and closed[0]["aborted_legs"] in (0, 1), closed
    door.assert_nothing_left()
