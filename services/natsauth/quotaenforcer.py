"""Acting on a node over its bucket quota: revoked at once, and on the list, by one replica.

Both replicas' auditors count the same buckets, so both find the same node over its quota at
about the same time. Each puts the revocation in force in its own process at once
(`Revoker.revoke_now`: refused at the callout, its connections kicked), so neither admits the
node again while the other writes the list. Then each adds it to the revocation list only if
the list does not have it (`RevocationStore.revoke_once`, a write conditional on what was
read): the one replica whose write lands logs `bus_quota_exceeded` (`security=true`) and counts
it in `dra_bus_quota_exceeded_total{bucket}`; the entry (no end, the reason naming the bucket
and the counts) is what `dra-nats-auth revoked` shows the operator, and `unrevoke-node` lets
the node back. A node over its quota again after that is revoked again.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable

import structlog

from services.natsauth import instruments, quota, revocations
from services.natsauth.quotaledger import Excess
from services.natsauth.revocations import Revocation
from services.natsauth.revoker import Revoker
from shared.backoff import Backoff
from shared.errors import DraSuiteError

__all__ = ["QuotaEnforcer", "reason"]

log = structlog.get_logger(__name__)

Persist = Callable[[Revocation, float], Awaitable[bool]]
"""Adds a revocation unless the list has its node in force; True when it wrote it."""


def reason(excess: Excess) -> str:
    """The revocation's reason, for the operator reading the list."""
    limit = excess.quota.keys if excess.over == "keys" else excess.quota.bytes
    held = excess.keys if excess.over == "keys" else excess.bytes
    return (f"bus quota: {quota.base_bucket(excess.bucket)} {excess.over} over {limit} "
            f"(held {held}, key {excess.key})")  # fmt: skip


class QuotaEnforcer:
    def __init__(
        self, *, revoker: Revoker, persist: Persist, clock: Callable[[], float] = time.time
    ) -> None:
        self._revoker = revoker
        self._persist = persist
        self._clock = clock
        self._acting: dict[str, asyncio.Task[None]] = {}

    def exceeded(self, excess: Excess) -> None:
        """Revoke the node of `excess` unless this process is doing so already or it is
        revoked; returns at once (the work is a task of its own)."""
        node = excess.node
        running = self._acting.get(node)
        if running is not None and (not running.done() or self._revoker.revoked(node)):
            return
        self._acting[node] = asyncio.create_task(self._revoke(excess), name="quota-revoke")

    async def close(self) -> None:
        for task in self._acting.values():
            task.cancel()
        await asyncio.gather(*self._acting.values(), return_exceptions=True)

    async def _revoke(self, excess: Excess) -> None:
        now = self._clock()
        revocation = Revocation(node=excess.node, reason=reason(excess),
                                at=revocations.at_now(now))  # fmt: skip
        await self._revoker.revoke_now(revocation)
        backoff = Backoff(initial_s=0.5, max_s=30.0)
        while True:
            try:
                wrote = await self._persist(revocation, now)
                break
            except DraSuiteError as exc:
                # In force in this process meanwhile; the other replica's auditor tries too.
                log.warning("bus_quota_revocation_unsaved", node=excess.node, error=str(exc),
                            security=True)  # fmt: skip
                await backoff.sleep()
        self._revoker.unpin(excess.node)
        if not wrote:
            return  # the other replica (or an operator) put it on the list
        instruments.QUOTA_EXCEEDED.add(1, {"bucket": quota.base_bucket(excess.bucket)})
        log.warning(
            "bus_quota_exceeded", node=excess.node, bucket=excess.bucket, over=excess.over,
            keys=excess.keys, bytes=excess.bytes, quota_keys=excess.quota.keys,
            quota_bytes=excess.quota.bytes, key=excess.key, revoked=True, security=True,
        )  # fmt: skip
