"""A fake command runner for npu-smi: captured outputs per command line, switchable at will."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from shared.commands import CommandFailedError

__all__ = ["FIXTURES", "FakeNpuSmi"]

FIXTURES = Path(__file__).parents[1] / "unit" / "discovery" / "fixtures" / "npusmi"


class FakeNpuSmi:
    """A `CommandRunner`: `outputs` maps the arguments after the binary to stdout text.

    A missing entry fails like a non-zero exit; `calls` records every command line.
    """

    def __init__(self, outputs: dict[tuple[str, ...], str] | None = None) -> None:
        self.outputs = dict(outputs or {})
        self.calls: list[tuple[str, ...]] = []

    @classmethod
    def from_fixtures(cls, info: str, topo: str) -> FakeNpuSmi:
        """`npu-smi info` and `npu-smi info -t topo` answered by two fixture files."""
        fake = cls()
        fake.use(info=info, topo=topo)
        return fake

    def use(self, *, info: str, topo: str) -> None:
        self.outputs[("info",)] = (FIXTURES / info).read_text()
        self.outputs[("info", "-t", "topo")] = (FIXTURES / topo).read_text()

    def vnpus(self, card: int, chip: int, fixture: str) -> None:
        """`npu-smi info -t info-vnpu -i <card> -c <chip>` answered by a fixture file (the
        host's view of that chip's vNPUs); without one the query fails, as where npu-smi has
        no vNPU view."""
        args = ("info", "-t", "info-vnpu", "-i", str(card), "-c", str(chip))
        self.outputs[args] = (FIXTURES / fixture).read_text()

    async def __call__(self, argv: Sequence[str], *, timeout_s: float) -> str:
        args = tuple(argv[1:])
        self.calls.append(tuple(argv))
        if args not in self.outputs:
            raise CommandFailedError(f"{' '.join(argv)}: exit status 1: unknown command")
        return self.outputs[args]
