"""The NVML seam of the MIG partition manager: the MIG calls it makes, typed, and the real one.

Making a MIG device takes a GPU instance (GI) of a profile at a placement of memory slices,
then a compute instance (CI) inside it; the MIG device's UUID is read from its handle
(docs/hardware.md §1.1, 2.2). GIs and CIs are named by their ids on the parent GPU, never by NVML
handles, so the manager can record them and find them again after a restart. The profile,
placement and instance types are `shared.vendors.nvidia.mig`'s, as discovery reads them; the
calls discovery makes too (profiles, placements, GPU instances, MIG devices) are `shared.nvml`'s.
`PynvmlMig` imports `pynvml` only when opened (`open_library`); a failed call raises
`NVMLCallError`. Every call blocks: callers run them in a worker thread. The test double is
`tests/fakes/nvml_mig.py`.
"""

from __future__ import annotations

import ctypes
from dataclasses import dataclass
from typing import Any, Protocol

from shared.nvml import (
    ERROR_NOT_FOUND,
    GI_PROFILE_ENUM_COUNT,
    Handle,
    NVMLCallError,
    PynvmlBase,
    import_pynvml,
)
from shared.vendors.nvidia.mig import GpuInstance, GpuInstanceProfile, Placement

__all__ = [
    "CI_PROFILE_ENUM_COUNT",
    "CI_PROFILE_SHARED_ENUM",
    "ERROR_INSUFFICIENT_RESOURCES",
    "ERROR_IN_USE",
    "GI_PROFILE_ENUM_COUNT",
    "ComputeInstanceProfile",
    "MigLibrary",
    "PynvmlMig",
    "open_library",
]

ERROR_IN_USE = 19
"""NVML_ERROR_IN_USE: the instance still runs processes."""
ERROR_INSUFFICIENT_RESOURCES = 23
"""NVML_ERROR_INSUFFICIENT_RESOURCES: the placement's slices, or all of the profile's
instances, are taken."""
CI_PROFILE_ENUM_COUNT = 0x9
"""`NVML_COMPUTE_INSTANCE_PROFILE_COUNT`."""
CI_PROFILE_SHARED_ENUM = 0x7
"""`NVML_COMPUTE_INSTANCE_PROFILE_1_SLICE_REV1`: shares its slice with another CI; never used."""
_ENGINE_PROFILE_SHARED = 0
_MAX_INSTANCES = 32
"""Room for the compute-instance lists NVML fills (a GI holds at most 7 CIs)."""


@dataclass(frozen=True, slots=True, kw_only=True)
class ComputeInstanceProfile:
    """`nvmlGpuInstanceGetComputeInstanceProfileInfo` (v2), what the manager needs of it."""

    id: int
    slice_count: int


class MigLibrary(Protocol):
    """The NVML calls the MIG partition manager makes (blocking)."""

    def init(self) -> None: ...
    def handle_by_uuid(self, uuid: str) -> Handle: ...
    def minor_number(self, handle: Handle) -> int: ...
    def mig_mode(self, handle: Handle) -> tuple[int, int]: ...
    def gpu_instance_profile(self, handle: Handle, enum: int) -> GpuInstanceProfile: ...
    def gpu_instance_placements(self, handle: Handle, profile_id: int) -> tuple[Placement, ...]: ...
    def gpu_instances(self, handle: Handle, profile_id: int) -> tuple[GpuInstance, ...]: ...
    def create_gpu_instance(
        self, handle: Handle, profile_id: int, placement: Placement
    ) -> GpuInstance: ...
    def destroy_gpu_instance(self, handle: Handle, gpu_instance: int) -> None: ...
    def compute_instance_profile(
        self, handle: Handle, gpu_instance: int, enum: int
    ) -> ComputeInstanceProfile: ...
    def compute_instances(
        self, handle: Handle, gpu_instance: int, profile_id: int
    ) -> tuple[int, ...]: ...
    def create_compute_instance(
        self, handle: Handle, gpu_instance: int, profile_id: int
    ) -> int: ...
    def destroy_compute_instance(
        self, handle: Handle, gpu_instance: int, compute_instance: int
    ) -> None: ...
    def mig_device_uuid(self, handle: Handle, gpu_instance: int, compute_instance: int) -> str: ...


