"""The discovery agent with `--backend nvml` / `--backend ascend` over fake hardware.

The agent runs in process against real NATS and the API emulator; only the hardware interface
is replaced (`BackendSeams`): the fake NVML of an 8-GPU H100 node, or a fake npu-smi that
prints captured outputs. The emulator validates every slice like a real API server.
"""

from __future__ import annotations

import asyncio
import dataclasses
from pathlib import Path
from typing import Any

import pytest

from devcluster.apiserver import APIServerEmulator, ClusterConfig
from services.discovery import cli
from services.discovery.agent import DiscoveryAgent
from services.discovery.config import DiscoveryConfig
from shared import metrics
from shared.config import KubeSettings, NATSSettings
from shared.vendors.parts.discovery import BackendSeams
from tests.fakes.npusmi import FakeNpuSmi
from tests.fakes.nvml import FakeNVML
from tests.fakes.sysfs import add_pci_device
from tests.integration.discovery.agent_runner import eventually, running

pytestmark = pytest.mark.integration

NODE = "n1"
PARTITIONABLE = [
    pytest.param(ClusterConfig.for_tests("1.35", DRAPartitionableDevices=True), id="1.35"),
    pytest.param("1.36", id="1.36"),
]


def configure(argv: list[str], nats: NATSSettings, kube: KubeSettings) -> DiscoveryConfig:
    config = cli.parse_config(["--node-name", NODE, *argv], {})
    return dataclasses.replace(config, nats=nats, kube=kube)


def pool(kube: APIServerEmulator, *, driver: str) -> list[dict[str, Any]] | None:
    """The slices of the newest generation, once all of them exist."""
    found = [
        s
        for s in kube.objects("resourceslices")
        if s["spec"]["nodeName"] == NODE and s["spec"]["driver"] == driver
    ]
    if not found:
        return None
    newest = max(s["spec"]["pool"]["generation"] for s in found)
    current = [s for s in found if s["spec"]["pool"]["generation"] == newest]
    expected = current[0]["spec"]["pool"]["resourceSliceCount"]
    return current if len(current) == expected == len(found) else None


