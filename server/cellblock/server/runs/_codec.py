"""A parked run as a run-store document and back (SPEC §10.7 item 2, §16.1).

The document holds everything another process needs to resume the run: ids
and scope, limits, restartSafe, the catalog view and session with the
``MCP`` map and ``API`` files (the view's own :meth:`to_state`), host work
(every pending request with its dispatch state and undelivered result), the
output budget, bridge and nested-call counters, ``bridgeDispatchStarted``
and the Exec span's context. The snapshot bytes and the engine build id
travel beside it in the record. Open ``bridge.tool_call`` spans are process
objects and stay behind (:class:`RunRegistry` reattaches them when the same
process resumes the run).
"""

from __future__ import annotations

import dataclasses
import json
import re
import secrets
import time
from collections.abc import Callable, Iterator, Mapping
from functools import cached_property
from typing import Any

from opentelemetry.trace import SpanContext, TraceFlags

from cellblock.server.config import Limits
from cellblock.server.runs._large_json import JsonText
from cellblock.server.runs._output import OutputBudget
from cellblock.server.runs._ports import CatalogPort
from cellblock.server.runs._protocol import BridgeMethod, Provenance, ResolvedCall, Settlement
from cellblock.server.runs._state import PendingRequest, Run
from cellblock.server.store import RunRecord

#: Version of the document layout; a store written by a newer layout is refused on decode.
FORMAT = 1

#: ``restore_view(view_document, (session_id, agent_run_id))`` -> the run's view object.
ViewRestorer = Callable[[Mapping[str, Any], tuple[str, str]], CatalogPort]

#: The document's start: ``viewAt`` is the offset of its last key, the view (10 digits, fixed width).
_VIEW_AT = re.compile(rb'\{"format":1,"viewAt":"([0-9]{10})"')
_VIEW_KEY = b',"view":'
#: A prepared view's stored form starts with its preparation's id (``RunCatalog.state_bytes``).
_CATALOG_VERSION = re.compile(rb'\{"catalogVersion":"([0-9a-f]{1,64})"')


class StoredView(Mapping[str, Any]):
    """A parked run's stored catalog view, parsed only when a key other than ``catalogVersion`` is read.

    The view is tens of MB in a scope with large ``mcp`` schemas, and parsing it on the event
    loop took about 0.2 s; a run resumed on the replica that prepared its catalog version
    needs only the version's id (SPEC §3.1 item 6, §10.7 item 2).

    Args:
        data: The view's UTF-8 JSON (an object); a memoryview of the document is not copied
            (copying tens of MB on the loop for each ``ListRuns`` and resume took 10-20 ms).
    """

    def __init__(self, data: bytes | memoryview) -> None:
        self._data = data

    def get(self, key: str, default: Any = None) -> Any:
        """``catalogVersion`` from the document's first bytes; any other key parses the view."""
        if key == "catalogVersion" and "_parsed" not in self.__dict__:
            found = _CATALOG_VERSION.match(self._data)
            return found.group(1).decode() if found is not None else default
        return super().get(key, default)

    @cached_property
    def _parsed(self) -> dict[str, Any]:
        value = json.loads(str(self._data, "utf-8", "surrogatepass"))
        if not isinstance(value, dict):
            raise RunDecodeError("the stored catalog view is not a JSON object")
        return value

    def __getitem__(self, key: str) -> Any:
        return self._parsed[key]

    def __iter__(self) -> Iterator[str]:
        return iter(self._parsed)

    def __len__(self) -> int:
        return len(self._parsed)


def split_document(body: bytes) -> tuple[dict[str, Any], StoredView | None]:
    """A run document's keys other than ``view``, parsed, and its view, not parsed yet.

    Documents written by :func:`encode_run` name where their view starts (``viewAt``), so
    only the small head is parsed here; an older document without it is parsed whole.

    Raises:
        ValueError: The document is not JSON (``UnicodeDecodeError`` for bad UTF-8).
    """
    found = _VIEW_AT.match(body)
    at = int(found.group(1)) if found is not None else -1
    if at > 0 and body[at : at + len(_VIEW_KEY)] == _VIEW_KEY and body.endswith(b"}"):
        head = json.loads(body[:at].decode("utf-8", "surrogatepass") + "}")
        return head, StoredView(memoryview(body)[at + len(_VIEW_KEY) : -1])
    doc = json.loads(body.decode("utf-8", "surrogatepass"))
    if not isinstance(doc, dict):
        raise ValueError("a run document is a JSON object")
    view = doc.pop("view", None)
    return doc, StoredView(_utf8(view)) if view is not None else None


