"""The MIG partition manager over a fake NVML: GI + CI made once per (claim, device), found again
after a crash, removed CI first, never touching instances an admin made; clear errors."""

from __future__ import annotations

import json
import threading
from pathlib import Path

import pytest

from shared.errors import BackendLoadError, ClaimError, InvalidOpaqueConfigError
from shared.nvml import NVMLCallError
from shared.pb.drasuite.v1 import inventory_pb2
from shared.vendors.nvidia.mig import Placement
from shared.vendors.nvidia.mig_nvml import ERROR_IN_USE
from shared.vendors.nvidia.partitions import MigPartitionManager
from tests.fakes.nvml_mig import Crash, FakeMigNVML, cap_minor

CLAIM_A = "aaaaaaaa-0000-4000-8000-000000000001"
CLAIM_B = "bbbbbbbb-0000-4000-8000-000000000002"
CONTROL_NODES = ("/dev/nvidiactl", "/dev/nvidia-uvm", "/dev/nvidia-uvm-tools")


def _gpu(nvml: FakeMigNVML, index: int = 0) -> inventory_pb2.Device:
    """gpu-<index> as the nvml discovery backend publishes it."""
    uuid = nvml.gpus[index].uuid
    device = inventory_pb2.Device(name=f"gpu-{index}", kind="gpu", uuid=uuid)
    device.attributes["uuid"].string = uuid
    device.attributes["index"].int = index
    device.attributes["migCapable"].bool = True
    for path in (f"/dev/nvidia{index}", *CONTROL_NODES):
        device.device_nodes.add(path=path)
    return device


@pytest.fixture
def caps(tmp_path: Path) -> Path:
    return tmp_path / "proc" / "capabilities"


@pytest.fixture
def nvml(caps: Path) -> FakeMigNVML:
    return FakeMigNVML("H100-80GB", count=2, capabilities_root=caps)


@pytest.fixture
def state(tmp_path: Path) -> Path:
    return tmp_path / "plugin" / "mig-partitions.json"


def _manager(state: Path, nvml: FakeMigNVML, caps: Path, **kwargs: float) -> MigPartitionManager:
    return MigPartitionManager(
        state, open_library=lambda: nvml, capabilities_root=caps, timeout_s=kwargs.get("t", 10.0)
    )


@pytest.fixture
def manager(state: Path, nvml: FakeMigNVML, caps: Path) -> MigPartitionManager:
    return _manager(state, nvml, caps)


async def test_a_partition_is_a_gi_and_a_full_ci_seen_as_its_mig_device(manager, nvml):
    partition = await manager.create(claim_uid=CLAIM_A, device=_gpu(nvml, 1), profile="3g.40gb")
    [(gi, placement, cis)] = nvml.gpu_instances_of(1)
    assert (placement, cis) == (Placement(4, 4), 1)  # highest start: slice 0 stays for a 4g
    assert partition.id.startswith("MIG-")
    assert partition.env == {"NVIDIA_VISIBLE_DEVICES": partition.id}
    assert partition.device_nodes == (
        ("/dev/nvidia1", ""),
        (f"/dev/nvidia-caps/nvidia-cap{cap_minor(1, gi)}", ""),
        (f"/dev/nvidia-caps/nvidia-cap{cap_minor(1, gi, 0)}", ""),
    )
    [entry] = json.loads(manager.state.path.read_text())["partitions"]
    assert entry["gpuUUID"] == nvml.gpus[1].uuid
    assert (entry["giId"], entry["ciId"], entry["placement"]) == (gi, 0, {"start": 4, "size": 4})


async def test_a_retry_and_a_restarted_process_find_the_partition_made_before(
    manager, nvml, state, caps
):
    first = await manager.create(claim_uid=CLAIM_A, device=_gpu(nvml), profile="1g.10gb")
    again = await manager.create(claim_uid=CLAIM_A, device=_gpu(nvml), profile="1g.10gb")
    restarted = await _manager(state, nvml, caps).create(
        claim_uid=CLAIM_A, device=_gpu(nvml), profile="1g.10gb"
    )
    assert first == again == restarted
    assert nvml.calls["create_gpu_instance"] == 1
    assert nvml.calls["create_compute_instance"] == 1
    with pytest.raises(ClaimError, match=r"already has a 1g.10gb partition, not 2g.20gb"):
        await manager.create(claim_uid=CLAIM_A, device=_gpu(nvml), profile="2g.20gb")


