"""A PCI function and its IOMMU group as sysfs shows them, and when a group may pass through
(blocking reads under an injectable root; docs/vfio.md).

Layout read (the kernel's): `<root>/bus/pci/devices/<bdf>` links to the function's directory,
which holds `vendor` (`0x10de`), `class` (`0x030200`), `driver_override` (`(null)` when unset),
the `driver` link (absent while unbound) and the `iommu_group` link to
`<root>/kernel/iommu_groups/<N>`, whose `devices/` lists every function of the group.

The rule (`check_group`), the same for discovery's `vfioViable` and for the allocation agent
before it unbinds anything: every function of the device's IOMMU group is a function of the
device itself (same domain, bus and slot: a GPU's audio function passes through with it), and
none is a bridge (class 0x0604). A group holding a function of another PCI device (no ACS
isolation between them: another claim's device, or the host's) or a bridge is never passed
through, so binding a group to `vfio-pci` never takes anything but the allocated device away
from the host. The allocation agent also requires every function to have its backend's PCI
vendor (`vendors`): a forged inventory cannot make it unbind a host NIC.
"""

from __future__ import annotations

import os
import re
from collections.abc import Collection
from dataclasses import dataclass
from pathlib import Path

__all__ = [
    "BRIDGE_CLASS",
    "DEFAULT_ROOT",
    "VFIO_DRIVER",
    "NotViableError",
    "PciFunction",
    "Viability",
    "check_group",
    "device_dir",
    "group_members",
    "is_bdf",
    "read_function",
    "slot",
    "viability",
]

DEFAULT_ROOT = "/sys"
VFIO_DRIVER = "vfio-pci"
BRIDGE_CLASS = 0x0604
"""Base class 0x06 (bridge), subclass 0x04 (PCI-to-PCI): root ports, switch ports."""
_BDF = re.compile(r"[0-9a-f]{4}:[0-9a-f]{2}:[0-9a-f]{2}\.[0-7]", re.ASCII)
_NULL = "(null)"


def is_bdf(text: str) -> bool:
    """`0000:3b:00.0`, as sysfs names a function (lower case, 16-bit domain)."""
    return _BDF.fullmatch(text) is not None


def slot(bdf: str) -> str:
    """The PCI device a function belongs to: `0000:3b:00.1` -> `0000:3b:00`."""
    return bdf.rsplit(".", 1)[0]


def device_dir(root: Path, bdf: str) -> Path:
    return root / "bus" / "pci" / "devices" / bdf


@dataclass(frozen=True, slots=True, kw_only=True)
class PciFunction:
    bdf: str
    vendor: str
    """`0x10de`, lower case, as sysfs writes it; empty when unreadable."""
    pci_class: int
    """`0x030200`; -1 when unreadable."""
    driver: str | None
    """The bound driver's name; None while unbound."""
    driver_override: str | None
    """None while unset (`(null)`)."""
    iommu_group: int | None
    """None without an IOMMU (or with it off)."""

    @property
    def bridge(self) -> bool:
        return self.pci_class >> 8 == BRIDGE_CLASS


def _text(path: Path) -> str | None:
    try:
        return path.read_text().strip()
    except OSError:
        return None


def _link_name(path: Path) -> str | None:
    try:
        return os.path.basename(os.readlink(path))
    except OSError:
        return None


def read_function(root: Path, bdf: str) -> PciFunction | None:
    """The function `bdf`, or None when sysfs has no such function."""
    if not is_bdf(bdf):
        return None
    here = device_dir(root, bdf)
    if not here.is_dir():
        return None
    override = _text(here / "driver_override")
    group = _link_name(here / "iommu_group")
    try:
        pci_class = int(_text(here / "class") or "", 16)
    except ValueError:
        pci_class = -1
    return PciFunction(
        bdf=bdf,
        vendor=(_text(here / "vendor") or "").lower(),
        pci_class=pci_class,
        driver=_link_name(here / "driver"),
        driver_override=None if override in (None, "", _NULL) else override,
        iommu_group=int(group) if group is not None and group.isdigit() else None,
    )


def group_members(root: Path, group: int) -> list[str]:
    """The functions of IOMMU group `group`, sorted; empty when there is no such group."""
    try:
        names = os.listdir(root / "kernel" / "iommu_groups" / str(group) / "devices")
    except OSError:
        return []
    return sorted(names)


class NotViableError(Exception):
    """A device whose IOMMU group may not pass through; the message says why."""


def check_group(
    root: Path, bdf: str, *, vendors: Collection[str] | None = None
) -> tuple[int, list[PciFunction]]:
    """The device's IOMMU group and its functions (the device's own first) when the group
    may pass through; NotViableError otherwise. `vendors`: PCI vendor ids every function
    must have (None: any)."""
    function = read_function(root, bdf)
    if function is None:
        raise NotViableError(f"no PCI function {bdf} in sysfs")
    group = function.iommu_group
    if group is None:
        raise NotViableError(f"PCI function {bdf} has no IOMMU group (is the IOMMU on?)")
    members = group_members(root, group)
    if bdf not in members:
        raise NotViableError(f"IOMMU group {group} does not list {bdf}")
    functions = [function]
    for member in members:
        if slot(member) != slot(bdf):
            raise NotViableError(
                f"IOMMU group {group} of {bdf} also holds {member}, a function of another PCI "
                "device (not isolated from it)"
            )
        found = function if member == bdf else read_function(root, member)
        if found is None:
            raise NotViableError(f"IOMMU group {group} lists {member}, which sysfs does not have")
        if found.bridge:
            raise NotViableError(f"IOMMU group {group} of {bdf} holds the bridge {member}")
        if vendors is not None and found.vendor not in vendors:
            raise NotViableError(
                f"PCI function {member} has vendor {found.vendor or 'unknown'}, not "
                f"{' or '.join(sorted(vendors))}"
            )
        if member != bdf:
            functions.append(found)
    return group, functions


@dataclass(frozen=True, slots=True)
class Viability:
    group: int | None
    viable: bool
    reason: str = ""


def viability(root: Path, bdf: str) -> Viability:
    """Discovery's view: the group (None without one) and whether it may pass through."""
    function = read_function(root, bdf)
    group = function.iommu_group if function is not None else None
    try:
        check_group(root, bdf)
    except NotViableError as exc:
        return Viability(group, False, str(exc))
    return Viability(group, True)
