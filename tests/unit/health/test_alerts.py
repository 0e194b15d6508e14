"""Alert IDs and bodies: stable per fault start and status, proto3 JSON with a trace ID."""

from __future__ import annotations

import json
from typing import Any

import pytest
from opentelemetry.sdk.trace import TracerProvider

from services.health import alerts
from services.health.policy import DeviceState, Health, Taint
from shared.bus import codec
from shared.pb.drasuite.v1 import alert_pb2
from shared.vendors.parts.observation import Fault

DRIVER = "sim.dra-suite.io"
TAINT = Taint(key=f"{DRIVER}/xid", value="79", effect="NoSchedule")
STATE = DeviceState(
    device="gpu-0",
    health=Health.UNHEALTHY,
    since=100.5,
    fault=Fault(cause="xid", code="79", message="fell off the bus"),
    fault_since=100.5,
    taint=TAINT,
)
BASE: dict[str, Any] = {
    "driver": DRIVER,
    "node": "node-a",
    "device": "gpu-0",
    "cause": "xid",
    "since_ms": 100500,
    "status": alert_pb2.ALERT_STATUS_RAISED,
}


def test_alert_id_is_deterministic():
    assert alerts.alert_id(**BASE) == alerts.alert_id(**BASE)


@pytest.mark.parametrize(
    "change",
    [
        {"device": "gpu-1"},
        {"cause": "ecc"},
        {"since_ms": 100501},
        {"status": alert_pb2.ALERT_STATUS_RESOLVED},
        {"node": "node-b"},
    ],
    ids=["device", "cause", "since", "status", "node"],
)
def test_alert_id_changes_with_each_identifying_field(change):
    assert alerts.alert_id(**{**BASE, **change}) != alerts.alert_id(**BASE)


def test_raised_and_resolved_alerts_describe_the_same_fault():
    raised = alerts.raised(STATE, driver=DRIVER, node="node-a", pool="node-a", taint=TAINT)
    resolved = alerts.resolved(
        STATE, driver=DRIVER, node="node-a", pool="node-a", taint=TAINT, now=200.0
    )
    assert raised.status == alert_pb2.ALERT_STATUS_RAISED
    assert resolved.status == alert_pb2.ALERT_STATUS_RESOLVED
    assert raised.raised_unix_ms == resolved.raised_unix_ms == 100500
    assert resolved.resolved_unix_ms == 200000
    assert raised.id != resolved.id
    assert raised.id == alerts.alert_id(**BASE)
    assert raised.taint == resolved.taint == f"{DRIVER}/xid=79:NoSchedule"
    assert raised.schema_version == alerts.SCHEMA_VERSION


def test_alert_without_applied_taint_has_an_empty_taint():
    alert = alerts.raised(STATE, driver=DRIVER, node="node-a", pool="node-a", taint=None)
    assert alert.taint == ""


def test_alert_json_uses_camel_case_names():
    alert = alerts.raised(STATE, driver=DRIVER, node="node-a", pool="node-a", taint=TAINT)
    document = json.loads(codec.encode_json(alert))
    assert document["status"] == "ALERT_STATUS_RAISED"
    assert document["raisedUnixMs"] == "100500"
    assert document["schemaVersion"] == 1
    assert document["device"] == "gpu-0"


def test_alert_carries_the_trace_id_of_the_current_span():
    tracer = TracerProvider().get_tracer("test")
    with tracer.start_as_current_span("health.evaluate_fault") as span:
        alert = alerts.raised(STATE, driver=DRIVER, node="node-a", pool="node-a", taint=TAINT)
    assert alert.trace_id == format(span.get_span_context().trace_id, "032x")


def test_alert_outside_a_span_has_no_trace_id():
    alert = alerts.raised(STATE, driver=DRIVER, node="node-a", pool="node-a", taint=TAINT)
    assert alert.trace_id == ""
