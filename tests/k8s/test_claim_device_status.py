"""Device status on the claim (KEP-4817) on the real API server: the allocation agent's
device-status task, holding only its own ServiceAccount's token bound to a pod on its node and
the rendered sim overlay's RBAC and admission policy, writes its entries of `status.devices`
of a claim allocated to that node; another node's claim and another driver's entries are
refused (from 1.36 by kube-apiserver's per-driver authorization, `resourceclaims/driver`, and
on every minor by the ValidatingAdmissionPolicy)."""

from __future__ import annotations

import asyncio
import copy
import itertools
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from devcluster.controlplane import RealControlPlane, register_node
from services.allocation.claim.checkpoint import ClaimState, PreparedClaim, PreparedDevice
from services.allocation.node_view.health_board import HealthBoard
from services.allocation.status.publisher import DeviceStatusPublisher
from shared.config import KubeSettings
from shared.errors import KubeError
from shared.kube.client import KubeClient
from shared.kube.resources import PODS, RESOURCE_CLAIMS, ResourceType
from shared.pb.drasuite.v1 import inventory_pb2
from tests.k8s.apply import Applier
from tests.k8s.tokens import pod_bound_token
from tests.unit.deploy.manifests import KUBECTL, render

pytestmark = [
    pytest.mark.k8s,
    pytest.mark.skipif(KUBECTL is None, reason="kubectl renders the overlays"),
]

DRIVER = "sim.dra-suite.io"
NIC = "nic.example.com"
NAMESPACE = "dra-suite"
ACCOUNT = "dra-allocation"
SERVICE_ACCOUNTS = ResourceType("", "v1", "serviceaccounts", "ServiceAccount", namespaced=True)
_nodes = itertools.count(1)
Obj = dict[str, Any]
_WANTED = {
    ("Namespace", NAMESPACE),
    ("ServiceAccount", ACCOUNT),
    ("ClusterRole", "dra-suite-allocation"),
    ("ClusterRoleBinding", "dra-suite-allocation"),
    ("ValidatingAdmissionPolicy", "dra-suite-resourceclaim-status-own-node"),
    ("ValidatingAdmissionPolicyBinding", "dra-suite-resourceclaim-status-own-node"),
}


class _Inventory:
    current = inventory_pb2.Inventory(
        driver=DRIVER, devices=[inventory_pb2.Device(name="gpu-0", uuid="GPU-0aa")]
    )


@pytest.fixture
async def installed(control_plane: RealControlPlane, admin: KubeClient) -> AsyncIterator[None]:
    """The allocation agent's account, role and claim status policy, as the sim overlay
    renders them."""
    components = ("overlays/sim/k8s-1.36",) if control_plane.release.minor_number >= 36 else ()
    docs = [
        d
        for d in render("overlays/sim", components)
        if (d["kind"], d["metadata"]["name"]) in _WANTED
    ]
    assert len(docs) == len(_WANTED)
    applier = Applier(admin)
    try:
        for doc in sorted(docs, key=lambda d: d["kind"] != "Namespace"):
            await applier.create(doc)
        yield
    finally:
        await applier.delete_all()


async def test_the_agent_writes_only_its_entries_of_its_nodes_claims(
    control_plane: RealControlPlane, admin: KubeClient, installed: None, tmp_path: Path
):
    node, other = f"status-{next(_nodes)}", f"status-{next(_nodes)}"
    for name in (node, other):
        await register_node(admin, name)
    mine = await _allocated(admin, "mine", node)
    theirs = await _allocated(admin, "theirs", other)
    token = await pod_bound_token(admin, namespace=NAMESPACE, account=ACCOUNT, node=node)
    settings = KubeSettings(kubeconfig=str(control_plane.write_token_kubeconfig(
        tmp_path / "allocation.kubeconfig", token)))  # fmt: skip
    agent = await KubeClient.connect(settings)
    board = HealthBoard(pool=node)
    publisher = DeviceStatusPublisher(
        agent, driver=DRIVER, node=node, inventory=_Inventory(), board=board
    )
    task = asyncio.create_task(publisher.run())
    try:
        publisher.prepared(_record(mine, node), pods=None)
        written = await _until(lambda: _entries(admin, "mine"))
        (entry,) = written
        assert (entry["driver"], entry["pool"], entry["device"]) == (DRIVER, node, "gpu-0")
        assert {c["type"]: c["status"] for c in entry["conditions"]} == {
            "Ready": "True",
            "Healthy": "Unknown",
        }
        assert entry["data"] == {"uuid": "GPU-0aa"}

        # From 1.36 kube-apiserver's own per-driver check refuses first (validation, before
        # admission); before, the policy does.
        granular = control_plane.release.minor_number >= 36
        refusal = await _refused(agent, admin, theirs, _entry(DRIVER, other, "gpu-0"))
        assert (
            'verb="[arbitrary-node:update]"' if granular else f"allocated to {other})"
        ) in refusal
        current = await admin.get(RESOURCE_CLAIMS, "mine", namespace="default")
        refusal = await _refused(agent, admin, current, _entry(NIC, node, "eth1"))
        assert (f'"{NIC}" is forbidden' if granular else f"entries of driver {DRIVER}") in refusal

        publisher.unprepared(mine["metadata"]["uid"])
        await _until(lambda: _none_left(admin, "mine"))
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
        await agent.close()
        for name in ("mine", "theirs"):
            await admin.delete(RESOURCE_CLAIMS, name, namespace="default")
        await admin.delete(PODS, f"{ACCOUNT}-{node}", namespace=NAMESPACE, grace_period_s=0)


