"""The devcluster's stand-in for kube-scheduler's DRA plugin: the product allocator
(`services.allocator`) applied to one node's slices, under the names the devcluster uses."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from services.allocator import selector
from services.allocator.allocator import allocate
from services.allocator.device import Device
from services.allocator.errors import SelectorError, UnsatisfiableError
from services.allocator.pool import Inventory
from services.allocator.result import AllocationResult, allocated_results

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


def devices_of(slices: Sequence[dict[str, Any]]) -> list[Device]:
    """Every device of the slices (of each pool's newest generation), in slice-name order."""
    return Inventory(slices).devices()


def matches(expression: str, device: Device) -> bool:
    """Whether the CEL selector selects `device`; SelectorError when it does not compile or
    fails at runtime on the device."""
    problem = selector.check(expression)
    if problem:
        raise SelectorError(f"CEL {expression!r}: {problem}", expression=expression)
    outcome = selector.evaluate(expression, device)
    if outcome.error:
        raise SelectorError(
            f"CEL {expression!r} on device {device.name}: {outcome.error}", expression=expression
        )
    return outcome.matches
