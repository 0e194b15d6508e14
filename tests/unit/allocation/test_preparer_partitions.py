"""ClaimPreparer with partitions and shares: made once, named in the spec, removed at unprepare,
orphans swept at start, the share ID returned to the kubelet."""

from __future__ import annotations

import dataclasses
import json
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Any, cast

import grpc
import pytest

from services.allocation.cdi import spec_files
from services.allocation.cdi.spec_files import CDIWriter
from services.allocation.claim.checkpoint import CheckpointStore, ClaimState
from services.allocation.claim.claims import ClaimReader, ClaimRef
from services.allocation.dra.preparer import ClaimPreparer
from services.allocation.dra.service import DRAService
from shared.errors import ClaimError, InvalidOpaqueConfigError
from shared.pb.drasuite.v1 import inventory_pb2
from shared.pb.kubelet.dra.v1 import api_pb2 as v1
from shared.vendors.sim.partitions import SimPartitionManager
from tests.fakes.allocation_sources import FakeInventory

DRIVER = "sim.dra-suite.io"
NODE = "node-a"
SHARE = "0f5a9d1e-2b3c-4d5e-8f60-718293a4b5c6"


@dataclass
class Rig:
    preparer: ClaimPreparer
    partitions: SimPartitionManager
    checkpoints: CheckpointStore
    cdi_root: Path

    def spec(self, uid: str) -> dict[str, Any] | None:
        path = self.cdi_root / spec_files.spec_file_name(DRIVER, uid)
        return json.loads(path.read_text()) if path.exists() else None


def _rig(tmp_path: Path, kube: Any, inventory: inventory_pb2.Inventory) -> Rig:
    checkpoints = CheckpointStore(tmp_path / "checkpoint")
    checkpoints.load()
    root = tmp_path / "cdi"
    root.mkdir(exist_ok=True)
    partitions = SimPartitionManager(tmp_path / "sim-partitions.json")
    preparer = ClaimPreparer(
        claims=ClaimReader(kube, driver=DRIVER, pool=NODE),
        inventory=FakeInventory(inventory),
        checkpoints=checkpoints,
        cdi_writer=CDIWriter(root, driver=DRIVER),
        driver=DRIVER,
        backend=inventory.backend,
        partitions=partitions,
    )
    return Rig(preparer, partitions, checkpoints, root)


@pytest.fixture
def rig(tmp_path, kube_reader, make_inventory) -> Rig:
    return _rig(tmp_path, kube_reader, make_inventory("npu-0", "npu-1", "npu-2"))


def _partition_config(profile: str = "vir05_1c_8g") -> dict[str, Any]:
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


def _ref(uid: str) -> ClaimRef:
    return ClaimRef(namespace="default", name="claim-a", uid=uid)


async def test_a_partitioned_claim_gets_one_partition_per_device_named_in_its_spec(
    rig, kube_reader, make_claim
):
    uid = str(uuid.uuid4())
    kube_reader.put(make_claim(uid=uid, devices=["npu-0", "npu-2"], config=[_partition_config()]))
    record = await rig.preparer.prepare(_ref(uid))
    made = await rig.partitions.partitions()
    assert [(p.claim_uid, p.device) for p in made] == [(uid, "npu-0"), (uid, "npu-2")]
    assert [p.partition_id for p in record.partitions] == [p.id for p in made]
    spec = rig.spec(uid)
    assert spec is not None
    assert spec_files.validate(spec) == []
    for device, partition in zip(spec["devices"], made, strict=True):
        assert device["containerEdits"]["deviceNodes"] == [
            {"path": f"/dev/davinci{partition.id}", "hostPath": "/dev/null"}
        ]
        assert "DRA_SUITE_PARTITION_PROFILE=vir05_1c_8g" in device["containerEdits"]["env"]
    again = await rig.preparer.prepare(_ref(uid))
    assert again.devices == record.devices
    assert sum(rig.partitions.creates.values()) == 2
    # PrepareStarted names the partitions before they exist: durable, as PrepareCompleted.
    assert rig.checkpoints.commit.commits == 2


async def test_unprepare_removes_the_claims_partitions(rig, kube_reader, make_claim):
    uid = str(uuid.uuid4())
    kube_reader.put(make_claim(uid=uid, devices=["npu-1"], config=[_partition_config()]))
    await rig.preparer.prepare(_ref(uid))
    await rig.preparer.unprepare(_ref(uid))
    assert await rig.partitions.partitions() == []
    assert rig.spec(uid) is None
    await rig.preparer.unprepare(_ref(uid))