async def test_partitions_pack_into_free_slices_until_none_is_left(manager, nvml):
    await manager.create(claim_uid=CLAIM_A, device=_gpu(nvml), profile="3g.40gb")
    await manager.create(claim_uid=CLAIM_B, device=_gpu(nvml), profile="4g.40gb")
    assert [p for _, p, _ in nvml.gpu_instances_of(0)] == [Placement(4, 4), Placement(0, 4)]
    third = "cccccccc-0000-4000-8000-000000000003"
    with pytest.raises(ClaimError, match=r"no free placement for profile 1g.10gb on gpu-0"):
        await manager.create(claim_uid=third, device=_gpu(nvml), profile="1g.10gb")
    assert [p.claim_uid for p in await manager.partitions()] == [CLAIM_A, CLAIM_B]


async def test_nvml_refusing_the_placement_fails_the_claim_and_keeps_no_entry(manager, nvml):
    nvml.fail["create_gpu_instance"] = NVMLCallError(
        "nvmlDeviceCreateGpuInstanceWithPlacement", code=23, message="Insufficient Resources"
    )
    with pytest.raises(ClaimError, match=r"no free placement for profile 1g.10gb on gpu-0"):
        await manager.create(claim_uid=CLAIM_A, device=_gpu(nvml), profile="1g.10gb")
    assert await manager.partitions() == []


async def test_a_gi_made_just_before_a_crash_is_adopted_not_made_twice(manager, nvml, state, caps):
    nvml.crash_after = "create_gpu_instance"
    with pytest.raises(Crash):
        await manager.create(claim_uid=CLAIM_A, device=_gpu(nvml), profile="2g.20gb")
    [entry] = json.loads(state.read_text())["partitions"]
    assert "giId" not in entry  # the crash came before the id was recorded
    partition = await _manager(state, nvml, caps).create(
        claim_uid=CLAIM_A, device=_gpu(nvml), profile="2g.20gb"
    )
    assert nvml.calls["create_gpu_instance"] == 1
    assert [(p, cis) for _, p, cis in nvml.gpu_instances_of(0)] == [(Placement(4, 2), 1)]
    assert partition.id.startswith("MIG-")


async def test_a_ci_made_just_before_a_crash_is_adopted_not_made_twice(manager, nvml, state, caps):
    nvml.crash_after = "create_compute_instance"
    with pytest.raises(Crash):
        await manager.create(claim_uid=CLAIM_A, device=_gpu(nvml), profile="1g.20gb")
    await _manager(state, nvml, caps).create(
        claim_uid=CLAIM_A, device=_gpu(nvml), profile="1g.20gb"
    )
    assert nvml.calls["create_compute_instance"] == 1
    assert [cis for _, _, cis in nvml.gpu_instances_of(0)] == [1]


async def test_a_failed_step_is_resumed_by_the_retry_on_the_same_gi(manager, nvml):
    nvml.fail["create_compute_instance"] = NVMLCallError("x", code=999, message="Unknown Error")
    with pytest.raises(ClaimError, match=r"creating a compute instance on gpu-0: .*Unknown Error"):
        await manager.create(claim_uid=CLAIM_A, device=_gpu(nvml), profile="1g.10gb")
    del nvml.fail["create_compute_instance"]
    await manager.create(claim_uid=CLAIM_A, device=_gpu(nvml), profile="1g.10gb")
    assert nvml.calls["create_gpu_instance"] == 1
    assert [cis for _, _, cis in nvml.gpu_instances_of(0)] == [1]


