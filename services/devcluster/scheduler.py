"""A small structured allocator standing in for kube-scheduler's DRA plugin in the local cluster.

It evaluates DeviceClass and request CEL selectors against published ResourceSlice devices with
the Kubernetes device environment (`device.driver`, `device.attributes[domain].name`,
`device.capacity[domain].name`), and allocates ExactCount requests and `firstAvailable`
subrequests first-fit in slice and device order, honouring `matchAttribute` and
`distinctAttribute` constraints and skipping devices with NoSchedule/NoExecute taints. Not
covered: allocationMode All, admin access and tolerations. A CEL runtime error (e.g. a
missing attribute without `has()`) fails the claim, as in Kubernetes. Only the newest
generation of each pool is looked at.

Shared counters (DRAPartitionableDevices, see `counters`): a device that `consumesCounters`
is allocated only while the counters taken by the devices of `in_use` and of this claim leave
room for it, so a whole GPU and its MIG partitions, or two overlapping partitions, are never
allocated together. A pool whose devices consume from a counter set (or counter) it does not
have is invalid: none of its devices is allocated.

Consumable capacity (DRAConsumableCapacity, resource.k8s.io/v1 in 1.36): a request's
`capacity.requests` must fit a device's capacity. A device with `allowMultipleAllocations`
is shared: each allocation gets a share, with a fresh `shareID` and the `consumedCapacity` of
every capacity of the device, as its `requestPolicy` rounds the request (`validValues`: the
smallest value not below it; `validRange`: at least `min`, up in `step`s from `min`, at most
`max`; unrequested: the policy's `default`, or the whole capacity without a policy). Shares of
one device, in this claim and in `in_use` (other claims' results), never consume more than
its capacity; without `in_use`, other claims are not looked at (devices are not exclusive
across claims).
"""

from __future__ import annotations

import functools
import uuid
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from decimal import Decimal
from typing import Any

import celpy
from celpy import celtypes
from celpy.adapter import json_to_cel
from celpy.celparser import CELParseError
from celpy.evaluation import CELEvalError

from services.devcluster import capacity as quantities
from services.devcluster.counters import Counters, current_slices

__all__ = [
    "AllocationResult",
    "Device",
    "SelectorError",
    "UnsatisfiableError",
    "allocate",
    "allocated_results",
    "devices_of",
    "matches",
]

Obj = dict[str, Any]
_TAINTS_THAT_BLOCK = {"NoSchedule", "NoExecute"}


class SelectorError(Exception):
    """A CEL selector that does not compile, or fails at runtime on a device."""


class UnsatisfiableError(Exception):
    """No set of published devices satisfies the claim."""


@dataclass(frozen=True, slots=True)
class Device:
    driver: str
    pool: str
    name: str
    attributes: Mapping[str, Any]
    """Fully qualified name -> published DeviceAttribute JSON (`{"int": 3}`)."""
    capacity: Mapping[str, Any]
    """Fully qualified name -> published DeviceCapacity JSON (`{"value": "80Gi"}`)."""
    tainted: bool
    multiple_allocations: bool = False
    """`allowMultipleAllocations`: shared by allocations that each consume part of it."""
    capacity_names: Mapping[str, str] = field(default_factory=dict)
    """Fully qualified capacity name -> the name as published (what results carry)."""

    @property
    def key(self) -> tuple[str, str, str]:
        return (self.driver, self.pool, self.name)

    def attribute(self, qualified: str) -> Any:
        value = self.attributes.get(qualified)
        return None if value is None else next(iter(value.values()))


@dataclass(frozen=True, slots=True)
class AllocationResult:
    request: str
    driver: str
    pool: str
    device: str
    share_id: str | None = None
    consumed_capacity: Mapping[str, str] | None = None
    """Published capacity name -> quantity; only for shares of multi-allocatable devices."""

    @property
    def key(self) -> tuple[str, str, str]:
        return (self.driver, self.pool, self.device)

    def as_json(self) -> Obj:
        result: Obj = {
            "request": self.request,
            "driver": self.driver,
            "pool": self.pool,
            "device": self.device,
        }
        if self.share_id is not None:
            result["shareID"] = self.share_id
        if self.consumed_capacity is not None:
            result["consumedCapacity"] = dict(self.consumed_capacity)
        return result


