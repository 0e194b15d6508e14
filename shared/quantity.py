"""Kubernetes resource quantities (pure): `10Gi`, `500m`, `1e3`, read and written as
k8s.io/apimachinery's resource.Quantity does.

Reading follows `ParseQuantity` after `UnmarshalJSON`'s whitespace trim: an optional sign, digits
with an optional fraction (either side may be empty: `.5`, `1.`, even `.` and `-` are zero),
then one suffix: decimal SI (`n u m "" k M G T P E`), binary SI (`Ki Mi Gi Ti Pi Ei`) or a
decimal exponent (`e3`, `E-2`; the exponent is an int64 kept as Go's int32 conversion keeps it).
A non-zero value is rounded up, away from zero, to a whole nano; a binary one is capped at
2^63-1 in magnitude. Anything else is a `QuantityError` naming what is wrong.

Writing follows `CanonicalizeBytes`: the format the text was written in, the largest suffix
that loses no precision, no fraction digits (`1.5Gi` is `1536Mi`, `1.5` is `1500m`); a binary
quantity below 1024 in magnitude or with a fraction is written in decimal SI.

Two departures, both beyond any device size: a value of 1e1000000 or more is refused as out of
range (Kubernetes keeps it; Python's decimal arithmetic would trap on it), and a decimal SI value
beyond the `E` range is written with an exponent (Go drops its suffix).
"""

from __future__ import annotations

import enum
import re
from dataclasses import dataclass
from decimal import ROUND_UP, Context, Decimal, localcontext

__all__ = [
    "MAX_INT64",
    "Format",
    "Quantity",
    "QuantityError",
    "as_int",
    "binary",
    "canonical",
    "compare",
    "exact",
    "format_amount",
    "is_quantity",
    "mebibytes",
    "parse",
    "parse_quantity",
    "whole",
]

MAX_INT64 = 2**63 - 1
_NANO = Decimal("1e-9")
# ParseQuantity's scanner: sign, digits, fraction, suffix letters, then a signed exponent.
_SCAN = re.compile(r"([+-]?)([0-9]*)(?:\.([0-9]*))?([eEinumkKMGTP]*[+-]?[0-9]*)")
_DECIMAL = {"n": -9, "u": -6, "m": -3, "": 0, "k": 3, "M": 6, "G": 9, "T": 12, "P": 15, "E": 18}
_BINARY = {"Ki": 10, "Mi": 20, "Gi": 30, "Ti": 40, "Pi": 50, "Ei": 60}
_DECIMAL_SUFFIX = {exponent: suffix for suffix, exponent in _DECIMAL.items()}
_BINARY_SUFFIX = {exponent // 10: suffix for suffix, exponent in _BINARY.items()}
# Python's default decimal range; values beyond it would trap in callers' arithmetic.
_MAX_ADJUSTED = 999_999
_EXPONENT = re.compile(r"[+-]?[0-9]+")
_FORMAT_WRONG = (
    "quantities must match the regular expression '^([+-]?[0-9.]+)([eEinumkKMGTP]*[-+]?[0-9]*)$'"
)


class QuantityError(ValueError):
    """Text that is not a quantity; `text` is what was given, `reason` Kubernetes' own words."""

    def __init__(self, text: object, reason: str) -> None:
        shown = text if not isinstance(text, str) or len(text) <= 40 else text[:40] + "..."
        super().__init__(f"{shown!r} is not a quantity: {reason}")
        self.text = text
        self.reason = reason


class Format(enum.Enum):
    """How a quantity is written, remembered from the text it was read from."""

    DECIMAL_SI = "DecimalSI"
    BINARY_SI = "BinarySI"
    DECIMAL_EXPONENT = "DecimalExponent"


@dataclass(frozen=True, slots=True)
class Quantity:
    """An exact value and the format it is written in; equal when the values are equal."""

    value: Decimal
    format: Format

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Quantity) and self.value == other.value

    def __hash__(self) -> int:
        return hash(self.value)

    def __str__(self) -> str:
        return format_amount(self.value, self.format)


def parse_quantity(text: str) -> Quantity:
    """The quantity `text` holds, or QuantityError."""
    if not isinstance(text, str):
        raise QuantityError(text, "not a string")
    text = text.strip()
    if not text:
        raise QuantityError(text, _FORMAT_WRONG)
    match = _SCAN.fullmatch(text)
    if match is None:
        raise QuantityError(text, _FORMAT_WRONG)
    sign, whole, fraction, suffix = match.groups()
    base, exponent, fmt = _interpret(text, suffix)
    digits = (whole or "0") + (fraction or "")
    number = Decimal(f"{sign}{digits}E{-len(fraction or '')}")
    with localcontext(_context(digits)):
        value = number.scaleb(exponent) if base == 10 else number * (Decimal(2) ** exponent)
        if value and value.as_tuple().exponent < -9:  # type: ignore[operator]
            value = value.quantize(_NANO, rounding=ROUND_UP)
    if not value:
        value = Decimal(0)  # `-0` and `-.` are plain zero
    elif value.adjusted() > _MAX_ADJUSTED:
        raise QuantityError(text, "out of range")
    if fmt is Format.BINARY_SI and abs(value) > MAX_INT64:
        value = Decimal(MAX_INT64).copy_sign(value)
    if fmt is Format.BINARY_SI and 0 < abs(value) < 1:
        fmt = Format.DECIMAL_SI
    return Quantity(value, fmt)


