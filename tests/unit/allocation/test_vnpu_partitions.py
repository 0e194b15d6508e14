"""The vNPU partition manager over a stateful fake npu-smi (in process, and as a real executable):
one vNPU per (claim, device), found again after a crash, never an admin's; clear errors."""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path

import pytest

from shared.errors import ClaimError, InvalidOpaqueConfigError
from shared.pb.drasuite.v1 import inventory_pb2
from shared.vendors.ascend import npusmi
from shared.vendors.ascend.npusmi import NpuSmiError
from shared.vendors.ascend.partitions import VnpuPartitionManager
from tests.fakes.npusmi_vnpu import Crash, FakeChip, FakeVnpuNpuSmi, install

CLAIM_A = "aaaaaaaa-0000-4000-8000-000000000001"
CLAIM_B = "bbbbbbbb-0000-4000-8000-000000000002"
TEMPLATE = "vir05_1c_8g"


def _npu(index: int = 0, *, physical: int | None = None, cores: str = "20") -> inventory_pb2.Device:
    """npu-<index> as the ascend discovery backend publishes it."""
    device = inventory_pb2.Device(name=f"npu-{index}", kind="npu", capacity={"aiCore": cores})
    device.attributes["type"].string = "npu"
    device.attributes["chipName"].string = "910B3"
    device.attributes["index"].int = index
    device.attributes["physicalId"].int = index if physical is None else physical
    device.device_nodes.add(path=f"/dev/davinci{index}")
    return device


@pytest.fixture
def npu_smi() -> FakeVnpuNpuSmi:
    return FakeVnpuNpuSmi.node(8)


@pytest.fixture
def state(tmp_path: Path) -> Path:
    return tmp_path / "plugin" / "vnpu-partitions.json"


@pytest.fixture
def manager(state: Path, npu_smi: FakeVnpuNpuSmi) -> VnpuPartitionManager:
    return VnpuPartitionManager(state, run_command=npu_smi)


async def test_a_partition_is_a_vnpu_seen_by_the_container_as_its_davinci_node(manager, npu_smi):
    partition = await manager.create(claim_uid=CLAIM_A, device=_npu(3), profile=TEMPLATE)
    vnpu = 3 * 16 + 108  # the upper half of the chip's ids: the agent's own
    assert npu_smi.on_chip(3) == {vnpu: TEMPLATE}
    assert ["set", "-t", "create-vnpu", "-i", "3", "-c", "0", "-f", TEMPLATE, "-v", str(vnpu)] in (
        npu_smi.calls
    )
    assert partition.id == str(vnpu)
    assert partition.env == {
        "ASCEND_VISIBLE_DEVICES": str(vnpu),
        "ASCEND_RUNTIME_OPTIONS": "VIRTUAL",
    }
    assert partition.device_nodes == ((f"/dev/davinci{vnpu}", f"/dev/vdavinci{vnpu}"),)
    [entry] = json.loads(manager.state.path.read_text())["partitions"]
    assert (entry["card"], entry["chip"], entry["vnpuId"], entry["made"]) == (3, 0, vnpu, True)


async def test_a_retry_and_a_restarted_process_find_the_vnpu_made_before(manager, npu_smi, state):
    first = await manager.create(claim_uid=CLAIM_A, device=_npu(1), profile=TEMPLATE)
    again = await manager.create(claim_uid=CLAIM_A, device=_npu(1), profile=TEMPLATE)
    restarted = VnpuPartitionManager(state, run_command=npu_smi)
    assert await restarted.create(claim_uid=CLAIM_A, device=_npu(1), profile=TEMPLATE) == first
    assert again == first
    assert npu_smi.count("create-vnpu") == 1
    with pytest.raises(ClaimError, match="already has a vir05_1c_8g partition, not vir10_3c_16g"):
        await manager.create(claim_uid=CLAIM_A, device=_npu(1), profile="vir10_3c_16g")


