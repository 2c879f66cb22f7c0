"""The host counts a JSON text's nesting exactly, on the text (SPEC §8.8 rule 7, issue 11 items 2 and 4).

Before, the host's second layer of the value nesting bound was its parser's recursion: about
950 levels on the loop, 990 in a worker, 1950 with hypothesis's raised recursion limit.
"""

from __future__ import annotations

import json
import random
import sys
from typing import Any

import pytest

from cellblock.server.catalog import nests_deeper, strict_json
from cellblock.server.limits import MAX_VALUE_DEPTH
from cellblock.server.runs._large_json import args_in_worker


def _nest(depth: int) -> str:
    return "[" * depth + "]" * depth


def _depth(value: Any) -> int:
    """The reference: levels of arrays and objects of a decoded value, walked with a stack."""
    deepest, stack = 0, [(value, 1)]
    while stack:
        v, level = stack.pop()
        if isinstance(v, (list, dict)):
            deepest = max(deepest, level)
            stack.extend((x, level + 1) for x in (v.values() if isinstance(v, dict) else v))
    return deepest


@pytest.mark.parametrize(("depth", "deeper"), [(0, False), (1, False), (MAX_VALUE_DEPTH, False), (MAX_VALUE_DEPTH + 1, True), (600, True), (100_000, True)])
def test_nesting_is_counted_at_the_bound(depth: int, deeper: bool) -> None:
    assert nests_deeper(_nest(depth), MAX_VALUE_DEPTH) is deeper
    mixed = '{"a": ' * depth + "[1, {}]" + "}" * depth  # objects count like arrays: depth + 2 levels
    assert nests_deeper(mixed, depth + 2) is False
    assert nests_deeper(mixed, depth + 1) is True


@pytest.mark.parametrize(
    "text",
    [
        '"' + "[" * 1000 + '"',  # brackets in a string
        '["' + "{" * 300 + '", "' + "]" * 300 + '"]',
        '["\\"' + "[" * 300 + '"]',  # an escaped quote does not end the string
        '["\\\\\\"[[[", "' + "[" * 300 + '"]',
        '{"' + "[" * 300 + '": "' + "}" * 300 + '"}',  # in keys too
        '["é' + "[" * 300 + '\ud83d\ude00"]',
    ],
)
def test_brackets_inside_strings_do_not_count(text: str) -> None:
    assert _depth(json.loads(text)) <= 2
    assert not nests_deeper(text, 2)


def test_an_escaped_backslash_ends_before_the_quote() -> None:
    # "\\" is a string of one backslash: the brackets after it are structure.
    text = '["\\\\", ' + _nest(MAX_VALUE_DEPTH) + "]"
    assert _depth(json.loads(text)) == MAX_VALUE_DEPTH + 1
    assert nests_deeper(text, MAX_VALUE_DEPTH) and not nests_deeper(text, MAX_VALUE_DEPTH + 1)


def test_random_values_match_a_walk_of_the_decoded_value() -> None:
    rng = random.Random(11)
    pieces = ["[", "]", "{", "}", '"', "\\", "é", "x"]

    def draw(level: int) -> Any:
        if level == 0 or rng.random() < 0.25:
            return rng.choice(["".join(rng.choices(pieces, k=rng.randint(0, 6))), 1.5, None, True])
        if rng.random() < 0.5:
            return [draw(level - 1) for _ in range(rng.randint(0, 3))]
        return {"".join(rng.choices(pieces, k=3)): draw(level - 1) for _ in range(rng.randint(0, 3))}

    for _ in range(3000):
        value = draw(rng.randint(1, 14))
        text = json.dumps(value, ensure_ascii=rng.random() < 0.5, indent=rng.choice([None, 1]))
        depth = _depth(value)
        assert nests_deeper(text, depth) is False and nests_deeper(text, max(0, depth - 1)) is (depth > 0), text


def test_a_wide_text_near_the_bound_is_counted_across_chunks() -> None:
    # Many brackets (over 64 KiB) held near the bound: each chunk of 256 could cross it.
    inner = ",".join([_nest(8)] * 4000)
    assert not nests_deeper("[" * (MAX_VALUE_DEPTH - 8) + inner + "]" * (MAX_VALUE_DEPTH - 8), MAX_VALUE_DEPTH)
    assert nests_deeper("[" * (MAX_VALUE_DEPTH - 7) + inner + "]" * (MAX_VALUE_DEPTH - 7), MAX_VALUE_DEPTH)
    late = "[" + ",".join(["[1]"] * 30_000) + "," + _nest(MAX_VALUE_DEPTH) + "]"
    assert nests_deeper(late, MAX_VALUE_DEPTH) and not nests_deeper(late, MAX_VALUE_DEPTH + 1)


def test_strict_json_refuses_past_max_depth_whatever_the_recursion_limit() -> None:
    assert strict_json(_nest(MAX_VALUE_DEPTH), MAX_VALUE_DEPTH) is not None
    with pytest.raises(RecursionError, match="nested deeper than 256 levels"):
        strict_json(_nest(MAX_VALUE_DEPTH + 1), MAX_VALUE_DEPTH)
    with pytest.raises(RecursionError):  # past the parser: the same exception, so the same outcome
        strict_json(_nest(100_000), MAX_VALUE_DEPTH)
    limit = sys.getrecursionlimit()
    sys.setrecursionlimit(limit + 2000)  # as hypothesis does while a test body runs
    try:
        with pytest.raises(RecursionError, match="nested deeper than 256 levels"):
            strict_json(_nest(1500), MAX_VALUE_DEPTH)
    finally:
        sys.setrecursionlimit(limit)


@pytest.mark.parametrize(("depth", "too_deep"), [(MAX_VALUE_DEPTH, False), (MAX_VALUE_DEPTH + 1, True), (600, True)])
def test_arguments_read_in_a_worker_count_each_argument(depth: int, too_deep: bool) -> None:
    # Each argument at most MAX_VALUE_DEPTH levels; the array that holds them is one more.
    text = '["host:core:free", {"p": "' + "p" * 70_000 + '", "v": ' + _nest(depth - 1) + "}]"
    args, deep = args_in_worker(text, 1)
    assert deep is too_deep
    assert (args == []) is too_deep