async def _allocated(admin: KubeClient, name: str, node: str) -> Obj:
    """A claim allocated, as the scheduler would, to a device of `node` and a NIC there."""
    claim = await admin.create(RESOURCE_CLAIMS, {
        "apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim",
        "metadata": {"name": name},
        "spec": {"devices": {"requests": [
            {"name": "gpu", "exactly": {"deviceClassName": "gpu.example.com"}},
            {"name": "nic", "exactly": {"deviceClassName": "nic.example.com"}},
        ]}},
    }, namespace="default")  # fmt: skip
    term = {"matchFields": [{"key": "metadata.name", "operator": "In", "values": [node]}]}
    claim["status"] = {"allocation": {
        "devices": {"results": [
            {"request": "gpu", "driver": DRIVER, "pool": node, "device": "gpu-0"},
            {"request": "nic", "driver": NIC, "pool": node, "device": "eth1"},
        ]},
        "nodeSelector": {"nodeSelectorTerms": [term]},
    }}  # fmt: skip
    return await admin.replace(RESOURCE_CLAIMS, claim, namespace="default", subresource="status")


def _record(claim: Obj, node: str) -> PreparedClaim:
    meta = claim["metadata"]
    device = PreparedDevice(request_names=("gpu",), pool=node, device="gpu-0", cdi_device_ids=())
    return PreparedClaim(
        uid=meta["uid"], namespace=meta["namespace"], name=meta["name"], driver=DRIVER,
        state=ClaimState.PREPARE_COMPLETED, devices=(device,),
    )  # fmt: skip


def _entry(driver: str, pool: str, device: str) -> Obj:
    condition = {"type": "Ready", "status": "True", "reason": "Prepared", "message": "",
                 "lastTransitionTime": "2026-01-01T00:00:00Z"}  # fmt: skip
    return {"driver": driver, "pool": pool, "device": device, "conditions": [condition]}


async def _refused(agent: KubeClient, admin: KubeClient, claim: Obj, entry: Obj) -> str:
    """The refusal of adding `entry` to `claim`'s status as the agent. A policy is enforced
    once the API server's informer has seen it (about a second after it is created); a write
    let through before that is undone and tried again."""
    name = claim["metadata"]["name"]
    for _ in range(100):
        current = await admin.get(RESOURCE_CLAIMS, name, namespace="default")
        forged = copy.deepcopy(current)
        forged["status"]["devices"] = [*current["status"].get("devices", []), entry]
        try:
            await agent.replace(RESOURCE_CLAIMS, forged, namespace="default", subresource="status")
        except KubeError as exc:
            return str(exc)
        undone = await admin.get(RESOURCE_CLAIMS, name, namespace="default")
        undone["status"]["devices"] = current["status"].get("devices", [])
        await admin.replace(RESOURCE_CLAIMS, undone, namespace="default", subresource="status")
        await asyncio.sleep(0.1)
    raise AssertionError(f"the agent's write of {entry['driver']}/{entry['device']} went through")


async def _entries(admin: KubeClient, name: str) -> list[Obj]:
    claim = await admin.get(RESOURCE_CLAIMS, name, namespace="default")
    return [d for d in claim["status"].get("devices", []) if d["driver"] == DRIVER]


async def _none_left(admin: KubeClient, name: str) -> bool:
    return not await _entries(admin, name)


async def _until(check: Any, *, timeout_s: float = 30.0) -> Any:
    async with asyncio.timeout(timeout_s):
        while True:
            result = await check()
            if result:
                return result
            await asyncio.sleep(0.2)