def _utf8(value: Any) -> bytes:
    return json.dumps(value, separators=(",", ":"), ensure_ascii=False).encode("utf-8", "surrogatepass")


def _with_texts(doc: dict[str, Any]) -> bytes:
    """:func:`_utf8` of a document whose pending arguments may hold :class:`JsonText`: their texts spliced in as they are."""
    texts: list[str] = []
    nonce = secrets.token_hex(8)

    def mark(value: object) -> str:
        if not isinstance(value, JsonText):
            raise TypeError(f"not JSON: {type(value).__name__}")
        texts.append(value.text)
        return f"\0{nonce}:{len(texts) - 1}\0"

    body = json.dumps(doc, separators=(",", ":"), ensure_ascii=False, default=mark).encode("utf-8", "surrogatepass")
    if not texts:
        return body
    # One pass over the body (a replace per text rescanned and copied the whole document:
    # 16 pending 4 MB inputs, each in ``args`` and ``call.input``, held the loop 1.5 s).
    pieces = re.split(rb'"\\u0000' + nonce.encode() + rb":(\d+)\\u0000\"", body)
    for i in range(1, len(pieces), 2):
        pieces[i] = texts[int(pieces[i])].encode("utf-8", "surrogatepass")
    return b"".join(pieces)


class RunDecodeError(ValueError):
    """A stored run document this code cannot read."""


def _call_doc(call: ResolvedCall | None) -> dict[str, Any] | None:
    if call is None:
        return None
    return {"id": call.entry.id, "input": call.input, "replaySafe": call.replay_safe, "label": call.label}


def _pending_doc(p: PendingRequest, order: int | None) -> dict[str, Any]:
    return {
        "bridgeId": p.bridge_id,
        "method": p.method.value,
        "args": p.args,
        "nestedCallId": p.nested_call_id,
        "call": _call_doc(p.call),
        "replaySafe": p.replay_safe,
        "dispatched": p.dispatched,
        "result": [p.result.ok, p.result.payload, p.result.code] if p.result is not None else None,
        "settledOrder": order,
        "dueAt": p.due_at,
    }


def _span_doc(ctx: Any) -> dict[str, Any] | None:
    if not isinstance(ctx, SpanContext) or not ctx.is_valid:
        return None
    return {"traceId": f"{ctx.trace_id:032x}", "spanId": f"{ctx.span_id:016x}", "flags": int(ctx.trace_flags)}


def encode_run(run: Run) -> bytes:
    """:func:`encode_run_parts` joined."""
    return b"".join(encode_run_parts(run))


def encode_run_parts(run: Run) -> list[bytes | memoryview]:
    """The run's state as a compact JSON document (UTF-8, lone surrogates kept)."""
    settled = sorted((p for p in run.pending.values() if p.result is not None), key=lambda p: p.settled_at)
    order = {p.bridge_id: i for i, p in enumerate(settled)}
    doc = {
        "format": FORMAT,
        "viewAt": "0" * 10,  # the view's offset, written below at the same width
        "runId": run.run_id,
        "sessionId": run.session_id,
        "agentRunId": run.agent_run_id,
        "toolCallId": run.tool_call_id,
        "turnId": run.turn_id,
        "replayId": run.replay_id,
        "limits": dataclasses.asdict(run.limits),
        "restartSafe": run.restart_safe,
        "budget": run.budget.to_state(),
        "createdAt": run.created_at,
        "bridgeCounters": run.bridge_counters,
        "nestedCalls": run.nested_calls,
        "dispatchStarted": run.dispatch_started,
        "nonReplaySafeDispatched": run.non_replay_safe_dispatched,
        "counts": run.counts,
        "legs": run.legs,
        "snapshotBytes": run.snapshot_bytes,
        "pending": [_pending_doc(p, order.get(p.bridge_id)) for p in run.pending.values()],
        "provenance": {k: v.value for k, v in run.provenance.items()},
        "refusedRanges": [[m, first, last, prov.value] for m, first, last, prov in run.refused_ranges],
        "seenBridgeIds": sorted(run.seen_bridge_ids),
        "engineBuildId": run.engine_build_id,
        "execSpan": _span_doc(run.exec_span_context),
    }
    head = _with_texts(doc)
    # The catalog view is tens of MB in a scope with large mcp schemas: its bytes come as they
    # are (built once per catalog version, off the loop), spliced in as the last key, and
    # the head names where it starts so a reader parses it only when it needs it (split_document).
    at = len(head) - 1
    head = head.replace(b'"viewAt":"0000000000"', f'"viewAt":"{at:010d}"'.encode(), 1)
    return [head[:-1], _VIEW_KEY, *run.view.state_parts(), b"}"]


