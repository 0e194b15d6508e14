"""`--taint-target slice`: taints travel in the health records, no DeviceTaintRule is written.

The discovery agent publishes the records' `taints` inside the ResourceSlice; here the agent
runs against real NATS and the API emulator, and the test reads the records and the rules.
"""

from __future__ import annotations

from typing import Any

import pytest

from services.dractl import queries
from services.health.monitors.fake import FakeMonitor
from services.health.policy import Taint
from shared.pb.drasuite.v1 import health_pb2
from shared.vendors.parts.observation import Fault

pytestmark = pytest.mark.integration

DRIVER = "sim.dra-suite.io"
NODE = "node-a"
XID_79 = (f"{DRIVER}/xid", "79", "NoSchedule")
DRAIN_KEY = f"{DRIVER}/drain"


def taints(record: health_pb2.DeviceHealth | None) -> list[tuple[str, str, str]]:
    assert record is not None
    return [(t.key, t.value, t.effect) for t in record.taints]


def times(record: health_pb2.DeviceHealth | None) -> dict[str, int]:
    assert record is not None
    return {t.key: t.time_added_unix_ms for t in record.taints}


def carries(health, device: str, expected: list[tuple[str, str, str]]):
    """A check for `eventually`: the device's record once its taints are `expected`."""

    async def check() -> health_pb2.DeviceHealth | None:
        found = await health.record(device)
        return found if found is not None and taints(found) == expected else None

    return check


def no_rules(health) -> bool:
    return not health.kube.objects("devicetaintrules")


async def drain(health, device: str, *, on: bool = True, reason: str = "") -> dict[str, Any]:
    return await queries.drain(
        health.bus, driver=DRIVER, node=NODE, device=device, drain=on, reason=reason
    )


async def test_a_fault_is_recorded_with_its_taint_and_no_rule_is_written(health):
    health.create_node()
    await health.put_inventory()
    # Rules a run with `--taint-target rule` left: deleted, their drain kept (in the record).
    health.leave_rule(device="gpu-2", taint=Taint(key=f"{DRIVER}/xid", value="48", effect="None"))
    health.leave_rule(device="gpu-0", taint=Taint(key=DRAIN_KEY, value="rma", effect="NoSchedule"))
    config = health.config(taint_target="slice", health_refresh_s=0.1)
    async with health.running(config) as agent:
        await health.eventually(health.state_is("gpu-1", health.HEALTHY))
        await health.eventually(health.now(lambda: no_rules(health)))
        await health.eventually(carries(health, "gpu-0", [(DRAIN_KEY, "rma", "NoSchedule")]))
        assert agent.taints.drains == {"gpu-0": ""}

        assert await health.command(health.fault("gpu-1", cause="xid", code="79")) == {"ok": True}
        found = await health.eventually(carries(health, "gpu-1", [XID_79]))
        assert found.state == health.UNHEALTHY
        assert found.taint == f"{DRIVER}/xid=79:NoSchedule"
        added = times(found)[f"{DRIVER}/xid"]
        assert 0 < added <= found.updated_unix_ms

        # Rewrites (every health_refresh_s) keep when the taint was first added.
        async def rewritten_later() -> health_pb2.DeviceHealth | None:
            record = await health.record("gpu-1")
            return record if record and record.updated_unix_ms > found.updated_unix_ms else None

        later = await health.eventually(rewritten_later)
        assert times(later) == {f"{DRIVER}/xid": added}
        assert no_rules(health)

        assert await health.command(health.fault("gpu-1", clear=True)) == {"ok": True}
        cleared = await health.eventually(carries(health, "gpu-1", []))
        assert (cleared.state, cleared.taint) == (health.HEALTHY, "")
        assert no_rules(health)


async def test_drains_are_recorded_beside_faults_and_survive_a_restart(health):
    health.create_node()
    await health.put_inventory()
    config = health.config(taint_target="slice")
    async with health.running(config):
        await health.eventually(health.state_is("gpu-1", health.HEALTHY))
        answer = await drain(health, "gpu-1", reason="RMA ticket 4711")
        assert answer == {"ok": True, "device": "gpu-1", "drained": True}
        drained = await health.eventually(
            carries(health, "gpu-1", [(DRAIN_KEY, "RMA-ticket-4711", "NoSchedule")])
        )
        assert drained.state == health.HEALTHY  # drained, yet healthy: recorded all the same
        drained_at = times(drained)[DRAIN_KEY]

        assert await health.command(health.fault("gpu-1", cause="xid", code="79")) == {"ok": True}
        both = await health.eventually(
            carries(health, "gpu-1", [XID_79, (DRAIN_KEY, "RMA-ticket-4711", "NoSchedule")])
        )
        assert times(both)[DRAIN_KEY] == drained_at
        assert no_rules(health)

    async with health.running(config) as agent:
        # The sim fault did not survive the restart; the drain did, from the record.
        restored = await health.eventually(
            carries(health, "gpu-1", [(DRAIN_KEY, "RMA-ticket-4711", "NoSchedule")])
        )
        assert times(restored) == {DRAIN_KEY: drained_at}
        assert agent.taints.drains == {"gpu-1": "RMA-ticket-4711"}
        assert (await drain(health, "gpu-1", on=False))["was_drained"] is True
        await health.eventually(carries(health, "gpu-1", []))
        assert no_rules(health)


@pytest.mark.parametrize(
    ("kube", "applied"),
    [("1.34", ""), ("1.35", f"{DRIVER}/npu-subhealth=81A3880C:None")],
    ids=["1.34 has no None effect", "1.35 takes None taints"],
    indirect=["kube"],
)
async def test_informational_taints_are_recorded_as_applied_only_where_none_exists(health, applied):
    health.create_node()
    monitor = FakeMonitor(pool=NODE, devices=("npu-0",))
    async with health.running(health.config(taint_target="slice"), monitor=monitor) as agent:
        await health.eventually(health.state_is("npu-0", health.HEALTHY))
        await health.eventually(health.now(lambda: agent.taints.none_supported is not None))
        monitor.report({"npu-0": Fault(cause="npu-subhealth", code="81A3880C")})
        wanted = [(f"{DRIVER}/npu-subhealth", "81A3880C", "None")]
        found = await health.eventually(carries(health, "npu-0", wanted))
        # The record wants the taint either way (the discovery agent drops what the server
        # rejects); `taint` says what the cluster gets.
        assert (found.state, found.taint) == (health.HEALTHY, applied)
        assert no_rules(health)
