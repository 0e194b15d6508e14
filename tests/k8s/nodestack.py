"""One node's agents on the real control plane, as the k8s tests run them: the node
registered, the discovery agent on a sim profile, the allocation agent, the kubelet emulator
registered with it and the kubelet shim preparing through it; on the way out the node and its
slices are removed (best effort), so that no later test's pod is placed on a node whose agents
are gone."""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import shutil
import tempfile
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping, Sequence
from pathlib import Path
from typing import Any, TypeVar

from devcluster.controlplane import register_node
from devcluster.controlplane.kubeletshim import KubeletShim
from devcluster.kubelet import KubeletEmulator
from services.allocation.config import AllocationConfig
from services.allocation.dra.agent import AllocationAgent
from services.discovery.agent import DiscoveryAgent
from services.discovery.config import DiscoveryConfig
from shared.config import KubeSettings, NATSSettings
from shared.errors import DraSuiteError
from shared.kube.client import KubeClient
from shared.kube.resources import NODES, RESOURCE_SLICES
from shared.supervisor import run_agent
from shared.vendors.sim import discovery as sim
from tests.integration.discovery.agent_runner import running

T = TypeVar("T")
Extra = tuple[Any, Callable[[], bool]]
"""Another agent to run beside the two (the health agent), and when it is ready."""


@dataclasses.dataclass
class NodeStack:
    node: str
    driver: str
    admin: KubeClient
    shim: KubeletShim
    allocation: AllocationConfig

    @property
    def cdi_root(self) -> Path:
        return self.allocation.cdi_root


@contextlib.asynccontextmanager
async def run_until_ready(agent: Any, ready: Callable[[], bool]) -> AsyncIterator[None]:
    """Run `agent` until the block ends; in only once `ready()` (or it stopped: an error)."""
    stop = asyncio.Event()
    task = asyncio.create_task(run_agent(agent, grace_s=5, stop=stop, handle_signals=False))
    try:
        await until(lambda: _now(ready() or task.done()), timeout_s=15)
        assert not task.done(), "the agent stopped during start"
        yield
    finally:
        stop.set()
        assert await asyncio.wait_for(task, 15) == 0


@contextlib.asynccontextmanager
async def node_stack(
    admin: KubeClient,
    nats: NATSSettings,
    kube: KubeSettings,
    *,
    node: str,
    driver: str,
    profile: str = "gpu",
    tokens: Mapping[str, KubeSettings] | None = None,
    discovery_settings: Mapping[str, Any] | None = None,
    extra: Sequence[Extra] = (),
    register: bool = True,
    forget: bool = True,
    prefix: str = "dra-k8s-node-",
) -> AsyncIterator[NodeStack]:
    """The node's stack, yielded once its slices are all published.

    `kube` is the agents' API server access, unless `tokens` names an agent's own
    ("discovery", "allocation"); `discovery_settings` are further DiscoveryConfig fields;
    `extra` agents start after the two. `register=False` leaves the node to the caller, and
    `forget=False` leaves it and its slices in place."""
    tokens = tokens or {}
    base = Path(tempfile.mkdtemp(prefix=prefix, dir="/tmp"))
    discovery = DiscoveryConfig(
        node_name=node, nats=nats, kube=tokens.get("discovery", kube), driver_name=driver,
        sim_profile=profile, **(discovery_settings or {}),
    )  # fmt: skip
    allocation = AllocationConfig(
        nats=nats, kube=tokens.get("allocation", kube), node_name=node, driver_name=driver,
        plugin_registry_dir=base / "registry", plugin_data_dir=base / "plugins" / driver,
        cdi_root=base / "cdi",
    )  # fmt: skip
    alloc_agent = AllocationAgent(allocation)
    kubelet = KubeletEmulator(allocation.plugin_registry_dir)
    try:
        if register:
            await register_node(admin, node)
        async with contextlib.AsyncExitStack() as agents:
            backend = sim.SimBackend.from_profile(profile)
            await agents.enter_async_context(running(DiscoveryAgent(discovery, backend=backend)))
            await agents.enter_async_context(run_until_ready(alloc_agent, alloc_agent.ready.is_set))
            for agent, ready in extra:
                await agents.enter_async_context(run_until_ready(agent, ready))
            await kubelet.register(driver=driver, timeout_s=15)
            await until(lambda: slices_published(admin, node, driver))
            async with KubeletShim(admin, kubelet, node=node, driver=driver) as shim:
                yield NodeStack(node, driver, admin, shim, allocation)
    finally:
        await kubelet.close()
        if forget:
            await forget_node(admin, node)
        shutil.rmtree(base, ignore_errors=True)


async def slices_published(admin: KubeClient, node: str, driver: str) -> bool:
    listed = await admin.list(RESOURCE_SLICES, field_selector=f"spec.nodeName={node}")
    ours = [s for s in listed["items"] if s["spec"]["driver"] == driver]
    return bool(ours) and len(ours) == ours[0]["spec"]["pool"]["resourceSliceCount"]


async def forget_node(admin: KubeClient, node: str) -> None:
    """Remove the node and its slices (best effort: a failure here must not hide the test's)."""
    with contextlib.suppress(DraSuiteError):
        slices = await admin.list(RESOURCE_SLICES, field_selector=f"spec.nodeName={node}")
        for item in slices["items"]:
            await admin.delete(RESOURCE_SLICES, item["metadata"]["name"])
        await admin.delete(NODES, node)


async def _now(value: T) -> T:
    return value


async def until(check: Callable[[], Awaitable[T | None]], *, timeout_s: float = 30.0) -> T:
    async with asyncio.timeout(timeout_s):
        while True:
            result = await check()
            if result:
                return result
            await asyncio.sleep(0.2)
