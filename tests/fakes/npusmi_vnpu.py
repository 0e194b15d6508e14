"""A stateful fake npu-smi for vNPUs: `info -m`, `info -t info-vnpu`, `set -t create-vnpu`,
`set -t destroy-vnpu`, printed in the layouts of docs/hardware.md §3.3/3.6.

Use it in process as a command runner (`await fake(argv, timeout_s=...)`), or as a real
executable (`install(directory, state)` writes an `npu-smi` script that runs this file over a
JSON state file, so the real subprocess runner is exercised, timeouts included). Chips hold
AI cores; a vNPU takes its template's (`virNN`); its id must be free on the server and in
`[phy*16+100, phy*16+115]`. Failures: `fail[<subcommand>] = message` makes that subcommand exit
1 with `Status : FAIL`; `garbage[<subcommand>] = text` prints `text` instead (exit 0);
`hang = <seconds>` sleeps before answering anything; `crash_after = <subcommand>` exits 137
(as a killed npu-smi) after doing the subcommand's work, and in process raises `Crash`.
Subcommands are `info-m`, `info-vnpu`, `create-vnpu`, `destroy-vnpu`. The executable form
imports nothing of the project, so it starts fast.
"""

from __future__ import annotations

import json
import re
import sys
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

__all__ = ["Crash", "FakeChip", "FakeVnpuNpuSmi", "install"]

_TEMPLATE = re.compile(r"^vir(\d+)(_[a-z0-9]+)*$")
_CRASH_STATUS = 137


@dataclass(slots=True)
class FakeChip:
    card: int
    chip: int
    logic_id: int
    phy_id: int
    name: str = "910B3"
    ai_cores: int = 20


@dataclass(slots=True)
class FakeVnpuNpuSmi:
    """The fake's whole state; `answer()` runs one command line (the arguments after npu-smi)."""

    chips: list[FakeChip]
    vnpus: dict[str, dict[str, str]] = field(default_factory=dict)
    """`<card>:<chip>` -> vNPU id (as text, for JSON) -> template."""
    fail: dict[str, str] = field(default_factory=dict)
    garbage: dict[str, str] = field(default_factory=dict)
    hang: float = 0.0
    crash_after: str = ""
    calls: list[list[str]] = field(default_factory=list)

    @classmethod
    def node(cls, count: int = 8, *, name: str = "910B3", ai_cores: int = 20) -> FakeVnpuNpuSmi:
        """`count` cards of one chip each, card = logic = physical id."""
        chips = [FakeChip(i, 0, i, i, name=name, ai_cores=ai_cores) for i in range(count)]
        return cls(chips=chips)

    # State helpers for tests.

    def on_chip(self, card: int, chip: int = 0) -> dict[int, str]:
        return {int(k): v for k, v in self.vnpus.get(f"{card}:{chip}", {}).items()}

    def add(self, card: int, chip: int, vnpu: int, template: str) -> None:
        """A vNPU made behind the manager's back (an admin's)."""
        self.vnpus.setdefault(f"{card}:{chip}", {})[str(vnpu)] = template

    def count(self, subcommand: str) -> int:
        return sum(1 for call in self.calls if _subcommand(call) == subcommand)

    # The command line.

    async def __call__(self, argv: Sequence[str], *, timeout_s: float) -> str:
        """A command runner: stdout, or CommandFailedError as the real runner raises it.
        `crash_after` raises `Crash` instead: the caller's process "dies" once npu-smi did its
        work."""
        from shared.commands import CommandFailedError

        status, output = self.answer(list(argv[1:]))
        if status == _CRASH_STATUS:
            raise Crash(" ".join(argv))
        if status != 0:
            raise CommandFailedError(f"{' '.join(argv)}: exit status {status}: {_last(output)}")
        return output

    def answer(self, args: list[str]) -> tuple[int, str]:
        """(exit status, stdout) of `npu-smi <args>`."""
        self.calls.append(args)
        if self.hang:
            time.sleep(self.hang)
        subcommand = _subcommand(args)
        if subcommand in self.fail:
            return 1, _status("FAIL", self.fail[subcommand])
        if subcommand in self.garbage:
            return 0, self.garbage[subcommand]
        options = _options(args)
        handlers = {
            "info-m": lambda: self._chip_map(),
            "info-vnpu": lambda: self._info_vnpu(options),
            "create-vnpu": lambda: self._create(options),
            "destroy-vnpu": lambda: self._destroy(options),
        }
        if subcommand not in handlers:
            return 1, f"Unknown command: {' '.join(args)}\n"
        return handlers[subcommand]()

    def _chip(self, options: dict[str, str]) -> FakeChip | None:
        for chip in self.chips:
            if (str(chip.card), str(chip.chip)) == (options.get("-i"), options.get("-c")):
                return chip
        return None

    def _chip_map(self) -> tuple[int, str]:
        def row(*cells: object) -> str:
            return "\t" + "".join(f"{cell!s:<31}" for cell in cells[:-1]) + str(cells[-1])

        lines = [row("NPU ID", "Chip ID", "Chip Logic ID", "Chip Name")]
        for chip in self.chips:
            lines.append(row(chip.card, chip.chip, chip.logic_id, f"Ascend {chip.name}"))
            if chip.chip == max(c.chip for c in self.chips if c.card == chip.card):
                lines.append(row(chip.card, chip.chip + 1, "-", "MCU"))
        return 0, "\n".join(lines) + "\n"

    def _used_cores(self, chip: FakeChip) -> int:
        return sum(_cores(t) for t in self.on_chip(chip.card, chip.chip).values())

    def _info_vnpu(self, options: dict[str, str]) -> tuple[int, str]:
        chip = self._chip(options)
        if chip is None:
            return 1, _status("FAIL", "The device id or chip id is invalid.")
        vnpus = self.on_chip(chip.card, chip.chip)
        free = chip.ai_cores - self._used_cores(chip)
        bar = "+" + "-" * 79 + "+"
        lines = [
            bar,
            "| NPU resource static info as follow:".ljust(80) + "|",
            "| Format:Free/Total                   NA: Currently, query is not supported.".ljust(80)
            + "|",
            "| AICORE    Memory    AICPU    VPC    VENC    VDEC    JPEGD    JPEGE    PNGD".ljust(80)
            + "|",
            "|            GB".ljust(80) + "|",
            "|" + "=" * 79 + "|",
            f"| {f'{free}/{chip.ai_cores}':<10}15/21     6/7      9/12   3/3".ljust(80) + "|",
            bar,
            f"| Total number of vnpu: {len(vnpus)}".ljust(80) + "|",
            bar,
            "|  Vnpu ID  |  Vgroup ID     |  Container ID  |  Status  |  Template Name       |",
            bar,
        ]
        for vnpu, template in sorted(vnpus.items()):
            lines.append(
                f"|  {vnpu:<9}|  {0:<14}|  {'ffffffffffff':<14}|  {1:<8}|  {template:<20}|"
            )
        lines.append(bar)
        return 0, "\n".join(lines) + "\n"

    def _create(self, options: dict[str, str]) -> tuple[int, str]:
        chip = self._chip(options)
        template = options.get("-f", "")
        if chip is None:
            return 1, _status("FAIL", "The device id or chip id is invalid.")
        if not _TEMPLATE.match(template):
            return 1, _status("FAIL", f"The vnpu template {template} is invalid.")
        taken = {int(v) for on_chip in self.vnpus.values() for v in on_chip}
        wanted = options.get("-v")
        first = chip.phy_id * 16 + 100
        if wanted is None:
            free = [i for i in range(first, first + 16) if i not in taken]
            if not free:
                return 1, _status("FAIL", "No vnpu id is free.")
            vnpu = free[0]
        else:
            vnpu = int(wanted)
            if not first <= vnpu < first + 16 or vnpu in taken:
                return 1, _status("FAIL", f"The vnpu id {vnpu} is invalid or in use.")
        if self._used_cores(chip) + _cores(template) > chip.ai_cores:
            return 1, _status("FAIL", "Create vnpu failed, the resource is insufficient.")
        self.add(chip.card, chip.chip, vnpu, template)
        return self._done("create-vnpu", "Create vnpu success")

    def _destroy(self, options: dict[str, str]) -> tuple[int, str]:
        chip = self._chip(options)
        vnpu = options.get("-v", "")
        if chip is None:
            return 1, _status("FAIL", "The device id or chip id is invalid.")
        on_chip = self.vnpus.get(f"{chip.card}:{chip.chip}", {})
        if vnpu not in on_chip:
            return 1, _status("FAIL", f"The vnpu {vnpu} does not exist.")
        del on_chip[vnpu]
        return self._done("destroy-vnpu", f"Destroy vnpu {vnpu} success")

    def _done(self, subcommand: str, message: str) -> tuple[int, str]:
        if self.crash_after == subcommand:
            self.crash_after = ""
            return _CRASH_STATUS, ""
        return 0, _status("OK", message)

    # The executable form.

    def save(self, path: Path) -> None:
        path.write_text(json.dumps(asdict(self), indent=2))

    @classmethod
    def load(cls, path: Path) -> FakeVnpuNpuSmi:
        data: dict[str, Any] = json.loads(path.read_text())
        data["chips"] = [FakeChip(**chip) for chip in data["chips"]]
        return cls(**data)


