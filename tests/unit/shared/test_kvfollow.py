"""A node agent's watch (`kvfollow`: direct gets, then the stream's republished copies) against a
real nats-server, next to the consumer watch every other bus uses: the same input gives both
the same changes; what arrives on a followed subject counts only as the stream's copy."""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator, Callable, MutableMapping
from typing import Any

import pytest
import structlog

from shared.bus import kv, kvfollow
from shared.bus.connection import Bus
from shared.config import NATSSettings
from tests.buses import connected

pytestmark = pytest.mark.integration

KEYS = "drv.node.*"


@contextlib.asynccontextmanager
async def _watching(bus: Bus, keys: str = KEYS) -> AsyncIterator[list[kv.KVChange]]:
    seen: list[kv.KVChange] = []

    async def consume() -> None:
        async for change in kv.watch(bus, bucket=bus.names.health_bucket, keys=keys):
            seen.append(change)

    task = asyncio.create_task(consume())
    try:
        yield seen
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task


async def _eventually(condition: Callable[[], object], timeout_s: float = 5.0) -> None:
    deadline = time.monotonic() + timeout_s
    while True:
        if condition():
            return
        if time.monotonic() > deadline:
            raise AssertionError(f"condition not met within {timeout_s}s")
        await asyncio.sleep(0.02)


def _values(seen: list[kv.KVChange]) -> list[tuple[str, bytes | None, bool]]:
    return [(c.key, c.value, c.replayed) for c in seen if not c.synced]


async def test_a_node_agent_and_an_operator_see_the_same_changes(nats_settings: NATSSettings):
    async with (
        connected(nats_settings, component="health", node="node") as node_bus,
        connected(nats_settings) as operator_bus,
    ):
        bucket = node_bus.names.health_bucket
        await node_bus.kv_put(bucket, "drv.node.dev-0", b"a")
        await node_bus.kv_put(bucket, "drv.node.dev-1", b"b")
        await node_bus.kv_delete(bucket, "drv.node.dev-1")
        await node_bus.kv_put(bucket, "drv.other.dev-0", b"not ours")
        async with _watching(node_bus) as followed, _watching(operator_bus) as consumed:
            await _eventually(lambda: followed[-1:] and followed[-1].synced)
            await _eventually(lambda: consumed[-1:] and consumed[-1].synced)
            await node_bus.kv_put(bucket, "drv.node.dev-0", b"a2")
            await node_bus.kv_put(bucket, "drv.node.dev-2", b"c")
            await node_bus.kv_delete(bucket, "drv.node.dev-0")
            await _eventually(lambda: len(followed) == 6 and len(consumed) == 6)
            # The operator's watch holds a consumer; the node agent's none.
            stream = node_bus.names.kv_stream(bucket)
            assert (await operator_bus.js.stream_info(stream)).state.consumer_count == 1
        expected = [
            ("drv.node.dev-0", b"a", True),
            ("drv.node.dev-1", None, True),
            ("drv.node.dev-0", b"a2", False),
            ("drv.node.dev-2", b"c", False),
            ("drv.node.dev-0", None, False),
        ]
        assert _values(followed) == _values(consumed) == expected
        revisions = [c.revision for c in followed if not c.synced]
        assert revisions == [c.revision for c in consumed if not c.synced]


async def test_the_synced_marker_of_a_followed_pattern_comes_after_every_current_value(
    nats_settings: NATSSettings,
):
    async with connected(nats_settings, component="health", node="node") as bus:
        bucket = bus.names.health_bucket
        for i in range(5):
            await bus.kv_put(bucket, f"drv.node.dev-{i}", b"x")
        for _ in range(50):
            async with _watching(bus) as seen:
                await _eventually(lambda: seen[-1:] and seen[-1].synced)
                assert [c.synced for c in seen] == [False] * 5 + [True]
        async with _watching(bus, keys="drv.node.dev-3") as single:
            await _eventually(lambda: single[-1:] and single[-1].synced)
        assert _values(single) == [("drv.node.dev-3", b"x", True)]


async def test_only_the_streams_own_copy_of_a_followed_key_counts(nats_settings: NATSSettings):
    """On the open bus anyone may publish to a followed subject (the secured bus refuses it:
    `test_compromised_node`); the watch takes only the stream's copy, and only a newer one."""
    with structlog.testing.capture_logs() as events:
        await _forged_and_stale_copies(nats_settings, events)


