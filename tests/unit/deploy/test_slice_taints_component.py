"""The slice-taints Component: the health agent's taints go into the ResourceSlices instead of
DeviceTaintRules, which needs both agents switched together (health `--taint-target slice`,
discovery `--publish-device-taints true`); every overlay renders with it, valid for 1.34-1.36."""

from __future__ import annotations

from typing import Any

import kubernetes_validate
import pytest

from tests.unit.deploy.manifests import (
    CONFIG_BUILDERS,
    KUBE_VERSIONS,
    KUBECTL,
    KUSTOMIZE,
    OVERLAYS,
    _container,
    _docs,
    _env,
    _of_kind,
    _resolved_env,
    local_env,
    render,
)

COMPONENT = "components/slice-taints"


def test_the_component_sets_only_the_two_switches() -> None:
    patched = {
        _container(ds)["name"]: ds
        for p in sorted((KUSTOMIZE / COMPONENT).glob("*-patch.yaml"))
        for ds in _docs(p)
    }
    assert sorted(patched) == ["discovery", "health"]
    assert {name: set(_env(ds)) for name, ds in patched.items()} == {
        "discovery": {"PUBLISH_DEVICE_TAINTS"},
        "health": {"TAINT_TARGET"},
    }
    for ds in patched.values():
        assert set(ds["spec"]["template"]["spec"]) == {"containers"}
        assert set(_container(ds)) == {"name", "env"}


def _taint_switches(objects: tuple[dict[str, Any], ...]) -> tuple[str, bool]:
    """(health taint target, discovery publishes device taints) as the agents parse their env."""
    configs = {
        _container(ds)["name"]: CONFIG_BUILDERS[_container(ds)["name"]](
            [], local_env(_resolved_env(ds))
        )
        for ds in _of_kind(objects, "DaemonSet")
    }
    return configs["health"].taint_target, configs["discovery"].publish_device_taints


needs_kubectl = pytest.mark.skipif(KUBECTL is None, reason="kubectl is not on PATH")


@needs_kubectl
@pytest.mark.parametrize("overlay", OVERLAYS)
def test_with_the_component_both_agents_switch_to_slice_taints(overlay: str) -> None:
    assert _taint_switches(render(f"overlays/{overlay}", (COMPONENT,))) == ("slice", True)


@needs_kubectl
@pytest.mark.parametrize("overlay", OVERLAYS)
def test_without_it_both_agents_keep_device_taint_rules(overlay: str) -> None:
    assert _taint_switches(render(f"overlays/{overlay}")) == ("rule", False)


@needs_kubectl
@pytest.mark.parametrize("version", KUBE_VERSIONS)
@pytest.mark.parametrize("overlay", OVERLAYS)
def test_each_overlay_with_the_component_is_valid_kubernetes(overlay: str, version: str) -> None:
    for obj in render(f"overlays/{overlay}", (COMPONENT,)):
        kubernetes_validate.validate(obj, version, strict=True)


@needs_kubectl
def test_the_component_combines_with_the_1_36_and_cert_manager_components() -> None:
    components = ("overlays/nvidia/k8s-1.36", "components/cert-manager", COMPONENT)
    agents = {
        _container(ds)["name"]: _env(ds)
        for ds in _of_kind(render("overlays/nvidia", components), "DaemonSet")
    }
    assert agents["health"]["TAINT_TARGET"]["value"] == "slice"
    assert agents["discovery"]["PUBLISH_DEVICE_TAINTS"]["value"] == "true"
    assert {"MIG_PROFILES", "NATS_TOKEN_FILE"} <= agents["discovery"].keys()
    assert "NATS_TOKEN_FILE" in agents["health"]
