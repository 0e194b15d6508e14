"""The namespace's Pod Security level is the least one that admits each overlay's pods, and no
pod needs more than its job: in the sim overlay only the kubelet plugin's host directories keep
the namespace from `baseline`, and every other pod meets `restricted`."""

from __future__ import annotations

from typing import Any

import pytest

from tests.unit.deploy.manifests import KUBECTL, OVERLAYS, render
from tests.unit.deploy.pod_security import (
    LEVELS,
    baseline_violations,
    least_level,
    pod_templates,
    restricted_violations,
)

pytestmark = pytest.mark.skipif(KUBECTL is None, reason="needs kubectl (kustomize)")

ENFORCE = "pod-security.kubernetes.io/enforce"
KUBELET_PLUGIN = "DaemonSet/dra-allocation"

_RESTRICTED_POD: dict[str, Any] = {
    "securityContext": {"runAsNonRoot": True, "seccompProfile": {"type": "RuntimeDefault"}},
    "containers": [
        {
            "name": "c",
            "securityContext": {
                "allowPrivilegeEscalation": False,
                "capabilities": {"drop": ["ALL"]},
            },
        }
    ],
    "volumes": [{"name": "v", "emptyDir": {}}],
}


def _with(**changes: Any) -> dict[str, Any]:
    container = {**_RESTRICTED_POD["containers"][0]}
    container["securityContext"] = {
        **container["securityContext"],
        **changes.pop("container", {}),
    }
    return {**_RESTRICTED_POD, "containers": [container], **changes}


@pytest.mark.parametrize(
    ("pod", "level"),
    [
        (_RESTRICTED_POD, "restricted"),
        (_with(container={"runAsUser": 0}), "baseline"),
        (_with(container={"allowPrivilegeEscalation": True}), "baseline"),
        (_with(securityContext={"runAsNonRoot": True}), "baseline"),  # no seccomp profile
        (_with(volumes=[{"name": "h", "hostPath": {"path": "/"}}]), "privileged"),
        (_with(container={"privileged": True}), "privileged"),
        (_with(container={"capabilities": {"drop": ["ALL"], "add": ["SYS_ADMIN"]}}), "privileged"),
        (_with(hostNetwork=True), "privileged"),
        (_with(container={"seccompProfile": {"type": "Unconfined"}}), "privileged"),
    ],
)
def test_the_evaluator_finds_each_control_a_pod_breaks(pod: dict[str, Any], level: str) -> None:
    assert least_level(pod) == level


@pytest.mark.parametrize("overlay", sorted(OVERLAYS))
def test_the_namespace_enforces_the_least_level_that_admits_the_overlays_pods(
    overlay: str,
) -> None:
    objects = render(f"overlays/{overlay}")
    (namespace,) = [o for o in objects if o["kind"] == "Namespace"]
    needed = max((least_level(pod) for pod in pod_templates(objects).values()), key=LEVELS.index)
    assert namespace["metadata"]["labels"][ENFORCE] == needed


def test_in_the_sim_overlay_only_the_kubelet_plugins_host_directories_need_privileged() -> None:
    pods = pod_templates(render("overlays/sim"))
    assert baseline_violations(pods.pop(KUBELET_PLUGIN)) == {"hostPath volumes"}
    assert len(pods) >= 5
    for name, pod in pods.items():
        assert restricted_violations(pod) == set(), name


@pytest.mark.parametrize("overlay", sorted(OVERLAYS))
def test_the_bus_and_the_auth_service_meet_restricted_in_every_overlay(overlay: str) -> None:
    pods = pod_templates(render(f"overlays/{overlay}"))
    for name in ("StatefulSet/nats", "Deployment/dra-nats-auth", "Deployment/otel-collector"):
        assert restricted_violations(pods[name]) == set(), name
