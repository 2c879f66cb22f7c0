"""The bridge fuzzer's oracle: the answer docs/SPEC.md documents for each guest message (issue 11).

An independent model of the host's side of the bridge as SPEC §8.2, §14.5 and §11.4 describe
it, not a copy of the host's code: given a plan of raw ``AttachRequest`` messages (what
``tests/support/fuzz_guest.py`` sends in a real cell after its ``hello``), it says, message
by message, what the host must answer, and how the leg must end.

Answer classes of a message the host reads (:class:`Answer` ``kind``):

==================  ==========================================================================
``P01``-``P03``,    a protocol violation (SPEC §14.5): a ``Settle`` rejecting it at once with the
``P05``             exact message, for the id it carried (cut to 256 characters); never pending
``B23``             an argument nested deeper than ``VALUE_DEPTH`` levels (SPEC §8.8 rule 7, the
                    host's second layer): rejected, not answered once parking
``accepted``        a request the host admits: answered by its own processing (a value or a B-code
                    rejection), at most once and never with a P-code; ``search``/``describe`` are
                    answered at once unless the leg is parking
``refused``         a request the controller refused itself (SPEC §8.2 item 6): recorded, no answer
``output``          an output entry of the documented shape: shown to the caller, in order
``dropped``         an output entry of another shape: dropped and logged, no answer
``idle``            the guest waits on host work: no answer
``omission``        output entries the controller omitted: counted, no answer
``chunk``           a snapshot chunk after the host's ``Suspend``: kept for the snapshot
``ends the leg``    the message that ends the leg (see :class:`LegEnd`); nothing after it is read
==================  ==========================================================================
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from typing import Any

from google.protobuf.message import DecodeError

from cellblock.bridge.v1 import bridge_service_pb2 as pb
from cellblock.server import messages as msg
from cellblock.server.config import Limits

METHODS = ("search", "describe", "call", "callValue", "namespace", "yield", "timer")
#: SPEC §8.2 item 2: ``bridge:<method>:<n>``, ``<n>`` from 1, no leading zero, at most 16 digits, nothing around it.
_ID_DIGITS = re.compile(r"[1-9][0-9]{0,15}")
#: Ids are echoed back cut to this many characters (``MAX_BRIDGE_ID_CHARS``, SPEC §3.1).
ID_ECHO_CHARS = 256
#: Answers that are ``Settle`` rejections the host sends as soon as it reads the message.
REJECTIONS = frozenset({"P01", "P02", "P03", "P05", "B23"})
#: The value nesting bound (SPEC §2.3 "Value nesting", §8.8 rule 7): the host counts it exactly
#: on what a cell sends, whatever the interpreter's recursion limit (hypothesis raises it while it
#: runs a test body), so a value at most this deep is read and one level more is too deep: each
#: argument of a request ([B23]), the final value ([R15]), an output entry's value (dropped).
#: The fuzzer's deep texts are well-formed; a malformed one nested deeper has no documented answer
#: (the host's parser meets its error or its recursion limit first).
VALUE_DEPTH = 256
#: A JSON string (skipped) or a bracket, for :func:`nesting`.
_STRING_OR_BRACKET = re.compile(r'"[^"\\]*(?:\\.[^"\\]*)*"|[\[\]{}]')


@dataclass(frozen=True)
class Answer:
    """The documented answer to one message the host reads.

    Attributes:
        kind: The answer class (module docstring).
        bridge_id: For requests, the id the answer carries (cut to 256 characters).
        message: For rejections, the exact message; for ``accepted``, the method.
        immediate: The host answers it before it reads the next message.
        also: Other messages the SPEC allows for it (a nested call over the host's pending count
            gets [B24] first, SPEC §8.4 item 7; whether it is depends on how fast calls are answered).
    """

    kind: str
    bridge_id: str = ""
    message: str = ""
    immediate: bool = False
    also: tuple[str, ...] = ()


@dataclass(frozen=True)
class LegEnd:
    """How the leg must end: the result's ``status`` and, for ``failed``, its ``code`` and ``error``.

    ``error`` ``None`` means any text (guest text the runner may shape); ``codes`` lists
    the codes allowed when the SPEC leaves the choice to a record the oracle cannot see
    (the provenance of an accepted request's rejection, SPEC §11.3).
    """

    answer: str
    status: str
    codes: tuple[str, ...] = ()
    error: str | None = None
    phase: str | None = None
    value: Any = None


@dataclass
class Expected:
    """The oracle's verdict on one plan.

    Attributes:
        answers: One answer per message the host reads, in plan order.
        read: How many of the plan's messages the host reads (the rest follow the leg's end).
        end: How the leg ends.
        output: The output entries the caller must see, in order.
    """

    answers: list[Answer] = field(default_factory=list)
    read: int = 0
    end: LegEnd | None = None
    output: list[dict[str, Any]] = field(default_factory=list)

    @property
    def immediate(self) -> int:
        """Answers the host sends as it reads the plan's messages (the guest waits for them before the end)."""
        return sum(a.immediate for a in self.answers)


