"""The topology preference of GetPreferredAllocation: same card, else one ring, else across
PCIe NUMA-aligned; for GPUs one NVLink group, else one NUMA node. Table-driven over the
machines of docs/hardware.md §4."""

from __future__ import annotations

import pytest

from services.allocation.deviceplugin import preference
from services.allocation.deviceplugin.preference import Placement
from shared.pb.drasuite.v1 import inventory_pb2


def duo_node() -> list[Placement]:
    """Four Atlas 300I Duo cards (2 chips each, HCCS within a card only), 2 cards per NUMA."""
    return [
        Placement(device=f"npu-{i}", card=str(i // 2 + 1), ring=f"card-{i // 2}", numa=i // 4)
        for i in range(8)
    ]


def a3_node() -> list[Placement]:
    """Four A3 NPUs of 2 dies, two HCCS rings of two NPUs, one ring per NUMA node."""
    return [
        Placement(device=f"npu-{i}", card=str(i // 2), ring=f"hccs-ring-{i // 4}", numa=i // 4)
        for i in range(8)
    ]


def ring_910a() -> list[Placement]:
    """Atlas 800 (910A): one chip per card, rings of 4; ring 0 spans NUMA 0 and 1."""
    numa = [0, 0, 1, 1, 2, 2, 3, 3]
    return [
        Placement(device=f"npu-{i}", ring=f"hccs-ring-{i // 4}", numa=numa[i]) for i in range(8)
    ]


def gpus() -> list[Placement]:
    """Eight GPUs: NVLink groups of 4 (0-3, 4-7), NUMA 0 holds 0-1 and 4-5."""
    numa = [0, 0, 1, 1, 0, 0, 1, 1]
    return [Placement(device=f"gpu-{i}", ring=f"nvlink-{i // 4}", numa=numa[i]) for i in range(8)]


def names(*indexes: int, prefix: str = "npu") -> list[str]:
    return [f"{prefix}-{i}" for i in indexes]


CASES = [
    # (placements, available, must include, size, expected)
    (duo_node, names(*range(8)), [], 2, names(0, 1)),
    (duo_node, names(0, 2, 3, 4), [], 2, names(2, 3)),
    (duo_node, names(0, 2, 4, 5, 6), [], 1, names(0)),
    (duo_node, names(1, 3, 4, 5), [], 1, names(1)),
    (duo_node, names(0, 2, 4, 6), [], 2, names(0, 2)),
    (duo_node, names(0, 4, 6), [], 2, names(4, 6)),
    (duo_node, names(*range(8)), names(5), 2, names(4, 5)),
    (duo_node, names(*range(8)), names(1, 6), 4, names(0, 1, 6, 7)),
    (duo_node, names(*range(8)), names(1, 6), 5, names(0, 1, 2, 6, 7)),
    (duo_node, names(*range(8)), [], 4, names(0, 1, 2, 3)),
    (a3_node, names(*range(8)), [], 2, names(0, 1)),
    (a3_node, names(1, 2, 3, 5), [], 2, names(2, 3)),
    (a3_node, names(1, 3, 5, 6), [], 2, names(1, 3)),
    (a3_node, names(1, 5), [], 2, names(1, 5)),
    (ring_910a, names(*range(8)), [], 2, names(0, 1)),
    (ring_910a, names(1, 2, 4, 5), [], 2, names(4, 5)),
    (ring_910a, names(0, 2, 3, 5, 6, 7), [], 4, names(2, 3, 6, 7)),
    (ring_910a, names(0, 4, 5, 6, 7), [], 4, names(4, 5, 6, 7)),
    (ring_910a, names(0, 1, 4), names(4), 2, names(0, 4)),
    (ring_910a, names(0, 1, 2, 5), [], 1, names(5)),
    (ring_910a, names(0, 1, 4, 5, 6), [], 1, names(6)),
    (gpus, names(*range(8), prefix="gpu"), [], 2, names(0, 1, prefix="gpu")),
    (gpus, names(0, 2, 4, 5, prefix="gpu"), [], 2, names(4, 5, prefix="gpu")),
    (gpus, names(0, 2, 5, 7, prefix="gpu"), [], 2, names(0, 2, prefix="gpu")),
    (gpus, names(0, 3, 4, prefix="gpu"), names(3, prefix="gpu"), 2, names(0, 3, prefix="gpu")),
    (gpus, names(*range(8), prefix="gpu"), [], 8, names(*range(8), prefix="gpu")),
]
IDS = [
    "duo: a whole card",
    "duo: the card with both chips free over two half-used cards",
    "duo: one chip from a half-used card (best fit) keeps whole cards free",
    "duo: best fit prefers the first half-used card",
    "duo: no free card: two chips of one NUMA node across PCIe",
    "duo: NUMA-aligned over a chip of the other node",
    "duo: must-include picks its card's other chip",
    "duo: two must-include chips on two cards get their own cards' chips",
    "duo: must-include cards first, then the nearest chips",
    "duo: four chips: two whole cards of one NUMA node",
    "a3: both dies of one NPU",
    "a3: the NPU with both dies free",
    "a3: no whole NPU: two dies of one ring",
    "a3: across rings when nothing else is free",
    "910a: two chips of one ring on one NUMA node",
    "910a: best-fit ring with both chips on one NUMA node",
    "910a: four across rings: whole NUMA nodes first",
    "910a: a whole free ring",
    "910a: must-include in ring 1, the only other ring-1 chip is busy",
    "910a: one chip from the ring with one free, keeping ring 0's three",
    "910a: a lone chip of its ring on its NUMA node before one of a pair",
    "gpu: one NVLink group on one NUMA node",
    "gpu: same NVLink group and NUMA node over group-only",
    "gpu: same NVLink group over same NUMA node",
    "gpu: must-include keeps its NVLink group",
    "gpu: everything",
]


@pytest.mark.parametrize(("placements", "available", "must", "size", "expected"), CASES, ids=IDS)
def test_preferred_allocation(placements, available, must, size, expected):
    got = preference.preferred(placements(), available=available, must_include=must, size=size)
    assert got == expected
    assert set(must) <= set(got)
    assert len(got) == size


@pytest.mark.parametrize(("placements", "available", "must", "size", "expected"), CASES, ids=IDS)
def test_the_answer_does_not_depend_on_the_order_of_the_request(
    placements, available, must, size, expected
):
    got = preference.preferred(
        placements(), available=list(reversed(available)), must_include=must[::-1], size=size
    )
    assert got == expected


@pytest.mark.parametrize(
    ("available", "must", "size", "message"),
    [
        (names(0, 1), [], 3, "between 0"),
        (names(0, 1), names(0, 1), 1, "between 2"),
        (names(0, 1), names(2), 2, "must be available"),
        (["npu-9"], [], 1, "not devices of this resource"),
        (names(0), [], -1, "between 0"),
    ],
    ids=["too many", "fewer than must-include", "must not available", "unknown", "negative"],
)
def test_impossible_requests_are_refused(available, must, size, message):
    with pytest.raises(preference.PreferenceError, match=message):
        preference.preferred(duo_node(), available=available, must_include=must, size=size)


def test_placement_comes_from_the_published_attributes():
    device = inventory_pb2.Device(name="npu-3")
    device.attributes["cardId"].int = 2
    device.attributes["chipId"].int = 1
    device.attributes["topologyGroup"].string = "hccs-ring-0"
    device.attributes["numaNode"].int = 1
    gpu = inventory_pb2.Device(name="gpu-0")
    gpu.attributes["interconnectGroup"].string = "nvlink-0"
    assert preference.placement_of(device) == Placement(
        device="npu-3", card="2", ring="hccs-ring-0", numa=1
    )
    assert preference.placement_of(gpu) == Placement(device="gpu-0", ring="nvlink-0")
    assert preference.placement_of(inventory_pb2.Device(name="x")) == Placement(device="x")
