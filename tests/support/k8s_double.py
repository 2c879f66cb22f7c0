"""KubernetesApiDouble: a test double of the Kubernetes API server and kubelet, for the pod calls the executor makes.

This machine cannot run a Kubernetes cluster, so the executor's tests talk to this
double instead (it is named as one everywhere it is used). It serves, over real
HTTP on 127.0.0.1, the subset of ``/api/v1`` the Kubernetes executor uses: create,
get, list (label selectors), watch (resourceVersion, streamed JSON lines) and delete
(``gracePeriodSeconds``) of pods. Like a cluster it:

- admits a pod only when it passes the restricted Pod Security profile
  (``tests.support.k8s_policy``), answering 403 otherwise;
- "runs" the pod like a kubelet: its container's command becomes a real local
  process (the real guest agent, ``python -m cellblock.guest``) with exactly the
  pod's ``env``, so the agent dials the real TCP bridge; phases go
  Pending → Running → Succeeded/Failed with the exit code;
- leaves a pod whose Localhost seccomp profile the node lacks Pending with
  ``CreateContainerError`` (:attr:`node_profiles`);
- enforces ``activeDeadlineSeconds`` and garbage-collects pods whose owner
  reference names a deleted pod of the same namespace, and, like the real garbage
  collector, a pod whose owner reference names another namespace.

What it does not do: scheduling, images, cgroups, NetworkPolicies, seccomp. Those
need a real cluster (``make test-k8s``).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import sys
import time
import uuid
from pathlib import Path
from typing import Any

from aiohttp import web

from tests.support.k8s_policy import restricted_violations, selects

ROOT = Path(__file__).resolve().parents[2]


def _selector(text: str) -> dict[str, Any]:
    labels: dict[str, str] = {}
    exprs: list[dict[str, Any]] = []
    for part in filter(None, text.split(",")):
        if "=" in part:
            key, value = part.split("=", 1)
            labels[key.rstrip("=")] = value.lstrip("=")
        else:
            exprs.append({"key": part, "operator": "Exists"})
    return {"matchLabels": labels, "matchExpressions": exprs}


class KubernetesApiDouble:
    """The double. ``url`` is its base URL once :meth:`start` returned.

    Attributes:
        pods: Live pods by ``(namespace, name)``.
        deletes: ``(namespace, name, gracePeriodSeconds)`` of every DELETE received.
        created: Every pod body admitted, in order.
        refused: Every pod body refused by admission.
    """

    def __init__(self) -> None:
        self.pods: dict[tuple[str, str], dict[str, Any]] = {}
        self.deletes: list[tuple[str, str, int | None]] = []
        self.created: list[dict[str, Any]] = []
        self.refused: list[dict[str, Any]] = []
        self._procs: dict[tuple[str, str], asyncio.subprocess.Process] = {}
        self._tasks: set[asyncio.Task[Any]] = set()
        self._events: list[tuple[int, str, dict[str, Any]]] = []
        self._changed = asyncio.Condition()
        self._rv = 0
        self._runner: web.AppRunner | None = None
        self._closed = False
        #: Added to every container's env (files a cluster would mount from a Secret).
        self.extra_env: dict[str, str] = {}
        #: Localhost seccomp profiles the "node" has (``/var/lib/kubelet/seccomp/<name>``); a pod
        #: naming another stays Pending with CreateContainerError, as on a real node.
        self.node_profiles: set[str] = {"profiles/cellblock-cell.json"}
        self.url = ""
        #: Seconds every DELETE of a pod waits before the double acts on it (an API server slow to answer).
        self.delete_delay_s = 0.0

    # ------------------------------------------------------------ server
    async def start(self) -> None:
        app = web.Application()
        app.router.add_get("/api/v1/namespaces/{ns}/pods", self._list)
        app.router.add_post("/api/v1/namespaces/{ns}/pods", self._create)
        app.router.add_get("/api/v1/namespaces/{ns}/pods/{name}", self._get)
        app.router.add_delete("/api/v1/namespaces/{ns}/pods/{name}", self._delete)
        self._runner = web.AppRunner(app)
        await self._runner.setup()
        site = web.TCPSite(self._runner, "127.0.0.1", 0)
        await site.start()
        port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
        self.url = f"http://127.0.0.1:{port}"

    async def close(self) -> None:
        self._closed = True
        async with self._changed:
            self._changed.notify_all()
        for key in list(self._procs):
            await self._kill(key)
        for task in list(self._tasks):
            task.cancel()
        if self._runner is not None:
            await self._runner.cleanup()

    # ------------------------------------------------------------ state
    async def _record(self, kind: str, pod: dict[str, Any]) -> None:
        self._rv += 1
        pod["metadata"]["resourceVersion"] = str(self._rv)
        self._events.append((self._rv, kind, json.loads(json.dumps(pod))))
        async with self._changed:
            self._changed.notify_all()

    def add_pod(self, namespace: str, name: str, labels: dict[str, str] | None = None) -> dict[str, Any]:
        """Adds a running pod that runs nothing (a replica's own pod, for owner tests)."""
        pod = {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name, "namespace": namespace, "uid": str(uuid.uuid4()), "labels": labels or {}}, "spec": {}, "status": {"phase": "Running"}}
        self.pods[(namespace, name)] = pod
        return pod

    async def delete_pod(self, namespace: str, name: str) -> None:
        """Deletes a pod as a user would (``kubectl delete``), then garbage-collects its dependents."""
        pod = self.pods.pop((namespace, name), None)
        if pod is None:
            return
        await self._kill((namespace, name))
        await self._record("DELETED", pod)
        await self._collect_garbage()

    async def _collect_garbage(self) -> None:
        for (ns, name), pod in list(self.pods.items()):
            for ref in pod["metadata"].get("ownerReferences") or []:
                owner = self.pods.get((ns, ref["name"]))
                # Owners are looked up in the dependent's namespace only (as the real collector does).
                if owner is None or owner["metadata"]["uid"] != ref["uid"]:
                    await self.delete_pod(ns, name)
                    break

    async def _kill(self, key: tuple[str, str]) -> None:
        proc = self._procs.pop(key, None)
        if proc is not None and proc.returncode is None:
            with contextlib.suppress(ProcessLookupError):
                proc.kill()
            await proc.wait()

    def _spawn(self, coro: Any) -> None:
        task = asyncio.ensure_future(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _kubelet(self, key: tuple[str, str]) -> None:
        """Runs the pod's container as a local process with exactly the pod's env."""
        pod = self.pods[key]
        container = pod["spec"]["containers"][0]
        profile = (container.get("securityContext", {}).get("seccompProfile") or pod["spec"].get("securityContext", {}).get("seccompProfile") or {}).get("localhostProfile")
        if profile is not None and profile not in self.node_profiles:
            pod["status"] = {"phase": "Pending", "containerStatuses": [self._status(pod, {"waiting": {"reason": "CreateContainerError", "message": f"cannot load seccomp profile {profile}"}})]}
            await self._record("MODIFIED", pod)
            return
        env = {e["name"]: e["value"] for e in container.get("env", [])} | self.extra_env
        # What the image's ENV lines provide (sandbox-image/Dockerfile).
        env.update({"PATH": "/usr/bin:/bin", "PYTHONPATH": f"{ROOT / 'sandbox-image' / 'guest'}:{ROOT / 'proto'}", "PYTHONDONTWRITEBYTECODE": "1"})
        proc = await asyncio.create_subprocess_exec(sys.executable, "-m", "cellblock.guest", env=env)
        self._procs[key] = proc
        if key not in self.pods:
            await self._kill(key)
            return
        pod["status"] = {"phase": "Running", "containerStatuses": [self._status(pod, {"running": {}})]}
        await self._record("MODIFIED", pod)
        deadline = pod["spec"].get("activeDeadlineSeconds")
        try:
            code = await asyncio.wait_for(proc.wait(), timeout=deadline)
            reason = ""
        except TimeoutError:
            await self._kill(key)
            code, reason = 137, "DeadlineExceeded"
        if key in self.pods:
            pod["status"] = {"phase": "Succeeded" if code == 0 else "Failed", "reason": reason, "containerStatuses": [self._status(pod, {"terminated": {"exitCode": code}})]}
            await self._record("MODIFIED", pod)

    @staticmethod
    def _status(pod: dict[str, Any], state: dict[str, Any]) -> dict[str, Any]:
        """A containerStatus with every field the API marks required."""
        image = pod["spec"]["containers"][0]["image"]
        return {"name": "cell", "image": image, "imageID": f"docker-pullable://{image}", "ready": "running" in state, "restartCount": 0, "state": state}

    # ------------------------------------------------------------ handlers
    async def _create(self, request: web.Request) -> web.Response:
        ns = request.match_info["ns"]
        body = await request.json()
        violations = restricted_violations(body)
        if violations:
            self.refused.append(body)
            return web.json_response({"kind": "Status", "status": "Failure", "reason": "Forbidden", "message": "violates PodSecurity restricted: " + "; ".join(violations), "code": 403}, status=403)
        name = body["metadata"]["name"]
        if (ns, name) in self.pods:
            return web.json_response({"kind": "Status", "reason": "AlreadyExists", "code": 409}, status=409)
        body["metadata"].update({"namespace": ns, "uid": str(uuid.uuid4()), "creationTimestamp": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())})
        body["status"] = {"phase": "Pending"}
        self.pods[(ns, name)] = body
        self.created.append(json.loads(json.dumps(body)))
        await self._record("ADDED", body)
        await self._collect_garbage()
        if (ns, name) in self.pods:
            self._spawn(self._kubelet((ns, name)))
        return web.json_response(body, status=201)

    async def _get(self, request: web.Request) -> web.Response:
        pod = self.pods.get((request.match_info["ns"], request.match_info["name"]))
        if pod is None:
            return web.json_response({"kind": "Status", "reason": "NotFound", "code": 404}, status=404)
        return web.json_response(pod)

    async def _delete(self, request: web.Request) -> web.Response:
        ns, name = request.match_info["ns"], request.match_info["name"]
        grace = request.query.get("gracePeriodSeconds")
        self.deletes.append((ns, name, int(grace) if grace is not None else None))
        if self.delete_delay_s:
            await asyncio.sleep(self.delete_delay_s)
        pod = self.pods.get((ns, name))
        if pod is None:
            return web.json_response({"kind": "Status", "reason": "NotFound", "code": 404}, status=404)
        await self.delete_pod(ns, name)
        return web.json_response(pod)

    async def _list(self, request: web.Request) -> web.StreamResponse:
        ns = request.match_info["ns"]
        selector = _selector(request.query.get("labelSelector", ""))

        def matches(pod: dict[str, Any]) -> bool:
            return pod["metadata"]["namespace"] == ns and selects(selector, pod["metadata"].get("labels") or {})

        if request.query.get("watch") not in ("true", "1", "True"):
            items = [p for p in self.pods.values() if matches(p)]
            return web.json_response({"kind": "PodList", "apiVersion": "v1", "metadata": {"resourceVersion": str(self._rv)}, "items": items})
        since = int(request.query.get("resourceVersion") or self._rv)
        timeout = float(request.query.get("timeoutSeconds", "300"))
        response = web.StreamResponse(headers={"Content-Type": "application/json"})
        await response.prepare(request)
        end = time.monotonic() + timeout
        sent = since
        with contextlib.suppress(ConnectionResetError, asyncio.CancelledError):
            while time.monotonic() < end and not self._closed:
                for rv, kind, pod in [e for e in self._events if e[0] > sent]:
                    sent = rv
                    if matches(pod):
                        await response.write((json.dumps({"type": kind, "object": pod}) + "\n").encode())
                async with self._changed:
                    with contextlib.suppress(TimeoutError):
                        await asyncio.wait_for(self._changed.wait(), timeout=max(0.01, end - time.monotonic()))
        return response
