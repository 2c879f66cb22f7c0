"""One conformance table: the Python, TypeScript and Go clients against one real service.

Each client has a small CLI (clients/python/conformance.py, clients/typescript/src/conformance.ts,
clients/go/cmd/cellblock-conformance) that runs one scenario of clients/conformance/scenarios.json
against a service address and prints its observations as one JSON object (clients/README.md).
The test starts ONE service (real Docker cells, at most one leg at a time so admission control
is observable), builds the TypeScript and Go CLIs once, runs every scenario with every client,
prints a scenario x client table, and fails when a client's observations differ from the
expectations below (taken from SPEC §3-§14) or from the other clients'.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import docker
import pytest
import pytest_asyncio

from cellblock.server.app import ServerSettings, Service, start_service
from tests.support.cells import state_dir_in

pytestmark = pytest.mark.asyncio(loop_scope="session")

ROOT = Path(__file__).resolve().parents[2]
SPEC = ROOT / "clients" / "conformance" / "scenarios.json"
IMAGE = os.environ.get("CELLBLOCK_IMAGE", "cellblock-cell:dev")
CLIENTS = ("python", "typescript", "go")
R07 = "execution aborted by the caller; the cell was stopped and this run cannot be resumed."
W04 = "this run belongs to a different session; only the session that started it can wait on it."
W06 = "this run is already being resumed by another wait; let that call return first."
SCENARIO_TIMEOUT_S = 90

# Expectations per scenario: (path into the observations, expected value). Every client must
# meet all of them, and all clients must print identical observations.
EXPECTED: dict[str, list[tuple[tuple[Any, ...], Any]]] = {
    "main_job": [
        (("catalog", "catalogSize"), 11),
        (("surface", "engaged"), True),
        (("surface", "names"), ["exec", "wait"]),
        (("leg", "status"), "completed"),
        (("leg", "result", "value"), {
            "firstHit": "client:app:echo",
            "echoed": {"echo": {"msg": "hi"}},
            "looked": {"value": "v-k1"},
            "fullTool": "client:app:echo",
            "fullResult": {"content": [{"type": "text", "text": "echo"}], "details": {"echo": {"n": 2}}},
            "viaName": {"echo": {"z": True}},
        }),
        (("leg", "bridgeCalls"), {"search": 1, "describe": 0, "call": 4}),
        (("leg", "result", "telemetry", "callCount"), 4),
        (("calls", "*", "method"), ["callValue", "callValue", "call", "callValue"]),
        (("calls", "*", "n"), [1, 2, 3, 4]),
        (("calls", "*", "idsWellFormed"), [True] * 4),
        (("calls", 1, "source"), "host"),
    ],
    "tool_errors": [
        (("leg", "status"), "completed"),
        (("leg", "result", "value"), {
            "handler_throws": {"error": "boom 1", "code": None},
            "refused_invalid_input": {"error": "n must be positive, got -1", "code": None},
            "blocked": {"error": 'Tool "client:app:blocked" was blocked before execution: needs approval', "code": None},
            "cancelled": {"error": 'Tool "client:app:cancelled" was cancelled before it returned.', "code": None},
            "empty_failure": {"error": 'Tool "client:app:silent" failed without an error message.', "code": None},
            "unknown_tool": {
                "error": "Unknown tool: client:app:nope. Did you mean: blocked, boom, cancelled? Find tools with "
                "tools.search, inspect one with tools.describe, then call it with its exact id or name.",
                "code": None,
            },
            "no_handler": {"error": "no handler registered for client:app:unserved", "code": None},
            "result_too_large": {
                "error": 'Tool "client:app:huge" returned 100023 bytes, more than this cell accepts (65536 bytes); ask for less data.',
                "code": None,
            },
            "output_contract": {"error": 'Tool "host:core:lookup" returned details that do not match its declared outputSchema.', "code": None},
            "input_contract": {
                "error": 'Tool "host:core:lookup" input does not match its parameters: missing required argument(s): key; unexpected argument(s): nope.',
                "code": "input_contract",
            },
        }),
        # unknown_tool and input_contract never reach the runtime; unserved reaches no handler.
        (("calls", "*", "name"), ["boom", "refuse", "blocked", "cancelled", "silent", "huge", "lookup"]),
    ],
    "result_over_message_cap": [
        # Over the 64 MiB message cap the client sends oversized_bytes, not the result (SPEC §3.5 item 5).
        (("leg", "result", "value"), {
            "error": 'Tool "client:app:huge" returned 67108887 bytes, more than this cell accepts (10485760 bytes); ask for less data.',
            "afterwards": {"echo": {"still": "open"}},
        }),
        (("calls", "*", "name"), ["huge", "echo"]),
    ],
    "uncaught_refusal": [
        (("leg", "status"), "failed"),
        (("leg", "code"), "invalid_input"),
        (("leg", "result", "failurePhase"), "bridge"),
        (("leg", "result", "error"), "Error: n must be positive, got -2"),
        (("leg", "result", "bridgeDispatchStarted"), True),
    ],
    "output_stream": [
        (("leg", "result", "value"), "done"),
        (("streamed",), [{"type": "text", "text": "one 1"}, {"type": "text", "text": "two"}, {"type": "json", "value": {"three": 3}}, {"type": "text", "text": "five"}]),
        (("leg", "result", "output"), [{"type": "text", "text": "one 1"}, {"type": "text", "text": "two"}, {"type": "json", "value": {"three": 3}}, {"type": "text", "text": "five"}]),
    ],
    "suspend_resume": [
        # Two calls outstanding at the deadline: the run parks without a cell.
        (("first", "status"), "waiting"),
        (("first", "runIdSet"), True),
        (("first", "result", "reason"), "pending_tools"),
        (("first", "result", "pendingToolCalls"), [{"id": "bridge:callValue:1", "method": "callValue"}, {"id": "bridge:callValue:2", "method": "callValue"}]),
        (("first", "result", "output"), [{"type": "text", "text": "before"}]),
        (("run",), {
            "state": "suspended", "snapshotStored": True, "expires": True,
            "pending": [{"id": "bridge:callValue:1", "method": "callValue", "dispatched": True}, {"id": "bridge:callValue:2", "method": "callValue", "dispatched": True}],
        }),
        # Late result 1 finished between the legs, late result 2 while the wait stream was open.
        (("second", "status"), "completed"),
        (("second", "result", "value"), ["late-1", "late-2"]),
        (("second", "result", "output"), [{"type": "text", "text": "after late-1"}]),
        (("second", "legCount"), 2),
        (("calls", "*", "input"), [{"i": 2}, {"i": 1}]),
        (("calls", "*", "idsWellFormed"), [True, True]),
        (("streamed",), [{"type": "text", "text": "before"}, {"type": "text", "text": "after late-1"}]),
    ],
    "yield_resume": [
        (("first", "result", "reason"), "yield"),
        (("first", "result", "pendingToolCalls"), [{"id": "bridge:yield:1", "method": "yield"}]),
        (("second", "result", "value"), {"status": "yielded", "reason": "need a decision"}),
        (("second", "legCount"), 2),
    ],
    "cancel_message": [
        (("leg", "status"), "failed"),
        (("leg", "code"), "aborted"),
        (("leg", "result", "error"), R07),
        (("leg", "result", "failurePhase"), "host"),
        (("cancelNotices",), [1]),
        (("streamed",), [{"type": "text", "text": "started"}]),
    ],
    "cancel_running": [
        (("previousState",), ["running"]),
        (("leg", "code"), "aborted"),
        (("leg", "result", "error"), R07),
    ],
    "cancel_suspended": [
        (("first", "status"), "waiting"),
        (("previousState",), "suspended"),
        (("cancelAgain",), "unspecified"),
        (("wait", "code"), "aborted"),
        (("wait", "result", "error"), R07),
        (("getRunAfter",), "NOT_FOUND"),
    ],
    "admission": [
        (("refused",), [{"code": "RESOURCE_EXHAUSTED", "message": "too many legs are running on this instance (limit 1); retry shortly"}]),
        (("leg", "result", "value"), {"released": True}),
    ],
    "wait_refused": [
        # Another session's wait is refused before it touches the run (SPEC §5.2): the owner's
        # in-flight `hold` call survives it, its late result goes out on the owner's next wait.
        (("first", "status"), "waiting"),
        (("first", "result", "reason"), "pending_tools"),
        (("refused", "status"), "failed"),
        (("refused", "code"), "invalid_input"),
        (("refused", "result", "failurePhase"), "input"),
        (("refused", "result", "error"), W04),
        (("final", "status"), "completed"),
        (("final", "result", "value"), "released!"),
        (("waits",), 1),
        (("calls", "*", "input"), [{"step": 1}]),
    ],
    "second_wait": [
        # A second wait while the first one's cell serves the run is refused, and changes nothing
        # (SPEC §5.2): the hold call dispatched on the first wait answers on that wait, which completes.
        # With one leg slot the refusal is RESOURCE_EXHAUSTED; SECOND_WAIT_W06 below has [W06].
        (("first", "status"), "waiting"),
        (("second",), {"code": "RESOURCE_EXHAUSTED", "message": "too many legs are running on this instance (limit 1); retry shortly"}),
        (("resumed", "status"), "completed"),
        (("resumed", "result", "value"), "released-1 released-2"),
        (("resumed", "legCount"), 2),
        (("calls", "*", "input"), [{"step": 1}, {"step": 2}]),
    ],
    "grpc_status": [
        (("putCatalogBlankScope", "code"), "INVALID_ARGUMENT"),
        (("putCatalogBadSchema", "code"), "INVALID_ARGUMENT"),
        (("listCatalogsBlankSession", "code"), "INVALID_ARGUMENT"),
        (("execFirstMessageNotStart", "code"), "INVALID_ARGUMENT"),
        (("waitFirstMessageNotStart", "code"), "INVALID_ARGUMENT"),
        (("execClosedBeforeStart",), {"code": "INVALID_ARGUMENT", "message": "the exec stream closed before its start message"}),
        (("getCatalogMissing", "code"), "NOT_FOUND"),
        (("getRunUnknown", "code"), "NOT_FOUND"),
        (("cancelRunUnknown", "code"), "NOT_FOUND"),
        (("execWithoutCatalog", "code"), "FAILED_PRECONDITION"),
        # Argument problems are results, never gRPC errors (SPEC §3.1 item 1).
        (("execBadArguments", "code"), "invalid_input"),
        (("execBadArguments", "result", "failurePhase"), "input"),
        (("execBadArguments", "result", "error"), "code must be a non-empty string (command is accepted as an alias)."),
    ],
}


# second_wait on a service with two leg slots: the second wait reaches the run and gets [W06].
SECOND_WAIT_W06 = [expectation for expectation in EXPECTED["second_wait"] if expectation[0] != ("second",)] + [
    (("second", "status"), "failed"),
    (("second", "code"), "invalid_input"),
    (("second", "result", "failurePhase"), "input"),
    (("second", "result", "error"), W06),
]


@dataclass(frozen=True)
class BuiltClients:
    """The command prefix of each client's CLI, and how long building it took."""

    commands: dict[str, list[str]]
    build_seconds: dict[str, float]


