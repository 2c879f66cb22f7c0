"""A worker's large result travels in pickled pieces unpickled one at a time while the loop runs (SPEC §3.1 item 6)."""

from __future__ import annotations

import asyncio
import pickle
from typing import Any

import pytest

from cellblock.server.sliced import PIECE_NODES, pack, unpack

pytestmark = pytest.mark.asyncio


def _tools(count: int, props: int) -> list[dict[str, Any]]:
    schema = {"type": "object", "properties": {f"p{i}": {"type": "string", "enum": ["a", "b"], "minLength": 1} for i in range(props)}}
    return [{"source": "host", "name": f"t{i}", "parameters": schema, "tags": [], "n": None, "f": 1.5} for i in range(count)]


@pytest.mark.parametrize(
    "value",
    [
        [], {}, 1, "x", None, [[]], [{}], {"a": [1, {"b": list(range(10_000))}], "c": {}, "d": [[], [[]]]},
        [list(range(5_000)), {str(i): [i] * 3 for i in range(3_000)}], _tools(300, 20), _tools(1, 30_000),
    ],
)  # fmt: skip
async def test_unpack_gives_back_what_was_packed_in_order(value: Any) -> None:
    for nodes in (1, 7, PIECE_NODES):
        back = await unpack(pack(value, nodes))
        assert back == value and type(back) is type(value)
        if isinstance(value, dict):
            assert list(back) == list(value)  # key order kept


async def test_each_piece_is_small_and_the_loop_turns_between_them() -> None:
    # One schema of 30,000 properties (the 22 MB case's shape) and 300 tools: no piece holds much more than PIECE_NODES nodes.
    for value in (_tools(1, 30_000), _tools(300, 20)):
        pieces = pack(value)
        assert len(pieces) >= 10
        for piece in pieces:
            parents, _keys, _values = pickle.loads(piece)  # noqa: S301
            assert len(parents) <= PIECE_NODES + 1
        turns = 0

        async def other_tenant() -> None:
            nonlocal turns
            while True:
                turns += 1
                await asyncio.sleep(0)

        other = asyncio.ensure_future(other_tenant())
        await asyncio.sleep(0)
        start = turns
        assert await unpack(pieces) == value
        other.cancel()
        assert turns - start >= len(pieces) - 1  # another task ran between every two pieces
