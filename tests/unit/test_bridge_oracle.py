"""The bridge fuzzer's oracle documents the host's value nesting bound exactly (issue 11).

A CI run of ``tests/integration/test_bridge_fuzz.py`` failed on a drawn plan: the host answered
[B23] for a ``search`` after a ``yield`` the oracle had counted as parking the leg. The plans ran
inside hypothesis's test body, where hypothesis raises the interpreter's recursion limit
(process-wide) from 1000 to about 2020: the host's parser then gave up near 1957 levels and the
oracle's (a shallower stack) near 1966. The host now counts ``limits.MAX_VALUE_DEPTH`` itself
(SPEC §8.8 rule 7), whatever the recursion limit, and the oracle documents that exact bound.
"""

from __future__ import annotations

import asyncio
import sys

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from cellblock.bridge.v1 import bridge_service_pb2 as pb
from cellblock.server import messages as msg
from cellblock.server.limits import MAX_VALUE_DEPTH
from tests.support.bridge_oracle import VALUE_DEPTH, expect, nesting
from tests.support.fuzz_cells import run_drawn


def _yield(n: int, depth: int) -> bytes:
    args = "[" * depth + "]" * depth
    return pb.AttachRequest(request=pb.GuestRequest(bridge_id=f"bridge:yield:{n}", method="yield", args_json=args)).SerializeToString()


def _kinds(messages: list[bytes]) -> list[str]:
    return [a.kind for a in expect(messages, good_token=True, timeout_ms=1000, memory_limit_bytes=1 << 26).answers]


def test_the_oracles_bound_is_the_hosts() -> None:
    assert VALUE_DEPTH == MAX_VALUE_DEPTH


def test_the_oracle_counts_depth_without_its_own_stack() -> None:
    assert nesting('[1, "[[[[", {"a": [[]]}, "\\"]"]') == 4
    assert nesting("[" * 100_000 + "]" * 100_000) == 100_000
    # The arguments' array holds each argument: an argument VALUE_DEPTH deep is a text one level deeper.
    assert _kinds([_yield(1, VALUE_DEPTH + 2), _yield(2, 3000), _yield(3, VALUE_DEPTH + 1)]) == ["B23", "B23", "accepted"]


def test_the_oracle_documents_the_final_value_and_output_at_the_bound() -> None:
    def leg(value_depth: int) -> tuple[list[str], str | None]:
        entry = '{"type": "json", "value": ' + "[" * value_depth + "]" * value_depth + "}"
        end = pb.LegEnd(completed=pb.Completed(value_json="[" * value_depth + "]" * value_depth))
        messages = [pb.AttachRequest(output=pb.GuestOutput(entry_json=entry)).SerializeToString(), pb.AttachRequest(end=end).SerializeToString()]
        out = expect(messages, good_token=True, timeout_ms=1000, memory_limit_bytes=1 << 26)
        assert out.end is not None
        return [a.kind for a in out.answers], out.end.error

    assert leg(VALUE_DEPTH) == (["output", "ends the leg"], None)
    assert leg(VALUE_DEPTH + 1) == (["dropped", "ends the leg"], msg.r15(f"nesting is deeper than {VALUE_DEPTH} levels"))


def test_the_oracle_answers_the_same_inside_a_test_body() -> None:
    # hypothesis raises the recursion limit while a test body runs: the documented bound does not move.
    outside = sys.getrecursionlimit()
    inside: list[tuple[int, list[str]]] = []

    @settings(max_examples=1, database=None)
    @given(st.just(0))
    def body(_: int) -> None:
        inside.append((sys.getrecursionlimit(), _kinds([_yield(1, VALUE_DEPTH + 2), _yield(2, 1500), _yield(3, VALUE_DEPTH + 1)])))

    body()
    assert inside[0][0] > outside + 500
    assert inside[0][1] == ["B23", "B23", "accepted"]


@pytest.mark.asyncio(loop_scope="function")
async def test_drawn_plans_run_at_the_services_recursion_limit() -> None:
    limit = sys.getrecursionlimit()
    seen: list[tuple[int, list[str]]] = []

    async def one(depth: int) -> None:
        await asyncio.sleep(0)
        seen.append((sys.getrecursionlimit(), _kinds([_yield(1, depth), _yield(2, 1)])))

    assert await run_drawn(st.integers(VALUE_DEPTH + 2, 3000), 5, one) == 5
    assert seen == [(limit, ["B23", "accepted"])] * 5
