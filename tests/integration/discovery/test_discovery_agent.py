"""The discovery agent end to end: real NATS, the API emulator, the sim backend.

The emulator validates every object against the real Kubernetes schemas and DRA limits, so
a slice it accepts would be accepted by a real kube-apiserver.
"""

from __future__ import annotations

import asyncio
import contextlib
import shutil
import time
from collections.abc import AsyncIterator, Callable
from typing import Any, TypeVar

import pytest

from devcluster.apiserver import APIServerEmulator
from devcluster.natsserver import NATSServerProcess
from services.discovery.agent import DiscoveryAgent
from services.discovery.config import DiscoveryConfig
from shared.bus import codec
from shared.bus.connection import Bus
from shared.config import KubeSettings, NATSSettings
from shared.errors import BusUnavailableError
from shared.pb.drasuite.v1 import inventory_pb2
from shared.sim.profile import SimDevice
from shared.supervisor import run_agent
from shared.vendors.sim import discovery as sim

pytestmark = pytest.mark.integration

NODE = "n1"
DRIVER = "sim.dra-suite.io"
T = TypeVar("T")


async def eventually(check: Callable[[], T | None], *, timeout_s: float = 5.0) -> T:
    """The first truthy result of `check`, polled until `timeout_s`."""
    deadline = time.monotonic() + timeout_s
    while True:
        result = check()
        if result:
            return result
        if time.monotonic() > deadline:
            raise AssertionError(f"condition not met within {timeout_s}s")
        await asyncio.sleep(0.02)


def create_node(kube: APIServerEmulator) -> dict[str, Any]:
    return kube.create_object({"apiVersion": "v1", "kind": "Node", "metadata": {"name": NODE}})


def our_slices(kube: APIServerEmulator) -> list[dict[str, Any]]:
    return [s for s in kube.objects("resourceslices") if s["spec"]["nodeName"] == NODE]


def one_slice(
    kube: APIServerEmulator, *, generation: int = 1, devices: int | None = None
) -> dict[str, Any] | None:
    """The pool's only slice, once it has `generation` (and `devices` devices, if given)."""
    found = our_slices(kube)
    if len(found) != 1 or found[0]["spec"]["pool"]["generation"] != generation:
        return None
    if devices is not None and len(found[0]["spec"].get("devices", [])) != devices:
        return None
    return found[0]


def with_device(kube: APIServerEmulator, device: str) -> dict[str, Any] | None:
    """The pool's only slice, once it lists `device`."""
    found = one_slice(kube)
    names = {d["name"] for d in found["spec"].get("devices", [])} if found else set()
    return found if device in names else None


def two_slices(kube: APIServerEmulator) -> list[dict[str, Any]] | None:
    found = our_slices(kube)
    return found if len(found) == 2 else None


def slice_writes(kube: APIServerEmulator) -> int:
    return len(kube.request_log.writes("resourceslices"))


async def read_inventory(bus: Bus) -> inventory_pb2.Inventory | None:
    key = bus.names.inventory_key(DRIVER, NODE)
    data = await bus.kv_get(bus.names.inventory_bucket, key)
    return None if data is None else codec.decode(inventory_pb2.Inventory, data, subject=key)


async def inventory_with(bus: Bus, *, generation: int, timeout_s: float = 5.0) -> Any:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            found = await read_inventory(bus)
        except BusUnavailableError:  # the probe's own connection is still coming back
            found = None
        if found is not None and found.generation == generation:
            return found
        await asyncio.sleep(0.05)
    raise AssertionError(f"no inventory of generation {generation} within {timeout_s}s")


@contextlib.asynccontextmanager
async def running(agent: DiscoveryAgent) -> AsyncIterator[DiscoveryAgent]:
    stop = asyncio.Event()
    task = asyncio.create_task(run_agent(agent, grace_s=5, stop=stop, handle_signals=False))
    try:
        yield agent
    finally:
        stop.set()
        code = await asyncio.wait_for(task, 10)
    assert code == 0


@pytest.fixture
def backend() -> sim.SimBackend:
    return sim.SimBackend.from_profile("mixed")


@pytest.fixture
def config(nats_settings: NATSSettings, kube_settings: KubeSettings) -> DiscoveryConfig:
    return DiscoveryConfig(node_name=NODE, nats=nats_settings, kube=kube_settings)


