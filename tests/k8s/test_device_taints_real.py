"""Device taints on the real control plane: the health agent taints a faulty device (as a
DeviceTaintRule, or inside the ResourceSlice through the discovery agent), kube-scheduler
never allocates it to a new claim, and with the NoExecute effect the controller-manager's
device-taint-eviction-controller evicts a pod already using it."""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import itertools
from collections.abc import AsyncIterator
from typing import Any

import pytest

from devcluster.controlplane import RealControlPlane
from devcluster.controlplane.kubeletshim import KubeletShim
from devcluster.controlplane.nodes import wait_for_service_account
from devcluster.flow import inject_fault
from services.health.agent import HealthAgent
from services.health.config import HealthConfig
from services.health.rule_objects import rule_selector
from shared.bus.connection import Bus
from shared.config import NATSSettings
from shared.errors import KubeAlreadyExistsError, KubeNotFoundError
from shared.kube.client import KubeClient
from shared.kube.resources import (
    DEVICE_CLASSES,
    EVENTS,
    PODS,
    RESOURCE_CLAIMS,
    RESOURCE_SLICES,
    ResourceType,
    device_taint_rules,
)
from tests.k8s.nodestack import node_stack
from tests.k8s.nodestack import until as _until

pytestmark = pytest.mark.k8s

DRIVER = "sim.dra-suite.io"
CLASS = f"taints.{DRIVER}"
FAULTY, FAULTY_INDEX = "gpu-0", 0
DEVICES = 4  # the sim's `gpu` profile
TAINT_KEY = f"{DRIVER}/injected"
NAMESPACES = ResourceType("", "v1", "namespaces", "Namespace", namespaced=False)
RULE_VERSION = {34: "v1alpha3", 35: "v1alpha3", 36: "v1beta2", 37: "v1"}
"""The DeviceTaintRule version each minor serves (with the release table's gates)."""
TARGETS = pytest.mark.parametrize("target", ["rule", "slice"])
_runs = itertools.count(1)
Obj = dict[str, Any]


@dataclasses.dataclass
class Node:
    name: str
    namespace: str
    admin: KubeClient
    bus: Bus
    shim: KubeletShim
    health: HealthAgent
    minor: int


@contextlib.asynccontextmanager
async def _node(
    control_plane: RealControlPlane, nats: NATSSettings, bus: Bus, *, target: str, effect: str
) -> AsyncIterator[Node]:
    run = next(_runs)
    name, namespace = f"taint-node-{run}", f"taints-{run}"
    admin = await KubeClient.connect(control_plane.kube_settings())
    kube = control_plane.kube_settings()
    try:
        await admin.create(NAMESPACES, {"metadata": {"name": namespace}})
        await wait_for_service_account(admin, namespace)
        with contextlib.suppress(KubeAlreadyExistsError):  # an earlier test of this session
            await admin.create(DEVICE_CLASSES, {
                "apiVersion": "resource.k8s.io/v1", "kind": "DeviceClass",
                "metadata": {"name": CLASS},
                "spec": {"selectors": [{"cel": {"expression": f'device.driver == "{DRIVER}"'}}]},
            })  # fmt: skip
        health = HealthAgent(HealthConfig(
            nats=nats, kube=kube, node_name=name, driver_name=DRIVER, sim_profile="gpu",
            poll_interval_s=0.1, recovery_hold_s=0.0, flap_window_s=0.0, health_refresh_s=0.5,
            taint_effect=effect, taint_target=target,
        ))  # fmt: skip
        try:
            async with node_stack(
                admin, nats, kube, node=name, driver=DRIVER, prefix="dra-k8s-taints-",
                discovery_settings={"publish_device_taints": target == "slice"},
                extra=[(health, lambda: health.ready.is_set() and health.bus.connected.is_set())],
            ) as stack:  # fmt: skip
                yield Node(
                    name, namespace, admin, bus, stack.shim, health,
                    control_plane.release.minor_number,
                )  # fmt: skip
        finally:
            await _clean_up(admin, name)
    finally:
        await admin.close()


