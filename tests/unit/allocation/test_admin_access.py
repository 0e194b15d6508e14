"""Admin access (KEP-5018, `adminAccess` on an allocation result): the device as it is.

An admin claim never makes or removes a partition and takes no share: no MPS daemon, no
consumed capacity, no config of its request in force, no entry in the partition state. One
that got an option made on demand (a partition that does not exist yet), or whose config sets
`partition.profile`, fails alone with an error that says so; its unprepare removes nothing of
another claim's. The checkpoint records admin access, so a restarted agent keeps it so.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Iterator
from pathlib import Path, PurePosixPath
from typing import Any

import pytest

from services.allocation.cdi import spec_files
from services.allocation.cdi.spec_files import CDIWriter
from services.allocation.claim import checkpoint
from services.allocation.claim.checkpoint import (
    CheckpointStore,
    ClaimState,
    PreparedClaim,
    PreparedDevice,
)
from services.allocation.claim.claims import (
    AllocatedClaim,
    ClaimReader,
    ClaimRef,
    DeviceResult,
    OpaqueConfig,
    select,
)
from services.allocation.dra import planning
from services.allocation.dra.preparer import ClaimPreparer
from services.allocation.mps import layout
from shared.errors import ClaimError, DeviceNotAllocatableError, InvalidOpaqueConfigError
from shared.pb.drasuite.v1 import inventory_pb2
from shared.vendors.sim.partitions import SimPartitionManager
from tests.fakes import mps_control
from tests.fakes.allocation_sources import FakeInventory
from tests.unit.allocation.test_mps_daemons import GPU
from tests.unit.allocation.test_on_demand_partitions import _gpu_mig_inventory
from tests.unit.allocation.test_preparer_mps import Node as MpsNode
from tests.unit.allocation.test_preparer_mps import _inventory as _shared_gpu_inventory

DRIVER = "sim.dra-suite.io"
NODE = "node-a"
ONE_G_AT_3 = "gpu-0-mig-1g10gb-19-3"
ONE_G_AT_5 = "gpu-0-mig-1g10gb-19-5"
SPACE_PARTITIONING = {
    "apiVersion": f"{DRIVER}/v1alpha1",
    "kind": "DeviceConfig",
    "sharing": {
        "strategy": "SpacePartitioning",
        "spacePartitioning": {"computePercent": 30, "memoryLimit": "10Gi"},
    },
}
ONE_G_PARTITION = {
    "apiVersion": f"{DRIVER}/v1alpha1",
    "kind": "DeviceConfig",
    "partition": {"profile": "1g.10gb"},
}
MPS_ROOT = PurePosixPath(f"/var/lib/kubelet/plugins/{DRIVER}/mps")


def _result(request: str, device: str, *, admin: bool, share: str = "") -> dict[str, Any]:
    result: dict[str, Any] = {"request": request, "driver": DRIVER, "pool": NODE}
    result["device"] = device
    if admin:
        result["adminAccess"] = True
    if share:
        result["shareID"] = str(uuid.uuid4())
        result["consumedCapacity"] = {"memory": share}
    return result


def _config(parameters: dict[str, Any], *requests: str) -> dict[str, Any]:
    return {
        "source": "FromClaim",
        "requests": list(requests),
        "opaque": {"driver": DRIVER, "parameters": parameters},
    }


def _put(
    kube: Any, make_claim: Any, name: str, *results: dict[str, Any], config: Any = ()
) -> ClaimRef:
    uid = str(uuid.uuid4())
    kube.put(make_claim(uid=uid, name=name, devices=[], extra_results=results, config=config))
    return ClaimRef(namespace="default", name=name, uid=uid)


def _env(device: dict[str, Any]) -> dict[str, str]:
    return dict(item.split("=", 1) for item in device["containerEdits"]["env"])


def _admin_claim(*results: DeviceResult, configs: tuple[OpaqueConfig, ...] = ()) -> AllocatedClaim:
    return AllocatedClaim(
        ref=ClaimRef(namespace="default", name="inspect", uid=str(uuid.uuid4())),
        results=results,
        configs=configs,
    )


# --- reading and recording admin access ---------------------------------------------------


def test_select_reads_admin_access_per_result(make_claim):
    uid = str(uuid.uuid4())
    claim = make_claim(
        uid=uid, devices=["npu-0"], extra_results=[_result("monitor", "npu-1", admin=True)]
    )
    selected = select(
        claim, ref=ClaimRef("default", "claim-a", uid), driver=DRIVER, pool=NODE, node=NODE
    )
    assert [(r.device, r.admin_access) for r in selected.results] == [
        ("npu-0", False),
        ("npu-1", True),
    ]


def test_the_checkpoint_keeps_admin_access_and_reads_records_without_it(tmp_path):
    uid = str(uuid.uuid4())
    device = PreparedDevice(
        request_names=("monitor",),
        pool=NODE,
        device="gpu-0",
        cdi_device_ids=(f"k8s.{DRIVER}/claim={uid}-gpu-0",),
        admin_access=True,
    )
    record = PreparedClaim(
        uid=uid,
        namespace="default",
        name="inspect",
        driver=DRIVER,
        state=ClaimState.PREPARE_COMPLETED,
        devices=(device,),
    )
    data = checkpoint.encode(record)
    [stored] = json.loads(data)["devices"]
    assert stored["adminAccess"] is True
    assert checkpoint.decode(data, path=tmp_path / "x.json") == record
    # A record of a result without admin access (or of an older agent) has no field.
    plain = checkpoint.encode(
        PreparedClaim(
            uid=uid,
            namespace="default",
            name="inspect",
            driver=DRIVER,
            state=ClaimState.PREPARE_COMPLETED,
            devices=(
                PreparedDevice(request_names=("r",), pool=NODE, device="d", cdi_device_ids=()),
            ),
        )
    )
    assert "adminAccess" not in json.loads(plain)["devices"][0]
    assert checkpoint.decode(plain, path=tmp_path / "y.json").devices[0].admin_access is False


# --- planning (pure) ---------------------------------------------------------------------


async def test_admin_access_to_an_option_made_on_demand_fails_the_claim_clearly():
    inventory = await _gpu_mig_inventory()
    claim = _admin_claim(
        DeviceResult(request="monitor", pool=NODE, device=ONE_G_AT_3, admin_access=True)
    )
    with pytest.raises(DeviceNotAllocatableError) as raised:
        planning.plan(claim, inventory, driver=DRIVER, backend="sim")
    message = str(raised.value)
    assert raised.value.claim_uid == claim.ref.uid
    assert f"request monitor has admin access to {ONE_G_AT_3}" in message
    assert "1g.10gb partition of gpu-0" in message
    assert "does not exist yet" in message
    assert "never makes (or removes) a partition" in message


async def test_admin_access_with_a_partition_profile_fails_the_claim_clearly():
    inventory = await _gpu_mig_inventory()
    config = OpaqueConfig(source="FromClaim", requests=(), parameters=ONE_G_PARTITION)
    claim = _admin_claim(
        DeviceResult(request="monitor", pool=NODE, device="gpu-0", admin_access=True),
        configs=(config,),
    )
    with pytest.raises(InvalidOpaqueConfigError, match=r"admin access.*partition\.profile \(1g"):
        planning.plan(claim, inventory, driver=DRIVER, backend="sim")


async def test_admin_access_to_the_parent_of_options_gets_the_whole_gpu_and_no_partition():
    inventory = await _gpu_mig_inventory()
    claim = _admin_claim(
        DeviceResult(request="monitor", pool=NODE, device="gpu-0", admin_access=True)
    )
    record = planning.plan(claim, inventory, driver=DRIVER, backend="sim")
    assert record.partitions == ()
    assert record.cdi_spec is not None
    [device] = record.cdi_spec["devices"]
    assert _env(device)["NVIDIA_VISIBLE_DEVICES"] == "0"
    assert [d.admin_access for d in record.devices] == [True]


def test_admin_access_to_a_shared_gpu_takes_no_share_and_no_config():
    share = str(uuid.uuid4())
    claim = _admin_claim(
        DeviceResult(
            request="monitor",
            pool=NODE,
            device="gpu-0",
            share_id=share,
            admin_access=True,
            consumed_capacity={"memory": "20Gi"},
        ),
        configs=(OpaqueConfig(source="FromClass", requests=(), parameters=SPACE_PARTITIONING),),
    )
    record = planning.plan(
        claim,
        _shared_gpu_inventory(),
        driver=DRIVER,
        backend="sim",
        mps_root=MPS_ROOT,
    )
    assert record.mps is None  # no daemon: no sharing slot taken
    assert record.partitions == ()
    assert record.device_configs == {}
    assert record.cdi_spec is not None
    [device] = record.cdi_spec["devices"]
    env = _env(device)
    assert env["NVIDIA_VISIBLE_DEVICES"] == "0"
    assert not [name for name in env if name.startswith(("DRA_SUITE_CONSUMED_", "CUDA_MPS_"))]
    assert "DRA_SUITE_SHARING_STRATEGY" not in env
    assert "mounts" not in device["containerEdits"]
    # The answer still names the result as allocated: its share ID, its own CDI device.
    [prepared] = record.devices
    assert (prepared.share_id, prepared.admin_access) == (share, True)
    assert prepared.cdi_device_ids == (
        spec_files.device_id(DRIVER, spec_files.device_name(claim.ref.uid, "gpu-0", share)),
    )


def test_in_one_claim_only_the_request_without_admin_access_shares_the_gpu():
    claim = _admin_claim(
        DeviceResult(
            request="gpu",
            pool=NODE,
            device="gpu-0",
            share_id=str(uuid.uuid4()),
            consumed_capacity={"memory": "20Gi"},
        ),
        DeviceResult(
            request="monitor",
            pool=NODE,
            device="gpu-0",
            share_id=str(uuid.uuid4()),
            consumed_capacity={"memory": "40Gi"},
            admin_access=True,
        ),
        configs=(OpaqueConfig(source="FromClass", requests=(), parameters=SPACE_PARTITIONING),),
    )
    record = planning.plan(
        claim, _shared_gpu_inventory(), driver=DRIVER, backend="sim", mps_root=MPS_ROOT
    )
    # The daemon serves the share alone: its memory, not the admin result's 40Gi on top.
    assert record.mps is not None
    assert (record.mps.devices, record.mps.pinned_mib) == ((GPU,), (10240,))
    assert set(record.device_configs) == {"gpu"}
    assert record.cdi_spec is not None
    shared, admin = record.cdi_spec["devices"]
    assert _env(shared)["DRA_SUITE_CONSUMED_MEMORY"] == str(20 * 2**30)
    assert layout.PIPE_DIR_ENV in _env(shared)
    assert not [n for n in _env(admin) if n.startswith(("DRA_SUITE_CONSUMED_", "CUDA_MPS_"))]
    assert "mounts" not in admin["containerEdits"]


# --- the preparer, with the sim partition manager ------------------------------------------


class PartitionRig:
    def __init__(self, base: Path, kube: Any, inventory: inventory_pb2.Inventory) -> None:
        self.base, self.kube, self.inventory = base, kube, inventory
        self.state = base / "sim-partitions.json"
        self.cdi_root = base / "cdi"
        self.cdi_root.mkdir(parents=True, exist_ok=True)
        self.preparer, self.checkpoints = self.start()

    def start(self) -> tuple[ClaimPreparer, CheckpointStore]:
        checkpoints = CheckpointStore(self.base / "checkpoint")
        checkpoints.load()
        preparer = ClaimPreparer(
            claims=ClaimReader(self.kube, driver=DRIVER, pool=NODE),
            inventory=FakeInventory(self.inventory),
            checkpoints=checkpoints,
            cdi_writer=CDIWriter(self.cdi_root, driver=DRIVER),
            driver=DRIVER,
            backend="sim",
            partitions=SimPartitionManager(self.state),
        )
        return preparer, checkpoints

    def restart(self) -> None:
        self.preparer, self.checkpoints = self.start()

    def entries(self) -> list[dict[str, Any]]:
        if not self.state.exists():
            return []
        entries: list[dict[str, Any]] = json.loads(self.state.read_text())["partitions"]
        return entries

    def spec(self, uid: str) -> dict[str, Any] | None:
        path = self.cdi_root / spec_files.spec_file_name(DRIVER, uid)
        return json.loads(path.read_text()) if path.exists() else None


@pytest.fixture
async def rig(tmp_path: Path, kube_reader: Any) -> PartitionRig:
    return PartitionRig(tmp_path, kube_reader, await _gpu_mig_inventory())


async def test_an_admin_claim_on_an_option_fails_alone_makes_nothing_and_the_slot_stays_free(
    rig, kube_reader, make_claim
):
    admin = _put(kube_reader, make_claim, "inspect", _result("monitor", ONE_G_AT_3, admin=True))
    other = _put(kube_reader, make_claim, "other", _result("gpu", ONE_G_AT_5, admin=False))
    answers = await rig.preparer.prepare_batch([admin, other])

    failed = answers[admin.uid]
    assert isinstance(failed, ClaimError)
    assert "has admin access" in str(failed)
    assert "does not exist yet" in str(failed)
    assert isinstance(answers[other.uid], PreparedClaim)
    # Nothing made or written for the admin claim: no partition, no record, no spec.
    assert [(e["claimUID"], e["placement"]) for e in rig.entries()] == [(other.uid, 5)]
    assert rig.checkpoints.get(admin.uid) is None
    assert rig.spec(admin.uid) is None
    # The kubelet's retry fails the same way, still without making anything.
    with pytest.raises(DeviceNotAllocatableError, match="admin access"):
        await rig.preparer.prepare(admin)
    assert len(rig.entries()) == 1
    await rig.preparer.unprepare(admin)  # the kubelet's cleanup: nothing to remove

    # A normal claim the scheduler gives that slot next prepares there.
    normal = _put(kube_reader, make_claim, "normal", _result("gpu", ONE_G_AT_3, admin=False))
    record = await rig.preparer.prepare(normal)
    assert record.state is ClaimState.PREPARE_COMPLETED
    assert sorted((e["claimUID"], e["placement"]) for e in rig.entries()) == sorted(
        [(other.uid, 5), (normal.uid, 3)]
    )


async def test_an_admin_claim_on_a_partitioned_gpu_gets_it_as_it_is_and_removes_nothing(
    rig, kube_reader, make_claim
):
    normal = _put(kube_reader, make_claim, "normal", _result("gpu", ONE_G_AT_3, admin=False))
    await rig.preparer.prepare(normal)
    [made] = rig.entries()
    normal_spec = rig.spec(normal.uid)

    admin = _put(kube_reader, make_claim, "inspect", _result("monitor", "gpu-0", admin=True))
    record = await rig.preparer.prepare(admin)
    assert record.partitions == ()
    assert [(d.device, d.admin_access) for d in record.devices] == [("gpu-0", True)]
    spec = rig.spec(admin.uid)
    assert spec is not None
    [device] = spec["devices"]
    assert _env(device)["NVIDIA_VISIBLE_DEVICES"] == "0"  # the GPU as it is
    assert rig.entries() == [made]
    stored = json.loads((rig.base / "checkpoint" / f"{admin.uid}.json").read_text())
    assert stored["devices"][0]["adminAccess"] is True
    assert "partitions" not in stored

    # A restarted agent reads it as admin access, and its recovery removes nothing.
    rig.restart()
    await rig.preparer.recover()
    assert rig.checkpoints.get(admin.uid).devices[0].admin_access is True
    assert rig.entries() == [made]
    assert await rig.preparer.prepare(admin) == record

    await rig.preparer.unprepare(admin)
    assert rig.entries() == [made]
    assert rig.spec(admin.uid) is None
    assert rig.spec(normal.uid) == normal_spec
    assert rig.checkpoints.get(normal.uid).state is ClaimState.PREPARE_COMPLETED
    await rig.preparer.unprepare(normal)
    assert rig.entries() == []


# --- the preparer, with MPS ----------------------------------------------------------------


@pytest.fixture
def mps_node(short_tmp: Path, kube_reader: Any) -> Iterator[MpsNode]:
    binary = mps_control.install(short_tmp / "bin")
    yield MpsNode(short_tmp / "node", kube_reader, binary)
    mps_control.kill_all(short_tmp)


async def test_an_admin_claim_on_a_shared_gpu_takes_no_share_and_leaves_the_sharers_daemon(
    mps_node, kube_reader, make_claim
):
    sharer = _put(
        kube_reader, make_claim, "sharer", _result("gpu", "gpu-0", admin=False, share="20Gi")
    )
    await mps_node.preparer.prepare(sharer)
    [pid] = mps_node.daemon_pids()

    admin = _put(
        kube_reader,
        make_claim,
        "inspect",
        _result("monitor", "gpu-0", admin=True, share="40Gi"),
        config=[_config(SPACE_PARTITIONING)],
    )
    record = await mps_node.preparer.prepare(admin)
    assert record.state is ClaimState.PREPARE_COMPLETED
    assert record.mps is None
    assert mps_node.daemon_pids() == [pid]  # the sharing count is unchanged
    assert mps_node.daemons.claim_uids() == [sharer.uid]

    mps_node.restart()
    await mps_node.preparer.recover()
    assert mps_node.daemon_pids() == [pid]
    await mps_node.preparer.unprepare(admin)
    assert mps_node.daemon_pids() == [pid]
    assert mps_node.daemons.claim_uids() == [sharer.uid]
    assert mps_node.checkpoints.get(sharer.uid).state is ClaimState.PREPARE_COMPLETED
