"""Traces and logs of a real run: exec, 4 nested calls, a suspension and a wait (issue #7).

The service is the session's real one (gRPC on a socket, Docker cells). The
test installs the SDK's ``InMemorySpanExporter`` on the process's global
TracerProvider (set once per process, as the server entry point would) and
sends the caller's W3C ``traceparent`` in the gRPC metadata.
"""

from __future__ import annotations

import asyncio
import json
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import structlog
from opentelemetry import trace
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import SpanKind, format_span_id, format_trace_id
from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

from cellblock.client import CellblockClient, LimitOverrides, Scope, Tool
from cellblock.server.app import Service
from cellblock.server.logging import add_trace_ids
from cellblock.server.telemetry import _attributes as attr
from cellblock.server.telemetry import trace as trace_cli
from cellblock.server.telemetry._jsonfile import JsonLinesSpanExporter

pytestmark = pytest.mark.asyncio(loop_scope="session")

EXEC = "/cellblock.v1.CodeModeService/Exec"
WAIT = "/cellblock.v1.CodeModeService/Wait"
INPUT_MARKER = "input-marker-5f1c"
OUTPUT_MARKER = "output-marker-9a2e"
SOURCE_MARKER = "source-marker-77d0"
ENV_MARKER = "env-value-3b8f1d"
TOOLS = [
    Tool(source="client", owner="app", name="fast", description="Answers at once."),
    Tool(source="client", owner="app", name="slow", description="Answers when the test says so."),
]
# Two fast calls, one slow call that outlives the exec's deadline (suspension),
# then a fast call dispatched from the wait leg.
PROGRAM = f"""
const marker = "{SOURCE_MARKER}";
const a = await tools.callValue("client:app:fast", {{n: 1, note: "{INPUT_MARKER}"}});
const b = await tools.callValue("client:app:fast", {{n: 2}});
const c = await tools.callValue("client:app:slow", {{n: 3}});
const d = await tools.callValue("client:app:fast", {{n: 4}});
return [a.n, b.n, c.n, d.n];
"""


@pytest.fixture(scope="module")
def spans() -> Iterator[InMemorySpanExporter]:
    exporter = InMemorySpanExporter()
    provider = trace.get_tracer_provider()
    if not isinstance(provider, TracerProvider):
        provider = TracerProvider()
        trace.set_tracer_provider(provider)
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    yield exporter
    exporter.shutdown()  # later spans of the session are dropped


class Handlers:
    """``fast`` answers at once; ``slow`` when the test opens its gate."""

    def __init__(self) -> None:
        self.gate = asyncio.Event()

    async def fast(self, tool_input: dict[str, Any], call: Any) -> dict[str, Any]:
        return {"details": {"n": tool_input["n"], "secret": OUTPUT_MARKER}}

    async def slow(self, tool_input: dict[str, Any], call: Any) -> dict[str, Any]:
        await self.gate.wait()
        return {"details": {"n": tool_input["n"]}}

    def table(self) -> dict[str, Any]:
        return {"fast": self.fast, "slow": self.slow}


async def _finished(exporter: InMemorySpanExporter, names: set[str], trace_id: int) -> list[ReadableSpan]:
    """The trace's finished spans once every named span ended (server spans end just after the result is sent)."""
    for _ in range(100):
        found = [s for s in exporter.get_finished_spans() if s.context.trace_id == trace_id]
        if names <= {s.name for s in found}:
            return found
        await asyncio.sleep(0.05)
    raise AssertionError(f"spans missing: {names - {s.name for s in found}}")


async def _run(service: Service, scope: Scope, metadata: dict[str, str]) -> tuple[Any, Any]:
    handlers = Handlers()
    async with await CellblockClient.connect(service.address) as client:
        await client.put_catalog(scope, TOOLS)
        first = await client.exec(scope, tool_call_id="trace-exec", code=PROGRAM, handlers=handlers.table(), limits=LimitOverrides(timeout_ms=3000), metadata=metadata)
        assert first.status == "waiting", first.raw_json
        handlers.gate.set()
        done = await client.wait(scope, tool_call_id="trace-wait", run_id=first.run_id, handlers=handlers.table(), metadata=metadata)
        assert done.status == "completed", done.raw_json
        assert done.value == [1, 2, 3, 4]
    return first, done


