"""The health agent's device monitor seam and what a monitor factory is given.

A monitor reports the complete current view of the node's devices (`Observations`) to a
sink, once its device list is known and after every change. It never judges health: the
policy does (a monitor may be told which faults the policy ignores, so that an ignored one
never hides a real one).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol

from shared.vendors.parts.observation import Fault, Observations

if TYPE_CHECKING:
    from shared.bus.connection import Bus
    from shared.sim.profile import SimFault
    from shared.vendors.nvidia.nvml_events import NVMLEvents

__all__ = [
    "AscendOptions",
    "DeviceMonitor",
    "MonitorFactory",
    "MonitorRequest",
    "NvmlOptions",
    "ObservationSink",
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


@dataclass(frozen=True, slots=True, kw_only=True)
class MonitorRequest:
    """What the health agent gives a vendor's monitor factory."""

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


MonitorFactory = Callable[[MonitorRequest], DeviceMonitor]
"""Makes a vendor's monitor; BackendLoadError when it cannot be used."""
