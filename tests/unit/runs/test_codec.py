"""A parked run survives encode -> store record -> decode in another registry (SPEC §10.7 item 2)."""

from __future__ import annotations

import asyncio
import json
from typing import Any

import pytest
from opentelemetry.trace import SpanContext, TraceFlags

from cellblock.server import messages as msg
from cellblock.server.api._catalogs import RunCatalog, ScopeCatalog
from cellblock.server.catalog import BridgeReplyError
from cellblock.server.config import CodeModeConfig
from cellblock.server.runs import BridgeMethod, Claimed, OutputBudget, Provenance, Run, RunRegistry, Settlement
from cellblock.server.runs._codec import RunDecodeError, decode_run, encode_run, split_document
from cellblock.server.runs._registry import _summary_of_record
from cellblock.server.runs._state import PendingRequest
from cellblock.server.store import MemoryRunStore, RunRecord

TOOLS: list[dict[str, Any]] = [
    {
        "source": "host",
        "name": "lookup",
        "description": "A read.",
        "parameters": {"type": "object", "properties": {"key": {"type": "string"}}, "required": ["key"], "additionalProperties": False},
        "outputSchema": {"type": "object", "properties": {"value": {"type": "string"}}},
        "replaySafe": True,
    },
    {"source": "client", "owner": "app", "name": "slow", "description": "Slow."},
    {"source": "mcp", "owner": "gh", "name": "create_issue", "description": "Creates an issue.", "parameters": {"type": "object", "properties": {"title": {"type": "string"}}}},
]


def _catalog() -> ScopeCatalog:
    catalog = ScopeCatalog(CodeModeConfig())
    catalog.catalog.register(TOOLS)
    return catalog


def _run(view: RunCatalog) -> Run:
    config = CodeModeConfig()
    run = Run(
        run_id="run_" + "a" * 32, session_id="s", agent_run_id="a", tool_call_id="exec-1", turn_id="turn", replay_id="replay_" + "b" * 24,
        limits=config.limits_with_overrides({"timeoutMs": 5000}), restart_safe=False, view=view, budget=OutputBudget(2048), created_at=1234.5,
    )
    slow = view.resolve_call("callValue", ["client:app:slow", {"q": 1}])
    lookup = view.resolve_call("callValue", ["host:core:lookup", {"key": "k"}])
    gh = view.resolve_call("namespace", ["MCP", next(iter(view.namespace.paths)), {}])
    run.pending = {
        "bridge:callValue:1": PendingRequest("bridge:callValue:1", BridgeMethod.CALL_VALUE, ["client:app:slow", {"q": "\ud800 lone"}], nested_call_id="n_1", call=slow, dispatched=True),
        "bridge:callValue:2": PendingRequest("bridge:callValue:2", BridgeMethod.CALL_VALUE, ["host:core:lookup", {"key": "k"}], nested_call_id="n_2", call=lookup, replay_safe=True, dispatched=True, result=Settlement.value('{"value":"v"}'), settled_at=50.0),
        "bridge:namespace:3": PendingRequest("bridge:namespace:3", BridgeMethod.NAMESPACE, ["MCP", "gh.createIssue", {}], call=gh),
        "bridge:timer:4": PendingRequest("bridge:timer:4", BridgeMethod.TIMER, [5000], replay_safe=True, dispatched=True, due_at=99999.25),
        "bridge:search:5": PendingRequest("bridge:search:5", BridgeMethod.SEARCH, ["x"], replay_safe=True, result=Settlement.rejection("tools.search query must be a string."), settled_at=10.0),
        "bridge:yield:6": PendingRequest("bridge:yield:6", BridgeMethod.YIELD, ["why"], replay_safe=True),
    }
    run.budget.offer({"type": "text", "text": "hello"})
    run.bridge_counters = {"callValue": 2, "namespace": 3, "timer": 4, "search": 5, "yield": 6}
    run.nested_calls = 2
    run.dispatch_started = run.non_replay_safe_dispatched = True
    run.counts = {"search": 1, "describe": 0, "call": 3}
    run.legs = 2
    run.provenance = {"bridge:search:5": Provenance.INPUT}
    run.refused_ranges = [("search", 7, 9, Provenance.INPUT)]
    run.seen_bridge_ids = set(run.pending)
    run.holds_slot = True
    run.snapshot_bytes = 4096
    run.engine_build_id = "build-x"
    run.exec_span_context = SpanContext(0x1234, 0x5678, is_remote=False, trace_flags=TraceFlags(1))
    return run


