"""The devcluster allocator with shared counters (DRAPartitionableDevices): a whole GPU and its
MIG placements consume one counter set per GPU, laid out as on Kubernetes 1.34 (counter sets in
the slice of their devices) and on 1.35+ (counter sets in a slice of their own), against other
claims' allocations (`in_use`) and within one claim."""

from __future__ import annotations

from typing import Any

import pytest

from devcluster.scheduler import (
    AllocationResult,
    UnsatisfiableError,
    allocate,
    allocated_results,
    devices_of,
)

DRIVER = "sim.dra-suite.io"
LAYOUTS = ["1.34", "1.35"]
Obj = dict[str, Any]

# Each GPU has 4 memory slices; a partition takes the slices from its placement on.
PARTITIONS = [("2g", 0, 2), ("1g", 1, 1), ("2g", 2, 2)]  # (profile, placement, size)


def _counter_set(gpu: int) -> Obj:
    counters = {f"memory-slice-{i}": {"value": "1"} for i in range(4)}
    return {"name": f"gpu-{gpu}-counters", "counters": {**counters, "memory": {"value": "40Gi"}}}


def _consumes(gpu: int, start: int, size: int, *, counter_set: str = "") -> list[Obj]:
    counters = {f"memory-slice-{i}": {"value": "1"} for i in range(start, start + size)}
    counters["memory"] = {"value": f"{10 * size}Gi"}
    return [{"counterSet": counter_set or f"gpu-{gpu}-counters", "counters": counters}]


def _device(name: str, *, kind: str, gpu: int, consumes: list[Obj], placement: int = 0) -> Obj:
    return {
        "name": name,
        "attributes": {
            "type": {"string": kind},
            "parent": {"int": gpu},
            "placement": {"int": placement},
        },
        "consumesCounters": consumes,
    }


def _gpu_devices(gpu: int) -> list[Obj]:
    """The GPU whole, then its partitions in placement order."""
    devices = [_device(f"gpu-{gpu}", kind="gpu", gpu=gpu, consumes=_consumes(gpu, 0, 4))]
    for profile, placement, size in PARTITIONS:
        devices.append(
            _device(
                f"gpu-{gpu}-mig-{profile}-{placement}",
                kind="mig",
                gpu=gpu,
                placement=placement,
                consumes=_consumes(gpu, placement, size),
            )
        )
    return devices


def _slice(name: str, *, pool: str = "node-a", generation: int = 1, count: int, **spec: Any) -> Obj:
    return {
        "metadata": {"name": name},
        "spec": {
            "driver": DRIVER,
            "pool": {"name": pool, "generation": generation, "resourceSliceCount": count},
            "nodeName": pool,
            **spec,
        },
    }


def _slices(layout: str, *, gpus: int = 2, pool: str = "node-a") -> list[Obj]:
    """The pool's slices: on 1.34 one slice per GPU with its counter set and devices; on
    1.35+ one slice with every counter set and one with every device."""
    if layout == "1.34":
        return [
            _slice(
                f"{pool}-gpu-{g}",
                pool=pool,
                count=gpus,
                sharedCounters=[_counter_set(g)],
                devices=_gpu_devices(g),
            )
            for g in range(gpus)
        ]
    devices = [d for g in range(gpus) for d in _gpu_devices(g)]
    return [
        _slice(
            f"{pool}-0-counters",
            pool=pool,
            count=2,
            sharedCounters=[*map(_counter_set, range(gpus))],
        ),
        _slice(f"{pool}-1-devices", pool=pool, count=2, devices=devices),
    ]


CLASSES: dict[str, Obj] = {"any": {"spec": {}}}


def _attr(name: str) -> str:
    return f'device.attributes["{DRIVER}"].{name}'


WHOLE = f'{_attr("type")} == "gpu"'
WHOLE_0 = f"{WHOLE} && {_attr('parent')} == 0"
MIG = f'{_attr("type")} == "mig"'
MIG_0 = f"{MIG} && {_attr('parent')} == 0"


def _at(placement: int) -> str:
    return f"{MIG_0} && {_attr('placement')} == {placement}"


def _request(name: str, cel: str, count: int = 1) -> Obj:
    return {
        "name": name,
        "exactly": {
            "deviceClassName": "any",
            "allocationMode": "ExactCount",
            "count": count,
            "selectors": [{"cel": {"expression": cel}}],
        },
    }


