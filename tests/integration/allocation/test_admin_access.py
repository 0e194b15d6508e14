"""Admin access (KEP-5018) through the kubelet emulator, the API emulator and the sim backend.

An admin claim the scheduler gave an option made on demand (a MIG placement that does not exist
yet) fails alone, with an error that says why, and makes no partition, so the normal claim the
scheduler gives that placement next prepares. An admin claim on a device that another claim
holds (partitioned, or shared under MPS) gets the device as it is: both claims are prepared,
no partition is made and no MPS daemon started for it, and its unprepare leaves the other
claim's partition, daemon and spec alone.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import pytest

from devcluster.kubelet import KubeletClaim, KubeletEmulator
from services.allocation.mps.daemons import MpsDaemons
from tests.fakes import mps_control

pytestmark = pytest.mark.integration

DRIVER = "sim.dra-suite.io"
NODE = "node-a"
ONE_G_AT_3 = "gpu-0-mig-1g10gb-19-3"
ONE_G_AT_5 = "gpu-0-mig-1g10gb-19-5"
ADMIN_NAMESPACE = {"resource.kubernetes.io/admin-access": "true"}


def _admin_namespace(plugin_node) -> None:
    # The API server admits admin access only in a namespace labelled for it (KEP-5018).
    plugin_node.api.create_object(
        {
            "apiVersion": "v1",
            "kind": "Namespace",
            "metadata": {"name": "default", "labels": ADMIN_NAMESPACE},
        }
    )


def _allocate(
    plugin_node, name: str, device: str, *, admin: bool = False, share: str = ""
) -> KubeletClaim:
    """A claim of one request, allocated `device` as the scheduler would: with `adminAccess`
    for an admin claim, a share of `share` memory of a multi-allocatable device."""
    request = "monitor" if admin else "gpu"
    exactly: dict[str, Any] = {"deviceClassName": f"gpu.{DRIVER}", "count": 1}
    if admin:
        exactly["adminAccess"] = True
    created = plugin_node.api.create_object(
        {
            "apiVersion": "resource.k8s.io/v1",
            "kind": "ResourceClaim",
            "metadata": {"name": name, "namespace": "default"},
            "spec": {"devices": {"requests": [{"name": request, "exactly": exactly}]}},
        }
    )
    result: dict[str, Any] = {"request": request, "driver": DRIVER, "pool": NODE, "device": device}
    if admin:
        result["adminAccess"] = True
    if share:
        result["shareID"] = str(uuid.uuid4())
        result["consumedCapacity"] = {"memory": share}
    created["status"] = {"allocation": {"devices": {"results": [result]}}}
    created = plugin_node.api.update_object(created, status=True)
    return KubeletClaim(namespace="default", name=name, uid=created["metadata"]["uid"])


async def _errors(kubelet: KubeletEmulator, claims: Sequence[KubeletClaim]) -> dict[str, str]:
    answer = await kubelet.prepare(claims)
    return {claim.name: answer.claims[claim.uid].error for claim in claims}


def _placements(plugin_node) -> list[tuple[str, str, int]]:
    return sorted((p["claimUID"], p["device"], p["placement"]) for p in plugin_node.partitions())


async def test_admin_access_to_an_option_made_on_demand_fails_alone_and_makes_no_partition(
    plugin_node,
):
    await plugin_node.publish_profile("gpu-mig")
    _admin_namespace(plugin_node)
    async with plugin_node.registered() as (agent, kubelet):
        await plugin_node.eventually(lambda: agent.inventory.current is not None)
        admin = _allocate(plugin_node, "inspect", ONE_G_AT_3, admin=True)
        other = _allocate(plugin_node, "other", ONE_G_AT_5)

        errors = await _errors(kubelet, [admin, other])
        assert errors["other"] == ""
        assert f"request monitor has admin access to {ONE_G_AT_3}" in errors["inspect"]
        assert "does not exist yet" in errors["inspect"]
        assert _placements(plugin_node) == [(other.uid, "gpu-0", 5)]
        assert plugin_node.spec(admin.uid) is None
        assert plugin_node.stored().get(admin.uid) is None
        assert (await kubelet.unprepare([admin])).claims[admin.uid].error == ""

        # The placement stayed free: the normal claim the scheduler gives it next prepares.
        normal = _allocate(plugin_node, "normal", ONE_G_AT_3)
        assert await _errors(kubelet, [normal]) == {"normal": ""}
        assert _placements(plugin_node) == sorted(
            [(other.uid, "gpu-0", 5), (normal.uid, "gpu-0", 3)]
        )

        # Admin access to the GPU those partitions are made of: the GPU as it is.
        whole = _allocate(plugin_node, "inspect-gpu", "gpu-0", admin=True)
        assert await _errors(kubelet, [whole]) == {"inspect-gpu": ""}
        spec = plugin_node.spec(whole.uid)
        assert spec is not None
        [device] = spec["devices"]
        assert "NVIDIA_VISIBLE_DEVICES=0" in device["containerEdits"]["env"]
        record = plugin_node.stored().get(whole.uid)
        assert record.partitions == ()
        assert [d.admin_access for d in record.devices] == [True]
        before = plugin_node.partitions()
        normal_spec = plugin_node.spec(normal.uid)

        assert (await kubelet.unprepare([whole])).claims[whole.uid].error == ""
        assert plugin_node.partitions() == before
        assert plugin_node.spec(normal.uid) == normal_spec
        assert plugin_node.spec(whole.uid) is None


@pytest.fixture
def fake(plugin_node) -> Iterator[Path]:
    binary = mps_control.install(plugin_node.base / "bin")
    yield binary
    mps_control.kill_all(plugin_node.base)


async def test_admin_access_to_a_shared_gpu_takes_no_share_and_leaves_the_sharer_alone(
    plugin_node, fake
):
    await plugin_node.publish_profile("gpu-shared")
    _admin_namespace(plugin_node)
    daemons = MpsDaemons(plugin_node.config.mps_dir, binary=str(fake))
    async with plugin_node.registered(mps_control_path=str(fake)) as (agent, kubelet):
        await plugin_node.eventually(lambda: agent.inventory.current is not None)
        sharer = _allocate(plugin_node, "sharer", "gpu-0", share="20Gi")
        assert await _errors(kubelet, [sharer]) == {"sharer": ""}
        [pid] = mps_control.pids(plugin_node.base)

        admin = _allocate(plugin_node, "inspect", "gpu-0", admin=True, share="40Gi")
        assert await _errors(kubelet, [admin]) == {"inspect": ""}
        # One sharer still: no daemon for the admin claim, none of its limits in its spec.
        assert mps_control.pids(plugin_node.base) == [pid]
        assert daemons.claim_uids() == [sharer.uid]
        assert plugin_node.stored().get(admin.uid).mps is None
        spec = plugin_node.spec(admin.uid)
        assert spec is not None
        [device] = spec["devices"]
        env = device["containerEdits"]["env"]
        assert not [e for e in env if e.startswith(("CUDA_MPS_", "DRA_SUITE_CONSUMED_"))]
        mounted = [m["containerPath"] for m in device["containerEdits"].get("mounts", ())]
        assert not [path for path in mounted if "nvidia-mps" in path]
        sharer_spec = plugin_node.spec(sharer.uid)
        assert sharer_spec is not None
        [shared] = sharer_spec["devices"]
        assert "/tmp/nvidia-mps" in [m["containerPath"] for m in shared["containerEdits"]["mounts"]]

        assert (await kubelet.unprepare([admin])).claims[admin.uid].error == ""
        assert mps_control.pids(plugin_node.base) == [pid]
        assert daemons.claim_uids() == [sharer.uid]
        assert plugin_node.spec(sharer.uid) == sharer_spec
        assert (await kubelet.unprepare([sharer])).claims[sharer.uid].error == ""
        assert mps_control.pids(plugin_node.base) == []
