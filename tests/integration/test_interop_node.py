"""The API serves clients generated in other languages from proto/ alone.

`tests/interop/exec_client.js` is a Node.js client built only from the .proto
files (@grpc/proto-loader + @grpc/grpc-js, installed from npm by `make setup`).
It registers the example catalog, runs the shipment program with a tool
handler written in JavaScript, and must get the same result as the Python
client with the Python handlers.
"""

from __future__ import annotations

import asyncio
import json
import shutil
from pathlib import Path

import pytest

from cellblock.client import CellblockClient, Scope
from examples.data import load_tools, program
from examples.handlers import HANDLERS

pytestmark = pytest.mark.asyncio(loop_scope="session")
ROOT = Path(__file__).resolve().parents[2]


async def test_node_client_gets_the_python_clients_result(client: CellblockClient, service: object) -> None:
    node = shutil.which("node")
    assert node is not None, "Node.js is required (make setup installs it)"
    assert (ROOT / "tests" / "interop" / "node_modules" / "@grpc" / "grpc-js").is_dir(), "run `make setup` (npm ci in tests/interop) first"
    scope = Scope(session_id="interop-python", agent_run_id="interop")
    await client.put_catalog(scope, load_tools())
    python_result = await client.exec(scope, tool_call_id="interop-call", code=program("shipment"), handlers=HANDLERS)
    assert python_result.status == "completed", python_result.raw_json

    proc = await asyncio.create_subprocess_exec(
        node, str(ROOT / "tests" / "interop" / "exec_client.js"), "--target", service.address,  # type: ignore[attr-defined]
        "--session", "interop-node", "--agent-run", "interop", "--tool-call-id", "interop-call",
        cwd=str(ROOT), stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
    )
    stdout, stderr = await asyncio.wait_for(proc.communicate(), timeout=120)
    assert proc.returncode == 0, stderr.decode()
    node_result = json.loads(stdout.decode().strip().splitlines()[-1])
    python_json = json.loads(python_result.raw_json)
    assert node_result["status"] == "completed"
    assert node_result["value"] == python_json["value"] == ["SHP-1002", "SHP-1004", "SHP-1007"]
    # Same catalog, same program: the telemetry differs only in its counter scope.
    for key in ("catalogSize", "sources", "searchCount", "callCount", "visibleTools"):
        assert node_result["telemetry"][key] == python_json["telemetry"][key]
