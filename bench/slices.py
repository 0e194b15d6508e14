"""ResourceSlice publishing figures: steady-state writes, change latency, recreate latency,
and the publish of a full partitioned pool.

The discovery agent runs in this process against a real nats-server and the API emulator;
latencies are taken from the emulator's own store events (no polling), writes from its
request log.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import time
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from bench.stats import percentile
from devcluster.apiserver import APIServerEmulator, ClusterConfig
from devcluster.natsserver import NATSServerProcess
from services.discovery.agent import DiscoveryAgent
from services.discovery.config import DiscoveryConfig
from shared.config import KubeSettings, NATSSettings
from shared.pb.drasuite.v1 import inventory_pb2
from shared.sim.profile import SimDevice
from shared.supervisor import run_agent
from shared.vendors.parts.discovery import DeviceBackend, Scan
from shared.vendors.sim.discovery import SimBackend

__all__ = ["measure_slices"]

NODE = "bench-node"
DRIVER = "sim.dra-suite.io"
_WRITES = ("create", "update", "patch", "delete", "deletecollection")


@dataclass
class _Rig:
    server: APIServerEmulator
    agent: DiscoveryAgent
    publish_s: float
    """From the agent's start to its first complete slice sync."""

    def slice_writes(self) -> int:
        log = self.server.request_log
        return sum(log.count(verb=verb, resource="resourceslices") for verb in _WRITES)

    def devices(self) -> set[str]:
        return {
            device["name"]
            for item in self.server.objects("resourceslices")
            for device in item["spec"].get("devices", [])
        }

    async def until(self, condition: Callable[[], bool], *, timeout_s: float = 10.0) -> float:
        """Seconds until `condition` holds, woken by every ResourceSlice change in the store."""
        start = time.perf_counter()
        slices = self.server.registry.for_plural("resourceslices")
        assert slices is not None  # resource.k8s.io/v1 is served by every emulated version
        watcher = self.server.store.subscribe(slices.storage)
        try:
            async with asyncio.timeout(timeout_s):
                while not condition():
                    await watcher.queue.get()
        finally:
            self.server.store.unwatch(watcher)
        return time.perf_counter() - start


@contextlib.asynccontextmanager
async def _running(
    workdir: Path, *, backend: DeviceBackend, config: ClusterConfig
) -> AsyncIterator[_Rig]:
    nats = NATSServerProcess(workdir / "nats")
    await asyncio.to_thread(nats.start)
    stop = asyncio.Event()
    try:
        async with APIServerEmulator(config) as server:
            server.create_object({"apiVersion": "v1", "kind": "Node", "metadata": {"name": NODE}})
            agent_config = DiscoveryConfig(
                nats=NATSSettings(url=nats.url),
                kube=KubeSettings(kubeconfig=str(server.write_kubeconfig(workdir / "kc.yaml"))),
                node_name=NODE,
                driver_name=DRIVER,
            )
            agent = DiscoveryAgent(agent_config, backend=backend)
            started = time.perf_counter()
            runner = asyncio.create_task(
                run_agent(agent, grace_s=5, stop=stop, handle_signals=False)
            )
            try:
                await asyncio.wait_for(agent.published.wait(), 30)
                yield _Rig(server=server, agent=agent, publish_s=time.perf_counter() - started)
            finally:
                stop.set()
                await runner
    finally:
        await asyncio.to_thread(nats.stop)


