"""Per-kind write preparation, like kube's registry strategies: gated-field dropping and defaults.

Fields behind a disabled feature gate are silently dropped unless the stored
object already uses them; taint `timeAdded` is set when omitted. Mutates the
incoming object only (never a stored one). Pure; no I/O.
"""

from __future__ import annotations

from collections.abc import Container, Iterator
from typing import Any

from devcluster.apiserver.config import ClusterConfig

__all__ = ["drop_disabled_fields", "reset_status_on_create", "set_taint_times"]

_DEV = "spec.devices[]"


def _claim_spec(p: str) -> list[tuple[str, str]]:
    r = f"{p}.devices.requests[]"
    return [
        ("DRAAdminAccess", f"{r}.exactly.adminAccess"),
        ("DRAPrioritizedList", f"{r}.firstAvailable"),
        ("DRADeviceTaints", f"{r}.exactly.tolerations"),
        ("DRADeviceTaints", f"{r}.firstAvailable[].tolerations"),
        ("DRAConsumableCapacity", f"{r}.exactly.capacity"),
        ("DRAConsumableCapacity", f"{r}.firstAvailable[].capacity"),
        ("DRAConsumableCapacity", f"{p}.devices.constraints[].distinctAttribute"),
    ]


_RESULTS = "status.allocation.devices.results[]"
_GATED: dict[str, list[tuple[str, str]]] = {
    "resource.k8s.io/resourceslices": [
        ("DRAPartitionableDevices", "spec.sharedCounters"),
        ("DRAPartitionableDevices", "spec.perDeviceNodeSelection"),
        ("DRAPartitionableDevices", f"{_DEV}.consumesCounters"),
        ("DRAPartitionableDevices", f"{_DEV}.nodeName"),
        ("DRAPartitionableDevices", f"{_DEV}.nodeSelector"),
        ("DRAPartitionableDevices", f"{_DEV}.allNodes"),
        ("DRADeviceTaints", f"{_DEV}.taints"),
        ("DRAConsumableCapacity", f"{_DEV}.allowMultipleAllocations"),
        ("DRAConsumableCapacity", f"{_DEV}.capacity{{}}.requestPolicy"),
        ("DRADeviceBindingConditions", f"{_DEV}.bindsToNode"),
        ("DRADeviceBindingConditions", f"{_DEV}.bindingConditions"),
        ("DRADeviceBindingConditions", f"{_DEV}.bindingFailureConditions"),
        ("DRANodeAllocatableResources", f"{_DEV}.nodeAllocatableResourceMappings"),
        *[
            ("DRAListTypeAttributes", f"{_DEV}.attributes{{}}.{k}")
            for k in ("ints", "bools", "strings", "versions")
        ],
    ],
    "resource.k8s.io/resourceclaims": [
        *_claim_spec("spec"),
        ("DRAResourceClaimDeviceStatus", "status.devices"),
        ("DRADeviceBindingConditions", "status.allocation.allocationTimestamp"),
        ("DRADeviceBindingConditions", f"{_RESULTS}.bindingConditions"),
        ("DRADeviceBindingConditions", f"{_RESULTS}.bindingFailureConditions"),
        ("DRAConsumableCapacity", f"{_RESULTS}.shareID"),
        ("DRAConsumableCapacity", f"{_RESULTS}.consumedCapacity"),
        ("DRAAdminAccess", f"{_RESULTS}.adminAccess"),
        ("DRADeviceTaints", f"{_RESULTS}.tolerations"),
    ],
    "resource.k8s.io/resourceclaimtemplates": _claim_spec("spec.spec"),
    "resource.k8s.io/deviceclasses": [("DRAExtendedResource", "spec.extendedResourceName")],
}


Segment = tuple[str, str]  # (key, "" | "[]" | "{}")


def _segments(pattern: str) -> tuple[Segment, ...]:
    out = []
    for part in pattern.split("."):
        name = part.rstrip("[]{}")
        out.append((name, part[len(name) :]))
    return tuple(out)


_COMPILED = {
    storage: [(gate, _segments(pattern)) for gate, pattern in patterns]
    for storage, patterns in _GATED.items()
}


def _locations(obj: Any, segments: tuple[Segment, ...]) -> Iterator[tuple[dict[str, Any], str]]:
    """(container, key) for every place a `a.b[].c{}.d` pattern reaches in `obj`."""
    if not isinstance(obj, dict):
        return
    (name, iterate), rest = segments[0], segments[1:]
    if not rest:
        if name in obj:
            yield obj, name
        return
    child = obj.get(name)
    if iterate == "[]":
        children = child if isinstance(child, list) else []
    elif iterate == "{}":
        children = list(child.values()) if isinstance(child, dict) else []
    else:
        children = [child]
    for item in children:
        yield from _locations(item, rest)


def drop_disabled_fields(
    storage: str,
    obj: dict[str, Any],
    old: dict[str, Any] | None,
    config: ClusterConfig,
    *,
    present: Container[str] | None = None,
) -> None:
    """Remove fields whose gate is off, unless `old` already uses them (kube's rule).

    `present` (every key that occurs anywhere in `obj`) lets absent fields be skipped
    without walking the object, which matters for 128-device slices.
    """
    for gate, segments in _COMPILED.get(storage, ()):
        if config.enabled(gate) or (present is not None and segments[-1][0] not in present):
            continue
        if old is not None and any(True for _ in _locations(old, segments)):
            continue
        for container, key in list(_locations(obj, segments)):
            container.pop(key, None)


def set_taint_times(
    storage: str, obj: dict[str, Any], old: dict[str, Any] | None, *, now: str
) -> None:
    """Default `timeAdded` on device taints; a DeviceTaintRule's resets when its effect changes."""
    if storage == "resource.k8s.io/resourceslices":
        for container, _ in list(_locations(obj, _TAINTS)):
            for taint in container["taints"] or []:
                if isinstance(taint, dict) and not taint.get("timeAdded"):
                    taint["timeAdded"] = now
    elif storage == "resource.k8s.io/devicetaintrules":
        taint = (obj.get("spec") or {}).get("taint")
        if not isinstance(taint, dict):
            return
        before = ((old or {}).get("spec") or {}).get("taint") or {}
        effect_changed = old is not None and before.get("effect") != taint.get("effect")
        if not taint.get("timeAdded") or (
            effect_changed and taint.get("timeAdded") == before.get("timeAdded")
        ):
            taint["timeAdded"] = now


_TAINTS = _segments("spec.devices[].taints")
_CREATE_STATUS: dict[str, dict[str, Any] | None] = {
    "resource.k8s.io/resourceclaims": None,
    "resource.k8s.io/devicetaintrules": None,
    "pods": {"phase": "Pending"},
    "namespaces": {"phase": "Active"},
}


def reset_status_on_create(storage: str, obj: dict[str, Any]) -> None:
    """Kinds whose create ignores the given status (claims, taint rules, pods, namespaces)."""
    if storage not in _CREATE_STATUS:
        return
    status = _CREATE_STATUS[storage]
    if status is None:
        obj.pop("status", None)
    else:
        obj["status"] = dict(status)
