"""The gpu-mig and gpu-shared sim profiles published through the discovery agent, per version.

The API emulator validates each version's ResourceSlice rules and drops fields whose feature
gate is off: a pool it accepts whole, with no Warning Event, is the proof.
"""

from __future__ import annotations

import asyncio
import dataclasses
from collections.abc import Callable
from typing import Any

import pytest

from devcluster.apiserver import APIServerEmulator, ClusterConfig
from services.discovery import cli
from services.discovery.agent import DiscoveryAgent
from shared.config import KubeSettings, NATSSettings
from tests.integration.discovery.agent_runner import eventually, running

pytestmark = pytest.mark.integration

NODE = "n1"
MIG_DEVICES = 4 * (1 + 7 + 3 + 2 + 1)  # whole + 1g.10gb, 2g.20gb, 3g.40gb, 7g.80gb placements


def pool(kube: APIServerEmulator, *, devices: int) -> list[dict[str, Any]] | None:
    """The slices once the newest generation is complete, alone and holds `devices` devices."""
    found = [s for s in kube.objects("resourceslices") if s["spec"]["nodeName"] == NODE]
    if not found:
        return None
    newest = max(s["spec"]["pool"]["generation"] for s in found)
    current = [s for s in found if s["spec"]["pool"]["generation"] == newest]
    complete = len(current) == current[0]["spec"]["pool"]["resourceSliceCount"] == len(found)
    count = sum(len(s["spec"].get("devices", [])) for s in current)
    return current if complete and count == devices else None


def published_devices(slices: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    return {d["name"]: d for s in slices for d in s["spec"].get("devices", [])}


@pytest.fixture
def node(kube: APIServerEmulator) -> None:
    kube.create_object({"apiVersion": "v1", "kind": "Node", "metadata": {"name": NODE}})


@pytest.fixture
def sim_agent(
    nats_settings: NATSSettings, kube_settings: KubeSettings
) -> Callable[[str], DiscoveryAgent]:
    def make(profile: str) -> DiscoveryAgent:
        argv = ["--node-name", NODE, "--backend", "sim", "--sim-profile", profile]
        config = cli.parse_config(argv, {})
        return DiscoveryAgent(dataclasses.replace(config, nats=nats_settings, kube=kube_settings))

    return make


def _partitionable(version: str) -> ClusterConfig:
    return ClusterConfig.for_tests(version, DRAPartitionableDevices=True)


@pytest.mark.parametrize(
    "kube",
    [_partitionable("1.34"), _partitionable("1.35"), _partitionable("1.36")],
    indirect=True,
    ids=["1.34", "1.35", "1.36"],
)
async def test_the_gpu_mig_profile_is_accepted_whole_with_its_counters(
    kube: APIServerEmulator, node: None, sim_agent: Callable[[str], DiscoveryAgent]
):
    async with running(sim_agent("gpu-mig")):
        published = await eventually(lambda: pool(kube, devices=MIG_DEVICES))
    assert kube.objects("events", namespace="default") == []  # nothing rejected or dropped
    sets = [c for s in published for c in s["spec"].get("sharedCounters", [])]
    assert sorted(c["name"] for c in sets) == [f"gpu-{i}-counter-set" for i in range(4)]
    assert all(len(c["counters"]) == 15 for c in sets)
    devices = published_devices(published)
    assert devices["gpu-0"]["consumesCounters"][0]["counterSet"] == "gpu-0-counter-set"
    partition = devices["gpu-3-mig-3g40gb-9-4"]
    assert partition["attributes"]["profile"] == {"string": "3g.40gb"}
    # Options the allocation agent makes at prepare time, not MIG devices that exist now.
    assert partition["attributes"]["createdOnDemand"] == {"bool": True}
    assert "createdOnDemand" not in devices["gpu-3"]["attributes"]
    used = partition["consumesCounters"][0]["counters"]
    assert sorted(k for k in used if k.startswith("memory-slice-")) == [
        f"memory-slice-{i}" for i in range(4, 8)
    ]
    assert not any("allowMultipleAllocations" in d for d in devices.values())


@pytest.mark.parametrize(
    ("kube", "shared"),
    [("1.34", False), ("1.35", False), ("1.36", True)],
    indirect=["kube"],
    ids=["1.34", "1.35", "1.36"],
)
async def test_the_gpu_shared_profile_shares_memory_only_on_1_36(
    kube: APIServerEmulator,
    node: None,
    sim_agent: Callable[[str], DiscoveryAgent],
    shared: bool,
):
    async with running(sim_agent("gpu-shared")):
        published = await eventually(lambda: pool(kube, devices=2))
        writes = len(kube.request_log.writes("resourceslices"))
        await asyncio.sleep(0.5)
        assert len(kube.request_log.writes("resourceslices")) == writes  # steady
    assert kube.objects("events", namespace="default") == []  # nothing rejected or dropped
    devices = published_devices(published)
    gpu, exclusive = devices["gpu-0"], devices["gpu-1"]
    assert ("allowMultipleAllocations" in gpu) is shared
    assert ("requestPolicy" in gpu["capacity"]["memory"]) is shared
    if shared:
        assert gpu["allowMultipleAllocations"] is True
        policy = gpu["capacity"]["memory"]["requestPolicy"]
        assert policy["validRange"] == {"min": "1Gi", "step": "1Gi"}
    assert "allowMultipleAllocations" not in exclusive
    assert gpu["capacity"]["memory"]["value"] == exclusive["capacity"]["memory"]["value"] == "80Gi"
    assert not any(key.endswith("sharedCapacity") for key in gpu["attributes"])
