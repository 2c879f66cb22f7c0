r"""The host's layer of the run output budget (SPEC §9) and host-side JSON safety (§8.8).

Sizes are UTF-8 byte lengths of compact JSON (SPEC §0.3 item 2): no insignificant
white space, non-ASCII characters as UTF-8, lone surrogates as ``\uXXXX``, and
numbers written as ECMAScript's ``Number::toString`` writes them. A lone surrogate
counts 3 bytes wherever raw text is measured (an error text, a prefix), and is
never replaced by U+FFFD.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from cellblock.server.catalog import compact_json as _compact_json
from cellblock.server.limits import OUTPUT_MARKER_RESERVE_BYTES

GUIDANCE = "Output truncated; rerun with narrower arguments or return less data."
"""The ``guidance`` text of every truncation marker (SPEC §9 rule 5)."""

ERROR_TRUNCATED = "[error truncated]"
"""The suffix of a truncated error, or the whole error when nothing else fits (rule 7)."""


class NotSerializableError(ValueError):
    """A value cannot be written as compact JSON (for example, nesting too deep)."""


@dataclass(frozen=True)
class JsonText:
    """A JSON value the host has checked, as its compact JSON text (SPEC §0.3 item 2).

    Stands for the decoded value, so the loop never decodes or encodes it: a long argument
    or input of a pending request (the dispatch sends ``text`` as the ``ToolCall``'s
    ``input_json``, a parked run's document splices it in), a final value (the output budget
    measures ``text``, the result splices it in).

    Attributes:
        text: The compact JSON.
        is_object: True for an object, False for anything else (an array, a long string).
    """

    text: str
    is_object: bool


def compact_json(value: Any) -> str:
    r"""Writes a JSON value as compact JSON (SPEC §0.3 item 2).

    One implementation serves the whole service (``catalog._text.compact_json``);
    this wrapper turns its failures into :class:`NotSerializableError`.

    Args:
        value: A JSON value made of dicts (string keys, insertion order), lists, strings,
            ints, floats, booleans and ``None``. Non-finite floats are written as
            ``null``.

    Returns:
        The compact JSON text. Lone surrogates appear as lower-case ``\uXXXX``.

    Raises:
        NotSerializableError: ``value`` holds a non-JSON type or is nested too deeply.
    """
    try:
        return _compact_json(value)
    except RecursionError:
        raise NotSerializableError("nesting is too deep for the serialiser") from None
    except TypeError as exc:
        raise NotSerializableError(str(exc)) from None


def utf8_size(text: str) -> int:
    """Returns the UTF-8 byte length of ``text`` (a lone surrogate counts 3 bytes)."""
    return len(text.encode("utf-8", "surrogatepass"))


def json_size(value: Any) -> int:
    """Returns the byte length of the compact JSON of ``value`` (SPEC §9 rule 1)."""
    return utf8_size(compact_json(value))


def is_output_entry(entry: object) -> bool:
    """True for an entry a cell may send: ``{type: "text", text}`` (a string) or ``{type: "json", value}`` (SPEC §10.5)."""
    if not isinstance(entry, dict):
        return False
    if entry.get("type") == "text":
        return entry.keys() == {"type", "text"} and isinstance(entry["text"], str)
    return entry.get("type") == "json" and entry.keys() == {"type", "value"}


def entry_size(entry: Mapping[str, Any]) -> int:
    """Returns the size of an output entry: the bytes of its compact JSON."""
    return json_size(entry)


def utf8_prefix(text: str, max_bytes: int) -> str:
    """Returns the longest prefix of ``text`` that is at most ``max_bytes`` UTF-8 bytes.

    The cut never splits a character, so no U+FFFD is ever produced.

    Args:
        text: Any string.
        max_bytes: Byte budget; values below 0 count as 0.
    """
    if max_bytes <= 0:
        return ""
    if text.isascii():
        return text[:max_bytes]
    data = text.encode("utf-8", "surrogatepass")
    if len(data) <= max_bytes:
        return text
    cut = max_bytes
    while cut > 0 and (data[cut] & 0xC0) == 0x80:  # a continuation byte: the character straddles the cut
        cut -= 1
    return data[:cut].decode("utf-8", "surrogatepass")  # C speed: a final value's text reaches 11 MB


def _utf8_cut_points(text: str) -> Sequence[int]:
    """Returns the cumulative UTF-8 byte length after each character of ``text``."""
    if text.isascii():
        return range(len(text) + 1)  # one byte a character: no walk over megabytes
    points = [0]
    used = 0
    for ch in text:
        code = ord(ch)
        used += 1 if code < 0x80 else 2 if code < 0x800 else 3 if code < 0x10000 else 4
        points.append(used)
    return points


def _longest_fitting_prefix(
    content: str, make: Callable[[str, int], dict[str, Any]], fits: Callable[[int], bool]
) -> tuple[dict[str, Any], bool]:
    """Binary-searches the longest prefix whose marker fits.

    ``make(prefix, prefix_bytes)`` builds a marker and ``fits(size)`` tells whether a
    marker of that size fits; marker size never shrinks as the prefix grows.
    Returns the marker and whether it fits (the empty-prefix marker is returned when
    nothing fits).
    """
    points = _utf8_cut_points(content)
    low, high = 0, len(content)
    if not fits(json_size(make("", 0))):
        return make("", 0), False

    def size(prefix: str, prefix_bytes: int) -> int:
        # The marker's other fields, then its prefix as one string: megabytes of prefix are
        # measured by the C string encoder alone, not searched for floats with the whole marker.
        return json_size({**make("", prefix_bytes), "prefix": ""}) + json_size(prefix) - 2

    while low < high:
        middle = (low + high + 1) // 2
        if fits(size(content[:middle], points[middle])):
            low = middle
        else:
            high = middle - 1
    return make(content[:low], points[low]), True


class OutputBudget:
    """One run's output budget, shared by all of its legs (SPEC §9 rules 3–8, 11).

    ``B`` is ``max_output_bytes``; ``R = floor(B / 4)`` is kept for the final value or
    error; entries may use ``C = B − R`` bytes, of which ``K = 256`` stay free for a
    truncation marker. The instance holds at most one omitted entry's content (cut to
    ``C`` bytes) besides counters, so it never holds more than ``B`` bytes of output.
    """

    def __init__(self, max_output_bytes: int) -> None:
        """Creates an empty budget.

        Args:
            max_output_bytes: ``B``, the run's ``maxOutputBytes`` in bytes (positive).

        Raises:
            ValueError: ``max_output_bytes`` is not positive.
        """
        if max_output_bytes <= 0:
            raise ValueError("max_output_bytes must be positive")
        self.max_output_bytes = max_output_bytes
        self.reserve = max_output_bytes // 4
        self.entry_capacity = max_output_bytes - self.reserve
        self.spent = 0
        self.closed = False
        self._leg_omitted_entries = 0
        self._leg_omitted_bytes = 0
        self._leg_first_content: str | None = None

    def to_state(self) -> dict[str, Any]:
        """The budget's state as JSON data, for the run store (SPEC §10.7 item 2)."""
        return {
            "maxOutputBytes": self.max_output_bytes,
            "spent": self.spent,
            "closed": self.closed,
            "legOmittedEntries": self._leg_omitted_entries,
            "legOmittedBytes": self._leg_omitted_bytes,
            "legFirstContent": self._leg_first_content,
        }

    @classmethod
    def from_state(cls, state: Mapping[str, Any]) -> OutputBudget:
        """Restores a :meth:`to_state` document."""
        budget = cls(int(state["maxOutputBytes"]))
        budget.spent = int(state["spent"])
        budget.closed = bool(state["closed"])
        budget._leg_omitted_entries = int(state["legOmittedEntries"])
        budget._leg_omitted_bytes = int(state["legOmittedBytes"])
        budget._leg_first_content = state["legFirstContent"]
        return budget

    def remaining_allowance(self) -> int:
        """Returns the entry allowance handed to the cell at a leg start.

        Returns:
            ``C − spent`` in bytes while the channel is open, else 0 (so the cell
            omits every entry). The cell keeps ``K`` of it free as the host does.
        """
        if self.closed:
            return 0
        return max(0, self.entry_capacity - self.spent)

    def offer(self, entry: Mapping[str, Any]) -> bool:
        """Offers one output entry as it is produced (rule 4).

        Args:
            entry: ``{"type": "text", "text": str}`` or ``{"type": "json", "value": v}``
                with a JSON-safe value.

        Returns:
            True when the entry is accepted whole (the caller forwards it); False when
            it is omitted, which closes the channel for the rest of the run.
        """
        size = entry_size(entry)
        if not self.closed and self.spent + size + OUTPUT_MARKER_RESERVE_BYTES <= self.entry_capacity:
            self.spent += size
            return True
        self.closed = True
        self._leg_omitted_entries += 1
        self._leg_omitted_bytes += size
        if self._leg_first_content is None:
            if entry.get("type") == "text":
                content = str(entry.get("text", ""))
            else:
                content = compact_json(entry.get("value"))
            self._leg_first_content = utf8_prefix(content, self.entry_capacity)
        return False

    def record_omitted(self, entries: int, size: int, first_content: str) -> None:
        """Records entries the cell's controller omitted itself (rule 11).

        The controller applies rule 4 first and sends only counts and the first
        omitted entry's content, so the host accounts for them here.

        Args:
            entries: Entries omitted in the cell in this leg.
            size: Their total compact-JSON size in bytes.
            first_content: The first omitted entry's content, already cut.
        """
        if entries <= 0:
            return
        self.closed = True
        if self._leg_first_content is None:
            self._leg_first_content = utf8_prefix(first_content, self.entry_capacity)
        self._leg_omitted_entries += entries
        self._leg_omitted_bytes += size

    def end_leg(self) -> list[dict[str, Any]]:
        """Closes the current leg and returns the markers to append to its ``output``.

        Returns:
            An empty list when the leg omitted nothing; otherwise one marker
            ``{type, truncated, omittedBytes, omittedEntries, guidance, prefix}``
            (rule 5), whose size is added to ``spent``.
        """
        if self._leg_omitted_entries == 0:
            return []
        omitted_entries = self._leg_omitted_entries
        omitted_bytes = self._leg_omitted_bytes
        content = self._leg_first_content or ""
        self._leg_omitted_entries = 0
        self._leg_omitted_bytes = 0
        self._leg_first_content = None

        def make(prefix: str, prefix_bytes: int) -> dict[str, Any]:
            return {
                "type": "truncated",
                "truncated": True,
                "omittedBytes": omitted_bytes - prefix_bytes,
                "omittedEntries": omitted_entries,
                "guidance": GUIDANCE,
                "prefix": prefix,
            }

        spent = self.spent
        marker, _ = _longest_fitting_prefix(
            content, make, lambda size: spent + size <= self.entry_capacity
        )
        self.spent += json_size(marker)
        return [marker]

    def final_allowance(self) -> int:
        """Returns ``max(0, B − spent)``: the bytes left for the final value or error."""
        return max(0, self.max_output_bytes - self.spent)

    def final_value(self, value: Any) -> Any:
        """Projects the final value into the remaining budget (rule 6).

        Args:
            value: The JSON-safe final value, or its compact JSON as a :class:`JsonText`
                (measured and returned as it is, never serialised again).

        Returns:
            ``value`` itself when its compact JSON fits the allowance, otherwise
            :func:`final_marker`'s marker.

        Raises:
            NotSerializableError: The value cannot be serialised (the caller fails the
                run with [R15]).
        """
        text = value.text if isinstance(value, JsonText) else compact_json(value)
        if self.fits(text):
            return value
        return final_marker(text, self.final_allowance())

    def final_text(self, text: str) -> dict[str, Any]:
        """The marker of a final value the host did not read: its compact JSON as the cell sent it, over the allowance (rule 6).

        The cell's ``JSON.stringify`` writes compact JSON (SPEC §0.3 item 2), so the marker
        is the one :meth:`final_value` would build. The leg's end reads every value that
        fits the allowance (``_final_value.completed_outcome``), and the allowance only
        shrinks after it; a text that fits here was never read, so it is refused.

        Raises:
            NotSerializableError: ``text`` fits the allowance.
        """
        if self.fits(text):
            raise NotSerializableError("the host did not read the value")
        return final_marker(text, self.final_allowance())

    def fits(self, text: str) -> bool:
        """True when compact JSON ``text`` fits the final allowance (:meth:`final_allowance`)."""
        return (len(text) if text.isascii() else utf8_size(text)) <= self.final_allowance()

    def final_error(self, error: str) -> str:
        """Projects a failed run's error text into the remaining budget (rule 7).

        Args:
            error: The full error text.

        Returns:
            ``error`` when it fits the allowance; else its longest UTF-8-safe prefix
            followed by `` [error truncated]`` within the allowance, or
            ``[error truncated]`` alone.
        """
        allowance = self.final_allowance()
        if utf8_size(error) <= allowance:
            return error
        suffix = " " + ERROR_TRUNCATED
        prefix = utf8_prefix(error, allowance - utf8_size(suffix))
        return prefix + suffix if prefix else ERROR_TRUNCATED


