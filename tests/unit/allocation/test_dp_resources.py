"""Extended resources of the device-plugin front, and what one container's Allocate answer
carries: names per backend and kind, overrides, the allowlisted edits, the static CDI spec."""

from __future__ import annotations

import pytest

from services.allocation.cdi import spec_files
from services.allocation.cdi.allowlist import ForbiddenEditError
from services.allocation.deviceplugin import container_devices, resources
from services.allocation.resource_names import parse_overrides
from shared.pb.drasuite.v1 import inventory_pb2
from shared.vendors.sim.discovery import SimBackend

SIM = "sim.dra-suite.io"


def npu(index: int, chip: str = "910B4", **attributes: int | str) -> inventory_pb2.Device:
    device = inventory_pb2.Device(
        name=f"npu-{index}",
        kind="npu",
        device_nodes=[inventory_pb2.DeviceNode(path=f"/dev/davinci{index}")],
        env={"ASCEND_VISIBLE_DEVICES": str(index)},
    )
    device.attributes["index"].int = index
    device.attributes["chipName"].string = chip
    for key, value in attributes.items():
        if isinstance(value, int):
            device.attributes[key].int = value
        else:
            device.attributes[key].string = value
    return device


def gpu(
    index: int, *, kind: str = "gpu", uuid: str | None = None, profile: str = ""
) -> inventory_pb2.Device:
    device = inventory_pb2.Device(
        name=f"gpu-{index}" if kind == "gpu" else f"gpu-0-mig-{index}",
        kind=kind,
        uuid=f"GPU-{index}" if uuid is None else uuid,
        device_nodes=[inventory_pb2.DeviceNode(path="/dev/nvidia0")],
        parent="gpu-0" if kind == "mig" else "",
    )
    device.attributes["index"].int = 0
    if profile:
        device.attributes["profile"].string = profile
    return device


@pytest.mark.parametrize(
    ("backend", "device", "expected"),
    [
        ("ascend", npu(0, "910B4"), "huawei.com/Ascend910"),
        ("ascend", npu(0, "Ascend910"), "huawei.com/Ascend910"),
        ("ascend", npu(0, "310P3"), "huawei.com/Ascend310P"),
        ("ascend", npu(0, "310"), "huawei.com/Ascend310"),
        ("ascend", npu(0, "310Pvir02"), "huawei.com/Ascend310P-2c"),
        ("ascend", npu(0, "910B4vir05_1c_8g"), "huawei.com/Ascend910-5c.1cpu.8g"),
        ("ascend", npu(0, "910B4vir10_3c_16g_nm"), "huawei.com/Ascend910-10c.3cpu.16g.ndvpp"),
        ("ascend", npu(0, "310Pvir04_zz"), None),
        ("nvml", gpu(0), "nvidia.com/gpu"),
        ("nvml", gpu(1, kind="mig", uuid="MIG-1", profile="1g.10gb"), "nvidia.com/mig-1g.10gb"),
        ("nvml", gpu(1, kind="mig", uuid="", profile="1g.10gb"), None),
        ("sim", npu(0), f"{SIM}/npu"),
        ("sim", gpu(0), f"{SIM}/gpu"),
        ("sim", gpu(1, kind="mig", profile="1g.10gb"), None),
    ],
    ids=[
        "910b",
        "a3",
        "310p",
        "310",
        "310p-vnpu",
        "910b-vnpu",
        "910b-vnpu-ndvpp",
        "unknown-template",
        "gpu",
        "mig-that-exists",
        "mig-not-made-yet",
        "sim-npu",
        "sim-gpu",
        "sim-partition",
    ],
)
def test_resource_names_follow_the_vendors_device_plugins(backend, device, expected):
    assert resources.resource_name(device, backend=backend, driver=SIM, overrides={}) == expected


def test_an_on_demand_placement_is_not_offered():
    device = gpu(1, kind="mig", uuid="MIG-1", profile="1g.10gb")
    device.attributes["createdOnDemand"].bool = True
    assert resources.resource_name(device, backend="nvml", driver=SIM, overrides={}) is None


def test_overrides_rename_a_kind_or_a_resource_but_not_a_kinds_partitions():
    overrides = parse_overrides("npu=example.com/npu, nvidia.com/gpu=example.com/big-gpu")
    assert overrides == {"npu": "example.com/npu", "nvidia.com/gpu": "example.com/big-gpu"}

    def name(backend: str, device: inventory_pb2.Device) -> str | None:
        return resources.resource_name(device, backend=backend, driver=SIM, overrides=overrides)

    assert name("ascend", npu(0)) == "example.com/npu"
    assert name("sim", npu(0)) == "example.com/npu"
    assert name("ascend", npu(0, "310Pvir02")) == "huawei.com/Ascend310P-2c"
    assert name("nvml", gpu(0)) == "example.com/big-gpu"