async def _steady_and_changes(workdir: Path, *, steady_s: float, changes: int) -> dict[str, Any]:
    backend = SimBackend.from_profile("mixed")
    async with _running(workdir / "sim", backend=backend, config=ClusterConfig.for_tests()) as rig:
        await asyncio.sleep(1.0)  # let the first sync settle
        before = rig.slice_writes()
        await asyncio.sleep(steady_s)
        steady_writes = rig.slice_writes() - before

        change_ms = []
        for i in range(changes):
            name = f"hotplug-{i}"
            backend.add_device(_hotplug_device(name))
            change_ms.append(await rig.until(functools.partial(_has_device, rig, name)) * 1000)

        recreate_ms = []
        for _ in range(max(5, changes // 2)):
            expected = rig.devices()
            for item in rig.server.objects("resourceslices"):
                rig.server.delete_object("resourceslices", item["metadata"]["name"])
            recreate_ms.append(
                await rig.until(functools.partial(_has_exactly, rig, expected)) * 1000
            )
    return {
        "slice_steady_writes_60s": round(steady_writes * 60 / steady_s),
        "slice_change_p50_ms": round(percentile(change_ms, 50), 2),
        "slice_change_p99_ms": round(percentile(change_ms, 99), 2),
        "slice_recreate_p50_ms": round(percentile(recreate_ms, 50), 2),
        "slice_recreate_p99_ms": round(percentile(recreate_ms, 99), 2),
    }


def _has_device(rig: _Rig, name: str) -> bool:
    return name in rig.devices()


def _has_exactly(rig: _Rig, devices: set[str]) -> bool:
    return rig.devices() == devices


def _hotplug_device(name: str) -> SimDevice:
    return SimDevice(
        name=name,
        kind="npu",
        attributes={"type": "npu", "chipName": "910B4", "numaNode": 0, "index": 100},
        capacity={"memCapacity": "32Gi"},
    )


class _FixedBackend:
    """A backend whose devices never change: the full pool of `_mig_pool()`."""

    name = "bench"

    def __init__(self, scan: Scan) -> None:
        self.changed = asyncio.Event()
        self._scan = scan

    async def scan(self) -> Scan:
        return self._scan

    async def watch(self) -> None:
        await asyncio.Event().wait()


# H100-like MIG geometry: 7 compute slices, 8 memory slices per GPU (docs/hardware.md §1.1/1.2).
_PROFILES = (
    ("1g-10gb", 1, 1, 7),
    ("2g-20gb", 2, 2, 3),
    ("3g-40gb", 3, 4, 2),
    ("4g-40gb", 4, 4, 1),
    ("7g-80gb", 7, 8, 1),
    ("1g-20gb", 1, 2, 4),
    ("whole", 7, 8, 1),
)


def _mig_pool(gpus: int = 8) -> Scan:
    """8 GPUs x 7 profiles' placements, each consuming from its GPU's counter set."""
    devices, counter_sets = [], []
    for gpu in range(gpus):
        counter_set = f"gpu-{gpu}-slices"
        counters = {f"compute-slice-{i}": "1" for i in range(7)}
        counters |= {f"memory-slice-{i}": "1" for i in range(8)}
        counter_sets.append(inventory_pb2.CounterSet(name=counter_set, counters=counters))
        for profile, compute, memory, placements in _PROFILES:
            for placement in range(placements):
                first_c, first_m = placement * compute, placement * memory
                used = {
                    f"compute-slice-{i}": "1" for i in range(first_c, min(7, first_c + compute))
                }
                used |= {f"memory-slice-{i}": "1" for i in range(first_m, min(8, first_m + memory))}
                devices.append(
                    inventory_pb2.Device(
                        name=f"gpu-{gpu}-{profile}-{placement}"
                        if profile != "whole"
                        else f"gpu-{gpu}",
                        kind="gpu",
                        attributes={
                            "profile": inventory_pb2.AttributeValue(string=profile),
                            "index": inventory_pb2.AttributeValue(int=gpu),
                        },
                        capacity={"memory": f"{memory * 10}Gi"},
                        consumes_counters=[
                            inventory_pb2.CounterConsumption(counter_set=counter_set, counters=used)
                        ],
                    )
                )
    return Scan(devices=tuple(devices), shared_counters=tuple(counter_sets))


async def _full_pool(workdir: Path) -> dict[str, Any]:
    scan = _mig_pool()
    config = ClusterConfig.for_tests("1.36")
    async with _running(workdir / "pool", backend=_FixedBackend(scan), config=config) as rig:
        elapsed_ms = rig.publish_s * 1000
        published = rig.devices()
        writes = rig.slice_writes()
    if len(published) != len(scan.devices):
        raise RuntimeError(f"full pool published {len(published)} of {len(scan.devices)} devices")
    return {
        "slice_full_pool_devices": len(scan.devices),
        "slice_full_pool_publish_ms": round(elapsed_ms, 1),
        "slice_full_pool_writes": writes,
    }


async def measure_slices(*, workdir: Path, steady_s: float, changes: int) -> dict[str, Any]:
    results = await _steady_and_changes(workdir, steady_s=steady_s, changes=changes)
    results |= await _full_pool(workdir)
    return results