def devices_of(slices: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    return {d["name"]: d for s in slices for d in s["spec"].get("devices", [])}


@pytest.fixture
def node(kube: APIServerEmulator) -> None:
    kube.create_object({"apiVersion": "v1", "kind": "Node", "metadata": {"name": NODE}})


@pytest.mark.parametrize("kube", PARTITIONABLE, indirect=True)
async def test_an_h100_node_with_mig_partitions_is_accepted_whole(
    kube: APIServerEmulator,
    node: None,
    nats_settings: NATSSettings,
    kube_settings: KubeSettings,
    tmp_path: Path,
):
    fake = FakeNVML.node("H100-80GB", count=8)
    fake.populate_sysfs(tmp_path)
    argv = ["--backend", "nvml", "--driver-name", "gpu.dra-suite.io", "--sysfs-root", str(tmp_path)]
    argv += ["--mig-profiles", "1g.10gb,2g.20gb,3g.40gb,7g.80gb"]
    config = configure(argv, nats_settings, kube_settings)
    seams = BackendSeams(nvml=fake)
    async with running(DiscoveryAgent(config, seams=seams)):
        slices = await eventually(lambda: pool(kube, driver="gpu.dra-suite.io"))
    counter_slices = [s for s in slices if s["spec"].get("sharedCounters")]
    assert [len(s["spec"]["sharedCounters"]) for s in counter_slices] == [8]
    assert all("devices" not in s["spec"] for s in counter_slices)
    devices = devices_of(slices)
    assert len(devices) == 8 * (1 + 7 + 3 + 2 + 1)
    gpu = devices["gpu-5"]
    assert gpu["attributes"]["driverVersion"] == {"version": "550.54.15"}
    assert gpu["attributes"]["cudaComputeCapability"] == {"version": "9.0.0"}
    assert gpu["attributes"]["resource.kubernetes.io/pcieRoot"] == {"string": "pci0000:a0"}
    assert gpu["attributes"]["numaNode"] == {"int": 1}
    assert gpu["consumesCounters"][0]["counterSet"] == "gpu-5-counter-set"
    mig = devices["gpu-5-mig-3g40gb-9-4"]
    assert mig["attributes"]["profile"] == {"string": "3g.40gb"}
    assert mig["consumesCounters"][0]["counters"]["memory-slice-7"] == {"value": "1"}
    assert kube.objects("events", namespace="default") == []


async def test_nvml_polling_rewrites_nothing_while_the_gpus_stay_the_same(
    kube: APIServerEmulator,
    node: None,
    nats_settings: NATSSettings,
    kube_settings: KubeSettings,
):
    argv = ["--backend", "nvml", "--backend-poll-s", "0.1", "--mig-profiles", "1g.10gb"]
    config = configure(argv, nats_settings, kube_settings)
    fake = FakeNVML.node("H100-80GB", count=2)
    async with running(DiscoveryAgent(config, seams=BackendSeams(nvml=fake))):
        await eventually(lambda: pool(kube, driver="sim.dra-suite.io"))
        writes = len(kube.request_log.writes("resourceslices"))
        calls = fake.calls
        await asyncio.sleep(0.6)
        assert fake.calls > calls  # it did rescan
        assert len(kube.request_log.writes("resourceslices")) == writes


@pytest.mark.parametrize("kube", ["1.34"], indirect=True)
async def test_a_gpu_node_without_partitions_is_accepted_on_1_34(
    nats_settings: NATSSettings, kube_settings: KubeSettings, kube: APIServerEmulator, node: None
):
    config = configure(["--backend", "nvml"], nats_settings, kube_settings)
    fake = FakeNVML.node("A100-80GB", count=4, nvlink="pairs")
    async with running(DiscoveryAgent(config, seams=BackendSeams(nvml=fake))):
        slices = await eventually(lambda: pool(kube, driver="sim.dra-suite.io"))
    devices = devices_of(slices)
    assert sorted(devices) == [f"gpu-{i}" for i in range(4)]
    assert devices["gpu-3"]["attributes"]["interconnectGroup"] == {"string": "nvlink-1"}


async def test_an_ascend_node_is_published_with_the_sim_attributes(
    kube: APIServerEmulator,
    node: None,
    nats_settings: NATSSettings,
    kube_settings: KubeSettings,
    tmp_path: Path,
):
    for k, bus in enumerate(["c1", "c2", "81", "82", "01", "02", "41", "42"]):
        add_pci_device(
            tmp_path, f"0000:{bus}:00.0", pcie_root=f"pci0000:{bus[0]}0", numa_node=k % 4
        )
    fake = FakeNpuSmi.from_fixtures("910b3-8npu.txt", "910b3-topo-published.txt")
    argv = ["--backend", "ascend", "--sysfs-root", str(tmp_path), "--npu-smi-path", "/x/npu-smi"]
    config = configure(argv, nats_settings, kube_settings)
    async with running(DiscoveryAgent(config, seams=BackendSeams(run_command=fake))):
        slices = await eventually(lambda: pool(kube, driver="sim.dra-suite.io"))
    devices = devices_of(slices)
    assert sorted(devices) == [f"npu-{i}" for i in range(8)]
    on_numa_2 = sorted(n for n, d in devices.items() if d["attributes"]["numaNode"] == {"int": 2})
    assert on_numa_2 == ["npu-2", "npu-6"]
    assert devices["npu-6"]["attributes"]["chipName"] == {"string": "910B3"}
    assert devices["npu-6"]["capacity"] == {
        "memCapacity": {"value": "64Gi"},
        "aiCore": {"value": "20"},
    }
    assert fake.calls[0] == ("/x/npu-smi", "info")


def scan_events(kube: APIServerEmulator, reason: str) -> list[dict[str, Any]]:
    return [e for e in kube.objects("events", namespace="default") if e["reason"] == reason]


async def test_npu_smi_garbage_raises_one_warning_keeps_the_devices_and_recovery_a_normal_event(
    kube: APIServerEmulator,
    node: None,
    nats_settings: NATSSettings,
    kube_settings: KubeSettings,
):
    metrics.configure(service="test")
    fake = FakeNpuSmi.from_fixtures("910b3-8npu.txt", "910b3-topo-published.txt")
    argv = ["--backend", "ascend", "--backend-poll-s", "0.05", "--sysfs-root", "/nonexistent"]
    config = configure(argv, nats_settings, kube_settings)
    async with running(DiscoveryAgent(config, seams=BackendSeams(run_command=fake))):
        published = await eventually(lambda: pool(kube, driver="sim.dra-suite.io"))
        writes = len(kube.request_log.writes("resourceslices"))
        fake.use(info="garbage.txt", topo="910b3-topo-published.txt")
        (warning,) = await eventually(lambda: scan_events(kube, "BackendScanFailed"))
        calls = len(fake.calls)
        await eventually(lambda: len(fake.calls) > calls + 20)  # ten more failed polls
        assert len(scan_events(kube, "BackendScanFailed")) == 1
        assert len(kube.request_log.writes("events")) == 1  # nothing per poll
        assert warning["type"] == "Warning"
        assert "npu-smi output not understood" in warning["message"]
        assert "last good inventory (8 devices) stays published" in warning["message"]
        assert 'dra_backend_scan_failing{backend="ascend"} 1.0' in metrics.render().decode()
        # The devices stay published as they were.
        assert len(kube.request_log.writes("resourceslices")) == writes
        assert pool(kube, driver="sim.dra-suite.io") == published

        fake.use(info="910b3-8npu.txt", topo="910b3-topo-published.txt")
        (recovered,) = await eventually(lambda: scan_events(kube, "BackendScanRecovered"))
    assert recovered["type"] == "Normal"
    assert recovered["involvedObject"]["name"] == NODE
    assert len(kube.request_log.writes("resourceslices")) == writes
