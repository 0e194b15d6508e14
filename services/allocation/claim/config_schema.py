"""The opaque claim configuration of this driver, `<driver>/v1alpha1` `DeviceConfig`, defined
once (pure).

Two readers, one definition: the allocation agent checks every config with `check` before
decoding it (opaque.py), and scripts/gen_admission_policy.py renders the same `DEVICE_CONFIG`
as the CEL of the admission policy (config_cel.py). A config the policy admits is therefore one
the agent accepts, and a config it denies fails at prepare too, naming the same field.

Rules every field type follows in both readers: a field given must have its type (`null` is no
value of any type), a field not in the schema is an error, a required field must be given.
"""

from __future__ import annotations

import enum
import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from shared import quantity

__all__ = [
    "DEVICE_CONFIG",
    "DRIVER",
    "PASSTHROUGH_VFIO",
    "Const",
    "Field",
    "FieldType",
    "Integer",
    "Interval",
    "Object",
    "OneOf",
    "Pattern",
    "Quantity",
    "Strategy",
    "Violation",
    "check",
    "describe",
    "shortened",
]

DRIVER = "{driver}"
"""In a `Const` template: the driver's name, which each overlay sets."""


class Strategy(enum.StrEnum):
    EXCLUSIVE = "Exclusive"
    TIME_SLICING = "TimeSlicing"
    SPACE_PARTITIONING = "SpacePartitioning"


PASSTHROUGH_VFIO = "vfio"
"""`passthrough: vfio`: the device goes to a virtual machine through VFIO (docs/vfio.md)."""


class Interval(enum.StrEnum):
    DEFAULT = "Default"
    SHORT = "Short"
    MEDIUM = "Medium"
    LONG = "Long"


@dataclass(frozen=True, slots=True)
class Const:
    """A string that must be exactly `template`, with `{driver}` standing for the driver."""

    template: str

    def expected(self, driver: str) -> str:
        return self.template.replace(DRIVER, driver)


@dataclass(frozen=True, slots=True)
class OneOf:
    """A string, one of `values`."""

    values: tuple[str, ...]


@dataclass(frozen=True, slots=True)
class Integer:
    """A JSON integer (no fraction, no boolean) in minimum..maximum."""

    minimum: int
    maximum: int


@dataclass(frozen=True, slots=True)
class Quantity:
    """A string of `shape` that Kubernetes' resource.ParseQuantity reads, whose value, a
    fraction dropped, is in minimum..maximum: `1e3`, `10Gi`, `1.5G`, `+1k`.

    The shape comes first on purpose: kube-apiserver's quantity arithmetic is exact, so
    comparing `1e2147483647` with a bound builds a number of two billion digits (such a request
    outlasted a 10 s client timeout against a real API server). A shape that admits no long
    exponent keeps the policy's isQuantity() and quantity() from ever seeing one.
    """

    minimum: int
    maximum: int
    shape: str
    description: str


@dataclass(frozen=True, slots=True)
class Pattern:
    """A string the whole of which matches `regex` (the same in Python and RE2)."""

    regex: str
    description: str
    example: str


@dataclass(frozen=True, slots=True, kw_only=True)
class Field:
    name: str
    type: FieldType
    required: bool = False
    default: str | None = None
    """What an omitted field means (OneOf fields only)."""
    only_with: tuple[str, str] | None = None
    """(sibling, value): the field is allowed only where the sibling, or its default, is value."""


@dataclass(frozen=True, slots=True)
class Object:
    """A JSON object with at most these fields."""

    fields: tuple[Field, ...]

    @property
    def names(self) -> tuple[str, ...]:
        return tuple(f.name for f in self.fields)

    def field(self, name: str) -> Field:
        (found,) = (f for f in self.fields if f.name == name)
        return found


FieldType = Const | OneOf | Integer | Quantity | Pattern | Object

