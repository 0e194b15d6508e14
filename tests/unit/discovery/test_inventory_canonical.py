"""Inventory building: canonical order, content equality, generations only on real change."""

from __future__ import annotations

import random

import pytest

from services.discovery import inventory
from shared.bus import codec
from shared.pb.drasuite.v1 import inventory_pb2
from shared.vendors.parts.discovery import Scan

IDENTITY = inventory.Identity(driver="sim.dra-suite.io", node="n1", pool="n1", backend="sim")


def _device(name: str, numa: int = 0, **capacity: str) -> inventory_pb2.Device:
    device = inventory_pb2.Device(name=name, kind="npu", capacity=capacity)
    device.attributes["numaNode"].int = numa
    return device


def _build(devices: list[inventory_pb2.Device], *, at_ms: int = 1) -> inventory_pb2.Inventory:
    return inventory.build(Scan(devices=tuple(devices)), identity=IDENTITY, scanned_unix_ms=at_ms)


def test_devices_are_sorted_by_name_whatever_the_scan_order():
    devices = [_device(f"npu-{i}") for i in range(10)]
    shuffled = devices[:]
    random.Random(7).shuffle(shuffled)
    built = _build(shuffled)
    assert [d.name for d in built.devices] == sorted(d.name for d in devices)
    assert codec.encode(built) == codec.encode(_build(devices))


def test_inventory_carries_identity_and_starts_at_generation_zero():
    built = _build([_device("npu-0")], at_ms=42)
    assert (built.driver, built.node, built.pool, built.backend) == (
        "sim.dra-suite.io",
        "n1",
        "n1",
        "sim",
    )
    assert (built.generation, built.scanned_unix_ms) == (0, 42)


def test_scan_time_and_generation_are_not_content():
    first = _build([_device("npu-0")], at_ms=1)
    later = _build([_device("npu-0")], at_ms=999)
    later.generation = 7
    assert inventory.same_content(first, later)
    assert inventory.digest(first) == inventory.digest(later)


@pytest.mark.parametrize(
    "changed",
    [
        [_device("npu-0", numa=1)],
        [_device("npu-0"), _device("npu-1")],
        [_device("npu-0", memory="32Gi")],
        [],
    ],
    ids=["attribute-value", "device-added", "capacity-added", "all-removed"],
)
def test_real_changes_are_detected(changed):
    assert not inventory.same_content(_build([_device("npu-0")]), _build(changed))


def test_first_successor_has_generation_one():
    following = inventory.successor(None, _build([_device("npu-0")]))
    assert following is not None
    assert following.generation == 1


def test_successor_is_none_when_only_the_scan_time_moved():
    previous = inventory.successor(None, _build([_device("npu-0")], at_ms=1))
    assert inventory.successor(previous, _build([_device("npu-0")], at_ms=2)) is None


def test_successor_bumps_generation_by_one_on_change():
    previous = inventory.successor(None, _build([_device("npu-0")]))
    following = inventory.successor(previous, _build([_device("npu-0", numa=3)]))
    assert following is not None
    assert following.generation == 2


def test_successor_never_reuses_a_generation_below_the_floor():
    following = inventory.successor(None, _build([_device("npu-0")]), floor=9)
    assert following is not None
    assert following.generation == 10


def test_counter_consumptions_are_sorted_for_stable_bytes():
    a = _device("npu-0")
    a.consumes_counters.add(counter_set="b")
    a.consumes_counters.add(counter_set="a")
    b = _device("npu-0")
    b.consumes_counters.add(counter_set="a")
    b.consumes_counters.add(counter_set="b")
    assert inventory.content(_build([a])) == inventory.content(_build([b]))