async def _forged_and_stale_copies(
    nats_settings: NATSSettings, events: list[MutableMapping[str, Any]]
) -> None:
    async with connected(nats_settings, component="health", node="node") as bus:
        names, bucket = bus.names, bus.names.health_bucket
        stream, key = names.kv_stream(bucket), "drv.node.dev-0"
        revision = await _put(bus, key, b"genuine")
        async with _watching(bus) as seen:
            await _eventually(lambda: seen[-1:] and seen[-1].synced)
            followed = names.kv_followed(bucket, key)
            own = {"Nats-Stream": stream, "Nats-Subject": names.kv_subject(bucket, key),
                   "Nats-Sequence": str(revision + 100), "Nats-Last-Sequence": "0"}  # fmt: skip
            forged = [
                {},
                {**own, "Nats-Stream": "KV_elsewhere"},
                {**own, "Nats-Subject": names.kv_subject(bucket, "drv.node.dev-9")},
                {k: v for k, v in own.items() if k != "Nats-Last-Sequence"},
                {**own, "Nats-Sequence": "many"},
            ]
            for headers in forged:
                await bus.nc.publish(followed, b"forged", headers=headers)
            # Well formed, but not past the revision the watch holds: an old copy come late.
            stale = {**own, "Nats-Sequence": str(revision)}
            await bus.nc.publish(followed, b"stale", headers=stale)
            await bus.nc.flush()
            await _eventually(lambda: len(_dropped(events)) == len(forged))
            await _put(bus, key, b"genuine 2")
            await _eventually(lambda: _values(seen)[-1:] == [(key, b"genuine 2", False)])
        assert _values(seen) == [(key, b"genuine", True), (key, b"genuine 2", False)]


def _dropped(events: list[MutableMapping[str, Any]]) -> list[MutableMapping[str, Any]]:
    return [
        e for e in events if (e["event"], e.get("reason")) == ("kv_entry_dropped", "not_this_watch")
    ]


async def _put(bus: Bus, key: str, value: bytes) -> int:
    await bus.kv_put(bus.names.health_bucket, key, value)
    info = await bus.js.stream_info(bus.names.kv_stream(bus.names.health_bucket))
    return int(info.state.last_seq)


async def test_a_new_stream_leader_has_the_watch_read_its_keys_again(
    nats_settings: NATSSettings, monkeypatch: pytest.MonkeyPatch
):
    monkeypatch.setattr(kvfollow, "_REREAD_SPREAD_S", 0.1)
    async with connected(nats_settings, component="health", node="node") as bus:
        bucket, key = bus.names.health_bucket, "drv.node.dev-0"
        await bus.kv_put(bucket, key, b"v1")
        async with _watching(bus) as seen:
            await _eventually(lambda: seen[-1:] and seen[-1].synced)
            elected = bus.names.js_leader_elected(bus.names.kv_stream(bucket))
            await bus.nc.publish(
                elected, b'{"type":"io.nats.jetstream.advisory.v1.stream_leader_elected"}'
            )
            await _eventually(lambda: sum(c.synced for c in seen) == 2)
        assert _values(seen) == [(key, b"v1", True), (key, b"v1", True)]


async def test_a_followed_watch_reads_again_after_a_reconnect(nats_server_factory: Any):
    server = nats_server_factory()
    settings = NATSSettings(url=server.url, namespace="f")
    async with connected(settings, component="health", node="node") as bus:
        bucket, key = bus.names.health_bucket, "drv.node.dev-0"
        await bus.kv_put(bucket, key, b"before")
        async with _watching(bus) as seen:
            await _eventually(lambda: seen[-1:] and seen[-1].synced)
            server.stop()
            server.start()
            await _eventually(lambda: sum(c.synced for c in seen) == 2, timeout_s=20)
            await bus.kv_put(bucket, key, b"after")
            await _eventually(lambda: _values(seen)[-1:] == [(key, b"after", False)])
        assert _values(seen) == [
            (key, b"before", True),
            (key, b"before", True),
            (key, b"after", False),
        ]
