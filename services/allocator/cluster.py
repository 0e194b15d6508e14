"""The cluster as allocation reads it: the slices (as an Inventory), device classes,
DeviceTaintRules, what other claims hold, and the caches shared by every attempt on it (pure).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from services.allocator import selector, taint
from services.allocator.capacity import Consumption
from services.allocator.device import Device
from services.allocator.exclusion import Exclusion
from services.allocator.pool import Inventory
from services.allocator.result import Holdings, allocated_results, claim_ref

__all__ = ["Cluster"]

Obj = dict[str, Any]


@dataclass(frozen=True, slots=True, kw_only=True)
class Cluster:
    """What allocation reads: the slices (as an Inventory), classes, taint rules, and what
    other claims hold."""

    inventory: Inventory
    classes: Mapping[str, Obj]
    taint_rules: taint.TaintRules = field(default_factory=taint.TaintRules)
    holdings: Holdings = field(default_factory=Holdings)
    cel: selector.SelectorCache = field(default_factory=selector.SelectorCache)
    static: dict[tuple[Any, ...], Exclusion | Consumption] = field(default_factory=dict)
    """Selector and capacity verdicts per request and device content, across attempts."""

    @classmethod
    def build(
        cls,
        *,
        slices: Sequence[Obj],
        classes: Sequence[Obj] | Mapping[str, Obj],
        claims: Sequence[Obj] = (),
        taint_rules: Sequence[Obj] = (),
        without: Mapping[str, Any] | None = None,
    ) -> Cluster:
        """The cluster as read from the API server; `without`: the claim being allocated,
        whose own (earlier) allocation holds nothing."""
        if not isinstance(classes, Mapping):
            classes = {c["metadata"]["name"]: c for c in classes}
        others = [c for c in claims if without is None or not _same_claim(c, without)]
        cel = selector.SelectorCache()

        def selects(expressions: Sequence[str], device: Device) -> bool:
            return all(cel.evaluate(e, device).matches for e in expressions)

        return cls(
            inventory=Inventory(slices),
            classes=classes,
            taint_rules=taint.TaintRules(taint_rules, classes=classes, selects=selects),
            holdings=Holdings.of(allocated_results(others)),
            cel=cel,
        )


def _same_claim(a: Mapping[str, Any], b: Mapping[str, Any]) -> bool:
    uid_a, uid_b = ((x.get("metadata") or {}).get("uid") for x in (a, b))
    if uid_a and uid_b:
        return bool(uid_a == uid_b)
    return claim_ref(a) == claim_ref(b)
