"""Issue 22 item 5: container edits are bound to the claim's devices.

A device's nodes and visible-devices variables name that device alone (from its name, the
partition made for it, the backend's view of it), never other devices an inventory lists; a
kind the backend never makes gets no vendor edit; the MIG capabilities are the claim's own
instance's, never `nvidia-cap1`/`nvidia-cap2`; every variable's value is checked; digits are
ASCII; a mount comes only from under the driver's own directories.
"""

from __future__ import annotations

import dataclasses
from pathlib import PurePosixPath
from typing import Any

import pytest

from services.allocation.cdi import allowlist, edits, spec_files
from services.allocation.cdi.allowlist import DeviceEdits, ForbiddenEditError
from services.allocation.cdi.edits import DeviceUse, claim_edits
from services.allocation.config import BACKENDS
from shared.errors import ClaimError
from shared.pb.drasuite.v1 import inventory_pb2
from shared.vendors.parts.partitions import Partition

UID = "3f1b2c4d-0000-4000-8000-00000000abcd"
GPU_UUID = "GPU-9d11c4e2-e840-51ed-b15f-0be7ae073686"
ARABIC_THREE = "\u0663"  # a Unicode digit that `\d` matches and no device path has


def _device(
    name: str,
    *,
    kind: str,
    nodes: tuple[tuple[str, str], ...] = (),
    env: dict[str, str] | None = None,
    uuid: str = "",
    parent: str = "",
    **attributes: int,
) -> inventory_pb2.Device:
    device = inventory_pb2.Device(name=name, kind=kind, env=env or {}, uuid=uuid, parent=parent)
    for key, value in attributes.items():
        device.attributes[key].int = value
    for path, host in nodes:
        device.device_nodes.add(path=path, host_path=host)
    return device


def _claim(backend: str, *devices: inventory_pb2.Device, **use: Any) -> edits.ClaimEdits:
    uses = [DeviceUse(request="req", device=d, **use) for d in devices]
    return claim_edits(backend=backend, claim_uid=UID, uses=uses, configs={})


def _refused(backend: str, *devices: inventory_pb2.Device, **use: Any) -> list[tuple[str, str]]:
    with pytest.raises(ForbiddenEditError) as caught:
        _claim(backend, *devices, **use)
    assert all(r.device == devices[0].name for r in caught.value.rejected)
    return [(r.kind, r.edit) for r in caught.value.rejected]


def _env(built: edits.ClaimEdits) -> dict[str, str]:
    return dict(built.devices[0].env)


def _sim_npu(index: int, **changes: Any) -> inventory_pb2.Device:
    fields: dict[str, Any] = {
        "kind": "npu",
        "nodes": ((f"/dev/davinci{index}", "/dev/null"),),
        "env": {"ASCEND_VISIBLE_DEVICES": str(index)},
        "index": index,
    }
    return _device(f"npu-{index}", **{**fields, **changes})


def _sim_gpu(index: int, **changes: Any) -> inventory_pb2.Device:
    fields: dict[str, Any] = {
        "kind": "gpu",
        "nodes": ((f"/dev/nvidia{index}", "/dev/null"),),
        "env": {"NVIDIA_VISIBLE_DEVICES": str(index)},
        "uuid": GPU_UUID,
    }
    return _device(f"gpu-{index}", **{**fields, **changes})


EVERY_NPU = ",".join(str(i) for i in range(8))


# --- visible-devices variables name the claim's device only ---------------------------------


