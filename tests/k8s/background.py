"""The real control plane on a thread of its own with its own event loop, so one start
serves a whole pytest session whose tests each run on their own loop."""

from __future__ import annotations

import asyncio
import threading
from pathlib import Path

from devcluster.controlplane import ControlPlaneBinaries, RealControlPlane

__all__ = ["BackgroundControlPlane"]


class BackgroundControlPlane:
    def __init__(self, binaries: ControlPlaneBinaries, workdir: Path) -> None:
        self.plane = RealControlPlane(binaries, workdir)
        self._loop: asyncio.AbstractEventLoop | None = None
        self._stop: asyncio.Event | None = None
        self._ready = threading.Event()
        self._timeout_s = 120.0
        self._error: BaseException | None = None
        self._thread = threading.Thread(target=self._run, name="control-plane", daemon=True)

    def start(self, *, timeout_s: float) -> RealControlPlane:
        """Start and wait until healthy; raises what the start raised."""
        self._timeout_s = timeout_s
        self._thread.start()
        if not self._ready.wait(timeout_s + 10):
            raise TimeoutError(f"the control plane did not start within {timeout_s:.0f} s")
        if self._error is not None:
            raise self._error
        return self.plane

    def stop(self) -> None:
        if self._loop is not None and self._stop is not None:
            self._loop.call_soon_threadsafe(self._stop.set)
        self._thread.join(60)

    def _run(self) -> None:
        asyncio.run(self._main())

    async def _main(self) -> None:
        self._loop = asyncio.get_running_loop()
        self._stop = asyncio.Event()
        try:
            await self.plane.start(timeout_s=self._timeout_s)
        except BaseException as exc:  # handed to the starting thread
            self._error = exc
            self._ready.set()
            return
        self._ready.set()
        try:
            await self._stop.wait()
        finally:
            await self.plane.stop()
