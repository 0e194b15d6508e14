"""The Bus against a real nats-server: idempotent resources, KV watch, reconnect."""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
from collections.abc import AsyncIterator, Callable
from pathlib import Path

import pytest
import structlog
from opentelemetry import trace
from opentelemetry.sdk.trace import TracerProvider

from devcluster.natscluster import NATSCluster
from devcluster.natsserver import NATSServerProcess
from shared import telemetry
from shared.bus import kv
from shared.bus.connection import Bus
from shared.config import NATSSettings
from shared.errors import BusUnavailableError

pytestmark = pytest.mark.integration


async def test_kv_bucket_creation_is_idempotent_across_connections(bus: Bus, nats_settings):
    other = Bus(nats_settings, name="other")
    runner = asyncio.create_task(other.run())
    await asyncio.wait_for(other.connected.wait(), 5)
    try:
        await bus.kv_put(bus.names.inventory_bucket, "a", b"1")
        assert await other.kv_get(other.names.inventory_bucket, "a") == b"1"
    finally:
        await other.close()
        runner.cancel()


async def test_stream_creation_is_idempotent(bus: Bus):
    for _ in range(2):
        await bus.ensure_stream(
            name=bus.names.alerts_stream,
            subjects=[bus.names.alerts_wildcard],
            max_age_s=3600,
            duplicate_window_s=120,
        )
    first = await bus.publish_js(bus.names.alerts("d.io", "n1"), b"x", msg_id="same")
    second = await bus.publish_js(bus.names.alerts("d.io", "n1"), b"x", msg_id="same")
    assert first == second  # deduplicated by message ID


async def test_kv_watch_replays_current_values_then_changes(bus: Bus):
    bucket = bus.names.health_bucket
    await bus.kv_put(bucket, "drv.node.dev-0", b"old")
    seen: list[kv.KVChange] = []

    async def consume() -> None:
        async for change in kv.watch(bus, bucket=bucket, keys="drv.node.*"):
            seen.append(change)
            if change.value == b"new":
                return

    task = asyncio.create_task(consume())
    await asyncio.sleep(0.2)
    await bus.kv_put(bucket, "drv.node.dev-0", b"new")
    await asyncio.wait_for(task, 5)
    assert [c.value for c in seen if not c.synced] == [b"old", b"new"]
    assert any(c.synced for c in seen)


async def _listing(bus: Bus, bucket: str, keys: str) -> list[kv.KVChange]:
    """Changes up to and including the first synced marker."""
    seen: list[kv.KVChange] = []
    async for change in kv.watch(bus, bucket=bucket, keys=keys):
        seen.append(change)
        if change.synced:
            return seen
    raise AssertionError("the watch ended")


async def test_the_synced_marker_comes_after_every_current_value(bus: Bus):
    """nats-py may mark the replay done before any of it has arrived (its consumer had sent
    everything, none of it read yet); a listing that stops at the marker must still be whole.
    One try in a few hundred hit that race before `watch` checked the marker."""
    bucket = bus.names.health_bucket
    for i in range(5):
        await bus.kv_put(bucket, f"drv.node.dev-{i}", b"x")
    await bus.kv_delete(bucket, "drv.node.dev-4")
    for _ in range(300):
        listing = await asyncio.wait_for(_listing(bus, bucket, "drv.node.*"), 5)
        assert [c.synced for c in listing] == [False] * 5 + [True]
        assert [c.value for c in listing[:5]] == [b"x"] * 4 + [None]


async def test_an_empty_listing_is_synced_at_once(bus: Bus):
    listing = await asyncio.wait_for(_listing(bus, bus.names.health_bucket, "nobody.*"), 5)
    assert [c.synced for c in listing] == [True]


async def test_operations_raise_bus_unavailable_before_connecting():
    bus = Bus(NATSSettings(url="nats://127.0.0.1:1"), name="never")
    with pytest.raises(BusUnavailableError):
        await bus.kv_get("b", "k")


