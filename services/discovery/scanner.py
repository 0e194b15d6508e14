"""The device scanner: scans the backend and holds the latest canonical inventory.

Scans on start, whenever the backend signals a change, and every `interval_s`. Followers
(`inventory-publisher`, `slice-reconciler`) wait on `next()`, which returns only on a real
content change. A failed scan keeps the last inventory and is retried at the next trigger;
an `observer` (`scanreport.ScanReporter`) hears of every outcome, to raise Events.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Callable
from typing import Protocol

import structlog
from opentelemetry import context as otel_context

from services.discovery import inventory
from shared import telemetry
from shared.backoff import Backoff
from shared.errors import BackendUnavailableError
from shared.pb.drasuite.v1 import inventory_pb2
from shared.vendors.parts.discovery import DeviceBackend

__all__ = ["DeviceScanner", "ScanObserver"]

log = structlog.get_logger(__name__)


def _now_ms() -> int:
    return int(time.time() * 1000)


class ScanObserver(Protocol):
    """Hears the outcome of every scan; no I/O (called from the scan loop)."""

    def scan_failed(self, error: str, *, kept: int | None) -> None:
        """A scan failed; `kept`: devices of the inventory still in force (None: none yet)."""
        ...

    def scan_succeeded(self) -> None: ...


class DeviceScanner:
    """Owns the current inventory of the node; the only caller of `backend.scan()`."""

    def __init__(
        self,
        backend: DeviceBackend,
        *,
        identity: inventory.Identity,
        interval_s: float,
        clock_ms: Callable[[], int] = _now_ms,
        observer: ScanObserver | None = None,
    ) -> None:
        self.backend = backend
        self.observer = observer
        self.identity = identity
        self.interval_s = interval_s
        self._clock_ms = clock_ms
        self._current: inventory_pb2.Inventory | None = None
        self.trace: otel_context.Context | None = None
        """The trace of the scan that found the current inventory: its inventory put is a child
        of it, the slice sync that follows links to it."""
        self._changed = asyncio.Condition()

    @property
    def current(self) -> inventory_pb2.Inventory | None:
        """The latest inventory (its generation counts local changes), None before a scan."""
        return self._current

    async def next(self, *, after: int) -> inventory_pb2.Inventory:
        """The first inventory whose generation is above `after` (0: the first one)."""
        async with self._changed:
            await self._changed.wait_for(
                lambda: self._current is not None and self._current.generation > after
            )
        assert self._current is not None
        return self._current

    async def run(self) -> None:
        """Eternal: scan now, then on every backend change and every `interval_s`."""
        backoff = Backoff(initial_s=0.5, max_s=self.interval_s)
        while True:
            self.backend.changed.clear()
            ok = await self.scan_once()
            timeout = self.interval_s if ok else min(self.interval_s, backoff.next_delay())
            if ok:
                backoff.reset()
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(timeout):
                    await self.backend.changed.wait()

    async def scan_once(self) -> bool:
        """One scan; True when it succeeded (changed or not)."""
        with telemetry.tracer(__name__).start_as_current_span("discovery.scan"):
            scan_trace = otel_context.get_current()
            try:
                scan = await self.backend.scan()
            except BackendUnavailableError as exc:
                log.warning("scan_failed", backend=exc.backend, error=str(exc))
                if self.observer is not None:
                    kept = len(self._current.devices) if self._current is not None else None
                    self.observer.scan_failed(str(exc), kept=kept)
                return False
        if self.observer is not None:
            self.observer.scan_succeeded()
        scanned = inventory.build(scan, identity=self.identity, scanned_unix_ms=self._clock_ms())
        following = inventory.successor(self._current, scanned)
        if following is None:
            return True
        async with self._changed:
            self._current = following
            self.trace = scan_trace
            self._changed.notify_all()
        log.info(
            "inventory_changed",
            driver=self.identity.driver,
            node=self.identity.node,
            devices=len(following.devices),
            generation=following.generation,
            digest=inventory.digest(following),
        )
        return True
