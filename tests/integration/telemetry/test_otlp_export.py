"""Span export follows the OpenTelemetry SDK's standard environment, TLS included.

A real OTLP/gRPC receiver (the collector's TraceService) runs on a loopback port, in plaintext or
with a throwaway CA's certificate; the exporter that `shared.telemetry` builds must reach it
exactly when the flag or the standard variables say so, and over TLS when they say https.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from concurrent import futures
from dataclasses import dataclass, field
from pathlib import Path

import grpc
import pytest
import trustme
from opentelemetry.proto.collector.trace.v1 import trace_service_pb2, trace_service_pb2_grpc
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor, SpanExporter

from shared import telemetry
from shared.config import TelemetrySettings

pytestmark = pytest.mark.integration


@dataclass
class _Receiver(trace_service_pb2_grpc.TraceServiceServicer):
    span_names: list[str] = field(default_factory=list)
    received: threading.Event = field(default_factory=threading.Event)

    def Export(
        self, request: trace_service_pb2.ExportTraceServiceRequest, context: grpc.ServicerContext
    ) -> trace_service_pb2.ExportTraceServiceResponse:
        for resource_spans in request.resource_spans:
            for scope_spans in resource_spans.scope_spans:
                self.span_names.extend(span.name for span in scope_spans.spans)
        self.received.set()
        return trace_service_pb2.ExportTraceServiceResponse()


@dataclass(frozen=True)
class _Collector:
    port: int
    receiver: _Receiver
    ca_file: Path | None


@pytest.fixture(scope="module")
def pki() -> trustme.CA:
    return trustme.CA()


def _serve(credentials: grpc.ServerCredentials | None) -> tuple[grpc.Server, int, _Receiver]:
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=2))
    receiver = _Receiver()
    trace_service_pb2_grpc.add_TraceServiceServicer_to_server(receiver, server)  # type: ignore[no-untyped-call]  # generated without hints
    if credentials is None:
        port = server.add_insecure_port("127.0.0.1:0")
    else:
        port = server.add_secure_port("127.0.0.1:0", credentials)
    server.start()
    return server, port, receiver


@pytest.fixture
def plain_collector() -> Iterator[_Collector]:
    server, port, receiver = _serve(None)
    yield _Collector(port=port, receiver=receiver, ca_file=None)
    server.stop(grace=None)


@pytest.fixture
def tls_collector(pki: trustme.CA, tmp_path: Path) -> Iterator[_Collector]:
    cert = pki.issue_cert("localhost", "127.0.0.1")
    credentials = grpc.ssl_server_credentials(
        [(cert.private_key_pem.bytes(), cert.cert_chain_pems[0].bytes())]
    )
    ca_file = tmp_path / "collector-ca.pem"
    pki.cert_pem.write_to_path(str(ca_file))
    server, port, receiver = _serve(credentials)
    yield _Collector(port=port, receiver=receiver, ca_file=ca_file)
    server.stop(grace=None)


def _send_one_span(exporter: SpanExporter, name: str) -> None:
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    with provider.get_tracer(__name__).start_as_current_span(name):
        pass
    provider.shutdown()


def _settings(endpoint: str = "") -> TelemetrySettings:
    return TelemetrySettings(otlp_endpoint=endpoint)


def test_http_endpoint_flag_exports_in_plaintext(plain_collector: _Collector) -> None:
    exporter = telemetry.span_exporter(
        _settings(f"http://127.0.0.1:{plain_collector.port}"), environ={}
    )
    assert exporter is not None
    _send_one_span(exporter, "plain-span")
    assert plain_collector.receiver.received.wait(10)
    assert plain_collector.receiver.span_names == ["plain-span"]


def test_https_endpoint_uses_tls_with_the_standard_certificate_variable(
    tls_collector: _Collector, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The SDK's exporter reads its TLS variables from the process environment itself.
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_CERTIFICATE", str(tls_collector.ca_file))
    exporter = telemetry.span_exporter(
        _settings(f"https://localhost:{tls_collector.port}"), environ={}
    )
    assert exporter is not None
    _send_one_span(exporter, "tls-span")
    assert tls_collector.receiver.received.wait(10)
    assert tls_collector.receiver.span_names == ["tls-span"]


def test_standard_endpoint_variable_alone_turns_export_on(
    plain_collector: _Collector, monkeypatch: pytest.MonkeyPatch
) -> None:
    endpoint = f"http://127.0.0.1:{plain_collector.port}"
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_ENDPOINT", endpoint)
    exporter = telemetry.span_exporter(
        _settings(), environ={"OTEL_EXPORTER_OTLP_ENDPOINT": endpoint}
    )
    assert exporter is not None
    _send_one_span(exporter, "env-span")
    assert plain_collector.receiver.received.wait(10)
    assert plain_collector.receiver.span_names == ["env-span"]


@pytest.mark.parametrize(
    ("flag", "environ", "expected"),
    [
        ("", {}, None),
        ("http://c:4317", {}, "http://c:4317"),
        ("", {"OTEL_EXPORTER_OTLP_ENDPOINT": "https://c:4317"}, ""),
        ("", {"OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": "https://c:4317"}, ""),
        ("http://c:4317", {"OTEL_SDK_DISABLED": "true"}, None),
        ("http://c:4317", {"OTEL_TRACES_EXPORTER": "none"}, None),
        ("http://c:4317", {"OTEL_SDK_DISABLED": "false"}, "http://c:4317"),
    ],
    ids=[
        "nothing-set",
        "flag",
        "standard-endpoint",
        "standard-traces-endpoint",
        "sdk-disabled",
        "exporter-none",
        "sdk-explicitly-enabled",
    ],
)
def test_export_endpoint_follows_flag_then_standard_variables(
    flag: str, environ: dict[str, str], expected: str | None
) -> None:
    assert telemetry.export_endpoint(_settings(flag), environ) == expected
