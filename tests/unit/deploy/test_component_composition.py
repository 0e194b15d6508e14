"""Every component under deploy/kustomize/components composes: alone, every compatible pair in
both orders, and all compatible ones per overlay. Whatever the set: nothing points at the
default namespace when installed elsewhere (every NATS URL names a server of the install that
its certificate covers), every pod that dials NATS is admitted by the NetworkPolicy fencing
it, every object carries the label `kubectl apply --prune -l app.kubernetes.io/part-of=dra-suite`
selects, and every object is valid for each supported Kubernetes version.

Pairs render in another namespace only (a kubectl call each, ~0.2 s): in the default namespace
a set renders the same but for the namespace, which the single components and the full sets
show in both."""

from __future__ import annotations

import functools
import itertools
import json
import os
import re
import subprocess
import tempfile
from pathlib import Path
from typing import Any

import jsonschema
import kubernetes_validate
import pytest
import yaml

from tests.unit.deploy.manifests import (
    KUBE_VERSIONS,
    KUBECTL,
    KUSTOMIZE,
    OVERLAYS,
    _of_kind,
    _resolved_env,
    is_kubernetes,
)
from tests.unit.deploy.test_cert_manager_component import SCHEMAS as CERT_MANAGER_SCHEMAS
from tests.unit.deploy.test_install_components import (
    POD_MONITOR_SCHEMA,
    PROMETHEUS_RULE_SCHEMA,
    _selects,
)
from tests.unit.deploy.test_install_namespace import (
    CLUSTER_SCOPED,
    OLD_NAMESPACE_IN_TEXT,
    _strings,
)

pytestmark = pytest.mark.skipif(KUBECTL is None, reason="needs kubectl (kustomize)")

Obj = dict[str, Any]
Objects = tuple[Obj, ...]

DEFAULT_NAMESPACE, OTHER_NAMESPACE = "dra-suite", "gpu-system"
PART_OF = ("app.kubernetes.io/part-of", "dra-suite")
COMPONENTS = sorted(p.name for p in (KUSTOMIZE / "components").iterdir() if p.is_dir())
ONLY_FOR = {  # component -> the overlays it is made for (the others: every overlay)
    "nfd-nvidia": ("nvidia",),
    "nvidia-arm64": ("nvidia",),
    "nvidia-driver-root": ("nvidia",),
    "nfd-ascend": ("ascend",),
}
EXCLUSIVE = ({"kubelet-root-k0s", "kubelet-root-microk8s"},)  # one kubelet root per node
# Documented orders (the component's kustomization.yaml): listed after device-plugin, these
# reach its DaemonSet too; listed before, they leave it as it is.
ORDER_MATTERS = {
    frozenset({"device-plugin", "image-pull-secret"}),
    frozenset({"device-plugin", "nfd-nvidia"}),
    frozenset({"device-plugin", "nfd-ascend"}),
}
K8S_136 = "k8s-1.36"
"""The overlay's own component with what needs Kubernetes 1.36 (overlays/<overlay>/k8s-1.36)."""

Case = tuple[str, tuple[str, ...]]  # (overlay, components)


def _overlays(components: tuple[str, ...]) -> list[str]:
    return [o for o in OVERLAYS if all(o in ONLY_FOR.get(c, OVERLAYS) for c in components)]


def _overlay(components: tuple[str, ...]) -> str:
    """nvidia (the overlay with the most to patch) where the components fit it."""
    fits = _overlays(components)
    return "nvidia" if "nvidia" in fits else fits[0]


def _compatible(components: tuple[str, ...]) -> bool:
    return bool(_overlays(components)) and not any(
        len(group & set(components)) > 1 for group in EXCLUSIVE
    )


ALONE: list[Case] = [(_overlay((c,)), (c,)) for c in COMPONENTS]
PAIRS: list[Case] = [
    (_overlay(pair), pair) for pair in itertools.permutations(COMPONENTS, 2) if _compatible(pair)
]


def _all_compatible(overlay: str) -> tuple[str, ...]:
    chosen: list[str] = [K8S_136]
    for component in COMPONENTS:
        if _compatible((*chosen[1:], component)) and overlay in _overlays((component,)):
            chosen.append(component)
    return tuple(chosen)


EVERY: list[Case] = [(o, _all_compatible(o)) for o in OVERLAYS]
CASES = [(case, OTHER_NAMESPACE) for case in ALONE + PAIRS + EVERY] + [
    (case, DEFAULT_NAMESPACE) for case in ALONE + EVERY
]


def _case_id(case: Case) -> str:
    overlay, components = case
    return f"{overlay}:{'+'.join(components)}"


def _folder(overlay: str, component: str) -> Path:
    if component == K8S_136:
        return KUSTOMIZE / "overlays" / overlay / K8S_136
    return KUSTOMIZE / "components" / component


