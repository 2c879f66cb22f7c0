"""Configuration (SPEC §2): shape, numeric rules, clamps, overrides, tiers and constants."""

from __future__ import annotations

from typing import Any

import pytest

from cellblock.server.config import DEFAULT_MODEL_TIERS, CodeModeConfig, Limits


@pytest.mark.parametrize(
    ("section", "enabled"),
    [(True, True), (False, False), ("auto", "auto"), ("yes", "auto"), (None, "auto"), (1, "auto"), ([], "auto"),
     ({"enabled": True}, True), ({"enabled": "true"}, "auto"), ({"enabled": 1}, "auto"), ({}, "auto")],
)  # fmt: skip
def test_enabled_and_shorthand(section: Any, enabled: Any) -> None:
    config = CodeModeConfig.from_json(section)
    assert config.enabled == enabled and type(config.enabled) is type(enabled)


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        (5000, 5000),
        (5000.0, 5000),
        (50, 100),
        (10**9, 60000),
        (1e300, 60000),
        (0, 10000),
        (-5, 10000),
        (5000.5, 10000),
        ("5000", 10000),
        (True, 10000),
        (None, 10000),
        (float("nan"), 10000),
    ],
)
def test_numeric_fields(value: Any, expected: int) -> None:
    assert CodeModeConfig.from_json({"timeoutMs": value}).timeout_ms == expected


def test_defaults() -> None:
    config = CodeModeConfig.from_json({})
    assert config == CodeModeConfig()
    assert config.limits == Limits(10000, 67108864, 65536, 10485760, 16, 900)
    assert (config.max_search_limit, config.search_default_limit) == (50, 8)
    assert config.languages == ("javascript", "typescript")
    assert config.model_tiers == DEFAULT_MODEL_TIERS
    assert ("minimax/MiniMax-M3", "preferred") in DEFAULT_MODEL_TIERS
    assert len(DEFAULT_MODEL_TIERS) == 27


def test_clamps_of_every_field() -> None:
    low = CodeModeConfig.from_json(
        {"memoryLimitBytes": 1, "maxOutputBytes": 1, "maxSnapshotBytes": 1, "maxPendingToolCalls": 1,
         "snapshotTtlSeconds": 1, "maxSearchLimit": 1, "searchDefaultLimit": 1}
    )  # fmt: skip
    assert (low.memory_limit_bytes, low.max_output_bytes, low.max_snapshot_bytes) == (1048576, 1024, 1024)
    assert (low.max_pending_tool_calls, low.snapshot_ttl_seconds, low.max_search_limit) == (1, 1, 1)
    big = 10**12
    high = CodeModeConfig.from_json(
        {"memoryLimitBytes": big, "maxOutputBytes": big, "maxSnapshotBytes": big, "maxPendingToolCalls": big,
         "snapshotTtlSeconds": big, "maxSearchLimit": big, "searchDefaultLimit": big}
    )  # fmt: skip
    assert (high.memory_limit_bytes, high.max_output_bytes, high.max_snapshot_bytes) == (1073741824, 10485760, 268435456)
    assert (high.max_pending_tool_calls, high.snapshot_ttl_seconds, high.max_search_limit) == (128, 86400, 50)
    assert high.search_default_limit == 50


@pytest.mark.parametrize(
    ("section", "expected"),
    [({"maxSearchLimit": 3}, 3), ({"maxSearchLimit": 3, "searchDefaultLimit": 2}, 2),
     ({"maxSearchLimit": 20, "searchDefaultLimit": 30}, 20), ({"searchDefaultLimit": 0}, 8)],
)  # fmt: skip
def test_search_default_limit_is_clamped_to_max(section: dict[str, Any], expected: int) -> None:
    assert CodeModeConfig.from_json(section).search_default_limit == expected


@pytest.mark.parametrize(
    ("languages", "expected"),
    [
        (["typescript"], ("typescript",)),
        (["typescript", "javascript", "typescript"], ("typescript", "javascript")),
        ([], ("javascript", "typescript")),
        (["javascript", "python"], ("javascript", "typescript")),
        ("javascript", ("javascript", "typescript")),
    ],
)
def test_languages(languages: Any, expected: tuple[str, ...]) -> None:
    config = CodeModeConfig.from_json({"languages": languages})
    assert config.languages == expected


def test_default_language() -> None:
    assert CodeModeConfig.from_json({"languages": ["typescript", "javascript"]}).default_language == "javascript"
    assert CodeModeConfig.from_json({"languages": ["typescript"]}).default_language == "typescript"


def test_limits_never_enable_code_mode() -> None:
    assert CodeModeConfig.from_json({"timeoutMs": 5000}).enabled == "auto"


def test_overrides() -> None:
    config = CodeModeConfig.from_json({"timeoutMs": 5000, "maxOutputBytes": 4096})
    overridden = config.with_overrides(
        {"timeoutMs": 70000, "maxOutputBytes": "big", "maxPendingToolCalls": 4, "maxSearchLimit": 2, "memoryLimitBytes": 0}
    )
    assert overridden.limits == Limits(60000, 67108864, 4096, 10485760, 4, 900)
    assert overridden.max_search_limit == 50
    assert config.with_overrides(None) is config
    assert config.limits_with_overrides({"snapshotTtlSeconds": 5.0}).snapshot_ttl_seconds == 5


def test_model_tiers_configuration() -> None:
    config = CodeModeConfig.from_json({"modelTiers": {"A/Model": "preferred", "b": "fast", "c": 1}})
    assert config.model_tiers == (("A/Model", "preferred"),)
    assert config.model_tier("a/model") == "preferred"
    assert config.model_tier("x/MODEL") == "preferred"
    assert config.model_tier("b") == "capable"
    assert CodeModeConfig.from_json({"modelTiers": []}).model_tiers == DEFAULT_MODEL_TIERS
    assert CodeModeConfig.from_json({"modelTiers": {}}).model_tiers == ()


def test_engaged_needs_a_catalog_entry() -> None:
    assert not CodeModeConfig(enabled=True).engaged("any", False)
    assert CodeModeConfig(enabled=True).engaged(None, True)
    assert not CodeModeConfig().engaged(None, True)


@pytest.mark.parametrize(
    "kwargs",
    [{"timeout_ms": 50}, {"enabled": "yes"}, {"enabled": 1}, {"languages": ()}, {"languages": ("python",)},
     {"max_search_limit": 3, "search_default_limit": 8}, {"model_tiers": {"a": "fast"}}, {"timeout_ms": True}],
)  # fmt: skip
def test_direct_construction_validates(kwargs: dict[str, Any]) -> None:
    with pytest.raises(ValueError):
        CodeModeConfig(**kwargs)


def test_direct_construction_accepts_a_tier_mapping() -> None:
    tiers: Any = {"a/b": "preferred"}
    assert CodeModeConfig(model_tiers=tiers).model_tiers == (("a/b", "preferred"),)
