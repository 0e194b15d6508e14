"""What the allocator raises, grouped by what the caller does about it (pure).

```
AllocatorError
├── UnsatisfiableError        no set of devices on the node satisfies the claim: try elsewhere
├── SelectorError             a CEL selector failed at runtime on a device: the node's
│                             allocation stops there, as in kube-scheduler
└── ClaimError                the claim (or its class) cannot be allocated as written: bad input
      ├── DeviceClassNotFoundError   (also an UnsatisfiableError: the scheduler keeps waiting)
      └── CELCompileError            (also a SelectorError)
```
"""

from __future__ import annotations

__all__ = [
    "AllocatorError",
    "CELCompileError",
    "ClaimError",
    "DeviceClassNotFoundError",
    "SelectorError",
    "UnsatisfiableError",
]


class AllocatorError(Exception):
    """Base of the allocator's errors."""


class UnsatisfiableError(AllocatorError):
    """No set of published devices satisfies the claim."""


class SelectorError(AllocatorError):
    """A CEL selector that does not compile, or fails at runtime on a device."""

    def __init__(self, message: str, *, expression: str = "", device: str = "") -> None:
        super().__init__(message)
        self.expression = expression
        self.device = device


class ClaimError(AllocatorError):
    """A claim that cannot be allocated as written, whatever the devices."""


class DeviceClassNotFoundError(ClaimError, UnsatisfiableError):
    def __init__(self, message: str, *, device_class: str) -> None:
        super().__init__(message)
        self.device_class = device_class


class CELCompileError(ClaimError, SelectorError):
    """A selector that does not compile (the API server rejects it when it is written)."""
