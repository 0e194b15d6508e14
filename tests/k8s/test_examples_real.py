"""Every example pod under deploy/kustomize/examples/ on the real control plane (issue 24):
kube-scheduler places it from the slices our discovery agent publishes, its claims (named
ones, and those the controller-manager makes from templates) are allocated, and the kubelet
shim prepares them through the kubelet emulator and the allocation agent; deleting the pods
unprepares them.

Each example gets a node of its own (and a namespace of its own), with the profile, overlay
and driver tests/unit/allocator/corpus/deploy_examples.yaml names for it, and its pods are
pinned there by a nodeSelector. gpu-nic-same-pcie-root.yaml asks for a NIC of another driver,
which no node here has: its pod stays Pending (Unschedulable). kubevirt/ holds a
VirtualMachineInstance and npu-admin-access.yaml a DaemonSet, not Pods; they are not here.
"""

from __future__ import annotations

import asyncio
import contextlib
import copy
import functools
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import pytest
import yaml

from devcluster.controlplane import RealControlPlane
from devcluster.controlplane.kubeletshim import KubeletShim
from devcluster.controlplane.nodes import wait_for_service_account
from services.allocation.cdi import spec_files
from shared.config import NATSSettings
from shared.errors import DraSuiteError, KubeAlreadyExistsError, KubeNotFoundError
from shared.kube.client import KubeClient
from shared.kube.resources import DEVICE_CLASSES, PODS, RESOURCE_CLAIMS, ResourceType
from tests.k8s.apply import Applier
from tests.k8s.nodestack import node_stack

pytestmark = pytest.mark.k8s

Obj = dict[str, Any]
ROOT = Path(__file__).resolve().parents[2]
KUSTOMIZE = ROOT / "deploy" / "kustomize"
CORPUS = ROOT / "tests" / "unit" / "allocator" / "corpus" / "deploy_examples.yaml"
NAMESPACES = ResourceType("", "v1", "namespaces", "Namespace", namespaced=False)
NIC_CLASS: Obj = {
    "apiVersion": "resource.k8s.io/v1", "kind": "DeviceClass",
    "metadata": {"name": "nic.example.com"},
    "spec": {"selectors": [{"cel": {"expression": 'device.driver == "nic.example.com"'}}]},
}  # fmt: skip
UNSCHEDULABLE = {"gpu-nic-same-pcie-root.yaml"}


def _docs(file: str) -> list[Obj]:
    return [d for d in yaml.safe_load_all((KUSTOMIZE / "examples" / file).read_text()) if d]


def _settings() -> dict[str, Obj]:
    """Per example file with a Pod: its profile, overlay and driver (the corpus' defaults)."""
    out: dict[str, Obj] = {}
    for entry in yaml.safe_load(CORPUS.read_text())["examples"]:
        file = entry["file"]
        if file.startswith("kubevirt/") or not any(d["kind"] == "Pod" for d in _docs(file)):
            continue
        out[file] = {
            "profile": entry.get("profile", "mixed"),
            "overlay": entry.get("overlay", "sim"),
            "driver": entry.get("driver", "sim.dra-suite.io"),
        }
    return out


SETTINGS = _settings()


@pytest.mark.parametrize("file", sorted(SETTINGS))
async def test_example_pods_are_scheduled_allocated_prepared_and_released(
    file: str, control_plane: RealControlPlane, nats_settings: NATSSettings
) -> None:
    if file.startswith("k8s-1.36/") and control_plane.release.minor_number < 36:
        pytest.skip(f"{file} needs Kubernetes 1.36 defaults")
    settings = SETTINGS[file]
    driver: str = settings["driver"]
    slug = Path(file).stem
    node, namespace = f"ex-{slug}"[:63], f"ex-{slug}"[:63]
    admin = await KubeClient.connect(control_plane.kube_settings())
    applier = Applier(admin)
    own_classes: list[str] = []
    try:
        with contextlib.suppress(KubeAlreadyExistsError):
            await admin.create(NAMESPACES, {"metadata": {"name": namespace}})
        await wait_for_service_account(admin, namespace)
        overlay = KUSTOMIZE / "overlays" / settings["overlay"] / "deviceclasses.yaml"
        classes = [d for d in yaml.safe_load_all(overlay.read_text()) if d]
        if file in UNSCHEDULABLE:
            classes.append(NIC_CLASS)
        for cls in classes:
            if cls["kind"] != "DeviceClass":
                continue
            with contextlib.suppress(KubeAlreadyExistsError):  # another test's, kept
                await admin.create(DEVICE_CLASSES, cls)
                own_classes.append(cls["metadata"]["name"])
        async with node_stack(
            admin, nats_settings, control_plane.kube_settings(), node=node, driver=driver,
            profile=settings["profile"], prefix="dra-k8s-example-",
        ) as stack:  # fmt: skip
            pods = await _apply(applier, file, namespace, node)
            if file in UNSCHEDULABLE:
                for name in pods:
                    await _assert_stays_unschedulable(admin, namespace, name)
                return
            await _assert_prepared_then_released(
                admin, stack.shim, pods, namespace, node, driver, stack.cdi_root
            )
    finally:
        with contextlib.suppress(DraSuiteError):
            await applier.delete_all()
            for name in own_classes:
                with contextlib.suppress(KubeNotFoundError):
                    await admin.delete(DEVICE_CLASSES, name)
        await admin.close()


