"""The Ascend backend through a fake npu-smi: sim-compatible attributes, errors, the scanner."""

from __future__ import annotations

import asyncio
import stat
from pathlib import Path

import pytest

from services.discovery import inventory
from services.discovery.scanner import DeviceScanner
from shared import commands
from shared.errors import BackendUnavailableError
from shared.pb.drasuite.v1 import inventory_pb2
from shared.sim import profile
from shared.vendors.ascend import discovery as ascend
from shared.vendors.parts.sysfs import Sysfs
from shared.vendors.sim import discovery as sim
from tests.fakes.npusmi import FIXTURES, FakeNpuSmi
from tests.fakes.sysfs import add_pci_device

IDENTITY = inventory.Identity(driver="sim.dra-suite.io", node="n1", pool="n1", backend="ascend")
BUSES_910B3 = ["c1", "c2", "81", "82", "01", "02", "41", "42"]


def backend(fake: FakeNpuSmi, sysfs_root: Path | None = None) -> ascend.AscendBackend:
    sysfs = Sysfs(sysfs_root) if sysfs_root is not None else Sysfs("/nonexistent")
    return ascend.AscendBackend(run_command=fake, sysfs=sysfs, timeout_s=5)


def by_name(devices) -> dict[str, inventory_pb2.Device]:
    return {device.name: device for device in devices}


def attributes(device: inventory_pb2.Device) -> dict[str, object]:
    return {k: getattr(v, v.WhichOneof("value") or "string") for k, v in device.attributes.items()}


@pytest.fixture
def sysfs_910b3(tmp_path: Path) -> Path:
    for k, bus in enumerate(BUSES_910B3):
        add_pci_device(
            tmp_path, f"0000:{bus}:00.0", pcie_root=f"pci0000:{bus[0]}0", numa_node=k // 2
        )
    return tmp_path


async def test_910b_npus_are_published_with_the_sim_attribute_names(sysfs_910b3):
    fake = FakeNpuSmi.from_fixtures("910b3-8npu.txt", "910b3-topo-published.txt")
    scan = await backend(fake, sysfs_910b3).scan()
    devices = by_name(scan.devices)
    assert sorted(devices) == [f"npu-{i}" for i in range(8)]
    npu = devices["npu-2"]
    assert attributes(npu) == {
        "type": "npu",
        "chipName": "910B3",
        "index": 2,
        "physicalId": 2,
        "cardId": 2,
        "chipId": 0,
        "numaNode": 1,
        "topologyGroup": "hccs-ring-0",
        "resource.kubernetes.io/pcieRoot": "pci0000:80",
    }
    assert dict(npu.capacity) == {"memCapacity": "64Gi", "aiCore": "20"}
    assert [n.path for n in npu.device_nodes] == [
        "/dev/davinci2",
        "/dev/davinci_manager",
        "/dev/devmm_svm",
        "/dev/hisi_hdc",
    ]
    assert dict(npu.env) == {"ASCEND_VISIBLE_DEVICES": "2"}
    assert fake.calls[:2] == [("npu-smi", "info"), ("npu-smi", "info", "-t", "topo")]
    assert fake.calls[2:] == [
        ("npu-smi", "info", "-t", "info-vnpu", "-i", str(card), "-c", "0") for card in range(8)
    ]
    assert scan.shared_counters == ()  # no chip lists vNPUs: no counters
    assert not any(d.consumes_counters for d in scan.devices)


def test_the_published_names_are_those_of_the_sim_profile():
    shipped = {
        d.name: d for d in profile.load(str(sim.resolve("ascend-910b"))).devices if d.kind == "npu"
    }
    sim_npu = next(iter(shipped.values()))
    assert set(sim_npu.attributes) == {
        "type",
        "chipName",
        "index",
        "physicalId",
        "cardId",
        "chipId",
        "numaNode",
        "topologyGroup",
        "resource.kubernetes.io/pcieRoot",
    }
    assert set(sim_npu.capacity) == {"memCapacity", "aiCore"}


@pytest.mark.parametrize(
    ("info", "topo", "groups"),
    [
        ("910a-8npu.txt", "910a-topo.txt", ["hccs-ring-0"] * 4 + ["hccs-ring-1"] * 4),
        ("a3-16die.txt", "a3-topo.txt", ["hccs-ring-0"] * 16),
        ("310p3-published.txt", "310p3-topo.txt", [None]),
    ],
    ids=["910a-two-rings", "a3-one-domain", "310p-alone"],
)
async def test_topology_groups_come_from_hccs_links(info, topo, groups):
    scan = await backend(FakeNpuSmi.from_fixtures(info, topo)).scan()
    found = [attributes(d).get("topologyGroup") for d in scan.devices]
    assert found == groups


