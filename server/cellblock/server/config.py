"""Code-mode configuration (SPEC §2).

The service reads one ``codeMode`` section. :meth:`CodeModeConfig.from_json` applies
the shape rules of SPEC §2.1 to that section's JSON value, :meth:`CodeModeConfig.with_overrides`
applies the runtime's per-exec limit overrides, and :class:`Limits` carries the limits a run keeps
for all of its legs. The fixed constants of SPEC §2.3 are in :mod:`cellblock.server.limits`.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any, ClassVar, Literal, TypeAlias

from cellblock.server.limits import bridge_message_bytes, max_source_bytes, min_resume_budget_ms, reply_inbox_bytes, value_reserve_bytes

__all__ = [
    "DEFAULT_MODEL_TIERS",
    "LANGUAGES",
    "CodeModeConfig",
    "Enabled",
    "Language",
    "Limits",
    "ModelTier",
]

# --- Types and tables ------------------------------------------------------------------------

Language: TypeAlias = Literal["javascript", "typescript"]
Enabled: TypeAlias = bool | Literal["auto"]
ModelTier: TypeAlias = Literal["preferred", "capable"]

LANGUAGES: tuple[Language, ...] = ("javascript", "typescript")
"""Every supported language, in canonical order."""

_PREFERRED_MODELS: dict[str, tuple[str, ...]] = {
    "anthropic": (
        "claude-fable-5",
        "claude-opus-5",
        "claude-sonnet-5",
        "claude-mythos-5",
        "claude-opus-4-8",
        "claude-haiku-4-5",
    ),
    "deepseek": ("deepseek-v4-pro", "deepseek-v4-flash"),
    "google": (
        "gemini-3-flash-preview",
        "gemini-3.1-pro-preview",
        "gemini-3.1-flash-lite",
        "gemini-3.5-flash",
        "gemini-3.5-flash-lite",
        "gemini-3.6-flash",
    ),
    "kimi": ("k3", "k3-256k"),
    "minimax": ("MiniMax-M3",),
    "moonshot": ("kimi-k3",),
    "openai": ("gpt-5.6", "gpt-5.6-sol", "gpt-5.6-terra", "gpt-5.6-luna", "gpt-5.5", "gpt-5.5-pro"),
    "xiaomi": ("mimo-v2.5",),
    "zai": ("glm-5.2", "glm-5.1"),
}

DEFAULT_MODEL_TIERS: tuple[tuple[str, ModelTier], ...] = tuple(
    (f"{provider}/{model}", "preferred")
    for provider, models in _PREFERRED_MODELS.items()
    for model in models
)
"""The default tier table of SPEC §2.4 item 3, as ``(model id, tier)`` pairs."""

_TIERS: frozenset[str] = frozenset({"preferred", "capable"})


@dataclass(frozen=True)
class _Range:
    """A numeric field's default and inclusive clamp range."""

    key: str
    default: int
    low: int
    high: int


_NUMERIC: dict[str, _Range] = {
    "timeout_ms": _Range("timeoutMs", 10_000, 100, 60_000),
    "memory_limit_bytes": _Range("memoryLimitBytes", 67_108_864, 1_048_576, 1_073_741_824),
    "max_output_bytes": _Range("maxOutputBytes", 65_536, 1024, 10_485_760),
    "max_snapshot_bytes": _Range("maxSnapshotBytes", 10_485_760, 1024, 268_435_456),
    "max_pending_tool_calls": _Range("maxPendingToolCalls", 16, 1, 128),
    "snapshot_ttl_seconds": _Range("snapshotTtlSeconds", 900, 1, 86_400),
    "max_search_limit": _Range("maxSearchLimit", 50, 1, 50),
    "search_default_limit": _Range("searchDefaultLimit", 8, 1, 50),
}

_OVERRIDABLE: tuple[str, ...] = (
    "timeout_ms",
    "memory_limit_bytes",
    "max_output_bytes",
    "max_snapshot_bytes",
    "max_pending_tool_calls",
    "snapshot_ttl_seconds",
)


