"""Shared parts of the MCP front-door tests (SPEC §3.7): the process, its MCP servers, the programs.

The front door runs as its own process, as an operator starts it
(``python -m cellblock.frontdoor``), with an in-process cellblock service on
the Docker executor (real cells) and two third-party MCP servers behind it:
``@modelcontextprotocol/server-memory`` (npm, stdio) and ``mcp-server-time`` (PyPI, stdio).
"""

from __future__ import annotations

import contextlib
import json
import os
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import docker

from tests.support.cells import cell_dirs, state_dir_in

ROOT = Path(__file__).resolve().parents[2]
MEMORY = ROOT / "node_modules/@modelcontextprotocol/server-memory/dist/index.js"
IMAGE = os.environ.get("CELLBLOCK_IMAGE", "cellblock-cell:dev")
CELL_LABEL = "io.cellblock.cell"

#: Calls both servers, suspends with yield_control, and finishes after `wait`.
PROGRAM = """
const created = await MCP.memory.createEntities({ entities: [
  { name: "Ada Lovelace", entityType: "person", observations: ["born 1815"] },
  { name: "Charles Babbage", entityType: "person", observations: ["born 1791"] },
] });
const now = await MCP.time.getCurrentTime({ timezone: "UTC" });
const t = now.structuredContent ?? JSON.parse(now.content[0].text);
console.log("created " + created.content.length + " block(s)");
const resumed = await yield_control("checkpoint");
const graph = await MCP.memory.readGraph();
const g = graph.structuredContent ?? JSON.parse(graph.content[0].text);
const converted = await MCP.time.convertTime({ source_timezone: "UTC", time: "12:00", target_timezone: "Asia/Tokyo" });
const c = converted.structuredContent ?? JSON.parse(converted.content[0].text);
json({ step: "after wait" });
return {
  people: g.entities.map((e) => e.name).sort(),
  births: g.entities.flatMap((e) => e.observations).map((o) => Number(o.slice(5))).sort(),
  timezone: t.timezone,
  yearIsNumber: Number(t.datetime.slice(0, 4)) >= 2024,
  resumed: resumed.status,
  tokyoDifference: c.time_difference,
};
"""

EXPECTED_VALUE = {
    "people": ["Ada Lovelace", "Charles Babbage"],
    "births": [1791, 1815],
    "timezone": "UTC",
    "yearIsNumber": True,
    "resumed": "yielded",
    "tokyoDifference": "+9.0h",
}

#: Cancelled after its first output entry: the entity must never be created.
CANCELLED_EXEC = """
console.log("started");
await new Promise((resolve) => setTimeout(resolve, 3000));
await MCP.memory.createEntities({ entities: [{ name: "After cancel", entityType: "marker", observations: [] }] });
return "ran to the end";
"""

#: Reads whether the cancelled program went on.
CHECK_CANCELLED = """
const found = await MCP.memory.searchNodes({ query: "After cancel" });
const f = found.structuredContent ?? JSON.parse(found.content[0].text);
return f.entities.length;
"""

#: Suspends at once; its wait leg is cancelled after "resumed".
CANCELLED_WAIT = """
await yield_control("before the long part");
console.log("resumed");
await new Promise((resolve) => setTimeout(resolve, 3000));
return "finished";
"""

