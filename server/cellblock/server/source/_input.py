"""Validation of the model's ``exec`` and ``wait`` arguments (SPEC §5.1, §5.2 items 1–2).

Both validators take the raw JSON text of the tool-call arguments and never raise
for bad input: they return either the validated value or an :class:`InputFailure`
carrying the exact [E..]/[W..] message. No cell starts and nothing is dispatched.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Literal

from cellblock.server import messages as m
from cellblock.server.catalog import js_trim, strict_json
from cellblock.server.config import LANGUAGES, Language
from cellblock.server.limits import MAX_SCOPE_ID_CHARS


@dataclass(frozen=True)
class InputFailure:
    """A refusal in the ``input`` phase.

    The caller turns it into a ``failed`` result with ``failurePhase: "input"``,
    ``bridgeDispatchStarted: false`` and empty output.
    """

    message: str
    """The exact model-facing message (one of §14.1 or §14.2)."""

    code: Literal["invalid_input"] = "invalid_input"
    """The error code; always ``"invalid_input"``."""


@dataclass(frozen=True)
class ValidatedExec:
    """The accepted arguments of one ``exec`` call."""

    source: str
    """The program text exactly as given (``command`` when it counts, else ``code``)."""

    language: Language
    """The cell language after defaulting."""

    restart_safe: bool
    """Effective restartSafe: the runtime's force flag or the model's ``restartSafe: true``."""


class NestedTooDeeply(ValueError):  # noqa: N818 - a condition of the input
    """Arguments nested deeper than the JSON parser reads ([E10], [W07])."""


def parse_json_object(arguments_json: str) -> dict[str, Any] | None:
    """Parses strict JSON text and returns it when it is an object.

    Args:
        arguments_json: The raw arguments text of a tool call.

    Returns:
        The object as a dict (the last of duplicate keys wins), or ``None`` when the
        text is not valid JSON (``NaN``/``Infinity`` literals included) or not an
        object.

    Raises:
        NestedTooDeeply: The text is nested deeper than the parser's recursion limit.
    """
    try:
        value = strict_json(arguments_json)
    except RecursionError:
        raise NestedTooDeeply from None
    except (ValueError, TypeError):
        return None
    return value if isinstance(value, dict) else None


def _arguments(arguments_json: str, not_an_object: str, too_deep: str) -> dict[str, Any] | InputFailure:
    """The arguments object, or the failure with ``not_an_object`` / ``too_deep`` ([E01]/[E10], [W01]/[W07])."""
    try:
        arguments = parse_json_object(arguments_json)
    except NestedTooDeeply:
        return InputFailure(too_deep)
    return InputFailure(not_an_object) if arguments is None else arguments


def _counts(value: Any) -> bool:
    return isinstance(value, str) and js_trim(value) != ""


def _source_failure(source: str, max_source_bytes: int) -> InputFailure | None:
    """[E09] for a source over ``max_source_bytes`` UTF-8 bytes, [E11] for one with a lone surrogate, else ``None``."""
    source_bytes = len(source.encode("utf-8", "surrogatepass"))
    if source_bytes > max_source_bytes:
        return InputFailure(m.e09(source_bytes, max_source_bytes))
    if m.has_lone_surrogate(source):
        return InputFailure(m.E11)  # the cell reads UTF-8 only (SPEC §0.3 item 7)
    return None


def validate_exec(
    arguments_json: str,
    *,
    enabled: bool | str,
    languages: Sequence[str],
    force_restart_safe: bool,
    max_source_bytes: int,
) -> ValidatedExec | InputFailure:
    """Validates ``exec`` arguments in the order of SPEC §5.1.

    Args:
        arguments_json: The raw JSON text of the model's arguments.
        enabled: The configured ``enabled`` value: ``True``, ``False`` or ``"auto"``.
        languages: The configured non-empty list of enabled languages, in
            configuration order.
        force_restart_safe: ``forceRestartSafe`` from the runtime's start message.
        max_source_bytes: The program size bound of the run (SPEC §2.3), in UTF-8 bytes.

    Returns:
        The validated source, language and effective restartSafe, or the first
        failure ([E08], [E01]–[E07], [E09], [E11]: a source with a lone UTF-16 surrogate).
    """
    if enabled is False:
        return InputFailure(m.E08)
    arguments = _arguments(arguments_json, m.E01, m.E10)
    if isinstance(arguments, InputFailure):
        return arguments
    code = arguments.get("code")
    command = arguments.get("command")
    code_counts = _counts(code)
    command_counts = _counts(command)
    if code_counts and command_counts and code != command:
        return InputFailure(m.E02)
    if command_counts:
        source = command
    elif code_counts:
        source = code
    else:
        return InputFailure(m.E03)
    refused = _source_failure(str(source), max_source_bytes)
    if refused is not None:
        return refused
    language = arguments.get("language")
    if language is None:
        language = "javascript" if "javascript" in languages else languages[0]
    elif not isinstance(language, str) or language not in LANGUAGES:
        return InputFailure(m.E04)
    if language not in languages:
        return InputFailure(m.e05(language))
    if "typecheck" in arguments:
        return InputFailure(m.E06)
    restart_safe = arguments.get("restartSafe")
    if restart_safe is not None and not isinstance(restart_safe, bool):
        return InputFailure(m.E07)
    return ValidatedExec(
        source=str(source),
        language=language,  # type: ignore[arg-type]
        restart_safe=bool(force_restart_safe) or restart_safe is True,
    )


def validate_wait(arguments_json: str) -> str | InputFailure:
    """Extracts the run id of ``wait`` arguments (SPEC §5.2 items 1–2).

    Args:
        arguments_json: The raw JSON text of the model's arguments.

    Returns:
        The trimmed run id (``runId`` when it is a non-blank string, else ``run_id``),
        or a failure with [W01] (not a JSON object), [W02] (no usable run id) or [W08]
        (a run id longer than :data:`~cellblock.server.limits.MAX_SCOPE_ID_CHARS`: no run
        has one, and it never reaches the store or a log line) or [W09] (a run id with a lone
        UTF-16 surrogate: no run has one, and the store cannot take it).
    """
    arguments = _arguments(arguments_json, m.W01, m.W07)
    if isinstance(arguments, InputFailure):
        return arguments
    for key in ("runId", "run_id"):
        value = arguments.get(key)
        if _counts(value):
            run_id = js_trim(str(value))
            if len(run_id) > MAX_SCOPE_ID_CHARS:
                return InputFailure(m.W08)
            return InputFailure(m.W09) if m.has_lone_surrogate(run_id) else run_id
    return InputFailure(m.W02)
