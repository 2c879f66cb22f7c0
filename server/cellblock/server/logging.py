"""structlog configuration: JSON lines (console on a TTY), stdlib routed through it.

Configured once, in the server entry point (docs/DESIGN.md §5; structlog's
logging-best-practices): ``merge_contextvars`` -> trace ids -> level -> ISO
UTC timestamp -> tracebacks as dicts -> renderer. Library code only calls
``structlog.get_logger``.

Identifiers (SPEC §13 item 5) reach records as structlog context variables,
bound per call: ``session_id``, ``agent_run_id``, ``tool_call_id`` and
``wait_tool_call_id`` by the RPC handlers, ``run_id`` by the runner,
``cell_id`` by the leg; ``bridge_id`` and ``nested_call_id`` are passed on the
records about one request; ``trace_id``/``span_id`` come from the current
OpenTelemetry span (:func:`add_trace_ids`). Records never carry source text,
tool inputs or outputs, secrets or environment values (SPEC §13 item 7).
"""

from __future__ import annotations

import logging
import sys

import structlog
from opentelemetry import trace

from cellblock.server.limits import REPEAT_BURST, REPEAT_SAMPLE

#: Frames kept of a guest error's stack (SPEC §13 item 6 "stack head").
STACK_HEAD_FRAMES = 3


def add_trace_ids(_logger: object, _method: str, event_dict: structlog.types.EventDict) -> structlog.types.EventDict:
    """Adds (as a structlog processor) ``trace_id`` (32 hex) and ``span_id`` (16 hex) of the current span, if any."""
    context = trace.get_current_span().get_span_context()
    if context.is_valid:
        event_dict.setdefault("trace_id", trace.format_trace_id(context.trace_id))
        event_dict.setdefault("span_id", trace.format_span_id(context.span_id))
    return event_dict


def error_head(text: str) -> dict[str, str]:
    """Splits a guest error text (SPEC §8.10) for the server log (SPEC §13 item 6).

    Args:
        text: ``<name>: <message>`` plus ``    at ...`` frames, or
            ``Uncaught <value>``, before projection and truncation.

    Returns:
        ``error_class``, ``error`` (the message, at most 200 characters) and
        ``stack_head`` (the first :data:`STACK_HEAD_FRAMES` frames, one per line).
    """
    first, _, rest = text.partition("\n")
    name, sep, message = first.partition(": ")
    if not sep or " " in name or name.startswith("Uncaught"):
        name, message = "Uncaught", first.removeprefix("Uncaught ")
    frames = [line.strip() for line in rest.splitlines() if line.strip().startswith("at ")]
    return {"error_class": name, "error": message[:200], "stack_head": "\n".join(frames[:STACK_HEAD_FRAMES])}


#: Runs whose counts are kept at once (the counts of a run end with its ``rpc.completed``).
_REPEAT_RUNS_MAX = 10_000
#: Records that end a leg and carry its suppressed count.
_LEG_END_EVENTS = frozenset({"rpc.completed", "rpc.cancelled"})


class RepeatLimiter:
    """structlog processor: rate-limits repeated warnings per leg, with a count.

    Records are keyed by ``(run_id, event)``; a record without a ``run_id`` passes. The
    first :data:`REPEAT_BURST` of a key pass, then one in :data:`REPEAT_SAMPLE` passes
    with ``repeated`` (how many records of that key so far); the leg's last line
    (``rpc.completed``) gets ``repeats_suppressed`` (the total dropped) and clears the run.
    """

    def __init__(self) -> None:
        """Starts with no counts."""
        self._counts: dict[str, dict[str, int]] = {}

    def __call__(self, _logger: object, method: str, event_dict: structlog.types.EventDict) -> structlog.types.EventDict:
        """Passes, samples (adding ``repeated``) or drops one record.

        Raises:
            structlog.DropEvent: The record is a repeat beyond the burst, between samples.
        """
        run_id = event_dict.get("run_id")
        if not isinstance(run_id, str) or not run_id:
            return event_dict
        event = str(event_dict.get("event", ""))
        if event in _LEG_END_EVENTS:
            counts = self._counts.pop(run_id, None)
            if counts:
                dropped = sum(max(0, n - REPEAT_BURST - (n - REPEAT_BURST) // REPEAT_SAMPLE) for n in counts.values())
                if dropped:
                    event_dict["repeats_suppressed"] = dropped
            return event_dict
        if method not in ("warning", "error", "warn"):
            return event_dict
        counts = self._counts.get(run_id)
        if counts is None:
            if len(self._counts) >= _REPEAT_RUNS_MAX:
                self._counts.clear()
            counts = self._counts[run_id] = {}
        n = counts.get(event, 0) + 1
        counts[event] = n
        if n <= REPEAT_BURST:
            return event_dict
        if (n - REPEAT_BURST) % REPEAT_SAMPLE == 0:
            event_dict["repeated"] = n
            return event_dict
        raise structlog.DropEvent


_DICT_TRACEBACKS = structlog.processors.ExceptionRenderer(structlog.tracebacks.ExceptionDictTransformer(show_locals=False))


def configure_logging(level: int = logging.INFO) -> None:
    """Configures structlog and routes stdlib logging (grpc, docker) through it."""
    shared: list[structlog.types.Processor] = [
        structlog.contextvars.merge_contextvars,
        RepeatLimiter(),
        add_trace_ids,
        structlog.processors.add_log_level,
        structlog.processors.TimeStamper(fmt="iso", utc=True),
    ]
    renderer: structlog.types.Processor
    if sys.stderr.isatty():
        renderer = structlog.dev.ConsoleRenderer(exception_formatter=structlog.dev.RichTracebackFormatter(show_locals=False))
    else:
        renderer = structlog.processors.JSONRenderer()
    structlog.configure(
        # Tracebacks without frame locals: a leg's locals hold guest output, tool inputs and source (SPEC §13 item 7).
        processors=[*shared, _DICT_TRACEBACKS, structlog.stdlib.ProcessorFormatter.wrap_for_formatter],
        logger_factory=structlog.stdlib.LoggerFactory(),
        wrapper_class=structlog.make_filtering_bound_logger(level),
        cache_logger_on_first_use=True,
    )
    handler = logging.StreamHandler(sys.stderr)
    # A library's own log record (grpc's "Exception not handled") gets the same bounded traceback (50 frames,
    # no locals): a RecursionError's full one was 2,000 lines, and writing it held the loop for 0.7 s.
    handler.setFormatter(
        structlog.stdlib.ProcessorFormatter(foreign_pre_chain=shared, processors=[structlog.stdlib.ProcessorFormatter.remove_processors_meta, _DICT_TRACEBACKS, renderer])
    )
    # Libraries that set their own logger levels (bm25s logs at DEBUG) still
    # pass through this handler's level.
    handler.setLevel(level)
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(level)