def _claim(*requests: Obj) -> Obj:
    return {"spec": {"devices": {"requests": list(requests)}}}


def _held(*allocations: list[AllocationResult]) -> list[AllocationResult]:
    """`in_use` for claims stored with these allocations (as the API server holds them)."""
    claims = [
        {"status": {"allocation": {"devices": {"results": [r.as_json() for r in results]}}}}
        for results in allocations
    ]
    return allocated_results(claims)


def _devices(results: list[AllocationResult]) -> list[str]:
    return [r.device for r in results]


def _allocate(slices: list[Obj], cel: str, *held: list[AllocationResult]) -> list[str]:
    return _devices(
        allocate(_claim(_request("r", cel)), classes=CLASSES, slices=slices, in_use=_held(*held))
    )


@pytest.mark.parametrize("layout", LAYOUTS)
def test_a_partition_of_an_allocated_whole_gpu_is_refused(layout):
    slices = _slices(layout)
    whole = allocate(_claim(_request("gpu", WHOLE_0)), classes=CLASSES, slices=slices)
    assert _devices(whole) == ["gpu-0"]

    with pytest.raises(UnsatisfiableError):
        _allocate(slices, MIG_0, whole)
    # Other GPUs' counters are untouched.
    assert _allocate(slices, MIG, whole) == ["gpu-1-mig-2g-0"]


@pytest.mark.parametrize("layout", LAYOUTS)
def test_a_whole_gpu_with_an_allocated_partition_is_refused_and_first_fit_moves_on(layout):
    slices = _slices(layout)
    partition = allocate(_claim(_request("mig", _at(2))), classes=CLASSES, slices=slices)
    assert _devices(partition) == ["gpu-0-mig-2g-2"]

    with pytest.raises(UnsatisfiableError):
        _allocate(slices, WHOLE_0, partition)
    assert _allocate(slices, WHOLE, partition) == ["gpu-1"]


@pytest.mark.parametrize("layout", LAYOUTS)
def test_an_overlapping_placement_is_refused(layout):
    slices = _slices(layout)
    first = allocate(_claim(_request("mig", _at(0))), classes=CLASSES, slices=slices)
    assert _devices(first) == ["gpu-0-mig-2g-0"]

    # 1g at placement 1 needs memory slice 1, which the 2g at placement 0 holds.
    with pytest.raises(UnsatisfiableError):
        _allocate(slices, _at(1), first)


@pytest.mark.parametrize("layout", LAYOUTS)
def test_non_overlapping_placements_are_both_allocated(layout):
    slices = _slices(layout)
    first = allocate(_claim(_request("mig", _at(0))), classes=CLASSES, slices=slices)
    assert _allocate(slices, _at(2), first) == ["gpu-0-mig-2g-2"]
    # First fit over gpu-0's partitions skips the one overlapping what is held.
    assert _allocate(slices, MIG_0, first) == ["gpu-0-mig-2g-2"]


@pytest.mark.parametrize("layout", LAYOUTS)
def test_counters_are_freed_when_the_other_claim_is_no_longer_in_use(layout):
    slices = _slices(layout)
    whole = allocate(_claim(_request("gpu", WHOLE_0)), classes=CLASSES, slices=slices)
    with pytest.raises(UnsatisfiableError):
        _allocate(slices, MIG_0, whole)

    assert _allocate(slices, MIG_0) == ["gpu-0-mig-2g-0"]


@pytest.mark.parametrize("layout", LAYOUTS)
def test_two_requests_of_one_claim_do_not_overcommit(layout):
    slices = _slices(layout)
    both = _claim(_request("gpu", WHOLE), _request("mig", MIG))
    results = allocate(both, classes=CLASSES, slices=slices)
    assert [(r.request, r.device) for r in results] == [("gpu", "gpu-0"), ("mig", "gpu-1-mig-2g-0")]

    on_gpu_0 = _claim(_request("gpu", WHOLE_0), _request("mig", MIG_0))
    with pytest.raises(UnsatisfiableError):
        allocate(on_gpu_0, classes=CLASSES, slices=slices)


