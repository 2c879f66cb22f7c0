"""compact_json (C encoder plus float fixes) writes exactly what the walk in Python writes (SPEC §0.3 item 2)."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from cellblock.server.catalog import _text, compact_json

_VALUES = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats() | st.text(),
    lambda children: st.lists(children) | st.dictionaries(st.text(), children),
    max_leaves=30,
)


@settings(max_examples=2000, deadline=None)
@given(_VALUES)
def test_the_fast_path_equals_the_walk(value: Any) -> None:
    assert compact_json(value) == _text._slow_compact_json(value)


@pytest.mark.parametrize(
    ("value", "text"),
    [
        (1.0, "1"), (-0.0, "0"), (1e21, "1e+21"), (1e16, "10000000000000000"), (5.630356893690665e16, "56303568936906650"),
        (1e-5, "0.00001"), (1.5e-7, "1.5e-7"), (float("nan"), "null"), (float("inf"), "null"),
        ({"a": "\ud800x"}, '{"a":"\\ud800x"}'), ("v1.5 e+3", '"v1.5 e+3"'), ({"k": [1, 2.5]}, '{"k":[1,2.5]}'),
    ],
)  # fmt: skip
def test_javascript_numbers_and_lone_surrogates(value: Any, text: str) -> None:
    assert compact_json(value) == text


def test_non_json_values_still_raise() -> None:
    with pytest.raises(TypeError):
        compact_json({"a": object()})
    # Number keys become their text, as JavaScript's object keys do.
    assert compact_json({1: 1}) == '{"1":1}'
