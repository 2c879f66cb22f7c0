"""The guest side of a cell: the agent that runs one QuickJS VM for one leg.

Runs inside the locked-down container only (the host side lives in
``cellblock.server``). Modules: ``_agent`` speaks the bridge protocol,
``_vm`` wraps quickjs-rs, and ``controller.js`` is the guest runtime that
user code sees (SPEC §8).
"""