@pytest.mark.parametrize("layout", LAYOUTS)
def test_devices_of_one_request_do_not_overcommit(layout):
    slices = _slices(layout)
    results = allocate(_claim(_request("migs", MIG_0, count=2)), classes=CLASSES, slices=slices)
    assert _devices(results) == ["gpu-0-mig-2g-0", "gpu-0-mig-2g-2"]

    with pytest.raises(UnsatisfiableError):
        allocate(_claim(_request("migs", MIG_0, count=3)), classes=CLASSES, slices=slices)


def test_counter_sets_of_the_same_name_in_two_pools_are_separate():
    slices = _slices("1.35", pool="node-a") + _slices("1.35", pool="node-b")
    whole = allocate(_claim(_request("gpu", WHOLE_0)), classes=CLASSES, slices=slices)
    assert [(r.pool, r.device) for r in whole] == [("node-a", "gpu-0")]

    results = allocate(
        _claim(_request("mig", MIG_0)), classes=CLASSES, slices=slices, in_use=_held(whole)
    )
    assert [(r.pool, r.device) for r in results] == [("node-b", "gpu-0-mig-2g-0")]


@pytest.mark.parametrize(
    ("consumes", "problem"),
    [
        (_consumes(0, 0, 1, counter_set="gpu-9-counters"), "counter set gpu-9-counters not found"),
        (
            [{"counterSet": "gpu-0-counters", "counters": {"nvdec": {"value": "1"}}}],
            "counter nvdec not found in counter set gpu-0-counters",
        ),
    ],
    ids=["missing-set", "missing-counter"],
)
def test_a_pool_whose_device_consumes_what_it_lacks_is_not_allocated_from(consumes, problem):
    broken = _slices("1.35", pool="node-a")
    broken[1]["spec"]["devices"].append(_device("stray", kind="mig", gpu=0, consumes=consumes))
    slices = broken + _slices("1.35", pool="node-b")

    results = allocate(_claim(_request("gpu", WHOLE_0)), classes=CLASSES, slices=slices)
    assert [(r.pool, r.device) for r in results] == [("node-b", "gpu-0")]
    with pytest.raises(UnsatisfiableError, match=f"pool node-a of {DRIVER} is invalid: {problem}"):
        allocate(_claim(_request("gpus", WHOLE, count=3)), classes=CLASSES, slices=slices)


def test_duplicate_counter_set_names_make_the_pool_invalid():
    slices = _slices("1.35")
    slices.append(_slice("node-a-2-counters", count=3, sharedCounters=[_counter_set(0)]))
    with pytest.raises(UnsatisfiableError, match="duplicate counter set name gpu-0-counters"):
        allocate(_claim(_request("gpu", WHOLE_0)), classes=CLASSES, slices=slices)


def test_only_the_newest_generation_of_a_pool_counts():
    # Generation 2 is being published: its devices are out, its counter slice not yet.
    old_counters, old_devices = _slices("1.35")
    new_devices = _slice("node-a-3-devices", generation=2, count=2, devices=_gpu_devices(0)[:1])
    old_devices["spec"]["devices"].append(
        _device("old-gpu", kind="gpu", gpu=0, consumes=_consumes(0, 0, 4))
    )
    slices = [old_counters, old_devices, new_devices]
    assert [d.name for d in devices_of(slices)] == ["gpu-0"]
    with pytest.raises(UnsatisfiableError, match="counter set gpu-0-counters not found"):
        allocate(_claim(_request("gpu", WHOLE_0)), classes=CLASSES, slices=slices)


def test_shares_of_a_multi_allocatable_device_take_its_counters_once():
    slices = _slices("1.35", gpus=1)
    for device in slices[1]["spec"]["devices"]:
        device["allowMultipleAllocations"] = True
    first = allocate(_claim(_request("gpu", WHOLE_0)), classes=CLASSES, slices=slices)
    second = allocate(
        _claim(_request("gpu", WHOLE_0)), classes=CLASSES, slices=slices, in_use=_held(first)
    )
    assert [r.device for r in first + second] == ["gpu-0", "gpu-0"]
    assert first[0].share_id != second[0].share_id
    with pytest.raises(UnsatisfiableError):
        allocate(
            _claim(_request("mig", MIG_0)), classes=CLASSES, slices=slices, in_use=_held(first)
        )
