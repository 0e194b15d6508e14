"""The npu-smi seam of the vNPU partition manager: running npu-smi, and reading what it prints.

Commands (docs/hardware.md §3.3, 3.6): `npu-smi info -m` maps chips to (card, chip) ids;
`npu-smi info -t info-vnpu -i <card> -c <chip>` lists a chip's vNPUs (and, on most builds, its
free/total resources); `npu-smi set -t create-vnpu -i <card> -c <chip> -f <template> -v <id>`
and `npu-smi set -t destroy-vnpu -i <card> -c <chip> -v <id>` make and remove one, printing
`Status : OK` and a `Message`. The runner is `shared.commands`: a failure to run (missing binary,
non-zero exit, timeout) raises its `CommandFailedError`; a `Status` other than OK, or output
the parsers do not understand, raises `NpuSmiError`, a kind of it. The
test double is `tests/fakes/npusmi_vnpu.py`.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass

from shared.commands import CommandFailedError, CommandRunner, run_command

__all__ = [
    "ChipLocation",
    "CommandRunner",
    "NpuSmiError",
    "VnpuListing",
    "check_status",
    "parse_chip_map",
    "parse_vnpus",
    "run_command",
]

_TOTAL = re.compile(r"Total number of vnpu\s*:\s*(\d+)", re.IGNORECASE)
_STATUS = re.compile(r"^\s*Status\s*:\s*(.*?)\s*$", re.MULTILINE)
_MESSAGE = re.compile(r"^\s*Message\s*:\s*(.*?)\s*$", re.MULTILINE)
_FREE_TOTAL = re.compile(r"^(\d+|NA)/(\d+|NA)$")


class NpuSmiError(CommandFailedError):
    """npu-smi printed something not understood, or a `Status` other than OK. (Failing to run
    at all is the runner's CommandFailedError, its base.)"""


def check_status(output: str, what: str) -> None:
    """A `set` command's answer: NpuSmiError unless it says `Status : OK` (or says nothing)."""
    status = _STATUS.search(output)
    if status is not None and status.group(1).upper() != "OK":
        message = _MESSAGE.search(output)
        detail = message.group(1) if message is not None else status.group(1)
        raise NpuSmiError(f"{what}: {detail}")


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


@dataclass(frozen=True, slots=True, kw_only=True)
class VnpuListing:
    """`npu-smi info -t info-vnpu` of one chip."""

    vnpus: dict[int, str]
    """vNPU id -> template name."""
    free_ai_cores: int | None = None
    """Free AI cores of the chip, where the resource table shows them."""


def _cells(line: str) -> list[str]:
    return [cell.strip() for cell in line.strip().strip("|").split("|")]


def _free_ai_cores(rows: Sequence[str]) -> int | None:
    """The AICORE column of the `Free/Total` resource table, if there is one."""
    for i, row in enumerate(rows):
        names = row.strip("|").split()
        if names[:1] != ["AICORE"]:
            continue
        for values in rows[i + 1 :]:
            tokens = values.strip("|").split()
            match = _FREE_TOTAL.match(tokens[0]) if tokens else None
            if match is not None:
                return int(match.group(1)) if match.group(1).isdigit() else None
        return None
    return None


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
    return VnpuListing(vnpus=vnpus, free_ai_cores=_free_ai_cores(rows))