def _not_json(constant: str) -> Any:
    raise ValueError(constant)


def _number(text: str) -> Any:
    """SPEC §0.3: a JSON number is an ECMAScript number (a double); small integers stay exact."""
    value = int(text)
    return value if abs(value) <= 2**53 else float(value)


def as_doubles(value: Any) -> Any:
    """``value`` with every integer beyond 2**53 as the double it stands for (SPEC §0.3), to compare JSON values."""
    if isinstance(value, bool) or value is None:
        return value
    if isinstance(value, int):
        return value if abs(value) <= 2**53 else float(value)
    if isinstance(value, list):
        return [as_doubles(v) for v in value]
    if isinstance(value, dict):
        return {k: as_doubles(v) for k, v in value.items()}
    return value


class TooDeepError(Exception):
    """A JSON text nested deeper than its bound (:data:`VALUE_DEPTH`, plus the arguments' array or the entry's object)."""


def nesting(text: str) -> int:
    """How deep the arrays and objects of a JSON text nest (0 for a scalar), counted without recursion.

    Brackets inside string literals do not count. For a text that is not JSON the count covers
    the whole text (the fuzzer's deep texts are well-formed arrays).
    """
    depth = deepest = 0
    for token in _STRING_OR_BRACKET.finditer(text):
        if token.group() in "[{":
            depth += 1
            deepest = max(deepest, depth)
        elif token.group() in "]}":
            depth -= 1
    return deepest


def _loads(text: str, bound: int) -> Any:
    """RFC 8259 JSON: ``NaN`` and ``Infinity`` are not JSON; numbers are doubles (SPEC §0.3).

    Args:
        text: The JSON text.
        bound: The deepest nesting it may have, levels.

    Raises:
        ValueError: ``text`` is not JSON.
        TooDeepError: ``text`` nests deeper than ``bound``.
    """
    if nesting(text) > bound:
        raise TooDeepError
    return json.loads(text, parse_constant=_not_json, parse_int=_number)


def _id_number(bridge_id: str, method: str) -> int | None:
    prefix = f"bridge:{method}:"
    if not bridge_id.startswith(prefix) or not _ID_DIGITS.fullmatch(bridge_id[len(prefix) :]):
        return None
    return int(bridge_id[len(prefix) :])


def _guest_text(literal: str) -> str:
    """Guest text crosses as a JSON string literal; anything else stays as it came (bridge_service.proto ``Failed``)."""
    try:
        decoded = json.loads(literal)
    except (ValueError, RecursionError):
        return literal
    return decoded if isinstance(decoded, str) else literal


def _is_entry(entry: object) -> bool:
    """SPEC §10.5: ``{type: "text", text: <string>}`` or ``{type: "json", value}``, nothing else."""
    if not isinstance(entry, dict):
        return False
    if entry.get("type") == "text":
        return set(entry) == {"type", "text"} and isinstance(entry["text"], str)
    return entry.get("type") == "json" and set(entry) == {"type", "value"}


