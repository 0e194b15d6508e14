"""Partition attribution: the inventory's topology, and parents' faults carried to partitions."""

from __future__ import annotations

from dataclasses import dataclass

import pytest

from services.health import attribution, policy
from services.health.attribution import Topology
from services.health.policy import Health, PolicySettings
from shared.pb.drasuite.v1 import inventory_pb2
from shared.vendors.parts.observation import Fault, Observation

DRIVER = "sim.dra-suite.io"
SET = {"memory-slice-0": "1", "memory-slice-1": "1", "compute-slices": "7"}
XID = Fault(cause="xid", code="79", message="XID 79")
ECC = Fault(cause="ecc", code="double-bit")
LOST = Fault(cause="unmonitored", message="monitor nvml: hung")


def device(
    name: str, *, parent: str = "", uses: dict[str, dict[str, str]] | None = None
) -> inventory_pb2.Device:
    return inventory_pb2.Device(
        name=name,
        parent=parent,
        consumes_counters=[
            inventory_pb2.CounterConsumption(counter_set=s, counters=c)
            for s, c in (uses or {}).items()
        ],
    )


def inventory(
    *devices: inventory_pb2.Device, sets: tuple[str, ...] = ()
) -> inventory_pb2.Inventory:
    return inventory_pb2.Inventory(
        devices=list(devices),
        shared_counters=[inventory_pb2.CounterSet(name=s, counters=SET) for s in sets],
    )


WHOLE = {"gpu-0-counters": SET}
SLICE = {"gpu-0-counters": {"memory-slice-0": "1", "compute-slices": "1"}}
TOPOLOGIES = {
    "the parent field names the parent": (
        inventory(device("gpu-0"), device("gpu-0-mig-a", parent="gpu-0")),
        {"gpu-0-mig-a": "gpu-0"},
    ),
    "a partition consuming the set its parent consumes whole": (
        inventory(
            device("gpu-0", uses=WHOLE), device("gpu-0-mig-a", uses=SLICE), sets=("gpu-0-counters",)
        ),
        {"gpu-0-mig-a": "gpu-0"},
    ),
    "two whole consumers leave the owner unknown": (
        inventory(
            device("gpu-0", uses=WHOLE),
            device("gpu-x", uses=WHOLE),
            device("gpu-0-mig-a", uses=SLICE),
            sets=("gpu-0-counters",),
        ),
        {},
    ),
    "a counter set the inventory does not list has no owner": (
        inventory(device("gpu-0", uses=WHOLE), device("gpu-0-mig-a", uses=SLICE)),
        {},
    ),
    "a parent missing from the inventory is ignored": (
        inventory(device("gpu-0-mig-a", parent="gpu-9")),
        {},
    ),
    "devices without partitions have no parents": (
        inventory(device("gpu-0"), device("gpu-1")),
        {},
    ),
}


@pytest.mark.parametrize(("found", "parents"), TOPOLOGIES.values(), ids=TOPOLOGIES.keys())
def test_topology_finds_each_partitions_parent(
    found: inventory_pb2.Inventory, parents: dict[str, str]
) -> None:
    topology = attribution.topology(found)
    assert dict(topology.parents) == parents
    assert topology.devices == tuple(d.name for d in found.devices)


MIG = Topology(
    devices=("gpu-0", "gpu-0-mig-a", "gpu-0-mig-b", "gpu-1"),
    parents={"gpu-0-mig-a": "gpu-0", "gpu-0-mig-b": "gpu-0"},
)


def seen(name: str, fault: Fault | None = None, *, unknown: bool = False) -> Observation:
    return Observation(device=name, fault=fault, unknown=unknown)


def inherited(fault: Fault) -> Fault:
    return Fault(cause=fault.cause, code=fault.code, message=f"parent gpu-0: {fault.message}")


@dataclass(frozen=True)
class Case:
    view: tuple[Observation, ...]
    expected: tuple[Observation, ...]
    topology: Topology = MIG


