"""Checks of devices against the ResourceSlice limits of docs/contracts.md §4.1, before publishing
(pure).

A device that breaks a rule is left out of the slices with a clear reason; the rest of the
pool is still published. Attribute names are canonical here: the driver's own domain is
implied, so `sim.dra-suite.io/numaNode` and `numaNode` are the same attribute.
"""

from __future__ import annotations

import re
from collections.abc import Collection, Mapping

from shared import quantity
from shared.pb.drasuite.v1 import inventory_pb2

__all__ = [
    "MAX_ATTRIBUTES_AND_CAPACITIES",
    "MAX_VALUE_LENGTH",
    "attribute_name",
    "check_counter_set",
    "check_device",
]

MAX_ATTRIBUTES_AND_CAPACITIES = 32
MAX_VALUE_LENGTH = 64
_MAX_ID_LENGTH = 32
_MAX_DOMAIN_LENGTH = 63
_MAX_COUNTER_CONSUMPTIONS = 2
_MAX_COUNTERS = 32

_DNS_LABEL = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")
_DNS_SUBDOMAIN = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$")
_C_IDENTIFIER = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
_SEMVER = re.compile(
    r"^(0|[1-9]\d*)\.(0|[1-9]\d*)\.(0|[1-9]\d*)"
    r"(-(0|[1-9]\d*|\d*[a-zA-Z-][0-9a-zA-Z-]*)(\.(0|[1-9]\d*|\d*[a-zA-Z-][0-9a-zA-Z-]*))*)?"
    r"(\+[0-9a-zA-Z-]+(\.[0-9a-zA-Z-]+)*)?$"
)


def attribute_name(key: str, *, driver: str) -> str:
    """The name as published: a name in the driver's own domain loses its domain."""
    domain, sep, ident = key.rpartition("/")
    return ident if sep and domain == driver else key


def _dns_label(value: str) -> bool:
    return len(value) <= 63 and bool(_DNS_LABEL.match(value))


def _qualified_name(key: str) -> str:
    """Why `key` is not a valid QualifiedName, or "" when it is."""
    if key.count("/") > 1:
        return "must not have more than one '/'"
    domain, sep, ident = key.rpartition("/")
    if len(ident) > _MAX_ID_LENGTH or not _C_IDENTIFIER.match(ident):
        return f"name must be a C identifier of at most {_MAX_ID_LENGTH} characters"
    if sep and (len(domain) > _MAX_DOMAIN_LENGTH or not _DNS_SUBDOMAIN.match(domain.lower())):
        return f"domain must be a DNS subdomain of at most {_MAX_DOMAIN_LENGTH} characters"
    return ""


def _attribute_value(value: inventory_pb2.AttributeValue) -> str:
    kind = value.WhichOneof("value")
    if kind is None:
        return "has no value"
    if kind == "string" and len(value.string.encode()) > MAX_VALUE_LENGTH:
        return f"string is longer than {MAX_VALUE_LENGTH} bytes"
    if kind == "version" and (
        len(value.version) > MAX_VALUE_LENGTH or not _SEMVER.match(value.version)
    ):
        return f"version {value.version!r} is not semver 2.0 of at most {MAX_VALUE_LENGTH} bytes"
    return ""


def _attributes(device: inventory_pb2.Device, driver: str) -> list[str]:
    problems: list[str] = []
    seen: dict[str, str] = {}
    for key in sorted(device.attributes):
        name = attribute_name(key, driver=driver)
        if reason := _qualified_name(name):
            problems.append(f"attribute {key!r}: {reason}")
        if reason := _attribute_value(device.attributes[key]):
            problems.append(f"attribute {key!r}: {reason}")
        if name in seen:
            problems.append(f"attributes {seen[name]!r} and {key!r} are the same attribute")
        seen[name] = key
    return problems


def _capacity(device: inventory_pb2.Device) -> list[str]:
    problems: list[str] = []
    for key in sorted(device.capacity):
        if reason := _qualified_name(key):
            problems.append(f"capacity {key!r}: {reason}")
        if not quantity.is_quantity(device.capacity[key]):
            problems.append(f"capacity {key!r}: {device.capacity[key]!r} is not a quantity")
    return problems


def _counters(counters: Mapping[str, str], where: str) -> list[str]:
    problems: list[str] = []
    if len(counters) > _MAX_COUNTERS:
        problems.append(f"{where}: more than {_MAX_COUNTERS} counters")
    for name in sorted(counters):
        if not _dns_label(name):
            problems.append(f"{where}: counter {name!r} is not a DNS label")
        if not quantity.is_quantity(counters[name]):
            problems.append(f"{where}: counter {name!r}: {counters[name]!r} is not a quantity")
    return problems


def _consumptions(device: inventory_pb2.Device, counter_sets: Collection[str]) -> list[str]:
    problems: list[str] = []
    if len(device.consumes_counters) > _MAX_COUNTER_CONSUMPTIONS:
        problems.append(f"consumes more than {_MAX_COUNTER_CONSUMPTIONS} counter sets")
    for consumption in device.consumes_counters:
        where = f"consumesCounters {consumption.counter_set!r}"
        if consumption.counter_set not in counter_sets:
            problems.append(f"{where}: no such counter set in the pool")
        problems += _counters(consumption.counters, where)
    return problems


def check_device(
    device: inventory_pb2.Device, *, driver: str, counter_sets: Collection[str] = ()
) -> list[str]:
    """Every reason `device` cannot be published; empty when it can."""
    problems: list[str] = []
    if not _dns_label(device.name):
        problems.append(f"name {device.name!r} is not a DNS label of at most 63 characters")
    total = len(device.attributes) + len(device.capacity)
    if total > MAX_ATTRIBUTES_AND_CAPACITIES:
        problems.append(
            f"{total} attributes and capacities, more than {MAX_ATTRIBUTES_AND_CAPACITIES}"
        )
    problems += _attributes(device, driver)
    problems += _capacity(device)
    problems += _consumptions(device, counter_sets)
    return problems


def check_counter_set(counter_set: inventory_pb2.CounterSet) -> list[str]:
    """Every reason a shared counter set cannot be published; empty when it can."""
    problems: list[str] = []
    if not _dns_label(counter_set.name):
        problems.append(f"counter set name {counter_set.name!r} is not a DNS label")
    return problems + _counters(counter_set.counters, f"counter set {counter_set.name!r}")