class _Model:
    def __init__(self, timeout_ms: int, memory_limit_bytes: int) -> None:
        self.timeout_ms = timeout_ms
        self.max_pending = Limits().max_pending_tool_calls
        self.memory_limit_bytes = memory_limit_bytes
        self.seen: set[str] = set()
        self.counters: dict[str, int] = {}
        #: Ids whose rejection the host recorded as internal (P-codes), as input (B23), or admitted.
        self.internal: set[str] = set()
        self.input: set[str] = set()
        self.admitted: set[str] = set()
        self.refused: list[tuple[str, int, int, str]] = []
        self.suspend_sent = False
        self.snapshot_received = 0

    def request(self, r: pb.GuestRequest) -> Answer:
        echo = r.bridge_id[:ID_ECHO_CHARS]
        if r.method not in METHODS:
            self.internal.add(r.bridge_id)
            return Answer("P01", echo, msg.p01(r.method), True)
        n = _id_number(r.bridge_id, r.method)
        if n is None:
            self.internal.add(r.bridge_id)
            return Answer("P02", echo, msg.p02(r.bridge_id), True)
        if r.refusal != pb.GUEST_REFUSAL_UNSPECIFIED:
            last = n + max(1, r.refused_count) - 1
            if last >= 10**16:  # the range runs past the ids the bridge can name
                self.internal.add(r.bridge_id)
                return Answer("P02", echo, msg.p02(r.bridge_id), True)
            if n <= self.counters.get(r.method, 0):  # the range starts at or below an id already used
                self.internal.add(r.bridge_id)
                return Answer("P03", echo, msg.p03(r.bridge_id), True)
            self.counters[r.method] = last
            provenance = "input" if r.refusal in (pb.GUEST_REFUSAL_TOO_LARGE, pb.GUEST_REFUSAL_NAMESPACE_ARGUMENTS, pb.GUEST_REFUSAL_TOO_DEEP) else "internal"
            self.refused.append((r.method, n, last, provenance))
            return Answer("refused", echo)
        if r.bridge_id in self.seen or n <= self.counters.get(r.method, 0):  # ids only go up
            return Answer("P03", echo, msg.p03(r.bridge_id), True)
        too_deep = False
        try:
            args = _loads(r.args_json, VALUE_DEPTH + 1)  # the array holds the arguments
        except TooDeepError:
            args, too_deep = [], True
        except ValueError:
            args = "not JSON"
        if not isinstance(args, list):
            self.internal.add(r.bridge_id)
            return Answer("P05", echo, msg.p05(r.bridge_id), True)
        self.seen.add(r.bridge_id)
        self.counters[r.method] = max(self.counters.get(r.method, 0), n)
        if too_deep:  # an argument deeper than the bound
            self.input.add(r.bridge_id)
            nested = r.method in ("call", "callValue", "namespace")
            return Answer("B23", echo, msg.b23(r.method), not self.suspend_sent, (msg.b24(self.max_pending),) if nested else ())
        self.admitted.add(r.bridge_id)
        answer = Answer("accepted", echo, r.method, r.method in ("search", "describe") and not self.suspend_sent)
        if r.method == "yield":
            self.suspend_sent = True  # a yield parks the leg at once (SPEC §10.4 item 1)
        return answer

    def provenance(self, bridge_id: str) -> str | None:
        if bridge_id in self.admitted:  # its own answer decides, which the oracle does not model
            return "either"
        if bridge_id in self.internal:
            return "internal"
        if bridge_id in self.input:
            return "input"
        for method, first, last, provenance in self.refused:
            n = _id_number(bridge_id, method)
            if n is not None and first <= n <= last:
                return provenance
        return None

    def end(self, e: pb.LegEnd) -> LegEnd:
        which = e.WhichOneof("outcome")
        invalid = LegEnd("R17", "failed", ("internal_error",), msg.R17, "host")
        if which == "completed":
            try:
                return LegEnd("completed", "completed", value=_loads(e.completed.value_json, VALUE_DEPTH))
            except TooDeepError:
                return LegEnd("R15", "failed", ("output_limit_exceeded",), msg.r15(f"nesting is deeper than {VALUE_DEPTH} levels"), "host")
            except ValueError:
                return invalid
        if which == "suspended":
            if not self.suspend_sent or e.suspended.snapshot_bytes != self.snapshot_received:
                return invalid  # a suspension the host did not ask for, or chunks of another size
            return LegEnd("waiting", "waiting")
        return self.failure(e.failed) if which == "failed" else invalid

    def failure(self, f: pb.Failed) -> LegEnd:
        """SPEC §11.1-§11.4: the guest's report of a failed program."""
        fixed = {
            pb.FAILURE_KIND_UNSETTLEABLE: LegEnd("R04", "failed", ("internal_error",), msg.R04, "guest"),
            pb.FAILURE_KIND_MEMORY: LegEnd("R09", "failed", ("runtime_unavailable",), msg.r09(self.memory_limit_bytes), "host"),
            pb.FAILURE_KIND_ENGINE_TRAP: LegEnd("R10", "failed", ("runtime_unavailable",), msg.R10, "host"),
            pb.FAILURE_KIND_INTERRUPTED: LegEnd("R05", "failed", ("timeout",), msg.r05(self.timeout_ms), "host"),
            pb.FAILURE_KIND_UNSERIALISABLE: LegEnd("R15", "failed", ("output_limit_exceeded",), None, "host"),
        }
        if f.kind in fixed:
            return fixed[f.kind]
        guest_error = LegEnd("guest error", "failed", ("internal_error",), None, "guest")
        if f.kind == pb.FAILURE_KIND_GUEST_ERROR:
            return guest_error
        if f.kind == pb.FAILURE_KIND_BRIDGE_REJECTION:
            provenance = self.provenance(f.rejection_bridge_id)
            if provenance is None:  # no rejection the host delivered: the guest's own error
                return guest_error
            codes = {"input": ("invalid_input",), "internal": ("internal_error",), "either": ("invalid_input", "internal_error")}[provenance]
            return LegEnd("uncaught host reply", "failed", codes, None, "bridge")
        if f.kind == pb.FAILURE_KIND_SYNTAX:
            line_text, _, engine_message = _guest_text(f.message).partition(":")
            line = int(line_text) if len(line_text) <= 9 and line_text.isascii() and line_text.isdigit() else 1
            return LegEnd("S02", "failed", ("invalid_input",), msg.s02(line, 1, engine_message), "input")
        return LegEnd("R17", "failed", ("internal_error",), msg.R17, "host")  # a failure kind the SPEC does not name


