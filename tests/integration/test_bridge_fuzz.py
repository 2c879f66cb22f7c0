"""Bridge fuzzer: a hostile guest in a real locked-down cell sends generated bridge messages (issue 11).

Hypothesis generates plans of valid and invalid ``AttachRequest`` messages (requests with
any method, well-formed, polluted and duplicate bridge ids, JSON that is valid, invalid or
deep; outputs; idles; snapshot chunks; ends of every kind; second hellos; bytes that are
no protobuf) in any order. ``tests/support/fuzz_guest.py`` replaces the guest agent in
a real Docker cell (same lockdown) and sends each plan to the real service. Every leg must
end within a bound with a documented status and code, never a gRPC error; afterwards no
cell, socket directory, run or admission permit is left and the service still answers.

``make test`` runs a short sample (``CELLBLOCK_FUZZ_EXAMPLES``, default 4); ``make
test-long`` runs at least 10,000 messages (``CELLBLOCK_FUZZ_EXAMPLES=60``).
"""

from __future__ import annotations

import asyncio
import json
import os
import struct
import tempfile
import time
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from cellblock.bridge.v1 import bridge_service_pb2 as pb
from cellblock.client import CellblockClient, CellblockError, LimitOverrides, Scope, Tool
from cellblock.server import messages as msg
from cellblock.server.app import ServerSettings, start_service
from cellblock.server.cells import DockerExecutor, DockerExecutorConfig
from cellblock.server.runs import _leg
from tests.integration.conftest import IMAGE
from tests.support.cells import cell_dirs, state_dir_in

pytestmark = pytest.mark.asyncio(loop_scope="session")

EXAMPLES = int(os.environ.get("CELLBLOCK_FUZZ_EXAMPLES", "4"))
SUPPORT = Path(__file__).resolve().parents[1] / "support"
DOCUMENTED_CODES = {"invalid_input", "internal_error", "runtime_unavailable", "timeout", "aborted", "output_limit_exceeded", "snapshot_limit_exceeded"}
METHODS = ["search", "describe", "call", "callValue", "namespace", "yield", "timer", "bogus", ""]

json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False, allow_infinity=False) | st.text(max_size=16),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner, max_size=4),
    max_leaves=12,
)
args_json = st.one_of(
    json_values.map(lambda v: json.dumps([v])),
    st.tuples(st.just("host:core:echo"), json_values).map(lambda t: json.dumps([t[0], t[1]])),
    json_values.map(json.dumps),
    st.text(max_size=40),
    st.integers(1, 3000).map(lambda d: "[" * d + "]" * d),
)


def _request(bridge_id: str, method: str, args: str, refusal: int) -> bytes:
    return pb.AttachRequest(request=pb.GuestRequest(bridge_id=bridge_id, method=method, args_json=args, refusal=refusal)).SerializeToString()


well_formed = st.builds(lambda m, n, a: _request(f"bridge:{m}:{n}", m, a, 0), st.sampled_from(METHODS), st.integers(1, 40), args_json)
polluted = st.builds(_request, st.one_of(st.text(max_size=40), st.builds(lambda m, n: f"bridge:{m}:{n}", st.sampled_from(METHODS), st.integers(-5, 10**17))), st.sampled_from(METHODS), args_json, st.sampled_from([0, 1, 2, 3, 9]))
output = st.one_of(json_values.map(lambda v: json.dumps({"type": "json", "value": v})), st.text(max_size=40)).map(lambda e: pb.AttachRequest(output=pb.GuestOutput(entry_json=e)).SerializeToString())
idle = st.integers(-3, 10**12).map(lambda n: pb.AttachRequest(idle=pb.Idle(host_work=n)).SerializeToString())
chunk = st.builds(lambda d, last: pb.AttachRequest(snapshot_chunk=pb.SnapshotChunk(data=d, last=last)).SerializeToString(), st.binary(max_size=256), st.booleans())
end = st.one_of(
    st.one_of(json_values.map(json.dumps), st.text(max_size=30)).map(lambda v: pb.LegEnd(completed=pb.Completed(value_json=v))),
    st.builds(lambda k, msg, b: pb.LegEnd(failed=pb.Failed(kind=k, message=msg, rejection_bridge_id=b)), st.integers(0, 12), st.text(max_size=60), st.text(max_size=20)),
    st.builds(lambda r, s: pb.LegEnd(suspended=pb.Suspended(raw_bytes=r, snapshot_bytes=s)), st.integers(-1, 10**12), st.integers(-1, 10**12)),
).map(lambda e: pb.AttachRequest(end=e).SerializeToString())
hello = st.text(max_size=30).map(lambda t: pb.AttachRequest(hello=pb.Hello(cell_token=t)).SerializeToString())
raw = st.binary(min_size=1, max_size=64)
#: Messages the leg reads and answers without ending (a request the host refuses is answered, not fatal).
body = st.one_of(well_formed, well_formed, well_formed, polluted, output, idle)
#: Messages that end the leg as soon as the host reads one (an unasked-for snapshot chunk, an end, a
#: second hello, bytes that are no protobuf): anywhere in a plan, the host never reads what follows,
#: so a plan holds a few, at its end or (rarely) in its middle.
terminal = st.one_of(chunk, end, hello, raw)
#: Body messages per plan: at full length (60 plans) at least 210 each, so the host reads at least 10,000 (a few plans have a wrong token or end early).
MIN_PLAN = 210 if EXAMPLES >= 60 else 120
plans = st.tuples(
    st.integers(0, 19).map(lambda n: n != 0),
    st.lists(body, min_size=MIN_PLAN, max_size=MIN_PLAN + 80),
    st.lists(terminal, max_size=3),
    st.integers(0, 9),
).map(lambda t: (t[0], t[1] + t[2] if t[3] else t[2][:1] + t[1] + t[2][1:]))


