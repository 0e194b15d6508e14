"""The monitor watchdog: a monitor that fails or goes silent never leaves devices "healthy".

Wraps any `DeviceMonitor`. When the monitor raises (or returns), or reports nothing for
`deadline_s`, every device of its last view is reported `unknown` with an `unmonitored`
fault; the policy then marks them UNKNOWN with the `<driver>/unmonitored` taint. A failed
monitor is restarted with backoff; its next report brings the devices back.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable

import structlog

from services.health.policy import UNMONITORED
from shared.backoff import Backoff
from shared.vendors.parts.health import DeviceMonitor, ObservationSink
from shared.vendors.parts.observation import Fault, Observation, Observations

__all__ = ["Watchdog", "unmonitored"]

log = structlog.get_logger(__name__)


def unmonitored(view: Observations, *, reason: str) -> Observations:
    """`view` with every device unknown, for `reason`."""
    fault = Fault(cause=UNMONITORED, message=reason)
    devices = tuple(Observation(device=o.device, unknown=True, fault=fault) for o in view.devices)
    return Observations(pool=view.pool, devices=devices)


class Watchdog:
    """`DeviceMonitor` that runs `monitor` and stands in for it when it fails or hangs."""

    def __init__(
        self,
        monitor: DeviceMonitor,
        *,
        name: str,
        deadline_s: float,
        restart: Backoff | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._monitor = monitor
        self._name = name
        self._deadline_s = deadline_s
        self._restart = restart or Backoff(initial_s=1.0, max_s=30.0)
        self._clock = clock
        self._sink: ObservationSink | None = None
        self._last: Observations | None = None
        self._last_at = 0.0
        self.monitored = True
        """False while the devices are reported unmonitored."""
        self.failures = 0

    async def run(self, sink: ObservationSink) -> None:
        self._sink = sink
        async with asyncio.TaskGroup() as tg:
            tg.create_task(self._supervise(), name=f"{self._name}-monitor")
            tg.create_task(self._watch_deadline(), name=f"{self._name}-deadline")

    def _relay(self, view: Observations) -> None:
        self._last, self._last_at = view, self._clock()
        if not self.monitored:
            log.info("monitor_recovered", monitor=self._name, devices=len(view.devices))
            self.monitored = True
        if self._sink is not None:
            self._sink(view)

    def _give_up(self, reason: str) -> None:
        if not self.monitored:
            return
        self.monitored = False
        log.error("devices_unmonitored", monitor=self._name, reason=reason)
        if self._last is not None and self._sink is not None:
            self._sink(unmonitored(self._last, reason=f"monitor {self._name}: {reason}"))

    async def _supervise(self) -> None:
        while True:
            try:
                await self._monitor.run(self._relay)
                reason = "the monitor stopped"
            except Exception as exc:  # any failure of the monitor, by design
                reason = f"the monitor failed: {exc}"
            self.failures += 1
            log.warning("monitor_failed", monitor=self._name, reason=reason)
            self._give_up(reason)
            await self._restart.sleep()

    async def _watch_deadline(self) -> None:
        period = min(1.0, self._deadline_s / 4)
        while True:
            # Not every period while reports come: no sooner than the deadline could pass.
            await asyncio.sleep(max(period, self._last_at + self._deadline_s - self._clock()))
            silent = self._clock() - self._last_at
            if self._last is not None and self.monitored and silent > self._deadline_s:
                self._give_up(f"no report for {silent:.1f}s (deadline {self._deadline_s}s)")