def allocated_results(claims: Sequence[Obj]) -> list[AllocationResult]:
    """The device results of the claims that are allocated (to pass as `in_use`)."""
    results = []
    for claim in claims:
        allocation = (claim.get("status") or {}).get("allocation") or {}
        for raw in (allocation.get("devices") or {}).get("results") or []:
            results.append(
                AllocationResult(
                    request=raw["request"],
                    driver=raw["driver"],
                    pool=raw["pool"],
                    device=raw["device"],
                    share_id=raw.get("shareID"),
                    consumed_capacity=raw.get("consumedCapacity"),
                )
            )
    return results


def devices_of(slices: Sequence[Obj]) -> list[Device]:
    """Every device of the slices (of each pool's newest generation), with attribute names
    qualified by the driver's domain."""
    devices = []
    for item in sorted(current_slices(slices), key=lambda s: s["metadata"].get("name", "")):
        spec = item["spec"]
        driver = spec["driver"]
        for raw in spec.get("devices", []):
            capacity = raw.get("capacity", {})
            devices.append(
                Device(
                    driver=driver,
                    pool=spec["pool"]["name"],
                    name=raw["name"],
                    attributes={
                        _qualify(k, driver): v for k, v in raw.get("attributes", {}).items()
                    },
                    capacity={_qualify(k, driver): v for k, v in capacity.items()},
                    tainted=any(
                        t.get("effect") in _TAINTS_THAT_BLOCK for t in raw.get("taints", [])
                    ),
                    multiple_allocations=bool(raw.get("allowMultipleAllocations")),
                    capacity_names={_qualify(k, driver): k for k in capacity},
                )
            )
    return devices


def _qualify(name: str, driver: str) -> str:
    return name if "/" in name else f"{driver}/{name}"


@functools.cache
def _program(expression: str) -> celpy.Runner:
    env = celpy.Environment()
    try:
        return env.program(env.compile(expression))
    except CELParseError as exc:
        raise SelectorError(f"CEL {expression!r} does not compile: {exc}") from exc


def _activation(device: Device) -> Any:
    attributes: dict[str, dict[str, Any]] = {}
    for qualified, value in device.attributes.items():
        domain, _, name = qualified.rpartition("/")
        attributes.setdefault(domain, {})[name] = next(iter(value.values()))
    capacity: dict[str, dict[str, Any]] = {}
    for qualified, value in device.capacity.items():
        domain, _, name = qualified.rpartition("/")
        capacity.setdefault(domain, {})[name] = value.get("value")
    return json_to_cel(
        {"device": {"driver": device.driver, "attributes": attributes, "capacity": capacity}}
    )


def matches(expression: str, device: Device) -> bool:
    """Whether the CEL selector selects `device`; SelectorError on a runtime error."""
    try:
        result = _program(expression).evaluate(_activation(device))
    except CELEvalError as exc:
        raise SelectorError(f"CEL {expression!r} on device {device.name}: {exc.args[0]}") from exc
    if isinstance(result, CELEvalError):
        raise SelectorError(f"CEL {expression!r} on device {device.name}: {result.args[0]}")
    if not isinstance(result, celtypes.BoolType):
        raise SelectorError(f"CEL {expression!r} returned {type(result).__name__}, not a bool")
    return bool(result)


def _selectors(spec: Mapping[str, Any]) -> list[str]:
    return [s["cel"]["expression"] for s in spec.get("selectors", []) if "cel" in s]


Consumption = Mapping[str, Decimal]
"""Qualified capacity name -> amount a share takes of it."""


@dataclass(frozen=True, slots=True)
class _Choice:
    """One way to satisfy a top-level request: a result name, a count and its candidates."""

    request: str
    result_name: str
    count: int
    candidates: tuple[Device, ...]
    consumption: Mapping[tuple[str, str, str], Consumption] = field(default_factory=dict)
    """Per multi-allocatable candidate: what one share for this request takes of it."""


