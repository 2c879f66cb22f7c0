"""Catalog steps that run in a worker process (SPEC §3.2 item 3, §8.5, §8.6).

Their cost grows with a tenant's schemas (checking a 1.7 MB ``host`` schema against its
metaschema takes about 17 s; rendering declarations for megabytes of ``mcp`` schemas
takes seconds), so the service runs them in :mod:`cellblock.server.workers`, never on
its event loop. Functions here are module-level and take and return picklable values.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from ._catalog import Catalog
from ._entries import CatalogEntry
from ._errors import CatalogRegistrationError
from ._namespace import McpNamespace, build_namespace
from ._text import compact_json

__all__ = ["GuestData", "SchemaTexts", "guest_data", "registration_problem"]

SchemaTexts = dict[str, tuple[str, str]]
"""Per catalog id, the compact JSON of an entry's ``parameters`` and ``outputSchema`` (``""`` when absent)."""


def registration_problem(
    tools: object, mode: object, direct_tool_names: object, allow: object, deny: object
) -> tuple[tuple[int | None, str, str | None] | None, SchemaTexts]:
    """Registers the tools in a throwaway catalog, schema checks included.

    Returns:
        ``(None, texts)`` when the registration is valid, else ``((tool index or None,
        problem, tool label), {})`` of the :class:`CatalogRegistrationError` it raises.
        ``texts`` holds the compact JSON of every entry's schemas, which the service
        answers with (``PutCatalog``, ``GetCatalog``); writing megabytes of it on the event
        loop held it for tens of ms per MB (SPEC §3.1 item 6).
    """
    try:
        view = Catalog().register(tools, mode=mode, direct_tool_names=direct_tool_names, allow=allow, deny=deny)
    except CatalogRegistrationError as error:
        return (error.index, error.problem, error.tool), {}
    texts = {
        e.id: (compact_json(e.parameters) if e.parameters is not None else "", compact_json(e.output_schema) if e.output_schema is not None else "")
        for e in view.entries
    }
    return None, texts


GuestData = tuple[McpNamespace, str]
"""A view's ``MCP`` namespace and the compact JSON of the guest catalog (SPEC §8.1)."""


def guest_data(mcp_entries: Sequence[CatalogEntry], all_tools: list[dict[str, Any]], convenience: dict[str, str]) -> GuestData:
    """Builds the namespace and the guest catalog JSON the cells of one catalog view install.

    Args:
        mcp_entries: The view's ``mcp`` entries (they carry no validators).
        all_tools: ``ALL_TOOLS`` of the view.
        convenience: The view's convenience names.
    """
    ns = build_namespace(mcp_entries)
    data = {"allTools": all_tools, "convenience": convenience, "mcp": ns.guest_data(), "apiFiles": ns.api_files()}
    return ns, compact_json(data)
