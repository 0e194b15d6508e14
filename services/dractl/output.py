"""Where and how a bus-backed dractl command writes its answer: a table (`-o table|wide`) or
one JSON/YAML document (`-o json|yaml`), and an empty listing as a message on stderr."""

from __future__ import annotations

import shutil
from dataclasses import dataclass
from typing import Any, TextIO

from services.dractl import document, render

__all__ = ["FORMATS", "Output", "listing"]

FORMATS = ("table", "wide", "json", "yaml")
"""The values of `-o`."""


@dataclass(frozen=True, slots=True, kw_only=True)
class Output:
    """Where and how answers are written."""

    format: str
    """table, wide, json or yaml."""
    out: TextIO
    err: TextIO
    width: int | None = None
    """The terminal's width when `out` is one: table lines are cut to it."""

    @classmethod
    def of(cls, format: str, *, out: TextIO, err: TextIO) -> Output:
        """`format` on `out`, cut to the terminal's width when `out` is a terminal."""
        width = shutil.get_terminal_size().columns if out.isatty() else None
        return cls(format=format, out=out, err=err, width=width)

    @property
    def tabular(self) -> bool:
        return self.format in ("table", "wide")

    @property
    def wide(self) -> bool:
        return self.format == "wide"


def listing(
    items: list[dict[str, Any]], columns: list[render.Column], output: Output, *, empty: str
) -> None:
    """`items` as a table of `columns` or as one document; an empty table is the message
    `empty` on stderr instead (nothing when `empty` is blank)."""
    if not output.tabular:
        document.dump(items, output=output.format, out=output.out)
    elif not items and empty:
        output.err.write(f"No resources found: {empty}.\n")
    else:
        render.table(columns, items, wide=output.wide, out=output.out, width=output.width)
