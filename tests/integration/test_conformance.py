"""Contract classes found by acceptance testing (issue 12), each with real cells.

Every test drives the real service over gRPC with real Docker cells and real
QuickJS, and covers a whole class (all output channels, all probe shapes, ...)
rather than one example.
"""

from __future__ import annotations

import asyncio
import json
import time
from typing import Any

import pytest

from cellblock.client import CellblockClient, LimitOverrides, RunResult, Scope, Tool
from tests.support.cells import cells_asked_for

pytestmark = pytest.mark.asyncio(loop_scope="session")

TOOLS = [
    Tool(source="host", owner="core", name="echo", description="Echo the input back.", parameters={"type": "object"}),
    Tool(source="host", owner="core", name="lookup", description="A replay-safe read.", parameters={"type": "object"}, replay_safe=True),
]


async def _echo(tool_input: dict[str, Any], call: Any) -> dict[str, Any]:
    return {"details": tool_input}


HANDLERS = {"echo": _echo, "lookup": _echo}


def _model_output(result: RunResult) -> list[dict[str, Any]]:
    return list(json.loads(result.raw_json)["output"])


def _size(value: Any) -> int:
    return len(json.dumps(value, separators=(",", ":"), ensure_ascii=False).encode("utf-8", "surrogatepass"))


# ------------------------------------------------------------------ item 2: truncation on every channel
#: One producer per output channel; each floods 120 entries of ~110 bytes.
CHANNELS = {
    "text": "text('x'.repeat(100))",
    "json": "json({ v: 'x'.repeat(100) })",
    "console": "console.log('x'.repeat(100))",
    "mixed": "[text, (v) => json([v]), console.error][i % 3]('y'.repeat(100))",
}
#: How the program ends after the flood, with the status and code it must keep,
#: and the leg's timeoutMs. Only "times out" needs a short deadline: the memory
#: loop needs about 0.5 s of CPU, which takes several seconds on a loaded
#: machine (cells get one CPU), and with 3 s it timed out there instead.
ENDINGS = {
    "returns": ("return 'done';", "completed", None, 3000),
    "throws": ("throw new Error('after the flood');", "failed", "internal_error", 3000),
    "times out": ("for (;;) {}", "failed", "timeout", 3000),
    "exhausts memory": ("const a = []; for (;;) a.push('z'.repeat(4096) + a.length);", "failed", "runtime_unavailable", 30000),
}


@pytest.mark.parametrize("channel", sorted(CHANNELS))
@pytest.mark.parametrize("ending", sorted(ENDINGS))
async def test_output_flood_ends_with_marker_on_every_channel_and_outcome(client: CellblockClient, scope: Scope, channel: str, ending: str) -> None:
    """SPEC §9 rules 4-5, 9: whichever channel crosses the budget, and however the leg ends."""
    await client.put_catalog(scope, TOOLS)
    tail, status, code, timeout_ms = ENDINGS[ending]
    program = f"for (let i = 0; i < 120; i++) {CHANNELS[channel]};\n{tail}"
    limits = LimitOverrides(max_output_bytes=4096, timeout_ms=timeout_ms, memory_limit_bytes=16 * 1024 * 1024)
    result = await client.exec(scope, tool_call_id="flood", code=program, handlers=HANDLERS, limits=limits)
    assert result.status == status and result.code == code, result.raw_json[:400]
    output = _model_output(result)
    assert output, "nothing was delivered"
    marker = output[-1]
    assert marker["type"] == "truncated" and marker["truncated"] is True, f"the output does not end with the marker: {output[-1]}"
    assert all(e["type"] != "truncated" for e in output[:-1])
    assert marker["omittedEntries"] == 120 - (len(output) - 1)
    assert sum(_size(e) for e in output) <= 4096 - 4096 // 4


async def test_output_flood_in_a_resumed_leg_ends_with_marker(client: CellblockClient, scope: Scope) -> None:
    """The budget covers all legs: a flood after a wait is cut with its own marker."""
    await client.put_catalog(scope, TOOLS)
    program = "text('first leg');\nawait yield_control('pause');\nfor (let i = 0; i < 120; i++) console.log('x'.repeat(100));\nreturn 1;"
    limits = LimitOverrides(max_output_bytes=4096)
    first = await client.exec(scope, tool_call_id="flood-2", code=program, handlers=HANDLERS, limits=limits)
    assert first.status == "waiting" and _model_output(first) == [{"type": "text", "text": "first leg"}]
    second = await client.wait(scope, tool_call_id="w", run_id=first.run_id, handlers=HANDLERS)
    assert second.status == "completed" and second.value == 1
    output = _model_output(second)
    assert output[-1]["type"] == "truncated" and output[-1]["omittedEntries"] > 0


