"""What the API server accepts in a ResourceSlice, by Kubernetes minor version (pure).

docs/contracts.md §4.1/4.5/6. `for_server(version_json)` reads `GET /version` and gives the
`PublishRules` the slices are built by:

- 1.34: shared counters may share a slice with devices and must sit with the devices that
  consume them; at most 32 counters summed over the sets of a slice, 1024 counter uses by
  the devices of a slice, 32 per device; at most 4 taints per device and no `None` effect.
- 1.35: shared counters in slices of their own, at most 8 sets per slice and 32 counters per
  set; 16 taints per device, effect `None` allowed.
- 1.36: as 1.35, plus the standard attribute `resource.kubernetes.io/pciBusID`, and
  consumable capacity (DRAConsumableCapacity on by default): a device whose inventory lists
  `shared_capacity` (capacity name -> request step) is published with
  `allowMultipleAllocations` and a `requestPolicy` on those capacities. Before 1.36 it is
  published as an exclusive device.
- 1.37: as 1.36 (the slice limits and the fields we publish are unchanged; device taints and
  DeviceTaintRule are GA).

Gates found off at run time (fields the server dropped) are added with `without()`: with
DRAPartitionableDevices off no partition is published (the scheduler could otherwise hand
out a GPU and one of its MIG partitions at once), with DRADeviceTaints off no taint is.
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

__all__ = [
    "NEWEST",
    "OLDEST",
    "PCI_BUS_ID",
    "PublishRules",
    "for_minor",
    "for_server",
    "minor_of",
]

OLDEST = 34
NEWEST = 37
PCI_BUS_ID = "resource.kubernetes.io/pciBusID"
"""Inventory-only attribute (never published): `memory=1Gi,...`, capacity name = step."""
_DIGITS = re.compile(r"^\d+")
_GIT_VERSION = re.compile(r"^v?(\d+)\.(\d+)")


@dataclass(frozen=True, slots=True, kw_only=True)
class PublishRules:
    """Per-version limits and allowed fields of a ResourceSlice, plus gates known to be off."""

    minor: int
    counters_with_devices: bool
    """1.34: a counter set lives in the slice of its consumers (1.35+: in a slice of its own)."""
    max_counters_per_slice: int | None
    """1.34: counters summed over all sets of one slice."""
    max_counter_uses_per_slice: int | None
    """1.34: counters consumed by all devices of one slice."""
    max_counters_per_device: int | None
    """1.34: counters consumed by one device, summed over its consumptions."""
    max_taints: int
    taint_effects: tuple[str, ...]
    pci_bus_id: bool
    disabled_gates: frozenset[str] = frozenset()
    """Gates the server turned out to have off (it dropped their fields)."""
    consumable_capacity: bool = False
    """1.36: `allowMultipleAllocations` and capacity `requestPolicy` (DRAConsumableCapacity)."""

    @property
    def partitionable(self) -> bool:
        return "DRAPartitionableDevices" not in self.disabled_gates

    @property
    def taints(self) -> bool:
        return "DRADeviceTaints" not in self.disabled_gates

    @property
    def shared_capacity(self) -> bool:
        """Whether devices may be published for several allocations with consumable capacity."""
        return self.consumable_capacity and "DRAConsumableCapacity" not in self.disabled_gates

    def without(self, gates: Iterable[str]) -> PublishRules:
        """These rules with `gates` known to be off."""
        return dataclasses.replace(self, disabled_gates=self.disabled_gates | frozenset(gates))

    def describe(self) -> str:
        off = ",".join(sorted(self.disabled_gates))
        return f"1.{self.minor}" + (f" without {off}" if off else "")


def for_minor(minor: int) -> PublishRules:
    """The rules of Kubernetes 1.`minor`, clamped to the supported 1.34-1.37."""
    minor = min(max(minor, OLDEST), NEWEST)
    if minor == OLDEST:
        return PublishRules(
            minor=minor,
            counters_with_devices=True,
            max_counters_per_slice=32,
            max_counter_uses_per_slice=1024,
            max_counters_per_device=32,
            max_taints=4,
            taint_effects=("NoSchedule", "NoExecute"),
            pci_bus_id=False,
        )
    return PublishRules(
        minor=minor,
        counters_with_devices=False,
        max_counters_per_slice=None,
        max_counter_uses_per_slice=None,
        max_counters_per_device=None,
        max_taints=16,
        taint_effects=("NoSchedule", "NoExecute", "None"),
        pci_bus_id=minor >= 36,
        consumable_capacity=minor >= 36,
    )


def minor_of(version: Mapping[str, Any]) -> int | None:
    """The minor version in a `/version` answer (`"35"`, `"35+"`, or from `gitVersion`)."""
    if str(version.get("major", "1")).strip("+") not in ("", "1"):
        return None
    if match := _DIGITS.match(str(version.get("minor", ""))):
        return int(match.group())
    if match := _GIT_VERSION.match(str(version.get("gitVersion", ""))):
        return int(match.group(2)) if match.group(1) == "1" else None
    return None


def for_server(version: Mapping[str, Any]) -> PublishRules:
    """The rules for the server that answered `/version` with `version`; newest if unreadable."""
    minor = minor_of(version)
    return for_minor(NEWEST if minor is None else minor)