@pytest.mark.parametrize(
    ("backend", "device", "edit"),
    [
        (
            "sim",
            _sim_npu(0, env={"ASCEND_VISIBLE_DEVICES": EVERY_NPU}),
            f"'ASCEND_VISIBLE_DEVICES={EVERY_NPU}' (not this device's)",
        ),
        (
            "sim",
            _sim_npu(0, env={"ASCEND_VISIBLE_DEVICES": "5"}),
            "'ASCEND_VISIBLE_DEVICES=5' (not this device's)",
        ),
        (
            "sim",
            _sim_gpu(0, env={"NVIDIA_VISIBLE_DEVICES": EVERY_NPU}),
            f"'NVIDIA_VISIBLE_DEVICES={EVERY_NPU}' (not this device's)",
        ),
        (
            "sim",
            _sim_npu(0, env={"ASCEND_VISIBLE_DEVICES": "0", "NVIDIA_VISIBLE_DEVICES": "0"}),
            "'NVIDIA_VISIBLE_DEVICES=0' (not this device's)",
        ),
        (
            "nvml",
            _device(
                "gpu-0",
                kind="gpu",
                uuid=",".join(f"GPU-{i}" for i in range(8)),
                nodes=(("/dev/nvidia0", ""),),
            ),
            "'NVIDIA_VISIBLE_DEVICES=GPU-0,GPU-1,GPU-2,GPU-3,GPU-4,GPU-5,GPU-6,GPU-7' "
            "(not this device's)",
        ),
    ],
    ids=[
        "sim-npu-every-npu",
        "sim-npu-another-npu",
        "sim-gpu-every-gpu",
        "sim-npu-nvidia-variable",
        "nvml-uuid-list",
    ],
)
def test_a_visible_devices_value_naming_other_devices_is_refused(backend, device, edit):
    assert ("env_value", edit) in _refused(backend, device)


def test_an_ascend_npu_gets_the_node_and_id_of_its_name_not_of_its_index_attribute():
    forged = _device(
        "npu-0",
        kind="npu",
        index=7,
        nodes=tuple((f"/dev/davinci{i}", "") for i in range(8)),
        env={"ASCEND_VISIBLE_DEVICES": EVERY_NPU},
    )
    built = _claim("ascend", forged)
    assert built.devices[0].device_nodes == (("/dev/davinci0", ""),)
    assert _env(built)["ASCEND_VISIBLE_DEVICES"] == "0"


def test_a_request_of_two_devices_still_sees_both():
    built = _claim("sim", _sim_npu(0), _sim_npu(3))
    assert _env(built)["ASCEND_VISIBLE_DEVICES"] == "0,3"


# --- numbered device nodes are the device's own ---------------------------------------------


@pytest.mark.parametrize(
    ("backend", "device", "edit"),
    [
        (
            "sim",
            _sim_npu(0, nodes=tuple((f"/dev/davinci{i}", "/dev/null") for i in range(2))),
            "'/dev/davinci1' (not this device's)",
        ),
        (
            "sim",
            _sim_npu(0, nodes=(("/dev/nvidia0", "/dev/null"),)),
            "'/dev/nvidia0' (not this device's)",
        ),
        (
            "nvml",
            _device(
                "gpu-0",
                kind="gpu",
                uuid=GPU_UUID,
                nodes=(("/dev/nvidia0", ""), ("/dev/nvidia7", "")),
            ),
            "'/dev/nvidia7' (not this device's)",
        ),
    ],
    ids=["sim-npu-second-npu", "sim-npu-a-gpu", "nvml-gpu-second-gpu"],
)
def test_a_node_of_another_device_is_refused(backend, device, edit):
    assert ("device_node", edit) in _refused(backend, device)


@pytest.mark.parametrize(
    ("backend", "path"),
    [("nvml", "/dev/nvidia3"), ("nvml", "/dev/nvidiactl"), ("ascend", "/dev/davinci3"),
     ("sim", "/dev/davinci3"), ("sim", "/dev/nvidia3")],
)  # fmt: skip
def test_a_kind_the_backend_never_makes_gets_no_vendor_node(backend, path):
    host = "/dev/null" if backend == "sim" else ""
    device = _device("nic-3", kind="nic", nodes=((path, host),))
    assert ("device_node", repr(path)) in _refused(backend, device)


@pytest.mark.parametrize("backend", ["nvml", "ascend", "sim"])
def test_a_kind_the_backend_never_makes_gets_no_vendor_variable(backend):
    device = _device("nic-3", kind="nic", env={"NVIDIA_VISIBLE_DEVICES": "3"})
    assert ("env_name", "'NVIDIA_VISIBLE_DEVICES'") in _refused(backend, device)