class PynvmlMig(PynvmlBase):
    """`MigLibrary` over `pynvml`; every `NVMLError` comes out as `NVMLCallError`."""

    def handle_by_uuid(self, uuid: str) -> Handle:
        return self._call("nvmlDeviceGetHandleByUUID", uuid)

    def minor_number(self, handle: Handle) -> int:
        return int(self._call("nvmlDeviceGetMinorNumber", handle))

    def mig_mode(self, handle: Handle) -> tuple[int, int]:
        current, pending = self._call("nvmlDeviceGetMigMode", handle)
        return int(current), int(pending)

    def create_gpu_instance(
        self, handle: Handle, profile_id: int, placement: Placement
    ) -> GpuInstance:
        where = self._nvml.c_nvmlGpuInstancePlacement_t(placement.start, placement.size)
        instance = self._call(
            "nvmlDeviceCreateGpuInstanceWithPlacement", handle, profile_id, ctypes.byref(where)
        )
        return self._gpu_instance_info(instance)

    def _gpu_instance(self, handle: Handle, gpu_instance: int) -> Any:
        return self._call("nvmlDeviceGetGpuInstanceById", handle, gpu_instance)

    def destroy_gpu_instance(self, handle: Handle, gpu_instance: int) -> None:
        self._call("nvmlGpuInstanceDestroy", self._gpu_instance(handle, gpu_instance))

    def compute_instance_profile(
        self, handle: Handle, gpu_instance: int, enum: int
    ) -> ComputeInstanceProfile:
        info = self._call(
            "nvmlGpuInstanceGetComputeInstanceProfileInfo",
            self._gpu_instance(handle, gpu_instance),
            enum,
            _ENGINE_PROFILE_SHARED,
        )
        return ComputeInstanceProfile(id=int(info.id), slice_count=int(info.sliceCount))

    def compute_instances(
        self, handle: Handle, gpu_instance: int, profile_id: int
    ) -> tuple[int, ...]:
        instance = self._gpu_instance(handle, gpu_instance)
        array = (self._nvml.c_nvmlComputeInstance_t * _MAX_INSTANCES)()
        count = ctypes.c_uint(0)
        self._call(
            "nvmlGpuInstanceGetComputeInstances", instance, profile_id, array, ctypes.byref(count)
        )
        return tuple(
            int(self._call("nvmlComputeInstanceGetInfo", array[i]).id) for i in range(count.value)
        )

    def create_compute_instance(self, handle: Handle, gpu_instance: int, profile_id: int) -> int:
        instance = self._gpu_instance(handle, gpu_instance)
        created = self._call("nvmlGpuInstanceCreateComputeInstance", instance, profile_id)
        return int(self._call("nvmlComputeInstanceGetInfo", created).id)

    def destroy_compute_instance(
        self, handle: Handle, gpu_instance: int, compute_instance: int
    ) -> None:
        instance = self._gpu_instance(handle, gpu_instance)
        created = self._call("nvmlGpuInstanceGetComputeInstanceById", instance, compute_instance)
        self._call("nvmlComputeInstanceDestroy", created)

    def mig_device_uuid(self, handle: Handle, gpu_instance: int, compute_instance: int) -> str:
        for mig in self.mig_devices(handle):
            if (mig.gpu_instance, mig.compute_instance) == (gpu_instance, compute_instance):
                return mig.uuid
        raise NVMLCallError(
            "nvmlDeviceGetMigDeviceHandleByIndex",
            code=ERROR_NOT_FOUND,
            message=f"no MIG device for GPU instance {gpu_instance}, "
            f"compute instance {compute_instance}",
        )


def open_library() -> PynvmlMig:
    """The real library, not yet initialised; BackendLoadError when `pynvml` is missing."""
    return PynvmlMig(import_pynvml())
