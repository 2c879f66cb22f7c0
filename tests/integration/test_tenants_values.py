"""The host reads a cell's final value only up to the cell's bridge bound (issue 11 item 4, SPEC §2.3, §9 rule 6).

Real service, real cells. A final value larger than the run's allowance
is truncated from the text the cell sent, never parsed; one larger than the run's bridge bound (the
larger of the budget and the reply inbox, plus one chunk) is refused by the cell's controller as
soon as its size is known, and an end over the bound by its framing alone by the bridge's transport
unread: both fail the run ``output_limit_exceeded`` [R15] naming the bound. A tool call's arguments
up to the reply inbox still cross.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import pytest

from cellblock.client import CellblockClient, LimitOverrides, Scope, Tool
from cellblock.server import messages as msg
from cellblock.server.config import Limits

pytestmark = pytest.mark.asyncio(loop_scope="session")

MIB = 1024 * 1024
#: A memory limit the warm pool does not hold: the leg gets a fresh cell, bounded by its own limits.
FRESH = 256 * MIB


async def echo(tool_input: Any, call: Any) -> Any:
    return {"details": len(tool_input.get("s", ""))}


def refused_in_cell(bound: int) -> str:
    """The [R15] error of a final value the cell's controller refused over ``bound`` bytes (SPEC §9 rule 6)."""
    return msg.r15(f"its compact JSON is over {bound} bytes, more than the host reads from the cell, so return less data")


async def test_a_value_over_the_bridge_bound_is_refused_in_the_cell(client: CellblockClient, scope: Scope) -> None:
    await client.put_catalog(scope, [Tool(source="host", owner="core", name="echo")])
    limits = Limits(memory_limit_bytes=FRESH)
    assert limits.bridge_message_bytes == 11 * MIB  # max(64 KiB, min(256 MiB, 10 MiB)) + 1 MiB
    result = await client.exec(scope, tool_call_id="v-transport", code='return "x".repeat(20 * 1024 * 1024);', handlers={}, limits=LimitOverrides(memory_limit_bytes=FRESH))
    assert (result.status, result.code, result.failure_phase) == ("failed", "output_limit_exceeded", "host"), result.raw_json
    assert result.error == refused_in_cell(limits.bridge_message_bytes)
    assert (await client.list_runs(scope)).runs == []


async def test_an_end_over_the_bound_by_its_framing_alone_is_refused_unread_by_the_host(client: CellblockClient, scope: Scope) -> None:
    await client.put_catalog(scope, [Tool(source="host", owner="core", name="echo")])
    # A value of exactly the bound passes the controller; its end message (the value plus a few
    # bytes of framing) is over it, so the host's transport refuses it unread: the second layer.
    limits = Limits(memory_limit_bytes=FRESH)
    code = f'return "x".repeat({limits.bridge_message_bytes - 2});'
    # This path still writes the whole value out and sends it (5-14 s on a loaded machine): the largest budget.
    result = await client.exec(scope, tool_call_id="v-frame", code=code, handlers={}, limits=LimitOverrides(memory_limit_bytes=FRESH, timeout_ms=60000))
    assert (result.status, result.code) == ("failed", "output_limit_exceeded"), result.raw_json
    assert result.error == msg.r15(msg.too_large_to_read(limits.bridge_message_bytes))


@pytest.mark.parametrize("shape", ["s", "{rows: [1, {text: s}]}", "[s, s]"])
async def test_a_60_mib_value_is_refused_within_the_default_budget(client: CellblockClient, scope: Scope, shape: str) -> None:
    await client.put_catalog(scope, [Tool(source="host", owner="core", name="echo")])
    # The fixed bug: with 1 GiB and the largest budget, a 60 MiB string (alone or inside an object or
    # array) was serialised, copied and sent for 18 s before the host refused it, so the default
    # 10 s budget ended it `timeout` [R05]: the model was told its code was too slow.
    big = LimitOverrides(memory_limit_bytes=1 << 30, max_output_bytes=10 * MIB)
    bound = Limits(memory_limit_bytes=1 << 30, max_output_bytes=10 * MIB).bridge_message_bytes
    started = time.monotonic()
    code = f"const s = 'x'.repeat(60 * 1024 * 1024); return {shape};"
    result = await client.exec(scope, tool_call_id=f"v-60-{len(shape)}", code=code, handlers={}, limits=big)
    assert (result.status, result.code, result.error) == ("failed", "output_limit_exceeded", refused_in_cell(bound)), result.raw_json
    assert time.monotonic() - started < 60  # a loose hang bound only: the outcome is the assertion


