"""The health agent end to end: real NATS, the API emulator, the sim monitor.

Faults arrive over the real fault-control subject; health lands in the KV, DeviceTaintRules
and Node Events in the emulator (which validates them like kube-apiserver) and alerts on
the JetStream stream. The `health` harness comes from this folder's conftest.
"""

from __future__ import annotations

from typing import Any

import pytest
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from devcluster.apiserver import ClusterConfig
from services.health import taints
from shared import telemetry
from shared.bus import codec
from shared.config import TelemetrySettings
from shared.pb.drasuite.v1 import claim_pb2

pytestmark = pytest.mark.integration

DRIVER = "sim.dra-suite.io"
NODE = "node-a"
XID_TAINT = f"{DRIVER}/xid=79:NoSchedule"
VERSIONS = pytest.mark.parametrize(
    ("kube", "version"),
    [("1.36", "v1beta2"), ("1.35", "v1alpha3")],
    ids=["1.36 uses v1beta2", "1.35 uses v1alpha3"],
    indirect=["kube"],
)


@pytest.fixture(scope="module")
def spans() -> InMemorySpanExporter:
    exporter = InMemorySpanExporter()
    telemetry.configure(
        TelemetrySettings(), service="test", extra_processors=[SimpleSpanProcessor(exporter)]
    )
    return exporter


@VERSIONS
async def test_fault_command_records_taints_writes_an_event_and_raises_an_alert(
    health, version, spans
):
    node = health.create_node()
    await health.put_inventory()
    async with health.running() as agent:
        await health.eventually(health.state_is("gpu-1", health.HEALTHY))
        command = health.fault("gpu-1", cause="xid", code="79", message="off the bus")
        assert await health.command(command) == {"ok": True}

        found = await health.eventually(health.state_is("gpu-1", health.UNHEALTHY))
        assert (found.cause, found.code, found.message) == ("xid", "79", "off the bus")
        assert (found.taint, found.pool) == (XID_TAINT, NODE)

        rule = (await health.eventually(health.now(lambda: health.rules_for("gpu-1"))))[0]
        assert agent.taints.version == version
        _assert_rule(rule)
        created = health.kube.request_log.records(verb="create", resource="devicetaintrules")
        assert {r.path for r in created} == {f"/apis/resource.k8s.io/{version}/devicetaintrules"}

        events = await health.eventually(health.now(lambda: health.node_events("DeviceUnhealthy")))
        assert events[0]["type"] == "Warning"
        assert events[0]["involvedObject"]["uid"] == node["metadata"]["uid"]
        assert events[0]["source"]["component"] == "dra-suite-health"
        assert events[0]["metadata"]["name"].startswith(f"{NODE}.")

        (raised,) = await health.eventually(health.alerts_with("ALERT_STATUS_RAISED"))
        assert (raised["device"], raised["cause"], raised["taint"]) == ("gpu-1", "xid", XID_TAINT)
    _assert_one_trace(spans, raised["traceId"])


async def test_a_fault_before_the_inventory_is_refused_as_retryable_and_unknown_devices_finally(
    health,
):
    """`retry` tells a sender (the devcluster flows, the tests) that the agent is starting;
    a device the inventory does not hold is refused without it."""
    health.create_node()
    async with health.running():
        subject = health.bus.names.fault_control(health.DRIVER, health.NODE)
        answer = await health.eventually(health.replied(subject, health.fault("gpu-1")))
        assert answer["ok"] is False
        assert answer["retry"] is True
        assert "inventory is not known yet" in answer["error"]

        await health.put_inventory()
        await health.eventually(health.state_is("gpu-1", health.HEALTHY))
        refused = await health.command(health.fault("gpu-9"))
        assert refused["ok"] is False
        assert "retry" not in refused
        assert "unknown device" in refused["error"]
        assert await health.command(health.fault("gpu-1", clear=True)) == {"ok": True}


