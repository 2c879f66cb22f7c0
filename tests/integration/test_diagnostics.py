"""Source checks and diagnostics through the real service (issue #6).

Every source rejection is answered before any cell starts (the executor's
counter does not move) and fast; runtime errors carry user stack frames with
the user's line numbers, also after a wait.
"""

from __future__ import annotations

import json
import time
from typing import Any

import pytest

from cellblock.client import CellblockClient, LimitOverrides, Scope, Tool
from cellblock.server.app import Service
from tests.support.cells import cells_asked_for

pytestmark = pytest.mark.asyncio(loop_scope="session")

REJECTIONS = [
    ({"code": "ls -la /tmp"}, "exec runs JavaScript or TypeScript, not shell commands"),
    ({"code": "cat file.txt | grep foo"}, "exec runs JavaScript or TypeScript, not shell commands"),
    ({"code": "const x = ;"}, "SyntaxError at cellblock:user.js:1:11: "),
    ({"code": "const s = '😀';\nconst b = s +;"}, "SyntaxError at cellblock:user.js:2:14: "),
    ({"code": "import fs from 'fs';"}, "module access is disabled"),
    ({"code": "const m = await import('os');"}, "module access is disabled"),
    ({"code": "const fs = require('fs');"}, "module access is disabled"),
    ({"code": "enum Color { Red }", "language": "typescript"}, "TypeScript at cellblock:user.js:1:1 needs code generation (enum)"),
    ({"code": "return 1", "language": "python"}, 'language must be "javascript" or "typescript".'),
    ({"code": "return 1", "typecheck": False}, "type checking is not supported"),
    ({"code": "return 1", "restartSafe": "yes"}, "restartSafe must be true or false."),
    ({"command": "return 1", "code": "return 2"}, "code and command must be identical"),
    ({"code": "   "}, "code must be a non-empty string (command is accepted as an alias)."),
]


@pytest.mark.parametrize(("arguments", "message"), REJECTIONS, ids=[json.dumps(a)[:40] for a, _ in REJECTIONS])
async def test_rejections_start_no_cell_and_answer_fast(client: CellblockClient, scope: Scope, service: Service, arguments: dict[str, Any], message: str) -> None:
    await client.put_catalog(scope, [Tool(source="host", name="noop")])
    await client.exec(scope, tool_call_id="warm", arguments={"code": "ls"}, handlers={})  # warm the parser
    before = cells_asked_for(service)
    started = time.monotonic()
    result = await client.exec(scope, tool_call_id="reject", arguments=arguments, handlers={})
    elapsed_ms = (time.monotonic() - started) * 1000
    assert (result.status, result.code, result.failure_phase, result.bridge_dispatch_started) == ("failed", "invalid_input", "input", False), result.raw_json
    assert message in result.error
    assert cells_asked_for(service) == before, "a rejected source must not start a cell"
    # Source preparation runs in a worker process (issue 11); on a loaded 2-core machine its round
    # trip alone can pass 50 ms. The bound catches a cell start (seconds) or a hang, not jitter.
    assert elapsed_ms < 1000, f"{elapsed_ms:.1f} ms for a rejection (includes the gRPC round trip)"


async def test_typescript_runs_type_stripped_with_user_positions(client: CellblockClient, scope: Scope) -> None:
    await client.put_catalog(scope, [Tool(source="host", name="noop")])
    code = "interface P { x: number }\nconst p: P = { x: 2 };\nfunction f(a: number): number {\n  throw new RangeError(`bad ${a}`);\n}\nreturn f(p.x as number);"
    result = await client.exec(scope, tool_call_id="ts", arguments={"code": code, "language": "typescript"}, handlers={})
    assert result.status == "failed" and result.code == "internal_error" and result.failure_phase == "guest"
    lines = result.error.splitlines()
    assert lines[0] == "RangeError: bad 2"
    assert lines[1].startswith("    at f (cellblock:user.js:4:")
    assert lines[2].startswith("    at <anonymous> (cellblock:user.js:6:")


async def test_stack_frames_keep_user_lines_after_a_wait(client: CellblockClient, scope: Scope) -> None:
    await client.put_catalog(scope, [Tool(source="host", name="noop")])
    code = "const y = await yield_control('pause');\nfunction boom() {\n  throw new TypeError('after ' + y.status);\n}\nboom();"
    first = await client.exec(scope, tool_call_id="st", code=code, handlers={})
    assert first.status == "waiting"
    result = await client.wait(scope, tool_call_id="st-w", run_id=first.run_id)
    lines = result.error.splitlines()
    assert lines[0] == "TypeError: after yielded"
    assert lines[1].startswith("    at boom (cellblock:user.js:3:")
    assert lines[2].startswith("    at <anonymous> (cellblock:user.js:5:")
    assert not any("eval_script" in line or "<input>" in line or "controller" in line for line in lines)


async def test_runtime_syntax_error_from_eval_is_a_runtime_failure(client: CellblockClient, scope: Scope) -> None:
    await client.put_catalog(scope, [Tool(source="host", name="noop")])
    result = await client.exec(scope, tool_call_id="ev", code='JSON.parse("{");', handlers={}, limits=LimitOverrides(timeout_ms=5000))
    assert (result.code, result.failure_phase) == ("internal_error", "guest")
    assert result.error.startswith("SyntaxError:")


async def test_early_errors_the_parser_misses_are_still_invalid_input(client: CellblockClient, scope: Scope) -> None:
    await client.put_catalog(scope, [Tool(source="host", name="noop")])
    result = await client.exec(scope, tool_call_id="early", code="const a = 1;\n'use strict'; with ({}) {}\nreturn a;", handlers={})
    if result.status == "completed":
        return  # not an early error in the engine's sloppy-mode body
    assert (result.code, result.failure_phase, result.bridge_dispatch_started) == ("invalid_input", "input", False), result.raw_json
    assert result.error.startswith("SyntaxError at cellblock:user.js:")
    assert ":-" not in result.error, "no negative columns"
