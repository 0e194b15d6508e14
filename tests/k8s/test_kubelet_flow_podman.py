"""Podman runs the containers of pods that kube-scheduler placed and the node prepared
(issues 24 and 27): the discovery and allocation agents on the real control plane, the kubelet
shim preparing through the kubelet emulator, and podman started with the CDI device IDs the
prepare answered, reading the agent's spec file (tests/runtime_podman.py).

Two pods on one node: one names a claim (`resourceClaimName`), the other gets its claim from a
template (the controller-manager makes it and sets `resource.kubernetes.io/pod-claim-name`).
Each container gets the env and device nodes the claim's spec says and, from 1.36 on
(`--device-metadata auto`), the claim's device metadata at the contract path. After the pods
are deleted (and so unprepared) podman resolves none of their devices.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import functools
import os
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import Any

import pytest

from devcluster.controlplane import RealControlPlane
from devcluster.controlplane.kubeletshim import KubeletShim
from devcluster.controlplane.nodes import wait_for_service_account
from services.allocation.cdi import spec_files
from shared.config import NATSSettings
from shared.kube.client import KubeClient
from shared.kube.resources import DEVICE_CLASSES, PODS, RESOURCE_CLAIMS, ResourceType
from tests import runtime_podman
from tests.k8s.nodestack import NodeStack, node_stack
from tests.runtime_podman import Podman

pytestmark = pytest.mark.k8s

DRIVER = "sim.dra-suite.io"
NODE = "podman-node"
NAMESPACE = "podman"
CLASS = f"podman.{DRIVER}"
CONTRACT_DIR = "/var/run/kubernetes.io/dra-device-attributes"
NAMESPACES = ResourceType("", "v1", "namespaces", "Namespace", namespaced=False)
TEMPLATES = ResourceType(
    "resource.k8s.io", "v1", "resourceclaimtemplates", "ResourceClaimTemplate", True
)


@dataclasses.dataclass
class Node:
    stack: NodeStack
    metadata: bool
    """Whether the agent writes device metadata (`auto`: the API server is 1.36 or newer)."""

    @property
    def admin(self) -> KubeClient:
        return self.stack.admin

    @property
    def shim(self) -> KubeletShim:
        return self.stack.shim

    @property
    def cdi_root(self) -> Path:
        return self.stack.cdi_root


@pytest.fixture(scope="session")
def podman(tmp_path_factory: pytest.TempPathFactory) -> Podman:
    return runtime_podman.podman_runtime(tmp_path_factory)


@pytest.fixture
async def node(
    control_plane: RealControlPlane, nats_settings: NATSSettings, podman: Podman
) -> AsyncIterator[Node]:
    admin = await KubeClient.connect(control_plane.kube_settings())
    try:
        await admin.create(NAMESPACES, {"metadata": {"name": NAMESPACE}})
        await wait_for_service_account(admin, NAMESPACE)
        await admin.create(DEVICE_CLASSES, {
            "apiVersion": "resource.k8s.io/v1", "kind": "DeviceClass",
            "metadata": {"name": CLASS},
            "spec": {"selectors": [{"cel": {"expression": f'device.driver == "{DRIVER}"'}}]},
        })  # fmt: skip
        await admin.create(TEMPLATES, {
            "apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaimTemplate",
            "metadata": {"name": "one-gpu"},
            "spec": {"spec": {"devices": {"requests": [
                {"name": "gpus", "exactly": {"deviceClassName": CLASS}},
            ]}}},
        }, namespace=NAMESPACE)  # fmt: skip
        metadata = control_plane.release.minor_number >= 36
        async with node_stack(
            admin, nats_settings, control_plane.kube_settings(), node=NODE, driver=DRIVER,
            prefix="dra-k8s-podman-",
        ) as stack:  # fmt: skip
            yield Node(stack, metadata)
    finally:
        await admin.close()


async def test_podman_runs_the_scheduled_pods_with_their_claims_devices(node: Node, podman: Podman):
    admin = node.admin
    await admin.create(RESOURCE_CLAIMS, {
        "apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim",
        "metadata": {"name": "pair"},
        "spec": {"devices": {"requests": [
            {"name": "gpus", "exactly": {"deviceClassName": CLASS, "count": 2}},
        ]}},
    }, namespace=NAMESPACE)  # fmt: skip
    await admin.create(PODS, _pod("trainer", {"resourceClaimName": "pair"}), namespace=NAMESPACE)
    await admin.create(
        PODS, _pod("server", {"resourceClaimTemplateName": "one-gpu"}), namespace=NAMESPACE
    )
    device_ids: list[str] = []
    with contextlib.ExitStack() as links:
        for pod_name, count in (("trainer", 2), ("server", 1)):
            pod = await _until(functools.partial(_running, admin, pod_name))
            assert pod["spec"]["nodeName"] == NODE
            made = pod["status"].get("resourceClaimStatuses") or []  # claims from a template
            claim_name = made[0]["resourceClaimName"] if made else "pair"
            claim = await admin.get(RESOURCE_CLAIMS, claim_name, namespace=NAMESPACE)
            uid = claim["metadata"]["uid"]
            pod_claim_name = (claim["metadata"].get("annotations") or {}).get(
                "resource.kubernetes.io/pod-claim-name"
            )
            assert (pod_claim_name is None) == (pod_name == "trainer")
            ids = node.shim.pods[f"{NAMESPACE}/{pod_name}"].cdi_devices[uid]
            assert len(ids) == count
            device_ids += ids
            spec_path = node.cdi_root / spec_files.spec_file_name(DRIVER, uid)
            links.enter_context(runtime_podman.published(spec_path))
            spec = runtime_podman.read_spec(spec_path)
            edits = runtime_podman.spec_edits(spec, ids)
            assert edits.env
            assert edits.nodes
            contract = (
                f"{CONTRACT_DIR}/resourceclaimtemplates/{pod_claim_name}/gpus/{DRIVER}-metadata.json"
                if pod_claim_name
                else f"{CONTRACT_DIR}/resourceclaims/{claim_name}/gpus/{DRIVER}-metadata.json"
            )

            seen = await podman.look(ids, nodes=list(edits.nodes), files=[contract])

            assert {key: seen.env.get(key) for key in edits.env} == edits.env
            assert seen.nodes == {path: _rdev(host) for path, host in edits.nodes.items()}
            text = seen.files[contract]
            if not node.metadata:
                assert text is None
                continue
            assert text is not None
            assert edits.mounted_files() == {contract: text}
            newest = runtime_podman.json_objects(text)[0]
            assert newest["metadata"]["uid"] == uid
            assert newest["metadata"]["name"] == claim_name
            assert newest.get("podClaimName") == pod_claim_name
            (request,) = newest["requests"]
            allocated = claim["status"]["allocation"]["devices"]["results"]
            assert request["name"] == "gpus"
            assert [(d["driver"], d["pool"], d["name"]) for d in request["devices"]] == [
                (r["driver"], r["pool"], r["device"]) for r in allocated
            ]

        for pod_name in ("trainer", "server"):
            await admin.delete(PODS, pod_name, namespace=NAMESPACE)
        for pod_name in ("trainer", "server"):
            await _until(functools.partial(_gone, admin, pod_name))
        for device_id in device_ids:
            await podman.assert_unresolvable([device_id])


def _pod(name: str, claim: dict[str, str]) -> dict[str, Any]:
    return {
        "apiVersion": "v1", "kind": "Pod", "metadata": {"name": name},
        "spec": {
            "nodeSelector": {"kubernetes.io/hostname": NODE},
            "containers": [{"name": "main", "image": "registry.k8s.io/pause:3.10",
                            "resources": {"claims": [{"name": "gpus"}]}}],
            "resourceClaims": [{"name": "gpus", **claim}],
        },
    }  # fmt: skip


def _rdev(host: str) -> tuple[int, int]:
    st = os.stat(host)
    return os.major(st.st_rdev), os.minor(st.st_rdev)


async def _running(admin: KubeClient, name: str) -> dict[str, Any] | None:
    pod = await admin.get(PODS, name, namespace=NAMESPACE)
    return pod if (pod.get("status") or {}).get("phase") == "Running" else None


async def _gone(admin: KubeClient, name: str) -> bool:
    listed = await admin.list(PODS, namespace=NAMESPACE, field_selector=f"metadata.name={name}")
    return not listed["items"]


async def _until(check: Callable[[], Awaitable[Any]], *, timeout_s: float = 30.0) -> Any:
    async with asyncio.timeout(timeout_s):
        while True:
            result = await check()
            if result:
                return result
            await asyncio.sleep(0.2)
