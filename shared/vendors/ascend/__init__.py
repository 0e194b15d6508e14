"""Huawei Ascend NPUs through npu-smi (the `ascend` backend): every agent's part.

The device model (pure): `npusmi` reads what npu-smi prints (the `info` table, `-t topo`,
`-t health`, `-m`, `-t info-vnpu`, the `set` answers) and raises `NpuSmiError` on anything
else; `devices` names the devices discovery publishes (ResourceSlices are the contract: the
health monitor and the partition manager use the same names) and holds the vNPU counter model.

The agents' parts: `discovery`, `monitor` (with the fault levels of `npu_faults`),
`partitions` (vNPUs made at prepare), `cdi` and `plugin_names`. `VENDOR` bundles them.
"""

from __future__ import annotations

from types import MappingProxyType

from shared.vendors.ascend import cdi, plugin_names
from shared.vendors.parts.discovery import BackendSeams, DeviceBackend, DiscoverySettings
from shared.vendors.parts.faults import FaultDefaults
from shared.vendors.parts.health import DeviceMonitor, MonitorRequest
from shared.vendors.parts.partitions import PartitionManager, PartitionSettings
from shared.vendors.parts.vendor import Vendor

__all__ = ["FAULTS", "STATE_FILE", "VENDOR"]

FAULTS = FaultDefaults(
    # npu_faults' levels: sub-health degrades, the restart levels pass; the rest is fatal.
    causes=MappingProxyType({"npu-subhealth": "informational", "npu-restart": "transient"}),
)

STATE_FILE = "vnpu-partitions.json"
"""The vNPUs the partition manager made, in the plugin data dir."""


def _load_backend(settings: DiscoverySettings, seams: BackendSeams) -> DeviceBackend:
    from shared import commands
    from shared.vendors.ascend.discovery import AscendBackend
    from shared.vendors.parts.sysfs import Sysfs

    return AscendBackend(
        npu_smi=settings.npu_smi_path,
        run_command=seams.run_command or commands.run_command,
        sysfs=Sysfs(settings.sysfs_root),
        timeout_s=settings.backend_timeout_s,
        poll_s=settings.backend_poll_s,
    )


def _monitor(request: MonitorRequest) -> DeviceMonitor:
    from shared.vendors.ascend.monitor import AscendMonitor

    options = request.ascend_options
    return AscendMonitor(
        pool=request.node,
        npu_smi=options.npu_smi,
        timeout_s=options.timeout_s,
        poll_s=options.poll_s,
        isolate_unknown=options.isolate_unknown,
    )


def _partitions(settings: PartitionSettings) -> PartitionManager:
    from shared.vendors.ascend.partitions import VnpuPartitionManager

    return VnpuPartitionManager(
        settings.data_dir / STATE_FILE,
        npu_smi=settings.npu_smi_path,
        timeout_s=settings.partition_timeout_s,
    )


VENDOR = Vendor(
    name="ascend",
    package="ascend",
    summary="Huawei Ascend NPUs through npu-smi",
    load_backend=_load_backend,
    monitor=_monitor,
    partitions=_partitions,
    edits=cdi.edits,
    edit_rules=cdi.RULES,
    plugin_names=plugin_names.NAMES,
    faults=FAULTS,
)