def dig(value: Any, path: tuple[Any, ...]) -> Any:
    """Follows `path` into nested dicts/lists; ``"*"`` maps the rest of the path over a list."""
    for i, key in enumerate(path):
        if key == "*":
            return [dig(item, path[i + 1:]) for item in value]
        value = value[key]
    return value


def differences(expected: Any, got: Any, path: str = "") -> list[str]:
    """The leaf paths where two JSON values differ, as ``path: expected X, got Y`` lines."""
    if isinstance(expected, dict) and isinstance(got, dict):
        return [line for key in sorted(set(expected) | set(got), key=str)
                for line in differences(expected.get(key, "<absent>"), got.get(key, "<absent>"), f"{path}.{key}")]
    if isinstance(expected, list) and isinstance(got, list) and len(expected) == len(got):
        return [line for i, (e, g) in enumerate(zip(expected, got, strict=True)) for line in differences(e, g, f"{path}[{i}]")]
    return [] if expected == got else [f"{path or '.'}: expected {json.dumps(expected)[:300]}, got {json.dumps(got)[:300]}"]


def check(scenario: str, observed: dict[str, Any], expectations: list[tuple[tuple[Any, ...], Any]] | None = None) -> list[str]:
    problems = []
    for path, expected in EXPECTED[scenario] if expectations is None else expectations:
        try:
            got = dig(observed, path)
        except (KeyError, IndexError, TypeError) as exc:
            problems.append(f"{'.'.join(map(str, path))}: missing ({exc!r})")
            continue
        problems.extend(differences(expected, got, ".".join(map(str, path))))
    return problems


