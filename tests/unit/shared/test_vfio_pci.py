"""The fake kernel (`shared.vfio.kernel_sim`) reacts to sysfs writes as Linux does, and the
IOMMU group rule (`shared.vfio.pci.check_group`) passes only groups that hold nothing but the
device's own functions."""

from __future__ import annotations

import errno
import os
from pathlib import Path

import pytest

from shared.vfio import pci
from shared.vfio.kernel_sim import SimPciKernel
from tests.fakes import sysfs_pci

BDF = "0000:3b:00.0"
AUDIO = "0000:3b:00.1"


def _driver(root: Path, bdf: str) -> str | None:
    found = pci.read_function(root, bdf)
    assert found is not None
    return found.driver


def _dev(root: Path, bdf: str) -> Path:
    return pci.device_dir(root, bdf)


def _drivers(root: Path) -> Path:
    return root / "bus" / "pci" / "drivers"


def _errno(kernel: SimPciKernel, path: Path, value: str) -> int:
    with pytest.raises(OSError, match=r"\[Errno") as raised:
        kernel.write(path, value)
    assert raised.value.errno is not None
    return raised.value.errno


def test_a_built_tree_reads_as_the_kernel_lays_it_out(tmp_path):
    sysfs_pci.gpu(tmp_path)
    found = pci.read_function(tmp_path, BDF)
    assert found == pci.PciFunction(
        bdf=BDF,
        vendor="0x10de",
        pci_class=0x030200,
        driver="nvidia",
        driver_override=None,
        iommu_group=12,
    )
    assert os.readlink(_dev(tmp_path, BDF) / "iommu_group").endswith("kernel/iommu_groups/12")
    assert pci.group_members(tmp_path, 12) == [BDF, AUDIO]
    assert (_drivers(tmp_path) / "nvidia" / BDF).resolve() == _dev(tmp_path, BDF).resolve()
    assert pci.read_function(tmp_path, "0000:99:00.0") is None
    assert pci.read_function(tmp_path, "../../etc") is None


def test_driver_override_is_set_without_its_newline_and_cleared_by_an_empty_write(tmp_path):
    sysfs_pci.gpu(tmp_path)
    kernel = SimPciKernel(tmp_path)
    override = _dev(tmp_path, BDF) / "driver_override"
    kernel.write(override, "vfio-pci\n")
    assert override.read_text() == "vfio-pci\n"
    assert pci.read_function(tmp_path, BDF).driver_override == "vfio-pci"  # type: ignore[union-attr]
    kernel.write(override, "\n")
    assert override.read_text() == "(null)\n"
    assert pci.read_function(tmp_path, BDF).driver_override is None  # type: ignore[union-attr]


def test_unbind_through_the_driver_link_removes_both_links(tmp_path):
    sysfs_pci.gpu(tmp_path)
    kernel = SimPciKernel(tmp_path)
    kernel.write(_dev(tmp_path, BDF) / "driver" / "unbind", BDF)
    assert _driver(tmp_path, BDF) is None
    assert not (_drivers(tmp_path) / "nvidia" / BDF).exists()
    # Unbound: the driver link, and the unbind file behind it, are gone.
    assert _errno(kernel, _dev(tmp_path, BDF) / "driver" / "unbind", BDF) == errno.ENOENT
    assert _errno(kernel, _drivers(tmp_path) / "nvidia" / "unbind", BDF) == errno.ENODEV
    assert kernel.writes[0] == (f"bus/pci/devices/{BDF}/driver/unbind", BDF)


def test_bind_needs_a_match_and_an_unbound_function(tmp_path):
    sysfs_pci.gpu(tmp_path)
    kernel = SimPciKernel(tmp_path)
    vfio_bind = _drivers(tmp_path) / "vfio-pci" / "bind"
    # Bound to nvidia: busy for the driver that matches it, no match for vfio-pci (no ids).
    assert _errno(kernel, _drivers(tmp_path) / "nvidia" / "bind", BDF) == errno.EBUSY
    kernel.write(_dev(tmp_path, BDF) / "driver" / "unbind", BDF)
    assert _errno(kernel, vfio_bind, BDF) == errno.ENODEV
    kernel.write(_dev(tmp_path, BDF) / "driver_override", "vfio-pci")
    # The override names vfio-pci: nvidia no longer matches.
    assert _errno(kernel, _drivers(tmp_path) / "nvidia" / "bind", BDF) == errno.ENODEV
    kernel.write(vfio_bind, BDF)
    assert _driver(tmp_path, BDF) == "vfio-pci"
    assert _errno(kernel, vfio_bind, BDF) == errno.EBUSY
    assert _errno(kernel, vfio_bind, "0000:99:00.0") == errno.ENODEV
    assert _errno(kernel, _drivers(tmp_path) / "nouveau" / "bind", BDF) == errno.ENOENT


