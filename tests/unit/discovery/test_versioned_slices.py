"""Slices laid out by the API server's version: 1.34 counters beside their consumers, 1.35+
counters apart; pciBusID only from 1.36; taints within each version's limits; partitions
withheld when the server has DRAPartitionableDevices off."""

from __future__ import annotations

from typing import Any

import pytest

from services.discovery import apirules, layout, slices
from shared.pb.drasuite.v1 import inventory_pb2

DRIVER = "sim.dra-suite.io"
V134, V135, V136 = (apirules.for_minor(m) for m in (34, 35, 36))


def _inventory(devices: list[inventory_pb2.Device], **kwargs: Any) -> inventory_pb2.Inventory:
    return inventory_pb2.Inventory(
        driver=DRIVER, node="n1", pool="n1", backend="sim", devices=devices, **kwargs
    )


def _counter_set(name: str, counters: int) -> inventory_pb2.CounterSet:
    return inventory_pb2.CounterSet(name=name, counters={f"c{i}": "1" for i in range(counters)})


def _consumer(name: str, *sets: str, counters: int = 1) -> inventory_pb2.Device:
    device = inventory_pb2.Device(name=name)
    for counter_set in sets:
        device.consumes_counters.add(
            counter_set=counter_set, counters={f"c{i}": "1" for i in range(counters)}
        )
    return device


def _shape(pool: slices.DesiredPool) -> list[tuple[list[str], int]]:
    """(counter set names, device count) per slice."""
    return [
        ([s["name"] for s in c.get("sharedCounters", [])], len(c.get("devices", [])))
        for c in pool.contents
    ]


def _counted(contents: tuple[dict[str, Any], ...]) -> list[tuple[int, int, int]]:
    """(counters in sets, devices, counters consumed) per slice."""
    return [
        (
            sum(len(s["counters"]) for s in c.get("sharedCounters", [])),
            len(c.get("devices", [])),
            sum(map(layout.counter_uses, c.get("devices", []))),
        )
        for c in contents
    ]


def test_on_1_34_each_gpu_counter_set_shares_a_slice_with_its_partitions(h100_mig_inventory):
    pool = slices.desired(h100_mig_inventory, rules=V134)
    assert pool.rejected == ()
    assert _counted(pool.contents) == [(30, 52, 442)] * 4  # two GPUs per slice
    for content in pool.contents:
        sets = {s["name"] for s in content["sharedCounters"]}
        used = {c["counterSet"] for d in content["devices"] for c in d["consumesCounters"]}
        assert used == sets


@pytest.mark.parametrize("rules", [V135, V136], ids=["1.35", "1.36"])
def test_from_1_35_counter_sets_get_slices_of_their_own(h100_mig_inventory, rules):
    pool = slices.desired(h100_mig_inventory, rules=rules)
    assert [len(c.get("sharedCounters", [])) for c in pool.contents] == [8, 0, 0, 0, 0]
    assert [len(c.get("devices", [])) for c in pool.contents] == [0, 64, 64, 64, 16]


@pytest.mark.parametrize(
    ("counter_sets", "devices", "shape"),
    [
        (
            [_counter_set("a", 20), _counter_set("b", 20)],
            [_consumer("d-a", "a"), _consumer("d-b", "b")],
            [(["a"], 1), (["b"], 1)],
        ),
        (
            [_counter_set("a", 10), _counter_set("b", 10)],
            [_consumer("d-a", "a"), _consumer("d-b", "b")],
            [(["a", "b"], 2)],
        ),
        (
            [_counter_set("a", 10), _counter_set("b", 10), _counter_set("c", 10)],
            [_consumer("d-ab", "a", "b"), _consumer("d-c", "c")],
            [(["a", "b", "c"], 2)],
        ),
        (
            [_counter_set("a", 5)],
            [_consumer("d-a", "a"), inventory_pb2.Device(name="plain")],
            [(["a"], 1), ([], 1)],
        ),
        ([_counter_set("a", 5)], [], [(["a"], 0)]),
    ],
    ids=[
        "too-many-counters-together",
        "two-sets-fit",
        "linked-sets-travel-together",
        "plain-devices-apart",
        "set-without-consumers",
    ],
)
def test_on_1_34_groups_are_packed_within_the_per_slice_limits(counter_sets, devices, shape):
    pool = slices.desired(_inventory(devices, shared_counters=counter_sets), rules=V134)
    assert pool.rejected == ()
    assert _shape(pool) == shape


