"""The run protocol's vocabulary: enums, settlements, resolved calls, leg events, claims.

Every value a client can see serializes to exactly the text of the SPEC (the enums are
``StrEnum``: ``json.dumps(RunStatus.WAITING) == '"waiting"'``). The leg's event queue
carries only the frozen event classes below, dispatched with ``match``:

==================  ====================================  ===========================
event               put by                                meaning
==================  ====================================  ===========================
``ToolOutcome``     the API (runtime stream), hosted MCP   a nested call was answered
``Cancelled``       the API (caller, CancelRun, scope)     abort the leg (SPEC §3.6)
``HostedSettled``   the API (hosted MCP call finished)     a result is on the run now
``TimerDue``        the settle loop's timer tasks          a ``timer`` request is due
``GuestMessage``    the leg's bridge pump                  one message from the cell
``CellExited``      the leg's cell watcher                 the cell's process ended
==================  ====================================  ===========================
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum
from typing import TYPE_CHECKING, Any, TypeAlias

from cellblock.bridge.v1 import bridge_service_pb2 as bpb
from cellblock.server import messages as msg
from cellblock.server.limits import scope_share
from cellblock.server.store import SlotAnswer

if TYPE_CHECKING:
    from cellblock.server.catalog import CatalogEntry
    from cellblock.server.runs._large_json import PreparedResult
    from cellblock.server.runs._state import Run

__all__ = [
    "BridgeMethod",
    "CancelReason",
    "Cancelled",
    "CellExited",
    "ClaimBusy",
    "ClaimCancelled",
    "ClaimForeign",
    "ClaimResult",
    "ClaimUnknown",
    "Claimed",
    "ErrorCode",
    "FailurePhase",
    "GuestMessage",
    "HostedSettled",
    "LegEvent",
    "LegOutcome",
    "ProtocolViolation",
    "Provenance",
    "ResolvedCall",
    "RunStatus",
    "RuntimeEvent",
    "Settlement",
    "SlotReserved",
    "TimerDue",
    "ToolErrorKind",
    "ToolOutcome",
    "failed",
]


class RunStatus(StrEnum):
    """A result's ``status`` (SPEC §10.5)."""

    COMPLETED = "completed"
    WAITING = "waiting"
    FAILED = "failed"


class ErrorCode(StrEnum):
    """A failed result's ``code`` (SPEC §11.1)."""

    INVALID_INPUT = "invalid_input"
    RUNTIME_UNAVAILABLE = "runtime_unavailable"
    ABORTED = "aborted"
    TIMEOUT = "timeout"
    OUTPUT_LIMIT_EXCEEDED = "output_limit_exceeded"
    SNAPSHOT_LIMIT_EXCEEDED = "snapshot_limit_exceeded"
    INTERNAL_ERROR = "internal_error"


class FailurePhase(StrEnum):
    """A failed result's ``failurePhase`` (SPEC §11.2)."""

    INPUT = "input"
    GUEST = "guest"
    BRIDGE = "bridge"
    HOST = "host"


class Provenance(StrEnum):
    """Who caused a host rejection the guest received (SPEC §8.2 item 6, §11.3).

    Uncaught, an ``input`` rejection ends the run with ``invalid_input``, an ``internal``
    one with ``internal_error``.
    """

    INPUT = "input"
    INTERNAL = "internal"


class BridgeMethod(StrEnum):
    """The bridge request methods (SPEC §8.2); the method part of ``bridge:<method>:<n>``."""

    SEARCH = "search"
    DESCRIBE = "describe"
    CALL = "call"
    CALL_VALUE = "callValue"
    NAMESPACE = "namespace"
    YIELD = "yield"
    TIMER = "timer"

    @property
    def nested(self) -> bool:
        """Whether the request becomes a nested tool call of the runtime."""
        return self in _NESTED


_NESTED = frozenset({BridgeMethod.CALL, BridgeMethod.CALL_VALUE, BridgeMethod.NAMESPACE})


