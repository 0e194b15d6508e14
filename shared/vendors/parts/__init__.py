"""What a vendor package implements, and nothing vendor-specific: the neutral seams.

Each agent drives a backend through one of these protocols, and each vendor package
(`shared.vendors.sim`, `.nvidia`, `.ascend`) implements them and bundles its parts in one
`vendor.Vendor`. Both sides import this package; it imports neither.

- `discovery`: `DeviceBackend` (enumerates devices) and what a loader is given; `sysfs` and
  `topology` are the generic helpers backends share.
- `health`: `DeviceMonitor` and what a factory is given; `observation` is what a monitor
  reports; `blocking` runs a vendor library's calls off the event loop.
- `partitions`: `PartitionManager` and the partitions it makes; `ledger` is the state file of
  the hardware managers.
- `cdi`: a device's container edits (`BackendEdits`) and the allowlist rules (`EditRules`).
- `plugin_names`: the device-plugin resource names of a backend (`PluginNames`).
"""
