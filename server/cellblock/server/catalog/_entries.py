"""Catalog entries and their guest-facing forms (SPEC §7.1, §7.2)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Literal, TypeAlias

from ._text import compact_json, deep_copy

if TYPE_CHECKING:
    from jsonschema.protocols import Validator

__all__ = ["MCP_OPERATIONS", "SOURCES", "CatalogEntry", "McpOperation", "Source"]

Source: TypeAlias = Literal["host", "mcp", "client"]
McpOperation: TypeAlias = Literal["tool", "resources.list", "resources.read", "prompts.list", "prompts.get"]

SOURCES: tuple[Source, ...] = ("host", "mcp", "client")
"""Every tool source, in the order telemetry lists them."""

MCP_OPERATIONS: tuple[McpOperation, ...] = (
    "tool",
    "resources.list",
    "resources.read",
    "prompts.list",
    "prompts.get",
)
"""Every ``operation`` an ``mcp`` tool may have; ``tool`` is the default."""


@dataclass(frozen=True, eq=False)
class CatalogEntry:
    """One catalog entry (SPEC §7.1 item 2). Immutable; schemas are private copies.

    Build entries through :class:`~cellblock.server.catalog.Catalog` registration, which
    validates them and computes hints and validators.
    """

    id: str
    """Catalog id ``<source>:<owner>:<name>``, for example ``host:core:read``."""
    source: Source
    """``host`` (trusted), ``mcp`` or ``client`` (untrusted)."""
    owner: str
    """Owner: ``core`` by default for ``host``, ``client`` for ``client``, the server for ``mcp``."""
    name: str
    """The tool's name (for ``mcp``, the MCP tool's own name)."""
    label: str | None
    """Registered label, or ``None`` when none was registered."""
    description: str
    """Registered description (``""`` when absent)."""
    parameters: Any
    """Registered input schema as JSON data, or ``None`` when absent."""
    output_schema: Any = None
    """Registered output schema; ``host`` entries only, else ``None``."""
    replay_safe: bool = False
    """``replaySafe`` of a ``host`` entry (SPEC §10.8); always ``False`` for other sources."""
    side_effecting: bool = False
    """``sideEffecting`` of a ``host`` entry; always ``False`` for other sources."""
    operation: McpOperation | None = None
    """The MCP operation of an ``mcp`` entry, else ``None``."""
    input_hint: str = "unknown"
    """Input hint (SPEC §7.4) of a ``host`` entry; ``"unknown"`` for other sources."""
    output_hint: str | None = None
    """Complete output hint of a ``host`` entry, else ``None``."""
    input_validator: Validator | None = field(default=None, repr=False)
    """Compiled ``parameters`` of a ``host`` entry that has them."""
    output_validator: Validator | None = field(default=None, repr=False)
    """Compiled ``outputSchema`` of a ``host`` entry that has one."""

    def compact(self) -> dict[str, Any]:
        """Returns the compact entry of SPEC §7.2, keys in the order of the contract.

        Returns:
            ``{id, source, sourceName, name, label?, description, input, output?}``, a fresh dict.
        """
        compact: dict[str, Any] = {
            "id": self.id,
            "source": self.source,
            "sourceName": self.owner,
            "name": self.name,
        }
        if self.label is not None:
            compact["label"] = self.label
        compact["description"] = self.description
        compact["input"] = self.input_hint if self.source == "host" else "unknown"
        if self.source == "host" and self.output_hint is not None:
            compact["output"] = self.output_hint
        return compact

    def describe(self) -> dict[str, Any]:
        """Returns the ``tools.describe`` form (SPEC §7.2 item 4).

        Returns:
            The compact entry plus ``parameters`` (``{}`` when none was registered) and, for
            ``host`` entries that have one, ``outputSchema``. Schemas are deep copies.
        """
        described = self.compact()
        described["parameters"] = {} if self.parameters is None else deep_copy(self.parameters)
        if self.source == "host" and self.output_schema is not None:
            described["outputSchema"] = deep_copy(self.output_schema)
        return described

    def describe_json(self, schema_texts: tuple[str, str] | None = None) -> str:
        """Returns the compact JSON of :meth:`describe`.

        Args:
            schema_texts: The compact JSON of this entry's ``parameters`` and ``outputSchema``
                (``""`` when absent), written in a worker process at registration
                (``registration_problem``); the answer is then put together from them without
                serializing megabytes of schema again on the event loop (SPEC §2.3 "loop
                hold"). ``None`` serializes :meth:`describe`.
        """
        if schema_texts is None:
            return compact_json(self.describe())
        parts = [compact_json(self.compact())[:-1], ',"parameters":', schema_texts[0] or "{}"]
        if self.source == "host" and self.output_schema is not None:
            parts += [',"outputSchema":', schema_texts[1]]
        parts.append("}")
        return "".join(parts)