async def test_delete_removes_the_ci_then_the_gi_and_is_idempotent(manager, nvml, caps):
    made = await manager.create(claim_uid=CLAIM_A, device=_gpu(nvml), profile="7g.80gb")
    await manager.create(claim_uid=CLAIM_B, device=_gpu(nvml, 1), profile="1g.10gb")
    assert await manager.delete_claim(CLAIM_A) == [made]
    assert nvml.gpu_instances_of(0) == []
    assert not list((caps / "gpu0").rglob("access"))
    assert await manager.delete_claim(CLAIM_A) == []
    assert [p.claim_uid for p in await manager.partitions()] == [CLAIM_B]


async def test_a_partition_in_use_is_kept_and_its_claim_fails(manager, nvml):
    await manager.create(claim_uid=CLAIM_A, device=_gpu(nvml), profile="1g.10gb")
    nvml.fail["destroy_compute_instance"] = NVMLCallError("x", code=ERROR_IN_USE, message="In use")
    with pytest.raises(ClaimError, match=r"removing the MIG partition of gpu-0 \(processes still"):
        await manager.delete_claim(CLAIM_A)
    assert len(await manager.partitions()) == 1
    del nvml.fail["destroy_compute_instance"]
    assert len(await manager.delete_claim(CLAIM_A)) == 1


async def test_the_orphan_sweep_removes_what_we_made_and_never_an_admins_instances(
    manager, nvml, state, caps
):
    admin = nvml.admin_gpu_instance(0, 19, start=0)
    nvml.crash_after = "create_gpu_instance"
    with pytest.raises(Crash):  # killed before the GI id was recorded
        await manager.create(claim_uid=CLAIM_A, device=_gpu(nvml), profile="1g.10gb")
    restarted = _manager(state, nvml, caps)
    [orphan] = await restarted.partitions()
    assert (orphan.claim_uid, orphan.id) == (CLAIM_A, "")
    await restarted.delete_claim(CLAIM_A)
    assert nvml.gpu_instances_of(0) == [(admin, Placement(0, 1), 0)]
    assert await restarted.partitions() == []


async def test_a_mig_placement_device_is_made_at_its_own_placement(manager, nvml):
    placement = inventory_pb2.Device(name="gpu-0-mig-1g10gb-19-2", kind="mig", parent="gpu-0")
    placement.attributes["parentUUID"].string = nvml.gpus[0].uuid
    placement.attributes["profile"].string = "1g.10gb"
    placement.attributes["placementStart"].int = 2
    placement.device_nodes.add(path="/dev/nvidia0")
    manager.check(claim_uid=CLAIM_A, device=placement, profile="1g.10gb")
    await manager.create(claim_uid=CLAIM_A, device=placement, profile="1g.10gb")
    assert [p for _, p, _ in nvml.gpu_instances_of(0)] == [Placement(2, 1)]
    with pytest.raises(InvalidOpaqueConfigError, match=r"is a 1g.10gb placement, not 2g.20gb"):
        manager.check(claim_uid=CLAIM_A, device=placement, profile="2g.20gb")


async def test_a_slot_made_for_an_option_is_found_again_as_the_mig_device_it_became(
    manager, nvml, state
):
    # Made for an option: the parent GPU at the option's placement ...
    made = await manager.create(
        claim_uid=CLAIM_A, device=_gpu(nvml), profile="1g.10gb", placement=2
    )
    [entry] = json.loads(state.read_text())["partitions"]
    assert (entry["device"], entry["placement"]["start"]) == ("gpu-0", 2)
    # ... then the kubelet retries after a crash, and discovery now publishes the slot as the
    # MIG device that exists there (same name, the UUID NVML gave it): the same partition.
    existing = inventory_pb2.Device(
        name="gpu-0-mig-1g10gb-19-2", kind="mig", parent="gpu-0", uuid=made.id
    )
    existing.attributes["parentUUID"].string = nvml.gpus[0].uuid
    existing.attributes["profile"].string = "1g.10gb"
    existing.attributes["placementStart"].int = 2
    existing.device_nodes.add(path="/dev/nvidia0")
    manager.check(claim_uid=CLAIM_A, device=existing, profile="1g.10gb")
    assert await manager.create(claim_uid=CLAIM_A, device=existing, profile="1g.10gb") == made
    assert nvml.gpu_instances_of(0) == [(1, Placement(2, 1), 1)]
    assert len(json.loads(state.read_text())["partitions"]) == 1
    await manager.delete_claim(CLAIM_A)
    assert nvml.gpu_instances_of(0) == []


