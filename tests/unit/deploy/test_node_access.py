"""What each agent may do on its node, per overlay, as `kubectl kustomize` renders it: who is
privileged or root, which host paths are mounted and how, and the env the container runtime
or the dynamic loader reads. The Components change none of it."""

from __future__ import annotations

from typing import Any

import pytest

from tests.unit.deploy.manifests import (
    KUBECTL,
    NODE_ACCESS,
    OVERLAY_RUNTIME_ENV,
    OVERLAYS,
    RUNTIME_ENV,
    _container,
    _env,
    _of_kind,
    node_access,
    render,
)

pytestmark = pytest.mark.skipif(KUBECTL is None, reason="kubectl is not on PATH")

COMPONENTS = ("components/cert-manager", "components/slice-taints")


def _agents(overlay: str, *components: str) -> dict[str, dict[str, Any]]:
    daemonsets = _of_kind(render(f"overlays/{overlay}", components), "DaemonSet")
    return {_container(ds)["name"]: ds for ds in daemonsets}


def _every_component(overlay: str) -> tuple[str, ...]:
    return (f"overlays/{overlay}/k8s-1.36", *COMPONENTS)


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_each_agent_gets_exactly_its_intended_node_access(overlay: str) -> None:
    agents = _agents(overlay)
    assert {name: node_access(ds) for name, ds in agents.items()} == NODE_ACCESS[overlay]


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_components_change_no_agents_node_access(overlay: str) -> None:
    agents = _agents(overlay, *_every_component(overlay))
    assert {name: node_access(ds) for name, ds in agents.items()} == NODE_ACCESS[overlay]


def test_the_sim_overlay_runs_nothing_privileged() -> None:
    assert not any(access.privileged for access in NODE_ACCESS["sim"].values())
    for name, ds in _agents("sim").items():
        assert not node_access(ds).privileged, name


def test_only_the_hardware_overlays_run_the_allocation_agent_privileged() -> None:
    privileged = {o for o in OVERLAYS if node_access(_agents(o)["allocation"]).privileged}
    assert privileged == {"nvidia", "ascend"}


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_security_contexts_say_the_same_as_the_privilege(overlay: str) -> None:
    for name, ds in _agents(overlay, *_every_component(overlay)).items():
        pod = ds["spec"]["template"]["spec"]
        context = _container(ds)["securityContext"]
        access = node_access(ds)
        assert not {"hostNetwork", "hostPID", "hostIPC"} & pod.keys(), name
        assert pod["securityContext"]["seccompProfile"] == {"type": "RuntimeDefault"}, name
        assert "add" not in context.get("capabilities", {}), name
        # The API rejects privileged without privilege escalation; unprivileged: both off.
        assert context["allowPrivilegeEscalation"] is access.privileged, name
        if not access.privileged:
            assert context["capabilities"]["drop"] == ["ALL"], name
        run_as_non_root = context.get("runAsNonRoot", pod["securityContext"].get("runAsNonRoot"))
        assert (run_as_non_root is True) is not access.root, name


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_runtime_env_is_exactly_what_each_agent_needs(overlay: str) -> None:
    for name, ds in _agents(overlay).items():
        runtime = {k: e["value"] for k, e in _env(ds).items() if k in RUNTIME_ENV}
        assert runtime == OVERLAY_RUNTIME_ENV[overlay][name], name


def test_nvidia_allocation_loads_the_one_mounted_host_nvml_outside_the_toolkit() -> None:
    allocation = _agents("nvidia")["allocation"]
    env = _env(allocation)
    assert env["NVIDIA_VISIBLE_DEVICES"]["value"] == "void"
    assert "runtimeClassName" not in allocation["spec"]["template"]["spec"]
    (nvml,) = [m for m in node_access(allocation).host_mounts if m.host_path.endswith(".so.1")]
    assert nvml.mount_path == f"{env['LD_LIBRARY_PATH']['value']}/libnvidia-ml.so.1"
    assert nvml.read_only


def test_ascend_allocation_runs_the_mounted_npu_smi_with_the_mounted_driver() -> None:
    allocation = _agents("ascend")["allocation"]
    env = {k: e["value"] for k, e in _env(allocation).items() if "value" in e}
    mounts = {m.mount_path: m for m in node_access(allocation).host_mounts}
    assert mounts[env["NPU_SMI_PATH"]].read_only
    driver = mounts["/usr/local/Ascend/driver"]
    assert driver.read_only
    for folder in env["LD_LIBRARY_PATH"].split(":"):
        assert folder.startswith(driver.mount_path + "/"), folder
