"""A vendor's device-plugin resource names: which kinds it names, and how (pure)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from shared.pb.drasuite.v1 import inventory_pb2

__all__ = ["PluginNames"]


def _unnamed(_: inventory_pb2.Device) -> str | None:
    return None


@dataclass(frozen=True, slots=True, kw_only=True)
class PluginNames:
    """How the vendor's own device plugin names the devices of `kinds`."""

    kinds: frozenset[str] = frozenset()
    """Kinds named by `name`; any other gets the driver's generic `<driver>/<kind>`."""
    name: Callable[[inventory_pb2.Device], str | None] = _unnamed
    """The resource of one device; None: not offered."""
    whole_devices: frozenset[str] = frozenset()
    """The names of whole devices, which an override of their kind renames."""