# --- MIG capabilities: the claim's own instance only ----------------------------------------


def _static_mig(caps: tuple[int, ...], *, parent_minor: int = 1) -> inventory_pb2.Device:
    caps_nodes = [(f"/dev/nvidia-caps/nvidia-cap{minor}", "") for minor in caps]
    nodes = ((f"/dev/nvidia{parent_minor}", ""), *caps_nodes)
    return _device(
        f"gpu-{parent_minor}-mig-1g10gb-19-0",
        kind="mig",
        uuid="MIG-0e7a",
        parent=f"gpu-{parent_minor}",
        nodes=nodes,
    )


@pytest.mark.parametrize(
    ("caps", "refused"),
    [
        ((138, 139, 1), ["/dev/nvidia-caps/nvidia-cap1", "/dev/nvidia-caps/nvidia-cap138"]),
        ((138, 2), ["/dev/nvidia-caps/nvidia-cap2", "/dev/nvidia-caps/nvidia-cap138"]),
        ((21, 22), ["/dev/nvidia-caps/nvidia-cap21", "/dev/nvidia-caps/nvidia-cap22"]),
        ((139, 140), ["/dev/nvidia-caps/nvidia-cap139", "/dev/nvidia-caps/nvidia-cap140"]),
        ((138, 147), ["/dev/nvidia-caps/nvidia-cap138", "/dev/nvidia-caps/nvidia-cap147"]),
    ],
    ids=["config-cap", "monitor-cap", "another-gpus-instance", "no-gi-access", "another-gi"],
)
def test_a_mig_device_gets_no_capability_but_its_own_instances(caps, refused):
    got = _refused("nvml", _static_mig(caps))
    named = {edit.split(" ")[0].strip("'") for kind, edit in got if kind == "device_node"}
    assert set(refused) <= named
    assert "/dev/nvidia1" not in named


def test_a_mig_device_gets_its_own_instances_capabilities():
    built = _claim("nvml", _static_mig((138, 139)))
    assert [p for p, _ in built.devices[0].device_nodes] == [
        "/dev/nvidia1",
        "/dev/nvidia-caps/nvidia-cap138",
        "/dev/nvidia-caps/nvidia-cap139",
    ]


def test_a_whole_gpu_gets_no_mig_capability():
    gpu = _sim_gpu(
        0, nodes=(("/dev/nvidia0", "/dev/null"), ("/dev/nvidia-caps/nvidia-cap3", "/dev/null"))
    )
    assert ("device_node", "'/dev/nvidia-caps/nvidia-cap3' (not this device's)") in _refused(
        "sim", gpu
    )  # fmt: skip


def test_a_partition_names_its_own_capabilities_but_not_other_gpus_of_the_inventory():
    mig = Partition(
        claim_uid=UID,
        device="gpu-0",
        profile="1g.10gb",
        id="MIG-1",
        env={"NVIDIA_VISIBLE_DEVICES": "MIG-1"},
        device_nodes=(
            ("/dev/nvidia0", "/dev/null"),
            ("/dev/nvidia-caps/nvidia-cap30", "/dev/null"),
        ),
    )
    built = _claim("sim", _sim_gpu(0), partition=mig)
    assert _env(built)["NVIDIA_VISIBLE_DEVICES"] == "MIG-1"
    # The sim's manager copies the device's published nodes into the partition.
    forged = dataclasses.replace(
        mig, device_nodes=(*mig.device_nodes, ("/dev/nvidia1", "/dev/null"))
    )
    assert ("device_node", "'/dev/nvidia1' (not this device's)") in _refused(
        "sim", _sim_gpu(0), partition=forged
    )


# --- every value is checked; digits are ASCII -----------------------------------------------


