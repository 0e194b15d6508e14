"""Fields the API server dropped from a slice we wrote, and the gates that explain it (pure).

A kube-apiserver silently drops fields whose feature gate is off (docs/contracts.md §4.5). The Go
helper
reports that as `DroppedFieldsError` naming the likely gates (docs/contracts.md §9); `dropped_paths`
compares what was sent with what was stored, `likely_gates` names the gates.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

__all__ = ["GATES", "dropped_paths", "likely_gates", "message"]

# The last field name of a dropped path -> the gate that guards it (kube_features, 1.34-1.36).
GATES = {
    "sharedCounters": "DRAPartitionableDevices",
    "perDeviceNodeSelection": "DRAPartitionableDevices",
    "consumesCounters": "DRAPartitionableDevices",
    "nodeName": "DRAPartitionableDevices",
    "nodeSelector": "DRAPartitionableDevices",
    "allNodes": "DRAPartitionableDevices",
    "taints": "DRADeviceTaints",
    "allowMultipleAllocations": "DRAConsumableCapacity",
    "requestPolicy": "DRAConsumableCapacity",
    "bindsToNode": "DRADeviceBindingConditions",
    "bindingConditions": "DRADeviceBindingConditions",
    "bindingFailureConditions": "DRADeviceBindingConditions",
    "ints": "DRAListTypeAttributes",
    "bools": "DRAListTypeAttributes",
    "strings": "DRAListTypeAttributes",
    "versions": "DRAListTypeAttributes",
    "nodeAllocatableResourceMappings": "DRANodeAllocatableResources",
}
# Maps keyed by names (not by field names): their keys become `{}` in a path.
_NAMED_MAPS = ("attributes", "capacity", "counters")


def _empty(value: Any) -> bool:
    return value is None or value == {} or value == []


def _walk(sent: Any, stored: Any, path: str, *, named: bool, found: set[str]) -> None:
    if isinstance(sent, dict):
        stored_map = stored if isinstance(stored, dict) else {}
        for key, value in sent.items():
            here = f"{path}{{}}" if named else f"{path}.{key}" if path else key
            if _empty(value):
                continue
            if key not in stored_map or stored_map[key] is None:
                found.add(here)
            else:
                _walk(value, stored_map[key], here, named=key in _NAMED_MAPS, found=found)
    elif isinstance(sent, list) and isinstance(stored, list):
        for sent_item, stored_item in zip(sent, stored, strict=False):
            _walk(sent_item, stored_item, f"{path}[]", named=False, found=found)


def dropped_paths(sent: dict[str, Any], stored: dict[str, Any]) -> list[str]:
    """Paths (`spec.devices[].consumesCounters`) set in `sent` but missing from `stored`."""
    found: set[str] = set()
    _walk(sent, stored, "", named=False, found=found)
    return sorted(found)


def likely_gates(paths: Iterable[str]) -> list[str]:
    """The feature gates that guard the fields at `paths`, sorted; unknown fields name none."""
    gates = {GATES.get(path.rsplit(".", 1)[-1].rstrip("[]{}")) for path in paths}
    return sorted(g for g in gates if g)


def message(*, slice_name: str, paths: Iterable[str], gates: Iterable[str]) -> str:
    """The text of the Node Event about dropped fields."""
    fields = ", ".join(f"spec.{p}" for p in paths)
    names = ", ".join(gates) or "unknown"
    return (
        f"The API server dropped {fields} of ResourceSlice {slice_name}; "
        f"likely feature gates off: {names}"
    )
