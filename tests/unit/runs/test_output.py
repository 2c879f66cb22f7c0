"""Output budget (SPEC §9), compact JSON (§0.3) and host JSON safety (§8.8 rule 5)."""

import json
import math

import pytest

from cellblock.server.runs._large_json import read_final_value
from cellblock.server.runs._output import (
    GUIDANCE,
    JsonText,
    NotSerializableError,
    OutputBudget,
    compact_json,
    entry_size,
    normalize_json,
    utf8_prefix,
)


def text(value: str) -> dict[str, object]:
    return {"type": "text", "text": value}


def reference_size(value: object) -> int:
    """Compact JSON size computed with the standard library (valid UTF-8 input only)."""
    return len(json.dumps(value, ensure_ascii=False, separators=(",", ":")).encode())


def test_guidance_text() -> None:
    assert GUIDANCE == "Output truncated; rerun with narrower arguments or return less data."


def test_entry_size_is_compact_json_bytes() -> None:
    assert entry_size(text("abc")) == len('{"type":"text","text":"abc"}') == 28
    assert entry_size(text("é")) == 27
    assert entry_size({"type": "json", "value": [1, 2]}) == 29
    assert entry_size(text("\ud800")) == len('{"type":"text","text":"\\ud800"}')


def test_leg_marker_contents_and_key_order() -> None:
    budget = OutputBudget(1024)  # B = 1024, R = 256, C = 768, K = 256
    assert budget.remaining_allowance() == 768
    assert budget.offer(text("a" * 400)) is True  # 425 bytes; 425 + 256 <= 768
    assert budget.spent == 425
    assert budget.offer(text("é" * 300)) is False  # 625 bytes: closes the channel
    assert budget.offer({"type": "json", "value": [1, 2]}) is False  # 29 bytes
    assert budget.offer(text("")) is False  # closed: omitted although it would fit
    assert budget.remaining_allowance() == 0
    [marker] = budget.end_leg()
    assert list(marker) == [
        "type",
        "truncated",
        "omittedBytes",
        "omittedEntries",
        "guidance",
        "prefix",
    ]
    # The longest prefix of whole characters that keeps spent + size(marker) <= C.
    assert marker == {
        "type": "truncated",
        "truncated": True,
        "omittedBytes": 625 + 29 + 25 - 174,
        "omittedEntries": 3,
        "guidance": GUIDANCE,
        "prefix": "é" * 87,
    }
    assert 425 + reference_size(marker) <= 768
    bigger = dict(marker, prefix="é" * 88, omittedBytes=marker["omittedBytes"] - 2)
    assert 425 + reference_size(bigger) > 768
    assert budget.spent == 425 + reference_size(marker)
    assert budget.end_leg() == []


def test_marker_prefix_never_splits_a_character() -> None:
    budget = OutputBudget(1024)
    assert budget.offer(text("a" * 401)) is True  # 426 bytes: one byte less left
    assert budget.offer(text("€" * 300)) is False  # 3-byte characters
    [marker] = budget.end_leg()
    prefix = marker["prefix"]
    assert set(prefix) == {"€"}
    assert 426 + reference_size(marker) <= 768
    assert 426 + reference_size(dict(marker, prefix=prefix + "€")) > 768
    assert marker["omittedBytes"] == 23 + 900 + 2 - len(prefix.encode())


def test_json_entry_prefix_is_its_compact_json() -> None:
    budget = OutputBudget(1024)
    assert budget.offer({"type": "json", "value": {"k": "v" * 1000}}) is False
    [marker] = budget.end_leg()
    assert marker["prefix"].startswith('{"k":"vvv')
    assert reference_size(marker) <= 768


def test_one_budget_is_shared_across_legs() -> None:
    budget = OutputBudget(1024)
    assert budget.offer(text("x" * 275)) is True  # 300 bytes
    assert budget.end_leg() == []
    # Leg 2 starts with what leg 1 left.
    assert budget.remaining_allowance() == 468
    assert budget.offer(text("y" * 275)) is False  # 300 + 300 + 256 > 768
    [first] = budget.end_leg()
    assert first["omittedEntries"] == 1
    # Leg 3: the channel stays closed; an empty-prefix marker may pass C.
    budget.spent = 768
    assert budget.offer(text("z")) is False
    [second] = budget.end_leg()
    assert second == {
        "type": "truncated",
        "truncated": True,
        "omittedBytes": 26,
        "omittedEntries": 1,
        "guidance": GUIDANCE,
        "prefix": "",
    }
    assert budget.spent == 768 + reference_size(second)


def test_small_output_leaves_the_rest_to_the_value() -> None:
    budget = OutputBudget(1024)
    assert budget.offer(text("abc")) is True
    assert budget.final_allowance() == 1024 - 28
    value = {"data": "v" * 900}
    assert budget.final_value(value) is value


def test_value_truncation() -> None:
    budget = OutputBudget(1024)
    marker = budget.final_value("x" * 2000)  # compact JSON: 2002 bytes
    assert list(marker) == ["truncated", "omittedBytes", "guidance", "prefix"]
    prefix = marker["prefix"]
    assert prefix == '"' + "x" * (len(prefix) - 1)
    assert marker["omittedBytes"] == 2002 - len(prefix)
    assert reference_size(marker) <= 1024
    longer = dict(marker, prefix=prefix + "x", omittedBytes=marker["omittedBytes"] - 1)
    assert reference_size(longer) > 1024
    assert marker == {
        "truncated": True,
        "omittedBytes": 2002 - 891,
        "guidance": GUIDANCE,
        "prefix": '"' + "x" * 890,  # the quote is escaped: 892 bytes in the marker
    }


