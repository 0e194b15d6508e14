"""The NVML seam of the health monitor: the calls it makes, as a typed Protocol, and the real one.

Events (docs/hardware.md §2.4): an event set, each GPU registered for XID critical errors and ECC
errors (ANDed with what it supports), then `nvmlEventSetWait_v2` with a timeout. Counters:
pending page retirements, row remapping, volatile double-bit ECC. MIG: an event's GPU
instance ID (docs/hardware.md §2.2) resolved to its profile and placement (a
`shared.vendors.nvidia.mig.GpuInstance`). `PynvmlEvents` imports
`pynvml` (PyPI `nvidia-ml-py`) only when opened; `open_library()` turns a missing package into
`BackendLoadError("NVML is not available: …")`. Every call blocks; a failed one raises
`NVMLCallError`. The test double is `tests/fakes/nvml_events.py`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

from shared.nvml import (
    ERROR_INVALID_ARGUMENT,
    ERROR_NOT_FOUND,
    ERROR_NOT_SUPPORTED,
    Handle,
    NVMLCallError,
    PynvmlBase,
    import_pynvml,
)
from shared.vendors.nvidia.mig import GpuInstance

__all__ = [
    "ERROR_GPU_IS_LOST",
    "ERROR_INVALID_ARGUMENT",
    "ERROR_NOT_FOUND",
    "ERROR_NOT_SUPPORTED",
    "ERROR_TIMEOUT",
    "EVENT_DOUBLE_BIT_ECC",
    "EVENT_GPU_UNAVAILABLE",
    "EVENT_SINGLE_BIT_ECC",
    "EVENT_XID",
    "NO_INSTANCE",
    "WANTED_EVENTS",
    "EventSet",
    "Handle",
    "NVMLCallError",
    "NVMLEvent",
    "NVMLEvents",
    "PynvmlEvents",
    "RemappedRows",
    "open_library",
]

ERROR_TIMEOUT = 10
"""`nvmlEventSetWait_v2` saw no event within its timeout."""
ERROR_GPU_IS_LOST = 15

EVENT_SINGLE_BIT_ECC = 0x1
EVENT_DOUBLE_BIT_ECC = 0x2
EVENT_XID = 0x8
EVENT_GPU_UNAVAILABLE = 0x4000
WANTED_EVENTS = EVENT_XID | EVENT_DOUBLE_BIT_ECC | EVENT_SINGLE_BIT_ECC | EVENT_GPU_UNAVAILABLE
"""What NVIDIA's plugins register (XID, DBE, SBE), plus "GPU unavailable" where supported."""
NO_INSTANCE = 0xFFFFFFFF
"""`gpuInstanceId` / `computeInstanceId` of an event not tied to a MIG instance."""
_MEMORY_ERROR_UNCORRECTED = 1  # NVML_MEMORY_ERROR_TYPE_UNCORRECTED: double-bit
_VOLATILE_ECC = 0  # NVML_VOLATILE_ECC: since the last driver load or GPU reset

EventSet = object
"""An opaque event set, only passed back to the library that made it."""


@dataclass(frozen=True, slots=True, kw_only=True)
class NVMLEvent:
    """One `nvmlEventData_t`, its device resolved to a UUID (None when that failed)."""

    uuid: str | None
    event_type: int
    data: int
    """The XID number for XID events."""
    gpu_instance_id: int = NO_INSTANCE
    compute_instance_id: int = NO_INSTANCE


@dataclass(frozen=True, slots=True, kw_only=True)
class RemappedRows:
    """`nvmlDeviceGetRemappedRows` (Ampere and later)."""

    corrected: int
    uncorrected: int
    pending: bool
    """A remap waits for a GPU reset."""
    failed: bool
    """A remap failed: the GPU needs service."""


class NVMLEvents(Protocol):
    """The NVML calls the health monitor makes (blocking)."""

    def init(self) -> None: ...
    def shutdown(self) -> None: ...
    def device_count(self) -> int: ...
    def handle_by_index(self, index: int) -> Handle: ...
    def uuid(self, handle: Handle) -> str: ...
    def event_set_create(self) -> EventSet: ...
    def supported_event_types(self, handle: Handle) -> int: ...
    def register_events(self, handle: Handle, event_types: int, event_set: EventSet) -> None: ...
    def event_set_wait(self, event_set: EventSet, timeout_ms: int) -> NVMLEvent: ...
    def event_set_free(self, event_set: EventSet) -> None: ...
    def gpu_instance_info(self, handle: Handle, gpu_instance_id: int) -> GpuInstance: ...
    def retired_pages_pending(self, handle: Handle) -> bool: ...
    def remapped_rows(self, handle: Handle) -> RemappedRows: ...
    def volatile_double_bit_errors(self, handle: Handle) -> int: ...


class PynvmlEvents(PynvmlBase):
    """`NVMLEvents` over `pynvml`; every `NVMLError` comes out as `NVMLCallError`."""

    def event_set_create(self) -> EventSet:
        return self._call("nvmlEventSetCreate")

    def supported_event_types(self, handle: Handle) -> int:
        return int(self._call("nvmlDeviceGetSupportedEventTypes", handle))

    def register_events(self, handle: Handle, event_types: int, event_set: EventSet) -> None:
        self._call("nvmlDeviceRegisterEvents", handle, event_types, event_set)

    def event_set_wait(self, event_set: EventSet, timeout_ms: int) -> NVMLEvent:
        data = self._call("nvmlEventSetWait_v2", event_set, timeout_ms)
        try:
            uuid: str | None = self.uuid(data.device)
        except NVMLCallError:
            uuid = None  # a lost GPU cannot be named any more; the monitor decides what then
        return NVMLEvent(
            uuid=uuid,
            event_type=int(data.eventType),
            data=int(data.eventData),
            gpu_instance_id=int(data.gpuInstanceId),
            compute_instance_id=int(data.computeInstanceId),
        )

    def event_set_free(self, event_set: EventSet) -> None:
        self._call("nvmlEventSetFree", event_set)

    def gpu_instance_info(self, handle: Handle, gpu_instance_id: int) -> GpuInstance:
        instance = self._call("nvmlDeviceGetGpuInstanceById", handle, gpu_instance_id)
        return self._gpu_instance_info(instance)

    def retired_pages_pending(self, handle: Handle) -> bool:
        return bool(self._call("nvmlDeviceGetRetiredPagesPendingStatus", handle))

    def remapped_rows(self, handle: Handle) -> RemappedRows:
        corrected, uncorrected, pending, failed = self._call("nvmlDeviceGetRemappedRows", handle)
        return RemappedRows(
            corrected=int(corrected),
            uncorrected=int(uncorrected),
            pending=bool(pending),
            failed=bool(failed),
        )

    def volatile_double_bit_errors(self, handle: Handle) -> int:
        function = "nvmlDeviceGetTotalEccErrors"
        return int(self._call(function, handle, _MEMORY_ERROR_UNCORRECTED, _VOLATILE_ECC))


def open_library() -> PynvmlEvents:
    """The real library, not yet initialised; BackendLoadError when `pynvml` is missing."""
    return PynvmlEvents(import_pynvml())
