"""``make demo``: cellblock's main job end to end, on the embedded Docker executor.

Starts the control service (gRPC on 127.0.0.1, cells as locked-down
containers), registers ``examples/catalog.json``, prints the tool surface for
two models (one engaged, one not) and the model-facing ``exec`` description,
runs every program in ``examples/programs/`` with the Python handlers of
``examples/handlers.py``, prints each result and its telemetry, and stops the
service. Spans go to a JSON-lines file (``CELLBLOCK_TRACES=jsonfile:`` wiring),
each program under one trace (its ``traceparent`` sent with every leg); the
trace tree of the shipment run is printed with ``cellblock-trace`` just before
its result. The shipment program runs last, so the demo ends with its
filtered list. Exits 1 when any example program does not complete: each one is
meant to, so a failure is a defect, not a result to show.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import sys
import tempfile
import textwrap
import time
from pathlib import Path
from typing import Any

from opentelemetry import trace
from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

from cellblock.client import CellblockClient, Scope
from cellblock.server.app import ServerSettings, start_service
from cellblock.server.logging import configure_logging
from cellblock.server.telemetry import trace as trace_cli
from cellblock.server.telemetry.sdk import configure_telemetry
from examples.data import PROGRAMS_DIR, load_tools
from examples.handlers import HANDLERS

ENGAGED_MODEL = "anthropic/claude-opus-5"
PLAIN_MODEL = "example/plain-model-1"


def _rule(title: str) -> None:
    print(f"\n=== {title} " + "=" * max(0, 72 - len(title)))


def _print_output(entry: Any) -> None:
    text = entry.text if entry.type == "text" else json.dumps(entry.value, ensure_ascii=False)
    print(f"  output> {textwrap.shorten(str(text), 150)}")


async def main() -> int:
    configure_logging(logging.ERROR)  # the demo prints results; the service logs only infrastructure errors
    image = os.environ.get("CELLBLOCK_IMAGE", "cellblock-cell:dev")
    with tempfile.TemporaryDirectory(prefix="cellblock-demo-traces-") as traces, tempfile.TemporaryDirectory(prefix="cellblock-demo-") as sockets:
        spans_file = Path(traces) / "spans.jsonl"
        telemetry = configure_telemetry(f"jsonfile:{spans_file}")  # the demo is an entry point: it wires the SDK
        tracer = trace.get_tracer("examples.demo")
        # Its own state directory (SQLite run store, instance id): a running `make serve`, which
        # locks the default one, and the demo do not collide, and the demo leaves nothing behind.
        settings = ServerSettings(address="127.0.0.1:0", executor="docker", image=image, code_mode={"enabled": "auto"}, socket_dir=sockets, state_dir=os.path.join(sockets, "state"))
        service = await start_service(settings)
        try:
            await service.executor.check()
            async with await CellblockClient.connect(service.address) as client:
                scope = Scope(session_id="demo-session", agent_run_id="demo-agent-run")
                catalog = await client.put_catalog(scope, load_tools())
                _rule(f"catalog: {len(catalog.entries)} tools registered")
                for model in (ENGAGED_MODEL, PLAIN_MODEL):
                    surface = await client.tool_surface(scope, model)
                    names = [t.name for t in surface.tools]
                    shown = names if len(names) <= 6 else [*names[:6], f"... {len(names) - 6} more"]
                    print(f"{model:32} codeModeEngaged={surface.code_mode_engaged!s:5} tools={shown}")
                surface = await client.tool_surface(scope, ENGAGED_MODEL)
                exec_tool = next(t for t in surface.tools if t.name == "exec")
                _rule("model-facing exec description")
                print(exec_tool.description)

                programs = sorted(PROGRAMS_DIR.glob("*.js"), key=lambda p: (p.name == "shipment.js", p.name))
                final: Any = None
                failed: list[str] = []  # every example program is meant to complete
                for n, path in enumerate(programs, 1):
                    _rule(f"program {path.name}")
                    started = time.monotonic()
                    # One trace per program: the agent's turn is the root, every leg carries its traceparent.
                    turn = tracer.start_span("demo.turn", attributes={"demo.program": path.name})
                    carrier: dict[str, str] = {}
                    TraceContextTextMapPropagator().inject(carrier, context=trace.set_span_in_context(turn))
                    result = await client.exec(
                        scope,
                        tool_call_id=f"demo-call-{n}",
                        code=path.read_text("utf-8"),
                        handlers=HANDLERS,
                        on_output=_print_output,
                        metadata=carrier,
                    )
                    legs = 1
                    while result.status == "waiting" and legs < 5:
                        print(f"status: waiting ({result.reason}, runId {result.run_id}); the model calls wait")
                        legs += 1
                        result = await client.wait(scope, tool_call_id=f"demo-wait-{n}-{legs}", run_id=result.run_id, handlers=HANDLERS, on_output=_print_output, metadata=carrier)
                    turn.end()
                    seconds = time.monotonic() - started
                    print(f"status: {result.status}  ({seconds:.2f} s, {legs} leg(s))")
                    if result.status == "completed":
                        print("value:", textwrap.shorten(json.dumps(result.value, ensure_ascii=False), 400))
                    else:
                        failed.append(path.name)
                        print(f"code: {result.code}  phase: {result.failure_phase}\nerror: {result.error}")
                    t = result.telemetry
                    print(f"telemetry: catalogSize={t.catalog_size} search={t.search_count} describe={t.describe_count} call={t.call_count} counterScope={t.counter_scope}")
                    if path.name == "shipment.js":
                        final = result
                if final is not None and final.trace_id:
                    _rule(f"trace of the shipment run (cellblock-trace {final.trace_id})")
                    await asyncio.sleep(0.3)  # server spans end just after the result is sent
                    telemetry.force_flush()
                    trace_cli.main(["--file", str(spans_file), final.trace_id])
                _rule("shipment program: unpaid shipments over 10 t")
                if final is None or final.status != "completed":
                    print("the shipment program did not complete", file=sys.stderr)
                    return 1
                print(json.dumps(final.value))
                if failed:
                    print(f"example programs that did not complete: {', '.join(failed)}", file=sys.stderr)
                    return 1
        finally:
            await service.stop()
            telemetry.shutdown()
    return 0


if __name__ == "__main__":
    sys.exit(asyncio.run(main()))
