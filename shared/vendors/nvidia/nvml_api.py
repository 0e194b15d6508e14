"""The NVML seam: the NVML calls discovery makes, as a typed Protocol, and the real library.

`PynvmlLibrary` imports `pynvml` (PyPI `nvidia-ml-py`) only when it is opened, so this module
imports on machines without it; `open_library()` turns a missing package, shared library or
driver into `BackendLoadError("NVML is not available: …")`. A failed call raises
`NVMLCallError`; `unsupported` separates "this GPU lacks the feature" from a real failure.
The MIG calls (profiles, placements, GPU instances, MIG devices) are `shared.nvml`'s, shared
with the MIG partition manager, and return `shared.vendors.nvidia.mig` types.
All calls block: callers run them in a worker thread. The test double is `tests/fakes/nvml.py`.
"""

from __future__ import annotations

from typing import Protocol

from shared.nvml import (
    ERROR_INVALID_ARGUMENT,
    ERROR_NOT_FOUND,
    ERROR_NOT_SUPPORTED,
    GI_PROFILE_ENUM_COUNT,
    Handle,
    NVMLCallError,
    PynvmlBase,
    import_pynvml,
    text,
)
from shared.vendors.nvidia.mig import GpuInstance, GpuInstanceProfile, MigDevice, Placement

__all__ = [
    "ERROR_INVALID_ARGUMENT",
    "ERROR_NOT_FOUND",
    "ERROR_NOT_SUPPORTED",
    "NVLINK_MAX_LINKS",
    "PROFILE_ENUM_COUNT",
    "Handle",
    "NVMLCallError",
    "NVMLLibrary",
    "PynvmlLibrary",
    "open_library",
]

NVLINK_MAX_LINKS = 36
"""`NVML_NVLINK_MAX_LINKS`: links are probed 0..35; unused ones answer "not supported"."""
PROFILE_ENUM_COUNT = GI_PROFILE_ENUM_COUNT
"""`NVML_GPU_INSTANCE_PROFILE_COUNT`: GI profile enums are probed 0..COUNT-1."""


class NVMLLibrary(Protocol):
    """The NVML calls discovery makes (blocking)."""

    def init(self) -> None: ...
    def shutdown(self) -> None: ...
    def driver_version(self) -> str: ...
    def cuda_driver_version(self) -> int: ...
    def device_count(self) -> int: ...
    def handle_by_index(self, index: int) -> Handle: ...
    def uuid(self, handle: Handle) -> str: ...
    def name(self, handle: Handle) -> str: ...
    def minor_number(self, handle: Handle) -> int: ...
    def architecture(self, handle: Handle) -> int: ...
    def cuda_compute_capability(self, handle: Handle) -> tuple[int, int]: ...
    def memory_total(self, handle: Handle) -> int: ...
    def pci_bus_id(self, handle: Handle) -> str: ...
    def mig_mode(self, handle: Handle) -> tuple[int, int]: ...
    def gpu_instance_profile(self, handle: Handle, profile: int) -> GpuInstanceProfile: ...
    def gpu_instance_placements(self, handle: Handle, profile_id: int) -> tuple[Placement, ...]: ...
    def gpu_instances(self, handle: Handle, profile_id: int) -> tuple[GpuInstance, ...]: ...
    def mig_devices(self, handle: Handle) -> tuple[MigDevice, ...]: ...
    def nvlink_active(self, handle: Handle, link: int) -> bool: ...
    def nvlink_remote_bus_id(self, handle: Handle, link: int) -> str: ...


class PynvmlLibrary(PynvmlBase):
    """`NVMLLibrary` over `pynvml`; every `NVMLError` comes out as `NVMLCallError`."""

    def driver_version(self) -> str:
        return text(self._call("nvmlSystemGetDriverVersion"))

    def cuda_driver_version(self) -> int:
        return int(self._call("nvmlSystemGetCudaDriverVersion"))

    def name(self, handle: Handle) -> str:
        return text(self._call("nvmlDeviceGetName", handle))

    def minor_number(self, handle: Handle) -> int:
        return int(self._call("nvmlDeviceGetMinorNumber", handle))

    def architecture(self, handle: Handle) -> int:
        return int(self._call("nvmlDeviceGetArchitecture", handle))

    def cuda_compute_capability(self, handle: Handle) -> tuple[int, int]:
        major, minor = self._call("nvmlDeviceGetCudaComputeCapability", handle)
        return int(major), int(minor)

    def memory_total(self, handle: Handle) -> int:
        return int(self._call("nvmlDeviceGetMemoryInfo", handle).total)

    def pci_bus_id(self, handle: Handle) -> str:
        return text(self._call("nvmlDeviceGetPciInfo", handle).busId)

    def mig_mode(self, handle: Handle) -> tuple[int, int]:
        current, pending = self._call("nvmlDeviceGetMigMode", handle)
        return int(current), int(pending)

    def nvlink_active(self, handle: Handle, link: int) -> bool:
        return bool(self._call("nvmlDeviceGetNvLinkState", handle, link))

    def nvlink_remote_bus_id(self, handle: Handle, link: int) -> str:
        return text(self._call("nvmlDeviceGetNvLinkRemotePciInfo", handle, link).busId)


def open_library() -> PynvmlLibrary:
    """The real library, not yet initialised; BackendLoadError when `pynvml` is missing."""
    return PynvmlLibrary(import_pynvml())
