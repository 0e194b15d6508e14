"""Shared counters (DRAPartitionableDevices) as kube-scheduler's allocator keeps them (pure).

A pool's counter sets are the `sharedCounters` of its current slices: on 1.34 they sit in the
slices of the devices that consume them, on 1.35+ in slices of their own. The pool is invalid,
every device of it unallocatable, when two of its slices name the same counter set, or when
one of its devices consumes from a counter set, or a counter, that the pool does not have.

A device's `consumesCounters` are taken while it is allocated, by another claim or by the
claim being allocated, once however many shares of it are allocated. A candidate fits when no
counter it consumes would go above the set's value.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from decimal import Decimal
from typing import Any

from shared import quantity

__all__ = ["CounterLedger", "Counters"]

Obj = dict[str, Any]
PoolKey = tuple[str, str]
DeviceKey = tuple[str, str, str]
CounterKey = tuple[str, str, str, str]
"""(driver, pool name, counter set, counter)."""


class Counters:
    """The counter sets of every pool of `slices` (current slices only) and their consumers."""

    def __init__(self, slices: Sequence[Obj]) -> None:
        self._sets: set[tuple[str, str, str]] = set()
        self.totals: dict[CounterKey, Decimal] = {}
        self.consumes: dict[DeviceKey, dict[CounterKey, Decimal]] = {}
        self.problems: dict[PoolKey, str] = {}
        for item in slices:
            self._add_sets(item)
        for item in slices:
            self._add_consumers(item)

    def problem(self, driver: str, pool: str) -> str:
        """Why the pool's devices cannot be allocated; "" when they can."""
        return self.problems.get((driver, pool), "")

    def ledger(self, held: Iterable[DeviceKey] = ()) -> CounterLedger:
        """A ledger starting from the devices other claims hold."""
        return CounterLedger(self, held)

    def _invalid(self, pool: PoolKey, problem: str) -> None:
        self.problems.setdefault(pool, problem)  # the first problem found, as upstream

    def _add_sets(self, item: Obj) -> None:
        driver, pool = key = (item["spec"]["driver"], item["spec"]["pool"]["name"])
        for counter_set in item["spec"].get("sharedCounters") or []:
            name = counter_set["name"]
            if (driver, pool, name) in self._sets:
                self._invalid(key, f"duplicate counter set name {name}")
                continue
            self._sets.add((driver, pool, name))
            for counter, value in (counter_set.get("counters") or {}).items():
                amount = self._quantity(key, value, f"counter {counter} of counter set {name}")
                self.totals[(driver, pool, name, counter)] = amount

    def _add_consumers(self, item: Obj) -> None:
        driver, pool = key = (item["spec"]["driver"], item["spec"]["pool"]["name"])
        for device in item["spec"].get("devices") or []:
            consumes: dict[CounterKey, Decimal] = {}
            for consumption in device.get("consumesCounters") or []:
                name = consumption["counterSet"]
                for counter, value in (consumption.get("counters") or {}).items():
                    ref = (driver, pool, name, counter)
                    if ref not in self.totals:
                        self._invalid(key, self._missing(key, name, counter, device["name"]))
                        continue
                    amount = self._quantity(key, value, f"{device['name']} consuming {counter}")
                    consumes[ref] = consumes.get(ref, Decimal(0)) + amount
            if consumes:
                self.consumes[(driver, pool, device["name"])] = consumes

    def _missing(self, pool: PoolKey, counter_set: str, counter: str, device: str) -> str:
        if (*pool, counter_set) in self._sets:
            return f"counter {counter} not found in counter set {counter_set} (device {device})"
        return f"counter set {counter_set} not found (device {device})"

    def _quantity(self, pool: PoolKey, value: Any, what: str) -> Decimal:
        raw = value.get("value") if isinstance(value, Mapping) else None
        try:
            return quantity.parse(str(raw))
        except ValueError:
            self._invalid(pool, f"{what}: {raw!r} is not a quantity")
            return Decimal(0)


class CounterLedger:
    """What is taken of each counter while a claim is being allocated; `take`/`give` pair
    up as the search goes forward and backtracks."""

    def __init__(self, counters: Counters, held: Iterable[DeviceKey]) -> None:
        self._counters = counters
        self._holders: dict[DeviceKey, int] = {}
        self._used: dict[CounterKey, Decimal] = {}
        for key in set(held):
            self.take(key)

    def shortage(self, device: DeviceKey) -> str:
        """ "" when `device` fits; else which counter it would overcommit."""
        wanted = self._counters.consumes.get(device)
        if not wanted or self._holders.get(device):
            return ""  # another share of a device whose counters are already taken
        for counter, amount in wanted.items():
            used = self._used.get(counter, Decimal(0))
            total = self._counters.totals[counter]
            if used + amount > total:
                free = quantity.exact(total - used)
                return (
                    f"counter {counter[3]} of counter set {counter[2]} exhausted "
                    f"(needs {quantity.exact(amount)}, {free} free)"
                )
        return ""

    def take(self, device: DeviceKey) -> None:
        count = self._holders.get(device, 0)
        self._holders[device] = count + 1
        if count == 0:
            for counter, amount in self._counters.consumes.get(device, {}).items():
                self._used[counter] = self._used.get(counter, Decimal(0)) + amount

    def give(self, device: DeviceKey) -> None:
        count = self._holders[device] - 1
        if count:
            self._holders[device] = count
            return
        del self._holders[device]
        for counter, amount in self._counters.consumes.get(device, {}).items():
            self._used[counter] -= amount

    def used(self) -> Mapping[CounterKey, Decimal]:
        return self._used