#: Seconds the cancelled exec would have needed to create its entity, plus slack.
CANCELLED_EXEC_WOULD_FINISH_S = 3.5


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@dataclass(frozen=True)
class FrontDoorEnv:
    """What one front-door process needs: its environment and where its cells put sockets."""

    env: dict[str, str]
    socket_dir: Path

    @classmethod
    def make(cls, tmp: Path) -> FrontDoorEnv:
        assert MEMORY.exists(), "run `make npm-deps` (root package.json pins @modelcontextprotocol/server-memory)"
        servers = {
            "memory": {"command": ["node", str(MEMORY)], "env": {"MEMORY_FILE_PATH": str(tmp / "memory.jsonl")}},
            "time": {"command": [sys.executable, "-m", "mcp_server_time", "--local-timezone", "UTC"]},
        }
        socket_dir = tmp / "cells"
        socket_dir.mkdir()
        env = {
            **os.environ,
            "PYTHONPATH": os.pathsep.join(str(ROOT / p) for p in ("proto", "server", "client")),
            "CELLBLOCK_EXECUTOR": "docker",
            "CELLBLOCK_IMAGE": IMAGE,
            "CELLBLOCK_MCP_SERVERS": json.dumps(servers),
            "CELLBLOCK_SOCKET_DIR": str(socket_dir),
            "CELLBLOCK_STATE_DIR": state_dir_in(str(socket_dir)),
            "CELLBLOCK_CODE_MODE": json.dumps({"timeoutMs": 15000}),
            "CELLBLOCK_WARM_POOL": "1",
        }
        return cls(env=env, socket_dir=socket_dir)

    def command(self, *args: str) -> list[str]:
        return [sys.executable, "-m", "cellblock.frontdoor", *args]

    def start_http(self, port: int, *args: str, log_path: Path) -> subprocess.Popen[bytes]:
        """Starts an HTTP front door and waits until it accepts connections."""
        with log_path.open("wb") as log:
            proc = subprocess.Popen(self.command("--transport", "http", "--port", str(port), *args), env=self.env, cwd=ROOT, stdout=subprocess.DEVNULL, stderr=log)
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            try:
                with socket.create_connection(("127.0.0.1", port), timeout=0.2):
                    return proc
            except OSError:
                if proc.poll() is not None:
                    raise AssertionError(f"the front door exited with {proc.returncode}: {log_path.read_text()[-2000:]}") from None
                time.sleep(0.1)
        proc.kill()
        raise AssertionError("the front door did not listen within 60 s")

    @contextlib.contextmanager
    def http(self, tmp: Path, *, also_grpc: bool = True, sessions_end: bool = True, extra: tuple[str, ...] = ()) -> Iterator[tuple[str, str]]:
        """An HTTP front door (also serving gRPC); yields ``(MCP URL, gRPC address)``.

        On exit it is stopped with SIGTERM and must exit 0; with ``sessions_end`` its log must
        show a session's scope ended by the client's ``DELETE``; nothing may be left behind.
        """
        port, grpc_port = free_port(), free_port()
        grpc_address = f"127.0.0.1:{grpc_port}"
        log_path = tmp / "stderr.log"
        proc = self.start_http(port, *(("--also-grpc", grpc_address) if also_grpc else ()), *extra, log_path=log_path)
        try:
            yield f"http://127.0.0.1:{port}/mcp", grpc_address
        finally:
            proc.terminate()
            assert proc.wait(timeout=60) == 0, log_path.read_text()[-3000:]
        if sessions_end:
            assert '"reason": "session deleted"' in log_path.read_text(), "closing the MCP session ends its scope"
        self.assert_nothing_left()

    def assert_nothing_left(self) -> None:
        """No cell container mounts this process's socket directory; no socket directory is left."""
        client = docker.from_env()
        try:
            left = [
                c.attrs.get("Names")
                for c in client.containers.list(all=True, sparse=True, filters={"label": CELL_LABEL})
                if any(str(m.get("Source", "")).startswith(str(self.socket_dir)) for m in c.attrs.get("Mounts") or [])
            ]
        finally:
            client.close()
        assert left == [], f"cell containers left behind: {left}"
        # The instance's lock file and state directory (its stable instance id) stay; no bridge directory may.
        assert cell_dirs(str(self.socket_dir)) == [], f"bridge directories left behind: {cell_dirs(str(self.socket_dir))}"


# ---------------------------------------------------------------------------
# One flow, two SDKs: each client writes a report of what it saw; one check reads it.
#
# Report keys (tool results in their MCP JSON form: content, structuredContent, isError):
#   tools: the listed tools as {name, description, inputSchema}
#   first, resumed: the exec of PROGRAM and the wait that finishes it, each with "progress"
#     (the messages of its progress notifications, parsed)
#   failed: an exec that throws
#   cancelExec: {"streamed": bool, "cancelled": bool} for CANCELLED_EXEC; check: CHECK_CANCELLED
#   parked: the exec of CANCELLED_WAIT; cancelWait: as cancelExec, for its wait
#   again: the next wait on that run (after [W06] retries while the abort lands)
#   logs: the data of every cellblock.output log message of the session, in order
#   timings: seconds per step


