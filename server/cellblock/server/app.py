"""Assembles and serves the control service (grpc.aio).

``python -m cellblock.server`` reads its settings from ``CELLBLOCK_*``
environment variables (:class:`ServerSettings`), starts the gRPC server with
the catalog, code-mode and run services plus gRPC health and reflection, and
stops gracefully on SIGTERM/SIGINT.
"""

from __future__ import annotations

import asyncio
import json
import math
import os
import signal
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

import grpc
import structlog
from grpc_health.v1 import health, health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection

from cellblock.server.api import Admission, CatalogService, CodeModeService, FailureInterceptor, RunService, ServiceState
from cellblock.server.cells import (
    MAX_IDLE_LIMIT_S,
    REUSE_MODES,
    DockerExecutor,
    DockerExecutorConfig,
    Executor,
    InstanceLockedError,
    KubernetesExecutor,
    KubernetesExecutorConfig,
    ProcessExecutor,
    ScopeCells,
    WarmPool,
    instance_id,
    lock_directories,
    recover_orphans,
)
from cellblock.server.config import CodeModeConfig
from cellblock.server.limits import DEFAULT_CELL_WAIT_MS, MAX_API_MESSAGE_BYTES, SUSPENDED_RUN_CAP
from cellblock.server.logging import configure_logging
from cellblock.server.mcp import McpHub, McpServerConfig, parse_mcp_servers
from cellblock.server.memory import freeze_startup_heap, trim_free_memory, tune_allocator, use_system_allocator
from cellblock.server.runs import Runner, RunRegistry
from cellblock.server.store import DEFAULT_LEASE_SECONDS, RunStore, StoreUnavailableError, default_state_dir, default_store_url, describe_store, make_run_store
from cellblock.server.telemetry import LoopMonitor, observe_registry, server_interceptors
from cellblock.server.workers import cpu_pool
from cellblock.v1 import catalog_service_pb2, code_mode_service_pb2, run_service_pb2, run_service_pb2_grpc

log = structlog.get_logger("cellblock.server")


