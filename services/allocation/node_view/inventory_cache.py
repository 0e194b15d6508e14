"""The last inventory of this node that the allocation agent saw, kept in memory and on disk.

A prepare never waits on NATS: it resolves devices against this cache. The copy on disk
(`inventory.pb`, binary protobuf) lets a restarted agent prepare while NATS is still down.
Only the inventory watcher writes here. An inventory that fails the sanity rules (`sanity`:
no devices, a generation going backwards or reused for other content) is quarantined: logged,
counted (`dra_inventory_rejected_total`), and the last good inventory stays in force. An
inventory naming another backend than the node's own (`--backend`) is refused the same way,
logged with `security=true` (reason `backend_mismatch`), from the bus and from the disk copy:
the backend picks which vendor's container edits apply, so the bus never gets to choose it.
"""

from __future__ import annotations

import asyncio
from pathlib import Path

import structlog

from services.allocation import instruments
from shared import atomicfile, inventory_sanity
from shared.bus import codec
from shared.errors import MalformedMessageError
from shared.pb.drasuite.v1 import inventory_pb2

__all__ = ["BACKEND_MISMATCH", "InventoryCache"]

log = structlog.get_logger(__name__)

BACKEND_MISMATCH = "backend_mismatch"
"""The `reason` of an inventory naming another backend than the node's own."""


class InventoryCache:
    def __init__(self, path: Path, *, driver: str, node: str, backend: str) -> None:
        self.path = path
        self.driver = driver
        self.node = node
        self.backend = backend
        self._inventory: inventory_pb2.Inventory | None = None
        self._encoded = b""
        # Whether its owner signed the inventory in force (never for the copy on disk).
        self._signed = False

    @property
    def current(self) -> inventory_pb2.Inventory | None:
        return self._inventory

    def device_names(self) -> list[str]:
        return [device.name for device in self._inventory.devices] if self._inventory else []

    def load(self) -> None:
        """Read the copy on disk, if any; an unreadable copy is ignored (NATS will refill)."""
        # A killed writer's temp copy; another instance (rolling update) may be writing right
        # now, so only copies older than any write could take.
        for leftover in atomicfile.remove_temporaries(self.path, older_than_s=60):
            log.warning("temporary_file_removed", path=str(leftover))
        try:
            data = self.path.read_bytes()
        except FileNotFoundError:
            return
        try:
            inventory = codec.decode(inventory_pb2.Inventory, data, subject=str(self.path))
        except MalformedMessageError as exc:
            log.error("inventory_copy_unreadable", path=str(self.path), error=str(exc))
            return
        if self._accept(inventory):
            self._inventory, self._encoded = inventory, codec.encode(inventory)
            log.info("inventory_loaded", devices=len(inventory.devices), source="disk")

    async def update(self, inventory: inventory_pb2.Inventory, *, signed: bool = False) -> bool:
        """Adopt `inventory` and persist it; returns False when nothing changed or it is foreign.
        `signed`: its owner signed it (`inventory_sanity`)."""
        if not self._accept(inventory):
            return False
        encoded = codec.encode(inventory)
        if encoded == self._encoded:
            self._signed = self._signed or signed
            return False
        if (
            reason := inventory_sanity.problem(
                inventory,
                last=self._inventory,
                same_backend=True,
                signed=signed,
                last_signed=self._signed,
            )
        ) is not None:
            instruments.INVENTORY_REJECTED.add(1, {"reason": reason})
            log.warning(
                "inventory_quarantined",
                reason=reason,
                generation=inventory.generation,
                kept_generation=self._inventory.generation if self._inventory else None,
                devices=len(inventory.devices),
            )
            return False
        # Disk first, memory second: once an inventory is served it also survives a restart.
        try:
            await asyncio.to_thread(atomicfile.write_atomic, self.path, encoded)
        except OSError as exc:
            # Serving from memory still works; only a restart with NATS down would suffer.
            log.warning("inventory_persist_failed", path=str(self.path), error=str(exc))
        self._inventory, self._encoded, self._signed = inventory, encoded, signed
        log.info(
            "inventory_updated", devices=len(inventory.devices), generation=inventory.generation
        )
        return True

    def _accept(self, inventory: inventory_pb2.Inventory) -> bool:
        if inventory.driver != self.driver or inventory.node != self.node:
            log.warning(
                "inventory_ignored",
                reason="foreign driver or node",
                driver=inventory.driver[:64],
                node=inventory.node[:64],
            )
            return False
        if inventory.backend != self.backend:
            instruments.INVENTORY_REJECTED.add(1, {"reason": BACKEND_MISMATCH})
            log.warning(
                "inventory_refused",
                security=True,
                reason=BACKEND_MISMATCH,
                backend=inventory.backend[:32],
                own_backend=self.backend,
                generation=inventory.generation,
            )
            return False
        return True
