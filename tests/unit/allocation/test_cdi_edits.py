"""CDI edits per backend (Ascend, NVIDIA, sim), partitions and consumable-capacity shares.

Every spec built here is also checked against the CDI JSON schema and the loader's rules.
"""

from __future__ import annotations

from typing import Any

import pytest

from services.allocation.cdi import spec_files
from services.allocation.cdi.edits import DeviceUse, claim_edits
from services.allocation.cdi.schema_check import schema_problems
from services.allocation.claim.opaque import DeviceConfig, Strategy
from shared.errors import ClaimError
from shared.pb.drasuite.v1 import inventory_pb2
from shared.vendors.nvidia import discovery as nvml
from shared.vendors.nvidia.mig import H100_80GB, GpuInstance, MigDevice, Placement
from shared.vendors.parts.partitions import Partition

DRIVER = "sim.dra-suite.io"
UID = "3f1b2c4d-0000-4000-8000-00000000abcd"
SHARE_A = "0f5a9d1e-2b3c-4d5e-8f60-718293a4b5c6"
SHARE_B = "7c1d2e3f-4a5b-4c6d-9e7f-8091a2b3c4d5"
GPU_UUID = "GPU-9d11c4e2-e840-51ed-b15f-0be7ae073686"
MIG_UUID = "MIG-0e7a8c2d-5b1f-5e33-9a47-1c2d3e4f5a6b"
ASCEND_CONTROL = [
    {"path": "/dev/davinci_manager"},
    {"path": "/dev/devmm_svm"},
    {"path": "/dev/hisi_hdc"},
]
NVIDIA_CONTROL = [
    {"path": "/dev/nvidiactl"},
    {"path": "/dev/nvidia-uvm"},
    {"path": "/dev/nvidia-uvm-tools"},
]


def _npu(index: int, *, chip: str = "910B4", nodes: bool = True) -> inventory_pb2.Device:
    """An npu as the ascend discovery backend publishes it."""
    device = inventory_pb2.Device(name=f"npu-{index}", kind="npu")
    device.attributes["index"].int = index
    device.attributes["chipName"].string = chip
    if nodes:
        for path in (
            f"/dev/davinci{index}",
            "/dev/davinci_manager",
            "/dev/devmm_svm",
            "/dev/hisi_hdc",
        ):
            device.device_nodes.add(path=path)
    device.env["ASCEND_VISIBLE_DEVICES"] = str(index)
    return device


def _gpu(minor: int, uuid: str = GPU_UUID) -> inventory_pb2.Device:
    """A whole GPU as the nvml discovery backend publishes it."""
    device = inventory_pb2.Device(name=f"gpu-{minor}", kind="gpu", uuid=uuid)
    for path in (
        f"/dev/nvidia{minor}",
        "/dev/nvidiactl",
        "/dev/nvidia-uvm",
        "/dev/nvidia-uvm-tools",
    ):
        device.device_nodes.add(path=path)
    device.capacity["memory"] = "80Gi"
    device.attributes["uuid"].string = uuid
    return device


def _existing_mig(gpu_minor: int, gpu_instance: int, uuid: str) -> inventory_pb2.Device:
    """A MIG device that exists (a 1g.10gb GI at slice 0 with one CI), exactly as the nvml
    discovery backend publishes it: built by the backend's own `to_scan`."""
    gpu = nvml.GpuReading(
        index=gpu_minor,
        minor=gpu_minor,
        uuid=GPU_UUID,
        name="NVIDIA H100 80GB HBM3",
        architecture=9,
        compute_capability=(9, 0),
        memory_bytes=80 << 30,
        bus_id="0000:18:00.0",
        mig_mode=(1, 1),
        profiles=H100_80GB,
        gpu_instances=(GpuInstance(id=gpu_instance, profile_id=19, placement=Placement(0, 1)),),
        mig_devices=(MigDevice(uuid=uuid, gpu_instance=gpu_instance, compute_instance=0),),
    )
    reading = nvml.Reading(driver_version="550.54.15", cuda_driver_version=12040, gpus=(gpu,))
    scan = nvml.to_scan(reading, options=nvml.NvmlOptions())
    [device] = [d for d in scan.devices if d.kind == "mig"]
    return device