# ------------------------------------------------------------------ item 3: restartSafe after a yield
@pytest.mark.parametrize(
    "call, named",
    [
        ("tools.callValue('echo', {})", "echo"),
        ("tools.call('host:core:echo', {})", "host:core:echo"),
        ("tools.echo({})", "host:core:echo"),
    ],
)
async def test_restart_safe_run_fails_r03_for_unsafe_call_after_yield(client: CellblockClient, scope: Scope, call: str, named: str) -> None:
    """SPEC §10.8 item 2 applies to every leg: the resuming wait refuses, it does not park again."""
    await client.put_catalog(scope, TOOLS)
    calls: list[str] = []

    async def echo(tool_input: dict[str, Any], info: Any) -> dict[str, Any]:
        calls.append(info.catalog_id)
        return {"details": tool_input}

    program = f"await yield_control('checkpoint');\nawait {call};\nreturn 'unreachable';"
    first = await client.exec(scope, tool_call_id="rs", code=program, handlers={"echo": echo}, force_restart_safe=True)
    assert first.status == "waiting" and first.reason == "yield" and first.replay_safe is True
    second = await client.wait(scope, tool_call_id="w", run_id=first.run_id, handlers={"echo": echo})
    assert second.status == "failed", second.raw_json
    assert second.code == "invalid_input" and second.failure_phase == "host"
    assert second.error == f'restartSafe runs may only make replay-safe read calls, and "{named}" is not replay-safe; nothing was called. Run it again without restartSafe.'
    assert calls == [], "the unsafe call was dispatched"


async def test_restart_safe_run_keeps_replay_safe_calls_after_yield(client: CellblockClient, scope: Scope) -> None:
    """The same leg shape with a replay-safe call parks and completes replay-safe."""
    await client.put_catalog(scope, TOOLS)
    program = "await yield_control('checkpoint');\nconst v = await tools.callValue('host:core:lookup', { k: 1 });\nreturn v;"
    result = await client.exec(scope, tool_call_id="rs2", code=program, handlers=HANDLERS, force_restart_safe=True)
    for _ in range(4):
        if result.status != "waiting":
            break
        result = await client.wait(scope, tool_call_id="w", run_id=result.run_id, handlers=HANDLERS)
    assert result.status == "completed" and result.value == {"k": 1} and result.replay_safe is True, result.raw_json


# ------------------------------------------------------------------ item 4: user positions after a wait
#: Statements that throw on line 3 of the program; the expected error head and column.
THROWERS = {
    "new Error": ("  throw new Error('boom');", "Error: boom", 13),
    "property of null": ("  null.x;", "TypeError: cannot read property 'x' of null", None),
    "JSON.parse": ("  JSON.parse('{bad');", "SyntaxError: Expected property name or '}' in JSON at position 1 (line 1 column 2)", None),
    "BigInt mix": ("  10n ** 20n + 1;", "TypeError: cannot convert BigInt to number", None),
    "eval syntax": ("  eval('let = ;');", "SyntaxError:", None),
    "undefined call": ("  notDefined();", "ReferenceError: notDefined is not defined", 3),
}


