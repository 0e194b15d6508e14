"""Whether a node's inventory read from the bus may replace the last good one (pure).

An empty inventory, or a generation that goes back or is reused for other content, is damaged
or forged: the reader keeps the last good inventory. The discovery agent bumps the generation by
one on every change, so neither happens in normal operation. A reader whose rules depend on the
backend (the allocation agent picks its allowlist of container edits by it) also refuses an
inventory naming another backend than the last good one: a node does not change its hardware
backend while its agents run. Shared by the allocation and health agents.

With signed records (`--bus-signatures`, docs/security.md) a reader also knows whether an
inventory was signed by its key's owner. A signed one may raise the generation by at most
`MAX_GENERATION_STEP` (2^20) over the last good one (`generation_jump`): no discovery agent
changes its inventory a million times between two reads, and a generation near 2^63 would
leave its owner no room. The way back from a wrong high generation taken before signatures
were enforced: a signed inventory replaces an unsigned last one (taken in accept mode, on the
open bus, or the allocation agent's copy on disk) whatever its generation.
"""

from __future__ import annotations

from shared.pb.drasuite.v1 import inventory_pb2

__all__ = ["GENERATION_JUMP", "MAX_GENERATION_STEP", "REASONS", "problem"]

REASONS = ("empty", "generation_backwards", "generation_reused", "backend_changed")
GENERATION_JUMP = "generation_jump"
"""A signed inventory whose generation leaps more than `MAX_GENERATION_STEP` ahead."""
MAX_GENERATION_STEP = 1 << 20


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
    signed: bool = False,
    last_signed: bool = False,
) -> str | None:
    """Why `inventory` must not replace `last` (one of `REASONS`, or `GENERATION_JUMP`), or
    None when it may.

    `same_backend`: also refuse a change of backend (`backend_changed`). `signed`: the owner
    signed `inventory` (bounded jump; it replaces an unsigned `last` whatever its generation);
    `last_signed`: the owner had signed `last`.
    """
    if not inventory.devices:
        return "empty"
    if last is None:
        return None
    if same_backend and inventory.backend != last.backend:
        return "backend_changed"
    if signed and not last_signed:
        return None
    if signed and inventory.generation > last.generation + MAX_GENERATION_STEP:
        return GENERATION_JUMP
    if inventory.generation < last.generation:
        return "generation_backwards"
    if inventory.generation == last.generation and _content(inventory) != _content(last):
        return "generation_reused"
    return None
