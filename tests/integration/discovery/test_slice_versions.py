"""Version-aware publishing against the API emulator of 1.34, 1.35 and 1.36.

The emulator validates each version's ResourceSlice rules and drops fields whose feature gate
is off, like a real kube-apiserver: a pool it accepts whole is the proof. The node is an
8-GPU H100 node behind the fake NVML, with every MIG profile published as partitions.
"""

from __future__ import annotations

import asyncio
import dataclasses
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from devcluster.apiserver import APIServerEmulator, ClusterConfig
from services.discovery import cli
from services.discovery.agent import DiscoveryAgent
from shared.config import KubeSettings, NATSSettings
from shared.vendors.parts.discovery import BackendSeams
from tests.fakes.nvml import FakeNVML
from tests.integration.discovery.agent_runner import eventually, running

pytestmark = pytest.mark.integration

NODE = "n1"
DRIVER = "gpu.dra-suite.io"
PROFILES = "1g.10gb,1g.10gb+me,1g.20gb,2g.20gb,3g.40gb,4g.40gb,7g.80gb"
DEVICES_PER_GPU = 1 + 7 + 7 + 4 + 3 + 2 + 1 + 1


def ours(kube: APIServerEmulator) -> list[dict[str, Any]]:
    return [s for s in kube.objects("resourceslices") if s["spec"]["nodeName"] == NODE]


def pool(kube: APIServerEmulator, *, devices: int) -> list[dict[str, Any]] | None:
    """The slices once the newest generation is complete, alone and holds `devices` devices."""
    found = ours(kube)
    if not found:
        return None
    newest = max(s["spec"]["pool"]["generation"] for s in found)
    current = [s for s in found if s["spec"]["pool"]["generation"] == newest]
    complete = len(current) == current[0]["spec"]["pool"]["resourceSliceCount"] == len(found)
    count = sum(len(s["spec"].get("devices", [])) for s in current)
    return current if complete and count == devices else None


def slice_writes(kube: APIServerEmulator) -> int:
    return len(kube.request_log.writes("resourceslices"))


def events(kube: APIServerEmulator) -> list[dict[str, Any]]:
    return kube.objects("events", namespace="default")


@pytest.fixture
def node(kube: APIServerEmulator) -> None:
    kube.create_object({"apiVersion": "v1", "kind": "Node", "metadata": {"name": NODE}})


@pytest.fixture
def h100_agent(
    nats_settings: NATSSettings, kube_settings: KubeSettings, tmp_path: Path
) -> Callable[[], DiscoveryAgent]:
    """A new discovery agent on the same fake 8-GPU H100 node, every MIG profile published."""
    fake = FakeNVML.node("H100-80GB", count=8)
    fake.populate_sysfs(tmp_path)
    argv = ["--node-name", NODE, "--backend", "nvml", "--driver-name", DRIVER]
    argv += [
        "--sysfs-root",
        str(tmp_path),
        "--mig-profiles",
        PROFILES,
        "--publish-pci-bus-id",
        "true",
    ]
    config = cli.parse_config(argv, {})
    config = dataclasses.replace(config, nats=nats_settings, kube=kube_settings)

    def make() -> DiscoveryAgent:
        return DiscoveryAgent(config, seams=BackendSeams(nvml=fake))

    return make


def _partitionable(version: str) -> ClusterConfig:
    return ClusterConfig.for_tests(version, DRAPartitionableDevices=True)


@pytest.mark.parametrize(
    ("kube", "counters_apart", "pci_bus_id"),
    [
        (_partitionable("1.34"), False, False),
        (_partitionable("1.35"), True, False),
        (_partitionable("1.36"), True, True),
    ],
    indirect=["kube"],
    ids=["1.34", "1.35", "1.36"],
)
async def test_an_h100_mig_pool_is_accepted_whole_on_every_version(
    kube: APIServerEmulator,
    node: None,
    h100_agent: Callable[[], DiscoveryAgent],
    counters_apart: bool,
    pci_bus_id: bool,
):
    async with running(h100_agent()):
        published = await eventually(lambda: pool(kube, devices=8 * DEVICES_PER_GPU))
        writes = slice_writes(kube)
        await asyncio.sleep(0.5)
        assert slice_writes(kube) == writes  # steady: nothing more to write
    assert events(kube) == []  # nothing rejected, nothing dropped
    sets = [s["spec"]["sharedCounters"] for s in published if s["spec"].get("sharedCounters")]
    assert sorted(c["name"] for group in sets for c in group) == [
        f"gpu-{i}-counter-set" for i in range(8)
    ]
    for found in published:
        spec = found["spec"]
        if counters_apart:
            assert not (spec.get("sharedCounters") and spec.get("devices"))
        else:  # 1.34: each slice holds the counter sets its devices consume
            used = {c["counterSet"] for d in spec["devices"] for c in d["consumesCounters"]}
            assert used == {c["name"] for c in spec["sharedCounters"]}
    gpu = next(d for s in published for d in s["spec"].get("devices", []) if d["name"] == "gpu-0")
    assert ("resource.kubernetes.io/pciBusID" in gpu["attributes"]) is pci_bus_id
    assert gpu["attributes"]["resource.kubernetes.io/pcieRoot"] == {"string": "pci0000:10"}


@pytest.mark.parametrize("kube", ["1.35"], indirect=True)  # DRAPartitionableDevices: off
async def test_dropped_partition_fields_are_reported_once_and_partitions_withdrawn(
    kube: APIServerEmulator, node: None, h100_agent: Callable[[], DiscoveryAgent]
):
    async with running(h100_agent()):
        published = await eventually(lambda: pool(kube, devices=8))
        writes = slice_writes(kube)
        await asyncio.sleep(1.0)
        assert slice_writes(kube) == writes  # no update loop
    (event,) = events(kube)
    assert (event["type"], event["reason"]) == ("Warning", "ResourceSliceFieldsDropped")
    assert event["involvedObject"]["name"] == NODE
    assert "DRAPartitionableDevices" in event["message"]
    assert "consumesCounters" in event["message"] or "sharedCounters" in event["message"]
    # Without counters the scheduler could hand out a GPU and its partitions at once:
    # only the whole GPUs stay published.
    (found,) = published
    devices = found["spec"]["devices"]
    assert [d["name"] for d in devices] == [f"gpu-{i}" for i in range(8)]
    assert all("consumesCounters" not in d for d in devices)
    assert writes == 2  # the first create (cut short by what it taught), one correction


@pytest.mark.parametrize("kube", [_partitionable("1.35")], indirect=True, ids=["1.35"])
async def test_a_restart_adopts_slices_named_the_v035_way_without_writes(
    kube: APIServerEmulator, node: None, h100_agent: Callable[[], DiscoveryAgent]
):
    async with running(h100_agent()):
        first = await eventually(lambda: pool(kube, devices=8 * DEVICES_PER_GPU))
    assert sorted(s["metadata"]["name"][:6] for s in first) == [f"0000{i}-" for i in range(5)]
    old_names = []
    for k, published in enumerate(first):  # as an agent using v0.35 names left them
        kube.delete_object("resourceslices", published["metadata"]["name"])
        name = f"{NODE}-{DRIVER}-old{k:02d}"
        metadata = {"name": name, "ownerReferences": published["metadata"]["ownerReferences"]}
        kube.create_object({**published, "metadata": metadata})
        old_names.append(name)
    writes = slice_writes(kube)
    async with running(h100_agent()):
        await asyncio.sleep(0.5)
    assert slice_writes(kube) == writes
    assert sorted(s["metadata"]["name"] for s in ours(kube)) == sorted(old_names)
