"""NVIDIA GPUs and MIG devices through NVML (the `nvml` backend): every agent's part.

The device model (pure): `mig` (GPU-instance profiles, placements, the instances and MIG
devices NVML reports, the H100-80GB profile table the sim imitates) and `naming` (the names
discovery gives GPUs and MIG devices, which the partition manager, the CDI edits and the health
monitor read back; MIG UUIDs; the numbering of the MIG capability device nodes).

The agents' parts: `discovery` (with `mig_devices` and the NVML seam `nvml_api`), `monitor`
(with `nvml_events` and `nvml_faults`), `partitions` (MIG devices made at prepare, with
`mig_nvml` and `caps`), `cdi` and `plugin_names`. `VENDOR` bundles them; NVML is imported only
when a factory opens it.
"""

from __future__ import annotations

from types import MappingProxyType

from shared.vendors.nvidia import cdi, plugin_names
from shared.vendors.parts.discovery import BackendSeams, DeviceBackend, DiscoverySettings
from shared.vendors.parts.faults import FaultDefaults
from shared.vendors.parts.health import DeviceMonitor, MonitorRequest
from shared.vendors.parts.partitions import PartitionManager, PartitionSettings
from shared.vendors.parts.vendor import Vendor

__all__ = ["APPLICATION_XIDS", "FAULTS", "STATE_FILE", "VENDOR"]

APPLICATION_XIDS = ("13", "31", "43", "45", "68", "109")
"""XIDs an application's own error raises (docs/hardware.md §2.5): no fault of the GPU."""
FAULTS = FaultDefaults(
    # The XID catalog: contained ECC (restart the app), high single-bit ECC rate, row
    # remapping recorded (pending a reset) pass; every other XID is fatal.
    codes=MappingProxyType({("xid", "94"): "transient", ("xid", "92"): "transient",
                            ("xid", "63"): "transient"}),
    ignore=MappingProxyType({"xid": frozenset(APPLICATION_XIDS)}),
)  # fmt: skip

STATE_FILE = "mig-partitions.json"
"""The MIG devices the partition manager made, in the plugin data dir."""


def _load_backend(settings: DiscoverySettings, seams: BackendSeams) -> DeviceBackend:
    from shared.vendors.nvidia import discovery, nvml_api
    from shared.vendors.parts.sysfs import Sysfs

    options = discovery.NvmlOptions(
        mig_profiles=settings.mig_profiles,
        pci_bus_id=settings.publish_pci_bus_id,
        timeout_s=settings.backend_timeout_s,
        poll_s=settings.backend_poll_s,
    )
    library = seams.nvml or nvml_api.open_library()
    return discovery.NvmlBackend.open(library, options=options, sysfs=Sysfs(settings.sysfs_root))


def _monitor(request: MonitorRequest) -> DeviceMonitor:
    from shared.vendors.nvidia import monitor, nvml_events

    return monitor.NvmlMonitor.open(
        request.nvml_library or nvml_events.open_library(),
        pool=request.node,
        options=request.nvml_options,
        refresh_s=request.refresh_s,
        ignored=request.ignored,
        mig_partition=request.mig_partition,
    )


def _partitions(settings: PartitionSettings) -> PartitionManager:
    from shared.vendors.nvidia.caps import CapsNodes
    from shared.vendors.nvidia.partitions import MigPartitionManager

    return MigPartitionManager(
        settings.data_dir / STATE_FILE,
        caps_nodes=CapsNodes(),
        timeout_s=settings.partition_timeout_s,
    )


VENDOR = Vendor(
    name="nvml",
    package="nvidia",
    summary="NVIDIA GPUs and MIG through NVML",
    load_backend=_load_backend,
    monitor=_monitor,
    partitions=_partitions,
    edits=cdi.edits,
    edit_rules=cdi.RULES,
    plugin_names=plugin_names.NAMES,
    faults=FAULTS,
)
