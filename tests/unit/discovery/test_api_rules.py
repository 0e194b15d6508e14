"""Publishing rules by API server version: parsing /version and the per-version limits."""

from __future__ import annotations

import pytest

from services.discovery import apirules


@pytest.mark.parametrize(
    ("version", "minor"),
    [
        ({"major": "1", "minor": "34", "gitVersion": "v1.34.2"}, 34),
        ({"major": "1", "minor": "35+", "gitVersion": "v1.35.1-gke.100"}, 35),
        ({"major": "1", "minor": "", "gitVersion": "v1.36.0"}, 36),
        ({"gitVersion": "v1.33.4"}, 33),
        ({"major": "2", "minor": "0"}, None),
        ({}, None),
    ],
    ids=["plain", "plus-suffix", "from-git-version", "only-git-version", "major-2", "empty"],
)
def test_the_minor_version_is_read_from_the_version_answer(version, minor):
    assert apirules.minor_of(version) == minor


@pytest.mark.parametrize(
    ("version", "minor"),
    [
        ({"major": "1", "minor": "33"}, 34),
        ({"major": "1", "minor": "38"}, 37),
        ({}, 37),
    ],
    ids=["older-uses-1.34", "newer-uses-1.37", "unreadable-uses-newest"],
)
def test_unsupported_versions_get_the_nearest_rules(version, minor):
    assert apirules.for_server(version).minor == minor


@pytest.mark.parametrize(
    ("minor", "together", "max_taints", "none_effect", "pci_bus_id"),
    [
        (34, True, 4, False, False),
        (35, False, 16, True, False),
        (36, False, 16, True, True),
        (37, False, 16, True, True),
    ],
    ids=["1.34", "1.35", "1.36", "1.37"],
)
def test_each_version_has_its_own_limits(minor, together, max_taints, none_effect, pci_bus_id):
    rules = apirules.for_minor(minor)
    assert rules.counters_with_devices is together
    assert rules.max_taints == max_taints
    assert ("None" in rules.taint_effects) is none_effect
    assert rules.pci_bus_id is pci_bus_id


def test_only_1_34_limits_counters_per_slice_and_device():
    old, new = apirules.for_minor(34), apirules.for_minor(35)
    assert (old.max_counters_per_slice, old.max_counter_uses_per_slice) == (32, 1024)
    assert old.max_counters_per_device == 32
    assert (new.max_counters_per_slice, new.max_counters_per_device) == (None, None)


def test_gates_found_off_turn_off_partitions_and_taints():
    rules = apirules.for_minor(36)
    assert rules.partitionable
    assert rules.taints
    off = rules.without(["DRAPartitionableDevices"]).without(["DRADeviceTaints"])
    assert not off.partitionable
    assert not off.taints
    assert off.describe() == "1.36 without DRADeviceTaints,DRAPartitionableDevices"
