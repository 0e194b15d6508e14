"""The kernel's side of the sysfs writes that move a PCI function between drivers, over a plain
directory tree: the sim backend's kernel (its devices are never real) and the tests'.

A tree is built with `add_function` (and `add_driver`) in the kernel's layout (`pci`); code
under test writes the same paths it writes on a real node, through `SimPciKernel.write`, which
answers as `drivers/base/bus.c` and `drivers/pci/pci-driver.c` do (Linux 6.x):

- `<dev>/driver_override`: the name, a trailing newline dropped; an empty write clears it.
- `drivers/<drv>/bind`: ENODEV when there is no such function or the driver does not match it
  (its `driver_override` names another driver; none set and the driver's id table lacks the
  function's `vendor:device`; `vfio-pci` has no ids), EBUSY when the function is bound; else
  the `driver` link appears (and `drivers/<drv>/<bdf>`).
- `drivers/<drv>/unbind` (also reached as `<dev>/driver/unbind`): ENODEV unless bound to that
  driver; else both links go.
- `drivers_probe`: ENODEV for no such function; an unbound one is bound to its override, else
  to the first driver (by name) whose ids match; nothing matching leaves it unbound, no error.
- Any other file: EACCES (read-only attributes); a path that does not exist: ENOENT.

A driver's id table is the fake's own file `drivers/<drv>/.fake_ids` (`vendor:device` lines);
the real kernel keeps it in the module. Every write is also appended to `writes`.
"""

from __future__ import annotations

import errno
import os
from collections.abc import Iterable
from pathlib import Path

from shared.vfio import pci

__all__ = ["IDS_FILE", "SimPciKernel", "add_driver", "add_function"]

IDS_FILE = ".fake_ids"


def _error(code: int, path: Path) -> OSError:
    return OSError(code, os.strerror(code), str(path))


def _drivers(root: Path) -> Path:
    return root / "bus" / "pci" / "drivers"


def add_driver(root: Path, name: str, *, ids: Iterable[str] = ()) -> Path:
    """`bus/pci/drivers/<name>` with its bind and unbind files; `ids` join its id table."""
    here = _drivers(root) / name
    here.mkdir(parents=True, exist_ok=True)
    for control in ("bind", "unbind"):
        (here / control).touch()
    table = here / IDS_FILE
    known = table.read_text().split() if table.exists() else []
    table.write_text("".join(f"{i}\n" for i in dict.fromkeys([*known, *ids])))
    (root / "bus" / "pci" / "drivers_probe").touch()
    return here


def add_function(
    root: Path,
    bdf: str,
    *,
    vendor: str = "0x10de",
    device: str = "0x2330",
    pci_class: int = 0x030200,
    driver: str | None = "nvidia",
    iommu_group: int | None = None,
    pcie_root: str = "pci0000:00",
    numa_node: int | None = None,
) -> Path:
    """A PCI function under `devices/<pcie_root>/`, linked from `bus/pci/devices/<bdf>`, in
    `iommu_group` (None: no IOMMU), bound to `driver` (whose ids then list it)."""
    here = root / "devices" / pcie_root / bdf
    here.mkdir(parents=True, exist_ok=True)
    (here / "vendor").write_text(f"{vendor}\n")
    (here / "device").write_text(f"{device}\n")
    (here / "class").write_text(f"0x{pci_class:06x}\n")
    (here / "driver_override").write_text("(null)\n")
    if numa_node is not None:
        (here / "numa_node").write_text(f"{numa_node}\n")
    links = root / "bus" / "pci" / "devices"
    links.mkdir(parents=True, exist_ok=True)
    if not (links / bdf).is_symlink():
        (links / bdf).symlink_to(os.path.relpath(here, links))
    add_driver(root, pci.VFIO_DRIVER)
    if driver is not None:
        add_driver(root, driver, ids=[f"{vendor}:{device}"])
        _link_driver(root, here, bdf, driver)
    if iommu_group is not None:
        members = root / "kernel" / "iommu_groups" / str(iommu_group) / "devices"
        members.mkdir(parents=True, exist_ok=True)
        (members / bdf).symlink_to(os.path.relpath(here, members))
        (here / "iommu_group").symlink_to(os.path.relpath(members.parent, here))
    return here


def _link_driver(root: Path, here: Path, bdf: str, driver: str) -> None:
    drv = _drivers(root) / driver
    (here / "driver").symlink_to(os.path.relpath(drv, here))
    (drv / bdf).symlink_to(os.path.relpath(here, drv))


class SimPciKernel:
    """Applies the kernel's reaction to one sysfs write under `root` (see the module)."""

    def __init__(self, root: Path) -> None:
        self.root = Path(root)
        self.writes: list[tuple[str, str]] = []
        """(path relative to the root, as written; value) of every write, in order."""

    def write(self, path: Path, value: str) -> None:
        real = Path(os.path.realpath(path))
        top = Path(os.path.realpath(self.root))
        try:
            parts = real.relative_to(top).parts
        except ValueError:
            raise _error(errno.EACCES, path) from None
        if not real.exists():
            raise _error(errno.ENOENT, path)
        self.writes.append((os.path.relpath(path, self.root), value))
        text = value.split("\n", 1)[0]
        match parts:
            case ("bus", "pci", "drivers", driver, "bind"):
                self._bind(driver, text, path)
            case ("bus", "pci", "drivers", driver, "unbind"):
                self._unbind(driver, text, path)
            case ("bus", "pci", "drivers_probe"):
                self._probe(text, path)
            case ("devices", *_, "driver_override"):
                real.write_text(f"{text or '(null)'}\n")
            case _:
                raise _error(errno.EACCES, path)

    def _function(self, bdf: str, path: Path) -> pci.PciFunction:
        found = pci.read_function(self.root, bdf)
        if found is None:
            raise _error(errno.ENODEV, path)
        return found

    def _matches(self, driver: str, function: pci.PciFunction) -> bool:
        if function.driver_override is not None:
            return function.driver_override == driver
        here = pci.device_dir(self.root, function.bdf)
        ids = (_drivers(self.root) / driver / IDS_FILE).read_text().split()
        return f"{function.vendor}:{(here / 'device').read_text().strip()}" in ids

    def _bind(self, driver: str, bdf: str, path: Path) -> None:
        function = self._function(bdf, path)
        if not self._matches(driver, function):
            raise _error(errno.ENODEV, path)
        if function.driver is not None:
            raise _error(errno.EBUSY, path)
        here = Path(os.path.realpath(pci.device_dir(self.root, bdf)))
        _link_driver(self.root, here, bdf, driver)

    def _unbind(self, driver: str, bdf: str, path: Path) -> None:
        function = self._function(bdf, path)
        if function.driver != driver:
            raise _error(errno.ENODEV, path)
        (pci.device_dir(self.root, bdf) / "driver").unlink()
        (_drivers(self.root) / driver / bdf).unlink()

    def _probe(self, bdf: str, path: Path) -> None:
        function = self._function(bdf, path)
        if function.driver is not None:
            return
        for driver in sorted(os.listdir(_drivers(self.root))):
            if (_drivers(self.root) / driver / "bind").exists() and self._matches(driver, function):
                self._bind(driver, bdf, path)
                return
