"""Device monitors: `load()` makes the one the node's `--monitor` names.

The seam (`DeviceMonitor`, `MonitorRequest`) is `shared.vendors.parts.health`; each monitor is
its vendor package's, reached through `shared.vendors.registry`. The agent runs the monitor
under `watchdog.Watchdog`; `fake.FakeMonitor` is the seam's test double.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import TYPE_CHECKING

from shared.bus.connection import Bus
from shared.errors import BackendLoadError
from shared.sim.profile import SimFault
from shared.vendors import registry
from shared.vendors.parts.health import (
    AscendOptions,
    DeviceMonitor,
    MonitorRequest,
    NvmlOptions,
)
from shared.vendors.parts.observation import Fault

if TYPE_CHECKING:
    from shared.vendors.nvidia.nvml_events import NVMLEvents

__all__ = ["load"]


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
    vendor = registry.BACKENDS.get(name)
    if vendor is None:
        raise BackendLoadError(f"monitor {name}: unknown monitor", backend=name)
    return vendor.monitor(
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
