"""The devcluster allocator: CEL selection with the Kubernetes device environment, first fit,
firstAvailable, matchAttribute / distinctAttribute, taints, and CEL errors as in Kubernetes."""

from __future__ import annotations

from typing import Any

import pytest

from devcluster.scheduler import (
    AllocationResult,
    SelectorError,
    UnsatisfiableError,
    allocate,
    devices_of,
    matches,
)

DRIVER = "sim.dra-suite.io"


def _device(
    name: str, *, ring: str, numa: int, kind: str = "npu", taint: str = ""
) -> dict[str, Any]:
    device: dict[str, Any] = {
        "name": name,
        "attributes": {
            "type": {"string": kind},
            "numaNode": {"int": numa},
            "topologyGroup": {"string": ring},
            "resource.kubernetes.io/pcieRoot": {"string": f"pci0000:{numa}0"},
        },
        "capacity": {"memCapacity": {"value": "32Gi"}},
    }
    if taint:
        device["taints"] = [{"key": f"{DRIVER}/xid", "value": "79", "effect": taint}]
    return device


SLICES: list[dict[str, Any]] = [
    {
        "metadata": {"name": "node-a-sim-1"},
        "spec": {
            "driver": DRIVER,
            "pool": {"name": "node-a", "generation": 1, "resourceSliceCount": 1},
            "nodeName": "node-a",
            "devices": [
                _device("npu-0", ring="ring-0", numa=0),
                _device("npu-1", ring="ring-0", numa=0, taint="NoSchedule"),
                _device("npu-2", ring="ring-1", numa=1),
                _device("npu-3", ring="ring-1", numa=1),
                _device("gpu-0", ring="nvlink-0", numa=0, kind="gpu"),
            ],
        },
    }
]
CLASSES: dict[str, dict[str, Any]] = {
    "npu": {
        "spec": {
            "selectors": [{"cel": {"expression": f'device.attributes["{DRIVER}"].type == "npu"'}}]
        }
    },
    "any": {"spec": {}},
}


def _claim(
    *requests: dict[str, Any], constraints: list[dict[str, Any]] | None = None
) -> dict[str, Any]:
    return {"spec": {"devices": {"requests": list(requests), "constraints": constraints or []}}}


def _exactly(name: str, count: int, cls: str = "npu", cel: str = "") -> dict[str, Any]:
    exactly: dict[str, Any] = {
        "deviceClassName": cls,
        "allocationMode": "ExactCount",
        "count": count,
    }
    if cel:
        exactly["selectors"] = [{"cel": {"expression": cel}}]
    return {"name": name, "exactly": exactly}


def _picked(results: list[AllocationResult]) -> list[tuple[str, str]]:
    return [(r.request, r.device) for r in results]


@pytest.mark.parametrize(
    ("expression", "selected"),
    [
        (f'device.driver == "{DRIVER}"', ["npu-0", "npu-1", "npu-2", "npu-3", "gpu-0"]),
        (f'device.attributes["{DRIVER}"].numaNode == 1', ["npu-2", "npu-3"]),
        (
            'device.attributes["resource.kubernetes.io"].pcieRoot == "pci0000:00"',
            ["npu-0", "npu-1", "gpu-0"],
        ),
        (
            f'device.capacity["{DRIVER}"].memCapacity == quantity("32Gi")',
            ["npu-0", "npu-1", "npu-2", "npu-3", "gpu-0"],
        ),
        (f'has(device.attributes["{DRIVER}"].missing)', []),
    ],
    ids=["driver", "unqualified-attribute", "standard-attribute", "capacity", "has-guard"],
)
def test_selector_sees_devices_as_kubernetes_cel_does(expression, selected):
    assert [d.name for d in devices_of(SLICES) if matches(expression, d)] == selected


@pytest.mark.parametrize(
    "expression",
    [f'device.attributes["{DRIVER}"].missing == 1', "device.driver ==", 'device.driver + "x"'],
    ids=["missing-attribute", "does-not-compile", "not-a-bool"],
)
def test_selector_errors_are_reported_not_treated_as_no_match(expression):
    with pytest.raises(SelectorError, match="CEL"):
        [matches(expression, d) for d in devices_of(SLICES)]


def test_first_fit_skips_devices_tainted_no_schedule():
    results = allocate(_claim(_exactly("npus", 2)), classes=CLASSES, slices=SLICES)
    assert _picked(results) == [("npus", "npu-0"), ("npus", "npu-2")]


def test_match_attribute_keeps_a_request_on_one_ring():
    claim = _claim(_exactly("npus", 2), constraints=[{"matchAttribute": f"{DRIVER}/topologyGroup"}])
    assert _picked(allocate(claim, classes=CLASSES, slices=SLICES)) == [
        ("npus", "npu-2"),
        ("npus", "npu-3"),
    ]


def test_match_attribute_across_two_requests():
    claim = _claim(
        _exactly("gpu", 1, cls="any", cel=f'device.attributes["{DRIVER}"].type == "gpu"'),
        _exactly("npu", 1),
        constraints=[
            {"requests": ["gpu", "npu"], "matchAttribute": "resource.kubernetes.io/pcieRoot"}
        ],
    )
    assert _picked(allocate(claim, classes=CLASSES, slices=SLICES)) == [
        ("gpu", "gpu-0"),
        ("npu", "npu-0"),
    ]


def test_distinct_attribute_spreads_over_numa_nodes():
    claim = _claim(_exactly("npus", 2), constraints=[{"distinctAttribute": f"{DRIVER}/numaNode"}])
    assert _picked(allocate(claim, classes=CLASSES, slices=SLICES)) == [
        ("npus", "npu-0"),
        ("npus", "npu-2"),
    ]


def test_first_available_falls_back_to_the_next_subrequest():
    request = {
        "name": "npus",
        "firstAvailable": [
            {"name": "three-on-a-ring", "deviceClassName": "npu", "count": 3},
            {"name": "two", "deviceClassName": "npu", "count": 2},
        ],
    }
    claim = _claim(request, constraints=[{"matchAttribute": f"{DRIVER}/topologyGroup"}])
    assert _picked(allocate(claim, classes=CLASSES, slices=SLICES)) == [
        ("npus/two", "npu-2"),
        ("npus/two", "npu-3"),
    ]


@pytest.mark.parametrize(
    "claim",
    [_claim(_exactly("npus", 4)), _claim(_exactly("npus", 1, cls="missing"))],
    ids=["too-many", "unknown-class"],
)
def test_unsatisfiable_claims_raise(claim):
    with pytest.raises(UnsatisfiableError):
        allocate(claim, classes=CLASSES, slices=SLICES)


def test_a_constraint_naming_a_subrequest_applies_to_that_alternative_only():
    request = {
        "name": "npus",
        "firstAvailable": [
            {"name": "same-ring", "deviceClassName": "npu", "count": 2},
            {"name": "any", "deviceClassName": "npu", "count": 2},
        ],
    }
    constraint = {"requests": ["npus/same-ring"], "matchAttribute": f"{DRIVER}/topologyGroup"}
    claim = _claim(request, constraints=[constraint])
    assert _picked(allocate(claim, classes=CLASSES, slices=SLICES)) == [
        ("npus/same-ring", "npu-2"),
        ("npus/same-ring", "npu-3"),
    ]
