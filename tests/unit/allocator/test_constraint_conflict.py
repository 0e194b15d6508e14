"""A constraint conflict names the values that clash, so `dractl explain` shows them."""

from __future__ import annotations

from typing import Any

from services.allocator.constraint import Constraint
from services.allocator.device import Device

DRIVER = "sim.dra-suite.io"
NUMA = f"{DRIVER}/numa"


def _device(name: str, **attributes: dict[str, Any]) -> Device:
    return Device.from_json({"name": name, "attributes": attributes}, driver=DRIVER, pool="n")


def test_match_attribute_names_the_device_value_and_the_others():
    constraint = Constraint({"matchAttribute": NUMA}, index=0)
    assert constraint.add("a", "", _device("npu-0", numa={"int": 0}))
    refused = _device("npu-4", numa={"int": 1})
    assert not constraint.add("b", "", refused)
    assert constraint.conflict(refused) == f"its {NUMA} is 1, the others' 0"


def test_distinct_attribute_names_the_taken_value():
    constraint = Constraint({"distinctAttribute": NUMA}, index=0)
    assert constraint.add("a", "", _device("npu-0", numa={"int": 0}))
    refused = _device("npu-1", numa={"int": 0})
    assert not constraint.add("b", "", refused)
    assert constraint.conflict(refused) == f"its {NUMA} 0 is taken"


def test_a_device_without_the_attribute_says_so_and_booleans_read_as_the_slice_writes_them():
    constraint = Constraint({"matchAttribute": f"{DRIVER}/fast"}, index=0)
    bare = _device("npu-9")
    assert not constraint.add("a", "", bare)
    assert constraint.conflict(bare) == f"the device has no {DRIVER}/fast"
    assert constraint.add("a", "", _device("npu-0", fast={"bool": True}))
    slow = _device("npu-1", fast={"bool": False})
    assert not constraint.add("b", "", slow)
    assert constraint.conflict(slow) == f"its {DRIVER}/fast is false, the others' true"