@pytest.fixture
async def agent(
    config: DiscoveryConfig, backend: sim.SimBackend, kube: APIServerEmulator
) -> AsyncIterator[DiscoveryAgent]:
    create_node(kube)
    async with running(DiscoveryAgent(config, backend=backend)) as started:
        await asyncio.wait_for(started.published.wait(), 10)
        yield started


async def test_inventory_lands_in_the_kv(agent: DiscoveryAgent, bus: Bus):
    stored = await inventory_with(bus, generation=1)
    assert (stored.driver, stored.node, stored.pool, stored.backend) == (DRIVER, NODE, NODE, "sim")
    assert [d.name for d in stored.devices] == sorted(
        [f"npu-{i}" for i in range(8)] + [f"gpu-{i}" for i in range(4)]
    )


async def test_a_valid_slice_is_published_and_owned_by_the_node(
    agent: DiscoveryAgent, kube: APIServerEmulator
):
    published = await eventually(lambda: one_slice(kube))
    node = kube.get_object("nodes", NODE)
    assert node is not None
    assert published["metadata"]["name"].startswith(f"00000-{DRIVER}-{NODE}-")
    assert published["metadata"]["ownerReferences"] == [
        {
            "apiVersion": "v1",
            "kind": "Node",
            "name": NODE,
            "uid": node["metadata"]["uid"],
            "controller": True,
        }
    ]
    spec = published["spec"]
    assert (spec["driver"], spec["nodeName"]) == (DRIVER, NODE)
    assert spec["pool"] == {"name": NODE, "generation": 1, "resourceSliceCount": 1}
    devices = {d["name"]: d for d in spec["devices"]}
    assert len(devices) == 12
    assert devices["npu-4"]["attributes"]["numaNode"] == {"int": 1}
    assert devices["npu-4"]["attributes"]["topologyGroup"] == {"string": "hccs-ring-1"}
    assert devices["gpu-0"]["attributes"]["driverVersion"] == {"version": "580.95.5"}
    assert devices["gpu-0"]["capacity"]["memory"] == {"value": "80Gi"}


async def test_a_steady_agent_writes_nothing(
    agent: DiscoveryAgent, kube: APIServerEmulator, bus: Bus, backend: sim.SimBackend
):
    await eventually(lambda: one_slice(kube))
    await inventory_with(bus, generation=1)
    writes = slice_writes(kube)
    kv = await bus.kv(bus.names.inventory_bucket)
    revision = (await kv.get(bus.names.inventory_key(DRIVER, NODE))).revision
    for _ in range(4):  # rescans that find the same devices
        backend.changed.set()
        await asyncio.sleep(0.4)
    assert slice_writes(kube) == writes
    assert (await kv.get(bus.names.inventory_key(DRIVER, NODE))).revision == revision


async def test_hot_plug_updates_the_one_slice_in_place_keeping_the_generation(
    agent: DiscoveryAgent, kube: APIServerEmulator, bus: Bus, backend: sim.SimBackend
):
    before = await eventually(lambda: one_slice(kube))
    backend.add_device(SimDevice(name="npu-8", kind="npu", attributes={"numaNode": 1}))
    # One slice changes: a single atomic update, so the generation stays (as upstream).
    after = await eventually(lambda: one_slice(kube, generation=1, devices=13))
    assert after["metadata"]["name"] == before["metadata"]["name"]  # updated, not re-created
    assert len((await inventory_with(bus, generation=2)).devices) == 13


async def test_a_deleted_slice_is_recreated_within_a_second(
    agent: DiscoveryAgent, kube: APIServerEmulator
):
    wiped = await eventually(lambda: one_slice(kube))
    kube.delete_object("resourceslices", wiped["metadata"]["name"])  # as the kubelet does
    started = time.monotonic()
    again = await eventually(lambda: one_slice(kube, generation=2), timeout_s=1.0)
    assert time.monotonic() - started < 1.0
    assert again["metadata"]["name"] != wiped["metadata"]["name"]
    assert len(again["spec"]["devices"]) == 12


