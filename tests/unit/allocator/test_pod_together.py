"""A pod's claims are allocated together on one node (kube-scheduler allocates them in one
go): claims that each fit may not fit together, devices are never shared between them, and
admin access is only kept from devices of its own claim."""

from __future__ import annotations

from typing import Any

from services.allocator.allocator import Attempt, Cluster
from services.allocator.explanation import explain_pod
from services.allocator.request import read_claim

DRIVER = "sim.dra-suite.io"
Obj = dict[str, Any]


def _cluster(count: int) -> Cluster:
    spec = {
        "driver": DRIVER,
        "nodeName": "node-a",
        "pool": {"name": "node-a", "generation": 1, "resourceSliceCount": 1},
        "devices": [{"name": f"npu-{i}"} for i in range(count)],
    }
    classes = [{"metadata": {"name": "npu"}, "spec": {}}]
    return Cluster.build(slices=[{"metadata": {"name": "s"}, "spec": spec}], classes=classes)


def _claim(cluster: Cluster, name: str, count: int, *, admin: bool = False) -> Any:
    exactly: Obj = {"deviceClassName": "npu", "count": count}
    if admin:
        exactly["adminAccess"] = True
    claim = {
        "metadata": {"name": name, "namespace": "default"},
        "spec": {"devices": {"requests": [{"name": "r", "exactly": exactly}]}},
    }
    return read_claim(claim, cluster.classes)


def test_claims_that_each_fit_may_not_fit_together():
    cluster = _cluster(8)
    first, second = _claim(cluster, "a", 5), _claim(cluster, "b", 5)
    assert Attempt(cluster, first, node="node-a").run()
    assert Attempt(cluster, second, node="node-a").run()
    pod = explain_pod(cluster, "default/p", [first, second], nodes=["node-a"])
    assert not pod.fits
    (report,) = pod.nodes
    assert report.reason == (
        "each claim fits alone, but not all of them together (they need the same devices)"
    )


def test_a_claim_that_does_not_fit_alone_is_named_with_what_it_lacks():
    cluster = _cluster(4)
    pod = explain_pod(
        cluster, "default/p", [_claim(cluster, "a", 2), _claim(cluster, "b", 6)], nodes=["node-a"]
    )
    (report,) = pod.nodes
    assert (
        report.reason == "claim default/b does not fit here alone (request r needs 6, 4 candidates)"
    )


def test_claims_that_fit_together_get_different_devices():
    cluster = _cluster(8)
    pod = explain_pod(
        cluster, "default/p", [_claim(cluster, "a", 3), _claim(cluster, "b", 5)], nodes=["node-a"]
    )
    assert pod.fits
    (report,) = pod.nodes
    devices = {claim: [r.device for r in results] for claim, results in report.allocation}
    assert devices == {
        "default/a": ["npu-0", "npu-1", "npu-2"],
        "default/b": ["npu-3", "npu-4", "npu-5", "npu-6", "npu-7"],
    }


def test_an_admin_claim_of_the_pod_may_take_what_another_claim_of_it_took():
    cluster = _cluster(2)
    pod = explain_pod(
        cluster,
        "default/p",
        [_claim(cluster, "a", 2), _claim(cluster, "monitor", 2, admin=True)],
        nodes=["node-a"],
    )
    assert pod.fits
