"""exec and wait argument validation (SPEC §5.1, §5.2 items 1–2)."""

import json

import pytest

from cellblock.server import messages as m
from cellblock.server.source._input import (
    InputFailure,
    ValidatedExec,
    js_trim,
    validate_exec,
    validate_wait,
)

BOTH = ["javascript", "typescript"]

EXEC_CASES = [
    # (arguments, enabled, languages, force, expected)
    ('{"code": "return 1"}', False, BOTH, False, InputFailure(m.E08)),
    ("not json", False, BOTH, False, InputFailure(m.E08)),
    ("not json", True, BOTH, False, InputFailure(m.E01)),
    ("[1]", "auto", BOTH, False, InputFailure(m.E01)),
    ('"code"', True, BOTH, False, InputFailure(m.E01)),
    ('{"code": NaN}', True, BOTH, False, InputFailure(m.E01)),
    ("", True, BOTH, False, InputFailure(m.E01)),
    ('{"code": "a", "command": "b"}', True, BOTH, False, InputFailure(m.E02)),
    ('{"code": "a", "command": "a "}', True, BOTH, False, InputFailure(m.E02)),
    ('{"code": "a", "command": "b", "language": 7}', True, BOTH, False, InputFailure(m.E02)),
    ("{}", True, BOTH, False, InputFailure(m.E03)),
    ('{"code": null, "command": "  "}', True, BOTH, False, InputFailure(m.E03)),
    ('{"code": 5, "command": ["x"]}', True, BOTH, False, InputFailure(m.E03)),
    ('{"code": "\\u00a0\\ufeff\\n\\t"}', True, BOTH, False, InputFailure(m.E03)),
    ('{"code": "x", "language": 1, "typecheck": true}', True, BOTH, False, InputFailure(m.E04)),
    ('{"code": "x", "language": "bash"}', True, BOTH, False, InputFailure(m.E04)),
    ('{"code": "x", "language": "JavaScript"}', True, BOTH, False, InputFailure(m.E04)),
    (
        '{"code": "x", "language": "typescript", "typecheck": 1}',
        True,
        ["javascript"],
        False,
        InputFailure(m.e05("typescript")),
    ),
    (
        '{"code": "x", "language": "javascript"}',
        True,
        ["typescript"],
        False,
        InputFailure(m.e05("javascript")),
    ),
    ('{"code": "x", "typecheck": false}', True, BOTH, False, InputFailure(m.E06)),
    ('{"code": "x", "typecheck": null, "restartSafe": 1}', True, BOTH, False, InputFailure(m.E06)),
    ('{"code": "x", "restartSafe": "yes"}', True, BOTH, False, InputFailure(m.E07)),
    ('{"code": "x", "restartSafe": 0}', True, BOTH, False, InputFailure(m.E07)),
    # Accepted.
    ('{"code": " x "}', True, BOTH, False, ValidatedExec(" x ", "javascript", False)),
    ('{"command": "c", "code": "  "}', "auto", BOTH, False, ValidatedExec("c", "javascript", False)),
    ('{"command": "c", "code": "c"}', True, BOTH, False, ValidatedExec("c", "javascript", False)),
    ('{"code": "x", "language": null}', True, ["typescript"], False, ValidatedExec("x", "typescript", False)),
    ('{"code": "x"}', True, ["typescript", "javascript"], False, ValidatedExec("x", "javascript", False)),
    ('{"code": "x", "language": "typescript"}', True, BOTH, False, ValidatedExec("x", "typescript", False)),
    ('{"code": "x", "restartSafe": null}', True, BOTH, False, ValidatedExec("x", "javascript", False)),
    ('{"code": "x", "restartSafe": true}', True, BOTH, False, ValidatedExec("x", "javascript", True)),
    ('{"code": "x", "restartSafe": false}', True, BOTH, True, ValidatedExec("x", "javascript", True)),
    ('{"code": "x", "other": 1}', True, BOTH, False, ValidatedExec("x", "javascript", False)),
]


