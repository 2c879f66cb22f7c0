"""Catalog steps that run in a worker process (SPEC §3.2 item 3, §8.5, §8.6).

Their cost grows with a tenant's schemas (checking a 1.7 MB ``host`` schema against its
metaschema takes about 17 s; rendering declarations for megabytes of ``mcp`` schemas
takes seconds), so the service runs them in :mod:`cellblock.server.workers`, never on
its event loop. Functions here are module-level and take and return picklable values.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

from ..limits import MAX_SCHEMA_DEPTH
from ._catalog import Catalog
from ._entries import CatalogEntry
from ._errors import CatalogRegistrationError
from ._namespace import McpNamespace, build_namespace
from ._text import compact_json

__all__ = ["SCHEMA_FIELDS", "GuestData", "Problem", "SchemaTexts", "checked_registration", "decode_schemas", "guest_data", "registration_problem"]

SchemaTexts = dict[str, tuple[str, str]]
"""Per catalog id, the compact JSON of an entry's ``parameters`` and ``outputSchema`` (``""`` when absent)."""


Problem = tuple[int | None, str, str | None]
"""A refused registration as ``(tool index or None, problem, tool label)`` (:class:`CatalogRegistrationError`'s fields)."""

SCHEMA_FIELDS = (("parameters_json", "parameters"), ("output_schema_json", "outputSchema"))
"""The schema fields of a registered tool: its JSON text field and its registration key."""


def decode_schemas(tools: list[dict[str, Any]]) -> None:
    """Replaces each tool's schema texts (``parameters_json``, ``output_schema_json``) by their JSON data.

    ``PutCatalog`` carries schemas as JSON text; decoding megabytes of it took 15-60 ms of
    the shared event loop per request, so it is done here, in the worker (SPEC §3.1 item 6).
    An empty text means the field is absent.

    Raises:
        CatalogRegistrationError: A text is not JSON, or is nested past the parser.
    """
    for index, tool in enumerate(tools):
        for field, key in SCHEMA_FIELDS:
            text = tool.pop(field, "")
            if not text:
                continue
            try:
                tool[key] = json.loads(text)
            except ValueError:
                raise CatalogRegistrationError(index, f"{field} is not valid JSON") from None
            except RecursionError:
                raise CatalogRegistrationError(index, f"{field} is nested too deeply (at most {MAX_SCHEMA_DEPTH} levels)") from None


def registration_problem(
    tools: list[dict[str, Any]], mode: object, direct_tool_names: object, allow: object, deny: object
) -> tuple[Problem | None, SchemaTexts, list[dict[str, Any]]]:
    """Decodes the tools' schema texts and registers them in a throwaway catalog, schema checks included.

    Args:
        tools: Registration dicts whose schemas may still be JSON text (:func:`decode_schemas`).
        mode: The registration mode.
        direct_tool_names: As for :meth:`Catalog.register`.
        allow: As for :meth:`Catalog.register`.
        deny: As for :meth:`Catalog.register`.

    Returns:
        ``(None, texts, tools)`` when the registration is valid, else ``(problem, {}, [])``.
        ``texts`` holds the compact JSON of every registered tool's schemas, which the service
        answers with (``PutCatalog``, ``GetCatalog``, ``tools.describe``, ``GetToolSurface``): writing megabytes of it on
        the event loop held it for tens of ms per MB (SPEC §3.1 item 6). ``tools`` are the
        decoded tools for the service to register without checks; they reach it through the
        worker pool's result thread, not the event loop.
    """
    problem, texts, tools, _catalog = checked_registration(tools, mode, direct_tool_names, allow, deny)
    return problem, texts, tools


def checked_registration(
    tools: list[dict[str, Any]], mode: object, direct_tool_names: object, allow: object, deny: object
) -> tuple[Problem | None, SchemaTexts, list[dict[str, Any]], Catalog | None]:
    """:func:`registration_problem`, and the throwaway catalog it registered into (``None`` when refused).

    For a worker that also builds what the service serves the registration from (its view's
    entries, in the order the service's own registration of ``tools`` gives them).
    """
    try:
        decode_schemas(tools)
        catalog = Catalog()
        catalog.register(tools, mode=mode, direct_tool_names=direct_tool_names, allow=allow, deny=deny, copy=False)
    except CatalogRegistrationError as error:
        return (error.index, error.problem, error.tool), {}, [], None
    # Every registered tool, catalogued or not: the tool surface answers with the texts of
    # direct-only and excluded tools too (SPEC §3.3, §3.1 item 6).
    texts = {
        e.id: (compact_json(e.parameters) if e.parameters is not None else "", compact_json(e.output_schema) if e.output_schema is not None else "")
        for e in catalog.registered_entries()
    }
    return None, texts, tools, catalog


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
    mcp, files = ns.guest_data()
    return ns, compact_json({"allTools": all_tools, "convenience": convenience, "mcp": mcp, "apiFiles": files})