class CancelReason(StrEnum):
    """Why a leg is aborted: the caller (stream cancel, CancelRun), the scope's end, or shutdown."""

    CALLER = "caller"
    SCOPE = "scope"
    SHUTDOWN = "shutdown"


class ToolErrorKind(StrEnum):
    """How a nested call failed, as the runtime reported it (SPEC §3.5 item 5)."""

    INVALID_INPUT = "invalid_input"
    BLOCKED = "blocked"
    FAILED = "failed"
    CANCELLED = "cancelled"


# ------------------------------------------------------------------ settlements and calls
@dataclass(frozen=True)
class Settlement:
    """The answer a bridge request gets, held on the run until it is delivered.

    Attributes:
        ok: True for a value, False for a rejection.
        payload: The value as compact JSON text (ok), else the guest-facing message.
        code: The rejection's ``code`` property (``"input_contract"`` for [B10]), else ``""``.
    """

    ok: bool
    payload: str
    code: str = ""

    @classmethod
    def value(cls, json_text: str) -> Settlement:
        """A value settlement; ``json_text`` is compact JSON."""
        return cls(True, json_text)

    @classmethod
    def rejection(cls, message: str, code: str = "") -> Settlement:
        """A host rejection with its guest-facing message (SPEC §14.4)."""
        return cls(False, message, code)


#: A timer's settlement: it resolves with ``null``.
TIMER_FIRED = Settlement.value("null")


@dataclass(frozen=True)
class ProtocolViolation:
    """A request that breaks the bridge protocol ([P01]-[P03]): rejected back to the guest, never recorded.

    Attributes:
        bridge_id: The request's id, as the guest sent it.
        message: The guest-facing rejection (SPEC §14.5).
    """

    bridge_id: str
    message: str


@dataclass(frozen=True)
class ResolvedCall:
    """A nested call resolved against the run's catalog and checked against its input contract.

    Attributes:
        entry: The catalog entry called.
        input: The tool input sent to the runtime (JSON-safe).
        replay_safe: SPEC §10.8 item 1 (always False for ``namespace`` calls).
        label: The ``<id>`` of tool messages: the entry id, or the guest path
            (``MCP.<path>``) of a namespace call (SPEC §14).
        input_unchecked: The input is a long text (``runs.JsonText``) whose input contract
            is still to be checked in a worker; such a call is never dispatched.
    """

    entry: CatalogEntry
    input: object
    replay_safe: bool
    label: str
    input_unchecked: bool = False


# ------------------------------------------------------------------ leg events
@dataclass(frozen=True)
class ToolOutcome:
    """A runtime's answer to one nested call.

    Attributes:
        nested_call_id: The call answered.
        ok_json: The tool result as JSON text, when it succeeded.
        error_kind: How it failed, when it did not.
        error_message: The runtime's message for a failure.
        oversized_bytes: The size in bytes of a result the runtime could not
            send because it exceeds the service's message cap (the guest gets [B12]).
        prepared: A long ``ok_json`` as a worker process read it (``runs.PreparedResult``):
            the loop sends on its compact text and does not read ``ok_json`` again.
    """

    nested_call_id: str
    ok_json: str | None = None
    error_kind: ToolErrorKind | str = ""
    error_message: str = ""
    oversized_bytes: int = 0
    prepared: PreparedResult | None = None


@dataclass(frozen=True)
class Cancelled:
    """Abort the leg (SPEC §3.6); ``reason`` picks [R07], [R08] or [R20]."""

    reason: CancelReason = CancelReason.CALLER


@dataclass(frozen=True)
class HostedSettled:
    """A cellblock-hosted MCP call recorded its settlement on the run (SPEC §3.2 item 7)."""

    bridge_id: str


@dataclass(frozen=True)
class TimerDue:
    """The ``timer`` request ``bridge_id`` is due."""

    bridge_id: str


@dataclass(frozen=True)
class SlotReserved:
    """The run store answered the slot reservation of the run's first dispatch (SPEC §10.7).

    Attributes:
        granted: The store's answer: true (:attr:`SlotAnswer.HELD`) when the run now
            holds a suspended-run slot; else why not (the run fails with [R01] or [R23]).
    """

    granted: SlotAnswer


