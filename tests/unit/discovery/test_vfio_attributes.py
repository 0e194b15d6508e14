"""Discovery publishes which devices can pass through to a virtual machine (docs/vfio.md): a
whole device with an IOMMU group gets `iommuGroup`, `vfioViable` (the group holds only the
device's own functions, no bridge) and its `resource.kubernetes.io/pciBusID`, on the nvml,
ascend and sim backends; partitions (MIG devices) and devices without a group get none."""

from __future__ import annotations

from pathlib import Path

from shared.pb.drasuite.v1 import inventory_pb2
from shared.sim.profile import SimDevice
from shared.vendors.ascend import discovery as ascend
from shared.vendors.nvidia import discovery as nvml
from shared.vendors.parts.sysfs import Sysfs, normalize_bus_id
from shared.vendors.sim import discovery as sim
from tests.fakes import sysfs_pci
from tests.fakes.npusmi import FakeNpuSmi
from tests.fakes.nvml import FakeNVML

VFIO = ("iommuGroup", "vfioViable", "resource.kubernetes.io/pciBusID")


def _vfio(device: inventory_pb2.Device) -> dict[str, object]:
    found = {}
    for key in VFIO:
        if key in device.attributes:
            value = device.attributes[key]
            found[key] = getattr(value, value.WhichOneof("value") or "string")
    return found


def _by_name(devices: tuple[inventory_pb2.Device, ...]) -> dict[str, inventory_pb2.Device]:
    return {d.name: d for d in devices}


async def test_nvml_gpus_publish_their_group_and_whether_it_is_viable(tmp_path: Path):
    fake = FakeNVML.node("H100-80GB", count=3)
    buses = [normalize_bus_id(gpu.bus_id) for gpu in fake.gpus]
    sysfs_pci.gpu(tmp_path, buses[0], group=10)  # alone with its audio function: viable
    sysfs_pci.gpu(tmp_path, buses[1], group=11, audio=False)
    # A switch port in the GPU's group: no ACS below it, not viable.
    sysfs_pci.add_function(
        tmp_path, buses[1][:-1] + "2", pci_class=sysfs_pci.BRIDGE_CLASS, iommu_group=11
    )
    # gpu-2: no iommu_group link (IOMMU off).
    sysfs_pci.add_function(tmp_path, buses[2], iommu_group=None)
    backend = nvml.NvmlBackend.open(
        fake,
        options=nvml.NvmlOptions(mig_profiles=("1g.10gb",)),
        sysfs=Sysfs(tmp_path),
    )
    devices = _by_name((await backend.scan()).devices)
    assert _vfio(devices["gpu-0"]) == {
        "iommuGroup": 10,
        "vfioViable": True,
        "resource.kubernetes.io/pciBusID": buses[0],
    }
    assert _vfio(devices["gpu-1"]) == {
        "iommuGroup": 11,
        "vfioViable": False,
        "resource.kubernetes.io/pciBusID": buses[1],
    }
    assert _vfio(devices["gpu-2"]) == {}
    migs = [d for d in devices.values() if d.kind == "mig"]
    assert migs
    assert all("iommuGroup" not in d.attributes and "vfioViable" not in d.attributes for d in migs)


async def test_ascend_chips_publish_their_group(tmp_path: Path):
    sysfs_pci.npu(tmp_path, "0000:c1:00.0", group=40)
    fake = FakeNpuSmi.from_fixtures("910b3-8npu.txt", "910b3-topo-published.txt")
    backend = ascend.AscendBackend(run_command=fake, sysfs=Sysfs(tmp_path), timeout_s=5)
    devices = _by_name((await backend.scan()).devices)
    with_group = {name: _vfio(d) for name, d in devices.items() if _vfio(d)}
    assert with_group == {
        "npu-0": {
            "iommuGroup": 40,
            "vfioViable": True,
            "resource.kubernetes.io/pciBusID": "0000:c1:00.0",
        }
    }


async def test_sim_devices_with_a_pci_address_read_the_sim_tree(tmp_path: Path):
    sysfs_pci.gpu(tmp_path, "0000:3b:00.0", group=12)
    devices = [
        SimDevice(
            name="gpu-0",
            kind="gpu",
            attributes={"type": "gpu", "resource.kubernetes.io/pciBusID": "0000:3b:00.0"},
        ),
        SimDevice(name="gpu-1", kind="gpu", attributes={"type": "gpu"}),
    ]
    scan = await sim.SimBackend(devices, sysfs=Sysfs(tmp_path)).scan()
    found = _by_name(scan.devices)
    assert _vfio(found["gpu-0"]) == {
        "iommuGroup": 12,
        "vfioViable": True,
        "resource.kubernetes.io/pciBusID": "0000:3b:00.0",
    }
    assert _vfio(found["gpu-1"]) == {}
    # Without a sim tree the profile's attributes are published as they are.
    plain = _by_name((await sim.SimBackend(devices).scan()).devices)
    assert _vfio(plain["gpu-0"]) == {"resource.kubernetes.io/pciBusID": "0000:3b:00.0"}
