"""What each node holds in the buckets, counted entry by entry as a watch delivers them.

Per bucket and owner (`<driver>.<node>`, the first two tokens of every key a node may write:
nats-server lets only that node publish there), the keys it holds, each as its hash and the
size of its value: counters, not values or key names, and never more keys than its quota
(`quota`), since an entry over the quota is not taken in but reported as `Excess`, for the
auditor to delete. A delete marker, or a replacement, gives the room back. An entry with an
empty value is not counted: it is what a direct get of a missing key, redirected by another
node onto this node's key, leaves (`docs/security.md`, what nats-server cannot refuse), so it
proves nothing about the key's owner, and no agent writes an empty record. Pure.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from services.natsauth import quota
from services.natsauth.quota import NodeQuota

__all__ = ["Excess", "QuotaLedger"]


@dataclass(frozen=True, slots=True)
class Excess:
    """An entry that took its owner over its quota: it is not counted, and goes."""

    bucket: str
    node: str
    """The node's name (as the revocation list names it)."""
    key: str
    revision: int
    """The entry's stream sequence: a delete expecting it removes that entry and no later one."""
    over: str
    """`keys` or `bytes`: which part of the quota the entry would have passed."""
    keys: int
    bytes: int
    """What the owner holds without it."""
    quota: NodeQuota


@dataclass(slots=True)
class _Holding:
    sizes: dict[int, int] = field(default_factory=dict)
    total: int = 0


class QuotaLedger:
    def __init__(self) -> None:
        self._held: dict[str, dict[str, _Holding]] = {}

    def observe(self, bucket: str, key: str, size: int | None, revision: int) -> Excess | None:
        """Count one entry of `bucket` (`size` None: a delete marker); the `Excess` when it
        would take its owner over the quota, None otherwise."""
        limit = quota.quota_of(bucket)
        owner = _owner(bucket, key)
        if limit is None or owner is None:
            return None
        owners = self._held.setdefault(bucket, {})
        holding = owners.get(owner)
        if holding is None:
            if not size:
                return None
            holding = owners[owner] = _Holding()
        digest = hash(key)
        previous = holding.sizes.pop(digest, None)
        if previous is not None:
            holding.total -= previous
        if size:
            over = _over(holding, size, new=previous is None, limit=limit)
            if over:
                node = owner.split(".", 1)[1].replace("_", ".")
                return Excess(
                    bucket=bucket, node=node, key=key, revision=revision, over=over,
                    keys=len(holding.sizes), bytes=holding.total, quota=limit,
                )  # fmt: skip
            holding.sizes[digest] = size
            holding.total += size
        if not holding.sizes:
            del owners[owner]
        return None

    def forget(self, bucket: str) -> None:
        """Drop what `bucket` holds: a watch replays it from the start (after a reconnect,
        the deletes of meanwhile may have expired)."""
        self._held.pop(bucket, None)

    def held(self, bucket: str, owner: str) -> tuple[int, int]:
        """(keys, bytes) the owner `<driver token>.<node token>` holds in `bucket`."""
        holding = self._held.get(bucket, {}).get(owner)
        return (len(holding.sizes), holding.total) if holding is not None else (0, 0)

    def __len__(self) -> int:
        """Owners holding anything, over all buckets."""
        return sum(len(owners) for owners in self._held.values())


def _over(holding: _Holding, size: int, *, new: bool, limit: NodeQuota) -> str:
    if new and len(holding.sizes) >= limit.keys:
        return "keys"
    if holding.total + size > limit.bytes:
        return "bytes"
    return ""


def _owner(bucket: str, key: str) -> str | None:
    """`<driver>.<node>` of a key a node may write in `bucket`; None for any other key."""
    tokens = key.split(".")
    wanted = 2 if quota.base_bucket(bucket) == "dra_inventory" else 3
    if len(tokens) != wanted or not all(tokens):
        return None
    return f"{tokens[0]}.{tokens[1]}"