@dataclass(frozen=True)
class ServerSettings:
    """Settings of one service instance.

    Attributes:
        address: Listen address, e.g. ``127.0.0.1:50051`` or
            ``unix:/run/cellblock.sock`` (``CELLBLOCK_ADDRESS``).
        executor: ``docker`` (default), ``kubernetes`` (cells as pods, SPEC
            §16.3) or ``process`` (development only; never chosen implicitly)
            (``CELLBLOCK_EXECUTOR``).
        image: Cell image for the docker executor (``CELLBLOCK_IMAGE``).
        oci_runtime: OCI runtime for cells, e.g. ``runsc`` (``CELLBLOCK_OCI_RUNTIME``).
        code_mode: The ``codeMode`` configuration section as JSON
            (``CELLBLOCK_CODE_MODE``), e.g. ``{"enabled": true, "timeoutMs": 5000}``.
        max_concurrent_legs: Most legs (cells) running at once
            (``CELLBLOCK_MAX_CONCURRENT_LEGS``).
        warm_pool: Cells kept started and attached ahead of legs, with the
            docker executor (``CELLBLOCK_WARM_POOL``, 0 disables).
        socket_dir: Host directory for per-cell bridge sockets
            (``CELLBLOCK_SOCKET_DIR``).
        traces: Span exporter (``CELLBLOCK_TRACES``): ``otlp`` (endpoint from
            ``OTEL_EXPORTER_OTLP_ENDPOINT``), ``console``, ``jsonfile:<path>``
            (read with ``cellblock-trace``) or ``none``. Used by :func:`serve`.
        metrics: Metric exporter (``CELLBLOCK_METRICS``): ``otlp``,
            ``console`` or ``none``. Used by :func:`serve`.
        mcp_servers: cellblock-hosted MCP servers (``CELLBLOCK_MCP_SERVERS``, a
            JSON object ``{"<server name>": {"command": [...], "env": {...}} |
            {"url": "http://..."}}``, see :mod:`cellblock.server.mcp`); their
            tools join every scope's catalog (SPEC §3.2 item 7).
        keepalive_min_ping_interval_ms: The shortest interval between a
            client's HTTP/2 keepalive pings that the server accepts while it
            sends no data (``CELLBLOCK_KEEPALIVE_MIN_PING_INTERVAL_MS``, default
            5000): common client defaults (a ping every 10 s, also without
            calls) work through long, quiet legs. A client that pings more
            often gets :data:`KEEPALIVE_MAX_PING_STRIKES` strikes, then
            ``GOAWAY`` (``UNAVAILABLE: Too many pings``). See :func:`keepalive_options`.
        cell_wait_ms: Longest wait for a cell (start and attach) before a leg fails
            with ``runtime_unavailable`` [R21] "the service is busy"
            (``CELLBLOCK_CELL_WAIT_MS``, 100 … 300000). Not part of the program's
            ``timeoutMs``, which starts when the cell has the program.
        state_dir: The instance's own directory of durable state: its stable
            instance id and, by default, its run store (``CELLBLOCK_STATE_DIR``,
            default ``$XDG_STATE_HOME/cellblock``, else ``~/.local/state/cellblock``).
            Two instances on one machine need different state and socket
            directories (each is locked while the instance lives).
        store: The run store (``CELLBLOCK_STORE``): ``sqlite:///<path>``,
            ``postgresql://…`` or ``memory:``; empty means
            ``sqlite:///<state_dir>/runs.sqlite3`` (SPEC §16.1 item 1).
        max_suspended_runs: The deployment's suspended-run cap
            (``CELLBLOCK_MAX_SUSPENDED_RUNS``, 1 … 1000000, SPEC §2.3); one scope holds
            at most three quarters of it. Every replica sharing a store must use the same value.
        lease_seconds: Lease of a run while a leg holds it (``CELLBLOCK_STORE_LEASE_S``);
            a replica that dies mid-leg frees its runs after this long.
        cell_reuse: ``leg`` (one leg per cell) or ``scope`` (a cell serves
            consecutive legs of one scope, each in a fresh VM) (``CELLBLOCK_CELL_REUSE``, SPEC §16.2).
        cell_max_legs: Legs one cell serves at most under ``scope`` (``CELLBLOCK_CELL_MAX_LEGS``).
        cell_max_age_s: Seconds one cell serves at most under ``scope`` (``CELLBLOCK_CELL_MAX_AGE_S``).
        cell_idle_s: Seconds a kept cell waits for its scope's next leg
            (``CELLBLOCK_CELL_IDLE_S``, at most 60: the agent's own wait).
    """

    address: str = "127.0.0.1:50051"
    executor: str = "docker"
    image: str = "cellblock-cell:dev"
    oci_runtime: str | None = None
    code_mode: dict[str, object] = field(default_factory=dict)
    max_concurrent_legs: int = 16
    warm_pool: int = 2
    socket_dir: str = field(default_factory=lambda: os.path.join(tempfile.gettempdir(), "cellblock-cells"))
    traces: str = "none"
    metrics: str = "none"
    mcp_servers: tuple[McpServerConfig, ...] = ()
    keepalive_min_ping_interval_ms: int = 5000
    cell_wait_ms: int = DEFAULT_CELL_WAIT_MS
    state_dir: str = field(default_factory=default_state_dir)
    store: str = ""
    max_suspended_runs: int = SUSPENDED_RUN_CAP
    lease_seconds: float = DEFAULT_LEASE_SECONDS
    cell_reuse: str = "leg"
    cell_max_legs: int = 64
    cell_max_age_s: float = 600.0
    cell_idle_s: float = 30.0

    @classmethod
    def from_env(cls, env: dict[str, str] | None = None) -> ServerSettings:
        """Reads ``CELLBLOCK_*`` variables; absent ones keep the defaults.

        Raises:
            ValueError: ``CELLBLOCK_CODE_MODE`` is not JSON, a number is not
                an integer, or ``CELLBLOCK_MCP_SERVERS`` is invalid.
        """
        env = dict(os.environ if env is None else env)
        base = cls()
        code_mode_text = env.get("CELLBLOCK_CODE_MODE", "")
        code_mode = json.loads(code_mode_text) if code_mode_text else {}
        return cls(
            address=env.get("CELLBLOCK_ADDRESS", base.address),
            executor=env.get("CELLBLOCK_EXECUTOR", base.executor),
            image=env.get("CELLBLOCK_IMAGE", base.image),
            oci_runtime=env.get("CELLBLOCK_OCI_RUNTIME") or None,
            code_mode=code_mode if isinstance(code_mode, dict) else {"enabled": code_mode},
            max_concurrent_legs=int(env.get("CELLBLOCK_MAX_CONCURRENT_LEGS", base.max_concurrent_legs)),
            warm_pool=int(env.get("CELLBLOCK_WARM_POOL", base.warm_pool)),
            socket_dir=env.get("CELLBLOCK_SOCKET_DIR", base.socket_dir),
            traces=env.get("CELLBLOCK_TRACES", base.traces),
            metrics=env.get("CELLBLOCK_METRICS", base.metrics),
            mcp_servers=parse_mcp_servers(env.get("CELLBLOCK_MCP_SERVERS", "")),
            keepalive_min_ping_interval_ms=int(env.get("CELLBLOCK_KEEPALIVE_MIN_PING_INTERVAL_MS", base.keepalive_min_ping_interval_ms)),
            cell_wait_ms=min(300_000, max(100, int(env.get("CELLBLOCK_CELL_WAIT_MS", base.cell_wait_ms)))),
            state_dir=env.get("CELLBLOCK_STATE_DIR") or default_state_dir(env),
            store=env.get("CELLBLOCK_STORE", ""),
            max_suspended_runs=_bounded(env.get("CELLBLOCK_MAX_SUSPENDED_RUNS"), SUSPENDED_RUN_CAP, 1, 1_000_000, "CELLBLOCK_MAX_SUSPENDED_RUNS"),
            lease_seconds=float(env.get("CELLBLOCK_STORE_LEASE_S", DEFAULT_LEASE_SECONDS)),
            cell_reuse=env.get("CELLBLOCK_CELL_REUSE", base.cell_reuse),
            cell_max_legs=_bounded(env.get("CELLBLOCK_CELL_MAX_LEGS"), base.cell_max_legs, 1, 1_000_000, "CELLBLOCK_CELL_MAX_LEGS"),
            cell_max_age_s=float(env.get("CELLBLOCK_CELL_MAX_AGE_S") or base.cell_max_age_s),
            cell_idle_s=float(env.get("CELLBLOCK_CELL_IDLE_S") or base.cell_idle_s),
        ).checked()

    def checked(self) -> ServerSettings:
        """Returns these settings after checking the cell reuse ones (SPEC §16.2).

        Raises:
            ValueError: An unknown ``CELLBLOCK_CELL_REUSE`` or a limit out of range.
        """
        if self.cell_reuse not in REUSE_MODES:
            raise ValueError(f"CELLBLOCK_CELL_REUSE must be one of {', '.join(REUSE_MODES)}, not {self.cell_reuse!r}")
        if self.cell_max_legs < 1 or not 0 < self.cell_max_age_s < math.inf or not 0 < self.cell_idle_s <= MAX_IDLE_LIMIT_S:
            raise ValueError(f"cell reuse limits out of range: CELLBLOCK_CELL_MAX_LEGS >= 1, 0 < CELLBLOCK_CELL_MAX_AGE_S (finite), 0 < CELLBLOCK_CELL_IDLE_S <= {MAX_IDLE_LIMIT_S:g}")
        return self

    @property
    def store_url(self) -> str:
        """The run store's URL: :attr:`store`, or the SQLite file under :attr:`state_dir`."""
        return self.store or default_store_url(self.state_dir)