def decode_run(record: RunRecord, restore_view: ViewRestorer) -> Run:
    """Rebuilds a suspended run from its record.

    Settlement times are rebased onto this process's monotonic clock, keeping
    their completion order; ``expiresAt`` comes from the record (the store's clock).

    Raises:
        RunDecodeError: The document is malformed or of a newer format.
    """
    try:
        doc, stored_view = split_document(record.body)
        if doc.get("format") != FORMAT:
            raise RunDecodeError(f"run document format {doc.get('format')!r} is not {FORMAT}")
        if stored_view is None:
            raise KeyError("view")
        scope = (doc["sessionId"], doc["agentRunId"])
        view = restore_view(stored_view, scope)
        run = Run(
            run_id=doc["runId"],
            session_id=scope[0],
            agent_run_id=scope[1],
            tool_call_id=doc["toolCallId"],
            turn_id=doc["turnId"],
            replay_id=doc["replayId"],
            limits=Limits(**doc["limits"]),
            restart_safe=bool(doc["restartSafe"]),
            view=view,
            budget=OutputBudget.from_state(doc["budget"]),
            created_at=float(doc["createdAt"]),
            expires_at=record.expires_at,
            bridge_counters={str(k): int(v) for k, v in doc["bridgeCounters"].items()},
            nested_calls=int(doc["nestedCalls"]),
            dispatch_started=bool(doc["dispatchStarted"]),
            non_replay_safe_dispatched=bool(doc["nonReplaySafeDispatched"]),
            counts={str(k): int(v) for k, v in doc["counts"].items()},
            legs=int(doc["legs"]),
            suspended=True,
            snapshot_bytes=int(doc["snapshotBytes"]),
            provenance={str(k): Provenance(v) for k, v in doc["provenance"].items()},
            refused_ranges=[(str(m), int(first), int(last), Provenance(prov)) for m, first, last, prov in doc["refusedRanges"]],
            seen_bridge_ids=set(doc["seenBridgeIds"]),
            holds_slot=record.holds_slot,
            engine_build_id=record.engine_build_id or doc["engineBuildId"],
        )
        base = time.monotonic()
        for item in doc["pending"]:
            run.pending[item["bridgeId"]] = _pending(item, view, base)
        span = doc.get("execSpan")
        if span is not None:
            run.exec_span_context = SpanContext(int(span["traceId"], 16), int(span["spanId"], 16), is_remote=True, trace_flags=TraceFlags(span["flags"]))
        return run
    except (KeyError, TypeError, ValueError, UnicodeDecodeError) as exc:
        if isinstance(exc, RunDecodeError):
            raise
        raise RunDecodeError(f"stored run {record.run_id} cannot be read: {exc.__class__.__name__}: {exc}") from exc


def _pending(item: dict[str, Any], view: CatalogPort, base: float) -> PendingRequest:
    call_doc = item["call"]
    call = None
    if call_doc is not None:
        entry = view.entry(call_doc["id"])
        if entry is None:
            raise RunDecodeError(f"pending request {item['bridgeId']} names {call_doc['id']!r}, which is not in the run's view")
        call = ResolvedCall(entry=entry, input=call_doc["input"], replay_safe=bool(call_doc["replaySafe"]), label=str(call_doc["label"]))
    result = item["result"]
    order = item["settledOrder"]
    return PendingRequest(
        bridge_id=item["bridgeId"],
        method=BridgeMethod(item["method"]),
        args=list(item["args"]),
        nested_call_id=item["nestedCallId"],
        call=call,
        replay_safe=bool(item["replaySafe"]),
        dispatched=bool(item["dispatched"]),
        result=Settlement(bool(result[0]), str(result[1]), str(result[2])) if result is not None else None,
        # Completion order survives; the values are this process's monotonic clock.
        settled_at=base - 1.0 + int(order) * 1e-6 if order is not None else 0.0,
        due_at=float(item["dueAt"]),
    )
