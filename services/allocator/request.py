"""A claim's requests as the allocator works through them (pure).

Each top-level request has one or more alternatives: the request itself (`exactly`) or its
`firstAvailable` subrequests, tried in order. An alternative names its device class (whose
selectors come first), its own selectors, ExactCount with a count or All, admin access, the
tolerations of device taints and the capacity it asks for. Reading a claim checks what the API
server and the allocator refuse before looking at any device: an unknown device class, a
selector that does not compile, an empty constraint.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from decimal import Decimal
from typing import Any

from services.allocator import capacity, selector
from services.allocator.constraint import Constraint
from services.allocator.errors import CELCompileError, ClaimError, DeviceClassNotFoundError
from services.allocator.result import claim_ref

__all__ = ["Alternative", "ClaimSpec", "Request", "read_claim"]

Obj = dict[str, Any]


@dataclass(frozen=True, slots=True)
class Alternative:
    request: str
    """The top-level request's name."""
    subrequest: str
    """The subrequest's name; "" for an `exactly` request."""
    device_class: str
    class_selectors: tuple[str, ...]
    selectors: tuple[str, ...]
    all_devices: bool = False
    count: int = 1
    admin_access: bool = False
    tolerations: tuple[Obj, ...] = ()
    capacity: Mapping[str, Decimal] = field(default_factory=dict)

    @property
    def name(self) -> str:
        """The name results carry: `request` or `request/subrequest`."""
        return f"{self.request}/{self.subrequest}" if self.subrequest else self.request


@dataclass(frozen=True, slots=True)
class Request:
    name: str
    alternatives: tuple[Alternative, ...]


@dataclass(frozen=True, slots=True)
class ClaimSpec:
    ref: str
    requests: tuple[Request, ...]
    constraints: tuple[Mapping[str, Any], ...]

    def fresh_constraints(self) -> list[Constraint]:
        """Constraint trackers for one allocation attempt."""
        return [Constraint(raw, index=i) for i, raw in enumerate(self.constraints)]


def read_claim(claim: Mapping[str, Any], classes: Mapping[str, Obj]) -> ClaimSpec:
    """The claim's requests and constraints; ClaimError when it cannot be allocated as written."""
    ref = claim_ref(claim)
    devices = ((claim.get("spec") or {}).get("devices")) or {}
    requests = []
    for raw in devices.get("requests") or []:
        name = str(raw.get("name") or "")
        options = raw.get("firstAvailable")
        if options:
            alternatives = tuple(
                _alternative(ref, name, str(o.get("name") or ""), o, classes) for o in options
            )
        elif raw.get("exactly") is not None:
            alternatives = (_alternative(ref, name, "", raw["exactly"], classes),)
        else:
            raise ClaimError(f"claim {ref}, request {name}: neither exactly nor firstAvailable")
        requests.append(Request(name, alternatives))
    constraints = tuple(devices.get("constraints") or ())
    spec = ClaimSpec(ref=ref, requests=tuple(requests), constraints=constraints)
    for i, constraint in enumerate(constraints):
        try:
            Constraint(constraint, index=i)
        except ClaimError as exc:
            raise ClaimError(f"claim {ref}, {exc}") from exc
    return spec


def _alternative(
    ref: str, request: str, subrequest: str, raw: Mapping[str, Any], classes: Mapping[str, Obj]
) -> Alternative:
    label = f"{request}/{subrequest}" if subrequest else request
    class_name = str(raw.get("deviceClassName") or "")
    if not class_name:
        raise ClaimError(f"claim {ref}, request {label}: missing device class name")
    device_class = classes.get(class_name)
    if device_class is None:
        raise DeviceClassNotFoundError(
            f"claim {ref}, request {label}: device class {class_name} not found",
            device_class=class_name,
        )
    class_selectors = _expressions(
        (device_class.get("spec") or {}).get("selectors"), where=f"class {class_name}"
    )
    selectors = _expressions(raw.get("selectors"), where=f"claim {ref}")
    mode = raw.get("allocationMode") or "ExactCount"
    if mode not in ("ExactCount", "All"):
        raise ClaimError(f"claim {ref}, request {label}: unsupported count mode {mode}")
    count = int(raw.get("count") or 1)
    if mode == "ExactCount" and count < 1:
        raise ClaimError(f"claim {ref}, request {label}: count {count} must be at least 1")
    return Alternative(
        request=request,
        subrequest=subrequest,
        device_class=class_name,
        class_selectors=class_selectors,
        selectors=selectors,
        all_devices=mode == "All",
        count=count,
        admin_access=bool(raw.get("adminAccess")),
        tolerations=tuple(dict(t) for t in raw.get("tolerations") or ()),
        capacity=capacity.requested(raw, request=label),
    )


def _expressions(selectors: Any, *, where: str) -> tuple[str, ...]:
    expressions = []
    for i, item in enumerate(selectors or ()):
        expression = ((item or {}).get("cel") or {}).get("expression")
        if not expression:
            raise ClaimError(f"{where}: selector #{i}: CEL expression empty")
        problem = selector.check(str(expression))
        if problem:
            raise CELCompileError(
                f"{where}: selector #{i}: CEL compile error: {problem}", expression=expression
            )
        expressions.append(str(expression))
    return tuple(expressions)
