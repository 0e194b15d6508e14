"""Health figures against the real local stack: fault-to-taint and fault-to-kubelet latency,
flap damping.

nats-server, the API emulator and the agents run as separate processes (LocalStack), the
health agent with its default policy (recovery hold and flap window). `fault_to_taint_*`:
from sending a sim fault command to the DeviceTaintRule's ADDED event on a watch of the
emulator; devices are used in turn and reused only once their rule is gone again.
`fault_to_kubelet_*`: from the same command to the first NodeWatchResources message showing
the device Unhealthy at the kubelet emulator (registered with the allocation agent).
`flap_taint_writes`: one device faulting and recovering every 100 ms for 30 s, then left
healthy until its rule is deleted; the DeviceTaintRule writes in the emulator's request log.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections import defaultdict
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import aiohttp
import yaml

from bench.stats import percentile
from devcluster import flow
from devcluster.kubelet import KubeletEmulator
from devcluster.stack import LocalStack, StackConfig
from shared.bus import codec
from shared.bus.connection import Bus
from shared.bus.session import open_bus
from shared.errors import BusUnavailableError
from shared.kube.client import KubeClient, WatchEvent
from shared.kube.resources import RESOURCE_GROUP, ResourceType, device_taint_rules
from shared.kube.watch import reflect
from shared.pb.drasuite.v1 import health_pb2
from shared.pb.kubelet.drahealth.v1alpha1 import api_pb2 as kubelet_health

__all__ = ["HealthFigures", "measure_health"]

_WRITE_VERBS = {"create", "update", "patch", "delete"}


@dataclass(frozen=True, slots=True)
class HealthFigures:
    fault_to_taint_ms: list[float]
    fault_to_kubelet_ms: list[float]
    flap_taint_writes: int
    flap_s: float

    def as_results(self) -> dict[str, float]:
        samples, kubelet = self.fault_to_taint_ms, self.fault_to_kubelet_ms
        return {
            "fault_to_taint_p50_ms": round(percentile(samples, 50), 3),
            "fault_to_taint_p99_ms": round(percentile(samples, 99), 3),
            "fault_to_taint_samples": len(samples),
            "fault_to_kubelet_p50_ms": round(percentile(kubelet, 50), 3),
            "fault_to_kubelet_p99_ms": round(percentile(kubelet, 99), 3),
            "flap_taint_writes": self.flap_taint_writes,
            "flap_duration_s": self.flap_s,
        }


class RuleWatch:
    """When each device's DeviceTaintRule appeared and disappeared, from a watch."""

    def __init__(self) -> None:
        self.added: dict[str, asyncio.Event] = defaultdict(asyncio.Event)
        self.added_at: dict[str, float] = {}
        self.present: set[str] = set()
        self.gone: dict[str, asyncio.Event] = defaultdict(asyncio.Event)

    async def run(self, kube: KubeClient, rt: ResourceType) -> None:
        async for item in reflect(kube, rt):
            if not isinstance(item, WatchEvent):
                for rule in item.items:
                    self._seen(rule)
                continue
            device = _device(item.object)
            if item.type == "ADDED":
                self.added_at.setdefault(device, time.perf_counter())
                self._seen(item.object)
            elif item.type == "DELETED":
                self.present.discard(device)
                self.gone[device].set()

    def _seen(self, rule: dict[str, Any]) -> None:
        device = _device(rule)
        self.present.add(device)
        self.gone[device].clear()
        self.added[device].set()

    def expect(self, device: str) -> None:
        self.added[device].clear()
        self.added_at.pop(device, None)


class KubeletWatch:
    """When each device first showed Unhealthy on the kubelet's health stream, per round."""

    def __init__(self) -> None:
        self.unhealthy_at: dict[str, float] = {}
        self.latest: dict[str, int] = {}
        self._changed = asyncio.Event()

    async def run(self, kubelet: KubeletEmulator) -> None:
        async for message in kubelet.watch_health():
            now = time.perf_counter()
            for entry in message.devices:
                device = entry.device.device_name
                if entry.health == kubelet_health.UNHEALTHY:
                    self.unhealthy_at.setdefault(device, now)
                self.latest[device] = entry.health
            self._changed.set()

    async def _until(self, check: Callable[[], bool], timeout_s: float) -> None:
        async with asyncio.timeout(timeout_s):
            while not check():
                self._changed.clear()
                await self._changed.wait()

    async def expect(self, device: str) -> None:
        """Forget the device's last round once the stream shows it healthy again."""
        await self._until(lambda: self.latest.get(device) == kubelet_health.HEALTHY, 60)
        self.unhealthy_at.pop(device, None)

    async def unhealthy(self, device: str) -> float:
        await self._until(lambda: device in self.unhealthy_at, 10)
        return self.unhealthy_at[device]


def _device(rule: dict[str, Any]) -> str:
    return str((rule.get("spec") or {}).get("deviceSelector", {}).get("device", ""))


