"""`dractl alerts`: the last ops alerts of the alert stream (`--last`), and with `--follow`
each new one as it arrives: one row, JSON line or YAML document per alert, as
`kubectl get -w` writes them."""

from __future__ import annotations

import argparse
from collections.abc import Sequence
from datetime import UTC, datetime
from typing import TextIO

from services.dractl import document, queries
from services.dractl.bus_session import bus_session
from services.dractl.document import Item, rfc3339, state_name
from services.dractl.output import Output, listing
from services.dractl.render import Column, age, row_line
from services.dractl.subcommands import Subcommands
from shared.pb.drasuite.v1 import alert_pb2

__all__ = ["NAME", "columns", "item", "register", "run"]

NAME = "alerts"
# The columns' widths while following: rows are written before later ones are known.
_FOLLOW_MIN_WIDTHS = {"AGE": 5, "STATUS": 9, "NODE": 16, "DEVICE": 10, "CAUSE": 10, "CODE": 6}
_FOLLOW_DEFAULT_MIN_WIDTH = 12


def register(subcommands: Subcommands) -> None:
    text = "ops alerts from the alert stream"
    parser = subcommands.add(NAME, summary=text, description=text)
    parser.add_argument("--follow", "-f", action="store_true")
    parser.add_argument("--last", type=int, default=20)


async def run(args: argparse.Namespace, *, out: TextIO, err: TextIO) -> int:
    output = Output.of(args.output, out=out, err=err)
    async with bus_session(args) as bus:
        now = datetime.now(UTC)
        stream = queries.alerts(bus, follow=args.follow, last=args.last)
        if not args.follow:
            items = [item(a) async for a in stream]
            listing(items, columns(now=now), output, empty="no alerts in the stream")
            return 0
        wide = output.wide
        widths = _follow_widths(columns(now=now), wide=wide)
        if output.tabular:
            header = _follow_cells(columns(now=now), None, wide=wide)
            output.out.write(row_line(header, widths, width=output.width) + "\n")
            output.out.flush()
        async for alert in stream:
            _write_one(item(alert), widths, output)
    return 0


def _write_one(alert: Item, widths: Sequence[int], output: Output) -> None:
    if output.format == "json":
        document.dump(alert, output="json-line", out=output.out)
    elif output.format == "yaml":
        output.out.write("---\n")
        document.dump(alert, output="yaml", out=output.out)
    else:
        shown = columns(now=datetime.now(UTC))  # AGE as of its arrival
        cells = _follow_cells(shown, alert, wide=output.wide)
        output.out.write(row_line(cells, widths, width=output.width) + "\n")
        output.out.flush()


def columns(*, now: datetime) -> list[Column]:
    return [
        Column("AGE", lambda a: age(a["resolved"] or a["raised"], now=now)),
        Column("STATUS", lambda a: a["status"]),
        Column("NODE", lambda a: a["node"]),
        Column("DEVICE", lambda a: a["device"]),
        Column("CAUSE", lambda a: a["cause"] or "-"),
        Column("CODE", lambda a: a["code"] or "-"),
        Column("TIME", lambda a: a["resolved"] or a["raised"] or "-", wide=True),
        Column("TAINT", lambda a: a["taint"] or "-", wide=True),
        Column("ID", lambda a: a["id"], wide=True),
        Column("MESSAGE", lambda a: a["message"], wide=True),
    ]


def _follow_widths(columns: Sequence[Column], *, wide: bool) -> list[int]:
    """Fixed widths for rows written as they come: the headers' or more."""
    shown = [c for c in columns if wide or not c.wide]
    return [
        max(len(c.header), _FOLLOW_MIN_WIDTHS.get(c.header, _FOLLOW_DEFAULT_MIN_WIDTH))
        for c in shown
    ]


def _follow_cells(columns: Sequence[Column], alert: Item | None, *, wide: bool) -> list[str]:
    """The header row (alert None) or one alert's row, for `_follow_widths`."""
    shown = [c for c in columns if wide or not c.wide]
    return [c.header if alert is None else c.cell(alert) for c in shown]


def item(message: alert_pb2.Alert) -> Item:
    """An alert as `-o json|yaml` shows it (and a table's row)."""
    return {
        "id": message.id,
        "status": state_name(alert_pb2.AlertStatus, message.status, "ALERT_STATUS_"),
        "driver": message.driver,
        "node": message.node,
        "pool": message.pool,
        "device": message.device,
        "cause": message.cause,
        "code": message.code,
        "message": message.message,
        "taint": message.taint,
        "raised": rfc3339(message.raised_unix_ms),
        "resolved": rfc3339(message.resolved_unix_ms),
        "traceId": message.trace_id,
    }