def _bounded(text: str | None, default: int, low: int, high: int, name: str) -> int:
    if text is None or text == "":
        return default
    try:
        value = int(text)
    except ValueError:
        raise ValueError(f"{name} must be an integer in {low}..{high}, not {text!r}") from None
    if not low <= value <= high:
        raise ValueError(f"{name} must be an integer in {low}..{high}, not {text!r}")
    return value


def make_executor(settings: ServerSettings, env: dict[str, str] | None = None) -> Executor:
    """Builds the configured executor; unknown names fail at start-up.

    Args:
        settings: The service settings.
        env: Where the kubernetes executor reads its ``CELLBLOCK_K8S_*``,
            ``CELLBLOCK_BRIDGE_*`` and ``CELLBLOCK_POD_*`` variables
            (default: the process environment).

    Raises:
        ValueError: The executor name is unknown, or its settings are invalid.
    """
    if settings.executor == "docker":
        return DockerExecutor(DockerExecutorConfig(image=settings.image, runtime=settings.oci_runtime), instance_id=instance_id(settings.state_dir))
    if settings.executor == "kubernetes":
        env = dict(os.environ if env is None else env)
        return KubernetesExecutor(KubernetesExecutorConfig.from_env(env, image=settings.image, runtime_class=env.get("CELLBLOCK_K8S_RUNTIME_CLASS") or None))
    if settings.executor == "process":
        return ProcessExecutor()
    raise ValueError(f"unknown executor {settings.executor!r}; use docker, kubernetes or process")