DEVICE_CONFIG = Object(
    (
        Field(name="apiVersion", type=Const(f"{DRIVER}/v1alpha1"), required=True),
        Field(name="kind", type=Const("DeviceConfig"), required=True),
        Field(
            name="sharing",
            type=Object(
                (
                    Field(
                        name="strategy",
                        type=OneOf(tuple(map(str, Strategy))),
                        default=str(Strategy.EXCLUSIVE),
                    ),
                    Field(
                        name="timeSlicing",
                        type=Object(
                            (
                                Field(
                                    name="interval",
                                    type=OneOf(tuple(map(str, Interval))),
                                    default=str(Interval.DEFAULT),
                                ),
                            )
                        ),
                        only_with=("strategy", str(Strategy.TIME_SLICING)),
                    ),
                    Field(
                        name="spacePartitioning",
                        type=Object(
                            (
                                Field(name="computePercent", type=Integer(1, 100)),
                                # Kubernetes keeps quantities it can as int64; a larger limit
                                # is a typo (and would not fit an environment variable).
                                Field(
                                    name="memoryLimit",
                                    type=Quantity(
                                        1,
                                        quantity.MAX_INT64,
                                        r"[+-]?[0-9]*(\.[0-9]*)?([numkMGTPE]|[KMGTPE]i|[eE][+-]?[0-9]{1,2})?",
                                        "a positive quantity up to 8Ei (exponents of at most"
                                        " two digits)",
                                    ),
                                ),
                            )
                        ),
                        only_with=("strategy", str(Strategy.SPACE_PARTITIONING)),
                    ),
                )
            ),
        ),
        Field(
            name="partition",
            type=Object(
                (
                    Field(
                        name="profile",
                        # A MIG profile (`1g.10gb+me`) or a vNPU template (`vir05_1c_8g`);
                        # which exist is the backend's.
                        type=Pattern(
                            "[A-Za-z0-9]([A-Za-z0-9._+-]{0,61}[A-Za-z0-9])?",
                            "a profile name (letters, digits, ._+-)",
                            "1g.10gb",
                        ),
                        required=True,
                    ),
                )
            ),
        ),
        # `vfio`: each device is prepared for a virtual machine (docs/vfio.md), its PCI
        # functions bound to vfio-pci; absent: for containers.
        Field(name="passthrough", type=OneOf((PASSTHROUGH_VFIO,))),
    )
)
"""`DeviceConfig`, as docs/usage.md's "Claim configuration" shows it."""


def describe(kind: FieldType, driver: str) -> str:
    """What a value of `kind` is, as both readers' errors say it."""
    match kind:
        case Const():
            return repr(kind.expected(driver))
        case OneOf():
            return "one of " + ", ".join(kind.values)
        case Integer():
            return f"an integer in {kind.minimum}..{kind.maximum}"
        case Quantity() | Pattern():
            return kind.description
        case Object():
            return "an object"


class Violation(Exception):
    """A config that breaks the schema: `field` is the offending path, `problem` what is wrong."""

    def __init__(self, field: str, problem: str) -> None:
        super().__init__(f"{field}: {problem}")
        self.field = field
        self.problem = problem


def check(document: Any, *, driver: str) -> Mapping[str, Any]:
    """`document` itself when it is a valid DeviceConfig for `driver`; else the first
    Violation, fields checked in the schema's order."""
    _check(DEVICE_CONFIG, document, "", driver)
    return document  # type: ignore[no-any-return]


def _check(kind: FieldType, value: Any, path: str, driver: str) -> None:
    if isinstance(kind, Object):
        _check_object(kind, value, path, driver)
    elif not _valid(kind, value, driver):
        raise Violation(path, _problem(kind, value, driver))


def _check_object(kind: Object, value: Any, path: str, driver: str) -> None:
    if not isinstance(value, Mapping):
        raise Violation(path or "parameters", f"expected an object, got {type(value).__name__}")
    for key in sorted(set(value) - set(kind.names), key=str):
        raise Violation(_join(path, str(key)), "unknown field")
    for field in kind.fields:
        where = _join(path, field.name)
        if field.name not in value:
            if field.required:
                _check(field.type, None, where, driver)
            continue
        if field.only_with is not None:
            sibling, wanted = field.only_with
            if value.get(sibling, kind.field(sibling).default) != wanted:
                raise Violation(where, f"only allowed with {sibling} {wanted}")
        _check(field.type, value[field.name], where, driver)


def _valid(kind: FieldType, value: Any, driver: str) -> bool:
    match kind:
        case Const():
            return isinstance(value, str) and value == kind.expected(driver)
        case OneOf():
            return isinstance(value, str) and value in kind.values
        case Integer():
            return (
                isinstance(value, int)
                and not isinstance(value, bool)
                and kind.minimum <= value <= kind.maximum
            )
        case Quantity():
            return (
                isinstance(value, str)
                and re.fullmatch(kind.shape, value) is not None
                and _quantity_in(value, kind.minimum, kind.maximum)
            )
        case Pattern():
            return isinstance(value, str) and re.fullmatch(kind.regex, value) is not None
        case Object():
            return isinstance(value, Mapping)


def _quantity_in(text: str, minimum: int, maximum: int) -> bool:
    try:
        value = quantity.parse(text)
    except quantity.QuantityError:
        return False
    # Whole units, a fraction dropped, in minimum..maximum: the value in [minimum, maximum + 1).
    return minimum <= value < maximum + 1


def _problem(kind: FieldType, value: Any, driver: str) -> str:
    match kind:
        case Const():
            return f"{shortened(value)}, expected {describe(kind, driver)}"
        case OneOf() if not isinstance(value, str):
            return f"expected a string, {describe(kind, driver)}"
        case _:
            return f"{shortened(value)} is not {describe(kind, driver)}"


def _join(path: str, name: str) -> str:
    return f"{path}.{name}" if path else name


def shortened(value: Any) -> str:
    """`repr(value)`, cut to a length an error message can carry."""
    text = repr(value)
    return text if len(text) <= 80 else f"{text[:77]}..."
