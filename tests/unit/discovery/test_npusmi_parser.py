"""The shared npu-smi parsers (`shared.vendors.ascend.npusmi`) over every sample output: chips,
ids, memory, health, HCCS groups (discovery's), errors."""

from __future__ import annotations

import pytest

from shared.vendors.ascend import discovery as ascend
from shared.vendors.ascend import npusmi
from tests.fakes.npusmi import FIXTURES


def _info(name: str) -> tuple[npusmi.NpuChip, ...]:
    return npusmi.parse_info((FIXTURES / f"{name}.txt").read_text())


def _topo(name: str) -> npusmi.Topology:
    return npusmi.parse_topo((FIXTURES / f"{name}.txt").read_text())


@pytest.mark.parametrize(
    ("fixture", "count", "name", "device_ids", "memory_mb", "first_bus"),
    [
        ("910b3-8npu-published", 2, "910B3", [0, 1], 65536, "0000:c1:00.0"),
        ("910b3-8npu", 8, "910B3", list(range(8)), 65536, "0000:c1:00.0"),
        ("910b1-single", 1, "910B1", [0], 65536, "0000:c1:00.0"),
        ("310p3-published", 1, "310P3", [0], 21527, "0000:00:07.0"),
        ("310p3-vnpu", 1, "310Pvir01", [0], 2690, "0000:00:07.0"),
        ("910a-8npu", 8, "910A", list(range(8)), 32768, "0000:c1:00.0"),
        ("a3-16die", 16, "Ascend910", list(range(16)), 65536, "0000:9d:00.0"),
    ],
    ids=["910b3-published", "910b3-8", "910b1", "310p3", "310p3-vnpu", "910a", "a3"],
)
def test_the_summary_table_gives_every_chip(fixture, count, name, device_ids, memory_mb, first_bus):
    chips = _info(fixture)
    assert len(chips) == count
    assert {chip.name for chip in chips} == {name}
    assert [chip.device_id for chip in chips] == device_ids
    assert {chip.memory_mb for chip in chips} == {memory_mb}
    assert chips[0].bus_id == first_bus


def test_the_card_id_of_a_310p_is_not_its_device_id():
    (chip,) = _info("310p3-published")
    assert (chip.npu_id, chip.chip_id, chip.logic_id, chip.device_id) == (7, 0, 0, 0)


def test_a3_dies_carry_their_physical_ids_and_card():
    chips = _info("a3-16die")
    assert [(c.npu_id, c.chip_id, c.phy_id) for c in chips[:4]] == [
        (0, 0, 0),
        (0, 1, 1),
        (1, 0, 2),
        (1, 1, 3),
    ]


def test_910b_takes_hbm_not_the_empty_memory_pair_and_910a_takes_hbm_over_ddr():
    assert _info("910b3-8npu")[0].memory_mb == 65536
    assert _info("910a-8npu")[0].memory_mb == 32768  # DDR 15039, HBM 32768


def test_health_words_are_kept():
    assert [chip.health for chip in _info("910a-8npu")][4:6] == ["OK", "Warning"]


def test_the_process_table_is_not_read_as_chips():
    assert len(_info("910b3-8npu")) == 8


def test_a_table_without_chips_is_an_empty_node():
    assert _info("header-only") == ()


@pytest.mark.parametrize(
    ("fixture", "message"),
    [
        ("garbage", "no device table"),
        ("truncated", "line 13: chip row without its second row"),
        ("bad-bus-id", "line 11: '0000:ZZ:00.0' is not a PCI bus id"),
        ("910b3-topo-published", "no device table"),
    ],
    ids=["garbage", "truncated", "bad-bus-id", "topo-instead-of-info"],
)
def test_malformed_summaries_raise_a_clear_error(fixture, message):
    with pytest.raises(npusmi.NpuSmiError, match=message):
        _info(fixture)


def test_an_unknown_row_inside_the_table_is_an_error():
    text = (FIXTURES / "910b1-single.txt").read_text()
    broken = text.replace("| 0     910B1               | OK ", "| zero  910B1               | OK ")
    with pytest.raises(npusmi.NpuSmiError, match="not a chip row"):
        npusmi.parse_info(broken)


@pytest.mark.parametrize(
    ("fixture", "ids", "groups"),
    [
        ("910b3-topo-published", list(range(8)), {i: "hccs-ring-0" for i in range(8)}),
        (
            "910a-topo",
            list(range(8)),
            {i: f"hccs-ring-{i // 4}" for i in range(8)},
        ),
        ("a3-topo", list(range(16)), {i: "hccs-ring-0" for i in range(16)}),
        ("310p3-topo", [7], {}),
    ],
    ids=["910b-full-mesh", "910a-two-rings", "a3-switched", "310p-single"],
)
def test_hccs_groups_are_the_connected_components(fixture, ids, groups):
    topo = _topo(fixture)
    assert list(topo.ids) == ids
    assert ascend.hccs_groups(topo) == groups


def test_topo_reads_the_cpu_affinity_per_npu():
    topo = _topo("910b3-topo-published")
    assert topo.cpu_affinity[0] == "144-167"
    assert topo.cpu_affinity[4] == "0-23"
    assert topo.links[(2, 5)] == "HCCS"


def test_nic_columns_and_rows_are_ignored():
    text = (
        "\t   NPU0       NPU1       NIC0       CPU Affinity\n"
        "NPU0       X          SYS        PIX        0-23\n"
        "NPU1       SYS        X          PHB        24-47\n"
        "NIC0       PIX        PHB        X\n"
        "\n"
        "NIC0: eth0\n"
    )
    topo = npusmi.parse_topo(text)
    assert topo.ids == (0, 1)
    assert ascend.hccs_groups(topo) == {}


@pytest.mark.parametrize(
    ("fixture", "message"),
    [
        ("topo-ragged", "line 4: malformed row"),
        ("topo-unknown-link", "unknown link 'QPI'"),
        ("garbage", "no header row"),
        ("910b3-8npu", "no header row"),
    ],
    ids=["ragged", "unknown-link", "garbage", "info-instead-of-topo"],
)
def test_malformed_topologies_raise_a_clear_error(fixture, message):
    with pytest.raises(npusmi.NpuSmiError, match=message):
        _topo(fixture)


def test_a_topology_missing_a_row_is_incomplete():
    lines = (FIXTURES / "910b3-topo-published.txt").read_text().splitlines()
    del lines[3]
    with pytest.raises(npusmi.NpuSmiError, match="not complete"):
        npusmi.parse_topo("\n".join(lines))