async def test_a_value_just_under_the_bound_completes_truncated(client: CellblockClient, scope: Scope) -> None:
    await client.put_catalog(scope, [Tool(source="host", owner="core", name="echo")])
    big = LimitOverrides(memory_limit_bytes=1 << 30, max_output_bytes=10 * MIB)
    bound = Limits(memory_limit_bytes=1 << 30, max_output_bytes=10 * MIB).bridge_message_bytes
    before = _peak_reset_mib()
    result = await client.exec(scope, tool_call_id="v-under", code=f"return 'x'.repeat({bound - 64});", handlers={}, limits=big)
    grown = _status_mib("VmHWM") - before
    assert result.status == "completed", result.raw_json[:300]
    assert result.value["truncated"] is True and result.value["omittedBytes"] > 0, result.raw_json[:300]
    # This process is the service and its client: the 11 MiB end, its text, the 10 MiB marker the
    # service sends and the client reads. Its marker was built on the loop from a list of 11 million
    # cut points and 25 serialised 10 MiB markers: the peak grew by about 620 MiB.
    assert grown < 200, f"the peak RSS grew by {grown:.0f} MiB"


def _status_mib(field: str) -> float:
    """This process's ``/proc/self/status`` memory field (``VmRSS``, ``VmHWM``), MiB."""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1]) / 1024
    raise AssertionError(field)


def _peak_reset_mib() -> float:
    """Resets this process's peak RSS (``VmHWM``) to its current RSS (Linux: 5 to ``clear_refs``); returns it, MiB."""
    Path("/proc/self/clear_refs").write_text("5")
    return _status_mib("VmRSS")


async def test_a_value_under_the_bridge_bound_is_truncated_from_its_text(client: CellblockClient, scope: Scope) -> None:
    await client.put_catalog(scope, [Tool(source="host", owner="core", name="echo")])
    # 3 MiB: under the bridge bound (11 MiB), far over the allowance: truncated without being parsed.
    result = await client.exec(scope, tool_call_id="v-read", code='return ["x".repeat(3 * 1024 * 1024), 1];', handlers={}, limits=LimitOverrides(memory_limit_bytes=FRESH))
    assert result.status == "completed", result.raw_json
    value = result.value
    assert value["truncated"] is True and value["prefix"].startswith('["xxx'), result.raw_json[:300]
    assert value["omittedBytes"] == len('["",1]') + 3 * MIB - len(value["prefix"].encode())


async def test_a_value_just_over_the_budget_is_still_truncated_and_large_arguments_still_cross(client: CellblockClient, scope: Scope) -> None:
    await client.put_catalog(scope, [Tool(source="host", owner="core", name="echo")])
    over = await client.exec(scope, tool_call_id="v-trunc", code='return "y".repeat(200000);', handlers={}, limits=LimitOverrides(memory_limit_bytes=FRESH))
    assert over.status == "completed", over.raw_json
    assert over.value["truncated"] is True and over.value["omittedBytes"] > 0 and set(over.value["prefix"]) == {'"', "y"}, over.raw_json
    # A request's arguments may fill the reply inbox (10 MiB here), beyond the output budget.
    code = 'return await tools.callValue("host:core:echo", {s: "z".repeat(4 * 1024 * 1024)});'
    big = await client.exec(scope, tool_call_id="v-args", code=code, handlers={"echo": echo}, limits=LimitOverrides(memory_limit_bytes=FRESH))
    assert (big.status, big.value) == ("completed", 4 * MIB), big.raw_json
