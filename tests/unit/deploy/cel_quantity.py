"""Kubernetes' CEL quantity library (k8s.io/apiserver/pkg/cel/library/quantity.go) for celpy:
`isQuantity`, `quantity` and the comparisons the admission policies use, over shared.quantity,
our port of resource.ParseQuantity. tests/k8s/test_admission_deviceconfig.py checks the same
forms against a real kube-apiserver's library."""

from __future__ import annotations

from dataclasses import dataclass
from decimal import Decimal
from typing import Any

from celpy import celtypes

from shared import quantity

__all__ = ["FUNCTIONS"]


@dataclass(frozen=True, slots=True)
class _Quantity:
    value: Decimal


def _parse(text: Any) -> Decimal:
    # ParseQuantity itself does not trim; shared.quantity trims as UnmarshalJSON does.
    if not isinstance(text, str) or text != text.strip():
        raise ValueError(f"{text!r} is not a quantity")
    return quantity.parse(text)


def is_quantity(text: Any) -> celtypes.BoolType:
    try:
        _parse(text)
    except ValueError:
        return celtypes.BoolType(False)
    return celtypes.BoolType(True)


def to_quantity(text: Any) -> _Quantity:
    return _Quantity(_parse(text))


def is_less_than(left: _Quantity, right: _Quantity) -> celtypes.BoolType:
    return celtypes.BoolType(left.value < right.value)


def is_greater_than(left: _Quantity, right: _Quantity) -> celtypes.BoolType:
    return celtypes.BoolType(left.value > right.value)


def compare_to(left: _Quantity, right: _Quantity) -> celtypes.IntType:
    return celtypes.IntType((left.value > right.value) - (left.value < right.value))


FUNCTIONS: dict[str, Any] = {
    "isQuantity": is_quantity,
    "quantity": to_quantity,
    "isLessThan": is_less_than,
    "isGreaterThan": is_greater_than,
    "compareTo": compare_to,
}
