"""A vendor's built-in fault classes: which of its causes and codes are transient or merely
informational, and which codes are no fault at all (pure).

The health agent's rules (`services.health.rules`) start from the union of every vendor's
defaults; a policy file overrides them. Classes are named as the policy file names them
(`fatal`, `transient`, `informational`); a cause or code listed nowhere is fatal.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from types import MappingProxyType

__all__ = ["FAULT_CLASSES", "FaultDefaults"]

FAULT_CLASSES = ("fatal", "transient", "informational")


@dataclass(frozen=True, slots=True, kw_only=True)
class FaultDefaults:
    causes: Mapping[str, str] = field(default_factory=lambda: MappingProxyType({}))
    """Class by cause, e.g. {"npu-restart": "transient"}."""
    codes: Mapping[tuple[str, str], str] = field(default_factory=lambda: MappingProxyType({}))
    """Class by (cause, code); wins over `causes`."""
    ignore: Mapping[str, frozenset[str]] = field(default_factory=lambda: MappingProxyType({}))
    """Codes per cause that are no fault at all (an application's own error, say)."""

    def __post_init__(self) -> None:
        for name in (*self.causes.values(), *self.codes.values()):
            if name not in FAULT_CLASSES:
                raise ValueError(f"fault class {name!r} is not one of {', '.join(FAULT_CLASSES)}")
