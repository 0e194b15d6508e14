"""Faults on GPUs and their MIG partitions, end to end: the sim monitor and the nvml monitor.

A hand-built inventory (gpu-0 with two partitions, gpu-1) is published into the KV as the
discovery agent would; taints land as DeviceTaintRules in the emulator, health in the KV.
"""

from __future__ import annotations

import pytest

from services.health.rules import classify, default_rules
from shared.pb.drasuite.v1 import inventory_pb2
from shared.vendors.nvidia.monitor import NvmlMonitor
from shared.vendors.parts.observation import Fault
from tests.fakes.nvml_events import FakeNVMLEvents

pytestmark = pytest.mark.integration

DRIVER = "sim.dra-suite.io"
PARTITIONS = ("gpu-0-mig-1g10gb-19-0", "gpu-0-mig-1g10gb-19-1")
XID_79 = f"{DRIVER}/xid=79:NoSchedule"


def tainted(health, devices: tuple[str, ...], taint: str):
    async def check() -> bool:
        found = {d: await health.record(d) for d in devices}
        return all(r is not None and r.taint == taint for r in found.values())

    return check


def rule_devices(health) -> set[str]:
    return {r["spec"]["deviceSelector"]["device"] for r in health.kube.objects("devicetaintrules")}


async def test_a_fault_on_the_parent_taints_every_partition_and_one_on_a_partition_only_it(
    health, partitioned_inventory: inventory_pb2.Inventory
):
    health.create_node()
    await health.publish_inventory(partitioned_inventory)
    async with health.running():
        await health.eventually(health.state_is("gpu-1", health.HEALTHY))
        command = health.fault(PARTITIONS[1], cause="xid", code="94", message="contained ECC")
        assert await health.command(command) == {"ok": True}
        await health.eventually(health.state_is(PARTITIONS[1], health.UNHEALTHY))
        await health.eventually(health.now(lambda: rule_devices(health) == {PARTITIONS[1]}))
        for device in ("gpu-0", PARTITIONS[0], "gpu-1"):
            assert (await health.record(device)).state == health.HEALTHY

        assert await health.command(health.fault("gpu-0", cause="xid", code="79")) == {"ok": True}
        await health.eventually(tainted(health, ("gpu-0", PARTITIONS[0]), XID_79))
        record = await health.record(PARTITIONS[0])
        assert record.state == health.UNHEALTHY
        assert record.message.startswith("parent gpu-0")
        partition = await health.record(PARTITIONS[1])  # its own fault stands
        assert (partition.cause, partition.code) == ("xid", "94")
        expected = {"gpu-0", *PARTITIONS}
        await health.eventually(health.now(lambda: rule_devices(health) == expected))

        assert await health.command(health.fault("gpu-0", clear=True)) == {"ok": True}
        await health.eventually(health.state_is(PARTITIONS[0], health.HEALTHY))
        await health.eventually(health.now(lambda: rule_devices(health) == {PARTITIONS[1]}))


def _ignored(fault: Fault) -> bool:
    return classify(cause=fault.cause, code=fault.code, rules=default_rules()) is None


async def test_an_nvml_xid_79_taints_the_gpu_and_its_partitions_and_xid_13_nothing(
    health, partitioned_inventory: inventory_pb2.Inventory
):
    health.create_node()
    await health.publish_inventory(partitioned_inventory)
    fake = FakeNVMLEvents(count=2)
    fake.init()
    monitor = NvmlMonitor(fake, pool=health.NODE, wait_ms=50, ignored=_ignored)
    async with health.running(monitor=monitor):
        for device in ("gpu-0", *PARTITIONS, "gpu-1"):
            await health.eventually(health.state_is(device, health.HEALTHY))
        fake.xid(1, 13)
        fake.xid(0, 79)
        await health.eventually(tainted(health, ("gpu-0", *PARTITIONS), XID_79))
        found = await health.record("gpu-0")
        assert (found.state, found.cause, found.code) == (health.UNHEALTHY, "xid", "79")
        expected = {"gpu-0", *PARTITIONS}
        await health.eventually(health.now(lambda: rule_devices(health) == expected))
        assert (await health.record("gpu-1")).state == health.HEALTHY


async def test_an_xid_on_a_mig_instance_taints_the_partition_that_is_that_instance_alone(
    health, partitioned_inventory: inventory_pb2.Inventory
):
    health.create_node()
    await health.publish_inventory(partitioned_inventory)
    fake = FakeNVMLEvents(count=2)
    fake.add_gpu_instance(0, 5, profile_id=19, start=1)  # PARTITIONS[1]
    config = health.config(monitor="nvml", nvml_event_timeout_ms=50)
    async with health.running(config, nvml_library=fake):
        for device in ("gpu-0", *PARTITIONS, "gpu-1"):
            await health.eventually(health.state_is(device, health.HEALTHY))
        fake.xid(0, 79, gpu_instance=5, compute_instance=0)
        found = await health.eventually(health.state_is(PARTITIONS[1], health.UNHEALTHY))
        assert (found.cause, found.code, found.taint) == ("xid", "79", XID_79)
        assert "GPU instance 5" in found.message
        await health.eventually(health.now(lambda: rule_devices(health) == {PARTITIONS[1]}))
        for device in ("gpu-0", PARTITIONS[0], "gpu-1"):
            assert (await health.record(device)).state == health.HEALTHY

        # An instance NVML cannot describe (gone already): the GPU's fault, so every partition's.
        fake.xid(0, 48, gpu_instance=9)
        xid_48 = f"{DRIVER}/xid=48:NoSchedule"
        await health.eventually(tainted(health, ("gpu-0", PARTITIONS[0]), xid_48))
        partition = await health.record(PARTITIONS[1])  # its own fault stands
        assert (partition.cause, partition.code) == ("xid", "79")
        expected = {"gpu-0", *PARTITIONS}
        await health.eventually(health.now(lambda: rule_devices(health) == expected))
        assert (await health.record("gpu-1")).state == health.HEALTHY
