"""Shared counters end to end on Kubernetes 1.36 (DRAPartitionableDevices beta, on): every
agent a real process.

sim `gpu-mig` profile -> discovery publishes each GPU's counter set in a slice of its own and
the GPU whole and its MIG placements, all consuming from it -> the devcluster scheduler gives
one claim the whole gpu-0 -> a claim for any MIG placement of gpu-0 is not allocatable (the
whole GPU holds every counter of its set) -> once the first claim is deallocated, it is.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from devcluster import flow, scheduler
from devcluster.stack import LocalStack, StackConfig
from shared.bus.session import open_bus
from shared.kube import resources
from shared.kube.client import KubeClient

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(120)]

DRIVER = "sim.dra-suite.io"
NODE = "counters-node"
GPU_CLASS = "gpu.sim.dra-suite.io"
MIG_CLASS = "mig.sim.dra-suite.io"
GPU_0_UUID = "GPU-9d11c4e2-e840-51ed-b15f-0be7ae073686"  # gpu-0 of the gpu-mig profile
WHOLE_GPU_0 = f'device.attributes["{DRIVER}"].index == 0'
MIG_OF_GPU_0 = f'device.attributes["{DRIVER}"].parentUUID == "{GPU_0_UUID}"'
DEVICES = 4 * (1 + 7 + 3 + 2 + 1)  # each GPU whole + its 1g, 2g, 3g and 7g placements

Obj = dict[str, Any]


@pytest.fixture
async def stack(short_tmp: Path) -> AsyncIterator[LocalStack]:
    config = StackConfig(
        workdir=short_tmp / "stack",
        node_name=NODE,
        driver_name=DRIVER,
        sim_profile="gpu-mig",
        kubernetes_version="1.36",
    )
    async with LocalStack(config) as running:
        yield running


async def _deallocate(kube: KubeClient, claim: Obj) -> Obj:
    """What the resourceclaim controller does once no pod uses the claim: clear its allocation."""
    claim = dict(claim)
    claim["status"] = {}
    stored: Obj = await kube.replace(
        resources.RESOURCE_CLAIMS, claim, namespace="default", subresource="status"
    )
    return stored


async def test_a_partition_of_an_allocated_gpu_waits_until_the_gpu_is_released(
    stack: LocalStack,
):
    async with open_bus(stack.nats_settings) as bus, stack.kube() as kube:
        await flow.wait_inventory(bus, driver=DRIVER, node=NODE)
        slices = await flow.wait_slices(kube, driver=DRIVER, node=NODE, devices=DEVICES)
        # The 1.35+ layout: counter sets in slices of their own, in the devices' pool.
        counter_slices = [s for s in slices if s["spec"].get("sharedCounters")]
        assert counter_slices
        assert all(not s["spec"].get("devices") for s in counter_slices)
        sets = {c["name"] for s in counter_slices for c in s["spec"]["sharedCounters"]}
        assert "gpu-0-counter-set" in sets
        published = {d["name"]: d for s in slices for d in s["spec"].get("devices", [])}
        assert published["gpu-0"]["consumesCounters"][0]["counterSet"] == "gpu-0-counter-set"

        await flow.create_device_class(
            kube, name=GPU_CLASS, cel=f'device.attributes["{DRIVER}"].type == "gpu"'
        )
        await flow.create_device_class(
            kube, name=MIG_CLASS, cel=f'device.attributes["{DRIVER}"].type == "mig"'
        )
        whole = await flow.create_claim(
            kube,
            namespace="default",
            name="whole",
            device_class=GPU_CLASS,
            count=1,
            cel=WHOLE_GPU_0,
        )
        whole = await flow.allocate_as_scheduler(kube, whole, node=NODE)
        assert flow.allocated_devices(whole) == ["gpu-0"]

        partition = await flow.create_claim(
            kube,
            namespace="default",
            name="partition",
            device_class=MIG_CLASS,
            count=1,
            cel=MIG_OF_GPU_0,
        )
        with pytest.raises(scheduler.UnsatisfiableError):
            await flow.allocate_as_scheduler(kube, partition, node=NODE)
        stored = await kube.get(resources.RESOURCE_CLAIMS, "partition", namespace="default")
        assert "allocation" not in (stored.get("status") or {})

        released = await _deallocate(kube, whole)
        assert "allocation" not in (released.get("status") or {})
        partition = await flow.allocate_as_scheduler(kube, stored, node=NODE)
        [device] = flow.allocated_devices(partition)
        assert device.startswith("gpu-0-mig-")
        assert published[device]["consumesCounters"][0]["counterSet"] == "gpu-0-counter-set"

        # And now the whole GPU is what has to wait.
        with pytest.raises(scheduler.UnsatisfiableError):
            await flow.allocate_as_scheduler(kube, released, node=NODE)
