"""What a device monitor reports: per device, healthy, a fault, or not observable (pure).

Monitors produce `Observations` (the complete current view of a node's devices); the policy
consumes them. Plain values only: no I/O, no clocks.
"""

from __future__ import annotations

from dataclasses import dataclass, field

__all__ = ["Fault", "Observation", "Observations"]


@dataclass(frozen=True, slots=True, kw_only=True)
class Fault:
    """A device fault as a monitor saw it."""

    cause: str
    """Machine-readable cause, e.g. "xid", "ecc", "injected"; becomes the taint key's name."""
    code: str = ""
    """Cause-specific code, e.g. an XID number; becomes the taint value."""
    message: str = ""
    """Human-readable detail."""
    origin: tuple[tuple[str, str], ...] = field(default=(), compare=False)
    """Trace-context headers of the request that reported the fault (W3C `traceparent`...),
    so that its evaluation continues the caller's trace; not part of the fault's identity."""


@dataclass(frozen=True, slots=True, kw_only=True)
class Observation:
    device: str
    fault: Fault | None = None
    """None: the device looks healthy."""
    unknown: bool = False
    """The monitor could not look at the device (it failed or hung); `fault` is then ignored."""
    origin: tuple[tuple[str, str], ...] = field(default=(), compare=False)
    """Trace-context headers of the last report about the device (a fault or its clear), so
    that a recovery continues the trace of the clear that caused it."""


@dataclass(frozen=True, slots=True, kw_only=True)
class Observations:
    """A monitor's complete view of one node's devices; a device absent here left the node."""

    pool: str
    devices: tuple[Observation, ...] = ()