async def test_one_trace_from_the_callers_traceparent(service: Service, scope: Scope, spans: InMemorySpanExporter, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    tracer = trace.get_tracer("test.agent")
    root = tracer.start_span("agent.turn", kind=SpanKind.CLIENT)
    carrier: dict[str, str] = {}
    TraceContextTextMapPropagator().inject(carrier, context=trace.set_span_in_context(root))
    assert set(carrier) == {"traceparent"}
    first, done = await _run(service, scope, carrier)
    root.end()
    trace_id = root.get_span_context().trace_id
    got = await _finished(spans, {EXEC, WAIT, "cell.run", "cell.acquire", "bridge.tool_call", "snapshot.store", "snapshot.restore"}, trace_id)

    # The trace id is returned in every result.
    assert first.trace_id == done.trace_id == format_trace_id(trace_id)
    assert len(first.trace_id) == 32

    by_name: dict[str, list[ReadableSpan]] = {}
    for s in got:
        by_name.setdefault(s.name, []).append(s)
    root_id = root.get_span_context().span_id
    # One root: the caller's span; both RPC server spans hang under it.
    (exec_span,) = by_name[EXEC]
    (wait_span,) = by_name[WAIT]
    for rpc in (exec_span, wait_span):
        assert rpc.kind == SpanKind.SERVER
        assert rpc.parent is not None and rpc.parent.span_id == root_id and rpc.parent.is_remote
    assert exec_span.attributes[attr.RUN_ID] == first.run_id
    assert exec_span.attributes[attr.RUN_STATUS] == "waiting"
    assert exec_span.attributes[attr.SESSION_ID] == scope.session_id
    assert exec_span.attributes[attr.CATALOG_SIZE] == 2
    assert wait_span.attributes[attr.RUN_STATUS] == "completed"
    assert [s.name for s in got if s.parent is None] == ["agent.turn"], "the only root is the caller's span"

    # Cell spans for both legs, with container id and image.
    cells = by_name["cell.run"]
    assert sorted(c.parent.span_id for c in cells if c.parent) == sorted([exec_span.context.span_id, wait_span.context.span_id])
    for cell in cells:
        assert cell.attributes[attr.CONTAINER_ID]
        assert cell.attributes[attr.CONTAINER_IMAGE_NAME] == service.executor.image
        assert str(cell.attributes[attr.CELL_ID]).startswith("cell_")
    acquires = by_name["cell.acquire"]
    assert len(acquires) == 2
    assert {a.parent.span_id for a in acquires if a.parent} == {c.context.span_id for c in cells}
    assert all(a.attributes[attr.CONTAINER_ID] for a in acquires)
    exec_cell = next(c for c in cells if c.parent and c.parent.span_id == exec_span.context.span_id)
    wait_cell = next(c for c in cells if c is not exec_cell)

    # Nested calls: all parented under the exec span, also the one the wait leg dispatched.
    calls = by_name["bridge.tool_call"]
    assert len(calls) == 4
    assert all(c.parent is not None and c.parent.span_id == exec_span.context.span_id for c in calls)
    assert sorted(str(c.attributes[attr.TOOL_ID]) for c in calls) == ["client:app:fast"] * 3 + ["client:app:slow"]
    assert all(c.attributes[attr.TOOL_SOURCE] == "client" and c.attributes[attr.TOOL_CALL_STATUS] == "ok" for c in calls)
    assert all(int(c.attributes[attr.TOOL_CALL_DURATION_MS]) >= 0 for c in calls)
    slow = next(c for c in calls if c.attributes[attr.TOOL_ID] == "client:app:slow")
    assert slow.end_time > wait_span.start_time, "the slow call's span lasts across the suspension"
    linked = [c for c in calls if c.links]
    assert len(linked) == 1 and linked[0].links[0].context.span_id == wait_cell.context.span_id
    assert linked[0].start_time > wait_span.start_time

    # Snapshots: stored when the exec leg suspended, restored in the wait leg.
    (store,) = by_name["snapshot.store"]
    (restore,) = by_name["snapshot.restore"]
    assert store.parent is not None and store.parent.span_id == exec_cell.context.span_id
    assert restore.parent is not None and restore.parent.span_id == wait_cell.context.span_id
    assert store.attributes[attr.SNAPSHOT_BYTES] == first.metadata.snapshot_bytes > 0
    assert int(store.attributes[attr.SNAPSHOT_RAW_BYTES]) >= int(store.attributes[attr.SNAPSHOT_BYTES])
    assert restore.attributes[attr.SNAPSHOT_BYTES] == first.metadata.snapshot_bytes
    assert int(restore.attributes[attr.RESUME_MS]) >= 0

    # Nothing of the program, its inputs or outputs is in any attribute.
    for s in got:
        text = json.dumps(dict(s.attributes or {}), default=str)
        for marker in (INPUT_MARKER, OUTPUT_MARKER, SOURCE_MARKER):
            assert marker not in text, (s.name, marker)

    # The same spans through the JSON-lines exporter and `cellblock-trace`.
    path = tmp_path / "spans.jsonl"
    exporter = JsonLinesSpanExporter(path)
    exporter.export([s for s in got if s.name != "agent.turn"])  # the server's file has no caller spans
    exporter.shutdown()
    capsys.readouterr()
    assert trace_cli.main(["--file", str(path), first.run_id]) == 0
    tree = capsys.readouterr().out.splitlines()
    assert tree[0] == f"trace {first.trace_id}"
    tops = [line for line in tree[1:] if not line.startswith(("├", "└", "│", " "))]
    assert [t.split()[0] for t in tops] == [EXEC, WAIT]
    assert all(t.endswith(f"(caller span {format_span_id(root_id)})") for t in tops)
    assert sum("bridge.tool_call" in line for line in tree) == 4
    assert sum("cell.run" in line for line in tree) == 2
    assert trace_cli.main(["--file", str(path), "run_" + "0" * 32]) == 1
    capsys.readouterr()
    assert trace_cli.main(["--file", str(path), first.trace_id]) == 0
    assert capsys.readouterr().out.splitlines() == tree, "the trace id selects the same spans here"


async def test_logs_carry_ids_and_no_inputs_outputs_or_env_values(service: Service, scope: Scope, spans: InMemorySpanExporter, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("CELLBLOCK_TEST_TOKEN", ENV_MARKER)
    # The configured chain's id processors, then capture (capture_logs drops the configured processors).
    with structlog.testing.capture_logs(processors=[structlog.contextvars.merge_contextvars, add_trace_ids]) as logs:
        first, done = await _run(service, scope, {})
        await asyncio.sleep(0.1)
    rpc_lines = [e for e in logs if e["event"] == "rpc.completed"]
    # One canonical line per RPC: PutCatalog, Exec, Wait.
    assert sorted(e["rpc"] for e in rpc_lines) == ["PutCatalog", "exec", "wait"], rpc_lines
    assert all(e["log_level"] == "info" for e in rpc_lines)
    put, exec_line, wait_line = (next(e for e in rpc_lines if e["rpc"] == name) for name in ("PutCatalog", "exec", "wait"))
    assert put["grpc_code"] == "OK" and put["session_id"] == scope.session_id and put["agent_run_id"] == scope.agent_run_id
    assert exec_line["status"] == "waiting" and exec_line["code"] == ""
    assert wait_line["status"] == "completed"
    for line in (exec_line, wait_line):
        assert line["session_id"] == scope.session_id and line["agent_run_id"] == scope.agent_run_id
        assert line["run_id"] == first.run_id
        assert line["tool_call_id"] == "trace-exec"
        assert line["cell_id"].startswith("cell_")
        assert isinstance(line["duration_ms"], int)
    assert wait_line["wait_tool_call_id"] == "trace-wait"
    assert exec_line["trace_id"] == first.trace_id and wait_line["trace_id"] == done.trace_id
    assert exec_line["cell_id"] != wait_line["cell_id"]
    text = json.dumps(logs, default=str)
    for marker in (INPUT_MARKER, OUTPUT_MARKER, SOURCE_MARKER, ENV_MARKER):
        assert marker not in text, marker
    assert os.environ["CELLBLOCK_TEST_TOKEN"] == ENV_MARKER
