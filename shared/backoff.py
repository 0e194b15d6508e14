"""Bounded, jittered exponential backoff for retrying `RecoverableError`s inside a task.

A server's Retry-After is honoured up to `max_retry_after_s`: a writer whose work must land
soon (a taint on a failing device) or a call with a deadline waits at most that long, then
tries again. `retry(deadline=...)` never sleeps past the deadline: it re-raises instead.
"""

from __future__ import annotations

import asyncio
import random
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import TypeVar

import structlog

from shared.errors import KubeTransientError, RecoverableError

__all__ = ["Backoff", "retry"]

log = structlog.get_logger(__name__)
T = TypeVar("T")


@dataclass(slots=True, kw_only=True)
class Backoff:
    """Delays of initial_s * factor**n, capped at max_s, with full jitter on the upper half."""

    initial_s: float = 0.1
    max_s: float = 10.0
    factor: float = 2.0
    rng: random.Random = field(default_factory=random.Random)
    max_retry_after_s: float | None = None
    """The longest a server's Retry-After (`at_least_s`) may make us wait; None: no cap."""
    _attempt: int = 0

    def next_delay(self, *, at_least_s: float = 0.0) -> float:
        base = min(self.max_s, self.initial_s * self.factor**self._attempt)
        self._attempt += 1
        if self.max_retry_after_s is not None:
            at_least_s = min(at_least_s, self.max_retry_after_s)
        return max(at_least_s, base / 2 + self.rng.uniform(0, base / 2))

    def reset(self) -> None:
        self._attempt = 0

    async def sleep(self, *, at_least_s: float = 0.0) -> None:
        await asyncio.sleep(self.next_delay(at_least_s=at_least_s))


async def retry(
    operation: Callable[[], Awaitable[T]],
    *,
    what: str,
    backoff: Backoff | None = None,
    attempts: int | None = None,
    deadline: float | None = None,
) -> T:
    """Run `operation` until it stops raising `RecoverableError` (or `attempts` run out).

    `deadline` (event loop time): the last error is raised at once when the next wait would
    end after it; the operation itself is not bounded here.
    """
    backoff = backoff or Backoff()
    loop = asyncio.get_running_loop()
    attempt = 0
    while True:
        try:
            return await operation()
        except RecoverableError as exc:
            attempt += 1
            if attempts is not None and attempt >= attempts:
                raise
            retry_after = exc.retry_after_s if isinstance(exc, KubeTransientError) else None
            delay = backoff.next_delay(at_least_s=retry_after or 0.0)
            if deadline is not None and loop.time() + delay >= deadline:
                raise
            log.warning(
                "retrying", operation=what, attempt=attempt, delay_s=round(delay, 3), error=str(exc)
            )
            await asyncio.sleep(delay)
