"""The two KV watchers of the allocation agent: inventory and device health, NATS to memory.

Both run forever (the shared KV watch resubscribes after reconnects and replays current values)
and only update local state, so prepares and health streams never wait on NATS. A message that
does not decode, or names another driver, node or device than its key, is logged and skipped:
the last good value stays in force.

Each change that carries a trace is handled in a span of it: a child of the writer's span for a
change seen live, linked (a new trace) for a value replayed after a (re)start, which is
catch-up work and would otherwise graft spans onto a long-finished trace.
"""

from __future__ import annotations

from collections.abc import Coroutine
from typing import Any

import structlog
from opentelemetry import context as otel_context

from services.allocation.node_view.health_board import HealthBoard
from services.allocation.node_view.inventory_cache import InventoryCache
from shared import telemetry
from shared.bus import codec, kv
from shared.bus.connection import Bus
from shared.errors import MalformedMessageError
from shared.pb.drasuite.v1 import health_pb2, inventory_pb2

__all__ = ["health_watcher", "inventory_watcher", "node_view_tasks"]

log = structlog.get_logger(__name__)
tracer = telemetry.tracer(__name__)


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
        with telemetry.continued(
            tracer, "allocation.inventory_update", change.trace, linked=change.replayed
        ):
            await _apply_inventory(change, cache=cache, board=board, driver=driver, node=node)


async def _apply_inventory(
    change: kv.KVChange, *, cache: InventoryCache, board: HealthBoard, driver: str, node: str
) -> None:
    if change.value is None:
        # Discovery removed the key (e.g. on its shutdown): the devices are still there.
        log.warning("inventory_deleted_kept_last", key=change.key)
        return
    try:
        inventory = codec.decode(inventory_pb2.Inventory, change.value, subject=change.key)
    except MalformedMessageError as exc:
        log.error("inventory_malformed", key=change.key, error=str(exc))
        return
    if (inventory.driver, inventory.node) != (driver, node):
        owner = f"{inventory.driver[:64]!r}/{inventory.node[:64]!r}"
        log.error("inventory_malformed", key=change.key, error=f"an inventory of {owner}")
        return
    if await cache.update(inventory, signed=change.signed):
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
        # A bad value does not delete the key: its last good record stays.
        if change.value is not None:
            seen.add(device)
        with telemetry.continued(
            tracer,
            "allocation.health_update",
            change.trace,
            linked=change.replayed,
            attributes={"device": device},
        ) as span:
            trace = otel_context.get_current() if span is not None else None
            _apply_health(change, board=board, device=device, named=(driver, node), trace=trace)


def _apply_health(
    change: kv.KVChange,
    *,
    board: HealthBoard,
    device: str,
    named: tuple[str, str],
    trace: otel_context.Context | None,
) -> None:
    if change.value is None:
        board.remove(device, trace=trace)
        return
    try:
        record = codec.decode(health_pb2.DeviceHealth, change.value, subject=change.key)
    except MalformedMessageError as exc:
        log.error("health_record_malformed", key=change.key, error=str(exc))
        return
    owner = (record.driver, record.node, record.device)
    if owner != (*named, device):
        text = "/".join(repr(name[:64]) for name in owner)
        log.error("health_record_malformed", key=change.key, error=f"record of {text}")
        return
    board.put(device, record, trace=trace)
