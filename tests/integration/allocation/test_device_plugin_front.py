"""The device-plugin front end to end: the agent in device-plugin mode on a real nats-server,
registered with the device-plugin kubelet emulator over real gRPC on unix sockets."""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import gc
import json
import shutil
import tempfile
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
from prometheus_client.parser import text_string_to_metric_families

from devcluster.deviceplugin_kubelet import KubeletDeviceError
from services.allocation.deviceplugin.agent import DevicePluginAgent
from services.allocation.dra.agent import AllocationAgent
from shared import metrics
from shared.bus.connection import Bus
from shared.config import NATSSettings
from shared.errors import ConfigError
from shared.pb.drasuite.v1 import health_pb2, inventory_pb2
from shared.supervisor import run_agent
from shared.vendors.sim.discovery import SimBackend
from tests.integration.allocation.deviceplugin_node import GPU, NPU, DevicePluginNode

pytestmark = pytest.mark.timeout(60)


@pytest.fixture
async def node(nats_settings: NATSSettings, bus: Bus) -> AsyncIterator[DevicePluginNode]:
    base = Path(tempfile.mkdtemp(prefix="dra-", dir="/tmp"))
    node = DevicePluginNode(base, nats=nats_settings, bus=bus)
    await node.kubelet.start()
    try:
        yield node
    finally:
        await node.kubelet.stop()
        gc.collect()
        shutil.rmtree(base, ignore_errors=True)


def all_healthy(count: int):
    return lambda devices: len(devices) == count and set(devices.values()) == {"Healthy"}


async def test_each_device_kind_registers_as_its_resource_and_lists_its_devices(node):
    await node.publish_profile("mixed")
    async with node.agent():
        npus = await node.kubelet.wait_for_devices(NPU, all_healthy(8))
        gpus = await node.kubelet.wait_for_devices(GPU, all_healthy(4))
    assert sorted(npus) == [f"npu-{i}" for i in range(8)]
    assert sorted(gpus) == [f"gpu-{i}" for i in range(4)]
    assert sorted(node.kubelet.registrations) == [GPU, NPU]
    numa = node.kubelet.endpoint(NPU).updates[-1].numa
    assert numa["npu-0"] == (0,)
    assert numa["npu-7"] == (1,)
    assert node.kubelet.endpoint(NPU).options.get_preferred_allocation_available


async def test_a_fault_in_the_health_kv_flows_to_list_and_watch_and_back(node):
    await node.publish_profile("ascend-310p-duo")
    async with node.agent():
        await node.kubelet.wait_for_devices(NPU, all_healthy(8))
        await node.publish_health("npu-3", health_pb2.HEALTH_STATE_UNHEALTHY, message="80E3A201")
        devices = await node.kubelet.wait_for_devices(NPU, lambda d: d["npu-3"] == "Unhealthy")
        assert [k for k, v in devices.items() if v == "Unhealthy"] == ["npu-3"]
        await node.publish_health("npu-3", health_pb2.HEALTH_STATE_HEALTHY)
        await node.kubelet.wait_for_devices(NPU, all_healthy(8))


async def test_allocate_returns_cdi_names_that_resolve_against_the_spec_on_disk(node):
    await node.publish_profile("ascend-310p-duo")
    async with node.agent():
        await node.kubelet.wait_for_devices(NPU, all_healthy(8))
        response = await node.kubelet.allocate(NPU, [["npu-2", "npu-3"], ["npu-6"]])
    first, second = response.container_responses
    assert dict(first.envs) == {
        "ASCEND_VISIBLE_DEVICES": "2,3",
        "DRA_SUITE_DEVICES": "npu-2,npu-3",
    }
    assert [(d.container_path, d.host_path, d.permissions) for d in first.devices] == [
        ("/dev/davinci2", "/dev/null", "rw"),
        ("/dev/davinci3", "/dev/null", "rw"),
    ]
    names = [c.name for c in first.cdi_devices]
    assert names == ["k8s.sim.dra-suite.io/device=npu-2", "k8s.sim.dra-suite.io/device=npu-3"]
    assert node.resolve(names[0])["containerEdits"] == {
        "deviceNodes": [{"path": "/dev/davinci2", "hostPath": "/dev/null"}]
    }
    assert dict(second.envs)["ASCEND_VISIBLE_DEVICES"] == "6"
    node.resolve(second.cdi_devices[0].name)


async def test_the_preference_picks_same_card_pairs_while_they_are_free(node):
    await node.publish_profile("ascend-310p-duo")
    everything = [f"npu-{i}" for i in range(8)]
    async with node.agent():
        await node.kubelet.wait_for_devices(NPU, all_healthy(8))
        assert await node.kubelet.preferred(NPU, available=everything, size=2) == [
            "npu-0",
            "npu-1",
        ]
        free = [n for n in everything if n not in ("npu-0", "npu-3")]
        assert await node.kubelet.preferred(NPU, available=free, size=2) == ["npu-4", "npu-5"]
        assert await node.kubelet.preferred(
            NPU, available=free, must_include=["npu-2"], size=2
        ) == ["npu-1", "npu-2"]
        with pytest.raises(KubeletDeviceError, match="INVALID_ARGUMENT"):
            await node.kubelet.preferred(NPU, available=["npu-0"], size=2)


