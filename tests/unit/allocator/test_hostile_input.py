"""What a hostile or broken cluster object cannot do to the allocator: make it search forever,
hand out a negative capacity without end, or crash `explain` instead of answering."""

from __future__ import annotations

import time
from typing import Any

from services.allocator.allocator import Cluster
from services.allocator.explanation import explain
from services.allocator.request import read_claim

DRIVER = "sim.dra-suite.io"
Obj = dict[str, Any]


def _cluster(devices: list[Obj]) -> Cluster:
    spec = {
        "driver": DRIVER,
        "nodeName": "node-a",
        "pool": {"name": "node-a", "generation": 1, "resourceSliceCount": 1},
        "devices": devices,
    }
    classes = [{"metadata": {"name": "any"}, "spec": {}}]
    return Cluster.build(slices=[{"metadata": {"name": "s"}, "spec": spec}], classes=classes)


def _claim(request: Obj, constraints: list[Obj] | None = None) -> Obj:
    devices = {"requests": [request], "constraints": constraints or []}
    return {"metadata": {"name": "c", "namespace": "default"}, "spec": {"devices": devices}}


def test_an_exponential_search_gives_up_instead_of_hanging():
    # 32 devices over 15 values: 16 with pairwise distinct values never exist, and a plain
    # search tries the millions of ways to pick 15 first.
    devices = [{"name": f"d{i:02d}", "attributes": {"v": {"int": i % 15}}} for i in range(32)]
    cluster = _cluster(devices)
    claim = _claim(
        {"name": "r", "exactly": {"deviceClassName": "any", "count": 16}},
        [{"distinctAttribute": f"{DRIVER}/v"}],
    )
    start = time.monotonic()
    report = explain(cluster, read_claim(claim, cluster.classes), nodes=["node-a"]).nodes[0]
    assert time.monotonic() - start < 20
    assert not report.fits
    assert "gave up after trying 100000 devices" in report.error


def test_a_huge_count_is_refused_at_once():
    cluster = _cluster([{"name": "d0"}])
    claim = _claim({"name": "r", "exactly": {"deviceClassName": "any", "count": 10**9}})
    report = explain(cluster, read_claim(claim, cluster.classes), nodes=["node-a"]).nodes[0]
    assert not report.fits


def test_a_shared_device_with_a_negative_capacity_is_never_shared():
    device = {
        "name": "d0",
        "allowMultipleAllocations": True,
        "capacity": {"memory": {"value": "-80Gi"}},
    }
    cluster = _cluster([device])
    claim = _claim({"name": "r", "exactly": {"deviceClassName": "any", "count": 1}})
    report = explain(cluster, read_claim(claim, cluster.classes), nodes=["node-a"]).nodes[0]
    assert not report.fits
    assert report.requests[0].devices[0].exclusion.message == "capacity memory: negative value"
