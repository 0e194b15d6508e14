"""CEL device selectors in the Kubernetes DRA environment (pure).

A selector sees `device.driver`, `device.attributes[domain].name` (int, bool, string, or a
semver for versions), `device.capacity[domain].name` (a quantity) and
`device.allowMultipleAllocations`, with the `semver` and `quantity` libraries (`cellib`).
Looking up a domain the device has no attributes in gives an empty map, so a missing attribute
is the runtime error `no such key: <name>`, which `has()` guards against, as in Kubernetes.

An expression that does not parse, or names something other than `device` and the library
functions, is a compile error (the API server refuses such a selector); a runtime error is
reported per device. Results are cached per expression and device content, since many devices
(and nodes) publish the same attributes.
"""

from __future__ import annotations

import functools
import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import celpy
from celpy import celtypes
from celpy.celparser import CELParseError
from celpy.evaluation import CELEvalError

from services.allocator import cellib
from services.allocator.device import Device

__all__ = ["Outcome", "SelectorCache", "check", "evaluate"]

_UNDECLARED = re.compile(r"undeclared reference to '([^']*)'")
_NO_MEMBER = re.compile(r"no such member in mapping: '([^']*)'")


@dataclass(frozen=True, slots=True)
class Outcome:
    """What a selector says of a device: `matches`, or the CEL `error` message."""

    matches: bool
    error: str = ""


class _Domains(celtypes.MapType):
    """`device.attributes` / `device.capacity`: any domain looks up to a (maybe empty) map."""

    def __missing__(self, key: Any) -> celtypes.MapType:
        return celtypes.MapType()


@functools.cache
def _program(expression: str) -> celpy.Runner | str:
    env = celpy.Environment()
    try:
        return env.program(env.compile(expression), functions=cellib.FUNCTIONS)
    except CELParseError as exc:
        return f"compilation failed: {' '.join(str(exc).split())}"


def check(expression: str) -> str:
    """ "" when the expression compiles; else the compile error."""
    program = _program(expression)
    if isinstance(program, str):
        return program
    undeclared = _undeclared(_run(program, _activation(_PROBE)))
    return f"compilation failed: undeclared reference to '{undeclared}'" if undeclared else ""


def evaluate(expression: str, device: Device) -> Outcome:
    """Whether the selector selects `device`, uncached; a compile error is an Outcome error
    too (call `check` first to tell them apart)."""
    program = _program(expression)
    if isinstance(program, str):
        return Outcome(False, program)
    return _outcome(_run(program, _activation(device)))


def _run(program: celpy.Runner, activation: Mapping[str, Any]) -> Any:
    try:
        return program.evaluate(activation)
    except CELEvalError as exc:
        return exc
    except (ValueError, TypeError, ArithmeticError, KeyError) as exc:
        return CELEvalError(str(exc), type(exc), exc.args)


def _undeclared(result: Any) -> str:
    if isinstance(result, CELEvalError):
        match = _UNDECLARED.search(str(result.args[0]) if result.args else "")
        if match and match[1] != "device":
            return match[1]
    return ""


def _outcome(result: Any) -> Outcome:
    if isinstance(result, CELEvalError):
        return Outcome(False, _message(result))
    if not isinstance(result, celtypes.BoolType):
        return Outcome(False, f"expression returned {type(result).__name__}, not bool")
    return Outcome(bool(result))


def _message(error: CELEvalError) -> str:
    """celpy's message in cel-go's words, as Kubernetes prints them."""
    text = str(error.args[0]) if error.args else "evaluation error"
    if text == "return error for overflow" and len(error.args) > 2 and error.args[2]:
        return str(error.args[2][0])  # a library function refused its argument; say why
    if match := _NO_MEMBER.search(text):
        return f"no such key: {match[1]}"
    if text == "no such key" and len(error.args) > 2 and error.args[2]:
        return f"no such key: {error.args[2][0]}"
    if "no matching overload" in text or "no such overload" in text:
        return "no such overload"
    if match := _UNDECLARED.search(text):
        return f"undeclared reference to '{match[1]}'"
    return text


def _value(raw: Mapping[str, Any]) -> Any:
    kind, value = next(iter(raw.items()))
    match kind:
        case "int":
            return celtypes.IntType(int(value))
        case "bool":
            return celtypes.BoolType(bool(value))
        case "string":
            return celtypes.StringType(str(value))
        case "version":
            return cellib.Semver(str(value))
        case "ints" | "bools" | "strings" | "versions":
            return celtypes.ListType([_value({kind[:-1]: v}) for v in value or ()])
    raise ValueError(f"unknown attribute type {kind}")


def _activation(device: Device) -> dict[str, Any]:
    attributes: dict[Any, dict[Any, Any]] = {}
    for qualified, raw in device.attributes.items():
        domain, _, name = qualified.rpartition("/")
        try:
            value = _value(raw)
        except (ValueError, StopIteration):
            continue  # an attribute of a type this version does not know is not visible
        attributes.setdefault(celtypes.StringType(domain), {})[celtypes.StringType(name)] = value
    capacity: dict[Any, dict[Any, Any]] = {}
    for qualified, raw in device.capacity.items():
        domain, _, name = qualified.rpartition("/")
        try:
            amount = cellib.Quantity(str(raw.get("value")))
        except ValueError:
            continue
        capacity.setdefault(celtypes.StringType(domain), {})[celtypes.StringType(name)] = amount
    fields: dict[Any, Any] = {
        celtypes.StringType("driver"): celtypes.StringType(device.driver),
        celtypes.StringType("attributes"): _domains(attributes),
        celtypes.StringType("capacity"): _domains(capacity),
        celtypes.StringType("allowMultipleAllocations"): celtypes.BoolType(
            device.multiple_allocations
        ),
    }
    return {"device": celtypes.MapType(fields)}


def _domains(values: dict[Any, dict[Any, Any]]) -> _Domains:
    return _Domains({domain: celtypes.MapType(names) for domain, names in values.items()})


_PROBE = Device(driver="probe.invalid", pool="probe", name="probe", attributes={}, capacity={})


def _fingerprint(device: Device) -> tuple[Any, ...]:
    """What selectors see of a device, as text: the same content in another order only costs
    a cache miss."""
    return (
        device.driver,
        device.multiple_allocations,
        repr(device.attributes),
        repr(device.capacity),
    )


class SelectorCache:
    """Selector outcomes per expression and device content, for one allocation run or many."""

    def __init__(self) -> None:
        self._outcomes: dict[tuple[str, tuple[Any, ...]], Outcome] = {}
        self._fingerprints: dict[int, tuple[Device, tuple[Any, ...]]] = {}

    def fingerprint(self, device: Device) -> tuple[Any, ...]:
        entry = self._fingerprints.get(id(device))
        if entry is None or entry[0] is not device:
            entry = self._fingerprints[id(device)] = (device, _fingerprint(device))
        return entry[1]

    def evaluate(self, expression: str, device: Device) -> Outcome:
        key = (expression, self.fingerprint(device))
        outcome = self._outcomes.get(key)
        if outcome is None:
            outcome = self._outcomes[key] = evaluate(expression, device)
        return outcome
