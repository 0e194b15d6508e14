"""Pods scheduled by kube-scheduler and prepared on the node: the discovery and allocation
agents on the real control plane, with the kubelet shim playing the kubelet's DRA manager
through the kubelet emulator's gRPC calls to the allocation agent."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from typing import Any

import pytest

from devcluster.controlplane import RealControlPlane
from devcluster.controlplane.nodes import wait_for_service_account
from services.allocation.cdi import spec_files
from shared.config import NATSSettings
from shared.kube.client import KubeClient
from shared.kube.resources import DEVICE_CLASSES, PODS, RESOURCE_CLAIMS, ResourceType
from tests.k8s.nodestack import NodeStack, node_stack

pytestmark = pytest.mark.k8s

DRIVER = "sim.dra-suite.io"
NODE = "flow-node"
NAMESPACE = "flow"
NAMESPACES = ResourceType("", "v1", "namespaces", "Namespace", namespaced=False)


@pytest.fixture
async def node(
    control_plane: RealControlPlane, nats_settings: NATSSettings
) -> AsyncIterator[NodeStack]:
    admin = await KubeClient.connect(control_plane.kube_settings())
    try:
        await admin.create(NAMESPACES, {"metadata": {"name": NAMESPACE}})
        await wait_for_service_account(admin, NAMESPACE)
        await admin.create(DEVICE_CLASSES, {
            "apiVersion": "resource.k8s.io/v1", "kind": "DeviceClass",
            "metadata": {"name": f"flow.{DRIVER}"},
            "spec": {"selectors": [{"cel": {"expression": f'device.driver == "{DRIVER}"'}}]},
        })  # fmt: skip
        async with node_stack(
            admin, nats_settings, control_plane.kube_settings(), node=NODE, driver=DRIVER
        ) as stack:
            yield stack
    finally:
        await admin.close()


async def test_a_scheduled_pod_is_prepared_and_released_by_the_node(node: NodeStack):
    admin = node.admin
    await admin.create(RESOURCE_CLAIMS, {
        "apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim",
        "metadata": {"name": "pair"},
        "spec": {"devices": {"requests": [
            {"name": "gpus", "exactly": {"deviceClassName": f"flow.{DRIVER}", "count": 2}},
        ]}},
    }, namespace=NAMESPACE)  # fmt: skip
    await admin.create(PODS, _pod("trainer", "pair"), namespace=NAMESPACE)
    running_pod = await _until(lambda: _phase(admin, "trainer", "Running"))
    assert running_pod["spec"]["nodeName"] == NODE
    claim = await admin.get(RESOURCE_CLAIMS, "pair", namespace=NAMESPACE)
    uid = claim["metadata"]["uid"]
    allocated = {r["device"] for r in claim["status"]["allocation"]["devices"]["results"]}
    spec_path = node.cdi_root / spec_files.spec_file_name(DRIVER, uid)
    spec = json.loads(spec_path.read_text())
    named = json.dumps(spec)
    assert len(spec["devices"]) == 2
    assert all(device in named for device in allocated)
    prepared = node.shim.pods[f"{NAMESPACE}/trainer"]
    assert len(prepared.cdi_devices[uid]) == 2

    await admin.delete(PODS, "trainer", namespace=NAMESPACE)
    await _until(lambda: _gone(admin, "trainer"))
    assert [c.uid for c in node.shim.unprepared] == [uid]
    assert not spec_path.exists()
    released = await _until(lambda: _unreserved(admin, "pair"))
    # The resourceclaim controller deallocates a claim no pod uses any more.
    assert "allocation" not in released["status"]


def _pod(name: str, claim: str) -> dict[str, Any]:
    return {
        "apiVersion": "v1", "kind": "Pod", "metadata": {"name": name},
        "spec": {
            "containers": [{"name": "main", "image": "registry.k8s.io/pause:3.10",
                            "resources": {"claims": [{"name": "gpus"}]}}],
            "resourceClaims": [{"name": "gpus", "resourceClaimName": claim}],
        },
    }  # fmt: skip


async def _phase(admin: KubeClient, name: str, phase: str) -> dict[str, Any] | None:
    pod = await admin.get(PODS, name, namespace=NAMESPACE)
    return pod if (pod.get("status") or {}).get("phase") == phase else None


async def _gone(admin: KubeClient, name: str) -> bool:
    listed = await admin.list(PODS, namespace=NAMESPACE, field_selector=f"metadata.name={name}")
    return not listed["items"]


async def _unreserved(admin: KubeClient, name: str) -> dict[str, Any] | None:
    claim = await admin.get(RESOURCE_CLAIMS, name, namespace=NAMESPACE)
    return None if claim["status"].get("reservedFor") else claim


async def _until(check: Any, *, timeout_s: float = 30.0) -> Any:
    async with asyncio.timeout(timeout_s):
        while True:
            result = await check()
            if result:
                return result
            await asyncio.sleep(0.2)
