"""A 500-tool catalog: quick index bound and determinism, search latency.

The catalog is generated from real tool lists: the tools that
``@modelcontextprotocol/server-memory`` (npm) and ``mcp-server-time`` (PyPI)
list over MCP, plus ``examples/catalog.json``, each copied under several owners
until there are 500 entries. The MCP tools are registered as ``host`` tools
here so that they count for the quick index (``mcp`` entries never appear in
it).

Prints the quick-index size (bound 8,000 characters) and whether two
registrations give byte-identical exec descriptions, then ``tools.search``
latency host-side beside its baseline in the same run: a plain substring
filter over the same entries (no ranking), with p50/p95 and ratios. The MCP
servers' stderr goes to ``build/bench/mcp-servers.log``, not the terminal.
"""

from __future__ import annotations

import asyncio
import contextlib
import copy
import os
import statistics
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from bench._report import OUT_DIR
from bench.exec_latency import percentile
from cellblock.server.catalog import Catalog, exec_description
from cellblock.server.config import CodeModeConfig
from cellblock.server.mcp import McpHub, parse_mcp_servers
from examples.data import load_tools

ROOT = Path(__file__).resolve().parents[1]
QUERIES = ["shipping list", "create entities", "current time", "invoice", "read graph", "convert time zone", "list customers", "search nodes", "quote", "stock"]
ROUNDS = int(os.environ.get("BENCH_ROUNDS", "30"))


#: Where the hosted MCP servers' stderr goes ("Knowledge Graph MCP Server
#: running on stdio", node traces): the bench prints only its tables.
MCP_LOG = OUT_DIR / "mcp-servers.log"


@contextlib.contextmanager
def _stderr_to(path: Path) -> Iterator[None]:
    """Points file descriptor 2 at ``path`` (appending) while the block runs.

    The MCP SDK starts stdio servers with the process's own stderr, so the
    children inherit whatever fd 2 is when they are spawned.
    """
    path.parent.mkdir(parents=True, exist_ok=True)
    sys.stderr.flush()
    saved = os.dup(2)
    with open(path, "ab") as log:
        os.dup2(log.fileno(), 2)
    try:
        yield
    finally:
        sys.stderr.flush()
        os.dup2(saved, 2)
        os.close(saved)


async def mcp_tool_lists() -> list[dict[str, Any]]:
    with tempfile.TemporaryDirectory() as memory_dir, _stderr_to(MCP_LOG):
        servers = parse_mcp_servers(
            {
                "memory": {"command": ["node", str(ROOT / "node_modules/@modelcontextprotocol/server-memory/dist/index.js")], "env": {"MEMORY_FILE_PATH": os.path.join(memory_dir, "m.jsonl")}},
                "time": {"command": [sys.executable, "-m", "mcp_server_time", "--local-timezone", "UTC"]},
            }
        )
        hub = McpHub(servers)
        await hub.start()
        try:
            return hub.tools()
        finally:
            await hub.close()


def build_catalog(mcp_tools: list[dict[str, Any]]) -> list[dict[str, Any]]:
    base: list[dict[str, Any]] = []
    for tool in mcp_tools:
        t = copy.deepcopy(tool)
        t["source"] = "host"
        t.pop("operation", None)
        base.append(t)
    base.extend(copy.deepcopy(load_tools()))
    tools: list[dict[str, Any]] = []
    copy_index = 0
    while len(tools) < 500:
        for tool in base:
            if len(tools) == 500:
                break
            t = copy.deepcopy(tool)
            t["owner"] = f"{t.get('owner') or 'core'}{copy_index}" if copy_index else (t.get("owner") or "core")
            tools.append(t)
        copy_index += 1
    return tools


def main() -> None:
    mcp_tools = asyncio.run(mcp_tool_lists())
    tools = build_catalog(mcp_tools)
    config = CodeModeConfig.from_json({"enabled": True})
    first, second = Catalog(), Catalog()
    first.register(copy.deepcopy(tools))
    second.register(copy.deepcopy(tools))
    index = first.view.quick_index or ""
    description_a = exec_description(first.view, config)
    description_b = exec_description(second.view, config)
    print(f"catalog: {first.view.size} tools ({len(mcp_tools)} listed by real MCP servers, {len(load_tools())} from examples/; their stderr: {MCP_LOG})")
    print(f"quick index: {len(index)} characters (bound 8000), last line: {index.splitlines()[-1][:90]!r}")
    print(f"exec description byte-identical across two registrations: {description_a == description_b}")
    assert len(index) <= 8000 and description_a == description_b

    view = first.view
    entries = view.guest_entries
    ranked: list[float] = []
    naive: list[float] = []
    for _ in range(ROUNDS):
        for q in QUERIES:
            t = time.perf_counter()
            view.search(q, None, config=config)
            ranked.append((time.perf_counter() - t) * 1000)
            t = time.perf_counter()
            low = q.lower()
            [e.compact() for e in entries if low in e.name.lower() or low in e.description.lower()][:8]
            naive.append((time.perf_counter() - t) * 1000)
    print(f"\ntools.search host-side, {len(ranked)} queries (ms)")
    print(f"{'row':40} {'p50':>8} {'p95':>8} {'mean':>8}")
    for name, samples in (("cellblock tools.search (exact + BM25)", ranked), ("baseline: substring filter", naive)):
        print(f"{name:40} {percentile(samples, 0.5):8.3f} {percentile(samples, 0.95):8.3f} {statistics.fmean(samples):8.3f}")
    print(f"\nratio p95: {percentile(ranked, 0.95) / percentile(naive, 0.95):.1f}x the substring filter (target: search p95 < 5 ms)")


if __name__ == "__main__":
    main()
