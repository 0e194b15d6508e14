"""Options made on demand (MIG placements flagged `createdOnDemand`): preparing a claim that got
one makes a partition of its parent, of its profile, at its placement; the spec gives the
container the partition, not the parent; unprepare removes it. Inventories are what the sim
discovery backend publishes for the `gpu-mig` profile, and an nvml-like one over a fake NVML."""

from __future__ import annotations

import dataclasses
import json
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from services.allocation.cdi import spec_files
from services.allocation.cdi.spec_files import CDIWriter
from services.allocation.claim.checkpoint import CheckpointStore, ClaimState, PreparedPartition
from services.allocation.claim.claims import ClaimReader, ClaimRef
from services.allocation.dra.preparer import ClaimPreparer
from services.allocation.partitions.by_backend import CompositePartitionManager
from shared.errors import ClaimError, ClaimUIDMismatchError, InvalidOpaqueConfigError
from shared.pb.drasuite.v1 import inventory_pb2
from shared.vendors.nvidia import discovery as nvml_backend
from shared.vendors.nvidia.mig import Placement
from shared.vendors.nvidia.partitions import MigPartitionManager
from shared.vendors.parts.partitions import PartitionManager, on_demand_option
from shared.vendors.parts.sysfs import Sysfs
from shared.vendors.sim import discovery as sim
from shared.vendors.sim.partitions import SimPartitionManager
from tests.fakes.allocation_sources import FakeInventory
from tests.fakes.nvml_mig import FakeMigNVML

DRIVER = "sim.dra-suite.io"
NODE = "node-a"
ONE_G_AT_3 = "gpu-0-mig-1g10gb-19-3"
TWO_G_AT_0 = "gpu-0-mig-2g20gb-14-0"


@dataclass
class Rig:
    preparer: ClaimPreparer
    checkpoints: CheckpointStore
    cdi_root: Path
    state: Path

    def spec(self, uid: str) -> dict[str, Any] | None:
        path = self.cdi_root / spec_files.spec_file_name(DRIVER, uid)
        return json.loads(path.read_text()) if path.exists() else None

    def entries(self) -> list[dict[str, Any]]:
        if not self.state.exists():
            return []
        entries: list[dict[str, Any]] = json.loads(self.state.read_text())["partitions"]
        return entries


async def _gpu_mig_inventory() -> inventory_pb2.Inventory:
    """What the discovery agent publishes for the sim `gpu-mig` profile."""
    scan = await sim.SimBackend.from_profile("gpu-mig").scan()
    return inventory_pb2.Inventory(
        driver=DRIVER,
        node=NODE,
        pool=NODE,
        backend="sim",
        devices=scan.devices,
        shared_counters=scan.shared_counters,
        generation=1,
    )


def _rig(
    tmp_path: Path,
    kube: Any,
    inventory: inventory_pb2.Inventory,
    *,
    partitions: PartitionManager | None = None,
) -> Rig:
    checkpoints = CheckpointStore(tmp_path / "checkpoint")
    checkpoints.load()
    root = tmp_path / "cdi"
    root.mkdir(exist_ok=True)
    state = tmp_path / "sim-partitions.json"
    preparer = ClaimPreparer(
        claims=ClaimReader(kube, driver=DRIVER, pool=NODE),
        inventory=FakeInventory(inventory),
        checkpoints=checkpoints,
        cdi_writer=CDIWriter(root, driver=DRIVER),
        driver=DRIVER,
        backend=inventory.backend,
        partitions=partitions or SimPartitionManager(state),
    )
    return Rig(preparer, checkpoints, root, state)


@pytest.fixture
async def rig(tmp_path: Path, kube_reader: Any) -> Rig:
    return _rig(tmp_path, kube_reader, await _gpu_mig_inventory())


def _claim(kube_reader: Any, make_claim: Any, *devices: str, **kwargs: Any) -> ClaimRef:
    uid = str(uuid.uuid4())
    name = kwargs.pop("name", "claim-a")
    kube_reader.put(make_claim(uid=uid, name=name, devices=list(devices), **kwargs))
    return ClaimRef(namespace="default", name=name, uid=uid)


