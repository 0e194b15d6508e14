"""components/vfio-passthrough: the allocation agent gets the host's /sys/bus/pci and
/sys/devices read-write and no AppArmor confinement, which binding a device to vfio-pci needs
(docs/vfio.md), on every overlay; nothing else in the install changes, and no agent gets a
privilege or a capability it did not have."""

from __future__ import annotations

import copy
import json
from dataclasses import replace
from typing import Any

import kubernetes_validate
import pytest

from tests.unit.deploy.manifests import (
    KUBE_VERSIONS,
    KUBECTL,
    NODE_ACCESS,
    OVERLAYS,
    HostMount,
    _container,
    node_access,
    render,
)

pytestmark = pytest.mark.skipif(KUBECTL is None, reason="kubectl is not on PATH")

COMPONENT = "components/vfio-passthrough"
SYSFS = frozenset(
    {
        HostMount("/sys/bus/pci", "/sys/bus/pci", read_only=False),
        HostMount("/sys/devices", "/sys/devices", read_only=False),
    }
)
ADDED_VOLUMES = {"sys-bus-pci", "sys-devices"}


def _by_name(objects: tuple[dict[str, Any], ...]) -> dict[str, dict[str, Any]]:
    return {f"{o['kind']}/{o['metadata']['name']}": o for o in objects}


def _without_the_component(allocation: dict[str, Any]) -> dict[str, Any]:
    """The allocation DaemonSet with what the component adds taken out again."""
    found = copy.deepcopy(allocation)
    pod = found["spec"]["template"]["spec"]
    container = pod["containers"][0]
    context = container["securityContext"]
    assert context.pop("appArmorProfile") == {"type": "Unconfined"}
    container["volumeMounts"] = [
        m for m in container["volumeMounts"] if m["name"] not in ADDED_VOLUMES
    ]
    pod["volumes"] = [v for v in pod["volumes"] if v["name"] not in ADDED_VOLUMES]
    return found


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_only_the_allocation_agent_changes_and_only_by_the_sysfs_mounts(overlay: str) -> None:
    before = _by_name(render(f"overlays/{overlay}"))
    after = _by_name(render(f"overlays/{overlay}", (COMPONENT,)))
    assert after.keys() == before.keys()
    changed = {name for name in before if before[name] != after[name]}
    assert changed == {"DaemonSet/dra-allocation"}
    allocation = after["DaemonSet/dra-allocation"]
    assert _without_the_component(allocation) == before["DaemonSet/dra-allocation"]
    for version in KUBE_VERSIONS:
        kubernetes_validate.validate(allocation, version, strict=True)


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_the_agent_may_write_the_pci_bind_files_and_gets_no_privilege(overlay: str) -> None:
    objects = _by_name(render(f"overlays/{overlay}", (COMPONENT,)))
    allocation = objects["DaemonSet/dra-allocation"]
    intended = NODE_ACCESS[overlay]["allocation"]
    assert node_access(allocation) == replace(intended, host_mounts=intended.host_mounts | SYSFS)
    context = _container(allocation)["securityContext"]
    if not intended.privileged:  # the sim overlay: still nothing privileged, nothing added
        assert context["privileged"] is False
        assert context["allowPrivilegeEscalation"] is False
        assert context["capabilities"] == {"drop": ["ALL"]}
        assert context["readOnlyRootFilesystem"] is True
    pod = allocation["spec"]["template"]["spec"]
    assert pod["securityContext"]["seccompProfile"] == {"type": "RuntimeDefault"}
    volumes = {v["name"]: v for v in pod["volumes"]}
    assert {name: volumes[name]["hostPath"] for name in ADDED_VOLUMES} == {
        "sys-bus-pci": {"path": "/sys/bus/pci", "type": "Directory"},
        "sys-devices": {"path": "/sys/devices", "type": "Directory"},
    }
    # No /dev/vfio for the agent: the container runtime opens the nodes for the VM's launcher.
    mounts = [m["mountPath"] for m in _container(allocation)["volumeMounts"]]
    assert not [m for m in mounts if m.startswith("/dev/vfio")]


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_no_other_agent_gets_sysfs_or_another_profile(overlay: str) -> None:
    objects = render(f"overlays/{overlay}", (COMPONENT,))
    for obj in objects:
        if obj["kind"] in ("DaemonSet", "Deployment", "StatefulSet"):
            if obj["metadata"]["name"] == "dra-allocation":
                continue
            text = json.dumps(obj)
            assert "appArmorProfile" not in text, obj["metadata"]["name"]
            assert "/sys/bus/pci" not in text, obj["metadata"]["name"]
            assert '"/sys/devices"' not in text, obj["metadata"]["name"]
