"""``python -m cellblock.guest.precompile PATH``: ahead-of-time compile QuickJS.

Run at image build so each cell deserializes the module instead of compiling
the wasm at start (about 2 s saved per leg). Writes ``PATH`` and the digests
the cell checks before it loads it, ``PATH.json`` (:mod:`._engine_load`).
"""

import sys

from cellblock.guest._engine_load import precompile

precompile(sys.argv[1] if len(sys.argv) > 1 else "/opt/cellblock/quickjs.cwasm")
