"""Bounded, jittered exponential backoff for retrying `RecoverableError`s inside a task."""

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
    _attempt: int = 0

    def next_delay(self, *, at_least_s: float = 0.0) -> float:
        base = min(self.max_s, self.initial_s * self.factor**self._attempt)
        self._attempt += 1
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
) -> T:
    """Run `operation` until it stops raising `RecoverableError` (or `attempts` run out)."""
    backoff = backoff or Backoff()
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
            log.warning(
                "retrying", operation=what, attempt=attempt, delay_s=round(delay, 3), error=str(exc)
            )
            await asyncio.sleep(delay)
