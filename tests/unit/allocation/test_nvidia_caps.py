"""Capability device nodes for MIG devices made at prepare time."""

from __future__ import annotations

import os
import stat
from pathlib import Path

import pytest

from shared.errors import ClaimError
from shared.pb.drasuite.v1 import inventory_pb2
from shared.vendors.nvidia.caps import CapsNodeError, CapsNodes
from shared.vendors.nvidia.partitions import MigPartitionManager
from tests.fakes.nvml_mig import FakeMigNVML, cap_minor

PROC_DEVICES = """Character devices:
  1 mem
195 nvidia
236 nvidia-caps
237 nvidia-caps-imex-channels

Block devices:
236 nvidia-caps-not-really
259 blkext
"""
CLAIM = "aaaaaaaa-0000-4000-8000-000000000001"


class Recorder:
    def __init__(self) -> None:
        self.made: list[tuple[str, int, int]] = []

    def __call__(self, path: str, mode: int, device: int) -> None:
        self.made.append((path, mode, device))


@pytest.fixture
def proc_devices(tmp_path: Path) -> Path:
    path = tmp_path / "devices"
    path.write_text(PROC_DEVICES)
    return path


def _nodes(tmp_path: Path, proc_devices: Path, recorder: Recorder) -> CapsNodes:
    return CapsNodes(
        directory=tmp_path / "dev" / "nvidia-caps", proc_devices=proc_devices, make_node=recorder
    )


def test_the_major_is_the_character_device_named_nvidia_caps(tmp_path, proc_devices):
    assert _nodes(tmp_path, proc_devices, Recorder()).major() == 236


def test_a_missing_node_is_made_as_a_read_only_character_device(tmp_path, proc_devices):
    recorder = Recorder()
    nodes = _nodes(tmp_path, proc_devices, recorder)
    path = nodes.ensure(17)
    assert path == tmp_path / "dev" / "nvidia-caps" / "nvidia-cap17"
    assert recorder.made == [(str(path), stat.S_IFCHR | 0o444, os.makedev(236, 17))]
    assert stat.S_IMODE(path.parent.stat().st_mode) & 0o022 == 0


def test_a_file_in_the_way_is_an_error_not_overwritten(tmp_path, proc_devices):
    recorder = Recorder()
    nodes = _nodes(tmp_path, proc_devices, recorder)
    nodes.directory.mkdir(parents=True)
    (nodes.directory / "nvidia-cap3").write_text("not a device")
    with pytest.raises(CapsNodeError, match=r"nvidia-cap3 exists but is not the character device"):
        nodes.ensure(3)
    assert recorder.made == []


def test_a_node_made_meanwhile_by_someone_else_is_fine(tmp_path, proc_devices):
    def raced(path: str, mode: int, device: int) -> None:
        raise FileExistsError(path)

    nodes = CapsNodes(directory=tmp_path / "caps", proc_devices=proc_devices, make_node=raced)
    assert nodes.ensure(5) == tmp_path / "caps" / "nvidia-cap5"


def test_a_driver_without_nvidia_caps_is_a_clear_error(tmp_path):
    devices = tmp_path / "devices"
    devices.write_text("Character devices:\n195 nvidia\n")
    nodes = CapsNodes(directory=tmp_path / "caps", proc_devices=devices, make_node=Recorder())
    with pytest.raises(CapsNodeError, match="lists no nvidia-caps character device"):
        nodes.ensure(1)


def test_mknod_refused_is_a_clear_error(tmp_path, proc_devices):
    def refused(path: str, mode: int, device: int) -> None:
        raise PermissionError(1, "Operation not permitted")

    nodes = CapsNodes(directory=tmp_path / "caps", proc_devices=proc_devices, make_node=refused)
    with pytest.raises(CapsNodeError, match=r"making .*nvidia-cap9 \(236:9\): Operation not"):
        nodes.ensure(9)


def _gpu(nvml: FakeMigNVML) -> inventory_pb2.Device:
    uuid = nvml.gpus[0].uuid
    device = inventory_pb2.Device(name="gpu-0", kind="gpu", uuid=uuid)
    device.attributes["uuid"].string = uuid
    device.attributes["index"].int = 0
    device.device_nodes.add(path="/dev/nvidia0")
    return device


async def test_a_mig_partition_gets_both_of_its_capability_nodes(tmp_path, proc_devices):
    caps = tmp_path / "proc" / "capabilities"
    nvml = FakeMigNVML("H100-80GB", count=1, capabilities_root=caps)
    recorder = Recorder()
    manager = MigPartitionManager(
        tmp_path / "mig-partitions.json",
        open_library=lambda: nvml,
        capabilities_root=caps,
        caps_nodes=_nodes(tmp_path, proc_devices, recorder),
    )
    await manager.create(claim_uid=CLAIM, device=_gpu(nvml), profile="1g.10gb")
    [(gi, _, _)] = nvml.gpu_instances_of(0)
    made = [os.minor(device) for _, _, device in recorder.made]
    assert made == [cap_minor(0, gi), cap_minor(0, gi, 0)]


async def test_a_node_that_cannot_be_made_fails_the_claim(tmp_path):
    caps = tmp_path / "proc" / "capabilities"
    nvml = FakeMigNVML("H100-80GB", count=1, capabilities_root=caps)
    no_driver = tmp_path / "devices"
    no_driver.write_text("Character devices:\n")
    manager = MigPartitionManager(
        tmp_path / "mig-partitions.json",
        open_library=lambda: nvml,
        capabilities_root=caps,
        caps_nodes=CapsNodes(directory=tmp_path / "caps", proc_devices=no_driver),
    )
    with pytest.raises(ClaimError, match=r"MIG capability of gpu-0: .*no nvidia-caps"):
        await manager.create(claim_uid=CLAIM, device=_gpu(nvml), profile="1g.10gb")
