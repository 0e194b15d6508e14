"""Per-source token buckets: how many TokenReviews one client address may cost per second.

Only connects that pass the local check and miss the review cache are counted, so the limit
bounds what one address can make the API server do with real tokens (one node replaying its
own, many pods behind one address) without touching anyone else's connects. Bounded: the
least recently seen sources are forgotten first (a forgotten source starts with a full
bucket, which is no more than a new address gets).
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass

__all__ = ["SourceLimiter"]


@dataclass(slots=True)
class _Bucket:
    tokens: float
    updated: float


class SourceLimiter:
    def __init__(self, *, rate_per_s: float, burst: float, max_sources: int = 10_000) -> None:
        self._rate = rate_per_s
        self._burst = burst
        self._max_sources = max_sources
        self._buckets: OrderedDict[str, _Bucket] = OrderedDict()

    def allow(self, source: str, *, now: float) -> bool:
        """Take one token from `source`'s bucket; False when it is empty."""
        if self._rate <= 0:
            return True
        bucket = self._buckets.get(source)
        if bucket is None:
            bucket = self._buckets[source] = _Bucket(self._burst, now)
            while len(self._buckets) > self._max_sources:
                self._buckets.popitem(last=False)
        else:
            self._buckets.move_to_end(source)
            elapsed = max(0.0, now - bucket.updated)
            bucket.tokens = min(self._burst, bucket.tokens + elapsed * self._rate)
            bucket.updated = now
        if bucket.tokens < 1:
            return False
        bucket.tokens -= 1
        return True
