"""Kubelet calls in flight, so that background writes give way to them.

The prepared-claims KV and the claims' `status.devices` are written after the answer, by their
own tasks; on the agent's one event loop (and on the API server and NATS) each such write
competes with the next prepare. `busy()` marks a prepare or unprepare call in flight;
`quiet()`, awaited by a background writer before each write, returns once none is, or after
`max_delay_s` at most, so that a steady stream of calls delays the writes but never stops them.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Iterator

__all__ = ["DEFAULT_MAX_DELAY_S", "KubeletCalls"]

DEFAULT_MAX_DELAY_S = 0.25
"""The longest a background write waits for a quiet moment."""


class KubeletCalls:
    def __init__(self, *, max_delay_s: float = DEFAULT_MAX_DELAY_S) -> None:
        self._max_delay_s = max_delay_s
        self._in_flight = 0
        self._none = asyncio.Event()
        self._none.set()

    @property
    def in_flight(self) -> int:
        return self._in_flight

    @contextlib.contextmanager
    def busy(self) -> Iterator[None]:
        """One call in flight for the duration."""
        self._in_flight += 1
        self._none.clear()
        try:
            yield
        finally:
            self._in_flight -= 1
            if self._in_flight == 0:
                self._none.set()

    async def quiet(self) -> None:
        """Return when no call is in flight, or after `max_delay_s`."""
        if self._in_flight == 0:
            return
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(self._max_delay_s):
                await self._none.wait()
