"""A leg's Start on the wire: the catalog part serialized once, the leg's fields appended (SPEC §2.3)."""

from __future__ import annotations

import pytest

from cellblock.bridge.v1 import bridge_service_pb2 as bpb
from cellblock.server.runs import start_catalog_part
from cellblock.server.runs._start import start_message


def _leg_start() -> bpb.Start:
    limits = bpb.LegLimits(deadline_ms=1500, memory_limit_bytes=64 << 20, max_pending_tool_calls=4, reply_inbox_bytes=1 << 20, max_output_bytes=1 << 16, output_spent_bytes=12, output_closed=True)
    return bpb.Start(run_id="run_1", source="return 1", limits=limits, bridge_counters={"call": 3, "timer": 1}, snapshot_bytes=99)


def test_the_spliced_bytes_parse_as_the_whole_start() -> None:
    catalog_json = '{"allTools":[{"id":"host:core:a","name":"é"}],"convenience":{},"mcp":null,"apiFiles":[]}'
    whole = bpb.AttachResponse(start=bpb.Start(catalog_json=catalog_json))
    whole.start.MergeFrom(_leg_start())
    parsed = bpb.AttachResponse.FromString(start_message(start_catalog_part(catalog_json), _leg_start()))
    assert parsed == whole and parsed.WhichOneof("message") == "start"


def test_a_leg_start_carrying_a_catalog_is_refused() -> None:
    with pytest.raises(ValueError, match="catalog_json"):
        start_message(start_catalog_part("{}"), bpb.Start(run_id="r", catalog_json='{"other":1}'))
