"""Telemetry pieces without cells.

Canonical lines of a real gRPC server, the JSON-lines exporter and ``cellblock-trace``, SDK wiring, metrics, error heads.

Runs without Docker: the service is started with the process executor and
only RPCs that need no cell are made (one aborted Exec stream included).
"""

from __future__ import annotations

import asyncio
import json
import os
import tempfile
from collections.abc import AsyncIterator
from datetime import timedelta
from pathlib import Path
from typing import Any

import grpc
import pytest
import pytest_asyncio
import structlog
from opentelemetry import metrics
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import InMemoryMetricReader
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import Link, SpanKind, format_trace_id

from cellblock.client import CellblockClient, DeadlineExceededError, NotFoundError, Scope, Tool
from cellblock.server.app import ServerSettings, Service, start_service
from cellblock.server.cells import ProcessExecutor
from cellblock.server.config import Limits
from cellblock.server.logging import add_trace_ids, error_head
from cellblock.server.runs import RunRegistry
from cellblock.server.runs._output import OutputBudget
from cellblock.server.runs._state import Run
from cellblock.server.store import MemoryRunStore
from cellblock.server.telemetry import _attributes as attr
from cellblock.server.telemetry import _metrics
from cellblock.server.telemetry import trace as trace_cli
from cellblock.server.telemetry._interceptors import request_ids
from cellblock.server.telemetry._jsonfile import JsonLinesSpanExporter, span_record
from cellblock.server.telemetry.sdk import configure_telemetry, metric_exporter, span_processor
from cellblock.v1 import code_mode_service_pb2, code_mode_service_pb2_grpc, common_pb2, run_service_pb2
from tests.support.cells import state_dir_in

pytestmark = pytest.mark.timeout(30)

ENV_MARKER = "env-value-c0ffee42"
INPUT_MARKER = "description-marker-71aa"


class TestErrorHead:
    def test_error_class_message_and_three_frames(self) -> None:
        text = "TypeError: x is not a function\n" + "\n".join(f"    at f{i} (cellblock:user.js:{i}:3)" for i in range(1, 6))
        head = error_head(text)
        assert head["error_class"] == "TypeError"
        assert head["error"] == "x is not a function"
        assert head["stack_head"].splitlines() == ["at f1 (cellblock:user.js:1:3)", "at f2 (cellblock:user.js:2:3)", "at f3 (cellblock:user.js:3:3)"]

    def test_uncaught_value(self) -> None:
        assert error_head("Uncaught 42") == {"error_class": "Uncaught", "error": "42", "stack_head": ""}

    def test_long_message_is_cut(self) -> None:
        assert len(error_head("Error: " + "x" * 1000)["error"]) == 200


class TestRequestIds:
    def test_scope_and_run_id(self) -> None:
        req = run_service_pb2.GetRunRequest(scope=common_pb2.Scope(session_id="s", agent_run_id="a"), run_id="run_1")
        assert request_ids(req) == {"session_id": "s", "agent_run_id": "a", "run_id": "run_1"}

    def test_nothing_else_is_read(self) -> None:
        req = code_mode_service_pb2.GetToolSurfaceRequest(scope=common_pb2.Scope(session_id="s", agent_run_id="a"), model_id="m")
        assert request_ids(req) == {"session_id": "s", "agent_run_id": "a"}


@pytest_asyncio.fixture(loop_scope="function")
async def plain_service() -> AsyncIterator[Service]:
    with tempfile.TemporaryDirectory(prefix="cellblock-unit-") as sockets:
        settings = ServerSettings(address="127.0.0.1:0", executor="process", code_mode={"enabled": True}, socket_dir=sockets, state_dir=state_dir_in(sockets))
        service = await start_service(settings, executor=ProcessExecutor())
        yield service
        await service.stop(0)


