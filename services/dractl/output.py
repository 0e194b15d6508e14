"""What each bus-backed dractl command does with its answer: a table, or one JSON/YAML document.

Every command gets an open Bus and the parsed flags; the answer goes to `out`, messages for the
user (an empty listing) to `err`. Nothing here parses argv or reads the environment.
"""

from __future__ import annotations

import argparse
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any, TextIO

from opentelemetry import trace

from services.dractl import document, fleet, queries, render
from shared import telemetry
from shared.bus.connection import Bus
from shared.pb.drasuite.v1 import health_pb2

__all__ = ["Output", "run"]

tracer = telemetry.tracer(__name__)


@dataclass(frozen=True, slots=True, kw_only=True)
class Output:
    """Where and how answers are written."""

    format: str
    """table, wide, json or yaml."""
    out: TextIO
    err: TextIO
    width: int | None = None
    """The terminal's width when `out` is one: table lines are cut to it."""

    @property
    def tabular(self) -> bool:
        return self.format in ("table", "wide")


async def run(bus: Bus, args: argparse.Namespace, output: Output) -> int:
    driver, node = args.driver_name, args.node_name
    now = datetime.now(UTC)
    if args.command in ("inventory", "health") and (
        getattr(args, "all_nodes", False) or fleet.is_glob(node)
    ):
        await _fleet(bus, args, output, now=now)
        return 0
    match args.command:
        case "inventory":
            inv = await queries.inventory(bus, driver=driver, node=node)
            items = document.devices(inv)
            _listing(items, render.inventory_columns(), output, empty="")
            _unpublished_note(items, output)
        case "health":
            records = await queries.health(bus, driver=driver, node=node)
            items = [document.health(r) for r in records]
            _listing(
                items,
                render.health_columns(now=now),
                output,
                empty=f"no health records for {node} yet",
            )
        case "claims":
            prepared = await queries.claims(bus, driver=driver, node=args.node)
            health = await _health_of(bus, driver, {c.node for c in prepared})
            items = [document.claim(c, health) for c in prepared]
            where = f"on {args.node}" if args.node else f"for driver {driver}"
            _listing(
                items, render.claim_columns(now=now), output, empty=f"no prepared claims {where}"
            )
        case "fault" | "drain" | "undrain":
            await _control(bus, args, output)
        case "alerts":
            await _alerts(bus, args, output, now=now)
    return 0


async def _health_of(
    bus: Bus, driver: str, nodes: set[str]
) -> dict[tuple[str, str], health_pb2.DeviceHealth]:
    """The health records of `nodes` by (node, device): the source of the claims' device
    conditions. A node without records (or unknown to the bus) gives none."""
    found: dict[tuple[str, str], health_pb2.DeviceHealth] = {}
    for node in sorted(nodes):
        try:
            records = await queries.health(bus, driver=driver, node=node)
        except queries.CommandError:
            continue
        found.update({(node, r.device): r for r in records})
    return found


async def _fleet(bus: Bus, args: argparse.Namespace, output: Output, *, now: datetime) -> None:
    """Every node of the driver (matching `--node-name` when it is a glob), a NODE column."""
    driver = args.driver_name
    glob = args.node_name if fleet.is_glob(args.node_name) else "*"
    where = f"matching {glob}" if glob != "*" else f"for driver {driver}"
    if args.command == "inventory":
        nodes = await fleet.inventories(bus, driver=driver, node_glob=glob)
        items = [item for inv in nodes for item in document.devices(inv)]
        columns = render.fleet_columns(render.inventory_columns())
        _listing(items, columns, output, empty=f"no inventory on any node {where}")
        _unpublished_note(items, output)
        return
    found = await fleet.health(bus, driver=driver, node_glob=glob)
    items = [document.health(r) for r in found.records]
    counts = {"nodes": found.nodes, **found.counts}
    if not output.tabular:
        document.dump({"counts": counts, "items": items}, output=output.format, out=output.out)
        return
    columns = render.fleet_columns(render.health_columns(now=now))
    _listing(items, columns, output, empty=f"no devices on any node {where}")
    if items:
        output.out.write(render.counts_line(counts) + "\n")


