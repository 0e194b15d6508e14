"""One trace across the agents: every agent and dractl a real process, exporting to a real
OTLP/gRPC receiver (opentelemetry-proto's TraceService, served here with grpc.aio).

`dractl fault inject` starts a trace that the health agent (monitor observation, evaluation,
taint write, alert, health record put) and the allocation agent (health record read, kubelet
health-stream update) continue over NATS; a prepare is one trace whose steps are spans named by
the claim's UID; the inventory's put continues the discovery scan in the allocation agent.
"""

from __future__ import annotations

import asyncio
import contextlib
import sys
from collections import defaultdict
from collections.abc import AsyncIterator, Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path

import grpc
import pytest
from opentelemetry.proto.collector.trace.v1 import trace_service_pb2, trace_service_pb2_grpc
from opentelemetry.proto.common.v1 import common_pb2

from devcluster import flow
from devcluster.kubelet import KubeletEmulator
from devcluster.stack import LocalStack, StackConfig
from shared.bus.session import open_bus
from shared.pb.kubelet.drahealth.v1alpha1 import api_pb2 as health_api

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(60)]

DRIVER = "sim.dra-suite.io"
NODE = "trace-node"
PREPARE_STEPS = {"allocation.claim_read", "allocation.plan", "allocation.cdi_write"}


@dataclass(frozen=True, slots=True)
class _Span:
    service: str
    trace_id: str
    name: str
    attributes: dict[str, str]
    links: tuple[str, ...] = ()
    """Trace IDs of the spans this one links to."""


@dataclass
class _Receiver(trace_service_pb2_grpc.TraceServiceServicer):
    spans: list[_Span] = field(default_factory=list)
    arrived: asyncio.Event = field(default_factory=asyncio.Event)

    async def Export(
        self,
        request: trace_service_pb2.ExportTraceServiceRequest,
        context: grpc.aio.ServicerContext[
            trace_service_pb2.ExportTraceServiceRequest,
            trace_service_pb2.ExportTraceServiceResponse,
        ],
    ) -> trace_service_pb2.ExportTraceServiceResponse:
        for resource_spans in request.resource_spans:
            service = _strings(resource_spans.resource.attributes).get("service.name", "")
            for scope_spans in resource_spans.scope_spans:
                for span in scope_spans.spans:
                    links = tuple(link.trace_id.hex() for link in span.links)
                    attributes = _strings(span.attributes)
                    self.spans.append(
                        _Span(service, span.trace_id.hex(), span.name, attributes, links)
                    )
        self.arrived.set()
        return trace_service_pb2.ExportTraceServiceResponse()

    def traces(self) -> dict[str, list[_Span]]:
        found: dict[str, list[_Span]] = defaultdict(list)
        for span in self.spans:
            found[span.trace_id].append(span)
        return found

    async def wait_trace(
        self, wanted: Callable[[list[_Span]], bool], *, timeout_s: float = 15.0
    ) -> list[_Span]:
        async with asyncio.timeout(timeout_s):
            while True:
                self.arrived.clear()
                for spans in self.traces().values():
                    if wanted(spans):
                        return spans
                await self.arrived.wait()


def _strings(attributes: Iterable[common_pb2.KeyValue]) -> dict[str, str]:
    return {a.key: a.value.string_value for a in attributes if a.value.HasField("string_value")}


@pytest.fixture
async def receiver() -> AsyncIterator[tuple[_Receiver, str]]:
    server = grpc.aio.server()
    collector = _Receiver()
    trace_service_pb2_grpc.add_TraceServiceServicer_to_server(collector, server)  # type: ignore[no-untyped-call]  # generated without hints
    port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    yield collector, f"http://127.0.0.1:{port}"
    await server.stop(grace=None)


