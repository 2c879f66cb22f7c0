"""Conformance CLI of the Python client: runs one scenario, prints one JSON object.

Usage::

    PYTHONPATH=proto:client python clients/python/conformance.py <scenario> <address> [--spec FILE]

The scenarios, the tool handlers and the shape of the printed observations are
described in clients/README.md ("Conformance table"); the TypeScript and Go
CLIs implement the same list, and tests/integration/test_client_conformance.py
compares the three outputs. Exit codes: 0 observations printed, 1 the scenario
could not run (message on stderr), 2 bad usage.

The scenario logic uses the public `cellblock.client` API. Two observations
need messages the client never sends on purpose (a stream whose first message
is not its start, a ``Cancel`` mid-leg); for those the CLI uses the generated
stubs of proto/ directly, as any runtime written against the protos would.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import sys
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import Any

import grpc
import grpc.aio
from conformance_support import (
    CODES,
    DEFAULT_SPEC,
    METHODS,
    SOURCES,
    STATUSES,
    Scenario,
    leg,
    leg_or_status,
    observe_leg,
    status_of_call,
)

from cellblock.client import (
    CellblockClient,
    Scope,
    ToolCallInfo,
)
from cellblock.v1 import code_mode_service_pb2, code_mode_service_pb2_grpc, common_pb2

# wait_refused: waits until the run completes; a lost tool call answers `waiting` every time.
WAIT_REFUSED_MAX_WAITS = 3


async def main_job(s: Scenario) -> dict[str, Any]:
    """Catalog, tool surface, and a program calling host and client tools every way."""
    catalog = await s.register()
    surface = await s.client.tool_surface(s.scope)
    result = await s.exec(s.handlers())
    return {
        "catalog": catalog,
        "surface": {
            "engaged": surface.code_mode_engaged,
            "names": [t.name for t in surface.tools],
            "execParameters": surface.tools[0].parameters,
            "descriptionBytes": [len(t.description.encode("utf-8")) for t in surface.tools],
        },
        "leg": leg(result),
        "calls": s.calls,
        "streamed": s.streamed,
    }


async def tool_errors(s: Scenario) -> dict[str, Any]:
    """Every kind of nested-call failure, caught in the guest (SPEC §8.4, §14.4)."""
    await s.register()
    result = await s.exec(s.handlers())
    return {"leg": leg(result), "calls": s.calls}


async def result_over_message_cap(s: Scenario) -> dict[str, Any]:
    """A result over the 64 MiB message cap goes as ``oversized_bytes``: B12, the stream goes on."""
    await s.register()
    return {"leg": leg(await s.exec(s.handlers())), "calls": s.calls}


async def uncaught_refusal(s: Scenario) -> dict[str, Any]:
    """An uncaught ``invalid_input`` refusal fails the run with ``invalid_input`` (SPEC §11.3)."""
    await s.register()
    return {"leg": leg(await s.exec(s.handlers())), "calls": s.calls}


async def output_stream(s: Scenario) -> dict[str, Any]:
    """Output events as produced, beside the result's output (SPEC §9 rule 12)."""
    await s.register()
    return {"leg": leg(await s.exec(s.handlers())), "streamed": s.streamed}


async def suspend_resume(s: Scenario) -> dict[str, Any]:
    """Two late results: one between the legs, one on the open Wait stream (SPEC §3.4 item 3)."""
    await s.register()
    handlers = s.handlers()
    first = await s.exec(handlers)
    assert first.run_id, first.raw_json
    run = await s.client.get_run(s.scope, first.run_id)
    s.slow_gates[1].set()  # finishes between the legs: sent right after the Wait start
    second = await s.wait(first.run_id, handlers)
    return {
        "first": leg(first),
        "run": {
            "state": run.state,
            "snapshotStored": run.snapshot_bytes > 0,
            "expires": run.expire_time is not None,
            "pending": [{"id": p.id, "method": p.method, "dispatched": bool(p.nested_call_id)} for p in run.pending_tool_calls],
        },
        "second": leg(second),
        "calls": s.calls,
        "streamed": s.streamed,
    }


