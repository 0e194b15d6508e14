"""What every NVML seam shares: loading `pynvml`, the call wrapper that turns `NVMLError`
into `NVMLCallError`, and the device calls both agents make (init, count, handles, UUIDs).

The discovery backend and the health monitor each build their own typed seam on top.
Every call blocks; callers run them in a worker thread.
"""

from __future__ import annotations

import ctypes
import importlib
from dataclasses import dataclass
from typing import Any

from shared.errors import BackendLoadError

__all__ = [
    "ERROR_INVALID_ARGUMENT",
    "ERROR_NOT_FOUND",
    "ERROR_NOT_SUPPORTED",
    "Handle",
    "NVMLCallError",
    "Placement",
    "PynvmlBase",
    "import_pynvml",
    "text",
]

ERROR_INVALID_ARGUMENT = 2
ERROR_NOT_SUPPORTED = 3
ERROR_NOT_FOUND = 6
_UNSUPPORTED = frozenset({ERROR_INVALID_ARGUMENT, ERROR_NOT_SUPPORTED, ERROR_NOT_FOUND})

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


@dataclass(frozen=True, slots=True)
class Placement:
    """Where a GPU instance sits or may sit: memory slices `[start, start+size)` of the 8."""

    start: int
    size: int

    @property
    def end(self) -> int:
        return self.start + self.size

    def overlaps(self, other: Placement) -> bool:
        return self.start < other.end and other.start < self.end


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
