"""dractl's tables: kubectl-style columns, the wide ones only with `-o wide`.

Rows are built from the same plain items as `-o json` (`document`), so both always agree;
each command defines its own columns.
On a terminal the last column is cut to fit its width; piped output is never cut. No I/O
beyond the given stream.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from datetime import datetime
from typing import Any, TextIO

__all__ = ["Column", "Item", "age", "fleet_columns", "joined", "pairs", "row_line", "table"]

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


def joined(values: Sequence[str]) -> str:
    return ",".join(values) if values else "<none>"


def pairs(mapping: dict[str, Any]) -> str:
    return joined([f"{k}={v}" for k, v in mapping.items()])


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


def fleet_columns(columns: list[Column]) -> list[Column]:
    """`columns` behind a NODE column, for listings across nodes."""
    return [Column("NODE", lambda item: item["node"]), *columns]
