"""Backend scan failures as Node Events and metrics: one Warning per outage, a Normal at the end.

The scanner reports each scan's outcome (`ScanObserver`, no I/O); `run()` writes the Events.
The first failed scan of an outage raises a Warning `BackendScanFailed` on the Node; while
the outage lasts, that Event is brought up to date (`count` = failed scans, latest error) at
most every `refresh_s`, never once per poll. The next good scan raises a Normal
`BackendScanRecovered`. Repeated outages within the Event window update the same Events
(`events.NodeEvents`). Every failed scan counts in `dra_backend_scans_failed`;
`dra_backend_scan_failing` is 1 during an outage.
"""

from __future__ import annotations

import asyncio
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass

import structlog

from services.discovery import events, instruments

__all__ = ["FAILED", "RECOVERED", "ScanReporter"]

log = structlog.get_logger(__name__)

FAILED = "BackendScanFailed"
RECOVERED = "BackendScanRecovered"


@dataclass(slots=True)
class _Outage:
    started: float
    """Monotonic clock at the first failure."""
    failures: int
    error: str
    kept: int | None
    """Devices of the inventory that stays published; None when there is none yet."""
    reported: int = 0
    """Failures already counted in the Warning Event."""
    reported_at: float = 0.0
    ended: float = 0.0


class ScanReporter:
    """A `scanner.ScanObserver` that turns outages of the backend into Events and metrics."""

    def __init__(
        self,
        events_: events.NodeEvents,
        *,
        backend: str,
        refresh_s: float = 300.0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.events = events_
        self.backend = backend
        self.refresh_s = refresh_s
        self._clock = clock
        self._outage: _Outage | None = None
        self._ended: deque[_Outage] = deque()
        self._wake = asyncio.Event()
        instruments.export_scans_at_zero(backend)

    @property
    def failing(self) -> bool:
        return self._outage is not None

    def scan_failed(self, error: str, *, kept: int | None) -> None:
        instruments.SCANS_FAILED.add(1, {"backend": self.backend})
        now = self._clock()
        outage = self._outage
        if outage is None:
            self._outage = _Outage(started=now, failures=1, error=error, kept=kept)
            instruments.SCAN_FAILING.add(1, {"backend": self.backend})
            log.warning("backend_scan_failing", backend=self.backend, error=error)
            self._wake.set()
            return
        outage.failures, outage.error, outage.kept = outage.failures + 1, error, kept
        if now - outage.reported_at >= self.refresh_s:
            self._wake.set()

    def scan_succeeded(self) -> None:
        outage = self._outage
        if outage is None:
            return
        outage.ended = self._clock()
        self._outage = None
        self._ended.append(outage)
        instruments.SCAN_FAILING.add(-1, {"backend": self.backend})
        log.info(
            "backend_scan_recovered",
            backend=self.backend,
            failures=outage.failures,
            after_s=round(outage.ended - outage.started, 1),
        )
        self._wake.set()

    async def run(self) -> None:
        """Eternal: write the Events the scan outcomes call for."""
        while True:
            await self._wake.wait()
            self._wake.clear()
            while self._ended:
                ended = self._ended.popleft()
                if not ended.reported:
                    await self._warn(ended)  # so short that it ended before it was reported
                await self._recovered(ended)
            if (current := self._outage) is not None and self._due(current):
                await self._warn(current)

    def _due(self, outage: _Outage) -> bool:
        """Whether the Warning of `outage` is to be written or brought up to date now."""
        if not outage.reported:
            return True
        stale = self._clock() - outage.reported_at >= self.refresh_s
        return stale and outage.reported < outage.failures

    async def _warn(self, outage: _Outage) -> None:
        kept = (
            f"the last good inventory ({outage.kept} devices) stays published"
            if outage.kept is not None
            else "no inventory has been published yet"
        )
        scans = "1 failed scan" if outage.failures == 1 else f"{outage.failures} failed scans"
        message = f"{self.backend} backend: device scan failed ({scans}): {outage.error}; {kept}"
        count = outage.failures - outage.reported
        await self.events.record(type_=events.WARNING, reason=FAILED, message=message, count=count)
        outage.reported, outage.reported_at = outage.failures, self._clock()

    async def _recovered(self, outage: _Outage) -> None:
        seconds = max(outage.ended - outage.started, 0.0)
        message = (
            f"{self.backend} backend: device scans succeed again after {outage.failures} failed "
            f"scan(s) over {seconds:.0f}s"
        )
        await self.events.record(type_=events.NORMAL, reason=RECOVERED, message=message)