ALL_HEALTHY = tuple(seen(d) for d in MIG.devices)
ATTRIBUTIONS = {
    "a parent's fault reaches every partition": Case(
        (seen("gpu-0", XID), *ALL_HEALTHY[1:]),
        (
            seen("gpu-0", XID),
            seen("gpu-0-mig-a", inherited(XID)),
            seen("gpu-0-mig-b", inherited(XID)),
            seen("gpu-1"),
        ),
    ),
    "a partition's fault stays on that partition": Case(
        (seen("gpu-0"), seen("gpu-0-mig-a", XID), seen("gpu-0-mig-b"), seen("gpu-1")),
        (seen("gpu-0"), seen("gpu-0-mig-a", XID), seen("gpu-0-mig-b"), seen("gpu-1")),
    ),
    "a partition keeps its own fault under a faulty parent": Case(
        (seen("gpu-0", XID), seen("gpu-0-mig-a", ECC), seen("gpu-0-mig-b"), seen("gpu-1")),
        (
            seen("gpu-0", XID),
            seen("gpu-0-mig-a", ECC),
            seen("gpu-0-mig-b", inherited(XID)),
            seen("gpu-1"),
        ),
    ),
    "partitions of an unseen parent are unknown too": Case(
        (seen("gpu-0", LOST, unknown=True), *ALL_HEALTHY[1:]),
        (
            seen("gpu-0", LOST, unknown=True),
            seen("gpu-0-mig-a", LOST, unknown=True),
            seen("gpu-0-mig-b", LOST, unknown=True),
            seen("gpu-1"),
        ),
    ),
    "partitions the monitor does not report are added": Case(
        (seen("gpu-0", XID), seen("gpu-1")),
        (
            seen("gpu-0", XID),
            seen("gpu-1"),
            seen("gpu-0-mig-a", inherited(XID)),
            seen("gpu-0-mig-b", inherited(XID)),
        ),
    ),
    "added partitions of a healthy parent are healthy": Case(
        (seen("gpu-0"), seen("gpu-1")),
        (seen("gpu-0"), seen("gpu-1"), seen("gpu-0-mig-a"), seen("gpu-0-mig-b")),
    ),
    "devices of other monitors are not added": Case(
        (seen("gpu-1"),),
        (seen("gpu-1"),),
    ),
    "without a topology the view is unchanged": Case(
        (seen("gpu-0", XID), seen("gpu-0-mig-a")),
        (seen("gpu-0", XID), seen("gpu-0-mig-a")),
        Topology(),
    ),
}


@pytest.mark.parametrize("case", ATTRIBUTIONS.values(), ids=ATTRIBUTIONS.keys())
def test_attribution_carries_parent_faults_to_partitions(case: Case) -> None:
    assert attribution.attribute(case.view, case.topology) == case.expected


def test_a_parent_fault_taints_each_partition_with_the_parents_key_and_code() -> None:
    view = attribution.attribute((seen("gpu-0", XID), seen("gpu-1")), MIG)
    evaluation = policy.evaluate(view, {}, now=0.0, settings=PolicySettings(driver=DRIVER))
    taints = {d: str(s.taint) for d, s in evaluation.states().items() if s.taint is not None}
    assert taints == {
        d: f"{DRIVER}/xid=79:NoSchedule" for d in ("gpu-0", "gpu-0-mig-a", "gpu-0-mig-b")
    }
    assert evaluation.states()["gpu-1"].health is Health.HEALTHY


def test_an_ignored_parent_fault_leaves_partitions_healthy() -> None:
    view = attribution.attribute((seen("gpu-0", Fault(cause="xid", code="13")),), MIG)
    evaluation = policy.evaluate(view, {}, now=0.0, settings=PolicySettings(driver=DRIVER))
    assert {s.health for s in evaluation.states().values()} == {Health.HEALTHY}


def test_topology_indexes_mig_partitions_by_gpu_instance_profile_and_placement() -> None:
    def mig(
        name: str, *, parent: str = "", uses: dict[str, dict[str, str]] | None = None
    ) -> inventory_pb2.Device:
        found = device(name, parent=parent, uses=uses)
        found.kind = "mig"
        return found

    found = attribution.topology(
        inventory(
            device("gpu-0", uses=WHOLE),
            mig("gpu-0-mig-1g10gb-me-20-3", parent="gpu-0"),
            mig("gpu-0-mig-1g10gb-19-0", uses=SLICE),
            mig("gpu-0-mig-unparsable", parent="gpu-0"),
            device("gpu-0-vnpu-1-2", parent="gpu-0"),  # not a MIG partition
            device("gpu-1"),
            mig("gpu-1-mig-3g40gb-9-4", parent="gpu-1"),
            mig("gpu-0-mig-2g20gb-14-2", parent="gpu-1"),  # named after another GPU
            sets=("gpu-0-counters",),
        )
    )
    assert dict(found.gpu_instances) == {
        ("gpu-0", 20, 3): "gpu-0-mig-1g10gb-me-20-3",
        ("gpu-0", 19, 0): "gpu-0-mig-1g10gb-19-0",
        ("gpu-1", 9, 4): "gpu-1-mig-3g40gb-9-4",
    }
    assert attribution.topology(None).gpu_instances == {}
