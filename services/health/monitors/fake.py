"""FakeMonitor: the test double of the `DeviceMonitor` seam (like httpx's MockTransport).

The test decides what the monitor sees (`report`: faults, devices it cannot look at, and by
changing `devices` which it reports at all), when it fails (`fail`) and, by saying nothing,
when it hangs. Shipped with the code so every test drives the same seam.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterable, Mapping

from shared.vendors.parts.health import ObservationSink
from shared.vendors.parts.observation import Fault, Observation, Observations

__all__ = ["FakeMonitor"]


class FakeMonitor:
    """`DeviceMonitor` whose observations and failures are set by the test."""

    def __init__(
        self, *, pool: str, devices: tuple[str, ...], report_on_start: bool = True
    ) -> None:
        self.pool = pool
        self.devices = devices
        self.faults: dict[str, Fault] = {}
        self.unknown: frozenset[str] = frozenset()
        """Devices reported as not observable (as npu-smi's `UNKNOWN` health, say)."""
        self.runs = 0
        """How often `run` was started (restarts after a failure count)."""
        self._report_on_start = report_on_start
        self._sink: ObservationSink | None = None
        self._failure: asyncio.Future[None] | None = None

    def view(self) -> Observations:
        devices = tuple(
            Observation(device=d, unknown=True)
            if d in self.unknown
            else Observation(device=d, fault=self.faults.get(d))
            for d in self.devices
        )
        return Observations(pool=self.pool, devices=devices)

    def report(
        self, faults: Mapping[str, Fault] | None = None, *, unknown: Iterable[str] | None = None
    ) -> None:
        """Report the view now, with `faults` (by device) and `unknown` devices if given."""
        if faults is not None:
            self.faults = dict(faults)
        if unknown is not None:
            self.unknown = frozenset(unknown)
        if self._sink is not None:
            self._sink(self.view())

    def fail(self, error: Exception) -> None:
        """Make the running `run` raise `error`."""
        if self._failure is not None and not self._failure.done():
            self._failure.set_exception(error)

    async def run(self, sink: ObservationSink) -> None:
        self.runs += 1
        self._sink = sink
        self._failure = asyncio.get_running_loop().create_future()
        if self._report_on_start:
            self.report()
        await self._failure