@pytest.mark.parametrize(("arguments", "enabled", "languages", "force", "expected"), EXEC_CASES)
def test_validate_exec(
    arguments: str, enabled: object, languages: list[str], force: bool, expected: object
) -> None:
    result = validate_exec(
        arguments, enabled=enabled, languages=languages, force_restart_safe=force, max_source_bytes=1024  # type: ignore[arg-type]
    )
    assert result == expected


@pytest.mark.parametrize(("source", "fits"), [("x" * 1024, True), ("x" * 1025, False), ("é" * 512, True), ("é" * 513, False), ("\ud800" * 342, False)])
def test_validate_exec_bounds_the_program_size_in_utf8_bytes(source: str, fits: bool) -> None:
    """SPEC §5.1, §2.3: a program over the size bound is [E09], naming its size and the bound."""
    arguments = json.dumps({"command": source})
    result = validate_exec(arguments, enabled=True, languages=["javascript"], force_restart_safe=False, max_source_bytes=1024)
    if fits:
        assert isinstance(result, ValidatedExec)
    else:
        size = len(source.encode("utf-8", "surrogatepass"))
        assert result == InputFailure(m.e09(size, 1024))


@pytest.mark.parametrize(
    ("arguments", "expected"),
    [
        ("nope", InputFailure(m.W01)),
        ("[]", InputFailure(m.W01)),
        ("null", InputFailure(m.W01)),
        ("{}", InputFailure(m.W02)),
        ('{"runId": "  "}', InputFailure(m.W02)),
        ('{"runId": 5, "run_id": null}', InputFailure(m.W02)),
        ('{"runId": " run_ab "}', "run_ab"),
        ('{"runId": "", "run_id": "run_cd\\n"}', "run_cd"),
        ('{"runId": "run_1", "run_id": "run_2"}', "run_1"),
    ],
)
def test_validate_wait(arguments: str, expected: object) -> None:
    assert validate_wait(arguments) == expected


@pytest.mark.parametrize("key", ["code", "command"])
def test_a_source_with_a_lone_surrogate_is_refused(key: str) -> None:
    """SPEC §5.1 item 5, §0.3 item 7: the cell reads UTF-8 only, so a lone surrogate is [E11], never sent."""
    for source in ("return '\\ud800'", "x\\udfffy", "\\ud800" * 341):
        arguments = '{"' + key + '": "' + source + '"}'
        assert validate_exec(arguments, enabled=True, languages=["javascript"], force_restart_safe=False, max_source_bytes=1024) == InputFailure(m.E11)
    # A pair spelt as escapes is one character; an escape inside the program's own text is ASCII.
    for source, kept in (("\\ud83d\\ude00", "\U0001f600"), ("\\\\ud800", "\\ud800")):
        result = validate_exec('{"code": "' + source + '"}', enabled=True, languages=["javascript"], force_restart_safe=False, max_source_bytes=1024)
        assert result == ValidatedExec(kept, "javascript", False)


@pytest.mark.parametrize("arguments", ['{"runId": "run_\\ud800"}', '{"run_id": " \\udc00 "}', '{"runId": 1, "run_id": "run_a\\udbffb"}'])
def test_a_run_id_with_a_lone_surrogate_is_refused(arguments: str) -> None:
    """SPEC §5.2 item 2: no run id has one and the run store cannot take it: [W09], before any lookup."""
    assert validate_wait(arguments) == InputFailure(m.W09)


def test_js_trim_matches_ecmascript() -> None:
    assert js_trim("\u2028\u3000\ufeff a \u00a0\r\n") == "a"
    assert js_trim("\x1c a") == "\x1c a"


@pytest.mark.parametrize("depth", [2_000, 100_000])
def test_arguments_nested_past_the_parser_get_the_depth_reason(depth: int) -> None:
    deep = '{"code":"return 1","runId":"run_1","x":' + "[" * depth + "]" * depth + "}"
    result = validate_exec(deep, enabled=True, languages=["javascript"], force_restart_safe=False, max_source_bytes=1024)
    assert isinstance(result, InputFailure) and result.message == m.E10
    waited = validate_wait(deep)
    assert isinstance(waited, InputFailure) and waited.message == m.W07
