"""A wait's sweep of expired runs (SPEC §10.7 item 5) runs behind its claim and ends before its reply.

Real service, real client and real guest agents (the ``process`` executor). The service's
periodic sweep is stopped first, so only the legs' own sweeps can remove an expired run.
"""

from __future__ import annotations

import asyncio

import pytest

from cellblock.client import CellblockClient, LimitOverrides, Scope, Tool
from cellblock.server.app import Service

pytestmark = [pytest.mark.asyncio(loop_scope="module"), pytest.mark.timeout(60)]


async def test_a_wait_sweeps_expired_runs_before_its_reply(client: CellblockClient, service: Service) -> None:
    assert service.sweeper is not None
    service.sweeper.cancel()  # only the legs sweep from now on
    scope = Scope(session_id="sweep-sess", agent_run_id="sweep-agent")
    await client.put_catalog(scope, [Tool(source="host", owner="core", name="noop")])
    expiring = await client.exec(scope, tool_call_id="e", code="return await yield_control();", handlers={}, limits=LimitOverrides(snapshot_ttl_seconds=1))
    kept = await client.exec(scope, tool_call_id="k", code="const y = await yield_control(); return y.status;", handlers={})
    assert (expiring.status, kept.status) == ("waiting", "waiting"), (expiring.raw_json, kept.raw_json)
    await asyncio.sleep(1.3)
    store = service.registry.store
    assert await store.get(expiring.run_id) is not None, "nothing swept the expired run yet"
    done = await client.wait(scope, tool_call_id="k-w", run_id=kept.run_id)
    assert (done.status, done.value) == ("completed", "yielded"), done.raw_json
    assert await store.get(expiring.run_id) is None, "the wait swept the expired run before its reply"
    assert await store.counts() == (0, 0), "its slot and snapshot were freed"
    gone = await client.wait(scope, tool_call_id="e-w", run_id=expiring.run_id)
    assert gone.status == "failed" and gone.error.startswith("this run is unknown or has expired"), gone.raw_json
