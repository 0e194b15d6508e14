"""The inventory publisher: puts the node's inventory into the inventory KV, only on change.

The KV value's generation grows by one per content change, continuing from what the KV held
(so a restarted agent with the same devices writes nothing). After a NATS reconnect the value
is read back and rewritten if it was lost. NATS being down is retried with backoff, forever.
"""

from __future__ import annotations

import asyncio

import structlog

from services.discovery import inventory
from services.discovery.scanner import DeviceScanner
from shared import telemetry
from shared.backoff import Backoff
from shared.bus import codec
from shared.bus.connection import Bus
from shared.cancellation import reraise_if_cancelling
from shared.errors import BusUnavailableError, MalformedMessageError
from shared.pb.drasuite.v1 import inventory_pb2

__all__ = ["InventoryPublisher"]

log = structlog.get_logger(__name__)
_MAX_GENERATION = 2**63 - 1


class InventoryPublisher:
    """Keeps `names.inventory_key(driver, node)` equal to the scanner's inventory."""

    def __init__(self, bus: Bus, scanner: DeviceScanner, *, driver: str, node: str) -> None:
        self.bus = bus
        self.scanner = scanner
        self.driver = driver
        self.node = node
        self.key = bus.names.inventory_key(driver, node)
        self.published = asyncio.Event()
        # What the KV holds as far as we know; None until read after a (re)connect.
        self._stored: inventory_pb2.Inventory | None = None
        self._highest = 0

    async def run(self) -> None:
        """Eternal: publish each new inventory, and re-check the KV after every reconnect."""
        backoff = Backoff(initial_s=0.2, max_s=5.0)
        synced_epoch, synced_generation = -1, 0
        while True:
            await self.bus.connected.wait()
            current = self.scanner.current or await self.scanner.next(after=0)
            epoch = self.bus.epoch
            try:
                await self.publish(current, reread=epoch != synced_epoch)
                reraise_if_cancelling()  # nats-py's wait_for may have swallowed a stop
            except BusUnavailableError as exc:
                delay = backoff.next_delay()
                log.warning("inventory_publish_failed", error=str(exc), retry_in_s=round(delay, 2))
                await asyncio.sleep(delay)
                continue
            backoff.reset()
            synced_epoch, synced_generation = epoch, current.generation
            await self._wait_for_change(after=synced_generation, epoch=epoch)

    async def publish(self, current: inventory_pb2.Inventory, *, reread: bool) -> bool:
        """Put `current` unless the KV already holds the same content; True when it wrote."""
        bucket = self.bus.names.inventory_bucket
        with telemetry.tracer(__name__).start_as_current_span("discovery.publish_inventory"):
            if reread or self._stored is None:
                self._stored = await self._read(bucket)
            to_put = inventory.successor(self._stored, current, floor=self._highest)
            if to_put is None:
                self.published.set()
                return False
            await self.bus.kv_put(bucket, self.key, codec.encode(to_put))
        self._stored, self._highest = to_put, to_put.generation
        self.published.set()
        log.info(
            "inventory_published",
            driver=self.driver,
            node=self.node,
            generation=to_put.generation,
            devices=len(to_put.devices),
        )
        return True

    async def _read(self, bucket: str) -> inventory_pb2.Inventory | None:
        data = await self.bus.kv_get(bucket, self.key)
        if data is None:
            return None
        try:
            stored = codec.decode(inventory_pb2.Inventory, data, subject=self.key)
        except MalformedMessageError as exc:
            log.warning("inventory_unreadable", key=self.key, error=str(exc))
            return None
        if (stored.driver, stored.node) != (self.driver, self.node):
            owner = f"{stored.driver[:64]!r}/{stored.node[:64]!r}"
            log.warning("inventory_unreadable", key=self.key, error=f"an inventory of {owner}")
            return None
        if stored.generation >= _MAX_GENERATION:
            # Not ours (we count from 1, one per change): following it would overflow uint64.
            log.warning("inventory_unreadable", key=self.key, error="generation out of range")
            return None
        self._highest = max(self._highest, stored.generation)
        return stored

    async def _wait_for_change(self, *, after: int, epoch: int) -> None:
        """Until the scanner has a newer inventory or NATS reconnected."""
        waiters = [
            asyncio.create_task(self.scanner.next(after=after), name="inventory-next"),
            asyncio.create_task(self.bus.wait_epoch_after(epoch), name="bus-epoch-next"),
        ]
        try:
            await asyncio.wait(waiters, return_when=asyncio.FIRST_COMPLETED)
        finally:
            for waiter in waiters:
                waiter.cancel()
            await asyncio.gather(*waiters, return_exceptions=True)