def expect(messages: list[bytes], *, good_token: bool, timeout_ms: int, memory_limit_bytes: int) -> Expected:
    """The documented answers to ``messages``, sent after the ``hello`` (SPEC §8.2, §14.5, §11.4).

    Args:
        messages: The plan's raw messages, in order.
        good_token: Whether the guest attaches with its own token (else the bridge refuses it).
        timeout_ms: The leg's ``timeoutMs``; the plan is read long before it.
        memory_limit_bytes: The run's ``memoryLimitBytes`` ([R09]).

    Returns:
        The answers, the number of messages read, the leg's end and the output the caller sees.
    """
    out = Expected()
    if not good_token:
        # A wrong token never attaches; the agent exits 0 (SPEC §11.4, [R13]).
        out.end = LegEnd("R13", "failed", ("runtime_unavailable",), msg.R13, "host")
        return out
    model = _Model(timeout_ms, memory_limit_bytes)
    invalid = LegEnd("R17", "failed", ("internal_error",), msg.R17, "host")
    for raw in messages:
        out.read += 1
        try:
            m = pb.AttachRequest.FromString(raw)
        except DecodeError:
            out.answers.append(Answer("ends the leg"))
            out.end = invalid  # bytes that are no bridge message
            return out
        which = m.WhichOneof("message")
        if which == "request":
            out.answers.append(model.request(m.request))
        elif which == "output":
            try:
                entry = _loads(m.output.entry_json, VALUE_DEPTH + 1)  # the object holds the value
            except (ValueError, TooDeepError):
                entry = None
            ok = _is_entry(entry)
            out.answers.append(Answer("output" if ok else "dropped"))
            if ok:
                out.output.append(entry)
        elif which in ("idle", "omission"):
            out.answers.append(Answer(which))
        elif which == "snapshot_chunk" and model.suspend_sent:
            model.snapshot_received += len(m.snapshot_chunk.data)
            out.answers.append(Answer("chunk"))
        else:
            out.answers.append(Answer("ends the leg"))
            out.end = model.end(m.end) if which == "end" else invalid  # a second hello, an unasked chunk, no message
            return out
    # The guest goes quiet without an end: still computing, as far as the host can tell, until the watchdog.
    out.end = LegEnd("R06", "failed", ("timeout",), msg.r06(timeout_ms), "host")
    return out
