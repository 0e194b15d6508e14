"""The health agent's integration harness: run the agent, drive it, look at what it did.

Handed out as the `health` fixture (bound to the test's NATS namespace and API emulator):
with pytest's importlib import mode, test modules cannot import a helper module next to them.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any, TypeVar

import pytest

from devcluster.apiserver import APIServerEmulator
from services.health import taints
from services.health.agent import HealthAgent
from services.health.config import HealthConfig
from services.health.policy import Taint
from shared.bus import codec
from shared.bus.connection import Bus
from shared.config import KubeSettings, NATSSettings
from shared.errors import BusUnavailableError, MalformedMessageError
from shared.pb.drasuite.v1 import claim_pb2, health_pb2, inventory_pb2
from shared.supervisor import run_agent
from shared.vendors.nvidia.nvml_events import NVMLEvents
from shared.vendors.parts.health import DeviceMonitor

T = TypeVar("T")


class HealthHarness:
    NODE = "node-a"
    DRIVER = "sim.dra-suite.io"
    DEVICES = ("gpu-0", "gpu-1", "gpu-2")
    HEALTHY = health_pb2.HEALTH_STATE_HEALTHY
    UNHEALTHY = health_pb2.HEALTH_STATE_UNHEALTHY
    UNKNOWN = health_pb2.HEALTH_STATE_UNKNOWN

    def __init__(
        self,
        *,
        bus: Bus,
        kube: APIServerEmulator,
        nats_settings: NATSSettings,
        kube_settings: KubeSettings,
    ) -> None:
        self.bus = bus
        self.kube = kube
        self.nats_settings = nats_settings
        self.kube_settings = kube_settings
        self._generation = 0

    @staticmethod
    async def eventually(check: Callable[[], Awaitable[T | None]], *, timeout_s: float = 8.0) -> T:
        """The first truthy result of `check`, polled until `timeout_s`."""
        deadline = time.monotonic() + timeout_s
        while True:
            result = await check()
            if result:
                return result
            if time.monotonic() > deadline:
                raise AssertionError(f"condition not met within {timeout_s}s")
            await asyncio.sleep(0.05)

    @staticmethod
    def now(check: Callable[[], T]) -> Callable[[], Awaitable[T]]:
        """A synchronous check in the shape `eventually` takes."""

        async def wrapped() -> T:
            return check()

        return wrapped

    def config(self, *, nats: NATSSettings | None = None, **overrides: Any) -> HealthConfig:
        """Without damping unless a test asks for it (`recovery_hold_s`, `flap_window_s`)."""
        fields: dict[str, Any] = {"recovery_hold_s": 0.0, "flap_window_s": 0.0, **overrides}
        return HealthConfig(
            nats=nats or self.nats_settings,
            kube=self.kube_settings,
            node_name=self.NODE,
            driver_name=self.DRIVER,
            poll_interval_s=0.1,
            **fields,
        )

    @contextlib.asynccontextmanager
    async def running(
        self,
        config: HealthConfig | None = None,
        *,
        monitor: DeviceMonitor | None = None,
        nvml_library: NVMLEvents | None = None,
    ) -> AsyncIterator[HealthAgent]:
        """The agent under `run_agent`, stopped (and required to exit 0) at the end."""
        agent = HealthAgent(config or self.config(), monitor=monitor, nvml_library=nvml_library)
        stop = asyncio.Event()
        task = asyncio.create_task(run_agent(agent, grace_s=5, stop=stop, handle_signals=False))

        async def started() -> bool:
            # Connected too: a stop while nats-py connects can hang on Python 3.11's wait_for.
            return (agent.ready.is_set() and agent.bus.connected.is_set()) or task.done()

        await self.eventually(started)
        assert not task.done(), "the agent stopped during start"
        try:
            yield agent
            assert not task.done(), "the agent stopped while running"
        finally:
            stop.set()
            assert await asyncio.wait_for(task, 15) == 0

    @staticmethod
    @contextlib.asynccontextmanager
    async def connected(settings: NATSSettings) -> AsyncIterator[Bus]:
        """Another client connection (for a private server)."""
        bus = Bus(settings, name="test-client")
        runner = asyncio.create_task(bus.run())
        try:
            await asyncio.wait_for(bus.connected.wait(), 10)
            yield bus
        finally:
            await bus.close()
            runner.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await runner

    async def put_inventory(
        self, devices: tuple[str, ...] = DEVICES, *, bus: Bus | None = None
    ) -> None:
        inventory = inventory_pb2.Inventory(
            driver=self.DRIVER,
            node=self.NODE,
            pool=self.NODE,
            backend="sim",
            devices=[inventory_pb2.Device(name=d, kind="gpu") for d in devices],
            generation=self._next_generation(),
        )
        bus = bus or self.bus
        key = bus.names.inventory_key(self.DRIVER, self.NODE)
        await bus.kv_put(bus.names.inventory_bucket, key, codec.encode(inventory))

    def _next_generation(self) -> int:
        """One more per inventory put, as the discovery agent counts content changes."""
        self._generation += 1
        return self._generation

    async def publish_inventory(self, inventory: inventory_pb2.Inventory) -> None:
        """Publish a hand-built inventory as the discovery agent would."""
        key = self.bus.names.inventory_key(self.DRIVER, self.NODE)
        await self.bus.kv_put(self.bus.names.inventory_bucket, key, codec.encode(inventory))

    async def prepare_claim(
        self, name: str, *, namespace: str, device: str, pods: dict[str, str]
    ) -> str:
        """A ResourceClaim allocated `device` of this node and reserved for `pods` (name: uid),
        prepared here: its PreparedClaim in the prepared-claims KV, as the allocation agent
        writes it. Returns the claim's UID."""
        request = {"name": "gpu", "exactly": {"deviceClassName": "gpu.example.com"}}
        created = self.kube.create_object(
            {
                "apiVersion": "resource.k8s.io/v1",
                "kind": "ResourceClaim",
                "metadata": {"name": name, "namespace": namespace},
                "spec": {"devices": {"requests": [request]}},
            }
        )
        result = {"request": "gpu", "driver": self.DRIVER, "pool": self.NODE, "device": device}
        created["status"] = {
            "allocation": {"devices": {"results": [result]}},
            "reservedFor": [
                {"resource": "pods", "name": pod, "uid": uid} for pod, uid in pods.items()
            ],
        }
        self.kube.update_object(created, status=True)
        uid = str(created["metadata"]["uid"])
        prepared = claim_pb2.PreparedClaim(
            driver=self.DRIVER,
            node=self.NODE,
            claim_uid=uid,
            namespace=namespace,
            name=name,
            devices=[
                claim_pb2.PreparedClaimDevice(request_names=["gpu"], pool=self.NODE, device=device)
            ],
            pods=[claim_pb2.ClaimPod(namespace=namespace, name=p, uid=u) for p, u in pods.items()],
            state=claim_pb2.PREPARED_CLAIM_STATE_PREPARED,
        )
        await self.put_prepared_claim(uid, codec.encode(prepared))
        return uid

    async def put_prepared_claim(self, uid: str, value: bytes) -> None:
        key = self.bus.names.claim_key(self.DRIVER, self.NODE, uid)
        await self.bus.kv_put(self.bus.names.claims_bucket, key, value)

    def create_node(self) -> dict[str, Any]:
        return self.kube.create_object(
            {"apiVersion": "v1", "kind": "Node", "metadata": {"name": self.NODE}}
        )

    @staticmethod
    def fault(device: str, **fields: Any) -> bytes:
        return codec.encode(health_pb2.FaultCommand(device=device, **fields))

    async def command(self, data: bytes) -> dict[str, Any]:
        """Send a fault command, waiting (briefly) for the agent to subscribe and to have read
        the node's inventory first: both happen after the agent reports ready."""
        reply = self.replied(self.bus.names.fault_control(self.DRIVER, self.NODE), data)
        for _ in range(80):
            answer = await reply()
            # None: no responder yet (still subscribing); retry: the inventory not read yet.
            if answer is not None and not answer.get("retry"):
                return answer
            await asyncio.sleep(0.1)
        raise AssertionError("the fault-control subject never accepted the command")

    def replied(self, subject: str, data: bytes) -> Callable[[], Awaitable[dict[str, Any] | None]]:
        """A check for `eventually`: the reply to one request, None while nothing answers."""

        async def check() -> dict[str, Any] | None:
            try:
                reply = await self.bus.request(subject, data, timeout_s=3)
            except BusUnavailableError:
                return None
            answer: dict[str, Any] = json.loads(reply.data)
            return answer

        return check

    async def record(
        self, device: str, *, bus: Bus | None = None
    ) -> health_pb2.DeviceHealth | None:
        bus = bus or self.bus
        key = bus.names.health_key(self.DRIVER, self.NODE, device)
        data = await bus.kv_get(bus.names.health_bucket, key)
        return None if data is None else codec.decode(health_pb2.DeviceHealth, data, subject=key)

    def state_is(
        self, device: str, state: int, *, bus: Bus | None = None
    ) -> Callable[[], Awaitable[health_pb2.DeviceHealth | None]]:
        """A check for `eventually`: the device's record once it has `state`."""

        async def check() -> health_pb2.DeviceHealth | None:
            try:
                found = await self.record(device, bus=bus)
            except MalformedMessageError:  # garbage left in the KV: not replaced by the agent yet
                return None
            return found if found is not None and found.state == state else None

        return check

    async def stream_alerts(self, *, bus: Bus | None = None) -> list[dict[str, Any]]:
        """Every alert on the alerts stream, oldest first."""
        bus = bus or self.bus
        name = bus.names.alerts_stream
        try:
            info = await bus.js.stream_info(name)
        except Exception:  # not created yet; nats' NotFoundError has no seam of ours
            return []
        if not info.state.messages:
            return []
        found = []
        for seq in range(info.state.first_seq, info.state.last_seq + 1):
            message = await bus.js.get_msg(name, seq)
            found.append(json.loads(message.data or b"{}"))
        return found

    def alerts_with(
        self, status: str, *, bus: Bus | None = None
    ) -> Callable[[], Awaitable[list[dict[str, Any]]]]:
        async def check() -> list[dict[str, Any]]:
            return [a for a in await self.stream_alerts(bus=bus) if a["status"] == status]

        return check

    def rules_for(self, device: str) -> list[dict[str, Any]]:
        return [
            r
            for r in self.kube.objects("devicetaintrules")
            if r["spec"]["deviceSelector"].get("device") == device
        ]

    def node_events(self, reason: str) -> list[dict[str, Any]]:
        return [e for e in self.kube.objects("events", "default") if e.get("reason") == reason]

    def leave_rule(self, *, device: str, taint: Taint) -> str:
        """Create the rule an earlier run of the agent would have left for `device`."""
        name = taints.rule_name(driver=self.DRIVER, node=self.NODE, device=device, key=taint.key)
        spec = taints.RuleSpec(
            name=name,
            driver=self.DRIVER,
            node=self.NODE,
            pool=self.NODE,
            device=device,
            taint=taint,
        )
        self.kube.create_object(taints.rule_body(spec, version="v1beta2"))
        return name


