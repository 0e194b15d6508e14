"""The pool generation as a scheduler watching the slices sees it, through a series of changes.

A watcher records the node's slices after every watch event and reads each state as
kube-scheduler does (only the newest generation of the pool counts, and the pool is complete
once `resourceSliceCount` slices of it exist). Whatever the agent writes in between, a
complete pool must list exactly the devices of one inventory (never a mix of two), and no
view may show a device twice. The generation moves as upstream's controller moves it: kept
for a change inside one slice or a shrink to fewer slices, bumped when devices move between
slices or a slice is added.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections import Counter
from collections.abc import AsyncIterator
from typing import Any

import pytest

from devcluster.apiserver import APIServerEmulator
from services.discovery.agent import DiscoveryAgent
from services.discovery.config import DiscoveryConfig
from shared.config import KubeSettings, NATSSettings
from shared.kube import watch
from shared.kube.client import KubeClient, WatchEvent
from shared.kube.resources import RESOURCE_SLICES
from shared.sim.profile import SimDevice
from shared.vendors.sim import discovery as sim
from tests.integration.discovery.agent_runner import eventually, running

pytestmark = pytest.mark.integration

NODE = "n1"
Obj = dict[str, Any]


def _device(i: int) -> SimDevice:
    return SimDevice(name=f"dev-{i:03d}", kind="sim", attributes={"index": i})


class SchedulerView:
    """Every state of the node's slices, one per watch event."""

    def __init__(self) -> None:
        self.states: list[dict[str, Obj]] = []

    async def follow(self, client: KubeClient) -> None:
        current: dict[str, Obj] = {}
        async for item in watch.reflect(client, RESOURCE_SLICES):
            if isinstance(item, WatchEvent):
                if item.type == "BOOKMARK":
                    continue
                name = item.object["metadata"]["name"]
                if item.type == "DELETED":
                    current.pop(name, None)
                else:
                    current[name] = item.object
            else:
                current = {o["metadata"]["name"]: o for o in item.items}
            self.states.append(dict(current))

    @staticmethod
    def pool(state: dict[str, Obj]) -> tuple[int, bool, list[str]]:
        """(newest generation, complete, its devices) as the scheduler reads the pool."""
        slices = list(state.values())
        newest = max((s["spec"]["pool"]["generation"] for s in slices), default=0)
        current = [s for s in slices if s["spec"]["pool"]["generation"] == newest]
        expected = {s["spec"]["pool"]["resourceSliceCount"] for s in current}
        complete = len(expected) == 1 and len(current) == expected.pop()
        devices = [d["name"] for s in current for d in s["spec"].get("devices", [])]
        return newest, complete, devices

    def settled(self, names: set[str]) -> int | None:
        """The generation once the latest state is a complete pool of exactly `names`."""
        if not self.states:
            return None
        latest = self.states[-1]
        generation, complete, devices = self.pool(latest)
        alone = all(s["spec"]["pool"]["generation"] == generation for s in latest.values())
        return generation if complete and alone and set(devices) == names else None


@pytest.fixture
async def client(kube_settings: KubeSettings) -> AsyncIterator[KubeClient]:
    connected = await KubeClient.connect(kube_settings)
    yield connected
    await connected.close()


async def test_a_watching_scheduler_never_sees_a_device_twice_or_two_inventories_mixed(
    nats_settings: NATSSettings,
    kube_settings: KubeSettings,
    kube: APIServerEmulator,
    client: KubeClient,
):
    kube.create_object({"apiVersion": "v1", "kind": "Node", "metadata": {"name": NODE}})
    backend = sim.SimBackend([_device(i) for i in range(200)])  # 128 + 72
    config = DiscoveryConfig(node_name=NODE, nats=nats_settings, kube=kube_settings)
    view = SchedulerView()
    follower = asyncio.create_task(view.follow(client))
    inventories: list[set[str]] = []

    async def step(expected_generation: int) -> None:
        names = {d.name for d in backend.devices}
        inventories.append(names)
        generation = await eventually(lambda: view.settled(names))
        assert generation == expected_generation

    try:
        async with running(DiscoveryAgent(config, backend=backend)):
            await step(1)
            backend.add_device(_device(200))  # only the second slice changes
            await step(1)
            for i in range(10):  # devices move from the second slice into the first
                backend.remove_device(f"dev-{i:03d}")
            await step(2)
            for i in range(10, 110):  # back to one slice: the other is deleted first
                backend.remove_device(f"dev-{i:03d}")
            await step(2)
            for i in range(300, 600):  # new slices
                backend.add_device(_device(i))
            await step(3)
    finally:
        follower.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await follower

    for state in view.states:
        _, complete, devices = view.pool(state)
        twice = [name for name, count in Counter(devices).items() if count > 1]
        assert not twice, f"devices {twice} listed twice in one view"
        if complete:
            assert set(devices) in inventories, "a complete pool mixing two inventories"
