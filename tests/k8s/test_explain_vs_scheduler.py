"""`dractl explain` checked against kube-scheduler: every scenario of the allocator corpus
(tests/unit/allocator/corpus) that a pod can express without other claims' allocations or
DeviceTaintRules is created on the real control plane (its slices, classes and claim, each
scenario under a driver, classes and a node of its own) with a pod that must land on the
scenario's node; explain's verdict (fits or not) must be whether kube-scheduler binds the pod.

The scheduler's own words are coarse: a pod that cannot be placed gets PodScheduled=False with
reason `Unschedulable`, whatever explain's reason (a class that selects nothing, a constraint,
a taint, capacity); so the verdict is what is compared, and `_SCHEDULER_REASON` is the mapping.
Runs on 1.36+ (consumable capacity, partitionable devices and binding conditions are beta and
on there; on older minors the API server drops those fields).
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import json
from collections.abc import AsyncIterator
from typing import Any

import pytest

from devcluster.controlplane import RealControlPlane, register_node
from devcluster.controlplane.nodes import wait_for_service_account
from shared.errors import KubeError
from shared.kube.client import KubeClient
from shared.kube.resources import (
    DEVICE_CLASSES,
    PODS,
    RESOURCE_CLAIMS,
    RESOURCE_SLICES,
    ResourceType,
)
from tests.unit.allocator.corpus import DRIVER, Scenario, load
from tests.unit.allocator.test_corpus import _run

pytestmark = pytest.mark.k8s

NAMESPACES = ResourceType("", "v1", "namespaces", "Namespace", namespaced=False)
_SCHEDULER_REASONS = {True: {"bound"}, False: {"Unschedulable", "SchedulerError"}}
"""explain's verdict -> what kube-scheduler reports for the pod: bound, or PodScheduled=False
with `Unschedulable` (no node fits) or `SchedulerError` (the claim can never be allocated, e.g.
more than 32 results)."""
KNOWN_DISAGREEMENTS: dict[str, str] = {}
"""Scenario name -> why explain and kube-scheduler disagree (none known)."""


def _expressible(scenario: Scenario) -> bool:
    raw, expect = scenario.raw, scenario.expect
    if "fits" not in expect or "claimError" in expect:
        return False
    if raw.get("others") or raw.get("taintRules"):
        return False  # other claims' allocations and rules: not expressed here yet
    text = json.dumps(raw)
    return "bindingConditions" not in text  # a bound pod then waits for the conditions


SCENARIOS = [s for s in load() if _expressible(s)]
_ids = itertools.count(1)


@pytest.fixture
async def admin(control_plane: RealControlPlane) -> AsyncIterator[KubeClient]:
    if control_plane.release.minor_number < 36:
        pytest.skip("the corpus uses fields beta from 1.36 (consumable capacity, counters)")
    client = await KubeClient.connect(control_plane.kube_settings())
    yield client
    await client.close()


@pytest.mark.parametrize("scenario", SCENARIOS, ids=[s.name for s in SCENARIOS])
async def test_explain_agrees_with_kube_scheduler(scenario: Scenario, admin: KubeClient):
    report, _, _ = _run(scenario)
    assert report is not None
    explained = report.fits
    n = next(_ids)
    driver, node, namespace = f"s{n}.{DRIVER}", f"explain-{n}", f"explain-{n}"
    created: list[tuple[ResourceType, str]] = []
    try:
        await _create_world(admin, scenario, n, driver=driver, node=node, namespace=namespace,
                            created=created)  # fmt: skip
        scheduled = await _scheduler_verdict(admin, namespace)
    finally:
        for rt, name in reversed(created):
            with contextlib.suppress(KubeError):
                await admin.delete(rt, name)
    agreed = scheduled in _SCHEDULER_REASONS[explained]
    if scenario.name in KNOWN_DISAGREEMENTS:
        assert not agreed, f"{scenario.name} agrees now: remove it from KNOWN_DISAGREEMENTS"
        return
    assert agreed, f"explain says fits={explained}, kube-scheduler: {scheduled}"


def _rewrite(objects: Any, n: int, *, driver: str, node: str) -> Any:
    """The scenario's objects under its own driver, classes and node."""
    text = json.dumps(objects).replace(DRIVER, driver)
    rewritten = json.loads(text)
    for item in rewritten if isinstance(rewritten, list) else [rewritten]:
        spec = item.get("spec", {})
        if spec.get("nodeName") == "node-a":
            spec["nodeName"] = node
        for device in spec.get("devices", []) if isinstance(spec.get("devices"), list) else []:
            if device.get("nodeName") == "node-a":
                device["nodeName"] = node
    return rewritten


