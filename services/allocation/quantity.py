"""Kubernetes quantities as numbers (pure): `10Gi` -> 10737418240, `500m` -> 0.5.

Enough of resource.Quantity for what a claim carries (opaque limits, consumed capacity): a
non-negative decimal with an optional binary, decimal or milli suffix; no exponents.
"""

from __future__ import annotations

import re
from decimal import Decimal, InvalidOperation

__all__ = ["as_integer", "parse"]

_QUANTITY = re.compile(
    r"^(?P<number>[0-9]+(\.[0-9]+)?)(?P<suffix>Ki|Mi|Gi|Ti|Pi|Ei|m|k|M|G|T|P|E)?$"
)
_SUFFIXES = {
    "": Decimal(1),
    "m": Decimal("0.001"),
    "k": Decimal(10**3),
    "M": Decimal(10**6),
    "G": Decimal(10**9),
    "T": Decimal(10**12),
    "P": Decimal(10**15),
    "E": Decimal(10**18),
    "Ki": Decimal(2**10),
    "Mi": Decimal(2**20),
    "Gi": Decimal(2**30),
    "Ti": Decimal(2**40),
    "Pi": Decimal(2**50),
    "Ei": Decimal(2**60),
}


def parse(quantity: str) -> Decimal | None:
    """The value of `quantity`, or None when it is not a quantity this module reads."""
    match = _QUANTITY.match(quantity.strip())
    if match is None:
        return None
    try:
        number = Decimal(match["number"])
    except InvalidOperation:
        return None
    return number * _SUFFIXES[match["suffix"] or ""]


def as_integer(quantity: str) -> int | None:
    """The value as an integer when it is whole (`10Gi`, `2`), else None (`500m`, `x`)."""
    value = parse(quantity)
    if value is None or value != value.to_integral_value():
        return None
    return int(value)
