"""Allocation results, and what other claims' allocations already hold (pure).

A result is one device (or one share of a multi-allocatable device) for one request, as
written in `status.allocation.devices.results`. Other claims hold their devices whole, except
admin-access results, which hold nothing, and shares, which hold the capacity they consumed
(and, once per device, its counters).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from decimal import Decimal
from typing import Any

from services.allocator.device import DeviceKey, qualify
from shared import quantity

__all__ = ["AllocationResult", "Holdings", "allocated_results", "claim_ref"]

Obj = dict[str, Any]


def claim_ref(claim: Mapping[str, Any]) -> str:
    """`namespace/name` (or `name`), as kube-scheduler names a claim in messages."""
    meta = claim.get("metadata") or {}
    name = str(meta.get("name") or "<unnamed>")
    return f"{meta['namespace']}/{name}" if meta.get("namespace") else name


@dataclass(frozen=True, slots=True)
class AllocationResult:
    request: str
    driver: str
    pool: str
    device: str
    share_id: str | None = None
    consumed_capacity: Mapping[str, str] | None = None
    """Published capacity name -> quantity; only for shares of multi-allocatable devices."""
    admin_access: bool = False
    tolerations: tuple[Obj, ...] = ()
    claim: str = ""
    """The claim holding it (`namespace/name`), for results read from other claims."""

    @property
    def key(self) -> DeviceKey:
        return (self.driver, self.pool, self.device)

    def as_json(self) -> Obj:
        result: Obj = {
            "request": self.request,
            "driver": self.driver,
            "pool": self.pool,
            "device": self.device,
        }
        if self.admin_access:
            result["adminAccess"] = True
        if self.tolerations:
            result["tolerations"] = [dict(t) for t in self.tolerations]
        if self.share_id is not None:
            result["shareID"] = self.share_id
        if self.consumed_capacity is not None:
            result["consumedCapacity"] = dict(self.consumed_capacity)
        return result


def allocated_results(claims: Iterable[Obj]) -> list[AllocationResult]:
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
                    admin_access=bool(raw.get("adminAccess")),
                    claim=claim_ref(claim),
                )
            )
    return results


@dataclass(slots=True)
class Holdings:
    """What other claims hold: devices allocated whole (-> the claim), and per shared device
    the capacity its shares consume (fully qualified names)."""

    whole: dict[DeviceKey, str] = field(default_factory=dict)
    shared: dict[DeviceKey, dict[str, Decimal]] = field(default_factory=dict)
    _by_pool: dict[tuple[str, ...], list[DeviceKey]] | None = field(
        default=None, repr=False, compare=False
    )

    @classmethod
    def of(cls, results: Sequence[AllocationResult]) -> Holdings:
        holdings = cls()
        for result in results:
            if result.admin_access:
                continue  # admin access never makes a device unavailable to others
            if result.share_id is None:
                holdings.whole.setdefault(result.key, result.claim or "another claim")
                continue
            consumed = holdings.shared.setdefault(result.key, {})
            for name, amount in (result.consumed_capacity or {}).items():
                qualified = qualify(name, result.driver)
                try:
                    value = quantity.parse(str(amount))
                except ValueError:
                    continue
                consumed[qualified] = consumed.get(qualified, Decimal(0)) + value
        return holdings

    def without(self, claim: str) -> Holdings:
        """The holdings as if `claim` released what it holds whole."""
        return Holdings(
            whole={k: v for k, v in self.whole.items() if v != claim}, shared=self.shared
        )

    def held_devices(self, pools: Iterable[tuple[str, str]] | None = None) -> list[DeviceKey]:
        """The devices held, all or those of `pools` ((driver, pool) pairs)."""
        if pools is None:
            return [*self.whole, *self.shared]
        if self._by_pool is None:
            self._by_pool = {}
            for key in [*self.whole, *self.shared]:
                self._by_pool.setdefault(key[:2], []).append(key)
        return [key for pool in pools for key in self._by_pool.get(pool, ())]