def _write_plan(path: Path, good_token: bool, messages: list[bytes]) -> None:
    data = bytearray(b"1" if good_token else b"0")
    for m in messages:
        data += struct.pack(">I", len(m)) + m
    tmp = path.with_suffix(".tmp")
    tmp.write_bytes(bytes(data))
    tmp.chmod(0o644)
    os.replace(tmp, path)


async def test_generated_bridge_messages_never_break_the_host(docker_client: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    loop = asyncio.get_running_loop()
    # Count what the host really read: a plan's messages after one that ends the leg are never read.
    read = [0]
    on_guest = _leg.Leg._on_guest  # noqa: SLF001 - the leg's reader of guest messages

    def counting(self: _leg.Leg, message: Any) -> Any:
        read[0] += message is not None
        return on_guest(self, message)

    monkeypatch.setattr(_leg.Leg, "_on_guest", counting)
    with tempfile.TemporaryDirectory(prefix="cellblock-fuzz-") as base:
        sockets, data = Path(base) / "sockets", Path(base) / "data"
        sockets.mkdir()
        data.mkdir()
        data.chmod(0o755)
        config = DockerExecutorConfig(
            image=IMAGE,
            test_guest_command=("python3", "-s", "-P", "/fuzz/fuzz_guest.py"),
            test_mounts={str(SUPPORT): "/fuzz", str(data): "/fuzz-data"},
        )
        svc = await start_service(
            ServerSettings(address="127.0.0.1:0", image=IMAGE, code_mode={"enabled": True}, socket_dir=str(sockets), state_dir=state_dir_in(str(sockets)), warm_pool=0, cell_wait_ms=4000),
            executor=DockerExecutor(config),
        )
        sent: list[int] = []
        outcomes: dict[str, int] = {}
        try:
            async with await CellblockClient.connect(svc.address) as client:
                scope = Scope("fuzz", "fuzz")
                await client.put_catalog(scope, [Tool(source="host", owner="core", name="echo", parameters={"type": "object"}), Tool(source="client", owner="app", name="c")])

                async def handler(tool_input: Any, call: Any) -> Any:
                    return {"details": tool_input}

                async def one(good_token: bool, messages: list[bytes]) -> None:
                    _write_plan(data / "plan.bin", good_token, messages)
                    started = time.monotonic()
                    try:
                        result = await client.exec(scope, tool_call_id="fuzz", code="return 1", handlers={"echo": handler, "client:app:c": handler}, limits=LimitOverrides(timeout_ms=1000))
                    except CellblockError as exc:  # a gRPC error is a finding
                        raise AssertionError(f"the host answered with a gRPC error: {exc}") from None
                    assert time.monotonic() - started < 30, "a leg hung"
                    assert result.status in ("completed", "failed", "waiting"), result.raw_json
                    if result.status == "failed":
                        assert result.code in DOCUMENTED_CODES, result.raw_json
                        assert result.error != msg.R22, f"a fault of the service (see its leg.fault log): {result.raw_json}"
                        assert "Traceback" not in result.error and "Error:" not in result.error[:12], result.error
                    if result.status == "waiting":
                        await client.cancel_run(scope, result.run_id)
                    key = result.status + ("/" + result.code + ": " + result.error[:70] if result.code else "")
                    outcomes[key] = outcomes.get(key, 0) + 1
                    sent.append(len(messages))

                @settings(max_examples=EXAMPLES, deadline=None, database=None, suppress_health_check=list(HealthCheck))
                @given(plans)
                def run_plan(plan: tuple[bool, list[bytes]]) -> None:
                    asyncio.run_coroutine_threadsafe(one(*plan), loop).result(timeout=120)

                await asyncio.to_thread(run_plan)
                # The service still answers, and nothing is left over.
                assert (await client.tool_surface(scope, "anthropic/claude-opus-5")).code_mode_engaged
                assert (await client.list_runs(scope)).runs == []
                assert await svc.registry.store.counts() == (0, 0), "no slot or suspended run is left in the run store"
        finally:
            await svc.stop()
        print(f"\nbridge fuzzer: {len(sent)} cells, {sum(sent)} generated messages, {read[0]} read by the host, outcomes {outcomes}")
        assert svc.executor.list_cell_containers() == []  # type: ignore[attr-defined]
        assert cell_dirs(str(sockets)) == []
        assert svc.state.admission.running == 0 and svc.registry.active == {}
        if EXAMPLES >= 60:
            assert read[0] >= 10_000, f"the host read {read[0]} of {sum(sent)} generated messages"
