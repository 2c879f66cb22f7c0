"""``python -m cellblock.guest`` configures grpc before the agent imports it."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

_ROOT = Path(__file__).resolve().parents[3]

#: Runs the entry module with a stand-in agent that reports what it saw when the
#: entry module imported it (the real agent imports grpc at that point).
_PROBE = """
import os, runpy, sys, types
seen = {}
class Agent(types.ModuleType):
    def __getattr__(self, name):
        if name == "main":
            seen["experiments"] = os.environ.get("GRPC_EXPERIMENTS")
            seen["grpc_imported"] = "grpc" in sys.modules
            return lambda: None
        raise AttributeError(name)
sys.modules["cellblock.guest._agent"] = Agent("cellblock.guest._agent")
runpy.run_module("cellblock.guest", run_name="__main__")
print(seen)
"""


def test_the_entry_sets_the_grpc_experiments_before_the_agent_is_imported() -> None:
    env = {k: v for k, v in os.environ.items() if k != "GRPC_EXPERIMENTS"}
    env["PYTHONPATH"] = os.pathsep.join(str(_ROOT / p) for p in ("sandbox-image/guest", "proto"))
    out = subprocess.run([sys.executable, "-c", _PROBE], env=env, capture_output=True, text=True, check=True, timeout=60)
    assert out.stdout.strip() == "{'experiments': '-event_engine_client', 'grpc_imported': False}"