@pytest.mark.asyncio(loop_scope="function")
async def test_one_canonical_line_per_rpc_with_ids_and_levels(plain_service: Service, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("CELLBLOCK_TEST_SECRET", ENV_MARKER)
    scope = Scope(session_id="sess-log", agent_run_id="agent-log")
    tools = [Tool(source="client", owner="app", name="echo", description=f"Echo {INPUT_MARKER}.")]
    with structlog.testing.capture_logs(processors=[structlog.contextvars.merge_contextvars, add_trace_ids]) as logs:
        async with await CellblockClient.connect(plain_service.address) as client:
            await client.put_catalog(scope, tools)
            await client.tool_surface(scope, "some-model")
            with pytest.raises(NotFoundError):
                await client.get_run(scope, "run_" + "0" * 32)
            await client.list_catalogs("sess-log")
        async with grpc.aio.insecure_channel(plain_service.address) as channel:
            stub = code_mode_service_pb2_grpc.CodeModeServiceStub(channel)
            call = stub.Exec(iter([code_mode_service_pb2.ExecRequest(cancel=code_mode_service_pb2.Cancel())]))
            with pytest.raises(grpc.aio.AioRpcError) as info:
                async for _ in call:
                    pass
            assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    lines = [e for e in logs if e["event"] == "rpc.completed"]
    assert [(e["rpc"], e["grpc_code"], e["log_level"]) for e in lines] == [
        ("PutCatalog", "OK", "info"),
        ("GetToolSurface", "OK", "info"),
        ("GetRun", "NOT_FOUND", "warning"),
        ("ListCatalogs", "OK", "info"),
        ("Exec", "INVALID_ARGUMENT", "warning"),
    ]
    for line in lines[:3]:
        assert line["session_id"] == "sess-log" and line["agent_run_id"] == "agent-log"
        assert isinstance(line["duration_ms"], int)
    assert lines[2]["run_id"] == "run_" + "0" * 32
    assert lines[3]["session_id"] == "sess-log"
    text = json.dumps(logs, default=str)
    assert ENV_MARKER not in text and INPUT_MARKER not in text
    assert os.environ["CELLBLOCK_TEST_SECRET"] == ENV_MARKER


@pytest.mark.asyncio(loop_scope="function")
async def test_a_unary_rpc_the_caller_abandons_is_logged_cancelled_not_unknown(plain_service: Service) -> None:
    # A registration slower than the caller's deadline (a fresh user's review: logged UNKNOWN at error level).
    schema = {"type": "object", "properties": {f"p{i}": {"type": "string", "pattern": f"^x{i}[a-z]+$"} for i in range(40)}}
    tools = [Tool(source="host", owner="core", name=f"t{i}", parameters=schema) for i in range(1500)]
    with structlog.testing.capture_logs(processors=[structlog.contextvars.merge_contextvars]) as logs:
        async with await CellblockClient.connect(plain_service.address, rpc_timeout=timedelta(milliseconds=150)) as client:
            with pytest.raises(DeadlineExceededError):
                await client.put_catalog(Scope(session_id="sess-slow", agent_run_id="a"), tools)
        for _ in range(100):  # the handler sees the cancellation a moment later
            if any(e["event"] == "rpc.completed" for e in logs):
                break
            await asyncio.sleep(0.05)
    lines = [(e["rpc"], e["grpc_code"], e["log_level"]) for e in logs if e["event"] == "rpc.completed"]
    assert lines == [("PutCatalog", "CANCELLED", "warning")], lines


def _spans(tmp_path: Path) -> tuple[Path, str]:
    """Writes a small run's spans through the JSON-lines exporter; returns the file and run id."""
    provider = TracerProvider()  # dedicated, never global
    memory = InMemorySpanExporter()
    provider.add_span_processor(SimpleSpanProcessor(memory))
    tracer = provider.get_tracer("test")
    run_id = "run_" + "ab" * 16
    with tracer.start_as_current_span("/cellblock.v1.CodeModeService/Exec", kind=SpanKind.SERVER, attributes={attr.RUN_ID: run_id}) as rpc:
        with tracer.start_as_current_span("cell.run", attributes={attr.CELL_ID: "cell_1", attr.CONTAINER_ID: "abc123"}):
            with tracer.start_as_current_span("cell.acquire"):
                pass
            with tracer.start_as_current_span("snapshot.store", attributes={attr.SNAPSHOT_BYTES: 1234}):
                pass
        with tracer.start_as_current_span("bridge.tool_call", attributes={attr.TOOL_ID: "host:a.b", attr.TOOL_CALL_STATUS: "ok"}, links=[Link(rpc.get_span_context())]):
            pass
    with tracer.start_as_current_span("/cellblock.v1.CatalogService/PutCatalog"):
        pass  # another RPC, not the run's
    path = tmp_path / "spans.jsonl"
    exporter = JsonLinesSpanExporter(path)
    assert exporter.export(memory.get_finished_spans()).name == "SUCCESS"
    exporter.shutdown()
    assert exporter.export(memory.get_finished_spans()).name == "FAILURE"
    return path, run_id


class TestJsonLinesAndTraceCli:
    def test_records_have_the_documented_keys(self, tmp_path: Path) -> None:
        path, run_id = _spans(tmp_path)
        records = [json.loads(line) for line in path.read_text("utf-8").splitlines()]
        assert len(records) == 6
        keys = {"name", "trace_id", "span_id", "parent_span_id", "kind", "start_ns", "end_ns", "status", "status_description", "attributes", "events", "links"}
        assert all(set(r) == keys for r in records)
        rpc = next(r for r in records if r["name"].endswith("/Exec"))
        assert rpc["parent_span_id"] is None and rpc["kind"] == "SERVER" and len(rpc["trace_id"]) == 32
        call = next(r for r in records if r["name"] == "bridge.tool_call")
        assert call["parent_span_id"] == rpc["span_id"] and call["links"][0]["span_id"] == rpc["span_id"]

    def test_prints_the_runs_tree_only(self, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
        path, run_id = _spans(tmp_path)
        assert trace_cli.main(["--file", str(path), run_id]) == 0
        lines = capsys.readouterr().out.splitlines()
        assert lines[0].startswith("trace ") and len(lines[0]) == len("trace ") + 32
        names = [line.lstrip("│├└─ ").split()[0] for line in lines[1:]]
        assert names == ["/cellblock.v1.CodeModeService/Exec", "cell.run", "cell.acquire", "snapshot.store", "bridge.tool_call"]
        assert lines[2].startswith("├─ cell.run") and lines[3].startswith("│  ├─ cell.acquire") and lines[5].startswith("└─ bridge.tool_call")
        assert "container=abc123" in lines[2] and "bytes=1234" in lines[4] and "tool=host:a.b" in lines[5]

    def test_unknown_run(self, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
        path, _ = _spans(tmp_path)
        assert trace_cli.main(["--file", str(path), "run_other"]) == 1
        assert "no spans of run_other" in capsys.readouterr().err

    def test_malformed_lines_are_skipped(self) -> None:
        assert trace_cli.read_spans(["", "not json", "[1]", '{"span_id": "a"}']) == [{"span_id": "a"}]


class TestSdkWiring:
    def test_exporter_names(self, tmp_path: Path) -> None:
        assert span_processor("none") is None and span_processor("") is None
        assert type(span_processor("console")).__name__ == "SimpleSpanProcessor"
        assert type(span_processor(f"jsonfile:{tmp_path / 'x.jsonl'}")).__name__ == "SimpleSpanProcessor"
        otlp = span_processor("otlp")
        assert type(otlp).__name__ == "BatchSpanProcessor"
        assert otlp is not None
        otlp.shutdown()
        assert metric_exporter("none") is None and type(metric_exporter("console")).__name__ == "ConsoleMetricExporter"
        for bad in ("jaeger", "jsonfile:"):
            with pytest.raises(ValueError, match="unknown traces exporter"):
                span_processor(bad)
        with pytest.raises(ValueError, match="unknown metrics exporter"):
            metric_exporter("statsd")

    def test_settings_from_env(self) -> None:
        settings = ServerSettings.from_env({"CELLBLOCK_TRACES": "jsonfile:/tmp/s.jsonl", "CELLBLOCK_METRICS": "otlp"})
        assert (settings.traces, settings.metrics) == ("jsonfile:/tmp/s.jsonl", "otlp")
        assert (ServerSettings.from_env({}).traces, ServerSettings.from_env({}).metrics) == ("none", "none")

    def test_none_installs_nothing(self) -> None:
        installed = configure_telemetry("none", "none")
        assert installed.tracer_provider is None and installed.meter_provider is None
        installed.shutdown()


def _metric_points(reader: InMemoryMetricReader) -> dict[str, list[Any]]:
    data = reader.get_metrics_data()
    points: dict[str, list[Any]] = {}
    for rm in data.resource_metrics if data else []:
        for sm in rm.scope_metrics:
            for m in sm.metrics:
                points.setdefault(m.name, []).extend(m.data.data_points)
    return points


class _StoredView:
    """The smallest run view the run codec can store and restore: no entries."""

    def to_state(self) -> dict[str, Any]:
        return {}

    def state_parts(self) -> list[bytes | memoryview]:
        return [b"{}"]

    def entry(self, _entry_id: str) -> None:
        return None


@pytest.mark.asyncio(loop_scope="session")
async def test_metrics_counts_histograms_and_suspended_gauge() -> None:
    provider = metrics.get_meter_provider()
    if isinstance(provider, MeterProvider):
        pytest.skip("a MeterProvider without this test's reader is already installed in this process")
    reader = InMemoryMetricReader()
    metrics.set_meter_provider(MeterProvider(metric_readers=[reader]))
    registry = RunRegistry(MemoryRunStore(64), restore_view=lambda _state, _scope: _StoredView())
    # The gauge sums every live registry of the process: registries of earlier tests'
    # services (not yet collected) must not count in this one.
    _metrics._registries.clear()
    _metrics.observe_registry(registry)
    run = Run(run_id="run_x", session_id="s", agent_run_id="a", tool_call_id="t", turn_id="", replay_id="replay_x", limits=Limits(), restart_safe=False, view=_StoredView(), budget=OutputBudget(1000))
    assert await registry.reserve_slot(run)
    assert await registry.park(run, b"snapshot")
    await registry.sweep()
    _metrics.record_leg("exec", "waiting", "")
    _metrics.record_leg("exec", "failed", "timeout")
    _metrics.record_leg("exec", "failed", "timeout")
    _metrics.record_cell_start(0.25, "docker")
    _metrics.record_bridge_call("call")
    _metrics.record_snapshot(4096)
    points = _metric_points(reader)
    legs = {(p.attributes[attr.RPC_KIND], p.attributes[attr.RUN_STATUS], p.attributes[attr.ERROR_TYPE]): p.value for p in points["cellblock.code_mode.legs"]}
    assert legs == {("exec", "waiting", "none"): 1, ("exec", "failed", "timeout"): 2}
    assert points["cellblock.cell.start.duration"][0].sum == 0.25
    assert points["cellblock.bridge.calls"][0].value == 1 and points["cellblock.bridge.calls"][0].attributes[attr.BRIDGE_METHOD] == "call"
    assert points["cellblock.snapshot.size"][0].sum == 4096
    assert points["cellblock.runs.suspended"][0].value == 1
    claimed = await registry.claim("run_x", "s", "a")
    assert claimed.run is not None
    await registry.remove(claimed.run)
    await registry.sweep()
    assert _metric_points(reader)["cellblock.runs.suspended"][0].value == 0


def test_span_record_of_a_dedicated_provider() -> None:
    provider = TracerProvider()
    memory = InMemorySpanExporter()
    provider.add_span_processor(SimpleSpanProcessor(memory))
    with provider.get_tracer("t").start_as_current_span("x") as span:
        trace_id = format_trace_id(span.get_span_context().trace_id)
    (finished,) = memory.get_finished_spans()
    record = span_record(finished)
    assert record["trace_id"] == trace_id and record["status"] == "UNSET" and record["end_ns"] >= record["start_ns"]


def test_logged_tracebacks_carry_no_frame_locals(capsys: pytest.CaptureFixture[str]) -> None:
    # A leg's frames hold guest output, tool inputs and source; a traceback in the log must not copy them.
    import logging  # noqa: PLC0415

    import structlog  # noqa: PLC0415

    from cellblock.server.logging import configure_logging  # noqa: PLC0415

    saved, root = structlog.get_config(), logging.getLogger()
    handlers, level = root.handlers[:], root.level
    try:
        configure_logging()

        def leg(entry_json: str) -> None:
            raise RecursionError("too deep")

        try:
            leg(INPUT_MARKER)
        except RecursionError:
            structlog.get_logger("t").exception("leg.fault")
        line = capsys.readouterr().err.strip().splitlines()[-1]
    finally:
        structlog.configure(**saved)
        root.handlers[:], root.level = handlers, level
    record = json.loads(line)
    assert record["exception"][0]["frames"], record  # the stack is still there
    assert INPUT_MARKER not in line
