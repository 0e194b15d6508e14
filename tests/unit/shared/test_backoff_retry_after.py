"""A server's Retry-After is honoured within bounds: capped per writer, never past a deadline,
and a value asyncio cannot sleep on (`inf`, `1e308`) is not taken literally."""

from __future__ import annotations

import asyncio
import random

import pytest

from shared import backoff
from shared.errors import KubeTransientError
from shared.kube import errors


def test_a_retry_after_beyond_the_cap_waits_the_cap():
    delays = backoff.Backoff(initial_s=0.1, max_s=1.0, max_retry_after_s=3.0, rng=random.Random(1))
    assert delays.next_delay(at_least_s=300.0) == 3.0


def test_without_a_cap_retry_after_is_the_least_wait():
    delays = backoff.Backoff(initial_s=0.1, max_s=1.0, rng=random.Random(1))
    assert delays.next_delay(at_least_s=300.0) == 300.0


@pytest.mark.parametrize(
    ("header", "seconds"),
    [("5", 5.0), ("-3", 0.0), ("inf", None), ("nan", None), ("1e308", errors.MAX_RETRY_AFTER_S)],
    ids=["plain", "negative", "infinite", "not-a-number", "huge"],
)
def test_retry_after_headers_become_bounded_seconds(header, seconds):
    error = errors.from_status(429, b"{}", what="get x", retry_after=header)
    assert isinstance(error, KubeTransientError)
    assert error.retry_after_s == seconds


async def test_retry_gives_up_at_once_when_the_next_wait_passes_the_deadline():
    calls = 0

    async def throttled() -> None:
        nonlocal calls
        calls += 1
        raise KubeTransientError("get x: 429", status=429, retry_after_s=120.0)

    loop = asyncio.get_running_loop()
    started = loop.time()
    with pytest.raises(KubeTransientError, match="429"):
        await backoff.retry(
            throttled,
            what="get x",
            backoff=backoff.Backoff(max_retry_after_s=2.0),
            deadline=started + 1.0,
        )
    assert calls == 1
    assert loop.time() - started < 0.5
