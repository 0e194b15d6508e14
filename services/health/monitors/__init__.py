"""Device monitors: the `DeviceMonitor` seam and `load()` that picks one by name.

A monitor reports the complete current view of the node's devices (`Observations`) to a
sink, once its device list is known and after every change. It never judges health: the
policy does (a monitor may be told which faults the policy ignores, so that an ignored one
never hides a real one). Monitors: `sim`, `nvml`, `ascend`. The agent runs the monitor under
`watchdog.Watchdog`; `fake.FakeMonitor` is the seam's test double. `nvml_faults` and
`npu_faults` turn vendor events and codes into faults.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol

from services.health.observation import Fault, Observations
from shared.bus.connection import Bus
from shared.errors import BackendLoadError
from shared.sim.profile import SimFault

if TYPE_CHECKING:
    from services.health.monitors.nvml_events import NVMLEvents

__all__ = [
    "FACTORIES",
    "AscendOptions",
    "DeviceMonitor",
    "MonitorRequest",
    "NvmlOptions",
    "ObservationSink",
    "load",
]

ObservationSink = Callable[[Observations], None]
"""Receives each new complete view; must not block (it only stores and wakes)."""


class DeviceMonitor(Protocol):
    """Watches a node's devices."""

    async def run(self, sink: ObservationSink) -> None:
        """Eternal: call `sink` with the full view whenever any device's observation changes."""
        ...


@dataclass(frozen=True, slots=True, kw_only=True)
class AscendOptions:
    npu_smi: str = "npu-smi"
    timeout_s: float = 10.0
    poll_s: float = 5.0
    isolate_unknown: bool = True


@dataclass(frozen=True, slots=True, kw_only=True)
class NvmlOptions:
    wait_ms: int = 5000
    """Timeout of one NVML event wait (NVIDIA's plugins use 5000 ms)."""
    counters_s: float = 30.0
    """Period of the ECC, row-remap and page-retirement counter reads."""
    call_timeout_s: float = 10.0
    """An NVML call stuck longer (beyond the wait itself) counts as a monitor failure."""


def _never(_: Fault) -> bool:
    return False


@dataclass(frozen=True, slots=True, kw_only=True)
class MonitorRequest:
    """What `load` was given, for the monitor factories."""

    bus: Bus
    driver: str
    node: str
    faults: Iterable[SimFault]
    refresh_s: float
    ascend_options: AscendOptions
    nvml_options: NvmlOptions
    nvml_library: NVMLEvents | None
    ignored: Callable[[Fault], bool]
    mig_partition: Callable[[str, int, int], str | None] | None


def load(
    name: str,
    *,
    bus: Bus,
    driver: str,
    node: str,
    faults: Iterable[SimFault] = (),
    refresh_s: float = 10.0,
    ascend_options: AscendOptions | None = None,
    nvml_options: NvmlOptions | None = None,
    nvml_library: NVMLEvents | None = None,
    ignored: Callable[[Fault], bool] = _never,
    mig_partition: Callable[[str, int, int], str | None] | None = None,
) -> DeviceMonitor:
    """The monitor called `name`; `faults` are the sim faults present from the start.

    `refresh_s`: how often an event-driven monitor re-reports an unchanged view. `ignored`:
    faults the policy ignores. `nvml_library` replaces the real NVML (tests pass a fake).
    `mig_partition`: the inventory's MIG partition of (GPU, GI profile ID, placement start),
    so that the nvml monitor gives a MIG instance's XID to that partition alone.
    """
    factory = FACTORIES.get(name)
    if factory is None:
        raise BackendLoadError(f"monitor {name}: unknown monitor", backend=name)
    return factory(
        MonitorRequest(
            bus=bus,
            driver=driver,
            node=node,
            faults=faults,
            refresh_s=refresh_s,
            ascend_options=ascend_options or AscendOptions(),
            nvml_options=nvml_options or NvmlOptions(),
            nvml_library=nvml_library,
            ignored=ignored,
            mig_partition=mig_partition,
        )
    )


def _sim(request: MonitorRequest) -> DeviceMonitor:
    from services.health.monitors import sim

    return sim.SimMonitor(
        request.bus,
        driver=request.driver,
        node=request.node,
        faults=request.faults,
        refresh_s=request.refresh_s,
    )


def _ascend(request: MonitorRequest) -> DeviceMonitor:
    from services.health.monitors import ascend as ascend_monitor

    options = request.ascend_options
    return ascend_monitor.AscendMonitor(
        pool=request.node,
        npu_smi=options.npu_smi,
        timeout_s=options.timeout_s,
        poll_s=options.poll_s,
        isolate_unknown=options.isolate_unknown,
    )


def _nvml(request: MonitorRequest) -> DeviceMonitor:
    from services.health.monitors import nvml, nvml_events

    return nvml.NvmlMonitor.open(
        request.nvml_library or nvml_events.open_library(),
        pool=request.node,
        options=request.nvml_options,
        refresh_s=request.refresh_s,
        ignored=request.ignored,
        mig_partition=request.mig_partition,
    )


FACTORIES: Mapping[str, Callable[[MonitorRequest], DeviceMonitor]] = {
    "sim": _sim,
    "nvml": _nvml,
    "ascend": _ascend,
}
"""The health monitor per `--monitor` name (`shared/vendors/registry.py` names them all)."""