async def test_a_started_record_whose_partitions_are_made_is_finished_without_new_ones(
    rig, kube_reader, make_claim, make_inventory, tmp_path
):
    uid = str(uuid.uuid4())
    kube_reader.put(make_claim(uid=uid, devices=["npu-1"], config=[_partition_config()]))
    record = await rig.preparer.prepare(_ref(uid))
    # As if killed after the partition was made: the record is back to PrepareStarted, no spec.
    started = dataclasses.replace(record, state=ClaimState.PREPARE_STARTED, cdi_spec=None)
    await rig.checkpoints.put(started)
    (rig.cdi_root / spec_files.spec_file_name(DRIVER, uid)).unlink()
    restarted = _rig(tmp_path, kube_reader, make_inventory("npu-0", "npu-1", "npu-2"))
    finished = await restarted.preparer.prepare(_ref(uid))
    assert finished.devices == record.devices
    assert restarted.partitions.creates == {}
    assert len(await restarted.partitions.partitions()) == 1
    assert restarted.spec(uid) is not None


@pytest.mark.parametrize(
    ("profile", "error"),
    [("1g.10gb", InvalidOpaqueConfigError), ("vir99_1c_8g", InvalidOpaqueConfigError)],
    ids=["mig-profile-on-an-npu", "unknown-template"],
)
async def test_a_profile_the_device_lacks_fails_the_claim_before_anything_is_written(
    rig, kube_reader, make_claim, profile, error
):
    uid = str(uuid.uuid4())
    kube_reader.put(make_claim(uid=uid, devices=["npu-0"], config=[_partition_config(profile)]))
    with pytest.raises(error, match=r"partition\.profile"):
        await rig.preparer.prepare(_ref(uid))
    assert rig.checkpoints.get(uid) is None
    assert await rig.partitions.partitions() == []


async def test_backends_without_a_partition_manager_fail_partitioned_claims(
    tmp_path, kube_reader, make_claim, make_inventory
):
    inventory = make_inventory("npu-0")
    inventory.backend = "ascend"
    for node in inventory.devices[0].device_nodes:
        node.host_path = ""  # as the ascend backend publishes it (the sim maps to /dev/null)
    rig = _rig(tmp_path, kube_reader, inventory)
    uid = str(uuid.uuid4())
    kube_reader.put(make_claim(uid=uid, devices=["npu-0"], config=[_partition_config()]))
    with pytest.raises(ClaimError, match="ascend backend cannot make partitions"):
        await rig.preparer.prepare(_ref(uid))
    assert rig.checkpoints.get(uid) is None


async def test_recovery_removes_partitions_no_record_names(
    rig, kube_reader, make_claim, make_inventory
):
    kept, orphan = str(uuid.uuid4()), str(uuid.uuid4())
    kube_reader.put(make_claim(uid=kept, devices=["npu-0"], config=[_partition_config()]))
    await rig.preparer.prepare(_ref(kept))
    await rig.partitions.create(
        claim_uid=orphan, device=make_inventory("npu-2").devices[0], profile="vir05_1c_8g"
    )
    await rig.preparer.recover()
    assert [p.claim_uid for p in await rig.partitions.partitions()] == [kept]


async def test_the_share_id_reaches_the_kubelet_and_names_the_cdi_device(
    rig, kube_reader, make_claim
):
    uid = str(uuid.uuid4())
    share = {
        "request": "req",
        "driver": DRIVER,
        "pool": NODE,
        "device": "npu-1",
        "shareID": SHARE,
        "consumedCapacity": {"memCapacity": "8Gi"},
    }
    kube_reader.put(make_claim(uid=uid, devices=["npu-0"], extra_results=[share]))
    request = v1.NodePrepareResourcesRequest(
        claims=[v1.Claim(namespace="default", name="claim-a", uid=uid)]
    )
    context = cast("grpc.aio.ServicerContext[Any, Any]", _Context())
    response = await DRAService(rig.preparer).NodePrepareResources(request, context)
    whole, shared = response.claims[uid].devices
    assert not whole.HasField("share_id")
    assert shared.share_id == SHARE
    assert shared.cdi_device_ids == [
        spec_files.device_id(DRIVER, spec_files.device_name(uid, "npu-1", SHARE))
    ]
    spec = rig.spec(uid)
    assert spec is not None
    assert (
        f"DRA_SUITE_CONSUMED_MEMCAPACITY=,{8 * 2**30}"
        in spec["devices"][1]["containerEdits"]["env"]
    )
    assert rig.checkpoints.get(uid).devices[1].share_id == SHARE


class _Context:
    """The ServicerContext calls the servicer makes."""

    def invocation_metadata(self) -> tuple[()]:
        return ()

    def time_remaining(self) -> float | None:
        return None  # a call without a deadline