def _choices(request: Obj, classes: Mapping[str, Obj], devices: list[Device]) -> list[_Choice]:
    options = request.get("firstAvailable") or [dict(request["exactly"], name="")]
    choices = []
    for option in options:
        device_class = classes.get(option["deviceClassName"])
        if device_class is None:
            raise UnsatisfiableError(f"device class {option['deviceClassName']} does not exist")
        expressions = _selectors(device_class["spec"]) + _selectors(option)
        wanted = _requested_capacity(option)
        candidates, consumption = [], {}
        for device in devices:
            if device.tainted or not all(matches(e, device) for e in expressions):
                continue
            if device.multiple_allocations:
                share = _share_consumption(device, wanted)
                if share is None:
                    continue
                consumption[device.key] = share
            elif not _fits_whole(device, wanted):
                continue
            candidates.append(device)
        name = request["name"] + (f"/{option['name']}" if option["name"] else "")
        count = int(option.get("count", 1))
        choices.append(_Choice(request["name"], name, count, tuple(candidates), consumption))
    return choices


def _requested_capacity(option: Obj) -> dict[str, Decimal]:
    """`capacity.requests` of a request, by name as written (qualified later, per device)."""
    requests = (option.get("capacity") or {}).get("requests") or {}
    return {name: quantities.parse(str(amount)) for name, amount in requests.items()}


def _fits_whole(device: Device, wanted: Mapping[str, Decimal]) -> bool:
    """An exclusive device must have every requested capacity, at least as much as asked."""
    for name, amount in wanted.items():
        capacity = device.capacity.get(_qualify(name, device.driver))
        if capacity is None or quantities.parse(str(capacity.get("value"))) < amount:
            return False
    return True


def _share_consumption(device: Device, wanted: Mapping[str, Decimal]) -> Consumption | None:
    """What one share takes of each capacity of a shared device; None when the request
    violates a capacity's policy, exceeds it, or names a capacity the device lacks."""
    requested = {_qualify(name, device.driver): amount for name, amount in wanted.items()}
    if any(name not in device.capacity for name in requested):
        return None
    consumption = {}
    for name, capacity in device.capacity.items():
        total = quantities.parse(str(capacity.get("value")))
        amount = quantities.by_policy(requested.get(name), capacity.get("requestPolicy"), total)
        if amount is None or amount > total:
            return None
        consumption[name] = amount
    return consumption


@dataclass(frozen=True, slots=True)
class _Pick:
    request: str
    """The top-level request the device serves (constraints name top-level requests)."""
    result_name: str
    device: Device
    consumed: Consumption | None = None
    """What the share takes; None for a device allocated whole."""


@dataclass(slots=True)
class _Usage:
    """What other claims hold: devices allocated whole, and shares' consumption per device."""

    whole: set[tuple[str, str, str]] = field(default_factory=set)
    shared: dict[tuple[str, str, str], dict[str, Decimal]] = field(default_factory=dict)

    @classmethod
    def of(cls, in_use: Sequence[AllocationResult], devices: Sequence[Device]) -> _Usage:
        usage = cls()
        by_key = {d.key: d for d in devices}
        for result in in_use:
            device = by_key.get(result.key)
            if result.share_id is None or device is None:
                usage.whole.add(result.key)
                continue
            consumed = usage.shared.setdefault(result.key, {})
            for name, amount in (result.consumed_capacity or {}).items():
                qualified = _qualify(name, device.driver)
                consumed[qualified] = consumed.get(qualified, Decimal(0)) + quantities.parse(
                    str(amount)
                )
        return usage

    def free(self, choice: _Choice, chosen: Sequence[_Pick]) -> list[Device]:
        """The candidates of `choice` still available after `chosen` and other claims."""
        taken_whole = self.whole | {p.device.key for p in chosen if p.consumed is None}
        free = []
        for device in choice.candidates:
            key = device.key
            if key in taken_whole:
                continue
            if not device.multiple_allocations:
                free.append(device)
                continue
            consumed = dict(self.shared.get(key, {}))
            for pick in chosen:
                if pick.device.key == key and pick.consumed is not None:
                    for name, amount in pick.consumed.items():
                        consumed[name] = consumed.get(name, Decimal(0)) + amount
            share = choice.consumption[key]
            if all(
                consumed.get(name, Decimal(0)) + amount
                <= quantities.parse(str(device.capacity[name].get("value")))
                for name, amount in share.items()
            ):
                free.append(device)
        return free


