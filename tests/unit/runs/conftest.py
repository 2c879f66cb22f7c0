"""Import paths for the runs unit tests.

``cellblock`` is a PEP 420 namespace split over ``server/`` and the generated
``proto/`` tree; ``cellblock.server.runs`` imports both, so both must be importable
even when only ``PYTHONPATH=server`` is set.
"""

import sys
from pathlib import Path

_ROOT = Path(__file__).resolve().parents[3]
for _part in ("server", "proto"):
    _path = str(_ROOT / _part)
    if _path not in sys.path:
        sys.path.insert(0, _path)
