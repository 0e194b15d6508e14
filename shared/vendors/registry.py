"""The device backends, by the name a node's own configuration gives them (`--backend`).

Every agent reaches vendor code through a table keyed by these names (discovery's backend
loaders, the health monitors, the CDI edits and their allowlist, the partition managers, the
device-plugin resource names); `tests/unit/shared/test_vendor_registry.py` holds every table
to this one. A name outside it is a configuration error: the agent exits with code 2.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from types import MappingProxyType

from shared.errors import ConfigError

__all__ = ["BACKENDS", "NAMES", "Backend", "require"]


@dataclass(frozen=True, slots=True, kw_only=True)
class Backend:
    """One backend: the name in configuration and the vendor package that models its devices."""

    name: str
    vendor: str
    """The package under `shared/vendors/` (the sim imitates both vendors' device shapes)."""
    summary: str


BACKENDS: Mapping[str, Backend] = MappingProxyType(
    {
        b.name: b
        for b in (
            Backend(name="sim", vendor="sim", summary="simulated devices from a profile"),
            Backend(name="nvml", vendor="nvidia", summary="NVIDIA GPUs and MIG through NVML"),
            Backend(name="ascend", vendor="ascend", summary="Huawei Ascend NPUs through npu-smi"),
        )
    }
)
NAMES: tuple[str, ...] = tuple(BACKENDS)
"""The accepted `--backend` (health: `--monitor`) values, in documentation order."""


def require(name: str, *, field: str = "backend") -> Backend:
    """The backend called `name`; ConfigError (exit 2) naming the accepted ones otherwise."""
    try:
        return BACKENDS[name]
    except KeyError:
        shown = name if len(name) <= 64 else name[:64] + "…"
        raise ConfigError(
            f"{field.replace('_', ' ')} {shown!r} is not one of {', '.join(NAMES)}", field=field
        ) from None