def _env(device: dict[str, Any]) -> dict[str, str]:
    return dict(item.split("=", 1) for item in device["containerEdits"]["env"])


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


async def test_an_option_is_made_on_its_parent_at_its_placement_and_given_to_the_container(
    rig, kube_reader, make_claim
):
    ref = _claim(kube_reader, make_claim, ONE_G_AT_3)
    record = await rig.preparer.prepare(ref)

    [entry] = rig.entries()
    assert (entry["claimUID"], entry["device"], entry["profile"]) == (ref.uid, "gpu-0", "1g.10gb")
    assert entry["placement"] == 3
    assert record.state is ClaimState.PREPARE_COMPLETED
    assert record.partitions == (
        PreparedPartition(device=ONE_G_AT_3, profile="1g.10gb", partition_id=entry["id"]),
    )
    assert [d.device for d in record.devices] == [ONE_G_AT_3]

    spec = rig.spec(ref.uid)
    assert spec is not None
    assert spec_files.validate(spec) == []
    [device] = spec["devices"]
    env = _env(device)
    # The partition's MIG device, never the parent's `NVIDIA_VISIBLE_DEVICES=0`.
    assert env["NVIDIA_VISIBLE_DEVICES"] == entry["id"]
    assert entry["id"].startswith("MIG-")
    assert env["DRA_SUITE_PARTITION_ID"] == entry["id"]
    assert env["DRA_SUITE_PARTITION_PROFILE"] == "1g.10gb"
    assert env["DRA_SUITE_DEVICES"] == ONE_G_AT_3
    nodes = [n["path"] for n in device["containerEdits"]["deviceNodes"]]
    assert nodes[0] == "/dev/nvidia0"
    assert [n.startswith("/dev/nvidia-caps/nvidia-cap") for n in nodes[1:]] == [True, True]

    again = await rig.preparer.prepare(ref)
    assert again == record
    assert len(rig.entries()) == 1

    await rig.preparer.unprepare(ref)
    assert rig.entries() == []
    assert rig.spec(ref.uid) is None
    assert rig.checkpoints.get(ref.uid) is None


async def test_two_options_of_one_gpu_in_one_claim_are_two_partitions(rig, kube_reader, make_claim):
    ref = _claim(kube_reader, make_claim, "gpu-0-mig-1g10gb-19-0", "gpu-0-mig-1g10gb-19-1")
    record = await rig.preparer.prepare(ref)
    entries = rig.entries()
    assert [(e["device"], e["placement"]) for e in entries] == [("gpu-0", 0), ("gpu-0", 1)]
    assert [p.partition_id for p in record.partitions] == [e["id"] for e in entries]
    assert len({e["id"] for e in entries}) == 2
    spec = rig.spec(ref.uid)
    assert spec is not None
    # One request, two MIG devices: the request's variable names both.
    [first, second] = spec["devices"]
    assert _env(first)["NVIDIA_VISIBLE_DEVICES"] == ",".join(e["id"] for e in entries)
    assert first["containerEdits"]["deviceNodes"] != second["containerEdits"]["deviceNodes"]


async def test_a_placement_another_claims_partition_overlaps_fails_the_claim(
    rig, kube_reader, make_claim
):
    holder = _claim(kube_reader, make_claim, TWO_G_AT_0, name="holder")
    await rig.preparer.prepare(holder)
    # 2g.20gb at 0 holds memory slices 0 and 1: a 1g.10gb at 1 cannot be made.
    late = _claim(kube_reader, make_claim, "gpu-0-mig-1g10gb-19-1", name="late")
    with pytest.raises(ClaimError, match=r"placement 1 of device gpu-0 .* is taken.*2g\.20gb"):
        await rig.preparer.prepare(late)
    assert [e["claimUID"] for e in rig.entries()] == [holder.uid]
    assert rig.spec(late.uid) is None
    # The failed claim's record (it named its partition before trying) unprepares cleanly.
    await rig.preparer.unprepare(late)
    assert rig.checkpoints.get(late.uid) is None
    assert [e["claimUID"] for e in rig.entries()] == [holder.uid]
    # A placement clear of it is fine.
    fits = _claim(kube_reader, make_claim, "gpu-0-mig-1g10gb-19-2", name="fits")
    await rig.preparer.prepare(fits)
    assert [e["placement"] for e in rig.entries()] == [0, 2]


