"""Device taints published inside the ResourceSlices (`--publish-device-taints`), end to end.

Real NATS and the API emulator: the test writes the health agent's records (`DeviceHealth`
with `taints`) into the health KV itself, and the slices must follow, one slice update per
change, never a write for a record that only got refreshed. The dev cluster's scheduler
stands in for kube-scheduler: it does not hand out a NoSchedule-tainted device.
"""

from __future__ import annotations

import asyncio
import dataclasses
import time
from collections.abc import Callable
from typing import Any

import pytest

from devcluster import scheduler
from devcluster.apiserver import APIServerEmulator, ClusterConfig
from devcluster.natsserver import NATSServerProcess
from services.discovery.agent import DiscoveryAgent
from services.discovery.config import DiscoveryConfig
from shared.bus import codec
from shared.bus.connection import Bus
from shared.config import KubeSettings, NATSSettings
from shared.pb.drasuite.v1 import health_pb2
from shared.sim.profile import SimDevice
from shared.vendors.sim import discovery as sim
from tests.integration.discovery.agent_runner import eventually, running

pytestmark = pytest.mark.integration

NODE = "n1"
DRIVER = "sim.dra-suite.io"
KEY = "sim.dra-suite.io/unhealthy"
NPU_CLASS = {
    "npu": {
        "spec": {
            "selectors": [
                {"cel": {"expression": 'device.attributes["sim.dra-suite.io"].type == "npu"'}}
            ]
        }
    }
}


def _claim(npus: int) -> dict[str, Any]:
    request = {"name": "npus", "exactly": {"deviceClassName": "npu", "count": npus}}
    return {"spec": {"devices": {"requests": [request]}}}


def _taint(effect: str = "NoSchedule", *, key: str = KEY, at_ms: int = 0) -> health_pb2.DeviceTaint:
    return health_pb2.DeviceTaint(key=key, value="xid-79", effect=effect, time_added_unix_ms=at_ms)


async def put_record(
    bus: Bus, device: str, *taints: health_pb2.DeviceTaint, refreshed: int = 0
) -> None:
    state = health_pb2.HEALTH_STATE_UNHEALTHY if taints else health_pb2.HEALTH_STATE_HEALTHY
    record = health_pb2.DeviceHealth(
        driver=DRIVER,
        node=NODE,
        pool=NODE,
        device=device,
        state=state,
        updated_unix_ms=int(time.time() * 1000) + refreshed,
        taints=list(taints),
    )
    key = bus.names.health_key(DRIVER, NODE, device)
    await bus.kv_put(bus.names.health_bucket, key, codec.encode(record))


def ours(kube: APIServerEmulator) -> list[dict[str, Any]]:
    return [s for s in kube.objects("resourceslices") if s["spec"]["nodeName"] == NODE]


def device(kube: APIServerEmulator, name: str) -> dict[str, Any] | None:
    found = [d for s in ours(kube) for d in s["spec"].get("devices", []) if d["name"] == name]
    return found[0] if len(found) == 1 else None


def taints_of(kube: APIServerEmulator, name: str) -> list[dict[str, Any]]:
    return list((device(kube, name) or {}).get("taints", []))


def slice_writes(kube: APIServerEmulator) -> int:
    return len(kube.request_log.writes("resourceslices"))


def generations(kube: APIServerEmulator) -> set[int]:
    return {s["spec"]["pool"]["generation"] for s in ours(kube)}


@pytest.fixture
def node(kube: APIServerEmulator) -> None:
    kube.create_object({"apiVersion": "v1", "kind": "Node", "metadata": {"name": NODE}})


@pytest.fixture
def config(nats_settings: NATSSettings, kube_settings: KubeSettings) -> DiscoveryConfig:
    return DiscoveryConfig(
        node_name=NODE, nats=nats_settings, kube=kube_settings, publish_device_taints=True
    )


