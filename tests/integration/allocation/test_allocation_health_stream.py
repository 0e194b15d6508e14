"""NodeWatchResources fed from the health KV, as the kubelet emulator receives it."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable

import pytest

from devcluster.kubelet import KubeletEmulator
from shared.pb.drasuite.v1 import health_pb2
from shared.pb.kubelet.drahealth.v1alpha1 import api_pb2 as kubelet_health

pytestmark = pytest.mark.integration

Stream = AsyncIterator[kubelet_health.NodeWatchResourcesResponse]


def _states(message: kubelet_health.NodeWatchResourcesResponse) -> dict[str, int]:
    return {d.device.device_name: d.health for d in message.devices}


async def _until(
    stream: Stream, check: Callable[[kubelet_health.NodeWatchResourcesResponse], bool]
) -> kubelet_health.NodeWatchResourcesResponse:
    async with asyncio.timeout(10):
        async for message in stream:
            if check(message):
                return message
    raise AssertionError("health stream ended")


@pytest.mark.parametrize("version", ["v1alpha1", "v1"])
async def test_health_stream_lists_every_device_and_follows_the_health_kv(plugin_node, version):
    async with plugin_node.registered() as (_, kubelet):
        await plugin_node.publish_inventory("npu-0", "npu-1")
        stream = kubelet.watch_health(version=version)
        first = await _until(stream, lambda m: len(m.devices) == 2)
        assert _states(first) == {"npu-0": kubelet_health.UNKNOWN, "npu-1": kubelet_health.UNKNOWN}
        assert {d.device.pool_name for d in first.devices} == {"node-a"}
        assert {d.health_check_timeout_seconds for d in first.devices} == {30}

        await plugin_node.publish_health("npu-0", health_pb2.HEALTH_STATE_HEALTHY)
        await _until(stream, lambda m: _states(m)["npu-0"] == kubelet_health.HEALTHY)

        await plugin_node.publish_health(
            "npu-1", health_pb2.HEALTH_STATE_UNHEALTHY, message="xid 79 " + "x" * 2000
        )
        changed = await _until(stream, lambda m: _states(m)["npu-1"] == kubelet_health.UNHEALTHY)
        [npu1] = [d for d in changed.devices if d.device.device_name == "npu-1"]
        assert len(npu1.message) == 1024
        assert npu1.message.startswith("xid 79 ")
        assert npu1.message.endswith("...")
        assert npu1.last_updated_time == 1_700_000_000
        assert _states(changed)["npu-0"] == kubelet_health.HEALTHY
        await stream.aclose()


async def test_health_is_resent_without_changes(plugin_node):
    async with plugin_node.registered() as (_, kubelet):
        await plugin_node.publish_inventory("npu-0")
        stream = kubelet.watch_health()
        await _until(stream, lambda m: len(m.devices) == 1)
        loop = asyncio.get_running_loop()
        started = loop.time()
        for _ in range(3):
            await _until(stream, lambda m: len(m.devices) == 1)
        # Three resends at the 0.3 s interval of the test config.
        assert 0.5 < loop.time() - started < 3
        await stream.aclose()


async def test_stopping_the_agent_ends_the_stream(plugin_node):
    async with plugin_node.agent():
        kubelet = KubeletEmulator(plugin_node.config.plugin_registry_dir)
        await kubelet.register()
        await plugin_node.publish_inventory("npu-0")
        stream = kubelet.watch_health()
        await _until(stream, lambda m: len(m.devices) == 1)
    # The kubelet sees the end of the stream and marks the driver's devices Unknown.
    async with asyncio.timeout(5):
        remaining = [message async for message in stream]
    assert all(len(m.devices) <= 1 for m in remaining)
    await kubelet.close()
