"""A real service whose cells run the hostile guest of ``tests/support/fuzz_guest.py`` (issue 11).

:class:`FuzzCells` starts a real service with a real Docker executor whose locked-down cells
run the hostile agent instead of the guest agent. :meth:`FuzzCells.run` sends one plan (raw
``AttachRequest`` messages and their documented answers, ``tests/support/bridge_oracle.py``)
in one cell, through a real exec, and returns what came back: every ``Settle`` the host sent
(recorded at the bridge), every one the agent received (its record on a writable mount), the
output the caller saw and the result. :func:`check_leg` asserts that all of it equals the
documented answers. Leaving the context asserts the service still answers and leaked nothing.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import json
import os
import tempfile
from collections import Counter
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

import pytest
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import strategies as st

from cellblock.bridge.v1 import bridge_service_pb2 as pb
from cellblock.client import CellblockClient, CellblockError, LimitOverrides, Scope, Tool
from cellblock.server import messages as msg
from cellblock.server.app import ServerSettings, start_service
from cellblock.server.cells import CellBridge, DockerExecutor, DockerExecutorConfig
from cellblock.server.config import Limits
from tests.support.bridge_oracle import REJECTIONS, Expected, as_doubles
from tests.support.cells import IMAGE, cell_dirs, state_dir_in

SUPPORT = Path(__file__).resolve().parent
#: The legs' budget: the host reads a plan in well under a second (a few seconds on a machine loaded
#: twenty times over), so the deadline never decides a leg that ends itself, nor holds back an
#: answer (none is delivered within the minimum resume budget of it); a plan without an end is
#: killed at the deadline plus the 2 s grace ([R06]).
TIMEOUT_MS = 10_000
_T = TypeVar("_T")
#: Message prefixes of every P-code (an admitted request never gets one).
_P_PREFIXES = tuple(m.split("{", 1)[0] for m in (msg.p01("{"), msg.p02("{"), msg.p03("{"), msg.p05("{")))


@dataclass
class LegRecord:
    """What came back for one plan.

    Attributes:
        host: Each ``Settle`` the host sent, as ``(bridge_id, ok, message)``, in order.
        agent: Each one the hostile agent received, in order.
        output: The output entries the caller saw, as ``(type, text, value)``.
        result: The exec's result.
    """

    host: list[tuple[str, bool, str]] = field(default_factory=list)
    agent: list[tuple[str, bool, str]] = field(default_factory=list)
    output: list[tuple[str, Any, Any]] = field(default_factory=list)
    result: Any = None


class FuzzCells:
    """A real service whose cells run the hostile agent; use :meth:`start`."""

    def __init__(self, client: CellblockClient, data: Path, out: Path) -> None:
        self.client = client
        self.scope = Scope("fuzz", "fuzz")
        self.memory_limit_bytes = Limits().memory_limit_bytes
        self._data, self._out = data, out
        self._leg: LegRecord | None = None

    @classmethod
    @contextlib.asynccontextmanager
    async def start(cls, monkeypatch: pytest.MonkeyPatch) -> AsyncIterator[FuzzCells]:
        """Starts the service; on leaving, asserts it still answers and nothing is left over."""
        send = CellBridge.send
        holder: list[FuzzCells] = []

        def recording(bridge: CellBridge, message: pb.AttachResponse | bytes) -> None:
            # A leg's Start goes out as bytes serialized once per catalog version (CellBridge.send).
            if not isinstance(message, bytes) and message.WhichOneof("message") == "settle" and holder and holder[0]._leg is not None:  # noqa: SLF001
                s = message.settle
                ok = s.WhichOneof("outcome") == "ok_json"
                holder[0]._leg.host.append((s.bridge_id, ok, "" if ok else s.error.message))  # noqa: SLF001
            send(bridge, message)

        monkeypatch.setattr(CellBridge, "send", recording)
        with tempfile.TemporaryDirectory(prefix="cellblock-fuzz-") as base:
            sockets, data, out = Path(base) / "sockets", Path(base) / "data", Path(base) / "out"
            for d in (sockets, data, out):
                d.mkdir()
            data.chmod(0o755)
            out.chmod(0o777)  # the cell's uid writes its record here
            config = DockerExecutorConfig(
                image=IMAGE,
                test_guest_command=("python3", "-s", "-P", "/fuzz/fuzz_guest.py"),
                test_mounts={str(SUPPORT): "/fuzz", str(data): "/fuzz-data"},
                test_writable_mounts={str(out): "/fuzz-out"},
            )
            svc = await start_service(
                ServerSettings(address="127.0.0.1:0", image=IMAGE, code_mode={"enabled": True}, socket_dir=str(sockets), state_dir=state_dir_in(str(sockets)), warm_pool=0, cell_wait_ms=30000),
                executor=DockerExecutor(config),
            )
            try:
                async with await CellblockClient.connect(svc.address) as client:
                    cells = cls(client, data, out)
                    holder.append(cells)
                    await client.put_catalog(cells.scope, [Tool(source="host", owner="core", name="echo", parameters={"type": "object"}), Tool(source="client", owner="app", name="c")])
                    yield cells
                    # The service still answers, and nothing is left over.
                    assert (await client.tool_surface(cells.scope, "anthropic/claude-opus-5")).code_mode_engaged
                    assert (await client.list_runs(cells.scope)).runs == []
                    assert await svc.registry.store.counts() == (0, 0), "no slot or suspended run is left in the run store"
            finally:
                await svc.stop()
            assert svc.executor.list_cell_containers() == []  # type: ignore[attr-defined]
            assert cell_dirs(str(sockets)) == []
            assert svc.state.admission.running == 0 and svc.registry.active == {}

    async def run(self, good_token: bool, messages: list[bytes], expected: Expected) -> LegRecord:
        """Sends one plan in one real cell; returns what came back."""
        plan = {
            "goodToken": good_token,
            "messages": [base64.b64encode(m).decode() for m in messages],
            "answers": [{"kind": a.kind, "bridgeId": a.bridge_id, "message": a.message, "immediate": a.immediate} for a in expected.answers],
            "read": expected.read,
        }
        path = self._data / "plan.json"
        path.with_suffix(".tmp").write_text(json.dumps(plan), encoding="utf-8")
        path.with_suffix(".tmp").chmod(0o644)
        os.replace(path.with_suffix(".tmp"), path)
        record = self._out / "answers.jsonl"
        record.unlink(missing_ok=True)
        leg = self._leg = LegRecord()

        async def handler(tool_input: Any, call: Any) -> Any:
            return {"details": tool_input}

        def on_output(entry: Any) -> None:
            leg.output.append((entry.type, entry.text, as_doubles(entry.value)))

        try:
            leg.result = await self.client.exec(
                self.scope, tool_call_id="fuzz", code="return 1", handlers={"echo": handler, "client:app:c": handler}, on_output=on_output, limits=LimitOverrides(timeout_ms=TIMEOUT_MS)
            )
        except CellblockError as exc:  # a gRPC error is a finding
            raise AssertionError(f"the host answered with a gRPC error: {exc}") from None
        finally:
            self._leg = None
        if leg.result.status == "waiting":
            await self.client.cancel_run(self.scope, leg.result.run_id)
        if record.exists():
            for line in record.read_text(encoding="utf-8").splitlines():
                got = json.loads(line)
                leg.agent.append((got["bridgeId"], got["ok"], got["message"]))
        return leg


async def run_drawn(strategy: st.SearchStrategy[_T], examples: int, one: Callable[[_T], Awaitable[None]]) -> int:
    """Draws ``examples`` values of ``strategy`` with hypothesis, then awaits ``one`` on each, in order.

    The plans run after hypothesis is done, not inside its test body: while hypothesis runs a
    test body it raises the interpreter's recursion limit (process-wide, so for the service's
    event loop too) to its own stack depth plus 2000, which once moved the host's JSON depth bound
    (then its parser's) into the depths the fuzzer draws as too deep. The host now counts the value
    nesting bound exactly (SPEC §8.8 rule 7), but the service should still run at its own limit:
    the stack left to every other recursive step is the one it has in production.
    No shrinking: every step would start a real cell again; a failing plan is reported as drawn.

    Args:
        strategy: What to draw.
        examples: How many values.
        one: Runs one value; what it raises is raised here, at the first failure.

    Returns:
        How many values ran.
    """
    drawn: list[_T] = []

    @settings(max_examples=examples, deadline=None, database=None, suppress_health_check=list(HealthCheck), phases=(Phase.explicit, Phase.generate), print_blob=False)
    @given(strategy)
    def draw(value: _T) -> None:
        drawn.append(value)

    await asyncio.to_thread(draw)  # drawing megabytes of plans off the loop the service runs on
    for value in drawn:
        await one(value)
    return len(drawn)


def check_leg(expected: Expected, leg: LegRecord) -> None:
    """Asserts that what came back for a plan is what the SPEC documents, answer by answer."""
    # What the agent got is what the host sent, in order (the leg's end may cut it short).
    assert leg.agent == leg.host[: len(leg.agent)], f"the cell got other answers than the host sent:\n{leg.agent}\n{leg.host}"
    _check_answers(expected, leg)
    # The output the caller saw.
    shown = [(e["type"], e.get("text"), e.get("value")) for e in expected.output]
    first = next((i for i, (a, b) in enumerate(zip(leg.output, shown, strict=False)) if a != b), min(len(leg.output), len(shown)))
    assert leg.output == shown, f"the caller saw other output than the cell sent: {len(leg.output)} entries for {len(shown)}, first difference at {first}: {leg.output[first : first + 2]} for {shown[first : first + 2]}"
    _check_end(expected, leg.result)


def _check_answers(expected: Expected, leg: LegRecord) -> None:
    """Each rejection exactly once with its text, each admitted request at most once and never as a violation."""
    left = list(leg.host)

    def take(bridge_id: str, messages: tuple[str, ...]) -> str | None:
        for i, (b, ok, m) in enumerate(left):
            if b == bridge_id and not ok and m in messages:
                del left[i]
                return m
        return None

    for i, a in enumerate(expected.answers):
        if a.kind in REJECTIONS and a.immediate:
            got = take(a.bridge_id, (a.message, *a.also))
            assert got is not None, f"message {i}: no {a.kind} answer {a.message!r} for {a.bridge_id!r}; the host sent it {[x for x in leg.host if x[0] == a.bridge_id]}"
            assert (a.bridge_id, False, got) in leg.agent, f"message {i}: the {a.kind} answer never reached the cell"
    admitted = Counter(a.bridge_id for a in expected.answers if a.kind == "accepted")
    at_once = Counter(a.bridge_id for a in expected.answers if a.kind == "accepted" and a.immediate)
    answered = Counter(b for b, _, _ in left)
    for bridge_id, n in answered.items():
        assert n <= admitted[bridge_id], f"{bridge_id!r} was answered {n} times, but admitted {admitted[bridge_id]} times: {[x for x in left if x[0] == bridge_id]}"
    for bridge_id, n in at_once.items():
        assert answered[bridge_id] >= n, f"the admitted {bridge_id!r} was never answered"
    for b, ok, m in left:
        assert ok or not m.startswith(_P_PREFIXES), f"the admitted {b!r} got a protocol rejection: {m!r}"


def _check_end(expected: Expected, result: Any) -> None:
    """The leg's status, code, phase and message (or value)."""
    end = expected.end
    assert end is not None
    assert result.status == end.status, f"expected {end.answer}, got {result.raw_json}"
    if end.status == "completed":
        assert as_doubles(result.value) == end.value, result.raw_json
    if end.status == "failed":
        assert result.code in end.codes, f"expected {end.answer} {end.codes}, got {result.raw_json}"
        if end.phase is not None:
            assert result.failure_phase == end.phase, f"expected {end.answer} phase {end.phase}, got {result.raw_json}"
        if end.error is not None:
            assert result.error == end.error, f"expected {end.answer} {end.error!r}, got {result.raw_json}"
        assert result.error != msg.R22, f"a fault of the service (see its leg.fault log): {result.raw_json}"