@dataclass
class Service:
    """A running service instance (for tests and embedding).

    Attributes:
        server: The grpc.aio server.
        address: The address it listens on (port resolved).
        executor: The cell executor.
        registry: This process's runs over the run store.
        state: Catalogs and admission.
        store: The run store (opened at start, closed at stop).
        loop_monitor: Measures how long the event loop is held at a time (``cellblock.loop.hold``).
    """

    server: grpc.aio.Server
    address: str
    executor: Executor
    registry: RunRegistry
    state: ServiceState
    health: health.aio.HealthServicer
    sweeper: asyncio.Task[None] | None = None
    pool: WarmPool | None = None
    store: RunStore | None = None
    locks: list[int] = field(default_factory=list)
    loop_monitor: LoopMonitor = field(default_factory=LoopMonitor)

    async def stop(self, grace: float = 2.0) -> None:
        """Stops accepting RPCs, aborts running legs (removing their cells), ends the server and shuts hosted MCP sessions down."""
        if self.sweeper is not None:
            self.sweeper.cancel()
        self.loop_monitor.stop()
        await self.health.enter_graceful_shutdown()
        if self.state.registry is not None:
            # Legs aborted by the shutdown keep their runs resumable elsewhere (SPEC §16.1 items 3, 6).
            self.state.registry.stopping = True
        await self.state.abort_all(timeout=grace + 5.0)
        if self.pool is not None:
            await self.pool.close()
        if self.state.scope_cells is not None:
            self.state.scope_cells.close()
        await self.server.stop(grace)
        await self.executor.reaper.drain()
        await self.executor.close()
        if self.state.mcp_hub is not None:
            await self.state.mcp_hub.close()
        if self.store is not None:
            await self.store.close()
        for fd in self.locks:
            os.close(fd)
        self.locks.clear()


#: Pings inside the permitted interval tolerated before the server sends GOAWAY.
KEEPALIVE_MAX_PING_STRIKES = 2


def keepalive_options(min_ping_interval_ms: int) -> list[tuple[str, int]]:
    """The server's HTTP/2 keepalive policy (README "Keepalive").

    gRPC servers by default refuse client pings more frequent than every
    5 minutes while no data flows, and answer the third early one with
    ``GOAWAY``: a client pinging every 10 s (a common default) loses its
    stream in the middle of a long leg that waits on a tool.

    Args:
        min_ping_interval_ms: The shortest accepted interval between pings
            while the server sends no data, in milliseconds (at least 1).

    Returns:
        grpc server options: pings permitted without calls, the interval,
        and the strike limit.
    """
    return [
        ("grpc.keepalive_permit_without_calls", 1),
        ("grpc.http2.min_ping_interval_without_data_ms", max(1, int(min_ping_interval_ms))),
        ("grpc.http2.max_ping_strikes", KEEPALIVE_MAX_PING_STRIKES),
    ]


async def start_service(settings: ServerSettings, executor: Executor | None = None) -> Service:
    """Starts the gRPC server and returns the running service.

    Args:
        settings: Instance settings.
        executor: Overrides the executor built from ``settings`` (tests).

    Raises:
        StoreUnavailableError: The run store cannot be opened (fail closed, SPEC §16.1).
    """
    settings.checked()
    config = CodeModeConfig.from_json(settings.code_mode)
    locks = lock_directories(settings.socket_dir, settings.state_dir)
    try:
        store = make_run_store(settings.store_url, settings.max_suspended_runs)
        await store.open()
    except BaseException:
        for fd in locks:
            os.close(fd)
        raise
    executor = executor or make_executor(settings)
    await recover_orphans(settings.socket_dir, executor)
    state = ServiceState(config=config, admission=Admission(settings.max_concurrent_legs))
    registry = RunRegistry(store, restore_view=state.restore_view, lease_seconds=settings.lease_seconds)
    state.registry = registry
    await registry.sweep()
    if settings.mcp_servers:
        state.mcp_hub = McpHub(settings.mcp_servers)
        await state.mcp_hub.start()
    # The pool holds cells sized for the configured memory limit; only the
    # docker executor pools (the process executor is for development).
    pool = (
        WarmPool(executor, settings.socket_dir, size=settings.warm_pool, memory_limit_bytes=config.limits.memory_limit_bytes, max_size=settings.max_concurrent_legs)
        if executor.name in ("docker", "kubernetes") and settings.warm_pool > 0
        else None
    )
    if settings.cell_reuse == "scope":
        state.scope_cells = ScopeCells(executor.reaper, max_legs=settings.cell_max_legs, max_age_s=settings.cell_max_age_s, idle_s=settings.cell_idle_s, max_kept=settings.max_concurrent_legs)
    runner = Runner(config, executor, registry, settings.socket_dir, pool, cell_wait_ms=settings.cell_wait_ms, scope_cells=state.scope_cells)
    observe_registry(registry)
    server = grpc.aio.server(
        interceptors=[*server_interceptors(), FailureInterceptor()],
        options=[
            ("grpc.max_receive_message_length", MAX_API_MESSAGE_BYTES),
            ("grpc.max_send_message_length", MAX_API_MESSAGE_BYTES),
            *keepalive_options(settings.keepalive_min_ping_interval_ms),
        ],
    )
    CatalogService(state, registry).add_to_server(server)  # PutCatalog and GetCatalog answer with bytes
    CodeModeService(state, runner).add_to_server(server)  # GetToolSurface may answer with bytes
    run_service_pb2_grpc.add_RunServiceServicer_to_server(RunService(state, registry), server)
    health_servicer = health.aio.HealthServicer()
    health_pb2_grpc.add_HealthServicer_to_server(health_servicer, server)
    names = [
        catalog_service_pb2.DESCRIPTOR.services_by_name["CatalogService"].full_name,
        code_mode_service_pb2.DESCRIPTOR.services_by_name["CodeModeService"].full_name,
        run_service_pb2.DESCRIPTOR.services_by_name["RunService"].full_name,
    ]
    reflection.enable_server_reflection([*names, health.SERVICE_NAME, reflection.SERVICE_NAME], server)
    port = server.add_insecure_port(settings.address)
    address = settings.address
    if not address.startswith("unix:") and address.rsplit(":", 1)[-1] == "0":
        address = f"{address.rsplit(':', 1)[0]}:{port}"
    await server.start()
    for name in [*names, ""]:
        await health_servicer.set(name, health_pb2.HealthCheckResponse.SERVING)
    log.info("server.started", address=address, executor=executor.name, store=describe_store(settings.store_url), suspended_runs=registry.counts[1])
    service = Service(server, address, executor, registry, state, health_servicer)
    service.pool = pool
    service.store = store
    service.locks = locks
    if pool is not None:
        pool.start()
    service.sweeper = asyncio.ensure_future(_sweep_periodically(registry))
    # What start-up built lives as long as the process: no full collection traverses it again.
    freeze_startup_heap()
    service.loop_monitor.start()
    return service


