"""A streamed request message over 1 MiB is decoded in a loop turn of its own (SPEC §3.1 item 6, api/_failures.py)."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import grpc
import pytest

from cellblock.server import messages as msg
from cellblock.server.api._failures import DEFERRED_DECODE_BYTES, _stream, _tolerant
from cellblock.v1 import code_mode_service_pb2 as pb
from tests.support.loop_turns import other_tenant_turns

pytestmark = pytest.mark.asyncio


class AbortError(Exception):  # named as grpc.aio's, which the interceptor passes through
    pass


class _Context:
    async def abort(self, code: grpc.StatusCode, details: str) -> None:
        raise AbortError(code, details)


def _wire(text: str) -> bytes:
    return pb.ExecRequest(tool_result=pb.ToolResult(nested_call_id="n1", ok_json=text)).SerializeToString()


async def _through(wires: list[bytes]) -> tuple[list[Any], int]:
    """The messages the handler sees for ``wires`` as gRPC would hand them over, and the loop turns another task had meanwhile."""
    deferring, decode = _tolerant(pb.ExecRequest.FromString, defer=True), _tolerant(pb.ExecRequest.FromString)
    assert deferring is not None

    async def received() -> AsyncIterator[Any]:
        for wire in wires:
            yield deferring(wire)

    seen: list[Any] = []

    async def handler(requests: AsyncIterator[Any], _context: Any) -> AsyncIterator[Any]:
        async for request in requests:
            seen.append(request)
        yield None

    async with other_tenant_turns() as turns:
        async for _ in _stream(handler, "Exec", decode)(received(), _Context()):
            pass
    return seen, turns.count


async def test_a_long_message_is_decoded_between_loop_turns_and_reaches_the_handler_whole() -> None:
    text = '"' + "x" * (DEFERRED_DECODE_BYTES + 10) + '"'
    seen, turns = await _through([_wire("1"), _wire(text), _wire("2")])
    assert [m.tool_result.ok_json for m in seen] == ["1", text, "2"]
    assert turns >= 2  # the receive, the decode and the handler's read are three turns


async def test_a_long_message_that_does_not_decode_is_a01_like_a_short_one() -> None:
    bad = _wire("y" * (DEFERRED_DECODE_BYTES + 10)).replace(b"y" * 8, b"\xff" * 8, 1)  # invalid UTF-8 in a string field
    for wire in (bad, bad[: 64 * 1024].replace(b"\xff", b"\xfe")):
        with pytest.raises(AbortError) as aborted:
            await _through([_wire("1"), wire])
        assert aborted.value.args == (grpc.StatusCode.INVALID_ARGUMENT, msg.A01)
