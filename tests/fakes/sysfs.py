"""A fake sysfs tree: PCI devices under a root complex, with the bus symlinks and NUMA nodes."""

from __future__ import annotations

import os
from pathlib import Path

__all__ = ["add_pci_device"]


def add_pci_device(
    root: Path, bdf: str, *, pcie_root: str, numa_node: int | None = None, bridge: bool = True
) -> Path:
    """Create `root/devices/<pcie_root>/[bridge/]<bdf>` and the `bus/pci/devices/<bdf>` link.

    The link is relative, as the kernel makes it (`../../../devices/pci0000:00/…`).
    """
    domain, bus = pcie_root.removeprefix("pci").split(":")
    parts = [pcie_root] + ([f"{domain}:{bus}:01.0"] if bridge else []) + [bdf]
    device_dir = root / "devices" / Path(*parts)
    device_dir.mkdir(parents=True, exist_ok=True)
    if numa_node is not None:
        (device_dir / "numa_node").write_text(f"{numa_node}\n")
    links = root / "bus" / "pci" / "devices"
    links.mkdir(parents=True, exist_ok=True)
    link = links / bdf
    if not link.is_symlink():
        link.symlink_to(os.path.relpath(device_dir, links))
    return device_dir
