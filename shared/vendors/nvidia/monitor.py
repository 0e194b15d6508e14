"""The nvml monitor: NVIDIA GPUs watched through NVML events, plus periodic counters.

Each run registers every GPU for XID, ECC and "GPU unavailable" events (what it supports)
and waits for events in a worker thread (`wait_ms` per wait; a timeout is no fault). Every
`counters_s` it reads the double-bit ECC, row-remap and page-retirement counters. Faults from
events last until the agent restarts (NVML never reports a recovery; restarting the agent
after a GPU reset clears them, as with NVIDIA's plugins); counter faults follow the counters.
`ignored` (the policy's ignore list) keeps application XIDs from masking a real fault.

A GPU whose events cannot be registered is reported unknown (unmonitored). A wait that fails
with GPU_IS_LOST, or an event whose GPU cannot be named, marks every GPU `gpu-lost`; any
other failure, or a call stuck longer than `call_timeout_s`, raises BackendUnavailableError
so the watchdog marks the GPUs unmonitored and restarts the monitor. Device names are
`gpu-<index>`, as the discovery agent's nvml backend names them.

MIG: an XID event that names a GPU instance (`gpuInstanceId` other than 0xFFFFFFFF) is the
fault of that instance alone. NVML gives the instance's profile and placement, and
`mig_partition` (the inventory's topology) the partition device published there, which then
carries the fault. An instance NVML cannot describe (it is gone, MIG is off, no permission) or
one the inventory does not publish falls back to the GPU, like every other fault; the policy's
partition attribution spreads a GPU's faults to all its partitions. The lookup into the
inventory happens at every report, so a partition published later gets its fault then.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from functools import partial
from typing import TypeVar

import structlog

from shared.errors import BackendLoadError, BackendUnavailableError
from shared.vendors.nvidia import mig, naming, nvml_faults
from shared.vendors.nvidia.nvml_events import (
    ERROR_GPU_IS_LOST,
    ERROR_TIMEOUT,
    EVENT_XID,
    NO_INSTANCE,
    WANTED_EVENTS,
    EventSet,
    Handle,
    NVMLCallError,
    NVMLEvent,
    NVMLEvents,
)
from shared.vendors.parts.blocking import BlockingCaller
from shared.vendors.parts.health import NvmlOptions, ObservationSink
from shared.vendors.parts.observation import Fault, Observation, Observations

__all__ = ["NvmlMonitor", "device_name"]

log = structlog.get_logger(__name__)
T = TypeVar("T")
K = TypeVar("K", str, tuple[str, int, int])
_UNMONITORED = "unmonitored"


def device_name(index: int) -> str:
    """The discovery nvml backend's name of GPU `index` (`shared.vendors.nvidia.naming`)."""
    return naming.gpu_name(index)


def _never(_: Fault) -> bool:
    return False


def _no_partition(gpu: str, profile_id: int, placement_start: int) -> str | None:
    return None


MigPartition = Callable[[str, int, int], str | None]
"""(GPU, GI profile ID, placement start) -> the name of the partition device there, if any."""
GpuInstance = tuple[str, int, int]
"""A MIG GPU instance as (GPU name, GI profile ID, placement start)."""


@dataclass(slots=True)
class _Session:
    """One run's view of NVML: the GPUs and the event set they are registered with."""

    handles: dict[str, Handle] = field(default_factory=dict)
    by_uuid: dict[str, str] = field(default_factory=dict)
    unregistered: dict[str, str] = field(default_factory=dict)
    """GPUs whose events could not be registered, with the reason."""
    event_set: EventSet | None = None


