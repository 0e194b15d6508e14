"""Devices passed through to virtual machines (docs/vfio.md), end to end: the prepared claim
says so in the prepared-claims KV; the health agent records the device `passthrough` and never
taints it for being unmonitored meanwhile, and judges it as before once the claim is gone.

Real NATS and the API emulator; a FakeMonitor plays the native monitor (NVML, npu-smi), which
cannot see a device bound to vfio-pci.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

import pytest

from services.health.monitors.fake import FakeMonitor
from shared.bus import codec
from shared.pb.drasuite.v1 import claim_pb2, health_pb2

pytestmark = pytest.mark.integration

DRIVER = "sim.dra-suite.io"
NODE = "node-a"
UNMONITORED = f"{DRIVER}/unmonitored"


def rule_keys(health: Any, device: str) -> set[str]:
    return {r["spec"]["taint"]["key"] for r in health.rules_for(device)}


async def pass_through(health: Any, device: str, *, uid: str = "vm-claim-uid") -> str:
    """The prepared claim of a VM that got `device` (`passthrough: vfio`), as the allocation
    agent writes it once the device is bound to vfio-pci. Returns its UID."""
    claim = claim_pb2.PreparedClaim(
        driver=DRIVER,
        node=NODE,
        claim_uid=uid,
        namespace="vms",
        name="vm-gpu",
        devices=[
            claim_pb2.PreparedClaimDevice(
                request_names=["gpu"],
                pool=NODE,
                device=device,
                passthrough=claim_pb2.DEVICE_PASSTHROUGH_VFIO,
            )
        ],
        pods=[claim_pb2.ClaimPod(namespace="vms", name="virt-launcher-vm-gpu", uid="p-1")],
        state=claim_pb2.PREPARED_CLAIM_STATE_PREPARED,
    )
    await health.put_prepared_claim(uid, codec.encode(claim))
    return uid


async def unprepare(health: Any, uid: str) -> None:
    key = health.bus.names.claim_key(DRIVER, NODE, uid)
    await health.bus.kv_delete(health.bus.names.claims_bucket, key)


def passed_through(
    health: Any, device: str
) -> Callable[[], Awaitable[health_pb2.DeviceHealth | None]]:
    async def check() -> health_pb2.DeviceHealth | None:
        found = await health.record(device)
        return found if found is not None and found.cause == "passthrough" else None

    return check


async def evaluations(health: Any, agent: Any, count: int) -> None:
    """Wait for `count` more evaluations (what they write follows within the same loop)."""
    start = agent.evaluator.evaluations
    await health.eventually(health.now(lambda: agent.evaluator.evaluations >= start + count))


async def test_a_passed_through_device_is_never_tainted_unmonitored_and_is_judged_after(health):
    health.create_node()
    monitor = FakeMonitor(pool=NODE, devices=("gpu-0", "gpu-1"))
    async with health.running(health.config(monitor_deadline_s=60.0), monitor=monitor) as agent:
        await health.eventually(health.state_is("gpu-0", health.HEALTHY))
        await health.eventually(health.now(lambda: agent.taints.available))
        uid = await pass_through(health, "gpu-0")
        record = await health.eventually(passed_through(health, "gpu-0"))
        # The kubelet gets Unknown from the allocation agent (the host cannot tell), not
        # "unmonitored": neither a fault nor a taint.
        assert record.state == health.UNKNOWN
        assert (record.code, record.taint, list(record.taints)) == ("vfio", "", [])

        # Bound to vfio-pci, the device is lost to its monitor, as another device is for a
        # reason of its own: that one is tainted, the passed-through one is not.
        monitor.report(unknown={"gpu-0", "gpu-1"})
        await health.eventually(health.now(lambda: rule_keys(health, "gpu-1") == {UNMONITORED}))
        # The monitor stops reporting it at all (NVML enumerates without it): still recorded.
        monitor.devices = ("gpu-1",)
        monitor.report()
        await evaluations(health, agent, 3)
        assert health.rules_for("gpu-0") == []
        assert (await health.record("gpu-0")) == record  # unchanged, `since` included
        raised = await health.alerts_with("ALERT_STATUS_RAISED")()
        assert [a["device"] for a in raised] == ["gpu-1"]

        # The claim is unprepared, and the monitor still cannot see the device: unmonitored,
        # tainted, as for any device.
        monitor.devices = ("gpu-0", "gpu-1")
        monitor.report()
        await unprepare(health, uid)
        await health.eventually(health.now(lambda: rule_keys(health, "gpu-0") == {UNMONITORED}))
        found = await health.record("gpu-0")
        assert found is not None
        assert found.cause == "unmonitored"
        assert found.taint == f"{UNMONITORED}=:NoSchedule"
        raised = await health.eventually(health.alerts_with("ALERT_STATUS_RAISED"))
        assert sorted(a["device"] for a in raised) == ["gpu-0", "gpu-1"]


async def test_an_unmonitored_taint_raised_before_the_claim_arrived_is_removed(health):
    health.create_node()
    monitor = FakeMonitor(pool=NODE, devices=("gpu-0",))
    async with health.running(health.config(flap_window_s=60.0), monitor=monitor) as agent:
        await health.eventually(health.state_is("gpu-0", health.HEALTHY))
        await health.eventually(health.now(lambda: agent.taints.available))
        # The allocation agent unbinds the device before it writes the prepared claim.
        monitor.report(unknown={"gpu-0"})
        await health.eventually(health.now(lambda: rule_keys(health, "gpu-0") == {UNMONITORED}))
        await pass_through(health, "gpu-0")
        await health.eventually(passed_through(health, "gpu-0"))
        # Gone at once, though the flap window would keep a changed taint a minute.
        await health.eventually(health.now(lambda: health.rules_for("gpu-0") == []))
        (resolved,) = await health.eventually(health.alerts_with("ALERT_STATUS_RESOLVED"))
        assert (resolved["device"], resolved["cause"]) == ("gpu-0", "unmonitored")


async def test_a_restart_keeps_a_passed_through_device_untainted(health):
    health.create_node()
    await pass_through(health, "gpu-0")
    monitor = FakeMonitor(pool=NODE, devices=("gpu-0", "gpu-1"))
    async with health.running(monitor=monitor) as agent:
        await health.eventually(passed_through(health, "gpu-0"))
    # The agent starts again; its monitor cannot see the device from its first report on.
    monitor = FakeMonitor(pool=NODE, devices=("gpu-0", "gpu-1"))
    monitor.unknown = frozenset({"gpu-0", "gpu-1"})
    async with health.running(monitor=monitor) as agent:
        await health.eventually(health.now(lambda: rule_keys(health, "gpu-1") == {UNMONITORED}))
        await evaluations(health, agent, 3)
        assert health.rules_for("gpu-0") == []
        assert await health.eventually(passed_through(health, "gpu-0"))