async def test_claims_sharing_a_chip_get_the_next_free_ids_until_the_cores_run_out(
    manager, npu_smi
):
    a = await manager.create(claim_uid=CLAIM_A, device=_npu(0), profile="vir10_3c_16g")
    npu_smi.add(0, 0, 109, "vir05_1c_16g")  # an admin's, under an id of the agent's half
    b = await manager.create(claim_uid=CLAIM_B, device=_npu(0), profile=TEMPLATE)
    assert (a.id, b.id) == ("108", "110")
    third = "cccccccc-0000-4000-8000-000000000003"
    with pytest.raises(ClaimError, match=r"no room for a vir05_1c_8g vNPU on npu-0 \(0 AI cores"):
        await manager.create(claim_uid=third, device=_npu(0), profile=TEMPLATE)
    assert [p.claim_uid for p in await manager.partitions()] == [CLAIM_A, CLAIM_B]


async def test_a_vnpu_made_just_before_a_crash_is_adopted_not_made_twice(manager, npu_smi, state):
    npu_smi.crash_after = "create-vnpu"
    with pytest.raises(Crash):
        await manager.create(claim_uid=CLAIM_A, device=_npu(2), profile=TEMPLATE)
    [entry] = json.loads(state.read_text())["partitions"]
    assert "made" not in entry
    restarted = VnpuPartitionManager(state, run_command=npu_smi)
    partition = await restarted.create(claim_uid=CLAIM_A, device=_npu(2), profile=TEMPLATE)
    assert npu_smi.count("create-vnpu") == 1
    assert npu_smi.on_chip(2) == {int(partition.id): TEMPLATE}


async def test_a_crash_before_npu_smi_ran_makes_the_vnpu_at_the_retry(
    manager: VnpuPartitionManager, npu_smi: FakeVnpuNpuSmi, state: Path
) -> None:
    async def dies_at_create(argv: Sequence[str], *, timeout_s: float) -> str:
        if "create-vnpu" in argv:
            raise Crash("killed")
        return await npu_smi(argv, timeout_s=timeout_s)

    with pytest.raises(Crash):
        await VnpuPartitionManager(state, run_command=dies_at_create).create(
            claim_uid=CLAIM_A, device=_npu(0), profile=TEMPLATE
        )
    assert npu_smi.on_chip(0) == {}
    partition = await manager.create(claim_uid=CLAIM_A, device=_npu(0), profile=TEMPLATE)
    assert npu_smi.on_chip(0) == {108: TEMPLATE}
    assert partition.id == "108"


async def test_delete_destroys_the_claims_vnpus_and_is_idempotent(manager, npu_smi):
    made = await manager.create(claim_uid=CLAIM_A, device=_npu(0), profile=TEMPLATE)
    await manager.create(claim_uid=CLAIM_B, device=_npu(1), profile=TEMPLATE)
    assert await manager.delete_claim(CLAIM_A) == [made]
    assert npu_smi.on_chip(0) == {}
    assert await manager.delete_claim(CLAIM_A) == []
    assert [p.claim_uid for p in await manager.partitions()] == [CLAIM_B]


async def test_the_orphan_sweep_never_destroys_an_admins_vnpu(manager, npu_smi, state):
    npu_smi.add(0, 0, 105, "vir10_3c_16g")
    npu_smi.crash_after = "create-vnpu"
    with pytest.raises(Crash):
        await manager.create(claim_uid=CLAIM_A, device=_npu(0), profile=TEMPLATE)
    restarted = VnpuPartitionManager(state, run_command=npu_smi)
    [orphan] = await restarted.partitions()
    assert (orphan.claim_uid, orphan.id) == (CLAIM_A, "")
    await restarted.delete_claim(CLAIM_A)
    assert npu_smi.on_chip(0) == {105: "vir10_3c_16g"}
    assert await restarted.partitions() == []


