"""Claim constraints `matchAttribute` and `distinctAttribute`, kept as devices are picked (pure).

A constraint applies to the requests it names (a request, or `request/subrequest` for one
alternative), or to all when it names none. `matchAttribute`: every device of those requests
has the attribute, all with the same value; `distinctAttribute`: every device has it, all with
different values. A device without the attribute never satisfies either. Constraints are
monotonic, so the search checks each device as it is added and undoes it on backtracking.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from services.allocator.device import Device
from services.allocator.errors import ClaimError

__all__ = ["Constraint"]


class Constraint:
    def __init__(self, raw: Mapping[str, Any], *, index: int) -> None:
        self.index = index
        self.requests = frozenset(str(r) for r in raw.get("requests") or ())
        match, distinct = raw.get("matchAttribute"), raw.get("distinctAttribute")
        if not match and not distinct:
            raise ClaimError(
                f"constraint #{index}: empty constraint (unsupported constraint type?)"
            )
        self.distinct = not match
        self.attribute = str(match or distinct)
        self._values: dict[tuple[str, Any], int] = {}

    def describe(self) -> str:
        kind = "distinctAttribute" if self.distinct else "matchAttribute"
        scope = f" over {', '.join(sorted(self.requests))}" if self.requests else ""
        return f"{kind} {self.attribute}{scope}"

    def applies(self, request: str, subrequest: str = "") -> bool:
        if not self.requests or request in self.requests:
            return True
        return bool(subrequest) and f"{request}/{subrequest}" in self.requests

    def add(self, request: str, subrequest: str, device: Device) -> bool:
        """Track `device` for the request; False (and nothing tracked) when it conflicts."""
        if not self.applies(request, subrequest):
            return True
        value = device.typed_attribute(self.attribute)
        if value is None:
            return False
        count = self._values.get(value, 0)
        if self.distinct:
            if count:
                return False
        elif self._values and not count:
            return False
        self._values[value] = count + 1
        return True

    def conflict(self, device: Device) -> str:
        """Why `device` cannot join the devices tracked so far (after `add` refused it)."""
        value = device.typed_attribute(self.attribute)
        if value is None:
            return f"the device has no {self.attribute}"
        if self.distinct:
            return f"its {self.attribute} {_shown(value)} is taken"
        others = ", ".join(sorted(_shown(v) for v in self._values))
        return f"its {self.attribute} is {_shown(value)}, the others' {others}"

    def remove(self, request: str, subrequest: str, device: Device) -> None:
        if not self.applies(request, subrequest):
            return
        value = device.typed_attribute(self.attribute)
        if value is not None:
            count = self._values[value] - 1
            if count:
                self._values[value] = count
            else:
                del self._values[value]


def _shown(value: tuple[str, Any]) -> str:
    """An attribute value as the slice writes it: `3`, `a`, `true`, `1.2.0`."""
    kind, raw = value
    if kind == "bool":
        return "true" if raw else "false"
    return str(raw)
