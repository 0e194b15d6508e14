"""`dractl health`: every device's health as the health agent recorded it, for a node or for
every node (`--all-nodes`, or a glob in `--node-name`): then with a NODE column, a device no
record covers yet as UNKNOWN, and the healthy / unhealthy / unknown counts."""

from __future__ import annotations

import argparse
import asyncio
from collections import Counter
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import TextIO

from services.dractl import document, fleet, queries
from services.dractl.bus_session import bus_session
from services.dractl.document import Item, rfc3339, state_name
from services.dractl.output import Output, listing
from services.dractl.render import Column, age, fleet_columns, joined
from services.dractl.subcommands import Subcommands
from shared.bus.connection import Bus
from shared.errors import MalformedMessageError
from shared.pb.drasuite.v1 import health_pb2

__all__ = ["NAME", "FleetHealth", "columns", "fleet_health", "item", "register", "run"]

NAME = "health"


def register(subcommands: Subcommands) -> None:
    text = "health of every device, as the health agent recorded it"
    parser = subcommands.add(NAME, summary=text, description=text)
    fleet.add_all_nodes_flag(parser)


async def run(args: argparse.Namespace, *, out: TextIO, err: TextIO) -> int:
    output = Output.of(args.output, out=out, err=err)
    driver, node = args.driver_name, args.node_name
    async with bus_session(args) as bus:
        now = datetime.now(UTC)
        glob = fleet.node_glob(args)
        if glob is not None:
            await _fleet(bus, driver, glob, output, now=now)
            return 0
        records = await queries.health(bus, driver=driver, node=node)
        items = [item(r) for r in records]
        listing(items, columns(now=now), output, empty=f"no health records for {node} yet")
    return 0


async def _fleet(bus: Bus, driver: str, glob: str, output: Output, *, now: datetime) -> None:
    found = await fleet_health(bus, driver=driver, node_glob=glob)
    items = [item(r) for r in found.records]
    counts = {"nodes": found.nodes, **found.counts}
    if not output.tabular:
        document.dump({"counts": counts, "items": items}, output=output.format, out=output.out)
        return
    empty = f"no devices on any node {fleet.where(glob, driver=driver)}"
    listing(items, fleet_columns(columns(now=now)), output, empty=empty)
    if items:
        output.out.write(_counts_line(counts) + "\n")


def columns(*, now: datetime) -> list[Column]:
    return [
        Column("DEVICE", lambda r: r["device"]),
        Column("STATE", lambda r: r["state"]),
        Column("CAUSE", lambda r: r["cause"] or "-"),
        Column("CODE", lambda r: r["code"] or "-"),
        Column("TAINTS", _taints),
        Column("AGE", lambda r: age(r["since"], now=now)),
        Column("UPDATED", lambda r: age(r["updated"], now=now), wide=True),
        Column("MESSAGE", lambda r: r["message"], wide=True),
    ]


def _taints(record: Item) -> str:
    return joined(
        [
            f"{t['key']}{'=' + t['value'] if t['value'] else ''}:{t['effect']}"
            for t in record["taints"]
        ]
    )


def item(record: health_pb2.DeviceHealth) -> Item:
    """A health record as `-o json|yaml` shows it (and a table's row)."""
    return {
        "driver": record.driver,
        "node": record.node,
        "pool": record.pool,
        "device": record.device,
        "state": state_name(health_pb2.HealthState, record.state, "HEALTH_STATE_"),
        "cause": record.cause,
        "code": record.code,
        "message": record.message,
        "since": rfc3339(record.since_unix_ms),
        "updated": rfc3339(record.updated_unix_ms),
        "taints": [
            {
                "key": t.key,
                "value": t.value,
                "effect": t.effect,
                "timeAdded": rfc3339(t.time_added_unix_ms),
            }
            for t in record.taints
        ],
    }


def _counts_line(counts: Mapping[str, int]) -> str:
    """`nodes: 3  healthy: 22  unhealthy: 1  unknown: 1`, under a fleet's health table."""
    return "  ".join(f"{name}: {count}" for name, count in counts.items())


@dataclass(frozen=True, slots=True)
class FleetHealth:
    records: list[health_pb2.DeviceHealth]
    """Every record of the matching nodes, and an UNKNOWN one for each inventory device that
    has none yet."""
    nodes: int
    counts: Counter[str] = field(default_factory=Counter)
    """healthy / unhealthy / unknown devices."""


async def fleet_health(
    bus: Bus,
    *,
    driver: str,
    node_glob: str = "*",
    skipped: Callable[[MalformedMessageError], None] = queries.to_stderr,
) -> FleetHealth:
    """Every matching node's health records, with the devices no record covers yet."""
    nodes, entries = await asyncio.gather(
        fleet.inventories(bus, driver=driver, node_glob=node_glob, skipped=skipped),
        fleet.latest(bus, bus.names.health_bucket, driver, skipped=skipped),
    )
    records = fleet.decoded(entries, health_pb2.DeviceHealth, node_glob=node_glob, skipped=skipped)
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
