"""Every SPEC §14 text has one home: the messages package, or controller.js for the texts only the guest writes."""

from __future__ import annotations

import re
from pathlib import Path

from cellblock.server import messages

REPO = Path(__file__).resolve().parents[2]
GUEST_ONLY = {"B13", "B15", "B16", "B17", "B18", "B20", "B21", "B22", "B27"}
"""Texts the guest controller writes itself (the host never produces them)."""


def _spec_texts() -> dict[str, str]:
    spec = (REPO / "docs" / "SPEC.md").read_text(encoding="utf-8")
    section = spec[spec.index("## 14. Messages") : spec.index("## 15.")]
    return dict(re.findall(r"^\| ([A-Z]\d\d) \| `(.*?)`", section, re.M))


def test_each_host_text_is_in_messages_and_each_guest_text_in_the_controller() -> None:
    texts = _spec_texts()
    assert len(texts) > 60  # E01 ... P04
    controller = (REPO / "sandbox-image" / "guest" / "cellblock" / "guest" / "controller.js").read_text(encoding="utf-8")
    controller = controller.replace('\\"', '"')
    for text_id, template in texts.items():
        in_messages = hasattr(messages, text_id) or hasattr(messages, text_id.lower())
        if text_id in GUEST_ONLY:
            assert not in_messages, f"{text_id} is written by the guest; a host copy would be a second home"
            for piece in re.split(r"<[^>]+>", template):
                if len(piece) >= 8:
                    assert piece in controller, f"{text_id}: {piece!r} not in controller.js"
        else:
            assert in_messages, f"{text_id} has no home in cellblock.server.messages"


def test_fixed_host_texts_match_the_spec_byte_for_byte() -> None:
    for text_id, template in _spec_texts().items():
        if "<" not in template and hasattr(messages, text_id):
            assert getattr(messages, text_id) == template, text_id
