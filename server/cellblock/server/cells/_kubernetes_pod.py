"""The cell pod: the Kubernetes executor's settings and :func:`pod_manifest` (SPEC §16.3 item 1).

Every security field of the pod derives from the :class:`~cellblock.server.cells._lockdown.Lockdown`
that the Docker container options derive from too (``tests/unit/cells/test_lockdown.py``).
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from cellblock.server.cells._base import CellSpec
from cellblock.server.cells._bridge import BridgeTls
from cellblock.server.cells._lockdown import BRIDGE_ADDRESS_ENV, BRIDGE_TLS_ENV, CELL_TOKEN_ENV, DEFAULT_LOCKDOWN, MEMORY_LIMIT_ENV, Lockdown

CELL_LABEL = "io.cellblock.cell"
INSTANCE_LABEL = "io.cellblock.instance"
REPLICA_LABEL = "io.cellblock.replica"
REPLICA_UID_ANNOTATION = "io.cellblock.replica-uid"
REPLICA_NAMESPACE_ANNOTATION = "io.cellblock.replica-namespace"
#: Labels every cell pod carries; the cells' NetworkPolicy selects them.
CELL_POD_LABELS = {"app.kubernetes.io/name": "cellblock-cell", "app.kubernetes.io/part-of": "cellblock"}
TLS_MOUNT = "/etc/cellblock/bridge-tls"


@dataclass(frozen=True)
class Owner:
    """The replica's own pod (from the downward API), owner of the cells it starts."""

    name: str
    namespace: str
    uid: str


@dataclass(frozen=True)
class KubernetesExecutorConfig:
    """Settings of the Kubernetes executor (``CELLBLOCK_K8S_*``, ``CELLBLOCK_BRIDGE_*``, ``CELLBLOCK_POD_*``).

    Attributes:
        image: The cell image; every node must have it (no registry needed).
        namespace: Namespace of the cell pods (``cellblock-cells``).
        runtime_class: RuntimeClass of the cell pods (``runsc``, gVisor), or ``None``.
        image_pull_policy: ``IfNotPresent`` or ``Never`` (images loaded into nodes).
        bridge_bind: ``host:port`` the replica's bridge port listens on.
        bridge_advertise: ``host:port`` the cells dial (the replica's pod IP).
        bridge_tls: Mutual TLS of the bridge port, or ``None``.
        cell_tls_secret: Secret in the cells namespace with the cells' client
            certificate (``ca.crt``, ``tls.crt``, ``tls.key``), mounted read-only.
        tls_server_name: Name in the replica's certificate the cells verify.
        active_deadline_s: ``activeDeadlineSeconds`` of a cell pod: the longest
            a cell may exist (warm wait + the longest leg + reuse age + grace).
        owner: The replica's pod, or ``None`` outside a cluster.
        api_url: The API server URL with no credentials (tests, ``kubectl
            proxy``); ``None`` uses in-cluster credentials or ``KUBECONFIG``.
        lockdown: The cell lockdown; ``CELLBLOCK_SECCOMP_PROFILE`` names the
            profile file the replica hashes (the nodes hold the same file).
    """

    image: str = "cellblock-cell:dev"
    namespace: str = "cellblock-cells"
    runtime_class: str | None = None
    image_pull_policy: str = "IfNotPresent"
    bridge_bind: str = "0.0.0.0:50052"
    bridge_advertise: str = ""
    bridge_tls: BridgeTls | None = None
    cell_tls_secret: str | None = None
    tls_server_name: str = "cellblock-bridge"
    active_deadline_s: int = 900
    owner: Owner | None = None
    api_url: str | None = None
    lockdown: Lockdown = DEFAULT_LOCKDOWN
    extra_labels: dict[str, str] = field(default_factory=dict)

    @classmethod
    def from_env(cls, env: dict[str, str], *, image: str, runtime_class: str | None) -> KubernetesExecutorConfig:
        """Reads the executor's variables (README, "Kubernetes").

        Raises:
            ValueError: A TLS file is named without the other two, or no
                advertised bridge address can be derived.
        """
        base = cls()
        bind = env.get("CELLBLOCK_BRIDGE_BIND", base.bridge_bind)
        advertise = env.get("CELLBLOCK_BRIDGE_ADVERTISE", "")
        if not advertise and env.get("CELLBLOCK_POD_IP"):
            advertise = f"{env['CELLBLOCK_POD_IP']}:{bind.rsplit(':', 1)[1]}"
        tls_paths = [env.get(f"CELLBLOCK_BRIDGE_TLS_{part}", "") for part in ("CA", "CERT", "KEY")]
        if any(tls_paths) and not all(tls_paths):
            raise ValueError("CELLBLOCK_BRIDGE_TLS_CA, _CERT and _KEY are set together or not at all")
        owner = None
        if env.get("CELLBLOCK_POD_NAME") and env.get("CELLBLOCK_POD_UID"):
            owner = Owner(env["CELLBLOCK_POD_NAME"], env.get("CELLBLOCK_POD_NAMESPACE", "cellblock-system"), env["CELLBLOCK_POD_UID"])
        return cls(
            image=image,
            namespace=env.get("CELLBLOCK_K8S_NAMESPACE", base.namespace),
            runtime_class=runtime_class,
            image_pull_policy=env.get("CELLBLOCK_K8S_IMAGE_PULL_POLICY", base.image_pull_policy),
            bridge_bind=bind,
            bridge_advertise=advertise,
            bridge_tls=BridgeTls(*map(Path, tls_paths)) if all(tls_paths) else None,
            cell_tls_secret=env.get("CELLBLOCK_K8S_CELL_TLS_SECRET") or None,
            tls_server_name=env.get("CELLBLOCK_BRIDGE_TLS_NAME", base.tls_server_name),
            active_deadline_s=int(env.get("CELLBLOCK_K8S_ACTIVE_DEADLINE_S", base.active_deadline_s)),
            owner=owner,
            api_url=env.get("CELLBLOCK_K8S_API") or None,
            lockdown=replace(DEFAULT_LOCKDOWN, seccomp_profile=Path(env["CELLBLOCK_SECCOMP_PROFILE"])) if env.get("CELLBLOCK_SECCOMP_PROFILE") else DEFAULT_LOCKDOWN,
        )


