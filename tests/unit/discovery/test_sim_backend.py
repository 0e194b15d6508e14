"""The sim backend: profile mapping to inventory devices, hot-plug in process and by file."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from shared.errors import BackendUnavailableError
from shared.pb.drasuite.v1 import inventory_pb2
from shared.sim import profile
from shared.sim.profile import SimDevice, SimDeviceNode, VersionValue
from shared.vendors.sim import discovery as sim

PROFILE = """\
apiVersion: sim.dra-suite.io/v1
kind: SimProfile
metadata: {name: tiny}
devices:
- name: dev-0
  kind: npu
  attributes: {numaNode: 0}
"""


def _device(name: str = "dev-9", **attributes) -> SimDevice:
    return SimDevice(name=name, kind="gpu", attributes=attributes)


@pytest.mark.parametrize(
    ("value", "field", "expected"),
    [
        (3, "int", 3),
        (True, "bool", True),
        (False, "bool", False),
        ("910B4", "string", "910B4"),
        (VersionValue("9.0.0"), "version", "9.0.0"),
    ],
    ids=["int", "bool-true", "bool-false-not-int", "string", "version"],
)
def test_sim_attributes_map_to_typed_values(value, field, expected):
    mapped = sim.attribute_value(value)
    assert mapped.WhichOneof("value") == field
    assert getattr(mapped, field) == expected


def test_sim_device_maps_capacity_nodes_env_and_identity():
    device = SimDevice(
        name="npu-0",
        kind="npu",
        uuid="u-1",
        attributes={"numaNode": 1, "resource.kubernetes.io/pcieRoot": "pci0000:00"},
        capacity={"memCapacity": "32Gi"},
        device_nodes=(SimDeviceNode("/dev/davinci0", "/dev/null"),),
        env={"ASCEND_VISIBLE_DEVICES": "0"},
    )
    mapped = sim.to_device(device)
    assert (mapped.name, mapped.kind, mapped.uuid) == ("npu-0", "npu", "u-1")
    assert mapped.attributes["numaNode"].int == 1
    assert mapped.attributes["resource.kubernetes.io/pcieRoot"].string == "pci0000:00"
    assert dict(mapped.capacity) == {"memCapacity": "32Gi"}
    assert list(mapped.device_nodes) == [
        inventory_pb2.DeviceNode(path="/dev/davinci0", host_path="/dev/null")
    ]
    assert dict(mapped.env) == {"ASCEND_VISIBLE_DEVICES": "0"}


async def test_shipped_mixed_profile_scans_npus_and_gpus():
    backend = sim.SimBackend.from_profile("mixed")
    scan = await backend.scan()
    names = {d.name for d in scan.devices}
    assert {f"npu-{i}" for i in range(8)} | {f"gpu-{i}" for i in range(4)} == names
    gpu = next(d for d in scan.devices if d.name == "gpu-0")
    assert gpu.attributes["driverVersion"].version == "580.95.5"


async def test_add_device_signals_change_and_shows_in_the_next_scan():
    backend = sim.SimBackend([_device("dev-0")])
    backend.add_device(_device("dev-1", numaNode=1))
    assert backend.changed.is_set()
    assert [d.name for d in (await backend.scan()).devices] == ["dev-0", "dev-1"]


async def test_remove_device_and_set_attribute_change_the_scan():
    backend = sim.SimBackend([_device("dev-0", numaNode=0), _device("dev-1")])
    backend.remove_device("dev-1")
    backend.set_attribute("dev-0", "numaNode", 5)
    backend.set_attribute("dev-0", "healthy", True)
    (device,) = (await backend.scan()).devices
    assert device.attributes["numaNode"].int == 5
    assert device.attributes["healthy"].bool is True
    backend.set_attribute("dev-0", "healthy", None)
    (device,) = (await backend.scan()).devices
    assert "healthy" not in device.attributes


def test_adding_a_device_twice_is_refused():
    backend = sim.SimBackend([_device("dev-0")])
    with pytest.raises(ValueError, match="already exists"):
        backend.add_device(_device("dev-0"))


async def test_unavailable_backend_fails_scans_until_available_again():
    backend = sim.SimBackend([_device("dev-0")])
    backend.set_available(False)
    with pytest.raises(BackendUnavailableError):
        await backend.scan()
    backend.set_available(True)
    assert len((await backend.scan()).devices) == 1


async def _watch_until_changed(backend: sim.SimBackend) -> None:
    watcher = asyncio.create_task(backend.watch())
    try:
        await asyncio.wait_for(backend.changed.wait(), 3)
    finally:
        watcher.cancel()


async def test_profile_file_change_is_picked_up_as_hot_plug(tmp_path: Path):
    path = tmp_path / "tiny.yaml"
    path.write_text(PROFILE)
    backend = sim.SimBackend.from_profile(str(path), poll_s=0.02)
    path.write_text(PROFILE + "- name: dev-1\n  kind: npu\n")
    await _watch_until_changed(backend)
    assert [d.name for d in (await backend.scan()).devices] == ["dev-0", "dev-1"]


def test_a_shipped_profile_is_not_followed_and_a_profile_file_of_ones_own_is(tmp_path: Path):
    assert sim.SimBackend.from_profile("ascend-910b").path is None
    shipped = profile.PROFILES_DIR / "ascend-910b.yaml"
    assert sim.SimBackend.from_profile(str(shipped)).path is None
    own = tmp_path / "ascend-910b.yaml"
    own.write_text(shipped.read_text())
    assert sim.SimBackend.from_profile(str(own)).path == own


async def test_a_backend_following_no_file_waits_for_ever():
    backend = sim.SimBackend([_device("dev-0")], poll_s=0.001)
    watcher = asyncio.create_task(backend.watch())
    await asyncio.sleep(0.05)
    assert not watcher.done()
    watcher.cancel()
    assert not backend.changed.is_set()


async def test_invalid_profile_file_keeps_the_last_devices(tmp_path: Path):
    path = tmp_path / "tiny.yaml"
    path.write_text(PROFILE)
    backend = sim.SimBackend.from_profile(str(path), poll_s=0.02)
    path.write_text("kind: NotAProfile\n")
    watcher = asyncio.create_task(backend.watch())
    await asyncio.sleep(0.2)
    watcher.cancel()
    assert not backend.changed.is_set()
    assert [d.name for d in (await backend.scan()).devices] == ["dev-0"]
