"""Blocking library calls off the event loop, one at a time, each under a deadline.

A driver call can wedge forever. Each call runs on its own daemon thread (so a wedged one
never blocks the process from exiting, unlike the default executor's threads) and is awaited
under a timeout; while a timed-out call is still stuck, later calls fail fast instead of
piling up threads. Both failures raise `BackendUnavailableError`.
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
from collections.abc import Callable
from typing import TypeVar

from shared.errors import BackendUnavailableError

__all__ = ["BlockingCaller"]

T = TypeVar("T")


def _settle(future: asyncio.Future[T], result: T | None, error: BaseException | None) -> None:
    if future.done():
        return  # the caller gave up on it (timeout or cancellation)
    if error is not None:
        future.set_exception(error)
    else:
        future.set_result(result)  # type: ignore[arg-type]  # T when error is None


class BlockingCaller:
    def __init__(self, *, backend: str) -> None:
        self._backend = backend
        self._returned = threading.Event()
        self._returned.set()

    @property
    def stuck(self) -> bool:
        """A call that timed out (or was abandoned) has not returned yet."""
        return not self._returned.is_set()

    def after_current(self, function: Callable[[], object]) -> None:
        """Run `function` on a daemon thread once the running call (if any) has returned."""
        returned = self._returned

        def target() -> None:
            returned.wait()
            function()

        threading.Thread(target=target, daemon=True, name=f"{self._backend}-cleanup").start()

    async def call(self, function: Callable[[], T], *, what: str, timeout_s: float) -> T:
        """`function()` on a worker thread; its own exceptions come through unchanged."""
        if self.stuck:
            raise BackendUnavailableError(
                f"{self._backend}: an earlier call is still blocked in the driver",
                backend=self._backend,
            )
        loop = asyncio.get_running_loop()
        future: asyncio.Future[T] = loop.create_future()
        returned = self._returned = threading.Event()

        def target() -> None:
            try:
                result, error = function(), None
            except BaseException as exc:  # handed to the awaiting coroutine
                result, error = None, exc
            returned.set()
            with contextlib.suppress(RuntimeError):  # a closed loop: nobody waits any more
                loop.call_soon_threadsafe(_settle, future, result, error)

        threading.Thread(target=target, daemon=True, name=f"{self._backend}-call").start()
        try:
            async with asyncio.timeout(timeout_s):
                return await future
        except TimeoutError as exc:
            raise BackendUnavailableError(
                f"{self._backend}: {what} gave no answer within {timeout_s}s",
                backend=self._backend,
            ) from exc