async def test_a_kubelet_restart_is_followed_by_a_new_registration_and_allocations_stay(node):
    await node.publish_profile("ascend-310p-duo")
    async with node.agent() as agent:
        await node.kubelet.wait_for_devices(NPU, all_healthy(8))
        response = await node.kubelet.allocate(NPU, [["npu-0", "npu-1"]])
        spec_before = node.spec()
        await node.kubelet.restart()  # removes every socket in the directory, our own too
        await node.kubelet.wait_for_devices(NPU, all_healthy(8))
        assert node.kubelet.registrations == [NPU, NPU]
        assert agent.front.registrations == 2
        assert node.spec() == spec_before
        node.resolve(response.container_responses[0].cdi_devices[0].name)
        assert node.kubelet.allocations[NPU] == [["npu-0", "npu-1"]]
        again = await node.kubelet.allocate(NPU, [["npu-4"]])
    assert dict(again.container_responses[0].envs)["ASCEND_VISIBLE_DEVICES"] == "4"


async def test_the_plugin_registers_once_the_kubelet_comes_up(node):
    await node.kubelet.stop()
    await node.publish_profile("ascend-310p-duo")
    async with node.agent() as agent:
        await asyncio.sleep(0.3)
        assert agent.front.registrations == 0
        await node.kubelet.start()
        await node.kubelet.wait_for_devices(NPU, all_healthy(8))


async def test_unknown_devices_are_refused(node):
    await node.publish_profile("ascend-310p-duo")
    async with node.agent():
        await node.kubelet.wait_for_devices(NPU, all_healthy(8))
        with pytest.raises(
            KubeletDeviceError, match=r"INVALID_ARGUMENT.*unknown devices \['gpu-0'\]"
        ):
            await node.kubelet.allocate(NPU, [["npu-0", "gpu-0"]])


@contextlib.asynccontextmanager
async def _listening(path):
    path.parent.mkdir(parents=True, exist_ok=True)
    server = await asyncio.start_unix_server(lambda r, w: w.close(), path=str(path))
    try:
        yield
    finally:
        server.close()
        await server.wait_closed()


async def test_the_device_plugin_front_refuses_to_start_beside_a_live_dra_front(node):
    async with _listening(node.config.registration_socket_path):
        code = await run_agent(DevicePluginAgent(node.config), grace_s=5, handle_signals=False)
    assert code == 2
    assert node.kubelet.registrations == []


async def test_the_dra_front_refuses_to_start_beside_a_live_device_plugin_front(node):
    await node.publish_profile("ascend-310p-duo")
    async with node.agent():
        await node.kubelet.wait_for_devices(NPU, all_healthy(8))
        dra = AllocationAgent(dataclasses.replace(node.config, kubelet_api="dra"))
        with pytest.raises(ConfigError, match="device-plugin front of this driver serves"):
            async with contextlib.AsyncExitStack() as stack:
                await dra.open(stack)


async def test_a_stale_socket_of_the_other_front_does_not_block_the_start(node):
    path = node.config.registration_socket_path
    async with _listening(path):
        pass  # closed: the file stays, nobody accepts on it
    await node.publish_profile("ascend-310p-duo")
    async with node.agent():
        await node.kubelet.wait_for_devices(NPU, all_healthy(8))


async def test_a_forged_inventorys_device_node_and_env_never_reach_an_allocate_answer(node):
    scan = await SimBackend.from_profile("ascend-310p-duo").scan()
    devices = [inventory_pb2.Device() for _ in scan.devices]
    for device, original in zip(devices, scan.devices, strict=True):
        device.CopyFrom(original)
    forged = devices[2]
    forged.device_nodes.add(path="/dev/sda", host_path="/dev/sda")
    forged.env["LD_PRELOAD"] = "/tmp/evil.so"
    devices[3].env["ASCEND_VISIBLE_DEVICES"] = "all"
    await node.publish_devices(devices)
    async with node.agent():
        await node.kubelet.wait_for_devices(NPU, all_healthy(8))
        for victim in ("npu-2", "npu-3"):
            with pytest.raises(KubeletDeviceError, match=r"PERMISSION_DENIED.*refused edits"):
                await node.kubelet.allocate(NPU, [["npu-0", victim]])
        clean = await node.kubelet.allocate(NPU, [["npu-0", "npu-1"]])
        spec = node.spec()
    assert node.kubelet.allocations[NPU] == [["npu-0", "npu-1"]]
    (container,) = clean.container_responses
    assert "LD_PRELOAD" not in container.envs
    assert spec is not None
    text = json.dumps(spec)
    assert "/dev/sda" not in text
    assert "LD_PRELOAD" not in text
    assert [d["name"] for d in spec["devices"]] == [f"npu-{i}" for i in (0, 1, 4, 5, 6, 7)]