async def test_an_option_with_a_partition_profile_config_fails_before_anything_is_written(
    rig, kube_reader, make_claim
):
    ref = _claim(kube_reader, make_claim, ONE_G_AT_3, config=[_partition_config("2g.20gb")])
    with pytest.raises(InvalidOpaqueConfigError, match=r"made on demand.*partition\.profile"):
        await rig.preparer.prepare(ref)
    assert rig.checkpoints.get(ref.uid) is None
    assert rig.entries() == []
    assert rig.spec(ref.uid) is None


async def test_a_started_record_is_finished_with_the_partition_made_before_the_crash(
    rig, kube_reader, make_claim, tmp_path
):
    ref = _claim(kube_reader, make_claim, ONE_G_AT_3)
    record = await rig.preparer.prepare(ref)
    # As if killed after the partition was made: PrepareStarted naming it, no spec.
    started = dataclasses.replace(
        record,
        state=ClaimState.PREPARE_STARTED,
        cdi_spec=None,
        partitions=(PreparedPartition(device=ONE_G_AT_3, profile="1g.10gb"),),
    )
    await rig.checkpoints.put(started)
    (rig.cdi_root / spec_files.spec_file_name(DRIVER, ref.uid)).unlink()
    partitions = SimPartitionManager(rig.state)
    restarted = _rig(tmp_path, kube_reader, await _gpu_mig_inventory(), partitions=partitions)
    finished = await restarted.preparer.prepare(ref)
    assert partitions.creates == {}
    assert finished.partitions == record.partitions
    assert finished.cdi_spec == record.cdi_spec
    assert len(rig.entries()) == 1


async def test_a_started_record_whose_partition_was_never_made_makes_it_once(
    rig, kube_reader, make_claim, tmp_path
):
    ref = _claim(kube_reader, make_claim, ONE_G_AT_3)
    record = await rig.preparer.prepare(ref)
    await rig.preparer.unprepare(ref)
    # As if killed right after PrepareStarted: the record names a partition not made yet.
    started = dataclasses.replace(
        record,
        state=ClaimState.PREPARE_STARTED,
        cdi_spec=None,
        partitions=(PreparedPartition(device=ONE_G_AT_3, profile="1g.10gb"),),
    )
    await rig.checkpoints.put(started)
    partitions = SimPartitionManager(rig.state)
    restarted = _rig(tmp_path, kube_reader, await _gpu_mig_inventory(), partitions=partitions)
    finished = await restarted.preparer.prepare(ref)
    assert partitions.creates == {(ref.uid, "gpu-0"): 1}
    [entry] = rig.entries()
    assert entry["placement"] == 3
    assert finished.partitions[0].partition_id == entry["id"]


async def test_recovery_removes_an_options_partition_that_no_record_names(
    rig, kube_reader, make_claim
):
    ref = _claim(kube_reader, make_claim, ONE_G_AT_3)
    await rig.preparer.prepare(ref)
    await rig.checkpoints.delete(ref.uid)  # as if its record had been quarantined
    await rig.preparer.recover()
    assert rig.entries() == []


async def test_a_static_mig_device_keeps_todays_behaviour(tmp_path, kube_reader, make_claim):
    inventory = await _gpu_mig_inventory()
    for device in inventory.devices:
        if "createdOnDemand" in device.attributes:
            del device.attributes["createdOnDemand"]
    rig = _rig(tmp_path, kube_reader, inventory)
    ref = _claim(kube_reader, make_claim, ONE_G_AT_3)
    record = await rig.preparer.prepare(ref)
    assert record.partitions == ()
    assert rig.entries() == []
    spec = rig.spec(ref.uid)
    assert spec is not None
    assert "DRA_SUITE_PARTITION_ID" not in _env(spec["devices"][0])