async def test_a_health_record_taints_its_device_and_clearing_it_lifts_the_taint(
    config: DiscoveryConfig, kube: APIServerEmulator, node: None, bus: Bus
):
    async with running(DiscoveryAgent(config, backend=sim.SimBackend.from_profile("mixed"))):
        await eventually(lambda: device(kube, "npu-3"))
        assert taints_of(kube, "npu-3") == []
        assert scheduler.allocate(_claim(8), classes=NPU_CLASS, slices=ours(kube))
        writes = slice_writes(kube)

        await put_record(bus, "npu-3", _taint(at_ms=1_735_689_600_000))
        (taint,) = await eventually(lambda: taints_of(kube, "npu-3"))
        assert taint == {
            "key": KEY,
            "value": "xid-79",
            "effect": "NoSchedule",
            "timeAdded": "2025-01-01T00:00:00Z",
        }
        assert slice_writes(kube) == writes + 1  # one update of the slice that holds npu-3
        assert generations(kube) == {1}
        # The scheduler stand-in leaves the tainted NPU alone.
        with pytest.raises(scheduler.UnsatisfiableError):
            scheduler.allocate(_claim(8), classes=NPU_CLASS, slices=ours(kube))
        picked = scheduler.allocate(_claim(7), classes=NPU_CLASS, slices=ours(kube))
        assert "npu-3" not in {p.device for p in picked}

        # The health agent refreshes its record: same taints, nothing to write.
        await put_record(bus, "npu-3", _taint(at_ms=1_735_689_600_000), refreshed=5000)
        await asyncio.sleep(0.5)
        assert slice_writes(kube) == writes + 1

        await put_record(bus, "npu-3")  # healthy again: no taints
        await eventually(lambda: device(kube, "npu-3") and not taints_of(kube, "npu-3"))
        assert slice_writes(kube) == writes + 2
        assert scheduler.allocate(_claim(8), classes=NPU_CLASS, slices=ours(kube))


async def test_a_deleted_record_lifts_the_taint_and_a_malformed_one_changes_nothing(
    config: DiscoveryConfig, kube: APIServerEmulator, node: None, bus: Bus
):
    async with running(DiscoveryAgent(config, backend=sim.SimBackend.from_profile("mixed"))):
        await put_record(bus, "npu-1", _taint("NoExecute"), _taint(key="sim.dra-suite.io/drain"))
        found = await eventually(lambda: taints_of(kube, "npu-1"))
        assert [(t["key"], t["effect"]) for t in found] == [
            (KEY, "NoExecute"),
            ("sim.dra-suite.io/drain", "NoSchedule"),
        ]
        assert all(t["timeAdded"] for t in found)  # set by the server
        writes = slice_writes(kube)
        key = bus.names.health_key(DRIVER, NODE, "npu-1")
        await bus.kv_put(bus.names.health_bucket, key, b"\xff\x00not a record")
        await put_record(bus, "npu-2", _taint(effect="Sometimes"))  # a taint the API refuses
        await put_record(bus, "npu-3", _taint(at_ms=2**63 - 1))  # no RFC 3339 time
        await asyncio.sleep(0.5)
        assert slice_writes(kube) == writes
        assert taints_of(kube, "npu-1") == found
        assert taints_of(kube, "npu-2") == []
        assert taints_of(kube, "npu-3") == []

        await bus.kv_delete(bus.names.health_bucket, key)
        await eventually(lambda: device(kube, "npu-1") and not taints_of(kube, "npu-1"))


async def test_a_taint_on_a_large_pool_rewrites_only_its_slice(
    config: DiscoveryConfig, kube: APIServerEmulator, node: None, bus: Bus
):
    devices = [
        SimDevice(name=f"dev-{i:03d}", kind="sim", attributes={"index": i}) for i in range(200)
    ]
    async with running(DiscoveryAgent(config, backend=sim.SimBackend(devices))):
        # Laid out for taints from the start: 64 per slice, so a taint never moves devices.
        found = await eventually(lambda: ours(kube) if len(ours(kube)) == 4 else None)
        assert sorted(len(s["spec"]["devices"]) for s in found) == [8, 64, 64, 64]
        before = {s["metadata"]["name"]: s["metadata"]["resourceVersion"] for s in found}
        await put_record(bus, "dev-100", _taint())
        await eventually(lambda: taints_of(kube, "dev-100"))
        after = {s["metadata"]["name"]: s["metadata"]["resourceVersion"] for s in ours(kube)}
    assert after.keys() == before.keys()
    assert sum(after[name] != before[name] for name in before) == 1
    assert generations(kube) == {1}


