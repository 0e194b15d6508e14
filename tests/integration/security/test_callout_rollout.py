"""Rolling from today's open bus to the callout-secured one on the same JetStream store.

Agents work on an open nats-server (inventory, health records, an alert); the server stops,
`dra-nats-auth migrate-store` hands the global account's data to account DRA, the server comes
back with auth callout, and the agents come back with their tokens: everything written before
is still there, read by an operator and by the agents' own node-scoped identities.
"""

from __future__ import annotations

from collections.abc import MutableMapping
from pathlib import Path
from typing import Any

import nats
import pytest

from devcluster.apiserver import APIServerEmulator
from devcluster.natsserver import NATSServerProcess
from services.discovery.agent import DiscoveryAgent
from services.discovery.config import DiscoveryConfig
from services.dractl import queries
from services.health.agent import HealthAgent
from services.health.config import HealthConfig
from services.natsauth import cli
from shared.bus.connection import Bus
from shared.bus.subjects import Names
from shared.config import KubeSettings, NATSSettings
from shared.pb.drasuite.v1 import health_pb2, inventory_pb2
from shared.supervisor import Agent
from tests.integration.security.callout_stack import (
    DRIVER,
    OPERATOR,
    callout_stack,
    connected,
    eventually_async,
)
from tests.integration.security.secure_nats import running_agents

pytestmark = pytest.mark.integration

NODE = "node-a"


def _agents(nats: dict[str, NATSSettings], kube: KubeSettings) -> tuple[Agent, Agent]:
    discovery = DiscoveryAgent(DiscoveryConfig(
        nats=nats["discovery"], kube=kube, node_name=NODE, driver_name=DRIVER, sim_profile="gpu",
    ))  # fmt: skip
    health = HealthAgent(HealthConfig(
        nats=nats["health"], kube=kube, node_name=NODE, driver_name=DRIVER, sim_profile="gpu",
        poll_interval_s=0.1, recovery_hold_s=0.0, flap_window_s=0.0,
    ))  # fmt: skip
    return discovery, health


Snapshot = tuple[inventory_pb2.Inventory, dict[str, health_pb2.DeviceHealth], set[str]]


async def _buckets_as_an_older_release_made_them(url: str) -> None:
    """Without `allow_direct`: agents of this release turn it on while the bus is open."""
    nc = await nats.connect(url)
    try:
        for bucket in (Names("").inventory_bucket, Names("").health_bucket):
            await nc.jetstream().create_key_value(bucket=bucket, history=1)
    finally:
        await nc.close()


async def _snapshot(admin: Bus) -> Snapshot:
    inventory = await queries.inventory(admin, driver=DRIVER, node=NODE)
    health = await queries.health(admin, driver=DRIVER, node=NODE)
    alerts = [alert async for alert in queries.alerts(admin, follow=False, last=100)]
    return inventory, {record.device: record for record in health}, {a.id for a in alerts}


async def test_agents_roll_onto_the_secured_bus_and_nothing_is_lost(
    kube: APIServerEmulator,
    kube_settings: KubeSettings,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    bus_events: list[MutableMapping[str, Any]],
):
    store = tmp_path / "nats-store"
    open_bus = NATSServerProcess(store)
    open_bus.start()
    try:
        plain = NATSSettings(url=open_bus.url)
        await _buckets_as_an_older_release_made_them(open_bus.url)
        agents = _agents({"discovery": plain, "health": plain}, kube_settings)
        async with running_agents(*agents), connected(plain) as admin:
            await eventually_async(lambda: queries.inventory(admin, driver=DRIVER, node=NODE))
            command = health_pb2.FaultCommand(device="gpu-1", cause="xid", code="79")
            # The health agent may see the inventory a moment after dractl does.
            await eventually_async(
                lambda: queries.inject_fault(admin, driver=DRIVER, node=NODE, command=command)
            )
            before = await eventually_async(lambda: _with_alert(admin))
    finally:
        open_bus.stop()

    cli.main(["migrate-store", "--store-dir", str(store), "--target-account", "DRA"])
    assert "moved" in capsys.readouterr().out

    async with callout_stack(kube, tmp_path / "secured", store_dir=store) as stack:
        operator = stack.settings(await stack.token(OPERATOR))
        async with connected(operator, component="operator") as admin:
            # Read before any agent is back: what the open bus held is all there.
            inventory, health, alert_ids = await _snapshot(admin)
            assert inventory == before[0]
            assert health.keys() == before[1].keys()
            assert alert_ids == before[2]
        discovery = await stack.agent_settings("dra-discovery", NODE)
        async with connected(discovery, component="discovery", node=NODE) as own:
            # Direct get of its own key: the buckets got allow_direct on the open bus.
            key = own.names.inventory_key(DRIVER, NODE)
            assert await own.kv_get(own.names.inventory_bucket, key)
        assert {e["bucket"] for e in bus_events if e.get("event") == "kv_direct_get_enabled"} >= {
            "dra_inventory",
            "dra_health",
        }
        nats = {
            "discovery": await stack.agent_settings("dra-discovery", NODE),
            "health": await stack.agent_settings("dra-health", NODE),
        }
        async with (
            running_agents(*_agents(nats, kube_settings)),
            connected(operator, component="operator") as admin,
        ):
            # The agents came back under their node-scoped identities and carry on from the
            # same keys and the same alert stream.
            after = await eventually_async(lambda: _snapshot(admin))
            assert after[0].devices == before[0].devices
            assert after[1].keys() == before[1].keys()
            assert after[2] >= before[2]


async def _with_alert(admin: Bus) -> Snapshot | None:
    snapshot = await _snapshot(admin)
    return snapshot if snapshot[2] and "gpu-1" in snapshot[1] else None