async def test_an_admins_mig_device_at_the_options_slot_is_handed_over_and_kept(
    manager, nvml, state
):
    # Discovery publishes a slot of an offered profile as an option even while a MIG device
    # sits there: one the allocation agent did not make is given as it is, never destroyed.
    admin = nvml.admin_gpu_instance(0, 19, start=2)
    nvml.init()
    handle = nvml.handle_by_uuid(nvml.gpus[0].uuid)
    ci = nvml.create_compute_instance(handle, admin, 0)
    uuid = nvml.mig_device_uuid(handle, admin, ci)
    given = await manager.create(
        claim_uid=CLAIM_A, device=_gpu(nvml), profile="1g.10gb", placement=2
    )
    assert given.id == uuid
    assert given.env == {"NVIDIA_VISIBLE_DEVICES": uuid}
    [entry] = json.loads(state.read_text())["partitions"]
    assert (entry["adopted"], entry["giId"], entry["ciId"]) == (True, admin, ci)
    assert await manager.delete_claim(CLAIM_A) == [given]
    assert nvml.gpu_instances_of(0) == [(admin, Placement(2, 1), 1)]
    assert await manager.partitions() == []
    # The next claim of the slot gets it again.
    again = await manager.create(
        claim_uid=CLAIM_B, device=_gpu(nvml), profile="1g.10gb", placement=2
    )
    assert again.id == uuid


async def test_mig_mode_off_fails_the_claim_clearly_and_writes_nothing(state, caps):
    nvml = FakeMigNVML(mig_enabled=False, capabilities_root=caps)
    manager = _manager(state, nvml, caps)
    with pytest.raises(ClaimError, match=r"MIG mode is not enabled on gpu-0 \(GPU-.*nvidia-smi"):
        await manager.create(claim_uid=CLAIM_A, device=_gpu(nvml), profile="1g.10gb")
    nvml.gpus[0].mig_mode = (0, 1)
    with pytest.raises(ClaimError, match="pending: the GPU needs a reset"):
        await manager.create(claim_uid=CLAIM_A, device=_gpu(nvml), profile="1g.10gb")
    assert await manager.partitions() == []
    assert nvml.calls["create_gpu_instance"] == 0


async def test_a_profile_of_another_gpu_model_names_this_gpus_profiles(state, caps):
    nvml = FakeMigNVML("H200-141GB", capabilities_root=caps)
    with pytest.raises(InvalidOpaqueConfigError, match=r"'1g.10gb' is not a MIG profile of gpu-0 "):
        await _manager(state, nvml, caps).create(
            claim_uid=CLAIM_A, device=_gpu(nvml), profile="1g.10gb"
        )


def test_check_refuses_what_cannot_be_a_mig_partition(manager, nvml):
    npu = inventory_pb2.Device(name="npu-0", kind="npu")
    with pytest.raises(InvalidOpaqueConfigError, match="MIG profiles need a GPU; npu-0 is a npu"):
        manager.check(claim_uid=CLAIM_A, device=npu, profile="1g.10gb")
    with pytest.raises(InvalidOpaqueConfigError, match="'vir05_1c_8g' is not a MIG profile name"):
        manager.check(claim_uid=CLAIM_A, device=_gpu(nvml), profile="vir05_1c_8g")
    l4 = _gpu(nvml)
    l4.attributes["migCapable"].bool = False
    with pytest.raises(InvalidOpaqueConfigError, match="gpu-0 cannot be partitioned with MIG"):
        manager.check(claim_uid=CLAIM_A, device=l4, profile="1g.10gb")
    manager.check(claim_uid=CLAIM_A, device=_gpu(nvml), profile="1g.10gb+me")