@pytest.mark.parametrize("resume", ["no wait", "after yield", "after tool wait"])
@pytest.mark.parametrize("thrower", sorted(THROWERS))
async def test_runtime_error_reports_user_line_and_positive_column(client: CellblockClient, scope: Scope, thrower: str, resume: str) -> None:
    """SPEC §8.10 item 2: frames point into the submitted source (1-based lines and columns), after any number of waits."""
    await client.put_catalog(scope, TOOLS)
    line3, head, column = THROWERS[thrower]
    first_line = {
        "no wait": "const big = 2n ** 64n;",
        "after yield": "await yield_control('x');",
        # The call is still running when the exec parks; its result resumes the run.
        "after tool wait": "const pending = tools.callValue('echo', {}); await yield_control('x'); await pending;",
    }[resume]
    program = f"{first_line}\nlet n = 1;\n{line3}\nreturn n;"
    released = asyncio.Event()

    async def held_echo(tool_input: dict[str, Any], call: Any) -> dict[str, Any]:
        await released.wait()
        return {"details": tool_input}

    handlers = {"echo": held_echo}
    result = await client.exec(scope, tool_call_id="pos", code=program, handlers=handlers)
    released.set()
    legs = 0
    while result.status == "waiting" and legs < 5:
        legs += 1
        result = await client.wait(scope, tool_call_id=f"w{legs}", run_id=result.run_id, handlers=handlers)
    if resume != "no wait":
        assert legs >= 1, "the program never resumed after a wait"
    assert result.status == "failed" and result.code == "internal_error" and result.failure_phase == "guest", result.raw_json
    assert result.error is not None and result.error.startswith(head), result.error
    frames = result.error.split("\n")[1:]
    assert frames, f"no user frame: {result.error!r}"
    assert frames[0].startswith("    at <anonymous> (cellblock:user.js:3:"), result.error
    for frame in frames:
        location = frame.rsplit("(cellblock:user.js:", 1)[1].rstrip(")")
        line, col = (int(x) for x in location.split(":"))
        assert line >= 1 and col >= 1, f"position {line}:{col} in {result.error!r}"
    if column is not None:
        assert frames[0] == f"    at <anonymous> (cellblock:user.js:3:{column})"


# ------------------------------------------------------------------ item 8: mentions are not module access
MENTIONS = {
    "typeof probes": ('return [typeof require, typeof (require), typeof process, typeof module, typeof exports];', ["undefined"] * 5),
    "typeof in a condition": ('return typeof require !== "undefined" ? "node" : "cell";', "cell"),
    "properties and methods named import/require": ('const api = { import(x) { return x + 1; }, require: 2 }; return api.import(1) + api.require + api["require"];', 6),
    "class members": ("class A { import() { return 1; } static require() { return 2; } } return new A().import() + A.require();", 3),
    "strings, templates, comments": ('// require("fs")\nreturn ["import x from \'y\'", `require(${"z"})`, /import\\(/.source].length;', 3),
    "own bindings named module/process": ("const module = { exports: 1 }; const process = { env: 2 }; return module.exports + process.env;", 3),
    "global property reads": ('return [globalThis.require, "require" in globalThis, globalThis["process"]];', [None, False, None]),
}


@pytest.mark.parametrize("name", sorted(MENTIONS))
async def test_programs_that_only_mention_module_names_run(client: CellblockClient, scope: Scope, name: str) -> None:
    """SPEC §6.6: only real module access is refused."""
    await client.put_catalog(scope, TOOLS)
    code, value = MENTIONS[name]
    result = await client.exec(scope, tool_call_id="mention", code=code, handlers=HANDLERS)
    assert result.status == "completed", result.raw_json
    assert result.value == value


@pytest.mark.parametrize(
    "code",
    ["require('fs')", "const load = require;", "if (typeof require === 'function') require('fs');", "await import('fs')", "import.meta", "module.require('fs')", "process.getBuiltinModule('fs')"],
)
async def test_real_module_access_is_still_refused(client: CellblockClient, scope: Scope, code: str) -> None:
    await client.put_catalog(scope, TOOLS)
    result = await client.exec(scope, tool_call_id="module", code=code, handlers=HANDLERS)
    assert result.status == "failed" and result.code == "invalid_input" and result.failure_phase == "input"
    assert result.error.startswith("module access is disabled")


# ------------------------------------------------------------------ item 10: a tool-call flood ends in time
@pytest.mark.parametrize("calls", [2_000, 20_000])
async def test_tool_call_flood_ends_with_pending_cap_rejections_in_time(client: CellblockClient, scope: Scope, calls: int) -> None:
    """SPEC §8.2 item 3, §10.9: thousands of calls get B13 and the run keeps its normal outcome within timeoutMs + 2 s."""
    await client.put_catalog(scope, TOOLS)
    program = (
        "const results = [];\n"
        f"for (let i = 0; i < {calls}; i++) results.push(tools.callValue('echo', {{ i }}).then(() => 'ok', (e) => e.message));\n"
        "const settled = await Promise.all(results);\n"
        "const capped = settled.filter((m) => m.startsWith('too many pending host calls (limit 16)')).length;\n"
        "return { ok: settled.filter((m) => m === 'ok').length, capped };"
    )
    timeout_ms = 10_000
    started = time.monotonic()
    result = await client.exec(scope, tool_call_id="flood", code=program, handlers=HANDLERS, limits=LimitOverrides(timeout_ms=timeout_ms))
    elapsed = time.monotonic() - started
    assert result.status == "completed", result.raw_json[:400]
    assert result.value["ok"] == 16 and result.value["capped"] == calls - 16
    assert result.telemetry.call_count >= calls
    assert elapsed < timeout_ms / 1000 + 2.0, f"took {elapsed:.1f}s"


