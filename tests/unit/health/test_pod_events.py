"""Which pods hear about an unhealthy device, and the Events they get."""

from __future__ import annotations

import pytest

from devcluster.apiserver import ClusterConfig
from devcluster.apiserver.registry import Registry
from devcluster.apiserver.validation import Validator
from services.health import events, pod_events
from services.health.events import DeviceEvent
from services.health.pod_events import PodRef
from services.health.prepared_claims import PreparedClaims
from shared.pb.drasuite.v1 import claim_pb2

DRIVER = "sim.dra-suite.io"
EVENT = DeviceEvent(reason=events.UNHEALTHY, device="gpu-1", message="xid 79", at=1700000000.25)


def claim(
    name: str,
    *,
    namespace: str = "team-a",
    devices: list[tuple[str, str]] | None = None,
    pods: list[claim_pb2.ClaimPod] | None = None,
) -> claim_pb2.PreparedClaim:
    """A prepared claim as the allocation agent writes it into the prepared-claims KV."""
    return claim_pb2.PreparedClaim(
        driver=DRIVER,
        node="node-a",
        claim_uid=f"uid-{name}",
        namespace=namespace,
        name=name,
        devices=[claim_pb2.PreparedClaimDevice(pool=p, device=d) for p, d in devices or []],
        pods=pods or [],
    )


def pod(name: str, uid: str = "u-1", namespace: str = "team-a") -> claim_pb2.ClaimPod:
    return claim_pb2.ClaimPod(namespace=namespace, name=name, uid=uid)


OURS = ("node-a", "gpu-1")
CASES = {
    "a pod of a claim on the device": (
        [claim("c", devices=[OURS], pods=[pod("p")])],
        [PodRef(namespace="team-a", name="p", uid="u-1", claim="c")],
    ),
    "every pod sharing the claim": (
        [claim("c", devices=[OURS], pods=[pod("p", "u-1"), pod("q", "u-2")])],
        [
            PodRef(namespace="team-a", name="p", uid="u-1", claim="c"),
            PodRef(namespace="team-a", name="q", uid="u-2", claim="c"),
        ],
    ),
    "another device of the pool": (
        [claim("c", devices=[("node-a", "gpu-2")], pods=[pod("p")])],
        [],
    ),
    "the same device name in another pool": (
        [claim("c", devices=[("node-b", "gpu-1")], pods=[pod("p")])],
        [],
    ),
    "a prepared claim no pod uses": ([claim("c", devices=[OURS])], []),
    "a pod of another namespace than its claim": (
        [claim("c", devices=[OURS], pods=[pod("p", namespace="kube-system")])],
        [],
    ),
    "one pod named by two claims once": (
        [
            claim("c", devices=[OURS], pods=[pod("p")]),
            claim("d", devices=[OURS], pods=[pod("p")]),
        ],
        [PodRef(namespace="team-a", name="p", uid="u-1", claim="c")],
    ),
}


@pytest.mark.parametrize(("claims", "expected"), CASES.values(), ids=CASES.keys())
def test_pods_using_finds_the_pods_of_prepared_claims_on_the_device(claims, expected):
    assert pod_events.pods_using(claims, pool="node-a", device="gpu-1") == expected


def test_the_view_keeps_only_claims_still_in_the_kv_after_a_replay():
    view = PreparedClaims()
    for name in ("a", "b", "c"):
        view.put(f"uid-{name}", claim(name, devices=[OURS]))
    view.remove("uid-a")
    view.retain(["uid-c"])
    assert [c.name for c in view.claims()] == ["c"]


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
