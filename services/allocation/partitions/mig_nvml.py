"""The NVML seam of the MIG partition manager: the MIG calls it makes, typed, and the real one.

Making a MIG device takes a GPU instance (GI) of a profile at a placement of memory slices,
then a compute instance (CI) inside it; the MIG device's UUID is read from its handle
(docs/hardware.md §1.1, 2.2). GIs and CIs are named by their ids on the parent GPU, never by NVML
handles, so the manager can record them and find them again after a restart.
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
    Handle,
    NVMLCallError,
    Placement,
    PynvmlBase,
    import_pynvml,
    text,
)

__all__ = [
    "CI_PROFILE_ENUM_COUNT",
    "CI_PROFILE_SHARED_ENUM",
    "ERROR_INSUFFICIENT_RESOURCES",
    "ERROR_IN_USE",
    "GI_PROFILE_ENUM_COUNT",
    "ComputeInstanceProfile",
    "GpuInstance",
    "GpuInstanceProfile",
    "MigLibrary",
    "Placement",
    "PynvmlMig",
    "open_library",
]

ERROR_IN_USE = 19
"""NVML_ERROR_IN_USE: the instance still runs processes."""
ERROR_INSUFFICIENT_RESOURCES = 23
"""NVML_ERROR_INSUFFICIENT_RESOURCES: the placement's slices, or all of the profile's
instances, are taken."""
GI_PROFILE_ENUM_COUNT = 0x12
"""`NVML_GPU_INSTANCE_PROFILE_COUNT`: GI profile enums are probed 0..COUNT-1."""
CI_PROFILE_ENUM_COUNT = 0x9
"""`NVML_COMPUTE_INSTANCE_PROFILE_COUNT`."""
CI_PROFILE_SHARED_ENUM = 0x7
"""`NVML_COMPUTE_INSTANCE_PROFILE_1_SLICE_REV1`: shares its slice with another CI; never used."""
_ENGINE_PROFILE_SHARED = 0
_MAX_INSTANCES = 32
"""Room for the instance lists NVML fills (a GPU holds at most 7 GIs, a GI at most 7 CIs)."""


@dataclass(frozen=True, slots=True, kw_only=True)
class GpuInstanceProfile:
    """`nvmlDeviceGetGpuInstanceProfileInfo` (v2), what the manager needs of it."""

    id: int
    """The GI profile id (19 = 1g, 0 = 7g, …), not the enum it was asked by."""
    name: str
    """As NVML reports it, e.g. `MIG 1g.10gb`."""
    slice_count: int
    instance_count: int


@dataclass(frozen=True, slots=True, kw_only=True)
class GpuInstance:
    """`nvmlGpuInstanceGetInfo` of one GI."""

    id: int
    profile_id: int
    placement: Placement


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

    def gpu_instance_profile(self, handle: Handle, enum: int) -> GpuInstanceProfile:
        info = self._call("nvmlDeviceGetGpuInstanceProfileInfo", handle, enum)
        return GpuInstanceProfile(
            id=int(info.id),
            name=text(info.name),
            slice_count=int(info.sliceCount),
            instance_count=int(info.instanceCount),
        )

    def _gpu_instance_info(self, instance: Any) -> GpuInstance:
        info = self._call("nvmlGpuInstanceGetInfo", instance)
        placement = Placement(int(info.placement.start), int(info.placement.size))
        return GpuInstance(id=int(info.id), profile_id=int(info.profileId), placement=placement)

    def gpu_instances(self, handle: Handle, profile_id: int) -> tuple[GpuInstance, ...]:
        array = (self._nvml.c_nvmlGpuInstance_t * _MAX_INSTANCES)()
        count = ctypes.c_uint(0)
        self._call("nvmlDeviceGetGpuInstances", handle, profile_id, array, ctypes.byref(count))
        return tuple(self._gpu_instance_info(array[i]) for i in range(count.value))

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
        for index in range(int(self._call("nvmlDeviceGetMaxMigDeviceCount", handle))):
            try:
                mig = self._call("nvmlDeviceGetMigDeviceHandleByIndex", handle, index)
            except NVMLCallError as exc:
                if exc.code == ERROR_NOT_FOUND:
                    continue  # an empty slot
                raise
            ids = (
                int(self._call("nvmlDeviceGetGpuInstanceId", mig)),
                int(self._call("nvmlDeviceGetComputeInstanceId", mig)),
            )
            if ids == (gpu_instance, compute_instance):
                return self.uuid(mig)
        raise NVMLCallError(
            "nvmlDeviceGetMigDeviceHandleByIndex",
            code=ERROR_NOT_FOUND,
            message=f"no MIG device for GPU instance {gpu_instance}, "
            f"compute instance {compute_instance}",
        )


def open_library() -> PynvmlMig:
    """The real library, not yet initialised; BackendLoadError when `pynvml` is missing."""
    return PynvmlMig(import_pynvml())
