"""What dractl reads across nodes: every node's inventory and health records, in one pass.

One ordered consumer per bucket replays the latest value of every key of the driver (a
request per key would take minutes on 5,000 nodes), and `--node-name` takes a glob. A value
that names another driver or node than its key is skipped with a line on stderr, as for one
node. Read-only: a missing bucket is "no data yet", never created.
"""

from __future__ import annotations

import asyncio
import fnmatch
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TypeVar

import nats.errors
import nats.js.errors
from google.protobuf.message import Message
from nats.aio.msg import Msg
from nats.js import api

from services.dractl import queries
from shared.bus import codec
from shared.bus.connection import Bus
from shared.bus.subjects import token
from shared.errors import BusUnavailableError, MalformedMessageError
from shared.pb.drasuite.v1 import health_pb2, inventory_pb2

__all__ = ["FleetHealth", "health", "inventories", "is_glob"]

M = TypeVar("M", bound=Message)
_GLOB = frozenset("*?[")
_READ_TIMEOUT_S = 30.0


def is_glob(node: str) -> bool:
    return any(char in _GLOB for char in node)


@dataclass(frozen=True, slots=True)
class FleetHealth:
    records: list[health_pb2.DeviceHealth]
    """Every record of the matching nodes, and an UNKNOWN one for each inventory device that
    has none yet."""
    nodes: int
    counts: Counter[str] = field(default_factory=Counter)
    """healthy / unhealthy / unknown devices."""


async def _latest(bus: Bus, bucket: str, driver: str) -> list[tuple[str, bytes]]:
    """(key, value) of every live key of `driver` in `bucket`, from one ordered consumer."""
    prefix = bus.names.kv_subject(bucket, "")
    found: dict[str, bytes] = {}
    done = asyncio.Event()

    async def collect(msg: Msg) -> None:
        key = msg.subject[len(prefix) :]
        operation = (msg.headers or {}).get("KV-Operation")
        if operation in ("DEL", "PURGE"):
            found.pop(key, None)
        else:
            found[key] = msg.data
        if msg.metadata.num_pending == 0:
            done.set()

    try:
        info = await bus.js.stream_info(bus.names.kv_stream(bucket))
        if info.state.messages == 0:
            return []
        subscription = await bus.js.subscribe(
            bus.names.kv_subject(bucket, f"{token(driver)}.>"),
            stream=bus.names.kv_stream(bucket),
            cb=collect,
            ordered_consumer=True,
            deliver_policy=api.DeliverPolicy.LAST_PER_SUBJECT,
        )
        try:
            # No key of this driver: the consumer has nothing to deliver, and says so.
            consumer = await subscription.consumer_info()
            delivered = consumer.delivered.consumer_seq if consumer.delivered else 0
            if consumer.num_pending == 0 and not delivered:
                return []
            await asyncio.wait_for(done.wait(), _READ_TIMEOUT_S)
        finally:
            await subscription.unsubscribe()
    except nats.js.errors.NotFoundError:
        return []
    except (nats.errors.Error, TimeoutError) as exc:
        raise BusUnavailableError(f"kv bucket {bucket}: {exc}", subject=bucket) from exc
    return sorted(found.items())


def _decoded(
    entries: list[tuple[str, bytes]],
    kind: type[M],
    *,
    node_glob: str,
    skipped: Callable[[MalformedMessageError], None],
) -> list[M]:
    messages = []
    for key, data in entries:
        try:
            message = codec.decode(kind, data, subject=key)
            queries.check_key(message, key)
        except MalformedMessageError as exc:  # the other keys' values still count
            skipped(exc)
            continue
        if fnmatch.fnmatchcase(getattr(message, "node", ""), node_glob):
            messages.append(message)
    return messages


async def inventories(
    bus: Bus,
    *,
    driver: str,
    node_glob: str = "*",
    skipped: Callable[[MalformedMessageError], None] = queries.to_stderr,
) -> list[inventory_pb2.Inventory]:
    """Every matching node's inventory, by node name."""
    entries = await _latest(bus, bus.names.inventory_bucket, driver)
    found = _decoded(entries, inventory_pb2.Inventory, node_glob=node_glob, skipped=skipped)
    return sorted(found, key=lambda inv: inv.node)


async def health(
    bus: Bus,
    *,
    driver: str,
    node_glob: str = "*",
    skipped: Callable[[MalformedMessageError], None] = queries.to_stderr,
) -> FleetHealth:
    """Every matching node's health records, with the devices no record covers yet."""
    nodes, entries = await asyncio.gather(
        inventories(bus, driver=driver, node_glob=node_glob, skipped=skipped),
        _latest(bus, bus.names.health_bucket, driver),
    )
    records = _decoded(entries, health_pb2.DeviceHealth, node_glob=node_glob, skipped=skipped)
    seen = {(r.node, r.device) for r in records}
    for inv in nodes:
        records += [
            health_pb2.DeviceHealth(driver=driver, node=inv.node, pool=inv.pool, device=d.name)
            for d in inv.devices
            if (inv.node, d.name) not in seen
        ]
    records.sort(key=lambda r: (r.node, r.device))
    counts: Counter[str] = Counter({"healthy": 0, "unhealthy": 0, "unknown": 0})
    for record in records:
        match record.state:
            case health_pb2.HEALTH_STATE_HEALTHY:
                counts["healthy"] += 1
            case health_pb2.HEALTH_STATE_UNHEALTHY:
                counts["unhealthy"] += 1
            case _:
                counts["unknown"] += 1
    node_names = {inv.node for inv in nodes} | {r.node for r in records}
    return FleetHealth(records=records, nodes=len(node_names), counts=counts)
