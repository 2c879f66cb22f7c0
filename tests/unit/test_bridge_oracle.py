"""The bridge fuzzer's oracle documents the host's JSON depth bound only where it holds (issue 11).

A CI run of ``tests/integration/test_bridge_fuzz.py`` failed on a drawn plan: the host answered
[B23] for a ``search`` after a ``yield`` the oracle had counted as parking the leg. The plans ran
inside hypothesis's test body, where hypothesis raises the interpreter's recursion limit
(process-wide) from 1000 to about 2020: the host's parser then gave up near 1957 levels and the
oracle's (a shallower stack) near 1966, inside the depths the fuzzer draws as too deep (1100-3000).
A ``yield`` nested between the two was admitted by the oracle and rejected by the host ([B23], SPEC
§8.4 item 6), which never parked. These tests pin what the fix relies on.
"""

from __future__ import annotations

import asyncio
import sys

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from cellblock.bridge.v1 import bridge_service_pb2 as pb
from tests.support.bridge_oracle import DEEP_DEPTH, SHALLOW_DEPTH, expect, nesting
from tests.support.fuzz_cells import run_drawn


def _yield(n: int, depth: int) -> bytes:
    args = "[" * depth + "]" * depth
    return pb.AttachRequest(request=pb.GuestRequest(bridge_id=f"bridge:yield:{n}", method="yield", args_json=args)).SerializeToString()


def _kinds(messages: list[bytes]) -> list[str]:
    return [a.kind for a in expect(messages, good_token=True, timeout_ms=1000, memory_limit_bytes=1 << 26).answers]


def test_hypothesis_raises_the_recursion_limit_inside_a_test_body() -> None:
    # Why plans must not run there: a text nested DEEP_DEPTH deep parses, which at the service's limit it never does.
    outside = sys.getrecursionlimit()
    inside: list[int] = []

    @settings(max_examples=1, database=None)
    @given(st.just(0))
    def body(_: int) -> None:
        inside.append(sys.getrecursionlimit())

    body()
    assert outside <= DEEP_DEPTH
    assert inside[0] > DEEP_DEPTH + 500


def test_the_oracle_refuses_to_predict_inside_a_test_body() -> None:
    @settings(max_examples=1, database=None)
    @given(st.just(0))
    def body(_: int) -> None:
        with pytest.raises(AssertionError, match="recursion limit"):
            expect([_yield(1, 2)], good_token=True, timeout_ms=1000, memory_limit_bytes=1 << 26)

    body()


def test_the_oracle_counts_depth_without_its_own_stack() -> None:
    assert nesting('[1, "[[[[", {"a": [[]]}, "\\"]"]') == 4
    assert nesting("[" * 100_000 + "]" * 100_000) == 100_000
    assert _kinds([_yield(1, DEEP_DEPTH), _yield(2, 3000), _yield(3, SHALLOW_DEPTH)]) == ["B23", "B23", "accepted"]
    with pytest.raises(AssertionError, match="documents no answer"):
        _kinds([_yield(1, SHALLOW_DEPTH + 1)])


@pytest.mark.asyncio(loop_scope="function")
async def test_drawn_plans_run_at_the_services_recursion_limit() -> None:
    limit = sys.getrecursionlimit()
    seen: list[tuple[int, list[str]]] = []

    async def one(depth: int) -> None:
        await asyncio.sleep(0)
        seen.append((sys.getrecursionlimit(), _kinds([_yield(1, depth), _yield(2, 1)])))

    assert await run_drawn(st.integers(DEEP_DEPTH, 3000), 5, one) == 5
    assert seen == [(limit, ["B23", "accepted"])] * 5