def test_drivers_probe_binds_the_override_or_the_matching_driver(tmp_path):
    sysfs_pci.gpu(tmp_path)
    kernel = SimPciKernel(tmp_path)
    probe = tmp_path / "bus" / "pci" / "drivers_probe"
    kernel.write(probe, BDF)  # bound already: nothing to do, no error
    assert _driver(tmp_path, BDF) == "nvidia"
    kernel.write(_dev(tmp_path, BDF) / "driver" / "unbind", BDF)
    kernel.write(probe, BDF)
    assert _driver(tmp_path, BDF) == "nvidia"
    kernel.write(_dev(tmp_path, BDF) / "driver" / "unbind", BDF)
    kernel.write(_dev(tmp_path, BDF) / "driver_override", "vfio-pci")
    kernel.write(probe, BDF)
    assert _driver(tmp_path, BDF) == "vfio-pci"
    kernel.write(_dev(tmp_path, BDF) / "driver" / "unbind", BDF)
    kernel.write(_dev(tmp_path, BDF) / "driver_override", "absent-driver")
    kernel.write(probe, BDF)  # nothing matches: left unbound, no error
    assert _driver(tmp_path, BDF) is None
    assert _errno(kernel, probe, "0000:99:00.0") == errno.ENODEV


def test_read_only_attributes_and_paths_outside_the_tree_are_refused(tmp_path):
    sysfs_pci.gpu(tmp_path / "sys")
    kernel = SimPciKernel(tmp_path / "sys")
    assert _errno(kernel, _dev(tmp_path / "sys", BDF) / "vendor", "0x8086") == errno.EACCES
    outside = tmp_path / "elsewhere"
    outside.write_text("")
    assert _errno(kernel, outside, "x") == errno.EACCES
    assert pci.read_function(tmp_path / "sys", BDF).vendor == "0x10de"  # type: ignore[union-attr]


def test_a_group_of_the_device_s_own_functions_passes_through(tmp_path):
    sysfs_pci.gpu(tmp_path)
    group, functions = pci.check_group(tmp_path, BDF, vendors={"0x10de"})
    assert (group, [f.bdf for f in functions]) == (12, [BDF, AUDIO])
    assert pci.viability(tmp_path, BDF) == pci.Viability(12, True)


@pytest.mark.parametrize(
    ("intruder", "reason"),
    [
        ({"bdf": "0000:3c:00.0", "vendor": "0x8086", "driver": "ixgbe"}, "another PCI device"),
        ({"bdf": "0000:3b:00.2", "pci_class": 0x060400, "driver": "pcieport"}, "bridge"),
        ({"bdf": "0000:3b:00.2", "vendor": "0x8086", "driver": "xhci_hcd"}, "vendor 0x8086"),
    ],
    ids=["other-device", "bridge", "other-vendor"],
)
def test_a_group_with_anything_else_does_not(tmp_path, intruder, reason):
    sysfs_pci.gpu(tmp_path)
    sysfs_pci.add_function(tmp_path, iommu_group=12, pcie_root="pci0000:3a", **intruder)
    with pytest.raises(pci.NotViableError, match=reason):
        pci.check_group(tmp_path, BDF, vendors={"0x10de"})
    viability = pci.viability(tmp_path, BDF)
    assert (viability.group, viability.viable) == (12, reason == "vendor 0x8086")


def test_no_iommu_means_no_group(tmp_path):
    sysfs_pci.add_function(tmp_path, BDF, iommu_group=None)
    assert pci.viability(tmp_path, BDF) == pci.Viability(
        None, False, f"PCI function {BDF} has no IOMMU group (is the IOMMU on?)"
    )
    assert pci.viability(tmp_path, "0000:99:00.0").reason == "no PCI function 0000:99:00.0 in sysfs"
