"""A latency exemplar leads from Prometheus to the trace: Debian's Prometheus, with exemplar
storage on, scrapes the live allocation agent (in the local stack, exporting its spans to a real
OTLP/gRPC receiver) after a kubelet prepare; `/api/v1/query_exemplars` of the prepare histogram
returns an exemplar whose `trace_id` is the prepare's trace as the receiver got it, and whose
`span_id` is one of that trace's spans.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import grpc
import pytest
from opentelemetry.proto.collector.trace.v1 import trace_service_pb2, trace_service_pb2_grpc

from devcluster import flow
from devcluster.kubelet import KubeletEmulator
from devcluster.stack import LocalStack, StackConfig
from shared.metrics_exemplars import SPAN_ID_LABEL, TRACE_ID_LABEL
from tests.integration.observability.promstack import Binaries, Prometheus

pytestmark = [pytest.mark.integration, pytest.mark.slow, pytest.mark.timeout(180)]

DRIVER = "sim.dra-suite.io"
NODE = "exemplar-node"
DEVICE_CLASS = "npu.sim.dra-suite.io"
HISTOGRAM = "dra_prepare_duration_seconds_bucket"


@dataclass
class _Receiver(trace_service_pb2_grpc.TraceServiceServicer):
    """The spans an agent exports, as (trace ID, span ID) by the claim UID they carry."""

    spans: dict[str, set[tuple[str, str]]] = field(default_factory=dict)
    every: dict[str, set[str]] = field(default_factory=dict)
    """Trace ID -> the IDs of all its spans."""

    async def Export(
        self,
        request: trace_service_pb2.ExportTraceServiceRequest,
        context: grpc.aio.ServicerContext[
            trace_service_pb2.ExportTraceServiceRequest,
            trace_service_pb2.ExportTraceServiceResponse,
        ],
    ) -> trace_service_pb2.ExportTraceServiceResponse:
        for resource_spans in request.resource_spans:
            for scope_spans in resource_spans.scope_spans:
                for span in scope_spans.spans:
                    ids = (span.trace_id.hex(), span.span_id.hex())
                    self.every.setdefault(ids[0], set()).add(ids[1])
                    for attribute in span.attributes:
                        if attribute.key == "claim_uid":
                            self.spans.setdefault(attribute.value.string_value, set()).add(ids)
        return trace_service_pb2.ExportTraceServiceResponse()


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
    binaries: Binaries,
    short_tmp: Path,
    receiver: tuple[_Receiver, str],
    monkeypatch: pytest.MonkeyPatch,
) -> AsyncIterator[LocalStack]:
    monkeypatch.setenv("OTEL_BSP_SCHEDULE_DELAY", "100")  # spans leave within 100 ms
    config = StackConfig(
        workdir=short_tmp / "stack",
        node_name=NODE,
        driver_name=DRIVER,
        extra_args=(("allocation", ("--otlp-endpoint", receiver[1])),),
    )
    async with LocalStack(config) as running:
        yield running


@pytest.fixture
async def prometheus(
    binaries: Binaries, stack: LocalStack, short_tmp: Path
) -> AsyncIterator[Prometheus]:
    server = Prometheus(
        binaries.prometheus,
        short_tmp / "prometheus",
        targets=[f"127.0.0.1:{stack.ops_port('allocation')}"],
        flags=("--enable-feature=exemplar-storage",),
    )
    try:
        await server.start()
        yield server
    finally:
        await server.stop()


async def _prepare_one_claim(stack: LocalStack) -> str:
    """The UID of a claim the kubelet emulator prepared on the node."""
    async with stack.kube() as kube:
        await flow.wait_slices(kube, driver=DRIVER, node=NODE, devices=12)
        await flow.create_device_class(
            kube, name=DEVICE_CLASS, cel=f'device.attributes["{DRIVER}"].type == "npu"'
        )
        claim = await flow.create_claim(
            kube, namespace="default", name="traced", device_class=DEVICE_CLASS, count=1, cel="true"
        )
        ref = flow.kubelet_claim(await flow.schedule_claim(kube, claim, node=NODE))
    kubelet = KubeletEmulator(stack.config.registry_dir)
    try:
        await kubelet.register(driver=DRIVER)
        assert (await kubelet.prepare([ref])).claims[ref.uid].error == ""
    finally:
        await kubelet.close()
    return ref.uid


async def test_a_prepare_latency_exemplar_names_the_trace_of_the_prepare(
    stack: LocalStack, prometheus: Prometheus, receiver: tuple[_Receiver, str]
) -> None:
    collector, _ = receiver
    uid = await _prepare_one_claim(stack)

    async def prepare_trace() -> str | None:
        traces = {trace_id for trace_id, _ in collector.spans.get(uid, set())}
        assert len(traces) <= 1, traces  # one prepare, one trace
        return next(iter(traces), None)

    trace_id = await flow.eventually(prepare_trace, what="the prepare's spans", timeout_s=15)

    async def exemplar() -> dict[str, Any] | None:
        for series in await prometheus.exemplars(HISTOGRAM):
            for found in series["exemplars"]:
                if found["labels"].get(TRACE_ID_LABEL) == trace_id:
                    return {"series": series["seriesLabels"], **found}
        return None

    found = await flow.eventually(exemplar, what=f"an exemplar of trace {trace_id}", timeout_s=30)
    assert found["series"]["__name__"] == HISTOGRAM
    assert found["series"]["outcome"] == "ok"
    assert found["labels"][SPAN_ID_LABEL] in collector.every[trace_id]
    assert float(found["value"]) <= float(found["series"]["le"])
