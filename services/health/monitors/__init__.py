"""Device monitors: the `DeviceMonitor` seam and `load()` that picks one by name.

A monitor reports the complete current view of the node's devices (`Observations`) to a
sink, once its device list is known and after every change. It never judges health: the
policy does (a monitor may be told which faults the policy ignores, so that an ignored one
never hides a real one). Monitors: `sim`, `nvml`, `ascend`. The agent runs the monitor under
`watchdog.Watchdog`; `fake.FakeMonitor` is the seam's test double.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol

from services.health.observation import Fault, Observations
from shared.bus.connection import Bus
from shared.errors import BackendLoadError
from shared.sim.profile import SimFault

if TYPE_CHECKING:
    from services.health.monitors.nvml_events import NVMLEvents

__all__ = ["AscendOptions", "DeviceMonitor", "NvmlOptions", "ObservationSink", "load"]

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
    if name == "sim":
        from services.health.monitors import sim

        return sim.SimMonitor(bus, driver=driver, node=node, faults=faults, refresh_s=refresh_s)
    if name == "ascend":
        from services.health.monitors import ascend as ascend_monitor

        options = ascend_options or AscendOptions()
        return ascend_monitor.AscendMonitor(
            pool=node,
            npu_smi=options.npu_smi,
            timeout_s=options.timeout_s,
            poll_s=options.poll_s,
            isolate_unknown=options.isolate_unknown,
        )
    if name == "nvml":
        from services.health.monitors import nvml, nvml_events

        return nvml.NvmlMonitor.open(
            nvml_library or nvml_events.open_library(),
            pool=node,
            options=nvml_options or NvmlOptions(),
            refresh_s=refresh_s,
            ignored=ignored,
            mig_partition=mig_partition,
        )
    raise BackendLoadError(f"monitor {name}: unknown monitor", backend=name)
