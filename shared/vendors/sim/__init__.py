"""The sim backend: simulated devices from a profile, imitating both vendors' device shapes.

`discovery` publishes the profile's devices, `monitor` reports the profile's and `dractl
fault`'s injected faults, `partitions` makes MIG-like and vNPU-like partitions in a state
file, `cdi` hands the devices to containers as `/dev/null`. `VENDOR` bundles them.
"""

from __future__ import annotations

from shared.vendors.parts.discovery import BackendSeams, DeviceBackend, DiscoverySettings
from shared.vendors.parts.health import DeviceMonitor, MonitorRequest
from shared.vendors.parts.partitions import PartitionManager, PartitionSettings
from shared.vendors.parts.plugin_names import PluginNames
from shared.vendors.parts.vendor import Vendor
from shared.vendors.sim import cdi

__all__ = ["STATE_FILE", "VENDOR"]

STATE_FILE = "sim-partitions.json"
"""The partition manager's state file, in the plugin data dir."""


def _load_backend(settings: DiscoverySettings, _: BackendSeams) -> DeviceBackend:
    from shared.vendors.parts.sysfs import DEFAULT_ROOT, Sysfs
    from shared.vendors.sim.discovery import SimBackend

    # Sim devices are never real: a sim sysfs tree only (docs/vfio.md), never the host's /sys.
    sim_tree = str(settings.sysfs_root) not in ("", DEFAULT_ROOT)
    sysfs = Sysfs(settings.sysfs_root) if sim_tree else None
    return SimBackend.from_profile(settings.sim_profile, sysfs=sysfs)


def _monitor(request: MonitorRequest) -> DeviceMonitor:
    from shared.vendors.sim.monitor import SimMonitor

    return SimMonitor(
        request.bus,
        driver=request.driver,
        node=request.node,
        faults=request.faults,
        refresh_s=request.refresh_s,
    )


def _partitions(settings: PartitionSettings) -> PartitionManager:
    from shared.vendors.sim.partitions import SimPartitionManager

    return SimPartitionManager(settings.data_dir / STATE_FILE)


VENDOR = Vendor(
    name="sim",
    package="sim",
    summary="simulated devices from a profile",
    load_backend=_load_backend,
    monitor=_monitor,
    partitions=_partitions,
    edits=cdi.edits,
    edit_rules=cdi.RULES,
    # The sim's devices are offered under the driver's own names (`<driver>/<kind>`).
    plugin_names=PluginNames(),
)