async def test_server_errors_are_retried_until_the_slice_exists(
    config: DiscoveryConfig, backend: sim.SimBackend, kube: APIServerEmulator
):
    create_node(kube)
    kube.faults.add(verb="create", resource="resourceslices", status=500, times=3)
    async with running(DiscoveryAgent(config, backend=backend)) as agent:
        await asyncio.wait_for(agent.published.wait(), 10)
        assert await eventually(lambda: one_slice(kube))
    assert kube.request_log.count(verb="create", resource="resourceslices", status=500) == 3


async def test_slices_wait_for_the_node_to_exist(
    config: DiscoveryConfig, backend: sim.SimBackend, kube: APIServerEmulator
):
    async with running(DiscoveryAgent(config, backend=backend)):
        await asyncio.sleep(0.5)
        assert our_slices(kube) == []
        node = create_node(kube)
        published = await eventually(lambda: one_slice(kube), timeout_s=8)
    assert published["metadata"]["ownerReferences"][0]["uid"] == node["metadata"]["uid"]


async def test_a_rejected_slice_is_reported_left_out_and_sent_again_later(
    config: DiscoveryConfig, kube: APIServerEmulator
):
    create_node(kube)
    kube.faults.add(verb="create", resource="resourceslices", status=422, times=1)
    async with running(DiscoveryAgent(config, backend=sim.SimBackend.from_profile("mixed"))):
        events = await eventually(lambda: kube.objects("events", namespace="default"))
        assert events[0]["reason"] == "ResourceSliceRejected"
        assert events[0]["type"] == "Warning"
        assert events[0]["involvedObject"]["name"] == NODE
        assert "injected fault" in events[0]["message"]
        # The pool is published without the rejected slice (here: empty), and no loop follows.
        empty = await eventually(lambda: one_slice(kube))
        assert empty["spec"].get("devices", []) == []
        writes = slice_writes(kube)
        await asyncio.sleep(0.5)
        assert slice_writes(kube) == writes
        # The rejection was transient: the retry, a little later, publishes the whole pool.
        full = await eventually(lambda: one_slice(kube, devices=12), timeout_s=8)
    assert full["metadata"]["name"] == empty["metadata"]["name"]


async def test_a_profile_file_change_is_published(
    nats_settings: NATSSettings, kube_settings: KubeSettings, kube: APIServerEmulator, tmp_path
):
    profile = tmp_path / "profile.yaml"
    shutil.copy(sim.resolve("gpu"), profile)
    config = DiscoveryConfig(
        node_name=NODE, nats=nats_settings, kube=kube_settings, sim_profile=str(profile)
    )
    create_node(kube)
    async with running(DiscoveryAgent(config)) as agent:
        await asyncio.wait_for(agent.published.wait(), 10)
        first = await eventually(lambda: one_slice(kube))
        text = profile.read_text().replace("name: gpu-0\n", "name: gpu-9\n", 1)
        profile.write_text(text)
        changed = await eventually(lambda: with_device(kube, "gpu-9"), timeout_s=5)
    names = {d["name"] for d in changed["spec"]["devices"]}
    assert "gpu-9" in names
    assert "gpu-0" not in names
    assert len(changed["spec"]["devices"]) == len(first["spec"]["devices"])


async def _private_bus(server: NATSServerProcess, namespace: str) -> tuple[Bus, asyncio.Task[None]]:
    bus = Bus(NATSSettings(url=server.url, namespace=namespace), name="probe")
    task = asyncio.create_task(bus.run())
    await asyncio.wait_for(bus.connected.wait(), 10)
    return bus, task


async def test_inventory_is_republished_after_nats_lost_it(
    nats_server_factory: Callable[[], NATSServerProcess],
    kube_settings: KubeSettings,
    kube: APIServerEmulator,
    backend: sim.SimBackend,
):
    server = nats_server_factory()
    settings = NATSSettings(url=server.url, namespace="lost")
    config = DiscoveryConfig(node_name=NODE, nats=settings, kube=kube_settings)
    create_node(kube)
    async with running(DiscoveryAgent(config, backend=backend)):
        probe, task = await _private_bus(server, "lost")
        try:
            await inventory_with(probe, generation=1)
            server.stop()
            shutil.rmtree(server.store_dir)  # the KV is gone with the server's storage
            backend.add_device(SimDevice(name="npu-8", kind="npu"))
            server.start()
            stored = await inventory_with(probe, generation=2, timeout_s=15)
        finally:
            await probe.close()
            task.cancel()
    assert len(stored.devices) == 13