def _mig(parent: int) -> inventory_pb2.Device:
    """A MIG slot with the parent's nodes and no UUID: an option the nvml backend publishes
    (here without its `createdOnDemand` flag, which the preparer reads, not the edits)."""
    device = inventory_pb2.Device(
        name=f"gpu-{parent}-mig-1g10gb-19-0", kind="mig", parent=f"gpu-{parent}"
    )
    for path in (
        f"/dev/nvidia{parent}",
        "/dev/nvidiactl",
        "/dev/nvidia-uvm",
        "/dev/nvidia-uvm-tools",
    ):
        device.device_nodes.add(path=path)
    device.attributes["profile"].string = "1g.10gb"
    device.attributes["parentUUID"].string = GPU_UUID
    device.attributes["placementStart"].int = 0
    return device


def _sim_gpu() -> inventory_pb2.Device:
    """A gpu of the shipped sim profiles: its node maps to /dev/null."""
    device = inventory_pb2.Device(name="gpu-0", kind="gpu", uuid=GPU_UUID)
    device.device_nodes.add(path="/dev/nvidia0", host_path="/dev/null")
    device.env["NVIDIA_VISIBLE_DEVICES"] = "0"
    return device


def _spec(
    backend: str, *uses: DeviceUse, configs: dict[str, DeviceConfig] | None = None
) -> dict[str, Any]:
    edits = claim_edits(backend=backend, claim_uid=UID, uses=uses, configs=configs or {})
    spec = spec_files.build_spec(
        driver=DRIVER, devices=edits.devices, common_nodes=edits.common_nodes
    )
    assert schema_problems(spec) == []
    assert spec_files.validate(spec) == []
    return spec


def _env(spec: dict[str, Any], index: int = 0) -> dict[str, str]:
    pairs = (item.split("=", 1) for item in spec["devices"][index]["containerEdits"]["env"])
    return {key: value for key, value in pairs}


def _nodes(spec: dict[str, Any], index: int = 0) -> list[dict[str, str]]:
    nodes: list[dict[str, str]] = spec["devices"][index]["containerEdits"].get("deviceNodes", [])
    return nodes


def _use(device: inventory_pb2.Device, request: str = "req", **kw: Any) -> DeviceUse:
    return DeviceUse(request=request, device=device, **kw)


VNPU = Partition(
    claim_uid=UID,
    device="npu-1",
    profile="vir05_1c_8g",
    id="116",
    env={"ASCEND_VISIBLE_DEVICES": "116", "ASCEND_RUNTIME_OPTIONS": "VIRTUAL"},
    device_nodes=(("/dev/davinci116", "/dev/vdavinci116"),),
)
MIG = Partition(
    claim_uid=UID,
    device="gpu-0-mig-1g10gb-19-0",
    profile="1g.10gb",
    id="MIG-5c1a2b3c-0000-4000-8000-000000000001",
    env={"NVIDIA_VISIBLE_DEVICES": "MIG-5c1a2b3c-0000-4000-8000-000000000001"},
    device_nodes=(
        ("/dev/nvidia0", ""),
        ("/dev/nvidia-caps/nvidia-cap12", ""),
        ("/dev/nvidia-caps/nvidia-cap13", ""),
    ),
)


