"""NodePrepareResources/NodeUnprepareResources from the kubelet emulator, end to end.

Claims live in the API emulator, the inventory in the NATS KV, CDI specs and checkpoints on
disk; the kubelet emulator enforces the kubelet's checks on every answer.
"""

from __future__ import annotations

import grpc
import pytest
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from devcluster.kubelet import KubeletClaim
from shared import telemetry
from shared.config import TelemetrySettings
from shared.pb.kubelet.dra.v1 import api_pb2 as dra
from shared.pb.kubelet.dra.v1 import api_pb2_grpc as dra_grpc

pytestmark = pytest.mark.integration

DRIVER = "sim.dra-suite.io"


async def _inventory_seen(plugin_node, agent, *names: str) -> None:
    await plugin_node.publish_inventory(*names)
    await plugin_node.eventually(
        lambda: (
            agent.inventory.current is not None
            and [d.name for d in agent.inventory.current.devices] == list(names)
        )
    )


async def test_prepare_writes_a_cdi_spec_naming_exactly_the_allocated_devices(plugin_node):
    async with plugin_node.registered() as (agent, kubelet):
        await _inventory_seen(plugin_node, agent, "npu-0", "npu-1", "npu-2", "npu-3")
        claim = plugin_node.allocate("train", ["npu-1", "npu-3"])
        answer = (await kubelet.prepare([claim])).claims[claim.uid]
        assert answer.error == ""
        assert [(list(d.request_names), d.pool_name, d.device_name) for d in answer.devices] == [
            (["npu"], "node-a", "npu-1"),
            (["npu"], "node-a", "npu-3"),
        ]
        ids = [list(d.cdi_device_ids) for d in answer.devices]
        assert ids == [
            [f"k8s.{DRIVER}/claim={claim.uid}-npu-1"],
            [f"k8s.{DRIVER}/claim={claim.uid}-npu-3"],
        ]
        spec = plugin_node.spec(claim.uid)
        assert spec is not None
        assert spec["kind"] == f"k8s.{DRIVER}/claim"
        assert [d["name"] for d in spec["devices"]] == [
            f"{claim.uid}-npu-1",
            f"{claim.uid}-npu-3",
        ]
        assert spec["devices"][0]["containerEdits"]["deviceNodes"] == [
            {"path": "/dev/davinci1", "hostPath": "/dev/null"}
        ]


async def test_repeat_prepare_returns_same_cdi_ids(plugin_node):
    async with plugin_node.registered() as (agent, kubelet):
        await _inventory_seen(plugin_node, agent, "npu-0", "npu-1")
        claim = plugin_node.allocate("train", ["npu-0"])
        first = await kubelet.prepare([claim])
        second = await kubelet.prepare([claim])
        assert second == first
        assert first.claims[claim.uid].error == ""


@pytest.mark.parametrize(
    ("case", "error"),
    [("wrong-uid", "got replaced"), ("unallocated", "not allocated"), ("unknown", "npu-9")],
    ids=["wrong-uid", "unallocated", "unknown-device"],
)
async def test_one_bad_claim_does_not_fail_the_others(plugin_node, case, error):
    async with plugin_node.registered() as (agent, kubelet):
        await _inventory_seen(plugin_node, agent, "npu-0", "npu-1")
        good = plugin_node.allocate("good", ["npu-0"])
        if case == "wrong-uid":
            created = plugin_node.allocate("bad", ["npu-1"])
            bad = KubeletClaim(namespace="default", name=created.name, uid="0000-replaced")
        elif case == "unallocated":
            bad = plugin_node.allocate("bad", ["npu-1"], allocated=False)
        else:
            bad = plugin_node.allocate("bad", ["npu-9"])
        answer = await kubelet.prepare([good, bad])
        assert answer.claims[good.uid].error == ""
        assert [d.device_name for d in answer.claims[good.uid].devices] == ["npu-0"]
        assert error in answer.claims[bad.uid].error
        assert plugin_node.spec(bad.uid) is None


async def test_unprepare_removes_the_cdi_spec(plugin_node):
    async with plugin_node.registered() as (agent, kubelet):
        await _inventory_seen(plugin_node, agent, "npu-0")
        claim = plugin_node.allocate("train", ["npu-0"])
        await kubelet.prepare([claim])
        assert plugin_node.spec(claim.uid) is not None
        answer = await kubelet.unprepare([claim])
        assert answer.claims[claim.uid].error == ""
        assert plugin_node.spec(claim.uid) is None
        assert agent.checkpoints.get(claim.uid) is None


async def test_unprepare_of_an_unknown_claim_succeeds(plugin_node):
    async with plugin_node.registered() as (_, kubelet):
        claim = KubeletClaim(
            namespace="default", name="gone", uid="6b8f3c1e-dead-4bee-8000-000000000000"
        )
        answer = await kubelet.unprepare([claim])
        assert answer.claims[claim.uid].error == ""


async def test_an_older_kubelet_prepares_through_v1beta1(plugin_node):
    async with plugin_node.registered(known_versions=["v1beta1.DRAPlugin"]) as (agent, kubelet):
        assert kubelet.dra_version == "v1beta1.DRAPlugin"
        await _inventory_seen(plugin_node, agent, "npu-0")
        claim = plugin_node.allocate("train", ["npu-0"])
        answer = (await kubelet.prepare([claim])).claims[claim.uid]
        assert [list(d.cdi_device_ids) for d in answer.devices] == [
            [f"k8s.{DRIVER}/claim={claim.uid}-npu-0"]
        ]
        assert not answer.devices[0].HasField("share_id")
        assert (await kubelet.unprepare([claim])).claims[claim.uid].error == ""
        assert plugin_node.spec(claim.uid) is None


async def test_prepare_continues_the_callers_trace(plugin_node):
    exporter = InMemorySpanExporter()
    telemetry.configure(
        TelemetrySettings(), service="test", extra_processors=[SimpleSpanProcessor(exporter)]
    )
    trace_id = "4bf92f3577b34da6a3ce929d0e0e4736"
    async with plugin_node.registered() as (agent, _):
        await _inventory_seen(plugin_node, agent, "npu-0")
        claim = plugin_node.allocate("train", ["npu-0"])
        target = f"unix:{plugin_node.config.dra_socket_path}"
        async with grpc.aio.insecure_channel(target) as channel:
            answer = await dra_grpc.DRAPluginStub(channel).NodePrepareResources(
                dra.NodePrepareResourcesRequest(
                    claims=[dra.Claim(namespace="default", name=claim.name, uid=claim.uid)]
                ),
                metadata=(("traceparent", f"00-{trace_id}-00f067aa0ba902b7-01"),),
                timeout=10,
            )
    assert answer.claims[claim.uid].error == ""
    spans = {
        span.name: span
        for span in exporter.get_finished_spans()
        if span.context is not None and format(span.context.trace_id, "032x") == trace_id
    }
    call, prepared = spans["allocation.node_prepare_resources"], spans["allocation.prepare_claim"]
    assert call.parent is not None
    assert call.parent.span_id == 0x00F067AA0BA902B7
    assert call.context is not None
    assert prepared.parent is not None
    assert prepared.parent.span_id == call.context.span_id
