"""The Docker executor: one locked-down container per cell (DESIGN.md §3, §4).

Every cell container gets all of the lockdown below; there is no switch that
turns any of it off. Blocking Docker SDK calls run in worker threads.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import secrets
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import docker
import docker.errors
from docker.models.containers import _create_container_args

from cellblock.server.cells._base import Cell, CellSpec, CellStartError, Executor
from cellblock.server.cells._engine_events import EngineEvents
from cellblock.server.cells._lockdown import BRIDGE_SOCKET_ENV, CELL_TOKEN_ENV, DEFAULT_LOCKDOWN, MEMORY_LIMIT_ENV, Lockdown
from cellblock.server.limits import CELL_STATE_CHECK_S

#: The engine's CPU weight of a cell serving a leg (``cpu_shares``: Docker's default, 1024).
LEG_CPU_SHARES = 1024
#: Threads for Docker API calls, and for cells' exit waiters (one per live cell).
API_THREADS = 8
WAIT_THREADS = 256
#: Seconds the service's start waits for the engine's event stream (then liveness asks the engine).
EVENTS_SUBSCRIBE_S = 2.0
#: Where the cell's socket directory is mounted inside the container.
CELL_BRIDGE_MOUNT = "/run/cellblock"
CELL_LABEL = "io.cellblock.cell"
#: Names the service instance that started a cell (one random id per executor).
INSTANCE_LABEL = "io.cellblock.instance"


@dataclass(frozen=True)
class DockerExecutorConfig:
    """Settings of the Docker executor.

    Attributes:
        image: The cell image (built by ``make image``).
        runtime: OCI runtime name, e.g. ``runsc`` for gVisor; ``None`` uses the
            engine's default (runc). A named runtime that the engine lacks
            fails closed with ``runtime_unavailable``.
        lockdown: The cell lockdown (:mod:`._lockdown`): seccomp profile
            (missing fails closed), uid, CPU/pids/memory limits.
        docker_base_url: Docker Engine API address; ``None`` uses the
            environment (DOCKER_HOST or the local socket).
        extra_labels: More container labels.
        test_guest_command: Tests only (the bridge fuzzer): run this command in
            the locked-down cell instead of the guest agent.
        test_mounts: Tests only: read-only mounts for that command's code.
        test_writable_mounts: Tests only: writable mounts where that command records
            what it saw (the bridge fuzzer's answers).
        ahead_cpu_shares: The CPU weight (``cpu_shares``) a cell started ahead of its
            leg (the warm pool) starts with, until it is ready and gets
            :data:`LEG_CPU_SHARES`; 0 starts it at that weight, as does any runtime but
            runc (runsc refuses the engine's ``update``). The weight only orders
            cells competing for the CPU: the quota (``cpu_millis``) is the same.
    """

    image: str = "cellblock-cell:dev"
    runtime: str | None = None
    lockdown: Lockdown = DEFAULT_LOCKDOWN
    docker_base_url: str | None = None
    extra_labels: dict[str, str] = field(default_factory=dict)
    #: Test only: the cell's command instead of the image's guest agent (a hostile guest).
    test_guest_command: tuple[str, ...] = ()
    #: Test only: host directory → container path, mounted read-only (the hostile guest's code).
    test_mounts: dict[str, str] = field(default_factory=dict)
    #: Test only: host directory → container path, mounted writable (what the hostile guest saw).
    test_writable_mounts: dict[str, str] = field(default_factory=dict)
    ahead_cpu_shares: int = 2

    @property
    def seccomp_profile(self) -> Path:
        """Path of the cell's seccomp profile (JSON)."""
        return Path(self.lockdown.seccomp_profile)

    @property
    def pids_limit(self) -> int:
        """Most processes and threads in a cell."""
        return self.lockdown.pids_limit


def container_options(config: DockerExecutorConfig, spec: CellSpec, seccomp_json: str, instance_id: str = "") -> dict[str, Any]:
    """Returns the docker-py ``containers.create`` options for one cell.

    Every option derives from ``config.lockdown`` (DESIGN.md §3's container
    row, SPEC §15 item 1): no network (no interface but loopback, no
    engine network sandbox), read-only root, non-root user, no
    capabilities, no-new-privileges, the cell's own seccomp profile,
    pids/memory (swap included)/CPU limits, no host environment, no devices,
    private IPC, and the cell's socket directory as the only mount.
    """
    lock = config.lockdown
    memory = lock.memory_bytes(spec.memory_limit_bytes)
    security_opt = [f"seccomp={seccomp_json}"]
    if lock.no_new_privileges:
        security_opt.insert(0, "no-new-privileges:true")
    options: dict[str, Any] = {
        "image": config.image,
        "name": f"cellblock-{spec.cell_id}",
        "detach": True,
        # Docker cells reach their bridge over the mounted socket: no network at all.
        "network_mode": "none",
        # And no libnetwork sandbox: the runtime still gives the cell a network namespace of
        # its own (only a loopback device), but the engine runs no ``libnetwork-setkey``
        # prestart hook (a start of the whole dockerd binary per container: about 40 % of a
        # cell's churn CPU) and bind-mounts no hosts or resolv.conf file into it.
        "network_disabled": True,
        "read_only": lock.read_only_root,
        "user": f"{lock.uid}:{lock.uid}",
        "cap_drop": list(lock.drop_capabilities),
        "security_opt": security_opt,
        "privileged": lock.privileged,
        "pids_limit": lock.pids_limit,
        "mem_limit": memory,
        "memswap_limit": memory,
        "nano_cpus": lock.cpu_millis * 1_000_000,
        "ipc_mode": lock.ipc,
        "environment": {
            BRIDGE_SOCKET_ENV: f"{CELL_BRIDGE_MOUNT}/bridge.sock",
            CELL_TOKEN_ENV: spec.cell_token,
            # Lets the agent prepare its VM before the leg starts (not a secret).
            MEMORY_LIMIT_ENV: str(spec.memory_limit_bytes),
        },
        "volumes": {spec.bridge_dir: {"bind": CELL_BRIDGE_MOUNT, "mode": "rw"}},
        "labels": {CELL_LABEL: spec.cell_id, INSTANCE_LABEL: instance_id, **config.extra_labels},
        "devices": list(lock.devices),
        "tmpfs": {"/tmp": "ro,size=4k,mode=1777"} if lock.read_only_tmp else {},
        "init": False,
    }
    if config.runtime:
        options["runtime"] = config.runtime
    if spec.ahead and config.ahead_cpu_shares and config.runtime in (None, "runc"):
        # A warm cell's start-up (about 150 ms of CPU in the agent) yields to the cells
        # serving legs; it gets their weight once ready, before any leg can take it. Only
        # under runc: gVisor's runsc refuses the engine's `update` (HTTP 500), which failed
        # every warm cell of a runsc deployment; there cells start at the leg's weight.
        options["cpu_shares"] = config.ahead_cpu_shares
    if config.test_guest_command:
        options["entrypoint"] = list(config.test_guest_command)
    for host_path, container_path in config.test_mounts.items():
        options["volumes"][host_path] = {"bind": container_path, "mode": "ro"}
    for host_path, container_path in config.test_writable_mounts.items():
        options["volumes"][host_path] = {"bind": container_path, "mode": "rw"}
    return options


class DockerCell(Cell):
    """A cell container."""

    def __init__(self, executor: DockerExecutor, container: Any, cell_id: str, events_generation: int = -1, *, low_weight: bool = False) -> None:
        self._executor = executor
        self._container = container
        self.cell_id = cell_id
        self.runtime_id = container.id[:12]
        self._removed = False
        #: Started at ``ahead_cpu_shares`` (a warm cell) and not yet given a leg's weight.
        self._low_weight = low_weight
        #: The engine event stream's generation when the cell was created (-1: not followed then).
        self._events_generation = events_generation

    async def wait(self) -> int:
        # A dedicated pool: one blocked waiter per running cell must never
        # starve the calls that start, kill or remove cells.
        result = await self._executor.run_blocking(self._container.wait, waiter=True)
        return int(result.get("StatusCode", -1))

    async def kill(self) -> None:
        """Kills the container, waiting at most ``CELL_STATE_CHECK_S`` for the engine (the kill goes on; the reaper's removal follows)."""
        try:
            await asyncio.wait_for(self._executor.run_blocking(self._container.kill), timeout=CELL_STATE_CHECK_S)
        except (TimeoutError, docker.errors.APIError):
            pass

    async def out_of_memory(self) -> bool:
        def state() -> bool:
            self._container.reload()
            return bool(self._container.attrs.get("State", {}).get("OOMKilled"))

        try:
            return bool(await asyncio.wait_for(self._executor.run_blocking(state), timeout=CELL_STATE_CHECK_S))
        except (TimeoutError, docker.errors.APIError):
            return False

    async def alive(self) -> bool:
        """Whether the cell still runs, unpaused, as the engine started it.

        Answered without a call to the engine while its event stream has followed
        this cell since before its creation and reported nothing but its creation
        and start (:mod:`._engine_events`); otherwise the engine is asked
        (``docker inspect``), within ``CELL_STATE_CHECK_S`` (no answer: not alive).
        """
        if self._executor.events.vouches_for(self.cell_id, self._events_generation):
            return True

        def state() -> bool:
            self._container.reload()
            info = self._container.attrs.get("State", {})
            return bool(info.get("Running")) and not info.get("Paused") and not info.get("Restarting")

        try:
            return bool(await asyncio.wait_for(self._executor.run_blocking(state), timeout=CELL_STATE_CHECK_S))
        except (TimeoutError, docker.errors.APIError):
            return False

    async def serve_ready(self) -> None:
        if not self._low_weight:
            return
        try:
            await asyncio.wait_for(self._executor.run_blocking(lambda: self._container.update(cpu_shares=LEG_CPU_SHARES)), timeout=CELL_STATE_CHECK_S)
        except (TimeoutError, docker.errors.APIError) as exc:
            raise CellStartError(f"the Docker engine could not give the warm cell its CPU weight ({_short(exc)})") from None
        self._low_weight = False

    async def remove(self) -> None:
        if self._removed:
            return
        self._removed = True
        self._executor.events.forget(self.cell_id)
        try:
            await self._executor.run_blocking(lambda: self._container.remove(force=True))
        except docker.errors.NotFound:
            pass


class DockerExecutor(Executor):
    """Starts each cell as a locked-down Docker container."""

    name = "docker"

    def __init__(self, config: DockerExecutorConfig | None = None, instance_id: str | None = None) -> None:
        super().__init__()
        self.config = config or DockerExecutorConfig()
        self.image = self.config.image
        self._client: Any = None
        self._seccomp_json: str | None = None
        #: Labels every cell of this executor (``io.cellblock.instance``): the service
        #: instance's stable id (kept in its state directory), or a random one.
        self.instance_id = instance_id or secrets.token_hex(8)
        # Blocking Docker SDK calls run in two private pools: API calls
        # (create/start/kill/remove/inspect) and one waiter per live cell.
        self._api_pool = ThreadPoolExecutor(max_workers=API_THREADS, thread_name_prefix="cellblock-docker")
        self._wait_pool = ThreadPoolExecutor(max_workers=WAIT_THREADS, thread_name_prefix="cellblock-cell-wait")
        self._image_ref: str | None = None
        #: The engine's events about this instance's cells (followed from the service's start).
        self.events = EngineEvents(lambda: self._docker().api, f"{INSTANCE_LABEL}={self.instance_id}", CELL_LABEL)

    async def run_blocking(self, fn: Callable[[], Any], *, waiter: bool = False) -> Any:
        """Runs a blocking Docker SDK call in the executor's own thread pools."""
        pool = self._wait_pool if waiter else self._api_pool
        return await asyncio.get_running_loop().run_in_executor(pool, fn)

    @property
    def cell_uid(self) -> int:
        return self.config.lockdown.uid

    def _docker(self) -> Any:
        if self._client is None:
            if self.config.docker_base_url:
                self._client = docker.DockerClient(base_url=self.config.docker_base_url)
            else:
                self._client = docker.from_env()
        return self._client

    def _profile(self) -> str:
        if self._seccomp_json is None:
            path = Path(self.config.seccomp_profile)
            try:
                self._seccomp_json = json.dumps(json.loads(path.read_text("utf-8")), separators=(",", ":"))
            except (OSError, ValueError) as exc:
                raise CellStartError(f"the cell seccomp profile {path} cannot be read ({exc.__class__.__name__})") from None
        return self._seccomp_json

    def _check_sync(self) -> None:
        self._profile()
        try:
            client = self._docker()
            client.ping()
        except Exception as exc:  # noqa: BLE001 - any failure means no engine
            self._client = None
            raise CellStartError(f"the Docker engine is not reachable ({exc.__class__.__name__})") from None
        try:
            image = client.images.get(self.config.image)
        except docker.errors.ImageNotFound:
            raise CellStartError(f"the cell image {self.config.image} is not present; build it with `make image`") from None
        except docker.errors.APIError as exc:
            raise CellStartError(f"the Docker engine refused the image lookup ({exc.__class__.__name__})") from None
        if self.config.runtime:
            runtimes = client.info().get("Runtimes", {})
            if self.config.runtime not in runtimes:
                raise CellStartError(f"the OCI runtime {self.config.runtime} is not configured in the Docker engine")
        if self._image_ref is None:
            # Pin the image by id for this executor's lifetime: re-tagging the
            # name (another `make image`) never switches a running service to
            # another guest build.
            self._image_ref = str(image.id)

    async def check(self) -> None:
        await self.run_blocking(self._check_sync)

    @property
    def image_id(self) -> str | None:
        """The pinned image id (``sha256:...``) once the first check ran."""
        return self._image_ref

    def _start_sync(self, spec: CellSpec) -> DockerCell:
        # Follow the engine's events from the first cell on (idempotent; until the
        # stream is subscribed, liveness asks the engine).
        self.events.start()
        if self._image_ref is None:
            self._check_sync()
        options = container_options(self.config, spec, self._profile(), self.instance_id)
        options["image"] = self._image_ref
        # Registered before the engine creates it: every event about it is seen.
        generation = self.events.register(spec.cell_id)
        try:
            client = self._docker()
            # What ``containers.create`` does, without the inspect it makes after the create
            # (the cell needs only the container's id): one engine call fewer per cell.
            created = client.api.create_container(**_create_container_args({**options, "version": client.api._version}))
            container = client.containers.prepare_model({"Id": created["Id"]})
        except docker.errors.ImageNotFound:
            self.events.forget(spec.cell_id)
            raise CellStartError(f"the cell image {self.config.image} is not present; build it with `make image`") from None
        except Exception as exc:  # noqa: BLE001 - engine unreachable or refused
            self.events.forget(spec.cell_id)
            raise CellStartError(f"the Docker engine could not create the cell ({_short(exc)})") from None
        cell = DockerCell(self, container, spec.cell_id, generation, low_weight="cpu_shares" in options)
        try:
            container.start()
        except Exception as exc:  # noqa: BLE001
            self.events.forget(spec.cell_id)
            try:
                container.remove(force=True)
            except Exception:  # noqa: BLE001
                pass
            raise CellStartError(f"the Docker engine could not start the cell ({_short(exc)})") from None
        return cell

    async def start(self, spec: CellSpec) -> Cell:
        self.cells_started += 1
        cell: Cell = await self.run_blocking(lambda: self._start_sync(spec))
        return cell

    def _remove_orphans_sync(self) -> int:
        # At the service's start: the pool's first cells are followed by the event stream too.
        self.events.start(wait_s=EVENTS_SUBSCRIBE_S)
        found = self._docker().containers.list(all=True, sparse=True, filters={"label": f"{INSTANCE_LABEL}={self.instance_id}"})
        for container in found:
            with contextlib.suppress(docker.errors.NotFound):
                container.remove(force=True)
        return len(found)

    async def remove_orphans(self) -> int:
        """Removes every cell container labelled with this instance's id (SPEC §16.2 item 5).

        Called once at start, before any cell of this incarnation exists: whatever
        carries the label was left by an earlier incarnation that died (SIGKILL, a
        crash), running or stopped. Cells of other instances are never touched.

        Returns:
            How many containers were removed.
        """
        return int(await self.run_blocking(self._remove_orphans_sync))

    def list_cell_containers(self) -> list[str]:
        """Returns the names of every cell container this executor started and still exists."""
        # Sparse listing: no per-container inspect that races with removals.
        found = self._docker().containers.list(all=True, sparse=True, filters={"label": f"{INSTANCE_LABEL}={self.instance_id}"})
        return [str(c.attrs.get("Names", ["?"])[0]).lstrip("/") for c in found]

    async def close(self) -> None:
        await self.reaper.drain()
        self.events.close()
        if self._client is not None:
            # Not through the API pool: its threads may all wait on an engine that stopped answering.
            self._client.close()
            self._client = None
        self._api_pool.shutdown(wait=False, cancel_futures=True)
        self._wait_pool.shutdown(wait=False, cancel_futures=True)


def _short(exc: Exception) -> str:
    """A short reason for [R11] without engine URLs or ids."""
    status = getattr(getattr(exc, "response", None), "status_code", None)
    explanation = getattr(exc, "explanation", None)
    if explanation:
        text = str(explanation).strip().splitlines()[0]
        return (f"HTTP {status}: " if status else "") + text[:160]
    return exc.__class__.__name__ + (f" (HTTP {status})" if status else "")