async def test_slices_are_published_while_nats_is_down(
    nats_server_factory: Callable[[], NATSServerProcess],
    kube_settings: KubeSettings,
    kube: APIServerEmulator,
    backend: sim.SimBackend,
):
    server = nats_server_factory()
    server.stop()
    settings = NATSSettings(url=server.url, namespace="down", connect_timeout_s=0.5)
    config = DiscoveryConfig(node_name=NODE, nats=settings, kube=kube_settings)
    create_node(kube)
    async with running(DiscoveryAgent(config, backend=backend)) as agent:
        await asyncio.wait_for(agent.published.wait(), 10)
        assert await eventually(lambda: one_slice(kube))
        server.start()
        probe, task = await _private_bus(server, "down")
        try:
            stored = await inventory_with(probe, generation=1, timeout_s=15)
        finally:
            await probe.close()
            task.cancel()
    assert len(stored.devices) == 12


@pytest.mark.parametrize("kube", ["1.34", "1.35", "1.36"], indirect=True)
async def test_the_slice_is_accepted_by_every_supported_version(
    agent: DiscoveryAgent, kube: APIServerEmulator
):
    published = await eventually(lambda: one_slice(kube))
    assert len(published["spec"]["devices"]) == 12


async def test_a_restarted_agent_rewrites_nothing(
    config: DiscoveryConfig, kube: APIServerEmulator, bus: Bus
):
    create_node(kube)
    async with running(DiscoveryAgent(config, backend=sim.SimBackend.from_profile("mixed"))):
        await eventually(lambda: one_slice(kube))
        await inventory_with(bus, generation=1)
    writes = slice_writes(kube)
    kv = await bus.kv(bus.names.inventory_bucket)
    revision = (await kv.get(bus.names.inventory_key(DRIVER, NODE))).revision
    async with running(DiscoveryAgent(config, backend=sim.SimBackend.from_profile("mixed"))) as a:
        await asyncio.wait_for(a.published.wait(), 10)
        await asyncio.sleep(0.5)
    assert slice_writes(kube) == writes
    assert (await kv.get(bus.names.inventory_key(DRIVER, NODE))).revision == revision


async def test_a_large_pool_is_split_and_shrinks_in_place(
    config: DiscoveryConfig, kube: APIServerEmulator
):
    devices = [
        SimDevice(name=f"dev-{i:03d}", kind="sim", attributes={"index": i}) for i in range(200)
    ]
    backend = sim.SimBackend(devices)
    create_node(kube)
    async with running(DiscoveryAgent(config, backend=backend)):
        split = await eventually(lambda: two_slices(kube))
        assert sorted(len(s["spec"]["devices"]) for s in split) == [72, 128]
        assert {s["spec"]["pool"]["resourceSliceCount"] for s in split} == {2}
        for device in devices[100:]:
            backend.remove_device(device.name)
        # The extra slice is deleted first, then the other updated: the generation stays.
        shrunk = await eventually(lambda: one_slice(kube, devices=100))
    assert shrunk["metadata"]["name"] in {s["metadata"]["name"] for s in split}
    assert shrunk["spec"]["pool"]["resourceSliceCount"] == 1


@pytest.mark.parametrize(
    ("status", "verb"),
    [(409, "update"), (429, "update"), (503, "update")],
    ids=["conflict", "throttled", "unavailable"],
)
async def test_failed_updates_are_retried_until_they_converge(
    agent: DiscoveryAgent,
    kube: APIServerEmulator,
    backend: sim.SimBackend,
    status: int,
    verb: str,
):
    await eventually(lambda: one_slice(kube))
    kube.faults.add(verb=verb, resource="resourceslices", status=status, times=2)
    backend.set_attribute("npu-0", "numaNode", 7)

    def numa_7() -> bool:
        found = one_slice(kube)
        devices = {d["name"]: d for d in found["spec"]["devices"]} if found else {}
        return "npu-0" in devices and devices["npu-0"]["attributes"]["numaNode"] == {"int": 7}

    await eventually(numa_7, timeout_s=8)
    assert kube.request_log.count(verb=verb, resource="resourceslices", status=status) == 2
