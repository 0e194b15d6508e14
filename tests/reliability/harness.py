"""One node of the reliability suite: the LocalStack (every agent a real process) plus the
parts that play the kubelet, the scheduler and the operator, and the checks that read the
truth back from the API, NATS, the kubelet's health stream and the node's disk.

The sim profile is a copied file, so a test hot-plugs devices by rewriting it. The truth about
faults is what the test injected since the health agent last started (the sim monitor keeps
injected faults in memory; a restarted health agent sees a healthy device again).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import re
import shutil
import time
from collections import Counter
from collections.abc import AsyncIterator, Awaitable, Callable, Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

import nats.errors
import yaml
from nats.js import api

from devcluster import flow
from devcluster.kubelet import KubeletClaim, KubeletEmulator, KubeletError
from devcluster.processes import ChildProcess
from devcluster.stack import LocalStack, StackConfig
from services.allocation.cdi import spec_files
from services.allocation.cli import CRASH_AT_ENV
from shared.bus import codec
from shared.bus.connection import Bus
from shared.bus.session import open_bus
from shared.errors import BusUnavailableError, KubeNotFoundError
from shared.kube import resources
from shared.kube.client import KubeClient
from shared.pb.drasuite.v1 import alert_pb2, health_pb2, inventory_pb2
from shared.pb.kubelet.dra.v1 import api_pb2 as dra
from shared.pb.kubelet.drahealth.v1alpha1 import api_pb2 as health_api
from shared.vendors import sim
from tests.reliability.emulator_control import EmulatorControl

__all__ = [
    "DRIVER",
    "NODE",
    "ReliabilityNode",
    "hot_plug",
    "open_reliability_node",
    "partition_config",
    "write_profile",
]

DRIVER = "sim.dra-suite.io"
NODE = "rel-node"
SHIPPED = Path(__file__).parents[2] / "shared" / "sim" / "profiles" / "mixed.yaml"
T = TypeVar("T")
Obj = dict[str, Any]
AlertKey = tuple[str, str]
"""(device, "RAISED" | "RESOLVED")."""


def partition_config(profile: str) -> Obj:
    """The opaque DeviceConfig asking for a partition of `profile` of each allocated device."""
    return {
        "apiVersion": f"{DRIVER}/v1alpha1",
        "kind": "DeviceConfig",
        "partition": {"profile": profile},
    }


def write_profile(path: Path, document: Obj) -> None:
    """Replace the profile file atomically, so the discovery agent never reads half of it."""
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text(yaml.safe_dump(document, sort_keys=False))
    tmp.replace(path)


def hot_plug(path: Path, name: str) -> None:
    """Add a GPU named `name` (a copy of the profile's last GPU) to the profile file. Its
    device node and visible id carry the number in its name (`soak-gpu-112` -> `/dev/nvidia112`),
    as the allocation agent binds a sim device's edits to that number."""
    document = yaml.safe_load(path.read_text())
    template = next(d for d in reversed(document["devices"]) if d["kind"] == "gpu")
    numbered = re.search(r"([0-9]+)$", name)
    index = int(numbered.group(1)) if numbered else len(document["devices"])
    device = {
        **template,
        "name": name,
        "uuid": f"GPU-00000000-0000-4000-8000-{index:012d}",
        "attributes": {**template["attributes"], "index": index},
        "deviceNodes": [{"path": f"/dev/nvidia{index}", "hostPath": "/dev/null"}],
        "env": {"NVIDIA_VISIBLE_DEVICES": str(index)},
    }
    document["devices"].append(device)
    write_profile(path, document)


def profile_devices(path: Path) -> set[str]:
    return {d["name"] for d in yaml.safe_load(path.read_text())["devices"]}


async def until(
    probe: Callable[[], Awaitable[T | None]], *, what: str, timeout_s: float = 20.0
) -> T:
    return await flow.eventually(probe, what=what, timeout_s=timeout_s)


@dataclass
class ReliabilityNode:
    stack: LocalStack
    bus: Bus
    kube: KubeClient
    api: EmulatorControl
    profile: Path
    _kubelet: KubeletEmulator | None = None
    _claims: int = 0
    retried: int = 0
    """Kubelet calls that failed (plugin gone) and were retried."""
    injected: set[str] = field(default_factory=set)
    """Devices with a fault injected since the health agent last started: the true faults."""

    @property
    def checkpoint_dir(self) -> Path:
        return self.stack.config.plugin_data_dir / "checkpoint"

    @property
    def cdi_root(self) -> Path:
        return self.stack.config.cdi_root

    async def wait_ready(self) -> None:
        """Inventory and slices match the profile, a kubelet has registered the plugin, and
        every device has its health record."""
        await self.wait_slices_match_profile()
        await self.kubelet()
        await self.wait_health_converged()

    async def kubelet(self) -> KubeletEmulator:
        """The kubelet, (re-)registered with the plugin when it has none."""
        if self._kubelet is None:
            kubelet = KubeletEmulator(self.stack.config.registry_dir, call_timeout_s=10)
            await kubelet.register(driver=DRIVER, timeout_s=30)
            self._kubelet = kubelet
        return self._kubelet

    async def forget_kubelet(self) -> None:
        kubelet, self._kubelet = self._kubelet, None
        if kubelet is not None:
            await kubelet.close()

    async def _retrying(
        self, call: Callable[[KubeletEmulator], Awaitable[T]], *, timeout_s: float
    ) -> T:
        """What the kubelet does: a failed call (plugin gone) is retried after re-registering."""
        deadline = time.monotonic() + timeout_s
        while True:
            kubelet = await self.kubelet()
            try:
                return await call(kubelet)
            except (KubeletError, asyncio.CancelledError) as exc:
                task = asyncio.current_task()
                if isinstance(exc, asyncio.CancelledError) and task and task.cancelling():
                    raise  # this task is being cancelled, not just its call
                # A concurrent call that failed first closed this kubelet's channel under
                # ours: gRPC reports that as a locally cancelled call. Either way, retry.
                self.retried += 1
                if self._kubelet is kubelet:
                    await self.forget_kubelet()
                if time.monotonic() >= deadline:
                    if isinstance(exc, KubeletError):
                        raise
                    raise KubeletError("the call's channel was closed under it") from exc
                await asyncio.sleep(0.1)

    async def prepare(
        self, claims: Sequence[KubeletClaim], *, timeout_s: float = 30.0
    ) -> dict[str, dra.NodePrepareResourceResponse]:
        answer = await self._retrying(lambda k: k.prepare(claims), timeout_s=timeout_s)
        return dict(answer.claims)

    async def unprepare(
        self, claims: Sequence[KubeletClaim], *, timeout_s: float = 30.0
    ) -> dict[str, dra.NodeUnprepareResourceResponse]:
        if not claims:
            return {}  # the kubelet never makes an empty call
        answer = await self._retrying(lambda k: k.unprepare(claims), timeout_s=timeout_s)
        return dict(answer.claims)

    async def allocated_claim(
        self, devices: Sequence[str], *, parameters: Obj | None = None
    ) -> KubeletClaim:
        """A new ResourceClaim with `devices` of this node allocated to it, as the scheduler.
        `parameters`: an opaque DeviceConfig of this driver in the claim's config (every
        request), e.g. `partition_config("1g.10gb")`."""
        self._claims += 1
        config = None
        if parameters is not None:
            config = [{"requests": [], "opaque": {"driver": DRIVER, "parameters": parameters}}]
        claim = await flow.create_claim(
            self.kube,
            namespace="default",
            name=f"claim-{self._claims}",
            device_class=f"any.{DRIVER}",
            count=len(devices),
            cel=f'device.driver == "{DRIVER}"',
            config=config,
        )
        claim = await flow.allocate_claim(
            self.kube, claim, driver=DRIVER, node=NODE, devices=list(devices)
        )
        return flow.kubelet_claim(claim)

    def checkpoint_files(self) -> list[str]:
        return sorted(p.name for p in self.checkpoint_dir.iterdir())

    def cdi_files(self) -> list[str]:
        return sorted(p.name for p in self.cdi_root.iterdir())

    def assert_prepared_exactly(self, claims: Iterable[KubeletClaim]) -> None:
        """One checkpoint record and one CDI spec per prepared claim, nothing else on disk."""
        uids = sorted(c.uid for c in claims)
        assert self.checkpoint_files() == sorted(f"{uid}.json" for uid in uids)
        assert self.cdi_files() == sorted(spec_files.spec_file_name(DRIVER, uid) for uid in uids)

    # --- dynamic partitions ----------------------------------------------------------------

    @property
    def partition_state(self) -> Path:
        """The sim partition manager's state file (`sim.STATE_FILE` in the data dir)."""
        return self.stack.config.plugin_data_dir / sim.STATE_FILE

    def sim_partitions(self) -> list[Obj]:
        """Every partition the sim has made and not removed (written atomically: never half)."""
        try:
            document: Obj = json.loads(self.partition_state.read_bytes())
        except FileNotFoundError:
            return []
        return list(document.get("partitions") or [])

    def temporary_files(self) -> list[Path]:
        """Half-written files (`.<name>.tmp-<pid>`) anywhere in the plugin data dir or CDI root."""
        roots = (self.stack.config.plugin_data_dir, self.cdi_root)
        return sorted(p for root in roots for p in root.rglob("*") if ".tmp" in p.name)

    async def start_allocation_crashing_at(self, step: str) -> ChildProcess:
        """Replace the allocation agent with one that exits 137 at `step` (`CRASH_STEPS`)."""
        await self.stack.stop_agent("allocation")
        await self.forget_kubelet()
        process = ChildProcess(
            name="allocation",
            argv=self.stack.agent_argv("allocation"),
            log_path=self.stack.config.logs_dir / "allocation.log",
            env={**os.environ, CRASH_AT_ENV: step},
        )
        await process.start()
        self.stack.agents["allocation"] = process
        return process

    # --- discovery -------------------------------------------------------------------------

    async def inventory_devices(self) -> set[str]:
        key = self.bus.names.inventory_key(DRIVER, NODE)
        data = await self.bus.kv_get(self.bus.names.inventory_bucket, key)
        if data is None:
            return set()
        return {d.name for d in codec.decode(inventory_pb2.Inventory, data, subject=key).devices}

    async def slice_devices(self) -> list[str]:
        """Every device the node's slices publish (a list: a duplicate would show)."""
        listed = await self.kube.list(
            resources.RESOURCE_SLICES, field_selector=f"spec.nodeName={NODE}"
        )
        return sorted(d["name"] for s in listed["items"] for d in s["spec"].get("devices", []))

    async def wait_slices_match_profile(self, *, timeout_s: float = 20.0) -> set[str]:
        """Until the inventory KV and the slices both hold exactly the profile's devices."""
        want = profile_devices(self.profile)

        async def probe() -> bool:
            slices = await self.slice_devices()
            return slices == sorted(want) and await self.inventory_devices() == want

        await until(probe, what=f"slices and inventory with {sorted(want)}", timeout_s=timeout_s)
        return want

    # --- health ----------------------------------------------------------------------------

    async def inject(self, device: str, *, clear: bool = False) -> None:
        """Send a FaultCommand; "no responders" (never delivered) is retried for a while."""
        deadline = time.monotonic() + 15
        while True:
            try:
                await flow.inject_fault(
                    self.bus, driver=DRIVER, node=NODE, device=device, clear=clear
                )
                break
            except BusUnavailableError as exc:
                if "no responders" not in str(exc) or time.monotonic() >= deadline:
                    raise
                await asyncio.sleep(0.1)
        (self.injected.discard if clear else self.injected.add)(device)

    async def tainted_devices(self) -> list[str]:
        """Devices selected by a DeviceTaintRule (a list: a duplicate rule would show)."""
        for version in await self.kube.served_versions(resources.RESOURCE_GROUP):
            try:
                items = (await self.kube.list(resources.device_taint_rules(version)))["items"]
            except KubeNotFoundError:
                continue
            return sorted(r["spec"]["deviceSelector"]["device"] for r in items)
        return []

    async def kv_unhealthy(self) -> set[str]:
        names = self.bus.names
        found = set()
        for device in await self.inventory_devices():
            key = names.health_key(DRIVER, NODE, device)
            data = await self.bus.kv_get(names.health_bucket, key)
            record = codec.decode(health_pb2.DeviceHealth, data or b"", subject=key)
            if record.state != health_pb2.HEALTH_STATE_HEALTHY:
                found.add(device)
        return found

    async def kubelet_unhealthy(self) -> set[str]:
        """Unhealthy devices in the first message of a fresh NodeWatchResources stream."""
        kubelet = KubeletEmulator(self.stack.config.registry_dir, call_timeout_s=10)
        try:
            await kubelet.register(driver=DRIVER, timeout_s=30)
            async with asyncio.timeout(10):
                async for message in kubelet.watch_health():
                    return {
                        d.device.device_name
                        for d in message.devices
                        if d.health != health_api.HEALTHY
                    }
        finally:
            await kubelet.close()
        raise AssertionError("the health stream ended without a message")

    async def wait_health_converged(self, *, timeout_s: float = 20.0) -> set[str]:
        """Until the taints, the health KV and the kubelet's stream all say `injected`."""
        truth = set(self.injected)
        seen: list[object] = []

        async def probe() -> bool:
            views = (
                await self.tainted_devices(),
                await self.kv_unhealthy(),
                await self.kubelet_unhealthy(),
            )
            seen[:] = views
            return views == (sorted(truth), truth, truth)

        try:
            await until(probe, what=f"health converged on {sorted(truth)}", timeout_s=timeout_s)
        except flow.FlowError as exc:
            raise AssertionError(f"{exc}; taints, KV, kubelet: {seen}") from exc
        return truth

    async def alerts(self) -> list[alert_pb2.Alert]:
        """Every alert in the stream, read from its start."""
        stream = self.bus.names.alerts_stream
        total = (await self.bus.js.stream_info(stream)).state.messages
        subscription = await self.bus.js.subscribe(
            self.bus.names.alerts_wildcard,
            stream=stream,
            ordered_consumer=True,
            config=api.ConsumerConfig(deliver_policy=api.DeliverPolicy.ALL),
        )
        found: list[alert_pb2.Alert] = []
        try:
            while len(found) < total:
                try:
                    msg = await subscription.next_msg(timeout=5)
                except nats.errors.TimeoutError:
                    break
                found.append(codec.decode_json(alert_pb2.Alert, msg.data, subject=msg.subject))
        finally:
            await subscription.unsubscribe()
        return found

    async def alert_counts(self) -> Counter[AlertKey]:
        return Counter(
            (a.device, alert_pb2.AlertStatus.Name(a.status).removeprefix("ALERT_STATUS_"))
            for a in await self.alerts()
        )


@contextlib.asynccontextmanager
async def open_reliability_node(workdir: Path, **changes: Any) -> AsyncIterator[ReliabilityNode]:
    """The node the `node` fixture yields, for code outside pytest (the soak's bench): the
    LocalStack under `workdir` with a copied profile, ready. `changes` override StackConfig
    fields. On the way out it checks that no agent died unnoticed."""
    profile = _copied_profile(workdir)
    config = StackConfig(
        workdir=workdir / "stack",
        node_name=NODE,
        driver_name=DRIVER,
        sim_profile=str(profile),
        recovery_hold_s=0.5,
        **changes,
    )
    async with (
        LocalStack(config) as stack,
        open_bus(stack.nats_settings) as bus,
        stack.kube() as kube,
        EmulatorControl(stack.api_url) as api,
    ):
        node = ReliabilityNode(stack=stack, bus=bus, kube=kube, api=api, profile=profile)
        try:
            await node.wait_ready()
            yield node
        finally:
            await node.forget_kubelet()
        assert stack.exited_agents() == {}, stack.exited_agents()


def _copied_profile(workdir: Path) -> Path:
    workdir.mkdir(parents=True, exist_ok=True)
    profile = workdir / "profile.yaml"
    shutil.copyfile(SHIPPED, profile)
    return profile
