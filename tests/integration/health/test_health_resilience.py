"""The health agent across restarts, inventory changes, flapping devices and NATS outages.

The `health` harness comes from this folder's conftest.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from devcluster.natsserver import NATSServerProcess
from services.health.policy import Taint
from shared.config import NATSSettings
from shared.vendors.sim.monitor import SimMonitor

pytestmark = pytest.mark.integration

PROFILE = """\
apiVersion: sim.dra-suite.io/v1
kind: SimProfile
metadata: {name: faulty}
devices:
- {name: gpu-0, kind: gpu}
- {name: gpu-1, kind: gpu}
- {name: gpu-2, kind: gpu}
faults:
- {device: gpu-0, cause: xid, code: "79", message: GPU has fallen off the bus}
"""


async def test_profile_faults_hold_from_the_start_and_leaked_rules_are_removed(
    health, tmp_path: Path
):
    health.create_node()
    profile = tmp_path / "faulty.yaml"
    profile.write_text(PROFILE)
    taint = Taint(key=f"{health.DRIVER}/xid", value="79", effect="NoSchedule")
    kept = health.leave_rule(device="gpu-0", taint=taint)
    leaked = health.leave_rule(device="gpu-2", taint=taint)
    health.kube.request_log.clear()
    await health.put_inventory()
    async with health.running(health.config(sim_profile=str(profile))):
        found = await health.eventually(health.state_is("gpu-0", health.UNHEALTHY))
        assert found.message == "GPU has fallen off the bus"
        gone = health.now(lambda: health.kube.get_object("devicetaintrules", leaked) is None)
        await health.eventually(gone)
        assert health.kube.get_object("devicetaintrules", kept) is not None
        writes = health.kube.request_log.writes("devicetaintrules")
        assert [(w.verb, w.name) for w in writes] == [("delete", leaked)]


async def test_a_restart_resolves_the_fault_it_remembers_from_the_kv(health):
    health.create_node()
    await health.put_inventory()
    async with health.running():
        assert await health.command(health.fault("gpu-1", cause="xid", code="79")) == {"ok": True}
        before = await health.eventually(health.state_is("gpu-1", health.UNHEALTHY))
        await health.eventually(health.alerts_with("ALERT_STATUS_RAISED"))
    async with health.running():
        # The sim forgets injected faults: the device is healthy now, so the fault resolves.
        await health.eventually(health.state_is("gpu-1", health.HEALTHY))
        await health.eventually(health.now(lambda: not health.rules_for("gpu-1")))
        (resolved,) = await health.eventually(health.alerts_with("ALERT_STATUS_RESOLVED"))
        assert int(resolved["raisedUnixMs"]) == before.since_unix_ms
        assert len(await health.stream_alerts()) == 2


async def test_devices_that_leave_the_inventory_lose_their_records(health):
    health.create_node()
    await health.put_inventory()
    async with health.running():
        await health.eventually(health.state_is("gpu-2", health.HEALTHY))
        await health.put_inventory(health.DEVICES[:2])

        async def gone() -> bool:
            return await health.record("gpu-2") is None

        await health.eventually(gone)
        assert await health.record("gpu-1") is not None


async def test_flapping_within_the_recovery_hold_keeps_one_taint_and_one_alert(health):
    health.create_node()
    await health.put_inventory()
    async with health.running(health.config(recovery_hold_s=1.0)):
        for clear in (False, True, False, True):
            command = health.fault("gpu-0", cause="xid", code="79", clear=clear)
            assert await health.command(command) == {"ok": True}
            if not clear:
                await health.eventually(health.now(lambda: health.rules_for("gpu-0")))
        cleared = time.monotonic()
        await asyncio.sleep(0.5)
        assert health.rules_for("gpu-0"), "the taint went before the hold ended"
        await health.eventually(health.now(lambda: not health.rules_for("gpu-0")))
        assert time.monotonic() - cleared >= 1.0
        await health.eventually(health.alerts_with("ALERT_STATUS_RESOLVED"))
        statuses = [a["status"] for a in await health.stream_alerts()]
        assert statuses == ["ALERT_STATUS_RAISED", "ALERT_STATUS_RESOLVED"]
        writes = health.kube.request_log.writes("devicetaintrules")
        assert [w.verb for w in writes] == ["create", "delete"]


class FakeRequest:
    """A fault-control request that does not travel over NATS (NATS is down in the test)."""

    def __init__(self, data: bytes) -> None:
        self.data = data
        self.headers: dict[str, str] | None = None
        self.replies: list[dict[str, Any]] = []

    async def respond(self, data: bytes) -> None:
        self.replies.append(json.loads(data))


async def test_nats_outage_buffers_health_and_alerts_and_resyncs_when_back(
    health, nats_server_factory: Callable[[], NATSServerProcess]
):
    health.create_node()
    server = nats_server_factory()
    settings = NATSSettings(url=server.url, namespace="outage")
    async with health.connected(settings) as bus:
        await health.put_inventory(bus=bus)
        async with health.running(health.config(nats=settings)) as agent:
            await health.eventually(health.state_is("gpu-0", health.HEALTHY, bus=bus))
            server.stop()
            await health.eventually(health.now(lambda: not agent.bus.connected.is_set()))

            assert isinstance(agent.monitor, SimMonitor)
            request = FakeRequest(health.fault("gpu-0", cause="xid", code="79"))
            await agent.monitor.handle_command(request)
            assert request.replies == [{"ok": True}]
            await health.eventually(health.now(lambda: health.rules_for("gpu-0")))
            assert agent.alerts.pending == 1

            server.restart()
            await health.eventually(health.state_is("gpu-0", health.UNHEALTHY, bus=bus))
            await health.eventually(health.alerts_with("ALERT_STATUS_RAISED", bus=bus))
            assert agent.alerts.pending == 0