def _positive_integral(value: object) -> int | None:
    """Returns ``value`` as an int when it is a JSON number with a positive integral value."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    if isinstance(value, float) and (not math.isfinite(value) or not value.is_integer()):
        return None
    number = int(value)
    return number if number > 0 else None


def _clamp(value: int, low: int, high: int) -> int:
    return max(low, min(high, value))


def _numeric(obj: Mapping[str, Any], attr: str, fallback: int, high: int | None = None) -> int:
    """Reads one numeric field per SPEC §2.1 item 3, falling back to ``fallback``."""
    spec = _NUMERIC[attr]
    value = _positive_integral(obj.get(spec.key))
    if value is None:
        value = fallback
    return _clamp(value, spec.low, spec.high if high is None else high)


def _languages(value: object) -> tuple[Language, ...] | None:
    """Validates a ``languages`` value per SPEC §2.1 item 4; ``None`` means the default."""
    if not isinstance(value, list) or not value:
        return None
    kept: list[Language] = []
    for member in value:
        if member == "javascript" or member == "typescript":
            if member not in kept:
                kept.append(member)
        else:
            return None
    return tuple(kept)


def _model_tiers(value: object) -> tuple[tuple[str, ModelTier], ...] | None:
    """Validates a ``modelTiers`` map; ``None`` means the default table."""
    if not isinstance(value, Mapping):
        return None
    pairs: list[tuple[str, ModelTier]] = []
    for key, tier in value.items():
        if isinstance(key, str) and (tier == "preferred" or tier == "capable"):
            pairs.append((key, tier))
    return tuple(pairs)


def _last_segment(model_id: str) -> str:
    return model_id.rsplit("/", 1)[-1]


@dataclass(frozen=True)
class Limits:
    """The resource limits a run keeps for all of its legs (SPEC §2.1 item 6)."""

    timeout_ms: int = 10_000
    """Wall time of one leg (one exec or wait call), in milliseconds."""
    memory_limit_bytes: int = 67_108_864
    """Cell memory limit, in bytes."""
    max_output_bytes: int = 65_536
    """Output budget shared by all legs of the run, in bytes."""
    max_snapshot_bytes: int = 10_485_760
    """Largest snapshot of a suspended run, in bytes."""
    max_pending_tool_calls: int = 16
    """Most bridge requests of host work outstanding at once."""
    snapshot_ttl_seconds: int = 900
    """Time a suspended run is kept, in seconds."""

    default: ClassVar[Limits]

    @property
    def min_resume_budget_ms(self) -> int:
        """The minimum resume budget of a leg, in milliseconds (SPEC §2.3)."""
        return min_resume_budget_ms(self.timeout_ms)

    @property
    def value_reserve_bytes(self) -> int:
        """Bytes of the output budget reserved for the value or error (SPEC §2.3)."""
        return value_reserve_bytes(self.max_output_bytes)

    @property
    def max_source_bytes(self) -> int:
        """The program size bound, in UTF-8 bytes (SPEC §2.3)."""
        return max_source_bytes(self.memory_limit_bytes)

    @property
    def reply_inbox_bytes(self) -> int:
        """The largest bridge payload in either direction, in bytes (SPEC §2.3)."""
        return reply_inbox_bytes(self.memory_limit_bytes, self.max_snapshot_bytes)

    @property
    def bridge_message_bytes(self) -> int:
        """The largest bridge message the run's cell transport reads, in bytes (SPEC §2.3)."""
        return bridge_message_bytes(self.max_output_bytes, self.memory_limit_bytes, self.max_snapshot_bytes)


Limits.default = Limits()


def pooled_bridge_message_bytes(memory_limit_bytes: int) -> int:
    """The bridge message bound of a warm cell, whose run (and its limits) is not known yet.

    The largest any run of that memory limit may need: the highest output budget and
    snapshot limit a run may ask for (SPEC §2.3).
    """
    return bridge_message_bytes(_NUMERIC["max_output_bytes"].high, memory_limit_bytes, _NUMERIC["max_snapshot_bytes"].high)


