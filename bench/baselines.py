"""The baselines every cellblock row is read against, measured in the same run.

- in-process quickjs-rs: a fresh runtime and context, one host function
  registered, the program evaluated and its job queue drained (the engine floor).
- bare ``docker run --rm`` of the cell image with the cell's lockdown flags,
  running ``python3 -c pass`` (the container floor).
- llm-sandbox (PyPI, Docker backend): a widely used Docker-per-run sandbox
  library running the equivalent JavaScript with ``node`` in
  ``cellblock-bench-node:bookworm-<hash>``, built here from the cellblock base
  image with Node.js from Debian packages (bench/node-image/Dockerfile; no
  registry). The tag carries a hash of the build context, so editing the
  Dockerfile builds a new image instead of reusing a stale one.
"""

from __future__ import annotations

import hashlib
import os
import subprocess
from pathlib import Path

from quickjs_rs import Runtime

IMAGE = os.environ.get("CELLBLOCK_IMAGE", "cellblock-cell:dev")
NODE_CONTEXT = Path(__file__).resolve().parent / "node-image"


def _context_hash(context: Path) -> str:
    digest = hashlib.sha256()
    for f in sorted(p for p in context.rglob("*") if p.is_file()):
        digest.update(f.relative_to(context).as_posix().encode() + b"\0" + f.read_bytes() + b"\0")
    return digest.hexdigest()[:12]


#: The llm-sandbox row's image, tagged with the hash of its build context.
NODE_IMAGE = f"cellblock-bench-node:bookworm-{_context_hash(NODE_CONTEXT)}"
NESTED10 = "let s = 0; for (let i = 0; i < 10; i++) { s += (await tools.echo({ n: i })).n; } return s;"
#: What the llm-sandbox row runs: the trivial program's equivalent in Node.js.
NODE_PROGRAM = "console.log(JSON.stringify((() => 1)()));"


def quickjs_baseline(program: str = NESTED10, expected: object = 45) -> None:
    """The engine floor: what bench/exec_latency.py measured before this change."""
    with Runtime() as rt, rt.new_context() as ctx:
        ctx.register("echo", lambda n: {"n": n}, is_async=False)
        ctx.eval(f"globalThis.out = null; (async () => {{ const tools = {{ echo: async (o) => echo(o.n) }}; {program} }})().then(v => {{ globalThis.out = v; }}); 0")
        ctx._engine_ctx.run_pending_jobs()  # private API of the pinned quickjs-rs: drain the job queue
        assert ctx.eval("globalThis.out") == expected


def docker_run_baseline() -> None:
    """``docker run --rm`` of the cell image under the cell's lockdown flags."""
    subprocess.run(
        ["docker", "run", "--rm", "--network", "none", "--read-only", "--cap-drop", "ALL", "--security-opt", "no-new-privileges:true",
         "--user", "65532:65532", "--pids-limit", "64", "--memory", "256m", "--entrypoint", "python3", IMAGE, "-c", "pass"],
        check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )


def ensure_node_image() -> None:
    """Builds the Node.js image from the cellblock base with apt, when this context's tag is missing.

    Raises:
        RuntimeError: The image could not be built (no base image, no apt).
    """
    found = subprocess.run(["docker", "image", "inspect", NODE_IMAGE], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, check=False)
    if found.returncode == 0:
        return
    built = subprocess.run(["docker", "build", "-q", "-t", NODE_IMAGE, str(NODE_CONTEXT)], capture_output=True, text=True, check=False)
    if built.returncode != 0:
        raise RuntimeError(f"building {NODE_IMAGE} failed: {built.stderr.strip()[-300:]}")


def llm_sandbox_run() -> None:
    """One run in llm-sandbox: a new container, the program, removal."""
    from llm_sandbox import SandboxSession

    # No network, as a cell has none: the program needs none (code goes in through the engine's
    # API), and 16 concurrent bridge-network containers beside the cells' deadlocked Docker
    # 20.10's libnetwork here once (every create then hung; moby/moby#42545 is that class).
    with SandboxSession(lang="javascript", image=NODE_IMAGE, skip_environment_setup=True, verbose=False, runtime_configs={"network_mode": "none"}) as session:
        result = session.run(NODE_PROGRAM)
        assert result.exit_code == 0 and result.stdout.strip() == "1", (result.exit_code, result.stdout, result.stderr)