@pytest.fixture(scope="module")
def built(tmp_path_factory: pytest.TempPathFactory) -> Iterator[BuiltClients]:
    """Builds the TypeScript and Go CLIs once (per test session)."""
    node, go = shutil.which("node"), shutil.which("go")
    assert node and go, "node and go are required (make client-deps installs them)"
    ts_dir = ROOT / "clients" / "typescript"
    assert (ts_dir / "node_modules" / ".bin" / "tsc").exists(), "run `make client-deps` (npm ci in clients/typescript)"
    started = time.monotonic()
    subprocess.run([str(ts_dir / "node_modules" / ".bin" / "tsc"), "-p", str(ts_dir)], check=True, timeout=300)
    ts_s = time.monotonic() - started
    go_bin = tmp_path_factory.mktemp("go") / "cellblock-conformance"
    env = dict(os.environ, GOCACHE=os.environ.get("GOCACHE", str(ROOT / "build" / "go-cache")))
    started = time.monotonic()
    subprocess.run([str(ROOT / "clients" / "go" / "build.sh"), str(go_bin)], check=True, timeout=600, env=env)
    go_s = time.monotonic() - started
    yield BuiltClients(
        commands={
            "python": [sys.executable, str(ROOT / "clients" / "python" / "conformance.py")],
            "typescript": [node, str(ts_dir / "dist" / "conformance.js")],
            "go": [str(go_bin)],
        },
        build_seconds={"typescript": ts_s, "go": go_s},
    )


