"""A published device as the allocator sees it: identity, attributes, capacity, taints (pure).

Attribute and capacity names are kept fully qualified (`<domain>/<name>`; a name without a
domain is in the driver's), as the allocator and the CEL environment look them up.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

__all__ = ["Device", "DeviceKey", "device_id", "qualify"]

Obj = dict[str, Any]
DeviceKey = tuple[str, str, str]
"""(driver, pool, device), the allocator's DeviceID."""


def qualify(name: str, driver: str) -> str:
    return name if "/" in name else f"{driver}/{name}"


def device_id(key: DeviceKey) -> str:
    """`driver/pool/device`, as kube-scheduler prints a DeviceID."""
    return "/".join(key)


@dataclass(frozen=True, slots=True)
class Device:
    driver: str
    pool: str
    name: str
    attributes: Mapping[str, Any]
    """Fully qualified name -> published DeviceAttribute JSON (`{"int": 3}`)."""
    capacity: Mapping[str, Any]
    """Fully qualified name -> published DeviceCapacity JSON (`{"value": "80Gi"}`)."""
    taints: tuple[Obj, ...] = ()
    """Taints published in the slice (DeviceTaintRules are applied by `taint`)."""
    multiple_allocations: bool = False
    """`allowMultipleAllocations`: shared by allocations that each consume part of it."""
    capacity_names: Mapping[str, str] = field(default_factory=dict)
    """Fully qualified capacity name -> the name as published (what results carry)."""
    consumes_counters: tuple[Obj, ...] = ()
    binding_conditions: tuple[str, ...] = ()
    slice_name: str = ""

    @property
    def key(self) -> DeviceKey:
        return (self.driver, self.pool, self.name)

    @property
    def tainted(self) -> bool:
        """Whether a published taint keeps requests without tolerations away."""
        return any(t.get("effect") in ("NoSchedule", "NoExecute") for t in self.taints)

    def attribute(self, qualified: str) -> Any:
        """The value of an attribute by fully qualified name, or None."""
        value = self.attributes.get(qualified)
        return None if value is None else next(iter(value.values()), None)

    def typed_attribute(self, qualified: str) -> tuple[str, Any] | None:
        """(type, value) of an attribute, e.g. ("int", 3); None when the device lacks it."""
        value = self.attributes.get(qualified)
        if not value:
            return None
        kind, raw = next(iter(value.items()))
        return (kind, tuple(raw) if isinstance(raw, list) else raw)

    @classmethod
    def from_json(cls, raw: Obj, *, driver: str, pool: str, slice_name: str = "") -> Device:
        prefix = driver + "/"
        capacity = raw.get("capacity") or {}
        names = {(k if "/" in k else prefix + k): k for k in capacity}
        return cls(
            driver=driver,
            pool=pool,
            name=raw["name"],
            attributes={
                (k if "/" in k else prefix + k): v for k, v in (raw.get("attributes") or {}).items()
            },
            capacity={q: capacity[k] for q, k in names.items()},
            taints=tuple(raw.get("taints") or ()),
            multiple_allocations=bool(raw.get("allowMultipleAllocations")),
            capacity_names=names,
            consumes_counters=tuple(raw.get("consumesCounters") or ()),
            binding_conditions=tuple(raw.get("bindingConditions") or ()),
            slice_name=slice_name,
        )