@pytest.mark.parametrize(
    ("kube", "effects"),
    [
        pytest.param("1.34", ["NoSchedule"], id="1.34"),
        pytest.param("1.36", ["NoSchedule", "None"], id="1.36"),
    ],
    indirect=["kube"],
)
async def test_the_none_effect_is_published_where_the_server_accepts_it(
    config: DiscoveryConfig, kube: APIServerEmulator, node: None, bus: Bus, effects: list[str]
):
    async with running(DiscoveryAgent(config, backend=sim.SimBackend.from_profile("mixed"))):
        await put_record(bus, "gpu-0", _taint("None", key="sim.dra-suite.io/info"), _taint())
        await eventually(lambda: taints_of(kube, "gpu-0"))
        await asyncio.sleep(0.3)
    assert [t["effect"] for t in taints_of(kube, "gpu-0")] == effects
    assert kube.objects("events", namespace="default") == []


@pytest.mark.parametrize(
    "kube", [ClusterConfig.for_tests("1.35", DRADeviceTaints=False)], indirect=True
)
async def test_with_the_taint_gate_off_the_dropped_taints_are_reported_once_and_not_retried(
    config: DiscoveryConfig, kube: APIServerEmulator, node: None, bus: Bus
):
    async with running(DiscoveryAgent(config, backend=sim.SimBackend.from_profile("mixed"))):
        await eventually(lambda: device(kube, "npu-3"))
        await put_record(bus, "npu-3", _taint())
        (event,) = await eventually(lambda: kube.objects("events", namespace="default"))
        writes = slice_writes(kube)
        await asyncio.sleep(0.5)
        assert slice_writes(kube) == writes
    assert event["reason"] == "ResourceSliceFieldsDropped"
    assert "DRADeviceTaints" in event["message"]
    assert taints_of(kube, "npu-3") == []


async def _private_bus(server: NATSServerProcess, namespace: str) -> tuple[Bus, asyncio.Task[None]]:
    bus = Bus(NATSSettings(url=server.url, namespace=namespace), name="probe")
    task = asyncio.create_task(bus.run())
    await asyncio.wait_for(bus.connected.wait(), 10)
    return bus, task


async def test_a_restart_with_nats_down_keeps_the_published_taints(
    nats_server_factory: Callable[[], NATSServerProcess],
    kube_settings: KubeSettings,
    kube: APIServerEmulator,
    node: None,
):
    server = nats_server_factory()
    settings = NATSSettings(url=server.url, namespace="taints", connect_timeout_s=0.5)
    config = DiscoveryConfig(
        node_name=NODE, nats=settings, kube=kube_settings, publish_device_taints=True
    )
    probe, task = await _private_bus(server, "taints")
    try:
        async with running(DiscoveryAgent(config, backend=sim.SimBackend.from_profile("mixed"))):
            await put_record(probe, "npu-5", _taint())
            published = await eventually(lambda: taints_of(kube, "npu-5"))
    finally:
        await probe.close()
        task.cancel()
    server.stop()
    writes = slice_writes(kube)
    restarted = dataclasses.replace(config)
    async with running(DiscoveryAgent(restarted, backend=sim.SimBackend.from_profile("mixed"))):
        await asyncio.sleep(0.5)
        assert taints_of(kube, "npu-5") == published  # not lifted while unconfirmed
        assert slice_writes(kube) == writes
        server.start()  # the record is still in the KV: the taint stays
        await asyncio.sleep(1.0)
        assert taints_of(kube, "npu-5") == published
    assert slice_writes(kube) == writes