def pod_name(cell_id: str) -> str:
    """The pod of a cell: ``cellblock-cell-<16 hex>`` (DNS-1123)."""
    return "cellblock-" + cell_id.replace("_", "-")


def pod_manifest(config: KubernetesExecutorConfig, spec: CellSpec, *, bridge_address: str, instance_id: str) -> dict[str, Any]:
    """The pod of one cell, every security field derived from ``config.lockdown`` (SPEC §15 item 1, §16.3 item 1).

    Args:
        config: The executor's settings.
        spec: The cell (id, token, the leg's heap limit in bytes).
        bridge_address: ``host:port`` of the replica's bridge port.
        instance_id: The executor instance (label for its watch).

    Returns:
        A ``v1/Pod`` as a JSON-ready dict that passes the restricted Pod
        Security profile.
    """
    lock = config.lockdown
    memory = str(lock.memory_bytes(spec.memory_limit_bytes))
    seccomp = {"type": "Localhost", "localhostProfile": lock.seccomp_localhost_name}
    limits = {"cpu": f"{lock.cpu_millis}m", "memory": memory, "ephemeral-storage": str(lock.ephemeral_storage_bytes)}
    env = [
        {"name": BRIDGE_ADDRESS_ENV, "value": bridge_address},
        {"name": CELL_TOKEN_ENV, "value": spec.cell_token},
        {"name": MEMORY_LIMIT_ENV, "value": str(spec.memory_limit_bytes)},
    ]
    container: dict[str, Any] = {
        "name": "cell",
        "image": config.image,
        "imagePullPolicy": config.image_pull_policy,
        "env": env,
        "resources": {"limits": limits, "requests": dict(limits)},
        "securityContext": {
            "runAsNonRoot": True,
            "runAsUser": lock.uid,
            "runAsGroup": lock.uid,
            "readOnlyRootFilesystem": lock.read_only_root,
            "allowPrivilegeEscalation": not lock.no_new_privileges,
            "privileged": lock.privileged,
            "capabilities": {"drop": list(lock.drop_capabilities)},
            "seccompProfile": dict(seccomp),
        },
        "terminationMessagePolicy": "File",
    }
    pod_spec: dict[str, Any] = {
        "restartPolicy": "Never",
        "automountServiceAccountToken": False,
        # Service links would put every service's address into the cell's environment.
        "enableServiceLinks": False,
        "hostNetwork": lock.host_namespaces,
        "hostPID": lock.host_namespaces,
        "hostIPC": lock.host_namespaces,
        "shareProcessNamespace": False,
        "activeDeadlineSeconds": config.active_deadline_s,
        "terminationGracePeriodSeconds": 0,
        "securityContext": {"runAsNonRoot": True, "runAsUser": lock.uid, "runAsGroup": lock.uid, "seccompProfile": seccomp},
        "containers": [container],
    }
    if config.runtime_class:
        pod_spec["runtimeClassName"] = config.runtime_class
    volumes: list[dict[str, Any]] = []
    mounts: list[dict[str, Any]] = []
    if lock.read_only_tmp:
        volumes.append({"name": "tmp", "emptyDir": {"medium": "Memory", "sizeLimit": "4Ki"}})
        mounts.append({"name": "tmp", "mountPath": "/tmp", "readOnly": True})
    if config.cell_tls_secret:
        volumes.append({"name": "bridge-tls", "secret": {"secretName": config.cell_tls_secret, "defaultMode": 0o440}})
        mounts.append({"name": "bridge-tls", "mountPath": TLS_MOUNT, "readOnly": True})
        env.extend({"name": name, "value": f"{TLS_MOUNT}/{file}"} for name, file in zip(BRIDGE_TLS_ENV, ("ca.crt", "tls.crt", "tls.key"), strict=True))
        env.append({"name": "CELLBLOCK_BRIDGE_TLS_NAME", "value": config.tls_server_name})
    if volumes:
        pod_spec["volumes"] = volumes
        container["volumeMounts"] = mounts
    labels = {**CELL_POD_LABELS, "app.kubernetes.io/component": "cell", CELL_LABEL: spec.cell_id, INSTANCE_LABEL: instance_id, **config.extra_labels}
    annotations = {"io.cellblock.seccomp-sha256": lock.seccomp_sha256()}
    metadata: dict[str, Any] = {"name": pod_name(spec.cell_id), "namespace": config.namespace, "labels": labels, "annotations": annotations}
    owner = config.owner
    if owner is not None:
        labels[REPLICA_LABEL] = owner.name
        annotations[REPLICA_UID_ANNOTATION] = owner.uid
        annotations[REPLICA_NAMESPACE_ANNOTATION] = owner.namespace
        if owner.namespace == config.namespace:
            metadata["ownerReferences"] = [{"apiVersion": "v1", "kind": "Pod", "name": owner.name, "uid": owner.uid, "controller": False, "blockOwnerDeletion": False}]
    return {"apiVersion": "v1", "kind": "Pod", "metadata": metadata, "spec": pod_spec}
