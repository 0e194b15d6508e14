"""The two KV watchers of the allocation agent: inventory and device health, NATS to memory.

Both run forever (the shared KV watch resubscribes after reconnects and replays current values)
and only update local state, so prepares and health streams never wait on NATS. A message that
does not decode, or names another driver, node or device than its key, is logged and skipped:
the last good value stays in force.
"""

from __future__ import annotations

from collections.abc import Coroutine
from typing import Any

import structlog

from services.allocation.node_view.health_board import HealthBoard
from services.allocation.node_view.inventory_cache import InventoryCache
from shared.bus import codec, kv
from shared.bus.connection import Bus
from shared.errors import MalformedMessageError
from shared.pb.drasuite.v1 import health_pb2, inventory_pb2

__all__ = ["health_watcher", "inventory_watcher", "node_view_tasks"]

log = structlog.get_logger(__name__)


def node_view_tasks(
    bus: Bus, *, cache: InventoryCache, board: HealthBoard, driver: str, node: str
) -> dict[str, Coroutine[Any, Any, None]]:
    """The eternal tasks behind either kubelet front, by task name: the bus connection and
    the two watchers that keep `cache` and `board` on the node's keys."""
    return {
        "bus-connector": bus.run(),
        "inventory-watcher": inventory_watcher(
            bus, cache=cache, board=board, driver=driver, node=node
        ),
        "health-watcher": health_watcher(bus, board=board, driver=driver, node=node),
    }


async def inventory_watcher(
    bus: Bus, *, cache: InventoryCache, board: HealthBoard, driver: str, node: str
) -> None:
    """Keep `cache` (and the board's device list) on the node's inventory key."""
    key = bus.names.inventory_key(driver, node)
    async for change in kv.watch(bus, bucket=bus.names.inventory_bucket, keys=key):
        if change.synced:
            continue
        if change.value is None:
            # Discovery removed the key (e.g. on its shutdown): the devices are still there.
            log.warning("inventory_deleted_kept_last", key=change.key)
            continue
        try:
            inventory = codec.decode(inventory_pb2.Inventory, change.value, subject=change.key)
        except MalformedMessageError as exc:
            log.error("inventory_malformed", key=change.key, error=str(exc))
            continue
        if (inventory.driver, inventory.node) != (driver, node):
            owner = f"{inventory.driver[:64]!r}/{inventory.node[:64]!r}"
            log.error("inventory_malformed", key=change.key, error=f"an inventory of {owner}")
            continue
        if await cache.update(inventory):
            board.set_devices(cache.device_names())


async def health_watcher(bus: Bus, *, board: HealthBoard, driver: str, node: str) -> None:
    """Mirror the node's device health records into `board`."""
    seen: set[str] = set()
    async for change in kv.watch(
        bus, bucket=bus.names.health_bucket, keys=bus.names.health_keys(driver, node)
    ):
        if change.synced:
            # The replay that precedes this marker listed every key that still exists.
            board.retain(seen)
            seen = set()
            continue
        device = change.key.rsplit(".", 1)[-1]
        if change.value is None:
            board.remove(device)
            continue
        seen.add(device)  # a bad value does not delete the key: its last good record stays
        try:
            record = codec.decode(health_pb2.DeviceHealth, change.value, subject=change.key)
        except MalformedMessageError as exc:
            log.error("health_record_malformed", key=change.key, error=str(exc))
            continue
        named = (record.driver, record.node, record.device)
        if named != (driver, node, device):
            owner = "/".join(repr(name[:64]) for name in named)
            log.error("health_record_malformed", key=change.key, error=f"record of {owner}")
            continue
        board.put(device, record)
