"""The per-backend allowlist of CDI container edits: the forged-inventory attack of issue 11
(host /dev/sda as /dev/davinci0, /dev/mem, LD_PRELOAD) and its variants are refused with an
error naming the device and the edit, whatever path (device, control node, partition) they take;
what each backend really produces passes."""

from __future__ import annotations

from typing import Any

import pytest

from services.allocation.cdi import allowlist, edits, spec_files
from services.allocation.cdi.allowlist import DeviceEdits, ForbiddenEditError
from services.allocation.cdi.edits import DeviceUse, claim_edits
from services.allocation.claim import opaque
from services.allocation.claim.opaque import DeviceConfig, Strategy
from shared.errors import ClaimError
from shared.pb.drasuite.v1 import inventory_pb2
from shared.vendors.parts.partitions import Partition

UID = "3f1b2c4d-0000-4000-8000-00000000abcd"


def _device(
    name: str,
    *,
    kind: str,
    nodes: tuple[tuple[str, str], ...],
    env: dict[str, str] | None = None,
    index: int | None = None,
    uuid: str = "",
) -> inventory_pb2.Device:
    device = inventory_pb2.Device(name=name, kind=kind, env=env or {}, uuid=uuid)
    if index is not None:
        device.attributes["index"].int = index
    for path, host in nodes:
        device.device_nodes.add(path=path, host_path=host)
    return device


def _sim_npu(index: int, **changes: Any) -> inventory_pb2.Device:
    """As the sim backend publishes an npu of the shipped ascend-910b profile."""
    fields: dict[str, Any] = {
        "kind": "npu",
        "nodes": ((f"/dev/davinci{index}", "/dev/null"),),
        "env": {"ASCEND_VISIBLE_DEVICES": str(index)},
        "index": index,
    }
    return _device(f"npu-{index}", **{**fields, **changes})


def _edits(backend: str, *devices: inventory_pb2.Device, **use: Any) -> None:
    uses = [DeviceUse(request="req", device=d, **use) for d in devices]
    claim_edits(backend=backend, claim_uid=UID, uses=uses, configs={})


def _refused(backend: str, *devices: inventory_pb2.Device, **use: Any) -> ForbiddenEditError:
    with pytest.raises(ForbiddenEditError) as caught:
        _edits(backend, *devices, **use)
    return caught.value


def test_the_forged_ascend_inventory_of_the_issue_is_refused():
    # The ascend backend builds its nodes and env itself (/dev/mem and LD_PRELOAD never reach
    # the edits); the host path it takes from the inventory is what the allowlist refuses.
    forged = _device(
        "npu-0",
        kind="npu",
        index=0,
        nodes=(("/dev/davinci0", "/dev/sda"), ("/dev/mem", "/dev/mem")),
        env={"ASCEND_VISIBLE_DEVICES": "0", "LD_PRELOAD": "/host/evil.so"},
    )
    error = _refused("ascend", forged)
    assert [(r.kind, r.edit) for r in error.rejected] == [
        ("host_path", "'/dev/sda' as '/dev/davinci0'")
    ]
    assert error.backend == "ascend"
    assert "device npu-0: host path '/dev/sda' as '/dev/davinci0'" in str(error)
    assert error.claim_uid == UID


def test_the_same_attack_on_a_sim_node_is_refused_env_included():
    forged = _sim_npu(
        0,
        nodes=(("/dev/davinci0", "/dev/sda"), ("/dev/mem", "/dev/null")),
        env={"ASCEND_VISIBLE_DEVICES": "0", "LD_PRELOAD": "/host/evil.so"},
    )
    error = _refused("sim", forged)
    assert sorted(r.kind for r in error.rejected) == ["device_node", "env_name", "host_path"]
    assert "env name 'LD_PRELOAD'" in str(error)


