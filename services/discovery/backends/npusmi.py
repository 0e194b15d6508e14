"""Parsers of `npu-smi info` (the summary table) and `npu-smi info -t topo` (pure).

Layouts are those of docs/hardware.md §3.2 and 3.4: the 910B/A3 (HBM) table, the 310/310P table
(with a `Device` column) and the A3 table (with a `Phy-ID` column), each chip on two rows; the
topo matrix with `NPU<n>` (or `Phy-ID<n>`) labels, optional NIC columns and CPU affinity.
Anything that does not fit raises `NpuSmiFormatError` naming the line; a parser that guessed
would publish wrong devices, and the scanner keeps the last good inventory instead.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from services.discovery.backends import topology
from services.discovery.backends.sysfs import normalize_bus_id

__all__ = [
    "HCCS_LINKS",
    "HEALTH_WORDS",
    "LINK_TYPES",
    "NpuChip",
    "NpuSmiFormatError",
    "Topology",
    "hccs_groups",
    "parse_info",
    "parse_topo",
]

HEALTH_WORDS = frozenset({"OK", "Warning", "Alarm", "Critical", "UNKNOWN"})
LINK_TYPES = frozenset({"X", "HCCS", "HCCS_SW", "SIO", "PIX", "PXB", "PHB", "SYS", "NA", "UB"})
HCCS_LINKS = frozenset({"HCCS", "HCCS_SW", "SIO"})
"""Links that join chips into one HCCS domain (SIO: the two dies of one A3 NPU)."""

_PAIR = re.compile(r"(\d+)\s*/\s*(\d+)")
_LABEL = re.compile(r"^(?:NPU|Phy-ID)(\d+)$")
_NIC = re.compile(r"^NIC\d+:?$")


class NpuSmiFormatError(ValueError):
    """npu-smi printed something this parser does not understand."""


@dataclass(frozen=True, slots=True, kw_only=True)
class NpuChip:
    """One chip (die) of the summary table."""

    npu_id: int
    """The card id (the NPU column); not a 0-based counter."""
    chip_id: int
    """The chip's index on its card."""
    name: str
    health: str
    bus_id: str
    """Lower-case, as sysfs names it: `0000:c1:00.0`."""
    memory_mb: int
    """HBM total where the table has it, else the memory total (MB, which is MiB)."""
    logic_id: int | None = None
    """310/310P: the `Device` column."""
    phy_id: int | None = None
    """A3: the `Phy-ID` column."""

    @property
    def device_id(self) -> int:
        """The id of `/dev/davinci<N>` and ASCEND_VISIBLE_DEVICES."""
        for known in (self.logic_id, self.phy_id):
            if known is not None:
                return known
        return self.npu_id


def _cells(line: str) -> list[str]:
    return [cell.strip() for cell in line.strip().strip("|").split("|")]


def _ints(text: str, where: str) -> list[int]:
    try:
        return [int(token) for token in text.split()]
    except ValueError as exc:
        raise NpuSmiFormatError(f"{where}: expected numbers, got {text!r}") from exc


def _memory(usage: str, where: str) -> int:
    totals = [int(total) for _, total in _PAIR.findall(usage)]
    if not totals:
        raise NpuSmiFormatError(f"{where}: no memory figures in {usage!r}")
    nonzero = [total for total in totals if total > 0]
    return nonzero[-1] if nonzero else 0


def _chip(first: list[str], second: list[str], *, where: str, id_column: str) -> NpuChip:
    npu_and_name = first[0].split(maxsplit=1)
    if len(second) < 3 or len(npu_and_name) != 2:
        raise NpuSmiFormatError(f"{where}: a chip needs two rows of at least three cells")
    ids = _ints(second[0], where)
    if len(ids) != (2 if id_column else 1):
        raise NpuSmiFormatError(f"{where}: chip cell {second[0]!r} does not match the header")
    try:
        bus_id = normalize_bus_id(second[1])
    except ValueError as exc:
        raise NpuSmiFormatError(f"{where}: {exc}") from exc
    extra = ids[1] if id_column else None
    return NpuChip(
        npu_id=_ints(npu_and_name[0], where)[0],
        chip_id=ids[0],
        name=npu_and_name[1].strip(),
        health=first[1],
        bus_id=bus_id,
        memory_mb=_memory(second[2], where),
        logic_id=extra if id_column == "Device" else None,
        phy_id=extra if id_column == "Phy-ID" else None,
    )


