"""Recent TokenReview answers, so a reconnect storm of the same tokens costs one review each.

Keyed by the token's SHA-256 (the token itself is never kept), bounded (least recently used
out first), and an answer is used until the earlier of its token's expiry and `ttl_s` after
the review: a deleted pod or ServiceAccount is noticed at the first connect after that.
Entries of a revoked node are dropped at once. No I/O; the caller's clock.
"""

from __future__ import annotations

import hashlib
from collections import OrderedDict
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

__all__ = ["ReviewCache"]


@dataclass(frozen=True, slots=True)
class _Entry:
    status: Mapping[str, Any]
    node: str
    valid_until: float


def _digest(token: str) -> bytes:
    return hashlib.sha256(token.encode()).digest()


class ReviewCache:
    def __init__(self, *, max_entries: int, ttl_s: float) -> None:
        self._max_entries = max_entries
        self._ttl_s = ttl_s
        self._entries: OrderedDict[bytes, _Entry] = OrderedDict()

    def __len__(self) -> int:
        return len(self._entries)

    def get(self, token: str, *, now: float) -> Mapping[str, Any] | None:
        key = _digest(token)
        entry = self._entries.get(key)
        if entry is None:
            return None
        if entry.valid_until <= now:
            del self._entries[key]
            return None
        self._entries.move_to_end(key)
        return entry.status

    def put(
        self, token: str, status: Mapping[str, Any], *, node: str, expires_at: int, now: float
    ) -> None:
        if self._max_entries <= 0:
            return
        valid_until = min(float(expires_at), now + self._ttl_s)
        self._entries[_digest(token)] = _Entry(status, node, valid_until)
        self._entries.move_to_end(_digest(token))
        while len(self._entries) > self._max_entries:
            self._entries.popitem(last=False)

    def drop_node(self, node: str) -> None:
        for key in [key for key, entry in self._entries.items() if entry.node == node]:
            del self._entries[key]
