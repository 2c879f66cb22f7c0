"""The fixed limits: one home (cellblock.server.limits) that agrees with SPEC §2.3 and is what the code applies."""

from __future__ import annotations

import json
import re
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from cellblock.bridge.v1 import bridge_service_pb2 as bpb
from cellblock.server import limits, messages
from cellblock.server.config import Limits
from cellblock.server.runs import OutputBudget, RunRegistry
from cellblock.server.runs._protocol import slot_refused
from cellblock.server.store import SlotAnswer

REPO = Path(__file__).resolve().parents[2]


def _spec_table() -> dict[str, str]:
    """The rows of the SPEC §2.3 table, ``constant -> value`` as written."""
    text = (REPO / "docs" / "SPEC.md").read_text(encoding="utf-8")
    section = text[text.index("### 2.3 Fixed constants") : text.index("### 2.4")]
    rows = {}
    for line in section.splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) == 2 and cells[0] not in ("Constant", "---"):
            rows[cells[0]] = cells[1]
    return rows


def test_the_spec_table_and_the_module_agree() -> None:
    rows = _spec_table()

    def numbers(key: str) -> list[float]:
        return [float(n) for n in re.findall(r"\d+(?:\.\d+)?", rows[key].split("`CELLBLOCK")[0])]

    assert numbers("Suspended-run cap (deployment-wide, §16.1 item 5)") == [limits.SUSPENDED_RUN_CAP]
    assert numbers("Watchdog grace after a leg's deadline") == [limits.WATCHDOG_GRACE_MS]
    assert numbers("Quick index bound") == [limits.QUICK_INDEX_MAX_CHARS]
    assert numbers("Input hint: characters / depth / properties") == [
        limits.INPUT_HINT_MAX_CHARS, limits.INPUT_HINT_MAX_DEPTH, limits.INPUT_HINT_MAX_PROPERTIES]
    assert numbers("Output hint: characters / depth / properties") == [
        limits.OUTPUT_HINT_MAX_CHARS, limits.OUTPUT_HINT_MAX_DEPTH, limits.OUTPUT_HINT_MAX_PROPERTIES]
    assert numbers("Property name length in hints") == [limits.HINT_PROPERTY_NAME_MAX_CHARS]
    assert numbers("Structural union variants / literal union values / literal union characters") == [
        limits.STRUCTURAL_UNION_MAX_VARIANTS, limits.LITERAL_UNION_MAX_VALUES, limits.LITERAL_UNION_MAX_CHARS]
    assert numbers("Parser message kept in syntax errors") == [limits.SYNTAX_ERROR_MESSAGE_MAX_CHARS]
    assert numbers("Unknown-id suggestions / user stack frames / servers named in the description") == [
        limits.UNKNOWN_ID_SUGGESTIONS, limits.USER_STACK_FRAMES, limits.DESCRIPTION_MAX_SERVERS]
    assert numbers("Value/error reserve of the output budget / output marker reserve")[-1] == limits.OUTPUT_MARKER_RESERVE_BYTES
    assert rows["Unknown-id suggestions (§7.6 item 4): id text length / scoring time / description characters scored"] == (
        f"{limits.MAX_CATALOG_ID_CHARS} characters (longer: [B07], no suggestions) / {limits.SUGGESTION_BUDGET_MS} ms / {limits.SUGGESTION_DESCRIPTION_CHARS}")
    assert numbers("`tools.search` query length (§7.5 item 1)") == [limits.MAX_SEARCH_QUERY_CHARS, 28]  # "→ [B28]"
    assert numbers("BM25 parameters") == [1, limits.BM25_K1, limits.BM25_B]  # "k1 = 1.2": the 1 of "k1"


def test_the_guest_controller_keeps_the_same_number_of_user_frames() -> None:
    # controller.js cannot import Python; its one literal must equal the host's constant.
    js = (REPO / "sandbox-image" / "guest" / "cellblock" / "guest" / "controller.js").read_text(encoding="utf-8")
    assert re.findall(r"frames\.length < (\d+)", js) == [str(limits.USER_STACK_FRAMES)]


def test_resume_budget_and_reserves_follow_their_formulas() -> None:
    assert [limits.min_resume_budget_ms(t) for t in (100, 499, 501, 60000, 1)] == [50, 249, 250, 250, 1]
    run_limits = Limits(timeout_ms=300, memory_limit_bytes=2048, max_output_bytes=1027, max_snapshot_bytes=1024)
    assert (run_limits.min_resume_budget_ms, run_limits.value_reserve_bytes, run_limits.reply_inbox_bytes) == (150, 256, 1024)


