"""The sim overlay's DeviceClasses and the example claims, evaluated with real CEL against the
ResourceSlices the discovery agent builds from the shipped `mixed` sim profile: each selects,
and allocates, exactly what its comments promise."""

from __future__ import annotations

from typing import Any

import pytest

from devcluster import scheduler
from services.discovery import inventory, slices
from shared.vendors.sim.discovery import SimBackend
from tests.unit.deploy.manifests import KUSTOMIZE, _docs

DRIVER = "sim.dra-suite.io"
NODE = "node-a"


async def _sim_slices() -> list[dict[str, Any]]:
    scan = await SimBackend.from_profile("mixed").scan()
    identity = inventory.Identity(driver=DRIVER, node=NODE, pool=NODE, backend="sim")
    pool = slices.desired(inventory.build(scan, identity=identity, scanned_unix_ms=0))
    assert not pool.rejected
    return [
        {
            "metadata": {"name": f"{NODE}-{DRIVER}-{i}"},
            "spec": {"driver": DRIVER, "nodeName": NODE, "pool": {"name": NODE}, **content},
        }
        for i, content in enumerate(pool.contents)
    ]


def _classes() -> dict[str, dict[str, Any]]:
    docs = _docs(KUSTOMIZE / "overlays" / "sim" / "deviceclasses.yaml")
    return {d["metadata"]["name"]: d for d in docs if d["kind"] == "DeviceClass"}


def _example_claims() -> dict[str, dict[str, Any]]:
    claims = {}
    for path in sorted((KUSTOMIZE / "examples").rglob("*.yaml")):
        for doc in _docs(path):
            if doc.get("kind") == "ResourceClaim":
                claims[doc["metadata"]["name"]] = doc
            elif doc.get("kind") == "ResourceClaimTemplate":
                claims[doc["metadata"]["name"]] = {"spec": doc["spec"]["spec"]}
    return claims


@pytest.mark.parametrize(
    ("device_class", "selected"),
    [
        ("npu.sim.dra-suite.io", [f"npu-{i}" for i in range(8)]),
        ("gpu.sim.dra-suite.io", [f"gpu-{i}" for i in range(4)]),
    ],
    ids=["npu-class", "gpu-class"],
)
async def test_sim_device_class_selects_exactly_its_kind(device_class, selected):
    expressions = [s["cel"]["expression"] for s in _classes()[device_class]["spec"]["selectors"]]
    devices = scheduler.devices_of(await _sim_slices())
    chosen = [d.name for d in devices if all(scheduler.matches(e, d) for e in expressions)]
    assert sorted(chosen) == sorted(selected)


EXPECTED = {
    # One NPU: first fit.
    "one-sim-npu": [("npu", "npu-0")],
    # Two NPUs on NUMA node 1 that share an HCCS ring.
    "npu-pair-numa1": [("npus", "npu-4"), ("npus", "npu-5")],
    # Two NPUs on one card, else one ring: the mixed profile's 910B4s are one chip per card.
    "two-sim-npus-card-ring-any": [("npus/same-ring", "npu-0"), ("npus/same-ring", "npu-1")],
    # One GPU; the claim's opaque config does not change what is allocated.
    "one-sim-gpu-timesliced": [("gpu", "gpu-0")],
    # One NPU; tolerations matter only for tainted devices, and the sim slices have none.
    "one-sim-npu-tolerating-injected-faults": [("npu", "npu-0")],
}
# Claims this scheduler cannot allocate on the sim slices, and where they are checked instead
# (test_example_features.py).
NOT_ALLOCATED_ON_SIM = {
    "gpu-with-nic": "unsatisfiable: the sim node has no NIC; satisfiable with a fake NIC slice",
    "all-sim-npus-admin": "allocationMode All with adminAccess: selector matching only",
    "sim-gpu-10gi-share": "capacity requests: selector matching and capacity filter only",
    "one-mig-1g-10gb": "nvidia overlay: allocated against slices of a fake H100 node",
    "vm-gpu-passthrough": "its own DeviceClass over a sim sysfs tree (test_vfio_example.py)",
}


@pytest.mark.parametrize(("claim", "expected"), EXPECTED.items(), ids=list(EXPECTED))
async def test_example_claim_allocates_what_it_promises(claim, expected):
    results = scheduler.allocate(
        _example_claims()[claim], classes=_classes(), slices=await _sim_slices()
    )
    assert [(r.request, r.device) for r in results] == expected
    assert {(r.driver, r.pool) for r in results} == {(DRIVER, NODE)}


def test_every_example_claim_has_an_expectation():
    assert set(_example_claims()) == set(EXPECTED) | set(NOT_ALLOCATED_ON_SIM)
    assert not set(EXPECTED) & set(NOT_ALLOCATED_ON_SIM)