@pytest.mark.parametrize(
    ("remove", "missing"),
    [("parent", "parent"), ("profile", "profile"), ("placementStart", "placementStart")],
)
async def test_an_option_the_inventory_describes_incompletely_fails_the_claim(
    tmp_path, kube_reader, make_claim, remove, missing
):
    inventory = await _gpu_mig_inventory()
    [option] = [d for d in inventory.devices if d.name == ONE_G_AT_3]
    if remove == "parent":
        option.parent = ""
    else:
        del option.attributes[remove]
    rig = _rig(tmp_path, kube_reader, inventory)
    ref = _claim(kube_reader, make_claim, ONE_G_AT_3)
    with pytest.raises(ClaimError, match=rf"{ONE_G_AT_3} is made on demand .* no {missing}"):
        await rig.preparer.prepare(ref)
    assert rig.checkpoints.get(ref.uid) is None
    assert rig.entries() == []


def test_on_demand_option_reads_the_published_attributes():
    device = inventory_pb2.Device(name=TWO_G_AT_0, kind="mig", parent="gpu-0")
    assert on_demand_option(device, claim_uid="c") is None
    device.attributes["createdOnDemand"].bool = False
    assert on_demand_option(device, claim_uid="c") is None
    device.attributes["createdOnDemand"].bool = True
    device.attributes["profile"].string = "2g.20gb"
    device.attributes["placementStart"].string = "0"  # the wrong type is not a placement
    with pytest.raises(ClaimError, match=r"no placementStart"):
        on_demand_option(device, claim_uid="c")
    device.attributes["placementStart"].int = 4
    option = on_demand_option(device, claim_uid="c")
    assert option is not None
    assert (option.parent, option.profile, option.placement) == ("gpu-0", "2g.20gb", 4)


# --- a uid prepared under one name is not handed out under another ---------------------------


async def test_a_prepared_uid_under_another_name_is_refused(rig, kube_reader, make_claim):
    ref = _claim(kube_reader, make_claim, ONE_G_AT_3)
    record = await rig.preparer.prepare(ref)
    for other in (
        dataclasses.replace(ref, name="claim-b"),
        dataclasses.replace(ref, namespace="other"),
    ):
        with pytest.raises(ClaimUIDMismatchError, match=r"already prepared for claim default/"):
            await rig.preparer.prepare(other)
    assert rig.checkpoints.get(ref.uid) == record
    assert await rig.preparer.prepare(ref) == record


# --- the nvml backend: a MIG device made through NVML at the option's placement -------------


def _nvml_inventory(nvml: FakeMigNVML) -> inventory_pb2.Inventory:
    gpu = nvml.gpus[0]
    parent = inventory_pb2.Device(name="gpu-0", kind="gpu", uuid=gpu.uuid)
    parent.attributes["uuid"].string = gpu.uuid
    parent.attributes["index"].int = 0
    parent.attributes["migCapable"].bool = True
    parent.device_nodes.add(path="/dev/nvidia0")
    option = inventory_pb2.Device(name="gpu-0-mig-3g40gb-9-4", kind="mig", parent="gpu-0")
    option.attributes["parentUUID"].string = gpu.uuid
    option.attributes["profile"].string = "3g.40gb"
    option.attributes["placementStart"].int = 4
    option.attributes["createdOnDemand"].bool = True
    option.device_nodes.add(path="/dev/nvidia0")
    return inventory_pb2.Inventory(
        driver=DRIVER, node=NODE, pool=NODE, backend="nvml", devices=[parent, option]
    )


async def test_an_nvml_option_is_a_gpu_instance_at_its_placement(tmp_path, kube_reader, make_claim):
    caps = tmp_path / "caps"
    nvml = FakeMigNVML(count=1, capabilities_root=caps)
    mig = MigPartitionManager(
        tmp_path / "mig-partitions.json", open_library=lambda: nvml, capabilities_root=caps
    )
    inventory = _nvml_inventory(nvml)
    composite = CompositePartitionManager([mig], backend=lambda: inventory.backend)
    rig = _rig(tmp_path, kube_reader, inventory, partitions=composite)
    ref = _claim(kube_reader, make_claim, "gpu-0-mig-3g40gb-9-4")
    record = await rig.preparer.prepare(ref)
    [(_, placement, cis)] = nvml.gpu_instances_of(0)
    assert (placement, cis) == (Placement(4, 4), 1)
    [partition] = await mig.partitions()
    assert (partition.device, partition.profile) == ("gpu-0", "3g.40gb")
    assert record.partitions[0].partition_id == partition.id
    spec = rig.spec(ref.uid)
    assert spec is not None
    assert _env(spec["devices"][0])["NVIDIA_VISIBLE_DEVICES"] == partition.id
    await rig.preparer.unprepare(ref)
    assert nvml.gpu_instances_of(0) == []
    assert await mig.partitions() == []


