"""The model-facing tool surface: ``exec`` and ``wait`` (SPEC §3.3, §4)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from ..config import CodeModeConfig
from ..limits import DESCRIPTION_MAX_SERVERS
from ._catalog import Catalog, CatalogView
from ._text import compact_json

__all__ = [
    "CODE_DESC",
    "COMMAND_DESC",
    "PARAGRAPH_B",
    "PARAGRAPH_C",
    "PARAGRAPH_E",
    "RESTART_DESC",
    "WAIT_DESCRIPTION",
    "exec_description",
    "exec_tool",
    "namespace_section",
    "paragraph_a",
    "paragraph_d",
    "surface_definitions",
    "tool_surface",
    "wait_tool",
]

CODE_DESC = (
    "Program body (JavaScript or TypeScript, run as an async function; `return` the result). "
    "`tools.search` takes a query string, not an object. Copy exact ids from `ALL_TOOLS` or `tools.search`; "
    "never put dependent calls in Promise.all. Node built-in modules are not available."
)
"""Description of ``exec``'s ``code`` parameter (SPEC §4.1 item 3)."""

COMMAND_DESC = "Alias of `code` for exec-style hooks; must equal `code` when both are set. Not a shell command."
"""Description of ``exec``'s ``command`` parameter."""

RESTART_DESC = (
    "Only for read-only work that may be replayed after a service restart: side-effecting tool calls are "
    "then refused before they run. Leave unset for ordinary calls."
)
"""Description of ``exec``'s ``restartSafe`` parameter."""

WAIT_DESCRIPTION = (
    'Resumes a code-mode run whose exec (or an earlier wait) returned status "waiting". '
    "Returns the same result shape as exec: completed, waiting again, or failed."
)
"""Description of the ``wait`` tool (SPEC §4.2)."""

_LANG_SENTENCES = {
    ("javascript", "typescript"): (
        'Set `language` to "javascript" (default) or "typescript"; TypeScript types are stripped, never '
        "checked, and a failed shell-like source must not be resent."
    ),
    ("javascript",): "Only JavaScript is enabled; a failed shell-like source must not be resent.",
    ("typescript",): (
        "Only TypeScript is enabled (types are stripped, never checked); a failed shell-like source must not "
        "be resent."
    ),
}

_PARAGRAPH_A = (
    "Runs a JavaScript or TypeScript program in an isolated cell. The program is the body of an async "
    "function: top-level `await` works, and `return` sends the final value back (without `return` the value "
    "is null). {lang} The source is never a shell command: Node.js modules, `require`/`import` and direct "
    "file, network or environment access are NOT available; do shell, file and network work through catalog "
    "tools allowed by policy."
)

PARAGRAPH_B = (
    "Catalog: `ALL_TOOLS` is the complete compact catalog (id, name, description, input and output hints). "
    "`tools.search(query: string, options?)` ranks tools by relevance; `tools.describe(id: string)` adds the "
    "full schemas; `tools.callValue(id: string, args?)` returns its JSON value directly; "
    "`tools.call(id: string, args?)` returns the raw { tool, result } envelope; `tools.<name>(args)` is a "
    "shortcut for unambiguous names. Never make up or rewrite a tool id: copy it from the quick index, "
    '`ALL_TOOLS` or `tools.search`, e.g. `const hit = ALL_TOOLS.find((t) => t.name === "read") ?? '
    '(await tools.search("read file"))[0];`'
)
"""Paragraph B of the exec description (SPEC §4.3 item 2)."""

PARAGRAPH_C = (
    "Quick-index arrows are trusted declared output hints: use the declared fields in the first exec instead "
    "of spending another exec inspecting results. `-> ?` means the output shape is unknown, so do not guess "
    "field names: return the raw value unchanged (`return await tools.callValue(id, args)`) and filter or map "
    "it in a later exec. The same holds when the final dependent call after declared-output calls is `-> ?`: "
    "return its raw value rather than wrapping it in the requested answer shape."
)
"""Paragraph C of the exec description (SPEC §4.3 item 3)."""

_PARAGRAPH_D = (
    "Keep dependent reads, checks and follow-up calls in order inside one exec; parallelize only independent "
    "work. Nested calls go through the normal tool policy and approvals. `text(value)`, `json(value)` and "
    "`console.log(...)` append output; `yield_control(reason?)` pauses and hands control back; `setTimeout` "
    "delays count against the time budget. Each exec or wait call may run {timeout_ms} ms, and the whole run "
    "shares {max_output_bytes} bytes of output. When the result status is \"waiting\", call `wait` with its "
    "runId."
)

PARAGRAPH_E = (
    "MCP tools are reachable only through the `MCP` namespace, not through `tools.*`. Read their TypeScript "
    'declarations with `API.list(prefix?)` and `API.read(path)` (start with "mcp/index.d.ts") or '
    "`MCP.<server>.$api()`, then call `MCP.<server>.<tool>({ ... })` with one object argument."
)
"""Paragraph E of the exec description, present only with ``mcp`` entries (SPEC §4.3 item 5)."""


def _enabled_languages(config: CodeModeConfig) -> tuple[str, ...]:
    return tuple(language for language in ("javascript", "typescript") if language in config.languages)


def paragraph_a(config: CodeModeConfig) -> str:
    """Returns paragraph A of the exec description, with the language sentence (SPEC §4.3 item 1)."""
    return _PARAGRAPH_A.format(lang=_LANG_SENTENCES[_enabled_languages(config)])


def paragraph_d(config: CodeModeConfig) -> str:
    """Returns paragraph D of the exec description, with the configured limits (SPEC §4.3 item 4)."""
    return _PARAGRAPH_D.format(timeout_ms=config.timeout_ms, max_output_bytes=config.max_output_bytes)


