"""Quick index (SPEC §4.4): order, footers, the 8000-character bound and greedy skipping."""

from __future__ import annotations

from typing import Any

from cellblock.server.catalog import Catalog
from cellblock.server.catalog._quick_index import QUICK_INDEX_HEADING, quick_index, quick_index_lines

ALL_FOOTER = (
    "Call these ids exactly with tools.callValue; use ALL_TOOLS or tools.search inside exec when the choice is "
    "ambiguous."
)
HEADING = (
    "Host tool quick index (exact ids; descriptions are intentionally deferred):\n"
    "Each line is `id input -> output`; `-> ?` means the output is unknown.\n"
    "OUTPUT DECLARED RULE: use the declared output fields directly in the first exec.\n"
    "OUTPUT UNKNOWN RULE: for `-> ?`, return the raw value unchanged and map it in a later exec."
)


def left_out(count: int) -> str:
    return f"{count} more host tools are not listed here. Use ALL_TOOLS or tools.search inside exec to find them."


def host(name: str, *, output: bool = False, **extra: Any) -> dict[str, Any]:
    tool: dict[str, Any] = {
        "source": "host",
        "name": name,
        "parameters": {"type": "object", "properties": {"q": {"type": "string"}}, "required": ["q"]},
        **extra,
    }
    if output:
        tool["outputSchema"] = {"type": "array", "items": {"type": "string"}}
    return tool


def synthetic(count: int) -> list[dict[str, Any]]:
    tools = []
    for i in range(count):
        tools.append(
            host(
                f"tool_{i:03d}_{'x' * (i % 17)}",
                output=i % 3 == 0,
                description=f"Synthetic tool number {i}",
            )
        )
    tools.append({"source": "mcp", "owner": "gh", "name": "mcp_secret_tool"})
    tools.append({"source": "client", "owner": "app", "name": "client_secret_tool"})
    return tools


def test_heading_constant_is_exact() -> None:
    assert QUICK_INDEX_HEADING == HEADING


def test_small_catalog_lists_everything_with_output_hints_first() -> None:
    view = Catalog().register(
        [
            host("b_plain"),
            host("a_plain"),
            host("z_declared", output=True),
            host("c_declared", output=True),
            {"source": "mcp", "owner": "gh", "name": "create_issue"},
            {"source": "client", "name": "pick"},
        ]
    )
    expected = (
        HEADING
        + "\n"
        + "\n".join(
            [
                '- "host:core:c_declared" { q: string } -> Array<string>',
                '- "host:core:z_declared" { q: string } -> Array<string>',
                '- "host:core:a_plain" { q: string } -> ?',
                '- "host:core:b_plain" { q: string } -> ?',
            ]
        )
        + "\n\n"
        + ALL_FOOTER
    )
    assert view.quick_index == expected


def test_no_host_entry_means_no_quick_index() -> None:
    view = Catalog().register([{"source": "client", "name": "pick"}])
    assert view.quick_index is None


def test_ids_are_json_strings() -> None:
    (line,) = quick_index_lines(Catalog().register([host('say "hi"\u00e9')]).entries)
    assert line.startswith('- "host:core:say \\"hi\\"\u00e9" ')


def test_500_tools_fit_the_bound_and_are_deterministic() -> None:
    first = Catalog().register(synthetic(500)).quick_index
    second = Catalog().register(list(reversed(synthetic(500)))).quick_index
    assert first is not None
    assert len(first) <= 8000
    assert first.encode() == (second or "").encode()
    assert "mcp_secret_tool" not in first and "client_secret_tool" not in first
    lines = first.split("\n\n")[0].split("\n")[4:]
    assert 0 < len(lines) < 500
    assert first.endswith("\n\n" + left_out(500 - len(lines)))
    # Declared-output lines come first.
    arrows = [line.endswith("-> ?") for line in lines]
    assert arrows == sorted(arrows)


def test_greedy_skips_a_line_that_does_not_fit_and_keeps_trying() -> None:
    # Names are capped at 256 characters, so the bound is lowered to make the long line not fit.
    view = Catalog().register([host("a" * 250), host("b_small"), host("c_small"), host("d_small")])
    small = [line for line in quick_index_lines(view.entries) if "_small" in line]
    bound = len(HEADING + "\n" + "\n".join(small) + "\n\n" + left_out(4))
    block = quick_index(view.entries, max_chars=bound)
    assert block is not None
    assert len(block) <= bound
    assert "a" * 100 not in block
    assert '- "host:core:b_small" { q: string } -> ?' in block
    assert '- "host:core:d_small" { q: string } -> ?' in block
    assert block.endswith("\n\n" + left_out(1))


def test_greedy_sizing_uses_total_count_footer() -> None:
    # Twelve equal lines. The bound fits three lines next to "9 more ..." but not next to the
    # sizing footer "12 more ..." (one character longer), so only two lines are taken.
    entries = Catalog().register([host(f"t{i:02d}") for i in range(12)]).entries
    lines = quick_index_lines(entries)
    assert len({len(line) for line in lines}) == 1
    bound = len(HEADING + "\n" + "\n".join(lines[:3]) + "\n\n" + left_out(9))
    block = quick_index(entries, max_chars=bound)
    assert block == HEADING + "\n" + "\n".join(lines[:2]) + "\n\n" + left_out(10)


def test_bound_holds_when_only_the_longer_footer_overflows() -> None:
    entries = Catalog().register([host(f"t{i}") for i in range(3)]).entries
    lines = quick_index_lines(entries)
    complete = HEADING + "\n" + "\n".join(lines) + "\n\n" + ALL_FOOTER
    block = quick_index(entries, max_chars=len(complete) - 1)
    assert block is not None
    assert len(block) <= len(complete) - 1
    assert block == HEADING + "\n" + "\n".join(lines[:2]) + "\n\n" + left_out(1)


def test_exactly_fitting_complete_block_is_used() -> None:
    entries = Catalog().register([host(f"t{i}") for i in range(3)]).entries
    complete = quick_index(entries)
    assert complete is not None
    assert quick_index(entries, max_chars=len(complete)) == complete
