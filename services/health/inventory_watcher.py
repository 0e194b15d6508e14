"""The inventory watcher: the node's inventory from the KV, as the topology attribution needs.

Eternal; each new or deleted inventory gives the sink a new `Topology` (empty when deleted).
A malformed inventory, or one of another driver or node, is logged and skipped (the last
topology stays); so is one that fails the sanity rules (`inventory_sanity`: no devices, a
generation going backwards or reused), also counted in `dra_inventory_rejected_total`. It only
reads: the discovery agent writes it.

Each change that carries a trace is handled in a span of it (`health.inventory_update`): a
child of the writer's span for a change seen live, linked (a new trace) for a value replayed
after a (re)start, as the allocation agent's watchers do.
"""

from __future__ import annotations

from collections.abc import Callable

import structlog

from services.health import attribution, instruments
from services.health.attribution import Topology
from shared import inventory_sanity, telemetry
from shared.bus import codec, kv
from shared.bus.connection import Bus
from shared.errors import MalformedMessageError
from shared.pb.drasuite.v1 import inventory_pb2

__all__ = ["inventory_watcher"]

log = structlog.get_logger(__name__)
tracer = telemetry.tracer(__name__)


async def inventory_watcher(
    bus: Bus, *, driver: str, node: str, sink: Callable[[Topology], None]
) -> None:
    """Call `sink` with the topology of every version of the node's inventory."""
    key = bus.names.inventory_key(driver, node)
    # Kept across deletions: a delete followed by an older inventory is still going backwards.
    last: inventory_pb2.Inventory | None = None
    last_signed = False
    async for change in kv.watch(bus, bucket=bus.names.inventory_bucket, keys=key):
        if change.synced or change.key != key:
            continue
        with telemetry.continued(
            tracer,
            "health.inventory_update",
            change.trace,
            linked=change.replayed,
            attributes={"node": node},
        ):
            if change.value is None:
                sink(attribution.topology(None))
                continue
            try:
                inventory = codec.decode(inventory_pb2.Inventory, change.value, subject=key)
            except MalformedMessageError as exc:
                log.warning("inventory_malformed", node=node, error=str(exc))
                continue
            if (inventory.driver, inventory.node) != (driver, node):
                owner = f"{inventory.driver[:64]!r}/{inventory.node[:64]!r}"
                log.warning("inventory_malformed", node=node, error=f"{key}: inventory of {owner}")
                continue
            problem = inventory_sanity.problem(
                inventory, last=last, signed=change.signed, last_signed=last_signed
            )
            if (reason := problem) is not None:
                instruments.INVENTORY_REJECTED.add(1, {"reason": reason})
                log.warning(
                    "inventory_quarantined",
                    node=node,
                    reason=reason,
                    generation=inventory.generation,
                    kept_generation=last.generation if last is not None else None,
                    devices=len(inventory.devices),
                )
                continue
            last, last_signed = inventory, change.signed
            topology = attribution.topology(inventory)
            log.debug("topology_seen", node=node, partitions=len(topology.parents))
            sink(topology)
