"""The card an Ascend chip sits on: `cardId` (npu-smi's NPU ID) and `chipId` (its Chip ID),
from the real table layouts, and the same attributes in every shipped Ascend sim profile."""

from __future__ import annotations

from pathlib import Path

import pytest

from shared.sim import profile
from shared.vendors.ascend import discovery as ascend
from shared.vendors.parts.sysfs import Sysfs
from tests.fakes.npusmi import FakeNpuSmi


def identity(device) -> tuple[int, int]:
    return device.attributes["cardId"].int, device.attributes["chipId"].int


@pytest.mark.parametrize(
    ("info", "topo", "expected"),
    [
        ("a3-16die.txt", "a3-topo.txt", [(card, die) for card in range(8) for die in (0, 1)]),
        ("910a-8npu.txt", "910a-topo.txt", [(card, 0) for card in range(8)]),
        ("310p3-published.txt", "310p3-topo.txt", [(7, 0)]),
    ],
    ids=["a3: two dies per npu", "910a: one chip per card", "310p: card 7, chip 0"],
)
async def test_card_and_chip_ids_are_npu_smis_npu_and_chip_columns(info, topo, expected):
    backend = ascend.AscendBackend(
        run_command=FakeNpuSmi.from_fixtures(info, topo), sysfs=Sysfs(Path("/nonexistent"))
    )
    scan = await backend.scan()
    assert [identity(d) for d in scan.devices] == expected


def test_the_duo_profile_has_two_chips_per_card_on_one_hccs_link():
    devices = profile.load("ascend-310p-duo").devices
    cards: dict[object, list[str]] = {}
    for device in devices:
        cards.setdefault(device.attributes["cardId"], []).append(device.name)
        assert device.attributes["chipName"] == "310P3"
    assert cards == {
        1: ["npu-0", "npu-1"],
        2: ["npu-2", "npu-3"],
        3: ["npu-4", "npu-5"],
        4: ["npu-6", "npu-7"],
    }
    chips = [device.attributes["chipId"] for device in devices]
    assert chips == [0, 1] * 4
    rings = {device.attributes["cardId"]: device.attributes["topologyGroup"] for device in devices}
    assert len(set(rings.values())) == 4


@pytest.mark.parametrize("name", ["mixed", "ascend-910b", "ascend-310p-duo"])
def test_every_shipped_npu_names_its_card_and_chip(name):
    npus = [d for d in profile.load(name).devices if d.kind == "npu"]
    assert npus
    pairs = [(d.attributes["cardId"], d.attributes["chipId"]) for d in npus]
    assert len(set(pairs)) == len(pairs)
