"""The buckets as provisioned, on a real nats-server: every field as the server reports it,
tampered ones brought back or refused, and the claims bucket bounded over many claims."""

from __future__ import annotations

import asyncio
import json
import time
from typing import Any

import pytest
from nats.aio.client import Client as NATSClient

from shared.bus import convergence, drift, streams
from shared.bus.connection import Bus
from shared.bus.streams import StreamTamperedError

pytestmark = pytest.mark.integration


async def _api(nc: NATSClient, subject: str, body: dict[str, Any] | None = None) -> Any:
    reply = await nc.request(subject, json.dumps(body).encode() if body else b"", timeout=5)
    return json.loads(reply.data)


async def test_every_stream_as_the_server_reports_it_is_the_provisioned_one(bus: Bus) -> None:
    for wanted in streams.all_streams(bus.names, replicas=1):
        await convergence.ensure(bus.nc, wanted, timeout_s=5, reported=set())
        reported = await convergence.stream_config(bus.nc, str(wanted["name"]), timeout_s=5)
        assert reported is not None
        assert not drift.drift(reported, wanted), wanted["name"]


async def test_a_bucket_reshaped_before_the_agent_is_brought_back_on_the_open_bus(bus: Bus):
    bucket = bus.names.inventory_bucket
    wanted = streams.kv_stream(bucket, replicas=1)
    transform = {"src": f"$KV.{bucket}.drv.node-a", "dest": f"$KV.{bucket}.drv.node-b"}
    await _api(bus.nc, f"$JS.API.STREAM.CREATE.{wanted['name']}",
               {**wanted, "subject_transform": transform, "allow_rollup_hdrs": True})  # fmt: skip
    await bus.kv_put(bucket, "drv.node-a", b"mine")
    assert await bus.kv_get(bucket, "drv.node-a") == b"mine"
    assert await bus.kv_get(bucket, "drv.node-b") is None
    reported = await convergence.stream_config(bus.nc, str(wanted["name"]), timeout_s=5)
    assert reported is not None
    assert "subject_transform" not in reported
    assert reported["allow_rollup_hdrs"] is False


async def test_a_bucket_nats_cannot_bring_back_is_refused(bus: Bus) -> None:
    bucket = bus.names.claims_bucket
    origin = f"{bus.names.namespace}_ORIGIN"
    await _api(bus.nc, f"$JS.API.STREAM.CREATE.{origin}",
               {"name": origin, "subjects": [f"{bus.names.namespace}.origin.>"]})  # fmt: skip
    stream = bus.names.kv_stream(bucket)
    await _api(bus.nc, f"$JS.API.STREAM.CREATE.{stream}",
               {"name": stream, "mirror": {"name": origin}})  # fmt: skip
    with pytest.raises(StreamTamperedError, match="mirror"):
        await bus.kv(bucket)


async def test_a_rollup_on_ones_own_key_is_refused_and_purges_nothing(bus: Bus) -> None:
    bucket = bus.names.health_bucket
    await bus.kv_put(bucket, "drv.node-b.gpu-0", b"healthy")
    with pytest.raises(Exception, match="rollup"):
        await bus.js.publish(
            bus.names.kv_subject(bucket, "drv.node-a.gpu-0"), b"", headers={"Nats-Rollup": "all"}
        )
    assert await bus.kv_get(bucket, "drv.node-b.gpu-0") == b"healthy"


async def test_the_claims_bucket_stays_bounded_over_many_prepare_unprepare_cycles(bus: Bus):
    """A key per prepared claim, deleted at unprepare: the delete markers expire."""
    bus.marker_ttl_s = 1
    bucket = bus.names.claims_bucket
    cycles = 500
    started = time.monotonic()
    for cycle in range(cycles):
        key = f"drv.node-a.claim-{cycle:05d}"
        await bus.kv_put(bucket, key, b"prepared claim " * 20)
        await bus.kv_delete(bucket, key)
    elapsed_s = time.monotonic() - started
    stream = bus.names.kv_stream(bucket)
    info = await bus.js.stream_info(stream)
    assert info.state.messages == cycles  # one delete marker per claim, for now
    for _ in range(50):  # the markers' TTL is 1 s
        await asyncio.sleep(0.2)
        info = await bus.js.stream_info(stream)
        if not info.state.messages:
            break
    assert (info.state.messages, info.state.bytes) == (0, 0)
    print(f"claims_cycles={cycles} cycle_ms={1000 * elapsed_s / cycles:.2f}")


async def test_a_full_bucket_still_takes_new_values_of_existing_keys(bus: Bus) -> None:
    """One node filling a bucket with keys of its own cannot push out or freeze another's."""
    bucket = f"{bus.names.namespace}_small"
    config = {**streams.kv_stream(bucket, replicas=1), "max_bytes": 4096, "max_msg_size": 512}
    await convergence.ensure(bus.nc, config, timeout_s=5, reported=set())
    kv = bus.js
    await kv.publish(bus.names.kv_subject(bucket, "drv.node-b.gpu-0"), b"b1")
    device = 0
    with pytest.raises(Exception, match="maximum"):  # noqa: PT012  # the first refused put
        while device < 100:
            await kv.publish(bus.names.kv_subject(bucket, f"drv.node-a.d{device}"), b"x" * 400)
            device += 1
    assert device > 0
    with pytest.raises(Exception, match="maximum"):
        await kv.publish(bus.names.kv_subject(bucket, "drv.node-a.big"), b"x" * 1024)
    await kv.publish(bus.names.kv_subject(bucket, "drv.node-b.gpu-0"), b"b2")
    last = await kv.get_last_msg(config["name"], bus.names.kv_subject(bucket, "drv.node-b.gpu-0"))
    assert last.data == b"b2"
