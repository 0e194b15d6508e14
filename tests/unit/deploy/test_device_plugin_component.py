"""The device-plugin Component: a node pool switches to the device-plugin front by a label.

Every overlay renders with it, valid for 1.34-1.36; the two allocation DaemonSets select
disjoint nodes by `dra-suite.io/kubelet-api`; the device-plugin one runs the overlay's driver
and image, its env builds a device-plugin config, and every path it uses is mounted."""

from __future__ import annotations

from pathlib import PurePosixPath
from typing import Any

import kubernetes_validate
import pytest

from tests.unit.deploy.manifests import (
    CONFIG_BUILDERS,
    KUBE_VERSIONS,
    KUBECTL,
    OVERLAYS,
    _container,
    _of_kind,
    _resolved_env,
    local_env,
    render,
)

COMPONENT = "components/device-plugin"
LABEL = "dra-suite.io/kubelet-api"
DRA, DP = "dra-allocation", "dra-allocation-device-plugin"

needs_kubectl = pytest.mark.skipif(KUBECTL is None, reason="kubectl is not on PATH")


def _daemonsets(overlay: str, *components: str) -> dict[str, dict[str, Any]]:
    objects = render(f"overlays/{overlay}", components)
    return {ds["metadata"]["name"]: ds for ds in _of_kind(objects, "DaemonSet")}


def _selects(ds: dict[str, Any], labels: dict[str, str]) -> bool:
    """Whether the DaemonSet's required node affinity admits a node with `labels`."""
    affinity = ds["spec"]["template"]["spec"].get("affinity", {}).get("nodeAffinity", {})
    required = affinity.get("requiredDuringSchedulingIgnoredDuringExecution")
    if required is None:
        return True

    def holds(expression: dict[str, Any]) -> bool:
        value = labels.get(expression["key"])
        if expression["operator"] == "In":
            return value in expression["values"]
        assert expression["operator"] == "NotIn", expression
        return value not in expression["values"]

    return any(
        all(holds(e) for e in term.get("matchExpressions", []))
        for term in required["nodeSelectorTerms"]
    )


NODES = [{}, {LABEL: "device-plugin"}, {LABEL: "dra"}, {"other": "x"}]


@needs_kubectl
@pytest.mark.parametrize("overlay", OVERLAYS)
def test_every_node_gets_exactly_one_front(overlay: str) -> None:
    daemonsets = _daemonsets(overlay, COMPONENT)
    for labels in NODES:
        fronts = [name for name in (DRA, DP) if _selects(daemonsets[name], labels)]
        expected = DP if labels.get(LABEL) == "device-plugin" else DRA
        assert fronts == [expected], labels


@needs_kubectl
@pytest.mark.parametrize("overlay", OVERLAYS)
def test_the_device_plugin_daemonset_runs_the_overlays_driver_as_a_device_plugin(
    overlay: str,
) -> None:
    daemonsets = _daemonsets(overlay, COMPONENT)
    dra, dp = daemonsets[DRA], daemonsets[DP]
    assert _container(dp)["image"] == _container(dra)["image"]
    config = CONFIG_BUILDERS["allocation"]([], local_env(_resolved_env(dp)))
    assert (config.driver_name, config.backend) == OVERLAYS[overlay]
    assert config.kubelet_api == "device-plugin"
    assert dp["spec"]["template"]["spec"]["serviceAccountName"] == "dra-allocation"
    volumes = {v["name"]: v for v in dp["spec"]["template"]["spec"]["volumes"]}
    mounts = {
        m["mountPath"]: volumes[m["name"]].get("hostPath", {}).get("path")
        for m in _container(dp)["volumeMounts"]
    }
    for path in (config.device_plugin_dir, config.data_dir, config.cdi_root):
        assert mounts.get(str(path)) == str(path), f"{path} is not mounted at the same path"
    assert str(PurePosixPath(config.registration_socket_path).parent) in mounts
    context = _container(dp)["securityContext"]
    assert context["capabilities"]["drop"] == ["ALL"]
    assert not context["privileged"]


@needs_kubectl
@pytest.mark.parametrize("overlay", OVERLAYS)
def test_discovery_publishes_slices_only_where_the_node_runs_the_dra_front(overlay: str) -> None:
    with_component = _daemonsets(overlay, COMPONENT)["dra-discovery"]
    config = CONFIG_BUILDERS["discovery"]([], local_env(_resolved_env(with_component)))
    assert config.publish_slices == "auto"  # the node's label decides, as for the fronts
    without = _daemonsets(overlay)["dra-discovery"]
    assert CONFIG_BUILDERS["discovery"]([], local_env(_resolved_env(without))).publish_slices == (
        "true"
    )


@needs_kubectl
@pytest.mark.parametrize("overlay", OVERLAYS)
def test_without_the_component_there_is_only_the_dra_front_everywhere(overlay: str) -> None:
    daemonsets = _daemonsets(overlay)
    assert DP not in daemonsets
    assert all(_selects(daemonsets[DRA], labels) for labels in NODES)
    config = CONFIG_BUILDERS["allocation"]([], local_env(_resolved_env(daemonsets[DRA])))
    assert config.kubelet_api == "dra"
    assert config.backend == OVERLAYS[overlay][1]


@needs_kubectl
@pytest.mark.parametrize("version", KUBE_VERSIONS)
@pytest.mark.parametrize("overlay", OVERLAYS)
def test_each_overlay_with_the_component_is_valid_kubernetes(overlay: str, version: str) -> None:
    for obj in render(f"overlays/{overlay}", (COMPONENT,)):
        kubernetes_validate.validate(obj, version, strict=True)
