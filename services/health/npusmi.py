"""Parsers of `npu-smi` output (pure): the summary table and one chip's health.

`npu-smi info` (docs/hardware.md §3.2): each chip takes two table rows, the first with the NPU
(card) ID, name and Health, the second with the chip index and bus ID; the process table
ends the device rows. `npu-smi info -t health -i <card> -c <chip>` (docs/hardware.md §3.3):
`key : value` lines with `Health Status`, `Error Code` (`NA` or hex codes) and `Error
Information`. Output that does not have this shape raises `BackendUnavailableError`.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from shared.errors import BackendUnavailableError

__all__ = ["HEALTH_WORDS", "ChipHealth", "NpuChip", "parse_chip_health", "parse_summary"]

HEALTH_WORDS = ("OK", "Warning", "Alarm", "Critical", "UNKNOWN")
_CODE = re.compile(r"^(0x)?[0-9A-Fa-f]{1,8}$")


@dataclass(frozen=True, slots=True, kw_only=True)
class NpuChip:
    npu: int
    """The card ID (not a 0-based counter)."""
    chip: int
    """The chip index on the card."""
    name: str
    health: str
    """One of HEALTH_WORDS."""
    bus_id: str = ""


@dataclass(frozen=True, slots=True, kw_only=True)
class ChipHealth:
    status: str
    codes: tuple[str, ...] = ()
    """Error codes, upper-case hex without `0x`."""
    information: str = ""


def _error(message: str) -> BackendUnavailableError:
    return BackendUnavailableError(f"npu-smi output: {message}", backend="ascend")


def _cells(line: str) -> list[str]:
    return [cell.strip() for cell in line.strip().strip("|").split("|")]


def _int(text: str) -> int | None:
    token = text.split()[0] if text.split() else ""
    return int(token) if token.isdigit() else None


def parse_summary(text: str) -> tuple[NpuChip, ...]:
    """Every chip of the `npu-smi info` table, in table order."""
    rows = [line for line in text.splitlines() if line.strip().startswith("|")]
    if not any("Health" in row and "NPU" in row for row in rows):
        raise _error("no device table header")
    chips: list[NpuChip] = []
    pending: tuple[int, str, str] | None = None
    for row in rows:
        if "Process id" in row:
            break
        cells = _cells(row)
        first = _int(cells[0]) if cells else None
        if first is None or len(cells) < 2:
            continue
        if cells[1] in HEALTH_WORDS:
            if pending is not None:
                raise _error(f"NPU {pending[0]} has no chip row")
            pending = (first, " ".join(cells[0].split()[1:]), cells[1])
        elif pending is not None:
            npu, name, health = pending
            chips.append(NpuChip(npu=npu, chip=first, name=name, health=health, bus_id=cells[1]))
            pending = None
        else:
            raise _error(f"a chip row without its NPU row: {row.strip()!r}")
    if pending is not None:
        raise _error(f"NPU {pending[0]} has no chip row")
    if not chips:
        raise _error("no devices in the table")
    return tuple(chips)


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
        raise _error("no Health Status line")
    if status not in HEALTH_WORDS:
        raise _error(f"unknown health status {status!r}")
    raw = fields.get("Error Code", "NA")
    codes = () if raw in ("", "NA") else tuple(raw.replace(",", " ").split())
    for code in codes:
        if not _CODE.match(code):
            raise _error(f"malformed error code {code!r}")
    information = fields.get("Error Information", "NA")
    return ChipHealth(
        status=status,
        codes=tuple(c.upper().removeprefix("0X") for c in codes),
        information="" if information == "NA" else information,
    )
