"""dractl's tables: kubectl-style columns, the wide ones only with `-o wide`.

Rows are built from the same plain items as `-o json` (`document`), so both always agree.
On a terminal the last column is cut to fit its width; piped output is never cut. No I/O
beyond the given stream.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from datetime import datetime
from typing import Any, TextIO

__all__ = [
    "Column",
    "age",
    "alert_columns",
    "claim_columns",
    "counts_line",
    "fleet_columns",
    "health_columns",
    "inventory_columns",
    "row_line",
    "table",
]

Item = dict[str, Any]
_GAP = "   "


class Column:
    """A table column: its header, how a cell is read from an item, and whether it is wide."""

    def __init__(self, header: str, cell: Callable[[Item], str], *, wide: bool = False) -> None:
        self.header = header
        self.cell = cell
        self.wide = wide


def age(timestamp: str | None, *, now: datetime) -> str:
    """kubectl's AGE: `45s`, `12m`, `5h`, `3d`; `<unknown>` without a time."""
    if not timestamp:
        return "<unknown>"
    seconds = max(0, int((now - datetime.fromisoformat(timestamp)).total_seconds()))
    if seconds < 120:
        return f"{seconds}s"
    minutes = seconds // 60
    if minutes < 180:
        return f"{minutes}m"
    hours = minutes // 60
    return f"{hours}h" if hours < 48 else f"{hours // 24}d"


def _joined(values: Sequence[str]) -> str:
    return ",".join(values) if values else "<none>"


def _pairs(mapping: dict[str, Any]) -> str:
    return _joined([f"{k}={v}" for k, v in mapping.items()])


def inventory_columns() -> list[Column]:
    return [
        Column("DEVICE", lambda d: d["name"]),
        Column("KIND", lambda d: d["kind"]),
        Column("CAPACITY", lambda d: _pairs(d["capacity"])),
        Column("PUBLISHED", lambda d: "yes" if d["published"] else "no"),
        Column("POOL", lambda d: d["pool"], wide=True),
        Column("ATTRIBUTES", lambda d: _pairs(d["attributes"]), wide=True),
        Column("UNPUBLISHED", lambda d: d["unpublished"] or "-", wide=True),
    ]


def _taints(record: Item) -> str:
    return _joined(
        [
            f"{t['key']}{'=' + t['value'] if t['value'] else ''}:{t['effect']}"
            for t in record["taints"]
        ]
    )


def health_columns(*, now: datetime) -> list[Column]:
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


def alert_columns(*, now: datetime) -> list[Column]:
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


def _devices(claim: Item) -> str:
    return _joined(
        [d["device"] + (f"/{d['shareId']}" if d["shareId"] else "") for d in claim["devices"]]
    )


def _conditions(claim: Item) -> str:
    """Per device `<device>:Ready,Healthy`; a condition not True shows its status."""
    shown = []
    for device in claim["devices"]:
        parts = [
            c["type"] if c["status"] == "True" else f"{c['type']}={c['status']}"
            for c in device.get("conditions", [])
        ]
        shown.append(f"{device['device']}:{','.join(parts)}")
    return " ".join(shown) or "<none>"


def claim_columns(*, now: datetime) -> list[Column]:
    return [
        Column("NAMESPACE", lambda c: c["namespace"]),
        Column("NAME", lambda c: c["name"]),
        Column("NODE", lambda c: c["node"]),
        Column("DEVICES", _devices),
        Column("PODS", lambda c: _joined([p["name"] for p in c["pods"]])),
        Column("CONDITIONS", _conditions),
        Column("STATE", lambda c: c["state"]),
        Column("AGE", lambda c: age(c["prepared"], now=now)),
        Column("UID", lambda c: c["uid"], wide=True),
        Column(
            "CDI",
            lambda c: _joined([i for d in c["devices"] for i in d["cdiDeviceIds"]]),
            wide=True,
        ),
    ]


def _cells(columns: Sequence[Column], items: Sequence[Item], *, wide: bool) -> list[list[str]]:
    shown = [c for c in columns if wide or not c.wide]
    return [[c.header for c in shown]] + [[c.cell(item) for c in shown] for item in items]


def table(
    columns: Sequence[Column],
    items: Sequence[Item],
    *,
    wide: bool,
    out: TextIO,
    width: int | None = None,
) -> None:
    """Aligned columns; with `width`, every line is cut to it (the last column gives way)."""
    rows = _cells(columns, items, wide=wide)
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    for row in rows:
        out.write(row_line(row, widths, width=width) + "\n")
    out.flush()


def row_line(row: Sequence[str], widths: Sequence[int], *, width: int | None = None) -> str:
    cells = [cell.ljust(w) for cell, w in zip(row[:-1], widths, strict=False)] + [row[-1]]
    line = _GAP.join(cells).rstrip()
    if width is not None and len(line) > width:
        line = line[: max(0, width - 1)] + "…"
    return line


def stream_widths(columns: Sequence[Column], *, wide: bool) -> list[int]:
    """Fixed widths for rows printed as they come (`alerts --follow`): the headers' or more."""
    minimum = {"AGE": 5, "STATUS": 9, "NODE": 16, "DEVICE": 10, "CAUSE": 10, "CODE": 6}
    shown = [c for c in columns if wide or not c.wide]
    return [max(len(c.header), minimum.get(c.header, 12)) for c in shown]


def stream_cells(columns: Sequence[Column], item: Item | None, *, wide: bool) -> list[str]:
    """The header row (item None) or one item's row, for `stream_widths`."""
    shown = [c for c in columns if wide or not c.wide]
    return [c.header if item is None else c.cell(item) for c in shown]


def fleet_columns(columns: list[Column]) -> list[Column]:
    """`columns` behind a NODE column, for listings across nodes."""
    return [Column("NODE", lambda item: item["node"]), *columns]


def counts_line(counts: Mapping[str, int]) -> str:
    """`nodes: 3  healthy: 22  unhealthy: 1  unknown: 1`, under a fleet's health table."""
    return "  ".join(f"{name}: {count}" for name, count in counts.items())