def _record(run: Run) -> RunRecord:
    return RunRecord(run.run_id, run.session_id, run.agent_run_id, "active", run.created_at, expires_at=777.0, holds_slot=True, generation=1, body=encode_run(run), engine_build_id=run.engine_build_id)


def test_every_field_of_a_parked_run_round_trips() -> None:
    catalog = _catalog()
    run = _run(catalog.view())
    back = decode_run(_record(run), lambda state, _scope: RunCatalog.from_state(state, CodeModeConfig()))
    for name in ("run_id", "session_id", "agent_run_id", "tool_call_id", "turn_id", "replay_id", "limits", "restart_safe", "created_at", "bridge_counters", "nested_calls",
                 "dispatch_started", "non_replay_safe_dispatched", "counts", "legs", "provenance", "refused_ranges", "seen_bridge_ids", "holds_slot", "snapshot_bytes", "engine_build_id"):  # fmt: skip
        assert getattr(back, name) == getattr(run, name), name
    assert back.expires_at == 777.0 and back.suspended
    assert back.budget.to_state() == run.budget.to_state()
    assert list(back.pending) == list(run.pending), "request order kept"
    for bridge_id, p in run.pending.items():
        q = back.pending[bridge_id]
        assert (q.method, q.args, q.nested_call_id, q.replay_safe, q.dispatched, q.result, q.due_at) == (p.method, p.args, p.nested_call_id, p.replay_safe, p.dispatched, p.result, p.due_at)
        assert (q.call is None) == (p.call is None)
        if p.call is not None and q.call is not None:
            assert (q.call.entry.id, q.call.input, q.call.replay_safe, q.call.label) == (p.call.entry.id, p.call.input, p.call.replay_safe, p.call.label)
    settled = sorted((p for p in back.pending.values() if p.result is not None), key=lambda p: p.settled_at)
    assert [p.bridge_id for p in settled] == ["bridge:search:5", "bridge:callValue:2"], "completion order kept"
    assert back.exec_span_context.trace_id == 0x1234 and back.exec_span_context.span_id == 0x5678
    assert back.view.guest_catalog() == run.view.guest_catalog(), "ALL_TOOLS, convenience names, MCP map and API files as the run saw them"
    with pytest.raises(BridgeReplyError):
        back.view.resolve_call("callValue", ["host:core:lookup", {"nope": 1}])  # the input validator was compiled again
    back.view.resolve_call("callValue", ["host:core:lookup", {"key": "k"}])
    assert back.view.telemetry()["counterScope"] == catalog.telemetry()["counterScope"]


def test_a_replica_with_the_live_session_counts_in_it_and_one_without_restores_it() -> None:
    catalog = _catalog()
    run = _run(catalog.view())
    catalog.catalog.counters.count_search()
    live = decode_run(_record(run), lambda state, _scope: catalog.restore_view(state))
    live.view.count_call()
    assert catalog.telemetry()["callCount"] == 1, "counted in this replica's live session"
    elsewhere = decode_run(_record(run), lambda state, _scope: RunCatalog.from_state(state, CodeModeConfig()))
    assert elsewhere.view.telemetry()["searchCount"] == 1 and elsewhere.view.telemetry()["counterScope"] == catalog.telemetry()["counterScope"]
    other = ScopeCatalog(CodeModeConfig())
    other.catalog.register(TOOLS)  # a new session (replace): another counterScope
    fresh = decode_run(_record(run), lambda state, _scope: other.restore_view(state))
    fresh.view.count_call()
    assert other.telemetry()["callCount"] == 0, "a new catalog session never counts an older run's calls"


