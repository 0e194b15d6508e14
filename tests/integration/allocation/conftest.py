"""The allocation agent in-process against real NATS, real gRPC sockets and the API emulator.

`plugin_node` gives a node: its kubelet dirs and CDI root in a short private directory (a unix
socket path must fit in 107 bytes, which pytest's tmp_path does not guarantee), agent configs,
and helpers that play the other agents (inventory and health KV) and the scheduler (claims).
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import gc
import json
import os
import shutil
import sys
import tempfile
from collections.abc import AsyncIterator, Callable, Sequence
from pathlib import Path
from typing import Any

import pytest

from devcluster.apiserver import APIServerEmulator
from devcluster.kubelet import KubeletClaim, KubeletEmulator
from devcluster.processes import ChildProcess
from services.allocation.cdi import spec_files
from services.allocation.claim.checkpoint import CheckpointStore
from services.allocation.cli import CRASH_AT_ENV
from services.allocation.config import AllocationConfig
from services.allocation.dra.agent import AllocationAgent
from shared.bus import codec
from shared.bus.connection import Bus
from shared.config import KubeSettings, NATSSettings
from shared.pb.drasuite.v1 import health_pb2, inventory_pb2
from shared.supervisor import run_agent
from shared.vendors import sim
from shared.vendors.sim.discovery import SimBackend

DRIVER = "sim.dra-suite.io"
NODE = "node-a"


class PluginNode:
    def __init__(
        self,
        base: Path,
        *,
        nats: NATSSettings,
        kube: KubeSettings,
        api: APIServerEmulator,
        bus: Bus,
    ) -> None:
        self.api = api
        self.bus = bus
        self.base = base
        self._generation = 0
        self.config = AllocationConfig(
            nats=nats,
            kube=kube,
            node_name=NODE,
            driver_name=DRIVER,
            plugin_registry_dir=base / "registry",
            plugin_data_dir=base / "plugins" / DRIVER,
            cdi_root=base / "cdi",
            health_resend_interval_s=0.3,
        )

    @contextlib.asynccontextmanager
    async def agent(self, **changes: Any) -> AsyncIterator[AllocationAgent]:
        """The agent under `run_agent` until the block ends; it must then exit 0."""
        agent = AllocationAgent(dataclasses.replace(self.config, **changes))
        stop = asyncio.Event()
        task = asyncio.create_task(
            run_agent(agent, grace_s=5, stop=stop, handle_signals=False), name="allocation-agent"
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

    @contextlib.asynccontextmanager
    async def registered(
        self, *, known_versions: Sequence[str] | None = None, **changes: Any
    ) -> AsyncIterator[tuple[AllocationAgent, KubeletEmulator]]:
        """A running agent registered with a kubelet emulator."""
        async with self.agent(**changes) as agent:
            kubelet = (
                KubeletEmulator(self.config.plugin_registry_dir)
                if known_versions is None
                else KubeletEmulator(self.config.plugin_registry_dir, known_versions=known_versions)
            )
            try:
                await kubelet.register(driver=DRIVER)
                yield agent, kubelet
            finally:
                await kubelet.close()

    def process(
        self,
        *,
        crash_at: str = "",
        rolling_update_uid: str = "",
        name: str = "allocation",
        extra_args: Sequence[str] = (),
    ) -> ChildProcess:
        """The agent as a real process (`python -m services.allocation`) with this node's flags.

        `crash_at` sets the fault-injection seam (`DRA_SUITE_CRASH_AT`): the process exits 137
        at that step, as kill -9 would leave it.
        """
        config = self.config
        argv = [
            sys.executable,
            "-m",
            "services.allocation",
            *("--node-name", NODE, "--driver-name", DRIVER, "--backend", "sim"),
            *("--nats-url", config.nats.url, "--nats-namespace", config.nats.namespace),
            *("--kubeconfig", config.kube.kubeconfig, "--log-format", "console"),
            *("--plugin-registry-dir", str(config.plugin_registry_dir)),
            *("--plugin-data-dir", str(config.data_dir), "--cdi-root", str(config.cdi_root)),
            *("--health-resend-interval-s", "0.3", "--replaced-claim-wait-s", "1"),
        ]
        if rolling_update_uid:
            argv += ["--rolling-update-uid", rolling_update_uid]
        argv += extra_args
        env = {k: v for k, v in os.environ.items() if k != CRASH_AT_ENV}
        if crash_at:
            env[CRASH_AT_ENV] = crash_at
        return ChildProcess(
            name=name, argv=argv, log_path=self.base / "logs" / f"{name}.log", env=env
        )

    def partitions(self) -> list[dict[str, Any]]:
        """The sim partition state file's entries, as on disk."""
        path = self.config.data_dir / sim.STATE_FILE
        if not path.exists():
            return []
        entries: list[dict[str, Any]] = json.loads(path.read_text())["partitions"]
        return entries

    def checkpoint_files(self) -> list[str]:
        return sorted(p.name for p in self.config.checkpoint_dir.iterdir())

    def cdi_files(self) -> list[str]:
        return sorted(p.name for p in self.config.cdi_root.iterdir())

    def stored(self) -> CheckpointStore:
        """The checkpoint as a freshly started agent would read it."""
        store = CheckpointStore(self.config.checkpoint_dir)
        store.load()
        return store

    def log(self, name: str = "allocation") -> str:
        path = self.base / "logs" / f"{name}.log"
        return path.read_text(errors="replace") if path.exists() else ""

    async def publish_inventory(self, *names: str) -> inventory_pb2.Inventory:
        """What the discovery agent would put in the inventory KV: Ascend-like sim devices, with
        the next generation (as discovery counts content changes)."""
        self._generation += 1
        inventory = inventory_pb2.Inventory(
            driver=DRIVER,
            node=NODE,
            pool=NODE,
            backend="sim",
            generation=self._generation,
            devices=[
                inventory_pb2.Device(
                    name=name,
                    kind="npu",
                    attributes={"index": inventory_pb2.AttributeValue(int=int(name[-1]))},
                    device_nodes=[
                        inventory_pb2.DeviceNode(
                            path=f"/dev/davinci{name[-1]}", host_path="/dev/null"
                        )
                    ],
                    env={"ASCEND_VISIBLE_DEVICES": name[-1]},
                )
                for name in names
            ],
        )
        key = self.bus.names.inventory_key(DRIVER, NODE)
        await self.bus.kv_put(self.bus.names.inventory_bucket, key, codec.encode(inventory))
        return inventory

    async def publish_profile(self, profile: str) -> inventory_pb2.Inventory:
        """What the discovery agent publishes for a shipped sim profile (devices and shared
        counters), with the next generation."""
        scan = await SimBackend.from_profile(profile).scan()
        self._generation += 1
        inventory = inventory_pb2.Inventory(
            driver=DRIVER,
            node=NODE,
            pool=NODE,
            backend="sim",
            generation=self._generation,
            devices=scan.devices,
            shared_counters=scan.shared_counters,
        )
        key = self.bus.names.inventory_key(DRIVER, NODE)
        await self.bus.kv_put(self.bus.names.inventory_bucket, key, codec.encode(inventory))
        return inventory

    async def publish_health(
        self, device: str, state: health_pb2.HealthState.ValueType, *, message: str = ""
    ) -> None:
        """What the health agent would put in the health KV."""
        record = health_pb2.DeviceHealth(
            driver=DRIVER,
            node=NODE,
            pool=NODE,
            device=device,
            state=state,
            message=message,
            updated_unix_ms=1_700_000_000_000,
        )
        key = self.bus.names.health_key(DRIVER, NODE, device)
        await self.bus.kv_put(self.bus.names.health_bucket, key, codec.encode(record))

    def allocate(
        self,
        name: str,
        devices: Sequence[str],
        *,
        allocated: bool = True,
        parameters: dict[str, Any] | None = None,
        pods: dict[str, str] | None = None,
    ) -> KubeletClaim:
        """Create a ResourceClaim and allocate `devices` of our pool to it, as the scheduler.

        `parameters`: an opaque DeviceConfig of this driver, as a claim config for every request.
        `pods`: name -> uid of the pods it is reserved for (`status.reservedFor`).
        """
        created = self.api.create_object(
            {
                "apiVersion": "resource.k8s.io/v1",
                "kind": "ResourceClaim",
                "metadata": {"name": name, "namespace": "default"},
                "spec": {"devices": {"requests": [_request(max(len(devices), 1))]}},
            }
        )
        if allocated:
            results = [
                {"request": "npu", "driver": DRIVER, "pool": NODE, "device": device}
                for device in devices
            ]
            allocation: dict[str, Any] = {"results": results}
            if parameters is not None:
                allocation["config"] = [
                    {
                        "source": "FromClaim",
                        "requests": [],
                        "opaque": {"driver": DRIVER, "parameters": parameters},
                    }
                ]
            created["status"] = {"allocation": {"devices": allocation}}
            if pods:
                created["status"]["reservedFor"] = [
                    {"resource": "pods", "name": name, "uid": uid} for name, uid in pods.items()
                ]
            created = self.api.update_object(created, status=True)
        return KubeletClaim(namespace="default", name=name, uid=created["metadata"]["uid"])

    def spec(self, uid: str) -> dict[str, Any] | None:
        """The CDI spec of a claim on disk, or None."""
        path = self.config.cdi_root / spec_files.spec_file_name(DRIVER, uid)
        if not path.exists():
            return None
        spec: dict[str, Any] = json.loads(path.read_text())
        return spec

    @staticmethod
    async def eventually(check: Callable[[], bool], *, timeout_s: float = 10.0) -> None:
        async with asyncio.timeout(timeout_s):
            while True:
                if check():
                    return
                await asyncio.sleep(0.02)


def _request(count: int) -> dict[str, Any]:
    return {
        "name": "npu",
        "exactly": {
            "deviceClassName": f"npu.{DRIVER}",
            "allocationMode": "ExactCount",
            "count": count,
        },
    }


@pytest.fixture
async def plugin_node(
    nats_settings: NATSSettings, kube_settings: KubeSettings, kube: APIServerEmulator, bus: Bus
) -> AsyncIterator[PluginNode]:
    base = Path(tempfile.mkdtemp(prefix="dra-", dir="/tmp"))
    try:
        yield PluginNode(base, nats=nats_settings, kube=kube_settings, api=kube, bus=bus)
    finally:
        # The agents' gRPC servers and the test's channels are freed now, on the event loop
        # that made them, rather than by a later test's garbage collection under its own loop
        # (grpc.aio binds its completion queue to each loop it has seen).
        gc.collect()
        shutil.rmtree(base, ignore_errors=True)
