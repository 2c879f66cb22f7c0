"""Registrations of one scope that overlap apply in one order (SPEC §3.2).

A ``PutCatalog`` awaits worker processes (decoding, checks, preparation), so two of
one scope overlap on the loop. A large ``merge`` sent first and a small ``replace``
sent while the merge was in its worker (the small lane finishes first) ended with the
merge storing the old catalog back: the acknowledged replace was lost, a final
catalog no order of the two explains.
"""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from cellblock.client import CellblockClient, Scope, Tool

pytestmark = pytest.mark.asyncio(loop_scope="session")


def _wide(properties: int) -> dict[str, Any]:
    return {"type": "object", "properties": {f"p{i}": {"type": "string", "description": "x" * 20} for i in range(properties)}}


def _ids(catalog: Any) -> list[str]:
    return sorted(e.id for e in catalog.entries)


async def test_a_replace_during_a_merge_of_its_scope_is_not_lost(client: CellblockClient, scope: Scope) -> None:
    await client.put_catalog(scope, [Tool(source="host", owner="core", name="base")])
    merge = asyncio.ensure_future(client.put_catalog(scope, [Tool(source="host", owner="core", name="merged", parameters=_wide(20_000))], mode="merge"))
    await asyncio.sleep(0.1)  # the merge is in its worker
    replaced = await client.put_catalog(scope, [Tool(source="host", owner="core", name="replaced")])
    merged = await merge
    final = _ids(await client.get_catalog(scope))
    assert _ids(replaced) == ["host:core:replaced"]
    if "host:core:base" in _ids(merged):  # merge, then replace
        assert final == ["host:core:replaced"], (final, _ids(merged))
    else:  # replace, then merge
        assert _ids(merged) == final == ["host:core:merged", "host:core:replaced"], (final, _ids(merged))


async def test_a_delete_during_a_merge_does_not_bring_the_old_catalog_back(client: CellblockClient, scope: Scope) -> None:
    await client.put_catalog(scope, [Tool(source="host", owner="core", name="base")])
    merge = asyncio.ensure_future(client.put_catalog(scope, [Tool(source="host", owner="core", name="merged", parameters=_wide(20_000))], mode="merge"))
    await asyncio.sleep(0.1)
    await client.delete_catalog(scope)
    merged = await merge
    final = _ids(await client.get_catalog(scope)) if "host:core:base" not in _ids(merged) else None
    # Merge first: the delete removed everything after it. Delete first: the merge started a new catalog.
    if final is None:
        with pytest.raises(Exception, match="no catalog"):
            await client.get_catalog(scope)
    else:
        assert final == ["host:core:merged"], final


async def test_a_merge_that_fails_after_its_checks_changes_nothing(client: CellblockClient, scope: Scope, monkeypatch: pytest.MonkeyPatch) -> None:
    # The last step of a registration (preparing the new version in a worker) fails: the merge was
    # already applied, so an INVALID_ARGUMENT PutCatalog left its tools in the scope's catalog.
    from cellblock.client import CellblockError
    from cellblock.server.api import _catalog_service
    from cellblock.server.workers import WorkerFailed

    await client.put_catalog(scope, [Tool(source="host", owner="core", name="base")])
    real = _catalog_service.prepare_view

    async def failing(*args: Any, **kwargs: Any) -> Any:
        raise WorkerFailed("injected")

    monkeypatch.setattr(_catalog_service, "prepare_view", failing)
    with pytest.raises(CellblockError):
        await client.put_catalog(scope, [Tool(source="host", owner="core", name="merged")], mode="merge")
    monkeypatch.setattr(_catalog_service, "prepare_view", real)
    assert _ids(await client.get_catalog(scope)) == ["host:core:base"]
    result = await client.exec(scope, tool_call_id="after", code="return ALL_TOOLS.map((t) => t.id);", handlers={})
    assert result.status == "completed" and result.value == ["host:core:base"], result.raw_json
    merged = await client.put_catalog(scope, [Tool(source="host", owner="core", name="merged")], mode="merge")
    assert _ids(merged) == ["host:core:base", "host:core:merged"]
