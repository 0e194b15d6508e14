"""Node Event names and bodies for device transitions."""

from __future__ import annotations

import re

import pytest

from devcluster.apiserver import ClusterConfig
from devcluster.apiserver.registry import Registry
from devcluster.apiserver.validation import Validator
from services.health import events
from services.health.events import DeviceEvent

_SUBDOMAIN = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$")
LONG_NODE = ".".join(["n" * 63] * 3) + "." + "x" * 61
EVENT = DeviceEvent(reason=events.UNHEALTHY, device="gpu-0", message="xid 79", at=1700000000.25)


@pytest.mark.parametrize("node", ["node-a", LONG_NODE], ids=["short node", "longest node"])
def test_event_names_are_deterministic_dns_subdomains(node):
    name = events.event_name(node, EVENT)
    assert name == events.event_name(node, EVENT)
    assert len(name) <= 253
    assert _SUBDOMAIN.match(name)


def test_event_names_differ_per_reason_device_and_time():
    other = [
        DeviceEvent(reason=events.RECOVERED, device="gpu-0", message="", at=EVENT.at),
        DeviceEvent(reason=events.UNHEALTHY, device="gpu-1", message="", at=EVENT.at),
        DeviceEvent(reason=events.UNHEALTHY, device="gpu-0", message="", at=EVENT.at + 1),
    ]
    names = {events.event_name("node-a", e) for e in [EVENT, *other]}
    assert len(names) == 4


@pytest.mark.parametrize(
    ("reason", "kind"),
    [(events.UNHEALTHY, "Warning"), (events.RECOVERED, "Normal")],
    ids=["unhealthy is a warning", "recovered is normal"],
)
def test_event_body_points_at_the_node(reason, kind):
    event = DeviceEvent(reason=reason, device="gpu-0", message="m", at=EVENT.at)
    body = events.event_body(event, node="node-a", namespace="default", node_uid="u-1")
    assert body["involvedObject"] == {
        "apiVersion": "v1",
        "kind": "Node",
        "name": "node-a",
        "uid": "u-1",
    }
    assert body["type"] == kind
    assert body["reason"] == reason
    assert body["source"]["component"] == events.COMPONENT
    assert body["firstTimestamp"] == "2023-11-14T22:13:20Z"


def test_event_body_passes_the_api_servers_validation():
    config = ClusterConfig.for_tests("1.36")
    rt = Registry(config).lookup("", "v1", "events")
    assert rt is not None
    body = events.event_body(EVENT, node="node-a", namespace="default", node_uid="")
    validator = Validator(config)
    validator.typemeta(rt, body)
    validator.schema(rt, body)
    validator.semantics(rt, body, None)
    assert "uid" not in body["involvedObject"]
