"""The sim partition manager: a real model of MIG/vNPU partitions in an atomic state file."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from shared.errors import ClaimError, InvalidOpaqueConfigError
from shared.pb.drasuite.v1 import inventory_pb2
from shared.vendors.sim.partitions import SimPartitionManager

CLAIM_A = "aaaaaaaa-0000-4000-8000-000000000001"
CLAIM_B = "bbbbbbbb-0000-4000-8000-000000000002"


def _gpu(index: int = 1) -> inventory_pb2.Device:
    device = inventory_pb2.Device(name=f"gpu-{index}", kind="gpu")
    device.attributes["index"].int = index
    device.device_nodes.add(path=f"/dev/nvidia{index}", host_path="/dev/null")
    return device


def _npu(index: int = 2, *, ai_cores: str = "20", host: str = "/dev/null") -> inventory_pb2.Device:
    device = inventory_pb2.Device(name=f"npu-{index}", kind="npu")
    device.attributes["physicalId"].int = index
    device.capacity["aiCore"] = ai_cores
    device.device_nodes.add(path=f"/dev/davinci{index}", host_path=host)
    return device


@pytest.fixture
def state(tmp_path: Path) -> Path:
    return tmp_path / "plugin" / "sim-partitions.json"


async def test_create_is_idempotent_by_claim_and_device_across_restarts(state):
    first = await SimPartitionManager(state).create(
        claim_uid=CLAIM_A, device=_gpu(), profile="1g.10gb"
    )
    restarted = SimPartitionManager(state)
    again = await restarted.create(claim_uid=CLAIM_A, device=_gpu(), profile="1g.10gb")
    assert again == first
    assert restarted.creates == {}
    assert [p.id for p in await restarted.partitions()] == [first.id]


async def test_a_mig_partition_gets_a_mig_uuid_and_its_caps_nodes(state):
    partition = await SimPartitionManager(state).create(
        claim_uid=CLAIM_A, device=_gpu(1), profile="3g.40gb"
    )
    assert partition.id.startswith("MIG-")
    assert partition.env == {"NVIDIA_VISIBLE_DEVICES": partition.id}
    gi_minor = 3 + 9 * 15  # gpu 1, gi 0
    assert partition.device_nodes == (
        ("/dev/nvidia1", "/dev/null"),
        (f"/dev/nvidia-caps/nvidia-cap{gi_minor}", "/dev/null"),
        (f"/dev/nvidia-caps/nvidia-cap{gi_minor + 1}", "/dev/null"),
    )


@pytest.mark.parametrize(
    ("host", "expected_host"),
    [("/dev/null", "/dev/null"), ("", "/dev/vdavinci132")],
    ids=["sim-host-path", "real-vdavinci"],
)
async def test_a_vnpu_gets_an_id_in_its_chips_range(state, host, expected_host):
    manager = SimPartitionManager(state)
    first = await manager.create(
        claim_uid=CLAIM_A, device=_npu(2, host=host), profile="vir05_1c_8g"
    )
    second = await manager.create(
        claim_uid=CLAIM_B, device=_npu(2, host=host), profile="vir10_3c_16g"
    )
    assert (first.id, second.id) == ("132", "133")
    assert first.device_nodes == (("/dev/davinci132", expected_host),)
    assert first.env == {"ASCEND_VISIBLE_DEVICES": "132", "ASCEND_RUNTIME_OPTIONS": "VIRTUAL"}


async def test_a_device_takes_partitions_only_while_it_has_room(state):
    manager = SimPartitionManager(state)
    await manager.create(claim_uid=CLAIM_A, device=_gpu(), profile="4g.40gb")
    with pytest.raises(ClaimError, match="no room") as caught:
        await manager.create(claim_uid=CLAIM_B, device=_gpu(), profile="4g.40gb")
    assert caught.value.claim_uid == CLAIM_B
    await manager.delete_claim(CLAIM_A)
    await manager.create(claim_uid=CLAIM_B, device=_gpu(), profile="4g.40gb")


async def test_a_second_profile_for_the_same_claim_and_device_is_refused(state):
    manager = SimPartitionManager(state)
    await manager.create(claim_uid=CLAIM_A, device=_gpu(), profile="1g.10gb")
    with pytest.raises(ClaimError, match=r"already has a 1g\.10gb partition"):
        await manager.create(claim_uid=CLAIM_A, device=_gpu(), profile="2g.20gb")


async def test_delete_removes_only_the_claims_partitions_and_is_idempotent(state):
    manager = SimPartitionManager(state)
    await manager.create(claim_uid=CLAIM_A, device=_gpu(0), profile="1g.10gb")
    await manager.create(claim_uid=CLAIM_A, device=_npu(1), profile="vir05_1c_8g")
    kept = await manager.create(claim_uid=CLAIM_B, device=_gpu(0), profile="1g.10gb")
    assert len(await manager.delete_claim(CLAIM_A)) == 2
    assert await manager.delete_claim(CLAIM_A) == []
    assert await manager.partitions() == [kept]
    document = json.loads(state.read_text())
    assert (document["kind"], len(document["partitions"])) == ("SimPartitions", 1)


@pytest.mark.parametrize(
    ("device", "profile"),
    [
        (_gpu(), "vir05_1c_8g"),
        (_gpu(), "1g.5gb"),
        (_npu(), "1g.10gb"),
        (_npu(ai_cores="8"), "vir10_3c_16g"),
        (inventory_pb2.Device(name="nic-0", kind="nic"), "1g.10gb"),
    ],
    ids=[
        "npu-template-on-gpu",
        "a100-profile-on-h100",
        "mig-profile-on-npu",
        "template-too-big",
        "no-profiles",
    ],
)
def test_check_rejects_profiles_the_device_does_not_have(state, device, profile):
    with pytest.raises(InvalidOpaqueConfigError) as caught:
        SimPartitionManager(state).check(claim_uid=CLAIM_A, device=device, profile=profile)
    assert caught.value.field == "partition.profile"
    assert caught.value.claim_uid == CLAIM_A


async def test_an_unreadable_state_file_fails_the_claim_and_is_left_alone(state):
    state.parent.mkdir(parents=True)
    state.write_text("{not json")
    with pytest.raises(ClaimError, match="sim partition state"):
        await SimPartitionManager(state).create(claim_uid=CLAIM_A, device=_gpu(), profile="1g.10gb")
    assert state.read_text() == "{not json"


def test_only_the_sim_backend_is_supported(state):
    manager = SimPartitionManager(state)
    assert [b for b in ("sim", "nvml", "ascend") if manager.supports(b)] == ["sim"]


# --- placements: where an option made on demand must be made, exactly -----------------------


async def test_a_partition_asked_for_at_a_placement_is_made_there_and_found_there_again(state):
    manager = SimPartitionManager(state)
    first = await manager.create(claim_uid=CLAIM_A, device=_gpu(), profile="1g.10gb", placement=5)
    second = await manager.create(claim_uid=CLAIM_A, device=_gpu(), profile="1g.10gb", placement=6)
    again = await SimPartitionManager(state).create(
        claim_uid=CLAIM_A, device=_gpu(), profile="1g.10gb", placement=5
    )
    assert again == first != second
    entries = json.loads(state.read_text())["partitions"]
    assert [(e["claimUID"], e["placement"]) for e in entries] == [(CLAIM_A, 5), (CLAIM_A, 6)]
    assert manager.creates == {(CLAIM_A, "gpu-1"): 2}


@pytest.mark.parametrize(
    ("held", "wanted"),
    [
        (("3g.40gb", 4), ("1g.10gb", 6)),
        (("1g.10gb", 2), ("2g.20gb", 2)),
        (("7g.80gb", 0), ("1g.10gb", 3)),
    ],
    ids=["inside", "same-start", "under-the-whole"],
)
async def test_a_placement_overlapping_a_placed_partition_fails_clearly(state, held, wanted):
    manager = SimPartitionManager(state)
    await manager.create(claim_uid=CLAIM_A, device=_gpu(), profile=held[0], placement=held[1])
    message = (
        rf"placement {wanted[1]} of device gpu-1 for a {wanted[0]} partition is taken: "
        rf"claim {CLAIM_A} has a {held[0]} partition at placement {held[1]}"
    )
    with pytest.raises(ClaimError, match=message):
        await manager.create(
            claim_uid=CLAIM_B, device=_gpu(), profile=wanted[0], placement=wanted[1]
        )
    assert [p.claim_uid for p in await manager.partitions()] == [CLAIM_A]


async def test_adjacent_placements_do_not_overlap(state):
    manager = SimPartitionManager(state)
    await manager.create(claim_uid=CLAIM_A, device=_gpu(), profile="3g.40gb", placement=0)
    await manager.create(claim_uid=CLAIM_B, device=_gpu(), profile="3g.40gb", placement=4)
    assert len(await manager.partitions()) == 2


@pytest.mark.parametrize(
    ("device", "profile", "placement"),
    [(_gpu(), "3g.40gb", 2), (_gpu(), "1g.10gb", 7), (_npu(), "vir05_1c_8g", 0)],
    ids=["not-a-start-of-the-profile", "past-the-last-start", "npu"],
)
async def test_a_placement_the_profile_does_not_have_is_refused_before_and_at_create(
    state, device, profile, placement
):
    manager = SimPartitionManager(state)
    match = rf"{placement} is not a placement of a {profile} partition of {device.kind}"
    with pytest.raises(ClaimError, match=match):
        manager.check(claim_uid=CLAIM_A, device=device, profile=profile, placement=placement)
    with pytest.raises(ClaimError, match=match):
        await manager.create(claim_uid=CLAIM_A, device=device, profile=profile, placement=placement)
    assert not state.exists()
