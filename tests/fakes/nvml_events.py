"""A fake of the health monitor's NVML seam (`shared/vendors/nvidia/nvml_events.py`).

GPUs are named by index; the test injects events (`xid`, `double_bit_ecc`, `event`), sets
counters (`FakeEventGpu` fields), loses a GPU (`lose`: its calls answer GPU_IS_LOST), makes
the event wait fail (`wait_error`), or wedges every call until `unwedge()` (a hung driver).
An event wait with nothing queued times out like NVML's (NVML_ERROR_TIMEOUT). MIG: a test
makes GPU instances (`add_gpu_instance`) and sends events carrying their GPU and compute
instance IDs (`xid(..., gpu_instance=...)`); looking up an instance that does not exist
answers NVML_ERROR_NOT_FOUND, as NVML does.
"""

from __future__ import annotations

import queue
import threading
from dataclasses import dataclass, field

from shared.vendors.nvidia.mig import GpuInstance, Placement
from shared.vendors.nvidia.nvml_events import (
    ERROR_GPU_IS_LOST,
    ERROR_NOT_FOUND,
    ERROR_NOT_SUPPORTED,
    ERROR_TIMEOUT,
    EVENT_DOUBLE_BIT_ECC,
    EVENT_GPU_UNAVAILABLE,
    EVENT_SINGLE_BIT_ECC,
    EVENT_XID,
    NO_INSTANCE,
    EventSet,
    Handle,
    NVMLCallError,
    NVMLEvent,
    RemappedRows,
)

__all__ = ["FakeEventGpu", "FakeNVMLEvents"]

_SUPPORTED = EVENT_XID | EVENT_DOUBLE_BIT_ECC | EVENT_SINGLE_BIT_ECC | EVENT_GPU_UNAVAILABLE


@dataclass(slots=True)
class FakeEventGpu:
    index: int
    uuid: str
    supported_events: int = _SUPPORTED
    double_bit_errors: int | None = 0
    """Volatile double-bit ECC count; None: not supported."""
    remapped_rows: RemappedRows | None = field(
        default_factory=lambda: RemappedRows(
            corrected=0, uncorrected=0, pending=False, failed=False
        )
    )
    """None: not supported (pre-Ampere)."""
    pages_pending: bool | None = None
    """None: not supported (Ampere and later retire pages by remapping rows)."""
    lost: bool = False
    gpu_instances: dict[int, GpuInstance] = field(default_factory=dict)
    """MIG GPU instances by GPU-instance ID."""


class _EventSet:
    def __init__(self) -> None:
        self.registered: dict[int, int] = {}
        self.freed = False


