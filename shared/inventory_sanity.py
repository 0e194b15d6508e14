"""Whether a node's inventory read from the bus may replace the last good one (pure).

An empty inventory, or a generation that goes back or is reused for other content, is damaged
or forged: the reader keeps the last good inventory. The discovery agent bumps the generation by
one on every change, so neither happens in normal operation. A reader whose rules depend on the
backend (the allocation agent picks its allowlist of container edits by it) also refuses an
inventory naming another backend than the last good one: a node does not change its hardware
backend while its agents run. Shared by the allocation and health agents.
"""

from __future__ import annotations

from shared.pb.drasuite.v1 import inventory_pb2

__all__ = ["REASONS", "problem"]

REASONS = ("empty", "generation_backwards", "generation_reused", "backend_changed")


def _content(inventory: inventory_pb2.Inventory) -> bytes:
    """Everything but the generation and the scan time."""
    copy = inventory_pb2.Inventory()
    copy.CopyFrom(inventory)
    copy.generation = 0
    copy.scanned_unix_ms = 0
    return copy.SerializeToString(deterministic=True)


def problem(
    inventory: inventory_pb2.Inventory,
    *,
    last: inventory_pb2.Inventory | None,
    same_backend: bool = False,
) -> str | None:
    """Why `inventory` must not replace `last` (one of `REASONS`), or None when it may.

    `same_backend`: also refuse a change of backend (`backend_changed`).
    """
    if not inventory.devices:
        return "empty"
    if last is None:
        return None
    if same_backend and inventory.backend != last.backend:
        return "backend_changed"
    if inventory.generation < last.generation:
        return "generation_backwards"
    if inventory.generation == last.generation and _content(inventory) != _content(last):
        return "generation_reused"
    return None
