"""The parsers of everything the agents read from `npu-smi` (pure), with one error type.

Layouts (docs/hardware.md §3.2-3.6):

- `npu-smi info`: the 910B/A3 (HBM) table, the 310/310P table (a `Device` column) and the A3
  table (a `Phy-ID` column), each chip on two rows; the process table ends the chips.
- `npu-smi info -t topo`: the link matrix with `NPU<n>` (or `Phy-ID<n>`) labels, optional NIC
  columns and CPU affinity.
- `npu-smi info -t health -i <card> -c <chip>`: `key : value` lines (`Health Status`,
  `Error Code`, `Error Information`).
- `npu-smi info -m`: the (card, chip) ids of every chip with its logic id (and, on A3, its
  physical id); MCU rows have no logic id.
- `npu-smi info -t info-vnpu -i <card> -c <chip>`: the chip's free/total resources and its vNPUs
  (id and template), as the host sees them.
- `npu-smi set -t create-vnpu|destroy-vnpu`: `Status : OK` or another status and a `Message`.

Anything that does not fit raises `NpuSmiError` naming the line: a parser that guessed would
publish wrong devices or watch the wrong chips. Running npu-smi is the callers' business
(`shared.commands`), and so is what a failure means to them.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass

__all__ = [
    "HCCS_LINKS",
    "HEALTH_WORDS",
    "LINK_TYPES",
    "ChipHealth",
    "ChipLocation",
    "NpuChip",
    "NpuSmiError",
    "Topology",
    "VnpuListing",
    "check_status",
    "hccs_links",
    "parse_chip_health",
    "parse_chip_map",
    "parse_info",
    "parse_topo",
    "parse_vnpu_view",
    "parse_vnpus",
]

HEALTH_WORDS = frozenset({"OK", "Warning", "Alarm", "Critical", "UNKNOWN"})
LINK_TYPES = frozenset({"X", "HCCS", "HCCS_SW", "SIO", "PIX", "PXB", "PHB", "SYS", "NA", "UB"})
HCCS_LINKS = frozenset({"HCCS", "HCCS_SW", "SIO"})
"""Links that join chips into one HCCS domain (SIO: the two dies of one A3 NPU)."""

_PAIR = re.compile(r"(\d+)\s*/\s*(\d+)")
_LABEL = re.compile(r"^(?:NPU|Phy-ID)(\d+)$")
_NIC = re.compile(r"^NIC\d+:?$")
_BDF = re.compile(r"^([0-9a-fA-F]{4,8}):([0-9a-fA-F]{2}):([0-9a-fA-F]{2})\.([0-9a-fA-F])$")
_CODE = re.compile(r"^(0x)?[0-9A-Fa-f]{1,8}$")
_TOTAL = re.compile(r"Total number of vnpu\s*:\s*(\d+)", re.IGNORECASE)
_STATUS = re.compile(r"^\s*Status\s*:\s*(.*?)\s*$", re.MULTILINE)
_MESSAGE = re.compile(r"^\s*Message\s*:\s*(.*?)\s*$", re.MULTILINE)
_FREE_TOTAL = re.compile(r"^(\d+|NA)/(\d+|NA)$")


class NpuSmiError(ValueError):
    """npu-smi printed something these parsers do not understand, or a `set` command answered
    with a status other than OK. (Failing to run at all is the runner's CommandFailedError.)"""


# `npu-smi info`.


@dataclass(frozen=True, slots=True, kw_only=True)
class NpuChip:
    """One chip (die) of the `npu-smi info` table."""

    npu_id: int
    """The card id (the NPU column, what `-i` takes); not a 0-based counter."""
    chip_id: int
    """The chip's index on its card (what `-c` takes)."""
    name: str
    health: str
    """One of HEALTH_WORDS."""
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
        """The id of `/dev/davinci<N>` and ASCEND_VISIBLE_DEVICES, and of the device's name."""
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
        raise NpuSmiError(f"{where}: expected numbers, got {text!r}") from exc


def _bus_id(text: str, where: str) -> str:
    """`0000:C1:00.0` as sysfs names it (`0000:c1:00.0`)."""
    match = _BDF.match(text.strip())
    if match is None or int(match.group(1), 16) > 0xFFFF:
        raise NpuSmiError(f"{where}: {text!r} is not a PCI bus id")
    domain, bus, device, function = match.groups()
    return f"{int(domain, 16):04x}:{bus.lower()}:{device.lower()}.{function.lower()}"


def _memory(usage: str, where: str) -> int:
    totals = [int(total) for _, total in _PAIR.findall(usage)]
    if not totals:
        raise NpuSmiError(f"{where}: no memory figures in {usage!r}")
    nonzero = [total for total in totals if total > 0]
    return nonzero[-1] if nonzero else 0


def _chip(first: list[str], second: list[str], *, where: str, id_column: str) -> NpuChip:
    npu_and_name = first[0].split(maxsplit=1)
    if len(second) < 3 or len(npu_and_name) != 2:
        raise NpuSmiError(f"{where}: a chip needs two rows of at least three cells")
    ids = _ints(second[0], where)
    if len(ids) != (2 if id_column else 1):
        raise NpuSmiError(f"{where}: chip cell {second[0]!r} does not match the header")
    extra = ids[1] if id_column else None
    return NpuChip(
        npu_id=_ints(npu_and_name[0], where)[0],
        chip_id=ids[0],
        name=npu_and_name[1].strip(),
        health=first[1],
        bus_id=_bus_id(second[1], where),
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
    """The chips of `npu-smi info`, in table order (none: an empty node); NpuSmiError when the
    text is not that table."""
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
            chips.append(_chip(pending[0], cells, where=where, id_column=id_column))
            pending = None
        elif _is_chip_start(cells):
            pending = (cells, number)
        else:
            raise NpuSmiError(f"{where}: not a chip row: {stripped[:80]!r}")
    if id_column is None:
        raise NpuSmiError("npu-smi info: no device table (no 'Chip' header row)")
    if pending is not None:
        raise NpuSmiError(f"npu-smi info line {pending[1]}: chip row without its second row")
    return tuple(chips)


# `npu-smi info -t topo`.


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
    raise NpuSmiError("npu-smi info -t topo: no header row of NPU<n> labels")


def _columns(tokens: list[str]) -> list[str]:
    """Header tokens without the trailing `CPU Affinity`."""
    return tokens[:-2] if tokens[-2:] == ["CPU", "Affinity"] else tokens


def parse_topo(text: str) -> Topology:
    """The link matrix; NpuSmiError on ragged rows, unknown links or missing chips."""
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
            raise NpuSmiError(f"npu-smi info -t topo line {number}: malformed row")
        chip = int(label.group(1))
        for column, cell in zip(columns, row[1:], strict=False):
            if cell not in LINK_TYPES:
                raise NpuSmiError(f"npu-smi topo line {number}: unknown link {cell!r}")
            if peer := _LABEL.match(column):
                links[(chip, int(peer.group(1)))] = cell
        if len(row) - 1 > len(columns):
            affinity[chip] = " ".join(row[1 + len(columns) :])
    ids = tuple(int(m.group(1)) for c in columns if (m := _LABEL.match(c)))
    if any((a, b) not in links for a in ids for b in ids):
        raise NpuSmiError("npu-smi info -t topo: the matrix is not complete")
    return Topology(ids=ids, links=links, cpu_affinity=affinity)


def hccs_links(topo: Topology) -> list[tuple[int, int]]:
    """The pairs of topo ids joined by an HCCS link (HCCS_LINKS)."""
    return [pair for pair, kind in topo.links.items() if kind in HCCS_LINKS]


# `npu-smi info -t health -i <card> -c <chip>`.


@dataclass(frozen=True, slots=True, kw_only=True)
class ChipHealth:
    status: str
    codes: tuple[str, ...] = ()
    """Error codes, upper-case hex without `0x`."""
    information: str = ""


def _fields(text: str) -> dict[str, str]:
    found: dict[str, str] = {}
    for line in text.splitlines():
        key, sep, value = line.partition(" : ")
        if sep:
            found.setdefault(key.strip(), value.strip())
    return found


def parse_chip_health(text: str) -> ChipHealth:
    """One chip's `Health Status`, error codes and error information."""
    fields = _fields(text)
    status = fields.get("Health Status") or fields.get("Health")
    if status is None:
        raise NpuSmiError("npu-smi info -t health: no Health Status line")
    if status not in HEALTH_WORDS:
        raise NpuSmiError(f"npu-smi info -t health: unknown health status {status!r}")
    raw = fields.get("Error Code", "NA")
    codes = () if raw in ("", "NA") else tuple(raw.replace(",", " ").split())
    for code in codes:
        if not _CODE.match(code):
            raise NpuSmiError(f"npu-smi info -t health: malformed error code {code!r}")
    information = fields.get("Error Information", "NA")
    return ChipHealth(
        status=status,
        codes=tuple(c.upper().removeprefix("0X") for c in codes),
        information="" if information == "NA" else information,
    )


# `npu-smi info -m`.


@dataclass(frozen=True, slots=True, kw_only=True)
class ChipLocation:
    """One chip of `npu-smi info -m`: the ids `-i` and `-c` take, and the ids it is known by."""

    card: int
    chip: int
    logic_id: int
    phy_id: int | None = None
    """A3 only (`Chip Phy-ID` column)."""
    name: str = ""


def _int_or_none(token: str, where: str) -> int | None:
    if token == "-":
        return None
    if not token.isdigit():
        raise NpuSmiError(f"npu-smi info -m: {where}: expected a number, got {token!r}")
    return int(token)


def parse_chip_map(text: str) -> tuple[ChipLocation, ...]:
    """The chips of `npu-smi info -m` (MCU rows, which have no logic id, left out)."""
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    header = next((i for i, line in enumerate(lines) if "Chip Logic ID" in line), None)
    if header is None or "NPU ID" not in lines[header]:
        raise NpuSmiError("npu-smi info -m: no `NPU ID ... Chip Logic ID` header")
    with_phy = "Phy-ID" in lines[header]
    numbers = 4 if with_phy else 3
    chips: list[ChipLocation] = []
    for line in lines[header + 1 :]:
        tokens = line.split()
        if len(tokens) < numbers + 1:
            raise NpuSmiError(f"npu-smi info -m: row {line!r} has too few columns")
        ids = [_int_or_none(token, f"row {line!r}") for token in tokens[:numbers]]
        card, chip, logic = ids[0], ids[1], ids[2]
        if card is None or chip is None:
            raise NpuSmiError(f"npu-smi info -m: row {line!r} has no card or chip id")
        if logic is None:
            continue  # the MCU of a card
        phy = ids[3] if with_phy else None
        name = " ".join(tokens[numbers:])
        chips.append(ChipLocation(card=card, chip=chip, logic_id=logic, phy_id=phy, name=name))
    return tuple(chips)


# `npu-smi info -t info-vnpu -i <card> -c <chip>` and the `set` commands.


@dataclass(frozen=True, slots=True, kw_only=True)
class VnpuListing:
    """`npu-smi info -t info-vnpu` of one chip, as the host sees it."""

    vnpus: dict[int, str]
    """vNPU id -> template name."""
    free_ai_cores: int | None = None
    """Free AI cores of the chip, where the resource table shows them."""
    total_ai_cores: int | None = None
    """All AI cores of the chip, where the resource table shows them."""


def _ai_cores(rows: Sequence[str]) -> tuple[int | None, int | None]:
    """(free, total) of the AICORE column of the `Free/Total` resource table, if there is one."""
    for i, row in enumerate(rows):
        names = row.strip("|").split()
        if names[:1] != ["AICORE"]:
            continue
        for values in rows[i + 1 :]:
            tokens = values.strip("|").split()
            match = _FREE_TOTAL.match(tokens[0]) if tokens else None
            if match is not None:
                free, total = match.groups()
                return (
                    int(free) if free.isdigit() else None,
                    int(total) if total.isdigit() else None,
                )
        return None, None
    return None, None


def parse_vnpus(text: str) -> VnpuListing:
    """The vNPUs of one chip; NpuSmiError when the table is not there or does not add up."""
    total = _TOTAL.search(text)
    if total is None:
        raise NpuSmiError("npu-smi info-vnpu: no `Total number of vnpu` line")
    rows = [line.strip() for line in text.splitlines() if line.strip().startswith("|")]
    header = next((i for i, r in enumerate(rows) if "Vnpu ID" in r and "Template" in r), None)
    vnpus: dict[int, str] = {}
    if header is not None:
        columns = _cells(rows[header])
        id_at = next(i for i, c in enumerate(columns) if c.startswith("Vnpu ID"))
        template_at = next(i for i, c in enumerate(columns) if c.startswith("Template"))
        for row in rows[header + 1 :]:
            cells = _cells(row)
            if len(cells) != len(columns) or not cells[id_at].isdigit():
                raise NpuSmiError(f"npu-smi info-vnpu: row {row!r} is not a vNPU row")
            vnpus[int(cells[id_at])] = cells[template_at]
    if len(vnpus) != int(total.group(1)):
        raise NpuSmiError(f"npu-smi info-vnpu: says {total.group(1)} vNPUs but lists {len(vnpus)}")
    free, all_cores = _ai_cores(rows)
    return VnpuListing(vnpus=vnpus, free_ai_cores=free, total_ai_cores=all_cores)


def parse_vnpu_view(text: str) -> VnpuListing | None:
    """`parse_vnpus` of a chip's view where it may not have one: None for text without the
    `Total number of vnpu` line (npu-smi builds and chips without virtualization print a
    message instead, not always with a failing exit status); NpuSmiError for a view that is
    there but does not add up."""
    return parse_vnpus(text) if _TOTAL.search(text) is not None else None


def check_status(output: str, what: str) -> None:
    """A `set` command's answer: NpuSmiError unless it says `Status : OK` (or says nothing)."""
    status = _STATUS.search(output)
    if status is not None and status.group(1).upper() != "OK":
        message = _MESSAGE.search(output)
        detail = message.group(1) if message is not None else status.group(1)
        raise NpuSmiError(f"{what}: {detail}")