@dataclass(frozen=True)
class GuestMessage:
    """One message from the cell's bridge stream; ``None`` marks the stream's end."""

    message: bpb.AttachRequest | None


@dataclass(frozen=True)
class CellExited:
    """The cell's process ended with ``code`` (negative: killed by that signal)."""

    code: int


@dataclass(frozen=True)
class DeadlineTick:
    """The leg's deadline or its watchdog's kill time came (the settle loop's two timers, armed once per loop)."""


#: What the runtime side (the API) puts on a leg's queue.
RuntimeEvent: TypeAlias = ToolOutcome | Cancelled | HostedSettled
#: Everything the settle loop dispatches.
LegEvent: TypeAlias = RuntimeEvent | TimerDue | SlotReserved | GuestMessage | CellExited | DeadlineTick


# ------------------------------------------------------------------ outcomes and claims
@dataclass
class LegOutcome:
    """How a leg ended, before projection into a result object (SPEC §10.5).

    Attributes:
        status: The result's status.
        value: The value (completed): its compact JSON as the leg's end read it
            (``runs.JsonText``), or a JSON-safe value.
        value_text: Instead of ``value``, the value's compact JSON as the cell sent it, when
            it is too large for the run's allowance and was not parsed (SPEC §9 rule 6).
        code, message, phase: The failure (failed).
        cell_id: The cell that ran the leg, if one started.
        reason: Why a waiting leg parked: ``yield`` or ``pending_tools``.
        snapshot: The suspended cell's snapshot (waiting); the runner parks it with
            the run in one store transaction (SPEC §16.1 item 2).
    """

    status: RunStatus
    value: Any = None
    value_text: str | None = None
    code: ErrorCode | None = None
    message: str = ""
    phase: FailurePhase = FailurePhase.HOST
    cell_id: str = ""
    reason: str = ""
    snapshot: bytes | None = None


def failed(code: ErrorCode, message: str, phase: FailurePhase = FailurePhase.HOST) -> LegOutcome:
    """Builds a failed outcome."""
    return LegOutcome(status=RunStatus.FAILED, code=code, message=message, phase=phase)


def slot_refused(answer: SlotAnswer, cap: int) -> LegOutcome:
    """The failure of a run the store refused a suspended-run slot: [R23] over its scope's share, [R25] unanswered, else [R01].

    Args:
        answer: The store's refusal (anything but :attr:`SlotAnswer.HELD`).
        cap: The deployment's suspended-run cap.
    """
    if answer is SlotAnswer.UNANSWERED:
        return failed(ErrorCode.RUNTIME_UNAVAILABLE, msg.R25)
    text = msg.r23(scope_share(cap), cap) if answer is SlotAnswer.SCOPE_FULL else msg.r01(cap)
    return failed(ErrorCode.RUNTIME_UNAVAILABLE, text)


@dataclass(frozen=True)
class Claimed:
    """The wait now holds the suspended run (its lease in the run store).

    Attributes:
        run: The run, rebuilt from its stored record.
        snapshot: The run's stored snapshot bytes.
    """

    run: Run
    snapshot: bytes | None


@dataclass(frozen=True)
class ClaimBusy:
    """Another wait (on any replica) holds the run's lease."""


@dataclass(frozen=True)
class ClaimForeign:
    """The run belongs to another scope.

    Attributes:
        other_session: True when another session owns it ([W04]); else another
            agent run of the same session ([W05]).
    """

    other_session: bool


@dataclass(frozen=True)
class ClaimCancelled:
    """The scope's run was cancelled; waits report ``aborted`` until its expiry (SPEC §3.6)."""


@dataclass(frozen=True)
class ClaimUnknown:
    """No suspended run has that id (never created, ended or expired)."""


#: The result of :meth:`~cellblock.server.runs.RunRegistry.claim`.
ClaimResult: TypeAlias = Claimed | ClaimBusy | ClaimForeign | ClaimCancelled | ClaimUnknown