@pytest.mark.parametrize(
    ("backend", "uses", "env", "nodes", "common"),
    [
        (
            "ascend",
            [_use(_npu(0)), _use(_npu(3))],
            {"ASCEND_VISIBLE_DEVICES": "0,3"},
            [[{"path": "/dev/davinci0"}], [{"path": "/dev/davinci3"}]],
            ASCEND_CONTROL,
        ),
        (
            "ascend",
            [_use(_npu(5, nodes=False))],
            {"ASCEND_VISIBLE_DEVICES": "5"},
            [[{"path": "/dev/davinci5"}]],
            ASCEND_CONTROL,
        ),
        (
            "ascend",
            [_use(_npu(100, chip="910B4vir05_1c_8g"))],
            {"ASCEND_VISIBLE_DEVICES": "100", "ASCEND_RUNTIME_OPTIONS": "VIRTUAL"},
            [[{"path": "/dev/davinci100", "hostPath": "/dev/vdavinci100"}]],
            ASCEND_CONTROL,
        ),
        (
            "ascend",
            [_use(_npu(1), partition=VNPU)],
            {
                "ASCEND_VISIBLE_DEVICES": "116",
                "ASCEND_RUNTIME_OPTIONS": "VIRTUAL",
                "DRA_SUITE_PARTITION_ID": "116",
                "DRA_SUITE_PARTITION_PROFILE": "vir05_1c_8g",
            },
            [[{"path": "/dev/davinci116", "hostPath": "/dev/vdavinci116"}]],
            ASCEND_CONTROL,
        ),
        (
            "nvml",
            [_use(_gpu(0)), _use(_gpu(2, uuid="GPU-2222"))],
            {"NVIDIA_VISIBLE_DEVICES": f"{GPU_UUID},GPU-2222"},
            [[{"path": "/dev/nvidia0"}], [{"path": "/dev/nvidia2"}]],
            NVIDIA_CONTROL,
        ),
        (
            "nvml",
            # GPU minor 1's GI 1 (access 147) and its CI 0 (148), as mig-minors numbers them.
            [_use(_existing_mig(1, 1, uuid=MIG_UUID))],
            {"NVIDIA_VISIBLE_DEVICES": MIG_UUID},
            [
                [
                    {"path": "/dev/nvidia1"},
                    {"path": "/dev/nvidia-caps/nvidia-cap147"},
                    {"path": "/dev/nvidia-caps/nvidia-cap148"},
                ]
            ],
            NVIDIA_CONTROL,
        ),
        (
            "nvml",
            [_use(_mig(0), partition=MIG)],
            {
                "NVIDIA_VISIBLE_DEVICES": MIG.id,
                "DRA_SUITE_PARTITION_ID": MIG.id,
                "DRA_SUITE_PARTITION_PROFILE": "1g.10gb",
            },
            [
                [
                    {"path": "/dev/nvidia0"},
                    {"path": "/dev/nvidia-caps/nvidia-cap12"},
                    {"path": "/dev/nvidia-caps/nvidia-cap13"},
                ]
            ],
            NVIDIA_CONTROL,
        ),
        (
            "sim",
            [_use(_sim_gpu())],
            {"NVIDIA_VISIBLE_DEVICES": "0"},
            [[{"path": "/dev/nvidia0", "hostPath": "/dev/null"}]],
            [],
        ),
        (
            "sim",
            [_use(_npu(2, nodes=False))],
            {"ASCEND_VISIBLE_DEVICES": "2"},
            [[]],
            [],
        ),
    ],
    ids=[
        "ascend-two-npus-control-nodes-once",
        "ascend-npu-without-published-nodes",
        "ascend-static-vnpu",
        "ascend-vnpu-partition",
        "nvml-two-gpus-by-uuid",
        "nvml-static-mig",
        "nvml-mig-partition",
        "sim-gpu-as-published",
        "sim-npu-as-published",
    ],
)
def test_each_backend_gets_its_own_device_nodes_and_env(backend, uses, env, nodes, common):
    spec = _spec(backend, *uses)
    for index in range(len(uses)):
        assert _nodes(spec, index) == nodes[index]
        got = _env(spec, index)
        assert {key: got.get(key) for key in env} == env
        assert got["DRA_SUITE_CLAIM_UID"] == UID
    assert spec.get("containerEdits", {}).get("deviceNodes", []) == common


def test_a_mig_placement_that_does_not_exist_fails_the_claim():
    with pytest.raises(ClaimError, match="does not exist yet") as caught:
        claim_edits(backend="nvml", claim_uid=UID, uses=[_use(_mig(0))], configs={})
    assert caught.value.claim_uid == UID


def test_an_npu_without_an_id_fails_the_claim():
    device = inventory_pb2.Device(name="accelerator", kind="npu")
    with pytest.raises(ClaimError, match="no device id"):
        claim_edits(backend="ascend", claim_uid=UID, uses=[_use(device)], configs={})


def test_requests_keep_their_own_visible_devices():
    spec = _spec("ascend", _use(_npu(0), "a"), _use(_npu(1), "b"))
    assert _env(spec, 0)["ASCEND_VISIBLE_DEVICES"] == "0"
    assert _env(spec, 1)["ASCEND_VISIBLE_DEVICES"] == "1"
    assert spec["containerEdits"]["deviceNodes"] == ASCEND_CONTROL


# Consumable capacity


def _names(spec: dict[str, Any]) -> list[str]:
    return [device["name"] for device in spec["devices"]]


