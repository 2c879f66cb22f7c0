"""Two concurrent waits on one run, as the service may order them (SPEC §5.2 item 5, [W06]).

Of two waits on one run the service lets exactly one resume it and refuses the other; which one
wins is the service's choice, not the order the client opened them in. A FAKE service
(in-process ``grpc.aio``) lets the later wait resume the run and refuses the earlier one after
the client wrote the run's result on it: the refusal must hand that result, and the run, to the
wait still open. The Python client kept the run on the earlier wait's stream, so the resuming
wait never got the result and returned ``waiting``. The real service's ordering is the
conformance table's ``second_wait`` (tests/integration/test_client_conformance.py).
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from typing import Any

import pytest
import pytest_asyncio

from cellblock.client import CellblockClient, Scope, ToolCallInfo
from cellblock.v1 import code_mode_service_pb2, code_mode_service_pb2_grpc, common_pb2
from tests.support.fake_cellblock import serving

pytestmark = [pytest.mark.asyncio(loop_scope="function"), pytest.mark.timeout(30)]

RUN = "run_" + "1" * 32
W06 = "this run is already being resumed by another wait; let that call return first."


class RacingWaits(code_mode_service_pb2_grpc.CodeModeServiceServicer):
    """The wait with tool call id ``later`` resumes the run; any other is refused with [W06]."""

    def __init__(self) -> None:
        self.called = asyncio.Event()
        self.answered: dict[str, code_mode_service_pb2.ToolResult | None] = {}

    async def _next_tool_result(self, context: Any, seconds: float) -> code_mode_service_pb2.ToolResult | None:
        try:
            request = await asyncio.wait_for(context.read(), seconds)
        except TimeoutError:
            return None
        return request.tool_result if request.WhichOneof("message") == "tool_result" else None

    async def Wait(self, request_iterator: Any, context: Any) -> None:  # noqa: N802
        wait = (await context.read()).start.tool_call_id
        if wait != "later":
            await self.called.wait()
            self.answered[wait] = await self._next_tool_result(context, 1.0)
            body = {"status": "failed", "error": W06, "code": "invalid_input", "failurePhase": "input"}
            await context.write(code_mode_service_pb2.WaitResponse(result=code_mode_service_pb2.Result(
                status=code_mode_service_pb2.RUN_STATUS_FAILED, code=code_mode_service_pb2.ERROR_CODE_INVALID_INPUT,
                result_json=json.dumps(body),
            )))
            return
        await context.write(code_mode_service_pb2.WaitResponse(tool_call=code_mode_service_pb2.ToolCall(
            nested_call_id="cellblock_c1_00000000_2", run_id=RUN, catalog_id="client:app:lookup",
            source=common_pb2.TOOL_SOURCE_CLIENT, owner="app", name="lookup", input_json="{}",
        )))
        self.called.set()
        answer = self.answered[wait] = await self._next_tool_result(context, 5.0)
        status = code_mode_service_pb2.RUN_STATUS_COMPLETED if answer is not None else code_mode_service_pb2.RUN_STATUS_WAITING
        await context.write(code_mode_service_pb2.WaitResponse(result=code_mode_service_pb2.Result(status=status, run_id=RUN, result_json="{}")))


@pytest_asyncio.fixture(loop_scope="function")
async def racing() -> AsyncIterator[tuple[RacingWaits, str]]:
    service = RacingWaits()
    async with serving(lambda server: code_mode_service_pb2_grpc.add_CodeModeServiceServicer_to_server(service, server)) as address:
        yield service, address


async def test_a_refused_earlier_wait_hands_the_run_to_the_later_wait_that_resumes_it(racing: tuple[RacingWaits, str]) -> None:
    service, address = racing
    scope = Scope(session_id="s", agent_run_id="r")

    async def lookup(tool_input: dict[str, Any], call: ToolCallInfo) -> Any:
        return {"details": {"found": True}}

    async with await CellblockClient.connect(address, timeout=5) as client:
        earlier = asyncio.create_task(client.wait(scope, tool_call_id="earlier", run_id=RUN, handlers={"lookup": lookup}))
        while not service.answered and RUN not in client._legs.runs:  # the earlier wait attaches first
            await asyncio.sleep(0.005)
        resumed = await client.wait(scope, tool_call_id="later", run_id=RUN, handlers={"lookup": lookup})
        refused = await earlier
    assert refused.error == W06, refused.raw_json
    assert resumed.status == "completed", "the resuming wait never got the run's result"
    answer = service.answered["later"]
    assert answer is not None and json.loads(answer.ok_json) == {"details": {"found": True}}