async def _apply(applier: Applier, file: str, namespace: str, node: str) -> list[str]:
    """Create the example's objects (into `namespace` unless they name their own); Pods are
    pinned to `node`. Returns the Pods' names."""
    pods: list[str] = []
    docs = _docs(file)
    for doc in (d for d in docs if d["kind"] == "Namespace"):
        await applier.create(doc)
    for doc in (d for d in docs if d["kind"] != "Namespace"):
        doc = copy.deepcopy(doc)
        doc["metadata"].setdefault("namespace", namespace)
        if doc["kind"] == "Pod":
            doc["spec"].setdefault("nodeSelector", {})["kubernetes.io/hostname"] = node
            pods.append(doc["metadata"]["name"])
        await applier.create(doc)
    assert pods
    return pods


async def _assert_prepared_then_released(
    admin: KubeClient,
    shim: KubeletShim,
    pods: list[str],
    namespace: str,
    node: str,
    driver: str,
    cdi_root: Path,
) -> None:
    uids: set[str] = set()
    spec_paths: list[Path] = []
    for name in pods:
        pod = await _until(functools.partial(_running, admin, namespace, name))
        assert pod["spec"]["nodeName"] == node
        made = {
            s["name"]: s.get("resourceClaimName")
            for s in pod["status"].get("resourceClaimStatuses") or []
        }
        prepared = shim.pods[f"{namespace}/{name}"]
        assert not prepared.error
        for entry in pod["spec"]["resourceClaims"]:
            claim_name = entry.get("resourceClaimName") or made[entry["name"]]
            claim = await admin.get(RESOURCE_CLAIMS, claim_name, namespace=namespace)
            if "resourceClaimTemplateName" in entry:
                annotations = claim["metadata"].get("annotations") or {}
                assert annotations.get("resource.kubernetes.io/pod-claim-name") == entry["name"]
            results = claim["status"]["allocation"]["devices"]["results"]
            assert results
            assert {(r["driver"], r["pool"]) for r in results} == {(driver, node)}
            reserved = [r["name"] for r in claim["status"].get("reservedFor") or []]
            assert reserved == [name]
            uid = claim["metadata"]["uid"]
            assert prepared.cdi_devices[uid], prepared
            spec_path = cdi_root / spec_files.spec_file_name(driver, uid)
            assert spec_path.exists()
            uids.add(uid)
            spec_paths.append(spec_path)

    for name in pods:
        await admin.delete(PODS, name, namespace=namespace)
    for name in pods:
        await _until(functools.partial(_gone, admin, namespace, name))
    await _until(lambda: _unprepared(shim, uids))
    assert not [p for p in spec_paths if p.exists()]


async def _assert_stays_unschedulable(admin: KubeClient, namespace: str, name: str) -> None:
    async def unschedulable() -> Obj | None:
        pod = await admin.get(PODS, name, namespace=namespace)
        for condition in (pod.get("status") or {}).get("conditions") or []:
            if condition["type"] == "PodScheduled" and condition.get("reason") == "Unschedulable":
                return pod
        return None

    pod = await _until(unschedulable)
    await asyncio.sleep(2)  # and it stays so
    pod = await admin.get(PODS, name, namespace=namespace)
    assert pod["status"]["phase"] == "Pending"
    assert not pod["spec"].get("nodeName")
    for entry in pod["spec"]["resourceClaims"]:
        claim_name = entry.get("resourceClaimName")
        if claim_name:
            claim = await admin.get(RESOURCE_CLAIMS, claim_name, namespace=namespace)
            assert not (claim.get("status") or {}).get("allocation")


async def _running(admin: KubeClient, namespace: str, name: str) -> Obj | None:
    pod = await admin.get(PODS, name, namespace=namespace)
    return pod if (pod.get("status") or {}).get("phase") == "Running" else None


async def _gone(admin: KubeClient, namespace: str, name: str) -> bool:
    listed = await admin.list(PODS, namespace=namespace, field_selector=f"metadata.name={name}")
    return not listed["items"]


async def _unprepared(shim: KubeletShim, uids: set[str]) -> bool:
    return uids <= {c.uid for c in shim.unprepared}


async def _until(check: Callable[[], Awaitable[Any]], *, timeout_s: float = 15.0) -> Any:
    async with asyncio.timeout(timeout_s):
        while True:
            result = await check()
            if result:
                return result
            await asyncio.sleep(0.2)
