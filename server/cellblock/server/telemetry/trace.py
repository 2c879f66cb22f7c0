"""``cellblock-trace``: prints a run's span tree from a JSON-lines span file.

Usage::

    python -m cellblock.server.telemetry.trace --file spans.jsonl RUN_ID
    python -m cellblock.server.telemetry.trace --file spans.jsonl TRACE_ID

The file is what ``CELLBLOCK_TRACES=jsonfile:<path>`` writes
(:mod:`._jsonfile`). The run's spans (its Exec and Wait RPCs, cells,
snapshots, nested calls) are printed as a tree per trace, children in
start order, with durations and the key attributes, so a person can read what
a program did without a tracing backend. A trace id (32 hex digits, the
``trace_id`` of every result) prints that whole trace instead: a completed
one-leg result carries no run id. Exit status 1 when nothing matches.
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any, TextIO

from cellblock.server.telemetry import _attributes as attr

#: Attributes shown after a span's name, as ``label=value``, in this order.
_SHOWN = [
    ("run", attr.RUN_ID),
    ("leg", attr.LEG),
    ("cell", attr.CELL_ID),
    ("container", attr.CONTAINER_ID),
    ("image", attr.CONTAINER_IMAGE_NAME),
    ("tool", attr.TOOL_ID),
    ("source", attr.TOOL_SOURCE),
    ("call", attr.NESTED_CALL_ID),
    ("status", attr.TOOL_CALL_STATUS),
    ("status", attr.RUN_STATUS),
    ("code", attr.ERROR_TYPE),
    ("grpc", "rpc.grpc.status_code"),
    ("catalog", attr.CATALOG_SIZE),
    ("bytes", attr.SNAPSHOT_BYTES),
    ("raw", attr.SNAPSHOT_RAW_BYTES),
    ("resume_ms", attr.RESUME_MS),
]


def read_spans(lines: Iterable[str]) -> list[dict[str, Any]]:
    """Parses JSON-lines span records; blank and malformed lines are skipped."""
    spans = []
    for line in lines:
        line = line.strip()
        if not line:
            continue
        try:
            record = json.loads(line)
        except ValueError:
            continue
        if isinstance(record, dict) and "span_id" in record:
            spans.append(record)
    return spans


def run_spans(spans: Sequence[dict[str, Any]], run_id: str) -> list[dict[str, Any]]:
    """The run's spans, in start order.

    Those carrying ``cellblock.run.id == run_id``, their ancestors and their
    descendants in the file; other RPCs of the same trace are left out.
    """
    by_id = {s["span_id"]: s for s in spans}
    kids: dict[str, list[str]] = {}
    for s in spans:
        if s.get("parent_span_id"):
            kids.setdefault(s["parent_span_id"], []).append(s["span_id"])
    chosen = {s["span_id"] for s in spans if s.get("attributes", {}).get(attr.RUN_ID) == run_id}
    todo = list(chosen)
    while todo:
        span_id = todo.pop()
        for kid in kids.get(span_id, []):
            if kid not in chosen:
                chosen.add(kid)
                todo.append(kid)
    for span_id in list(chosen):
        parent = by_id[span_id].get("parent_span_id")
        while parent in by_id and parent not in chosen:
            chosen.add(parent)
            parent = by_id[parent].get("parent_span_id")
    return sorted((by_id[i] for i in chosen), key=lambda s: (s.get("start_ns") or 0))


def trace_spans(spans: Sequence[dict[str, Any]], trace_id: str) -> list[dict[str, Any]]:
    """The spans of one trace, in start order."""
    return sorted((s for s in spans if s["trace_id"] == trace_id.lower()), key=lambda s: (s.get("start_ns") or 0))


def _label(span: dict[str, Any]) -> str:
    attributes = span.get("attributes", {})
    duration_ms = ((span.get("end_ns") or 0) - (span.get("start_ns") or 0)) / 1e6
    shown = [f"{label}={attributes[key]}" for label, key in _SHOWN if key in attributes and attributes[key] not in ("", None)]
    if span.get("status") == "ERROR":
        shown.append("ERROR")
    links = [f"link={link['span_id']}" for link in span.get("links", [])]
    return f"{span['name']}  {duration_ms:.1f} ms  " + " ".join(shown + links)


def render(spans: Sequence[dict[str, Any]], out: TextIO) -> None:
    """Writes the span forest: one line per span, indented under its parent."""
    by_id = {s["span_id"]: s for s in spans}
    children: dict[str | None, list[dict[str, Any]]] = {}
    for s in spans:
        parent = s.get("parent_span_id")
        children.setdefault(parent if parent in by_id else None, []).append(s)
    roots = children.get(None, [])

    def walk(span: dict[str, Any], prefix: str, last: bool, top: bool) -> None:
        branch = "" if top else ("└─ " if last else "├─ ")
        caller = f"  (caller span {span['parent_span_id']})" if top and span.get("parent_span_id") else ""
        out.write(f"{prefix}{branch}{_label(span)}{caller}\n")
        kids = children.get(span["span_id"], [])
        inner = prefix if top else prefix + ("   " if last else "│  ")
        for i, kid in enumerate(kids):
            walk(kid, inner, i == len(kids) - 1, False)

    trace_ids: list[str] = []
    for root in roots:
        if root["trace_id"] not in trace_ids:
            trace_ids.append(root["trace_id"])
    for trace_id in trace_ids:
        out.write(f"trace {trace_id}\n")
        for root in roots:
            if root["trace_id"] == trace_id:
                walk(root, "", True, True)


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of ``cellblock-trace``; returns the exit status."""
    parser = argparse.ArgumentParser(prog="cellblock-trace", description="Print a run's span tree from a cellblock JSON-lines span file.")
    parser.add_argument("run_id", metavar="RUN_ID", help="a run id (run_ plus 32 hex digits) or a trace id (32 hex digits)")
    parser.add_argument("--file", "-f", required=True, type=Path, help="the file CELLBLOCK_TRACES=jsonfile:<path> writes")
    args = parser.parse_args(argv)
    with args.file.open(encoding="utf-8") as f:
        records = read_spans(f)
    if re.fullmatch(r"[0-9a-fA-F]{32}", args.run_id):
        spans = trace_spans(records, args.run_id)
    else:
        spans = run_spans(records, args.run_id)
    if not spans:
        print(f"no spans of {args.run_id} in {args.file}", file=sys.stderr)
        return 1
    render(spans, sys.stdout)
    return 0


if __name__ == "__main__":
    sys.exit(main())
