"""The bus readers that had no span continue the writer's trace, on a real nats-server: the
health agent's inventory and prepared-claims watchers, the discovery agent's health-record
(taint) watcher, and dractl's alert listing. A change seen live is a child of the writer's span;
a value replayed at start is a new trace linked to it (`telemetry.continued`)."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Coroutine
from typing import Any

import pytest
from opentelemetry.sdk.trace import ReadableSpan
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import Span

from services.discovery import taints as discovery_taints
from services.dractl import queries
from services.health.inventory_watcher import inventory_watcher
from services.health.prepared_claims import PreparedClaims, claim_watcher
from shared import telemetry
from shared.bus import codec
from shared.bus.connection import Bus
from shared.config import TelemetrySettings
from shared.pb.drasuite.v1 import alert_pb2, claim_pb2, health_pb2, inventory_pb2
from tests.integration.fuzz.fuzzing import until

pytestmark = pytest.mark.integration

DRIVER, NODE = "sim.dra-suite.io", "node-a"
writer = telemetry.tracer("test.writer")


@pytest.fixture(scope="module")
def spans() -> InMemorySpanExporter:
    exporter = InMemorySpanExporter()
    telemetry.configure(
        TelemetrySettings(), service="test", extra_processors=[SimpleSpanProcessor(exporter)]
    )
    return exporter


@contextlib.asynccontextmanager
async def running(work: Coroutine[Any, Any, None]) -> AsyncIterator[None]:
    task = asyncio.create_task(work)
    try:
        yield
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task


def reader_spans(spans: InMemorySpanExporter, name: str) -> list[ReadableSpan]:
    return [s for s in spans.get_finished_spans() if s.name == name]


def assert_child(span: ReadableSpan, parent: Span) -> None:
    """`span` continues `parent`'s trace, as its child."""
    wanted = parent.get_span_context()
    assert span.context is not None
    assert span.context.trace_id == wanted.trace_id
    assert span.parent is not None
    assert span.parent.span_id == wanted.span_id


def assert_linked(span: ReadableSpan, parent: Span) -> None:
    """`span` starts a new trace linked to `parent`'s span (a replayed value)."""
    wanted = parent.get_span_context()
    assert span.context is not None
    assert span.context.trace_id != wanted.trace_id
    assert [link.context.span_id for link in span.links] == [wanted.span_id]


def _inventory(generation: int) -> inventory_pb2.Inventory:
    return inventory_pb2.Inventory(
        driver=DRIVER,
        node=NODE,
        pool=NODE,
        backend="sim",
        generation=generation,
        devices=[inventory_pb2.Device(name="gpu-0", kind="gpu")],
    )


async def test_the_health_inventory_watcher_continues_the_writers_trace(
    bus: Bus, spans: InMemorySpanExporter
):
    key = bus.names.inventory_key(DRIVER, NODE)
    seen: list[object] = []
    with writer.start_as_current_span("test.put_before") as before:
        await bus.kv_put(bus.names.inventory_bucket, key, codec.encode(_inventory(1)))
    async with running(inventory_watcher(bus, driver=DRIVER, node=NODE, sink=seen.append)):
        await until(lambda: len(seen) == 1, what="the replayed inventory")
        with writer.start_as_current_span("test.put_live") as live:
            await bus.kv_put(bus.names.inventory_bucket, key, codec.encode(_inventory(2)))
        await until(lambda: len(seen) == 2, what="the live inventory")
    replayed, changed = reader_spans(spans, "health.inventory_update")[-2:]
    assert_linked(replayed, before)
    assert_child(changed, live)
    assert changed.attributes == {"node": NODE}


async def test_the_prepared_claims_watcher_continues_the_writers_trace(
    bus: Bus, spans: InMemorySpanExporter
):
    claims = PreparedClaims()
    changes: list[None] = []
    uid = "uid-live"
    claim = claim_pb2.PreparedClaim(driver=DRIVER, node=NODE, claim_uid=uid, name="c")
    watcher = claim_watcher(
        bus, claims=claims, driver=DRIVER, node=NODE, changed=lambda: changes.append(None)
    )
    async with running(watcher):
        await until(lambda: claims.synced, what="the first replay")
        with writer.start_as_current_span("test.put_claim") as live:
            await bus.kv_put(
                bus.names.claims_bucket, bus.names.claim_key(DRIVER, NODE, uid), codec.encode(claim)
            )
        await until(lambda: len(claims.claims()) == 1, what="the live claim")
    (span,) = [
        s
        for s in reader_spans(spans, "health.claim_update")
        if dict(s.attributes or {}).get("claim_uid") == uid
    ]
    assert_child(span, live)
    assert span.attributes == {"claim_uid": uid, "node": NODE}


async def test_the_discovery_taint_watcher_continues_the_writers_trace(
    bus: Bus, spans: InMemorySpanExporter
):
    view = discovery_taints.DeviceTaints(driver=DRIVER, node=NODE)
    record = health_pb2.DeviceHealth(
        driver=DRIVER,
        node=NODE,
        device="gpu-7",
        taints=[health_pb2.DeviceTaint(key="sim.dra-suite.io/unhealthy", effect="NoSchedule")],
    )
    async with running(discovery_taints.follow(bus, view)):
        await until(lambda: view.listed, what="the first listing")
        with writer.start_as_current_span("test.put_record") as live:
            key = bus.names.health_key(DRIVER, NODE, "gpu-7")
            await bus.kv_put(bus.names.health_bucket, key, codec.encode(record))
        await until(lambda: "gpu-7" in view.current(), what="the device's taint")
    (span,) = [
        s
        for s in reader_spans(spans, "discovery.health_update")
        if dict(s.attributes or {}).get("device") == "gpu-7"
    ]
    assert_child(span, live)
    assert span.attributes == {"device": "gpu-7", "node": NODE}


async def test_dractl_alerts_continue_the_health_agents_trace(
    bus: Bus, spans: InMemorySpanExporter
):
    await bus.ensure_stream(
        name=bus.names.alerts_stream,
        subjects=[bus.names.alerts_wildcard],
        max_age_s=3600,
        duplicate_window_s=60,
    )
    subject = bus.names.alerts(DRIVER, NODE)

    def alert(alert_id: str) -> bytes:
        status = alert_pb2.ALERT_STATUS_RAISED
        return codec.encode_json(
            alert_pb2.Alert(id=alert_id, driver=DRIVER, node=NODE, device="gpu-1", status=status)
        )

    with writer.start_as_current_span("test.publish_listed") as listed:
        await bus.publish_js(subject, alert("listed"))
    seen: list[str] = []

    async def follow() -> None:
        async for item in queries.alerts(bus, follow=True, last=1):
            seen.append(item.id)

    async with running(follow()):
        await until(lambda: seen == ["listed"], what="the listed alert")
        with writer.start_as_current_span("test.publish_live") as live:
            await bus.publish_js(subject, alert("live"))
        await until(lambda: seen == ["listed", "live"], what="the live alert")
    by_id = {
        dict(s.attributes or {}).get("alert_id"): s
        for s in reader_spans(spans, "dractl.alert_read")
    }
    assert_linked(by_id["listed"], listed)
    assert_child(by_id["live"], live)
    assert by_id["live"].attributes == {
        "subject": subject,
        "alert_id": "live",
        "node": NODE,
        "device": "gpu-1",
    }
