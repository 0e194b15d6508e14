"""The device backends, by the name a node's own configuration gives them (`--backend`).

Each name maps to its vendor package's `Vendor` object, which bundles every part an agent
needs (discovery's backend loader, the health monitor, the partition manager, the CDI edits
and their allowlist rules, the device-plugin resource names). Every agent reaches vendor code
through this table only; `tests/unit/shared/test_vendor_registry.py` holds the agents to it.
A name outside it is a configuration error: the agent exits with code 2.
"""

from __future__ import annotations

from collections.abc import Mapping
from types import MappingProxyType

from shared.errors import ConfigError
from shared.vendors import ascend, nvidia, sim
from shared.vendors.parts.vendor import Vendor

__all__ = ["BACKENDS", "NAMES", "Vendor", "require"]

BACKENDS: Mapping[str, Vendor] = MappingProxyType(
    {vendor.name: vendor for vendor in (sim.VENDOR, nvidia.VENDOR, ascend.VENDOR)}
)
NAMES: tuple[str, ...] = tuple(BACKENDS)
"""The accepted `--backend` (health: `--monitor`) values, in documentation order."""


def require(name: str, *, field: str = "backend") -> Vendor:
    """The backend called `name`; ConfigError (exit 2) naming the accepted ones otherwise."""
    try:
        return BACKENDS[name]
    except KeyError:
        shown = name if len(name) <= 64 else name[:64] + "…"
        raise ConfigError(
            f"{field.replace('_', ' ')} {shown!r} is not one of {', '.join(NAMES)}", field=field
        ) from None
