"""What every NVML seam shares: loading `pynvml`, the call wrapper that turns `NVMLError`
into `NVMLCallError`, and the device calls more than one agent makes (init, count, handles,
UUIDs, and the MIG profiles, placements, GPU instances and MIG devices of a GPU).

The discovery backend, the MIG partition manager and the health monitor each build their own
typed seam on top; the MIG types are `shared.vendors.nvidia.mig`'s. Every call blocks; callers
run them in a worker thread.
"""

from __future__ import annotations

import ctypes
import importlib
from typing import Any

from shared.errors import BackendLoadError
from shared.vendors.nvidia.mig import GpuInstance, GpuInstanceProfile, MigDevice, Placement

__all__ = [
    "ERROR_INVALID_ARGUMENT",
    "ERROR_NOT_FOUND",
    "ERROR_NOT_SUPPORTED",
    "GI_PROFILE_ENUM_COUNT",
    "Handle",
    "NVMLCallError",
    "PynvmlBase",
    "import_pynvml",
    "text",
]

ERROR_INVALID_ARGUMENT = 2
ERROR_NOT_SUPPORTED = 3
ERROR_NOT_FOUND = 6
_UNSUPPORTED = frozenset({ERROR_INVALID_ARGUMENT, ERROR_NOT_SUPPORTED, ERROR_NOT_FOUND})
GI_PROFILE_ENUM_COUNT = 0x12
"""`NVML_GPU_INSTANCE_PROFILE_COUNT`: GI profile enums are probed 0..COUNT-1."""
_MAX_INSTANCES = 32
"""Room for the instance lists NVML fills (a GPU holds at most 7 GIs, a GI at most 7 CIs)."""

Handle = object
"""An opaque device handle, only passed back to the library that made it."""


class NVMLCallError(Exception):
    """One NVML call failed; `code` is the NVML_ERROR_* value."""

    def __init__(self, call: str, *, code: int, message: str) -> None:
        super().__init__(f"{call}: {message} (NVML error {code})")
        self.call = call
        self.code = code

    @property
    def unsupported(self) -> bool:
        """The GPU or driver lacks this feature (not supported, invalid argument, not found)."""
        return self.code in _UNSUPPORTED


def text(value: Any) -> str:
    """NVML strings arrive as bytes from older bindings and as str from newer ones."""
    return value.decode() if isinstance(value, bytes) else str(value)


def import_pynvml() -> Any:
    """The `pynvml` module; BackendLoadError when the package is missing."""
    try:
        return importlib.import_module("pynvml")
    except ImportError as exc:
        raise BackendLoadError(
            f"NVML is not available: the nvidia-ml-py package is not installed ({exc})",
            backend="nvml",
        ) from exc


class PynvmlBase:
    """The calls both seams make, over `pynvml`; every `NVMLError` becomes `NVMLCallError`."""

    def __init__(self, module: Any) -> None:
        self._nvml = module

    def _call(self, function: str, *args: Any) -> Any:
        try:
            return getattr(self._nvml, function)(*args)
        except self._nvml.NVMLError as exc:
            raise NVMLCallError(function, code=int(exc.value), message=str(exc)) from exc

    def init(self) -> None:
        self._call("nvmlInit")

    def shutdown(self) -> None:
        self._call("nvmlShutdown")

    def device_count(self) -> int:
        return int(self._call("nvmlDeviceGetCount"))

    def handle_by_index(self, index: int) -> Handle:
        return self._call("nvmlDeviceGetHandleByIndex", index)

    def uuid(self, handle: Handle) -> str:
        return text(self._call("nvmlDeviceGetUUID", handle))

    def gpu_instance_placements(self, handle: Handle, profile_id: int) -> tuple[Placement, ...]:
        function = "nvmlDeviceGetGpuInstancePossiblePlacements"
        count = ctypes.c_uint(0)
        self._call(function, handle, profile_id, None, ctypes.byref(count))
        array = (self._nvml.c_nvmlGpuInstancePlacement_t * max(count.value, 1))()
        self._call(function, handle, profile_id, array, ctypes.byref(count))
        return tuple(Placement(int(p.start), int(p.size)) for p in array[: count.value])

    def gpu_instance_profile(self, handle: Handle, profile: int) -> GpuInstanceProfile:
        """The GI profile NVML knows by enum `profile` (0..GI_PROFILE_ENUM_COUNT-1)."""
        info = self._call("nvmlDeviceGetGpuInstanceProfileInfo", handle, profile)
        return GpuInstanceProfile(
            id=int(info.id),
            name=text(info.name),
            slice_count=int(info.sliceCount),
            instance_count=int(info.instanceCount),
            multiprocessors=int(info.multiprocessorCount),
            copy_engines=int(info.copyEngineCount),
            decoders=int(info.decoderCount),
            encoders=int(info.encoderCount),
            jpeg_engines=int(info.jpegCount),
            ofa_engines=int(info.ofaCount),
            memory_mib=int(info.memorySizeMB),
        )

    def _gpu_instance_info(self, instance: Any) -> GpuInstance:
        info = self._call("nvmlGpuInstanceGetInfo", instance)
        placement = Placement(int(info.placement.start), int(info.placement.size))
        return GpuInstance(id=int(info.id), profile_id=int(info.profileId), placement=placement)

    def gpu_instances(self, handle: Handle, profile_id: int) -> tuple[GpuInstance, ...]:
        """The GPU instances of GI profile `profile_id` that exist on the GPU."""
        array = (self._nvml.c_nvmlGpuInstance_t * _MAX_INSTANCES)()
        count = ctypes.c_uint(0)
        self._call("nvmlDeviceGetGpuInstances", handle, profile_id, array, ctypes.byref(count))
        return tuple(self._gpu_instance_info(array[i]) for i in range(count.value))

    def mig_devices(self, handle: Handle) -> tuple[MigDevice, ...]:
        """Every MIG device of the GPU (a compute instance in a GPU instance) and its UUID."""
        found: list[MigDevice] = []
        for index in range(int(self._call("nvmlDeviceGetMaxMigDeviceCount", handle))):
            try:
                mig = self._call("nvmlDeviceGetMigDeviceHandleByIndex", handle, index)
            except NVMLCallError as exc:
                if exc.code == ERROR_NOT_FOUND:
                    continue  # an empty slot
                raise
            found.append(
                MigDevice(
                    uuid=self.uuid(mig),
                    gpu_instance=int(self._call("nvmlDeviceGetGpuInstanceId", mig)),
                    compute_instance=int(self._call("nvmlDeviceGetComputeInstanceId", mig)),
                )
            )
        return tuple(found)
