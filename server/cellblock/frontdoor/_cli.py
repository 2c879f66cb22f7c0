"""``cellblock mcp``: the MCP front door as a command (SPEC §3.7).

Without ``--connect`` the process starts its own cellblock service
(`cellblock.server.app.start_service`, settings from the ``CELLBLOCK_*`` variables,
hosted MCP servers from ``CELLBLOCK_MCP_SERVERS``) and reaches it through
`cellblock.client` on a private unix socket, or on ``--also-grpc ADDRESS``, which
then serves gRPC clients too from the same cells, limits, run store and telemetry.
With ``--connect ADDRESS`` it fronts a running service instead, whose own hosted MCP
servers are the catalog.
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import os
import shutil
import signal
import sys
import tempfile
from collections.abc import AsyncIterator, Sequence
from contextlib import asynccontextmanager
from pathlib import Path

import structlog

from cellblock.client import CellblockClient
from cellblock.frontdoor._serve import DEFAULT_SESSION_IDLE_S, serve_http, serve_stdio
from cellblock.server.app import ServerSettings, start_service
from cellblock.server.logging import configure_logging

__all__ = ["build_parser", "main", "run_front_door"]

log = structlog.get_logger("cellblock.frontdoor")


def _positive_seconds(text: str) -> float:
    """``--session-idle``: a positive, finite number of seconds (the SDK refuses others with a traceback)."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a number of seconds: {text!r}") from None
    if not 0 < value < float("inf"):
        raise argparse.ArgumentTypeError(f"must be a positive, finite number of seconds: {text!r}")
    return value


def build_parser() -> argparse.ArgumentParser:
    """The ``cellblock`` command line: ``cellblock mcp ...`` and ``cellblock serve``."""
    parser = argparse.ArgumentParser(prog="cellblock", description="cellblock: code mode in locked-down cells.")
    commands = parser.add_subparsers(dest="command", required=True)
    commands.add_parser("serve", help="run the gRPC service (same as python -m cellblock.server)")
    mcp = commands.add_parser(
        "mcp",
        help="serve exec and wait to any MCP client (stdio or streamable HTTP)",
        description="The MCP front door: exec and wait over the MCP servers of CELLBLOCK_MCP_SERVERS.",
    )
    mcp.add_argument("--transport", choices=("stdio", "http"), default="stdio", help="MCP transport (default stdio)")
    mcp.add_argument("--host", default="127.0.0.1", help="HTTP listen host (default 127.0.0.1)")
    mcp.add_argument("--port", type=int, default=8765, help="HTTP listen port (default 8765)")
    mcp.add_argument("--path", default="/mcp", help="HTTP endpoint path (default /mcp)")
    mcp.add_argument("--model", default="", help="model id for GetToolSurface (default: none; code mode must be enabled)")
    mcp.add_argument("--session-idle", type=_positive_seconds, default=DEFAULT_SESSION_IDLE_S, help="seconds before an idle HTTP session ends")
    where = mcp.add_mutually_exclusive_group()
    where.add_argument("--connect", metavar="ADDRESS", help="front a running cellblock service instead of starting one")
    where.add_argument("--also-grpc", metavar="ADDRESS", help="also serve the in-process service's gRPC API on ADDRESS")
    return parser


def _front_door_settings(also_grpc: str | None, private_dir: str) -> ServerSettings:
    """The in-process service's settings: ``CELLBLOCK_*``, code mode engaged unless configured otherwise."""
    settings = ServerSettings.from_env()
    code_mode = dict(settings.code_mode)
    # The front door exists to serve exec and wait: engage code mode for every model
    # unless CELLBLOCK_CODE_MODE says otherwise.
    code_mode.setdefault("enabled", True)
    return dataclasses.replace(settings, address=also_grpc or f"unix:{private_dir}/grpc.sock", code_mode=code_mode)


@asynccontextmanager
async def _cellblock(args: argparse.Namespace) -> AsyncIterator[CellblockClient]:
    """A client of the remote service (``--connect``) or of a service started here."""
    if args.connect:
        if os.environ.get("CELLBLOCK_MCP_SERVERS"):
            log.warning("frontdoor.mcp_servers_ignored", reason="with --connect the remote service's hosted MCP servers are the catalog")
        async with await CellblockClient.connect(args.connect) as client:
            yield client
        return
    from cellblock.server.telemetry.sdk import configure_telemetry  # noqa: PLC0415 - SDK wiring only in entry points (docs/DESIGN.md §5)

    private_dir = tempfile.mkdtemp(prefix="cellblock-frontdoor-")  # 0700: the gRPC socket is ours alone
    try:
        settings = _front_door_settings(args.also_grpc, private_dir)
        if not settings.mcp_servers:
            # Code mode never engages on an empty catalog (SPEC §2.4): fail at start, not at the first tools/list.
            raise SystemExit("cellblock mcp: CELLBLOCK_MCP_SERVERS names no MCP server to put behind code mode")
        Path(settings.socket_dir).mkdir(parents=True, exist_ok=True)
        telemetry = configure_telemetry(settings.traces, settings.metrics)
        service = await start_service(settings)
        try:
            try:
                await service.executor.check()
            except Exception as exc:  # noqa: BLE001 - reported; legs fail closed with runtime_unavailable
                log.error("executor.unavailable", reason=str(exc))
            async with await CellblockClient.connect(service.address) as client:
                yield client
        finally:
            await service.stop()
            telemetry.shutdown()
    finally:
        shutil.rmtree(private_dir, ignore_errors=True)


async def run_front_door(args: argparse.Namespace) -> None:
    """Runs ``cellblock mcp`` until stdin closes (stdio), or SIGTERM/SIGINT."""
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    async with _cellblock(args) as client:
        if args.transport == "http":
            await serve_http(client, host=args.host, port=args.port, path=args.path, model_id=args.model, session_idle_seconds=args.session_idle, stop=stop)
            return
        serving = asyncio.ensure_future(serve_stdio(client, model_id=args.model))
        stopping = asyncio.ensure_future(stop.wait())
        await asyncio.wait({serving, stopping}, return_when=asyncio.FIRST_COMPLETED)
        stopping.cancel()
        if not serving.done():
            serving.cancel()
        await asyncio.gather(serving, return_exceptions=True)
        if not serving.cancelled() and serving.exception() is not None:
            raise serving.exception()  # type: ignore[misc]


def main(argv: Sequence[str] | None = None) -> None:
    """Entry point of the ``cellblock`` console script and ``python -m cellblock.frontdoor``."""
    args = build_parser().parse_args(argv)
    if args.command == "serve":
        from cellblock.server.app import main as serve_main  # noqa: PLC0415

        serve_main()
        return
    # stdout carries the MCP protocol on stdio: logs go to stderr (configure_logging).
    configure_logging()
    try:
        asyncio.run(run_front_door(args))
    except KeyboardInterrupt:
        sys.exit(130)
