"""Property: every allocation `explain` says it would make is one the API server accepts as the
claim's status, and it never double-books a device, a shared counter or a device's capacity,
counting what other claims already hold."""

from __future__ import annotations

from collections import Counter
from decimal import Decimal
from typing import Any

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from devcluster.apiserver.config import ClusterConfig
from devcluster.apiserver.registry import Registry
from devcluster.apiserver.validation import Validator
from services.allocator.allocator import Cluster
from services.allocator.errors import ClaimError
from services.allocator.explanation import explain
from services.allocator.request import read_claim
from shared import quantity

DRIVER = "sim.dra-suite.io"
NODE = "node-a"
Obj = dict[str, Any]
CONFIG = ClusterConfig.for_tests("1.36")
VALIDATOR = Validator(CONFIG)
_CLAIMS = Registry(CONFIG).for_plural("resourceclaims")
assert _CLAIMS is not None
CLAIMS = _CLAIMS
COUNTER_TOTAL = 2


@st.composite
def devices(draw: st.DrawFn) -> list[Obj]:
    out = []
    for i in range(draw(st.integers(1, 6))):
        device: Obj = {
            "name": f"npu-{i}",
            "attributes": {
                "type": {"string": "npu"},
                "numa": {"int": draw(st.integers(0, 1))},
                "ring": {"string": draw(st.sampled_from(["r0", "r1"]))},
            },
        }
        if draw(st.booleans()):
            device["allowMultipleAllocations"] = True
            memory: Obj = {"value": f"{draw(st.integers(1, 8)) * 10}Gi"}
            if draw(st.booleans()):
                memory["requestPolicy"] = {
                    "default": "1Gi",
                    "validRange": {"min": "1Gi", "step": "1Gi"},
                }
            device["capacity"] = {"memory": memory}
        if draw(st.booleans()):
            device["consumesCounters"] = [
                {"counterSet": "set", "counters": {"c": {"value": str(draw(st.integers(1, 2)))}}}
            ]
        if draw(st.integers(0, 3)) == 0:
            device["taints"] = [{"key": "example.com/bad", "effect": "NoSchedule"}]
        out.append(device)
    return out


@st.composite
def scenarios(draw: st.DrawFn) -> tuple[list[Obj], list[Obj], Obj]:
    pool_devices = draw(devices())
    spec = {
        "driver": DRIVER,
        "nodeName": NODE,
        "pool": {"name": NODE, "generation": 1, "resourceSliceCount": 1},
        "devices": pool_devices,
        "sharedCounters": [{"name": "set", "counters": {"c": {"value": str(COUNTER_TOTAL)}}}],
    }
    slices = [{"metadata": {"name": "s0"}, "spec": spec}]
    others = []
    held: list[Obj] = []
    counters_held = 0
    for device in pool_devices:
        if draw(st.integers(0, 3)) != 0:
            continue
        wanted = sum(int(c["counters"]["c"]["value"]) for c in device.get("consumesCounters", []))
        if counters_held + wanted > COUNTER_TOTAL:
            continue  # other claims were allocated by the same rules: never overcommitted
        counters_held += wanted
        result: Obj = {"request": "r", "driver": DRIVER, "pool": NODE, "device": device["name"]}
        if device.get("allowMultipleAllocations"):
            result["shareID"] = f"00000000-0000-4000-8000-{len(held):012d}"
            result["consumedCapacity"] = {"memory": "5Gi"}
        held.append(result)
    if held:
        status = {"allocation": {"devices": {"results": held}}}
        meta = {"name": "other", "namespace": "default", "uid": "other"}
        others.append({"metadata": meta, "spec": {"devices": {}}, "status": status})
    return slices, others, draw(claims())


@st.composite
def requests(draw: st.DrawFn, name: str) -> Obj:
    def exactly(*, admin: bool = False) -> Obj:
        body: Obj = {"deviceClassName": "npu"}
        if draw(st.integers(0, 4)) == 0:
            body["allocationMode"] = "All"
        else:
            body["allocationMode"] = "ExactCount"
            body["count"] = draw(st.integers(1, 3))
        if draw(st.booleans()):
            body["tolerations"] = [{"key": "example.com/bad", "operator": "Exists"}]
        if draw(st.booleans()):
            body["capacity"] = {"requests": {"memory": f"{draw(st.integers(1, 40))}Gi"}}
        if admin and draw(st.integers(0, 5)) == 0:
            body["adminAccess"] = True  # the API allows it on `exactly` requests only
        return body

    if draw(st.booleans()):
        return {"name": name, "exactly": exactly(admin=True)}
    return {
        "name": name,
        "firstAvailable": [
            {"name": f"alt{i}", **exactly()} for i in range(draw(st.integers(1, 3)))
        ],
    }


@st.composite
def claims(draw: st.DrawFn) -> Obj:
    names = [f"req{i}" for i in range(draw(st.integers(1, 3)))]
    constraints = []
    for _ in range(draw(st.integers(0, 2))):
        kind = draw(st.sampled_from(["matchAttribute", "distinctAttribute"]))
        attribute = draw(st.sampled_from([f"{DRIVER}/numa", f"{DRIVER}/ring"]))
        constraints.append(
            {"requests": draw(st.lists(st.sampled_from(names), unique=True)), kind: attribute}
        )
    return {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaim",
        "metadata": {"name": "claim", "namespace": "default", "uid": "claim"},
        "spec": {
            "devices": {"requests": [draw(requests(n)) for n in names], "constraints": constraints}
        },
    }


CLASSES = [{"metadata": {"name": "npu"}, "spec": {"selectors": []}}]


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(scenarios())
def test_allocations_pass_validation_and_never_double_book(scenario):
    slices, others, claim = scenario
    cluster = Cluster.build(slices=slices, classes=CLASSES, claims=others)
    try:
        spec = read_claim(claim, cluster.classes)
    except ClaimError:
        return
    report = explain(cluster, spec, nodes=[NODE]).nodes[0]
    if not report.fits:
        return
    results = [r.as_json() for r in report.allocation]
    status = {
        "allocation": {
            "devices": {"results": results},
            "nodeSelector": {
                "nodeSelectorTerms": [
                    {"matchFields": [{"key": "metadata.name", "operator": "In", "values": [NODE]}]}
                ]
            },
        }
    }
    written = {**claim, "status": status}
    VALIDATOR.schema(CLAIMS, written)
    VALIDATOR.semantics(CLAIMS, written, None)
    _never_double_booked(
        slices[0]["spec"],
        [*results, *others[0]["status"]["allocation"]["devices"]["results"]] if others else results,
    )


def _never_double_booked(spec: Obj, results: list[Obj]) -> None:
    devices = {d["name"]: d for d in spec["devices"]}
    whole = Counter(r["device"] for r in results if "shareID" not in r and not r.get("adminAccess"))
    assert all(n == 1 for n in whole.values()), whole
    shared: dict[str, Decimal] = {}
    for r in results:
        if "shareID" in r:
            assert devices[r["device"]].get("allowMultipleAllocations")
            assert r["device"] not in whole
            amount = quantity.parse(r["consumedCapacity"]["memory"])
            shared[r["device"]] = shared.get(r["device"], Decimal(0)) + amount
    for name, used in shared.items():
        assert used <= quantity.parse(devices[name]["capacity"]["memory"]["value"]), name
    taking = {r["device"] for r in results if not r.get("adminAccess")}
    counters = sum(
        int(c["counters"]["c"]["value"])
        for name in taking
        for c in devices[name].get("consumesCounters", [])
    )
    assert counters <= COUNTER_TOTAL
