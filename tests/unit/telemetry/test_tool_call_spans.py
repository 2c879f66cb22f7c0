"""``bridge.tool_call`` spans with and without an OpenTelemetry SDK (issue 15: no span work per nested call without one)."""

from __future__ import annotations

from typing import Any

import pytest
from opentelemetry import trace
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from cellblock.server.config import Limits
from cellblock.server.runs import BridgeMethod
from cellblock.server.runs._output import OutputBudget
from cellblock.server.runs._state import PendingRequest, Run
from cellblock.server.telemetry import _attributes as attr
from cellblock.server.telemetry import _spans


class _View:
    def to_state(self) -> dict[str, Any]:
        return {}


class _RefusingTracer:
    def start_span(self, *args: Any, **kwargs: Any) -> Any:
        raise AssertionError("a span was built without an SDK")


def _run() -> Run:
    return Run(run_id="run_x", session_id="s", agent_run_id="a", tool_call_id="t", turn_id="", replay_id="replay_x", limits=Limits(), restart_safe=False, view=_View(), budget=OutputBudget(1000))


def _request(nested_call_id: str) -> PendingRequest:
    p = PendingRequest(bridge_id="bridge:call:1", method=BridgeMethod.CALL, args=[])
    p.nested_call_id = nested_call_id
    return p


def test_without_an_sdk_no_span_is_built(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(_spans.trace, "get_tracer_provider", trace.ProxyTracerProvider)
    monkeypatch.setattr(_spans, "_tracer", _RefusingTracer())
    run = _run()
    _spans.start_tool_call(run, _request("nc_1"))
    assert run.tool_spans["nc_1"][0] is trace.INVALID_SPAN
    _spans.end_tool_call(run, "nc_1", "error", "failed")
    assert run.tool_spans == {}


def test_with_an_sdk_the_span_is_recorded_and_ended(monkeypatch: pytest.MonkeyPatch) -> None:
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    monkeypatch.setattr(_spans.trace, "get_tracer_provider", lambda: provider)
    monkeypatch.setattr(_spans, "_tracer", provider.get_tracer("cellblock.server"))
    run = _run()
    _spans.start_tool_call(run, _request("nc_2"))
    assert run.tool_spans["nc_2"][0] is not trace.INVALID_SPAN
    _spans.end_tool_call(run, "nc_2", "ok")
    (span,) = exporter.get_finished_spans()
    assert span.name == "bridge.tool_call"
    assert span.attributes is not None
    assert span.attributes[attr.NESTED_CALL_ID] == "nc_2"
    assert span.attributes[attr.TOOL_CALL_STATUS] == "ok"
