"""PCI facts from sysfs: the PCIe root complex and the NUMA node of a device (blocking reads).

The root is injectable so that tests build a fake tree. `pcie_root` follows upstream's
`k8s.io/dynamic-resource-allocation/deviceattribute`: read the `/sys/bus/pci/devices/<BDF>`
symlink, which must point under `/sys/devices/pci…` and end with the BDF, and take the first
path element after `/sys/devices/` (e.g. `pci0000:00`).

`vfio` reads the device's IOMMU group and whether it may pass through to a virtual machine
(`shared.vfio.pci`, docs/vfio.md); `vfio_attributes` sets what discovery publishes of it.
"""

from __future__ import annotations

import os
import re
from collections.abc import MutableMapping
from pathlib import Path

from shared.pb.drasuite.v1 import inventory_pb2
from shared.vfio import pci

__all__ = [
    "DEFAULT_ROOT",
    "IOMMU_GROUP",
    "PCI_BUS_ID",
    "VFIO_VIABLE",
    "Sysfs",
    "normalize_bus_id",
    "vfio_attributes",
]

DEFAULT_ROOT = "/sys"
_BDF = re.compile(r"^[0-9a-f]{4}:[0-9a-f]{2}:[0-9a-f]{2}\.[0-9a-f]$")
_LONG_BDF = re.compile(r"^([0-9a-fA-F]{4,8}):([0-9a-fA-F]{2}):([0-9a-fA-F]{2})\.([0-9a-fA-F])$")
PCI_BUS_ID = "resource.kubernetes.io/pciBusID"
IOMMU_GROUP = "iommuGroup"
VFIO_VIABLE = "vfioViable"


def vfio_attributes(
    attributes: MutableMapping[str, inventory_pb2.AttributeValue],
    *,
    bus_id: str,
    viability: pci.Viability,
) -> None:
    """A device with an IOMMU group publishes it (`iommuGroup`), whether it may pass through
    (`vfioViable`) and its PCI address (`resource.kubernetes.io/pciBusID`, which the allocation
    agent binds and the VM's launcher reads from the device metadata); without one, nothing."""
    if viability.group is None:
        return
    attributes[IOMMU_GROUP].int = viability.group
    attributes[VFIO_VIABLE].bool = viability.viable
    attributes[PCI_BUS_ID].string = bus_id


def normalize_bus_id(bus_id: str) -> str:
    """`00000000:3B:00.0` (NVML) or `0000:C1:00.0` (npu-smi) as sysfs names it: `0000:3b:00.0`.

    ValueError when it is not a PCI address.
    """
    match = _LONG_BDF.match(bus_id.strip())
    if match is None:
        raise ValueError(f"{bus_id!r} is not a PCI bus id")
    domain, bus, device, function = match.groups()
    if int(domain, 16) > 0xFFFF:
        raise ValueError(f"{bus_id!r} has a PCI domain beyond 16 bits")
    return f"{int(domain, 16):04x}:{bus.lower()}:{device.lower()}.{function.lower()}"


class Sysfs:
    """Reads under `root` (default `/sys`); every lookup returns None when it cannot tell."""

    def __init__(self, root: str | Path = DEFAULT_ROOT) -> None:
        self.root = Path(root)

    def pcie_root(self, bdf: str) -> str | None:
        """`pci<domain>:<bus>` of the root complex above the device, None when unresolvable."""
        if not _BDF.match(bdf):
            return None
        link = self.root / "bus" / "pci" / "devices" / bdf
        try:
            target = os.readlink(link)
        except OSError:
            return None
        resolved = os.path.normpath(os.path.join(link.parent, target))
        devices = os.path.join(self.root, "devices")
        if not resolved.startswith(os.path.join(devices, "pci")):
            return None
        if os.path.basename(resolved) != bdf:
            return None
        return os.path.relpath(resolved, devices).split(os.sep)[0]

    def numa_node(self, bdf: str) -> int | None:
        """The device's NUMA node; None when unknown (no file, or -1 on a single-node host)."""
        try:
            text = (self.root / "bus" / "pci" / "devices" / bdf / "numa_node").read_text()
            node = int(text.strip())
        except (OSError, ValueError):
            return None
        return node if node >= 0 else None

    def vfio(self, bdf: str) -> pci.Viability:
        """The device's IOMMU group (None without one) and whether it may pass through."""
        return pci.viability(self.root, bdf)