async def yield_resume(s: Scenario) -> dict[str, Any]:
    """``yield_control`` parks the run; ``wait`` settles it (SPEC §8.9)."""
    await s.register()
    first = await s.exec(s.handlers())
    assert first.run_id, first.raw_json
    return {"first": leg(first), "second": leg(await s.wait(first.run_id))}


async def cancel_message(s: Scenario) -> dict[str, Any]:
    """Sends ``Cancel`` on the Exec stream as soon as the ``hold`` call arrives (generated stubs)."""
    await s.register()
    notices: list[int] = []
    queue: asyncio.Queue[code_mode_service_pb2.ExecRequest | None] = asyncio.Queue()
    start = code_mode_service_pb2.ExecStart(
        scope=common_pb2.Scope(session_id=s.scope.session_id, agent_run_id=s.scope.agent_run_id),
        tool_call_id=s.exec_id,
        arguments_json=json.dumps({"code": s.program}),
    )
    await queue.put(code_mode_service_pb2.ExecRequest(start=start))

    async def requests() -> AsyncIterator[code_mode_service_pb2.ExecRequest]:
        while (item := await queue.get()) is not None:
            yield item

    async with grpc.aio.insecure_channel(s.address) as channel:
        stub = code_mode_service_pb2_grpc.CodeModeServiceStub(channel)
        result: code_mode_service_pb2.Result | None = None
        async for msg in stub.Exec(requests()):
            kind = msg.WhichOneof("message")
            if kind == "tool_call":
                tc = msg.tool_call
                info = ToolCallInfo(
                    nested_call_id=tc.nested_call_id, parent_tool_call_id=tc.parent_tool_call_id, run_id=tc.run_id,
                    replay_id=tc.replay_id, catalog_id=tc.catalog_id, source=SOURCES.get(tc.source, ""),
                    owner=tc.owner, name=tc.name, method=METHODS.get(tc.method, ""),
                )
                s.record(info, json.loads(tc.input_json))
                await queue.put(code_mode_service_pb2.ExecRequest(cancel=code_mode_service_pb2.Cancel(reason="conformance")))
            elif kind == "output":
                s.streamed.append(json.loads(msg.output.entry_json))
            elif kind == "tool_call_cancelled":
                notices.append(int(msg.tool_call_cancelled.nested_call_id.rsplit("_", 1)[-1]))
            elif kind == "result":
                result = msg.result
                await queue.put(None)
        assert result is not None, "the stream ended without a Result"
    counts = result.metadata.bridge_calls
    observed = observe_leg(
        result.result_json, STATUSES.get(result.status, ""), CODES.get(result.code, ""), result.run_id,
        result.metadata.leg_count, {"search": counts.search, "describe": counts.describe, "call": counts.call},
    )
    return {"leg": observed, "calls": s.calls, "streamed": s.streamed, "cancelNotices": notices}


async def cancel_running(s: Scenario) -> dict[str, Any]:
    """``CancelRun`` of the running leg, from the handler of its held call (SPEC §3.6 item 2)."""
    await s.register()
    cancels: list[asyncio.Task[str]] = []

    async def hold(tool_input: dict[str, Any], call: ToolCallInfo) -> Any:
        # CancelRun outlives this handler, which the abort abandons.
        cancels.append(asyncio.create_task(s.client.cancel_run(s.scope, call.run_id)))
        await asyncio.Event().wait()

    result = await s.exec(s.handlers(hold=hold))
    previous = [await task for task in cancels]
    return {"leg": leg(result), "previousState": previous, "calls": s.calls, "streamed": s.streamed}