class NvmlMonitor:
    """`DeviceMonitor` over an initialised `NVMLEvents` library."""

    def __init__(
        self,
        library: NVMLEvents,
        *,
        pool: str,
        wait_ms: int = 5000,
        counters_s: float = 30.0,
        refresh_s: float = 10.0,
        call_timeout_s: float = 10.0,
        ignored: Callable[[Fault], bool] = _never,
        mig_partition: MigPartition | None = None,
    ) -> None:
        """`mig_partition`: see the module doc; None: every fault is its GPU's."""
        self.library = library
        self._mig_partition = mig_partition or _no_partition
        self._pool = pool
        self._wait_ms = wait_ms
        self._counters_s = counters_s
        self._refresh_s = refresh_s
        self._call_timeout_s = call_timeout_s
        self._ignored = ignored
        self._caller = BlockingCaller(backend="nvml")
        # Both outlive a run, so a restart by the watchdog forgets no fault.
        self._event_faults: dict[str, Fault] = {}
        self._instance_faults: dict[GpuInstance, Fault] = {}
        self._counter_faults: dict[str, Fault | None] = {}
        self.waits = 0
        """Event waits that returned (with an event or a timeout)."""

    @classmethod
    def open(
        cls,
        library: NVMLEvents,
        *,
        pool: str,
        options: NvmlOptions,
        refresh_s: float,
        ignored: Callable[[Fault], bool] = _never,
        mig_partition: MigPartition | None = None,
    ) -> NvmlMonitor:
        """Initialise NVML; BackendLoadError when there is no driver or library."""
        try:
            library.init()
        except NVMLCallError as exc:
            raise BackendLoadError(f"NVML is not available: {exc}", backend="nvml") from exc
        return cls(
            library,
            pool=pool,
            wait_ms=options.wait_ms,
            counters_s=options.counters_s,
            refresh_s=refresh_s,
            call_timeout_s=options.call_timeout_s,
            ignored=ignored,
            mig_partition=mig_partition,
        )

    async def _call(self, function: Callable[[], T], *, what: str, extra_s: float = 0.0) -> T:
        """`function()` in a worker thread; NVML errors other than the two the caller handles
        (timeout, GPU lost) become BackendUnavailableError."""
        try:
            return await self._caller.call(
                function, what=what, timeout_s=self._call_timeout_s + extra_s
            )
        except NVMLCallError as exc:
            if exc.code in (ERROR_TIMEOUT, ERROR_GPU_IS_LOST):
                raise
            raise BackendUnavailableError(f"NVML: {exc}", backend="nvml") from exc

    async def run(self, sink: ObservationSink) -> None:
        session = await self._call(self._open_session, what="event registration")
        try:
            await self._watch(session, sink)
        finally:
            if session.event_set is not None:
                self._caller.after_current(partial(self._free, session.event_set))

    def _open_session(self) -> _Session:
        session = _Session()
        for index in range(self.library.device_count()):
            handle = self.library.handle_by_index(index)
            name = device_name(index)
            session.handles[name] = handle
            session.by_uuid[self.library.uuid(handle)] = name
        session.event_set = self.library.event_set_create()
        for name, handle in session.handles.items():
            try:
                wanted = WANTED_EVENTS & self.library.supported_event_types(handle)
                self.library.register_events(handle, wanted, session.event_set)
            except NVMLCallError as exc:
                session.unregistered[name] = f"NVML event registration failed: {exc}"
                log.warning("nvml_events_unregistered", device=name, error=str(exc))
        log.info("nvml_events_registered", gpus=len(session.handles))
        return session

    def _free(self, event_set: EventSet) -> None:
        try:
            self.library.event_set_free(event_set)
        except NVMLCallError as exc:
            log.warning("nvml_event_set_free_failed", error=str(exc))

    def view(self, session: _Session) -> Observations:
        on_gpu, on_partition = self._instance_view()
        devices = []
        for name in session.handles:
            fault = nvml_faults.worst(
                self._event_faults.get(name), self._counter_faults.get(name), *on_gpu.get(name, ())
            )
            if fault is None and name in session.unregistered:
                reason = Fault(cause=_UNMONITORED, message=session.unregistered[name])
                devices.append(Observation(device=name, unknown=True, fault=reason))
            else:
                devices.append(Observation(device=name, fault=fault))
        devices += (Observation(device=d, fault=f) for d, f in sorted(on_partition.items()))
        return Observations(pool=self._pool, devices=tuple(devices))

    def _instance_view(self) -> tuple[dict[str, list[Fault]], dict[str, Fault]]:
        """MIG instances' faults: those left on their GPU (no partition is published for the
        instance), and the worst per partition device."""
        on_gpu: dict[str, list[Fault]] = {}
        on_partition: dict[str, Fault] = {}
        for (gpu, profile_id, start), fault in self._instance_faults.items():
            partition = self._mig_partition(gpu, profile_id, start)
            if partition is None:
                on_gpu.setdefault(gpu, []).append(fault)
            elif (worst := nvml_faults.worst(on_partition.get(partition), fault)) is not None:
                on_partition[partition] = worst
        return on_gpu, on_partition

    async def _watch(self, session: _Session, sink: ObservationSink) -> None:
        counters_due = 0.0
        reported: tuple[Observations | None, float] = (None, float("-inf"))
        while True:
            now = time.monotonic()
            if now >= counters_due:
                await self._read_counters(session)
                counters_due = now + self._counters_s
            view = self.view(session)
            if view != reported[0] or now - reported[1] >= self._refresh_s:
                sink(view)
                reported = (view, now)
            await self._wait(session)

    async def _wait(self, session: _Session) -> None:
        """One event wait: an event is recorded; a timeout is nothing."""
        event_set = session.event_set
        if event_set is None or len(session.unregistered) == len(session.handles):
            await asyncio.sleep(self._wait_ms / 1000)  # nothing to wait on: counters only
            return
        wait = partial(self.library.event_set_wait, event_set, self._wait_ms)
        try:
            event = await self._call(wait, what="event wait", extra_s=self._wait_ms / 1000)
        except NVMLCallError as exc:
            self.waits += 1
            if exc.code == ERROR_GPU_IS_LOST:  # NVML cannot say which GPU: all are suspect
                self._all_lost(session, f"event wait: {exc}")
                await asyncio.sleep(self._wait_ms / 1000)  # the next wait would fail at once
            return
        self.waits += 1
        await self._on_event(event, session)

    async def _on_event(self, event: NVMLEvent, session: _Session) -> None:
        name = session.by_uuid.get(event.uuid) if event.uuid is not None else None
        if name is None:
            if event.uuid is None:  # as NVIDIA's driver does: every GPU is suspect then
                self._all_lost(session, f"event {event.event_type:#x} from a GPU NVML cannot name")
            else:
                log.warning("nvml_event_unknown_gpu", uuid=event.uuid, event_type=event.event_type)
            return
        fault = nvml_faults.event_fault(event)
        if fault is None:
            return
        info = await self._gpu_instance(event, name, session)
        if info is None:
            self._raise(self._event_faults, name, fault)
        else:
            self._raise(self._instance_faults, (name, info.profile_id, info.placement.start), fault)

    async def _gpu_instance(
        self, event: NVMLEvent, name: str, session: _Session
    ) -> mig.GpuInstance | None:
        """The MIG instance an XID event names; None: the event is the whole GPU's."""
        if event.gpu_instance_id == NO_INSTANCE or not event.event_type & EVENT_XID:
            return None
        lookup = partial(
            self.library.gpu_instance_info, session.handles[name], event.gpu_instance_id
        )
        try:
            return await self._caller.call(
                lookup, what="GPU instance lookup", timeout_s=self._call_timeout_s
            )
        except NVMLCallError as exc:  # gone already, MIG off, no permission: the GPU's fault
            log.warning(
                "nvml_gpu_instance_unknown",
                device=name,
                gpu_instance=event.gpu_instance_id,
                error=str(exc),
            )
            return None

    def _all_lost(self, session: _Session, message: str) -> None:
        for name in session.handles:
            self._raise(self._event_faults, name, nvml_faults.lost(message))

    def _raise(self, faults: dict[K, Fault], key: K, fault: Fault) -> None:
        """Keep `fault` for `key` (a GPU or a GPU instance) unless a worse one is kept."""
        if self._ignored(fault):
            log.info("nvml_fault_ignored", device=key, cause=fault.cause, code=fault.code)
            return
        if nvml_faults.severity(fault) > nvml_faults.severity(faults.get(key)):
            faults[key] = fault
            log.warning("nvml_fault_seen", device=key, cause=fault.cause, code=fault.code)

    async def _read_counters(self, session: _Session) -> None:
        read = partial(self._counters, dict(session.handles))
        found = await self._call(read, what="counter read")
        for name, fault in found.items():
            if fault is not None and fault.cause == nvml_faults.GPU_LOST:
                self._raise(self._event_faults, name, fault)
            else:
                self._counter_faults[name] = None if fault and self._ignored(fault) else fault

    def _counters(self, handles: dict[str, Handle]) -> dict[str, Fault | None]:
        """Per GPU, the fault its counters show (blocking)."""
        found: dict[str, Fault | None] = {}
        for name, handle in handles.items():
            try:
                found[name] = nvml_faults.counter_fault(
                    double_bit=_optional(partial(self.library.volatile_double_bit_errors, handle)),
                    rows=_optional(partial(self.library.remapped_rows, handle)),
                    pages_pending=_optional(partial(self.library.retired_pages_pending, handle)),
                )
            except NVMLCallError as exc:
                if exc.code != ERROR_GPU_IS_LOST:
                    raise
                found[name] = nvml_faults.lost(f"counter read: {exc}")
        return found


def _optional(call: Callable[[], T]) -> T | None:
    """The call's result, or None when the GPU lacks the feature."""
    try:
        return call()
    except NVMLCallError as exc:
        if exc.unsupported:
            return None
        raise
