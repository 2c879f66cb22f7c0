"""The agent snapshots a yielding VM while the host answers the yield (guest ``_agent``).

A yield parks the leg at once (SPEC §10.4 item 1), so the agent sends the request, then
snapshots the VM before it reads the host's answer: the ``Suspend`` then finds the snapshot
made, and the cell's snapshot no longer waits for that round trip (bench/README.md,
"the snapshot ahead of Suspend"). These tests run the real agent and VM against the host's
real bridge server (``CellBridge``) over a unix socket, with the host's side scripted.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import tempfile
from collections.abc import AsyncIterator, Callable

import grpc
import pytest

from cellblock.bridge.v1 import bridge_service_pb2 as pb
from cellblock.guest import _agent
from cellblock.guest._vm import CellVM
from cellblock.server.cells import CellBridge
from cellblock.server.config import Limits
from cellblock.server.source import prepare_source
from tests.unit.guest.test_prepared_vm import CATALOG, LIMITS

pytestmark = pytest.mark.asyncio

PROGRAM = "const rows = Array.from({length: 300}, (_, i) => 'row ' + i); const y = await yield_control('r'); return [rows.length, y.status ?? y];"


@contextlib.asynccontextmanager
async def _bridge() -> AsyncIterator[CellBridge]:
    with tempfile.TemporaryDirectory(prefix="cb-ahead-") as base:
        b = await CellBridge.open(base, socket_uid=os.getuid())
        try:
            yield b
        finally:
            await b.close()


def _start() -> pb.AttachResponse:
    limits = Limits()
    prepared = prepare_source(PROGRAM, "javascript")
    leg_limits = pb.LegLimits(deadline_ms=20000, memory_limit_bytes=limits.memory_limit_bytes, max_pending_tool_calls=limits.max_pending_tool_calls, reply_inbox_bytes=limits.reply_inbox_bytes, max_output_bytes=limits.max_output_bytes)
    return pb.AttachResponse(start=pb.Start(run_id="run_ahead", source=prepared.text, limits=leg_limits, catalog_json=json.dumps(CATALOG), idle_unneeded=True))  # type: ignore[union-attr]


async def _guest_message(bridge: CellBridge) -> pb.AttachRequest:
    msg = await asyncio.wait_for(bridge.inbox.get(), 30)
    assert msg is not None, "the guest ended its stream"
    return msg


async def _leg(bridge: CellBridge, answer: Callable[[str], pb.AttachResponse], events: list[str], monkeypatch: pytest.MonkeyPatch) -> tuple[str, list[pb.AttachRequest]]:
    """Runs one leg: Start, then ``answer(bridge id)`` to the yield once the guest snapshotted ahead (or 0.5 s passed)."""
    real_snapshot = CellVM.snapshot

    def snapshot(vm: CellVM) -> tuple[bytes, int]:
        events.append("snapshot")
        return real_snapshot(vm)

    monkeypatch.setattr(CellVM, "snapshot", snapshot)
    channel = grpc.aio.insecure_channel(f"unix:{bridge.socket_path}")
    agent = asyncio.ensure_future(_agent.Leg(bridge.token, 0).run(channel))
    try:
        await asyncio.wait_for(bridge.attached.wait(), 30)
        bridge.send(_start())
        request = await _guest_message(bridge)
        assert (request.WhichOneof("message"), request.request.method) == ("request", "yield")
        events.append("request read")
        for _ in range(50):
            if "snapshot" in events:
                break
            await asyncio.sleep(0.01)
        events.append("answer sent")
        bridge.send(answer(request.request.bridge_id))
        rest = [await _guest_message(bridge)]
        while rest[-1].WhichOneof("message") != "end":
            rest.append(await _guest_message(bridge))
        bridge.hang_up()
        await asyncio.wait_for(agent, 30)
        return request.request.bridge_id, rest
    finally:
        agent.cancel()
        await channel.close()


async def test_the_snapshot_is_made_before_the_hosts_suspend_arrives(monkeypatch: pytest.MonkeyPatch) -> None:
    events: list[str] = []
    async with _bridge() as bridge:
        bridge_id, rest = await _leg(bridge, lambda _id: pb.AttachResponse(suspend=pb.Suspend()), events, monkeypatch)
    assert sorted(events) == ["answer sent", "request read", "snapshot"] and events.index("snapshot") < events.index("answer sent"), "one snapshot, made before the host answered"
    kinds = [m.WhichOneof("message") for m in rest]
    assert kinds == ["snapshot_chunk", "end"] and rest[-1].end.WhichOneof("outcome") == "suspended", kinds
    data = rest[0].snapshot_chunk.data
    assert rest[-1].end.suspended.snapshot_bytes == len(data) and rest[0].snapshot_chunk.last
    # The snapshot resumes the program where it yielded.
    vm = CellVM.prepared(memory_limit_bytes=Limits().memory_limit_bytes)
    vm.restore(data, {"limits": LIMITS})
    vm.settle(bridge_id, True, '{"status":"yielded","reason":"r"}', "")
    status = vm.status()
    vm.close()
    assert status["phase"] == "fulfilled" and json.loads(status["valueJson"]) == [300, "yielded"], status


async def test_a_yield_the_host_settles_discards_the_snapshot_and_the_leg_goes_on(monkeypatch: pytest.MonkeyPatch) -> None:
    events: list[str] = []
    async with _bridge() as bridge:
        _id, rest = await _leg(bridge, lambda bridge_id: pb.AttachResponse(settle=pb.Settle(bridge_id=bridge_id, error=pb.BridgeError(message="refused", code=""))), events, monkeypatch)
    assert sorted(events) == ["answer sent", "request read", "snapshot"] and events.index("snapshot") < events.index("answer sent")
    assert [m.WhichOneof("message") for m in rest] == ["end"], "no snapshot is sent unasked"
    assert rest[-1].end.WhichOneof("outcome") == "failed" and "refused" in rest[-1].end.failed.message
