"""Malformed NATS messages where the discovery agent and dractl read: the inventory key the
discovery agent reads back at start (and after reconnects), and the alert stream and health
records dractl lists.

The discovery agent must start over any value left in its key and publish a good inventory,
generations counted afresh; dractl must skip a bad alert or record (saying so) and go on.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
from typing import Any

import pytest

from devcluster.apiserver import APIServerEmulator
from services.discovery.agent import DiscoveryAgent
from services.discovery.config import DiscoveryConfig
from services.dractl import queries
from shared.bus import codec, streams
from shared.bus.connection import Bus
from shared.config import KubeSettings, NATSSettings
from shared.errors import MalformedMessageError
from shared.pb.drasuite.v1 import alert_pb2, health_pb2, inventory_pb2
from shared.vendors.sim import discovery as sim
from tests.integration.discovery.agent_runner import running
from tests.integration.fuzz.fuzzing import Logs, until

pytestmark = pytest.mark.integration

DRIVER, NODE = "sim.dra-suite.io", "n1"
OVERSIZED = 1_000_000  # below NATS's default max_payload (1 MiB), with room for headers
# The largest alert the alert stream takes (its max_msg_size, less room for headers).
OVERSIZED_ALERT = streams.alerts_stream("A", ["a"], replicas=1)["max_msg_size"] - 512
NOISE = b"\xff\xfe\x00garbage" + bytes(range(256))  # 0xff: field 31, wire type 7: never valid


def _inventory(**fields: Any) -> inventory_pb2.Inventory:
    values: dict[str, Any] = {"driver": DRIVER, "node": NODE, "pool": NODE, "backend": "sim"}
    return inventory_pb2.Inventory(**{**values, **fields})


LEFT_IN_THE_KEY = [
    ("random bytes", NOISE),
    ("empty", b""),
    (
        "health record",
        codec.encode(
            health_pb2.DeviceHealth(driver=DRIVER, node=NODE, state=health_pb2.HEALTH_STATE_HEALTHY)
        ),
    ),
    ("other node", codec.encode(_inventory(node="n2", generation=7))),
    ("last generation", codec.encode(_inventory(generation=2**64 - 1))),
    ("oversized", b"\xff" + os.urandom(OVERSIZED)),
]


async def test_discovery_starts_over_anything_left_in_its_inventory_key(
    nats_settings: NATSSettings,
    kube_settings: KubeSettings,
    kube: APIServerEmulator,
    bus: Bus,
    logs: Logs,
):
    kube.create_object({"apiVersion": "v1", "kind": "Node", "metadata": {"name": NODE}})
    config = DiscoveryConfig(node_name=NODE, nats=nats_settings, kube=kube_settings)
    key = bus.names.inventory_key(DRIVER, NODE)
    for label, data in LEFT_IN_THE_KEY:
        await bus.kv_put(bus.names.inventory_bucket, key, data)
        mark = logs.mark()
        agent = DiscoveryAgent(config, backend=sim.SimBackend.from_profile("mixed"))
        async with running(agent):
            await logs.next(mark, "inventory_published")
            if data:  # nats-py reads an empty value back as no value: nothing to report
                assert logs.since(mark, "inventory_unreadable"), label
            stored = await bus.kv_get(bus.names.inventory_bucket, key)
            assert stored is not None
            inventory = codec.decode(inventory_pb2.Inventory, stored, subject=key)
            assert (inventory.driver, inventory.node, inventory.generation) == (DRIVER, NODE, 1)
            assert inventory.devices, label


# --- dractl ---------------------------------------------------------------------------------


def _alert(alert_id: str) -> bytes:
    return codec.encode_json(
        alert_pb2.Alert(id=alert_id, driver=DRIVER, node=NODE, status=alert_pb2.ALERT_STATUS_RAISED)
    )


NOT_ALERTS = [
    NOISE,
    b"",
    b"[]",
    b'"an alert"',
    b"[" * 5000,
    codec.encode(alert_pb2.Alert(id="binary", driver=DRIVER)),
    b'{"raisedUnixMs": "yesterday"}',
    b"{" + os.urandom(OVERSIZED_ALERT),
]


@pytest.fixture
async def alert_stream(bus: Bus) -> str:
    await bus.ensure_stream(
        name=bus.names.alerts_stream,
        subjects=[bus.names.alerts_wildcard],
        max_age_s=3600,
        duplicate_window_s=60,
    )
    return bus.names.alerts(DRIVER, NODE)


async def test_alerts_skip_what_is_not_an_alert(bus: Bus, alert_stream: str):
    await bus.publish_js(alert_stream, _alert("a-1"))
    for data in NOT_ALERTS:
        await bus.publish_js(alert_stream, data)
    await bus.publish_js(alert_stream, _alert("a-2"))
    skipped: list[MalformedMessageError] = []
    listed = [
        alert.id
        async for alert in queries.alerts(bus, follow=False, last=50, skipped=skipped.append)
    ]
    assert listed == ["a-1", "a-2"]
    assert len(skipped) == len(NOT_ALERTS)
    assert all(alert_stream in str(exc) for exc in skipped)


async def test_alerts_follow_goes_on_after_what_is_not_an_alert(bus: Bus, alert_stream: str):
    await bus.publish_js(alert_stream, _alert("a-0"))
    seen: list[str] = []
    skipped: list[MalformedMessageError] = []

    async def follow() -> None:
        async for alert in queries.alerts(bus, follow=True, last=1, skipped=skipped.append):
            seen.append(alert.id)

    follower = asyncio.create_task(follow())
    try:
        await until(lambda: seen == ["a-0"], what="the follower started")
        for data in NOT_ALERTS:
            await bus.publish_js(alert_stream, data)
        await bus.publish_js(alert_stream, _alert("a-1"))
        await until(lambda: seen == ["a-0", "a-1"], what="the alert after the garbage")
        assert len(skipped) == len(NOT_ALERTS)
        assert not follower.done()
    finally:
        follower.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await follower


async def test_health_lists_the_records_that_decode(bus: Bus):
    bucket = bus.names.health_bucket
    good = health_pb2.DeviceHealth(
        driver=DRIVER, node=NODE, pool=NODE, device="gpu-0", state=health_pb2.HEALTH_STATE_HEALTHY
    )
    values = {
        "gpu-0": codec.encode(good),
        "gpu-1": NOISE,
        "gpu-2": codec.encode(_inventory(devices=[{"name": "gpu-2"}])),
    }
    for device, data in values.items():
        await bus.kv_put(bucket, bus.names.health_key(DRIVER, NODE, device), data)
    skipped: list[MalformedMessageError] = []
    records = await queries.health(bus, driver=DRIVER, node=NODE, skipped=skipped.append)
    assert records == [good]
    assert sorted(exc.subject for exc in skipped) == [
        bus.names.health_key(DRIVER, NODE, "gpu-1"),
        bus.names.health_key(DRIVER, NODE, "gpu-2"),
    ]


async def test_inventory_that_does_not_decode_is_a_clear_error(bus: Bus):
    key = bus.names.inventory_key(DRIVER, NODE)
    await bus.kv_put(bus.names.inventory_bucket, key, codec.encode(health_pb2.DeviceHealth()))
    await bus.kv_put(bus.names.inventory_bucket, key, NOISE)
    with pytest.raises(MalformedMessageError, match=r"not a drasuite\.v1\.Inventory"):
        await queries.inventory(bus, driver=DRIVER, node=NODE)
