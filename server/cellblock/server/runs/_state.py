"""The state a run keeps across its legs (SPEC §10.7 item 2)."""

from __future__ import annotations

import hashlib
import json
import re
import secrets
import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from cellblock.server.config import Limits
from cellblock.server.runs._output import OutputBudget
from cellblock.server.runs._protocol import BridgeMethod, Provenance, ResolvedCall, Settlement

if TYPE_CHECKING:
    from opentelemetry.trace import Span, SpanContext

    from cellblock.server.runs._ports import CatalogPort

_UNSAFE = re.compile(r"[^A-Za-z0-9_-]")


def new_run_id() -> str:
    """Returns ``run_`` plus 32 random lower-case hex digits (SPEC §10.2)."""
    return "run_" + secrets.token_hex(16)


def replay_id(session_id: str, agent_run_id: str, turn_id: str, tool_call_id: str, source: str) -> str:
    """Returns the replay id of SPEC §3.5 item 4.

    ``replay_`` plus the first 24 hex digits of SHA-256 over the compact JSON
    array ``[session_id, agent_run_id, turn_id or "", tool_call_id, source]``.
    """
    payload = json.dumps([session_id, agent_run_id, turn_id or "", tool_call_id, source], separators=(",", ":"), ensure_ascii=False)
    digest = hashlib.sha256(payload.encode("utf-8", "surrogatepass")).hexdigest()
    return "replay_" + digest[:24]


def nested_call_id(tool_call_id: str, replay: str, n: int) -> str:
    """Returns ``cellblock_<P>_<R>_<n>`` (SPEC §3.5 item 3)."""
    p = _UNSAFE.sub("_", tool_call_id)[:48]
    r = replay[len("replay_") :][:8]
    return f"cellblock_{p}_{r}_{n}"


#: Longest bridge id kept as itself in a run's provenance record; a protocol violation's id is guest text of any length.
_MAX_KEPT_ID_CHARS = 256


def provenance_key(bridge_id: str) -> str:
    """The key of ``bridge_id`` in :attr:`Run.provenance`: itself, or a digest of a longer one.

    A violation's id is the guest's text, up to a whole bridge message (megabytes): kept
    as itself, every violating request grew the host's memory and the parked run's record
    by its id (SPEC §2.3, §10.7).
    """
    if len(bridge_id) <= _MAX_KEPT_ID_CHARS:
        return bridge_id
    return "sha256:" + hashlib.sha256(bridge_id.encode("utf-8", "surrogatepass")).hexdigest()


@dataclass
class PendingRequest:
    """A bridge request whose result the guest has not received.

    Attributes:
        bridge_id: ``bridge:<method>:<n>``.
        method: The bridge method.
        args: The request's JSON arguments.
        nested_call_id: Set once a nested call was dispatched for it.
        call: The resolved nested call (nested methods, once resolved).
        replay_safe: Whether the request may be replayed (SPEC §10.8 item 1).
        dispatched: Whether the request went out (or was scheduled).
        result: A settlement not yet delivered.
        settled_at: Monotonic time the settlement arrived (completion order).
    """

    bridge_id: str
    method: BridgeMethod
    args: list[object] = field(default_factory=list)
    nested_call_id: str = ""
    call: ResolvedCall | None = None
    replay_safe: bool = False
    dispatched: bool = False
    result: Settlement | None = None
    settled_at: float = 0.0
    #: The arguments nest deeper than the host's JSON parser (rejected with [B23], never dispatched).
    too_deep: bool = False
    #: Wall-clock due time of a timer (``time.time()`` seconds); timers keep it across suspension.
    due_at: float = 0.0


@dataclass
class Run:
    """One run, from its exec to its terminal result.

    Attributes mirror SPEC §10.7 item 2; ``view`` is the frozen catalog view
    the run started with.
    """

    run_id: str
    session_id: str
    agent_run_id: str
    tool_call_id: str
    turn_id: str
    replay_id: str
    limits: Limits
    restart_safe: bool
    view: CatalogPort
    budget: OutputBudget
    created_at: float = field(default_factory=time.time)
    expires_at: float = 0.0
    bridge_counters: dict[str, int] = field(default_factory=dict)
    nested_calls: int = 0
    dispatch_started: bool = False
    non_replay_safe_dispatched: bool = False
    counts: dict[str, int] = field(default_factory=lambda: {"search": 0, "describe": 0, "call": 0})
    legs: int = 0
    #: True while the run's snapshot is stored (the run is suspended).
    suspended: bool = False
    snapshot_bytes: int = 0
    pending: dict[str, PendingRequest] = field(default_factory=dict)
    #: bridge id (:func:`provenance_key`) -> "input" or "internal", for every rejection delivered.
    provenance: dict[str, Provenance] = field(default_factory=dict)
    #: Requests the controller refused in floods: ``(method, first n, last n, provenance)``.
    #: One range per run of consecutive refused ids, so a flood costs no per-id state.
    refused_ranges: list[tuple[str, int, int, Provenance]] = field(default_factory=list)
    seen_bridge_ids: set[str] = field(default_factory=set)
    holds_slot: bool = False
    cancelled: bool = False
    engine_build_id: str = ""
    #: The Exec RPC span's context (an ``opentelemetry.trace.SpanContext``):
    #: the parent of every ``bridge.tool_call`` span of the run, in every leg.
    exec_span_context: SpanContext | None = None
    #: Open ``bridge.tool_call`` spans by nested call id: ``(span, monotonic dispatch time)``.
    tool_spans: dict[str, tuple[Span, float]] = field(default_factory=dict)

    def provenance_of(self, bridge_id: str) -> Provenance | None:
        """The recorded provenance of a delivered rejection, or ``None`` (SPEC §8.2 item 6)."""
        known = self.provenance.get(provenance_key(bridge_id))
        if known is not None:
            return known
        method, _, n_text = bridge_id.removeprefix("bridge:").partition(":")
        n = int(n_text) if len(n_text) <= 16 and n_text.isascii() and n_text.isdigit() else 0  # at most 16 ASCII digits, as in an id (SPEC §8.2)
        for m, first, last, provenance in self.refused_ranges:
            if m == method and first <= n <= last:
                return provenance
        return None

    def next_nested_call_id(self) -> str:
        """Numbers the run's next nested call (SPEC §3.5 item 3)."""
        self.nested_calls += 1
        return nested_call_id(self.tool_call_id, self.replay_id, self.nested_calls)

    @property
    def replay_safe(self) -> bool:
        """SPEC §10.8 item 3."""
        return self.restart_safe and not self.non_replay_safe_dispatched

    def pending_list(self) -> list[dict[str, str]]:
        """The ``pendingToolCalls`` of a waiting result, in request order."""
        return [{"id": p.bridge_id, "method": p.method.value} for p in self.pending.values()]
