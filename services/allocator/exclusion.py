"""Why a device was not allocated for a request: the first rule that excluded it (pure)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

__all__ = ["Exclusion", "Rule"]


class Rule:
    """The rules, in the order kube-scheduler's allocator applies them to a device."""

    POOL_INCOMPLETE = "pool-incomplete"
    POOL_INVALID = "pool-invalid"
    ALLOCATED = "allocated"
    """Held by another claim."""
    PICKED = "picked"
    """Already picked for another request of this claim."""
    CLASS_SELECTOR = "class-selector"
    CLAIM_SELECTOR = "claim-selector"
    CEL_ERROR = "cel-error"
    CAPACITY = "capacity"
    COUNTERS = "counters"
    TAINT = "taint"
    CONSTRAINT = "constraint"
    CANDIDATE = "candidate"
    """Passes every rule on its own; the claim fails on too few such devices or elsewhere."""
    SKIPPED = "skipped"
    """An alternative not tried because an earlier one fit."""


@dataclass(frozen=True, slots=True)
class Exclusion:
    rule: str
    message: str
    detail: Mapping[str, Any] = field(default_factory=dict)
    """What a suggested change needs: the claim, taint, selector index or constraint index."""

    def as_json(self) -> dict[str, Any]:
        return {"rule": self.rule, "message": self.message}
