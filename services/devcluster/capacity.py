"""Consumable-capacity arithmetic for the devcluster scheduler (pure): quantities as numbers,
a capacity's `requestPolicy` applied to a request, and amounts written back as quantities.

The policy rules follow resource.k8s.io/v1 `CapacityRequestPolicy` (DRAConsumableCapacity):
no request takes the policy's `default`; `validValues` (ascending) round a request up to the
smallest value not below it, and refuse one above them all; `validRange` raises a request to
`min`, rounds it up in `step`s counted from `min`, and refuses one above `max`. Without a
policy a request takes what it asks, and no request takes the whole capacity.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from decimal import ROUND_CEILING, Decimal, InvalidOperation
from typing import Any

__all__ = ["as_quantity", "by_policy", "parse"]

_QUANTITY = re.compile(
    r"^(?P<number>[0-9]+(\.[0-9]+)?|\.[0-9]+)(?P<suffix>Ki|Mi|Gi|Ti|Pi|Ei|m|k|M|G|T|P|E)?$"
)
_BINARY = (("Ei", 2**60), ("Pi", 2**50), ("Ti", 2**40), ("Gi", 2**30), ("Mi", 2**20), ("Ki", 2**10))
_DECIMAL = (("E", 10**18), ("P", 10**15), ("T", 10**12), ("G", 10**9), ("M", 10**6), ("k", 10**3))
_SUFFIXES = {"": Decimal(1), "m": Decimal("0.001")} | {
    suffix: Decimal(factor) for suffix, factor in (*_BINARY, *_DECIMAL)
}


def parse(quantity: str) -> Decimal:
    """`30Gi` -> 32212254720; ValueError for what is not a plain quantity."""
    match = _QUANTITY.match(quantity.strip())
    if match is None:
        raise ValueError(f"{quantity!r} is not a quantity")
    try:
        number = Decimal(match["number"])
    except InvalidOperation as exc:
        raise ValueError(f"{quantity!r} is not a quantity") from exc
    return number * _SUFFIXES[match["suffix"] or ""]


def as_quantity(amount: Decimal) -> str:
    """The shortest exact quantity: `32212254720` -> `30Gi`, `0.5` -> `500m`."""
    if amount != amount.to_integral_value():
        milli = amount * 1000
        if milli == milli.to_integral_value():
            return f"{int(milli)}m"
        return str(amount.normalize())
    whole = int(amount)
    if whole == 0:
        return "0"
    for suffix, factor in (*_BINARY, *_DECIMAL):
        if whole % factor == 0:
            return f"{whole // factor}{suffix}"
    return str(whole)


def by_policy(
    requested: Decimal | None, policy: Mapping[str, Any] | None, total: Decimal
) -> Decimal | None:
    """What one allocation consumes of a capacity of `total`; None when the request breaks
    the policy."""
    if policy is None:
        return total if requested is None else requested
    if requested is None:
        default = policy.get("default")
        return total if default is None else parse(str(default))
    if valid_values := policy.get("validValues"):
        fitting = [v for v in (parse(str(value)) for value in valid_values) if v >= requested]
        return min(fitting) if fitting else None
    if (valid_range := policy.get("validRange")) is not None:
        return _in_range(requested, valid_range)
    return requested


def _in_range(requested: Decimal, valid_range: Mapping[str, Any]) -> Decimal | None:
    low = parse(str(valid_range["min"]))
    amount = max(requested, low)
    if (step := valid_range.get("step")) is not None:
        size = parse(str(step))
        amount = low + ((amount - low) / size).to_integral_value(rounding=ROUND_CEILING) * size
    high = valid_range.get("max")
    if high is not None and amount > parse(str(high)):
        return None
    return amount