def parse(text: str) -> Decimal:
    """The exact value of `text` (`30Gi` -> 32212254720, `500m` -> 0.5), or QuantityError."""
    return parse_quantity(text).value


def is_quantity(text: object) -> bool:
    """Whether `text` is a string Kubernetes reads as a quantity."""
    try:
        parse_quantity(text)  # type: ignore[arg-type]
    except QuantityError:
        return False
    return True


def canonical(text: str) -> str:
    """`text` as the API server writes it back: `1.5Gi` -> `1536Mi`, `0.5` -> `500m`."""
    return str(parse_quantity(text))


def compare(a: str, b: str) -> int:
    """-1, 0 or 1 as quantity `a` is less than, equal to or greater than `b` (by value)."""
    left, right = parse(a), parse(b)
    return (left > right) - (left < right)


def as_int(value: Decimal, *, limit: int = MAX_INT64) -> int | None:
    """`value` as an int when it is whole and at most `limit` in magnitude, else None.

    Checked before `int()`, which would build all the digits of `1e999999999`.
    """
    if not value.is_finite() or abs(value) > limit or value != value.to_integral_value():
        return None
    return int(value)


def whole(text: object) -> int | None:
    """The value of `text` as an int when it is a quantity, whole and within int64; else None."""
    try:
        value = parse(text)  # type: ignore[arg-type]
    except QuantityError:
        return None
    return as_int(value)


def format_amount(value: Decimal, fmt: Format) -> str:
    """`value` written in `fmt` as CanonicalizeBytes writes it (see the module docstring)."""
    if not value:
        return "0"
    if fmt is Format.BINARY_SI:
        whole = as_int(value, limit=2**64)
        if whole is not None and abs(whole) >= 1024:
            power = 0
            while whole % 1024 == 0 and power < max(_BINARY_SUFFIX):
                whole //= 1024
                power += 1
            return f"{whole}{_BINARY_SUFFIX.get(power, '')}"
        fmt = Format.DECIMAL_SI
    sign, digit_tuple, exponent = value.as_tuple()
    mantissa = int("".join(map(str, digit_tuple)))
    power = int(exponent)
    while mantissa and mantissa % 10 == 0:
        mantissa //= 10
        power += 1
    mantissa *= 10 ** (power % 3)
    power -= power % 3
    text = f"{'-' if sign else ''}{mantissa}"
    if fmt is Format.DECIMAL_SI and power in _DECIMAL_SUFFIX:
        return text + _DECIMAL_SUFFIX[power]
    return text if power == 0 else f"{text}e{power}"


def exact(value: Decimal) -> str:
    """The shortest exact text for an amount we computed: binary SI when a whole multiple of
    1Ki (`32212254720` -> `30Gi`), decimal SI otherwise (`2000` -> `2k`, `0.5` -> `500m`)."""
    whole = as_int(value, limit=2**64)
    if whole is not None and whole % 1024 == 0 and abs(whole) >= 1024:
        return format_amount(value, Format.BINARY_SI)
    return format_amount(value, Format.DECIMAL_SI)


def binary(n_bytes: int) -> str:
    """A non-negative byte count with the largest binary suffix that divides it (`80Gi`)."""
    if n_bytes < 0:
        raise ValueError(f"negative byte count {n_bytes}")
    return format_amount(Decimal(n_bytes), Format.BINARY_SI) if n_bytes >= 1024 else str(n_bytes)


def mebibytes(n_mib: int) -> str:
    """A MiB count (what NVML's `memorySizeMB` and npu-smi's `MB` really are) as a quantity."""
    return binary(n_mib << 20)


def _interpret(text: str, suffix: str) -> tuple[int, int, Format]:
    if suffix in _DECIMAL:
        return 10, _DECIMAL[suffix], Format.DECIMAL_SI
    if suffix in _BINARY:
        return 2, _BINARY[suffix], Format.BINARY_SI
    if len(suffix) > 1 and suffix[0] in "eE" and _EXPONENT.fullmatch(suffix[1:]):
        exponent = int(suffix[1:])
        if -(2**63) <= exponent < 2**63:
            # Go keeps int32(parsed): the low 32 bits, signed.
            return 10, (exponent + 2**31) % 2**32 - 2**31, Format.DECIMAL_EXPONENT
    raise QuantityError(text, "unable to parse quantity's suffix")


def _context(digits: str) -> Context:
    """Enough precision for the exact value and its nano rounding, whatever the exponent."""
    return Context(prec=len(digits) + 40, Emax=2**34, Emin=-(2**34))