async def _control(bus: Bus, args: argparse.Namespace, output: Output) -> None:
    """A fault or drain request to the node's health agent, and its answer. Its span starts
    the trace that the health and allocation agents continue (the request carries it)."""
    action = args.action if args.command == "fault" else args.command
    attributes = {"node": args.node_name, "device": args.device, "action": action}
    with tracer.start_as_current_span(
        f"dractl.{args.command}", kind=trace.SpanKind.CLIENT, attributes=attributes
    ):
        await _send_control(bus, args, output)


async def _send_control(bus: Bus, args: argparse.Namespace, output: Output) -> None:
    driver, node = args.driver_name, args.node_name
    if args.command == "fault":
        command = health_pb2.FaultCommand(
            device=args.device,
            clear=args.action == "clear",
            cause=args.cause,
            code=args.code,
            message=args.message,
        )
        answer = await queries.inject_fault(bus, driver=driver, node=node, command=command)
        _done(args, answer, output, text=f"fault {args.action}ed on {node}/{args.device}")
        return
    answer = await queries.drain(
        bus,
        driver=driver,
        node=node,
        device=args.device,
        drain=args.command == "drain",
        reason=getattr(args, "reason", ""),
    )
    _done(args, answer, output, text=f"{node}/{args.device} {args.command}ed")


def _listing(
    items: list[dict[str, Any]], columns: list[render.Column], output: Output, *, empty: str
) -> None:
    if not output.tabular:
        document.dump(items, output=output.format, out=output.out)
    elif not items and empty:
        output.err.write(f"No resources found: {empty}.\n")
    else:
        render.table(
            columns, items, wide=output.format == "wide", out=output.out, width=output.width
        )


def _unpublished_note(items: list[dict[str, Any]], output: Output) -> None:
    """Under a table: how many devices the scheduler cannot see, and where to read why."""
    left_out = sum(1 for item in items if not item["published"])
    if output.tabular and left_out:
        why = "the UNPUBLISHED column" if output.format == "wide" else "-o wide"
        output.err.write(
            f"{left_out} device(s) not published in ResourceSlices (the scheduler cannot "
            f"allocate them): see {why} and the Node's Events.\n"
        )


def _done(args: argparse.Namespace, answer: dict[str, Any], output: Output, *, text: str) -> None:
    if output.tabular:
        output.out.write(text + "\n")
        return
    action = args.action if args.command == "fault" else args.command
    result = {
        "driver": args.driver_name,
        "node": args.node_name,
        "device": args.device,
        "action": action,
        **{k: v for k, v in answer.items() if k not in ("driver", "node", "device", "action")},
    }
    document.dump(result, output=output.format, out=output.out)


async def _alerts(bus: Bus, args: argparse.Namespace, output: Output, *, now: datetime) -> None:
    columns = render.alert_columns(now=now)
    stream = queries.alerts(bus, follow=args.follow, last=args.last)
    if not args.follow:
        items = [document.alert(a) async for a in stream]
        _listing(items, columns, output, empty="no alerts in the stream")
        return
    # A stream never ends: one line (or YAML document) per alert, as `kubectl get -w` does.
    wide = output.format == "wide"
    widths = render.stream_widths(columns, wide=wide)
    if output.tabular:
        header = render.stream_cells(columns, None, wide=wide)
        output.out.write(render.row_line(header, widths, width=output.width) + "\n")
        output.out.flush()
    async for alert in stream:
        item = document.alert(alert)
        if output.format == "json":
            document.dump(item, output="json-line", out=output.out)
        elif output.format == "yaml":
            output.out.write("---\n")
            document.dump(item, output="yaml", out=output.out)
        else:
            columns = render.alert_columns(now=datetime.now(UTC))  # AGE as of its arrival
            cells = render.stream_cells(columns, item, wide=wide)
            output.out.write(render.row_line(cells, widths, width=output.width) + "\n")
            output.out.flush()
