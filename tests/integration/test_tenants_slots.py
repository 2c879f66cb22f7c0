"""No scope can take every suspended-run slot of the deployment (issue 11 item 3; SPEC §16.1 item 5).

A real service with real Docker cells and a cap of 4: one scope parks until it holds its share
(three quarters, 3), its next run is refused with [R23]; another scope still parks, and its yield
and wait complete; the whole cap, filled by the two scopes, still refuses with [R01].
"""

from __future__ import annotations

import tempfile
from typing import Any

import pytest

from cellblock.client import CellblockClient, LimitOverrides, Scope, Tool
from cellblock.server import messages
from cellblock.server.app import ServerSettings, start_service
from tests.integration.conftest import IMAGE
from tests.support.cells import state_dir_in

pytestmark = pytest.mark.asyncio(loop_scope="session")

TOOLS = [Tool(source="client", owner="app", name="echo", description="Answers at once.")]
PARK = LimitOverrides(timeout_ms=8000, snapshot_ttl_seconds=86400)
YIELD = "await yield_control('x'); return 1;"
CALL = 'return await tools.callValue("client:app:echo", {n: 1});'


async def test_one_scope_holds_at_most_its_share_of_the_suspended_run_slots_and_another_still_parks(docker_client: Any) -> None:
    with tempfile.TemporaryDirectory(prefix="cellblock-slots-") as sockets:
        service = await start_service(
            ServerSettings(address="127.0.0.1:0", image=IMAGE, code_mode={"enabled": True}, socket_dir=sockets, state_dir=state_dir_in(sockets), max_suspended_runs=4)
        )
        try:
            store = service.registry.store
            assert (store.cap, store.scope_share) == (4, 3)
            async with await CellblockClient.connect(service.address) as client:
                greedy, other = Scope("slots-greedy", "agent"), Scope("slots-other", "agent")
                for scope in (greedy, other):
                    await client.put_catalog(scope, TOOLS)
                called: list[Any] = []

                async def echo(tool_input: dict[str, Any], call: Any) -> dict[str, Any]:
                    called.append(tool_input)
                    return {"details": {"echo": tool_input["n"]}}

                parked = [await client.exec(greedy, tool_call_id=f"g{i}", code=YIELD, handlers={}, limits=PARK) for i in range(3)]
                assert [p.status for p in parked] == ["waiting"] * 3, [p.raw_json for p in parked]
                r23 = "this scope already holds 3 of the deployment's 4 suspended-run slots, its most; wait on or cancel its waiting runs before starting new ones."
                assert messages.r23(3, 4) == r23
                over = await client.exec(greedy, tool_call_id="g-over", code=YIELD, handlers={}, limits=PARK)
                assert (over.status, over.code, over.failure_phase, over.error) == ("failed", "runtime_unavailable", "host", r23), over.raw_json
                call = await client.exec(greedy, tool_call_id="g-call", code=CALL, handlers={"echo": echo}, limits=PARK)
                assert (call.code, call.failure_phase, call.error, call.bridge_dispatch_started) == ("runtime_unavailable", "host", r23, False), call.raw_json
                assert called == [], "nothing is dispatched without a slot"
                assert (await store.counts())[0] == 3

                # The last quarter is the other scope's: its yield parks and its wait completes.
                mine = await client.exec(other, tool_call_id="o1", code="const y = await yield_control('b'); return y.status;", handlers={}, limits=PARK)
                assert mine.status == "waiting", mine.raw_json
                # The whole cap (3 + 1) still holds, for every scope: [R01].
                full = await client.exec(other, tool_call_id="o-full", code=CALL, handlers={"echo": echo}, limits=PARK)
                assert (full.code, full.failure_phase, full.error) == ("runtime_unavailable", "host", messages.r01(4)), full.raw_json
                assert called == []
                done = await client.wait(other, tool_call_id="o1-w", run_id=mine.run_id)
                assert done.status == "completed", done.raw_json
                # A tool call of the other scope takes the freed slot, runs, and gives it back.
                answered = await client.exec(other, tool_call_id="o-call", code=CALL, handlers={"echo": echo}, limits=PARK)
                assert (answered.status, answered.value) == ("completed", {"echo": 1}), answered.raw_json
                assert called == [{"n": 1}]
                assert (await store.counts())[0] == 3

                # A slot of the greedy scope freed by a wait is the greedy scope's again.
                resumed = await client.wait(greedy, tool_call_id="g0-w", run_id=parked[0].run_id)
                assert (resumed.status, resumed.value) == ("completed", 1), resumed.raw_json
                again = await client.exec(greedy, tool_call_id="g-again", code=YIELD, handlers={}, limits=PARK)
                assert again.status == "waiting", again.raw_json
                for p in [*parked[1:], again]:
                    assert await client.cancel_run(greedy, p.run_id) == "suspended"
                assert (await store.counts())[0] == 0
        finally:
            await service.stop()
        assert service.executor.list_cell_containers() == []  # type: ignore[attr-defined]