@contextlib.asynccontextmanager
async def serving(max_concurrent_legs: int) -> AsyncIterator[Service]:
    """One service on real Docker cells with `max_concurrent_legs` leg slots; no cell is left afterwards."""
    with tempfile.TemporaryDirectory(prefix="cellblock-conformance-cells-") as sockets:
        settings = ServerSettings(
            address="127.0.0.1:0", executor="docker", image=IMAGE, socket_dir=sockets, state_dir=state_dir_in(sockets),
            code_mode={"enabled": True, "timeoutMs": 8000}, max_concurrent_legs=max_concurrent_legs,
        )
        service: Service = await start_service(settings)
        try:
            yield service
        finally:
            await service.stop()
        assert service.executor.list_cell_containers() == []  # type: ignore[attr-defined]


@pytest_asyncio.fixture(scope="module", loop_scope="session")
async def conformance_service(docker_client: docker.DockerClient) -> AsyncIterator[Service]:
    async with serving(max_concurrent_legs=1) as service:
        yield service


async def run_cli(command: list[str], scenario: str, address: str) -> tuple[dict[str, Any] | None, str, float]:
    """Runs one CLI without blocking the service's event loop; returns (observations, stderr, seconds)."""
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(str(ROOT / p) for p in ("proto", "client")))
    started = time.monotonic()
    proc = await asyncio.create_subprocess_exec(
        *command, scenario, address, "--spec", str(SPEC), cwd=str(ROOT), env=env,
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
    )
    try:
        stdout, stderr = await asyncio.wait_for(proc.communicate(), SCENARIO_TIMEOUT_S)
    except TimeoutError:
        proc.kill()
        await proc.wait()
        return None, f"timed out after {SCENARIO_TIMEOUT_S} s", time.monotonic() - started
    seconds = time.monotonic() - started
    if proc.returncode != 0:
        return None, f"exit {proc.returncode}: {stderr.decode(errors='replace')[-2000:]}", seconds
    try:
        observed = json.loads(stdout.decode().strip().splitlines()[-1])
    except (ValueError, IndexError) as exc:
        return None, f"no JSON on stdout ({exc}): {stdout.decode(errors='replace')[-500:]}", seconds
    if isinstance(observed.get("calls"), list):
        # Handlers of concurrent calls record in the order they start running (goroutines, tasks):
        # compare calls in nested-call order.
        observed["calls"].sort(key=lambda call: call.get("n", 0))
    return observed, "", seconds