@pytest.mark.parametrize(
    "text", ["npu", "npu=", "=a.com/b", "npu=no-slash", "npu=a.com/b/c", "npu=A_B.com/x"]
)
def test_bad_overrides_are_refused(text):
    with pytest.raises(ValueError, match="is not <kind or resource>="):
        parse_overrides(text)


async def test_the_mixed_sim_profile_offers_one_resource_per_kind():
    scan = await SimBackend.from_profile("mixed").scan()
    inventory = inventory_pb2.Inventory(driver=SIM, node="n", backend="sim", devices=scan.devices)
    found = resources.resources(inventory, driver=SIM, backend="sim", overrides={})
    assert {name: [d.name for d in r.devices] for name, r in found.items()} == {
        f"{SIM}/npu": [f"npu-{i}" for i in range(8)],
        f"{SIM}/gpu": [f"gpu-{i}" for i in range(4)],
    }


# --- what a container gets ------------------------------------------------------------------


def test_two_ascend_npus_get_their_nodes_control_nodes_joined_env_and_cdi_names():
    got = container_devices.container_allocation(
        [npu(0), npu(1)],
        backend="ascend",
        driver="npu.example.com",
        resource="huawei.com/Ascend910",
    )
    assert got.envs == {"ASCEND_VISIBLE_DEVICES": "0,1", "DRA_SUITE_DEVICES": "npu-0,npu-1"}
    assert got.device_nodes == [
        ("/dev/davinci0", "/dev/davinci0"),
        ("/dev/davinci1", "/dev/davinci1"),
        ("/dev/davinci_manager", "/dev/davinci_manager"),
        ("/dev/devmm_svm", "/dev/devmm_svm"),
        ("/dev/hisi_hdc", "/dev/hisi_hdc"),
    ]
    assert got.cdi_devices == [
        "k8s.npu.example.com/device=npu-0",
        "k8s.npu.example.com/device=npu-1",
    ]


def test_a_forged_device_node_or_variable_never_reaches_the_answer():
    forged = npu(0)
    forged.device_nodes[0].host_path = "/dev/null"
    forged.device_nodes.add(path="/dev/sda", host_path="/dev/sda")
    forged.env["LD_PRELOAD"] = "/tmp/evil.so"
    with pytest.raises(ForbiddenEditError) as caught:
        container_devices.container_allocation(
            [forged], backend="sim", driver=SIM, resource="x/npu"
        )
    kinds = sorted(edit.kind for edit in caught.value.rejected)
    assert kinds == ["device_node", "env_name"]


def test_the_static_spec_names_every_accepted_device_and_refuses_a_forged_one():
    forged = npu(2)
    forged.env["ASCEND_VISIBLE_DEVICES"] = "all"
    devices = [npu(0), npu(1), forged]
    for device in devices:
        device.device_nodes[0].host_path = "/dev/null"
    spec, refused = container_devices.static_spec(devices, backend="sim", driver=SIM)
    assert spec is not None
    assert spec["kind"] == f"k8s.{SIM}/device"
    assert [d["name"] for d in spec["devices"]] == ["npu-0", "npu-1"]
    assert spec["devices"][0]["containerEdits"] == {
        "deviceNodes": [{"path": "/dev/davinci0", "hostPath": "/dev/null"}]
    }
    assert list(refused) == ["npu-2"]
    assert "env value" in refused["npu-2"]
    assert spec_files.validate(spec) == []
    assert container_devices.spec_file_name(SIM) == f"k8s.{SIM}-device.json"


def test_a_static_mig_device_gets_its_parents_node_its_caps_and_its_mig_uuid():
    mig = gpu(1, kind="mig", uuid="MIG-1b2c", profile="1g.10gb")
    mig.device_nodes.add(path="/dev/nvidia-caps/nvidia-cap21")
    got = container_devices.container_allocation(
        [mig], backend="nvml", driver="gpu.example.com", resource="nvidia.com/mig-1g.10gb"
    )
    assert got.envs["NVIDIA_VISIBLE_DEVICES"] == "MIG-1b2c"
    assert [path for path, _ in got.device_nodes] == [
        "/dev/nvidia0",
        "/dev/nvidia-caps/nvidia-cap21",
        "/dev/nvidiactl",
        "/dev/nvidia-uvm",
        "/dev/nvidia-uvm-tools",
    ]


def test_a_static_vnpu_is_its_vdavinci_node_seen_as_davinci_and_runs_virtual():
    got = container_devices.container_allocation(
        [npu(100, "310Pvir02")],
        backend="ascend",
        driver="npu.example.com",
        resource="huawei.com/Ascend310P-2c",
    )
    assert got.envs["ASCEND_VISIBLE_DEVICES"] == "100"
    assert got.envs["ASCEND_RUNTIME_OPTIONS"] == "VIRTUAL"
    assert got.device_nodes[0] == ("/dev/davinci100", "/dev/vdavinci100")