async def test_a_refused_registration_is_tried_again_until_the_kubelet_accepts(node):
    node.kubelet.refuse_registrations = 2
    await node.publish_profile("ascend-310p-duo")
    async with node.agent() as agent:
        await node.kubelet.wait_for_devices(NPU, all_healthy(8))
        assert len(node.kubelet.refused) == 2
        assert "being registered by another plugin" in node.kubelet.refused[0]
        assert agent.front.registered == {NPU}
        assert agent.front.registrations == 1


async def test_a_device_moving_numa_node_under_the_same_name_is_listed_again(node):
    inventory = await node.publish_profile("ascend-310p-duo")
    async with node.agent():
        await node.kubelet.wait_for_devices(NPU, all_healthy(8))
        endpoint = node.kubelet.endpoint(NPU)
        assert endpoint.updates[-1].numa["npu-0"] == (0,)
        devices = list(inventory.devices)
        devices[0].attributes["numaNode"].int = 1
        await node.publish_devices(devices)
        async with asyncio.timeout(10):
            while True:
                changed = endpoint.changed  # taken before reading: no update is missed
                if endpoint.updates[-1].numa["npu-0"] == (1,):
                    break
                await changed.wait()


async def test_containers_admitted_in_turn_get_whole_free_cards_around_a_faulty_chip(node):
    await node.publish_profile("ascend-310p-duo")
    async with node.agent():
        await node.kubelet.wait_for_devices(NPU, all_healthy(8))
        await node.publish_health("npu-4", health_pb2.HEALTH_STATE_UNHEALTHY)
        await node.kubelet.wait_for_devices(NPU, lambda d: d["npu-4"] == "Unhealthy")
        got = [(await node.kubelet.admit(NPU, 2)).envs["ASCEND_VISIBLE_DEVICES"] for _ in range(3)]
        with pytest.raises(KubeletDeviceError, match="2 wanted, 1 allocatable"):
            await node.kubelet.admit(NPU, 2)
    # Whole cards only; card 3 has the faulty chip, its other chip stays for a single. Card 4
    # first: best fit, its NUMA node has fewer free chips, NUMA node 0 stays whole for four.
    assert got == ["6,7", "0,1", "2,3"]


def _samples(name: str) -> dict[tuple[tuple[str, str], ...], float]:
    """Every series of `name` in this process's /metrics text, by its sorted labels."""
    metrics.configure(service="test")
    found = {}
    for family in text_string_to_metric_families(metrics.render().decode()):
        for sample in family.samples:
            if sample.name == name:
                found[tuple(sorted(sample.labels.items()))] = float(sample.value)
    return found


def _allocations(outcome: str) -> float:
    key = (("outcome", outcome), ("resource", NPU))
    return _samples("dra_device_plugin_allocate_duration_seconds_count").get(key, 0.0)


async def test_the_front_reports_allocations_registrations_devices_and_streams(node):
    metrics.configure(service="test")
    before = {outcome: _allocations(outcome) for outcome in ("ok", "invalid", "refused")}
    registered = _samples("dra_device_plugin_registrations_total")
    scan = await SimBackend.from_profile("ascend-310p-duo").scan()
    devices = list(scan.devices)
    devices[2].env["LD_PRELOAD"] = "/tmp/evil.so"
    await node.publish_devices(devices)
    async with node.agent():
        await node.kubelet.wait_for_devices(NPU, all_healthy(8))
        await node.publish_health("npu-5", health_pb2.HEALTH_STATE_UNHEALTHY, message="80E3A201")
        await node.kubelet.wait_for_devices(NPU, lambda d: d["npu-5"] == "Unhealthy")
        await node.kubelet.allocate(NPU, [["npu-0", "npu-1"]])
        with pytest.raises(KubeletDeviceError):
            await node.kubelet.allocate(NPU, [["npu-9"]])
        with pytest.raises(KubeletDeviceError):
            await node.kubelet.allocate(NPU, [["npu-2"]])
        shown = _samples("dra_device_plugin_devices")
        streams = _samples("dra_device_plugin_streams")

    after = {outcome: _allocations(outcome) - before[outcome] for outcome in before}
    assert after == {"ok": 1, "invalid": 1, "refused": 1}
    assert shown[(("health", "Healthy"), ("resource", NPU))] == 7
    assert shown[(("health", "Unhealthy"), ("resource", NPU))] == 1
    assert streams[(("resource", NPU),)] == 1
    ok = (("outcome", "ok"), ("resource", NPU))
    assert _samples("dra_device_plugin_registrations_total")[ok] == registered.get(ok, 0) + 1
    rejected = _samples("dra_prepare_rejected_edits_total")
    assert rejected[(("backend", "sim"), ("kind", "env_name"))] >= 1