class FakeNVMLEvents:
    """An `NVMLEvents`; handles are the `FakeEventGpu` objects."""

    def __init__(self, count: int = 4) -> None:
        self.gpus = [
            FakeEventGpu(index=i, uuid=f"GPU-{i:08x}-1111-2222-3333-{0x4444 + i:012x}")
            for i in range(count)
        ]
        self.initialised = False
        self.init_error: NVMLCallError | None = None
        self.fail: dict[str, NVMLCallError] = {}
        """Call name -> the error it raises."""
        self.wait_error: NVMLCallError | None = None
        self.event_sets: list[_EventSet] = []
        self.waits = 0
        self._events: queue.Queue[NVMLEvent] = queue.Queue()
        self._wedge: threading.Event | None = None

    # --- what a test does ------------------------------------------------------------------

    def event(
        self,
        index: int,
        event_type: int,
        data: int = 0,
        *,
        gpu_instance: int = NO_INSTANCE,
        compute_instance: int | None = None,
    ) -> None:
        """Queue an event; `compute_instance` defaults to 0 inside a GPU instance."""
        uuid = None if self.gpus[index].lost else self.gpus[index].uuid
        if compute_instance is None:
            compute_instance = 0 if gpu_instance != NO_INSTANCE else NO_INSTANCE
        self._events.put(
            NVMLEvent(
                uuid=uuid,
                event_type=event_type,
                data=data,
                gpu_instance_id=gpu_instance,
                compute_instance_id=compute_instance,
            )
        )

    def xid(
        self,
        index: int,
        xid: int,
        *,
        gpu_instance: int = NO_INSTANCE,
        compute_instance: int | None = None,
    ) -> None:
        self.event(
            index, EVENT_XID, xid, gpu_instance=gpu_instance, compute_instance=compute_instance
        )

    def add_gpu_instance(
        self, index: int, gpu_instance: int, *, profile_id: int, start: int, size: int = 1
    ) -> None:
        """Make MIG GPU instance `gpu_instance` of profile `profile_id` at slice `start`."""
        self.gpus[index].gpu_instances[gpu_instance] = GpuInstance(
            id=gpu_instance, profile_id=profile_id, placement=Placement(start, size)
        )

    def remove_gpu_instance(self, index: int, gpu_instance: int) -> None:
        del self.gpus[index].gpu_instances[gpu_instance]

    def double_bit_ecc(self, index: int) -> None:
        self.event(index, EVENT_DOUBLE_BIT_ECC)

    def lose(self, index: int) -> None:
        """The GPU fell off the bus: its calls answer GPU_IS_LOST from now on."""
        self.gpus[index].lost = True

    def wedge(self) -> None:
        """Every call from now on blocks until `unwedge()`."""
        self._wedge = threading.Event()

    def unwedge(self) -> None:
        if self._wedge is not None:
            self._wedge.set()
        self._wedge = None

    # --- NVMLEvents ----------------------------------------------------------------------

    def _enter(self, call: str) -> None:
        wedge = self._wedge
        if wedge is not None:
            wedge.wait(timeout=10)
        if call in self.fail:
            raise self.fail[call]
        if not self.initialised:
            raise NVMLCallError(call, code=1, message="Uninitialized")

    def _gpu(self, handle: Handle, call: str) -> FakeEventGpu:
        self._enter(call)
        assert isinstance(handle, FakeEventGpu)
        if handle.lost:
            raise NVMLCallError(call, code=ERROR_GPU_IS_LOST, message="GPU is lost")
        return handle

    def init(self) -> None:
        if self.init_error is not None:
            raise self.init_error
        self.initialised = True

    def shutdown(self) -> None:
        self.initialised = False

    def device_count(self) -> int:
        self._enter("device_count")
        return len(self.gpus)

    def handle_by_index(self, index: int) -> Handle:
        self._enter("handle_by_index")
        return self.gpus[index]

    def uuid(self, handle: Handle) -> str:
        return self._gpu(handle, "uuid").uuid

    def event_set_create(self) -> EventSet:
        self._enter("event_set_create")
        event_set = _EventSet()
        self.event_sets.append(event_set)
        return event_set

    def supported_event_types(self, handle: Handle) -> int:
        return self._gpu(handle, "supported_event_types").supported_events

    def register_events(self, handle: Handle, event_types: int, event_set: EventSet) -> None:
        gpu = self._gpu(handle, "register_events")
        assert isinstance(event_set, _EventSet)
        event_set.registered[gpu.index] = event_types

    def event_set_wait(self, event_set: EventSet, timeout_ms: int) -> NVMLEvent:
        self._enter("event_set_wait")
        assert isinstance(event_set, _EventSet)
        assert not event_set.freed
        self.waits += 1
        if self.wait_error is not None:
            raise self.wait_error
        try:
            return self._events.get(timeout=timeout_ms / 1000)
        except queue.Empty:
            raise NVMLCallError("event_set_wait", code=ERROR_TIMEOUT, message="Timeout") from None

    def event_set_free(self, event_set: EventSet) -> None:
        assert isinstance(event_set, _EventSet)
        event_set.freed = True

    def gpu_instance_info(self, handle: Handle, gpu_instance_id: int) -> GpuInstance:
        gpu = self._gpu(handle, "gpu_instance_info")
        found = gpu.gpu_instances.get(gpu_instance_id)
        if found is None:
            raise NVMLCallError("gpu_instance_info", code=ERROR_NOT_FOUND, message="Not Found")
        return found

    def retired_pages_pending(self, handle: Handle) -> bool:
        gpu = self._gpu(handle, "retired_pages_pending")
        if gpu.pages_pending is None:
            raise NVMLCallError("retired_pages_pending", code=ERROR_NOT_SUPPORTED, message="x")
        return gpu.pages_pending

    def remapped_rows(self, handle: Handle) -> RemappedRows:
        gpu = self._gpu(handle, "remapped_rows")
        if gpu.remapped_rows is None:
            raise NVMLCallError("remapped_rows", code=ERROR_NOT_SUPPORTED, message="x")
        return gpu.remapped_rows

    def volatile_double_bit_errors(self, handle: Handle) -> int:
        gpu = self._gpu(handle, "volatile_double_bit_errors")
        if gpu.double_bit_errors is None:
            raise NVMLCallError("volatile_double_bit_errors", code=ERROR_NOT_SUPPORTED, message="x")
        return gpu.double_bit_errors
