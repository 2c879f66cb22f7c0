"""The front door's pure parts (SPEC §3.7): settings, results, streamed entries, the log gate, the command line."""

from __future__ import annotations

import importlib
import json
import tomllib
from pathlib import Path

import pytest

from cellblock.client import OutputEntry, RunResult
from cellblock.frontdoor import build_parser, entry_json, tool_result
from cellblock.frontdoor._cli import _front_door_settings
from cellblock.frontdoor._door import _allows, _compact

ROOT = Path(__file__).resolve().parents[3]


def test_code_mode_is_engaged_unless_configured(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("CELLBLOCK_CODE_MODE", raising=False)
    settings = _front_door_settings(None, "/tmp/private")
    assert settings.code_mode == {"enabled": True}
    assert settings.address == "unix:/tmp/private/grpc.sock"
    monkeypatch.setenv("CELLBLOCK_CODE_MODE", json.dumps({"enabled": "auto", "timeoutMs": 5000}))
    settings = _front_door_settings("127.0.0.1:50051", "/tmp/private")
    assert settings.code_mode == {"enabled": "auto", "timeoutMs": 5000}
    assert settings.address == "127.0.0.1:50051"


def test_a_result_is_the_model_facing_json_verbatim() -> None:
    raw = '{"status":"failed","error":"Error: boom","code":"internal_error","output":[]}'
    result = tool_result(RunResult(status="failed", raw_json=raw, trace_id="0af7651916cd43dd8448eb211c80319c"))
    dumped = result.model_dump(mode="json", by_alias=True, exclude_none=True)
    assert dumped["content"] == [{"type": "text", "text": raw}]
    assert dumped["structuredContent"] == json.loads(raw)
    assert dumped["isError"] is True
    assert dumped["_meta"] == {"cellblock/traceId": "0af7651916cd43dd8448eb211c80319c"}
    completed = tool_result(RunResult(status="completed", raw_json='{"status":"completed","value":[1]}'))
    assert completed.is_error is False and completed.meta is None


def test_streamed_entries_keep_their_spec_shape() -> None:
    assert entry_json(OutputEntry(type="text", text="hi")) == {"type": "text", "text": "hi"}
    assert entry_json(OutputEntry(type="json", value={"a": [1, None]})) == {"type": "json", "value": {"a": [1, None]}}


@pytest.mark.parametrize(("requested", "sent"), [(None, False), ("debug", True), ("info", True), ("warning", False), ("bogus", False)])
def test_log_entries_only_for_sessions_that_asked_for_info(requested: str | None, sent: bool) -> None:
    assert _allows(requested, "info") is sent


def test_the_command_line() -> None:
    parser = build_parser()
    args = parser.parse_args(["mcp", "--transport", "http", "--port", "9000", "--also-grpc", "127.0.0.1:50051"])
    assert (args.transport, args.port, args.also_grpc, args.connect, args.path) == ("http", 9000, "127.0.0.1:50051", None, "/mcp")
    with pytest.raises(SystemExit):
        parser.parse_args(["mcp", "--connect", "127.0.0.1:1", "--also-grpc", "127.0.0.1:2"])
    assert parser.parse_args(["mcp", "--session-idle", "1.5"]).session_idle == 1.5


@pytest.mark.parametrize("idle", ["0", "-5", "inf", "nan", "soon"])
def test_a_session_idle_time_that_is_not_positive_is_a_usage_error(idle: str) -> None:
    with pytest.raises(SystemExit) as exited:
        build_parser().parse_args(["mcp", "--session-idle", idle])
    assert exited.value.code == 2


def test_the_console_script_names_the_entry_point() -> None:
    scripts = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["scripts"]
    module, _, name = scripts["cellblock"].partition(":")
    assert getattr(importlib.import_module(module), name) is importlib.import_module("cellblock.frontdoor").main


def test_a_result_with_a_lone_surrogate_is_written_as_utf8_json() -> None:
    # The service writes a guest's lone surrogate as an escape; decoded, the MCP SDK could not write it.
    raw = '{"status":"completed","value":["\\ud800","\\ud83d\\ude00","\\\\ud800","x\\udc00"],"output":[]}'
    result = tool_result(RunResult(status="completed", raw_json=raw))
    assert result.content[0].text == raw  # the text content is kept verbatim
    assert result.structured_content == {"status": "completed", "value": ["\ufffd", "\U0001f600", "\\ud800", "x\ufffd"], "output": []}
    json.loads(result.model_dump_json(by_alias=True))  # raised PydanticSerializationError before
    assert _compact({"a": "\ud800é"}) == '{"a":"\\ufffd\\u00e9"}'
    assert _compact({"a": "é"}) == '{"a":"é"}'