def _is_chip_start(cells: list[str]) -> bool:
    head = cells[0].split(maxsplit=1)
    return len(cells) >= 3 and len(head) == 2 and head[0].isdigit() and cells[1] in HEALTH_WORDS


def _id_column(header: str) -> str:
    words = header.split()
    return words[1] if len(words) > 1 and words[1] in ("Device", "Phy-ID") else ""


def parse_info(text: str) -> tuple[NpuChip, ...]:
    """The chips of `npu-smi info`, in table order; NpuSmiFormatError when it does not fit."""
    chips: list[NpuChip] = []
    id_column: str | None = None
    pending: tuple[list[str], int] | None = None
    for number, line in enumerate(text.splitlines(), start=1):
        where = f"npu-smi info line {number}"
        stripped = line.strip()
        if "Process id" in stripped or stripped.startswith("| No running processes"):
            break
        if not stripped.startswith("|"):
            continue
        cells = _cells(stripped)
        if cells[0].startswith("Chip") and id_column is None:
            id_column = _id_column(cells[0])
        elif id_column is None or cells[0].startswith("NPU"):
            continue  # the version line and the first header row
        elif pending is not None:
            chips.append(_chip(pending[0], cells, where=f"{where}", id_column=id_column))
            pending = None
        elif _is_chip_start(cells):
            pending = (cells, number)
        else:
            raise NpuSmiFormatError(f"{where}: not a chip row: {stripped[:80]!r}")
    if id_column is None:
        raise NpuSmiFormatError("npu-smi info: no device table (no 'Chip' header row)")
    if pending is not None:
        raise NpuSmiFormatError(f"npu-smi info line {pending[1]}: chip row without its second row")
    return tuple(chips)


@dataclass(frozen=True, slots=True)
class Topology:
    """`npu-smi info -t topo`: the link type between every two chips, by topo id."""

    ids: tuple[int, ...]
    links: dict[tuple[int, int], str]
    cpu_affinity: dict[int, str]


def _header(lines: list[str]) -> tuple[int, list[str]]:
    for k, line in enumerate(lines):
        tokens = line.split()
        if tokens and _LABEL.match(tokens[0]):
            return k, tokens
    raise NpuSmiFormatError("npu-smi info -t topo: no header row of NPU<n> labels")


def _columns(tokens: list[str]) -> list[str]:
    """Header tokens without the trailing `CPU Affinity`."""
    return tokens[:-2] if tokens[-2:] == ["CPU", "Affinity"] else tokens


def parse_topo(text: str) -> Topology:
    """The link matrix; NpuSmiFormatError on ragged rows, unknown links or missing chips."""
    lines = text.splitlines()
    start, tokens = _header(lines)
    columns = _columns(tokens)
    links: dict[tuple[int, int], str] = {}
    affinity: dict[int, str] = {}
    for number, line in enumerate(lines[start + 1 :], start=start + 2):
        row = line.split()
        if not row or row[0] == "Legend:":
            break
        if _NIC.match(row[0]):
            continue
        label = _LABEL.match(row[0])
        if label is None or len(row) - 1 < len(columns):
            raise NpuSmiFormatError(f"npu-smi info -t topo line {number}: malformed row")
        chip = int(label.group(1))
        for column, cell in zip(columns, row[1:], strict=False):
            if cell not in LINK_TYPES:
                raise NpuSmiFormatError(f"npu-smi topo line {number}: unknown link {cell!r}")
            if peer := _LABEL.match(column):
                links[(chip, int(peer.group(1)))] = cell
        if len(row) - 1 > len(columns):
            affinity[chip] = " ".join(row[1 + len(columns) :])
    ids = tuple(int(m.group(1)) for c in columns if (m := _LABEL.match(c)))
    if any((a, b) not in links for a in ids for b in ids):
        raise NpuSmiFormatError("npu-smi info -t topo: the matrix is not complete")
    return Topology(ids=ids, links=links, cpu_affinity=affinity)


def hccs_groups(topo: Topology) -> dict[int, str]:
    """Topo id -> `hccs-ring-<k>`: connected components of HCCS links (910A: two rings of 4)."""
    edges = [pair for pair, kind in topo.links.items() if kind in HCCS_LINKS]
    return topology.groups(topo.ids, edges, prefix="hccs-ring-")
