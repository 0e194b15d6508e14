"""The inventory publisher: puts the node's inventory into the inventory KV, only on change.

The KV value's generation grows by one per content change, continuing from what the KV held
(so a restarted agent with the same devices writes nothing). After a NATS reconnect the value
is read back and rewritten if it was lost. NATS being down is retried with backoff, forever.
`guard()` watches the key: when it holds anything but the last published inventory (forged,
damaged, deleted), that inventory is put back under a generation above the foreign one, so
consumers that adopted it move on; logged with `security=true`, counted in
`dra_inventory_reasserted_total`. With `--bus-signatures` on, an entry on the key that this agent
did not sign (what a redirected 404 leaves, another node's value) is refused by the Bus and put
back at once too (reason `rejected`). Put-backs are paced (`shared.bus.ownkeys`), so a node
rewriting the key without pause cannot make this agent spin. With `unpublished` (the slice
reconciler's devices left out of the slices), those devices carry `Device.unpublished` in the KV
value, and a change of that set is a content change like any other.
"""

from __future__ import annotations

import asyncio

import structlog

from services.discovery import instruments, inventory, unpublished
from services.discovery.scanner import DeviceScanner
from shared import telemetry
from shared.backoff import Backoff
from shared.bus import codec, kv, ownkeys
from shared.bus.connection import Bus
from shared.cancellation import reraise_if_cancelling
from shared.errors import BusUnavailableError, MalformedMessageError
from shared.pb.drasuite.v1 import inventory_pb2

__all__ = ["InventoryPublisher"]

log = structlog.get_logger(__name__)
_MAX_GENERATION = 2**63 - 1


class InventoryPublisher:
    """Keeps `names.inventory_key(driver, node)` equal to the scanner's inventory."""

    def __init__(
        self,
        bus: Bus,
        scanner: DeviceScanner,
        *,
        driver: str,
        node: str,
        dropped: unpublished.Unpublished | None = None,
    ) -> None:
        self.bus = bus
        self.scanner = scanner
        self.dropped = dropped or unpublished.Unpublished()
        self.driver = driver
        self.node = node
        self.key = bus.names.inventory_key(driver, node)
        self.published = asyncio.Event()
        # What the KV holds as far as we know; None until read after a (re)connect.
        self._stored: inventory_pb2.Inventory | None = None
        self._highest = 0
        # publish() and the guard's put-back each read-then-write the key.
        self._writing = asyncio.Lock()
        # The connection epoch whose KV value run() has read and made right; the guard waits
        # for it after a reconnect (a KV that lost the key is run()'s to refill, not a forgery).
        self._checked_epoch = -1

    async def run(self) -> None:
        """Eternal: publish each new inventory, and re-check the KV after every reconnect."""
        backoff = Backoff(initial_s=0.2, max_s=5.0)
        synced_epoch, synced_generation, synced_marks = -1, 0, -1
        while True:
            await self.bus.connected.wait()
            scanned = self.scanner.current or await self.scanner.next(after=0)
            marks = self.dropped.version
            current = self.dropped.mark(scanned)
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
            synced_epoch, synced_generation, synced_marks = epoch, current.generation, marks
            self._checked_epoch = epoch
            await self._wait_for_change(after=synced_generation, epoch=epoch, marks=synced_marks)

    async def publish(self, current: inventory_pb2.Inventory, *, reread: bool) -> bool:
        """Put `current` unless the KV already holds the same content; True when it wrote."""
        bucket = self.bus.names.inventory_bucket
        with telemetry.tracer(__name__).start_as_current_span(
            "discovery.publish_inventory", context=self.scanner.trace
        ):
            async with self._writing:
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

    async def guard(self, *, pace: ownkeys.ReassertPace | None = None) -> None:
        """Eternal: put back the last published inventory whenever the key holds another value
        (`shared.bus.ownkeys`, at its pace).

        Each change is checked against a fresh read (a late event of our own earlier put is no
        foreign value). Only once `run()` has read the key on the current connection: before,
        it re-reads and rewrites the key itself. A put-back that fails on NATS is left to
        `run()` likewise, after the reconnect.
        """
        await ownkeys.OwnKeysGuard(
            self.bus,
            bucket=self.bus.names.inventory_bucket,
            keys=self.key,
            restore=self._restore,
            counter=instruments.INVENTORY_REASSERTED,
            records="inventory",
            pace=pace,
        ).run()

    async def _restore(self, change: kv.KVChange) -> ownkeys.Restored:
        if change.key != self.key:
            return ownkeys.NOTHING
        async with self._writing:
            reason = await self._reassert(
                self.bus.names.inventory_bucket, rejected=bool(change.rejected)
            )
        return ownkeys.Restored(reason)

    async def _reassert(self, bucket: str, *, rejected: bool = False) -> str:
        """Put the last published inventory back unless the key holds it; why, or ""."""
        published = self._stored
        if published is None or self._checked_epoch != self.bus.epoch:
            return ""  # run() has yet to read the key on this connection, and will set it right
        data = await self.bus.kv_get(bucket, self.key)
        found = _decoded(data)
        if found == published and not rejected:
            return ""
        restored = inventory_pb2.Inventory()
        restored.CopyFrom(published)
        foreign = found.generation if found is not None else 0
        restored.generation = max(self._highest, foreign if foreign < _MAX_GENERATION else 0) + 1
        await self.bus.kv_put(bucket, self.key, codec.encode(restored))
        self._stored, self._highest = restored, restored.generation
        reason = "deleted" if data is None else "unreadable" if found is None else "differs"
        if rejected and (data is None or found == published):
            reason = "rejected"  # not signed by us: refused by the Bus, or taken unsigned
        log.warning(
            "inventory_reasserted",
            security=True,
            key=self.key,
            reason=reason,
            foreign_generation=foreign,
            generation=restored.generation,
        )
        return reason

    async def _wait_for_change(self, *, after: int, epoch: int, marks: int) -> None:
        """Until the scanner has a newer inventory, the dropped devices change or NATS
        reconnected."""
        waiters = [
            asyncio.create_task(self.scanner.next(after=after), name="inventory-next"),
            asyncio.create_task(self.bus.wait_epoch_after(epoch), name="bus-epoch-next"),
            asyncio.create_task(self.dropped.next(after=marks), name="inventory-marks-next"),
        ]
        try:
            await asyncio.wait(waiters, return_when=asyncio.FIRST_COMPLETED)
        finally:
            for waiter in waiters:
                waiter.cancel()
            await asyncio.gather(*waiters, return_exceptions=True)


def _decoded(data: bytes | None) -> inventory_pb2.Inventory | None:
    """The KV value as an inventory (compared as a message: map order is no difference)."""
    if data is None:
        return None
    try:
        return codec.decode(inventory_pb2.Inventory, data, subject="inventory")
    except MalformedMessageError:
        return None