async def test_python_typescript_and_go_clients_pass_the_same_scenarios(
    conformance_service: Service, built: BuiltClients, capsys: pytest.CaptureFixture[str]
) -> None:
    scenarios = list(json.loads(SPEC.read_text())["programs"])
    assert sorted(scenarios) == sorted(EXPECTED), "every scenario in scenarios.json needs expectations here"
    cells: dict[tuple[str, str], str] = {}
    details: list[str] = []
    for scenario in scenarios:
        observed: dict[str, dict[str, Any]] = {}
        for client in CLIENTS:
            result, error, seconds = await run_cli(built.commands[client], scenario, conformance_service.address)
            if result is None:
                cells[scenario, client] = "ERROR"
                details.append(f"{scenario} / {client}: {error}")
                continue
            observed[client] = result
            problems = check(scenario, result)
            cells[scenario, client] = f"ok {seconds:4.1f}s" if not problems else f"FAIL({len(problems)})"
            details.extend(f"{scenario} / {client}: {p}" for p in problems)
        reference = observed.get("python")
        for client, result in observed.items():
            if reference is not None and result != reference:
                cells[scenario, client] = "MISMATCH"
                details.extend(f"{scenario} / {client} vs python: {line}" for line in differences(reference, result)[:10])
    width = max(map(len, scenarios))
    lines = [f"{'scenario':<{width}}  " + "  ".join(f"{c:<11}" for c in CLIENTS)]
    lines += [f"{s:<{width}}  " + "  ".join(f"{cells[s, c]:<11}" for c in CLIENTS) for s in scenarios]
    table = "\n".join(lines)
    with capsys.disabled():
        builds = ", ".join(f"{c} {t:.1f} s" for c, t in built.build_seconds.items())
        print(f"\n\nclient conformance (one service, real Docker cells; built: {builds})\n" + table)
    assert not details, table + "\n\n" + "\n".join(details)


async def test_a_second_wait_on_a_running_run_is_refused_and_changes_nothing_in_every_client(
    docker_client: docker.DockerClient, built: BuiltClients
) -> None:
    """second_wait with two leg slots: the second wait reaches the run and gets [W06] (SPEC §5.2 item 5).

    The hold call dispatched on the first wait must still answer on that wait. The TypeScript and
    Go clients rebound the run to the refused wait's stream, so that answer never reached the
    open wait: it returned `waiting` with bridge:callValue:2 pending.
    """
    details: list[str] = []
    async with serving(max_concurrent_legs=2) as service:
        for client in CLIENTS:
            result, error, _ = await run_cli(built.commands[client], "second_wait", service.address)
            if result is None:
                details.append(f"{client}: {error}")
                continue
            details.extend(f"{client}: {p}" for p in check("second_wait", result, SECOND_WAIT_W06))
    assert not details, "\n".join(details)
