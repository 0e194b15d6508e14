"""A node whose allocation agent serves the device-plugin front, for integration tests.

Real nats-server (the session fixture, a private namespace), real grpc.aio over unix sockets
in a short private directory, and the device-plugin kubelet emulator. Helpers play the
discovery agent (inventory KV, from a sim profile) and the health agent (health KV).
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import json
from collections.abc import AsyncIterator, Sequence
from pathlib import Path
from typing import Any

from devcluster.deviceplugin_kubelet import DevicePluginKubelet
from services.allocation.config import AllocationConfig
from services.allocation.deviceplugin import container_devices
from services.allocation.deviceplugin.agent import DevicePluginAgent
from shared.bus import codec
from shared.bus.connection import Bus
from shared.config import NATSSettings
from shared.pb.drasuite.v1 import health_pb2, inventory_pb2
from shared.supervisor import run_agent
from shared.vendors.sim.discovery import SimBackend

DRIVER = "sim.dra-suite.io"
NODE = "node-a"
NPU = f"{DRIVER}/npu"
GPU = f"{DRIVER}/gpu"


class DevicePluginNode:
    def __init__(self, base: Path, *, nats: NATSSettings, bus: Bus, node: str = NODE) -> None:
        self.base = base
        self.bus = bus
        self.node = node
        self._generation = 0
        self.config = AllocationConfig(
            nats=nats,
            node_name=node,
            driver_name=DRIVER,
            kubelet_api="device-plugin",
            plugin_registry_dir=base / "registry",
            plugin_data_dir=base / "plugins" / DRIVER,
            device_plugin_dir=base / "device-plugins",
            cdi_root=base / "cdi",
        )
        self.kubelet = DevicePluginKubelet(self.config.device_plugin_dir)

    @contextlib.asynccontextmanager
    async def agent(self, **changes: Any) -> AsyncIterator[DevicePluginAgent]:
        """The agent under `run_agent` until the block ends; it must then exit 0."""
        agent = DevicePluginAgent(dataclasses.replace(self.config, **changes))
        stop = asyncio.Event()
        task = asyncio.create_task(
            run_agent(agent, grace_s=5, stop=stop, handle_signals=False), name="dp-agent"
        )
        ready = asyncio.create_task(agent.ready.wait())
        await asyncio.wait({task, ready}, timeout=10, return_when=asyncio.FIRST_COMPLETED)
        ready.cancel()
        if task.done() or not agent.ready.is_set():
            stop.set()
            raise AssertionError(f"agent did not get ready (exit {await task})")
        try:
            yield agent
        finally:
            stop.set()
            assert await asyncio.wait_for(task, 10) == 0

    async def publish_profile(self, profile: str) -> inventory_pb2.Inventory:
        """What discovery publishes for a sim profile."""
        scan = await SimBackend.from_profile(profile).scan()
        return await self.publish_devices(scan.devices)

    async def publish_devices(
        self, devices: Sequence[inventory_pb2.Device], *, backend: str = "sim"
    ) -> inventory_pb2.Inventory:
        self._generation += 1
        inventory = inventory_pb2.Inventory(
            driver=DRIVER,
            node=self.node,
            pool=self.node,
            backend=backend,
            generation=self._generation,
            devices=devices,
        )
        key = self.bus.names.inventory_key(DRIVER, self.node)
        await self.bus.kv_put(self.bus.names.inventory_bucket, key, codec.encode(inventory))
        return inventory

    async def publish_health(
        self, device: str, state: health_pb2.HealthState.ValueType, *, message: str = ""
    ) -> None:
        record = health_pb2.DeviceHealth(
            driver=DRIVER,
            node=self.node,
            pool=self.node,
            device=device,
            state=state,
            message=message,
            updated_unix_ms=1_700_000_000_000,
        )
        key = self.bus.names.health_key(DRIVER, self.node, device)
        await self.bus.kv_put(self.bus.names.health_bucket, key, codec.encode(record))

    def spec(self) -> dict[str, Any] | None:
        """The static CDI spec on disk."""
        path = self.config.cdi_root / container_devices.spec_file_name(DRIVER)
        if not path.exists():
            return None
        spec: dict[str, Any] = json.loads(path.read_text())
        return spec

    def resolve(self, cdi_name: str) -> dict[str, Any]:
        """A CDI device name resolved against the specs on disk, as a runtime would."""
        kind, _, name = cdi_name.partition("=")
        for path in sorted(self.config.cdi_root.glob("*.json")):
            spec = json.loads(path.read_text())
            if spec["kind"] == kind:
                for device in spec["devices"]:
                    if device["name"] == name:
                        found: dict[str, Any] = device
                        return found
        raise AssertionError(f"CDI device {cdi_name} is in no spec under {self.config.cdi_root}")
