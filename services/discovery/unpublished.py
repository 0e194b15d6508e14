"""Devices of the inventory that the node's slices leave out, and why (no I/O).

The slice reconciler `update()`s it with every plan: devices the pre-publish check rejects
(`slices.desired`: a name or value the API would refuse, a size limit of the server's version)
and partitions the server cannot publish (`WITHHELD`). Readers: readiness (a detail line; the
agent stays ready, the rest of the pool is published), the inventory publisher (`mark()` sets
`Device.unpublished` in the NATS inventory, which `dractl inventory` shows), and the drop
report of the reconciler (a Node Event, `dra_slice_devices_dropped_total{reason}`).
"""

from __future__ import annotations

import asyncio
from collections.abc import Collection, Iterable, Mapping
from dataclasses import dataclass
from types import MappingProxyType

from services.discovery.layout import Rejection
from shared.pb.drasuite.v1 import inventory_pb2

__all__ = ["WITHHELD", "Dropped", "Unpublished", "describe"]

WITHHELD = "withheld"
"""A partition, valid in itself, that the server's rules leave out (DRAPartitionableDevices)."""
_WITHHELD_DETAIL = "a partition; the API server cannot publish partitions (gate off)"


@dataclass(frozen=True, slots=True)
class Dropped:
    """One device left out of the slices."""

    device: str
    reason: str
    """`layout.INVALID`, `DUPLICATE`, `OVER_LIMIT` or `WITHHELD`: a metric label."""
    detail: str
    """Every problem, for people."""

    def text(self) -> str:
        return f"{self.device} ({self.reason}: {self.detail})"


def describe(dropped: Collection[Dropped], *, limit: int = 3) -> str:
    """`2 device(s) not published: a (invalid: ...), b (...)`, at most `limit` named."""
    named = ", ".join(d.text() for d in list(dropped)[:limit])
    more = f" and {len(dropped) - limit} more" if len(dropped) > limit else ""
    return f"{len(dropped)} device(s) not published in ResourceSlices: {named}{more}"


class Unpublished:
    """The current set of dropped devices, versioned so that readers can wait for a change."""

    def __init__(self) -> None:
        self._dropped: dict[str, Dropped] = {}
        self.version = 0
        self._changed = asyncio.Event()

    @property
    def current(self) -> Mapping[str, Dropped]:
        """Device name -> why it is left out; read-only."""
        return MappingProxyType(self._dropped)

    def update(
        self,
        rejected: Iterable[Rejection],
        withheld: Iterable[str],
        *,
        devices: Collection[str],
    ) -> list[Dropped]:
        """Replace the set; the devices newly dropped (or for a new reason) are returned.

        `devices`: the inventory's device names; rejected counter sets are not devices.
        """
        found = {
            r.name: Dropped(r.name, r.reason, "; ".join(r.problems))
            for r in rejected
            if r.name in devices
        }
        found |= {name: Dropped(name, WITHHELD, _WITHHELD_DETAIL) for name in withheld}
        new = [d for name, d in sorted(found.items()) if self._dropped.get(name) != d]
        if found != self._dropped:
            self._dropped = found
            self.version += 1
            self._changed.set()
            self._changed = asyncio.Event()
        return new

    async def next(self, *, after: int) -> int:
        """The first version above `after`."""
        while self.version <= after:
            await self._changed.wait()
        return self.version

    def summary(self) -> str | None:
        """The readiness detail: None when every device is published."""
        return describe(self._dropped.values()) if self._dropped else None

    def mark(self, inventory: inventory_pb2.Inventory) -> inventory_pb2.Inventory:
        """`inventory` with `Device.unpublished` set on the dropped devices (a copy if any)."""
        if not self._dropped and not any(d.unpublished for d in inventory.devices):
            return inventory
        marked = inventory_pb2.Inventory()
        marked.CopyFrom(inventory)
        for device in marked.devices:
            dropped = self._dropped.get(device.name)
            device.unpublished = f"{dropped.reason}: {dropped.detail}" if dropped else ""
        return marked