@functools.cache
def _render(case: Case, namespace: str) -> Objects:
    """A user's kustomization of the case, in `namespace` with deploy/kustomize/namespace as
    its transformer (as docs/install.md says) unless it is the default one."""
    assert KUBECTL is not None
    overlay, components = case
    with tempfile.TemporaryDirectory() as tmp:
        kustomization: dict[str, Any] = {
            "resources": [os.path.relpath(KUSTOMIZE / "overlays" / overlay, tmp)],
            "components": [os.path.relpath(_folder(overlay, c), tmp) for c in components],
        }
        if namespace != DEFAULT_NAMESPACE:
            kustomization["namespace"] = namespace
            kustomization["transformers"] = [os.path.relpath(KUSTOMIZE / "namespace", tmp)]
        Path(tmp, "kustomization.yaml").write_text(yaml.safe_dump(kustomization))
        result = subprocess.run(
            [KUBECTL, "kustomize", tmp], capture_output=True, text=True, timeout=60, check=False
        )
    assert result.returncode == 0, result.stderr
    return tuple(d for d in yaml.load_all(result.stdout, Loader=yaml.CSafeLoader) if d)


# --- the namespace ---------------------------------------------------------------------------


def _pods(objects: Objects) -> dict[str, Obj]:
    """Each workload's pod template, by kind/name."""
    return {
        f"{o['kind']}/{o['metadata']['name']}": o
        for o in objects
        if o["kind"] in ("DaemonSet", "Deployment", "StatefulSet")
    }


def _nats_hosts(workload: Obj) -> list[tuple[str, int]]:
    """(host, port) of every server in the workload's NATS_URL; none without one."""
    containers = workload["spec"]["template"]["spec"]["containers"]
    if not any(e["name"] == "NATS_URL" for c in containers for e in c.get("env", [])):
        return []
    url = _resolved_env(workload)["NATS_URL"]
    hosts = []
    for server in filter(None, url.split(",")):
        match = re.fullmatch(r"tls://([a-z0-9.-]+):(\d+)", server)
        assert match is not None, f"{workload['metadata']['name']}: {server}"
        hosts.append((match[1], int(match[2])))
    return hosts


def _server_names(objects: Objects, namespace: str) -> set[str]:
    """The names the install's NATS servers answer to: the Services, and each pod of the
    StatefulSet by the headless Service."""
    (nats,) = [o for o in _of_kind(objects, "StatefulSet") if o["metadata"]["name"] == "nats"]
    services = {s["metadata"]["name"]: s for s in _of_kind(objects, "Service")}
    headless = services[nats["spec"]["serviceName"]]
    names = {f"{name}.{namespace}.svc" for name, s in services.items() if "nats" in name}
    names |= {
        f"nats-{i}.{headless['metadata']['name']}.{namespace}.svc"
        for i in range(nats["spec"].get("replicas", 1))
    }
    return names


def _assert_in_namespace(objects: Objects, namespace: str) -> None:
    for obj in objects:
        if obj["kind"] in CLUSTER_SCOPED:
            assert "namespace" not in obj["metadata"], obj["metadata"]
        else:
            assert obj["metadata"].get("namespace") == namespace, obj["metadata"]
        if namespace != DEFAULT_NAMESPACE:
            for where, text in _strings(obj):
                assert not OLD_NAMESPACE_IN_TEXT.search(text), f"{obj['kind']}{where}: {text}"
    servers = _server_names(objects, namespace)
    certificates = [
        o for o in _of_kind(objects, "Certificate") if o["metadata"]["name"] == "dra-suite-nats"
    ]
    dialled = {host for w in _pods(objects).values() for host, _ in _nats_hosts(w)}
    assert dialled, "no pod dials NATS"
    assert dialled <= servers, f"names no server of the install answers to: {dialled - servers}"
    for certificate in certificates:
        missing = dialled - set(certificate["spec"]["dnsNames"])
        assert not missing, f"the server certificate does not cover {missing}"


# --- the NetworkPolicy ------------------------------------------------------------------------


def _labels(workload: Obj) -> dict[str, str]:
    return dict(workload["spec"]["template"]["metadata"].get("labels") or {})


def _container_port(workload: Obj, port: int | str) -> int:
    if isinstance(port, int):
        return port
    (number,) = [
        p["containerPort"]
        for c in workload["spec"]["template"]["spec"]["containers"]
        for p in c.get("ports", [])
        if p.get("name") == port
    ]
    return int(number)


def _admits(policy: Obj, target: Obj, source: Obj, port: int) -> bool:
    """Whether `policy`, if it selects `target`'s pods, lets `source`'s pods in on `port` (both
    in the policy's namespace). A policy that does not select the target admits everything."""
    spec = policy["spec"]
    if not _selects(spec["podSelector"], _labels(target)):
        return True
    if "Ingress" not in spec.get("policyTypes", ["Ingress"]):
        return True
    for rule in spec.get("ingress", []):
        ports = [_container_port(target, p["port"]) for p in rule.get("ports", [])]
        if ports and port not in ports:
            continue
        peers = rule.get("from")
        if not peers:
            return True
        for peer in peers:
            if "ipBlock" in peer or "namespaceSelector" in peer:
                continue
            if _selects(peer.get("podSelector", {}), _labels(source)):
                return True
    return False


