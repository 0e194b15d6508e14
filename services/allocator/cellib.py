"""The Kubernetes CEL libraries DRA selectors use beside standard CEL: `semver` and `quantity`
(pure).

Values: `Semver` (attributes of type version, `semver("1.2.3")`) and `Quantity` (capacities,
`quantity("10Gi")`). Functions and methods as in k8s.io/apiserver/pkg/cel/library:
`isSemver`, `semver`, `.major()`, `.minor()`, `.patch()`; `isQuantity`, `quantity`, `.sign()`,
`.isInteger()`, `.asInteger()`, `.asApproximateFloat()`, `.add()`, `.sub()`; and on both
`.isGreaterThan()`, `.isLessThan()`, `.compareTo()`. A wrong argument raises ValueError or
TypeError, which celpy turns into a CEL error.
"""

from __future__ import annotations

import re
from decimal import Decimal
from functools import total_ordering
from typing import Any

from celpy import celtypes

from shared import quantity as quantities

__all__ = ["FUNCTIONS", "Quantity", "Semver"]

_SEMVER = re.compile(
    r"^(0|[1-9]\d*)\.(0|[1-9]\d*)\.(0|[1-9]\d*)"
    r"(?:-((?:0|[1-9]\d*|\d*[a-zA-Z-][0-9a-zA-Z-]*)(?:\.(?:0|[1-9]\d*|\d*[a-zA-Z-][0-9a-zA-Z-]*))*))?"
    r"(?:\+([0-9a-zA-Z-]+(?:\.[0-9a-zA-Z-]+)*))?$"
)


@total_ordering
class Semver:
    """A semantic version (2.0.0): ordered by major, minor, patch, then pre-release."""

    __slots__ = ("major", "minor", "patch", "pre", "text")

    def __init__(self, text: str) -> None:
        match = _SEMVER.match(text)
        if match is None:
            raise ValueError(f"invalid semver: {text}")
        self.text = text
        self.major, self.minor, self.patch = (int(match[i]) for i in (1, 2, 3))
        self.pre: tuple[Any, ...] = tuple(
            int(p) if p.isdigit() else p for p in (match[4].split(".") if match[4] else ())
        )

    def _order(self) -> tuple[Any, ...]:
        # A release sorts after its pre-releases; numeric identifiers before alphanumeric.
        pre = tuple((0, p, "") if isinstance(p, int) else (1, 0, p) for p in self.pre)
        return (self.major, self.minor, self.patch, not self.pre, pre)

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Semver) and self._order() == other._order()

    def __lt__(self, other: object) -> bool:
        if not isinstance(other, Semver):
            return NotImplemented
        return self._order() < other._order()

    def __hash__(self) -> int:
        return hash(self._order())

    def __repr__(self) -> str:
        return f"semver({self.text!r})"


@total_ordering
class Quantity:
    """A Kubernetes resource quantity, compared by value."""

    __slots__ = ("text", "value")

    def __init__(self, text: str) -> None:
        self.text = text
        self.value: Decimal = quantities.parse(text)

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Quantity) and self.value == other.value

    def __lt__(self, other: object) -> bool:
        if not isinstance(other, Quantity):
            return NotImplemented
        return self.value < other.value

    def __hash__(self) -> int:
        return hash(self.value)

    def __repr__(self) -> str:
        return f"quantity({self.text!r})"


def _is(kind: type, text: Any) -> celtypes.BoolType:
    try:
        kind(str(text))
    except ValueError:
        return celtypes.BoolType(False)
    return celtypes.BoolType(True)


def _compare(a: Any, b: Any) -> int:
    if isinstance(a, Semver) and isinstance(b, Semver):
        return (a > b) - (a < b)
    if isinstance(a, Quantity) and isinstance(b, Quantity):
        return (a.value > b.value) - (a.value < b.value)
    raise TypeError(f"no such overload: {type(a).__name__}.compareTo({type(b).__name__})")


def _quantity_of(value: Any) -> Decimal:
    if isinstance(value, Quantity):
        return value.value
    if isinstance(value, int) and not isinstance(value, bool):
        return Decimal(int(value))
    raise TypeError(f"no such overload: quantity arithmetic with {type(value).__name__}")


def _arith(a: Any, b: Any, sign: int) -> Quantity:
    if not isinstance(a, Quantity):
        raise TypeError(f"no such overload: {type(a).__name__}.add()")
    return Quantity(quantities.exact(a.value + sign * _quantity_of(b)))


def _as_integer(q: Any) -> celtypes.IntType:
    if not isinstance(q, Quantity) or q.value != q.value.to_integral_value():
        raise ValueError("cannot convert value to integer")
    if not -(2**63) <= q.value < 2**63:
        raise ValueError("cannot convert value to integer")
    return celtypes.IntType(int(q.value))


def _component(name: str) -> Any:
    def get(v: Any) -> celtypes.IntType:
        if not isinstance(v, Semver):
            raise TypeError(f"no such overload: {type(v).__name__}.{name}()")
        return celtypes.IntType(getattr(v, name))

    return get


FUNCTIONS: dict[str, Any] = {
    "semver": lambda text: Semver(str(text)),
    "isSemver": lambda text: _is(Semver, text),
    "major": _component("major"),
    "minor": _component("minor"),
    "patch": _component("patch"),
    "quantity": lambda text: Quantity(str(text)),
    "isQuantity": lambda text: _is(Quantity, text),
    "compareTo": lambda a, b: celtypes.IntType(_compare(a, b)),
    "isGreaterThan": lambda a, b: celtypes.BoolType(_compare(a, b) > 0),
    "isLessThan": lambda a, b: celtypes.BoolType(_compare(a, b) < 0),
    "sign": lambda q: celtypes.IntType((_quantity_of(q) > 0) - (_quantity_of(q) < 0)),
    "isInteger": lambda q: celtypes.BoolType(
        _quantity_of(q) == _quantity_of(q).to_integral_value()
    ),
    "asInteger": _as_integer,
    "asApproximateFloat": lambda q: celtypes.DoubleType(float(_quantity_of(q))),
    "add": lambda a, b: _arith(a, b, 1),
    "sub": lambda a, b: _arith(a, b, -1),
}
