"""Shared counters (DRAPartitionableDevices) for the devcluster scheduler, as kube-scheduler's
structured allocator keeps them (pure).

A pool is the slices of one driver and pool name; only its newest `spec.pool.generation`
counts (older slices are outdated and ignored, devices and counter sets alike). Its counter
sets are the `sharedCounters` of all those slices: on 1.34 they sit in the slices of the
devices that consume them, on 1.35+ in slices of their own. A pool is unusable, every
device of it unallocatable, when two of its slices name the same counter set, or when one of
its devices consumes from a counter set, or a counter, that the pool does not have.

A device's `consumesCounters` are taken from its sets while it is allocated: by another claim
(`in_use`) or by the claim being allocated. A candidate fits when no counter it consumes would
go above the set's value. A device counts once however many shares of it are allocated.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from decimal import Decimal
from typing import Any

from services.devcluster import capacity as quantities

__all__ = ["Counters", "current_slices"]

Obj = dict[str, Any]
PoolKey = tuple[str, str]
"""(driver, pool name)."""
DeviceKey = tuple[str, str, str]
"""(driver, pool name, device name)."""
CounterKey = tuple[str, str, str, str]
"""(driver, pool name, counter set, counter)."""


def _pool_of(item: Obj) -> PoolKey:
    spec = item["spec"]
    return (spec["driver"], spec["pool"]["name"])


def _generation(item: Obj) -> int:
    return int(item["spec"]["pool"].get("generation") or 0)


def current_slices(slices: Sequence[Obj]) -> list[Obj]:
    """The slices of each pool's newest generation, in the order given."""
    newest: dict[PoolKey, int] = {}
    for item in slices:
        pool = _pool_of(item)
        newest[pool] = max(newest.get(pool, _generation(item)), _generation(item))
    return [item for item in slices if _generation(item) == newest[_pool_of(item)]]


class Counters:
    """The counter sets of every pool of `slices`, and what the devices of `in_use` take."""

    def __init__(self, slices: Sequence[Obj], in_use: Iterable[DeviceKey] = ()) -> None:
        self._sets: set[tuple[str, str, str]] = set()
        self._totals: dict[CounterKey, Decimal] = {}
        self._consumes: dict[DeviceKey, dict[CounterKey, Decimal]] = {}
        self._problems: dict[PoolKey, str] = {}
        current = current_slices(slices)
        for item in current:
            self._add_sets(item)
        for item in current:
            self._add_consumers(item)
        self._held = {key for key in set(in_use) if key in self._consumes}
        self._used = self._sum(self._held)

    def problem(self, driver: str, pool: str) -> str:
        """Why the pool's devices cannot be allocated; "" when they can."""
        return self._problems.get((driver, pool), "")

    @property
    def problems(self) -> Mapping[PoolKey, str]:
        return self._problems

    def fits(self, device: DeviceKey, chosen: Iterable[DeviceKey]) -> bool:
        """Whether `device` can be allocated besides the devices of `in_use` and `chosen`
        (those picked for the claim so far) without overcommitting a counter."""
        wanted = self._consumes.get(device)
        if not wanted:
            return True
        picked = set(chosen)
        if device in self._held or device in picked:
            return True  # another share of a device whose counters are already taken
        extra = self._sum(picked - self._held)
        return all(
            self._used.get(counter, Decimal(0)) + extra.get(counter, Decimal(0)) + amount
            <= self._totals[counter]
            for counter, amount in wanted.items()
        )

    def _sum(self, devices: Iterable[DeviceKey]) -> dict[CounterKey, Decimal]:
        total: dict[CounterKey, Decimal] = {}
        for device in devices:
            for counter, amount in self._consumes.get(device, {}).items():
                total[counter] = total.get(counter, Decimal(0)) + amount
        return total

    def _invalid(self, pool: PoolKey, problem: str) -> None:
        self._problems.setdefault(pool, problem)  # the first problem found, as upstream

    def _add_sets(self, item: Obj) -> None:
        driver, pool = key = _pool_of(item)
        for counter_set in item["spec"].get("sharedCounters") or []:
            name = counter_set["name"]
            if (driver, pool, name) in self._sets:
                self._invalid(key, f"duplicate counter set name {name}")
                continue
            self._sets.add((driver, pool, name))
            for counter, value in (counter_set.get("counters") or {}).items():
                amount = self._quantity(key, value, f"counter {counter} of counter set {name}")
                self._totals[(driver, pool, name, counter)] = amount

    def _add_consumers(self, item: Obj) -> None:
        driver, pool = key = _pool_of(item)
        for device in item["spec"].get("devices") or []:
            consumes: dict[CounterKey, Decimal] = {}
            for consumption in device.get("consumesCounters") or []:
                name = consumption["counterSet"]
                for counter, value in (consumption.get("counters") or {}).items():
                    ref = (driver, pool, name, counter)
                    if ref not in self._totals:
                        self._invalid(key, self._missing(key, name, counter, device["name"]))
                        continue
                    amount = self._quantity(key, value, f"{device['name']} consuming {counter}")
                    consumes[ref] = consumes.get(ref, Decimal(0)) + amount
            if consumes:
                self._consumes[(driver, pool, device["name"])] = consumes

    def _missing(self, pool: PoolKey, counter_set: str, counter: str, device: str) -> str:
        if (*pool, counter_set) in self._sets:
            return f"counter {counter} not found in counter set {counter_set} (device {device})"
        return f"counter set {counter_set} not found (device {device})"

    def _quantity(self, pool: PoolKey, value: Any, what: str) -> Decimal:
        raw = value.get("value") if isinstance(value, Mapping) else None
        try:
            return quantities.parse(str(raw))
        except ValueError:
            self._invalid(pool, f"{what}: {raw!r} is not a quantity")
            return Decimal(0)