def _assert_rule(rule: dict[str, Any]) -> None:
    assert rule["spec"]["deviceSelector"] == {"driver": DRIVER, "pool": NODE, "device": "gpu-1"}
    taint = rule["spec"]["taint"]
    assert (taint["key"], taint["value"], taint["effect"]) == (f"{DRIVER}/xid", "79", "NoSchedule")
    assert rule["metadata"]["labels"][taints.LABEL_DEVICE] == "gpu-1"


def _assert_one_trace(spans: InMemorySpanExporter, trace_id: str) -> None:
    """The fault's KV write, taint, events (node and pods) and alert all belong to its one trace."""
    in_trace = [
        s.name
        for s in spans.get_finished_spans()
        if s.context is not None and format(s.context.trace_id, "032x") == trace_id
    ]
    # The kube client's own spans (`kube.<verb> <resource>`) join the trace as children.
    assert any(name.startswith("kube.create") for name in in_trace)
    assert sorted({name for name in in_trace if name.startswith("health.")}) == [
        "health.evaluate_fault",
        "health.monitor_observation",
        "health.publish_alert",
        "health.write_event",
        "health.write_pod_events",
        "health.write_taint",
    ]
    assert in_trace.count("health.evaluate_fault") == 1


@VERSIONS
async def test_clearing_a_fault_deletes_the_rule_and_resolves_the_alert(health, version):
    health.create_node()
    await health.put_inventory()
    async with health.running() as agent:
        assert await health.command(health.fault("gpu-1", cause="xid", code="79")) == {"ok": True}
        await health.eventually(health.now(lambda: health.rules_for("gpu-1")))
        (raised,) = await health.eventually(health.alerts_with("ALERT_STATUS_RAISED"))

        assert await health.command(health.fault("gpu-1", clear=True)) == {"ok": True}
        found = await health.eventually(health.state_is("gpu-1", health.HEALTHY))
        assert (found.cause, found.taint) == ("", "")
        await health.eventually(health.now(lambda: not health.rules_for("gpu-1")))
        events = await health.eventually(health.now(lambda: health.node_events("DeviceRecovered")))
        assert events[0]["type"] == "Normal"

        (resolved,) = await health.eventually(health.alerts_with("ALERT_STATUS_RESOLVED"))
        assert resolved["raisedUnixMs"] == raised["raisedUnixMs"]
        assert int(resolved["resolvedUnixMs"]) >= int(resolved["raisedUnixMs"])
        assert resolved["id"] != raised["id"]
        assert len(await health.stream_alerts()) == 2
        assert agent.taints.version == version


async def test_unknown_devices_and_malformed_commands_get_error_replies(health):
    health.create_node()
    await health.put_inventory()
    async with health.running():
        await health.eventually(health.state_is("gpu-0", health.HEALTHY))
        bad = [health.fault("gpu-9", cause="xid"), b"\xff\xff\xff not a protobuf", health.fault("")]
        for command in bad:
            answer = await health.command(command)
            assert answer["ok"] is False
            assert answer["error"]
        assert await health.command(health.fault("gpu-0", cause="ecc")) == {"ok": True}
        await health.eventually(health.state_is("gpu-0", health.UNHEALTHY))


@pytest.mark.parametrize(
    "kube",
    [ClusterConfig.for_tests("1.36", DRADeviceTaintRules=False)],
    ids=["1.36 with the taint rule gate off"],
    indirect=True,
)
async def test_without_served_taint_rules_health_is_still_recorded(health):
    health.create_node()
    await health.put_inventory()
    async with health.running() as agent:
        await health.eventually(health.now(lambda: agent.taints.available is False))
        assert await health.command(health.fault("gpu-2", cause="xid", code="48")) == {"ok": True}
        found = await health.eventually(health.state_is("gpu-2", health.UNHEALTHY))
        assert found.taint == ""
        (raised,) = await health.eventually(health.alerts_with("ALERT_STATUS_RAISED"))
        assert raised["taint"] == ""
        await health.eventually(health.now(lambda: health.node_events("DeviceUnhealthy")))