def final_marker(text: str, allowance: int) -> dict[str, Any]:
    """The marker of a final value whose compact JSON ``text`` is over ``allowance`` bytes (rule 6).

    ``{truncated, omittedBytes, guidance, prefix}`` with the longest UTF-8-safe prefix of
    ``text`` that keeps the marker within ``allowance``. Pure and module-level: a long text's
    marker is built in a worker process (``_large_json.final_marker_in_worker``).

    Args:
        text: The value's compact JSON.
        allowance: The bytes left for the final value (:meth:`OutputBudget.final_allowance`).
    """
    size = len(text) if text.isascii() else utf8_size(text)

    def make(prefix: str, prefix_bytes: int) -> dict[str, Any]:
        return {
            "truncated": True,
            "omittedBytes": size - prefix_bytes,
            "guidance": GUIDANCE,
            "prefix": prefix,
        }

    marker, _ = _longest_fitting_prefix(utf8_prefix(text, allowance), make, lambda marker_size: marker_size <= allowance)
    return marker


_OBJECT_TAG = "[object Object]"


def normalize_json(value: Any) -> Any:
    """Applies the host's JSON-safety rules to a value received from a cell (§8.8 rule 5).

    Args:
        value: A decoded JSON value, possibly holding non-JSON Python values.

    Returns:
        A JSON-safe copy: ``NaN`` and infinities become ``None``, ``-0.0`` becomes
        ``0``, tuples become lists, non-string keys become strings, and other
        non-JSON values become ``"[object Object]"``. Keys such as ``__proto__`` and
        ``constructor`` stay plain data in insertion order.

    Raises:
        NotSerializableError: The value is nested too deeply.
    """
    try:
        return _normalize(value)
    except RecursionError:
        raise NotSerializableError("nesting is too deep for the serialiser") from None


def _normalize(value: Any) -> Any:
    if value is None or isinstance(value, (bool, str)):
        return value
    if isinstance(value, int):
        return int(value)
    if isinstance(value, float):
        if not math.isfinite(value):
            return None
        if value == 0:
            return 0
        return value
    if isinstance(value, Mapping):
        return {str(key): _normalize(item) for key, item in value.items()}
    if isinstance(value, (list, tuple)):
        return [_normalize(item) for item in value]
    return _OBJECT_TAG