@pytest.mark.parametrize("which", [16, 500, 1999])
async def test_uncaught_pending_cap_rejection_inside_a_refusal_flood_is_a_bridge_failure(client: CellblockClient, scope: Scope, which: int) -> None:
    """SPEC §11.3: the host knows every refused id of a flood (recorded as ranges), first, middle or last."""
    await client.put_catalog(scope, TOOLS)
    program = f"const calls = [];\nfor (let i = 0; i < 2000; i++) {{ const p = tools.callValue('echo', {{ i }}); p.catch(() => {{}}); calls.push(p); }}\nawait calls[{which}];"
    result = await client.exec(scope, tool_call_id="cap", code=program, handlers=HANDLERS)
    assert result.status == "failed" and result.code == "internal_error" and result.failure_phase == "bridge", result.raw_json[:300]
    assert result.error.startswith("Error: too many pending host calls (limit 16); await some before starting more.")


# ------------------------------------------------------------------ item 9: oversized inputs get specific answers
@pytest.mark.parametrize("size", [1024 * 1024 + 1, 50 * 1000 * 1000])
async def test_oversized_program_is_invalid_input_naming_the_limit(client: CellblockClient, scope: Scope, service: Any, size: int) -> None:
    """SPEC §5.1, §2.3: a program over the size bound is refused before any cell starts."""
    await client.put_catalog(scope, TOOLS)
    before = cells_asked_for(service)
    program = "return 1; //" + "x" * (size - len("return 1; //"))
    result = await client.exec(scope, tool_call_id="big-program", code=program, handlers=HANDLERS)
    assert result.status == "failed" and result.code == "invalid_input" and result.failure_phase == "input", result.raw_json[:300]
    assert result.error == f"the program is {size} bytes, more than the 1048576-byte program limit; send a shorter program and fetch large data with tools."
    assert cells_asked_for(service) == before


async def test_program_at_the_size_bound_runs(client: CellblockClient, scope: Scope) -> None:
    await client.put_catalog(scope, TOOLS)
    program = "return 1; //" + "x" * (1024 * 1024 - len("return 1; //"))
    result = await client.exec(scope, tool_call_id="bound-program", code=program, handlers=HANDLERS)
    assert result.status == "completed" and result.value == 1, result.raw_json[:300]


async def test_tool_result_over_the_message_cap_is_b12_and_the_run_goes_on(client: CellblockClient, scope: Scope) -> None:
    """SPEC §3.5 item 5, §8.2 item 4: the guest gets B12; the stream and the run survive."""
    await client.put_catalog(scope, [*TOOLS, Tool(source="host", owner="core", name="huge", parameters={"type": "object"})])

    async def huge(tool_input: dict[str, Any], call: Any) -> dict[str, Any]:
        return {"details": "x" * (70 * 1024 * 1024)}

    program = "let refused;\ntry { await tools.callValue('huge', {}); } catch (e) { refused = e.message; }\nconst after = await tools.callValue('echo', { n: 2 });\nreturn { refused, after };"
    result = await client.exec(scope, tool_call_id="huge", code=program, handlers={**HANDLERS, "huge": huge})
    assert result.status == "completed", result.raw_json[:400]
    size = 70 * 1024 * 1024 + len('{"details":""}')
    assert result.value["refused"] == f'Tool "host:core:huge" returned {size} bytes, more than this cell accepts (10485760 bytes); ask for less data.'
    assert result.value["after"] == {"n": 2}