async def _rule_type(kube: KubeClient) -> ResourceType:
    served = await kube.served_versions(RESOURCE_GROUP)
    for version in ("v1", "v1beta2", "v1alpha3"):
        if version in served:
            rt = device_taint_rules(version)
            with contextlib.suppress(Exception):
                await kube.list(rt)
                return rt
    raise RuntimeError(f"no served version of {RESOURCE_GROUP} has devicetaintrules")


async def _command(bus: Bus, config: StackConfig, device: str, *, clear: bool) -> None:
    command = health_pb2.FaultCommand(device=device, clear=clear, cause="xid", code="79")
    subject = bus.names.fault_control(config.driver_name, config.node_name)
    for _ in range(100):
        try:
            await bus.request(subject, codec.encode(command), timeout_s=5.0)
            return
        except BusUnavailableError:  # the agent has not subscribed yet
            await asyncio.sleep(0.1)
    raise RuntimeError(f"no health agent answers on {subject}")


async def _latencies(
    bus: Bus,
    config: StackConfig,
    watches: tuple[RuleWatch, KubeletWatch],
    devices: list[str],
    samples: int,
) -> tuple[list[float], list[float]]:
    """Per sample: (fault to taint, fault to kubelet Unhealthy) in ms."""
    watch, kubelet = watches
    to_taint: list[float] = []
    to_kubelet: list[float] = []
    for i in range(samples):
        device = devices[i % len(devices)]
        if device in watch.present:  # the rule of its last round is still held back
            await asyncio.wait_for(watch.gone[device].wait(), 60)
        watch.expect(device)
        await kubelet.expect(device)
        start = time.perf_counter()
        await _command(bus, config, device, clear=False)
        to_kubelet.append((await kubelet.unhealthy(device) - start) * 1000)
        await asyncio.wait_for(watch.added[device].wait(), 10)
        to_taint.append((watch.added_at[device] - start) * 1000)
        await _command(bus, config, device, clear=True)
    return to_taint, to_kubelet


async def _flap(
    bus: Bus, config: StackConfig, watch: RuleWatch, device: str, *, duration_s: float
) -> None:
    if device in watch.present:
        await asyncio.wait_for(watch.gone[device].wait(), 60)
    end = time.monotonic() + duration_s
    faulty = False
    while time.monotonic() < end:
        faulty = not faulty
        await _command(bus, config, device, clear=not faulty)
        await asyncio.sleep(0.1)
    await _command(bus, config, device, clear=True)
    await asyncio.wait_for(watch.gone[device].wait(), 60)
    await asyncio.sleep(1.0)  # any late write would show up now


async def _taint_writes(server: str, *, clear: bool = False) -> int:
    url = f"{server}/_emulator/requests"
    async with aiohttp.ClientSession() as http:
        if clear:
            async with http.delete(url) as answer:
                answer.raise_for_status()
            return 0
        async with http.get(url, params={"resource": "devicetaintrules"}) as answer:
            answer.raise_for_status()
            items = (await answer.json())["items"]
    return sum(1 for r in items if r["verb"] in _WRITE_VERBS)


async def measure_health(
    *, workdir: Path, samples: int = 60, flap_s: float = 30.0
) -> HealthFigures:
    config = StackConfig(workdir=workdir / "health", node_name="bench-node", log_level="warning")
    async with LocalStack(config) as stack:
        server = yaml.safe_load(config.kubeconfig.read_text())["clusters"][0]["cluster"]["server"]
        async with open_bus(stack.nats_settings) as bus, stack.kube() as kube:
            inventory = await flow.wait_inventory(
                bus, driver=config.driver_name, node=config.node_name
            )
            devices = [d.name for d in inventory.devices]
            watch, stream = RuleWatch(), KubeletWatch()
            kubelet = KubeletEmulator(config.registry_dir)
            await kubelet.register(driver=config.driver_name, timeout_s=30)
            watcher = asyncio.create_task(watch.run(kube, await _rule_type(kube)))
            streamer = asyncio.create_task(stream.run(kubelet))
            try:
                latencies, to_kubelet = await _latencies(
                    bus, config, (watch, stream), devices[1:], samples
                )
                for device in list(watch.present):  # only the flapping device writes from here
                    await asyncio.wait_for(watch.gone[device].wait(), 60)
                await _taint_writes(server, clear=True)
                await _flap(bus, config, watch, devices[0], duration_s=flap_s)
                writes = await _taint_writes(server)
            finally:
                for task in (watcher, streamer):
                    task.cancel()
                    with contextlib.suppress(asyncio.CancelledError):
                        await task
                await kubelet.close()
    return HealthFigures(
        fault_to_taint_ms=latencies,
        fault_to_kubelet_ms=to_kubelet,
        flap_taint_writes=writes,
        flap_s=flap_s,
    )
