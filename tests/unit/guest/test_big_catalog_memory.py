"""A 1500-tool ``mcp`` guest catalog installs in a VM at the default 64 MiB limit (issue 11, SPEC §8.6).

The catalog comes from the real host code (registration, then
:class:`~cellblock.server.api._catalogs.RunCatalog`), as a cell gets it. Before each declaration
piece was sent once, this catalog was 37.7 MB of JSON and its install needed 119 MB of linear memory.
"""

from __future__ import annotations

import json
import time

from cellblock.guest._vm import CellVM
from cellblock.server.api._catalogs import RunCatalog
from cellblock.server.catalog import Catalog, compact_json
from cellblock.server.config import CodeModeConfig
from tests.support.big_catalog import TOOLS, big_mcp_registrations

MIB = 1 << 20
LIMITS = {"maxPendingToolCalls": 4, "replyInboxBytes": MIB, "maxOutputBytes": MIB, "outputSpentBytes": 0, "outputClosed": False}


def test_a_1500_tool_mcp_catalog_is_small_and_installs_within_the_default_limit() -> None:
    catalog = Catalog()
    catalog.register(big_mcp_registrations())
    text = compact_json(RunCatalog(catalog.view, CodeModeConfig.from_json({})).guest_catalog())
    assert len(text) < 8_000 * TOOLS, "about 7.5 KB per tool (25 KB when declarations were repeated)"
    vm = CellVM(memory_limit_bytes=64 * MIB, deadline=time.monotonic() + 30.0)
    try:
        vm.install({"limits": dict(LIMITS), "bridgeCounters": {}, "nextTimerId": 1}, text)
        vm.start("const a = await MCP.server0.$api(); const f = await API.read('mcp/server9.d.ts'); return [a.tools.length, f.bytes > 500000];")
        status = vm.status()
        assert status["phase"] == "fulfilled" and json.loads(status["valueJson"]) == [TOOLS // 10, True]
        assert vm.linear_memory_bytes() < 48 * MIB, vm.linear_memory_bytes()
    finally:
        vm.close()
