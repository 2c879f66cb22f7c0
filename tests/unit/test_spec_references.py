"""Every ``§`` reference in the repo names a section that exists in docs/SPEC.md (or docs/DESIGN.md).

The repo's copies are the living contract: a reference to a section that is not there (a renumbered
or invented one) sends a reader nowhere. A reference with ``DESIGN`` just before it is to DESIGN.md,
every other one to SPEC.md.
"""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
_HEADING = re.compile(r"^#+\s+(\d+[a-z]?(?:\.\d+)*)\.?\s")
_REFERENCE = re.compile(r"§\s?(\d+[a-z]?(?:\.\d+)*)")
_GENERATED = ("proto/baseline.binpb", "clients/typescript/src/gen/", "clients/go/gen/")


def _sections(name: str) -> set[str]:
    return {m.group(1) for line in (REPO / "docs" / name).read_text(encoding="utf-8").splitlines() if (m := _HEADING.match(line))}


def _tracked_text_files() -> list[Path]:
    listed = subprocess.run(["git", "ls-files", "--cached", "--others", "--exclude-standard"], cwd=REPO, check=True, capture_output=True, text=True).stdout.split()
    return [REPO / name for name in listed if not name.startswith(_GENERATED) and "_pb2" not in name and (REPO / name).is_file()]


def test_every_section_reference_resolves_inside_the_repo() -> None:
    spec, design = _sections("SPEC.md"), _sections("DESIGN.md")
    assert {str(n) for n in range(1, 17)} <= spec, "SPEC.md holds §1-§16"
    dangling = []
    checked = 0
    for path in _tracked_text_files():
        try:
            text = path.read_text(encoding="utf-8")
        except (UnicodeDecodeError, OSError):
            continue
        for number, line in enumerate(text.splitlines(), 1):
            for m in _REFERENCE.finditer(line):
                checked += 1
                section = m.group(1).rstrip(".")
                target, doc = (design, "DESIGN.md") if "DESIGN" in line[max(0, m.start() - 40) : m.start()] else (spec, "SPEC.md")
                if section not in target:
                    dangling.append(f"{path.relative_to(REPO)}:{number}: §{section} is not a section of {doc}")
    assert checked > 500, checked
    assert dangling == []