async def cancel_suspended(s: Scenario) -> dict[str, Any]:
    """``CancelRun`` of a suspended run, twice, then ``wait`` and ``GetRun`` on it."""
    await s.register()
    first = await s.exec(s.handlers())
    assert first.run_id, first.raw_json
    previous = await s.client.cancel_run(s.scope, first.run_id)
    again = await s.client.cancel_run(s.scope, first.run_id)
    waited = await s.wait(first.run_id)
    after = await status_of_call(s.client.get_run(s.scope, first.run_id))
    return {"first": leg(first), "previousState": previous, "cancelAgain": again, "wait": leg(waited), "getRunAfter": after["code"]}


async def admission(s: Scenario) -> dict[str, Any]:
    """While one leg holds the service's only admission slot, a second Exec is refused."""
    await s.register()
    other = Scope(session_id=s.scope.session_id, agent_run_id=f"{s.name}-other")
    await s.register(other)
    refused: list[dict[str, str]] = []

    async def hold(tool_input: dict[str, Any], call: ToolCallInfo) -> Any:
        refused.append(await status_of_call(s.client.exec(other, tool_call_id="call-other", code="return 2;", handlers={})))
        return {"details": {"released": True}}

    result = await s.exec(s.handlers(hold=hold))
    return {"refused": refused, "leg": leg(result), "calls": s.calls}


async def wait_refused(s: Scenario) -> dict[str, Any]:
    """A wait another session sends is refused ([W04]) and keeps the run's in-flight ``hold`` call (SPEC §5.2)."""
    await s.register()
    released = asyncio.Event()

    async def hold(tool_input: dict[str, Any], call: ToolCallInfo) -> Any:
        await released.wait()
        return {"details": {"answer": "released"}}

    handlers = s.handlers(hold=hold)
    first = await s.exec(handlers)
    assert first.run_id, first.raw_json
    other = Scope(session_id=s.scope.session_id + "-other", agent_run_id=s.scope.agent_run_id)
    refused = await s.client.wait(other, tool_call_id=f"{s.exec_id}-other", run_id=first.run_id, handlers=handlers)
    released.set()  # answers while no wait is open: the result waits in the client for the owner's wait
    waits, final = 0, first
    while final.status == "waiting" and waits < WAIT_REFUSED_MAX_WAITS:
        waits += 1
        final = await s.wait(first.run_id, handlers)
    return {"first": leg(first), "refused": leg(refused), "final": leg(final), "waits": waits, "calls": s.calls}


async def second_wait(s: Scenario) -> dict[str, Any]:
    """A second wait while one runs is refused ([W06], or RESOURCE_EXHAUSTED at one leg slot) and changes nothing (SPEC §5.2)."""
    await s.register()
    released = asyncio.Event()
    second: dict[str, Any] = {}

    async def hold(tool_input: dict[str, Any], call: ToolCallInfo) -> Any:
        nonlocal second
        if tool_input.get("step") == 1:
            await released.wait()
        else:  # runs on the open wait's leg: a second wait on the run now must be refused and change nothing
            second = await leg_or_status(s.client.wait(s.scope, tool_call_id=f"{s.exec_id}-second", run_id=call.run_id))
        return {"details": {"answer": f"released-{tool_input.get('step')}"}}

    handlers = s.handlers(hold=hold)
    first = await s.exec(handlers)
    assert first.run_id, first.raw_json
    released.set()  # answers between the legs: sent right after the wait's start
    resumed = await s.wait(first.run_id, handlers)
    return {"first": leg(first), "second": second, "resumed": leg(resumed), "calls": s.calls}