async def test_bus_reconnects_and_watch_resumes_after_server_restart(
    nats_server_factory: Callable[[], NATSServerProcess],
):
    server = nats_server_factory()
    bus = Bus(NATSSettings(url=server.url, namespace="r"), name="restart")
    runner = asyncio.create_task(bus.run())
    await asyncio.wait_for(bus.connected.wait(), 5)
    values: list[bytes | None] = []

    async def consume() -> None:
        async for change in kv.watch(bus, bucket=bus.names.health_bucket, keys=">"):
            if not change.synced:
                values.append(change.value)
            if change.value == b"after":
                return

    try:
        await bus.kv_put(bus.names.health_bucket, "k", b"before")
        task = asyncio.create_task(consume())
        await asyncio.sleep(0.2)
        server.stop()
        await asyncio.sleep(0.5)
        server.start()
        await asyncio.wait_for(bus.connected.wait(), 10)
        await asyncio.sleep(0.2)
        await bus.kv_put(bus.names.health_bucket, "k", b"after")
        await asyncio.wait_for(task, 10)
        assert values[0] == b"before"
        assert values[-1] == b"after"
        assert bus.reconnects >= 1
    finally:
        await bus.close()
        runner.cancel()


async def test_request_carries_the_current_trace_context_in_its_headers(bus: Bus):
    tracer = TracerProvider().get_tracer("test")
    seen: list[str] = []

    async def answer(msg) -> None:
        context = trace.get_current_span(telemetry.extract(msg.headers)).get_span_context()
        seen.append(format(context.trace_id, "032x"))
        await msg.respond(b"ok")

    subject = bus.names.fault_control("d.io", "n1")
    await bus.subscribe(subject, answer)
    with tracer.start_as_current_span("caller") as span:
        await bus.request(subject, b"x", timeout_s=2)
        expected = format(span.get_span_context().trace_id, "032x")
    assert seen == [expected]


@contextlib.asynccontextmanager
async def _connected(settings: NATSSettings) -> AsyncIterator[Bus]:
    bus = Bus(settings, name="watch-recovery")
    runner = asyncio.create_task(bus.run())
    try:
        await asyncio.wait_for(bus.connected.wait(), 10)
        yield bus
    finally:
        await bus.close()
        runner.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await runner


async def _forward(bus: Bus, bucket: str, out: asyncio.Queue[kv.KVChange]) -> None:
    async for change in kv.watch(bus, bucket=bucket, keys=">"):
        out.put_nowait(change)


async def _until_replayed(changes: asyncio.Queue[kv.KVChange], value: bytes) -> list[kv.KVChange]:
    """Changes up to `value` and a synced marker, whichever comes last: a watch restarted
    before `value` was put replays, marks the replay done, then delivers `value`; one
    restarted after replays `value`, then marks the replay done."""
    seen: list[kv.KVChange] = []
    while not (any(c.value == value for c in seen) and any(c.synced for c in seen)):
        seen.append(await changes.get())
    return seen


async def _until_synced(changes: asyncio.Queue[kv.KVChange]) -> list[kv.KVChange]:
    seen = [await changes.get()]
    while not seen[-1].synced:
        seen.append(await changes.get())
    return seen


async def _cancel(task: asyncio.Task[None]) -> None:
    task.cancel()
    with contextlib.suppress(asyncio.CancelledError):
        await task


