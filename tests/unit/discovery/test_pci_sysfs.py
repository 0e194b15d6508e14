"""PCI facts from a fake sysfs tree: PCIe root as upstream derives it, NUMA node, bus ids."""

from __future__ import annotations

import os

import pytest

from shared import quantity
from shared.vendors.parts import topology
from shared.vendors.parts.sysfs import Sysfs, normalize_bus_id
from tests.fakes.sysfs import add_pci_device


@pytest.mark.parametrize(
    ("raw", "expected"),
    [
        ("00000000:3B:00.0", "0000:3b:00.0"),
        ("0000:C1:00.0", "0000:c1:00.0"),
        ("0000:c1:00.0", "0000:c1:00.0"),
        (" 00000001:0A:1F.7 ", "0001:0a:1f.7"),
    ],
    ids=["nvml-long-domain", "npu-smi-upper", "already-normal", "domain-one-padded"],
)
def test_bus_ids_are_normalized_as_sysfs_names_them(raw, expected):
    assert normalize_bus_id(raw) == expected


@pytest.mark.parametrize("raw", ["", "0000:ZZ:00.0", "3b:00.0", "100000000:3b:00.0"])
def test_a_malformed_bus_id_is_a_value_error(raw):
    with pytest.raises(ValueError, match=r"bus id|domain"):
        normalize_bus_id(raw)


def test_pcie_root_is_the_first_element_under_devices(tmp_path):
    add_pci_device(tmp_path, "0000:3b:00.0", pcie_root="pci0000:3a", numa_node=0)
    add_pci_device(tmp_path, "0000:c1:00.0", pcie_root="pci0000:c0", bridge=False)
    sysfs = Sysfs(tmp_path)
    assert sysfs.pcie_root("0000:3b:00.0") == "pci0000:3a"
    assert sysfs.pcie_root("0000:c1:00.0") == "pci0000:c0"


def test_pcie_root_is_unknown_without_a_link_or_outside_the_pci_tree(tmp_path):
    sysfs = Sysfs(tmp_path)
    assert sysfs.pcie_root("0000:3b:00.0") is None
    virtual = tmp_path / "devices" / "virtual" / "0000:3c:00.0"
    virtual.mkdir(parents=True)
    links = tmp_path / "bus" / "pci" / "devices"
    links.mkdir(parents=True)
    (links / "0000:3c:00.0").symlink_to(os.path.relpath(virtual, links))
    assert sysfs.pcie_root("0000:3c:00.0") is None
    assert sysfs.pcie_root("0000:3B:00.0") is None  # not a sysfs name


def test_pcie_root_is_unknown_when_the_link_ends_elsewhere(tmp_path):
    device = add_pci_device(tmp_path, "0000:3b:00.0", pcie_root="pci0000:3a")
    links = tmp_path / "bus" / "pci" / "devices"
    (links / "0000:3d:00.0").symlink_to(os.path.relpath(device, links))
    assert Sysfs(tmp_path).pcie_root("0000:3d:00.0") is None


@pytest.mark.parametrize(
    ("written", "expected"),
    [(1, 1), (0, 0), (-1, None), (None, None)],
    ids=["node-1", "node-0", "single-node-host", "no-file"],
)
def test_numa_node_comes_from_sysfs(tmp_path, written, expected):
    add_pci_device(tmp_path, "0000:3b:00.0", pcie_root="pci0000:3a", numa_node=written)
    assert Sysfs(tmp_path).numa_node("0000:3b:00.0") == expected


@pytest.mark.parametrize(
    ("n_bytes", "expected"),
    [
        (80 << 30, "80Gi"),
        (81559 << 20, "81559Mi"),
        (1536 << 20, "1536Mi"),
        (1 << 40, "1Ti"),
        (1000, "1000"),
        (0, "0"),
    ],
    ids=["gibibytes", "mebibytes", "not-whole-gib", "tebibyte", "bytes", "zero"],
)
def test_byte_counts_are_canonical_quantities(n_bytes, expected):
    assert quantity.binary(n_bytes) == expected


def test_interconnect_groups_name_components_by_their_lowest_member():
    links = [(3, "switch-a"), (2, "switch-a"), (0, 1), (5, 6), (6, 7)]
    assert topology.groups(range(8), links, prefix="g-") == {
        0: "g-0",
        1: "g-0",
        2: "g-1",
        3: "g-1",
        5: "g-2",
        6: "g-2",
        7: "g-2",
    }
