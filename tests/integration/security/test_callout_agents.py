"""The three real agents and dractl on the callout-secured bus: everything they legitimately do
still works, each under its own node-scoped identity, and an expiring token is replaced.

discovery publishes its inventory, health writes records, answers an operator's fault
injection and publishes the alert, allocation (a real process) receives its inventory over
its own watch, and dractl (operator) reads all of it back. The same with `--bus-signatures
enforce`: every record is signed by its writer's certified key and every reader checks it.
"""

from __future__ import annotations

import os
import sys
from collections.abc import MutableMapping
from pathlib import Path
from typing import Any

import pytest

from devcluster.apiserver import APIServerEmulator
from devcluster.processes import ChildProcess
from services.discovery.agent import DiscoveryAgent
from services.discovery.config import DiscoveryConfig
from services.dractl import queries
from services.health.agent import HealthAgent
from services.health.config import HealthConfig
from shared.bus.connection import Bus
from shared.config import KubeSettings
from shared.pb.drasuite.v1 import alert_pb2, health_pb2
from tests.integration.security.callout_stack import (
    DRIVER,
    OPERATOR,
    CalloutStack,
    callout_stack,
    connected,
    eventually_async,
)
from tests.integration.security.secure_nats import eventually, running_agents

pytestmark = pytest.mark.integration

NODE = "node-a"


def _allocation(
    base: Path, kube: KubeSettings, token_file: Path, url: str, stack: CalloutStack
) -> ChildProcess:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("NATS_", "BUS_"))}
    env |= {"NATS_URL": url, "NATS_TOKEN_FILE": str(token_file)}
    if stack.signatures != "off":
        env |= {"BUS_SIGNATURES": stack.signatures, "BUS_AUTH_KEY_FILE": stack.auth_key_file}
    argv = [
        sys.executable, "-m", "services.allocation",
        "--node-name", NODE, "--driver-name", DRIVER, "--kubeconfig", kube.kubeconfig,
        "--log-format", "json", "--plugin-registry-dir", str(base / "registry"),
        "--plugin-data-dir", str(base / "plugins" / DRIVER), "--cdi-root", str(base / "cdi"),
    ]  # fmt: skip
    return ChildProcess(
        name="allocation", argv=argv, log_path=base / "logs" / "allocation.log", env=env
    )


@pytest.mark.parametrize("signatures", ["off", "enforce"])
async def test_agents_and_the_operator_work_on_the_secured_bus(
    signatures: str,
    kube: APIServerEmulator,
    kube_settings: KubeSettings,
    tmp_path: Path,
    short_tmp: Path,
    bus_events: list[MutableMapping[str, Any]],
):
    async with callout_stack(kube, tmp_path / "stack", signatures=signatures) as stack:
        discovery = DiscoveryAgent(DiscoveryConfig(
            nats=await stack.agent_settings("dra-discovery", NODE), kube=kube_settings,
            node_name=NODE, driver_name=DRIVER, sim_profile="gpu",
        ))  # fmt: skip
        health = HealthAgent(HealthConfig(
            nats=await stack.agent_settings("dra-health", NODE), kube=kube_settings,
            node_name=NODE, driver_name=DRIVER, sim_profile="gpu", poll_interval_s=0.1,
            recovery_hold_s=0.0, flap_window_s=0.0,
        ))  # fmt: skip
        allocation_token = stack.token_file(await stack.token("dra-allocation", node=NODE))
        allocation = _allocation(
            short_tmp, kube_settings, allocation_token, stack.server.url, stack
        )
        operator = stack.settings(await stack.token(OPERATOR))
        async with (
            running_agents(discovery), running_agents(health),
            connected(operator, component="operator") as admin,
        ):  # fmt: skip
            inventory = await eventually_async(
                lambda: queries.inventory(admin, driver=DRIVER, node=NODE)
            )
            assert [device.name for device in inventory.devices][:1] == ["gpu-0"]
            records = await eventually_async(
                lambda: queries.health(admin, driver=DRIVER, node=NODE)
            )
            assert {record.device for record in records} >= {"gpu-0"}
            command = health_pb2.FaultCommand(device="gpu-0", cause="xid", code="79")
            answer = await queries.inject_fault(admin, driver=DRIVER, node=NODE, command=command)
            assert answer["ok"]
            drained = await queries.drain(admin, driver=DRIVER, node=NODE, device="gpu-2",
                                          drain=True, reason="maintenance")  # fmt: skip
            assert drained["ok"]
            alerts = await eventually_async(lambda: _alerts(admin))
            assert any(alert.device == "gpu-0" for alert in alerts)
            await allocation.start()
            try:
                copy = short_tmp / "plugins" / DRIVER / "inventory.pb"
                await eventually(copy.exists, timeout_s=30)
            finally:
                assert await allocation.stop() == 0
        log = allocation.log_path.read_text(errors="replace")
        assert "nats_auth_rejected" not in log
        assert "ermissions violation" not in log
        # Nothing any in-process agent or dractl did was refused by the server either.
        assert any(e.get("event") == "nats_connected" for e in bus_events)
        refused = [e for e in bus_events if "violation" in str(e.get("error", "")).lower()]
        assert not refused
        # With signatures, every record was signed and taken: nothing was dropped.
        assert not [e for e in bus_events if e.get("event") == "kv_entry_dropped"]
        assert "kv_entry_dropped" not in log
        if signatures != "off":  # allocation took the signed inventory (its copy on disk)
            certified = [e for e in bus_events if e.get("event") == "bus_writer_certified"]
            assert {e["role"] for e in certified} == {"discovery", "health"}


async def _alerts(admin: Bus) -> list[alert_pb2.Alert]:
    return [alert async for alert in queries.alerts(admin, follow=False, last=10)]


async def test_an_expired_token_drops_the_connection_and_the_rotated_one_reconnects(
    kube: APIServerEmulator, tmp_path: Path, bus_events: list[MutableMapping[str, Any]]
):
    async with callout_stack(kube, tmp_path) as stack:
        kube.cluster.tokens.min_expiration_s = 1
        settings = stack.settings(await stack.token("dra-health", node=NODE, expiration_s=2))
        async with connected(settings, component="health", node=NODE) as bus:
            # The kubelet rotates the projected token long before it expires.
            stack.rotate(settings.token_file, await stack.token("dra-health", node=NODE))
            await eventually(lambda: bus.reconnects >= 1 and bus.connected.is_set(), timeout_s=15)
            key = bus.names.health_key(DRIVER, NODE, "gpu-0")
            await bus.kv_put(bus.names.health_bucket, key, b"after rotation")
            assert await bus.kv_get(bus.names.health_bucket, key) == b"after rotation"
        # nats-server closed the connection at the token's expiry (nats-py then gives up on
        # it), the Bus connected again and dra-nats-auth admitted the rotated token.
        assert [e for e in bus_events if e.get("event") == "nats_connecting_again"]
        admitted = [
            e for e in bus_events
            if e.get("event") == "nats_client_authorized" and e["role"] == "health"
        ]  # fmt: skip
        assert len({e["expires_at"] for e in admitted}) == 2