class Crash(BaseException):
    """The caller's process "died" (injected with `crash_after`, in process)."""


def _subcommand(args: Sequence[str]) -> str:
    if list(args[:2]) == ["info", "-m"]:
        return "info-m"
    if "-t" in args:
        return args[args.index("-t") + 1] if args.index("-t") + 1 < len(args) else ""
    return " ".join(args)


def _options(args: Sequence[str]) -> dict[str, str]:
    options = {}
    for i, arg in enumerate(args):
        if arg.startswith("-") and i + 1 < len(args):
            options[arg] = args[i + 1]
    return options


def _cores(template: str) -> int:
    match = _TEMPLATE.match(template)
    return int(match.group(1)) if match else 0


def _status(status: str, message: str) -> str:
    return f"\t{'Status':<30} : {status}\n\t{'Message':<30} : {message}\n"


def _last(output: str) -> str:
    lines = output.strip().splitlines()
    return lines[-1].strip() if lines else "no message"


def install(directory: Path, fake: FakeVnpuNpuSmi) -> tuple[Path, Path]:
    """An executable `npu-smi` in `directory` over `fake` saved next to it: (binary, state)."""
    state = directory / "npu-smi-state.json"
    fake.save(state)
    binary = directory / "npu-smi"
    binary.write_text(
        f'#!/bin/sh\nexec {sys.executable} {Path(__file__).resolve()} --state {state} "$@"\n'
    )
    binary.chmod(0o755)
    return binary, state


def main(argv: list[str]) -> int:
    if argv[:1] != ["--state"] or len(argv) < 2:
        print("usage: npusmi_vnpu.py --state FILE ARGS...", file=sys.stderr)
        return 2
    state = Path(argv[1])
    fake = FakeVnpuNpuSmi.load(state)
    status, output = fake.answer(argv[2:])
    fake.save(state)
    sys.stdout.write(output)
    return status


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