async def grpc_status(s: Scenario) -> dict[str, Any]:
    """Every status code of SPEC §3.1 item 2, and an argument problem that is a result, not an error."""
    blank = Scope(session_id=" ", agent_run_id="x")
    fresh = Scope(session_id=s.scope.session_id, agent_run_id=f"{s.name}-fresh")
    bad_tool = [{"source": "host", "name": "broken", "parameters": {"type": 12}}]
    missing_run = "run_" + "0" * 32
    out: dict[str, Any] = {
        "putCatalogBlankScope": await status_of_call(s.client.put_catalog(blank, s.spec["tools"])),
        "putCatalogBadSchema": await status_of_call(s.client.put_catalog(s.scope, bad_tool)),
        "getCatalogMissing": await status_of_call(s.client.get_catalog(fresh)),
        "listCatalogsBlankSession": await status_of_call(s.client.list_catalogs("")),
        "execWithoutCatalog": await status_of_call(s.client.exec(fresh, tool_call_id="call-none", code=s.program, handlers={})),
        "getRunUnknown": await status_of_call(s.client.get_run(s.scope, missing_run)),
        "cancelRunUnknown": await status_of_call(s.client.cancel_run(s.scope, missing_run)),
    }
    await s.register()
    async with grpc.aio.insecure_channel(s.address) as channel:
        stub = code_mode_service_pb2_grpc.CodeModeServiceStub(channel)
        for key, rpc in (("execFirstMessageNotStart", stub.Exec), ("waitFirstMessageNotStart", stub.Wait)):
            request_cls = code_mode_service_pb2.ExecRequest if rpc is stub.Exec else code_mode_service_pb2.WaitRequest
            first = request_cls(tool_result=code_mode_service_pb2.ToolResult(nested_call_id="x", ok_json="{}"))
            try:
                async for _ in rpc(iter([first])):
                    pass
                out[key] = {"code": "OK", "message": ""}
            except grpc.aio.AioRpcError as exc:
                out[key] = {"code": exc.code().name, "message": exc.details() or ""}
        try:
            async for _ in stub.Exec(iter(())):
                pass
            out["execClosedBeforeStart"] = {"code": "OK", "message": ""}
        except grpc.aio.AioRpcError as exc:
            out["execClosedBeforeStart"] = {"code": exc.code().name, "message": exc.details() or ""}
    bad = await s.client.exec(s.scope, tool_call_id="call-bad-args", arguments={"code": 5}, handlers={})
    out["execBadArguments"] = leg(bad)
    return out


SCENARIOS: dict[str, Callable[[Scenario], Awaitable[dict[str, Any]]]] = {
    "main_job": main_job,
    "tool_errors": tool_errors,
    "result_over_message_cap": result_over_message_cap,
    "uncaught_refusal": uncaught_refusal,
    "output_stream": output_stream,
    "suspend_resume": suspend_resume,
    "yield_resume": yield_resume,
    "cancel_message": cancel_message,
    "cancel_running": cancel_running,
    "cancel_suspended": cancel_suspended,
    "admission": admission,
    "wait_refused": wait_refused,
    "second_wait": second_wait,
    "grpc_status": grpc_status,
}


async def run(name: str, address: str, spec: dict[str, Any]) -> dict[str, Any]:
    """Connects, runs one scenario in its own scope and ends the scope."""
    async with await CellblockClient.connect(address) as client:
        scenario = Scenario(client, address, spec, name)
        try:
            return await SCENARIOS[name](scenario)
        finally:
            await client.delete_catalog(scenario.scope)


def main(argv: list[str] | None = None) -> int:
    """The CLI: prints the observations as one JSON line; returns the exit code."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("scenario", choices=sorted(SCENARIOS))
    parser.add_argument("address", help="gRPC target of the service, e.g. 127.0.0.1:50051")
    parser.add_argument("--spec", type=Path, default=DEFAULT_SPEC, help="scenarios.json (catalog and programs)")
    args = parser.parse_args(argv)
    logging.getLogger("cellblock.client").setLevel(logging.ERROR)  # handler failures are part of the scenarios
    spec = json.loads(args.spec.read_text(encoding="utf-8"))
    try:
        observed = asyncio.run(run(args.scenario, args.address, spec))
    except Exception as exc:  # noqa: BLE001 - the CLI reports any failure as exit 1
        print(f"conformance: {args.scenario}: {type(exc).__name__}: {exc}", file=sys.stderr)
        return 1
    print(json.dumps(observed, sort_keys=True, ensure_ascii=False))
    return 0


if __name__ == "__main__":
    sys.exit(main())