@pytest.mark.parametrize("depth", [10_000, 200_000])
async def test_deeply_nested_tool_result_gets_a_bounded_answer(client: CellblockClient, scope: Scope, depth: int) -> None:
    """A result nested deeper than any serialiser handles is rejected to the guest at once."""
    await client.put_catalog(scope, TOOLS)

    async def deep(tool_input: dict[str, Any], call: Any) -> dict[str, Any]:
        value: Any = []
        for _ in range(depth):
            value = [value]
        return {"details": value}

    program = "try { await tools.callValue('echo', {}); return 'accepted'; } catch (e) { return e.message; }"
    started = time.monotonic()
    result = await client.exec(scope, tool_call_id="deep", code=program, handlers={"echo": deep})
    assert result.status == "completed", result.raw_json[:300]
    assert result.value == "the tool result is nested too deeply to serialise as JSON"
    assert time.monotonic() - started < 8.0, "the run waited for an answer that never came"


# ------------------------------------------------------------------ item 11: registration errors name the tool
#: Invalid tools of every kind, each at index 1 after a valid one; how the error names it.
INVALID_REGISTRATIONS = {
    "output schema": (Tool(source="host", owner="shipping", name="quote", output_schema={"type": "object", "required": "id"}), "tool 1 (host:shipping:quote): outputSchema is not a valid JSON Schema"),
    "parameters schema": (Tool(source="host", owner="core", name="read", parameters={"type": "strnig"}), "tool 1 (host:core:read): parameters is not a valid JSON Schema"),
    "unresolvable $ref": (Tool(source="host", owner="core", name="ref", parameters={"$ref": "#/$defs/none"}), "tool 1 (host:core:ref): parameters is not a valid JSON Schema"),
    "owner": (Tool(source="client", owner="a b", name="pick"), 'tool 1 ("pick"): owner must not contain'),
    "duplicate id": (Tool(source="host", owner="core", name="ok"), "tool 1 (host:core:ok): duplicate id host:core:ok (also tool 0)"),
}


@pytest.mark.parametrize("case", sorted(INVALID_REGISTRATIONS))
async def test_registration_errors_name_the_tool(client: CellblockClient, scope: Scope, case: str) -> None:
    """SPEC §3.2 item 4: the error names the tool's index, its id (or name) and the problem."""
    from cellblock.client import InvalidArgumentError

    tool, expected = INVALID_REGISTRATIONS[case]
    with pytest.raises(InvalidArgumentError) as caught:
        await client.put_catalog(scope, [Tool(source="host", owner="core", name="ok"), tool])
    assert expected in str(caught.value), str(caught.value)


# ------------------------------------------------------------------ item 6: bridge records carry their ids
async def test_every_bridge_record_carries_bridge_id_and_nested_call_id(client: CellblockClient, scope: Scope) -> None:
    """SPEC §13 items 1, 4-5: records about bridge requests name them, in every leg."""
    import structlog

    from cellblock.client import ToolRefused
    from cellblock.server.logging import add_trace_ids

    await client.put_catalog(scope, TOOLS)

    async def refusing(tool_input: dict[str, Any], call: Any) -> dict[str, Any]:
        raise ToolRefused("blocked", "policy says no")

    program = (
        "await tools.callValue('echo', { n: 1 });\n"
        "try { await tools.callValue('lookup', {}); } catch (e) {}\n"
        "try { await tools.callValue('host:core:missing', {}); } catch (e) {}\n"
        "await yield_control('later');\n"
        "return await tools.callValue('echo', { n: 2 });"
    )
    with structlog.testing.capture_logs(processors=[structlog.contextvars.merge_contextvars, add_trace_ids]) as logs:
        first = await client.exec(scope, tool_call_id="ids", code=program, handlers={"echo": _echo, "lookup": refusing})
        assert first.status == "waiting", first.raw_json
        done = await client.wait(scope, tool_call_id="ids-wait", run_id=first.run_id, handlers={"echo": _echo})
        assert done.status == "completed" and done.value == {"n": 2}
    dispatched = [e for e in logs if e["event"] == "tool_call.dispatched"]
    answered = [e for e in logs if e["event"] == "tool_call.answered"]
    assert [e["bridge_id"] for e in dispatched] == ["bridge:callValue:1", "bridge:callValue:2", "bridge:callValue:4"]
    assert [e["bridge_id"] for e in answered] == ["bridge:callValue:1", "bridge:callValue:2", "bridge:callValue:4"]
    assert [e["outcome"] for e in answered] == ["ok", "blocked", "ok"]
    nested_ids = {e["bridge_id"]: e["nested_call_id"] for e in dispatched}
    assert all(v.startswith("cellblock_ids_") for v in nested_ids.values()) and len(set(nested_ids.values())) == 3
    for e in (*dispatched, *answered):
        assert e["nested_call_id"] == nested_ids[e["bridge_id"]]
        assert e["run_id"] == first.run_id and e["session_id"] == scope.session_id and e["tool_call_id"] == "ids"
    assert dispatched[-1]["wait_tool_call_id"] == "ids-wait"
    # Rejections name the request too: the blocked call (with its nested call id) and the unknown tool.
    rejected = {e["bridge_id"]: e for e in logs if e["event"] == "bridge.rejected"}
    assert rejected["bridge:callValue:2"]["nested_call_id"] == nested_ids["bridge:callValue:2"]
    assert "bridge:callValue:3" in rejected and rejected["bridge:callValue:3"]["nested_call_id"] is None
    # Every record that talks about a bridge request says which one.
    for e in logs:
        if e["event"].startswith(("tool_call.", "bridge.")) and e["event"] != "bridge.refused_by_guest_total":
            assert "bridge_id" in e, e