def _service_target(objects: Objects, host: str, port: int) -> tuple[Obj, int]:
    """The workload behind `host` (a Service, or a pod by its headless Service) and the pod's
    port that `port` reaches."""
    services = {s["metadata"]["name"]: s for s in _of_kind(objects, "Service")}
    first, second = host.split(".")[:2]
    service = services[first if first in services else second]
    selector = {"matchLabels": service["spec"]["selector"]}
    (target,) = [w for w in _pods(objects).values() if _selects(selector, _labels(w))]
    for entry in service["spec"]["ports"]:
        if entry["port"] == port:
            return target, _container_port(target, entry.get("targetPort", port))
    return target, port  # a headless Service: the pod's own port


def _assert_network_policies_admit(objects: Objects) -> None:
    policies = _of_kind(objects, "NetworkPolicy")
    assert policies
    pods = _pods(objects)
    for name, source in pods.items():
        for host, port in _nats_hosts(source):
            target, pod_port = _service_target(objects, host, port)
            for policy in policies:
                assert _admits(policy, target, source, pod_port), (
                    f"{name} -> {host}:{port}: NetworkPolicy {policy['metadata']['name']}"
                )
    nats = pods["StatefulSet/nats"]
    if nats["spec"].get("replicas", 1) > 1:  # the servers' routes to each other
        route = _container_port(nats, "route")
        for policy in policies:
            assert _admits(policy, nats, nats, route), policy["metadata"]["name"]


# --- labels and schemas -----------------------------------------------------------------------


def _assert_labelled(objects: Objects) -> None:
    key, value = PART_OF
    for obj in objects:
        labels = obj["metadata"].get("labels") or {}
        assert labels.get(key) == value, f"{obj['kind']}/{obj['metadata']['name']}: {labels}"
    for name, workload in _pods(objects).items():
        assert _labels(workload).get(key) == value, f"{name}'s pods"


@functools.cache
def _validate(text: str, version: str) -> None:
    """One object (as sorted JSON: renders share most objects) against one schema."""
    obj = json.loads(text)
    if is_kubernetes(obj):
        kubernetes_validate.validate(obj, version, strict=True)
    elif obj["apiVersion"].startswith("cert-manager.io/"):
        jsonschema.validate(obj, CERT_MANAGER_SCHEMAS[obj["kind"]])
    elif obj["kind"] == "PrometheusRule":
        jsonschema.validate(obj, PROMETHEUS_RULE_SCHEMA)
    else:
        jsonschema.validate(obj, POD_MONITOR_SCHEMA)


def _assert_valid(objects: Objects, components: tuple[str, ...]) -> None:
    # The 1.36 component uses fields earlier versions do not serve.
    versions = ("1.36.0",) if K8S_136 in components else KUBE_VERSIONS
    for obj in objects:
        for version in versions:
            _validate(json.dumps(obj, sort_keys=True), version)


# --- the tests --------------------------------------------------------------------------------


@pytest.mark.parametrize(("case", "namespace"), CASES, ids=[f"{_case_id(c)}@{n}" for c, n in CASES])
def test_components_compose(case: Case, namespace: str) -> None:
    objects = _render(case, namespace)
    _assert_in_namespace(objects, namespace)
    _assert_network_policies_admit(objects)
    _assert_labelled(objects)
    _assert_valid(objects, case[1])


@pytest.mark.parametrize("case", ALONE + EVERY, ids=_case_id)
def test_the_default_namespace_differs_from_another_only_in_the_namespace(case: Case) -> None:
    elsewhere = json.dumps(_render(case, OTHER_NAMESPACE), sort_keys=True)
    default = json.dumps(_render(case, DEFAULT_NAMESPACE), sort_keys=True)
    assert elsewhere.replace(OTHER_NAMESPACE, DEFAULT_NAMESPACE) == default


def _as_set(objects: Objects) -> set[str]:
    """The objects, each container's env as a set: a patch's entries come first in the merged
    list. (Where an entry refers to another, _resolved_env checks the order.)"""
    normal = []
    for obj in objects:
        copy = json.loads(json.dumps(obj))
        for container in (
            copy.get("spec", {}).get("template", {}).get("spec", {}).get("containers", [])
        ):
            container["env"] = sorted(container.get("env", []), key=lambda e: e["name"])
        normal.append(json.dumps(copy, sort_keys=True))
    return set(normal)


def test_the_order_of_two_components_changes_nothing() -> None:
    differ = []
    for overlay, (first, second) in PAIRS:
        if first < second and frozenset({first, second}) not in ORDER_MATTERS:
            one = _render((overlay, (first, second)), OTHER_NAMESPACE)
            other = _render((overlay, (second, first)), OTHER_NAMESPACE)
            if _as_set(one) != _as_set(other):
                differ.append(f"{overlay}: {first}, {second}")
    assert not differ


def test_the_matrix_covers_every_component_and_pair() -> None:
    assert {c for _, (c,) in ALONE} == set(COMPONENTS)
    assert len({frozenset(p) for _, p in PAIRS}) * 2 == len(PAIRS)
    for overlay, components in EVERY:
        assert len(components) > len(COMPONENTS) // 2, (overlay, components)