async def test_missing_nvml_fails_the_claim_not_the_agent(state, caps):
    def missing() -> FakeMigNVML:
        raise BackendLoadError("NVML is not available: no pynvml", backend="nvml")

    manager = MigPartitionManager(state, open_library=missing, capabilities_root=caps)
    nvml = FakeMigNVML(capabilities_root=caps)
    with pytest.raises(ClaimError, match="cannot make MIG partitions: NVML is not available"):
        await manager.create(claim_uid=CLAIM_A, device=_gpu(nvml), profile="1g.10gb")
    assert await manager.delete_claim(CLAIM_A) == []  # nothing recorded: NVML not needed


async def test_an_unreadable_capability_file_fails_the_claim(state, nvml, tmp_path):
    manager = _manager(state, nvml, tmp_path / "elsewhere")
    with pytest.raises(ClaimError, match=r"reading MIG capability .*/gpu0/mig/gi\d+/access"):
        await manager.create(claim_uid=CLAIM_A, device=_gpu(nvml), profile="1g.10gb")


async def test_a_wedged_driver_fails_claims_instead_of_piling_up_threads(state, nvml, caps):
    manager = _manager(state, nvml, caps, t=0.2)
    nvml.release = threading.Event()
    try:
        with pytest.raises(ClaimError, match=r"NVML did not answer within 0.2s"):
            await manager.create(claim_uid=CLAIM_A, device=_gpu(nvml), profile="1g.10gb")
        with pytest.raises(ClaimError, match="still blocked in the driver"):
            await manager.create(claim_uid=CLAIM_B, device=_gpu(nvml), profile="1g.10gb")
    finally:
        nvml.release.set()


async def test_an_unreadable_state_file_fails_the_claim(manager, nvml, state):
    state.parent.mkdir(parents=True)
    state.write_text("{not json")
    with pytest.raises(ClaimError, match=r"partition state .*mig-partitions.json"):
        await manager.create(claim_uid=CLAIM_A, device=_gpu(nvml), profile="1g.10gb")
    assert nvml.calls["create_gpu_instance"] == 0


async def test_a_malformed_entry_fails_its_claim_not_the_agent(manager, nvml, state):
    await manager.create(claim_uid=CLAIM_A, device=_gpu(nvml), profile="1g.10gb")
    document = json.loads(state.read_text())
    del document["partitions"][0]["placement"]
    state.write_text(json.dumps(document))
    with pytest.raises(ClaimError, match=r"mig-partitions\.json: malformed entry \(KeyError"):
        await manager.create(claim_uid=CLAIM_A, device=_gpu(nvml), profile="1g.10gb")
    with pytest.raises(ClaimError, match="malformed entry"):
        await manager.delete_claim(CLAIM_A)


async def test_a_placement_asked_for_on_the_whole_gpu_is_honoured_exactly(manager, nvml, state):
    gpu = _gpu(nvml)
    manager.check(claim_uid=CLAIM_A, device=gpu, profile="1g.10gb", placement=1)
    first = await manager.create(claim_uid=CLAIM_A, device=gpu, profile="1g.10gb", placement=1)
    second = await manager.create(claim_uid=CLAIM_A, device=gpu, profile="1g.10gb", placement=3)
    again = await manager.create(claim_uid=CLAIM_A, device=gpu, profile="1g.10gb", placement=1)
    assert again == first != second
    assert sorted(p.start for _, p, _ in nvml.gpu_instances_of(0)) == [1, 3]
    entries = json.loads(state.read_text())["partitions"]
    assert [e["placement"]["start"] for e in entries] == [1, 3]
    with pytest.raises(ClaimError, match=r"placement 0 for profile 2g.20gb on gpu-0 is taken"):
        await manager.create(claim_uid=CLAIM_B, device=gpu, profile="2g.20gb", placement=0)
    with pytest.raises(ClaimError, match=r"2 is not a placement of profile 4g.40gb on gpu-0"):
        await manager.create(claim_uid=CLAIM_B, device=gpu, profile="4g.40gb", placement=2)
    assert [p.claim_uid for p in await manager.partitions()] == [CLAIM_A, CLAIM_A]
