"""The project's own checks of Kubernetes objects: the restricted Pod Security profile and the NetworkPolicies.

``restricted_violations`` implements the rules of the Pod Security Standards'
``restricted`` profile (which includes ``baseline``), version ``latest``
(https://kubernetes.io/docs/concepts/security/pod-security-standards/), for a
Pod or any workload with a pod template. The rendered overlays (tests/unit/k8s)
and the Kubernetes API double's admission (tests/support/k8s_double.py) both use
it, so a cell pod the executor builds is checked like one the cluster admits.
"""

from __future__ import annotations

from typing import Any

#: Volume types the restricted profile allows.
RESTRICTED_VOLUMES = {"configMap", "csi", "downwardAPI", "emptyDir", "ephemeral", "persistentVolumeClaim", "projected", "secret"}
_SAFE_SYSCTLS = {"kernel.shm_rmid_forced", "net.ipv4.ip_local_port_range", "net.ipv4.ip_unprivileged_port_start", "net.ipv4.tcp_syncookies", "net.ipv4.ping_group_range", "net.ipv4.ip_local_reserved_ports", "net.ipv4.tcp_keepalive_time", "net.ipv4.tcp_fin_timeout", "net.ipv4.tcp_keepalive_intvl", "net.ipv4.tcp_keepalive_probes"}


def pod_spec_of(obj: dict[str, Any]) -> dict[str, Any] | None:
    """The pod spec of a Pod, a workload's template, or ``None`` for other kinds."""
    kind = obj.get("kind")
    if kind == "Pod":
        return dict(obj.get("spec") or {})
    if kind in ("Deployment", "DaemonSet", "StatefulSet", "ReplicaSet", "Job"):
        return dict(obj["spec"]["template"]["spec"])
    if kind == "CronJob":
        return dict(obj["spec"]["jobTemplate"]["spec"]["template"]["spec"])
    return None


def restricted_violations(obj: dict[str, Any]) -> list[str]:
    """Every way ``obj``'s pod breaks the restricted Pod Security profile (empty when it passes)."""
    spec = pod_spec_of(obj)
    if spec is None:
        return []
    name = f"{obj.get('kind')}/{obj.get('metadata', {}).get('name', '?')}"
    psc = spec.get("securityContext") or {}
    out = _pod_violations(name, spec, psc)
    containers = [*(spec.get("initContainers") or []), *(spec.get("containers") or []), *(spec.get("ephemeralContainers") or [])]
    for c in containers:
        out += _container_violations(f"{name} container {c.get('name')}", c, psc)
    return out


def _pod_violations(name: str, spec: dict[str, Any], psc: dict[str, Any]) -> list[str]:
    out = [f"{name}: {key}" for key in ("hostNetwork", "hostPID", "hostIPC") if spec.get(key)]
    for volume in spec.get("volumes") or []:
        kinds = set(volume) - {"name"}
        if not kinds <= RESTRICTED_VOLUMES:
            out.append(f"{name}: volume {volume.get('name')} of type {sorted(kinds)}")
    out += [f"{name}: sysctl {s.get('name')}" for s in psc.get("sysctls") or [] if s.get("name") not in _SAFE_SYSCTLS]
    if (psc.get("seLinuxOptions") or {}).get("type") not in (None, "", "container_t", "container_init_t", "container_kvm_t", "container_engine_t"):
        out.append(f"{name}: seLinuxOptions.type")
    if (psc.get("appArmorProfile") or {}).get("type") == "Unconfined":
        out.append(f"{name}: appArmorProfile Unconfined")
    if psc.get("runAsUser") == 0:
        out.append(f"{name}: pod runAsUser 0")
    if (psc.get("seccompProfile") or {}).get("type") == "Unconfined":
        out.append(f"{name}: pod seccompProfile Unconfined")
    return out


def _container_violations(cname: str, c: dict[str, Any], psc: dict[str, Any]) -> list[str]:
    csc = c.get("securityContext") or {}
    caps = csc.get("capabilities") or {}
    seccomp = (csc.get("seccompProfile") or {}).get("type") or (psc.get("seccompProfile") or {}).get("type")
    non_root = csc.get("runAsNonRoot") is True or (psc.get("runAsNonRoot") is True and csc.get("runAsNonRoot") is not False)
    checks = [
        (bool(csc.get("privileged")), "privileged"),
        (bool((csc.get("windowsOptions") or {}).get("hostProcess")), "hostProcess"),
        (any(p.get("hostPort") for p in c.get("ports") or []), "hostPort"),
        (csc.get("procMount") not in (None, "Default"), "procMount"),
        (csc.get("allowPrivilegeEscalation") is not False, "allowPrivilegeEscalation must be false"),
        (not non_root, "runAsNonRoot must be true"),
        (csc.get("runAsUser") == 0, "runAsUser 0"),
        (seccomp not in ("RuntimeDefault", "Localhost"), f"seccompProfile must be RuntimeDefault or Localhost (is {seccomp})"),
        ("ALL" not in (caps.get("drop") or []), "capabilities must drop ALL"),
        (bool(set(caps.get("add") or []) - {"NET_BIND_SERVICE"}), f"capabilities add {caps.get('add')}"),
    ]
    return [f"{cname}: {text}" for failed, text in checks if failed]


def selects(selector: dict[str, Any] | None, labels: dict[str, str]) -> bool:
    """Whether a label selector (matchLabels and matchExpressions) selects ``labels``; ``{}`` selects all."""
    selector = selector or {}
    if any(labels.get(k) != v for k, v in (selector.get("matchLabels") or {}).items()):
        return False
    for expr in selector.get("matchExpressions") or []:
        key, op, values = expr["key"], expr["operator"], set(expr.get("values") or [])
        if op == "In" and labels.get(key) not in values:
            return False
        if op == "NotIn" and labels.get(key) in values:
            return False
        if op == "Exists" and key not in labels:
            return False
        if op == "DoesNotExist" and key in labels:
            return False
    return True


def policies_for(objects: list[dict[str, Any]], namespace: str, labels: dict[str, str]) -> list[dict[str, Any]]:
    """NetworkPolicies among ``objects`` that select a pod with ``labels`` in ``namespace``."""
    return [o for o in objects if o.get("kind") == "NetworkPolicy" and o["metadata"].get("namespace") == namespace and selects(o["spec"].get("podSelector"), labels)]
