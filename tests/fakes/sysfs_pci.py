"""A fake sysfs for VFIO passthrough: PCI functions, drivers and IOMMU groups in the kernel's
layout, and a kernel that reacts to the writes that move a function between drivers.

The tree and the kernel are `shared.vfio.kernel_sim` (the sim backend uses the same kernel);
this module builds the trees the tests need. `tests/unit/allocation/test_vfio_fake_kernel.py`
holds the fake to the kernel's behaviour.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from shared.vfio.kernel_sim import SimPciKernel, add_driver, add_function

__all__ = [
    "AUDIO_CLASS",
    "BRIDGE_CLASS",
    "GpuTree",
    "SimPciKernel",
    "add_driver",
    "add_function",
    "gpu",
    "npu",
]

AUDIO_CLASS = 0x040300
BRIDGE_CLASS = 0x060400
NVIDIA = "0x10de"
HUAWEI = "0x19e5"


@dataclass(frozen=True, slots=True)
class GpuTree:
    root: Path
    bdf: str
    group: int
    functions: tuple[str, ...]
    """Every function of the group: the GPU's, then its audio function's (if any)."""


def gpu(
    root: Path,
    bdf: str = "0000:3b:00.0",
    *,
    group: int = 12,
    audio: bool = True,
    driver: str | None = "nvidia",
    pcie_root: str = "pci0000:3a",
) -> GpuTree:
    """An NVIDIA GPU on `nvidia` (and its HDMI audio function on `snd_hda_intel`) alone in
    IOMMU group `group`: a group that may pass through."""
    add_function(root, bdf, vendor=NVIDIA, driver=driver, iommu_group=group, pcie_root=pcie_root)
    functions = [bdf]
    if audio:
        sound = bdf[:-1] + "1"
        add_function(
            root,
            sound,
            vendor=NVIDIA,
            device="0x22a3",
            pci_class=AUDIO_CLASS,
            driver="snd_hda_intel",
            iommu_group=group,
            pcie_root=pcie_root,
        )
        functions.append(sound)
    return GpuTree(root=root, bdf=bdf, group=group, functions=tuple(functions))


def npu(root: Path, bdf: str = "0000:c1:00.0", *, group: int = 40) -> GpuTree:
    """An Ascend NPU alone in its IOMMU group, on `drv_pcie_host`."""
    add_function(
        root,
        bdf,
        vendor=HUAWEI,
        device="0xd500",
        pci_class=0x120000,
        driver="drv_pcie_host",
        iommu_group=group,
        pcie_root="pci0000:c0",
    )
    return GpuTree(root=root, bdf=bdf, group=group, functions=(bdf,))
