"""The agent's composite partition manager: each backend's partitions made by its own manager,
through the real preparer into the CDI spec, removed at unprepare, orphans swept at start."""

from __future__ import annotations

import json
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from services.allocation.cdi import spec_files
from services.allocation.cdi.spec_files import CDIWriter
from services.allocation.claim.checkpoint import CheckpointStore
from services.allocation.claim.claims import ClaimReader, ClaimRef
from services.allocation.config import AllocationConfig
from services.allocation.dra.preparer import ClaimPreparer
from services.allocation.partitions import by_backend
from services.allocation.partitions.by_backend import CompositePartitionManager
from shared.errors import ClaimError, ConfigError
from shared.pb.drasuite.v1 import inventory_pb2
from shared.vendors.ascend.partitions import VnpuPartitionManager
from shared.vendors.nvidia.partitions import MigPartitionManager
from shared.vendors.sim.partitions import SimPartitionManager
from tests.fakes.allocation_sources import FakeInventory
from tests.fakes.npusmi_vnpu import FakeVnpuNpuSmi
from tests.fakes.nvml_mig import FakeMigNVML, cap_minor

DRIVER = "sim.dra-suite.io"
NODE = "node-a"
NVIDIA_CONTROL = ("/dev/nvidiactl", "/dev/nvidia-uvm", "/dev/nvidia-uvm-tools")
ASCEND_CONTROL = ("/dev/davinci_manager", "/dev/devmm_svm", "/dev/hisi_hdc")


def _nvml_inventory(nvml: FakeMigNVML) -> inventory_pb2.Inventory:
    devices = []
    for gpu in nvml.gpus:
        device = inventory_pb2.Device(name=f"gpu-{gpu.index}", kind="gpu", uuid=gpu.uuid)
        device.attributes["uuid"].string = gpu.uuid
        device.attributes["index"].int = gpu.index
        device.attributes["migCapable"].bool = True
        for path in (f"/dev/nvidia{gpu.index}", *NVIDIA_CONTROL):
            device.device_nodes.add(path=path)
        devices.append(device)
    return inventory_pb2.Inventory(
        driver=DRIVER, node=NODE, pool=NODE, backend="nvml", devices=devices
    )


def _ascend_inventory(count: int) -> inventory_pb2.Inventory:
    devices = []
    for i in range(count):
        device = inventory_pb2.Device(name=f"npu-{i}", kind="npu", capacity={"aiCore": "20"})
        device.attributes["chipName"].string = "910B3"
        device.attributes["index"].int = i
        device.attributes["physicalId"].int = i
        for path in (f"/dev/davinci{i}", *ASCEND_CONTROL):
            device.device_nodes.add(path=path)
        devices.append(device)
    return inventory_pb2.Inventory(
        driver=DRIVER, node=NODE, pool=NODE, backend="ascend", devices=devices
    )


@dataclass
class Rig:
    preparer: ClaimPreparer
    partitions: CompositePartitionManager
    inventory: FakeInventory
    nvml: FakeMigNVML
    npu_smi: FakeVnpuNpuSmi
    cdi_root: Path
    make_preparer: Callable[[str], ClaimPreparer]
    backend: str = "sim"
    """The node's own backend (`--backend`): the composite's and the preparer's."""

    def use(self, inventory: inventory_pb2.Inventory) -> None:
        """Run as a node of `inventory`'s backend, with `inventory` current."""
        self.inventory.current = inventory
        self.backend = inventory.backend
        self.preparer = self.make_preparer(inventory.backend)

    def spec(self, uid: str) -> dict[str, Any] | None:
        path = self.cdi_root / spec_files.spec_file_name(DRIVER, uid)
        return json.loads(path.read_text()) if path.exists() else None


@pytest.fixture
def rig(tmp_path: Path, kube_reader: Any) -> Rig:
    caps = tmp_path / "caps"
    nvml = FakeMigNVML(count=2, capabilities_root=caps)
    npu_smi = FakeVnpuNpuSmi.node(2)
    inventory = FakeInventory(None)
    partitions = CompositePartitionManager(
        [
            SimPartitionManager(tmp_path / "sim-partitions.json"),
            MigPartitionManager(
                tmp_path / "mig-partitions.json",
                open_library=lambda: nvml,
                capabilities_root=caps,
            ),
            VnpuPartitionManager(tmp_path / "vnpu-partitions.json", run_command=npu_smi),
        ],
        backend=lambda: built.backend,
    )
    checkpoints = CheckpointStore(tmp_path / "checkpoint")
    checkpoints.load()
    root = tmp_path / "cdi"
    root.mkdir()

    def make_preparer(backend: str) -> ClaimPreparer:
        return ClaimPreparer(
            claims=ClaimReader(kube_reader, driver=DRIVER, pool=NODE),
            inventory=inventory,
            checkpoints=checkpoints,
            cdi_writer=CDIWriter(root, driver=DRIVER),
            driver=DRIVER,
            backend=backend,
            partitions=partitions,
        )

    built = Rig(make_preparer("sim"), partitions, inventory, nvml, npu_smi, root, make_preparer)
    return built


def _partition_config(profile: str) -> dict[str, Any]:
    parameters = {
        "apiVersion": f"{DRIVER}/v1alpha1",
        "kind": "DeviceConfig",
        "partition": {"profile": profile},
    }
    return {
        "source": "FromClaim",
        "requests": [],
        "opaque": {"driver": DRIVER, "parameters": parameters},
    }


def _claim(kube_reader: Any, make_claim: Any, device: str, profile: str) -> ClaimRef:
    uid = str(uuid.uuid4())
    kube_reader.put(make_claim(uid=uid, devices=[device], config=[_partition_config(profile)]))
    return ClaimRef(namespace="default", name="claim-a", uid=uid)