async def test_forbidden_taint_rules_leave_health_recorded_and_the_agent_running(health):
    health.kube.faults.add(verb="list", resource="devicetaintrules", status=403)
    health.create_node()
    await health.put_inventory()
    async with health.running() as agent:
        await health.eventually(health.now(lambda: agent.taints.available is False))
        assert await health.command(health.fault("gpu-0", cause="xid", code="79")) == {"ok": True}
        found = await health.eventually(health.state_is("gpu-0", health.UNHEALTHY))
        assert found.taint == ""
        assert health.rules_for("gpu-0") == []


async def test_an_unhealthy_device_warns_the_pods_whose_claims_use_it(health):
    health.create_node()
    await health.prepare_claim(
        "train", namespace="team-a", device="gpu-1", pods={"trainer-0": "u-0", "trainer-1": "u-1"}
    )
    await health.prepare_claim("infer", namespace="team-b", device="gpu-2", pods={"server": "u-2"})
    # Forged or damaged values under this node's keys are not believed.
    forged = claim_pb2.PreparedClaim(
        driver=health.DRIVER,
        node="node-b",
        claim_uid="forged",
        namespace="kube-system",
        name="x",
        devices=[claim_pb2.PreparedClaimDevice(pool=health.NODE, device="gpu-1")],
        pods=[claim_pb2.ClaimPod(namespace="kube-system", name="victim", uid="v")],
    )
    await health.put_prepared_claim("forged", codec.encode(forged))
    await health.put_prepared_claim("damaged", b"\xff\xfe")
    await health.put_inventory()
    async with health.running() as agent:
        await health.eventually(health.state_is("gpu-1", health.HEALTHY))
        command = health.fault("gpu-1", cause="xid", code="79", message="off the bus")
        assert await health.command(command) == {"ok": True}

        def warned() -> list[dict[str, Any]]:
            found = health.kube.objects("events", "team-a")
            return found if len(found) == 2 else []

        found = await health.eventually(health.now(warned))
        assert {e["involvedObject"]["name"] for e in found} == {"trainer-0", "trainer-1"}
        assert {e["involvedObject"]["kind"] for e in found} == {"Pod"}
        assert {e["type"] for e in found} == {"Warning"}
        assert all("device gpu-1 of claim train" in e["message"] for e in found)
        assert health.kube.objects("events", "team-b") == []
        assert health.kube.objects("events", "kube-system") == []
        # The writer counts an Event once the API server has answered its create, which can
        # be a moment after the emulator stored it.
        await health.eventually(health.now(lambda: agent.pod_events.written == 2))
    # Pods come from this node's prepared claims: no ResourceClaim is read from the API.
    assert health.kube.request_log.count(resource="resourceclaims") == 0


async def test_a_fault_reported_over_nats_continues_the_reporters_trace(health, spans):
    health.create_node()
    await health.put_inventory()
    async with health.running():
        await health.eventually(health.state_is("gpu-1", health.HEALTHY))
        with telemetry.tracer("operator").start_as_current_span("operator.inject_fault") as caller:
            command = health.fault("gpu-1", cause="xid", code="79")
            assert await health.command(command) == {"ok": True}
        await health.eventually(health.alerts_with("ALERT_STATUS_RAISED"))
    trace_id = caller.get_span_context().trace_id
    (evaluation,) = [
        s
        for s in spans.get_finished_spans()
        if s.name == "health.evaluate_fault" and s.context.trace_id == trace_id
    ]
    # The monitor's observation is the caller's child, and the evaluation the observation's.
    (observation,) = [
        s
        for s in spans.get_finished_spans()
        if s.name == "health.monitor_observation" and s.context.trace_id == trace_id
    ]
    assert observation.parent is not None
    assert observation.parent.span_id == caller.get_span_context().span_id
    assert evaluation.parent is not None
    assert evaluation.parent.span_id == observation.context.span_id