def namespace_section(view: CatalogView) -> str | None:
    """Returns the namespace section (SPEC §4.5), or ``None`` without ``mcp`` entries.

    Args:
        view: The catalog view.

    Returns:
        Two lines naming at most 20 server identifiers in sorted order.
    """
    identifiers = sorted(view.mcp_servers().values())
    if not identifiers:
        return None
    servers = ", ".join(identifiers[:DESCRIPTION_MAX_SERVERS])
    if len(identifiers) > DESCRIPTION_MAX_SERVERS:
        more = len(identifiers) - DESCRIPTION_MAX_SERVERS
        servers += f', \u2026 ({more} more; see API.list("mcp"))'
    return f"Namespace globals:\n- MCP: MCP server tools grouped by server. Visible servers: {servers}."


def exec_description(view: CatalogView, config: CodeModeConfig) -> str:
    """Builds the exec description (SPEC §4.3).

    Args:
        view: The scope's catalog view.
        config: Supplies the languages, ``timeoutMs`` and ``maxOutputBytes``.

    Returns:
        Paragraphs A-D, then paragraph E and the namespace section when the catalog has an
        ``mcp`` entry, then the quick index when it has a ``host`` entry; joined by a blank line.
    """
    parts = [paragraph_a(config), PARAGRAPH_B, PARAGRAPH_C, paragraph_d(config)]
    section = namespace_section(view)
    if section is not None:
        parts += [PARAGRAPH_E, section]
    index = view.quick_index
    if index is not None:
        parts.append(index)
    return "\n\n".join(parts)


def exec_tool(view: CatalogView, config: CodeModeConfig) -> dict[str, Any]:
    """Returns the ``exec`` tool definition (SPEC §4.1).

    Args:
        view: The scope's catalog view.
        config: The service configuration.

    Returns:
        ``{"name": "exec", "description": ..., "parameters": ...}``.
    """
    languages = _enabled_languages(config)
    langs = " or ".join(f'"{language}"' for language in languages)
    language_desc = (
        f'Must be {langs} (default "{config.default_language}"); never a shell. '
        "TypeScript is type-stripped, not type-checked."
    )
    return {
        "name": "exec",
        "description": exec_description(view, config),
        "parameters": {
            "type": "object",
            "properties": {
                "code": {"type": "string", "description": CODE_DESC},
                "command": {"type": "string", "description": COMMAND_DESC},
                "language": {"type": "string", "enum": list(languages), "description": language_desc},
                "restartSafe": {"type": "boolean", "description": RESTART_DESC},
            },
        },
    }


def wait_tool() -> dict[str, Any]:
    """Returns the ``wait`` tool definition (SPEC §4.2)."""
    return {
        "name": "wait",
        "description": WAIT_DESCRIPTION,
        "parameters": {
            "type": "object",
            "required": ["runId"],
            "properties": {"runId": {"type": "string", "description": "The runId from the waiting result."}},
        },
    }


def tool_surface(
    catalog: Catalog | CatalogView | None, config: CodeModeConfig, model_id: str | None = None
) -> tuple[bool, list[dict[str, Any]]]:
    """Returns the model-visible tools for one model (SPEC §3.3).

    Args:
        catalog: The scope's catalog (or a view of it); ``None`` when none is registered.
        config: The service configuration.
        model_id: The request's model id, or ``None``.

    Returns:
        ``(codeModeEngaged, tools)``. Engaged: the ``exec`` and ``wait`` definitions, then the
        direct tools as registered. Not engaged: every registered tool, unchanged. The same
        catalog and configuration always give equal results.
    """
    if catalog is None:
        return False, []
    view = catalog.view if isinstance(catalog, Catalog) else catalog
    if not config.engaged(model_id, view.size > 0):
        return False, view.registered_tools()
    return True, [exec_tool(view, config), wait_tool(), *view.direct_tools()]


SurfaceDefinition = tuple[str, str, str]
"""One model-visible tool as ``GetToolSurface`` sends it: name, description, compact JSON of its parameters."""


def surface_definitions(
    view: CatalogView, config: CodeModeConfig, model_id: str | None, schema_texts: Mapping[str, tuple[str, str]]
) -> tuple[bool, list[SurfaceDefinition]]:
    """:func:`tool_surface` as the definitions ``GetToolSurface`` sends (SPEC §3.3).

    A registered tool's parameters are the compact JSON a worker wrote at registration
    (``schema_texts``, by catalog id), so megabytes of schemas are neither copied nor
    serialized on the shared event loop (SPEC §3.1 item 6); a tool without one (a view
    restored from a run's document) is serialized here.

    Args:
        view: The scope's catalog view.
        config: The service configuration.
        model_id: The request's model id, or ``None``.
        schema_texts: Per catalog id, the compact JSON of the tool's ``parameters`` and
            ``outputSchema`` (``""`` when absent).

    Returns:
        ``(codeModeEngaged, definitions)``, the same tools in the same order as :func:`tool_surface`.
    """
    engaged = config.engaged(model_id, view.size > 0)
    out: list[SurfaceDefinition] = []
    if engaged:
        out = [(t["name"], t["description"], compact_json(t["parameters"])) for t in (exec_tool(view, config), wait_tool())]
    for entry_id, tool in view.surface_tools(engaged):
        texts = schema_texts.get(entry_id) if entry_id is not None else None
        parameters = texts[0] if texts is not None and texts[0] else compact_json(tool.get("parameters", {}))
        out.append((tool["name"], tool.get("description", ""), parameters))
    return engaged, out
