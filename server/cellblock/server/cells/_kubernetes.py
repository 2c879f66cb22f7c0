"""The Kubernetes executor: one locked-down bare pod per cell (SPEC §16.3, DESIGN.md §4).

Each cell is a pod in the cells namespace whose fields all derive from the
:class:`~cellblock.server.cells._lockdown.Lockdown` (``_kubernetes_pod.pod_manifest``). Its
guest agent dials the replica's bridge port (:class:`BridgeListener`) and
authenticates with its one-time token. One watch per executor follows the
pods' phases; the host watchdog deletes a pod with grace 0.

Owner references: Kubernetes garbage collection ignores an owner in another
namespace (and then deletes the dependent), so a cell pod carries an owner
reference to its replica's pod only when both share a namespace. Otherwise
every replica sweeps the cells of replicas whose pod is gone
(:meth:`KubernetesExecutor.sweep_orphans`), and ``activeDeadlineSeconds``
bounds every cell's life either way.

The API client is ``kubernetes_asyncio`` (the asyncio flavour of the
OpenAPI-generated official client), so no Kubernetes call blocks the loop.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import secrets
from typing import Any

import structlog

from cellblock.server.cells._base import Cell, CellSpec, CellStartError, Executor
from cellblock.server.cells._bridge import DEFAULT_MAX_MESSAGE_BYTES, BridgeListener, CellBridge
from cellblock.server.cells._kubernetes_pod import (
    INSTANCE_LABEL,
    REPLICA_LABEL,
    REPLICA_NAMESPACE_ANNOTATION,
    REPLICA_UID_ANNOTATION,
    KubernetesExecutorConfig,
    pod_manifest,
)
from cellblock.server.limits import CELL_STATE_CHECK_S

log = structlog.get_logger("cellblock.kubernetes")

#: Container states that never start the cell: the leg ends at once.
_FATAL_WAITING = {"ErrImagePull", "ImagePullBackOff", "InvalidImageName", "CreateContainerConfigError", "CreateContainerError", "RunContainerError", "ErrImageNeverPull"}
#: Exit code reported for a pod deleted before it finished, or one that can never start.
EXIT_DELETED = 137
EXIT_NEVER_STARTED = 126
SWEEP_INTERVAL_S = 60.0


class KubernetesCell(Cell):
    """A cell pod."""

    def __init__(self, executor: KubernetesExecutor, name: str, cell_id: str, exited: asyncio.Future[int]) -> None:
        self._executor = executor
        self._name = name
        self._exited = exited
        self.cell_id = cell_id
        self.runtime_id = name
        self._removed = False
        #: The pod's deletion by :meth:`kill` (kept referenced while it outlives the kill's wait).
        self._killing: asyncio.Future[None] | None = None

    async def wait(self) -> int:
        return await asyncio.shield(self._exited)

    async def kill(self) -> None:
        """Deletes the pod (grace 0), waiting at most ``CELL_STATE_CHECK_S`` for the API (the deletion goes on; :meth:`remove` follows)."""
        self._killing = deleting = asyncio.ensure_future(self._executor.delete_pod(self._name))
        done, _ = await asyncio.wait({deleting}, timeout=CELL_STATE_CHECK_S)
        if not done:
            log.warning("cell.kill_slow", pod=self._name, wait_s=CELL_STATE_CHECK_S)

    async def remove(self) -> None:
        if self._removed:
            return
        self._removed = True
        await self._executor.delete_pod(self._name)
        self._executor.forget(self._name)


class KubernetesExecutor(Executor):
    """Starts each cell as a locked-down bare pod; the cells dial this replica's bridge port."""

    name = "kubernetes"

    def __init__(self, config: KubernetesExecutorConfig) -> None:
        super().__init__()
        self.config = config
        self.image = config.image
        self.instance_id = secrets.token_hex(8)
        self.listener = BridgeListener(config.bridge_bind, tls=config.bridge_tls)
        self._api: Any = None
        self._core: Any = None
        self._exits: dict[str, asyncio.Future[int]] = {}
        self._tasks: list[asyncio.Task[None]] = []
        self._ready = False

    @property
    def cell_uid(self) -> int:
        return self.config.lockdown.uid

    @property
    def bridge_address(self) -> str:
        """What cells dial: the advertised address, else the bound port on 127.0.0.1."""
        return self.config.bridge_advertise or f"127.0.0.1:{self.listener.port}"

    async def _client(self) -> Any:
        if self._core is None:
            from kubernetes_asyncio import client, config

            configuration = client.Configuration()
            if self.config.api_url:
                configuration.host = self.config.api_url
            elif os.environ.get("KUBERNETES_SERVICE_HOST"):
                config.load_incluster_config(client_configuration=configuration)  # type: ignore[no-untyped-call]  # untyped in kubernetes_asyncio
            else:
                await config.load_kube_config(client_configuration=configuration)
            self._api = client.ApiClient(configuration)
            self._core = client.CoreV1Api(self._api)
        return self._core

    async def check(self) -> None:
        try:
            self.config.lockdown.seccomp_sha256()
        except OSError as exc:
            raise CellStartError(f"the cell seccomp profile cannot be read ({exc.__class__.__name__})") from None
        try:
            await self.listener.start()
        except OSError as exc:
            raise CellStartError(str(exc)) from None
        try:
            core = await self._client()
            await _json(await core.list_namespaced_pod(self.config.namespace, limit=1, label_selector=f"{INSTANCE_LABEL}={self.instance_id}", _preload_content=False))
        except Exception as exc:  # noqa: BLE001 - any failure means no cluster
            raise CellStartError(f"the Kubernetes API is not reachable or refuses pod access in {self.config.namespace} ({_short(exc)})") from None
        if not self._ready:
            self._ready = True
            self._tasks.append(asyncio.ensure_future(self._watch_forever()))
            if self.config.owner is not None and self.config.owner.namespace != self.config.namespace:
                self._tasks.append(asyncio.ensure_future(self._sweep_forever()))

    async def open_bridge(self, base_dir: str, max_message_bytes: int = DEFAULT_MAX_MESSAGE_BYTES, *, ping: bool = False) -> CellBridge:
        await self.listener.start()
        return self.listener.open()

    async def start(self, spec: CellSpec) -> Cell:
        self.cells_started += 1
        if not self._ready:
            await self.check()
        body = pod_manifest(self.config, spec, bridge_address=self.bridge_address, instance_id=self.instance_id)
        name = body["metadata"]["name"]
        # Registered before the pod exists: the watch may report it at once.
        exited: asyncio.Future[int] = asyncio.get_running_loop().create_future()
        self._exits[name] = exited
        try:
            await _json(await self._core.create_namespaced_pod(self.config.namespace, body, _preload_content=False))
        except Exception as exc:  # noqa: BLE001 - API unreachable or refused (admission)
            self._exits.pop(name, None)
            raise CellStartError(f"the Kubernetes API refused the cell pod ({_short(exc)})") from None
        return KubernetesCell(self, name, spec.cell_id, exited)

    async def delete_pod(self, name: str) -> None:
        """Deletes a cell pod at once (grace 0); a pod already gone is fine."""
        from kubernetes_asyncio.client.exceptions import ApiException

        try:
            await _json(await self._core.delete_namespaced_pod(name, self.config.namespace, grace_period_seconds=0, _preload_content=False))
        except ApiException as exc:
            if exc.status != 404:
                log.error("cell.delete_failed", pod=name, status=exc.status)
        except Exception as exc:  # noqa: BLE001 - cleanup goes on
            log.error("cell.delete_failed", pod=name, error=exc.__class__.__name__)

    def forget(self, name: str) -> None:
        """Stops tracking a removed cell pod."""
        future = self._exits.pop(name, None)
        if future is not None and not future.done():
            future.set_result(EXIT_DELETED)

    def _apply(self, kind: str, pod: dict[str, Any]) -> None:
        name = str(pod.get("metadata", {}).get("name", ""))
        future = self._exits.get(name)
        if future is None or future.done():
            return
        status = pod.get("status") or {}
        states = [c.get("state") or {} for c in status.get("containerStatuses") or []]
        terminated = next((s["terminated"] for s in states if s.get("terminated")), None)
        if status.get("phase") in ("Succeeded", "Failed") or terminated is not None:
            future.set_result(int((terminated or {}).get("exitCode", 1)))
        elif kind == "DELETED":
            future.set_result(EXIT_DELETED)
        else:
            reason = next((s["waiting"].get("reason", "") for s in states if s.get("waiting")), "")
            if reason in _FATAL_WAITING:
                log.error("cell.cannot_start", pod=name, reason=reason)
                future.set_result(EXIT_NEVER_STARTED)

    async def _watch_forever(self) -> None:
        """Lists, then watches, this executor's cell pods; re-lists after any break."""
        from kubernetes_asyncio import watch

        selector = f"{INSTANCE_LABEL}={self.instance_id}"
        while True:
            try:
                listing = await _json(await self._core.list_namespaced_pod(self.config.namespace, label_selector=selector, _preload_content=False))
                for pod in listing.get("items", []):
                    self._apply("ADDED", pod)
                version = listing.get("metadata", {}).get("resourceVersion")
                async with watch.Watch(return_type="object").stream(self._core.list_namespaced_pod, self.config.namespace, label_selector=selector, resource_version=version, timeout_seconds=300) as stream:
                    async for event in stream:
                        self._apply(str(event["type"]), event["raw_object"])
            except asyncio.CancelledError:
                raise
            except Exception as exc:  # noqa: BLE001 - re-list and go on
                log.warning("cells.watch_restart", error=_short(exc))
                await asyncio.sleep(1.0)

    async def sweep_orphans(self) -> int:
        """Deletes cell pods whose replica pod is gone (or was replaced); returns how many.

        Needed when the cells namespace differs from the replicas' namespace,
        where owner references do not apply.
        """
        from kubernetes_asyncio.client.exceptions import ApiException

        pods = (await _json(await self._core.list_namespaced_pod(self.config.namespace, label_selector=REPLICA_LABEL, _preload_content=False))).get("items", [])
        alive: dict[tuple[str, str], str | None] = {}
        removed = 0
        for pod in pods:
            meta = pod.get("metadata", {})
            replica = (meta.get("annotations", {}).get(REPLICA_NAMESPACE_ANNOTATION, ""), meta.get("labels", {}).get(REPLICA_LABEL, ""))
            if replica not in alive:
                try:
                    owner = await _json(await self._core.read_namespaced_pod(replica[1], replica[0], _preload_content=False))
                    alive[replica] = owner.get("metadata", {}).get("uid")
                except ApiException as exc:
                    if exc.status != 404:
                        raise
                    alive[replica] = None
            if alive[replica] != meta.get("annotations", {}).get(REPLICA_UID_ANNOTATION):
                await self.delete_pod(str(meta.get("name")))
                removed += 1
        if removed:
            log.info("cells.orphans_removed", count=removed)
        return removed

    async def _sweep_forever(self) -> None:
        while True:
            try:
                await self.sweep_orphans()
            except asyncio.CancelledError:
                raise
            except Exception as exc:  # noqa: BLE001 - try again later
                log.warning("cells.sweep_failed", error=_short(exc))
            await asyncio.sleep(SWEEP_INTERVAL_S)

    async def close(self) -> None:
        for task in self._tasks:
            task.cancel()
        for task in self._tasks:
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await task
        self._tasks.clear()
        await self.listener.close()
        if self._api is not None:
            await self._api.close()
            self._api = self._core = None


async def _json(response: Any) -> dict[str, Any]:
    """The JSON body of a raw (``_preload_content=False``) response.

    Raw responses skip the client's model classes (which reject objects that
    omit fields they mark required) but also its status check, done here.

    Raises:
        ApiException: The API answered with a non-2xx status.
    """
    from kubernetes_asyncio.client.exceptions import ApiException

    body = await response.read()
    if not 200 <= response.status < 300:
        try:
            message = str(json.loads(body).get("message", ""))
        except ValueError:
            message = ""
        raise ApiException(status=response.status, reason=message or response.reason)
    return dict(json.loads(body or b"{}"))


def _short(exc: Exception) -> str:
    """A short reason for [R11] without URLs or tokens."""
    status = getattr(exc, "status", None)
    reason = getattr(exc, "reason", None)
    if status is not None:
        return f"HTTP {status}" + (f": {str(reason)[:120]}" if reason else "")
    return exc.__class__.__name__