@pytest.mark.parametrize(
    ("name", "value"),
    [
        ("CUDA_MPS_ACTIVE_THREAD_PERCENTAGE", "1000"),
        ("CUDA_MPS_ACTIVE_THREAD_PERCENTAGE", "50 LD_PRELOAD=/e.so"),
        ("CUDA_MPS_PINNED_DEVICE_MEM_LIMIT", "0=1M\nLD_PRELOAD=/e.so"),
        ("DRA_SUITE_SHARING_STRATEGY", "Anything"),
        ("DRA_SUITE_MEMORY_LIMIT", "-1"),
        ("DRA_SUITE_CONSUMED_MEMORY", "$(reboot)"),
        ("DRA_SUITE_DEVICES", "npu-0,../../etc"),
        ("ASCEND_VISIBLE_DEVICES", ARABIC_THREE),
    ],
)
def test_every_variables_value_is_checked(name, value):
    device = _sim_gpu(0, env={"NVIDIA_VISIBLE_DEVICES": "0", name: value})
    assert ("env_value", repr(f"{name}={value}")) in _refused("sim", device)


def test_non_ascii_digits_match_no_node_and_no_id():
    devices = [
        DeviceEdits(
            device="npu-3",
            nodes=[(f"/dev/davinci{ARABIC_THREE}", "/dev/null")],
            env={"ASCEND_VISIBLE_DEVICES": ARABIC_THREE},
        )
    ]
    with pytest.raises(ForbiddenEditError) as caught:
        allowlist.check(backend="sim", claim_uid=UID, devices=devices)
    assert sorted(r.kind for r in caught.value.rejected) == ["device_node", "env_value"]
    with pytest.raises(ClaimError, match="has no device id"):
        _claim("ascend", _device(f"npu-{ARABIC_THREE}", kind="npu"))


# --- mounts only from the driver's own directories ------------------------------------------


ROOT = PurePosixPath("/var/lib/kubelet/plugins/sim.dra-suite.io")


@pytest.mark.parametrize(
    ("mount", "allowed"),
    [
        ({"hostPath": f"{ROOT}/mps/{UID}", "containerPath": "/tmp/nvidia-mps"}, True),
        ({"hostPath": f"{ROOT}/meta.json", "containerPath": "/etc/dra", "options": ["ro"]}, True),
        ({"hostPath": str(ROOT), "containerPath": "/x"}, False),
        ({"hostPath": f"{ROOT}/../../../../etc", "containerPath": "/x"}, False),
        ({"hostPath": f"{ROOT}/./mps", "containerPath": "/x"}, False),
        ({"hostPath": "/", "containerPath": "/host"}, False),
        ({"hostPath": f"{ROOT}/mps", "containerPath": "relative"}, False),
        ({"hostPath": f"{ROOT}/mps", "containerPath": "/x", "options": ["rshared"]}, False),
        ({"hostPath": f"{ROOT}/mps", "containerPath": "/x", "type": "proc"}, False),
    ],
    ids=["mps-dir", "metadata-ro", "the-root-itself", "traversal", "dot", "host-root",
         "relative-target", "shared-propagation", "not-a-bind"],
)  # fmt: skip
def test_a_mount_comes_only_from_under_the_drivers_own_directories(mount, allowed):
    spec = spec_files.build_spec(
        driver="sim.dra-suite.io", devices=[spec_files.CDIDevice(name=f"{UID}-npu-0", env={})]
    )
    spec["devices"][0]["containerEdits"]["mounts"] = [mount]
    if allowed:
        allowlist.check_spec(spec, claim_uid=UID, backend="sim", mount_roots=[ROOT])
    else:
        with pytest.raises(ForbiddenEditError) as caught:
            allowlist.check_spec(spec, claim_uid=UID, backend="sim", mount_roots=[ROOT])
        assert [r.kind for r in caught.value.rejected] == ["mount"]
    with pytest.raises(ForbiddenEditError):  # no directory of ours: no mount at all
        allowlist.check_spec(spec, claim_uid=UID, backend="sim")


def test_every_backend_setting_has_edits_and_an_allowlist():
    assert set(BACKENDS) == edits.BACKENDS == allowlist.BACKENDS