async def _clean_up(admin: KubeClient, node: str) -> None:
    """The rules the agents leave behind on purpose (they survive a restart); node_stack
    removes the node and its slices."""
    rules = device_taint_rules(RULE_VERSION[_minor(await admin.get_path("/version"))])
    listed = await admin.list(rules, label_selector=rule_selector(driver=DRIVER, node=node))
    for item in listed["items"]:
        with contextlib.suppress(KubeNotFoundError):
            await admin.delete(rules, item["metadata"]["name"])


@TARGETS
async def test_a_tainted_device_is_never_allocated_to_a_new_claim(
    control_plane: RealControlPlane, nats_settings: NATSSettings, bus: Bus, target: str
):
    async with _node(control_plane, nats_settings, bus, target=target, effect="NoSchedule") as n:
        await inject_fault(n.bus, driver=DRIVER, node=n.name, device=FAULTY)
        taint = await _taint_in_force(n, target)
        assert (taint["key"], taint["effect"]) == (TAINT_KEY, "NoSchedule")
        # The scheduler's informers see the taint a moment after the API server has it.
        await asyncio.sleep(1)

        await _claim_pod(n, "exactly-that", selector=f"== {FAULTY_INDEX}")
        await _claim_pod(n, "all", count=DEVICES)
        await _claim_pod(n, "all-but-one", count=DEVICES - 1)
        placed = await _until(lambda: _phase(n, "all-but-one", "Running"))
        assert placed["spec"]["nodeName"] == n.name
        assert FAULTY not in await _allocated(n, "all-but-one")
        for pod in ("exactly-that", "all"):
            await _until(lambda pod=pod: _unschedulable(n, pod))  # type: ignore[misc]
            claim = await n.admin.get(RESOURCE_CLAIMS, pod, namespace=n.namespace)
            assert "allocation" not in (claim.get("status") or {}), pod

        # The taint, and nothing else, kept the device away: cleared, it is allocated.
        await inject_fault(n.bus, driver=DRIVER, node=n.name, device=FAULTY, clear=True)
        await _until(lambda: _phase(n, "exactly-that", "Running"))
        assert await _allocated(n, "exactly-that") == [FAULTY]
        assert (await _unschedulable(n, "all")) is not None


@TARGETS
async def test_a_noexecute_taint_evicts_the_pod_using_the_device(
    control_plane: RealControlPlane, nats_settings: NATSSettings, bus: Bus, target: str
):
    async with _node(control_plane, nats_settings, bus, target=target, effect="NoExecute") as n:
        await _claim_pod(n, "victim", selector=f"== {FAULTY_INDEX}")
        await _claim_pod(n, "bystander", selector=f"!= {FAULTY_INDEX}")
        for pod in ("victim", "bystander"):
            await _until(lambda pod=pod: _phase(n, pod, "Running"))  # type: ignore[misc]
        victim_claim = await n.admin.get(RESOURCE_CLAIMS, "victim", namespace=n.namespace)
        assert await _allocated(n, "victim") == [FAULTY]

        await inject_fault(n.bus, driver=DRIVER, node=n.name, device=FAULTY)
        taint = await _taint_in_force(n, target)
        assert (taint["key"], taint["effect"]) == (TAINT_KEY, "NoExecute")
        await _until(lambda: _gone(n, "victim"))
        # Nothing else deletes a pod here (the shim only finishes a deletion). The controller's
        # `DeviceTaintManagerEviction` Event is best effort: on 1.34 it was once never written.
        assert victim_claim["metadata"]["uid"] in {c.uid for c in n.shim.unprepared}
        assert await _phase(n, "bystander", "Running"), "a pod on a healthy device stays"


@TARGETS
async def test_a_noschedule_taint_leaves_the_pod_using_the_device_running(
    control_plane: RealControlPlane, nats_settings: NATSSettings, bus: Bus, target: str
):
    async with _node(control_plane, nats_settings, bus, target=target, effect="NoSchedule") as n:
        await _claim_pod(n, "resident", selector=f"== {FAULTY_INDEX}")
        await _until(lambda: _phase(n, "resident", "Running"))
        await inject_fault(n.bus, driver=DRIVER, node=n.name, device=FAULTY)
        await _taint_in_force(n, target)
        await asyncio.sleep(3)  # the eviction controller acts within a second when it does
        assert await _phase(n, "resident", "Running")
        assert not await _evicted_by_the_device_taint_manager(n, "resident")