#: Seconds between sweeps of expired suspended runs (they are also swept at
#: the start of every exec and wait, SPEC §10.7 item 5).
SWEEP_INTERVAL_S = 5.0


async def _sweep_periodically(registry: RunRegistry) -> None:
    while True:
        await asyncio.sleep(SWEEP_INTERVAL_S)
        try:
            swept = await registry.sweep()
        except Exception as exc:  # noqa: BLE001 - a store hiccup: the next sweep tries again
            log.warning("run.sweep_failed", error_class=exc.__class__.__name__, error=str(exc)[:200])
            continue
        for run in swept:
            log.info("run.expired", run_id=run.run_id, session_id=run.session_id, agent_run_id=run.agent_run_id)
        # What legs freed goes back to the system (off the loop: it walks the heap).
        await asyncio.to_thread(trim_free_memory)


async def serve(settings: ServerSettings | None = None) -> None:
    """Runs the service until SIGTERM or SIGINT."""
    from cellblock.server.telemetry.sdk import configure_telemetry  # noqa: PLC0415 - SDK wiring only here (docs/DESIGN.md §5)

    configure_logging()
    tune_allocator()
    # Signals first: readiness (``server.started``, the health service) is announced inside
    # start_service, so a SIGTERM from an orchestrator can come at any point after it; it then
    # stops the service cleanly (its cells removed) once start-up is done, never kills it.
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    try:
        settings = settings or ServerSettings.from_env()
    except ValueError as exc:  # a setting the operator must fix: one line, no traceback
        raise SystemExit(f"cellblock: invalid setting: {exc}") from None
    telemetry = configure_telemetry(settings.traces, settings.metrics)
    try:
        service = await start_service(settings)
    except StoreUnavailableError as exc:
        log.error("store.unavailable", store=describe_store(settings.store_url), reason=str(exc))
        telemetry.shutdown()
        raise SystemExit(f"cellblock: the run store is unavailable: {exc}") from None
    except InstanceLockedError as exc:  # two services on one state directory (`make serve` twice)
        telemetry.shutdown()
        raise SystemExit(f"cellblock: {exc}") from None
    try:
        await service.executor.check()
    except Exception as exc:  # noqa: BLE001 - reported, legs fail closed
        log.error("executor.unavailable", reason=str(exc))
    await stop.wait()
    log.info("server.stopping")
    await service.stop()
    cpu_pool().close()  # its manager threads would otherwise keep the process alive
    telemetry.shutdown()


def main() -> None:
    """Entry point of ``python -m cellblock.server``."""
    use_system_allocator()
    Path(ServerSettings().socket_dir).mkdir(parents=True, exist_ok=True)
    asyncio.run(serve())
