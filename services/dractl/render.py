"""Plain-text tables and JSON for dractl output; no I/O beyond the given stream."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TextIO

from google.protobuf import json_format
from google.protobuf.message import Message

from shared.pb.drasuite.v1 import alert_pb2, health_pb2, inventory_pb2

__all__ = ["alert_line", "health_table", "inventory_table", "json_lines", "table"]


def table(rows: Sequence[Sequence[str]], *, out: TextIO) -> None:
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    for row in rows:
        out.write("  ".join(cell.ljust(width) for cell, width in zip(row, widths, strict=True)))
        out.write("\n")


def _attribute(value: inventory_pb2.AttributeValue) -> str:
    kind = value.WhichOneof("value")
    return "" if kind is None else str(getattr(value, kind))


def inventory_table(inv: inventory_pb2.Inventory, *, out: TextIO) -> None:
    out.write(
        f"driver {inv.driver}  node {inv.node}  pool {inv.pool}  generation {inv.generation}\n"
    )
    rows = [["DEVICE", "KIND", "CAPACITY", "ATTRIBUTES"]]
    for device in inv.devices:
        capacity = ",".join(f"{k}={v}" for k, v in sorted(device.capacity.items()))
        attributes = ",".join(f"{k}={_attribute(v)}" for k, v in sorted(device.attributes.items()))
        rows.append([device.name, device.kind, capacity, attributes])
    table(rows, out=out)


def health_table(records: Sequence[health_pb2.DeviceHealth], *, out: TextIO) -> None:
    rows = [["DEVICE", "STATE", "CAUSE", "CODE", "TAINT", "MESSAGE"]]
    for record in records:
        state = health_pb2.HealthState.Name(record.state).removeprefix("HEALTH_STATE_")
        rows.append([record.device, state, record.cause, record.code, record.taint, record.message])
    table(rows, out=out)


def alert_line(alert: alert_pb2.Alert) -> str:
    status = alert_pb2.AlertStatus.Name(alert.status).removeprefix("ALERT_STATUS_")
    return (
        f"{status:<8} {alert.node}/{alert.device} cause={alert.cause} code={alert.code} "
        f"taint={alert.taint or '-'} {alert.message}"
    )


def json_lines(messages: Sequence[Message], *, out: TextIO) -> None:
    for message in messages:
        out.write(json_format.MessageToJson(message, indent=None, sort_keys=True) + "\n")