def test_unreadable_documents_are_refused() -> None:
    catalog = _catalog()
    record = _record(_run(catalog.view()))
    restore = lambda state, _scope: RunCatalog.from_state(state, CodeModeConfig())  # noqa: E731
    doc = json.loads(record.body)
    for bad in (b"{", json.dumps({**doc, "format": 99}).encode(), json.dumps({k: v for k, v in doc.items() if k != "limits"}).encode()):
        with pytest.raises(RunDecodeError):
            decode_run(RunRecord(**{**record.__dict__, "body": bad}), restore)


def test_a_documents_head_is_read_without_parsing_its_catalog_view() -> None:
    # A parked run's view is tens of MB in a scope with large mcp schemas: ListRuns and a resume
    # on the replica that prepared the view parsed all of it on the loop (about 0.2 s).
    catalog = _catalog()
    run = _run(catalog.view())
    record = _record(run)
    head, view = split_document(record.body)
    assert view is not None and "view" not in head and head["runId"] == run.run_id
    at = int(head["viewAt"])
    assert record.body[at:].startswith(b',"view":')
    # The view's bytes are not JSON past the version id: reading only the version must not parse them.
    body = record.body[:at] + b',"view":{"catalogVersion":"abc123","rest":not json}}'
    forged = RunRecord(**{**record.__dict__, "body": body})
    seen: list[object] = []

    def restore(state: Any, _scope: Any) -> RunCatalog:
        seen.append(state.get("catalogVersion"))
        return run.view  # type: ignore[return-value]

    back = decode_run(forged, restore)
    assert seen == ["abc123"] and list(back.pending) == list(run.pending) and back.counts == run.counts
    summary = _summary_of_record(forged, 0.0)
    assert summary.tool_call_id == "exec-1" and [p[0] for p in summary.pending] == list(run.pending) and summary.legs == 2
    with pytest.raises(ValueError):
        split_document(body)[1]["view"]  # type: ignore[index]  # any other key parses it
    # A document without viewAt (written before it existed) is parsed whole, to the same run.
    old = json.loads(record.body)
    del old["viewAt"]
    again = decode_run(RunRecord(**{**record.__dict__, "body": json.dumps(old).encode()}), lambda state, _scope: RunCatalog.from_state(state, CodeModeConfig()))
    assert list(again.pending) == list(run.pending) and again.view.guest_catalog() == run.view.guest_catalog()


@pytest.mark.asyncio(loop_scope="session")
async def test_a_takeover_rejects_the_lost_legs_calls_with_r12_and_keeps_settled_results() -> None:
    store = MemoryRunStore(8)
    catalog = _catalog()
    dead = RunRegistry(store, restore_view=lambda s, _scope: catalog.restore_view(s), lease_seconds=0.2)
    run = _run(catalog.view())
    run.holds_slot = False
    assert await dead.reserve_slot(run) and await dead.park(run, b"snapshot")
    claimed = await dead.claim(run.run_id, "s", "a")  # a wait on a replica that then dies
    assert isinstance(claimed, Claimed)
    await asyncio.sleep(0.3)
    survivor = RunRegistry(store, restore_view=lambda s, _scope: catalog.restore_view(s))
    taken = await survivor.claim(run.run_id, "s", "a")
    assert isinstance(taken, Claimed) and taken.snapshot == b"snapshot"
    lost = taken.run.pending["bridge:callValue:1"]
    assert lost.result == Settlement.rejection(msg.r12(137)) and taken.run.provenance["bridge:callValue:1"] is Provenance.INTERNAL
    assert taken.run.pending["bridge:callValue:2"].result == Settlement.value('{"value":"v"}'), "a result stored at the park is kept"
    assert taken.run.pending["bridge:namespace:3"].result is None, "a call never dispatched is dispatched by the wait, not rejected"


