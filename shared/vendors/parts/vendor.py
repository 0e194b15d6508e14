"""One backend's vendor object: every part an agent needs, bundled by its vendor package."""

from __future__ import annotations

from dataclasses import dataclass, field

from shared.vendors.parts.cdi import BackendEdits, EditRules
from shared.vendors.parts.discovery import BackendLoader
from shared.vendors.parts.faults import FaultDefaults
from shared.vendors.parts.health import MonitorFactory
from shared.vendors.parts.partitions import PartitionFactory
from shared.vendors.parts.plugin_names import PluginNames

__all__ = ["Vendor"]


@dataclass(frozen=True, slots=True, kw_only=True)
class Vendor:
    """A backend as its vendor package exports it (`shared/vendors/<package>/VENDOR`).

    The factories import the vendor's libraries only when called, so that every agent can
    hold every vendor object on a node that has none of their hardware.
    """

    name: str
    """The backend name in configuration (`--backend`, health's `--monitor`)."""
    package: str
    """The package under `shared/vendors/` (the sim imitates both vendors' device shapes)."""
    summary: str
    load_backend: BackendLoader
    """Discovery: opens the device backend."""
    monitor: MonitorFactory
    """Health: makes the device monitor."""
    partitions: PartitionFactory
    """Allocation: makes the partition manager."""
    edits: BackendEdits
    """Allocation: a device's CDI container edits."""
    edit_rules: EditRules
    """Allocation: what the CDI allowlist admits for this backend."""
    plugin_names: PluginNames
    """Allocation: the device-plugin front's resource names."""
    faults: FaultDefaults = field(default_factory=FaultDefaults)
    """Health: the built-in classes of the vendor's fault causes and codes."""