def _new_share_id() -> str:
    return str(uuid.uuid4())


def allocate(
    claim: Obj,
    *,
    classes: Mapping[str, Obj],
    slices: Sequence[Obj],
    in_use: Sequence[AllocationResult] = (),
    share_ids: Callable[[], str] = _new_share_id,
) -> list[AllocationResult]:
    """First-fit allocation of the claim's requests; UnsatisfiableError when none fits.

    `in_use`: results of other claims (`allocated_results`), which hold their devices and
    shares; `share_ids` makes the shareID of each new share (lower-case UUIDs by default).
    """
    devices = devices_of(slices)
    counters = Counters(slices, in_use=[r.key for r in in_use])
    usable = [d for d in devices if not counters.problem(d.driver, d.pool)]
    requests = claim["spec"]["devices"].get("requests", [])
    per_request = [_choices(r, classes, usable) for r in requests]
    constraints = claim["spec"]["devices"].get("constraints", [])
    usage = _Usage.of(in_use, devices)
    for picks in _search(per_request, constraints, chosen=[], usage=usage, counters=counters):
        return [_result(p, share_ids) for p in picks]
    names = ", ".join(r["name"] for r in requests)
    invalid = "".join(
        f"; pool {pool} of {driver} is invalid: {problem}"
        for (driver, pool), problem in sorted(counters.problems.items())
    )
    raise UnsatisfiableError(f"no devices satisfy requests {names} with their constraints{invalid}")


def _result(pick: _Pick, share_ids: Callable[[], str]) -> AllocationResult:
    device = pick.device
    if pick.consumed is None:
        return AllocationResult(pick.result_name, device.driver, device.pool, device.name)
    return AllocationResult(
        pick.result_name,
        device.driver,
        device.pool,
        device.name,
        share_id=share_ids(),
        consumed_capacity={
            device.capacity_names[name]: quantities.as_quantity(amount)
            for name, amount in sorted(pick.consumed.items())
        },
    )


def _search(
    per_request: list[list[_Choice]],
    constraints: list[Obj],
    *,
    chosen: list[_Pick],
    usage: _Usage,
    counters: Counters,
) -> Iterator[list[_Pick]]:
    if not per_request:
        yield chosen
        return
    for choice in per_request[0]:
        free = usage.free(choice, chosen)
        for group in _groups(free, choice, constraints, chosen, counters):
            picks = [
                _Pick(choice.request, choice.result_name, d, choice.consumption.get(d.key))
                for d in group
            ]
            yield from _search(
                per_request[1:], constraints, chosen=chosen + picks, usage=usage, counters=counters
            )


def _groups(
    free: list[Device],
    choice: _Choice,
    constraints: list[Obj],
    chosen: list[_Pick],
    counters: Counters,
) -> Iterator[list[Device]]:
    """Sets of `choice.count` devices, in first-fit order, that keep every constraint and
    leave no shared counter overcommitted."""

    def extend(start: int, group: list[Device]) -> Iterator[list[Device]]:
        if len(group) == choice.count:
            yield list(group)
            return
        for i in range(start, len(free)):
            taken = [p.device.key for p in chosen] + [d.key for d in group]
            if not counters.fits(free[i].key, taken):
                continue
            picks = chosen + [_Pick(choice.request, choice.result_name, d) for d in group]
            picks.append(_Pick(choice.request, choice.result_name, free[i]))
            if all(_holds(c, picks) for c in constraints):
                yield from extend(i + 1, [*group, free[i]])

    yield from extend(0, [])


def _holds(constraint: Obj, picks: list[_Pick]) -> bool:
    """Whether the devices picked so far for the constraint's requests satisfy it."""
    attribute = constraint.get("matchAttribute") or constraint.get("distinctAttribute")
    if not attribute:
        return True
    scope = set(constraint.get("requests") or [])
    # A constraint may name a top-level request or one of its firstAvailable subrequests.
    values = [
        p.device.attribute(attribute)
        for p in picks
        if not scope or p.request in scope or p.result_name in scope
    ]
    if None in values:
        return False  # a device without the attribute never satisfies the constraint
    if "matchAttribute" in constraint:
        return len(set(values)) <= 1
    return len(set(values)) == len(values)
