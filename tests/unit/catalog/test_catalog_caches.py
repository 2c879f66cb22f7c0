"""The catalog's caches are bounded by size, not only by count: deleted catalogs leave no long patterns behind (issue 11)."""

from __future__ import annotations

import re

import pytest

from cellblock.server.catalog import _bounded, _contracts
from cellblock.server.catalog._bounded import SizedLru
from cellblock.server.catalog._contracts import compile_schema


def _long_pattern(n: int) -> str:
    return "^(" + "|".join(f"w{n:04d}{j:05d}" for j in range(2000)) + ")$"  # about 22 KB


def test_a_sized_lru_evicts_the_least_recently_used_beyond_its_size() -> None:
    cache = SizedLru[int](max_entries=10, max_size=100)
    for key in "abcd":
        cache.put(key, ord(key), 25)
    assert cache.get("a") == (True, ord("a"))  # now the most recently used
    cache.put("e", 5, 25)
    assert (len(cache), cache.size) == (4, 100)
    assert cache.get("b") == (False, None)  # the least recently used went
    assert all(cache.get(k)[0] for k in "acde")
    cache.put("huge", 0, 26)  # over a quarter of max_size: never kept, nothing evicted
    assert (cache.get("huge"), len(cache)) == ((False, None), 4)


def test_a_sized_lru_bounds_its_entries_too() -> None:
    cache = SizedLru[int](max_entries=3, max_size=1000)
    for n in range(5):
        cache.put(n, n, 1)
    assert [cache.get(n)[0] for n in range(5)] == [False, False, True, True, True]


def test_compiled_patterns_are_bounded_by_their_total_length() -> None:
    _bounded.PATTERN_CACHE.clear()
    # 400 distinct 22 KB patterns (8.8 MB of text): the old lru_cache(4096) kept all of them.
    for n in range(400):
        _bounded.LinearRe.search(_long_pattern(n), "w000100001")
    assert _bounded.PATTERN_CACHE.size <= _bounded.PATTERN_CACHE.max_size
    assert len(_bounded.PATTERN_CACHE) < 400
    assert _bounded.LinearRe.search(_long_pattern(7), "w000700001") is not None  # evicted ones compile again


def test_registering_long_patterns_keeps_none_in_pythons_re_cache() -> None:
    re.purge()
    for n in range(50):
        compile_schema({"type": "object", "properties": {"s": {"type": "string", "pattern": _long_pattern(1000 + n)}}}, "parameters")
    assert not any(isinstance(key, tuple) and isinstance(key[1], str) and len(key[1]) > 1024 for key in re._cache)  # type: ignore[attr-defined]


@pytest.mark.parametrize(("pattern", "valid"), [("^a+$", True), ("^(?P<x>a)\\d{2,}$", True), ("(", False), ("[z-a]", False)])
def test_the_metaschemas_regex_format_still_refuses_invalid_patterns(pattern: str, valid: bool) -> None:
    schema = {"type": "string", "pattern": pattern}
    if valid:
        compile_schema(schema, "parameters")
    else:
        with pytest.raises(ValueError, match="is not a valid JSON Schema"):
            compile_schema(schema, "parameters")


def test_metaschema_results_are_bounded_by_schema_text() -> None:
    _contracts._CHECKED.clear()
    for n in range(200):
        # Draft 7: a draft 2020-12 schema is accepted by ._meta_accept and never cached.
        compile_schema({"$schema": "http://json-schema.org/draft-07/schema#", "type": "object", "description": f"{n}" + "x" * 50_000}, "parameters")
    assert len(_contracts._CHECKED) > 10
    assert _contracts._CHECKED.size <= _contracts._CHECKED.max_size
