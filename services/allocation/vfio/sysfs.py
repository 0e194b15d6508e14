"""The seam between the binder and the kernel: reads are plain file reads of the sysfs tree
(`shared.vfio.pci`), each write goes through a `PciSysfs`.

`KernelSysfs` writes the file, as `echo` would (one write, no create, no truncate); the kernel
reacts. `SimPciKernel` (`shared.vfio.kernel_sim`) is the same seam over a plain directory,
reacting as the kernel does: the sim backend's, only ever over a tree other than `/sys`
(`for_backend`).
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Protocol

from shared.vfio import pci
from shared.vfio.kernel_sim import SimPciKernel

__all__ = ["KernelSysfs", "PciSysfs", "for_backend"]


class PciSysfs(Protocol):
    root: Path
    """The sysfs root (`/sys`) the reads go to as well."""

    def write(self, path: Path, value: str) -> None:
        """Write `value` to the sysfs file `path` (blocking); OSError as the kernel answers."""
        ...


class KernelSysfs:
    """Real sysfs: the file is written, the kernel does the rest."""

    def __init__(self, root: Path = Path(pci.DEFAULT_ROOT)) -> None:
        self.root = root

    def write(self, path: Path, value: str) -> None:
        fd = os.open(path, os.O_WRONLY | os.O_CLOEXEC)
        try:
            data = value.encode()
            if os.write(fd, data) != len(data):
                raise OSError(f"short write to {path}")
        finally:
            os.close(fd)


def for_backend(backend: str, root: Path) -> PciSysfs | None:
    """The sysfs a backend's VFIO binder writes to; None where it cannot pass devices through
    (the sim backend without a sim tree: it never writes to the real `/sys`)."""
    if backend == "sim":
        if os.path.realpath(root) == os.path.realpath(pci.DEFAULT_ROOT):
            return None
        return SimPciKernel(root)
    if backend in ("nvml", "ascend"):
        return KernelSysfs(root)
    return None