def model_json(result: dict[str, Any]) -> dict[str, Any]:
    """The model-facing JSON of a tool result; the structured copy is the same object."""
    assert [c["type"] for c in result["content"]] == ["text"], result
    data: dict[str, Any] = json.loads(result["content"][0]["text"])
    assert result.get("structuredContent") == data
    assert bool(result.get("isError")) is (data["status"] == "failed")
    return data


def check_report(report: dict[str, Any], expected_tools: list[dict[str, Any]] | None) -> None:
    """Asserts the issue's flow from one client's report (SPEC §3.7)."""
    tools = report["tools"]
    assert [t["name"] for t in tools] == ["exec", "wait"]
    if expected_tools is not None:
        assert tools == expected_tools, "the tools are GetToolSurface's definitions, byte for byte"
    exec_tool, wait_tool = tools
    assert "Visible servers: memory, time." in exec_tool["description"]
    assert set(exec_tool["inputSchema"]["properties"]) == {"code", "command", "language", "restartSafe"}
    assert wait_tool["inputSchema"]["required"] == ["runId"]

    first = model_json(report["first"])
    assert first["status"] == "waiting" and first["reason"] == "yield", first
    assert first["output"] == [{"type": "text", "text": "created 1 block(s)"}]
    assert report["first"]["progress"] == first["output"], "each output entry streams as a progress notification"
    resumed = model_json(report["resumed"])
    assert resumed["status"] == "completed", resumed
    assert resumed["value"] == EXPECTED_VALUE
    assert resumed["output"] == [{"type": "json", "value": {"step": "after wait"}}]
    assert report["resumed"]["progress"] == resumed["output"]
    assert resumed["telemetry"]["sources"] == {"host": 0, "mcp": 17, "client": 0}

    # Clients that opted in also get every entry as a log message (logger cellblock.output), in order.
    # (Those of the cancelled calls may be dropped by a client that already forgot the request.)
    assert report["logs"][:2] == first["output"] + resumed["output"], report["logs"]

    failed = model_json(report["failed"])
    assert failed["status"] == "failed" and "boom" in failed["error"], failed

    assert report["cancelExec"] == {"streamed": True, "cancelled": True}
    check = model_json(report["check"])
    assert check["status"] == "completed" and check["value"] == 0, "the cancelled exec never reached its second call"

    parked = model_json(report["parked"])
    assert parked["status"] == "waiting", parked
    assert report["cancelWait"] == {"streamed": True, "cancelled": True}
    again = model_json(report["again"])
    assert again["status"] == "failed" and again["code"] == "aborted", again


def programs_json() -> str:
    """The programs and constants of the flow, for the TypeScript client."""
    return json.dumps(
        {
            "program": PROGRAM,
            "cancelledExec": CANCELLED_EXEC,
            "checkCancelled": CHECK_CANCELLED,
            "cancelledWait": CANCELLED_WAIT,
            "cancelledExecWouldFinishMs": int(CANCELLED_EXEC_WOULD_FINISH_S * 1000),
        }
    )


def surface_tools(surface: Any) -> list[dict[str, Any]]:
    """A `cellblock.client.ToolSurface` as MCP tool listings ({name, description, inputSchema})."""
    return [{"name": d.name, "description": d.description, "inputSchema": d.parameters} for d in surface.tools]


async def grpc_surface(client: Any) -> list[dict[str, Any]]:
    """``GetToolSurface`` of a fresh scope with no tools on this service, as MCP tool listings."""
    from cellblock.client import Scope  # noqa: PLC0415 - keeps this module importable without the client path

    scope = Scope(session_id="frontdoor-surface", agent_run_id="check")
    await client.put_catalog(scope, [])
    try:
        return surface_tools(await client.tool_surface(scope))
    finally:
        await client.delete_catalog(scope)