def _edits(spec: dict[str, Any] | None) -> tuple[dict[str, Any], dict[str, Any]]:
    assert spec is not None
    assert spec_files.validate(spec) == []
    [device] = spec["devices"]
    return device["containerEdits"], spec["containerEdits"]


async def test_a_mig_partition_reaches_the_cdi_spec_and_goes_at_unprepare(
    rig, kube_reader, make_claim
):
    rig.use(_nvml_inventory(rig.nvml))
    ref = _claim(kube_reader, make_claim, "gpu-1", "1g.10gb")
    record = await rig.preparer.prepare(ref)
    [(gi, _, _)] = rig.nvml.gpu_instances_of(1)
    edits, common = _edits(rig.spec(ref.uid))
    [partition] = record.partitions
    assert partition.partition_id.startswith("MIG-")
    assert f"NVIDIA_VISIBLE_DEVICES={partition.partition_id}" in edits["env"]
    assert edits["deviceNodes"] == [
        {"path": "/dev/nvidia1"},
        {"path": f"/dev/nvidia-caps/nvidia-cap{cap_minor(1, gi)}"},
        {"path": f"/dev/nvidia-caps/nvidia-cap{cap_minor(1, gi, 0)}"},
    ]
    assert common["deviceNodes"] == [{"path": p} for p in NVIDIA_CONTROL]
    await rig.preparer.unprepare(ref)
    assert rig.nvml.gpu_instances_of(1) == []
    assert await rig.partitions.partitions() == []


async def test_a_vnpu_partition_reaches_the_cdi_spec_and_goes_at_unprepare(
    rig, kube_reader, make_claim
):
    rig.use(_ascend_inventory(2))
    ref = _claim(kube_reader, make_claim, "npu-1", "vir05_1c_8g")
    await rig.preparer.prepare(ref)
    edits, common = _edits(rig.spec(ref.uid))
    assert edits["deviceNodes"] == [{"path": "/dev/davinci124", "hostPath": "/dev/vdavinci124"}]
    assert {"ASCEND_VISIBLE_DEVICES=124", "ASCEND_RUNTIME_OPTIONS=VIRTUAL"} <= set(edits["env"])
    assert common["deviceNodes"] == [{"path": p} for p in ASCEND_CONTROL]
    await rig.preparer.unprepare(ref)
    assert rig.npu_smi.on_chip(1) == {}


async def test_recovery_removes_hardware_partitions_no_record_names(rig, kube_reader, make_claim):
    rig.use(_nvml_inventory(rig.nvml))
    admin = rig.nvml.admin_gpu_instance(0, 0, start=0)
    kept = _claim(kube_reader, make_claim, "gpu-1", "3g.40gb")
    await rig.preparer.prepare(kept)
    orphan = str(uuid.uuid4())
    gpu = rig.inventory.current.devices[1]
    await rig.partitions.create(claim_uid=orphan, device=gpu, profile="1g.10gb")
    await rig.preparer.recover()
    assert [p.claim_uid for p in await rig.partitions.partitions()] == [kept.uid]
    assert [gi for gi, _, _ in rig.nvml.gpu_instances_of(0)] == [admin]
    assert len(rig.nvml.gpu_instances_of(1)) == 1


async def test_a_claim_is_made_by_the_manager_of_the_nodes_backend(
    rig, kube_reader, make_claim, make_inventory
):
    rig.use(make_inventory("npu-0"))  # the sim backend
    ref = _claim(kube_reader, make_claim, "npu-0", "vir05_1c_8g")
    await rig.preparer.prepare(ref)
    assert rig.npu_smi.calls == []
    assert rig.nvml.calls["init"] == 0
    sim = rig.partitions.managers[0]
    assert [p.claim_uid for p in await sim.partitions()] == [ref.uid]
    assert not rig.partitions.supports("tpu")
    rig.backend = "tpu"
    with pytest.raises(ClaimError, match="the tpu backend cannot make partitions"):
        rig.partitions.check(claim_uid=ref.uid, device=inventory_pb2.Device(), profile="x")


async def test_one_managers_failure_neither_hides_nor_keeps_another_managers_partitions(
    rig, tmp_path
):
    rig.use(_ascend_inventory(1))
    uid = str(uuid.uuid4())
    npu = rig.inventory.current.devices[0]
    await rig.partitions.create(claim_uid=uid, device=npu, profile="vir05_1c_8g")
    (tmp_path / "mig-partitions.json").write_text("not json")
    assert [p.claim_uid for p in await rig.partitions.partitions()] == [uid]
    with pytest.raises(ClaimError, match=r"mig-partitions\.json"):
        await rig.partitions.delete_claim(uid)
    assert rig.npu_smi.on_chip(0) == {}


def test_the_agent_gets_all_three_managers_over_its_data_dir(tmp_path):
    config = AllocationConfig(node_name=NODE, plugin_data_dir=tmp_path, npu_smi_path="/x/npu-smi")
    built = by_backend.build(config)
    sim, mig, vnpu = built.managers
    assert isinstance(sim, SimPartitionManager)
    assert sim.path == tmp_path / "sim-partitions.json"
    assert isinstance(mig, MigPartitionManager)
    assert mig.state.path == tmp_path / "mig-partitions.json"
    assert isinstance(vnpu, VnpuPartitionManager)
    assert (vnpu.state.path, vnpu.npu_smi) == (tmp_path / "vnpu-partitions.json", "/x/npu-smi")
    assert mig.timeout_s == vnpu.timeout_s == config.partition_timeout_s == 30.0
    with pytest.raises(ConfigError, match="partition timeout must be > 0"):
        AllocationConfig(node_name=NODE, partition_timeout_s=0)
