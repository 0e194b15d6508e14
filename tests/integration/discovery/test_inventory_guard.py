"""The discovery agent guards its own inventory key on a real nats-server: a forged, damaged or
deleted value is replaced by the last published inventory (under a generation above the forged
one, so consumers that adopted it move on), logged with `security=true` and counted."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator

import nats
import pytest
import structlog

from devcluster.apiserver import APIServerEmulator
from services.discovery.agent import DiscoveryAgent
from services.discovery.config import DiscoveryConfig
from shared import metrics
from shared.bus import codec
from shared.bus.connection import Bus
from shared.config import KubeSettings, NATSSettings
from shared.errors import MalformedMessageError
from shared.pb.drasuite.v1 import inventory_pb2
from shared.vendors.sim import discovery as sim
from tests.integration.discovery.agent_runner import running

pytestmark = pytest.mark.integration

NODE = "n1"
DRIVER = "sim.dra-suite.io"


@pytest.fixture
async def agent(
    nats_settings: NATSSettings, kube_settings: KubeSettings, kube: APIServerEmulator
) -> AsyncIterator[DiscoveryAgent]:
    kube.create_object({"apiVersion": "v1", "kind": "Node", "metadata": {"name": NODE}})
    config = DiscoveryConfig(node_name=NODE, nats=nats_settings, kube=kube_settings)
    backend = sim.SimBackend.from_profile("ascend-910b")
    async with running(DiscoveryAgent(config, backend=backend)) as started:
        yield started


async def _stored(bus: Bus) -> inventory_pb2.Inventory | None:
    key = bus.names.inventory_key(DRIVER, NODE)
    data = await bus.kv_get(bus.names.inventory_bucket, key)
    try:
        return None if data is None else codec.decode(inventory_pb2.Inventory, data, subject=key)
    except MalformedMessageError:  # the damaged value, before it is put back
        return None


async def _until_generation(bus: Bus, generation: int) -> inventory_pb2.Inventory:
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        found = await _stored(bus)
        if found is not None and found.generation == generation:
            return found
        await asyncio.sleep(0.05)
    raise AssertionError(f"no inventory of generation {generation} within 10s")


def _reasserted(reason: str) -> float:
    metrics.configure(service="test")
    line = f'dra_inventory_reasserted_total{{reason="{reason}"}} '
    for text in metrics.render().decode().splitlines():
        if text.startswith(line):
            return float(text.removeprefix(line))
    return 0.0


def _forged(published: inventory_pb2.Inventory) -> bytes:
    forged = inventory_pb2.Inventory()
    forged.CopyFrom(published)
    forged.devices[0].device_nodes[0].host_path = "/dev/sda"
    forged.devices[0].env["LD_PRELOAD"] = "/host/evil.so"
    forged.generation = published.generation + 5
    return codec.encode(forged)


async def test_a_forged_damaged_or_deleted_inventory_is_put_back(
    agent: DiscoveryAgent, bus: Bus, nats_settings: NATSSettings
):
    published = await _until_generation(bus, 1)
    before = {r: _reasserted(r) for r in ("differs", "unreadable", "deleted")}
    attacker = await nats.connect(nats_settings.url)
    store = await attacker.jetstream().key_value(bus.names.inventory_bucket)
    key = bus.names.inventory_key(DRIVER, NODE)
    try:
        with structlog.testing.capture_logs() as events:
            await store.put(key, _forged(published))
            restored = await _until_generation(bus, published.generation + 6)
            await store.put(key, b"\xff\xfe not an inventory")
            await _until_generation(bus, published.generation + 7)
            await store.delete(key)
            last = await _until_generation(bus, published.generation + 8)
    finally:
        await attacker.drain()
    for found in (restored, last):
        expected = inventory_pb2.Inventory()
        expected.CopyFrom(published)
        expected.generation = found.generation
        assert found == expected
    reasserted = [e for e in events if e["event"] == "inventory_reasserted"]
    assert [(e["reason"], e["security"]) for e in reasserted] == [
        ("differs", True),
        ("unreadable", True),
        ("deleted", True),
    ]
    after = {r: _reasserted(r) for r in before}
    assert {r: after[r] - before[r] for r in before} == {
        "differs": 1.0,
        "unreadable": 1.0,
        "deleted": 1.0,
    }


async def test_its_own_publications_are_not_taken_for_forgeries(agent: DiscoveryAgent, bus: Bus):
    await _until_generation(bus, 1)
    with structlog.testing.capture_logs() as events:
        await asyncio.sleep(0.5)
    assert [e for e in events if e["event"] == "inventory_reasserted"] == []
    stored = await _stored(bus)
    assert stored is not None
    assert stored.generation == 1