MAX_BRIDGE_MESSAGE_BYTES = pooled_bridge_message_bytes(_NUMERIC["memory_limit_bytes"].high)
"""The largest bridge message any run may need (the bound of a bridge opened without one)."""


@dataclass(frozen=True)
class CodeModeConfig:
    """The deployment's ``codeMode`` configuration (SPEC §2.2).

    Build it from JSON with :meth:`from_json`, which never fails: invalid values fall back
    to defaults and numbers are clamped. Direct construction validates strictly and raises
    ``ValueError`` for values outside the ranges of SPEC §2.2.
    """

    enabled: Enabled = "auto"
    """``True``, ``False`` or ``"auto"`` (engage only for preferred models)."""
    languages: tuple[Language, ...] = LANGUAGES
    """Enabled languages: a non-empty subset of ``("javascript", "typescript")``."""
    timeout_ms: int = 10_000
    """Wall time of one leg, in milliseconds (100 to 60000)."""
    memory_limit_bytes: int = 67_108_864
    """Cell memory limit, in bytes (1 MiB to 1 GiB)."""
    max_output_bytes: int = 65_536
    """Output budget of a run, in bytes (1024 to 10485760)."""
    max_snapshot_bytes: int = 10_485_760
    """Largest snapshot, in bytes (1024 to 268435456)."""
    max_pending_tool_calls: int = 16
    """Most outstanding bridge requests per run (1 to 128)."""
    snapshot_ttl_seconds: int = 900
    """Lifetime of a suspended run, in seconds (1 to 86400)."""
    max_search_limit: int = 50
    """Largest ``tools.search`` limit (1 to 50)."""
    search_default_limit: int = 8
    """``tools.search`` limit when none is given (1 to ``max_search_limit``)."""
    model_tiers: tuple[tuple[str, ModelTier], ...] = field(default=DEFAULT_MODEL_TIERS)
    """Tier table as ``(model id, tier)`` pairs; a mapping is accepted and converted."""

    def __post_init__(self) -> None:
        """Checks every field against its range and converts a ``model_tiers`` mapping to pairs.

        Raises:
            ValueError: A value outside the field's range.
        """
        if self.enabled not in (True, False, "auto") or not isinstance(self.enabled, (bool, str)):
            raise ValueError(f"enabled must be True, False or 'auto', not {self.enabled!r}")
        languages = _languages(list(self.languages))
        if languages is None or languages != tuple(self.languages):
            raise ValueError(f"languages must be a non-empty subset of {LANGUAGES}, without duplicates")
        for attr, spec in _NUMERIC.items():
            value = getattr(self, attr)
            high = self.max_search_limit if attr == "search_default_limit" else spec.high
            if isinstance(value, bool) or not isinstance(value, int) or not spec.low <= value <= high:
                raise ValueError(f"{attr} must be an integer in {spec.low}..{high}, not {value!r}")
        tiers: Iterable[Any]
        if isinstance(self.model_tiers, Mapping):
            tiers = self.model_tiers.items()
        else:
            tiers = self.model_tiers
        pairs = tuple((str(key), tier) for key, tier in tiers)
        for _, tier in pairs:
            if tier not in _TIERS:
                raise ValueError(f"model tier must be 'preferred' or 'capable', not {tier!r}")
        object.__setattr__(self, "model_tiers", pairs)

    @classmethod
    def from_json(cls, obj: object) -> CodeModeConfig:
        """Builds the configuration from the ``codeMode`` section's JSON value (SPEC §2.1).

        Args:
            obj: The parsed JSON value of the section. ``True``, ``False`` and ``"auto"`` are
                shorthand for ``{"enabled": obj}``; any other non-object value means ``{}``.

        Returns:
            The configuration; invalid fields take their defaults and numbers are clamped.
        """
        if obj is True or obj is False or obj == "auto":
            obj = {"enabled": obj}
        if not isinstance(obj, Mapping):
            obj = {}
        enabled_raw = obj.get("enabled", "auto")
        enabled: Enabled = enabled_raw if isinstance(enabled_raw, bool) else "auto"
        numbers = {attr: _numeric(obj, attr, spec.default) for attr, spec in _NUMERIC.items()}
        numbers["search_default_limit"] = _numeric(
            obj, "search_default_limit", _NUMERIC["search_default_limit"].default, numbers["max_search_limit"]
        )
        tiers = _model_tiers(obj.get("modelTiers"))
        return cls(
            enabled=enabled,
            languages=_languages(obj.get("languages")) or LANGUAGES,
            model_tiers=DEFAULT_MODEL_TIERS if tiers is None else tiers,
            **numbers,
        )

    def with_overrides(self, overrides: Mapping[str, Any] | None) -> CodeModeConfig:
        """Applies the runtime's per-exec limit overrides (SPEC §2.1 item 6).

        Args:
            overrides: JSON-style map with any of ``timeoutMs``, ``memoryLimitBytes``,
                ``maxOutputBytes``, ``maxSnapshotBytes``, ``maxPendingToolCalls`` and
                ``snapshotTtlSeconds``. Other keys are ignored. An invalid value (not a
                positive integral JSON number) keeps the configured value; valid values are
                clamped to the ranges of SPEC §2.2. ``None`` means no overrides.

        Returns:
            A configuration with the overridden limits.
        """
        if not overrides:
            return self
        changes: dict[str, Any] = {attr: _numeric(overrides, attr, getattr(self, attr)) for attr in _OVERRIDABLE}
        return dataclasses.replace(self, **changes)

    @property
    def limits(self) -> Limits:
        """The run limits of this configuration."""
        return Limits(**{attr: getattr(self, attr) for attr in _OVERRIDABLE})

    def limits_with_overrides(self, overrides: Mapping[str, Any] | None) -> Limits:
        """Returns the limits of one exec: :meth:`with_overrides` then :attr:`limits`.

        Args:
            overrides: The runtime's per-exec overrides, as for :meth:`with_overrides`.

        Returns:
            The limits the run keeps for all of its legs.
        """
        return self.with_overrides(overrides).limits

    @property
    def default_language(self) -> Language:
        """``"javascript"`` when enabled, else the only enabled language (SPEC §5.1 rule 6)."""
        return "javascript" if "javascript" in self.languages else self.languages[0]

    def model_tier(self, model_id: str) -> ModelTier:
        """Looks up a model's tier (SPEC §2.4 item 2).

        Both sides are lower-cased. An exact key match wins (a later duplicate key replaces an
        earlier one); otherwise any ``"preferred"`` key whose last ``/`` segment equals the
        requested id's last segment gives ``"preferred"``. Unlisted models are ``"capable"``.

        Args:
            model_id: The model id of the surface request, for example ``"openai/gpt-5.5"``.

        Returns:
            ``"preferred"`` or ``"capable"``.
        """
        wanted = model_id.lower()
        table: dict[str, ModelTier] = {}
        for key, tier in self.model_tiers:
            table[key.lower()] = tier
        if wanted in table:
            return table[wanted]
        segment = _last_segment(wanted)
        for key, tier in table.items():
            if tier == "preferred" and _last_segment(key) == segment:
                return "preferred"
        return "capable"

    def engaged(self, model_id: str | None, catalog_nonempty: bool) -> bool:
        """Tells whether code mode is engaged for a surface request (SPEC §2.4 item 1).

        Args:
            model_id: The request's model id; ``None`` or ``""`` means none was given.
            catalog_nonempty: Whether the scope's catalog has at least one entry.

        Returns:
            ``True`` when the catalog is non-empty and ``enabled`` is ``True``, or ``enabled``
            is ``"auto"`` and the model's tier is ``"preferred"``.
        """
        if not catalog_nonempty or self.enabled is False:
            return False
        if self.enabled is True:
            return True
        return bool(model_id) and self.model_tier(model_id or "") == "preferred"