# ------------------------------------------------------------------ item 1: deep recursion (R10 kept)
#: Every shape of deep recursion found by acceptance testing. The WASI build of
#: quickjs-ng has no stack check (see the issue-12 note in SPEC §10.10), so each
#: traps the engine; none may hang, leak a cell or be reported as anything but R10.
RECURSIONS = {
    "recursive function": "function f(n) { return f(n + 1) + 1; }\nf(0);",
    "caught recursive function": "function f(n) { return f(n + 1) + 1; }\ntry { f(0); } catch (e) { return 'caught ' + e; }",
    "nested eval": "eval('('.repeat(200000) + '1' + ')'.repeat(200000));",
    "deep JSON.parse": "JSON.parse('['.repeat(200000) + ']'.repeat(200000));",
    "deep JSON.stringify": "let v = []; for (let i = 0; i < 200000; i++) v = [v];\nJSON.stringify(v);",
    "proxy chain": "let p = {}; for (let i = 0; i < 200000; i++) p = new Proxy(p, {});\np.x;",
    "after a wait": "await tools.callValue('echo', {});\nawait yield_control('x');\nfunction f(n) { return f(n + 1) + 1; }\nf(0);",
}
R10 = "cell engine stopped: recursion exhausted the engine's native stack. Use less recursion, for example a loop. Tool calls that already ran were not undone; check them before retrying."


@pytest.mark.parametrize("shape", sorted(RECURSIONS))
async def test_deep_recursion_of_every_shape_ends_r10_and_the_scope_goes_on(client: CellblockClient, scope: Scope, service: Any, shape: str) -> None:
    """SPEC §10.10 items 2-3: recursion that traps the engine is runtime_unavailable [R10]; the VM and cell are discarded."""
    await client.put_catalog(scope, TOOLS)
    result = await client.exec(scope, tool_call_id="deep", code=RECURSIONS[shape], handlers=HANDLERS)
    legs = 0
    while result.status == "waiting" and legs < 3:
        legs += 1
        result = await client.wait(scope, tool_call_id=f"w{legs}", run_id=result.run_id, handlers=HANDLERS)
    if shape == "after a wait":
        assert legs == 1 and result.bridge_dispatch_started is True
    assert result.status == "failed" and result.code == "runtime_unavailable" and result.failure_phase == "host", result.raw_json[:300]
    assert result.error == R10
    again = await client.exec(scope, tool_call_id="after", code="return 6 * 7", handlers=HANDLERS)
    assert again.status == "completed" and again.value == 42


@pytest.mark.parametrize("depth", [1_000, 2_000])
async def test_ordinary_recursion_depths_complete(client: CellblockClient, scope: Scope, depth: int) -> None:
    """The cell's wasm stack (2 MiB) admits about 2,400 frames; wasmtime's default 512 KiB trapped at about 600."""
    await client.put_catalog(scope, TOOLS)
    program = f"function depth(n) {{ return n === 0 ? 0 : 1 + depth(n - 1); }}\nawait null;\nreturn depth({depth});"
    result = await client.exec(scope, tool_call_id="rec", code=program, handlers=HANDLERS)
    assert result.status == "completed" and result.value == depth, result.raw_json[:300]
