"""The devcluster allocator with consumable capacity (DRAConsumableCapacity, 1.36): shares of
multi-allocatable devices, request policies, and what other claims already hold."""

from __future__ import annotations

import itertools
from decimal import Decimal
from typing import Any

import pytest

from devcluster.scheduler import (
    AllocationResult,
    UnsatisfiableError,
    allocate,
    allocated_results,
)
from services.allocator import capacity
from services.allocator.device import Device
from shared import quantity

DRIVER = "sim.dra-suite.io"
GI = 2**30


def _gpu(name: str, *, shared: bool, policy: dict[str, Any] | None = None) -> dict[str, Any]:
    memory: dict[str, Any] = {"value": "80Gi"}
    if policy is not None:
        memory["requestPolicy"] = policy
    device: dict[str, Any] = {
        "name": name,
        "attributes": {"type": {"string": "gpu"}, "index": {"int": int(name[-1])}},
        "capacity": {"memory": memory},
    }
    if shared:
        device["allowMultipleAllocations"] = True
    return device


STEP_1GI = {"default": "1Gi", "validRange": {"min": "1Gi", "step": "1Gi"}}


def _slices(*devices: dict[str, Any]) -> list[dict[str, Any]]:
    return [
        {
            "metadata": {"name": "node-a-sim-1"},
            "spec": {
                "driver": DRIVER,
                "pool": {"name": "node-a", "generation": 1, "resourceSliceCount": 1},
                "nodeName": "node-a",
                "devices": list(devices),
            },
        }
    ]


SLICES = _slices(_gpu("gpu-0", shared=True, policy=STEP_1GI), _gpu("gpu-1", shared=False))
CLASSES = {
    "gpu": {
        "spec": {
            "selectors": [{"cel": {"expression": f'device.attributes["{DRIVER}"].type == "gpu"'}}]
        }
    }
}


def _claim(*memory: str | None, cel: str = "") -> dict[str, Any]:
    requests = []
    for i, amount in enumerate(memory):
        exactly: dict[str, Any] = {"deviceClassName": "gpu", "allocationMode": "ExactCount"}
        if amount is not None:
            exactly["capacity"] = {"requests": {"memory": amount}}
        if cel:
            exactly["selectors"] = [{"cel": {"expression": cel}}]
        requests.append({"name": f"r{i}", "exactly": exactly})
    return {"spec": {"devices": {"requests": requests}}}


def _share_ids() -> Any:
    counter = itertools.count()
    return lambda: f"00000000-0000-4000-8000-{next(counter):012d}"


def _allocated(results: list[AllocationResult]) -> dict[str, Any]:
    """A claim object holding `results`, as the API server stores it."""
    return {"status": {"allocation": {"devices": {"results": [r.as_json() for r in results]}}}}


def test_shares_of_one_device_get_share_ids_and_their_consumed_capacity():
    first = allocate(_claim("30Gi"), classes=CLASSES, slices=SLICES, share_ids=_share_ids())
    assert [r.as_json() for r in first] == [
        {
            "request": "r0",
            "driver": DRIVER,
            "pool": "node-a",
            "device": "gpu-0",
            "shareID": "00000000-0000-4000-8000-000000000000",
            "consumedCapacity": {"memory": "30Gi"},
        }
    ]
    second = allocate(
        _claim("40Gi"),
        classes=CLASSES,
        slices=SLICES,
        in_use=allocated_results([_allocated(first)]),
    )
    assert [(r.device, r.consumed_capacity) for r in second] == [("gpu-0", {"memory": "40Gi"})]
    assert second[0].share_id not in (None, first[0].share_id)


def test_a_share_that_exceeds_what_is_left_is_not_allocated_on_that_device():
    held = allocated_results(
        [_allocated(allocate(_claim("30Gi", "40Gi"), classes=CLASSES, slices=SLICES))]
    )
    assert [r.device for r in held] == ["gpu-0", "gpu-0"]  # one claim, two shares
    only_gpu_0 = f'device.attributes["{DRIVER}"].index == 0'
    with pytest.raises(UnsatisfiableError):
        allocate(_claim("20Gi", cel=only_gpu_0), classes=CLASSES, slices=SLICES, in_use=held)
    fits = allocate(_claim("10Gi", cel=only_gpu_0), classes=CLASSES, slices=SLICES, in_use=held)
    assert fits[0].consumed_capacity == {"memory": "10Gi"}
    # Without the selector, the exclusive GPU takes it whole.
    whole = allocate(_claim("20Gi"), classes=CLASSES, slices=SLICES, in_use=held)
    assert [(r.device, r.share_id, r.consumed_capacity) for r in whole] == [("gpu-1", None, None)]


def test_an_exclusive_device_held_by_another_claim_is_not_allocated_again():
    only_gpu_1 = _claim(None, cel=f'device.attributes["{DRIVER}"].index == 1')
    held = allocated_results([_allocated(allocate(only_gpu_1, classes=CLASSES, slices=SLICES))])
    assert [(r.device, r.share_id) for r in held] == [("gpu-1", None)]
    with pytest.raises(UnsatisfiableError):
        allocate(only_gpu_1, classes=CLASSES, slices=SLICES, in_use=held)


def test_a_request_above_the_device_capacity_matches_no_device():
    with pytest.raises(UnsatisfiableError):
        allocate(_claim("81Gi"), classes=CLASSES, slices=SLICES)


@pytest.mark.parametrize(
    ("requested", "policy", "consumed"),
    [
        (None, STEP_1GI, 1 * GI),
        ("1500Mi", STEP_1GI, 2 * GI),
        ("100Mi", STEP_1GI, 1 * GI),
        ("5Gi", {"default": "1Gi", "validRange": {"min": "1Gi", "max": "4Gi"}}, None),
        ("3Gi", {"default": "2Gi", "validValues": ["2Gi", "4Gi", "8Gi"]}, 4 * GI),
        ("9Gi", {"default": "2Gi", "validValues": ["2Gi", "4Gi", "8Gi"]}, None),
        (None, None, 80 * GI),
        ("7Gi", None, 7 * GI),
    ],
    ids=[
        "default",
        "rounded-up-in-steps",
        "raised-to-min",
        "above-max",
        "next-valid-value",
        "above-all-values",
        "no-policy-takes-all",
        "no-policy-takes-the-request",
    ],
)
def test_request_policies_round_as_kubernetes_does(requested, policy, consumed):
    raw: dict[str, Any] = {"value": "80Gi"}
    if policy is not None:
        raw["requestPolicy"] = policy
    device = Device.from_json(
        {"name": "gpu-0", "capacity": {"memory": raw}}, driver=DRIVER, pool="p"
    )
    wanted = {} if requested is None else {"memory": quantity.parse(requested)}
    taken = capacity.consumption(device, wanted)
    if consumed is None:
        assert isinstance(taken, str)
    else:
        assert taken == {f"{DRIVER}/memory": Decimal(consumed)}


@pytest.mark.parametrize(
    ("amount", "text"),
    [(30 * GI, "30Gi"), (1536 * 2**20, "1536Mi"), (2000, "2k"), (7, "7"), (0, "0")],
)
def test_amounts_are_written_as_exact_quantities(amount, text):
    assert quantity.exact(Decimal(amount)) == text
    assert quantity.parse(text) == amount