def test_value_truncation_with_multibyte_characters() -> None:
    budget = OutputBudget(1024)
    marker = budget.final_value(["😀" * 400])
    prefix = marker["prefix"]
    assert prefix.startswith('["😀')
    assert "\ufffd" not in prefix
    assert marker["omittedBytes"] == 4 + 1600 - len(prefix.encode())
    assert reference_size(marker) <= 1024 < reference_size(dict(marker, prefix=prefix + "😀"))


@pytest.mark.parametrize("value", ["x" * 2000, ["😀" * 400], {"a": [1, 2.5, None, "é" * 700]}])
def test_a_value_projected_from_its_text_matches_the_parsed_projection(value: object) -> None:
    # The host projects a value too large to parse from the compact JSON the cell sent (issue 11).
    assert OutputBudget(1024).final_text(compact_json(value)) == OutputBudget(1024).final_value(value)


def test_an_unread_text_that_fits_is_refused_not_returned_unread() -> None:
    # The leg's end reads every value that fits; one that reached final_text unread fails closed.
    with pytest.raises(NotSerializableError):
        OutputBudget(1024).final_text('"fits"')


@pytest.mark.parametrize("value", ["x" * 2000, ["😀" * 400], {"a": [1, 2.5, None, "é" * 700]}, "fits", {"n": 1e21}])
def test_a_value_read_once_projects_as_the_parsed_value(value: object) -> None:
    # The leg's end reads the value once into its compact text; the budget measures that text and
    # keeps it (never serialised again), with the marker the parsed value would get.
    read = read_final_value(json.dumps(value, ensure_ascii=False))
    assert isinstance(read, JsonText) and read.text == compact_json(value)
    projected = OutputBudget(1024).final_value(read)
    expected = OutputBudget(1024).final_value(value)
    assert (projected is read) if expected is value else (projected == expected)


@pytest.mark.parametrize(
    ("text", "expected"),
    [("[" * 257 + "]" * 257, "nesting is deeper than 256 levels"), ("[" * 100_000 + "]" * 100_000, "nesting is deeper than 256 levels"), ("NaN", None), ("[1,", None)],
)
def test_reading_a_final_value_names_its_problem(text: str, expected: str | None) -> None:
    # [R15] with its reason, or None for [R17]: the outcomes the leg's end maps them to.
    assert read_final_value(text) == expected


@pytest.mark.parametrize(
    ("error", "spent", "expected"),
    [
        ("boom", 0, "boom"),
        ("e" * 1024, 0, "e" * 1024),
        ("e" * 1025, 0, "e" * 1006 + " [error truncated]"),
        ("é" * 1000, 0, "é" * 503 + " [error truncated]"),
        ("😀" * 1000, 0, "😀" * 251 + " [error truncated]"),
        ("e" * 100, 1000, "e" * 6 + " [error truncated]"),
        ("e" * 100, 1006, "[error truncated]"),
        ("e" * 100, 1020, "[error truncated]"),
        ("e" * 100, 5000, "[error truncated]"),
    ],
)
def test_error_truncation(error: str, spent: int, expected: str) -> None:
    budget = OutputBudget(1024)
    budget.spent = spent
    assert budget.final_error(error) == expected


def test_value_and_error_always_keep_the_reserve() -> None:
    budget = OutputBudget(1024)
    while budget.offer(text("w" * 50)):
        pass
    budget.end_leg()
    assert budget.final_allowance() >= 256


def test_compact_json() -> None:
    assert compact_json({"a": [1, None, True, False], "b": {"c": "d"}}) == (
        '{"a":[1,null,true,false],"b":{"c":"d"}}'
    )
    assert compact_json("é😀\u2028") == '"é😀\u2028"'
    assert compact_json("a\ud800b") == '"a\\ud800b"'
    assert compact_json({"k\udfff": "\ud83d"}) == '{"k\\udfff":"\\ud83d"}'
    assert compact_json("\n\x01\"\\") == '"\\n\\u0001\\"\\\\"'
    assert compact_json([1.0, 1.5, -0.0, 1e21, 1e20, 1e-7, 0.000001, float("nan")]) == (
        "[1,1.5,0,1e+21,100000000000000000000,1e-7,0.000001,null]"
    )
    assert compact_json("a\ud800b").encode("utf-8")  # always valid UTF-8


def test_utf8_prefix() -> None:
    assert utf8_prefix("aé😀", 1) == "a"
    assert utf8_prefix("aé😀", 2) == "a"
    assert utf8_prefix("aé😀", 3) == "aé"
    assert utf8_prefix("aé😀", 6) == "aé"
    assert utf8_prefix("aé😀", 7) == "aé😀"
    assert utf8_prefix("abc", 0) == ""


def test_normalize_json() -> None:
    value = {
        "a": math.nan,
        "b": [math.inf, -math.inf, -0.0, 2.5],
        "__proto__": {"constructor": 1},
        "constructor": (1, 2),
        "o": object(),
    }
    result = normalize_json(value)
    assert result == {
        "a": None,
        "b": [None, None, 0, 2.5],
        "__proto__": {"constructor": 1},
        "constructor": [1, 2],
        "o": "[object Object]",
    }
    assert list(result) == ["a", "b", "__proto__", "constructor", "o"]
    assert math.copysign(1, result["b"][2]) == 1
    assert compact_json(result) == (
        '{"a":null,"b":[null,null,0,2.5],"__proto__":{"constructor":1},'
        '"constructor":[1,2],"o":"[object Object]"}'
    )
