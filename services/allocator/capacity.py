"""Consumable capacity (DRAConsumableCapacity) as kube-scheduler's allocator applies it (pure).

A request's `capacity.requests` name capacities of the device exactly as its slice publishes
them: kube-scheduler looks the names up as written, so `memory` and `<driver>/memory` are two
different names (checked against the real scheduler). A device lacking one does not match.
Every capacity of the device is consumed by an allocation: the requested amount rounded by the
capacity's `requestPolicy` (`validRange`: at least `min`, up in `step`s from `min`; else
`validValues`: the smallest value not below it), or, when not requested, the policy's
`default` or else the whole capacity. The amount must keep to the policy (inside the range, one
of the values) and, added to what other allocations of a shared (`allowMultipleAllocations`)
device already consume, stay within the capacity's value.
"""

from __future__ import annotations

from collections.abc import Mapping
from decimal import ROUND_CEILING, Decimal
from typing import Any

from services.allocator.device import Device
from services.allocator.errors import ClaimError
from shared import quantity

__all__ = ["Consumption", "consumption", "requested", "shortage"]

Consumption = Mapping[str, Decimal]
"""Fully qualified capacity name -> the amount one allocation takes of it."""


def requested(option: Mapping[str, Any], *, request: str) -> dict[str, Decimal]:
    """`capacity.requests` of a request or subrequest, by name as written."""
    amounts = (option.get("capacity") or {}).get("requests") or {}
    parsed = {}
    for name, amount in amounts.items():
        try:
            parsed[str(name)] = quantity.parse(str(amount))
        except ValueError as exc:
            raise ClaimError(f"request {request}: capacity {name}: {exc}") from exc
    return parsed


def consumption(device: Device, wanted: Mapping[str, Decimal]) -> Consumption | str:
    """What one allocation of `device` takes of each of its capacities, or why it cannot."""
    resolved = {}
    published = {as_published: q for q, as_published in device.capacity_names.items()}
    for name, amount in wanted.items():
        qualified = published.get(name)
        if qualified is None:
            return f"has no capacity {name}"
        if qualified in resolved:
            return f"capacity {name} requested twice"
        resolved[qualified] = amount
    taken: dict[str, Decimal] = {}
    for name, capacity in device.capacity.items():
        total = _value(capacity)
        policy = capacity.get("requestPolicy")
        amount = _consumed(resolved.get(name), total, policy)
        if amount < 0 or total < 0:
            return f"capacity {device.capacity_names.get(name, name)}: negative value"
        problem = _violation(amount, policy)
        if problem:
            return f"capacity {device.capacity_names.get(name, name)}: {problem}"
        if amount > total:
            return (
                f"capacity {device.capacity_names.get(name, name)} too small "
                f"({quantity.exact(amount)} > {capacity.get('value')})"
            )
        taken[name] = amount
    return taken


def shortage(device: Device, taken: Consumption, used: Mapping[str, Decimal]) -> str:
    """ "" when another allocation taking `taken` fits beside `used`; else which capacity
    would be overcommitted."""
    for name, amount in taken.items():
        total = _value(device.capacity[name])
        already = used.get(name, Decimal(0))
        if already + amount > total:
            free = quantity.exact(total - already)
            return (
                f"capacity {device.capacity_names.get(name, name)} exhausted "
                f"(needs {quantity.exact(amount)}, {free} free)"
            )
    return ""


def _value(capacity: Mapping[str, Any]) -> Decimal:
    try:
        return quantity.parse(str(capacity.get("value")))
    except ValueError:
        return Decimal(0)


def _consumed(wanted: Decimal | None, total: Decimal, policy: Mapping[str, Any] | None) -> Decimal:
    if wanted is None:
        if policy is not None and policy.get("default") is not None:
            return quantity.parse(str(policy["default"]))
        return total
    if policy is None:
        return wanted
    valid_range = policy.get("validRange")
    if valid_range is not None and valid_range.get("min") is not None:
        low = quantity.parse(str(valid_range["min"]))
        amount = max(wanted, low)
        if valid_range.get("step") is not None:
            step = quantity.parse(str(valid_range["step"]))
            steps = ((amount - low) / step).to_integral_value(rounding=ROUND_CEILING)
            amount = low + steps * step
        return amount
    if valid_values := policy.get("validValues"):
        fitting = [v for v in (quantity.parse(str(x)) for x in valid_values) if v >= wanted]
        return min(fitting) if fitting else wanted
    return wanted


def _violation(amount: Decimal, policy: Mapping[str, Any] | None) -> str:
    if policy is None:
        return ""
    valid_range = policy.get("validRange")
    if valid_range is not None and valid_range.get("min") is not None:
        low = quantity.parse(str(valid_range["min"]))
        high = valid_range.get("max")
        if amount < low or (high is not None and amount > quantity.parse(str(high))):
            return f"{quantity.exact(amount)} outside its requestPolicy validRange"
        return ""
    valid_values = policy.get("validValues")
    if valid_values and amount not in {quantity.parse(str(v)) for v in valid_values}:
        return f"{quantity.exact(amount)} not one of its requestPolicy validValues"
    return ""