@pytest.fixture
def health(
    bus: Bus, kube: APIServerEmulator, nats_settings: NATSSettings, kube_settings: KubeSettings
) -> HealthHarness:
    return HealthHarness(
        bus=bus, kube=kube, nats_settings=nats_settings, kube_settings=kube_settings
    )


@pytest.fixture
def partitioned_inventory() -> inventory_pb2.Inventory:
    """gpu-0 with two MIG partitions (one named by `parent`, one by its counter set) and gpu-1."""
    whole = {"memory-slice-0": "1", "memory-slice-1": "1", "compute-slices": "7"}
    counters = inventory_pb2.CounterSet(name="gpu-0-counter-set", counters=whole)

    def uses(values: dict[str, str]) -> list[inventory_pb2.CounterConsumption]:
        return [inventory_pb2.CounterConsumption(counter_set=counters.name, counters=values)]

    return inventory_pb2.Inventory(
        driver=HealthHarness.DRIVER,
        node=HealthHarness.NODE,
        pool=HealthHarness.NODE,
        backend="nvml",
        shared_counters=[counters],
        devices=[
            inventory_pb2.Device(name="gpu-0", kind="gpu", consumes_counters=uses(whole)),
            inventory_pb2.Device(
                name="gpu-0-mig-1g10gb-19-0",
                kind="mig",
                parent="gpu-0",
                consumes_counters=uses({"memory-slice-0": "1", "compute-slices": "1"}),
            ),
            inventory_pb2.Device(
                name="gpu-0-mig-1g10gb-19-1",
                kind="mig",
                consumes_counters=uses({"memory-slice-1": "1", "compute-slices": "1"}),
            ),
            inventory_pb2.Device(name="gpu-1", kind="gpu"),
        ],
    )