async def test_a_recorded_id_now_holding_another_template_is_left_alone(manager, npu_smi, state):
    npu_smi.crash_after = "create-vnpu"
    with pytest.raises(Crash):
        await manager.create(claim_uid=CLAIM_A, device=_npu(0), profile=TEMPLATE)
    # Ours vanished (device restart), an admin made another vNPU under the same id.
    npu_smi.vnpus.clear()
    npu_smi.add(0, 0, 108, "vir10_3c_16g")
    with pytest.raises(ClaimError, match="vNPU 108 on npu-0 is a vir10_3c_16g, not the vir05"):
        await manager.create(claim_uid=CLAIM_A, device=_npu(0), profile=TEMPLATE)
    await manager.delete_claim(CLAIM_A)
    assert npu_smi.on_chip(0) == {108: "vir10_3c_16g"}


async def test_an_admins_vnpu_under_the_agents_ids_is_handed_over_and_kept(manager, npu_smi):
    # Discovery publishes no vNPU under the agent's ids as its own device: the template's
    # options stand for it, and the claim that gets one is given that vNPU as it is.
    npu_smi.add(0, 0, 111, TEMPLATE)
    given = await manager.create(claim_uid=CLAIM_A, device=_npu(0), profile=TEMPLATE)
    assert given.id == "111"
    assert npu_smi.count("create-vnpu") == 0
    assert await manager.delete_claim(CLAIM_A) == [given]
    assert npu_smi.on_chip(0) == {111: TEMPLATE}
    assert npu_smi.count("destroy-vnpu") == 0


async def test_a_failed_create_fails_the_claim_with_npu_smis_reason_and_keeps_no_entry(
    manager, npu_smi
):
    npu_smi.fail["create-vnpu"] = "Create vnpu failed, the resource is insufficient."
    with pytest.raises(
        ClaimError,
        match=r"could not create a vir05_1c_8g vNPU on npu-0: .*resource is insufficient",
    ):
        await manager.create(claim_uid=CLAIM_A, device=_npu(0), profile=TEMPLATE)
    assert await manager.partitions() == []


async def test_npu_smi_saying_ok_without_making_it_fails_the_claim(
    npu_smi: FakeVnpuNpuSmi, state: Path
) -> None:
    async def says_ok(argv: Sequence[str], *, timeout_s: float) -> str:
        if "create-vnpu" in argv:
            return "\tStatus : OK\n\tMessage : Create vnpu success\n"
        return await npu_smi(argv, timeout_s=timeout_s)

    with pytest.raises(ClaimError, match="npu-smi said OK but does not list it"):
        await VnpuPartitionManager(state, run_command=says_ok).create(
            claim_uid=CLAIM_A, device=_npu(0), profile=TEMPLATE
        )


@pytest.mark.parametrize(
    ("subcommand", "error"),
    [
        ("info-vnpu", "npu-smi info-vnpu: no `Total number of vnpu` line"),
        ("info-m", r"npu-smi info -m: no `NPU ID \.\.\. Chip Logic ID` header"),
    ],
)
async def test_garbage_from_npu_smi_fails_the_claim_clearly(manager, npu_smi, subcommand, error):
    npu_smi.garbage[subcommand] = "Segmentation fault\n"
    with pytest.raises(ClaimError, match=error):
        await manager.create(claim_uid=CLAIM_A, device=_npu(0), profile=TEMPLATE)
    assert await manager.partitions() == []


async def test_a_device_npu_smi_does_not_know_fails_the_claim(manager):
    with pytest.raises(ClaimError, match=r"npu-9 \(id 9\) is not one chip of `npu-smi info -m`"):
        await manager.create(claim_uid=CLAIM_A, device=_npu(9), profile=TEMPLATE)