def test_a_whole_device_carries_no_share():
    spec = _spec("nvml", _use(_gpu(0)))
    assert _names(spec) == [f"{UID}-gpu-0"]
    assert not [key for key in _env(spec) if key.startswith("DRA_SUITE_CONSUMED_")]
    assert "CUDA_MPS_PINNED_DEVICE_MEM_LIMIT" not in _env(spec)


def test_one_share_puts_its_consumed_capacity_into_the_container():
    spec = _spec(
        "nvml",
        _use(_gpu(0), share_id=SHARE_A, consumed={"memory": "10Gi", "example.com/slots": "2"}),
    )
    [name] = _names(spec)
    assert name.startswith(f"{UID}-gpu-0-0f5a9d1e")
    assert len(name) <= spec_files.MAX_NAME
    env = _env(spec)
    assert env["DRA_SUITE_CONSUMED_MEMORY"] == str(10 * 2**30)
    assert env["DRA_SUITE_CONSUMED_EXAMPLE_COM_SLOTS"] == "2"
    assert env["CUDA_MPS_PINNED_DEVICE_MEM_LIMIT"] == "0=10240M"


def test_two_shares_of_one_device_in_one_claim_get_distinct_names_and_add_up():
    spec = _spec(
        "nvml",
        _use(_gpu(0), share_id=SHARE_A, consumed={"memory": "10Gi"}),
        _use(_gpu(0), share_id=SHARE_B, consumed={"memory": "6Gi"}),
    )
    first, second = _names(spec)
    assert first != second
    assert all(len(name) <= spec_files.MAX_NAME for name in (first, second))
    for index in (0, 1):
        env = _env(spec, index)
        assert env["NVIDIA_VISIBLE_DEVICES"] == GPU_UUID
        assert env["DRA_SUITE_CONSUMED_MEMORY"] == str(16 * 2**30)
        assert env["CUDA_MPS_PINNED_DEVICE_MEM_LIMIT"] == "0=16384M"


def test_shares_in_separate_requests_keep_their_own_limits():
    spec = _spec(
        "nvml",
        _use(_gpu(0), "a", share_id=SHARE_A, consumed={"memory": "10Gi"}),
        _use(_gpu(0), "b", share_id=SHARE_B, consumed={"memory": "6Gi"}),
    )
    assert _env(spec, 0)["CUDA_MPS_PINNED_DEVICE_MEM_LIMIT"] == "0=10240M"
    assert _env(spec, 1)["CUDA_MPS_PINNED_DEVICE_MEM_LIMIT"] == "0=6144M"


def test_the_lower_of_share_and_configured_memory_limit_wins():
    config = DeviceConfig(strategy=Strategy.SPACE_PARTITIONING, memory_limit="4Gi")
    spec = _spec(
        "nvml",
        _use(_gpu(0), share_id=SHARE_A, consumed={"memory": "10Gi"}),
        configs={"req": config},
    )
    assert _env(spec)["CUDA_MPS_PINNED_DEVICE_MEM_LIMIT"] == "0=4096M"
    assert _env(spec)["DRA_SUITE_CONSUMED_MEMORY"] == str(10 * 2**30)


def test_an_ascend_share_is_carried_by_our_variable_only():
    spec = _spec("ascend", _use(_npu(0), share_id=SHARE_A, consumed={"memCapacity": "8Gi"}))
    env = _env(spec)
    assert env["DRA_SUITE_CONSUMED_MEMCAPACITY"] == str(8 * 2**30)
    assert "CUDA_MPS_PINNED_DEVICE_MEM_LIMIT" not in env


@pytest.mark.parametrize(
    ("device", "share"),
    [
        ("gpu-0", None),
        ("gpu-0", SHARE_A),
        ("gpu-0-mig-1g10gb-me-20-3", SHARE_A),
        ("x" * 63, None),
        ("x" * 63, SHARE_A),
        ("gpu-1", "s1"),
    ],
    ids=[
        "whole",
        "share",
        "long-device-share",
        "longest-device",
        "longest-device-share",
        "short-share",
    ],
)
def test_device_names_stay_within_63_characters_and_apart(device, share):
    name = spec_files.device_name(UID, device, share)
    assert len(name) <= spec_files.MAX_NAME
    assert name.startswith(UID)
    assert name == spec_files.device_name(UID, device, share)
    assert name != spec_files.device_name(UID, device, SHARE_B)
