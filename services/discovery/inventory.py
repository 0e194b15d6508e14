"""The node inventory: a backend scan as a canonical `drasuite.v1.Inventory` (pure).

Canonical means sorted and deterministic, so that equal content gives equal bytes; the
generation and scan time are not content. No I/O here: callers pass the clock reading.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass

from shared.bus import codec
from shared.pb.drasuite.v1 import inventory_pb2
from shared.vendors.parts.discovery import Scan

__all__ = ["Identity", "build", "content", "digest", "same_content", "successor"]


@dataclass(frozen=True, slots=True, kw_only=True)
class Identity:
    """Whose inventory it is."""

    driver: str
    node: str
    pool: str
    backend: str


def build(scan: Scan, *, identity: Identity, scanned_unix_ms: int) -> inventory_pb2.Inventory:
    """The canonical inventory of one scan, at generation 0 (see `successor`)."""
    devices = sorted((_canonical_device(d) for d in scan.devices), key=lambda d: d.name)
    counters = sorted(scan.shared_counters, key=lambda c: c.name)
    return inventory_pb2.Inventory(
        driver=identity.driver,
        node=identity.node,
        pool=identity.pool,
        backend=identity.backend,
        devices=devices,
        shared_counters=counters,
        generation=0,
        scanned_unix_ms=scanned_unix_ms,
    )


def _canonical_device(device: inventory_pb2.Device) -> inventory_pb2.Device:
    copy = inventory_pb2.Device()
    copy.CopyFrom(device)
    consumptions = sorted(copy.consumes_counters, key=lambda c: c.counter_set)
    del copy.consumes_counters[:]
    copy.consumes_counters.extend(consumptions)
    # Device node order is kept: it is the order the container sees them in.
    return copy


def content(inventory: inventory_pb2.Inventory) -> bytes:
    """Deterministic bytes of everything but the generation and the scan time."""
    copy = inventory_pb2.Inventory()
    copy.CopyFrom(inventory)
    copy.generation = 0
    copy.scanned_unix_ms = 0
    return codec.encode(copy)


def digest(inventory: inventory_pb2.Inventory) -> str:
    """A short content hash, for logs and cheap comparison."""
    return hashlib.sha256(content(inventory)).hexdigest()[:16]


def same_content(a: inventory_pb2.Inventory | None, b: inventory_pb2.Inventory | None) -> bool:
    if a is None or b is None:
        return a is b
    return content(a) == content(b)


def successor(
    previous: inventory_pb2.Inventory | None,
    current: inventory_pb2.Inventory,
    *,
    floor: int = 0,
) -> inventory_pb2.Inventory | None:
    """`current` with the next generation, or None when its content equals `previous`.

    Generations start at 1 and grow by one per real change, whatever the scan times are;
    `floor` is a generation already used elsewhere (a KV value since lost), never to reuse.
    """
    if previous is not None and same_content(previous, current):
        return None
    following = inventory_pb2.Inventory()
    following.CopyFrom(current)
    following.generation = max(previous.generation if previous is not None else 0, floor) + 1
    return following