@pytest.mark.parametrize(
    ("info", "topo", "name", "memory", "cores"),
    [
        ("310p3-published.txt", "310p3-topo.txt", "npu-0", "21527Mi", "8"),
        ("310p3-vnpu.txt", "310p3-topo.txt", "npu-0", "2690Mi", "1"),
        ("910a-8npu.txt", "910a-topo.txt", "npu-7", "32Gi", "30"),
        ("a3-16die.txt", "a3-topo.txt", "npu-15", "64Gi", "20"),
    ],
    ids=["310p3", "310p-vnpu", "910a", "a3-die"],
)
async def test_capacity_follows_the_chip(info, topo, name, memory, cores):
    devices = by_name((await backend(FakeNpuSmi.from_fixtures(info, topo)).scan()).devices)
    assert dict(devices[name].capacity) == {"memCapacity": memory, "aiCore": cores}


async def test_a3_dies_use_their_physical_ids():
    devices = by_name(
        (await backend(FakeNpuSmi.from_fixtures("a3-16die.txt", "a3-topo.txt")).scan()).devices
    )
    assert attributes(devices["npu-3"])["physicalId"] == 3
    assert devices["npu-3"].env["ASCEND_VISIBLE_DEVICES"] == "3"


@pytest.mark.parametrize(
    ("info", "topo", "message"),
    [
        ("garbage.txt", "910b3-topo-published.txt", "output not understood: npu-smi info: no"),
        ("truncated.txt", "910b3-topo-published.txt", "without its second row"),
        ("910b3-8npu.txt", "topo-ragged.txt", "topo line 4: malformed row"),
        ("910b3-8npu.txt", "garbage.txt", "no header row"),
        ("910b3-8npu.txt", "910a-topo.txt", None),
        ("910b3-8npu.txt", "a3-topo.txt", "topo lists chips"),
    ],
    ids=["garbage-info", "truncated-info", "ragged-topo", "garbage-topo", "other-node", "a3-topo"],
)
async def test_malformed_output_fails_the_scan_with_a_clear_error(info, topo, message):
    scanning = backend(FakeNpuSmi.from_fixtures(info, topo)).scan()
    if message is None:  # same ids, different links: nothing to notice
        assert len((await scanning).devices) == 8
        return
    with pytest.raises(BackendUnavailableError, match=message) as raised:
        await scanning
    assert raised.value.backend == "ascend"


async def test_a_failing_npu_smi_fails_the_scan():
    fake = FakeNpuSmi.from_fixtures("910b3-8npu.txt", "910b3-topo-published.txt")
    del fake.outputs[("info", "-t", "topo")]
    with pytest.raises(BackendUnavailableError, match="npu-smi info -t topo: exit status 1"):
        await backend(fake).scan()


async def test_an_empty_node_needs_no_topology():
    fake = FakeNpuSmi.from_fixtures("header-only.txt", "garbage.txt")
    assert (await backend(fake).scan()).devices == ()


async def test_garbage_after_a_good_scan_keeps_the_last_inventory():
    fake = FakeNpuSmi.from_fixtures("910b3-8npu.txt", "910b3-topo-published.txt")
    scanner = DeviceScanner(backend(fake), identity=IDENTITY, interval_s=30)
    assert await scanner.scan_once()
    good = scanner.current
    assert good is not None
    fake.use(info="garbage.txt", topo="910b3-topo-published.txt")
    assert not await scanner.scan_once()
    assert scanner.current is good
    assert inventory.same_content(scanner.current, good)
    assert len(scanner.current.devices) == 8
    fake.use(info="910b3-8npu-published.txt", topo="topo-ragged.txt")
    assert not await scanner.scan_once()
    assert scanner.current is good


async def test_watch_asks_for_rescans_periodically():
    npu = ascend.AscendBackend(run_command=FakeNpuSmi(), poll_s=0.05)
    task = asyncio.create_task(npu.watch())
    try:
        await asyncio.wait_for(npu.changed.wait(), 1)
    finally:
        task.cancel()


def _script(path: Path, body: str) -> Path:
    path.write_text(f"#!/bin/sh\n{body}\n")
    path.chmod(path.stat().st_mode | stat.S_IEXEC)
    return path


async def test_the_real_runner_reads_a_real_npu_smi_binary(tmp_path):
    info = FIXTURES / "910b3-8npu.txt"
    topo = FIXTURES / "910b3-topo-published.txt"
    binary = _script(
        tmp_path / "npu-smi",
        f'if [ "$3" = topo ]; then cat "{topo}"; else cat "{info}"; fi',
    )
    npu = ascend.AscendBackend(npu_smi=str(binary), run_command=commands.run_command)
    assert len((await npu.scan()).devices) == 8


@pytest.mark.parametrize(
    ("body", "message"),
    [
        ("echo 'dcmi module initialize failed' >&2; exit 3", "exit status 3: dcmi module"),
        ("sleep 5", "no answer within 0.2s"),
    ],
    ids=["non-zero-exit", "hangs"],
)
async def test_the_real_runner_reports_failures_by_command(tmp_path, body, message):
    binary = _script(tmp_path / "npu-smi", body)
    with pytest.raises(commands.CommandFailedError, match=message):
        await commands.run_command([str(binary), "info"], timeout_s=0.2)


async def test_the_real_runner_reports_a_missing_binary(tmp_path):
    with pytest.raises(commands.CommandFailedError, match="cannot run"):
        await commands.run_command([str(tmp_path / "npu-smi"), "info"], timeout_s=1)