@pytest.mark.asyncio(loop_scope="session")
async def test_hosted_outcomes_while_parked_reach_the_next_claim_and_renewal_reports_a_cancel() -> None:
    store = MemoryRunStore(8)
    catalog = _catalog()
    registry = RunRegistry(store, restore_view=lambda s, _scope: catalog.restore_view(s), lease_seconds=0.3)
    run = _run(catalog.view())
    run.holds_slot = False
    assert await registry.reserve_slot(run) and await registry.park(run, b"snap")

    def apply(current: Run) -> PendingRequest | None:
        p = current.pending["bridge:callValue:1"]
        p.result = Settlement.value("42")
        return p

    poked: list[str] = []
    registry.deliver_hosted(run.run_id, apply, poked.append)
    assert poked == [], "no leg here: kept for the next claim"
    claimed = await registry.claim(run.run_id, "s", "a")
    assert isinstance(claimed, Claimed) and claimed.run.pending["bridge:callValue:1"].result == Settlement.value("42")
    lost: list[str] = []
    async with registry.holding(claimed.run, lost.append):
        await store.cancel(run.run_id, "s", "a", until=(await store.now()) + 60)
        await asyncio.sleep(0.3)
    assert lost == ["cancelled"], "a leg learns of a cancel made on another replica"


def test_protocol_violations_with_huge_ids_do_not_grow_the_run_or_its_parked_record() -> None:
    # A violation's id is the guest's text, up to a whole bridge message: kept as itself, 20
    # requests with 1 MB ids kept 20 MB in the run and wrote them into its parked record.
    import structlog

    from cellblock.bridge.v1 import bridge_service_pb2 as bpb
    from cellblock.server.runs._policy import admit_request

    run = _run(_catalog().view())
    before = len(encode_run(run))
    ids = [f"bridge:call:{i}" + "9" * 1_000_000 for i in range(20)]
    for bridge_id in ids:
        violation = admit_request(run, bpb.GuestRequest(bridge_id=bridge_id, method="call", args_json="[]"), structlog.get_logger(), {})
        assert violation is not None and violation.message == msg.p02(bridge_id)
    assert len(encode_run(run)) - before < 20 * 200
    assert all(run.provenance_of(bridge_id) is Provenance.INTERNAL for bridge_id in ids)  # a rejection naming one is still the host's
    assert run.provenance_of("bridge:call:0" + "9" * 999_999) is None
    back = decode_run(_record(run), lambda state, _scope: RunCatalog.from_state(state, CodeModeConfig()))
    assert back.provenance_of(ids[3]) is Provenance.INTERNAL


def test_a_refused_range_is_counted_in_one_step_whatever_its_length(monkeypatch: pytest.MonkeyPatch) -> None:
    """A refused range is counted in one addition, whatever ``refused_count`` says.

    The guest names the range's length (up to 10**16 ids). The host counted it id by id, so a
    fuzzer-drawn range of 3 * 10**15 calls held the service's event loop for good (found by the
    bridge fuzzer in CI).
    """
    import structlog

    from cellblock.bridge.v1 import bridge_service_pb2 as bpb
    from cellblock.server.runs import _policy

    recorded: list[tuple[str, int]] = []
    monkeypatch.setattr(_policy, "record_bridge_call", lambda method, requests=1: recorded.append((method, requests)))
    run = _run(_catalog().view())
    refusals: dict[tuple[str, str], int] = {}
    before = run.counts[BridgeMethod.CALL]
    for bridge_id, length in (("bridge:call:100", 100_000), ("bridge:callValue:100", 3 * 10**15)):
        req = bpb.GuestRequest(bridge_id=bridge_id, method=bridge_id.split(":")[1], refusal=bpb.GUEST_REFUSAL_PENDING_CAP, refused_count=length)
        assert _policy.admit_request(run, req, structlog.get_logger(), refusals) is None
    assert recorded == [("call", 100_000), ("call", 3 * 10**15)]
    assert run.counts[BridgeMethod.CALL] - before == 100_000 + 3 * 10**15
    assert sum(refusals.values()) == 100_000 + 3 * 10**15