@pytest.mark.parametrize(
    ("counter_sets", "devices", "problem"),
    [
        (
            [_counter_set("a", 20), _counter_set("b", 20)],
            [_consumer("d", "a", "b")],
            "40 shared counters in one slice, more than Kubernetes 1.34 allows 32",
        ),
        (
            [_counter_set("a", 1)],
            [_consumer(f"d{i:02d}", "a") for i in range(65)],
            "65 devices in one slice, more than Kubernetes 1.34 allows 64",
        ),
        (
            [_counter_set("a", 30)],
            [_consumer(f"d{i:02d}", "a", counters=30) for i in range(35)],
            "1050 counters consumed by its devices in one slice",
        ),
    ],
    ids=["counters", "devices", "counter-uses"],
)
def test_on_1_34_a_group_too_big_for_one_slice_is_rejected_whole(counter_sets, devices, problem):
    pool = slices.desired(_inventory(devices, shared_counters=counter_sets), rules=V134)
    assert pool.contents == ({"devices": []},)
    assert {r.name for r in pool.rejected} == {d.name for d in devices} | {
        s.name for s in counter_sets
    }
    assert problem in pool.rejected[0].problems[0]
    assert {r.reason for r in pool.rejected} == {"over_limit"}


def test_on_1_34_a_device_consuming_more_than_32_counters_is_rejected():
    device = _consumer("d", "a", "b", counters=17)
    sets = [_counter_set("a", 17), _counter_set("b", 17)]
    pool = slices.desired(_inventory([device], shared_counters=sets), rules=V134)
    assert "consumes 34 counters, more than Kubernetes 1.34 allows" in pool.rejected[0].problems
    assert pool.rejected[0].reason == "over_limit"


@pytest.mark.parametrize(
    ("rules", "published"),
    [(V134, False), (V135, False), (V136, True)],
    ids=["1.34", "1.35", "1.36"],
)
def test_pci_bus_id_is_published_only_from_1_36(h100_mig_inventory, rules, published):
    pool = slices.desired(h100_mig_inventory, rules=rules)
    gpu = next(d for c in pool.contents for d in c.get("devices", []) if d["name"] == "gpu-0")
    assert (apirules.PCI_BUS_ID in gpu["attributes"]) is published
    assert "resource.kubernetes.io/pcieRoot" not in gpu["attributes"]  # no sysfs here


TAINTS = [
    {"key": "a", "effect": "None"},
    {"key": "b", "effect": "NoSchedule"},
    {"key": "c", "effect": "NoSchedule"},
    {"key": "d", "effect": "NoSchedule"},
    {"key": "e", "effect": "NoExecute"},
    {"key": "f", "effect": "NoSchedule"},
]


@pytest.mark.parametrize(
    ("rules", "keys"),
    [
        (V134, ["e", "b", "c", "d"]),
        (V135, ["e", "b", "c", "d", "f", "a"]),
        (V136.without(["DRADeviceTaints"]), []),
    ],
    ids=["1.34-four-strongest-no-none", "1.35-all", "gate-off-none"],
)
def test_taints_are_kept_within_what_the_version_accepts(rules, keys):
    pool = slices.desired(
        _inventory([inventory_pb2.Device(name="d")]), taints={"d": TAINTS}, rules=rules
    )
    (device,) = pool.contents[0]["devices"]
    assert [t["key"] for t in device.get("taints", [])] == keys


def test_without_partitionable_devices_only_whole_gpus_are_published(h100_mig_inventory):
    pool = slices.desired(h100_mig_inventory, rules=V135.without(["DRAPartitionableDevices"]))
    (content,) = pool.contents
    assert [d["name"] for d in content["devices"]] == [f"gpu-{i}" for i in range(8)]
    assert all("consumesCounters" not in d for d in content["devices"])
    assert len(pool.withheld) == 8 * 25
    assert pool.rejected == ()