async def test_kv_watch_restarts_when_its_consumer_is_deleted(nats_settings: NATSSettings):
    """No reconnect tells the watch: only the heartbeats that stop coming."""
    settings = dataclasses.replace(nats_settings, watch_heartbeat_s=0.2)
    async with _connected(settings) as bus:
        bucket = bus.names.health_bucket
        stream = bus.names.kv_stream(bucket)
        await bus.kv_put(bucket, "k", b"old")
        changes: asyncio.Queue[kv.KVChange] = asyncio.Queue()
        with structlog.testing.capture_logs() as events:
            task = asyncio.create_task(_forward(bus, bucket, changes))
            try:
                listing = await asyncio.wait_for(_until_synced(changes), 5)
                assert [c.value for c in listing] == [b"old", None]
                (consumer,) = await bus.js.consumers_info(stream)
                # Heartbeats alone keep a quiet watch as it is: no restart, no replay.
                await asyncio.sleep(1.5)
                assert changes.empty()
                await bus.js.delete_consumer(stream, consumer.name)
                await bus.kv_put(bucket, "k", b"new")
                seen = await asyncio.wait_for(_until_replayed(changes, b"new"), 5)
            finally:
                await _cancel(task)
        assert [c.value for c in seen if not c.synced][-1] == b"new"
        (current,) = await bus.js.consumers_info(stream)
        assert current.name != consumer.name
    (stalled,) = [e for e in events if e["event"] == "kv_watch_stalled"]
    assert stalled["bucket"] == bucket
    assert stalled["waited_s"] >= 0.6


async def _watch_hosted_elsewhere(
    bus: Bus, cluster: NATSCluster, bucket: str, changes: asyncio.Queue[kv.KVChange]
) -> tuple[asyncio.Task[None], int]:
    """A synced watch whose consumer's server is not the one this client is connected to,
    and that server's index."""
    stream = bus.names.kv_stream(bucket)
    for _ in range(20):
        before = {c.name for c in await bus.js.consumers_info(stream)}
        task = asyncio.create_task(_forward(bus, bucket, changes))
        await asyncio.wait_for(_until_synced(changes), 10)
        (consumer,) = [c for c in await bus.js.consumers_info(stream) if c.name not in before]
        assert consumer.cluster is not None
        assert consumer.cluster.leader is not None
        host = int(consumer.cluster.leader.removeprefix("n"))
        connected = bus.nc.connected_url
        assert connected is not None
        if connected.port != cluster.servers[host].port:
            return task, host
        await _cancel(task)
    raise AssertionError("every watch's consumer was on the server this client uses")


async def _put_while_electing(bus: Bus, bucket: str, key: str, value: bytes) -> None:
    """A put, tried again while the bucket's stream has no leader (it may have been on the
    killed server)."""
    for _ in range(100):
        try:
            await bus.kv_put(bucket, key, value)
        except BusUnavailableError:
            await asyncio.sleep(0.2)
        else:
            return
    raise AssertionError(f"no put of {bucket}/{key} went through")


@pytest.mark.slow
@pytest.mark.timeout(120)
async def test_kv_watch_restarts_when_the_server_of_its_consumer_dies(short_tmp: Path):
    """On a 3-server cluster the watch's R1 consumer lives on one server; killed while this
    client is connected to another, the consumer is gone and the connection is not."""
    cluster = NATSCluster(short_tmp / "nats", size=3)
    await asyncio.to_thread(cluster.start)
    try:
        settings = NATSSettings(url=cluster.url, replicas=3, watch_heartbeat_s=0.3)
        async with _connected(settings) as bus:
            bucket = bus.names.health_bucket
            await bus.kv_put(bucket, "k", b"old")
            changes: asyncio.Queue[kv.KVChange] = asyncio.Queue()
            task, host = await _watch_hosted_elsewhere(bus, cluster, bucket, changes)
            try:
                reconnects = bus.reconnects
                await asyncio.to_thread(cluster.kill, host)
                await _put_while_electing(bus, bucket, "k", b"new")
                # The synced marker: a restarted watch, not the old consumer.
                seen = await asyncio.wait_for(_until_replayed(changes, b"new"), 30)
            finally:
                await _cancel(task)
            assert bus.reconnects == reconnects  # the connection stayed up throughout
            assert [c.value for c in seen if not c.synced][-1] == b"new"
    finally:
        await asyncio.to_thread(cluster.stop)