@pytest.mark.parametrize(
    ("backend", "device", "kind"),
    [
        ("sim", _sim_npu(0, nodes=(("/dev/davinci0", "/dev/davinci0"),)), "host_path"),
        ("sim", _sim_npu(0, nodes=(("/dev/davinci0", ""),)), "host_path"),
        ("sim", _sim_npu(0, nodes=(("/host", "/"),)), "device_node"),
        ("sim", _sim_npu(0, nodes=(("/dev/davinci0/../sda", "/dev/null"),)), "device_node"),
        ("sim", _sim_npu(0, env={"LD_LIBRARY_PATH": "/x"}), "env_name"),
        ("sim", _sim_npu(0, env={"PATH": "/evil:/bin"}), "env_name"),
        ("sim", _sim_npu(0, env={"HOME": "/root"}), "env_name"),
        ("sim", _sim_npu(0, env={"NVIDIA_VISIBLE_DEVICES": "all"}), "env_value"),
        ("sim", _sim_npu(0, env={"ASCEND_VISIBLE_DEVICES": "0-7"}), "env_value"),
        ("sim", _sim_npu(0, env={"ASCEND_RUNTIME_OPTIONS": "NODRV"}), "env_value"),
        (
            "ascend",
            _device("npu-0", kind="npu", index=0, nodes=(("/dev/davinci0", "/dev/vdavinci1"),)),
            "host_path",
        ),
        (
            "ascend",
            _device("npu-0", kind="npu", index=0, nodes=(("/dev/hisi_hdc", "/dev/sda"),)),
            "host_path",
        ),
        ("ascend", _device("x-0", kind="disk", nodes=(("/dev/sda", ""),)), "device_node"),
        ("ascend", _device("x-0", kind="disk", nodes=(), env={"LD_PRELOAD": "/e.so"}), "env_name"),
        ("nvml", _device("gpu-0", kind="gpu", nodes=(("/dev/nvidia0", "/dev/sda"),)), "host_path"),
        (
            "nvml",
            _device(
                "gpu-0", kind="gpu", nodes=(("/dev/nvidia0", ""), ("/dev/nvidiactl", "/dev/mem"))
            ),
            "host_path",
        ),
        ("nvml", _device("gpu-0", kind="other", nodes=(("/dev/kmsg", ""),)), "device_node"),
        (
            "nvml",
            _device("gpu-0", kind="gpu", uuid="all", nodes=(("/dev/nvidia0", ""),)),
            "env_value",
        ),
    ],
    ids=[
        "sim-host-not-dev-null",
        "sim-empty-host",
        "mount-of-host-root",
        "path-traversal",
        "ld-library-path",
        "path",
        "unlisted-env",
        "all-gpus",
        "ascend-range",
        "ascend-nodrv",
        "ascend-vnpu-of-another-number",
        "ascend-control-node-from-sda",
        "ascend-unknown-kind",
        "ascend-unknown-kind-env",
        "nvml-host-path",
        "nvml-control-node-from-mem",
        "nvml-unknown-kind",
        "nvml-uuid-all",
    ],
)
def test_variants_of_the_attack_are_refused(backend, device, kind):
    error = _refused(backend, device)
    assert kind in {r.kind for r in error.rejected}
    assert all(r.device == device.name for r in error.rejected)


def test_a_forged_partition_edit_is_refused_like_an_inventory_edit():
    partition = Partition(
        claim_uid=UID,
        device="npu-0",
        profile="vir05_1c_8g",
        id="116",
        env={"ASCEND_VISIBLE_DEVICES": "116", "LD_PRELOAD": "/e.so"},
        device_nodes=(("/dev/davinci116", "/dev/sda"),),
    )
    error = _refused("sim", _sim_npu(0), partition=partition)
    assert sorted(r.kind for r in error.rejected) == ["env_name", "host_path"]


@pytest.mark.parametrize(
    ("backend", "device", "partition"),
    [
        ("sim", _sim_npu(3), None),
        (
            "sim",
            _device(
                "gpu-0",
                kind="gpu",
                nodes=(("/dev/nvidia0", "/dev/null"),),
                env={"NVIDIA_VISIBLE_DEVICES": "0"},
            ),
            Partition(
                claim_uid=UID,
                device="gpu-0",
                profile="1g.10gb",
                id="MIG-1",
                env={"NVIDIA_VISIBLE_DEVICES": "MIG-1"},
                device_nodes=(
                    ("/dev/nvidia0", "/dev/null"),
                    ("/dev/nvidia-caps/nvidia-cap30", "/dev/null"),
                ),
            ),
        ),
        (
            "ascend",
            _device("npu-1", kind="npu", index=1, nodes=(("/dev/davinci1", ""),)),
            Partition(
                claim_uid=UID,
                device="npu-1",
                profile="vir05_1c_8g",
                id="116",
                env={"ASCEND_VISIBLE_DEVICES": "116", "ASCEND_RUNTIME_OPTIONS": "VIRTUAL"},
                device_nodes=(("/dev/davinci116", "/dev/vdavinci116"),),
            ),
        ),
        (
            "ascend",
            _device(
                "npu-2",
                kind="npu",
                index=2,
                nodes=(("/dev/davinci2", "/dev/davinci2"), ("/dev/davinci_manager", "")),
            ),
            None,
        ),
        (
            "nvml",
            _device(
                "gpu-1",
                kind="gpu",
                uuid="GPU-9d11c4e2-e840-51ed-b15f-0be7ae073686",
                nodes=(("/dev/nvidia1", ""), ("/dev/nvidiactl", ""), ("/dev/nvidia-uvm", "")),
            ),
            None,
        ),
    ],
    ids=["sim-npu", "sim-mig-partition", "ascend-vnpu", "ascend-same-host-path", "nvml-gpu"],
)
def test_what_each_backend_really_produces_passes(backend, device, partition):
    _edits(backend, device, partition=partition)