@pytest.fixture
async def stack(
    short_tmp: Path, receiver: tuple[_Receiver, str], monkeypatch: pytest.MonkeyPatch
) -> AsyncIterator[LocalStack]:
    # The agents inherit it: spans leave within 100 ms rather than the SDK's 5 s.
    monkeypatch.setenv("OTEL_BSP_SCHEDULE_DELAY", "100")
    endpoint = ("--otlp-endpoint", receiver[1])
    config = StackConfig(
        workdir=short_tmp / "stack",
        node_name=NODE,
        driver_name=DRIVER,
        extra_args=tuple((agent, endpoint) for agent in ("discovery", "allocation", "health")),
    )
    async with LocalStack(config) as running:
        yield running


async def _dractl(stack: LocalStack, endpoint: str, *args: str) -> None:
    assert stack.nats is not None
    process = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "services.dractl", "--nats-url", stack.nats.url,
        "--node-name", NODE, "--driver-name", DRIVER, "--otlp-endpoint", endpoint, *args,
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
    )  # fmt: skip
    out, err = await process.communicate()
    assert process.returncode == 0, (out + err).decode()


def _services(spans: list[_Span]) -> set[str]:
    return {span.service for span in spans}


def _names(spans: list[_Span]) -> set[str]:
    return {span.name for span in spans}


async def test_a_fault_and_a_prepare_are_each_one_trace_across_the_agents(
    stack: LocalStack, receiver: tuple[_Receiver, str]
) -> None:
    collector, endpoint = receiver
    async with open_bus(stack.nats_settings) as bus, stack.kube() as kube:
        await flow.wait_inventory(bus, driver=DRIVER, node=NODE)
        await flow.wait_slices(kube, driver=DRIVER, node=NODE, devices=12)
        await flow.create_device_class(
            kube, name="npu.sim.dra-suite.io", cel=f'device.attributes["{DRIVER}"].type == "npu"'
        )
        claim = await flow.create_claim(
            kube,
            namespace="default",
            name="one-npu",
            device_class="npu.sim.dra-suite.io",
            count=1,
            cel="true",
        )
        claim = await flow.schedule_claim(kube, claim, node=NODE)
        device = flow.allocated_devices(claim)[0]
        ref = flow.kubelet_claim(claim)
        kubelet = KubeletEmulator(stack.config.registry_dir)
        recorder = flow.HealthStreamRecorder(kubelet)
        watcher: asyncio.Task[None] | None = None
        try:
            await kubelet.register(driver=DRIVER)
            assert (await kubelet.prepare([ref])).claims[ref.uid].error == ""
            watcher = asyncio.create_task(recorder.run())
            await recorder.wait_for(device, health_api.HEALTHY)

            await _dractl(stack, endpoint, "fault", "inject", device)
            await recorder.wait_for(device, health_api.UNHEALTHY)
            fault = await collector.wait_trace(
                lambda spans: (
                    "dractl.fault" in _names(spans)
                    and "allocation.kubelet_health_update" in _names(spans)
                )
            )
        finally:
            if watcher is not None:
                watcher.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await watcher
            await kubelet.close()

    assert {"dractl", "dra-health", "dra-allocation"} <= _services(fault), fault
    assert {
        "health.monitor_observation",
        "health.evaluate_fault",
        "allocation.health_update",
    } <= _names(fault)

    def prepared(spans: list[_Span]) -> bool:
        steps = {s.name for s in spans if s.attributes.get("claim_uid") == ref.uid}
        return PREPARE_STEPS | {"allocation.checkpoint"} <= steps

    prepare = await collector.wait_trace(prepared)
    assert "allocation.prepare_claim" in _names(prepare)

    # The allocation agent's watch may start after the put: it then sees the value replayed,
    # a new trace linked to the scan's rather than a child in it.
    inventory = await collector.wait_trace(
        lambda spans: (
            {"discovery.scan", "discovery.publish_inventory"} <= _names(spans)
            and _continued(collector, spans, "allocation.inventory_update")
        )
    )
    assert "dra-discovery" in _services(inventory)


def _continued(collector: _Receiver, spans: list[_Span], name: str) -> bool:
    """Whether a span `name` is in the trace of `spans` or links to it."""
    trace_id = spans[0].trace_id
    return any(
        s.name == name and (s.trace_id == trace_id or trace_id in s.links) for s in collector.spans
    )