async def test_chips_are_found_by_logic_id_on_multi_chip_cards(state):
    # A 310P Duo-like layout: two chips per card, logic ids 0..3.
    chips = [FakeChip(c // 2, c % 2, c, c, name="310P3", ai_cores=8) for c in range(4)]
    npu_smi = FakeVnpuNpuSmi(chips=chips)
    manager = VnpuPartitionManager(state, run_command=npu_smi)
    chip = _npu(3, cores="8")
    chip.attributes["chipName"].string = "310P3"
    partition = await manager.create(claim_uid=CLAIM_A, device=chip, profile="vir02")
    # An inference chip has 8 ids; the agent makes its vNPUs under the upper 4.
    assert npu_smi.on_chip(1, 1) == {3 * 16 + 104: "vir02"}
    assert partition.id == "152"


def test_check_refuses_what_cannot_be_a_vnpu(manager):
    gpu = inventory_pb2.Device(name="gpu-0", kind="gpu")
    with pytest.raises(
        InvalidOpaqueConfigError, match="vNPU templates need an NPU; gpu-0 is a gpu"
    ):
        manager.check(claim_uid=CLAIM_A, device=gpu, profile=TEMPLATE)
    with pytest.raises(InvalidOpaqueConfigError, match=r"'1g.10gb' is not a vNPU template name"):
        manager.check(claim_uid=CLAIM_A, device=_npu(), profile="1g.10gb")
    with pytest.raises(InvalidOpaqueConfigError, match="vir12_3c_32g needs more AI cores"):
        manager.check(claim_uid=CLAIM_A, device=_npu(cores="8"), profile="vir12_3c_32g")
    vnpu = _npu()
    vnpu.attributes["chipName"].string = "910B4vir05_1c_8g"
    with pytest.raises(InvalidOpaqueConfigError, match=r"npu-0 is a vNPU \(910B4vir05_1c_8g\)"):
        manager.check(claim_uid=CLAIM_A, device=vnpu, profile=TEMPLATE)
    manager.check(claim_uid=CLAIM_A, device=_npu(), profile="vir10_3c_16g_nm")


async def test_the_real_runner_drives_an_npu_smi_executable(tmp_path, state):
    binary, fake_state = install(tmp_path, FakeVnpuNpuSmi.node(2))
    manager = VnpuPartitionManager(state, npu_smi=str(binary), timeout_s=20)
    partition = await manager.create(claim_uid=CLAIM_A, device=_npu(1), profile=TEMPLATE)
    assert FakeVnpuNpuSmi.load(fake_state).on_chip(1) == {124: TEMPLATE}
    assert partition.id == "124"
    await manager.delete_claim(CLAIM_A)
    assert FakeVnpuNpuSmi.load(fake_state).on_chip(1) == {}


async def test_the_real_runner_reports_exit_status_timeouts_and_a_missing_binary(tmp_path, state):
    fake = FakeVnpuNpuSmi.node(1)
    fake.fail["create-vnpu"] = "The vnpu template is not supported."
    binary, fake_state = install(tmp_path, fake)
    manager = VnpuPartitionManager(state, npu_smi=str(binary), timeout_s=20)
    with pytest.raises(ClaimError, match=r"exit status 1: Message +: The vnpu template is not"):
        await manager.create(claim_uid=CLAIM_A, device=_npu(0), profile=TEMPLATE)
    hanging = FakeVnpuNpuSmi.load(fake_state)
    hanging.hang = 30
    hanging.save(fake_state)
    slow = VnpuPartitionManager(state, npu_smi=str(binary), timeout_s=0.5)
    with pytest.raises(ClaimError, match=r"npu-smi info -m: no answer within 0.5s"):
        await slow.create(claim_uid=CLAIM_A, device=_npu(0), profile=TEMPLATE)
    gone = VnpuPartitionManager(state, npu_smi=str(tmp_path / "absent"))
    with pytest.raises(ClaimError, match="cannot run: No such file or directory"):
        await gone.create(claim_uid=CLAIM_A, device=_npu(0), profile=TEMPLATE)


# The shared parsers the manager reads npu-smi with, on the layouts of docs/hardware.md §3.3
# and 3.6.

_INFO_VNPU_310P = """\
+-------------------------------------------------------------------------------+
| Total number of vnpu: 3                                                       |
+-------------------------------------------------------------------------------+
|  Vnpu ID  |  Vgroup ID     |  Container ID  |  Status  |  Template Name       |
+-------------------------------------------------------------------------------+
|  100      |  0             |  ffffffffffff  |  1       |  vir01               |
|  101      |  1             |  ffffffffffff  |  1       |  vir02               |
|  102      |  2             |  ffffffffffff  |  1       |  vir04               |
+-------------------------------------------------------------------------------+
"""

_INFO_M_910A = (
    "\tNPU ID                         Chip ID                        Chip Logic ID"
    "                  Chip Name\n"
    "\t0                              0                              0"
    "                              Ascend 910A\n"
    "\t1                              0                              1"
    "                              Ascend 910A\n"
    "\t1                              1                              -"
    "                              MCU\n"
)


def test_info_vnpu_is_read_as_published():
    listing = npusmi.parse_vnpus(_INFO_VNPU_310P)
    assert listing.vnpus == {100: "vir01", 101: "vir02", 102: "vir04"}
    assert listing.free_ai_cores is None
    with pytest.raises(NpuSmiError, match="says 4 vNPUs but lists 3"):
        npusmi.parse_vnpus(_INFO_VNPU_310P.replace("vnpu: 3", "vnpu: 4"))
    with pytest.raises(NpuSmiError, match="is not a vNPU row"):
        npusmi.parse_vnpus(_INFO_VNPU_310P.replace("|  101 ", "|  x01 "))


def test_info_m_maps_chips_to_cards_and_leaves_out_the_mcu():
    chips = npusmi.parse_chip_map(_INFO_M_910A)
    assert [(c.card, c.chip, c.logic_id, c.name) for c in chips] == [
        (0, 0, 0, "Ascend 910A"),
        (1, 0, 1, "Ascend 910A"),
    ]
    a3 = "NPU ID  Chip ID  Chip Logic ID  Chip Phy-ID  Chip Name\n4  1  9  17  Ascend910\n"
    [die] = npusmi.parse_chip_map(a3)
    assert (die.card, die.chip, die.logic_id, die.phy_id) == (4, 1, 9, 17)
    with pytest.raises(NpuSmiError, match="expected a number, got 'x'"):
        npusmi.parse_chip_map(_INFO_M_910A.replace("\t1  ", "\tx  ", 1))


def test_a_set_command_that_says_fail_is_an_error():
    npusmi.check_status("\tStatus : OK\n\tMessage : Destroy vnpu 100 success\n", "destroy")
    with pytest.raises(NpuSmiError, match="destroy: The vnpu 100 does not exist"):
        npusmi.check_status("\tStatus : FAIL\n\tMessage : The vnpu 100 does not exist\n", "destroy")


async def test_a_malformed_entry_fails_its_claim_not_the_agent(manager, state):
    await manager.create(claim_uid=CLAIM_A, device=_npu(0), profile=TEMPLATE)
    document = json.loads(state.read_text())
    document["partitions"][0]["card"] = "not a number"
    state.write_text(json.dumps(document))
    with pytest.raises(ClaimError, match=r"vnpu-partitions\.json: malformed entry \(ValueError"):
        await manager.create(claim_uid=CLAIM_A, device=_npu(0), profile=TEMPLATE)
    with pytest.raises(ClaimError, match="malformed entry"):
        await manager.delete_claim(CLAIM_A)


async def test_a_placement_is_refused_since_vnpus_have_none(manager, npu_smi, state):
    with pytest.raises(InvalidOpaqueConfigError, match=r"vNPUs have no placements"):
        manager.check(claim_uid="c", device=_npu(), profile="vir05_1c_8g", placement=0)
    with pytest.raises(ClaimError, match=r"vNPUs have no placements; npu-0 was asked for 0"):
        await manager.create(claim_uid="c", device=_npu(), profile="vir05_1c_8g", placement=0)
    assert not state.exists()