async def _taint_in_force(n: Node, target: str) -> Obj:
    """The faulty device's taint as the API server holds it: the DeviceTaintRule the health
    agent wrote (in the version this minor serves), or the taint in the device's slice."""
    if target == "rule":
        version = RULE_VERSION[n.minor]
        rules = device_taint_rules(version)
        selector = rule_selector(driver=DRIVER, node=n.name)

        async def rule() -> Obj | None:
            listed = await n.admin.list(rules, label_selector=selector)
            return listed["items"][0] if listed["items"] else None

        found = await _until(rule)
        assert n.health.taints.version == version
        assert found["spec"]["deviceSelector"] == {
            "driver": DRIVER, "pool": n.name, "device": FAULTY,
        }  # fmt: skip
        return dict(found["spec"]["taint"])

    async def in_slice() -> Obj | None:
        slices = await n.admin.list(RESOURCE_SLICES, field_selector=f"spec.nodeName={n.name}")
        for item in slices["items"]:
            for device in item["spec"].get("devices", []):
                if device["name"] == FAULTY and device.get("taints"):
                    return dict(device["taints"][0])
        return None

    return await _until(in_slice)


async def _claim_pod(n: Node, name: str, *, count: int = 1, selector: str = "") -> None:
    request: Obj = {"deviceClassName": CLASS, "count": count}
    if selector:
        index = f'device.attributes["{DRIVER}"].index'
        request["selectors"] = [{"cel": {"expression": f"{index} {selector}"}}]
    await n.admin.create(RESOURCE_CLAIMS, {
        "apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim", "metadata": {"name": name},
        "spec": {"devices": {"requests": [{"name": "gpus", "exactly": request}]}},
    }, namespace=n.namespace)  # fmt: skip
    only_this_node = {"nodeSelectorTerms": [{"matchFields": [
        {"key": "metadata.name", "operator": "In", "values": [n.name]}]}]}  # fmt: skip
    await n.admin.create(PODS, {
        "apiVersion": "v1", "kind": "Pod", "metadata": {"name": name},
        "spec": {
            "affinity": {"nodeAffinity": {
                "requiredDuringSchedulingIgnoredDuringExecution": only_this_node}},
            "containers": [{"name": "main", "image": "registry.k8s.io/pause:3.10",
                            "resources": {"claims": [{"name": "gpus"}]}}],
            "resourceClaims": [{"name": "gpus", "resourceClaimName": name}],
        },
    }, namespace=n.namespace)  # fmt: skip


async def _allocated(n: Node, claim: str) -> list[str]:
    found = await n.admin.get(RESOURCE_CLAIMS, claim, namespace=n.namespace)
    return sorted(r["device"] for r in found["status"]["allocation"]["devices"]["results"])


async def _phase(n: Node, name: str, phase: str) -> Obj | None:
    pod = await n.admin.get(PODS, name, namespace=n.namespace)
    return pod if (pod.get("status") or {}).get("phase") == phase else None


async def _unschedulable(n: Node, name: str) -> Obj | None:
    pod = await n.admin.get(PODS, name, namespace=n.namespace)
    assert not pod["spec"].get("nodeName"), f"{name} was bound to {pod['spec'].get('nodeName')}"
    for condition in (pod.get("status") or {}).get("conditions", []):
        if condition["type"] == "PodScheduled" and condition.get("reason") == "Unschedulable":
            return pod
    return None


async def _gone(n: Node, name: str) -> bool:
    field = f"metadata.name={name}"
    return not (await n.admin.list(PODS, namespace=n.namespace, field_selector=field))["items"]


async def _evicted_by_the_device_taint_manager(n: Node, pod: str) -> bool:
    field = f"involvedObject.name={pod}"
    events = await n.admin.list(EVENTS, namespace=n.namespace, field_selector=field)
    return any(e.get("reason") == "DeviceTaintManagerEviction" for e in events["items"])


def _minor(version: Obj) -> int:
    return int(str(version["minor"]).rstrip("+"))
