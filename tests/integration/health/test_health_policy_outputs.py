"""The deeper health pipeline end to end: manual drains, unmonitored devices, `None` taints.

Real NATS and the API emulator; drains go through dractl's request code; a FakeMonitor
stands in for the device monitor where the test must make it fail or hang.
"""

from __future__ import annotations

from typing import Any

import pytest

from services.dractl import queries
from services.dractl.queries import CommandError
from services.health.monitors.fake import FakeMonitor
from shared.vendors.parts.observation import Fault

pytestmark = pytest.mark.integration

DRIVER = "sim.dra-suite.io"
NODE = "node-a"
DRAIN_KEY = f"{DRIVER}/drain"


def taints_of(health, device: str) -> dict[str, dict[str, Any]]:
    return {r["spec"]["taint"]["key"]: r for r in health.rules_for(device)}


async def drain(health, device: str, *, on: bool = True, reason: str = "") -> dict[str, Any]:
    return await queries.drain(
        health.bus, driver=DRIVER, node=NODE, device=device, drain=on, reason=reason
    )


async def test_a_drain_taints_the_device_and_survives_an_agent_restart(health):
    health.create_node()
    await health.put_inventory()
    async with health.running() as agent:
        await health.eventually(health.state_is("gpu-1", health.HEALTHY))
        await health.eventually(health.now(lambda: agent.taints.available))
        answer = await drain(health, "gpu-1", reason="RMA ticket 4711")
        assert answer == {"ok": True, "device": "gpu-1", "drained": True}
        rules = await health.eventually(health.now(lambda: taints_of(health, "gpu-1")))
        rule = rules[DRAIN_KEY]
        taint = rule["spec"]["taint"]
        assert (taint["value"], taint["effect"]) == ("RMA-ticket-4711", "NoSchedule")
        assert rule["metadata"]["annotations"]["dra-suite.io/reason"] == "RMA ticket 4711"

        async def recorded() -> bool:  # the record carries the drain too, whatever the target
            found = await health.record("gpu-1")
            return found is not None and [(t.key, t.value) for t in found.taints] == [
                (DRAIN_KEY, "RMA-ticket-4711")
            ]

        await health.eventually(recorded)
        # A fault on a drained device adds its own taint beside the drain.
        assert await health.command(health.fault("gpu-1", cause="xid", code="79")) == {"ok": True}
        await health.eventually(health.now(lambda: len(taints_of(health, "gpu-1")) == 2))

    async with health.running() as agent:
        await health.eventually(health.now(lambda: agent.taints.drains))
        assert agent.taints.drains == {"gpu-1": "RMA ticket 4711"}
        await health.eventually(health.state_is("gpu-1", health.HEALTHY))
        # The sim fault did not survive the restart; the drain did.
        await health.eventually(health.now(lambda: set(taints_of(health, "gpu-1")) == {DRAIN_KEY}))
        assert (await drain(health, "gpu-1", on=False))["drained"] is False
        await health.eventually(health.now(lambda: not health.rules_for("gpu-1")))


async def test_drain_requests_for_unknown_devices_are_refused(health):
    health.create_node()
    await health.put_inventory()
    async with health.running():
        await health.eventually(health.state_is("gpu-0", health.HEALTHY))
        with pytest.raises(CommandError, match="unknown device"):
            await drain(health, "gpu-9")
        answer = await drain(health, "gpu-0", on=False)
        assert answer["was_drained"] is False
        assert health.rules_for("gpu-0") == []


async def test_a_failing_monitor_makes_devices_unmonitored_until_it_reports_again(health):
    health.create_node()
    monitor = FakeMonitor(pool=NODE, devices=("gpu-0", "gpu-1"))
    config = health.config(monitor_deadline_s=60.0)
    async with health.running(config, monitor=monitor):
        await health.eventually(health.state_is("gpu-0", health.HEALTHY))
        monitor.fail(RuntimeError("driver library unloaded"))
        found = await health.eventually(health.state_is("gpu-0", health.UNKNOWN))
        assert found.cause == "unmonitored"
        assert "driver library unloaded" in found.message
        rules = await health.eventually(health.now(lambda: taints_of(health, "gpu-1")))
        assert set(rules) == {f"{DRIVER}/unmonitored"}
        # The monitor restarts (after a 1 s backoff) and reports on start: the devices are back.
        await health.eventually(health.state_is("gpu-0", health.HEALTHY))
        await health.eventually(health.now(lambda: not health.rules_for("gpu-1")))
        assert monitor.runs == 2


async def test_a_hung_monitor_makes_devices_unmonitored_after_the_deadline(health):
    health.create_node()
    monitor = FakeMonitor(pool=NODE, devices=("gpu-0",))
    async with health.running(health.config(monitor_deadline_s=0.5), monitor=monitor):
        await health.eventually(health.state_is("gpu-0", health.HEALTHY))
        found = await health.eventually(health.state_is("gpu-0", health.UNKNOWN))
        assert found.taint == f"{DRIVER}/unmonitored=:NoSchedule"
        (raised,) = await health.eventually(health.alerts_with("ALERT_STATUS_RAISED"))
        assert raised["cause"] == "unmonitored"
        monitor.report()
        await health.eventually(health.state_is("gpu-0", health.HEALTHY))


@pytest.mark.parametrize(
    ("kube", "written"),
    [("1.34", False), ("1.35", True)],
    ids=["1.34 has no None effect", "1.35 takes None taints"],
    indirect=["kube"],
)
async def test_informational_taints_are_written_where_the_api_has_the_none_effect(health, written):
    health.create_node()
    monitor = FakeMonitor(pool=NODE, devices=("npu-0", "npu-1"))
    async with health.running(monitor=monitor) as agent:
        await health.eventually(health.state_is("npu-0", health.HEALTHY))
        await health.eventually(health.now(lambda: agent.taints.available))
        monitor.report({"npu-0": Fault(cause="npu-subhealth", code="81A3880C")})
        await health.eventually(health.now(lambda: agent.taints.none_supported is written))
        found = await health.eventually(health.state_is("npu-0", health.HEALTHY))
        assert found.cause == "npu-subhealth"
        rules = taints_of(health, "npu-0")
        assert bool(rules) is written
        # A fatal fault is written either way.
        monitor.report({"npu-1": Fault(cause="npu", code="80E3A201")})
        await health.eventually(health.now(lambda: taints_of(health, "npu-1")))
