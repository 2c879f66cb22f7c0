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


def configure_logging(level: int = logging.INFO) -> None:
    """Configures structlog and routes stdlib logging (grpc, docker) through it."""
    shared: list[structlog.types.Processor] = [
        structlog.contextvars.merge_contextvars,
        add_trace_ids,
        structlog.processors.add_log_level,
        structlog.processors.TimeStamper(fmt="iso", utc=True),
    ]
    renderer: structlog.types.Processor
    if sys.stderr.isatty():
        renderer = structlog.dev.ConsoleRenderer()
    else:
        renderer = structlog.processors.JSONRenderer()
    structlog.configure(
        processors=[*shared, structlog.processors.dict_tracebacks, structlog.stdlib.ProcessorFormatter.wrap_for_formatter],
        logger_factory=structlog.stdlib.LoggerFactory(),
        wrapper_class=structlog.make_filtering_bound_logger(level),
        cache_logger_on_first_use=True,
    )
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(structlog.stdlib.ProcessorFormatter(foreign_pre_chain=shared, processors=[structlog.stdlib.ProcessorFormatter.remove_processors_meta, renderer]))
    # Libraries that set their own logger levels (bm25s logs at DEBUG) still
    # pass through this handler's level.
    handler.setLevel(level)
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(level)