def test_the_parser_message_is_cut_to_the_syntax_error_limit() -> None:
    long = "x" * (limits.SYNTAX_ERROR_MESSAGE_MAX_CHARS + 50)
    text = messages.s02(1, 1, long)
    assert "x" * limits.SYNTAX_ERROR_MESSAGE_MAX_CHARS + "." in text
    assert "x" * (limits.SYNTAX_ERROR_MESSAGE_MAX_CHARS + 1) not in text


def test_echoed_guest_text_is_cut_to_the_echo_limit() -> None:
    text = messages.p01("m" * 1000)
    assert text == "unsupported bridge method: " + "m" * limits.ECHO_MAX_CHARS


@pytest.mark.asyncio(loop_scope="session")
async def test_the_registry_refuses_a_slot_past_the_cap_r01_names() -> None:
    """The default cap filled by two scopes (one may hold only its share, SPEC §16.1 item 5)."""
    registry = RunRegistry()
    runs: list[Any] = [SimpleNamespace(run_id=f"run_{i}", session_id="s", agent_run_id=f"a{i % 2}", created_at=1.0, holds_slot=False) for i in range(limits.SUSPENDED_RUN_CAP + 1)]
    assert all([await registry.reserve_slot(run) for run in runs[:-1]])
    assert await registry.reserve_slot(runs[-1]) is SlotAnswer.DEPLOYMENT_FULL
    assert f"(limit {limits.SUSPENDED_RUN_CAP})" in messages.R01


@pytest.mark.asyncio(loop_scope="session")
async def test_one_scope_is_refused_past_its_share_of_the_cap_with_r23() -> None:
    registry = RunRegistry()
    share = limits.scope_share(limits.SUSPENDED_RUN_CAP)
    assert share == limits.SUSPENDED_RUN_CAP * 3 // 4
    runs: list[Any] = [SimpleNamespace(run_id=f"run_{i}", session_id="s", agent_run_id="a", created_at=1.0, holds_slot=False) for i in range(share + 1)]
    assert all([await registry.reserve_slot(run) for run in runs[:-1]])
    refused = await registry.reserve_slot(runs[-1])
    assert refused is SlotAnswer.SCOPE_FULL and not runs[-1].holds_slot
    other: Any = SimpleNamespace(run_id="run_other", session_id="s", agent_run_id="b", created_at=1.0, holds_slot=False)
    assert await registry.reserve_slot(other) is SlotAnswer.HELD
    assert slot_refused(refused, registry.cap).message == messages.r23(share, limits.SUSPENDED_RUN_CAP)
    assert f"holds {share} of the deployment's {limits.SUSPENDED_RUN_CAP} suspended-run slots" in messages.r23(share, limits.SUSPENDED_RUN_CAP)
    assert slot_refused(SlotAnswer.DEPLOYMENT_FULL, registry.cap).message == messages.R01


def _text_entry(size: int) -> dict[str, str]:
    """A text entry whose compact JSON is exactly ``size`` bytes."""
    empty = len(json.dumps({"type": "text", "text": ""}, separators=(",", ":")))
    return {"type": "text", "text": "a" * (size - empty)}


def test_an_entry_that_would_use_the_marker_reserve_is_omitted() -> None:
    fits = OutputBudget(max_output_bytes=4096)
    assert fits.offer(_text_entry(fits.entry_capacity - limits.OUTPUT_MARKER_RESERVE_BYTES))
    too_big = OutputBudget(max_output_bytes=4096)
    assert not too_big.offer(_text_entry(too_big.entry_capacity - limits.OUTPUT_MARKER_RESERVE_BYTES + 1))
    assert not too_big.offer(_text_entry(30))  # the channel stays closed


def test_bridge_sizes_and_exit_codes_are_the_proto_enums() -> None:
    assert bpb.BRIDGE_LIMIT_SNAPSHOT_CHUNK_BYTES == 1024 * 1024
    assert bpb.BRIDGE_LIMIT_MAX_MESSAGE_BYTES == 512 * 1024 * 1024
    assert (bpb.CELL_EXIT_CODE_WATCHDOG, bpb.CELL_EXIT_CODE_HOST_SILENT) == (124, 125)