def test_the_drivers_own_variables_pass_on_every_backend():
    config = DeviceConfig(strategy=Strategy.TIME_SLICING)
    device = _sim_npu(0)
    uses = [DeviceUse(request="req", device=device, consumed={"example.com/slots": "2"})]
    edits = claim_edits(backend="sim", claim_uid=UID, uses=uses, configs={"req": config})
    env = dict(edits.devices[0].env)
    assert "DRA_SUITE_CONSUMED_EXAMPLE_COM_SLOTS" in env
    assert env["DRA_SUITE_SHARING_STRATEGY"] == str(Strategy.TIME_SLICING)


def test_an_unknown_backend_gets_no_edits_at_all():
    with pytest.raises(ClaimError, match="no container edits for backend 'forged'"):
        _edits("forged", _sim_npu(0))


@pytest.mark.parametrize("key", ["hooks", "netDevices"])
def test_a_spec_with_hooks_or_other_edits_is_refused(key):
    spec = spec_files.build_spec(
        driver="sim.dra-suite.io",
        devices=[spec_files.CDIDevice(name=f"{UID}-npu-0", env={"A": "1"})],
    )
    spec["devices"][0]["containerEdits"][key] = [{"hostPath": "/", "containerPath": "/host"}]
    with pytest.raises(ForbiddenEditError, match=repr(key)):
        allowlist.check_spec(spec, claim_uid=UID, backend="sim")


def test_an_error_with_many_rejections_stays_short():
    nodes = tuple((f"/dev/sd{chr(97 + i)}", "/dev/null") for i in range(20))
    long_env = {f"EVIL_{i}": "x" * 10_000 for i in range(20)}
    error = _refused("sim", _sim_npu(0, nodes=nodes, env=long_env))
    assert len(error.rejected) == 40
    assert "and 32 more" in str(error)
    assert len(str(error)) < 2_000


def test_the_pure_check_names_each_device_it_refuses():
    devices = [
        DeviceEdits(device="npu-0", nodes=[("/dev/davinci0", "/dev/null")], env={}),
        DeviceEdits(device="npu-1", nodes=[("/dev/mem", "/dev/null")], env={"PATH": "/x"}),
    ]
    with pytest.raises(ForbiddenEditError) as caught:
        allowlist.check(backend="sim", claim_uid=UID, devices=devices)
    assert {r.device for r in caught.value.rejected} == {"npu-1"}


@pytest.mark.parametrize("backend", ["sim", "ascend", "nvml"])
def test_every_variable_the_driver_itself_sets_is_allowed(backend):
    rules = allowlist.rules_for(backend)
    own = [
        edits.CLAIM_UID_ENV,
        edits.DEVICES_ENV,
        edits.PARTITION_ID_ENV,
        edits.PARTITION_PROFILE_ENV,
        edits.consumed_env_name("example.com/slots"),
        opaque.STRATEGY_ENV,
        opaque.TIMESLICE_INTERVAL_ENV,
        opaque.COMPUTE_PERCENT_ENV,
        opaque.MEMORY_LIMIT_ENV,
    ]
    assert [name for name in own if not rules.env_allowed(name)] == []
    if backend != "ascend":
        assert rules.env_allowed(opaque.MPS_MEMORY_LIMIT_ENV)
        assert rules.env_allowed(opaque.MPS_THREAD_PERCENTAGE_ENV)
