"""Installing into another namespace (deploy/kustomize/namespace as the transformer of a user's
kustomization): every reference written inside a string follows it (the agents' NATS and OTLP
URLs, the auth service's agent namespace and operator user, the admission policies' user names,
the certificate's DNS names), and every overlay, with every Component, still renders valid."""

from __future__ import annotations

import re
from collections.abc import Iterator
from typing import Any

import kubernetes_validate
import pytest

from tests.unit.deploy.manifests import (
    KUBECTL,
    OVERLAYS,
    _of_kind,
    _resolved_env,
    is_kubernetes,
    render,
)

pytestmark = pytest.mark.skipif(KUBECTL is None, reason="kubectl is not on PATH")

NAMESPACE = "gpu-system"
CLUSTER_SCOPED = {
    *("Namespace", "ClusterRole", "ClusterRoleBinding", "DeviceClass"),
    *("ValidatingAdmissionPolicy", "ValidatingAdmissionPolicyBinding"),
}
# "dra-suite" as a namespace inside a string: <service>.dra-suite.svc, :dra-suite: in user
# names; not the driver domains (sim.dra-suite.io) or paths (/etc/dra-suite/...).
OLD_NAMESPACE_IN_TEXT = re.compile(r"[.:]dra-suite(?=[.:'\s]|$)(?!\.io\b)")
Obj = dict[str, Any]


def _components(overlay: str) -> tuple[str, ...]:
    return (f"overlays/{overlay}/k8s-1.36", "components/cert-manager", "components/slice-taints")


def _strings(node: Any, path: str = "") -> Iterator[tuple[str, str]]:
    if isinstance(node, dict):
        for key, value in node.items():
            yield from _strings(value, f"{path}.{key}")
    elif isinstance(node, list):
        for index, value in enumerate(node):
            yield from _strings(value, f"{path}[{index}]")
    elif isinstance(node, str):
        yield path, node


def _one(objects: tuple[Obj, ...], kind: str, name: str) -> Obj:
    (found,) = [o for o in objects if o["kind"] == kind and o["metadata"]["name"] == name]
    return found


def _service_host(url: str) -> tuple[str, str]:
    """(service, namespace) of `<scheme>://<service>.<namespace>.svc:<port>`."""
    match = re.fullmatch(r"\w+://([a-z0-9-]+)\.([a-z0-9-]+)\.svc:\d+", url)
    assert match is not None, url
    return match[1], match[2]


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_every_object_and_reference_moves_to_the_namespace(overlay):
    objects = render(f"overlays/{overlay}", _components(overlay), namespace=NAMESPACE)
    assert [o["metadata"]["name"] for o in _of_kind(objects, "Namespace")] == [NAMESPACE]
    for obj in objects:
        if obj["kind"] in CLUSTER_SCOPED:
            assert "namespace" not in obj["metadata"], obj["metadata"]
        else:
            assert obj["metadata"]["namespace"] == NAMESPACE, obj["metadata"]
        for where, text in _strings(obj):
            assert not OLD_NAMESPACE_IN_TEXT.search(text), f"{obj['kind']}{where}: {text}"
    for binding in _of_kind(objects, "ClusterRoleBinding") + _of_kind(objects, "RoleBinding"):
        for subject in binding["subjects"]:
            if subject["kind"] == "ServiceAccount":
                assert subject["namespace"] == NAMESPACE


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_every_reference_names_an_object_of_the_install(overlay):
    objects = render(f"overlays/{overlay}", _components(overlay), namespace=NAMESPACE)
    services = {
        (s["metadata"]["name"], s["metadata"]["namespace"]) for s in _of_kind(objects, "Service")
    }
    accounts = {
        f"system:serviceaccount:{a['metadata']['namespace']}:{a['metadata']['name']}"
        for a in _of_kind(objects, "ServiceAccount")
    }
    for ds in _of_kind(objects, "DaemonSet"):
        env = _resolved_env(ds)
        assert _service_host(env["NATS_URL"]) == ("nats", NAMESPACE)
        assert _service_host(env["OTLP_ENDPOINT"]) in services
    auth = _one(objects, "Deployment", "dra-nats-auth")
    values = _resolved_env(auth)
    assert _service_host(values["NATS_URL"]) == ("nats", NAMESPACE)
    assert values["AGENT_NAMESPACE"] == NAMESPACE
    assert set(values["OPERATOR_USERS"].split(",")) <= accounts
    for name, account in (
        ("dra-suite-resourceslices-own-node", "dra-discovery"),
        ("dra-suite-devicetaintrules-own-node", "dra-health"),
    ):
        (condition,) = _one(objects, "ValidatingAdmissionPolicy", name)["spec"]["matchConditions"]
        user = f"system:serviceaccount:{NAMESPACE}:{account}"
        assert condition["expression"] == f"request.userInfo.username == '{user}'"
        assert user in accounts
    names = _one(objects, "Certificate", "dra-suite-nats")["spec"]["dnsNames"]
    assert {f"nats.{NAMESPACE}.svc", f"nats.{NAMESPACE}.svc.cluster.local"} <= set(names)
    assert f"nats-0.nats-headless.{NAMESPACE}.svc" in names


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_the_transformer_changes_nothing_in_the_default_namespace(overlay):
    assert render(f"overlays/{overlay}", namespace="dra-suite") == render(f"overlays/{overlay}")


@pytest.mark.parametrize("version", ["1.34.0", "1.35.0", "1.36.0"])
def test_an_install_in_another_namespace_is_valid_kubernetes(version):
    for overlay in OVERLAYS:
        components = _components(overlay) if version == "1.36.0" else ("components/cert-manager",)
        for obj in render(f"overlays/{overlay}", components, namespace=NAMESPACE):
            if is_kubernetes(obj):
                kubernetes_validate.validate(obj, version, strict=True)