def _split_counters(slices: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The corpus writes a pool's counters beside its devices, as 1.34 wants them; from 1.35 a
    counter set lives in a slice of its own, so such a slice becomes two and its pool's slice
    count grows by one (a slice of counters alone drops its empty device list)."""
    out: list[dict[str, Any]] = []
    grown: dict[tuple[str, int], int] = {}
    for item in slices:
        spec = item["spec"]
        if not spec.get("sharedCounters"):
            out.append(item)
            continue
        if not spec.get("devices"):
            out.append({**item, "spec": {k: v for k, v in spec.items() if k != "devices"}})
            continue
        counters = {**item, "metadata": {"name": item["metadata"]["name"] + "-counters"},
                    "spec": {k: v for k, v in spec.items() if k != "devices"}}  # fmt: skip
        devices = {**item, "spec": {k: v for k, v in spec.items() if k != "sharedCounters"}}
        out += [counters, devices]
        key = (spec["pool"]["name"], spec["pool"]["generation"])
        grown[key] = grown.get(key, 0) + 1
    for item in out:
        pool = item["spec"]["pool"]
        extra = grown.get((pool["name"], pool["generation"]), 0)
        item["spec"]["pool"] = {**pool, "resourceSliceCount": pool["resourceSliceCount"] + extra}
    return out


def _class_name(n: int, name: str) -> str:
    return f"s{n}-{name}"


def _rename_classes(claim: dict[str, Any], n: int) -> None:
    for request in claim["spec"]["devices"]["requests"]:
        for alternative in [request.get("exactly"), *request.get("firstAvailable", [])]:
            if alternative and "deviceClassName" in alternative:
                alternative["deviceClassName"] = _class_name(n, alternative["deviceClassName"])


async def _create_world(
    admin: KubeClient, scenario: Scenario, n: int, *, driver: str, node: str, namespace: str,
    created: list[tuple[ResourceType, str]],
) -> None:  # fmt: skip
    await register_node(admin, node)
    labels = {"resource.kubernetes.io/admin-access": "true"}
    await admin.create(NAMESPACES, {"metadata": {"name": namespace, "labels": labels}})
    for item in _rewrite(scenario.classes(), n, driver=driver, node=node):
        item["metadata"]["name"] = _class_name(n, item["metadata"]["name"])
        await admin.create(DEVICE_CLASSES, item)
        created.append((DEVICE_CLASSES, item["metadata"]["name"]))
    for item in _split_counters(_rewrite(scenario.slices(), n, driver=driver, node=node)):
        item["metadata"]["name"] = f"s{n}-{item['metadata']['name']}"[:253]
        await admin.create(RESOURCE_SLICES, item)
        created.append((RESOURCE_SLICES, item["metadata"]["name"]))
    claim = _rewrite(scenario.claim(), n, driver=driver, node=node)
    claim["metadata"] = {"name": "claim"}
    _rename_classes(claim, n)
    await wait_for_service_account(admin, namespace)
    await admin.create(RESOURCE_CLAIMS, claim, namespace=namespace)
    pod = {
        "apiVersion": "v1", "kind": "Pod", "metadata": {"name": "pod"},
        "spec": {
            "nodeSelector": {"kubernetes.io/hostname": node},
            "containers": [{"name": "main", "image": "registry.k8s.io/pause:3.10",
                            "resources": {"claims": [{"name": "c"}]}}],
            "resourceClaims": [{"name": "c", "resourceClaimName": "claim"}],
        },
    }  # fmt: skip
    await admin.create(PODS, pod, namespace=namespace)


async def _scheduler_verdict(admin: KubeClient, namespace: str) -> str:
    """`bound`, or the reason of PodScheduled=False, once kube-scheduler has decided."""
    async with asyncio.timeout(30):
        while True:
            pod = await admin.get(PODS, "pod", namespace=namespace)
            if pod["spec"].get("nodeName"):
                return "bound"
            for condition in (pod.get("status") or {}).get("conditions") or []:
                if condition["type"] == "PodScheduled" and condition["status"] == "False":
                    return str(condition.get("reason", ""))
            await asyncio.sleep(0.1)