async def _discovered(nvml: FakeMigNVML) -> inventory_pb2.Inventory:
    """What the nvml discovery backend publishes for the fake's GPUs as they are now: options
    made on demand where a MIG device may be made, and the MIG devices that exist."""
    options = nvml_backend.NvmlOptions(mig_profiles=("1g.10gb", "3g.40gb"))
    backend = nvml_backend.NvmlBackend(nvml.inner, options=options, sysfs=Sysfs("/nonexistent"))
    scan = await backend.scan()
    return inventory_pb2.Inventory(
        driver=DRIVER,
        node=NODE,
        pool=NODE,
        backend="nvml",
        devices=scan.devices,
        shared_counters=scan.shared_counters,
        generation=1,
    )


async def test_a_discovered_nvml_option_made_before_a_crash_is_finished_once_it_exists(
    tmp_path, kube_reader, make_claim
):
    caps = tmp_path / "caps"
    nvml = FakeMigNVML(count=1, capabilities_root=caps)
    state = tmp_path / "mig-partitions.json"

    def partitions() -> CompositePartitionManager:
        mig = MigPartitionManager(state, open_library=lambda: nvml, capabilities_root=caps)
        return CompositePartitionManager([mig], backend=lambda: "nvml")

    three_g = "gpu-0-mig-3g40gb-9-4"
    inventory = await _discovered(nvml)
    assert on_demand_option(_named(inventory, three_g), claim_uid="c") is not None
    rig = _rig(tmp_path, kube_reader, inventory, partitions=partitions())
    ref = _claim(kube_reader, make_claim, three_g)
    record = await rig.preparer.prepare(ref)
    [(gi, placement, cis)] = nvml.gpu_instances_of(0)
    assert (placement, cis) == (Placement(4, 4), 1)
    [made] = record.partitions
    # As if killed after the MIG device was made: PrepareStarted naming it, no spec.
    started = dataclasses.replace(
        record,
        state=ClaimState.PREPARE_STARTED,
        cdi_spec=None,
        partitions=(PreparedPartition(device=three_g, profile="3g.40gb"),),
    )
    await rig.checkpoints.put(started)
    (rig.cdi_root / spec_files.spec_file_name(DRIVER, ref.uid)).unlink()
    # Meanwhile discovery scanned: the slot is still the option, naming no UUID.
    now = await _discovered(nvml)
    assert _named(now, three_g) == _named(inventory, three_g)

    restarted = _rig(tmp_path, kube_reader, now, partitions=partitions())
    finished = await restarted.preparer.prepare(ref)
    assert finished.partitions == record.partitions
    assert nvml.gpu_instances_of(0) == [(gi, Placement(4, 4), 1)]  # found, not made again
    spec = restarted.spec(ref.uid)
    assert spec is not None
    assert _env(spec["devices"][0])["NVIDIA_VISIBLE_DEVICES"] == made.partition_id
    await restarted.preparer.unprepare(ref)
    assert nvml.gpu_instances_of(0) == []
    assert on_demand_option(_named(await _discovered(nvml), three_g), claim_uid="c") is not None


def _named(inventory: inventory_pb2.Inventory, name: str) -> inventory_pb2.Device:
    [device] = [d for d in inventory.devices if d.name == name]
    return device


async def test_every_published_sim_option_is_a_placement_the_sim_manager_takes(tmp_path):
    inventory = await _gpu_mig_inventory()
    devices = {d.name: d for d in inventory.devices}
    options = [o for d in inventory.devices if (o := on_demand_option(d, claim_uid="c"))]
    assert len(options) == 4 * (7 + 3 + 2 + 1)
    manager = SimPartitionManager(tmp_path / "sim-partitions.json")
    for option in options:
        manager.check(
            claim_uid="c",
            device=devices[option.parent],
            profile=option.profile,
            placement=option.placement,
        )
