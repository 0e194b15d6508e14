"""Which pods hear about an unhealthy device, and the Events they get."""

from __future__ import annotations

from typing import Any

import pytest

from services.devcluster.apiserver import ClusterConfig
from services.devcluster.apiserver.registry import Registry
from services.devcluster.apiserver.validation import Validator
from services.health import events, pod_events
from services.health.events import DeviceEvent
from services.health.pod_events import PodRef

DRIVER = "sim.dra-suite.io"
EVENT = DeviceEvent(reason=events.UNHEALTHY, device="gpu-1", message="xid 79", at=1700000000.25)


def claim(
    name: str,
    *,
    namespace: str = "team-a",
    results: list[tuple[str, str, str]] | None = None,
    reserved: list[dict[str, str]] | None = None,
) -> dict[str, Any]:
    status: dict[str, Any] = {}
    if results is not None:
        status["allocation"] = {
            "devices": {
                "results": [
                    {"request": "gpu", "driver": d, "pool": p, "device": v} for d, p, v in results
                ]
            }
        }
    if reserved is not None:
        status["reservedFor"] = reserved
    return {"metadata": {"name": name, "namespace": namespace}, "status": status}


def pod(name: str, uid: str = "u-1", **extra: str) -> dict[str, str]:
    return {"resource": "pods", "name": name, "uid": uid, **extra}


OURS = (DRIVER, "node-a", "gpu-1")
CASES = {
    "a pod reserving a claim on the device": (
        [claim("c", results=[OURS], reserved=[pod("p")])],
        [PodRef(namespace="team-a", name="p", uid="u-1", claim="c")],
    ),
    "every pod sharing the claim": (
        [claim("c", results=[OURS], reserved=[pod("p", "u-1"), pod("q", "u-2")])],
        [
            PodRef(namespace="team-a", name="p", uid="u-1", claim="c"),
            PodRef(namespace="team-a", name="q", uid="u-2", claim="c"),
        ],
    ),
    "another device of the pool": (
        [claim("c", results=[(DRIVER, "node-a", "gpu-2")], reserved=[pod("p")])],
        [],
    ),
    "the same device name in another pool": (
        [claim("c", results=[(DRIVER, "node-b", "gpu-1")], reserved=[pod("p")])],
        [],
    ),
    "another driver's device": (
        [claim("c", results=[("other.example.com", "node-a", "gpu-1")], reserved=[pod("p")])],
        [],
    ),
    "an allocated claim nobody reserves": ([claim("c", results=[OURS])], []),
    "an unallocated claim": ([claim("c", reserved=[pod("p")])], []),
    "a consumer that is not a pod": (
        [
            claim(
                "c",
                results=[OURS],
                reserved=[{"resource": "jobs", "apiGroup": "batch", "name": "j"}],
            )
        ],
        [],
    ),
    "one pod named by two claims once": (
        [
            claim("c", results=[OURS], reserved=[pod("p")]),
            claim("d", results=[OURS], reserved=[pod("p")]),
        ],
        [PodRef(namespace="team-a", name="p", uid="u-1", claim="c")],
    ),
}


@pytest.mark.parametrize(("claims", "expected"), CASES.values(), ids=CASES.keys())
def test_pods_using_finds_the_pods_that_reserve_a_claim_on_the_device(claims, expected):
    assert pod_events.pods_using(claims, driver=DRIVER, pool="node-a", device="gpu-1") == expected


def test_pod_event_body_points_at_the_pod_and_passes_validation():
    ref = PodRef(namespace="team-a", name="trainer-0", uid="u-9", claim="gpus")
    body = pod_events.pod_event_body(EVENT, ref, node="node-a")
    assert body["involvedObject"] == {
        "apiVersion": "v1",
        "kind": "Pod",
        "name": "trainer-0",
        "namespace": "team-a",
        "uid": "u-9",
    }
    assert (body["type"], body["reason"]) == ("Warning", events.UNHEALTHY)
    assert body["metadata"]["namespace"] == "team-a"
    assert body["message"] == "device gpu-1 of claim gpus on node node-a: xid 79"
    config = ClusterConfig.for_tests("1.36")
    rt = Registry(config).lookup("", "v1", "events")
    assert rt is not None
    validator = Validator(config)
    validator.typemeta(rt, body)
    validator.schema(rt, body)
    validator.semantics(rt, body, None)


def test_pod_event_names_are_deterministic_and_differ_per_pod():
    first = PodRef(namespace="a", name="p", uid="u-1", claim="c")
    second = PodRef(namespace="a", name="p", uid="u-2", claim="c")
    name = pod_events.pod_event_body(EVENT, first, node="n")["metadata"]["name"]
    assert name == pod_events.pod_event_body(EVENT, first, node="n")["metadata"]["name"]
    assert name != pod_events.pod_event_body(EVENT, second, node="n")["metadata"]["name"]
    assert name.startswith("p.")
